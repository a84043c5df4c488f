/* SPDX-License-Identifier: Apache-2.0 */
/* Copyright (c) 2026 The kvfabric authors */
/*
 * The controller's counters and the snapshot of them that HTTP reads
 * (controller/ only): the server fills a kvf_server_stats_t when /metrics
 * or /v1/stats asks, so http.c never sees the server's insides.
 */
#ifndef KVF_CONTROLLER_STATS_H
#define KVF_CONTROLLER_STATS_H

#include "controller/registry.h"
#include "proto/msg.h"

#include <stdbool.h>
#include <stdint.h>

#define KVF_SERVER_LAT_BUCKETS 12

/* Upper bounds of the latency buckets, in microseconds. */
extern const uint64_t kvf_server_lat_bounds_us[KVF_SERVER_LAT_BUCKETS];

/* A latency histogram: each observation counted in its first bucket. */
typedef struct kvf_server_latency {
    uint64_t count;
    uint64_t sum_ns;
    uint64_t buckets[KVF_SERVER_LAT_BUCKETS]; /* not cumulative */
} kvf_server_latency_t;

void kvf_server_latency_observe(kvf_server_latency_t *lat, uint64_t ns);

typedef struct kvf_server_counters {
    uint64_t admits; /* keys */
    uint64_t evicts; /* keys */
    uint64_t inventory_keys;
    uint64_t lookups; /* requests */
    uint64_t lookup_keys;
    uint64_t lookup_hit_chunks;
    uint64_t lookup_miss_chunks;
    uint64_t protocol_errors;
    uint64_t auth_failures;      /* connections refused by the handshake */
    uint64_t tls_failures;       /* TLS handshakes that failed */
    uint64_t handshake_timeouts; /* closed before authenticating in time */
    uint64_t stale_rejects;
    uint64_t seq_gaps;
    uint64_t backpressure;
    uint64_t connections_total;
    uint64_t buffer_closes;        /* closed: over max_buffered(_preauth) */
    kvf_server_latency_t requests; /* framed requests answered */
} kvf_server_counters_t;

/* What /metrics and /v1/stats print, copied when they ask. */
typedef struct kvf_server_stats {
    kvf_server_counters_t ctr;
    kvf_registry_stats_t reg;
    Kvf__StatsReply reply; /* the one stats schema (STATS, kvfctl stats) */
    uint32_t nodes_alive;
    uint32_t nodes_draining;
    uint32_t nodes_dead;
    bool is_recovering;
    uint64_t term;
    uint64_t connections;
    uint64_t buffered;         /* bytes charged by all connections */
    uint64_t buffered_preauth; /* of those, by unauthenticated ones */
    uint64_t accept_errors;    /* the control port's */
    uint64_t events_published;
    uint64_t events_dropped;
    kvf_server_latency_t index; /* /v1/index/query and /v1/route */
} kvf_server_stats_t;

#endif /* KVF_CONTROLLER_STATS_H */
