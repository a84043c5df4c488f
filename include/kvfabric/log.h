/* SPDX-License-Identifier: Apache-2.0 */
/* Copyright (c) 2026 The kvfabric authors */
/**
 * @file log.h
 * Log routing for programs that embed kvfabric.
 *
 * kvfabric writes one line per event. Daemons print to stderr; an engine that
 * links libkvfabric routes lines into its own logger with
 * kvf_log_set_handler(), or silences them.
 */
#ifndef KVFABRIC_LOG_H
#define KVFABRIC_LOG_H

#include <kvfabric/defs.h>
#include <kvfabric/status.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    KVF_LOG_ERROR = 0,
    KVF_LOG_WARN  = 1,
    KVF_LOG_INFO  = 2,
    KVF_LOG_DEBUG = 3,
    KVF_LOG_TRACE = 4,
} kvf_log_level_t;

/**
 * Receives one formatted log line (no trailing newline).
 *
 * @param [in] level      severity of the event
 * @param [in] component  "agent", "controller", "client", ...
 * @param [in] message    the text; valid only during the call
 * @param [in] arg        the pointer given to kvf_log_set_handler()
 */
typedef void (*kvf_log_cb_t)(kvf_log_level_t level, const char *component,
                             const char *message, void *arg);

/**
 * Routes log lines to @p cb. A NULL @p cb silences logging; the default
 * handler writes timestamped lines to stderr.
 *
 * @param [in] cb   handler, or NULL to discard every line
 * @param [in] arg  passed back to @p cb
 *
 * thread: thread-safe, but lines logged concurrently with the change may go
 * to either handler. ownership: @p arg stays the caller's.
 */
KVF_API void kvf_log_set_handler(kvf_log_cb_t cb, void *arg);

/**
 * Restores the default stderr handler.
 *
 * thread: as kvf_log_set_handler().
 */
KVF_API void kvf_log_set_default_handler(void);

/**
 * Sets the most verbose level that is formatted and emitted.
 *
 * @param [in] level  one of kvf_log_level_t
 *
 * thread: thread-safe.
 */
KVF_API void kvf_log_set_level(kvf_log_level_t level);

/**
 * Returns the current level.
 *
 * thread: thread-safe.
 */
KVF_API kvf_log_level_t kvf_log_get_level(void);

/**
 * Parses a level name ("error", "warn", "info", "debug", "trace").
 *
 * @param [in]  name     the name, case-insensitive
 * @param [out] level_p  the level, written on success
 * @return KVF_OK, or KVF_ERR_INVALID for an unknown name
 *
 * thread: thread-safe.
 */
KVF_API kvf_status_t kvf_log_level_parse(const char *name,
                                         kvf_log_level_t *level_p);

#ifdef __cplusplus
}
#endif

#endif /* KVFABRIC_LOG_H */
