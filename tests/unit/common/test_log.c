/* SPDX-License-Identifier: Apache-2.0 */
/* Copyright (c) 2026 The kvfabric authors */
#define KVF_LOG_COMPONENT "testcomp"
#include "common/log.h"
#include "tests/helpers/test_helpers.h"

#include <criterion/criterion.h>

#include <errno.h>
#include <stdlib.h>
#include <string.h>

static void log_setup(void)
{
    kvf_log_set_level(KVF_LOG_INFO);
    kvf_test_log_capture_start();
}

static void log_teardown(void)
{
    kvf_test_log_capture_stop();
    kvf_test_check_leaks();
}

TestSuite(log, .init = log_setup, .fini = log_teardown, .timeout = 10);

static int g_formatted;

static int count_format(void)
{
    g_formatted++;
    return 1;
}

Test(log, level_filters_before_formatting)
{
    kvf_debug("hidden %d", count_format());
    cr_assert_eq(g_formatted, 0, "arguments of a filtered line not evaluated");
    cr_assert(!kvf_test_log_contains("hidden"));
    kvf_info("shown %d", count_format());
    cr_assert_eq(g_formatted, 1);
    cr_assert(kvf_test_log_contains("testcomp: shown 1"));
    kvf_log_set_level(KVF_LOG_DEBUG);
    kvf_debug("now visible");
    cr_assert(kvf_test_log_contains("now visible"));
}

Test(log, percent_m_sees_callers_errno)
{
    errno = ENOENT;
    kvf_error("open failed: %m");
    cr_assert(kvf_test_log_contains("open failed: No such file or directory"),
              "got: %s", kvf_test_log_text());
    cr_assert_eq(errno, ENOENT, "logging preserves errno");
}

Test(log, null_handler_silences)
{
    kvf_log_set_handler(NULL, NULL);
    kvf_error("nobody hears this");
    kvf_test_log_capture_start();
    cr_assert(!kvf_test_log_contains("nobody hears this"));
}

Test(log, level_parse)
{
    kvf_log_level_t level = KVF_LOG_ERROR;

    cr_assert_eq(kvf_log_level_parse("DEBUG", &level), KVF_OK);
    cr_assert_eq(level, KVF_LOG_DEBUG);
    cr_assert_eq(kvf_log_level_parse("warning", &level), KVF_OK);
    cr_assert_eq(level, KVF_LOG_WARN);
    cr_assert_eq(kvf_log_level_parse("loud", &level), KVF_ERR_INVALID);
    cr_assert_eq(level, KVF_LOG_WARN);
    cr_assert_eq(kvf_log_level_parse(NULL, &level), KVF_ERR_INVALID);
}

Test(log, env_sets_level_and_rejects_garbage)
{
    setenv("KVF_LOG_LEVEL", "trace", 1);
    kvf_log_init_from_env();
    cr_assert_eq(kvf_log_get_level(), KVF_LOG_TRACE);
    setenv("KVF_LOG_LEVEL", "chatty", 1);
    kvf_log_init_from_env();
    cr_assert_eq(kvf_log_get_level(), KVF_LOG_TRACE, "bad value keeps level");
    cr_assert(kvf_test_log_contains("KVF_LOG_LEVEL 'chatty'"));
    unsetenv("KVF_LOG_LEVEL");
}

Test(log, long_lines_are_truncated_not_overflowed)
{
    char big[4000];

    memset(big, 'x', sizeof(big) - 1);
    big[sizeof(big) - 1] = '\0';
    kvf_warn("%s", big);
    cr_assert(kvf_test_log_contains("xxxx"));
}
