/* SPDX-License-Identifier: Apache-2.0 */
/* Copyright (c) 2026 The kvfabric authors */
/*
 * The agent's HTTP port: /healthz (503 until registered), /metrics
 * (Prometheus text, common/prom.h) and /v1/inventory. It reads the
 * agent's services through kvf_agent_http_source_t only, so it does not
 * include agent.c's state.
 *
 * thread: the agent's loop only. Ownership: everything in the source is
 * borrowed and must outlive the HTTP object.
 */
#ifndef KVF_AGENT_HTTP_H
#define KVF_AGENT_HTTP_H

#include "agent/ctl_client.h"
#include "agent/disk.h"
#include "agent/engine_server.h"
#include "agent/local.h"
#include "agent/mesh.h"
#include "agent/pd.h"
#include "agent/peer.h"
#include "agent/store.h"
#include "agent/transports.h"
#include "transport/ucx.h"

#include <kvfabric/status.h>

#include <stdbool.h>
#include <stdint.h>

struct event_base;

typedef struct kvf_agent_http kvf_agent_http_t;

/* The agent's own figures, read per request. */
typedef struct kvf_agent_http_state {
    bool is_stopping;
    bool is_draining; /* the controller asked this node to leave */
    /* REPLICATE commands: chunks asked, then fetched or missed */
    uint64_t replicate_asked;
    uint64_t replicate_fetched;
    uint64_t replicate_missed;
} kvf_agent_http_state_t;

/* What HTTP reads of the agent. */
typedef struct kvf_agent_http_source {
    const char *name; /* the node's name */
    int role;         /* kvf_agent_role_name() */
    kvf_ctl_client_t *ctl;
    kvf_store_t *store;
    kvf_disk_t *disk; /* NULL: no disk tier */
    kvf_engine_server_t *engines;
    kvf_peer_t *peer;
    kvf_pd_t *pd;
    kvf_ucx_worker_t *worker;
    kvf_mesh_t *mesh;
    kvf_local_t *local;                 /* NULL: no same-host path */
    const kvf_transports_t *transports; /* transport truth */
    void (*state)(void *arg, kvf_agent_http_state_t *state);
    void *arg;
} kvf_agent_http_source_t;

/* Serves HTTP on @p addr (HOST:PORT); with @p addr empty, nothing (and
 * *@p http_p is NULL). */
kvf_status_t kvf_agent_http_create(const char *addr, struct event_base *base,
                                   const kvf_agent_http_source_t *src,
                                   kvf_agent_http_t **http_p);

/* NULL is a no-op. */
void kvf_agent_http_destroy(kvf_agent_http_t *http);

/* The bound port (0: HTTP off). */
uint16_t kvf_agent_http_bound_port(const kvf_agent_http_t *http);

#endif /* KVF_AGENT_HTTP_H */
