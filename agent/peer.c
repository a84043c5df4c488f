/* SPDX-License-Identifier: Apache-2.0 */
/* Copyright (c) 2026 The kvfabric authors */
#include "agent/peer.h"

#include "agent/keyhash.h"
#include "agent/local.h"
#include "agent/transports.h"

#include "common/log.h"
#include "common/time.h"
#include "proto/frame.h"

#include <event2/event.h>
#include <ucs/datastruct/khash.h>

#include <ctype.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/queue.h>

#define KVF_PEER_MAX_KEYS 65536u /* keys in one fetch */
/* Chunks being sent at once (peer_serve_max): past it a key is answered
 * busy. */
#define KVF_PEER_SERVE_MAX 4096u
/* Chunks being sent to one requester at once: a peer that never receives
 * what it asked for (rendezvous held open) ties up this many sends until
 * they time out, not the whole service; past it a key is answered busy. */
#define KVF_PEER_SERVE_PER_PEER 512u
/* Keys one fetch has asked of one holder and not settled: at most half the
 * holder's share, so two fetches from one requester (a prefetch and a
 * retrieve, two engines) fit too. */
#define KVF_PEER_ASK_WINDOW (KVF_PEER_SERVE_PER_PEER / 2)
/* Keys one PEER_CHUNK without a chunk answers beside its own
 * (PeerChunk.more_indexes): the frame stays inside the AM header. */
#define KVF_PEER_GROUP_MAX 40u
/* A key answered busy (the holder had its share of sends to us in flight,
 * it counts a send until UCX completes it, after our receive; or every
 * send it makes at once) is asked again this long after, the wait doubling
 * with each busy answer up to the most; until the fetch's deadline, when
 * it is a miss. */
#define KVF_PEER_BUSY_RETRY_US     1000
#define KVF_PEER_BUSY_RETRY_MAX_US 16000
#define KVF_PEER_HDR_MAX           KVF_MESH_HDR_MAX
/* PEER_CHUNKS: chunks up to this size travel several a message, up to
 * KVF_PEER_BATCH_MAX of them and KVF_PEER_BATCH_BYTES: one rendezvous for
 * all of them. Larger chunks go one a message (zero copy from the
 * registered pool). Its header (at most KVF_PEER_BATCH_HDR_MAX bytes, kept
 * with the batch until the send completes) describes every chunk. */
#define KVF_PEER_BATCH_CHUNK_MAX (128u << 10)
#define KVF_PEER_BATCH_MAX       KVF_UCX_IOV_MAX
#define KVF_PEER_BATCH_BYTES     (4u << 20)
#define KVF_PEER_BATCH_HDR_MAX   KVF_UCX_AM_IOV_HEADER_MAX
/* batches being sent at once (each holds its chunks) */
#define KVF_PEER_BATCHES 128u

typedef struct kvf_peer_fetch kvf_peer_fetch_t;

typedef enum {
    KVF_PEER_ITEM_WAIT = 0, /* asked, nothing arrived yet */
    KVF_PEER_ITEM_RECV,     /* payload being received into a slot */
    KVF_PEER_ITEM_DONE,     /* settled: fetched or missed */
    KVF_PEER_ITEM_FOLLOW,   /* another fetch is already getting this key */
    KVF_PEER_ITEM_LOCAL,    /* being copied from a same-host holder */
} kvf_peer_item_state_t;

typedef struct kvf_peer_item {
    kvf_peer_fetch_t *fetch;
    kvf_key_t key;
    uint32_t holder;
    kvf_ucx_ep_t *ep;  /* where it was asked: only it may answer */
    uint64_t offset;   /* the granted slot while receiving */
    uint64_t length;   /* of the chunk being received */
    uint64_t checksum; /* as the holder announced it */
    uint8_t state;
    /* the same-host copy missed it: ask the holder over UCX, which also
     * serves chunks its pool spilled to disk */
    bool is_local_missed;
    uint8_t busy_retries; /* times the holder answered busy */
    /* one transfer per key: a fetch asking for a key that an earlier fetch
     * is already getting (a prefetch, then the retrieve) follows it */
    struct kvf_peer_item *leader;        /* FOLLOW: the item we wait on */
    struct kvf_peer_item *followers;     /* items waiting on this one */
    struct kvf_peer_item *next_follower; /* in the leader's list */
} kvf_peer_item_t;

/* What a fetch asks of one holder over UCX: the endpoint (held; replies
 * count only from it) and a window of keys asked and not settled yet, so
 * a fetch of many keys never has more in flight at a holder than the
 * holder serves one requester at once (KVF_PEER_SERVE_PER_PEER): the rest
 * are asked as earlier ones land, pipelined, never answered busy. */
typedef struct kvf_peer_ask {
    kvf_ucx_ep_t *ep;
    uint32_t holder;
    uint32_t next;        /* first item not yet looked at for asking */
    uint32_t outstanding; /* asked, not settled */
} kvf_peer_ask_t;

struct kvf_peer_fetch {
    LIST_ENTRY(kvf_peer_fetch) link; /* peer->fetches */
    kvf_peer_t *peer;
    uint64_t request_id;
    uint64_t start_ns;
    kvf_peer_fetch_cb_t cb; /* NULL once canceled */
    void *arg;
    kvf_store_owner_t *owner; /* grants of chunks being received */
    kvf_peer_item_t *items;
    struct event *deadline_ev; /* kvf_peer_on_deadline */
    struct event *start_ev;    /* kvf_peer_on_start: holders given */
    uint32_t *holders;         /* given by the caller, until start_ev */
    struct event *ask_ev;      /* kvf_peer_on_ask: a window has room */
    kvf_peer_ask_t *asks;      /* one per holder asked over UCX */
    uint32_t num_asks;
    uint32_t num;
    uint32_t settled;
    uint32_t fetched;
    uint32_t inflight;    /* UCX operations not completed yet */
    uint32_t pending_ctl; /* controller requests not answered yet */
    bool done;            /* the callback has run (or was canceled) */
};

/* Chunks being read from this node's disk tier to serve a peer at once;
 * past it, a key only on disk is answered as a miss. */
#define KVF_PEER_DISK_SERVES 64u

/* A key a peer asked for that this node keeps on disk only: read back
 * into the pool (promoted) first, then served. */
typedef struct kvf_peer_disk_serve {
    struct kvf_peer *peer;
    kvf_ucx_ep_t *ep; /* held while the read is in flight */
    uint64_t request_id;
    uint32_t index;
    kvf_key_t key;
    struct kvf_peer_link_stats *link;
    bool is_used;
} kvf_peer_disk_serve_t;

/* A chunk being sent to a peer: pinned until UCX is done with it. */
typedef struct kvf_peer_serve {
    kvf_peer_t *peer;
    kvf_pool_entry_t *entry;
    const kvf_ucx_ep_t *ep; /* the requester's (a key of peer->sending) */
    struct kvf_peer_serve *next_free;
} kvf_peer_serve_t;

/* Chunks being sent to a requester as one PEER_CHUNKS message: pinned
 * until UCX is done with them. */
typedef struct kvf_peer_batch {
    kvf_peer_t *peer;
    const kvf_ucx_ep_t *ep; /* the requester's (a key of peer->sending) */
    uint64_t request_id;
    uint64_t bytes;
    uint32_t num;
    uint32_t indexes[KVF_PEER_BATCH_MAX];
    uint64_t lengths[KVF_PEER_BATCH_MAX];
    uint64_t checksums[KVF_PEER_BATCH_MAX];
    kvf_pool_entry_t *entries[KVF_PEER_BATCH_MAX];
    kvf_ucx_iov_t iov[KVF_PEER_BATCH_MAX];
    uint8_t hdr[KVF_PEER_BATCH_HDR_MAX]; /* until the send completes */
    struct kvf_peer_batch *next_free;
} kvf_peer_batch_t;

/* Chunks being received from one PEER_CHUNKS message, each into its
 * slot. */
typedef struct kvf_peer_rbatch {
    kvf_peer_fetch_t *fetch;
    uint32_t num;
    kvf_peer_item_t *items[KVF_PEER_BATCH_MAX];
    kvf_ucx_iov_t iov[KVF_PEER_BATCH_MAX];
    struct kvf_peer_rbatch *next_free;
} kvf_peer_rbatch_t;

/* Keys being fetched now, to the item getting each (UCX's khash): a fetch
 * asking for a key already on its way follows that item, in O(1). Keys are
 * digests already, so a few of their bits are the hash. */
KHASH_INIT(kvf_peer_keys, kvf_key_t, kvf_peer_item_t *, 1, kvf_key_khash,
           kvf_key_kheq)
KHASH_SET_INIT_INT(kvf_peer_holders)
/* requester endpoint -> chunks being sent to it */
KHASH_MAP_INIT_INT64(kvf_peer_sending, uint32_t)
/* Fetches in flight by request id: a holder's PEER_CHUNK(S) finds its
 * fetch in O(1), however many are in flight. */
KHASH_MAP_INIT_INT64(kvf_peer_fetches, kvf_peer_fetch_t *)

struct kvf_peer {
    kvf_mesh_t *mesh;                  /* node directory: holders' addresses */
    khash_t(kvf_peer_keys) inflight;   /* key -> the item getting it */
    khash_t(kvf_peer_sending) sending; /* per requester, for the quota */
    kvf_ucx_worker_t *worker;
    kvf_ucx_mem_t *pool_mem;
    kvf_store_t *store;
    kvf_ctl_client_t *ctl;
    uint64_t timeout_ns;
    char name[128];
    LIST_HEAD(, kvf_peer_fetch) fetches;
    khash_t(kvf_peer_fetches) fetches_by_id;
    struct event_base *base;
    kvf_peer_serve_t *serves; /* serve_max of them */
    kvf_peer_serve_t *serve_free;
    uint32_t serve_max;
    kvf_peer_batch_t *batches; /* KVF_PEER_BATCHES */
    kvf_peer_batch_t *batch_free;
    kvf_peer_rbatch_t *rbatch_free; /* made on demand, kept */
    kvf_peer_stats_t stats;
    kvf_peer_link_stats_t links[KVF_PEER_LINKS_MAX];
    uint32_t num_links;
    kvf_peer_disk_serve_t disk_serves[KVF_PEER_DISK_SERVES];
    kvf_local_t *local;           /* the same-host path, or NULL */
    kvf_transports_t *transports; /* transport truth, or NULL */
    bool destroying;
};

/* A fetch in flight by request id, or NULL. */
static kvf_peer_fetch_t *kvf_peer_fetch_find(kvf_peer_t *peer,
                                             uint64_t request_id)
{
    khiter_t it = kh_get(kvf_peer_fetches, &peer->fetches_by_id, request_id);

    return (it == kh_end(&peer->fetches_by_id))
               ? NULL
               : kh_value(&peer->fetches_by_id, it);
}

/* Frees @p fetch and what it made (any of it may be missing); its
 * endpoints are the caller's. */
static void kvf_peer_fetch_free(kvf_peer_fetch_t *fetch)
{
    kvf_store_owner_destroy(fetch->peer->store, fetch->owner);
    if (fetch->deadline_ev != NULL) {
        event_free(fetch->deadline_ev);
    }
    if (fetch->start_ev != NULL) {
        event_free(fetch->start_ev);
    }
    if (fetch->ask_ev != NULL) {
        event_free(fetch->ask_ev);
    }
    free(fetch->holders);
    free(fetch->asks);
    free(fetch->items);
    free(fetch);
}

static void kvf_peer_fetch_maybe_free(kvf_peer_fetch_t *fetch)
{
    kvf_peer_t *peer = fetch->peer;
    khiter_t it;
    uint32_t i;

    if (!fetch->done || (fetch->inflight > 0) || (fetch->pending_ctl > 0)) {
        return;
    }
    it = kh_get(kvf_peer_fetches, &peer->fetches_by_id, fetch->request_id);
    if (it != kh_end(&peer->fetches_by_id)) {
        kh_del(kvf_peer_fetches, &peer->fetches_by_id, it);
    }
    LIST_REMOVE(fetch, link);
    for (i = 0; i < fetch->num_asks; i++) {
        kvf_ucx_ep_put(fetch->asks[i].ep);
    }
    kvf_peer_fetch_free(fetch);
}

const uint64_t kvf_peer_lat_bounds_us[KVF_PEER_LAT_BUCKETS] = {
    250,   500,   1000,   2500,   5000,    10000,
    25000, 50000, 100000, 250000, 1000000, 5000000};

static void kvf_peer_fetch_maybe_free(kvf_peer_fetch_t *fetch);

/* @p item no longer leads its key (settled, or its fetch is done). */
static void kvf_peer_inflight_forget(kvf_peer_t *peer, kvf_peer_item_t *item)
{
    khiter_t it = kh_get(kvf_peer_keys, &peer->inflight, item->key);

    if ((it != kh_end(&peer->inflight)) &&
        (kh_value(&peer->inflight, it) == item)) {
        kh_del(kvf_peer_keys, &peer->inflight, it);
    }
}

static void kvf_peer_fetch_complete(kvf_peer_fetch_t *fetch)
{
    kvf_peer_stats_t *st = &fetch->peer->stats;
    uint32_t i;

    if (fetch->done) {
        return;
    }
    fetch->done = true;
    evtimer_del(fetch->deadline_ev);
    for (i = 0; i < fetch->num; i++) {
        kvf_peer_inflight_forget(fetch->peer, &fetch->items[i]);
    }
    kvf_peer_lat_record(st->lat_counts, &st->lat_sum_us,
                        (kvf_time_now_ns() - fetch->start_ns) /
                            KVF_NSEC_PER_USEC);
    fetch->peer->stats.chunks_missed += fetch->num - fetch->fetched;
    if (fetch->cb != NULL) {
        fetch->cb(fetch->arg, fetch->fetched, fetch->num - fetch->fetched);
    }
}

static void kvf_peer_item_unfollow(kvf_peer_item_t *item)
{
    kvf_peer_item_t **pp;

    if (item->leader == NULL) {
        return;
    }
    for (pp = &item->leader->followers; *pp != NULL;
         pp = &(*pp)->next_follower) {
        if (*pp == item) {
            *pp = item->next_follower;
            break;
        }
    }
    item->leader = NULL;
}

/* The window of @p holder in @p fetch, or NULL. */
static kvf_peer_ask_t *kvf_peer_ask_of(kvf_peer_fetch_t *fetch, uint32_t holder)
{
    uint32_t i;

    for (i = 0; i < fetch->num_asks; i++) {
        if (fetch->asks[i].holder == holder) {
            return &fetch->asks[i];
        }
    }
    return NULL;
}

/* A key asked of @p holder settled: its window has room again; more are
 * asked from the loop (never from inside a settle). */
static void kvf_peer_ask_settled(kvf_peer_fetch_t *fetch, uint32_t holder)
{
    kvf_peer_ask_t *ask = kvf_peer_ask_of(fetch, holder);

    if ((ask != NULL) && (--ask->outstanding <= KVF_PEER_ASK_WINDOW / 2) &&
        (ask->next < fetch->num) && !fetch->done) {
        event_active(fetch->ask_ev, EV_TIMEOUT, 1);
    }
}

static void kvf_peer_item_settle(kvf_peer_item_t *item, bool fetched)
{
    kvf_peer_fetch_t *fetch = item->fetch;
    kvf_peer_item_t *f;

    if (item->state == KVF_PEER_ITEM_DONE) {
        return;
    }
    kvf_peer_item_unfollow(item);
    kvf_peer_inflight_forget(fetch->peer, item);
    if (item->ep != NULL) {
        kvf_peer_ask_settled(fetch, item->holder);
    }
    item->state = KVF_PEER_ITEM_DONE;
    fetch->settled++;
    if (fetched) {
        fetch->fetched++;
    }
    /* those waiting on this key get the same outcome */
    while ((f = item->followers) != NULL) {
        kvf_peer_fetch_t *ff = f->fetch;

        item->followers = f->next_follower;
        f->leader       = NULL;
        kvf_peer_item_settle(f, fetched);
        kvf_peer_fetch_maybe_free(ff); /* never the leader's own fetch */
    }
    if (fetch->settled >= fetch->num) {
        kvf_peer_fetch_complete(fetch);
    }
}

/* An item of a fetch in flight that is getting @p key, or NULL. */
static kvf_peer_item_t *kvf_peer_find_inflight(kvf_peer_t *peer,
                                               const kvf_key_t *key)
{
    khiter_t it = kh_get(kvf_peer_keys, &peer->inflight, *key);

    return (it == kh_end(&peer->inflight)) ? NULL
                                           : kh_value(&peer->inflight, it);
}

/* Settles every item still waiting on @p holder (0: all) as missed. */
static void kvf_peer_fetch_miss_waiting(kvf_peer_fetch_t *fetch,
                                        uint32_t holder)
{
    uint32_t i;

    for (i = 0; (i < fetch->num) && !fetch->done; i++) {
        if ((fetch->items[i].state == KVF_PEER_ITEM_WAIT) &&
            ((holder == 0) || (fetch->items[i].holder == holder))) {
            kvf_peer_item_settle(&fetch->items[i], false);
        }
    }
}

/* Fetch @p arg reached its deadline (a libevent timer per fetch: its min
 * heap orders them, nothing is scanned on a fixed tick). */
static void kvf_peer_on_deadline(evutil_socket_t fd, short what, void *arg)
{
    kvf_peer_fetch_t *fetch = arg;
    kvf_peer_t *peer        = fetch->peer;
    uint32_t i;

    if (fetch->done) {
        return;
    }
    peer->stats.timeouts++;
    kvf_debug("%s: fetch %llu timed out with %u of %u chunks", peer->name,
              (unsigned long long)fetch->request_id, fetch->fetched,
              fetch->num);
    /* what has not arrived is a miss (followers of these keys included);
     * chunks still arriving may complete later and are simply committed
     * then: the engine has moved on */
    for (i = 0; (i < fetch->num) && !fetch->done; i++) {
        if ((fetch->items[i].state == KVF_PEER_ITEM_WAIT) ||
            (fetch->items[i].state == KVF_PEER_ITEM_FOLLOW)) {
            kvf_peer_item_settle(&fetch->items[i], false);
        }
    }
    fetch->settled = fetch->num;
    kvf_peer_fetch_complete(fetch);
    kvf_peer_fetch_maybe_free(fetch);
}

/* ------------------------------------------------------- requester side */

#define KVF_PEER_KEYS_PER_ASK 512u

/* A PEER_FETCH send to holder @p tag completed. */
static void kvf_peer_on_fetch_sent(kvf_status_t status, void *arg, uint64_t tag)
{
    kvf_peer_fetch_t *fetch = arg;
    uint32_t holder         = (uint32_t)tag;

    fetch->inflight--;
    if (status != KVF_OK) {
        kvf_debug("%s: fetch request to node %u failed: %s", fetch->peer->name,
                  holder, kvf_strerror(status));
        kvf_mesh_node_forget(fetch->peer->mesh, holder, NULL);
        kvf_peer_fetch_miss_waiting(fetch, holder);
    }
    kvf_peer_fetch_maybe_free(fetch);
}

static void kvf_peer_fetch_ask(kvf_peer_fetch_t *fetch, uint32_t holder,
                               const char *data_address);

/* The endpoint to a holder finished its handshake (tag: the holder). */
static void kvf_peer_on_ready(void *arg, kvf_status_t status, kvf_ucx_ep_t *ep,
                              uint64_t tag)
{
    kvf_peer_fetch_t *fetch = arg;
    uint32_t holder         = (uint32_t)tag;

    fetch->pending_ctl--;
    if (!fetch->done) {
        if (status == KVF_OK) {
            kvf_peer_fetch_ask(fetch, holder, kvf_ucx_ep_peer(ep));
        } else {
            kvf_debug("%s: holder node %u not authenticated: %s",
                      fetch->peer->name, holder, kvf_strerror(status));
            kvf_mesh_node_forget(fetch->peer->mesh, holder, NULL);
            kvf_peer_fetch_miss_waiting(fetch, holder);
        }
    }
    kvf_peer_fetch_maybe_free(fetch);
}

/* Sends PEER_FETCH messages (up to KVF_PEER_KEYS_PER_ASK keys each) for
 * the keys that @p holder holds, once the endpoint to it is authenticated
 * (kvf_mesh_connect). */
static bool kvf_peer_fetch_local(kvf_peer_fetch_t *fetch, uint32_t holder,
                                 const char *data_address);

/* Asks @p ask's holder for more of the fetch's keys it holds, in
 * PEER_FETCH messages of up to KVF_PEER_KEYS_PER_ASK keys, while its
 * window has room. A request that cannot be sent misses what is waiting on
 * that holder. */
static void kvf_peer_fetch_ask_more(kvf_peer_fetch_t *fetch,
                                    kvf_peer_ask_t *ask)
{
    uint8_t keys[KVF_PEER_KEYS_PER_ASK * KVF_KEY_WIRE_SIZE];
    uint32_t indexes[KVF_PEER_KEYS_PER_ASK];
    kvf_peer_t *peer = fetch->peer;
    Kvf__PeerFetch req;
    kvf_status_t status;
    uint32_t n, room;

    while (!fetch->done && (ask->outstanding < KVF_PEER_ASK_WINDOW)) {
        room = KVF_PEER_ASK_WINDOW - ask->outstanding;
        room = (room < KVF_PEER_KEYS_PER_ASK) ? room : KVF_PEER_KEYS_PER_ASK;
        for (n = 0; (ask->next < fetch->num) && (n < room); ask->next++) {
            kvf_peer_item_t *item = &fetch->items[ask->next];

            if ((item->holder == ask->holder) && (item->ep == NULL) &&
                (item->state == KVF_PEER_ITEM_WAIT)) {
                kvf_key_pack(&item->key, keys + (size_t)n * KVF_KEY_WIRE_SIZE);
                item->ep     = ask->ep;
                indexes[n++] = ask->next;
            }
        }
        if (n == 0) {
            return;
        }
        ask->outstanding += n;
        kvf__peer_fetch__init(&req);
        req.request_id     = fetch->request_id;
        req.keys.data      = keys;
        req.keys.len       = (size_t)n * KVF_KEY_WIRE_SIZE;
        req.n_indexes      = n;
        req.indexes        = indexes;
        req.requester      = kvf_ctl_client_node_id(fetch->peer->ctl);
        req.requester_name = fetch->peer->name;
        req.batch          = true;
        req.grouped        = true;
        status =
            kvf_mesh_send_frame(peer->mesh, ask->ep, KVF_MESH_AM_PEER_FETCH,
                                KVF_MSG_PEER_FETCH, &req.base, peer->timeout_ns,
                                kvf_peer_on_fetch_sent, fetch, ask->holder);
        if (status != KVF_OK) {
            /* what it asked for, and what waits on this holder, is a miss */
            kvf_peer_fetch_miss_waiting(fetch, ask->holder);
            return;
        }
        fetch->inflight++;
    }
}

/* A window has room (kvf_peer_ask_settled): ask for more. */
static void kvf_peer_on_ask(evutil_socket_t fd, short what, void *arg)
{
    kvf_peer_fetch_t *fetch = arg;
    uint32_t i;

    for (i = 0; (i < fetch->num_asks) && !fetch->done; i++) {
        kvf_peer_fetch_ask_more(fetch, &fetch->asks[i]);
    }
    kvf_peer_fetch_maybe_free(fetch);
}

static void kvf_peer_fetch_ask(kvf_peer_fetch_t *fetch, uint32_t holder,
                               const char *data_address)
{
    kvf_peer_t *peer    = fetch->peer;
    kvf_ucx_ep_t *ep    = NULL;
    kvf_peer_ask_t *ask = NULL, *asks;
    kvf_status_t status;
    uint32_t i;

    if (kvf_peer_fetch_local(fetch, holder, data_address)) {
        return; /* same host: copied, or back here when it cannot be */
    }
    status = kvf_ucx_ep_get(peer->worker, data_address, NULL, &ep);
    if (status != KVF_OK) {
        kvf_debug("%s: no endpoint to node %u at %s: %s", peer->name, holder,
                  data_address, kvf_strerror(status));
        kvf_peer_fetch_miss_waiting(fetch, holder);
        return;
    }
    status = kvf_mesh_connect(peer->mesh, ep, holder, NULL, kvf_peer_on_ready,
                              fetch, holder);
    if (status != KVF_OK) {
        kvf_ucx_ep_put(ep);
        if (status == KVF_INPROGRESS) {
            fetch->pending_ctl++; /* kvf_peer_on_ready asks again */
        } else {
            kvf_peer_fetch_miss_waiting(fetch, holder);
        }
        return;
    }
    /* the fetch keeps the endpoint: replies count only from it; a holder
     * asked again (keys its same-host copy missed) keeps its window */
    for (i = 0; i < fetch->num_asks; i++) {
        if ((fetch->asks[i].holder == holder) && (fetch->asks[i].ep == ep)) {
            ask = &fetch->asks[i];
            kvf_ucx_ep_put(ep);
            ask->next = 0;
            break;
        }
    }
    if (ask == NULL) {
        asks = realloc(fetch->asks, (fetch->num_asks + 1) * sizeof(*asks));
        if (asks == NULL) {
            kvf_ucx_ep_put(ep);
            kvf_peer_fetch_miss_waiting(fetch, holder);
            return;
        }
        fetch->asks = asks;
        ask         = &fetch->asks[fetch->num_asks++];
        memset(ask, 0, sizeof(*ask));
        ask->ep     = ep;
        ask->holder = holder;
    }
    kvf_peer_fetch_ask_more(fetch, ask);
}

/* The traffic row of node @p node_id, made (and named from @p name, when
 * one is given) on first use: a per-chunk call is a short scan, no string
 * work. */
static kvf_peer_link_stats_t *kvf_peer_link(kvf_peer_t *peer, uint32_t node_id,
                                            const char *name)
{
    kvf_peer_link_stats_t *link = NULL;
    uint32_t i;
    size_t k;

    for (i = 0; i < peer->num_links; i++) {
        if (peer->links[i].node_id == node_id) {
            return &peer->links[i]; /* named when it was made */
        }
    }
    if (peer->num_links == KVF_PEER_LINKS_MAX) {
        link = &peer->links[KVF_PEER_LINKS_MAX - 1];
        if (link->node_id != UINT32_MAX) {
            link->node_id = UINT32_MAX;
            snprintf(link->name, sizeof(link->name), "other");
        }
        return link;
    }
    link = &peer->links[peer->num_links++];
    memset(link, 0, sizeof(*link));
    link->node_id = node_id;
    snprintf(link->name, sizeof(link->name), "node-%" PRIu32, node_id);
    if ((name != NULL) && (name[0] != '\0')) {
        for (k = 0; (k < sizeof(link->name) - 1) && (name[k] != '\0'); k++) {
            link->name[k] =
                (isalnum((unsigned char)name[k]) || (name[k] == '.') ||
                 (name[k] == '_') || (name[k] == '-'))
                    ? name[k]
                    : '_';
        }
        link->name[k] = '\0';
    }
    return link;
}

/* ------------------------------------------------------ same-host path */

/* The keys of one fetch asked of one same-host holder (agent/local.h). */
typedef struct kvf_peer_local_ask {
    kvf_peer_fetch_t *fetch;
    uint32_t holder;
    char address[KVF_MESH_ADDR_MAX];
    uint32_t num;
    uint32_t indexes[]; /* items, in the order of the keys asked */
} kvf_peer_local_ask_t;

static void kvf_peer_on_local(void *arg, kvf_status_t status,
                              const kvf_local_result_t *res, uint32_t num,
                              const char *holder_name)
{
    kvf_peer_local_ask_t *ask = arg;
    kvf_peer_fetch_t *fetch   = ask->fetch;
    kvf_peer_t *peer          = fetch->peer;
    bool fallback             = false;
    uint32_t i;

    fetch->inflight--;
    if (status != KVF_ERR_UNSUPPORTED) {
        /* names the holder's traffic row, as a PEER_CHUNK does */
        kvf_peer_link(peer, ask->holder, holder_name);
    }
    for (i = 0; i < num; i++) {
        kvf_peer_item_t *item = &fetch->items[ask->indexes[i]];

        if (item->state != KVF_PEER_ITEM_LOCAL) {
            continue;
        }
        item->state = KVF_PEER_ITEM_WAIT; /* so settle counts it */
        if (status == KVF_ERR_UNSUPPORTED) {
            fallback = true; /* not same host after all: over UCX */
            continue;
        }
        if (res[i].bytes > 0) {
            kvf_peer_link_stats_t *link =
                kvf_peer_link(peer, item->holder, holder_name);

            peer->stats.chunks_fetched++;
            peer->stats.bytes_fetched += res[i].bytes;
            link->chunks_fetched++;
            link->bytes_fetched += res[i].bytes;
        } else if (res[i].status == KVF_ERR_CHECKSUM) {
            peer->stats.checksum_failures++;
        } else {
            item->is_local_missed = true; /* not in its pool: over UCX */
            fallback              = true;
            continue;
        }
        kvf_peer_item_settle(item, res[i].bytes > 0);
    }
    if (fallback && !fetch->done) {
        kvf_peer_fetch_ask(fetch, ask->holder, ask->address);
    }
    free(ask);
    kvf_peer_fetch_maybe_free(fetch);
}

/* Same host? Copies the keys waiting on @p holder from its pool (true:
 * they are on their way); false: ask over UCX. */
static bool kvf_peer_fetch_local(kvf_peer_fetch_t *fetch, uint32_t holder,
                                 const char *data_address)
{
    kvf_peer_t *peer = fetch->peer;
    kvf_peer_local_ask_t *ask;
    kvf_key_t *keys;
    uint32_t i, n = 0, missed = 0;

    if ((peer->local == NULL) ||
        (strlen(data_address) >= sizeof(ask->address))) {
        return false;
    }
    ask  = malloc(sizeof(*ask) + (size_t)fetch->num * sizeof(uint32_t));
    keys = malloc((size_t)fetch->num * sizeof(*keys));
    if ((ask == NULL) || (keys == NULL)) {
        free(ask);
        free(keys);
        return false;
    }
    for (i = 0; i < fetch->num; i++) {
        if ((fetch->items[i].holder != holder) ||
            (fetch->items[i].state != KVF_PEER_ITEM_WAIT)) {
            continue;
        }
        if (fetch->items[i].is_local_missed) {
            missed++;
            continue;
        }
        keys[n]           = fetch->items[i].key;
        ask->indexes[n++] = i;
    }
    ask->fetch  = fetch;
    ask->holder = holder;
    ask->num    = n;
    snprintf(ask->address, sizeof(ask->address), "%s", data_address);
    if ((n == 0) ||
        (kvf_local_fetch(peer->local, holder, data_address, keys, n,
                         fetch->owner, kvf_peer_on_local, ask) != KVF_OK)) {
        free(keys);
        free(ask);
        return (n == 0) && (missed == 0);
    }
    free(keys);
    for (i = 0; i < n; i++) {
        fetch->items[ask->indexes[i]].state = KVF_PEER_ITEM_LOCAL;
    }
    fetch->inflight++;
    return true;
}

void kvf_peer_set_local(kvf_peer_t *peer, kvf_local_t *local)
{
    peer->local = local;
}

void kvf_peer_set_transports(kvf_peer_t *peer, struct kvf_transports *t)
{
    peer->transports = t;
}

void kvf_peer_count_served(kvf_peer_t *peer, uint32_t node_id, const char *name,
                           uint64_t chunks, uint64_t bytes)
{
    kvf_peer_link_stats_t *link = kvf_peer_link(peer, node_id, name);

    peer->stats.chunks_served += chunks;
    peer->stats.bytes_served += bytes;
    link->chunks_served += chunks;
    link->bytes_served += bytes;
}

static void kvf_peer_on_node(void *arg, kvf_status_t status, uint32_t node_id,
                             const char *data_address, bool alive)
{
    kvf_peer_fetch_t *fetch = arg;

    fetch->pending_ctl--;
    if (!fetch->done) {
        if ((status != KVF_OK) || !alive || (data_address[0] == '\0')) {
            kvf_debug("%s: holder node %u unusable: %s%s", fetch->peer->name,
                      node_id, kvf_strerror(status),
                      alive ? "" : ", not alive");
            kvf_peer_fetch_miss_waiting(fetch, node_id);
        } else {
            kvf_mesh_node_store(fetch->peer->mesh, node_id, NULL, data_address);
            kvf_peer_fetch_ask(fetch, node_id, data_address);
        }
    }
    kvf_peer_fetch_maybe_free(fetch);
}

static void kvf_peer_on_lookup(void *arg, kvf_status_t status,
                               uint32_t hit_chunks, const uint32_t *holders,
                               uint32_t num)
{
    kvf_peer_fetch_t *fetch = arg;
    kvf_peer_t *peer        = fetch->peer;
    uint32_t self           = kvf_ctl_client_node_id(peer->ctl);
    khash_t(kvf_peer_holders) * seen;
    uint32_t i;

    fetch->pending_ctl--;
    if (fetch->done) {
        kvf_peer_fetch_maybe_free(fetch);
        return;
    }
    if ((status != KVF_OK) || (num != fetch->num)) {
        kvf_debug("%s: fetch %llu: controller lookup failed: %s", peer->name,
                  (unsigned long long)fetch->request_id, kvf_strerror(status));
        kvf_peer_fetch_miss_waiting(fetch, 0);
        kvf_peer_fetch_maybe_free(fetch);
        return;
    }
    for (i = 0; i < num; i++) {
        fetch->items[i].holder = holders[i];
        if (fetch->items[i].state != KVF_PEER_ITEM_WAIT) {
            continue; /* following another fetch of the same key */
        }
        if ((holders[i] == 0) || (holders[i] == self)) {
            /* nobody else has it (or only a stale record of ourselves) */
            kvf_peer_item_settle(&fetch->items[i], false);
        }
    }
    /* one NODE_INFO per distinct holder, then one PEER_FETCH per holder
     * (which asks for every key waiting on it): a set of holders asked */
    seen = kh_init(kvf_peer_holders);
    for (i = 0; (i < num) && !fetch->done; i++) {
        int ret = 1;

        if (fetch->items[i].state != KVF_PEER_ITEM_WAIT) {
            continue;
        }
        if (seen != NULL) {
            kh_put(kvf_peer_holders, seen, holders[i], &ret);
        }
        if (ret != 0) { /* new (or no set: asking twice is harmless) */
            const char *addr = kvf_mesh_node_by_id(peer->mesh, holders[i]);

            if (addr != NULL) {
                kvf_peer_fetch_ask(fetch, holders[i], addr);
                continue;
            }
            fetch->pending_ctl++;
            kvf_ctl_client_node_info(peer->ctl, holders[i], kvf_peer_on_node,
                                     fetch);
        }
    }
    kh_destroy(kvf_peer_holders, seen);
    kvf_peer_fetch_maybe_free(fetch);
}

/* The holders a caller's own LOOKUP named go to kvf_peer_on_lookup from
 * the loop (never inside kvf_peer_fetch_from: it may settle the fetch). */
static void kvf_peer_on_start(evutil_socket_t fd, short what, void *arg)
{
    kvf_peer_fetch_t *fetch = arg;
    uint32_t *holders       = fetch->holders;

    fetch->holders = NULL;
    kvf_peer_on_lookup(fetch, KVF_OK, 0, holders, fetch->num);
    free(holders);
}

static kvf_status_t kvf_peer_fetch_start(kvf_peer_t *peer,
                                         const kvf_key_t *keys,
                                         const uint32_t *holders, uint32_t num,
                                         kvf_peer_fetch_cb_t cb, void *arg)
{
    kvf_peer_fetch_t *fetch;
    struct timeval tv;
    uint32_t i, waiting = num;
    khiter_t it;
    int ret;

    if ((peer->ctl == NULL) || !kvf_ctl_client_is_registered(peer->ctl)) {
        return KVF_ERR_STATE;
    }
    if ((num == 0) || (num > KVF_PEER_MAX_KEYS)) {
        return KVF_ERR_INVALID;
    }
    fetch = calloc(1, sizeof(*fetch));
    if (fetch == NULL) {
        return KVF_ERR_NO_MEMORY;
    }
    fetch->peer  = peer;
    fetch->items = calloc(num, sizeof(*fetch->items));
    if ((fetch->items == NULL) ||
        (kvf_store_owner_create(peer->store, &fetch->owner) != KVF_OK)) {
        free(fetch->items);
        free(fetch);
        return KVF_ERR_NO_MEMORY;
    }
    fetch->deadline_ev = evtimer_new(peer->base, kvf_peer_on_deadline, fetch);
    fetch->ask_ev      = evtimer_new(peer->base, kvf_peer_on_ask, fetch);
    if (holders != NULL) {
        fetch->start_ev = evtimer_new(peer->base, kvf_peer_on_start, fetch);
        fetch->holders  = malloc(((size_t)num + 1) * sizeof(*holders));
    }
    do { /* random (unguessable), and unique among ours */
        fetch->request_id = kvf_mesh_random_id(peer->mesh);
    } while (kvf_peer_fetch_find(peer, fetch->request_id) != NULL);
    it =
        kh_put(kvf_peer_fetches, &peer->fetches_by_id, fetch->request_id, &ret);
    if ((ret < 0) || (fetch->deadline_ev == NULL) || (fetch->ask_ev == NULL) ||
        ((holders != NULL) &&
         ((fetch->start_ev == NULL) || (fetch->holders == NULL)))) {
        if (ret >= 0) {
            kh_del(kvf_peer_fetches, &peer->fetches_by_id, it);
        }
        kvf_peer_fetch_free(fetch);
        return KVF_ERR_NO_MEMORY;
    }
    kh_value(&peer->fetches_by_id, it) = fetch;
    fetch->start_ns                    = kvf_time_now_ns();
    fetch->cb                          = cb;
    fetch->arg                         = arg;
    fetch->num                         = num;
    for (i = 0; i < num; i++) {
        kvf_peer_item_t *leader = kvf_peer_find_inflight(peer, &keys[i]);

        fetch->items[i].fetch = fetch;
        fetch->items[i].key   = keys[i];
        if (leader != NULL) {
            fetch->items[i].state         = KVF_PEER_ITEM_FOLLOW;
            fetch->items[i].leader        = leader;
            fetch->items[i].next_follower = leader->followers;
            leader->followers             = &fetch->items[i];
            waiting--;
        }
    }
    /* the keys this fetch gets are now on their way (after the loop: a key
     * asked twice in one fetch is asked twice, as before) */
    for (i = 0; i < num; i++) {
        if (fetch->items[i].state == KVF_PEER_ITEM_WAIT) {
            it = kh_put(kvf_peer_keys, &peer->inflight, keys[i], &ret);
            if (ret > 0) {
                kh_value(&peer->inflight, it) = &fetch->items[i];
            }
        }
    }
    LIST_INSERT_HEAD(&peer->fetches, fetch, link);
    peer->stats.fetches++;
    tv = kvf_time_to_timeval(peer->timeout_ns);
    evtimer_add(fetch->deadline_ev, &tv);
    if ((waiting > 0) && (holders != NULL)) {
        /* the caller's LOOKUP named the holders: no second one */
        memcpy(fetch->holders, holders, (size_t)num * sizeof(*holders));
        fetch->pending_ctl++;
        event_active(fetch->start_ev, EV_TIMEOUT, 1);
    } else if (waiting > 0) {
        /* only keys nobody is fetching yet need holders */
        fetch->pending_ctl++;
        kvf_ctl_client_lookup(peer->ctl, keys, num, true, 0, kvf_peer_on_lookup,
                              fetch);
    }
    return KVF_OK;
}

kvf_status_t kvf_peer_fetch(kvf_peer_t *peer, const kvf_key_t *keys,
                            uint32_t num, kvf_peer_fetch_cb_t cb, void *arg)
{
    return kvf_peer_fetch_start(peer, keys, NULL, num, cb, arg);
}

kvf_status_t kvf_peer_fetch_from(kvf_peer_t *peer, const kvf_key_t *keys,
                                 const uint32_t *holders, uint32_t num,
                                 kvf_peer_fetch_cb_t cb, void *arg)
{
    if (holders == NULL) {
        return KVF_ERR_INVALID;
    }
    return kvf_peer_fetch_start(peer, keys, holders, num, cb, arg);
}

void kvf_peer_cancel(kvf_peer_t *peer, const void *arg)
{
    kvf_peer_fetch_t *fetch;

    LIST_FOREACH(fetch, &peer->fetches, link) {
        if (fetch->arg == arg) {
            fetch->cb = NULL;
        }
    }
}

/* A message without payload (a miss, a damaged-chunk report) went. */
static void kvf_peer_on_miss_sent(kvf_status_t status, void *arg)
{
    /* nothing to release */
}

/* The bytes of @p item landed in its slot (KVF_OK) or not: verify and
 * commit, or give the slot back; settle the item. The fetch stays. */
static void kvf_peer_item_landed(kvf_peer_item_t *item, kvf_status_t status)
{
    kvf_peer_fetch_t *fetch = item->fetch;
    kvf_peer_t *peer        = fetch->peer;
    bool fetched            = false;

    if (status == KVF_OK) {
        /* the commit recomputes the checksum over the bytes that landed:
         * a damaged or torn transfer is refused here */
        status = kvf_store_commit_landed(peer->store, fetch->owner, &item->key,
                                         item->offset, item->checksum);
        if ((status == KVF_OK) || (status == KVF_ERR_EXISTS)) {
            kvf_peer_link_stats_t *link =
                kvf_peer_link(peer, item->holder, NULL);

            /* counted once verified, per peer as in total: a refused or
             * torn transfer is no fetched chunk */
            fetched = true;
            peer->stats.chunks_fetched++;
            peer->stats.bytes_fetched += item->length;
            link->chunks_fetched++;
            link->bytes_fetched += item->length;
        } else if (status == KVF_ERR_CHECKSUM) {
            uint8_t key[KVF_KEY_WIRE_SIZE];
            kvf_mesh_am_payload_t p = {.header     = key,
                                       .header_len = sizeof(key),
                                       .flags      = KVF_UCX_AM_SEND_EAGER};

            peer->stats.checksum_failures++;
            kvf_warn("%s: chunk from node %u failed its checksum; refused",
                     peer->name, item->holder);
            /* the holder re-verifies and drops it if it is damaged there:
             * nobody else fetches the same bad bytes */
            kvf_key_pack(&item->key, key);
            kvf_mesh_send_am(peer->mesh, item->ep, KVF_MESH_AM_PEER_BAD, &p,
                             peer->timeout_ns, kvf_peer_on_miss_sent, NULL);
        }
    } else {
        kvf_store_release(peer->store, fetch->owner, item->offset);
    }
    if (item->state == KVF_PEER_ITEM_RECV) {
        item->state = KVF_PEER_ITEM_WAIT; /* so settle counts it */
        kvf_peer_item_settle(item, fetched);
    }
}

static void kvf_peer_on_recv(kvf_status_t status, void *arg)
{
    kvf_peer_item_t *item   = arg;
    kvf_peer_fetch_t *fetch = item->fetch;

    fetch->inflight--;
    kvf_peer_item_landed(item, status);
    kvf_peer_fetch_maybe_free(fetch);
}

/* Every chunk of a PEER_CHUNKS message landed (KVF_OK) or not. */
static void kvf_peer_on_batch_recv(kvf_status_t status, void *arg)
{
    kvf_peer_rbatch_t *rb   = arg;
    kvf_peer_fetch_t *fetch = rb->fetch;
    kvf_peer_t *peer        = fetch->peer;
    uint32_t j;

    fetch->inflight--;
    for (j = 0; j < rb->num; j++) {
        kvf_peer_item_landed(rb->items[j], status);
    }
    rb->next_free     = peer->rbatch_free;
    peer->rbatch_free = rb;
    kvf_peer_fetch_maybe_free(fetch);
}

/* The holder answered item @p index busy: ask for it again shortly, from
 * the loop (by the fetch's deadline, which ends every wait). */
static void kvf_peer_item_busy(kvf_peer_fetch_t *fetch, uint32_t index)
{
    kvf_peer_item_t *item = &fetch->items[index];
    kvf_peer_ask_t *ask   = kvf_peer_ask_of(fetch, item->holder);
    uint32_t wait_us      = KVF_PEER_BUSY_RETRY_US << item->busy_retries;
    struct timeval tv     = {0, 0};

    if ((ask == NULL) || fetch->done) {
        kvf_peer_item_settle(item, false);
        return;
    }
    if (wait_us >= KVF_PEER_BUSY_RETRY_MAX_US) {
        wait_us = KVF_PEER_BUSY_RETRY_MAX_US;
    } else {
        item->busy_retries++; /* the wait doubles, up to the most */
    }
    tv.tv_usec = (suseconds_t)wait_us;
    item->ep   = NULL; /* not asked any more: asked again below */
    ask->outstanding--;
    if (index < ask->next) {
        ask->next = index;
    }
    if (!evtimer_pending(fetch->ask_ev, NULL)) {
        evtimer_add(fetch->ask_ev, &tv);
    }
}

/* The other keys a missed PEER_CHUNK answers (PeerChunk.more_indexes):
 * each settles as a miss when it is one this fetch asked of @p ep and
 * still waits for; anything else in the list is ignored. */
static void kvf_peer_on_more_misses(kvf_peer_fetch_t *fetch,
                                    const kvf_ucx_ep_t *ep,
                                    const Kvf__PeerChunk *chunk)
{
    kvf_peer_item_t *item;
    size_t j;

    for (j = 0; (j < chunk->n_more_indexes) && (j < KVF_PEER_GROUP_MAX) &&
                !fetch->done;
         j++) {
        if (chunk->more_indexes[j] >= fetch->num) {
            continue;
        }
        item = &fetch->items[chunk->more_indexes[j]];
        if ((item->state != KVF_PEER_ITEM_WAIT) || (item->ep != ep)) {
            continue;
        }
        if (chunk->status == KVF_ERR_BUSY) {
            kvf_peer_item_busy(fetch, chunk->more_indexes[j]);
        } else {
            kvf_peer_item_settle(item, false);
        }
    }
}

/* Several chunks of one fetch in one message: each gets a slot, then one
 * receive scatters the payload over them. */
static kvf_status_t kvf_peer_on_chunks(void *arg, const void *header,
                                       size_t header_len,
                                       const kvf_ucx_am_msg_t *msg)
{
    kvf_peer_t *peer = arg;
    const Kvf__PeerChunks *chunks;
    static const uint16_t types[] = {KVF_MSG_PEER_CHUNKS};
    kvf_peer_fetch_t *fetch       = NULL;
    kvf_peer_rbatch_t *rb         = NULL;
    kvf_peer_item_t *items[KVF_PEER_BATCH_MAX];
    kvf_frame_t frame;
    kvf_slot_t slot;
    uint64_t total = 0;
    uint32_t j, m, got = 0;
    kvf_status_t ret = KVF_OK;

    if (!kvf_mesh_accept(peer->mesh, msg) ||
        (kvf_mesh_decode(peer->mesh, header, header_len, KVF_PEER_BATCH_HDR_MAX,
                         types, 1, "PEER_CHUNKS header", &frame) != KVF_OK)) {
        return KVF_OK;
    }
    chunks = (const Kvf__PeerChunks *)frame.msg;
    m      = (uint32_t)chunks->n_indexes;
    if ((m == 0) || (m > KVF_PEER_BATCH_MAX) || (chunks->n_lengths != m) ||
        (chunks->n_checksums != m)) {
        kvf_mesh_drop(peer->mesh, KVF_MESH_DROP_MALFORMED);
        goto out;
    }
    fetch = kvf_peer_fetch_find(peer, chunks->request_id);
    /* each chunk answers a key still waiting, asked of this endpoint; a
     * key named twice is caught by its state */
    for (j = 0; (fetch != NULL) && !fetch->done && (j < m); j++) {
        kvf_peer_item_t *item;

        if (chunks->indexes[j] >= fetch->num) {
            break;
        }
        item = &fetch->items[chunks->indexes[j]];
        if ((item->state != KVF_PEER_ITEM_WAIT) ||
            (msg->reply_ep != item->ep)) {
            break;
        }
        item->state = KVF_PEER_ITEM_RECV;
        items[j]    = item;
    }
    if ((fetch == NULL) || fetch->done || (j < m)) {
        while (j-- > 0) {
            items[j]->state = KVF_PEER_ITEM_WAIT;
        }
        kvf_mesh_drop(peer->mesh, KVF_MESH_DROP_UNEXPECTED);
        goto out; /* late, unknown or not ours to answer: declined */
    }
    for (j = 0; j < m; j++) {
        uint64_t len = chunks->lengths[j];

        if ((len == 0) || (len > msg->length - total)) {
            total = UINT64_MAX;
            break;
        }
        total += len;
    }
    rb = peer->rbatch_free;
    if (rb != NULL) {
        peer->rbatch_free = rb->next_free;
    } else if (total == msg->length) {
        rb = calloc(1, sizeof(*rb)); /* kept for reuse */
    }
    for (got = 0; (rb != NULL) && (total == msg->length) && (got < m); got++) {
        if (kvf_store_alloc(peer->store, fetch->owner, chunks->lengths[got],
                            &slot) != KVF_OK) {
            break;
        }
        items[got]->offset   = slot.offset;
        items[got]->length   = chunks->lengths[got];
        items[got]->checksum = chunks->checksums[got];
        rb->items[got]       = items[got];
        rb->iov[got].buf = (uint8_t *)kvf_store_base(peer->store) + slot.offset;
        rb->iov[got].len = chunks->lengths[got];
    }
    if ((rb != NULL) && (got == m)) {
        rb->fetch = fetch;
        rb->num   = m;
        if (kvf_ucx_am_recv_data_iov(msg, rb->iov, m, peer->timeout_ns,
                                     kvf_peer_on_batch_recv, rb) == KVF_OK) {
            fetch->inflight++;
            peer->stats.batch_messages++;
            /* names the holder's traffic row (from the directory) */
            kvf_peer_link(peer, items[0]->holder,
                          kvf_mesh_node_name(peer->mesh, items[0]->holder));
            ret = msg->is_rndv ? KVF_INPROGRESS : KVF_OK;
            goto out;
        }
    }
    /* lengths that do not add up, no room, or the receive failed: these
     * chunks are misses (the message is declined) */
    while (got-- > 0) {
        kvf_store_release(peer->store, fetch->owner, items[got]->offset);
    }
    if (rb != NULL) {
        rb->next_free     = peer->rbatch_free;
        peer->rbatch_free = rb;
    }
    for (j = 0; j < m; j++) {
        items[j]->state = KVF_PEER_ITEM_WAIT;
        kvf_peer_item_settle(items[j], false);
    }

out:
    kvf_frame_release(&frame, NULL);
    if (fetch != NULL) {
        kvf_peer_fetch_maybe_free(fetch);
    }
    return ret;
}

static kvf_status_t kvf_peer_on_chunk(void *arg, const void *header,
                                      size_t header_len,
                                      const kvf_ucx_am_msg_t *msg)
{
    kvf_peer_t *peer = arg;
    const Kvf__PeerChunk *chunk;
    kvf_peer_fetch_t *fetch;
    static const uint16_t types[] = {KVF_MSG_PEER_CHUNK};
    kvf_peer_item_t *item         = NULL;
    kvf_frame_t frame;
    kvf_slot_t slot;
    kvf_status_t status, ret = KVF_OK;

    if (!kvf_mesh_accept(peer->mesh, msg) ||
        (kvf_mesh_decode(peer->mesh, header, header_len, KVF_PEER_HDR_MAX,
                         types, 1, "PEER_CHUNK header", &frame) != KVF_OK)) {
        return KVF_OK;
    }
    chunk = (const Kvf__PeerChunk *)frame.msg;
    fetch = kvf_peer_fetch_find(peer, chunk->request_id);
    if ((fetch == NULL) || fetch->done || (chunk->index >= fetch->num) ||
        (fetch->items[chunk->index].state != KVF_PEER_ITEM_WAIT)) {
        kvf_mesh_drop(peer->mesh, KVF_MESH_DROP_UNEXPECTED);
        goto out; /* late or unknown: declined */
    }
    item = &fetch->items[chunk->index];
    if (msg->reply_ep != item->ep) {
        /* not from the holder it was asked of */
        kvf_mesh_drop(peer->mesh, KVF_MESH_DROP_UNEXPECTED);
        kvf_debug("%s: PEER_CHUNK for fetch %016" PRIx64 " from %s, asked "
                  "of node %u; dropped",
                  peer->name, fetch->request_id,
                  (msg->reply_ep != NULL) ? kvf_ucx_ep_peer(msg->reply_ep)
                                          : "?",
                  item->holder);
        item = NULL;
        goto out;
    }
    if (chunk->status == KVF_ERR_BUSY) {
        kvf_peer_item_busy(fetch, chunk->index); /* asked again soon */
        kvf_peer_on_more_misses(fetch, msg->reply_ep, chunk);
        goto out;
    }
    if (chunk->status != KVF_OK) {
        kvf_peer_item_settle(item, false); /* the holder evicted it */
        kvf_peer_on_more_misses(fetch, msg->reply_ep, chunk);
        goto out;
    }
    if (chunk->n_more_indexes > 0) {
        kvf_mesh_drop(peer->mesh, KVF_MESH_DROP_MALFORMED);
        kvf_peer_item_settle(item, false); /* a chunk answers one key */
        goto out;
    }
    if ((peer->transports != NULL) &&
        !kvf_transports_check(peer->transports, item->ep, item->holder,
                              chunk->holder_name)) {
        kvf_peer_item_settle(item, false); /* not over what we expect */
        goto out;
    }
    if ((chunk->length != msg->length) || (chunk->length == 0) ||
        (kvf_store_alloc(peer->store, fetch->owner, chunk->length, &slot) !=
         KVF_OK)) {
        kvf_peer_item_settle(item, false);
        goto out;
    }
    item->offset   = slot.offset;
    item->length   = chunk->length;
    item->checksum = chunk->checksum;
    status         = kvf_ucx_am_recv_data(
                msg, (uint8_t *)kvf_store_base(peer->store) + slot.offset,
                chunk->length, peer->pool_mem, peer->timeout_ns, kvf_peer_on_recv,
                item);
    if (status != KVF_OK) {
        kvf_store_release(peer->store, fetch->owner, slot.offset);
        kvf_peer_item_settle(item, false);
        goto out;
    }
    item->state = KVF_PEER_ITEM_RECV;
    fetch->inflight++;
    peer->stats.chunk_messages++;
    /* names the holder's traffic row; counted when the chunk verified */
    kvf_peer_link(peer, item->holder, chunk->holder_name);
    ret = msg->is_rndv ? KVF_INPROGRESS : KVF_OK;

out:
    kvf_frame_release(&frame, NULL);
    if (fetch != NULL) {
        kvf_peer_fetch_maybe_free(fetch);
    }
    return ret;
}

/* ---------------------------------------------------------- holder side */

/* One more chunk being sent to @p ep; false (nothing counted) when it
 * has KVF_PEER_SERVE_PER_PEER already. */
static bool kvf_peer_sending_get(kvf_peer_t *peer, const kvf_ucx_ep_t *ep)
{
    khiter_t it;
    int ret;

    it =
        kh_put(kvf_peer_sending, &peer->sending, (uint64_t)(uintptr_t)ep, &ret);
    if (ret < 0) {
        return false;
    }
    if (ret > 0) {
        kh_value(&peer->sending, it) = 0;
    }
    if (kh_value(&peer->sending, it) >= KVF_PEER_SERVE_PER_PEER) {
        return false;
    }
    kh_value(&peer->sending, it)++;
    return true;
}

static void kvf_peer_sending_put(kvf_peer_t *peer, const kvf_ucx_ep_t *ep)
{
    khiter_t it =
        kh_get(kvf_peer_sending, &peer->sending, (uint64_t)(uintptr_t)ep);

    if ((it != kh_end(&peer->sending)) &&
        (--kh_value(&peer->sending, it) == 0)) {
        kh_del(kvf_peer_sending, &peer->sending, it);
    }
}

static void kvf_peer_on_served(kvf_status_t status, void *arg)
{
    kvf_peer_serve_t *serve = arg;
    kvf_peer_t *peer        = serve->peer;

    kvf_store_put_chunk(peer->store, serve->entry);
    kvf_peer_sending_put(peer, serve->ep);
    serve->entry     = NULL;
    serve->ep        = NULL;
    serve->next_free = peer->serve_free;
    peer->serve_free = serve;
}

/* Keys of one PEER_FETCH answered without a chunk (missed, busy, refused)
 * and gathered, when the requester takes it (PeerFetch.grouped), into one
 * PEER_CHUNK of up to KVF_PEER_GROUP_MAX + 1 indexes with the same status
 * (PeerChunk.more_indexes): many evicted keys cost a few messages, not a
 * UCX operation each. At most 40 more indexes keep the frame inside the
 * AM header whatever the indexes and the name (KVF_PEER_GROUP_MAX). */

typedef struct kvf_peer_group {
    kvf_ucx_ep_t *ep;
    uint64_t request_id;
    bool is_grouped; /* the requester takes more_indexes */
    int32_t status;  /* of the indexes gathered */
    uint32_t n;
    uint32_t indexes[KVF_PEER_GROUP_MAX + 1];
} kvf_peer_group_t;

/* Sends the gathered answer, if any. */
static void kvf_peer_group_flush(kvf_peer_t *peer, kvf_peer_group_t *g)
{
    static char no_name[] = "";
    uint8_t hdr[KVF_PEER_HDR_MAX];
    Kvf__PeerChunk chunk;
    size_t len = 0;

    if (g->n == 0) {
        return;
    }
    kvf__peer_chunk__init(&chunk);
    chunk.request_id     = g->request_id;
    chunk.index          = g->indexes[0];
    chunk.status         = g->status;
    chunk.n_more_indexes = g->n - 1;
    chunk.more_indexes   = (g->n > 1) ? &g->indexes[1] : NULL;
    /* long names stay out of the (bounded) AM header */
    chunk.holder_name = (strlen(peer->name) < 64) ? peer->name : no_name;
    g->n              = 0;
    if (kvf_frame_pack(hdr, sizeof(hdr), KVF_MSG_PEER_CHUNK, 0, &chunk.base,
                       KVF_PEER_HDR_MAX, &len) == KVF_OK) {
        kvf_mesh_am_payload_t p = {
            .header = hdr, .header_len = len, .flags = KVF_UCX_AM_SEND_EAGER};

        kvf_mesh_send_am(peer->mesh, g->ep, KVF_MESH_AM_PEER_CHUNK, &p,
                         peer->timeout_ns, kvf_peer_on_miss_sent, NULL);
    }
}

/* Answers key @p index of request @p request_id with @p status and no
 * chunk: gathered in @p g (NULL: sent at once). */
static void kvf_peer_answer_miss(kvf_peer_t *peer, kvf_ucx_ep_t *ep,
                                 uint64_t request_id, uint32_t index,
                                 int32_t status, kvf_peer_group_t *g)
{
    kvf_peer_group_t one = {.ep = ep, .request_id = request_id};

    if ((g == NULL) || !g->is_grouped) {
        g = &one;
    } else if ((g->n > 0) && (g->status != status)) {
        kvf_peer_group_flush(peer, g);
    }
    g->status          = status;
    g->indexes[g->n++] = index;
    if ((g == &one) || (g->n == KVF_PEER_GROUP_MAX + 1)) {
        kvf_peer_group_flush(peer, g);
    }
}

static kvf_status_t kvf_peer_serve_from_disk(kvf_peer_t *peer, kvf_ucx_ep_t *ep,
                                             uint64_t request_id,
                                             uint32_t index,
                                             const kvf_key_t *key,
                                             kvf_peer_link_stats_t *link);

/* Answers one key: the chunk zero-copy from the pool, or a miss (gathered
 * in @p g when not NULL). A key on this node's disk only is read back first
 * (@p is_disk_retry: the read is done, whatever it gave). */
static void kvf_peer_serve_one(kvf_peer_t *peer, kvf_ucx_ep_t *ep,
                               uint64_t request_id, uint32_t index,
                               const kvf_key_t *key,
                               kvf_peer_link_stats_t *link, bool is_disk_retry,
                               kvf_peer_group_t *g)
{
    static char no_name[] = "";
    uint8_t hdr[KVF_PEER_HDR_MAX];
    kvf_pool_entry_t *entry       = NULL;
    kvf_peer_serve_t *serve       = peer->serve_free;
    kvf_mesh_am_payload_t payload = {0};
    Kvf__PeerChunk chunk;
    size_t len = 0;

    kvf__peer_chunk__init(&chunk);
    chunk.request_id = request_id;
    chunk.index      = index;
    chunk.status     = KVF_ERR_NOT_FOUND;
    /* long names stay out of the (bounded) AM header */
    chunk.holder_name = (strlen(peer->name) < 64) ? peer->name : no_name;
    if ((serve == NULL) || !kvf_peer_sending_get(peer, ep)) {
        /* every send we make at once, or this requester's share, is in
         * flight: busy (asked again), neither a miss nor a hang */
        peer->stats.serve_busy++;
        chunk.status = KVF_ERR_BUSY;
        serve        = NULL;
    } else if ((serve != NULL) &&
               (kvf_store_hold_chunk(peer->store, key, &entry) != KVF_OK)) {
        kvf_peer_sending_put(peer, ep);
        if (!is_disk_retry) {
            chunk.status = kvf_peer_serve_from_disk(peer, ep, request_id, index,
                                                    key, link);
            if (chunk.status == KVF_INPROGRESS) {
                return; /* answered when the read lands */
            }
        }
    }
    if (entry == NULL) {
        if (chunk.status != KVF_ERR_BUSY) {
            peer->stats.serve_misses++;
        }
        kvf_peer_answer_miss(peer, ep, request_id, index, chunk.status, g);
        return;
    }
    chunk.status   = KVF_OK;
    chunk.length   = kvf_pool_entry_length(entry);
    chunk.checksum = kvf_pool_entry_checksum(entry);
    if (kvf_frame_pack(hdr, sizeof(hdr), KVF_MSG_PEER_CHUNK, 0, &chunk.base,
                       KVF_PEER_HDR_MAX, &len) != KVF_OK) {
        goto err_put;
    }
    peer->serve_free   = serve->next_free;
    serve->entry       = entry;
    serve->ep          = ep;
    payload.header     = hdr;
    payload.header_len = len;
    payload.data =
        (uint8_t *)kvf_store_base(peer->store) + kvf_pool_entry_offset(entry);
    payload.len   = chunk.length;
    payload.mem   = peer->pool_mem;
    payload.flags = KVF_UCX_AM_SEND_RNDV;
    if (kvf_mesh_send_am(peer->mesh, ep, KVF_MESH_AM_PEER_CHUNK, &payload,
                         peer->timeout_ns, kvf_peer_on_served,
                         serve) != KVF_OK) {
        serve->entry     = NULL;
        serve->ep        = NULL;
        serve->next_free = peer->serve_free;
        peer->serve_free = serve;
        kvf_peer_sending_put(peer, ep);
        goto err_put;
    }
    peer->stats.chunks_served++;
    peer->stats.bytes_served += chunk.length;
    if (is_disk_retry) {
        peer->stats.served_from_disk++;
    }
    link->chunks_served++;
    link->bytes_served += chunk.length;
    return;

err_put:
    if (entry != NULL) {
        kvf_store_put_chunk(peer->store, entry);
    }
}

/* The read of a chunk a peer asked for is done (promoted into the pool, or
 * failed: damaged, I/O error, no room): serve it, or answer a miss. */
static void kvf_peer_on_disk_read(void *arg, uint32_t promoted, uint32_t failed)
{
    kvf_peer_disk_serve_t *ds = arg;
    kvf_ucx_ep_t *ep          = ds->ep;
    kvf_key_t key             = ds->key;

    ds->is_used = false;
    ds->ep      = NULL;
    kvf_peer_serve_one(ds->peer, ep, ds->request_id, ds->index, &key, ds->link,
                       true, NULL);
    kvf_ucx_ep_put(ep);
}

/* Starts reading @p key back from the disk tier to serve it (the loop
 * never blocks: io_uring, the answer goes out from the completion):
 * KVF_INPROGRESS. KVF_ERR_NOT_FOUND: not on disk; KVF_ERR_BUSY: every
 * disk serve is in use (the requester asks again). */
static kvf_status_t kvf_peer_serve_from_disk(kvf_peer_t *peer, kvf_ucx_ep_t *ep,
                                             uint64_t request_id,
                                             uint32_t index,
                                             const kvf_key_t *key,
                                             kvf_peer_link_stats_t *link)
{
    kvf_peer_disk_serve_t *ds = NULL;
    kvf_status_t status;
    uint32_t i;

    if (peer->destroying || (kvf_store_tier_prefix(peer->store, key, 1) == 0)) {
        return KVF_ERR_NOT_FOUND; /* in no tier */
    }
    for (i = 0; (i < KVF_PEER_DISK_SERVES) && (ds == NULL); i++) {
        if (!peer->disk_serves[i].is_used) {
            ds = &peer->disk_serves[i];
        }
    }
    if (ds == NULL) {
        peer->stats.disk_serve_busy++;
        peer->stats.serve_busy++;
        return KVF_ERR_BUSY;
    }
    ds->peer       = peer;
    ds->ep         = ep;
    ds->request_id = request_id;
    ds->index      = index;
    ds->key        = *key;
    ds->link       = link;
    ds->is_used    = true;
    kvf_ucx_ep_hold(ep);
    status =
        kvf_store_promote(peer->store, &ds->key, 1, kvf_peer_on_disk_read, ds);
    if (status != KVF_INPROGRESS) {
        /* done at once (still in a write-behind buffer), or failed */
        kvf_peer_on_disk_read(ds, 0, 0);
    }
    return KVF_INPROGRESS;
}

static void kvf_peer_on_batch_served(kvf_status_t status, void *arg)
{
    kvf_peer_batch_t *b = arg;
    kvf_peer_t *peer    = b->peer;
    uint32_t j;

    for (j = 0; j < b->num; j++) {
        kvf_store_put_chunk(peer->store, b->entries[j]);
        kvf_peer_sending_put(peer, b->ep);
        b->entries[j] = NULL;
    }
    b->num           = 0;
    b->ep            = NULL;
    b->next_free     = peer->batch_free;
    peer->batch_free = b;
}

/* Sends the chunks gathered in @p b as one PEER_CHUNKS message; on
 * failure they are released (the requester's fetch misses them). */
static void kvf_peer_batch_send(kvf_peer_t *peer, kvf_ucx_ep_t *ep,
                                kvf_peer_batch_t *b,
                                kvf_peer_link_stats_t *link)
{
    kvf_mesh_am_payload_t payload = {0};
    Kvf__PeerChunks chunks;
    size_t len = 0;

    kvf__peer_chunks__init(&chunks);
    chunks.request_id  = b->request_id;
    chunks.n_indexes   = b->num;
    chunks.indexes     = b->indexes;
    chunks.n_lengths   = b->num;
    chunks.lengths     = b->lengths;
    chunks.n_checksums = b->num;
    chunks.checksums   = b->checksums;
    if (kvf_frame_pack(b->hdr, sizeof(b->hdr), KVF_MSG_PEER_CHUNKS, 0,
                       &chunks.base, KVF_PEER_BATCH_HDR_MAX, &len) != KVF_OK) {
        kvf_peer_on_batch_served(KVF_ERR_PROTO, b);
        return;
    }
    payload.header     = b->hdr; /* stays until the batch is served */
    payload.header_len = len;
    payload.iov        = b->iov;
    payload.iovcnt     = b->num;
    payload.flags      = KVF_UCX_AM_SEND_RNDV;
    if (kvf_mesh_send_am(peer->mesh, ep, KVF_MESH_AM_PEER_CHUNKS, &payload,
                         peer->timeout_ns, kvf_peer_on_batch_served,
                         b) != KVF_OK) {
        kvf_peer_on_batch_served(KVF_ERR_TRANSPORT, b);
        return;
    }
    peer->stats.chunks_served += b->num;
    peer->stats.bytes_served += b->bytes;
    link->chunks_served += b->num;
    link->bytes_served += b->bytes;
}

/* Adds @p key to the batch being gathered for @p ep (*batch_p, started
 * when NULL), sending it when full. False when the key is not for a batch
 * (not held, too large, over the requester's share, no batch free): the
 * caller answers it on its own. */
static bool kvf_peer_serve_batched(kvf_peer_t *peer, kvf_ucx_ep_t *ep,
                                   uint64_t request_id, uint32_t index,
                                   const kvf_key_t *key,
                                   kvf_peer_link_stats_t *link,
                                   kvf_peer_batch_t **batch_p)
{
    kvf_peer_batch_t *b = *batch_p;
    kvf_pool_entry_t *entry;
    uint64_t length;

    if ((b == NULL) && (peer->batch_free == NULL)) {
        return false;
    }
    if (kvf_store_hold_chunk(peer->store, key, &entry) != KVF_OK) {
        return false;
    }
    length = kvf_pool_entry_length(entry);
    if ((length > KVF_PEER_BATCH_CHUNK_MAX) ||
        !kvf_peer_sending_get(peer, ep)) {
        kvf_store_put_chunk(peer->store, entry);
        return false;
    }
    if (b == NULL) {
        b                = peer->batch_free;
        peer->batch_free = b->next_free;
        b->ep            = ep;
        b->request_id    = request_id;
        b->num           = 0;
        b->bytes         = 0;
        *batch_p         = b;
    }
    b->entries[b->num]   = entry;
    b->indexes[b->num]   = index;
    b->lengths[b->num]   = length;
    b->checksums[b->num] = kvf_pool_entry_checksum(entry);
    b->iov[b->num].buf =
        (uint8_t *)kvf_store_base(peer->store) + kvf_pool_entry_offset(entry);
    b->iov[b->num].len = length;
    b->num++;
    b->bytes += length;
    if ((b->num == KVF_PEER_BATCH_MAX) || (b->bytes >= KVF_PEER_BATCH_BYTES)) {
        kvf_peer_batch_send(peer, ep, b, link);
        *batch_p = NULL;
    }
    return true;
}

/* A requester says a chunk we served failed verification: check it here
 * (the requester's word alone evicts nothing). */
static kvf_status_t kvf_peer_on_bad(void *arg, const void *header,
                                    size_t header_len,
                                    const kvf_ucx_am_msg_t *msg)
{
    kvf_peer_t *peer = arg;
    kvf_key_t key;

    if (!kvf_mesh_accept(peer->mesh, msg)) {
        return KVF_OK;
    }
    if ((header == NULL) || (header_len != KVF_KEY_WIRE_SIZE)) {
        kvf_mesh_drop(peer->mesh, KVF_MESH_DROP_MALFORMED);
        return KVF_OK;
    }
    kvf_key_unpack(header, &key);
    peer->stats.bad_reports++;
    if (kvf_store_verify(peer->store, &key) == KVF_ERR_CHECKSUM) {
        kvf_warn("%s: a peer found a chunk we served damaged; dropped",
                 peer->name);
    }
    return KVF_OK;
}

static kvf_status_t kvf_peer_on_fetch(void *arg, const void *header,
                                      size_t header_len,
                                      const kvf_ucx_am_msg_t *msg)
{
    kvf_peer_t *peer = arg;
    const Kvf__PeerFetch *req;
    static const uint16_t types[] = {KVF_MSG_PEER_FETCH};
    kvf_peer_batch_t *batch       = NULL;
    kvf_peer_group_t group        = {0};
    kvf_peer_link_stats_t *link;
    kvf_frame_t frame;
    size_t n, i;
    kvf_key_t key;

    if (!kvf_mesh_accept(peer->mesh, msg)) {
        return KVF_OK; /* before anything is parsed */
    }
    if (msg->reply_ep == NULL) {
        kvf_mesh_drop(peer->mesh, KVF_MESH_DROP_NO_REPLY_EP);
        kvf_debug("%s: PEER_FETCH without a reply endpoint; dropped",
                  peer->name);
        return KVF_OK;
    }
    if (msg->is_rndv || (kvf_mesh_decode(peer->mesh, msg->data, msg->length,
                                         KVF_FRAME_MAX_DEFAULT, types, 1,
                                         "PEER_FETCH", &frame) != KVF_OK)) {
        if (msg->is_rndv) {
            kvf_mesh_drop(peer->mesh, KVF_MESH_DROP_MALFORMED);
        }
        return KVF_OK;
    }
    req              = (const Kvf__PeerFetch *)frame.msg;
    n                = req->keys.len / KVF_KEY_WIRE_SIZE;
    group.ep         = msg->reply_ep;
    group.request_id = req->request_id;
    group.is_grouped = req->grouped;
    if ((req->keys.len % KVF_KEY_WIRE_SIZE != 0) || (n != req->n_indexes) ||
        (n > KVF_PEER_MAX_KEYS)) {
        kvf_mesh_drop(peer->mesh, KVF_MESH_DROP_MALFORMED);
        kvf_debug("%s: PEER_FETCH with %zu key bytes and %zu indexes; "
                  "dropped",
                  peer->name, req->keys.len, req->n_indexes);
        kvf_frame_release(&frame, NULL);
        return KVF_OK;
    }
    link = kvf_peer_link(peer, req->requester, req->requester_name);
    if ((peer->transports != NULL) &&
        !kvf_transports_check(peer->transports, msg->reply_ep, req->requester,
                              req->requester_name)) {
        /* not over a transport we expect: every key answered refused */
        for (i = 0; i < n; i++) {
            kvf_peer_answer_miss(peer, msg->reply_ep, req->request_id,
                                 req->indexes[i], KVF_ERR_UNSUPPORTED, &group);
        }
        kvf_peer_group_flush(peer, &group);
        kvf_frame_release(&frame, NULL);
        return KVF_OK;
    }
    for (i = 0; (i < n) && kvf_store_has_disk(peer->store); i++) {
        /* before any read-back makes room in the pool (and spills) */
        kvf_key_unpack(req->keys.data + i * KVF_KEY_WIRE_SIZE, &key);
        kvf_store_want(peer->store, &key);
    }
    for (i = 0; i < n; i++) {
        kvf_key_unpack(req->keys.data + i * KVF_KEY_WIRE_SIZE, &key);
        if (req->batch &&
            kvf_peer_serve_batched(peer, msg->reply_ep, req->request_id,
                                   req->indexes[i], &key, link, &batch)) {
            continue;
        }
        kvf_peer_serve_one(peer, msg->reply_ep, req->request_id,
                           req->indexes[i], &key, link, false, &group);
    }
    if (batch != NULL) {
        kvf_peer_batch_send(peer, msg->reply_ep, batch, link);
    }
    kvf_peer_group_flush(peer, &group);
    kvf_frame_release(&frame, NULL);
    return KVF_OK;
}

/* ----------------------------------------------------------- lifecycle */

kvf_status_t kvf_peer_create(const kvf_peer_params_t *params,
                             kvf_peer_t **peer_p)
{
    kvf_peer_t *peer;
    kvf_status_t status;
    uint32_t i;

    peer = calloc(1, sizeof(*peer));
    if (peer == NULL) {
        return KVF_ERR_NO_MEMORY;
    }
    if (params->mesh == NULL) {
        free(peer);
        return KVF_ERR_INVALID;
    }
    kh_init_inplace(kvf_peer_keys, &peer->inflight);
    kh_init_inplace(kvf_peer_sending, &peer->sending);
    kh_init_inplace(kvf_peer_fetches, &peer->fetches_by_id);
    LIST_INIT(&peer->fetches);
    peer->mesh     = params->mesh;
    peer->worker   = kvf_mesh_worker(params->mesh);
    peer->pool_mem = params->pool_mem;
    peer->store    = params->store;
    peer->timeout_ns =
        (params->timeout_ns > 0) ? params->timeout_ns : 5 * KVF_NSEC_PER_SEC;
    snprintf(peer->name, sizeof(peer->name), "%s",
             (params->name != NULL) ? params->name : "agent");
    peer->serve_max =
        (params->serve_max > 0) ? params->serve_max : KVF_PEER_SERVE_MAX;
    peer->serves  = calloc(peer->serve_max, sizeof(*peer->serves));
    peer->batches = calloc(KVF_PEER_BATCHES, sizeof(*peer->batches));
    peer->base    = params->base;
    if ((peer->serves == NULL) || (peer->batches == NULL)) {
        status = KVF_ERR_NO_MEMORY;
        goto err;
    }
    /* the free lists of single sends and of batched ones */
    for (i = 0; i < peer->serve_max; i++) {
        peer->serves[i].peer = peer;
        peer->serves[i].next_free =
            (i + 1 < peer->serve_max) ? &peer->serves[i + 1] : NULL;
    }
    peer->serve_free = &peer->serves[0];
    for (i = 0; i < KVF_PEER_BATCHES; i++) {
        peer->batches[i].peer = peer;
        peer->batches[i].next_free =
            (i + 1 < KVF_PEER_BATCHES) ? &peer->batches[i + 1] : NULL;
    }
    peer->batch_free = &peer->batches[0];
    status           = kvf_mesh_set_handler(peer->mesh, KVF_MESH_AM_PEER_FETCH,
                                            kvf_peer_on_fetch, peer);
    if (status == KVF_OK) {
        status = kvf_mesh_set_handler(peer->mesh, KVF_MESH_AM_PEER_CHUNK,
                                      kvf_peer_on_chunk, peer);
    }
    if (status == KVF_OK) {
        status = kvf_mesh_set_handler(peer->mesh, KVF_MESH_AM_PEER_BAD,
                                      kvf_peer_on_bad, peer);
    }
    if (status == KVF_OK) {
        status = kvf_mesh_set_handler(peer->mesh, KVF_MESH_AM_PEER_CHUNKS,
                                      kvf_peer_on_chunks, peer);
    }
    if (status != KVF_OK) {
        goto err;
    }
    *peer_p = peer;
    return KVF_OK;

err:
    kvf_peer_destroy(peer);
    return status;
}

void kvf_peer_destroy(kvf_peer_t *peer)
{
    kvf_peer_fetch_t *fetch;
    uint32_t i;

    if (peer == NULL) {
        return;
    }
    peer->destroying = true;
    for (i = 0; i < KVF_PEER_DISK_SERVES; i++) {
        /* their reads still land in the pool; the endpoints went with the
         * worker */
        if (peer->disk_serves[i].is_used) {
            kvf_store_promote_cancel(peer->store, &peer->disk_serves[i]);
        }
    }
    if (peer->ctl != NULL) {
        LIST_FOREACH(fetch, &peer->fetches, link) {
            kvf_ctl_client_cancel(peer->ctl, fetch);
        }
    }
    /* the worker is destroyed after us and completes every operation
     * then: what is still in flight here is freed with its owner */
    while ((fetch = LIST_FIRST(&peer->fetches)) != NULL) {
        LIST_REMOVE(fetch, link);
        /* the worker freed the endpoints when it went */
        kvf_peer_fetch_free(fetch);
    }
    kh_destroy_inplace(kvf_peer_fetches, &peer->fetches_by_id);
    kh_destroy_inplace(kvf_peer_keys, &peer->inflight);
    kh_destroy_inplace(kvf_peer_sending, &peer->sending);
    while (peer->rbatch_free != NULL) {
        kvf_peer_rbatch_t *rb = peer->rbatch_free;

        peer->rbatch_free = rb->next_free;
        free(rb);
    }
    free(peer->batches);
    free(peer->serves);
    free(peer);
}

void kvf_peer_set_ctl(kvf_peer_t *peer, kvf_ctl_client_t *ctl)
{
    peer->ctl = ctl;
    kvf_mesh_set_ctl(peer->mesh, ctl); /* this node's id, for handshakes */
}

void kvf_peer_get_stats(const kvf_peer_t *peer, kvf_peer_stats_t *stats_p)
{
    *stats_p = peer->stats;
}

const kvf_peer_link_stats_t *kvf_peer_get_links(const kvf_peer_t *peer,
                                                uint32_t *num_p)
{
    *num_p = peer->num_links;
    return peer->links;
}
