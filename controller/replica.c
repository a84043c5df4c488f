/* SPDX-License-Identifier: Apache-2.0 */
/* Copyright (c) 2026 The kvfabric authors */
/*
 * HA warm standby (docs/architecture.md, "Warm standby"): the leader
 * streams its registry's changes to the standbys that follow it, so that
 * the one elected next answers lookups from the first request.
 *
 * Why the leader forwards (and agents do not send to every controller):
 * node ids, slots, deaths by lease and pins are the leader's decisions; a
 * copy of the leader's state, fed in the leader's order, is the only copy
 * whose node ids and holders mean the same as the leader's. A standby
 * connects like kvfctl (HELLO, AUTH with the cluster secret) and sends
 * ADMIN_COMMAND FOLLOW; that connection then only carries the stream.
 */
#include "controller/server_int.h"

#include "controller/election.h"
#include "controller/handlers.h"

#include "common/config.h"
#include "common/evjson.h"
#include "common/log.h"
#include "common/prom.h"
#include "common/time.h"
#include "proto/bconn.h"
#include "proto/frame.h"

#include <event2/buffer.h>
#include <event2/event.h>

#include <errno.h>
#include <inttypes.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

/* keys per snapshot INVENTORY frame (24 B each: 384 KiB) */
#define KVF_REPLICA_SNAPSHOT_KEYS 16384u
/* a standby that does not read this much of its stream is dropped (it
 * reconnects and takes a new snapshot) rather than holding the memory */
#define KVF_REPLICA_MAX_QUEUED (256ull << 20)
#define KVF_REPLICA_CONNECT_NS (500ull * KVF_NSEC_PER_MSEC)

struct kvf_replica {
    kvf_server_t *server;
    kvf_bconn_t *conn; /* NULL: not following */
    struct event *ev;  /* readable stream */
    char leader[300];  /* control address followed */
    bool has_copy;     /* snapshot complete: a copy as of the last frame */
    uint64_t ended_ms; /* when the stream of that copy ended (0: open) */
    uint64_t request_id;
    uint64_t frames; /* applied since the snapshot began */
    uint64_t last_frame_ms;
    uint64_t next_try_ms; /* reconnect backoff */
};

/* ---- leader side --------------------------------------------------- */

/* Queues a frame of the stream; a follower whose frame cannot be queued
 * or that is too far behind is closed on the next tick (not now: the
 * connection may be the one whose request is being handled). */
static void kvf_replica_push(kvf_replica_follower_t *f, uint16_t type,
                             const ProtobufCMessage *msg)
{
    if (f->is_dropped) {
        return;
    }
    if (kvf_server_conn_push(f->conn, type, msg) != KVF_OK) {
        kvf_warn("standby %s: cannot queue %s; dropping it", f->name,
                 kvf_msg_type_name(type));
        f->is_dropped = true;
    } else if (kvf_server_conn_queued(f->conn) > KVF_REPLICA_MAX_QUEUED) {
        kvf_warn("standby %s: %zu bytes not read; dropping it (it follows "
                 "again from a new snapshot)",
                 f->name, kvf_server_conn_queued(f->conn));
        f->is_dropped = true;
    }
}

void kvf_replica_forward(kvf_server_t *server, uint16_t type,
                         const ProtobufCMessage *msg)
{
    struct evbuffer *frame = server->replica_out;
    const uint8_t *data;
    size_t len;
    unsigned i;

    if (server->num_followers == 0) {
        return;
    }
    if (frame == NULL) {
        frame = server->replica_out = evbuffer_new();
    }
    /* packed once for all standbys */
    if ((frame == NULL) ||
        (kvf_frame_encode(frame, type, KVF_FRAME_FLAG_REPLY, msg,
                          (uint32_t)server->cfg->max_frame) != KVF_OK)) {
        kvf_warn("standby stream: cannot encode %s; dropping the standbys",
                 kvf_msg_type_name(type));
        for (i = 0; i < server->num_followers; i++) {
            server->followers[i].is_dropped = true;
        }
        if (frame != NULL) {
            evbuffer_drain(frame, evbuffer_get_length(frame));
        }
        return;
    }
    len  = evbuffer_get_length(frame);
    data = evbuffer_pullup(frame, -1);
    for (i = 0; i < server->num_followers; i++) {
        kvf_replica_follower_t *f = &server->followers[i];

        if (!f->is_dropped &&
            (kvf_server_conn_push_raw(f->conn, data, len) != KVF_OK)) {
            f->is_dropped = true;
        }
        if (!f->is_dropped &&
            (kvf_server_conn_queued(f->conn) > KVF_REPLICA_MAX_QUEUED)) {
            kvf_warn("standby %s: %zu bytes not read; dropping it (it "
                     "follows again from a new snapshot)",
                     f->name, kvf_server_conn_queued(f->conn));
            f->is_dropped = true;
        }
    }
    evbuffer_drain(frame, len);
}

void kvf_replica_tick(kvf_server_t *server)
{
    Kvf__Status st;
    char text[] = "tick";
    unsigned i  = server->num_followers;

    /* backwards: a follower closed here leaves the array */
    while (i-- > 0) {
        if (server->followers[i].is_dropped) {
            kvf_server_conn_close(server->followers[i].conn);
        }
    }
    kvf__status__init(&st);
    st.message = text;
    kvf_replica_forward(server, KVF_MSG_STATUS, &st.base);
}

void kvf_replica_stats_fill(kvf_server_t *server, Kvf__StatsReply *rep)
{
    kvf_election_info_t info;
    uint64_t now = kvf_time_now_ms();
    unsigned i;

    if (server->election == NULL) {
        return;
    }
    kvf_election_info(server->election, &info);
    /* protobuf-c fields are non-const; packing only reads them */
    rep->role = (char *)(uintptr_t)(server->is_standby ? "standby" : "leader");
    rep->term = server->is_standby ? info.leader_term : server->term;
    rep->elections_won = info.elections_won;
    rep->leader_ms     = info.leader_ns / KVF_NSEC_PER_MSEC;
    rep->etcd          = server->cfg->etcd;
    for (i = 0; i < server->num_followers; i++) {
        const kvf_replica_follower_t *f = &server->followers[i];
        Kvf__StandbyDesc *d             = &server->standby_descs[i];

        kvf__standby_desc__init(d);
        d->name         = (char *)(uintptr_t)f->name;
        d->queued_bytes = kvf_server_conn_queued(f->conn);
        d->warm         = !f->is_dropped && (d->queued_bytes < (1u << 20));
        d->following_ms = now - f->since_ms;
        server->standby_ptrs[i] = d;
    }
    rep->n_standbys = server->num_followers;
    rep->standbys   = server->standby_ptrs;
}

static void kvf_replica_send_nodes(kvf_server_t *server,
                                   kvf_replica_follower_t *only,
                                   kvf_node_t **nodes, size_t n)
{
    Kvf__NodeInfoReply rep;
    Kvf__NodeDesc *descs, **ptrs;
    uint64_t now = kvf_time_now_ms();
    char text[]  = "";
    size_t i;

    descs = calloc(n + 1, sizeof(*descs));
    ptrs  = calloc(n + 1, sizeof(*ptrs));
    if ((descs == NULL) || (ptrs == NULL)) {
        kvf_error("standby stream: out of memory");
        goto out;
    }
    for (i = 0; i < n; i++) {
        kvf_server_node_desc(server, nodes[i], now, &descs[i]);
        ptrs[i] = &descs[i];
    }
    kvf__node_info_reply__init(&rep);
    rep.status  = KVF_OK;
    rep.message = text;
    rep.n_nodes = n;
    rep.nodes   = ptrs;
    if (only != NULL) {
        kvf_replica_push(only, KVF_MSG_NODE_INFO_REPLY, &rep.base);
    } else {
        kvf_replica_forward(server, KVF_MSG_NODE_INFO_REPLY, &rep.base);
    }
out:
    free(ptrs);
    free(descs);
}

void kvf_replica_forward_node(kvf_server_t *server, kvf_node_t *node)
{
    if (server->num_followers > 0) {
        kvf_replica_send_nodes(server, NULL, &node, 1);
    }
}

void kvf_replica_forward_deaths(kvf_server_t *server)
{
    size_t i, count = kvf_node_table_count(server->nodes);
    uint64_t since = server->replica_death_ms;

    server->replica_death_ms = kvf_time_now_ms() + 1;
    for (i = 0; (i < count) && (server->num_followers > 0); i++) {
        kvf_node_t *node = kvf_node_table_at(server->nodes, i);

        if ((node->state == KVF_NODE_DEAD) && (node->dead_since_ms >= since)) {
            kvf_replica_forward_node(server, node);
        }
    }
}

void kvf_replica_pins_changed(kvf_server_t *server, const Kvf__AdminCommand *ac)
{
    kvf_replica_forward(server, KVF_MSG_ADMIN_COMMAND, &ac->base);
}

void kvf_replica_drop(kvf_server_t *server, kvf_conn_t *conn)
{
    unsigned i;

    for (i = 0; i < server->num_followers; i++) {
        if (server->followers[i].conn == conn) {
            kvf_info("standby %s left (%u left)", server->followers[i].name,
                     server->num_followers - 1);
            server->followers[i] = server->followers[--server->num_followers];
            return;
        }
    }
}

/* The snapshot's keys: one pass over the registry, a buffer per node
 * (holder slot), sent as an INVENTORY batch whenever it fills; then each
 * node's last batch. */
typedef struct kvf_replica_snap {
    kvf_replica_follower_t *f;
    kvf_node_t *nodes[KVF_REGISTRY_MAX_SLOTS]; /* by slot: live nodes */
    uint8_t *bufs[KVF_REGISTRY_MAX_SLOTS];     /* by slot, lazily */
    uint32_t counts[KVF_REGISTRY_MAX_SLOTS];
    bool is_failed; /* out of memory: the standby gets no "warm" */
} kvf_replica_snap_t;

static void kvf_replica_snap_flush(kvf_replica_snap_t *snap, uint16_t slot,
                                   bool last)
{
    kvf_node_t *node = snap->nodes[slot];
    Kvf__Inventory inv;

    kvf__inventory__init(&inv);
    inv.node_id     = node->id;
    inv.incarnation = node->incarnation;
    inv.seq         = node->last_seq;
    inv.keys.data   = snap->bufs[slot];
    inv.keys.len    = (size_t)snap->counts[slot] * KVF_KEY_WIRE_SIZE;
    inv.last        = last;
    kvf_replica_push(snap->f, KVF_MSG_INVENTORY, &inv.base);
    snap->counts[slot] = 0;
}

static void kvf_replica_snap_key(void *arg, uint16_t slot, const uint8_t *key)
{
    kvf_replica_snap_t *snap = arg;

    if (snap->nodes[slot] == NULL) {
        return; /* a slot of no live node (being reslotted) */
    }
    if (snap->bufs[slot] == NULL) {
        snap->bufs[slot] =
            malloc((size_t)KVF_REPLICA_SNAPSHOT_KEYS * KVF_KEY_WIRE_SIZE);
        if (snap->bufs[slot] == NULL) {
            snap->is_failed = true;
            return;
        }
    }
    memcpy(snap->bufs[slot] + (size_t)snap->counts[slot] * KVF_KEY_WIRE_SIZE,
           key, KVF_KEY_WIRE_SIZE);
    if (++snap->counts[slot] == KVF_REPLICA_SNAPSHOT_KEYS) {
        kvf_replica_snap_flush(snap, slot, false);
    }
}

/* Sends every live node's keys; false when out of memory. */
static bool kvf_replica_send_keys(kvf_server_t *server,
                                  kvf_replica_follower_t *f, kvf_node_t **live,
                                  size_t n)
{
    kvf_replica_snap_t *snap = calloc(1, sizeof(*snap));
    bool ok;
    size_t i;

    if (snap == NULL) {
        return false;
    }
    snap->f = f;
    for (i = 0; i < n; i++) {
        snap->nodes[live[i]->slot] = live[i];
    }
    kvf_registry_dump(server->reg, kvf_replica_snap_key, snap);
    for (i = 0; i < n; i++) {
        kvf_replica_snap_flush(snap, live[i]->slot, true);
    }
    ok = !snap->is_failed;
    for (i = 0; i < KVF_REGISTRY_MAX_SLOTS; i++) {
        free(snap->bufs[i]);
    }
    free(snap);
    return ok;
}

static void kvf_replica_send_pins(kvf_server_t *server,
                                  kvf_replica_follower_t *conn)
{
    static const Kvf__CommandType types[2] = {
        KVF__COMMAND_TYPE__COMMAND_PIN, KVF__COMMAND_TYPE__COMMAND_SOFT_PIN};
    Kvf__AdminCommand ac;
    int level;

    for (level = 0; level < 2; level++) {
        if (server->pins[level].len == 0) {
            continue;
        }
        kvf__admin_command__init(&ac);
        ac.type      = types[level];
        ac.keys.data = server->pins[level].keys;
        ac.keys.len  = server->pins[level].len;
        kvf_replica_push(conn, KVF_MSG_ADMIN_COMMAND, &ac.base);
    }
}

kvf_status_t kvf_replica_follow(kvf_conn_t *conn, const Kvf__AdminCommand *ac)
{
    kvf_server_t *server = kvf_server_conn_server(conn);
    size_t i, n = 0, count = kvf_node_table_count(server->nodes);
    uint64_t request_id = ac->request_id, t0;
    kvf_replica_follower_t *f;
    kvf_node_t **live;
    Kvf__Status st;
    char text[] = "warm";

    if (server->is_standby ||
        (server->num_followers == KVF_REPLICA_MAX_FOLLOWERS)) {
        kvf__status__init(&st);
        st.request_id = request_id;
        st.status     = KVF_ERR_BUSY;
        st.message    = text;
        kvf_server_conn_push(conn, KVF_MSG_STATUS, &st.base);
        return KVF_ERR_PROTO; /* closes it */
    }
    f = &server->followers[server->num_followers++];
    memset(f, 0, sizeof(*f));
    f->conn     = conn;
    f->since_ms = kvf_time_now_ms();
    snprintf(f->name, sizeof(f->name), "%s",
             ((ac->node_name != NULL) && (ac->node_name[0] != '\0'))
                 ? ac->node_name
                 : "?");
    /* admin path: may allocate */
    live = calloc(count + 1, sizeof(*live));
    if (live == NULL) {
        return KVF_ERR_PROTO;
    }
    for (i = 0; i < count; i++) {
        kvf_node_t *node = kvf_node_table_at(server->nodes, i);

        if (node->state != KVF_NODE_DEAD) {
            live[n++] = node;
        }
    }
    t0 = kvf_time_now_ns();
    kvf_replica_send_nodes(server, f, live, n);
    if (!kvf_replica_send_keys(server, f, live, n)) {
        kvf_error("standby %s: out of memory for its snapshot", f->name);
        free(live);
        return KVF_ERR_PROTO; /* closes it; it tries again */
    }
    kvf_replica_send_pins(server, f);
    free(live);
    kvf__status__init(&st);
    st.request_id = request_id;
    st.status     = KVF_OK;
    st.message    = text;
    kvf_replica_push(f, KVF_MSG_STATUS, &st.base);
    kvf_info("standby %s follows (%u now); snapshot of %zu nodes and %zu "
             "bytes queued in %.1f ms",
             f->name, server->num_followers, n, kvf_server_conn_queued(conn),
             (double)(kvf_time_now_ns() - t0) / 1e6);
    return KVF_OK;
}

kvf_status_t kvf_replica_readopt(kvf_server_t *server,
                                 const kvf_node_params_t *params,
                                 kvf_node_t **node_p)
{
    kvf_node_t *node;

    if (params->name == NULL) {
        return KVF_ERR_NOT_FOUND;
    }
    node = kvf_node_table_find_name(server->nodes, params->name);
    if ((node == NULL) || !node->is_adopted || (node->state == KVF_NODE_DEAD) ||
        (node->incarnation != params->incarnation)) {
        return KVF_ERR_NOT_FOUND;
    }
    node->is_adopted        = false;
    node->last_heartbeat_ms = kvf_time_now_ms();
    kvf_info("node %" PRIu32 " (%s) follows the new leader: id and %" PRIu64
             " holdings kept",
             node->id, node->name,
             kvf_registry_slot_keys(server->reg, node->slot));
    *node_p = node;
    return KVF_OK;
}

/* ---- standby side -------------------------------------------------- */

/* Forgets everything followed (a new stream starts with a snapshot). */
static void kvf_replica_reset(kvf_server_t *server)
{
    size_t i, count = kvf_node_table_count(server->nodes);
    uint64_t now = kvf_time_now_ms();

    for (i = 0; i < count; i++) {
        kvf_node_table_kill(server->nodes, kvf_node_table_at(server->nodes, i),
                            now, "standby reset");
    }
    /* forgotten at once: the new stream reuses their ids */
    kvf_node_table_expire(server->nodes, now + 1, UINT64_MAX, 0);
    free(server->pins[0].keys);
    free(server->pins[1].keys);
    memset(server->pins, 0, sizeof(server->pins));
    kvf_server_purge_kick(server);
}

static void kvf_replica_apply_nodes(kvf_server_t *server,
                                    const Kvf__NodeInfoReply *rep)
{
    uint64_t now = kvf_time_now_ms();
    size_t i;

    for (i = 0; i < rep->n_nodes; i++) {
        const Kvf__NodeDesc *d = rep->nodes[i];
        kvf_node_params_t params;
        kvf_node_state_t state = KVF_NODE_ALIVE;
        kvf_node_t *node;

        if ((d->state != NULL) && (strcmp(d->state, "dead") == 0)) {
            state = KVF_NODE_DEAD;
        } else if ((d->state != NULL) && (strcmp(d->state, "draining") == 0)) {
            state = KVF_NODE_DRAINING;
        }
        memset(&params, 0, sizeof(params));
        params.name               = d->name;
        params.role               = d->role;
        params.worker_address     = d->worker_address.data;
        params.worker_address_len = d->worker_address.len;
        params.control_address    = d->control_address;
        params.data_address       = d->data_address;
        params.instance_id        = d->instance_id;
        params.tp_rank            = d->tp_rank;
        params.tp_world           = d->tp_world;
        params.incarnation        = d->incarnation;
        params.pool_capacity      = d->pool_capacity;
        params.is_replace         = true; /* the leader took the name */
        if (kvf_node_table_adopt(server->nodes, d->node_id, &params, state, now,
                                 &node) == KVF_OK) {
            node->is_adopted = true;
            node->pool_used  = d->pool_used;
        }
    }
    kvf_server_purge_kick(server);
}

static kvf_node_t *kvf_replica_node(kvf_server_t *server, uint32_t id,
                                    uint64_t incarnation)
{
    kvf_node_t *node = NULL;

    if (kvf_node_table_check(server->nodes, id, incarnation, &node) != KVF_OK) {
        return NULL;
    }
    return node;
}

static void kvf_replica_apply_batch(kvf_server_t *server, uint16_t type,
                                    const Kvf__KeyBatch *kb)
{
    kvf_node_t *node = kvf_replica_node(server, kb->node_id, kb->incarnation);
    size_t done;

    if ((node == NULL) || ((kb->keys.len % KVF_KEY_WIRE_SIZE) != 0)) {
        return;
    }
    node->last_seq = kb->seq;
    if (type == KVF_MSG_ADMIT) {
        kvf_registry_admit(server->reg, node->slot, kb->keys.data,
                           kb->keys.len / KVF_KEY_WIRE_SIZE, &done);
        server->ctr.admits += kb->keys.len / KVF_KEY_WIRE_SIZE;
        kvf_server_purge_kick(server);
    } else {
        kvf_registry_evict(server->reg, node->slot, kb->keys.data,
                           kb->keys.len / KVF_KEY_WIRE_SIZE, &done);
        server->ctr.evicts += kb->keys.len / KVF_KEY_WIRE_SIZE;
    }
}

/* As the leader's INVENTORY handler: the first batch starts from an empty
 * slot. */
static void kvf_replica_apply_inventory(kvf_server_t *server,
                                        const Kvf__Inventory *inv)
{
    kvf_node_t *node = kvf_replica_node(server, inv->node_id, inv->incarnation);
    size_t done;

    if ((node == NULL) || ((inv->keys.len % KVF_KEY_WIRE_SIZE) != 0)) {
        return;
    }
    if (!node->is_inventory_open &&
        (kvf_registry_slot_keys(server->reg, node->slot) > 0)) {
        if (kvf_node_table_reslot(server->nodes, node) != KVF_OK) {
            return;
        }
        kvf_server_purge_kick(server);
    }
    node->is_inventory_open = !inv->last;
    node->last_seq          = inv->seq;
    kvf_registry_admit(server->reg, node->slot, inv->keys.data,
                       inv->keys.len / KVF_KEY_WIRE_SIZE, &done);
    kvf_server_purge_kick(server);
}

static void kvf_replica_apply_admin(kvf_server_t *server,
                                    const Kvf__AdminCommand *ac)
{
    size_t i, count = kvf_node_table_count(server->nodes);

    switch (ac->type) {
    case KVF__COMMAND_TYPE__COMMAND_PIN:
    case KVF__COMMAND_TYPE__COMMAND_SOFT_PIN:
    case KVF__COMMAND_TYPE__COMMAND_UNPIN:
        if ((ac->keys.len % KVF_KEY_WIRE_SIZE) == 0) {
            kvf_server_pins_set(server, ac->type, ac->keys.data, ac->keys.len);
        }
        break;
    case KVF__COMMAND_TYPE__COMMAND_CLEAR:
        for (i = 0; i < count; i++) {
            kvf_node_t *node = kvf_node_table_at(server->nodes, i);

            bool by_name =
                (ac->node_name != NULL) && (ac->node_name[0] != '\0');

            /* the leader's target: by id, by (newest live) name, or all */
            if ((node->state != KVF_NODE_DEAD) &&
                (by_name ? (strcmp(ac->node_name, node->name) == 0)
                         : ((ac->node_id == 0) || (ac->node_id == node->id)))) {
                kvf_node_table_reslot(server->nodes, node);
            }
        }
        kvf_server_purge_kick(server);
        break;
    default:
        break;
    }
}

static void kvf_replica_disconnect(kvf_replica_t *rep, const char *why)
{
    if (rep->conn == NULL) {
        return;
    }
    /* the copy stays usable for a lease (the leader may have died: its
     * last frame is its last change); after that it is stale */
    kvf_warn("standby: stream from leader %s ended (%s): not warm%s",
             rep->leader, why,
             rep->has_copy ? "; copy kept for one lease in case it died"
                           : "; a failover falls back to the agents' resync");
    event_free(rep->ev);
    rep->ev = NULL;
    kvf_bconn_destroy(rep->conn);
    rep->conn        = NULL;
    rep->ended_ms    = kvf_time_now_ms();
    rep->next_try_ms = rep->ended_ms + 200;
}

/* Returns false when the stream must end. */
static bool kvf_replica_apply(kvf_replica_t *rep, const kvf_frame_t *frame)
{
    kvf_server_t *server = rep->server;

    rep->frames++;
    rep->last_frame_ms = kvf_time_now_ms();
    switch (frame->type) {
    case KVF_MSG_NODE_INFO_REPLY:
        kvf_replica_apply_nodes(server, (Kvf__NodeInfoReply *)frame->msg);
        return true;
    case KVF_MSG_ADMIT:
    case KVF_MSG_EVICT:
        kvf_replica_apply_batch(server, frame->type,
                                (Kvf__KeyBatch *)frame->msg);
        return true;
    case KVF_MSG_INVENTORY:
        kvf_replica_apply_inventory(server, (Kvf__Inventory *)frame->msg);
        return true;
    case KVF_MSG_ADMIN_COMMAND:
        kvf_replica_apply_admin(server, (Kvf__AdminCommand *)frame->msg);
        return true;
    case KVF_MSG_STATUS: {
        const Kvf__Status *st = (const Kvf__Status *)frame->msg;

        if ((st->request_id == 0) && (st->status == KVF_OK)) {
            return true; /* the leader's tick: last_frame_ms is the lag */
        }
        if ((st->request_id != rep->request_id) || (st->status != KVF_OK)) {
            kvf_warn("standby: leader %s refused to stream: %s (%s)",
                     rep->leader, kvf_strerror((kvf_status_t)st->status),
                     (st->message != NULL) ? st->message : "");
            return false;
        }
        rep->has_copy = true;
        rep->ended_ms = 0;
        kvf_info("standby: warm (following leader %s; %" PRIu64
                 " frames of snapshot)",
                 rep->leader, rep->frames);
        return true;
    }
    default:
        kvf_warn("standby: unexpected %s in the stream",
                 kvf_msg_type_name(frame->type));
        return false;
    }
}

static void kvf_replica_on_read(evutil_socket_t fd, short what, void *arg)
{
    kvf_replica_t *rep = arg;
    kvf_frame_t frame;
    kvf_status_t status;

    status = kvf_bconn_read_some(rep->conn, NULL);
    if ((status != KVF_OK) && (status != KVF_INPROGRESS)) {
        kvf_replica_disconnect(rep, kvf_status_name(status));
        return;
    }
    while ((status = kvf_bconn_recv_buffered(rep->conn, &frame)) == KVF_OK) {
        bool ok = kvf_replica_apply(rep, &frame);

        kvf_frame_release(&frame, NULL);
        if (!ok) {
            kvf_replica_disconnect(rep, "bad stream");
            return;
        }
    }
    if (status != KVF_INPROGRESS) {
        kvf_replica_disconnect(rep, kvf_status_name(status));
    }
}

static kvf_status_t kvf_replica_dial(const char *hostport, uint64_t deadline,
                                     int *fd_p)
{
    struct addrinfo hints, *res = NULL, *ai;
    char host[256], port_str[8];
    uint16_t port;
    int fd = -1, one = 1, soerr = 0;
    socklen_t len = sizeof(soerr);

    if (kvf_config_parse_hostport(hostport, host, sizeof(host), &port) !=
        KVF_OK) {
        return KVF_ERR_CONFIG;
    }
    snprintf(port_str, sizeof(port_str), "%u", port);
    memset(&hints, 0, sizeof(hints));
    hints.ai_family   = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags    = AI_NUMERICHOST;
    if (getaddrinfo(host, port_str, &hints, &res) != 0) {
        return KVF_ERR_CONFIG;
    }
    for (ai = res; ai != NULL; ai = ai->ai_next) {
        fd = socket(ai->ai_family,
                    ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        if (fd < 0) {
            continue;
        }
        if ((connect(fd, ai->ai_addr, ai->ai_addrlen) == 0) ||
            ((errno == EINPROGRESS) &&
             (kvf_bconn_wait_fd(fd, POLLOUT, deadline) == KVF_OK) &&
             (getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &len) == 0) &&
             (soerr == 0))) {
            break;
        }
        close(fd);
        fd = -1;
    }
    freeaddrinfo(res);
    if (fd < 0) {
        return KVF_ERR_IO;
    }
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    *fd_p = fd;
    return KVF_OK;
}

/* Connects to the leader, authenticates and asks for the stream; bounded
 * by KVF_REPLICA_CONNECT_NS (the standby's loop waits meanwhile). */
static void kvf_replica_connect(kvf_replica_t *rep, const char *control)
{
    kvf_server_t *server = rep->server;
    uint64_t deadline    = kvf_time_deadline_ns(KVF_REPLICA_CONNECT_NS);
    kvf_bconn_hello_params_t hp;
    kvf_bconn_params_t params;
    Kvf__AdminCommand ac;
    kvf_status_t status;
    char peer[340], name[300];
    int fd = -1;

    snprintf(rep->leader, sizeof(rep->leader), "%s", control);
    rep->next_try_ms = kvf_time_now_ms() + 200;
    if (server->tls != NULL) {
        /* the standby stream is plain TCP (+ cluster secret) for now */
        return;
    }
    status = kvf_replica_dial(control, deadline, &fd);
    if (status != KVF_OK) {
        kvf_debug("standby: cannot reach leader %s: %s", control,
                  kvf_status_name(status));
        return;
    }
    snprintf(peer, sizeof(peer), "leader %s", control);
    memset(&params, 0, sizeof(params));
    params.peer      = peer;
    params.max_frame = (uint32_t)server->cfg->max_frame;
    if (kvf_bconn_create(fd, &params, &rep->conn) != KVF_OK) {
        return; /* fd closed by it */
    }
    memset(&hp, 0, sizeof(hp));
    hp.version = KVF_PROTOCOL_VERSION;
    hp.kind    = KVF__PEER_KIND__PEER_ADMIN;
    hp.name    = "kvf-controller standby";
    hp.secret  = &server->secret;
    kvf__admin_command__init(&ac);
    ac.type = KVF__COMMAND_TYPE__COMMAND_FOLLOW;
    snprintf(name, sizeof(name), "%s", kvf_http_address(server->http));
    ac.node_name    = name;
    ac.request_id   = kvf_bconn_next_id(rep->conn);
    rep->request_id = ac.request_id;
    status          = kvf_bconn_hello(rep->conn, &hp, deadline, NULL);
    if (status == KVF_OK) {
        status = kvf_bconn_send(rep->conn, KVF_MSG_ADMIN_COMMAND, &ac.base,
                                deadline);
    }
    if (status == KVF_OK) {
        rep->ev = event_new(server->base, kvf_bconn_fd(rep->conn),
                            EV_READ | EV_PERSIST, kvf_replica_on_read, rep);
        if ((rep->ev == NULL) || (event_add(rep->ev, NULL) != 0)) {
            status = KVF_ERR_NO_MEMORY;
        }
    }
    if (status != KVF_OK) {
        kvf_warn("standby: cannot follow leader %s: %s", control,
                 kvf_bconn_last_error(rep->conn));
        if (rep->ev != NULL) {
            event_free(rep->ev);
            rep->ev = NULL;
        }
        kvf_bconn_destroy(rep->conn);
        rep->conn = NULL;
        return;
    }
    /* what was followed before came from another stream */
    kvf_replica_reset(server);
    rep->frames   = 0;
    rep->has_copy = false;
    rep->ended_ms = 0;
    kvf_info("standby: following leader %s", control);
}

kvf_status_t kvf_replica_create(kvf_server_t *server)
{
    server->replica = calloc(1, sizeof(*server->replica));
    if (server->replica == NULL) {
        return KVF_ERR_NO_MEMORY;
    }
    server->replica->server = server;
    return KVF_OK;
}

void kvf_replica_destroy(kvf_server_t *server)
{
    kvf_replica_t *rep = server->replica;

    if (server->replica_out != NULL) {
        evbuffer_free(server->replica_out);
        server->replica_out = NULL;
    }
    if (rep == NULL) {
        return;
    }
    if (rep->ev != NULL) {
        event_free(rep->ev);
    }
    kvf_bconn_destroy(rep->conn);
    free(rep);
    server->replica = NULL;
}

void kvf_replica_step(kvf_server_t *server, const char *control)
{
    kvf_replica_t *rep = server->replica;

    if (rep == NULL) {
        return;
    }
    if ((control == NULL) || (control[0] == '\0')) {
        return; /* no leader published (yet): keep what we have */
    }
    if ((rep->conn != NULL) && (strcmp(control, rep->leader) != 0)) {
        kvf_replica_disconnect(rep, "another leader");
    }
    if ((rep->conn == NULL) && (kvf_time_now_ms() >= rep->next_try_ms)) {
        kvf_replica_connect(rep, control);
    }
}

bool kvf_replica_is_warm(const kvf_server_t *server)
{
    return (server->replica != NULL) && (server->replica->conn != NULL) &&
           server->replica->has_copy;
}

/* Whether the copy may serve as the new leader's registry: complete, and
 * its stream open or ended at most a lease ago (the old leader's death). */
static bool kvf_replica_is_usable(const kvf_replica_t *rep)
{
    uint64_t lease_ms = rep->server->cfg->etcd_lease_ns / KVF_NSEC_PER_MSEC;

    return rep->has_copy &&
           ((rep->ended_ms == 0) ||
            (kvf_time_now_ms() - rep->ended_ms <= lease_ms + 1000));
}

void kvf_replica_take_over(kvf_server_t *server)
{
    kvf_replica_t *rep = server->replica;
    size_t i, count = kvf_node_table_count(server->nodes);
    uint64_t now = kvf_time_now_ms();
    bool is_warm = false;

    if (rep != NULL) {
        /* what the old leader sent before it died is applied: drain the
         * socket once */
        if (rep->conn != NULL) {
            kvf_replica_on_read(kvf_bconn_fd(rep->conn), EV_READ, rep);
        }
        is_warm = kvf_replica_is_usable(rep);
    }
    if ((rep == NULL) || (rep->leader[0] == '\0')) {
        /* no leader was ever seen: the cluster's first, not a failover */
        kvf_replica_reset(server);
    } else if (!is_warm) {
        server->failovers[1]++;
        kvf_warn("elected while not warm: starting from the agents' resync");
        kvf_replica_reset(server);
    } else {
        server->failovers[0]++;
        /* every node gets a whole lease to find the new leader */
        for (i = 0; i < count; i++) {
            kvf_node_table_at(server->nodes, i)->last_heartbeat_ms = now;
        }
        kvf_info("elected warm: %zu nodes and their holdings kept from the "
                 "stream",
                 count);
    }
    kvf_replica_destroy(server);
}

/* ---- /healthz and /metrics ----------------------------------------- */

void kvf_replica_health(kvf_server_t *server, struct evbuffer *b)
{
    const kvf_replica_t *rep = server->replica;
    kvf_election_info_t info;

    kvf_election_info(server->election, &info);
    if (!server->is_standby) {
        evbuffer_add_printf(b,
                            "{\"status\":\"ok\",\"role\":\"leader\","
                            "\"term\":%" PRIu64 ",\"standbys\":%u}\n",
                            server->term, server->num_followers);
        return;
    }
    evbuffer_add_printf(b,
                        "{\"status\":\"ok\",\"role\":\"standby\",\"warm\":%s,"
                        "\"leader_term\":%" PRIu64 ",\"leader\":",
                        kvf_replica_is_warm(server) ? "true" : "false",
                        info.leader_term);
    kvf_evjson_add_str(b, (rep != NULL) ? rep->leader : "");
    evbuffer_add_printf(b, ",\"last_frame_ms_ago\":%" PRIu64 "}\n",
                        ((rep != NULL) && (rep->last_frame_ms != 0))
                            ? kvf_time_now_ms() - rep->last_frame_ms
                            : 0);
}

void kvf_replica_metrics(kvf_server_t *server, struct evbuffer *b)
{
    static const char *const copies[] = {"warm", "cold"};
    const kvf_replica_t *rep          = server->replica;
    kvf_election_info_t info;
    uint64_t queued = 0;
    unsigned i;

    if (server->election == NULL) {
        return;
    }
    kvf_election_info(server->election, &info);
    for (i = 0; i < server->num_followers; i++) {
        queued += kvf_server_conn_queued(server->followers[i].conn);
    }
    kvf_prom_metric(b, "kvf_controller_ha_leader", KVF_PROM_GAUGE,
                    "1 on the leader, 0 on a standby",
                    server->is_standby ? 0 : 1);
    kvf_prom_metric(b, "kvf_controller_elections_won_total", KVF_PROM_COUNTER,
                    "elections this process won", info.elections_won);
    kvf_prom_metric_by(
        b, "kvf_controller_failovers_total", KVF_PROM_COUNTER,
        "elections won, by the copy of the registry taken over", "copy", 2,
        copies, (const uint64_t[]){server->failovers[0], server->failovers[1]});
    kvf_prom_family(b, "kvf_controller_leader_seconds", KVF_PROM_GAUGE,
                    "time as leader in this term");
    evbuffer_add_printf(b, "kvf_controller_leader_seconds %.3f\n",
                        (double)info.leader_ns / 1e9);
    kvf_prom_metric(b, "kvf_controller_standbys", KVF_PROM_GAUGE,
                    "standbys following this leader", server->num_followers);
    kvf_prom_metric(b, "kvf_controller_standby_queued_bytes", KVF_PROM_GAUGE,
                    "stream bytes not yet written to the standbys", queued);
    kvf_prom_metric(b, "kvf_controller_standby_warm", KVF_PROM_GAUGE,
                    "1 on a standby with a warm copy",
                    kvf_replica_is_warm(server) ? 1 : 0);
    kvf_prom_family(b, "kvf_controller_standby_lag_seconds", KVF_PROM_GAUGE,
                    "since the standby's last frame from the leader");
    evbuffer_add_printf(b, "kvf_controller_standby_lag_seconds %.3f\n",
                        ((rep != NULL) && (rep->last_frame_ms != 0))
                            ? (double)(kvf_time_now_ms() - rep->last_frame_ms) /
                                  1e3
                            : 0.0);
}
