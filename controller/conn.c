/* SPDX-License-Identifier: Apache-2.0 */
/* Copyright (c) 2026 The kvfabric authors */
/* The controller's framed connections: TLS or TCP, batched reads, buffer
 * caps, pre-auth limits. Frames go to server->dispatch (handlers.c). */
#include "controller/conn.h"

#include "controller/server_int.h"
#include "common/log.h"
#include "common/time.h"
#include "common/tls.h"
#include "proto/frame.h"

#include <event2/buffer.h>
#include <event2/event.h>
#include <event2/listener.h>

#include <openssl/ssl.h>

#include <arpa/inet.h>
#include <errno.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

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

kvf_status_t kvf_conn_send(kvf_conn_t *conn, uint16_t type,
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

/* Counts a peer error and answers it. */
void kvf_conn_reject(kvf_conn_t *conn, uint64_t req_id, kvf_status_t code,
                     const char *text)
{
    conn->server->ctr.protocol_errors++;
    kvf_debug("conn %" PRIu64 " %s: %s: %s", conn->id, conn->peer,
              kvf_status_name(code), text);
    kvf_conn_send_status(conn, req_id, code, text);
}

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
        status = server->dispatch(conn, &frame);
        kvf_frame_release(&frame, &alloc);
        kvf_server_latency_observe(&server->ctr.requests,
                                   kvf_time_now_ns() - t0);
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

void kvf_conn_on_accept(struct evconnlistener *lst, evutil_socket_t fd,
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
