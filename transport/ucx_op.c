/* SPDX-License-Identifier: Apache-2.0 */
/* Copyright (c) 2026 The kvfabric authors */
/*
 * Operations: a fixed pool per worker, a deadline each, one callback each.
 *
 * UCX callbacks only move an operation to the done queue; the user callback
 * runs from kvf_ucx_op_dispatch_done, after progress, so users may close
 * endpoints or start new operations from it. A send or receive cannot be
 * canceled by UCX once started (its buffers may still be in use), so a
 * deadline fails the operation's endpoint: UCX then releases every request
 * on it and the one that timed out reports KVF_ERR_TIMEOUT.
 */
#include "transport/ucx.h"
#include "transport/ucx_int.h"

#include "common/log.h"
#include "common/time.h"

#include <inttypes.h>
#include <stddef.h>
#include <string.h>

static void kvf_ucx_op_list_push(kvf_ucx_op_list_t *list, kvf_ucx_op_t *op)
{
    op->next = NULL;
    op->prev = list->tail;
    if (list->tail != NULL) {
        list->tail->next = op;
    } else {
        list->head = op;
    }
    list->tail = op;
    list->count++;
}

void kvf_ucx_op_list_remove(kvf_ucx_op_list_t *list, kvf_ucx_op_t *op)
{
    if (op->prev != NULL) {
        op->prev->next = op->next;
    } else {
        list->head = op->next;
    }
    if (op->next != NULL) {
        op->next->prev = op->prev;
    } else {
        list->tail = op->prev;
    }
    op->next = NULL;
    op->prev = NULL;
    list->count--;
}

kvf_status_t kvf_ucx_op_alloc(kvf_ucx_worker_t *worker, kvf_ucx_ep_t *ep,
                              kvf_ucx_op_type_t type, uint64_t timeout_ns,
                              kvf_ucx_op_cb_t cb, void *arg,
                              kvf_ucx_op_t **op_p)
{
    kvf_ucx_op_t *op;

    if (cb == NULL) {
        return KVF_ERR_INVALID;
    }
    if (worker->is_destroying) {
        return KVF_ERR_CANCELED;
    }
    if ((ep != NULL) && ep->is_failed) {
        return KVF_ERR_CLOSED;
    }
    op = worker->free_ops;
    if ((op == NULL) && (type == KVF_UCX_OP_AM_RECV)) {
        op = calloc(1, sizeof(*op));
        if (op != NULL) {
            op->worker  = worker;
            op->is_heap = true;
            LIST_INSERT_HEAD(&worker->heap_ops, op, heap_link);
            worker->num_heap_ops++;
            worker->heap_ops_total++;
        }
    } else if (op != NULL) {
        worker->free_ops = op->next;
        worker->free_count--;
    }
    if (op == NULL) {
        kvf_debug("worker %s: operation pool empty (%u)", worker->name,
                  worker->max_ops);
        worker->ops_wanted = true;
        return KVF_ERR_BUSY;
    }

    op->next         = NULL;
    op->prev         = NULL;
    op->ep           = ep;
    op->req          = NULL;
    op->type         = type;
    op->cb           = cb;
    op->cb_arg       = arg;
    op->status       = KVF_INPROGRESS;
    op->is_timed_out = false;
    op->is_orphan    = false;
    op->deadline_ns  = kvf_time_deadline_ns(
         (timeout_ns != 0) ? timeout_ns : KVF_UCX_TIMEOUT_DEFAULT_NS);
    if (ep != NULL) {
        kvf_ucx_ep_hold(ep); /* dropped after the callback */
    }
    *op_p = op;
    return KVF_OK;
}

/* A receive taken beyond the pool goes back to the heap. */
static void kvf_ucx_op_heap_free(kvf_ucx_op_t *op)
{
    LIST_REMOVE(op, heap_link);
    op->worker->num_heap_ops--;
    free(op);
}

void kvf_ucx_op_heap_free_all(kvf_ucx_worker_t *worker)
{
    while (!LIST_EMPTY(&worker->heap_ops)) {
        kvf_ucx_op_heap_free(LIST_FIRST(&worker->heap_ops));
    }
}

static void kvf_ucx_op_free(kvf_ucx_op_t *op)
{
    kvf_ucx_worker_t *worker = op->worker;

    if (op->is_heap) {
        kvf_ucx_op_heap_free(op);
        return;
    }
    op->cb           = NULL;
    op->next         = worker->free_ops;
    worker->free_ops = op;
    worker->free_count++;
    if (worker->ops_wanted && (worker->ops_freed_cb != NULL)) {
        worker->ops_wanted = false;
        worker->ops_freed_cb(worker->ops_freed_arg);
    }
}

void kvf_ucx_worker_on_ops_freed(kvf_ucx_worker_t *worker,
                                 kvf_ucx_ops_freed_cb_t cb, void *arg)
{
    worker->ops_freed_cb  = cb;
    worker->ops_freed_arg = arg;
}

static void kvf_ucx_op_timer_arm(kvf_ucx_worker_t *worker, uint64_t deadline)
{
    struct timeval tv;

    if (evtimer_pending(worker->timer, NULL) &&
        (worker->timer_deadline_ns <= deadline)) {
        return;
    }
    worker->timer_deadline_ns = deadline;
    tv = kvf_time_to_timeval(kvf_time_left_ns(deadline) + KVF_NSEC_PER_MSEC);
    evtimer_add(worker->timer, &tv);
}

/* Status reported for an operation UCX finished with @p ucs. */
static kvf_status_t kvf_ucx_op_status(const kvf_ucx_op_t *op, ucs_status_t ucs)
{
    if (ucs == UCS_OK) {
        return KVF_OK;
    }
    if (op->is_timed_out) {
        return KVF_ERR_TIMEOUT;
    }
    if (op->worker->is_destroying) {
        return KVF_ERR_CANCELED;
    }
    if ((op->ep != NULL) && op->ep->is_failed) {
        return KVF_ERR_CLOSED;
    }
    return kvf_ucx_status(ucs);
}

/* UCX is done with the request: queue the user callback. */
static void kvf_ucx_op_finish(kvf_ucx_op_t *op, void *request, ucs_status_t ucs)
{
    kvf_ucx_worker_t *worker = op->worker;

    if (request != NULL) {
        ucp_request_free(request);
    }
    op->req = NULL;
    op->ucs = ucs;
    if (op->is_orphan) {
        /* its user heard already: only the slot goes back */
        kvf_ucx_op_list_remove(&worker->inflight, op);
        worker->orphans--;
        kvf_ucx_op_free(op);
        return;
    }
    /* mapped at dispatch: the ep's error callback may come later in this
     * same progress call */
    op->status = KVF_INPROGRESS;
    kvf_ucx_op_list_remove(&worker->inflight, op);
    kvf_ucx_op_list_push(&worker->done, op);
    kvf_ucx_worker_kick(worker);
}

static void kvf_ucx_op_on_send(void *request, ucs_status_t status,
                               void *user_data)
{
    kvf_ucx_op_finish(user_data, request, status);
}

void kvf_ucx_op_on_recv_am(void *request, ucs_status_t status, size_t length,
                           void *user_data)
{
    kvf_ucx_op_finish(user_data, request, status);
}

void kvf_ucx_op_param_init(kvf_ucx_op_t *op, ucp_request_param_t *param)
{
    memset(param, 0, sizeof(*param));
    param->op_attr_mask =
        UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
    param->cb.send   = kvf_ucx_op_on_send;
    param->user_data = op;
}

void kvf_ucx_op_complete_now(kvf_ucx_op_t *op, kvf_status_t status)
{
    op->status = status;
    kvf_ucx_op_list_push(&op->worker->done, op);
    kvf_ucx_worker_kick(op->worker);
}

kvf_status_t kvf_ucx_op_start(kvf_ucx_op_t *op, ucs_status_ptr_t req,
                              const char *what)
{
    kvf_ucx_worker_t *worker = op->worker;
    kvf_ucx_ep_t *ep         = op->ep;
    kvf_status_t status;

    if (UCS_PTR_IS_ERR(req)) {
        status = kvf_ucx_status(UCS_PTR_STATUS(req));
        if (status == KVF_ERR_CLOSED) {
            kvf_debug("worker %s: %s to %s refused: %s", worker->name, what,
                      (ep != NULL) ? ep->peer : "worker",
                      ucs_status_string(UCS_PTR_STATUS(req)));
        } else {
            kvf_error("worker %s: %s to %s failed: %s", worker->name, what,
                      (ep != NULL) ? ep->peer : "worker",
                      ucs_status_string(UCS_PTR_STATUS(req)));
            status = KVF_ERR_TRANSPORT;
        }
        kvf_ucx_op_free(op);
        kvf_ucx_ep_put(ep);
        return status;
    }
    if (req == NULL) {
        /* completed in place; the callback still runs from the loop */
        kvf_ucx_op_complete_now(op, KVF_OK);
        return KVF_OK;
    }
    op->req = req;
    kvf_ucx_op_list_push(&worker->inflight, op);
    kvf_ucx_op_timer_arm(worker, op->deadline_ns);
    kvf_ucx_worker_kick(worker); /* progress may be needed to push it out */
    return KVF_OK;
}

void kvf_ucx_op_dispatch_done(kvf_ucx_worker_t *worker)
{
    kvf_ucx_op_cb_t cb;
    kvf_status_t status;
    kvf_ucx_op_t *op;
    kvf_ucx_ep_t *ep;
    void *arg;

    while ((op = worker->done.head) != NULL) {
        kvf_ucx_op_list_remove(&worker->done, op);
        if (op->status == KVF_INPROGRESS) {
            op->status = kvf_ucx_op_status(op, op->ucs);
            if (op->ucs != UCS_OK) {
                kvf_debug("worker %s: operation %d on %s failed: %s (%s)",
                          worker->name, (int)op->type,
                          (op->ep != NULL) ? op->ep->peer : "worker",
                          ucs_status_string(op->ucs), kvf_strerror(op->status));
            }
        }
        cb     = op->cb;
        arg    = op->cb_arg;
        status = op->status;
        ep     = op->ep;
        kvf_ucx_op_free(op); /* before the callback: it may start another */
        cb(status, arg);
        kvf_ucx_ep_put(ep);
    }
}

/*
 * Ops of failed endpoints whose close completed but which UCX did not
 * release (seen in 1.13 with rendezvous sends waiting for the peer): UCX
 * moves no more data for them, so their users hear now; the slot returns
 * when UCX finally calls back, or with the worker.
 */
void kvf_ucx_op_dispatch_orphans(kvf_ucx_worker_t *worker)
{
    kvf_ucx_op_t *op;
    kvf_ucx_ep_t *ep;
    kvf_status_t status;

    if (!worker->has_closed_eps) {
        return;
    }
    worker->has_closed_eps = false;
    for (op = worker->inflight.head; op != NULL; op = op->next) {
        ep = op->ep;
        if (op->is_orphan || (ep == NULL) || !ep->is_failed ||
            (ep->ucp_ep != NULL) || ep->is_closing) {
            continue;
        }
        status = op->is_timed_out        ? KVF_ERR_TIMEOUT
                 : worker->is_destroying ? KVF_ERR_CANCELED
                                         : KVF_ERR_CLOSED;
        kvf_debug("worker %s: operation %d on %s: %s (request kept by ucx)",
                  worker->name, (int)op->type, ep->peer, kvf_strerror(status));
        op->is_orphan = true;
        op->ep        = NULL;
        worker->orphans++;
        op->cb(status, op->cb_arg);
        kvf_ucx_ep_put(ep);
    }
}

/*
 * After ucp_worker_destroy: operations UCX never called back are over
 * (their endpoints were force-closed, the worker is gone). Their users
 * hear KVF_ERR_CANCELED; orphans only give their slots back.
 */
void kvf_ucx_op_cancel_all(kvf_ucx_worker_t *worker)
{
    kvf_ucx_op_t *op;

    while ((op = worker->inflight.head) != NULL) {
        kvf_ucx_op_list_remove(&worker->inflight, op);
        op->req = NULL;
        if (op->is_orphan) {
            worker->orphans--;
            kvf_ucx_op_free(op);
            continue;
        }
        op->status = KVF_ERR_CANCELED;
        kvf_ucx_op_list_push(&worker->done, op);
        kvf_ucx_op_dispatch_done(worker); /* runs the callback, drops the ep */
    }
}

/*
 * Fails what cannot be canceled. Endpoint failures are deferred to
 * dispatch, so the in-flight list changes here only when UCX completes a
 * canceled receive in place (that removes @p op alone).
 */
static void kvf_ucx_op_expire(kvf_ucx_op_t *op)
{
    kvf_ucx_worker_t *worker = op->worker;
    kvf_ucx_op_t *other;

    op->is_timed_out = true;
    worker->timeouts++;
    kvf_warn("worker %s: operation %d on %s timed out", worker->name,
             (int)op->type, (op->ep != NULL) ? op->ep->peer : "worker");

    if (op->type == KVF_UCX_OP_AM_RECV) {
        ucp_request_cancel(worker->ucp, op->req);
        if (op->req == NULL) {
            return; /* canceled in place */
        }
    }
    if (op->ep != NULL) {
        kvf_ucx_ep_fail(op->ep, KVF_ERR_TIMEOUT);
        return;
    }
    if (op->type == KVF_UCX_OP_WORKER_FLUSH) {
        /* UCX cannot cancel a flush: fail every busy endpoint instead */
        for (other = worker->inflight.head; other != NULL;
             other = other->next) {
            if ((other->ep != NULL) && !other->is_orphan) {
                kvf_ucx_ep_fail(other->ep, KVF_ERR_TIMEOUT);
            }
        }
    }
}

void kvf_ucx_op_on_timer(evutil_socket_t fd, short what, void *arg)
{
    kvf_ucx_worker_t *worker = arg;
    uint64_t now             = kvf_time_now_ns();
    uint64_t next_deadline   = UINT64_MAX;
    kvf_ucx_op_t *next;
    kvf_ucx_op_t *op;

    for (op = worker->inflight.head; op != NULL; op = next) {
        next = op->next;
        if (!op->is_timed_out && !op->is_orphan && (op->deadline_ns <= now)) {
            kvf_ucx_op_expire(op);
        }
    }
    for (op = worker->inflight.head; op != NULL; op = op->next) {
        if (!op->is_timed_out && !op->is_orphan &&
            (op->deadline_ns < next_deadline)) {
            next_deadline = op->deadline_ns;
        }
    }
    if (next_deadline != UINT64_MAX) {
        kvf_ucx_op_timer_arm(worker, next_deadline);
    }
    kvf_ucx_worker_kick(worker);
}

kvf_status_t kvf_ucx_am_send(kvf_ucx_ep_t *ep, unsigned id, const void *header,
                             size_t header_len, const void *data, size_t len,
                             const kvf_ucx_mem_t *mem, unsigned flags,
                             uint64_t timeout_ns, kvf_ucx_op_cb_t cb, void *arg)
{
    ucp_request_param_t param;
    kvf_ucx_op_t *op;
    kvf_status_t status;

    if ((ep == NULL) || (id >= KVF_UCX_AM_ID_MAX) ||
        ((flags & KVF_UCX_AM_SEND_EAGER) && (flags & KVF_UCX_AM_SEND_RNDV)) ||
        ((header == NULL) && (header_len > 0))) {
        return KVF_ERR_INVALID;
    }
    if (header_len > KVF_UCX_AM_HEADER_MAX) {
        return KVF_ERR_TOO_BIG;
    }
    status = kvf_ucx_op_alloc(ep->worker, ep, KVF_UCX_OP_AM_SEND, timeout_ns,
                              cb, arg, &op);
    if (status != KVF_OK) {
        return status;
    }
    if (header_len > 0) {
        memcpy(op->header, header, header_len);
    }
    kvf_ucx_op_param_init(op, &param);
    param.op_attr_mask |= UCP_OP_ATTR_FIELD_FLAGS;
    param.flags = UCP_AM_SEND_FLAG_REPLY;
    if (flags & KVF_UCX_AM_SEND_EAGER) {
        param.flags |= UCP_AM_SEND_FLAG_EAGER;
    }
    if (flags & KVF_UCX_AM_SEND_RNDV) {
        param.flags |= UCP_AM_SEND_FLAG_RNDV;
    }
    if (mem != NULL) {
        param.op_attr_mask |= UCP_OP_ATTR_FIELD_MEMH;
        param.memh = mem->memh;
    }
    return kvf_ucx_op_start(op,
                            ucp_am_send_nbx(ep->ucp_ep, id, op->header,
                                            header_len, data, len, &param),
                            "am send");
}

/* kvf_ucx_iov_t is handed to UCX as it is */
_Static_assert(sizeof(kvf_ucx_iov_t) == sizeof(ucp_dt_iov_t), "iov size");
_Static_assert(offsetof(kvf_ucx_iov_t, buf) == offsetof(ucp_dt_iov_t, buffer),
               "iov buffer");
_Static_assert(offsetof(kvf_ucx_iov_t, len) == offsetof(ucp_dt_iov_t, length),
               "iov length");

kvf_status_t kvf_ucx_am_send_iov(kvf_ucx_ep_t *ep, unsigned id,
                                 const void *header, size_t header_len,
                                 const kvf_ucx_iov_t *iov, size_t iovcnt,
                                 unsigned flags, uint64_t timeout_ns,
                                 kvf_ucx_op_cb_t cb, void *arg)
{
    ucp_request_param_t param;
    kvf_ucx_op_t *op;
    kvf_status_t status;

    if ((ep == NULL) || (id >= KVF_UCX_AM_ID_MAX) || (iov == NULL) ||
        (iovcnt == 0) || (iovcnt > KVF_UCX_IOV_MAX) ||
        ((flags & KVF_UCX_AM_SEND_EAGER) && (flags & KVF_UCX_AM_SEND_RNDV)) ||
        ((header == NULL) && (header_len > 0))) {
        return KVF_ERR_INVALID;
    }
    if (header_len > KVF_UCX_AM_IOV_HEADER_MAX) {
        return KVF_ERR_TOO_BIG;
    }
    status = kvf_ucx_op_alloc(ep->worker, ep, KVF_UCX_OP_AM_SEND, timeout_ns,
                              cb, arg, &op);
    if (status != KVF_OK) {
        return status;
    }
    if ((header_len > 0) && (header_len <= KVF_UCX_AM_HEADER_MAX)) {
        memcpy(op->header, header, header_len);
        header = op->header;
    }
    kvf_ucx_op_param_init(op, &param);
    param.op_attr_mask |= UCP_OP_ATTR_FIELD_FLAGS | UCP_OP_ATTR_FIELD_DATATYPE;
    param.datatype = ucp_dt_make_iov();
    param.flags    = UCP_AM_SEND_FLAG_REPLY;
    if (flags & KVF_UCX_AM_SEND_EAGER) {
        param.flags |= UCP_AM_SEND_FLAG_EAGER;
    }
    if (flags & KVF_UCX_AM_SEND_RNDV) {
        param.flags |= UCP_AM_SEND_FLAG_RNDV;
    }
    return kvf_ucx_op_start(op,
                            ucp_am_send_nbx(ep->ucp_ep, id, header, header_len,
                                            iov, iovcnt, &param),
                            "am send iov");
}

kvf_status_t kvf_ucx_worker_flush(kvf_ucx_worker_t *worker, uint64_t timeout_ns,
                                  kvf_ucx_op_cb_t cb, void *arg)
{
    ucp_request_param_t param;
    kvf_ucx_op_t *op;
    kvf_status_t status;

    if (worker == NULL) {
        return KVF_ERR_INVALID;
    }
    status = kvf_ucx_op_alloc(worker, NULL, KVF_UCX_OP_WORKER_FLUSH, timeout_ns,
                              cb, arg, &op);
    if (status != KVF_OK) {
        return status;
    }
    kvf_ucx_op_param_init(op, &param);
    return kvf_ucx_op_start(op, ucp_worker_flush_nbx(worker->ucp, &param),
                            "worker flush");
}
