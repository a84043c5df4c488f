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
#include <sys/queue.h>

struct evconnlistener;
struct ssl_ctx_st;
struct event;

/* the decode arena: a frame's message unpacks here */
#define KVF_SERVER_ARENA_SIZE (256u << 10)

typedef struct kvf_conn kvf_conn_t;
typedef struct kvf_replica kvf_replica_t;

#define KVF_REPLICA_MAX_FOLLOWERS 8

/* A standby following this leader (controller/replica.c). */
typedef struct kvf_replica_follower {
    kvf_conn_t *conn;
    char name[128];    /* its HTTP address, as it said in FOLLOW */
    uint64_t since_ms; /* when it began to follow */
    bool is_dropped;   /* fell too far behind: closed on the next tick */
} kvf_replica_follower_t;
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
    LIST_HEAD(, kvf_conn) conns; /* newest first */
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
    /* HA warm standby (controller/replica.c) */
    bool is_standby;        /* follows the leader; control port not bound */
    kvf_replica_t *replica; /* a standby's stream from the leader */
    kvf_replica_follower_t followers[KVF_REPLICA_MAX_FOLLOWERS];
    Kvf__StandbyDesc standby_descs[KVF_REPLICA_MAX_FOLLOWERS]; /* STATS */
    Kvf__StandbyDesc *standby_ptrs[KVF_REPLICA_MAX_FOLLOWERS];
    uint64_t failovers[2]; /* elected with [0] a warm copy, [1] without */
    struct evbuffer *replica_out; /* a forwarded frame, packed once */
    unsigned num_followers;
    uint64_t replica_death_ms;     /* deaths before this were forwarded */
    struct kvf_election *election; /* NULL: no HA */
    bool is_quit;                  /* SIGTERM/SIGINT seen */
    /* HA state kept in etcd (controller/hastate.c) */
    char *ha_drained;      /* names drained by kvfctl, each ending '\n' */
    bool is_ha_dirty;      /* pins or ha_drained not yet in etcd */
    uint64_t ha_warned_ms; /* last warning that etcd did not take them */
};

/* A connection of the server: queue a frame, written on the next loop
 * turn (a standby's stream); bytes still queued; its server; close now. */
kvf_status_t kvf_server_conn_push(kvf_conn_t *conn, uint16_t type,
                                  const ProtobufCMessage *msg);
kvf_status_t kvf_server_conn_push_raw(kvf_conn_t *conn, const void *data,
                                      size_t len);
size_t kvf_server_conn_queued(const kvf_conn_t *conn);
kvf_server_t *kvf_server_conn_server(const kvf_conn_t *conn);
void kvf_server_conn_close(kvf_conn_t *conn);

/* NODE_INFO's description of @p node (borrowing its strings). */
void kvf_server_node_desc(kvf_server_t *server, kvf_node_t *node, uint64_t now,
                          Kvf__NodeDesc *d);

/* PIN / SOFT_PIN / UNPIN of packed keys in the cluster-wide pin sets. */
kvf_status_t kvf_server_pins_set(kvf_server_t *server, Kvf__CommandType type,
                                 const uint8_t *keys, size_t len);

/*
 * HA warm standby (controller/replica.c, docs/architecture.md "Warm
 * standby"). Leader side: a standby's ADMIN_COMMAND FOLLOW turns its
 * connection into a stream: a snapshot (NODE_INFO_REPLY of every node,
 * INVENTORY of each node's keys, PIN/SOFT_PIN of the pin sets, then a
 * STATUS "warm"), then every change as it is applied (the agents' ADMIT,
 * EVICT and INVENTORY frames as they came, a NODE_INFO_REPLY per node
 * that registered, died or (un)drained, the pin commands, CLEAR).
 */
kvf_status_t kvf_replica_follow(kvf_conn_t *conn, const Kvf__AdminCommand *ac);
/* On the leader's tick: closes followers too far behind, sends the rest
 * a "tick" STATUS (their lag clock). */
void kvf_replica_tick(kvf_server_t *server);
/* The HA fields of STATS (role, term, standbys...). */
void kvf_replica_stats_fill(kvf_server_t *server, Kvf__StatsReply *rep);
void kvf_replica_forward(kvf_server_t *server, uint16_t type,
                         const ProtobufCMessage *msg);
void kvf_replica_forward_node(kvf_server_t *server, kvf_node_t *node);
void kvf_replica_forward_deaths(kvf_server_t *server);
void kvf_replica_pins_changed(kvf_server_t *server,
                              const Kvf__AdminCommand *ac);
void kvf_replica_drop(kvf_server_t *server, kvf_conn_t *conn);

/* A node the previous leader knew registering again with the same
 * incarnation (it follows the new leader): KVF_OK with that node, its id
 * and holdings kept; KVF_ERR_NOT_FOUND otherwise. */
kvf_status_t kvf_replica_readopt(kvf_server_t *server,
                                 const kvf_node_params_t *params,
                                 kvf_node_t **node_p);

/* Standby side, on the server's loop: follow the leader at @p control
 * ("" or NULL: none known); reconnects when it changes or the stream
 * broke. */
kvf_status_t kvf_replica_create(kvf_server_t *server);
void kvf_replica_destroy(kvf_server_t *server);
void kvf_replica_step(kvf_server_t *server, const char *control);
bool kvf_replica_is_warm(const kvf_server_t *server);
/* HA fields of /healthz (JSON, with --etcd) and of /metrics. */
void kvf_replica_health(kvf_server_t *server, struct evbuffer *b);
void kvf_replica_metrics(kvf_server_t *server, struct evbuffer *b);
/* Becoming leader: keep the followed state when warm, else drop it. */
void kvf_replica_take_over(kvf_server_t *server);

/* HA state in etcd (controller/hastate.c): the pin sets changed; a node
 * was drained or undrained by kvfctl; a node registered (drained before
 * a failover: draining again); on the tick: write what changed; when
 * elected: read it. */
void kvf_hastate_changed(kvf_server_t *server);
void kvf_hastate_drain(kvf_server_t *server, const char *name, bool is_drained);
void kvf_hastate_on_register(kvf_server_t *server, kvf_node_t *node);
void kvf_hastate_sync(kvf_server_t *server);
kvf_status_t kvf_hastate_load(kvf_server_t *server);

#endif /* KVF_CONTROLLER_SERVER_INT_H */
