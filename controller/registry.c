/* SPDX-License-Identifier: Apache-2.0 */
/* Copyright (c) 2026 The kvfabric authors */
#include "controller/registry.h"

#include "common/byteorder.h"
#include "common/log.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#define KVF_REGISTRY_TOMB      0xffffu
#define KVF_REGISTRY_SLOT_MASK 0x0fffu /* holder bits of h[k] */
#define KVF_REGISTRY_MORE      0x8000u /* h[0]: other entries of this key */
#define KVF_REGISTRY_ON_DISK   0x4000u /* h[k]: holder k has it on disk only */
#define KVF_REGISTRY_MIN_CAP   1024u
#define KVF_REGISTRY_SCRATCH_C 8u
#define KVF_REGISTRY_PREFETCH \
    16u /* keys resolved ahead in a lookup */ /* holders kept per key during a \
                                                 lookup */

/* 32 bytes: key plus four holder slots (0 = none), each with its medium
 * (KVF_REGISTRY_ON_DISK: only on that holder's disk tier; a free holder never
 * keeps the bit, so TOMB and "empty" stay unambiguous). All-zero holders:
 * empty; h[0] == KVF_REGISTRY_TOMB: tombstone. KVF_REGISTRY_MORE in h[0] says
 * the key may have further entries later in the probe run (set when a key gets
 * a second entry, cleared by rehash), so lookups of the common single-entry
 * key stop at the first match. */
typedef struct kvf_registry_entry {
    uint64_t ns;
    uint64_t hi;
    uint64_t lo;
    uint16_t h[KVF_REGISTRY_INLINE];
} kvf_registry_entry_t;

typedef struct kvf_registry_slot {
    uint8_t state; /* kvf_registry_slot_state_t */
    bool is_excluded;
    uint64_t need_pass; /* PURGING: free after this purge pass completes */
    uint64_t keys;
    uint64_t disk_keys; /* of keys, held on the slot's disk tier only */
    uint64_t load;
} kvf_registry_slot_t;

struct kvf_registry {
    kvf_registry_entry_t *table;
    uint64_t cap; /* entries, any number (kvf_registry_home) */
    uint64_t entries;
    uint64_t tombstones;
    kvf_registry_slot_t slots[KVF_REGISTRY_MAX_SLOTS];
    uint32_t purging;
    bool is_purge_active;
    uint64_t purge_pass; /* pass in progress (or last) */
    uint64_t purge_cursor;
    uint64_t purge_backlog;
    uint64_t disk_holdings; /* holders with KVF_REGISTRY_ON_DISK */
    /* lookup scratch, sized for max_batch keys */
    uint32_t max_batch;
    uint16_t *cand;
    uint8_t *ncand;
    uint32_t *run;
    uint64_t *pos; /* home index per key */
    /* incremental growth: entries move from `old` in slices (and a key's
     * entries on first write to it); reads look in both tables */
    kvf_registry_entry_t *old;
    uint64_t old_cap;
    uint64_t mig_cursor;
    bool is_migrating;
    /* the old table after a move, unmapped a chunk per step (unmapping
     * 256 MiB of small pages at once stalled the loop for 30 ms) */
    uint8_t *dying;
    size_t dying_len;
};

_Static_assert(sizeof(kvf_registry_entry_t) == 32, "registry entry size");

static bool kvf_registry_dying_free(kvf_registry_t *reg, size_t bytes);

static inline void kvf_registry_key_load(const uint8_t *p, kvf_key_t *key)
{
    key->ns = kvf_le64_get(p);
    key->hi = kvf_le64_get(p + 8);
    key->lo = kvf_le64_get(p + 16);
}

static inline uint64_t kvf_registry_hash(const kvf_key_t *key)
{
    /* digests are already hashes; fold and finalize (splitmix64) */
    uint64_t x = key->lo ^ (key->hi * 0x9e3779b97f4a7c15ull) ^
                 (key->ns * 0xc2b2ae3d27d4eb4full);

    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebull;
    x ^= x >> 31;
    return x;
}

/* The home entry of @p hash in a table of @p cap entries, any cap: the
 * hash's high bits scaled to the table (one multiply, no division), so a
 * table can be sized to its keys instead of to a power of two. */
static inline uint64_t kvf_registry_home(uint64_t hash, uint64_t cap)
{
    return (uint64_t)(((unsigned __int128)hash * cap) >> 64);
}

/* Linear probing's next entry, wrapping at the table's end. */
static inline uint64_t kvf_registry_next(uint64_t i, uint64_t cap)
{
    return (i + 1 == cap) ? 0 : i + 1;
}

/* Entries for a table holding @p keys at @p load_pct percent, at least
 * KVF_REGISTRY_MIN_CAP (the mapping need not be whole huge pages: the
 * kernel backs its aligned 2 MiB stretches with them). */
static uint64_t kvf_registry_cap_for(uint64_t keys, unsigned load_pct)
{
    uint64_t cap = (keys * 100 + load_pct - 1) / load_pct;

    return (cap < KVF_REGISTRY_MIN_CAP) ? KVF_REGISTRY_MIN_CAP : cap;
}

static inline bool kvf_registry_entry_is_empty(const kvf_registry_entry_t *e)
{
    uint64_t h;

    memcpy(&h, e->h, sizeof(h));
    return h == 0;
}

static inline bool kvf_registry_entry_is_tomb(const kvf_registry_entry_t *e)
{
    return e->h[0] == KVF_REGISTRY_TOMB;
}

static inline uint16_t kvf_registry_h(const kvf_registry_entry_t *e, unsigned k)
{
    return e->h[k] & KVF_REGISTRY_SLOT_MASK;
}

static inline bool kvf_registry_h_is_disk(const kvf_registry_entry_t *e,
                                          unsigned k)
{
    return (e->h[k] & KVF_REGISTRY_ON_DISK) != 0;
}

/* Sets holder @p k to @p slot on @p is_disk (slot 0: free, no medium),
 * keeping KVF_REGISTRY_MORE. */
static inline void kvf_registry_h_set_medium(kvf_registry_entry_t *e,
                                             unsigned k, uint16_t slot,
                                             bool is_disk)
{
    uint16_t keep = e->h[k] & KVF_REGISTRY_MORE;

    e->h[k] = (uint16_t)(keep | slot |
                         ((is_disk && (slot != 0)) ? KVF_REGISTRY_ON_DISK : 0));
}

static inline void kvf_registry_h_set(kvf_registry_entry_t *e, unsigned k,
                                      uint16_t slot)
{
    kvf_registry_h_set_medium(e, k, slot, false);
}

static inline bool kvf_registry_entry_has_holders(const kvf_registry_entry_t *e)
{
    return (kvf_registry_h(e, 0) | kvf_registry_h(e, 1) | kvf_registry_h(e, 2) |
            kvf_registry_h(e, 3)) != 0;
}

static inline bool kvf_registry_entry_has_more(const kvf_registry_entry_t *e)
{
    return (e->h[0] & KVF_REGISTRY_MORE) != 0;
}

static inline void kvf_registry_entry_set_tomb(kvf_registry_entry_t *e)
{
    e->h[0] = KVF_REGISTRY_TOMB;
    e->h[1] = 0;
    e->h[2] = 0;
    e->h[3] = 0;
}

static inline bool kvf_registry_entry_match(const kvf_registry_entry_t *e,
                                            const kvf_key_t *key)
{
    return (e->lo == key->lo) && (e->hi == key->hi) && (e->ns == key->ns) &&
           !kvf_registry_entry_is_tomb(e);
}

static kvf_status_t kvf_registry_table_alloc(uint64_t cap, bool is_huge,
                                             kvf_registry_entry_t **table_p)
{
    size_t bytes = cap * sizeof(kvf_registry_entry_t);
    void *table;

    /* anonymous memory is zeroed (all entries empty); huge pages keep the
     * random probes of a large table from missing the TLB every time */
    table = mmap(NULL, bytes, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (table == MAP_FAILED) {
        kvf_error("registry: cannot map %" PRIu64 " entries: %m", cap);
        return KVF_ERR_NO_MEMORY;
    }
    if (is_huge && (bytes >= (2u << 20))) {
        madvise(table, bytes, MADV_HUGEPAGE); /* advice only */
    }
    /* fault the table in now, at start or while rehashing anyway, rather
     * than one page per first ADMIT into it (tens of ms of stalls spread
     * over the first requests of a fresh controller) */
    memset(table, 0, bytes);
    *table_p = table;
    return KVF_OK;
}

static void kvf_registry_table_free(kvf_registry_entry_t *table, uint64_t cap)
{
    if (table != NULL) {
        munmap(table, cap * sizeof(*table));
    }
}

kvf_status_t kvf_registry_create(uint64_t expected_keys, uint32_t max_batch,
                                 kvf_registry_t **reg_p)
{
    kvf_registry_t *reg;
    kvf_status_t status;
    /* room for the expected keys before the first growth */
    uint64_t cap = kvf_registry_cap_for(expected_keys, 60);

    if (max_batch == 0) {
        return KVF_ERR_INVALID;
    }
    reg = calloc(1, sizeof(*reg));
    if (reg == NULL) {
        return KVF_ERR_NO_MEMORY;
    }
    status = kvf_registry_table_alloc(cap, true, &reg->table);
    if (status != KVF_OK) {
        goto err_free_reg;
    }
    reg->cap       = cap;
    reg->max_batch = max_batch;
    reg->cand =
        malloc((size_t)max_batch * KVF_REGISTRY_SCRATCH_C * sizeof(*reg->cand));
    reg->ncand = malloc((size_t)max_batch * sizeof(*reg->ncand));
    reg->run =
        malloc((size_t)max_batch * KVF_REGISTRY_SCRATCH_C * sizeof(*reg->run));
    reg->pos = malloc((size_t)max_batch * sizeof(*reg->pos));
    if ((reg->cand == NULL) || (reg->ncand == NULL) || (reg->run == NULL) ||
        (reg->pos == NULL)) {
        status = KVF_ERR_NO_MEMORY;
        goto err_free_scratch;
    }
    *reg_p = reg;
    return KVF_OK;

err_free_scratch:
    free(reg->pos);
    free(reg->run);
    free(reg->ncand);
    free(reg->cand);
    kvf_registry_table_free(reg->table, reg->cap);
err_free_reg:
    free(reg);
    return status;
}

void kvf_registry_destroy(kvf_registry_t *reg)
{
    if (reg == NULL) {
        return;
    }
    free(reg->pos);
    free(reg->run);
    free(reg->ncand);
    free(reg->cand);
    kvf_registry_table_free(reg->old, reg->old_cap);
    kvf_registry_dying_free(reg, SIZE_MAX);
    kvf_registry_table_free(reg->table, reg->cap);
    free(reg);
}

kvf_status_t kvf_registry_slot_open(kvf_registry_t *reg, uint16_t *slot_p)
{
    uint16_t s;

    for (s = 1; s < KVF_REGISTRY_MAX_SLOTS; s++) {
        if (reg->slots[s].state == KVF_REGISTRY_SLOT_FREE) {
            memset(&reg->slots[s], 0, sizeof(reg->slots[s]));
            reg->slots[s].state = KVF_REGISTRY_SLOT_LIVE;
            *slot_p             = s;
            return KVF_OK;
        }
    }
    kvf_error("registry: all %u holder slots in use",
              KVF_REGISTRY_MAX_SLOTS - 1);
    return KVF_ERR_BUSY;
}

static void kvf_registry_slot_free(kvf_registry_t *reg, uint16_t s)
{
    reg->purge_backlog -= reg->slots[s].keys;
    memset(&reg->slots[s], 0, sizeof(reg->slots[s]));
    reg->purging--;
}

void kvf_registry_slot_close(kvf_registry_t *reg, uint16_t slot)
{
    kvf_registry_slot_t *s;

    if ((slot == 0) || (slot >= KVF_REGISTRY_MAX_SLOTS)) {
        return;
    }
    s = &reg->slots[slot];
    if (s->state != KVF_REGISTRY_SLOT_LIVE) {
        return;
    }
    s->state = KVF_REGISTRY_SLOT_PURGING;
    reg->purging++;
    if (s->keys == 0) {
        /* nothing to remove: free at once */
        s->state = KVF_REGISTRY_SLOT_FREE;
        reg->purging--;
        return;
    }
    reg->purge_backlog += s->keys;
    if (reg->is_purge_active) {
        s->need_pass = reg->purge_pass + 1; /* the cursor passed some */
    } else {
        reg->is_purge_active = true;
        reg->purge_pass++;
        reg->purge_cursor = 0;
        s->need_pass      = reg->purge_pass;
    }
}

kvf_registry_slot_state_t kvf_registry_slot_state(const kvf_registry_t *reg,
                                                  uint16_t slot)
{
    if ((slot == 0) || (slot >= KVF_REGISTRY_MAX_SLOTS)) {
        return KVF_REGISTRY_SLOT_FREE;
    }
    return (kvf_registry_slot_state_t)reg->slots[slot].state;
}

uint64_t kvf_registry_slot_keys(const kvf_registry_t *reg, uint16_t slot)
{
    if ((slot == 0) || (slot >= KVF_REGISTRY_MAX_SLOTS)) {
        return 0;
    }
    return reg->slots[slot].keys;
}

void kvf_registry_slot_set_load(kvf_registry_t *reg, uint16_t slot,
                                uint64_t load)
{
    if ((slot > 0) && (slot < KVF_REGISTRY_MAX_SLOTS)) {
        reg->slots[slot].load = load;
    }
}

void kvf_registry_slot_set_excluded(kvf_registry_t *reg, uint16_t slot,
                                    bool excluded)
{
    if ((slot > 0) && (slot < KVF_REGISTRY_MAX_SLOTS)) {
        reg->slots[slot].is_excluded = excluded;
    }
}

static inline bool kvf_registry_slot_is_live(const kvf_registry_t *reg,
                                             uint16_t h)
{
    return (h != 0) && (h < KVF_REGISTRY_MAX_SLOTS) &&
           (reg->slots[h].state == KVF_REGISTRY_SLOT_LIVE);
}

/* A holder of @p slot on disk appeared (@p is_add) or went: counted. */
static inline void kvf_registry_medium_count(kvf_registry_t *reg, uint16_t slot,
                                             bool is_disk, bool is_add)
{
    if (!is_disk) {
        return;
    }
    if (is_add) {
        reg->slots[slot].disk_keys++;
        reg->disk_holdings++;
    } else {
        reg->slots[slot].disk_keys--;
        reg->disk_holdings--;
    }
}

/* Removes the purging holders of @p e (an in-use entry); true when the entry
 * became a tombstone. */
static bool kvf_registry_entry_scrub(kvf_registry_t *reg,
                                     kvf_registry_entry_t *e)
{
    unsigned i;
    bool any = false;

    for (i = 0; i < KVF_REGISTRY_INLINE; i++) {
        uint16_t h = kvf_registry_h(e, i);

        if (h == 0) {
            continue;
        }
        if (reg->slots[h].state == KVF_REGISTRY_SLOT_PURGING) {
            reg->slots[h].keys--;
            reg->purge_backlog--;
            kvf_registry_medium_count(reg, h, kvf_registry_h_is_disk(e, i),
                                      false);
            kvf_registry_h_set(e, i, 0);
        } else {
            any = true;
        }
    }
    return !any;
}

/* Places a whole entry (holders already scrubbed) into the current table,
 * flagging KVF_REGISTRY_MORE when the key already has an entry there. */
static void kvf_registry_place(kvf_registry_t *reg,
                               const kvf_registry_entry_t *src)
{
    kvf_registry_entry_t e       = *src;
    kvf_registry_entry_t *free_e = NULL;
    kvf_key_t key                = {.ns = e.ns, .hi = e.hi, .lo = e.lo};
    uint64_t j = kvf_registry_home(kvf_registry_hash(&key), reg->cap);

    e.h[0] &= (uint16_t)~KVF_REGISTRY_MORE;
    for (; !kvf_registry_entry_is_empty(&reg->table[j]);
         j = kvf_registry_next(j, reg->cap)) {
        kvf_registry_entry_t *t = &reg->table[j];

        if (kvf_registry_entry_is_tomb(t)) {
            if (free_e == NULL) {
                free_e = t;
            }
        } else if (kvf_registry_entry_match(t, &key)) {
            t->h[0] |= KVF_REGISTRY_MORE;
            e.h[0] |= KVF_REGISTRY_MORE;
        }
    }
    if (free_e != NULL) {
        reg->tombstones--;
        *free_e = e;
    } else {
        reg->table[j] = e;
    }
}

/* Moves one entry of the old table (if in use) to the current one. */
static void kvf_registry_migrate_entry(kvf_registry_t *reg,
                                       kvf_registry_entry_t *e)
{
    if (kvf_registry_entry_is_empty(e) || kvf_registry_entry_is_tomb(e)) {
        return;
    }
    if (kvf_registry_entry_scrub(reg, e)) {
        reg->entries--; /* only purging holders: gone */
    } else {
        kvf_registry_place(reg, e);
    }
    kvf_registry_entry_set_tomb(e); /* keeps the old probe runs intact */
}

/* Unmaps up to @p bytes of the old table; true when none is left. */
static bool kvf_registry_dying_free(kvf_registry_t *reg, size_t bytes)
{
    size_t n = (bytes < reg->dying_len) ? bytes : reg->dying_len;

    if (n > 0) {
        munmap(reg->dying + reg->dying_len - n, n);
        reg->dying_len -= n;
    }
    if (reg->dying_len == 0) {
        reg->dying = NULL;
    }
    return reg->dying == NULL;
}

static void kvf_registry_migrate_done(kvf_registry_t *reg)
{
    uint16_t s;

    kvf_registry_dying_free(reg, SIZE_MAX); /* a previous one, if any */
    reg->dying        = (uint8_t *)reg->old;
    reg->dying_len    = reg->old_cap * sizeof(*reg->old);
    reg->old          = NULL;
    reg->is_migrating = false;
    madvise(reg->table, reg->cap * sizeof(*reg->table), MADV_HUGEPAGE);
    /* purge passes wait for the move: restart one over the new table */
    if (reg->purging > 0) {
        reg->is_purge_active = true;
        reg->purge_pass++;
        reg->purge_cursor = 0;
        for (s = 1; s < KVF_REGISTRY_MAX_SLOTS; s++) {
            if (reg->slots[s].state == KVF_REGISTRY_SLOT_PURGING) {
                reg->slots[s].need_pass = reg->purge_pass;
            }
        }
    }
    kvf_debug("registry: grown to %" PRIu64 " entries (%" PRIu64 " used)",
              reg->cap, reg->entries);
}

/* Moves up to @p budget old entries; true when the move is complete. */
static bool kvf_registry_migrate_step(kvf_registry_t *reg, uint64_t budget)
{
    uint64_t end;

    if (!reg->is_migrating) {
        return true;
    }
    end = (budget > reg->old_cap - reg->mig_cursor) ? reg->old_cap
                                                    : reg->mig_cursor + budget;
    for (; reg->mig_cursor < end; reg->mig_cursor++) {
        kvf_registry_migrate_entry(reg, &reg->old[reg->mig_cursor]);
    }
    if (reg->mig_cursor < reg->old_cap) {
        return false;
    }
    kvf_registry_migrate_done(reg);
    return true;
}

/* Before a write to @p key: move its old entries, so writes see one table
 * (no holder is ever in both tables). */
static void kvf_registry_migrate_key(kvf_registry_t *reg, const kvf_key_t *key)
{
    uint64_t i;

    if (!reg->is_migrating) {
        return;
    }
    for (i = kvf_registry_home(kvf_registry_hash(key), reg->old_cap);
         !kvf_registry_entry_is_empty(&reg->old[i]);
         i = kvf_registry_next(i, reg->old_cap)) {
        if (kvf_registry_entry_match(&reg->old[i], key)) {
            kvf_registry_migrate_entry(reg, &reg->old[i]);
        }
    }
}

/* Starts moving everything to a table of @p new_cap entries (growth, or
 * the same size to drop tombstones). The previous move, if any, is
 * finished first. */
static kvf_status_t kvf_registry_grow(kvf_registry_t *reg, uint64_t new_cap)
{
    kvf_registry_entry_t *table;
    kvf_status_t status;

    kvf_registry_migrate_step(reg, UINT64_MAX);
    /* small pages while entries move in: a write to a new table touches
     * pages all over it, and faulting in 2 MiB zeroed pages stalled the
     * loop for 200 ms; huge pages are asked for once the move is done */
    status = kvf_registry_table_alloc(new_cap, false, &table);
    if (status != KVF_OK) {
        return status;
    }
    reg->old          = reg->table;
    reg->old_cap      = reg->cap;
    reg->mig_cursor   = 0;
    reg->is_migrating = true;
    reg->table        = table;
    reg->cap          = new_cap;
    reg->tombstones   = 0;
    return KVF_OK;
}

static kvf_status_t kvf_registry_reserve(kvf_registry_t *reg)
{
    uint64_t new_cap = reg->cap;

    if (((reg->entries + reg->tombstones + 1) * 4) <= (reg->cap * 3)) {
        return KVF_OK;
    }
    /* full of entries: to half load, 1.5x the entries (the table costs
     * 43-64 bytes a key, where doubling cost 43-85); mostly tombstones:
     * the same size, without them */
    if (((reg->entries + 1) * 2) > reg->cap) {
        new_cap = kvf_registry_cap_for(reg->entries + 1, 50);
    }
    return kvf_registry_grow(reg, new_cap);
}

/* A key got a further entry: flag all its entries (rare path). */
static void kvf_registry_mark_more(kvf_registry_t *reg, const kvf_key_t *key)
{
    uint64_t i = kvf_registry_home(kvf_registry_hash(key), reg->cap);

    for (; !kvf_registry_entry_is_empty(&reg->table[i]);
         i = kvf_registry_next(i, reg->cap)) {
        if (kvf_registry_entry_match(&reg->table[i], key)) {
            reg->table[i].h[0] |= KVF_REGISTRY_MORE;
        }
    }
}

/* Adds one holder on @p is_disk, or moves an existing one to that medium;
 * returns true when it was new. */
static bool kvf_registry_add(kvf_registry_t *reg, const kvf_key_t *key,
                             uint16_t slot, bool is_disk)
{
    uint64_t i = kvf_registry_home(kvf_registry_hash(key), reg->cap);
    kvf_registry_entry_t *free_e  = NULL;
    kvf_registry_entry_t *free_he = NULL; /* entry with a free holder */
    unsigned free_k               = 0;
    bool is_found                 = false;
    kvf_registry_entry_t *e;
    unsigned k;

    kvf_registry_migrate_key(reg, key);
    for (;; i = kvf_registry_next(i, reg->cap)) {
        e = &reg->table[i];
        if (kvf_registry_entry_is_empty(e)) {
            break;
        }
        if (kvf_registry_entry_is_tomb(e)) {
            if (free_e == NULL) {
                free_e = e;
            }
            continue;
        }
        if ((e->lo != key->lo) || (e->hi != key->hi) || (e->ns != key->ns)) {
            continue;
        }
        is_found = true;
        for (k = 0; k < KVF_REGISTRY_INLINE; k++) {
            uint16_t h = kvf_registry_h(e, k);

            if (h == slot) {
                if (kvf_registry_h_is_disk(e, k) != is_disk) {
                    kvf_registry_medium_count(reg, slot, !is_disk, false);
                    kvf_registry_medium_count(reg, slot, is_disk, true);
                    kvf_registry_h_set_medium(e, k, slot, is_disk);
                }
                return false;
            }
            if ((free_he == NULL) &&
                ((h == 0) ||
                 (reg->slots[h].state == KVF_REGISTRY_SLOT_PURGING))) {
                free_he = e;
                free_k  = k;
            }
        }
    }
    if (free_he != NULL) {
        uint16_t h = kvf_registry_h(free_he, free_k);

        if (h != 0) {
            reg->slots[h].keys--;
            reg->purge_backlog--;
            kvf_registry_medium_count(
                reg, h, kvf_registry_h_is_disk(free_he, free_k), false);
        }
        kvf_registry_h_set_medium(free_he, free_k, slot, is_disk);
    } else {
        if (free_e != NULL) {
            reg->tombstones--;
            e = free_e;
        }
        e->ns = key->ns;
        e->hi = key->hi;
        e->lo = key->lo;
        memset(e->h, 0, sizeof(e->h));
        kvf_registry_h_set_medium(e, 0, slot, is_disk);
        reg->entries++;
        if (is_found) {
            kvf_registry_mark_more(reg, key);
        }
    }
    reg->slots[slot].keys++;
    kvf_registry_medium_count(reg, slot, is_disk, true);
    return true;
}

kvf_status_t kvf_registry_admit(kvf_registry_t *reg, uint16_t slot,
                                const uint8_t *keys, size_t n, size_t *added_p)
{
    return kvf_registry_admit_medium(reg, slot, keys, n, KVF_REGISTRY_HOST,
                                     added_p);
}

kvf_status_t kvf_registry_admit_medium(kvf_registry_t *reg, uint16_t slot,
                                       const uint8_t *keys, size_t n,
                                       kvf_registry_medium_t medium,
                                       size_t *added_p)
{
    kvf_status_t status;
    size_t i, added = 0;
    kvf_key_t key;

    if (!kvf_registry_slot_is_live(reg, slot)) {
        return KVF_ERR_INVALID;
    }
    for (i = 0; i < n; i++) {
        status = kvf_registry_reserve(reg);
        if (status != KVF_OK) {
            *added_p = added;
            return status;
        }
        kvf_registry_key_load(keys + i * KVF_KEY_WIRE_SIZE, &key);
        added += kvf_registry_add(reg, &key, slot, medium == KVF_REGISTRY_DISK);
    }
    *added_p = added;
    return KVF_OK;
}

static bool kvf_registry_remove(kvf_registry_t *reg, const kvf_key_t *key,
                                uint16_t slot)
{
    uint64_t i;
    kvf_registry_entry_t *e;
    unsigned k;

    kvf_registry_migrate_key(reg, key);
    i = kvf_registry_home(kvf_registry_hash(key), reg->cap);
    for (;; i = kvf_registry_next(i, reg->cap)) {
        e = &reg->table[i];
        if (kvf_registry_entry_is_empty(e)) {
            return false;
        }
        if (!kvf_registry_entry_match(e, key)) {
            continue;
        }
        for (k = 0; k < KVF_REGISTRY_INLINE; k++) {
            if (kvf_registry_h(e, k) != slot) {
                continue;
            }
            kvf_registry_medium_count(reg, slot, kvf_registry_h_is_disk(e, k),
                                      false);
            kvf_registry_h_set(e, k, 0);
            reg->slots[slot].keys--;
            if (!kvf_registry_entry_has_holders(e)) {
                kvf_registry_entry_set_tomb(e);
                reg->entries--;
                reg->tombstones++;
            }
            return true;
        }
        if (!kvf_registry_entry_has_more(e)) {
            return false;
        }
    }
}

kvf_status_t kvf_registry_evict(kvf_registry_t *reg, uint16_t slot,
                                const uint8_t *keys, size_t n,
                                size_t *removed_p)
{
    size_t i, removed = 0;
    kvf_key_t key;

    if (!kvf_registry_slot_is_live(reg, slot)) {
        return KVF_ERR_INVALID;
    }
    for (i = 0; i < n; i++) {
        kvf_registry_key_load(keys + i * KVF_KEY_WIRE_SIZE, &key);
        removed += kvf_registry_remove(reg, &key, slot);
    }
    *removed_p = removed;
    return KVF_OK;
}

static bool kvf_registry_holds_in(const kvf_registry_entry_t *table,
                                  uint64_t cap, const kvf_key_t *key,
                                  uint16_t slot)
{
    uint64_t i = kvf_registry_home(kvf_registry_hash(key), cap);
    const kvf_registry_entry_t *e;
    unsigned k;

    for (;; i = kvf_registry_next(i, cap)) {
        e = &table[i];
        if (kvf_registry_entry_is_empty(e)) {
            return false;
        }
        if (!kvf_registry_entry_match(e, key)) {
            continue;
        }
        for (k = 0; k < KVF_REGISTRY_INLINE; k++) {
            if (kvf_registry_h(e, k) == slot) {
                return true;
            }
        }
        if (!kvf_registry_entry_has_more(e)) {
            return false;
        }
    }
}

bool kvf_registry_holds(const kvf_registry_t *reg, const kvf_key_t *key,
                        uint16_t slot)
{
    if (!kvf_registry_slot_is_live(reg, slot)) {
        return false;
    }
    return kvf_registry_holds_in(reg->table, reg->cap, key, slot) ||
           (reg->is_migrating &&
            kvf_registry_holds_in(reg->old, reg->old_cap, key, slot));
}

/* Collects the usable holders of @p key into @p cand; returns how many. */
static inline unsigned kvf_registry_collect(const kvf_registry_t *reg,
                                            const kvf_registry_entry_t *table,
                                            uint64_t cap, const kvf_key_t *key,
                                            uint16_t requester, uint64_t i,
                                            uint16_t *cand, unsigned n)
{
    const kvf_registry_entry_t *e;
    unsigned k;

    for (;; i = kvf_registry_next(i, cap)) {
        e = &table[i];
        if (kvf_registry_entry_is_empty(e)) {
            return n;
        }
        if (!kvf_registry_entry_match(e, key)) {
            continue;
        }
        for (k = 0; k < KVF_REGISTRY_INLINE; k++) {
            uint16_t h = kvf_registry_h(e, k);

            if (!kvf_registry_slot_is_live(reg, h) ||
                reg->slots[h].is_excluded) {
                continue;
            }
            /* the candidate keeps its medium bit */
            h |= (uint16_t)(e->h[k] & KVF_REGISTRY_ON_DISK);
            if (n < KVF_REGISTRY_SCRATCH_C) {
                cand[n++] = h;
            } else if ((h & KVF_REGISTRY_SLOT_MASK) == requester) {
                cand[n - 1] = h; /* the requester always stays a choice */
            }
        }
        if (!kvf_registry_entry_has_more(e)) {
            return n;
        }
    }
}

/* A collision continues into the next entry, half the time in the next
 * cache line: fetch both. */
static inline void kvf_registry_prefetch(const kvf_registry_t *reg,
                                         uint64_t pos)
{
    __builtin_prefetch(&reg->table[pos]);
    __builtin_prefetch(&reg->table[kvf_registry_next(pos, reg->cap)]);
}

kvf_status_t kvf_registry_lookup(kvf_registry_t *reg, const uint8_t *keys,
                                 size_t n, uint16_t requester, bool any_order,
                                 uint16_t *slots_out, size_t *hit_p)
{
    return kvf_registry_lookup_media(reg, keys, n, requester, any_order,
                                     slots_out, NULL, hit_p);
}

/* Whether candidate @p c (slot | KVF_REGISTRY_ON_DISK) is on disk only. */
static inline bool kvf_registry_cand_is_disk(uint16_t c)
{
    return (c & KVF_REGISTRY_ON_DISK) != 0;
}

static inline uint16_t kvf_registry_cand_slot(uint16_t c)
{
    return c & KVF_REGISTRY_SLOT_MASK;
}

kvf_status_t kvf_registry_lookup_media(kvf_registry_t *reg, const uint8_t *keys,
                                       size_t n, uint16_t requester,
                                       bool any_order, uint16_t *slots_out,
                                       uint8_t *media_out, size_t *hit_p)
{
    const size_t C = KVF_REGISTRY_SCRATCH_C;
    size_t i, hit = 0;
    uint16_t prev = 0;
    unsigned k, j;
    kvf_key_t key;

    if (n > reg->max_batch) {
        return KVF_ERR_TOO_BIG;
    }
    /* hash everything first, then keep KVF_REGISTRY_PREFETCH keys' entries
     * in flight ahead of the key being resolved: the misses overlap */
    for (i = 0; i < n; i++) {
        kvf_registry_key_load(keys + i * KVF_KEY_WIRE_SIZE, &key);
        reg->pos[i] = kvf_registry_hash(&key);
        if (i < KVF_REGISTRY_PREFETCH) {
            kvf_registry_prefetch(reg,
                                  kvf_registry_home(reg->pos[i], reg->cap));
        }
    }
    for (i = 0; i < n; i++) {
        if ((i + KVF_REGISTRY_PREFETCH) < n) {
            kvf_registry_prefetch(
                reg, kvf_registry_home(reg->pos[i + KVF_REGISTRY_PREFETCH],
                                       reg->cap));
        }
        kvf_registry_key_load(keys + i * KVF_KEY_WIRE_SIZE, &key);
        k = kvf_registry_collect(reg, reg->table, reg->cap, &key, requester,
                                 kvf_registry_home(reg->pos[i], reg->cap),
                                 &reg->cand[i * C], 0);
        if (reg->is_migrating) {
            k = kvf_registry_collect(
                reg, reg->old, reg->old_cap, &key, requester,
                kvf_registry_home(reg->pos[i], reg->old_cap), &reg->cand[i * C],
                k);
        }
        reg->ncand[i] = (uint8_t)k;
        if (reg->ncand[i] == 0) {
            if (!any_order) {
                break;
            }
        } else {
            hit++;
        }
    }
    if (!any_order) {
        hit = i;
    }
    for (i = 0; i < n; i++) {
        slots_out[i] = 0;
        if (media_out != NULL) {
            media_out[i] = KVF_REGISTRY_HOST;
        }
    }

    /* the requester when it holds the key (on any medium: its own disk
     * is nearer than a peer), then holders in memory before holders on
     * disk, then the longest run (chains), then the least loaded */
    if (any_order) {
        for (i = 0; i < n; i++) {
            const uint16_t *cand = &reg->cand[i * C];
            uint16_t best        = 0;

            for (k = 0; k < reg->ncand[i]; k++) {
                uint16_t c = cand[k], s = kvf_registry_cand_slot(c);

                if (s == requester) {
                    best = c;
                    break;
                }
                if ((best == 0) ||
                    (kvf_registry_cand_is_disk(c) !=
                             kvf_registry_cand_is_disk(best)
                         ? !kvf_registry_cand_is_disk(c)
                         : (reg->slots[s].load <
                            reg->slots[kvf_registry_cand_slot(best)].load))) {
                    best = c;
                }
            }
            slots_out[i] = kvf_registry_cand_slot(best);
            if ((media_out != NULL) && kvf_registry_cand_is_disk(best)) {
                media_out[i] = KVF_REGISTRY_DISK;
            }
        }
        *hit_p = hit;
        return KVF_OK;
    }

    /* run[i][k]: how many keys from i on cand[i][k] holds in a row */
    for (i = hit; i-- > 0;) {
        for (k = 0; k < reg->ncand[i]; k++) {
            uint16_t s = kvf_registry_cand_slot(reg->cand[i * C + k]);
            uint32_t r = 1;

            if ((i + 1) < hit) {
                for (j = 0; j < reg->ncand[i + 1]; j++) {
                    if (kvf_registry_cand_slot(reg->cand[(i + 1) * C + j]) ==
                        s) {
                        r += reg->run[(i + 1) * C + j];
                        break;
                    }
                }
            }
            reg->run[i * C + k] = r;
        }
    }
    for (i = 0; i < hit; i++) {
        const uint16_t *cand = &reg->cand[i * C];
        const uint32_t *run  = &reg->run[i * C];
        uint16_t best = 0, best_s = 0;
        uint32_t best_run = 0;

        for (k = 0; k < reg->ncand[i]; k++) {
            uint16_t c = cand[k], s = kvf_registry_cand_slot(c);
            bool better;

            if (s == requester) {
                best = c;
                break;
            }
            if (best == 0) {
                better = true;
            } else if (kvf_registry_cand_is_disk(c) !=
                       kvf_registry_cand_is_disk(best)) {
                better = !kvf_registry_cand_is_disk(c);
            } else if (run[k] != best_run) {
                better = run[k] > best_run;
            } else if ((s == prev) || (best_s == prev)) {
                better = s == prev;
            } else {
                better = reg->slots[s].load < reg->slots[best_s].load;
            }
            if (better) {
                best     = c;
                best_s   = s;
                best_run = run[k];
            }
        }
        slots_out[i] = kvf_registry_cand_slot(best);
        if ((media_out != NULL) && kvf_registry_cand_is_disk(best)) {
            media_out[i] = KVF_REGISTRY_DISK;
        }
        prev = slots_out[i];
    }
    *hit_p = hit;
    return KVF_OK;
}

uint32_t kvf_registry_purge_step(kvf_registry_t *reg, uint64_t budget)
{
    uint64_t end;
    uint16_t s;

    if (!kvf_registry_migrate_step(reg, budget)) {
        return reg->purging + 1; /* still moving entries */
    }
    if (!kvf_registry_dying_free(reg, 16u << 20)) {
        return reg->purging + 1;
    }
    if (!reg->is_purge_active) {
        return reg->purging;
    }
    end = reg->purge_cursor + budget;
    if (end > reg->cap) {
        end = reg->cap;
    }
    for (; reg->purge_cursor < end; reg->purge_cursor++) {
        kvf_registry_entry_t *e = &reg->table[reg->purge_cursor];

        if (kvf_registry_entry_is_empty(e) || kvf_registry_entry_is_tomb(e)) {
            continue;
        }
        if (kvf_registry_entry_scrub(reg, e)) {
            kvf_registry_entry_set_tomb(e);
            reg->entries--;
            reg->tombstones++;
        }
    }
    if (reg->purge_cursor < reg->cap) {
        return reg->purging;
    }
    for (s = 1; s < KVF_REGISTRY_MAX_SLOTS; s++) {
        if ((reg->slots[s].state == KVF_REGISTRY_SLOT_PURGING) &&
            (reg->slots[s].need_pass <= reg->purge_pass)) {
            kvf_registry_slot_free(reg, s);
        }
    }
    if (reg->purging > 0) {
        reg->purge_pass++;
        reg->purge_cursor = 0;
    } else {
        reg->is_purge_active = false;
    }
    return reg->purging;
}

void kvf_registry_stats(const kvf_registry_t *reg,
                        kvf_registry_stats_t *stats_p)
{
    memset(stats_p, 0, sizeof(*stats_p));
    stats_p->keys        = reg->entries;
    stats_p->entries     = reg->entries;
    stats_p->tombstones  = reg->tombstones;
    stats_p->capacity    = reg->cap;
    stats_p->table_bytes = (reg->cap + (reg->is_migrating ? reg->old_cap : 0)) *
                           sizeof(kvf_registry_entry_t);
    stats_p->is_migrating  = reg->is_migrating || (reg->dying != NULL);
    stats_p->purge_backlog = reg->purge_backlog;
    stats_p->purging_slots = reg->purging;
    stats_p->disk_holdings = reg->disk_holdings;
}

uint64_t kvf_registry_slot_disk_keys(const kvf_registry_t *reg, uint16_t slot)
{
    if ((slot == 0) || (slot >= KVF_REGISTRY_MAX_SLOTS)) {
        return 0;
    }
    return reg->slots[slot].disk_keys;
}

/* Calls @p cb for each live holder of each key of @p table. */
static void kvf_registry_dump_table(const kvf_registry_t *reg,
                                    const kvf_registry_entry_t *table,
                                    uint64_t cap, kvf_registry_dump_cb_t cb,
                                    void *arg)
{
    uint8_t packed[KVF_KEY_WIRE_SIZE];
    uint64_t i;
    unsigned k;

    for (i = 0; i < cap; i++) {
        const kvf_registry_entry_t *e = &table[i];
        kvf_key_t key;

        if (kvf_registry_entry_is_empty(e) || kvf_registry_entry_is_tomb(e)) {
            continue;
        }
        key.ns = e->ns;
        key.hi = e->hi;
        key.lo = e->lo;
        kvf_key_pack(&key, packed);
        for (k = 0; k < KVF_REGISTRY_INLINE; k++) {
            uint16_t h = kvf_registry_h(e, k);

            if (kvf_registry_slot_is_live(reg, h)) {
                cb(arg, h, packed);
            }
        }
    }
}

void kvf_registry_dump(const kvf_registry_t *reg, kvf_registry_dump_cb_t cb,
                       void *arg)
{
    if (reg->is_migrating) {
        kvf_registry_dump_table(reg, reg->old, reg->old_cap, cb, arg);
    }
    kvf_registry_dump_table(reg, reg->table, reg->cap, cb, arg);
}
