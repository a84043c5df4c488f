/* SPDX-License-Identifier: Apache-2.0 */
/* Copyright (c) 2026 The kvfabric authors */
/*
 * The traffic counters an agent reports in its heartbeats (NodeTraffic):
 * cumulative since the agent started; the controller shows them in
 * /v1/nodes and never decides anything on them.
 */
#ifndef KVF_PROTO_TRAFFIC_H
#define KVF_PROTO_TRAFFIC_H

#include "proto/msg.h"

#include <stdint.h>

typedef struct kvf_traffic {
    uint64_t lookup_chunks;
    uint64_t lookup_local_chunks;
    uint64_t lookup_remote_chunks;
    uint64_t fetched_chunks;
    uint64_t fetched_bytes;
    uint64_t served_chunks;
    uint64_t served_bytes;
    uint64_t served_from_disk_chunks; /* of served, read from disk first */
} kvf_traffic_t;

/* Fills @p msg (initialized here) from @p t. */
void kvf_traffic_to_msg(const kvf_traffic_t *t, Kvf__NodeTraffic *msg);

/* Fills @p t from @p msg. */
void kvf_traffic_from_msg(const Kvf__NodeTraffic *msg, kvf_traffic_t *t);

#endif /* KVF_PROTO_TRAFFIC_H */
