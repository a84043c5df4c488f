/* SPDX-License-Identifier: Apache-2.0 */
/* Copyright (c) 2026 The kvfabric authors */
#include "agent/engine_server.h"

#include "common/listen.h"
#include "common/log.h"
#include "common/time.h"
#include "proto/evconn.h"
#include "proto/frame.h"
#include "proto/hello.h"

#include <event2/buffer.h>
#include <event2/event.h>
#include <event2/listener.h>

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/queue.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#define KVF_ENGINE_MAX_BATCH  65536u /* chunks per request */
#define KVF_ENGINE_MAX_LEASES 256u   /* prefetch leases per connection */

typedef struct kvf_engine_conn kvf_engine_conn_t;
typedef struct kvf_engine_wait kvf_engine_wait_t;
typedef struct kvf_engine_lease kvf_engine_lease_t;

/* "Lookup is a promise": the hit of a prefetching LOOKUP stays pinned here
 * (the local chunks at once, the remote ones as they land) until the
 * engine retrieves that prefix or the lease runs out. */
struct kvf_engine_lease {
    kvf_engine_lease_t *next;
    kvf_engine_conn_t *conn;
    kvf_store_owner_t *owner; /* the lease's pins */
    uint64_t id;
    uint64_t deadline_ns;
    uint32_t local; /* keys[0, local) were held here at lookup */
    uint32_t num;
    kvf_key_t keys[];
};

/* A LOOKUP or RETRIEVE waiting for the controller or for peers. */
struct kvf_engine_wait {
    kvf_engine_wait_t *next;
    kvf_engine_conn_t *conn;
    uint64_t request_id;
    uint16_t type; /* KVF_MSG_ENGINE_LOOKUP or KVF_MSG_ENGINE_RETRIEVE */
    bool prefetch;
    uint32_t local; /* LOOKUP: leading chunks held here */
    uint32_t num;
    kvf_key_t keys[]; /* the request's keys */
};

/* A PD push or wait whose reply comes from agent/pd.c. */
typedef struct kvf_engine_push {
    struct kvf_engine_push *next;
    kvf_engine_conn_t *conn;
    uint64_t request_id;
} kvf_engine_push_t;

struct kvf_engine_conn {
    kvf_engine_server_t *server;
    kvf_engine_push_t *pushes; /* PD requests waiting for agent/pd.c */
    kvf_evconn_t *ev;
    LIST_ENTRY(kvf_engine_conn) link; /* in server->conns */
    kvf_store_owner_t *owner;         /* this engine's grants and pins */
    kvf_engine_wait_t *waits; /* requests waiting for the controller/peers */
    kvf_engine_lease_t *leases;
    uint32_t num_leases;
    bool hello_done;
    kvf_auth_session_t auth; /* the pool is mapped only once it is done */
    uint64_t accepted_ns;
    char name[64];
};

struct kvf_engine_server {
    struct event_base *base;
    struct evconnlistener *listener;
    kvf_listen_guard_t listen_guard; /* accept() errors: back off */
    kvf_store_t *store;
    kvf_peer_t *peer;      /* may be NULL: local hits only */
    kvf_pd_t *pd;          /* may be NULL: no PD */
    kvf_ctl_client_t *ctl; /* may be NULL */
    uint64_t lookup_timeout_ns;
    uint64_t lease_ns;
    uint64_t next_lease;
    char path[108];
    char node_name[128];
    uint32_t max_frame;
    uint32_t max_connections;
    LIST_HEAD(, kvf_engine_conn) conns;
    kvf_evconn_group_t group; /* the engine connections' settings */
    kvf_engine_server_stats_t stats;
    const kvf_auth_secret_t *secret; /* borrowed; may be NULL */
};

static void kvf_engine_lease_destroy(kvf_engine_lease_t *lease)
{
    kvf_engine_server_t *server = lease->conn->server;
    kvf_engine_lease_t **pp;

    for (pp = &lease->conn->leases; *pp != NULL; pp = &(*pp)->next) {
        if (*pp == lease) {
            *pp = lease->next;
            break;
        }
    }
    lease->conn->num_leases--;
    server->stats.leases--;
    if (server->peer != NULL) {
        kvf_peer_cancel(server->peer, lease); /* the chunks still land */
    }
    kvf_store_owner_destroy(server->store, lease->owner);
    free(lease);
}

static void kvf_engine_push_unlink(kvf_engine_push_t *push)
{
    kvf_engine_push_t **pp;

    for (pp = &push->conn->pushes; *pp != NULL; pp = &(*pp)->next) {
        if (*pp == push) {
            *pp = push->next;
            return;
        }
    }
}

static kvf_engine_conn_t *kvf_engine_conn_create(kvf_engine_server_t *server,
                                                 evutil_socket_t fd);

static void kvf_engine_conn_close(kvf_engine_conn_t *conn)
{
    kvf_engine_server_t *server = conn->server;

    while (conn->leases != NULL) {
        kvf_engine_lease_destroy(conn->leases);
    }

    /* requests still waiting: nobody to answer any more */
    while (conn->waits != NULL) {
        kvf_engine_wait_t *wait = conn->waits;

        conn->waits = wait->next;
        if (server->peer != NULL) {
            kvf_peer_cancel(server->peer, wait);
        }
        if (server->ctl != NULL) {
            kvf_ctl_client_cancel(server->ctl, wait);
        }
        kvf_store_promote_cancel(server->store, wait);
        free(wait);
    }
    /* its PD waits and claims end, its pushes finish without it */
    if (server->pd != NULL) {
        kvf_pd_cancel(server->pd, conn);
    }
    /* everything the engine held goes back: a crashed engine leaks nothing
     * and the cache it filled stays */
    kvf_store_owner_destroy(server->store, conn->owner);
    while (conn->pushes != NULL) {
        kvf_engine_push_t *push = conn->pushes;

        conn->pushes = push->next;
        free(push); /* kvf_pd_cancel made sure no callback comes */
    }
    LIST_REMOVE(conn, link);
    kvf_evconn_destroy(conn->ev);
    server->stats.active--;
    if (kvf_auth_session_is_abandoned(&conn->auth)) {
        server->stats.auth_failures++; /* the engine refused our proof */
        kvf_warn("engine %s: closed during the auth challenge", conn->name);
    }
    kvf_auth_session_cleanup(&conn->auth);
    free(conn);
}

static void kvf_engine_conn_error(kvf_engine_conn_t *conn, const char *what)
{
    conn->server->stats.protocol_errors++;
    kvf_debug("engine %s: %s; closing its connection",
              (conn->name[0] != '\0') ? conn->name : "(before hello)", what);
    kvf_engine_conn_close(conn);
}

static kvf_status_t kvf_engine_conn_send(kvf_engine_conn_t *conn, uint16_t type,
                                         const ProtobufCMessage *msg)
{
    return kvf_evconn_send(conn->ev, type, msg);
}

static kvf_status_t kvf_engine_conn_status(kvf_engine_conn_t *conn,
                                           uint64_t request_id,
                                           kvf_status_t status,
                                           const char *message)
{
    char text[160];
    Kvf__Status st;

    snprintf(text, sizeof(text), "%s", message);
    kvf__status__init(&st);
    st.request_id = request_id;
    st.status     = status;
    st.message    = text;
    return kvf_engine_conn_send(conn, KVF_MSG_STATUS, &st.base);
}

/* Writes @p len bytes of frames straight to the socket, with @p fd as
 * SCM_RIGHTS when >= 0. Only while the connection's output is empty (the
 * handshake, before any other reply), so the order on the wire holds. */
static kvf_status_t kvf_engine_conn_sendmsg(kvf_engine_conn_t *conn,
                                            const uint8_t *buf, size_t len,
                                            int fd)
{
    char control[CMSG_SPACE(sizeof(int))];
    struct cmsghdr *cmsg;
    struct msghdr mh;
    struct iovec iov;
    ssize_t n;

    iov.iov_base = (void *)(uintptr_t)buf;
    iov.iov_len  = len;
    memset(&mh, 0, sizeof(mh));
    memset(control, 0, sizeof(control));
    mh.msg_iov    = &iov;
    mh.msg_iovlen = 1;
    if (fd >= 0) {
        mh.msg_control    = control;
        mh.msg_controllen = sizeof(control);
        cmsg              = CMSG_FIRSTHDR(&mh);
        cmsg->cmsg_level  = SOL_SOCKET;
        cmsg->cmsg_type   = SCM_RIGHTS;
        cmsg->cmsg_len    = CMSG_LEN(sizeof(int));
        memcpy(CMSG_DATA(cmsg), &fd, sizeof(fd));
    }
    n = sendmsg(kvf_evconn_fd(conn->ev), &mh, MSG_NOSIGNAL);
    if (n != (ssize_t)len) {
        kvf_warn("engine %s: cannot send the handshake: %s", conn->name,
                 (n < 0) ? strerror(errno) : "short write");
        return KVF_ERR_IO;
    }
    return KVF_OK;
}

/* Sends one handshake frame at once (a refusal must reach the engine
 * before the connection closes). */
static kvf_status_t kvf_engine_conn_send_now(kvf_engine_conn_t *conn,
                                             uint16_t type,
                                             const ProtobufCMessage *msg)
{
    uint8_t buf[1024];
    size_t len = 0;

    if (kvf_frame_pack(buf, sizeof(buf), type, KVF_FRAME_FLAG_REPLY, msg,
                       conn->server->max_frame, &len) != KVF_OK) {
        return KVF_ERR_TOO_BIG;
    }
    return kvf_engine_conn_sendmsg(conn, buf, len, -1);
}

/* Counts and refuses an engine that failed the handshake. */
static kvf_status_t kvf_engine_conn_auth_failed(kvf_engine_conn_t *conn,
                                                uint64_t request_id,
                                                const char *text)
{
    Kvf__Status st;
    char buf[256];

    conn->server->stats.auth_failures++;
    kvf_warn("engine %s: authentication refused: %s",
             (conn->name[0] != '\0') ? conn->name : "(before hello)", text);
    snprintf(buf, sizeof(buf), "%s", text);
    kvf__status__init(&st);
    st.request_id = request_id;
    st.status     = KVF_ERR_AUTH;
    st.message    = buf;
    kvf_engine_conn_send_now(conn, KVF_MSG_STATUS, &st.base);
    return KVF_ERR_AUTH;
}

/* The engine is admitted: @p first (HELLO_REPLY, or the STATUS answering
 * AUTH) and POOL_INFO go out in one sendmsg() carrying the pool's fd. */
static kvf_status_t kvf_engine_conn_admit(kvf_engine_conn_t *conn,
                                          uint16_t type,
                                          const ProtobufCMessage *first,
                                          uint64_t request_id)
{
    kvf_engine_server_t *server = conn->server;
    Kvf__PoolInfo info;
    uint8_t buf[1024];
    size_t len1 = 0, len2 = 0;
    char node[128];
    kvf_status_t status;

    snprintf(node, sizeof(node), "%s", server->node_name);
    kvf__pool_info__init(&info);
    info.request_id      = request_id;
    info.pool_size       = kvf_store_size(server->store);
    info.max_chunk_bytes = kvf_store_max_chunk(server->store);
    info.node_name       = node;
    if (server->pd != NULL) {
        uint64_t push_ns;

        kvf_pd_region_info(server->pd, &info.pd_offset, &info.pd_size,
                           &push_ns);
        info.pd_push_timeout_ms = push_ns / KVF_NSEC_PER_MSEC;
    }
    if ((kvf_frame_pack(buf, sizeof(buf), type, KVF_FRAME_FLAG_REPLY, first,
                        server->max_frame, &len1) != KVF_OK) ||
        (kvf_frame_pack(buf + len1, sizeof(buf) - len1, KVF_MSG_POOL_INFO,
                        KVF_FRAME_FLAG_REPLY, &info.base, server->max_frame,
                        &len2) != KVF_OK)) {
        return KVF_ERR_TOO_BIG;
    }
    status = kvf_engine_conn_sendmsg(conn, buf, len1 + len2,
                                     kvf_store_fd(server->store));
    if (status == KVF_OK) {
        kvf_info("engine %s connected", conn->name);
    }
    return status;
}

static kvf_status_t kvf_engine_conn_hello(kvf_engine_conn_t *conn,
                                          const Kvf__Hello *hello)
{
    kvf_engine_server_t *server = conn->server;
    uint8_t mac[KVF_AUTH_MAC_SIZE];
    char text[192], node[128];
    Kvf__HelloReply reply;

    snprintf(conn->name, sizeof(conn->name), "%s",
             (hello->name != NULL) ? hello->name : "");
    conn->hello_done = true;
    kvf__hello_reply__init(&reply);
    reply.request_id       = hello->request_id;
    reply.protocol_version = KVF_PROTOCOL_VERSION;
    snprintf(node, sizeof(node), "%s", server->node_name);
    reply.name = node;
    if ((hello->protocol_version != KVF_PROTOCOL_VERSION) ||
        (hello->kind != KVF__PEER_KIND__PEER_ENGINE)) {
        snprintf(text, sizeof(text),
                 "agent speaks protocol %u to engines; got version %u kind %d",
                 KVF_PROTOCOL_VERSION, hello->protocol_version,
                 (int)hello->kind);
        reply.status  = KVF_ERR_VERSION;
        reply.message = text;
        kvf_engine_conn_send_now(conn, KVF_MSG_HELLO_REPLY, &reply.base);
        return KVF_ERR_VERSION;
    }
    if (kvf_hello_server_auth(&conn->auth, hello, &reply, mac, text,
                              sizeof(text)) != KVF_OK) {
        conn->server->stats.auth_failures++;
        kvf_warn("engine %s: authentication refused: %s", conn->name, text);
        kvf_engine_conn_send_now(conn, KVF_MSG_HELLO_REPLY, &reply.base);
        return KVF_ERR_AUTH;
    }
    if (conn->auth.state == KVF_AUTH_STATE_CHALLENGED) {
        /* the pool is handed over only after AUTH */
        return kvf_engine_conn_send_now(conn, KVF_MSG_HELLO_REPLY, &reply.base);
    }
    return kvf_engine_conn_admit(conn, KVF_MSG_HELLO_REPLY, &reply.base,
                                 hello->request_id);
}

/* Frames before the engine proved the secret: AUTH only. */
static kvf_status_t kvf_engine_conn_auth(kvf_engine_conn_t *conn,
                                         const kvf_frame_t *frame)
{
    const Kvf__Auth *auth = (const Kvf__Auth *)frame->msg;
    char text[160], ok[] = "authenticated";
    Kvf__Status st;

    if (frame->type != KVF_MSG_AUTH) {
        kvf_auth_session_refuse(&conn->auth);
        return kvf_engine_conn_auth_failed(conn, 0, "a request before AUTH");
    }
    if (kvf_auth_server_finish(&conn->auth, auth->auth_mac.data,
                               auth->auth_mac.len, text,
                               sizeof(text)) != KVF_OK) {
        return kvf_engine_conn_auth_failed(conn, auth->request_id, text);
    }
    kvf__status__init(&st);
    st.request_id = auth->request_id;
    st.status     = KVF_OK;
    st.message    = ok;
    return kvf_engine_conn_admit(conn, KVF_MSG_STATUS, &st.base,
                                 auth->request_id);
}

static bool kvf_engine_keys_ok(const ProtobufCBinaryData *keys)
{
    return (keys->len > 0) && (keys->len % KVF_KEY_WIRE_SIZE == 0) &&
           (keys->len / KVF_KEY_WIRE_SIZE <= KVF_ENGINE_MAX_BATCH);
}

static kvf_status_t kvf_engine_conn_alloc(kvf_engine_conn_t *conn,
                                          const Kvf__EngineAlloc *req)
{
    kvf_engine_server_t *server = conn->server;
    uint64_t *offsets = NULL, *lengths = NULL;
    Kvf__EngineSlots reply;
    kvf_status_t status = KVF_OK;
    kvf_slot_t slot;
    char message[128] = "";
    uint32_t i, got = 0;

    kvf__engine_slots__init(&reply);
    reply.request_id = req->request_id;
    if ((req->count == 0) || (req->count > KVF_ENGINE_MAX_BATCH) ||
        (req->chunk_bytes == 0)) {
        return kvf_engine_conn_status(conn, req->request_id, KVF_ERR_INVALID,
                                      "alloc needs 1..65536 chunks of "
                                      "non-zero size");
    }
    offsets = malloc(req->count * sizeof(*offsets));
    lengths = malloc(req->count * sizeof(*lengths));
    if ((offsets == NULL) || (lengths == NULL)) {
        status = KVF_ERR_NO_MEMORY;
        snprintf(message, sizeof(message), "agent out of memory");
    }
    for (i = 0; (status == KVF_OK) && (i < req->count); i++) {
        status = kvf_store_alloc(server->store, conn->owner, req->chunk_bytes,
                                 &slot);
        if (status == KVF_OK) {
            offsets[i] = slot.offset;
            lengths[i] = slot.length;
            got++;
        } else {
            snprintf(message, sizeof(message),
                     "could not grant chunk %u of %u (%llu bytes): %s", i,
                     req->count, (unsigned long long)req->chunk_bytes,
                     kvf_strerror(status));
        }
    }
    if (status != KVF_OK) {
        /* all or nothing: give back what was granted */
        for (i = 0; i < got; i++) {
            kvf_store_release(server->store, conn->owner, offsets[i]);
        }
        reply.status  = status;
        reply.message = message;
    } else {
        reply.n_offsets = req->count;
        reply.offsets   = offsets;
        reply.n_lengths = req->count;
        reply.lengths   = lengths;
    }
    status = kvf_engine_conn_send(conn, KVF_MSG_ENGINE_SLOTS, &reply.base);
    free(offsets);
    free(lengths);
    return status;
}

static kvf_status_t kvf_engine_conn_commit(kvf_engine_conn_t *conn,
                                           const Kvf__EngineCommit *req)
{
    kvf_engine_server_t *server = conn->server;
    Kvf__EngineCommitReply reply;
    kvf_status_t status, first = KVF_OK;
    int32_t *results;
    size_t n, i;
    kvf_key_t key;

    if (!kvf_engine_keys_ok(&req->keys) ||
        (req->n_offsets != req->keys.len / KVF_KEY_WIRE_SIZE) ||
        (req->n_checksums != req->n_offsets)) {
        return kvf_engine_conn_status(conn, req->request_id, KVF_ERR_INVALID,
                                      "commit needs one offset and one "
                                      "checksum per 24-byte key");
    }
    n       = req->n_offsets;
    results = malloc(n * sizeof(*results));
    if (results == NULL) {
        return kvf_engine_conn_status(conn, req->request_id, KVF_ERR_NO_MEMORY,
                                      "out of memory");
    }
    for (i = 0; i < n; i++) {
        kvf_key_unpack(req->keys.data + i * KVF_KEY_WIRE_SIZE, &key);
        status     = kvf_store_commit(server->store, conn->owner, &key,
                                      req->offsets[i], req->checksums[i]);
        results[i] = status;
        if ((status != KVF_OK) && (status != KVF_ERR_EXISTS) &&
            (first == KVF_OK)) {
            first = status;
        }
    }
    kvf__engine_commit_reply__init(&reply);
    reply.request_id = req->request_id;
    reply.status     = first;
    reply.message =
        (char *)(uintptr_t)((first == KVF_OK) ? "" : kvf_strerror(first));
    reply.n_results = n;
    reply.results   = results;
    status =
        kvf_engine_conn_send(conn, KVF_MSG_ENGINE_COMMIT_REPLY, &reply.base);
    free(results);
    return status;
}

static kvf_engine_wait_t *kvf_engine_wait_create(kvf_engine_conn_t *conn,
                                                 uint16_t type,
                                                 uint64_t request_id,
                                                 const ProtobufCBinaryData *k)
{
    uint32_t n = (uint32_t)(k->len / KVF_KEY_WIRE_SIZE), i;
    kvf_engine_wait_t *wait;

    wait = calloc(1, sizeof(*wait) + (size_t)n * sizeof(kvf_key_t));
    if (wait == NULL) {
        return NULL;
    }
    wait->conn       = conn;
    wait->type       = type;
    wait->request_id = request_id;
    wait->num        = n;
    for (i = 0; i < n; i++) {
        kvf_key_unpack(k->data + (size_t)i * KVF_KEY_WIRE_SIZE, &wait->keys[i]);
    }
    return wait;
}

static void kvf_engine_wait_link(kvf_engine_wait_t *wait)
{
    wait->next        = wait->conn->waits;
    wait->conn->waits = wait;
}

static void kvf_engine_wait_unlink(kvf_engine_wait_t *wait)
{
    kvf_engine_wait_t **pp;

    for (pp = &wait->conn->waits; *pp != NULL; pp = &(*pp)->next) {
        if (*pp == wait) {
            *pp = wait->next;
            return;
        }
    }
}

/* The remote part of a lease's hit landed (or not): pin what came. */
static void kvf_engine_on_lease_fetched(void *arg, uint32_t fetched,
                                        uint32_t missed)
{
    kvf_engine_lease_t *lease   = arg;
    kvf_engine_server_t *server = lease->conn->server;
    kvf_slot_t slot;
    uint32_t i;

    for (i = lease->local; i < lease->num; i++) {
        kvf_store_pin(server->store, lease->owner, &lease->keys[i], &slot);
    }
}

/* Starts a lease on keys[0, hit) of a prefetching lookup: pins the local
 * ones, fetches the rest. Returns its id, 0 when none could be made (the
 * prefetch still runs, unpinned). */
static uint64_t kvf_engine_lease_start(kvf_engine_conn_t *conn,
                                       const kvf_key_t *keys, uint32_t local,
                                       uint32_t hit)
{
    kvf_engine_server_t *server = conn->server;
    kvf_engine_lease_t *lease   = NULL;
    kvf_slot_t slot;
    uint32_t i;

    if (conn->num_leases < KVF_ENGINE_MAX_LEASES) {
        lease = calloc(1, sizeof(*lease) + (size_t)hit * sizeof(kvf_key_t));
    }
    if ((lease != NULL) &&
        (kvf_store_owner_create(server->store, &lease->owner) != KVF_OK)) {
        free(lease);
        lease = NULL;
    }
    if (lease == NULL) {
        if ((hit > local) && (server->peer != NULL)) {
            kvf_peer_fetch(server->peer, keys + local, hit - local, NULL, NULL);
        }
        return 0;
    }
    lease->conn        = conn;
    lease->id          = ++server->next_lease;
    lease->deadline_ns = kvf_time_now_ns() + server->lease_ns;
    lease->local       = local;
    lease->num         = hit;
    memcpy(lease->keys, keys, (size_t)hit * sizeof(kvf_key_t));
    lease->next  = conn->leases;
    conn->leases = lease;
    conn->num_leases++;
    server->stats.leases++;
    for (i = 0; i < local; i++) {
        kvf_store_pin(server->store, lease->owner, &keys[i], &slot);
    }
    if ((hit > local) && (server->peer != NULL)) {
        kvf_peer_fetch(server->peer, keys + local, hit - local,
                       kvf_engine_on_lease_fetched, lease);
    }
    return lease->id;
}

/* A RETRIEVE of a prefix ends the leases of lookups of that prefix: its
 * own pins hold the chunks now. */
static void kvf_engine_leases_use(kvf_engine_conn_t *conn,
                                  const kvf_key_t *keys, uint32_t n)
{
    kvf_engine_lease_t *lease = conn->leases, *next;

    for (; lease != NULL; lease = next) {
        next = lease->next;
        if ((n > 0) && kvf_key_equal(&lease->keys[0], &keys[0])) {
            conn->server->stats.leases_used++;
            kvf_engine_lease_destroy(lease);
        }
    }
}

uint64_t kvf_engine_server_expire_leases(kvf_engine_server_t *server,
                                         uint64_t now_ns)
{
    kvf_engine_lease_t *lease, *next;
    kvf_engine_conn_t *conn;
    uint64_t n = 0;

    for (conn = LIST_FIRST(&server->conns); conn != NULL;
         conn = LIST_NEXT(conn, link)) {
        for (lease = conn->leases; lease != NULL; lease = next) {
            next = lease->next;
            if (lease->deadline_ns <= now_ns) {
                kvf_debug("engine %s: prefetch lease %llu of %u chunks "
                          "expired unused",
                          conn->name, (unsigned long long)lease->id,
                          lease->num);
                kvf_engine_lease_destroy(lease);
                n++;
            }
        }
    }
    server->stats.lease_expiries += n;
    return n;
}

static kvf_status_t kvf_engine_lookup_reply(kvf_engine_conn_t *conn,
                                            uint64_t request_id, uint32_t num,
                                            uint32_t local, uint32_t hit,
                                            uint64_t lease_id)
{
    kvf_engine_server_t *server = conn->server;
    Kvf__EngineLookupReply reply;

    kvf__engine_lookup_reply__init(&reply);
    reply.request_id   = request_id;
    reply.local_chunks = local;
    reply.hit_chunks   = (hit > local) ? hit : local;
    reply.lease_id     = lease_id;
    server->stats.lookups++;
    server->stats.lookup_keys += num;
    server->stats.local_hit_keys += local;
    server->stats.remote_hit_keys += reply.hit_chunks - local;
    return kvf_engine_conn_send(conn, KVF_MSG_ENGINE_LOOKUP_REPLY, &reply.base);
}

static void kvf_engine_on_remote_lookup(void *arg, kvf_status_t status,
                                        uint32_t hit_chunks,
                                        const uint32_t *holders, uint32_t num)
{
    kvf_engine_wait_t *wait = arg;
    kvf_engine_conn_t *conn = wait->conn;
    uint32_t hit            = (status == KVF_OK) ? hit_chunks : 0;
    uint64_t lease_id       = 0;

    kvf_engine_wait_unlink(wait);
    kvf_debug("engine %s: lookup of %u keys: %u local, %u held in the "
              "cluster (%s)",
              conn->name, wait->num, wait->local, hit, kvf_strerror(status));
    /* "lookup is a promise": with prefetch the remote part of the hit
     * starts moving into the pool now; retrieve finds it local or waits */
    if (hit < wait->local) {
        hit = wait->local;
    }
    if (wait->prefetch && (hit > 0)) {
        lease_id = kvf_engine_lease_start(conn, wait->keys, wait->local, hit);
    }
    if (kvf_engine_lookup_reply(conn, wait->request_id, wait->num, wait->local,
                                hit, lease_id) != KVF_OK) {
        free(wait);
        kvf_engine_conn_error(conn, "cannot queue a reply");
        return;
    }
    free(wait);
}

static kvf_status_t kvf_engine_conn_lookup(kvf_engine_conn_t *conn,
                                           const Kvf__EngineLookup *req)
{
    kvf_engine_server_t *server = conn->server;
    kvf_engine_wait_t *wait;
    uint32_t local;

    if (!kvf_engine_keys_ok(&req->keys)) {
        return kvf_engine_conn_status(conn, req->request_id, KVF_ERR_INVALID,
                                      "lookup needs 1..65536 24-byte keys");
    }
    wait = kvf_engine_wait_create(conn, KVF_MSG_ENGINE_LOOKUP, req->request_id,
                                  &req->keys);
    if (wait == NULL) {
        return kvf_engine_conn_status(conn, req->request_id, KVF_ERR_NO_MEMORY,
                                      "out of memory");
    }
    /* chunks on the local disk are local hits; a prefetching lookup
     * starts reading them back at once */
    local = kvf_store_tier_prefix(server->store, wait->keys, wait->num);
    if (req->prefetch && (local > 0)) {
        kvf_store_promote(server->store, wait->keys, local, NULL, NULL);
    }
    if ((local == wait->num) || (server->ctl == NULL) ||
        !kvf_ctl_client_is_registered(server->ctl)) {
        uint64_t lease_id = 0;

        if (req->prefetch && (local > 0)) {
            lease_id = kvf_engine_lease_start(conn, wait->keys, local, local);
        }
        free(wait);
        return kvf_engine_lookup_reply(
            conn, req->request_id,
            (uint32_t)(req->keys.len / KVF_KEY_WIRE_SIZE), local, local,
            lease_id);
    }
    /* the rest of the prefix may be held elsewhere: ask the controller */
    wait->local    = local;
    wait->prefetch = req->prefetch;
    kvf_engine_wait_link(wait);
    kvf_ctl_client_lookup(server->ctl, wait->keys, wait->num, false,
                          server->lookup_timeout_ns,
                          kvf_engine_on_remote_lookup, wait);
    return KVF_OK;
}

/* Pins every key held here and answers RETRIEVE; the rest are missing. */
static kvf_status_t kvf_engine_retrieve_reply(kvf_engine_conn_t *conn,
                                              uint64_t request_id,
                                              const kvf_key_t *keys, uint32_t n)
{
    kvf_engine_server_t *server = conn->server;
    uint64_t *offsets, *lengths;
    Kvf__EngineSlots reply;
    kvf_status_t status;
    uint8_t *missing;
    kvf_slot_t slot;
    uint32_t i;

    offsets = calloc(n, sizeof(*offsets));
    lengths = calloc(n, sizeof(*lengths));
    missing = calloc(n, 1);
    if ((offsets == NULL) || (lengths == NULL) || (missing == NULL)) {
        free(offsets);
        free(lengths);
        free(missing);
        return kvf_engine_conn_status(conn, request_id, KVF_ERR_NO_MEMORY,
                                      "out of memory");
    }
    for (i = 0; i < n; i++) {
        if (kvf_store_pin_verified(server->store, conn->owner, &keys[i],
                                   &slot) == KVF_OK) {
            offsets[i] = slot.offset;
            lengths[i] = slot.length;
        } else {
            missing[i] = 1; /* the engine recomputes exactly this chunk */
        }
    }
    kvf__engine_slots__init(&reply);
    reply.request_id   = request_id;
    reply.n_offsets    = n;
    reply.offsets      = offsets;
    reply.n_lengths    = n;
    reply.lengths      = lengths;
    reply.missing.data = missing;
    reply.missing.len  = n;
    status = kvf_engine_conn_send(conn, KVF_MSG_ENGINE_SLOTS, &reply.base);
    kvf_engine_leases_use(conn, keys, n);
    free(offsets);
    free(lengths);
    free(missing);
    return status;
}

static void kvf_engine_on_fetched(void *arg, uint32_t fetched, uint32_t missed)
{
    kvf_engine_wait_t *wait = arg;
    kvf_engine_conn_t *conn = wait->conn;

    kvf_engine_wait_unlink(wait);
    conn->server->stats.fetched_keys += fetched;
    if (kvf_engine_retrieve_reply(conn, wait->request_id, wait->keys,
                                  wait->num) != KVF_OK) {
        free(wait);
        kvf_engine_conn_error(conn, "cannot queue a reply");
        return;
    }
    free(wait);
}

/* Fetches from peers what is still absent, then answers (or the fetch's
 * callback does). Frees @p wait unless it is linked for the fetch. */
static kvf_status_t kvf_engine_retrieve_fetch(kvf_engine_conn_t *conn,
                                              kvf_engine_wait_t *wait)
{
    kvf_engine_server_t *server = conn->server;
    kvf_key_t *absent;
    uint32_t i, m = 0;
    kvf_status_t status;

    absent = malloc(((size_t)wait->num + 1) * sizeof(*absent));
    if (absent == NULL) {
        status = kvf_engine_conn_status(conn, wait->request_id,
                                        KVF_ERR_NO_MEMORY, "out of memory");
        free(wait);
        return status;
    }
    for (i = 0; i < wait->num; i++) {
        if (kvf_store_local_prefix(server->store, &wait->keys[i], 1) == 0) {
            absent[m++] = wait->keys[i];
        }
    }
    status = KVF_ERR_STATE;
    if ((m > 0) && (server->peer != NULL)) {
        /* fetch what others hold into our pool first; the reply waits */
        status = kvf_peer_fetch(server->peer, absent, m, kvf_engine_on_fetched,
                                wait);
    }
    free(absent);
    if (status == KVF_OK) {
        kvf_engine_wait_link(wait);
        return KVF_OK;
    }
    status = kvf_engine_retrieve_reply(conn, wait->request_id, wait->keys,
                                       wait->num);
    free(wait);
    return status;
}

/* The chunks of a RETRIEVE that were on disk are in the pool (or not). */
static void kvf_engine_on_promoted(void *arg, uint32_t promoted,
                                   uint32_t failed)
{
    kvf_engine_wait_t *wait = arg;
    kvf_engine_conn_t *conn = wait->conn;

    kvf_engine_wait_unlink(wait);
    if (kvf_engine_retrieve_fetch(conn, wait) != KVF_OK) {
        kvf_engine_conn_error(conn, "cannot queue a reply");
    }
}

static kvf_status_t kvf_engine_conn_retrieve(kvf_engine_conn_t *conn,
                                             const Kvf__EngineRetrieve *req)
{
    kvf_engine_server_t *server = conn->server;
    kvf_engine_wait_t *wait;

    if (!kvf_engine_keys_ok(&req->keys)) {
        return kvf_engine_conn_status(conn, req->request_id, KVF_ERR_INVALID,
                                      "retrieve needs 1..65536 24-byte keys");
    }
    wait = kvf_engine_wait_create(conn, KVF_MSG_ENGINE_RETRIEVE,
                                  req->request_id, &req->keys);
    if (wait == NULL) {
        return kvf_engine_conn_status(conn, req->request_id, KVF_ERR_NO_MEMORY,
                                      "out of memory");
    }
    /* chunks on the local disk come back into the pool first */
    if (kvf_store_promote(server->store, wait->keys, wait->num,
                          kvf_engine_on_promoted, wait) == KVF_INPROGRESS) {
        kvf_engine_wait_link(wait);
        return KVF_OK;
    }
    return kvf_engine_retrieve_fetch(conn, wait);
}

static kvf_status_t kvf_engine_conn_release(kvf_engine_conn_t *conn,
                                            const Kvf__EngineRelease *req)
{
    kvf_status_t status, first = KVF_OK;
    size_t i;

    if ((req->n_offsets == 0) || (req->n_offsets > KVF_ENGINE_MAX_BATCH)) {
        return kvf_engine_conn_status(conn, req->request_id, KVF_ERR_INVALID,
                                      "release needs 1..65536 offsets");
    }
    for (i = 0; i < req->n_offsets; i++) {
        status = kvf_store_release(conn->server->store, conn->owner,
                                   req->offsets[i]);
        if ((status != KVF_OK) && (first == KVF_OK)) {
            first = status;
        }
    }
    return kvf_engine_conn_status(conn, req->request_id, first,
                                  (first == KVF_OK)
                                      ? ""
                                      : "an offset is not held by this "
                                        "connection");
}

static kvf_status_t kvf_engine_conn_stats(kvf_engine_conn_t *conn,
                                          const Kvf__EngineStats *req)
{
    kvf_engine_server_t *server = conn->server;
    Kvf__EngineStatsReply reply;
    kvf_peer_stats_t ps;
    kvf_store_stats_t st;

    kvf_store_get_stats(server->store, &st);
    kvf__engine_stats_reply__init(&reply);
    reply.request_id    = req->request_id;
    reply.pool_capacity = st.pool.capacity;
    reply.pool_used     = st.pool.used;
    reply.chunks        = st.pool.entries;
    reply.local_hits    = st.hits;
    reply.misses        = st.misses;
    reply.evictions     = st.pool.evictions;
    if (server->peer != NULL) {
        kvf_peer_get_stats(server->peer, &ps);
        reply.fetched_chunks = ps.chunks_fetched;
    }
    if (server->ctl != NULL) {
        reply.registered = kvf_ctl_client_is_registered(server->ctl);
        reply.node_id    = kvf_ctl_client_node_id(server->ctl);
    }
    return kvf_engine_conn_send(conn, KVF_MSG_ENGINE_STATS_REPLY, &reply.base);
}

static void kvf_engine_on_pd_pushed(void *arg, kvf_status_t status,
                                    const char *message)
{
    kvf_engine_push_t *push = arg;
    kvf_engine_conn_t *conn = push->conn;

    kvf_engine_push_unlink(push);
    if (kvf_engine_conn_status(conn, push->request_id, status, message) !=
        KVF_OK) {
        free(push);
        kvf_engine_conn_error(conn, "cannot queue a reply");
        return;
    }
    free(push);
}

static kvf_status_t kvf_engine_conn_pd_push(kvf_engine_conn_t *conn,
                                            const Kvf__EnginePdPush *req)
{
    kvf_engine_server_t *server = conn->server;
    kvf_engine_push_t *push;
    kvf_status_t status;

    if (server->pd == NULL) {
        return kvf_engine_conn_status(conn, req->request_id,
                                      KVF_ERR_UNSUPPORTED,
                                      "this agent has no PD service");
    }
    if ((req->n_offsets == 0) || (req->n_offsets > KVF_ENGINE_MAX_BATCH) ||
        (req->n_lengths != req->n_offsets) ||
        (req->n_checksums != req->n_offsets) || (req->decoder == NULL) ||
        (req->decoder[0] == '\0')) {
        return kvf_engine_conn_status(conn, req->request_id, KVF_ERR_INVALID,
                                      "push needs a decoder name and one "
                                      "offset, length and checksum per chunk "
                                      "(1..65536)");
    }
    push = calloc(1, sizeof(*push));
    if (push == NULL) {
        return kvf_engine_conn_status(conn, req->request_id, KVF_ERR_NO_MEMORY,
                                      "out of memory");
    }
    push->conn       = conn;
    push->request_id = req->request_id;
    status = kvf_pd_push_submit(server->pd, conn, conn->owner, req->pd_request,
                                req->decoder, req->offsets, req->lengths,
                                req->checksums, (uint32_t)req->n_offsets,
                                req->final, kvf_engine_on_pd_pushed, push);
    if (status != KVF_OK) {
        free(push);
        return kvf_engine_conn_status(
            conn, req->request_id, status,
            (status == KVF_ERR_RANGE)
                ? "a pushed slot is not one of this connection's grants or "
                  "pins, or its length exceeds it"
                : kvf_strerror(status));
    }
    push->next   = conn->pushes;
    conn->pushes = push;
    return KVF_OK;
}

static void kvf_engine_on_pd_waited(void *arg, kvf_status_t status,
                                    const char *message,
                                    const kvf_slot_t *slots, uint32_t num)
{
    kvf_engine_push_t *wait = arg;
    kvf_engine_conn_t *conn = wait->conn;
    uint64_t *offsets = NULL, *lengths = NULL;
    Kvf__EngineSlots reply;
    uint32_t i;

    kvf_engine_push_unlink(wait);
    if (status == KVF_OK) {
        offsets = malloc(((size_t)num + 1) * sizeof(*offsets));
        lengths = malloc(((size_t)num + 1) * sizeof(*lengths));
        if ((offsets == NULL) || (lengths == NULL)) {
            status  = KVF_ERR_NO_MEMORY;
            message = "out of memory";
        }
    }
    if (status != KVF_OK) {
        status =
            kvf_engine_conn_status(conn, wait->request_id, status, message);
    } else {
        for (i = 0; i < num; i++) {
            offsets[i] = slots[i].offset;
            lengths[i] = slots[i].length;
        }
        kvf__engine_slots__init(&reply);
        reply.request_id = wait->request_id;
        reply.n_offsets  = num;
        reply.offsets    = offsets;
        reply.n_lengths  = num;
        reply.lengths    = lengths;
        status = kvf_engine_conn_send(conn, KVF_MSG_ENGINE_SLOTS, &reply.base);
    }
    free(offsets);
    free(lengths);
    free(wait);
    if (status != KVF_OK) {
        kvf_engine_conn_error(conn, "cannot queue a reply");
    }
}

static kvf_status_t kvf_engine_conn_pd_wait(kvf_engine_conn_t *conn,
                                            const Kvf__EnginePdWait *req)
{
    kvf_engine_server_t *server = conn->server;
    kvf_engine_push_t *wait;

    if (server->pd == NULL) {
        return kvf_engine_conn_status(conn, req->request_id,
                                      KVF_ERR_UNSUPPORTED,
                                      "this agent has no PD service");
    }
    wait = calloc(1, sizeof(*wait));
    if (wait == NULL) {
        return kvf_engine_conn_status(conn, req->request_id, KVF_ERR_NO_MEMORY,
                                      "out of memory");
    }
    wait->conn       = conn;
    wait->request_id = req->request_id;
    wait->next       = conn->pushes;
    conn->pushes     = wait;
    /* the reply may be written from inside this call */
    kvf_pd_wait_submit(server->pd, conn, req->pd_request,
                       req->timeout_ms * KVF_NSEC_PER_MSEC,
                       kvf_engine_on_pd_waited, wait);
    return KVF_OK;
}

static kvf_status_t kvf_engine_conn_pd_release(kvf_engine_conn_t *conn,
                                               const Kvf__EnginePdRelease *req)
{
    kvf_engine_server_t *server = conn->server;
    kvf_status_t status;
    char message[96];

    if (server->pd == NULL) {
        return kvf_engine_conn_status(conn, req->request_id,
                                      KVF_ERR_UNSUPPORTED,
                                      "this agent has no PD service");
    }
    status = kvf_pd_request_release(server->pd, conn, req->pd_request);
    snprintf(message, sizeof(message), "%s",
             (status == KVF_ERR_NOT_FOUND) ? "unknown PD request"
             : (status == KVF_ERR_BUSY)    ? "PD request claimed by another "
                                             "engine"
                                           : "");
    return kvf_engine_conn_status(conn, req->request_id, status, message);
}

static kvf_status_t kvf_engine_conn_dispatch(kvf_engine_conn_t *conn,
                                             const kvf_frame_t *frame)
{
    if (!conn->hello_done) {
        if (frame->type != KVF_MSG_HELLO) {
            return KVF_ERR_PROTO; /* HELLO comes first */
        }
        return kvf_engine_conn_hello(conn, (const Kvf__Hello *)frame->msg);
    }
    if (!kvf_auth_session_is_done(&conn->auth)) {
        return kvf_engine_conn_auth(conn, frame);
    }
    conn->server->stats.requests++;
    switch (frame->type) {
    case KVF_MSG_ENGINE_ALLOC:
        return kvf_engine_conn_alloc(conn,
                                     (const Kvf__EngineAlloc *)frame->msg);
    case KVF_MSG_ENGINE_COMMIT:
        return kvf_engine_conn_commit(conn,
                                      (const Kvf__EngineCommit *)frame->msg);
    case KVF_MSG_ENGINE_LOOKUP:
        return kvf_engine_conn_lookup(conn,
                                      (const Kvf__EngineLookup *)frame->msg);
    case KVF_MSG_ENGINE_RETRIEVE:
        return kvf_engine_conn_retrieve(
            conn, (const Kvf__EngineRetrieve *)frame->msg);
    case KVF_MSG_ENGINE_STATS:
        return kvf_engine_conn_stats(conn,
                                     (const Kvf__EngineStats *)frame->msg);
    case KVF_MSG_ENGINE_RELEASE:
        return kvf_engine_conn_release(conn,
                                       (const Kvf__EngineRelease *)frame->msg);
    case KVF_MSG_ENGINE_PD_PUSH:
        return kvf_engine_conn_pd_push(conn,
                                       (const Kvf__EnginePdPush *)frame->msg);
    case KVF_MSG_ENGINE_PD_WAIT:
        return kvf_engine_conn_pd_wait(conn,
                                       (const Kvf__EnginePdWait *)frame->msg);
    case KVF_MSG_ENGINE_PD_RELEASE:
        return kvf_engine_conn_pd_release(
            conn, (const Kvf__EnginePdRelease *)frame->msg);
    default:
        return KVF_ERR_PROTO;
    }
}

/* Counts and logs a frame the engine got wrong; the connection closes. */
static kvf_status_t kvf_engine_conn_refuse(kvf_engine_conn_t *conn,
                                           kvf_status_t status)
{
    conn->server->stats.protocol_errors++;
    kvf_debug("engine %s: %s; closing its connection",
              (conn->name[0] != '\0') ? conn->name : "(before hello)",
              kvf_strerror(status));
    return KVF_ERR_CANCELED;
}

static kvf_status_t kvf_engine_conn_on_frame(kvf_evconn_t *ev,
                                             kvf_frame_t *frame)
{
    kvf_engine_conn_t *conn = kvf_evconn_arg(ev);
    kvf_status_t status     = kvf_engine_conn_dispatch(conn, frame);

    return (status == KVF_OK) ? KVF_OK : kvf_engine_conn_refuse(conn, status);
}

static kvf_status_t kvf_engine_conn_on_bad_frame(kvf_evconn_t *ev,
                                                 kvf_status_t status)
{
    return kvf_engine_conn_refuse(kvf_evconn_arg(ev), status);
}

static void kvf_engine_conn_on_close(kvf_evconn_t *ev, kvf_status_t why)
{
    kvf_engine_conn_t *conn = kvf_evconn_arg(ev);

    if ((why == KVF_ERR_CLOSED) || (why == KVF_ERR_IO)) {
        kvf_info("engine %s disconnected",
                 (conn->name[0] != '\0') ? conn->name : "(before hello)");
    }
    kvf_engine_conn_close(conn);
}

static const kvf_evconn_ops_t kvf_engine_conn_ops = {
    .on_frame     = kvf_engine_conn_on_frame,
    .on_bad_frame = kvf_engine_conn_on_bad_frame,
    .on_close     = kvf_engine_conn_on_close,
};

static void kvf_engine_server_on_accept(struct evconnlistener *listener,
                                        evutil_socket_t fd,
                                        struct sockaddr *addr, int len,
                                        void *arg)
{
    kvf_engine_server_t *server = arg;

    if (server->stats.active >= server->max_connections) {
        kvf_warn("engine socket %s: %u connections open; refusing another",
                 server->path, server->max_connections);
        evutil_closesocket(fd);
        return;
    }
    kvf_engine_conn_create(server, fd);
}

/* A connection on @p fd (which it now owns); NULL (fd closed) on failure. */
static kvf_engine_conn_t *kvf_engine_conn_create(kvf_engine_server_t *server,
                                                 evutil_socket_t fd)
{
    kvf_engine_conn_t *conn;

    conn = calloc(1, sizeof(*conn));
    if (conn == NULL) {
        evutil_closesocket(fd);
        return NULL;
    }
    conn->server      = server;
    conn->accepted_ns = kvf_time_now_ns();
    kvf_auth_session_init(&conn->auth, server->secret);
    if (kvf_store_owner_create(server->store, &conn->owner) != KVF_OK) {
        evutil_closesocket(fd);
        free(conn);
        return NULL;
    }
    conn->ev = kvf_evconn_create(&server->group, fd, NULL, conn);
    if (conn->ev == NULL) { /* fd closed */
        kvf_store_owner_destroy(server->store, conn->owner);
        kvf_auth_session_cleanup(&conn->auth);
        free(conn);
        return NULL;
    }
    LIST_INSERT_HEAD(&server->conns, conn, link);
    server->stats.connections++;
    server->stats.active++;
    return conn;
}

/* Creates the socket's directory (and its parents) when missing, so the
 * default /run/kvfabric/agent.sock works on a fresh machine. */
static kvf_status_t kvf_engine_server_mkdirs(const char *path)
{
    char dir[108];
    char *p;

    snprintf(dir, sizeof(dir), "%s", path);
    p = strrchr(dir, '/');
    if ((p == NULL) || (p == dir)) {
        return KVF_OK;
    }
    *p = '\0';
    for (p = dir + 1; *p != '\0'; p++) {
        if (*p != '/') {
            continue;
        }
        *p = '\0';
        if ((mkdir(dir, 0755) != 0) && (errno != EEXIST)) {
            kvf_error("engine socket directory %s: %m", dir);
            return KVF_ERR_IO;
        }
        *p = '/';
    }
    if ((mkdir(dir, 0755) != 0) && (errno != EEXIST)) {
        kvf_error("engine socket directory %s: %m", dir);
        return KVF_ERR_IO;
    }
    return KVF_OK;
}

/* Is an agent already serving at @p path? A refused connect means the file
 * is a leftover of a process that died, safe to remove. */
static bool kvf_engine_server_in_use(const struct sockaddr_un *sun)
{
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    bool in_use;

    if (fd < 0) {
        return false;
    }
    in_use = (connect(fd, (const struct sockaddr *)sun, sizeof(*sun)) == 0);
    close(fd);
    return in_use;
}

kvf_status_t kvf_engine_server_create(const kvf_engine_server_params_t *params,
                                      kvf_engine_server_t **server_p)
{
    kvf_engine_server_t *server;
    struct sockaddr_un sun;
    kvf_status_t status;

    if ((params == NULL) || (params->base == NULL) || (params->path == NULL) ||
        (params->store == NULL) ||
        (strlen(params->path) >= sizeof(sun.sun_path)) ||
        (params->path[0] == '\0')) {
        kvf_error("engine socket path '%s' is empty or too long",
                  (params != NULL && params->path != NULL) ? params->path : "");
        return KVF_ERR_INVALID;
    }
    server = calloc(1, sizeof(*server));
    if (server == NULL) {
        return KVF_ERR_NO_MEMORY;
    }
    server->base                    = params->base;
    server->store                   = params->store;
    server->peer                    = params->peer;
    server->pd                      = params->pd;
    server->ctl                     = params->ctl;
    server->lookup_timeout_ns       = params->lookup_timeout_ns;
    server->lease_ns                = (params->lease_ns > 0) ? params->lease_ns
                                                             : 10 * (uint64_t)KVF_NSEC_PER_SEC;
    server->max_frame               = params->max_frame;
    server->group.base              = params->base;
    server->group.ops               = &kvf_engine_conn_ops;
    server->group.max_frame         = params->max_frame;
    server->group.max_frame_preauth = params->max_frame;
    server->group.max_output        = UINT64_MAX; /* engines read replies */
    server->secret                  = params->secret;
    server->max_connections =
        (params->max_connections > 0) ? params->max_connections : 1024;
    snprintf(server->path, sizeof(server->path), "%s", params->path);
    snprintf(server->node_name, sizeof(server->node_name), "%s",
             (params->node_name != NULL) ? params->node_name : "");

    memset(&sun, 0, sizeof(sun));
    sun.sun_family = AF_UNIX;
    memcpy(sun.sun_path, server->path, strlen(server->path));
    if (kvf_engine_server_in_use(&sun)) {
        kvf_error("engine socket %s: another agent is serving there",
                  server->path);
        status = KVF_ERR_EXISTS;
        goto err_free;
    }
    status = kvf_engine_server_mkdirs(server->path);
    if (status != KVF_OK) {
        goto err_free;
    }
    unlink(server->path); /* a stale file from a crashed agent */
    server->listener = evconnlistener_new_bind(
        server->base, kvf_engine_server_on_accept, server,
        LEV_OPT_CLOSE_ON_FREE | LEV_OPT_CLOSE_ON_EXEC, 64,
        (struct sockaddr *)&sun, sizeof(sun));
    if (server->listener == NULL) {
        kvf_error("engine socket %s: cannot listen: %m", server->path);
        status = KVF_ERR_IO;
        goto err_free;
    }
    status = kvf_listen_guard_init(&server->listen_guard, server->base,
                                   server->listener, "engine socket");
    if (status != KVF_OK) {
        evconnlistener_free(server->listener);
        goto err_free;
    }
    kvf_info("engines connect at %s", server->path);
    *server_p = server;
    return KVF_OK;

err_free:
    free(server);
    return status;
}

void kvf_engine_server_destroy(kvf_engine_server_t *server)
{
    if (server == NULL) {
        return;
    }
    while (!LIST_EMPTY(&server->conns)) {
        kvf_engine_conn_close(LIST_FIRST(&server->conns));
    }
    kvf_listen_guard_cleanup(&server->listen_guard);
    if (server->listener != NULL) {
        evconnlistener_free(server->listener);
        unlink(server->path);
    }
    free(server);
}

void kvf_engine_server_get_stats(const kvf_engine_server_t *server,
                                 kvf_engine_server_stats_t *stats_p)
{
    *stats_p = server->stats;
}

void kvf_engine_server_feed(kvf_engine_server_t *server, const void *data,
                            size_t len)
{
    kvf_engine_conn_t *conn, *c;
    int sv[2];

    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) {
        return;
    }
    conn = kvf_engine_conn_create(server, sv[0]); /* sv[0] is conn's now */
    if (conn != NULL) {
        kvf_evconn_feed(conn->ev, data, len); /* may close conn */
        for (c = LIST_FIRST(&server->conns); c != NULL;
             c = LIST_NEXT(c, link)) {
            if (c == conn) {
                kvf_engine_conn_close(conn);
                break;
            }
        }
    }
    close(sv[1]);
}

void kvf_engine_server_expire_handshakes(kvf_engine_server_t *server,
                                         uint64_t now_ns)
{
    kvf_engine_conn_t *conn, *next;

    if ((server == NULL) || !kvf_auth_secret_is_set(server->secret)) {
        return;
    }
    for (conn = LIST_FIRST(&server->conns); conn != NULL; conn = next) {
        next = LIST_NEXT(conn, link);
        if (kvf_auth_session_is_done(&conn->auth) ||
            (now_ns - conn->accepted_ns < KVF_ENGINE_HANDSHAKE_NS)) {
            continue;
        }
        kvf_auth_session_refuse(&conn->auth); /* counted once, here */
        conn->server->stats.auth_failures++;
        kvf_warn("engine %s: not authenticated within %llu s; closing",
                 (conn->name[0] != '\0') ? conn->name : "(before hello)",
                 (unsigned long long)(KVF_ENGINE_HANDSHAKE_NS / 1000000000ull));
        kvf_engine_conn_close(conn);
    }
}
