/* SPDX-License-Identifier: Apache-2.0 */
/* Copyright (c) 2026 The kvfabric authors */
/*
 * Forged replies (issue #16.2): a rogue peer sprays PEER_CHUNK replies,
 * with the request ids a fetch would have had when they were sequential
 * and the keys' indexes, at an agent that is fetching those chunks from
 * their real holder. The replies are dropped (request ids are random and
 * replies count only from the endpoint asked); the engine gets the
 * holder's bytes, every one.
 */
#include "proto/frame.h"
#include "tests/helpers/proc.h"
#include "tests/helpers/test_helpers.h"
#include "tests/integration/controller_harness.h"
#include "tests/security/rogue.h"

#include <kvfabric/kvfabric.h>

#include <criterion/criterion.h>

#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CHUNK (64u << 10)
#define KEYS  8u

static kvf_sec_cluster_t g_c; /* A: the holder, B: the victim */

static void setup(void)
{
    kvf_sec_cluster_start(&g_c, "sec-holder", "sec-victim", false);
}

static void teardown(void)
{
    kvf_sec_cluster_stop(&g_c);
    kvf_test_check_leaks();
}

TestSuite(forged, .init = setup, .fini = teardown, .timeout = 120);

static uint8_t pattern(uint32_t k, size_t i)
{
    return (uint8_t)(k * 31u + i * 7u + 1u);
}

typedef struct retrieve_job {
    kvf_key_t keys[KEYS];
    atomic_bool done;
    uint32_t got;
    uint32_t wrong;
} retrieve_job_t;

static void *retrieve_thread(void *arg)
{
    retrieve_job_t *job = arg;
    kvf_client_t *c     = kvf_sec_connect(&g_c, &g_c.b);
    bool missing[KEYS];
    kvf_slot_t slots[KEYS];
    uint32_t k;
    size_t i;

    if (kvf_client_retrieve(c, job->keys, KEYS, slots, missing) == KVF_OK) {
        for (k = 0; k < KEYS; k++) {
            const uint8_t *p;

            if (missing[k]) {
                continue;
            }
            job->got++;
            p = (const uint8_t *)kvf_client_pool_base(c) + slots[k].offset;
            for (i = 0; i < CHUNK; i++) {
                if (p[i] != pattern(k, i)) {
                    job->wrong++;
                    break;
                }
            }
            kvf_client_release(c, &slots[k], 1);
        }
    }
    kvf_client_disconnect(c);
    atomic_store(&job->done, true);
    return NULL;
}

/* One forged PEER_CHUNK: the attacker's bytes, its own checksum. */
static void forge_chunk(kvf_rogue_t *rogue, uint64_t request_id, uint32_t index,
                        const uint8_t *bytes)
{
    static char holder[] = "sec-holder";
    uint8_t hdr[256];
    Kvf__PeerChunk chunk;
    size_t len = 0;

    kvf__peer_chunk__init(&chunk);
    chunk.request_id  = request_id;
    chunk.index       = index;
    chunk.status      = KVF_OK;
    chunk.length      = CHUNK;
    chunk.checksum    = kvf_chunk_checksum(bytes, CHUNK);
    chunk.holder_name = holder;
    cr_assert_eq(kvf_frame_pack(hdr, sizeof(hdr), KVF_MSG_PEER_CHUNK, 0,
                                &chunk.base, sizeof(hdr), &len),
                 KVF_OK);
    kvf_rogue_send(rogue, 2, hdr, len, bytes, CHUNK, true);
}

Test(forged, peer_chunks_from_a_rogue_never_reach_an_engine)
{
    static retrieve_job_t job;
    uint8_t *evil = malloc(CHUNK);
    kvf_client_t *c;
    kvf_lookup_result_t res;
    kvf_rogue_t *rogue;
    pthread_t thread;
    uint64_t id = 1;
    uint32_t k;
    int n;

    memset(&job, 0, sizeof(job));
    for (k = 0; k < KEYS; k++) {
        job.keys[k].lo = 0xf0f0 + k;
        job.keys[k].hi = 0x5ec;
    }
    kvf_sec_store(&g_c, &g_c.a, job.keys, KEYS, CHUNK, pattern);
    /* the registry knows before the victim asks */
    c = kvf_sec_connect(&g_c, &g_c.b);
    for (n = 0; n < 1000; n++) {
        cr_assert_eq(kvf_client_lookup(c, job.keys, KEYS, false, &res), KVF_OK);
        if (res.hit_chunks == KEYS) {
            break;
        }
        poll(NULL, 0, 5);
    }
    cr_assert_eq(res.hit_chunks, KEYS);
    kvf_client_disconnect(c);

    memset(evil, 0x66, CHUNK);
    rogue = kvf_rogue_create(g_c.b.data);
    forge_chunk(rogue, 1, 0, evil); /* connected before the race */
    cr_assert_eq(pthread_create(&thread, NULL, retrieve_thread, &job), 0);
    while (!atomic_load(&job.done)) {
        /* what a sequential request id would have been, every index */
        for (k = 0; (k < KEYS) && !atomic_load(&job.done); k++) {
            forge_chunk(rogue, id, k, evil);
        }
        id = (id % 4) + 1;
    }
    pthread_join(thread, NULL);
    kvf_rogue_destroy(rogue);
    free(evil);

    cr_assert_eq(job.wrong, 0,
                 "%u chunks of the rogue's bytes reached the "
                 "engine",
                 job.wrong);
    cr_assert_eq(job.got, KEYS, "only %u of %u chunks fetched", job.got, KEYS);
    cr_assert_geq(kvf_sec_metric(&g_c.b, "kvf_agent_mesh_dropped_total{reason="
                                         "\"unexpected\"}"),
                  1);
    cr_assert(kvf_test_proc_alive(&g_c.b.proc));
}
