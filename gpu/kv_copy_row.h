/* SPDX-License-Identifier: Apache-2.0 */
/* Copyright (c) 2026 The kvfabric authors */
/*
 * Private: the per-token work of the CUDA kernel, written once for nvcc
 * (device code) and for C (host code), so the unit tests can run exactly the
 * kernel's indexing and copy-width choice on machines without a GPU: the
 * emulation calls it for every (token, layer, K/V, lane) of the grid.
 */
#ifndef KVF_GPU_KV_COPY_ROW_H
#define KVF_GPU_KV_COPY_ROW_H

#include "gpu/kv_copy.h"

#include <stdint.h>

#ifdef __CUDACC__
#define KVF_GPU_HOST_DEVICE static __host__ __device__ __forceinline__
typedef uint4 kvf_gpu_vec16_t; /* one ld/st.v4 per lane */
#else
#define KVF_GPU_HOST_DEVICE static inline
typedef struct kvf_gpu_vec16 {
    uint64_t lo, hi;
} kvf_gpu_vec16_t;
#endif

/* Lane @p _lane of @p _nlanes copies every @p _nlanes-th _type unit. */
#define KVF_GPU_ROW_COPY_AS(_type, _dst, _src, _len, _lane, _nlanes) \
    do { \
        _type *d_       = (_type *)(void *)(_dst); \
        const _type *s_ = (const _type *)(const void *)(_src); \
        uint64_t n_     = (_len) / sizeof(_type), i_; \
        for (i_ = (_lane); i_ < n_; i_ += (_nlanes)) { \
            d_[i_] = s_[i_]; \
        } \
    } while (0)

/* Lane @p _lane of @p _nlanes copies every @p _nlanes-th _type unit of
 * @p _np pieces of @p _piece bytes, piece p at _dst + p * _dstride and
 * _src + p * _sstride: the units of all pieces are numbered together, so a
 * warp stays busy when a piece (one head) is shorter than 32 units. The
 * (piece, unit) pair advances by subtraction: one division per lane. */
#define KVF_GPU_PIECES_COPY_AS(_type, _dst, _dstride, _src, _sstride, _piece, \
                               _np, _lane, _nlanes) \
    do { \
        uint64_t per_ = (_piece) / sizeof(_type), p_, j_; \
        p_            = (_lane) / per_; \
        j_            = (_lane)-p_ * per_; \
        while (p_ < (_np)) { \
            ((_type *)(void *)((_dst) + p_ * (_dstride)))[j_] = \
                ((const _type *)(const void *)((_src) + p_ * (_sstride)))[j_]; \
            j_ += (_nlanes); \
            while (j_ >= per_) { \
                j_ -= per_; \
                p_++; \
            } \
        } \
    } while (0)

/*
 * One lane's share of token @p t of layer @p l, K (kv 0) or V (kv 1): the
 * widest unit (16, 8, 4, 2, 1 bytes) dividing both row addresses and the row
 * size (for rows in pieces: every piece address and the piece size). Slots
 * outside 0..num_slots-1 (-1 holes, and bad slots the host could not check
 * on the device) copy nothing.
 */
KVF_GPU_HOST_DEVICE void kvf_gpu_kv_copy_token(const kvf_gpu_kv_plan_t *plan,
                                               kvf_gpu_dir_t dir, uint64_t t,
                                               uint32_t l, uint32_t kv,
                                               unsigned lane, unsigned nlanes)
{
    uint64_t row = plan->row_bytes, piece = plan->piece_bytes;
    uint64_t dstride, sstride;
    uint8_t *chunk_row, *paged_row, *dst;
    const uint8_t *src;
    uintptr_t align;
    uint32_t np = plan->num_pieces;
    int64_t slot;

    slot = plan->slots[t];
    if ((slot < 0) || ((uint64_t)slot >= plan->num_slots)) {
        return;
    }
    chunk_row = plan->chunk +
                (((uint64_t)kv * plan->num_layers + l) * plan->chunk_tokens +
                 plan->chunk_offset + t) *
                    row;
    paged_row = KVF_GPU_KV_PLAN_SLOT_ADDR(plan, plan->base[kv][l], slot);
    if (dir == KVF_GPU_DIR_PACK) {
        dst     = chunk_row;
        src     = paged_row;
        dstride = piece;
        sstride = plan->head_stride;
    } else {
        dst     = paged_row;
        src     = chunk_row;
        dstride = plan->head_stride;
        sstride = piece;
    }
    if (np == 1) {
        align = (uintptr_t)dst | (uintptr_t)src | (uintptr_t)row;
        if ((align & 15) == 0) {
            KVF_GPU_ROW_COPY_AS(kvf_gpu_vec16_t, dst, src, row, lane, nlanes);
        } else if ((align & 7) == 0) {
            KVF_GPU_ROW_COPY_AS(uint64_t, dst, src, row, lane, nlanes);
        } else if ((align & 3) == 0) {
            KVF_GPU_ROW_COPY_AS(uint32_t, dst, src, row, lane, nlanes);
        } else if ((align & 1) == 0) {
            KVF_GPU_ROW_COPY_AS(uint16_t, dst, src, row, lane, nlanes);
        } else {
            KVF_GPU_ROW_COPY_AS(uint8_t, dst, src, row, lane, nlanes);
        }
        return;
    }
    align = (uintptr_t)dst | (uintptr_t)src | (uintptr_t)piece |
            (uintptr_t)plan->head_stride;
    if ((align & 15) == 0) {
        KVF_GPU_PIECES_COPY_AS(kvf_gpu_vec16_t, dst, dstride, src, sstride,
                               piece, np, lane, nlanes);
    } else if ((align & 7) == 0) {
        KVF_GPU_PIECES_COPY_AS(uint64_t, dst, dstride, src, sstride, piece, np,
                               lane, nlanes);
    } else if ((align & 3) == 0) {
        KVF_GPU_PIECES_COPY_AS(uint32_t, dst, dstride, src, sstride, piece, np,
                               lane, nlanes);
    } else if ((align & 1) == 0) {
        KVF_GPU_PIECES_COPY_AS(uint16_t, dst, dstride, src, sstride, piece, np,
                               lane, nlanes);
    } else {
        KVF_GPU_PIECES_COPY_AS(uint8_t, dst, dstride, src, sstride, piece, np,
                               lane, nlanes);
    }
}

#endif /* KVF_GPU_KV_COPY_ROW_H */
