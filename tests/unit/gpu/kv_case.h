/* SPDX-License-Identifier: Apache-2.0 */
/* Copyright (c) 2026 The kvfabric authors */
/*
 * Random paged-KV copy cases shared by the CPU reference tests (unit) and
 * the GPU-vs-CPU tests (tests/gpu): a layout, per-layer host buffers filled
 * with random bytes, a slot mapping of distinct slots with -1 holes, a token
 * range and a chunk, all derived from one seed.
 */
#ifndef KVF_TESTS_UNIT_GPU_KV_CASE_H
#define KVF_TESTS_UNIT_GPU_KV_CASE_H

#include <kvfabric/gpu.h>

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

enum {
    KV_CASE_MAX_LAYERS = 6
};

typedef struct kv_case {
    kvf_gpu_kv_layout_t layout;
    size_t elem;        /* dtype size */
    size_t row;         /* heads * dim * elem */
    size_t region;      /* bytes of one K (or V) region of one layer */
    size_t layer_bytes; /* bytes per k buffer (2 regions: one-tensor kinds) */
    size_t chunk_bytes;
    uint64_t num_slots;
    uint8_t *k[KV_CASE_MAX_LAYERS];
    uint8_t *v[KV_CASE_MAX_LAYERS]; /* kv_case_has_v_table() only */
    void *k_tab[KV_CASE_MAX_LAYERS];
    void *v_tab[KV_CASE_MAX_LAYERS];
    int64_t *slots;
    uint64_t slots_len;
    uint8_t *chunk;
    kvf_gpu_kv_copy_params_t params;
} kv_case_t;

static inline uint64_t kv_case_rand(uint64_t *state)
{
    uint64_t z = (*state += 0x9e3779b97f4a7c15ull);

    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* uniform in [lo, hi] */
static inline uint64_t kv_case_range(uint64_t *state, uint64_t lo, uint64_t hi)
{
    return lo + kv_case_rand(state) % (hi - lo + 1);
}

static inline void kv_case_fill(uint64_t *state, uint8_t *p, size_t n)
{
    size_t i;

    for (i = 0; i < n; i++) {
        p[i] = (uint8_t)kv_case_rand(state);
    }
}

static inline size_t kv_case_dtype_size(kvf_gpu_dtype_t dtype)
{
    return (dtype == KVF_GPU_DTYPE_FP32)  ? 4
           : (dtype == KVF_GPU_DTYPE_FP8) ? 1
                                          : 2;
}

/* Layouts with separate K and V tables (the others keep K and V in one
 * tensor per layer, or have only K: MLA). */
static inline int kv_case_has_v_table(kvf_gpu_layout_t kind)
{
    return (kind == KVF_GPU_LAYOUT_KV) || (kind == KVF_GPU_LAYOUT_SGLANG);
}

/* Layouts whose one tensor per layer holds both K and V. */
static inline int kv_case_is_one_tensor(kvf_gpu_layout_t kind)
{
    return (kind != KVF_GPU_LAYOUT_MLA) && !kv_case_has_v_table(kind);
}

/* A fixed shape instead of a random one (big cases: streaming paths). */
typedef struct kv_case_shape {
    uint32_t layers, heads, head_dim, block_size;
    uint64_t tokens; /* slot mapping length = chunk tokens = tokens copied */
} kv_case_shape_t;

/* Builds a random case (random shape when @p shape is NULL); returns 0, or
 * -1 when out of memory (kv_case_destroy() then frees what was built). */
static inline int kv_case_create_shape(kv_case_t *c, uint64_t seed,
                                       kvf_gpu_layout_t kind,
                                       kvf_gpu_dtype_t dtype,
                                       const kv_case_shape_t *shape)
{
    static const uint32_t block_sizes[] = {1, 2, 3, 4, 5, 8, 16};
    uint64_t st = seed * 0x2545f4914f6cdd1dull + 1, begin, num, t, i;
    uint64_t *perm;
    uint32_t l, heads;

    memset(c, 0, sizeof(*c));
    heads =
        (kind == KVF_GPU_LAYOUT_MLA) ? 1 : (uint32_t)kv_case_range(&st, 1, 4);
    c->layout = (kvf_gpu_kv_layout_t){
        .field_mask = KVF_GPU_KV_LAYOUT_FIELD_LAYOUT |
                      KVF_GPU_KV_LAYOUT_FIELD_DTYPE |
                      KVF_GPU_KV_LAYOUT_FIELD_NUM_LAYERS |
                      KVF_GPU_KV_LAYOUT_FIELD_NUM_KV_HEADS |
                      KVF_GPU_KV_LAYOUT_FIELD_HEAD_DIM |
                      KVF_GPU_KV_LAYOUT_FIELD_BLOCK_SIZE |
                      KVF_GPU_KV_LAYOUT_FIELD_NUM_BLOCKS,
        .layout       = kind,
        .dtype        = dtype,
        .num_layers   = (uint32_t)kv_case_range(&st, 1, KV_CASE_MAX_LAYERS),
        .num_kv_heads = heads,
        /* odd dims too, so rows of every alignment occur */
        .head_dim   = (uint32_t)kv_case_range(&st, 1, 40),
        .block_size = (kind == KVF_GPU_LAYOUT_SGLANG)
                          ? 1
                          : block_sizes[kv_case_range(&st, 0, 6)],
    };
    c->slots_len = kv_case_range(&st, 1, 64);
    if (shape != NULL) {
        c->layout.num_layers = shape->layers;
        c->layout.num_kv_heads =
            (kind == KVF_GPU_LAYOUT_MLA) ? 1 : shape->heads;
        c->layout.head_dim = shape->head_dim;
        c->layout.block_size =
            (kind == KVF_GPU_LAYOUT_SGLANG) ? 1 : shape->block_size;
        c->slots_len = shape->tokens;
        heads        = c->layout.num_kv_heads;
    }
    c->layout.num_blocks =
        (c->slots_len + c->layout.block_size - 1) / c->layout.block_size +
        kv_case_range(&st, 0, 3);
    c->elem        = kv_case_dtype_size(dtype);
    c->row         = heads * c->layout.head_dim * c->elem;
    c->num_slots   = c->layout.num_blocks * c->layout.block_size;
    c->region      = c->num_slots * c->row;
    c->layer_bytes = kv_case_is_one_tensor(kind) ? 2 * c->region : c->region;

    for (l = 0; l < c->layout.num_layers; l++) {
        c->k[l] = malloc(c->layer_bytes);
        if (c->k[l] == NULL) {
            return -1;
        }
        kv_case_fill(&st, c->k[l], c->layer_bytes);
        c->k_tab[l] = c->k[l];
        if (kv_case_has_v_table(kind)) {
            c->v[l] = malloc(c->region);
            if (c->v[l] == NULL) {
                return -1;
            }
            kv_case_fill(&st, c->v[l], c->region);
            c->v_tab[l] = c->v[l];
        }
    }

    /* distinct slots (a random permutation prefix) with ~20 % holes */
    perm     = malloc(c->num_slots * sizeof(*perm));
    c->slots = malloc(c->slots_len * sizeof(*c->slots));
    if ((perm == NULL) || (c->slots == NULL)) {
        free(perm);
        return -1;
    }
    for (i = 0; i < c->num_slots; i++) {
        perm[i] = i;
    }
    for (i = c->num_slots - 1; i > 0; i--) {
        uint64_t j   = kv_case_range(&st, 0, i);
        uint64_t tmp = perm[i];

        perm[i] = perm[j];
        perm[j] = tmp;
    }
    for (t = 0; t < c->slots_len; t++) {
        c->slots[t] = (kv_case_range(&st, 0, 4) == 0) ? -1 : (int64_t)perm[t];
    }
    free(perm);

    c->params.chunk_tokens = kv_case_range(&st, 1, 24);
    begin                  = kv_case_range(&st, 0, c->slots_len - 1);
    num                    = c->slots_len - begin;
    if (num > c->params.chunk_tokens) {
        num = c->params.chunk_tokens;
    }
    num = kv_case_range(&st, 1, num);
    if (shape != NULL) {
        c->params.chunk_tokens = shape->tokens;
        begin                  = 0;
        num                    = shape->tokens;
    }
    c->params.field_mask =
        KVF_GPU_KV_COPY_FIELD_LAYOUT | KVF_GPU_KV_COPY_FIELD_K_LAYERS |
        KVF_GPU_KV_COPY_FIELD_V_LAYERS | KVF_GPU_KV_COPY_FIELD_SLOT_MAPPING |
        KVF_GPU_KV_COPY_FIELD_SLOT_MAPPING_LEN |
        KVF_GPU_KV_COPY_FIELD_TOKEN_BEGIN | KVF_GPU_KV_COPY_FIELD_NUM_TOKENS |
        KVF_GPU_KV_COPY_FIELD_CHUNK | KVF_GPU_KV_COPY_FIELD_CHUNK_TOKENS |
        KVF_GPU_KV_COPY_FIELD_CHUNK_OFFSET;
    c->params.layout           = &c->layout;
    c->params.k_layers         = c->k_tab;
    c->params.v_layers         = c->v_tab;
    c->params.slot_mapping     = c->slots;
    c->params.slot_mapping_len = c->slots_len;
    c->params.token_begin      = begin;
    c->params.num_tokens       = num;
    c->params.chunk_offset =
        kv_case_range(&st, 0, c->params.chunk_tokens - num);
    /* a layer group half the time (always set: the naive loop reads it) */
    c->params.field_mask |=
        KVF_GPU_KV_COPY_FIELD_LAYER_BEGIN | KVF_GPU_KV_COPY_FIELD_LAYER_COUNT;
    c->params.layer_begin = 0;
    c->params.layer_count = c->layout.num_layers;
    if ((shape == NULL) && (kv_case_range(&st, 0, 1) == 0)) {
        c->params.layer_begin =
            (uint32_t)kv_case_range(&st, 0, c->layout.num_layers - 1);
        c->params.layer_count = (uint32_t)kv_case_range(
            &st, 1, c->layout.num_layers - c->params.layer_begin);
    }
    c->chunk_bytes = ((kind == KVF_GPU_LAYOUT_MLA) ? 1 : 2) *
                     c->layout.num_layers * c->params.chunk_tokens * c->row;
    c->chunk = malloc(c->chunk_bytes);
    if (c->chunk == NULL) {
        return -1;
    }
    kv_case_fill(&st, c->chunk, c->chunk_bytes);
    c->params.chunk = c->chunk;
    return 0;
}

static inline int kv_case_create(kv_case_t *c, uint64_t seed,
                                 kvf_gpu_layout_t kind, kvf_gpu_dtype_t dtype)
{
    return kv_case_create_shape(c, seed, kind, dtype, NULL);
}

static inline void kv_case_destroy(kv_case_t *c)
{
    uint32_t l;

    for (l = 0; l < KV_CASE_MAX_LAYERS; l++) {
        free(c->k[l]);
        free(c->v[l]);
    }
    free(c->slots);
    free(c->chunk);
    memset(c, 0, sizeof(*c));
}

#endif /* KVF_TESTS_UNIT_GPU_KV_CASE_H */
