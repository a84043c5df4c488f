/* SPDX-License-Identifier: Apache-2.0 */
/* Copyright (c) 2026 The kvfabric authors */
/*
 * Peer-to-peer chunk transfer between agents (DESIGN.md §3), over UCX
 * active messages: the requester asks the controller who holds the keys
 * (one LOOKUP, whose reply also names the holders' addresses; none when the
 * engine's own lookup already did, kvf_peer_fetch_from), then asks each
 * holder for its keys (PEER_FETCH); the holder answers each key with a
 * PEER_CHUNK header whose payload is the chunk, sent zero-copy from its
 * registered pool and received by rendezvous straight into a slot of the
 * requester's pool, or, for chunks of up to 128 KiB, up to 64 of them as
 * one PEER_CHUNKS message (one rendezvous, scattered into one slot each).
 * The requester
 * verifies every chunk's checksum before committing it (the commit admits
 * it to the controller); a chunk that fails, was evicted, or whose holder
 * dies or stalls past the deadline is a miss, never wrong bytes.
 *
 * Holders pin what they serve until the send completes, and serve any
 * number of requesters at once.
 *
 * thread: owning loop only.
 */
#ifndef KVF_AGENT_PEER_H
#define KVF_AGENT_PEER_H

#include "agent/ctl_client.h"
#include "agent/mesh.h"
#include "agent/store.h"
#include "transport/ucx.h"

#include <kvfabric/keys.h>
#include <kvfabric/status.h>

#include <stdint.h>

typedef struct kvf_peer kvf_peer_t;

/* A fetch settled: @p fetched chunks are now local, @p missed are not. */
typedef void (*kvf_peer_fetch_cb_t)(void *arg, uint32_t fetched,
                                    uint32_t missed);

typedef struct kvf_peer_params {
    struct event_base *base; /* the worker's loop */
    kvf_mesh_t *mesh;        /* its worker, the node directory */
    kvf_ucx_mem_t *pool_mem; /* the pool, registered */
    kvf_store_t *store;
    uint64_t timeout_ns; /* deadline of one fetch, end to end */
    uint32_t serve_max;  /* chunks sent to peers at once; 0: 4096 */
    const char *name;    /* for logs */
} kvf_peer_params_t;

/* Upper bounds (us) of the fetch latency histogram's buckets; one more
 * bucket counts everything slower. */
#define KVF_PEER_LAT_BUCKETS 12
extern const uint64_t kvf_peer_lat_bounds_us[KVF_PEER_LAT_BUCKETS];

/* Counts @p us in a latency histogram of those buckets (the PD pushes use
 * the same buckets). */
static inline void kvf_peer_lat_record(uint64_t *counts, uint64_t *sum_us,
                                       uint64_t us)
{
    unsigned b;

    for (b = 0; (b < KVF_PEER_LAT_BUCKETS) && (us > kvf_peer_lat_bounds_us[b]);
         b++) {
    }
    counts[b]++;
    *sum_us += us;
}

typedef struct kvf_peer_stats {
    uint64_t
        lat_counts[KVF_PEER_LAT_BUCKETS + 1]; /* per bucket, not cumulative */
    uint64_t lat_sum_us;
    uint64_t fetches;
    uint64_t chunks_fetched;
    uint64_t bytes_fetched;
    uint64_t chunks_missed;
    uint64_t checksum_failures;
    uint64_t timeouts;
    uint64_t chunks_served;
    uint64_t bytes_served;
    uint64_t serve_misses;
    uint64_t bad_reports;      /* peers said a chunk we served was damaged */
    uint64_t serve_busy;       /* keys answered busy: the requester's share of
                                  sends (KVF_PEER_SERVE_PER_PEER), or all
                                  serve_max, were in flight */
    uint64_t served_from_disk; /* of chunks_served, read from disk first */
    uint64_t disk_serve_busy;  /* keys on disk answered busy (asked again):
                                  every disk read slot was in use (also in
                                  serve_busy) */
    uint64_t chunk_messages;   /* chunks received one a message (PEER_CHUNK) */
    uint64_t batch_messages;   /* messages of several chunks (PEER_CHUNKS) */
} kvf_peer_stats_t;

/* Traffic with one other agent. Names come from the peers themselves and
 * are reduced to [A-Za-z0-9._-] (safe as metric labels); past
 * KVF_PEER_LINKS_MAX peers, the rest add up in one row named "other". */
#define KVF_PEER_LINKS_MAX 64

typedef struct kvf_peer_link_stats {
    uint32_t node_id;
    char name[64];
    uint64_t chunks_fetched; /* received from this peer */
    uint64_t bytes_fetched;
    uint64_t chunks_served; /* sent to this peer */
    uint64_t bytes_served;
} kvf_peer_link_stats_t;

kvf_status_t kvf_peer_create(const kvf_peer_params_t *params,
                             kvf_peer_t **peer_p);

/* Frees the service. Destroy the worker first: its destruction completes
 * every operation in flight, and those callbacks still use the service.
 * NULL is a no-op. */
void kvf_peer_destroy(kvf_peer_t *peer);

/* The same-host path (agent/local.h) tried before UCX for each holder;
 * NULL: none. Borrowed: destroy the peer service first. */
struct kvf_local;
void kvf_peer_set_local(kvf_peer_t *peer, struct kvf_local *local);

/* Transport truth (agent/transports.h): requests are served only over
 * connections it accepts; NULL: all. Borrowed. */
struct kvf_transports;
void kvf_peer_set_transports(kvf_peer_t *peer, struct kvf_transports *t);

/* Counts chunks another path (the same-host one) served to node
 * @p node_id named @p name, in the totals and per peer. */
void kvf_peer_count_served(kvf_peer_t *peer, uint32_t node_id, const char *name,
                           uint64_t chunks, uint64_t bytes);

/* The controller connection used to find holders (set once it exists). */
void kvf_peer_set_ctl(kvf_peer_t *peer, kvf_ctl_client_t *ctl);

/*
 * Makes the chunks of @p keys local: asks the controller who holds them,
 * fetches from those holders, verifies and commits each. @p cb runs exactly
 * once, never from inside this call, by the deadline at the latest.
 * KVF_ERR_STATE when no controller is connected (cb not called).
 */
kvf_status_t kvf_peer_fetch(kvf_peer_t *peer, const kvf_key_t *keys,
                            uint32_t num, kvf_peer_fetch_cb_t cb, void *arg);

/*
 * As kvf_peer_fetch, with the holders (one node id per key, 0: none) the
 * caller's own controller LOOKUP named: no second LOOKUP; the holders'
 * addresses come from the node directory (which that LOOKUP's reply
 * filled), NODE_INFO only for one it lacks.
 */
kvf_status_t kvf_peer_fetch_from(kvf_peer_t *peer, const kvf_key_t *keys,
                                 const uint32_t *holders, uint32_t num,
                                 kvf_peer_fetch_cb_t cb, void *arg);

/* Forgets the callbacks of fetches started with @p arg (its owner is going
 * away); the transfers themselves finish or time out on their own. */
void kvf_peer_cancel(kvf_peer_t *peer, const void *arg);

void kvf_peer_get_stats(const kvf_peer_t *peer, kvf_peer_stats_t *stats_p);

/* Per-peer traffic, borrowed until the next call into the service; the
 * count goes to @p num_p. */
const kvf_peer_link_stats_t *kvf_peer_get_links(const kvf_peer_t *peer,
                                                uint32_t *num_p);

#endif /* KVF_AGENT_PEER_H */
