/* SPDX-License-Identifier: Apache-2.0 */
/* Copyright (c) 2026 The kvfabric authors */
/**
 * @file keys.h
 * Chunk keys, namespaces and checksums (DESIGN.md §2).
 *
 * A namespace fingerprints everything that makes KV bytes comparable; a key is
 * (namespace, 128-bit digest). Prefix keys are chained, so one key names the
 * whole prefix up to and including its chunk. All hashing is XXH3; token ids
 * are hashed as little-endian uint32 values.
 */
#ifndef KVFABRIC_KEYS_H
#define KVFABRIC_KEYS_H

#include <kvfabric/defs.h>
#include <kvfabric/status.h>

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/** Bytes a key takes on the wire: ns, hi, lo, each little-endian u64. */
#define KVF_KEY_WIRE_SIZE 24

/** Version of the KV_2LTD chunk layout; part of every namespace. */
#define KVF_LAYOUT_VERSION 1

/** Chunk size used when an engine does not choose one. */
#define KVF_DEFAULT_CHUNK_SIZE 256

/** A chunk key: namespace plus 128-bit digest. */
typedef struct kvf_key {
    uint64_t ns; /**< namespace fingerprint */
    uint64_t hi; /**< digest, high 64 bits */
    uint64_t lo; /**< digest, low 64 bits */
} kvf_key_t;

/** Element type of the KV cache; part of the namespace. */
typedef enum {
    KVF_DTYPE_FP16 = 1,
    KVF_DTYPE_BF16 = 2,
    KVF_DTYPE_FP32 = 3,
    KVF_DTYPE_FP8  = 4,
} kvf_dtype_t;

enum {
    KVF_NAMESPACE_FIELD_MODEL_ID       = 1u << 0,
    KVF_NAMESPACE_FIELD_DTYPE          = 1u << 1,
    KVF_NAMESPACE_FIELD_NUM_LAYERS     = 1u << 2,
    KVF_NAMESPACE_FIELD_NUM_KV_HEADS   = 1u << 3,
    KVF_NAMESPACE_FIELD_HEAD_DIM       = 1u << 4,
    KVF_NAMESPACE_FIELD_TP             = 1u << 5,
    KVF_NAMESPACE_FIELD_CHUNK_SIZE     = 1u << 6,
    KVF_NAMESPACE_FIELD_LAYOUT_VERSION = 1u << 7,
};

/** What makes two engines' KV bytes comparable. */
typedef struct kvf_namespace_params {
    uint64_t field_mask;     /**< KVF_NAMESPACE_FIELD_* that are set */
    const char *model_id;    /**< model name or hash; required */
    kvf_dtype_t dtype;       /**< required */
    uint32_t num_layers;     /**< required, > 0 */
    uint32_t num_kv_heads;   /**< required, > 0 */
    uint32_t head_dim;       /**< required, > 0 */
    uint32_t tp_rank;        /**< default 0 */
    uint32_t tp_world;       /**< default 1; tp_rank < tp_world */
    uint32_t chunk_size;     /**< tokens per chunk, default 256 */
    uint32_t layout_version; /**< default KVF_LAYOUT_VERSION */
} kvf_namespace_params_t;

/**
 * Computes the 64-bit namespace fingerprint of @p params.
 *
 * @param [in]  params  engine and model description
 * @param [out] ns_p    the fingerprint, written on success
 * @return KVF_OK; KVF_ERR_INVALID when a required field is missing or a value
 *         is out of range (zero sizes, tp_rank >= tp_world)
 *
 * thread: thread-safe. ownership: nothing is kept.
 */
KVF_API kvf_status_t
kvf_namespace_fingerprint(const kvf_namespace_params_t *params, uint64_t *ns_p);

/**
 * Builds the chained prefix keys of a token sequence:
 * d0 = H(ns, tokens[0:C]), di = H(d(i-1), tokens[iC:(i+1)C]).
 *
 * @param [in]  ns              namespace fingerprint
 * @param [in]  tokens          token ids
 * @param [in]  num_tokens      number of token ids
 * @param [in]  chunk_size      tokens per chunk, > 0
 * @param [in]  include_partial also key a last chunk of < chunk_size tokens
 * @param [out] keys            room for @p max_keys keys
 * @param [in]  max_keys        capacity of @p keys
 * @param [out] num_keys_p      keys written, on success
 * @return KVF_OK; KVF_ERR_INVALID for chunk_size 0 or NULL pointers;
 *         KVF_ERR_TOO_BIG when @p max_keys is too small (nothing written)
 *
 * thread: thread-safe. ownership: nothing is kept.
 */
KVF_API kvf_status_t kvf_key_chain(uint64_t ns, const uint32_t *tokens,
                                   size_t num_tokens, uint32_t chunk_size,
                                   bool include_partial, kvf_key_t *keys,
                                   size_t max_keys, size_t *num_keys_p);

/**
 * Builds the key of an independent (non-prefix) chunk, e.g. a RAG document
 * chunk that may sit anywhere in a prompt: H(ns, tokens).
 *
 * @param [in]  ns          namespace fingerprint
 * @param [in]  tokens      token ids of the chunk
 * @param [in]  num_tokens  number of token ids (> 0)
 * @param [out] key_p       the key, written on success
 * @return KVF_OK, or KVF_ERR_INVALID
 *
 * thread: thread-safe.
 */
KVF_API kvf_status_t kvf_key_independent(uint64_t ns, const uint32_t *tokens,
                                         size_t num_tokens, kvf_key_t *key_p);

/**
 * Makes a key from an engine's own block digest: 16-byte digests are taken as
 * they are (big-endian hi, lo), any other length is folded with XXH3-128.
 *
 * @param [in]  ns      namespace fingerprint
 * @param [in]  digest  the engine's digest bytes
 * @param [in]  len     digest length in bytes (> 0)
 * @param [out] key_p   the key, written on success
 * @return KVF_OK, or KVF_ERR_INVALID
 *
 * thread: thread-safe.
 */
KVF_API kvf_status_t kvf_key_from_digest(uint64_t ns, const void *digest,
                                         size_t len, kvf_key_t *key_p);

/**
 * 64-bit content checksum of a chunk (XXH3-64), computed once at commit and
 * verified by every receiver.
 *
 * @param [in] data  chunk bytes
 * @param [in] len   length in bytes
 * @return the checksum
 *
 * thread: thread-safe.
 */
KVF_API uint64_t kvf_chunk_checksum(const void *data, size_t len);

/** @return true when both keys are equal. thread: thread-safe. */
KVF_API bool kvf_key_equal(const kvf_key_t *a, const kvf_key_t *b);

/**
 * Writes a key in its wire form (KVF_KEY_WIRE_SIZE bytes, little-endian).
 * thread: thread-safe.
 */
KVF_API void kvf_key_pack(const kvf_key_t *key, uint8_t *buf);

/**
 * Reads a key from its wire form (KVF_KEY_WIRE_SIZE bytes).
 * thread: thread-safe.
 */
KVF_API void kvf_key_unpack(const uint8_t *buf, kvf_key_t *key_p);

/** Characters kvf_key_format() writes, terminating NUL included. */
#define KVF_KEY_STR_SIZE 50

/**
 * Formats a key as "nnnnnnnnnnnnnnnn:hhhhhhhhhhhhhhhhllllllllllllllll" (hex).
 *
 * @param [in]  key  the key
 * @param [out] buf  at least KVF_KEY_STR_SIZE bytes
 * @return @p buf
 *
 * thread: thread-safe.
 */
KVF_API char *kvf_key_format(const kvf_key_t *key, char *buf);

/**
 * Parses the form kvf_key_format() writes.
 *
 * @param [in]  str    the text
 * @param [out] key_p  the key, written on success
 * @return KVF_OK, or KVF_ERR_INVALID for anything else
 *
 * thread: thread-safe.
 */
KVF_API kvf_status_t kvf_key_parse(const char *str, kvf_key_t *key_p);

#ifdef __cplusplus
}
#endif

#endif /* KVFABRIC_KEYS_H */
