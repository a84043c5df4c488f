/* SPDX-License-Identifier: Apache-2.0 */
/* Copyright (c) 2026 The kvfabric authors */
#include "proto/evconn.h"

#include "common/log.h"
#include "common/time.h"
#include "common/tls.h"

#include <event2/buffer.h>
#include <event2/event.h>

#include <openssl/ssl.h>
#include <openssl/x509.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

struct kvf_evconn {
    kvf_evconn_group_t *group;
    void *arg;
    evutil_socket_t fd;
    struct event *ev_read;
    struct event *ev_write; /* added only while output is left over */
    struct evbuffer *in;
    struct evbuffer *out;
    SSL *ssl;                /* NULL: plain */
    bool is_tls_up;          /* the TLS handshake completed */
    bool is_processing;      /* inside kvf_evconn_process */
    bool is_closing;         /* flush the output, then close */
    bool is_throttled;       /* reading paused: output over max_output */
    bool is_charged_preauth; /* @charged counts in buffered_preauth too */
    bool is_connecting;      /* kvf_evconn_connect: not up yet */
    bool is_tcp_up;          /* the connect completed (TLS may follow) */
    bool is_in_handler;      /* inside on_frame or on_bad_frame */
    bool is_dropped;         /* destroyed by that handler: free after it */
    uint64_t charged;        /* bytes counted in group->buffered */
    char name[64];
    char problem[256]; /* why it failed; "" when it did not */
};

static void kvf_evconn_process(kvf_evconn_t *conn);
static void kvf_evconn_on_read(evutil_socket_t fd, short what, void *arg);
static void kvf_evconn_connecting(kvf_evconn_t *conn);

static bool kvf_evconn_is_retriable(int err)
{
    return (err == EAGAIN) || (err == EWOULDBLOCK) || (err == EINTR);
}

static bool kvf_evconn_is_preauth(const kvf_evconn_t *conn)
{
    return (conn->group->ops->is_preauth != NULL) &&
           conn->group->ops->is_preauth(conn);
}

/* recv() size: 256 KiB (a pipelined batch in one call), 4 KiB before
 * authentication (HELLO and AUTH are small), so that a partial frame of
 * an unauthenticated peer pins 4 KiB of buffer, not 256 KiB. */
static size_t kvf_evconn_read_size(const kvf_evconn_t *conn)
{
    return kvf_evconn_is_preauth(conn) ? (4u << 10) : (256u << 10);
}

/*
 * Recounts what @p conn holds in group->buffered: its input and unsent
 * output, plus one read reservation while input is left (the buffer chain
 * a partial frame sits in). Cheap (no syscall); called after every read,
 * process and write.
 */
static void kvf_evconn_charge(kvf_evconn_t *conn)
{
    kvf_evconn_group_t *group = conn->group;
    size_t in                 = evbuffer_get_length(conn->in);
    uint64_t now              = in + evbuffer_get_length(conn->out);

    if (in > 0) {
        now += kvf_evconn_read_size(conn);
    }
    group->buffered -= conn->charged;
    if (conn->is_charged_preauth) {
        group->buffered_preauth -= conn->charged;
    }
    conn->charged            = now;
    conn->is_charged_preauth = kvf_evconn_is_preauth(conn);
    group->buffered += now;
    if (conn->is_charged_preauth) {
        group->buffered_preauth += now;
    }
}

static void kvf_evconn_close(kvf_evconn_t *conn, kvf_status_t why)
{
    conn->group->ops->on_close(conn, why); /* destroys conn */
}

static void kvf_evconn_free(kvf_evconn_t *conn)
{
    kvf_evconn_group_t *group = conn->group;

    group->buffered -= conn->charged;
    if (conn->is_charged_preauth) {
        group->buffered_preauth -= conn->charged;
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
    free(conn);
}

void kvf_evconn_destroy(kvf_evconn_t *conn)
{
    if (conn == NULL) {
        return;
    }
    if (conn->is_in_handler) {
        /* the handler's caller still holds @p conn: quiet now, free later */
        conn->is_dropped = true;
        event_del(conn->ev_read);
        event_del(conn->ev_write);
        return;
    }
    kvf_evconn_free(conn);
}

/* As kvf_evconn_flush, through TLS: SSL_write may also need to read (a
 * handshake in progress); then the read event resumes it. */
static bool kvf_evconn_tls_flush(kvf_evconn_t *conn)
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
            kvf_tls_error(why, sizeof(why));
            snprintf(conn->problem, sizeof(conn->problem), "tls: %s", why);
            kvf_debug("conn %s: tls write: %s", conn->name, why);
            return false;
        }
    }
    return true;
}

bool kvf_evconn_flush(kvf_evconn_t *conn)
{
    if (evbuffer_get_length(conn->out) == 0) {
        return true;
    }
    if (conn->ssl != NULL) {
        return kvf_evconn_tls_flush(conn);
    }
    if (evbuffer_write(conn->out, conn->fd) < 0) {
        int err = EVUTIL_SOCKET_ERROR();

        if (!kvf_evconn_is_retriable(err)) {
            snprintf(conn->problem, sizeof(conn->problem), "%s",
                     evutil_socket_error_to_string(err));
            kvf_debug("conn %s: write: %s", conn->name, conn->problem);
            return false;
        }
    }
    if ((evbuffer_get_length(conn->out) > 0) &&
        !event_pending(conn->ev_write, EV_WRITE, NULL)) {
        event_add(conn->ev_write, NULL);
    }
    return true;
}

static void kvf_evconn_on_write(evutil_socket_t fd, short what, void *arg)
{
    kvf_evconn_t *conn = arg;

    if (conn->is_connecting) {
        kvf_evconn_connecting(conn);
        return;
    }
    if (!kvf_evconn_flush(conn)) {
        kvf_evconn_close(conn, KVF_ERR_IO);
        return;
    }
    kvf_evconn_charge(conn);
    if (evbuffer_get_length(conn->out) > 0) {
        return; /* the event stays added */
    }
    event_del(conn->ev_write);
    if ((conn->ssl != NULL) && !conn->is_closing && !conn->is_throttled) {
        kvf_evconn_on_read(fd, EV_READ, conn); /* a read that wanted to write */
        return;
    }
    if (conn->is_closing) {
        kvf_debug("conn %s: closed after error", conn->name);
        kvf_evconn_close(conn, KVF_ERR_PROTO);
        return;
    }
    if (conn->is_throttled) {
        conn->is_throttled = false;
        event_add(conn->ev_read, NULL);
        if (conn->ssl != NULL) {
            /* TLS may hold decrypted bytes the socket will not signal */
            kvf_evconn_on_read(fd, EV_READ, conn);
            return;
        }
        kvf_evconn_process(conn); /* frames may already be buffered */
    }
}

void kvf_evconn_close_after_flush(kvf_evconn_t *conn)
{
    conn->is_closing = true;
    event_del(conn->ev_read);
    if (!kvf_evconn_flush(conn) || (evbuffer_get_length(conn->out) == 0)) {
        kvf_evconn_close(conn, KVF_ERR_PROTO);
    }
}

static kvf_status_t kvf_evconn_queue(kvf_evconn_t *conn, uint16_t type,
                                     uint16_t flags,
                                     const ProtobufCMessage *msg)
{
    kvf_status_t status;

    status =
        kvf_frame_encode(conn->out, type, flags, msg, conn->group->max_frame);
    if (status != KVF_OK) {
        kvf_warn("conn %s: cannot encode %s: %s", conn->name,
                 kvf_msg_type_name(type), kvf_status_name(status));
        return status;
    }
    /* an answer that came later (a callback): written on the next turn;
     * while connecting, once connected */
    if (!conn->is_processing && !conn->is_connecting && !conn->is_dropped &&
        !event_pending(conn->ev_write, EV_WRITE, NULL)) {
        event_add(conn->ev_write, NULL);
    }
    return KVF_OK;
}

kvf_status_t kvf_evconn_send_raw(kvf_evconn_t *conn, const void *data,
                                 size_t len)
{
    if (evbuffer_add(conn->out, data, len) != 0) {
        return KVF_ERR_NO_MEMORY;
    }
    if (!conn->is_processing && !conn->is_connecting && !conn->is_dropped &&
        !event_pending(conn->ev_write, EV_WRITE, NULL)) {
        event_add(conn->ev_write, NULL);
    }
    return KVF_OK;
}

kvf_status_t kvf_evconn_send(kvf_evconn_t *conn, uint16_t type,
                             const ProtobufCMessage *msg)
{
    return kvf_evconn_queue(conn, type, KVF_FRAME_FLAG_REPLY, msg);
}

kvf_status_t kvf_evconn_request(kvf_evconn_t *conn, uint16_t type,
                                const ProtobufCMessage *msg)
{
    return kvf_evconn_queue(conn, type, 0, msg);
}

static void *kvf_evconn_arena_alloc(void *data, size_t size)
{
    kvf_evconn_group_t *group = data;
    size_t need               = (size + 15) & ~(size_t)15;

    if (need <= group->arena_size - group->arena_used) {
        void *p = group->arena + group->arena_used;

        group->arena_used += need;
        return p;
    }
    group->arena_spills++;
    return malloc(size);
}

static void kvf_evconn_arena_free(void *data, void *ptr)
{
    kvf_evconn_group_t *group = data;
    uint8_t *p                = ptr;

    if ((p >= group->arena) && (p < group->arena + group->arena_size)) {
        return; /* reset after the frame */
    }
    free(ptr);
}

/* Until a peer authenticated it may send small frames only, so an
 * unauthenticated client cannot make the server buffer 16 MiB. */
static uint32_t kvf_evconn_max_frame(const kvf_evconn_t *conn)
{
    if (kvf_evconn_is_preauth(conn)) {
        return conn->group->max_frame_preauth;
    }
    return conn->group->max_frame;
}

/* Decodes and answers every whole frame buffered, then writes the replies.
 * May close @p conn. */
static void kvf_evconn_process(kvf_evconn_t *conn)
{
    kvf_evconn_group_t *group   = conn->group;
    const kvf_evconn_ops_t *ops = group->ops;
    ProtobufCAllocator arena    = {.alloc          = kvf_evconn_arena_alloc,
                                   .free           = kvf_evconn_arena_free,
                                   .allocator_data = group};
    ProtobufCAllocator *alloc   = (group->arena != NULL) ? &arena : NULL;
    kvf_frame_t frame;
    kvf_status_t status;
    bool frame_ok;

    conn->is_processing = true;
    while (!conn->is_closing) {
        uint64_t t0;

        if (evbuffer_get_length(conn->out) > group->max_output) {
            /* the peer does not read its replies: stop reading from it */
            conn->is_throttled = true;
            group->backpressure++;
            event_del(conn->ev_read);
            break;
        }
        t0                = kvf_time_now_ns();
        group->arena_used = 0;
        status = kvf_frame_decode(conn->in, kvf_evconn_max_frame(conn), alloc,
                                  &frame);
        if (status == KVF_INPROGRESS) {
            break;
        }
        frame_ok            = (status == KVF_OK);
        conn->is_in_handler = true;
        if (status != KVF_OK) {
            status              = (ops->on_bad_frame != NULL)
                                      ? ops->on_bad_frame(conn, status)
                                      : KVF_ERR_CANCELED;
            conn->is_in_handler = false;
        } else {
            status              = ops->on_frame(conn, &frame);
            conn->is_in_handler = false;
            kvf_frame_release(&frame, alloc);
        }
        if (conn->is_dropped) {
            kvf_evconn_free(conn); /* the handler destroyed it */
            return;
        }
        if (frame_ok && (ops->on_served != NULL)) {
            ops->on_served(conn, kvf_time_now_ns() - t0);
        }
        if (status == KVF_ERR_PROTO) {
            conn->is_processing = false;
            kvf_evconn_close_after_flush(conn);
            return;
        }
        if (status != KVF_OK) {
            kvf_evconn_close(conn, status);
            return;
        }
    }
    conn->is_processing = false;
    if (!kvf_evconn_flush(conn)) {
        kvf_evconn_close(conn, KVF_ERR_IO);
        return;
    }
    kvf_evconn_charge(conn);
}

/* Reads what TLS has decrypted into conn->in. Returns KVF_OK, or why the
 * connection must close. */
static kvf_status_t kvf_evconn_tls_read(kvf_evconn_t *conn)
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
            return KVF_OK;
        }
        n               = kvf_tls_read_some(conn->ssl, conn->in);
        conn->is_tls_up = conn->is_tls_up || SSL_is_init_finished(conn->ssl);
        if (n > 0) {
            continue;
        }
        switch (-n) {
        case SSL_ERROR_WANT_READ:
            return KVF_OK;
        case SSL_ERROR_WANT_WRITE:
            if (!event_pending(conn->ev_write, EV_WRITE, NULL)) {
                event_add(conn->ev_write, NULL);
            }
            return KVF_OK;
        case SSL_ERROR_ZERO_RETURN:
            kvf_debug("conn %s: closed by peer", conn->name);
            return KVF_ERR_CLOSED;
        default:
            kvf_tls_error(why, sizeof(why));
            if (conn->is_tls_up) { /* e.g. closed without close_notify */
                snprintf(conn->problem, sizeof(conn->problem), "tls: %s", why);
                kvf_debug("conn %s: tls: %s", conn->name, why);
                return KVF_ERR_IO;
            }
            /* a plain-TCP client, a certificate the client refused */
            conn->group->tls_failures++;
            snprintf(conn->problem, sizeof(conn->problem),
                     "tls handshake failed: %s", why);
            kvf_info("conn %s: %s", conn->name, conn->problem);
            return KVF_ERR_IO;
        }
    }
}

/* Counts what was read, lets the owner enforce its caps, then answers. */
static void kvf_evconn_after_read(kvf_evconn_t *conn)
{
    kvf_evconn_charge(conn);
    if ((conn->group->ops->on_read == NULL) ||
        conn->group->ops->on_read(conn)) {
        kvf_evconn_process(conn);
    }
}

static void kvf_evconn_on_read(evutil_socket_t fd, short what, void *arg)
{
    kvf_evconn_t *conn = arg;
    struct evbuffer_iovec vec;
    ssize_t n = -1;

    if (conn->is_connecting) {
        kvf_evconn_connecting(conn); /* the TLS handshake wants to read */
        return;
    }
    if (conn->ssl != NULL) {
        kvf_status_t status;

        if (conn->is_throttled) {
            return; /* a pending-data wakeup while reading is paused */
        }
        status = kvf_evconn_tls_read(conn);
        if (status != KVF_OK) {
            kvf_evconn_close(conn, status);
            return;
        }
        kvf_evconn_after_read(conn);
        return;
    }
    if (evbuffer_reserve_space(conn->in, kvf_evconn_read_size(conn), &vec, 1) ==
        1) {
        n = recv(fd, vec.iov_base, vec.iov_len, 0);
        if (n > 0) {
            vec.iov_len = (size_t)n;
            evbuffer_commit_space(conn->in, &vec, 1);
        }
    }
    if (n == 0) {
        kvf_debug("conn %s: closed by peer", conn->name);
        kvf_evconn_close(conn, KVF_ERR_CLOSED);
        return;
    }
    if (n < 0) {
        int err = EVUTIL_SOCKET_ERROR();

        if (kvf_evconn_is_retriable(err)) {
            return;
        }
        snprintf(conn->problem, sizeof(conn->problem), "%s",
                 evutil_socket_error_to_string(err));
        kvf_debug("conn %s: read: %s", conn->name, conn->problem);
        kvf_evconn_close(conn, KVF_ERR_IO);
        return;
    }
    kvf_evconn_after_read(conn);
}

/* A connection on @p fd, its events not added yet. */
static kvf_evconn_t *kvf_evconn_new(kvf_evconn_group_t *group,
                                    evutil_socket_t fd, SSL *ssl, void *arg)
{
    kvf_evconn_t *conn;

    conn = calloc(1, sizeof(*conn));
    if (conn == NULL) {
        SSL_free(ssl);
        evutil_closesocket(fd);
        return NULL;
    }
    conn->fd       = fd; /* fd now belongs to conn */
    conn->ssl      = ssl;
    conn->group    = group;
    conn->arg      = arg;
    conn->in       = evbuffer_new();
    conn->out      = evbuffer_new();
    conn->ev_read  = event_new(group->base, fd, EV_READ | EV_PERSIST,
                               kvf_evconn_on_read, conn);
    conn->ev_write = event_new(group->base, fd, EV_WRITE | EV_PERSIST,
                               kvf_evconn_on_write, conn);
    if ((conn->in == NULL) || (conn->out == NULL) || (conn->ev_read == NULL) ||
        (conn->ev_write == NULL) || (evutil_make_socket_nonblocking(fd) != 0)) {
        kvf_warn("conn: cannot set up a connection");
        kvf_evconn_free(conn);
        return NULL;
    }
    return conn;
}

kvf_evconn_t *kvf_evconn_create(kvf_evconn_group_t *group, evutil_socket_t fd,
                                struct ssl_st *ssl, void *arg)
{
    kvf_evconn_t *conn = kvf_evconn_new(group, fd, ssl, arg);

    if ((conn != NULL) && (event_add(conn->ev_read, NULL) != 0)) {
        kvf_warn("conn: cannot set up a connection");
        kvf_evconn_free(conn);
        return NULL;
    }
    return conn;
}

/* The connection is up: reading starts, what was queued leaves, and the
 * owner hears of it. */
static void kvf_evconn_connected(kvf_evconn_t *conn)
{
    conn->is_connecting = false;
    event_del(conn->ev_write);
    if (event_add(conn->ev_read, NULL) != 0) {
        snprintf(conn->problem, sizeof(conn->problem), "no read event");
        kvf_evconn_close(conn, KVF_ERR_IO);
        return;
    }
    if (evbuffer_get_length(conn->out) > 0) {
        event_add(conn->ev_write, NULL);
    }
    if (conn->group->ops->on_connected != NULL) {
        conn->group->ops->on_connected(conn); /* may destroy conn */
    }
}

/* Drives the TLS client handshake one step; false when it failed. */
static bool kvf_evconn_handshake(kvf_evconn_t *conn)
{
    char why[160];
    long verify;
    int rc = SSL_do_handshake(conn->ssl);

    if (rc == 1) {
        conn->is_tls_up = true;
        return true;
    }
    switch (SSL_get_error(conn->ssl, rc)) {
    case SSL_ERROR_WANT_READ:
        event_del(conn->ev_write);
        event_add(conn->ev_read, NULL);
        return true;
    case SSL_ERROR_WANT_WRITE:
        event_add(conn->ev_write, NULL);
        return true;
    default:
        break;
    }
    conn->group->tls_failures++;
    verify = SSL_get_verify_result(conn->ssl);
    if (verify != X509_V_OK) {
        snprintf(conn->problem, sizeof(conn->problem),
                 "tls: certificate not trusted: %s",
                 X509_verify_cert_error_string(verify));
    } else {
        snprintf(conn->problem, sizeof(conn->problem),
                 "tls handshake failed: %s", kvf_tls_error(why, sizeof(why)));
    }
    kvf_debug("conn %s: %s", conn->name, conn->problem);
    return false;
}

/* A connect in flight: the socket became writable (connected or failed),
 * or the TLS handshake can go on. */
static void kvf_evconn_connecting(kvf_evconn_t *conn)
{
    if (!conn->is_tcp_up) {
        int err       = 0;
        socklen_t len = sizeof(err);

        if (getsockopt(conn->fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0) {
            err = EVUTIL_SOCKET_ERROR();
        }
        if (kvf_evconn_is_retriable(err) || (err == EINPROGRESS)) {
            return; /* not yet */
        }
        if (err != 0) {
            snprintf(conn->problem, sizeof(conn->problem), "%s",
                     evutil_socket_error_to_string(err));
            kvf_debug("conn %s: connect: %s", conn->name, conn->problem);
            kvf_evconn_close(conn, KVF_ERR_IO);
            return;
        }
        conn->is_tcp_up = true;
    }
    if (conn->ssl != NULL) {
        if (!kvf_evconn_handshake(conn)) {
            kvf_evconn_close(conn, KVF_ERR_IO);
            return;
        }
        if (!conn->is_tls_up) {
            return; /* the handshake goes on */
        }
    }
    kvf_evconn_connected(conn);
}

kvf_evconn_t *kvf_evconn_connect(kvf_evconn_group_t *group,
                                 const struct sockaddr *addr,
                                 socklen_t addr_len, struct ssl_st *ssl,
                                 void *arg)
{
    evutil_socket_t fd;
    kvf_evconn_t *conn;
    int err;

    fd = socket(addr->sa_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        SSL_free(ssl);
        return NULL;
    }
    if ((ssl != NULL) && (SSL_set_fd(ssl, fd) != 1)) {
        SSL_free(ssl);
        evutil_closesocket(fd);
        errno = ENOMEM;
        return NULL;
    }
    if (ssl != NULL) {
        SSL_set_connect_state(ssl);
    }
    conn = kvf_evconn_new(group, fd, ssl, arg);
    if (conn == NULL) {
        errno = ENOMEM;
        return NULL;
    }
    conn->is_connecting = true;
    if ((connect(fd, addr, addr_len) != 0) && (errno != EINPROGRESS)) {
        err = errno;
        kvf_evconn_free(conn);
        errno = err;
        return NULL;
    }
    /* writable once connected (or failed); an immediate connect, too */
    if (event_add(conn->ev_write, NULL) != 0) {
        kvf_evconn_free(conn);
        errno = ENOMEM;
        return NULL;
    }
    return conn;
}

bool kvf_evconn_is_connected(const kvf_evconn_t *conn)
{
    return !conn->is_connecting;
}

const char *kvf_evconn_problem(const kvf_evconn_t *conn)
{
    return conn->problem;
}

void *kvf_evconn_arg(const kvf_evconn_t *conn)
{
    return conn->arg;
}

void kvf_evconn_set_name(kvf_evconn_t *conn, const char *name)
{
    snprintf(conn->name, sizeof(conn->name), "%s", name);
}

evutil_socket_t kvf_evconn_fd(const kvf_evconn_t *conn)
{
    return conn->fd;
}

struct evbuffer *kvf_evconn_output(kvf_evconn_t *conn)
{
    return conn->out;
}

uint64_t kvf_evconn_held(const kvf_evconn_t *conn, bool *is_preauth_p)
{
    *is_preauth_p = conn->is_charged_preauth;
    return conn->charged;
}

void kvf_evconn_feed(kvf_evconn_t *conn, const void *data, size_t len)
{
    if (evbuffer_add(conn->in, data, len) == 0) {
        kvf_evconn_process(conn); /* may close conn */
    }
}
