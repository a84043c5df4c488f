/* SPDX-License-Identifier: Apache-2.0 */
/* Copyright (c) 2026 The kvfabric authors */
/*
 * Keeps a listening socket usable when accept() fails. libevent's
 * evconnlistener retries a failed accept() at once, for ever: at the file
 * descriptor limit (EMFILE) the pending connection stays in the backlog,
 * the socket stays readable and the loop spins at 100 % CPU, logging every
 * try. A guard installs evconnlistener_set_error_cb(): on an error the
 * listener is disabled and enabled again after a backoff (10 ms, doubling
 * up to 1 s; back to 10 ms after 5 s without errors), and one warning per
 * 10 s says how many accepts failed meanwhile.
 *
 * Works for listeners the caller does not own the callback argument of
 * (evhttp's): the error callback finds its guard by listener.
 *
 * Built as its own library (kvf_listen): libkvfabric does not link
 * libevent's listener code.
 *
 * thread: a guard belongs to the loop of its listener; guards of several
 * loops may exist at once (the lookup is locked).
 */
#ifndef KVF_COMMON_LISTEN_H
#define KVF_COMMON_LISTEN_H

#include <kvfabric/status.h>

#include <stdint.h>

struct event;
struct event_base;
struct evconnlistener;

typedef struct kvf_listen_guard kvf_listen_guard_t;

struct kvf_listen_guard {
    struct evconnlistener *listener; /* borrowed: outlives the guard */
    struct event *retry;             /* owned: re-enables the listener */
    char what[64];                   /* "control port 127.0.0.1:7400" */
    uint32_t backoff_ms;             /* current pause; 0: none yet */
    uint64_t errors;                 /* accept() failures, for metrics */
    uint64_t unreported;             /* failures since the last warning */
    uint64_t last_error_ms;
    uint64_t last_report_ms;
    kvf_listen_guard_t *next; /* the guards' list (error-callback lookup) */
};

/* Guards @p listener (on @p base); @p what names it in logs. */
kvf_status_t kvf_listen_guard_init(kvf_listen_guard_t *guard,
                                   struct event_base *base,
                                   struct evconnlistener *listener,
                                   const char *what);

/* Removes the guard; call before freeing the listener. No-op when the
 * guard was never initialised (zeroed). */
void kvf_listen_guard_cleanup(kvf_listen_guard_t *guard);

#endif /* KVF_COMMON_LISTEN_H */
