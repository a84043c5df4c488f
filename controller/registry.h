/* SPDX-License-Identifier: Apache-2.0 */
/* Copyright (c) 2026 The kvfabric authors */
/*
 * RegistryTree: key -> set of holder slots, in one open-addressing table.
 *
 * An entry is 32 bytes: the 24-byte key and four inline 16-bit holder slots.
 * A key held by more than four nodes takes a further entry with the same key
 * in the same probe run, so there is no per-key allocation and no overflow
 * structure. Deletion leaves a tombstone (entries never move between
 * rehashes), which is what lets a dead node be purged incrementally by a
 * cursor that walks the table in slices.
 *
 * Holders are "slots" (1..KVF_REGISTRY_MAX_SLOTS-1), not node ids: the node
 * table maps its nodes to slots. A slot that is closed stops counting at
 * once (lookups skip it) and is reused only after a purge pass has removed
 * it from every entry.
 *
 * thread: owning loop only. Ownership: the registry owns its table; keys
 * passed in are borrowed for the call.
 */
#ifndef KVF_CONTROLLER_REGISTRY_H
#define KVF_CONTROLLER_REGISTRY_H

#include <kvfabric/keys.h>
#include <kvfabric/status.h>

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define KVF_REGISTRY_MAX_SLOTS  4096u
#define KVF_REGISTRY_INLINE     4u
#define KVF_REGISTRY_MAX_CHOICE 16u /* holders considered per key */

typedef struct kvf_registry kvf_registry_t;

/* Where a holder keeps a key; the values are the wire's Medium. */
typedef enum {
    KVF_REGISTRY_HOST = 0, /* in its pool (it may be on its disk too) */
    KVF_REGISTRY_DISK = 1, /* on its local-disk tier only */
} kvf_registry_medium_t;

typedef enum {
    KVF_REGISTRY_SLOT_FREE = 0,
    KVF_REGISTRY_SLOT_LIVE,
    KVF_REGISTRY_SLOT_PURGING,
} kvf_registry_slot_state_t;

typedef struct kvf_registry_stats {
    uint64_t keys;          /* distinct keys with a live or purging holder */
    uint64_t entries;       /* used table entries */
    uint64_t tombstones;    /* deleted entries not yet reclaimed */
    uint64_t capacity;      /* table entries */
    uint64_t table_bytes;   /* memory of the table */
    uint64_t purge_backlog; /* holdings of purging slots still in the table */
    uint64_t disk_holdings; /* (key, holder) pairs on a disk tier only */
    uint32_t purging_slots;
    bool is_migrating; /* growing: entries move in purge steps */
} kvf_registry_stats_t;

/* Creates a registry sized for @p expected_keys (grows as needed) and able
 * to answer lookups of up to @p max_batch keys. */
kvf_status_t kvf_registry_create(uint64_t expected_keys, uint32_t max_batch,
                                 kvf_registry_t **reg_p);

/* Frees everything; NULL is a no-op. */
void kvf_registry_destroy(kvf_registry_t *reg);

/* Takes a free slot for a node; KVF_ERR_BUSY when all are live or purging. */
kvf_status_t kvf_registry_slot_open(kvf_registry_t *reg, uint16_t *slot_p);

/* Closes a live slot: its holdings stop counting now and are removed by
 * kvf_registry_purge_step(); the slot becomes free after that. */
void kvf_registry_slot_close(kvf_registry_t *reg, uint16_t slot);

kvf_registry_slot_state_t kvf_registry_slot_state(const kvf_registry_t *reg,
                                                  uint16_t slot);

/* Holdings (keys) of a slot. */
uint64_t kvf_registry_slot_keys(const kvf_registry_t *reg, uint16_t slot);

/* Load used for "least loaded" holder choice (lower is preferred). */
void kvf_registry_slot_set_load(kvf_registry_t *reg, uint16_t slot,
                                uint64_t load);

/* Excludes (or re-includes) a live slot from holder choice (draining). */
void kvf_registry_slot_set_excluded(kvf_registry_t *reg, uint16_t slot,
                                    bool excluded);

/* Adds @p slot as holder of @p n packed keys (KVF_KEY_WIRE_SIZE each).
 * *added_p: keys that were new for this slot. KVF_ERR_INVALID for a slot
 * that is not live; KVF_ERR_NO_MEMORY when the table cannot grow. */
kvf_status_t kvf_registry_admit(kvf_registry_t *reg, uint16_t slot,
                                const uint8_t *keys, size_t n, size_t *added_p);

/* As kvf_registry_admit, on @p medium: a key the slot already holds moves
 * to @p medium (not counted in *added_p). */
kvf_status_t kvf_registry_admit_medium(kvf_registry_t *reg, uint16_t slot,
                                       const uint8_t *keys, size_t n,
                                       kvf_registry_medium_t medium,
                                       size_t *added_p);

/* Holdings of a slot that are on its disk tier only. */
uint64_t kvf_registry_slot_disk_keys(const kvf_registry_t *reg, uint16_t slot);

/* Removes @p slot from @p n packed keys (whatever their medium);
 * *removed_p: keys it held. */
kvf_status_t kvf_registry_evict(kvf_registry_t *reg, uint16_t slot,
                                const uint8_t *keys, size_t n,
                                size_t *removed_p);

/*
 * Looks up @p n packed keys. Ordered (@p any_order false): the chain's
 * longest prefix held by some live holder; slots_out[i] is the chosen holder
 * for i < hit, 0 after. Any order: every key on its own, *hit_p counts the
 * held ones. Choice: @p requester when it holds the key (on any medium),
 * else a holder in memory before one on disk, then the holder that covers
 * the longest run from that key on, else the least loaded.
 * KVF_ERR_TOO_BIG when n is over the registry's max_batch.
 */
kvf_status_t kvf_registry_lookup(kvf_registry_t *reg, const uint8_t *keys,
                                 size_t n, uint16_t requester, bool any_order,
                                 uint16_t *slots_out, size_t *hit_p);

/* As kvf_registry_lookup; @p media_out (NULL: not wanted) gets the chosen
 * holder's kvf_registry_medium_t per key (HOST where none). */
kvf_status_t kvf_registry_lookup_media(kvf_registry_t *reg, const uint8_t *keys,
                                       size_t n, uint16_t requester,
                                       bool any_order, uint16_t *slots_out,
                                       uint8_t *media_out, size_t *hit_p);

/* Returns whether @p slot holds @p key (a live slot). */
bool kvf_registry_holds(const kvf_registry_t *reg, const kvf_key_t *key,
                        uint16_t slot);

/* Background work, up to @p budget table entries: first moving entries
 * into a grown table (growth never moves more than one key's entries
 * during a write), then removing purging slots. Returns non-zero while
 * work remains. */
uint32_t kvf_registry_purge_step(kvf_registry_t *reg, uint64_t budget);

/* Calls @p cb(@p arg, slot, packed key) for every (key, live holder)
 * pair, in one pass over the table (both tables while it grows). Admin
 * path (a standby's snapshot, controller/replica.c); @p cb must not change
 * the registry. */
typedef void (*kvf_registry_dump_cb_t)(void *arg, uint16_t slot,
                                       const uint8_t *key);
void kvf_registry_dump(const kvf_registry_t *reg, kvf_registry_dump_cb_t cb,
                       void *arg);

void kvf_registry_stats(const kvf_registry_t *reg,
                        kvf_registry_stats_t *stats_p);

#endif /* KVF_CONTROLLER_REGISTRY_H */
