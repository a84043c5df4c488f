/* SPDX-License-Identifier: Apache-2.0 */
/* Copyright (c) 2026 The kvfabric authors */
/*
 * The controller's connections (controller/ only) over proto/evconn.h
 * (TLS, batched reads, pre-auth limits): accept, the buffer caps across
 * connections, handshake expiry. Whole frames go to
 * kvf_server_t::dispatch; replies leave in one write after the batch.
 *
 * thread: the server's loop only.
 */
#ifndef KVF_CONTROLLER_CONN_H
#define KVF_CONTROLLER_CONN_H

#include "common/auth.h"
#include "proto/evconn.h"
#include "proto/msg.h"

#include <kvfabric/status.h>

#include <event2/util.h>

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct evconnlistener;
struct sockaddr;
struct kvf_frame;

typedef struct kvf_server kvf_server_t;
typedef struct kvf_conn kvf_conn_t;

/* Answers one decoded frame; KVF_ERR_PROTO closes the connection once
 * the replies are written. */
typedef kvf_status_t kvf_conn_dispatch_fn(kvf_conn_t *conn,
                                          struct kvf_frame *frame);

/* A controller connection: a proto/evconn.h framed connection plus what
 * the handlers know of its peer. */
struct kvf_conn {
    kvf_server_t *server;
    kvf_evconn_t *ev;
    kvf_conn_t *prev;
    kvf_conn_t *next;
    uint64_t id;
    bool is_hello_done;
    kvf_auth_session_t auth; /* the cluster-secret handshake */
    uint64_t accepted_ms;
    int kind; /* Kvf__PeerKind */
    char peer[64];
};

/* Queues a reply frame of @p type. */
kvf_status_t kvf_conn_send(kvf_conn_t *conn, uint16_t type,
                           const ProtobufCMessage *msg);

/* Queues a STATUS reply. */
kvf_status_t kvf_conn_send_status(kvf_conn_t *conn, uint64_t req_id,
                                  kvf_status_t code, const char *text);

/* Counts a peer error and answers it. */
void kvf_conn_reject(kvf_conn_t *conn, uint64_t req_id, kvf_status_t code,
                     const char *text);

/* Unlinks @p conn from its server, closes its socket and frees it. */
void kvf_conn_destroy(kvf_conn_t *conn);

/* The control listener's accept callback (arg: the server). */
void kvf_conn_on_accept(struct evconnlistener *lst, evutil_socket_t fd,
                        struct sockaddr *sa, int salen, void *arg);

/* Sets up the server's connection group (settings, decode arena). */
kvf_status_t kvf_conn_group_init(kvf_server_t *server);

/* Closes the connections that did not authenticate in handshake_timeout. */
void kvf_conn_expire_handshakes(kvf_server_t *server);

/*
 * Serves @p len bytes as if one new connection had sent them, then closes
 * that connection; replies go to a socket nobody reads (fuzzing, tests).
 */
void kvf_server_feed(kvf_server_t *server, const void *data, size_t len);

#endif /* KVF_CONTROLLER_CONN_H */
