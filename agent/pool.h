/* SPDX-License-Identifier: Apache-2.0 */
/* Copyright (c) 2026 The kvfabric authors */
/*
 * The agent's shared-memory pool (DESIGN.md §3): one memfd region (huge
 * pages when the kernel has them), an O(1) size-class allocator, entries
 * with two-phase commit, refcounts and pins, a key index and eviction.
 *
 * Transport-free on purpose: the agent registers [base, base+capacity)
 * with UCX once (kvf_ucx_mem_register) and passes a read-only fd to
 * engines (kvf_pool_fd_readonly; the memfd is sealed against writable
 * mappings: only the pool's own mapping writes). Each engine's staging
 * area is a pool too (KVF_POOL_FIELD_UNSEALED, agent/engine_server.c).
 *
 * Offsets, never pointers, leave the agent: an engine maps the same fd,
 * and every offset it sends back is validated with kvf_pool_entry_find.
 *
 * Entry life: kvf_pool_alloc -> ALLOCATED (invisible, has a deadline) ->
 * kvf_pool_commit -> COMMITTED (in the index, evictable when unpinned) ->
 * evicted or kvf_pool_remove (a referenced one is DETACHED: out of the
 * index at once, its block freed by the last kvf_pool_entry_put).
 * ALLOCATED entries are given back with
 * kvf_pool_free or reclaimed by kvf_pool_reclaim_expired. An eviction the
 * evict_cb keeps leaves a RETIRED entry: its block is reused only after
 * kvf_pool_retired_free.
 *
 * Classes are powers of two from min_chunk to max_chunk; slabs of
 * max_chunk bytes are handed to a class on demand and return when all
 * their blocks are free, so a pool of small chunks can later hold big ones.
 *
 * thread: owning loop only (the agent's main loop); nothing here locks.
 * No call allocates memory or makes a system call after kvf_pool_create.
 */
#ifndef KVF_AGENT_POOL_H
#define KVF_AGENT_POOL_H

#include <kvfabric/keys.h>
#include <kvfabric/status.h>

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct kvf_pool kvf_pool_t;
typedef struct kvf_pool_entry kvf_pool_entry_t;

typedef enum {
    KVF_POOL_POLICY_LRU = 0,  /**< least recently used first (default) */
    KVF_POOL_POLICY_LFU = 1,  /**< least frequently used first (log2 buckets,
                                   LRU inside a bucket) */
    KVF_POOL_POLICY_FIFO = 2, /**< oldest commit first */
} kvf_pool_policy_t;

typedef enum {
    KVF_POOL_PIN_NONE = 0,
    KVF_POOL_PIN_SOFT = 1, /**< evicted only when nothing else can be */
    KVF_POOL_PIN_HARD = 2, /**< never evicted */
} kvf_pool_pin_t;

typedef enum {
    KVF_POOL_ENTRY_FREE      = 0,
    KVF_POOL_ENTRY_ALLOCATED = 1, /**< being written, invisible */
    KVF_POOL_ENTRY_COMMITTED = 2, /**< in the index */
    KVF_POOL_ENTRY_RETIRED   = 3, /**< evicted, its block kept for a reader
                                       (write-behind) until
                                       kvf_pool_retired_free */
    KVF_POOL_ENTRY_DETACHED = 4,  /**< removed while referenced: in no index
                                       and on no list, freed by the last
                                       kvf_pool_entry_put */
} kvf_pool_entry_state_t;

/**
 * Told about every evicted entry (the agent batches EVICTs to the
 * controller). Runs inside kvf_pool_alloc; must not call back into the pool.
 * When @p can_keep (the allocation that evicts has a block already, and
 * at most a quarter of the pool is kept), it
 * may return true to keep the block as it is (the entry becomes RETIRED:
 * out of the index, its bytes unchanged, counted as used but as free by
 * the watermarks) until the caller gives it back with
 * kvf_pool_retired_free: the disk tier writes it behind from there instead
 * of copying it (agent/store.c). Otherwise it must return false.
 */
typedef bool (*kvf_pool_evict_cb_t)(const kvf_key_t *key, uint64_t offset,
                                    uint64_t length, bool can_keep, void *arg);

typedef enum {
    KVF_POOL_FIELD_NAME       = 1u << 0,
    KVF_POOL_FIELD_SIZE       = 1u << 1,
    KVF_POOL_FIELD_MIN_CHUNK  = 1u << 2,
    KVF_POOL_FIELD_MAX_CHUNK  = 1u << 3,
    KVF_POOL_FIELD_POLICY     = 1u << 4,
    KVF_POOL_FIELD_WATERMARKS = 1u << 5,
    KVF_POOL_FIELD_EVICT_CB   = 1u << 6,
    KVF_POOL_FIELD_NO_HUGETLB = 1u << 7,
    KVF_POOL_FIELD_PREFAULT   = 1u << 8, /**< allocate every page at create */
    KVF_POOL_FIELD_RESERVE    = 1u << 9, /**< map extra bytes after the pool */
    /** do not seal the memfd against new writable mappings (kvf_pool_fd):
     *  an engine's staging area */
    KVF_POOL_FIELD_UNSEALED = 1u << 10,
} kvf_pool_field_t;

typedef struct kvf_pool_params {
    uint64_t field_mask;
    const char *name; /**< memfd name (default "kvf-pool") */
    size_t size;      /**< bytes, required; rounded down to max_chunk */
    size_t min_chunk; /**< smallest class, power of two (default 64 KiB) */
    size_t max_chunk; /**< largest class and slab size (default 4 MiB) */
    kvf_pool_policy_t policy;
    unsigned high_pct; /**< eviction starts above this % used (def. 95) */
    unsigned low_pct;  /**< and frees down to this % (default 85) */
    kvf_pool_evict_cb_t evict_cb;
    void *evict_arg;
    size_t reserve; /**< bytes mapped after the chunk area (rounded up to
                         4 KiB, or a huge page) that the pool never
                         allocates: the PD receive region lives there
                         (agent/pd.h). Anonymous shared memory, not in the
                         memfd: holders of the fd never see it */
} kvf_pool_params_t;

typedef struct kvf_pool_stats {
    uint64_t capacity;      /**< bytes usable for chunks */
    uint64_t used;          /**< bytes in allocated blocks (class sizes) */
    uint64_t free;          /**< capacity - used */
    uint64_t entries;       /**< committed entries */
    uint64_t allocated;     /**< uncommitted allocations */
    uint64_t pinned;        /**< committed entries with refs or a pin */
    uint64_t evictions;     /**< entries evicted since create */
    uint64_t reclaimed;     /**< expired allocations reclaimed */
    uint64_t alloc_fails;   /**< allocations refused for lack of room */
    uint64_t retired;       /**< evicted entries whose block is still kept */
    uint64_t retired_bytes; /**< their blocks' bytes (class sizes) */
    uint64_t detached;      /**< removed entries still referenced */
} kvf_pool_stats_t;

/**
 * Creates the memfd region and the allocator.
 *
 * @return KVF_OK; KVF_ERR_INVALID (size < max_chunk, classes not powers of
 *         two, watermarks not 0 < low <= high <= 100); KVF_ERR_IO
 *         (memfd_create/ftruncate/mmap, logged with %m); KVF_ERR_NO_MEMORY
 *
 * ownership: the caller destroys it; the fd stays the pool's (dup it to
 * pass it on).
 */
kvf_status_t kvf_pool_create(const kvf_pool_params_t *params,
                             kvf_pool_t **pool_p);

/** Unmaps and closes; warns about pinned entries. NULL is a no-op. */
void kvf_pool_destroy(kvf_pool_t *pool);

/**
 * The memfd of the chunk area, open read-write. ownership: the pool's.
 * Unless created with KVF_POOL_FIELD_WRITABLE_FD it is sealed
 * (F_SEAL_FUTURE_WRITE, F_SEAL_SHRINK, F_SEAL_GROW): only the mapping the
 * pool made itself is writable; nobody can map it writable again, write()
 * to it or resize it, through this fd or any other.
 */
int kvf_pool_fd(const kvf_pool_t *pool);

/**
 * A new read-only descriptor of the chunk area (the memfd reopened
 * O_RDONLY through /proc/self/fd): what engines and same-host peers get.
 * A MAP_SHARED PROT_WRITE mapping of it fails (EACCES), and with the
 * seals above so does one of any reopened descriptor (EPERM).
 *
 * @return KVF_OK; KVF_ERR_IO (logged with %m)
 *
 * ownership: the caller closes *fd_p. Not for per-chunk paths (a syscall).
 */
kvf_status_t kvf_pool_fd_readonly(const kvf_pool_t *pool, int *fd_p);

/** Bytes of the memfd (the chunk area rounded to whole pages). */
size_t kvf_pool_fd_length(const kvf_pool_t *pool);

/** true when the memfd carries F_SEAL_FUTURE_WRITE (see kvf_pool_fd). */
bool kvf_pool_is_sealed(const kvf_pool_t *pool);

/** Start of the mapping and usable bytes: what to register with UCX. */
void *kvf_pool_base(const kvf_pool_t *pool);
size_t kvf_pool_capacity(const kvf_pool_t *pool);

/**
 * The reserved area after the chunk area (KVF_POOL_FIELD_RESERVE), in the
 * same mapping but not in the pool's memfd (in one of its own): its offset
 * through @p offset_p, its length as the result (0: none).
 */
uint64_t kvf_pool_reserve(const kvf_pool_t *pool, uint64_t *offset_p);

/** The reserve's own memfd (read-write, sealed against resizing; owned by
 *  the pool), or -1 without a reserve. */
int kvf_pool_reserve_fd(const kvf_pool_t *pool);

/** Bytes of the whole mapping (chunk area, reserve, huge-page rounding). */
size_t kvf_pool_map_length(const kvf_pool_t *pool);

/** true when the region got huge pages (MFD_HUGETLB). */
bool kvf_pool_is_hugetlb(const kvf_pool_t *pool);

/** Usage counters (for /metrics); O(1). */
void kvf_pool_stats(const kvf_pool_t *pool, kvf_pool_stats_t *stats_p);

/**
 * Allocates a block for @p length bytes, evicting (by policy, soft pins
 * last) when the pool is above its high watermark or has no block.
 *
 * @param [in] deadline_ns  monotonic time after which an uncommitted
 *                          allocation may be reclaimed
 * @return KVF_OK; KVF_ERR_INVALID (0 length); KVF_ERR_TOO_BIG (> max
 *         chunk); KVF_ERR_NO_MEMORY at once when nothing can be evicted
 *         (everything pinned, referenced or uncommitted): no waiting
 *
 * ownership: the entry belongs to the pool; the caller commits or frees it.
 */
kvf_status_t kvf_pool_alloc(kvf_pool_t *pool, uint64_t length,
                            uint64_t deadline_ns, kvf_pool_entry_t **entry_p);

/**
 * Makes an ALLOCATED entry visible under @p key.
 *
 * @return KVF_OK; KVF_ERR_STATE (not ALLOCATED: committed twice, freed,
 *         reclaimed); KVF_ERR_EXISTS (key already committed: free yours)
 */
kvf_status_t kvf_pool_commit(kvf_pool_t *pool, kvf_pool_entry_t *entry,
                             const kvf_key_t *key, uint64_t checksum);

/**
 * Gives an uncommitted allocation back.
 *
 * @return KVF_OK; KVF_ERR_STATE (not ALLOCATED: double free, or committed);
 *         KVF_ERR_BUSY (referenced: a transfer is writing it)
 */
kvf_status_t kvf_pool_free(kvf_pool_t *pool, kvf_pool_entry_t *entry);

/**
 * Gives back the block of a RETIRED entry (its evict_cb kept it).
 *
 * @return KVF_OK; KVF_ERR_STATE (not RETIRED)
 */
kvf_status_t kvf_pool_retired_free(kvf_pool_t *pool, kvf_pool_entry_t *entry);

/**
 * Removes a committed entry (found damaged): it leaves the index at once,
 * so the key is a miss and can be committed again; its block is freed now,
 * or, while an engine or a transfer references it, by the last
 * kvf_pool_entry_put (DETACHED meanwhile). Pins do not stop a removal.
 *
 * @return KVF_OK; KVF_ERR_NOT_FOUND
 */
kvf_status_t kvf_pool_remove(kvf_pool_t *pool, const kvf_key_t *key);

/**
 * Reclaims ALLOCATED entries whose deadline is <= @p now_ns (a client
 * crashed or timed out before commit) and hold no reference (a fetch
 * writing into one holds it until done). Call it from a periodic timer.
 *
 * @return the number reclaimed
 */
unsigned kvf_pool_reclaim_expired(kvf_pool_t *pool, uint64_t now_ns);

/**
 * Finds a committed entry and counts the access for LRU/LFU.
 *
 * @return the entry (borrowed: hold it to keep it past the next
 *         kvf_pool_alloc) or NULL
 */
kvf_pool_entry_t *kvf_pool_lookup(kvf_pool_t *pool, const kvf_key_t *key);

/**
 * The entry whose block starts at @p offset, in any live state; validates
 * offsets sent by engines and peers.
 *
 * @return the entry, or NULL for an offset that is not a block start
 */
kvf_pool_entry_t *kvf_pool_entry_find(kvf_pool_t *pool, uint64_t offset);

/**
 * Takes a reference: the entry is not evicted, freed or reclaimed while
 * one is held. Each hold needs one kvf_pool_entry_put.
 */
void kvf_pool_entry_hold(kvf_pool_t *pool, kvf_pool_entry_t *entry);

/**
 * Drops a reference.
 *
 * @return KVF_OK; KVF_ERR_STATE when there was none (refused, not UB)
 */
kvf_status_t kvf_pool_entry_put(kvf_pool_t *pool, kvf_pool_entry_t *entry);

/** Returns the pin level of an entry. */
kvf_pool_pin_t kvf_pool_entry_pin_level(const kvf_pool_entry_t *entry);

/**
 * Sets the pin level of an entry (any live state; kept through commit).
 * Hard pins never leave by eviction; kvf_pool_remove still removes them.
 */
void kvf_pool_entry_pin(kvf_pool_t *pool, kvf_pool_entry_t *entry,
                        kvf_pool_pin_t pin);

/**
 * Entry accessors: block offset in the region (what travels to engines and
 * peers), requested length, checksum and key (set at commit), state and
 * references. The key pointer is borrowed from the entry.
 */
uint64_t kvf_pool_entry_offset(const kvf_pool_entry_t *entry);
uint64_t kvf_pool_entry_length(const kvf_pool_entry_t *entry);
/** Bytes of the block holding the entry (its size class). */
uint64_t kvf_pool_entry_block_size(const kvf_pool_t *pool,
                                   const kvf_pool_entry_t *entry);
uint64_t kvf_pool_entry_checksum(const kvf_pool_entry_t *entry);
const kvf_key_t *kvf_pool_entry_key(const kvf_pool_entry_t *entry);
kvf_pool_entry_state_t kvf_pool_entry_state(const kvf_pool_entry_t *entry);
unsigned kvf_pool_entry_refcount(const kvf_pool_entry_t *entry);

/**
 * The store's mark on a committed entry whose bytes the agent hashed where
 * they lie as they landed (from a peer, a same-host copy, the disk) and
 * that no engine has read since: its first reader need not hash them
 * again. Cleared by kvf_pool_alloc.
 */
void kvf_pool_entry_set_unread(kvf_pool_entry_t *entry, bool is_unread);
bool kvf_pool_entry_is_unread(const kvf_pool_entry_t *entry);

/** Address of @p offset inside the mapping (for the agent's own copies). */
/**
 * Calls @p cb for every committed entry (an inventory for the controller).
 * The callback must not allocate, commit, free or evict.
 *
 * thread: owning loop only.
 */
void kvf_pool_foreach_committed(kvf_pool_t *pool,
                                void (*cb)(const kvf_pool_entry_t *entry,
                                           void *arg),
                                void *arg);

static inline void *kvf_pool_ptr(const kvf_pool_t *pool, uint64_t offset)
{
    return (char *)kvf_pool_base(pool) + offset;
}

#endif /* KVF_AGENT_POOL_H */
