/* SPDX-License-Identifier: Apache-2.0 */
/* Copyright (c) 2026 The kvfabric authors */
/*
 * PD sender (prefill) side: resolve the decoder, PD_ALLOC, one PD_DATA per
 * chunk by rendezvous, PD_DONE, and the replies (agent/pd.h).
 */
#include "agent/local.h"
#include "agent/pd_int.h"

#include "common/log.h"
#include "common/time.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* --------------------------------------------------------- control msgs */

static void kvf_pd_on_msg_sent(kvf_status_t status, void *arg, uint64_t tag)
{
    kvf_pd_push_t *push = arg;

    if (push == NULL) {
        return;
    }
    push->inflight--;
    if (status != KVF_OK) {
        kvf_pd_push_finish(push, status, "cannot reach decoder %s at %s: %s",
                           push->decoder, push->address, kvf_strerror(status));
    }
    kvf_pd_push_maybe_complete(push);
}

/* Sends one PD_* frame as an eager active message on @p ep. */
kvf_status_t kvf_pd_send(kvf_pd_t *pd, kvf_ucx_ep_t *ep, uint16_t type,
                         const ProtobufCMessage *msg, kvf_pd_push_t *push)
{
    kvf_status_t status;

    status =
        kvf_mesh_send_frame(pd->mesh, ep, KVF_MESH_AM_PD_CTRL, type, msg,
                            pd->push_timeout_ns, kvf_pd_on_msg_sent, push, 0);
    if (status != KVF_OK) {
        return status;
    }
    if (push != NULL) {
        push->inflight++;
    }
    return KVF_OK;
}

/* ====================================================== sender side === */

static kvf_pd_push_t *kvf_pd_push_find(kvf_pd_t *pd, uint64_t ticket)
{
    khiter_t it = kh_get(kvf_pd_pushes, &pd->pushes_by_ticket, ticket);

    return (it == kh_end(&pd->pushes_by_ticket))
               ? NULL
               : kh_value(&pd->pushes_by_ticket, it);
}

void kvf_pd_open_close(kvf_pd_t *pd, kvf_pd_open_t *open)
{
    khiter_t it;

    if (open->is_open) {
        it = kh_get(kvf_pd_opens, &pd->opens, open->request_id);
        if (it != kh_end(&pd->opens)) {
            kh_del(kvf_pd_opens, &pd->opens, it);
        }
        open->is_open = false;
    }
    if (TAILQ_EMPTY(&open->pushes)) {
        free(open);
    }
}

/* Tells the decoder at @p address to forget @p request_id. */
void kvf_pd_send_abort(kvf_pd_t *pd, const char *address, uint64_t request_id,
                       kvf_status_t reason)
{
    kvf_ucx_ep_t *ep = NULL;
    Kvf__PdAbort m;

    if ((address[0] == '\0') ||
        (kvf_ucx_ep_get(pd->worker, address, NULL, &ep) != KVF_OK)) {
        return;
    }
    if (!kvf_mesh_is_ready(pd->mesh, ep)) {
        /* the decoder never took anything from this endpoint */
        kvf_ucx_ep_put(ep);
        return;
    }
    kvf__pd_abort__init(&m);
    m.request_id = request_id;
    m.reason     = reason;
    kvf_pd_send(pd, ep, KVF_MSG_PD_ABORT, &m.base, NULL);
    kvf_ucx_ep_put(ep);
}

static void kvf_pd_push_start_queued(kvf_pd_t *pd, kvf_pd_open_t *open);

/* Remembers that decoder @p node_id takes pieces (@p is_pieces), or
 * forgets it (it went away: what comes back may be older). */
static void kvf_pd_node_pieces(kvf_pd_t *pd, uint32_t node_id, bool is_pieces)
{
    khiter_t it;
    int ret;

    if (node_id == 0) {
        return;
    }
    if (!is_pieces) {
        it = kh_get(kvf_pd_nodes, &pd->pieces_nodes, node_id);
        if (it != kh_end(&pd->pieces_nodes)) {
            kh_del(kvf_pd_nodes, &pd->pieces_nodes, it);
        }
        return;
    }
    if (kh_size(&pd->pieces_nodes) >= KVF_PD_PIECES_NODES_MAX) {
        kh_clear(kvf_pd_nodes, &pd->pieces_nodes); /* relearned at once */
    }
    (void)kh_put(kvf_pd_nodes, &pd->pieces_nodes, node_id, &ret);
}

/* Did the decoder @p push goes to say it takes pieces? */
static bool kvf_pd_node_takes_pieces(kvf_pd_t *pd, const kvf_pd_push_t *push)
{
    uint32_t node_id = 0;

    if ((kh_size(&pd->pieces_nodes) == 0) ||
        (kvf_mesh_node_by_name(pd->mesh, push->decoder, &node_id) == NULL)) {
        return false;
    }
    return kh_get(kvf_pd_nodes, &pd->pieces_nodes, node_id) !=
           kh_end(&pd->pieces_nodes);
}

/* The push failed or succeeded; it completes once nothing is in flight.
 * A failure fails every other push of its request here too (their
 * chunks would leave a hole in it); a success may let the next one go. */
void kvf_pd_push_finish(kvf_pd_push_t *push, kvf_status_t status,
                        const char *fmt, ...)
{
    kvf_pd_t *pd = push->pd;
    kvf_pd_push_t *p;
    kvf_pd_open_t *open = push->open;
    va_list ap;

    if (push->state == KVF_PD_PUSH_FINISHED) {
        return;
    }
    push->state  = KVF_PD_PUSH_FINISHED;
    push->status = status;
    va_start(ap, fmt);
    vsnprintf(push->message, sizeof(push->message), fmt, ap);
    va_end(ap);
    if (status == KVF_OK) {
        pd->stats.pushes++;
        pd->stats.bytes_sent += push->bytes;
        kvf_peer_lat_record(pd->stats.lat_counts, &pd->stats.lat_sum_us,
                            (kvf_time_now_ns() - push->start_ns) /
                                KVF_NSEC_PER_USEC);
        kvf_pd_push_start_queued(pd, open);
        if (push->is_final) {
            kvf_pd_open_close(pd, open);
        }
        return;
    }
    pd->stats.push_failures++;
    kvf_debug("%s: push of PD request %llu to %s failed: %s", pd->name,
              (unsigned long long)push->request_id, push->decoder,
              push->message);
    if ((status == KVF_ERR_CLOSED) || (status == KVF_ERR_NOT_FOUND)) {
        kvf_mesh_node_forget(pd->mesh, 0, push->decoder);
    }
    if ((status == KVF_ERR_CLOSED) || (status == KVF_ERR_NOT_FOUND) ||
        (status == KVF_ERR_BUSY)) {
        /* gone, or refused a piece: the next request relearns it */
        kvf_pd_node_pieces(pd, push->decoder_id, false);
    }
    /* a duplicate of a request's first push must not disturb the request
     * it collided with; any other failure ends the request at the decoder
     * too */
    if (((status != KVF_ERR_EXISTS) && (status != KVF_ERR_BUSY)) ||
        (push->piece > 1)) {
        kvf_pd_send_abort(pd, push->address, push->request_id, status);
    }
    TAILQ_FOREACH(p, &open->pushes, in_request) {
        if (p->state != KVF_PD_PUSH_FINISHED) {
            p->state  = KVF_PD_PUSH_FINISHED;
            p->status = status;
            snprintf(p->message, sizeof(p->message),
                     "an earlier push of PD request %llu failed: %.180s",
                     (unsigned long long)p->request_id, push->message);
            pd->stats.push_failures++;
        }
    }
    kvf_pd_open_close(pd, open); /* a retry starts afresh */
    kvf_pd_tick_arm(pd, 0);      /* the queued ones complete from the loop */
}

void kvf_pd_push_maybe_complete(kvf_pd_push_t *push)
{
    kvf_pd_t *pd        = push->pd;
    kvf_pd_open_t *open = push->open;
    khiter_t it;
    uint64_t len;
    uint32_t i;

    if ((push->state != KVF_PD_PUSH_FINISHED) || (push->inflight > 0) ||
        (push->pending_ctl > 0) || push->is_authenticating) {
        return;
    }
    if (push->is_link_waiting) {
        kvf_local_cancel(pd->local, push);
    }
    LIST_REMOVE(push, link);
    TAILQ_REMOVE(&open->pushes, push, in_request);
    push->open = NULL;
    if (!open->is_open && TAILQ_EMPTY(&open->pushes)) {
        free(open);
    }
    it = kh_get(kvf_pd_pushes, &pd->pushes_by_ticket, push->ticket);
    if (it != kh_end(&pd->pushes_by_ticket)) {
        kh_del(kvf_pd_pushes, &pd->pushes_by_ticket, it);
    }
    /* the chunks go back to their engine (freed if it is gone) */
    if (push->from != NULL) {
        for (i = 0; i < push->num; i++) {
            kvf_store_move(pd->store, push->owner, push->from, push->offsets[i],
                           &len);
        }
    }
    kvf_ucx_ep_put(push->ep);
    push->ep = NULL;
    if (push->cb != NULL) {
        push->cb(push->arg, push->status, push->message);
    }
    kvf_pd_push_free(push);
}

void kvf_pd_push_free(kvf_pd_push_t *push)
{
    kvf_store_owner_destroy(push->pd->store, push->owner);
    if (push->src_put != NULL) {
        push->src_put(push->src_arg); /* UCX reads none of it any more */
    }
    free(push->offsets);
    free(push->lengths);
    free(push->checksums);
    free(push->iov);
    free(push->srcs);
    free(push);
}

/* Where chunk @p i of @p push is read. */
static const void *kvf_pd_push_src(const kvf_pd_push_t *push, uint32_t i)
{
    if ((push->srcs != NULL) && (push->srcs[i] != NULL)) {
        return push->srcs[i];
    }
    return (const uint8_t *)kvf_store_base(push->pd->store) + push->offsets[i];
}

/* Sends @p m (PD_ALLOC or PD_DONE) to the decoder, the push now in
 * @p state; a failure finishes the push. */
static void kvf_pd_push_send_msg(kvf_pd_push_t *push, kvf_pd_push_state_t state,
                                 uint16_t type, const ProtobufCMessage *m)
{
    kvf_status_t status;

    push->state = state;
    status      = kvf_pd_send(push->pd, push->ep, type, m, push);
    if (status != KVF_OK) {
        kvf_pd_push_finish(push, status, "cannot send %s to %s: %s",
                           kvf_msg_type_name(type), push->decoder,
                           kvf_strerror(status));
    }
}

static void kvf_pd_push_send_done(kvf_pd_push_t *push)
{
    Kvf__PdDone m;

    kvf__pd_done__init(&m);
    m.request_id  = push->request_id;
    m.ticket      = push->ticket;
    m.batch       = push->batch;
    m.n_checksums = push->num;
    m.checksums   = push->checksums;
    m.final       = push->is_final;
    kvf_pd_push_send_msg(push, KVF_PD_PUSH_DONE, KVF_MSG_PD_DONE, &m.base);
}

static void kvf_pd_on_data_sent(kvf_status_t status, void *arg)
{
    kvf_pd_push_t *push = arg;

    push->inflight--;
    if (status != KVF_OK) {
        kvf_pd_push_finish(push, status, "sending a chunk to %s failed: %s",
                           push->decoder, kvf_strerror(status));
    } else if ((++push->sent == push->msgs) &&
               (push->state == KVF_PD_PUSH_DATA)) {
        if (push->is_implied) {
            push->state = KVF_PD_PUSH_DONE; /* the decoder acks unasked */
        } else {
            kvf_pd_push_send_done(push);
        }
    }
    kvf_pd_push_maybe_complete(push);
}

/* @p push's data waits for worker operations to free up; the tick goes on
 * with it (kvf_pd_push_send_runs). */
static void kvf_pd_push_park(kvf_pd_push_t *push)
{
    push->is_parked  = true;
    push->park_until = kvf_time_deadline_ns(KVF_PD_PARK_NS);
    push->pd->stats.parked++;
    kvf_pd_tick_arm(push->pd, push->park_until);
}

/* How many chunks from @p i on travel in one PD_DATA (1: on its own). */
static uint32_t kvf_pd_push_run(const kvf_pd_push_t *push, uint32_t i)
{
    uint64_t bytes = 0;
    uint32_t n     = 0;

    while ((push->iov != NULL) && (i + n < push->num) &&
           (n < KVF_UCX_IOV_MAX) &&
           (push->lengths[i + n] <= KVF_PD_MULTI_CHUNK_MAX) &&
           (bytes + push->lengths[i + n] <= KVF_PD_MULTI_BYTES)) {
        bytes += push->lengths[i + n];
        n++;
    }
    return (n > 0) ? n : 1;
}

/* Sends the PD_DATA messages of @p push from chunk push->data_next on.
 * While the worker has no operation free (a burst of pushes) the rest
 * wait and go from the tick (KVF_PD_PARK_NS later): a push is slowed by a
 * burst, never failed by it. */
static void kvf_pd_push_send_runs(kvf_pd_push_t *push)
{
    kvf_pd_t *pd = push->pd;
    uint8_t hdr[KVF_PD_HDR_MAX];
    kvf_status_t status;
    Kvf__PdData m;
    size_t len;
    uint32_t i, n, k;

    for (i = push->data_next; i < push->num; i += n) {
        n = kvf_pd_push_run(push, i);
        kvf__pd_data__init(&m);
        m.request_id = push->request_id;
        m.batch      = push->batch;
        m.index      = i;
        m.length     = push->lengths[i];
        if (n > 1) {
            m.count  = n;
            m.length = 0;
            for (k = 0; k < n; k++) {
                push->iov[i + k].buf =
                    (void *)(uintptr_t)kvf_pd_push_src(push, i + k);
                push->iov[i + k].len = push->lengths[i + k];
                m.length += push->lengths[i + k];
            }
        }
        status = kvf_frame_pack(hdr, sizeof(hdr), KVF_MSG_PD_DATA, 0, &m.base,
                                KVF_PD_HDR_MAX, &len);
        if ((status == KVF_OK) && (n > 1)) {
            status = kvf_ucx_am_send_iov(
                push->ep, KVF_MESH_AM_PD_DATA, hdr, len, &push->iov[i], n,
                KVF_UCX_AM_SEND_RNDV, kvf_time_left_ns(push->deadline_ns) + 1,
                kvf_pd_on_data_sent, push);
        } else if (status == KVF_OK) {
            const bool is_pool =
                (push->srcs == NULL) || (push->srcs[i] == NULL);

            /* staging is not registered: UCX's cache registers it once */
            status = kvf_ucx_am_send(push->ep, KVF_MESH_AM_PD_DATA, hdr, len,
                                     kvf_pd_push_src(push, i), push->lengths[i],
                                     is_pool ? pd->pool_mem : NULL,
                                     KVF_UCX_AM_SEND_RNDV,
                                     kvf_time_left_ns(push->deadline_ns) + 1,
                                     kvf_pd_on_data_sent, push);
        }
        if (status == KVF_ERR_BUSY) {
            push->data_next = i;
            kvf_pd_push_park(push);
            return;
        }
        if (status != KVF_OK) {
            kvf_pd_push_finish(push, status, "cannot send chunk %u to %s: %s",
                               i, push->decoder, kvf_strerror(status));
            return;
        }
        push->inflight++;
    }
    push->data_next = push->num;
}

/* Slots reserved: every chunk goes by rendezvous straight into its slot;
 * small ones several a message when the decoder takes that (@p multi). */
static void kvf_pd_push_send_data(kvf_pd_push_t *push, bool multi)
{
    uint32_t i, n;

    push->state = KVF_PD_PUSH_DATA;
    if (multi && (push->num > 1) && (push->iov == NULL)) {
        push->iov = calloc(push->num, sizeof(*push->iov)); /* NULL: singly */
    }
    push->msgs = 0;
    for (i = 0; i < push->num; i += n) {
        n = kvf_pd_push_run(push, i);
        push->msgs++;
    }
    push->data_next = 0;
    kvf_pd_push_send_runs(push);
}

/* Bytes copied before a notice tells the decoder those chunks are in
 * place (it verifies them while the next ones are copied). */
#define KVF_PD_COPY_NOTICE (1u << 20)

/* How many chunks from @p i on one copy notice covers. */
static uint32_t kvf_pd_push_copy_run(const kvf_pd_push_t *push, uint32_t i)
{
    uint64_t bytes = 0;
    uint32_t n     = 0;

    while ((i + n < push->num) && (bytes < KVF_PD_COPY_NOTICE)) {
        bytes += push->lengths[i + n];
        n++;
    }
    return n;
}

/*
 * Same host: copies every chunk into the slot PD_ALLOC_REPLY named,
 * through the decoder's receive region (agent/local.h), and after each
 * KVF_PD_COPY_NOTICE bytes tells the decoder those chunks are in place
 * (PD_DATA copied, no payload); PD_DONE follows the last notice as after
 * PD_DATA. false when that path is not up for this decoder (the chunks
 * then go over UCX); a slot outside the region fails the push.
 */
static bool kvf_pd_push_copy(kvf_pd_push_t *push, const Kvf__PdAllocReply *m)
{
    kvf_pd_t *pd = push->pd;
    uint8_t hdr[KVF_PD_HDR_MAX], *region;
    uint64_t region_len, proven;
    kvf_status_t status;
    Kvf__PdData d;
    uint32_t i, k, n;
    size_t len;

    if ((pd->local == NULL) || (push->decoder_id == 0)) {
        return false;
    }
    /* the link is to the node we resolved; the endpoint that answered
     * must be that node too (auth on), or the slots are another's */
    proven = kvf_mesh_peer_id(pd->mesh, push->ep);
    if (((proven != 0) && (proven != push->decoder_id)) ||
        (kvf_local_region(pd->local, push->decoder_id, push->address, &region,
                          &region_len) != KVF_OK)) {
        return false;
    }
    for (i = 0; i < push->num; i++) {
        if ((m->offsets[i] > region_len) ||
            (push->lengths[i] > region_len - m->offsets[i])) {
            kvf_pd_push_finish(push, KVF_ERR_PROTO,
                               "decoder %s named slot %u outside its receive "
                               "region",
                               push->decoder, i);
            return true;
        }
    }
    push->state = KVF_PD_PUSH_DATA;
    push->msgs  = 0;
    for (i = 0; i < push->num; i += n) {
        n = kvf_pd_push_copy_run(push, i);
        push->msgs++;
    }
    for (i = 0; i < push->num; i += n) {
        n = kvf_pd_push_copy_run(push, i);
        kvf__pd_data__init(&d);
        d.request_id = push->request_id;
        d.batch      = push->batch;
        d.index      = i;
        d.count      = n;
        d.copied     = true;
        for (k = i; k < i + n; k++) {
            memcpy(region + m->offsets[k], kvf_pd_push_src(push, k),
                   push->lengths[k]);
            d.length += push->lengths[k];
        }
        status = kvf_frame_pack(hdr, sizeof(hdr), KVF_MSG_PD_DATA, 0, &d.base,
                                KVF_PD_HDR_MAX, &len);
        if (status == KVF_OK) {
            status = kvf_ucx_am_send(push->ep, KVF_MESH_AM_PD_DATA, hdr, len,
                                     NULL, 0, NULL, KVF_UCX_AM_SEND_EAGER,
                                     kvf_time_left_ns(push->deadline_ns) + 1,
                                     kvf_pd_on_data_sent, push);
        }
        if (status != KVF_OK) {
            kvf_pd_push_finish(push, status,
                               "cannot tell decoder %s chunk %u is in place: "
                               "%s",
                               push->decoder, i, kvf_strerror(status));
            return true;
        }
        push->inflight++;
    }
    pd->stats.copied_pushes++;
    pd->stats.copied_bytes += push->bytes;
    return true;
}

void kvf_pd_on_alloc_reply(kvf_pd_t *pd, kvf_ucx_ep_t *ep,
                           const Kvf__PdAllocReply *m)
{
    kvf_pd_push_t *push = kvf_pd_push_find(pd, m->ticket);

    if ((push == NULL) || (push->ep != ep)) {
        kvf_mesh_drop(pd->mesh, KVF_MESH_DROP_UNEXPECTED);
        return; /* a ticket nobody here issued, or not from its decoder */
    }
    if ((push->state != KVF_PD_PUSH_ALLOC) ||
        (push->request_id != m->request_id)) {
        return; /* late: the push already gave up */
    }
    if (m->status != KVF_OK) {
        kvf_pd_push_finish(push, (kvf_status_t)m->status, "decoder %s: %s",
                           push->decoder,
                           (m->message != NULL) ? m->message : "");
        kvf_pd_push_maybe_complete(push);
        return;
    }
    if (m->n_offsets != push->num) {
        kvf_pd_push_finish(push, KVF_ERR_PROTO,
                           "decoder %s reserved %zu slots for %u chunks",
                           push->decoder, m->n_offsets, push->num);
        kvf_pd_push_maybe_complete(push);
        return;
    }
    push->batch      = m->batch;
    push->is_implied = m->done_implied;
    if (!kvf_pd_push_copy(push, m)) {
        kvf_pd_push_send_data(push, m->multi);
    }
    if (m->pieces && (push->state != KVF_PD_PUSH_FINISHED)) {
        /* the decoder orders this request's pushes: the next ones go now,
         * and those of later requests at once */
        kvf_pd_node_pieces(pd, push->decoder_id, true);
        if (!push->open->is_pieces) {
            push->open->is_pieces = true;
            kvf_pd_push_start_queued(pd, push->open);
        }
    }
    kvf_pd_push_maybe_complete(push);
}

/* The decoder's answer for push @p ticket, which counts only from the
 * endpoint the push went to. */
static void kvf_pd_on_ack(kvf_pd_t *pd, kvf_ucx_ep_t *ep, uint64_t request_id,
                          uint64_t ticket, kvf_status_t status,
                          const char *message)
{
    kvf_pd_push_t *push = kvf_pd_push_find(pd, ticket);

    if ((push == NULL) || (push->ep != ep)) {
        kvf_mesh_drop(pd->mesh, KVF_MESH_DROP_UNEXPECTED);
        return;
    }
    if ((push->state == KVF_PD_PUSH_FINISHED) ||
        (push->request_id != request_id)) {
        return;
    }
    if (status != KVF_OK) {
        kvf_pd_push_finish(push, status, "decoder %s: %s", push->decoder,
                           (message != NULL) ? message : "");
    } else if ((push->state == KVF_PD_PUSH_DONE) ||
               (push->is_implied && (push->state == KVF_PD_PUSH_DATA))) {
        /* the decoder verified every byte: delivered (done implied, its
         * ack may overtake our last send's completion) */
        kvf_pd_push_finish(push, KVF_OK, "%s", "");
    }
    kvf_pd_push_maybe_complete(push);
}

void kvf_pd_on_done_reply(kvf_pd_t *pd, kvf_ucx_ep_t *ep,
                          const Kvf__PdDoneReply *m)
{
    size_t i;

    kvf_pd_on_ack(pd, ep, m->request_id, m->ticket, (kvf_status_t)m->status,
                  m->message);
    if ((m->status != KVF_OK) || (m->n_more >= KVF_PD_ACKS_MAX)) {
        return; /* only successes coalesce, KVF_PD_ACKS_MAX at most */
    }
    for (i = 0; i < m->n_more; i++) {
        kvf_pd_on_ack(pd, ep, m->more[i]->request_id, m->more[i]->ticket,
                      KVF_OK, "");
    }
}

static void kvf_pd_push_send_alloc(kvf_pd_push_t *push);

/* The endpoint to the decoder finished its handshake. */
static void kvf_pd_on_ready(void *arg, kvf_status_t status, kvf_ucx_ep_t *ep,
                            uint64_t tag)
{
    kvf_pd_push_t *push = arg;

    push->is_authenticating = false;
    if (push->state == KVF_PD_PUSH_RESOLVE) {
        if (status == KVF_OK) {
            kvf_pd_push_send_alloc(push);
        } else {
            kvf_pd_push_finish(push, KVF_ERR_CLOSED,
                               "decoder %s at %s did not prove the cluster "
                               "secret: %s",
                               push->decoder, push->address,
                               kvf_strerror(status));
        }
    }
    kvf_pd_push_maybe_complete(push);
}

static void kvf_pd_push_send_alloc(kvf_pd_push_t *push)
{
    kvf_pd_t *pd = push->pd;
    kvf_status_t status;
    Kvf__PdAlloc m;

    if (push->ep == NULL) {
        status = kvf_ucx_ep_get(pd->worker, push->address, NULL, &push->ep);
        if (status != KVF_OK) {
            kvf_pd_push_finish(
                push, KVF_ERR_CLOSED, "cannot connect to decoder %s at %s: %s",
                push->decoder, push->address, kvf_strerror(status));
            return;
        }
    }
    status = kvf_mesh_connect(pd->mesh, push->ep, 0, push->decoder,
                              kvf_pd_on_ready, push, 0);
    if (status == KVF_INPROGRESS) {
        push->is_authenticating = true; /* kvf_pd_on_ready goes on */
        return;
    }
    if (status != KVF_OK) {
        kvf_pd_push_finish(push, KVF_ERR_CLOSED,
                           "decoder %s at %s failed the cluster-secret "
                           "handshake",
                           push->decoder, push->address);
        return;
    }
    kvf__pd_alloc__init(&m);
    m.request_id   = push->request_id;
    m.ticket       = push->ticket;
    m.n_lengths    = push->num;
    m.lengths      = push->lengths;
    m.n_checksums  = push->num;
    m.checksums    = push->checksums;
    m.final        = push->is_final;
    m.done_implied = true; /* the checksums are here: PD_DONE adds nothing */
    m.piece        = push->piece;
    kvf_pd_push_send_msg(push, KVF_PD_PUSH_ALLOC, KVF_MSG_PD_ALLOC, &m.base);
}

/* The same-host link @p push waited for is up (@p ready) or not: the push
 * goes on from the loop (kvf_pd_tick_sender). */
static void kvf_pd_on_link(void *arg, bool ready)
{
    kvf_pd_push_t *push = arg;

    push->is_link_waiting = false;
    push->link_until      = 0;
    kvf_pd_tick_arm(push->pd, 0);
}

/* Starts the push at its decoder's address; its request's open record
 * learns the address, so an engine that goes away mid-request aborts it
 * at the decoder. */
static void kvf_pd_push_begin(kvf_pd_push_t *push, uint32_t decoder_id,
                              const char *address)
{
    kvf_pd_t *pd        = push->pd;
    kvf_pd_open_t *open = push->open;

    snprintf(push->address, sizeof(push->address), "%s", address);
    push->decoder_id = decoder_id;
    if (open->address[0] == '\0') {
        snprintf(open->address, sizeof(open->address), "%s", address);
    }
    if ((pd->local != NULL) && (decoder_id != 0) &&
        (kvf_local_region_when(pd->local, decoder_id, address, kvf_pd_on_link,
                               push) == KVF_INPROGRESS)) {
        /* a decoder on this host whose link is being proved (a few
         * messages on a local socket): its chunks are copied if it is up
         * within KVF_PD_LINK_WAIT_NS, else they go over UCX */
        push->state           = KVF_PD_PUSH_LINK;
        push->is_link_waiting = true;
        push->link_until      = kvf_time_deadline_ns(KVF_PD_LINK_WAIT_NS);
        kvf_pd_tick_arm(pd, push->link_until);
        return;
    }
    kvf_pd_push_send_alloc(push);
}

static void kvf_pd_on_node(void *arg, kvf_status_t status, uint32_t node_id,
                           const char *data_address, bool alive)
{
    kvf_pd_push_t *push = arg;
    kvf_pd_t *pd        = push->pd;

    push->pending_ctl--;
    if (push->state != KVF_PD_PUSH_RESOLVE) {
        kvf_pd_push_maybe_complete(push);
        return;
    }
    if ((status != KVF_OK) || !alive || (data_address[0] == '\0')) {
        kvf_pd_push_finish(
            push, (status == KVF_OK) ? KVF_ERR_CLOSED : status,
            "no live decoder named %s in the controller's node table (%s)",
            push->decoder,
            (status != KVF_OK) ? kvf_strerror(status)
            : !alive           ? "dead"
                               : "no peer address");
        kvf_pd_push_maybe_complete(push);
        return;
    }
    kvf_mesh_node_store(pd->mesh, node_id, push->decoder, data_address);
    kvf_pd_push_begin(push, node_id, data_address);
    kvf_pd_push_maybe_complete(push);
}

/* May @p push go now? When no other push of its request is on its way,
 * or its decoder orders them by piece and this one is within the window
 * of KVF_PD_PIECES_MAX from the first not acknowledged; never before a
 * queued push of a lower piece. */
static bool kvf_pd_push_may_start(kvf_pd_t *pd, const kvf_pd_push_t *push)
{
    const kvf_pd_open_t *open = push->open;
    const kvf_pd_push_t *p;
    uint32_t lowest = push->piece;
    bool is_active  = false;

    TAILQ_FOREACH(p, &open->pushes, in_request) {
        if ((p == push) || (p->state == KVF_PD_PUSH_FINISHED)) {
            continue;
        }
        if ((p->state == KVF_PD_PUSH_QUEUED) && (p->piece < push->piece)) {
            return false;
        }
        is_active = is_active || (p->state != KVF_PD_PUSH_QUEUED);
        lowest    = (p->piece < lowest) ? p->piece : lowest;
    }
    if (!is_active) {
        return true;
    }
    return (push->piece - lowest < KVF_PD_PIECES_MAX) &&
           (open->is_pieces || kvf_pd_node_takes_pieces(pd, push));
}

/* Finds @p push's decoder and starts it (a failure finishes it). */
static void kvf_pd_push_go(kvf_pd_push_t *push)
{
    kvf_pd_t *pd        = push->pd;
    uint32_t decoder_id = 0;
    const char *address;

    push->state = KVF_PD_PUSH_RESOLVE;
    address     = kvf_mesh_node_by_name(pd->mesh, push->decoder, &decoder_id);
    if (address != NULL) {
        kvf_pd_push_begin(push, decoder_id, address);
        return;
    }
    if ((pd->ctl == NULL) || !kvf_ctl_client_is_registered(pd->ctl)) {
        kvf_pd_push_finish(push, KVF_ERR_STATE,
                           "not registered with the controller: cannot find "
                           "decoder %s",
                           push->decoder);
        kvf_pd_tick_arm(pd, 0); /* completes from the loop, never inside */
        return;
    }
    push->pending_ctl++;
    kvf_ctl_client_node_find(pd->ctl, push->decoder, kvf_pd_on_node, push);
}

/* Starts the queued pushes of @p open that may go now, in piece order
 * (its list's order). One that fails at once fails the rest. */
static void kvf_pd_push_start_queued(kvf_pd_t *pd, kvf_pd_open_t *open)
{
    kvf_pd_push_t *p;

    TAILQ_FOREACH(p, &open->pushes, in_request) {
        if (p->state == KVF_PD_PUSH_QUEUED) {
            if (!kvf_pd_push_may_start(pd, p)) {
                return;
            }
            kvf_pd_push_go(p); /* leaves it in the list (completes later) */
        }
    }
}

/* The place the next push of @p args's request takes here: 1 when the
 * request is not open. */
static uint32_t kvf_pd_open_next(kvf_pd_t *pd, const kvf_pd_push_args_t *args)
{
    khiter_t it = kh_get(kvf_pd_opens, &pd->opens, args->request_id);

    return (it != kh_end(&pd->opens)) ? kh_value(&pd->opens, it)->pieces + 1
                                      : 1;
}

/* The open record of @p push's request, made by its first push; NULL
 * when out of memory. */
static kvf_pd_open_t *kvf_pd_open_get(kvf_pd_t *pd, const kvf_pd_push_t *push)
{
    khiter_t it = kh_get(kvf_pd_opens, &pd->opens, push->request_id);
    kvf_pd_open_t *open;
    int ret;

    if (it != kh_end(&pd->opens)) {
        return kh_value(&pd->opens, it);
    }
    open = calloc(1, sizeof(*open));
    if (open == NULL) {
        return NULL;
    }
    it = kh_put(kvf_pd_opens, &pd->opens, push->request_id, &ret);
    if (ret < 0) {
        free(open);
        return NULL;
    }
    open->request_id = push->request_id;
    open->engine     = push->engine;
    open->is_open    = true;
    TAILQ_INIT(&open->pushes);
    kh_value(&pd->opens, it) = open;
    return open;
}

kvf_status_t kvf_pd_push_submit(kvf_pd_t *pd, const kvf_pd_push_args_t *args)
{
    const uint32_t num = args->num;
    kvf_pd_push_t *push;
    kvf_pd_open_t *open;
    kvf_status_t status = KVF_OK;
    uint64_t len;
    uint32_t i, moved = 0;
    khiter_t it;
    int ret;

    if ((num == 0) || (num > KVF_PD_MAX_CHUNKS) || (args->decoder == NULL) ||
        (args->decoder[0] == '\0') ||
        (strlen(args->decoder) >= KVF_PD_DECODER_MAX)) {
        status = KVF_ERR_INVALID;
        goto err_put;
    }
    if ((args->piece > 0) && (args->piece != kvf_pd_open_next(pd, args))) {
        /* the engine's earlier pushes of the request are not here (one
         * failed and closed it, or this agent restarted): starting the
         * request with this one would hand the decoder a request with a
         * hole at its start */
        pd->stats.pieces_refused++;
        status = KVF_ERR_CANCELED;
        goto err_put;
    }
    push = calloc(1, sizeof(*push));
    if (push == NULL) {
        status = KVF_ERR_NO_MEMORY;
        goto err_put;
    }
    push->pd        = pd;
    push->offsets   = malloc(num * sizeof(uint64_t));
    push->lengths   = malloc(num * sizeof(uint64_t));
    push->checksums = malloc(num * sizeof(uint64_t));
    push->srcs =
        (args->srcs != NULL) ? malloc(num * sizeof(*push->srcs)) : NULL;
    if ((push->offsets == NULL) || (push->lengths == NULL) ||
        (push->checksums == NULL) ||
        ((args->srcs != NULL) && (push->srcs == NULL)) ||
        (kvf_store_owner_create(pd->store, &push->owner) != KVF_OK)) {
        status = KVF_ERR_NO_MEMORY;
        goto err_free;
    }
    memcpy(push->offsets, args->offsets, num * sizeof(uint64_t));
    memcpy(push->lengths, args->lengths, num * sizeof(uint64_t));
    memcpy(push->checksums, args->checksums, num * sizeof(uint64_t));
    if (args->srcs != NULL) {
        memcpy(push->srcs, args->srcs, num * sizeof(*push->srcs));
    }
    /* the chunks belong to the push while it runs: an engine that goes
     * away cannot free what UCX is still reading */
    for (moved = 0; moved < num; moved++) {
        status = kvf_store_move(pd->store, args->owner, push->owner,
                                push->offsets[moved], &len);
        if (status != KVF_OK) {
            break;
        }
        if ((push->lengths[moved] == 0) || (push->lengths[moved] > len)) {
            moved++;
            status = KVF_ERR_RANGE;
            break;
        }
        push->bytes += push->lengths[moved];
    }
    do { /* random (unguessable), and unique among ours */
        push->ticket = kvf_mesh_random_id(pd->mesh);
    } while (kvf_pd_push_find(pd, push->ticket) != NULL);
    push->request_id  = args->request_id;
    push->from        = args->owner;
    push->cb          = args->cb;
    push->arg         = args->arg;
    push->engine      = args->engine;
    push->num         = num;
    push->is_final    = args->is_final;
    push->start_ns    = kvf_time_now_ns();
    push->deadline_ns = kvf_time_deadline_ns(pd->push_timeout_ns);
    snprintf(push->decoder, sizeof(push->decoder), "%s", args->decoder);
    open = NULL;
    if (status == KVF_OK) {
        open   = kvf_pd_open_get(pd, push);
        status = (open == NULL) ? KVF_ERR_NO_MEMORY : KVF_OK;
    }
    if (status == KVF_OK) {
        it = kh_put(kvf_pd_pushes, &pd->pushes_by_ticket, push->ticket, &ret);
        if (ret < 0) {
            if (open->pieces == 0) {
                kvf_pd_open_close(pd, open); /* made for it */
            }
            status = KVF_ERR_NO_MEMORY;
        }
    }
    if (status != KVF_OK) {
        for (i = 0; i < moved; i++) {
            kvf_store_move(pd->store, push->owner, args->owner,
                           push->offsets[i], &len);
        }
        goto err_free;
    }
    push->src_put                       = args->src_put;
    push->src_arg                       = args->src_arg;
    kh_value(&pd->pushes_by_ticket, it) = push;
    /* pushes of a request are numbered as they come: the decoder keeps
     * their chunks in this order whatever order they land in */
    push->piece     = ++open->pieces;
    push->open      = open;
    open->has_final = open->has_final || push->is_final;
    TAILQ_INSERT_TAIL(&open->pushes, push, in_request);
    LIST_INSERT_HEAD(&pd->pushes, push, link);
    kvf_pd_tick_arm(pd, push->deadline_ns);
    if (!kvf_pd_push_may_start(pd, push)) {
        push->state = KVF_PD_PUSH_QUEUED; /* goes when an earlier one let it */
        pd->stats.queued++;
        return KVF_OK;
    }
    kvf_pd_push_go(push);
    return KVF_OK;

err_free:
    kvf_pd_push_free(push); /* its src_put is not set yet: put below */
err_put:
    if (args->src_put != NULL) {
        args->src_put(args->src_arg);
    }
    return status;
}

uint64_t kvf_pd_tick_sender(kvf_pd_t *pd, uint64_t now)
{
    kvf_pd_push_t *push, *next;
    uint64_t soonest = UINT64_MAX;

    for (push = LIST_FIRST(&pd->pushes); push != NULL; push = next) {
        next = LIST_NEXT(push, link);
        if ((push->state == KVF_PD_PUSH_LINK) && (now >= push->link_until)) {
            /* the link is up (or down), or took too long: PD_ALLOC now */
            if (push->is_link_waiting) {
                kvf_local_region_give_up(pd->local, push);
                push->is_link_waiting = false;
            }
            push->state = KVF_PD_PUSH_RESOLVE;
            kvf_pd_push_send_alloc(push);
        }
        if ((push->state == KVF_PD_PUSH_LINK) && (push->link_until < soonest)) {
            soonest = push->link_until;
        }
        if (push->is_parked && (push->state == KVF_PD_PUSH_DATA) &&
            (now >= push->park_until)) {
            push->is_parked = false;
            kvf_pd_push_send_runs(push);
        }
        if (push->is_parked && (push->state == KVF_PD_PUSH_DATA) &&
            (push->park_until < soonest)) {
            soonest = push->park_until;
        }
        if ((push->state != KVF_PD_PUSH_FINISHED) &&
            (now >= push->deadline_ns)) {
            kvf_pd_push_finish(
                push, KVF_ERR_TIMEOUT,
                "push of PD request %llu to %s timed out after %llu ms",
                (unsigned long long)push->request_id, push->decoder,
                (unsigned long long)(pd->push_timeout_ns / KVF_NSEC_PER_MSEC));
            if ((push->pending_ctl > 0) && (pd->ctl != NULL)) {
                kvf_ctl_client_cancel(pd->ctl, push);
                push->pending_ctl = 0;
            }
            /* operations still in flight end by their own deadline (the
             * push's), so the chunks come back soon after */
        }
        if ((push->state != KVF_PD_PUSH_FINISHED) &&
            (push->deadline_ns < soonest)) {
            soonest = push->deadline_ns;
        }
        /* completes pushes that finished without anything in flight (the
         * rest complete from their last operation's callback) */
        kvf_pd_push_maybe_complete(push);
    }
    return soonest;
}
