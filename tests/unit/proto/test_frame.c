/* SPDX-License-Identifier: Apache-2.0 */
/* Copyright (c) 2026 The kvfabric authors */
#include "proto/frame.h"
#include "tests/helpers/test_helpers.h"

#include <criterion/criterion.h>
#include <event2/buffer.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static struct evbuffer *g_buf;

static void frame_setup(void)
{
    g_buf = evbuffer_new();
}

static void frame_teardown(void)
{
    evbuffer_free(g_buf);
    kvf_test_check_leaks();
}

TestSuite(frame, .init = frame_setup, .fini = frame_teardown, .timeout = 10);

static void encode_hello(struct evbuffer *buf, const char *name)
{
    Kvf__Hello hello;
    char copy[64];

    snprintf(copy, sizeof(copy), "%s", name);
    kvf__hello__init(&hello);
    hello.request_id       = 7;
    hello.protocol_version = KVF_PROTOCOL_VERSION;
    hello.kind             = KVF__PEER_KIND__PEER_AGENT;
    hello.name             = copy;
    hello.role             = KVF__ROLE__ROLE_DECODE;
    cr_assert_eq(kvf_frame_encode(buf, KVF_MSG_HELLO, 0, &hello.base,
                                  KVF_FRAME_MAX_DEFAULT),
                 KVF_OK);
}

static void put_hdr(uint8_t *p, uint32_t len, uint16_t type, uint16_t flags)
{
    p[0] = (uint8_t)len;
    p[1] = (uint8_t)(len >> 8);
    p[2] = (uint8_t)(len >> 16);
    p[3] = (uint8_t)(len >> 24);
    p[4] = (uint8_t)type;
    p[5] = (uint8_t)(type >> 8);
    p[6] = (uint8_t)flags;
    p[7] = (uint8_t)(flags >> 8);
}

Test(frame, roundtrip)
{
    kvf_frame_t frame;
    Kvf__Hello *hello;

    encode_hello(g_buf, "agent-a");
    cr_assert_eq(kvf_frame_decode(g_buf, KVF_FRAME_MAX_DEFAULT, NULL, &frame),
                 KVF_OK);
    cr_assert_eq(frame.type, KVF_MSG_HELLO);
    cr_assert_eq(frame.flags, 0);
    hello = (Kvf__Hello *)frame.msg;
    cr_assert_eq(hello->request_id, 7);
    cr_assert_str_eq(hello->name, "agent-a");
    cr_assert_eq(hello->role, KVF__ROLE__ROLE_DECODE);
    cr_assert_eq(evbuffer_get_length(g_buf), 0, "frame drained");
    kvf_frame_release(&frame, NULL);
    cr_assert_null(frame.msg);
}

Test(frame, header_is_little_endian_length_type_flags)
{
    uint8_t hdr[KVF_FRAME_HDR_SIZE];
    size_t total;

    encode_hello(g_buf, "x");
    total = evbuffer_get_length(g_buf);
    evbuffer_copyout(g_buf, hdr, sizeof(hdr));
    cr_assert_eq(hdr[0] | (hdr[1] << 8) | (hdr[2] << 16) | (hdr[3] << 24),
                 (int)(total - KVF_FRAME_HDR_SIZE));
    cr_assert_eq(hdr[4], KVF_MSG_HELLO);
    cr_assert_eq(hdr[5], 0);
    cr_assert_eq(hdr[6], 0);
}

Test(frame, incremental_byte_by_byte)
{
    struct evbuffer *src = evbuffer_new();
    struct evbuffer *dst = g_buf;
    kvf_frame_t frame;
    uint8_t byte;
    size_t total, i;

    encode_hello(src, "incremental");
    encode_hello(src, "second");
    total = evbuffer_get_length(src);
    for (i = 0; i < total; i++) {
        kvf_status_t status;

        evbuffer_remove(src, &byte, 1);
        evbuffer_add(dst, &byte, 1);
        status = kvf_frame_decode(dst, KVF_FRAME_MAX_DEFAULT, NULL, &frame);
        if (status == KVF_OK) {
            cr_assert(evbuffer_get_length(dst) == 0);
            kvf_frame_release(&frame, NULL);
            continue;
        }
        cr_assert_eq(status, KVF_INPROGRESS, "byte %zu", i);
    }
    evbuffer_free(src);
}

Test(frame, oversized_rejected_before_payload_arrives)
{
    uint8_t hdr[KVF_FRAME_HDR_SIZE];
    kvf_frame_t frame;

    put_hdr(hdr, 0xfffffff0u, KVF_MSG_HELLO, 0);
    evbuffer_add(g_buf, hdr, sizeof(hdr));
    cr_assert_eq(kvf_frame_decode(g_buf, KVF_FRAME_MAX_DEFAULT, NULL, &frame),
                 KVF_ERR_TOO_BIG);

    /* a configurable limit: a valid frame over a small maximum */
    evbuffer_drain(g_buf, evbuffer_get_length(g_buf));
    encode_hello(g_buf, "a-name-longer-than-the-limit");
    cr_assert_eq(kvf_frame_decode(g_buf, 8, NULL, &frame), KVF_ERR_TOO_BIG);
}

Test(frame, unknown_type_and_flags_rejected)
{
    uint8_t hdr[KVF_FRAME_HDR_SIZE];
    kvf_frame_t frame;

    put_hdr(hdr, 0, 999, 0);
    evbuffer_add(g_buf, hdr, sizeof(hdr));
    cr_assert_eq(kvf_frame_decode(g_buf, KVF_FRAME_MAX_DEFAULT, NULL, &frame),
                 KVF_ERR_PROTO);
    evbuffer_drain(g_buf, evbuffer_get_length(g_buf));
    put_hdr(hdr, 0, 5 /* unassigned */, 0);
    evbuffer_add(g_buf, hdr, sizeof(hdr));
    cr_assert_eq(kvf_frame_decode(g_buf, KVF_FRAME_MAX_DEFAULT, NULL, &frame),
                 KVF_ERR_PROTO);
    evbuffer_drain(g_buf, evbuffer_get_length(g_buf));
    put_hdr(hdr, 0, KVF_MSG_HELLO, 0x8000);
    evbuffer_add(g_buf, hdr, sizeof(hdr));
    cr_assert_eq(kvf_frame_decode(g_buf, KVF_FRAME_MAX_DEFAULT, NULL, &frame),
                 KVF_ERR_PROTO);
}

Test(frame, garbage_payload_rejected)
{
    uint8_t bytes[KVF_FRAME_HDR_SIZE + 6];
    kvf_frame_t frame;

    put_hdr(bytes, 6, KVF_MSG_REGISTER, 0);
    /* field 2 (string) claiming 100 bytes with only 4 present */
    bytes[8]  = 0x12;
    bytes[9]  = 100;
    bytes[10] = 'a';
    bytes[11] = 'b';
    bytes[12] = 'c';
    bytes[13] = 'd';
    evbuffer_add(g_buf, bytes, sizeof(bytes));
    cr_assert_eq(kvf_frame_decode(g_buf, KVF_FRAME_MAX_DEFAULT, NULL, &frame),
                 KVF_ERR_PROTO);
    cr_assert_eq(evbuffer_get_length(g_buf), 0, "bad frame consumed");
}

Test(frame, decode_buf_never_reads_past_len)
{
    uint8_t *exact;
    kvf_frame_t frame;
    size_t total, used = 0, cut;

    encode_hello(g_buf, "bounded");
    total = evbuffer_get_length(g_buf);
    /* an exact-size heap copy: ASan flags any read past the end */
    for (cut = 0; cut <= total; cut++) {
        exact = malloc(cut == 0 ? 1 : cut);
        evbuffer_copyout(g_buf, exact, cut);
        if (cut < total) {
            cr_assert_eq(kvf_frame_decode_buf(exact, cut, KVF_FRAME_MAX_DEFAULT,
                                              NULL, &frame, &used),
                         KVF_INPROGRESS, "cut %zu", cut);
        } else {
            cr_assert_eq(kvf_frame_decode_buf(exact, cut, KVF_FRAME_MAX_DEFAULT,
                                              NULL, &frame, &used),
                         KVF_OK);
            cr_assert_eq(used, total);
            kvf_frame_release(&frame, NULL);
        }
        free(exact);
    }
}

Test(frame, pack_into_buffer)
{
    uint8_t buf[256];
    Kvf__KeyBatch batch;
    uint8_t keys[2 * 24];
    kvf_frame_t frame;
    size_t len = 0, used = 0;

    memset(keys, 0xab, sizeof(keys));
    kvf__key_batch__init(&batch);
    batch.node_id   = 3;
    batch.seq       = 99;
    batch.keys.data = keys;
    batch.keys.len  = sizeof(keys);
    cr_assert_eq(kvf_frame_pack(buf, sizeof(buf), KVF_MSG_ADMIT,
                                KVF_FRAME_FLAG_REPLY, &batch.base,
                                KVF_FRAME_MAX_DEFAULT, &len),
                 KVF_OK);
    cr_assert_eq(len, kvf_frame_size(&batch.base));
    cr_assert_eq(kvf_frame_decode_buf(buf, len, KVF_FRAME_MAX_DEFAULT, NULL,
                                      &frame, &used),
                 KVF_OK);
    cr_assert_eq(frame.flags, KVF_FRAME_FLAG_REPLY);
    cr_assert_eq(((Kvf__KeyBatch *)frame.msg)->seq, 99);
    cr_assert_eq(((Kvf__KeyBatch *)frame.msg)->keys.len, sizeof(keys));
    kvf_frame_release(&frame, NULL);

    cr_assert_eq(kvf_frame_pack(buf, 10, KVF_MSG_ADMIT, 0, &batch.base,
                                KVF_FRAME_MAX_DEFAULT, &len),
                 KVF_ERR_TOO_BIG);
}

Test(frame, encode_checks_type_matches_message)
{
    Kvf__Hello hello;

    kvf__hello__init(&hello);
    cr_assert_eq(kvf_frame_encode(g_buf, KVF_MSG_LOOKUP, 0, &hello.base,
                                  KVF_FRAME_MAX_DEFAULT),
                 KVF_ERR_INVALID);
    cr_assert_eq(kvf_frame_encode(g_buf, KVF_MSG_HELLO, 0x10, &hello.base,
                                  KVF_FRAME_MAX_DEFAULT),
                 KVF_ERR_INVALID);
    cr_assert_eq(
        kvf_frame_encode(g_buf, 9999, 0, &hello.base, KVF_FRAME_MAX_DEFAULT),
        KVF_ERR_INVALID);
    cr_assert_eq(evbuffer_get_length(g_buf), 0, "nothing written on error");
}

Test(frame, type_names)
{
    cr_assert_str_eq(kvf_msg_type_name(KVF_MSG_LOOKUP_REPLY), "LOOKUP_REPLY");
    cr_assert_str_eq(kvf_msg_type_name(KVF_MSG_AUTH), "AUTH");
    cr_assert_str_eq(kvf_msg_type_name(5), "UNKNOWN");
    cr_assert_str_eq(kvf_msg_type_name(60000), "UNKNOWN");
}

Test(frame, random_garbage_never_crashes)
{
    uint8_t junk[512];
    kvf_frame_t frame;
    size_t used;
    int round, i;

    srand(1234);
    for (round = 0; round < 2000; round++) {
        size_t len = (size_t)(rand() % (int)sizeof(junk));
        for (i = 0; i < (int)len; i++) {
            junk[i] = (uint8_t)rand();
        }
        if (len >= 8) {
            /* keep the length plausible so payload decoding is reached */
            put_hdr(junk, (uint32_t)(len - 8), (uint16_t)(rand() % 30), 0);
        }
        if (kvf_frame_decode_buf(junk, len, KVF_FRAME_MAX_DEFAULT, NULL, &frame,
                                 &used) == KVF_OK) {
            kvf_frame_release(&frame, NULL);
        }
    }
}
