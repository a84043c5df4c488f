/* SPDX-License-Identifier: Apache-2.0 */
/* Copyright (c) 2026 The kvfabric authors */
/*
 * Peer-to-peer fetch between real agents over UCX (TCP on loopback): a
 * controller and three agents. Chunks stored through A are retrieved
 * through B byte for byte; a prefix is assembled from A and C; a holder
 * killed mid-way turns into misses within the fetch timeout, never a hang
 * or wrong bytes.
 */
#include "common/time.h"
#include "tests/helpers/proc.h"
#include "tests/helpers/test_helpers.h"
#include "tests/integration/controller_harness.h"

#include <kvfabric/kvfabric.h>

#include <criterion/criterion.h>

#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define CHUNK  (256u << 10)
#define AGENTS 3

typedef struct it_agent {
    kvf_test_proc_t proc;
    char sock[128];
    char http[64];
    char name[32];
} it_agent_t;

static kvf_th_ctl_t g_ctl;
static it_agent_t g_agents[AGENTS];
static char g_bin[4096];
static const char *g_pool = "32M"; /* --pool-size of the agents started */
/* flags of the next agent started, past the usual ones (NULL: none) */
static const char *const *g_extra;

static bool registered(const it_agent_t *a)
{
    char body[4096];
    uint16_t port = (uint16_t)atoi(strrchr(a->http, ':') + 1);

    return (kvf_test_http_get(port, "/healthz", body, sizeof(body)) == 200) &&
           (strstr(body, "\"registered\":true") != NULL);
}

static void start_agent(int i)
{
    it_agent_t *a      = &g_agents[i];
    const char *argv[] = {g_bin, "--controller", g_ctl.addr, "--name", a->name,
                          "--socket", a->sock, "--http", a->http, "--listen",
                          "127.0.0.1:0", "--pool-size", g_pool, "--max-chunk",
                          "1M", "--transports", "tcp", "--fetch-timeout", "3s",
                          "--prefetch-lease", "2s",
                          /* the UCX path: same-host copies have their own
                           * suite (test_same_host.c) */
                          "--same-host=false", NULL, NULL, NULL, NULL, NULL};
    size_t n           = 0, e;
    int k;

    while (argv[n] != NULL) {
        n++;
    }
    for (e = 0; (g_extra != NULL) && (g_extra[e] != NULL); e++) {
        cr_assert_lt(n + e + 1, sizeof(argv) / sizeof(argv[0]));
        argv[n + e] = g_extra[e];
    }
    snprintf(a->name, sizeof(a->name), "it-peer-%c", 'a' + i);
    snprintf(a->sock, sizeof(a->sock), "/tmp/kvf-peer-it-%d-%d.sock",
             (int)getpid(), i);
    snprintf(a->http, sizeof(a->http), "127.0.0.1:%u", kvf_test_free_port());
    cr_assert_eq(kvf_test_proc_start(&a->proc, argv), 0);
    for (k = 0; (k < 2000) && !registered(a); k++) {
        poll(NULL, 0, 5);
    }
    cr_assert(registered(a), "agent %s did not register: %s", a->name,
              kvf_test_proc_log(&a->proc));
}

static void setup(void)
{
    int i;

    snprintf(g_bin, sizeof(g_bin), "%s",
             kvf_test_build_path("agent/kvf-agent"));
    kvf_th_ctl_start(&g_ctl, NULL);
    for (i = 0; i < AGENTS; i++) {
        start_agent(i);
    }
}

static void teardown(void)
{
    int i;

    for (i = 0; i < AGENTS; i++) {
        kvf_test_proc_stop(&g_agents[i].proc, 10000);
    }
    kvf_th_ctl_stop(&g_ctl);
    kvf_test_check_leaks();
}

static int count_of(const char *text, const char *needle)
{
    int n = 0;

    for (text = strstr(text, needle); text != NULL;
         text = strstr(text + 1, needle)) {
        n++;
    }
    return n;
}

TestSuite(peer_fetch, .init = setup, .fini = teardown, .timeout = 120);

static kvf_client_t *connect_to(int i)
{
    kvf_client_params_t p = {.field_mask = KVF_CLIENT_PARAM_SOCKET |
                                           KVF_CLIENT_PARAM_TIMEOUT,
                             .socket_path = g_agents[i].sock,
                             .timeout_ns  = 20000000000ull};
    kvf_client_t *c       = NULL;

    cr_assert_eq(kvf_client_connect(&p, &c), KVF_OK);
    return c;
}

static void chain(kvf_key_t *keys, uint32_t n)
{
    uint32_t tokens[64 * 16];
    size_t got, i;

    for (i = 0; i < (size_t)n * 16; i++) {
        tokens[i] = (uint32_t)(i * 7 + 3);
    }
    cr_assert_eq(
        kvf_key_chain(0x77, tokens, (size_t)n * 16, 16, false, keys, n, &got),
        KVF_OK);
}

static void fill(uint8_t *p, const kvf_key_t *key)
{
    uint64_t x = key->lo | 1, i;

    for (i = 0; i < CHUNK; i += 8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        memcpy(p + i, &x, 8);
    }
}

/* Stores keys[from, to) through agent @p i. */
static void store_on(int i, const kvf_key_t *keys, uint32_t from, uint32_t to)
{
    kvf_client_t *c = connect_to(i);
    kvf_slot_t slots[64];
    uint64_t sums[64];
    uint32_t k, n = to - from;

    cr_assert_eq(kvf_client_alloc(c, CHUNK, n, slots), KVF_OK);
    for (k = 0; k < n; k++) {
        uint8_t *p = (uint8_t *)kvf_client_pool_base(c) + slots[k].offset;

        fill(p, &keys[from + k]);
        sums[k] = kvf_chunk_checksum(p, CHUNK);
    }
    cr_assert_eq(kvf_client_commit(c, keys + from, slots, sums, n), KVF_OK);
    kvf_client_disconnect(c);
}

/* Waits until a lookup through agent @p i sees @p hits chunks. */
static void wait_hits(int i, const kvf_key_t *keys, uint32_t n, uint32_t hits)
{
    kvf_client_t *c = connect_to(i);
    kvf_lookup_result_t res;
    int k;

    for (k = 0; k < 1000; k++) {
        cr_assert_eq(kvf_client_lookup(c, keys, n, false, &res), KVF_OK);
        if (res.hit_chunks == hits) {
            break;
        }
        poll(NULL, 0, 5);
    }
    cr_assert_eq(res.hit_chunks, hits, "lookup on agent %d", i);
    kvf_client_disconnect(c);
}

/* Retrieves through agent @p i and checks every byte of what came. */
static uint32_t retrieve_check(int i, const kvf_key_t *keys, uint32_t n,
                               bool *missing)
{
    kvf_client_t *c = connect_to(i);
    uint8_t *expect = malloc(CHUNK);
    kvf_slot_t slots[64];
    uint32_t k, got = 0;

    cr_assert_eq(kvf_client_retrieve(c, keys, n, slots, missing), KVF_OK, "%s",
                 kvf_client_last_error(c));
    for (k = 0; k < n; k++) {
        if (missing[k]) {
            continue;
        }
        fill(expect, &keys[k]);
        cr_assert_eq(slots[k].length, CHUNK);
        cr_assert(memcmp((uint8_t *)kvf_client_pool_base(c) + slots[k].offset,
                         expect, CHUNK) == 0,
                  "chunk %u fetched through agent %d differs", k, i);
        kvf_client_release(c, &slots[k], 1);
        got++;
    }
    free(expect);
    kvf_client_disconnect(c);
    return got;
}

Test(peer_fetch, store_on_a_fetch_on_b_byte_identical)
{
    kvf_key_t keys[12];
    bool missing[12];

    chain(keys, 12); /* more than a hold table's first size */
    store_on(0, keys, 0, 12);
    wait_hits(1, keys, 12, 12); /* B sees A's chunks through the controller */
    cr_assert_eq(retrieve_check(1, keys, 12, missing), 12);
    /* B admitted its new copies: they are local there now */
    wait_hits(1, keys, 12, 12);
    {
        static char body[65536];
        uint16_t port = (uint16_t)atoi(strrchr(g_agents[1].http, ':') + 1);

        cr_assert_eq(kvf_test_http_get(port, "/metrics", body, sizeof(body)),
                     200);
        cr_assert(strstr(body,
                         "kvf_agent_fetch_chunks_total{result=\"fetched\"} "
                         "12\n") != NULL,
                  "%s", body);
        cr_assert(strstr(body, "kvf_agent_fetch_seconds_count 1\n") != NULL,
                  "%s", body);
        cr_assert(strstr(body, "kvf_agent_fetch_bytes_total 3145728\n") != NULL,
                  "%s", body);
        /* per peer: B got all 12 from A, and A counted what it sent B */
        cr_assert(strstr(body, "kvf_agent_peer_fetch_bytes_total{peer=\"it-"
                               "peer-a\"} 3145728\n") != NULL,
                  "%s", body);
        port = (uint16_t)atoi(strrchr(g_agents[0].http, ':') + 1);
        cr_assert_eq(kvf_test_http_get(port, "/metrics", body, sizeof(body)),
                     200);
        cr_assert(strstr(body, "kvf_agent_peer_served_chunks_total{peer=\"it-"
                               "peer-b\"} 12\n") != NULL,
                  "%s", body);
    }
}

Test(peer_fetch, prefix_assembled_from_two_holders)
{
    kvf_key_t keys[6];
    bool missing[6];

    chain(keys, 6);
    store_on(0, keys, 0, 3);
    store_on(2, keys, 3, 6);
    wait_hits(1, keys, 6, 6);
    cr_assert_eq(retrieve_check(1, keys, 6, missing), 6);
}

Test(peer_fetch, dead_holder_becomes_misses_not_a_hang)
{
    kvf_key_t keys[4];
    bool missing[4];
    uint32_t got;

    chain(keys, 4);
    store_on(0, keys, 0, 4);
    wait_hits(1, keys, 4, 4);
    kvf_test_proc_kill(&g_agents[0].proc); /* kill -9 of the only holder */
    got = retrieve_check(1, keys, 4, missing);
    /* within the 3 s fetch timeout: every chunk missed, none wrong */
    cr_assert_eq(got, 0);
    cr_assert(missing[0] && missing[1] && missing[2] && missing[3]);
    got = retrieve_check(1, keys, 4, missing);
    cr_assert_eq(got, 0);
    /* the survivor names the dead peer once, not once per connection */
    cr_assert_eq(
        count_of(kvf_test_proc_log(&g_agents[1].proc), "peer node it-peer-a ("),
        1, "log: %s", kvf_test_proc_log(&g_agents[1].proc));
    cr_assert_null(strstr(kvf_test_proc_log(&g_agents[1].proc), "peer failed"),
                   "log: %s", kvf_test_proc_log(&g_agents[1].proc));
}

Test(peer_fetch, prefetch_then_retrieve_moves_each_chunk_once)
{
    static char body[65536];
    kvf_lookup_result_t res;
    kvf_key_t keys[8];
    kvf_client_t *c;
    bool missing[8];
    uint16_t port = (uint16_t)atoi(strrchr(g_agents[1].http, ':') + 1);
    char expect[128];

    chain(keys, 8);
    store_on(0, keys, 0, 8);
    wait_hits(2, keys, 8, 8); /* C sees them: the registry has them */
    c = connect_to(1);
    /* lookup with prefetch starts the transfer; the retrieve right after
     * joins it instead of fetching the same chunks again */
    cr_assert_eq(kvf_client_lookup(c, keys, 8, true, &res), KVF_OK);
    cr_assert_eq(res.hit_chunks, 8);
    cr_assert_eq(res.local_chunks, 0);
    kvf_client_disconnect(c);
    cr_assert_eq(retrieve_check(1, keys, 8, missing), 8);
    cr_assert_eq(kvf_test_http_get(port, "/metrics", body, sizeof(body)), 200);
    snprintf(expect, sizeof(expect), "kvf_agent_fetch_bytes_total %u\n",
             8 * CHUNK);
    cr_assert(strstr(body, expect) != NULL, "want %s in %s", expect, body);
}

Test(peer_fetch, stalled_controller_costs_reuse_not_a_hang)
{
    kvf_lookup_result_t res;
    kvf_key_t keys[4];
    kvf_client_t *c;
    uint64_t t0, took;

    chain(keys, 4);
    store_on(0, keys, 0, 4);
    wait_hits(1, keys, 4, 4);
    c = connect_to(1);
    kill(g_ctl.pid, SIGSTOP); /* the controller stops answering */
    t0 = kvf_time_now_ns();
    cr_assert_eq(kvf_client_lookup(c, keys, 4, false, &res), KVF_OK);
    took = kvf_time_now_ns() - t0;
    kill(g_ctl.pid, SIGCONT);
    /* lookup_timeout (100 ms): B answers with what it holds itself */
    cr_assert_eq(res.hit_chunks, 0);
    cr_assert_lt(took, 2 * KVF_NSEC_PER_SEC, "took %lu ns",
                 (unsigned long)took);
    kvf_client_disconnect(c);
}

Test(peer_fetch, damaged_chunk_becomes_a_miss_not_wrong_bytes)
{
    static char body[65536];
    kvf_client_t *a = connect_to(0);
    kvf_key_t keys[2];
    kvf_slot_t slots[2];
    uint64_t sums[2];
    bool missing[2];
    uint16_t port = (uint16_t)atoi(strrchr(g_agents[1].http, ':') + 1);
    uint8_t *p;
    int k;

    chain(keys, 2);
    cr_assert_eq(kvf_client_alloc(a, CHUNK, 2, slots), KVF_OK);
    for (k = 0; k < 2; k++) {
        p = (uint8_t *)kvf_client_pool_base(a) + slots[k].offset;
        fill(p, &keys[k]);
        sums[k] = kvf_chunk_checksum(p, CHUNK);
    }
    cr_assert_eq(kvf_client_commit(a, keys, slots, sums, 2), KVF_OK);
    /* the bytes of chunk 1 change after commit (a stray write into A's
     * pool; engines cannot): A still serves them with the original
     * checksum */
    cr_assert_eq(kvf_client_retrieve(a, &keys[1], 1, slots, missing), KVF_OK);
    cr_assert(!missing[0]);
    cr_assert_eq(kvf_client_release(a, slots, 1), KVF_OK);
    cr_assert_eq(kvf_test_agent_pool_flip(&g_agents[0].proc,
                                          slots[0].offset + CHUNK / 2),
                 0);
    kvf_client_disconnect(a);
    wait_hits(1, keys, 2, 2);
    cr_assert_eq(retrieve_check(1, keys, 2, missing), 1);
    cr_assert(!missing[0]);
    cr_assert(missing[1], "the damaged chunk is refused, never handed out");
    cr_assert_eq(kvf_test_http_get(port, "/metrics", body, sizeof(body)), 200);
    cr_assert(strstr(body, "kvf_agent_fetch_checksum_failures_total 1\n") !=
                  NULL,
              "%s", body);
}

/* A chunk fetched for a retrieve is handed to it unhashed (it was hashed
 * as it landed); every later retrieve of it hashes it again, so bytes
 * damaged in the requester's pool after that are refused. */
Test(peer_fetch, landed_chunk_is_verified_again_by_every_later_retrieve)
{
    static char body[65536];
    uint16_t port = (uint16_t)atoi(strrchr(g_agents[1].http, ':') + 1);
    kvf_client_t *b;
    kvf_key_t keys[2];
    kvf_slot_t slots[2];
    bool missing[2];

    chain(keys, 2);
    store_on(0, keys, 0, 2);
    wait_hits(1, keys, 2, 2);
    cr_assert_eq(retrieve_check(1, keys, 2, missing), 2, "fetched byte-exact");
    b = connect_to(1);
    cr_assert_eq(kvf_client_retrieve(b, &keys[1], 1, slots, missing), KVF_OK);
    cr_assert(!missing[0], "B holds what it fetched");
    cr_assert_eq(kvf_client_release(b, slots, 1), KVF_OK);
    cr_assert_eq(kvf_test_agent_pool_flip(&g_agents[1].proc,
                                          slots[0].offset + CHUNK / 3),
                 0);
    cr_assert_eq(kvf_client_retrieve(b, keys, 2, slots, missing), KVF_OK);
    cr_assert(!missing[0]);
    cr_assert(missing[1], "the damaged chunk is refused, never handed out");
    cr_assert_eq(kvf_client_release(b, slots, 1), KVF_OK);
    kvf_client_disconnect(b);
    cr_assert_eq(kvf_test_http_get(port, "/metrics", body, sizeof(body)), 200);
    cr_assert(strstr(body, "kvf_agent_checksum_failures_total 1\n") != NULL,
              "%s", body);
}

/* Runs kvfctl against the test controller with @p words; returns its exit
 * status. */
static int kvfctl(const char *const *words, int n, char *out, size_t len)
{
    const char *argv[32] = {kvf_test_build_path("tools/kvfctl"), "--controller",
                            g_ctl.addr};
    int i;

    for (i = 0; i < n; i++) {
        argv[3 + i] = words[i];
    }
    argv[3 + n] = NULL;
    return kvf_test_run(argv, out, len, 10000);
}

Test(peer_fetch, replicate_warms_a_node_ahead_of_demand)
{
    char formatted[4][KVF_KEY_STR_SIZE], out[4096];
    const char *words[8] = {"replicate", "it-peer-c"};
    kvf_lookup_result_t res;
    kvf_key_t keys[4];
    kvf_client_t *c;
    int k;

    chain(keys, 4);
    store_on(0, keys, 0, 4);
    wait_hits(2, keys, 4, 4);
    for (k = 0; k < 4; k++) {
        words[2 + k] = kvf_key_format(&keys[k], formatted[k]);
    }
    cr_assert_eq(kvfctl(words, 6, out, sizeof(out)), 0, "%s", out);
    /* C pulls the chunks on its next heartbeat, with no engine asking */
    c = connect_to(2);
    for (k = 0; k < 1000; k++) {
        cr_assert_eq(kvf_client_lookup(c, keys, 4, false, &res), KVF_OK);
        if (res.local_chunks == 4) {
            break;
        }
        poll(NULL, 0, 10);
    }
    kvf_client_disconnect(c);
    cr_assert_eq(res.local_chunks, 4, "C holds %u of 4 after replicate: %s",
                 res.local_chunks, kvf_test_proc_log(&g_agents[2].proc));
    /* an unknown node is an error, not a silent no-op */
    words[1] = "no-such-node";
    cr_assert_neq(kvfctl(words, 6, out, sizeof(out)), 0);
    /* replicate without keys is a usage error */
    cr_assert_eq(kvfctl(words, 2, out, sizeof(out)), 2);
}

Test(peer_fetch, soft_pin_reaches_the_holder)
{
    char formatted[2][KVF_KEY_STR_SIZE], out[4096];
    const char *words[8] = {"pin", "--soft"};
    kvf_key_t keys[2];
    int k;

    chain(keys, 2);
    store_on(0, keys, 0, 2);
    wait_hits(1, keys, 2, 2);
    for (k = 0; k < 2; k++) {
        words[2 + k] = kvf_key_format(&keys[k], formatted[k]);
    }
    cr_assert_eq(kvfctl(words, 4, out, sizeof(out)), 0, "%s", out);
    cr_assert(kvf_test_proc_wait_log(&g_agents[0].proc,
                                     "soft-pinned 2 of 2 chunks", 10000),
              "%s", kvf_test_proc_log(&g_agents[0].proc));
}

/* The value of metric line @p prefix (e.g. `name{label="x"} `) on agent
 * @p i, or -1 when absent. */
static long long metric(int i, const char *prefix)
{
    static char body[65536];
    uint16_t port = (uint16_t)atoi(strrchr(g_agents[i].http, ':') + 1);
    const char *p = body;

    if (kvf_test_http_get(port, "/metrics", body, sizeof(body)) != 200) {
        return -1;
    }
    /* a sample line starts with the name; HELP and TYPE lines do not */
    while ((p = strstr(p, prefix)) != NULL) {
        if ((p == body) || (p[-1] == '\n')) {
            return atoll(p + strlen(prefix));
        }
        p++;
    }
    return -1;
}

Test(peer_fetch, prefetch_lease_keeps_the_hit_until_retrieve)
{
    kvf_lookup_result_t res;
    kvf_key_t keys[8], filler[16];
    kvf_slot_t slots[16], got[8];
    uint64_t sums[16];
    kvf_client_t *c;
    bool missing[8];
    uint32_t round, k;
    int tries;

    chain(keys, 8);
    store_on(0, keys, 0, 8);
    wait_hits(1, keys, 8, 8);
    c = connect_to(1);
    cr_assert_eq(kvf_client_lookup(c, keys, 8, true, &res), KVF_OK);
    cr_assert_neq(res.lease_id, 0, "a prefetching lookup gets a lease");
    for (tries = 0;
         (tries < 1000) &&
         (metric(1, "kvf_agent_fetch_chunks_total{result=\"fetched\"} ") < 8);
         tries++) {
        poll(NULL, 0, 10);
    }
    cr_assert_eq(metric(1, "kvf_agent_prefetch_leases "), 1);
    /* fill B's pool twice over with other chunks: without the lease the
     * prefetched ones would be the first evicted */
    for (round = 0; round < 16; round++) {
        uint32_t tokens[16 * 16];
        size_t n;

        for (k = 0; k < 16 * 16; k++) {
            tokens[k] = 100000 + round * 1000 + k;
        }
        cr_assert_eq(
            kvf_key_chain(0x99, tokens, 16 * 16, 16, false, filler, 16, &n),
            KVF_OK);
        if (kvf_client_alloc(c, CHUNK, 16, slots) != KVF_OK) {
            continue; /* everything left is pinned: fine */
        }
        for (k = 0; k < 16; k++) {
            sums[k] = kvf_chunk_checksum(
                (uint8_t *)kvf_client_pool_base(c) + slots[k].offset, CHUNK);
        }
        cr_assert_eq(kvf_client_commit(c, filler, slots, sums, 16), KVF_OK);
    }
    cr_assert_gt(metric(1, "kvf_agent_evictions_total "), 0);
    /* the holder stops answering: only what B kept can be retrieved */
    kill(g_agents[0].proc.pid, SIGSTOP);
    cr_assert_eq(kvf_client_retrieve(c, keys, 8, got, missing), KVF_OK);
    kill(g_agents[0].proc.pid, SIGCONT);
    for (k = 0; k < 8; k++) {
        cr_assert(!missing[k], "prefetched chunk %u was evicted", k);
    }
    cr_assert_eq(kvf_client_release(c, got, 8), KVF_OK);
    /* the retrieve used the lease up */
    cr_assert_eq(metric(1, "kvf_agent_prefetch_leases "), 0);
    cr_assert_eq(
        metric(1, "kvf_agent_prefetch_leases_total{end=\"retrieved\"} "), 1);
    /* a lease never retrieved runs out (prefetch_lease: 2 s here) */
    cr_assert_eq(kvf_client_lookup(c, keys, 8, true, &res), KVF_OK);
    cr_assert_eq(metric(1, "kvf_agent_prefetch_leases "), 1);
    for (tries = 0;
         (tries < 1000) &&
         (metric(1, "kvf_agent_prefetch_leases_total{end=\"expired\"} ") < 1);
         tries++) {
        poll(NULL, 0, 10);
    }
    cr_assert_eq(metric(1, "kvf_agent_prefetch_leases_total{end=\"expired\"} "),
                 1);
    cr_assert_eq(metric(1, "kvf_agent_prefetch_leases "), 0);
    kvf_client_disconnect(c);
}

/* The value of the controller's metric line @p prefix, or -1. */
static long long ctl_metric(const char *prefix)
{
    static char body[65536];
    uint16_t port = (uint16_t)atoi(strrchr(g_ctl.http, ':') + 1);
    const char *p = body;

    if (kvf_test_http_get(port, "/metrics", body, sizeof(body)) != 200) {
        return -1;
    }
    while ((p = strstr(p, prefix)) != NULL) {
        if ((p == body) || (p[-1] == '\n')) {
            return atoll(p + strlen(prefix));
        }
        p++;
    }
    return -1;
}

Test(peer_fetch, one_controller_round_trip_per_request)
{
    uint32_t tokens[8 * 16];
    kvf_lookup_result_t res;
    kvf_key_t keys[8], other[8];
    long long lookups, infos;
    kvf_client_t *c;
    bool missing[8];
    size_t got, k;

    chain(keys, 8);
    for (k = 0; k < 8 * 16; k++) {
        tokens[k] = (uint32_t)(k * 11 + 5);
    }
    cr_assert_eq(kvf_key_chain(0x78, tokens, 8 * 16, 16, false, other, 8, &got),
                 KVF_OK);
    store_on(0, keys, 0, 8);
    store_on(2, other, 0, 8);
    wait_hits(2, keys, 8, 8); /* the registry has both */
    wait_hits(0, other, 8, 8);
    lookups = ctl_metric("kvf_controller_lookups_total ");
    infos   = ctl_metric("kvf_controller_node_info_total ");
    cr_assert_geq(lookups, 0);
    cr_assert_geq(infos, 0);
    /* B has never talked to A: a prefetching lookup then the retrieve
     * cost one LOOKUP (its reply names A's address) and no NODE_INFO */
    c = connect_to(1);
    cr_assert_eq(kvf_client_lookup(c, keys, 8, true, &res), KVF_OK);
    cr_assert_eq(res.hit_chunks, 8);
    kvf_client_disconnect(c);
    cr_assert_eq(retrieve_check(1, keys, 8, missing), 8);
    cr_assert_eq(ctl_metric("kvf_controller_lookups_total "), lookups + 1);
    cr_assert_eq(ctl_metric("kvf_controller_node_info_total "), infos);
    /* a retrieve with no lookup before it, from C (new to B): one LOOKUP */
    cr_assert_eq(retrieve_check(1, other, 8, missing), 8);
    cr_assert_eq(ctl_metric("kvf_controller_lookups_total "), lookups + 2);
    cr_assert_eq(ctl_metric("kvf_controller_node_info_total "), infos);
}

/* Small chunks of one fetch travel several a message (one rendezvous),
 * each scattered into its own slot and verified on its own. */
/* Byte @p b of small chunk @p k (key @p key). */
static uint8_t small_byte(const kvf_key_t *key, uint32_t k, uint32_t b)
{
    return (uint8_t)(key->lo >> (b % 8) ^ b ^ k);
}

/* Stores @p n chunks of @p size bytes under @p keys through agent A. */
static void small_store(const kvf_key_t *keys, uint32_t n, uint32_t size)
{
    kvf_slot_t *slots = calloc(n, sizeof(*slots));
    uint64_t *sums    = calloc(n, sizeof(*sums));
    kvf_client_t *c   = connect_to(0);
    uint32_t k, b;

    cr_assert((slots != NULL) && (sums != NULL));
    cr_assert_eq(kvf_client_alloc(c, size, n, slots), KVF_OK, "%s",
                 kvf_client_last_error(c));
    for (k = 0; k < n; k++) {
        uint8_t *p = (uint8_t *)kvf_client_pool_base(c) + slots[k].offset;

        for (b = 0; b < size; b++) {
            p[b] = small_byte(&keys[k], k, b);
        }
        sums[k] = kvf_chunk_checksum(p, size);
    }
    cr_assert_eq(kvf_client_commit(c, keys, slots, sums, n), KVF_OK);
    kvf_client_disconnect(c);
    free(slots);
    free(sums);
}

/* Retrieves @p keys through @p c and checks that every chunk came, byte
 * for byte. */
static void small_check(kvf_client_t *c, const kvf_key_t *keys, uint32_t n,
                        uint32_t size)
{
    kvf_slot_t *slots = calloc(n, sizeof(*slots));
    bool *missing     = calloc(n, sizeof(*missing));
    uint8_t *expect   = malloc(size);
    uint32_t k, b;

    cr_assert((slots != NULL) && (missing != NULL) && (expect != NULL));
    cr_assert_eq(kvf_client_retrieve(c, keys, n, slots, missing), KVF_OK, "%s",
                 kvf_client_last_error(c));
    for (k = 0; k < n; k++) {
        cr_assert(!missing[k], "chunk %u of %u missing", k, n);
        cr_assert_eq(slots[k].length, size);
        for (b = 0; b < size; b++) {
            expect[b] = small_byte(&keys[k], k, b);
        }
        cr_assert(memcmp((uint8_t *)kvf_client_pool_base(c) + slots[k].offset,
                         expect, size) == 0,
                  "chunk %u differs", k);
    }
    cr_assert_eq(kvf_client_release(c, slots, n), KVF_OK);
    free(slots);
    free(missing);
    free(expect);
}

Test(peer_fetch, small_chunks_travel_in_batches_byte_identical)
{
    enum {
        N     = 30,
        SMALL = 16u << 10
    };
    kvf_key_t keys[N];
    kvf_client_t *c;

    chain(keys, N);
    small_store(keys, N, SMALL);
    wait_hits(2, keys, N, N);
    c = connect_to(1);
    small_check(c, keys, N, SMALL);
    kvf_client_disconnect(c);
    /* 30 chunks in one message, none on its own */
    cr_assert_eq(metric(1, "kvf_agent_fetch_chunks_total{result=\"fetched\"} "),
                 N);
    cr_assert_eq(metric(1, "kvf_agent_fetch_messages_total{kind=\"batch\"} "),
                 1);
    cr_assert_eq(metric(1, "kvf_agent_fetch_messages_total{kind=\"chunk\"} "),
                 0);
}

/* One prefetch of far more keys than a holder sends one requester at once
 * (KVF_PEER_SERVE_PER_PEER): the requester asks in windows as chunks land.
 * Before, the holder answered the rest "busy" one message each, ran out of
 * UCX operations doing so, and the fetch waited for its deadline with every
 * chunk past the first 512 a miss. */
Test(peer_fetch, prefetch_of_thousands_of_chunks_is_pipelined)
{
    enum {
        N     = 2048,
        SMALL = 4096
    };
    kvf_key_t *keys = calloc(N, sizeof(*keys));
    kvf_lookup_result_t res;
    kvf_client_t *c;
    uint32_t k;

    cr_assert_not_null(keys);
    /* A and B again, with room for N blocks (64 KiB at the least) */
    g_pool = "160M";
    for (k = 0; k < 2; k++) {
        cr_assert_eq(kvf_test_proc_stop(&g_agents[k].proc, 10000), 0);
        start_agent((int)k);
    }
    for (k = 0; k < N; k++) {
        keys[k] = (kvf_key_t){.ns = 0x77, .hi = 0x5eed, .lo = k + 1};
    }
    small_store(keys, N, SMALL);
    wait_hits(2, keys, N, N);
    c = connect_to(1);
    cr_assert_eq(kvf_client_lookup(c, keys, N, true, &res), KVF_OK);
    cr_assert_eq(res.hit_chunks, N);
    small_check(c, keys, N, SMALL);
    kvf_client_disconnect(c);
    cr_assert_eq(metric(1, "kvf_agent_fetch_chunks_total{result=\"fetched\"} "),
                 N);
    free(keys);
}

/* Restarts every agent with room for 160 MiB of chunks, A (the holder of
 * what the tests store) with @p holder_flags besides. */
static void restart_holder_limited(const char *const *holder_flags)
{
    uint32_t k;

    g_pool = "160M";
    for (k = 0; k < AGENTS; k++) {
        g_extra = (k == 0) ? holder_flags : NULL;
        cr_assert_eq(kvf_test_proc_stop(&g_agents[k].proc, 10000), 0);
        start_agent((int)k);
    }
    g_extra = NULL;
}

/* More chunks at once than the holder's UCX worker has operations
 * (ucx_max_ops 16): two requesters prefetch from A at once 160 chunks of
 * 192 KiB (a rendezvous each) and 512 of 8 KiB (in batches). The sends
 * past the worker's operations wait for one, in order (the mesh's deferred
 * sends), and every chunk arrives byte for byte. Before, such a send
 * failed "busy", the holder dropped it without an answer, and the
 * requester missed the chunk at its fetch deadline. */
Test(peer_fetch, a_holder_out_of_worker_operations_still_serves_every_chunk)
{
    enum {
        BIG_N   = 160,
        BIG     = 192u << 10,
        SMALL_N = 512,
        SMALL   = 8u << 10
    };
    kvf_key_t *big   = calloc(BIG_N, sizeof(*big));
    kvf_key_t *small = calloc(SMALL_N, sizeof(*small));
    kvf_lookup_result_t res;
    kvf_client_t *c[2];
    uint32_t k;

    cr_assert((big != NULL) && (small != NULL));
    restart_holder_limited((const char *const[]){"--ucx-max-ops", "16", NULL});
    for (k = 0; k < BIG_N; k++) {
        big[k] = (kvf_key_t){.ns = 0x77, .hi = 0xb16, .lo = k + 1};
    }
    for (k = 0; k < SMALL_N; k++) {
        small[k] = (kvf_key_t){.ns = 0x77, .hi = 0x5a11, .lo = k + 1};
    }
    small_store(big, BIG_N, BIG);
    small_store(small, SMALL_N, SMALL);
    wait_hits(2, big, BIG_N, BIG_N);
    wait_hits(2, small, SMALL_N, SMALL_N);
    for (k = 0; k < 2; k++) {
        c[k] = connect_to((int)k + 1);
    }
    for (k = 0; k < 2; k++) { /* both fetches under way before any waits */
        cr_assert_eq(kvf_client_lookup(c[k], big, BIG_N, true, &res), KVF_OK);
        cr_assert_eq(res.hit_chunks, BIG_N);
        cr_assert_eq(kvf_client_lookup(c[k], small, SMALL_N, true, &res),
                     KVF_OK);
        cr_assert_eq(res.hit_chunks, SMALL_N);
    }
    for (k = 0; k < 2; k++) {
        small_check(c[k], big, BIG_N, BIG);
        small_check(c[k], small, SMALL_N, SMALL);
        kvf_client_disconnect(c[k]);
        cr_assert_eq(
            metric((int)k + 1,
                   "kvf_agent_fetch_chunks_total{result=\"fetched\"} "),
            BIG_N + SMALL_N);
    }
    cr_assert_gt(metric(0, "kvf_agent_mesh_deferred_total "), 0,
                 "the holder never ran out of operations: no burst tested");
    cr_log_info("holder burst: %lld sends waited for an operation",
                metric(0, "kvf_agent_mesh_deferred_total "));
    free(big);
    free(small);
}

/* A holder with every send it makes at once in flight (peer_serve_max 16,
 * and 16 UCX operations, so its sends wait for those too) answers the rest
 * of a requester's keys busy, and the requester asks again, waiting longer
 * each time, until each chunk arrives: 200 chunks of 192 KiB, every one
 * fetched byte for byte. Before, a key past the holder's sends was
 * answered missing, and the requester recomputed what the holder had. */
Test(peer_fetch, a_holder_at_its_send_limit_answers_busy_not_missing)
{
    enum {
        N   = 200,
        BIG = 192u << 10
    };
    kvf_key_t *keys = calloc(N, sizeof(*keys));
    kvf_lookup_result_t res;
    kvf_client_t *c;
    uint32_t k;

    cr_assert_not_null(keys);
    restart_holder_limited((const char *const[]){"--peer-serve-max", "16",
                                                 "--ucx-max-ops", "16", NULL});
    for (k = 0; k < N; k++) {
        keys[k] = (kvf_key_t){.ns = 0x77, .hi = 0xb05e, .lo = k + 1};
    }
    small_store(keys, N, BIG);
    wait_hits(2, keys, N, N);
    c = connect_to(1);
    cr_assert_eq(kvf_client_lookup(c, keys, N, true, &res), KVF_OK);
    cr_assert_eq(res.hit_chunks, N);
    small_check(c, keys, N, BIG);
    kvf_client_disconnect(c);
    cr_assert_eq(metric(1, "kvf_agent_fetch_chunks_total{result=\"fetched\"} "),
                 N);
    cr_assert_gt(metric(0, "kvf_agent_serve_refused_total{reason=\"busy\"} "),
                 0, "the holder never reached its send limit: nothing tested");
    cr_assert_eq(
        metric(0, "kvf_agent_serve_refused_total{reason=\"missing\"} "), 0);
    cr_log_info("holder at its limit: %lld keys answered busy",
                metric(0, "kvf_agent_serve_refused_total{reason=\"busy\"} "));
    free(keys);
}

/* The "transports" of node @p name in a nodes JSON document (kvfctl
 * --json nodes, /v1/nodes) into @p out; false when absent. */
static bool json_transports(const char *json, const char *name, char *out,
                            size_t len)
{
    char needle[64];
    const char *p, *next, *v;
    size_t n;

    snprintf(needle, sizeof(needle), "\"name\":\"%s\"", name);
    p = strstr(json, needle);
    if (p == NULL) {
        return false;
    }
    next = strstr(p, "{\"id\":"); /* the next node's object */
    v    = strstr(p, "\"transports\":\"");
    if ((v == NULL) || ((next != NULL) && (v > next))) {
        return false;
    }
    v += strlen("\"transports\":\"");
    n = strcspn(v, "\"");
    snprintf(out, len, "%.*s", (int)n, v);
    return true;
}

/* The last word of @p name's row of `kvfctl nodes` (TRANSPORTS). */
static bool table_transports(const char *table, const char *name, char *out,
                             size_t len)
{
    char needle[64];
    const char *p, *end, *w;

    snprintf(needle, sizeof(needle), " %s ", name);
    p = strstr(table, needle);
    if (p == NULL) {
        return false;
    }
    end = strchr(p, '\n');
    if (end == NULL) {
        end = p + strlen(p);
    }
    for (w = end; (w > p) && (w[-1] != ' '); w--) {
    }
    snprintf(out, len, "%.*s", (int)(end - w), w);
    return true;
}

/* Transport truth reaches the operator: after A and B fetched from each
 * other over UCX TCP, their heartbeats carry "tcp" to the controller and
 * kvfctl nodes (table and --json) and /v1/nodes show it; C, which talked
 * to no peer, shows none. */
Test(peer_fetch, kvfctl_nodes_shows_the_transports_in_use)
{
    static char out[16384], http_body[16384];
    const char *json_words[]  = {"--json", "nodes"};
    const char *table_words[] = {"nodes"};
    uint16_t port             = (uint16_t)atoi(strrchr(g_ctl.http, ':') + 1);
    kvf_key_t keys[4], other[4];
    uint32_t tokens[4 * 16];
    char a[96] = "", b[96] = "", c[96] = "";
    bool missing[4];
    size_t got, k;
    int tries;

    chain(keys, 4);
    for (k = 0; k < 4 * 16; k++) {
        tokens[k] = (uint32_t)(k * 13 + 1);
    }
    cr_assert_eq(kvf_key_chain(0x79, tokens, 4 * 16, 16, false, other, 4, &got),
                 KVF_OK);
    /* before any fetch no agent has a peer connection */
    cr_assert_eq(kvfctl(json_words, 2, out, sizeof(out)), 0, "%s", out);
    cr_assert(json_transports(out, "it-peer-a", a, sizeof(a)), "%s", out);
    cr_assert_str_eq(a, "", "%s", out);
    store_on(0, keys, 0, 4);
    store_on(1, other, 0, 4);
    wait_hits(1, keys, 4, 4);
    wait_hits(0, other, 4, 4);
    cr_assert_eq(retrieve_check(1, keys, 4, missing), 4);  /* B from A */
    cr_assert_eq(retrieve_check(0, other, 4, missing), 4); /* A from B */
    /* the next heartbeats (1 s) carry it */
    for (tries = 0; tries < 100; tries++) {
        cr_assert_eq(kvfctl(json_words, 2, out, sizeof(out)), 0, "%s", out);
        cr_assert(json_transports(out, "it-peer-a", a, sizeof(a)), "%s", out);
        cr_assert(json_transports(out, "it-peer-b", b, sizeof(b)), "%s", out);
        if ((strcmp(a, "tcp") == 0) && (strcmp(b, "tcp") == 0)) {
            break;
        }
        poll(NULL, 0, 100);
    }
    cr_assert_str_eq(a, "tcp", "%s\nlog A: %s", out,
                     kvf_test_proc_log(&g_agents[0].proc));
    cr_assert_str_eq(b, "tcp", "%s\nlog B: %s", out,
                     kvf_test_proc_log(&g_agents[1].proc));
    cr_assert(json_transports(out, "it-peer-c", c, sizeof(c)), "%s", out);
    cr_assert_str_eq(c, "", "C talked to no peer: %s", out);
    /* the table: TRANSPORTS is the last column, "-" for none */
    cr_assert_eq(kvfctl(table_words, 1, out, sizeof(out)), 0, "%s", out);
    cr_assert_not_null(strstr(out, " TRANSPORTS\n"), "%s", out);
    cr_assert(table_transports(out, "it-peer-a", a, sizeof(a)), "%s", out);
    cr_assert(table_transports(out, "it-peer-b", b, sizeof(b)), "%s", out);
    cr_assert(table_transports(out, "it-peer-c", c, sizeof(c)), "%s", out);
    cr_assert_str_eq(a, "tcp", "%s", out);
    cr_assert_str_eq(b, "tcp", "%s", out);
    cr_assert_str_eq(c, "-", "%s", out);
    /* the controller's HTTP API says the same */
    cr_assert_eq(
        kvf_test_http_get(port, "/v1/nodes", http_body, sizeof(http_body)),
        200);
    cr_assert(json_transports(http_body, "it-peer-a", a, sizeof(a)), "%s",
              http_body);
    cr_assert(json_transports(http_body, "it-peer-b", b, sizeof(b)), "%s",
              http_body);
    cr_assert(json_transports(http_body, "it-peer-c", c, sizeof(c)), "%s",
              http_body);
    cr_assert_str_eq(a, "tcp", "%s", http_body);
    cr_assert_str_eq(b, "tcp", "%s", http_body);
    cr_assert_str_eq(c, "", "%s", http_body);
}
