/* SPDX-License-Identifier: Apache-2.0 */
/* Copyright (c) 2026 The kvfabric authors */
/*
 * Held rendezvous (issue #16.6): a rogue peer (no secret in this cluster)
 * asks a holder for 1 100 chunks and never receives them, keeping every
 * rendezvous open. The holder's sends to it are capped per requester, so
 * another agent's fetch from the same holder is still served, every byte.
 */
#include "agent/mesh.h"
#include "proto/frame.h"
#include "tests/helpers/proc.h"
#include "tests/helpers/test_helpers.h"
#include "tests/integration/controller_harness.h"
#include "tests/security/rogue.h"

#include <kvfabric/kvfabric.h>

#include <criterion/criterion.h>

#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CHUNK (64u << 10)
#define KEYS  8u
#define ASKS  1100u

static kvf_sec_cluster_t g_c; /* A: the holder, B: the victim */

static void setup(void)
{
    kvf_sec_cluster_start(&g_c, "held-a", "held-b", false);
}

static void teardown(void)
{
    kvf_sec_cluster_stop(&g_c);
    kvf_test_check_leaks();
}

TestSuite(held, .init = setup, .fini = teardown, .timeout = 120);

static uint8_t fill(uint32_t k, size_t i)
{
    (void)i;
    return (uint8_t)(0x20 + k);
}

Test(held, a_peer_holding_rendezvous_does_not_block_others)
{
    static uint8_t keybuf[ASKS * KVF_KEY_WIRE_SIZE];
    static uint32_t indexes[ASKS];
    static uint8_t frame[ASKS * (KVF_KEY_WIRE_SIZE + 8) + 1024];
    static char name[] = "rogue";
    kvf_client_t *c;
    kvf_key_t keys[KEYS];
    kvf_slot_t slots[KEYS];
    bool missing[KEYS];
    Kvf__PeerFetch req;
    kvf_rogue_t *rogue;
    uint32_t k, got = 0;
    size_t len = 0;

    for (k = 0; k < KEYS; k++) {
        keys[k].lo = 0xbeef00 + k;
        keys[k].hi = 0x5ec;
    }
    kvf_sec_store(&g_c, &g_c.a, keys, KEYS, CHUNK, fill);

    /* the rogue asks for the chunks over and over, and keeps every one */
    for (k = 0; k < ASKS; k++) {
        kvf_key_pack(&keys[k % KEYS], keybuf + k * KVF_KEY_WIRE_SIZE);
        indexes[k] = k;
    }
    kvf__peer_fetch__init(&req);
    req.request_id     = 7;
    req.keys.data      = keybuf;
    req.keys.len       = sizeof(keybuf);
    req.n_indexes      = ASKS;
    req.indexes        = indexes;
    req.requester      = 99;
    req.requester_name = name;
    cr_assert_eq(kvf_frame_pack(frame, sizeof(frame), KVF_MSG_PEER_FETCH, 0,
                                &req.base, sizeof(frame), &len),
                 KVF_OK);
    rogue = kvf_rogue_create(g_c.a.data);
    kvf_rogue_hold_rndv(rogue);
    cr_assert_eq(kvf_rogue_send(rogue, KVF_MESH_AM_PEER_FETCH, NULL, 0, frame,
                                len, false),
                 KVF_OK);
    kvf_rogue_progress(rogue, 500);

    /* meanwhile an engine on the other agent needs the same chunks */
    c = kvf_sec_connect(&g_c, &g_c.b);
    cr_assert_eq(kvf_client_retrieve(c, keys, KEYS, slots, missing), KVF_OK);
    for (k = 0; k < KEYS; k++) {
        const uint8_t *p;

        if (missing[k]) {
            continue;
        }
        p = (const uint8_t *)kvf_client_pool_base(c) + slots[k].offset;
        cr_assert_eq(p[0], 0x20 + k);
        cr_assert_eq(p[CHUNK - 1], 0x20 + k);
        kvf_client_release(c, &slots[k], 1);
        got++;
    }
    kvf_client_disconnect(c);
    kvf_rogue_destroy(rogue);
    cr_assert_eq(got, KEYS,
                 "only %u of %u chunks served while a peer held "
                 "rendezvous open",
                 got, KEYS);
    cr_assert(kvf_test_proc_alive(&g_c.a.proc));
}

/* Sends a PEER_FETCH of @p n keys nobody holds to A from @p rogue, with or
 * without PeerFetch.grouped, and returns how many PEER_CHUNKs came back. */
static unsigned ask_unknown(kvf_rogue_t *rogue, uint32_t n, bool grouped)
{
    static uint8_t keybuf[ASKS * KVF_KEY_WIRE_SIZE];
    static uint32_t indexes[ASKS];
    static uint8_t frame[ASKS * (KVF_KEY_WIRE_SIZE + 8) + 1024];
    static char name[] = "rogue";
    unsigned before    = kvf_rogue_received(rogue, KVF_MESH_AM_PEER_CHUNK);
    Kvf__PeerFetch req;
    kvf_key_t key;
    size_t len = 0;
    uint32_t k;

    cr_assert_leq(n, ASKS);
    for (k = 0; k < n; k++) {
        key = (kvf_key_t){.ns = 1, .hi = 0xdead, .lo = k};
        kvf_key_pack(&key, keybuf + k * KVF_KEY_WIRE_SIZE);
        indexes[k] = k;
    }
    kvf__peer_fetch__init(&req);
    req.request_id     = grouped ? 9 : 8;
    req.keys.data      = keybuf;
    req.keys.len       = (size_t)n * KVF_KEY_WIRE_SIZE;
    req.n_indexes      = n;
    req.indexes        = indexes;
    req.requester      = 99;
    req.requester_name = name;
    req.batch          = true;
    req.grouped        = grouped;
    cr_assert_eq(kvf_frame_pack(frame, sizeof(frame), KVF_MSG_PEER_FETCH, 0,
                                &req.base, sizeof(frame), &len),
                 KVF_OK);
    cr_assert_eq(kvf_rogue_send(rogue, KVF_MESH_AM_PEER_FETCH, NULL, 0, frame,
                                len, false),
                 KVF_OK);
    kvf_rogue_progress(rogue, 1000);
    return kvf_rogue_received(rogue, KVF_MESH_AM_PEER_CHUNK) - before;
}

/* Misses cost the holder a message (and a UCX operation) per 41 keys, not
 * per key, when the requester takes grouped answers (our agents do): a
 * burst of fetches of evicted keys cannot use up its operations. */
Test(held, misses_are_answered_in_groups)
{
    kvf_rogue_t *rogue = kvf_rogue_create(g_c.a.data);
    unsigned single, grouped;

    single  = ask_unknown(rogue, 400, false);
    grouped = ask_unknown(rogue, 400, true);
    kvf_rogue_destroy(rogue);
    cr_assert_eq(single, 400, "one PEER_CHUNK per missed key without grouping");
    cr_assert_eq(grouped, (400 + 40) / 41, "41 missed keys a PEER_CHUNK");
    cr_assert(kvf_test_proc_alive(&g_c.a.proc));
}
