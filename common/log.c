/* SPDX-License-Identifier: Apache-2.0 */
/* Copyright (c) 2026 The kvfabric authors */
#include "common/log.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

_Atomic int kvf_log_level_current = KVF_LOG_INFO;

typedef struct kvf_log_sink {
    kvf_log_cb_t cb;
    void *arg;
} kvf_log_sink_t;

static void kvf_log_stderr_cb(kvf_log_level_t level, const char *component,
                              const char *message, void *arg);

/* The sink is swapped rarely (at startup); an atomic pointer to one of two
 * static slots keeps readers lock-free. */
static kvf_log_sink_t kvf_log_sinks[2]        = {{kvf_log_stderr_cb, NULL}};
static _Atomic(kvf_log_sink_t *) kvf_log_sink = &kvf_log_sinks[0];

static const char *const kvf_log_level_names[] = {
    [KVF_LOG_ERROR] = "error", [KVF_LOG_WARN] = "warn",
    [KVF_LOG_INFO] = "info",   [KVF_LOG_DEBUG] = "debug",
    [KVF_LOG_TRACE] = "trace",
};

static void kvf_log_stderr_cb(kvf_log_level_t level, const char *component,
                              const char *message, void *arg)
{
    struct timespec ts;
    struct tm tm;
    char line[1200];
    int len;

    clock_gettime(CLOCK_REALTIME, &ts);
    gmtime_r(&ts.tv_sec, &tm);
    len =
        snprintf(line, sizeof(line),
                 "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ %-5s %s[%d]: %s\n",
                 tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour,
                 tm.tm_min, tm.tm_sec, ts.tv_nsec / 1000000,
                 kvf_log_level_names[level], component, (int)getpid(), message);
    if (len < 0) {
        return;
    }
    if ((size_t)len >= sizeof(line)) {
        len           = sizeof(line) - 1;
        line[len - 1] = '\n';
    }
    /* one write per line keeps lines from concurrent threads whole */
    if (write(STDERR_FILENO, line, (size_t)len) < 0) {
        return;
    }
}

void kvf_log_emit(kvf_log_level_t level, const char *component, const char *fmt,
                  ...)
{
    kvf_log_sink_t *sink;
    char message[1024];
    int saved_errno = errno; /* %m must see the caller's errno */
    va_list ap;

    sink = atomic_load_explicit(&kvf_log_sink, memory_order_acquire);
    if (sink->cb == NULL) {
        return;
    }
    if ((level < KVF_LOG_ERROR) || (level > KVF_LOG_TRACE)) {
        level = KVF_LOG_ERROR;
    }
    errno = saved_errno;
    va_start(ap, fmt);
    vsnprintf(message, sizeof(message), fmt, ap);
    va_end(ap);
    sink->cb(level, component, message, sink->arg);
    errno = saved_errno;
}

void kvf_log_set_handler(kvf_log_cb_t cb, void *arg)
{
    kvf_log_sink_t *cur = atomic_load(&kvf_log_sink);
    kvf_log_sink_t *next =
        (cur == &kvf_log_sinks[0]) ? &kvf_log_sinks[1] : &kvf_log_sinks[0];

    next->cb  = cb;
    next->arg = arg;
    atomic_store_explicit(&kvf_log_sink, next, memory_order_release);
}

void kvf_log_set_default_handler(void)
{
    kvf_log_set_handler(kvf_log_stderr_cb, NULL);
}

void kvf_log_set_level(kvf_log_level_t level)
{
    if (level > KVF_LOG_TRACE) {
        level = KVF_LOG_TRACE;
    }
    atomic_store(&kvf_log_level_current, (int)level);
}

kvf_log_level_t kvf_log_get_level(void)
{
    return (kvf_log_level_t)atomic_load(&kvf_log_level_current);
}

kvf_status_t kvf_log_level_parse(const char *name, kvf_log_level_t *level_p)
{
    int i;

    if (name == NULL) {
        return KVF_ERR_INVALID;
    }
    for (i = KVF_LOG_ERROR; i <= KVF_LOG_TRACE; i++) {
        if (strcasecmp(name, kvf_log_level_names[i]) == 0) {
            *level_p = (kvf_log_level_t)i;
            return KVF_OK;
        }
    }
    if (strcasecmp(name, "warning") == 0) {
        *level_p = KVF_LOG_WARN;
        return KVF_OK;
    }
    return KVF_ERR_INVALID;
}

void kvf_log_init_from_env(void)
{
    const char *value = getenv("KVF_LOG_LEVEL");
    kvf_log_level_t level;

    if ((value == NULL) || (*value == '\0')) {
        return;
    }
    if (kvf_log_level_parse(value, &level) != KVF_OK) {
        kvf_warn("KVF_LOG_LEVEL '%s' is not error, warn, info, debug or "
                 "trace; keeping %s",
                 value, kvf_log_level_names[kvf_log_get_level()]);
        return;
    }
    kvf_log_set_level(level);
}
