/* SPDX-License-Identifier: Apache-2.0 */
/* Copyright (c) 2026 The kvfabric authors */
/*
 * PD decoder side: reservations in the receive region, chunks landing,
 * verification, and the engines that wait for and claim requests
 * (agent/pd.h).
 */
#include "agent/local.h"
#include "agent/pd_int.h"
#include "agent/transports.h"

#include "agent/config.h"

#include "common/log.h"
#include "common/time.h"

#include <kvfabric/gpu.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ====================================================== decoder side == */

kvf_pd_req_t *kvf_pd_req_find(kvf_pd_t *pd, uint64_t id)
{
    khiter_t it = kh_get(kvf_pd_reqs, &pd->reqs_by_id, id);

    return (it == kh_end(&pd->reqs_by_id)) ? NULL
                                           : kh_value(&pd->reqs_by_id, it);
}

size_t kvf_pd_req_ids(kvf_pd_t *pd)
{
    size_t n = kh_size(&pd->reqs_by_id), i = 0;
    kvf_pd_req_t *req;
    uint64_t *ids;

    if (n > pd->scratch_cap) {
        ids = realloc(pd->scratch, n * sizeof(*ids));
        if (ids == NULL) {
            return 0;
        }
        pd->scratch     = ids;
        pd->scratch_cap = n;
    }
    for (req = pd->reqs; (req != NULL) && (i < n); req = req->next) {
        pd->scratch[i++] = req->id;
    }
    return i;
}

static kvf_pd_req_t *kvf_pd_req_create(kvf_pd_t *pd, uint64_t id)
{
    kvf_pd_req_t *req = calloc(1, sizeof(*req));
    khiter_t it;
    int ret;

    if (req == NULL) {
        return NULL;
    }
    it = kh_put(kvf_pd_reqs, &pd->reqs_by_id, id, &ret);
    if (ret <= 0) { /* out of memory (the caller checked it is new) */
        free(req);
        return NULL;
    }
    kh_value(&pd->reqs_by_id, it) = req;
    req->id                       = id;
    req->next_piece               = 1;
    kvf_pd_req_touch(pd, req);
    req->next = pd->reqs;
    if (pd->reqs != NULL) {
        pd->reqs->prev = req;
    }
    pd->reqs = req;
    pd->stats.requests++;
    return req;
}

static void kvf_pd_batch_free(kvf_pd_batch_t *batch)
{
    free(batch->lengths);
    free(batch->offsets);
    free(batch->checksums);
    free(batch->state);
    free(batch->recvs);
    free(batch->iov);
    free(batch);
}

/* Gives the batch's reserved slots back (once no receive writes them). */
static void kvf_pd_batch_unreserve(kvf_pd_t *pd, kvf_pd_batch_t *batch)
{
    uint32_t i;

    if (!batch->is_reserved) {
        return;
    }
    for (i = 0; i < batch->num; i++) {
        kvf_pd_region_free(pd->region, batch->offsets[i], batch->lengths[i]);
    }
    batch->is_reserved = false;
}

static void kvf_pd_queue_remove(kvf_pd_t *pd, kvf_pd_batch_t *batch)
{
    kvf_pd_batch_t **pp;

    if (!batch->is_queued) {
        return;
    }
    pd->queue_tail = NULL;
    for (pp = &pd->queue; *pp != NULL;) {
        if (*pp == batch) {
            *pp = batch->next_queued;
            continue;
        }
        pd->queue_tail = *pp;
        pp             = &(*pp)->next_queued;
    }
    batch->is_queued = false;
    pd->queue_len--;
    pd->stats.queue_depth = pd->queue_len;
}

static void kvf_pd_reply_alloc(kvf_pd_t *pd, kvf_ucx_ep_t *ep,
                               uint64_t request_id, uint64_t ticket,
                               kvf_status_t status, const char *message,
                               const kvf_pd_batch_t *batch)
{
    char text[KVF_PD_MESSAGE_SIZE];
    Kvf__PdAllocReply reply;

    if ((ep == NULL) || kvf_ucx_ep_is_failed(ep)) {
        return;
    }
    snprintf(text, sizeof(text), "%s", message);
    kvf__pd_alloc_reply__init(&reply);
    reply.request_id = request_id;
    reply.ticket     = ticket;
    reply.status     = status;
    reply.message    = text;
    reply.pieces     = pd->takes_pieces; /* several pushes of a request */
    if ((status == KVF_OK) && (batch != NULL)) {
        reply.batch     = batch->id;
        reply.n_offsets = batch->num;
        reply.offsets   = batch->offsets;
        /* several chunks a PD_DATA, scattered over their slots (a GPU
         * region takes one chunk a message, through its registration) */
        reply.multi        = !pd->region_is_device;
        reply.done_implied = batch->is_implied;
    }
    if (kvf_pd_send(pd, ep, KVF_MSG_PD_ALLOC_REPLY, &reply.base, NULL) !=
        KVF_OK) {
        kvf_debug("%s: cannot answer PD_ALLOC of request %llu", pd->name,
                  (unsigned long long)request_id);
    }
}

static void kvf_pd_reply_done(kvf_pd_t *pd, kvf_ucx_ep_t *ep,
                              uint64_t request_id, uint64_t ticket,
                              kvf_status_t status, const char *message)
{
    char text[KVF_PD_MESSAGE_SIZE];
    Kvf__PdDoneReply reply;

    if ((ep == NULL) || kvf_ucx_ep_is_failed(ep)) {
        return;
    }
    snprintf(text, sizeof(text), "%s", message);
    kvf__pd_done_reply__init(&reply);
    reply.request_id = request_id;
    reply.ticket     = ticket;
    reply.status     = status;
    reply.message    = text;
    if (kvf_pd_send(pd, ep, KVF_MSG_PD_DONE_REPLY, &reply.base, NULL) !=
        KVF_OK) {
        kvf_debug("%s: cannot answer PD_DONE of request %llu", pd->name,
                  (unsigned long long)request_id);
    }
}

/* Tells the sender of @p batch how it ended (once): through
 * PD_ALLOC_REPLY while it waits for room, PD_DONE_REPLY after. */
static void kvf_pd_batch_answer(kvf_pd_t *pd, kvf_pd_batch_t *batch,
                                kvf_status_t status, const char *message)
{
    const kvf_pd_req_t *req = batch->req;

    if (batch->is_answered) {
        return;
    }
    batch->is_answered = true;
    if (!batch->is_reserved) {
        kvf_pd_reply_alloc(pd, req->src, req->id, batch->ticket, status,
                           message, NULL);
    } else {
        kvf_pd_reply_done(pd, req->src, req->id, batch->ticket, status,
                          message);
    }
}

/* Room for one more queued ack; false when out of memory. */
static bool kvf_pd_acks_reserve(kvf_pd_t *pd)
{
    size_t cap = (pd->acks_cap == 0) ? 16 : 2 * pd->acks_cap;
    kvf_pd_ack_t *grown;

    if (pd->num_acks < pd->acks_cap) {
        return true;
    }
    grown = realloc(pd->acks, cap * sizeof(*grown));
    if (grown == NULL) {
        return false;
    }
    pd->acks     = grown;
    pd->acks_cap = cap;
    return true;
}

/* Acknowledges a verified push: queued when its sender takes coalesced
 * acks, so that every ack to one endpoint in this pass of the loop goes
 * in one PD_DONE_REPLY (kvf_pd_acks_flush); at once otherwise (a sender
 * that sends PD_DONE, or no memory for the queue). */
static void kvf_pd_ack(kvf_pd_t *pd, const kvf_pd_batch_t *batch)
{
    const kvf_pd_req_t *req = batch->req;
    kvf_pd_ack_t *ack;

    pd->stats.acks++;
    if (!batch->is_implied || !kvf_pd_acks_reserve(pd)) {
        pd->stats.ack_messages++;
        kvf_pd_reply_done(pd, req->src, req->id, batch->ticket, KVF_OK, "");
        return;
    }
    if (pd->num_acks == 0) {
        event_active(pd->ack_ev, EV_TIMEOUT, 0);
    }
    kvf_ucx_ep_hold(req->src);
    ack             = &pd->acks[pd->num_acks++];
    ack->ep         = req->src;
    ack->request_id = req->id;
    ack->ticket     = batch->ticket;
}

static int kvf_pd_ack_cmp(const void *a, const void *b)
{
    uintptr_t x = (uintptr_t)((const kvf_pd_ack_t *)a)->ep;
    uintptr_t y = (uintptr_t)((const kvf_pd_ack_t *)b)->ep;

    return (x > y) - (x < y);
}

void kvf_pd_acks_flush(kvf_pd_t *pd)
{
    Kvf__PdAck items[KVF_PD_ACKS_MAX - 1], *more[KVF_PD_ACKS_MAX - 1];
    Kvf__PdDoneReply reply;
    kvf_ucx_ep_t *ep;
    size_t i, n;

    /* by endpoint, then one message per run of at most KVF_PD_ACKS_MAX */
    qsort(pd->acks, pd->num_acks, sizeof(*pd->acks), kvf_pd_ack_cmp);
    for (i = 0; i < pd->num_acks; i += n) {
        ep = pd->acks[i].ep;
        kvf__pd_done_reply__init(&reply);
        reply.request_id = pd->acks[i].request_id;
        reply.ticket     = pd->acks[i].ticket;
        reply.more       = more;
        for (n = 1; (i + n < pd->num_acks) && (pd->acks[i + n].ep == ep) &&
                    (n < KVF_PD_ACKS_MAX);
             n++) {
            kvf__pd_ack__init(&items[n - 1]);
            items[n - 1].request_id = pd->acks[i + n].request_id;
            items[n - 1].ticket     = pd->acks[i + n].ticket;
            more[n - 1]             = &items[n - 1];
            kvf_ucx_ep_put(ep); /* the message's first ack holds it on */
        }
        reply.n_more = n - 1;
        if (!kvf_ucx_ep_is_failed(ep)) {
            pd->stats.ack_messages++;
            if (kvf_pd_send(pd, ep, KVF_MSG_PD_DONE_REPLY, &reply.base, NULL) !=
                KVF_OK) {
                kvf_debug("%s: cannot acknowledge %zu pushes", pd->name, n);
            }
        }
        kvf_ucx_ep_put(ep);
    }
    pd->num_acks = 0;
}

/* The batch no longer belongs to a live request: free it now, or when its
 * last receive completes. */
static void kvf_pd_batch_drop(kvf_pd_t *pd, kvf_pd_batch_t *batch)
{
    kvf_pd_queue_remove(pd, batch);
    batch->req = NULL;
    if (batch->inflight > 0) {
        return; /* kvf_pd_on_data_recv frees it */
    }
    kvf_pd_batch_unreserve(pd, batch);
    kvf_pd_batch_free(batch);
}

/* Drops every push @p req has in progress (their slots go back). */
static void kvf_pd_req_drop_batches(kvf_pd_t *pd, kvf_pd_req_t *req)
{
    kvf_pd_batch_t *batch;

    while ((batch = req->batches) != NULL) {
        req->batches = batch->next;
        kvf_pd_batch_drop(pd, batch);
    }
    req->num_batches = 0;
}

/* Is a push of @p req waiting for room (its quiet deadline paused)? */
static bool kvf_pd_req_is_queued(const kvf_pd_req_t *req)
{
    const kvf_pd_batch_t *batch;

    for (batch = req->batches; batch != NULL; batch = batch->next) {
        if (batch->is_queued) {
            return true;
        }
    }
    return false;
}

/* Region bytes the sender @p key holds in requests. */
static uint64_t kvf_pd_quota_used(kvf_pd_t *pd, uint64_t key)
{
    khiter_t it = kh_get(kvf_pd_quota, &pd->quota, key);

    return (it == kh_end(&pd->quota)) ? 0 : kh_val(&pd->quota, it);
}

/* Adds @p bytes to, or (@p add false) takes them from, @p req's sender. */
static kvf_status_t kvf_pd_quota_charge(kvf_pd_t *pd, kvf_pd_req_t *req,
                                        uint64_t bytes, bool add)
{
    khiter_t it;
    int ret;

    if ((req->quota_key == 0) || (bytes == 0)) {
        return KVF_OK;
    }
    it = kh_put(kvf_pd_quota, &pd->quota, req->quota_key, &ret);
    if (ret < 0) {
        return KVF_ERR_NO_MEMORY;
    }
    if (ret > 0) {
        kh_val(&pd->quota, it) = 0;
    }
    if (add) {
        kh_val(&pd->quota, it) += bytes;
    } else {
        kh_val(&pd->quota, it) -=
            (bytes < kh_val(&pd->quota, it)) ? bytes : kh_val(&pd->quota, it);
    }
    if (kh_val(&pd->quota, it) == 0) {
        kh_del(kvf_pd_quota, &pd->quota, it);
    }
    return KVF_OK;
}

/* Frees the verified slots of @p req (and its sender's charge). */
static void kvf_pd_req_free_slots(kvf_pd_t *pd, kvf_pd_req_t *req)
{
    uint32_t i;

    for (i = 0; i < req->num; i++) {
        kvf_pd_region_free(pd->region, req->offsets[i], req->lengths[i]);
    }
    kvf_pd_quota_charge(pd, req, req->footprint, false);
    req->num       = 0;
    req->footprint = 0;
}

void kvf_pd_req_unlink(kvf_pd_t *pd, kvf_pd_req_t *req)
{
    khiter_t it = kh_get(kvf_pd_reqs, &pd->reqs_by_id, req->id);

    if (it != kh_end(&pd->reqs_by_id)) {
        kh_del(kvf_pd_reqs, &pd->reqs_by_id, it);
    }
    if (req->prev != NULL) {
        req->prev->next = req->next;
    } else {
        pd->reqs = req->next;
    }
    if (req->next != NULL) {
        req->next->prev = req->prev;
    }
    kvf_pd_req_drop_batches(pd, req);
    kvf_pd_req_free_slots(pd, req);
    kvf_ucx_ep_put(req->src);
    free(req->offsets);
    free(req->lengths);
    free(req->checksums);
    free(req);
    pd->stats.requests--;
}

/* Calls the waiter of @p req (and forgets it). */
static void kvf_pd_req_notify(kvf_pd_t *pd, kvf_pd_req_t *req,
                              kvf_status_t status, const char *message)
{
    kvf_pd_wait_cb_t cb = req->wait_cb;
    void *arg           = req->wait_arg;
    void *engine        = req->wait_engine;
    kvf_slot_t *slots   = NULL;
    uint32_t i;

    if (cb == NULL) {
        return;
    }
    req->wait_cb     = NULL;
    req->wait_arg    = NULL;
    req->wait_engine = NULL;
    if (status == KVF_OK) {
        slots = calloc(req->num + 1, sizeof(*slots));
        if (slots == NULL) {
            cb(arg, KVF_ERR_NO_MEMORY, "agent out of memory", NULL, NULL, 0);
            return;
        }
        for (i = 0; i < req->num; i++) {
            slots[i].offset = pd->region_offset + req->offsets[i];
            slots[i].length = req->lengths[i];
        }
        req->state   = KVF_PD_REQ_CLAIMED;
        req->claimer = engine;
    }
    cb(arg, status, message, slots, (status == KVF_OK) ? req->checksums : NULL,
       (status == KVF_OK) ? req->num : 0);
    free(slots);
}

/*
 * Aborts @p req: its slots go back, every push in progress not answered
 * yet is told (unless the sender itself aborted), its waiter learns
 * KVF_ERR_CANCELED, and a tombstone stays (until claim_timeout) so a later
 * wait learns it too.
 */
void kvf_pd_req_abort(kvf_pd_t *pd, kvf_pd_req_t *req, kvf_status_t reason,
                      bool tell_sender, const char *why)
{
    char message[KVF_PD_MESSAGE_SIZE];
    kvf_pd_batch_t *batch;

    /* damaged data is an alarm (bad memory, a bug), not routine */
    if (reason == KVF_ERR_CHECKSUM) {
        kvf_warn("%s: PD request %llu aborted: %s", pd->name,
                 (unsigned long long)req->id, why);
    } else {
        kvf_info("%s: PD request %llu aborted: %s", pd->name,
                 (unsigned long long)req->id, why);
    }
    pd->stats.aborts++;
    for (batch = req->batches; tell_sender && (batch != NULL);
         batch = batch->next) {
        kvf_pd_batch_answer(pd, batch, reason, why);
    }
    kvf_pd_req_drop_batches(pd, req);
    kvf_pd_req_free_slots(pd, req);
    kvf_ucx_ep_put(req->src);
    req->src    = NULL;
    req->state  = KVF_PD_REQ_ABORTED;
    req->reason = reason;
    kvf_pd_req_touch(pd, req);
    snprintf(message, sizeof(message), "PD request %llu was aborted: %s",
             (unsigned long long)req->id, why);
    kvf_pd_req_notify(pd, req, KVF_ERR_CANCELED, message);
    kvf_pd_queue_pump(pd);
}

/* A reservation got its slots: tell the sender. */
static void kvf_pd_batch_reserved(kvf_pd_t *pd, kvf_pd_batch_t *batch)
{
    kvf_pd_req_t *req = batch->req;

    batch->is_reserved = true;
    kvf_pd_req_touch(pd, req);
    kvf_pd_reply_alloc(pd, req->src, req->id, batch->ticket, KVF_OK, "", batch);
}

/* Serves waiting reservations in FIFO order while they fit. */
void kvf_pd_queue_pump(kvf_pd_t *pd)
{
    kvf_pd_batch_t *batch;

    while ((batch = pd->queue) != NULL) {
        if (kvf_pd_region_alloc(pd->region, batch->lengths, batch->num,
                                batch->offsets) != KVF_OK) {
            break; /* the head waits: nobody overtakes it */
        }
        kvf_pd_queue_remove(pd, batch);
        kvf_pd_batch_reserved(pd, batch);
    }
}

/* May a push of @p req take place @p piece (0: the next, one push at a
 * time) now? KVF_OK, or why not in @p message. */
static kvf_status_t kvf_pd_piece_check(const kvf_pd_req_t *req, uint32_t piece,
                                       bool is_final, char *message,
                                       size_t size)
{
    const kvf_pd_batch_t *batch;

    if (piece == 0) {
        if (req->batches == NULL) {
            return KVF_OK;
        }
        snprintf(message, size,
                 "PD request %llu already has a push in progress",
                 (unsigned long long)req->id);
        return KVF_ERR_BUSY;
    }
    for (batch = req->batches; batch != NULL; batch = batch->next) {
        if (batch->piece == piece) {
            break;
        }
        if (is_final && (batch->piece > piece)) {
            snprintf(message, size,
                     "final piece %u of PD request %llu after piece %u", piece,
                     (unsigned long long)req->id, batch->piece);
            return KVF_ERR_INVALID;
        }
    }
    if ((piece < req->next_piece) || (batch != NULL)) {
        snprintf(message, size, "piece %u of PD request %llu came already",
                 piece, (unsigned long long)req->id);
        return KVF_ERR_EXISTS;
    }
    if ((req->final_piece != 0) && (piece > req->final_piece)) {
        snprintf(message, size,
                 "piece %u of PD request %llu after its final piece %u", piece,
                 (unsigned long long)req->id, req->final_piece);
        return KVF_ERR_INVALID;
    }
    if ((piece - req->next_piece >= KVF_PD_PIECES_MAX) ||
        (req->num_batches >= KVF_PD_PIECES_MAX)) {
        snprintf(message, size,
                 "PD request %llu: piece %u is too far ahead (%u pushes in "
                 "progress, piece %u not arrived; at most %u)",
                 (unsigned long long)req->id, piece, req->num_batches,
                 req->next_piece, KVF_PD_PIECES_MAX);
        return KVF_ERR_BUSY;
    }
    return KVF_OK;
}

/* Links @p batch into @p req's pushes, in piece order. */
static void kvf_pd_req_link_batch(kvf_pd_req_t *req, kvf_pd_batch_t *batch)
{
    kvf_pd_batch_t **pp = &req->batches;

    while ((*pp != NULL) && ((*pp)->piece < batch->piece)) {
        pp = &(*pp)->next;
    }
    batch->next = *pp;
    *pp         = batch;
    req->num_batches++;
}

/* Unlinks @p batch from @p req's pushes. */
static void kvf_pd_req_unlink_batch(kvf_pd_req_t *req, kvf_pd_batch_t *batch)
{
    kvf_pd_batch_t **pp;

    for (pp = &req->batches; *pp != NULL; pp = &(*pp)->next) {
        if (*pp == batch) {
            *pp = batch->next;
            req->num_batches--;
            return;
        }
    }
}

/* PD_ALLOC: reserve slots for one push, or queue, or refuse. */
void kvf_pd_on_alloc(kvf_pd_t *pd, kvf_ucx_ep_t *ep, const Kvf__PdAlloc *m)
{
    char message[KVF_PD_MESSAGE_SIZE];
    kvf_pd_req_t *req;
    kvf_pd_batch_t *batch;
    uint64_t footprint = 0, used;
    uint32_t piece;
    kvf_status_t status;
    size_t i;

    if (kvf_mesh_peer_role(pd->mesh, ep) == KVF_AGENT_ROLE_DECODE) {
        /* only prefill (or both) nodes push */
        kvf_mesh_drop(pd->mesh, KVF_MESH_DROP_UNEXPECTED);
        kvf_pd_reply_alloc(pd, ep, m->request_id, m->ticket, KVF_ERR_AUTH,
                           "PD_ALLOC from a decode-only node", NULL);
        return;
    }
    if ((pd->transports != NULL) &&
        !kvf_transports_check(pd->transports, ep, 0, NULL)) {
        snprintf(message, sizeof(message),
                 "node %s refuses pushes over %s (expect_transports)", pd->name,
                 kvf_transports_last(pd->transports));
        kvf_pd_reply_alloc(pd, ep, m->request_id, m->ticket,
                           KVF_ERR_UNSUPPORTED, message, NULL);
        return;
    }
    if (pd->region == NULL) {
        snprintf(message, sizeof(message),
                 "node %s has no PD receive region (pd_buffer_size 0)",
                 pd->name);
        kvf_pd_reply_alloc(pd, ep, m->request_id, m->ticket,
                           KVF_ERR_UNSUPPORTED, message, NULL);
        return;
    }
    if ((m->n_lengths == 0) || (m->n_lengths > KVF_PD_MAX_CHUNKS)) {
        kvf_pd_reply_alloc(pd, ep, m->request_id, m->ticket, KVF_ERR_INVALID,
                           "a push carries 1..65536 chunks", NULL);
        return;
    }
    if ((m->n_checksums != 0) && (m->n_checksums != m->n_lengths)) {
        kvf_pd_reply_alloc(pd, ep, m->request_id, m->ticket, KVF_ERR_INVALID,
                           "PD_ALLOC carries one checksum per chunk or none",
                           NULL);
        return;
    }
    for (i = 0; i < m->n_lengths; i++) {
        if (m->lengths[i] == 0) {
            kvf_pd_reply_alloc(pd, ep, m->request_id, m->ticket,
                               KVF_ERR_INVALID, "a chunk of 0 bytes", NULL);
            return;
        }
        footprint += kvf_pd_region_footprint(m->lengths[i]);
    }
    used = kvf_pd_quota_used(pd, (uintptr_t)ep);
    if ((pd->peer_max_bytes > 0) && ((used >= pd->peer_max_bytes) ||
                                     (footprint > pd->peer_max_bytes - used))) {
        /* refused like a duplicate: no request is touched */
        pd->stats.quota_refusals++;
        snprintf(message, sizeof(message),
                 "this sender holds %llu bytes of the receive region of %.60s "
                 "and may hold %llu (pd_peer_max_bytes)",
                 (unsigned long long)used, pd->name,
                 (unsigned long long)pd->peer_max_bytes);
        kvf_pd_reply_alloc(pd, ep, m->request_id, m->ticket, KVF_ERR_BUSY,
                           message, NULL);
        return;
    }
    req = kvf_pd_req_find(pd, m->request_id);
    if ((req == NULL) && pd->is_draining) {
        snprintf(message, sizeof(message),
                 "decoder %.60s is draining: push to another decoder, or "
                 "'kvfctl undrain %.60s'",
                 pd->name, pd->name);
        kvf_pd_reply_alloc(pd, ep, m->request_id, m->ticket, KVF_ERR_STATE,
                           message, NULL);
        return;
    }
    if (req == NULL) {
        req = kvf_pd_req_create(pd, m->request_id);
        if (req == NULL) {
            kvf_pd_reply_alloc(pd, ep, m->request_id, m->ticket,
                               KVF_ERR_NO_MEMORY, "decoder out of memory",
                               NULL);
            return;
        }
    }
    /* pd_pieces off: a piece is not looked at, as by an older decoder */
    piece  = pd->takes_pieces ? m->piece : 0;
    status = KVF_OK;
    switch (req->state) {
    case KVF_PD_REQ_WAITING:
        status =
            kvf_pd_piece_check(req, piece, m->final, message, sizeof(message));
        break;
    case KVF_PD_REQ_RECEIVING:
        if (req->src != ep) {
            status = KVF_ERR_EXISTS;
            snprintf(message, sizeof(message),
                     "PD request %llu is being pushed by another sender",
                     (unsigned long long)m->request_id);
        } else {
            status = kvf_pd_piece_check(req, piece, m->final, message,
                                        sizeof(message));
        }
        break;
    case KVF_PD_REQ_ABORTED:
        status = KVF_ERR_CANCELED;
        snprintf(message, sizeof(message), "PD request %llu was aborted",
                 (unsigned long long)m->request_id);
        break;
    default:
        status = KVF_ERR_EXISTS;
        snprintf(message, sizeof(message),
                 "PD request %llu was already delivered to %s",
                 (unsigned long long)m->request_id, pd->name);
        break;
    }
    if (status != KVF_OK) {
        /* a duplicate never touches the request it collides with */
        kvf_pd_reply_alloc(pd, ep, m->request_id, m->ticket, status, message,
                           NULL);
        return;
    }
    if (req->src == NULL) {
        kvf_ucx_ep_hold(ep);
        req->src = ep;
    }
    req->state = KVF_PD_REQ_RECEIVING;
    kvf_pd_req_touch(pd, req);
    if (footprint > kvf_pd_region_size(pd->region) - req->footprint) {
        snprintf(message, sizeof(message),
                 "PD request %llu needs %llu bytes; the receive region of %s "
                 "holds %llu",
                 (unsigned long long)m->request_id,
                 (unsigned long long)(req->footprint + footprint), pd->name,
                 (unsigned long long)kvf_pd_region_size(pd->region));
        kvf_pd_reply_alloc(pd, ep, m->request_id, m->ticket, KVF_ERR_TOO_BIG,
                           message, NULL);
        kvf_pd_req_abort(pd, req, KVF_ERR_TOO_BIG, true, message);
        return;
    }
    batch = calloc(1, sizeof(*batch));
    if (batch != NULL) {
        batch->lengths = malloc(m->n_lengths * sizeof(uint64_t));
        batch->offsets = calloc(m->n_lengths, sizeof(uint64_t));
        batch->state   = calloc(m->n_lengths, 1);
        batch->recvs   = calloc(m->n_lengths, sizeof(kvf_pd_recv_t));
        batch->iov     = calloc(m->n_lengths, sizeof(kvf_ucx_iov_t));
        if (m->n_checksums > 0) {
            batch->checksums = malloc(m->n_lengths * sizeof(uint64_t));
        }
    }
    if ((batch == NULL) || (batch->lengths == NULL) ||
        (batch->offsets == NULL) || (batch->state == NULL) ||
        (batch->recvs == NULL) || (batch->iov == NULL) ||
        ((m->n_checksums > 0) && (batch->checksums == NULL))) {
        if (batch != NULL) {
            kvf_pd_batch_free(batch);
        }
        kvf_pd_reply_alloc(pd, ep, m->request_id, m->ticket, KVF_ERR_NO_MEMORY,
                           "decoder out of memory", NULL);
        return;
    }
    memcpy(batch->lengths, m->lengths, m->n_lengths * sizeof(uint64_t));
    if (m->n_checksums > 0) {
        memcpy(batch->checksums, m->checksums,
               m->n_checksums * sizeof(uint64_t));
    }
    /* no PD_DONE: the checksums the batch is verified against are here */
    batch->is_implied = m->done_implied && (m->n_checksums > 0);
    batch->num        = (uint32_t)m->n_lengths;
    batch->id         = ++pd->next_batch;
    batch->ticket     = m->ticket;
    batch->is_final   = m->final;
    batch->piece      = (piece > 0) ? piece : req->next_piece;
    batch->req        = req;
    if (req->quota_key == 0) {
        req->quota_key = (uintptr_t)ep;
    }
    if (kvf_pd_quota_charge(pd, req, footprint, true) != KVF_OK) {
        kvf_pd_batch_free(batch);
        kvf_pd_reply_alloc(pd, ep, m->request_id, m->ticket, KVF_ERR_NO_MEMORY,
                           "decoder out of memory", NULL);
        return;
    }
    req->footprint += footprint;
    if (req->batches != NULL) {
        pd->stats.overlapped++;
    }
    kvf_pd_req_link_batch(req, batch);
    if (batch->is_final) {
        req->final_piece = batch->piece;
    }
    if ((pd->queue == NULL) &&
        (kvf_pd_region_alloc(pd->region, batch->lengths, batch->num,
                             batch->offsets) == KVF_OK)) {
        kvf_pd_batch_reserved(pd, batch);
        return;
    }
    if (pd->queue_len >= pd->queue_max) {
        snprintf(message, sizeof(message),
                 "receive region of %s is full and %u pushes already wait",
                 pd->name, pd->queue_len);
        kvf_pd_req_abort(pd, req, KVF_ERR_BUSY, true, message);
        return;
    }
    /* backpressure: wait for room, first come first served */
    batch->is_queued   = true;
    batch->deadline_ns = kvf_time_deadline_ns(pd->alloc_timeout_ns);
    if (pd->queue_tail != NULL) {
        pd->queue_tail->next_queued = batch;
    } else {
        pd->queue = batch;
    }
    pd->queue_tail = batch;
    pd->queue_len++;
    pd->stats.queue_depth = pd->queue_len;
    pd->stats.alloc_waits++;
    kvf_pd_tick_arm(pd, batch->deadline_ns);
}

/* Recomputes every chunk's checksum where it landed. */
static kvf_status_t kvf_pd_batch_verify(kvf_pd_t *pd, kvf_pd_batch_t *batch,
                                        uint32_t *bad_p)
{
    const uint8_t *bytes;
    uint32_t i;

    if (batch->is_bad) {
        *bad_p = batch->bad;
        return KVF_ERR_CHECKSUM;
    }
    for (i = 0; i < batch->num; i++) {
        if (batch->state[i] == 2) {
            continue; /* verified as it landed */
        }
        bytes = pd->region_base + batch->offsets[i];
        if (pd->region_is_device) {
            if ((batch->lengths[i] > pd->bounce_len) ||
                (kvf_gpu_memcpy(pd->bounce, bytes, batch->lengths[i]) !=
                 KVF_OK)) {
                *bad_p = i;
                return KVF_ERR_IO;
            }
            bytes = pd->bounce;
        }
        if (kvf_chunk_checksum(bytes, batch->lengths[i]) !=
            batch->checksums[i]) {
            *bad_p = i;
            return KVF_ERR_CHECKSUM;
        }
    }
    return KVF_OK;
}

/* Room in @p req's arrays for @p more chunks; false when out of memory. */
static bool kvf_pd_req_reserve(kvf_pd_req_t *req, uint32_t more)
{
    uint64_t *grown_o, *grown_l, *grown_c;
    uint32_t cap;

    if (req->num + more <= req->cap) {
        return true;
    }
    cap = (req->cap == 0) ? 16 : req->cap;
    while (cap < req->num + more) {
        cap *= 2;
    }
    grown_o = realloc(req->offsets, cap * sizeof(uint64_t));
    if (grown_o != NULL) {
        req->offsets = grown_o;
    }
    grown_l = realloc(req->lengths, cap * sizeof(uint64_t));
    if (grown_l != NULL) {
        req->lengths = grown_l;
    }
    grown_c = realloc(req->checksums, cap * sizeof(uint64_t));
    if (grown_c != NULL) {
        req->checksums = grown_c;
    }
    if ((grown_o == NULL) || (grown_l == NULL) || (grown_c == NULL)) {
        return false;
    }
    req->cap = cap;
    return true;
}

/* Moves the slots of verified pushes that are next in piece order to
 * @p req (room reserved when they were verified); the final one makes it
 * ready. */
static void kvf_pd_req_advance(kvf_pd_t *pd, kvf_pd_req_t *req)
{
    kvf_pd_batch_t *batch;
    uint32_t i;

    while (((batch = req->batches) != NULL) && batch->is_verified &&
           (batch->piece == req->next_piece)) {
        for (i = 0; i < batch->num; i++) {
            req->offsets[req->num + i]   = batch->offsets[i];
            req->lengths[req->num + i]   = batch->lengths[i];
            req->checksums[req->num + i] = batch->checksums[i];
        }
        req->num += batch->num;
        req->next_piece++;
        kvf_pd_req_unlink_batch(req, batch);
        batch->is_reserved = false; /* the slots are the request's now */
        if (batch->is_final) {
            req->state = KVF_PD_REQ_READY;
            kvf_ucx_ep_put(req->src);
            req->src = NULL;
            pd->stats.requests_ready++;
            kvf_pd_batch_free(batch);
            kvf_pd_req_notify(pd, req, KVF_OK, "");
            return;
        }
        kvf_pd_batch_free(batch);
    }
}

/* PD_DONE arrived (or, done implied, every chunk landed or one failed)
 * and every receive finished: verify, acknowledge, keep in piece order. */
static void kvf_pd_batch_try_complete(kvf_pd_t *pd, kvf_pd_batch_t *batch)
{
    char message[KVF_PD_MESSAGE_SIZE];
    kvf_pd_req_t *req = batch->req;
    const kvf_pd_batch_t *b;
    kvf_status_t status;
    uint32_t i, bad = 0, held = 0;

    if ((batch->inflight > 0) || batch->is_verified) {
        return;
    }
    if (batch->is_implied && !batch->is_done &&
        ((batch->landed == batch->num) || batch->is_failed)) {
        batch->is_done = true; /* what PD_DONE would have said */
        pd->stats.implied_done++;
    }
    if (!batch->is_done) {
        return;
    }
    status = KVF_ERR_TRANSPORT;
    if (batch->landed == batch->num) {
        status = kvf_pd_batch_verify(pd, batch, &bad);
    }
    if (status != KVF_OK) {
        if (status == KVF_ERR_CHECKSUM) {
            pd->stats.checksum_failures++;
            snprintf(message, sizeof(message),
                     "chunk %u of a push of PD request %llu failed its "
                     "checksum at %s",
                     bad, (unsigned long long)req->id, pd->name);
        } else {
            snprintf(message, sizeof(message),
                     "%u of %u chunks of a push of PD request %llu did not "
                     "arrive at %s",
                     batch->num - batch->landed, batch->num,
                     (unsigned long long)req->id, pd->name);
        }
        kvf_pd_req_abort(pd, req, status, true, message);
        return;
    }
    /* room for every verified chunk now, so that keeping them in order
     * later cannot fail after they were acknowledged */
    for (b = req->batches; b != NULL; b = b->next) {
        held += b->is_verified ? b->num : 0;
    }
    if (!kvf_pd_req_reserve(req, held + batch->num)) {
        kvf_pd_req_abort(pd, req, KVF_ERR_NO_MEMORY, true,
                         "decoder out of memory");
        return;
    }
    for (i = 0; i < batch->num; i++) {
        pd->stats.bytes_received += batch->lengths[i];
    }
    batch->is_verified = true;
    batch->is_answered = true;
    kvf_pd_req_touch(pd, req);
    pd->stats.batches_received++;
    kvf_pd_ack(pd, batch);
    if (batch->piece != req->next_piece) {
        pd->stats.reordered++; /* an earlier piece is still on its way */
        return;
    }
    kvf_pd_req_advance(pd, req);
}

/* The batch @p id of request @p request_id, or NULL. */
static kvf_pd_batch_t *kvf_pd_batch_find(kvf_pd_t *pd, uint64_t request_id,
                                         uint64_t id)
{
    kvf_pd_req_t *req = kvf_pd_req_find(pd, request_id);
    kvf_pd_batch_t *batch;

    for (batch = (req != NULL) ? req->batches : NULL; batch != NULL;
         batch = batch->next) {
        if (batch->id == id) {
            return batch;
        }
    }
    return NULL;
}

void kvf_pd_on_done(kvf_pd_t *pd, kvf_ucx_ep_t *ep, const Kvf__PdDone *m)
{
    kvf_pd_batch_t *batch = kvf_pd_batch_find(pd, m->request_id, m->batch);

    if ((batch == NULL) || (batch->req->src != ep) || !batch->is_reserved ||
        batch->is_done) {
        kvf_pd_reply_done(pd, ep, m->request_id, m->ticket, KVF_ERR_NOT_FOUND,
                          "no such push in progress at the decoder");
        return;
    }
    if (batch->is_implied) {
        /* the sender asked for none; the push goes on without it */
        kvf_mesh_drop(pd->mesh, KVF_MESH_DROP_UNEXPECTED);
        return;
    }
    if (m->n_checksums != batch->num) {
        kvf_pd_batch_answer(pd, batch, KVF_ERR_INVALID,
                            "PD_DONE needs one checksum per chunk");
        kvf_pd_req_abort(pd, batch->req, KVF_ERR_PROTO, true, "bad PD_DONE");
        return;
    }
    if (m->final && !batch->is_final && (batch->next != NULL)) {
        kvf_pd_batch_answer(pd, batch, KVF_ERR_INVALID,
                            "PD_DONE says final; a later piece was pushed");
        kvf_pd_req_abort(pd, batch->req, KVF_ERR_PROTO, true, "bad PD_DONE");
        return;
    }
    if (batch->checksums != NULL) {
        /* PD_ALLOC named them: the chunks are checked against those */
        if (memcmp(batch->checksums, m->checksums,
                   batch->num * sizeof(uint64_t)) != 0) {
            kvf_pd_batch_answer(pd, batch, KVF_ERR_INVALID,
                                "PD_DONE checksums differ from PD_ALLOC's");
            kvf_pd_req_abort(pd, batch->req, KVF_ERR_PROTO, true,
                             "bad PD_DONE");
            return;
        }
    } else {
        batch->checksums = malloc(batch->num * sizeof(uint64_t));
        if (batch->checksums == NULL) {
            kvf_pd_req_abort(pd, batch->req, KVF_ERR_NO_MEMORY, true,
                             "decoder out of memory");
            return;
        }
        memcpy(batch->checksums, m->checksums, batch->num * sizeof(uint64_t));
    }
    batch->is_done = true;
    if (m->final && !batch->is_final) {
        batch->is_final         = true; /* an old sender may say so here */
        batch->req->final_piece = batch->piece;
    }
    kvf_pd_batch_try_complete(pd, batch);
}

void kvf_pd_on_abort(kvf_pd_t *pd, kvf_ucx_ep_t *ep, const Kvf__PdAbort *m)
{
    kvf_pd_req_t *req = kvf_pd_req_find(pd, m->request_id);
    char why[KVF_PD_MESSAGE_SIZE];

    /* only the request's own sender may abort it */
    if ((req == NULL) || (req->state != KVF_PD_REQ_RECEIVING) ||
        (req->src != ep)) {
        return;
    }
    snprintf(why, sizeof(why), "the prefill side gave up (%s)",
             kvf_strerror((kvf_status_t)m->reason));
    kvf_pd_req_abort(pd, req, KVF_ERR_CANCELED, false, why);
}

static void kvf_pd_on_data_recv(kvf_status_t status, void *arg);

/* May the sender on @p ep write our host region on this host (PD_DATA
 * copied)? Only an agent we passed the region to, by the node id the mesh
 * proved (any such agent when auth is off). */
static bool kvf_pd_may_copy(kvf_pd_t *pd, kvf_ucx_ep_t *ep)
{
    uint32_t from = kvf_mesh_peer_id(pd->mesh, ep);

    return (pd->local != NULL) && !pd->region_is_device &&
           (!kvf_mesh_is_secure(pd->mesh) || (from != 0)) &&
           kvf_local_region_granted(pd->local, from);
}

kvf_status_t kvf_pd_on_data(void *arg, const void *header, size_t header_len,
                            const kvf_ucx_am_msg_t *msg)
{
    kvf_pd_t *pd = arg;
    const Kvf__PdData *m;
    kvf_pd_batch_t *batch;
    static const uint16_t types[] = {KVF_MSG_PD_DATA};
    kvf_pd_recv_t *recv           = NULL;
    kvf_frame_t frame;
    kvf_status_t status, ret = KVF_OK;
    uint64_t total = 0;
    uint32_t count, k = 0;

    if (!kvf_mesh_accept(pd->mesh, msg) ||
        (kvf_mesh_decode(pd->mesh, header, header_len, KVF_PD_HDR_MAX, types, 1,
                         "PD_DATA header", &frame) != KVF_OK)) {
        return KVF_OK;
    }
    m     = (const Kvf__PdData *)frame.msg;
    batch = kvf_pd_batch_find(pd, m->request_id, m->batch);
    count = (m->count > 1) ? m->count : 1;
    /* only the sender of the batch, only reserved slots, once, and
     * exactly the bytes reserved: anything else is declined; "copied"
     * (no payload: the chunks are in their slots already) only from a
     * same-host agent this decoder passed its host region to */
    if ((batch != NULL) && (batch->req->src == msg->reply_ep) &&
        batch->is_reserved && !batch->is_done && (m->index < batch->num) &&
        (count <= batch->num - m->index) &&
        (m->copied ? kvf_pd_may_copy(pd, msg->reply_ep)
                   : ((count <= KVF_UCX_IOV_MAX) &&
                      ((count == 1) || !pd->region_is_device)))) {
        for (k = 0; k < count; k++) {
            if ((batch->state[m->index + k] != 0) ||
                (batch->lengths[m->index + k] > m->length - total)) {
                break;
            }
            total += batch->lengths[m->index + k];
        }
    }
    if ((k < count) || (total != m->length) ||
        (msg->length != (m->copied ? 0 : m->length))) {
        kvf_mesh_drop(pd->mesh, KVF_MESH_DROP_UNEXPECTED);
        kvf_debug("%s: unexpected PD_DATA for request %llu; declined", pd->name,
                  (unsigned long long)m->request_id);
        goto out;
    }
    recv        = &batch->recvs[m->index];
    recv->pd    = pd;
    recv->batch = batch;
    recv->index = m->index;
    recv->count = count;
    if (m->copied) {
        /* landed already: verified now, while the next are copied */
        if (batch->landed == 0) {
            pd->stats.copied_batches++;
        }
        for (k = 0; k < count; k++) {
            batch->state[m->index + k] = 1;
        }
        batch->inflight++;
        kvf_pd_on_data_recv(KVF_OK, recv);
        goto out;
    }
    if (count == 1) {
        status = kvf_ucx_am_recv_data(
            msg, pd->region_base + batch->offsets[m->index], m->length,
            pd->region_mem, pd->push_timeout_ns, kvf_pd_on_data_recv, recv);
    } else {
        for (k = 0; k < count; k++) {
            batch->iov[m->index + k].buf =
                pd->region_base + batch->offsets[m->index + k];
            batch->iov[m->index + k].len = batch->lengths[m->index + k];
        }
        status = kvf_ucx_am_recv_data_iov(msg, &batch->iov[m->index], count,
                                          pd->push_timeout_ns,
                                          kvf_pd_on_data_recv, recv);
    }
    if (status != KVF_OK) {
        batch->is_failed = true;
        kvf_pd_batch_try_complete(pd, batch); /* done implied: fails now */
        goto out;
    }
    for (k = 0; k < count; k++) {
        batch->state[m->index + k] = 1;
    }
    batch->inflight++;
    if (count > 1) {
        pd->stats.multi_messages++;
    } else {
        pd->stats.data_messages++;
    }
    ret = msg->is_rndv ? KVF_INPROGRESS : KVF_OK;

out:
    kvf_frame_release(&frame, NULL);
    return ret;
}

static void kvf_pd_on_data_recv(kvf_status_t status, void *arg)
{
    kvf_pd_recv_t *recv   = arg;
    kvf_pd_t *pd          = recv->pd;
    kvf_pd_batch_t *batch = recv->batch;
    uint32_t index, end = recv->index + recv->count;

    batch->inflight--;
    if (batch->req == NULL) {
        /* its request went meanwhile: the slots go once nothing writes */
        if (batch->inflight == 0) {
            kvf_pd_batch_unreserve(pd, batch);
            kvf_pd_batch_free(batch);
            kvf_pd_queue_pump(pd);
        }
        return;
    }
    if (status == KVF_OK) {
        for (index = recv->index; index < end; index++) {
            batch->landed++;
            /* with the checksums from PD_ALLOC, check this chunk now,
             * while the next ones are still on the wire (host region only:
             * a device region is checked through its bounce buffer at
             * PD_DONE) */
            if ((batch->checksums == NULL) || pd->region_is_device ||
                batch->is_bad) {
                continue;
            }
            if (kvf_chunk_checksum(pd->region_base + batch->offsets[index],
                                   batch->lengths[index]) ==
                batch->checksums[index]) {
                batch->state[index] = 2;
            } else {
                batch->is_bad = true;
                batch->bad    = index;
            }
        }
    } else {
        batch->is_failed = true;
    }
    kvf_pd_req_touch(pd, batch->req);
    kvf_pd_batch_try_complete(pd, batch);
}

void kvf_pd_wait_submit(kvf_pd_t *pd, void *engine, uint64_t request_id,
                        uint64_t timeout_ns, kvf_pd_wait_cb_t cb, void *arg)
{
    char message[KVF_PD_MESSAGE_SIZE];
    kvf_pd_req_t *req;

    if (pd->region == NULL) {
        snprintf(message, sizeof(message),
                 "agent %s has no PD receive region (pd_buffer_size 0)",
                 pd->name);
        cb(arg, KVF_ERR_UNSUPPORTED, message, NULL, NULL, 0);
        return;
    }
    req = kvf_pd_req_find(pd, request_id);
    if (req == NULL) {
        /* the engine came first: the push will find this record */
        req = kvf_pd_req_create(pd, request_id);
        if (req == NULL) {
            cb(arg, KVF_ERR_NO_MEMORY, "agent out of memory", NULL, NULL, 0);
            return;
        }
        req->state = KVF_PD_REQ_WAITING;
    }
    if ((req->wait_cb != NULL) ||
        ((req->state == KVF_PD_REQ_CLAIMED) && (req->claimer != engine))) {
        snprintf(message, sizeof(message),
                 "PD request %llu is %s by another engine",
                 (unsigned long long)request_id,
                 (req->wait_cb != NULL) ? "waited for" : "claimed");
        cb(arg, KVF_ERR_BUSY, message, NULL, NULL, 0);
        return;
    }
    req->wait_cb          = cb;
    req->wait_arg         = arg;
    req->wait_engine      = engine;
    req->wait_deadline_ns = kvf_time_deadline_ns(
        (timeout_ns > 0) ? timeout_ns : pd->wait_timeout_ns);
    switch (req->state) {
    case KVF_PD_REQ_READY:
    case KVF_PD_REQ_CLAIMED:
        kvf_pd_req_notify(pd, req, KVF_OK, "");
        break;
    case KVF_PD_REQ_ABORTED:
        snprintf(message, sizeof(message), "PD request %llu was aborted (%s)",
                 (unsigned long long)request_id, kvf_strerror(req->reason));
        kvf_pd_req_notify(pd, req, KVF_ERR_CANCELED, message);
        kvf_pd_req_unlink(pd, req); /* the tombstone was read */
        break;
    default:
        kvf_pd_tick_arm(pd, req->wait_deadline_ns);
        break;
    }
}

kvf_status_t kvf_pd_request_release(kvf_pd_t *pd, void *engine,
                                    uint64_t request_id)
{
    kvf_pd_req_t *req = kvf_pd_req_find(pd, request_id);

    if ((req == NULL) || (req->state == KVF_PD_REQ_WAITING)) {
        return KVF_ERR_NOT_FOUND;
    }
    if ((req->state == KVF_PD_REQ_CLAIMED) && (req->claimer != engine)) {
        return KVF_ERR_BUSY;
    }
    if (req->state == KVF_PD_REQ_RECEIVING) {
        kvf_pd_req_abort(pd, req, KVF_ERR_CANCELED, true,
                         "the decode engine released it before it arrived");
    }
    kvf_pd_req_notify(pd, req, KVF_ERR_CANCELED, "released");
    kvf_pd_req_unlink(pd, req);
    kvf_pd_queue_pump(pd);
    return KVF_OK;
}

/* The nearest deadline of what the decoder side holds (UINT64_MAX: none):
 * reservations waiting for room, waits, quiet senders, unclaimed requests
 * and the tombstones of aborted ones. */
static uint64_t kvf_pd_decoder_next(const kvf_pd_t *pd)
{
    uint64_t soonest = UINT64_MAX, d;
    const kvf_pd_batch_t *batch;
    const kvf_pd_req_t *req;

    for (batch = pd->queue; batch != NULL; batch = batch->next_queued) {
        soonest = (batch->deadline_ns < soonest) ? batch->deadline_ns : soonest;
    }
    for (req = pd->reqs; req != NULL; req = req->next) {
        d = UINT64_MAX;
        if (req->wait_cb != NULL) {
            d = req->wait_deadline_ns;
        }
        if ((req->state == KVF_PD_REQ_RECEIVING) &&
            !kvf_pd_req_is_queued(req) &&
            (req->touched_ns + pd->push_timeout_ns < d)) {
            d = req->touched_ns + pd->push_timeout_ns;
        }
        if (((req->state == KVF_PD_REQ_READY) ||
             ((req->state == KVF_PD_REQ_ABORTED) && (req->wait_cb == NULL))) &&
            (req->touched_ns + pd->claim_timeout_ns < d)) {
            d = req->touched_ns + pd->claim_timeout_ns;
        }
        soonest = (d < soonest) ? d : soonest;
    }
    return soonest;
}

/* Deadlines of the decoder side. */
uint64_t kvf_pd_tick_decoder(kvf_pd_t *pd, uint64_t now)
{
    char message[KVF_PD_MESSAGE_SIZE];
    kvf_pd_batch_t *batch;
    kvf_pd_req_t *req;
    size_t n, i;

    /* the queue is FIFO but deadlines are per reservation */
    for (batch = pd->queue; batch != NULL;) {
        kvf_pd_batch_t *after = batch->next_queued;

        if (now >= batch->deadline_ns) {
            pd->stats.alloc_timeouts++;
            snprintf(
                message, sizeof(message),
                "receive region of %.64s stayed full for %llu ms (%u "
                "pushes queued): no room for PD request %llu",
                pd->name,
                (unsigned long long)(pd->alloc_timeout_ns / KVF_NSEC_PER_MSEC),
                pd->queue_len, (unsigned long long)batch->req->id);
            kvf_pd_req_abort(pd, batch->req, KVF_ERR_TIMEOUT, true, message);
            after = pd->queue; /* the queue changed: start over */
        }
        batch = after;
    }
    /* by id: an action may unlink other requests (aborts pump the queue,
     * waiters release theirs), and a pass never starts over */
    n = kvf_pd_req_ids(pd);
    for (i = 0; i < n; i++) {
        req = kvf_pd_req_find(pd, pd->scratch[i]);
        if (req == NULL) {
            continue;
        }
        if ((req->wait_cb != NULL) && (now >= req->wait_deadline_ns)) {
            snprintf(message, sizeof(message),
                     "PD request %llu did not arrive in time",
                     (unsigned long long)req->id);
            kvf_pd_req_notify(pd, req, KVF_ERR_TIMEOUT, message);
            if (req->state == KVF_PD_REQ_WAITING) {
                kvf_pd_req_unlink(pd, req);
                continue;
            }
        }
        if ((req->state == KVF_PD_REQ_RECEIVING) &&
            !kvf_pd_req_is_queued(req) &&
            (now >= req->touched_ns + pd->push_timeout_ns)) {
            /* the sender went quiet (died mid-push): take the slots back */
            kvf_pd_req_abort(pd, req, KVF_ERR_TIMEOUT, true,
                             "the prefill side went quiet");
            continue;
        }
        if ((req->state == KVF_PD_REQ_READY) &&
            (now >= req->touched_ns + pd->claim_timeout_ns)) {
            kvf_info("%s: PD request %llu never claimed; reclaimed", pd->name,
                     (unsigned long long)req->id);
            pd->stats.reclaimed++;
            kvf_pd_req_unlink(pd, req);
            kvf_pd_queue_pump(pd);
            continue;
        }
        if ((req->state == KVF_PD_REQ_ABORTED) && (req->wait_cb == NULL) &&
            (now >= req->touched_ns + pd->claim_timeout_ns)) {
            kvf_pd_req_unlink(pd, req);
        }
    }
    return kvf_pd_decoder_next(pd);
}
