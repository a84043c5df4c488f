/* SPDX-License-Identifier: Apache-2.0 */
/* Copyright (c) 2026 The kvfabric authors */
/**
 * @file kvfabric.h
 * The client API an inference engine links (libkvfabric): connect to the
 * local kvf-agent, store chunks in its shared pool, find and retrieve
 * prefixes held anywhere in the cluster, and push/wait in PD mode.
 *
 * Status: every call here is built and exported (KVF_API), the PD calls
 * (kvf_pd_push, kvf_pd_wait, kvf_pd_release) included.
 *
 * Model. The agent owns a shared-memory pool; kvf_client_connect() maps it
 * into the engine. A chunk is written in place: kvf_client_alloc() grants a
 * slot (an offset and length inside the pool), the engine copies the
 * chunk's KV there (gpu/ pack kernels), and kvf_client_commit() publishes it
 * under its key with its checksum. Until commit, no one else can see it;
 * a grant never committed is reclaimed after its lease. Offsets travel,
 * never bytes.
 *
 * Every call blocks with a timeout (the connection's default unless given)
 * and returns a kvf_status_t. A connection is used by one thread at a time.
 */
#ifndef KVFABRIC_KVFABRIC_H
#define KVFABRIC_KVFABRIC_H

#include <kvfabric/defs.h>
#include <kvfabric/keys.h>
#include <kvfabric/log.h>
#include <kvfabric/status.h>

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/** A connection to the local agent. Opaque. */
typedef struct kvf_client kvf_client_t;

enum {
    KVF_CLIENT_PARAM_SOCKET  = 1u << 0,
    KVF_CLIENT_PARAM_TIMEOUT = 1u << 1,
    KVF_CLIENT_PARAM_NAME    = 1u << 2,
    KVF_CLIENT_PARAM_SECRET  = 1u << 3,
};

/** Parameters of kvf_client_connect(). */
typedef struct kvf_client_params {
    uint64_t field_mask;     /**< KVF_CLIENT_PARAM_* that are set */
    const char *socket_path; /**< agent socket; default from KVF_SOCKET */
    uint64_t timeout_ns;     /**< default per-call timeout (default 5 s) */
    const char *name;        /**< engine name in the agent's logs */
    const char *secret_file; /**< file holding the cluster secret (chmod 600);
                                  default from KVF_CLUSTER_SECRET_FILE */
} kvf_client_params_t;

/** A slot in the shared pool. */
typedef struct kvf_slot {
    uint64_t offset; /**< from the start of the mapped pool */
    uint64_t length; /**< bytes */
} kvf_slot_t;

/** The answer to kvf_client_lookup(). */
typedef struct kvf_lookup_result {
    uint32_t hit_chunks;   /**< leading chunks held anywhere */
    uint32_t local_chunks; /**< of those, held by this agent */
    uint64_t lease_id;     /**< prefetch lease, 0 when none was asked for */
} kvf_lookup_result_t;

/** The agent's counters, from kvf_client_stats(). */
typedef struct kvf_client_stats {
    uint64_t pool_capacity;  /**< bytes */
    uint64_t pool_used;      /**< bytes in chunks and grants */
    uint64_t chunks;         /**< committed chunks held */
    uint64_t local_hits;     /**< chunks engines retrieved from this pool */
    uint64_t misses;         /**< chunks asked for and not available */
    uint64_t fetched_chunks; /**< chunks fetched from other agents */
    uint64_t evictions;      /**< chunks evicted for room */
    uint32_t node_id;        /**< this agent's node id, 0 if unregistered */
    bool registered;         /**< registered with the controller now */
} kvf_client_stats_t;

/**
 * Connects to the agent and maps its pool.
 *
 * @param [in]  params    connection parameters (may be NULL: defaults)
 * @param [out] client_p  the connection, on success
 * The cluster secret comes from the file @p params->secret_file names
 * (KVF_CLIENT_PARAM_SECRET) or else from the environment variable
 * KVF_CLUSTER_SECRET_FILE; without either the client proves nothing, which
 * an agent configured with a secret refuses. On failure the reason is
 * logged once through kvf_log_set_handler() (component "client").
 *
 * @return KVF_OK; KVF_ERR_IO (no agent at the socket), KVF_ERR_VERSION,
 *         KVF_ERR_AUTH (the agent or this side failed the cluster-secret
 *         challenge, or only one side has a secret), KVF_ERR_CONFIG (the
 *         secret file is unreadable, too short, or accessible by group or
 *         others), KVF_ERR_TIMEOUT
 *
 * thread: thread-safe. ownership: free with kvf_client_disconnect().
 */
KVF_API kvf_status_t kvf_client_connect(const kvf_client_params_t *params,
                                        kvf_client_t **client_p);

/** Unmaps the pool and closes the connection; releases every grant and pin
 *  the connection still holds. NULL is a no-op. */
KVF_API void kvf_client_disconnect(kvf_client_t *client);

/**
 * Base address of the mapping in this process (for slot offsets): the
 * agent's pool, read-only, then this connection's own writable staging
 * area. Allocated slots (kvf_client_alloc) and claimed PD chunks
 * (kvf_pd_wait) lie in the staging area; retrieved chunks in the pool,
 * where a write faults (docs/security.md, "Engines").
 */
KVF_API void *kvf_client_pool_base(const kvf_client_t *client);

/** Size of the mapping in bytes (pool and staging area). */
KVF_API uint64_t kvf_client_pool_size(const kvf_client_t *client);

/**
 * One line saying why the last call on @p client failed (the library prints
 * nothing itself): the agent's socket path, the agent's own refusal reason,
 * the secret file. With @p client NULL: why the calling thread's last
 * kvf_client_connect() failed. Valid until the next call on @p client (on
 * this thread, for NULL).
 */
KVF_API const char *kvf_client_last_error(const kvf_client_t *client);

/**
 * How many times @p client reconnected to its agent. A call whose request
 * cannot be sent (the agent restarted while the engine was idle) reconnects
 * and sends it again; a call whose reply is lost (the agent went away while
 * serving it) fails with KVF_ERR_CLOSED, and the next call reconnects
 * (HELLO, AUTH, the new agent's pool), at most once per backoff period (10
 * ms doubling to 250 ms) while the agent is away, each such call failing
 * with KVF_ERR_CLOSED. The new pool is mapped at the same address (when it
 * is larger and the addresses after the old one are taken, elsewhere, and
 * the old range then shows the new pool's first bytes until disconnect:
 * old pointers never fault), so kvf_client_pool_base() normally stays the
 * same; slots and leases of the old agent are gone (look up again).
 *
 * thread: as the other calls on @p client.
 */
KVF_API uint64_t kvf_client_reconnects(const kvf_client_t *client);

/**
 * Grants @p num slots of @p chunk_bytes each for writing.
 * @return KVF_OK; KVF_ERR_NO_MEMORY when the pool is full of pinned chunks
 *         (never waits for space); KVF_ERR_TOO_BIG for a chunk larger than
 *         the largest size class.
 */
KVF_API kvf_status_t kvf_client_alloc(kvf_client_t *client,
                                      uint64_t chunk_bytes, uint32_t num,
                                      kvf_slot_t *slots);

/**
 * Publishes granted slots under @p keys with their checksums
 * (kvf_chunk_checksum of the bytes written). The agent verifies the
 * checksums, indexes the chunks and announces them to the controller.
 * @return KVF_OK; KVF_ERR_RANGE (a slot is not one of this connection's
 *         grants); KVF_ERR_CHECKSUM; KVF_ERR_EXISTS (key already held: the
 *         slot is released, the existing chunk kept)
 */
KVF_API kvf_status_t kvf_client_commit(kvf_client_t *client,
                                       const kvf_key_t *keys,
                                       const kvf_slot_t *slots,
                                       const uint64_t *checksums, uint32_t num);

/**
 * Finds how many leading chunks of a prefix chain are held anywhere in the
 * cluster. With @p prefetch, the agent starts pulling the remote chunks of
 * the hit into its pool at once and pins them under a lease, so the later
 * kvf_client_retrieve() finds them local ("lookup is a promise"). The
 * lease (result_p->lease_id) pins the whole hit and ends when this
 * connection retrieves a prefix with the same first key, when it
 * disconnects, or after the agent's prefetch_lease (10 s by default).
 */
KVF_API kvf_status_t kvf_client_lookup(kvf_client_t *client,
                                       const kvf_key_t *keys, uint32_t num,
                                       bool prefetch,
                                       kvf_lookup_result_t *result_p);

/**
 * Returns pinned slots of the chunks of @p keys, fetching remote chunks into
 * the local pool first. Chunks that could not be had (holder died, checksum
 * failed, evicted) are reported in @p missing (one flag per key) and get a
 * zero-length slot: the engine recomputes exactly those.
 * @return KVF_OK (possibly with misses); KVF_ERR_TIMEOUT
 */
KVF_API kvf_status_t kvf_client_retrieve(kvf_client_t *client,
                                         const kvf_key_t *keys, uint32_t num,
                                         kvf_slot_t *slots, bool *missing);

/**
 * As kvf_client_retrieve(), and also the checksum each chunk was committed
 * with (kvf_chunk_checksum of its bytes; 0 for a missing one), so the
 * engine can check what it reads with kvf_client_verify(). The agent has
 * already checked them; this is for engines that want to see for
 * themselves, e.g. after copying a chunk elsewhere.
 *
 * @param [out] checksums  one per key
 * @return as kvf_client_retrieve(); KVF_ERR_UNSUPPORTED when the agent is
 *         too old to send checksums (the slots are still pinned: release
 *         them)
 */
KVF_API kvf_status_t kvf_client_retrieve_checksums(
    kvf_client_t *client, const kvf_key_t *keys, uint32_t num,
    kvf_slot_t *slots, bool *missing, uint64_t *checksums);

/**
 * true when the bytes of @p slot (in this client's mapping) have checksum
 * @p checksum; false for a slot outside the mapping. Reads the whole slot.
 *
 * thread: thread-safe (reads only).
 */
KVF_API bool kvf_client_verify(const kvf_client_t *client,
                               const kvf_slot_t *slot, uint64_t checksum);

/**
 * Reads the agent's counters.
 *
 * @param [in]  client   the connection
 * @param [out] stats_p  the counters, on success
 * @return KVF_OK; KVF_ERR_INVALID; KVF_ERR_CLOSED; KVF_ERR_TIMEOUT
 *
 * thread: one thread per connection at a time.
 */
KVF_API kvf_status_t kvf_client_stats(kvf_client_t *client,
                                      kvf_client_stats_t *stats_p);

/** Unpins slots returned by kvf_client_retrieve(). */
KVF_API kvf_status_t kvf_client_release(kvf_client_t *client,
                                        const kvf_slot_t *slots, uint32_t num);

/**
 * PD mode, prefill side: pushes chunks of PD request @p request_id into the
 * receive region of the decoder agent named @p decoder (its node name in
 * the controller). Callable repeatedly for one request as chunks or layer
 * groups are produced, so the transfer overlaps prefill compute; @p final
 * marks the last call. Chunks go in the order of the calls and of
 * @p slots. Pushes of different requests may interleave.
 *
 * @param [in] client     the connection
 * @param [in] request_id the PD request, chosen by the engines (unique
 *                        among the decoder's requests in flight)
 * @param [in] decoder    node name of the decoder agent
 * @param [in] slots      this connection's grants (kvf_client_alloc) or
 *                        pins (kvf_client_retrieve) holding the chunks;
 *                        length may be less than the grant (a last partial
 *                        chunk)
 * @param [in] checksums  kvf_chunk_checksum of each chunk's bytes
 * @param [in] num        chunks in this call (1..65536)
 * @param [in] final      the last push of the request
 * @return KVF_OK once the decoder verified every chunk of this call and
 *         of every push of the request started before it (the bytes
 *         landed, not just left); KVF_ERR_INVALID; KVF_ERR_RANGE (a
 *         slot is not this connection's); KVF_ERR_NOT_FOUND / KVF_ERR_CLOSED
 *         (no live decoder of that name, or it died); KVF_ERR_TIMEOUT (the
 *         decoder's region stayed full past its pd_alloc_timeout, or the
 *         push ran past pd_push_timeout); KVF_ERR_BUSY (the decoder's queue
 *         is full, or this sender holds its pd_peer_max_bytes);
 *         KVF_ERR_TOO_BIG (the request is larger than the whole region:
 *         fails at once); KVF_ERR_EXISTS (the id was already delivered);
 *         KVF_ERR_CHECKSUM (bytes arrived damaged); KVF_ERR_CANCELED (an
 *         earlier push of the request failed, or the agent restarted since:
 *         the library numbers a request's pushes, and the agent never
 *         starts a request with a later one). Any failure but EXISTS and
 *         BUSY aborts the request at the decoder; a request whose push
 *         failed is lost: push it again from its first push.
 *
 * thread: one thread per connection at a time. ownership: the slots stay
 * the caller's (unchanged) after the call.
 */
KVF_API kvf_status_t kvf_pd_push(kvf_client_t *client, uint64_t request_id,
                                 const char *decoder, const kvf_slot_t *slots,
                                 const uint64_t *checksums, uint32_t num,
                                 bool final);

/**
 * PD mode, prefill side: as kvf_pd_push(), but returns once the push is
 * sent to the agent, without waiting for the decoder. An engine that
 * saves layer by layer starts one push per layer group as it is computed;
 * the pushes of one request travel and land several at a time (up to 64,
 * where the decoder's agent orders them; one at a time with an older
 * decoder), and the decoder keeps their chunks in the order of the calls
 * whatever order they land in. kvf_pd_push_wait() (or a final
 * kvf_pd_push()) reports how they ended.
 *
 * Parameters as kvf_pd_push().
 * @return KVF_OK (sent); KVF_ERR_INVALID; KVF_ERR_CLOSED (no connection);
 *         the failure of an earlier push of this request not yet reported
 *         (reported now: the request is aborted at its decoder); KVF_ERR_BUSY
 *         (1024 pushes of this connection failed and were never collected).
 *         KVF_ERR_CLOSED or an earlier push's failure loses the request:
 *         push it again from its first push (the library numbers it
 *         afresh).
 *
 * thread: one thread per connection at a time. ownership: the slots must
 * stay unchanged and unreleased until kvf_pd_push_wait() returns for the
 * request.
 */
KVF_API kvf_status_t kvf_pd_push_start(kvf_client_t *client,
                                       uint64_t request_id, const char *decoder,
                                       const kvf_slot_t *slots,
                                       const uint64_t *checksums, uint32_t num,
                                       bool final);

/**
 * PD mode, prefill side: waits until every push of @p request_id started
 * on this connection (kvf_pd_push_start()) ended.
 *
 * @param [in] client     the connection
 * @param [in] request_id the PD request
 * @param [in] timeout_ns how long to wait (0: the agent's pd_push_timeout
 *                        plus the connection's timeout)
 * @return KVF_OK (every one verified by the decoder, or none started);
 *         KVF_ERR_TIMEOUT (some still on their way: call again); else the
 *         first failure among them, as kvf_pd_push() reports it (the
 *         request is then aborted at its decoder)
 *
 * thread: one thread per connection at a time.
 */
KVF_API kvf_status_t kvf_pd_push_wait(kvf_client_t *client, uint64_t request_id,
                                      uint64_t timeout_ns);

/**
 * PD mode, decode side: waits until every chunk of @p request_id arrived
 * and verified (the final push acknowledged), then claims the request for
 * this connection and returns its chunks in push order. May be called
 * before or after the push starts.
 *
 * @param [in]  client      the connection
 * @param [in]  request_id  the PD request
 * @param [in]  timeout_ns  how long to wait (0: the connection's default)
 * @param [out] slots       the chunks: offsets from kvf_client_pool_base()
 *                          (copies in this connection's staging area until
 *                          kvf_pd_release; no engine maps the receive
 *                          region itself)
 * @param [in]  max         room in @p slots
 * @param [out] num_p       chunks written
 * @return KVF_OK; KVF_ERR_TIMEOUT; KVF_ERR_CANCELED (the prefill side
 *         aborted or died, or the request failed at the decoder: the
 *         message says why); KVF_ERR_BUSY (another connection waits for or
 *         claimed it); KVF_ERR_TOO_BIG (@p max smaller than the chunk count:
 *         the request stays claimed, call again with more room);
 *         KVF_ERR_UNSUPPORTED (the agent has no receive region)
 *
 * thread: one thread per connection at a time. ownership: the slots stay
 * valid until kvf_pd_release() or the connection closes.
 */
KVF_API kvf_status_t kvf_pd_wait(kvf_client_t *client, uint64_t request_id,
                                 uint64_t timeout_ns, kvf_slot_t *slots,
                                 uint32_t max, uint32_t *num_p);

/**
 * As kvf_pd_wait(), and also the checksum each chunk was verified with
 * (kvf_chunk_checksum of its bytes, as the prefill engine computed it), so
 * the decode engine can check what it reads with kvf_client_verify(), e.g.
 * after copying the chunks into its own KV cache. The agent has already
 * checked its copy into the staging area against them.
 *
 * @param [out] checksums  room for @p max
 * @return as kvf_pd_wait(); KVF_ERR_UNSUPPORTED when the agent is too old
 *         to send checksums (the request is claimed all the same:
 *         kvf_pd_release() it)
 */
KVF_API kvf_status_t kvf_pd_wait_checksums(
    kvf_client_t *client, uint64_t request_id, uint64_t timeout_ns,
    kvf_slot_t *slots, uint64_t *checksums, uint32_t max, uint32_t *num_p);

/**
 * PD mode, decode side: frees the receive slots of @p request_id (a
 * request not complete yet is aborted), which wakes pushes queued for room.
 *
 * @return KVF_OK; KVF_ERR_NOT_FOUND (unknown request id); KVF_ERR_BUSY
 *         (claimed by another connection)
 *
 * thread: one thread per connection at a time.
 */
KVF_API kvf_status_t kvf_pd_release(kvf_client_t *client, uint64_t request_id);

#ifdef __cplusplus
}
#endif

#endif /* KVFABRIC_KVFABRIC_H */
