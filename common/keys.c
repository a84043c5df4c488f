/* SPDX-License-Identifier: Apache-2.0 */
/* Copyright (c) 2026 The kvfabric authors */
#include <kvfabric/keys.h>

#include "common/byteorder.h"
#include "common/chunk.h"

#define XXH_STATIC_LINKING_ONLY /* XXH3_state_t on the stack */
#include <xxhash.h>
#if defined(__x86_64__) && __has_include(<xxh_x86dispatch.h>)
/* libxxhash's runtime dispatch picks AVX2/AVX-512 where the CPU has them:
 * the same hashes, 2-3x faster than its SSE2 default on a chunk (20 vs 6-9
 * GB/s on this project's build machine), and every chunk is hashed once by
 * its writer and again by each agent that receives it */
#include <xxh_x86dispatch.h>
#endif

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

/* Token ids and wire fields are hashed as little-endian bytes; hashing the
 * host's memory directly is only right on a little-endian host. */
#if !defined(__BYTE_ORDER__) || (__BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__)
#error "kvfabric key hashing assumes a little-endian host"
#endif

/* Seeds keep the three uses of XXH3 apart. */
enum {
    KVF_KEY_SEED_NAMESPACE = 0x6b76666e73000001ull, /* "kvfns" */
    KVF_KEY_SEED_FOLD      = 0x6b7666666f6c6402ull, /* "kvffold" */
};

static void kvf_key_put_u32(XXH3_state_t *state, uint32_t value)
{
    XXH3_128bits_update(state, &value, sizeof(value));
}

kvf_status_t kvf_namespace_fingerprint(const kvf_namespace_params_t *params,
                                       uint64_t *ns_p)
{
    const uint64_t required =
        KVF_NAMESPACE_FIELD_MODEL_ID | KVF_NAMESPACE_FIELD_DTYPE |
        KVF_NAMESPACE_FIELD_NUM_LAYERS | KVF_NAMESPACE_FIELD_NUM_KV_HEADS |
        KVF_NAMESPACE_FIELD_HEAD_DIM;
    uint32_t tp_rank = 0, tp_world = 1;
    uint32_t chunk_size = KVF_DEFAULT_CHUNK_SIZE;
    uint32_t layout     = KVF_LAYOUT_VERSION;
    XXH3_state_t state;
    XXH128_hash_t digest;
    uint32_t model_len;

    if ((params == NULL) || (ns_p == NULL) ||
        ((params->field_mask & required) != required) ||
        (params->model_id == NULL)) {
        return KVF_ERR_INVALID;
    }
    if (params->field_mask & KVF_NAMESPACE_FIELD_TP) {
        tp_rank  = params->tp_rank;
        tp_world = params->tp_world;
    }
    if (params->field_mask & KVF_NAMESPACE_FIELD_CHUNK_SIZE) {
        chunk_size = params->chunk_size;
    }
    if (params->field_mask & KVF_NAMESPACE_FIELD_LAYOUT_VERSION) {
        layout = params->layout_version;
    }
    model_len = (uint32_t)strnlen(params->model_id, 4096);
    if ((model_len == 0) || (model_len >= 4096) ||
        (params->dtype < KVF_DTYPE_FP16) || (params->dtype > KVF_DTYPE_FP8) ||
        (params->num_layers == 0) || (params->num_kv_heads == 0) ||
        (params->head_dim == 0) || (tp_world == 0) || (tp_rank >= tp_world) ||
        (chunk_size == 0) || (layout == 0)) {
        return KVF_ERR_INVALID;
    }

    /* canonical form: length-prefixed model id, then the u32 fields */
    XXH3_INITSTATE(&state);
    XXH3_128bits_reset_withSeed(&state, KVF_KEY_SEED_NAMESPACE);
    kvf_key_put_u32(&state, model_len);
    XXH3_128bits_update(&state, params->model_id, model_len);
    kvf_key_put_u32(&state, (uint32_t)params->dtype);
    kvf_key_put_u32(&state, params->num_layers);
    kvf_key_put_u32(&state, params->num_kv_heads);
    kvf_key_put_u32(&state, params->head_dim);
    kvf_key_put_u32(&state, tp_rank);
    kvf_key_put_u32(&state, tp_world);
    kvf_key_put_u32(&state, chunk_size);
    kvf_key_put_u32(&state, layout);
    digest = XXH3_128bits_digest(&state);
    *ns_p  = digest.low64 ^ digest.high64;
    return KVF_OK;
}

static void kvf_key_from_xxh(uint64_t ns, XXH128_hash_t digest,
                             kvf_key_t *key_p)
{
    key_p->ns = ns;
    key_p->hi = digest.high64;
    key_p->lo = digest.low64;
}

kvf_status_t kvf_key_chain(uint64_t ns, const uint32_t *tokens,
                           size_t num_tokens, uint32_t chunk_size,
                           bool include_partial, kvf_key_t *keys,
                           size_t max_keys, size_t *num_keys_p)
{
    XXH128_canonical_t prev;
    XXH128_hash_t digest;
    size_t count, i, len;

    if ((chunk_size == 0) || (num_keys_p == NULL) ||
        ((tokens == NULL) && (num_tokens > 0)) ||
        ((keys == NULL) && (max_keys > 0))) {
        return KVF_ERR_INVALID;
    }
    count = num_tokens / chunk_size;
    if (include_partial && (num_tokens % chunk_size != 0)) {
        count++;
    }
    if (count > max_keys) {
        return KVF_ERR_TOO_BIG;
    }

    for (i = 0; i < count; i++) {
        len = num_tokens - i * chunk_size;
        if (len > chunk_size) {
            len = chunk_size;
        }
        if (i == 0) {
            /* d0 = H(ns, tokens[0:C]): the namespace is the seed */
            digest = XXH3_128bits_withSeed(tokens, len * sizeof(uint32_t), ns);
        } else {
            /* di = H(d(i-1), tokens[iC:(i+1)C]): hash the previous digest's
             * canonical (big-endian) bytes followed by the tokens */
            XXH3_state_t state;

            XXH3_INITSTATE(&state);
            XXH3_128bits_reset_withSeed(&state, ns);
            XXH3_128bits_update(&state, &prev, sizeof(prev));
            XXH3_128bits_update(&state, tokens + i * chunk_size,
                                len * sizeof(uint32_t));
            digest = XXH3_128bits_digest(&state);
        }
        XXH128_canonicalFromHash(&prev, digest);
        kvf_key_from_xxh(ns, digest, &keys[i]);
    }
    *num_keys_p = count;
    return KVF_OK;
}

kvf_status_t kvf_key_independent(uint64_t ns, const uint32_t *tokens,
                                 size_t num_tokens, kvf_key_t *key_p)
{
    if ((tokens == NULL) || (num_tokens == 0) || (key_p == NULL)) {
        return KVF_ERR_INVALID;
    }
    /* the same hash as the first chunk of a chain: a document chunk stored
     * at the start of a prompt is found as an independent key too */
    kvf_key_from_xxh(
        ns, XXH3_128bits_withSeed(tokens, num_tokens * sizeof(uint32_t), ns),
        key_p);
    return KVF_OK;
}

kvf_status_t kvf_key_from_digest(uint64_t ns, const void *digest, size_t len,
                                 kvf_key_t *key_p)
{
    XXH128_canonical_t canon;

    if ((digest == NULL) || (len == 0) || (key_p == NULL)) {
        return KVF_ERR_INVALID;
    }
    if (len == sizeof(canon)) {
        memcpy(&canon, digest, sizeof(canon));
        kvf_key_from_xxh(ns, XXH128_hashFromCanonical(&canon), key_p);
    } else {
        kvf_key_from_xxh(
            ns, XXH3_128bits_withSeed(digest, len, KVF_KEY_SEED_FOLD), key_p);
    }
    return KVF_OK;
}

uint64_t kvf_chunk_checksum(const void *data, size_t len)
{
    return XXH3_64bits(data, len);
}

uint64_t kvf_chunk_copy_checksum(void *dst, const void *src, size_t len)
{
    const size_t block = 64u << 10; /* well inside L2 */
    XXH3_state_t state;
    uint8_t *d       = dst;
    const uint8_t *s = src;
    size_t off, n;

    if (len <= block) {
        memcpy(d, s, len);
        return XXH3_64bits(d, len);
    }
    XXH3_INITSTATE(&state);
    XXH3_64bits_reset(&state);
    for (off = 0; off < len; off += n) {
        n = (len - off < block) ? len - off : block;
        memcpy(d + off, s + off, n);
        XXH3_64bits_update(&state, d + off, n);
    }
    return XXH3_64bits_digest(&state);
}

bool kvf_key_equal(const kvf_key_t *a, const kvf_key_t *b)
{
    return (a->ns == b->ns) && (a->hi == b->hi) && (a->lo == b->lo);
}

void kvf_key_pack(const kvf_key_t *key, uint8_t *buf)
{
    kvf_le64_put(buf, key->ns);
    kvf_le64_put(buf + 8, key->hi);
    kvf_le64_put(buf + 16, key->lo);
}

void kvf_key_unpack(const uint8_t *buf, kvf_key_t *key_p)
{
    key_p->ns = kvf_le64_get(buf);
    key_p->hi = kvf_le64_get(buf + 8);
    key_p->lo = kvf_le64_get(buf + 16);
}

char *kvf_key_format(const kvf_key_t *key, char *buf)
{
    snprintf(buf, KVF_KEY_STR_SIZE, "%016" PRIx64 ":%016" PRIx64 "%016" PRIx64,
             key->ns, key->hi, key->lo);
    return buf;
}

static int kvf_key_parse_hex64(const char *str, uint64_t *value_p)
{
    uint64_t value = 0;
    int i, c;

    for (i = 0; i < 16; i++) {
        c = str[i];
        if ((c >= '0') && (c <= '9')) {
            c -= '0';
        } else if ((c >= 'a') && (c <= 'f')) {
            c = c - 'a' + 10;
        } else if ((c >= 'A') && (c <= 'F')) {
            c = c - 'A' + 10;
        } else {
            return -1;
        }
        value = (value << 4) | (uint64_t)c;
    }
    *value_p = value;
    return 0;
}

kvf_status_t kvf_key_parse(const char *str, kvf_key_t *key_p)
{
    kvf_key_t key;

    if ((str == NULL) || (key_p == NULL) ||
        (strlen(str) != KVF_KEY_STR_SIZE - 1) || (str[16] != ':') ||
        (kvf_key_parse_hex64(str, &key.ns) != 0) ||
        (kvf_key_parse_hex64(str + 17, &key.hi) != 0) ||
        (kvf_key_parse_hex64(str + 33, &key.lo) != 0)) {
        return KVF_ERR_INVALID;
    }
    *key_p = key;
    return KVF_OK;
}
