/* SPDX-License-Identifier: Apache-2.0 */
/* Copyright (c) 2026 The kvfabric authors */
#include "agent/ctl_client.h"

#include "agent/discover.h"

#include "common/config.h"
#include "common/log.h"
#include "common/tls.h"
#include "common/time.h"
#include "proto/evconn.h"
#include "proto/frame.h"
#include "proto/hello.h"

#include <event2/event.h>

#include <openssl/ssl.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdlib.h>
#include <string.h>
#include <sys/queue.h>
#include <sys/socket.h>
#include <unistd.h>

#define KVF_CTL_BACKOFF_MIN_NS (100ull * KVF_NSEC_PER_MSEC)
#define KVF_CTL_MAX_ADDRS      8
#define KVF_CTL_HEARTBEAT_NS   (1000ull * KVF_NSEC_PER_MSEC)
#define KVF_CTL_MAX_BATCH_KEYS 65536u
/* how often etcd is read while the leader is unknown */
#define KVF_CTL_DISCOVER_POLL_NS (100 * KVF_NSEC_PER_MSEC)
#define KVF_CTL_DISCOVER_CALL_NS (1000ull * KVF_NSEC_PER_MSEC)
#define KVF_CTL_NAMES            64u /* data address -> node name, for logs */

typedef enum {
    KVF_CTL_STATE_IDLE,       /* waiting to reconnect */
    KVF_CTL_STATE_CONNECTING, /* TCP connect in flight */
    KVF_CTL_STATE_HELLO,      /* HELLO sent, waiting for its reply */
    KVF_CTL_STATE_AUTH,       /* AUTH sent, waiting for its STATUS */
    KVF_CTL_STATE_REGISTER,   /* REGISTER sent */
    KVF_CTL_STATE_READY,      /* registered: heartbeats and batches flow */
    KVF_CTL_STATE_STOPPING,   /* DEREGISTER sent */
    KVF_CTL_STATE_STOPPED,
} kvf_ctl_state_t;

/* A LOOKUP or NODE_INFO waiting for its reply. */
typedef struct kvf_ctl_pending {
    TAILQ_ENTRY(kvf_ctl_pending) link; /* client->pending, oldest first */
    uint64_t request_id;
    uint64_t deadline_ns;
    uint16_t reply_type;  /* KVF_MSG_LOOKUP_REPLY or KVF_MSG_NODE_INFO_REPLY */
    uint32_t num;         /* keys asked (lookup) */
    uint32_t node_id;     /* node asked (node info); 0: by name */
    char node_name[128];  /* node asked by name (node info, node_id 0) */
    kvf_status_t failure; /* KVF_OK, or a status to deliver at once */
    kvf_ctl_lookup_cb_t lookup_cb;
    kvf_ctl_node_cb_t node_cb;
    void *arg;
} kvf_ctl_pending_t;

/* A growing array of packed 24-byte keys. */
typedef struct kvf_ctl_keybuf {
    uint8_t *data;
    size_t len; /* bytes */
    size_t cap;
} kvf_ctl_keybuf_t;

struct kvf_ctl_client {
    struct event_base *base;
    kvf_evconn_group_t group;   /* of the one connection */
    kvf_evconn_t *conn;         /* NULL: none */
    struct event *retry_ev;     /* reconnect backoff */
    struct event *deadline_ev;  /* connect/HELLO/REGISTER/DEREGISTER */
    struct event *heartbeat_ev; /* periodic, while READY */
    struct event *flush_ev;     /* ADMIT/EVICT coalescing */
    struct event *pending_ev;   /* request deadlines and deferred failures */
    /* requests sent, oldest first: the controller answers one connection
     * in order, so a reply is found at the head */
    TAILQ_HEAD(, kvf_ctl_pending) pending;
    kvf_ctl_state_t state;
    struct sockaddr_storage addr; /* the one tried now: addrs[addr_idx] */
    socklen_t addr_len;
    /* "controller" may list several (HA on etcd: only the leader listens);
     * every reset moves on to the next */
    struct sockaddr_storage addrs[KVF_CTL_MAX_ADDRS];
    socklen_t addr_lens[KVF_CTL_MAX_ADDRS];
    unsigned num_addrs, addr_idx;
    uint64_t term; /* highest leader term seen (HA on etcd), kept */
    /* with etcd: the leader it names is the one address (addrs[0]) */
    kvf_discover_t *discover;

    char *controller;
    char *name;
    int role;
    uint8_t *worker_address;
    size_t worker_address_len;
    char *data_address;
    char *control_address;
    char *instance_id;
    uint64_t pool_capacity;
    uint32_t tp_rank, tp_world;
    uint64_t connect_timeout_ns, request_timeout_ns, reconnect_max_ns;
    uint64_t flush_ns;
    uint32_t max_frame;
    size_t max_batch_keys;
    const kvf_ctl_client_ops_t *ops;
    void *arg;
    kvf_auth_session_t auth; /* the handshake of the current connection */
    SSL_CTX *tls_ctx;        /* NULL: plain TCP */
    char *tls_server_name;

    uint64_t incarnation;  /* this agent process's start, ns since epoch */
    uint64_t next_request; /* request id of the next request */
    uint64_t seq;          /* of the last ADMIT/EVICT batch sent */
    uint32_t node_id;
    uint64_t backoff_ns;
    uint64_t heartbeat_ns;
    uint64_t lease_ns;
    uint64_t last_reply_ns; /* last frame from the controller */
    uint64_t dereg_request; /* request id of the DEREGISTER sent */
    bool stop_requested;
    bool is_replace;  /* --replace, until the first registration */
    bool is_draining; /* reported in REGISTER */
    /* the last failure logged at warn: the same one again goes to debug,
     * so an unreachable controller is one line, not one per retry */
    char problem[320];
    struct {
        char address[96];
        char name[64];
    } names[KVF_CTL_NAMES]; /* filled round robin from NODE_INFO replies */
    unsigned next_name;
    kvf_ctl_node_learn_cb_t node_learn_cb; /* holders' addresses: LOOKUP */
    void *node_learn_arg;

    uint16_t batch_type;      /* KVF_MSG_ADMIT or KVF_MSG_EVICT */
    Kvf__Medium batch_medium; /* of the ADMIT batch */
    kvf_ctl_keybuf_t batch;
    Kvf__Medium inventory_medium; /* of the inventory batch being filled */
    kvf_ctl_keybuf_t inventory;
    kvf_ctl_client_stats_t stats;
};

static void kvf_ctl_client_connect(kvf_ctl_client_t *client);
static void kvf_ctl_client_reset(kvf_ctl_client_t *client, const char *why);
static void kvf_ctl_client_fail_pending(kvf_ctl_client_t *client,
                                        kvf_status_t status);
static kvf_ctl_pending_t *kvf_ctl_client_take(kvf_ctl_client_t *client,
                                              uint64_t request_id);
static void kvf_ctl_pending_finish(kvf_ctl_pending_t *p, kvf_status_t status);

static const Kvf__Role kvf_ctl_roles[] = {
    KVF__ROLE__ROLE_BOTH, KVF__ROLE__ROLE_PREFILL, KVF__ROLE__ROLE_DECODE};

static kvf_status_t kvf_ctl_keybuf_reserve(kvf_ctl_keybuf_t *buf, size_t add)
{
    size_t cap;
    uint8_t *data;

    if (buf->len + add <= buf->cap) {
        return KVF_OK;
    }
    cap = (buf->cap == 0) ? 64 * KVF_KEY_WIRE_SIZE : buf->cap * 2;
    while (cap < buf->len + add) {
        cap *= 2;
    }
    data = realloc(buf->data, cap);
    if (data == NULL) {
        return KVF_ERR_NO_MEMORY;
    }
    buf->data = data;
    buf->cap  = cap;
    return KVF_OK;
}

static void kvf_ctl_client_arm(struct event *ev, uint64_t ns)
{
    struct timeval tv = kvf_time_to_timeval(ns);

    evtimer_add(ev, &tv);
}

/* Encodes one frame on the connection; a failure resets it. */
static kvf_status_t kvf_ctl_client_send(kvf_ctl_client_t *client, uint16_t type,
                                        const ProtobufCMessage *msg)
{
    kvf_status_t status;

    if (client->conn == NULL) {
        return KVF_ERR_CLOSED;
    }
    status = kvf_evconn_request(client->conn, type, msg);
    if (status != KVF_OK) {
        kvf_error("controller %s: cannot send %s: %s", client->controller,
                  kvf_msg_type_name(type), kvf_strerror(status));
        client->stats.errors++;
    }
    return status;
}

static void kvf_ctl_client_send_hello(kvf_ctl_client_t *client)
{
    Kvf__Hello hello;
    size_t nonce_len;

    kvf_auth_session_init(&client->auth, client->auth.secret);
    if (kvf_auth_client_hello(&client->auth, &nonce_len) != KVF_OK) {
        kvf_ctl_client_reset(client, "no auth nonce");
        return;
    }
    kvf__hello__init(&hello);
    hello.auth_nonce.data  = client->auth.own_nonce;
    hello.auth_nonce.len   = nonce_len;
    hello.request_id       = client->next_request++;
    hello.protocol_version = KVF_PROTOCOL_VERSION;
    hello.kind             = KVF__PEER_KIND__PEER_AGENT;
    hello.name             = client->name;
    hello.role             = kvf_ctl_roles[client->role];
    kvf_ctl_client_send(client, KVF_MSG_HELLO, &hello.base);
}

/*
 * The data address peers should use. An agent listening on a wildcard
 * (0.0.0.0, ::) cannot tell peers "0.0.0.0": it advertises instead the
 * local address of its controller connection (the interface that reaches
 * the cluster) with the listen port. Writes into @p buf and returns it, or
 * returns the configured address unchanged.
 */
static char *kvf_ctl_client_advertised(kvf_ctl_client_t *client, char *buf,
                                       size_t len)
{
    const char *colon = strrchr(client->data_address, ':');
    struct sockaddr_storage ss;
    socklen_t sslen = sizeof(ss);
    char host[INET6_ADDRSTRLEN];
    size_t hlen;
    int fd;

    if (colon == NULL) {
        return client->data_address;
    }
    hlen = (size_t)(colon - client->data_address);
    if (!((hlen == 0) ||
          ((hlen == 7) && (strncmp(client->data_address, "0.0.0.0", 7) == 0)) ||
          ((hlen == 2) && (strncmp(client->data_address, "::", 2) == 0)) ||
          ((hlen == 4) && (strncmp(client->data_address, "[::]", 4) == 0)))) {
        return client->data_address;
    }
    fd = (client->conn != NULL) ? kvf_evconn_fd(client->conn) : -1;
    if ((fd < 0) || (getsockname(fd, (struct sockaddr *)&ss, &sslen) != 0)) {
        return client->data_address;
    }
    if (ss.ss_family == AF_INET) {
        inet_ntop(AF_INET, &((struct sockaddr_in *)&ss)->sin_addr, host,
                  sizeof(host));
        snprintf(buf, len, "%s%s", host, colon);
    } else if (ss.ss_family == AF_INET6) {
        inet_ntop(AF_INET6, &((struct sockaddr_in6 *)&ss)->sin6_addr, host,
                  sizeof(host));
        snprintf(buf, len, "[%s]%s", host, colon);
    } else {
        return client->data_address;
    }
    return buf;
}

static void kvf_ctl_client_send_register(kvf_ctl_client_t *client)
{
    char advertised[INET6_ADDRSTRLEN + 16];
    Kvf__Register reg;

    kvf__register__init(&reg);
    reg.request_id          = client->next_request++;
    reg.name                = client->name;
    reg.role                = kvf_ctl_roles[client->role];
    reg.worker_address.data = client->worker_address;
    reg.worker_address.len  = client->worker_address_len;
    reg.control_address     = client->control_address;
    reg.data_address =
        kvf_ctl_client_advertised(client, advertised, sizeof(advertised));
    reg.pool_capacity = client->pool_capacity;
    reg.incarnation   = client->incarnation;
    reg.instance_id   = client->instance_id;
    reg.tp_rank       = client->tp_rank;
    reg.tp_world      = client->tp_world;
    reg.replace       = client->is_replace;
    reg.draining      = client->is_draining;
    if (kvf_ctl_client_send(client, KVF_MSG_REGISTER, &reg.base) == KVF_OK) {
        client->state = KVF_CTL_STATE_REGISTER;
        kvf_ctl_client_arm(client->deadline_ev, client->request_timeout_ns);
    }
}

/* Checks the controller's proof and answers its challenge, or registers
 * at once when authentication is off on both sides. */
static void kvf_ctl_client_on_hello_reply(kvf_ctl_client_t *client,
                                          const Kvf__HelloReply *hello)
{
    uint8_t mac[KVF_AUTH_MAC_SIZE];
    char text[256];
    Kvf__Auth auth;

    if (hello->status != KVF_OK) {
        snprintf(text, sizeof(text), "refused HELLO: %s (%.200s)",
                 kvf_strerror((kvf_status_t)hello->status),
                 (hello->message != NULL) ? hello->message : "");
        kvf_ctl_client_reset(client, text);
        return;
    }
    if (kvf_hello_client_auth(&client->auth, hello, client->name, &auth, mac,
                              text, sizeof(text)) != KVF_OK) {
        client->stats.errors++;
        kvf_ctl_client_reset(client, text);
        return;
    }
    if (client->auth.state != KVF_AUTH_STATE_CHALLENGED) {
        kvf_ctl_client_send_register(client);
        return;
    }
    auth.request_id = client->next_request++;
    if (kvf_ctl_client_send(client, KVF_MSG_AUTH, &auth.base) == KVF_OK) {
        client->state = KVF_CTL_STATE_AUTH;
        kvf_ctl_client_arm(client->deadline_ev, client->request_timeout_ns);
    }
}

/* Sends the pending ADMIT or EVICT batch, if any. */
static void kvf_ctl_client_flush(kvf_ctl_client_t *client)
{
    Kvf__KeyBatch batch;
    size_t keys;

    if (client->batch.len == 0) {
        return;
    }
    if (client->state != KVF_CTL_STATE_READY) {
        client->batch.len = 0; /* superseded by the inventory on reconnect */
        return;
    }
    keys = client->batch.len / KVF_KEY_WIRE_SIZE;
    kvf__key_batch__init(&batch);
    batch.request_id  = client->next_request++;
    batch.node_id     = client->node_id;
    batch.incarnation = client->incarnation;
    batch.seq         = ++client->seq;
    batch.keys.data   = client->batch.data;
    batch.keys.len    = client->batch.len;
    batch.medium      = client->batch_medium;
    if (kvf_ctl_client_send(client, client->batch_type, &batch.base) ==
        KVF_OK) {
        client->stats.batches++;
        if (client->batch_type == KVF_MSG_ADMIT) {
            client->stats.admitted_keys += keys;
        } else {
            client->stats.evicted_keys += keys;
        }
    }
    client->batch.len = 0;
}

static void kvf_ctl_client_on_flush(evutil_socket_t fd, short what, void *arg)
{
    kvf_ctl_client_flush(arg);
}

static void kvf_ctl_client_queue(kvf_ctl_client_t *client, uint16_t type,
                                 Kvf__Medium medium, const kvf_key_t *key)
{
    if ((client->state != KVF_CTL_STATE_READY) || client->stop_requested) {
        return; /* the inventory after (re)registration covers it */
    }
    /* order matters (evict then re-admit, admit on host then move to
     * disk): a change of type or medium sends the batch collected so far
     * first */
    if ((client->batch.len > 0) &&
        ((client->batch_type != type) || (client->batch_medium != medium))) {
        kvf_ctl_client_flush(client);
    }
    if (kvf_ctl_keybuf_reserve(&client->batch, KVF_KEY_WIRE_SIZE) != KVF_OK) {
        kvf_error("controller %s: no memory for a key batch; forcing a "
                  "resync",
                  client->controller);
        kvf_ctl_client_reset(client, "out of memory");
        return;
    }
    client->batch_type   = type;
    client->batch_medium = medium;
    kvf_key_pack(key, client->batch.data + client->batch.len);
    client->batch.len += KVF_KEY_WIRE_SIZE;
    if (client->batch.len / KVF_KEY_WIRE_SIZE >= client->max_batch_keys) {
        kvf_ctl_client_flush(client);
    } else if (!evtimer_pending(client->flush_ev, NULL)) {
        kvf_ctl_client_arm(client->flush_ev, client->flush_ns);
    }
}

void kvf_ctl_client_admit(kvf_ctl_client_t *client, const kvf_key_t *key)
{
    kvf_ctl_client_queue(client, KVF_MSG_ADMIT, KVF__MEDIUM__MEDIUM_HOST, key);
}

void kvf_ctl_client_admit_medium(kvf_ctl_client_t *client, const kvf_key_t *key,
                                 Kvf__Medium medium)
{
    kvf_ctl_client_queue(client, KVF_MSG_ADMIT, medium, key);
}

void kvf_ctl_client_evict(kvf_ctl_client_t *client, const kvf_key_t *key)
{
    kvf_ctl_client_queue(client, KVF_MSG_EVICT, KVF__MEDIUM__MEDIUM_HOST, key);
}

static void kvf_ctl_client_send_inventory(kvf_ctl_client_t *client, bool last)
{
    Kvf__Inventory inv;

    kvf__inventory__init(&inv);
    inv.request_id  = client->next_request++;
    inv.node_id     = client->node_id;
    inv.incarnation = client->incarnation;
    inv.seq         = client->seq;
    inv.keys.data   = client->inventory.data;
    inv.keys.len    = client->inventory.len;
    inv.last        = last;
    inv.medium      = client->inventory_medium;
    if (kvf_ctl_client_send(client, KVF_MSG_INVENTORY, &inv.base) == KVF_OK) {
        client->stats.inventory_keys += inv.keys.len / KVF_KEY_WIRE_SIZE;
    }
    client->inventory.len = 0;
}

void kvf_ctl_client_inventory_add(kvf_ctl_client_t *client,
                                  const kvf_key_t *key)
{
    kvf_ctl_client_inventory_add_medium(client, key, KVF__MEDIUM__MEDIUM_HOST);
}

void kvf_ctl_client_inventory_add_medium(kvf_ctl_client_t *client,
                                         const kvf_key_t *key,
                                         Kvf__Medium medium)
{
    /* one medium per INVENTORY batch: a change sends what was collected */
    if ((client->inventory.len > 0) && (client->inventory_medium != medium)) {
        kvf_ctl_client_send_inventory(client, false);
    }
    client->inventory_medium = medium;
    if (kvf_ctl_keybuf_reserve(&client->inventory, KVF_KEY_WIRE_SIZE) !=
        KVF_OK) {
        client->stats.errors++;
        return;
    }
    kvf_key_pack(key, client->inventory.data + client->inventory.len);
    client->inventory.len += KVF_KEY_WIRE_SIZE;
    if (client->inventory.len / KVF_KEY_WIRE_SIZE >= client->max_batch_keys) {
        kvf_ctl_client_send_inventory(client, false);
    }
}

void kvf_ctl_client_inventory_end(kvf_ctl_client_t *client)
{
    kvf_ctl_client_send_inventory(client, true);
}

static void kvf_ctl_client_send_heartbeat(kvf_ctl_client_t *client)
{
    kvf_ctl_usage_t usage = {0};
    Kvf__NodeTraffic traffic;
    Kvf__Heartbeat hb;

    usage.pool_capacity = client->pool_capacity;
    if ((client->ops != NULL) && (client->ops->usage != NULL)) {
        client->ops->usage(client->arg, &usage);
    }
    kvf_traffic_to_msg(&usage.traffic, &traffic);
    kvf__heartbeat__init(&hb);
    hb.request_id    = client->next_request++;
    hb.node_id       = client->node_id;
    hb.incarnation   = client->incarnation;
    hb.pool_used     = usage.pool_used;
    hb.pool_capacity = usage.pool_capacity;
    hb.entries       = usage.entries;
    hb.pd_capacity   = usage.pd_capacity;
    hb.pd_used       = usage.pd_used;
    hb.disk_capacity = usage.disk_capacity;
    hb.disk_used     = usage.disk_used;
    hb.disk_chunks   = usage.disk_chunks;
    hb.last_seq      = client->seq;
    hb.traffic       = &traffic;
    hb.transports    = usage.transports; /* "" is left off the wire */
    if (kvf_ctl_client_send(client, KVF_MSG_HEARTBEAT, &hb.base) == KVF_OK) {
        client->stats.heartbeats++;
    }
}

static void kvf_ctl_client_on_heartbeat(evutil_socket_t fd, short what,
                                        void *arg)
{
    kvf_ctl_client_t *client = arg;

    if (client->state != KVF_CTL_STATE_READY) {
        return;
    }
    if (kvf_time_now_ns() - client->last_reply_ns > client->lease_ns) {
        kvf_warn("controller %s: no reply for %llu ms (lease); reconnecting",
                 client->controller,
                 (unsigned long long)(client->lease_ns / KVF_NSEC_PER_MSEC));
        kvf_ctl_client_reset(client, "lease expired");
        return;
    }
    kvf_ctl_client_flush(client);
    kvf_ctl_client_send_heartbeat(client);
    kvf_ctl_client_arm(client->heartbeat_ev, client->heartbeat_ns);
}

static void kvf_ctl_client_finish_stop(kvf_ctl_client_t *client)
{
    if (client->state == KVF_CTL_STATE_STOPPED) {
        return;
    }
    client->state = KVF_CTL_STATE_STOPPED;
    evtimer_del(client->deadline_ev);
    evtimer_del(client->heartbeat_ev);
    evtimer_del(client->retry_ev);
    evtimer_del(client->flush_ev);
    kvf_evconn_destroy(client->conn); /* inside a handler: freed after */
    client->conn = NULL;
    if ((client->ops != NULL) && (client->ops->stopped != NULL)) {
        client->ops->stopped(client->arg);
    }
}

void kvf_ctl_client_stop(kvf_ctl_client_t *client)
{
    Kvf__Deregister dereg;

    if (client->stop_requested) {
        return;
    }
    client->stop_requested = true;
    if (client->state != KVF_CTL_STATE_READY) {
        kvf_ctl_client_finish_stop(client);
        return;
    }
    kvf_ctl_client_flush(client);
    kvf__deregister__init(&dereg);
    dereg.request_id      = client->next_request++;
    client->dereg_request = dereg.request_id;
    dereg.node_id         = client->node_id;
    dereg.incarnation     = client->incarnation;
    if (kvf_ctl_client_send(client, KVF_MSG_DEREGISTER, &dereg.base) !=
        KVF_OK) {
        kvf_ctl_client_finish_stop(client);
        return;
    }
    client->state = KVF_CTL_STATE_STOPPING;
    evtimer_del(client->heartbeat_ev);
    kvf_ctl_client_arm(client->deadline_ev, client->request_timeout_ns);
}

/* Logs why the client is not (or no longer) registered: at warn when the
 * reason changed since the last one, else at debug (no flood while the
 * controller stays away). */
static void kvf_ctl_client_complain(kvf_ctl_client_t *client, const char *why)
{
    if (strcmp(client->problem, why) != 0) {
        snprintf(client->problem, sizeof(client->problem), "%s", why);
        kvf_warn(
            "controller %s: %s; node %s retries (at most every %llu ms)",
            client->controller, why, client->name,
            (unsigned long long)(client->reconnect_max_ns / KVF_NSEC_PER_MSEC));
    } else {
        kvf_debug("controller %s: %s; retrying in %llu ms", client->controller,
                  why,
                  (unsigned long long)(client->backoff_ns / KVF_NSEC_PER_MSEC));
    }
}

/* Drops the connection and schedules a reconnect with backoff. */
static void kvf_ctl_client_reset(kvf_ctl_client_t *client, const char *why)
{
    uint64_t delay;

    if (client->stop_requested) {
        kvf_ctl_client_finish_stop(client);
        return;
    }
    kvf_evconn_destroy(client->conn); /* inside a handler: freed after */
    client->conn = NULL;
    evtimer_del(client->deadline_ev);
    evtimer_del(client->heartbeat_ev);
    evtimer_del(client->flush_ev);
    client->batch.len     = 0;
    client->inventory.len = 0;
    kvf_ctl_client_fail_pending(client, KVF_ERR_CLOSED);
    if (client->state == KVF_CTL_STATE_READY) {
        kvf_warn("controller %s: connection lost (%s); node %u reconnects",
                 client->controller, why, client->node_id);
        snprintf(client->problem, sizeof(client->problem),
                 "connection lost (%s)", why);
    } else {
        kvf_ctl_client_complain(client, why);
    }
    client->state = KVF_CTL_STATE_IDLE;
    if (client->discover != NULL) {
        /* maybe the leader is gone: a new one connects at once */
        kvf_discover_want(client->discover);
    }
    /* jitter of up to a quarter keeps restarted agents from reconnecting
     * in lockstep */
    delay =
        client->backoff_ns + (uint64_t)rand() % (client->backoff_ns / 4 + 1);
    kvf_ctl_client_arm(client->retry_ev, delay);
    if (client->num_addrs > 1) {
        client->addr_idx = (client->addr_idx + 1) % client->num_addrs;
        memcpy(&client->addr, &client->addrs[client->addr_idx],
               sizeof(client->addr));
        client->addr_len = client->addr_lens[client->addr_idx];
        if (client->addr_idx != 0) {
            return; /* back off once per round of the list */
        }
    }
    client->backoff_ns *= 2;
    if (client->backoff_ns > client->reconnect_max_ns) {
        client->backoff_ns = client->reconnect_max_ns;
    }
}

static void kvf_ctl_client_on_retry(evutil_socket_t fd, short what, void *arg)
{
    kvf_ctl_client_connect(arg);
}

static void kvf_ctl_client_on_deadline(evutil_socket_t fd, short what,
                                       void *arg)
{
    kvf_ctl_client_t *client = arg;

    switch (client->state) {
    case KVF_CTL_STATE_STOPPING:
        kvf_warn("controller %s: deregistration not acknowledged in time",
                 client->controller);
        kvf_ctl_client_finish_stop(client);
        break;
    case KVF_CTL_STATE_CONNECTING:
        kvf_ctl_client_reset(client, "connect timed out");
        break;
    case KVF_CTL_STATE_HELLO:
    case KVF_CTL_STATE_AUTH:
    case KVF_CTL_STATE_REGISTER:
        kvf_ctl_client_reset(client, "no reply in time");
        break;
    default:
        break;
    }
}

static void kvf_ctl_client_on_registered(kvf_ctl_client_t *client,
                                         const Kvf__RegisterReply *reply)
{
    if (reply->status != KVF_OK) {
        char why[300];

        snprintf(why, sizeof(why), "registration of %.64s refused: %s (%.200s)",
                 client->name, kvf_strerror((kvf_status_t)reply->status),
                 (reply->message != NULL) ? reply->message : "");
        client->stats.errors++;
        kvf_ctl_client_reset(client, why);
        return;
    }
    evtimer_del(client->deadline_ev);
    client->node_id    = reply->node_id;
    client->state      = KVF_CTL_STATE_READY;
    client->backoff_ns = KVF_CTL_BACKOFF_MIN_NS;
    client->heartbeat_ns =
        (reply->heartbeat_ms > 0)
            ? (uint64_t)reply->heartbeat_ms * KVF_NSEC_PER_MSEC
            : KVF_CTL_HEARTBEAT_NS;
    client->lease_ns = (reply->lease_ms > 0)
                           ? (uint64_t)reply->lease_ms * KVF_NSEC_PER_MSEC
                           : 3 * client->heartbeat_ns;
    client->stats.registrations++;
    client->is_replace = false; /* a later re-registration is a restart */
    client->problem[0] = '\0';
    if (client->discover != NULL) {
        kvf_discover_settle(client->discover);
    }
    kvf_info("registered with controller %s as node %u (%s)%s%s",
             client->controller, client->node_id, client->name,
             reply->recovering ? ", controller recovering" : "",
             client->is_draining ? ", draining" : "");
    if ((client->ops != NULL) && (client->ops->registered != NULL)) {
        client->ops->registered(client->arg, client->node_id);
    }
    /* a (re)registration always resends the inventory: the controller's
     * view of this node starts empty for a new incarnation */
    if ((client->ops != NULL) && (client->ops->inventory != NULL)) {
        client->ops->inventory(client->arg, client);
    } else {
        kvf_ctl_client_inventory_end(client);
    }
    kvf_ctl_client_arm(client->heartbeat_ev, client->heartbeat_ns);
}

static void kvf_ctl_client_on_heartbeat_reply(kvf_ctl_client_t *client,
                                              const Kvf__HeartbeatReply *reply)
{
    size_t i;

    if (reply->status != KVF_OK) {
        kvf_warn("controller %s: heartbeat of node %u refused: %s (%s)",
                 client->controller, client->node_id,
                 kvf_strerror((kvf_status_t)reply->status),
                 (reply->message != NULL) ? reply->message : "");
        kvf_ctl_client_reset(client, "heartbeat refused");
        return;
    }
    for (i = 0; i < reply->n_commands; i++) {
        const Kvf__Command *cmd = reply->commands[i];

        client->stats.commands++;
        if (cmd->type == KVF__COMMAND_TYPE__COMMAND_RESYNC) {
            kvf_info("controller %s asks node %u to resync", client->controller,
                     client->node_id);
            if ((client->ops != NULL) && (client->ops->inventory != NULL)) {
                client->ops->inventory(client->arg, client);
            } else {
                kvf_ctl_client_inventory_end(client);
            }
        } else if ((client->ops != NULL) && (client->ops->command != NULL)) {
            client->ops->command(client->arg, cmd);
        }
    }
}

static void kvf_ctl_client_on_status(kvf_ctl_client_t *client,
                                     const Kvf__Status *reply)
{
    if (client->state == KVF_CTL_STATE_AUTH) {
        if (reply->status != KVF_OK) {
            char why[300];

            snprintf(why, sizeof(why), "refused authentication: %s (%.200s)",
                     kvf_strerror((kvf_status_t)reply->status),
                     (reply->message != NULL) ? reply->message : "");
            client->stats.errors++;
            kvf_ctl_client_reset(client, why);
            return;
        }
        client->auth.state = KVF_AUTH_STATE_DONE;
        kvf_ctl_client_send_register(client);
        return;
    }
    if ((client->state == KVF_CTL_STATE_STOPPING) &&
        (reply->request_id == client->dereg_request)) {
        kvf_info("node %u deregistered from controller %s", client->node_id,
                 client->controller);
        kvf_ctl_client_finish_stop(client);
        return;
    }
    if (reply->status == KVF_OK) {
        return;
    }
    {
        kvf_ctl_pending_t *p = kvf_ctl_client_take(client, reply->request_id);

        if (p != NULL) {
            /* a lookup or node info the controller refused */
            kvf_ctl_pending_finish(p, (kvf_status_t)reply->status);
            return;
        }
    }
    client->stats.errors++;
    kvf_warn("controller %s: request %llu failed: %s (%s)", client->controller,
             (unsigned long long)reply->request_id,
             kvf_strerror((kvf_status_t)reply->status),
             (reply->message != NULL) ? reply->message : "");
    if ((reply->status == KVF_ERR_STALE) ||
        (reply->status == KVF_ERR_NOT_FOUND) ||
        (reply->status == KVF_ERR_STATE)) {
        /* the controller forgot us (restart, lease) or fenced us: register
         * again, which resends the inventory */
        kvf_ctl_client_reset(client, "controller no longer knows this node");
    }
}

static void kvf_ctl_pending_finish(kvf_ctl_pending_t *p, kvf_status_t status)
{
    if (p->lookup_cb != NULL) {
        p->lookup_cb(p->arg, status, 0, NULL, 0);
    } else if (p->node_cb != NULL) {
        p->node_cb(p->arg, status, p->node_id, "", false);
    }
    free(p);
}

/* Completes failed and expired requests; re-arms while any are left. */
static void kvf_ctl_client_on_pending(evutil_socket_t fd, short what, void *arg)
{
    kvf_ctl_client_t *client = arg;
    uint64_t now             = kvf_time_now_ns();
    kvf_ctl_pending_t *p;

    /* from the head again after each one: its callback may cancel others
     * (kvf_ctl_client_cancel) or send new ones */
    for (;;) {
        TAILQ_FOREACH(p, &client->pending, link) {
            if ((p->failure != KVF_OK) || (now >= p->deadline_ns)) {
                break;
            }
        }
        if (p == NULL) {
            break;
        }
        TAILQ_REMOVE(&client->pending, p, link);
        kvf_ctl_pending_finish(p, (p->failure != KVF_OK) ? p->failure
                                                         : KVF_ERR_TIMEOUT);
    }
    if (!TAILQ_EMPTY(&client->pending)) {
        kvf_ctl_client_arm(client->pending_ev, 10 * KVF_NSEC_PER_MSEC);
    }
}

/* Fails every pending request (the connection is gone), deferred. */
static void kvf_ctl_client_fail_pending(kvf_ctl_client_t *client,
                                        kvf_status_t status)
{
    kvf_ctl_pending_t *p;

    TAILQ_FOREACH(p, &client->pending, link) {
        if (p->failure == KVF_OK) {
            p->failure = status; /* keep the first reason */
        }
    }
    if (!TAILQ_EMPTY(&client->pending)) {
        kvf_ctl_client_arm(client->pending_ev, 0);
    }
}

static kvf_ctl_pending_t *kvf_ctl_client_take(kvf_ctl_client_t *client,
                                              uint64_t request_id)
{
    kvf_ctl_pending_t *p;

    TAILQ_FOREACH(p, &client->pending, link) {
        if ((p->request_id == request_id) && (p->failure == KVF_OK)) {
            TAILQ_REMOVE(&client->pending, p, link);
            return p;
        }
    }
    return NULL;
}

static kvf_ctl_pending_t *kvf_ctl_client_add(kvf_ctl_client_t *client,
                                             uint16_t reply_type, void *arg)
{
    kvf_ctl_pending_t *p = calloc(1, sizeof(*p));

    if (p == NULL) {
        return NULL;
    }
    p->reply_type  = reply_type;
    p->arg         = arg;
    p->request_id  = client->next_request++;
    p->deadline_ns = kvf_time_deadline_ns(client->request_timeout_ns);
    TAILQ_INSERT_TAIL(&client->pending, p, link);
    if (!evtimer_pending(client->pending_ev, NULL)) {
        kvf_ctl_client_arm(client->pending_ev, 10 * KVF_NSEC_PER_MSEC);
    }
    return p;
}

void kvf_ctl_client_lookup(kvf_ctl_client_t *client, const kvf_key_t *keys,
                           uint32_t num, bool any_order, uint64_t timeout_ns,
                           kvf_ctl_lookup_cb_t cb, void *arg)
{
    kvf_ctl_pending_t *p;
    Kvf__Lookup req;
    uint8_t *packed;
    uint32_t i;

    p = kvf_ctl_client_add(client, KVF_MSG_LOOKUP_REPLY, arg);
    if (p == NULL) {
        cb(arg, KVF_ERR_NO_MEMORY, 0, NULL, 0); /* nothing else to do */
        return;
    }
    p->lookup_cb = cb;
    p->num       = num;
    if (timeout_ns > 0) {
        p->deadline_ns = kvf_time_deadline_ns(timeout_ns);
    }
    if (client->state != KVF_CTL_STATE_READY) {
        p->failure = KVF_ERR_STATE;
        kvf_ctl_client_arm(client->pending_ev, 0);
        return;
    }
    packed = malloc((size_t)num * KVF_KEY_WIRE_SIZE + 1);
    if (packed == NULL) {
        p->failure = KVF_ERR_NO_MEMORY;
        kvf_ctl_client_arm(client->pending_ev, 0);
        return;
    }
    for (i = 0; i < num; i++) {
        kvf_key_pack(&keys[i], packed + (size_t)i * KVF_KEY_WIRE_SIZE);
    }
    kvf__lookup__init(&req);
    req.request_id     = p->request_id;
    req.requester      = client->node_id;
    req.keys.data      = packed;
    req.keys.len       = (size_t)num * KVF_KEY_WIRE_SIZE;
    req.any_order      = any_order;
    req.want_addresses = (client->node_learn_cb != NULL);
    if (kvf_ctl_client_send(client, KVF_MSG_LOOKUP, &req.base) != KVF_OK) {
        p->failure = KVF_ERR_CLOSED;
        kvf_ctl_client_arm(client->pending_ev, 0);
    }
    free(packed);
}

/* NODE_INFO for @p node_id, or (node_id 0) for every node, of which the
 * reply handler picks the live one named @p name. */
static void kvf_ctl_client_node_ask(kvf_ctl_client_t *client, uint32_t node_id,
                                    const char *name, kvf_ctl_node_cb_t cb,
                                    void *arg)
{
    Kvf__NodeInfoRequest req;
    kvf_ctl_pending_t *p;

    p = kvf_ctl_client_add(client, KVF_MSG_NODE_INFO_REPLY, arg);
    if (p == NULL) {
        cb(arg, KVF_ERR_NO_MEMORY, node_id, "", false);
        return;
    }
    p->node_cb = cb;
    p->node_id = node_id;
    snprintf(p->node_name, sizeof(p->node_name), "%s", name);
    if (client->state != KVF_CTL_STATE_READY) {
        p->failure = KVF_ERR_STATE;
        kvf_ctl_client_arm(client->pending_ev, 0);
        return;
    }
    kvf__node_info_request__init(&req);
    req.request_id = p->request_id;
    req.n_node_ids = (node_id != 0) ? 1 : 0;
    req.node_ids   = (node_id != 0) ? &node_id : NULL;
    if (kvf_ctl_client_send(client, KVF_MSG_NODE_INFO, &req.base) != KVF_OK) {
        p->failure = KVF_ERR_CLOSED;
        kvf_ctl_client_arm(client->pending_ev, 0);
    }
}

void kvf_ctl_client_node_info(kvf_ctl_client_t *client, uint32_t node_id,
                              kvf_ctl_node_cb_t cb, void *arg)
{
    kvf_ctl_client_node_ask(client, node_id, "", cb, arg);
}

void kvf_ctl_client_node_find(kvf_ctl_client_t *client, const char *name,
                              kvf_ctl_node_cb_t cb, void *arg)
{
    kvf_ctl_client_node_ask(client, 0, name, cb, arg);
}

void kvf_ctl_client_cancel(kvf_ctl_client_t *client, const void *arg)
{
    kvf_ctl_pending_t *p, *next;

    for (p = TAILQ_FIRST(&client->pending); p != NULL; p = next) {
        next = TAILQ_NEXT(p, link);
        if (p->arg == arg) {
            TAILQ_REMOVE(&client->pending, p, link);
            free(p);
        }
    }
}

void kvf_ctl_client_set_node_learn(kvf_ctl_client_t *client,
                                   kvf_ctl_node_learn_cb_t cb, void *arg)
{
    client->node_learn_cb  = cb;
    client->node_learn_arg = arg;
}

static void kvf_ctl_client_name_learn(kvf_ctl_client_t *client,
                                      const char *address, const char *name);

/* The holders' addresses a LOOKUP reply carries (want_addresses). */
static void kvf_ctl_client_addrs_learn(kvf_ctl_client_t *client,
                                       const Kvf__LookupReply *reply)
{
    size_t i;

    for (i = 0; (i < reply->n_holder_addrs) && (client->node_learn_cb != NULL);
         i++) {
        const Kvf__HolderAddr *a = reply->holder_addrs[i];

        if ((a->node_id == 0) || (a->data_address == NULL) ||
            (a->data_address[0] == '\0')) {
            continue;
        }
        kvf_ctl_client_name_learn(client, a->data_address, a->name);
        client->node_learn_cb(client->node_learn_arg, a->node_id,
                              (a->name != NULL) ? a->name : "",
                              a->data_address);
    }
}

static void kvf_ctl_client_on_lookup_reply(kvf_ctl_client_t *client,
                                           const Kvf__LookupReply *reply)
{
    kvf_ctl_pending_t *p = kvf_ctl_client_take(client, reply->request_id);
    uint32_t *holders;
    uint32_t i;

    if ((p == NULL) || (p->reply_type != KVF_MSG_LOOKUP_REPLY)) {
        free(p);
        return;
    }
    if ((reply->status != KVF_OK) || (reply->holders.len != 4ull * p->num) ||
        (reply->hit_chunks > p->num)) {
        kvf_ctl_pending_finish(p, (reply->status != KVF_OK)
                                      ? (kvf_status_t)reply->status
                                      : KVF_ERR_PROTO);
        return;
    }
    holders = malloc((p->num + 1) * sizeof(*holders));
    if (holders == NULL) {
        kvf_ctl_pending_finish(p, KVF_ERR_NO_MEMORY);
        return;
    }
    for (i = 0; i < p->num; i++) {
        const uint8_t *b = reply->holders.data + 4 * (size_t)i;

        holders[i] = (uint32_t)b[0] | ((uint32_t)b[1] << 8) |
                     ((uint32_t)b[2] << 16) | ((uint32_t)b[3] << 24);
    }
    kvf_ctl_client_addrs_learn(client, reply);
    p->lookup_cb(p->arg, KVF_OK, reply->hit_chunks, holders, p->num);
    free(holders);
    free(p);
}

static void kvf_ctl_client_name_learn(kvf_ctl_client_t *client,
                                      const char *address, const char *name)
{
    unsigned i;

    if ((address == NULL) || (name == NULL) || (address[0] == '\0')) {
        return;
    }
    for (i = 0; i < KVF_CTL_NAMES; i++) {
        if (strcmp(client->names[i].address, address) == 0) {
            break;
        }
    }
    if (i == KVF_CTL_NAMES) {
        i = client->next_name++ % KVF_CTL_NAMES;
    }
    snprintf(client->names[i].address, sizeof(client->names[i].address), "%s",
             address);
    snprintf(client->names[i].name, sizeof(client->names[i].name), "%s", name);
}

const char *kvf_ctl_client_name_of(const kvf_ctl_client_t *client,
                                   const char *data_address)
{
    unsigned i;

    for (i = 0; i < KVF_CTL_NAMES; i++) {
        if ((client->names[i].address[0] != '\0') &&
            (strcmp(client->names[i].address, data_address) == 0)) {
            return client->names[i].name;
        }
    }
    return NULL;
}

/* A draining node still serves its chunks and answers PD pushes (with a
 * refusal that says it is draining): only a dead one is down. */
static bool kvf_ctl_node_is_up(const char *state)
{
    return (state != NULL) &&
           ((strcmp(state, "alive") == 0) || (strcmp(state, "draining") == 0));
}

static void kvf_ctl_client_on_node_info_reply(kvf_ctl_client_t *client,
                                              const Kvf__NodeInfoReply *reply)
{
    kvf_ctl_pending_t *p = kvf_ctl_client_take(client, reply->request_id);
    const Kvf__NodeDesc *node;

    if ((p == NULL) || (p->reply_type != KVF_MSG_NODE_INFO_REPLY)) {
        free(p);
        return;
    }
    node = NULL;
    if ((reply->status == KVF_OK) && (p->node_id == 0)) {
        size_t i;

        /* by name: the live node of that name (a dead one only if no
         * live one exists, so the caller learns it is dead) */
        for (i = 0; i < reply->n_nodes; i++) {
            const Kvf__NodeDesc *d = reply->nodes[i];

            if ((d->name == NULL) || (strcmp(d->name, p->node_name) != 0)) {
                continue;
            }
            if ((node == NULL) || kvf_ctl_node_is_up(d->state)) {
                node = d;
            }
        }
    } else if ((reply->status == KVF_OK) && (reply->n_nodes == 1) &&
               (reply->nodes[0]->node_id == p->node_id)) {
        node = reply->nodes[0];
    }
    if (node == NULL) {
        kvf_ctl_pending_finish(p, (reply->status != KVF_OK)
                                      ? (kvf_status_t)reply->status
                                      : KVF_ERR_NOT_FOUND);
        return;
    }
    kvf_ctl_client_name_learn(client, node->data_address, node->name);
    p->node_cb(p->arg, KVF_OK, node->node_id,
               (node->data_address != NULL) ? node->data_address : "",
               kvf_ctl_node_is_up(node->state));
    free(p);
}

/* Replies carry the leader's term (HA on etcd; 0 without): one older than
 * a term already seen comes from a deposed leader and is not believed. */
static bool kvf_ctl_client_term_ok(kvf_ctl_client_t *client,
                                   const kvf_frame_t *frame)
{
    uint64_t term;

    switch (frame->type) {
    case KVF_MSG_REGISTER_REPLY:
        term = ((const Kvf__RegisterReply *)frame->msg)->term;
        break;
    case KVF_MSG_HEARTBEAT_REPLY:
        term = ((const Kvf__HeartbeatReply *)frame->msg)->term;
        break;
    case KVF_MSG_LOOKUP_REPLY:
        term = ((const Kvf__LookupReply *)frame->msg)->term;
        break;
    default:
        return true;
    }
    if ((term != 0) && (term < client->term)) {
        char why[96];

        snprintf(why, sizeof(why), "reply of term %llu, older than %llu",
                 (unsigned long long)term, (unsigned long long)client->term);
        kvf_ctl_client_reset(client, why);
        return false;
    }
    if (term > client->term) {
        client->term = term;
    }
    return true;
}

static void kvf_ctl_client_dispatch(kvf_ctl_client_t *client,
                                    const kvf_frame_t *frame)
{
    const Kvf__HelloReply *hello;

    client->last_reply_ns = kvf_time_now_ns();
    if (!kvf_ctl_client_term_ok(client, frame)) {
        return; /* the connection was reset */
    }
    switch (frame->type) {
    case KVF_MSG_HELLO_REPLY:
        hello = (const Kvf__HelloReply *)frame->msg;
        if (client->state == KVF_CTL_STATE_HELLO) {
            kvf_ctl_client_on_hello_reply(client, hello);
        }
        break;
    case KVF_MSG_REGISTER_REPLY:
        if (client->state == KVF_CTL_STATE_REGISTER) {
            kvf_ctl_client_on_registered(
                client, (const Kvf__RegisterReply *)frame->msg);
        }
        break;
    case KVF_MSG_HEARTBEAT_REPLY:
        if (client->state == KVF_CTL_STATE_READY) {
            kvf_ctl_client_on_heartbeat_reply(
                client, (const Kvf__HeartbeatReply *)frame->msg);
        }
        break;
    case KVF_MSG_STATUS:
        kvf_ctl_client_on_status(client, (const Kvf__Status *)frame->msg);
        break;
    case KVF_MSG_LOOKUP_REPLY:
        kvf_ctl_client_on_lookup_reply(client,
                                       (const Kvf__LookupReply *)frame->msg);
        break;
    case KVF_MSG_NODE_INFO_REPLY:
        kvf_ctl_client_on_node_info_reply(
            client, (const Kvf__NodeInfoReply *)frame->msg);
        break;
    default:
        kvf_debug("controller %s: ignoring %s", client->controller,
                  kvf_msg_type_name(frame->type));
        break;
    }
}

static kvf_status_t kvf_ctl_client_on_frame(kvf_evconn_t *conn,
                                            kvf_frame_t *frame)
{
    /* a handler may reset the connection: evconn frees it afterwards and
     * hands out nothing more */
    kvf_ctl_client_dispatch(kvf_evconn_arg(conn), frame);
    return KVF_OK;
}

static kvf_status_t kvf_ctl_client_on_bad_frame(kvf_evconn_t *conn,
                                                kvf_status_t status)
{
    kvf_ctl_client_t *client = kvf_evconn_arg(conn);

    kvf_warn("controller %s: bad frame: %s", client->controller,
             kvf_strerror(status));
    client->stats.errors++;
    kvf_ctl_client_reset(client, "bad frame");
    return KVF_ERR_CANCELED;
}

static void kvf_ctl_client_on_connected(kvf_evconn_t *conn)
{
    kvf_ctl_client_t *client = kvf_evconn_arg(conn);
    int one                  = 1;

    client->stats.connects++;
    setsockopt(kvf_evconn_fd(conn), IPPROTO_TCP, TCP_NODELAY, &one,
               sizeof(one));
    client->state = KVF_CTL_STATE_HELLO;
    kvf_ctl_client_send_hello(client);
    if (client->state == KVF_CTL_STATE_HELLO) {
        kvf_ctl_client_arm(client->deadline_ev, client->request_timeout_ns);
    }
}

/* The connection failed or the controller closed it. */
static void kvf_ctl_client_on_close(kvf_evconn_t *conn, kvf_status_t why)
{
    kvf_ctl_client_t *client = kvf_evconn_arg(conn);
    const char *problem      = kvf_evconn_problem(conn);
    char text[320];

    if (why == KVF_ERR_CLOSED) {
        snprintf(text, sizeof(text), "closed by controller");
    } else if (!kvf_evconn_is_connected(conn)) {
        if (strncmp(problem, "tls", 3) == 0) {
            client->stats.errors++;
            kvf_error("controller %s: %s", client->controller, problem);
        }
        snprintf(text, sizeof(text), "cannot connect: %s",
                 (problem[0] != '\0') ? problem : "connection error");
    } else {
        snprintf(text, sizeof(text), "connection error: %s",
                 (problem[0] != '\0') ? problem : kvf_strerror(why));
    }
    kvf_ctl_client_reset(client, text); /* destroys conn */
}

static const kvf_evconn_ops_t kvf_ctl_client_conn_ops = {
    .on_frame     = kvf_ctl_client_on_frame,
    .on_bad_frame = kvf_ctl_client_on_bad_frame,
    .on_close     = kvf_ctl_client_on_close,
    .on_connected = kvf_ctl_client_on_connected,
};

static void kvf_ctl_client_connect(kvf_ctl_client_t *client)
{
    SSL *ssl = NULL;

    if (client->num_addrs == 0) {
        char why[320];

        kvf_discover_problem(client->discover, why, sizeof(why));
        kvf_ctl_client_reset(client, why);
        return;
    }
    if (client->tls_ctx != NULL) {
        ssl = kvf_tls_client_new(client->tls_ctx, client->tls_server_name);
        if (ssl == NULL) {
            kvf_ctl_client_reset(client, "no memory for a connection");
            return;
        }
    }
    client->state = KVF_CTL_STATE_CONNECTING;
    client->conn =
        kvf_evconn_connect(&client->group, (struct sockaddr *)&client->addr,
                           client->addr_len, ssl, client);
    if (client->conn == NULL) {
        char why[160];

        snprintf(why, sizeof(why), "cannot connect: %s",
                 evutil_socket_error_to_string(EVUTIL_SOCKET_ERROR()));
        kvf_ctl_client_reset(client, why);
        return;
    }
    kvf_evconn_set_name(client->conn, client->controller);
    kvf_ctl_client_arm(client->deadline_ev, client->connect_timeout_ns);
}

/* Resolves one HOST:PORT (numeric addresses or names) into addrs[]. */
static kvf_status_t kvf_ctl_client_resolve_one(kvf_ctl_client_t *client,
                                               const char *hostport)
{
    struct evutil_addrinfo hints, *res = NULL;
    char host[256], port_str[8];
    unsigned n = client->num_addrs;
    uint16_t port;
    int rc;

    if ((n == KVF_CTL_MAX_ADDRS) ||
        (kvf_config_parse_hostport(hostport, host, sizeof(host), &port) !=
         KVF_OK)) {
        kvf_error("controller address '%s' is not HOST:PORT (at most %d, "
                  "comma-separated)",
                  hostport, KVF_CTL_MAX_ADDRS);
        return KVF_ERR_INVALID;
    }
    snprintf(port_str, sizeof(port_str), "%u", port);
    memset(&hints, 0, sizeof(hints));
    hints.ai_family   = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    rc                = evutil_getaddrinfo(host, port_str, &hints, &res);
    if ((rc != 0) || (res == NULL)) {
        kvf_error("controller address '%s': cannot resolve: %s", hostport,
                  evutil_gai_strerror(rc));
        return KVF_ERR_INVALID;
    }
    memcpy(&client->addrs[n], res->ai_addr, res->ai_addrlen);
    client->addr_lens[n] = (socklen_t)res->ai_addrlen;
    client->num_addrs    = n + 1;
    evutil_freeaddrinfo(res);
    return KVF_OK;
}

/* Resolves HOST:PORT[,HOST:PORT...] once, at create. */
static kvf_status_t kvf_ctl_client_resolve(kvf_ctl_client_t *client)
{
    char list[1024], *tok, *save = NULL;
    kvf_status_t status;

    snprintf(list, sizeof(list), "%s", client->controller);
    for (tok = strtok_r(list, ",", &save); tok != NULL;
         tok = strtok_r(NULL, ",", &save)) {
        status = kvf_ctl_client_resolve_one(client, tok);
        if (status != KVF_OK) {
            return status;
        }
    }
    if (client->num_addrs == 0) {
        return kvf_ctl_client_resolve_one(client, "");
    }
    memcpy(&client->addr, &client->addrs[0], sizeof(client->addr));
    client->addr_len = client->addr_lens[0];
    return KVF_OK;
}

/* etcd named a new leader: it is the address from now on; when not
 * registered, connect there at once. */
static void kvf_ctl_client_on_leader(void *arg,
                                     const kvf_discover_leader_t *leader)
{
    kvf_ctl_client_t *client = arg;
    char *name               = strdup(leader->control);

    if (name == NULL) {
        return; /* the next look tries again */
    }
    free(client->controller);
    client->controller = name;
    memcpy(&client->addrs[0], &leader->addr, sizeof(client->addrs[0]));
    client->addr_lens[0] = leader->addr_len;
    client->num_addrs    = 1;
    client->addr_idx     = 0;
    memcpy(&client->addr, &leader->addr, sizeof(client->addr));
    client->addr_len = leader->addr_len;
    if (client->stop_requested || (client->state == KVF_CTL_STATE_READY) ||
        (client->state == KVF_CTL_STATE_STOPPING) ||
        (client->state == KVF_CTL_STATE_STOPPED)) {
        return;
    }
    /* IDLE (backing off) or half-way to an older address: go now */
    kvf_evconn_destroy(client->conn); /* inside a handler: freed after */
    client->conn = NULL;
    evtimer_del(client->deadline_ev);
    evtimer_del(client->retry_ev);
    client->backoff_ns = KVF_CTL_BACKOFF_MIN_NS;
    kvf_ctl_client_connect(client);
}

/* With etcd: the address comes from the leader it names (a thread looks;
 * the first answer connects). */
static kvf_status_t
kvf_ctl_client_discover(kvf_ctl_client_t *client,
                        const kvf_ctl_client_params_t *params)
{
    kvf_status_t status;
    uint64_t timeout;
    char *name = strdup("(leader in etcd)");

    if (name == NULL) {
        return KVF_ERR_NO_MEMORY;
    }
    free(client->controller);
    client->controller = name;
    /* the longest etcd call is also what a stop may wait for */
    timeout = (client->connect_timeout_ns < KVF_CTL_DISCOVER_CALL_NS)
                  ? client->connect_timeout_ns
                  : KVF_CTL_DISCOVER_CALL_NS;
    status  = kvf_discover_create(
         client->base, params->etcd,
        (params->etcd_prefix != NULL) ? params->etcd_prefix : "/kvfabric",
         timeout, KVF_CTL_DISCOVER_POLL_NS, kvf_ctl_client_on_leader, client,
         &client->discover);
    if (status != KVF_OK) {
        return (status == KVF_ERR_NO_MEMORY) ? status : KVF_ERR_INVALID;
    }
    kvf_discover_want(client->discover);
    return KVF_OK;
}

static char *kvf_ctl_strdup(const char *s)
{
    return strdup((s != NULL) ? s : "");
}

kvf_status_t kvf_ctl_client_create(const kvf_ctl_client_params_t *params,
                                   kvf_ctl_client_t **client_p)
{
    kvf_ctl_client_t *client;
    kvf_status_t status;
    struct timespec now;

    if ((params == NULL) || (params->base == NULL) ||
        (params->controller == NULL) || (params->name == NULL) ||
        (params->role < 0) || (params->role > 2) ||
        (params->max_frame < 4096)) {
        return KVF_ERR_INVALID;
    }
    client = calloc(1, sizeof(*client));
    if (client != NULL) {
        TAILQ_INIT(&client->pending);
    }
    if (client == NULL) {
        return KVF_ERR_NO_MEMORY;
    }
    client->base                    = params->base;
    client->group.base              = params->base;
    client->group.ops               = &kvf_ctl_client_conn_ops;
    client->group.max_frame         = params->max_frame;
    client->group.max_frame_preauth = params->max_frame;
    client->group.max_output        = UINT64_MAX; /* never throttled */
    client->role                    = params->role;
    client->pool_capacity           = params->pool_capacity;
    client->tp_rank                 = params->tp_rank;
    client->tp_world           = (params->tp_world == 0) ? 1 : params->tp_world;
    client->connect_timeout_ns = params->connect_timeout_ns;
    client->request_timeout_ns = params->request_timeout_ns;
    client->reconnect_max_ns   = params->reconnect_max_ns;
    client->flush_ns           = params->flush_ns;
    client->max_frame          = params->max_frame;
    client->max_batch_keys     = (params->max_frame - 1024) / KVF_KEY_WIRE_SIZE;
    if (client->max_batch_keys > KVF_CTL_MAX_BATCH_KEYS) {
        client->max_batch_keys = KVF_CTL_MAX_BATCH_KEYS;
    }
    client->ops        = params->ops;
    client->arg        = params->arg;
    client->is_replace = params->is_replace;
    kvf_auth_session_init(&client->auth, params->secret);
    if ((params->tls_ca != NULL) && (params->tls_ca[0] != '\0')) {
        char err[512];

        if (kvf_tls_client_ctx_create(params->tls_ca, &client->tls_ctx, err,
                                      sizeof(err)) != KVF_OK) {
            kvf_error("%s", err);
            free(client);
            return KVF_ERR_CONFIG;
        }
    }
    client->next_request = 1;
    client->backoff_ns   = KVF_CTL_BACKOFF_MIN_NS;
    client->state        = KVF_CTL_STATE_IDLE;
    clock_gettime(CLOCK_REALTIME, &now);
    client->incarnation =
        (uint64_t)now.tv_sec * KVF_NSEC_PER_SEC + (uint64_t)now.tv_nsec;

    status                  = KVF_ERR_NO_MEMORY;
    client->controller      = kvf_ctl_strdup(params->controller);
    client->name            = kvf_ctl_strdup(params->name);
    client->data_address    = kvf_ctl_strdup(params->data_address);
    client->control_address = kvf_ctl_strdup(params->control_address);
    client->instance_id     = kvf_ctl_strdup(params->instance_id);
    client->tls_server_name = kvf_ctl_strdup(params->tls_server_name);
    if ((client->controller == NULL) || (client->name == NULL) ||
        (client->data_address == NULL) || (client->control_address == NULL) ||
        (client->instance_id == NULL) || (client->tls_server_name == NULL)) {
        goto err_destroy;
    }
    if (params->worker_address_len > 0) {
        client->worker_address = malloc(params->worker_address_len);
        if (client->worker_address == NULL) {
            goto err_destroy;
        }
        memcpy(client->worker_address, params->worker_address,
               params->worker_address_len);
        client->worker_address_len = params->worker_address_len;
    }
    client->retry_ev =
        evtimer_new(client->base, kvf_ctl_client_on_retry, client);
    client->deadline_ev =
        evtimer_new(client->base, kvf_ctl_client_on_deadline, client);
    client->heartbeat_ev =
        evtimer_new(client->base, kvf_ctl_client_on_heartbeat, client);
    client->flush_ev =
        evtimer_new(client->base, kvf_ctl_client_on_flush, client);
    client->pending_ev =
        evtimer_new(client->base, kvf_ctl_client_on_pending, client);
    if ((client->retry_ev == NULL) || (client->deadline_ev == NULL) ||
        (client->heartbeat_ev == NULL) || (client->flush_ev == NULL) ||
        (client->pending_ev == NULL)) {
        goto err_destroy;
    }
    if ((params->etcd != NULL) && (params->etcd[0] != '\0')) {
        status = kvf_ctl_client_discover(client, params);
    } else {
        status = kvf_ctl_client_resolve(client);
    }
    if (status != KVF_OK) {
        goto err_destroy;
    }
    kvf_ctl_client_connect(client);
    *client_p = client;
    return KVF_OK;

err_destroy:
    kvf_ctl_client_destroy(client);
    return status;
}

void kvf_ctl_client_destroy(kvf_ctl_client_t *client)
{
    if (client == NULL) {
        return;
    }
    kvf_discover_destroy(client->discover);
    kvf_evconn_destroy(client->conn);
    if (client->retry_ev != NULL) {
        event_free(client->retry_ev);
    }
    if (client->deadline_ev != NULL) {
        event_free(client->deadline_ev);
    }
    if (client->heartbeat_ev != NULL) {
        event_free(client->heartbeat_ev);
    }
    if (client->flush_ev != NULL) {
        event_free(client->flush_ev);
    }
    if (client->pending_ev != NULL) {
        event_free(client->pending_ev);
    }
    while (!TAILQ_EMPTY(&client->pending)) {
        kvf_ctl_pending_t *p = TAILQ_FIRST(&client->pending);

        TAILQ_REMOVE(&client->pending, p, link);
        free(p); /* the owners are going away with the client */
    }
    free(client->batch.data);
    free(client->inventory.data);
    free(client->worker_address);
    free(client->controller);
    free(client->name);
    free(client->data_address);
    free(client->control_address);
    free(client->instance_id);
    kvf_auth_session_cleanup(&client->auth);
    SSL_CTX_free(client->tls_ctx);
    free(client->tls_server_name);
    free(client);
}

void kvf_ctl_client_set_draining(kvf_ctl_client_t *client, bool is_draining)
{
    client->is_draining = is_draining;
}

const char *kvf_ctl_client_problem(const kvf_ctl_client_t *client)
{
    if (client->state == KVF_CTL_STATE_READY) {
        return "";
    }
    return (client->problem[0] != '\0') ? client->problem : "connecting";
}

bool kvf_ctl_client_is_registered(const kvf_ctl_client_t *client)
{
    return client->state == KVF_CTL_STATE_READY;
}

uint32_t kvf_ctl_client_node_id(const kvf_ctl_client_t *client)
{
    return client->node_id;
}

void kvf_ctl_client_get_stats(const kvf_ctl_client_t *client,
                              kvf_ctl_client_stats_t *stats_p)
{
    *stats_p = client->stats;
}

void kvf_ctl_client_feed(kvf_ctl_client_t *client, int state, const void *data,
                         size_t len)
{
    static const kvf_ctl_state_t states[] = {
        KVF_CTL_STATE_HELLO, KVF_CTL_STATE_AUTH, KVF_CTL_STATE_REGISTER,
        KVF_CTL_STATE_READY, KVF_CTL_STATE_STOPPING};
    int sv[2];

    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) {
        return;
    }
    kvf_evconn_destroy(client->conn);
    client->conn = kvf_evconn_create(&client->group, sv[0], NULL, client);
    if (client->conn == NULL) { /* sv[0] closed with it */
        close(sv[1]);
        return;
    }
    client->state = states[(unsigned)state % 5u];
    if (client->state == KVF_CTL_STATE_HELLO) {
        kvf_ctl_client_send_hello(client); /* draws the auth nonce */
    }
    if (client->conn != NULL) {
        kvf_evconn_feed(client->conn, data, len); /* may reset it */
    }
    close(sv[1]);
}
