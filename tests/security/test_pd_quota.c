/* SPDX-License-Identifier: Apache-2.0 */
/* Copyright (c) 2026 The kvfabric authors */
/*
 * PD receive-slot quota per peer (issue #16.6): a rogue peer (no secret in
 * this cluster, so its pushes are accepted) opens PD requests at a decoder
 * until it holds pd_peer_max_bytes of the receive region; past that its
 * PD_ALLOCs are refused and counted, and a real prefill agent still pushes
 * and the decode engine gets every byte.
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

#define CHUNK      (256u << 10)
#define ROGUE_REQS 8u

static kvf_th_ctl_t g_ctl;
static kvf_sec_agent_t g_dec, g_pre;

static void setup(void)
{
    const char *const dec[] = {
        "--role", "decode", "--pd-buffer-size", "4M", "--pd-peer-max-bytes",
        "1M",     NULL};
    const char *const pre[] = {"--role", "prefill", NULL};

    kvf_th_ctl_start(&g_ctl, NULL);
    kvf_sec_agent_start(&g_dec, g_ctl.addr, "quota-d", dec);
    kvf_sec_agent_start(&g_pre, g_ctl.addr, "quota-p", pre);
}

static void teardown(void)
{
    kvf_test_proc_stop(&g_pre.proc, 10000);
    kvf_test_proc_stop(&g_dec.proc, 10000);
    kvf_th_ctl_stop(&g_ctl);
    kvf_test_check_leaks();
}

TestSuite(pd_quota, .init = setup, .fini = teardown, .timeout = 60);

static kvf_client_t *connect_to(const kvf_sec_agent_t *a)
{
    kvf_client_params_t p = {.field_mask = KVF_CLIENT_PARAM_SOCKET |
                                           KVF_CLIENT_PARAM_TIMEOUT,
                             .socket_path = a->sock,
                             .timeout_ns  = 10000000000ull};
    kvf_client_t *c       = NULL;

    cr_assert_eq(kvf_client_connect(&p, &c), KVF_OK);
    return c;
}

static bool metric_becomes(const char *series, long long want, int ms)
{
    int n;

    for (n = 0; n < ms / 10; n++) {
        if (kvf_sec_metric(&g_dec, series) == want) {
            return true;
        }
        poll(NULL, 0, 10);
    }
    return kvf_sec_metric(&g_dec, series) == want;
}

/* Sends @p msg as one frame of @p type on mesh id @p am (eager, header
 * and no payload for PD_DATA, the frame as payload otherwise); asserts. */
static void rogue_send_frame(kvf_rogue_t *rogue, uint16_t am, uint16_t type,
                             const ProtobufCMessage *msg)
{
    uint8_t frame[512];
    size_t len        = 0;
    const bool is_hdr = (am == KVF_MESH_AM_PD_DATA);

    cr_assert_eq(
        kvf_frame_pack(frame, sizeof(frame), type, 0, msg, sizeof(frame), &len),
        KVF_OK);
    cr_assert_eq(kvf_rogue_send(rogue, am, is_hdr ? frame : NULL,
                                is_hdr ? len : 0, is_hdr ? NULL : frame,
                                is_hdr ? 0 : len, false),
                 KVF_OK);
}

Test(pd_quota, a_peer_holds_at_most_its_share_of_the_receive_region)
{
    uint64_t lengths[1] = {CHUNK};
    kvf_slot_t slots[2], got[2];
    Kvf__PdAlloc alloc;
    kvf_client_t *pc, *dc;
    kvf_rogue_t *rogue;
    uint32_t k, num = 0;
    uint64_t sums[2];

    /* the rogue asks for 8 x 256 KiB: 4 fit its 1 MiB */
    rogue = kvf_rogue_create(g_dec.data);
    for (k = 0; k < ROGUE_REQS; k++) {
        kvf__pd_alloc__init(&alloc);
        alloc.request_id = 1000 + k;
        alloc.ticket     = 77 + k;
        alloc.n_lengths  = 1;
        alloc.lengths    = lengths;
        alloc.final      = true;
        rogue_send_frame(rogue, KVF_MESH_AM_PD_CTRL, KVF_MSG_PD_ALLOC,
                         &alloc.base);
    }
    for (k = 0; (k < 200) &&
                (kvf_rogue_received(rogue, KVF_MESH_AM_PD_CTRL) < ROGUE_REQS);
         k++) {
        kvf_rogue_progress(rogue, 10);
    }
    cr_assert_eq(kvf_rogue_received(rogue, KVF_MESH_AM_PD_CTRL), ROGUE_REQS,
                 "the decoder answered %u of %u PD_ALLOCs",
                 kvf_rogue_received(rogue, KVF_MESH_AM_PD_CTRL), ROGUE_REQS);
    cr_assert(metric_becomes("kvf_agent_pd_quota_refusals_total",
                             ROGUE_REQS - 4, 2000),
              "refusals: %lld",
              kvf_sec_metric(&g_dec, "kvf_agent_pd_quota_refusals_total"));
    cr_assert_eq(
        kvf_sec_metric(&g_dec, "kvf_agent_pd_region_bytes{state=\"used\"}"),
        4 * CHUNK);

    /* a real prefill agent still pushes, and every byte arrives */
    pc = connect_to(&g_pre);
    cr_assert_eq(kvf_client_alloc(pc, CHUNK, 2, slots), KVF_OK);
    for (k = 0; k < 2; k++) {
        uint8_t *p = (uint8_t *)kvf_client_pool_base(pc) + slots[k].offset;

        memset(p, 0x61 + (int)k, CHUNK);
        sums[k] = kvf_chunk_checksum(p, CHUNK);
    }
    cr_assert_eq(kvf_pd_push(pc, 5, "quota-d", slots, sums, 2, true), KVF_OK,
                 "%s", kvf_client_last_error(pc));
    kvf_client_release(pc, slots, 2);
    dc = connect_to(&g_dec);
    cr_assert_eq(kvf_pd_wait(dc, 5, 5000000000ull, got, 2, &num), KVF_OK, "%s",
                 kvf_client_last_error(dc));
    cr_assert_eq(num, 2);
    for (k = 0; k < 2; k++) {
        const uint8_t *p =
            (const uint8_t *)kvf_client_pool_base(dc) + got[k].offset;

        cr_assert_eq(p[0], 0x61 + k);
        cr_assert_eq(p[CHUNK - 1], 0x61 + k);
    }
    cr_assert_eq(kvf_pd_release(dc, 5), KVF_OK);
    kvf_client_disconnect(dc);
    kvf_client_disconnect(pc);
    kvf_rogue_destroy(rogue);
    cr_assert(kvf_test_proc_alive(&g_dec.proc));
}

/* A rogue that reserved slots claims it wrote them on this host
 * (PD_DATA copied) without ever being passed the receive region: declined,
 * the request aborted, the slots back; the waiting engine gets an error,
 * never the region's stale bytes. */
Test(pd_quota, in_place_pd_data_from_a_peer_given_no_region_is_declined)
{
    uint64_t lengths[1] = {CHUNK}, sums[1];
    uint8_t *zero       = calloc(1, CHUNK);
    Kvf__PdAlloc alloc;
    Kvf__PdDone done;
    Kvf__PdData data;
    kvf_client_t *dc;
    kvf_slot_t got[1];
    kvf_rogue_t *rogue;
    uint32_t num = 0;
    int k;

    /* the checksum of what a fresh region holds: only the refusal can
     * keep those bytes from an engine */
    cr_assert_not_null(zero);
    sums[0] = kvf_chunk_checksum(zero, CHUNK);
    free(zero);
    rogue = kvf_rogue_create(g_dec.data);
    kvf__pd_alloc__init(&alloc);
    alloc.request_id  = 2000;
    alloc.ticket      = 5;
    alloc.n_lengths   = 1;
    alloc.lengths     = lengths;
    alloc.n_checksums = 1;
    alloc.checksums   = sums;
    alloc.final       = true;
    rogue_send_frame(rogue, KVF_MESH_AM_PD_CTRL, KVF_MSG_PD_ALLOC, &alloc.base);
    for (k = 0;
         (k < 200) && (kvf_rogue_received(rogue, KVF_MESH_AM_PD_CTRL) < 1);
         k++) {
        kvf_rogue_progress(rogue, 10);
    }
    cr_assert_eq(
        kvf_sec_metric(&g_dec, "kvf_agent_pd_region_bytes{state=\"used\"}"),
        CHUNK);
    /* "in place" for the reserved chunk: no payload, nothing copied */
    kvf__pd_data__init(&data);
    data.request_id = 2000;
    data.batch      = 1; /* a fresh decoder's first reservation */
    data.index      = 0;
    data.count      = 1;
    data.length     = CHUNK;
    data.copied     = true;
    rogue_send_frame(rogue, KVF_MESH_AM_PD_DATA, KVF_MSG_PD_DATA, &data.base);
    kvf__pd_done__init(&done);
    done.request_id  = 2000;
    done.ticket      = 5;
    done.batch       = 1;
    done.n_checksums = 1;
    done.checksums   = sums;
    done.final       = true;
    rogue_send_frame(rogue, KVF_MESH_AM_PD_CTRL, KVF_MSG_PD_DONE, &done.base);
    cr_assert(
        metric_becomes("kvf_agent_pd_region_bytes{state=\"used\"}", 0, 2000));
    cr_assert_eq(kvf_sec_metric(
                     &g_dec, "kvf_agent_pd_same_host_total{dir=\"received\"}"),
                 0);
    dc = connect_to(&g_dec);
    cr_assert_eq(kvf_pd_wait(dc, 2000, 1000000000ull, got, 1, &num),
                 KVF_ERR_CANCELED, "%s", kvf_client_last_error(dc));
    cr_assert_eq(num, 0);
    kvf_client_disconnect(dc);
    kvf_rogue_destroy(rogue);
}
