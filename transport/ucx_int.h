/* SPDX-License-Identifier: Apache-2.0 */
/* Copyright (c) 2026 The kvfabric authors */
/*
 * Private structures of the UCX layer (transport/ only).
 *
 * thread: owning loop only, like the objects in ucx.h.
 */
#ifndef KVF_TRANSPORT_UCX_INT_H
#define KVF_TRANSPORT_UCX_INT_H

#include "transport/ucx.h"

#include <ucp/api/ucp.h>

#include <sys/queue.h>

#define KVF_UCX_EP_CACHE_BUCKETS 64
#define KVF_UCX_MAX_OPS_DEFAULT  1024

struct kvf_ucx_ctx {
    ucp_context_h ucp;
};

struct kvf_ucx_mem {
    kvf_ucx_ctx_t *ctx;
    ucp_mem_h memh;
    void *base;
    size_t len;
};

typedef enum {
    KVF_UCX_OP_AM_SEND,
    KVF_UCX_OP_AM_RECV,
    KVF_UCX_OP_WORKER_FLUSH,
} kvf_ucx_op_type_t;

/* One operation; lives in worker->ops, on the free list, the in-flight list
 * (UCX owns a request) or the done queue (callback not delivered yet). */
typedef struct kvf_ucx_op {
    struct kvf_ucx_op *next;
    struct kvf_ucx_op *prev;
    kvf_ucx_worker_t *worker;
    kvf_ucx_ep_t *ep; /* a reference while in flight; NULL: worker op */
    void *req;        /* UCX request while in flight */
    uint64_t deadline_ns;
    kvf_ucx_op_cb_t cb;
    void *cb_arg;
    kvf_status_t status; /* KVF_INPROGRESS: map ucs at dispatch */
    ucs_status_t ucs;    /* what UCX reported */
    kvf_ucx_op_type_t type;
    bool is_timed_out;
    bool is_orphan; /* user told already; UCX still owns the request */
    bool is_heap;   /* a receive taken while the pool was empty: freed, not
                       returned (worker->heap_ops) */
    LIST_ENTRY(kvf_ucx_op) heap_link; /* worker->heap_ops */
    /* AM send: UCX 1.13 reads the header until the send completes (a
     * pending send during wireup replays it later), so it lives here */
    uint8_t header[KVF_UCX_AM_HEADER_MAX];
} kvf_ucx_op_t;

/* Doubly linked list of ops with a sentinel-free head. */
typedef struct kvf_ucx_op_list {
    kvf_ucx_op_t *head;
    kvf_ucx_op_t *tail;
    unsigned count;
} kvf_ucx_op_list_t;

struct kvf_ucx_ep {
    kvf_ucx_worker_t *worker;
    ucp_ep_h ucp_ep;    /* NULL once a close started */
    void *close_req;    /* UCX close request until it completes */
    kvf_ucx_ep_t *next; /* worker->eps */
    kvf_ucx_ep_t *prev;
    kvf_ucx_ep_t *cache_next;  /* bucket chain while cached */
    kvf_ucx_ep_t *notify_next; /* worker->notify_head while queued */
    void *user;
    /* references: callers (get/create/hold), the worker (cache or accepted
     * list, until failure), one per in-flight op, one while queued for the
     * error notification */
    unsigned refcount;
    kvf_status_t error;
    bool has_worker_ref;
    bool is_cached;
    bool is_accepted; /* from a listener */
    bool is_failed;
    bool is_closing;
    char peer[KVF_UCX_PEER_NAME_MAX];
    char transports[96]; /* kvf_ucx_ep_transports, once known */
};

typedef struct kvf_ucx_am_slot {
    kvf_ucx_worker_t *worker;
    kvf_ucx_am_cb_t cb;
    void *arg;
    unsigned id;
} kvf_ucx_am_slot_t;

/* A connection request queued from the listener callback to the loop. */
typedef struct kvf_ucx_conn {
    struct kvf_ucx_conn *next;
    kvf_ucx_listener_t *listener;
    ucp_conn_request_h request;
} kvf_ucx_conn_t;

struct kvf_ucx_listener {
    kvf_ucx_worker_t *worker;
    ucp_listener_h ucp;
    kvf_ucx_accept_cb_t accept_cb;
    void *arg;
    uint16_t port;
};

struct kvf_ucx_worker {
    kvf_ucx_ctx_t *ctx;
    ucp_worker_h ucp;
    struct event_base *base;
    struct event *ev;    /* the worker's event fd, EV_READ|EV_PERSIST */
    struct event *timer; /* earliest op deadline */
    uint64_t timer_deadline_ns;
    kvf_ucx_op_t *ops; /* max_ops entries, one allocation */
    unsigned max_ops;
    kvf_ucx_op_t *free_ops;
    unsigned free_count;
    /* a call found the pool empty: ops_freed_cb when one is back */
    bool ops_wanted;
    kvf_ucx_ops_freed_cb_t ops_freed_cb;
    void *ops_freed_arg;
    /* receives beyond the pool: data a peer has sent already is taken,
     * never dropped for want of a slot (bounded by what peers send) */
    LIST_HEAD(, kvf_ucx_op) heap_ops;
    unsigned num_heap_ops;
    uint64_t heap_ops_total;
    kvf_ucx_op_list_t inflight;
    kvf_ucx_op_list_t done;
    kvf_ucx_ep_t *eps;
    unsigned ep_count;
    unsigned ep_cached;
    kvf_ucx_ep_t *cache[KVF_UCX_EP_CACHE_BUCKETS];
    kvf_ucx_ep_t *notify_head; /* failed eps waiting for ep_err_cb */
    kvf_ucx_conn_t *conn_head; /* connection requests to accept */
    kvf_ucx_ep_err_cb_t ep_err_cb;
    void *ep_err_arg;
    kvf_ucx_am_slot_t am[KVF_UCX_AM_ID_MAX];
    kvf_ucx_am_slot_t am_unknown; /* ids KVF_UCX_AM_ID_MAX and above */
    uint64_t am_dropped;          /* messages for ids without a handler */
    void *am_desc_current;        /* descriptor of the handler running now */
    bool am_desc_released;        /* that handler declined it */
    unsigned listeners;
    uint64_t ep_failures;
    uint64_t timeouts;
    unsigned orphans;    /* in-flight ops whose user was already told */
    bool has_closed_eps; /* a failed ep finished closing: orphan its ops */
    bool is_destroying;
    bool in_dispatch; /* inside kvf_ucx_worker_dispatch */
    char name[32];
};

/* ucx_op.c */
kvf_status_t kvf_ucx_op_alloc(kvf_ucx_worker_t *worker, kvf_ucx_ep_t *ep,
                              kvf_ucx_op_type_t type, uint64_t timeout_ns,
                              kvf_ucx_op_cb_t cb, void *arg,
                              kvf_ucx_op_t **op_p);
kvf_status_t kvf_ucx_op_start(kvf_ucx_op_t *op, ucs_status_ptr_t req,
                              const char *what);
void kvf_ucx_op_param_init(kvf_ucx_op_t *op, ucp_request_param_t *param);
void kvf_ucx_op_on_recv_am(void *request, ucs_status_t status, size_t length,
                           void *user_data);
void kvf_ucx_op_complete_now(kvf_ucx_op_t *op, kvf_status_t status);
void kvf_ucx_op_dispatch_done(kvf_ucx_worker_t *worker);
void kvf_ucx_op_dispatch_orphans(kvf_ucx_worker_t *worker);
void kvf_ucx_op_cancel_all(kvf_ucx_worker_t *worker);
/* Frees the receives taken beyond the pool that UCX never gave back (the
 * worker is gone). */
void kvf_ucx_op_heap_free_all(kvf_ucx_worker_t *worker);
void kvf_ucx_op_on_timer(evutil_socket_t fd, short what, void *arg);
void kvf_ucx_op_list_remove(kvf_ucx_op_list_t *list, kvf_ucx_op_t *op);

/* ucx_am.c */
kvf_status_t kvf_ucx_am_init_all(kvf_ucx_worker_t *worker);

/* ucx_ep.c */
void kvf_ucx_ep_fail_all(kvf_ucx_worker_t *worker, kvf_status_t status);
void kvf_ucx_ep_dispatch_accept(kvf_ucx_worker_t *worker);
void kvf_ucx_ep_dispatch_close(kvf_ucx_worker_t *worker);
void kvf_ucx_ep_dispatch_notify(kvf_ucx_worker_t *worker);
kvf_ucx_ep_t *kvf_ucx_ep_find_ucp(kvf_ucx_worker_t *worker, ucp_ep_h ucp_ep);
void kvf_ucx_ep_free_all(kvf_ucx_worker_t *worker, bool with_closing);
bool kvf_ucx_ep_closing_any(const kvf_ucx_worker_t *worker);

/* ucx_worker.c */
void kvf_ucx_worker_kick(kvf_ucx_worker_t *worker);

#endif /* KVF_TRANSPORT_UCX_INT_H */
