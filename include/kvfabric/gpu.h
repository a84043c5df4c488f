/* SPDX-License-Identifier: Apache-2.0 */
/* Copyright (c) 2026 The kvfabric authors */
/**
 * @file gpu.h
 * Copies between an engine's paged KV cache and kvfabric chunks, pins host
 * memory for DMA and exports GPU buffers through CUDA IPC.
 *
 * A chunk holds the KV of consecutive tokens for all layers of one rank in
 * the engine-independent `KV_2LTD` layout:
 * `[2][num_layers][chunk_tokens][num_kv_heads * head_dim]` (K then V), or
 * `[1][num_layers][chunk_tokens][latent_dim]` for MLA. A token's row of
 * `num_kv_heads * head_dim * elem_size` bytes is copied as bytes, so every
 * dtype is supported bit for bit.
 *
 * Which paged slot holds a token comes from a slot mapping, one `int64_t` per
 * token: `slot = block * block_size + offset`; slot -1 skips the token (its
 * destination is left untouched).
 *
 * Two implementations of the same copy: `_cpu` (always built, bit-identical
 * reference) and `_cuda` (one kernel launch covers every layer of a chunk;
 * needs a CUDA build and a device, detected at run time, otherwise
 * ::KVF_ERR_UNSUPPORTED). The same binary runs on machines without a GPU.
 */
#ifndef KVFABRIC_GPU_H
#define KVFABRIC_GPU_H

#include <kvfabric/defs.h>
#include <kvfabric/status.h>

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/** Most layers one copy call covers (kernel parameters carry the table). */
#define KVF_GPU_MAX_LAYERS 256

/** Element types of a KV cache; only their size matters to the copies. */
typedef enum {
    KVF_GPU_DTYPE_FP16 = 0, /**< 2 bytes */
    KVF_GPU_DTYPE_BF16 = 1, /**< 2 bytes */
    KVF_GPU_DTYPE_FP32 = 2, /**< 4 bytes */
    KVF_GPU_DTYPE_FP8  = 3, /**< 1 byte (e4m3 or e5m2, copied as bytes) */
} kvf_gpu_dtype_t;

/**
 * How an engine lays out the paged KV cache of one layer. Shapes are the
 * physical order in memory, outermost first (C order, no padding); `E` is
 * the element size. Every layout holds the same bytes per layer
 * (`2 * num_blocks * block_size * num_kv_heads * head_dim * E`, half for
 * MLA); they differ only in where one (token, head) vector of K or V lives.
 * "NHD" puts a block's tokens before heads, "HND" heads before tokens.
 * kvf_gpu_layout_name() gives each a stable lowercase name (the one
 * `kvf-bench gpu --layout` and the Python helpers use).
 */
typedef enum {
    /** "vllm": vLLM flash-attention (NHD), also Triton/FlexAttention: one
     * tensor per layer `[2][num_blocks][block_size][num_kv_heads][head_dim]`;
     * k_layers only. */
    KVF_GPU_LAYOUT_VLLM = 0,
    /** "kv": separate K and V tensors per layer, each
     * `[num_blocks][block_size][num_kv_heads][head_dim]`. */
    KVF_GPU_LAYOUT_KV = 1,
    /** "sglang": SGLang per-layer K and V buffers
     * `[num_slots][num_kv_heads][head_dim]`; set block_size 1 and num_blocks
     * to the slot count. */
    KVF_GPU_LAYOUT_SGLANG = 2,
    /** "mla": MLA latent, one vector per token, per layer
     * `[num_blocks][block_size][head_dim]` (head_dim = latent dim,
     * num_kv_heads 1); k_layers only, chunk `[1][L][T][latent]`. */
    KVF_GPU_LAYOUT_MLA = 3,
    /** "vllm_hnd": vLLM flash-attention with the HND stride order
     * (`VLLM_KV_CACHE_LAYOUT=HND`): `[2][num_blocks][num_kv_heads]
     * [block_size][head_dim]`; k_layers only. Also the CPU attention backend
     * of vLLM releases whose get_kv_cache_shape() is
     * `(2, num_blocks, num_kv_heads, block_size, head_size)`
     * (::KVF_GPU_LAYOUT_VLLM_CPU_SPLIT). */
    KVF_GPU_LAYOUT_VLLM_HND = 4,
    /** "flashinfer": vLLM FlashInfer backend (NHD): one tensor per layer
     * `[num_blocks][2][block_size][num_kv_heads][head_dim]`; k_layers
     * only. */
    KVF_GPU_LAYOUT_FLASHINFER = 5,
    /** "flashinfer_hnd": FlashInfer with the HND stride order:
     * `[num_blocks][2][num_kv_heads][block_size][head_dim]`; k_layers
     * only. */
    KVF_GPU_LAYOUT_FLASHINFER_HND = 6,
    /** "vllm_cpu": vLLM's CPU attention backend. Its get_kv_cache_shape()
     * is `(num_blocks, num_kv_heads, block_size, 2 * head_size)`, but the
     * backend reads that memory as
     * `[num_blocks][num_kv_heads][2][block_size][head_dim]`: per block and
     * head, the K rows of every token, then their V rows (checked against
     * real vLLM by tests/python/test_layout.py and the real-vLLM tests);
     * k_layers only. */
    KVF_GPU_LAYOUT_VLLM_CPU = 7,
    /** "vllm_packed_nhd": the same logical shape as ::KVF_GPU_LAYOUT_VLLM_CPU
     * laid out with the NHD stride order (block, token, head, K|V, dim):
     * `[num_blocks][block_size][num_kv_heads][2 * head_dim]`, K in the first
     * half of the last dimension; k_layers only. */
    KVF_GPU_LAYOUT_VLLM_PACKED_NHD = 8,
    /** "vllm_cpu_split": another name of ::KVF_GPU_LAYOUT_VLLM_HND, the
     * layout of vLLM's CPU backend `(2, num_blocks, num_kv_heads,
     * block_size, head_size)`. */
    KVF_GPU_LAYOUT_VLLM_CPU_SPLIT = KVF_GPU_LAYOUT_VLLM_HND,
} kvf_gpu_layout_t;

/** Number of distinct layouts: values 0 .. KVF_GPU_LAYOUT_COUNT - 1. */
enum {
    KVF_GPU_LAYOUT_COUNT = 9
};

/** kvf_gpu_kv_layout_t::field_mask bits. */
enum {
    KVF_GPU_KV_LAYOUT_FIELD_LAYOUT       = 1u << 0,
    KVF_GPU_KV_LAYOUT_FIELD_DTYPE        = 1u << 1,
    KVF_GPU_KV_LAYOUT_FIELD_NUM_LAYERS   = 1u << 2,
    KVF_GPU_KV_LAYOUT_FIELD_NUM_KV_HEADS = 1u << 3, /**< optional for MLA */
    KVF_GPU_KV_LAYOUT_FIELD_HEAD_DIM     = 1u << 4,
    KVF_GPU_KV_LAYOUT_FIELD_BLOCK_SIZE   = 1u << 5,
    KVF_GPU_KV_LAYOUT_FIELD_NUM_BLOCKS   = 1u << 6,
};

/** Shape of an engine's paged KV cache (set once per engine). */
typedef struct kvf_gpu_kv_layout {
    uint64_t field_mask;     /**< KVF_GPU_KV_LAYOUT_FIELD_* of set fields */
    kvf_gpu_layout_t layout; /**< required */
    kvf_gpu_dtype_t dtype;   /**< required */
    uint32_t num_layers;     /**< required, 1..KVF_GPU_MAX_LAYERS */
    uint32_t num_kv_heads;   /**< required except MLA (must be 1 there) */
    uint32_t head_dim;       /**< required; MLA: the latent dimension */
    uint32_t block_size;     /**< required, tokens per block, >= 1 */
    uint64_t num_blocks;     /**< required, blocks per layer, >= 1 */
} kvf_gpu_kv_layout_t;

/** kvf_gpu_kv_copy_params_t::field_mask bits. */
enum {
    KVF_GPU_KV_COPY_FIELD_LAYOUT           = 1u << 0,
    KVF_GPU_KV_COPY_FIELD_K_LAYERS         = 1u << 1,
    KVF_GPU_KV_COPY_FIELD_V_LAYERS         = 1u << 2, /**< KV, SGLang only */
    KVF_GPU_KV_COPY_FIELD_SLOT_MAPPING     = 1u << 3,
    KVF_GPU_KV_COPY_FIELD_SLOT_MAPPING_LEN = 1u << 4,
    KVF_GPU_KV_COPY_FIELD_TOKEN_BEGIN      = 1u << 5, /**< optional, 0 */
    KVF_GPU_KV_COPY_FIELD_NUM_TOKENS       = 1u << 6,
    KVF_GPU_KV_COPY_FIELD_CHUNK            = 1u << 7,
    KVF_GPU_KV_COPY_FIELD_CHUNK_TOKENS     = 1u << 8,
    KVF_GPU_KV_COPY_FIELD_CHUNK_OFFSET     = 1u << 9,  /**< optional, 0 */
    KVF_GPU_KV_COPY_FIELD_LAYER_BEGIN      = 1u << 10, /**< optional, 0 */
    KVF_GPU_KV_COPY_FIELD_LAYER_COUNT      = 1u << 11, /**< optional, all */
};

/**
 * One pack or unpack: tokens `[token_begin, token_begin + num_tokens)` of
 * the slot mapping move between the paged cache and chunk token positions
 * `[chunk_offset, chunk_offset + num_tokens)`, for every layer, or for the
 * layer group `[layer_begin, layer_begin + layer_count)` when set (a PD
 * push of the layers prefill has finished; the chunk keeps all layers).
 *
 * The pointer tables themselves are read by the host during the call. What
 * they point to, @c slot_mapping and @c chunk must be accessible by the
 * processor that copies: host memory for `_cpu`, device memory (or mapped
 * pinned host memory) for `_cuda`.
 */
typedef struct kvf_gpu_kv_copy_params {
    uint64_t field_mask;               /**< KVF_GPU_KV_COPY_FIELD_* bits */
    const kvf_gpu_kv_layout_t *layout; /**< required: the cache shape */
    void *const *k_layers;       /**< required: num_layers base pointers */
    void *const *v_layers;       /**< KV and SGLang: num_layers V bases */
    const int64_t *slot_mapping; /**< required: one slot per token, -1 skip */
    uint64_t slot_mapping_len;   /**< required: entries in slot_mapping */
    uint64_t token_begin;        /**< first slot_mapping entry to copy */
    uint64_t num_tokens;         /**< required: tokens to copy, >= 1 */
    void *chunk;                 /**< required: the KV_2LTD chunk */
    uint64_t chunk_tokens;       /**< required: T, token capacity of chunk */
    uint64_t chunk_offset;       /**< chunk token position of token_begin */
    uint32_t layer_begin;        /**< first layer to copy (default 0) */
    uint32_t layer_count;        /**< layers to copy (default: the rest) */
} kvf_gpu_kv_copy_params_t;

/**
 * The stable lowercase name of a layout ("vllm", "vllm_hnd", ...; see
 * ::kvf_gpu_layout_t), for logs, tools and language bindings.
 *
 * @param [in] layout  a layout value
 * @return a static string, or NULL for a value outside the enum
 *
 * thread: thread-safe. ownership: the string is static.
 */
KVF_API const char *kvf_gpu_layout_name(kvf_gpu_layout_t layout);

/**
 * The layout of a name from kvf_gpu_layout_name(), or an alias
 * ("vllm_cpu_split"); '-' and '_' are interchangeable.
 *
 * @param [in] name       the name
 * @param [out] layout_p  the layout, written only on success
 * @return ::KVF_OK; ::KVF_ERR_INVALID for NULL or an unknown name (not
 *         logged: callers list the names themselves)
 *
 * thread: thread-safe. ownership: nothing is kept.
 */
KVF_API kvf_status_t kvf_gpu_layout_from_name(const char *name,
                                              kvf_gpu_layout_t *layout_p);

/**
 * Bytes of one token's row for one layer and one of K/V
 * (`num_kv_heads * head_dim * elem_size`).
 *
 * @param [in] layout  a layout that kvf_gpu_kv_layout_check() accepts
 * @param [out] row_bytes_p  the row size
 * @return ::KVF_OK, or what kvf_gpu_kv_layout_check() returns
 *
 * thread: thread-safe. ownership: nothing is kept.
 */
KVF_API kvf_status_t kvf_gpu_kv_row_bytes(const kvf_gpu_kv_layout_t *layout,
                                          size_t *row_bytes_p);

/**
 * Bytes of a chunk of @p chunk_tokens tokens in this layout
 * (`num_kv * num_layers * chunk_tokens * row_bytes`, num_kv 1 for MLA).
 *
 * @param [in] layout        the cache shape
 * @param [in] chunk_tokens  token capacity T of the chunk, >= 1
 * @param [out] bytes_p      the chunk size
 * @return ::KVF_OK; ::KVF_ERR_INVALID for a bad layout or 0 tokens;
 *         ::KVF_ERR_TOO_BIG when the size overflows
 *
 * thread: thread-safe. ownership: nothing is kept.
 */
KVF_API kvf_status_t kvf_gpu_kv_chunk_bytes(const kvf_gpu_kv_layout_t *layout,
                                            uint64_t chunk_tokens,
                                            size_t *bytes_p);

/**
 * Checks a layout: required fields set, known enums, sizes >= 1, layers
 * within KVF_GPU_MAX_LAYERS, no size overflow. Logs the first problem.
 *
 * @param [in] layout  the cache shape
 * @return ::KVF_OK; ::KVF_ERR_INVALID (NULL, missing field, bad value);
 *         ::KVF_ERR_TOO_BIG (cache or row size overflows size_t)
 *
 * thread: thread-safe. ownership: nothing is kept.
 */
KVF_API kvf_status_t kvf_gpu_kv_layout_check(const kvf_gpu_kv_layout_t *layout);

/**
 * Packs paged KV into a chunk on the CPU (the reference implementation).
 * Every argument and every slot in the range is checked before any byte is
 * written, so a failed call leaves the chunk untouched.
 *
 * @param [in] params  what to copy; all pointers host memory
 * @return ::KVF_OK; ::KVF_ERR_INVALID for NULL pointers (also a NULL table
 *         entry of a copied layer), missing fields or a bad layout;
 *         ::KVF_ERR_RANGE when the token range passes the slot mapping or
 *         the chunk capacity, the layer group passes num_layers (or is
 *         empty), or a slot is < -1 or past the cache
 *
 * thread: thread-safe (the caller keeps concurrent copies from writing the
 * same bytes). ownership: nothing is kept after the call.
 */
KVF_API kvf_status_t
kvf_gpu_kv_pack_cpu(const kvf_gpu_kv_copy_params_t *params);

/**
 * Unpacks a chunk into paged KV on the CPU; the mirror of
 * kvf_gpu_kv_pack_cpu(), with the same checks and return values. Tokens
 * with slot -1 leave their cache rows untouched.
 *
 * @param [in] params  what to copy; all pointers host memory
 * @return as kvf_gpu_kv_pack_cpu()
 *
 * thread: as kvf_gpu_kv_pack_cpu(). ownership: nothing is kept.
 */
KVF_API kvf_status_t
kvf_gpu_kv_unpack_cpu(const kvf_gpu_kv_copy_params_t *params);

/**
 * Packs paged KV into a chunk with one CUDA kernel launch for all layers,
 * enqueued on @p stream; the copy is complete once the stream is
 * (kvf_gpu_synchronize()). Rows move as 16-byte vectors where every address
 * and the row size allow, in smaller units otherwise.
 *
 * The slot mapping lives in device memory and is not read by the host: a
 * slot < -1 or past the cache is skipped by the kernel (never written out of
 * bounds) instead of being reported. Where that matters, check the mapping
 * on the host before copying it to the device.
 *
 * @param [in] params  what to copy; data pointers device-accessible
 * @param [in] stream  a cudaStream_t, or NULL for the default stream
 * @return ::KVF_OK once launched; ::KVF_ERR_INVALID / ::KVF_ERR_RANGE as
 *         kvf_gpu_kv_pack_cpu() for the host-visible arguments;
 *         ::KVF_ERR_UNSUPPORTED without a CUDA build or device (logged);
 *         ::KVF_ERR_IO when the launch fails (CUDA error logged)
 *
 * thread: thread-safe. ownership: nothing is kept after the call; the data
 * must stay valid until the stream completes.
 */
KVF_API kvf_status_t
kvf_gpu_kv_pack_cuda(const kvf_gpu_kv_copy_params_t *params, void *stream);

/**
 * Unpacks a chunk into paged KV with one CUDA kernel launch; the mirror of
 * kvf_gpu_kv_pack_cuda().
 *
 * @param [in] params  what to copy; data pointers device-accessible
 * @param [in] stream  a cudaStream_t, or NULL for the default stream
 * @return as kvf_gpu_kv_pack_cuda()
 *
 * thread: thread-safe. ownership: as kvf_gpu_kv_pack_cuda().
 */
KVF_API kvf_status_t
kvf_gpu_kv_unpack_cuda(const kvf_gpu_kv_copy_params_t *params, void *stream);

/**
 * Whether this build has CUDA and this machine a usable device. Probed once
 * (cudaGetDeviceCount); a missing driver or device gives false, never a
 * crash.
 *
 * @param [out] reason_p  if not NULL: a static string saying why not (or
 *                        "ok")
 * @return true when the `_cuda` calls can run
 *
 * thread: thread-safe. ownership: the reason string is static.
 */
KVF_API bool kvf_gpu_is_available(const char **reason_p);

/**
 * Waits until all work on the current device is done.
 *
 * @return ::KVF_OK; ::KVF_ERR_UNSUPPORTED without CUDA; ::KVF_ERR_IO when
 *         a kernel failed (CUDA error logged)
 *
 * thread: thread-safe. ownership: none.
 */
KVF_API kvf_status_t kvf_gpu_synchronize(void);

/**
 * Pins a mapped host region (e.g. the agent pool) for DMA and maps it into
 * the device address space (cudaHostRegister, portable + mapped).
 *
 * @param [in] addr  start of the region
 * @param [in] len   its length in bytes, >= 1
 * @return ::KVF_OK; ::KVF_ERR_INVALID for NULL/0; ::KVF_ERR_UNSUPPORTED
 *         without CUDA; ::KVF_ERR_IO when CUDA refuses (logged)
 *
 * thread: thread-safe. ownership: the region stays the caller's; undo with
 * kvf_gpu_host_unregister() before unmapping it.
 */
KVF_API kvf_status_t kvf_gpu_host_register(void *addr, size_t len);

/**
 * Unpins a region pinned by kvf_gpu_host_register().
 *
 * @param [in] addr  the address given to kvf_gpu_host_register()
 * @return ::KVF_OK; ::KVF_ERR_INVALID for NULL; ::KVF_ERR_UNSUPPORTED
 *         without CUDA; ::KVF_ERR_IO when CUDA refuses (logged)
 *
 * thread: thread-safe. ownership: as kvf_gpu_host_register().
 */
KVF_API kvf_status_t kvf_gpu_host_unregister(void *addr);

/**
 * The device address of host memory pinned by kvf_gpu_host_register()
 * (cudaHostGetDevicePointer), for a chunk argument of the `_cuda` copies.
 * With unified addressing it usually equals @p addr; ask rather than assume.
 *
 * @param [in] addr        an address inside a registered region
 * @param [out] dev_ptr_p  the device address, written only on success
 * @return ::KVF_OK; ::KVF_ERR_INVALID for NULL; ::KVF_ERR_UNSUPPORTED
 *         without CUDA; ::KVF_ERR_IO when the region is not registered
 *         (logged)
 *
 * thread: thread-safe. ownership: valid while the region stays registered.
 */
KVF_API kvf_status_t kvf_gpu_host_device_ptr(void *addr, void **dev_ptr_p);

/** Size of a CUDA IPC memory handle (cudaIpcMemHandle_t). */
#define KVF_GPU_IPC_HANDLE_SIZE 64

/** An exported GPU buffer, safe to send to another process as bytes. */
typedef struct kvf_gpu_ipc_handle {
    uint8_t bytes[KVF_GPU_IPC_HANDLE_SIZE];
} kvf_gpu_ipc_handle_t;

/**
 * Exports a device allocation (cudaIpcGetMemHandle) so another process (the
 * agent) can map it for GPUDirect.
 *
 * @param [in] dev_ptr    base of a cudaMalloc allocation
 * @param [out] handle_p  the handle, written only on success
 * @return ::KVF_OK; ::KVF_ERR_INVALID for NULL; ::KVF_ERR_UNSUPPORTED
 *         without CUDA; ::KVF_ERR_IO when CUDA refuses (logged)
 *
 * thread: thread-safe. ownership: the allocation stays the caller's and
 * must outlive every importer's mapping.
 */
KVF_API kvf_status_t kvf_gpu_ipc_export(void *dev_ptr,
                                        kvf_gpu_ipc_handle_t *handle_p);

/**
 * Maps a buffer exported by another process (cudaIpcOpenMemHandle).
 *
 * @param [in] handle      from kvf_gpu_ipc_export() in the other process
 * @param [out] dev_ptr_p  the mapping, written only on success
 * @return ::KVF_OK; ::KVF_ERR_INVALID for NULL; ::KVF_ERR_UNSUPPORTED
 *         without CUDA; ::KVF_ERR_IO when CUDA refuses (logged)
 *
 * thread: thread-safe. ownership: close with kvf_gpu_ipc_close().
 */
KVF_API kvf_status_t kvf_gpu_ipc_open(const kvf_gpu_ipc_handle_t *handle,
                                      void **dev_ptr_p);

/**
 * Unmaps a buffer mapped by kvf_gpu_ipc_open().
 *
 * @param [in] dev_ptr  the mapping; NULL is a no-op returning ::KVF_OK
 * @return ::KVF_OK; ::KVF_ERR_UNSUPPORTED without CUDA; ::KVF_ERR_IO when
 *         CUDA refuses (logged)
 *
 * thread: thread-safe. ownership: ends the mapping.
 */
KVF_API kvf_status_t kvf_gpu_ipc_close(void *dev_ptr);

/**
 * Allocates device memory (cudaMalloc), for tests, benchmarks and exports.
 *
 * @param [in] len         bytes, >= 1
 * @param [out] dev_ptr_p  the allocation, written only on success
 * @return ::KVF_OK; ::KVF_ERR_INVALID for 0/NULL; ::KVF_ERR_UNSUPPORTED
 *         without CUDA; ::KVF_ERR_NO_MEMORY when the device is full
 *
 * thread: thread-safe. ownership: free with kvf_gpu_mem_free().
 */
KVF_API kvf_status_t kvf_gpu_mem_alloc(size_t len, void **dev_ptr_p);

/**
 * Frees memory from kvf_gpu_mem_alloc(); NULL is a no-op.
 *
 * @param [in] dev_ptr  the allocation
 *
 * thread: thread-safe. ownership: ends the allocation.
 */
KVF_API void kvf_gpu_mem_free(void *dev_ptr);

/**
 * Copies @p len bytes between any host or device addresses (unified
 * addressing, cudaMemcpyDefault) and waits for the copy.
 *
 * @param [out] dst  destination
 * @param [in] src   source
 * @param [in] len   bytes; 0 is a no-op
 * @return ::KVF_OK; ::KVF_ERR_INVALID for NULL; ::KVF_ERR_UNSUPPORTED
 *         without CUDA; ::KVF_ERR_IO when the copy fails (logged)
 *
 * thread: thread-safe. ownership: nothing is kept.
 */
KVF_API kvf_status_t kvf_gpu_memcpy(void *dst, const void *src, size_t len);

#ifdef __cplusplus
}
#endif

#endif /* KVFABRIC_GPU_H */
