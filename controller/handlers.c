/* SPDX-License-Identifier: Apache-2.0 */
/* Copyright (c) 2026 The kvfabric authors */
/* The controller's request handlers: one function per message type,
 * behind kvf_server_dispatch(). */
#include "controller/handlers.h"

#include "controller/conn.h"
#include "controller/server_int.h"
#include "common/log.h"
#include "common/time.h"
#include "proto/frame.h"
#include "proto/hello.h"

#include <event2/event.h>

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

bool kvf_server_recovering(kvf_server_t *server)
{
    uint64_t now = kvf_time_now_ms();
    size_t i, n;
    bool all = true;

    if (!server->is_recovering) {
        return false;
    }
    if ((now - server->start_ms) * KVF_NSEC_PER_MSEC >=
        server->cfg->recovery_window_ns) {
        kvf_info("recovery window over");
        server->is_recovering = false;
        return false;
    }
    if (!server->has_registrations) {
        return true;
    }
    n = kvf_node_table_count(server->nodes);
    for (i = 0; i < n; i++) {
        kvf_node_t *node = kvf_node_table_at(server->nodes, i);

        if ((node->state != KVF_NODE_DEAD) && !node->is_resynced) {
            all = false;
        }
    }
    if (all) {
        kvf_info("recovery complete: every registered node resynced");
        server->is_recovering = false;
    }
    return server->is_recovering;
}

void kvf_server_purge_kick(kvf_server_t *server)
{
    kvf_registry_stats_t st;
    struct timeval tv = {0, 0};

    kvf_registry_stats(server->reg, &st);
    if (((st.purging_slots > 0) || st.is_migrating) &&
        !event_pending(server->purge, EV_TIMEOUT, NULL)) {
        event_add(server->purge, &tv);
    }
}

/* ---- KV events --------------------------------------------------------- */

/* Publishes a KV event of @p node (controller/events.h); a node with
 * stored blocks is remembered until kvf_server_events_sweep() clears it. */
static void kvf_server_event(kvf_server_t *server, kvf_events_kind_t kind,
                             const kvf_node_t *node, const uint8_t *keys,
                             size_t n)
{
    uint32_t block_size = 0;
    size_t i;

    if ((server->events == NULL) ||
        ((n == 0) && (kind != KVF_EVENTS_CLEARED))) {
        return;
    }
    if (n > 0) {
        kvf_key_t key;

        kvf_key_unpack(keys, &key);
        block_size = kvf_index_block_size(server->index, key.ns);
    }
    kvf_events_publish(server->events, kind, node->id, node->name, keys, n,
                       block_size);
    if (kind != KVF_EVENTS_STORED) {
        return;
    }
    for (i = 0; i < server->num_event_nodes; i++) {
        if (server->event_nodes[i] == node->id) {
            return;
        }
    }
    if (server->num_event_nodes == server->cap_event_nodes) {
        size_t cap =
            (server->cap_event_nodes > 0) ? 2 * server->cap_event_nodes : 64;
        uint32_t *ids = realloc(server->event_nodes, cap * sizeof(*ids));

        if (ids == NULL) {
            return; /* its CLEARED will be missing: the stream says so */
        }
        server->event_nodes     = ids;
        server->cap_event_nodes = cap;
    }
    server->event_nodes[server->num_event_nodes++] = node->id;
}

/* AllBlocksCleared for every node that stored blocks and is now dead,
 * deregistered or forgotten; answers waiting replay requests. */
void kvf_server_events_sweep(kvf_server_t *server)
{
    size_t i = 0;

    if (server->events == NULL) {
        return;
    }
    kvf_events_poll(server->events);
    while (i < server->num_event_nodes) {
        uint32_t id      = server->event_nodes[i];
        kvf_node_t *node = kvf_node_table_find(server->nodes, id);

        if ((node != NULL) && (node->state != KVF_NODE_DEAD)) {
            i++;
            continue;
        }
        kvf_events_publish(server->events, KVF_EVENTS_CLEARED, id,
                           (node != NULL) ? node->name : "", NULL, 0, 0);
        server->event_nodes[i] = server->event_nodes[--server->num_event_nodes];
    }
}

/* ---- handlers -------------------------------------------------------- */

/* Counts a peer the handshake refused; the caller answers and closes. */
static void kvf_conn_auth_failed(kvf_conn_t *conn, const char *text)
{
    conn->server->ctr.auth_failures++;
    kvf_warn("conn %" PRIu64 " %s: authentication refused: %s", conn->id,
             conn->peer, text);
}

static kvf_status_t kvf_server_on_hello(kvf_conn_t *conn, Kvf__Hello *hello)
{
    Kvf__HelloReply rep;
    char text[160];
    char name[] = "kvf-controller";
    uint8_t mac[KVF_AUTH_MAC_SIZE];

    kvf__hello_reply__init(&rep);
    rep.request_id       = hello->request_id;
    rep.protocol_version = KVF_PROTOCOL_VERSION;
    rep.name             = name;
    if (conn->is_hello_done) {
        kvf_conn_reject(conn, hello->request_id, KVF_ERR_STATE,
                        "HELLO sent twice");
        return KVF_ERR_PROTO;
    }
    if (hello->protocol_version != KVF_PROTOCOL_VERSION) {
        snprintf(text, sizeof(text),
                 "protocol version %" PRIu32 " not supported "
                 "(controller speaks %d)",
                 hello->protocol_version, KVF_PROTOCOL_VERSION);
        conn->server->ctr.protocol_errors++;
        kvf_info("conn %" PRIu64 " %s: %s", conn->id, conn->peer, text);
        rep.status  = KVF_ERR_VERSION;
        rep.message = text;
        kvf_conn_send(conn, KVF_MSG_HELLO_REPLY, &rep.base);
        return KVF_ERR_PROTO;
    }
    if (kvf_hello_server_auth(&conn->auth, hello, &rep, mac, text,
                              sizeof(text)) != KVF_OK) {
        kvf_conn_auth_failed(conn, text);
        kvf_conn_send(conn, KVF_MSG_HELLO_REPLY, &rep.base);
        return KVF_ERR_PROTO;
    }
    conn->is_hello_done = true;
    conn->kind          = hello->kind;
    rep.status          = KVF_OK;
    text[0]             = '\0';
    rep.message         = text;
    return kvf_conn_send(conn, KVF_MSG_HELLO_REPLY, &rep.base);
}

/* The client's answer to the challenge: nothing else is served before. */
static kvf_status_t kvf_server_on_auth(kvf_conn_t *conn, Kvf__Auth *auth)
{
    char text[160];

    if (kvf_auth_server_finish(&conn->auth, auth->auth_mac.data,
                               auth->auth_mac.len, text,
                               sizeof(text)) != KVF_OK) {
        kvf_conn_auth_failed(conn, text);
        kvf_conn_send_status(conn, auth->request_id, KVF_ERR_AUTH, text);
        return KVF_ERR_PROTO;
    }
    kvf_debug("conn %" PRIu64 " %s: authenticated", conn->id, conn->peer);
    return kvf_conn_send_status(conn, auth->request_id, KVF_OK,
                                "authenticated");
}

static void kvf_server_push_pins(kvf_server_t *server, kvf_node_t *node)
{
    static const Kvf__CommandType types[2] = {
        KVF__COMMAND_TYPE__COMMAND_PIN, KVF__COMMAND_TYPE__COMMAND_SOFT_PIN};
    int level;

    for (level = 0; level < 2; level++) {
        if (server->pins[level].len > 0) {
            kvf_node_cmd_push(node, types[level], server->pins[level].keys,
                              server->pins[level].len);
        }
    }
}

/* Says why a registration was refused. A name held by a live node of
 * another agent names the holder and what to do, at warn: an operator's
 * mistake (the refused agent retries with backoff). */
static void kvf_server_register_refusal(kvf_server_t *server,
                                        const Kvf__Register *reg,
                                        kvf_status_t status, char *text,
                                        size_t len)
{
    const char *name = (reg->name != NULL) ? reg->name : "";
    kvf_node_t *old  = NULL;

    if (status == KVF_ERR_EXISTS) {
        old = kvf_node_table_find_name(server->nodes, name);
    }
    if ((old != NULL) && (old->incarnation != reg->incarnation)) {
        /* the same text on every retry: the agent warns once per text */
        snprintf(text, len,
                 "name '%.100s' is held by live node %" PRIu32
                 " at %.100s (socket %.100s): start this agent with another "
                 "--name, or with --replace to take the name over",
                 name, old->id, old->data_address, old->control_address);
        server->ctr.protocol_errors++;
        kvf_warn("refused registration of %.100s from %.100s: %s", name,
                 (reg->data_address != NULL) ? reg->data_address : "?", text);
        return;
    }
    snprintf(text, len, "register '%.100s' incarnation %" PRIu64 ": %s", name,
             reg->incarnation, kvf_strerror(status));
    if (status == KVF_ERR_STALE) {
        server->ctr.stale_rejects++;
    } else {
        server->ctr.protocol_errors++;
    }
    kvf_debug("%s", text);
}

static kvf_status_t kvf_server_on_register(kvf_conn_t *conn, Kvf__Register *reg)
{
    kvf_server_t *server = conn->server;
    Kvf__RegisterReply rep;
    kvf_node_params_t params;
    kvf_node_t *node;
    kvf_status_t status;
    uint64_t now_ms;
    char text[480];

    memset(&params, 0, sizeof(params));
    params.name               = reg->name;
    params.role               = reg->role;
    params.worker_address     = reg->worker_address.data;
    params.worker_address_len = reg->worker_address.len;
    params.control_address    = reg->control_address;
    params.data_address       = reg->data_address;
    params.instance_id        = reg->instance_id;
    params.tp_rank            = reg->tp_rank;
    params.tp_world           = reg->tp_world;
    params.incarnation        = reg->incarnation;
    params.pool_capacity      = reg->pool_capacity;
    params.lease_ms           = server->cfg->lease_ns / KVF_NSEC_PER_MSEC;
    params.is_replace         = reg->replace;
    params.is_draining        = reg->draining;
    now_ms                    = kvf_time_now_ms();
    status                    = kvf_replica_readopt(server, &params, &node);
    if (status != KVF_OK) {
        status = kvf_node_table_register(server->nodes, &params, now_ms, &node);
    }
    kvf__register_reply__init(&rep);
    rep.request_id = reg->request_id;
    rep.term       = server->term;
    text[0]        = '\0';
    rep.message    = text;
    if (status != KVF_OK) {
        kvf_server_register_refusal(server, reg, status, text, sizeof(text));
        rep.status = status;
        return kvf_conn_send(conn, KVF_MSG_REGISTER_REPLY, &rep.base);
    }
    kvf_info("node %" PRIu32 " registered: %s incarnation %" PRIu64
             " role %s data %s slot %u%s",
             node->id, node->name, node->incarnation,
             kvf_msg_role_name(node->role), node->data_address, node->slot,
             (node->state == KVF_NODE_DRAINING) ? " (draining)" : "");
    server->has_registrations = true;
    kvf_hastate_on_register(server, node);
    kvf_replica_forward_node(server, node);
    kvf_server_push_pins(server, node);
    kvf_server_purge_kick(server);
    rep.status   = KVF_OK;
    rep.node_id  = node->id;
    rep.lease_ms = (uint32_t)(server->cfg->lease_ns / KVF_NSEC_PER_MSEC);
    rep.heartbeat_ms =
        (uint32_t)(server->cfg->heartbeat_ns / KVF_NSEC_PER_MSEC);
    rep.recovering = kvf_server_recovering(server);
    rep.resync     = true;
    return kvf_conn_send(conn, KVF_MSG_REGISTER_REPLY, &rep.base);
}

/* Resolves a node id + incarnation, answering the error itself. */
static kvf_node_t *kvf_server_node_check(kvf_conn_t *conn, uint64_t req_id,
                                         uint32_t id, uint64_t incarnation)
{
    kvf_node_t *node = NULL;
    kvf_status_t status;
    char text[128];

    status = kvf_node_table_check(conn->server->nodes, id, incarnation, &node);
    if (status == KVF_OK) {
        node->last_heartbeat_ms = kvf_time_now_ms();
        return node;
    }
    if (status == KVF_ERR_STALE) {
        conn->server->ctr.stale_rejects++;
        snprintf(text, sizeof(text),
                 "node %" PRIu32 " incarnation %" PRIu64
                 " is stale: register again",
                 id, incarnation);
        kvf_debug("conn %" PRIu64 ": %s", conn->id, text);
        kvf_conn_send_status(conn, req_id, status, text);
    } else {
        snprintf(text, sizeof(text), "unknown node %" PRIu32, id);
        kvf_conn_reject(conn, req_id, status, text);
    }
    return NULL;
}

static void kvf_server_request_resync(kvf_server_t *server, kvf_node_t *node)
{
    if (node->is_resync_pending) {
        return;
    }
    node->is_resync_pending = true;
    server->ctr.seq_gaps++;
    kvf_node_cmd_push(node, KVF__COMMAND_TYPE__COMMAND_RESYNC, NULL, 0);
    kvf_info("node %" PRIu32 " (%s): sequence gap at seq %" PRIu64
             ", asking for resync",
             node->id, node->name, node->last_seq);
}

static kvf_status_t kvf_server_on_heartbeat(kvf_conn_t *conn,
                                            Kvf__Heartbeat *hb)
{
    kvf_server_t *server = conn->server;
    Kvf__HeartbeatReply rep;
    Kvf__Command cmds[KVF_NODE_COMMANDS_MAX];
    Kvf__Command *cmd_ptrs[KVF_NODE_COMMANDS_MAX];
    kvf_node_t *node;
    kvf_status_t status;
    unsigned i;
    char text[] = "";

    node = kvf_server_node_check(conn, hb->request_id, hb->node_id,
                                 hb->incarnation);
    if (node == NULL) {
        return KVF_OK;
    }
    node->pool_used     = hb->pool_used;
    node->pool_capacity = hb->pool_capacity;
    node->entries       = hb->entries;
    node->pd_capacity   = hb->pd_capacity;
    node->pd_used       = hb->pd_used;
    node->disk_capacity = hb->disk_capacity;
    node->disk_used     = hb->disk_used;
    node->disk_chunks   = hb->disk_chunks;
    if (hb->traffic != NULL) {
        kvf_traffic_from_msg(hb->traffic, &node->traffic);
    }
    /* peer input: refused (logged, shown as none) unless short and
     * printable; the heartbeat stands either way */
    (void)kvf_node_set_transports(node, hb->transports);
    kvf_registry_slot_set_load(
        server->reg, node->slot,
        (hb->pool_capacity > 0)
            ? (hb->pool_used * 1000) / hb->pool_capacity
            : kvf_registry_slot_keys(server->reg, node->slot));
    if ((hb->last_seq > node->last_seq) && !node->is_resync_pending) {
        kvf_server_request_resync(server, node); /* batches were lost */
    }
    kvf__heartbeat_reply__init(&rep);
    rep.request_id = hb->request_id;
    rep.term       = server->term;
    rep.status     = KVF_OK;
    rep.message    = text;
    for (i = 0; i < node->num_cmds; i++) {
        kvf__command__init(&cmds[i]);
        cmds[i].type      = (Kvf__CommandType)node->cmds[i].type;
        cmds[i].keys.data = node->cmds[i].keys;
        cmds[i].keys.len  = node->cmds[i].keys_len;
        cmd_ptrs[i]       = &cmds[i];
    }
    rep.n_commands = node->num_cmds;
    rep.commands   = cmd_ptrs;
    status         = kvf_conn_send(conn, KVF_MSG_HEARTBEAT_REPLY, &rep.base);
    if (status == KVF_OK) {
        kvf_node_cmd_clear(node);
    }
    return status;
}

static kvf_status_t kvf_server_on_deregister(kvf_conn_t *conn,
                                             Kvf__Deregister *dr)
{
    kvf_node_t *node;

    node = kvf_server_node_check(conn, dr->request_id, dr->node_id,
                                 dr->incarnation);
    if (node == NULL) {
        return KVF_OK;
    }
    kvf_node_table_kill(conn->server->nodes, node, kvf_time_now_ms(),
                        "deregistered");
    kvf_replica_forward_node(conn->server, node);
    kvf_server_purge_kick(conn->server);
    kvf_server_events_sweep(conn->server);
    return kvf_conn_send_status(conn, dr->request_id, KVF_OK, NULL);
}

static bool kvf_server_keys_ok(kvf_conn_t *conn, uint64_t req_id,
                               const ProtobufCBinaryData *keys)
{
    char text[128];

    if ((keys->len % KVF_KEY_WIRE_SIZE) == 0) {
        return true;
    }
    snprintf(text, sizeof(text),
             "keys field of %zu bytes is not a multiple of %d", keys->len,
             KVF_KEY_WIRE_SIZE);
    kvf_conn_reject(conn, req_id, KVF_ERR_INVALID, text);
    return false;
}

/* A Medium from an agent: one this controller knows, or a rejection. */
static bool kvf_server_medium_ok(kvf_conn_t *conn, uint64_t req_id,
                                 Kvf__Medium medium)
{
    char text[64];

    if ((medium == KVF__MEDIUM__MEDIUM_HOST) ||
        (medium == KVF__MEDIUM__MEDIUM_DISK)) {
        return true;
    }
    snprintf(text, sizeof(text), "unknown medium %d", (int)medium);
    kvf_conn_reject(conn, req_id, KVF_ERR_INVALID, text);
    return false;
}

static kvf_status_t kvf_server_on_batch(kvf_conn_t *conn, uint16_t type,
                                        Kvf__KeyBatch *kb)
{
    kvf_server_t *server = conn->server;
    kvf_node_t *node;
    kvf_status_t status;
    size_t n, done = 0;

    node = kvf_server_node_check(conn, kb->request_id, kb->node_id,
                                 kb->incarnation);
    if ((node == NULL) ||
        !kvf_server_keys_ok(conn, kb->request_id, &kb->keys)) {
        return KVF_OK;
    }
    if (kb->seq != node->last_seq + 1) {
        kvf_server_request_resync(server, node);
    }
    node->last_seq = kb->seq;
    n              = kb->keys.len / KVF_KEY_WIRE_SIZE;
    if (!kvf_server_medium_ok(conn, kb->request_id, kb->medium)) {
        return KVF_OK;
    }
    if (type == KVF_MSG_ADMIT) {
        status =
            kvf_registry_admit_medium(server->reg, node->slot, kb->keys.data, n,
                                      (kvf_registry_medium_t)kb->medium, &done);
        server->ctr.admits += n;
        kvf_server_purge_kick(server); /* the table may have begun growing */
    } else {
        status = kvf_registry_evict(server->reg, node->slot, kb->keys.data, n,
                                    &done);
        server->ctr.evicts += n;
    }
    if (status == KVF_OK) {
        kvf_replica_forward(server, type, &kb->base);
        kvf_server_event(server,
                         (type == KVF_MSG_ADMIT) ? KVF_EVENTS_STORED
                                                 : KVF_EVENTS_REMOVED,
                         node, kb->keys.data, n);
    }
    return kvf_conn_send_status(conn, kb->request_id, status,
                                (status == KVF_OK) ? NULL
                                                   : kvf_strerror(status));
}

static kvf_status_t kvf_server_on_inventory(kvf_conn_t *conn,
                                            Kvf__Inventory *inv)
{
    kvf_server_t *server = conn->server;
    kvf_node_t *node;
    kvf_status_t status = KVF_OK;
    size_t done;

    node = kvf_server_node_check(conn, inv->request_id, inv->node_id,
                                 inv->incarnation);
    if ((node == NULL) ||
        !kvf_server_keys_ok(conn, inv->request_id, &inv->keys) ||
        !kvf_server_medium_ok(conn, inv->request_id, inv->medium)) {
        return KVF_OK;
    }
    if (!node->is_inventory_open &&
        (kvf_registry_slot_keys(server->reg, node->slot) > 0)) {
        /* an inventory is the whole truth: start from an empty slot */
        status = kvf_node_table_reslot(server->nodes, node);
        kvf_server_purge_kick(server);
        kvf_server_event(server, KVF_EVENTS_CLEARED, node, NULL, 0);
    }
    if (status == KVF_OK) {
        node->is_inventory_open = true;
        node->is_resynced       = false;
        status                  = kvf_registry_admit_medium(
                             server->reg, node->slot, inv->keys.data,
                             inv->keys.len / KVF_KEY_WIRE_SIZE,
                             (kvf_registry_medium_t)inv->medium, &done);
        server->ctr.inventory_keys += inv->keys.len / KVF_KEY_WIRE_SIZE;
        kvf_server_purge_kick(server);
        node->last_seq = inv->seq;
        if (status == KVF_OK) {
            kvf_replica_forward(server, KVF_MSG_INVENTORY, &inv->base);
            kvf_server_event(server, KVF_EVENTS_STORED, node, inv->keys.data,
                             inv->keys.len / KVF_KEY_WIRE_SIZE);
        }
    }
    if ((status == KVF_OK) && inv->last) {
        node->is_resynced       = true;
        node->is_resync_pending = false;
        node->is_inventory_open = false;
        kvf_info("node %" PRIu32 " (%s) resynced: %" PRIu64 " keys", node->id,
                 node->name, kvf_registry_slot_keys(server->reg, node->slot));
        kvf_server_recovering(server);
    }
    return kvf_conn_send_status(conn, inv->request_id, status,
                                (status == KVF_OK) ? NULL
                                                   : kvf_strerror(status));
}

static uint16_t kvf_server_requester_slot(kvf_server_t *server, uint32_t id)
{
    kvf_node_t *node;

    if (id == 0) {
        return 0;
    }
    node = kvf_node_table_find(server->nodes, id);
    return ((node != NULL) && (node->state != KVF_NODE_DEAD)) ? node->slot : 0;
}

static void kvf_server_put_le32(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
    p[2] = (uint8_t)(v >> 16);
    p[3] = (uint8_t)(v >> 24);
}

/* Most holders a LOOKUP_REPLY names the data address of. */
#define KVF_SERVER_LOOKUP_ADDRS 64u

/* Names each distinct holder of server->slots[0, n) once in @p addrs (at
 * most KVF_SERVER_LOOKUP_ADDRS): the requester reaches them without asking
 * NODE_INFO. Borrows the node records; returns the count. */
static size_t kvf_server_holder_addrs(kvf_server_t *server, size_t n,
                                      Kvf__HolderAddr *addrs,
                                      Kvf__HolderAddr **ptrs)
{
    uint64_t seen[KVF_REGISTRY_MAX_SLOTS / 64] = {0};
    size_t i, count = 0;

    for (i = 0; (i < n) && (count < KVF_SERVER_LOOKUP_ADDRS); i++) {
        uint16_t slot = server->slots[i];
        kvf_node_t *node;

        if ((slot == 0) || (slot >= KVF_REGISTRY_MAX_SLOTS) ||
            ((seen[slot / 64] >> (slot % 64)) & 1u)) {
            continue;
        }
        seen[slot / 64] |= 1ull << (slot % 64);
        node = kvf_node_table_find(server->nodes,
                                   kvf_node_table_slot_id(server->nodes, slot));
        if ((node == NULL) || (node->data_address[0] == '\0')) {
            continue;
        }
        kvf__holder_addr__init(&addrs[count]);
        addrs[count].node_id      = node->id;
        addrs[count].name         = node->name;
        addrs[count].data_address = node->data_address;
        ptrs[count]               = &addrs[count];
        count++;
    }
    return count;
}

static kvf_status_t kvf_server_lookup_reply(kvf_conn_t *conn, uint64_t req_id,
                                            size_t n, size_t hit, size_t held,
                                            bool want_addrs)
{
    Kvf__HolderAddr addrs[KVF_SERVER_LOOKUP_ADDRS];
    Kvf__HolderAddr *ptrs[KVF_SERVER_LOOKUP_ADDRS];
    kvf_server_t *server = conn->server;
    Kvf__LookupReply rep;
    char text[] = "";
    size_t i;

    for (i = 0; i < n; i++) {
        kvf_server_put_le32(
            server->holders + 4 * i,
            kvf_node_table_slot_id(server->nodes, server->slots[i]));
    }
    server->ctr.lookups++;
    server->ctr.lookup_keys += n;
    server->ctr.lookup_hit_chunks += held;
    server->ctr.lookup_miss_chunks += n - held;
    kvf__lookup_reply__init(&rep);
    rep.request_id   = req_id;
    rep.status       = KVF_OK;
    rep.message      = text;
    rep.hit_chunks   = (uint32_t)hit;
    rep.holders.data = server->holders;
    rep.holders.len  = 4 * n;
    rep.media.data   = server->media;
    rep.media.len    = n;
    rep.recovering   = server->is_recovering && kvf_server_recovering(server);
    rep.term         = server->term;
    if (want_addrs) {
        rep.n_holder_addrs = kvf_server_holder_addrs(server, n, addrs, ptrs);
        rep.holder_addrs   = ptrs;
    }
    return kvf_conn_send(conn, KVF_MSG_LOOKUP_REPLY, &rep.base);
}

static bool kvf_server_batch_ok(kvf_conn_t *conn, uint64_t req_id, size_t n)
{
    char text[128];

    if (n <= conn->server->cfg->max_batch) {
        return true;
    }
    snprintf(text, sizeof(text), "lookup of %zu keys over max_batch %" PRIu64,
             n, conn->server->cfg->max_batch);
    kvf_conn_reject(conn, req_id, KVF_ERR_TOO_BIG, text);
    return false;
}

static kvf_status_t kvf_server_on_lookup(kvf_conn_t *conn, Kvf__Lookup *lk)
{
    kvf_server_t *server = conn->server;
    size_t n, hit;

    if (!kvf_server_keys_ok(conn, lk->request_id, &lk->keys)) {
        return KVF_OK;
    }
    n = lk->keys.len / KVF_KEY_WIRE_SIZE;
    if (!kvf_server_batch_ok(conn, lk->request_id, n)) {
        return KVF_OK;
    }
    kvf_registry_lookup_media(server->reg, lk->keys.data, n,
                              kvf_server_requester_slot(server, lk->requester),
                              lk->any_order, server->slots, server->media,
                              &hit);
    return kvf_server_lookup_reply(conn, lk->request_id, n, hit, hit,
                                   lk->want_addresses);
}

static kvf_status_t kvf_server_on_tp_lookup(kvf_conn_t *conn, Kvf__TpLookup *lk)
{
    kvf_server_t *server = conn->server;
    size_t total, n, hit, min_hit = SIZE_MAX, r, i;
    uint16_t req;
    char text[128];

    if (!kvf_server_keys_ok(conn, lk->request_id, &lk->keys)) {
        return KVF_OK;
    }
    total = lk->keys.len / KVF_KEY_WIRE_SIZE;
    if ((lk->tp_world == 0) || ((total % lk->tp_world) != 0)) {
        snprintf(text, sizeof(text),
                 "%zu keys do not split into tp_world %" PRIu32, total,
                 lk->tp_world);
        kvf_conn_reject(conn, lk->request_id, KVF_ERR_INVALID, text);
        return KVF_OK;
    }
    if (!kvf_server_batch_ok(conn, lk->request_id, total)) {
        return KVF_OK;
    }
    n   = total / lk->tp_world;
    req = kvf_server_requester_slot(server, lk->requester);
    for (r = 0; r < lk->tp_world; r++) {
        kvf_registry_lookup_media(
            server->reg, lk->keys.data + r * n * KVF_KEY_WIRE_SIZE, n, req,
            false, server->slots + r * n, server->media + r * n, &hit);
        if (hit < min_hit) {
            min_hit = hit;
        }
    }
    if (min_hit == SIZE_MAX) {
        min_hit = 0;
    }
    for (r = 0; r < lk->tp_world; r++) {
        for (i = min_hit; i < n; i++) {
            server->slots[r * n + i] = 0;
            server->media[r * n + i] = KVF_REGISTRY_HOST;
        }
    }
    return kvf_server_lookup_reply(conn, lk->request_id, total, min_hit,
                                   min_hit * lk->tp_world, false);
}

void kvf_server_node_desc(kvf_server_t *server, kvf_node_t *node, uint64_t now,
                          Kvf__NodeDesc *d)
{
    kvf__node_desc__init(d);
    d->node_id             = node->id;
    d->name                = node->name;
    d->role                = (Kvf__Role)node->role;
    d->worker_address.data = node->worker_address;
    d->worker_address.len  = node->worker_address_len;
    d->control_address     = node->control_address;
    d->data_address        = node->data_address;
    d->pool_capacity       = node->pool_capacity;
    d->pool_used           = node->pool_used;
    d->pd_capacity         = node->pd_capacity;
    d->pd_used             = node->pd_used;
    d->keys                = kvf_registry_slot_keys(server->reg, node->slot);
    d->keys_disk     = kvf_registry_slot_disk_keys(server->reg, node->slot);
    d->disk_capacity = node->disk_capacity;
    d->disk_used     = node->disk_used;
    d->disk_chunks   = node->disk_chunks;
    d->transports    = node->transports;
    /* protobuf-c fields are non-const; packing only reads them */
    d->state       = (char *)(uintptr_t)kvf_node_state_name(node->state);
    d->incarnation = node->incarnation;
    d->last_heartbeat_ms_ago = now - node->last_heartbeat_ms;
    d->instance_id           = node->instance_id;
    d->tp_rank               = node->tp_rank;
    d->tp_world              = node->tp_world;
}

static kvf_status_t kvf_server_on_node_info(kvf_conn_t *conn,
                                            Kvf__NodeInfoRequest *req)
{
    kvf_server_t *server = conn->server;
    size_t count = kvf_node_table_count(server->nodes), i, n = 0;
    Kvf__NodeInfoReply rep;
    Kvf__NodeDesc *descs;
    Kvf__NodeDesc **ptrs;
    uint64_t now = kvf_time_now_ms();
    kvf_status_t status;
    char text[128] = "";

    server->ctr.node_infos++;
    if (req->n_node_ids > count) {
        kvf_conn_reject(conn, req->request_id, KVF_ERR_NOT_FOUND,
                        "more node ids than nodes");
        return KVF_OK;
    }
    /* admin path: may allocate */
    descs = calloc(count + 1, sizeof(*descs));
    ptrs  = calloc(count + 1, sizeof(*ptrs));
    if ((descs == NULL) || (ptrs == NULL)) {
        status = KVF_ERR_NO_MEMORY;
        goto out;
    }
    if (req->n_node_ids == 0) {
        for (i = 0; i < count; i++) {
            kvf_server_node_desc(server, kvf_node_table_at(server->nodes, i),
                                 now, &descs[n]);
            ptrs[n] = &descs[n];
            n++;
        }
    } else {
        for (i = 0; i < req->n_node_ids; i++) {
            kvf_node_t *node =
                kvf_node_table_find(server->nodes, req->node_ids[i]);

            if (node == NULL) {
                snprintf(text, sizeof(text), "unknown node %" PRIu32,
                         req->node_ids[i]);
                kvf_conn_reject(conn, req->request_id, KVF_ERR_NOT_FOUND, text);
                status = KVF_OK;
                goto out;
            }
            kvf_server_node_desc(server, node, now, &descs[n]);
            ptrs[n] = &descs[n];
            n++;
        }
    }
    kvf__node_info_reply__init(&rep);
    rep.request_id = req->request_id;
    rep.status     = KVF_OK;
    rep.message    = text;
    rep.n_nodes    = n;
    rep.nodes      = ptrs;
    status         = kvf_conn_send(conn, KVF_MSG_NODE_INFO_REPLY, &rep.base);
out:
    free(ptrs);
    free(descs);
    return status;
}

void kvf_server_stats_fill(kvf_server_t *server, Kvf__StatsReply *rep_p)
{
    Kvf__StatsReply rep = *rep_p; /* initialized by the caller */
    kvf_registry_stats_t rs;

    kvf_registry_stats(server->reg, &rs);
    rep.recovering = kvf_server_recovering(server);
    kvf_node_table_census(server->nodes, &rep.nodes_alive, &rep.nodes_draining,
                          &rep.nodes_dead);
    rep.keys               = rs.keys;
    rep.holdings           = rs.entries; /* refined below */
    rep.admits             = server->ctr.admits;
    rep.evicts             = server->ctr.evicts;
    rep.lookups            = server->ctr.lookups;
    rep.lookup_hit_chunks  = server->ctr.lookup_hit_chunks;
    rep.lookup_miss_chunks = server->ctr.lookup_miss_chunks;
    rep.purge_backlog      = rs.purge_backlog;
    rep.protocol_errors    = server->ctr.protocol_errors;
    rep.connections        = server->num_conns;
    rep.uptime_ms          = kvf_time_now_ms() - server->start_ms;
    rep.table_bytes        = rs.table_bytes;
    rep.seq_gaps           = server->ctr.seq_gaps;
    rep.stale_rejects      = server->ctr.stale_rejects;
    rep.auth_failures      = server->ctr.auth_failures;
    kvf_replica_stats_fill(server, &rep);
    {
        size_t i, count = kvf_node_table_count(server->nodes);
        uint64_t holdings = 0;

        for (i = 0; i < count; i++) {
            kvf_node_t *node = kvf_node_table_at(server->nodes, i);

            holdings += kvf_registry_slot_keys(server->reg, node->slot);
            if (node->state != KVF_NODE_DEAD) {
                rep.host_bytes += node->pool_used;
                rep.disk_bytes += node->disk_used;
            }
        }
        rep.holdings      = holdings;
        rep.holdings_disk = rs.disk_holdings;
    }
    *rep_p = rep;
}

void kvf_server_snapshot(void *arg, kvf_server_stats_t *stats)
{
    kvf_server_t *server = arg;

    stats->ctr              = server->ctr;
    stats->ctr.backpressure = server->group.backpressure;
    stats->ctr.tls_failures = server->group.tls_failures;
    kvf_registry_stats(server->reg, &stats->reg);
    kvf__stats_reply__init(&stats->reply);
    kvf_server_stats_fill(server, &stats->reply);
    kvf_node_table_census(server->nodes, &stats->nodes_alive,
                          &stats->nodes_draining, &stats->nodes_dead);
    stats->is_recovering    = kvf_server_recovering(server);
    stats->term             = server->term;
    stats->connections      = server->num_conns;
    stats->buffered         = server->group.buffered;
    stats->buffered_preauth = server->group.buffered_preauth;
    stats->accept_errors    = server->listen_guard.errors;
    stats->events_dropped   = kvf_events_dropped(server->events);
    stats->events_published =
        kvf_events_count(server->events) - stats->events_dropped;
    stats->index = *kvf_index_latency(server->index);
}

static kvf_status_t kvf_server_on_stats(kvf_conn_t *conn,
                                        Kvf__StatsRequest *req)
{
    Kvf__StatsReply rep;
    char text[] = "";

    kvf__stats_reply__init(&rep);
    rep.request_id = req->request_id;
    rep.message    = text;
    kvf_server_stats_fill(conn->server, &rep);
    return kvf_conn_send(conn, KVF_MSG_STATS_REPLY, &rep.base);
}

/* Adds (@p is_add) or removes each packed key of @p keys in @p pins. */
static kvf_status_t kvf_server_pins_update(kvf_server_pins_t *pins, bool is_add,
                                           const uint8_t *keys, size_t len)
{
    size_t i, j;

    for (i = 0; i < len; i += KVF_KEY_WIRE_SIZE) {
        bool found = false;

        for (j = 0; j < pins->len; j += KVF_KEY_WIRE_SIZE) {
            if (memcmp(pins->keys + j, keys + i, KVF_KEY_WIRE_SIZE) == 0) {
                found = true;
                break;
            }
        }
        if (is_add && !found) {
            uint8_t *p = realloc(pins->keys, pins->len + KVF_KEY_WIRE_SIZE);

            if (p == NULL) {
                return KVF_ERR_NO_MEMORY;
            }
            pins->keys = p;
            memcpy(p + pins->len, keys + i, KVF_KEY_WIRE_SIZE);
            pins->len += KVF_KEY_WIRE_SIZE;
        } else if (!is_add && found) {
            memmove(pins->keys + j, pins->keys + j + KVF_KEY_WIRE_SIZE,
                    pins->len - j - KVF_KEY_WIRE_SIZE);
            pins->len -= KVF_KEY_WIRE_SIZE;
        }
    }
    return KVF_OK;
}

/* PIN keeps a key in the hard set, SOFT_PIN in the soft set (a key is in
 * at most one), UNPIN in neither. */
kvf_status_t kvf_server_pins_set(kvf_server_t *server, Kvf__CommandType type,
                                 const uint8_t *keys, size_t len)
{
    kvf_status_t status;

    status = kvf_server_pins_update(
        &server->pins[0], type == KVF__COMMAND_TYPE__COMMAND_PIN, keys, len);
    if (status != KVF_OK) {
        return status;
    }
    return kvf_server_pins_update(&server->pins[1],
                                  type == KVF__COMMAND_TYPE__COMMAND_SOFT_PIN,
                                  keys, len);
}

static kvf_status_t kvf_server_on_admin(kvf_conn_t *conn, Kvf__AdminCommand *ac)
{
    kvf_server_t *server = conn->server;
    kvf_node_t *target   = NULL;
    kvf_status_t status  = KVF_OK;
    size_t i, count = kvf_node_table_count(server->nodes), sent = 0;
    char text[200];
    bool has_target = (ac->node_id != 0) ||
                      ((ac->node_name != NULL) && (ac->node_name[0] != '\0'));

    if (ac->type == KVF__COMMAND_TYPE__COMMAND_FOLLOW) {
        return kvf_replica_follow(conn, ac); /* node_name: the standby's */
    }
    if (has_target) {
        target = (ac->node_id != 0)
                     ? kvf_node_table_find(server->nodes, ac->node_id)
                     : kvf_node_table_find_name(server->nodes, ac->node_name);
        if ((target == NULL) || (target->state == KVF_NODE_DEAD)) {
            if (ac->node_id != 0) {
                snprintf(text, sizeof(text), "unknown node %" PRIu32,
                         ac->node_id);
            } else {
                snprintf(text, sizeof(text), "unknown node '%.100s'",
                         ac->node_name);
            }
            return kvf_conn_send_status(conn, ac->request_id, KVF_ERR_NOT_FOUND,
                                        text);
        }
    }
    switch (ac->type) {
    case KVF__COMMAND_TYPE__COMMAND_PIN:
    case KVF__COMMAND_TYPE__COMMAND_SOFT_PIN:
    case KVF__COMMAND_TYPE__COMMAND_UNPIN:
    case KVF__COMMAND_TYPE__COMMAND_REPLICATE:
        if ((ac->keys.len == 0) ||
            !kvf_server_keys_ok(conn, ac->request_id, &ac->keys)) {
            if (ac->keys.len == 0) {
                kvf_conn_reject(conn, ac->request_id, KVF_ERR_INVALID,
                                "pin/unpin/replicate need keys");
            }
            return KVF_OK;
        }
        if (ac->type != KVF__COMMAND_TYPE__COMMAND_REPLICATE) {
            status = kvf_server_pins_set(server, ac->type, ac->keys.data,
                                         ac->keys.len);
            kvf_replica_pins_changed(server, ac);
            kvf_hastate_changed(server);
        } else if (target == NULL) {
            return kvf_conn_send_status(conn, ac->request_id, KVF_ERR_INVALID,
                                        "replicate needs a node");
        }
        break;
    case KVF__COMMAND_TYPE__COMMAND_DRAIN:
        if (target == NULL) {
            return kvf_conn_send_status(conn, ac->request_id, KVF_ERR_INVALID,
                                        "drain needs a node");
        }
        target->state = KVF_NODE_DRAINING;
        kvf_registry_slot_set_excluded(server->reg, target->slot, true);
        kvf_replica_forward_node(server, target);
        kvf_hastate_drain(server, target->name, true);
        break;
    case KVF__COMMAND_TYPE__COMMAND_UNDRAIN:
        if (target == NULL) {
            return kvf_conn_send_status(conn, ac->request_id, KVF_ERR_INVALID,
                                        "undrain needs a node");
        }
        target->state = KVF_NODE_ALIVE;
        kvf_registry_slot_set_excluded(server->reg, target->slot, false);
        kvf_replica_forward_node(server, target);
        kvf_hastate_drain(server, target->name, false);
        break;
    case KVF__COMMAND_TYPE__COMMAND_CLEAR:
        kvf_replica_forward(server, KVF_MSG_ADMIN_COMMAND, &ac->base);
        break;
    default:
        snprintf(text, sizeof(text), "admin command type %d not supported",
                 (int)ac->type);
        return kvf_conn_send_status(conn, ac->request_id, KVF_ERR_UNSUPPORTED,
                                    text);
    }
    if (status != KVF_OK) {
        return kvf_conn_send_status(conn, ac->request_id, status,
                                    kvf_strerror(status));
    }
    for (i = 0; i < count; i++) {
        kvf_node_t *node = kvf_node_table_at(server->nodes, i);

        if ((node->state == KVF_NODE_DEAD) ||
            ((target != NULL) && (node != target))) {
            continue;
        }
        if (kvf_node_cmd_push(node, ac->type, ac->keys.data, ac->keys.len) ==
            KVF_OK) {
            sent++;
        }
        if (ac->type == KVF__COMMAND_TYPE__COMMAND_CLEAR) {
            /* the agent empties its pool; forget its holdings now */
            kvf_node_table_reslot(server->nodes, node);
            node->is_resynced = true;
        }
    }
    kvf_server_purge_kick(server);
    kvf_info("admin %s%s%s: queued for %zu node(s)",
             (kvf_msg_command_name(ac->type) != NULL)
                 ? kvf_msg_command_name(ac->type)
                 : "command",
             (target != NULL) ? " of node " : "",
             (target != NULL) ? target->name : "", sent);
    snprintf(text, sizeof(text), "queued for %zu node(s)", sent);
    return kvf_conn_send_status(conn, ac->request_id, KVF_OK, text);
}

/* Returns KVF_ERR_PROTO when the connection must be closed. */
kvf_status_t kvf_server_dispatch(kvf_conn_t *conn, kvf_frame_t *frame)
{
    ProtobufCMessage *msg = frame->msg;

    if (frame->flags & KVF_FRAME_FLAG_REPLY) {
        kvf_conn_reject(conn, 0, KVF_ERR_PROTO, "unexpected reply frame");
        return KVF_ERR_PROTO;
    }
    if (frame->type == KVF_MSG_HELLO) {
        return kvf_server_on_hello(conn, (Kvf__Hello *)msg);
    }
    if (!conn->is_hello_done) {
        kvf_conn_reject(conn, 0, KVF_ERR_STATE,
                        "expected HELLO as the first frame");
        return KVF_ERR_PROTO;
    }
    if (frame->type == KVF_MSG_AUTH) {
        return kvf_server_on_auth(conn, (Kvf__Auth *)msg);
    }
    if (!kvf_auth_session_is_done(&conn->auth)) {
        kvf_auth_session_refuse(&conn->auth);
        kvf_conn_auth_failed(conn, "a request before AUTH");
        kvf_conn_send_status(conn, 0, KVF_ERR_AUTH,
                             "authenticate first: AUTH follows HELLO_REPLY");
        return KVF_ERR_PROTO;
    }
    switch (frame->type) {
    case KVF_MSG_REGISTER:
        return kvf_server_on_register(conn, (Kvf__Register *)msg);
    case KVF_MSG_HEARTBEAT:
        return kvf_server_on_heartbeat(conn, (Kvf__Heartbeat *)msg);
    case KVF_MSG_DEREGISTER:
        return kvf_server_on_deregister(conn, (Kvf__Deregister *)msg);
    case KVF_MSG_ADMIT:
    case KVF_MSG_EVICT:
        return kvf_server_on_batch(conn, frame->type, (Kvf__KeyBatch *)msg);
    case KVF_MSG_INVENTORY:
        return kvf_server_on_inventory(conn, (Kvf__Inventory *)msg);
    case KVF_MSG_LOOKUP:
        return kvf_server_on_lookup(conn, (Kvf__Lookup *)msg);
    case KVF_MSG_TP_LOOKUP:
        return kvf_server_on_tp_lookup(conn, (Kvf__TpLookup *)msg);
    case KVF_MSG_NODE_INFO:
        return kvf_server_on_node_info(conn, (Kvf__NodeInfoRequest *)msg);
    case KVF_MSG_STATS:
        return kvf_server_on_stats(conn, (Kvf__StatsRequest *)msg);
    case KVF_MSG_ADMIN_COMMAND:
        return kvf_server_on_admin(conn, (Kvf__AdminCommand *)msg);
    default:
        break;
    }
    kvf_conn_reject(conn, 0, KVF_ERR_UNSUPPORTED,
                    "frame type not served by the controller");
    return KVF_OK;
}
