/* SPDX-License-Identifier: Apache-2.0 */
/* Copyright (c) 2026 The kvfabric authors */
/*
 * The agent's chunk store: the shared pool (agent/pool.h) plus the rules
 * engines and peers meet there. Grants and pins belong to an owner (an
 * engine connection, later a peer transfer); every offset an owner names is
 * checked against that owner's own grants and pins, so an engine can never
 * make the agent touch memory outside what it was given. Commit verifies
 * the chunk's checksum before the chunk becomes visible. Destroying an
 * owner releases everything it held, so a crashed engine leaks nothing and
 * the chunks it committed stay.
 *
 * thread: owning loop only.
 */
#ifndef KVF_AGENT_STORE_H
#define KVF_AGENT_STORE_H

#include "agent/copier.h"
#include "agent/disk.h"
#include "agent/pool.h"

#include <kvfabric/keys.h>
#include <kvfabric/kvfabric.h>
#include <kvfabric/status.h>

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct kvf_store kvf_store_t;
typedef struct kvf_store_owner kvf_store_owner_t;

typedef void (*kvf_store_key_cb_t)(void *arg, const kvf_key_t *key);

/* A kvf_store_promote finished: @p promoted chunks came from disk into the
 * pool, @p failed could not (damaged, I/O error, no room). */
typedef void (*kvf_store_promote_cb_t)(void *arg, uint32_t promoted,
                                       uint32_t failed);

typedef struct kvf_store_params {
    const kvf_pool_params_t *pool; /* the pool to create */
    kvf_store_key_cb_t admit_cb;   /* a chunk was committed; may be NULL */
    kvf_store_key_cb_t evict_cb;   /* a chunk left the node; may be NULL */
    /* a chunk left the pool and is kept on the disk tier only (its write
     * landed); NULL: evict_cb. A promotion back calls admit_cb. */
    kvf_store_key_cb_t demote_cb;
    void *cb_arg;
    uint64_t grant_timeout_ns; /* grants not committed by then are taken
                                  back; 0: only when their owner goes */
    unsigned copy_threads;     /* the copier's workers (kvf_store_copy);
                                  0: copies run on the caller alone */
} kvf_store_params_t;

typedef struct kvf_store_stats {
    kvf_pool_stats_t pool;
    uint64_t commits;
    uint64_t duplicates;        /* commits of a key already held */
    uint64_t hits;              /* chunks pinned for a reader */
    uint64_t misses;            /* chunks asked for and not held */
    uint64_t checksum_failures; /* commits whose bytes did not match */
    uint64_t expired_grants;    /* grants taken back uncommitted */
    uint64_t owners;            /* open owners */
    uint64_t spilled;           /* evicted chunks handed to the disk tier */
    uint64_t promoted;          /* chunks read back from disk to the pool */
    uint64_t promote_failures;  /* reads back that gave no chunk */
    uint64_t promote_waits;     /* reads that waited for the tier's queue */
} kvf_store_stats_t;

/* Creates the store and its pool. Logs and returns the pool's failure. */
kvf_status_t kvf_store_create(const kvf_store_params_t *params,
                              kvf_store_t **store_p);

/* Destroys the store; every owner must be destroyed first. NULL: no-op. */
void kvf_store_destroy(kvf_store_t *store);

void kvf_store_get_stats(const kvf_store_t *store, kvf_store_stats_t *stats_p);

/* The pool's memfd, base, size and largest chunk (for engines to map:
 * they get kvf_store_fd_readonly, kvf_store_size bytes). */
int kvf_store_fd(const kvf_store_t *store);
/* A new read-only fd of the pool (kvf_pool_fd_readonly); caller closes. */
kvf_status_t kvf_store_fd_readonly(const kvf_store_t *store, int *fd_p);
void *kvf_store_base(const kvf_store_t *store);
uint64_t kvf_store_size(const kvf_store_t *store);
uint64_t kvf_store_max_chunk(const kvf_store_t *store);

/* The PD receive region reserved after the pool in the same mapping, not
 * in the memfd engines get (agent/pd.h): its offset through @p offset_p,
 * its length as the result. */
uint64_t kvf_store_reserve(const kvf_store_t *store, uint64_t *offset_p);

/* The PD receive region's own memfd (kvf_pool_reserve_fd), -1: none. */
int kvf_store_reserve_fd(const kvf_store_t *store);

/* Moves what @p from holds at @p offset (a grant or pins) to @p to, e.g. to
 * keep chunks a push is sending alive when their engine disconnects.
 * Writes the chunk's length. KVF_ERR_RANGE when @p from holds nothing
 * there (or @p to already does); KVF_ERR_NO_MEMORY. */
kvf_status_t kvf_store_move(kvf_store_t *store, kvf_store_owner_t *from,
                            kvf_store_owner_t *to, uint64_t offset,
                            uint64_t *length_p);

/* A holder of grants and pins. KVF_ERR_NO_MEMORY. */
kvf_status_t kvf_store_owner_create(kvf_store_t *store,
                                    kvf_store_owner_t **owner_p);

/* Releases every grant (freed) and pin (dropped) of @p owner and frees it.
 * NULL is a no-op. */
void kvf_store_owner_destroy(kvf_store_t *store, kvf_store_owner_t *owner);

/* Grants @p bytes for writing. KVF_ERR_NO_MEMORY when nothing can be
 * evicted (never waits), KVF_ERR_TOO_BIG over the largest chunk. */
kvf_status_t kvf_store_alloc(kvf_store_t *store, kvf_store_owner_t *owner,
                             uint64_t bytes, kvf_slot_t *slot_p);

/* Publishes the owner's grant at @p offset under @p key after checking its
 * bytes against @p checksum. KVF_ERR_RANGE (not a grant of this owner),
 * KVF_ERR_CHECKSUM (the grant is freed), KVF_ERR_EXISTS (already held: the
 * grant is freed, the existing chunk kept). */
kvf_status_t kvf_store_commit(kvf_store_t *store, kvf_store_owner_t *owner,
                              const kvf_key_t *key, uint64_t offset,
                              uint64_t checksum);

/* As kvf_store_commit, for bytes that landed from elsewhere (a peer's
 * transfer): hashed where they lie now, the chunk's first retrieve does
 * not hash them again (kvf_store_pin_checked). */
kvf_status_t kvf_store_commit_landed(kvf_store_t *store,
                                     kvf_store_owner_t *owner,
                                     const kvf_key_t *key, uint64_t offset,
                                     uint64_t checksum);

/* As kvf_store_commit, with @p actual the checksum the caller computed
 * over the grant's bytes as they landed (a copy that hashes what it wrote
 * while it is in cache: an engine's commit, agent/engine_server.c, a
 * same-host copy, agent/local.c): one pass over the bytes, not two.
 * @p landed as in kvf_store_commit_landed (false for an engine's bytes:
 * every retrieve of those hashes them). */
kvf_status_t kvf_store_commit_hashed(kvf_store_t *store,
                                     kvf_store_owner_t *owner,
                                     const kvf_key_t *key, uint64_t offset,
                                     uint64_t checksum, uint64_t actual,
                                     bool landed);

/* Copies and checksums @p jobs[0, n) on the store's copier
 * (agent/copier.h; the caller alone with copy_threads 0), the disk tier's
 * queue going on between the caller's chunks. */
void kvf_store_copy(kvf_store_t *store, kvf_copy_job_t *jobs, size_t n);

/* The bytes of the owner's grant at @p offset, @p len_p of them, for a
 * caller that fills it and hashes what landed (agent/copier.h) before
 * kvf_store_commit_hashed; NULL: not a grant of this owner. */
uint8_t *kvf_store_grant_ptr(kvf_store_t *store, kvf_store_owner_t *owner,
                             uint64_t offset, uint64_t *len_p);

/* Pins the local chunk of @p key for @p owner. KVF_ERR_NOT_FOUND, also
 * for a chunk found damaged (out of the index at once; its block goes
 * when its last holder lets go). */
kvf_status_t kvf_store_pin(kvf_store_t *store, kvf_store_owner_t *owner,
                           const kvf_key_t *key, kvf_slot_t *slot_p);

/* Pins the local chunk of each of @p keys[0, n) for @p owner and checks
 * its bytes against the checksum they were committed with (on the
 * copier's threads too), so every byte an engine reads was verified
 * (engines map the pool read-only since #16.4; this is defence in depth
 * against the agent's own bugs and bad memory). The first read of a
 * chunk that landed from elsewhere (a peer, a same-host copy, the disk
 * tier: kvf_store_commit_landed) is the exception: hashed where it lies
 * as it landed, it is not hashed again; every later read is. Per key,
 * @p results[i]:
 * KVF_OK with @p slots[i] and @p sums[i] (the committed checksum),
 * KVF_ERR_NOT_FOUND, or KVF_ERR_CHECKSUM: the chunk is unpinned, dropped
 * (announced evicted, so the registry forgets it) now or, while another
 * engine pins it or a peer send holds it, when the last of them lets go,
 * and counted in checksum_failures once, however often it is asked
 * meanwhile (then it is KVF_ERR_NOT_FOUND): a miss, never wrong bytes.
 * KVF_ERR_NO_MEMORY: nothing was pinned. */
kvf_status_t kvf_store_pin_checked(kvf_store_t *store, kvf_store_owner_t *owner,
                                   const kvf_key_t *keys, uint32_t n,
                                   kvf_slot_t *slots, uint64_t *sums,
                                   kvf_status_t *results);

/* Checks the committed chunk of @p key against its checksum (a peer said
 * what we served it failed); one that fails is dropped and counted as in
 * kvf_store_pin_checked. KVF_OK (intact, or not held: also when dropped
 * before); KVF_ERR_CHECKSUM (dropped now; a block still referenced goes
 * with its last reference). */
kvf_status_t kvf_store_verify(kvf_store_t *store, const kvf_key_t *key);

/* Drops one pin, or gives back an uncommitted grant, at @p offset.
 * KVF_ERR_RANGE when the owner holds nothing there. */
kvf_status_t kvf_store_release(kvf_store_t *store, kvf_store_owner_t *owner,
                               uint64_t offset);

/* Holds the committed chunk of @p key for a transfer to a peer (it cannot
 * be evicted until kvf_store_put_chunk). KVF_ERR_NOT_FOUND, also for a
 * chunk found damaged. kvf_store_put_chunk frees the block of a chunk
 * found damaged meanwhile with its last reference. */
kvf_status_t kvf_store_hold_chunk(kvf_store_t *store, const kvf_key_t *key,
                                  kvf_pool_entry_t **entry_p);
void kvf_store_put_chunk(kvf_store_t *store, kvf_pool_entry_t *entry);

/* Number of leading keys of @p keys held locally. */
uint32_t kvf_store_local_prefix(kvf_store_t *store, const kvf_key_t *keys,
                                uint32_t num);

/* Takes back every grant whose deadline passed (an engine that allocated
 * and never committed); returns how many. Call it from a timer. */
uint64_t kvf_store_expire_grants(kvf_store_t *store, uint64_t now_ns);

/* Sets the pin level (controller PIN / UNPIN) of the chunks of @p keys held
 * here; returns how many were found. */
uint32_t kvf_store_set_pin(kvf_store_t *store, const kvf_key_t *keys,
                           uint32_t num, kvf_pool_pin_t pin);

/* Drops every committed chunk that is neither hard-pinned nor in use
 * (controller CLEAR); returns how many were dropped. */
uint64_t kvf_store_clear(kvf_store_t *store);

/* Calls @p cb with the key of every committed chunk (the inventory). */
void kvf_store_foreach_key(kvf_store_t *store, kvf_store_key_cb_t cb,
                           void *arg);

/* Puts the local-disk tier behind the pool (NULL: none): from now on every
 * chunk the pool evicts is written behind to @p disk, and
 * kvf_store_promote reads chunks back. The disk is borrowed: destroy it
 * before the store (its last completions land in the pool). */
void kvf_store_set_disk(kvf_store_t *store, kvf_disk_t *disk);

/* The disk tier's stored_cb and dropped_cb (@p arg: the store): a chunk
 * whose write landed and that the pool no longer has is announced with
 * demote_cb; one that left the disk and the pool with evict_cb. */
void kvf_store_on_disk_stored(void *arg, const kvf_key_t *key);
void kvf_store_on_disk_dropped(void *arg, const kvf_key_t *key);

/* The disk tier's written_cb (@p arg: the store): the evicted pool block
 * at @p data, kept for its write, was written (or its write failed) and is
 * free again. */
void kvf_store_on_disk_written(void *arg, const void *data);

/* true when a disk tier is behind the pool (kvf_store_set_disk). */
bool kvf_store_has_disk(const kvf_store_t *store);

/* @p key is asked for (a peer's fetch): when it is on disk only, disk
 * eviction passes over it for a while (kvf_disk_want), so that the room
 * made in the pool by other read-backs does not evict it. No-op without a
 * disk tier. */
void kvf_store_want(kvf_store_t *store, const kvf_key_t *key);

/* Number of leading keys of @p keys held locally, in the pool or on disk. */
uint32_t kvf_store_tier_prefix(kvf_store_t *store, const kvf_key_t *keys,
                               uint32_t num);

/* Reads the chunks of @p keys that are on disk and not in the pool into
 * pool blocks, verifies them and commits them there (promotion). A key an
 * earlier promotion is reading already is not read twice: this one waits
 * for that read (a retrieve after a prefetching lookup).
 * KVF_INPROGRESS: @p cb runs when every read is done (NULL @p cb: fire and
 * forget, as a prefetch); KVF_OK: nothing to wait for, @p cb not called;
 * KVF_ERR_NO_MEMORY. */
kvf_status_t kvf_store_promote(kvf_store_t *store, const kvf_key_t *keys,
                               uint32_t num, kvf_store_promote_cb_t cb,
                               void *arg);

/* Writes every committed chunk of the pool that is not on disk yet to the
 * disk tier and waits until they landed (a clean stop: the next start on
 * the same disk_path finds them). Blocks; returns how many were written. */
uint64_t kvf_store_spill_all(kvf_store_t *store);

/* Makes sure no promotion calls back with @p arg any more (the reads still
 * land in the pool). */
void kvf_store_promote_cancel(kvf_store_t *store, void *arg);

#endif /* KVF_AGENT_STORE_H */
