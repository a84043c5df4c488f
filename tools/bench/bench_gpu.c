/* SPDX-License-Identifier: Apache-2.0 */
/* Copyright (c) 2026 The kvfabric authors */
/*
 * kvf-bench gpu: paged KV -> chunk (pack) and back (unpack) throughput,
 * beside a plain copy of the same byte count measured in the same run
 * (memcpy on the CPU path, cudaMemcpy device-to-device on the CUDA path).
 * One JSON line per case on stdout; progress and skips on stderr.
 */
#include "tools/bench/bench.h"

#include "common/time.h"

#include <kvfabric/gpu.h>
#include <kvfabric/log.h>

#include <getopt.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum {
    KVF_BENCH_GPU_EXIT_SKIPPED = 77, /* nothing ran: no CUDA device */
};

typedef enum {
    KVF_BENCH_GPU_OP_PACK   = 0,
    KVF_BENCH_GPU_OP_UNPACK = 1,
    KVF_BENCH_GPU_OP_COPY   = 2, /* the plain-copy baseline */
    KVF_BENCH_GPU_OP_COUNT  = 3,
} kvf_bench_gpu_op_t;

typedef struct kvf_bench_gpu_opts {
    const char *layout; /* a kvf_gpu_layout_name(), or all */
    const char *path;   /* cpu|cuda|all */
    const char *dtype;
    uint32_t layers, heads, head_dim, block_size;
    uint64_t tokens, cache_blocks, seed;
    unsigned iters;
} kvf_bench_gpu_opts_t;

typedef struct kvf_bench_gpu_case {
    kvf_gpu_kv_layout_t layout;
    kvf_gpu_kv_copy_params_t params;
    void *k_tab[KVF_GPU_MAX_LAYERS];
    void *v_tab[KVF_GPU_MAX_LAYERS];
    size_t k_bytes, v_bytes, chunk_bytes;
    int64_t *slots; /* host copy */
    bool on_device;
    void *dev_slots;
    void *chunk, *chunk2; /* chunk2: the plain-copy baseline's source */
} kvf_bench_gpu_case_t;

static const char *const kvf_bench_gpu_dtypes[] = {"fp16", "bf16", "fp32",
                                                   "fp8"};

static int kvf_bench_gpu_lookup(const char *const *names, int n,
                                const char *name)
{
    int i;

    for (i = 0; i < n; i++) {
        if (strcmp(names[i], name) == 0) {
            return i;
        }
    }
    return -1;
}

static void kvf_bench_gpu_usage(FILE *out)
{
    int l;

    fprintf(out,
            "usage: kvf-bench gpu [--layout NAME|all] "
            "[--path cpu|cuda|all]\n"
            "         [--dtype fp16|bf16|fp32|fp8] [--layers N] [--heads N] "
            "[--head-dim N]\n"
            "         [--tokens N] [--block-size N] [--cache-blocks N] "
            "[--iters N] [--seed N]\n"
            "defaults: Llama-3-8B shape (vllm, bf16, 32 layers, 8 kv heads, "
            "head_dim 128),\n"
            "256-token chunks, block_size 16, cache of 2 chunks' blocks, "
            "random block order,\n"
            "20 iterations, both paths. Exit 77 when only the cuda path was "
            "asked for and\nthere is no CUDA device.\nlayouts:");
    for (l = 0; l < KVF_GPU_LAYOUT_COUNT; l++) {
        fprintf(out, " %s", kvf_gpu_layout_name((kvf_gpu_layout_t)l));
    }
    fprintf(out, " (vllm_cpu_split = vllm_hnd)\n");
}

static uint64_t kvf_bench_gpu_rand(uint64_t *state)
{
    uint64_t z = (*state += 0x9e3779b97f4a7c15ull);

    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static void *kvf_bench_gpu_alloc(bool on_device, size_t len)
{
    void *p = NULL;

    if (on_device) {
        return (kvf_gpu_mem_alloc(len, &p) == KVF_OK) ? p : NULL;
    }
    p = malloc(len);
    if (p != NULL) {
        memset(p, 0x5a, len); /* fault the pages in before timing */
    }
    return p;
}

static void kvf_bench_gpu_free(bool on_device, void *p)
{
    if (on_device) {
        kvf_gpu_mem_free(p);
    } else {
        free(p);
    }
}

static void kvf_bench_gpu_case_destroy(kvf_bench_gpu_case_t *c)
{
    uint32_t l;

    for (l = 0; l < KVF_GPU_MAX_LAYERS; l++) {
        kvf_bench_gpu_free(c->on_device, c->k_tab[l]);
        kvf_bench_gpu_free(c->on_device, c->v_tab[l]);
    }
    kvf_bench_gpu_free(c->on_device, c->chunk);
    kvf_bench_gpu_free(c->on_device, c->chunk2);
    kvf_gpu_mem_free(c->dev_slots);
    free(c->slots);
}

static int kvf_bench_gpu_case_create(kvf_bench_gpu_case_t *c,
                                     const kvf_bench_gpu_opts_t *o, int layout,
                                     int dtype, bool on_device)
{
    uint64_t st = o->seed, nslots, b, t, *perm;
    size_t row;
    uint32_t l;
    bool has_v;

    memset(c, 0, sizeof(*c));
    c->on_device = on_device;
    c->layout    = (kvf_gpu_kv_layout_t){
           .field_mask = KVF_GPU_KV_LAYOUT_FIELD_LAYOUT |
                         KVF_GPU_KV_LAYOUT_FIELD_DTYPE |
                         KVF_GPU_KV_LAYOUT_FIELD_NUM_LAYERS |
                         KVF_GPU_KV_LAYOUT_FIELD_NUM_KV_HEADS |
                         KVF_GPU_KV_LAYOUT_FIELD_HEAD_DIM |
                         KVF_GPU_KV_LAYOUT_FIELD_BLOCK_SIZE |
                         KVF_GPU_KV_LAYOUT_FIELD_NUM_BLOCKS,
           .layout       = (kvf_gpu_layout_t)layout,
           .dtype        = (kvf_gpu_dtype_t)dtype,
           .num_layers   = o->layers,
           .num_kv_heads = (layout == KVF_GPU_LAYOUT_MLA) ? 1 : o->heads,
           .head_dim     = o->head_dim,
           .block_size   = (layout == KVF_GPU_LAYOUT_SGLANG) ? 1 : o->block_size,
           .num_blocks   = o->cache_blocks,
    };
    if (layout == KVF_GPU_LAYOUT_SGLANG) { /* same slot count, no blocks */
        c->layout.num_blocks = o->cache_blocks * o->block_size;
    }
    if ((kvf_gpu_kv_row_bytes(&c->layout, &row) != KVF_OK) ||
        (kvf_gpu_kv_chunk_bytes(&c->layout, o->tokens, &c->chunk_bytes) !=
         KVF_OK)) {
        return -1; /* logged by the library */
    }
    nslots = c->layout.num_blocks * c->layout.block_size;
    if (nslots < o->tokens) {
        fprintf(stderr,
                "kvf-bench gpu: cache of %" PRIu64
                " slots is smaller than a %" PRIu64 "-token chunk\n",
                nslots, o->tokens);
        return -1;
    }
    /* K and V in one tensor per layer except split K/V (kv, sglang) and
     * K-only MLA */
    has_v = (layout == KVF_GPU_LAYOUT_KV) || (layout == KVF_GPU_LAYOUT_SGLANG);
    c->k_bytes =
        nslots * row * ((has_v || (layout == KVF_GPU_LAYOUT_MLA)) ? 1 : 2);
    c->v_bytes = has_v ? nslots * row : 0;
    for (l = 0; l < o->layers; l++) {
        c->k_tab[l] = kvf_bench_gpu_alloc(on_device, c->k_bytes);
        if (c->k_tab[l] == NULL) {
            goto err_nomem;
        }
        if (c->v_bytes > 0) {
            c->v_tab[l] = kvf_bench_gpu_alloc(on_device, c->v_bytes);
            if (c->v_tab[l] == NULL) {
                goto err_nomem;
            }
        }
    }
    c->chunk  = kvf_bench_gpu_alloc(on_device, c->chunk_bytes);
    c->chunk2 = kvf_bench_gpu_alloc(on_device, c->chunk_bytes);
    c->slots  = malloc(o->tokens * sizeof(*c->slots));
    if ((c->chunk == NULL) || (c->chunk2 == NULL) || (c->slots == NULL)) {
        goto err_nomem;
    }

    /* engines hand out blocks in any order; tokens fill a block in order */
    nslots = c->layout.num_blocks;
    perm   = malloc(nslots * sizeof(*perm));
    if (perm == NULL) {
        goto err_nomem;
    }
    for (b = 0; b < nslots; b++) {
        perm[b] = b;
    }
    for (b = nslots - 1; b > 0; b--) {
        uint64_t j = kvf_bench_gpu_rand(&st) % (b + 1), tmp = perm[b];

        perm[b] = perm[j];
        perm[j] = tmp;
    }
    for (t = 0; t < o->tokens; t++) {
        c->slots[t] =
            (int64_t)(perm[t / c->layout.block_size] * c->layout.block_size +
                      t % c->layout.block_size);
    }
    free(perm);
    c->params.slot_mapping = c->slots;
    if (on_device) {
        if ((kvf_gpu_mem_alloc(o->tokens * sizeof(int64_t), &c->dev_slots) !=
             KVF_OK) ||
            (kvf_gpu_memcpy(c->dev_slots, c->slots,
                            o->tokens * sizeof(int64_t)) != KVF_OK)) {
            goto err_nomem;
        }
        c->params.slot_mapping = c->dev_slots;
    }

    c->params.field_mask =
        KVF_GPU_KV_COPY_FIELD_LAYOUT | KVF_GPU_KV_COPY_FIELD_K_LAYERS |
        KVF_GPU_KV_COPY_FIELD_V_LAYERS | KVF_GPU_KV_COPY_FIELD_SLOT_MAPPING |
        KVF_GPU_KV_COPY_FIELD_SLOT_MAPPING_LEN |
        KVF_GPU_KV_COPY_FIELD_NUM_TOKENS | KVF_GPU_KV_COPY_FIELD_CHUNK |
        KVF_GPU_KV_COPY_FIELD_CHUNK_TOKENS;
    c->params.layout           = &c->layout;
    c->params.k_layers         = c->k_tab;
    c->params.v_layers         = c->v_tab;
    c->params.slot_mapping_len = o->tokens;
    c->params.num_tokens       = o->tokens;
    c->params.chunk            = c->chunk;
    c->params.chunk_tokens     = o->tokens;
    return 0;

err_nomem:
    fprintf(stderr, "kvf-bench gpu: out of %s memory\n",
            on_device ? "device" : "host");
    kvf_bench_gpu_case_destroy(c);
    return -1;
}

/* Mean GB/s of @p iters runs of one operation, after one warm-up. */
static int kvf_bench_gpu_time(kvf_bench_gpu_case_t *c, kvf_bench_gpu_op_t op,
                              unsigned iters, double *gbps_p)
{
    kvf_status_t status = KVF_OK;
    uint64_t start      = kvf_time_now_ns();
    unsigned i;

    for (i = 0; i <= iters; i++) {
        if (i == 1) { /* iteration 0 warms caches, TLBs and the kernel */
            if (c->on_device && (kvf_gpu_synchronize() != KVF_OK)) {
                return -1;
            }
            start = kvf_time_now_ns();
        }
        switch (op) {
        case KVF_BENCH_GPU_OP_PACK:
            status = c->on_device ? kvf_gpu_kv_pack_cuda(&c->params, NULL)
                                  : kvf_gpu_kv_pack_cpu(&c->params);
            break;
        case KVF_BENCH_GPU_OP_UNPACK:
            status = c->on_device ? kvf_gpu_kv_unpack_cuda(&c->params, NULL)
                                  : kvf_gpu_kv_unpack_cpu(&c->params);
            break;
        default:
            if (c->on_device) {
                status = kvf_gpu_memcpy(c->chunk, c->chunk2, c->chunk_bytes);
            } else {
                memcpy(c->chunk, c->chunk2, c->chunk_bytes);
            }
            break;
        }
        if (status != KVF_OK) {
            return -1;
        }
    }
    if (c->on_device && (kvf_gpu_synchronize() != KVF_OK)) {
        return -1;
    }
    *gbps_p =
        (double)c->chunk_bytes * iters / (double)(kvf_time_now_ns() - start);
    return 0;
}

static int kvf_bench_gpu_run(const kvf_bench_gpu_opts_t *o, int layout,
                             int dtype, bool on_device)
{
    static const char *const ops[] = {"pack", "unpack"};
    kvf_bench_gpu_case_t c;
    double gbps[KVF_BENCH_GPU_OP_COUNT];
    int op;

    fprintf(stderr, "kvf-bench gpu: %s %s %s ...\n", on_device ? "cuda" : "cpu",
            kvf_gpu_layout_name((kvf_gpu_layout_t)layout),
            kvf_bench_gpu_dtypes[dtype]);
    if (kvf_bench_gpu_case_create(&c, o, layout, dtype, on_device) != 0) {
        return -1;
    }
    for (op = 0; op < KVF_BENCH_GPU_OP_COUNT; op++) {
        if (kvf_bench_gpu_time(&c, (kvf_bench_gpu_op_t)op, o->iters,
                               &gbps[op]) != 0) {
            fprintf(stderr, "kvf-bench gpu: %s failed\n",
                    (op < KVF_BENCH_GPU_OP_COPY) ? ops[op] : "baseline copy");
            kvf_bench_gpu_case_destroy(&c);
            return -1;
        }
    }
    for (op = 0; op < 2; op++) {
        printf("{\"bench\":\"gpu\",\"op\":\"%s\",\"path\":\"%s\","
               "\"layout\":\"%s\",\"dtype\":\"%s\",\"layers\":%u,"
               "\"kv_heads\":%u,\"head_dim\":%u,\"tokens\":%" PRIu64
               ",\"block_size\":%u,\"bytes\":%zu,\"iters\":%u,"
               "\"GBps\":%.2f,\"memcpy_GBps\":%.2f}\n",
               ops[op], on_device ? "cuda" : "cpu",
               kvf_gpu_layout_name((kvf_gpu_layout_t)layout),
               kvf_bench_gpu_dtypes[dtype], c.layout.num_layers,
               c.layout.num_kv_heads, c.layout.head_dim, o->tokens,
               c.layout.block_size, c.chunk_bytes, o->iters, gbps[op],
               gbps[KVF_BENCH_GPU_OP_COPY]);
    }
    fflush(stdout);
    kvf_bench_gpu_case_destroy(&c);
    return 0;
}

static int kvf_bench_gpu_parse_u64(const char *arg, const char *name,
                                   uint64_t min, uint64_t max, uint64_t *v_p)
{
    char *end;
    unsigned long long v;

    v = strtoull(arg, &end, 10);
    if ((*arg == '\0') || (*end != '\0') || (v < min) || (v > max)) {
        fprintf(stderr,
                "kvf-bench gpu: --%s %s: expected %" PRIu64 "..%" PRIu64 "\n",
                name, arg, min, max);
        return -1;
    }
    *v_p = v;
    return 0;
}

int kvf_bench_gpu_main(int argc, char **argv)
{
    static const struct option long_opts[] = {
        {"layout", required_argument, NULL, 'l'},
        {"path", required_argument, NULL, 'p'},
        {"dtype", required_argument, NULL, 'd'},
        {"layers", required_argument, NULL, 'L'},
        {"heads", required_argument, NULL, 'H'},
        {"head-dim", required_argument, NULL, 'D'},
        {"tokens", required_argument, NULL, 't'},
        {"block-size", required_argument, NULL, 'b'},
        {"cache-blocks", required_argument, NULL, 'c'},
        {"iters", required_argument, NULL, 'i'},
        {"seed", required_argument, NULL, 's'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    kvf_bench_gpu_opts_t o = {
        .layout     = "vllm",
        .path       = "all",
        .dtype      = "bf16",
        .layers     = 32,
        .heads      = 8,
        .head_dim   = 128,
        .block_size = 16,
        .tokens     = 256,
        .seed       = 1,
        .iters      = 20,
    };
    const char *reason;
    kvf_gpu_layout_t one;
    int opt, idx, layout, dtype, l, ran = 0, failed = 0, lo, hi;
    uint64_t v;
    bool want_cpu, want_cuda;

    optind = 1;
    while ((opt = getopt_long(argc, argv, "h", long_opts, &idx)) != -1) {
        v = 0;
        switch (opt) {
        case 'l':
            o.layout = optarg;
            break;
        case 'p':
            o.path = optarg;
            break;
        case 'd':
            o.dtype = optarg;
            break;
        case 'L':
        case 'H':
        case 'D':
        case 'b':
        case 'i':
            if (kvf_bench_gpu_parse_u64(
                    optarg, long_opts[idx].name, 1,
                    (opt == 'L') ? KVF_GPU_MAX_LAYERS : 1u << 20, &v) != 0) {
                return 2;
            }
            if (opt == 'L') {
                o.layers = (uint32_t)v;
            } else if (opt == 'H') {
                o.heads = (uint32_t)v;
            } else if (opt == 'D') {
                o.head_dim = (uint32_t)v;
            } else if (opt == 'b') {
                o.block_size = (uint32_t)v;
            } else {
                o.iters = (unsigned)v;
            }
            break;
        case 't':
        case 'c':
        case 's':
            if (kvf_bench_gpu_parse_u64(optarg, long_opts[idx].name,
                                        (opt == 's') ? 0 : 1, 1ull << 32,
                                        &v) != 0) {
                return 2;
            }
            if (opt == 't') {
                o.tokens = v;
            } else if (opt == 'c') {
                o.cache_blocks = v;
            } else {
                o.seed = v;
            }
            break;
        case 'h':
            kvf_bench_gpu_usage(stdout);
            return 0;
        default:
            kvf_bench_gpu_usage(stderr);
            return 2;
        }
    }
    if (o.cache_blocks == 0) { /* room for two chunks' blocks */
        o.cache_blocks = 2 * ((o.tokens + o.block_size - 1) / o.block_size);
    }
    dtype = kvf_bench_gpu_lookup(kvf_bench_gpu_dtypes, 4, o.dtype);
    lo = hi = -1;
    if (kvf_gpu_layout_from_name(o.layout, &one) == KVF_OK) {
        lo = hi = (int)one;
    } else if (strcmp(o.layout, "all") == 0) {
        lo = 0;
        hi = KVF_GPU_LAYOUT_COUNT - 1;
    }
    want_cpu  = (strcmp(o.path, "cpu") == 0) || (strcmp(o.path, "all") == 0);
    want_cuda = (strcmp(o.path, "cuda") == 0) || (strcmp(o.path, "all") == 0);
    if ((dtype < 0) || (lo < 0) || (!want_cpu && !want_cuda) ||
        (optind != argc)) {
        kvf_bench_gpu_usage(stderr);
        return 2;
    }

    for (layout = lo; layout <= hi; layout++) {
        if (want_cpu) {
            failed |= kvf_bench_gpu_run(&o, layout, dtype, false);
            ran++;
        }
    }
    if (want_cuda) {
        if (!kvf_gpu_is_available(&reason)) {
            fprintf(stderr, "kvf-bench gpu: skipping the cuda path: %s\n",
                    reason);
        } else {
            for (l = lo; l <= hi; l++) {
                failed |= kvf_bench_gpu_run(&o, l, dtype, true);
                ran++;
            }
        }
    }
    if (failed) {
        return 1;
    }
    return (ran == 0) ? KVF_BENCH_GPU_EXIT_SKIPPED : 0;
}
