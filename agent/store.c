/* SPDX-License-Identifier: Apache-2.0 */
/* Copyright (c) 2026 The kvfabric authors */
#include "agent/store.h"

#include "agent/keyhash.h"

#include "common/chunk.h"
#include "common/log.h"
#include "common/time.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/queue.h>

/* What an owner holds at one offset: a grant (uncommitted allocation) or
 * pins on a committed chunk (a pin stands for one read the owner has not
 * released yet). */
typedef struct kvf_store_hold {
    uint64_t offset; /* UINT64_MAX: empty slot */
    kvf_pool_entry_t *entry;
    uint64_t deadline_ns; /* grant: reclaimed when not committed by then */
    uint32_t pins;
    bool is_grant;
} kvf_store_hold_t;

typedef struct kvf_store_promotion kvf_store_promotion_t;

typedef struct kvf_store_promo_read kvf_store_promo_read_t;

/* One key of a promotion: a disk read into a held pool block (entry), a
 * wait for the read another promotion has in flight for the same key
 * (leader: a retrieve after a prefetching lookup), or a chunk of the
 * request already in the pool (hit), held so that the promotion's own
 * allocations cannot evict it before the reader pins it. */
struct kvf_store_promo_read {
    kvf_store_promotion_t *promotion;
    kvf_pool_entry_t *entry;
    kvf_pool_entry_t *hit;
    kvf_key_t key;                              /* entry: the key being read */
    STAILQ_ENTRY(kvf_store_promo_read) waiting; /* entry: store->waiting */
    kvf_store_promo_read_t *followers;          /* entry: who waits for it */
    kvf_store_promo_read_t *next_follower;      /* a wait: in its leader's */
};

KHASH_INIT(kvf_store_reads, kvf_key_t, kvf_store_promo_read_t *, 1,
           kvf_key_khash, kvf_key_kheq)

/* One kvf_store_promote call: its reads and who waits for them. */
struct kvf_store_promotion {
    kvf_store_promotion_t *next;
    kvf_store_t *store;
    kvf_store_promote_cb_t cb; /* NULL: nobody waits (any more) */
    void *arg;
    uint32_t pending, promoted, failed;
    uint32_t num;
    kvf_store_promo_read_t reads[];
};

/* Open addressing by offset, linear probing, backward-shift deletion. */
struct kvf_store_owner {
    kvf_store_hold_t *holds;
    uint32_t mask;
    uint32_t count;
    uint32_t grants;
    kvf_store_owner_t *prev, *next; /* store->owner_list */
};

struct kvf_store {
    kvf_pool_t *pool;
    kvf_copier_t *copier; /* NULL: copies on the loop alone */
    kvf_store_key_cb_t admit_cb;
    kvf_store_key_cb_t evict_cb;
    kvf_store_key_cb_t demote_cb; /* NULL: evict_cb */
    void *cb_arg;
    uint64_t max_chunk;
    uint64_t grant_timeout_ns; /* 0: grants live as long as their owner */
    kvf_store_owner_t *owner_list;
    uint64_t commits, duplicates, hits, misses, checksum_failures;
    uint64_t expired_grants;
    uint64_t owners;
    kvf_disk_t *disk; /* borrowed; NULL: no disk tier */
    kvf_store_promotion_t *promotions;
    /* disk reads in flight or waiting, by key: a second promotion of the
     * same key waits for the first */
    khash_t(kvf_store_reads) reading;
    /* reads past what the tier takes at once (4 x queue_depth), in order */
    STAILQ_HEAD(, kvf_store_promo_read) waiting;
    bool is_starting_waiting; /* kvf_store_start_waiting runs */
    uint64_t spilled, promoted, promote_failures, promote_waits;
};

#define KVF_STORE_EMPTY UINT64_MAX

static uint32_t kvf_store_hash(uint64_t offset)
{
    offset ^= offset >> 33;
    offset *= 0xff51afd7ed558ccdull;
    offset ^= offset >> 33;
    return (uint32_t)offset;
}

static kvf_status_t kvf_store_owner_init_table(kvf_store_owner_t *owner,
                                               uint32_t size)
{
    uint32_t i;

    owner->holds = malloc(size * sizeof(*owner->holds));
    if (owner->holds == NULL) {
        return KVF_ERR_NO_MEMORY;
    }
    for (i = 0; i < size; i++) {
        owner->holds[i].offset = KVF_STORE_EMPTY;
    }
    owner->mask  = size - 1;
    owner->count = 0;
    return KVF_OK;
}

static kvf_store_hold_t *kvf_store_hold_find(kvf_store_owner_t *owner,
                                             uint64_t offset)
{
    uint32_t i = kvf_store_hash(offset) & owner->mask;

    while (owner->holds[i].offset != KVF_STORE_EMPTY) {
        if (owner->holds[i].offset == offset) {
            return &owner->holds[i];
        }
        i = (i + 1) & owner->mask;
    }
    return NULL;
}

static kvf_status_t kvf_store_hold_insert(kvf_store_owner_t *owner,
                                          const kvf_store_hold_t *hold);

static kvf_status_t kvf_store_owner_grow(kvf_store_owner_t *owner)
{
    kvf_store_owner_t bigger;
    uint32_t i;

    if (kvf_store_owner_init_table(&bigger, (owner->mask + 1) * 2) != KVF_OK) {
        return KVF_ERR_NO_MEMORY;
    }
    for (i = 0; i <= owner->mask; i++) {
        if (owner->holds[i].offset != KVF_STORE_EMPTY) {
            kvf_store_hold_insert(&bigger, &owner->holds[i]);
        }
    }
    /* only the table moves: the owner's other fields (its place in the
     * store's owner list, its grant count) stay as they are */
    free(owner->holds);
    owner->holds = bigger.holds;
    owner->mask  = bigger.mask;
    owner->count = bigger.count;
    return KVF_OK;
}

static kvf_status_t kvf_store_hold_insert(kvf_store_owner_t *owner,
                                          const kvf_store_hold_t *hold)
{
    uint32_t i;

    if ((owner->count + 1) * 2 > owner->mask + 1) {
        if (kvf_store_owner_grow(owner) != KVF_OK) {
            return KVF_ERR_NO_MEMORY;
        }
    }
    i = kvf_store_hash(hold->offset) & owner->mask;
    while (owner->holds[i].offset != KVF_STORE_EMPTY) {
        i = (i + 1) & owner->mask;
    }
    owner->holds[i] = *hold;
    owner->count++;
    return KVF_OK;
}

static void kvf_store_hold_delete(kvf_store_owner_t *owner,
                                  kvf_store_hold_t *hold)
{
    uint32_t i = (uint32_t)(hold - owner->holds), j = i, home;

    owner->holds[i].offset = KVF_STORE_EMPTY;
    owner->count--;
    /* shift later members of the probe run back over the hole */
    for (;;) {
        j = (j + 1) & owner->mask;
        if (owner->holds[j].offset == KVF_STORE_EMPTY) {
            return;
        }
        home = kvf_store_hash(owner->holds[j].offset) & owner->mask;
        if (((j > i) && ((home <= i) || (home > j))) ||
            ((j < i) && ((home <= i) && (home > j)))) {
            owner->holds[i]        = owner->holds[j];
            owner->holds[j].offset = KVF_STORE_EMPTY;
            i                      = j;
        }
    }
}

kvf_status_t kvf_store_owner_create(kvf_store_t *store,
                                    kvf_store_owner_t **owner_p)
{
    kvf_store_owner_t *owner = calloc(1, sizeof(*owner));

    if ((owner == NULL) || (kvf_store_owner_init_table(owner, 16) != KVF_OK)) {
        free(owner);
        return KVF_ERR_NO_MEMORY;
    }
    store->owners++;
    owner->next = store->owner_list;
    if (store->owner_list != NULL) {
        store->owner_list->prev = owner;
    }
    store->owner_list = owner;
    *owner_p          = owner;
    return KVF_OK;
}

void kvf_store_owner_destroy(kvf_store_t *store, kvf_store_owner_t *owner)
{
    kvf_store_hold_t *h;
    uint32_t i, p;

    if (owner == NULL) {
        return;
    }
    for (i = 0; i <= owner->mask; i++) {
        h = &owner->holds[i];
        if (h->offset == KVF_STORE_EMPTY) {
            continue;
        }
        if (h->is_grant) {
            kvf_pool_free(store->pool, h->entry);
        } else {
            for (p = 0; p < h->pins; p++) {
                kvf_pool_entry_put(store->pool, h->entry);
            }
        }
    }
    if (owner->prev != NULL) {
        owner->prev->next = owner->next;
    } else {
        store->owner_list = owner->next;
    }
    if (owner->next != NULL) {
        owner->next->prev = owner->prev;
    }
    free(owner->holds);
    free(owner);
    store->owners--;
}

kvf_status_t kvf_store_alloc(kvf_store_t *store, kvf_store_owner_t *owner,
                             uint64_t bytes, kvf_slot_t *slot_p)
{
    kvf_store_hold_t hold = {0};
    kvf_pool_entry_t *entry;
    kvf_status_t status;

    if ((bytes == 0) || (bytes > store->max_chunk)) {
        return KVF_ERR_TOO_BIG;
    }
    /* grants live as long as their owner; the store does not expire them */
    status = kvf_pool_alloc(store->pool, bytes, UINT64_MAX, &entry);
    if (status != KVF_OK) {
        return status;
    }
    hold.offset      = kvf_pool_entry_offset(entry);
    hold.entry       = entry;
    hold.is_grant    = true;
    hold.deadline_ns = (store->grant_timeout_ns == 0)
                           ? UINT64_MAX
                           : kvf_time_deadline_ns(store->grant_timeout_ns);
    if (kvf_store_hold_insert(owner, &hold) != KVF_OK) {
        kvf_pool_free(store->pool, entry);
        return KVF_ERR_NO_MEMORY;
    }
    owner->grants++;
    slot_p->offset = hold.offset;
    slot_p->length = bytes;
    return KVF_OK;
}

/* Commits the grant @p hold, whose bytes hash to @p actual (computed over
 * the block, or by the caller as they landed: one pass, not two); a chunk
 * that @p landed from elsewhere is marked unread (its first retrieve does
 * not hash it again). */
static kvf_status_t
kvf_store_commit_hold(kvf_store_t *store, kvf_store_owner_t *owner,
                      kvf_store_hold_t *hold, const kvf_key_t *key,
                      uint64_t checksum, uint64_t actual, bool landed)
{
    kvf_pool_entry_t *entry = hold->entry;

    /* an engine's batch of commits (each a copy or a hash) keeps the loop
     * busy: the tier's queue goes on between them */
    kvf_disk_poll(store->disk);
    kvf_store_hold_delete(owner, hold);
    owner->grants--;
    if (actual != checksum) {
        store->checksum_failures++;
        kvf_pool_free(store->pool, entry);
        return KVF_ERR_CHECKSUM;
    }
    if (kvf_pool_lookup(store->pool, key) != NULL) {
        store->duplicates++;
        kvf_pool_free(store->pool, entry);
        return KVF_ERR_EXISTS;
    }
    if (kvf_pool_commit(store->pool, entry, key, checksum) != KVF_OK) {
        kvf_pool_free(store->pool, entry);
        return KVF_ERR_STATE;
    }
    kvf_pool_entry_set_unread(entry, landed);
    store->commits++;
    if (store->admit_cb != NULL) {
        store->admit_cb(store->cb_arg, key);
    }
    return KVF_OK;
}

/* The grant of @p owner at @p offset, or NULL. */
static kvf_store_hold_t *kvf_store_grant_find(kvf_store_owner_t *owner,
                                              uint64_t offset)
{
    kvf_store_hold_t *hold = kvf_store_hold_find(owner, offset);

    return ((hold != NULL) && hold->is_grant) ? hold : NULL;
}

/* kvf_store_commit(_landed): the grant hashed where it lies. */
static kvf_status_t kvf_store_commit_in_place(kvf_store_t *store,
                                              kvf_store_owner_t *owner,
                                              const kvf_key_t *key,
                                              uint64_t offset,
                                              uint64_t checksum, bool landed)
{
    kvf_store_hold_t *hold = kvf_store_grant_find(owner, offset);

    if (hold == NULL) {
        return KVF_ERR_RANGE;
    }
    return kvf_store_commit_hold(
        store, owner, hold, key, checksum,
        kvf_chunk_checksum(kvf_pool_ptr(store->pool, offset),
                           kvf_pool_entry_length(hold->entry)),
        landed);
}

kvf_status_t kvf_store_commit(kvf_store_t *store, kvf_store_owner_t *owner,
                              const kvf_key_t *key, uint64_t offset,
                              uint64_t checksum)
{
    return kvf_store_commit_in_place(store, owner, key, offset, checksum,
                                     false);
}

kvf_status_t kvf_store_commit_landed(kvf_store_t *store,
                                     kvf_store_owner_t *owner,
                                     const kvf_key_t *key, uint64_t offset,
                                     uint64_t checksum)
{
    return kvf_store_commit_in_place(store, owner, key, offset, checksum, true);
}

kvf_status_t kvf_store_commit_hashed(kvf_store_t *store,
                                     kvf_store_owner_t *owner,
                                     const kvf_key_t *key, uint64_t offset,
                                     uint64_t checksum, uint64_t actual,
                                     bool landed)
{
    kvf_store_hold_t *hold = kvf_store_grant_find(owner, offset);

    if (hold == NULL) {
        return KVF_ERR_RANGE;
    }
    return kvf_store_commit_hold(store, owner, hold, key, checksum, actual,
                                 landed);
}

uint8_t *kvf_store_grant_ptr(kvf_store_t *store, kvf_store_owner_t *owner,
                             uint64_t offset, uint64_t *len_p)
{
    kvf_store_hold_t *hold = kvf_store_grant_find(owner, offset);

    if (hold == NULL) {
        return NULL;
    }
    *len_p = kvf_pool_entry_length(hold->entry);
    return kvf_pool_ptr(store->pool, offset);
}

kvf_status_t kvf_store_pin(kvf_store_t *store, kvf_store_owner_t *owner,
                           const kvf_key_t *key, kvf_slot_t *slot_p)
{
    kvf_pool_entry_t *entry = kvf_pool_lookup(store->pool, key);
    kvf_store_hold_t hold   = {0}, *held;
    uint64_t offset;

    if (entry == NULL) {
        store->misses++;
        return KVF_ERR_NOT_FOUND;
    }
    offset = kvf_pool_entry_offset(entry);
    held   = kvf_store_hold_find(owner, offset);
    if (held != NULL) {
        held->pins++;
    } else {
        hold.offset = offset;
        hold.entry  = entry;
        hold.pins   = 1;
        if (kvf_store_hold_insert(owner, &hold) != KVF_OK) {
            return KVF_ERR_NO_MEMORY;
        }
    }
    kvf_pool_entry_hold(store->pool, entry);
    store->hits++;
    slot_p->offset = offset;
    slot_p->length = kvf_pool_entry_length(entry);
    return KVF_OK;
}

/* A chunk failed its checksum after commit: counted, announced evicted
 * (no peer is sent here for it again) and out of the index at once, so
 * it is a miss and the next commit of its key stores fresh bytes; its
 * block goes now, or with the last engine pin or peer send that still
 * references it (kvf_pool_remove). */
static void kvf_store_drop_damaged(kvf_store_t *store, const kvf_key_t *key,
                                   uint64_t offset)
{
    store->checksum_failures++;
    kvf_warn("store: chunk at offset %" PRIu64 " changed since its commit; "
             "dropped",
             offset);
    if ((kvf_pool_remove(store->pool, key) == KVF_OK) &&
        (store->evict_cb != NULL)) {
        store->evict_cb(store->cb_arg, key);
    }
}

kvf_status_t kvf_store_verify(kvf_store_t *store, const kvf_key_t *key)
{
    kvf_pool_entry_t *entry = kvf_pool_lookup(store->pool, key);
    uint64_t offset;

    if (entry == NULL) {
        return KVF_OK; /* gone, or dropped already */
    }
    offset = kvf_pool_entry_offset(entry);
    if (kvf_chunk_checksum(kvf_pool_ptr(store->pool, offset),
                           kvf_pool_entry_length(entry)) ==
        kvf_pool_entry_checksum(entry)) {
        return KVF_OK;
    }
    kvf_store_drop_damaged(store, key, offset);
    return KVF_ERR_CHECKSUM;
}

/* Pins @p key; its slot and committed checksum. @p hash_p: are its bytes
 * to be hashed (false for the first read of a chunk that landed unread,
 * which this read takes)? */
static kvf_status_t kvf_store_pin_sum(kvf_store_t *store,
                                      kvf_store_owner_t *owner,
                                      const kvf_key_t *key, kvf_slot_t *slot_p,
                                      uint64_t *checksum_p, bool *hash_p)
{
    kvf_pool_entry_t *entry;
    kvf_status_t status;

    status = kvf_store_pin(store, owner, key, slot_p);
    if (status != KVF_OK) {
        return status;
    }
    entry = kvf_pool_entry_find(store->pool, slot_p->offset);
    if (entry == NULL) {
        kvf_store_release(store, owner, slot_p->offset);
        return KVF_ERR_NOT_FOUND;
    }
    *checksum_p = kvf_pool_entry_checksum(entry);
    *hash_p     = !kvf_pool_entry_is_unread(entry);
    kvf_pool_entry_set_unread(entry, false);
    return KVF_OK;
}

kvf_status_t kvf_store_pin_checked(kvf_store_t *store, kvf_store_owner_t *owner,
                                   const kvf_key_t *keys, uint32_t n,
                                   kvf_slot_t *slots, uint64_t *sums,
                                   kvf_status_t *results)
{
    kvf_copy_job_t *jobs = calloc((size_t)n + 1, sizeof(*jobs));
    bool hash;
    uint32_t i;

    if (jobs == NULL) {
        return KVF_ERR_NO_MEMORY;
    }
    /* job i hashes key i where it lies; an empty job checks nothing */
    for (i = 0; i < n; i++) {
        results[i] = kvf_store_pin_sum(store, owner, &keys[i], &slots[i],
                                       &sums[i], &hash);
        if ((results[i] == KVF_OK) && hash) {
            jobs[i].src = kvf_pool_ptr(store->pool, slots[i].offset);
            jobs[i].len = slots[i].length;
        }
    }
    kvf_store_copy(store, jobs, n);
    for (i = 0; i < n; i++) {
        if ((jobs[i].len != 0) && (jobs[i].sum != sums[i])) {
            results[i] = KVF_ERR_CHECKSUM;
            kvf_store_release(store, owner, slots[i].offset);
        }
    }
    /* dropped now, or with the last engine or send that holds it (a
     * later retrieve finds it missing meanwhile); counted once, however
     * often it was asked */
    for (i = 0; i < n; i++) {
        if ((results[i] == KVF_ERR_CHECKSUM) &&
            (kvf_pool_lookup(store->pool, &keys[i]) != NULL)) {
            kvf_store_drop_damaged(store, &keys[i], slots[i].offset);
        }
    }
    free(jobs);
    return KVF_OK;
}

kvf_status_t kvf_store_release(kvf_store_t *store, kvf_store_owner_t *owner,
                               uint64_t offset)
{
    kvf_store_hold_t *hold = kvf_store_hold_find(owner, offset);
    kvf_pool_entry_t *entry;

    if (hold == NULL) {
        return KVF_ERR_RANGE;
    }
    if (hold->is_grant) {
        kvf_pool_free(store->pool, hold->entry); /* never committed */
        kvf_store_hold_delete(owner, hold);
        owner->grants--;
        return KVF_OK;
    }
    entry = hold->entry;
    if (--hold->pins == 0) {
        kvf_store_hold_delete(owner, hold);
    }
    kvf_store_put_chunk(store, entry);
    return KVF_OK;
}

kvf_status_t kvf_store_hold_chunk(kvf_store_t *store, const kvf_key_t *key,
                                  kvf_pool_entry_t **entry_p)
{
    kvf_pool_entry_t *entry = kvf_pool_lookup(store->pool, key);

    if (entry == NULL) {
        return KVF_ERR_NOT_FOUND;
    }
    kvf_pool_entry_hold(store->pool, entry);
    *entry_p = entry;
    return KVF_OK;
}

/* A chunk found damaged meanwhile goes with its last reference
 * (kvf_pool_remove detached it). */
void kvf_store_put_chunk(kvf_store_t *store, kvf_pool_entry_t *entry)
{
    kvf_pool_entry_put(store->pool, entry);
}

uint32_t kvf_store_local_prefix(kvf_store_t *store, const kvf_key_t *keys,
                                uint32_t num)
{
    uint32_t i;

    for (i = 0; i < num; i++) {
        if (kvf_pool_lookup(store->pool, &keys[i]) == NULL) {
            break;
        }
    }
    return i;
}

void kvf_store_set_disk(kvf_store_t *store, kvf_disk_t *disk)
{
    store->disk = disk;
}

uint32_t kvf_store_tier_prefix(kvf_store_t *store, const kvf_key_t *keys,
                               uint32_t num)
{
    uint32_t i;

    for (i = 0; i < num; i++) {
        if ((kvf_pool_lookup(store->pool, &keys[i]) == NULL) &&
            ((store->disk == NULL) ||
             !kvf_disk_contains(store->disk, &keys[i]))) {
            break;
        }
    }
    return i;
}

static void kvf_store_promotion_put_hits(kvf_store_promotion_t *promotion)
{
    uint32_t i;

    for (i = 0; i < promotion->num; i++) {
        if (promotion->reads[i].hit != NULL) {
            kvf_pool_entry_put(promotion->store->pool, promotion->reads[i].hit);
        }
    }
}

static void kvf_store_promotion_step(kvf_store_promotion_t *promotion)
{
    kvf_store_t *store = promotion->store;
    kvf_store_promotion_t **pp;

    if (--promotion->pending > 0) {
        return;
    }
    for (pp = &store->promotions; *pp != NULL; pp = &(*pp)->next) {
        if (*pp == promotion) {
            *pp = promotion->next;
            break;
        }
    }
    /* the reader pins the hits from its callback, before anything else
     * can allocate */
    kvf_store_promotion_put_hits(promotion);
    if (promotion->cb != NULL) {
        promotion->cb(promotion->arg, promotion->promoted, promotion->failed);
    }
    free(promotion);
}

static void kvf_store_start_waiting(kvf_store_t *store);

/* A chunk came back from disk (or not): commit it to the pool, then let
 * the promotions that wait for the same key go on. */
static void kvf_store_on_disk_read(void *arg, const kvf_key_t *key,
                                   kvf_status_t status, uint64_t length,
                                   uint64_t checksum)
{
    kvf_store_promo_read_t *read     = arg;
    kvf_store_promotion_t *promotion = read->promotion;
    kvf_store_t *store               = promotion->store;
    khiter_t it = kh_get(kvf_store_reads, &store->reading, read->key);
    kvf_store_promo_read_t *f, *next;
    bool ok = false;

    if ((it != kh_end(&store->reading)) &&
        (kh_value(&store->reading, it) == read)) {
        kh_del(kvf_store_reads, &store->reading, it);
    }
    kvf_pool_entry_put(store->pool, read->entry);
    if ((status == KVF_OK) &&
        (kvf_pool_commit(store->pool, read->entry, key, checksum) == KVF_OK)) {
        /* the tier verified the bytes where they landed */
        kvf_pool_entry_set_unread(read->entry, true);
        ok = true;
        store->promoted++;
        promotion->promoted++;
        if (store->admit_cb != NULL) {
            store->admit_cb(store->cb_arg, key); /* in memory again */
        }
    } else {
        /* damaged or torn on disk, or promoted meanwhile by another read */
        kvf_pool_free(store->pool, read->entry);
        if (status != KVF_OK) {
            store->promote_failures++;
            promotion->failed++;
        }
    }
    /* a follower may end its promotion, and the memory it lives in */
    for (f = read->followers; f != NULL; f = next) {
        next = f->next_follower;
        if (ok) {
            f->promotion->promoted++;
        } else if (status != KVF_OK) {
            f->promotion->failed++;
        }
        kvf_store_promotion_step(f->promotion);
    }
    read->followers = NULL;
    kvf_store_promotion_step(promotion);
    /* the tier took this read off its queue: the next waiting one goes */
    kvf_store_start_waiting(store);
}

/* The read in flight for @p key, NULL when none. */
static kvf_store_promo_read_t *kvf_store_reading(kvf_store_t *store,
                                                 const kvf_key_t *key)
{
    khiter_t it = kh_get(kvf_store_reads, &store->reading, *key);

    return (it == kh_end(&store->reading)) ? NULL
                                           : kh_value(&store->reading, it);
}

bool kvf_store_has_disk(const kvf_store_t *store)
{
    return store->disk != NULL;
}

void kvf_store_want(kvf_store_t *store, const kvf_key_t *key)
{
    if ((store->disk != NULL) && (kvf_pool_lookup(store->pool, key) == NULL)) {
        kvf_disk_want(store->disk, key);
    }
}

/* Asks the tier to read @p read (in store->reading) into its block.
 * KVF_ERR_BUSY: the tier takes no more reads now, nothing happened;
 * otherwise under way, or done and called back (@p read may be gone). */
static kvf_status_t kvf_store_read_start(kvf_store_t *store,
                                         kvf_store_promo_read_t *read)
{
    kvf_status_t status = kvf_disk_read(
        store->disk, &read->key,
        kvf_pool_ptr(store->pool, kvf_pool_entry_offset(read->entry)),
        kvf_pool_entry_block_size(store->pool, read->entry),
        kvf_store_on_disk_read, read);

    if (status == KVF_OK) {
        kvf_store_on_disk_read(read, &read->key, KVF_OK, 0,
                               kvf_disk_checksum(store->disk, &read->key));
    } else if ((status != KVF_INPROGRESS) && (status != KVF_ERR_BUSY)) {
        kvf_store_on_disk_read(read, &read->key, status, 0, 0);
    }
    return status;
}

/* Starts waiting reads in order while the tier takes them. */
static void kvf_store_start_waiting(kvf_store_t *store)
{
    kvf_store_promo_read_t *read;

    if (store->is_starting_waiting) {
        return; /* a read done at once calls back into here */
    }
    store->is_starting_waiting = true;
    while ((read = STAILQ_FIRST(&store->waiting)) != NULL) {
        STAILQ_REMOVE_HEAD(&store->waiting, waiting);
        if (kvf_store_read_start(store, read) == KVF_ERR_BUSY) {
            STAILQ_INSERT_HEAD(&store->waiting, read,
                               waiting); /* still first */
            break;
        }
    }
    store->is_starting_waiting = false;
}

kvf_status_t kvf_store_promote(kvf_store_t *store, const kvf_key_t *keys,
                               uint32_t num, kvf_store_promote_cb_t cb,
                               void *arg)
{
    kvf_store_promotion_t *promotion;
    kvf_store_promo_read_t *read, *leader;
    kvf_pool_entry_t *entry;
    kvf_status_t status;
    uint64_t length;
    khiter_t it;
    uint32_t i;
    int ret;

    if (store->disk == NULL) {
        return KVF_OK;
    }
    /* the pool-hit path stays as it was: nothing allocated unless some
     * chunk is only on disk */
    for (i = 0; i < num; i++) {
        if ((kvf_pool_lookup(store->pool, &keys[i]) == NULL) &&
            kvf_disk_contains(store->disk, &keys[i])) {
            break;
        }
    }
    if (i == num) {
        return KVF_OK;
    }
    /* the room made in the pool for each read may spill chunks to a full
     * disk: not in place of the request's later keys */
    for (; i < num; i++) {
        kvf_store_want(store, &keys[i]);
    }
    promotion = calloc(1, sizeof(*promotion) + (size_t)num * sizeof(*read));
    if (promotion == NULL) {
        return KVF_ERR_NO_MEMORY;
    }
    promotion->store   = store;
    promotion->num     = num;
    promotion->pending = 1; /* this call's own, dropped at the end */
    for (i = 0; i < num; i++) {
        entry = kvf_pool_lookup(store->pool, &keys[i]);
        if (entry != NULL) {
            kvf_pool_entry_hold(store->pool, entry);
            promotion->reads[i].hit = entry;
        }
    }
    for (i = 0; i < num; i++) {
        length = kvf_disk_length(store->disk, &keys[i]);
        if ((length == 0) || (promotion->reads[i].hit != NULL) ||
            (kvf_pool_lookup(store->pool, &keys[i]) != NULL)) {
            continue;
        }
        read   = &promotion->reads[i];
        leader = kvf_store_reading(store, &keys[i]);
        if (leader != NULL) {
            /* being read for an earlier promotion: wait for that read */
            read->promotion     = promotion;
            read->next_follower = leader->followers;
            leader->followers   = read;
            promotion->pending++;
            continue;
        }
        status = kvf_pool_alloc(store->pool, length, UINT64_MAX, &entry);
        if (status != KVF_OK) {
            store->promote_failures++;
            promotion->failed++;
            continue;
        }
        it = kh_put(kvf_store_reads, &store->reading, keys[i], &ret);
        if (ret < 0) {
            kvf_pool_free(store->pool, entry); /* no memory to track it */
            store->promote_failures++;
            promotion->failed++;
            continue;
        }
        kh_value(&store->reading, it) = read;
        kvf_pool_entry_hold(store->pool, entry); /* not reclaimed meanwhile */
        read->promotion = promotion;
        read->entry     = entry;
        read->key       = keys[i];
        promotion->pending++;
        if (!STAILQ_EMPTY(&store->waiting) ||
            (kvf_store_read_start(store, read) == KVF_ERR_BUSY)) {
            /* the tier has 4 x queue_depth reads already: this one goes
             * when they land, after those waiting before it */
            STAILQ_INSERT_TAIL(&store->waiting, read, waiting);
            store->promote_waits++;
        }
    }
    if (promotion->pending == 1) {
        /* nothing in flight: nobody to call back */
        kvf_store_promotion_put_hits(promotion);
        free(promotion);
        return KVF_OK;
    }
    promotion->pending--;
    promotion->cb     = cb;
    promotion->arg    = arg;
    promotion->next   = store->promotions;
    store->promotions = promotion;
    return KVF_INPROGRESS;
}

void kvf_store_promote_cancel(kvf_store_t *store, void *arg)
{
    kvf_store_promotion_t *promotion;

    for (promotion = store->promotions; promotion != NULL;
         promotion = promotion->next) {
        if (promotion->arg == arg) {
            promotion->cb = NULL;
        }
    }
}

typedef struct kvf_store_foreach_ctx {
    kvf_store_key_cb_t cb;
    void *arg;
} kvf_store_foreach_ctx_t;

static void kvf_store_foreach_entry(const kvf_pool_entry_t *entry, void *arg)
{
    kvf_store_foreach_ctx_t *ctx = arg;

    ctx->cb(ctx->arg, kvf_pool_entry_key(entry));
}

void kvf_store_foreach_key(kvf_store_t *store, kvf_store_key_cb_t cb, void *arg)
{
    kvf_store_foreach_ctx_t ctx = {cb, arg};

    kvf_pool_foreach_committed(store->pool, kvf_store_foreach_entry, &ctx);
}

uint64_t kvf_store_expire_grants(kvf_store_t *store, uint64_t now_ns)
{
    kvf_store_owner_t *owner;
    kvf_store_hold_t *h;
    uint64_t expired = 0;
    uint32_t i;

    for (owner = store->owner_list; owner != NULL; owner = owner->next) {
        i = 0;
        while ((owner->grants > 0) && (i <= owner->mask)) {
            h = &owner->holds[i];
            if ((h->offset != KVF_STORE_EMPTY) && h->is_grant &&
                (h->deadline_ns <= now_ns)) {
                kvf_pool_free(store->pool, h->entry);
                /* deletion may shift a later entry into slot i: look at
                 * slot i again */
                kvf_store_hold_delete(owner, h);
                owner->grants--;
                expired++;
                continue;
            }
            i++;
        }
    }
    store->expired_grants += expired;
    return expired;
}

uint32_t kvf_store_set_pin(kvf_store_t *store, const kvf_key_t *keys,
                           uint32_t num, kvf_pool_pin_t pin)
{
    kvf_pool_entry_t *entry;
    uint32_t i, found = 0;

    for (i = 0; i < num; i++) {
        entry = kvf_pool_lookup(store->pool, &keys[i]);
        if (entry != NULL) {
            kvf_pool_entry_pin(store->pool, entry, pin);
            found++;
        }
    }
    return found;
}

typedef struct kvf_store_clear_ctx {
    kvf_key_t *keys;
    size_t count;
    size_t cap;
} kvf_store_clear_ctx_t;

static void kvf_store_clear_collect(const kvf_pool_entry_t *entry, void *arg)
{
    kvf_store_clear_ctx_t *ctx = arg;

    if ((kvf_pool_entry_refcount(entry) == 0) && (ctx->count < ctx->cap) &&
        (kvf_pool_entry_state(entry) == KVF_POOL_ENTRY_COMMITTED)) {
        ctx->keys[ctx->count++] = *kvf_pool_entry_key(entry);
    }
}

uint64_t kvf_store_clear(kvf_store_t *store)
{
    kvf_store_clear_ctx_t ctx = {0};
    kvf_pool_stats_t st;
    kvf_pool_entry_t *entry;
    uint64_t dropped = 0;
    size_t i;

    kvf_pool_stats(store->pool, &st);
    ctx.cap  = st.entries;
    ctx.keys = malloc((ctx.cap + 1) * sizeof(*ctx.keys));
    if (ctx.keys == NULL) {
        kvf_error("clear: no memory to list %llu chunks",
                  (unsigned long long)ctx.cap);
        return 0;
    }
    /* collect first: the pool must not change while it is walked */
    kvf_pool_foreach_committed(store->pool, kvf_store_clear_collect, &ctx);
    for (i = 0; i < ctx.count; i++) {
        entry = kvf_pool_lookup(store->pool, &ctx.keys[i]);
        if ((entry != NULL) &&
            (kvf_pool_entry_pin_level(entry) != KVF_POOL_PIN_HARD) &&
            (kvf_pool_remove(store->pool, &ctx.keys[i]) == KVF_OK)) {
            dropped++;
        }
    }
    free(ctx.keys);
    return dropped;
}

static void kvf_store_spill_entry(const kvf_pool_entry_t *entry, void *arg)
{
    kvf_store_t *store = arg;
    kvf_status_t status;

    /* writes only: the tier was drained, no read can complete into the
     * pool while this iterates it */
    do {
        status = kvf_disk_put(
            store->disk, kvf_pool_entry_key(entry),
            kvf_pool_ptr(store->pool, kvf_pool_entry_offset(entry)),
            kvf_pool_entry_length(entry), kvf_pool_entry_checksum(entry));
    } while ((status == KVF_ERR_BUSY) &&
             (kvf_disk_progress(store->disk, true) > 0));
    if (status == KVF_OK) {
        store->spilled++;
    }
}

uint64_t kvf_store_spill_all(kvf_store_t *store)
{
    uint64_t before = store->spilled;

    if (store->disk == NULL) {
        return 0;
    }
    kvf_disk_drain(store->disk);
    kvf_pool_foreach_committed(store->pool, kvf_store_spill_entry, store);
    kvf_disk_drain(store->disk);
    return store->spilled - before;
}

/* The chunk of @p key left the pool and stays on disk only. */
static void kvf_store_demote(kvf_store_t *store, const kvf_key_t *key)
{
    if (store->demote_cb != NULL) {
        store->demote_cb(store->cb_arg, key);
    } else if (store->evict_cb != NULL) {
        store->evict_cb(store->cb_arg, key);
    }
}

static bool kvf_store_on_evict(const kvf_key_t *key, uint64_t offset,
                               uint64_t length, bool can_keep, void *arg)
{
    kvf_store_t *store = arg;
    kvf_pool_entry_t *entry;
    kvf_status_t status;
    bool in_place = false;

    if (store->disk != NULL) {
        /* write-behind: from the block itself while the pool can keep it
         * until the write is done (kvf_store_on_disk_written), else from a
         * copy; a busy tier drops the chunk (it counts that) */
        entry = kvf_pool_entry_find(store->pool, offset);
        if (entry == NULL) {
            status = KVF_ERR_NOT_FOUND;
        } else if (can_keep) {
            in_place = true;
            status   = kvf_disk_put_in_place(
                  store->disk, key, kvf_pool_ptr(store->pool, offset), length,
                  kvf_pool_entry_checksum(entry));
        } else {
            status = kvf_disk_put(store->disk, key,
                                  kvf_pool_ptr(store->pool, offset), length,
                                  kvf_pool_entry_checksum(entry));
        }
        if (status == KVF_OK) {
            /* the chunk moves to disk when its write lands
             * (kvf_store_on_disk_stored); meanwhile the tier serves it
             * from the kept block or its copy */
            store->spilled++;
            return in_place;
        }
        if ((status == KVF_ERR_EXISTS) &&
            kvf_disk_is_stored(store->disk, key)) {
            kvf_store_demote(store, key);
            return false;
        }
        if (status == KVF_ERR_EXISTS) {
            return false; /* its write is in flight: the same as above */
        }
    }
    if (store->evict_cb != NULL) {
        store->evict_cb(store->cb_arg, key);
    }
    return false;
}

void kvf_store_on_disk_written(void *arg, const void *data)
{
    kvf_store_t *store      = arg;
    uint64_t offset         = (uint64_t)((const uint8_t *)data -
                                 (const uint8_t *)kvf_pool_base(store->pool));
    kvf_pool_entry_t *entry = kvf_pool_entry_find(store->pool, offset);

    /* only evictions write in place: every such put kept its block */
    if ((entry == NULL) ||
        (kvf_pool_retired_free(store->pool, entry) != KVF_OK)) {
        kvf_error("disk tier: written block at pool offset %" PRIu64
                  " was not kept for its write",
                  offset);
    }
}

void kvf_store_on_disk_stored(void *arg, const kvf_key_t *key)
{
    kvf_store_t *store = arg;

    if (kvf_pool_lookup(store->pool, key) == NULL) {
        kvf_store_demote(store, key);
    }
}

void kvf_store_on_disk_dropped(void *arg, const kvf_key_t *key)
{
    kvf_store_t *store = arg;

    if ((kvf_pool_lookup(store->pool, key) == NULL) &&
        (store->evict_cb != NULL)) {
        store->evict_cb(store->cb_arg, key); /* in no tier any more */
    }
}

kvf_status_t kvf_store_create(const kvf_store_params_t *params,
                              kvf_store_t **store_p)
{
    kvf_pool_params_t pool_params;
    kvf_store_t *store;
    kvf_status_t status;

    if ((params == NULL) || (params->pool == NULL)) {
        return KVF_ERR_INVALID;
    }
    store = calloc(1, sizeof(*store));
    if (store == NULL) {
        return KVF_ERR_NO_MEMORY;
    }
    store->admit_cb         = params->admit_cb;
    store->evict_cb         = params->evict_cb;
    store->demote_cb        = params->demote_cb;
    store->grant_timeout_ns = params->grant_timeout_ns;
    store->cb_arg           = params->cb_arg;
    STAILQ_INIT(&store->waiting);
    kh_init_inplace(kvf_store_reads, &store->reading);
    pool_params = *params->pool;
    pool_params.field_mask |= KVF_POOL_FIELD_EVICT_CB;
    pool_params.evict_cb  = kvf_store_on_evict;
    pool_params.evict_arg = store;
    status                = kvf_pool_create(&pool_params, &store->pool);
    if (status != KVF_OK) {
        free(store);
        return status;
    }
    store->max_chunk = (pool_params.field_mask & KVF_POOL_FIELD_MAX_CHUNK)
                           ? pool_params.max_chunk
                           : (4ull << 20);
    if ((params->copy_threads > 0) &&
        (kvf_copier_create(params->copy_threads, &store->copier) != KVF_OK)) {
        kvf_pool_destroy(store->pool);
        free(store);
        return KVF_ERR_IO;
    }
    *store_p = store;
    return KVF_OK;
}

void kvf_store_destroy(kvf_store_t *store)
{
    if (store == NULL) {
        return;
    }
    if (store->owners != 0) {
        kvf_warn("store destroyed with %llu owners still open",
                 (unsigned long long)store->owners);
    }
    kvf_copier_destroy(store->copier);
    kvf_pool_destroy(store->pool);
    kh_destroy_inplace(kvf_store_reads, &store->reading);
    free(store);
}

static void kvf_store_copy_between(void *arg)
{
    kvf_store_t *store = arg;

    kvf_disk_poll(store->disk);
}

void kvf_store_copy(kvf_store_t *store, kvf_copy_job_t *jobs, size_t n)
{
    kvf_copier_run(store->copier, jobs, n,
                   (store->disk != NULL) ? kvf_store_copy_between : NULL,
                   store);
}

void kvf_store_get_stats(const kvf_store_t *store, kvf_store_stats_t *stats_p)
{
    kvf_pool_stats(store->pool, &stats_p->pool);
    stats_p->commits           = store->commits;
    stats_p->duplicates        = store->duplicates;
    stats_p->hits              = store->hits;
    stats_p->misses            = store->misses;
    stats_p->checksum_failures = store->checksum_failures;
    stats_p->expired_grants    = store->expired_grants;
    stats_p->owners            = store->owners;
    stats_p->spilled           = store->spilled;
    stats_p->promoted          = store->promoted;
    stats_p->promote_failures  = store->promote_failures;
    stats_p->promote_waits     = store->promote_waits;
}

int kvf_store_fd(const kvf_store_t *store)
{
    return kvf_pool_fd(store->pool);
}

void *kvf_store_base(const kvf_store_t *store)
{
    return kvf_pool_base(store->pool);
}

uint64_t kvf_store_size(const kvf_store_t *store)
{
    /* what engines map: the memfd (the chunk area in whole pages); the PD
     * region after it is not in the memfd */
    return kvf_pool_fd_length(store->pool);
}

kvf_status_t kvf_store_fd_readonly(const kvf_store_t *store, int *fd_p)
{
    return kvf_pool_fd_readonly(store->pool, fd_p);
}

uint64_t kvf_store_reserve(const kvf_store_t *store, uint64_t *offset_p)
{
    return kvf_pool_reserve(store->pool, offset_p);
}

int kvf_store_reserve_fd(const kvf_store_t *store)
{
    return kvf_pool_reserve_fd(store->pool);
}

kvf_status_t kvf_store_move(kvf_store_t *store, kvf_store_owner_t *from,
                            kvf_store_owner_t *to, uint64_t offset,
                            uint64_t *length_p)
{
    kvf_store_hold_t *hold = kvf_store_hold_find(from, offset);
    kvf_store_hold_t copy;

    if ((hold == NULL) || (kvf_store_hold_find(to, offset) != NULL)) {
        return KVF_ERR_RANGE;
    }
    copy = *hold;
    if (kvf_store_hold_insert(to, &copy) != KVF_OK) {
        return KVF_ERR_NO_MEMORY;
    }
    kvf_store_hold_delete(from, hold);
    if (copy.is_grant) {
        from->grants--;
        to->grants++;
    }
    *length_p = kvf_pool_entry_length(copy.entry);
    return KVF_OK;
}

uint64_t kvf_store_max_chunk(const kvf_store_t *store)
{
    return store->max_chunk;
}
