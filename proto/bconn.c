/* SPDX-License-Identifier: Apache-2.0 */
/* Copyright (c) 2026 The kvfabric authors */
#include "proto/bconn.h"

#include "common/time.h"
#include "proto/hello.h"

#include <errno.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#define KVF_BCONN_RX_MIN   65536u
#define KVF_BCONN_RX_SLACK 4096u

struct kvf_bconn {
    int fd;
    const kvf_bconn_stream_ops_t *ops; /* NULL: the plain socket */
    void *ops_arg;
    uint32_t max_frame;
    uint64_t next_id;
    uint8_t *rx; /* bytes [rx_off, rx_len) read, not yet decoded */
    size_t rx_off;
    size_t rx_len;
    size_t rx_cap;
    uint8_t *tx; /* bytes [tx_off, tx_len) queued, not yet written */
    size_t tx_off;
    size_t tx_len;
    size_t tx_cap;
    char peer[160];
    char error[512];
    kvf_bconn_filter_t filter; /* frames kvf_bconn_expect passes by */
    void *filter_arg;
};

static kvf_status_t kvf_bconn_fail(kvf_bconn_t *conn, kvf_status_t status,
                                   const char *fmt, ...) KVF_PRINTF(3, 4);

static kvf_status_t kvf_bconn_fail(kvf_bconn_t *conn, kvf_status_t status,
                                   const char *fmt, ...)
{
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(conn->error, sizeof(conn->error), fmt, ap);
    va_end(ap);
    return status;
}

kvf_status_t kvf_bconn_create(int fd, const kvf_bconn_params_t *params,
                              kvf_bconn_t **conn_p)
{
    kvf_bconn_t *conn = calloc(1, sizeof(*conn));

    if (conn == NULL) {
        close(fd);
        return KVF_ERR_NO_MEMORY;
    }
    conn->fd      = fd; /* fd now belongs to conn */
    conn->ops     = params->ops;
    conn->ops_arg = params->ops_arg;
    conn->max_frame =
        (params->max_frame != 0) ? params->max_frame : KVF_FRAME_MAX_DEFAULT;
    snprintf(conn->peer, sizeof(conn->peer), "%s",
             (params->peer != NULL) ? params->peer : "peer");
    *conn_p = conn;
    return KVF_OK;
}

void kvf_bconn_destroy(kvf_bconn_t *conn)
{
    if (conn == NULL) {
        return;
    }
    if (conn->fd >= 0) {
        close(conn->fd);
    }
    free(conn->rx);
    free(conn->tx);
    free(conn);
}

kvf_status_t kvf_bconn_wait_fd(int fd, short events, uint64_t deadline)
{
    struct pollfd pfd = {.fd = fd, .events = events};
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

kvf_status_t kvf_bconn_dial_unix(const char *path, uint64_t deadline, int *fd_p,
                                 char *err, size_t err_len)
{
    struct sockaddr_un sun;
    kvf_status_t status;
    socklen_t len;
    int fd, soerr = 0;

    if (strlen(path) >= sizeof(sun.sun_path)) {
        snprintf(err, err_len, "socket path too long: %s", path);
        return KVF_ERR_INVALID;
    }
    fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        snprintf(err, err_len, "socket: %s", strerror(errno));
        return KVF_ERR_IO;
    }
    memset(&sun, 0, sizeof(sun));
    sun.sun_family = AF_UNIX;
    memcpy(sun.sun_path, path, strlen(path));
    if (connect(fd, (struct sockaddr *)&sun, sizeof(sun)) == 0) {
        *fd_p = fd;
        return KVF_OK;
    }
    if ((errno != EAGAIN) && (errno != EINPROGRESS)) {
        snprintf(err, err_len, "no kvf-agent at %s: %s", path, strerror(errno));
        status = KVF_ERR_IO;
        goto err_close;
    }
    status = kvf_bconn_wait_fd(fd, POLLOUT, deadline);
    if (status != KVF_OK) {
        snprintf(err, err_len, "kvf-agent at %s: connect: %s", path,
                 kvf_strerror(status));
        goto err_close;
    }
    len = sizeof(soerr);
    if ((getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &len) != 0) ||
        (soerr != 0)) {
        snprintf(err, err_len, "no kvf-agent at %s: %s", path, strerror(soerr));
        status = KVF_ERR_IO;
        goto err_close;
    }
    *fd_p = fd;
    return KVF_OK;

err_close:
    close(fd);
    return status;
}

uint64_t kvf_bconn_next_id(kvf_bconn_t *conn)
{
    return ++conn->next_id;
}

int kvf_bconn_fd(const kvf_bconn_t *conn)
{
    return conn->fd;
}

const char *kvf_bconn_last_error(const kvf_bconn_t *conn)
{
    return conn->error;
}

/* Room for @p need more bytes at the end of tx. */
static kvf_status_t kvf_bconn_tx_reserve(kvf_bconn_t *conn, size_t need)
{
    size_t cap;
    uint8_t *grown;

    if (conn->tx_off == conn->tx_len) {
        conn->tx_off = conn->tx_len = 0;
    }
    if (conn->tx_cap - conn->tx_len >= need) {
        return KVF_OK;
    }
    if (conn->tx_off > 0) { /* compact before growing */
        memmove(conn->tx, conn->tx + conn->tx_off, conn->tx_len - conn->tx_off);
        conn->tx_len -= conn->tx_off;
        conn->tx_off = 0;
        if (conn->tx_cap - conn->tx_len >= need) {
            return KVF_OK;
        }
    }
    cap = (conn->tx_cap == 0) ? KVF_BCONN_RX_MIN : conn->tx_cap;
    while (cap - conn->tx_len < need) {
        cap *= 2;
    }
    grown = realloc(conn->tx, cap);
    if (grown == NULL) {
        return kvf_bconn_fail(conn, KVF_ERR_NO_MEMORY,
                              "no memory for a %zu-byte request", need);
    }
    conn->tx     = grown;
    conn->tx_cap = cap;
    return KVF_OK;
}

kvf_status_t kvf_bconn_queue(kvf_bconn_t *conn, uint16_t type,
                             const ProtobufCMessage *msg)
{
    size_t need = kvf_frame_size(msg), len = 0;
    kvf_status_t status;

    status = kvf_bconn_tx_reserve(conn, need);
    if (status != KVF_OK) {
        return status;
    }
    status = kvf_frame_pack(conn->tx + conn->tx_len, need, type, 0, msg,
                            conn->max_frame, &len);
    if (status != KVF_OK) {
        return kvf_bconn_fail(conn, status, "%s request too large (%zu bytes)",
                              kvf_msg_type_name(type), need);
    }
    conn->tx_len += len;
    return KVF_OK;
}

kvf_status_t kvf_bconn_queue_raw(kvf_bconn_t *conn, const void *data,
                                 size_t len)
{
    kvf_status_t status = kvf_bconn_tx_reserve(conn, len);

    if (status != KVF_OK) {
        return status;
    }
    memcpy(conn->tx + conn->tx_len, data, len);
    conn->tx_len += len;
    return KVF_OK;
}

static ssize_t kvf_bconn_write(kvf_bconn_t *conn, const void *buf, size_t len)
{
    if (conn->ops != NULL) {
        return conn->ops->write(conn->ops_arg, buf, len);
    }
    return send(conn->fd, buf, len, MSG_NOSIGNAL);
}

kvf_status_t kvf_bconn_flush(kvf_bconn_t *conn, uint64_t deadline)
{
    kvf_status_t status;
    ssize_t n;

    while (conn->tx_off < conn->tx_len) {
        n = kvf_bconn_write(conn, conn->tx + conn->tx_off,
                            conn->tx_len - conn->tx_off);
        if (n > 0) {
            conn->tx_off += (size_t)n;
            continue;
        }
        if ((n < 0) && (errno == EINTR)) {
            continue;
        }
        if ((n < 0) && ((errno == EAGAIN) || (errno == EWOULDBLOCK))) {
            status = kvf_bconn_wait_fd(conn->fd, POLLOUT, deadline);
            if (status == KVF_ERR_TIMEOUT) {
                return kvf_bconn_fail(conn, status,
                                      "%s did not take the request in time",
                                      conn->peer);
            }
            if (status != KVF_OK) {
                return kvf_bconn_fail(conn, status, "poll: %s",
                                      strerror(errno));
            }
            continue;
        }
        return kvf_bconn_fail(conn, KVF_ERR_CLOSED, "%s connection lost: %s",
                              conn->peer, strerror(errno));
    }
    conn->tx_off = conn->tx_len = 0;
    return KVF_OK;
}

kvf_status_t kvf_bconn_send(kvf_bconn_t *conn, uint16_t type,
                            const ProtobufCMessage *msg, uint64_t deadline)
{
    kvf_status_t status = kvf_bconn_queue(conn, type, msg);

    if (status != KVF_OK) {
        return status;
    }
    return kvf_bconn_flush(conn, deadline);
}

/* Makes room to read: compacts, then grows up to one maximum frame. */
static kvf_status_t kvf_bconn_rx_reserve(kvf_bconn_t *conn)
{
    size_t cap;
    uint8_t *grown;

    if (conn->rx_off == conn->rx_len) {
        conn->rx_off = conn->rx_len = 0;
    }
    if (conn->rx_cap - conn->rx_len >= KVF_BCONN_RX_SLACK) {
        return KVF_OK;
    }
    if (conn->rx_off > 0) {
        memmove(conn->rx, conn->rx + conn->rx_off, conn->rx_len - conn->rx_off);
        conn->rx_len -= conn->rx_off;
        conn->rx_off = 0;
        if (conn->rx_cap - conn->rx_len >= KVF_BCONN_RX_SLACK) {
            return KVF_OK;
        }
    }
    cap = (conn->rx_cap == 0) ? KVF_BCONN_RX_MIN : conn->rx_cap * 2;
    if (cap > (size_t)conn->max_frame + KVF_FRAME_HDR_SIZE +
                  2 * KVF_BCONN_RX_SLACK + KVF_BCONN_RX_MIN) {
        return kvf_bconn_fail(conn, KVF_ERR_PROTO, "%s sent an oversized frame",
                              conn->peer);
    }
    grown = realloc(conn->rx, cap);
    if (grown == NULL) {
        return kvf_bconn_fail(conn, KVF_ERR_NO_MEMORY, "no memory for a reply");
    }
    conn->rx     = grown;
    conn->rx_cap = cap;
    return KVF_OK;
}

/* One read into rx: >0 bytes, 0 EOF, -1 with errno. */
static ssize_t kvf_bconn_read(kvf_bconn_t *conn, int *fd_p)
{
    char control[CMSG_SPACE(sizeof(int))];
    struct cmsghdr *cmsg;
    struct msghdr mh;
    struct iovec iov;
    ssize_t n;

    if (conn->ops != NULL) {
        return conn->ops->read(conn->ops_arg, conn->rx + conn->rx_len,
                               conn->rx_cap - conn->rx_len);
    }
    iov.iov_base = conn->rx + conn->rx_len;
    iov.iov_len  = conn->rx_cap - conn->rx_len;
    memset(&mh, 0, sizeof(mh));
    mh.msg_iov        = &iov;
    mh.msg_iovlen     = 1;
    mh.msg_control    = control;
    mh.msg_controllen = sizeof(control);
    n                 = recvmsg(conn->fd, &mh, MSG_CMSG_CLOEXEC);
    if (n <= 0) {
        return n;
    }
    for (cmsg = CMSG_FIRSTHDR(&mh); cmsg != NULL;
         cmsg = CMSG_NXTHDR(&mh, cmsg)) {
        if ((cmsg->cmsg_level == SOL_SOCKET) &&
            (cmsg->cmsg_type == SCM_RIGHTS) &&
            (cmsg->cmsg_len >= CMSG_LEN(sizeof(int)))) {
            int fd;

            memcpy(&fd, CMSG_DATA(cmsg), sizeof(fd));
            if ((fd_p != NULL) && (*fd_p < 0)) {
                *fd_p = fd; /* fd now belongs to the caller */
            } else {
                close(fd); /* unexpected: never leak it */
            }
        }
    }
    return n;
}

kvf_status_t kvf_bconn_read_some(kvf_bconn_t *conn, int *fd_p)
{
    kvf_status_t status = kvf_bconn_rx_reserve(conn);
    ssize_t n;

    if (status != KVF_OK) {
        return status;
    }
    do {
        n = kvf_bconn_read(conn, fd_p);
    } while ((n < 0) && (errno == EINTR));
    if (n > 0) {
        conn->rx_len += (size_t)n;
        return KVF_OK;
    }
    if (n == 0) {
        return kvf_bconn_fail(conn, KVF_ERR_CLOSED, "%s closed the connection",
                              conn->peer);
    }
    if ((errno == EAGAIN) || (errno == EWOULDBLOCK)) {
        return KVF_INPROGRESS;
    }
    return kvf_bconn_fail(conn, KVF_ERR_CLOSED, "%s connection lost: %s",
                          conn->peer, strerror(errno));
}

kvf_status_t kvf_bconn_recv_buffered(kvf_bconn_t *conn, kvf_frame_t *frame_p)
{
    kvf_status_t status;
    size_t used = 0;

    status = kvf_frame_decode_buf(conn->rx + conn->rx_off,
                                  conn->rx_len - conn->rx_off, conn->max_frame,
                                  NULL, frame_p, &used);
    if (status == KVF_OK) {
        conn->rx_off += used;
        return KVF_OK;
    }
    if (status == KVF_INPROGRESS) {
        return status;
    }
    return kvf_bconn_fail(conn, status, "bad frame from %s: %s", conn->peer,
                          kvf_strerror(status));
}

kvf_status_t kvf_bconn_recv(kvf_bconn_t *conn, uint64_t deadline, int *fd_p,
                            kvf_frame_t *frame_p)
{
    kvf_status_t status;

    for (;;) {
        status = kvf_bconn_recv_buffered(conn, frame_p);
        if (status != KVF_INPROGRESS) {
            return status;
        }
        status = kvf_bconn_read_some(conn, fd_p);
        if (status == KVF_OK) {
            continue;
        }
        if (status != KVF_INPROGRESS) {
            return status;
        }
        status = kvf_bconn_wait_fd(conn->fd, POLLIN, deadline);
        if (status == KVF_ERR_TIMEOUT) {
            return kvf_bconn_fail(conn, status, "%s did not answer in time",
                                  conn->peer);
        }
        if (status != KVF_OK) {
            return kvf_bconn_fail(conn, status, "poll: %s", strerror(errno));
        }
    }
}

/* A STATUS frame's error as this connection's failure. */
static kvf_status_t kvf_bconn_fail_status(kvf_bconn_t *conn,
                                          const Kvf__Status *st)
{
    return kvf_bconn_fail(
        conn, (st->status < 0) ? (kvf_status_t)st->status : KVF_ERR_PROTO,
        "%s: %s", conn->peer,
        ((st->message != NULL) && (st->message[0] != '\0'))
            ? st->message
            : kvf_strerror((kvf_status_t)st->status));
}

void kvf_bconn_set_filter(kvf_bconn_t *conn, kvf_bconn_filter_t filter,
                          void *arg)
{
    conn->filter     = filter;
    conn->filter_arg = arg;
}

kvf_status_t kvf_bconn_expect(kvf_bconn_t *conn, uint16_t type,
                              uint64_t deadline, int *fd_p,
                              kvf_frame_t *frame_p)
{
    const Kvf__Status *st;
    kvf_frame_t frame;
    kvf_status_t status;

    do {
        status = kvf_bconn_recv(conn, deadline, fd_p, &frame);
        if (status != KVF_OK) {
            return status;
        }
    } while ((conn->filter != NULL) && conn->filter(conn->filter_arg, &frame));
    if (frame.type == type) {
        *frame_p = frame;
        return KVF_OK;
    }
    st = (frame.type == KVF_MSG_STATUS) ? (const Kvf__Status *)frame.msg : NULL;
    if ((st != NULL) && (st->status != KVF_OK)) {
        status = kvf_bconn_fail_status(conn, st);
        kvf_frame_release(&frame, NULL);
        return status;
    }
    kvf_frame_release(&frame, NULL);
    return kvf_bconn_fail(conn, KVF_ERR_PROTO, "%s sent %s, expected %s",
                          conn->peer, kvf_msg_type_name(frame.type),
                          kvf_msg_type_name(type));
}

kvf_status_t kvf_bconn_hello(kvf_bconn_t *conn,
                             const kvf_bconn_hello_params_t *params,
                             uint64_t deadline, int *fd_p)
{
    const Kvf__HelloReply *reply;
    const Kvf__Status *st;
    uint8_t mac[KVF_AUTH_MAC_SIZE];
    kvf_auth_session_t auth;
    kvf_frame_t frame;
    Kvf__Hello hello;
    Kvf__Auth auth_msg;
    kvf_status_t status;
    char name_buf[128], text[256];
    size_t nonce_len;

    snprintf(name_buf, sizeof(name_buf), "%s",
             (params->name != NULL) ? params->name : "");
    kvf_auth_session_init(&auth, params->secret);
    status = kvf_auth_client_hello(&auth, &nonce_len);
    if (status != KVF_OK) {
        status = kvf_bconn_fail(conn, KVF_ERR_IO, "no random auth nonce");
        goto out;
    }
    kvf__hello__init(&hello);
    hello.request_id       = kvf_bconn_next_id(conn);
    hello.protocol_version = params->version;
    hello.kind             = (Kvf__PeerKind)params->kind;
    hello.name             = name_buf;
    hello.auth_nonce.data  = auth.own_nonce;
    hello.auth_nonce.len   = nonce_len;
    status = kvf_bconn_send(conn, KVF_MSG_HELLO, &hello.base, deadline);
    if (status != KVF_OK) {
        goto out;
    }
    status =
        kvf_bconn_expect(conn, KVF_MSG_HELLO_REPLY, deadline, fd_p, &frame);
    if (status != KVF_OK) {
        goto out;
    }
    reply  = (const Kvf__HelloReply *)frame.msg;
    status = (kvf_status_t)reply->status;
    if (status != KVF_OK) {
        kvf_bconn_fail(conn, status, "%s refused the connection: %s",
                       conn->peer,
                       (reply->message != NULL) ? reply->message : "");
    } else {
        status = kvf_hello_client_auth(&auth, reply, name_buf, &auth_msg, mac,
                                       text, sizeof(text));
        if (status != KVF_OK) {
            kvf_bconn_fail(conn, status, "%s: %s", conn->peer, text);
        }
    }
    kvf_frame_release(&frame, NULL);
    if ((status != KVF_OK) || (auth.state != KVF_AUTH_STATE_CHALLENGED)) {
        goto out;
    }
    auth_msg.request_id = kvf_bconn_next_id(conn);
    status = kvf_bconn_send(conn, KVF_MSG_AUTH, &auth_msg.base, deadline);
    if (status != KVF_OK) {
        goto out;
    }
    /* a refusal arrives as STATUS{KVF_ERR_AUTH}: kvf_bconn_expect fails */
    status = kvf_bconn_expect(conn, KVF_MSG_STATUS, deadline, fd_p, &frame);
    if (status != KVF_OK) {
        goto out;
    }
    st = (const Kvf__Status *)frame.msg;
    if (st->status != KVF_OK) {
        status = kvf_bconn_fail_status(conn, st);
    }
    kvf_frame_release(&frame, NULL);
out:
    kvf_auth_session_cleanup(&auth);
    return status;
}
