/* SPDX-License-Identifier: Apache-2.0 */
/* Copyright (c) 2026 The kvfabric authors */
/*
 * The agent's Unix socket for engines (libkvfabric): HELLO, the pool fd
 * handed over with SCM_RIGHTS, then ALLOC / COMMIT / LOOKUP / RETRIEVE /
 * RELEASE requests served from the store, and PD push / wait / release
 * (agent/pd.h). A connection that closes or
 * crashes releases every grant and pin it held; a bad frame closes that
 * connection only.
 *
 * thread: owning loop only.
 */
#ifndef KVF_AGENT_ENGINE_SERVER_H
#define KVF_AGENT_ENGINE_SERVER_H

#include "agent/ctl_client.h"
#include "agent/pd.h"
#include "agent/peer.h"
#include "agent/store.h"
#include "common/auth.h"

#include <kvfabric/status.h>

#include <stdint.h>

struct event_base;

typedef struct kvf_engine_server kvf_engine_server_t;

typedef struct kvf_engine_server_params {
    struct event_base *base;
    const char *path;           /* socket path; a stale file is replaced */
    kvf_store_t *store;         /* borrowed; outlives the server */
    kvf_peer_t *peer;           /* borrowed, may be NULL: no remote fetch */
    kvf_pd_t *pd;               /* borrowed, may be NULL: no PD push/wait */
    kvf_ctl_client_t *ctl;      /* borrowed, may be NULL: no remote lookup */
    uint64_t lookup_timeout_ns; /* the controller's share of an engine
                                   lookup; past it, local hits only (0: the
                                   controller client's request timeout) */
    uint64_t lease_ns;          /* a prefetched hit stays pinned this long
                                   waiting for the retrieve (0: 10 s) */
    const char *node_name;      /* told to engines */
    uint32_t max_frame;
    uint32_t max_connections;
    const kvf_auth_secret_t *secret; /* borrowed; NULL/empty: no auth */
    uint64_t staging_size; /* each engine's writable staging area (0: 256
                              MiB; at least the largest chunk) */
} kvf_engine_server_params_t;

typedef struct kvf_engine_server_stats {
    uint64_t connections; /* accepted, total */
    uint64_t active;      /* open now */
    uint64_t requests;
    uint64_t protocol_errors;
    uint64_t auth_failures; /* connections refused by the handshake */
    uint64_t staging_full;  /* allocations/PD claims refused: an engine's
                               staging area was full */
    uint64_t claim_checksum_failures; /* PD claims refused: a chunk changed
                                         in the receive region after it was
                                         verified */
    uint64_t lookups;
    uint64_t lookup_keys;
    uint64_t local_hit_keys;
    uint64_t remote_hit_keys; /* lookups: held by another node */
    uint64_t fetched_keys;    /* retrieves: fetched from peers */
    uint64_t leases;          /* prefetch leases held now */
    uint64_t leases_used;     /* ended by the engine's retrieve */
    uint64_t lease_expiries;  /* ended by prefetch_lease, never retrieved */
} kvf_engine_server_stats_t;

/* Binds the socket and starts accepting. KVF_ERR_EXISTS when another agent
 * is serving at @p path; KVF_ERR_IO with the reason logged otherwise. */
kvf_status_t kvf_engine_server_create(const kvf_engine_server_params_t *params,
                                      kvf_engine_server_t **server_p);

/* Closes every connection (releasing their grants and pins), stops
 * listening and removes the socket file. NULL is a no-op. */
void kvf_engine_server_destroy(kvf_engine_server_t *server);

/* Ends every prefetch lease whose time is up (its pins are dropped);
 * returns how many. Call it from a timer. */
uint64_t kvf_engine_server_expire_leases(kvf_engine_server_t *server,
                                         uint64_t now_ns);

/* Serves @p len bytes as if one new engine connection had sent them, then
 * closes it; replies go to a socket nobody reads (fuzzing, tests). */
void kvf_engine_server_feed(kvf_engine_server_t *server, const void *data,
                            size_t len);

/* With a secret, closes the connections that have not authenticated
 * within KVF_ENGINE_HANDSHAKE_NS of @p now_ns (counted in auth_failures).
 * NULL is a no-op. */
#define KVF_ENGINE_HANDSHAKE_NS (10ull * 1000000000ull)
void kvf_engine_server_expire_handshakes(kvf_engine_server_t *server,
                                         uint64_t now_ns);

void kvf_engine_server_get_stats(const kvf_engine_server_t *server,
                                 kvf_engine_server_stats_t *stats_p);

#endif /* KVF_AGENT_ENGINE_SERVER_H */
