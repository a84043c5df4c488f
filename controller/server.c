/* SPDX-License-Identifier: Apache-2.0 */
/* Copyright (c) 2026 The kvfabric authors */
#include "controller/server.h"

#include "controller/server_int.h"
#include "common/log.h"
#include "common/time.h"
#include "proto/frame.h"
#include "proto/hello.h"
#include "common/tls.h"

#include <event2/buffer.h>
#include <event2/event.h>
#include <event2/listener.h>

#include <openssl/ssl.h>

#include <arpa/inet.h>
#include <errno.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

const double kvf_server_lat_bounds_us[KVF_SERVER_LAT_BUCKETS] = {
    1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 10000, 100000,
};

/*
 * A connection: the socket, its read and write events and two evbuffers.
 * Not a bufferevent: libevent 2.1's bufferevent reads at most 4096 bytes
 * per callback after an ioctl(FIONREAD), which cut a pipelined batch of
 * lookups into many rounds and cost a syscall per read; here one recv()
 * takes what is there and the replies of a batch leave in one writev().
 */
struct kvf_conn {
    kvf_server_t *server;
    evutil_socket_t fd;
    struct event *ev_read;
    struct event *ev_write; /* added only while output is left over */
    struct evbuffer *in;
    struct evbuffer *out;
    kvf_conn_t *prev;
    kvf_conn_t *next;
    uint64_t id;
    bool is_hello_done;
    kvf_auth_session_t auth; /* the cluster-secret handshake */
    SSL *ssl;                /* NULL: plain TCP */
    bool is_tls_up;          /* the TLS handshake completed */
    uint64_t accepted_ms;
    bool is_closing;         /* flush the output, then free */
    bool is_throttled;       /* reading paused: output over max_output */
    bool is_charged_preauth; /* @charged counts in buffered_preauth too */
    uint64_t charged;        /* bytes counted in server->buffered */
    int kind;                /* Kvf__PeerKind */
    char peer[64];
};

static void kvf_conn_process(kvf_conn_t *conn);
static void kvf_conn_on_read(evutil_socket_t fd, short what, void *arg);

static bool kvf_conn_is_retriable(int err)
{
    return (err == EAGAIN) || (err == EWOULDBLOCK) || (err == EINTR);
}

/* Has the peer not proved itself yet (no HELLO, or no AUTH with a
 * secret)? Such peers get small frames and a small buffer budget. */
static bool kvf_conn_is_preauth(const kvf_conn_t *conn)
{
    return !conn->is_hello_done || !kvf_auth_session_is_done(&conn->auth);
}

/* recv() size: 256 KiB (a pipelined batch in one call), 4 KiB before
 * authentication (HELLO and AUTH are small), so that a partial frame of
 * an unauthenticated peer pins 4 KiB of buffer, not 256 KiB. */
static size_t kvf_conn_read_size(const kvf_conn_t *conn)
{
    return kvf_conn_is_preauth(conn) ? (4u << 10) : (256u << 10);
}

/*
 * Recounts what @p conn holds in server->buffered: its input and unsent
 * output, plus one read reservation while input is left (the buffer chain
 * a partial frame sits in). Cheap (no syscall); called after every read,
 * process and write.
 */
static void kvf_conn_charge(kvf_conn_t *conn)
{
    kvf_server_t *server = conn->server;
    size_t in            = evbuffer_get_length(conn->in);
    uint64_t now         = in + evbuffer_get_length(conn->out);

    if (in > 0) {
        now += kvf_conn_read_size(conn);
    }
    server->buffered -= conn->charged;
    if (conn->is_charged_preauth) {
        server->buffered_preauth -= conn->charged;
    }
    conn->charged            = now;
    conn->is_charged_preauth = kvf_conn_is_preauth(conn);
    server->buffered += now;
    if (conn->is_charged_preauth) {
        server->buffered_preauth += now;
    }
}

static void kvf_conn_destroy(kvf_conn_t *conn)
{
    kvf_server_t *server = conn->server;

    kvf_replica_drop(server, conn);
    if (conn->prev != NULL) {
        conn->prev->next = conn->next;
    } else {
        server->conns = conn->next;
    }
    if (conn->next != NULL) {
        conn->next->prev = conn->prev;
    }
    server->num_conns--;
    server->buffered -= conn->charged;
    if (conn->is_charged_preauth) {
        server->buffered_preauth -= conn->charged;
    }
    if (conn->ev_write != NULL) {
        event_free(conn->ev_write);
    }
    if (conn->ev_read != NULL) {
        event_free(conn->ev_read);
    }
    if (conn->out != NULL) {
        evbuffer_free(conn->out);
    }
    if (conn->in != NULL) {
        evbuffer_free(conn->in);
    }
    SSL_free(conn->ssl);
    evutil_closesocket(conn->fd);
    if (kvf_auth_session_is_abandoned(&conn->auth)) {
        server->ctr.auth_failures++; /* the client refused our proof */
        kvf_warn("conn %" PRIu64 " %s: closed during the auth challenge",
                 conn->id, conn->peer);
    }
    kvf_auth_session_cleanup(&conn->auth);
    free(conn);
}

/* As kvf_conn_flush, through TLS: SSL_write may also need to read (a
 * handshake in progress); then the read event resumes it. */
static bool kvf_conn_tls_flush(kvf_conn_t *conn)
{
    char why[160];

    while (evbuffer_get_length(conn->out) > 0) {
        int n = kvf_tls_write_some(conn->ssl, conn->out);

        if (n > 0) {
            continue;
        }
        switch (-n) {
        case SSL_ERROR_WANT_WRITE:
            if (!event_pending(conn->ev_write, EV_WRITE, NULL)) {
                event_add(conn->ev_write, NULL);
            }
            return true;
        case SSL_ERROR_WANT_READ:
            return true;
        default:
            kvf_debug("conn %" PRIu64 " %s: tls write: %s", conn->id,
                      conn->peer, kvf_tls_error(why, sizeof(why)));
            return false;
        }
    }
    return true;
}

/* Writes what is queued; leaves the rest to the write event. Returns
 * false when the connection failed (the caller destroys it). */
static bool kvf_conn_flush(kvf_conn_t *conn)
{
    if (evbuffer_get_length(conn->out) == 0) {
        return true;
    }
    if (conn->ssl != NULL) {
        return kvf_conn_tls_flush(conn);
    }
    if (evbuffer_write(conn->out, conn->fd) < 0) {
        int err = EVUTIL_SOCKET_ERROR();

        if (!kvf_conn_is_retriable(err)) {
            kvf_debug("conn %" PRIu64 " %s: write: %s", conn->id, conn->peer,
                      evutil_socket_error_to_string(err));
            return false;
        }
    }
    if ((evbuffer_get_length(conn->out) > 0) &&
        !event_pending(conn->ev_write, EV_WRITE, NULL)) {
        event_add(conn->ev_write, NULL);
    }
    return true;
}

static void kvf_conn_on_write(evutil_socket_t fd, short what, void *arg)
{
    kvf_conn_t *conn = arg;

    if (!kvf_conn_flush(conn)) {
        kvf_conn_destroy(conn);
        return;
    }
    kvf_conn_charge(conn);
    if (evbuffer_get_length(conn->out) > 0) {
        return; /* the event stays added */
    }
    event_del(conn->ev_write);
    if ((conn->ssl != NULL) && !conn->is_closing && !conn->is_throttled) {
        kvf_conn_on_read(fd, EV_READ, conn); /* a read that wanted to write */
        return;
    }
    if (conn->is_closing) {
        kvf_debug("conn %" PRIu64 " %s: closed after error", conn->id,
                  conn->peer);
        kvf_conn_destroy(conn);
        return;
    }
    if (conn->is_throttled) {
        conn->is_throttled = false;
        event_add(conn->ev_read, NULL);
        if (conn->ssl != NULL) {
            /* TLS may hold decrypted bytes the socket will not signal */
            kvf_conn_on_read(fd, EV_READ, conn);
            return;
        }
        kvf_conn_process(conn); /* frames may already be buffered */
    }
}

/* Sends what is queued, then frees the connection (now or once written). */
static void kvf_conn_close_after_flush(kvf_conn_t *conn)
{
    conn->is_closing = true;
    event_del(conn->ev_read);
    if (!kvf_conn_flush(conn) || (evbuffer_get_length(conn->out) == 0)) {
        kvf_conn_destroy(conn);
    }
}

static kvf_status_t kvf_conn_send(kvf_conn_t *conn, uint16_t type,
                                  const ProtobufCMessage *msg)
{
    kvf_status_t status;

    status = kvf_frame_encode(conn->out, type, KVF_FRAME_FLAG_REPLY, msg,
                              (uint32_t)conn->server->cfg->max_frame);
    if (status != KVF_OK) {
        kvf_warn("conn %" PRIu64 ": cannot encode %s: %s", conn->id,
                 kvf_msg_type_name(type), kvf_status_name(status));
    }
    return status;
}

static kvf_status_t kvf_conn_send_status(kvf_conn_t *conn, uint64_t req_id,
                                         kvf_status_t code, const char *text)
{
    Kvf__Status st;
    char buf[256];

    kvf__status__init(&st);
    snprintf(buf, sizeof(buf), "%s", (text != NULL) ? text : "");
    st.request_id = req_id;
    st.status     = code;
    st.message    = buf;
    return kvf_conn_send(conn, KVF_MSG_STATUS, &st.base);
}

kvf_status_t kvf_server_conn_push(kvf_conn_t *conn, uint16_t type,
                                  const ProtobufCMessage *msg)
{
    kvf_status_t status = kvf_conn_send(conn, type, msg);

    /* written on the next loop turn, with whatever else was queued */
    if ((status == KVF_OK) && !event_pending(conn->ev_write, EV_WRITE, NULL)) {
        event_add(conn->ev_write, NULL);
    }
    return status;
}

kvf_status_t kvf_server_conn_push_raw(kvf_conn_t *conn, const void *data,
                                      size_t len)
{
    if (evbuffer_add(conn->out, data, len) != 0) {
        return KVF_ERR_NO_MEMORY;
    }
    if (!event_pending(conn->ev_write, EV_WRITE, NULL)) {
        event_add(conn->ev_write, NULL);
    }
    return KVF_OK;
}

size_t kvf_server_conn_queued(const kvf_conn_t *conn)
{
    return evbuffer_get_length(conn->out);
}

kvf_server_t *kvf_server_conn_server(const kvf_conn_t *conn)
{
    return conn->server;
}

void kvf_server_conn_close(kvf_conn_t *conn)
{
    kvf_conn_destroy(conn);
}

/* Counts a peer error and answers it. */
static void kvf_conn_reject(kvf_conn_t *conn, uint64_t req_id,
                            kvf_status_t code, const char *text)
{
    conn->server->ctr.protocol_errors++;
    kvf_debug("conn %" PRIu64 " %s: %s: %s", conn->id, conn->peer,
              kvf_status_name(code), text);
    kvf_conn_send_status(conn, req_id, code, text);
}

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
static void kvf_server_events_sweep(kvf_server_t *server)
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

static void kvf_server_node_traffic_set(kvf_node_t *node,
                                        const Kvf__NodeTraffic *t)
{
    node->traffic.lookup_chunks        = t->lookup_chunks;
    node->traffic.lookup_local_chunks  = t->lookup_local_chunks;
    node->traffic.lookup_remote_chunks = t->lookup_remote_chunks;
    node->traffic.fetched_chunks       = t->fetched_chunks;
    node->traffic.fetched_bytes        = t->fetched_bytes;
    node->traffic.served_chunks        = t->served_chunks;
    node->traffic.served_bytes         = t->served_bytes;
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
    if (hb->traffic != NULL) {
        kvf_server_node_traffic_set(node, hb->traffic);
    }
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
    if (type == KVF_MSG_ADMIT) {
        status = kvf_registry_admit(server->reg, node->slot, kb->keys.data, n,
                                    &done);
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
        !kvf_server_keys_ok(conn, inv->request_id, &inv->keys)) {
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
        status = kvf_registry_admit(server->reg, node->slot, inv->keys.data,
                                    inv->keys.len / KVF_KEY_WIRE_SIZE, &done);
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

static kvf_status_t kvf_server_lookup_reply(kvf_conn_t *conn, uint64_t req_id,
                                            size_t n, size_t hit, size_t held)
{
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
    rep.recovering   = server->is_recovering && kvf_server_recovering(server);
    rep.term         = server->term;
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
    kvf_registry_lookup(server->reg, lk->keys.data, n,
                        kvf_server_requester_slot(server, lk->requester),
                        lk->any_order, server->slots, &hit);
    return kvf_server_lookup_reply(conn, lk->request_id, n, hit, hit);
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
        kvf_registry_lookup(server->reg,
                            lk->keys.data + r * n * KVF_KEY_WIRE_SIZE, n, req,
                            false, server->slots + r * n, &hit);
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
        }
    }
    return kvf_server_lookup_reply(conn, lk->request_id, total, min_hit,
                                   min_hit * lk->tp_world);
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
        }
        rep.holdings = holdings;
    }
    *rep_p = rep;
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
static kvf_status_t kvf_server_dispatch(kvf_conn_t *conn, kvf_frame_t *frame)
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

static void kvf_server_observe(kvf_server_t *server, uint64_t ns)
{
    unsigned b;

    server->ctr.requests++;
    server->ctr.lat_sum_ns += ns;
    for (b = 0; b < KVF_SERVER_LAT_BUCKETS; b++) {
        if ((double)ns <= kvf_server_lat_bounds_us[b] * 1000.0) {
            server->ctr.lat_buckets[b]++;
            break;
        }
    }
}

#define KVF_SERVER_ARENA_SIZE (256u << 10)

static void *kvf_server_arena_alloc(void *data, size_t size)
{
    kvf_server_t *server = data;
    size_t need          = (size + 15) & ~(size_t)15;

    if (need <= server->arena_size - server->arena_used) {
        void *p = server->arena + server->arena_used;

        server->arena_used += need;
        return p;
    }
    server->arena_spills++;
    return malloc(size);
}

static void kvf_server_arena_free(void *data, void *ptr)
{
    kvf_server_t *server = data;
    uint8_t *p           = ptr;

    if ((p >= server->arena) && (p < server->arena + server->arena_size)) {
        return; /* reset after the frame */
    }
    free(ptr);
}

/* Until a peer said HELLO (and proved the secret, with one) it may send
 * small frames only, so an unauthenticated client cannot make the
 * controller buffer 16 MiB. */
static uint32_t kvf_conn_max_frame(const kvf_conn_t *conn)
{
    if (kvf_conn_is_preauth(conn)) {
        return KVF_AUTH_FRAME_MAX;
    }
    return (uint32_t)conn->server->cfg->max_frame;
}

/*
 * The connection to close when a buffer cap is exceeded: the one charged
 * most (a flood's partial frames, replies nobody reads), the oldest among
 * equals (a legitimate handshake ends in milliseconds, a flood's
 * connections wait). @p is_preauth_only: among unauthenticated ones.
 */
static kvf_conn_t *kvf_server_shed_victim(kvf_server_t *server,
                                          bool is_preauth_only)
{
    kvf_conn_t *conn, *victim = NULL;

    for (conn = server->conns; conn != NULL; conn = conn->next) {
        if ((conn->charged == 0) ||
            (is_preauth_only && !conn->is_charged_preauth)) {
            continue;
        }
        if ((victim == NULL) || (conn->charged >= victim->charged)) {
            victim = conn; /* the list is newest first: >= keeps the oldest */
        }
    }
    return victim;
}

/*
 * Closes connections until max_buffered_preauth and max_buffered hold
 * again, counting each (kvf_controller_buffer_closes_total) and warning at
 * most once per 10 s. Returns false when @p conn was closed.
 */
static bool kvf_server_shed(kvf_server_t *server, kvf_conn_t *conn)
{
    const kvf_controller_config_t *cfg = server->cfg;
    bool is_conn_open                  = true;

    while ((server->buffered_preauth > cfg->max_buffered_preauth) ||
           (server->buffered > cfg->max_buffered)) {
        bool is_preauth = server->buffered_preauth > cfg->max_buffered_preauth;
        kvf_conn_t *victim = kvf_server_shed_victim(server, is_preauth);
        uint64_t now       = kvf_time_now_ms();

        if (victim == NULL) {
            break;
        }
        server->ctr.buffer_closes++;
        if ((server->last_shed_log_ms == 0) ||
            (now - server->last_shed_log_ms >= 10000)) {
            kvf_warn("conn %" PRIu64 " %s: closed holding %" PRIu64
                     " buffered bytes: over %s (%" PRIu64 " closed so far)",
                     victim->id, victim->peer, victim->charged,
                     is_preauth ? "max_buffered_preauth" : "max_buffered",
                     server->ctr.buffer_closes);
            server->last_shed_log_ms = now;
        }
        if (victim == conn) {
            is_conn_open = false;
        }
        kvf_conn_destroy(victim);
    }
    return is_conn_open;
}

/* Decodes and answers every whole frame buffered, then writes the replies.
 * May destroy @p conn. */
static void kvf_conn_process(kvf_conn_t *conn)
{
    kvf_server_t *server     = conn->server;
    ProtobufCAllocator alloc = {.alloc          = kvf_server_arena_alloc,
                                .free           = kvf_server_arena_free,
                                .allocator_data = server};
    kvf_frame_t frame;
    kvf_status_t status;
    char text[128];

    while (!conn->is_closing) {
        uint64_t t0;

        if (evbuffer_get_length(conn->out) > server->cfg->max_output) {
            /* the peer does not read its replies: stop reading from it */
            conn->is_throttled = true;
            server->ctr.backpressure++;
            event_del(conn->ev_read);
            break;
        }
        t0 = kvf_time_now_ns();
        if ((server->serve_until_ns != NULL) &&
            (t0 >= atomic_load_explicit(server->serve_until_ns,
                                        memory_order_relaxed))) {
            /* leader lease about to expire: answer nothing more */
            kvf_error("leader lease expired: not answering; stopping");
            event_base_loopbreak(server->base);
            kvf_conn_destroy(conn);
            return;
        }
        server->arena_used = 0;
        status = kvf_frame_decode(conn->in, kvf_conn_max_frame(conn), &alloc,
                                  &frame);
        if (status == KVF_INPROGRESS) {
            break;
        }
        if (status != KVF_OK) {
            snprintf(text, sizeof(text), "bad frame: %s",
                     (status == KVF_ERR_TOO_BIG) ? "over max_frame"
                                                 : "malformed");
            kvf_conn_reject(conn, 0, status, text);
            kvf_conn_close_after_flush(conn);
            return;
        }
        status = kvf_server_dispatch(conn, &frame);
        kvf_frame_release(&frame, &alloc);
        kvf_server_observe(server, kvf_time_now_ns() - t0);
        if (status == KVF_ERR_PROTO) {
            kvf_conn_close_after_flush(conn);
            return;
        }
    }
    if (!kvf_conn_flush(conn)) {
        kvf_conn_destroy(conn);
        return;
    }
    kvf_conn_charge(conn);
}

/* Reads what TLS has decrypted into conn->in. Returns false when the
 * connection closed or failed (the caller destroys it). */
static bool kvf_conn_tls_read(kvf_conn_t *conn)
{
    char why[160];
    int n, i;

    /* 256 KiB per turn, as the plain path: a fast sender cannot keep the
     * loop here; what TLS already decrypted is read on the next turn */
    for (i = 0;; i++) {
        if (i == 4) {
            if (SSL_pending(conn->ssl) > 0) {
                event_active(conn->ev_read, EV_READ, 0);
            }
            return true;
        }
        n               = kvf_tls_read_some(conn->ssl, conn->in);
        conn->is_tls_up = conn->is_tls_up || SSL_is_init_finished(conn->ssl);
        if (n > 0) {
            continue;
        }
        switch (-n) {
        case SSL_ERROR_WANT_READ:
            return true;
        case SSL_ERROR_WANT_WRITE:
            if (!event_pending(conn->ev_write, EV_WRITE, NULL)) {
                event_add(conn->ev_write, NULL);
            }
            return true;
        case SSL_ERROR_ZERO_RETURN:
            kvf_debug("conn %" PRIu64 " %s: closed by peer", conn->id,
                      conn->peer);
            return false;
        default:
            if (conn->is_tls_up) { /* e.g. closed without close_notify */
                kvf_debug("conn %" PRIu64 " %s: tls: %s", conn->id, conn->peer,
                          kvf_tls_error(why, sizeof(why)));
                return false;
            }
            /* a plain-TCP client, a certificate the client refused */
            conn->server->ctr.tls_failures++;
            kvf_info("conn %" PRIu64 " %s: tls handshake failed: %s", conn->id,
                     conn->peer, kvf_tls_error(why, sizeof(why)));
            return false;
        }
    }
}

static void kvf_conn_on_read(evutil_socket_t fd, short what, void *arg)
{
    kvf_conn_t *conn = arg;
    struct evbuffer_iovec vec;
    ssize_t n = -1;

    if (conn->ssl != NULL) {
        if (conn->is_throttled) {
            return; /* a pending-data wakeup while reading is paused */
        }
        if (!kvf_conn_tls_read(conn)) {
            kvf_conn_destroy(conn);
            return;
        }
        kvf_conn_charge(conn);
        if (kvf_server_shed(conn->server, conn)) {
            kvf_conn_process(conn);
        }
        return;
    }

    if (evbuffer_reserve_space(conn->in, kvf_conn_read_size(conn), &vec, 1) ==
        1) {
        n = recv(fd, vec.iov_base, vec.iov_len, 0);
        if (n > 0) {
            vec.iov_len = (size_t)n;
            evbuffer_commit_space(conn->in, &vec, 1);
        }
    }
    if (n == 0) {
        kvf_debug("conn %" PRIu64 " %s: closed by peer", conn->id, conn->peer);
        kvf_conn_destroy(conn);
        return;
    }
    if (n < 0) {
        int err = EVUTIL_SOCKET_ERROR();

        if (kvf_conn_is_retriable(err)) {
            return;
        }
        kvf_debug("conn %" PRIu64 " %s: read: %s", conn->id, conn->peer,
                  evutil_socket_error_to_string(err));
        kvf_conn_destroy(conn);
        return;
    }
    kvf_conn_charge(conn);
    if (kvf_server_shed(conn->server, conn)) {
        kvf_conn_process(conn);
    }
}

/* A connection on @p fd (which it now owns), linked into the server;
 * NULL (fd closed) when it cannot be set up. */
static kvf_conn_t *kvf_conn_create(kvf_server_t *server, evutil_socket_t fd)
{
    kvf_conn_t *conn;

    conn = calloc(1, sizeof(*conn));
    if (conn == NULL) {
        evutil_closesocket(fd);
        return NULL;
    }
    conn->fd     = fd; /* fd now belongs to conn */
    conn->server = server;
    kvf_auth_session_init(&conn->auth, &server->secret);
    conn->in       = evbuffer_new();
    conn->out      = evbuffer_new();
    conn->ev_read  = event_new(server->base, fd, EV_READ | EV_PERSIST,
                               kvf_conn_on_read, conn);
    conn->ev_write = event_new(server->base, fd, EV_WRITE | EV_PERSIST,
                               kvf_conn_on_write, conn);
    conn->next     = server->conns;
    if (server->conns != NULL) {
        server->conns->prev = conn;
    }
    server->conns = conn;
    server->num_conns++;
    if ((conn->in == NULL) || (conn->out == NULL) || (conn->ev_read == NULL) ||
        (conn->ev_write == NULL) || (evutil_make_socket_nonblocking(fd) != 0)) {
        kvf_warn("conn: cannot set up an accepted connection");
        kvf_conn_destroy(conn);
        return NULL;
    }
    conn->id          = ++server->ctr.connections_total;
    conn->accepted_ms = kvf_time_now_ms();
    return conn;
}

static void kvf_server_on_accept(struct evconnlistener *lst, evutil_socket_t fd,
                                 struct sockaddr *sa, int salen, void *arg)
{
    kvf_server_t *server = arg;
    kvf_conn_t *conn;
    int one = 1;

    conn = kvf_conn_create(server, fd);
    if (conn == NULL) {
        return;
    }
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    if (server->tls != NULL) {
        conn->ssl = SSL_new(server->tls);
        if ((conn->ssl == NULL) || (SSL_set_fd(conn->ssl, fd) != 1)) {
            kvf_warn("conn %" PRIu64 ": no memory for TLS", conn->id);
            kvf_conn_destroy(conn);
            return;
        }
        SSL_set_accept_state(conn->ssl);
    }
    if (sa->sa_family == AF_INET) {
        const struct sockaddr_in *sin = (const struct sockaddr_in *)sa;
        char host[INET_ADDRSTRLEN];

        inet_ntop(AF_INET, &sin->sin_addr, host, sizeof(host));
        snprintf(conn->peer, sizeof(conn->peer), "%s:%u", host,
                 ntohs(sin->sin_port));
    } else {
        snprintf(conn->peer, sizeof(conn->peer), "peer");
    }
    event_add(conn->ev_read, NULL);
    kvf_debug("conn %" PRIu64 " %s: accepted", conn->id, conn->peer);
}

static void kvf_server_on_purge(evutil_socket_t fd, short what, void *arg)
{
    kvf_server_t *server = arg;
    struct timeval tv    = {0, 0};

    if (kvf_registry_purge_step(server->reg, server->cfg->purge_slice) > 0) {
        event_add(server->purge, &tv); /* next slice after pending I/O */
    }
}

/* A connection that has not authenticated (with a secret or TLS) or not
 * said HELLO (without) within handshake_timeout is closed: an
 * unauthenticated peer cannot hold connections (and file descriptors)
 * for ever. */
static void kvf_server_expire_handshakes(kvf_server_t *server)
{
    uint64_t now = kvf_time_now_ms();
    kvf_conn_t *conn, *next;

    for (conn = server->conns; conn != NULL; conn = next) {
        next = conn->next;
        if (!kvf_conn_is_preauth(conn)) {
            continue;
        }
        if ((now - conn->accepted_ms) * KVF_NSEC_PER_MSEC <
            server->cfg->handshake_timeout_ns) {
            continue;
        }
        server->ctr.handshake_timeouts++;
        kvf_warn("conn %" PRIu64 " %s: not authenticated within the "
                 "handshake timeout; closing",
                 conn->id, conn->peer);
        kvf_auth_session_refuse(&conn->auth); /* counted here, not twice */
        kvf_conn_destroy(conn);
    }
}

static void kvf_server_on_tick(evutil_socket_t fd, short what, void *arg)
{
    kvf_server_t *server = arg;

    kvf_server_expire_handshakes(server);
    if (server->is_standby) {
        /* the leader decides who is dead, and says so; forget the dead */
        kvf_node_table_expire(server->nodes, kvf_time_now_ms(), UINT64_MAX,
                              server->cfg->forget_dead_ns / KVF_NSEC_PER_MSEC);
        return;
    }
    if (kvf_node_table_expire(server->nodes, kvf_time_now_ms(),
                              server->cfg->lease_ns / KVF_NSEC_PER_MSEC,
                              server->cfg->forget_dead_ns / KVF_NSEC_PER_MSEC) >
        0) {
        kvf_replica_forward_deaths(server);
        kvf_server_purge_kick(server);
    }
    kvf_server_events_sweep(server);
    kvf_server_recovering(server);
    kvf_hastate_sync(server);
    kvf_replica_tick(server);
}

static void kvf_server_on_signal(evutil_socket_t sig, short what, void *arg)
{
    kvf_server_t *server = arg;

    kvf_info("signal %d: shutting down", (int)sig);
    server->is_quit = true;
    event_base_loopexit(server->base, NULL);
}

static kvf_status_t kvf_server_bind(kvf_server_t *server)
{
    struct sockaddr_storage ss;
    struct sockaddr_in *sin   = (struct sockaddr_in *)&ss;
    struct sockaddr_in6 *sin6 = (struct sockaddr_in6 *)&ss;
    socklen_t len             = sizeof(ss);
    bool is_v6;
    char host[256], what[320];
    uint16_t port;

    if (kvf_config_parse_hostport(server->cfg->listen, host, sizeof(host),
                                  &port) != KVF_OK) {
        kvf_error("listen: bad address '%s' (want HOST:PORT, [IPv6]:PORT)",
                  server->cfg->listen);
        return KVF_ERR_CONFIG;
    }
    memset(&ss, 0, sizeof(ss));
    is_v6 = strchr(host, ':') != NULL;
    if (is_v6) {
        sin6->sin6_family = AF_INET6;
        sin6->sin6_port   = htons(port);
    } else {
        sin->sin_family = AF_INET;
        sin->sin_port   = htons(port);
    }
    if (inet_pton(is_v6 ? AF_INET6 : AF_INET, host,
                  is_v6 ? (void *)&sin6->sin6_addr : (void *)&sin->sin_addr) !=
        1) {
        kvf_error("listen: '%s' is not an IP address (IPv6 as [::1]:7400)",
                  host);
        return KVF_ERR_CONFIG;
    }
    server->listener = evconnlistener_new_bind(
        server->base, kvf_server_on_accept, server,
        LEV_OPT_CLOSE_ON_FREE | LEV_OPT_REUSEABLE, 128, (struct sockaddr *)&ss,
        is_v6 ? sizeof(*sin6) : sizeof(*sin));
    if (server->listener == NULL) {
        kvf_error("listen %s: %m", server->cfg->listen);
        return KVF_ERR_IO;
    }
    getsockname(evconnlistener_get_fd(server->listener), (struct sockaddr *)&ss,
                &len);
    snprintf(server->listen_addr, sizeof(server->listen_addr),
             is_v6 ? "[%s]:%u" : "%s:%u", host,
             ntohs(is_v6 ? sin6->sin6_port : sin->sin_port));
    snprintf(what, sizeof(what), "control port %s", server->listen_addr);
    if (kvf_listen_guard_init(&server->listen_guard, server->base,
                              server->listener, what) != KVF_OK) {
        return KVF_ERR_NO_MEMORY;
    }
    kvf_info("listening on %s%s", server->listen_addr,
             (server->tls != NULL) ? " (TLS)" : "");
    return KVF_OK;
}

static kvf_status_t kvf_server_write_port_file(kvf_server_t *server)
{
    const char *path = server->cfg->port_file;
    char tmp[4096];
    FILE *f;

    if ((path == NULL) || (path[0] == '\0')) {
        return KVF_OK;
    }
    snprintf(tmp, sizeof(tmp), "%s.tmp", path);
    f = fopen(tmp, "w");
    if (f == NULL) {
        kvf_error("port file %s: %m", tmp);
        return KVF_ERR_IO;
    }
    fprintf(f, "%s\n%s\n", server->listen_addr, server->http_addr);
    if ((fclose(f) != 0) || (rename(tmp, path) != 0)) {
        kvf_error("port file %s: %m", path);
        return KVF_ERR_IO;
    }
    return KVF_OK;
}

static kvf_status_t kvf_server_create_as(const kvf_controller_config_t *cfg,
                                         struct event_base *base,
                                         bool is_standby,
                                         kvf_server_t **server_p)
{
    kvf_server_t *server;
    kvf_status_t status;
    struct timeval tick;
    uint64_t tick_ms;
    char text[512];

    server = calloc(1, sizeof(*server));
    if (server == NULL) {
        return KVF_ERR_NO_MEMORY;
    }
    server->cfg           = cfg;
    server->base          = base;
    server->is_standby    = is_standby;
    server->start_ms      = kvf_time_now_ms();
    server->is_recovering = cfg->recovery_window_ns > 0;
    status = kvf_auth_secret_load_opt(cfg->cluster_secret_file, &server->secret,
                                      text, sizeof(text));
    if (status != KVF_OK) {
        kvf_error("%s", text);
        goto err_free;
    }
    kvf_auth_warn_if_open(&server->secret, "listen address", cfg->listen);
    if (((cfg->tls_cert != NULL) && (cfg->tls_cert[0] != '\0')) ||
        ((cfg->tls_key != NULL) && (cfg->tls_key[0] != '\0'))) {
        status = kvf_tls_server_ctx_create(cfg->tls_cert, cfg->tls_key,
                                           &server->tls, text, sizeof(text));
        if (status != KVF_OK) {
            kvf_error("%s", text);
            goto err_free;
        }
    }
    status = kvf_registry_create(cfg->initial_keys, (uint32_t)cfg->max_batch,
                                 &server->reg);
    if (status != KVF_OK) {
        goto err_free;
    }
    status = kvf_node_table_create(server->reg, &server->nodes);
    if (status != KVF_OK) {
        goto err_free;
    }
    status = kvf_index_create((uint32_t)cfg->max_batch, &server->index);
    if (status != KVF_OK) {
        goto err_free;
    }
    if ((cfg->events != NULL) && (cfg->events[0] != '\0')) {
        status =
            kvf_events_create(base, cfg->events, cfg->events_replay,
                              (uint32_t)cfg->events_buffer, &server->events);
        if (status != KVF_OK) {
            goto err_free;
        }
    }
    server->arena_size = KVF_SERVER_ARENA_SIZE;
    server->arena      = malloc(server->arena_size);
    server->slots      = calloc(cfg->max_batch, sizeof(*server->slots));
    server->holders    = calloc(cfg->max_batch, 4);
    server->tick  = event_new(base, -1, EV_PERSIST, kvf_server_on_tick, server);
    server->purge = evtimer_new(base, kvf_server_on_purge, server);
    server->sig_term =
        evsignal_new(base, SIGTERM, kvf_server_on_signal, server);
    server->sig_int = evsignal_new(base, SIGINT, kvf_server_on_signal, server);
    if ((server->arena == NULL) || (server->slots == NULL) ||
        (server->holders == NULL) || (server->tick == NULL) ||
        (server->purge == NULL) || (server->sig_term == NULL) ||
        (server->sig_int == NULL)) {
        status = KVF_ERR_NO_MEMORY;
        goto err_free;
    }
    status = is_standby ? KVF_OK : kvf_server_bind(server);
    if (status != KVF_OK) {
        goto err_free;
    }
    status = kvf_server_http_start(server);
    if (status != KVF_OK) {
        goto err_free;
    }
    status = kvf_server_write_port_file(server);
    if (status != KVF_OK) {
        goto err_free;
    }
    tick_ms = cfg->lease_ns / KVF_NSEC_PER_MSEC / 4;
    if (tick_ms > 250) {
        tick_ms = 250;
    }
    if (tick_ms < 2) {
        tick_ms = 2;
    }
    tick.tv_sec  = (time_t)(tick_ms / 1000);
    tick.tv_usec = (suseconds_t)((tick_ms % 1000) * 1000);
    event_add(server->tick, &tick);
    event_add(server->sig_term, NULL);
    event_add(server->sig_int, NULL);
    *server_p = server;
    return KVF_OK;

err_free:
    kvf_server_destroy(server);
    return status;
}

kvf_status_t kvf_server_create(const kvf_controller_config_t *cfg,
                               struct event_base *base, kvf_server_t **server_p)
{
    return kvf_server_create_as(cfg, base, false, server_p);
}

kvf_status_t kvf_server_create_standby(const kvf_controller_config_t *cfg,
                                       struct event_base *base,
                                       kvf_server_t **server_p)
{
    return kvf_server_create_as(cfg, base, true, server_p);
}

kvf_status_t kvf_server_take_over(kvf_server_t *server)
{
    kvf_status_t status;

    if (!server->is_standby) {
        return KVF_OK;
    }
    kvf_replica_take_over(server); /* before the first request */
    server->is_standby = false;
    kvf_hastate_load(server); /* logs what it could not read */
    server->start_ms = kvf_time_now_ms();
    status           = kvf_server_bind(server);
    if (status == KVF_OK) {
        status = kvf_server_write_port_file(server);
    }
    return status;
}

void kvf_server_destroy(kvf_server_t *server)
{
    if (server == NULL) {
        return;
    }
    while (server->conns != NULL) {
        kvf_conn_destroy(server->conns);
    }
    kvf_server_http_stop(server);
    kvf_listen_guard_cleanup(&server->listen_guard);
    if (server->listener != NULL) {
        evconnlistener_free(server->listener);
    }
    if (server->sig_int != NULL) {
        event_free(server->sig_int);
    }
    if (server->sig_term != NULL) {
        event_free(server->sig_term);
    }
    if (server->purge != NULL) {
        event_free(server->purge);
    }
    if (server->tick != NULL) {
        event_free(server->tick);
    }
    free(server->holders);
    free(server->slots);
    free(server->arena);
    free(server->pins[0].keys);
    free(server->pins[1].keys);
    kvf_replica_destroy(server);
    free(server->ha_drained);
    kvf_events_destroy(server->events);
    free(server->event_nodes);
    kvf_index_destroy(server->index);
    kvf_node_table_destroy(server->nodes);
    kvf_registry_destroy(server->reg);
    kvf_auth_secret_cleanup(&server->secret);
    SSL_CTX_free(server->tls);
    free(server);
}

void kvf_server_addresses(const kvf_server_t *server, const char **control_p,
                          const char **http_p)
{
    *control_p = server->listen_addr;
    *http_p    = server->http_addr;
}

void kvf_server_set_term(kvf_server_t *server, uint64_t term)
{
    server->term = term;
}

void kvf_server_follow(kvf_server_t *server, const char *control)
{
    if (server->is_standby && (server->replica == NULL) &&
        (kvf_replica_create(server) != KVF_OK)) {
        return;
    }
    kvf_replica_step(server, control);
}

struct event_base *kvf_server_base(const kvf_server_t *server)
{
    return server->base;
}

bool kvf_server_quit_requested(const kvf_server_t *server)
{
    return server->is_quit;
}

void kvf_server_set_election(kvf_server_t *server,
                             struct kvf_election *election)
{
    server->election = election;
}

void kvf_server_set_lease(kvf_server_t *server,
                          const _Atomic uint64_t *serve_until_ns)
{
    server->serve_until_ns = serve_until_ns;
}

kvf_status_t kvf_server_run(kvf_server_t *server)
{
    if (event_base_dispatch(server->base) < 0) {
        kvf_error("event loop failed");
        return KVF_ERR_IO;
    }
    return KVF_OK;
}

void kvf_server_feed(kvf_server_t *server, const void *data, size_t len)
{
    kvf_conn_t *conn;
    uint64_t id;
    int sv[2];

    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) {
        return;
    }
    conn = kvf_conn_create(server, sv[0]); /* sv[0] now belongs to conn */
    if (conn == NULL) {
        close(sv[1]);
        return;
    }
    id = conn->id;
    snprintf(conn->peer, sizeof(conn->peer), "feed");
    if (evbuffer_add(conn->in, data, len) == 0) {
        kvf_conn_process(conn); /* may destroy conn */
    }
    for (conn = server->conns; conn != NULL; conn = conn->next) {
        if (conn->id == id) {
            kvf_conn_destroy(conn);
            break;
        }
    }
    evutil_closesocket(sv[1]);
}
