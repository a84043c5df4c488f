/* SPDX-License-Identifier: Apache-2.0 */
/* Copyright (c) 2026 The kvfabric authors */
/*
 * A UCP worker bound to one libevent loop (STYLE.md B6): its event fd wakes
 * the loop, the handler progresses until idle, re-arms, and then delivers
 * what completed (operations, endpoint failures, accepted connections)
 * outside of UCX callbacks.
 */
#include "transport/ucx.h"
#include "transport/ucx_int.h"

#include "common/log.h"
#include "common/time.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define KVF_UCX_WORKER_DESTROY_TIMEOUT_NS (5ull * KVF_NSEC_PER_SEC)

/* Delivers what the last progress produced; user callbacks run here. */
static void kvf_ucx_worker_dispatch(kvf_ucx_worker_t *worker)
{
    if (worker->in_dispatch) {
        return; /* a callback progressed by hand: the outer call delivers */
    }
    worker->in_dispatch = true;
    do {
        kvf_ucx_ep_dispatch_accept(worker);
        kvf_ucx_ep_dispatch_close(worker);
        kvf_ucx_op_dispatch_done(worker);
        kvf_ucx_op_dispatch_orphans(worker);
        kvf_ucx_ep_dispatch_notify(worker);
    } while ((worker->done.head != NULL) || (worker->notify_head != NULL) ||
             (worker->conn_head != NULL));
    worker->in_dispatch = false;
}

static void kvf_ucx_worker_on_efd(evutil_socket_t fd, short what, void *arg)
{
    kvf_ucx_worker_t *worker = arg;

    while (ucp_worker_progress(worker->ucp) != 0) {
        /* completion callbacks run here, on the loop thread */
    }

    kvf_ucx_worker_dispatch(worker);

    if (ucp_worker_arm(worker->ucp) == UCS_ERR_BUSY) {
        event_active(worker->ev, EV_READ, 0); /* more to do: next loop turn */
    }
}

void kvf_ucx_worker_kick(kvf_ucx_worker_t *worker)
{
    /* no syscall: libevent queues the event for this loop turn */
    if (worker->ev != NULL) {
        event_active(worker->ev, EV_READ, 0);
    }
}

unsigned kvf_ucx_worker_progress(kvf_ucx_worker_t *worker)
{
    unsigned count = 0;
    unsigned n;

    while ((n = ucp_worker_progress(worker->ucp)) != 0) {
        count += n;
    }
    kvf_ucx_worker_dispatch(worker);
    return count;
}

kvf_status_t kvf_ucx_worker_create(kvf_ucx_ctx_t *ctx, struct event_base *base,
                                   const kvf_ucx_worker_params_t *params,
                                   kvf_ucx_worker_t **worker_p)
{
    ucp_worker_params_t wparams;
    kvf_ucx_worker_t *worker;
    uint64_t mask = (params != NULL) ? params->field_mask : 0;
    ucs_status_t ucs;
    kvf_status_t status;
    unsigned i;
    int efd;

    if ((ctx == NULL) || (base == NULL) || (worker_p == NULL)) {
        return KVF_ERR_INVALID;
    }

    worker = calloc(1, sizeof(*worker));
    if (worker == NULL) {
        return KVF_ERR_NO_MEMORY;
    }
    worker->ctx     = ctx;
    worker->base    = base;
    worker->max_ops = KVF_UCX_MAX_OPS_DEFAULT;
    if ((mask & KVF_UCX_WORKER_FIELD_MAX_OPS) && (params->max_ops > 0)) {
        worker->max_ops = params->max_ops;
    }
    if (mask & KVF_UCX_WORKER_FIELD_EP_ERR) {
        worker->ep_err_cb  = params->ep_err_cb;
        worker->ep_err_arg = params->ep_err_arg;
    }
    snprintf(worker->name, sizeof(worker->name), "%s",
             ((mask & KVF_UCX_WORKER_FIELD_NAME) && (params->name != NULL))
                 ? params->name
                 : "ucx");
    for (i = 0; i < KVF_UCX_AM_ID_MAX; i++) {
        worker->am[i].worker = worker;
        worker->am[i].id     = i;
    }
    worker->am_unknown.worker = worker;
    worker->am_unknown.id     = KVF_UCX_AM_ID_MAX;

    /* the per-chunk path takes operations from here: no malloc there */
    worker->ops = calloc(worker->max_ops, sizeof(*worker->ops));
    if (worker->ops == NULL) {
        status = KVF_ERR_NO_MEMORY;
        goto err_free_worker;
    }
    for (i = worker->max_ops; i > 0; i--) {
        worker->ops[i - 1].worker = worker;
        worker->ops[i - 1].next   = worker->free_ops;
        worker->free_ops          = &worker->ops[i - 1];
    }
    worker->free_count = worker->max_ops;

    memset(&wparams, 0, sizeof(wparams));
    wparams.field_mask =
        UCP_WORKER_PARAM_FIELD_THREAD_MODE | UCP_WORKER_PARAM_FIELD_NAME;
    wparams.thread_mode = UCS_THREAD_MODE_SINGLE;
    wparams.name        = worker->name;
    ucs                 = ucp_worker_create(ctx->ucp, &wparams, &worker->ucp);
    if (ucs != UCS_OK) {
        kvf_error("worker %s: ucp_worker_create failed: %s", worker->name,
                  ucs_status_string(ucs));
        status = KVF_ERR_TRANSPORT;
        goto err_free_ops;
    }

    status = kvf_ucx_am_init_all(worker);
    if (status != KVF_OK) {
        goto err_destroy_ucp;
    }

    ucs = ucp_worker_get_efd(worker->ucp, &efd);
    if (ucs != UCS_OK) {
        kvf_error("worker %s: ucp_worker_get_efd failed: %s", worker->name,
                  ucs_status_string(ucs));
        status = KVF_ERR_TRANSPORT;
        goto err_destroy_ucp;
    }

    worker->ev = event_new(base, efd, EV_READ | EV_PERSIST,
                           kvf_ucx_worker_on_efd, worker);
    if (worker->ev == NULL) {
        kvf_error("worker %s: event_new failed", worker->name);
        status = KVF_ERR_IO;
        goto err_destroy_ucp;
    }
    worker->timer = evtimer_new(base, kvf_ucx_op_on_timer, worker);
    if (worker->timer == NULL) {
        kvf_error("worker %s: evtimer_new failed", worker->name);
        status = KVF_ERR_IO;
        goto err_free_ev;
    }
    if (event_add(worker->ev, NULL) != 0) {
        kvf_error("worker %s: event_add failed", worker->name);
        status = KVF_ERR_IO;
        goto err_free_timer;
    }
    /* first turn progresses and arms */
    kvf_ucx_worker_kick(worker);

    *worker_p = worker;
    return KVF_OK;

err_free_timer:
    event_free(worker->timer);
err_free_ev:
    event_free(worker->ev);
err_destroy_ucp:
    ucp_worker_destroy(worker->ucp);
err_free_ops:
    free(worker->ops);
err_free_worker:
    free(worker);
    return status;
}

void kvf_ucx_worker_destroy(kvf_ucx_worker_t *worker)
{
    uint64_t deadline;
    unsigned i;

    if (worker == NULL) {
        return;
    }
    if (worker->listeners != 0) {
        kvf_warn("worker %s: destroyed with %u listeners alive", worker->name,
                 worker->listeners);
    }
    worker->is_destroying = true;

    /* operations complete with KVF_ERR_CANCELED: UCX releases them when
     * their endpoints are forcibly closed */
    kvf_ucx_ep_fail_all(worker, KVF_ERR_CANCELED);

    deadline = kvf_time_deadline_ns(KVF_UCX_WORKER_DESTROY_TIMEOUT_NS);
    do {
        kvf_ucx_worker_progress(worker);
    } while (((worker->inflight.count != worker->orphans) ||
              kvf_ucx_ep_closing_any(worker) || (worker->conn_head != NULL)) &&
             !kvf_time_expired(deadline));

    if (worker->inflight.count != worker->orphans) {
        kvf_warn("worker %s: %u operations still in flight at destroy",
                 worker->name, worker->inflight.count - worker->orphans);
    }
    kvf_ucx_ep_free_all(worker, false);

    for (i = 0; i < KVF_UCX_AM_ID_MAX; i++) {
        if (worker->am[i].cb != NULL) {
            kvf_ucx_am_set_handler(worker, i, NULL, NULL);
        }
    }

    /* UCX may still call back orphaned requests while it goes: those only
     * return slots, and kick is a no-op without the event */
    event_free(worker->timer);
    event_free(worker->ev);
    worker->timer = NULL;
    worker->ev    = NULL;
    ucp_worker_destroy(worker->ucp);
    worker->ucp = NULL;
    /* what UCX completed while going, then what it never will: every
     * callback still runs once */
    kvf_ucx_op_dispatch_done(worker);
    kvf_ucx_op_cancel_all(worker);
    kvf_ucx_ep_free_all(worker, true);
    kvf_ucx_op_heap_free_all(worker);
    free(worker->ops);
    free(worker);
}

kvf_status_t kvf_ucx_worker_address_pack(kvf_ucx_worker_t *worker,
                                         void **addr_p, size_t *len_p)
{
    ucp_worker_attr_t attr;
    ucs_status_t ucs;
    void *copy;

    memset(&attr, 0, sizeof(attr));
    attr.field_mask = UCP_WORKER_ATTR_FIELD_ADDRESS;
    ucs             = ucp_worker_query(worker->ucp, &attr);
    if (ucs != UCS_OK) {
        kvf_error("worker %s: ucp_worker_query failed: %s", worker->name,
                  ucs_status_string(ucs));
        return KVF_ERR_TRANSPORT;
    }

    copy = malloc(attr.address_length);
    if (copy == NULL) {
        ucp_worker_release_address(worker->ucp, attr.address);
        return KVF_ERR_NO_MEMORY;
    }
    memcpy(copy, attr.address, attr.address_length);
    *len_p = attr.address_length;
    ucp_worker_release_address(worker->ucp, attr.address);
    *addr_p = copy;
    return KVF_OK;
}

void kvf_ucx_worker_stats(const kvf_ucx_worker_t *worker,
                          kvf_ucx_worker_stats_t *stats_p)
{
    stats_p->ops_inflight =
        worker->inflight.count + worker->done.count - worker->orphans;
    stats_p->ops_free             = worker->free_count;
    stats_p->recv_ops_beyond_pool = worker->heap_ops_total;
    stats_p->eps                  = worker->ep_count;
    stats_p->eps_cached           = worker->ep_cached;
    stats_p->ep_failures          = worker->ep_failures;
    stats_p->timeouts             = worker->timeouts;
    stats_p->am_dropped           = worker->am_dropped;
}
