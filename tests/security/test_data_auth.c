/* SPDX-License-Identifier: Apache-2.0 */
/* Copyright (c) 2026 The kvfabric authors */
/*
 * Authenticated data plane (issue #16.2): a controller and two agents
 * share a cluster secret. Agents fetch from each other (their endpoints
 * complete the mutual HMAC handshake first); a rogue peer without the
 * secret asks the holder for chunks whose keys it knows, and pushes a
 * forged PD request at the decoder: nothing is served, nothing accepted,
 * every message dropped before parsing and counted.
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
#include <sys/stat.h>
#include <unistd.h>

#define CHUNK (64u << 10)
#define KEYS  4u

static kvf_sec_cluster_t g_c; /* with the secret */

static void setup(void)
{
    kvf_sec_cluster_start(&g_c, "auth-a", "auth-b", true);
}

static void teardown(void)
{
    kvf_sec_cluster_stop(&g_c);
    kvf_test_check_leaks();
}

TestSuite(data_auth, .init = setup, .fini = teardown, .timeout = 120);

static kvf_client_t *connect_to(const kvf_sec_agent_t *a)
{
    return kvf_sec_connect(&g_c, a);
}

static uint8_t fill(uint32_t k, size_t i)
{
    (void)i;
    return (uint8_t)(0x40 + k);
}

static void store_keys(const kvf_sec_agent_t *a, kvf_key_t *keys)
{
    uint32_t k;

    for (k = 0; k < KEYS; k++) {
        keys[k].lo = 0xa0a0 + k;
        keys[k].hi = 0x5ec;
    }
    kvf_sec_store(&g_c, a, keys, KEYS, CHUNK, fill);
}

Test(data_auth, agents_with_the_secret_fetch_from_each_other)
{
    kvf_client_t *c;
    kvf_key_t keys[KEYS];
    kvf_slot_t slots[KEYS];
    bool missing[KEYS];
    uint32_t k;
    int n;

    store_keys(&g_c.a, keys);
    c = connect_to(&g_c.b);
    for (n = 0; n < 200; n++) {
        cr_assert_eq(kvf_client_retrieve(c, keys, KEYS, slots, missing), KVF_OK,
                     "%s; agent log: %s", kvf_client_last_error(c),
                     kvf_test_proc_log(&g_c.b.proc));
        if (!missing[KEYS - 1]) {
            break;
        }
        poll(NULL, 0, 10); /* the registry learns of A's commit */
    }
    for (k = 0; k < KEYS; k++) {
        const uint8_t *p =
            (const uint8_t *)kvf_client_pool_base(c) + slots[k].offset;

        cr_assert(!missing[k], "chunk %u not fetched", k);
        cr_assert_eq(p[0], 0x40 + k);
        cr_assert_eq(p[CHUNK - 1], 0x40 + k);
    }
    kvf_client_release(c, slots, KEYS);
    kvf_client_disconnect(c);
    cr_assert_eq(kvf_sec_metric(&g_c.b, "kvf_agent_fetch_chunks_total{result="
                                        "\"fetched\"}"),
                 KEYS);
}

/* Over UCX (the same-host path off), a requester that fetched stops: its
 * worker frees every endpoint with its last reference (the mesh lets go
 * of its hold first; before, each authenticated link's endpoint was
 * "still referenced at destroy"), and the holder says at info that the
 * peer the handshake proved went, not that a peer node failed. */
Test(data_auth, a_requester_that_stops_lets_go_of_every_endpoint)
{
    const char *const args[] = {"--config", g_c.yaml, "--same-host=false",
                                NULL};
    kvf_sec_agent_t holder, req;
    kvf_client_t *c;
    kvf_key_t keys[KEYS];
    kvf_slot_t slots[KEYS];
    bool missing[KEYS];
    int n;

    kvf_sec_agent_start(&holder, g_c.ctl.addr, "auth-h", args);
    kvf_sec_agent_start(&req, g_c.ctl.addr, "auth-r", args);
    store_keys(&holder, keys);
    c = connect_to(&req);
    for (n = 0; n < 200; n++) {
        cr_assert_eq(kvf_client_retrieve(c, keys, KEYS, slots, missing), KVF_OK,
                     "%s", kvf_client_last_error(c));
        if (!missing[KEYS - 1]) {
            break;
        }
        poll(NULL, 0, 10);
    }
    cr_assert(!missing[0] && !missing[KEYS - 1]);
    kvf_client_release(c, slots, KEYS);
    kvf_client_disconnect(c);
    cr_assert_eq(kvf_sec_metric(&req, "kvf_agent_fetch_chunks_total{result="
                                      "\"fetched\"}"),
                 KEYS);

    cr_assert_eq(kvf_test_proc_stop(&req.proc, 10000), 0);
    cr_assert_null(strstr(kvf_test_proc_log(&req.proc), "references at"),
                   "requester log: %s", kvf_test_proc_log(&req.proc));
    cr_assert(kvf_test_proc_wait_log(&holder.proc,
                                     "peer auth-r from 127.0.0.1:", 5000),
              "holder log: %s", kvf_test_proc_log(&holder.proc));
    cr_assert_null(strstr(kvf_test_proc_log(&holder.proc), "failed:"),
                   "holder log: %s", kvf_test_proc_log(&holder.proc));
    cr_assert_eq(kvf_test_proc_stop(&holder.proc, 10000), 0);
    cr_assert_null(strstr(kvf_test_proc_log(&holder.proc), "references at"),
                   "holder log: %s", kvf_test_proc_log(&holder.proc));
}

/* A holder whose UCX operations are all busy sending chunks (ucx_max_ops
 * 16) completes the handshakes of two requesters that first reach it
 * while it sends: its half of each challenge waits for an operation as
 * every send does. Before, it was dropped when none was free, the
 * handshake timed out, and that requester missed every chunk. */
Test(data_auth, handshakes_during_a_burst_complete)
{
    enum {
        N   = 384, /* 96 MiB in 256 KiB blocks, of each agent's 128 MiB */
        BIG = 192u << 10
    };
    const char *const holder_args[] = {
        "--config",      g_c.yaml, "--pool-size", "128M",
        "--ucx-max-ops", "16",     NULL};
    const char *const req_args[] = {"--config", g_c.yaml, "--pool-size", "128M",
                                    NULL};
    kvf_sec_agent_t holder, req[2];
    kvf_client_t *c[2];
    kvf_lookup_result_t res;
    kvf_key_t *keys   = calloc(N, sizeof(*keys));
    kvf_slot_t *slots = calloc(N, sizeof(*slots));
    bool *missing     = calloc(N, sizeof(*missing));
    uint32_t k, i;
    int n;

    cr_assert((keys != NULL) && (slots != NULL) && (missing != NULL));
    kvf_sec_agent_start(&holder, g_c.ctl.addr, "auth-h", holder_args);
    kvf_sec_agent_start(&req[0], g_c.ctl.addr, "auth-r0", req_args);
    kvf_sec_agent_start(&req[1], g_c.ctl.addr, "auth-r1", req_args);
    for (k = 0; k < N; k++) {
        keys[k] = (kvf_key_t){.ns = 0, .hi = 0xb0a5, .lo = k + 1};
    }
    kvf_sec_store(&g_c, &holder, keys, N, BIG, fill);
    for (i = 0; i < 2; i++) {
        c[i] = connect_to(&req[i]);
    }
    for (n = 0; n < 400; n++) {
        cr_assert_eq(kvf_client_lookup(c[0], keys, N, false, &res), KVF_OK);
        if (res.hit_chunks == N) {
            break;
        }
        poll(NULL, 0, 5);
    }
    cr_assert_eq(res.hit_chunks, N);
    /* neither requester has met the holder yet: both prefetch at once */
    for (i = 0; i < 2; i++) {
        cr_assert_eq(kvf_client_lookup(c[i], keys, N, true, &res), KVF_OK);
        cr_assert_eq(res.hit_chunks, N);
    }
    for (i = 0; i < 2; i++) {
        cr_assert_eq(kvf_client_retrieve(c[i], keys, N, slots, missing), KVF_OK,
                     "%s", kvf_client_last_error(c[i]));
        for (k = 0; k < N; k++) {
            const uint8_t *p =
                (const uint8_t *)kvf_client_pool_base(c[i]) + slots[k].offset;

            cr_assert(!missing[k], "requester %u: chunk %u missing", i, k);
            cr_assert_eq(p[0], (uint8_t)(0x40 + k));
            cr_assert_eq(p[BIG - 1], (uint8_t)(0x40 + k));
        }
        kvf_client_release(c[i], slots, N);
        kvf_client_disconnect(c[i]);
        cr_assert_eq(kvf_sec_metric(&req[i], "kvf_agent_fetch_chunks_total{"
                                             "result=\"fetched\"}"),
                     N);
    }
    cr_assert_gt(kvf_sec_metric(&holder, "kvf_agent_mesh_deferred_total"), 0,
                 "the holder never ran out of operations: nothing tested");
    for (i = 0; i < 2; i++) {
        kvf_test_proc_stop(&req[i].proc, 10000);
    }
    kvf_test_proc_stop(&holder.proc, 10000);
    free(keys);
    free(slots);
    free(missing);
}

Test(data_auth, a_peer_without_the_secret_is_served_nothing)
{
    uint8_t frame[1024], keybuf[KEYS * KVF_KEY_WIRE_SIZE];
    uint32_t indexes[KEYS] = {0, 1, 2, 3};
    static char name[]     = "rogue";
    kvf_key_t keys[KEYS];
    Kvf__PeerFetch req;
    Kvf__PdAlloc alloc;
    uint64_t lengths[1] = {CHUNK};
    kvf_rogue_t *rogue;
    size_t len = 0;
    uint32_t k;

    store_keys(&g_c.a, keys);
    for (k = 0; k < KEYS; k++) {
        kvf_key_pack(&keys[k], keybuf + k * KVF_KEY_WIRE_SIZE);
    }
    kvf__peer_fetch__init(&req);
    req.request_id     = 7;
    req.keys.data      = keybuf;
    req.keys.len       = sizeof(keybuf);
    req.n_indexes      = KEYS;
    req.indexes        = indexes;
    req.requester      = 99;
    req.requester_name = name;
    cr_assert_eq(kvf_frame_pack(frame, sizeof(frame), KVF_MSG_PEER_FETCH, 0,
                                &req.base, sizeof(frame), &len),
                 KVF_OK);

    rogue = kvf_rogue_create(g_c.a.data);
    cr_assert_eq(kvf_rogue_send(rogue, KVF_MESH_AM_PEER_FETCH, NULL, 0, frame,
                                len, false),
                 KVF_OK);
    /* and a forged push at the decoder */
    kvf__pd_alloc__init(&alloc);
    alloc.request_id = 1;
    alloc.ticket     = 1;
    alloc.n_lengths  = 1;
    alloc.lengths    = lengths;
    cr_assert_eq(kvf_frame_pack(frame, sizeof(frame), KVF_MSG_PD_ALLOC, 0,
                                &alloc.base, sizeof(frame), &len),
                 KVF_OK);
    kvf_rogue_send(rogue, KVF_MESH_AM_PD_CTRL, NULL, 0, frame, len, false);
    kvf_rogue_progress(rogue, 500);
    cr_assert_eq(kvf_rogue_received(rogue, KVF_MESH_AM_PEER_CHUNK), 0,
                 "the holder answered a peer without the secret");
    cr_assert_eq(kvf_rogue_received(rogue, KVF_MESH_AM_PD_CTRL), 0,
                 "the decoder answered a forged PD_ALLOC");
    kvf_rogue_destroy(rogue);

    cr_assert_geq(kvf_sec_metric(&g_c.a, "kvf_agent_mesh_dropped_total{reason="
                                         "\"unauthenticated\"}"),
                  2);
    cr_assert_eq(kvf_sec_metric(&g_c.a, "kvf_agent_served_chunks_total"), 0);
    cr_assert(kvf_test_proc_alive(&g_c.a.proc));
}

/* Pushes request @p req of KEYS chunks from A to B, checks every chunk at
 * B's engine. */
static void pd_push_check(uint64_t req)
{
    kvf_client_t *pc = connect_to(&g_c.a), *dc;
    kvf_slot_t slots[KEYS];
    uint64_t sums[KEYS];
    uint32_t k, num = 0;

    cr_assert_eq(kvf_client_alloc(pc, CHUNK, KEYS, slots), KVF_OK);
    for (k = 0; k < KEYS; k++) {
        uint8_t *p = (uint8_t *)kvf_client_pool_base(pc) + slots[k].offset;

        memset(p, 0x70 + (int)(k + req), CHUNK);
        sums[k] = kvf_chunk_checksum(p, CHUNK);
    }
    cr_assert_eq(kvf_pd_push(pc, req, "auth-b", slots, sums, KEYS, true),
                 KVF_OK, "%s", kvf_client_last_error(pc));
    kvf_client_disconnect(pc);

    dc = connect_to(&g_c.b);
    cr_assert_eq(kvf_pd_wait(dc, req, 5000000000ull, slots, KEYS, &num), KVF_OK,
                 "%s", kvf_client_last_error(dc));
    cr_assert_eq(num, KEYS);
    for (k = 0; k < KEYS; k++) {
        const uint8_t *p =
            (const uint8_t *)kvf_client_pool_base(dc) + slots[k].offset;

        cr_assert_eq(p[0], (uint8_t)(0x70 + k + req));
        cr_assert_eq(p[CHUNK - 1], (uint8_t)(0x70 + k + req));
    }
    cr_assert_eq(kvf_pd_release(dc, req), KVF_OK);
    kvf_client_disconnect(dc);
}

/* Over UCX, and then (the same-host link proved with the secret, bound to
 * B's node id) copied into B's receive region. */
Test(data_auth, pd_push_between_agents_with_the_secret)
{
    const char *sent = "kvf_agent_pd_same_host_total{dir=\"sent\"}";
    long long before;
    int n;

    pd_push_check(42);
    for (n = 0; (n < 500) && (kvf_sec_metric(&g_c.a, "kvf_agent_same_host_"
                                                     "links_total{result="
                                                     "\"ok\"}") < 1);
         n++) {
        poll(NULL, 0, 10);
    }
    before = kvf_sec_metric(&g_c.a, sent);
    pd_push_check(43);
    cr_assert_eq(kvf_sec_metric(&g_c.a, sent), before + 1);
    cr_assert_eq(kvf_sec_metric(&g_c.b, "kvf_agent_pd_same_host_total{dir="
                                        "\"received\"}"),
                 before + 1);
}

Test(data_auth, pd_alloc_from_a_decode_only_node_is_refused)
{
    const char *args[] = {"--config", g_c.yaml, "--role", "decode", NULL};
    kvf_sec_agent_t dec;
    kvf_client_t *c;
    kvf_slot_t slot;
    uint64_t sum;
    uint8_t *p;

    kvf_sec_agent_start(&dec, g_c.ctl.addr, "auth-decode-only", args);
    c = connect_to(&dec);
    cr_assert_eq(kvf_client_alloc(c, CHUNK, 1, &slot), KVF_OK);
    p = (uint8_t *)kvf_client_pool_base(c) + slot.offset;
    memset(p, 0x11, CHUNK);
    sum = kvf_chunk_checksum(p, CHUNK);
    /* it proved the secret, but as a decode node: B takes no push from it */
    cr_assert_eq(kvf_pd_push(c, 43, "auth-b", &slot, &sum, 1, true),
                 KVF_ERR_AUTH, "%s", kvf_client_last_error(c));
    kvf_client_disconnect(c);
    kvf_test_proc_stop(&dec.proc, 10000);
}
