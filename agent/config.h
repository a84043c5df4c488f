/* SPDX-License-Identifier: Apache-2.0 */
/* Copyright (c) 2026 The kvfabric authors */
/*
 * kvf-agent configuration: the keys of docs/configuration.md "kvf-agent".
 *
 * thread: loaded once at startup; read-only afterwards.
 */
#ifndef KVF_AGENT_CONFIG_H
#define KVF_AGENT_CONFIG_H

#include "common/config.h"

#include <stdbool.h>
#include <stdint.h>

typedef enum {
    KVF_AGENT_ROLE_BOTH    = 0,
    KVF_AGENT_ROLE_PREFILL = 1,
    KVF_AGENT_ROLE_DECODE  = 2,
} kvf_agent_role_t;

typedef struct kvf_agent_config {
    char *controller;          /* HOST:PORT of kvf-controller */
    char *etcd;                /* etcd endpoints: the leader is found there */
    char *etcd_prefix;         /* the controllers' --etcd-prefix */
    char *name;                /* node name, unique in the cluster */
    int role;                  /* kvf_agent_role_t */
    uint64_t pool_size;        /* bytes of the shared chunk pool */
    uint64_t max_chunk;        /* largest chunk an engine may store */
    bool pool_prefault;        /* allocate the pool's pages at start */
    char *disk_path;           /* disk tier slot file; "": no disk tier */
    uint64_t disk_size;        /* bytes of the slot file */
    uint64_t disk_queue_depth; /* write-behind buffers, reads in flight */
    bool disk_flush_on_stop;   /* a clean stop spills the pool to disk */
    uint64_t grant_timeout;    /* ns: uncommitted allocations taken back */
    /* bytes: each engine's writable staging area */
    uint64_t engine_staging_size;
    uint64_t copy_threads;    /* copier workers besides the loop */
    uint64_t ucx_max_ops;     /* UCX operations in flight at once */
    uint64_t peer_serve_max;  /* chunks sent to peers at once */
    int eviction;             /* kvf_pool_policy_t: lru, lfu, fifo */
    char *socket;             /* Unix socket path for engines */
    char *listen;             /* HOST:PORT of the peer (UCX) service */
    char *http;               /* HOST:PORT of /healthz and /metrics */
    char *instance_id;        /* engine instance (TP group) */
    uint64_t tp_rank;         /* this worker's tensor-parallel rank */
    uint64_t tp_world;        /* tensor-parallel world size */
    char *net_devices;        /* UCX_NET_DEVICES, comma-separated */
    char *transports;         /* UCX_TLS, comma-separated */
    char *expect_transports;  /* refuse peers over others; "": no check */
    uint64_t connect_timeout; /* ns */
    uint64_t request_timeout; /* ns */
    uint64_t fetch_timeout;   /* ns: a peer fetch, end to end */
    bool same_host;           /* copy from same-host agents (agent/local.h) */
    uint64_t lookup_timeout;  /* ns: controller part of an engine lookup */
    uint64_t prefetch_lease;  /* ns: a prefetched hit stays pinned this long */
    uint64_t reconnect_max;   /* ns: ceiling of the reconnect backoff */
    uint64_t admit_flush;     /* ns: ADMIT/EVICT coalescing window */
    uint64_t max_frame;       /* bytes */
    /* bytes of the PD receive region one sender may hold (0: all) */
    uint64_t pd_peer_max_bytes;
    uint64_t pd_buffer_size;   /* PD receive region (decode, both); 0: none */
    char *pd_buffer_device;    /* "": host memory; "cuda:N": GPU N */
    uint64_t pd_queue_max;     /* PD reservations that may wait for room */
    bool pd_pieces;            /* several pushes of a request at once */
    uint64_t pd_alloc_timeout; /* ns: how long one may wait */
    uint64_t pd_push_timeout;  /* ns: a push end to end; a quiet sender */
    uint64_t pd_wait_timeout;  /* ns: default of an engine's PD wait */
    uint64_t pd_claim_timeout; /* ns: received requests nobody claims */
    char *log_level;
    char *cluster_secret_file; /* empty: no authentication */
    char *tls_ca;              /* controller's CA; empty: plain TCP */
    char *tls_server_name;     /* name checked in its certificate */
    bool list_devices;         /* CLI only: list RDMA devices and exit */
    bool replace;              /* CLI only: take a held name over */
    bool print_config;         /* CLI only: print the effective config */
} kvf_agent_config_t;

extern const kvf_config_schema_t kvf_agent_config_schema;

/* Name of a role as the config and the wire spell it ("both"). */
const char *kvf_agent_role_name(int role);

#endif /* KVF_AGENT_CONFIG_H */
