/* SPDX-License-Identifier: Apache-2.0 */
/* Copyright (c) 2026 The kvfabric authors */
/*
 * Pool internals. Every table is sized at create (units = capacity /
 * min_chunk bounds both blocks and entries), so the alloc/commit/lookup
 * paths neither allocate nor make system calls. Metadata lives outside the
 * shared region: an engine that scribbles on the mapping cannot corrupt the
 * allocator.
 */
#include "agent/pool.h"

#include "common/log.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define KVF_POOL_NIL           UINT32_MAX
#define KVF_POOL_CLASSES_MAX   24
#define KVF_POOL_LFU_BUCKETS   16
#define KVF_POOL_TIERS         2 /* unpinned, soft-pinned */
#define KVF_POOL_LIST_ALLOC    (KVF_POOL_TIERS * KVF_POOL_LFU_BUCKETS)
#define KVF_POOL_LISTS         (KVF_POOL_LIST_ALLOC + 1)
#define KVF_POOL_LIST_NONE     0xff
#define KVF_POOL_HUGE_PAGE     (2ull << 20)
#define KVF_POOL_MIN_CHUNK_DEF (64ull << 10)
#define KVF_POOL_MAX_CHUNK_DEF (4ull << 20)

struct kvf_pool_entry {
    kvf_key_t key;
    uint64_t offset;
    uint64_t length;   /* bytes asked for */
    uint64_t checksum; /* set at commit */
    uint64_t deadline_ns;
    uint64_t seq;  /* commit order, for FIFO */
    uint32_t next; /* list links, entry indexes */
    uint32_t prev;
    uint32_t hits;     /* lookups, for LFU */
    uint32_t refcount; /* a reference = a transfer or an engine using it */
    uint8_t state;
    uint8_t pin;
    uint8_t cls;
    uint8_t list;   /* KVF_POOL_LIST_NONE or the list it is on */
    bool is_unread; /* hashed where it lies as it landed, not read since */
};

struct kvf_pool {
    int fd;
    void *base;
    size_t map_len;
    size_t fd_len;    /* bytes of the memfd: the chunk area, page rounded */
    uint64_t reserve; /* bytes after the chunk area, not allocated here */
    uint64_t reserve_offset; /* = fd_len: the reserve is not in the memfd */
    int reserve_fd;          /* the reserve's own memfd; -1: none */
    uint64_t capacity;
    bool is_hugetlb;
    bool is_sealed; /* F_SEAL_FUTURE_WRITE: no fd maps it writable again */
    bool prefault;
    char name[64];

    unsigned min_shift;
    unsigned nclasses;
    uint32_t units;
    uint32_t units_per_slab;
    uint32_t slabs;
    uint32_t *unit_next; /* free block lists, on a block's first unit */
    uint32_t *unit_prev;
    uint32_t *unit_entry; /* entry of an allocated block's first unit */
    uint32_t free_head[KVF_POOL_CLASSES_MAX];
    int8_t *slab_class; /* -1: free slab */
    uint32_t *slab_used;
    uint32_t *free_slabs;
    uint32_t free_slab_count;

    kvf_pool_entry_t *entries;
    uint32_t entry_free;
    uint32_t list_head[KVF_POOL_LISTS];
    uint32_t list_tail[KVF_POOL_LISTS];
    uint32_t *index; /* open addressing, linear probing, entry indexes */
    uint32_t index_mask;

    kvf_pool_policy_t policy;
    uint64_t high_bytes;
    uint64_t low_bytes;
    kvf_pool_evict_cb_t evict_cb;
    void *evict_arg;

    uint64_t used;
    uint64_t committed;
    uint64_t allocated;
    uint64_t evictions;
    uint64_t reclaimed;
    uint64_t alloc_fails;
    uint64_t pinned;        /* committed entries with references or a pin */
    uint64_t retired;       /* RETIRED entries */
    uint64_t retired_bytes; /* their blocks */
    uint64_t detached;      /* DETACHED entries */
    uint64_t seq;
};

static bool kvf_pool_is_pow2(uint64_t v)
{
    return (v != 0) && ((v & (v - 1)) == 0);
}

static unsigned kvf_pool_log2(uint64_t v)
{
    return 63u - (unsigned)__builtin_clzll(v);
}

/* @p pct percent of @p v, exact at 100 and without overflow */
static uint64_t kvf_pool_pct(uint64_t v, unsigned pct)
{
    return (v / 100) * pct + (v % 100) * pct / 100;
}

static bool kvf_pool_entry_is_pinned(const kvf_pool_entry_t *e)
{
    return (e->state == KVF_POOL_ENTRY_COMMITTED) &&
           ((e->refcount != 0) || (e->pin != KVF_POOL_PIN_NONE));
}

/* Keeps pool->pinned right across a change of @p e made between the two
 * calls: was = kvf_pool_entry_is_pinned(e) before it. */
static void kvf_pool_pinned_update(kvf_pool_t *pool, const kvf_pool_entry_t *e,
                                   bool was)
{
    bool is = kvf_pool_entry_is_pinned(e);

    if (is && !was) {
        pool->pinned++;
    } else if (!is && was) {
        pool->pinned--;
    }
}

static uint32_t kvf_pool_entry_idx(const kvf_pool_t *pool,
                                   const kvf_pool_entry_t *entry)
{
    return (uint32_t)(entry - pool->entries);
}

/* ---------------------------------------------------------------- lists */

static void kvf_pool_list_remove(kvf_pool_t *pool, kvf_pool_entry_t *e)
{
    unsigned l = e->list;

    if (l == KVF_POOL_LIST_NONE) {
        return;
    }
    if (e->prev != KVF_POOL_NIL) {
        pool->entries[e->prev].next = e->next;
    } else {
        pool->list_head[l] = e->next;
    }
    if (e->next != KVF_POOL_NIL) {
        pool->entries[e->next].prev = e->prev;
    } else {
        pool->list_tail[l] = e->prev;
    }
    e->next = KVF_POOL_NIL;
    e->prev = KVF_POOL_NIL;
    e->list = KVF_POOL_LIST_NONE;
}

/* Inserts after @p after (NIL: at the head). */
static void kvf_pool_list_insert(kvf_pool_t *pool, unsigned l,
                                 kvf_pool_entry_t *e, uint32_t after)
{
    uint32_t idx = kvf_pool_entry_idx(pool, e);

    e->list = (uint8_t)l;
    e->prev = after;
    if (after == KVF_POOL_NIL) {
        e->next            = pool->list_head[l];
        pool->list_head[l] = idx;
    } else {
        e->next                   = pool->entries[after].next;
        pool->entries[after].next = idx;
    }
    if (e->next != KVF_POOL_NIL) {
        pool->entries[e->next].prev = idx;
    } else {
        pool->list_tail[l] = idx;
    }
}

static unsigned kvf_pool_lfu_bucket(uint32_t hits)
{
    unsigned b = kvf_pool_log2((uint64_t)hits + 1);

    return (b < KVF_POOL_LFU_BUCKETS) ? b : KVF_POOL_LFU_BUCKETS - 1;
}

/*
 * An entry is an eviction candidate iff committed, unreferenced and not
 * hard-pinned; candidates sit on the list of their tier (soft pin or not)
 * and LFU bucket, so picking a victim is O(1).
 */
static void kvf_pool_relist(kvf_pool_t *pool, kvf_pool_entry_t *e)
{
    uint32_t after;
    unsigned l;

    if (e->state != KVF_POOL_ENTRY_COMMITTED) {
        return; /* uncommitted entries stay on the allocation list */
    }
    kvf_pool_list_remove(pool, e);
    if ((e->refcount != 0) || (e->pin == KVF_POOL_PIN_HARD)) {
        return;
    }
    l = ((e->pin == KVF_POOL_PIN_SOFT) ? KVF_POOL_LFU_BUCKETS : 0) +
        ((pool->policy == KVF_POOL_POLICY_LFU) ? kvf_pool_lfu_bucket(e->hits)
                                               : 0);
    after = pool->list_tail[l];
    if (pool->policy == KVF_POOL_POLICY_FIFO) {
        /* keep commit order: walk back from the newest (usually short) */
        while ((after != KVF_POOL_NIL) && (pool->entries[after].seq > e->seq)) {
            after = pool->entries[after].prev;
        }
    }
    kvf_pool_list_insert(pool, l, e, after);
}

/* --------------------------------------------------------------- blocks */

static void kvf_pool_block_push(kvf_pool_t *pool, unsigned cls, uint32_t u)
{
    pool->unit_prev[u] = KVF_POOL_NIL;
    pool->unit_next[u] = pool->free_head[cls];
    if (pool->free_head[cls] != KVF_POOL_NIL) {
        pool->unit_prev[pool->free_head[cls]] = u;
    }
    pool->free_head[cls] = u;
}

static void kvf_pool_block_unlink(kvf_pool_t *pool, unsigned cls, uint32_t u)
{
    if (pool->unit_prev[u] != KVF_POOL_NIL) {
        pool->unit_next[pool->unit_prev[u]] = pool->unit_next[u];
    } else {
        pool->free_head[cls] = pool->unit_next[u];
    }
    if (pool->unit_next[u] != KVF_POOL_NIL) {
        pool->unit_prev[pool->unit_next[u]] = pool->unit_prev[u];
    }
}

static bool kvf_pool_block_available(const kvf_pool_t *pool, unsigned cls)
{
    return (pool->free_head[cls] != KVF_POOL_NIL) ||
           (pool->free_slab_count != 0);
}

static uint32_t kvf_pool_block_alloc(kvf_pool_t *pool, unsigned cls)
{
    uint32_t blocks = pool->units_per_slab >> cls;
    uint32_t slab;
    uint32_t u;
    uint32_t b;

    if (pool->free_head[cls] == KVF_POOL_NIL) {
        if (pool->free_slab_count == 0) {
            return KVF_POOL_NIL;
        }
        slab                   = pool->free_slabs[--pool->free_slab_count];
        pool->slab_class[slab] = (int8_t)cls;
        pool->slab_used[slab]  = 0;
        for (b = blocks; b > 0; b--) {
            kvf_pool_block_push(pool, cls,
                                slab * pool->units_per_slab + ((b - 1) << cls));
        }
    }
    u = pool->free_head[cls];
    kvf_pool_block_unlink(pool, cls, u);
    pool->slab_used[u / pool->units_per_slab]++;
    pool->used += (uint64_t)1 << (cls + pool->min_shift);
    return u;
}

static void kvf_pool_block_free(kvf_pool_t *pool, unsigned cls, uint32_t u)
{
    uint32_t slab   = u / pool->units_per_slab;
    uint32_t blocks = pool->units_per_slab >> cls;
    uint32_t b;

    pool->unit_entry[u] = KVF_POOL_NIL;
    pool->used -= (uint64_t)1 << (cls + pool->min_shift);
    kvf_pool_block_push(pool, cls, u);
    if (--pool->slab_used[slab] != 0) {
        return;
    }
    /* whole slab free again: give it back so any class can use it */
    for (b = 0; b < blocks; b++) {
        kvf_pool_block_unlink(pool, cls,
                              slab * pool->units_per_slab + (b << cls));
    }
    pool->slab_class[slab]                    = -1;
    pool->free_slabs[pool->free_slab_count++] = slab;
}

/* ---------------------------------------------------------------- index */

static uint32_t kvf_pool_key_hash(const kvf_key_t *key)
{
    uint64_t h = key->lo ^ (key->hi * 0x9e3779b97f4a7c15ull) ^
                 (key->ns * 0xc2b2ae3d27d4eb4full);

    h ^= h >> 29;
    h *= 0xbf58476d1ce4e5b9ull;
    h ^= h >> 32;
    return (uint32_t)h;
}

static bool kvf_pool_key_eq(const kvf_key_t *a, const kvf_key_t *b)
{
    return (a->lo == b->lo) && (a->hi == b->hi) && (a->ns == b->ns);
}

static uint32_t kvf_pool_index_slot(const kvf_pool_t *pool,
                                    const kvf_key_t *key)
{
    uint32_t i = kvf_pool_key_hash(key) & pool->index_mask;

    while (pool->index[i] != KVF_POOL_NIL) {
        if (kvf_pool_key_eq(&pool->entries[pool->index[i]].key, key)) {
            return i;
        }
        i = (i + 1) & pool->index_mask;
    }
    return i; /* the empty slot ending the probe */
}

/* Backward-shift deletion keeps probes short without tombstones. */
static void kvf_pool_index_delete(kvf_pool_t *pool, uint32_t i)
{
    uint32_t j = i;
    uint32_t k;

    pool->index[i] = KVF_POOL_NIL;
    for (;;) {
        j = (j + 1) & pool->index_mask;
        if (pool->index[j] == KVF_POOL_NIL) {
            return;
        }
        k = kvf_pool_key_hash(&pool->entries[pool->index[j]].key) &
            pool->index_mask;
        /* leave j alone when its home k lies cyclically in (i, j] */
        if ((i <= j) ? ((i < k) && (k <= j)) : ((i < k) || (k <= j))) {
            continue;
        }
        pool->index[i] = pool->index[j];
        pool->index[j] = KVF_POOL_NIL;
        i              = j;
    }
}

/* -------------------------------------------------------------- entries */

static void kvf_pool_entry_release(kvf_pool_t *pool, kvf_pool_entry_t *e)
{
    if (kvf_pool_entry_is_pinned(e)) {
        pool->pinned--; /* soft pins can be evicted, pins removed */
    }
    kvf_pool_list_remove(pool, e);
    kvf_pool_block_free(pool, e->cls, (uint32_t)(e->offset >> pool->min_shift));
    e->state         = KVF_POOL_ENTRY_FREE;
    e->refcount      = 0;
    e->pin           = KVF_POOL_PIN_NONE;
    e->next          = pool->entry_free;
    pool->entry_free = kvf_pool_entry_idx(pool, e);
}

/* Evicts @p e for an allocation of class @p cls. Its block may be kept
 * (for a write-behind) only while the allocation has a block already and
 * at most a quarter of the pool is kept: a slow disk costs cache room,
 * never an allocation. */
static void kvf_pool_evict_one(kvf_pool_t *pool, kvf_pool_entry_t *e,
                               unsigned cls)
{
    uint64_t bsize = kvf_pool_entry_block_size(pool, e);
    bool was       = kvf_pool_entry_is_pinned(e); /* a soft pin */
    bool can_keep  = kvf_pool_block_available(pool, cls) &&
                    (pool->retired_bytes + bsize <= pool->capacity / 4);

    kvf_pool_index_delete(pool, kvf_pool_index_slot(pool, &e->key));
    pool->committed--;
    pool->evictions++;
    if ((pool->evict_cb != NULL) &&
        pool->evict_cb(&e->key, e->offset, e->length, can_keep,
                       pool->evict_arg) &&
        can_keep) {
        /* kept for its reader: off every list, in no index, still used */
        kvf_pool_list_remove(pool, e);
        e->state = KVF_POOL_ENTRY_RETIRED;
        e->pin   = KVF_POOL_PIN_NONE;
        kvf_pool_pinned_update(pool, e, was);
        pool->retired++;
        pool->retired_bytes += bsize;
        return;
    }
    kvf_pool_entry_release(pool, e);
}

static kvf_pool_entry_t *kvf_pool_victim(kvf_pool_t *pool)
{
    unsigned l;

    for (l = 0; l < KVF_POOL_LIST_ALLOC; l++) {
        if (pool->list_head[l] != KVF_POOL_NIL) {
            return &pool->entries[pool->list_head[l]];
        }
    }
    return NULL;
}

/* ----------------------------------------------------------- create */

/* Seals that hold for every pool: its size never changes (an engine
 * holding the fd cannot truncate it under the agent's mapping: SIGBUS),
 * and, unless @p writable_fd, no new writable mapping or write() through
 * any descriptor of it, while the mappings made here stay writable
 * (F_SEAL_FUTURE_WRITE, Linux 5.1): the fd handed to engines and same-host
 * peers is read-only whatever they reopen it as. */
static kvf_status_t kvf_pool_seal(kvf_pool_t *pool, bool writable_fd)
{
    int seals = F_SEAL_SHRINK | F_SEAL_GROW;

    if (!writable_fd) {
        seals |= F_SEAL_FUTURE_WRITE;
    }
    if (fcntl(pool->fd, F_ADD_SEALS, seals | F_SEAL_SEAL) != 0) {
        kvf_error("pool %s: cannot seal the memfd: %m", pool->name);
        return KVF_ERR_IO;
    }
    pool->is_sealed = !writable_fd;
    return KVF_OK;
}

/* The reserve (the PD receive region) in a memfd of its own, sealed
 * against resizing: whoever holds the pool's fd never sees it, and a
 * same-host agent given this one (agent/local.c) can write the region and
 * nothing else, but never truncate it under the decoder. */
static int kvf_pool_reserve_create(const kvf_pool_t *pool, uint64_t len,
                                   bool huge)
{
    int fd = memfd_create("kvf-pd-region", MFD_CLOEXEC | MFD_ALLOW_SEALING |
                                               (huge ? MFD_HUGETLB : 0));

    if (fd < 0) {
        return -1;
    }
    if ((ftruncate(fd, (off_t)len) != 0) ||
        (fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) !=
         0)) {
        kvf_debug("pool %s: reserve memfd: %m", pool->name);
        close(fd);
        return -1;
    }
    return fd;
}

/* The chunk area is the memfd, mapped at a @p page aligned address; the
 * reserve follows it in the mapping, from its own memfd. */
static kvf_status_t kvf_pool_map_try(kvf_pool_t *pool, bool huge)
{
    const uint64_t page = huge ? KVF_POOL_HUGE_PAGE : 4096u;
    const int populate  = pool->prefault ? MAP_POPULATE : 0;
    uint64_t fd_len     = (pool->capacity + page - 1) & ~(page - 1);
    uint64_t reserve    = pool->reserve;
    uint8_t *area, *base;
    size_t area_len;
    int rfd = -1;

    pool->fd = memfd_create(pool->name, MFD_CLOEXEC | MFD_ALLOW_SEALING |
                                            (huge ? MFD_HUGETLB : 0));
    if (pool->fd < 0) {
        return KVF_ERR_IO;
    }
    if (ftruncate(pool->fd, (off_t)fd_len) != 0) {
        goto err_close;
    }
    if (huge) {
        reserve = (reserve + page - 1) & ~(page - 1);
    }
    if (reserve > 0) {
        rfd = kvf_pool_reserve_create(pool, reserve, huge);
        if (rfd < 0) {
            goto err_close;
        }
    }
    area_len = fd_len + reserve + page;
    area     = mmap(NULL, area_len, PROT_NONE,
                    MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (area == MAP_FAILED) {
        goto err_close;
    }
    base = (uint8_t *)(((uintptr_t)area + page - 1) & ~(uintptr_t)(page - 1));
    if ((mmap(base, fd_len, PROT_READ | PROT_WRITE,
              MAP_SHARED | MAP_FIXED | populate, pool->fd, 0) != base) ||
        ((reserve > 0) &&
         (mmap(base + fd_len, reserve, PROT_READ | PROT_WRITE,
               MAP_SHARED | MAP_FIXED | populate, rfd, 0) != base + fd_len))) {
        munmap(area, area_len);
        goto err_close;
    }
    if (base > area) {
        munmap(area, (size_t)(base - area));
    }
    if (area + area_len > base + fd_len + reserve) {
        munmap(base + fd_len + reserve,
               (size_t)(area + area_len - (base + fd_len + reserve)));
    }
    pool->base           = base;
    pool->fd_len         = fd_len;
    pool->reserve_offset = fd_len;
    pool->reserve        = reserve;
    pool->reserve_fd     = rfd;
    pool->map_len        = fd_len + reserve;
    pool->is_hugetlb     = huge;
    return KVF_OK;

err_close:
    if (rfd >= 0) {
        close(rfd);
    }
    close(pool->fd);
    pool->fd         = -1;
    pool->reserve_fd = -1;
    return KVF_ERR_IO;
}

static kvf_status_t kvf_pool_map(kvf_pool_t *pool, bool try_huge,
                                 bool writable_fd)
{
    kvf_status_t status;

    if (try_huge && (kvf_pool_map_try(pool, true) == KVF_OK)) {
        return kvf_pool_seal(pool, writable_fd);
    }
    if (try_huge) {
        kvf_info("pool %s: no huge pages for %" PRIu64 " bytes (%m), "
                 "using 4 KiB pages",
                 pool->name, pool->capacity);
    }
    /* prefaulting allocates every page now instead of on the first write
     * of each chunk, which otherwise halves transfer rates into the pool */
    status = kvf_pool_map_try(pool, false);
    if (status != KVF_OK) {
        kvf_error("pool %s: cannot create and map %" PRIu64 " bytes: %m",
                  pool->name, pool->capacity + pool->reserve);
        return status;
    }
    return kvf_pool_seal(pool, writable_fd);
}

static kvf_status_t kvf_pool_tables_alloc(kvf_pool_t *pool)
{
    uint64_t index_size = 1;
    uint32_t i;

    while (index_size < 2ull * pool->units) {
        index_size <<= 1;
    }
    pool->unit_next  = calloc(pool->units, sizeof(uint32_t));
    pool->unit_prev  = calloc(pool->units, sizeof(uint32_t));
    pool->unit_entry = calloc(pool->units, sizeof(uint32_t));
    pool->slab_class = calloc(pool->slabs, sizeof(int8_t));
    pool->slab_used  = calloc(pool->slabs, sizeof(uint32_t));
    pool->free_slabs = calloc(pool->slabs, sizeof(uint32_t));
    pool->entries    = calloc(pool->units, sizeof(kvf_pool_entry_t));
    pool->index      = calloc(index_size, sizeof(uint32_t));
    if ((pool->unit_next == NULL) || (pool->unit_prev == NULL) ||
        (pool->unit_entry == NULL) || (pool->slab_class == NULL) ||
        (pool->slab_used == NULL) || (pool->free_slabs == NULL) ||
        (pool->entries == NULL) || (pool->index == NULL)) {
        return KVF_ERR_NO_MEMORY;
    }
    pool->index_mask = (uint32_t)(index_size - 1);
    memset(pool->index, 0xff, index_size * sizeof(uint32_t));
    memset(pool->unit_entry, 0xff, pool->units * sizeof(uint32_t));
    for (i = 0; i < KVF_POOL_CLASSES_MAX; i++) {
        pool->free_head[i] = KVF_POOL_NIL;
    }
    for (i = 0; i < KVF_POOL_LISTS; i++) {
        pool->list_head[i] = KVF_POOL_NIL;
        pool->list_tail[i] = KVF_POOL_NIL;
    }
    /* slab 0 handed out first */
    for (i = 0; i < pool->slabs; i++) {
        pool->slab_class[i] = -1;
        pool->free_slabs[i] = pool->slabs - 1 - i;
    }
    pool->free_slab_count = pool->slabs;
    for (i = 0; i < pool->units; i++) {
        pool->entries[i].next = (i + 1 < pool->units) ? i + 1 : KVF_POOL_NIL;
        pool->entries[i].prev = KVF_POOL_NIL;
        pool->entries[i].list = KVF_POOL_LIST_NONE;
    }
    pool->entry_free = 0;
    return KVF_OK;
}

static void kvf_pool_tables_free(kvf_pool_t *pool)
{
    free(pool->unit_next);
    free(pool->unit_prev);
    free(pool->unit_entry);
    free(pool->slab_class);
    free(pool->slab_used);
    free(pool->free_slabs);
    free(pool->entries);
    free(pool->index);
}

kvf_status_t kvf_pool_create(const kvf_pool_params_t *params,
                             kvf_pool_t **pool_p)
{
    uint64_t min_chunk = KVF_POOL_MIN_CHUNK_DEF;
    uint64_t max_chunk = KVF_POOL_MAX_CHUNK_DEF;
    unsigned high_pct  = 95;
    unsigned low_pct   = 85;
    kvf_pool_t *pool;
    kvf_status_t status;
    uint64_t mask;

    if ((params == NULL) || (pool_p == NULL) ||
        !(params->field_mask & KVF_POOL_FIELD_SIZE)) {
        return KVF_ERR_INVALID;
    }
    mask = params->field_mask;
    if (mask & KVF_POOL_FIELD_MIN_CHUNK) {
        min_chunk = params->min_chunk;
    }
    if (mask & KVF_POOL_FIELD_MAX_CHUNK) {
        max_chunk = params->max_chunk;
    }
    if (mask & KVF_POOL_FIELD_WATERMARKS) {
        high_pct = params->high_pct;
        low_pct  = params->low_pct;
    }
    if (!kvf_pool_is_pow2(min_chunk) || !kvf_pool_is_pow2(max_chunk) ||
        (min_chunk < 4096) || (max_chunk < min_chunk) ||
        (kvf_pool_log2(max_chunk / min_chunk) >= KVF_POOL_CLASSES_MAX) ||
        (params->size < max_chunk) ||
        (params->size / min_chunk >= KVF_POOL_NIL) || (low_pct == 0) ||
        (low_pct > high_pct) || (high_pct > 100) ||
        ((mask & KVF_POOL_FIELD_POLICY) &&
         (params->policy > KVF_POOL_POLICY_FIFO))) {
        kvf_error("pool: bad parameters (size %zu, chunks %" PRIu64 "..%" PRIu64
                  ", watermarks %u..%u)",
                  params->size, min_chunk, max_chunk, low_pct, high_pct);
        return KVF_ERR_INVALID;
    }

    pool = calloc(1, sizeof(*pool));
    if (pool == NULL) {
        return KVF_ERR_NO_MEMORY;
    }
    pool->fd         = -1;
    pool->reserve_fd = -1;
    snprintf(pool->name, sizeof(pool->name), "%s",
             ((mask & KVF_POOL_FIELD_NAME) && (params->name != NULL))
                 ? params->name
                 : "kvf-pool");
    pool->min_shift      = kvf_pool_log2(min_chunk);
    pool->nclasses       = kvf_pool_log2(max_chunk / min_chunk) + 1;
    pool->units_per_slab = (uint32_t)(max_chunk / min_chunk);
    pool->slabs          = (uint32_t)(params->size / max_chunk);
    pool->units          = pool->slabs * pool->units_per_slab;
    pool->capacity       = (uint64_t)pool->slabs * max_chunk;
    pool->policy =
        (mask & KVF_POOL_FIELD_POLICY) ? params->policy : KVF_POOL_POLICY_LRU;
    pool->high_bytes = kvf_pool_pct(pool->capacity, high_pct);
    pool->low_bytes  = kvf_pool_pct(pool->capacity, low_pct);
    if (mask & KVF_POOL_FIELD_EVICT_CB) {
        pool->evict_cb  = params->evict_cb;
        pool->evict_arg = params->evict_arg;
    }
    if (pool->capacity != params->size) {
        kvf_warn("pool %s: size %zu rounded down to %" PRIu64, pool->name,
                 params->size, pool->capacity);
    }

    status = kvf_pool_tables_alloc(pool);
    if (status != KVF_OK) {
        goto err_free_tables;
    }
    pool->prefault = (mask & KVF_POOL_FIELD_PREFAULT) != 0;
    pool->reserve  = (mask & KVF_POOL_FIELD_RESERVE)
                         ? (params->reserve + 4095) & ~(uint64_t)4095
                         : 0;
    status         = kvf_pool_map(pool, !(mask & KVF_POOL_FIELD_NO_HUGETLB),
                                  (mask & KVF_POOL_FIELD_UNSEALED) != 0);
    if (status != KVF_OK) {
        goto err_free_tables;
    }
    kvf_info("pool %s: %" PRIu64 " bytes, classes %" PRIu64 "..%" PRIu64
             ", %s pages",
             pool->name, pool->capacity, min_chunk, max_chunk,
             pool->is_hugetlb ? "huge" : "4 KiB");
    *pool_p = pool;
    return KVF_OK;

err_free_tables:
    kvf_pool_tables_free(pool);
    free(pool);
    return status;
}

void kvf_pool_destroy(kvf_pool_t *pool)
{
    kvf_pool_stats_t stats;

    if (pool == NULL) {
        return;
    }
    kvf_pool_stats(pool, &stats);
    if ((stats.pinned != 0) || (stats.allocated != 0) ||
        (stats.detached != 0)) {
        kvf_warn("pool %s: destroyed with %" PRIu64 " pinned entries, "
                 "%" PRIu64 " uncommitted allocations and %" PRIu64
                 " removed entries still referenced",
                 pool->name, stats.pinned, stats.allocated, stats.detached);
    }
    if ((pool->base != NULL) && (munmap(pool->base, pool->map_len) != 0)) {
        kvf_warn("pool %s: munmap failed: %m", pool->name);
    }
    close(pool->fd);
    if (pool->reserve_fd >= 0) {
        close(pool->reserve_fd);
    }
    kvf_pool_tables_free(pool);
    free(pool);
}

int kvf_pool_fd(const kvf_pool_t *pool)
{
    return pool->fd;
}

void *kvf_pool_base(const kvf_pool_t *pool)
{
    return pool->base;
}

size_t kvf_pool_capacity(const kvf_pool_t *pool)
{
    return pool->capacity;
}

uint64_t kvf_pool_reserve(const kvf_pool_t *pool, uint64_t *offset_p)
{
    *offset_p = pool->reserve_offset;
    return pool->reserve;
}

size_t kvf_pool_fd_length(const kvf_pool_t *pool)
{
    return pool->fd_len;
}

int kvf_pool_reserve_fd(const kvf_pool_t *pool)
{
    return pool->reserve_fd;
}

kvf_status_t kvf_pool_fd_readonly(const kvf_pool_t *pool, int *fd_p)
{
    char path[64];
    int fd;

    snprintf(path, sizeof(path), "/proc/self/fd/%d", pool->fd);
    fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        kvf_error("pool %s: cannot reopen %s read-only: %m", pool->name, path);
        return KVF_ERR_IO;
    }
    *fd_p = fd;
    return KVF_OK;
}

bool kvf_pool_is_sealed(const kvf_pool_t *pool)
{
    return pool->is_sealed;
}

size_t kvf_pool_map_length(const kvf_pool_t *pool)
{
    return pool->map_len;
}

bool kvf_pool_is_hugetlb(const kvf_pool_t *pool)
{
    return pool->is_hugetlb;
}

void kvf_pool_stats(const kvf_pool_t *pool, kvf_pool_stats_t *stats_p)
{
    stats_p->capacity      = pool->capacity;
    stats_p->used          = pool->used;
    stats_p->free          = pool->capacity - pool->used;
    stats_p->entries       = pool->committed;
    stats_p->allocated     = pool->allocated;
    stats_p->pinned        = pool->pinned;
    stats_p->evictions     = pool->evictions;
    stats_p->reclaimed     = pool->reclaimed;
    stats_p->alloc_fails   = pool->alloc_fails;
    stats_p->retired       = pool->retired;
    stats_p->retired_bytes = pool->retired_bytes;
    stats_p->detached      = pool->detached;
}

/* ----------------------------------------------------------- alloc path */

kvf_status_t kvf_pool_alloc(kvf_pool_t *pool, uint64_t length,
                            uint64_t deadline_ns, kvf_pool_entry_t **entry_p)
{
    kvf_pool_entry_t *victim;
    kvf_pool_entry_t *e;
    uint64_t bsize;
    unsigned cls;
    uint32_t u;

    if ((length == 0) || (entry_p == NULL)) {
        return KVF_ERR_INVALID;
    }
    if (length > ((uint64_t)pool->units_per_slab << pool->min_shift)) {
        return KVF_ERR_TOO_BIG;
    }
    cls   = (length <= (1ull << pool->min_shift))
                ? 0
                : kvf_pool_log2(length - 1) + 1 - pool->min_shift;
    bsize = 1ull << (cls + pool->min_shift);

    /* the watermarks count retired blocks as free (they are, once their
     * write lands); only an actual block is taken at once */
    if ((pool->used - pool->retired_bytes + bsize > pool->high_bytes) ||
        !kvf_pool_block_available(pool, cls)) {
        /* evict down to the low watermark, and until a block exists */
        while (!kvf_pool_block_available(pool, cls) ||
               (pool->used - pool->retired_bytes + bsize > pool->low_bytes)) {
            victim = kvf_pool_victim(pool);
            if (victim == NULL) {
                break;
            }
            kvf_pool_evict_one(pool, victim, cls);
        }
    }

    u = kvf_pool_block_alloc(pool, cls);
    if (u == KVF_POOL_NIL) {
        pool->alloc_fails++;
        kvf_debug("pool %s: no room for %" PRIu64 " bytes: all pinned or "
                  "uncommitted",
                  pool->name, length);
        return KVF_ERR_NO_MEMORY;
    }
    kvf_assert(pool->entry_free != KVF_POOL_NIL); /* units bound entries */
    e                = &pool->entries[pool->entry_free];
    pool->entry_free = e->next;
    memset(&e->key, 0, sizeof(e->key));
    e->offset           = (uint64_t)u << pool->min_shift;
    e->length           = length;
    e->checksum         = 0;
    e->deadline_ns      = deadline_ns;
    e->seq              = 0;
    e->hits             = 0;
    e->refcount         = 0;
    e->state            = KVF_POOL_ENTRY_ALLOCATED;
    e->pin              = KVF_POOL_PIN_NONE;
    e->cls              = (uint8_t)cls;
    e->next             = KVF_POOL_NIL;
    e->prev             = KVF_POOL_NIL;
    e->list             = KVF_POOL_LIST_NONE;
    e->is_unread        = false;
    pool->unit_entry[u] = kvf_pool_entry_idx(pool, e);
    kvf_pool_list_insert(pool, KVF_POOL_LIST_ALLOC, e,
                         pool->list_tail[KVF_POOL_LIST_ALLOC]);
    pool->allocated++;
    *entry_p = e;
    return KVF_OK;
}

kvf_status_t kvf_pool_commit(kvf_pool_t *pool, kvf_pool_entry_t *entry,
                             const kvf_key_t *key, uint64_t checksum)
{
    uint32_t slot;

    if ((entry == NULL) || (key == NULL)) {
        return KVF_ERR_INVALID;
    }
    if (entry->state != KVF_POOL_ENTRY_ALLOCATED) {
        return KVF_ERR_STATE;
    }
    slot = kvf_pool_index_slot(pool, key);
    if (pool->index[slot] != KVF_POOL_NIL) {
        return KVF_ERR_EXISTS;
    }
    kvf_pool_list_remove(pool, entry);
    entry->key        = *key;
    entry->checksum   = checksum;
    entry->state      = KVF_POOL_ENTRY_COMMITTED;
    entry->seq        = ++pool->seq;
    pool->index[slot] = kvf_pool_entry_idx(pool, entry);
    pool->allocated--;
    pool->committed++;
    kvf_pool_pinned_update(pool, entry, false); /* pins set before commit */
    kvf_pool_relist(pool, entry);
    return KVF_OK;
}

kvf_status_t kvf_pool_free(kvf_pool_t *pool, kvf_pool_entry_t *entry)
{
    if (entry == NULL) {
        return KVF_ERR_INVALID;
    }
    if (entry->state != KVF_POOL_ENTRY_ALLOCATED) {
        kvf_debug("pool %s: free of offset %" PRIu64 " in state %u refused",
                  pool->name, entry->offset, (unsigned)entry->state);
        return KVF_ERR_STATE;
    }
    if (entry->refcount != 0) {
        return KVF_ERR_BUSY;
    }
    pool->allocated--;
    kvf_pool_entry_release(pool, entry);
    return KVF_OK;
}

kvf_status_t kvf_pool_retired_free(kvf_pool_t *pool, kvf_pool_entry_t *entry)
{
    if ((entry == NULL) || (entry->state != KVF_POOL_ENTRY_RETIRED)) {
        return KVF_ERR_STATE;
    }
    pool->retired--;
    pool->retired_bytes -= kvf_pool_entry_block_size(pool, entry);
    kvf_pool_entry_release(pool, entry);
    return KVF_OK;
}

kvf_status_t kvf_pool_remove(kvf_pool_t *pool, const kvf_key_t *key)
{
    kvf_pool_entry_t *e;
    uint32_t slot;
    bool was;

    slot = kvf_pool_index_slot(pool, key);
    if (pool->index[slot] == KVF_POOL_NIL) {
        return KVF_ERR_NOT_FOUND;
    }
    e = &pool->entries[pool->index[slot]];
    kvf_pool_index_delete(pool, slot);
    pool->committed--;
    if (e->refcount == 0) {
        kvf_pool_entry_release(pool, e);
        return KVF_OK;
    }
    /* referenced: its holders keep reading the block until they put it
     * (kvf_pool_entry_put frees it then) */
    was = kvf_pool_entry_is_pinned(e);
    kvf_pool_list_remove(pool, e);
    e->state = KVF_POOL_ENTRY_DETACHED;
    e->pin   = KVF_POOL_PIN_NONE;
    kvf_pool_pinned_update(pool, e, was);
    pool->detached++;
    return KVF_OK;
}

unsigned kvf_pool_reclaim_expired(kvf_pool_t *pool, uint64_t now_ns)
{
    kvf_pool_entry_t *e;
    unsigned count = 0;
    uint32_t idx;
    uint32_t next;

    for (idx = pool->list_head[KVF_POOL_LIST_ALLOC]; idx != KVF_POOL_NIL;
         idx = next) {
        e    = &pool->entries[idx];
        next = e->next;
        /* a referenced allocation is being written (a fetch in flight) */
        if ((e->deadline_ns <= now_ns) && (e->refcount == 0)) {
            kvf_debug("pool %s: reclaiming uncommitted offset %" PRIu64,
                      pool->name, e->offset);
            pool->allocated--;
            pool->reclaimed++;
            kvf_pool_entry_release(pool, e);
            count++;
        }
    }
    return count;
}

kvf_pool_entry_t *kvf_pool_lookup(kvf_pool_t *pool, const kvf_key_t *key)
{
    kvf_pool_entry_t *e;
    uint32_t slot;

    slot = kvf_pool_index_slot(pool, key);
    if (pool->index[slot] == KVF_POOL_NIL) {
        return NULL;
    }
    e = &pool->entries[pool->index[slot]];
    if (e->hits != UINT32_MAX) {
        e->hits++;
    }
    if (pool->policy != KVF_POOL_POLICY_FIFO) {
        kvf_pool_relist(pool, e); /* most recent / new LFU bucket */
    }
    return e;
}

kvf_pool_entry_t *kvf_pool_entry_find(kvf_pool_t *pool, uint64_t offset)
{
    uint32_t idx;

    if ((offset >= pool->capacity) ||
        ((offset & ((1ull << pool->min_shift) - 1)) != 0)) {
        return NULL;
    }
    idx = pool->unit_entry[offset >> pool->min_shift];
    return (idx == KVF_POOL_NIL) ? NULL : &pool->entries[idx];
}

void kvf_pool_entry_hold(kvf_pool_t *pool, kvf_pool_entry_t *entry)
{
    bool was = kvf_pool_entry_is_pinned(entry);

    kvf_assert(entry->state != KVF_POOL_ENTRY_FREE);
    if (entry->refcount++ == 0) {
        kvf_pool_relist(pool, entry); /* off the eviction lists */
    }
    kvf_pool_pinned_update(pool, entry, was);
}

kvf_status_t kvf_pool_entry_put(kvf_pool_t *pool, kvf_pool_entry_t *entry)
{
    bool was;

    if ((entry->state == KVF_POOL_ENTRY_FREE) || (entry->refcount == 0)) {
        kvf_error("pool %s: put of offset %" PRIu64 " without a reference",
                  pool->name, entry->offset);
        return KVF_ERR_STATE;
    }
    if (entry->state == KVF_POOL_ENTRY_DETACHED) {
        if (--entry->refcount == 0) {
            pool->detached--;
            kvf_pool_entry_release(pool, entry); /* removed meanwhile */
        }
        return KVF_OK;
    }
    was = kvf_pool_entry_is_pinned(entry);
    if (--entry->refcount == 0) {
        kvf_pool_relist(pool, entry);
    }
    kvf_pool_pinned_update(pool, entry, was);
    return KVF_OK;
}

kvf_pool_pin_t kvf_pool_entry_pin_level(const kvf_pool_entry_t *entry)
{
    return (kvf_pool_pin_t)entry->pin;
}

void kvf_pool_entry_pin(kvf_pool_t *pool, kvf_pool_entry_t *entry,
                        kvf_pool_pin_t pin)
{
    bool was = kvf_pool_entry_is_pinned(entry);

    entry->pin = (uint8_t)pin;
    if (entry->state == KVF_POOL_ENTRY_COMMITTED) {
        kvf_pool_relist(pool, entry);
    }
    kvf_pool_pinned_update(pool, entry, was);
}

uint64_t kvf_pool_entry_offset(const kvf_pool_entry_t *entry)
{
    return entry->offset;
}

uint64_t kvf_pool_entry_length(const kvf_pool_entry_t *entry)
{
    return entry->length;
}

uint64_t kvf_pool_entry_block_size(const kvf_pool_t *pool,
                                   const kvf_pool_entry_t *entry)
{
    return 1ull << (entry->cls + pool->min_shift);
}

uint64_t kvf_pool_entry_checksum(const kvf_pool_entry_t *entry)
{
    return entry->checksum;
}

const kvf_key_t *kvf_pool_entry_key(const kvf_pool_entry_t *entry)
{
    return &entry->key;
}

kvf_pool_entry_state_t kvf_pool_entry_state(const kvf_pool_entry_t *entry)
{
    return (kvf_pool_entry_state_t)entry->state;
}

void kvf_pool_entry_set_unread(kvf_pool_entry_t *entry, bool is_unread)
{
    entry->is_unread = is_unread;
}

bool kvf_pool_entry_is_unread(const kvf_pool_entry_t *entry)
{
    return entry->is_unread;
}

unsigned kvf_pool_entry_refcount(const kvf_pool_entry_t *entry)
{
    return entry->refcount;
}

void kvf_pool_foreach_committed(kvf_pool_t *pool,
                                void (*cb)(const kvf_pool_entry_t *entry,
                                           void *arg),
                                void *arg)
{
    uint32_t i;

    for (i = 0; i < pool->units; i++) {
        if (pool->entries[i].state == KVF_POOL_ENTRY_COMMITTED) {
            cb(&pool->entries[i], arg);
        }
    }
}
