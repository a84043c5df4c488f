/* SPDX-License-Identifier: Apache-2.0 */
/* Copyright (c) 2026 The kvfabric authors */
/*
 * kvf-demo-engine: a synthetic inference engine for `make demo`. It drives
 * one agent through libkvfabric the way a serving engine would: multi-turn
 * conversations that share a long system prompt (chained prefix keys), and
 * RAG documents reused in many prompts (independent keys). For every
 * prompt it looks up the longest cached prefix, retrieves and verifies the
 * hit chunks byte for byte, and "prefills" (writes) and commits the rest.
 * KV bytes are a deterministic function of the key, so every byte read
 * back is checked against what the writer produced.
 *
 * In PD mode (--mode prefill / --mode decode) it plays one side of a
 * prefill/decode pair instead: the prefill engine writes each request's KV
 * chunk by chunk and streams it to the decoder agent with kvf_pd_push(); the
 * decode engine waits for each request, checks every byte and releases it.
 *
 * Prints a table, or one JSON line with --json. Every figure is measured.
 */
#include <kvfabric/kvfabric.h>

#include "common/config.h"
#include "common/time.h"
#include "common/version.h"
#include "tools/bench/bench.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct kvf_demo_config {
    char *socket;
    char *name;
    char *mode;    /* cache, prefill or decode */
    char *decoder; /* prefill: the decoder agent's node name */
    uint64_t requests;
    uint64_t request_tokens;
    uint64_t conversations;
    uint64_t turns;
    uint64_t system_tokens;
    uint64_t turn_tokens;
    uint64_t documents;
    uint64_t doc_tokens;
    uint64_t layers;
    uint64_t kv_heads;
    uint64_t head_dim;
    uint64_t chunk_tokens;
    uint64_t seed;
    bool json;
    bool progress;
} kvf_demo_config_t;

#define KVF_DEMO_FIELD(_name, _type, _member, _default, _min, _max, _help) \
    { \
        _name, _type, offsetof(kvf_demo_config_t, _member), _default, _min, \
            _max, NULL, KVF_CONFIG_FIELD_CLI_ONLY, _help \
    }

static const kvf_config_field_t kvf_demo_fields[] = {
    KVF_DEMO_FIELD("socket", KVF_CONFIG_STRING, socket,
                   "/run/kvfabric/agent.sock", 0, 0, "agent socket"),
    KVF_DEMO_FIELD("name", KVF_CONFIG_STRING, name, "demo-engine", 0, 0,
                   "engine name"),
    KVF_DEMO_FIELD("mode", KVF_CONFIG_STRING, mode, "cache", 0, 0,
                   "cache (store and reuse prefixes), prefill or decode (PD "
                   "push)"),
    KVF_DEMO_FIELD("decoder", KVF_CONFIG_STRING, decoder, "", 0, 0,
                   "prefill mode: node name of the decoder agent"),
    KVF_DEMO_FIELD("requests", KVF_CONFIG_UINT, requests, "6", 1, 100000,
                   "PD modes: requests pushed (ids 1..N)"),
    KVF_DEMO_FIELD("request_tokens", KVF_CONFIG_UINT, request_tokens, "2048", 1,
                   1000000, "PD modes: prompt tokens per request"),
    KVF_DEMO_FIELD("conversations", KVF_CONFIG_UINT, conversations, "6", 1,
                   1000, "conversations sharing the system prompt"),
    KVF_DEMO_FIELD("turns", KVF_CONFIG_UINT, turns, "3", 1, 100,
                   "turns per conversation"),
    KVF_DEMO_FIELD("system_tokens", KVF_CONFIG_UINT, system_tokens, "2048", 0,
                   1000000, "tokens of the shared system prompt"),
    KVF_DEMO_FIELD("turn_tokens", KVF_CONFIG_UINT, turn_tokens, "512", 1,
                   1000000, "new tokens per turn"),
    KVF_DEMO_FIELD("documents", KVF_CONFIG_UINT, documents, "4", 0, 1000,
                   "RAG documents reused across prompts"),
    KVF_DEMO_FIELD("doc_tokens", KVF_CONFIG_UINT, doc_tokens, "512", 1, 1000000,
                   "tokens per RAG document"),
    KVF_DEMO_FIELD("layers", KVF_CONFIG_UINT, layers, "32", 1, 1024,
                   "model layers"),
    KVF_DEMO_FIELD("kv_heads", KVF_CONFIG_UINT, kv_heads, "8", 1, 1024,
                   "KV heads"),
    KVF_DEMO_FIELD("head_dim", KVF_CONFIG_UINT, head_dim, "128", 1, 4096,
                   "head dimension"),
    KVF_DEMO_FIELD("chunk_tokens", KVF_CONFIG_UINT, chunk_tokens, "256", 1,
                   65536, "tokens per chunk"),
    KVF_DEMO_FIELD("seed", KVF_CONFIG_UINT, seed, "1", 0, 0, "token id seed"),
    KVF_DEMO_FIELD("json", KVF_CONFIG_BOOL, json, "false", 0, 0,
                   "print one JSON line instead of a table"),
    KVF_DEMO_FIELD("progress", KVF_CONFIG_BOOL, progress, "false", 0, 0,
                   "show progress on stderr while serving"),
};

static const kvf_config_schema_t kvf_demo_schema = {
    "kvf-demo-engine", kvf_demo_fields,
    sizeof(kvf_demo_fields) / sizeof(kvf_demo_fields[0])};

typedef struct kvf_demo_stats {
    uint64_t prompts;
    uint64_t prompt_tokens;
    uint64_t tokens_saved; /* prefill skipped thanks to hits */
    uint64_t chunks_stored;
    uint64_t chunks_hit;
    uint64_t chunks_remote; /* hits another agent held: fetched by peers */
    uint64_t chunks_missed;
    uint64_t bytes_written;
    uint64_t bytes_read;
    uint64_t wrong_bytes; /* chunks read back that differ: must be 0 */
    uint64_t write_ns;    /* fill + checksum + commit */
    uint64_t read_ns;     /* retrieve + verify */
    uint64_t fetch_ns;    /* retrieves that fetched from peers */
    uint64_t bytes_fetched;
    uint64_t lookup_ns;
    uint64_t lookups;
} kvf_demo_stats_t;

typedef struct kvf_demo {
    kvf_demo_config_t cfg;
    kvf_client_t *client;
    uint64_t ns;
    uint64_t chunk_bytes;
    uint64_t total_prompts;
    bool is_tty;     /* stderr: progress redrawn in place */
    uint8_t *expect; /* scratch: the bytes a chunk must hold */
    kvf_demo_stats_t st;
} kvf_demo_t;

/* The KV bytes of a chunk: a function of its key, so readers can check. */
static void kvf_demo_fill(const kvf_key_t *key, uint8_t *p, uint64_t len)
{
    uint64_t x = key->hi ^ (key->lo * 0x9e3779b97f4a7c15ull) ^ 1, i;

    for (i = 0; i + 8 <= len; i += 8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        memcpy(p + i, &x, 8);
    }
    for (; i < len; i++) {
        p[i] = (uint8_t)i;
    }
}

/* One progress line: redrawn in place on a terminal, otherwise printed at
 * every quarter of the run. */
static void kvf_demo_progress(const kvf_demo_t *demo)
{
    const kvf_demo_stats_t *s = &demo->st;
    uint64_t asked            = s->chunks_hit + s->chunks_missed, quarter;

    if (!demo->cfg.progress || (demo->total_prompts == 0)) {
        return;
    }
    quarter = (demo->total_prompts + 3) / 4;
    if (!demo->is_tty && (s->prompts % quarter != 0) &&
        (s->prompts != demo->total_prompts)) {
        return;
    }
    fprintf(stderr,
            "%s  %s: prompt %3" PRIu64 "/%-3" PRIu64
            "  reused %5.1f%% of chunks  fetched from peers %6.2f GB%s",
            demo->is_tty ? "\r" : "", demo->cfg.name, s->prompts,
            demo->total_prompts,
            (asked == 0) ? 0.0 : 100.0 * (double)s->chunks_hit / (double)asked,
            (double)s->bytes_fetched / 1e9,
            (demo->is_tty && (s->prompts != demo->total_prompts)) ? "" : "\n");
}

static int kvf_demo_fail(kvf_demo_t *demo, const char *what,
                         kvf_status_t status)
{
    fprintf(stderr, "kvf-demo-engine: %s: %s (%s)\n", what,
            kvf_strerror(status), kvf_client_last_error(demo->client));
    return -1;
}

/* Serves one prompt whose chunk keys are @p keys: reuse the cached prefix
 * (or, for independent keys, every cached chunk), prefill the rest. */
static int kvf_demo_prompt(kvf_demo_t *demo, const kvf_key_t *keys, uint32_t n,
                           uint64_t tokens)
{
    uint8_t *base = kvf_client_pool_base(demo->client);
    kvf_lookup_result_t res;
    kvf_slot_t *slots;
    uint64_t *sums, t0;
    kvf_status_t status;
    bool *missing;
    uint32_t i, hit;
    int rc = -1;

    slots   = calloc(n, sizeof(*slots));
    sums    = calloc(n, sizeof(*sums));
    missing = calloc(n, sizeof(*missing));
    if ((slots == NULL) || (sums == NULL) || (missing == NULL)) {
        goto out;
    }
    demo->st.prompts++;
    demo->st.prompt_tokens += tokens;

    t0     = kvf_time_now_ns();
    status = kvf_client_lookup(demo->client, keys, n, false, &res);
    demo->st.lookup_ns += kvf_time_now_ns() - t0;
    demo->st.lookups++;
    if (status != KVF_OK) {
        kvf_demo_fail(demo, "lookup", status);
        goto out;
    }
    hit = res.hit_chunks;

    /* read the hit prefix back and check every byte */
    if (hit > 0) {
        uint64_t tr;

        t0     = kvf_time_now_ns();
        status = kvf_client_retrieve(demo->client, keys, hit, slots, missing);
        if (status != KVF_OK) {
            kvf_demo_fail(demo, "retrieve", status);
            goto out;
        }
        tr = kvf_time_now_ns() - t0;
        if (hit > res.local_chunks) {
            /* the retrieve pulled the remote part from other agents */
            demo->st.fetch_ns += tr;
            for (i = res.local_chunks; i < hit; i++) {
                if (!missing[i]) {
                    demo->st.chunks_remote++;
                    demo->st.bytes_fetched += slots[i].length;
                }
            }
        }
        for (i = 0; i < hit; i++) {
            if (missing[i]) {
                hit = i; /* evicted between lookup and retrieve */
                break;
            }
            kvf_demo_fill(&keys[i], demo->expect, slots[i].length);
            if (memcmp(base + slots[i].offset, demo->expect, slots[i].length) !=
                0) {
                demo->st.wrong_bytes++;
            }
            demo->st.bytes_read += slots[i].length;
        }
        for (i = 0; i < res.hit_chunks; i++) {
            if (!missing[i]) {
                kvf_client_release(demo->client, &slots[i], 1);
            }
        }
        demo->st.read_ns += kvf_time_now_ns() - t0;
    }
    demo->st.chunks_hit += hit;
    demo->st.tokens_saved += (uint64_t)hit * demo->cfg.chunk_tokens;

    /* "prefill" the rest: write KV into granted slots, commit */
    if (hit < n) {
        uint32_t todo = n - hit;

        t0     = kvf_time_now_ns();
        status = kvf_client_alloc(demo->client, demo->chunk_bytes, todo, slots);
        if (status != KVF_OK) {
            kvf_demo_fail(demo, "alloc", status);
            goto out;
        }
        for (i = 0; i < todo; i++) {
            uint8_t *p = base + slots[i].offset;

            kvf_demo_fill(&keys[hit + i], p, demo->chunk_bytes);
            sums[i] = kvf_chunk_checksum(p, demo->chunk_bytes);
        }
        status = kvf_client_commit(demo->client, keys + hit, slots, sums, todo);
        if ((status != KVF_OK) && (status != KVF_ERR_EXISTS)) {
            kvf_demo_fail(demo, "commit", status);
            goto out;
        }
        demo->st.write_ns += kvf_time_now_ns() - t0;
        demo->st.chunks_missed += todo;
        demo->st.chunks_stored += todo;
        demo->st.bytes_written += (uint64_t)todo * demo->chunk_bytes;
    }
    kvf_demo_progress(demo);
    rc = 0;

out:
    free(slots);
    free(sums);
    free(missing);
    return rc;
}

static uint32_t *kvf_demo_tokens(uint64_t n, uint64_t seed)
{
    uint32_t *t = malloc((n + 1) * sizeof(*t));
    uint64_t i;

    if (t == NULL) {
        return NULL;
    }
    for (i = 0; i < n; i++) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        t[i] = (uint32_t)(seed >> 40) % 128000u;
    }
    return t;
}

static int kvf_demo_run(kvf_demo_t *demo)
{
    const kvf_demo_config_t *c = &demo->cfg;
    uint64_t conv, turn, d, max_tokens, len;
    uint32_t *tokens = NULL, *doc;
    kvf_key_t *keys  = NULL;
    size_t nkeys;
    int rc = -1;

    demo->total_prompts = c->conversations * (c->turns + c->documents);
    max_tokens = c->system_tokens + c->turns * c->turn_tokens + c->doc_tokens;
    tokens     = malloc((max_tokens + 1) * sizeof(*tokens));
    keys       = malloc((max_tokens / c->chunk_tokens + 2) * sizeof(*keys));
    if ((tokens == NULL) || (keys == NULL)) {
        goto out;
    }

    /* multi-turn conversations over one shared system prompt */
    doc = kvf_demo_tokens(c->system_tokens, c->seed);
    if (doc == NULL) {
        goto out;
    }
    memcpy(tokens, doc, c->system_tokens * sizeof(*tokens));
    free(doc);
    for (conv = 0; conv < c->conversations; conv++) {
        len = c->system_tokens;
        for (turn = 0; turn < c->turns; turn++) {
            doc = kvf_demo_tokens(c->turn_tokens,
                                  c->seed * 7919 + conv * 131 + turn + 1);
            if (doc == NULL) {
                goto out;
            }
            memcpy(tokens + len, doc, c->turn_tokens * sizeof(*tokens));
            free(doc);
            len += c->turn_tokens;
            if ((kvf_key_chain(demo->ns, tokens, len, (uint32_t)c->chunk_tokens,
                               false, keys, max_tokens / c->chunk_tokens + 2,
                               &nkeys) != KVF_OK) ||
                ((nkeys > 0) &&
                 (kvf_demo_prompt(demo, keys, (uint32_t)nkeys, len) != 0))) {
                goto out;
            }
        }
    }

    /* RAG: each document, at a different place in each prompt, is keyed
     * chunk by chunk independently of what precedes it */
    for (conv = 0; conv < c->conversations; conv++) {
        for (d = 0; d < c->documents; d++) {
            uint64_t i, n = c->doc_tokens / c->chunk_tokens;

            doc = kvf_demo_tokens(c->doc_tokens, 1000003 * (d + 1));
            if (doc == NULL) {
                goto out;
            }
            for (i = 0; i < n; i++) {
                kvf_key_independent(demo->ns, doc + i * c->chunk_tokens,
                                    c->chunk_tokens, &keys[i]);
            }
            free(doc);
            if ((n > 0) && (kvf_demo_prompt(demo, keys, (uint32_t)n,
                                            c->doc_tokens) != 0)) {
                goto out;
            }
        }
    }
    rc = 0;

out:
    free(tokens);
    free(keys);
    return rc;
}

static double kvf_demo_gbps(uint64_t bytes, uint64_t ns)
{
    return (ns == 0) ? 0.0 : (double)bytes / (double)ns;
}

/* The key whose fill is chunk @p index of PD request @p request. */
static void kvf_demo_pd_key(const kvf_demo_t *demo, uint64_t request,
                            uint64_t index, kvf_key_t *key_p)
{
    memset(key_p, 0, sizeof(*key_p));
    key_p->ns = demo->ns;
    key_p->hi = request;
    key_p->lo = index + 1;
}

/* Prefill side: each request's chunks are "computed" (written) one at a
 * time and pushed as soon as each is ready, the last one final. */
static int kvf_demo_pd_prefill(kvf_demo_t *demo)
{
    const kvf_demo_config_t *c = &demo->cfg;
    uint64_t k    = (c->request_tokens + c->chunk_tokens - 1) / c->chunk_tokens;
    uint64_t *lat = calloc(c->requests, sizeof(*lat)), r, i, t0, push_ns = 0;
    uint8_t *base = kvf_client_pool_base(demo->client);
    kvf_status_t status;
    kvf_slot_t slot;
    kvf_key_t key;
    uint64_t sum;
    int rc = -1;

    if (lat == NULL) {
        return -1;
    }
    for (r = 1; r <= c->requests; r++) {
        for (i = 0; i < k; i++) {
            status =
                kvf_client_alloc(demo->client, demo->chunk_bytes, 1, &slot);
            if (status != KVF_OK) {
                kvf_demo_fail(demo, "alloc", status);
                goto out;
            }
            kvf_demo_pd_key(demo, r, i, &key);
            kvf_demo_fill(&key, base + slot.offset, demo->chunk_bytes);
            sum    = kvf_chunk_checksum(base + slot.offset, demo->chunk_bytes);
            t0     = kvf_time_now_ns();
            status = kvf_pd_push(demo->client, r, c->decoder, &slot, &sum, 1,
                                 i + 1 == k);
            lat[r - 1] += kvf_time_now_ns() - t0;
            kvf_client_release(demo->client, &slot, 1);
            if (status != KVF_OK) {
                kvf_demo_fail(demo, "push", status);
                goto out;
            }
            demo->st.bytes_written += demo->chunk_bytes;
            demo->st.chunks_stored++;
        }
        push_ns += lat[r - 1];
        demo->st.prompts++;
        if (c->progress) {
            fprintf(stderr,
                    "  %s: request %" PRIu64 "/%" PRIu64 " pushed to %s "
                    "(%" PRIu64 " chunks, %.1f ms)\n",
                    c->name, r, c->requests, c->decoder, k,
                    (double)lat[r - 1] / 1e6);
        }
    }
    if (c->json) {
        printf("{\"bench\":\"demo-pd-prefill\",\"name\":\"%s\","
               "\"requests\":%" PRIu64 ",\"chunks_pushed\":%" PRIu64
               ",\"bytes_moved\":%" PRIu64 ",\"GBps\":%.2f,\"p50_us\":%.0f,"
               "\"p99_us\":%.0f}\n",
               c->name, c->requests, demo->st.chunks_stored,
               demo->st.bytes_written,
               kvf_demo_gbps(demo->st.bytes_written, push_ns),
               (double)kvf_bench_percentile(lat, c->requests, 50) / 1e3,
               (double)kvf_bench_percentile(lat, c->requests, 99) / 1e3);
    } else {
        printf("  %-34s %14" PRIu64 "\n", "PD requests pushed", c->requests);
        printf("  %-34s %14.2f\n", "pushed (GB)",
               (double)demo->st.bytes_written / 1e9);
        printf("  %-34s %14.2f\n", "push GB/s (until acknowledged)",
               kvf_demo_gbps(demo->st.bytes_written, push_ns));
        printf("  %-34s %14.1f\n", "push per request, p50 (ms)",
               (double)kvf_bench_percentile(lat, c->requests, 50) / 1e6);
    }
    rc = 0;

out:
    free(lat);
    return rc;
}

/* Decode side: waits for requests 1..N (before or after their push
 * started: both orders work), checks every byte, releases. */
static int kvf_demo_pd_decode(kvf_demo_t *demo)
{
    const kvf_demo_config_t *c = &demo->cfg;
    uint64_t k    = (c->request_tokens + c->chunk_tokens - 1) / c->chunk_tokens;
    uint8_t *base = kvf_client_pool_base(demo->client);
    kvf_slot_t *slots = calloc(k, sizeof(*slots));
    kvf_status_t status;
    uint32_t n, i;
    kvf_key_t key;
    uint64_t r;
    int rc = -1;

    if (slots == NULL) {
        return -1;
    }
    for (r = 1; r <= c->requests; r++) {
        status = kvf_pd_wait(demo->client, r, 60 * KVF_NSEC_PER_SEC, slots,
                             (uint32_t)k, &n);
        if (status != KVF_OK) {
            kvf_demo_fail(demo, "wait", status);
            goto out;
        }
        for (i = 0; i < n; i++) {
            kvf_demo_pd_key(demo, r, i, &key);
            kvf_demo_fill(&key, demo->expect, slots[i].length);
            if ((slots[i].length != demo->chunk_bytes) ||
                (memcmp(base + slots[i].offset, demo->expect,
                        slots[i].length) != 0)) {
                demo->st.wrong_bytes++;
            }
            demo->st.bytes_read += slots[i].length;
            demo->st.chunks_hit++;
        }
        if (n != k) {
            demo->st.wrong_bytes++; /* a request must arrive whole */
        }
        status = kvf_pd_release(demo->client, r);
        if (status != KVF_OK) {
            kvf_demo_fail(demo, "release", status);
            goto out;
        }
        demo->st.prompts++;
    }
    if (c->json) {
        printf("{\"bench\":\"demo-pd-decode\",\"name\":\"%s\","
               "\"requests\":%" PRIu64 ",\"chunks_received\":%" PRIu64
               ",\"tokens_saved\":%" PRIu64 ",\"prompt_tokens\":%" PRIu64
               ",\"wrong_bytes\":%" PRIu64 "}\n",
               c->name, c->requests, demo->st.chunks_hit,
               c->requests * c->request_tokens, c->requests * c->request_tokens,
               demo->st.wrong_bytes);
    } else {
        printf("  %-34s %14" PRIu64 "\n", "PD requests received", c->requests);
        printf("  %-34s %14" PRIu64 "\n", "chunks read back wrong (must be 0)",
               demo->st.wrong_bytes);
    }
    rc = 0;

out:
    free(slots);
    return rc;
}

static void kvf_demo_report(const kvf_demo_t *demo)
{
    const kvf_demo_stats_t *s = &demo->st;
    uint64_t asked            = s->chunks_hit + s->chunks_missed;
    double hit_rate =
        (asked == 0) ? 0.0 : 100.0 * (double)s->chunks_hit / (double)asked;

    if (demo->cfg.json) {
        printf("{\"bench\":\"demo-engine\",\"name\":\"%s\",\"prompts\":%" PRIu64
               ",\"chunk_bytes\":%" PRIu64 ",\"chunks_stored\":%" PRIu64
               ",\"chunks_hit\":%" PRIu64 ",\"hit_rate_pct\":%.1f"
               ",\"tokens_saved\":%" PRIu64 ",\"prompt_tokens\":%" PRIu64
               ",\"bytes_written\":%" PRIu64 ",\"bytes_read\":%" PRIu64
               ",\"write_GBps\":%.2f,\"read_verify_GBps\":%.2f"
               ",\"lookup_avg_us\":%.1f,\"chunks_fetched\":%" PRIu64
               ",\"bytes_moved\":%" PRIu64
               ",\"fetch_GBps\":%.2f,\"wrong_bytes\":%" PRIu64 "}\n",
               demo->cfg.name, s->prompts, demo->chunk_bytes, s->chunks_stored,
               s->chunks_hit, hit_rate, s->tokens_saved, s->prompt_tokens,
               s->bytes_written, s->bytes_read,
               kvf_demo_gbps(s->bytes_written, s->write_ns),
               kvf_demo_gbps(s->bytes_read, s->read_ns),
               (s->lookups == 0)
                   ? 0.0
                   : (double)s->lookup_ns / 1000.0 / (double)s->lookups,
               s->chunks_remote, s->bytes_fetched,
               kvf_demo_gbps(s->bytes_fetched, s->fetch_ns), s->wrong_bytes);
        return;
    }
    printf("  %-34s %14" PRIu64 "\n", "prompts served", s->prompts);
    printf("  %-34s %14.1f\n", "chunk size (MiB)",
           (double)demo->chunk_bytes / (1 << 20));
    printf("  %-34s %14" PRIu64 "\n", "chunks stored (prefilled)",
           s->chunks_stored);
    printf("  %-34s %14" PRIu64 "  (%.1f%% of chunks asked)\n",
           "chunks reused from the cache", s->chunks_hit, hit_rate);
    printf("  %-34s %14" PRIu64 "\n", "  of which fetched from peers",
           s->chunks_remote);
    printf("  %-34s %14" PRIu64 " of %" PRIu64 "\n", "prefill tokens saved",
           s->tokens_saved, s->prompt_tokens);
    printf("  %-34s %14.2f\n", "written to the pool (GB)",
           (double)s->bytes_written / 1e9);
    printf("  %-34s %14.2f\n", "write + checksum + commit (GB/s)",
           kvf_demo_gbps(s->bytes_written, s->write_ns));
    printf("  %-34s %14.2f\n", "peer fetch incl. lookup (GB/s)",
           kvf_demo_gbps(s->bytes_fetched, s->fetch_ns));
    printf("  %-34s %14.2f\n", "retrieve + byte check (GB/s)",
           kvf_demo_gbps(s->bytes_read, s->read_ns));
    printf("  %-34s %14.1f\n", "lookup round trip, mean (us)",
           (s->lookups == 0)
               ? 0.0
               : (double)s->lookup_ns / 1000.0 / (double)s->lookups);
    printf("  %-34s %14" PRIu64 "\n", "chunks read back wrong (must be 0)",
           s->wrong_bytes);
}

int main(int argc, char **argv)
{
    kvf_namespace_params_t nsp;
    kvf_client_params_t cp;
    kvf_config_error_t err;
    kvf_demo_t demo;
    kvf_status_t status;
    int rc = 1, argi;

    memset(&demo, 0, sizeof(demo));
    demo.is_tty = isatty(STDERR_FILENO);
    if (kvf_version_asked(argc, argv)) {
        kvf_version_print("kvf-demo-engine", stdout);
        return 0;
    }
    if ((argc > 1) && (strcmp(argv[1], "--help") == 0)) {
        printf("usage: kvf-demo-engine [options]\n");
        kvf_config_print_help(&kvf_demo_schema, stdout);
        return 0;
    }
    if (kvf_config_load(&kvf_demo_schema, &demo.cfg, argc,
                        (const char *const *)argv, &argi, &err) != KVF_OK) {
        fprintf(stderr, "kvf-demo-engine: %s\n", err.msg);
        goto out;
    }
    memset(&nsp, 0, sizeof(nsp));
    nsp.field_mask =
        KVF_NAMESPACE_FIELD_MODEL_ID | KVF_NAMESPACE_FIELD_DTYPE |
        KVF_NAMESPACE_FIELD_NUM_LAYERS | KVF_NAMESPACE_FIELD_NUM_KV_HEADS |
        KVF_NAMESPACE_FIELD_HEAD_DIM | KVF_NAMESPACE_FIELD_CHUNK_SIZE;
    nsp.model_id     = "synthetic-llama-3-8b";
    nsp.dtype        = KVF_DTYPE_BF16;
    nsp.num_layers   = (uint32_t)demo.cfg.layers;
    nsp.num_kv_heads = (uint32_t)demo.cfg.kv_heads;
    nsp.head_dim     = (uint32_t)demo.cfg.head_dim;
    nsp.chunk_size   = (uint32_t)demo.cfg.chunk_tokens;
    if (kvf_namespace_fingerprint(&nsp, &demo.ns) != KVF_OK) {
        fprintf(stderr, "kvf-demo-engine: bad model shape\n");
        goto out;
    }
    /* KV_2LTD: [2][layers][tokens][heads * dim], bf16 */
    demo.chunk_bytes = 2 * demo.cfg.layers * demo.cfg.chunk_tokens *
                       demo.cfg.kv_heads * demo.cfg.head_dim * 2;
    demo.expect = malloc(demo.chunk_bytes);
    if (demo.expect == NULL) {
        fprintf(stderr, "kvf-demo-engine: out of memory\n");
        goto out;
    }
    memset(&cp, 0, sizeof(cp));
    cp.field_mask = KVF_CLIENT_PARAM_SOCKET | KVF_CLIENT_PARAM_NAME |
                    KVF_CLIENT_PARAM_TIMEOUT;
    cp.socket_path = demo.cfg.socket;
    cp.name        = demo.cfg.name;
    cp.timeout_ns  = 30 * KVF_NSEC_PER_SEC;
    status         = kvf_client_connect(&cp, &demo.client);
    if (status != KVF_OK) {
        fprintf(stderr, "kvf-demo-engine: cannot connect to %s: %s\n",
                demo.cfg.socket, kvf_strerror(status));
        goto out;
    }
    if (strcmp(demo.cfg.mode, "prefill") == 0) {
        if ((demo.cfg.decoder[0] == '\0') ||
            (kvf_demo_pd_prefill(&demo) != 0)) {
            if (demo.cfg.decoder[0] == '\0') {
                fprintf(stderr, "kvf-demo-engine: --mode prefill needs "
                                "--decoder NAME\n");
            }
            goto out;
        }
    } else if (strcmp(demo.cfg.mode, "decode") == 0) {
        if (kvf_demo_pd_decode(&demo) != 0) {
            goto out;
        }
    } else if (strcmp(demo.cfg.mode, "cache") == 0) {
        if (kvf_demo_run(&demo) != 0) {
            goto out;
        }
        kvf_demo_report(&demo);
    } else {
        fprintf(stderr,
                "kvf-demo-engine: --mode must be cache, prefill or decode\n");
        goto out;
    }
    rc = (demo.st.wrong_bytes == 0) ? 0 : 3;

out:
    kvf_client_disconnect(demo.client);
    free(demo.expect);
    kvf_config_cleanup(&kvf_demo_schema, &demo.cfg);
    return rc;
}
