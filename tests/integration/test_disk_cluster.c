/* SPDX-License-Identifier: Apache-2.0 */
/* Copyright (c) 2026 The kvfabric authors */
/*
 * The disk tier seen by the cluster (issue #20 items 3 and 2), with real
 * processes: a controller, agent A (a 4 MiB pool and a disk tier) and
 * agent B (no tier). Chunks A's pool evicts stay A's, on disk, in the
 * controller's registry; B's engine retrieves them from A's disk byte for
 * byte; a dead disk is a miss, never wrong bytes; a restarted A re-admits
 * what its disk kept.
 */
#include "common/time.h"
#include "proto/frame.h"
#include "proto/msg.h"
#include "tests/helpers/proc.h"
#include "tests/helpers/test_helpers.h"
#include "tests/integration/controller_harness.h"

#include <kvfabric/kvfabric.h>

#include <criterion/criterion.h>

#include <inttypes.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define CHUNK  (256u << 10)
#define CHUNKS 48u /* A's pool holds 16 */
#define BATCH  8u

typedef struct dc_agent {
    kvf_test_proc_t proc;
    char sock[128];
    char http[64];
    char name[32];
} dc_agent_t;

static kvf_th_ctl_t g_ctl;
static dc_agent_t g_a, g_b;
static char g_bin[4096], g_dir[64], g_tier[128];
static const char *g_pool_a  = "4M";  /* A's pool (16 chunks) */
static const char *g_disk_a  = "64M"; /* A's disk (63 slots of 1 MiB) */
static const char *g_depth_a = "32";  /* A's disk_queue_depth */

static uint16_t port_of(const char *hostport)
{
    return (uint16_t)atoi(strrchr(hostport, ':') + 1);
}

static bool registered(const dc_agent_t *a)
{
    char body[4096];

    return (kvf_test_http_get(port_of(a->http), "/healthz", body,
                              sizeof(body)) == 200) &&
           (strstr(body, "\"registered\":true") != NULL);
}

static void start_agent(dc_agent_t *a, const char *name, bool with_disk)
{
    const char *argv[32] = {
        g_bin,   "--controller", g_ctl.addr,    "--name",
        name,    "--socket",     a->sock,       "--http",
        a->http, "--listen",     "127.0.0.1:0", "--max-chunk",
        "1M",    "--transports", "tcp",         "--fetch-timeout",
        "3s",    "--pool-size"};
    int n = 18, k;

    snprintf(a->name, sizeof(a->name), "%s", name);
    snprintf(a->sock, sizeof(a->sock), "/tmp/kvf-dc-it-%d-%s.sock",
             (int)getpid(), name);
    snprintf(a->http, sizeof(a->http), "127.0.0.1:%u", kvf_test_free_port());
    if (with_disk) {
        argv[n++] = g_pool_a;
        argv[n++] = "--disk-path";
        argv[n++] = g_tier;
        argv[n++] = "--disk-size";
        argv[n++] = g_disk_a;
        argv[n++] = "--disk-queue-depth";
        argv[n++] = g_depth_a;
    } else {
        argv[n++] = "32M";
    }
    argv[n] = NULL;
    cr_assert_eq(kvf_test_proc_start(&a->proc, argv), 0);
    for (k = 0; (k < 2000) && !registered(a); k++) {
        poll(NULL, 0, 5);
    }
    cr_assert(registered(a), "agent %s did not register: %s", name,
              kvf_test_proc_log(&a->proc));
}

static void setup(void)
{
    snprintf(g_bin, sizeof(g_bin), "%s",
             kvf_test_build_path("agent/kvf-agent"));
    snprintf(g_dir, sizeof(g_dir), "/tmp/kvf-dc-it-XXXXXX");
    cr_assert_not_null(mkdtemp(g_dir));
    snprintf(g_tier, sizeof(g_tier), "%s/tier", g_dir);
    kvf_th_ctl_start(&g_ctl, NULL);
    start_agent(&g_a, "dc-a", true);
    start_agent(&g_b, "dc-b", false);
}

static void teardown(void)
{
    kvf_test_proc_stop(&g_b.proc, 10000);
    if (kvf_test_proc_alive(&g_a.proc)) {
        cr_assert_eq(kvf_test_proc_stop(&g_a.proc, 10000), 0,
                     "agent A exit; log: %s", kvf_test_proc_log(&g_a.proc));
    }
    kvf_th_ctl_stop(&g_ctl);
    unlink(g_tier);
    rmdir(g_dir);
    kvf_test_check_leaks();
}

TestSuite(disk_cluster, .init = setup, .fini = teardown, .timeout = 120);

static kvf_client_t *connect_to(const dc_agent_t *a)
{
    kvf_client_params_t p = {.field_mask = KVF_CLIENT_PARAM_SOCKET |
                                           KVF_CLIENT_PARAM_TIMEOUT,
                             .socket_path = a->sock,
                             .timeout_ns  = 20000000000ull};
    kvf_client_t *c       = NULL;

    cr_assert_eq(kvf_client_connect(&p, &c), KVF_OK);
    return c;
}

static void make_keys(kvf_key_t *keys, uint32_t n)
{
    static uint32_t tokens[CHUNKS * 256];
    size_t got, i;

    for (i = 0; i < CHUNKS * 256; i++) {
        tokens[i] = (uint32_t)(i * 29 + 11);
    }
    cr_assert_eq(kvf_key_chain(0x6262, tokens, (size_t)n * 256, 256, false,
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

/* Stores keys[0, n) (n a multiple of BATCH) through @p a. */
static void store_n(const dc_agent_t *a, const kvf_key_t *keys, uint32_t n)
{
    kvf_client_t *c = connect_to(a);
    uint8_t *base   = kvf_client_pool_base(c);
    kvf_slot_t slots[BATCH];
    uint64_t sums[BATCH];
    uint32_t b, i;

    for (b = 0; b < n; b += BATCH) {
        cr_assert_eq(kvf_client_alloc(c, CHUNK, BATCH, slots), KVF_OK,
                     "alloc: %s", kvf_client_last_error(c));
        for (i = 0; i < BATCH; i++) {
            fill(base + slots[i].offset, CHUNK, (uint32_t)keys[b + i].lo);
            sums[i] = kvf_chunk_checksum(base + slots[i].offset, CHUNK);
        }
        cr_assert_eq(kvf_client_commit(c, keys + b, slots, sums, BATCH), KVF_OK,
                     "commit: %s", kvf_client_last_error(c));
    }
    kvf_client_disconnect(c);
}

static void store_all(const dc_agent_t *a, const kvf_key_t *keys)
{
    store_n(a, keys, CHUNKS);
}

/* Retrieves keys[0, n) through @p a; every chunk that came must be byte
 * for byte the one stored. Returns how many came. */
static uint32_t retrieve_checked(const dc_agent_t *a, const kvf_key_t *keys,
                                 uint32_t n)
{
    kvf_client_t *c = connect_to(a);
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
    kvf_client_disconnect(c);
    return got;
}

/* The value of the series @p name (with its labels) at @p hostport. */
static uint64_t metric(const char *hostport, const char *name)
{
    static char out[131072];
    const char *p;
    char needle[160];

    cr_assert_eq(
        kvf_test_http_get(port_of(hostport), "/metrics", out, sizeof(out)),
        200);
    snprintf(needle, sizeof(needle), "\n%s ", name);
    p = strstr(out, needle);
    cr_assert_not_null(p, "no %s in /metrics of %s", name, hostport);
    return strtoull(p + strlen(needle), NULL, 10);
}

static void wait_metric(const char *hostport, const char *name, uint64_t min)
{
    uint64_t t0 = kvf_time_now_ms();

    while (metric(hostport, name) < min) {
        cr_assert_lt(kvf_time_now_ms() - t0, 10000, "%s never reached %" PRIu64,
                     name, min);
        poll(NULL, 0, 10);
    }
}

/* Controller LOOKUP of the chain @p keys: hit, holders and media. */
static uint32_t ctl_lookup(const kvf_key_t *keys, uint32_t n, uint32_t *holders,
                           uint8_t *media)
{
    kvf_ctlconn_t *conn = kvf_th_connect(&g_ctl, KVF__PEER_KIND__PEER_ADMIN);
    uint8_t packed[CHUNKS * KVF_KEY_WIRE_SIZE];
    Kvf__LookupReply *rep;
    kvf_frame_t frame;
    Kvf__Lookup lk;
    uint32_t i, hit;

    for (i = 0; i < n; i++) {
        kvf_key_pack(&keys[i], packed + i * KVF_KEY_WIRE_SIZE);
    }
    kvf__lookup__init(&lk);
    lk.request_id = kvf_ctlconn_next_id(conn);
    lk.keys.data  = packed;
    lk.keys.len   = (size_t)n * KVF_KEY_WIRE_SIZE;
    cr_assert_eq(kvf_ctlconn_call(conn, KVF_MSG_LOOKUP, &lk.base, &frame),
                 KVF_OK);
    cr_assert_eq(frame.type, KVF_MSG_LOOKUP_REPLY);
    rep = (Kvf__LookupReply *)frame.msg;
    cr_assert_eq(rep->holders.len, 4u * n);
    cr_assert_eq(rep->media.len, n, "a reply says where each chunk is");
    for (i = 0; i < n; i++) {
        const uint8_t *p = rep->holders.data + 4 * i;

        holders[i] = (uint32_t)p[0] | ((uint32_t)p[1] << 8) |
                     ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
        media[i] = rep->media.data[i];
    }
    hit = rep->hit_chunks;
    kvf_frame_release(&frame, NULL);
    kvf_ctlconn_destroy(conn);
    return hit;
}

/* Waits until the controller says @p want of keys[0, n) are on disk. */
static void wait_on_disk(const kvf_key_t *keys, uint32_t n, uint32_t want)
{
    uint32_t holders[CHUNKS], on_disk = 0, hit = 0, i;
    uint8_t media[CHUNKS];
    uint64_t t0 = kvf_time_now_ms();

    for (;;) {
        hit     = ctl_lookup(keys, n, holders, media);
        on_disk = 0;
        for (i = 0; i < hit; i++) {
            on_disk += media[i] == KVF__MEDIUM__MEDIUM_DISK;
        }
        if ((hit == n) && (on_disk >= want)) {
            break;
        }
        cr_assert_lt(kvf_time_now_ms() - t0, 10000,
                     "controller: %u of %u held, %u on disk, want %u", hit, n,
                     on_disk, want);
        poll(NULL, 0, 10);
    }
}

Test(disk_cluster, evicted_chunks_stay_in_the_registry_on_disk)
{
    uint32_t holders[CHUNKS], i;
    uint8_t media[CHUNKS];
    kvf_key_t keys[CHUNKS];
    char out[8192];

    make_keys(keys, CHUNKS);
    store_all(&g_a, keys);
    wait_metric(g_a.http, "kvf_agent_disk_writes_total", CHUNKS - 16);
    /* the pool kept the newest; the older ones moved to disk, not out */
    wait_on_disk(keys, CHUNKS, CHUNKS - 16);
    cr_assert_eq(ctl_lookup(keys, CHUNKS, holders, media), CHUNKS);
    for (i = 0; i < CHUNKS; i++) {
        cr_assert_eq(holders[i], holders[0], "A holds every chunk");
    }
    cr_assert_eq(media[0], KVF__MEDIUM__MEDIUM_DISK);
    cr_assert_eq(media[CHUNKS - 1], KVF__MEDIUM__MEDIUM_HOST);
    cr_assert_eq(metric(g_ctl.http, "kvf_controller_holdings{medium=\"disk\"}"),
                 metric(g_a.http, "kvf_agent_disk_chunks") -
                     0 /* none of them is in the pool too */);
    cr_assert_geq(
        metric(g_ctl.http, "kvf_controller_holdings{medium=\"host\"}"), 1);
    cr_assert_eq(metric(g_a.http, "kvf_agent_tier_chunks{medium=\"disk\"}"),
                 metric(g_a.http, "kvf_agent_disk_chunks"));
    /* kvfctl shows both tiers per node (after the next heartbeat) */
    wait_metric(g_ctl.http, "kvf_controller_tier_used_bytes{medium=\"disk\"}",
                (uint64_t)(CHUNKS - 16) * CHUNK);
    cr_assert_eq(kvf_th_run(out, sizeof(out), "%s --controller %s nodes",
                            kvf_th_build_path("tools/kvfctl"), g_ctl.addr),
                 0, "%s", out);
    cr_assert_not_null(strstr(out, "DISK"), "%s", out);
    cr_assert_eq(kvf_th_run(out, sizeof(out), "%s --controller %s stats --json",
                            kvf_th_build_path("tools/kvfctl"), g_ctl.addr),
                 0, "%s", out);
    cr_assert_not_null(strstr(out, "\"holdings_disk\":"), "%s", out);
    /* and where a chunk is */
    {
        char k0[KVF_KEY_STR_SIZE], kn[KVF_KEY_STR_SIZE];

        kvf_key_format(&keys[0], k0);
        kvf_key_format(&keys[CHUNKS - 1], kn);
        cr_assert_eq(
            kvf_th_run(out, sizeof(out), "%s --controller %s --json lookup %s",
                       kvf_th_build_path("tools/kvfctl"), g_ctl.addr, k0),
            0, "%s", out);
        cr_assert_not_null(strstr(out, "\"medium\":\"disk\""), "%s", out);
        cr_assert_eq(
            kvf_th_run(out, sizeof(out), "%s --controller %s --json lookup %s",
                       kvf_th_build_path("tools/kvfctl"), g_ctl.addr, kn),
            0, "%s", out);
        cr_assert_not_null(strstr(out, "\"medium\":\"host\""), "%s", out);
    }
}

Test(disk_cluster, peer_reads_chunks_only_on_the_holders_disk)
{
    kvf_key_t keys[CHUNKS];
    uint32_t holders[CHUNKS];
    uint8_t media[CHUNKS];

    make_keys(keys, CHUNKS);
    store_all(&g_a, keys);
    wait_metric(g_a.http, "kvf_agent_disk_writes_total", CHUNKS - 16);
    wait_on_disk(keys, CHUNKS, CHUNKS - 16);
    cr_assert_eq(metric(g_a.http, "kvf_agent_served_from_disk_total"), 0);
    /* keys[0, 16) are on A's disk only: B's engine gets them all */
    cr_assert_eq(retrieve_checked(&g_b, keys, BATCH), BATCH);
    cr_assert_eq(retrieve_checked(&g_b, keys + BATCH, BATCH), BATCH);
    cr_assert_eq(metric(g_a.http, "kvf_agent_served_from_disk_total"),
                 2 * BATCH, "A read them from its disk to serve them");
    cr_assert_geq(metric(g_a.http, "kvf_agent_disk_reads_total"), 2 * BATCH);
    /* served chunks were promoted: A has them in memory again */
    cr_assert_eq(ctl_lookup(keys, 1, holders, media), 1);
    cr_assert_eq(media[0], KVF__MEDIUM__MEDIUM_HOST);
    cr_assert(kvf_test_proc_alive(&g_a.proc));
}

/* More keys on the holder's disk only than it reads back for peers at once
 * (64): A (room for 116 chunks in its pool, 255 on disk) holds 200, the
 * oldest 84 on its disk only, and B's engine retrieves those 84 in one
 * call. The keys past the 64 reads are answered busy and asked again, and
 * every one arrives byte for byte. Before, each was answered as missing
 * and recomputed. */
/* A restarted with a @p pool of 256 KiB chunks and a @p disk tier stores
 * N chunks, of which the oldest ON_DISK end up on its disk only; @p via
 * (B: a peer's fetch; A: its own engine) retrieves those at once and must
 * get every one, byte for byte. */
static void fetch_disk_only(const char *pool, const char *disk,
                            const dc_agent_t *via)
{
    enum {
        N       = 200,
        ON_DISK = 84 /* the oldest, on A's disk only */
    };
    kvf_key_t *keys   = calloc(N, sizeof(*keys));
    kvf_slot_t *slots = calloc(ON_DISK, sizeof(*slots));
    bool *missing     = calloc(ON_DISK, sizeof(*missing));
    uint8_t *expect   = malloc(CHUNK), *base;
    kvf_client_t *c;
    uint64_t t0;
    uint32_t i;

    cr_assert((keys != NULL) && (slots != NULL) && (missing != NULL) &&
              (expect != NULL));
    cr_assert_eq(kvf_test_proc_stop(&g_a.proc, 10000), 0);
    g_pool_a = pool;
    g_disk_a = disk;
    start_agent(&g_a, "dc-a", true);
    g_pool_a = "4M";
    g_disk_a = "64M";
    for (i = 0; i < N; i++) {
        keys[i] = (kvf_key_t){.ns = 0x6262, .hi = 0xd15c, .lo = i + 1};
    }
    for (i = 0; i < N; i += BATCH) {
        /* each batch's spills land before the next: on a loaded machine
         * a burst of evictions outruns the tier and drops some */
        store_n(&g_a, keys + i, BATCH);
        t0 = kvf_time_now_ms();
        while (metric(g_a.http, "kvf_agent_disk_writes_pending") != 0) {
            cr_assert_lt(kvf_time_now_ms() - t0, 10000, "writes never landed");
            poll(NULL, 0, 5);
        }
    }
    cr_assert_eq(metric(g_a.http, "kvf_agent_disk_write_drops_total"), 0);
    wait_metric(g_a.http, "kvf_agent_disk_writes_total", ON_DISK);
    wait_metric(g_ctl.http, "kvf_controller_holdings{medium=\"disk\"}",
                ON_DISK);
    cr_assert_eq(metric(g_a.http, "kvf_agent_served_from_disk_total"), 0);
    c    = connect_to(via);
    base = kvf_client_pool_base(c);
    cr_assert_eq(kvf_client_retrieve(c, keys, ON_DISK, slots, missing), KVF_OK,
                 "retrieve: %s", kvf_client_last_error(c));
    for (i = 0; i < ON_DISK; i++) {
        cr_assert(!missing[i], "chunk %u of %u missing", i, ON_DISK);
        fill(expect, CHUNK, (uint32_t)keys[i].lo);
        cr_assert(memcmp(base + slots[i].offset, expect, CHUNK) == 0,
                  "chunk %u differs", i);
    }
    cr_assert_eq(kvf_client_release(c, slots, ON_DISK), KVF_OK);
    kvf_client_disconnect(c);
    if (via == &g_b) {
        cr_assert_eq(metric(g_a.http, "kvf_agent_served_from_disk_total"),
                     ON_DISK);
        cr_assert_gt(
            metric(g_a.http, "kvf_agent_serve_refused_total{reason=\"busy\"}"),
            0, "A never had every disk read in use: nothing tested");
    } else {
        cr_assert_eq(metric(g_a.http, "kvf_agent_disk_promotions_total{result="
                                      "\"promoted\"}"),
                     ON_DISK);
        cr_assert_gt(metric(g_a.http, "kvf_agent_disk_promotion_waits_total"),
                     0, "A's tier took every read at once: nothing tested");
    }
    free(keys);
    free(slots);
    free(missing);
    free(expect);
}

Test(disk_cluster, disk_reads_past_the_holders_limit_are_asked_again)
{
    /* 116 chunks in the pool; 255 disk slots: what A reads back and
     * evicts again fits */
    fetch_disk_only("32M", "256M", &g_b);
}

/* An engine's retrieve of 84 chunks on its own agent's disk only, more
 * than the tier reads at once (4 x disk_queue_depth 8): the rest wait
 * their turn; before, they were misses. */
Test(disk_cluster, a_retrieve_of_more_chunks_than_the_tier_reads_at_once)
{
    g_depth_a = "8";
    fetch_disk_only("32M", "256M", &g_a);
    g_depth_a = "32";
}

/* The same with 127 disk slots: the 84 read back make room in the pool,
 * whose evictions spill to the full tier, and disk eviction takes the
 * chunks spilled just now, never the ones asked for (before, 19 of them
 * were evicted before their turn and answered missing). */
Test(disk_cluster, room_made_for_disk_reads_never_evicts_the_chunks_asked_for)
{
    fetch_disk_only("32M", "128M", &g_b);
    cr_assert_gt(metric(g_a.http, "kvf_agent_disk_evictions_spared_total"), 0,
                 "disk eviction never met a chunk asked for: nothing tested");
}

Test(disk_cluster, dead_disk_is_a_miss_never_wrong_bytes)
{
    kvf_key_t keys[CHUNKS];
    uint32_t holders[CHUNKS];
    uint8_t media[CHUNKS];
    uint64_t t0;

    make_keys(keys, CHUNKS);
    store_all(&g_a, keys);
    wait_metric(g_a.http, "kvf_agent_disk_writes_total", CHUNKS - 16);
    wait_on_disk(keys, CHUNKS, CHUNKS - 16);
    /* the disk loses everything past its header: reads come back short
     * (an I/O error to the tier) */
    cr_assert_eq(truncate(g_tier, 4096), 0);
    cr_assert_eq(retrieve_checked(&g_b, keys, BATCH), 0,
                 "no chunk from a dead disk");
    cr_assert_geq(
        metric(g_a.http, "kvf_agent_disk_errors_total{kind=\"read\"}"), 1);
    cr_assert_eq(metric(g_a.http, "kvf_agent_served_from_disk_total"), 0);
    cr_assert(kvf_test_proc_alive(&g_a.proc), "A keeps running");
    /* the slots that failed left the tier and the registry */
    t0 = kvf_time_now_ms();
    while (ctl_lookup(keys, 1, holders, media) != 0) {
        cr_assert_lt(kvf_time_now_ms() - t0, 10000, "key 0 stays registered");
        poll(NULL, 0, 10);
    }
    /* what is still in A's pool is served as before */
    cr_assert_eq(retrieve_checked(&g_b, keys + CHUNKS - BATCH, BATCH), BATCH);
}

Test(disk_cluster, warm_restart_readmits_on_disk)
{
    kvf_key_t keys[CHUNKS];
    uint32_t holders[CHUNKS], i;
    uint8_t media[CHUNKS];

    make_keys(keys, CHUNKS);
    store_all(&g_a, keys);
    wait_metric(g_a.http, "kvf_agent_disk_writes_total", CHUNKS - 16);
    cr_assert_eq(kvf_test_proc_stop(&g_a.proc, 10000), 0, "%s",
                 kvf_test_proc_log(&g_a.proc));
    start_agent(&g_a, "dc-a", true);
    /* the inventory of the new incarnation carries what the disk kept */
    wait_on_disk(keys, CHUNKS, CHUNKS);
    cr_assert_eq(ctl_lookup(keys, CHUNKS, holders, media), CHUNKS);
    for (i = 0; i < CHUNKS; i++) {
        cr_assert_eq(media[i], KVF__MEDIUM__MEDIUM_DISK);
        cr_assert_eq(holders[i], holders[0]);
    }
    cr_assert_eq(retrieve_checked(&g_b, keys, BATCH), BATCH);
}

/* ADMIT with a medium from an agent: DISK moves a held key, an unknown
 * medium is refused (KVF_ERR_INVALID), the connection stays usable. */
static int admit_raw(kvf_ctlconn_t *conn, uint32_t node, uint64_t seq,
                     const kvf_key_t *key, int medium)
{
    uint8_t packed[KVF_KEY_WIRE_SIZE];
    uint64_t req_id = kvf_ctlconn_next_id(conn);
    kvf_frame_t frame;
    Kvf__KeyBatch kb;
    int status;

    kvf_key_pack(key, packed);
    kvf__key_batch__init(&kb);
    kb.request_id  = req_id;
    kb.node_id     = node;
    kb.incarnation = 1;
    kb.seq         = seq;
    kb.keys.data   = packed;
    kb.keys.len    = sizeof(packed);
    kb.medium      = (Kvf__Medium)medium;
    cr_assert_eq(kvf_ctlconn_call(conn, KVF_MSG_ADMIT, &kb.base, &frame),
                 KVF_OK);
    cr_assert_eq(frame.type, KVF_MSG_STATUS);
    status = ((Kvf__Status *)frame.msg)->status;
    kvf_frame_release(&frame, NULL);
    return status;
}

Test(disk_cluster, admit_medium_is_validated)
{
    kvf_ctlconn_t *conn = kvf_th_connect(&g_ctl, KVF__PEER_KIND__PEER_AGENT);
    uint32_t node       = kvf_th_register(conn, "dc-raw", 1, NULL);
    kvf_key_t key       = {.ns = 0x77, .hi = 1, .lo = 2};
    uint32_t holders[1];
    uint8_t media[1];

    cr_assert_eq(admit_raw(conn, node, 1, &key, KVF__MEDIUM__MEDIUM_HOST),
                 KVF_OK);
    cr_assert_eq(ctl_lookup(&key, 1, holders, media), 1);
    cr_assert_eq(holders[0], node);
    cr_assert_eq(media[0], KVF__MEDIUM__MEDIUM_HOST);
    cr_assert_eq(admit_raw(conn, node, 2, &key, KVF__MEDIUM__MEDIUM_DISK),
                 KVF_OK);
    cr_assert_eq(ctl_lookup(&key, 1, holders, media), 1);
    cr_assert_eq(media[0], KVF__MEDIUM__MEDIUM_DISK, "moved, not added");
    cr_assert_eq(admit_raw(conn, node, 3, &key, 7), KVF_ERR_INVALID);
    cr_assert_eq(ctl_lookup(&key, 1, holders, media), 1);
    cr_assert_eq(media[0], KVF__MEDIUM__MEDIUM_DISK,
                 "a refused batch "
                 "changes nothing");
    kvf_ctlconn_destroy(conn);
}
