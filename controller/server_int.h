/* SPDX-License-Identifier: Apache-2.0 */
/* Copyright (c) 2026 The kvfabric authors */
/* The server's state, shared by server.c, conn.c and handlers.c
 * (controller/ only; data, no functions); HTTP reads a kvf_server_stats_t
 * (stats.h) instead. */
#ifndef KVF_CONTROLLER_SERVER_INT_H
#define KVF_CONTROLLER_SERVER_INT_H

#include "common/auth.h"
#include "common/listen.h"
#include "controller/events.h"
#include "controller/http.h"
#include "controller/index.h"
#include "controller/node.h"
#include "controller/registry.h"
#include "controller/server.h"
#include "controller/stats.h"
#include "proto/evconn.h"
#include "proto/msg.h"

#include <stdbool.h>
#include <stdint.h>

struct evconnlistener;
struct ssl_ctx_st;
struct event;

/* the decode arena: a frame's message unpacks here */
#define KVF_SERVER_ARENA_SIZE (256u << 10)

typedef struct kvf_conn kvf_conn_t;
struct kvf_frame;

/* Keys pinned cluster-wide by kvfctl, packed; delivered to every node that
 * registers later too. */
typedef struct kvf_server_pins {
    uint8_t *keys;
    size_t len;
} kvf_server_pins_t;

struct kvf_server {
    const kvf_controller_config_t *cfg;
    /* answers a frame (handlers.c: kvf_server_dispatch) */
    kvf_status_t (*dispatch)(kvf_conn_t *conn, struct kvf_frame *frame);
    struct event_base *base;
    struct evconnlistener *listener;
    kvf_http_t *http;
    struct event *sig_term;
    struct event *sig_int;
    struct event *tick;
    struct event *purge;
    kvf_registry_t *reg;
    kvf_node_table_t *nodes;
    kvf_index_t *index;    /* what routers query over HTTP */
    kvf_events_t *events;  /* NULL: no KV event stream */
    uint32_t *event_nodes; /* ids with events since their last CLEARED */
    size_t num_event_nodes;
    size_t cap_event_nodes;
    kvf_conn_t *conns; /* doubly linked, newest first */
    uint64_t num_conns;
    uint64_t last_shed_log_ms;
    kvf_listen_guard_t listen_guard; /* the control port's accept errors */
    kvf_server_counters_t ctr;
    uint64_t start_ms;
    bool is_recovering;
    bool has_registrations;
    kvf_server_pins_t pins[2]; /* [0] hard, [1] soft: what a new node gets */
    kvf_evconn_group_t group;  /* settings, bytes held, decode arena */
    /* lookup scratch (max_batch keys) */
    uint16_t *slots;
    uint8_t *holders;
    uint8_t *media;           /* LOOKUP_REPLY media, max_batch bytes */
    kvf_auth_secret_t secret; /* empty: authentication off */
    struct ssl_ctx_st *tls;   /* NULL: plain TCP */
    char listen_addr[300];
    uint64_t term; /* leader term with HA on etcd, else 0 */
    const _Atomic uint64_t *serve_until_ns; /* NULL: no HA */
};

#endif /* KVF_CONTROLLER_SERVER_INT_H */
