/* SPDX-License-Identifier: Apache-2.0 */
/* Copyright (c) 2026 The kvfabric authors */
/*
 * Transport truth (docs/operations.md): which UCX transport and device
 * each peer connection really runs on. The first message from a peer over
 * a connection logs them ("peer node N (name) over tcp/lo"), /metrics
 * shows them per peer (kvf_agent_peer_transport_info), and with
 * expect_transports set a connection using anything else is refused: its
 * requests are answered with errors, never served, counted, and logged
 * naming what was found. Users of RDMA fabrics otherwise learn of a
 * silent fallback to TCP from their throughput weeks later.
 *
 * thread: owning loop only.
 */
#ifndef KVF_AGENT_TRANSPORTS_H
#define KVF_AGENT_TRANSPORTS_H

#include "transport/ucx.h"

#include <stdbool.h>
#include <stdint.h>

/* Peers shown; past it the rest share the last row. */
#define KVF_TRANSPORTS_PEERS_MAX 64

/* kvf_transports_summary's buffer: the controller takes at most 63
 * characters (Heartbeat.transports). */
#define KVF_TRANSPORTS_SUMMARY_MAX 64

/* A peer row no message came through for this many kvf_transports_age
 * calls (heartbeats) is left out of the summary: a connection that has
 * gone quiet (the peer left, or was reached over something else since)
 * stops being reported. */
#define KVF_TRANSPORTS_IDLE_MAX 30

typedef struct kvf_transports_peer {
    char name[64];       /* the peer's node name, or "node-N" */
    char transports[96]; /* as kvf_ucx_ep_transports writes them */
    bool refused;        /* not among expect_transports */
    uint64_t uses;       /* messages checked on it */
    uint64_t uses_aged;  /* uses at the last kvf_transports_age */
    uint32_t idle;       /* kvf_transports_age calls without a use */
} kvf_transports_peer_t;

typedef struct kvf_transports {
    char agent[128];  /* for logs */
    char expect[256]; /* comma-separated; empty: anything goes */
    uint64_t refused; /* messages refused over an unexpected transport */
    char last[96];    /* what the last connection checked runs on */
    /* the last connection checked and its verdict: messages of one fetch
     * arrive on one endpoint, so the per-chunk check is a compare */
    const kvf_ucx_ep_t *last_ep;
    uint32_t last_node;
    uint32_t last_row; /* its row in peers */
    bool last_ok;
    uint32_t num_peers;
    kvf_transports_peer_t peers[KVF_TRANSPORTS_PEERS_MAX];
} kvf_transports_t;

/* @p expect: the expect_transports list (NULL or "": no check). */
void kvf_transports_init(kvf_transports_t *t, const char *agent,
                         const char *expect);

/*
 * A message from peer @p node_id (named @p name; both unknown: 0 and NULL,
 * and the row is named after the connection's address) came
 * on @p ep: records (and on a change logs) what the connection uses.
 * false when it may not be served: not one of expect_transports (counted,
 * logged with what was found), or UCX cannot say while a list is set.
 */
bool kvf_transports_check(kvf_transports_t *t, kvf_ucx_ep_t *ep,
                          uint32_t node_id, const char *name);

/* What the connection of the last kvf_transports_check runs on ("?"
 * when UCX did not say), for error messages. */
const char *kvf_transports_last(const kvf_transports_t *t);

/* Once per heartbeat: counts, per peer row, the calls since a message
 * last came through it (KVF_TRANSPORTS_IDLE_MAX). */
void kvf_transports_age(kvf_transports_t *t);

/*
 * The distinct transport names (devices left out) of every peer row in
 * use (not idle for KVF_TRANSPORTS_IDLE_MAX heartbeats), sorted and
 * comma-separated, into @p buf of @p len bytes: "tcp", "rc_mlx5,tcp"; ""
 * before any peer. Refused rows count: the connection ran over it all the
 * same. Names that do not fit are left out and the summary ends in ",+"
 * ("+" alone when not even the first fits). For the heartbeat (`kvfctl
 * nodes`, TRANSPORTS).
 */
void kvf_transports_summary(const kvf_transports_t *t, char *buf, size_t len);

#endif /* KVF_AGENT_TRANSPORTS_H */
