/* SPDX-License-Identifier: Apache-2.0 */
/* Copyright (c) 2026 The kvfabric authors */
/*
 * Every byte an engine reads was verified (issue #16.5): a chunk changes
 * in the agent's pool after its commit (engines cannot do that any more,
 * tests/security/confine; the test writes the agent's memory); an engine's
 * local retrieve of that chunk is a miss, not the changed bytes; the chunk
 * is dropped at the agent, the registry forgets it, and the failure is
 * counted.
 */
#include "tests/helpers/proc.h"
#include "tests/helpers/test_helpers.h"
#include "tests/integration/controller_harness.h"
#include "tests/security/rogue.h"

#include <kvfabric/kvfabric.h>

#include <criterion/criterion.h>

#include <poll.h>
#include <stdio.h>
#include <string.h>

#define CHUNK (64u << 10)

static kvf_sec_cluster_t g_c; /* A: the holder; B: fetches from it */

static void setup(void)
{
    kvf_sec_cluster_start(&g_c, "verify-a", "verify-b", false);
}

static void teardown(void)
{
    kvf_sec_cluster_stop(&g_c);
    kvf_test_check_leaks();
}

TestSuite(local_verify, .init = setup, .fini = teardown, .timeout = 60);

static kvf_client_t *connect_to(void)
{
    return kvf_sec_connect(&g_c, &g_c.a);
}

/* Where the agent keeps the committed chunk of @p key (a retrieve's slot:
 * pool offsets are the same in every mapping). */
static uint64_t pool_offset(kvf_client_t *c, const kvf_key_t *key)
{
    kvf_slot_t slot;
    bool missing = true;

    cr_assert_eq(kvf_client_retrieve(c, key, 1, &slot, &missing), KVF_OK);
    cr_assert(!missing);
    cr_assert_eq(kvf_client_release(c, &slot, 1), KVF_OK);
    return slot.offset;
}

Test(local_verify, a_chunk_changed_after_commit_is_a_miss_and_dropped)
{
    kvf_key_t keys[2]    = {{.ns = 1, .hi = 0x5ec, .lo = 0x10ca1},
                            {.ns = 1, .hi = 0x5ec, .lo = 0x10ca2}};
    kvf_client_t *writer = connect_to(), *reader;
    kvf_lookup_result_t res;
    kvf_slot_t slots[2];
    uint64_t sums[2];
    bool missing[2];
    uint8_t *p[2];
    long long before;
    int k, n;

    before = kvf_sec_metric(&g_c.a, "kvf_agent_checksum_failures_total");
    cr_assert_geq(before, 0);
    cr_assert_eq(kvf_client_alloc(writer, CHUNK, 2, slots), KVF_OK);
    for (k = 0; k < 2; k++) {
        p[k] = (uint8_t *)kvf_client_pool_base(writer) + slots[k].offset;
        memset(p[k], 0x31 + k, CHUNK);
        sums[k] = kvf_chunk_checksum(p[k], CHUNK);
    }
    cr_assert_eq(kvf_client_commit(writer, keys, slots, sums, 2), KVF_OK);
    /* after the commit: one byte of the first chunk changes */
    cr_assert_eq(kvf_test_agent_pool_flip(
                     &g_c.a.proc, pool_offset(writer, &keys[0]) + CHUNK / 2),
                 0);

    reader = connect_to();
    cr_assert_eq(kvf_client_retrieve(reader, keys, 2, slots, missing), KVF_OK);
    cr_assert(missing[0], "the changed chunk reached an engine");
    cr_assert(!missing[1], "the intact chunk is served");
    cr_assert_eq(((const uint8_t *)kvf_client_pool_base(reader) +
                  slots[1].offset)[CHUNK - 1],
                 0x32);
    kvf_client_release(reader, &slots[1], 1);
    cr_assert_eq(kvf_sec_metric(&g_c.a, "kvf_agent_checksum_failures_total"),
                 before + 1);

    /* dropped at the agent, and the registry forgets it */
    for (n = 0; n < 1000; n++) {
        cr_assert_eq(kvf_client_lookup(reader, keys, 1, false, &res), KVF_OK);
        if (res.hit_chunks == 0) {
            break;
        }
        poll(NULL, 0, 10);
    }
    cr_assert_eq(res.hit_chunks, 0, "the registry still lists the chunk");
    kvf_client_disconnect(reader);
    kvf_client_disconnect(writer);
}

/* A retrieve big enough for the agent's copy threads to verify it: two
 * damaged chunks among 16, one of them asked twice; both are misses (each
 * counted once), every other chunk is served intact. */
Test(local_verify, damaged_chunks_in_a_large_retrieve_are_misses_counted_once)
{
    kvf_key_t keys[17];
    kvf_client_t *writer = connect_to(), *reader;
    kvf_slot_t slots[17];
    uint64_t sums[16];
    bool missing[17];
    long long before;
    uint32_t k;

    for (k = 0; k < 16; k++) {
        keys[k] = (kvf_key_t){.ns = 1, .hi = 0xb16, .lo = 0x100 + k};
    }
    keys[16] = keys[3]; /* asked twice */
    before   = kvf_sec_metric(&g_c.a, "kvf_agent_checksum_failures_total");
    cr_assert_geq(before, 0);
    cr_assert_eq(kvf_client_alloc(writer, CHUNK, 16, slots), KVF_OK);
    for (k = 0; k < 16; k++) {
        uint8_t *p = (uint8_t *)kvf_client_pool_base(writer) + slots[k].offset;

        memset(p, 0x40 + (int)k, CHUNK);
        sums[k] = kvf_chunk_checksum(p, CHUNK);
    }
    cr_assert_eq(kvf_client_commit(writer, keys, slots, sums, 16), KVF_OK);
    cr_assert_eq(kvf_test_agent_pool_flip(&g_c.a.proc,
                                          pool_offset(writer, &keys[3]) + 7),
                 0);
    cr_assert_eq(kvf_test_agent_pool_flip(
                     &g_c.a.proc, pool_offset(writer, &keys[11]) + CHUNK - 1),
                 0);

    reader = connect_to();
    cr_assert_eq(kvf_client_retrieve(reader, keys, 17, slots, missing), KVF_OK);
    for (k = 0; k < 17; k++) {
        if ((k == 3) || (k == 11) || (k == 16)) {
            cr_assert(missing[k], "damaged chunk %u reached an engine", k);
            continue;
        }
        cr_assert(!missing[k], "intact chunk %u not served", k);
        cr_assert_eq(((const uint8_t *)kvf_client_pool_base(reader) +
                      slots[k].offset)[CHUNK / 2],
                     0x40 + k);
        cr_assert_eq(kvf_client_release(reader, &slots[k], 1), KVF_OK);
    }
    cr_assert_eq(kvf_sec_metric(&g_c.a, "kvf_agent_checksum_failures_total"),
                 before + 2);
    kvf_client_disconnect(reader);
    kvf_client_disconnect(writer);
}

/* Commits one chunk of bytes @p fill under @p key from @p c. */
static kvf_status_t commit_filled(kvf_client_t *c, const kvf_key_t *key,
                                  int fill)
{
    kvf_slot_t slot;
    uint64_t sum;
    uint8_t *p;

    cr_assert_eq(kvf_client_alloc(c, CHUNK, 1, &slot), KVF_OK);
    p = (uint8_t *)kvf_client_pool_base(c) + slot.offset;
    memset(p, fill, CHUNK);
    sum = kvf_chunk_checksum(p, CHUNK);
    return kvf_client_commit(c, key, &slot, &sum, 1);
}

/* A chunk found damaged while another engine still reads it (its retrieve
 * not released) leaves the agent's index at once: the next commit of its
 * key stores fresh bytes (it was refused as a duplicate, so the key stayed
 * a miss until that engine let go), every later retrieve gets them, and
 * the old block goes when the engine releases it. */
Test(local_verify, a_damaged_chunk_still_read_can_be_stored_again_at_once)
{
    kvf_key_t key        = {.ns = 1, .hi = 0x5ec, .lo = 0xa9a1};
    kvf_client_t *writer = connect_to(), *holder = connect_to(), *reader;
    kvf_slot_t held, slot;
    bool missing = true;
    long long before;

    before = kvf_sec_metric(&g_c.a, "kvf_agent_checksum_failures_total");
    cr_assert_geq(before, 0);
    cr_assert_eq(commit_filled(writer, &key, 0x51), KVF_OK);
    cr_assert_eq(kvf_client_retrieve(holder, &key, 1, &held, &missing), KVF_OK);
    cr_assert(!missing);
    cr_assert_eq(kvf_test_agent_pool_flip(&g_c.a.proc, held.offset + 9), 0);

    reader = connect_to();
    cr_assert_eq(kvf_client_retrieve(reader, &key, 1, &slot, &missing), KVF_OK);
    cr_assert(missing, "the changed chunk reached an engine");
    cr_assert_eq(kvf_sec_metric(&g_c.a, "kvf_agent_checksum_failures_total"),
                 before + 1);
    cr_assert_eq(kvf_sec_metric(&g_c.a, "kvf_agent_pool_detached_chunks"), 1);

    cr_assert_eq(commit_filled(writer, &key, 0x52), KVF_OK,
                 "fresh bytes refused while the damaged copy is read");
    cr_assert_eq(kvf_client_retrieve(reader, &key, 1, &slot, &missing), KVF_OK);
    cr_assert(!missing, "the fresh chunk is not served");
    cr_assert_neq(slot.offset, held.offset);
    cr_assert_eq(((const uint8_t *)kvf_client_pool_base(reader) +
                  slot.offset)[CHUNK / 2],
                 0x52);
    cr_assert_eq(kvf_client_release(reader, &slot, 1), KVF_OK);

    cr_assert_eq(kvf_client_release(holder, &held, 1), KVF_OK);
    cr_assert_eq(kvf_sec_metric(&g_c.a, "kvf_agent_pool_detached_chunks"), 0);
    cr_assert_eq(kvf_sec_metric(&g_c.a, "kvf_agent_checksum_failures_total"),
                 before + 1);
    kvf_client_disconnect(reader);
    kvf_client_disconnect(holder);
    kvf_client_disconnect(writer);
}

Test(local_verify, a_peer_that_fetched_a_damaged_chunk_makes_its_holder_drop_it)
{
    kvf_key_t key        = {.ns = 1, .hi = 0x5ec, .lo = 0xbadbad};
    kvf_client_t *writer = connect_to(), *reader;
    kvf_lookup_result_t res;
    kvf_slot_t slot;
    char series[192];
    long long before;
    bool missing;
    uint64_t sum;
    uint8_t *p;
    int n;

    before = kvf_sec_metric(&g_c.a, "kvf_agent_checksum_failures_total");
    cr_assert_eq(kvf_client_alloc(writer, CHUNK, 1, &slot), KVF_OK);
    p = (uint8_t *)kvf_client_pool_base(writer) + slot.offset;
    memset(p, 0x44, CHUNK);
    sum = kvf_chunk_checksum(p, CHUNK);
    cr_assert_eq(kvf_client_commit(writer, &key, &slot, &sum, 1), KVF_OK);
    /* damaged at the holder after commit */
    cr_assert_eq(
        kvf_test_agent_pool_flip(&g_c.a.proc, pool_offset(writer, &key) + 7),
        0);

    /* the other agent fetches it from the holder: refused there */
    reader = kvf_sec_connect(&g_c, &g_c.b);
    for (n = 0; n < 1000; n++) {
        cr_assert_eq(kvf_client_lookup(reader, &key, 1, false, &res), KVF_OK);
        if (res.hit_chunks == 1) {
            break;
        }
        poll(NULL, 0, 10);
    }
    cr_assert_eq(kvf_client_retrieve(reader, &key, 1, &slot, &missing), KVF_OK);
    cr_assert(missing, "the damaged chunk reached an engine");
    cr_assert_geq(
        kvf_sec_metric(&g_c.b, "kvf_agent_fetch_checksum_failures_total"), 1);
    /* a refused transfer is no fetched chunk, per peer as in total */
    snprintf(series, sizeof(series),
             "kvf_agent_peer_fetch_chunks_total{peer=\"%s\"}", g_c.a.name);
    cr_assert_eq(
        kvf_sec_metric(&g_c.b, series),
        kvf_sec_metric(&g_c.b,
                       "kvf_agent_fetch_chunks_total{result=\"fetched\"}"));
    /* told, the holder re-verifies and drops it; the registry forgets */
    for (n = 0; n < 1000; n++) {
        cr_assert_eq(kvf_client_lookup(reader, &key, 1, false, &res), KVF_OK);
        if ((res.hit_chunks == 0) &&
            (kvf_sec_metric(&g_c.a, "kvf_agent_checksum_failures_total") ==
             before + 1)) {
            break;
        }
        poll(NULL, 0, 10);
    }
    cr_assert_eq(res.hit_chunks, 0, "the registry still lists the chunk");
    cr_assert_eq(kvf_sec_metric(&g_c.a, "kvf_agent_checksum_failures_total"),
                 before + 1);
    kvf_client_disconnect(reader);
    kvf_client_disconnect(writer);
}
