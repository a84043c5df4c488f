/* SPDX-License-Identifier: Apache-2.0 */
/* Copyright (c) 2026 The kvfabric authors */
#include "tests/helpers/test_helpers.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#ifdef KVF_TEST_LEAK_CHECK
int __lsan_do_recoverable_leak_check(void);
#endif

void kvf_test_check_leaks(void)
{
#ifdef KVF_TEST_LEAK_CHECK
    if (__lsan_do_recoverable_leak_check() != 0) {
        fprintf(stderr, "LeakSanitizer found leaks: failing the test\n");
        abort();
    }
#endif
}

static char kvf_test_log_buf[65536];
static size_t kvf_test_log_len;

static void kvf_test_log_cb(kvf_log_level_t level, const char *component,
                            const char *message, void *arg)
{
    int n;

    n = snprintf(kvf_test_log_buf + kvf_test_log_len,
                 sizeof(kvf_test_log_buf) - kvf_test_log_len, "%s: %s\n",
                 component, message);
    if (n > 0) {
        kvf_test_log_len += (size_t)n;
        if (kvf_test_log_len >= sizeof(kvf_test_log_buf)) {
            kvf_test_log_len = sizeof(kvf_test_log_buf) - 1;
        }
    }
}

void kvf_test_log_capture_start(void)
{
    kvf_test_log_len    = 0;
    kvf_test_log_buf[0] = '\0';
    kvf_log_set_handler(kvf_test_log_cb, NULL);
}

void kvf_test_log_capture_stop(void)
{
    kvf_log_set_default_handler();
}

bool kvf_test_log_contains(const char *needle)
{
    return strstr(kvf_test_log_buf, needle) != NULL;
}

const char *kvf_test_log_text(void)
{
    return kvf_test_log_buf;
}

const char *kvf_test_source_path(const char *rel)
{
    static char path[4096];
    const char *root = getenv("KVF_SOURCE_ROOT");

    snprintf(path, sizeof(path), "%s/%s", (root != NULL) ? root : ".", rel);
    return path;
}

const char *kvf_test_write_temp(const char *text)
{
    static char path[64];
    size_t len = strlen(text);
    int fd;

    snprintf(path, sizeof(path), "/tmp/kvf-test-XXXXXX");
    fd = mkstemp(path);
    if (fd < 0) {
        return NULL;
    }
    if (write(fd, text, len) != (ssize_t)len) {
        close(fd);
        return NULL;
    }
    close(fd);
    return path;
}
