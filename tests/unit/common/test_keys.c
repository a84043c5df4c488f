/* SPDX-License-Identifier: Apache-2.0 */
/* Copyright (c) 2026 The kvfabric authors */
/*
 * Known answers were computed independently with python3-xxhash, following
 * DESIGN.md §2 (see the comment on each constant).
 */
#include "tests/helpers/test_helpers.h"

#include <kvfabric/keys.h>

#include <criterion/criterion.h>

#include <string.h>

TestSuite(keys, .fini = kvf_test_check_leaks, .timeout = 10);

static kvf_namespace_params_t llama_params(void)
{
    kvf_namespace_params_t p = {
        .field_mask = KVF_NAMESPACE_FIELD_MODEL_ID | KVF_NAMESPACE_FIELD_DTYPE |
                      KVF_NAMESPACE_FIELD_NUM_LAYERS |
                      KVF_NAMESPACE_FIELD_NUM_KV_HEADS |
                      KVF_NAMESPACE_FIELD_HEAD_DIM,
        .model_id     = "llama-3-8b",
        .dtype        = KVF_DTYPE_BF16,
        .num_layers   = 32,
        .num_kv_heads = 8,
        .head_dim     = 128,
    };
    return p;
}

Test(keys, namespace_known_answer)
{
    kvf_namespace_params_t p = llama_params();
    uint64_t ns;

    /* XXH3-128(seed "kvfns", u32 len | model | 8 x u32), low ^ high */
    cr_assert_eq(kvf_namespace_fingerprint(&p, &ns), KVF_OK);
    cr_assert_eq(ns, 0xfd613418e4f68568ull, "ns %016lx", (unsigned long)ns);

    p.field_mask |= KVF_NAMESPACE_FIELD_TP;
    p.tp_rank  = 1;
    p.tp_world = 2;
    cr_assert_eq(kvf_namespace_fingerprint(&p, &ns), KVF_OK);
    cr_assert_eq(ns, 0x168329baad6a8792ull);
}

Test(keys, namespace_defaults_equal_explicit_values)
{
    kvf_namespace_params_t p = llama_params();
    uint64_t a, b;

    cr_assert_eq(kvf_namespace_fingerprint(&p, &a), KVF_OK);
    p.field_mask |= KVF_NAMESPACE_FIELD_TP | KVF_NAMESPACE_FIELD_CHUNK_SIZE |
                    KVF_NAMESPACE_FIELD_LAYOUT_VERSION;
    p.tp_rank        = 0;
    p.tp_world       = 1;
    p.chunk_size     = 256;
    p.layout_version = KVF_LAYOUT_VERSION;
    cr_assert_eq(kvf_namespace_fingerprint(&p, &b), KVF_OK);
    cr_assert_eq(a, b);
}

Test(keys, namespace_differs_per_field)
{
    kvf_namespace_params_t p = llama_params();
    uint64_t base, ns;

    cr_assert_eq(kvf_namespace_fingerprint(&p, &base), KVF_OK);
    p.dtype = KVF_DTYPE_FP16;
    cr_assert_eq(kvf_namespace_fingerprint(&p, &ns), KVF_OK);
    cr_assert_neq(ns, base);
    p            = llama_params();
    p.num_layers = 31;
    cr_assert_eq(kvf_namespace_fingerprint(&p, &ns), KVF_OK);
    cr_assert_neq(ns, base);
    p          = llama_params();
    p.model_id = "llama-3-8c";
    cr_assert_eq(kvf_namespace_fingerprint(&p, &ns), KVF_OK);
    cr_assert_neq(ns, base);
}

Test(keys, namespace_rejects_bad_params)
{
    kvf_namespace_params_t p = llama_params();
    uint64_t ns              = 42;

    p.field_mask &= ~(uint64_t)KVF_NAMESPACE_FIELD_HEAD_DIM;
    cr_assert_eq(kvf_namespace_fingerprint(&p, &ns), KVF_ERR_INVALID);
    p            = llama_params();
    p.num_layers = 0;
    cr_assert_eq(kvf_namespace_fingerprint(&p, &ns), KVF_ERR_INVALID);
    p = llama_params();
    p.field_mask |= KVF_NAMESPACE_FIELD_TP;
    p.tp_rank  = 2;
    p.tp_world = 2;
    cr_assert_eq(kvf_namespace_fingerprint(&p, &ns), KVF_ERR_INVALID);
    p          = llama_params();
    p.model_id = "";
    cr_assert_eq(kvf_namespace_fingerprint(&p, &ns), KVF_ERR_INVALID);
    p       = llama_params();
    p.dtype = (kvf_dtype_t)9;
    cr_assert_eq(kvf_namespace_fingerprint(&p, &ns), KVF_ERR_INVALID);
    cr_assert_eq(kvf_namespace_fingerprint(NULL, &ns), KVF_ERR_INVALID);
    cr_assert_eq(ns, 42, "out-param written on failure");
}

static void make_tokens(uint32_t *tokens, size_t n)
{
    size_t i;

    for (i = 0; i < n; i++) {
        tokens[i] = 1000 + (uint32_t)i;
    }
}

Test(keys, chain_known_answer_with_partial_chunk)
{
    /* tokens 1000..1599, C = 256: d0 = XXH3-128(tokens[0:256], seed ns),
     * di = XXH3-128(BE(d(i-1)) | tokens[iC:(i+1)C], seed ns) */
    static const uint64_t expect[3][2] = {
        {0x405c557cb02fb375ull, 0x3010736cba0d3047ull},
        {0xe46c984f81d687cbull, 0x7dcd48179dcece64ull},
        {0x0c54a713de50b314ull, 0xbcbd0379782d8b22ull},
    };
    const uint64_t ns = 0xfd613418e4f68568ull;
    uint32_t tokens[600];
    kvf_key_t keys[4];
    size_t n = 0, i;

    make_tokens(tokens, 600);
    cr_assert_eq(kvf_key_chain(ns, tokens, 600, 256, true, keys, 4, &n),
                 KVF_OK);
    cr_assert_eq(n, 3);
    for (i = 0; i < 3; i++) {
        cr_assert_eq(keys[i].ns, ns);
        cr_assert_eq(keys[i].hi, expect[i][0], "chunk %zu hi", i);
        cr_assert_eq(keys[i].lo, expect[i][1], "chunk %zu lo", i);
    }

    cr_assert_eq(kvf_key_chain(ns, tokens, 600, 256, false, keys, 4, &n),
                 KVF_OK);
    cr_assert_eq(n, 2, "partial chunk excluded");
}

Test(keys, chain_prefix_property)
{
    uint32_t a[512], b[512];
    kvf_key_t ka[2], kb[2];
    size_t n;

    make_tokens(a, 512);
    make_tokens(b, 512);
    b[300] = 7; /* differs in the second chunk only */
    cr_assert_eq(kvf_key_chain(1, a, 512, 256, false, ka, 2, &n), KVF_OK);
    cr_assert_eq(kvf_key_chain(1, b, 512, 256, false, kb, 2, &n), KVF_OK);
    cr_assert(kvf_key_equal(&ka[0], &kb[0]));
    cr_assert(!kvf_key_equal(&ka[1], &kb[1]));

    b[300] = a[300];
    b[3]   = 9; /* a change in chunk 0 changes every later key */
    cr_assert_eq(kvf_key_chain(1, b, 512, 256, false, kb, 2, &n), KVF_OK);
    cr_assert(!kvf_key_equal(&ka[0], &kb[0]));
    cr_assert(!kvf_key_equal(&ka[1], &kb[1]));

    /* another namespace never matches */
    cr_assert_eq(kvf_key_chain(2, a, 512, 256, false, kb, 2, &n), KVF_OK);
    cr_assert(!kvf_key_equal(&ka[0], &kb[0]));
}

Test(keys, chain_errors)
{
    uint32_t tokens[600];
    kvf_key_t keys[2];
    size_t n = 77;

    make_tokens(tokens, 600);
    cr_assert_eq(kvf_key_chain(1, tokens, 600, 256, true, keys, 2, &n),
                 KVF_ERR_TOO_BIG);
    cr_assert_eq(n, 77);
    cr_assert_eq(kvf_key_chain(1, tokens, 600, 0, true, keys, 2, &n),
                 KVF_ERR_INVALID);
    cr_assert_eq(kvf_key_chain(1, NULL, 600, 256, true, keys, 2, &n),
                 KVF_ERR_INVALID);
    cr_assert_eq(kvf_key_chain(1, tokens, 0, 256, true, keys, 2, &n), KVF_OK);
    cr_assert_eq(n, 0);
}

Test(keys, independent_key_equals_first_chain_key)
{
    uint32_t tokens[256];
    kvf_key_t chain, doc;
    size_t n;

    make_tokens(tokens, 256);
    cr_assert_eq(kvf_key_chain(5, tokens, 256, 256, false, &chain, 1, &n),
                 KVF_OK);
    cr_assert_eq(kvf_key_independent(5, tokens, 256, &doc), KVF_OK);
    cr_assert(kvf_key_equal(&chain, &doc));
    cr_assert_eq(kvf_key_independent(5, tokens, 0, &doc), KVF_ERR_INVALID);
}

Test(keys, digest_fold)
{
    const char *digest32 = "engine-block-hash-32-bytes-long!";
    uint8_t digest16[16];
    kvf_key_t key;
    int i;

    cr_assert_eq(kvf_key_from_digest(3, digest32, 32, &key), KVF_OK);
    cr_assert_eq(key.hi, 0x95d049123941295cull);
    cr_assert_eq(key.lo, 0x56e523668eb2c30cull);
    cr_assert_eq(key.ns, 3);

    for (i = 0; i < 16; i++) {
        digest16[i] = (uint8_t)i;
    }
    cr_assert_eq(kvf_key_from_digest(3, digest16, 16, &key), KVF_OK);
    cr_assert_eq(key.hi, 0x0001020304050607ull, "16 bytes taken big-endian");
    cr_assert_eq(key.lo, 0x08090a0b0c0d0e0full);
    cr_assert_eq(kvf_key_from_digest(3, digest16, 0, &key), KVF_ERR_INVALID);
}

Test(keys, checksum_known_answer)
{
    static uint8_t data[4096];
    int i;

    cr_assert_eq(kvf_chunk_checksum("", 0), 0x2d06800538d394c2ull,
                 "published XXH3-64 of the empty input");
    for (i = 0; i < 4096; i++) {
        data[i] = (uint8_t)i;
    }
    cr_assert_eq(kvf_chunk_checksum(data, sizeof(data)), 0xeb4b7c3707879151ull);
    data[100] ^= 1;
    cr_assert_neq(kvf_chunk_checksum(data, sizeof(data)), 0xeb4b7c3707879151ull,
                  "one flipped bit changes it");
}

Test(keys, pack_unpack_format_parse_roundtrip)
{
    kvf_key_t key = {0x0102030405060708ull, 0x1112131415161718ull,
                     0xa1a2a3a4a5a6a7a8ull};
    uint8_t wire[KVF_KEY_WIRE_SIZE];
    char text[KVF_KEY_STR_SIZE];
    kvf_key_t back;

    kvf_key_pack(&key, wire);
    cr_assert_eq(wire[0], 0x08, "little-endian on the wire");
    cr_assert_eq(wire[23], 0xa1);
    kvf_key_unpack(wire, &back);
    cr_assert(kvf_key_equal(&key, &back));

    cr_assert_str_eq(kvf_key_format(&key, text),
                     "0102030405060708:1112131415161718a1a2a3a4a5a6a7a8");
    memset(&back, 0, sizeof(back));
    cr_assert_eq(kvf_key_parse(text, &back), KVF_OK);
    cr_assert(kvf_key_equal(&key, &back));
    cr_assert_eq(kvf_key_parse("0102:11", &back), KVF_ERR_INVALID);
    cr_assert_eq(kvf_key_parse("0102030405060708-1112131415161718a1a2a3a4a5a6"
                               "a7a8",
                               &back),
                 KVF_ERR_INVALID);
    cr_assert_eq(kvf_key_parse("010203040506070g:1112131415161718a1a2a3a4a5a6"
                               "a7a8",
                               &back),
                 KVF_ERR_INVALID);
}
