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
#include "proto/bconn.h"
#include "proto/frame.h"

#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define KVF_CLIENT_DEFAULT_TIMEOUT_NS (5ull * KVF_NSEC_PER_SEC)
#define KVF_CLIENT_DEFAULT_SOCKET     "/run/kvfabric/agent.sock"
#define KVF_CLIENT_MAX_FRAME          (16u << 20)
/* PD pushes started (kvf_pd_push_start) and not yet collected. */
#define KVF_CLIENT_PUSHES_MAX 1024u

/* reconnect backoff: bounded well under a second, so an engine's calls
 * succeed again soon after a restarted agent is up */
#define KVF_CLIENT_BACKOFF_MIN_NS (10ull * KVF_NSEC_PER_MSEC)
#define KVF_CLIENT_BACKOFF_MAX_NS (250ull * KVF_NSEC_PER_MSEC)

/* A push started without waiting: its reply not read yet, or its failure
 * not yet collected by kvf_pd_push_wait. */
typedef struct kvf_client_push {
    uint64_t id;         /* the ENGINE_PD_PUSH's request id */
    uint64_t pd_request; /* its PD request */
    kvf_status_t status; /* KVF_INPROGRESS until its reply */
    char message[256];
} kvf_client_push_t;

/* A PD request this client pushed part of, its final push not yet sent:
 * how many pushes it sent (EnginePdPush.piece numbers them end to end, so
 * that an agent that lost the earlier ones refuses the rest). */
typedef struct kvf_client_open {
    uint64_t pd_request;
    uint32_t pieces;
} kvf_client_open_t;

/* Open PD requests kept; past it the oldest is forgotten (its next push is
 * numbered 1 again, which an agent holding its earlier pushes refuses). */
#define KVF_CLIENT_OPENS_MAX 256u

struct kvf_client {
    kvf_bconn_t *conn; /* NULL: lost; the next call reconnects */
    kvf_client_push_t *pushes;
    uint32_t num_pushes;
    uint32_t pushes_cap;
    kvf_client_open_t opens[KVF_CLIENT_OPENS_MAX];
    uint32_t num_opens;
    uint64_t timeout_ns;
    uint64_t next_request;
    void *pool_base;
    uint64_t pool_size;
    uint64_t map_size; /* bytes mapped at pool_base (>= pool_size) */
    void *stale_base;  /* a grown pool's old address, still mapped */
    uint64_t stale_size;
    uint64_t max_chunk_bytes;
    uint64_t pd_offset; /* PD receive region in the mapping (decoders) */
    uint64_t pd_size;
    uint64_t pd_push_timeout_ns; /* the agent's deadline of one push */
    uint64_t retry_at_ns;        /* no reconnect attempt before this */
    uint64_t backoff_ns;         /* 0 after a success */
    uint64_t reconnects;         /* connections made after the first */
    kvf_auth_secret_t secret;    /* kept for reconnecting */
    char node_name[128];
    char path[108];
    char name[128];
    char peer[160]; /* "agent at PATH": every error names it */
    char lost[256]; /* why the connection was lost, while it is */
    char error[640];
};

/* why the last kvf_client_connect() of this thread failed: there is no
 * client to ask (kvf_client_last_error(NULL)) */
static _Thread_local char kvf_client_connect_error[640];

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
    return (client == NULL) ? kvf_client_connect_error : client->error;
}

uint64_t kvf_client_reconnects(const kvf_client_t *client)
{
    return client->reconnects;
}

/* Maps the pool read-only (the agent's fd is read-only and sealed: a
 * writable shared mapping of it fails) at @p at, and the engine's own
 * staging area read-write right after it. */
static kvf_status_t kvf_client_map_at(uint8_t *at, int pool_fd,
                                      uint64_t pool_size, int staging_fd,
                                      uint64_t staging_size)
{
    /* an agent older than staging areas: engines write into its pool */
    const int prot = (staging_size > 0) ? PROT_READ : PROT_READ | PROT_WRITE;

    if (mmap(at, pool_size, prot, MAP_SHARED | MAP_FIXED, pool_fd, 0) != at) {
        return KVF_ERR_IO;
    }
    if ((staging_size > 0) &&
        (mmap(at + pool_size, staging_size, PROT_READ | PROT_WRITE,
              MAP_SHARED | MAP_FIXED, staging_fd, 0) != at + pool_size)) {
        return KVF_ERR_IO;
    }
    return KVF_OK;
}

/* Maps the agent's pool and this engine's staging area after it, as one
 * range of @p size bytes. After a reconnect the new range goes at the old
 * address, so pointers the engine derived from kvf_client_pool_base() stay
 * valid (they now see the new pool): in place when it is not larger, else
 * grown in place when the addresses after it are free. Otherwise it goes
 * elsewhere, and the old range is kept mapped, read-only, onto the new
 * pool's first bytes (stale pointers read the same offsets, never fault)
 * until disconnect. */
static kvf_status_t kvf_client_map_pool(kvf_client_t *client, int pool_fd,
                                        uint64_t pool_size, int staging_fd,
                                        uint64_t staging_size)
{
    const int anon = MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE;
    uint64_t size  = pool_size + staging_size;
    uint8_t *old   = client->pool_base;
    uint8_t *base  = NULL;
    void *tail;

    if ((old != NULL) && (size > client->map_size)) {
        tail = mmap(old + client->map_size, size - client->map_size, PROT_NONE,
                    anon | MAP_FIXED_NOREPLACE, -1, 0);
        if (tail == old + client->map_size) {
            client->map_size = size; /* grown in place */
        } else if (tail != MAP_FAILED) {
            munmap(tail, size - client->map_size); /* an old kernel */
        }
    }
    if ((old != NULL) && (size <= client->map_size)) {
        base = old;
    } else {
        base = mmap(NULL, size, PROT_NONE, anon, -1, 0);
        if (base == MAP_FAILED) {
            base = NULL;
        } else if (old != NULL) {
            if (client->stale_base != NULL) {
                munmap(client->stale_base, client->stale_size);
            }
            client->stale_base = old;
            client->stale_size = client->map_size;
            if ((mmap(old, client->map_size, PROT_READ, anon | MAP_FIXED, -1,
                      0) != old) ||
                (mmap(old,
                      (client->map_size < pool_size) ? client->map_size
                                                     : pool_size,
                      PROT_READ, MAP_SHARED | MAP_FIXED, pool_fd, 0) != old)) {
                munmap(old, client->map_size);
                client->stale_base = NULL;
            }
        }
        if (base != NULL) {
            client->map_size = size;
        }
    }
    if ((base == NULL) ||
        (kvf_client_map_at(base, pool_fd, pool_size, staging_fd,
                           staging_size) != KVF_OK)) {
        return kvf_client_fail(client, KVF_ERR_IO,
                               "cannot map the pool of the %s: %s",
                               client->peer, strerror(errno));
    }
    client->pool_base = base;
    client->pool_size = size;
    return KVF_OK;
}

/* A reply to a push started without waiting (kvf_bconn_filter_t): its
 * outcome is kept for kvf_pd_push_wait; true when @p frame was one. */
static bool kvf_client_push_reply(void *arg, kvf_frame_t *frame)
{
    kvf_client_t *client = arg;
    const Kvf__Status *st;
    kvf_client_push_t *push;
    uint32_t i;

    if (frame->type != KVF_MSG_STATUS) {
        return false;
    }
    st = (const Kvf__Status *)frame->msg;
    for (i = 0; i < client->num_pushes; i++) {
        push = &client->pushes[i];
        if ((push->id != st->request_id) || (push->status != KVF_INPROGRESS)) {
            continue;
        }
        if (st->status == KVF_OK) {
            *push = client->pushes[--client->num_pushes]; /* done with */
        } else {
            push->status =
                (st->status < 0) ? (kvf_status_t)st->status : KVF_ERR_PROTO;
            snprintf(push->message, sizeof(push->message), "%s",
                     (st->message != NULL) ? st->message : "");
        }
        kvf_frame_release(frame, NULL);
        return true;
    }
    return false;
}

/* Connects, HELLO (+ AUTH), receives the pool and maps it. */
static kvf_status_t kvf_client_open(kvf_client_t *client, uint64_t deadline)
{
    const kvf_bconn_params_t cp = {
        .peer      = client->peer,
        .max_frame = KVF_CLIENT_MAX_FRAME,
    };
    const kvf_bconn_hello_params_t hp = {
        .version = KVF_PROTOCOL_VERSION,
        .kind    = KVF__PEER_KIND__PEER_ENGINE,
        .name    = client->name,
        .secret  = &client->secret,
    };
    const Kvf__PoolInfo *info;
    kvf_bconn_t *conn;
    kvf_status_t status;
    kvf_frame_t frame;
    uint64_t pool_size, staging_size;
    int fd, pool_fd = -1, staging_fd = -1;

    status = kvf_bconn_dial_unix(client->path, deadline, &fd, client->error,
                                 sizeof(client->error));
    if (status != KVF_OK) {
        return status;
    }
    status = kvf_bconn_create(fd, &cp, &conn); /* fd now belongs to conn */
    if (status != KVF_OK) {
        return kvf_client_fail(client, status, "no memory for a connection");
    }
    /* the pool's fd may arrive with the bytes of HELLO_REPLY already */
    status = kvf_bconn_hello(conn, &hp, deadline, &pool_fd);
    if (status == KVF_OK) {
        /* the staging area's fd comes with POOL_INFO (an old agent's
         * pool fd, when not with HELLO_REPLY) */
        status =
            kvf_bconn_expect(conn, KVF_MSG_POOL_INFO, deadline,
                             (pool_fd < 0) ? &pool_fd : &staging_fd, &frame);
    }
    if (status != KVF_OK) {
        kvf_client_fail(client, status, "%s", kvf_bconn_last_error(conn));
        goto err_destroy;
    }
    info                    = (const Kvf__PoolInfo *)frame.msg;
    pool_size               = info->pool_size;
    staging_size            = info->staging_size;
    client->max_chunk_bytes = info->max_chunk_bytes;
    client->pd_offset       = info->pd_offset;
    client->pd_size         = info->pd_size;
    client->pd_push_timeout_ns =
        info->pd_push_timeout_ms * (KVF_NSEC_PER_SEC / 1000u);
    snprintf(client->node_name, sizeof(client->node_name), "%s",
             (info->node_name != NULL) ? info->node_name : "");
    kvf_frame_release(&frame, NULL);
    if ((pool_fd < 0) || (pool_size == 0) || (pool_size % 4096 != 0) ||
        ((staging_size > 0) && (staging_fd < 0)) ||
        (staging_size > UINT64_MAX - pool_size)) {
        status = kvf_client_fail(client, KVF_ERR_PROTO,
                                 "%s sent no pool (or staging area) to map",
                                 client->peer);
        goto err_destroy;
    }
    status = kvf_client_map_pool(client, pool_fd, pool_size, staging_fd,
                                 staging_size);
    if (status != KVF_OK) {
        goto err_destroy;
    }
    close(pool_fd); /* the mapping keeps the memory alive */
    if (staging_fd >= 0) {
        close(staging_fd);
    }
    kvf_bconn_set_filter(conn, kvf_client_push_reply, client);
    client->conn = conn;
    return KVF_OK;

err_destroy:
    if (pool_fd >= 0) {
        close(pool_fd);
    }
    if (staging_fd >= 0) {
        close(staging_fd);
    }
    kvf_bconn_destroy(conn);
    return status;
}

/* The connection broke under a call: drop it (the agent releases what it
 * granted us) and fail the call; the next call reconnects. */
static kvf_status_t kvf_client_lose(kvf_client_t *client, kvf_status_t status)
{
    uint32_t i;

    snprintf(client->lost, sizeof(client->lost), "%.250s",
             kvf_bconn_last_error(client->conn));
    /* pushes whose replies went with the connection: the agent aborts
     * their requests at the decoder when an engine goes away */
    for (i = 0; i < client->num_pushes; i++) {
        if (client->pushes[i].status == KVF_INPROGRESS) {
            client->pushes[i].status = KVF_ERR_CLOSED;
            snprintf(client->pushes[i].message,
                     sizeof(client->pushes[i].message),
                     "connection to the agent lost before the push ended: "
                     "%.150s",
                     client->lost);
        }
    }
    kvf_bconn_destroy(client->conn);
    client->conn        = NULL;
    client->retry_at_ns = 0; /* the first attempt at once */
    client->backoff_ns  = 0;
    return kvf_client_fail(client, status,
                           "%s; the call failed, the next one reconnects",
                           client->lost);
}

/* A connection for the next call: reconnects after a loss, at most once per
 * backoff period (10 ms doubling to 250 ms). */
static kvf_status_t kvf_client_ensure(kvf_client_t *client)
{
    uint64_t now = kvf_time_now_ns();
    kvf_status_t status;

    if (client->conn != NULL) {
        return KVF_OK;
    }
    if (now < client->retry_at_ns) {
        return kvf_client_fail(
            client, KVF_ERR_CLOSED,
            "%s: not connected (%s); reconnecting in %" PRIu64 " ms",
            client->peer, client->lost,
            (uint64_t)((client->retry_at_ns - now) / KVF_NSEC_PER_MSEC));
    }
    status = kvf_client_open(client, kvf_time_deadline_ns(client->timeout_ns));
    if (status == KVF_OK) {
        client->reconnects++;
        client->backoff_ns = 0;
        kvf_debug("reconnected to the %s", client->peer);
        return KVF_OK;
    }
    client->backoff_ns = (client->backoff_ns == 0) ? KVF_CLIENT_BACKOFF_MIN_NS
                                                   : client->backoff_ns * 2;
    if (client->backoff_ns > KVF_CLIENT_BACKOFF_MAX_NS) {
        client->backoff_ns = KVF_CLIENT_BACKOFF_MAX_NS;
    }
    client->retry_at_ns = now + client->backoff_ns;
    snprintf(client->lost, sizeof(client->lost), "%.250s", client->error);
    return kvf_client_fail(client, KVF_ERR_CLOSED, "%s: cannot reconnect: %s",
                           client->peer, client->lost);
}

kvf_status_t kvf_client_connect(const kvf_client_params_t *params,
                                kvf_client_t **client_p)
{
    const char *path        = getenv("KVF_SOCKET");
    const char *name        = "engine";
    const char *secret_file = getenv("KVF_CLUSTER_SECRET_FILE");
    kvf_client_t *client;
    kvf_status_t status;

    if (client_p == NULL) {
        return KVF_ERR_INVALID;
    }
    client = calloc(1, sizeof(*client));
    if (client == NULL) {
        snprintf(kvf_client_connect_error, sizeof(kvf_client_connect_error),
                 "no memory for a client");
        return KVF_ERR_NO_MEMORY;
    }
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
    snprintf(client->name, sizeof(client->name), "%s", name);
    snprintf(client->peer, sizeof(client->peer), "agent at %s", path);
    if (strlen(path) >= sizeof(client->path)) {
        status = kvf_client_fail(client, KVF_ERR_INVALID,
                                 "socket path too long: %s", path);
        goto err_free;
    }
    snprintf(client->path, sizeof(client->path), "%s", path);
    status = kvf_auth_secret_load_opt(secret_file, &client->secret,
                                      client->error, sizeof(client->error));
    if (status != KVF_OK) {
        goto err_free;
    }
    status = kvf_client_open(client, kvf_time_deadline_ns(client->timeout_ns));
    if (status != KVF_OK) {
        goto err_free;
    }
    *client_p = client;
    return KVF_OK;

err_free:
    /* no client is returned to ask: kvf_client_last_error(NULL) says why,
     * and the log at debug level (the library prints nothing by default,
     * and callers retrying while an agent starts stay quiet) */
    snprintf(kvf_client_connect_error, sizeof(kvf_client_connect_error), "%s",
             client->error);
    kvf_debug("cannot connect to the agent at %s: %s", path, client->error);
    kvf_client_disconnect(client);
    return status;
}

void kvf_client_disconnect(kvf_client_t *client)
{
    if (client == NULL) {
        return;
    }
    if (client->pool_base != NULL) {
        munmap(client->pool_base, client->map_size);
    }
    if (client->stale_base != NULL) {
        munmap(client->stale_base, client->stale_size);
    }
    /* closing the socket makes the agent release this connection's grants */
    kvf_bconn_destroy(client->conn);
    kvf_auth_secret_cleanup(&client->secret);
    free(client->pushes);
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
                                          bool *missing, uint64_t *checksums)
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
        if ((checksums != NULL) && (reply->n_checksums == num)) {
            checksums[i] = reply->checksums[i];
        }
    }
    if ((checksums != NULL) && (reply->n_checksums != num)) {
        /* the slots are pinned all the same: the caller releases them */
        return kvf_client_fail(client, KVF_ERR_UNSUPPORTED,
                               "the %s sent no checksums (an older agent)",
                               client->peer);
    }
    return KVF_OK;
}

/* One request and its reply, under one deadline @p timeout_ns away. The
 * caller releases @p frame_p on success. A lost connection fails the call
 * with KVF_ERR_CLOSED; the next call reconnects. */
static kvf_status_t kvf_client_call_timeout(kvf_client_t *client, uint16_t type,
                                            const ProtobufCMessage *msg,
                                            uint16_t reply_type,
                                            uint64_t timeout_ns,
                                            kvf_frame_t *frame_p)
{
    uint64_t deadline;
    kvf_status_t status;

    status = kvf_client_ensure(client);
    if (status != KVF_OK) {
        return status;
    }
    deadline = kvf_time_deadline_ns(timeout_ns);
    status   = kvf_bconn_send(client->conn, type, msg, deadline);
    if (status == KVF_ERR_CLOSED) {
        /* the connection died while idle (the agent restarted): the old
         * agent cannot have served a request it did not wholly receive,
         * so reconnect and send it once more */
        kvf_client_lose(client, status);
        status = kvf_client_ensure(client);
        if (status != KVF_OK) {
            return status;
        }
        status = kvf_bconn_send(client->conn, type, msg, deadline);
    }
    if (status == KVF_OK) {
        status =
            kvf_bconn_expect(client->conn, reply_type, deadline, NULL, frame_p);
    }
    if (status == KVF_ERR_CLOSED) {
        return kvf_client_lose(client, status);
    }
    if (status != KVF_OK) {
        return kvf_client_fail(client, status, "%s",
                               kvf_bconn_last_error(client->conn));
    }
    return KVF_OK;
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
                                   num, slots, NULL, NULL);
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

/* RETRIEVE, with the chunks' checksums when @p checksums is not NULL. */
static kvf_status_t kvf_client_retrieve_sums(kvf_client_t *client,
                                             const kvf_key_t *keys,
                                             uint32_t num, kvf_slot_t *slots,
                                             bool *missing, uint64_t *checksums)
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
                                   num, slots, missing, checksums);
    kvf_frame_release(&frame, NULL);
    return status;
}

kvf_status_t kvf_client_retrieve(kvf_client_t *client, const kvf_key_t *keys,
                                 uint32_t num, kvf_slot_t *slots, bool *missing)
{
    return kvf_client_retrieve_sums(client, keys, num, slots, missing, NULL);
}

kvf_status_t kvf_client_retrieve_checksums(kvf_client_t *client,
                                           const kvf_key_t *keys, uint32_t num,
                                           kvf_slot_t *slots, bool *missing,
                                           uint64_t *checksums)
{
    if (checksums == NULL) {
        return KVF_ERR_INVALID;
    }
    return kvf_client_retrieve_sums(client, keys, num, slots, missing,
                                    checksums);
}

bool kvf_client_verify(const kvf_client_t *client, const kvf_slot_t *slot,
                       uint64_t checksum)
{
    if ((client == NULL) || (slot == NULL) ||
        (slot->offset > client->pool_size) ||
        (slot->length > client->pool_size - slot->offset)) {
        return false;
    }
    return kvf_chunk_checksum((const uint8_t *)client->pool_base + slot->offset,
                              slot->length) == checksum;
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

/* Pushes of @p pd_request started and not ended (@p failed_p: the first
 * one that failed, not collected yet; NULL when none). */
static uint32_t kvf_client_pushes_of(kvf_client_t *client, uint64_t pd_request,
                                     kvf_client_push_t **failed_p)
{
    uint32_t i, n = 0;

    *failed_p = NULL;
    for (i = 0; i < client->num_pushes; i++) {
        if (client->pushes[i].pd_request != pd_request) {
            continue;
        }
        if (client->pushes[i].status == KVF_INPROGRESS) {
            n++;
        } else if (*failed_p == NULL) {
            *failed_p = &client->pushes[i];
        }
    }
    return n;
}

/* The place of the next push of @p pd_request, 1, 2, ...; a final push
 * closes the request. */
static uint32_t kvf_client_open_next(kvf_client_t *client, uint64_t pd_request,
                                     bool final)
{
    kvf_client_open_t *o = NULL;
    uint32_t i, piece;

    for (i = 0; i < client->num_opens; i++) {
        if (client->opens[i].pd_request == pd_request) {
            o = &client->opens[i];
            break;
        }
    }
    if (o == NULL) {
        if (client->num_opens == KVF_CLIENT_OPENS_MAX) {
            memmove(&client->opens[0], &client->opens[1],
                    (KVF_CLIENT_OPENS_MAX - 1) * sizeof(client->opens[0]));
            client->num_opens--; /* the oldest */
        }
        o             = &client->opens[client->num_opens++];
        o->pd_request = pd_request;
        o->pieces     = 0;
    }
    piece = ++o->pieces;
    if (final) {
        *o = client->opens[--client->num_opens];
    }
    return piece;
}

/* @p pd_request failed: a later push of it starts it afresh. */
static void kvf_client_open_forget(kvf_client_t *client, uint64_t pd_request)
{
    uint32_t i;

    for (i = 0; i < client->num_opens; i++) {
        if (client->opens[i].pd_request == pd_request) {
            client->opens[i] = client->opens[--client->num_opens];
            return;
        }
    }
}

/* Forgets every ended push of @p pd_request: its failure was reported. */
static void kvf_client_pushes_collect(kvf_client_t *client, uint64_t pd_request)
{
    uint32_t i;

    for (i = 0; i < client->num_pushes;) {
        if ((client->pushes[i].pd_request == pd_request) &&
            (client->pushes[i].status != KVF_INPROGRESS)) {
            client->pushes[i] = client->pushes[--client->num_pushes];
            continue;
        }
        i++;
    }
}

/* Reads one reply of a push started earlier, within @p deadline. */
static kvf_status_t kvf_client_read_push(kvf_client_t *client,
                                         uint64_t deadline)
{
    kvf_frame_t frame;
    kvf_status_t status;

    status = kvf_bconn_recv(client->conn, deadline, NULL, &frame);
    if (status == KVF_ERR_CLOSED) {
        return kvf_client_lose(client, status);
    }
    if (status != KVF_OK) {
        return kvf_client_fail(client, status, "%s",
                               kvf_bconn_last_error(client->conn));
    }
    if (!kvf_client_push_reply(client, &frame)) {
        kvf_frame_release(&frame, NULL);
        kvf_client_fail(client, KVF_ERR_PROTO,
                        "%s sent a reply to no push in progress", client->peer);
        return kvf_client_lose(client, KVF_ERR_PROTO);
    }
    return KVF_OK;
}

kvf_status_t kvf_pd_push_start(kvf_client_t *client, uint64_t request_id,
                               const char *decoder, const kvf_slot_t *slots,
                               const uint64_t *checksums, uint32_t num,
                               bool final)
{
    uint64_t *offsets, *lengths, deadline;
    kvf_client_push_t *push, *failed;
    Kvf__EnginePdPush req;
    kvf_status_t status;
    char name[128];
    uint32_t i;

    if ((client == NULL) || (decoder == NULL) || (decoder[0] == '\0') ||
        (strlen(decoder) >= sizeof(name)) || (slots == NULL) ||
        (checksums == NULL) || (num == 0)) {
        return KVF_ERR_INVALID;
    }
    kvf_client_pushes_of(client, request_id, &failed);
    if (failed != NULL) {
        status = kvf_client_fail(client, failed->status,
                                 "an earlier push of PD request %" PRIu64
                                 " failed: %s",
                                 request_id, failed->message);
        kvf_client_pushes_collect(client, request_id);
        kvf_client_open_forget(client, request_id);
        return status;
    }
    status = kvf_client_ensure(client);
    if (status != KVF_OK) {
        return status;
    }
    deadline = kvf_time_deadline_ns(client->timeout_ns);
    while ((client->num_pushes >= KVF_CLIENT_PUSHES_MAX) &&
           (client->conn != NULL)) {
        /* backpressure: the oldest pushes end first */
        for (i = 0; i < client->num_pushes; i++) {
            if (client->pushes[i].status == KVF_INPROGRESS) {
                break;
            }
        }
        if (i == client->num_pushes) {
            return kvf_client_fail(client, KVF_ERR_BUSY,
                                   "%u pushes failed and were not collected "
                                   "(kvf_pd_push_wait)",
                                   client->num_pushes);
        }
        status = kvf_client_read_push(client, deadline);
        if (status != KVF_OK) {
            return status;
        }
    }
    status = kvf_client_ensure(client);
    if (status != KVF_OK) {
        return status;
    }
    if (client->num_pushes == client->pushes_cap) {
        uint32_t cap = (client->pushes_cap == 0) ? 16 : 2 * client->pushes_cap;

        push = realloc(client->pushes, cap * sizeof(*push));
        if (push == NULL) {
            return kvf_client_fail(client, KVF_ERR_NO_MEMORY,
                                   "no memory for a push");
        }
        client->pushes     = push;
        client->pushes_cap = cap;
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
    req.piece       = kvf_client_open_next(client, request_id, final);
    status = kvf_bconn_send(client->conn, KVF_MSG_ENGINE_PD_PUSH, &req.base,
                            deadline);
    free(offsets);
    free(lengths);
    if (status != KVF_OK) {
        /* the request failed with this call, as if kvf_pd_push_wait had
         * said so: a later push of it starts it afresh */
        kvf_client_open_forget(client, request_id);
    }
    if (status == KVF_ERR_CLOSED) {
        return kvf_client_lose(client, status);
    }
    if (status != KVF_OK) {
        return kvf_client_fail(client, status, "%s",
                               kvf_bconn_last_error(client->conn));
    }
    push             = &client->pushes[client->num_pushes++];
    push->id         = req.request_id;
    push->pd_request = request_id;
    push->status     = KVF_INPROGRESS;
    push->message[0] = '\0';
    return KVF_OK;
}

kvf_status_t kvf_pd_push_wait(kvf_client_t *client, uint64_t request_id,
                              uint64_t timeout_ns)
{
    kvf_client_push_t *failed;
    kvf_status_t status = KVF_OK;
    uint64_t deadline;

    if (client == NULL) {
        return KVF_ERR_INVALID;
    }
    /* the agent answers each push by its own deadline; ours comes after */
    deadline = kvf_time_deadline_ns(
        (timeout_ns > 0) ? timeout_ns
                         : client->pd_push_timeout_ns + client->timeout_ns);
    while ((kvf_client_pushes_of(client, request_id, &failed) > 0) &&
           (status == KVF_OK)) {
        status = (client->conn != NULL) ? kvf_client_read_push(client, deadline)
                                        : KVF_ERR_CLOSED;
    }
    if (status == KVF_ERR_TIMEOUT) {
        return status; /* still in progress: wait again */
    }
    kvf_client_pushes_of(client, request_id, &failed);
    if (failed != NULL) {
        status = kvf_client_fail(client, failed->status, "push: %s",
                                 failed->message);
    }
    kvf_client_pushes_collect(client, request_id);
    if (status != KVF_OK) {
        /* the request failed: a later push of it starts it afresh */
        kvf_client_open_forget(client, request_id);
    }
    return status;
}

kvf_status_t kvf_pd_push(kvf_client_t *client, uint64_t request_id,
                         const char *decoder, const kvf_slot_t *slots,
                         const uint64_t *checksums, uint32_t num, bool final)
{
    kvf_status_t status;

    status = kvf_pd_push_start(client, request_id, decoder, slots, checksums,
                               num, final);
    if (status != KVF_OK) {
        return status;
    }
    return kvf_pd_push_wait(client, request_id, 0);
}

/* kvf_pd_wait, and with @p checksums (may be NULL) what each chunk was
 * verified with. */
static kvf_status_t kvf_pd_wait_sums(kvf_client_t *client, uint64_t request_id,
                                     uint64_t timeout_ns, kvf_slot_t *slots,
                                     uint32_t max, uint32_t *num_p,
                                     uint64_t *checksums)
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
    if ((checksums != NULL) && (reply->n_checksums != reply->n_offsets)) {
        /* claimed all the same: the caller releases it */
        status = kvf_client_fail(client, KVF_ERR_UNSUPPORTED,
                                 "the %s sent no checksums (an older agent)",
                                 client->peer);
        goto out;
    }
    for (i = 0; i < reply->n_offsets; i++) {
        slots[i].offset = reply->offsets[i];
        slots[i].length = reply->lengths[i];
        if (checksums != NULL) {
            checksums[i] = reply->checksums[i];
        }
    }
    *num_p = (uint32_t)reply->n_offsets;
    status = KVF_OK;

out:
    kvf_frame_release(&frame, NULL);
    return status;
}

kvf_status_t kvf_pd_wait(kvf_client_t *client, uint64_t request_id,
                         uint64_t timeout_ns, kvf_slot_t *slots, uint32_t max,
                         uint32_t *num_p)
{
    return kvf_pd_wait_sums(client, request_id, timeout_ns, slots, max, num_p,
                            NULL);
}

kvf_status_t kvf_pd_wait_checksums(kvf_client_t *client, uint64_t request_id,
                                   uint64_t timeout_ns, kvf_slot_t *slots,
                                   uint64_t *checksums, uint32_t max,
                                   uint32_t *num_p)
{
    if (checksums == NULL) {
        return KVF_ERR_INVALID;
    }
    return kvf_pd_wait_sums(client, request_id, timeout_ns, slots, max, num_p,
                            checksums);
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
