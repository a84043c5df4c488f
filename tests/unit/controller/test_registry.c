/* SPDX-License-Identifier: Apache-2.0 */
/* Copyright (c) 2026 The kvfabric authors */
#include "controller/registry.h"
#include "tests/helpers/test_helpers.h"

#include <criterion/criterion.h>

#include <stdlib.h>
#include <string.h>

static kvf_registry_t *g_reg;

static void registry_setup(void)
{
    cr_assert_eq(kvf_registry_create(0, 1024, &g_reg), KVF_OK);
}

static void registry_teardown(void)
{
    kvf_registry_destroy(g_reg);
    kvf_test_check_leaks();
}

TestSuite(registry, .init = registry_setup, .fini = registry_teardown,
          .timeout = 30);

/* Packs keys (ns 1, digest i + base) into buf. */
static void make_keys(uint8_t *buf, size_t n, uint64_t base)
{
    size_t i;

    for (i = 0; i < n; i++) {
        kvf_key_t k = {.ns = 1, .hi = 0xabc, .lo = base + i};

        kvf_key_pack(&k, buf + i * KVF_KEY_WIRE_SIZE);
    }
}

static uint16_t open_slot(void)
{
    uint16_t s = 0;

    cr_assert_eq(kvf_registry_slot_open(g_reg, &s), KVF_OK);
    cr_assert_neq(s, 0);
    return s;
}

static void admit(uint16_t s, uint64_t base, size_t n)
{
    uint8_t *keys = malloc(n * KVF_KEY_WIRE_SIZE);
    size_t added;

    make_keys(keys, n, base);
    cr_assert_eq(kvf_registry_admit(g_reg, s, keys, n, &added), KVF_OK);
    free(keys);
}

static size_t lookup(uint64_t base, size_t n, uint16_t req, bool any,
                     uint16_t *out)
{
    uint8_t keys[64 * KVF_KEY_WIRE_SIZE];
    size_t hit = 0;

    cr_assert(n <= 64);
    make_keys(keys, n, base);
    cr_assert_eq(kvf_registry_lookup(g_reg, keys, n, req, any, out, &hit),
                 KVF_OK);
    return hit;
}

Test(registry, admit_lookup_evict)
{
    uint16_t a = open_slot(), out[8];
    uint8_t keys[8 * KVF_KEY_WIRE_SIZE];
    size_t n;

    make_keys(keys, 8, 100);
    cr_assert_eq(kvf_registry_admit(g_reg, a, keys, 8, &n), KVF_OK);
    cr_assert_eq(n, 8);
    cr_assert_eq(kvf_registry_admit(g_reg, a, keys, 8, &n), KVF_OK);
    cr_assert_eq(n, 0, "re-admit is idempotent");
    cr_assert_eq(kvf_registry_slot_keys(g_reg, a), 8);
    cr_assert_eq(lookup(100, 8, 0, false, out), 8);
    cr_assert_eq(out[7], a);
    cr_assert_eq(
        kvf_registry_evict(g_reg, a, keys + 3 * KVF_KEY_WIRE_SIZE, 1, &n),
        KVF_OK);
    cr_assert_eq(n, 1);
    cr_assert_eq(lookup(100, 8, 0, false, out), 3, "chain stops at the gap");
    cr_assert_eq(out[3], 0);
    cr_assert_eq(lookup(100, 8, 0, true, out), 7, "any order skips the gap");
    cr_assert_eq(out[3], 0);
    cr_assert_eq(out[4], a);
    cr_assert_eq(
        kvf_registry_evict(g_reg, a, keys + 3 * KVF_KEY_WIRE_SIZE, 1, &n),
        KVF_OK);
    cr_assert_eq(n, 0);
}

Test(registry, admit_to_closed_slot_is_invalid)
{
    uint8_t keys[KVF_KEY_WIRE_SIZE];
    size_t n;

    make_keys(keys, 1, 0);
    cr_assert_eq(kvf_registry_admit(g_reg, 7, keys, 1, &n), KVF_ERR_INVALID);
    cr_assert_eq(kvf_registry_evict(g_reg, 0, keys, 1, &n), KVF_ERR_INVALID);
}

Test(registry, lookup_over_max_batch)
{
    uint8_t *keys = calloc(2048, KVF_KEY_WIRE_SIZE);
    uint16_t *out = calloc(2048, sizeof(*out));
    size_t hit;

    cr_assert_eq(kvf_registry_lookup(g_reg, keys, 2048, 0, false, out, &hit),
                 KVF_ERR_TOO_BIG);
    free(out);
    free(keys);
}

Test(registry, holder_choice_prefers_requester)
{
    uint16_t a = open_slot(), b = open_slot(), out[4];

    admit(a, 0, 4);
    admit(b, 0, 4);
    cr_assert_eq(lookup(0, 4, b, false, out), 4);
    cr_assert_eq(out[0], b);
    cr_assert_eq(out[3], b);
    cr_assert_eq(lookup(0, 4, a, false, out), 4);
    cr_assert_eq(out[0], a);
}

Test(registry, holder_choice_longest_run_then_least_loaded)
{
    uint16_t a = open_slot(), b = open_slot(), c = open_slot(), out[10];

    /* a holds 0..3, b holds 0..9, c holds 6..9 */
    admit(a, 0, 4);
    admit(b, 0, 10);
    admit(c, 6, 4);
    cr_assert_eq(lookup(0, 10, 0, false, out), 10);
    for (int i = 0; i < 10; i++) {
        cr_assert_eq(out[i], b, "key %d: b covers the longest run", i);
    }
    /* prefix assembled from several holders: a 0..3, c 4..9 */
    {
        uint16_t d = open_slot(), e = open_slot();

        admit(d, 100, 4);
        admit(e, 104, 6);
        cr_assert_eq(lookup(100, 10, 0, false, out), 10);
        cr_assert_eq(out[0], d);
        cr_assert_eq(out[3], d);
        cr_assert_eq(out[4], e);
        cr_assert_eq(out[9], e);
    }
    /* equal runs: least loaded wins */
    {
        uint16_t f = open_slot(), g = open_slot();

        admit(f, 200, 4);
        admit(g, 200, 4);
        kvf_registry_slot_set_load(g_reg, f, 900);
        kvf_registry_slot_set_load(g_reg, g, 100);
        cr_assert_eq(lookup(200, 4, 0, false, out), 4);
        cr_assert_eq(out[0], g);
        kvf_registry_slot_set_load(g_reg, f, 10);
        cr_assert_eq(lookup(200, 4, 0, true, out), 4);
        cr_assert_eq(out[0], f, "any-order uses least loaded too");
    }
}

Test(registry, many_holders_of_one_key)
{
    uint16_t s[9], out[1];
    int i;

    for (i = 0; i < 9; i++) {
        s[i] = open_slot();
        admit(s[i], 0, 1);
    }
    for (i = 0; i < 9; i++) {
        kvf_key_t k = {.ns = 1, .hi = 0xabc, .lo = 0};

        cr_assert(kvf_registry_holds(g_reg, &k, s[i]), "holder %d", i);
    }
    cr_assert_eq(lookup(0, 1, s[8], false, out), 1);
    cr_assert_eq(out[0], s[8]);
}

Test(registry, excluded_slot_is_not_chosen)
{
    uint16_t a = open_slot(), out[2];

    admit(a, 0, 2);
    kvf_registry_slot_set_excluded(g_reg, a, true);
    cr_assert_eq(lookup(0, 2, 0, false, out), 0);
    kvf_registry_slot_set_excluded(g_reg, a, false);
    cr_assert_eq(lookup(0, 2, 0, false, out), 2);
}

Test(registry, close_hides_at_once_and_purges_incrementally)
{
    uint16_t a = open_slot(), b = open_slot(), out[4];
    kvf_registry_stats_t st;
    unsigned steps = 0;

    admit(a, 0, 5000);
    admit(b, 0, 2);
    kvf_registry_slot_close(g_reg, a);
    cr_assert_eq(kvf_registry_slot_state(g_reg, a), KVF_REGISTRY_SLOT_PURGING);
    cr_assert_eq(lookup(0, 4, 0, false, out), 2, "a's keys gone at once");
    cr_assert_eq(out[0], b);
    kvf_registry_stats(g_reg, &st);
    cr_assert_eq(st.purge_backlog, 5000);
    while (kvf_registry_purge_step(g_reg, 1024) > 0) {
        steps++;
        cr_assert(steps < 1000);
    }
    cr_assert(steps > 1, "purge ran in slices");
    kvf_registry_stats(g_reg, &st);
    cr_assert_eq(st.purge_backlog, 0);
    cr_assert_eq(st.entries, 2);
    cr_assert_eq(kvf_registry_slot_state(g_reg, a), KVF_REGISTRY_SLOT_FREE);
    cr_assert_eq(kvf_registry_slot_keys(g_reg, b), 2);
}

Test(registry, slot_closed_mid_pass_waits_for_next_pass)
{
    uint16_t a = open_slot(), b = open_slot();
    kvf_registry_stats_t st;

    admit(a, 0, 3000);
    admit(b, 10000, 3000);
    kvf_registry_slot_close(g_reg, a);
    kvf_registry_purge_step(g_reg, 512);
    kvf_registry_slot_close(g_reg, b);
    while (kvf_registry_purge_step(g_reg, 512) > 0) {
    }
    kvf_registry_stats(g_reg, &st);
    cr_assert_eq(st.purge_backlog, 0);
    cr_assert_eq(st.entries, 0);
    cr_assert_eq(kvf_registry_slot_state(g_reg, b), KVF_REGISTRY_SLOT_FREE);
}

Test(registry, grows_incrementally_and_purges_after)
{
    uint16_t a = open_slot(), b = open_slot(), out[64];
    kvf_registry_stats_t st;

    admit(a, 0, 1000);
    kvf_registry_slot_close(g_reg, a);
    admit(b, 0, 300000); /* grows several times */
    kvf_registry_stats(g_reg, &st);
    cr_assert(st.is_migrating, "growth moves entries in steps");
    cr_assert_eq(lookup(299000, 64, 0, false, out), 64,
                 "lookups see both tables while growing");
    while (kvf_registry_purge_step(g_reg, 4096) > 0) {
    }
    kvf_registry_stats(g_reg, &st);
    cr_assert_not(st.is_migrating);
    cr_assert_eq(st.purge_backlog, 0);
    cr_assert_eq(kvf_registry_slot_state(g_reg, a), KVF_REGISTRY_SLOT_FREE);
    cr_assert_eq(st.entries, 300000);
    cr_assert(st.table_bytes / st.entries <= 64, "%lu bytes per key",
              (unsigned long)(st.table_bytes / st.entries));
    cr_assert_eq(lookup(299000, 64, 0, false, out), 64);
}

/* The table is sized to its keys, not to a power of two: between 43 and
 * 64 bytes a key once past a few huge pages, at every count (doubling
 * cost up to 85, e.g. 72 B/key of RSS at 2 M keys). */
Test(registry, table_bytes_per_key_stay_between_growths)
{
    uint16_t a = open_slot();
    kvf_registry_stats_t st;
    uint64_t n = 0, step = 20000, min_bpk = 1000, max_bpk = 0, grew = 0;
    uint64_t cap = 0, bpk;

    while (n < 1200000) {
        admit(a, n, step);
        n += step;
        while (kvf_registry_purge_step(g_reg, 1u << 20) > 0) {
        }
        kvf_registry_stats(g_reg, &st);
        cr_assert_eq(st.entries, n);
        cr_assert_leq(st.entries * 4, st.capacity * 3, "at most 3/4 full");
        if (st.capacity != cap) {
            grew++;
            cap = st.capacity;
        }
        if (n < 200000) {
            continue; /* small tables round up to whole huge pages */
        }
        bpk = st.table_bytes / n;
        cr_assert_leq(bpk, 64, "%lu keys: %lu table bytes a key",
                      (unsigned long)n, (unsigned long)bpk);
        min_bpk = bpk < min_bpk ? bpk : min_bpk;
        max_bpk = bpk > max_bpk ? bpk : max_bpk;
    }
    cr_assert_geq(grew, 5, "grew by 1.5x steps, not doublings");
    cr_assert_geq(min_bpk, 42);
    cr_assert_geq(max_bpk, 55, "just after a growth the table is half full");
}

Test(registry, tombstones_are_reused)
{
    uint16_t a = open_slot();
    kvf_registry_stats_t st, st2;
    uint8_t *keys = malloc(500 * KVF_KEY_WIRE_SIZE);
    size_t n;
    int round;

    make_keys(keys, 500, 0);
    kvf_registry_stats(g_reg, &st);
    for (round = 0; round < 50; round++) {
        cr_assert_eq(kvf_registry_admit(g_reg, a, keys, 500, &n), KVF_OK);
        cr_assert_eq(kvf_registry_evict(g_reg, a, keys, 500, &n), KVF_OK);
        cr_assert_eq(n, 500);
    }
    kvf_registry_stats(g_reg, &st2);
    cr_assert_eq(st2.entries, 0);
    cr_assert_eq(st2.capacity, st.capacity, "churn does not grow the table");
    free(keys);
}

Test(registry, slots_run_out)
{
    uint16_t s;
    unsigned i;

    for (i = 1; i < KVF_REGISTRY_MAX_SLOTS; i++) {
        cr_assert_eq(kvf_registry_slot_open(g_reg, &s), KVF_OK);
    }
    kvf_test_log_capture_start();
    cr_assert_eq(kvf_registry_slot_open(g_reg, &s), KVF_ERR_BUSY);
    kvf_test_log_capture_stop();
    cr_assert(kvf_test_log_contains("holder slots in use"));
}

Test(registry, evicting_first_entry_keeps_later_holders)
{
    kvf_key_t k = {.ns = 1, .hi = 0xabc, .lo = 0};
    uint16_t s[9], out[1];
    uint8_t key[KVF_KEY_WIRE_SIZE];
    size_t n;
    int i;

    make_keys(key, 1, 0);
    for (i = 0; i < 9; i++) {
        s[i] = open_slot();
        admit(s[i], 0, 1);
    }
    /* empty the first entry: later entries of the key must still count */
    for (i = 0; i < 4; i++) {
        cr_assert_eq(kvf_registry_evict(g_reg, s[i], key, 1, &n), KVF_OK);
        cr_assert_eq(n, 1);
    }
    for (i = 4; i < 9; i++) {
        cr_assert(kvf_registry_holds(g_reg, &k, s[i]), "holder %d", i);
    }
    cr_assert_eq(lookup(0, 1, s[8], false, out), 1);
    cr_assert_eq(out[0], s[8]);
    /* re-admit fills the free places, no duplicate holder */
    admit(s[0], 0, 1);
    admit(s[0], 0, 1);
    cr_assert_eq(kvf_registry_slot_keys(g_reg, s[0]), 1);
    for (i = 4; i < 9; i++) {
        cr_assert_eq(kvf_registry_evict(g_reg, s[i], key, 1, &n), KVF_OK);
        cr_assert_eq(n, 1, "holder %d", i);
    }
    cr_assert_eq(lookup(0, 1, 0, false, out), 1);
    cr_assert_eq(out[0], s[0]);
}

Test(registry, purge_of_many_holders_keeps_the_live_ones)
{
    kvf_key_t k = {.ns = 1, .hi = 0xabc, .lo = 5};
    uint16_t s[6];
    int i;

    for (i = 0; i < 6; i++) {
        s[i] = open_slot();
        admit(s[i], 0, 10);
    }
    kvf_registry_slot_close(g_reg, s[0]);
    kvf_registry_slot_close(g_reg, s[5]);
    while (kvf_registry_purge_step(g_reg, 100) > 0) {
    }
    for (i = 1; i < 5; i++) {
        cr_assert(kvf_registry_holds(g_reg, &k, s[i]));
        cr_assert_eq(kvf_registry_slot_keys(g_reg, s[i]), 10);
    }
    /* a freed slot is reused and starts empty */
    cr_assert_eq(open_slot(), s[0]);
    cr_assert_not(kvf_registry_holds(g_reg, &k, s[0]));
}

Test(registry, writes_during_growth_see_one_table)
{
    uint16_t a = open_slot(), b = open_slot(), out[64];
    kvf_registry_stats_t st;
    uint8_t keys[64 * KVF_KEY_WIRE_SIZE];
    size_t n;

    admit(a, 0, 700);
    admit(b, 600, 200); /* the 768th entry starts growing the 1024 table */
    kvf_registry_stats(g_reg, &st);
    cr_assert(st.is_migrating);
    /* write keys whose entries may still be in the old table */
    make_keys(keys, 64, 0);
    cr_assert_eq(kvf_registry_admit(g_reg, a, keys, 64, &n), KVF_OK);
    cr_assert_eq(n, 0, "already held: no duplicate across tables");
    make_keys(keys, 64, 600);
    cr_assert_eq(kvf_registry_evict(g_reg, b, keys, 64, &n), KVF_OK);
    cr_assert_eq(n, 64);
    kvf_registry_slot_close(g_reg, a); /* its purge waits for the move */
    cr_assert_eq(lookup(600, 64, 0, true, out), 0);
    cr_assert_eq(lookup(664, 64, 0, false, out), 64);
    cr_assert_eq(out[63], b);
    while (kvf_registry_purge_step(g_reg, 100) > 0) {
    }
    kvf_registry_stats(g_reg, &st);
    cr_assert_not(st.is_migrating);
    cr_assert_eq(st.purge_backlog, 0);
    cr_assert_eq(st.entries, 136);
    cr_assert_eq(kvf_registry_slot_state(g_reg, a), KVF_REGISTRY_SLOT_FREE);
    cr_assert_eq(kvf_registry_slot_keys(g_reg, b), 136);
    cr_assert_eq(lookup(664, 64, 0, false, out), 64);
    cr_assert_eq(lookup(0, 64, 0, true, out), 0);
}

typedef struct dump_seen {
    uint16_t a;
    bool *seen; /* [N] keys of slot a */
    uint64_t of_a, of_others;
} dump_seen_t;

static void dump_one(void *arg, uint16_t slot, const uint8_t *key)
{
    dump_seen_t *d = arg;
    kvf_key_t k;

    kvf_key_unpack(key, &k);
    if (slot != d->a) {
        d->of_others++;
        return;
    }
    cr_assert_lt(k.lo, 3000, "a key of another slot");
    cr_assert(!d->seen[k.lo], "key %llu twice", (unsigned long long)k.lo);
    d->seen[k.lo] = true;
    d->of_a++;
}

/* kvf_registry_dump: every (key, live holder) pair exactly once, also
 * while the table grows (entries in both tables), a key of five holders
 * (two entries) for each, and nothing of a closed slot. */
Test(registry, dump_lists_every_key_and_holder_once)
{
    enum {
        N = 3000
    };
    uint16_t a = open_slot(), b = open_slot(), c = open_slot(), extra[3];
    dump_seen_t d = {.a = a};
    kvf_registry_stats_t st;
    bool grew = false;
    size_t i;

    d.seen = calloc(N, sizeof(*d.seen));
    for (i = 0; i < 3; i++) {
        extra[i] = open_slot();
        admit(extra[i], 0, 1); /* key 0: a, b and three more holders */
    }
    for (i = 0; i < N; i += 100) {
        admit(a, i, 100); /* grows: migration in progress below */
        kvf_registry_stats(g_reg, &st);
        grew = grew || st.is_migrating;
    }
    admit(b, 0, 1);
    admit(b, N, 50);
    admit(c, N + 100, 10);
    kvf_registry_slot_close(g_reg, c); /* purging: not listed */
    cr_assert(grew, "the table grew while filling");
    kvf_registry_stats(g_reg, &st);
    cr_assert(st.is_migrating, "the dump runs during the move");
    kvf_registry_dump(g_reg, dump_one, &d);
    cr_assert_eq(d.of_a, N);
    cr_assert_eq(d.of_others, 51 + 3);
    free(d.seen);
}

static void admit_on(uint16_t s, uint64_t base, size_t n,
                     kvf_registry_medium_t medium, size_t *added_p)
{
    uint8_t keys[64 * KVF_KEY_WIRE_SIZE];

    cr_assert(n <= 64);
    make_keys(keys, n, base);
    cr_assert_eq(kvf_registry_admit_medium(g_reg, s, keys, n, medium, added_p),
                 KVF_OK);
}

static size_t lookup_media(uint64_t base, size_t n, uint16_t req, bool any,
                           uint16_t *out, uint8_t *media)
{
    uint8_t keys[64 * KVF_KEY_WIRE_SIZE];
    size_t hit = 0;

    cr_assert(n <= 64);
    make_keys(keys, n, base);
    cr_assert_eq(
        kvf_registry_lookup_media(g_reg, keys, n, req, any, out, media, &hit),
        KVF_OK);
    return hit;
}

/* A holder moves between media without becoming a new holding; the
 * per-slot and total disk counts follow; EVICT removes either medium. */
Test(registry, medium_moves_and_counts)
{
    uint16_t a = open_slot(), out[4];
    uint8_t media[4];
    kvf_registry_stats_t st;
    uint8_t keys[4 * KVF_KEY_WIRE_SIZE];
    size_t added, removed;

    admit_on(a, 10, 4, KVF_REGISTRY_HOST, &added);
    cr_assert_eq(added, 4);
    cr_assert_eq(kvf_registry_slot_disk_keys(g_reg, a), 0);
    /* the pool evicted 10 and 11, the disk tier keeps them */
    admit_on(a, 10, 2, KVF_REGISTRY_DISK, &added);
    cr_assert_eq(added, 0);
    cr_assert_eq(kvf_registry_slot_keys(g_reg, a), 4);
    cr_assert_eq(kvf_registry_slot_disk_keys(g_reg, a), 2);
    kvf_registry_stats(g_reg, &st);
    cr_assert_eq(st.disk_holdings, 2);
    cr_assert_eq(lookup_media(10, 4, 0, false, out, media), 4);
    cr_assert_eq(out[0], a);
    cr_assert_eq(media[0], KVF_REGISTRY_DISK);
    cr_assert_eq(media[1], KVF_REGISTRY_DISK);
    cr_assert_eq(media[2], KVF_REGISTRY_HOST);
    cr_assert_eq(media[3], KVF_REGISTRY_HOST);
    /* promoted back: host again */
    admit_on(a, 11, 1, KVF_REGISTRY_HOST, &added);
    cr_assert_eq(kvf_registry_slot_disk_keys(g_reg, a), 1);
    /* left both tiers */
    make_keys(keys, 4, 10);
    cr_assert_eq(kvf_registry_evict(g_reg, a, keys, 4, &removed), KVF_OK);
    cr_assert_eq(removed, 4);
    cr_assert_eq(kvf_registry_slot_keys(g_reg, a), 0);
    cr_assert_eq(kvf_registry_slot_disk_keys(g_reg, a), 0);
    kvf_registry_stats(g_reg, &st);
    cr_assert_eq(st.disk_holdings, 0);
    cr_assert_eq(st.keys, 0);
    cr_assert_eq(lookup_media(10, 4, 0, false, out, media), 0);
}

/* Holders in memory are chosen before holders on disk, even against a
 * longer run or a lighter load; the requester itself stays first. */
Test(registry, memory_holders_before_disk)
{
    uint16_t d = open_slot(), h = open_slot(), r = open_slot(), out[8];
    uint8_t media[8];
    size_t added;

    admit_on(d, 0, 8, KVF_REGISTRY_DISK, &added); /* the whole chain */
    admit_on(h, 2, 3, KVF_REGISTRY_HOST, &added); /* 2..4 in memory */
    kvf_registry_slot_set_load(g_reg, d, 0);
    kvf_registry_slot_set_load(g_reg, h, 900);
    cr_assert_eq(lookup_media(0, 8, 0, false, out, media), 8);
    cr_assert_eq(out[0], d);
    cr_assert_eq(media[0], KVF_REGISTRY_DISK);
    cr_assert_eq(out[2], h);
    cr_assert_eq(out[4], h);
    cr_assert_eq(media[3], KVF_REGISTRY_HOST);
    cr_assert_eq(out[5], d);
    cr_assert_eq(media[5], KVF_REGISTRY_DISK);
    cr_assert_eq(lookup_media(0, 8, 0, true, out, media), 8);
    cr_assert_eq(out[3], h);
    cr_assert_eq(media[3], KVF_REGISTRY_HOST);
    cr_assert_eq(out[6], d);
    /* the requester holding it on its own disk keeps it */
    admit_on(r, 3, 1, KVF_REGISTRY_DISK, &added);
    cr_assert_eq(lookup_media(3, 1, r, false, out, media), 1);
    cr_assert_eq(out[0], r);
    cr_assert_eq(media[0], KVF_REGISTRY_DISK);
    /* lookups without media still answer */
    cr_assert_eq(lookup(2, 3, 0, false, out), 3);
    cr_assert_eq(out[0], h);
}

/* A closed slot's disk holdings leave the totals with its purge. */
Test(registry, purge_clears_disk_holdings)
{
    uint16_t a = open_slot();
    kvf_registry_stats_t st;
    size_t added;

    admit_on(a, 0, 16, KVF_REGISTRY_DISK, &added);
    kvf_registry_slot_close(g_reg, a);
    while (kvf_registry_purge_step(g_reg, 1u << 20) > 0) {
    }
    kvf_registry_stats(g_reg, &st);
    cr_assert_eq(st.disk_holdings, 0);
    cr_assert_eq(st.keys, 0);
}
