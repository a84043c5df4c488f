/* SPDX-License-Identifier: Apache-2.0 */
/* Copyright (c) 2026 The kvfabric authors */
#include "agent/pd.h"

#include "agent/pd_region.h"
#include "common/log.h"
#include "common/time.h"
#include "proto/frame.h"

#include <kvfabric/gpu.h>

#include <event2/event.h>

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Active-message ids (peer.c uses 1 and 2). */
enum {
    KVF_PD_AM_CTRL = 3, /* payload: one PD_* frame (eager) */
    KVF_PD_AM_DATA = 4, /* header: PD_DATA frame; payload: the chunk */
};

#define KVF_PD_MAX_CHUNKS   65536u /* chunks in one push */
#define KVF_PD_HDR_MAX      256u
#define KVF_PD_DECODER_MAX  128u /* bytes of a decoder name, with the NUL */
#define KVF_PD_NODE_CACHE   32
#define KVF_PD_TICK_US      10000
#define KVF_PD_MESSAGE_SIZE 256

/* ---------------------------------------------------------- structures */

typedef struct kvf_pd_req kvf_pd_req_t;
typedef struct kvf_pd_batch kvf_pd_batch_t;

/* Where a chunk being received lands: the batch and its index (one per
 * chunk, made with the batch: nothing is allocated per chunk). */
typedef struct kvf_pd_recv {
    kvf_pd_t *pd;
    kvf_pd_batch_t *batch;
    uint32_t index;
} kvf_pd_recv_t;

/* One push as the decoder sees it: a reservation of slots, then their
 * data, then PD_DONE. The batch outlives every receive into it. */
struct kvf_pd_batch {
    struct kvf_pd_batch *next_queued; /* pd->queue, while waiting for room */
    kvf_pd_req_t *req;                /* NULL once its request went */
    uint64_t id;
    uint64_t ticket; /* the sender's push id */
    uint64_t deadline_ns;
    uint32_t num;
    uint32_t landed;   /* chunks received */
    uint32_t inflight; /* receives in flight */
    bool is_reserved;
    bool is_queued;
    bool is_done;   /* PD_DONE arrived */
    bool is_failed; /* a chunk could not be received */
    bool is_final;
    uint64_t *lengths;
    uint64_t *offsets;    /* region offsets, once reserved */
    uint64_t *checksums;  /* from PD_ALLOC or PD_DONE */
    uint8_t *state;       /* per chunk: 0 waiting, 1 receiving, 2 verified */
    kvf_pd_recv_t *recvs; /* per chunk: the receive completion's argument */
    bool is_bad;          /* a chunk failed its checksum as it landed */
    uint32_t bad;         /* which one */
};

typedef enum {
    KVF_PD_REQ_WAITING = 0, /* an engine waits; nothing pushed yet */
    KVF_PD_REQ_RECEIVING,   /* pushes arriving */
    KVF_PD_REQ_READY,       /* final push verified, not claimed */
    KVF_PD_REQ_CLAIMED,     /* handed to an engine by kvf_pd_wait */
    KVF_PD_REQ_ABORTED,     /* kept so a waiter learns why */
} kvf_pd_req_state_t;

struct kvf_pd_req {
    kvf_pd_req_t *next;
    uint64_t id;
    kvf_pd_req_state_t state;
    kvf_ucx_ep_t *src; /* held: the sender's endpoint */
    uint64_t touched_ns;
    uint64_t footprint; /* region bytes held, the batch's included */
    uint64_t *offsets;  /* verified chunks, in order */
    uint64_t *lengths;
    uint32_t num;
    uint32_t cap;
    kvf_pd_batch_t *batch; /* the push in progress */
    kvf_status_t reason;   /* ABORTED: why */
    /* the engine waiting, or the one that claimed it */
    kvf_pd_wait_cb_t wait_cb;
    void *wait_arg;
    void *wait_engine;
    uint64_t wait_deadline_ns;
    void *claimer; /* the engine that claimed it */
};

typedef enum {
    KVF_PD_PUSH_RESOLVE = 0, /* finding the decoder */
    KVF_PD_PUSH_ALLOC,       /* PD_ALLOC sent */
    KVF_PD_PUSH_DATA,        /* chunks being sent */
    KVF_PD_PUSH_DONE,        /* PD_DONE sent, waiting for the ack */
    KVF_PD_PUSH_FINISHED,
} kvf_pd_push_state_t;

typedef struct kvf_pd_push {
    struct kvf_pd_push *next;
    kvf_pd_t *pd;
    uint64_t ticket;
    uint64_t request_id;
    char decoder[KVF_PD_DECODER_MAX];
    char address[64];
    kvf_ucx_ep_t *ep;
    kvf_store_owner_t *owner; /* the chunks while they are sent */
    kvf_store_owner_t *from;  /* the engine's; NULL once it went */
    kvf_pd_push_cb_t cb;
    void *arg;
    void *engine;
    uint64_t start_ns;
    uint64_t deadline_ns;
    uint64_t batch;
    uint32_t num;
    uint32_t sent;
    uint32_t inflight;    /* UCX operations not completed */
    uint32_t pending_ctl; /* controller requests not answered */
    kvf_pd_push_state_t state;
    kvf_status_t status;
    bool is_final;
    uint64_t bytes;
    uint64_t *offsets;
    uint64_t *lengths;
    uint64_t *checksums;
    char message[KVF_PD_MESSAGE_SIZE];
} kvf_pd_push_t;

/* A request this agent pushes and has not finished: aborted at its
 * decoder when its engine goes away. */
typedef struct kvf_pd_open {
    struct kvf_pd_open *next;
    uint64_t request_id;
    void *engine;
    char address[64];
} kvf_pd_open_t;

typedef struct kvf_pd_node {
    char name[KVF_PD_DECODER_MAX]; /* "": unused */
    char address[64];
} kvf_pd_node_t;

/* A control frame in flight: kept until its send completes. */
typedef struct kvf_pd_msg {
    kvf_pd_push_t *push; /* NULL: nobody waits for the completion */
    size_t len;
    uint8_t frame[];
} kvf_pd_msg_t;

struct kvf_pd {
    struct event_base *base;
    kvf_ucx_worker_t *worker;
    kvf_ucx_mem_t *pool_mem;
    kvf_store_t *store;
    kvf_ctl_client_t *ctl;
    kvf_pd_region_t *region; /* NULL: no receive region */
    uint8_t *region_base;
    uint64_t region_offset;
    const kvf_ucx_mem_t *region_mem;
    bool region_is_device;
    uint8_t *bounce; /* device region: a chunk copied for its checksum */
    uint64_t bounce_len;
    uint32_t queue_max;
    uint64_t alloc_timeout_ns;
    uint64_t push_timeout_ns;
    uint64_t wait_timeout_ns;
    uint64_t claim_timeout_ns;
    char name[128];
    uint64_t next_ticket;
    uint64_t next_batch;
    kvf_pd_req_t *reqs;
    kvf_pd_batch_t *queue; /* FIFO of reservations waiting for room */
    kvf_pd_batch_t *queue_tail;
    uint32_t queue_len;
    kvf_pd_push_t *pushes;
    kvf_pd_open_t *opens;
    kvf_pd_node_t nodes[KVF_PD_NODE_CACHE];
    struct event *tick_ev;
    kvf_pd_stats_t stats;
    bool is_draining; /* new requests refused; open ones complete */
};

static void kvf_pd_tick_arm(kvf_pd_t *pd)
{
    struct timeval tv = {0, KVF_PD_TICK_US};

    if (!evtimer_pending(pd->tick_ev, NULL)) {
        evtimer_add(pd->tick_ev, &tv);
    }
}

/* --------------------------------------------------------- control msgs */

static void kvf_pd_push_maybe_complete(kvf_pd_push_t *push);
static void kvf_pd_push_finish(kvf_pd_push_t *push, kvf_status_t status,
                               const char *fmt, ...) KVF_PRINTF(3, 4);

static void kvf_pd_on_msg_sent(kvf_status_t status, void *arg)
{
    kvf_pd_msg_t *m     = arg;
    kvf_pd_push_t *push = m->push;

    free(m);
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
static kvf_status_t kvf_pd_send(kvf_pd_t *pd, kvf_ucx_ep_t *ep, uint16_t type,
                                const ProtobufCMessage *msg,
                                kvf_pd_push_t *push)
{
    size_t len = kvf_frame_size(msg);
    kvf_pd_msg_t *m;
    kvf_status_t status;

    m = malloc(sizeof(*m) + len);
    if (m == NULL) {
        return KVF_ERR_NO_MEMORY;
    }
    m->push = push;
    status  = kvf_frame_pack(m->frame, len, type, 0, msg, KVF_FRAME_MAX_DEFAULT,
                             &m->len);
    if (status == KVF_OK) {
        status = kvf_ucx_am_send(ep, KVF_PD_AM_CTRL, NULL, 0, m->frame, m->len,
                                 NULL, KVF_UCX_AM_SEND_EAGER,
                                 pd->push_timeout_ns, kvf_pd_on_msg_sent, m);
    }
    if (status != KVF_OK) {
        free(m);
        return status;
    }
    if (push != NULL) {
        push->inflight++;
    }
    return KVF_OK;
}

/* ====================================================== decoder side == */

static kvf_pd_req_t *kvf_pd_req_find(kvf_pd_t *pd, uint64_t id)
{
    kvf_pd_req_t *req;

    for (req = pd->reqs; req != NULL; req = req->next) {
        if (req->id == id) {
            return req;
        }
    }
    return NULL;
}

static kvf_pd_req_t *kvf_pd_req_create(kvf_pd_t *pd, uint64_t id)
{
    kvf_pd_req_t *req = calloc(1, sizeof(*req));

    if (req == NULL) {
        return NULL;
    }
    req->id         = id;
    req->touched_ns = kvf_time_now_ns();
    req->next       = pd->reqs;
    pd->reqs        = req;
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
    if ((status == KVF_OK) && (batch != NULL)) {
        reply.batch     = batch->id;
        reply.n_offsets = batch->num;
        reply.offsets   = batch->offsets;
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

static void kvf_pd_queue_pump(kvf_pd_t *pd);

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

/* Frees the verified slots of @p req. */
static void kvf_pd_req_free_slots(kvf_pd_t *pd, kvf_pd_req_t *req)
{
    uint32_t i;

    for (i = 0; i < req->num; i++) {
        kvf_pd_region_free(pd->region, req->offsets[i], req->lengths[i]);
    }
    req->num       = 0;
    req->footprint = 0;
}

static void kvf_pd_req_unlink(kvf_pd_t *pd, kvf_pd_req_t *req)
{
    kvf_pd_req_t **pp;

    for (pp = &pd->reqs; *pp != NULL; pp = &(*pp)->next) {
        if (*pp == req) {
            *pp = req->next;
            break;
        }
    }
    if (req->batch != NULL) {
        kvf_pd_batch_drop(pd, req->batch);
        req->batch = NULL;
    }
    kvf_pd_req_free_slots(pd, req);
    kvf_ucx_ep_put(req->src);
    free(req->offsets);
    free(req->lengths);
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
            cb(arg, KVF_ERR_NO_MEMORY, "agent out of memory", NULL, 0);
            return;
        }
        for (i = 0; i < req->num; i++) {
            slots[i].offset = pd->region_offset + req->offsets[i];
            slots[i].length = req->lengths[i];
        }
        req->state   = KVF_PD_REQ_CLAIMED;
        req->claimer = engine;
    }
    cb(arg, status, message, slots, (status == KVF_OK) ? req->num : 0);
    free(slots);
}

/*
 * Aborts @p req: its slots go back, the push in progress is told (unless
 * the sender itself aborted), its waiter learns KVF_ERR_CANCELED, and a
 * tombstone stays (until claim_timeout) so a later wait learns it too.
 */
static void kvf_pd_req_abort(kvf_pd_t *pd, kvf_pd_req_t *req,
                             kvf_status_t reason, bool tell_sender,
                             const char *why)
{
    char message[KVF_PD_MESSAGE_SIZE];
    kvf_pd_batch_t *batch = req->batch;

    /* damaged data is an alarm (bad memory, a bug), not routine */
    if (reason == KVF_ERR_CHECKSUM) {
        kvf_warn("%s: PD request %llu aborted: %s", pd->name,
                 (unsigned long long)req->id, why);
    } else {
        kvf_info("%s: PD request %llu aborted: %s", pd->name,
                 (unsigned long long)req->id, why);
    }
    pd->stats.aborts++;
    if ((batch != NULL) && tell_sender) {
        if (!batch->is_reserved) {
            kvf_pd_reply_alloc(pd, req->src, req->id, batch->ticket, reason,
                               why, NULL);
        } else {
            kvf_pd_reply_done(pd, req->src, req->id, batch->ticket, reason,
                              why);
        }
    }
    if (batch != NULL) {
        kvf_pd_batch_drop(pd, batch);
        req->batch = NULL;
    }
    kvf_pd_req_free_slots(pd, req);
    kvf_ucx_ep_put(req->src);
    req->src        = NULL;
    req->state      = KVF_PD_REQ_ABORTED;
    req->reason     = reason;
    req->touched_ns = kvf_time_now_ns();
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
    req->touched_ns    = kvf_time_now_ns();
    kvf_pd_reply_alloc(pd, req->src, req->id, batch->ticket, KVF_OK, "", batch);
}

/* Serves waiting reservations in FIFO order while they fit. */
static void kvf_pd_queue_pump(kvf_pd_t *pd)
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

/* PD_ALLOC: reserve slots for one push, or queue, or refuse. */
static void kvf_pd_on_alloc(kvf_pd_t *pd, kvf_ucx_ep_t *ep,
                            const Kvf__PdAlloc *m)
{
    char message[KVF_PD_MESSAGE_SIZE];
    kvf_pd_req_t *req;
    kvf_pd_batch_t *batch;
    uint64_t footprint = 0;
    kvf_status_t status;
    size_t i;

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
    status = KVF_OK;
    switch (req->state) {
    case KVF_PD_REQ_WAITING:
        break;
    case KVF_PD_REQ_RECEIVING:
        if (req->src != ep) {
            status = KVF_ERR_EXISTS;
            snprintf(message, sizeof(message),
                     "PD request %llu is being pushed by another sender",
                     (unsigned long long)m->request_id);
        } else if (req->batch != NULL) {
            status = KVF_ERR_BUSY;
            snprintf(message, sizeof(message),
                     "PD request %llu already has a push in progress",
                     (unsigned long long)m->request_id);
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
    req->state      = KVF_PD_REQ_RECEIVING;
    req->touched_ns = kvf_time_now_ns();
    if (footprint > kvf_pd_region_size(pd->region) - req->footprint) {
        snprintf(message, sizeof(message),
                 "PD request %llu needs %llu bytes; the receive region of %s "
                 "holds %llu",
                 (unsigned long long)m->request_id,
                 (unsigned long long)(req->footprint + footprint), pd->name,
                 (unsigned long long)kvf_pd_region_size(pd->region));
        kvf_pd_reply_alloc(pd, ep, m->request_id, m->ticket, KVF_ERR_TOO_BIG,
                           message, NULL);
        kvf_pd_req_abort(pd, req, KVF_ERR_TOO_BIG, false, message);
        return;
    }
    batch = calloc(1, sizeof(*batch));
    if (batch != NULL) {
        batch->lengths = malloc(m->n_lengths * sizeof(uint64_t));
        batch->offsets = calloc(m->n_lengths, sizeof(uint64_t));
        batch->state   = calloc(m->n_lengths, 1);
        batch->recvs   = calloc(m->n_lengths, sizeof(kvf_pd_recv_t));
        if (m->n_checksums > 0) {
            batch->checksums = malloc(m->n_lengths * sizeof(uint64_t));
        }
    }
    if ((batch == NULL) || (batch->lengths == NULL) ||
        (batch->offsets == NULL) || (batch->state == NULL) ||
        (batch->recvs == NULL) ||
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
    batch->num      = (uint32_t)m->n_lengths;
    batch->id       = ++pd->next_batch;
    batch->ticket   = m->ticket;
    batch->is_final = m->final;
    batch->req      = req;
    req->batch      = batch;
    req->footprint += footprint;
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
    kvf_pd_tick_arm(pd);
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

/* PD_DONE arrived and every receive finished: verify, keep, acknowledge. */
static void kvf_pd_batch_try_complete(kvf_pd_t *pd, kvf_pd_batch_t *batch)
{
    char message[KVF_PD_MESSAGE_SIZE];
    kvf_pd_req_t *req = batch->req;
    uint64_t *grown_o, *grown_l;
    kvf_status_t status;
    uint32_t i, bad = 0, cap;

    if (!batch->is_done || (batch->inflight > 0)) {
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
        kvf_pd_reply_done(pd, req->src, req->id, batch->ticket, status,
                          message);
        kvf_pd_req_abort(pd, req, status, false, message);
        return;
    }
    if (req->num + batch->num > req->cap) {
        cap = (req->cap == 0) ? 16 : req->cap;
        while (cap < req->num + batch->num) {
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
        if ((grown_o == NULL) || (grown_l == NULL)) {
            kvf_pd_reply_done(pd, req->src, req->id, batch->ticket,
                              KVF_ERR_NO_MEMORY, "decoder out of memory");
            kvf_pd_req_abort(pd, req, KVF_ERR_NO_MEMORY, false,
                             "decoder out of memory");
            return;
        }
        req->cap = cap;
    }
    /* the slots move from the batch to the request, in push order */
    for (i = 0; i < batch->num; i++) {
        req->offsets[req->num + i] = batch->offsets[i];
        req->lengths[req->num + i] = batch->lengths[i];
        pd->stats.bytes_received += batch->lengths[i];
    }
    req->num += batch->num;
    batch->is_reserved = false;
    req->batch         = NULL;
    req->touched_ns    = kvf_time_now_ns();
    pd->stats.batches_received++;
    kvf_pd_reply_done(pd, req->src, req->id, batch->ticket, KVF_OK, "");
    if (batch->is_final) {
        req->state = KVF_PD_REQ_READY;
        kvf_ucx_ep_put(req->src);
        req->src = NULL;
        pd->stats.requests_ready++;
        kvf_pd_req_notify(pd, req, KVF_OK, "");
    }
    kvf_pd_batch_free(batch);
}

/* The batch @p id of request @p request_id, or NULL. */
static kvf_pd_batch_t *kvf_pd_batch_find(kvf_pd_t *pd, uint64_t request_id,
                                         uint64_t id)
{
    kvf_pd_req_t *req = kvf_pd_req_find(pd, request_id);

    if ((req == NULL) || (req->batch == NULL) || (req->batch->id != id)) {
        return NULL;
    }
    return req->batch;
}

static void kvf_pd_on_done(kvf_pd_t *pd, kvf_ucx_ep_t *ep, const Kvf__PdDone *m)
{
    kvf_pd_batch_t *batch = kvf_pd_batch_find(pd, m->request_id, m->batch);

    if ((batch == NULL) || (batch->req->src != ep) || !batch->is_reserved ||
        batch->is_done) {
        kvf_pd_reply_done(pd, ep, m->request_id, m->ticket, KVF_ERR_NOT_FOUND,
                          "no such push in progress at the decoder");
        return;
    }
    if (m->n_checksums != batch->num) {
        kvf_pd_reply_done(pd, ep, m->request_id, m->ticket, KVF_ERR_INVALID,
                          "PD_DONE needs one checksum per chunk");
        kvf_pd_req_abort(pd, batch->req, KVF_ERR_PROTO, false, "bad PD_DONE");
        return;
    }
    if (batch->checksums != NULL) {
        /* PD_ALLOC named them: the chunks are checked against those */
        if (memcmp(batch->checksums, m->checksums,
                   batch->num * sizeof(uint64_t)) != 0) {
            kvf_pd_reply_done(pd, ep, m->request_id, m->ticket, KVF_ERR_INVALID,
                              "PD_DONE checksums differ from PD_ALLOC's");
            kvf_pd_req_abort(pd, batch->req, KVF_ERR_PROTO, false,
                             "bad PD_DONE");
            return;
        }
    } else {
        batch->checksums = malloc(batch->num * sizeof(uint64_t));
        if (batch->checksums == NULL) {
            kvf_pd_reply_done(pd, ep, m->request_id, m->ticket,
                              KVF_ERR_NO_MEMORY, "decoder out of memory");
            kvf_pd_req_abort(pd, batch->req, KVF_ERR_NO_MEMORY, false,
                             "decoder out of memory");
            return;
        }
        memcpy(batch->checksums, m->checksums, batch->num * sizeof(uint64_t));
    }
    batch->is_done  = true;
    batch->is_final = m->final;
    kvf_pd_batch_try_complete(pd, batch);
}

static void kvf_pd_on_abort(kvf_pd_t *pd, kvf_ucx_ep_t *ep,
                            const Kvf__PdAbort *m)
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

static kvf_status_t kvf_pd_on_data(void *arg, const void *header,
                                   size_t header_len,
                                   const kvf_ucx_am_msg_t *msg)
{
    kvf_pd_t *pd = arg;
    const Kvf__PdData *m;
    kvf_pd_batch_t *batch;
    kvf_pd_recv_t *recv = NULL;
    kvf_frame_t frame;
    size_t used      = 0;
    kvf_status_t ret = KVF_OK;

    if ((kvf_frame_decode_buf(header, header_len, KVF_PD_HDR_MAX, NULL, &frame,
                              &used) != KVF_OK)) {
        kvf_debug("%s: bad PD_DATA header; dropped", pd->name);
        return KVF_OK;
    }
    if (frame.type != KVF_MSG_PD_DATA) {
        kvf_frame_release(&frame, NULL);
        return KVF_OK;
    }
    m     = (const Kvf__PdData *)frame.msg;
    batch = kvf_pd_batch_find(pd, m->request_id, m->batch);
    /* only the sender of the batch, only a reserved slot, once, and
     * exactly the bytes reserved: anything else is declined */
    if ((batch == NULL) || (batch->req->src != msg->reply_ep) ||
        !batch->is_reserved || batch->is_done || (m->index >= batch->num) ||
        (batch->state[m->index] != 0) ||
        (m->length != batch->lengths[m->index]) || (msg->length != m->length)) {
        kvf_debug("%s: unexpected PD_DATA for request %llu; declined", pd->name,
                  (unsigned long long)m->request_id);
        goto out;
    }
    recv        = &batch->recvs[m->index];
    recv->pd    = pd;
    recv->batch = batch;
    recv->index = m->index;
    if (kvf_ucx_am_recv_data(msg, pd->region_base + batch->offsets[m->index],
                             m->length, pd->region_mem, pd->push_timeout_ns,
                             kvf_pd_on_data_recv, recv) != KVF_OK) {
        batch->is_failed = true;
        goto out;
    }
    batch->state[m->index] = 1;
    batch->inflight++;
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
    uint32_t index        = recv->index;

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
        batch->landed++;
        /* with the checksums from PD_ALLOC, check this chunk now, while
         * the next ones are still on the wire (host region only: a device
         * region is checked through its bounce buffer at PD_DONE) */
        if ((batch->checksums != NULL) && !pd->region_is_device &&
            !batch->is_bad) {
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
    batch->req->touched_ns = kvf_time_now_ns();
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
        cb(arg, KVF_ERR_UNSUPPORTED, message, NULL, 0);
        return;
    }
    req = kvf_pd_req_find(pd, request_id);
    if (req == NULL) {
        /* the engine came first: the push will find this record */
        req = kvf_pd_req_create(pd, request_id);
        if (req == NULL) {
            cb(arg, KVF_ERR_NO_MEMORY, "agent out of memory", NULL, 0);
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
        cb(arg, KVF_ERR_BUSY, message, NULL, 0);
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
        kvf_pd_tick_arm(pd);
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

/* Deadlines of the decoder side. */
static void kvf_pd_tick_decoder(kvf_pd_t *pd, uint64_t now)
{
    char message[KVF_PD_MESSAGE_SIZE];
    kvf_pd_req_t *req, *next;
    kvf_pd_batch_t *batch;

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
    for (req = pd->reqs; req != NULL; req = next) {
        next = req->next;
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
            ((req->batch == NULL) || !req->batch->is_queued) &&
            (now >= req->touched_ns + pd->push_timeout_ns)) {
            /* the sender went quiet (died mid-push): take the slots back */
            kvf_pd_req_abort(pd, req, KVF_ERR_TIMEOUT, true,
                             "the prefill side went quiet");
            next = pd->reqs; /* aborts may pump the queue: start over */
            continue;
        }
        if ((req->state == KVF_PD_REQ_READY) &&
            (now >= req->touched_ns + pd->claim_timeout_ns)) {
            kvf_info("%s: PD request %llu never claimed; reclaimed", pd->name,
                     (unsigned long long)req->id);
            pd->stats.reclaimed++;
            kvf_pd_req_unlink(pd, req);
            kvf_pd_queue_pump(pd);
            next = pd->reqs;
            continue;
        }
        if ((req->state == KVF_PD_REQ_ABORTED) && (req->wait_cb == NULL) &&
            (now >= req->touched_ns + pd->claim_timeout_ns)) {
            kvf_pd_req_unlink(pd, req);
            next = pd->reqs;
        }
    }
}

/* ====================================================== sender side === */

static kvf_pd_push_t *kvf_pd_push_find(kvf_pd_t *pd, uint64_t ticket)
{
    kvf_pd_push_t *push;

    for (push = pd->pushes; push != NULL; push = push->next) {
        if (push->ticket == ticket) {
            return push;
        }
    }
    return NULL;
}

static kvf_pd_open_t *kvf_pd_open_find(kvf_pd_t *pd, uint64_t request_id,
                                       kvf_pd_open_t ***pp_p)
{
    kvf_pd_open_t **pp;

    for (pp = &pd->opens; *pp != NULL; pp = &(*pp)->next) {
        if ((*pp)->request_id == request_id) {
            if (pp_p != NULL) {
                *pp_p = pp;
            }
            return *pp;
        }
    }
    return NULL;
}

static void kvf_pd_open_forget(kvf_pd_t *pd, uint64_t request_id)
{
    kvf_pd_open_t **pp, *open = kvf_pd_open_find(pd, request_id, &pp);

    if (open != NULL) {
        *pp = open->next;
        free(open);
    }
}

static void kvf_pd_node_forget(kvf_pd_t *pd, const char *name)
{
    unsigned i;

    for (i = 0; i < KVF_PD_NODE_CACHE; i++) {
        if (strcmp(pd->nodes[i].name, name) == 0) {
            pd->nodes[i].name[0] = '\0';
        }
    }
}

/* Tells the decoder at @p address to forget @p request_id. */
static void kvf_pd_send_abort(kvf_pd_t *pd, const char *address,
                              uint64_t request_id, kvf_status_t reason)
{
    kvf_ucx_ep_t *ep = NULL;
    Kvf__PdAbort m;

    if ((address[0] == '\0') ||
        (kvf_ucx_ep_get(pd->worker, address, NULL, &ep) != KVF_OK)) {
        return;
    }
    kvf__pd_abort__init(&m);
    m.request_id = request_id;
    m.reason     = reason;
    kvf_pd_send(pd, ep, KVF_MSG_PD_ABORT, &m.base, NULL);
    kvf_ucx_ep_put(ep);
}

/* The push failed or succeeded; it completes once nothing is in flight. */
static void kvf_pd_push_finish(kvf_pd_push_t *push, kvf_status_t status,
                               const char *fmt, ...)
{
    kvf_pd_t *pd = push->pd;
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
        if (push->is_final) {
            kvf_pd_open_forget(pd, push->request_id);
        }
        return;
    }
    pd->stats.push_failures++;
    kvf_debug("%s: push of PD request %llu to %s failed: %s", pd->name,
              (unsigned long long)push->request_id, push->decoder,
              push->message);
    if ((status == KVF_ERR_CLOSED) || (status == KVF_ERR_NOT_FOUND)) {
        kvf_pd_node_forget(pd, push->decoder);
    }
    /* a duplicate must not disturb the request it collided with; any other
     * failure ends the request at the decoder too */
    if ((status != KVF_ERR_EXISTS) && (status != KVF_ERR_BUSY)) {
        kvf_pd_send_abort(pd, push->address, push->request_id, status);
        kvf_pd_open_forget(pd, push->request_id);
    }
}

static void kvf_pd_push_maybe_complete(kvf_pd_push_t *push)
{
    kvf_pd_t *pd = push->pd;
    kvf_pd_push_t **pp;
    uint64_t len;
    uint32_t i;

    if ((push->state != KVF_PD_PUSH_FINISHED) || (push->inflight > 0) ||
        (push->pending_ctl > 0)) {
        return;
    }
    for (pp = &pd->pushes; *pp != NULL; pp = &(*pp)->next) {
        if (*pp == push) {
            *pp = push->next;
            break;
        }
    }
    /* the chunks go back to their engine (freed if it is gone) */
    if (push->from != NULL) {
        for (i = 0; i < push->num; i++) {
            kvf_store_move(pd->store, push->owner, push->from, push->offsets[i],
                           &len);
        }
    }
    kvf_store_owner_destroy(pd->store, push->owner);
    kvf_ucx_ep_put(push->ep);
    if (push->cb != NULL) {
        push->cb(push->arg, push->status, push->message);
    }
    free(push->offsets);
    free(push->lengths);
    free(push->checksums);
    free(push);
}

static void kvf_pd_push_send_done(kvf_pd_push_t *push)
{
    kvf_pd_t *pd = push->pd;
    kvf_status_t status;
    Kvf__PdDone m;

    kvf__pd_done__init(&m);
    m.request_id  = push->request_id;
    m.ticket      = push->ticket;
    m.batch       = push->batch;
    m.n_checksums = push->num;
    m.checksums   = push->checksums;
    m.final       = push->is_final;
    push->state   = KVF_PD_PUSH_DONE;
    status        = kvf_pd_send(pd, push->ep, KVF_MSG_PD_DONE, &m.base, push);
    if (status != KVF_OK) {
        kvf_pd_push_finish(push, status, "cannot send PD_DONE to %s: %s",
                           push->decoder, kvf_strerror(status));
    }
}

static void kvf_pd_on_data_sent(kvf_status_t status, void *arg)
{
    kvf_pd_push_t *push = arg;

    push->inflight--;
    if (status != KVF_OK) {
        kvf_pd_push_finish(push, status, "sending a chunk to %s failed: %s",
                           push->decoder, kvf_strerror(status));
    } else if ((++push->sent == push->num) &&
               (push->state == KVF_PD_PUSH_DATA)) {
        kvf_pd_push_send_done(push);
    }
    kvf_pd_push_maybe_complete(push);
}

/* Slots reserved: every chunk goes by rendezvous straight into its slot. */
static void kvf_pd_push_send_data(kvf_pd_push_t *push)
{
    kvf_pd_t *pd = push->pd;
    uint8_t hdr[KVF_PD_HDR_MAX];
    kvf_status_t status;
    Kvf__PdData m;
    size_t len;
    uint32_t i;

    push->state = KVF_PD_PUSH_DATA;
    for (i = 0; i < push->num; i++) {
        kvf__pd_data__init(&m);
        m.request_id = push->request_id;
        m.batch      = push->batch;
        m.index      = i;
        m.length     = push->lengths[i];
        status = kvf_frame_pack(hdr, sizeof(hdr), KVF_MSG_PD_DATA, 0, &m.base,
                                KVF_PD_HDR_MAX, &len);
        if (status == KVF_OK) {
            status = kvf_ucx_am_send(
                push->ep, KVF_PD_AM_DATA, hdr, len,
                (uint8_t *)kvf_store_base(pd->store) + push->offsets[i],
                push->lengths[i], pd->pool_mem, KVF_UCX_AM_SEND_RNDV,
                kvf_time_left_ns(push->deadline_ns) + 1, kvf_pd_on_data_sent,
                push);
        }
        if (status != KVF_OK) {
            kvf_pd_push_finish(push, status, "cannot send chunk %u to %s: %s",
                               i, push->decoder, kvf_strerror(status));
            return;
        }
        push->inflight++;
    }
}

static void kvf_pd_on_alloc_reply(kvf_pd_t *pd, const Kvf__PdAllocReply *m)
{
    kvf_pd_push_t *push = kvf_pd_push_find(pd, m->ticket);

    if ((push == NULL) || (push->state != KVF_PD_PUSH_ALLOC) ||
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
    push->batch = m->batch;
    kvf_pd_push_send_data(push);
    kvf_pd_push_maybe_complete(push);
}

static void kvf_pd_on_done_reply(kvf_pd_t *pd, const Kvf__PdDoneReply *m)
{
    kvf_pd_push_t *push = kvf_pd_push_find(pd, m->ticket);

    if ((push == NULL) || (push->state == KVF_PD_PUSH_FINISHED) ||
        (push->request_id != m->request_id)) {
        return;
    }
    if (m->status != KVF_OK) {
        kvf_pd_push_finish(push, (kvf_status_t)m->status, "decoder %s: %s",
                           push->decoder,
                           (m->message != NULL) ? m->message : "");
    } else if (push->state == KVF_PD_PUSH_DONE) {
        /* the decoder verified every byte: delivered */
        kvf_pd_push_finish(push, KVF_OK, "%s", "");
    }
    kvf_pd_push_maybe_complete(push);
}

static void kvf_pd_push_send_alloc(kvf_pd_push_t *push)
{
    kvf_pd_t *pd = push->pd;
    kvf_status_t status;
    Kvf__PdAlloc m;

    status = kvf_ucx_ep_get(pd->worker, push->address, NULL, &push->ep);
    if (status != KVF_OK) {
        kvf_pd_push_finish(push, KVF_ERR_CLOSED,
                           "cannot connect to decoder %s at %s: %s",
                           push->decoder, push->address, kvf_strerror(status));
        return;
    }
    kvf__pd_alloc__init(&m);
    m.request_id  = push->request_id;
    m.ticket      = push->ticket;
    m.n_lengths   = push->num;
    m.lengths     = push->lengths;
    m.n_checksums = push->num;
    m.checksums   = push->checksums;
    m.final       = push->is_final;
    push->state   = KVF_PD_PUSH_ALLOC;
    status        = kvf_pd_send(pd, push->ep, KVF_MSG_PD_ALLOC, &m.base, push);
    if (status != KVF_OK) {
        kvf_pd_push_finish(push, status, "cannot send PD_ALLOC to %s: %s",
                           push->decoder, kvf_strerror(status));
    }
}

/* Starts the push at its decoder's address; remembers the request so an
 * engine that goes away mid-request aborts it at the decoder. */
static void kvf_pd_push_start(kvf_pd_push_t *push, const char *address)
{
    kvf_pd_t *pd = push->pd;
    kvf_pd_open_t *open;

    snprintf(push->address, sizeof(push->address), "%s", address);
    open = kvf_pd_open_find(pd, push->request_id, NULL);
    if ((open == NULL) && !push->is_final) {
        open = calloc(1, sizeof(*open));
        if (open != NULL) {
            open->request_id = push->request_id;
            open->engine     = push->engine;
            snprintf(open->address, sizeof(open->address), "%s", address);
            open->next = pd->opens;
            pd->opens  = open;
        }
    }
    kvf_pd_push_send_alloc(push);
}

static void kvf_pd_on_node(void *arg, kvf_status_t status, uint32_t node_id,
                           const char *data_address, bool alive)
{
    kvf_pd_push_t *push = arg;
    kvf_pd_t *pd        = push->pd;
    unsigned i, slot = 0;

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
    for (i = 0; i < KVF_PD_NODE_CACHE; i++) {
        if (pd->nodes[i].name[0] == '\0') {
            slot = i;
            break;
        }
        slot = (unsigned)(push->ticket % KVF_PD_NODE_CACHE);
    }
    snprintf(pd->nodes[slot].name, sizeof(pd->nodes[slot].name), "%s",
             push->decoder);
    snprintf(pd->nodes[slot].address, sizeof(pd->nodes[slot].address), "%s",
             data_address);
    kvf_pd_push_start(push, data_address);
    kvf_pd_push_maybe_complete(push);
}

/* A push whose request the engine already finished here is a duplicate. */
static bool kvf_pd_push_is_busy(kvf_pd_t *pd, uint64_t request_id)
{
    kvf_pd_push_t *p;

    for (p = pd->pushes; p != NULL; p = p->next) {
        if ((p->request_id == request_id) &&
            (p->state != KVF_PD_PUSH_FINISHED)) {
            return true;
        }
    }
    return false;
}

kvf_status_t kvf_pd_push_submit(kvf_pd_t *pd, void *engine,
                                kvf_store_owner_t *owner, uint64_t request_id,
                                const char *decoder, const uint64_t *offsets,
                                const uint64_t *lengths,
                                const uint64_t *checksums, uint32_t num,
                                bool final, kvf_pd_push_cb_t cb, void *arg)
{
    kvf_pd_push_t *push;
    kvf_status_t status = KVF_OK;
    uint64_t len;
    uint32_t i, moved = 0;

    if ((num == 0) || (num > KVF_PD_MAX_CHUNKS) || (decoder == NULL) ||
        (decoder[0] == '\0') || (strlen(decoder) >= KVF_PD_DECODER_MAX)) {
        return KVF_ERR_INVALID;
    }
    push = calloc(1, sizeof(*push));
    if (push == NULL) {
        return KVF_ERR_NO_MEMORY;
    }
    push->offsets   = malloc(num * sizeof(uint64_t));
    push->lengths   = malloc(num * sizeof(uint64_t));
    push->checksums = malloc(num * sizeof(uint64_t));
    if ((push->offsets == NULL) || (push->lengths == NULL) ||
        (push->checksums == NULL) ||
        (kvf_store_owner_create(pd->store, &push->owner) != KVF_OK)) {
        status = KVF_ERR_NO_MEMORY;
        goto err_free;
    }
    memcpy(push->offsets, offsets, num * sizeof(uint64_t));
    memcpy(push->lengths, lengths, num * sizeof(uint64_t));
    memcpy(push->checksums, checksums, num * sizeof(uint64_t));
    /* the chunks belong to the push while it runs: an engine that goes
     * away cannot free what UCX is still reading */
    for (moved = 0; moved < num; moved++) {
        status =
            kvf_store_move(pd->store, owner, push->owner, offsets[moved], &len);
        if (status != KVF_OK) {
            break;
        }
        if ((lengths[moved] == 0) || (lengths[moved] > len)) {
            moved++;
            status = KVF_ERR_RANGE;
            break;
        }
        push->bytes += lengths[moved];
    }
    if (status != KVF_OK) {
        for (i = 0; i < moved; i++) {
            kvf_store_move(pd->store, push->owner, owner, offsets[i], &len);
        }
        goto err_free;
    }
    push->pd          = pd;
    push->ticket      = ++pd->next_ticket;
    push->request_id  = request_id;
    push->from        = owner;
    push->cb          = cb;
    push->arg         = arg;
    push->engine      = engine;
    push->num         = num;
    push->is_final    = final;
    push->start_ns    = kvf_time_now_ns();
    push->deadline_ns = kvf_time_deadline_ns(pd->push_timeout_ns);
    snprintf(push->decoder, sizeof(push->decoder), "%s", decoder);
    push->next = pd->pushes;
    kvf_pd_tick_arm(pd);
    if (kvf_pd_push_is_busy(pd, request_id)) {
        pd->pushes = push;
        kvf_pd_push_finish(push, KVF_ERR_BUSY,
                           "PD request %llu already has a push in progress",
                           (unsigned long long)request_id);
        return KVF_OK; /* completes on the next tick, never inside */
    }
    pd->pushes = push;
    for (i = 0; i < KVF_PD_NODE_CACHE; i++) {
        if (strcmp(pd->nodes[i].name, decoder) == 0) {
            kvf_pd_push_start(push, pd->nodes[i].address);
            return KVF_OK;
        }
    }
    if ((pd->ctl == NULL) || !kvf_ctl_client_is_registered(pd->ctl)) {
        kvf_pd_push_finish(push, KVF_ERR_STATE,
                           "not registered with the controller: cannot find "
                           "decoder %s",
                           decoder);
        return KVF_OK;
    }
    push->pending_ctl++;
    kvf_ctl_client_node_find(pd->ctl, decoder, kvf_pd_on_node, push);
    return KVF_OK;

err_free:
    kvf_store_owner_destroy(pd->store, push->owner);
    free(push->offsets);
    free(push->lengths);
    free(push->checksums);
    free(push);
    return status;
}

static void kvf_pd_tick_sender(kvf_pd_t *pd, uint64_t now)
{
    kvf_pd_push_t *push, *next;

    for (push = pd->pushes; push != NULL; push = next) {
        next = push->next;
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
        /* completes pushes that finished without anything in flight */
        kvf_pd_push_maybe_complete(push);
    }
}

static void kvf_pd_on_tick(evutil_socket_t fd, short what, void *arg)
{
    kvf_pd_t *pd = arg;
    uint64_t now = kvf_time_now_ns();

    kvf_pd_tick_sender(pd, now);
    if (pd->region != NULL) {
        kvf_pd_tick_decoder(pd, now);
    }
    if ((pd->pushes != NULL) || (pd->reqs != NULL) || (pd->queue != NULL)) {
        kvf_pd_tick_arm(pd);
    }
}

void kvf_pd_cancel(kvf_pd_t *pd, void *engine)
{
    kvf_pd_open_t **pp, *open;
    kvf_pd_push_t *push;
    kvf_pd_req_t *req, *next;

    for (push = pd->pushes; push != NULL; push = push->next) {
        if (push->engine == engine) {
            push->cb   = NULL;
            push->from = NULL; /* its chunks go with the push */
        }
    }
    for (pp = &pd->opens; (open = *pp) != NULL;) {
        if (open->engine == engine) {
            kvf_pd_send_abort(pd, open->address, open->request_id,
                              KVF_ERR_CLOSED);
            *pp = open->next;
            free(open);
            continue;
        }
        pp = &open->next;
    }
    for (req = pd->reqs; req != NULL; req = next) {
        next = req->next;
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
    kvf_pd_req_t *req, *next;

    /* sender side: pushes to a decoder that went away fail now rather than
     * at pd_push_timeout (their UCX operations complete with errors) */
    for (push = pd->pushes; push != NULL; push = push_next) {
        push_next = push->next;
        if ((push->ep == ep) && (push->state != KVF_PD_PUSH_FINISHED) &&
            (push->state != KVF_PD_PUSH_RESOLVE)) {
            kvf_pd_push_finish(push, KVF_ERR_CLOSED,
                               "the connection to decoder %s failed",
                               push->decoder);
            kvf_pd_push_maybe_complete(push);
        }
    }

    for (req = pd->reqs; req != NULL; req = next) {
        next = req->next;
        if ((req->src == ep) && (req->state == KVF_PD_REQ_RECEIVING)) {
            kvf_pd_req_abort(pd, req, KVF_ERR_CLOSED, false,
                             "the prefill agent's connection failed");
            next = pd->reqs;
        }
    }
}

/* --------------------------------------------------- active messages */

static kvf_status_t kvf_pd_on_ctrl(void *arg, const void *header,
                                   size_t header_len,
                                   const kvf_ucx_am_msg_t *msg)
{
    kvf_pd_t *pd = arg;
    kvf_frame_t frame;
    size_t used         = 0;
    kvf_status_t status = KVF_ERR_PROTO;

    if (!msg->is_rndv && (msg->data != NULL)) {
        status = kvf_frame_decode_buf(
            msg->data, msg->length, KVF_FRAME_MAX_DEFAULT, NULL, &frame, &used);
    }
    if (status != KVF_OK) {
        kvf_debug("%s: bad PD control message (%zu bytes): %s; dropped",
                  pd->name, msg->length, kvf_strerror(status));
        return KVF_OK;
    }
    if ((msg->reply_ep == NULL) &&
        ((frame.type == KVF_MSG_PD_ALLOC) || (frame.type == KVF_MSG_PD_DONE) ||
         (frame.type == KVF_MSG_PD_ABORT))) {
        kvf_frame_release(&frame, NULL);
        return KVF_OK;
    }
    switch (frame.type) {
    case KVF_MSG_PD_ALLOC:
        kvf_pd_on_alloc(pd, msg->reply_ep, (const Kvf__PdAlloc *)frame.msg);
        break;
    case KVF_MSG_PD_ALLOC_REPLY:
        kvf_pd_on_alloc_reply(pd, (const Kvf__PdAllocReply *)frame.msg);
        break;
    case KVF_MSG_PD_DONE:
        if (pd->region != NULL) {
            kvf_pd_on_done(pd, msg->reply_ep, (const Kvf__PdDone *)frame.msg);
        }
        break;
    case KVF_MSG_PD_DONE_REPLY:
        kvf_pd_on_done_reply(pd, (const Kvf__PdDoneReply *)frame.msg);
        break;
    case KVF_MSG_PD_ABORT:
        if (pd->region != NULL) {
            kvf_pd_on_abort(pd, msg->reply_ep, (const Kvf__PdAbort *)frame.msg);
        }
        break;
    default:
        kvf_debug("%s: %s sent as a PD message; dropped", pd->name,
                  kvf_msg_type_name(frame.type));
        break;
    }
    kvf_frame_release(&frame, NULL);
    if (pd->tick_ev != NULL) {
        kvf_pd_tick_arm(pd);
    }
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
    pd->base             = params->base;
    pd->worker           = params->worker;
    pd->pool_mem         = params->pool_mem;
    pd->store            = params->store;
    pd->region_base      = params->region_base;
    pd->region_offset    = params->region_offset;
    pd->region_mem       = params->region_mem;
    pd->region_is_device = params->region_is_device;
    pd->queue_max        = params->queue_max;
    pd->alloc_timeout_ns = params->alloc_timeout_ns;
    pd->push_timeout_ns  = params->push_timeout_ns;
    pd->wait_timeout_ns  = params->wait_timeout_ns;
    pd->claim_timeout_ns = params->claim_timeout_ns;
    snprintf(pd->name, sizeof(pd->name), "%s",
             (params->name != NULL) ? params->name : "agent");
    pd->tick_ev = evtimer_new(params->base, kvf_pd_on_tick, pd);
    if (pd->tick_ev == NULL) {
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
        kvf_ucx_am_set_handler(pd->worker, KVF_PD_AM_CTRL, kvf_pd_on_ctrl, pd);
    if (status == KVF_OK) {
        status = kvf_ucx_am_set_handler(pd->worker, KVF_PD_AM_DATA,
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
        for (push = pd->pushes; push != NULL; push = push->next) {
            kvf_ctl_client_cancel(pd->ctl, push);
        }
    }
    /* the worker is gone: nothing is in flight any more */
    while ((push = pd->pushes) != NULL) {
        pd->pushes = push->next;
        kvf_store_owner_destroy(pd->store, push->owner);
        kvf_ucx_ep_put(push->ep);
        free(push->offsets);
        free(push->lengths);
        free(push->checksums);
        free(push);
    }
    while ((open = pd->opens) != NULL) {
        pd->opens = open->next;
        free(open);
    }
    while (pd->reqs != NULL) {
        pd->reqs->wait_cb = NULL;
        kvf_pd_req_unlink(pd, pd->reqs);
    }
    if (pd->tick_ev != NULL) {
        event_free(pd->tick_ev);
    }
    kvf_pd_region_destroy(pd->region);
    free(pd->bounce);
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
