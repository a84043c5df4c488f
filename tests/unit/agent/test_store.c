/* SPDX-License-Identifier: Apache-2.0 */
/* Copyright (c) 2026 The kvfabric authors */
#include "agent/store.h"
#include "tests/helpers/test_helpers.h"

#include <criterion/criterion.h>

#include <string.h>

#define CHUNK (64u << 10)

static kvf_store_t *g_store;
static int g_admits, g_evicts;

static void on_admit(void *arg, const kvf_key_t *key)
{
    g_admits++;
}

static void on_evict(void *arg, const kvf_key_t *key)
{
    g_evicts++;
}

static void store_setup(void)
{
    kvf_pool_params_t pp = {
        .field_mask = KVF_POOL_FIELD_SIZE | KVF_POOL_FIELD_MAX_CHUNK |
                      KVF_POOL_FIELD_MIN_CHUNK | KVF_POOL_FIELD_NO_HUGETLB,
        .size      = 8 * CHUNK,
        .min_chunk = CHUNK,
        .max_chunk = CHUNK,
    };
    kvf_store_params_t sp = {
        .pool = &pp, .admit_cb = on_admit, .evict_cb = on_evict};

    g_admits = g_evicts = 0;
    cr_assert_eq(kvf_store_create(&sp, &g_store), KVF_OK);
}

static void store_teardown(void)
{
    kvf_store_destroy(g_store);
    kvf_test_check_leaks();
}

TestSuite(store, .init = store_setup, .fini = store_teardown, .timeout = 10);

static kvf_key_t key_of(uint64_t i)
{
    kvf_key_t k = {7, 0, i};

    return k;
}

static void put_chunk(kvf_store_owner_t *o, uint64_t i, kvf_slot_t *slot_p)
{
    kvf_key_t k = key_of(i);
    uint8_t *p;

    cr_assert_eq(kvf_store_alloc(g_store, o, CHUNK, slot_p), KVF_OK);
    p = (uint8_t *)kvf_store_base(g_store) + slot_p->offset;
    memset(p, (int)i, CHUNK);
    cr_assert_eq(kvf_store_commit(g_store, o, &k, slot_p->offset,
                                  kvf_chunk_checksum(p, CHUNK)),
                 KVF_OK);
}

Test(store, grants_belong_to_their_owner)
{
    kvf_store_owner_t *a, *b;
    kvf_slot_t slot;
    kvf_key_t k = key_of(1);

    cr_assert_eq(kvf_store_owner_create(g_store, &a), KVF_OK);
    cr_assert_eq(kvf_store_owner_create(g_store, &b), KVF_OK);
    cr_assert_eq(kvf_store_alloc(g_store, a, CHUNK, &slot), KVF_OK);
    cr_assert_eq(kvf_store_commit(g_store, b, &k, slot.offset, 0),
                 KVF_ERR_RANGE);
    cr_assert_eq(kvf_store_release(g_store, b, slot.offset), KVF_ERR_RANGE);
    cr_assert_eq(kvf_store_local_prefix(g_store, &k, 1), 0,
                 "a grant is invisible");
    kvf_store_owner_destroy(g_store, b);
    kvf_store_owner_destroy(g_store, a); /* frees the grant */
}

Test(store, commit_checks_checksum_and_duplicates)
{
    kvf_store_owner_t *o;
    kvf_slot_t slot, again;
    kvf_key_t k = key_of(2);

    cr_assert_eq(kvf_store_owner_create(g_store, &o), KVF_OK);
    cr_assert_eq(kvf_store_alloc(g_store, o, CHUNK, &slot), KVF_OK);
    cr_assert_eq(kvf_store_commit(g_store, o, &k, slot.offset, 12345),
                 KVF_ERR_CHECKSUM);
    cr_assert_eq(kvf_store_commit(g_store, o, &k, slot.offset, 12345),
                 KVF_ERR_RANGE, "a failed grant is gone");
    put_chunk(o, 2, &slot);
    cr_assert_eq(g_admits, 1);
    cr_assert_eq(kvf_store_alloc(g_store, o, CHUNK, &again), KVF_OK);
    memset((uint8_t *)kvf_store_base(g_store) + again.offset, 2, CHUNK);
    cr_assert_eq(
        kvf_store_commit(g_store, o, &k, again.offset,
                         kvf_chunk_checksum((uint8_t *)kvf_store_base(g_store) +
                                                again.offset,
                                            CHUNK)),
        KVF_ERR_EXISTS);
    cr_assert_eq(g_admits, 1);
    kvf_store_owner_destroy(g_store, o);
}

Test(store, pins_count_per_owner_and_block_eviction)
{
    kvf_store_owner_t *w, *r;
    kvf_slot_t slots[9], pin, extra;
    kvf_key_t k7 = key_of(7);
    uint64_t i;

    cr_assert_eq(kvf_store_owner_create(g_store, &w), KVF_OK);
    cr_assert_eq(kvf_store_owner_create(g_store, &r), KVF_OK);
    for (i = 0; i < 8; i++) {
        put_chunk(w, i, &slots[i]);
    }
    /* filling the pool past its high watermark evicted the oldest */
    cr_assert_gt(g_evicts, 0);
    /* the same reader pins the newest chunk twice: two releases needed */
    cr_assert_eq(kvf_store_pin(g_store, r, &k7, &pin), KVF_OK);
    cr_assert_eq(kvf_store_pin(g_store, r, &k7, &pin), KVF_OK);
    cr_assert_eq(kvf_store_release(g_store, r, pin.offset), KVF_OK);
    cr_assert_eq(kvf_store_release(g_store, r, pin.offset), KVF_OK);
    cr_assert_eq(kvf_store_release(g_store, r, pin.offset), KVF_ERR_RANGE);
    /* there is always room again: unpinned chunks make way */
    cr_assert_eq(kvf_store_alloc(g_store, w, CHUNK, &extra), KVF_OK);
    kvf_store_owner_destroy(g_store, r);
    kvf_store_owner_destroy(g_store, w);
}

Test(store, hard_pin_survives_clear_and_unpin_releases_it)
{
    kvf_store_owner_t *o;
    kvf_slot_t slot;
    kvf_key_t keys[3] = {key_of(10), key_of(11), key_of(99)};

    cr_assert_eq(kvf_store_owner_create(g_store, &o), KVF_OK);
    put_chunk(o, 10, &slot);
    put_chunk(o, 11, &slot);
    cr_assert_eq(kvf_store_set_pin(g_store, keys, 3, KVF_POOL_PIN_HARD), 2,
                 "the unknown key is skipped");
    cr_assert_eq(kvf_store_set_pin(g_store, &keys[1], 1, KVF_POOL_PIN_NONE), 1);
    cr_assert_eq(kvf_store_clear(g_store), 1);
    cr_assert_eq(kvf_store_local_prefix(g_store, keys, 1), 1,
                 "the pinned chunk stays");
    cr_assert_eq(kvf_store_local_prefix(g_store, &keys[1], 1), 0);
    kvf_store_owner_destroy(g_store, o);
}

Test(store, oversized_alloc)
{
    kvf_store_owner_t *o;
    kvf_slot_t slot;

    cr_assert_eq(kvf_store_owner_create(g_store, &o), KVF_OK);
    cr_assert_eq(kvf_store_alloc(g_store, o, CHUNK + 1, &slot),
                 KVF_ERR_TOO_BIG);
    cr_assert_eq(kvf_store_alloc(g_store, o, 0, &slot), KVF_ERR_TOO_BIG);
    kvf_store_owner_destroy(g_store, o);
}

Test(store, grants_not_committed_in_time_are_taken_back)
{
    kvf_pool_params_t pp = {
        .field_mask = KVF_POOL_FIELD_SIZE | KVF_POOL_FIELD_MAX_CHUNK |
                      KVF_POOL_FIELD_MIN_CHUNK | KVF_POOL_FIELD_NO_HUGETLB,
        .size      = 8 * CHUNK,
        .min_chunk = CHUNK,
        .max_chunk = CHUNK,
    };
    kvf_store_params_t sp = {.pool = &pp, .grant_timeout_ns = 1000000};
    kvf_store_owner_t *o;
    kvf_store_stats_t st;
    kvf_store_t *store;
    kvf_slot_t a, b, c;
    kvf_key_t k = key_of(5);
    uint8_t *p;

    cr_assert_eq(kvf_store_create(&sp, &store), KVF_OK);
    cr_assert_eq(kvf_store_owner_create(store, &o), KVF_OK);
    cr_assert_eq(kvf_store_alloc(store, o, CHUNK, &a), KVF_OK);
    cr_assert_eq(kvf_store_alloc(store, o, CHUNK, &b), KVF_OK);
    cr_assert_eq(kvf_store_expire_grants(store, 0), 0, "not yet");
    /* a third grant, committed in time: not taken back */
    cr_assert_eq(kvf_store_alloc(store, o, CHUNK, &c), KVF_OK);
    p = (uint8_t *)kvf_store_base(store) + c.offset;
    memset(p, 3, CHUNK);
    cr_assert_eq(
        kvf_store_commit(store, o, &k, c.offset, kvf_chunk_checksum(p, CHUNK)),
        KVF_OK);
    cr_assert_eq(kvf_store_expire_grants(store, UINT64_MAX - 1), 2);
    cr_assert_eq(kvf_store_commit(store, o, &k, a.offset, 0), KVF_ERR_RANGE,
                 "an expired grant can no longer be committed");
    kvf_store_get_stats(store, &st);
    cr_assert_eq(st.expired_grants, 2);
    cr_assert_eq(st.pool.used, CHUNK, "only the committed chunk is left");
    cr_assert_eq(kvf_store_local_prefix(store, &k, 1), 1);
    kvf_store_owner_destroy(store, o);
    kvf_store_destroy(store);
}

Test(store, owner_table_growth_keeps_the_owner_list)
{
    kvf_pool_params_t pp = {
        .field_mask = KVF_POOL_FIELD_SIZE | KVF_POOL_FIELD_MAX_CHUNK |
                      KVF_POOL_FIELD_MIN_CHUNK | KVF_POOL_FIELD_NO_HUGETLB,
        .size      = 64 * CHUNK,
        .min_chunk = CHUNK,
        .max_chunk = CHUNK,
    };
    kvf_store_params_t sp = {.pool = &pp, .grant_timeout_ns = 1000000};
    kvf_store_owner_t *a, *b, *c;
    kvf_store_stats_t st;
    kvf_store_t *store;
    kvf_slot_t slot;
    int i;

    cr_assert_eq(kvf_store_create(&sp, &store), KVF_OK);
    cr_assert_eq(kvf_store_owner_create(store, &a), KVF_OK);
    cr_assert_eq(kvf_store_owner_create(store, &b), KVF_OK);
    cr_assert_eq(kvf_store_owner_create(store, &c), KVF_OK);
    /* b's hold table grows twice (16 -> 32 -> 64 slots) */
    for (i = 0; i < 20; i++) {
        cr_assert_eq(kvf_store_alloc(store, b, CHUNK, &slot), KVF_OK);
    }
    cr_assert_eq(kvf_store_alloc(store, a, CHUNK, &slot), KVF_OK);
    cr_assert_eq(kvf_store_alloc(store, c, CHUNK, &slot), KVF_OK);
    /* the sweep walks every owner: all 22 grants, none missed */
    cr_assert_eq(kvf_store_expire_grants(store, UINT64_MAX - 1), 22);
    kvf_store_owner_destroy(store, b); /* unlink the grown owner first */
    kvf_store_owner_destroy(store, a);
    kvf_store_owner_destroy(store, c);
    kvf_store_get_stats(store, &st);
    cr_assert_eq(st.owners, 0);
    cr_assert_eq(st.pool.used, 0);
    kvf_store_destroy(store);
}

static unsigned g_listed;

static void count_key(void *arg, const kvf_key_t *key)
{
    (void)arg;
    (void)key;
    g_listed++;
}

/* A chunk found damaged while a send to a peer holds it is announced
 * evicted at once (listed nowhere, a miss) and dropped when that send puts
 * it back. */
Test(store, damaged_while_held_is_dropped_when_put_back)
{
    kvf_pool_entry_t *entry = NULL;
    kvf_store_owner_t *o;
    kvf_slot_t slot;
    kvf_key_t k = key_of(5);

    cr_assert_eq(kvf_store_owner_create(g_store, &o), KVF_OK);
    put_chunk(o, 5, &slot);
    kvf_store_owner_destroy(g_store, o);
    cr_assert_eq(kvf_store_hold_chunk(g_store, &k, &entry), KVF_OK);
    ((uint8_t *)kvf_store_base(g_store))[slot.offset + 3] ^= 0x10;
    cr_assert_eq(kvf_store_verify(g_store, &k), KVF_ERR_CHECKSUM);
    /* held: it cannot go yet, but the registry is told now, no inventory
     * lists it and no engine's lookup counts it */
    cr_assert_eq(g_evicts, 1);
    cr_assert_eq(kvf_store_local_prefix(g_store, &k, 1), 0);
    g_listed = 0;
    kvf_store_foreach_key(g_store, count_key, NULL);
    cr_assert_eq(g_listed, 0);
    kvf_store_put_chunk(g_store, entry);
    cr_assert_eq(g_evicts, 1, "announced once");
    cr_assert_eq(kvf_store_local_prefix(g_store, &k, 1), 0);
}

/* A damaged chunk another engine pins leaves the index at once: it is
 * counted once however often it is asked (twice in one retrieve, again
 * later), announced evicted once, a miss, and its key can be stored again
 * with fresh bytes while the old block waits for that engine to let go. */
Test(store, damaged_while_pinned_is_counted_once_and_goes_with_the_pin)
{
    kvf_key_t k = key_of(6), twice[2] = {key_of(6), key_of(6)};
    kvf_store_owner_t *a, *b, *c;
    kvf_status_t results[2];
    kvf_store_stats_t st;
    kvf_slot_t slot, slots[2], fresh;
    uint64_t sums[2], used;

    cr_assert_eq(kvf_store_owner_create(g_store, &a), KVF_OK);
    cr_assert_eq(kvf_store_owner_create(g_store, &b), KVF_OK);
    cr_assert_eq(kvf_store_owner_create(g_store, &c), KVF_OK);
    put_chunk(a, 6, &slot);
    cr_assert_eq(kvf_store_pin(g_store, a, &k, &slot), KVF_OK);
    ((uint8_t *)kvf_store_base(g_store))[slot.offset + 100] ^= 0x01;

    cr_assert_eq(
        kvf_store_pin_checked(g_store, b, twice, 2, slots, sums, results),
        KVF_OK);
    cr_assert_eq(results[0], KVF_ERR_CHECKSUM);
    cr_assert_eq(results[1], KVF_ERR_CHECKSUM);
    kvf_store_get_stats(g_store, &st);
    cr_assert_eq(st.checksum_failures, 1);
    cr_assert_eq(g_evicts, 1, "pinned by a: announced now, goes later");

    /* asked again while a still pins it: a miss, not counted again */
    cr_assert_eq(kvf_store_pin_checked(g_store, c, &k, 1, slots, sums, results),
                 KVF_OK);
    cr_assert_eq(results[0], KVF_ERR_NOT_FOUND);
    cr_assert_eq(kvf_store_verify(g_store, &k), KVF_OK, "dropped already");
    /* and an engine's lookup does not count it as held */
    cr_assert_eq(kvf_store_local_prefix(g_store, &k, 1), 0);
    cr_assert_eq(kvf_store_tier_prefix(g_store, &k, 1), 0);
    kvf_store_get_stats(g_store, &st);
    cr_assert_eq(st.checksum_failures, 1);
    cr_assert_eq(g_evicts, 1);

    /* stored again meanwhile: fresh bytes in another block, served */
    kvf_store_get_stats(g_store, &st);
    used = st.pool.used;
    cr_assert_eq(st.pool.detached, 1);
    put_chunk(c, 6, &fresh);
    cr_assert_neq(fresh.offset, slot.offset);
    cr_assert_eq(kvf_store_local_prefix(g_store, &k, 1), 1);
    cr_assert_eq(kvf_store_pin_checked(g_store, b, &k, 1, slots, sums, results),
                 KVF_OK);
    cr_assert_eq(results[0], KVF_OK);
    cr_assert_eq(slots[0].offset, fresh.offset);
    cr_assert_eq(kvf_store_release(g_store, b, fresh.offset), KVF_OK);

    /* a still reads the old block; its pin was the last reference */
    cr_assert_eq(((uint8_t *)kvf_store_base(g_store))[slot.offset + 100],
                 6 ^ 0x01);
    cr_assert_eq(kvf_store_release(g_store, a, slot.offset), KVF_OK);
    cr_assert_eq(kvf_store_release(g_store, a, slot.offset), KVF_ERR_RANGE);
    kvf_store_get_stats(g_store, &st);
    cr_assert_eq(st.checksum_failures, 1);
    cr_assert_eq(st.pool.detached, 0);
    cr_assert_eq(st.pool.used, used,
                 "the old block went, the fresh one "
                 "took one");
    cr_assert_eq(g_evicts, 1);
    cr_assert_eq(kvf_store_local_prefix(g_store, &k, 1), 1);
    kvf_store_owner_destroy(g_store, c);
    kvf_store_owner_destroy(g_store, b);
    kvf_store_owner_destroy(g_store, a);
}

/* A chunk that landed from elsewhere (kvf_store_commit_landed: a peer's
 * transfer, hashed where it lies) is not hashed again by its first
 * retrieve, and is by every later one: bytes changed after that first
 * read are a miss. */
Test(store, a_landed_chunk_is_hashed_by_every_read_after_its_first)
{
    kvf_key_t k = key_of(8);
    kvf_store_owner_t *f, *r;
    kvf_slot_t slot, got;
    kvf_status_t result;
    kvf_store_stats_t st;
    uint64_t sum;
    uint8_t *p;

    cr_assert_eq(kvf_store_owner_create(g_store, &f), KVF_OK);
    cr_assert_eq(kvf_store_owner_create(g_store, &r), KVF_OK);
    cr_assert_eq(kvf_store_alloc(g_store, f, CHUNK, &slot), KVF_OK);
    p = (uint8_t *)kvf_store_base(g_store) + slot.offset;
    memset(p, 8, CHUNK);
    cr_assert_eq(kvf_store_commit_landed(g_store, f, &k, slot.offset, 12345),
                 KVF_ERR_CHECKSUM, "landed bytes are hashed at commit");
    cr_assert_eq(kvf_store_alloc(g_store, f, CHUNK, &slot), KVF_OK);
    p = (uint8_t *)kvf_store_base(g_store) + slot.offset;
    memset(p, 8, CHUNK);
    sum = kvf_chunk_checksum(p, CHUNK);
    cr_assert_eq(kvf_store_commit_landed(g_store, f, &k, slot.offset, sum),
                 KVF_OK);

    cr_assert_eq(kvf_store_pin_checked(g_store, r, &k, 1, &got, &sum, &result),
                 KVF_OK);
    cr_assert_eq(result, KVF_OK);
    cr_assert_eq(got.offset, slot.offset);
    cr_assert_eq(kvf_store_release(g_store, r, got.offset), KVF_OK);

    p[CHUNK - 1] ^= 0x80;
    cr_assert_eq(kvf_store_pin_checked(g_store, r, &k, 1, &got, &sum, &result),
                 KVF_OK);
    cr_assert_eq(result, KVF_ERR_CHECKSUM, "the second read hashes it");
    kvf_store_get_stats(g_store, &st);
    cr_assert_eq(st.checksum_failures, 2);
    cr_assert_eq(kvf_store_local_prefix(g_store, &k, 1), 0);
    kvf_store_owner_destroy(g_store, r);
    kvf_store_owner_destroy(g_store, f);
}
