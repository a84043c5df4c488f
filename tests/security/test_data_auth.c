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

static kvf_th_ctl_t g_ctl;
static kvf_sec_agent_t g_a, g_b;
static char g_dir[64], g_yaml[128];

static void write_file(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");

    cr_assert_not_null(f);
    fputs(text, f);
    fclose(f);
}

static void setup(void)
{
    char path[128], text[256];
    const char *ctl_args[]   = {"--config", g_yaml, NULL};
    const char *agent_args[] = {"--config", g_yaml, NULL};

    snprintf(g_dir, sizeof(g_dir), "/tmp/kvf-sec-auth-XXXXXX");
    cr_assert_not_null(mkdtemp(g_dir));
    snprintf(path, sizeof(path), "%s/secret", g_dir);
    write_file(path, "0c1e5d7f9a2b4c6e8f0a1b3c5d7e9f21\n");
    chmod(path, 0600);
    snprintf(g_yaml, sizeof(g_yaml), "%s/kvf.yaml", g_dir);
    snprintf(text, sizeof(text), "cluster_secret_file: %s\n", path);
    write_file(g_yaml, text);
    kvf_th_ctl_start(&g_ctl, ctl_args);
    kvf_sec_agent_start(&g_a, g_ctl.addr, "auth-a", agent_args);
    kvf_sec_agent_start(&g_b, g_ctl.addr, "auth-b", agent_args);
}

static void teardown(void)
{
    char cmd[128];

    kvf_test_proc_stop(&g_b.proc, 10000);
    kvf_test_proc_stop(&g_a.proc, 10000);
    kvf_th_ctl_stop(&g_ctl);
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", g_dir);
    if (system(cmd) != 0) {
        fprintf(stderr, "%s failed\n", cmd);
    }
    kvf_test_check_leaks();
}

TestSuite(data_auth, .init = setup, .fini = teardown, .timeout = 120);

static kvf_client_t *connect_to(const kvf_sec_agent_t *a)
{
    kvf_client_params_t p = {.field_mask = KVF_CLIENT_PARAM_SOCKET |
                                           KVF_CLIENT_PARAM_TIMEOUT |
                                           KVF_CLIENT_PARAM_SECRET,
                             .socket_path = a->sock,
                             .timeout_ns  = 20000000000ull};
    kvf_client_t *c       = NULL;
    char path[128];

    snprintf(path, sizeof(path), "%s/secret", g_dir);
    p.secret_file = path;
    cr_assert_eq(kvf_client_connect(&p, &c), KVF_OK);
    return c;
}

static void store_keys(const kvf_sec_agent_t *a, kvf_key_t *keys)
{
    kvf_client_t *c = connect_to(a);
    kvf_slot_t slots[KEYS];
    uint64_t sums[KEYS];
    uint32_t k;

    for (k = 0; k < KEYS; k++) {
        keys[k].lo = 0xa0a0 + k;
        keys[k].hi = 0x5ec;
    }
    cr_assert_eq(kvf_client_alloc(c, CHUNK, KEYS, slots), KVF_OK);
    for (k = 0; k < KEYS; k++) {
        uint8_t *p = (uint8_t *)kvf_client_pool_base(c) + slots[k].offset;

        memset(p, 0x40 + (int)k, CHUNK);
        sums[k] = kvf_chunk_checksum(p, CHUNK);
    }
    cr_assert_eq(kvf_client_commit(c, keys, slots, sums, KEYS), KVF_OK);
    kvf_client_disconnect(c);
}

Test(data_auth, agents_with_the_secret_fetch_from_each_other)
{
    kvf_client_t *c;
    kvf_key_t keys[KEYS];
    kvf_slot_t slots[KEYS];
    bool missing[KEYS];
    uint32_t k;
    int n;

    store_keys(&g_a, keys);
    c = connect_to(&g_b);
    for (n = 0; n < 200; n++) {
        cr_assert_eq(kvf_client_retrieve(c, keys, KEYS, slots, missing), KVF_OK,
                     "%s; agent log: %s", kvf_client_last_error(c),
                     kvf_test_proc_log(&g_b.proc));
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
    cr_assert_eq(kvf_sec_metric(&g_b, "kvf_agent_fetch_chunks_total{result="
                                      "\"fetched\"}"),
                 KEYS);
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

    store_keys(&g_a, keys);
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

    rogue = kvf_rogue_create(g_a.data);
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

    cr_assert_geq(kvf_sec_metric(&g_a, "kvf_agent_mesh_dropped_total{reason="
                                       "\"unauthenticated\"}"),
                  2);
    cr_assert_eq(kvf_sec_metric(&g_a, "kvf_agent_served_chunks_total"), 0);
    cr_assert(kvf_test_proc_alive(&g_a.proc));
}

Test(data_auth, pd_push_between_agents_with_the_secret)
{
    kvf_client_t *pc = connect_to(&g_a), *dc;
    kvf_slot_t slots[KEYS];
    uint64_t sums[KEYS];
    uint32_t k, num = 0;

    cr_assert_eq(kvf_client_alloc(pc, CHUNK, KEYS, slots), KVF_OK);
    for (k = 0; k < KEYS; k++) {
        uint8_t *p = (uint8_t *)kvf_client_pool_base(pc) + slots[k].offset;

        memset(p, 0x70 + (int)k, CHUNK);
        sums[k] = kvf_chunk_checksum(p, CHUNK);
    }
    cr_assert_eq(kvf_pd_push(pc, 42, "auth-b", slots, sums, KEYS, true), KVF_OK,
                 "%s", kvf_client_last_error(pc));
    kvf_client_disconnect(pc);

    dc = connect_to(&g_b);
    cr_assert_eq(kvf_pd_wait(dc, 42, 5000000000ull, slots, KEYS, &num), KVF_OK,
                 "%s", kvf_client_last_error(dc));
    cr_assert_eq(num, KEYS);
    for (k = 0; k < KEYS; k++) {
        const uint8_t *p =
            (const uint8_t *)kvf_client_pool_base(dc) + slots[k].offset;

        cr_assert_eq(p[0], 0x70 + k);
        cr_assert_eq(p[CHUNK - 1], 0x70 + k);
    }
    cr_assert_eq(kvf_pd_release(dc, 42), KVF_OK);
    kvf_client_disconnect(dc);
}

Test(data_auth, pd_alloc_from_a_decode_only_node_is_refused)
{
    const char *args[] = {"--config", g_yaml, "--role", "decode", NULL};
    kvf_sec_agent_t dec;
    kvf_client_t *c;
    kvf_slot_t slot;
    uint64_t sum;
    uint8_t *p;

    kvf_sec_agent_start(&dec, g_ctl.addr, "auth-decode-only", args);
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
