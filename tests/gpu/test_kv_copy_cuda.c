/* SPDX-License-Identifier: Apache-2.0 */
/* Copyright (c) 2026 The kvfabric authors */
/*
 * The CUDA kernels against the CPU reference, bit for bit, over random
 * cases (the generator of tests/unit/gpu), with misaligned bases so the
 * narrow-copy fallbacks run too. Without a device every test is skipped
 * with the probe's reason, so a machine without a GPU reports them as
 * skipped, never as passed.
 */
#include "tests/helpers/test_helpers.h"
#include "tests/unit/gpu/kv_case.h"

#include <kvfabric/gpu.h>

#include <criterion/criterion.h>
#include <criterion/parameterized.h>

#include <stdio.h>

TestSuite(kv_copy_cuda, .fini = kvf_test_check_leaks, .timeout = 120);

static void require_device(void)
{
    const char *reason;

    if (!kvf_gpu_is_available(&reason)) {
        cr_skip_test("%s", reason); /* "no CUDA device: ..." */
    }
}

/* Device mirror of a kv_case_t; bases shifted by @p shift bytes. */
typedef struct dev_case {
    uint8_t *k_alloc[KV_CASE_MAX_LAYERS], *v_alloc[KV_CASE_MAX_LAYERS];
    void *k_tab[KV_CASE_MAX_LAYERS], *v_tab[KV_CASE_MAX_LAYERS];
    uint8_t *chunk_alloc, *chunk;
    int64_t *slots;
    kvf_gpu_kv_copy_params_t params;
} dev_case_t;

static void *dev_alloc_copy(const void *src, size_t len, size_t shift,
                            uint8_t **alloc_p)
{
    void *p;

    cr_assert_eq(kvf_gpu_mem_alloc(len + 16, &p), KVF_OK);
    *alloc_p = p;
    cr_assert_eq(kvf_gpu_memcpy((uint8_t *)p + shift, src, len), KVF_OK);
    return (uint8_t *)p + shift;
}

static void dev_case_create(dev_case_t *d, const kv_case_t *c, size_t shift)
{
    uint8_t *slots_alloc;
    uint32_t l;

    memset(d, 0, sizeof(*d));
    for (l = 0; l < c->layout.num_layers; l++) {
        d->k_tab[l] =
            dev_alloc_copy(c->k[l], c->layer_bytes, shift, &d->k_alloc[l]);
        if (c->v[l] != NULL) {
            d->v_tab[l] = dev_alloc_copy(c->v[l], c->region, (shift * 3) % 16,
                                         &d->v_alloc[l]);
        }
    }
    d->chunk = dev_alloc_copy(c->chunk, c->chunk_bytes, (shift * 5) % 16,
                              &d->chunk_alloc);
    dev_alloc_copy(c->slots, c->slots_len * sizeof(int64_t), 0, &slots_alloc);
    d->slots               = (int64_t *)slots_alloc;
    d->params              = c->params;
    d->params.k_layers     = d->k_tab;
    d->params.v_layers     = d->v_tab;
    d->params.slot_mapping = d->slots;
    d->params.chunk        = d->chunk;
}

static void dev_case_destroy(dev_case_t *d)
{
    uint32_t l;

    for (l = 0; l < KV_CASE_MAX_LAYERS; l++) {
        kvf_gpu_mem_free(d->k_alloc[l]);
        kvf_gpu_mem_free(d->v_alloc[l]);
    }
    kvf_gpu_mem_free(d->chunk_alloc);
    kvf_gpu_mem_free(d->slots);
}

/* Device buffers equal the host case's, byte for byte. */
static void expect_same(const kv_case_t *c, const dev_case_t *d,
                        const char *what)
{
    uint8_t *buf = malloc(c->layer_bytes > c->chunk_bytes ? c->layer_bytes
                                                          : c->chunk_bytes);
    uint32_t l;

    cr_assert_not_null(buf);
    cr_assert_eq(kvf_gpu_memcpy(buf, d->chunk, c->chunk_bytes), KVF_OK);
    cr_assert_eq(memcmp(buf, c->chunk, c->chunk_bytes), 0, "%s: chunk differs",
                 what);
    for (l = 0; l < c->layout.num_layers; l++) {
        cr_assert_eq(kvf_gpu_memcpy(buf, d->k_tab[l], c->layer_bytes), KVF_OK);
        cr_assert_eq(memcmp(buf, c->k[l], c->layer_bytes), 0,
                     "%s: layer %u K differs", what, l);
        if (c->v[l] != NULL) {
            cr_assert_eq(kvf_gpu_memcpy(buf, d->v_tab[l], c->region), KVF_OK);
            cr_assert_eq(memcmp(buf, c->v[l], c->region), 0,
                         "%s: layer %u V differs", what, l);
        }
    }
    free(buf);
}

/* pack, then unpack of fresh chunk bytes, on both paths */
static void run_both(kv_case_t *c, size_t shift, const char *what)
{
    dev_case_t d;
    uint64_t st = shift + 77;

    dev_case_create(&d, c, shift);
    cr_assert_eq(kvf_gpu_kv_pack_cpu(&c->params), KVF_OK);
    cr_assert_eq(kvf_gpu_kv_pack_cuda(&d.params, NULL), KVF_OK);
    cr_assert_eq(kvf_gpu_synchronize(), KVF_OK);
    expect_same(c, &d, what);

    kv_case_fill(&st, c->chunk, c->chunk_bytes);
    cr_assert_eq(kvf_gpu_memcpy(d.chunk, c->chunk, c->chunk_bytes), KVF_OK);
    cr_assert_eq(kvf_gpu_kv_unpack_cpu(&c->params), KVF_OK);
    cr_assert_eq(kvf_gpu_kv_unpack_cuda(&d.params, NULL), KVF_OK);
    cr_assert_eq(kvf_gpu_synchronize(), KVF_OK);
    expect_same(c, &d, what);
    dev_case_destroy(&d);
}

typedef struct kv_cuda_param {
    kvf_gpu_layout_t layout;
    kvf_gpu_dtype_t dtype;
    char name[32];
} kv_cuda_param_t;

ParameterizedTestParameters(kv_copy_cuda, kernel_matches_cpu)
{
    static kv_cuda_param_t params[KVF_GPU_LAYOUT_COUNT * 4];
    static const char *const dnames[] = {"fp16", "bf16", "fp32", "fp8"};
    size_t i;

    for (i = 0; i < KVF_GPU_LAYOUT_COUNT * 4; i++) {
        params[i].layout = (kvf_gpu_layout_t)(i / 4);
        params[i].dtype  = (kvf_gpu_dtype_t)(i % 4);
        snprintf(params[i].name, sizeof(params[i].name), "%s/%s",
                 kvf_gpu_layout_name(params[i].layout), dnames[i % 4]);
    }
    return cr_make_param_array(kv_cuda_param_t, params,
                               KVF_GPU_LAYOUT_COUNT * 4);
}

ParameterizedTest(kv_cuda_param_t *p, kv_copy_cuda, kernel_matches_cpu)
{
    char what[64];
    kv_case_t c;
    uint64_t seed;

    require_device();
    for (seed = 1; seed <= 25; seed++) {
        cr_assert_eq(kv_case_create(&c, seed * 977 + p->layout * 31 + p->dtype,
                                    p->layout, p->dtype),
                     0);
        snprintf(what, sizeof(what), "%s seed %lu", p->name,
                 (unsigned long)seed);
        /* even seeds aligned (16-byte path where rows allow), odd ones
         * shifted so every narrower unit is taken */
        run_both(&c, (seed % 2 == 0) ? 0 : (size_t)(seed % 16), what);
        kv_case_destroy(&c);
    }
}

/* Llama-3-8B-shaped chunks (2 KiB rows, 256 tokens, blocks of 16) in every
 * layout: all pointers 16-byte aligned, so the uint4 path runs. */
Test(kv_copy_cuda, llama_shape_vector_path)
{
    static const kv_case_shape_t shape = {.layers     = 4,
                                          .heads      = 8,
                                          .head_dim   = 128,
                                          .block_size = 16,
                                          .tokens     = 256};
    char what[32];
    kv_case_t c;
    int kind;

    require_device();
    for (kind = 0; kind < KVF_GPU_LAYOUT_COUNT; kind++) {
        cr_assert_eq(kv_case_create_shape(&c, 4242 + kind,
                                          (kvf_gpu_layout_t)kind,
                                          KVF_GPU_DTYPE_BF16, &shape),
                     0);
        snprintf(what, sizeof(what), "llama %s",
                 kvf_gpu_layout_name((kvf_gpu_layout_t)kind));
        run_both(&c, 0, what);
        kv_case_destroy(&c);
    }
}

/* Slots the kernel cannot use are skipped, never written out of bounds:
 * the result equals the CPU path with those tokens as holes. */
Test(kv_copy_cuda, bad_slots_are_skipped_on_device)
{
    kv_case_t c;
    dev_case_t d;
    uint64_t first;

    require_device();
    cr_assert_eq(kv_case_create(&c, 17, KVF_GPU_LAYOUT_KV, KVF_GPU_DTYPE_FP16),
                 0);
    first          = c.params.token_begin;
    c.slots[first] = (int64_t)c.num_slots;
    dev_case_create(&d, &c, 0);
    cr_assert_eq(kvf_gpu_kv_pack_cuda(&d.params, NULL), KVF_OK);
    cr_assert_eq(kvf_gpu_synchronize(), KVF_OK);
    c.slots[first] = -1;
    cr_assert_eq(kvf_gpu_kv_pack_cpu(&c.params), KVF_OK);
    expect_same(&c, &d, "bad slot");
    dev_case_destroy(&d);
    kv_case_destroy(&c);
}

/* The kernel writes straight into pinned host memory (the agent pool). */
Test(kv_copy_cuda, pack_into_pinned_host_chunk)
{
    kv_case_t c;
    dev_case_t d;
    uint8_t *pool;
    size_t len;
    void *dev_chunk = NULL;

    require_device();
    cr_assert_eq(
        kv_case_create(&c, 23, KVF_GPU_LAYOUT_VLLM, KVF_GPU_DTYPE_BF16), 0);
    dev_case_create(&d, &c, 0);
    len  = (c.chunk_bytes + 4095) / 4096 * 4096;
    pool = aligned_alloc(4096, len);
    cr_assert_not_null(pool);
    memcpy(pool, c.chunk, c.chunk_bytes);
    cr_assert_eq(kvf_gpu_host_register(pool, len), KVF_OK);
    cr_assert_eq(kvf_gpu_host_device_ptr(pool, &dev_chunk), KVF_OK);
    cr_assert_not_null(dev_chunk);
    d.params.chunk = dev_chunk;
    cr_assert_eq(kvf_gpu_kv_pack_cuda(&d.params, NULL), KVF_OK);
    cr_assert_eq(kvf_gpu_synchronize(), KVF_OK);
    cr_assert_eq(kvf_gpu_kv_pack_cpu(&c.params), KVF_OK);
    cr_assert_eq(memcmp(pool, c.chunk, c.chunk_bytes), 0);
    cr_assert_eq(kvf_gpu_host_unregister(pool), KVF_OK);
    free(pool);
    dev_case_destroy(&d);
    kv_case_destroy(&c);
}

Test(kv_copy_cuda, ipc_export_and_bad_handle)
{
    kvf_gpu_ipc_handle_t h, zero;
    void *buf, *mapped = NULL;

    require_device();
    cr_assert_eq(kvf_gpu_mem_alloc(1 << 20, &buf), KVF_OK);
    memset(&zero, 0, sizeof(zero));
    memset(&h, 0, sizeof(h));
    cr_assert_eq(kvf_gpu_ipc_export(buf, &h), KVF_OK);
    cr_assert_neq(memcmp(&h, &zero, sizeof(h)), 0);
    kvf_test_log_capture_start();
    cr_assert_eq(kvf_gpu_ipc_open(&zero, &mapped), KVF_ERR_IO);
    kvf_test_log_capture_stop();
    cr_assert_null(mapped);
    kvf_gpu_mem_free(buf);
}
