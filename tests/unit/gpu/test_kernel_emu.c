/* SPDX-License-Identifier: Apache-2.0 */
/* Copyright (c) 2026 The kvfabric authors */
/*
 * The CUDA kernel's per-token code (gpu/kv_copy_row.h, the same source nvcc
 * compiles) run on the host over the kernel's whole grid: every token,
 * layer, K/V and each of 32 lanes. Equal to the CPU path on random cases
 * with bases shifted by 0..15 bytes, so the 16/8/4/2/1-byte widths and the
 * kernel's indexing are checked on machines without a GPU.
 */
#include "gpu/kv_copy_row.h"
#include "tests/helpers/test_helpers.h"
#include "tests/unit/gpu/kv_case.h"

#include <criterion/criterion.h>

TestSuite(kernel_emu, .fini = kvf_test_check_leaks, .timeout = 60);

typedef struct emu_case {
    uint8_t *k_alloc[KV_CASE_MAX_LAYERS], *v_alloc[KV_CASE_MAX_LAYERS];
    void *k_tab[KV_CASE_MAX_LAYERS], *v_tab[KV_CASE_MAX_LAYERS];
    uint8_t *chunk_alloc, *chunk;
    kvf_gpu_kv_copy_params_t params;
} emu_case_t;

static uint8_t *emu_copy(const uint8_t *src, size_t len, size_t shift,
                         uint8_t **alloc_p)
{
    uint8_t *p = malloc(len + 16);

    cr_assert_not_null(p);
    *alloc_p = p;
    memcpy(p + shift, src, len);
    return p + shift;
}

/* Copies of the case's buffers at @p shift bytes past 16-byte alignment. */
static void emu_case_create(emu_case_t *e, const kv_case_t *c, size_t shift)
{
    uint32_t l;

    memset(e, 0, sizeof(*e));
    for (l = 0; l < c->layout.num_layers; l++) {
        e->k_tab[l] = emu_copy(c->k[l], c->layer_bytes, shift, &e->k_alloc[l]);
        if (c->v[l] != NULL) {
            e->v_tab[l] =
                emu_copy(c->v[l], c->region, (shift * 3) % 16, &e->v_alloc[l]);
        }
    }
    e->chunk =
        emu_copy(c->chunk, c->chunk_bytes, (shift * 5) % 16, &e->chunk_alloc);
    e->params          = c->params;
    e->params.k_layers = e->k_tab;
    e->params.v_layers = e->v_tab;
    e->params.chunk    = e->chunk;
}

static void emu_case_destroy(emu_case_t *e)
{
    uint32_t l;

    for (l = 0; l < KV_CASE_MAX_LAYERS; l++) {
        free(e->k_alloc[l]);
        free(e->v_alloc[l]);
    }
    free(e->chunk_alloc);
}

/* The kernel's grid, one lane at a time, lanes of a warp in reverse. */
static void emu_launch(const kvf_gpu_kv_copy_params_t *params,
                       kvf_gpu_dir_t dir)
{
    kvf_gpu_kv_plan_t plan;
    uint64_t t;
    uint32_t l, kv;
    int lane;

    cr_assert_eq(kvf_gpu_kv_plan_init(params, &plan), KVF_OK);
    for (kv = 0; kv < plan.num_kv; kv++) {
        for (l = plan.layer_begin; l < plan.layer_begin + plan.layer_count;
             l++) {
            for (t = 0; t < plan.num_tokens; t++) {
                for (lane = 31; lane >= 0; lane--) {
                    kvf_gpu_kv_copy_token(&plan, dir, t, l, kv, (unsigned)lane,
                                          32);
                }
            }
        }
    }
}

static void emu_expect_same(const kv_case_t *c, const emu_case_t *e,
                            const char *what, uint64_t seed)
{
    uint32_t l;

    cr_assert_eq(memcmp(c->chunk, e->chunk, c->chunk_bytes), 0,
                 "%s seed %lu: chunk differs", what, (unsigned long)seed);
    for (l = 0; l < c->layout.num_layers; l++) {
        cr_assert_eq(memcmp(c->k[l], e->k_tab[l], c->layer_bytes), 0,
                     "%s seed %lu: layer %u K differs", what,
                     (unsigned long)seed, l);
        if (c->v[l] != NULL) {
            cr_assert_eq(memcmp(c->v[l], e->v_tab[l], c->region), 0,
                         "%s seed %lu: layer %u V differs", what,
                         (unsigned long)seed, l);
        }
    }
}

Test(kernel_emu, kernel_code_matches_cpu)
{
    kv_case_t c;
    emu_case_t e;
    uint64_t seed, st;
    int kind, dtype;

    for (kind = 0; kind < KVF_GPU_LAYOUT_COUNT; kind++) {
        for (dtype = 0; dtype < 4; dtype++) {
            for (seed = 1; seed <= 12; seed++) {
                cr_assert_eq(kv_case_create(&c, seed * 313 + kind * 7 + dtype,
                                            (kvf_gpu_layout_t)kind,
                                            (kvf_gpu_dtype_t)dtype),
                             0);
                emu_case_create(&e, &c, (seed % 2 == 0) ? 0 : seed % 16);
                cr_assert_eq(kvf_gpu_kv_pack_cpu(&c.params), KVF_OK);
                emu_launch(&e.params, KVF_GPU_DIR_PACK);
                emu_expect_same(&c, &e, "pack", seed);

                st = seed;
                kv_case_fill(&st, c.chunk, c.chunk_bytes);
                memcpy(e.chunk, c.chunk, c.chunk_bytes);
                cr_assert_eq(kvf_gpu_kv_unpack_cpu(&c.params), KVF_OK);
                emu_launch(&e.params, KVF_GPU_DIR_UNPACK);
                emu_expect_same(&c, &e, "unpack", seed);
                emu_case_destroy(&e);
                kv_case_destroy(&c);
            }
        }
    }
}

/* Bad slots copy nothing in the kernel code (the CUDA path's contract). */
Test(kernel_emu, bad_slots_copy_nothing)
{
    kv_case_t c;
    emu_case_t e;
    uint64_t first;

    cr_assert_eq(kv_case_create(&c, 3, KVF_GPU_LAYOUT_VLLM, KVF_GPU_DTYPE_FP32),
                 0);
    first = c.params.token_begin;
    emu_case_create(&e, &c, 0);
    c.slots[first] = (int64_t)c.num_slots;
    emu_launch(&e.params, KVF_GPU_DIR_PACK);
    c.slots[first] = -7;
    emu_launch(&e.params, KVF_GPU_DIR_UNPACK);
    c.slots[first] = -1;
    cr_assert_eq(kvf_gpu_kv_pack_cpu(&c.params), KVF_OK);
    cr_assert_eq(kvf_gpu_kv_unpack_cpu(&c.params), KVF_OK);
    emu_expect_same(&c, &e, "bad slots", 3);
    emu_case_destroy(&e);
    kv_case_destroy(&c);
}

/* Big aligned rows (the 16-byte unit) through the kernel code, in every
 * layout: HND and packed layouts take the per-head piece path with 256-byte
 * pieces, 16 units each, so one warp spans two heads per step. */
Test(kernel_emu, llama_shape)
{
    static const kv_case_shape_t shape = {.layers     = 2,
                                          .heads      = 8,
                                          .head_dim   = 128,
                                          .block_size = 16,
                                          .tokens     = 64};
    kvf_gpu_kv_plan_t plan;
    kv_case_t c;
    emu_case_t e;
    uint64_t st;
    int kind;
    bool nhd;

    for (kind = 0; kind < KVF_GPU_LAYOUT_COUNT; kind++) {
        cr_assert_eq(kv_case_create_shape(&c, 8 + (uint64_t)kind,
                                          (kvf_gpu_layout_t)kind,
                                          KVF_GPU_DTYPE_BF16, &shape),
                     0);
        /* NHD rows move whole (one piece), the others head by head */
        cr_assert_eq(kvf_gpu_kv_plan_init(&c.params, &plan), KVF_OK);
        nhd =
            (kind <= KVF_GPU_LAYOUT_MLA) || (kind == KVF_GPU_LAYOUT_FLASHINFER);
        cr_assert_eq(plan.num_pieces, nhd ? 1u : 8u, "%s",
                     kvf_gpu_layout_name((kvf_gpu_layout_t)kind));
        emu_case_create(&e, &c, 0);
        cr_assert_eq(kvf_gpu_kv_pack_cpu(&c.params), KVF_OK);
        emu_launch(&e.params, KVF_GPU_DIR_PACK);
        emu_expect_same(&c, &e, kvf_gpu_layout_name((kvf_gpu_layout_t)kind), 8);
        st = 77;
        kv_case_fill(&st, c.chunk, c.chunk_bytes);
        memcpy(e.chunk, c.chunk, c.chunk_bytes);
        cr_assert_eq(kvf_gpu_kv_unpack_cpu(&c.params), KVF_OK);
        emu_launch(&e.params, KVF_GPU_DIR_UNPACK);
        emu_expect_same(&c, &e, kvf_gpu_layout_name((kvf_gpu_layout_t)kind), 8);
        emu_case_destroy(&e);
        kv_case_destroy(&c);
    }
}
