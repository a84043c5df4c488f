/* SPDX-License-Identifier: Apache-2.0 */
/* Copyright (c) 2026 The kvfabric authors */
/*
 * PD mode (DESIGN.md §6): prefill agents push a request's chunks straight
 * into a decoder agent's receive region; decode engines wait for them.
 *
 * Sender (prefill) side, per kvf_pd_push_submit: resolve the decoder by name
 * (controller NODE_INFO, cached) -> PD_ALLOC -> PD_ALLOC_REPLY (slots
 * reserved, perhaps after queueing) -> one PD_DATA active message per chunk,
 * its payload sent zero-copy from the pool by rendezvous straight into the
 * reserved slot (chunks of up to 128 KiB up to 64 a PD_DATA when the
 * decoder says multi: one rendezvous scattered into their slots) -> PD_DONE
 * with the checksums -> PD_DONE_REPLY once the decoder verified them. The push
 * reports success only then: the bytes landed, not just left. Any failure
 * aborts the PD request (PD_ABORT) so the decoder frees its slots and its
 * waiter learns at once.
 *
 * Receiver (decoder) side: reservations come from the region's slot
 * allocator (agent/pd_region.h); when it is full they queue FIFO, bounded,
 * each with a deadline. A request becomes ready when its final push
 * verified; kvf_pd_wait hands its slots, in push order, to one engine
 * connection, which releases them. Ready requests nobody claims are
 * reclaimed after claim_timeout; requests whose sender went quiet (or whose
 * endpoint failed) are aborted and their slots reclaimed.
 *
 * thread: owning loop only.
 */
#ifndef KVF_AGENT_PD_H
#define KVF_AGENT_PD_H

#include "agent/ctl_client.h"
#include "agent/mesh.h"
#include "agent/peer.h"
#include "agent/store.h"
#include "transport/ucx.h"

#include <kvfabric/kvfabric.h>
#include <kvfabric/status.h>

#include <stdbool.h>
#include <stdint.h>

typedef struct kvf_pd kvf_pd_t;

/* A push settled. @p message says why when @p status is not KVF_OK (valid
 * during the call only). */
typedef void (*kvf_pd_push_cb_t)(void *arg, kvf_status_t status,
                                 const char *message);

/* A wait settled: on KVF_OK @p slots (offsets in the engine's mapping) are
 * the request's chunks in order, valid during the call only. */
typedef void (*kvf_pd_wait_cb_t)(void *arg, kvf_status_t status,
                                 const char *message, const kvf_slot_t *slots,
                                 const uint64_t *checksums, uint32_t num);

typedef struct kvf_pd_params {
    struct event_base *base;
    kvf_mesh_t *mesh;        /* its worker, the node directory */
    kvf_ucx_mem_t *pool_mem; /* the pool mapping, registered */
    kvf_store_t *store;
    /* receive region; size 0: this agent receives no pushes */
    void *region_base;               /* its address here */
    uint64_t region_offset;          /* its offset in the engines' mapping */
    uint64_t region_size;            /* bytes */
    const kvf_ucx_mem_t *region_mem; /* the registration covering it */
    bool region_is_device;           /* GPU memory: verify via a copy */
    uint32_t queue_max;              /* reservations that may wait */
    bool takes_pieces; /* several pushes of a request at once (pd_pieces) */
    uint64_t peer_max_bytes;   /* receive region one sender may
                                  hold (0: all of it) */
    uint64_t alloc_timeout_ns; /* how long one may wait */
    uint64_t push_timeout_ns;  /* a push, end to end; also how long
                                  a decoder waits for a quiet sender */
    uint64_t wait_timeout_ns;  /* default of kvf_pd_wait */
    uint64_t claim_timeout_ns; /* ready requests nobody claims */
    const char *name;          /* for logs */
} kvf_pd_params_t;

typedef struct kvf_pd_stats {
    uint64_t lat_counts[KVF_PEER_LAT_BUCKETS + 1]; /* push latency */
    uint64_t lat_sum_us;
    uint64_t pushes;        /* pushes acknowledged by their decoder */
    uint64_t push_failures; /* pushes that failed */
    /* pushes refused because their request's earlier pushes are not here
     * (EnginePdPush.piece: one failed, or this agent restarted) */
    uint64_t pieces_refused;
    uint64_t bytes_sent;
    uint64_t batches_received; /* pushes received and verified */
    uint64_t bytes_received;
    uint64_t requests_ready;
    uint64_t alloc_waits;    /* reservations that had to queue */
    uint64_t alloc_timeouts; /* of those, timed out */
    uint64_t aborts;         /* requests aborted here (decoder) */
    uint64_t reclaimed;      /* ready requests never claimed */
    uint64_t checksum_failures;
    uint64_t quota_refusals; /* pushes refused: their sender held
                                peer_max_bytes of the region */
    uint64_t queue_depth;    /* reservations waiting now */
    uint64_t requests;       /* requests held now */
    uint64_t region_size;
    uint64_t region_used;
    uint64_t data_messages;  /* PD_DATA received with one chunk */
    uint64_t multi_messages; /* PD_DATA received with several (one
                                rendezvous) */
    uint64_t copied_pushes;  /* sent by memcpy into a same-host decoder */
    uint64_t copied_bytes;
    uint64_t copied_batches; /* received that way (verified or not) */
    uint64_t implied_done;   /* received pushes completed by their last
                                chunk, without PD_DONE */
    uint64_t acks;           /* received pushes acknowledged (status 0) */
    uint64_t ack_messages;   /* PD_DONE_REPLYs that carried those acks */
    uint64_t overlapped;     /* received pushes that arrived while another
                                of their request was in progress */
    uint64_t reordered;      /* of those, verified before an earlier piece
                                and held until it came */
    uint64_t queued;         /* pushes that waited here for an earlier one
                                of their request (sender side) */
    uint64_t parked;         /* times a push's data waited for the worker's
                                operations to free up (sender side) */
} kvf_pd_stats_t;

/* Registers the PD active-message handlers on the worker. */
kvf_status_t kvf_pd_create(const kvf_pd_params_t *params, kvf_pd_t **pd_p);

/* Frees everything. Destroy the worker first (its destruction completes
 * every operation in flight, whose callbacks use this object). NULL: no-op.
 */
void kvf_pd_destroy(kvf_pd_t *pd);

/* The controller connection used to find decoders by name. */
void kvf_pd_set_ctl(kvf_pd_t *pd, kvf_ctl_client_t *ctl);

/* Transport truth (agent/transports.h): PD_ALLOC is answered
 * KVF_ERR_UNSUPPORTED over a connection it refuses. NULL: no check. */
struct kvf_transports;
void kvf_pd_set_transports(kvf_pd_t *pd, struct kvf_transports *t);

/* The same-host path (agent/local.h): pushes to a decoder on this host
 * copy into its receive region instead of going over UCX, and a decoder
 * accepts such pushes from the agents it passed its region to. NULL: none.
 */
struct kvf_local;
void kvf_pd_set_local(kvf_pd_t *pd, struct kvf_local *local);

/* A draining decoder refuses new PD requests with KVF_ERR_STATE and a
 * message saying it is draining; requests already open complete. */
void kvf_pd_set_draining(kvf_pd_t *pd, bool is_draining);

/* Nothing reads a push's staging sources any more (kvf_pd_push_args_t). */
typedef void (*kvf_pd_src_put_cb_t)(void *arg);

/*
 * Engines: @c engine below is an opaque identity of an engine connection
 * (the one that pushes, waits, claims and releases), @c arg the argument of
 * one callback.
 */
typedef struct kvf_pd_push_args {
    void *engine;
    /* the chunks are grants or pins of owner at offsets (pool offsets,
     * lengths up to their chunk's); they move to the push while it runs and
     * back afterwards */
    kvf_store_owner_t *owner;
    const uint64_t *offsets;
    const uint64_t *lengths;
    const uint64_t *checksums; /* the engine's, checked by the decoder */
    uint32_t num;
    uint64_t request_id; /* the PD request */
    const char *decoder; /* the decoder agent's name */
    bool is_final;       /* the request's last push */
    uint32_t piece; /* the engine's place of this push, 1, 2, ...; 0: none */
    /* Where chunk i's bytes are read when not in the pool: srcs[i] (a
     * confined engine's staging block, agent/engine_server.c). NULL, or a
     * NULL entry: the pool at its offset. They must stay mapped until
     * src_put(src_arg) runs, exactly once, when UCX no longer reads them
     * (also when kvf_pd_push_submit fails). The engine may still change
     * them under the send: the decoder verifies every chunk against the
     * engine's checksum, so that fails this push and nothing else. */
    const void *const *srcs;
    kvf_pd_src_put_cb_t src_put;
    void *src_arg;
    kvf_pd_push_cb_t cb;
    void *arg;
} kvf_pd_push_args_t;

/*
 * Pushes @p args->num chunks of a PD request to the decoder agent named
 * @p args->decoder. @c cb runs exactly once, never from inside this call,
 * by the push deadline at the latest. Immediate failures are returned (cb
 * not called): KVF_ERR_INVALID, KVF_ERR_RANGE (an offset @c owner does not
 * hold, or a length over its chunk), KVF_ERR_NO_MEMORY.
 */
kvf_status_t kvf_pd_push_submit(kvf_pd_t *pd, const kvf_pd_push_args_t *args);

/*
 * Waits (0: the default timeout) until request @p request_id is complete
 * and verified, then claims it for @p engine and calls @p cb with its slots.
 * @p cb runs exactly once, possibly from inside this call. Failures through
 * @p cb: KVF_ERR_TIMEOUT, KVF_ERR_CANCELED (aborted), KVF_ERR_BUSY (another
 * engine waits for or claimed it), KVF_ERR_UNSUPPORTED (no region).
 */
void kvf_pd_wait_submit(kvf_pd_t *pd, void *engine, uint64_t request_id,
                        uint64_t timeout_ns, kvf_pd_wait_cb_t cb, void *arg);

/* Frees request @p request_id's slots (and aborts it if not complete).
 * KVF_ERR_NOT_FOUND; KVF_ERR_BUSY (claimed by another engine). */
kvf_status_t kvf_pd_request_release(kvf_pd_t *pd, void *engine,
                                    uint64_t request_id);

/* @p engine is going away: its waits are dropped, its
 * claimed requests released, its pushes finish without calling back and
 * its unfinished requests are aborted at their decoders. */
void kvf_pd_cancel(kvf_pd_t *pd, void *engine);

/* An endpoint failed: requests being pushed from it are aborted. */
void kvf_pd_ep_failed(kvf_pd_t *pd, kvf_ucx_ep_t *ep);

void kvf_pd_get_stats(const kvf_pd_t *pd, kvf_pd_stats_t *stats_p);

/* Region offset in the engines' mapping and size (0: no region), and the
 * push deadline, for POOL_INFO. */
void kvf_pd_region_info(const kvf_pd_t *pd, uint64_t *offset_p,
                        uint64_t *size_p, uint64_t *push_timeout_ns_p);

#endif /* KVF_AGENT_PD_H */
