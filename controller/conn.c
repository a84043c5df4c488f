/* SPDX-License-Identifier: Apache-2.0 */
/* Copyright (c) 2026 The kvfabric authors */
/* The controller's connections over proto/evconn.h: accept, buffer caps
 * across connections, handshake expiry. Frames go to server->dispatch
 * (handlers.c). */
#include "controller/conn.h"

#include "controller/server_int.h"
#include "common/log.h"
#include "common/time.h"

#include <event2/event.h>
#include <event2/listener.h>

#include <openssl/ssl.h>

#include <arpa/inet.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

/* Has the peer not proved itself yet (no HELLO, or no AUTH with a
 * secret)? Such peers get small frames and a small buffer budget. */
static bool kvf_conn_is_preauth(const kvf_conn_t *conn)
{
    return !conn->is_hello_done || !kvf_auth_session_is_done(&conn->auth);
}

void kvf_conn_destroy(kvf_conn_t *conn)
{
    kvf_server_t *server = conn->server;

    if (conn->prev != NULL) {
        conn->prev->next = conn->next;
    } else {
        server->conns = conn->next;
    }
    if (conn->next != NULL) {
        conn->next->prev = conn->prev;
    }
    server->num_conns--;
    kvf_evconn_destroy(conn->ev);
    if (kvf_auth_session_is_abandoned(&conn->auth)) {
        server->ctr.auth_failures++; /* the client refused our proof */
        kvf_warn("conn %" PRIu64 " %s: closed during the auth challenge",
                 conn->id, conn->peer);
    }
    kvf_auth_session_cleanup(&conn->auth);
    free(conn);
}

kvf_status_t kvf_conn_send(kvf_conn_t *conn, uint16_t type,
                           const ProtobufCMessage *msg)
{
    return kvf_evconn_send(conn->ev, type, msg);
}

kvf_status_t kvf_conn_send_status(kvf_conn_t *conn, uint64_t req_id,
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

void kvf_conn_reject(kvf_conn_t *conn, uint64_t req_id, kvf_status_t code,
                     const char *text)
{
    conn->server->ctr.protocol_errors++;
    kvf_debug("conn %" PRIu64 " %s: %s: %s", conn->id, conn->peer,
              kvf_status_name(code), text);
    kvf_conn_send_status(conn, req_id, code, text);
}

/*
 * The connection to close when a buffer cap is exceeded: the one charged
 * most (a flood's partial frames, replies nobody reads), the oldest among
 * equals (a legitimate handshake ends in milliseconds, a flood's
 * connections wait). @p is_preauth_only: among unauthenticated ones.
 */
static kvf_conn_t *kvf_server_shed_victim(kvf_server_t *server,
                                          bool is_preauth_only,
                                          uint64_t *held_p)
{
    kvf_conn_t *conn, *victim = NULL;
    uint64_t most = 0;

    for (conn = server->conns; conn != NULL; conn = conn->next) {
        bool is_preauth;
        uint64_t held = kvf_evconn_held(conn->ev, &is_preauth);

        if ((held == 0) || (is_preauth_only && !is_preauth)) {
            continue;
        }
        if ((victim == NULL) || (held >= most)) {
            victim = conn; /* the list is newest first: >= keeps the oldest */
            most   = held;
        }
    }
    *held_p = most;
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
    const kvf_evconn_group_t *group    = &server->group;
    bool is_conn_open                  = true;

    while ((group->buffered_preauth > cfg->max_buffered_preauth) ||
           (group->buffered > cfg->max_buffered)) {
        bool is_preauth = group->buffered_preauth > cfg->max_buffered_preauth;
        uint64_t held;
        kvf_conn_t *victim = kvf_server_shed_victim(server, is_preauth, &held);
        uint64_t now       = kvf_time_now_ms();

        if (victim == NULL) {
            break;
        }
        server->ctr.buffer_closes++;
        if ((server->last_shed_log_ms == 0) ||
            (now - server->last_shed_log_ms >= 10000)) {
            kvf_warn("conn %" PRIu64 " %s: closed holding %" PRIu64
                     " buffered bytes: over %s (%" PRIu64 " closed so far)",
                     victim->id, victim->peer, held,
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

static kvf_status_t kvf_conn_on_frame(kvf_evconn_t *ev, kvf_frame_t *frame)
{
    kvf_conn_t *conn     = kvf_evconn_arg(ev);
    kvf_server_t *server = conn->server;

    if ((server->serve_until_ns != NULL) &&
        (kvf_time_now_ns() >=
         atomic_load_explicit(server->serve_until_ns, memory_order_relaxed))) {
        /* leader lease about to expire: answer nothing more */
        kvf_error("leader lease expired: not answering; stopping");
        event_base_loopbreak(server->base);
        return KVF_ERR_CANCELED;
    }
    /* KVF_ERR_PROTO closes the connection; other failures were answered */
    return (server->dispatch(conn, frame) == KVF_ERR_PROTO) ? KVF_ERR_PROTO
                                                            : KVF_OK;
}

static kvf_status_t kvf_conn_on_bad_frame(kvf_evconn_t *ev, kvf_status_t status)
{
    char text[128];

    snprintf(text, sizeof(text), "bad frame: %s",
             (status == KVF_ERR_TOO_BIG) ? "over max_frame" : "malformed");
    kvf_conn_reject(kvf_evconn_arg(ev), 0, status, text);
    return KVF_ERR_PROTO;
}

static bool kvf_conn_on_read(kvf_evconn_t *ev)
{
    kvf_conn_t *conn = kvf_evconn_arg(ev);

    return kvf_server_shed(conn->server, conn);
}

static void kvf_conn_on_close(kvf_evconn_t *ev, kvf_status_t why)
{
    kvf_conn_destroy(kvf_evconn_arg(ev));
}

static bool kvf_conn_ev_is_preauth(const kvf_evconn_t *ev)
{
    return kvf_conn_is_preauth(kvf_evconn_arg(ev));
}

static void kvf_conn_on_served(kvf_evconn_t *ev, uint64_t ns)
{
    kvf_conn_t *conn = kvf_evconn_arg(ev);

    kvf_server_latency_observe(&conn->server->ctr.requests, ns);
}

static const kvf_evconn_ops_t kvf_conn_ops = {
    .on_frame     = kvf_conn_on_frame,
    .on_bad_frame = kvf_conn_on_bad_frame,
    .on_read      = kvf_conn_on_read,
    .on_close     = kvf_conn_on_close,
    .is_preauth   = kvf_conn_ev_is_preauth,
    .on_served    = kvf_conn_on_served,
};

kvf_status_t kvf_conn_group_init(kvf_server_t *server)
{
    kvf_evconn_group_t *group = &server->group;

    group->base              = server->base;
    group->ops               = &kvf_conn_ops;
    group->max_frame         = (uint32_t)server->cfg->max_frame;
    group->max_frame_preauth = KVF_AUTH_FRAME_MAX;
    group->max_output        = server->cfg->max_output;
    group->arena_size        = KVF_SERVER_ARENA_SIZE;
    group->arena             = malloc(group->arena_size);
    return (group->arena != NULL) ? KVF_OK : KVF_ERR_NO_MEMORY;
}

/* A connection on @p fd (which it now owns) with @p ssl (owned; NULL:
 * plain), linked into the server; NULL (fd closed) when it cannot be set
 * up. */
static kvf_conn_t *kvf_conn_create(kvf_server_t *server, evutil_socket_t fd,
                                   SSL *ssl)
{
    kvf_conn_t *conn;

    conn = calloc(1, sizeof(*conn));
    if (conn == NULL) {
        SSL_free(ssl);
        evutil_closesocket(fd);
        return NULL;
    }
    conn->server = server;
    kvf_auth_session_init(&conn->auth, &server->secret);
    conn->ev = kvf_evconn_create(&server->group, fd, ssl, conn);
    if (conn->ev == NULL) {
        kvf_warn("conn: cannot set up an accepted connection");
        kvf_auth_session_cleanup(&conn->auth);
        free(conn);
        return NULL;
    }
    conn->next = server->conns;
    if (server->conns != NULL) {
        server->conns->prev = conn;
    }
    server->conns = conn;
    server->num_conns++;
    conn->id          = ++server->ctr.connections_total;
    conn->accepted_ms = kvf_time_now_ms();
    return conn;
}

void kvf_conn_on_accept(struct evconnlistener *lst, evutil_socket_t fd,
                        struct sockaddr *sa, int salen, void *arg)
{
    kvf_server_t *server = arg;
    kvf_conn_t *conn;
    SSL *ssl = NULL;
    int one  = 1;

    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    if (server->tls != NULL) {
        ssl = SSL_new(server->tls);
        if ((ssl == NULL) || (SSL_set_fd(ssl, fd) != 1)) {
            kvf_warn("conn %" PRIu64 ": no memory for TLS",
                     server->ctr.connections_total + 1);
            SSL_free(ssl);
            evutil_closesocket(fd);
            return;
        }
        SSL_set_accept_state(ssl);
    }
    conn = kvf_conn_create(server, fd, ssl);
    if (conn == NULL) {
        return;
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
    {
        char name[96];

        snprintf(name, sizeof(name), "%" PRIu64 " %s", conn->id, conn->peer);
        kvf_evconn_set_name(conn->ev, name);
    }
    kvf_debug("conn %" PRIu64 " %s: accepted", conn->id, conn->peer);
}

/* A connection that has not authenticated (with a secret or TLS) or not
 * said HELLO (without) within handshake_timeout is closed: an
 * unauthenticated peer cannot hold connections (and file descriptors)
 * for ever. */
void kvf_conn_expire_handshakes(kvf_server_t *server)
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

void kvf_server_feed(kvf_server_t *server, const void *data, size_t len)
{
    kvf_conn_t *conn;
    uint64_t id;
    int sv[2];

    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) {
        return;
    }
    conn = kvf_conn_create(server, sv[0], NULL); /* sv[0] belongs to conn */
    if (conn == NULL) {
        close(sv[1]);
        return;
    }
    id = conn->id;
    snprintf(conn->peer, sizeof(conn->peer), "feed");
    kvf_evconn_feed(conn->ev, data, len); /* may destroy conn */
    for (conn = server->conns; conn != NULL; conn = conn->next) {
        if (conn->id == id) {
            kvf_conn_destroy(conn);
            break;
        }
    }
    evutil_closesocket(sv[1]);
}
