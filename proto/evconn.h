/* SPDX-License-Identifier: Apache-2.0 */
/* Copyright (c) 2026 The kvfabric authors */
/*
 * The one async framed connection of the daemons, over libevent: a socket
 * (TCP or Unix), optionally TLS, its read and write events and two
 * evbuffers. Not a bufferevent: libevent 2.1's bufferevent reads at most
 * 4096 bytes per callback after an ioctl(FIONREAD), which cut a pipelined
 * batch into many rounds and cost a syscall per read; here one recv()
 * takes what is there (read_size), whole frames are decoded and handed to
 * on_frame one by one, and the replies of a batch leave in one writev().
 *
 * Connections of one server share a kvf_evconn_group_t: their settings,
 * the bytes they hold (for buffer caps; the owner closes connections
 * above them in on_read), an optional decode arena and counters. A
 * connection is "pre-auth" while its owner says so (ops->is_preauth):
 * it reads 4 KiB at a time and may send only max_frame_preauth frames.
 *
 * thread: the group's event loop only. Ownership: a connection owns its
 * socket and SSL; the group is borrowed and must outlive its connections.
 */
#ifndef KVF_PROTO_EVCONN_H
#define KVF_PROTO_EVCONN_H

#include "proto/frame.h"

#include <kvfabric/status.h>

#include <event2/util.h>

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

struct event_base;
struct evbuffer;
struct ssl_st;

typedef struct kvf_evconn kvf_evconn_t;

typedef struct kvf_evconn_ops {
    /*
     * Answers one whole frame (replies queue with kvf_evconn_send). Returns
     * KVF_OK to go on, KVF_ERR_PROTO to close once the replies are written,
     * KVF_ERR_CANCELED to close at once (nothing more is read or written).
     */
    kvf_status_t (*on_frame)(kvf_evconn_t *conn, kvf_frame_t *frame);
    /* A frame that does not decode (@p status: KVF_ERR_TOO_BIG, or
     * malformed): the owner may answer; the return value as on_frame's. */
    kvf_status_t (*on_bad_frame)(kvf_evconn_t *conn, kvf_status_t status);
    /* After bytes were read and counted, before they are decoded: false
     * when the owner closed @p conn (e.g. over a buffer cap). NULL: true. */
    bool (*on_read)(kvf_evconn_t *conn);
    /* The connection must go (@p why: KVF_ERR_CLOSED by its peer,
     * KVF_ERR_IO failed, else what on_frame or on_bad_frame returned):
     * the owner calls kvf_evconn_destroy() on it now. */
    void (*on_close)(kvf_evconn_t *conn, kvf_status_t why);
    /* Has the peer not authenticated yet? NULL: never pre-auth. */
    bool (*is_preauth)(const kvf_evconn_t *conn);
    /* A frame was answered in @p ns (decode to release). NULL: none. */
    void (*on_served)(kvf_evconn_t *conn, uint64_t ns);
    /* A connection of kvf_evconn_connect() is up (connected and, with TLS,
     * the handshake done): the owner may send. A failure before that goes
     * to on_close (KVF_ERR_IO, kvf_evconn_problem() says why). NULL: none. */
    void (*on_connected)(kvf_evconn_t *conn);
} kvf_evconn_ops_t;

typedef struct kvf_evconn_group {
    struct event_base *base;
    const kvf_evconn_ops_t *ops;
    uint32_t max_frame;         /* largest frame accepted or sent */
    uint32_t max_frame_preauth; /* accepted before authentication */
    uint64_t max_output; /* reading pauses while more replies are unsent */
    /* decode arena (NULL: malloc): a frame's message unpacks here and the
     * arena is reset per frame, so per-request work does not malloc */
    uint8_t *arena;
    size_t arena_size;
    size_t arena_used;
    uint64_t arena_spills;     /* allocations that did not fit */
    uint64_t buffered;         /* bytes held by all connections */
    uint64_t buffered_preauth; /* of those, by pre-auth ones */
    uint64_t backpressure;     /* times reading paused over max_output */
    uint64_t tls_failures;     /* TLS handshakes that failed */
} kvf_evconn_group_t;

/*
 * A connection on @p fd (owned from now on, closed on failure too) in
 * @p group, with user data @p arg; @p ssl (owned; NULL: plain) is in
 * accept or connect state already. Reading starts at once. NULL when it
 * cannot be set up.
 */
kvf_evconn_t *kvf_evconn_create(kvf_evconn_group_t *group, evutil_socket_t fd,
                                struct ssl_st *ssl, void *arg);

/*
 * A client connection to @p addr in @p group, with user data @p arg:
 * a non-blocking connect, then (with @p ssl, owned; NULL: plain) the TLS
 * client handshake; ops->on_connected runs once it is up, on_close when
 * it fails. NULL (errno set, @p ssl freed) when the connect fails at once.
 */
kvf_evconn_t *kvf_evconn_connect(kvf_evconn_group_t *group,
                                 const struct sockaddr *addr,
                                 socklen_t addr_len, struct ssl_st *ssl,
                                 void *arg);

/* Whether @p conn is up (always for kvf_evconn_create's). */
bool kvf_evconn_is_connected(const kvf_evconn_t *conn);

/* Why @p conn failed ("" when it did not, or closed cleanly): a socket
 * error, "tls: certificate not trusted: ..." or "tls handshake failed:
 * ...". Valid until @p conn is destroyed. */
const char *kvf_evconn_problem(const kvf_evconn_t *conn);

/* Frees @p conn and closes its socket; NULL is a no-op. Inside on_frame or
 * on_bad_frame (a handler that drops the connection mid-frame) the socket
 * goes quiet at once and the memory is freed when the handler returns
 * (its return value is then ignored). */
void kvf_evconn_destroy(kvf_evconn_t *conn);

void *kvf_evconn_arg(const kvf_evconn_t *conn);

/* The name logs give @p conn (a peer address; "" until set). */
void kvf_evconn_set_name(kvf_evconn_t *conn, const char *name);
evutil_socket_t kvf_evconn_fd(const kvf_evconn_t *conn);

/* Unsent replies (append with kvf_frame_encode, then kvf_evconn_flush). */
struct evbuffer *kvf_evconn_output(kvf_evconn_t *conn);

/* Bytes @p conn counts in group->buffered, and whether in
 * buffered_preauth too. */
uint64_t kvf_evconn_held(const kvf_evconn_t *conn, bool *is_preauth_p);

/* Queues a reply frame of @p type (flags: KVF_FRAME_FLAG_REPLY); outside
 * on_frame it leaves on the next turn of the loop. */
kvf_status_t kvf_evconn_send(kvf_evconn_t *conn, uint16_t type,
                             const ProtobufCMessage *msg);

/* Queues @p len bytes of frames encoded already (sent to several
 * connections, packed once); they leave on the next turn of the loop. */
kvf_status_t kvf_evconn_send_raw(kvf_evconn_t *conn, const void *data,
                                 size_t len);

/* Queues a request frame of @p type (flags 0), as kvf_evconn_send. */
kvf_status_t kvf_evconn_request(kvf_evconn_t *conn, uint16_t type,
                                const ProtobufCMessage *msg);

/* Writes what is queued, leaving the rest to the write event; false when
 * the connection failed (the caller destroys it). */
bool kvf_evconn_flush(kvf_evconn_t *conn);

/* Sends what is queued, then calls on_close (now or once written);
 * nothing more is read. */
void kvf_evconn_close_after_flush(kvf_evconn_t *conn);

/* Serves @p len bytes as if read from the socket (fuzzing, tests); may
 * call on_close. */
void kvf_evconn_feed(kvf_evconn_t *conn, const void *data, size_t len);

#endif /* KVF_PROTO_EVCONN_H */
