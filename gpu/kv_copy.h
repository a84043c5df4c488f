/* SPDX-License-Identifier: Apache-2.0 */
/* Copyright (c) 2026 The kvfabric authors */
/*
 * Private: a validated copy request flattened into a plan that the CPU loop
 * and the CUDA kernel both follow, plus the CUDA backend entry points.
 *
 * This header is included by C (gcc) and by kv_copy.cu (nvcc, C++), so it
 * uses only plain C types and no kvf logging macros. The backend functions
 * return a CUDA error code (0 = success); the C side logs and maps it.
 */
#ifndef KVF_GPU_KV_COPY_H
#define KVF_GPU_KV_COPY_H

#include <kvfabric/gpu.h>

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    KVF_GPU_DIR_PACK   = 0, /* paged cache -> chunk */
    KVF_GPU_DIR_UNPACK = 1, /* chunk -> paged cache */
} kvf_gpu_dir_t;

/* Every address the copy needs, resolved per layout. Passed by value as the
 * kernel parameter (about 4 KiB; CUDA >= 12.1 allows 32 KiB on sm_70+).
 *
 * A token's K (or V) row of one layer is num_pieces pieces of piece_bytes,
 * piece p at base[kv][l] + block * block_stride + offset * token_stride +
 * p * head_stride (slot = block * block_size + offset); in the chunk the
 * pieces are back to back. NHD layouts have one piece (the whole row), HND
 * and packed layouts one per head. */
typedef struct kvf_gpu_kv_plan {
    uint64_t num_tokens;   /* tokens to copy */
    uint64_t num_slots;    /* cache capacity: num_blocks * block_size */
    uint64_t row_bytes;    /* one token, one layer, one of K/V */
    uint64_t block_size;   /* tokens per block */
    uint64_t block_stride; /* bytes from one block to the next */
    uint64_t token_stride; /* bytes from one token of a block to the next */
    uint64_t head_stride;  /* bytes from one piece of a token to the next */
    uint64_t piece_bytes;  /* contiguous bytes of one piece */
    uint32_t num_pieces;   /* pieces per row: 1, or num_kv_heads */
    uint64_t chunk_tokens; /* T of the chunk */
    uint64_t chunk_offset; /* chunk position of the first token */
    const int64_t *slots;  /* slot_mapping + token_begin */
    uint8_t *chunk;
    uint32_t num_layers;  /* L of the chunk */
    uint32_t layer_begin; /* first layer copied */
    uint32_t layer_count; /* layers copied (the kernel's grid y) */
    uint32_t num_kv;      /* 2 (K and V) or 1 (MLA) */
    uint8_t *base[2][KVF_GPU_MAX_LAYERS]; /* [K/V][layer] piece 0 of slot 0 */
} kvf_gpu_kv_plan_t;

/* Address of piece 0 of @p slot (in range) in @p base. */
#define KVF_GPU_KV_PLAN_SLOT_ADDR(_plan, _base, _slot) \
    ((_base) + \
     ((uint64_t)(_slot) / (_plan)->block_size) * (_plan)->block_stride + \
     ((uint64_t)(_slot) % (_plan)->block_size) * (_plan)->token_stride)

/* Checks everything the host can see (logging the first problem) and
 * resolves every address into @p plan; the slots themselves are not read.
 * Returns what kvf_gpu_kv_pack_cpu() documents for those checks. */
kvf_status_t kvf_gpu_kv_plan_init(const kvf_gpu_kv_copy_params_t *params,
                                  kvf_gpu_kv_plan_t *plan);

/* Device count (>= 0 when usable) or a negative value; *err_p gets the CUDA
 * error code of the failure. */
int kvf_gpu_cuda_probe(int *err_p);
/* Static text of a CUDA error code. */
const char *kvf_gpu_cuda_error_string(int err);
/* Nonzero when @p err means out of device memory. */
int kvf_gpu_cuda_error_is_oom(int err);

int kvf_gpu_cuda_kv_copy(const kvf_gpu_kv_plan_t *plan, kvf_gpu_dir_t dir,
                         void *stream);
int kvf_gpu_cuda_synchronize(void);
int kvf_gpu_cuda_host_register(void *addr, size_t len);
int kvf_gpu_cuda_host_unregister(void *addr);
int kvf_gpu_cuda_host_device_ptr(void *addr, void **dev_ptr_p);
int kvf_gpu_cuda_ipc_export(void *dev_ptr, kvf_gpu_ipc_handle_t *handle_p);
int kvf_gpu_cuda_ipc_open(const kvf_gpu_ipc_handle_t *handle, void **dev_ptr_p);
int kvf_gpu_cuda_ipc_close(void *dev_ptr);
int kvf_gpu_cuda_mem_alloc(size_t len, void **dev_ptr_p);
int kvf_gpu_cuda_mem_free(void *dev_ptr);
int kvf_gpu_cuda_memcpy(void *dst, const void *src, size_t len);

#ifdef __cplusplus
}
#endif

#endif /* KVF_GPU_KV_COPY_H */
