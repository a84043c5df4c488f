/* SPDX-License-Identifier: Apache-2.0 */
/* Copyright (c) 2026 The kvfabric authors */
/*
 * The chunk store. This version keeps its own bookkeeping over a memfd
 * region: first-fit extents, a key index, grants and pins per owner, LRU
 * eviction of unpinned chunks. It is the simple, obviously correct version
 * the engine server and client library are tested against; the size-class
 * pool (agent/pool.c) replaces the allocator and index here without
 * changing store.h.
 */
#include "agent/store_int.h"

#include "common/log.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define KVF_STORE_ALIGN 4096u

/* Free extents, sorted by offset, coalesced. */
static kvf_status_t kvf_store_extent_take(kvf_store_t *store, uint64_t len,
                                          uint64_t *offset_p)
{
    size_t i;

    for (i = 0; i < store->num_free; i++) {
        if (store->free_ext[i].len >= len) {
            *offset_p = store->free_ext[i].off;
            store->free_ext[i].off += len;
            store->free_ext[i].len -= len;
            if (store->free_ext[i].len == 0) {
                memmove(&store->free_ext[i], &store->free_ext[i + 1],
                        (store->num_free - i - 1) * sizeof(store->free_ext[0]));
                store->num_free--;
            }
            store->used += len;
            return KVF_OK;
        }
    }
    return KVF_ERR_NO_MEMORY;
}

static void kvf_store_extent_give(kvf_store_t *store, uint64_t off,
                                  uint64_t len)
{
    size_t i = 0;

    while ((i < store->num_free) && (store->free_ext[i].off < off)) {
        i++;
    }
    /* merge with the previous and/or next extent when adjacent */
    if ((i > 0) &&
        (store->free_ext[i - 1].off + store->free_ext[i - 1].len == off)) {
        store->free_ext[i - 1].len += len;
        if ((i < store->num_free) &&
            (store->free_ext[i - 1].off + store->free_ext[i - 1].len ==
             store->free_ext[i].off)) {
            store->free_ext[i - 1].len += store->free_ext[i].len;
            memmove(&store->free_ext[i], &store->free_ext[i + 1],
                    (store->num_free - i - 1) * sizeof(store->free_ext[0]));
            store->num_free--;
        }
    } else if ((i < store->num_free) && (off + len == store->free_ext[i].off)) {
        store->free_ext[i].off = off;
        store->free_ext[i].len += len;
    } else {
        memmove(&store->free_ext[i + 1], &store->free_ext[i],
                (store->num_free - i) * sizeof(store->free_ext[0]));
        store->free_ext[i].off = off;
        store->free_ext[i].len = len;
        store->num_free++;
    }
    store->used -= len;
}

static kvf_store_entry_t *kvf_store_find_offset(kvf_store_t *store,
                                                uint64_t offset)
{
    size_t i;

    for (i = 0; i < store->max_entries; i++) {
        if ((store->entries[i].state != KVF_STORE_FREE) &&
            (store->entries[i].offset == offset)) {
            return &store->entries[i];
        }
    }
    return NULL;
}

static kvf_store_entry_t *kvf_store_find_key(kvf_store_t *store,
                                             const kvf_key_t *key)
{
    size_t i;

    for (i = 0; i < store->max_entries; i++) {
        if ((store->entries[i].state == KVF_STORE_COMMITTED) &&
            kvf_key_equal(&store->entries[i].key, key)) {
            return &store->entries[i];
        }
    }
    return NULL;
}

static void kvf_store_entry_free(kvf_store_t *store, kvf_store_entry_t *e)
{
    kvf_store_extent_give(store, e->offset, e->length);
    memset(e, 0, sizeof(*e));
    store->entries_used--;
}

/* Evicts the least recently used unpinned committed chunk. */
static bool kvf_store_evict_one(kvf_store_t *store)
{
    kvf_store_entry_t *victim = NULL;
    size_t i;

    for (i = 0; i < store->max_entries; i++) {
        kvf_store_entry_t *e = &store->entries[i];

        if ((e->state == KVF_STORE_COMMITTED) && (e->pins == 0) &&
            ((victim == NULL) || (e->last_use < victim->last_use))) {
            victim = e;
        }
    }
    if (victim == NULL) {
        return false;
    }
    if (store->evict_cb != NULL) {
        store->evict_cb(store->cb_arg, &victim->key);
    }
    store->evictions++;
    kvf_store_entry_free(store, victim);
    return true;
}

kvf_status_t kvf_store_alloc(kvf_store_t *store, const void *owner,
                             uint64_t bytes, kvf_slot_t *slot_p)
{
    uint64_t len =
        (bytes + KVF_STORE_ALIGN - 1) & ~(uint64_t)(KVF_STORE_ALIGN - 1);
    kvf_store_entry_t *e = NULL;
    uint64_t offset;
    size_t i;

    if ((bytes == 0) || (bytes > store->max_chunk)) {
        return KVF_ERR_TOO_BIG;
    }
    for (i = 0; i < store->max_entries; i++) {
        if (store->entries[i].state == KVF_STORE_FREE) {
            e = &store->entries[i];
            break;
        }
    }
    while ((e == NULL) ||
           (kvf_store_extent_take(store, len, &offset) != KVF_OK)) {
        if (!kvf_store_evict_one(store)) {
            return KVF_ERR_NO_MEMORY; /* everything is pinned: no waiting */
        }
        if (e == NULL) {
            for (i = 0; i < store->max_entries; i++) {
                if (store->entries[i].state == KVF_STORE_FREE) {
                    e = &store->entries[i];
                    break;
                }
            }
        }
    }
    e->state       = KVF_STORE_GRANTED;
    e->offset      = offset;
    e->length      = len;
    e->data_length = bytes;
    e->owner       = owner;
    store->entries_used++;
    slot_p->offset = offset;
    slot_p->length = bytes;
    return KVF_OK;
}

kvf_status_t kvf_store_commit(kvf_store_t *store, const void *owner,
                              const kvf_key_t *key, uint64_t offset,
                              uint64_t checksum)
{
    kvf_store_entry_t *e = kvf_store_find_offset(store, offset);
    uint64_t actual;

    if ((e == NULL) || (e->state != KVF_STORE_GRANTED) || (e->owner != owner)) {
        return KVF_ERR_RANGE;
    }
    actual = kvf_chunk_checksum((const uint8_t *)store->base + e->offset,
                                e->data_length);
    if (actual != checksum) {
        store->checksum_failures++;
        kvf_store_entry_free(store, e);
        return KVF_ERR_CHECKSUM;
    }
    if (kvf_store_find_key(store, key) != NULL) {
        kvf_store_entry_free(store, e);
        return KVF_ERR_EXISTS;
    }
    e->state    = KVF_STORE_COMMITTED;
    e->key      = *key;
    e->checksum = checksum;
    e->owner    = NULL;
    e->last_use = ++store->clock;
    store->commits++;
    if (store->admit_cb != NULL) {
        store->admit_cb(store->cb_arg, key);
    }
    return KVF_OK;
}

kvf_status_t kvf_store_pin(kvf_store_t *store, const void *owner,
                           const kvf_key_t *key, kvf_slot_t *slot_p)
{
    kvf_store_entry_t *e = kvf_store_find_key(store, key);
    size_t i;

    if (e == NULL) {
        store->misses++;
        return KVF_ERR_NOT_FOUND;
    }
    for (i = 0; i < store->max_pins; i++) {
        if (store->pins[i].entry == NULL) {
            store->pins[i].entry = e;
            store->pins[i].owner = owner;
            e->pins++;
            e->last_use    = ++store->clock;
            slot_p->offset = e->offset;
            slot_p->length = e->data_length;
            store->hits++;
            return KVF_OK;
        }
    }
    return KVF_ERR_BUSY;
}

kvf_status_t kvf_store_release(kvf_store_t *store, const void *owner,
                               uint64_t offset)
{
    kvf_store_entry_t *e;
    size_t i;

    for (i = 0; i < store->max_pins; i++) {
        if ((store->pins[i].owner == owner) && (store->pins[i].entry != NULL) &&
            (store->pins[i].entry->offset == offset)) {
            store->pins[i].entry->pins--;
            store->pins[i].entry = NULL;
            store->pins[i].owner = NULL;
            return KVF_OK;
        }
    }
    e = kvf_store_find_offset(store, offset);
    if ((e != NULL) && (e->state == KVF_STORE_GRANTED) && (e->owner == owner)) {
        kvf_store_entry_free(store, e); /* a grant never committed */
        return KVF_OK;
    }
    return KVF_ERR_RANGE;
}

void kvf_store_release_owner(kvf_store_t *store, const void *owner)
{
    size_t i;

    for (i = 0; i < store->max_pins; i++) {
        if ((store->pins[i].owner == owner) && (store->pins[i].entry != NULL)) {
            store->pins[i].entry->pins--;
            store->pins[i].entry = NULL;
            store->pins[i].owner = NULL;
        }
    }
    for (i = 0; i < store->max_entries; i++) {
        if ((store->entries[i].state == KVF_STORE_GRANTED) &&
            (store->entries[i].owner == owner)) {
            kvf_store_entry_free(store, &store->entries[i]);
        }
    }
}

uint32_t kvf_store_local_prefix(kvf_store_t *store, const kvf_key_t *keys,
                                uint32_t num)
{
    uint32_t i;

    for (i = 0; i < num; i++) {
        if (kvf_store_find_key(store, &keys[i]) == NULL) {
            break;
        }
    }
    return i;
}

int kvf_store_fd(const kvf_store_t *store)
{
    return store->fd;
}

uint64_t kvf_store_size(const kvf_store_t *store)
{
    return store->size;
}

uint64_t kvf_store_max_chunk(const kvf_store_t *store)
{
    return store->max_chunk;
}

kvf_status_t kvf_store_create(const kvf_store_params_t *params,
                              kvf_store_t **store_p)
{
    kvf_store_t *store;
    kvf_status_t status;

    if ((params == NULL) || (params->size < KVF_STORE_ALIGN) ||
        (params->max_entries == 0)) {
        return KVF_ERR_INVALID;
    }
    store = calloc(1, sizeof(*store));
    if (store == NULL) {
        return KVF_ERR_NO_MEMORY;
    }
    store->fd   = -1;
    store->size = params->size & ~(uint64_t)(KVF_STORE_ALIGN - 1);
    store->max_chunk =
        (params->max_chunk != 0) ? params->max_chunk : store->size;
    store->max_entries = params->max_entries;
    store->max_pins    = 4 * params->max_entries;
    store->admit_cb    = params->admit_cb;
    store->evict_cb    = params->evict_cb;
    store->cb_arg      = params->cb_arg;
    store->entries     = calloc(store->max_entries, sizeof(*store->entries));
    store->pins        = calloc(store->max_pins, sizeof(*store->pins));
    store->free_ext = calloc(store->max_entries + 2, sizeof(*store->free_ext));
    if ((store->entries == NULL) || (store->pins == NULL) ||
        (store->free_ext == NULL)) {
        status = KVF_ERR_NO_MEMORY;
        goto err_destroy;
    }
    store->fd = memfd_create("kvf-pool", MFD_CLOEXEC);
    if (store->fd < 0) {
        kvf_error("pool: memfd_create failed: %m");
        status = KVF_ERR_IO;
        goto err_destroy;
    }
    if (ftruncate(store->fd, (off_t)store->size) != 0) {
        kvf_error("pool: cannot size the pool to %llu bytes: %m",
                  (unsigned long long)store->size);
        status = KVF_ERR_IO;
        goto err_destroy;
    }
    store->base = mmap(NULL, store->size, PROT_READ | PROT_WRITE, MAP_SHARED,
                       store->fd, 0);
    if (store->base == MAP_FAILED) {
        store->base = NULL;
        kvf_error("pool: cannot map %llu bytes: %m",
                  (unsigned long long)store->size);
        status = KVF_ERR_IO;
        goto err_destroy;
    }
    store->free_ext[0].off = 0;
    store->free_ext[0].len = store->size;
    store->num_free        = 1;
    *store_p               = store;
    return KVF_OK;

err_destroy:
    kvf_store_destroy(store);
    return status;
}

void kvf_store_destroy(kvf_store_t *store)
{
    if (store == NULL) {
        return;
    }
    if (store->base != NULL) {
        munmap(store->base, store->size);
    }
    if (store->fd >= 0) {
        close(store->fd);
    }
    free(store->entries);
    free(store->pins);
    free(store->free_ext);
    free(store);
}

void kvf_store_get_stats(const kvf_store_t *store, kvf_store_stats_t *stats_p)
{
    stats_p->capacity          = store->size;
    stats_p->used              = store->used;
    stats_p->entries           = store->entries_used;
    stats_p->commits           = store->commits;
    stats_p->evictions         = store->evictions;
    stats_p->hits              = store->hits;
    stats_p->misses            = store->misses;
    stats_p->checksum_failures = store->checksum_failures;
}

void *kvf_store_base(const kvf_store_t *store)
{
    return store->base;
}

void kvf_store_foreach_key(kvf_store_t *store, kvf_store_key_cb_t cb, void *arg)
{
    size_t i;

    for (i = 0; i < store->max_entries; i++) {
        if (store->entries[i].state == KVF_STORE_COMMITTED) {
            cb(arg, &store->entries[i].key);
        }
    }
}
