/* SPDX-License-Identifier: Apache-2.0 */
/* Copyright (c) 2026 The kvfabric authors */
#include "common/listen.h"
#include "common/log.h"
#include "common/time.h"

#include <event2/event.h>
#include <event2/listener.h>
#include <event2/util.h>

#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

enum {
    KVF_LISTEN_BACKOFF_MIN_MS = 10,
    KVF_LISTEN_BACKOFF_MAX_MS = 1000,
    KVF_LISTEN_CALM_MS        = 5000,  /* no error this long: backoff reset */
    KVF_LISTEN_REPORT_MS      = 10000, /* at most one warning per period */
};

static pthread_mutex_t kvf_listen_lock = PTHREAD_MUTEX_INITIALIZER;
static kvf_listen_guard_t *kvf_listen_guards;

static kvf_listen_guard_t *kvf_listen_guard_find(struct evconnlistener *lst)
{
    kvf_listen_guard_t *guard;

    pthread_mutex_lock(&kvf_listen_lock);
    for (guard = kvf_listen_guards; guard != NULL; guard = guard->next) {
        if (guard->listener == lst) {
            break;
        }
    }
    pthread_mutex_unlock(&kvf_listen_lock);
    return guard;
}

static void kvf_listen_guard_on_retry(evutil_socket_t fd, short what, void *arg)
{
    kvf_listen_guard_t *guard = arg;

    evconnlistener_enable(guard->listener);
}

static void kvf_listen_guard_on_error(struct evconnlistener *lst, void *arg)
{
    int err                   = EVUTIL_SOCKET_ERROR();
    kvf_listen_guard_t *guard = kvf_listen_guard_find(lst);
    uint64_t now              = kvf_time_now_ms();
    struct timeval tv;

    if (guard == NULL) {
        return; /* libevent goes on accepting, as without a guard */
    }
    guard->errors++;
    guard->unreported++;
    if ((guard->backoff_ms == 0) ||
        (now - guard->last_error_ms >= KVF_LISTEN_CALM_MS)) {
        guard->backoff_ms = KVF_LISTEN_BACKOFF_MIN_MS;
    } else if (guard->backoff_ms < KVF_LISTEN_BACKOFF_MAX_MS) {
        guard->backoff_ms *= 2;
        if (guard->backoff_ms > KVF_LISTEN_BACKOFF_MAX_MS) {
            guard->backoff_ms = KVF_LISTEN_BACKOFF_MAX_MS;
        }
    }
    guard->last_error_ms = now;
    if ((guard->last_report_ms == 0) ||
        (now - guard->last_report_ms >= KVF_LISTEN_REPORT_MS)) {
        kvf_warn("%s: accept failed: %s (%" PRIu64
                 " failures since the last report); pausing accepts for "
                 "%" PRIu32 " ms",
                 guard->what, evutil_socket_error_to_string(err),
                 guard->unreported, guard->backoff_ms);
        guard->unreported     = 0;
        guard->last_report_ms = now;
    }
    evconnlistener_disable(lst);
    tv.tv_sec  = guard->backoff_ms / 1000;
    tv.tv_usec = (guard->backoff_ms % 1000) * 1000;
    event_add(guard->retry, &tv);
}

kvf_status_t kvf_listen_guard_init(kvf_listen_guard_t *guard,
                                   struct event_base *base,
                                   struct evconnlistener *listener,
                                   const char *what)
{
    guard->listener       = listener;
    guard->backoff_ms     = 0;
    guard->errors         = 0;
    guard->unreported     = 0;
    guard->last_error_ms  = 0;
    guard->last_report_ms = 0;
    snprintf(guard->what, sizeof(guard->what), "%s", what);
    guard->retry = evtimer_new(base, kvf_listen_guard_on_retry, guard);
    if (guard->retry == NULL) {
        return KVF_ERR_NO_MEMORY;
    }
    pthread_mutex_lock(&kvf_listen_lock);
    guard->next       = kvf_listen_guards;
    kvf_listen_guards = guard;
    pthread_mutex_unlock(&kvf_listen_lock);
    evconnlistener_set_error_cb(listener, kvf_listen_guard_on_error);
    return KVF_OK;
}

void kvf_listen_guard_cleanup(kvf_listen_guard_t *guard)
{
    kvf_listen_guard_t **pp;

    if (guard->retry == NULL) {
        return;
    }
    pthread_mutex_lock(&kvf_listen_lock);
    for (pp = &kvf_listen_guards; *pp != NULL; pp = &(*pp)->next) {
        if (*pp == guard) {
            *pp = guard->next;
            break;
        }
    }
    pthread_mutex_unlock(&kvf_listen_lock);
    evconnlistener_set_error_cb(guard->listener, NULL);
    event_free(guard->retry);
    guard->retry = NULL;
}
