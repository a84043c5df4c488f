/* SPDX-License-Identifier: Apache-2.0 */
/* Copyright (c) 2026 The kvfabric authors */
/*
 * Paged KV <-> KV_2LTD chunk copies: argument checks, the plan both
 * implementations follow, and the CPU implementation (the reference the
 * CUDA kernel must match bit for bit).
 */
#include "gpu/kv_copy.h"

#include "common/log.h"

#include <inttypes.h>
#include <string.h>

static const uint64_t kvf_gpu_kv_layout_required =
    KVF_GPU_KV_LAYOUT_FIELD_LAYOUT | KVF_GPU_KV_LAYOUT_FIELD_DTYPE |
    KVF_GPU_KV_LAYOUT_FIELD_NUM_LAYERS | KVF_GPU_KV_LAYOUT_FIELD_HEAD_DIM |
    KVF_GPU_KV_LAYOUT_FIELD_BLOCK_SIZE | KVF_GPU_KV_LAYOUT_FIELD_NUM_BLOCKS;

static const uint64_t kvf_gpu_kv_copy_required =
    KVF_GPU_KV_COPY_FIELD_LAYOUT | KVF_GPU_KV_COPY_FIELD_K_LAYERS |
    KVF_GPU_KV_COPY_FIELD_SLOT_MAPPING |
    KVF_GPU_KV_COPY_FIELD_SLOT_MAPPING_LEN | KVF_GPU_KV_COPY_FIELD_NUM_TOKENS |
    KVF_GPU_KV_COPY_FIELD_CHUNK | KVF_GPU_KV_COPY_FIELD_CHUNK_TOKENS;

static size_t kvf_gpu_dtype_size(kvf_gpu_dtype_t dtype)
{
    switch (dtype) {
    case KVF_GPU_DTYPE_FP16:
    case KVF_GPU_DTYPE_BF16:
        return 2;
    case KVF_GPU_DTYPE_FP32:
        return 4;
    case KVF_GPU_DTYPE_FP8:
        return 1;
    }
    return 0;
}

/* Indexed by kvf_gpu_layout_t: the names gpu.h documents. */
static const char *const kvf_gpu_layout_names[KVF_GPU_LAYOUT_COUNT] = {
    [KVF_GPU_LAYOUT_VLLM]            = "vllm",
    [KVF_GPU_LAYOUT_KV]              = "kv",
    [KVF_GPU_LAYOUT_SGLANG]          = "sglang",
    [KVF_GPU_LAYOUT_MLA]             = "mla",
    [KVF_GPU_LAYOUT_VLLM_HND]        = "vllm_hnd",
    [KVF_GPU_LAYOUT_FLASHINFER]      = "flashinfer",
    [KVF_GPU_LAYOUT_FLASHINFER_HND]  = "flashinfer_hnd",
    [KVF_GPU_LAYOUT_VLLM_CPU]        = "vllm_cpu",
    [KVF_GPU_LAYOUT_VLLM_PACKED_NHD] = "vllm_packed_nhd",
};

static bool kvf_gpu_layout_is_known(kvf_gpu_layout_t layout)
{
    return ((unsigned)layout < KVF_GPU_LAYOUT_COUNT);
}

const char *kvf_gpu_layout_name(kvf_gpu_layout_t layout)
{
    return kvf_gpu_layout_is_known(layout) ? kvf_gpu_layout_names[layout]
                                           : NULL;
}

/* Equal up to '-' versus '_'. */
static bool kvf_gpu_layout_name_eq(const char *a, const char *b)
{
    for (; (*a != '\0') && (*b != '\0'); a++, b++) {
        if ((*a != *b) && !((*a == '-') && (*b == '_')) &&
            !((*a == '_') && (*b == '-'))) {
            return false;
        }
    }
    return *a == *b;
}

kvf_status_t kvf_gpu_layout_from_name(const char *name,
                                      kvf_gpu_layout_t *layout_p)
{
    unsigned i;

    if ((name == NULL) || (layout_p == NULL)) {
        return KVF_ERR_INVALID;
    }
    if (kvf_gpu_layout_name_eq(name, "vllm_cpu_split")) {
        *layout_p = KVF_GPU_LAYOUT_VLLM_CPU_SPLIT;
        return KVF_OK;
    }
    for (i = 0; i < KVF_GPU_LAYOUT_COUNT; i++) {
        if (kvf_gpu_layout_name_eq(name, kvf_gpu_layout_names[i])) {
            *layout_p = (kvf_gpu_layout_t)i;
            return KVF_OK;
        }
    }
    return KVF_ERR_INVALID;
}

static bool kvf_gpu_layout_has_v_table(kvf_gpu_layout_t layout)
{
    return (layout == KVF_GPU_LAYOUT_KV) || (layout == KVF_GPU_LAYOUT_SGLANG);
}

/* a * b into *r; false on overflow */
static bool kvf_gpu_mul_ok(uint64_t a, uint64_t b, uint64_t *r)
{
    return !__builtin_mul_overflow(a, b, r) && (*r <= SIZE_MAX);
}

kvf_status_t kvf_gpu_kv_layout_check(const kvf_gpu_kv_layout_t *layout)
{
    uint64_t heads, row, slots, bytes;
    size_t elem;

    if (layout == NULL) {
        kvf_error("kv layout: NULL");
        return KVF_ERR_INVALID;
    }
    if ((layout->field_mask & kvf_gpu_kv_layout_required) !=
        kvf_gpu_kv_layout_required) {
        kvf_error("kv layout: required fields missing (mask 0x%" PRIx64
                  ", need 0x%" PRIx64 ")",
                  layout->field_mask, kvf_gpu_kv_layout_required);
        return KVF_ERR_INVALID;
    }
    if (!kvf_gpu_layout_is_known(layout->layout)) {
        kvf_error("kv layout: unknown layout %d", (int)layout->layout);
        return KVF_ERR_INVALID;
    }
    elem = kvf_gpu_dtype_size(layout->dtype);
    if (elem == 0) {
        kvf_error("kv layout: unknown dtype %d", (int)layout->dtype);
        return KVF_ERR_INVALID;
    }
    if ((layout->num_layers == 0) ||
        (layout->num_layers > KVF_GPU_MAX_LAYERS)) {
        kvf_error("kv layout: %u layers (1..%u)", layout->num_layers,
                  (unsigned)KVF_GPU_MAX_LAYERS);
        return KVF_ERR_INVALID;
    }
    if (layout->field_mask & KVF_GPU_KV_LAYOUT_FIELD_NUM_KV_HEADS) {
        heads = layout->num_kv_heads;
    } else if (layout->layout == KVF_GPU_LAYOUT_MLA) {
        heads = 1;
    } else {
        kvf_error("kv layout: num_kv_heads missing");
        return KVF_ERR_INVALID;
    }
    if ((heads == 0) ||
        ((layout->layout == KVF_GPU_LAYOUT_MLA) && (heads != 1))) {
        kvf_error("kv layout: %" PRIu64 " kv heads (MLA needs 1)", heads);
        return KVF_ERR_INVALID;
    }
    if ((layout->head_dim == 0) || (layout->block_size == 0) ||
        (layout->num_blocks == 0)) {
        kvf_error("kv layout: zero size (head_dim %u, block_size %u, "
                  "num_blocks %" PRIu64 ")",
                  layout->head_dim, layout->block_size, layout->num_blocks);
        return KVF_ERR_INVALID;
    }
    /* every offset the copies compute must fit: 2 * slots * row per layer */
    if (!kvf_gpu_mul_ok(heads * layout->head_dim, elem, &row) ||
        !kvf_gpu_mul_ok(layout->num_blocks, layout->block_size, &slots) ||
        !kvf_gpu_mul_ok(slots, row, &bytes) ||
        !kvf_gpu_mul_ok(bytes, 2, &bytes)) {
        kvf_error("kv layout: cache size overflows");
        return KVF_ERR_TOO_BIG;
    }
    return KVF_OK;
}

kvf_status_t kvf_gpu_kv_row_bytes(const kvf_gpu_kv_layout_t *layout,
                                  size_t *row_bytes_p)
{
    kvf_status_t status;
    uint64_t heads;

    status = kvf_gpu_kv_layout_check(layout);
    if (status != KVF_OK) {
        return status;
    }
    if (row_bytes_p == NULL) {
        kvf_error("kv row bytes: NULL out-param");
        return KVF_ERR_INVALID;
    }
    heads = (layout->field_mask & KVF_GPU_KV_LAYOUT_FIELD_NUM_KV_HEADS)
                ? layout->num_kv_heads
                : 1;
    *row_bytes_p =
        (size_t)(heads * layout->head_dim * kvf_gpu_dtype_size(layout->dtype));
    return KVF_OK;
}

kvf_status_t kvf_gpu_kv_chunk_bytes(const kvf_gpu_kv_layout_t *layout,
                                    uint64_t chunk_tokens, size_t *bytes_p)
{
    kvf_status_t status;
    size_t row;
    uint64_t bytes;
    uint64_t num_kv;

    status = kvf_gpu_kv_row_bytes(layout, &row);
    if (status != KVF_OK) {
        return status;
    }
    if ((chunk_tokens == 0) || (bytes_p == NULL)) {
        kvf_error("kv chunk bytes: %s",
                  (bytes_p == NULL) ? "NULL out-param" : "0 tokens");
        return KVF_ERR_INVALID;
    }
    num_kv = (layout->layout == KVF_GPU_LAYOUT_MLA) ? 1 : 2;
    if (!kvf_gpu_mul_ok(num_kv * layout->num_layers, chunk_tokens, &bytes) ||
        !kvf_gpu_mul_ok(bytes, row, &bytes)) {
        kvf_error("kv chunk bytes: %" PRIu64 " tokens overflow", chunk_tokens);
        return KVF_ERR_TOO_BIG;
    }
    *bytes_p = (size_t)bytes;
    return KVF_OK;
}

/*
 * The strides of plan_t for a checked layout (E element size, D = head_dim *
 * E one head's vector, R = heads * D a row, S block_size, N slots); returns
 * the offset of V's piece 0 of slot 0 from K's in one-tensor layouts.
 */
static uint64_t kvf_gpu_kv_plan_set_strides(kvf_gpu_kv_plan_t *plan,
                                            const kvf_gpu_kv_layout_t *layout)
{
    uint64_t r = plan->row_bytes, s = layout->block_size, n = plan->num_slots;
    uint64_t d        = layout->head_dim * kvf_gpu_dtype_size(layout->dtype);
    uint64_t v_offset = 0;

    plan->block_size   = s;
    plan->block_stride = s * r; /* NHD: token t of block b at (b*S + t)*R */
    plan->token_stride = r;
    plan->head_stride  = d;
    switch (layout->layout) {
    case KVF_GPU_LAYOUT_VLLM: /* [2][blocks][S][heads][dim] */
        v_offset = n * r;
        break;
    case KVF_GPU_LAYOUT_KV:
    case KVF_GPU_LAYOUT_SGLANG:
    case KVF_GPU_LAYOUT_MLA:
        break;
    case KVF_GPU_LAYOUT_VLLM_HND: /* [2][blocks][heads][S][dim] */
        v_offset           = n * r;
        plan->token_stride = d;
        plan->head_stride  = s * d;
        break;
    case KVF_GPU_LAYOUT_FLASHINFER: /* [blocks][2][S][heads][dim] */
        v_offset           = s * r;
        plan->block_stride = 2 * s * r;
        break;
    case KVF_GPU_LAYOUT_FLASHINFER_HND: /* [blocks][2][heads][S][dim] */
        v_offset           = s * r;
        plan->block_stride = 2 * s * r;
        plan->token_stride = d;
        plan->head_stride  = s * d;
        break;
    case KVF_GPU_LAYOUT_VLLM_CPU: /* [blocks][heads][2][S][dim] in memory */
        v_offset           = s * d;
        plan->block_stride = 2 * s * r;
        plan->token_stride = d;
        plan->head_stride  = 2 * s * d;
        break;
    case KVF_GPU_LAYOUT_VLLM_PACKED_NHD: /* [blocks][S][heads][2*dim] */
        v_offset           = d;
        plan->block_stride = 2 * s * r;
        plan->token_stride = 2 * r;
        plan->head_stride  = 2 * d;
        break;
    }
    /* heads back to back (or one head): the row is one contiguous piece */
    if ((plan->head_stride == d) || (r == d)) {
        plan->num_pieces  = 1;
        plan->piece_bytes = r;
    } else {
        plan->num_pieces  = (uint32_t)(r / d);
        plan->piece_bytes = d;
    }
    return v_offset;
}

/* Slots are not read here: on the CUDA path they live in device memory. */
kvf_status_t kvf_gpu_kv_plan_init(const kvf_gpu_kv_copy_params_t *params,
                                  kvf_gpu_kv_plan_t *plan)
{
    const kvf_gpu_kv_layout_t *layout;
    kvf_status_t status;
    size_t row, chunk_bytes;
    uint64_t begin, end, v_offset;
    uint32_t l;

    if (params == NULL) {
        kvf_error("kv copy: NULL params");
        return KVF_ERR_INVALID;
    }
    if ((params->field_mask & kvf_gpu_kv_copy_required) !=
        kvf_gpu_kv_copy_required) {
        kvf_error("kv copy: required fields missing (mask 0x%" PRIx64
                  ", need 0x%" PRIx64 ")",
                  params->field_mask, kvf_gpu_kv_copy_required);
        return KVF_ERR_INVALID;
    }
    layout = params->layout;
    status = kvf_gpu_kv_row_bytes(layout, &row);
    if (status != KVF_OK) {
        return status;
    }
    if ((params->k_layers == NULL) || (params->slot_mapping == NULL) ||
        (params->chunk == NULL)) {
        kvf_error("kv copy: NULL %s", (params->k_layers == NULL) ? "k_layers"
                                      : (params->slot_mapping == NULL)
                                          ? "slot_mapping"
                                          : "chunk");
        return KVF_ERR_INVALID;
    }
    if (kvf_gpu_layout_has_v_table(layout->layout) &&
        (!(params->field_mask & KVF_GPU_KV_COPY_FIELD_V_LAYERS) ||
         (params->v_layers == NULL))) {
        kvf_error("kv copy: layout %d needs v_layers", (int)layout->layout);
        return KVF_ERR_INVALID;
    }
    if ((params->num_tokens == 0) || (params->chunk_tokens == 0)) {
        kvf_error("kv copy: zero size (num_tokens %" PRIu64
                  ", chunk_tokens %" PRIu64 ")",
                  params->num_tokens, params->chunk_tokens);
        return KVF_ERR_INVALID;
    }
    begin = (params->field_mask & KVF_GPU_KV_COPY_FIELD_TOKEN_BEGIN)
                ? params->token_begin
                : 0;
    if (__builtin_add_overflow(begin, params->num_tokens, &end) ||
        (end > params->slot_mapping_len)) {
        kvf_error("kv copy: tokens %" PRIu64 "+%" PRIu64
                  " past slot mapping of %" PRIu64,
                  begin, params->num_tokens, params->slot_mapping_len);
        return KVF_ERR_RANGE;
    }
    plan->chunk_offset =
        (params->field_mask & KVF_GPU_KV_COPY_FIELD_CHUNK_OFFSET)
            ? params->chunk_offset
            : 0;
    if (__builtin_add_overflow(plan->chunk_offset, params->num_tokens, &end) ||
        (end > params->chunk_tokens)) {
        kvf_error("kv copy: chunk tokens %" PRIu64 "+%" PRIu64
                  " past chunk capacity %" PRIu64,
                  plan->chunk_offset, params->num_tokens, params->chunk_tokens);
        return KVF_ERR_RANGE;
    }
    status = kvf_gpu_kv_chunk_bytes(layout, params->chunk_tokens, &chunk_bytes);
    if (status != KVF_OK) {
        return status;
    }
    plan->layer_begin = (params->field_mask & KVF_GPU_KV_COPY_FIELD_LAYER_BEGIN)
                            ? params->layer_begin
                            : 0;
    if (plan->layer_begin >= layout->num_layers) {
        kvf_error("kv copy: layer %u past %u layers", plan->layer_begin,
                  layout->num_layers);
        return KVF_ERR_RANGE;
    }
    plan->layer_count = (params->field_mask & KVF_GPU_KV_COPY_FIELD_LAYER_COUNT)
                            ? params->layer_count
                            : layout->num_layers - plan->layer_begin;
    if ((plan->layer_count == 0) ||
        (plan->layer_count > layout->num_layers - plan->layer_begin)) {
        kvf_error("kv copy: layers %u+%u outside 1..%u layers",
                  plan->layer_begin, plan->layer_count, layout->num_layers);
        return KVF_ERR_RANGE;
    }

    plan->num_tokens   = params->num_tokens;
    plan->num_slots    = layout->num_blocks * layout->block_size;
    plan->row_bytes    = row;
    plan->chunk_tokens = params->chunk_tokens;
    plan->slots        = params->slot_mapping + begin;
    plan->chunk        = params->chunk;
    plan->num_layers   = layout->num_layers;
    plan->num_kv       = (layout->layout == KVF_GPU_LAYOUT_MLA) ? 1 : 2;
    v_offset           = kvf_gpu_kv_plan_set_strides(plan, layout);
    memset(plan->base, 0, sizeof(plan->base));
    for (l = plan->layer_begin; l < plan->layer_begin + plan->layer_count;
         l++) {
        plan->base[0][l] = params->k_layers[l];
        if (plan->base[0][l] == NULL) {
            kvf_error("kv copy: k_layers[%u] is NULL", l);
            return KVF_ERR_INVALID;
        }
        if (kvf_gpu_layout_has_v_table(layout->layout)) {
            plan->base[1][l] = params->v_layers[l];
            if (plan->base[1][l] == NULL) {
                kvf_error("kv copy: v_layers[%u] is NULL", l);
                return KVF_ERR_INVALID;
            }
        } else if (plan->num_kv == 2) {
            plan->base[1][l] = plan->base[0][l] + v_offset;
        }
    }
    return KVF_OK;
}

/* Every slot in range before a byte moves: a failed call writes nothing. */
static kvf_status_t kvf_gpu_kv_plan_check_slots(const kvf_gpu_kv_plan_t *plan)
{
    uint64_t t;
    int64_t slot;

    for (t = 0; t < plan->num_tokens; t++) {
        slot = plan->slots[t];
        if ((slot < -1) ||
            ((slot >= 0) && ((uint64_t)slot >= plan->num_slots))) {
            kvf_error("kv copy: token %" PRIu64 " slot %" PRId64
                      " outside -1..%" PRIu64,
                      t, slot, plan->num_slots - 1);
            return KVF_ERR_RANGE;
        }
    }
    return KVF_OK;
}

/* Copies larger than this stream their stores past the caches (as glibc's
 * memcpy does above a fraction of the LLC): the destination is not read
 * again soon, and streaming saves the read-for-ownership of every line. */
#define KVF_GPU_CPU_STREAM_MIN (4u << 20)

#if defined(__SSE2__)
#include <emmintrin.h>

/* Row copy with non-temporal 16-byte stores; @p dst and @p len 16-aligned. */
static void kvf_gpu_row_copy_stream(uint8_t *dst, const uint8_t *src,
                                    uint64_t len)
{
    __m128i a, b, c, d;
    uint64_t i = 0;

    for (; i + 64 <= len; i += 64) {
        a = _mm_loadu_si128((const __m128i *)(const void *)(src + i));
        b = _mm_loadu_si128((const __m128i *)(const void *)(src + i + 16));
        c = _mm_loadu_si128((const __m128i *)(const void *)(src + i + 32));
        d = _mm_loadu_si128((const __m128i *)(const void *)(src + i + 48));
        _mm_stream_si128((__m128i *)(void *)(dst + i), a);
        _mm_stream_si128((__m128i *)(void *)(dst + i + 16), b);
        _mm_stream_si128((__m128i *)(void *)(dst + i + 32), c);
        _mm_stream_si128((__m128i *)(void *)(dst + i + 48), d);
    }
    for (; i < len; i += 16) {
        a = _mm_loadu_si128((const __m128i *)(const void *)(src + i));
        _mm_stream_si128((__m128i *)(void *)(dst + i), a);
    }
}
#endif

static void kvf_gpu_row_copy(uint8_t *dst, const uint8_t *src, uint64_t len,
                             bool stream)
{
#if defined(__SSE2__)
    if (stream && ((((uintptr_t)dst | len) & 15) == 0)) {
        kvf_gpu_row_copy_stream(dst, src, len);
        return;
    }
#endif
    memcpy(dst, src, len);
}

/* Asks for a whole row ahead of its copy: rows of scattered slots (SGLang,
 * block_size 1) defeat the hardware prefetcher. */
static inline void kvf_gpu_row_prefetch(const uint8_t *p, uint64_t len)
{
    uint64_t i;

    for (i = 0; i < len; i += 64) {
        __builtin_prefetch(p + i);
    }
}

/* One row copy per token and piece; chunk rows are walked in order, and
 * pack prefetches the source row two tokens ahead while the current one
 * moves. */
static void kvf_gpu_kv_copy_cpu_run(const kvf_gpu_kv_plan_t *plan,
                                    kvf_gpu_dir_t dir)
{
    uint64_t t, row = plan->row_bytes, piece = plan->piece_bytes;
    uint64_t hstride = plan->head_stride;
    uint32_t kv, l, p, np = plan->num_pieces;
    uint8_t *chunk_row, *paged_row, *next_row;
    int64_t slot, next;
    bool stream;

    stream = (plan->num_kv * plan->layer_count * plan->num_tokens * row) >=
             KVF_GPU_CPU_STREAM_MIN;
    for (kv = 0; kv < plan->num_kv; kv++) {
        for (l = plan->layer_begin; l < plan->layer_begin + plan->layer_count;
             l++) {
            chunk_row = plan->chunk + (((uint64_t)kv * plan->num_layers + l) *
                                           plan->chunk_tokens +
                                       plan->chunk_offset) *
                                          row;
            for (t = 0; t < plan->num_tokens; t++, chunk_row += row) {
                slot = plan->slots[t];
                if (slot < 0) {
                    continue;
                }
                paged_row =
                    KVF_GPU_KV_PLAN_SLOT_ADDR(plan, plan->base[kv][l], slot);
                if (dir == KVF_GPU_DIR_PACK) {
                    next = (t + 2 < plan->num_tokens) ? plan->slots[t + 2] : -1;
                    if (next >= 0) {
                        next_row = KVF_GPU_KV_PLAN_SLOT_ADDR(
                            plan, plan->base[kv][l], next);
                        for (p = 0; p < np; p++) {
                            kvf_gpu_row_prefetch(next_row + p * hstride, piece);
                        }
                    }
                    for (p = 0; p < np; p++) {
                        kvf_gpu_row_copy(chunk_row + p * piece,
                                         paged_row + p * hstride, piece,
                                         stream);
                    }
                } else {
                    for (p = 0; p < np; p++) {
                        kvf_gpu_row_copy(paged_row + p * hstride,
                                         chunk_row + p * piece, piece, stream);
                    }
                }
            }
        }
    }
#if defined(__SSE2__)
    if (stream) {
        _mm_sfence(); /* streamed stores visible before we return */
    }
#endif
}

static kvf_status_t kvf_gpu_kv_copy_cpu(const kvf_gpu_kv_copy_params_t *params,
                                        kvf_gpu_dir_t dir)
{
    kvf_gpu_kv_plan_t plan;
    kvf_status_t status;

    status = kvf_gpu_kv_plan_init(params, &plan);
    if (status != KVF_OK) {
        return status;
    }
    status = kvf_gpu_kv_plan_check_slots(&plan);
    if (status != KVF_OK) {
        return status;
    }
    kvf_gpu_kv_copy_cpu_run(&plan, dir);
    return KVF_OK;
}

kvf_status_t kvf_gpu_kv_pack_cpu(const kvf_gpu_kv_copy_params_t *params)
{
    return kvf_gpu_kv_copy_cpu(params, KVF_GPU_DIR_PACK);
}

kvf_status_t kvf_gpu_kv_unpack_cpu(const kvf_gpu_kv_copy_params_t *params)
{
    return kvf_gpu_kv_copy_cpu(params, KVF_GPU_DIR_UNPACK);
}

static kvf_status_t kvf_gpu_kv_copy_cuda(const kvf_gpu_kv_copy_params_t *params,
                                         kvf_gpu_dir_t dir, void *stream)
{
    kvf_gpu_kv_plan_t plan;
    kvf_status_t status;
    const char *reason;
    int err;

    status = kvf_gpu_kv_plan_init(params, &plan);
    if (status != KVF_OK) {
        return status;
    }
    if (!kvf_gpu_is_available(&reason)) {
        kvf_error("kv copy: CUDA path unavailable: %s", reason);
        return KVF_ERR_UNSUPPORTED;
    }
    err = kvf_gpu_cuda_kv_copy(&plan, dir, stream);
    if (err != 0) {
        kvf_error("kv copy: %s kernel launch for %u layers, %" PRIu64
                  " tokens failed: %s",
                  (dir == KVF_GPU_DIR_PACK) ? "pack" : "unpack",
                  plan.layer_count, plan.num_tokens,
                  kvf_gpu_cuda_error_string(err));
        return KVF_ERR_IO;
    }
    return KVF_OK;
}

kvf_status_t kvf_gpu_kv_pack_cuda(const kvf_gpu_kv_copy_params_t *params,
                                  void *stream)
{
    return kvf_gpu_kv_copy_cuda(params, KVF_GPU_DIR_PACK, stream);
}

kvf_status_t kvf_gpu_kv_unpack_cuda(const kvf_gpu_kv_copy_params_t *params,
                                    void *stream)
{
    return kvf_gpu_kv_copy_cuda(params, KVF_GPU_DIR_UNPACK, stream);
}
