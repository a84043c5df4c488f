/* SPDX-License-Identifier: Apache-2.0 */
/* Copyright (c) 2026 The kvfabric authors */
/*
 * The UCX layer: context, worker bound to a libevent loop (STYLE.md B6),
 * listener, endpoints (by sockaddr or worker address, cached by peer name),
 * whole-region memory registration, active messages (eager and
 * rendezvous straight into a caller buffer, one buffer or scattered over
 * many) and worker flush. No one-sided put/get: peers move chunks only as
 * active messages (docs/architecture.md, "Data path").
 *
 * Operations. Every non-blocking call (am send, am recv data, flush) takes a
 * timeout and a completion callback. It either returns an error (then the
 * callback is never called) or KVF_OK, and then the callback runs exactly once,
 * on the owning loop, never from inside the call: KVF_OK            the
 * operation completed, KVF_ERR_TIMEOUT   its deadline passed; the request was
 * canceled, or its endpoint was failed so that UCX released the buffers,
 *   KVF_ERR_CLOSED    the peer went away or the endpoint was closed,
 *   KVF_ERR_CANCELED  the worker is being destroyed,
 *   KVF_ERR_TRANSPORT any other UCX failure (logged with its status).
 * When the callback runs UCX no longer touches the buffers. Operations come
 * from a per-worker pool sized at worker creation (no malloc per chunk);
 * KVF_ERR_BUSY when it is empty.
 *
 * thread: every object belongs to the loop of its worker ("owning loop
 * only"); the context is thread-safe for creating workers and registering
 * memory.
 */
#ifndef KVF_TRANSPORT_UCX_H
#define KVF_TRANSPORT_UCX_H

#include <kvfabric/status.h>

#include <event2/event.h>

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct kvf_ucx_ctx kvf_ucx_ctx_t;
typedef struct kvf_ucx_worker kvf_ucx_worker_t;
typedef struct kvf_ucx_listener kvf_ucx_listener_t;
typedef struct kvf_ucx_ep kvf_ucx_ep_t;
typedef struct kvf_ucx_mem kvf_ucx_mem_t;

/** Default timeout of operations when a caller passes 0. */
#define KVF_UCX_TIMEOUT_DEFAULT_NS (10ull * 1000 * 1000 * 1000)
/** Longest peer name kept by the endpoint cache, with the NUL. */
#define KVF_UCX_PEER_NAME_MAX 128
/** Active message ids our services use are below this. */
#define KVF_UCX_AM_ID_MAX 64
/**
 * Active message ids a peer can put on the wire (UCX carries 16 bits).
 * A worker registers its own dispatcher for every one of them at creation:
 * an id without a handler (unknown, or from a newer version) is dropped and
 * counted (kvf_ucx_worker_stats_t.am_dropped), never left to UCX (1.13
 * leaves unregistered slots below its table's capacity uninitialised and
 * calls through them).
 */
#define KVF_UCX_AM_ID_WIRE_MAX 65536u

/** Largest active-message header kvf_ucx_am_send takes (it is copied). */
#define KVF_UCX_AM_HEADER_MAX 256

/* ------------------------------------------------------------------ ctx */

typedef enum {
    KVF_UCX_CTX_FIELD_TLS         = 1u << 0,
    KVF_UCX_CTX_FIELD_NET_DEVICES = 1u << 1,
    KVF_UCX_CTX_FIELD_OVERRIDES   = 1u << 2,
    KVF_UCX_CTX_FIELD_NO_DEFAULTS = 1u << 3,
} kvf_ucx_ctx_field_t;

typedef struct kvf_ucx_ctx_params {
    uint64_t field_mask;
    /** UCX_TLS value ("tcp", "shm,tcp", "rc,ud"...); default: UCX's own */
    const char *tls;
    /** UCX_NET_DEVICES value ("lo", "mlx5_0:1"...); config `net_devices` */
    const char *net_devices;
    /**
     * Extra UCX settings as NULL-terminated name/value pairs, names without
     * the UCX_ prefix: {"RNDV_THRESH", "64K", NULL}. Applied last.
     * Transport settings go without their transport prefix in UCX 1.13
     * ("TX_SEG_SIZE" for UCX_TCP_TX_SEG_SIZE); newer UCX (1.22) rejects
     * that and takes the prefixed name ("TCP_TX_SEG_SIZE").
     */
    const char *const *overrides;
} kvf_ucx_ctx_params_t;

/**
 * Tuned defaults (docs/performance.md "UCX ceilings"), NULL-terminated
 * triples {environment name without UCX_, ucp_config_modify name, value}.
 * Each applies only when neither the environment nor params->overrides
 * (either name) set it.
 */
extern const char *const kvf_ucx_ctx_default_tunings[];

/**
 * The UCX_NET_DEVICES value that keeps UCX to the network device carrying
 * @p host (a numeric or resolvable address, e.g. a listen host): that
 * device's name, then every RDMA device port ("eth1,mlx5_0:1"), so RDMA
 * stays usable. UCX's TCP transport otherwise opens a listening socket on
 * every network device, whatever address the peer service listens on.
 *
 * @return KVF_OK; KVF_ERR_NOT_FOUND for a wildcard host (0.0.0.0, ::) or
 *         one no local device carries (keep UCX's default: all devices);
 *         KVF_ERR_TOO_BIG when @p len is too small
 *
 * thread: any.
 */
kvf_status_t kvf_ucx_net_devices_for(const char *host, char *buf, size_t len);

/**
 * Creates a UCP context with AM, RMA and wakeup features.
 *
 * @param [in]  params  may be NULL (UCX defaults plus our tunings)
 * @param [out] ctx_p   the new context
 * @return KVF_OK; KVF_ERR_NO_MEMORY; KVF_ERR_CONFIG for a setting UCX
 *         rejects (logged with the name); KVF_ERR_TRANSPORT if ucp_init fails
 *
 * thread: any. ownership: the caller destroys it after every worker and
 * registration made from it.
 */
kvf_status_t kvf_ucx_ctx_create(const kvf_ucx_ctx_params_t *params,
                                kvf_ucx_ctx_t **ctx_p);

/**
 * Destroys a context. NULL is a no-op.
 *
 * thread: any, once no worker or registration of it is left.
 */
void kvf_ucx_ctx_destroy(kvf_ucx_ctx_t *ctx);

/**
 * Whether UCX in this process can register and move CUDA device memory
 * (built with CUDA support and a device present), so a GPU buffer may be
 * registered with kvf_ucx_mem_register.
 *
 * thread: any.
 */
bool kvf_ucx_ctx_has_cuda(const kvf_ucx_ctx_t *ctx);

/* --------------------------------------------------------------- worker */

typedef enum {
    KVF_UCX_WORKER_FIELD_MAX_OPS = 1u << 0,
    KVF_UCX_WORKER_FIELD_EP_ERR  = 1u << 1,
    KVF_UCX_WORKER_FIELD_NAME    = 1u << 2,
} kvf_ucx_worker_field_t;

/**
 * Called once when an endpoint fails (peer gone, timeout, transport error,
 * kvf_ucx_ep_fail), not during worker destroy. Its in-flight operations
 * complete with errors, each once, before or after this call. The endpoint
 * is already out of the cache; @p ep stays valid during the call only
 * unless the callee holds it.
 */
typedef void (*kvf_ucx_ep_err_cb_t)(kvf_ucx_ep_t *ep, kvf_status_t status,
                                    void *arg);

typedef struct kvf_ucx_worker_params {
    uint64_t field_mask;
    /** size of the operation pool (default 1024) */
    unsigned max_ops;
    kvf_ucx_ep_err_cb_t ep_err_cb;
    void *ep_err_arg;
    /** name used in log lines (copied) */
    const char *name;
} kvf_ucx_worker_params_t;

typedef struct kvf_ucx_worker_stats {
    unsigned ops_inflight;         /**< operations not yet completed */
    unsigned ops_free;             /**< operations left in the pool */
    uint64_t recv_ops_beyond_pool; /**< receives taken while the pool was
                                        empty (allocated, then freed) */
    unsigned eps;         /**< endpoint objects alive, closing included */
    unsigned eps_cached;  /**< endpoints in the peer cache */
    uint64_t ep_failures; /**< endpoints that failed */
    uint64_t timeouts;    /**< operations that ran past their deadline */
    uint64_t am_dropped;  /**< active messages for ids without a handler */
} kvf_ucx_worker_stats_t;

/**
 * Creates a worker (UCS_THREAD_MODE_SINGLE) driven by @p base: its event fd
 * is an EV_READ|EV_PERSIST event running the progress/arm loop.
 *
 * @return KVF_OK; KVF_ERR_NO_MEMORY; KVF_ERR_TRANSPORT (UCX failure);
 *         KVF_ERR_IO (libevent refused the event)
 *
 * thread: the loop of @p base only. ownership: caller destroys it before
 * the base and the context.
 */
kvf_status_t kvf_ucx_worker_create(kvf_ucx_ctx_t *ctx, struct event_base *base,
                                   const kvf_ucx_worker_params_t *params,
                                   kvf_ucx_worker_t **worker_p);

/**
 * Destroys a worker: stops listeners' callbacks, completes every in-flight
 * operation with KVF_ERR_CANCELED (callbacks run inside this call), closes
 * every endpoint (forcibly), then frees. NULL is a no-op. Endpoints the
 * caller still holds are warned about and freed anyway.
 *
 * thread: owning loop only, never from inside a callback of this worker.
 */
void kvf_ucx_worker_destroy(kvf_ucx_worker_t *worker);

/**
 * Progresses until idle and delivers completions, without waiting for the
 * event fd (tests, shutdown paths).
 *
 * @return the number of UCX events progressed
 *
 * thread: owning loop only, not from a callback of this worker.
 */
unsigned kvf_ucx_worker_progress(kvf_ucx_worker_t *worker);

/**
 * Packs this worker's address (for the controller's node table).
 *
 * @param [out] addr_p  malloc'd blob; the caller frees it with free()
 * @param [out] len_p   its length
 * @return KVF_OK; KVF_ERR_TRANSPORT; KVF_ERR_NO_MEMORY
 */
kvf_status_t kvf_ucx_worker_address_pack(kvf_ucx_worker_t *worker,
                                         void **addr_p, size_t *len_p);

/**
 * Counters of @p worker, for metrics and leak checks in tests.
 *
 * thread: owning loop only.
 */
void kvf_ucx_worker_stats(const kvf_ucx_worker_t *worker,
                          kvf_ucx_worker_stats_t *stats_p);

/** See kvf_ucx_worker_on_ops_freed. */
typedef void (*kvf_ucx_ops_freed_cb_t)(void *arg);

/**
 * Sets @p cb (NULL: none) to run once an operation frees up after a call
 * was refused KVF_ERR_BUSY (the pool was empty): once per such spell, from
 * wherever the operation completed, so it may only schedule work (make an
 * event active), never send. Lets what waits for an operation go as soon
 * as one is back rather than on its next timer.
 *
 * thread: owning loop only.
 */
void kvf_ucx_worker_on_ops_freed(kvf_ucx_worker_t *worker,
                                 kvf_ucx_ops_freed_cb_t cb, void *arg);

/**
 * The UCX transports and devices the lanes of @p ep use, as "tl/dev"
 * items separated by commas ("tcp/lo", "rc_mlx5/mlx5_0:1"): what the
 * connection really runs on, whatever was configured. Complete once the
 * endpoint carried a message both ways; asked of UCX once per endpoint.
 *
 * @return KVF_OK; KVF_ERR_CLOSED (failed or closing); KVF_ERR_NOT_FOUND
 *         (UCX reported nothing)
 *
 * thread: owning loop only.
 */
kvf_status_t kvf_ucx_ep_transports(kvf_ucx_ep_t *ep, char *buf, size_t len);

/**
 * Does every transport in @p used (as kvf_ucx_ep_transports writes it)
 * appear in @p expect (comma-separated names; "rc" covers rc_verbs and
 * rc_mlx5, "sm" UCX's shared-memory transports)? true when @p expect is
 * empty.
 */
bool kvf_ucx_transports_match(const char *used, const char *expect);

/* ------------------------------------------------------------- listener */

/**
 * A peer connected; @p ep is the server side endpoint, owned by the worker
 * until it fails or the worker is destroyed (hold it to keep it longer).
 */
typedef void (*kvf_ucx_accept_cb_t)(kvf_ucx_ep_t *ep, const char *peer,
                                    void *arg);

/**
 * Listens on @p host:@p port (port 0: any free port).
 *
 * @return KVF_OK; KVF_ERR_INVALID (bad host); KVF_ERR_TRANSPORT (bind
 *         failed, logged); KVF_ERR_NO_MEMORY
 *
 * thread: owning loop only. ownership: caller destroys it before the worker.
 */
kvf_status_t kvf_ucx_listener_create(kvf_ucx_worker_t *worker, const char *host,
                                     uint16_t port,
                                     kvf_ucx_accept_cb_t accept_cb, void *arg,
                                     kvf_ucx_listener_t **listener_p);

/**
 * Stops listening and refuses connections not accepted yet; accepted
 * endpoints stay. NULL is a no-op.
 *
 * UCX 1.13 can crash on its async thread (ucp_cm_server_conn_request_cb)
 * when a client handshake lands while the listener is destroyed: destroy
 * listeners only at shutdown, after the peers were told to stop.
 *
 * thread: owning loop only.
 */
void kvf_ucx_listener_destroy(kvf_ucx_listener_t *listener);

/** The bound port (useful after port 0). thread: any. */
uint16_t kvf_ucx_listener_port(const kvf_ucx_listener_t *listener);

/* ------------------------------------------------------------ endpoints */

typedef enum {
    KVF_UCX_EP_FIELD_SOCKADDR = 1u << 0,
    KVF_UCX_EP_FIELD_ADDRESS  = 1u << 1,
} kvf_ucx_ep_field_t;

typedef struct kvf_ucx_ep_params {
    uint64_t field_mask;
    /** "HOST:PORT" of a kvf_ucx_listener */
    const char *sockaddr;
    /** a worker address blob (kvf_ucx_worker_address_pack) */
    const void *address;
    size_t address_len;
} kvf_ucx_ep_params_t;

/**
 * Creates an endpoint (error handling mode PEER) that is not cached.
 *
 * @return KVF_OK; KVF_ERR_INVALID (no or bad address); KVF_ERR_TRANSPORT;
 *         KVF_ERR_NO_MEMORY
 *
 * thread: owning loop only. ownership: the caller owns one reference and
 * drops it with kvf_ucx_ep_put.
 */
kvf_status_t kvf_ucx_ep_create(kvf_ucx_worker_t *worker,
                               const kvf_ucx_ep_params_t *params,
                               kvf_ucx_ep_t **ep_p);

/**
 * Looks @p peer up in the endpoint cache; when absent (or failed), creates
 * one from @p params (NULL with a "HOST:PORT" peer name: that sockaddr) and
 * caches it under @p peer.
 *
 * @return as kvf_ucx_ep_create; KVF_ERR_TOO_BIG for a peer name too long
 *
 * thread: owning loop only. ownership: returns a new reference the caller
 * drops with kvf_ucx_ep_put; the cache keeps its own until the endpoint
 * fails or the worker is destroyed.
 */
kvf_status_t kvf_ucx_ep_get(kvf_ucx_worker_t *worker, const char *peer,
                            const kvf_ucx_ep_params_t *params,
                            kvf_ucx_ep_t **ep_p);

/**
 * Takes a reference; drop it with kvf_ucx_ep_put.
 *
 * thread: owning loop only.
 */
void kvf_ucx_ep_hold(kvf_ucx_ep_t *ep);

/**
 * Drops a reference; the last one closes the UCX endpoint and frees it once
 * UCX is done. The close is forced (UCP_EP_CLOSE_FLAG_FORCE): none of our
 * operations are left on it, and a dead or stalled peer cannot hold it up;
 * the peer sees a reset. NULL: no-op.
 */
void kvf_ucx_ep_put(kvf_ucx_ep_t *ep);

/**
 * Fails the endpoint on purpose: in-flight operations complete with
 * KVF_ERR_CLOSED, it leaves the cache, the error callback runs.
 */
void kvf_ucx_ep_fail(kvf_ucx_ep_t *ep, kvf_status_t status);

/** true once the endpoint failed or was closed. thread: owning loop. */
bool kvf_ucx_ep_is_failed(const kvf_ucx_ep_t *ep);

/** true for an endpoint a listener accepted (the peer connected to us). */
bool kvf_ucx_ep_is_accepted(const kvf_ucx_ep_t *ep);

/**
 * Peer name: the cache key, or "HOST:PORT" of the remote side of an
 * accepted endpoint. ownership: borrowed, lives as long as @p ep.
 */
const char *kvf_ucx_ep_peer(const kvf_ucx_ep_t *ep);

/**
 * A caller-owned tag (e.g. the agent's peer object); never freed here.
 * thread: owning loop only.
 */
void kvf_ucx_ep_set_user(kvf_ucx_ep_t *ep, void *user);
void *kvf_ucx_ep_user(const kvf_ucx_ep_t *ep);

/* --------------------------------------------------------------- memory */

typedef enum {
    KVF_UCX_MEM_REMOTE_READ  = 1u << 0, /**< peers may get from it */
    KVF_UCX_MEM_REMOTE_WRITE = 1u << 1, /**< peers may put into it */
} kvf_ucx_mem_access_t;

/**
 * Registers [addr, addr+len) once with every transport (zero-copy sends
 * and rendezvous receives).
 *
 * @param [in] access  KVF_UCX_MEM_REMOTE_* bits (local access always).
 *                     Grant the least a region needs (docs/security.md):
 *                     a serving pool REMOTE_READ only, a PD receive region
 *                     REMOTE_WRITE only. UCX passes them to its transports;
 *                     TCP and shared memory do not enforce them.
 * @return KVF_OK; KVF_ERR_INVALID (NULL/0 length/unknown bits);
 *         KVF_ERR_TRANSPORT; KVF_ERR_NO_MEMORY
 *
 * thread: any (the context is thread-safe). ownership: caller destroys it
 * with kvf_ucx_mem_deregister after the last operation on it completed.
 */
kvf_status_t kvf_ucx_mem_register(kvf_ucx_ctx_t *ctx, void *addr, size_t len,
                                  unsigned access, kvf_ucx_mem_t **mem_p);

/**
 * Deregisters; NULL is a no-op. Before kvf_ucx_ctx_destroy, and after the
 * last operation using it completed.
 */
void kvf_ucx_mem_deregister(kvf_ucx_mem_t *mem);

/** Start and length of the registered region. thread: any. */
void *kvf_ucx_mem_base(const kvf_ucx_mem_t *mem);
size_t kvf_ucx_mem_length(const kvf_ucx_mem_t *mem);

/* ------------------------------------------------------------ operations */

/** Completion of an operation (see the top of this file). */
typedef void (*kvf_ucx_op_cb_t)(kvf_status_t status, void *arg);

typedef enum {
    KVF_UCX_AM_SEND_EAGER = 1u << 0, /**< force eager protocol */
    KVF_UCX_AM_SEND_RNDV  = 1u << 1, /**< force rendezvous (bulk data) */
} kvf_ucx_am_send_flags_t;

/**
 * Sends active message @p id: @p header (at most KVF_UCX_AM_HEADER_MAX
 * bytes, copied: the caller's buffer may go at once) and @p data
 * (the payload; must stay untouched until the callback). @p mem, when not
 * NULL, is the registration covering @p data (zero copy).
 *
 * @param [in] timeout_ns  0: KVF_UCX_TIMEOUT_DEFAULT_NS
 * @return KVF_OK (callback will run); KVF_ERR_INVALID; KVF_ERR_CLOSED
 *         (failed ep); KVF_ERR_BUSY (no free operation);
 *         KVF_ERR_TRANSPORT (UCX refused at once, logged)
 *
 * thread: owning loop only.
 */
kvf_status_t kvf_ucx_am_send(kvf_ucx_ep_t *ep, unsigned id, const void *header,
                             size_t header_len, const void *data, size_t len,
                             const kvf_ucx_mem_t *mem, unsigned flags,
                             uint64_t timeout_ns, kvf_ucx_op_cb_t cb,
                             void *arg);

/** One piece of a scattered payload (laid out as UCX's ucp_dt_iov_t). */
typedef struct kvf_ucx_iov {
    void *buf;
    size_t len;
} kvf_ucx_iov_t;

/** Most pieces of one scattered send or receive. */
#define KVF_UCX_IOV_MAX 64u
/** Largest header of kvf_ucx_am_send_iov (it describes many pieces). */
#define KVF_UCX_AM_IOV_HEADER_MAX 1024u

/**
 * As kvf_ucx_am_send, with the payload gathered from @p iov (@p iovcnt
 * pieces, at most KVF_UCX_IOV_MAX): many chunks travel as one message (one
 * rendezvous). A header of up to KVF_UCX_AM_HEADER_MAX bytes is copied; a
 * longer one (up to KVF_UCX_AM_IOV_HEADER_MAX) must stay untouched until
 * the callback, as must @p iov itself and every piece.
 */
kvf_status_t kvf_ucx_am_send_iov(kvf_ucx_ep_t *ep, unsigned id,
                                 const void *header, size_t header_len,
                                 const kvf_ucx_iov_t *iov, size_t iovcnt,
                                 unsigned flags, uint64_t timeout_ns,
                                 kvf_ucx_op_cb_t cb, void *arg);

/**
 * An incoming active message, as given to a handler. A plain value: copy it
 * to keep a rendezvous message past the handler (handler returns
 * KVF_INPROGRESS), then kvf_ucx_am_recv_data or kvf_ucx_am_msg_release.
 */
typedef struct kvf_ucx_am_msg {
    kvf_ucx_worker_t *worker;
    kvf_ucx_ep_t *reply_ep; /**< borrowed; NULL when unknown */
    const void *data;       /**< eager payload, valid in the handler only */
    size_t length;          /**< payload length */
    bool is_rndv;           /**< payload still at the sender */
    void *desc;             /**< UCX descriptor (rendezvous) */
} kvf_ucx_am_msg_t;

/**
 * Handler of one active message id. Return KVF_OK when done with @p msg
 * (a rendezvous payload not received is declined), KVF_INPROGRESS to keep
 * a rendezvous @p msg for later.
 */
typedef kvf_status_t (*kvf_ucx_am_cb_t)(void *arg, const void *header,
                                        size_t header_len,
                                        const kvf_ucx_am_msg_t *msg);

/**
 * Registers (or with @p cb NULL removes) the handler of @p id.
 *
 * @return KVF_OK; KVF_ERR_RANGE (id >= KVF_UCX_AM_ID_MAX);
 *         KVF_ERR_TRANSPORT
 */
kvf_status_t kvf_ucx_am_set_handler(kvf_ucx_worker_t *worker, unsigned id,
                                    kvf_ucx_am_cb_t cb, void *arg);

/**
 * Hands an eager active message @p id to its handler in process, exactly
 * as the UCX receive path does (@p reply_ep, may be NULL, as the sender's
 * endpoint): for fuzzing the handlers (tests/fuzz/fuzz_mesh.c) and tools.
 *
 * thread: owning loop only.
 */
void kvf_ucx_am_deliver(kvf_ucx_worker_t *worker, unsigned id,
                        const void *header, size_t header_len, const void *data,
                        size_t len, kvf_ucx_ep_t *reply_ep);

/**
 * Receives @p msg's payload into @p dest (exactly msg->length bytes must
 * fit in @p dest_len): eager data is copied at once, rendezvous data lands
 * straight in @p dest (e.g. a pool slot inside @p mem).
 *
 * @return KVF_OK (callback will run); KVF_ERR_TOO_BIG (dest too small: the
 *         message is declined); KVF_ERR_BUSY; KVF_ERR_TRANSPORT
 */
kvf_status_t kvf_ucx_am_recv_data(const kvf_ucx_am_msg_t *msg, void *dest,
                                  size_t dest_len, const kvf_ucx_mem_t *mem,
                                  uint64_t timeout_ns, kvf_ucx_op_cb_t cb,
                                  void *arg);

/**
 * Releases a kept rendezvous message without receiving it; UCX then
 * completes the sender's send (successfully). Inside the handler it
 * declines the message. Eager messages: no-op.
 *
 * thread: owning loop only.
 */
void kvf_ucx_am_msg_release(const kvf_ucx_am_msg_t *msg);

/**
 * As kvf_ucx_am_recv_data, scattering the payload over @p iov (@p iovcnt
 * pieces, at most KVF_UCX_IOV_MAX, whose lengths add up to exactly
 * msg->length; @p iov must stay valid until the callback), e.g. one slot
 * of the pool per chunk of a batch.
 *
 * @return as kvf_ucx_am_recv_data; KVF_ERR_INVALID when the lengths do not
 *         add up (the message is declined)
 */
kvf_status_t kvf_ucx_am_recv_data_iov(const kvf_ucx_am_msg_t *msg,
                                      const kvf_ucx_iov_t *iov, size_t iovcnt,
                                      uint64_t timeout_ns, kvf_ucx_op_cb_t cb,
                                      void *arg);

/**
 * Completes when UCX has flushed the worker (ucp_worker_flush_nbx). In UCX
 * 1.13 that does not wait for rendezvous sends still waiting for their
 * receiver (seen in tests): use the send callbacks for those. A worker
 * flush cannot be canceled by UCX: past its deadline every endpoint with
 * operations in flight is failed, which releases it.
 */
kvf_status_t kvf_ucx_worker_flush(kvf_ucx_worker_t *worker, uint64_t timeout_ns,
                                  kvf_ucx_op_cb_t cb, void *arg);

/**
 * Maps a ucs_status_t to ours: KVF_ERR_CLOSED for peer failures
 * (reset, endpoint timeout, unreachable, rejected), KVF_ERR_TRANSPORT for
 * anything unlisted. thread: any.
 */
kvf_status_t kvf_ucx_status(int ucs_status);

#endif /* KVF_TRANSPORT_UCX_H */
