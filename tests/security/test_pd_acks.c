/* SPDX-License-Identifier: Apache-2.0 */
/* Copyright (c) 2026 The kvfabric authors */
/*
 * PD acknowledgements (issue #18.2) across versions, with the rogue peer
 * playing the prefill agent at a real decoder: a sender that does not set
 * PdAlloc.done_implied (an agent from before it) still needs PD_DONE and
 * gets its ack after it; one that does gets acks without sending PD_DONE,
 * those of one loop pass coalesced in PdDoneReply.more, each push acked
 * exactly once; a damaged chunk is answered at once; a PD_DONE the
 * decoder did not ask for is dropped and counted. Every decode engine gets
 * exactly the pushed bytes.
 */
#include "agent/mesh.h"
#include "proto/frame.h"
#include "tests/helpers/proc.h"
#include "tests/helpers/test_helpers.h"
#include "tests/integration/controller_harness.h"
#include "tests/security/rogue.h"

#include <kvfabric/kvfabric.h>

#include <criterion/criterion.h>

#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CHUNK (16u << 10)
#define REQS  8u

static kvf_th_ctl_t g_ctl;
static kvf_sec_agent_t g_dec;

static void setup(void)
{
    const char *const dec[] = {"--role", "decode", "--pd-buffer-size", "4M",
                               NULL};

    kvf_th_ctl_start(&g_ctl, NULL);
    kvf_sec_agent_start(&g_dec, g_ctl.addr, "acks-d", dec);
}

static void teardown(void)
{
    kvf_test_proc_stop(&g_dec.proc, 10000);
    kvf_th_ctl_stop(&g_ctl);
    kvf_test_check_leaks();
}

TestSuite(pd_acks, .init = setup, .fini = teardown, .timeout = 60);

static uint8_t g_bytes[REQS][2][CHUNK];

static void fill(uint32_t req, uint32_t index)
{
    size_t i;

    for (i = 0; i < CHUNK; i++) {
        g_bytes[req][index][i] = (uint8_t)(req * 29u + index * 13u + i * 7u);
    }
}

static void send_frame(kvf_rogue_t *rogue, uint16_t type,
                       const ProtobufCMessage *msg)
{
    uint8_t frame[512];
    size_t len = 0;

    cr_assert_eq(
        kvf_frame_pack(frame, sizeof(frame), type, 0, msg, sizeof(frame), &len),
        KVF_OK);
    cr_assert_eq(
        kvf_rogue_send(rogue, KVF_MESH_AM_PD_CTRL, NULL, 0, frame, len, false),
        KVF_OK);
}

/* The checksums of chunks 0 .. @p n - 1 of g_bytes[@p slot]. */
static void sums_of(uint32_t slot, uint32_t n, uint64_t *sums)
{
    uint32_t k;

    for (k = 0; k < n; k++) {
        sums[k] = kvf_chunk_checksum(g_bytes[slot][k], CHUNK);
    }
}

/* PD_ALLOC of @p n chunks of request @p req (checksums of g_bytes[slot]),
 * its place @p piece among the request's pushes (0: none given). */
static void send_piece(kvf_rogue_t *rogue, uint64_t req, uint64_t ticket,
                       uint32_t slot, uint32_t n, bool done_implied, bool final,
                       uint32_t piece)
{
    uint64_t lengths[2] = {CHUNK, CHUNK}, sums[2];
    Kvf__PdAlloc alloc;

    sums_of(slot, n, sums);
    kvf__pd_alloc__init(&alloc);
    alloc.request_id   = req;
    alloc.ticket       = ticket;
    alloc.n_lengths    = n;
    alloc.lengths      = lengths;
    alloc.n_checksums  = n;
    alloc.checksums    = sums;
    alloc.final        = final;
    alloc.done_implied = done_implied;
    alloc.piece        = piece;
    send_frame(rogue, KVF_MSG_PD_ALLOC, &alloc.base);
}

/* The whole of request @p req in one push (as an agent of an older
 * version sends it). */
static void send_alloc(kvf_rogue_t *rogue, uint64_t req, uint64_t ticket,
                       uint32_t slot, uint32_t n, bool done_implied)
{
    send_piece(rogue, req, ticket, slot, n, done_implied, true, 0);
}

static void send_data_as(kvf_rogue_t *rogue, uint64_t req, uint64_t batch,
                         uint32_t index, const void *bytes, bool is_rndv)
{
    uint8_t hdr[256];
    size_t len = 0;
    Kvf__PdData data;

    kvf__pd_data__init(&data);
    data.request_id = req;
    data.batch      = batch;
    data.index      = index;
    data.length     = CHUNK;
    cr_assert_eq(kvf_frame_pack(hdr, sizeof(hdr), KVF_MSG_PD_DATA, 0,
                                &data.base, sizeof(hdr), &len),
                 KVF_OK);
    cr_assert_eq(kvf_rogue_send(rogue, KVF_MESH_AM_PD_DATA, hdr, len, bytes,
                                CHUNK, is_rndv),
                 KVF_OK);
}

static void send_data(kvf_rogue_t *rogue, uint64_t req, uint64_t batch,
                      uint32_t index, const void *bytes)
{
    send_data_as(rogue, req, batch, index, bytes, true);
}

static void send_done(kvf_rogue_t *rogue, uint64_t req, uint64_t ticket,
                      uint64_t batch, uint32_t slot, uint32_t n)
{
    uint64_t sums[2];
    Kvf__PdDone done;

    sums_of(slot, n, sums);
    kvf__pd_done__init(&done);
    done.request_id  = req;
    done.ticket      = ticket;
    done.batch       = batch;
    done.n_checksums = n;
    done.checksums   = sums;
    done.final       = true;
    send_frame(rogue, KVF_MSG_PD_DONE, &done.base);
}

/* Progresses until the rogue got @p n PD control messages in all (or 5 s);
 * returns how many it got. */
static unsigned wait_ctrl(kvf_rogue_t *rogue, unsigned n)
{
    int k;

    for (k = 0;
         (k < 500) && (kvf_rogue_received(rogue, KVF_MESH_AM_PD_CTRL) < n);
         k++) {
        kvf_rogue_progress(rogue, 10);
    }
    return kvf_rogue_received(rogue, KVF_MESH_AM_PD_CTRL);
}

/* The @p nth PD control message the rogue received, decoded; asserts its
 * type. Release with kvf_frame_release. */
static void ctrl_msg(kvf_rogue_t *rogue, unsigned nth, uint16_t type,
                     kvf_frame_t *frame)
{
    const void *data;
    size_t len = 0, used = 0;

    data = kvf_rogue_message(rogue, KVF_MESH_AM_PD_CTRL, nth, &len);
    cr_assert_not_null(data, "PD control message %u was not kept", nth);
    cr_assert_eq(kvf_frame_decode_buf(data, len, KVF_FRAME_MAX_DEFAULT, NULL,
                                      frame, &used),
                 KVF_OK);
    cr_assert_eq(frame->type, type, "message %u is %s, not %s", nth,
                 kvf_msg_type_name(frame->type), kvf_msg_type_name(type));
}

/* The decoder's batch for an accepted PD_ALLOC (message @p nth). */
static uint64_t alloc_reply(kvf_rogue_t *rogue, unsigned nth, uint64_t ticket,
                            bool done_implied)
{
    const Kvf__PdAllocReply *r;
    kvf_frame_t frame;
    uint64_t batch;

    ctrl_msg(rogue, nth, KVF_MSG_PD_ALLOC_REPLY, &frame);
    r = (const Kvf__PdAllocReply *)frame.msg;
    cr_assert_eq(r->status, KVF_OK, "%s", r->message);
    cr_assert_eq(r->ticket, ticket);
    cr_assert_eq(r->done_implied, done_implied);
    batch = r->batch;
    kvf_frame_release(&frame, NULL);
    return batch;
}

static kvf_client_t *connect_dec(void)
{
    kvf_client_params_t p = {.field_mask = KVF_CLIENT_PARAM_SOCKET |
                                           KVF_CLIENT_PARAM_TIMEOUT,
                             .socket_path = g_dec.sock,
                             .timeout_ns  = 10000000000ull};
    kvf_client_t *c       = NULL;

    cr_assert_eq(kvf_client_connect(&p, &c), KVF_OK);
    return c;
}

/* The decode engine gets request @p req: @p n chunks, g_bytes[slot]. */
static void engine_gets(kvf_client_t *dc, uint64_t req, uint32_t slot,
                        uint32_t n)
{
    kvf_slot_t got[2];
    uint32_t num = 0, k;

    cr_assert_eq(kvf_pd_wait(dc, req, 5000000000ull, got, 2, &num), KVF_OK,
                 "%s", kvf_client_last_error(dc));
    cr_assert_eq(num, n);
    for (k = 0; k < n; k++) {
        cr_assert_eq(got[k].length, CHUNK);
        cr_assert(
            memcmp((const uint8_t *)kvf_client_pool_base(dc) + got[k].offset,
                   g_bytes[slot][k], CHUNK) == 0,
            "request %llu chunk %u: wrong bytes", (unsigned long long)req, k);
    }
    cr_assert_eq(kvf_pd_release(dc, req), KVF_OK);
}

Test(pd_acks, a_sender_without_done_implied_still_needs_pd_done)
{
    const Kvf__PdDoneReply *r;
    kvf_frame_t frame;
    kvf_rogue_t *rogue;
    kvf_client_t *dc;
    uint64_t batch;

    fill(0, 0);
    fill(0, 1);
    rogue = kvf_rogue_create(g_dec.data);
    send_alloc(rogue, 3000, 41, 0, 2, false);
    cr_assert_eq(wait_ctrl(rogue, 1), 1);
    batch = alloc_reply(rogue, 0, 41, false);
    send_data(rogue, 3000, batch, 0, g_bytes[0][0]);
    send_data(rogue, 3000, batch, 1, g_bytes[0][1]);
    /* every chunk landed, but an old sender's push ends at its PD_DONE */
    kvf_rogue_progress(rogue, 300);
    cr_assert_eq(kvf_rogue_received(rogue, KVF_MESH_AM_PD_CTRL), 1,
                 "the decoder acknowledged before PD_DONE");
    cr_assert_eq(kvf_sec_metric(&g_dec, "kvf_agent_pd_requests_ready_total"),
                 0);
    send_done(rogue, 3000, 41, batch, 0, 2);
    cr_assert_eq(wait_ctrl(rogue, 2), 2);
    ctrl_msg(rogue, 1, KVF_MSG_PD_DONE_REPLY, &frame);
    r = (const Kvf__PdDoneReply *)frame.msg;
    cr_assert_eq(r->status, KVF_OK, "%s", r->message);
    cr_assert_eq(r->ticket, 41);
    cr_assert_eq(r->n_more, 0);
    kvf_frame_release(&frame, NULL);
    cr_assert_eq(kvf_sec_metric(&g_dec, "kvf_agent_pd_implied_done_total"), 0);
    dc = connect_dec();
    engine_gets(dc, 3000, 0, 2);
    kvf_client_disconnect(dc);
    kvf_rogue_destroy(rogue);
}

Test(pd_acks, done_implied_pushes_are_acked_once_each_without_pd_done)
{
    uint64_t batch[REQS];
    unsigned acked[REQS] = {0}, msgs, m, k;
    const Kvf__PdDoneReply *r;
    kvf_frame_t frame;
    kvf_rogue_t *rogue;
    kvf_client_t *dc;
    size_t i;

    rogue = kvf_rogue_create(g_dec.data);
    for (k = 0; k < REQS; k++) {
        fill(k, 0);
        send_alloc(rogue, 3100 + k, 100 + k, k, 1, true);
    }
    cr_assert_eq(wait_ctrl(rogue, REQS), REQS);
    for (k = 0; k < REQS; k++) {
        batch[k] = alloc_reply(rogue, k, 100 + k, true);
    }
    /* the data alone ends each push: no PD_DONE from here on; eager and
     * back to back, so that several land in one pass of the decoder */
    for (k = 0; k < REQS; k++) {
        send_data_as(rogue, 3100 + k, batch[k], 0, g_bytes[k][0], false);
    }
    for (k = 0;
         (k < 500) && (kvf_sec_metric(&g_dec, "kvf_agent_pd_acks_"
                                              "total{kind=\"push\"}") < REQS);
         k++) {
        kvf_rogue_progress(rogue, 10);
    }
    cr_assert_eq(
        kvf_sec_metric(&g_dec, "kvf_agent_pd_acks_total{kind=\"push\"}"), REQS);
    kvf_rogue_progress(rogue, 100);
    msgs = kvf_rogue_received(rogue, KVF_MESH_AM_PD_CTRL) - REQS;
    cr_assert((msgs >= 1) && (msgs <= REQS), "%u ack messages", msgs);
    cr_log_info("%u pushes acknowledged in %u PD_DONE_REPLYs", REQS, msgs);
    for (m = 0; m < msgs; m++) {
        ctrl_msg(rogue, REQS + m, KVF_MSG_PD_DONE_REPLY, &frame);
        r = (const Kvf__PdDoneReply *)frame.msg;
        cr_assert_eq(r->status, KVF_OK, "%s", r->message);
        cr_assert((r->ticket >= 100) && (r->ticket < 100 + REQS));
        cr_assert_eq(r->request_id, 3100 + (r->ticket - 100));
        acked[r->ticket - 100]++;
        for (i = 0; i < r->n_more; i++) {
            cr_assert((r->more[i]->ticket >= 100) &&
                      (r->more[i]->ticket < 100 + REQS));
            cr_assert_eq(r->more[i]->request_id,
                         3100 + (r->more[i]->ticket - 100));
            acked[r->more[i]->ticket - 100]++;
        }
        kvf_frame_release(&frame, NULL);
    }
    for (k = 0; k < REQS; k++) {
        cr_assert_eq(acked[k], 1, "push %u acked %u times", k, acked[k]);
    }
    cr_assert_eq(kvf_sec_metric(&g_dec, "kvf_agent_pd_implied_done_total"),
                 REQS);
    cr_assert_eq(
        kvf_sec_metric(&g_dec, "kvf_agent_pd_acks_total{kind=\"message\"}"),
        msgs);
    dc = connect_dec();
    for (k = 0; k < REQS; k++) {
        engine_gets(dc, 3100 + k, k, 1);
    }
    kvf_client_disconnect(dc);
    kvf_rogue_destroy(rogue);
}

Test(pd_acks, done_implied_fails_at_the_last_chunk_and_ignores_pd_done)
{
    const Kvf__PdDoneReply *r;
    kvf_slot_t got[2];
    kvf_frame_t frame;
    kvf_rogue_t *rogue;
    kvf_client_t *dc;
    uint64_t batch, drops;
    uint32_t num = 0;
    uint8_t bad[CHUNK];

    fill(0, 0);
    fill(0, 1);
    fill(1, 0);
    fill(1, 1);
    rogue = kvf_rogue_create(g_dec.data);
    drops = kvf_sec_metric(
        &g_dec, "kvf_agent_mesh_dropped_total{reason=\"unexpected\"}");
    /* a PD_DONE amid an implied push is dropped; the push goes on */
    send_alloc(rogue, 3200, 51, 0, 2, true);
    cr_assert_eq(wait_ctrl(rogue, 1), 1);
    batch = alloc_reply(rogue, 0, 51, true);
    send_data(rogue, 3200, batch, 0, g_bytes[0][0]);
    send_done(rogue, 3200, 51, batch, 0, 2);
    kvf_rogue_progress(rogue, 200);
    cr_assert_eq(kvf_rogue_received(rogue, KVF_MESH_AM_PD_CTRL), 1);
    cr_assert_eq(
        kvf_sec_metric(&g_dec,
                       "kvf_agent_mesh_dropped_total{reason=\"unexpected\"}"),
        drops + 1);
    send_data(rogue, 3200, batch, 1, g_bytes[0][1]);
    cr_assert_eq(wait_ctrl(rogue, 2), 2);
    ctrl_msg(rogue, 1, KVF_MSG_PD_DONE_REPLY, &frame);
    r = (const Kvf__PdDoneReply *)frame.msg;
    cr_assert_eq(r->status, KVF_OK, "%s", r->message);
    cr_assert_eq(r->ticket, 51);
    kvf_frame_release(&frame, NULL);

    /* a chunk that does not match PD_ALLOC's checksum: the error comes as
     * the last chunk lands, nothing waits for a PD_DONE */
    send_alloc(rogue, 3201, 52, 1, 2, true);
    cr_assert_eq(wait_ctrl(rogue, 3), 3);
    batch = alloc_reply(rogue, 2, 52, true);
    memcpy(bad, g_bytes[1][1], CHUNK);
    bad[CHUNK / 2] ^= 0x40;
    send_data(rogue, 3201, batch, 0, g_bytes[1][0]);
    send_data(rogue, 3201, batch, 1, bad);
    cr_assert_eq(wait_ctrl(rogue, 4), 4);
    ctrl_msg(rogue, 3, KVF_MSG_PD_DONE_REPLY, &frame);
    r = (const Kvf__PdDoneReply *)frame.msg;
    cr_assert_eq(r->status, KVF_ERR_CHECKSUM, "status %d: %s", r->status,
                 r->message);
    cr_assert_eq(r->ticket, 52);
    cr_assert_eq(r->n_more, 0);
    kvf_frame_release(&frame, NULL);

    dc = connect_dec();
    engine_gets(dc, 3200, 0, 2);
    cr_assert_eq(kvf_pd_wait(dc, 3201, 1000000000ull, got, 2, &num),
                 KVF_ERR_CANCELED, "%s", kvf_client_last_error(dc));
    cr_assert_eq(num, 0);
    kvf_client_disconnect(dc);
    kvf_rogue_destroy(rogue);
}

/* The PD_ALLOC_REPLY to @p ticket among the first @p n PD control
 * messages: its status, its batch in @p batch_p; asserts there is one. */
static int32_t reply_to(kvf_rogue_t *rogue, unsigned n, uint64_t ticket,
                        uint64_t *batch_p)
{
    const Kvf__PdAllocReply *r;
    kvf_frame_t frame;
    int32_t status;
    unsigned m;

    for (m = 0; m < n; m++) {
        ctrl_msg(rogue, m, KVF_MSG_PD_ALLOC_REPLY, &frame);
        r = (const Kvf__PdAllocReply *)frame.msg;
        if (r->ticket == ticket) {
            status = r->status;
            cr_assert(r->pieces, "a decoder of this version orders pieces");
            if (batch_p != NULL) {
                *batch_p = r->batch;
            }
            kvf_frame_release(&frame, NULL);
            return status;
        }
        kvf_frame_release(&frame, NULL);
    }
    cr_assert_fail("no reply to ticket %llu", (unsigned long long)ticket);
    return 0;
}

Test(pd_acks, pieces_land_in_any_order_and_reach_the_engine_in_piece_order)
{
    uint64_t batch[3];
    kvf_slot_t got[3];
    kvf_rogue_t *rogue;
    kvf_client_t *dc;
    long long acks;
    uint32_t num = 0, k;

    rogue = kvf_rogue_create(g_dec.data);
    /* three pushes of one request reserved at once, the last final */
    for (k = 0; k < 3; k++) {
        fill(k, 0);
        send_piece(rogue, 3400, 200 + k, k, 1, true, k == 2, k + 1);
    }
    cr_assert_eq(wait_ctrl(rogue, 3), 3);
    for (k = 0; k < 3; k++) {
        cr_assert_eq(reply_to(rogue, 3, 200 + k, &batch[k]), KVF_OK);
    }
    cr_assert_eq(kvf_sec_metric(&g_dec, "kvf_agent_pd_pieces_total{kind=\""
                                        "overlapped\"}"),
                 2);
    /* their data lands last piece first, each verified before the next
     * is sent */
    acks = kvf_sec_metric(&g_dec, "kvf_agent_pd_acks_total{kind=\"push\"}");
    for (k = 3; k-- > 0;) {
        int t;

        send_data(rogue, 3400, batch[k], 0, g_bytes[k][0]);
        for (t = 0;
             (t < 500) &&
             (kvf_sec_metric(&g_dec, "kvf_agent_pd_acks_"
                                     "total{kind=\"push\"}") < acks + 3 - k);
             t++) {
            kvf_rogue_progress(rogue, 10);
        }
    }
    for (k = 0; (k < 300) && (kvf_sec_metric(&g_dec, "kvf_agent_pd_requests_"
                                                     "ready_total") < 1);
         k++) {
        kvf_rogue_progress(rogue, 10);
    }
    cr_assert_eq(kvf_sec_metric(&g_dec, "kvf_agent_pd_pieces_total{kind=\""
                                        "reordered\"}"),
                 2, "pieces 3 and 2 wait for piece 1");
    dc = connect_dec();
    cr_assert_eq(kvf_pd_wait(dc, 3400, 5000000000ull, got, 3, &num), KVF_OK,
                 "%s", kvf_client_last_error(dc));
    cr_assert_eq(num, 3);
    for (k = 0; k < 3; k++) {
        cr_assert(
            memcmp((const uint8_t *)kvf_client_pool_base(dc) + got[k].offset,
                   g_bytes[k][0], CHUNK) == 0,
            "chunk %u is not piece %u's", k, k + 1);
    }
    cr_assert_eq(kvf_pd_release(dc, 3400), KVF_OK);
    kvf_client_disconnect(dc);
    kvf_rogue_destroy(rogue);
}

Test(pd_acks, bad_pieces_are_refused_and_the_request_goes_on)
{
    uint64_t batch[2];
    kvf_rogue_t *rogue;
    kvf_client_t *dc;
    uint32_t k;

    fill(0, 0);
    fill(1, 0);
    rogue = kvf_rogue_create(g_dec.data);
    send_piece(rogue, 3500, 300, 0, 1, true, false, 1);
    cr_assert_eq(wait_ctrl(rogue, 1), 1);
    cr_assert_eq(reply_to(rogue, 1, 300, &batch[0]), KVF_OK);
    /* the same piece again; one far ahead of the first missing; a legacy
     * second push while one is in progress */
    send_piece(rogue, 3500, 301, 0, 1, true, false, 1);
    send_piece(rogue, 3500, 302, 0, 1, true, false, 1 + 64);
    send_piece(rogue, 3500, 303, 0, 1, true, false, 0);
    /* the final piece, then one after it and a final one before a later */
    send_piece(rogue, 3500, 304, 1, 1, true, true, 3);
    send_piece(rogue, 3500, 305, 0, 1, true, false, 4);
    send_piece(rogue, 3500, 306, 0, 1, true, true, 2);
    /* and piece 2 as it should be */
    send_piece(rogue, 3500, 307, 0, 1, true, false, 2);
    cr_assert_eq(wait_ctrl(rogue, 8), 8);
    cr_assert_eq(reply_to(rogue, 8, 301, NULL), KVF_ERR_EXISTS);
    cr_assert_eq(reply_to(rogue, 8, 302, NULL), KVF_ERR_BUSY);
    cr_assert_eq(reply_to(rogue, 8, 303, NULL), KVF_ERR_BUSY);
    cr_assert_eq(reply_to(rogue, 8, 304, &batch[1]), KVF_OK);
    cr_assert_eq(reply_to(rogue, 8, 305, NULL), KVF_ERR_INVALID);
    cr_assert_eq(reply_to(rogue, 8, 306, NULL), KVF_ERR_INVALID);
    /* none of that touched the request: pieces 1 and 3 and the late 2 */
    {
        uint64_t b2 = 0;

        cr_assert_eq(reply_to(rogue, 8, 307, &b2), KVF_OK);
        send_data(rogue, 3500, batch[0], 0, g_bytes[0][0]);
        send_data(rogue, 3500, batch[1], 0, g_bytes[1][0]);
        send_data(rogue, 3500, b2, 0, g_bytes[0][0]);
    }
    for (k = 0; (k < 300) && (kvf_sec_metric(&g_dec, "kvf_agent_pd_requests_"
                                                     "ready_total") < 1);
         k++) {
        kvf_rogue_progress(rogue, 10);
    }
    dc = connect_dec();
    {
        kvf_slot_t got[3];
        uint32_t num = 0;

        cr_assert_eq(kvf_pd_wait(dc, 3500, 5000000000ull, got, 3, &num), KVF_OK,
                     "%s", kvf_client_last_error(dc));
        cr_assert_eq(num, 3);
        cr_assert(
            memcmp((const uint8_t *)kvf_client_pool_base(dc) + got[2].offset,
                   g_bytes[1][0], CHUNK) == 0,
            "the final piece comes last");
    }
    cr_assert_eq(kvf_pd_release(dc, 3500), KVF_OK);
    kvf_client_disconnect(dc);
    kvf_rogue_destroy(rogue);
}

/* An old-style sender (PD_DONE) that calls a piece final in its PD_DONE
 * while a later piece of the request is held breaks the request's order:
 * that push is refused, the request aborted, and the later piece told. */
Test(pd_acks, pd_done_calling_a_piece_final_before_a_later_one_aborts)
{
    const Kvf__PdDoneReply *r;
    int32_t status[2] = {1, 1};
    uint64_t batch[2];
    kvf_frame_t frame;
    kvf_rogue_t *rogue;
    kvf_client_t *dc;
    kvf_slot_t got[2];
    uint32_t num = 0;
    unsigned m;

    fill(0, 0);
    fill(1, 0);
    rogue = kvf_rogue_create(g_dec.data);
    send_piece(rogue, 3600, 400, 0, 1, false, false, 1);
    send_piece(rogue, 3600, 401, 1, 1, false, false, 2);
    cr_assert_eq(wait_ctrl(rogue, 2), 2);
    cr_assert_eq(reply_to(rogue, 2, 400, &batch[0]), KVF_OK);
    cr_assert_eq(reply_to(rogue, 2, 401, &batch[1]), KVF_OK);
    send_data(rogue, 3600, batch[0], 0, g_bytes[0][0]);
    send_done(rogue, 3600, 400, batch[0], 0, 1); /* final = true */
    cr_assert_eq(wait_ctrl(rogue, 4), 4);
    for (m = 2; m < 4; m++) {
        ctrl_msg(rogue, m, KVF_MSG_PD_DONE_REPLY, &frame);
        r = (const Kvf__PdDoneReply *)frame.msg;
        cr_assert((r->ticket == 400) || (r->ticket == 401));
        status[r->ticket - 400] = r->status;
        kvf_frame_release(&frame, NULL);
    }
    cr_assert_eq(status[0], KVF_ERR_INVALID);
    cr_assert_eq(status[1], KVF_ERR_PROTO, "the later piece is told");
    dc = connect_dec();
    cr_assert_eq(kvf_pd_wait(dc, 3600, 1000000000ull, got, 2, &num),
                 KVF_ERR_CANCELED, "%s", kvf_client_last_error(dc));
    cr_assert_eq(num, 0);
    kvf_client_disconnect(dc);
    kvf_rogue_destroy(rogue);
}
