/* SPDX-License-Identifier: Apache-2.0 */
/* Copyright (c) 2026 The kvfabric authors */
/*
 * kvf-bench pd: prefill -> decode push between two real agents on loopback.
 * Starts a controller, a prefill agent and a decode agent; for each of N
 * requests the prefill engine writes K chunks into its pool and pushes
 * them (kvf_pd_push, final) to the decoder, which acknowledges once every
 * checksum verified; the decode engine then waits for the request, checks
 * every byte against what was pushed and releases it. Latency is per
 * request (push call to the decoder's ack); GB/s is pushed bytes over the
 * summed push time. In the same run it measures ucx_perftest's ucp_am_bw
 * for the same transport and chunk size (the ceiling).
 */
#include "tools/bench/bench.h"

#include "common/config.h"
#include "common/time.h"

#include <kvfabric/kvfabric.h>

#include <inttypes.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct kvf_bench_pd_opts {
    char *transport;
    uint64_t chunk_size;
    uint64_t requests;
    uint64_t chunks_per_request;
    uint64_t inflight;
    uint64_t layers;
    bool serial;
    bool no_perftest;
    bool peers;
} kvf_bench_pd_opts_t;

#define KVF_BENCH_PD_FIELD(_n, _t, _m, _d, _min, _max, _h) \
    { \
        _n, _t, offsetof(kvf_bench_pd_opts_t, _m), _d, _min, _max, NULL, \
            KVF_CONFIG_FIELD_CLI_ONLY, _h \
    }

static const kvf_config_field_t kvf_bench_pd_fields[] = {
    KVF_BENCH_PD_FIELD("transport", KVF_CONFIG_STRING, transport, "tcp", 0, 0,
                       "UCX transport of the agents: tcp, or shm (the "
                       "agents' same-host path: pushes copied into the "
                       "decoder's receive region; compared with memcpy of "
                       "the same bytes)"),
    KVF_BENCH_PD_FIELD("chunk_size", KVF_CONFIG_SIZE, chunk_size, "1M", 4096,
                       64ull << 20, "bytes per chunk"),
    KVF_BENCH_PD_FIELD("requests", KVF_CONFIG_UINT, requests, "32", 1, 1000000,
                       "PD requests pushed one after the other"),
    KVF_BENCH_PD_FIELD("chunks_per_request", KVF_CONFIG_UINT,
                       chunks_per_request, "8", 1, 4096,
                       "chunks per request, pushed in one call"),
    KVF_BENCH_PD_FIELD("inflight", KVF_CONFIG_UINT, inflight, "1", 1, 64,
                       "requests in flight at once, each from its own "
                       "prefill and decode connection (GB/s is then over "
                       "the wall time)"),
    KVF_BENCH_PD_FIELD("layers", KVF_CONFIG_UINT, layers, "1", 1, 1024,
                       "layer groups: each chunk travels as this many "
                       "pieces of chunk_size / layers bytes, one push per "
                       "group (K pieces, the last push final), as an engine "
                       "saving layer by layer pushes: started without "
                       "waiting (kvf_pd_push_start), several in flight"),
    KVF_BENCH_PD_FIELD("serial", KVF_CONFIG_BOOL, serial, "false", 0, 0,
                       "with --layers: each group's push waits for the "
                       "decoder's ack before the next starts (kvf_pd_push), "
                       "as before pushes of one request could overlap"),
    KVF_BENCH_PD_FIELD("no_perftest", KVF_CONFIG_BOOL, no_perftest, "false", 0,
                       0, "skip the ucx_perftest ceiling"),
    KVF_BENCH_PD_FIELD("peers", KVF_CONFIG_BOOL, peers, "false", 0, 0,
                       "also run Mooncake Transfer Engine and NIXL on the same "
                       "loopback, size and batches (tools/bench/peers.py; "
                       "installs them into build/peers-venv on first use)"),
};

static const kvf_config_schema_t kvf_bench_pd_schema = {
    "kvf-bench pd", kvf_bench_pd_fields,
    sizeof(kvf_bench_pd_fields) / sizeof(kvf_bench_pd_fields[0])};

typedef struct kvf_bench_pd {
    kvf_bench_pd_opts_t o;
    kvf_bench_pair_t pair;
} kvf_bench_pd_t;

static void kvf_bench_pd_start(kvf_bench_pd_t *b)
{
    static const char *const names[2] = {"bench-prefill", "bench-decode"};
    uint64_t chunk_pow2               = kvf_bench_chunk_class(b->o.chunk_size);
    /* a piece takes a pool slot of its class, 64 KiB (the pool's smallest
     * class) at least */
    uint64_t piece = kvf_bench_chunk_class(b->o.chunk_size / b->o.layers);
    uint64_t request_bytes;
    char region[32];
    const char *const prefill[] = {"--role", "prefill", "--pd-push-timeout",
                                   "60s", NULL};
    const char *const decode[]  = {
         "--role", "decode", "--pd-buffer-size", region, "--pd-push-timeout",
         "60s",    NULL};
    const char *const *const extra[2] = {prefill, decode};

    if (piece < (64u << 10)) {
        piece = 64u << 10;
    }
    request_bytes =
        piece * b->o.layers * b->o.chunks_per_request * b->o.inflight;
    /* the prefill pool holds the chunks of the requests in flight; the
     * region twice that */
    snprintf(region, sizeof(region), "%" PRIu64, 2 * request_bytes);
    kvf_bench_pair_start(&b->pair, b->o.transport,
                         request_bytes + request_bytes / 2 + chunk_pow2,
                         chunk_pow2, names, extra);
}

static void kvf_bench_pd_fill(uint64_t req, uint64_t index, uint8_t *p,
                              uint64_t len)
{
    const uint64_t seed = (req << 24) ^ (index << 2) ^ 0x9e3779b97f4a7c15ull;
    const uint64_t page = 4096;
    uint64_t off, stamp;

    /* one page of the generator, then copies of it, each page stamped
     * with its own offset: every byte still depends on the request, the
     * piece and its place in it, at memcpy speed, so the bench's own
     * filling and checking stay out of the way of requests in flight
     * (--inflight) on a small machine */
    kvf_bench_fill(seed, p, (len < page) ? len : page);
    for (off = page; off < len; off += page) {
        memcpy(p + off, p, (len - off < page) ? len - off : page);
        stamp = seed ^ off;
        memcpy(p + off, &stamp, (len - off < 8) ? len - off : 8);
    }
}

/* Pushes every request (one push per layer group, K pieces each), waits
 * for it at the decoder, checks its bytes. Piece g * K + i is group g of
 * chunk i. */
static int kvf_bench_pd_run(kvf_bench_pd_t *b, kvf_client_t *pc,
                            kvf_client_t *dc, uint64_t first, uint64_t step,
                            uint64_t *lat, uint64_t *total_ns_p,
                            uint64_t *bytes_p, bool *verified_p)
{
    uint32_t groups   = (uint32_t)b->o.layers, g;
    uint32_t k        = (uint32_t)b->o.chunks_per_request * groups, num, i;
    uint32_t per      = (uint32_t)b->o.chunks_per_request;
    uint64_t len      = b->o.chunk_size / groups, r, t0;
    kvf_slot_t *slots = calloc(k, sizeof(*slots));
    kvf_slot_t *got   = calloc(k, sizeof(*got));
    uint64_t *sums    = calloc(k, sizeof(*sums));
    uint8_t *expect   = malloc(len);
    int rc            = 1;

    if ((slots == NULL) || (got == NULL) || (sums == NULL) ||
        (expect == NULL) || (kvf_client_alloc(pc, len, k, slots) != KVF_OK)) {
        fprintf(stderr, "kvf-bench pd: alloc on the prefill agent: %s\n",
                kvf_client_last_error(pc));
        goto out;
    }
    for (r = first; r < b->o.requests; r += step) {
        /* the prefill engine's KV for this request */
        for (i = 0; i < k; i++) {
            uint8_t *p = (uint8_t *)kvf_client_pool_base(pc) + slots[i].offset;

            kvf_bench_pd_fill(r + 1, i, p, len);
            sums[i] = kvf_chunk_checksum(p, len);
        }
        t0 = kvf_time_now_ns();
        for (g = 0; g < groups; g++) {
            kvf_status_t st = (b->o.serial ? kvf_pd_push : kvf_pd_push_start)(
                pc, r + 1, "bench-decode", slots + g * per, sums + g * per, per,
                g + 1 == groups);

            if ((st == KVF_OK) && (g + 1 == groups) && !b->o.serial) {
                st = kvf_pd_push_wait(pc, r + 1, 0);
            }
            if (st != KVF_OK) {
                fprintf(stderr,
                        "kvf-bench pd: push of request %" PRIu64
                        " group %u: %s\n",
                        r + 1, g, kvf_client_last_error(pc));
                goto out;
            }
        }
        lat[r] = kvf_time_now_ns() - t0;
        *total_ns_p += lat[r];
        if ((kvf_pd_wait(dc, r + 1, 60 * KVF_NSEC_PER_SEC, got, k, &num) !=
             KVF_OK) ||
            (num != k)) {
            fprintf(stderr, "kvf-bench pd: wait for request %" PRIu64 ": %s\n",
                    r + 1, kvf_client_last_error(dc));
            goto out;
        }
        for (i = 0; i < k; i++) {
            kvf_bench_pd_fill(r + 1, i, expect, len);
            if ((got[i].length != len) ||
                (memcmp((uint8_t *)kvf_client_pool_base(dc) + got[i].offset,
                        expect, len) != 0)) {
                *verified_p = false;
            }
            *bytes_p += got[i].length;
        }
        if (kvf_pd_release(dc, r + 1) != KVF_OK) {
            fprintf(stderr, "kvf-bench pd: release: %s\n",
                    kvf_client_last_error(dc));
            goto out;
        }
    }
    kvf_client_release(pc, slots, k);
    rc = 0;

out:
    free(slots);
    free(got);
    free(sums);
    free(expect);
    return rc;
}

/* --transport shm: one small push opens the same-host link between the
 * agents (a push goes over UCX until it is up); then this waits until the
 * prefill agent says it mapped the decoder's region, so every timed push
 * is a copy. */
static int kvf_bench_pd_warm(kvf_bench_pd_t *b, kvf_client_t *pc,
                             kvf_client_t *dc)
{
    const uint64_t req = 1ull << 40, len = 4096;
    uint64_t deadline = kvf_time_deadline_ns(10 * KVF_NSEC_PER_SEC), sum;
    kvf_slot_t slot, got;
    char path[160], log[1 << 16];
    uint32_t num = 0;
    size_t n;
    FILE *f;

    if (kvf_client_alloc(pc, len, 1, &slot) != KVF_OK) {
        fprintf(stderr, "kvf-bench pd: alloc: %s\n", kvf_client_last_error(pc));
        return 1;
    }
    kvf_bench_pd_fill(req, 0, (uint8_t *)kvf_client_pool_base(pc) + slot.offset,
                      len);
    sum = kvf_chunk_checksum((uint8_t *)kvf_client_pool_base(pc) + slot.offset,
                             len);
    if ((kvf_pd_push(pc, req, "bench-decode", &slot, &sum, 1, true) !=
         KVF_OK) ||
        (kvf_pd_wait(dc, req, 20 * KVF_NSEC_PER_SEC, &got, 1, &num) !=
         KVF_OK) ||
        (kvf_pd_release(dc, req) != KVF_OK)) {
        fprintf(stderr, "kvf-bench pd: warm-up push: %s / %s\n",
                kvf_client_last_error(pc), kvf_client_last_error(dc));
        return 1;
    }
    kvf_client_release(pc, &slot, 1);
    snprintf(path, sizeof(path), "%s/bench-prefill.log", b->pair.dir);
    while (!kvf_time_expired(deadline)) {
        f = fopen(path, "r");
        n = (f != NULL) ? fread(log, 1, sizeof(log) - 1, f) : 0;
        if (f != NULL) {
            fclose(f);
        }
        log[n] = '\0';
        if (strstr(log, "PD receive region writable") != NULL) {
            return 0;
        }
        usleep(10000);
    }
    fprintf(stderr, "kvf-bench pd: the same-host path did not come up (%s)\n",
            path);
    return 1;
}

/* One of --inflight engines: its own prefill and decode connections,
 * requests first, first + inflight, ... */
typedef struct kvf_bench_pd_lane {
    kvf_bench_pd_t *b;
    uint64_t first;
    uint64_t *lat;
    uint64_t total_ns;
    uint64_t bytes;
    bool verified;
    int rc;
    pthread_t thread;
} kvf_bench_pd_lane_t;

static void *kvf_bench_pd_lane_run(void *arg)
{
    kvf_bench_pd_lane_t *lane = arg;
    kvf_bench_pd_t *b         = lane->b;
    kvf_client_t *pc, *dc;

    lane->rc       = 1;
    lane->verified = true;
    pc             = kvf_bench_connect(b->pair.sock[0], 20 * KVF_NSEC_PER_SEC);
    dc             = kvf_bench_connect(b->pair.sock[1], 20 * KVF_NSEC_PER_SEC);
    if ((pc != NULL) && (dc != NULL)) {
        lane->rc =
            kvf_bench_pd_run(b, pc, dc, lane->first, b->o.inflight, lane->lat,
                             &lane->total_ns, &lane->bytes, &lane->verified);
    }
    kvf_client_disconnect(pc);
    kvf_client_disconnect(dc);
    return NULL;
}

/* Runs the lanes; the wall time of the whole run goes to @p wall_ns_p. */
static int kvf_bench_pd_lanes(kvf_bench_pd_t *b, uint64_t *lat,
                              uint64_t *total_ns_p, uint64_t *bytes_p,
                              bool *verified_p, uint64_t *wall_ns_p)
{
    kvf_bench_pd_lane_t *lanes = calloc(b->o.inflight, sizeof(*lanes));
    uint64_t t0 = kvf_time_now_ns(), i, started = 0;
    int rc = 0;

    if (lanes == NULL) {
        return 1;
    }
    for (i = 0; i < b->o.inflight; i++) {
        lanes[i].b     = b;
        lanes[i].first = i;
        lanes[i].lat   = lat;
        if (pthread_create(&lanes[i].thread, NULL, kvf_bench_pd_lane_run,
                           &lanes[i]) != 0) {
            rc = 1;
            break;
        }
        started++;
    }
    for (i = 0; i < started; i++) {
        pthread_join(lanes[i].thread, NULL);
        rc |= lanes[i].rc;
        *total_ns_p += lanes[i].total_ns;
        *bytes_p += lanes[i].bytes;
        *verified_p = *verified_p && lanes[i].verified;
    }
    *wall_ns_p = kvf_time_now_ns() - t0;
    free(lanes);
    return rc;
}

int kvf_bench_pd_main(int argc, char **argv)
{
    kvf_client_t *pc = NULL, *dc = NULL;
    kvf_bench_pd_t b;
    uint64_t *lat = NULL, total_ns = 0, bytes = 0, wall_ns = 0;
    uint64_t cpu0[2] = {0, 0}, cpu_ns[2] = {0, 0}, chunks;
    int i;
    bool verified = true, shm;
    double gbps, ceiling = 0.0, ceiling_sleep = 0.0, mc = 0.0;
    char peers[2048] = "";
    int rc           = 1;

    memset(&b, 0, sizeof(b));
    rc = kvf_bench_begin("pd", &kvf_bench_pd_schema, &b.o, argc, argv,
                         (const char *const *)&b.o.transport, b.pair.dir,
                         sizeof(b.pair.dir));
    if (rc >= 0) {
        goto out;
    }
    rc  = 1;
    shm = (strcmp(b.o.transport, "shm") == 0);
    if ((b.o.chunk_size % b.o.layers != 0) ||
        (b.o.chunk_size / b.o.layers < 4096) ||
        (b.o.chunks_per_request * b.o.layers > 65536)) {
        fprintf(stderr,
                "kvf-bench pd: --chunk-size %" PRIu64
                " does not split into --layers %" PRIu64
                " pieces of 4 KiB or more (at most 65536 a request)\n",
                b.o.chunk_size, b.o.layers);
        goto out;
    }
    lat = calloc(b.o.requests, sizeof(*lat));
    if (lat == NULL) {
        goto out;
    }
    kvf_bench_pd_start(&b);
    pc = kvf_bench_connect(b.pair.sock[0], 20 * KVF_NSEC_PER_SEC);
    dc = kvf_bench_connect(b.pair.sock[1], 20 * KVF_NSEC_PER_SEC);
    if ((pc == NULL) || (dc == NULL)) {
        fprintf(stderr, "kvf-bench pd: agents did not start (logs in %s)\n",
                b.pair.dir);
        goto out;
    }
    {
        /* the decoder must be in the controller's node table */
        kvf_client_stats_t st;
        uint64_t deadline = kvf_time_deadline_ns(20 * KVF_NSEC_PER_SEC);

        while ((kvf_client_stats(pc, &st) != KVF_OK) || !st.registered ||
               (kvf_client_stats(dc, &st) != KVF_OK) || !st.registered) {
            if (kvf_time_expired(deadline)) {
                fprintf(stderr, "kvf-bench pd: agents did not register\n");
                goto out;
            }
            usleep(10000);
        }
    }
    if (shm && (kvf_bench_pd_warm(&b, pc, dc) != 0)) {
        goto out;
    }
    /* the agents' CPU time over the transfer window (pids: controller,
     * prefill, decode) */
    for (i = 0; i < 2; i++) {
        cpu0[i] = kvf_bench_pid_cpu_ns(b.pair.pids[1 + i]);
    }
    wall_ns = kvf_time_now_ns();
    if ((b.o.inflight == 1) ? kvf_bench_pd_run(&b, pc, dc, 0, 1, lat, &total_ns,
                                               &bytes, &verified)
                            : kvf_bench_pd_lanes(&b, lat, &total_ns, &bytes,
                                                 &verified, &wall_ns)) {
        fprintf(stderr, "kvf-bench pd: failed (logs in %s)\n", b.pair.dir);
        goto out;
    }
    for (i = 0; i < 2; i++) {
        cpu_ns[i] = kvf_bench_pid_cpu_ns(b.pair.pids[1 + i]) - cpu0[i];
    }
    if (b.o.inflight > 1) {
        total_ns = wall_ns; /* requests overlap: bytes over the wall time */
    } else {
        wall_ns = kvf_time_now_ns() - wall_ns;
    }
    kvf_client_disconnect(pc);
    kvf_client_disconnect(dc);
    pc = dc = NULL;
    kvf_bench_pair_stop(&b.pair);
    if (shm) {
        mc = kvf_bench_memcpy_gbps(b.o.chunk_size / b.o.layers,
                                   b.o.requests * b.o.chunks_per_request *
                                       b.o.layers);
    } else if (!b.o.no_perftest) {
        ceiling = kvf_bench_perftest_am_bw(
            b.o.transport, b.o.chunk_size,
            b.o.requests * b.o.chunks_per_request, false);
        ceiling_sleep = kvf_bench_perftest_am_bw(
            b.o.transport, b.o.chunk_size,
            b.o.requests * b.o.chunks_per_request, true);
    }
    gbps   = (total_ns == 0) ? 0.0 : (double)bytes / (double)total_ns;
    chunks = b.o.requests * b.o.chunks_per_request * b.o.layers; /* pieces */
    if (b.o.peers) { /* one call per push: K pieces of one layer group */
        kvf_bench_peers_run("write", b.o.chunk_size / b.o.layers, chunks,
                            b.o.chunks_per_request, peers, sizeof(peers));
    }
    printf("{\"bench\":\"pd\",\"transport\":\"%s\",\"chunk_size\":%" PRIu64
           ",\"requests\":%" PRIu64 ",\"chunks_per_request\":%" PRIu64
           ",\"inflight\":%" PRIu64 ",\"layers\":%" PRIu64 ",\"serial\":%s"
           ",\"GBps\":%.2f,\"wall_GBps\":%.2f,\"p50_us\":%.0f,\"p99_us\":%.0f"
           ",\"verified\":%s"
           ",\"perftest_am_bw_GBps\":%.2f,\"pct_of_perftest\":%.0f"
           ",\"perftest_am_bw_sleep_GBps\":%.2f,\"pct_of_perftest_sleep\":%.0f"
           ",\"prefill_cpu_us_per_chunk\":%.1f"
           ",\"decode_cpu_us_per_chunk\":%.1f"
           ",\"memcpy_GBps\":%.2f,\"pct_of_memcpy\":%.0f%s}\n",
           b.o.transport, b.o.chunk_size, b.o.requests, b.o.chunks_per_request,
           b.o.inflight, b.o.layers, b.o.serial ? "true" : "false", gbps,
           (wall_ns == 0) ? 0.0 : (double)bytes / (double)wall_ns,
           (double)kvf_bench_percentile(lat, b.o.requests, 50) / 1000.0,
           (double)kvf_bench_percentile(lat, b.o.requests, 99) / 1000.0,
           verified ? "true" : "false", ceiling,
           (ceiling > 0) ? 100.0 * gbps / ceiling : 0.0, ceiling_sleep,
           (ceiling_sleep > 0) ? 100.0 * gbps / ceiling_sleep : 0.0,
           (double)cpu_ns[0] / 1000.0 / (double)chunks,
           (double)cpu_ns[1] / 1000.0 / (double)chunks, mc,
           (mc > 0) ? 100.0 * gbps / mc : 0.0, peers);
    rc = verified ? 0 : 3;

out:
    kvf_client_disconnect(pc);
    kvf_client_disconnect(dc);
    kvf_bench_pair_stop(&b.pair);
    rc = kvf_bench_end(b.pair.dir, rc);
    free(lat);
    kvf_config_cleanup(&kvf_bench_pd_schema, &b.o);
    return rc;
}
