/* SPDX-License-Identifier: Apache-2.0 */
/* Copyright (c) 2026 The kvfabric authors */
/*
 * A blocking connection to kvf-controller: connect, HELLO, then frames out
 * and replies in, each wait bounded by a timeout. Used by kvfctl, kvf-bench
 * and the tests. The framing, deadlines and HELLO + AUTH are proto/bconn.c's
 * (shared with libkvfabric); this adds TCP name resolution and TLS.
 *
 * thread: one thread per connection. Ownership: the caller owns the
 * connection and each frame received (kvf_frame_release()).
 */
#ifndef KVF_CLIENT_CTLCONN_H
#define KVF_CLIENT_CTLCONN_H

#include "common/auth.h"
#include "proto/frame.h"
#include "proto/hello.h"

#include <kvfabric/status.h>

#include <stddef.h>
#include <stdint.h>

typedef struct kvf_ctlconn kvf_ctlconn_t;

/*
 * Connects to @p hostport (HOST:PORT, or several comma-separated: the first
 * that accepts and answers HELLO, e.g. the leader of controllers with HA on
 * etcd, where standbys do not listen) and exchanges HELLO (@p kind is a
 * Kvf__PeerKind,
 * @p version normally KVF_PROTOCOL_VERSION; 0 skips HELLO, for tests). On
 * failure writes a one-line reason to @p err: KVF_ERR_CONFIG bad address,
 * KVF_ERR_IO cannot connect, KVF_ERR_TIMEOUT, KVF_ERR_VERSION / other status
 * from the HELLO reply.
 */
kvf_status_t kvf_ctlconn_create(const char *hostport, int kind,
                                const char *name, uint32_t version,
                                int timeout_ms, kvf_ctlconn_t **conn_p,
                                char *err, size_t err_len);

/* What kvf_ctlconn_open() needs. */
typedef struct kvf_ctlconn_params {
    const char *hostport;
    int kind;         /* Kvf__PeerKind */
    const char *name; /* told in HELLO */
    uint32_t version; /* KVF_PROTOCOL_VERSION; 0 skips HELLO (tests) */
    int timeout_ms;   /* each wait */
    const kvf_auth_secret_t *secret; /* borrowed; NULL/empty: no auth */
    const char *tls_ca;              /* PEM CA file; NULL/empty: plain TCP */
    const char *tls_server_name;     /* checked in the certificate; NULL/empty:
                                        the chain only */
} kvf_ctlconn_params_t;

/*
 * As kvf_ctlconn_create(), and with a cluster secret it answers the
 * controller's challenge (docs/protocol.md "Handshake"): KVF_ERR_AUTH with
 * the reason in @p err when either side fails to prove the secret or only
 * one side has one. With @p params->tls_ca it speaks TLS and verifies the
 * controller's certificate first (KVF_ERR_AUTH when it does not verify,
 * KVF_ERR_IO when the TLS handshake fails otherwise).
 */
kvf_status_t kvf_ctlconn_open(const kvf_ctlconn_params_t *params,
                              kvf_ctlconn_t **conn_p, char *err,
                              size_t err_len);

void kvf_ctlconn_destroy(kvf_ctlconn_t *conn);

/* Next request id (1, 2, ...). */
uint64_t kvf_ctlconn_next_id(kvf_ctlconn_t *conn);

/* Sends one frame (flags 0). */
kvf_status_t kvf_ctlconn_send(kvf_ctlconn_t *conn, uint16_t type,
                              const ProtobufCMessage *msg);

/* Queues one frame without writing it (pipelining); then flush. */
kvf_status_t kvf_ctlconn_queue(kvf_ctlconn_t *conn, uint16_t type,
                               const ProtobufCMessage *msg);

/* Queues bytes already framed (kvf_frame_pack()); then flush. */
kvf_status_t kvf_ctlconn_queue_raw(kvf_ctlconn_t *conn, const void *data,
                                   size_t len);

/* Writes everything queued (bounded by the timeout). */
kvf_status_t kvf_ctlconn_flush(kvf_ctlconn_t *conn);

/* Sends raw bytes (tests of malformed input). */
kvf_status_t kvf_ctlconn_send_raw(kvf_ctlconn_t *conn, const void *data,
                                  size_t len);

/* Receives one frame: KVF_ERR_CLOSED on EOF, KVF_ERR_TIMEOUT,
 * KVF_ERR_PROTO for a bad frame. */
kvf_status_t kvf_ctlconn_recv(kvf_ctlconn_t *conn, kvf_frame_t *frame_p);

/* One non-blocking read into the receive buffer: KVF_OK (bytes came),
 * KVF_INPROGRESS (none yet), KVF_ERR_CLOSED, KVF_ERR_IO. */
kvf_status_t kvf_ctlconn_read_some(kvf_ctlconn_t *conn);

/* A frame already received and buffered; KVF_INPROGRESS when none (never
 * blocks). */
kvf_status_t kvf_ctlconn_recv_buffered(kvf_ctlconn_t *conn,
                                       kvf_frame_t *frame_p);

/* send + recv. */
kvf_status_t kvf_ctlconn_call(kvf_ctlconn_t *conn, uint16_t type,
                              const ProtobufCMessage *msg,
                              kvf_frame_t *reply_p);

/* The socket (tests). */
int kvf_ctlconn_fd(const kvf_ctlconn_t *conn);

/* One line: why the last send/receive failed (names the controller). */
const char *kvf_ctlconn_last_error(const kvf_ctlconn_t *conn);

#endif /* KVF_CLIENT_CTLCONN_H */
