/* SPDX-License-Identifier: Apache-2.0 */
/* Copyright (c) 2026 The kvfabric authors */
/*
 * One blocking framed connection, "bconn" (DESIGN.md §5; the daemons'
 * connections are libevent's, so the b says blocking): the engine client's and
 * the admin client's and the tests': frames out and in over a byte stream,
 * every wait bounded by a deadline, HELLO + AUTH, file descriptors passed
 * with SCM_RIGHTS on Unix sockets. The byte stream is pluggable: a plain
 * socket (Unix or TCP) by default, TLS through kvf_bconn_stream_ops_t (the
 * admin client, client/ctlconn.c), so proto/ needs no libssl.
 *
 * Failures return a status and leave one line in kvf_bconn_last_error()
 * naming the peer (kvf_bconn_params_t.peer). Nothing is logged here.
 *
 * thread: one thread per connection. Ownership: the connection owns its
 * fd and buffers; each frame received is the caller's (kvf_frame_release()).
 * Not for event loops: the daemons use libevent (proto/frame_ev.c).
 */
#ifndef KVF_PROTO_BCONN_H
#define KVF_PROTO_BCONN_H

#include "common/auth.h"
#include "proto/frame.h"

#include <kvfabric/status.h>

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

typedef struct kvf_bconn kvf_bconn_t;

/* A byte stream other than the plain socket (TLS). Both return bytes moved,
 * 0 on EOF (read), or -1 with errno set (EAGAIN: wait and try again). */
typedef struct kvf_bconn_stream_ops {
    ssize_t (*read)(void *arg, void *buf, size_t len);
    ssize_t (*write)(void *arg, const void *buf, size_t len);
} kvf_bconn_stream_ops_t;

typedef struct kvf_bconn_params {
    const char *peer;   /* "agent at /run/kvfabric/agent.sock": in errors */
    uint32_t max_frame; /* 0: KVF_FRAME_MAX_DEFAULT */
    const kvf_bconn_stream_ops_t *ops; /* NULL: the plain socket */
    void *ops_arg;                     /* borrowed, passed to ops */
} kvf_bconn_params_t;

/*
 * Wraps the connected non-blocking socket @p fd, which now belongs to the
 * connection (closed by kvf_bconn_destroy(), also when this fails).
 * KVF_ERR_NO_MEMORY.
 */
kvf_status_t kvf_bconn_create(int fd, const kvf_bconn_params_t *params,
                              kvf_bconn_t **conn_p);

/* Closes the socket and frees the buffers; NULL is a no-op. */
void kvf_bconn_destroy(kvf_bconn_t *conn);

/*
 * Connects a non-blocking Unix stream socket to @p path by @p deadline.
 * KVF_ERR_INVALID (path too long), KVF_ERR_IO (nobody listens there: the
 * reason, with the path, in @p err), KVF_ERR_TIMEOUT.
 */
kvf_status_t kvf_bconn_dial_unix(const char *path, uint64_t deadline, int *fd_p,
                                 char *err, size_t err_len);

/* Waits until @p fd is ready for @p events (POLLIN, POLLOUT) or the
 * deadline passes: KVF_OK, KVF_ERR_TIMEOUT, KVF_ERR_IO. */
kvf_status_t kvf_bconn_wait_fd(int fd, short events, uint64_t deadline);

/* Appends one frame (flags 0) / bytes already framed to the send queue. */
kvf_status_t kvf_bconn_queue(kvf_bconn_t *conn, uint16_t type,
                             const ProtobufCMessage *msg);
kvf_status_t kvf_bconn_queue_raw(kvf_bconn_t *conn, const void *data,
                                 size_t len);

/* Writes the send queue: KVF_OK, KVF_ERR_CLOSED, KVF_ERR_TIMEOUT. */
kvf_status_t kvf_bconn_flush(kvf_bconn_t *conn, uint64_t deadline);

/* queue + flush. */
kvf_status_t kvf_bconn_send(kvf_bconn_t *conn, uint16_t type,
                            const ProtobufCMessage *msg, uint64_t deadline);

/*
 * Receives one frame. A descriptor passed with the bytes (SCM_RIGHTS) goes
 * to *fd_p when @p fd_p is given and still -1, else it is closed.
 * KVF_ERR_CLOSED (EOF or reset), KVF_ERR_TIMEOUT, KVF_ERR_PROTO (a bad
 * frame: close the connection), KVF_ERR_TOO_BIG.
 */
kvf_status_t kvf_bconn_recv(kvf_bconn_t *conn, uint64_t deadline, int *fd_p,
                            kvf_frame_t *frame_p);

/*
 * A frame kvf_bconn_expect() received, offered first to the filter: true
 * when the filter took it (and released it), false to go on as without
 * one. For replies to requests sent earlier without waiting.
 */
typedef bool (*kvf_bconn_filter_t)(void *arg, kvf_frame_t *frame);

void kvf_bconn_set_filter(kvf_bconn_t *conn, kvf_bconn_filter_t filter,
                          void *arg);

/*
 * As kvf_bconn_recv(), for a frame of @p type: a STATUS carrying an error
 * becomes that status (its message in the last error), any other type
 * KVF_ERR_PROTO. Frames the filter takes are passed by.
 */
kvf_status_t kvf_bconn_expect(kvf_bconn_t *conn, uint16_t type,
                              uint64_t deadline, int *fd_p,
                              kvf_frame_t *frame_p);

/* One read without waiting: KVF_OK (bytes came), KVF_INPROGRESS (none),
 * KVF_ERR_CLOSED, KVF_ERR_IO. */
kvf_status_t kvf_bconn_read_some(kvf_bconn_t *conn, int *fd_p);

/* A frame already read; KVF_INPROGRESS when none (never blocks). */
kvf_status_t kvf_bconn_recv_buffered(kvf_bconn_t *conn, kvf_frame_t *frame_p);

/* What kvf_bconn_hello() says. */
typedef struct kvf_bconn_hello_params {
    uint32_t version; /* KVF_PROTOCOL_VERSION */
    int kind;         /* Kvf__PeerKind */
    const char *name;
    const kvf_auth_secret_t *secret; /* borrowed; NULL/empty: no auth */
} kvf_bconn_hello_params_t;

/*
 * HELLO, then AUTH when the peer challenged us (docs/protocol.md
 * "Handshake"). The peer's refusal comes back as its status (KVF_ERR_AUTH,
 * KVF_ERR_VERSION, ...) with its reason in the last error. A descriptor
 * passed meanwhile goes to @p fd_p as in kvf_bconn_recv().
 */
kvf_status_t kvf_bconn_hello(kvf_bconn_t *conn,
                             const kvf_bconn_hello_params_t *params,
                             uint64_t deadline, int *fd_p);

/* Next request id (1, 2, ...). */
uint64_t kvf_bconn_next_id(kvf_bconn_t *conn);

/* The socket (polling several connections, tests). */
int kvf_bconn_fd(const kvf_bconn_t *conn);

/* One line: why the last failed call failed. Valid until the next call. */
const char *kvf_bconn_last_error(const kvf_bconn_t *conn);

#endif /* KVF_PROTO_BCONN_H */
