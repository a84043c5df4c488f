/* SPDX-License-Identifier: Apache-2.0 */
/* Copyright (c) 2026 The kvfabric authors */
#include "agent/mesh.h"

#include "common/auth.h"
#include "common/log.h"
#include "common/time.h"

#include <event2/event.h>

#include <endian.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/queue.h>

/* Nodes kept by the directory; a cluster larger than this only pays an
 * extra NODE_INFO now and then. */
#define KVF_MESH_NODES 64

typedef struct kvf_mesh_node {
    uint32_t node_id; /* 0: unknown (or unused with an empty address) */
    char name[KVF_MESH_NAME_MAX];
    char address[KVF_MESH_ADDR_MAX]; /* "": unused */
} kvf_mesh_node_t;

/* The handshake on one endpoint (ep user pointer), client side (we opened
 * it) or server side (a peer connected). */
typedef enum {
    KVF_MESH_LINK_HELLO_SENT = 0, /* client: HELLO sent */
    KVF_MESH_LINK_PROOF_SENT,     /* client: server proved, PROOF sent */
    KVF_MESH_LINK_CHALLENGED,     /* server: CHALLENGE sent */
    KVF_MESH_LINK_READY,          /* both proved the secret */
    KVF_MESH_LINK_FAILED,
} kvf_mesh_link_state_t;

typedef struct kvf_mesh_waiter {
    struct kvf_mesh_waiter *next;
    kvf_mesh_ready_cb_t cb;
    void *arg;
    uint64_t tag;
} kvf_mesh_waiter_t;

typedef struct kvf_mesh_link {
    struct kvf_mesh_link *next; /* mesh->links */
    struct kvf_mesh_link *prev;
    kvf_ucx_ep_t *ep; /* held while the link exists */
    kvf_mesh_link_state_t state;
    kvf_status_t error; /* FAILED: what waiters learn */
    bool is_client;
    kvf_auth_session_t session;
    uint64_t deadline_ns; /* of the handshake */
    uint32_t expect_id;   /* client: whom we meant to reach (0: any) */
    char expect_name[KVF_MESH_NAME_MAX];
    uint32_t peer_id; /* proven identity, once READY */
    uint32_t peer_role;
    char peer_name[KVF_MESH_NAME_MAX];
    kvf_mesh_waiter_t *waiters;
} kvf_mesh_link_t;

/* Handshake messages (KVF_MESH_AM_AUTH payload), little endian:
 * magic u32, kind u8, nonce length u8, mac length u8, identity length u8,
 * nonce[32], mac[32], identity ("ID/ROLE/NAME", MAC'd by the sender). */
enum {
    KVF_MESH_AUTH_HELLO = 1,
    KVF_MESH_AUTH_CHALLENGE,
    KVF_MESH_AUTH_PROOF,
    KVF_MESH_AUTH_OK,
    KVF_MESH_AUTH_REFUSED,
};

#define KVF_MESH_AUTH_MAGIC   0x4d46564bu /* "KVFM" */
#define KVF_MESH_AUTH_FIXED   (8 + KVF_AUTH_NONCE_SIZE + KVF_AUTH_MAC_SIZE)
#define KVF_MESH_IDENT_MAX    (KVF_MESH_NAME_MAX + 24)
#define KVF_MESH_AUTH_MAX     (KVF_MESH_AUTH_FIXED + KVF_MESH_IDENT_MAX)
#define KVF_MESH_AUTH_TICK_US 100000

typedef struct kvf_mesh_auth_msg {
    uint8_t kind;
    uint8_t nonce_len;
    uint8_t mac_len;
    uint8_t nonce[KVF_AUTH_NONCE_SIZE];
    uint8_t mac[KVF_AUTH_MAC_SIZE];
    char ident[KVF_MESH_IDENT_MAX]; /* NUL-terminated */
} kvf_mesh_auth_msg_t;

struct kvf_mesh {
    kvf_ucx_worker_t *worker;
    const kvf_auth_secret_t *secret; /* NULL: the data plane is open */
    kvf_ctl_client_t *ctl;
    uint32_t role;
    uint64_t auth_timeout_ns;
    kvf_mesh_link_t *links;
    struct event *auth_ev;   /* handshake deadlines, while any runs */
    struct event *notify_ev; /* readiness callbacks, out of the caller */
    struct event *defer_ev;  /* retries the deferred sends */
    TAILQ_HEAD(, kvf_mesh_msg) deferred;
    unsigned num_deferred;
    kvf_mesh_stats_t stats;
    kvf_mesh_node_t nodes[KVF_MESH_NODES];
    unsigned next_node; /* the entry replaced next when all are used */
    uint8_t random[KVF_AUTH_NONCE_SIZE]; /* DRBG output not used yet */
    unsigned random_used;                /* bytes of it used */
    bool is_closed; /* kvf_mesh_close: no new links or deferred sends */
    char name[128];
};

/* A frame being sent: kept until UCX completes the send. */
typedef struct kvf_mesh_msg {
    kvf_mesh_sent_cb_t cb; /* a frame's (kvf_mesh_send_frame) */
    kvf_ucx_op_cb_t op_cb; /* or a message's (kvf_mesh_send_am) */
    void *arg;
    uint64_t tag;
    /* deferred (the worker had no operation free): in mesh->deferred
     * with its endpoint held, sent in order as operations free up */
    TAILQ_ENTRY(kvf_mesh_msg) link;
    kvf_ucx_ep_t *ep;
    unsigned id;
    uint64_t deadline_ns;
    kvf_mesh_am_payload_t am; /* a message's: its header copied in frame */
    size_t len;
    uint8_t frame[];
} kvf_mesh_msg_t;

static const char *const kvf_mesh_drop_names[KVF_MESH_DROP_REASONS] = {
    [KVF_MESH_DROP_MALFORMED]       = "malformed",
    [KVF_MESH_DROP_WRONG_TYPE]      = "wrong_type",
    [KVF_MESH_DROP_NO_REPLY_EP]     = "no_reply_ep",
    [KVF_MESH_DROP_UNEXPECTED]      = "unexpected",
    [KVF_MESH_DROP_UNAUTHENTICATED] = "unauthenticated",
};

static void kvf_mesh_on_auth_tick(evutil_socket_t fd, short what, void *arg);
static void kvf_mesh_on_defer(evutil_socket_t fd, short what, void *arg);
static void kvf_mesh_on_notify(evutil_socket_t fd, short what, void *arg);
static kvf_status_t kvf_mesh_on_auth(void *arg, const void *header,
                                     size_t header_len,
                                     const kvf_ucx_am_msg_t *msg);

/* An operation is back after the worker ran out: the deferred sends go
 * on the next pass of the loop rather than at the retry timer. */
static void kvf_mesh_on_ops_freed(void *arg)
{
    kvf_mesh_t *mesh = arg;

    if (mesh->num_deferred > 0) {
        event_active(mesh->defer_ev, EV_TIMEOUT, 1);
    }
}

kvf_status_t kvf_mesh_create(const kvf_mesh_params_t *params,
                             kvf_mesh_t **mesh_p)
{
    kvf_status_t status = KVF_ERR_NO_MEMORY;
    kvf_mesh_t *mesh;

    if ((params == NULL) || (params->worker == NULL) ||
        (params->base == NULL)) {
        return KVF_ERR_INVALID;
    }
    mesh = calloc(1, sizeof(*mesh));
    if (mesh == NULL) {
        return KVF_ERR_NO_MEMORY;
    }
    mesh->worker = params->worker;
    mesh->role   = params->role;
    mesh->secret =
        kvf_auth_secret_is_set(params->secret) ? params->secret : NULL;
    mesh->auth_timeout_ns = (params->auth_timeout_ns > 0)
                                ? params->auth_timeout_ns
                                : 5 * KVF_NSEC_PER_SEC;
    snprintf(mesh->name, sizeof(mesh->name), "%s",
             (params->name != NULL) ? params->name : "agent");
    mesh->auth_ev   = evtimer_new(params->base, kvf_mesh_on_auth_tick, mesh);
    mesh->notify_ev = event_new(params->base, -1, 0, kvf_mesh_on_notify, mesh);
    mesh->defer_ev  = evtimer_new(params->base, kvf_mesh_on_defer, mesh);
    TAILQ_INIT(&mesh->deferred);
    if ((mesh->auth_ev == NULL) || (mesh->notify_ev == NULL) ||
        (mesh->defer_ev == NULL)) {
        goto err;
    }
    status = kvf_ucx_am_set_handler(mesh->worker, KVF_MESH_AM_AUTH,
                                    kvf_mesh_on_auth, mesh);
    if (status != KVF_OK) {
        goto err;
    }
    /* told by the worker, which is destroyed before the mesh */
    kvf_ucx_worker_on_ops_freed(mesh->worker, kvf_mesh_on_ops_freed, mesh);
    *mesh_p = mesh;
    return KVF_OK;

err:
    kvf_mesh_destroy(mesh);
    return status;
}

static void kvf_mesh_link_free(kvf_mesh_link_t *link)
{
    kvf_mesh_waiter_t *w;

    while ((w = link->waiters) != NULL) {
        link->waiters = w->next;
        free(w);
    }
    kvf_auth_session_cleanup(&link->session);
    free(link);
}

static void kvf_mesh_deferred_fail(kvf_mesh_t *mesh, kvf_mesh_msg_t *m,
                                   kvf_status_t status);

void kvf_mesh_close(kvf_mesh_t *mesh)
{
    kvf_mesh_link_t *link;
    kvf_mesh_msg_t *m;
    kvf_ucx_ep_t *ep;

    if (mesh == NULL) {
        return;
    }
    mesh->is_closed = true;
    /* their owners learn it as those of operations in flight will */
    while ((m = TAILQ_FIRST(&mesh->deferred)) != NULL) {
        kvf_mesh_deferred_fail(mesh, m, KVF_ERR_CANCELED);
    }
    while ((link = mesh->links) != NULL) {
        mesh->links = link->next;
        ep          = link->ep;
        kvf_ucx_ep_set_user(ep, NULL);
        kvf_mesh_link_free(link);
        kvf_ucx_ep_put(ep);
    }
}

void kvf_mesh_destroy(kvf_mesh_t *mesh)
{
    kvf_mesh_link_t *link;

    if (mesh == NULL) {
        return;
    }
    /* without kvf_mesh_close, the worker went first and freed the
     * endpoints */
    while ((link = mesh->links) != NULL) {
        mesh->links = link->next;
        kvf_mesh_link_free(link);
    }
    if (mesh->auth_ev != NULL) {
        event_free(mesh->auth_ev);
    }
    if (mesh->notify_ev != NULL) {
        event_free(mesh->notify_ev);
    }
    if (mesh->defer_ev != NULL) {
        event_free(mesh->defer_ev);
    }
    /* deferred frames go unsent and untold: their owners go too, and the
     * worker freed their endpoints */
    while (!TAILQ_EMPTY(&mesh->deferred)) {
        kvf_mesh_msg_t *m = TAILQ_FIRST(&mesh->deferred);

        TAILQ_REMOVE(&mesh->deferred, m, link);
        free(m);
    }
    free(mesh);
}

kvf_ucx_worker_t *kvf_mesh_worker(const kvf_mesh_t *mesh)
{
    return mesh->worker;
}

kvf_status_t kvf_mesh_set_handler(kvf_mesh_t *mesh, kvf_mesh_am_t id,
                                  kvf_ucx_am_cb_t cb, void *arg)
{
    return kvf_ucx_am_set_handler(mesh->worker, (unsigned)id, cb, arg);
}

static void kvf_mesh_on_sent(kvf_status_t status, void *arg)
{
    kvf_mesh_msg_t *m     = arg;
    kvf_mesh_sent_cb_t cb = m->cb;
    void *cb_arg          = m->arg;
    uint64_t tag          = m->tag;

    free(m);
    if (cb != NULL) {
        cb(status, cb_arg, tag);
    }
}

/* Sends @p p on @p ep (kvf_ucx_am_send, or kvf_ucx_am_send_iov with an
 * iov). */
static kvf_status_t kvf_mesh_am_send(kvf_ucx_ep_t *ep, unsigned id,
                                     const kvf_mesh_am_payload_t *p,
                                     uint64_t timeout_ns, kvf_ucx_op_cb_t cb,
                                     void *arg)
{
    if (p->iov != NULL) {
        return kvf_ucx_am_send_iov(ep, id, p->header, p->header_len, p->iov,
                                   p->iovcnt, p->flags, timeout_ns, cb, arg);
    }
    return kvf_ucx_am_send(ep, id, p->header, p->header_len, p->data, p->len,
                           p->mem, p->flags, timeout_ns, cb, arg);
}

/* Sends deferred @p m (still in mesh->deferred) with what is left of its
 * time. KVF_ERR_BUSY: it stays deferred; otherwise it left the queue, and
 * a message's record is freed when the send went (its own callback
 * follows). */
static kvf_status_t kvf_mesh_deferred_send(kvf_mesh_t *mesh, kvf_mesh_msg_t *m,
                                           uint64_t now)
{
    uint64_t left = m->deadline_ns - now;
    kvf_status_t status;

    if (m->op_cb != NULL) {
        status = kvf_mesh_am_send(m->ep, m->id, &m->am, left, m->op_cb, m->arg);
    } else {
        status =
            kvf_ucx_am_send(m->ep, m->id, NULL, 0, m->frame, m->len, NULL,
                            KVF_UCX_AM_SEND_EAGER, left, kvf_mesh_on_sent, m);
    }
    if (status == KVF_ERR_BUSY) {
        return status; /* still none free */
    }
    TAILQ_REMOVE(&mesh->deferred, m, link);
    mesh->num_deferred--;
    kvf_ucx_ep_put(m->ep);
    if ((status == KVF_OK) && (m->op_cb != NULL)) {
        free(m); /* the header was copied or is the caller's */
    }
    return status;
}

/* A deferred send that will not go (or failed to): its owner is told
 * @p status (from the loop, as a completion would be). @p m has left
 * mesh->deferred. */
static void kvf_mesh_deferred_told(kvf_mesh_msg_t *m, kvf_status_t status)
{
    kvf_ucx_op_cb_t op_cb = m->op_cb;
    void *arg             = m->arg;

    if (op_cb == NULL) {
        kvf_mesh_on_sent(status, m);
        return;
    }
    free(m);
    op_cb(status, arg);
}

static void kvf_mesh_deferred_fail(kvf_mesh_t *mesh, kvf_mesh_msg_t *m,
                                   kvf_status_t status)
{
    TAILQ_REMOVE(&mesh->deferred, m, link);
    mesh->num_deferred--;
    kvf_ucx_ep_put(m->ep);
    kvf_mesh_deferred_told(m, status);
}

/* Sends deferred frames in order while the worker has operations; the
 * rest wait for the next try. */
static void kvf_mesh_on_defer(evutil_socket_t fd, short what, void *arg)
{
    kvf_mesh_t *mesh = arg;
    struct timeval tv;
    kvf_mesh_msg_t *m;
    kvf_status_t status;
    uint64_t now = kvf_time_now_ns();

    while ((m = TAILQ_FIRST(&mesh->deferred)) != NULL) {
        if (kvf_ucx_ep_is_failed(m->ep)) {
            kvf_mesh_deferred_fail(mesh, m, KVF_ERR_CLOSED);
            continue;
        }
        if (now >= m->deadline_ns) {
            kvf_mesh_deferred_fail(mesh, m, KVF_ERR_TIMEOUT);
            continue;
        }
        status = kvf_mesh_deferred_send(mesh, m, now);
        if (status == KVF_ERR_BUSY) {
            break; /* still none free */
        }
        if (status != KVF_OK) {
            kvf_mesh_deferred_told(m, status);
        }
    }
    if (!TAILQ_EMPTY(&mesh->deferred)) {
        tv = kvf_time_to_timeval(KVF_MESH_DEFER_RETRY_NS);
        evtimer_add(mesh->defer_ev, &tv);
    }
}

/* Queues @p m (its payload set) to go on @p ep when the worker has an
 * operation free, by @p timeout_ns; false when the queue is full or the
 * endpoint failed (the caller keeps @p m). */
static bool kvf_mesh_defer(kvf_mesh_t *mesh, kvf_mesh_msg_t *m,
                           kvf_ucx_ep_t *ep, kvf_mesh_am_t id,
                           uint64_t timeout_ns)
{
    struct timeval tv;

    if ((mesh->num_deferred >= KVF_MESH_DEFER_MAX) || mesh->is_closed ||
        kvf_ucx_ep_is_failed(ep)) {
        return false;
    }
    /* the worker's operations are all in use (a burst of pushes, replies
     * or served chunks): sent as they free up, never dropped for that */
    kvf_ucx_ep_hold(ep);
    m->ep          = ep;
    m->id          = (unsigned)id;
    m->deadline_ns = kvf_time_deadline_ns(
        (timeout_ns != 0) ? timeout_ns : KVF_MESH_DEFER_TIMEOUT_NS);
    TAILQ_INSERT_TAIL(&mesh->deferred, m, link);
    if (mesh->num_deferred++ == 0) {
        tv = kvf_time_to_timeval(KVF_MESH_DEFER_RETRY_NS);
        evtimer_add(mesh->defer_ev, &tv);
    }
    mesh->stats.deferred++;
    return true;
}

kvf_status_t kvf_mesh_send_frame(kvf_mesh_t *mesh, kvf_ucx_ep_t *ep,
                                 kvf_mesh_am_t id, uint16_t type,
                                 const ProtobufCMessage *msg,
                                 uint64_t timeout_ns, kvf_mesh_sent_cb_t cb,
                                 void *arg, uint64_t tag)
{
    size_t len = kvf_frame_size(msg);
    kvf_mesh_msg_t *m;
    kvf_status_t status;

    m = malloc(sizeof(*m) + len);
    if (m == NULL) {
        return KVF_ERR_NO_MEMORY;
    }
    m->cb    = cb;
    m->op_cb = NULL;
    m->arg   = arg;
    m->tag   = tag;
    status = kvf_frame_pack(m->frame, len, type, 0, msg, KVF_FRAME_MAX_DEFAULT,
                            &m->len);
    if ((status == KVF_OK) && TAILQ_EMPTY(&mesh->deferred)) {
        status = kvf_ucx_am_send(ep, (unsigned)id, NULL, 0, m->frame, m->len,
                                 NULL, KVF_UCX_AM_SEND_EAGER, timeout_ns,
                                 kvf_mesh_on_sent, m);
    } else if (status == KVF_OK) {
        status = KVF_ERR_BUSY; /* behind the deferred ones, in order */
    }
    if ((status == KVF_ERR_BUSY) &&
        kvf_mesh_defer(mesh, m, ep, id, timeout_ns)) {
        return KVF_OK;
    }
    if (status != KVF_OK) {
        free(m);
    }
    return status;
}

kvf_status_t kvf_mesh_send_am(kvf_mesh_t *mesh, kvf_ucx_ep_t *ep,
                              kvf_mesh_am_t id,
                              const kvf_mesh_am_payload_t *payload,
                              uint64_t timeout_ns, kvf_ucx_op_cb_t cb,
                              void *arg)
{
    bool is_copied      = (payload->header_len <= KVF_UCX_AM_HEADER_MAX);
    kvf_status_t status = KVF_ERR_BUSY;
    kvf_mesh_msg_t *m;

    if (TAILQ_EMPTY(&mesh->deferred)) {
        status = kvf_mesh_am_send(ep, (unsigned)id, payload, timeout_ns, cb,
                                  arg); /* no allocation on this path */
    }
    if (status != KVF_ERR_BUSY) {
        return status;
    }
    /* behind the deferred ones, in order, or none free */
    m = calloc(1, sizeof(*m) + (is_copied ? payload->header_len : 0));
    if (m == NULL) {
        return KVF_ERR_NO_MEMORY;
    }
    m->op_cb = cb;
    m->arg   = arg;
    m->am    = *payload;
    if (is_copied && (payload->header_len > 0)) {
        memcpy(m->frame, payload->header, payload->header_len);
        m->am.header = m->frame;
    }
    if (!kvf_mesh_defer(mesh, m, ep, id, timeout_ns)) {
        free(m);
        return KVF_ERR_BUSY;
    }
    return KVF_OK;
}

kvf_status_t kvf_mesh_decode(kvf_mesh_t *mesh, const void *buf, size_t len,
                             size_t max, const uint16_t *types,
                             unsigned num_types, const char *what,
                             kvf_frame_t *frame_p)
{
    kvf_status_t status = KVF_ERR_PROTO;
    size_t used         = 0;
    unsigned i;

    if ((buf != NULL) && (len <= max)) {
        status =
            kvf_frame_decode_buf(buf, len, (uint32_t)max, NULL, frame_p, &used);
    }
    if (status != KVF_OK) {
        mesh->stats.dropped[KVF_MESH_DROP_MALFORMED]++;
        kvf_debug("%s: bad %s (%zu bytes): %s; dropped", mesh->name, what, len,
                  kvf_strerror(status));
        return KVF_ERR_PROTO;
    }
    for (i = 0; i < num_types; i++) {
        if (frame_p->type == types[i]) {
            return KVF_OK;
        }
    }
    mesh->stats.dropped[KVF_MESH_DROP_WRONG_TYPE]++;
    kvf_debug("%s: %s sent as %s; dropped", mesh->name,
              kvf_msg_type_name(frame_p->type), what);
    kvf_frame_release(frame_p, NULL);
    return KVF_ERR_PROTO;
}

uint64_t kvf_mesh_random_id(kvf_mesh_t *mesh)
{
    uint64_t id = 0;

    while (id == 0) {
        if ((mesh->random_used == 0) ||
            (mesh->random_used + sizeof(id) > sizeof(mesh->random))) {
            /* OpenSSL's DRBG, a few ids per call */
            if (kvf_auth_nonce(mesh->random) != KVF_OK) {
                kvf_fatal("%s: no random ids", mesh->name);
            }
            mesh->random_used = 0;
        }
        memcpy(&id, mesh->random + mesh->random_used, sizeof(id));
        mesh->random_used += sizeof(id);
    }
    return id;
}

void kvf_mesh_drop(kvf_mesh_t *mesh, kvf_mesh_drop_t why)
{
    if ((unsigned)why < KVF_MESH_DROP_REASONS) {
        mesh->stats.dropped[why]++;
    }
}

void kvf_mesh_get_stats(const kvf_mesh_t *mesh, kvf_mesh_stats_t *stats_p)
{
    *stats_p = mesh->stats;
}

const char *kvf_mesh_drop_name(kvf_mesh_drop_t why)
{
    return ((unsigned)why < KVF_MESH_DROP_REASONS) ? kvf_mesh_drop_names[why]
                                                   : "unknown";
}

/* ------------------------------------------------------ node directory */

const char *kvf_mesh_node_by_id(const kvf_mesh_t *mesh, uint32_t node_id)
{
    unsigned i;

    if (node_id == 0) {
        return NULL;
    }
    for (i = 0; i < KVF_MESH_NODES; i++) {
        if ((mesh->nodes[i].node_id == node_id) &&
            (mesh->nodes[i].address[0] != '\0')) {
            return mesh->nodes[i].address;
        }
    }
    return NULL;
}

const char *kvf_mesh_node_name(const kvf_mesh_t *mesh, uint32_t node_id)
{
    unsigned i;

    for (i = 0; (i < KVF_MESH_NODES) && (node_id != 0); i++) {
        if ((mesh->nodes[i].node_id == node_id) &&
            (mesh->nodes[i].address[0] != '\0') &&
            (mesh->nodes[i].name[0] != '\0')) {
            return mesh->nodes[i].name;
        }
    }
    return NULL;
}

const char *kvf_mesh_node_by_name(const kvf_mesh_t *mesh, const char *name,
                                  uint32_t *node_id_p)
{
    unsigned i;

    if ((name == NULL) || (name[0] == '\0')) {
        return NULL;
    }
    for (i = 0; i < KVF_MESH_NODES; i++) {
        if ((mesh->nodes[i].address[0] != '\0') &&
            (strcmp(mesh->nodes[i].name, name) == 0)) {
            if (node_id_p != NULL) {
                *node_id_p = mesh->nodes[i].node_id;
            }
            return mesh->nodes[i].address;
        }
    }
    return NULL;
}

void kvf_mesh_node_store(kvf_mesh_t *mesh, uint32_t node_id, const char *name,
                         const char *address)
{
    char kept[KVF_MESH_NAME_MAX] = "";
    kvf_mesh_node_t *n           = NULL;
    unsigned i;

    if ((address == NULL) || (strlen(address) >= KVF_MESH_ADDR_MAX) ||
        ((name != NULL) && (strlen(name) >= KVF_MESH_NAME_MAX))) {
        return;
    }
    if ((name == NULL) || (name[0] == '\0')) {
        /* keep the name an earlier answer gave this node */
        for (i = 0; (i < KVF_MESH_NODES) && (node_id != 0); i++) {
            if ((mesh->nodes[i].node_id == node_id) &&
                (mesh->nodes[i].address[0] != '\0')) {
                snprintf(kept, sizeof(kept), "%s", mesh->nodes[i].name);
                break;
            }
        }
        name = kept;
    }
    /* one entry per node: the same id, or the same name */
    kvf_mesh_node_forget(mesh, node_id, name);
    for (i = 0; i < KVF_MESH_NODES; i++) {
        if (mesh->nodes[i].address[0] == '\0') {
            n = &mesh->nodes[i];
            break;
        }
    }
    if (n == NULL) {
        n               = &mesh->nodes[mesh->next_node];
        mesh->next_node = (mesh->next_node + 1) % KVF_MESH_NODES;
    }
    n->node_id = node_id;
    snprintf(n->name, sizeof(n->name), "%s", (name != NULL) ? name : "");
    snprintf(n->address, sizeof(n->address), "%s", address);
}

void kvf_mesh_node_forget(kvf_mesh_t *mesh, uint32_t node_id, const char *name)
{
    kvf_mesh_node_t *n;
    unsigned i;

    for (i = 0; i < KVF_MESH_NODES; i++) {
        n = &mesh->nodes[i];
        if (n->address[0] == '\0') {
            continue;
        }
        if (((node_id != 0) && (n->node_id == node_id)) ||
            ((name != NULL) && (name[0] != '\0') &&
             (strcmp(n->name, name) == 0))) {
            memset(n, 0, sizeof(*n));
        }
    }
}

/* ------------------------------------------------ authenticated links */

/* A LOOKUP reply named a holder's address: the directory keeps it, so
 * the fetch that follows needs no NODE_INFO. */
static void kvf_mesh_on_node_learn(void *arg, uint32_t node_id,
                                   const char *name, const char *data_address)
{
    kvf_mesh_t *mesh  = arg;
    const char *known = kvf_mesh_node_by_id(mesh, node_id);

    if ((known != NULL) && (strcmp(known, data_address) == 0) &&
        ((name[0] == '\0') ||
         (kvf_mesh_node_by_name(mesh, name, NULL) == known))) {
        return; /* known already: no churn per lookup */
    }
    kvf_mesh_node_store(mesh, node_id, name, data_address);
}

void kvf_mesh_set_ctl(kvf_mesh_t *mesh, kvf_ctl_client_t *ctl)
{
    mesh->ctl = ctl;
    if (ctl != NULL) {
        kvf_ctl_client_set_node_learn(ctl, kvf_mesh_on_node_learn, mesh);
    }
}

bool kvf_mesh_is_secure(const kvf_mesh_t *mesh)
{
    return mesh->secret != NULL;
}

static kvf_mesh_link_t *kvf_mesh_link_of(const kvf_ucx_ep_t *ep)
{
    return (ep != NULL) ? kvf_ucx_ep_user(ep) : NULL;
}

/* "ID/ROLE/NAME": what this node proves to be. */
static void kvf_mesh_ident(const kvf_mesh_t *mesh, char *buf, size_t len)
{
    uint32_t id = (mesh->ctl != NULL) ? kvf_ctl_client_node_id(mesh->ctl) : 0;

    snprintf(buf, len, "%" PRIu32 "/%" PRIu32 "/%s", id, mesh->role,
             mesh->name);
}

static bool kvf_mesh_ident_parse(const char *ident, uint32_t *id_p,
                                 uint32_t *role_p, char *name, size_t len)
{
    unsigned long id, role;
    char *end;

    id = strtoul(ident, &end, 10);
    if ((end == ident) || (*end != '/') || (id > UINT32_MAX)) {
        return false;
    }
    ident = end + 1;
    role  = strtoul(ident, &end, 10);
    if ((end == ident) || (*end != '/') || (role > UINT32_MAX) ||
        (strlen(end + 1) >= len)) {
        return false;
    }
    *id_p   = (uint32_t)id;
    *role_p = (uint32_t)role;
    snprintf(name, len, "%s", end + 1);
    return true;
}

static void kvf_mesh_auth_sent(kvf_status_t status, void *arg)
{
    free(arg);
}

static void kvf_mesh_auth_send(kvf_mesh_t *mesh, kvf_ucx_ep_t *ep, uint8_t kind,
                               const uint8_t *nonce, const uint8_t *mac,
                               const char *ident)
{
    size_t ident_len              = (ident != NULL) ? strlen(ident) : 0;
    uint32_t magic                = htole32(KVF_MESH_AUTH_MAGIC);
    kvf_mesh_am_payload_t payload = {0};
    uint8_t *buf;

    if (ident_len >= KVF_MESH_IDENT_MAX) {
        return;
    }
    buf = calloc(1, KVF_MESH_AUTH_FIXED + ident_len);
    if (buf == NULL) {
        return;
    }
    memcpy(buf, &magic, sizeof(magic));
    buf[4] = kind;
    buf[5] = (nonce != NULL) ? KVF_AUTH_NONCE_SIZE : 0;
    buf[6] = (mac != NULL) ? KVF_AUTH_MAC_SIZE : 0;
    buf[7] = (uint8_t)ident_len;
    if (nonce != NULL) {
        memcpy(buf + 8, nonce, KVF_AUTH_NONCE_SIZE);
    }
    if (mac != NULL) {
        memcpy(buf + 8 + KVF_AUTH_NONCE_SIZE, mac, KVF_AUTH_MAC_SIZE);
    }
    if (ident_len > 0) {
        memcpy(buf + KVF_MESH_AUTH_FIXED, ident, ident_len);
    }
    payload.data  = buf; /* freed when sent */
    payload.len   = KVF_MESH_AUTH_FIXED + ident_len;
    payload.flags = KVF_UCX_AM_SEND_EAGER;
    /* in a burst it waits for an operation, as any frame does */
    if (kvf_mesh_send_am(mesh, ep, KVF_MESH_AM_AUTH, &payload,
                         mesh->auth_timeout_ns, kvf_mesh_auth_sent,
                         buf) != KVF_OK) {
        free(buf);
    }
}

static bool kvf_mesh_auth_decode(const void *data, size_t len,
                                 kvf_mesh_auth_msg_t *m)
{
    const uint8_t *p = data;
    uint32_t magic;

    if ((p == NULL) || (len < KVF_MESH_AUTH_FIXED) ||
        (len > KVF_MESH_AUTH_MAX)) {
        return false;
    }
    memcpy(&magic, p, sizeof(magic));
    memset(m, 0, sizeof(*m));
    m->kind      = p[4];
    m->nonce_len = p[5];
    m->mac_len   = p[6];
    if ((le32toh(magic) != KVF_MESH_AUTH_MAGIC) ||
        (m->nonce_len > KVF_AUTH_NONCE_SIZE) ||
        (m->mac_len > KVF_AUTH_MAC_SIZE) ||
        ((size_t)p[7] != len - KVF_MESH_AUTH_FIXED)) {
        return false;
    }
    memcpy(m->nonce, p + 8, KVF_AUTH_NONCE_SIZE);
    memcpy(m->mac, p + 8 + KVF_AUTH_NONCE_SIZE, KVF_AUTH_MAC_SIZE);
    memcpy(m->ident, p + KVF_MESH_AUTH_FIXED, p[7]);
    m->ident[p[7]] = '\0';
    return strlen(m->ident) == p[7]; /* no NUL inside */
}

/* Readiness callbacks run from the loop, never inside the caller. */
static void kvf_mesh_notify_arm(kvf_mesh_t *mesh)
{
    event_active(mesh->notify_ev, EV_TIMEOUT, 0);
}

static void kvf_mesh_auth_arm(kvf_mesh_t *mesh)
{
    struct timeval tv = {0, KVF_MESH_AUTH_TICK_US};

    if (!evtimer_pending(mesh->auth_ev, NULL)) {
        evtimer_add(mesh->auth_ev, &tv);
    }
}

static kvf_mesh_link_t *kvf_mesh_link_create(kvf_mesh_t *mesh, kvf_ucx_ep_t *ep,
                                             bool is_client)
{
    kvf_mesh_link_t *link;

    if (mesh->is_closed) {
        return NULL;
    }
    link = calloc(1, sizeof(*link));
    if (link == NULL) {
        return NULL;
    }
    kvf_auth_session_init(&link->session, mesh->secret);
    link->ep          = ep;
    link->is_client   = is_client;
    link->peer_role   = KVF_MESH_ROLE_UNKNOWN;
    link->deadline_ns = kvf_time_deadline_ns(mesh->auth_timeout_ns);
    kvf_ucx_ep_hold(ep);
    kvf_ucx_ep_set_user(ep, link);
    link->next = mesh->links;
    if (mesh->links != NULL) {
        mesh->links->prev = link;
    }
    mesh->links = link;
    kvf_mesh_auth_arm(mesh);
    return link;
}

/* The handshake on @p link cannot complete: waiters learn it, the
 * endpoint fails (a client's leaves the cache; a server's disconnects the
 * peer), and its error callback frees the link. */
static void kvf_mesh_link_fail(kvf_mesh_t *mesh, kvf_mesh_link_t *link,
                               kvf_status_t status, const char *why)
{
    if (link->state == KVF_MESH_LINK_FAILED) {
        return;
    }
    mesh->stats.auth_failures++;
    kvf_warn("%s: peer %s failed the cluster-secret handshake: %s", mesh->name,
             kvf_ucx_ep_peer(link->ep), why);
    link->state = KVF_MESH_LINK_FAILED;
    link->error = status;
    if (link->waiters != NULL) {
        kvf_mesh_notify_arm(mesh);
    }
    kvf_ucx_ep_fail(link->ep, KVF_ERR_AUTH);
}

static void kvf_mesh_link_ready(kvf_mesh_t *mesh, kvf_mesh_link_t *link)
{
    link->state = KVF_MESH_LINK_READY;
    mesh->stats.auth_ok++;
    kvf_debug("%s: peer %s is node %u (%s), role %u", mesh->name,
              kvf_ucx_ep_peer(link->ep), link->peer_id, link->peer_name,
              link->peer_role);
    if (link->waiters != NULL) {
        kvf_mesh_notify_arm(mesh);
    }
}

static void kvf_mesh_on_notify(evutil_socket_t fd, short what, void *arg)
{
    kvf_mesh_t *mesh = arg;
    kvf_mesh_link_t *link;
    kvf_mesh_waiter_t *w;
    kvf_status_t status;

restart:
    for (link = mesh->links; link != NULL; link = link->next) {
        if ((link->waiters == NULL) ||
            ((link->state != KVF_MESH_LINK_READY) &&
             (link->state != KVF_MESH_LINK_FAILED))) {
            continue;
        }
        status = (link->state == KVF_MESH_LINK_READY) ? KVF_OK : link->error;
        w      = link->waiters;
        link->waiters = w->next;
        /* a callback may connect again, or fail endpoints: start over */
        w->cb(w->arg, status, link->ep, w->tag);
        free(w);
        goto restart;
    }
}

static void kvf_mesh_on_auth_tick(evutil_socket_t fd, short what, void *arg)
{
    kvf_mesh_t *mesh = arg;
    uint64_t now     = kvf_time_now_ns();
    kvf_mesh_link_t *link;
    bool pending = false;

    for (link = mesh->links; link != NULL; link = link->next) {
        if ((link->state == KVF_MESH_LINK_READY) ||
            (link->state == KVF_MESH_LINK_FAILED)) {
            continue;
        }
        if (now >= link->deadline_ns) {
            kvf_mesh_link_fail(mesh, link, KVF_ERR_TIMEOUT,
                               "no answer in time");
        } else {
            pending = true;
        }
    }
    if (pending) {
        kvf_mesh_auth_arm(mesh);
    }
}

kvf_status_t kvf_mesh_connect(kvf_mesh_t *mesh, kvf_ucx_ep_t *ep,
                              uint32_t expect_id, const char *expect_name,
                              kvf_mesh_ready_cb_t cb, void *arg, uint64_t tag)
{
    kvf_mesh_link_t *link = kvf_mesh_link_of(ep);
    char ident[KVF_MESH_IDENT_MAX];
    kvf_mesh_waiter_t *w;
    size_t len = 0;

    if (mesh->secret == NULL) {
        return KVF_OK;
    }
    if (link != NULL) {
        if (link->state == KVF_MESH_LINK_READY) {
            return KVF_OK;
        }
        if ((link->state == KVF_MESH_LINK_FAILED) || !link->is_client) {
            return KVF_ERR_AUTH;
        }
    }
    w = calloc(1, sizeof(*w));
    if (w == NULL) {
        return KVF_ERR_NO_MEMORY;
    }
    if (link == NULL) {
        link = kvf_mesh_link_create(mesh, ep, true);
        if ((link == NULL) ||
            (kvf_auth_client_hello(&link->session, &len) != KVF_OK)) {
            free(w);
            return KVF_ERR_NO_MEMORY;
        }
        link->expect_id = expect_id;
        snprintf(link->expect_name, sizeof(link->expect_name), "%s",
                 (expect_name != NULL) ? expect_name : "");
        kvf_mesh_ident(mesh, ident, sizeof(ident));
        kvf_mesh_auth_send(mesh, ep, KVF_MESH_AUTH_HELLO,
                           link->session.own_nonce, NULL, ident);
    }
    w->cb         = cb;
    w->arg        = arg;
    w->tag        = tag;
    w->next       = link->waiters;
    link->waiters = w;
    return KVF_INPROGRESS;
}

bool kvf_mesh_is_ready(const kvf_mesh_t *mesh, const kvf_ucx_ep_t *ep)
{
    const kvf_mesh_link_t *link = kvf_mesh_link_of(ep);

    return (mesh->secret == NULL) ||
           ((link != NULL) && (link->state == KVF_MESH_LINK_READY));
}

bool kvf_mesh_accept(kvf_mesh_t *mesh, const kvf_ucx_am_msg_t *msg)
{
    if (kvf_mesh_is_ready(mesh, msg->reply_ep)) {
        return true;
    }
    mesh->stats.dropped[KVF_MESH_DROP_UNAUTHENTICATED]++;
    kvf_debug("%s: message from unauthenticated peer %s; dropped", mesh->name,
              (msg->reply_ep != NULL) ? kvf_ucx_ep_peer(msg->reply_ep) : "?");
    return false;
}

uint32_t kvf_mesh_peer_role(const kvf_mesh_t *mesh, const kvf_ucx_ep_t *ep)
{
    const kvf_mesh_link_t *link = kvf_mesh_link_of(ep);

    if ((mesh->secret == NULL) || (link == NULL) ||
        (link->state != KVF_MESH_LINK_READY)) {
        return KVF_MESH_ROLE_UNKNOWN;
    }
    return link->peer_role;
}

uint32_t kvf_mesh_peer_id(const kvf_mesh_t *mesh, const kvf_ucx_ep_t *ep)
{
    const kvf_mesh_link_t *link = kvf_mesh_link_of(ep);

    if ((mesh->secret == NULL) || (link == NULL) ||
        (link->state != KVF_MESH_LINK_READY)) {
        return 0;
    }
    return link->peer_id;
}

const char *kvf_mesh_peer_name(const kvf_mesh_t *mesh, const kvf_ucx_ep_t *ep)
{
    const kvf_mesh_link_t *link = kvf_mesh_link_of(ep);

    if ((mesh->secret == NULL) || (link == NULL) ||
        (link->state != KVF_MESH_LINK_READY) || (link->peer_name[0] == '\0')) {
        return NULL;
    }
    return link->peer_name;
}

void kvf_mesh_ep_failed(kvf_mesh_t *mesh, kvf_ucx_ep_t *ep)
{
    kvf_mesh_link_t *link = kvf_mesh_link_of(ep);
    kvf_mesh_waiter_t *w;

    if ((mesh == NULL) || (link == NULL)) {
        return;
    }
    kvf_ucx_ep_set_user(ep, NULL);
    if (link->prev != NULL) {
        link->prev->next = link->next;
    } else {
        mesh->links = link->next;
    }
    if (link->next != NULL) {
        link->next->prev = link->prev;
    }
    while ((w = link->waiters) != NULL) {
        link->waiters = w->next;
        w->cb(w->arg,
              (link->state == KVF_MESH_LINK_FAILED) ? link->error
                                                    : KVF_ERR_CLOSED,
              ep, w->tag);
        free(w);
    }
    kvf_mesh_link_free(link);
    kvf_ucx_ep_put(ep);
}

/* Server: a peer says HELLO with its nonce and identity. */
static void kvf_mesh_auth_on_hello(kvf_mesh_t *mesh, kvf_ucx_ep_t *ep,
                                   const kvf_mesh_auth_msg_t *m)
{
    uint8_t mac[KVF_AUTH_MAC_SIZE];
    char ident[KVF_MESH_IDENT_MAX];
    kvf_mesh_link_t *link;
    char err[128];

    if (kvf_mesh_link_of(ep) != NULL) {
        mesh->stats.dropped[KVF_MESH_DROP_UNEXPECTED]++;
        return; /* one handshake per endpoint */
    }
    if (mesh->secret == NULL) {
        /* the peer has a secret, we have none: say so, it gives up */
        kvf_mesh_auth_send(mesh, ep, KVF_MESH_AUTH_REFUSED, NULL, NULL, NULL);
        return;
    }
    link = kvf_mesh_link_create(mesh, ep, false);
    if (link == NULL) {
        return;
    }
    if (!kvf_mesh_ident_parse(m->ident, &link->peer_id, &link->peer_role,
                              link->peer_name, sizeof(link->peer_name))) {
        kvf_mesh_link_fail(mesh, link, KVF_ERR_AUTH, "malformed identity");
        return;
    }
    kvf_mesh_ident(mesh, ident, sizeof(ident));
    if (kvf_auth_server_hello(&link->session, m->ident, m->nonce, m->nonce_len,
                              ident, mac, err, sizeof(err)) != KVF_OK) {
        kvf_mesh_auth_send(mesh, ep, KVF_MESH_AUTH_REFUSED, NULL, NULL, NULL);
        kvf_mesh_link_fail(mesh, link, KVF_ERR_AUTH, err);
        return;
    }
    link->state = KVF_MESH_LINK_CHALLENGED;
    kvf_mesh_auth_send(mesh, ep, KVF_MESH_AUTH_CHALLENGE,
                       link->session.own_nonce, mac, ident);
}

/* Client: the server proved the secret (or not) and challenges us. */
static void kvf_mesh_auth_on_challenge(kvf_mesh_t *mesh, kvf_mesh_link_t *link,
                                       const kvf_mesh_auth_msg_t *m)
{
    uint8_t mac[KVF_AUTH_MAC_SIZE];
    char ident[KVF_MESH_IDENT_MAX];
    char err[128];

    kvf_mesh_ident(mesh, ident, sizeof(ident));
    if (kvf_auth_client_reply(&link->session, m->nonce, m->nonce_len, m->mac,
                              m->mac_len, m->ident, ident, mac, err,
                              sizeof(err)) != KVF_OK) {
        kvf_mesh_link_fail(mesh, link, KVF_ERR_AUTH, err);
        return;
    }
    if (!kvf_mesh_ident_parse(m->ident, &link->peer_id, &link->peer_role,
                              link->peer_name, sizeof(link->peer_name)) ||
        ((link->expect_id != 0) && (link->peer_id != link->expect_id)) ||
        ((link->expect_name[0] != '\0') &&
         (strcmp(link->peer_name, link->expect_name) != 0))) {
        kvf_mesh_link_fail(mesh, link, KVF_ERR_AUTH,
                           "it is not the node we meant to reach");
        return;
    }
    link->state = KVF_MESH_LINK_PROOF_SENT;
    kvf_mesh_auth_send(mesh, link->ep, KVF_MESH_AUTH_PROOF, NULL, mac, NULL);
}

static kvf_status_t kvf_mesh_on_auth(void *arg, const void *header,
                                     size_t header_len,
                                     const kvf_ucx_am_msg_t *msg)
{
    kvf_mesh_t *mesh = arg;
    kvf_mesh_auth_msg_t m;
    kvf_mesh_link_t *link;
    char err[128];

    if (msg->is_rndv || (msg->reply_ep == NULL) ||
        !kvf_mesh_auth_decode(msg->data, msg->length, &m)) {
        mesh->stats.dropped[KVF_MESH_DROP_MALFORMED]++;
        return KVF_OK;
    }
    link = kvf_mesh_link_of(msg->reply_ep);
    if (m.kind == KVF_MESH_AUTH_HELLO) {
        kvf_mesh_auth_on_hello(mesh, msg->reply_ep, &m);
        return KVF_OK;
    }
    if (link == NULL) {
        mesh->stats.dropped[KVF_MESH_DROP_UNEXPECTED]++;
        return KVF_OK;
    }
    switch (m.kind) {
    case KVF_MESH_AUTH_CHALLENGE:
        if (link->is_client && (link->state == KVF_MESH_LINK_HELLO_SENT)) {
            kvf_mesh_auth_on_challenge(mesh, link, &m);
            return KVF_OK;
        }
        break;
    case KVF_MESH_AUTH_PROOF:
        if (!link->is_client && (link->state == KVF_MESH_LINK_CHALLENGED)) {
            if (kvf_auth_server_finish(&link->session, m.mac, m.mac_len, err,
                                       sizeof(err)) != KVF_OK) {
                kvf_mesh_auth_send(mesh, link->ep, KVF_MESH_AUTH_REFUSED, NULL,
                                   NULL, NULL);
                kvf_mesh_link_fail(mesh, link, KVF_ERR_AUTH, err);
                return KVF_OK;
            }
            kvf_mesh_link_ready(mesh, link);
            kvf_mesh_auth_send(mesh, link->ep, KVF_MESH_AUTH_OK, NULL, NULL,
                               NULL);
            return KVF_OK;
        }
        break;
    case KVF_MESH_AUTH_OK:
        if (link->is_client && (link->state == KVF_MESH_LINK_PROOF_SENT)) {
            kvf_mesh_link_ready(mesh, link);
            return KVF_OK;
        }
        break;
    case KVF_MESH_AUTH_REFUSED:
        if (link->is_client && (link->state != KVF_MESH_LINK_READY)) {
            kvf_mesh_link_fail(mesh, link, KVF_ERR_AUTH,
                               "it refused our proof (another secret, or "
                               "none)");
            return KVF_OK;
        }
        break;
    default:
        break;
    }
    mesh->stats.dropped[KVF_MESH_DROP_UNEXPECTED]++;
    return KVF_OK;
}
