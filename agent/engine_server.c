/* SPDX-License-Identifier: Apache-2.0 */
/* Copyright (c) 2026 The kvfabric authors */
#include "agent/engine_server.h"

#include "agent/pool.h"

#include "common/chunk.h"
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
    LIST_ENTRY(kvf_engine_push) link; /* in conn->pushes */
    kvf_engine_conn_t *conn;
    uint64_t request_id;
    uint64_t pd_request; /* a wait: the PD request it claims */
} kvf_engine_push_t;

/* A claimed PD request's chunks, copied into the engine's staging area
 * (it never maps the receive region), until it releases the request. */
typedef struct kvf_engine_claim {
    struct kvf_engine_claim *next;
    uint64_t pd_request;
    uint32_t num;
    kvf_pool_entry_t *entries[];
} kvf_engine_claim_t;

/* An engine's staging area stays mapped while anything reads it: its
 * connection, and each PD push sending from it (a push may outlive the
 * connection; the last reference unmaps it). */
typedef struct kvf_engine_staging_hold {
    kvf_pool_t *pool;
    uint32_t refs;
} kvf_engine_staging_hold_t;

struct kvf_engine_conn {
    kvf_engine_server_t *server;
    LIST_HEAD(, kvf_engine_push) pushes; /* PD requests waiting for pd.c */
    uint32_t num_pushes;
    kvf_evconn_t *ev;
    LIST_ENTRY(kvf_engine_conn) link; /* in server->conns */
    kvf_store_owner_t *owner;         /* this engine's grants and pins */
    kvf_engine_wait_t *waits; /* requests waiting for the controller/peers */
    kvf_engine_lease_t *leases;
    uint32_t num_leases;
    /* the engine's writable memory (docs/security.md, "Engines"): the pool
     * is mapped read-only; it writes chunks here and the agent copies them
     * into the pool at commit. Its offsets, as the engine sees them, start
     * at staging_at (right after the pool). staging_grant maps each staging
     * unit holding an allocation to the pool grant it fills. */
    kvf_pool_t *staging;
    kvf_engine_staging_hold_t *staging_hold; /* keeps it mapped */
    uint64_t *staging_grant;                 /* UINT64_MAX: none */
    kvf_engine_claim_t *claims;
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
    uint64_t staging_size;
    unsigned staging_shift; /* log2 of a staging unit (its smallest block) */
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

/* Pushes and waits one engine may have waiting for agent/pd.c (an engine
 * starts pushes without waiting for their replies: kvf_pd_push_start). */
#define KVF_ENGINE_PUSHES_MAX 4096u

static kvf_status_t kvf_engine_conn_status(kvf_engine_conn_t *conn,
                                           uint64_t request_id,
                                           kvf_status_t status,
                                           const char *message);

/* A new push or wait of @p conn in @p push_p, linked; NULL when the engine
 * has KVF_ENGINE_PUSHES_MAX already or no memory: it was answered so, and
 * the answer's own status is returned. */
static kvf_status_t kvf_engine_push_new(kvf_engine_conn_t *conn,
                                        uint64_t request_id,
                                        kvf_engine_push_t **push_p)
{
    kvf_engine_push_t *push = NULL;

    *push_p = NULL;
    if (conn->num_pushes < KVF_ENGINE_PUSHES_MAX) {
        push = calloc(1, sizeof(*push));
    }
    if (push == NULL) {
        return kvf_engine_conn_status(
            conn, request_id,
            (conn->num_pushes < KVF_ENGINE_PUSHES_MAX) ? KVF_ERR_NO_MEMORY
                                                       : KVF_ERR_BUSY,
            (conn->num_pushes < KVF_ENGINE_PUSHES_MAX)
                ? "out of memory"
                : "this engine has 4096 pushes and waits in progress");
    }
    push->conn       = conn;
    push->request_id = request_id;
    LIST_INSERT_HEAD(&conn->pushes, push, link);
    conn->num_pushes++;
    *push_p = push;
    return KVF_OK;
}

static void kvf_engine_push_unlink(kvf_engine_push_t *push)
{
    LIST_REMOVE(push, link);
    push->conn->num_pushes--;
}

static kvf_engine_conn_t *kvf_engine_conn_create(kvf_engine_server_t *server,
                                                 evutil_socket_t fd);

/* ------------------------------------------------------------ staging */

static void kvf_engine_claim_free(kvf_engine_conn_t *conn,
                                  kvf_engine_claim_t *claim)
{
    uint32_t i;

    for (i = 0; i < claim->num; i++) {
        kvf_pool_free(conn->staging, claim->entries[i]);
    }
    free(claim);
}

/* Forgets the staging copy of @p pd_request (released, or claimed again). */
static void kvf_engine_claim_drop(kvf_engine_conn_t *conn, uint64_t pd_request)
{
    kvf_engine_claim_t **pp, *claim;

    for (pp = &conn->claims; *pp != NULL; pp = &(*pp)->next) {
        if ((*pp)->pd_request == pd_request) {
            claim = *pp;
            *pp   = claim->next;
            kvf_engine_claim_free(conn, claim);
            return;
        }
    }
}

static void kvf_engine_staging_put_hold(void *arg)
{
    kvf_engine_staging_hold_t *hold = arg;

    if (--hold->refs == 0) {
        kvf_pool_destroy(hold->pool);
        free(hold);
    }
}

static void kvf_engine_staging_destroy(kvf_engine_conn_t *conn)
{
    kvf_engine_claim_t *claim;
    uint64_t units, i;

    if (conn->staging == NULL) {
        return;
    }
    while (conn->claims != NULL) {
        claim        = conn->claims;
        conn->claims = claim->next;
        kvf_engine_claim_free(conn, claim);
    }
    units = kvf_pool_capacity(conn->staging) >> conn->server->staging_shift;
    for (i = 0; i < units; i++) {
        if (conn->staging_grant[i] != UINT64_MAX) {
            kvf_pool_free(conn->staging,
                          kvf_pool_entry_find(
                              conn->staging, i << conn->server->staging_shift));
        }
    }
    kvf_engine_staging_put_hold(conn->staging_hold); /* pushes may keep it */
    free(conn->staging_grant);
    conn->staging       = NULL;
    conn->staging_hold  = NULL;
    conn->staging_grant = NULL;
}

/* The engine's staging area: a memfd of its own (sealed against resizing,
 * so the engine cannot truncate it under the agent's copies), created when
 * it is admitted. */
static kvf_status_t kvf_engine_staging_create(kvf_engine_conn_t *conn)
{
    kvf_engine_server_t *server = conn->server;
    uint64_t max_chunk          = kvf_store_max_chunk(server->store);
    kvf_pool_params_t params;
    uint64_t units, i;
    kvf_status_t status;

    memset(&params, 0, sizeof(params));
    params.field_mask = KVF_POOL_FIELD_NAME | KVF_POOL_FIELD_SIZE |
                        KVF_POOL_FIELD_MIN_CHUNK | KVF_POOL_FIELD_MAX_CHUNK |
                        KVF_POOL_FIELD_WATERMARKS | KVF_POOL_FIELD_NO_HUGETLB |
                        KVF_POOL_FIELD_UNSEALED;
    params.name      = "kvf-staging";
    params.size      = server->staging_size;
    params.min_chunk = 1ull << server->staging_shift;
    params.max_chunk = max_chunk;
    params.high_pct  = 100;
    params.low_pct   = 100;
    status           = kvf_pool_create(&params, &conn->staging);
    if (status != KVF_OK) {
        return status;
    }
    units = kvf_pool_capacity(conn->staging) >> server->staging_shift;
    conn->staging_grant = malloc(units * sizeof(uint64_t));
    conn->staging_hold  = malloc(sizeof(*conn->staging_hold));
    if ((conn->staging_grant == NULL) || (conn->staging_hold == NULL)) {
        kvf_pool_destroy(conn->staging);
        free(conn->staging_grant);
        free(conn->staging_hold);
        conn->staging       = NULL;
        conn->staging_grant = NULL;
        conn->staging_hold  = NULL;
        return KVF_ERR_NO_MEMORY;
    }
    conn->staging_hold->pool = conn->staging;
    conn->staging_hold->refs = 1;
    for (i = 0; i < units; i++) {
        conn->staging_grant[i] = UINT64_MAX;
    }
    return KVF_OK;
}

/* Where the engine sees the staging area: right after the pool. */
static uint64_t kvf_engine_staging_at(const kvf_engine_conn_t *conn)
{
    return kvf_store_size(conn->server->store);
}

/* The staging block at engine offset @p offset holding an allocation, and
 * the pool grant it fills; NULL for anything else. */
static kvf_pool_entry_t *kvf_engine_staging_find(kvf_engine_conn_t *conn,
                                                 uint64_t offset,
                                                 uint64_t *grant_p)
{
    uint64_t at = kvf_engine_staging_at(conn);
    kvf_pool_entry_t *entry;
    uint64_t unit;

    if ((conn->staging == NULL) || (offset < at) ||
        (offset - at >= kvf_pool_capacity(conn->staging))) {
        return NULL;
    }
    entry = kvf_pool_entry_find(conn->staging, offset - at);
    unit  = (offset - at) >> conn->server->staging_shift;
    if ((entry == NULL) || (conn->staging_grant[unit] == UINT64_MAX)) {
        return NULL;
    }
    *grant_p = conn->staging_grant[unit];
    return entry;
}

/* Forgets the grant of a staging block: kvf_engine_staging_find no
 * longer finds it. */
static void kvf_engine_staging_forget(kvf_engine_conn_t *conn,
                                      kvf_pool_entry_t *entry)
{
    uint64_t off = kvf_pool_entry_offset(entry);

    conn->staging_grant[off >> conn->server->staging_shift] = UINT64_MAX;
}

/* Gives back the staging block of an allocation (committed or released). */
static void kvf_engine_staging_put(kvf_engine_conn_t *conn,
                                   kvf_pool_entry_t *entry)
{
    kvf_engine_staging_forget(conn, entry);
    kvf_pool_free(conn->staging, entry);
}

static void *kvf_engine_staging_ptr(kvf_engine_conn_t *conn,
                                    kvf_pool_entry_t *entry)
{
    return kvf_pool_ptr(conn->staging, kvf_pool_entry_offset(entry));
}

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
    kvf_engine_staging_destroy(conn);
    while (!LIST_EMPTY(&conn->pushes)) {
        kvf_engine_push_t *push = LIST_FIRST(&conn->pushes);

        kvf_engine_push_unlink(push);
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
 * AUTH) goes out with a read-only fd of the pool, then POOL_INFO with the
 * engine's staging fd, in two sendmsg() calls (one fd each: a receiver
 * gets each fd with the bytes it came with). */
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
    int pool_fd;

    status = kvf_engine_staging_create(conn);
    if (status != KVF_OK) {
        kvf_warn("engine %s: no staging area (%s); refused", conn->name,
                 kvf_strerror(status));
        return status;
    }
    snprintf(node, sizeof(node), "%s", server->node_name);
    kvf__pool_info__init(&info);
    info.request_id      = request_id;
    info.pool_size       = kvf_store_size(server->store);
    info.max_chunk_bytes = kvf_store_max_chunk(server->store);
    info.node_name       = node;
    info.staging_size    = kvf_pool_capacity(conn->staging);
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
    status = kvf_store_fd_readonly(server->store, &pool_fd);
    if (status != KVF_OK) {
        return status;
    }
    status = kvf_engine_conn_sendmsg(conn, buf, len1, pool_fd);
    close(pool_fd);
    if (status == KVF_OK) {
        status = kvf_engine_conn_sendmsg(conn, buf + len1, len2,
                                         kvf_pool_fd(conn->staging));
    }
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

/* One allocation: a pool grant, and the staging block the engine writes
 * it in (its offset is what the engine gets). */
static kvf_status_t kvf_engine_conn_alloc_one(kvf_engine_conn_t *conn,
                                              uint64_t bytes,
                                              uint64_t *offset_p,
                                              bool *staging_full_p)
{
    kvf_engine_server_t *server = conn->server;
    kvf_pool_entry_t *entry;
    kvf_status_t status;
    kvf_slot_t slot;
    uint64_t off;

    status = kvf_store_alloc(server->store, conn->owner, bytes, &slot);
    if (status != KVF_OK) {
        return status;
    }
    status = kvf_pool_alloc(conn->staging, bytes, UINT64_MAX, &entry);
    if (status != KVF_OK) {
        kvf_store_release(server->store, conn->owner, slot.offset);
        server->stats.staging_full++;
        *staging_full_p = true;
        return status;
    }
    off = kvf_pool_entry_offset(entry);
    conn->staging_grant[off >> server->staging_shift] = slot.offset;
    *offset_p = kvf_engine_staging_at(conn) + off;
    return KVF_OK;
}

/* Gives back an allocation by the engine's offset: its staging block and
 * its grant. KVF_ERR_RANGE when it is not one. */
static kvf_status_t kvf_engine_conn_alloc_release(kvf_engine_conn_t *conn,
                                                  uint64_t offset)
{
    kvf_pool_entry_t *entry;
    kvf_status_t status;
    uint64_t grant;

    entry = kvf_engine_staging_find(conn, offset, &grant);
    if (entry == NULL) {
        return KVF_ERR_RANGE;
    }
    /* a grant being pushed is the push's: its staging block, which the
     * push reads, stays until the push gives the grant back */
    status = kvf_store_release(conn->server->store, conn->owner, grant);
    if (status == KVF_OK) {
        kvf_engine_staging_put(conn, entry);
    }
    return status;
}

static kvf_status_t kvf_engine_conn_alloc(kvf_engine_conn_t *conn,
                                          const Kvf__EngineAlloc *req)
{
    uint64_t *offsets = NULL, *lengths = NULL;
    Kvf__EngineSlots reply;
    kvf_status_t status = KVF_OK;
    char message[256]   = "";
    bool staging_full   = false;
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
        status = kvf_engine_conn_alloc_one(conn, req->chunk_bytes, &offsets[i],
                                           &staging_full);
        if (status == KVF_OK) {
            lengths[i] = req->chunk_bytes;
            got++;
        } else if (staging_full) {
            kvf_pool_stats_t st;

            kvf_pool_stats(conn->staging, &st);
            snprintf(message, sizeof(message),
                     "could not grant chunk %u of %u (%llu bytes): this "
                     "engine's staging area is full (%llu of %llu bytes "
                     "allocated and not yet committed; engine_staging_size)",
                     i, req->count, (unsigned long long)req->chunk_bytes,
                     (unsigned long long)st.used,
                     (unsigned long long)st.capacity);
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
            kvf_engine_conn_alloc_release(conn, offsets[i]);
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

/* One chunk of a COMMIT: its staging block and the grant it lands in. */
typedef struct kvf_engine_commit_item {
    kvf_pool_entry_t *staging; /* NULL: no such grant (KVF_ERR_RANGE) */
    uint64_t grant;
    uint32_t job; /* its copy in the batch */
} kvf_engine_commit_item_t;

/* Finds each chunk's staging block and grant and queues its copy; a
 * grant named twice in the batch is KVF_ERR_RANGE after its first (its
 * bytes land once, as when each chunk was committed in turn). Returns the
 * copies queued. */
static size_t kvf_engine_commit_plan(kvf_engine_conn_t *conn,
                                     const Kvf__EngineCommit *req,
                                     kvf_engine_commit_item_t *items,
                                     kvf_copy_job_t *jobs)
{
    kvf_store_t *store = conn->server->store;
    size_t n = req->n_offsets, i, njobs = 0;

    for (i = 0; i < n; i++) {
        uint64_t len;
        uint8_t *dst;

        items[i].staging =
            kvf_engine_staging_find(conn, req->offsets[i], &items[i].grant);
        if (items[i].staging == NULL) {
            continue;
        }
        dst = kvf_store_grant_ptr(store, conn->owner, items[i].grant, &len);
        if (dst == NULL) {
            items[i].staging = NULL;
            continue;
        }
        /* taken: named again in this batch, it is no longer found */
        kvf_engine_staging_forget(conn, items[i].staging);
        items[i].job      = (uint32_t)njobs;
        jobs[njobs].dst   = dst;
        jobs[njobs].src   = kvf_engine_staging_ptr(conn, items[i].staging);
        jobs[njobs].len   = len;
        jobs[njobs++].sum = 0;
    }
    return njobs;
}

static kvf_status_t kvf_engine_conn_commit(kvf_engine_conn_t *conn,
                                           const Kvf__EngineCommit *req)
{
    kvf_engine_server_t *server = conn->server;
    Kvf__EngineCommitReply reply;
    kvf_status_t status, first = KVF_OK;
    kvf_engine_commit_item_t *items;
    kvf_copy_job_t *jobs;
    int32_t *results;
    size_t n, i, njobs;
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
    items   = malloc(n * sizeof(*items));
    jobs    = malloc(n * sizeof(*jobs));
    if ((results == NULL) || (items == NULL) || (jobs == NULL)) {
        free(results);
        free(items);
        free(jobs);
        return kvf_engine_conn_status(conn, req->request_id, KVF_ERR_NO_MEMORY,
                                      "out of memory");
    }
    /* the bytes are copied from the engine's staging blocks into the
     * grants, checksummed as they land (on the copier's threads too):
     * committed bytes are the agent's alone from here on */
    njobs = kvf_engine_commit_plan(conn, req, items, jobs);
    kvf_store_copy(server->store, jobs, njobs);
    for (i = 0; i < n; i++) {
        kvf_key_unpack(req->keys.data + i * KVF_KEY_WIRE_SIZE, &key);
        if (items[i].staging == NULL) {
            status = KVF_ERR_RANGE;
        } else {
            status = kvf_store_commit_hashed(server->store, conn->owner, &key,
                                             items[i].grant, req->checksums[i],
                                             jobs[items[i].job].sum, false);
            kvf_engine_staging_put(conn, items[i].staging); /* grant gone */
        }
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
    free(items);
    free(jobs);
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

/* Fetches keys[local, hit) from the holders the lookup named (NULL: the
 * fetch asks the controller itself). */
static void kvf_engine_prefetch(kvf_engine_server_t *server,
                                const kvf_key_t *keys, const uint32_t *holders,
                                uint32_t local, uint32_t hit,
                                kvf_peer_fetch_cb_t cb, void *arg)
{
    if ((hit <= local) || (server->peer == NULL)) {
        return;
    }
    if (holders != NULL) {
        kvf_peer_fetch_from(server->peer, keys + local, holders + local,
                            hit - local, cb, arg);
    } else {
        kvf_peer_fetch(server->peer, keys + local, hit - local, cb, arg);
    }
}

/* Starts a lease on keys[0, hit) of a prefetching lookup: pins the local
 * ones, fetches the rest from @p holders (the lookup's, one per key; NULL:
 * none known). Returns its id, 0 when none could be made (the prefetch
 * still runs, unpinned). */
static uint64_t kvf_engine_lease_start(kvf_engine_conn_t *conn,
                                       const kvf_key_t *keys,
                                       const uint32_t *holders, uint32_t local,
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
        kvf_engine_prefetch(server, keys, holders, local, hit, NULL, NULL);
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
    kvf_engine_prefetch(server, keys, holders, local, hit,
                        kvf_engine_on_lease_fetched, lease);
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
        /* the holders this lookup named: the fetch asks nobody again */
        lease_id = kvf_engine_lease_start(
            conn, wait->keys,
            ((status == KVF_OK) && (num == wait->num)) ? holders : NULL,
            wait->local, hit);
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
            lease_id =
                kvf_engine_lease_start(conn, wait->keys, NULL, local, local);
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

/* Pins every key held here and answers RETRIEVE; the rest are missing.
 * Each chunk handed out is hashed again against its checksum, except on
 * the first read of one that landed from elsewhere: that one was hashed
 * as it landed (kvf_store_pin_checked). */
static kvf_status_t kvf_engine_retrieve_reply(kvf_engine_conn_t *conn,
                                              uint64_t request_id,
                                              const kvf_key_t *keys, uint32_t n)
{
    kvf_engine_server_t *server = conn->server;
    uint64_t *offsets, *lengths, *sums;
    kvf_status_t status, *results;
    Kvf__EngineSlots reply;
    kvf_slot_t *slots;
    uint8_t *missing;
    uint32_t i;

    offsets = calloc(n, sizeof(*offsets));
    lengths = calloc(n, sizeof(*lengths));
    sums    = calloc(n, sizeof(*sums));
    missing = calloc(n, 1);
    slots   = calloc(n, sizeof(*slots));
    results = calloc(n, sizeof(*results));
    if ((offsets == NULL) || (lengths == NULL) || (sums == NULL) ||
        (missing == NULL) || (slots == NULL) || (results == NULL) ||
        (kvf_store_pin_checked(server->store, conn->owner, keys, n, slots, sums,
                               results) != KVF_OK)) {
        free(offsets);
        free(lengths);
        free(sums);
        free(missing);
        free(slots);
        free(results);
        return kvf_engine_conn_status(conn, request_id, KVF_ERR_NO_MEMORY,
                                      "out of memory");
    }
    for (i = 0; i < n; i++) {
        if (results[i] == KVF_OK) {
            offsets[i] = slots[i].offset;
            lengths[i] = slots[i].length;
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
    reply.n_checksums  = n; /* so the engine can check them too */
    reply.checksums    = sums;
    status = kvf_engine_conn_send(conn, KVF_MSG_ENGINE_SLOTS, &reply.base);
    kvf_engine_leases_use(conn, keys, n);
    free(offsets);
    free(lengths);
    free(sums);
    free(missing);
    free(slots);
    free(results);
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
        /* an allocation (in staging), else a retrieved chunk's pin */
        status = kvf_engine_conn_alloc_release(conn, req->offsets[i]);
        if (status == KVF_ERR_RANGE) {
            status = kvf_store_release(conn->server->store, conn->owner,
                                       req->offsets[i]);
        }
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
    const void **srcs;
    uint64_t *offsets;
    kvf_pd_push_args_t args;
    kvf_status_t status;
    size_t i;

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
    status = kvf_engine_push_new(conn, req->request_id, &push);
    if (push == NULL) {
        return status;
    }
    offsets = malloc(req->n_offsets * sizeof(*offsets));
    srcs    = malloc(req->n_offsets * sizeof(*srcs));
    status = ((offsets == NULL) || (srcs == NULL)) ? KVF_ERR_NO_MEMORY : KVF_OK;
    /* allocations are sent straight from the engine's staging block (no
     * copy: the engine may still change them, but only its own push
     * suffers, as the decoder checks the engine's checksums); their pool
     * grant goes with the push, so neither is freed under it; retrieved
     * chunks (pins) go from the pool */
    for (i = 0; (status == KVF_OK) && (i < req->n_offsets); i++) {
        kvf_pool_entry_t *entry;
        uint64_t grant;

        entry = kvf_engine_staging_find(conn, req->offsets[i], &grant);
        if (entry == NULL) {
            offsets[i] = req->offsets[i];
            srcs[i]    = NULL;
            continue;
        }
        offsets[i] = grant;
        srcs[i]    = kvf_engine_staging_ptr(conn, entry);
    }
    if ((status == KVF_OK) && (conn->staging_hold != NULL)) {
        args = (kvf_pd_push_args_t){.engine     = conn,
                                    .owner      = conn->owner,
                                    .offsets    = offsets,
                                    .lengths    = req->lengths,
                                    .checksums  = req->checksums,
                                    .num        = (uint32_t)req->n_offsets,
                                    .request_id = req->pd_request,
                                    .decoder    = req->decoder,
                                    .is_final   = req->final,
                                    .piece      = req->piece,
                                    .srcs       = srcs,
                                    .src_put    = kvf_engine_staging_put_hold,
                                    .src_arg    = conn->staging_hold,
                                    .cb         = kvf_engine_on_pd_pushed,
                                    .arg        = push};
        conn->staging_hold->refs++; /* the push's; put however it ends */
        status = kvf_pd_push_submit(server->pd, &args);
    } else if (status == KVF_OK) {
        status = KVF_ERR_STATE; /* not admitted: no staging, no pushes */
    }
    free(offsets);
    free(srcs);
    if (status != KVF_OK) {
        kvf_engine_push_unlink(push);
        free(push);
        return kvf_engine_conn_status(
            conn, req->request_id, status,
            (status == KVF_ERR_RANGE)
                ? "a pushed slot is not one of this connection's grants or "
                  "pins, or its length exceeds it"
            : (status == KVF_ERR_CANCELED)
                ? "this agent does not hold the earlier pushes of this PD "
                  "request (one failed, or the agent restarted): the request "
                  "is lost, push it again from its first piece"
                : kvf_strerror(status));
    }
    return KVF_OK;
}

/* Copies the chunks of a claimed PD request from the receive region
 * (which engines never map) into the engine's staging area, checking each
 * copy against the checksum the push was verified with (the region is a
 * memfd a same-host prefill agent writes: what the engine gets is what
 * was verified, whatever wrote there since), and points @p offsets there.
 * KVF_ERR_CHECKSUM names the chunk in @p bad_p. A device region's slots
 * are passed as they are. */
static kvf_status_t
kvf_engine_claim_copy(kvf_engine_conn_t *conn, uint64_t pd_request,
                      const kvf_slot_t *slots, const uint64_t *checksums,
                      uint32_t num, uint64_t *offsets, uint32_t *bad_p)
{
    kvf_store_t *store = conn->server->store;
    kvf_engine_claim_t *claim;
    uint64_t region_at, region_len;
    kvf_status_t status = KVF_OK;
    kvf_copy_job_t *jobs;
    uint32_t i, k, *which; /* which[k]: the chunk of jobs[k] */

    region_len = kvf_store_reserve(store, &region_at);
    kvf_engine_claim_drop(conn, pd_request); /* waited again: a new copy */
    claim = calloc(1, sizeof(*claim) + (size_t)num * sizeof(claim->entries[0]));
    jobs  = malloc(((size_t)num + 1) * sizeof(*jobs));
    which = malloc(((size_t)num + 1) * sizeof(*which));
    if ((claim == NULL) || (jobs == NULL) || (which == NULL)) {
        free(claim);
        free(jobs);
        free(which);
        return KVF_ERR_NO_MEMORY;
    }
    claim->pd_request = pd_request;
    for (i = 0; i < num; i++) {
        const kvf_slot_t *slot = &slots[i];
        kvf_pool_entry_t *entry;

        if ((slot->offset < region_at) ||
            (slot->offset - region_at >= region_len) ||
            (slot->length > region_len - (slot->offset - region_at))) {
            offsets[i] = slot->offset; /* not in the host region */
            continue;
        }
        status =
            kvf_pool_alloc(conn->staging, slot->length, UINT64_MAX, &entry);
        if (status != KVF_OK) {
            conn->server->stats.staging_full++;
            break;
        }
        claim->entries[claim->num] = entry;
        jobs[claim->num].dst       = kvf_engine_staging_ptr(conn, entry);
        jobs[claim->num].src = (uint8_t *)kvf_store_base(store) + slot->offset;
        jobs[claim->num].len = slot->length;
        which[claim->num++]  = i;
        offsets[i] = kvf_engine_staging_at(conn) + kvf_pool_entry_offset(entry);
    }
    if (status == KVF_OK) {
        /* on the copier's threads too; each copy checked against what the
         * push was verified with */
        kvf_store_copy(store, jobs, claim->num);
        for (k = 0; k < claim->num; k++) {
            if (jobs[k].sum != checksums[which[k]]) {
                conn->server->stats.claim_checksum_failures++;
                *bad_p = which[k];
                status = KVF_ERR_CHECKSUM;
                break;
            }
        }
    }
    free(jobs);
    free(which);
    if (status != KVF_OK) {
        kvf_engine_claim_free(conn, claim);
        return status;
    }
    claim->next  = conn->claims;
    conn->claims = claim;
    return KVF_OK;
}

static void kvf_engine_on_pd_waited(void *arg, kvf_status_t status,
                                    const char *message,
                                    const kvf_slot_t *slots,
                                    const uint64_t *checksums, uint32_t num)
{
    kvf_engine_push_t *wait = arg;
    kvf_engine_conn_t *conn = wait->conn;
    uint64_t *offsets = NULL, *lengths = NULL;
    char why[160];
    Kvf__EngineSlots reply;
    uint32_t i, bad = 0;

    kvf_engine_push_unlink(wait);
    if (status == KVF_OK) {
        offsets = malloc(((size_t)num + 1) * sizeof(*offsets));
        lengths = malloc(((size_t)num + 1) * sizeof(*lengths));
        if ((offsets == NULL) || (lengths == NULL)) {
            status  = KVF_ERR_NO_MEMORY;
            message = "out of memory";
        }
    }
    if (status == KVF_OK) {
        status = kvf_engine_claim_copy(conn, wait->pd_request, slots, checksums,
                                       num, offsets, &bad);
        if (status == KVF_ERR_CHECKSUM) {
            /* nothing of it can be trusted any more: its region space goes
             * back now, not when the engine releases it (it may not) */
            (void)kvf_pd_request_release(conn->server->pd, conn,
                                         wait->pd_request);
            snprintf(why, sizeof(why),
                     "chunk %u of PD request %llu changed in the receive "
                     "region after it was verified; the request is released",
                     bad, (unsigned long long)wait->pd_request);
            kvf_warn("%s", why);
            message = why;
        } else if (status != KVF_OK) {
            message = "the engine's staging area is full "
                      "(engine_staging_size): release PD requests";
        }
    }
    if (status != KVF_OK) {
        status =
            kvf_engine_conn_status(conn, wait->request_id, status, message);
    } else {
        for (i = 0; i < num; i++) {
            lengths[i] = slots[i].length;
        }
        kvf__engine_slots__init(&reply);
        reply.request_id = wait->request_id;
        reply.n_offsets  = num;
        reply.offsets    = offsets;
        reply.n_lengths  = num;
        reply.lengths    = lengths;
        /* what each chunk was verified with, for the engine to check too */
        reply.n_checksums = (checksums != NULL) ? num : 0;
        reply.checksums   = (uint64_t *)(uintptr_t)checksums;
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
    kvf_status_t status;

    if (server->pd == NULL) {
        return kvf_engine_conn_status(conn, req->request_id,
                                      KVF_ERR_UNSUPPORTED,
                                      "this agent has no PD service");
    }
    status = kvf_engine_push_new(conn, req->request_id, &wait);
    if (wait == NULL) {
        return status;
    }
    wait->pd_request = req->pd_request;
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
    if (status != KVF_ERR_BUSY) {
        kvf_engine_claim_drop(conn, req->pd_request);
    }
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
    server->staging_size =
        (params->staging_size != 0) ? params->staging_size : (256ull << 20);
    if (server->staging_size < kvf_store_max_chunk(params->store)) {
        server->staging_size = kvf_store_max_chunk(params->store);
    }
    server->staging_shift = 16; /* 64 KiB units, or the largest chunk */
    while ((1ull << server->staging_shift) >
           kvf_store_max_chunk(params->store)) {
        server->staging_shift--;
    }
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
