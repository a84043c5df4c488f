/* SPDX-License-Identifier: Apache-2.0 */
/* Copyright (c) 2026 The kvfabric authors */
/*
 * PD: lifecycle, the one handler of PD control messages (it hands each
 * frame to the sender or the decoder side), the shared tick, engine and
 * endpoint teardown.
 */
#include "agent/pd.h"
#include "agent/pd_int.h"

#include "common/time.h"

#include <event2/event.h>

#include <stdio.h>
#include <stdlib.h>

void kvf_pd_tick_arm(kvf_pd_t *pd, uint64_t at_ns)
{
    uint64_t now = kvf_time_now_ns();
    struct timeval tv;

    at_ns = (at_ns > now) ? at_ns : now; /* due already: at once */
    if ((pd->tick_at_ns != 0) && (pd->tick_at_ns <= at_ns) &&
        evtimer_pending(pd->tick_ev, NULL)) {
        return; /* it fires sooner already */
    }
    tv             = kvf_time_to_timeval(at_ns - now);
    pd->tick_at_ns = at_ns;
    evtimer_add(pd->tick_ev, &tv); /* re-arms a pending one */
}

void kvf_pd_req_touch(kvf_pd_t *pd, kvf_pd_req_t *req)
{
    uint64_t soonest = (pd->push_timeout_ns < pd->claim_timeout_ns)
                           ? pd->push_timeout_ns
                           : pd->claim_timeout_ns;

    req->touched_ns = kvf_time_now_ns();
    if (pd->tick_ev != NULL) {
        kvf_pd_tick_arm(pd, req->touched_ns + soonest);
    }
}

static void kvf_pd_on_tick(evutil_socket_t fd, short what, void *arg)
{
    kvf_pd_t *pd = arg;
    uint64_t now = kvf_time_now_ns(), next, d;

    pd->tick_at_ns = 0;
    next           = kvf_pd_tick_sender(pd, now);
    if (pd->region != NULL) {
        d    = kvf_pd_tick_decoder(pd, now);
        next = (d < next) ? d : next;
    }
    if (next != UINT64_MAX) {
        kvf_pd_tick_arm(pd, next);
    }
}

static void kvf_pd_on_acks(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    kvf_pd_acks_flush(arg);
}

void kvf_pd_cancel(kvf_pd_t *pd, void *engine)
{
    kvf_pd_open_t *open;
    kvf_pd_push_t *push;
    kvf_pd_req_t *req;
    size_t n, i;
    khiter_t it;

    LIST_FOREACH(push, &pd->pushes, link) {
        if (push->engine == engine) {
            push->cb   = NULL;
            push->from = NULL; /* its chunks go with the push */
        }
    }
    /* kh_del inside the walk is safe: khash never resizes on delete */
    for (it = kh_begin(&pd->opens); it != kh_end(&pd->opens); it++) {
        if (kh_exist(&pd->opens, it) &&
            (kh_value(&pd->opens, it)->engine == engine) &&
            !kh_value(&pd->opens, it)->has_final) {
            open = kh_value(&pd->opens, it);
            kvf_pd_send_abort(pd, open->address, open->request_id,
                              KVF_ERR_CLOSED);
            kvf_pd_open_close(pd, open);
        }
    }
    n = kvf_pd_req_ids(pd);
    for (i = 0; i < n; i++) {
        req = kvf_pd_req_find(pd, pd->scratch[i]);
        if (req == NULL) {
            continue;
        }
        if (req->wait_engine == engine) {
            req->wait_cb     = NULL;
            req->wait_arg    = NULL;
            req->wait_engine = NULL;
            if (req->state == KVF_PD_REQ_WAITING) {
                kvf_pd_req_unlink(pd, req);
                continue;
            }
        }
        if ((req->state == KVF_PD_REQ_CLAIMED) && (req->claimer == engine)) {
            kvf_pd_req_unlink(pd, req); /* a crashed engine leaks nothing */
        }
    }
    if (pd->region != NULL) {
        kvf_pd_queue_pump(pd);
    }
}

void kvf_pd_ep_failed(kvf_pd_t *pd, kvf_ucx_ep_t *ep)
{
    kvf_pd_push_t *push, *push_next;
    kvf_pd_req_t *req;
    size_t n, i;

    /* sender side: pushes to a decoder that went away fail now rather than
     * at pd_push_timeout (their UCX operations complete with errors) */
    for (push = LIST_FIRST(&pd->pushes); push != NULL; push = push_next) {
        push_next = LIST_NEXT(push, link);
        if ((push->ep == ep) && (push->state != KVF_PD_PUSH_FINISHED) &&
            (push->state != KVF_PD_PUSH_RESOLVE)) {
            kvf_pd_push_finish(push, KVF_ERR_CLOSED,
                               "the connection to decoder %s failed",
                               push->decoder);
            kvf_pd_push_maybe_complete(push);
        }
    }

    /* by id, once each: an abort may unlink other requests */
    n = kvf_pd_req_ids(pd);
    for (i = 0; i < n; i++) {
        req = kvf_pd_req_find(pd, pd->scratch[i]);
        if ((req != NULL) && (req->src == ep) &&
            (req->state == KVF_PD_REQ_RECEIVING)) {
            kvf_pd_req_abort(pd, req, KVF_ERR_CLOSED, false,
                             "the prefill agent's connection failed");
        }
    }
}

/* --------------------------------------------------- active messages */

static kvf_status_t kvf_pd_on_ctrl(void *arg, const void *header,
                                   size_t header_len,
                                   const kvf_ucx_am_msg_t *msg)
{
    static const uint16_t types[] = {KVF_MSG_PD_ALLOC, KVF_MSG_PD_ALLOC_REPLY,
                                     KVF_MSG_PD_DONE, KVF_MSG_PD_DONE_REPLY,
                                     KVF_MSG_PD_ABORT};
    kvf_pd_t *pd                  = arg;
    kvf_frame_t frame;

    if (!kvf_mesh_accept(pd->mesh, msg)) {
        return KVF_OK; /* before anything is parsed */
    }
    if (msg->is_rndv) {
        kvf_mesh_drop(pd->mesh, KVF_MESH_DROP_MALFORMED);
        return KVF_OK;
    }
    if (kvf_mesh_decode(pd->mesh, msg->data, msg->length, KVF_FRAME_MAX_DEFAULT,
                        types, sizeof(types) / sizeof(types[0]),
                        "PD control message", &frame) != KVF_OK) {
        return KVF_OK;
    }
    if ((msg->reply_ep == NULL) &&
        ((frame.type == KVF_MSG_PD_ALLOC) || (frame.type == KVF_MSG_PD_DONE) ||
         (frame.type == KVF_MSG_PD_ABORT))) {
        kvf_mesh_drop(pd->mesh, KVF_MESH_DROP_NO_REPLY_EP);
        kvf_frame_release(&frame, NULL);
        return KVF_OK;
    }
    switch (frame.type) {
    case KVF_MSG_PD_ALLOC:
        kvf_pd_on_alloc(pd, msg->reply_ep, (const Kvf__PdAlloc *)frame.msg);
        break;
    case KVF_MSG_PD_ALLOC_REPLY:
        kvf_pd_on_alloc_reply(pd, msg->reply_ep,
                              (const Kvf__PdAllocReply *)frame.msg);
        break;
    case KVF_MSG_PD_DONE:
        if (pd->region != NULL) {
            kvf_pd_on_done(pd, msg->reply_ep, (const Kvf__PdDone *)frame.msg);
        }
        break;
    case KVF_MSG_PD_DONE_REPLY:
        kvf_pd_on_done_reply(pd, msg->reply_ep,
                             (const Kvf__PdDoneReply *)frame.msg);
        break;
    case KVF_MSG_PD_ABORT:
        if (pd->region != NULL) {
            kvf_pd_on_abort(pd, msg->reply_ep, (const Kvf__PdAbort *)frame.msg);
        }
        break;
    default:
        break; /* kvf_mesh_decode let only these types through */
    }
    kvf_frame_release(&frame, NULL);
    return KVF_OK;
}

/* ----------------------------------------------------------- lifecycle */

kvf_status_t kvf_pd_create(const kvf_pd_params_t *params, kvf_pd_t **pd_p)
{
    kvf_status_t status = KVF_ERR_NO_MEMORY;
    kvf_pd_t *pd;

    pd = calloc(1, sizeof(*pd));
    if (pd == NULL) {
        return KVF_ERR_NO_MEMORY;
    }
    if (params->mesh == NULL) {
        free(pd);
        return KVF_ERR_INVALID;
    }
    kh_init_inplace(kvf_pd_reqs, &pd->reqs_by_id);
    kh_init_inplace(kvf_pd_pushes, &pd->pushes_by_ticket);
    kh_init_inplace(kvf_pd_nodes, &pd->pieces_nodes);
    kh_init_inplace(kvf_pd_opens, &pd->opens);
    LIST_INIT(&pd->pushes);
    kh_init_inplace(kvf_pd_quota, &pd->quota);
    pd->peer_max_bytes   = params->peer_max_bytes;
    pd->mesh             = params->mesh;
    pd->base             = params->base;
    pd->worker           = kvf_mesh_worker(params->mesh);
    pd->pool_mem         = params->pool_mem;
    pd->store            = params->store;
    pd->region_base      = params->region_base;
    pd->region_offset    = params->region_offset;
    pd->region_mem       = params->region_mem;
    pd->region_is_device = params->region_is_device;
    pd->queue_max        = params->queue_max;
    pd->takes_pieces     = params->takes_pieces;
    pd->alloc_timeout_ns = params->alloc_timeout_ns;
    pd->push_timeout_ns  = params->push_timeout_ns;
    pd->wait_timeout_ns  = params->wait_timeout_ns;
    pd->claim_timeout_ns = params->claim_timeout_ns;
    snprintf(pd->name, sizeof(pd->name), "%s",
             (params->name != NULL) ? params->name : "agent");
    pd->tick_ev = evtimer_new(params->base, kvf_pd_on_tick, pd);
    pd->ack_ev  = event_new(params->base, -1, 0, kvf_pd_on_acks, pd);
    if ((pd->tick_ev == NULL) || (pd->ack_ev == NULL)) {
        goto err;
    }
    if (params->region_size > 0) {
        status = kvf_pd_region_create(params->region_size, &pd->region);
        if (status != KVF_OK) {
            goto err;
        }
        if (pd->region_is_device) {
            /* one chunk at a time is copied back for its checksum */
            pd->bounce_len = kvf_store_max_chunk(pd->store);
            pd->bounce     = malloc(pd->bounce_len);
            if (pd->bounce == NULL) {
                status = KVF_ERR_NO_MEMORY;
                goto err;
            }
        }
        pd->stats.region_size = kvf_pd_region_size(pd->region);
    }
    status =
        kvf_mesh_set_handler(pd->mesh, KVF_MESH_AM_PD_CTRL, kvf_pd_on_ctrl, pd);
    if (status == KVF_OK) {
        status = kvf_mesh_set_handler(pd->mesh, KVF_MESH_AM_PD_DATA,
                                      kvf_pd_on_data, pd);
    }
    if (status != KVF_OK) {
        goto err;
    }
    *pd_p = pd;
    return KVF_OK;

err:
    kvf_pd_destroy(pd);
    return status;
}

void kvf_pd_destroy(kvf_pd_t *pd)
{
    kvf_pd_open_t *open;
    kvf_pd_push_t *push;

    if (pd == NULL) {
        return;
    }
    if (pd->ctl != NULL) {
        LIST_FOREACH(push, &pd->pushes, link) {
            kvf_ctl_client_cancel(pd->ctl, push);
        }
    }
    /* the worker is gone: nothing is in flight any more */
    while ((push = LIST_FIRST(&pd->pushes)) != NULL) {
        LIST_REMOVE(push, link);
        open = push->open;
        TAILQ_REMOVE(&open->pushes, push, in_request);
        if (!open->is_open && TAILQ_EMPTY(&open->pushes)) {
            free(open); /* closed: in no table */
        }
        /* push->ep went with the worker (it frees every endpoint) */
        kvf_pd_push_free(push);
    }
    kh_foreach_value(&pd->opens, open, free(open));
    while (pd->reqs != NULL) {
        pd->reqs->wait_cb = NULL;
        pd->reqs->src     = NULL; /* freed with the worker, like push->ep */
        kvf_pd_req_unlink(pd, pd->reqs);
    }
    if (pd->tick_ev != NULL) {
        event_free(pd->tick_ev);
    }
    if (pd->ack_ev != NULL) {
        event_free(pd->ack_ev);
    }
    free(pd->acks); /* their endpoints went with the worker */
    kvf_pd_region_destroy(pd->region);
    free(pd->bounce);
    kh_destroy_inplace(kvf_pd_reqs, &pd->reqs_by_id);
    kh_destroy_inplace(kvf_pd_pushes, &pd->pushes_by_ticket);
    kh_destroy_inplace(kvf_pd_nodes, &pd->pieces_nodes);
    kh_destroy_inplace(kvf_pd_opens, &pd->opens);
    kh_destroy_inplace(kvf_pd_quota, &pd->quota);
    free(pd->scratch);
    free(pd);
}

void kvf_pd_set_draining(kvf_pd_t *pd, bool is_draining)
{
    pd->is_draining = is_draining;
}

void kvf_pd_set_ctl(kvf_pd_t *pd, kvf_ctl_client_t *ctl)
{
    pd->ctl = ctl;
}

void kvf_pd_set_transports(kvf_pd_t *pd, struct kvf_transports *t)
{
    pd->transports = t;
}

void kvf_pd_set_local(kvf_pd_t *pd, struct kvf_local *local)
{
    pd->local = local;
}

void kvf_pd_get_stats(const kvf_pd_t *pd, kvf_pd_stats_t *stats_p)
{
    *stats_p = pd->stats;
    if (pd->region != NULL) {
        stats_p->region_used = kvf_pd_region_used(pd->region);
    }
}

void kvf_pd_region_info(const kvf_pd_t *pd, uint64_t *offset_p,
                        uint64_t *size_p, uint64_t *push_timeout_ns_p)
{
    *offset_p = pd->region_offset;
    *size_p   = (pd->region != NULL) ? kvf_pd_region_size(pd->region) : 0;
    *push_timeout_ns_p = pd->push_timeout_ns;
}
