/* SPDX-License-Identifier: Apache-2.0 */
/* Copyright (c) 2026 The kvfabric authors */
/*
 * No active message crashes an agent (issue #16.1): a rogue peer without
 * the cluster secret sends small eager messages to every id this version
 * does not use (UCX 1.13 left such slots uninitialised: a segfault), and
 * ids from the future (a newer agent during a rolling upgrade). The agent
 * stays up, counts each as dropped, and keeps serving its engines.
 */
#include "agent/mesh.h"
#include "tests/helpers/proc.h"
#include "tests/helpers/test_helpers.h"
#include "tests/integration/controller_harness.h"
#include "tests/security/rogue.h"

#include <kvfabric/kvfabric.h>

#include <criterion/criterion.h>

#include <inttypes.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define CHUNK (64u << 10)

static kvf_th_ctl_t g_ctl;
static kvf_sec_agent_t g_agent;

static void setup(void)
{
    kvf_th_ctl_start(&g_ctl, NULL);
    kvf_sec_agent_start(&g_agent, g_ctl.addr, "sec-victim", NULL);
}

static void teardown(void)
{
    kvf_test_proc_stop(&g_agent.proc, 10000);
    kvf_th_ctl_stop(&g_ctl);
    kvf_test_check_leaks();
}

TestSuite(am_ids, .init = setup, .fini = teardown, .timeout = 120);

static long long metric(const char *name)
{
    return kvf_sec_metric(&g_agent, name);
}

/* A store and a retrieve of one chunk through the victim, byte for byte. */
static void serve_check(uint64_t seed)
{
    kvf_client_params_t p = {.field_mask = KVF_CLIENT_PARAM_SOCKET |
                                           KVF_CLIENT_PARAM_TIMEOUT,
                             .socket_path = g_agent.sock,
                             .timeout_ns  = 10000000000ull};
    kvf_key_t key         = {.lo = seed, .hi = 0x5ec};
    kvf_client_t *c       = NULL;
    kvf_slot_t slot;
    uint64_t sum;
    bool missing = true;
    uint8_t *buf;

    cr_assert_eq(kvf_client_connect(&p, &c), KVF_OK);
    cr_assert_eq(kvf_client_alloc(c, CHUNK, 1, &slot), KVF_OK);
    buf = (uint8_t *)kvf_client_pool_base(c) + slot.offset;
    memset(buf, (int)(seed & 0xff), CHUNK);
    sum = kvf_chunk_checksum(buf, CHUNK);
    cr_assert_eq(kvf_client_commit(c, &key, &slot, &sum, 1), KVF_OK);
    cr_assert_eq(kvf_client_retrieve(c, &key, 1, &slot, &missing), KVF_OK);
    cr_assert(!missing);
    buf = (uint8_t *)kvf_client_pool_base(c) + slot.offset;
    cr_assert_eq(buf[0], (uint8_t)(seed & 0xff));
    cr_assert_eq(buf[CHUNK - 1], (uint8_t)(seed & 0xff));
    kvf_client_release(c, &slot, 1);
    kvf_client_disconnect(c);
}

Test(am_ids, unknown_and_future_ids_are_dropped_and_counted)
{
    static const uint16_t future[] = {64, 65, 100, 255, 1000, 4096, 65535};
    uint8_t junk[100];
    kvf_rogue_t *rogue;
    long long before, after;
    unsigned id, sent = 0;
    size_t i;

    memset(junk, 0xa5, sizeof(junk));
    serve_check(1);
    before = metric("kvf_agent_am_dropped_total");

    rogue = kvf_rogue_create(g_agent.data);
    /* every id below the transport's table size that no service uses */
    for (id = 0; id < 64; id++) {
        if ((id >= 1) && (id < KVF_MESH_AM_LAST)) {
            continue;
        }
        kvf_rogue_send(rogue, (uint16_t)id, NULL, 0, junk, sizeof(junk), false);
        sent++;
    }
    for (i = 0; i < sizeof(future) / sizeof(future[0]); i++) {
        kvf_rogue_send(rogue, future[i], junk, 16, junk, sizeof(junk), false);
        sent++;
    }
    /* a rendezvous message to an unknown id is declined too */
    kvf_rogue_send(rogue, 9, NULL, 0, junk, sizeof(junk), true);
    sent++;
    kvf_rogue_progress(rogue, 200);
    kvf_rogue_destroy(rogue);

    cr_assert(kvf_test_proc_alive(&g_agent.proc), "the agent died: %s",
              kvf_test_proc_log(&g_agent.proc));
    cr_assert_geq(before, 0, "no kvf_agent_am_dropped_total metric");
    for (i = 0; i < 400; i++) {
        after = metric("kvf_agent_am_dropped_total");
        if (after - before >= (long long)sent) {
            break;
        }
        poll(NULL, 0, 5);
    }
    cr_assert_eq(after - before, (long long)sent, "dropped %lld of %u",
                 after - before, sent);
    serve_check(2);
    cr_assert(kvf_test_proc_alive(&g_agent.proc));
}
