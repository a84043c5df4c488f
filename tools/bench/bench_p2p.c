/* SPDX-License-Identifier: Apache-2.0 */
/* Copyright (c) 2026 The kvfabric authors */
/*
 * kvf-bench p2p: peer-to-peer fetch between two real agents on loopback.
 * Starts a controller and agents A and B, stores N chunks through A's
 * client, then retrieves them through B's client in batches of B keys (each
 * retrieve makes B's agent look the chunks up and fetch them from A over
 * UCX into its pool, verifying every checksum), checks every byte, and
 * prints one JSON line. In the same run it measures ucx_perftest's
 * ucp_am_bw for the same transport and size (the ceiling; -e, the error
 * mode agents use) when ucx_perftest is installed, and both agents' CPU
 * time per chunk over the transfer window (all their threads).
 */
#include "tools/bench/bench.h"

#include "common/config.h"
#include "common/time.h"

#include <kvfabric/kvfabric.h>

#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

typedef struct kvf_bench_p2p_opts {
    char *transport;
    uint64_t chunk_size;
    uint64_t chunks;
    uint64_t batch;
    bool no_perftest;
    bool peers;
    bool prefetch;
} kvf_bench_p2p_opts_t;

#define KVF_BENCH_P2P_FIELD(_n, _t, _m, _d, _min, _max, _h) \
    { \
        _n, _t, offsetof(kvf_bench_p2p_opts_t, _m), _d, _min, _max, NULL, \
            KVF_CONFIG_FIELD_CLI_ONLY, _h \
    }

static const kvf_config_field_t kvf_bench_p2p_fields[] = {
    KVF_BENCH_P2P_FIELD("transport", KVF_CONFIG_STRING, transport, "tcp", 0, 0,
                        "tcp (UCX over loopback TCP), or shm (the agents' "
                        "same-host path: memcpy from the holder's pool; "
                        "compared with memcpy of the same bytes)"),
    KVF_BENCH_P2P_FIELD("chunk_size", KVF_CONFIG_SIZE, chunk_size, "1M", 4096,
                        64ull << 20, "bytes per chunk"),
    KVF_BENCH_P2P_FIELD("chunks", KVF_CONFIG_UINT, chunks, "64", 1, 65536,
                        "chunks stored on A and fetched through B"),
    KVF_BENCH_P2P_FIELD("batch", KVF_CONFIG_UINT, batch, "8", 1, 4096,
                        "keys per retrieve"),
    KVF_BENCH_P2P_FIELD("prefetch", KVF_CONFIG_BOOL, prefetch, "false", 0, 0,
                        "look all keys up with prefetch first, as an engine's "
                        "scheduler does, then retrieve batch by batch; GB/s "
                        "is then over the wall time from the lookup"),
    KVF_BENCH_P2P_FIELD("no_perftest", KVF_CONFIG_BOOL, no_perftest, "false", 0,
                        0, "skip the ucx_perftest ceiling"),
    KVF_BENCH_P2P_FIELD("peers", KVF_CONFIG_BOOL, peers, "false", 0, 0,
                        "also run Mooncake Transfer Engine and NIXL on the "
                        "same loopback, size and batches "
                        "(tools/bench/peers.py; installs them into "
                        "build/peers-venv on first use)"),
};

static const kvf_config_schema_t kvf_bench_p2p_schema = {
    "kvf-bench p2p", kvf_bench_p2p_fields,
    sizeof(kvf_bench_p2p_fields) / sizeof(kvf_bench_p2p_fields[0])};

typedef struct kvf_bench_p2p {
    kvf_bench_p2p_opts_t o;
    kvf_bench_pair_t pair;
} kvf_bench_p2p_t;

static void kvf_bench_p2p_start(kvf_bench_p2p_t *b)
{
    static const char *const names[2] = {"bench-a", "bench-b"};
    static const char *const flags[]  = {"--fetch-timeout", "60s", NULL};
    const char *const *const extra[2] = {flags, flags};
    uint64_t chunk_pow2               = kvf_bench_chunk_class(b->o.chunk_size);
    uint64_t pool_size                = chunk_pow2 * (b->o.chunks + 8);

    pool_size += pool_size / 4; /* below the eviction mark */
    kvf_bench_pair_start(&b->pair, b->o.transport, pool_size, chunk_pow2, names,
                         extra);
}

static void kvf_bench_p2p_fill(const kvf_key_t *key, uint8_t *p, uint64_t len)
{
    kvf_bench_fill(key->lo | 1, p, len);
}

int kvf_bench_p2p_main(int argc, char **argv)
{
    kvf_client_t *a = NULL, *c = NULL;
    kvf_bench_p2p_t b;
    kvf_lookup_result_t res;
    kvf_key_t *keys   = NULL;
    kvf_slot_t *slots = NULL;
    uint64_t *sums = NULL, *lat = NULL, total_ns = 0, bytes = 0;
    uint64_t wall0 = 0, wall1 = 0, verify_ns = 0, tv = 0;
    uint64_t commit_ns = 0, hash_ns = 0; /* storing on A */
    uint64_t cpu0[2] = {0, 0}, cpu_ns[2] = {0, 0};
    uint8_t *expect  = NULL;
    uint32_t *tokens = NULL;
    bool *missing = NULL, verified = true;
    uint64_t nmissing = 0, nwrong = 0;
    size_t got, i, nb = 0, k;
    double gbps, ceiling = 0.0, ceiling_sleep = 0.0, mc = 0.0;
    bool shm;
    char peers[2048] = "";
    int rc           = 1;

    memset(&b, 0, sizeof(b));
    rc = kvf_bench_begin("p2p", &kvf_bench_p2p_schema, &b.o, argc, argv,
                         (const char *const *)&b.o.transport, b.pair.dir,
                         sizeof(b.pair.dir));
    if (rc >= 0) {
        goto out;
    }
    rc      = 1;
    keys    = calloc(b.o.chunks, sizeof(*keys));
    slots   = calloc(b.o.chunks, sizeof(*slots));
    sums    = calloc(b.o.chunks, sizeof(*sums));
    missing = calloc(b.o.chunks, sizeof(*missing));
    lat     = calloc(b.o.chunks, sizeof(*lat));
    tokens  = calloc(b.o.chunks * 16, sizeof(*tokens));
    expect  = malloc(b.o.chunk_size);
    if ((keys == NULL) || (slots == NULL) || (sums == NULL) ||
        (missing == NULL) || (lat == NULL) || (tokens == NULL) ||
        (expect == NULL)) {
        goto out;
    }
    for (i = 0; i < b.o.chunks * 16; i++) {
        tokens[i] = (uint32_t)(i * 2654435761u);
    }
    kvf_key_chain(0xb3, tokens, b.o.chunks * 16, 16, false, keys, b.o.chunks,
                  &got);
    kvf_bench_p2p_start(&b);
    a = kvf_bench_connect(b.pair.sock[0], 20 * KVF_NSEC_PER_SEC);
    c = kvf_bench_connect(b.pair.sock[1], 20 * KVF_NSEC_PER_SEC);
    if ((a == NULL) || (c == NULL)) {
        fprintf(stderr, "kvf-bench p2p: agents did not start (logs in %s)\n",
                b.pair.dir);
        goto out;
    }
    /* store on A */
    for (i = 0; i < b.o.chunks; i += nb) {
        nb = (b.o.chunks - i < 64) ? b.o.chunks - i : 64;
        if (kvf_client_alloc(a, b.o.chunk_size, (uint32_t)nb, slots) !=
            KVF_OK) {
            fprintf(stderr, "kvf-bench p2p: alloc on A: %s\n",
                    kvf_client_last_error(a));
            goto out;
        }
        for (k = 0; k < nb; k++) {
            kvf_bench_p2p_fill(&keys[i + k],
                               (uint8_t *)kvf_client_pool_base(a) +
                                   slots[k].offset,
                               b.o.chunk_size);
        }
        /* hashed after the whole batch was written, as a commit that
         * hashed in place found it (hash_GBps) */
        tv = kvf_time_now_ns();
        for (k = 0; k < nb; k++) {
            sums[k] = kvf_chunk_checksum((uint8_t *)kvf_client_pool_base(a) +
                                             slots[k].offset,
                                         b.o.chunk_size);
        }
        hash_ns += kvf_time_now_ns() - tv;
        tv = kvf_time_now_ns();
        if (kvf_client_commit(a, keys + i, slots, sums, (uint32_t)nb) !=
            KVF_OK) {
            fprintf(stderr, "kvf-bench p2p: commit on A: %s\n",
                    kvf_client_last_error(a));
            goto out;
        }
        commit_ns += kvf_time_now_ns() - tv;
    }
    /* one chunk outside the measured set goes first: connection set-up
     * (UCX endpoint and handshake; the same-host link maps the holder's
     * pool) happens once per pair of agents, not per transfer */
    {
        kvf_key_t warm;
        uint32_t tok[16];
        kvf_slot_t ws;

        for (k = 0; k < 16; k++) {
            tok[k] = (uint32_t)(k * 40503u + 7);
        }
        kvf_key_chain(0xb4, tok, 16, 16, false, &warm, 1, &got);
        if ((kvf_client_alloc(a, b.o.chunk_size, 1, &ws) != KVF_OK)) {
            goto out;
        }
        kvf_bench_p2p_fill(&warm,
                           (uint8_t *)kvf_client_pool_base(a) + ws.offset,
                           b.o.chunk_size);
        sums[0] = kvf_chunk_checksum(
            (uint8_t *)kvf_client_pool_base(a) + ws.offset, b.o.chunk_size);
        if (kvf_client_commit(a, &warm, &ws, sums, 1) != KVF_OK) {
            goto out;
        }
        for (k = 0; k < 3000; k++) {
            if ((kvf_client_lookup(c, &warm, 1, false, &res) == KVF_OK) &&
                (res.hit_chunks == 1)) {
                break;
            }
            poll(NULL, 0, 10);
        }
        if ((kvf_client_retrieve(c, &warm, 1, &ws, missing) == KVF_OK) &&
            !missing[0]) {
            kvf_client_release(c, &ws, 1);
        }
    }
    /* wait until B sees them through the controller */
    {
        uint64_t deadline = kvf_time_deadline_ns(30 * KVF_NSEC_PER_SEC);

        do {
            if (kvf_time_expired(deadline) ||
                (kvf_client_lookup(c, keys, (uint32_t)b.o.chunks, false,
                                   &res) != KVF_OK)) {
                fprintf(stderr, "kvf-bench p2p: B never saw A's chunks\n");
                goto out;
            }
            poll(NULL, 0, 10);
        } while (res.hit_chunks < b.o.chunks);
    }
    /* fetch through B, batch by batch; with --prefetch the lookup starts
     * every transfer first and the retrieves join them */
    /* the agents' CPU time over the transfer window (pids: controller,
     * A the holder, B the requester) */
    for (k = 0; k < 2; k++) {
        cpu0[k] = kvf_bench_pid_cpu_ns(b.pair.pids[1 + k]);
    }
    wall0 = kvf_time_now_ns();
    if (b.o.prefetch && (kvf_client_lookup(c, keys, (uint32_t)b.o.chunks, true,
                                           &res) != KVF_OK)) {
        fprintf(stderr, "kvf-bench p2p: prefetch: %s\n",
                kvf_client_last_error(c));
        goto out;
    }
    for (i = 0, nb = 0; i < b.o.chunks; i += b.o.batch, nb++) {
        uint32_t n  = (uint32_t)((b.o.chunks - i < b.o.batch) ? b.o.chunks - i
                                                              : b.o.batch);
        uint64_t t0 = kvf_time_now_ns();

        if (kvf_client_retrieve(c, keys + i, n, slots, missing) != KVF_OK) {
            fprintf(stderr, "kvf-bench p2p: retrieve: %s\n",
                    kvf_client_last_error(c));
            goto out;
        }
        lat[nb] = kvf_time_now_ns() - t0;
        total_ns += lat[nb];
        tv = kvf_time_now_ns();
        for (k = 0; k < n; k++) {
            if (missing[k]) {
                verified = false;
                nmissing++;
                continue;
            }
            kvf_bench_p2p_fill(&keys[i + k], expect, b.o.chunk_size);
            if ((slots[k].length != b.o.chunk_size) ||
                (memcmp((uint8_t *)kvf_client_pool_base(c) + slots[k].offset,
                        expect, b.o.chunk_size) != 0)) {
                verified = false;
                nwrong++;
            }
            bytes += slots[k].length;
        }
        verify_ns += kvf_time_now_ns() - tv;
        kvf_client_release(c, slots, n);
        wall1 = kvf_time_now_ns() - verify_ns;
    }
    for (k = 0; k < 2; k++) {
        cpu_ns[k] = kvf_bench_pid_cpu_ns(b.pair.pids[1 + k]) - cpu0[k];
    }
    kvf_client_disconnect(a);
    kvf_client_disconnect(c);
    a = c = NULL;
    kvf_bench_pair_stop(&b.pair);
    shm = (strcmp(b.o.transport, "shm") == 0);
    if (shm) {
        mc = kvf_bench_memcpy_gbps(b.o.chunk_size, b.o.chunks);
    } else if (!b.o.no_perftest) {
        ceiling       = kvf_bench_perftest_am_bw(b.o.transport, b.o.chunk_size,
                                                 b.o.chunks, false);
        ceiling_sleep = kvf_bench_perftest_am_bw(b.o.transport, b.o.chunk_size,
                                                 b.o.chunks, true);
    }
    if (b.o.peers) {
        kvf_bench_peers_run("read", b.o.chunk_size, b.o.chunks, b.o.batch,
                            peers, sizeof(peers));
    }
    if (b.o.prefetch) {
        /* wall time from the lookup to the last retrieve, less the time
         * this client spent checking bytes */
        total_ns = wall1 - wall0;
    }
    gbps = (total_ns == 0) ? 0.0 : (double)bytes / (double)total_ns;
    printf("{\"bench\":\"p2p\",\"mode\":\"%s\",\"transport\":\"%s\","
           "\"chunk_size\":%" PRIu64 ",\"chunks\":%" PRIu64
           ",\"batch\":%" PRIu64 ",\"GBps\":%.2f"
           ",\"p50_us\":%.0f,\"p99_us\":%.0f,\"verified\":%s"
           ",\"missing_chunks\":%" PRIu64 ",\"wrong_chunks\":%" PRIu64
           ",\"perftest_am_bw_GBps\":%.2f,\"pct_of_perftest\":%.0f"
           ",\"perftest_am_bw_sleep_GBps\":%.2f,\"pct_of_perftest_sleep\":%.0f"
           ",\"holder_cpu_us_per_chunk\":%.1f"
           ",\"requester_cpu_us_per_chunk\":%.1f"
           ",\"memcpy_GBps\":%.2f,\"pct_of_memcpy\":%.0f"
           ",\"commit_GBps\":%.2f,\"hash_GBps\":%.2f%s}\n",
           b.o.prefetch ? "prefetch" : "retrieve", b.o.transport,
           b.o.chunk_size, b.o.chunks, b.o.batch, gbps,
           (double)kvf_bench_percentile(lat, nb, 50) / 1000.0,
           (double)kvf_bench_percentile(lat, nb, 99) / 1000.0,
           verified ? "true" : "false", nmissing, nwrong, ceiling,
           (ceiling > 0) ? 100.0 * gbps / ceiling : 0.0, ceiling_sleep,
           (ceiling_sleep > 0) ? 100.0 * gbps / ceiling_sleep : 0.0,
           (double)cpu_ns[0] / 1000.0 / (double)b.o.chunks,
           (double)cpu_ns[1] / 1000.0 / (double)b.o.chunks, mc,
           (mc > 0) ? 100.0 * gbps / mc : 0.0,
           (commit_ns == 0)
               ? 0.0
               : (double)(b.o.chunks * b.o.chunk_size) / (double)commit_ns,
           (hash_ns == 0)
               ? 0.0
               : (double)(b.o.chunks * b.o.chunk_size) / (double)hash_ns,
           peers);
    rc = verified ? 0 : 3;

out:
    kvf_client_disconnect(a);
    kvf_client_disconnect(c);
    kvf_bench_pair_stop(&b.pair);
    rc = kvf_bench_end(b.pair.dir, rc);
    free(keys);
    free(slots);
    free(sums);
    free(missing);
    free(lat);
    free(tokens);
    free(expect);
    kvf_config_cleanup(&kvf_bench_p2p_schema, &b.o);
    return rc;
}
