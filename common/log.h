/* SPDX-License-Identifier: Apache-2.0 */
/* Copyright (c) 2026 The kvfabric authors */
/*
 * Logging macros (STYLE.md B5). The level is checked before any formatting;
 * the component comes from the folder's -DKVF_LOG_COMPONENT; trace is
 * compiled out of release (NDEBUG) builds.
 *
 * thread: thread-safe.
 */
#ifndef KVF_COMMON_LOG_H
#define KVF_COMMON_LOG_H

#include <kvfabric/log.h>

#include <stdatomic.h>
#include <stdlib.h>

#ifndef KVF_LOG_COMPONENT
#define KVF_LOG_COMPONENT "kvf"
#endif

extern _Atomic int kvf_log_level_current;

/* Formats and emits one line; use the macros below instead. */
void kvf_log_emit(kvf_log_level_t level, const char *component, const char *fmt,
                  ...) KVF_PRINTF(3, 4);

/* Reads KVF_LOG_LEVEL from the environment; a bad value is logged. */
void kvf_log_init_from_env(void);

#define kvf_log_is_enabled(_level) \
    ((int)(_level) <= \
     atomic_load_explicit(&kvf_log_level_current, memory_order_relaxed))

#define kvf_log(_level, ...) \
    do { \
        if (kvf_log_is_enabled(_level)) { \
            kvf_log_emit(_level, KVF_LOG_COMPONENT, __VA_ARGS__); \
        } \
    } while (0)

#define kvf_error(...) kvf_log(KVF_LOG_ERROR, __VA_ARGS__)
#define kvf_warn(...)  kvf_log(KVF_LOG_WARN, __VA_ARGS__)
#define kvf_info(...)  kvf_log(KVF_LOG_INFO, __VA_ARGS__)
#define kvf_debug(...) kvf_log(KVF_LOG_DEBUG, __VA_ARGS__)
#ifdef NDEBUG
#define kvf_trace(...) \
    do { \
    } while (0)
#else
#define kvf_trace(...) kvf_log(KVF_LOG_TRACE, __VA_ARGS__)
#endif

/* Logs and aborts: broken invariants only, never peer input. */
#define kvf_fatal(...) \
    do { \
        kvf_log_emit(KVF_LOG_ERROR, KVF_LOG_COMPONENT, __VA_ARGS__); \
        abort(); \
    } while (0)

#define kvf_assert_always(_cond) \
    do { \
        if (!(_cond)) { \
            kvf_fatal("assertion failed at %s:%d: %s", __FILE__, __LINE__, \
                      #_cond); \
        } \
    } while (0)

#ifdef NDEBUG
#define kvf_assert(_cond) \
    do { \
    } while (0)
#else
#define kvf_assert(_cond) kvf_assert_always(_cond)
#endif

#endif /* KVF_COMMON_LOG_H */
