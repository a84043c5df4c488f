/* SPDX-License-Identifier: Apache-2.0 */
/* Copyright (c) 2026 The kvfabric authors */
/*
 * libkvfabric against a real kvf-agent process: store chunks through the
 * shared pool, find and read them back byte for byte, and every way an
 * engine can get it wrong (bad checksum, foreign offsets, full pool, crash
 * with grants held) gives a clear error and leaves the cache intact.
 */
#include "common/time.h"
#include "tests/helpers/proc.h"
#include "tests/helpers/test_helpers.h"

#include <kvfabric/kvfabric.h>

#include <criterion/criterion.h>

#include <inttypes.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#define CHUNK (256u << 10)

static kvf_test_proc_t g_agent;
static char g_sock[128], g_bin[4096];

static void agent_start(const char *pool_size)
{
    char http[64];
    const char *argv[] = {
        g_bin,         "--controller", "127.0.0.1:1", "--listen",
        "127.0.0.1:0", "--name",       "client-it",   "--socket",
        g_sock,        "--http",       http,          "--pool-size",
        pool_size,     "--max-chunk",  "1M",          NULL};

    snprintf(g_bin, sizeof(g_bin), "%s",
             kvf_test_build_path("agent/kvf-agent"));
    snprintf(g_sock, sizeof(g_sock), "/tmp/kvf-client-it-%d.sock",
             (int)getpid());
    snprintf(http, sizeof(http), "127.0.0.1:%u", kvf_test_free_port());
    cr_assert_eq(kvf_test_proc_start(&g_agent, argv), 0);
    cr_assert(kvf_test_proc_wait_log(&g_agent, "engines connect at", 10000),
              "agent did not start: %s", kvf_test_proc_log(&g_agent));
}

static void client_teardown(void)
{
    cr_assert_eq(kvf_test_proc_stop(&g_agent, 10000), 0, "agent exit; log: %s",
                 kvf_test_proc_log(&g_agent));
    kvf_test_check_leaks();
}

TestSuite(client, .fini = client_teardown, .timeout = 60);

static kvf_client_t *connect_client(void)
{
    kvf_client_params_t p = {
        .field_mask = KVF_CLIENT_PARAM_SOCKET | KVF_CLIENT_PARAM_TIMEOUT |
                      KVF_CLIENT_PARAM_NAME,
        .socket_path = g_sock,
        .timeout_ns  = 5000000000ull,
        .name        = "test-engine",
    };
    kvf_client_t *client = NULL;
    kvf_status_t status  = kvf_client_connect(&p, &client);

    cr_assert_eq(status, KVF_OK, "connect: %s", kvf_strerror(status));
    return client;
}

static void make_keys(kvf_key_t *keys, uint32_t n, uint64_t salt)
{
    uint32_t tokens[4096];
    size_t got, i;

    for (i = 0; i < 4096; i++) {
        tokens[i] = (uint32_t)(i * 7 + salt);
    }
    cr_assert_eq(kvf_key_chain(0x1234, tokens, (size_t)n * 256, 256, false,
                               keys, n, &got),
                 KVF_OK);
    cr_assert_eq(got, n);
}

static void fill(uint8_t *p, size_t len, uint32_t seed)
{
    size_t i;

    for (i = 0; i < len; i++) {
        seed = seed * 1103515245u + 12345u;
        p[i] = (uint8_t)(seed >> 16);
    }
}

/* Stores @p n chunks; returns their checksums in @p sums. */
static void store_chunks(kvf_client_t *c, const kvf_key_t *keys, uint32_t n,
                         uint64_t *sums)
{
    uint8_t *base = kvf_client_pool_base(c);
    kvf_slot_t slots[16];
    uint32_t i;

    cr_assert_eq(kvf_client_alloc(c, CHUNK, n, slots), KVF_OK, "alloc: %s",
                 kvf_client_last_error(c));
    for (i = 0; i < n; i++) {
        cr_assert_eq(slots[i].length, CHUNK);
        fill(base + slots[i].offset, CHUNK, (uint32_t)keys[i].lo);
        sums[i] = kvf_chunk_checksum(base + slots[i].offset, CHUNK);
    }
    cr_assert_eq(kvf_client_commit(c, keys, slots, sums, n), KVF_OK,
                 "commit: %s", kvf_client_last_error(c));
}

Test(client, store_lookup_retrieve_byte_identical)
{
    kvf_client_t *writer, *reader;
    kvf_key_t keys[4], more[6];
    kvf_lookup_result_t res;
    kvf_slot_t slots[6];
    uint64_t sums[4];
    bool missing[6];
    uint8_t *expect;
    uint32_t i;

    agent_start("64M");
    writer = connect_client();
    make_keys(keys, 4, 1);
    store_chunks(writer, keys, 4, sums);

    /* another engine process sees the same pool */
    reader = connect_client();
    make_keys(more, 6, 1); /* same first 4 keys, then 2 never stored */
    cr_assert_eq(kvf_client_lookup(reader, more, 6, false, &res), KVF_OK);
    cr_assert_eq(res.hit_chunks, 4);
    cr_assert_eq(res.local_chunks, 4);
    cr_assert_eq(kvf_client_retrieve(reader, more, 6, slots, missing), KVF_OK);
    expect = malloc(CHUNK);
    for (i = 0; i < 4; i++) {
        cr_assert(!missing[i]);
        cr_assert_eq(slots[i].length, CHUNK);
        fill(expect, CHUNK, (uint32_t)keys[i].lo);
        cr_assert(
            memcmp((uint8_t *)kvf_client_pool_base(reader) + slots[i].offset,
                   expect, CHUNK) == 0,
            "chunk %u differs", i);
    }
    cr_assert(missing[4] && missing[5], "exactly the unknown chunks miss");
    {
        kvf_client_stats_t st;

        cr_assert_eq(kvf_client_stats(reader, &st), KVF_OK);
        cr_assert_eq(st.chunks, 4);
        cr_assert_eq(st.local_hits, 4);
        cr_assert_eq(st.misses, 2);
        cr_assert_eq(st.pool_used, 4ull * CHUNK);
        cr_assert_eq(st.registered, false, "no controller in this test");
        cr_assert_eq(kvf_client_stats(reader, NULL), KVF_ERR_INVALID);
    }
    cr_assert_eq(slots[4].length, 0);
    cr_assert_eq(kvf_client_release(reader, slots, 4), KVF_OK);
    cr_assert_eq(kvf_client_release(reader, slots, 1), KVF_ERR_RANGE,
                 "a pin released twice");
    free(expect);
    kvf_client_disconnect(reader);
    kvf_client_disconnect(writer);
}

Test(client, wrong_checksum_is_refused)
{
    kvf_client_t *c;
    kvf_slot_t slot;
    kvf_key_t key;
    uint64_t sum;
    bool missing;

    agent_start("64M");
    c = connect_client();
    make_keys(&key, 1, 2);
    cr_assert_eq(kvf_client_alloc(c, CHUNK, 1, &slot), KVF_OK);
    fill((uint8_t *)kvf_client_pool_base(c) + slot.offset, CHUNK, 9);
    sum = kvf_chunk_checksum((uint8_t *)kvf_client_pool_base(c) + slot.offset,
                             CHUNK) ^
          1;
    cr_assert_eq(kvf_client_commit(c, &key, &slot, &sum, 1), KVF_ERR_CHECKSUM);
    cr_assert_eq(kvf_client_retrieve(c, &key, 1, &slot, &missing), KVF_OK);
    cr_assert(missing, "a chunk that failed its checksum is never served");
    kvf_client_disconnect(c);
}

Test(client, offsets_outside_grants_are_refused)
{
    kvf_client_t *a, *b;
    kvf_slot_t slot, foreign;
    kvf_key_t key;
    uint64_t sum = 0;

    agent_start("64M");
    a = connect_client();
    b = connect_client();
    make_keys(&key, 1, 3);
    cr_assert_eq(kvf_client_alloc(a, CHUNK, 1, &slot), KVF_OK);
    /* b commits a's grant: not its own */
    cr_assert_eq(kvf_client_commit(b, &key, &slot, &sum, 1), KVF_ERR_RANGE);
    /* an offset in the middle of nowhere */
    foreign.offset = 12345;
    foreign.length = CHUNK;
    cr_assert_eq(kvf_client_commit(a, &key, &foreign, &sum, 1), KVF_ERR_RANGE);
    cr_assert_eq(kvf_client_release(b, &slot, 1), KVF_ERR_RANGE);
    cr_assert_eq(kvf_client_release(a, &slot, 1), KVF_OK,
                 "an uncommitted grant can be given back");
    kvf_client_disconnect(a);
    kvf_client_disconnect(b);
}

/* One batch big enough for the agent's copy threads, one grant named
 * twice: the first key naming it gets it, the second is KVF_ERR_RANGE, and
 * every other chunk lands byte for byte. */
Test(client, a_grant_named_twice_in_one_commit_lands_once)
{
    uint8_t *base, *expect = malloc(CHUNK);
    kvf_slot_t slots[8], named[8], got[8];
    kvf_key_t keys[8];
    uint64_t sums[8];
    bool missing[8];
    uint32_t i;

    agent_start("64M");
    {
        kvf_client_t *c = connect_client();

        base = kvf_client_pool_base(c);
        make_keys(keys, 8, 11);
        cr_assert_eq(kvf_client_alloc(c, CHUNK, 8, slots), KVF_OK);
        for (i = 0; i < 8; i++) {
            fill(base + slots[i].offset, CHUNK, (uint32_t)keys[i].lo);
            named[i] = slots[i];
        }
        named[5] = slots[2]; /* keys 2 and 5 name one grant */
        for (i = 0; i < 8; i++) {
            sums[i] = kvf_chunk_checksum(base + named[i].offset, CHUNK);
        }
        cr_assert_eq(kvf_client_commit(c, keys, named, sums, 8), KVF_ERR_RANGE);
        cr_assert_eq(kvf_client_release(c, &slots[5], 1), KVF_OK,
                     "the grant nobody committed is still ours");
        cr_assert_eq(kvf_client_retrieve(c, keys, 8, got, missing), KVF_OK);
        for (i = 0; i < 8; i++) {
            if (i == 5) {
                cr_assert(missing[i], "the second naming of a grant");
                continue;
            }
            cr_assert(!missing[i], "chunk %u", i);
            fill(expect, CHUNK, (uint32_t)keys[i].lo);
            cr_assert(memcmp(base + got[i].offset, expect, CHUNK) == 0,
                      "chunk %u differs", i);
            cr_assert_eq(kvf_client_release(c, &got[i], 1), KVF_OK);
        }
        kvf_client_disconnect(c);
    }
    free(expect);
}

Test(client, oversized_and_empty_requests)
{
    kvf_client_t *c;
    kvf_slot_t slot;

    agent_start("64M");
    c = connect_client();
    cr_assert_eq(kvf_client_alloc(c, 2u << 20, 1, &slot), KVF_ERR_TOO_BIG,
                 "over --max-chunk 1M");
    cr_assert(strstr(kvf_client_last_error(c), "too big") != NULL, "%s",
              kvf_client_last_error(c));
    cr_assert_eq(kvf_client_alloc(c, CHUNK, 0, &slot), KVF_ERR_INVALID);
    kvf_client_disconnect(c);
}

Test(client, full_pool_of_pinned_chunks_fails_fast)
{
    kvf_client_t *c;
    kvf_key_t keys[8];
    kvf_slot_t slots[8], extra;
    uint64_t sums[8];
    bool missing[8];

    agent_start("2M"); /* room for exactly 8 chunks of 256 KiB */
    c = connect_client();
    make_keys(keys, 8, 4);
    store_chunks(c, keys, 8, sums);
    cr_assert_eq(kvf_client_retrieve(c, keys, 8, slots, missing), KVF_OK);
    /* everything is pinned: no eviction possible, no waiting */
    cr_assert_eq(kvf_client_alloc(c, CHUNK, 1, &extra), KVF_ERR_NO_MEMORY);
    /* unpinned chunks are evicted (LRU) to make room */
    cr_assert_eq(kvf_client_release(c, slots, 8), KVF_OK);
    cr_assert_eq(kvf_client_alloc(c, CHUNK, 1, &extra), KVF_OK);
    kvf_client_disconnect(c);
}

Test(client, engine_crash_leaves_cache_intact)
{
    kvf_client_t *c;
    kvf_key_t keys[2];
    kvf_lookup_result_t res;
    uint64_t sums[2];
    pid_t pid;
    int status;

    agent_start("64M");
    make_keys(keys, 2, 5);
    pid = fork();
    cr_assert_neq(pid, -1);
    if (pid == 0) {
        /* the engine: plain checks, no test-runner calls in the child */
        kvf_client_params_t p = {.field_mask  = KVF_CLIENT_PARAM_SOCKET,
                                 .socket_path = g_sock};
        kvf_client_t *dying   = NULL;
        uint8_t *base;
        kvf_slot_t grant[3];
        int i;

        if ((kvf_client_connect(&p, &dying) != KVF_OK) ||
            (kvf_client_alloc(dying, CHUNK, 3, grant) != KVF_OK)) {
            _exit(3);
        }
        base = kvf_client_pool_base(dying);
        for (i = 0; i < 2; i++) {
            fill(base + grant[i].offset, CHUNK, (uint32_t)keys[i].lo);
            sums[i] = kvf_chunk_checksum(base + grant[i].offset, CHUNK);
        }
        if (kvf_client_commit(dying, keys, grant, sums, 2) != KVF_OK) {
            _exit(4);
        }
        raise(SIGKILL); /* dies holding grant[2], never committed */
        _exit(5);
    }
    waitpid(pid, &status, 0);
    cr_assert(WIFSIGNALED(status), "engine child failed: status %d", status);
    c = connect_client();
    cr_assert_eq(kvf_client_lookup(c, keys, 2, false, &res), KVF_OK);
    cr_assert_eq(res.hit_chunks, 2, "committed chunks survive the engine");
    kvf_client_disconnect(c);
}

Test(client, no_agent_is_a_clear_error)
{
    kvf_client_params_t p = {.field_mask  = KVF_CLIENT_PARAM_SOCKET,
                             .socket_path = "/tmp/kvf-no-agent-here.sock"};
    kvf_client_t *c       = NULL;

    agent_start("4M"); /* the suite's teardown stops an agent */
    cr_assert_eq(kvf_client_connect(&p, &c), KVF_ERR_IO);
    cr_assert_null(c);
    /* the reason, with the path, for the engine's log (#17 item 3) */
    cr_assert_not_null(
        strstr(kvf_client_last_error(NULL), "/tmp/kvf-no-agent-here.sock"),
        "%s", kvf_client_last_error(NULL));
}

/* The agent restarts under a connected engine: the call in flight fails
 * with KVF_ERR_CLOSED naming the agent, calls while it is away fail fast,
 * and calls succeed again within a second of the new agent being up, on
 * the same pool address, with no help from the engine. */
Test(client, reconnects_after_the_agent_restarts)
{
    kvf_client_stats_t stats;
    kvf_lookup_result_t res;
    kvf_key_t keys[2];
    uint64_t sums[2], up, t0;
    kvf_client_t *c;
    kvf_status_t st = KVF_ERR_CLOSED;
    void *base;

    agent_start("16M");
    c    = connect_client();
    base = kvf_client_pool_base(c);
    make_keys(keys, 2, 41);
    store_chunks(c, keys, 2, sums);

    cr_assert_eq(kvf_test_proc_stop(&g_agent, 10000), 0, "%s",
                 kvf_test_proc_log(&g_agent));
    cr_assert_eq(kvf_client_stats(c, &stats), KVF_ERR_CLOSED);
    cr_assert_not_null(strstr(kvf_client_last_error(c), g_sock), "%s",
                       kvf_client_last_error(c));
    t0 = kvf_time_now_ms();
    cr_assert_eq(kvf_client_stats(c, &stats), KVF_ERR_CLOSED);
    cr_assert_not_null(strstr(kvf_client_last_error(c), "reconnect"), "%s",
                       kvf_client_last_error(c));
    cr_assert_lt(kvf_time_now_ms() - t0, 1000, "no agent: fails fast");

    agent_start("16M");
    up = kvf_time_now_ms();
    while (kvf_time_now_ms() - up < 1000) {
        st = kvf_client_stats(c, &stats);
        if (st == KVF_OK) {
            break;
        }
        cr_assert_eq(st, KVF_ERR_CLOSED, "%s", kvf_client_last_error(c));
        usleep(5000);
    }
    cr_assert_eq(st, KVF_OK, "not back within 1 s: %s",
                 kvf_client_last_error(c));
    cr_assert_eq(kvf_client_reconnects(c), 1);
    cr_assert_eq(kvf_client_pool_base(c), base, "same pool address");
    /* the new agent's cache is empty; storing and finding work again */
    cr_assert_eq(kvf_client_lookup(c, keys, 2, false, &res), KVF_OK);
    cr_assert_eq(res.hit_chunks, 0);
    store_chunks(c, keys, 2, sums);
    cr_assert_eq(kvf_client_lookup(c, keys, 2, false, &res), KVF_OK);
    cr_assert_eq(res.hit_chunks, 2);

    /* restarted while the engine was idle: the first call after the new
     * agent is up already succeeds (it was never sent to the old one) */
    cr_assert_eq(kvf_test_proc_stop(&g_agent, 10000), 0, "%s",
                 kvf_test_proc_log(&g_agent));
    agent_start("16M");
    cr_assert_eq(kvf_client_stats(c, &stats), KVF_OK, "%s",
                 kvf_client_last_error(c));
    cr_assert_eq(kvf_client_reconnects(c), 2);
    kvf_client_disconnect(c);
}

/* The restarted agent has a larger pool: the new one is mapped (at the
 * old address when the addresses after it are free), pointers from the
 * old base still read memory, and chunks store and read back right. */
Test(client, reconnects_to_a_larger_pool)
{
    kvf_client_stats_t stats;
    kvf_lookup_result_t res;
    kvf_slot_t slots[2];
    kvf_key_t keys[2];
    uint64_t sums[2];
    bool missing[2];
    volatile uint8_t *old;
    uint64_t old_size;
    kvf_client_t *c;
    uint32_t i;
    uint8_t *base;

    agent_start("8M");
    c        = connect_client();
    old      = kvf_client_pool_base(c);
    old_size = kvf_client_pool_size(c);
    cr_assert_eq(kvf_test_proc_stop(&g_agent, 10000), 0, "%s",
                 kvf_test_proc_log(&g_agent));
    agent_start("32M");
    cr_assert_eq(kvf_client_stats(c, &stats), KVF_OK, "%s",
                 kvf_client_last_error(c));
    cr_assert_gt(kvf_client_pool_size(c), old_size, "%" PRIu64 " bytes",
                 kvf_client_pool_size(c));
    (void)old[old_size - 1]; /* the old range is still mapped */
    make_keys(keys, 2, 77);
    store_chunks(c, keys, 2, sums);
    cr_assert_eq(kvf_client_retrieve(c, keys, 2, slots, missing), KVF_OK, "%s",
                 kvf_client_last_error(c));
    base = kvf_client_pool_base(c);
    for (i = 0; i < 2; i++) {
        cr_assert(!missing[i]);
        cr_assert_eq(kvf_chunk_checksum(base + slots[i].offset, CHUNK),
                     sums[i]);
    }
    cr_assert_eq(kvf_client_release(c, slots, 2), KVF_OK);
    cr_assert_eq(kvf_client_lookup(c, keys, 2, false, &res), KVF_OK);
    cr_assert_eq(res.hit_chunks, 2);
    kvf_client_disconnect(c);
}

Test(client, demo_engine_reuses_prefixes_and_reads_back_right_bytes)
{
    char out[4096], bin[4096];
    const char *argv[] = {bin,    "--socket",      g_sock, "--kv-heads",
                          "2",    "--layers",      "2",    "--conversations",
                          "3",    "--turns",       "2",    "--system-tokens",
                          "1024", "--turn-tokens", "256",  "--documents",
                          "2",    "--json",        NULL};

    agent_start("64M");
    snprintf(bin, sizeof(bin), "%s",
             kvf_test_build_path("tools/kvf-demo-engine"));
    cr_assert_eq(kvf_test_run(argv, out, sizeof(out), 30000), 0, "%s", out);
    cr_assert(strstr(out, "\"wrong_bytes\":0") != NULL, "%s", out);
    /* 3 conversations share a 4-chunk system prompt: 2 of them reuse it */
    cr_assert(strstr(out, "\"chunks_hit\":0,") == NULL, "%s", out);
    cr_assert(strstr(out, "\"prompts\":12,") != NULL, "%s", out);
}

/* Connects a raw Unix socket to the agent. */
static int raw_connect(void)
{
    struct sockaddr_un sun;
    int fd = socket(AF_UNIX, SOCK_STREAM, 0);

    cr_assert_geq(fd, 0);
    memset(&sun, 0, sizeof(sun));
    sun.sun_family = AF_UNIX;
    cr_assert_lt(strlen(g_sock), sizeof(sun.sun_path));
    memcpy(sun.sun_path, g_sock, strlen(g_sock) + 1);
    cr_assert_eq(connect(fd, (struct sockaddr *)&sun, sizeof(sun)), 0);
    return fd;
}

/* true when the agent closed @p fd (read returns 0 or an error). */
static bool closed_by_peer(int fd)
{
    struct pollfd pfd = {.fd = fd, .events = POLLIN};
    char buf[4096];

    while (poll(&pfd, 1, 5000) == 1) {
        ssize_t n = read(fd, buf, sizeof(buf));

        if (n <= 0) {
            return true;
        }
    }
    return false;
}

Test(client, malformed_frames_close_only_that_connection)
{
    static const uint8_t garbage[]   = {0xff, 0xff, 0xff, 0xff, 1, 0, 0, 0};
    static const uint8_t wrong[]     = {0, 0, 0, 0, 41, 0, 0, 0};
    static const uint8_t bad_proto[] = {6, 0,    0,   0,   1,   0,   0,
                                        0, 0x22, 100, 'a', 'b', 'c', 'd'};
    kvf_client_t *ok;
    kvf_slot_t slot;
    int fd;

    agent_start("16M");
    ok = connect_client(); /* a well-behaved engine alongside */

    fd = raw_connect(); /* an absurd length */
    cr_assert_eq(write(fd, garbage, sizeof(garbage)), (ssize_t)sizeof(garbage));
    cr_assert(closed_by_peer(fd));
    close(fd);

    fd = raw_connect(); /* a request before HELLO */
    cr_assert_eq(write(fd, wrong, sizeof(wrong)), (ssize_t)sizeof(wrong));
    cr_assert(closed_by_peer(fd));
    close(fd);

    fd = raw_connect(); /* a HELLO that does not decode */
    cr_assert_eq(write(fd, bad_proto, sizeof(bad_proto)),
                 (ssize_t)sizeof(bad_proto));
    cr_assert(closed_by_peer(fd));
    close(fd);

    /* the agent and the other engine carry on */
    cr_assert_eq(kvf_client_alloc(ok, CHUNK, 1, &slot), KVF_OK, "%s",
                 kvf_client_last_error(ok));
    cr_assert_eq(kvf_client_release(ok, &slot, 1), KVF_OK);
    kvf_client_disconnect(ok);
}
