/* SPDX-License-Identifier: Apache-2.0 */
/* Copyright (c) 2026 The kvfabric authors */
#include "client/ctlconn.h"

#include "common/config.h"
#include "common/time.h"
#include "common/tls.h"

#include <event2/buffer.h>

#include <openssl/ssl.h>
#include <openssl/x509.h>

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

struct kvf_ctlconn {
    int fd;
    SSL_CTX *tls_ctx; /* NULL: plain TCP */
    SSL *ssl;
    int timeout_ms;
    uint64_t next_id;
    struct evbuffer *in;
    struct evbuffer *out;
};

static kvf_status_t kvf_ctlconn_wait(kvf_ctlconn_t *conn, short events,
                                     uint64_t deadline)
{
    struct pollfd pfd = {.fd = conn->fd, .events = events};
    int rc;

    for (;;) {
        rc = poll(&pfd, 1, kvf_time_left_ms(deadline));
        if (rc > 0) {
            return KVF_OK;
        }
        if (rc == 0) {
            return KVF_ERR_TIMEOUT;
        }
        if (errno != EINTR) {
            return KVF_ERR_IO;
        }
    }
}

/* Maps a TLS result to what the plain socket calls return (errno set). */
static int kvf_ctlconn_tls_result(int n)
{
    if (n > 0) {
        return n;
    }
    switch (-n) {
    case SSL_ERROR_WANT_READ:
    case SSL_ERROR_WANT_WRITE:
        errno = EAGAIN;
        return -1;
    case SSL_ERROR_ZERO_RETURN:
        return 0;
    default:
        errno = ECONNRESET;
        return -1;
    }
}

/* evbuffer_write / evbuffer_read, through TLS when it is on. */
static int kvf_ctlconn_write(kvf_ctlconn_t *conn)
{
    if (conn->ssl == NULL) {
        return evbuffer_write(conn->out, conn->fd);
    }
    return kvf_ctlconn_tls_result(kvf_tls_write_some(conn->ssl, conn->out));
}

static int kvf_ctlconn_read(kvf_ctlconn_t *conn)
{
    if (conn->ssl == NULL) {
        return evbuffer_read(conn->in, conn->fd, 1 << 20);
    }
    return kvf_ctlconn_tls_result(kvf_tls_read_some(conn->ssl, conn->in));
}

kvf_status_t kvf_ctlconn_flush(kvf_ctlconn_t *conn)
{
    uint64_t deadline =
        kvf_time_deadline_ns((uint64_t)conn->timeout_ms * KVF_NSEC_PER_MSEC);
    kvf_status_t status;

    while (evbuffer_get_length(conn->out) > 0) {
        int n = kvf_ctlconn_write(conn);

        if (n > 0) {
            continue;
        }
        if ((n < 0) && (errno != EAGAIN) && (errno != EINTR)) {
            return (errno == EPIPE) ? KVF_ERR_CLOSED : KVF_ERR_IO;
        }
        status = kvf_ctlconn_wait(conn, POLLOUT, deadline);
        if (status != KVF_OK) {
            return status;
        }
    }
    return KVF_OK;
}

kvf_status_t kvf_ctlconn_send(kvf_ctlconn_t *conn, uint16_t type,
                              const ProtobufCMessage *msg)
{
    kvf_status_t status;

    status = kvf_frame_encode(conn->out, type, 0, msg, KVF_FRAME_MAX_LIMIT);
    if (status != KVF_OK) {
        return status;
    }
    return kvf_ctlconn_flush(conn);
}

kvf_status_t kvf_ctlconn_queue(kvf_ctlconn_t *conn, uint16_t type,
                               const ProtobufCMessage *msg)
{
    return kvf_frame_encode(conn->out, type, 0, msg, KVF_FRAME_MAX_LIMIT);
}

kvf_status_t kvf_ctlconn_queue_raw(kvf_ctlconn_t *conn, const void *data,
                                   size_t len)
{
    return (evbuffer_add(conn->out, data, len) == 0) ? KVF_OK
                                                     : KVF_ERR_NO_MEMORY;
}

kvf_status_t kvf_ctlconn_send_raw(kvf_ctlconn_t *conn, const void *data,
                                  size_t len)
{
    if (evbuffer_add(conn->out, data, len) != 0) {
        return KVF_ERR_NO_MEMORY;
    }
    return kvf_ctlconn_flush(conn);
}

kvf_status_t kvf_ctlconn_recv(kvf_ctlconn_t *conn, kvf_frame_t *frame_p)
{
    uint64_t deadline =
        kvf_time_deadline_ns((uint64_t)conn->timeout_ms * KVF_NSEC_PER_MSEC);
    kvf_status_t status;

    for (;;) {
        int n;

        status = kvf_frame_decode(conn->in, KVF_FRAME_MAX_LIMIT, NULL, frame_p);
        if (status != KVF_INPROGRESS) {
            return status;
        }
        n = kvf_ctlconn_read(conn);
        if (n > 0) {
            continue;
        }
        if (n == 0) {
            return KVF_ERR_CLOSED;
        }
        if ((errno != EAGAIN) && (errno != EINTR)) {
            return (errno == ECONNRESET) ? KVF_ERR_CLOSED : KVF_ERR_IO;
        }
        status = kvf_ctlconn_wait(conn, POLLIN, deadline);
        if (status != KVF_OK) {
            return status;
        }
    }
}

kvf_status_t kvf_ctlconn_read_some(kvf_ctlconn_t *conn)
{
    int n = kvf_ctlconn_read(conn);

    if (n > 0) {
        return KVF_OK;
    }
    if (n == 0) {
        return KVF_ERR_CLOSED;
    }
    if ((errno == EAGAIN) || (errno == EINTR)) {
        return KVF_INPROGRESS;
    }
    return (errno == ECONNRESET) ? KVF_ERR_CLOSED : KVF_ERR_IO;
}

kvf_status_t kvf_ctlconn_recv_buffered(kvf_ctlconn_t *conn,
                                       kvf_frame_t *frame_p)
{
    return kvf_frame_decode(conn->in, KVF_FRAME_MAX_LIMIT, NULL, frame_p);
}

kvf_status_t kvf_ctlconn_call(kvf_ctlconn_t *conn, uint16_t type,
                              const ProtobufCMessage *msg, kvf_frame_t *reply_p)
{
    kvf_status_t status = kvf_ctlconn_send(conn, type, msg);

    if (status != KVF_OK) {
        return status;
    }
    return kvf_ctlconn_recv(conn, reply_p);
}

uint64_t kvf_ctlconn_next_id(kvf_ctlconn_t *conn)
{
    return ++conn->next_id;
}

int kvf_ctlconn_fd(const kvf_ctlconn_t *conn)
{
    return conn->fd;
}

static kvf_status_t kvf_ctlconn_connect(kvf_ctlconn_t *conn,
                                        const char *hostport, char *err,
                                        size_t err_len)
{
    struct addrinfo hints, *res = NULL, *ai;
    uint64_t deadline =
        kvf_time_deadline_ns((uint64_t)conn->timeout_ms * KVF_NSEC_PER_MSEC);
    char host[256], port_str[8];
    uint16_t port;
    int rc, one = 1, soerr = ECONNREFUSED;
    socklen_t len = sizeof(soerr);

    if (kvf_config_parse_hostport(hostport, host, sizeof(host), &port) !=
        KVF_OK) {
        snprintf(err, err_len, "bad controller address '%s' (want HOST:PORT)",
                 hostport);
        return KVF_ERR_CONFIG;
    }
    snprintf(port_str, sizeof(port_str), "%u", port);
    memset(&hints, 0, sizeof(hints));
    hints.ai_family   = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    rc                = getaddrinfo(host, port_str, &hints, &res);
    if (rc != 0) {
        snprintf(err, err_len, "cannot resolve %s: %s", host, gai_strerror(rc));
        return KVF_ERR_IO;
    }
    for (ai = res; ai != NULL; ai = ai->ai_next) {
        conn->fd = socket(ai->ai_family,
                          ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        if (conn->fd < 0) {
            soerr = errno;
            continue;
        }
        if ((connect(conn->fd, ai->ai_addr, ai->ai_addrlen) == 0) ||
            ((errno == EINPROGRESS) &&
             (kvf_ctlconn_wait(conn, POLLOUT, deadline) == KVF_OK) &&
             (getsockopt(conn->fd, SOL_SOCKET, SO_ERROR, &soerr, &len) == 0) &&
             (soerr == 0))) {
            break;
        }
        if (errno != EINPROGRESS) {
            soerr = errno;
        }
        close(conn->fd);
        conn->fd = -1;
    }
    freeaddrinfo(res);
    if (conn->fd < 0) {
        snprintf(err, err_len, "cannot connect to controller %s: %s", hostport,
                 strerror(soerr));
        return KVF_ERR_IO;
    }
    setsockopt(conn->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    return KVF_OK;
}

/* Receives the reply to a handshake step; @p err says why it failed. */
static kvf_status_t kvf_ctlconn_handshake_recv(kvf_ctlconn_t *conn,
                                               const char *hostport,
                                               uint16_t type, const char *what,
                                               kvf_frame_t *frame_p, char *err,
                                               size_t err_len)
{
    kvf_status_t status = kvf_ctlconn_recv(conn, frame_p);

    if (status != KVF_OK) {
        snprintf(err, err_len, "controller %s: no %s reply: %s", hostport, what,
                 kvf_strerror(status));
        return status;
    }
    if (frame_p->type == KVF_MSG_STATUS) {
        const Kvf__Status *st = (const Kvf__Status *)frame_p->msg;

        status = (st->status != KVF_OK) ? (kvf_status_t)st->status : KVF_OK;
        if ((type == KVF_MSG_STATUS) && (status == KVF_OK)) {
            return KVF_OK;
        }
        snprintf(err, err_len, "controller %s: %s", hostport, st->message);
        kvf_frame_release(frame_p, NULL);
        return (status != KVF_OK) ? status : KVF_ERR_PROTO;
    }
    if (frame_p->type != type) {
        snprintf(err, err_len, "controller %s: unexpected %s to %s", hostport,
                 kvf_msg_type_name(frame_p->type), what);
        kvf_frame_release(frame_p, NULL);
        return KVF_ERR_PROTO;
    }
    return KVF_OK;
}

/* HELLO, and AUTH when the controller challenged us. */
static kvf_status_t kvf_ctlconn_handshake(kvf_ctlconn_t *conn,
                                          const kvf_ctlconn_params_t *params,
                                          char *err, size_t err_len)
{
    const char *hostport = params->hostport;
    uint8_t mac[KVF_AUTH_MAC_SIZE];
    const Kvf__HelloReply *rep;
    kvf_auth_session_t auth;
    kvf_status_t status;
    kvf_frame_t frame;
    Kvf__Hello hello;
    Kvf__Auth msg;
    char name_buf[128], text[256];
    size_t nonce_len;

    kvf_auth_session_init(&auth, params->secret);
    status = kvf_auth_client_hello(&auth, &nonce_len);
    if (status != KVF_OK) {
        snprintf(err, err_len, "cannot draw an auth nonce");
        goto out;
    }
    kvf__hello__init(&hello);
    snprintf(name_buf, sizeof(name_buf), "%s",
             (params->name != NULL) ? params->name : "");
    hello.request_id       = kvf_ctlconn_next_id(conn);
    hello.protocol_version = params->version;
    hello.kind             = (Kvf__PeerKind)params->kind;
    hello.name             = name_buf;
    hello.auth_nonce.data  = auth.own_nonce;
    hello.auth_nonce.len   = nonce_len;
    status                 = kvf_ctlconn_send(conn, KVF_MSG_HELLO, &hello.base);
    if (status != KVF_OK) {
        snprintf(err, err_len, "controller %s: cannot send HELLO: %s", hostport,
                 kvf_strerror(status));
        goto out;
    }
    status = kvf_ctlconn_handshake_recv(conn, hostport, KVF_MSG_HELLO_REPLY,
                                        "HELLO", &frame, err, err_len);
    if (status != KVF_OK) {
        goto out;
    }
    rep = (const Kvf__HelloReply *)frame.msg;
    if (rep->status != KVF_OK) {
        snprintf(err, err_len, "controller %s: %s", hostport, rep->message);
        status = (kvf_status_t)rep->status;
    } else {
        status = kvf_hello_client_auth(&auth, rep, name_buf, &msg, mac, text,
                                       sizeof(text));
        if (status != KVF_OK) {
            snprintf(err, err_len, "controller %s: %s", hostport, text);
        }
    }
    kvf_frame_release(&frame, NULL);
    if ((status != KVF_OK) || (auth.state != KVF_AUTH_STATE_CHALLENGED)) {
        goto out;
    }
    msg.request_id = kvf_ctlconn_next_id(conn);
    status         = kvf_ctlconn_send(conn, KVF_MSG_AUTH, &msg.base);
    if (status != KVF_OK) {
        snprintf(err, err_len, "controller %s: cannot send AUTH: %s", hostport,
                 kvf_strerror(status));
        goto out;
    }
    status = kvf_ctlconn_handshake_recv(conn, hostport, KVF_MSG_STATUS, "AUTH",
                                        &frame, err, err_len);
    if (status == KVF_OK) {
        kvf_frame_release(&frame, NULL);
    }
out:
    kvf_auth_session_cleanup(&auth);
    return status;
}

/* TLS client handshake on the connected socket, bounded by the timeout. */
static kvf_status_t kvf_ctlconn_tls_start(kvf_ctlconn_t *conn,
                                          const kvf_ctlconn_params_t *params,
                                          char *err, size_t err_len)
{
    uint64_t deadline =
        kvf_time_deadline_ns((uint64_t)conn->timeout_ms * KVF_NSEC_PER_MSEC);
    kvf_status_t status;
    char why[256];
    long verify;
    int rc;

    status =
        kvf_tls_client_ctx_create(params->tls_ca, &conn->tls_ctx, err, err_len);
    if (status != KVF_OK) {
        return status;
    }
    conn->ssl = kvf_tls_client_new(conn->tls_ctx, params->tls_server_name);
    if ((conn->ssl == NULL) || (SSL_set_fd(conn->ssl, conn->fd) != 1)) {
        snprintf(err, err_len, "tls: bad server name '%s' or no memory",
                 (params->tls_server_name != NULL) ? params->tls_server_name
                                                   : "");
        return KVF_ERR_CONFIG;
    }
    while ((rc = SSL_connect(conn->ssl)) != 1) {
        int e = SSL_get_error(conn->ssl, rc);

        if ((e == SSL_ERROR_WANT_READ) || (e == SSL_ERROR_WANT_WRITE)) {
            status = kvf_ctlconn_wait(
                conn, (e == SSL_ERROR_WANT_READ) ? POLLIN : POLLOUT, deadline);
            if (status != KVF_OK) {
                snprintf(err, err_len, "controller %s: tls handshake: %s",
                         params->hostport, kvf_strerror(status));
                return status;
            }
            continue;
        }
        verify = SSL_get_verify_result(conn->ssl);
        if (verify != X509_V_OK) {
            snprintf(err, err_len,
                     "controller %s: tls: certificate not trusted: %s",
                     params->hostport, X509_verify_cert_error_string(verify));
            kvf_tls_error(why, sizeof(why));
            return KVF_ERR_AUTH;
        }
        snprintf(err, err_len, "controller %s: tls handshake failed: %s",
                 params->hostport, kvf_tls_error(why, sizeof(why)));
        return KVF_ERR_IO;
    }
    return KVF_OK;
}

kvf_status_t kvf_ctlconn_open(const kvf_ctlconn_params_t *params,
                              kvf_ctlconn_t **conn_p, char *err, size_t err_len)
{
    kvf_ctlconn_t *conn;
    kvf_status_t status;

    conn = calloc(1, sizeof(*conn));
    if (conn == NULL) {
        snprintf(err, err_len, "out of memory");
        return KVF_ERR_NO_MEMORY;
    }
    conn->fd         = -1;
    conn->timeout_ms = params->timeout_ms;
    conn->in         = evbuffer_new();
    conn->out        = evbuffer_new();
    if ((conn->in == NULL) || (conn->out == NULL)) {
        snprintf(err, err_len, "out of memory");
        status = KVF_ERR_NO_MEMORY;
        goto err_destroy;
    }
    status = kvf_ctlconn_connect(conn, params->hostport, err, err_len);
    if (status != KVF_OK) {
        goto err_destroy;
    }
    if ((params->tls_ca != NULL) && (params->tls_ca[0] != '\0')) {
        status = kvf_ctlconn_tls_start(conn, params, err, err_len);
        if (status != KVF_OK) {
            goto err_destroy;
        }
    }
    if (params->version != 0) { /* 0: tests, no HELLO */
        status = kvf_ctlconn_handshake(conn, params, err, err_len);
        if (status != KVF_OK) {
            goto err_destroy;
        }
    }
    *conn_p = conn;
    return KVF_OK;

err_destroy:
    kvf_ctlconn_destroy(conn);
    return status;
}

kvf_status_t kvf_ctlconn_create(const char *hostport, int kind,
                                const char *name, uint32_t version,
                                int timeout_ms, kvf_ctlconn_t **conn_p,
                                char *err, size_t err_len)
{
    const kvf_ctlconn_params_t params = {
        .hostport   = hostport,
        .kind       = kind,
        .name       = name,
        .version    = version,
        .timeout_ms = timeout_ms,
    };

    return kvf_ctlconn_open(&params, conn_p, err, err_len);
}

void kvf_ctlconn_destroy(kvf_ctlconn_t *conn)
{
    if (conn == NULL) {
        return;
    }
    SSL_free(conn->ssl);
    SSL_CTX_free(conn->tls_ctx);
    if (conn->fd >= 0) {
        close(conn->fd);
    }
    if (conn->out != NULL) {
        evbuffer_free(conn->out);
    }
    if (conn->in != NULL) {
        evbuffer_free(conn->in);
    }
    free(conn);
}
