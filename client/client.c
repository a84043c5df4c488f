/* SPDX-License-Identifier: Apache-2.0 */
/* Copyright (c) 2026 The kvfabric authors */
/*
 * libkvfabric: the engine's side of the agent's Unix socket
 * (include/kvfabric/kvfabric.h). Blocking calls with deadlines; one
 * request in flight per connection. The library prints nothing: failures
 * are returned as statuses with a one-line reason in
 * kvf_client_last_error().
 */
#include <kvfabric/kvfabric.h>

#include "common/auth.h"
#include "common/log.h"
#include "common/time.h"
#include "proto/frame.h"
#include "proto/hello.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#define KVF_CLIENT_DEFAULT_TIMEOUT_NS (5ull * KVF_NSEC_PER_SEC)
#define KVF_CLIENT_DEFAULT_SOCKET     "/run/kvfabric/agent.sock"
#define KVF_CLIENT_MAX_FRAME          (16u << 20)

struct kvf_client {
    int fd;
    uint64_t timeout_ns;
    uint64_t next_request;
    void *pool_base;
    uint64_t pool_size;
    uint64_t max_chunk_bytes;
    uint64_t pd_offset; /* PD receive region in the mapping (decoders) */
    uint64_t pd_size;
    uint64_t pd_push_timeout_ns; /* the agent's deadline of one push */
    char node_name[128];
    uint8_t *rx; /* receive buffer: bytes [0, rx_len) not yet decoded */
    size_t rx_len;
    size_t rx_cap;
    uint8_t *tx;
    size_t tx_cap;
    char error[256];
};

static kvf_status_t kvf_client_fail(kvf_client_t *client, kvf_status_t status,
                                    const char *fmt, ...) KVF_PRINTF(3, 4);

static kvf_status_t kvf_client_fail(kvf_client_t *client, kvf_status_t status,
                                    const char *fmt, ...)
{
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(client->error, sizeof(client->error), fmt, ap);
    va_end(ap);
    return status;
}

const char *kvf_client_last_error(const kvf_client_t *client)
{
    return (client == NULL) ? "no client" : client->error;
}

/* Waits until @p fd is ready for @p events or the deadline passes. */
static kvf_status_t kvf_client_wait_fd(kvf_client_t *client, short events,
                                       uint64_t deadline)
{
    struct pollfd pfd = {.fd = client->fd, .events = events};
    int rc;

    for (;;) {
        rc = poll(&pfd, 1, kvf_time_left_ms(deadline));
        if (rc > 0) {
            return KVF_OK;
        }
        if (rc == 0) {
            return kvf_client_fail(client, KVF_ERR_TIMEOUT,
                                   "agent did not answer in time");
        }
        if (errno != EINTR) {
            return kvf_client_fail(client, KVF_ERR_IO, "poll: %s",
                                   strerror(errno));
        }
    }
}

static kvf_status_t kvf_client_send(kvf_client_t *client, uint16_t type,
                                    const ProtobufCMessage *msg,
                                    uint64_t deadline)
{
    size_t need = kvf_frame_size(msg), len = 0, off = 0;
    kvf_status_t status;
    ssize_t n;

    if (need > client->tx_cap) {
        uint8_t *grown = realloc(client->tx, need);
        if (grown == NULL) {
            return kvf_client_fail(client, KVF_ERR_NO_MEMORY,
                                   "no memory for a %zu-byte request", need);
        }
        client->tx     = grown;
        client->tx_cap = need;
    }
    status = kvf_frame_pack(client->tx, client->tx_cap, type, 0, msg,
                            KVF_CLIENT_MAX_FRAME, &len);
    if (status != KVF_OK) {
        return kvf_client_fail(client, status, "request too large (%zu bytes)",
                               need);
    }
    while (off < len) {
        n = send(client->fd, client->tx + off, len - off, MSG_NOSIGNAL);
        if (n > 0) {
            off += (size_t)n;
            continue;
        }
        if ((n < 0) && (errno == EINTR)) {
            continue;
        }
        if ((n < 0) && ((errno == EAGAIN) || (errno == EWOULDBLOCK))) {
            status = kvf_client_wait_fd(client, POLLOUT, deadline);
            if (status != KVF_OK) {
                return status;
            }
            continue;
        }
        return kvf_client_fail(client, KVF_ERR_CLOSED,
                               "agent connection lost: %s", strerror(errno));
    }
    return KVF_OK;
}

/* Reads bytes into rx, taking one passed fd if @p fd_p is given. */
static kvf_status_t kvf_client_read_some(kvf_client_t *client, int *fd_p,
                                         uint64_t deadline)
{
    char control[CMSG_SPACE(sizeof(int))];
    struct cmsghdr *cmsg;
    struct msghdr mh;
    struct iovec iov;
    kvf_status_t status;
    ssize_t n;

    if (client->rx_cap - client->rx_len < 4096) {
        size_t cap = (client->rx_cap == 0) ? 65536 : client->rx_cap * 2;
        uint8_t *grown;

        if (cap > KVF_CLIENT_MAX_FRAME + KVF_FRAME_HDR_SIZE + 4096) {
            return kvf_client_fail(client, KVF_ERR_PROTO,
                                   "agent sent an oversized frame");
        }
        grown = realloc(client->rx, cap);
        if (grown == NULL) {
            return kvf_client_fail(client, KVF_ERR_NO_MEMORY,
                                   "no memory for a reply");
        }
        client->rx     = grown;
        client->rx_cap = cap;
    }
    for (;;) {
        iov.iov_base = client->rx + client->rx_len;
        iov.iov_len  = client->rx_cap - client->rx_len;
        memset(&mh, 0, sizeof(mh));
        mh.msg_iov        = &iov;
        mh.msg_iovlen     = 1;
        mh.msg_control    = control;
        mh.msg_controllen = sizeof(control);
        n                 = recvmsg(client->fd, &mh, MSG_CMSG_CLOEXEC);
        if (n > 0) {
            break;
        }
        if (n == 0) {
            return kvf_client_fail(client, KVF_ERR_CLOSED,
                                   "agent closed the connection");
        }
        if (errno == EINTR) {
            continue;
        }
        if ((errno != EAGAIN) && (errno != EWOULDBLOCK)) {
            return kvf_client_fail(client, KVF_ERR_CLOSED,
                                   "agent connection lost: %s",
                                   strerror(errno));
        }
        status = kvf_client_wait_fd(client, POLLIN, deadline);
        if (status != KVF_OK) {
            return status;
        }
    }
    client->rx_len += (size_t)n;
    for (cmsg = CMSG_FIRSTHDR(&mh); cmsg != NULL;
         cmsg = CMSG_NXTHDR(&mh, cmsg)) {
        if ((cmsg->cmsg_level == SOL_SOCKET) &&
            (cmsg->cmsg_type == SCM_RIGHTS) &&
            (cmsg->cmsg_len >= CMSG_LEN(sizeof(int)))) {
            int fd;

            memcpy(&fd, CMSG_DATA(cmsg), sizeof(fd));
            if ((fd_p != NULL) && (*fd_p < 0)) {
                *fd_p = fd;
            } else {
                close(fd); /* unexpected: never leak it */
            }
        }
    }
    return KVF_OK;
}

/* Receives the next frame of @p type; the caller releases it. */
static kvf_status_t kvf_client_recv(kvf_client_t *client, uint16_t type,
                                    int *fd_p, uint64_t deadline,
                                    kvf_frame_t *frame_p)
{
    kvf_frame_t frame;
    kvf_status_t status;
    size_t used = 0;

    for (;;) {
        status =
            kvf_frame_decode_buf(client->rx, client->rx_len,
                                 KVF_CLIENT_MAX_FRAME, NULL, &frame, &used);
        if (status == KVF_OK) {
            memmove(client->rx, client->rx + used, client->rx_len - used);
            client->rx_len -= used;
            if (frame.type == type) {
                *frame_p = frame;
                return KVF_OK;
            }
            if (frame.type == KVF_MSG_STATUS) {
                const Kvf__Status *st = (const Kvf__Status *)frame.msg;
                status                = kvf_client_fail(
                                   client,
                    (st->status < 0) ? (kvf_status_t)st->status : KVF_ERR_PROTO,
                                   "agent: %s", (st->message != NULL) ? st->message : "");
                kvf_frame_release(&frame, NULL);
                return status;
            }
            kvf_frame_release(&frame, NULL);
            return kvf_client_fail(
                client, KVF_ERR_PROTO, "agent sent %s, expected %s",
                kvf_msg_type_name(frame.type), kvf_msg_type_name(type));
        }
        if (status != KVF_INPROGRESS) {
            return kvf_client_fail(client, KVF_ERR_PROTO,
                                   "bad frame from the agent: %s",
                                   kvf_strerror(status));
        }
        status = kvf_client_read_some(client, fd_p, deadline);
        if (status != KVF_OK) {
            return status;
        }
    }
}

static kvf_status_t kvf_client_dial(kvf_client_t *client, const char *path,
                                    uint64_t deadline)
{
    struct sockaddr_un sun;
    kvf_status_t status;
    socklen_t len;
    int err = 0;

    if (strlen(path) >= sizeof(sun.sun_path)) {
        return kvf_client_fail(client, KVF_ERR_INVALID,
                               "socket path too long: %s", path);
    }
    client->fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (client->fd < 0) {
        return kvf_client_fail(client, KVF_ERR_IO, "socket: %s",
                               strerror(errno));
    }
    memset(&sun, 0, sizeof(sun));
    sun.sun_family = AF_UNIX;
    memcpy(sun.sun_path, path, strlen(path));
    if (connect(client->fd, (struct sockaddr *)&sun, sizeof(sun)) == 0) {
        return KVF_OK;
    }
    if (errno != EAGAIN && errno != EINPROGRESS) {
        return kvf_client_fail(client, KVF_ERR_IO, "no kvf-agent at %s: %s",
                               path, strerror(errno));
    }
    status = kvf_client_wait_fd(client, POLLOUT, deadline);
    if (status != KVF_OK) {
        return status;
    }
    len = sizeof(err);
    if ((getsockopt(client->fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0) ||
        (err != 0)) {
        return kvf_client_fail(client, KVF_ERR_IO, "no kvf-agent at %s: %s",
                               path, strerror(err));
    }
    return KVF_OK;
}

/* Sends @p auth, the answer to the agent's challenge, and waits for its
 * STATUS. */
static kvf_status_t kvf_client_auth(kvf_client_t *client, Kvf__Auth *auth,
                                    int *fd_p, uint64_t deadline)
{
    const Kvf__Status *st;
    kvf_status_t status;
    kvf_frame_t frame;

    auth->request_id = client->next_request++;
    status = kvf_client_send(client, KVF_MSG_AUTH, &auth->base, deadline);
    if (status != KVF_OK) {
        return status;
    }
    /* a refusal arrives as STATUS{KVF_ERR_AUTH}: kvf_client_recv fails */
    status = kvf_client_recv(client, KVF_MSG_STATUS, fd_p, deadline, &frame);
    if (status != KVF_OK) {
        return status;
    }
    st     = (const Kvf__Status *)frame.msg;
    status = (st->status == KVF_OK) ? KVF_OK
                                    : kvf_client_fail(client, KVF_ERR_PROTO,
                                                      "agent answered AUTH "
                                                      "with status %d",
                                                      (int)st->status);
    kvf_frame_release(&frame, NULL);
    return status;
}

static kvf_status_t kvf_client_handshake(kvf_client_t *client, const char *name,
                                         const kvf_auth_secret_t *secret,
                                         uint64_t deadline)
{
    const Kvf__HelloReply *reply;
    const Kvf__PoolInfo *info;
    uint8_t mac[KVF_AUTH_MAC_SIZE];
    kvf_auth_session_t auth;
    kvf_frame_t frame;
    Kvf__Hello hello;
    Kvf__Auth auth_msg;
    kvf_status_t status;
    char name_buf[128], text[256];
    size_t nonce_len;
    int pool_fd = -1;
    void *base;

    snprintf(name_buf, sizeof(name_buf), "%s", name);
    kvf_auth_session_init(&auth, secret);
    if (kvf_auth_client_hello(&auth, &nonce_len) != KVF_OK) {
        return kvf_client_fail(client, KVF_ERR_IO, "no random auth nonce");
    }
    kvf__hello__init(&hello);
    hello.request_id       = client->next_request++;
    hello.protocol_version = KVF_PROTOCOL_VERSION;
    hello.kind             = KVF__PEER_KIND__PEER_ENGINE;
    hello.name             = name_buf;
    hello.auth_nonce.data  = auth.own_nonce;
    hello.auth_nonce.len   = nonce_len;
    status = kvf_client_send(client, KVF_MSG_HELLO, &hello.base, deadline);
    if (status != KVF_OK) {
        goto err_close_fd;
    }
    /* the pool's fd may arrive with the bytes of HELLO_REPLY already */
    status = kvf_client_recv(client, KVF_MSG_HELLO_REPLY, &pool_fd, deadline,
                             &frame);
    if (status != KVF_OK) {
        goto err_close_fd;
    }
    reply  = (const Kvf__HelloReply *)frame.msg;
    status = (kvf_status_t)reply->status;
    if (status != KVF_OK) {
        kvf_client_fail(client, status, "agent refused the connection: %s",
                        (reply->message != NULL) ? reply->message : "");
    } else if (kvf_hello_client_auth(&auth, reply, name_buf, &auth_msg, mac,
                                     text, sizeof(text)) != KVF_OK) {
        status = kvf_client_fail(client, KVF_ERR_AUTH, "agent: %s", text);
    }
    kvf_frame_release(&frame, NULL);
    if (status != KVF_OK) {
        goto err_close_fd;
    }
    if (auth.state == KVF_AUTH_STATE_CHALLENGED) {
        status = kvf_client_auth(client, &auth_msg, &pool_fd, deadline);
        if (status != KVF_OK) {
            goto err_close_fd;
        }
    }
    kvf_auth_session_cleanup(&auth);

    status =
        kvf_client_recv(client, KVF_MSG_POOL_INFO, &pool_fd, deadline, &frame);
    if (status != KVF_OK) {
        goto err_close_fd;
    }
    info                    = (const Kvf__PoolInfo *)frame.msg;
    client->pool_size       = info->pool_size;
    client->max_chunk_bytes = info->max_chunk_bytes;
    client->pd_offset       = info->pd_offset;
    client->pd_size         = info->pd_size;
    client->pd_push_timeout_ns =
        info->pd_push_timeout_ms * (KVF_NSEC_PER_SEC / 1000u);
    snprintf(client->node_name, sizeof(client->node_name), "%s",
             (info->node_name != NULL) ? info->node_name : "");
    kvf_frame_release(&frame, NULL);
    if ((pool_fd < 0) || (client->pool_size == 0)) {
        status =
            kvf_client_fail(client, KVF_ERR_PROTO, "agent sent no pool to map");
        goto err_close_fd;
    }
    base = mmap(NULL, client->pool_size, PROT_READ | PROT_WRITE, MAP_SHARED,
                pool_fd, 0);
    if (base == MAP_FAILED) {
        status =
            kvf_client_fail(client, KVF_ERR_IO,
                            "cannot map the agent's pool: %s", strerror(errno));
        goto err_close_fd;
    }
    close(pool_fd); /* the mapping keeps the memory alive */
    client->pool_base = base;
    return KVF_OK;

err_close_fd:
    kvf_auth_session_cleanup(&auth);
    if (pool_fd >= 0) {
        close(pool_fd);
    }
    return status;
}

kvf_status_t kvf_client_connect(const kvf_client_params_t *params,
                                kvf_client_t **client_p)
{
    const char *path        = getenv("KVF_SOCKET");
    const char *name        = "engine";
    const char *secret_file = getenv("KVF_CLUSTER_SECRET_FILE");
    kvf_auth_secret_t secret;
    char err[512];
    kvf_client_t *client;
    kvf_status_t status;
    uint64_t deadline;

    if (client_p == NULL) {
        return KVF_ERR_INVALID;
    }
    client = calloc(1, sizeof(*client));
    if (client == NULL) {
        return KVF_ERR_NO_MEMORY;
    }
    client->fd           = -1;
    client->timeout_ns   = KVF_CLIENT_DEFAULT_TIMEOUT_NS;
    client->next_request = 1;
    if (path == NULL) {
        path = KVF_CLIENT_DEFAULT_SOCKET;
    }
    if (params != NULL) {
        if ((params->field_mask & KVF_CLIENT_PARAM_SOCKET) &&
            (params->socket_path != NULL)) {
            path = params->socket_path;
        }
        if ((params->field_mask & KVF_CLIENT_PARAM_TIMEOUT) &&
            (params->timeout_ns > 0)) {
            client->timeout_ns = params->timeout_ns;
        }
        if ((params->field_mask & KVF_CLIENT_PARAM_NAME) &&
            (params->name != NULL)) {
            name = params->name;
        }
        if (params->field_mask & KVF_CLIENT_PARAM_SECRET) {
            secret_file = params->secret_file;
        }
    }
    status = kvf_auth_secret_load_opt(secret_file, &secret, err, sizeof(err));
    if (status != KVF_OK) {
        kvf_client_fail(client, status, "%s", err);
    } else {
        deadline = kvf_time_deadline_ns(client->timeout_ns);
        status   = kvf_client_dial(client, path, deadline);
        if (status == KVF_OK) {
            status = kvf_client_handshake(client, name, &secret, deadline);
        }
        kvf_auth_secret_cleanup(&secret);
    }
    if (status != KVF_OK) {
        /* no client is returned to ask: the reason goes to the log at
         * debug level (KVF_LOG_LEVEL=debug); the library prints nothing
         * by default, and callers retrying while an agent starts stay
         * quiet */
        kvf_debug("cannot connect to the agent at %s: %s", path, client->error);
        kvf_client_disconnect(client);
        return status;
    }
    *client_p = client;
    return KVF_OK;
}

void kvf_client_disconnect(kvf_client_t *client)
{
    if (client == NULL) {
        return;
    }
    if (client->pool_base != NULL) {
        munmap(client->pool_base, client->pool_size);
    }
    if (client->fd >= 0) {
        close(client->fd); /* the agent releases this connection's grants */
    }
    free(client->rx);
    free(client->tx);
    free(client);
}

void *kvf_client_pool_base(const kvf_client_t *client)
{
    return client->pool_base;
}

uint64_t kvf_client_pool_size(const kvf_client_t *client)
{
    return client->pool_size;
}

/* Packs @p num keys into a freshly allocated buffer (caller frees). */
static uint8_t *kvf_client_pack_keys(kvf_client_t *client,
                                     const kvf_key_t *keys, uint32_t num)
{
    uint8_t *packed = malloc((size_t)num * KVF_KEY_WIRE_SIZE + 1);
    uint32_t i;

    if (packed == NULL) {
        kvf_client_fail(client, KVF_ERR_NO_MEMORY, "no memory for %u keys",
                        num);
        return NULL;
    }
    for (i = 0; i < num; i++) {
        kvf_key_pack(&keys[i], packed + (size_t)i * KVF_KEY_WIRE_SIZE);
    }
    return packed;
}

/* Copies the slots of an ENGINE_SLOTS reply, checking them against the
 * mapped pool: a reply naming bytes outside the pool is a protocol error,
 * never an address handed to the engine. */
static kvf_status_t kvf_client_take_slots(kvf_client_t *client,
                                          const Kvf__EngineSlots *reply,
                                          uint32_t num, kvf_slot_t *slots,
                                          bool *missing)
{
    uint32_t i;

    if ((reply->status != KVF_OK) && (reply->status != KVF_INPROGRESS)) {
        return kvf_client_fail(client, (kvf_status_t)reply->status, "agent: %s",
                               (reply->message != NULL) ? reply->message
                                                        : "request failed");
    }
    if ((reply->n_offsets != num) || (reply->n_lengths != num) ||
        ((missing != NULL) && (reply->missing.len != num))) {
        return kvf_client_fail(client, KVF_ERR_PROTO,
                               "agent answered %zu slots for %u chunks",
                               reply->n_offsets, num);
    }
    for (i = 0; i < num; i++) {
        uint64_t off = reply->offsets[i], len = reply->lengths[i];

        if ((off > client->pool_size) || (len > client->pool_size - off)) {
            return kvf_client_fail(client, KVF_ERR_PROTO,
                                   "agent slot %u lies outside the pool", i);
        }
    }
    for (i = 0; i < num; i++) {
        slots[i].offset = reply->offsets[i];
        slots[i].length = reply->lengths[i];
        if (missing != NULL) {
            missing[i] = (reply->missing.data[i] != 0);
        }
    }
    return KVF_OK;
}

/* One request and its reply, under one deadline @p timeout_ns away. The
 * caller releases @p frame_p on success. */
static kvf_status_t kvf_client_call_timeout(kvf_client_t *client, uint16_t type,
                                            const ProtobufCMessage *msg,
                                            uint16_t reply_type,
                                            uint64_t timeout_ns,
                                            kvf_frame_t *frame_p)
{
    uint64_t deadline = kvf_time_deadline_ns(timeout_ns);
    kvf_status_t status;

    status = kvf_client_send(client, type, msg, deadline);
    if (status != KVF_OK) {
        return status;
    }
    return kvf_client_recv(client, reply_type, NULL, deadline, frame_p);
}

/* As kvf_client_call_timeout, under the connection's default timeout. */
static kvf_status_t kvf_client_call(kvf_client_t *client, uint16_t type,
                                    const ProtobufCMessage *msg,
                                    uint16_t reply_type, kvf_frame_t *frame_p)
{
    return kvf_client_call_timeout(client, type, msg, reply_type,
                                   client->timeout_ns, frame_p);
}

/* The status of a STATUS reply, its message kept as the last error. */
static kvf_status_t kvf_client_take_status(kvf_client_t *client,
                                           kvf_frame_t *frame, const char *what)
{
    const Kvf__Status *st = (const Kvf__Status *)frame->msg;
    kvf_status_t status   = (kvf_status_t)st->status;

    if (status != KVF_OK) {
        kvf_client_fail(client, status, "%s: %s", what,
                        (st->message != NULL) ? st->message : "");
    }
    kvf_frame_release(frame, NULL);
    return status;
}

kvf_status_t kvf_client_alloc(kvf_client_t *client, uint64_t chunk_bytes,
                              uint32_t num, kvf_slot_t *slots)
{
    Kvf__EngineAlloc req;
    kvf_frame_t frame;
    kvf_status_t status;

    if ((client == NULL) || (slots == NULL) || (num == 0) ||
        (chunk_bytes == 0)) {
        return KVF_ERR_INVALID;
    }
    kvf__engine_alloc__init(&req);
    req.request_id  = client->next_request++;
    req.chunk_bytes = chunk_bytes;
    req.count       = num;
    status          = kvf_client_call(client, KVF_MSG_ENGINE_ALLOC, &req.base,
                                      KVF_MSG_ENGINE_SLOTS, &frame);
    if (status != KVF_OK) {
        return status;
    }
    status = kvf_client_take_slots(client, (const Kvf__EngineSlots *)frame.msg,
                                   num, slots, NULL);
    kvf_frame_release(&frame, NULL);
    return status;
}

kvf_status_t kvf_client_commit(kvf_client_t *client, const kvf_key_t *keys,
                               const kvf_slot_t *slots,
                               const uint64_t *checksums, uint32_t num)
{
    const Kvf__EngineCommitReply *reply;
    Kvf__EngineCommit req;
    kvf_frame_t frame;
    kvf_status_t status;
    uint64_t *offsets;
    uint8_t *packed;
    uint32_t i;

    if ((client == NULL) || (keys == NULL) || (slots == NULL) ||
        (checksums == NULL) || (num == 0)) {
        return KVF_ERR_INVALID;
    }
    packed  = kvf_client_pack_keys(client, keys, num);
    offsets = malloc(num * sizeof(*offsets));
    if ((packed == NULL) || (offsets == NULL)) {
        free(packed);
        free(offsets);
        return kvf_client_fail(client, KVF_ERR_NO_MEMORY,
                               "no memory for a commit of %u chunks", num);
    }
    for (i = 0; i < num; i++) {
        offsets[i] = slots[i].offset;
    }
    kvf__engine_commit__init(&req);
    req.request_id  = client->next_request++;
    req.keys.data   = packed;
    req.keys.len    = (size_t)num * KVF_KEY_WIRE_SIZE;
    req.n_offsets   = num;
    req.offsets     = offsets;
    req.n_checksums = num;
    req.checksums   = (uint64_t *)(uintptr_t)checksums;
    status          = kvf_client_call(client, KVF_MSG_ENGINE_COMMIT, &req.base,
                                      KVF_MSG_ENGINE_COMMIT_REPLY, &frame);
    free(packed);
    free(offsets);
    if (status != KVF_OK) {
        return status;
    }
    reply  = (const Kvf__EngineCommitReply *)frame.msg;
    status = (kvf_status_t)reply->status;
    if (status != KVF_OK) {
        kvf_client_fail(client, status, "commit: %s",
                        (reply->message != NULL) ? reply->message : "");
    }
    kvf_frame_release(&frame, NULL);
    return status;
}

kvf_status_t kvf_client_lookup(kvf_client_t *client, const kvf_key_t *keys,
                               uint32_t num, bool prefetch,
                               kvf_lookup_result_t *result_p)
{
    const Kvf__EngineLookupReply *reply;
    Kvf__EngineLookup req;
    kvf_frame_t frame;
    kvf_status_t status;
    uint8_t *packed;

    if ((client == NULL) || (keys == NULL) || (num == 0) ||
        (result_p == NULL)) {
        return KVF_ERR_INVALID;
    }
    packed = kvf_client_pack_keys(client, keys, num);
    if (packed == NULL) {
        return KVF_ERR_NO_MEMORY;
    }
    kvf__engine_lookup__init(&req);
    req.request_id = client->next_request++;
    req.keys.data  = packed;
    req.keys.len   = (size_t)num * KVF_KEY_WIRE_SIZE;
    req.prefetch   = prefetch;
    status         = kvf_client_call(client, KVF_MSG_ENGINE_LOOKUP, &req.base,
                                     KVF_MSG_ENGINE_LOOKUP_REPLY, &frame);
    free(packed);
    if (status != KVF_OK) {
        return status;
    }
    reply  = (const Kvf__EngineLookupReply *)frame.msg;
    status = (kvf_status_t)reply->status;
    if (status != KVF_OK) {
        kvf_client_fail(client, status, "lookup: %s",
                        (reply->message != NULL) ? reply->message : "");
    } else if ((reply->hit_chunks > num) ||
               (reply->local_chunks > reply->hit_chunks)) {
        status = kvf_client_fail(client, KVF_ERR_PROTO,
                                 "agent reported %u hits for %u keys",
                                 reply->hit_chunks, num);
    } else {
        result_p->hit_chunks   = reply->hit_chunks;
        result_p->local_chunks = reply->local_chunks;
        result_p->lease_id     = reply->lease_id;
    }
    kvf_frame_release(&frame, NULL);
    return status;
}

kvf_status_t kvf_client_retrieve(kvf_client_t *client, const kvf_key_t *keys,
                                 uint32_t num, kvf_slot_t *slots, bool *missing)
{
    Kvf__EngineRetrieve req;
    kvf_frame_t frame;
    kvf_status_t status;
    uint8_t *packed;

    if ((client == NULL) || (keys == NULL) || (num == 0) || (slots == NULL) ||
        (missing == NULL)) {
        return KVF_ERR_INVALID;
    }
    packed = kvf_client_pack_keys(client, keys, num);
    if (packed == NULL) {
        return KVF_ERR_NO_MEMORY;
    }
    kvf__engine_retrieve__init(&req);
    req.request_id = client->next_request++;
    req.keys.data  = packed;
    req.keys.len   = (size_t)num * KVF_KEY_WIRE_SIZE;
    status         = kvf_client_call(client, KVF_MSG_ENGINE_RETRIEVE, &req.base,
                                     KVF_MSG_ENGINE_SLOTS, &frame);
    free(packed);
    if (status != KVF_OK) {
        return status;
    }
    status = kvf_client_take_slots(client, (const Kvf__EngineSlots *)frame.msg,
                                   num, slots, missing);
    kvf_frame_release(&frame, NULL);
    return status;
}

kvf_status_t kvf_client_release(kvf_client_t *client, const kvf_slot_t *slots,
                                uint32_t num)
{
    Kvf__EngineRelease req;
    kvf_frame_t frame;
    kvf_status_t status;
    uint64_t *offsets;
    uint32_t i;

    if ((client == NULL) || (slots == NULL) || (num == 0)) {
        return KVF_ERR_INVALID;
    }
    offsets = malloc(num * sizeof(*offsets));
    if (offsets == NULL) {
        return kvf_client_fail(client, KVF_ERR_NO_MEMORY,
                               "no memory to release %u slots", num);
    }
    for (i = 0; i < num; i++) {
        offsets[i] = slots[i].offset;
    }
    kvf__engine_release__init(&req);
    req.request_id = client->next_request++;
    req.n_offsets  = num;
    req.offsets    = offsets;
    /* the agent acknowledges with a STATUS frame */
    status = kvf_client_call(client, KVF_MSG_ENGINE_RELEASE, &req.base,
                             KVF_MSG_STATUS, &frame);
    free(offsets);
    if (status == KVF_OK) {
        status = (kvf_status_t)((const Kvf__Status *)frame.msg)->status;
        kvf_frame_release(&frame, NULL);
    }
    return status;
}

kvf_status_t kvf_client_stats(kvf_client_t *client, kvf_client_stats_t *stats_p)
{
    const Kvf__EngineStatsReply *reply;
    Kvf__EngineStats req;
    kvf_frame_t frame;
    kvf_status_t status;

    if ((client == NULL) || (stats_p == NULL)) {
        return KVF_ERR_INVALID;
    }
    kvf__engine_stats__init(&req);
    req.request_id = client->next_request++;
    status         = kvf_client_call(client, KVF_MSG_ENGINE_STATS, &req.base,
                                     KVF_MSG_ENGINE_STATS_REPLY, &frame);
    if (status != KVF_OK) {
        return status;
    }
    reply                   = (const Kvf__EngineStatsReply *)frame.msg;
    stats_p->pool_capacity  = reply->pool_capacity;
    stats_p->pool_used      = reply->pool_used;
    stats_p->chunks         = reply->chunks;
    stats_p->local_hits     = reply->local_hits;
    stats_p->misses         = reply->misses;
    stats_p->fetched_chunks = reply->fetched_chunks;
    stats_p->evictions      = reply->evictions;
    stats_p->node_id        = reply->node_id;
    stats_p->registered     = reply->registered;
    kvf_frame_release(&frame, NULL);
    return KVF_OK;
}

kvf_status_t kvf_pd_push(kvf_client_t *client, uint64_t request_id,
                         const char *decoder, const kvf_slot_t *slots,
                         const uint64_t *checksums, uint32_t num, bool final)
{
    uint64_t *offsets, *lengths;
    Kvf__EnginePdPush req;
    kvf_frame_t frame;
    kvf_status_t status;
    char name[128];
    uint32_t i;

    if ((client == NULL) || (decoder == NULL) || (decoder[0] == '\0') ||
        (strlen(decoder) >= sizeof(name)) || (slots == NULL) ||
        (checksums == NULL) || (num == 0)) {
        return KVF_ERR_INVALID;
    }
    offsets = malloc(num * sizeof(*offsets));
    lengths = malloc(num * sizeof(*lengths));
    if ((offsets == NULL) || (lengths == NULL)) {
        free(offsets);
        free(lengths);
        return kvf_client_fail(client, KVF_ERR_NO_MEMORY,
                               "no memory for a push of %u chunks", num);
    }
    for (i = 0; i < num; i++) {
        offsets[i] = slots[i].offset;
        lengths[i] = slots[i].length;
    }
    snprintf(name, sizeof(name), "%s", decoder);
    kvf__engine_pd_push__init(&req);
    req.request_id  = client->next_request++;
    req.pd_request  = request_id;
    req.decoder     = name;
    req.n_offsets   = num;
    req.offsets     = offsets;
    req.n_lengths   = num;
    req.lengths     = lengths;
    req.n_checksums = num;
    req.checksums   = (uint64_t *)(uintptr_t)checksums;
    req.final       = final;
    /* the agent answers by its own push deadline; ours comes after it */
    status = kvf_client_call_timeout(
        client, KVF_MSG_ENGINE_PD_PUSH, &req.base, KVF_MSG_STATUS,
        client->pd_push_timeout_ns + client->timeout_ns, &frame);
    free(offsets);
    free(lengths);
    if (status != KVF_OK) {
        return status;
    }
    return kvf_client_take_status(client, &frame, "push");
}

kvf_status_t kvf_pd_wait(kvf_client_t *client, uint64_t request_id,
                         uint64_t timeout_ns, kvf_slot_t *slots, uint32_t max,
                         uint32_t *num_p)
{
    const Kvf__EngineSlots *reply;
    Kvf__EnginePdWait req;
    kvf_frame_t frame;
    kvf_status_t status;
    size_t i;

    if ((client == NULL) || (slots == NULL) || (num_p == NULL)) {
        return KVF_ERR_INVALID;
    }
    if (timeout_ns == 0) {
        timeout_ns = client->timeout_ns;
    }
    kvf__engine_pd_wait__init(&req);
    req.request_id = client->next_request++;
    req.pd_request = request_id;
    req.timeout_ms = (timeout_ns + 999999u) / 1000000u;
    /* the agent answers by the wait's deadline; ours comes after it */
    status = kvf_client_call_timeout(client, KVF_MSG_ENGINE_PD_WAIT, &req.base,
                                     KVF_MSG_ENGINE_SLOTS,
                                     timeout_ns + client->timeout_ns, &frame);
    if (status != KVF_OK) {
        return status;
    }
    reply = (const Kvf__EngineSlots *)frame.msg;
    if ((reply->status != KVF_OK) || (reply->n_lengths != reply->n_offsets)) {
        status = kvf_client_fail(
            client,
            (reply->status != KVF_OK) ? (kvf_status_t)reply->status
                                      : KVF_ERR_PROTO,
            "wait: %s",
            (reply->message != NULL) ? reply->message : "bad reply");
        goto out;
    }
    for (i = 0; i < reply->n_offsets; i++) {
        uint64_t off = reply->offsets[i], len = reply->lengths[i];

        if ((off > client->pool_size) || (len > client->pool_size - off)) {
            status = kvf_client_fail(client, KVF_ERR_PROTO,
                                     "agent slot %zu lies outside the pool", i);
            goto out;
        }
    }
    if (reply->n_offsets > max) {
        status = kvf_client_fail(client, KVF_ERR_TOO_BIG,
                                 "PD request %llu has %zu chunks; room for %u",
                                 (unsigned long long)request_id,
                                 reply->n_offsets, max);
        goto out;
    }
    for (i = 0; i < reply->n_offsets; i++) {
        slots[i].offset = reply->offsets[i];
        slots[i].length = reply->lengths[i];
    }
    *num_p = (uint32_t)reply->n_offsets;
    status = KVF_OK;

out:
    kvf_frame_release(&frame, NULL);
    return status;
}

kvf_status_t kvf_pd_release(kvf_client_t *client, uint64_t request_id)
{
    Kvf__EnginePdRelease req;
    kvf_frame_t frame;
    kvf_status_t status;

    if (client == NULL) {
        return KVF_ERR_INVALID;
    }
    kvf__engine_pd_release__init(&req);
    req.request_id = client->next_request++;
    req.pd_request = request_id;
    status = kvf_client_call(client, KVF_MSG_ENGINE_PD_RELEASE, &req.base,
                             KVF_MSG_STATUS, &frame);
    if (status != KVF_OK) {
        return status;
    }
    return kvf_client_take_status(client, &frame, "release");
}
