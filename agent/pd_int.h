/* SPDX-License-Identifier: Apache-2.0 */
/* Copyright (c) 2026 The kvfabric authors */
/*
 * Private to agent/pd*.c: the PD object, its requests, batches and pushes,
 * and what the sender side (pd_send.c), the decoder side (pd_recv.c) and
 * the dispatch (pd.c) call in each other.
 *
 * thread: owning loop only.
 */
#ifndef KVF_AGENT_PD_INT_H
#define KVF_AGENT_PD_INT_H

#include "agent/pd.h"
#include "agent/pd_region.h"
#include "proto/frame.h"

#include <ucs/datastruct/khash.h>

#include <sys/queue.h>

#define KVF_PD_MAX_CHUNKS   65536u /* chunks in one push */
#define KVF_PD_HDR_MAX      KVF_MESH_HDR_MAX
#define KVF_PD_DECODER_MAX  128u /* bytes of a decoder name, with the NUL */
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
    uint32_t count; /* chunks index .. index+count-1 (PdData.count) */
} kvf_pd_recv_t;

/* One push as the decoder sees it: a reservation of slots, then their
 * data, then PD_DONE. The batch outlives every receive into it. */
struct kvf_pd_batch {
    struct kvf_pd_batch *next_queued; /* pd->queue, while waiting for room */
    struct kvf_pd_batch *next;        /* req->batches, by piece */
    kvf_pd_req_t *req;                /* NULL once its request went */
    uint64_t id;
    uint64_t ticket; /* the sender's push id */
    uint32_t piece;  /* its place in the request (PdAlloc.piece, or the
                        next one for a sender that names none) */
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
    kvf_ucx_iov_t *iov;   /* per chunk: its slot, for messages of several */
    bool is_bad;          /* a chunk failed its checksum as it landed */
    uint32_t bad;         /* which one */
    bool is_implied;      /* no PD_DONE: complete when the last chunk lands
                             (PdAllocReply.done_implied) */
    bool is_verified;     /* acknowledged; waits for the pieces before it */
    bool is_answered;     /* its sender was told how it ended */
};

/* Pushes of one request a decoder holds at once (PdAlloc.piece): more are
 * refused (KVF_ERR_BUSY), and no piece may run further ahead of the
 * first one missing. */
#define KVF_PD_PIECES_MAX 64u
/* How long a push waits for the same-host link to its decoder being
 * proved before it goes over UCX (the handshake is a few messages on a
 * local socket: well under a millisecond when both agents are well). */
#define KVF_PD_LINK_WAIT_NS (100ull * 1000 * 1000)
/* How soon a push whose data found no free worker operation tries again */
#define KVF_PD_PARK_NS (1000ull * 1000)

typedef enum {
    KVF_PD_REQ_WAITING = 0, /* an engine waits; nothing pushed yet */
    KVF_PD_REQ_RECEIVING,   /* pushes arriving */
    KVF_PD_REQ_READY,       /* final push verified, not claimed */
    KVF_PD_REQ_CLAIMED,     /* handed to an engine by kvf_pd_wait */
    KVF_PD_REQ_ABORTED,     /* kept so a waiter learns why */
} kvf_pd_req_state_t;

struct kvf_pd_req {
    kvf_pd_req_t *next; /* pd->reqs */
    kvf_pd_req_t *prev;
    uint64_t id;
    kvf_pd_req_state_t state;
    kvf_ucx_ep_t *src; /* held: the sender's endpoint */
    uint64_t touched_ns;
    uint64_t footprint; /* region bytes held, the batch's included */
    uint64_t quota_key; /* its sender in pd->quota (0: none yet) */
    uint64_t *offsets;  /* verified chunks, in order */
    uint64_t *lengths;
    uint64_t *checksums; /* what each was verified against */
    uint32_t num;
    uint32_t cap;
    kvf_pd_batch_t *batches; /* pushes in progress, by piece */
    uint32_t num_batches;
    uint32_t next_piece;  /* the piece whose chunks come next (from 1) */
    uint32_t final_piece; /* the final push's piece (0: not seen yet) */
    kvf_status_t reason;  /* ABORTED: why */
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
    KVF_PD_PUSH_LINK,   /* waits (a moment) for the same-host link to its
                           decoder to be proved: its chunks are copied then */
    KVF_PD_PUSH_QUEUED, /* waits for an earlier push of its request: its
                           decoder takes one at a time, or the piece window
                           (KVF_PD_PIECES_MAX) is full */
} kvf_pd_push_state_t;

/* PD_DATA of several chunks: chunks up to KVF_PD_MULTI_CHUNK_MAX bytes go
 * up to KVF_UCX_IOV_MAX and KVF_PD_MULTI_BYTES a message (one
 * rendezvous); larger ones one a message, zero copy. */
#define KVF_PD_MULTI_CHUNK_MAX (128u << 10)
#define KVF_PD_MULTI_BYTES     (4u << 20)

typedef struct kvf_pd_push {
    LIST_ENTRY(kvf_pd_push) link;        /* pd->pushes */
    TAILQ_ENTRY(kvf_pd_push) in_request; /* open->pushes */
    struct kvf_pd_open *open; /* its request's record, until it completes */
    kvf_pd_t *pd;
    uint64_t ticket;
    uint64_t request_id;
    uint32_t piece; /* its place among its request's pushes (PdAlloc) */
    char decoder[KVF_PD_DECODER_MAX];
    char address[64];
    uint32_t decoder_id; /* its node id (0: unknown): the same-host link */
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
    uint32_t inflight;      /* UCX operations not completed */
    uint32_t pending_ctl;   /* controller requests not answered */
    bool is_authenticating; /* waiting for kvf_mesh_connect's callback */
    bool is_link_waiting;   /* kvf_local_region_when will call back */
    bool is_parked;         /* DATA: waits for worker operations */
    uint64_t park_until;    /* parked: when it tries again */
    uint32_t data_next;     /* DATA: the first chunk not sent yet */
    uint64_t link_until;    /* LINK: when it goes over UCX regardless */
    kvf_pd_push_state_t state;
    kvf_status_t status;
    bool is_final;
    bool is_implied; /* the decoder completes the batch without PD_DONE */
    uint64_t bytes;
    uint64_t *offsets;
    uint64_t *lengths;
    uint64_t *checksums;
    kvf_ucx_iov_t *iov; /* per chunk, while chunks are sent several a
                           message (the decoder said multi) */
    const void **srcs;  /* per chunk, where it is read (NULL: the pool);
                           NULL: all from the pool */
    kvf_pd_src_put_cb_t src_put; /* runs once nothing reads srcs */
    void *src_arg;
    uint32_t msgs; /* PD_DATA messages of this push */
    char message[KVF_PD_MESSAGE_SIZE];
} kvf_pd_push_t;

/* A request this agent pushes: numbers its pushes and holds those not
 * completed in piece order (what may go next is decided among them, not
 * among every push); aborted at its decoder when its engine goes away
 * before submitting its final push.
 * Open (in pd->opens by request id, later pushes of the id join it) until
 * its final push succeeded or one failed; freed when also its last push
 * completed. */
typedef struct kvf_pd_open {
    uint64_t request_id;
    void *engine;
    char address[64]; /* "" until its first push found the decoder */
    uint32_t pieces;  /* pushes submitted (the last piece number) */
    bool is_pieces;   /* its decoder orders pushes by piece: several may
                         be in flight (PdAllocReply.pieces) */
    bool is_open;     /* in pd->opens */
    bool has_final;   /* its final push was submitted: every byte of it is
                         the agent's, so it goes on if its engine goes */
    TAILQ_HEAD(kvf_pd_request_pushes, kvf_pd_push) pushes;
} kvf_pd_open_t;

/* A push acknowledged (status 0) but not yet told its sender: acks to one
 * endpoint within one pass of the loop go in one PD_DONE_REPLY. */
typedef struct kvf_pd_ack {
    kvf_ucx_ep_t *ep; /* held */
    uint64_t request_id;
    uint64_t ticket;
} kvf_pd_ack_t;

/* Pushes a PD_DONE_REPLY acknowledges at most (PdDoneReply.more + 1). */
#define KVF_PD_ACKS_MAX 256u

/* Requests by id (UCX's khash): PD_ALLOC, PD_DATA and PD_DONE find theirs
 * in O(1), whatever a flood of requests a peer opened. */
KHASH_MAP_INIT_INT64(kvf_pd_reqs, kvf_pd_req_t *)
/* Region bytes held per sending endpoint (its requests' footprints), for
 * peer_max_bytes. Keyed by the endpoint's address as it was when the
 * request took its first reservation (req->quota_key). */
KHASH_MAP_INIT_INT64(kvf_pd_quota, uint64_t)
/* Pushes this agent sends, by ticket: a reply finds its push in O(1). */
KHASH_MAP_INIT_INT64(kvf_pd_pushes, kvf_pd_push_t *)
/* Requests this agent pushes, by id (kvf_pd_open_t). */
KHASH_MAP_INIT_INT64(kvf_pd_opens, kvf_pd_open_t *)
/* Decoders (node ids) that said PdAllocReply.pieces: every push of a new
 * request to one goes at once, not after the first one's reply. */
KHASH_SET_INIT_INT(kvf_pd_nodes)
#define KVF_PD_PIECES_NODES_MAX 4096u

struct kvf_pd {
    struct kvf_transports *transports; /* expect_transports; NULL: none */
    kvf_mesh_t *mesh;                  /* node directory: decoders' addresses */
    struct kvf_local *local;           /* same-host copies; NULL: none */
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
    bool takes_pieces; /* PdAlloc.piece honoured (pd_pieces) */
    uint64_t alloc_timeout_ns;
    uint64_t push_timeout_ns;
    uint64_t wait_timeout_ns;
    uint64_t claim_timeout_ns;
    char name[128];
    uint64_t next_batch;
    kvf_pd_req_t *reqs; /* every request, for the tick and teardown */
    khash_t(kvf_pd_reqs) reqs_by_id;
    khash_t(kvf_pd_quota) quota;
    uint64_t peer_max_bytes; /* 0: one sender may fill the region */
    uint64_t *scratch;       /* ids of a pass over reqs that may unlink them */
    size_t scratch_cap;
    kvf_pd_batch_t *queue; /* FIFO of reservations waiting for room */
    kvf_pd_batch_t *queue_tail;
    uint32_t queue_len;
    LIST_HEAD(, kvf_pd_push) pushes; /* every push not completed */
    khash_t(kvf_pd_pushes) pushes_by_ticket;
    khash_t(kvf_pd_nodes) pieces_nodes;
    khash_t(kvf_pd_opens) opens;
    struct event *tick_ev;
    uint64_t tick_at_ns;  /* when tick_ev fires (0: not armed) */
    struct event *ack_ev; /* made active by the first ack of a pass */
    kvf_pd_ack_t *acks;   /* acks not sent yet, in completion order */
    size_t num_acks;
    size_t acks_cap;
    kvf_pd_stats_t stats;
    bool is_draining; /* new requests refused; open ones complete */
};

/* pd.c */
/* The one PD timer fires by @p at_ns (monotonic ns) at the latest: every
 * deadline a PD object gets arms it (kvf_pd_tick_arm); each firing acts on
 * what is due and re-arms at the nearest deadline left. No fixed tick. */
void kvf_pd_tick_arm(kvf_pd_t *pd, uint64_t at_ns);
/* @p req saw activity now: its quiet and claim deadlines start again. */
void kvf_pd_req_touch(kvf_pd_t *pd, kvf_pd_req_t *req);

/* pd_send.c */
void kvf_pd_push_maybe_complete(kvf_pd_push_t *push);
/* Frees @p push and gives back what it held (its chunks, its sources);
 * nothing of it may be in flight. Its endpoint is the caller's. */
void kvf_pd_push_free(kvf_pd_push_t *push);
void kvf_pd_push_finish(kvf_pd_push_t *push, kvf_status_t status,
                        const char *fmt, ...) KVF_PRINTF(3, 4);
kvf_status_t kvf_pd_send(kvf_pd_t *pd, kvf_ucx_ep_t *ep, uint16_t type,
                         const ProtobufCMessage *msg, kvf_pd_push_t *push);
void kvf_pd_send_abort(kvf_pd_t *pd, const char *address, uint64_t request_id,
                       kvf_status_t reason);
/* Closes @p open: later pushes of its id open a new request; freed once
 * its last push completed too. */
void kvf_pd_open_close(kvf_pd_t *pd, kvf_pd_open_t *open);
/* Replies count only from the endpoint the push went to (@p ep). */
void kvf_pd_on_alloc_reply(kvf_pd_t *pd, kvf_ucx_ep_t *ep,
                           const Kvf__PdAllocReply *m);
void kvf_pd_on_done_reply(kvf_pd_t *pd, kvf_ucx_ep_t *ep,
                          const Kvf__PdDoneReply *m);
/* Act on what is due at @p now; return the nearest deadline left
 * (UINT64_MAX: none). */
uint64_t kvf_pd_tick_sender(kvf_pd_t *pd, uint64_t now);

/* pd_recv.c */
kvf_pd_req_t *kvf_pd_req_find(kvf_pd_t *pd, uint64_t id);
/* The ids of every request into pd->scratch (grown as needed), so a pass
 * can act on each without restarting when an action unlinks others;
 * returns how many, 0 also when out of memory. */
size_t kvf_pd_req_ids(kvf_pd_t *pd);
void kvf_pd_queue_pump(kvf_pd_t *pd);
void kvf_pd_req_unlink(kvf_pd_t *pd, kvf_pd_req_t *req);
void kvf_pd_req_abort(kvf_pd_t *pd, kvf_pd_req_t *req, kvf_status_t reason,
                      bool tell_sender, const char *why);
/* Sends the acks queued this pass, one PD_DONE_REPLY per endpoint. */
void kvf_pd_acks_flush(kvf_pd_t *pd);
void kvf_pd_on_alloc(kvf_pd_t *pd, kvf_ucx_ep_t *ep, const Kvf__PdAlloc *m);
void kvf_pd_on_done(kvf_pd_t *pd, kvf_ucx_ep_t *ep, const Kvf__PdDone *m);
void kvf_pd_on_abort(kvf_pd_t *pd, kvf_ucx_ep_t *ep, const Kvf__PdAbort *m);
kvf_status_t kvf_pd_on_data(void *arg, const void *header, size_t header_len,
                            const kvf_ucx_am_msg_t *msg);
uint64_t kvf_pd_tick_decoder(kvf_pd_t *pd, uint64_t now);

#endif /* KVF_AGENT_PD_INT_H */
