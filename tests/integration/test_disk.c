/* SPDX-License-Identifier: Apache-2.0 */
/* Copyright (c) 2026 The kvfabric authors */
/*
 * The local-disk tier of a real kvf-agent process (issue #20): chunks the
 * pool evicts are written behind, an engine finds and retrieves them byte
 * for byte, an agent restarted (cleanly or with kill -9) on the same
 * disk_path still has them, and never hands out a wrong chunk.
 */
#include "common/time.h"
#include "tests/helpers/proc.h"
#include "tests/helpers/test_helpers.h"

#include <kvfabric/kvfabric.h>

#include <criterion/criterion.h>

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define CHUNK  (256u << 10)
#define CHUNKS 48u /* the pool holds 16 */
#define BATCH  8u

static kvf_test_proc_t g_agent;
static char g_sock[128], g_bin[4096], g_dir[64], g_tier[128];
static uint16_t g_http;

static void agent_start(void)
{
    char http[64];
    const char *argv[] = {g_bin,         "--controller",
                          "127.0.0.1:1", "--listen",
                          "127.0.0.1:0", "--name",
                          "disk-it",     "--socket",
                          g_sock,        "--http",
                          http,          "--pool-size",
                          "4M",          "--max-chunk",
                          "1M",          "--disk-path",
                          g_tier,        "--disk-size",
                          "64M",         "--disk-queue-depth",
                          "32",          NULL};

    g_http = kvf_test_free_port();
    snprintf(http, sizeof(http), "127.0.0.1:%u", g_http);
    cr_assert_eq(kvf_test_proc_start(&g_agent, argv), 0);
    /* the last line of a start: HTTP (the metrics read here) is up */
    cr_assert(kvf_test_proc_wait_log(&g_agent, ") started; controller", 10000),
              "agent did not start: %s", kvf_test_proc_log(&g_agent));
}

static void disk_it_setup(void)
{
    snprintf(g_bin, sizeof(g_bin), "%s",
             kvf_test_build_path("agent/kvf-agent"));
    snprintf(g_sock, sizeof(g_sock), "/tmp/kvf-disk-it-%d.sock", (int)getpid());
    snprintf(g_dir, sizeof(g_dir), "/tmp/kvf-disk-it-XXXXXX");
    cr_assert_not_null(mkdtemp(g_dir));
    snprintf(g_tier, sizeof(g_tier), "%s/tier", g_dir);
}

static void disk_it_teardown(void)
{
    if (kvf_test_proc_alive(&g_agent)) {
        cr_assert_eq(kvf_test_proc_stop(&g_agent, 10000), 0,
                     "agent exit; log: %s", kvf_test_proc_log(&g_agent));
    }
    unlink(g_tier);
    rmdir(g_dir);
    kvf_test_check_leaks();
}

TestSuite(disk_it, .init = disk_it_setup, .fini = disk_it_teardown,
          .timeout = 90);

static kvf_client_t *connect_client(void)
{
    kvf_client_params_t p = {
        .field_mask = KVF_CLIENT_PARAM_SOCKET | KVF_CLIENT_PARAM_TIMEOUT |
                      KVF_CLIENT_PARAM_NAME,
        .socket_path = g_sock,
        .timeout_ns  = 5000000000ull,
        .name        = "disk-engine",
    };
    kvf_client_t *client = NULL;

    cr_assert_eq(kvf_client_connect(&p, &client), KVF_OK);
    return client;
}

static void make_keys(kvf_key_t *keys, uint32_t n)
{
    static uint32_t tokens[CHUNKS * 256];
    size_t got, i;

    for (i = 0; i < CHUNKS * 256; i++) {
        tokens[i] = (uint32_t)(i * 13 + 5);
    }
    cr_assert_eq(kvf_key_chain(0x5151, tokens, (size_t)n * 256, 256, false,
                               keys, n, &got),
                 KVF_OK);
}

static void fill(uint8_t *p, size_t len, uint32_t seed)
{
    size_t i;

    for (i = 0; i < len; i++) {
        seed = seed * 1103515245u + 12345u;
        p[i] = (uint8_t)(seed >> 16);
    }
}

static void store_all(kvf_client_t *c, const kvf_key_t *keys)
{
    uint8_t *base = kvf_client_pool_base(c);
    kvf_slot_t slots[BATCH];
    uint64_t sums[BATCH];
    uint32_t b, i;

    for (b = 0; b < CHUNKS; b += BATCH) {
        cr_assert_eq(kvf_client_alloc(c, CHUNK, BATCH, slots), KVF_OK,
                     "alloc: %s", kvf_client_last_error(c));
        for (i = 0; i < BATCH; i++) {
            fill(base + slots[i].offset, CHUNK, (uint32_t)keys[b + i].lo);
            sums[i] = kvf_chunk_checksum(base + slots[i].offset, CHUNK);
        }
        cr_assert_eq(kvf_client_commit(c, keys + b, slots, sums, BATCH), KVF_OK,
                     "commit: %s", kvf_client_last_error(c));
    }
}

/* Retrieves keys[0, n) and checks every chunk that came is byte for byte
 * the one stored; returns how many came. */
static uint32_t retrieve_checked(kvf_client_t *c, const kvf_key_t *keys,
                                 uint32_t n)
{
    uint8_t *expect = malloc(CHUNK), *base = kvf_client_pool_base(c);
    kvf_slot_t slots[BATCH];
    bool missing[BATCH];
    uint32_t i, got = 0;

    cr_assert_leq(n, BATCH);
    cr_assert_eq(kvf_client_retrieve(c, keys, n, slots, missing), KVF_OK,
                 "retrieve: %s", kvf_client_last_error(c));
    for (i = 0; i < n; i++) {
        if (missing[i]) {
            continue;
        }
        fill(expect, CHUNK, (uint32_t)keys[i].lo);
        cr_assert_eq(slots[i].length, CHUNK);
        cr_assert(memcmp(base + slots[i].offset, expect, CHUNK) == 0,
                  "chunk %u differs", i);
        cr_assert_eq(kvf_client_release(c, &slots[i], 1), KVF_OK);
        got++;
    }
    free(expect);
    return got;
}

static uint64_t metric(const char *name)
{
    static char out[65536];
    const char *p;
    char needle[128];

    cr_assert_eq(kvf_test_http_get(g_http, "/metrics", out, sizeof(out)), 200);
    snprintf(needle, sizeof(needle), "\n%s ", name);
    p = strstr(out, needle);
    cr_assert_not_null(p, "no %s in /metrics", name);
    return strtoull(p + strlen(needle), NULL, 10);
}

static void wait_writes(uint64_t n)
{
    uint64_t t0 = kvf_time_now_ms();

    /* and nothing left staged or on the device (the backlog gauge
     * kvf-bench disk waits on) */
    while ((metric("kvf_agent_disk_writes_total") < n) ||
           (metric("kvf_agent_disk_writes_pending") > 0)) {
        cr_assert_lt(kvf_time_now_ms() - t0, 10000, "writes never landed");
        usleep(10000);
    }
}

Test(disk_it, evicted_chunks_come_back_from_disk_byte_identical)
{
    kvf_key_t keys[CHUNKS];
    kvf_lookup_result_t res;
    kvf_client_t *c;

    agent_start();
    c = connect_client();
    make_keys(keys, CHUNKS);
    store_all(c, keys);
    wait_writes(CHUNKS - 16);
    cr_assert_eq(metric("kvf_agent_disk_write_drops_total"), 0);
    /* every block the pool kept for a write was given back (written in
     * place or copied, each write landed) */
    cr_assert_eq(metric("kvf_agent_pool_kept_bytes"), 0);
    cr_assert_leq(metric("kvf_agent_disk_write_copies_total"),
                  metric("kvf_agent_disk_writes_total"));

    cr_assert_eq(kvf_client_lookup(c, keys, CHUNKS, false, &res), KVF_OK);
    cr_assert_eq(res.hit_chunks, CHUNKS, "the disk keeps what the pool lost");
    cr_assert_eq(res.local_chunks, CHUNKS);
    cr_assert_eq(retrieve_checked(c, keys, BATCH), BATCH);
    cr_assert_eq(retrieve_checked(c, keys + BATCH, BATCH), BATCH);
    cr_assert_geq(metric("kvf_agent_disk_reads_total"), 2 * BATCH);
    kvf_client_disconnect(c);
}

Test(disk_it, clean_restart_on_the_same_disk_path_keeps_every_chunk)
{
    kvf_key_t keys[CHUNKS];
    kvf_lookup_result_t res;
    kvf_client_t *c;

    agent_start();
    c = connect_client();
    make_keys(keys, CHUNKS);
    store_all(c, keys);
    wait_writes(CHUNKS - 16);
    kvf_client_disconnect(c);
    cr_assert_eq(kvf_test_proc_stop(&g_agent, 10000), 0, "%s",
                 kvf_test_proc_log(&g_agent));

    agent_start();
    /* the stop wrote what was only in the pool too */
    cr_assert_eq(metric("kvf_agent_disk_recovered_chunks"), CHUNKS);
    c = connect_client();
    cr_assert_eq(kvf_client_lookup(c, keys, CHUNKS, false, &res), KVF_OK);
    cr_assert_eq(res.hit_chunks, CHUNKS, "the whole prefix is back");
    cr_assert_eq(retrieve_checked(c, keys, BATCH), BATCH);
    cr_assert_eq(retrieve_checked(c, keys + CHUNKS - BATCH, BATCH), BATCH);
    kvf_client_disconnect(c);
}

Test(disk_it, kill_9_during_write_behind_never_serves_wrong_bytes)
{
    kvf_key_t keys[CHUNKS];
    kvf_client_t *c;
    uint32_t b, got = 0;

    agent_start();
    c = connect_client();
    make_keys(keys, CHUNKS);
    store_all(c, keys);
    kvf_test_proc_kill(&g_agent); /* writes may still be in flight */
    kvf_client_disconnect(c);

    agent_start();
    c = connect_client();
    for (b = 0; b < CHUNKS; b += BATCH) {
        got += retrieve_checked(c, keys + b, BATCH);
    }
    cr_assert_leq(got, CHUNKS);
    kvf_client_disconnect(c);
}
