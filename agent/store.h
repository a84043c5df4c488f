/* SPDX-License-Identifier: Apache-2.0 */
/* Copyright (c) 2026 The kvfabric authors */
/*
 * The agent's chunk store: the shared pool plus the rules engines and peers
 * meet — grants owned by a connection, commit with checksum verification,
 * pins held by an owner, announcements to the controller. Every slot an
 * owner names is checked against that owner's own grants or pins: an engine
 * can never make the agent touch memory outside what it was given.
 *
 * Owners are opaque tokens (an engine connection, a peer transfer); closing
 * an owner releases everything it holds.
 *
 * thread: owning loop only.
 */
#ifndef KVF_AGENT_STORE_H
#define KVF_AGENT_STORE_H

#include <kvfabric/keys.h>
#include <kvfabric/kvfabric.h>
#include <kvfabric/status.h>

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct kvf_store kvf_store_t;

typedef void (*kvf_store_key_cb_t)(void *arg, const kvf_key_t *key);

typedef struct kvf_store_params {
    uint64_t size;               /* pool bytes */
    uint64_t max_chunk;          /* largest chunk; 0: the pool size */
    size_t max_entries;          /* chunks the store can index */
    kvf_store_key_cb_t admit_cb; /* a chunk was committed */
    kvf_store_key_cb_t evict_cb; /* a chunk was evicted */
    void *cb_arg;
} kvf_store_params_t;

typedef struct kvf_store_stats {
    uint64_t capacity, used, entries, commits, evictions, hits, misses;
    uint64_t checksum_failures;
} kvf_store_stats_t;

/* Creates the store: a memfd pool of params->size bytes, mapped shared.
 * KVF_ERR_IO (logged) when the memory cannot be had. */
kvf_status_t kvf_store_create(const kvf_store_params_t *params,
                              kvf_store_t **store_p);
void kvf_store_destroy(kvf_store_t *store);
void kvf_store_get_stats(const kvf_store_t *store, kvf_store_stats_t *stats_p);
void *kvf_store_base(const kvf_store_t *store);

/* Calls @p cb for the key of every committed chunk (the inventory). */
void kvf_store_foreach_key(kvf_store_t *store, kvf_store_key_cb_t cb,
                           void *arg);

/* Grants @p bytes for writing to @p owner. KVF_ERR_NO_MEMORY when nothing
 * can be evicted, KVF_ERR_TOO_BIG over the largest chunk. */
kvf_status_t kvf_store_alloc(kvf_store_t *store, const void *owner,
                             uint64_t bytes, kvf_slot_t *slot_p);

/* Publishes @p owner's grant at @p offset under @p key after checking the
 * bytes against @p checksum. KVF_ERR_RANGE (not a grant of this owner),
 * KVF_ERR_CHECKSUM (the grant is freed), KVF_ERR_EXISTS (already held: the
 * grant is freed, the existing chunk kept). */
kvf_status_t kvf_store_commit(kvf_store_t *store, const void *owner,
                              const kvf_key_t *key, uint64_t offset,
                              uint64_t checksum);

/* Pins the local chunk of @p key for @p owner. KVF_ERR_NOT_FOUND. */
kvf_status_t kvf_store_pin(kvf_store_t *store, const void *owner,
                           const kvf_key_t *key, kvf_slot_t *slot_p);

/* Releases @p owner's pin or grant at @p offset. KVF_ERR_RANGE when the
 * owner holds nothing there. */
kvf_status_t kvf_store_release(kvf_store_t *store, const void *owner,
                               uint64_t offset);

/* Releases every grant and pin of @p owner (its connection closed). */
void kvf_store_release_owner(kvf_store_t *store, const void *owner);

/* Number of leading keys of @p keys held locally. */
uint32_t kvf_store_local_prefix(kvf_store_t *store, const kvf_key_t *keys,
                                uint32_t num);

/* The pool's memfd, size and largest chunk, for engines to map. */
int kvf_store_fd(const kvf_store_t *store);
uint64_t kvf_store_size(const kvf_store_t *store);
uint64_t kvf_store_max_chunk(const kvf_store_t *store);

#endif /* KVF_AGENT_STORE_H */
