/* SPDX-License-Identifier: Apache-2.0 */
/* Copyright (c) 2026 The kvfabric authors */
/*
 * The CPU pack/unpack against a naive per-element loop written here from
 * the layout definitions (not from the plan the implementation uses), over
 * random layouts, dtypes, block sizes and slot mappings; plus every
 * argument check.
 */
#include "tests/helpers/test_helpers.h"
#include "tests/unit/gpu/kv_case.h"

#include <kvfabric/gpu.h>

#include <criterion/criterion.h>
#include <criterion/parameterized.h>

#include <stdio.h>

TestSuite(kv_copy, .fini = kvf_test_check_leaks, .timeout = 60);

/* Byte offset of element (h, d) of token @p slot, K (kv 0) or V (kv 1), in
 * the buffer of one layer that holds it (c->v[l] when kv_case_has_v_table()
 * and kv 1, else c->k[l]), straight from the layout's shape. */
static uint64_t naive_paged_off(const kv_case_t *c, uint32_t kv, uint64_t slot,
                                uint32_t h, uint32_t d)
{
    const kvf_gpu_kv_layout_t *lay = &c->layout;
    uint64_t nb = lay->num_blocks, bs = lay->block_size;
    uint64_t nh = lay->num_kv_heads, hd = lay->head_dim;
    uint64_t b = slot / bs, o = slot % bs;
    uint64_t idx = 0;

    switch (lay->layout) {
    case KVF_GPU_LAYOUT_VLLM: /* [2][blocks][bs][heads][dim] */
        idx = (((kv * nb + b) * bs + o) * nh + h) * hd + d;
        break;
    case KVF_GPU_LAYOUT_KV: /* K, V each [blocks][bs][heads][dim] */
        idx = ((b * bs + o) * nh + h) * hd + d;
        break;
    case KVF_GPU_LAYOUT_SGLANG: /* K, V each [slots][heads][dim] */
        idx = (slot * nh + h) * hd + d;
        break;
    case KVF_GPU_LAYOUT_MLA: /* [blocks][bs][latent] */
        idx = (b * bs + o) * hd + d;
        break;
    case KVF_GPU_LAYOUT_VLLM_HND: /* [2][blocks][heads][bs][dim] */
        idx = (((kv * nb + b) * nh + h) * bs + o) * hd + d;
        break;
    case KVF_GPU_LAYOUT_FLASHINFER: /* [blocks][2][bs][heads][dim] */
        idx = (((b * 2 + kv) * bs + o) * nh + h) * hd + d;
        break;
    case KVF_GPU_LAYOUT_FLASHINFER_HND: /* [blocks][2][heads][bs][dim] */
        idx = (((b * 2 + kv) * nh + h) * bs + o) * hd + d;
        break;
    case KVF_GPU_LAYOUT_VLLM_CPU: /* [blocks][heads][2][bs][dim] */
        idx = (((b * nh + h) * 2 + kv) * bs + o) * hd + d;
        break;
    case KVF_GPU_LAYOUT_VLLM_PACKED_NHD: /* [blocks][bs][heads][2*dim] */
        idx = ((b * bs + o) * nh + h) * (2 * hd) + kv * hd + d;
        break;
    }
    return idx * c->elem;
}

/* The buffer naive_paged_off() offsets into, from @p k or @p v tables. */
static uint8_t *naive_paged_buf(const kv_case_t *c, uint8_t *const *k,
                                uint8_t *const *v, uint32_t l, uint32_t kv)
{
    return (kv_case_has_v_table(c->layout.layout) && (kv == 1)) ? v[l] : k[l];
}

static uint8_t *naive_paged_elem(const kv_case_t *c, uint32_t l, uint32_t kv,
                                 uint64_t slot, uint32_t h, uint32_t d)
{
    return naive_paged_buf(c, c->k, c->v, l, kv) +
           naive_paged_off(c, kv, slot, h, d);
}

/* Element (kv, l, t, h, d) of a KV_2LTD chunk [2|1][L][T][heads*dim]. */
static uint8_t *naive_chunk_elem(const kv_case_t *c, uint8_t *chunk,
                                 uint32_t kv, uint32_t l, uint64_t t,
                                 uint32_t h, uint32_t d)
{
    const kvf_gpu_kv_layout_t *lay = &c->layout;
    uint64_t idx = (((kv * lay->num_layers + l) * c->params.chunk_tokens + t) *
                        lay->num_kv_heads +
                    h) *
                       lay->head_dim +
                   d;

    return chunk + idx * c->elem;
}

static void naive_elem_copy(uint8_t *dst, const uint8_t *src, size_t elem)
{
    /* typed loads and stores of the dtype's width */
    switch (elem) {
    case 1:
        *dst = *src;
        break;
    case 2: {
        uint16_t v;
        memcpy(&v, src, 2);
        memcpy(dst, &v, 2);
        break;
    }
    default: {
        uint32_t v;
        memcpy(&v, src, 4);
        memcpy(dst, &v, 4);
        break;
    }
    }
}

/* The naive copy: 5 nested loops, one element at a time. */
static void naive_copy(kv_case_t *c, uint8_t *chunk, bool pack)
{
    const kvf_gpu_kv_layout_t *lay = &c->layout;
    uint32_t num_kv = (lay->layout == KVF_GPU_LAYOUT_MLA) ? 1 : 2;
    uint32_t kv, l, h, d;
    uint64_t i;
    int64_t slot;
    uint8_t *p, *q;

    for (i = 0; i < c->params.num_tokens; i++) {
        slot = c->slots[c->params.token_begin + i];
        if (slot == -1) {
            continue;
        }
        for (kv = 0; kv < num_kv; kv++) {
            for (l = c->params.layer_begin;
                 l < c->params.layer_begin + c->params.layer_count; l++) {
                for (h = 0; h < lay->num_kv_heads; h++) {
                    for (d = 0; d < lay->head_dim; d++) {
                        p = naive_paged_elem(c, l, kv, (uint64_t)slot, h, d);
                        q = naive_chunk_elem(c, chunk, kv, l,
                                             c->params.chunk_offset + i, h, d);
                        if (pack) {
                            naive_elem_copy(q, p, c->elem);
                        } else {
                            naive_elem_copy(p, q, c->elem);
                        }
                    }
                }
            }
        }
    }
}

typedef struct kv_copy_param {
    kvf_gpu_layout_t layout;
    kvf_gpu_dtype_t dtype;
    char name[32];
} kv_copy_param_t;

enum {
    KV_COPY_SEEDS = 40
};

ParameterizedTestParameters(kv_copy, cpu_matches_naive)
{
    static kv_copy_param_t params[KVF_GPU_LAYOUT_COUNT * 4];
    static const char *const dnames[] = {"fp16", "bf16", "fp32", "fp8"};
    size_t i;

    for (i = 0; i < KVF_GPU_LAYOUT_COUNT * 4; i++) {
        params[i].layout = (kvf_gpu_layout_t)(i / 4);
        params[i].dtype  = (kvf_gpu_dtype_t)(i % 4);
        snprintf(params[i].name, sizeof(params[i].name), "%s/%s",
                 kvf_gpu_layout_name(params[i].layout), dnames[i % 4]);
    }
    return cr_make_param_array(kv_copy_param_t, params,
                               KVF_GPU_LAYOUT_COUNT * 4);
}

ParameterizedTest(kv_copy_param_t *p, kv_copy, cpu_matches_naive)
{
    kv_case_t c;
    uint8_t *expect_chunk, *expect_k[KV_CASE_MAX_LAYERS] = {0};
    uint8_t *expect_v[KV_CASE_MAX_LAYERS] = {0};
    uint64_t seed, st;
    uint32_t l;

    for (seed = 1; seed <= KV_COPY_SEEDS; seed++) {
        cr_assert_eq(kv_case_create(&c, seed * 131 + p->layout * 17 + p->dtype,
                                    p->layout, p->dtype),
                     0);

        /* pack: the chunk outside the copied rows and hole rows keeps its
         * old bytes in both results */
        expect_chunk = malloc(c.chunk_bytes);
        cr_assert_not_null(expect_chunk);
        memcpy(expect_chunk, c.chunk, c.chunk_bytes);
        naive_copy(&c, expect_chunk, true);
        cr_assert_eq(kvf_gpu_kv_pack_cpu(&c.params), KVF_OK, "%s seed %lu",
                     p->name, (unsigned long)seed);
        cr_assert_eq(memcmp(expect_chunk, c.chunk, c.chunk_bytes), 0,
                     "%s seed %lu: pack differs from the naive loop", p->name,
                     (unsigned long)seed);

        /* unpack fresh random chunk bytes back: naive on a copy of the
         * cache (the naive loop writes through c.k/c.v, so swap) */
        st = seed;
        kv_case_fill(&st, c.chunk, c.chunk_bytes);
        for (l = 0; l < c.layout.num_layers; l++) {
            expect_k[l] = malloc(c.layer_bytes);
            cr_assert_not_null(expect_k[l]);
            memcpy(expect_k[l], c.k[l], c.layer_bytes);
            if (c.v[l] != NULL) {
                expect_v[l] = malloc(c.region);
                cr_assert_not_null(expect_v[l]);
                memcpy(expect_v[l], c.v[l], c.region);
            }
        }
        cr_assert_eq(kvf_gpu_kv_unpack_cpu(&c.params), KVF_OK);
        for (l = 0; l < c.layout.num_layers; l++) { /* naive into expect_* */
            uint8_t *tk = c.k[l], *tv = c.v[l];

            c.k[l]      = expect_k[l];
            c.v[l]      = expect_v[l];
            expect_k[l] = tk;
            expect_v[l] = tv;
        }
        naive_copy(&c, c.chunk, false);
        for (l = 0; l < c.layout.num_layers; l++) {
            /* now c.k = naive result, expect_k = implementation result */
            cr_assert_eq(memcmp(c.k[l], expect_k[l], c.layer_bytes), 0,
                         "%s seed %lu layer %u: unpack K differs", p->name,
                         (unsigned long)seed, l);
            if (c.v[l] != NULL) {
                cr_assert_eq(memcmp(c.v[l], expect_v[l], c.region), 0,
                             "%s seed %lu layer %u: unpack V differs", p->name,
                             (unsigned long)seed, l);
            }
            free(expect_k[l]);
            free(expect_v[l]);
            expect_k[l] = expect_v[l] = NULL;
        }
        free(expect_chunk);
        kv_case_destroy(&c);
    }
}

/* Copies of 4 MiB and more take the streaming-store path: a Llama-shaped
 * chunk (2 KiB rows, 256 tokens, 4 layers = 4 MiB) and an odd-row one (not
 * 16-byte multiples: the memcpy fallback inside the streaming run). */
Test(kv_copy, big_chunks_match_naive)
{
    static const kv_case_shape_t shapes[] = {
        {.layers     = 4,
         .heads      = 8,
         .head_dim   = 128,
         .block_size = 16,
         .tokens     = 256},
        {.layers     = 5,
         .heads      = 3,
         .head_dim   = 333,
         .block_size = 7,
         .tokens     = 700},
    };
    kv_case_t c;
    uint8_t *expect, *k0;
    size_t i;

    for (i = 0; i < 2; i++) {
        cr_assert_eq(kv_case_create_shape(&c, 1000 + i, KVF_GPU_LAYOUT_VLLM,
                                          KVF_GPU_DTYPE_BF16, &shapes[i]),
                     0);
        cr_assert_geq(c.chunk_bytes, 4u << 20);
        expect = malloc(c.chunk_bytes);
        memcpy(expect, c.chunk, c.chunk_bytes);
        naive_copy(&c, expect, true);
        cr_assert_eq(kvf_gpu_kv_pack_cpu(&c.params), KVF_OK);
        cr_assert_eq(memcmp(expect, c.chunk, c.chunk_bytes), 0,
                     "shape %zu: pack", i);
        /* unpack a changed chunk; naive into a copy of layer 0 */
        memset(c.chunk, 0x3c, c.chunk_bytes / 2);
        k0 = malloc(c.layer_bytes);
        memcpy(k0, c.k[0], c.layer_bytes);
        cr_assert_eq(kvf_gpu_kv_unpack_cpu(&c.params), KVF_OK);
        free(expect);
        expect = c.k[0];
        c.k[0] = k0;
        naive_copy(&c, c.chunk, false);
        cr_assert_eq(memcmp(expect, c.k[0], c.layer_bytes), 0,
                     "shape %zu: unpack", i);
        free(expect);
        kv_case_destroy(&c);
    }
}

/* A whole sequence packed chunk by chunk (last one partial, stored compact
 * with chunk_tokens = remainder) and unpacked into a zeroed cache gives back
 * exactly the mapped rows; hole rows stay zero. */
Test(kv_copy, sequence_round_trip_with_partial_last_chunk)
{
    kv_case_t c;
    uint8_t *orig_k[KV_CASE_MAX_LAYERS], *orig_v[KV_CASE_MAX_LAYERS];
    uint64_t seed, begin, chunk_size = 5;
    uint32_t l, k;
    size_t bytes;

    for (k = 0; k < KVF_GPU_LAYOUT_COUNT; k++) {
        for (seed = 1; seed <= 10; seed++) {
            cr_assert_eq(kv_case_create(&c, seed * 7 + k, (kvf_gpu_layout_t)k,
                                        (kvf_gpu_dtype_t)(seed % 4)),
                         0);
            for (l = 0; l < c.layout.num_layers; l++) {
                orig_k[l] = malloc(c.layer_bytes);
                memcpy(orig_k[l], c.k[l], c.layer_bytes);
                orig_v[l] = NULL;
                if (c.v[l] != NULL) {
                    orig_v[l] = malloc(c.region);
                    memcpy(orig_v[l], c.v[l], c.region);
                }
            }
            for (begin = 0; begin < c.slots_len; begin += chunk_size) {
                kvf_gpu_kv_copy_params_t p = c.params;

                p.layer_begin = 0; /* the whole chunk: every layer */
                p.layer_count = c.layout.num_layers;
                for (l = 0; l < c.layout.num_layers; l++) {
                    memcpy(c.k[l], orig_k[l], c.layer_bytes);
                    if (c.v[l] != NULL) {
                        memcpy(c.v[l], orig_v[l], c.region);
                    }
                }
                p.token_begin  = begin;
                p.num_tokens   = (c.slots_len - begin < chunk_size)
                                     ? c.slots_len - begin
                                     : chunk_size;
                p.chunk_tokens = p.num_tokens;
                p.chunk_offset = 0;
                cr_assert_eq(
                    kvf_gpu_kv_chunk_bytes(&c.layout, p.num_tokens, &bytes),
                    KVF_OK);
                p.chunk = malloc(bytes);
                cr_assert_eq(kvf_gpu_kv_pack_cpu(&p), KVF_OK);
                for (l = 0; l < c.layout.num_layers; l++) {
                    memset(c.k[l], 0, c.layer_bytes);
                    if (c.v[l] != NULL) {
                        memset(c.v[l], 0, c.region);
                    }
                }
                cr_assert_eq(kvf_gpu_kv_unpack_cpu(&p), KVF_OK);
                /* every mapped element is back, everything else zero */
                for (l = 0; l < c.layout.num_layers; l++) {
                    uint64_t t, off;
                    uint32_t kv, h, d;

                    for (kv = 0; kv < 2; kv++) {
                        uint8_t *now = naive_paged_buf(&c, c.k, c.v, l, kv);
                        uint8_t *was =
                            naive_paged_buf(&c, orig_k, orig_v, l, kv);

                        if ((c.layout.layout == KVF_GPU_LAYOUT_MLA) &&
                            (kv == 1)) {
                            continue;
                        }
                        for (t = begin; t < begin + p.num_tokens; t++) {
                            int64_t s = c.slots[t];

                            if (s < 0) {
                                continue;
                            }
                            for (h = 0; h < c.layout.num_kv_heads; h++) {
                                for (d = 0; d < c.layout.head_dim; d++) {
                                    off = naive_paged_off(&c, kv, (uint64_t)s,
                                                          h, d);
                                    cr_assert_eq(
                                        memcmp(now + off, was + off, c.elem), 0,
                                        "layout %u seed %lu token %lu", k,
                                        (unsigned long)seed, (unsigned long)t);
                                    memset(now + off, 0, c.elem);
                                }
                            }
                        }
                    }
                    for (bytes = 0; bytes < c.layer_bytes; bytes++) {
                        cr_assert_eq(c.k[l][bytes], 0, "stray K byte");
                    }
                    for (bytes = 0; (c.v[l] != NULL) && (bytes < c.region);
                         bytes++) {
                        cr_assert_eq(c.v[l][bytes], 0, "stray V byte");
                    }
                }
                free(p.chunk);
            }
            for (l = 0; l < c.layout.num_layers; l++) {
                free(orig_k[l]);
                free(orig_v[l]);
            }
            kv_case_destroy(&c);
        }
    }
}

/* ---- argument checks: each returns its status and writes nothing ---- */

static kv_case_t g_case;
static uint8_t *g_chunk_copy;

static void kv_err_setup(void)
{
    cr_assert_eq(
        kv_case_create(&g_case, 99, KVF_GPU_LAYOUT_KV, KVF_GPU_DTYPE_BF16), 0);
    g_chunk_copy = malloc(g_case.chunk_bytes);
    memcpy(g_chunk_copy, g_case.chunk, g_case.chunk_bytes);
    kvf_test_log_capture_start();
}

static void kv_err_teardown(void)
{
    kvf_test_log_capture_stop();
    free(g_chunk_copy);
    kv_case_destroy(&g_case);
    kvf_test_check_leaks();
}

TestSuite(kv_copy_err, .init = kv_err_setup, .fini = kv_err_teardown,
          .timeout = 10);

/* Both directions fail with @p want, log @p log, and leave the chunk. */
static void expect_fail(const kvf_gpu_kv_copy_params_t *p, kvf_status_t want,
                        const char *log)
{
    cr_assert_eq(kvf_gpu_kv_pack_cpu(p), want);
    cr_assert_eq(kvf_gpu_kv_unpack_cpu(p), want);
    cr_assert_eq(kvf_gpu_kv_pack_cuda(p, NULL), want);
    cr_assert_eq(kvf_gpu_kv_unpack_cuda(p, NULL), want);
    cr_assert(kvf_test_log_contains(log), "log lacks '%s': %s", log,
              kvf_test_log_text());
    cr_assert_eq(memcmp(g_case.chunk, g_chunk_copy, g_case.chunk_bytes), 0);
}

Test(kv_copy_err, null_params)
{
    expect_fail(NULL, KVF_ERR_INVALID, "NULL params");
}

Test(kv_copy_err, missing_required_field)
{
    kvf_gpu_kv_copy_params_t p = g_case.params;

    p.field_mask &= ~(uint64_t)KVF_GPU_KV_COPY_FIELD_NUM_TOKENS;
    expect_fail(&p, KVF_ERR_INVALID, "required fields missing");
}

Test(kv_copy_err, null_pointers)
{
    kvf_gpu_kv_copy_params_t p = g_case.params;
    void *tab[KV_CASE_MAX_LAYERS];

    p.k_layers = NULL;
    expect_fail(&p, KVF_ERR_INVALID, "NULL k_layers");
    p              = g_case.params;
    p.slot_mapping = NULL;
    expect_fail(&p, KVF_ERR_INVALID, "NULL slot_mapping");
    p       = g_case.params;
    p.chunk = NULL;
    expect_fail(&p, KVF_ERR_INVALID, "NULL chunk");
    p        = g_case.params;
    p.layout = NULL;
    expect_fail(&p, KVF_ERR_INVALID, "kv layout: NULL");
    p          = g_case.params;
    p.v_layers = NULL;
    expect_fail(&p, KVF_ERR_INVALID, "needs v_layers");
    p = g_case.params;
    p.field_mask &= ~(uint64_t)KVF_GPU_KV_COPY_FIELD_V_LAYERS;
    expect_fail(&p, KVF_ERR_INVALID, "needs v_layers");
    memcpy(tab, g_case.k_tab, sizeof(tab));
    tab[g_case.layout.num_layers - 1] = NULL;
    p                                 = g_case.params;
    p.k_layers                        = tab;
    expect_fail(&p, KVF_ERR_INVALID, "is NULL");
    p          = g_case.params;
    p.v_layers = tab;
    expect_fail(&p, KVF_ERR_INVALID, "is NULL");
}

Test(kv_copy_err, zero_sizes)
{
    kvf_gpu_kv_copy_params_t p = g_case.params;

    p.num_tokens = 0;
    expect_fail(&p, KVF_ERR_INVALID, "zero size");
    p              = g_case.params;
    p.chunk_tokens = 0;
    expect_fail(&p, KVF_ERR_INVALID, "zero size");
}

Test(kv_copy_err, token_range_past_slot_mapping)
{
    kvf_gpu_kv_copy_params_t p = g_case.params;

    p.token_begin = g_case.slots_len - p.num_tokens + 1;
    expect_fail(&p, KVF_ERR_RANGE, "past slot mapping");
    p.token_begin = UINT64_MAX; /* begin + num overflows */
    expect_fail(&p, KVF_ERR_RANGE, "past slot mapping");
}

Test(kv_copy_err, token_range_past_chunk_capacity)
{
    kvf_gpu_kv_copy_params_t p = g_case.params;

    p.chunk_offset = p.chunk_tokens - p.num_tokens + 1;
    expect_fail(&p, KVF_ERR_RANGE, "past chunk capacity");
    p.chunk_offset = UINT64_MAX;
    expect_fail(&p, KVF_ERR_RANGE, "past chunk capacity");
}

/* One bad slot anywhere in the range fails the call before any byte
 * moves: the chunk (pack) and the cache (unpack) stay as they were. */
Test(kv_copy_err, slot_out_of_range)
{
    kvf_gpu_kv_copy_params_t p = g_case.params;
    uint8_t *k0                = malloc(g_case.layer_bytes);
    uint64_t last              = p.token_begin + p.num_tokens - 1;
    int64_t saved              = g_case.slots[last];

    memcpy(k0, g_case.k[0], g_case.layer_bytes);
    g_case.slots[last] = (int64_t)g_case.num_slots;
    cr_assert_eq(kvf_gpu_kv_pack_cpu(&p), KVF_ERR_RANGE);
    cr_assert_eq(kvf_gpu_kv_unpack_cpu(&p), KVF_ERR_RANGE);
    cr_assert(kvf_test_log_contains("outside -1.."));
    g_case.slots[last] = -2;
    cr_assert_eq(kvf_gpu_kv_pack_cpu(&p), KVF_ERR_RANGE);
    cr_assert_eq(kvf_gpu_kv_unpack_cpu(&p), KVF_ERR_RANGE);
    cr_assert_eq(memcmp(g_case.chunk, g_chunk_copy, g_case.chunk_bytes), 0);
    cr_assert_eq(memcmp(g_case.k[0], k0, g_case.layer_bytes), 0);
    g_case.slots[last] = saved;
    /* the slot just past the range is not looked at */
    if (last + 1 < g_case.slots_len) {
        g_case.slots[last + 1] = INT64_MAX;
        cr_assert_eq(kvf_gpu_kv_pack_cpu(&p), KVF_OK);
    }
    free(k0);
}

Test(kv_copy_err, bad_layouts)
{
    kvf_gpu_kv_copy_params_t p = g_case.params;
    kvf_gpu_kv_layout_t lay;

    p.layout = &lay;
    lay      = g_case.layout;
    lay.field_mask &= ~(uint64_t)KVF_GPU_KV_LAYOUT_FIELD_HEAD_DIM;
    expect_fail(&p, KVF_ERR_INVALID, "required fields missing");
    lay        = g_case.layout;
    lay.layout = (kvf_gpu_layout_t)KVF_GPU_LAYOUT_COUNT;
    expect_fail(&p, KVF_ERR_INVALID, "unknown layout 9");
    lay.layout = (kvf_gpu_layout_t)-1;
    expect_fail(&p, KVF_ERR_INVALID, "unknown layout -1");
    lay       = g_case.layout;
    lay.dtype = (kvf_gpu_dtype_t)9;
    expect_fail(&p, KVF_ERR_INVALID, "unknown dtype 9");
    lay            = g_case.layout;
    lay.num_layers = 0;
    expect_fail(&p, KVF_ERR_INVALID, "0 layers");
    lay.num_layers = KVF_GPU_MAX_LAYERS + 1;
    expect_fail(&p, KVF_ERR_INVALID, "257 layers");
    lay = g_case.layout;
    lay.field_mask &= ~(uint64_t)KVF_GPU_KV_LAYOUT_FIELD_NUM_KV_HEADS;
    expect_fail(&p, KVF_ERR_INVALID, "num_kv_heads missing");
    lay              = g_case.layout;
    lay.num_kv_heads = 0;
    expect_fail(&p, KVF_ERR_INVALID, "0 kv heads");
    lay          = g_case.layout;
    lay.head_dim = 0;
    expect_fail(&p, KVF_ERR_INVALID, "zero size");
    lay            = g_case.layout;
    lay.block_size = 0;
    expect_fail(&p, KVF_ERR_INVALID, "zero size");
    lay            = g_case.layout;
    lay.num_blocks = 0;
    expect_fail(&p, KVF_ERR_INVALID, "zero size");
    lay            = g_case.layout;
    lay.num_blocks = UINT64_MAX / 2;
    expect_fail(&p, KVF_ERR_TOO_BIG, "cache size overflows");
    /* MLA: one latent vector per token */
    lay              = g_case.layout;
    lay.layout       = KVF_GPU_LAYOUT_MLA;
    lay.num_kv_heads = 2;
    expect_fail(&p, KVF_ERR_INVALID, "MLA needs 1");
}

/* Every layout has a distinct name that parses back; '-' works for '_';
 * the alias of the older vLLM CPU layout; unknown names are refused. */
Test(kv_copy_err, layout_names_round_trip)
{
    kvf_gpu_layout_t got;
    const char *name;
    int i, j;

    for (i = 0; i < KVF_GPU_LAYOUT_COUNT; i++) {
        name = kvf_gpu_layout_name((kvf_gpu_layout_t)i);
        cr_assert_not_null(name, "layout %d", i);
        cr_assert_eq(kvf_gpu_layout_from_name(name, &got), KVF_OK, "%s", name);
        cr_assert_eq((int)got, i, "%s", name);
        for (j = 0; j < i; j++) {
            cr_assert_str_neq(name, kvf_gpu_layout_name((kvf_gpu_layout_t)j));
        }
    }
    cr_assert_eq(kvf_gpu_layout_from_name("flashinfer-hnd", &got), KVF_OK);
    cr_assert_eq(got, KVF_GPU_LAYOUT_FLASHINFER_HND);
    cr_assert_eq(kvf_gpu_layout_from_name("vllm_cpu_split", &got), KVF_OK);
    cr_assert_eq(got, KVF_GPU_LAYOUT_VLLM_HND);
    got = KVF_GPU_LAYOUT_KV;
    cr_assert_eq(kvf_gpu_layout_from_name("vllm_", &got), KVF_ERR_INVALID);
    cr_assert_eq(kvf_gpu_layout_from_name("", &got), KVF_ERR_INVALID);
    cr_assert_eq(kvf_gpu_layout_from_name(NULL, &got), KVF_ERR_INVALID);
    cr_assert_eq(kvf_gpu_layout_from_name("vllm", NULL), KVF_ERR_INVALID);
    cr_assert_eq(got, KVF_GPU_LAYOUT_KV, "written on failure");
    cr_assert_null(kvf_gpu_layout_name((kvf_gpu_layout_t)KVF_GPU_LAYOUT_COUNT));
    cr_assert_null(kvf_gpu_layout_name((kvf_gpu_layout_t)-1));
}

Test(kv_copy_err, sizes_helpers)
{
    kvf_gpu_kv_layout_t lay = g_case.layout;
    size_t n;

    cr_assert_eq(kvf_gpu_kv_row_bytes(&lay, &n), KVF_OK);
    cr_assert_eq(n, g_case.row);
    cr_assert_eq(kvf_gpu_kv_row_bytes(&lay, NULL), KVF_ERR_INVALID);
    cr_assert_eq(kvf_gpu_kv_row_bytes(NULL, &n), KVF_ERR_INVALID);
    cr_assert_eq(kvf_gpu_kv_chunk_bytes(&lay, 3, &n), KVF_OK);
    cr_assert_eq(n, 2 * lay.num_layers * 3 * g_case.row);
    cr_assert_eq(kvf_gpu_kv_chunk_bytes(&lay, 0, &n), KVF_ERR_INVALID);
    cr_assert_eq(kvf_gpu_kv_chunk_bytes(&lay, 3, NULL), KVF_ERR_INVALID);
    cr_assert_eq(kvf_gpu_kv_chunk_bytes(&lay, UINT64_MAX / 4, &n),
                 KVF_ERR_TOO_BIG);
    cr_assert_eq(kvf_gpu_kv_layout_check(NULL), KVF_ERR_INVALID);
    /* MLA: heads optional, chunk has one plane */
    lay.layout = KVF_GPU_LAYOUT_MLA;
    lay.field_mask &= ~(uint64_t)KVF_GPU_KV_LAYOUT_FIELD_NUM_KV_HEADS;
    cr_assert_eq(kvf_gpu_kv_row_bytes(&lay, &n), KVF_OK);
    cr_assert_eq(n, (size_t)lay.head_dim * 2);
    cr_assert_eq(kvf_gpu_kv_chunk_bytes(&lay, 3, &n), KVF_OK);
    cr_assert_eq(n, lay.num_layers * 3 * (size_t)lay.head_dim * 2);
}

/* vLLM and MLA take no V table: a NULL one is fine there */
Test(kv_copy_err, v_layers_ignored_where_unused)
{
    kv_case_t c;

    cr_assert_eq(kv_case_create(&c, 5, KVF_GPU_LAYOUT_VLLM, KVF_GPU_DTYPE_FP8),
                 0);
    c.params.v_layers = NULL;
    c.params.field_mask &= ~(uint64_t)KVF_GPU_KV_COPY_FIELD_V_LAYERS;
    cr_assert_eq(kvf_gpu_kv_pack_cpu(&c.params), KVF_OK);
    /* token_begin and chunk_offset default to 0 when not set */
    c.params.field_mask &= ~(uint64_t)(KVF_GPU_KV_COPY_FIELD_TOKEN_BEGIN |
                                       KVF_GPU_KV_COPY_FIELD_CHUNK_OFFSET);
    c.params.token_begin  = UINT64_MAX;
    c.params.chunk_offset = UINT64_MAX;
    cr_assert_eq(kvf_gpu_kv_unpack_cpu(&c.params), KVF_OK);
    kv_case_destroy(&c);
}

Test(kv_copy_err, layer_group_out_of_range)
{
    kvf_gpu_kv_copy_params_t p = g_case.params;
    uint32_t L                 = g_case.layout.num_layers;

    p.field_mask |=
        KVF_GPU_KV_COPY_FIELD_LAYER_BEGIN | KVF_GPU_KV_COPY_FIELD_LAYER_COUNT;
    p.layer_begin = L;
    p.layer_count = 1;
    expect_fail(&p, KVF_ERR_RANGE, "past");
    p.layer_begin = 0;
    p.layer_count = 0;
    expect_fail(&p, KVF_ERR_RANGE, "outside 1..");
    p.layer_count = L + 1;
    expect_fail(&p, KVF_ERR_RANGE, "outside 1..");
    p.layer_begin = L - 1;
    p.layer_count = 2;
    expect_fail(&p, KVF_ERR_RANGE, "outside 1..");
    p.layer_begin = UINT32_MAX;
    p.layer_count = UINT32_MAX;
    expect_fail(&p, KVF_ERR_RANGE, "past");
}

/* Only the copied group's table entries are read: others may be NULL, and
 * the chunk's other layers keep their bytes. */
Test(kv_copy_err, layer_group_reads_only_its_tables)
{
    kvf_gpu_kv_copy_params_t p  = g_case.params;
    void *k[KV_CASE_MAX_LAYERS] = {0}, *v[KV_CASE_MAX_LAYERS] = {0};
    uint32_t last   = g_case.layout.num_layers - 1;
    size_t plane    = g_case.layout.num_layers * p.chunk_tokens * g_case.row;
    size_t layer_sz = p.chunk_tokens * g_case.row;

    k[last]    = g_case.k_tab[last];
    v[last]    = g_case.v_tab[last];
    p.k_layers = k;
    p.v_layers = v;
    p.field_mask |= KVF_GPU_KV_COPY_FIELD_LAYER_BEGIN;
    p.field_mask &= ~(uint64_t)KVF_GPU_KV_COPY_FIELD_LAYER_COUNT;
    p.layer_begin = last; /* count defaults to the rest: one layer */
    cr_assert_eq(kvf_gpu_kv_pack_cpu(&p), KVF_OK);
    /* K and V planes: layers before `last` untouched */
    cr_assert_eq(memcmp(g_case.chunk, g_chunk_copy, last * layer_sz), 0);
    cr_assert_eq(
        memcmp(g_case.chunk + plane, g_chunk_copy + plane, last * layer_sz), 0);
}
