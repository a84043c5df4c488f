/* SPDX-License-Identifier: Apache-2.0 */
/* Copyright (c) 2026 The kvfabric authors */
/*
 * The admin client: kvf_bconn (proto/bconn.c) over TCP, or over TLS through
 * its byte-stream ops, plus what only the controller's clients need
 * (resolving HOST:PORT, the TLS handshake).
 */
#include "client/ctlconn.h"

#include "common/config.h"
#include "common/time.h"
#include "common/tls.h"
#include "proto/bconn.h"

#include <openssl/ssl.h>
#include <openssl/x509.h>

#include <arpa/inet.h>
#include <errno.h>
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
    kvf_bconn_t *conn;
    int fd;           /* until conn owns it */
    SSL_CTX *tls_ctx; /* NULL: plain TCP */
    SSL *ssl;
    int timeout_ms;
    char peer[300]; /* "controller HOST:PORT" */
};

static uint64_t kvf_ctlconn_deadline(const kvf_ctlconn_t *conn)
{
    return kvf_time_deadline_ns((uint64_t)conn->timeout_ms * KVF_NSEC_PER_MSEC);
}

/* Maps a TLS result to what the plain socket calls return (errno set). */
static ssize_t kvf_ctlconn_tls_result(SSL *ssl, int rc, size_t n)
{
    if (rc == 1) {
        return (ssize_t)n;
    }
    switch (SSL_get_error(ssl, rc)) {
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

static ssize_t kvf_ctlconn_tls_read(void *arg, void *buf, size_t len)
{
    size_t n = 0;
    int rc   = SSL_read_ex(arg, buf, len, &n);

    return kvf_ctlconn_tls_result(arg, rc, n);
}

static ssize_t kvf_ctlconn_tls_write(void *arg, const void *buf, size_t len)
{
    size_t n = 0;
    int rc   = SSL_write_ex(arg, buf, len, &n);

    return kvf_ctlconn_tls_result(arg, rc, n);
}

static const kvf_bconn_stream_ops_t kvf_ctlconn_tls_ops = {
    .read  = kvf_ctlconn_tls_read,
    .write = kvf_ctlconn_tls_write,
};

kvf_status_t kvf_ctlconn_flush(kvf_ctlconn_t *conn)
{
    return kvf_bconn_flush(conn->conn, kvf_ctlconn_deadline(conn));
}

kvf_status_t kvf_ctlconn_send(kvf_ctlconn_t *conn, uint16_t type,
                              const ProtobufCMessage *msg)
{
    return kvf_bconn_send(conn->conn, type, msg, kvf_ctlconn_deadline(conn));
}

kvf_status_t kvf_ctlconn_queue(kvf_ctlconn_t *conn, uint16_t type,
                               const ProtobufCMessage *msg)
{
    return kvf_bconn_queue(conn->conn, type, msg);
}

kvf_status_t kvf_ctlconn_queue_raw(kvf_ctlconn_t *conn, const void *data,
                                   size_t len)
{
    return kvf_bconn_queue_raw(conn->conn, data, len);
}

kvf_status_t kvf_ctlconn_send_raw(kvf_ctlconn_t *conn, const void *data,
                                  size_t len)
{
    kvf_status_t status = kvf_bconn_queue_raw(conn->conn, data, len);

    if (status != KVF_OK) {
        return status;
    }
    return kvf_ctlconn_flush(conn);
}

kvf_status_t kvf_ctlconn_recv(kvf_ctlconn_t *conn, kvf_frame_t *frame_p)
{
    return kvf_bconn_recv(conn->conn, kvf_ctlconn_deadline(conn), NULL,
                          frame_p);
}

kvf_status_t kvf_ctlconn_read_some(kvf_ctlconn_t *conn)
{
    return kvf_bconn_read_some(conn->conn, NULL);
}

kvf_status_t kvf_ctlconn_recv_buffered(kvf_ctlconn_t *conn,
                                       kvf_frame_t *frame_p)
{
    return kvf_bconn_recv_buffered(conn->conn, frame_p);
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
    return kvf_bconn_next_id(conn->conn);
}

int kvf_ctlconn_fd(const kvf_ctlconn_t *conn)
{
    return kvf_bconn_fd(conn->conn);
}

const char *kvf_ctlconn_last_error(const kvf_ctlconn_t *conn)
{
    return kvf_bconn_last_error(conn->conn);
}

static kvf_status_t kvf_ctlconn_connect(kvf_ctlconn_t *conn,
                                        const char *hostport, char *err,
                                        size_t err_len)
{
    struct addrinfo hints, *res = NULL, *ai;
    uint64_t deadline = kvf_ctlconn_deadline(conn);
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
             (kvf_bconn_wait_fd(conn->fd, POLLOUT, deadline) == KVF_OK) &&
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

/* TLS client handshake on the connected socket, bounded by the timeout. */
static kvf_status_t kvf_ctlconn_tls_start(kvf_ctlconn_t *conn,
                                          const kvf_ctlconn_params_t *params,
                                          char *err, size_t err_len)
{
    uint64_t deadline = kvf_ctlconn_deadline(conn);
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
            status = kvf_bconn_wait_fd(
                conn->fd, (e == SSL_ERROR_WANT_READ) ? POLLIN : POLLOUT,
                deadline);
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

static kvf_status_t kvf_ctlconn_open_one(const kvf_ctlconn_params_t *params,
                                         kvf_ctlconn_t **conn_p, char *err,
                                         size_t err_len)
{
    kvf_bconn_params_t cp = {.max_frame = KVF_FRAME_MAX_LIMIT};
    kvf_bconn_hello_params_t hp;
    kvf_ctlconn_t *conn;
    kvf_status_t status;

    conn = calloc(1, sizeof(*conn));
    if (conn == NULL) {
        snprintf(err, err_len, "out of memory");
        return KVF_ERR_NO_MEMORY;
    }
    conn->fd         = -1;
    conn->timeout_ms = params->timeout_ms;
    snprintf(conn->peer, sizeof(conn->peer), "controller %s", params->hostport);
    status = kvf_ctlconn_connect(conn, params->hostport, err, err_len);
    if (status != KVF_OK) {
        goto err_destroy;
    }
    if ((params->tls_ca != NULL) && (params->tls_ca[0] != '\0')) {
        status = kvf_ctlconn_tls_start(conn, params, err, err_len);
        if (status != KVF_OK) {
            goto err_destroy;
        }
        cp.ops     = &kvf_ctlconn_tls_ops;
        cp.ops_arg = conn->ssl;
    }
    cp.peer  = conn->peer;
    status   = kvf_bconn_create(conn->fd, &cp, &conn->conn);
    conn->fd = -1; /* the fd now belongs to conn->conn */
    if (status != KVF_OK) {
        snprintf(err, err_len, "out of memory");
        goto err_destroy;
    }
    if (params->version != 0) { /* 0: tests, no HELLO */
        hp.version = params->version;
        hp.kind    = params->kind;
        hp.name    = params->name;
        hp.secret  = params->secret;
        status =
            kvf_bconn_hello(conn->conn, &hp, kvf_ctlconn_deadline(conn), NULL);
        if (status != KVF_OK) {
            snprintf(err, err_len, "%s", kvf_bconn_last_error(conn->conn));
            goto err_destroy;
        }
    }
    *conn_p = conn;
    return KVF_OK;

err_destroy:
    kvf_ctlconn_destroy(conn);
    return status;
}

/* HOST:PORT[,HOST:PORT...]: the first that accepts and answers HELLO
 * (with HA on etcd only the leader listens); the last error otherwise. */
kvf_status_t kvf_ctlconn_open(const kvf_ctlconn_params_t *params,
                              kvf_ctlconn_t **conn_p, char *err, size_t err_len)
{
    kvf_ctlconn_params_t one = *params;
    const char *p            = params->hostport, *comma;
    kvf_status_t status      = KVF_ERR_CONFIG;
    char addr[300];

    if (strchr(p, ',') == NULL) {
        return kvf_ctlconn_open_one(params, conn_p, err, err_len);
    }
    one.hostport = addr;
    for (; p != NULL; p = (comma != NULL) ? comma + 1 : NULL) {
        comma = strchr(p, ',');
        snprintf(addr, sizeof(addr), "%.*s",
                 (int)((comma != NULL) ? (size_t)(comma - p) : strlen(p)), p);
        status = kvf_ctlconn_open_one(&one, conn_p, err, err_len);
        if ((status == KVF_OK) || (status == KVF_ERR_AUTH)) {
            break; /* a refused proof is not a standby: say so */
        }
    }
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
    kvf_bconn_destroy(conn->conn); /* closes the socket */
    if (conn->fd >= 0) {
        close(conn->fd);
    }
    SSL_free(conn->ssl);
    SSL_CTX_free(conn->tls_ctx);
    free(conn);
}
