/* SPDX-License-Identifier: Apache-2.0 */
/* Copyright (c) 2026 The kvfabric authors */
/*
 * Run-time CUDA detection on this machine: without a device (or without a
 * CUDA build) every CUDA entry point answers KVF_ERR_UNSUPPORTED with a
 * logged reason and never crashes; bad arguments are still KVF_ERR_INVALID.
 */
#include "tests/helpers/test_helpers.h"

#include <kvfabric/gpu.h>

#include <criterion/criterion.h>

#include <stdlib.h>
#include <string.h>

static void runtime_setup(void)
{
    kvf_test_log_capture_start();
}

static void runtime_teardown(void)
{
    kvf_test_log_capture_stop();
    kvf_test_check_leaks();
}

TestSuite(gpu_runtime, .init = runtime_setup, .fini = runtime_teardown,
          .timeout = 30);

static void skip_if_device(void)
{
    if (kvf_gpu_is_available(NULL)) {
        cr_skip_test("CUDA device present: tests/gpu covers this");
    }
}

Test(gpu_runtime, probe_gives_a_reason)
{
    const char *reason = NULL;
    bool ok            = kvf_gpu_is_available(&reason);

    cr_assert_not_null(reason);
    if (ok) {
        cr_assert_str_eq(reason, "ok");
    } else {
        cr_assert_eq(strncmp(reason, "no CUDA device: ", 16), 0, "%s", reason);
    }
    /* probed once: same answer, same string */
    cr_assert_eq(kvf_gpu_is_available(NULL), ok);
}

Test(gpu_runtime, bad_arguments_are_invalid_first)
{
    kvf_gpu_ipc_handle_t h;
    void *p;
    char buf[8];

    cr_assert_eq(kvf_gpu_host_register(NULL, 4096), KVF_ERR_INVALID);
    cr_assert_eq(kvf_gpu_host_register(buf, 0), KVF_ERR_INVALID);
    cr_assert_eq(kvf_gpu_host_unregister(NULL), KVF_ERR_INVALID);
    cr_assert_eq(kvf_gpu_host_device_ptr(NULL, &p), KVF_ERR_INVALID);
    cr_assert_eq(kvf_gpu_host_device_ptr(buf, NULL), KVF_ERR_INVALID);
    cr_assert_eq(kvf_gpu_ipc_export(NULL, &h), KVF_ERR_INVALID);
    cr_assert_eq(kvf_gpu_ipc_export(buf, NULL), KVF_ERR_INVALID);
    cr_assert_eq(kvf_gpu_ipc_open(NULL, &p), KVF_ERR_INVALID);
    cr_assert_eq(kvf_gpu_ipc_open(&h, NULL), KVF_ERR_INVALID);
    cr_assert_eq(kvf_gpu_mem_alloc(0, &p), KVF_ERR_INVALID);
    cr_assert_eq(kvf_gpu_mem_alloc(16, NULL), KVF_ERR_INVALID);
    cr_assert_eq(kvf_gpu_memcpy(NULL, buf, 1), KVF_ERR_INVALID);
    cr_assert_eq(kvf_gpu_memcpy(buf, NULL, 1), KVF_ERR_INVALID);
    cr_assert(kvf_test_log_contains("bad argument"));
    /* NULL is a no-op for the releases */
    cr_assert_eq(kvf_gpu_ipc_close(NULL), KVF_OK);
    kvf_gpu_mem_free(NULL);
}

Test(gpu_runtime, pin_is_unsupported_without_device)
{
    size_t len = 1 << 16;
    void *pool, *dev;

    skip_if_device();
    pool = aligned_alloc(4096, len);
    cr_assert_not_null(pool);
    cr_assert_eq(kvf_gpu_host_register(pool, len), KVF_ERR_UNSUPPORTED);
    cr_assert(kvf_test_log_contains("host register: no CUDA device"), "%s",
              kvf_test_log_text());
    cr_assert_eq(kvf_gpu_host_unregister(pool), KVF_ERR_UNSUPPORTED);
    dev = pool;
    cr_assert_eq(kvf_gpu_host_device_ptr(pool, &dev), KVF_ERR_UNSUPPORTED);
    cr_assert_eq(dev, pool); /* untouched on failure */
    free(pool);
}

Test(gpu_runtime, ipc_is_unsupported_without_device)
{
    kvf_gpu_ipc_handle_t h;
    char buf[64];
    void *p = buf;

    skip_if_device();
    memset(&h, 0xab, sizeof(h));
    cr_assert_eq(kvf_gpu_ipc_export(buf, &h), KVF_ERR_UNSUPPORTED);
    /* the out-param is written only on success */
    cr_assert_eq(h.bytes[0], 0xab);
    cr_assert_eq(kvf_gpu_ipc_open(&h, &p), KVF_ERR_UNSUPPORTED);
    cr_assert_eq(p, (void *)buf);
    cr_assert_eq(kvf_gpu_ipc_close(buf), KVF_ERR_UNSUPPORTED);
    cr_assert(kvf_test_log_contains("ipc export: no CUDA device"));
}

Test(gpu_runtime, memory_and_sync_are_unsupported_without_device)
{
    char a[4] = "abc", b[4] = "";
    void *p = NULL;

    skip_if_device();
    cr_assert_eq(kvf_gpu_mem_alloc(64, &p), KVF_ERR_UNSUPPORTED);
    cr_assert_null(p);
    cr_assert_eq(kvf_gpu_memcpy(b, a, sizeof(a)), KVF_ERR_UNSUPPORTED);
    cr_assert_eq(kvf_gpu_synchronize(), KVF_ERR_UNSUPPORTED);
    kvf_gpu_mem_free(a); /* never reaches CUDA without a device */
}

/* valid arguments reach the device check: unsupported, clear message */
Test(gpu_runtime, kernels_are_unsupported_without_device)
{
    kvf_gpu_kv_layout_t lay = {
        .field_mask = KVF_GPU_KV_LAYOUT_FIELD_LAYOUT |
                      KVF_GPU_KV_LAYOUT_FIELD_DTYPE |
                      KVF_GPU_KV_LAYOUT_FIELD_NUM_LAYERS |
                      KVF_GPU_KV_LAYOUT_FIELD_HEAD_DIM |
                      KVF_GPU_KV_LAYOUT_FIELD_BLOCK_SIZE |
                      KVF_GPU_KV_LAYOUT_FIELD_NUM_BLOCKS,
        .layout     = KVF_GPU_LAYOUT_MLA,
        .dtype      = KVF_GPU_DTYPE_BF16,
        .num_layers = 1,
        .head_dim   = 8,
        .block_size = 4,
        .num_blocks = 1,
    };
    uint8_t cache[64] = {0}, chunk[16] = {0};
    void *tab[1]               = {cache};
    int64_t slots[1]           = {3};
    kvf_gpu_kv_copy_params_t p = {
        .field_mask =
            KVF_GPU_KV_COPY_FIELD_LAYOUT | KVF_GPU_KV_COPY_FIELD_K_LAYERS |
            KVF_GPU_KV_COPY_FIELD_SLOT_MAPPING |
            KVF_GPU_KV_COPY_FIELD_SLOT_MAPPING_LEN |
            KVF_GPU_KV_COPY_FIELD_NUM_TOKENS | KVF_GPU_KV_COPY_FIELD_CHUNK |
            KVF_GPU_KV_COPY_FIELD_CHUNK_TOKENS,
        .layout           = &lay,
        .k_layers         = tab,
        .slot_mapping     = slots,
        .slot_mapping_len = 1,
        .num_tokens       = 1,
        .chunk            = chunk,
        .chunk_tokens     = 1,
    };

    skip_if_device();
    cr_assert_eq(kvf_gpu_kv_pack_cuda(&p, NULL), KVF_ERR_UNSUPPORTED);
    cr_assert_eq(kvf_gpu_kv_unpack_cuda(&p, NULL), KVF_ERR_UNSUPPORTED);
    cr_assert(kvf_test_log_contains("CUDA path unavailable: no CUDA device"));
    /* the CPU path serves the same request */
    memset(cache + 3 * 16, 0x5a, 16);
    cr_assert_eq(kvf_gpu_kv_pack_cpu(&p), KVF_OK);
    cr_assert_eq(chunk[0], 0x5a);
    cr_assert_eq(chunk[15], 0x5a);
}
