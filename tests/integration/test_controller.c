/* SPDX-License-Identifier: Apache-2.0 */
/* Copyright (c) 2026 The kvfabric authors */
#include "tests/helpers/test_helpers.h"
#include "tests/integration/controller_harness.h"

#include "common/time.h"

#include <criterion/criterion.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <unistd.h>

static kvf_th_ctl_t g_ctl;

static void ctl_teardown(void)
{
    if (g_ctl.pid > 0) {
        kvf_th_ctl_stop(&g_ctl);
    }
    kvf_test_check_leaks();
}

TestSuite(controller, .fini = ctl_teardown, .timeout = 60);

static void stop_clean(void)
{
    cr_assert_eq(kvf_th_ctl_stop(&g_ctl), 0,
                 "controller exit not clean (leak or crash)");
}

static int status_of(kvf_frame_t *frame)
{
    cr_assert_eq(frame->type, KVF_MSG_STATUS, "got %s",
                 kvf_msg_type_name(frame->type));
    return ((Kvf__Status *)frame->msg)->status;
}

static void stats_of(kvf_ctlconn_t *conn, Kvf__StatsReply *out)
{
    Kvf__StatsRequest req;
    kvf_frame_t frame;

    kvf__stats_request__init(&req);
    req.request_id = kvf_ctlconn_next_id(conn);
    cr_assert_eq(kvf_ctlconn_call(conn, KVF_MSG_STATS, &req.base, &frame),
                 KVF_OK);
    cr_assert_eq(frame.type, KVF_MSG_STATS_REPLY);
    *out         = *(Kvf__StatsReply *)frame.msg;
    out->message = NULL;
    kvf_frame_release(&frame, NULL);
}

Test(controller, register_admit_lookup_heartbeat)
{
    const char *args[] = {"--recovery-window", "0", NULL};
    kvf_ctlconn_t *a, *b;
    uint32_t na, nb, holders[10];
    kvf_frame_t frame;
    bool rec = true;

    kvf_th_ctl_start(&g_ctl, args);
    a  = kvf_th_connect(&g_ctl, KVF__PEER_KIND__PEER_AGENT);
    b  = kvf_th_connect(&g_ctl, KVF__PEER_KIND__PEER_AGENT);
    na = kvf_th_register(a, "node-a", 1, &rec);
    cr_assert_not(rec);
    nb = kvf_th_register(b, "node-b", 1, NULL);
    cr_assert_neq(na, nb);
    cr_assert_eq(kvf_th_batch(a, KVF_MSG_ADMIT, na, 1, 1, 0, 6, false), KVF_OK);
    cr_assert_eq(kvf_th_batch(b, KVF_MSG_ADMIT, nb, 1, 1, 4, 6, false), KVF_OK);
    /* prefix 0..9 assembled from two holders */
    cr_assert_eq(kvf_th_lookup(a, 0, 0, 10, holders, &rec), 10);
    cr_assert_not(rec);
    cr_assert_eq(holders[0], na);
    cr_assert_eq(holders[3], na);
    cr_assert_eq(holders[4], nb, "b covers the longest run from key 4");
    cr_assert_eq(holders[9], nb);
    /* requester preferred */
    cr_assert_eq(kvf_th_lookup(b, nb, 4, 2, holders, NULL), 2);
    cr_assert_eq(holders[0], nb);
    cr_assert_eq(kvf_th_batch(a, KVF_MSG_EVICT, na, 1, 2, 2, 1, false), KVF_OK);
    cr_assert_eq(kvf_th_lookup(a, 0, 0, 10, NULL, NULL), 2);
    kvf_th_heartbeat(a, na, 1, 2, &frame);
    cr_assert_eq(frame.type, KVF_MSG_HEARTBEAT_REPLY);
    cr_assert_eq(((Kvf__HeartbeatReply *)frame.msg)->n_commands, 0);
    kvf_frame_release(&frame, NULL);
    kvf_ctlconn_destroy(a);
    kvf_ctlconn_destroy(b);
    stop_clean();
}

Test(controller, tp_group_lookup_takes_the_shortest_rank)
{
    const char *args[] = {"--recovery-window", "0", NULL};
    kvf_ctlconn_t *a;
    uint32_t na;
    uint8_t keys[8 * KVF_KEY_WIRE_SIZE];
    Kvf__TpLookup lk;
    kvf_frame_t frame;

    kvf_th_ctl_start(&g_ctl, args);
    a  = kvf_th_connect(&g_ctl, KVF__PEER_KIND__PEER_AGENT);
    na = kvf_th_register(a, "rank0", 1, NULL);
    /* rank 0 chain: 0..3 (all held); rank 1 chain: 100..103 (2 held) */
    cr_assert_eq(kvf_th_batch(a, KVF_MSG_ADMIT, na, 1, 1, 0, 4, false), KVF_OK);
    cr_assert_eq(kvf_th_batch(a, KVF_MSG_ADMIT, na, 1, 2, 100, 2, false),
                 KVF_OK);
    kvf_th_keys(keys, 4, 0);
    kvf_th_keys(keys + 4 * KVF_KEY_WIRE_SIZE, 4, 100);
    kvf__tp_lookup__init(&lk);
    lk.request_id = 9;
    lk.tp_world   = 2;
    lk.keys.data  = keys;
    lk.keys.len   = sizeof(keys);
    cr_assert_eq(kvf_ctlconn_call(a, KVF_MSG_TP_LOOKUP, &lk.base, &frame),
                 KVF_OK);
    cr_assert_eq(frame.type, KVF_MSG_LOOKUP_REPLY);
    cr_assert_eq(((Kvf__LookupReply *)frame.msg)->hit_chunks, 2);
    kvf_frame_release(&frame, NULL);
    lk.tp_world = 3; /* 8 keys do not split in 3 */
    cr_assert_eq(kvf_ctlconn_call(a, KVF_MSG_TP_LOOKUP, &lk.base, &frame),
                 KVF_OK);
    cr_assert_eq(status_of(&frame), KVF_ERR_INVALID);
    kvf_frame_release(&frame, NULL);
    kvf_ctlconn_destroy(a);
    stop_clean();
}

Test(controller, lease_expiry_purges_holdings)
{
    const char *args[] = {"--lease", "1s", "--recovery-window", "0", NULL};
    kvf_ctlconn_t *a, *b;
    uint32_t na, nb;
    uint64_t deadline;
    char state[32];

    kvf_th_ctl_start(&g_ctl, args);
    a  = kvf_th_connect(&g_ctl, KVF__PEER_KIND__PEER_AGENT);
    b  = kvf_th_connect(&g_ctl, KVF__PEER_KIND__PEER_AGENT);
    na = kvf_th_register(a, "quiet", 1, NULL);
    nb = kvf_th_register(b, "chatty", 1, NULL);
    cr_assert_eq(kvf_th_batch(a, KVF_MSG_ADMIT, na, 1, 1, 0, 1000, false),
                 KVF_OK);
    cr_assert_eq(kvf_th_batch(b, KVF_MSG_ADMIT, nb, 1, 1, 5000, 10, false),
                 KVF_OK);
    deadline = kvf_time_deadline_ns(10 * KVF_NSEC_PER_SEC);
    do {
        kvf_frame_t frame;

        cr_assert(!kvf_time_expired(deadline), "node never expired");
        kvf_th_heartbeat(b, nb, 1, 1, &frame); /* b stays alive */
        kvf_frame_release(&frame, NULL);
        kvf_th_node_state(b, na, state, sizeof(state));
    } while (strcmp(state, "dead") != 0);
    cr_assert_eq(kvf_th_lookup(b, 0, 0, 10, NULL, NULL), 0);
    cr_assert_eq(kvf_th_lookup(b, 0, 5000, 10, NULL, NULL), 10,
                 "other node's state kept");
    /* the dead node's messages are stale now */
    cr_assert_eq(kvf_th_batch(a, KVF_MSG_ADMIT, na, 1, 2, 0, 1, false),
                 KVF_ERR_STALE);
    kvf_ctlconn_destroy(a);
    kvf_ctlconn_destroy(b);
    stop_clean();
}

Test(controller, deregister_and_new_incarnation_fence)
{
    const char *args[] = {"--recovery-window", "0", NULL};
    kvf_ctlconn_t *a;
    uint32_t n1, n2;
    Kvf__Deregister dr;
    kvf_frame_t frame;

    kvf_th_ctl_start(&g_ctl, args);
    a  = kvf_th_connect(&g_ctl, KVF__PEER_KIND__PEER_AGENT);
    n1 = kvf_th_register(a, "agent", 5, NULL);
    cr_assert_eq(kvf_th_batch(a, KVF_MSG_ADMIT, n1, 5, 1, 0, 3, false), KVF_OK);
    cr_assert_eq(kvf_th_register_status(a, "agent", 4), KVF_ERR_STALE);
    cr_assert_eq(kvf_th_register_status(a, "agent", 5), KVF_ERR_EXISTS);
    n2 = kvf_th_register(a, "agent", 6, NULL);
    cr_assert_neq(n1, n2);
    cr_assert_eq(kvf_th_lookup(a, 0, 0, 3, NULL, NULL), 0,
                 "old incarnation's holdings replaced");
    cr_assert_eq(kvf_th_batch(a, KVF_MSG_ADMIT, n1, 5, 2, 0, 3, false),
                 KVF_ERR_STALE);
    cr_assert_eq(kvf_th_batch(a, KVF_MSG_ADMIT, n2, 5, 1, 0, 3, false),
                 KVF_ERR_STALE, "wrong incarnation for the new id");
    cr_assert_eq(kvf_th_batch(a, KVF_MSG_ADMIT, 4242, 6, 1, 0, 3, false),
                 KVF_ERR_NOT_FOUND);
    kvf__deregister__init(&dr);
    dr.request_id  = 77;
    dr.node_id     = n2;
    dr.incarnation = 6;
    cr_assert_eq(kvf_ctlconn_call(a, KVF_MSG_DEREGISTER, &dr.base, &frame),
                 KVF_OK);
    cr_assert_eq(status_of(&frame), KVF_OK);
    cr_assert_eq(((Kvf__Status *)frame.msg)->request_id, 77);
    kvf_frame_release(&frame, NULL);
    kvf_ctlconn_destroy(a);
    stop_clean();
}

Test(controller, seq_gap_asks_for_resync)
{
    const char *args[] = {"--recovery-window", "0", NULL};
    Kvf__HeartbeatReply *rep;
    kvf_ctlconn_t *a;
    kvf_frame_t frame;
    uint32_t na;

    kvf_th_ctl_start(&g_ctl, args);
    a  = kvf_th_connect(&g_ctl, KVF__PEER_KIND__PEER_AGENT);
    na = kvf_th_register(a, "gappy", 1, NULL);
    cr_assert_eq(kvf_th_batch(a, KVF_MSG_ADMIT, na, 1, 1, 0, 5, false), KVF_OK);
    cr_assert_eq(kvf_th_batch(a, KVF_MSG_ADMIT, na, 1, 3, 100, 5, false),
                 KVF_OK); /* seq 2 lost */
    kvf_th_heartbeat(a, na, 1, 3, &frame);
    cr_assert_eq(frame.type, KVF_MSG_HEARTBEAT_REPLY);
    rep = (Kvf__HeartbeatReply *)frame.msg;
    cr_assert_eq(rep->n_commands, 1);
    cr_assert_eq(rep->commands[0]->type, KVF__COMMAND_TYPE__COMMAND_RESYNC);
    kvf_frame_release(&frame, NULL);
    /* the resync replaces the holdings: only 500..501 remain */
    cr_assert_eq(kvf_th_batch(a, KVF_MSG_INVENTORY, na, 1, 3, 500, 1, false),
                 KVF_OK);
    cr_assert_eq(kvf_th_batch(a, KVF_MSG_INVENTORY, na, 1, 3, 501, 1, true),
                 KVF_OK);
    cr_assert_eq(kvf_th_lookup(a, 0, 0, 5, NULL, NULL), 0);
    cr_assert_eq(kvf_th_lookup(a, 0, 500, 2, NULL, NULL), 2);
    /* heartbeat with a gap in last_seq also triggers a resync */
    kvf_th_heartbeat(a, na, 1, 9, &frame);
    rep = (Kvf__HeartbeatReply *)frame.msg;
    cr_assert_eq(rep->n_commands, 1);
    cr_assert_eq(rep->commands[0]->type, KVF__COMMAND_TYPE__COMMAND_RESYNC);
    kvf_frame_release(&frame, NULL);
    kvf_th_heartbeat(a, na, 1, 9, &frame);
    cr_assert_eq(((Kvf__HeartbeatReply *)frame.msg)->n_commands, 0,
                 "asked once until the inventory arrives");
    kvf_frame_release(&frame, NULL);
    kvf_ctlconn_destroy(a);
    stop_clean();
}

Test(controller, resync_after_restart)
{
    const char *args[] = {"--recovery-window", "60s", NULL};
    Kvf__StatsReply st;
    kvf_ctlconn_t *a, *b, *adm;
    uint32_t na, nb;
    bool rec = false;

    kvf_th_ctl_start(&g_ctl, args);
    a  = kvf_th_connect(&g_ctl, KVF__PEER_KIND__PEER_AGENT);
    na = kvf_th_register(a, "a", 1, &rec);
    cr_assert(rec, "fresh controller recovers first");
    cr_assert_eq(kvf_th_batch(a, KVF_MSG_INVENTORY, na, 1, 0, 0, 0, true),
                 KVF_OK);
    cr_assert_eq(kvf_th_batch(a, KVF_MSG_ADMIT, na, 1, 1, 0, 20, false),
                 KVF_OK);
    kvf_ctlconn_destroy(a);
    stop_clean();

    /* restart: empty registry until the agents resend their inventory */
    kvf_th_ctl_start(&g_ctl, args);
    adm = kvf_th_connect(&g_ctl, KVF__PEER_KIND__PEER_ADMIN);
    a   = kvf_th_connect(&g_ctl, KVF__PEER_KIND__PEER_AGENT);
    b   = kvf_th_connect(&g_ctl, KVF__PEER_KIND__PEER_AGENT);
    na  = kvf_th_register(a, "a", 1, &rec);
    cr_assert(rec);
    nb = kvf_th_register(b, "b", 1, NULL);
    cr_assert_eq(kvf_th_lookup(adm, 0, 0, 20, NULL, &rec), 0);
    cr_assert(rec, "lookups say recovering");
    cr_assert_eq(kvf_th_batch(a, KVF_MSG_INVENTORY, na, 1, 1, 0, 10, false),
                 KVF_OK);
    cr_assert_eq(kvf_th_batch(a, KVF_MSG_INVENTORY, na, 1, 1, 10, 10, true),
                 KVF_OK);
    stats_of(adm, &st);
    cr_assert(st.recovering, "b has not resynced yet");
    cr_assert_eq(kvf_th_batch(b, KVF_MSG_INVENTORY, nb, 1, 0, 0, 0, true),
                 KVF_OK);
    stats_of(adm, &st);
    cr_assert_not(st.recovering);
    cr_assert_eq(kvf_th_lookup(adm, 0, 0, 20, NULL, &rec), 20);
    cr_assert_not(rec);
    kvf_ctlconn_destroy(a);
    kvf_ctlconn_destroy(b);
    kvf_ctlconn_destroy(adm);
    stop_clean();
}

Test(controller, admin_commands_reach_agents_in_heartbeat_reply)
{
    const char *args[] = {"--recovery-window", "0", NULL};
    Kvf__HeartbeatReply *rep;
    Kvf__AdminCommand ac;
    kvf_ctlconn_t *a, *adm;
    kvf_frame_t frame;
    uint8_t keys[2 * KVF_KEY_WIRE_SIZE];
    uint32_t na;
    char state[32];

    kvf_th_ctl_start(&g_ctl, args);
    a   = kvf_th_connect(&g_ctl, KVF__PEER_KIND__PEER_AGENT);
    adm = kvf_th_connect(&g_ctl, KVF__PEER_KIND__PEER_ADMIN);
    na  = kvf_th_register(a, "a", 1, NULL);
    cr_assert_eq(kvf_th_batch(a, KVF_MSG_ADMIT, na, 1, 1, 0, 2, false), KVF_OK);
    kvf_th_keys(keys, 2, 0);
    kvf__admin_command__init(&ac);
    ac.request_id = 5;
    ac.type       = KVF__COMMAND_TYPE__COMMAND_PIN;
    ac.keys.data  = keys;
    ac.keys.len   = sizeof(keys);
    cr_assert_eq(kvf_ctlconn_call(adm, KVF_MSG_ADMIN_COMMAND, &ac.base, &frame),
                 KVF_OK);
    cr_assert_eq(status_of(&frame), KVF_OK);
    kvf_frame_release(&frame, NULL);
    ac.type      = KVF__COMMAND_TYPE__COMMAND_DRAIN;
    ac.keys.len  = 0;
    ac.node_name = (char *)(uintptr_t) "a";
    cr_assert_eq(kvf_ctlconn_call(adm, KVF_MSG_ADMIN_COMMAND, &ac.base, &frame),
                 KVF_OK);
    cr_assert_eq(status_of(&frame), KVF_OK);
    kvf_frame_release(&frame, NULL);
    kvf_th_node_state(adm, na, state, sizeof(state));
    cr_assert_str_eq(state, "draining");
    cr_assert_eq(kvf_th_lookup(adm, 0, 0, 2, NULL, NULL), 0,
                 "a draining node is not chosen");
    kvf_th_heartbeat(a, na, 1, 1, &frame);
    rep = (Kvf__HeartbeatReply *)frame.msg;
    cr_assert_eq(rep->n_commands, 2);
    cr_assert_eq(rep->commands[0]->type, KVF__COMMAND_TYPE__COMMAND_PIN);
    cr_assert_eq(rep->commands[0]->keys.len, sizeof(keys));
    cr_assert_eq(rep->commands[1]->type, KVF__COMMAND_TYPE__COMMAND_DRAIN);
    kvf_frame_release(&frame, NULL);
    kvf_th_heartbeat(a, na, 1, 1, &frame);
    cr_assert_eq(((Kvf__HeartbeatReply *)frame.msg)->n_commands, 0,
                 "commands are delivered once");
    kvf_frame_release(&frame, NULL);
    /* unknown node */
    ac.type      = KVF__COMMAND_TYPE__COMMAND_CLEAR;
    ac.node_name = (char *)(uintptr_t) "nope";
    cr_assert_eq(kvf_ctlconn_call(adm, KVF_MSG_ADMIN_COMMAND, &ac.base, &frame),
                 KVF_OK);
    cr_assert_eq(status_of(&frame), KVF_ERR_NOT_FOUND);
    kvf_frame_release(&frame, NULL);
    kvf_ctlconn_destroy(a);
    kvf_ctlconn_destroy(adm);
    stop_clean();
}

Test(controller, version_mismatch_is_refused)
{
    kvf_ctlconn_t *conn = NULL;
    char err[256];

    kvf_th_ctl_start(&g_ctl, NULL);
    cr_assert_eq(kvf_ctlconn_create(g_ctl.addr, KVF__PEER_KIND__PEER_AGENT,
                                    "old", 99, 5000, &conn, err, sizeof(err)),
                 KVF_ERR_VERSION);
    cr_assert_not_null(strstr(err, "protocol version 99 not supported"), "%s",
                       err);
    stop_clean();
}

Test(controller, bad_input_is_answered_and_counted)
{
    const char *args[] = {"--recovery-window", "0", "--max-frame", "64K", NULL};
    kvf_ctlconn_t *a, *raw, *adm;
    kvf_frame_t frame;
    Kvf__StatsReply st;
    Kvf__Lookup lk;
    uint8_t odd[25]     = {0};
    uint8_t garbage[16] = {4, 0, 0, 0, 10, 0, 0, 0, 0xff, 0xff, 0xff, 0xff};
    uint8_t huge[8]     = {0, 0, 0, 0x10, 23, 0, 0, 0};
    uint32_t na;

    kvf_th_ctl_start(&g_ctl, args);
    a   = kvf_th_connect(&g_ctl, KVF__PEER_KIND__PEER_AGENT);
    adm = kvf_th_connect(&g_ctl, KVF__PEER_KIND__PEER_ADMIN);
    na  = kvf_th_register(a, "victim", 1, NULL);
    cr_assert_eq(kvf_th_batch(a, KVF_MSG_ADMIT, na, 1, 1, 0, 4, false), KVF_OK);

    /* keys of the wrong length: error reply, connection stays */
    kvf__lookup__init(&lk);
    lk.request_id = 3;
    lk.keys.data  = odd;
    lk.keys.len   = sizeof(odd);
    cr_assert_eq(kvf_ctlconn_call(adm, KVF_MSG_LOOKUP, &lk.base, &frame),
                 KVF_OK);
    cr_assert_eq(status_of(&frame), KVF_ERR_INVALID);
    cr_assert_eq(((Kvf__Status *)frame.msg)->request_id, 3);
    kvf_frame_release(&frame, NULL);

    /* frame before HELLO: rejected and closed */
    raw = NULL;
    {
        char err[200];

        cr_assert_eq(kvf_ctlconn_create(g_ctl.addr, 0, "raw", 0, 5000, &raw,
                                        err, sizeof(err)),
                     KVF_OK);
    }
    cr_assert_eq(kvf_ctlconn_call(raw, KVF_MSG_LOOKUP, &lk.base, &frame),
                 KVF_OK);
    cr_assert_eq(status_of(&frame), KVF_ERR_STATE);
    kvf_frame_release(&frame, NULL);
    cr_assert_eq(kvf_ctlconn_recv(raw, &frame), KVF_ERR_CLOSED);
    kvf_ctlconn_destroy(raw);

    /* malformed payload after HELLO: closed */
    raw = kvf_th_connect(&g_ctl, KVF__PEER_KIND__PEER_AGENT);
    cr_assert_eq(kvf_ctlconn_send_raw(raw, garbage, 12), KVF_OK);
    cr_assert_eq(kvf_ctlconn_recv(raw, &frame), KVF_OK);
    cr_assert_eq(status_of(&frame), KVF_ERR_PROTO);
    kvf_frame_release(&frame, NULL);
    cr_assert_eq(kvf_ctlconn_recv(raw, &frame), KVF_ERR_CLOSED);
    kvf_ctlconn_destroy(raw);

    /* oversized frame: closed before the payload is read */
    raw = kvf_th_connect(&g_ctl, KVF__PEER_KIND__PEER_AGENT);
    cr_assert_eq(kvf_ctlconn_send_raw(raw, huge, sizeof(huge)), KVF_OK);
    cr_assert_eq(kvf_ctlconn_recv(raw, &frame), KVF_OK);
    cr_assert_eq(status_of(&frame), KVF_ERR_TOO_BIG);
    kvf_frame_release(&frame, NULL);
    cr_assert_eq(kvf_ctlconn_recv(raw, &frame), KVF_ERR_CLOSED);
    kvf_ctlconn_destroy(raw);

    /* unknown frame type number in range: error reply */
    stats_of(adm, &st);
    cr_assert(st.protocol_errors >= 4, "%lu",
              (unsigned long)st.protocol_errors);
    cr_assert_eq(kvf_th_lookup(adm, 0, 0, 4, NULL, NULL), 4,
                 "other nodes' state kept");
    kvf_ctlconn_destroy(a);
    kvf_ctlconn_destroy(adm);
    stop_clean();
}

/* HEARTBEAT with @p transports; NODE_INFO's transports of the node after
 * it into @p out. */
static void heartbeat_transports(kvf_ctlconn_t *conn, uint32_t node,
                                 const char *transports, char *out, size_t len)
{
    Kvf__NodeInfoRequest req;
    Kvf__Heartbeat hb;
    kvf_frame_t frame;

    kvf__heartbeat__init(&hb);
    hb.request_id  = kvf_ctlconn_next_id(conn);
    hb.node_id     = node;
    hb.incarnation = 1;
    hb.transports  = (char *)(uintptr_t)transports;
    cr_assert_eq(kvf_ctlconn_call(conn, KVF_MSG_HEARTBEAT, &hb.base, &frame),
                 KVF_OK);
    cr_assert_eq(frame.type, KVF_MSG_HEARTBEAT_REPLY,
                 "the heartbeat stands whatever its transports: %s",
                 kvf_msg_type_name(frame.type));
    kvf_frame_release(&frame, NULL);
    kvf__node_info_request__init(&req);
    req.request_id = kvf_ctlconn_next_id(conn);
    req.n_node_ids = 1;
    req.node_ids   = &node;
    cr_assert_eq(kvf_ctlconn_call(conn, KVF_MSG_NODE_INFO, &req.base, &frame),
                 KVF_OK);
    cr_assert_eq(frame.type, KVF_MSG_NODE_INFO_REPLY);
    snprintf(out, len, "%s",
             ((Kvf__NodeInfoReply *)frame.msg)->nodes[0]->transports);
    kvf_frame_release(&frame, NULL);
}

/* Heartbeat.transports comes from a peer and is shown on operators'
 * terminals: kept when short and printable, else shown as none. */
Test(controller, heartbeat_transports_are_kept_only_when_clean)
{
    const char *args[] = {"--recovery-window", "0", NULL};
    char got[256], longv[200], out[8192];
    kvf_ctlconn_t *a;
    uint32_t na;

    kvf_th_ctl_start(&g_ctl, args);
    a  = kvf_th_connect(&g_ctl, KVF__PEER_KIND__PEER_AGENT);
    na = kvf_th_register(a, "node-t", 1, NULL);
    heartbeat_transports(a, na, "rc_mlx5,tcp", got, sizeof(got));
    cr_assert_str_eq(got, "rc_mlx5,tcp");
    cr_assert_eq(
        kvf_th_run(out, sizeof(out), "curl -sf http://%s/v1/nodes", g_ctl.http),
        0);
    cr_assert_not_null(strstr(out, "\"transports\":\"rc_mlx5,tcp\""), "%s",
                       out);
    /* a terminal escape never reaches kvfctl's terminal */
    heartbeat_transports(a, na, "tcp\033]0;owned\007", got, sizeof(got));
    cr_assert_str_eq(got, "");
    heartbeat_transports(a, na, "tcp", got, sizeof(got));
    cr_assert_str_eq(got, "tcp");
    memset(longv, 't', sizeof(longv) - 1);
    longv[sizeof(longv) - 1] = '\0';
    heartbeat_transports(a, na, longv, got, sizeof(got));
    cr_assert_str_eq(got, "", "too long: refused, not kept");
    cr_assert_eq(
        kvf_th_run(out, sizeof(out), "curl -sf http://%s/v1/nodes", g_ctl.http),
        0);
    cr_assert_not_null(strstr(out, "\"transports\":\"\""), "%s", out);
    cr_assert_null(strstr(out, "ttttt"), "%s", out);
    cr_assert(kvf_th_run(out, sizeof(out), "grep -c 'transports refused' %s",
                         g_ctl.log) == 0 &&
                  (atoi(out) == 2),
              "logged once per run of refused values: %s", out);
    kvf_ctlconn_destroy(a);
    stop_clean();
}

Test(controller, flood_from_one_connection_does_not_block_others)
{
    const char *args[] = {"--recovery-window", "0", "--max-output", "64K",
                          NULL};
    kvf_ctlconn_t *flood, *adm;
    uint8_t keys[64 * KVF_KEY_WIRE_SIZE];
    Kvf__Lookup lk;
    Kvf__StatsReply st;
    int i;

    kvf_th_ctl_start(&g_ctl, args);
    flood = kvf_th_connect(&g_ctl, KVF__PEER_KIND__PEER_AGENT);
    adm   = kvf_th_connect(&g_ctl, KVF__PEER_KIND__PEER_ADMIN);
    kvf_th_keys(keys, 64, 0);
    kvf__lookup__init(&lk);
    lk.keys.data = keys;
    lk.keys.len  = sizeof(keys);
    /* never read the replies: the controller must stop reading us. Send
     * well past what loopback socket buffers absorb (they autotune to
     * several MiB), so the controller's own output cap is what stops it */
    for (i = 0; i < 40000; i++) {
        kvf_status_t s;

        lk.request_id = (uint64_t)i;
        s             = kvf_ctlconn_send(flood, KVF_MSG_LOOKUP, &lk.base);
        if (s != KVF_OK) {
            cr_assert_eq(s, KVF_ERR_TIMEOUT);
            break;
        }
    }
    stats_of(adm, &st);
    cr_assert_eq(kvf_th_lookup(adm, 0, 0, 4, NULL, NULL), 0,
                 "other connections are served");
    {
        char out[8192];

        cr_assert_eq(kvf_th_run(out, sizeof(out), "curl -sf http://%s/metrics",
                                g_ctl.http),
                     0);
        cr_assert_null(strstr(out, "kvf_controller_backpressure_total 0\n"),
                       "flood was not throttled");
    }
    kvf_ctlconn_destroy(flood);
    kvf_ctlconn_destroy(adm);
    stop_clean();
}

Test(controller, wire_errors_keep_the_connection)
{
    const char *args[] = {"--recovery-window", "0", "--max-batch", "8", NULL};
    kvf_ctlconn_t *a;
    kvf_frame_t frame;
    Kvf__NodeInfoRequest ni;
    Kvf__Register reg;
    uint32_t ids[1] = {999};
    uint8_t keys[9 * KVF_KEY_WIRE_SIZE];
    Kvf__Lookup lk;
    uint8_t reply_flag[8] = {0, 0, 0, 0, 3, 0, 1, 0};

    kvf_th_ctl_start(&g_ctl, args);
    a = kvf_th_connect(&g_ctl, KVF__PEER_KIND__PEER_AGENT);
    /* over max_batch */
    kvf_th_keys(keys, 9, 0);
    kvf__lookup__init(&lk);
    lk.request_id = 11;
    lk.keys.data  = keys;
    lk.keys.len   = sizeof(keys);
    cr_assert_eq(kvf_ctlconn_call(a, KVF_MSG_LOOKUP, &lk.base, &frame), KVF_OK);
    cr_assert_eq(status_of(&frame), KVF_ERR_TOO_BIG);
    cr_assert_eq(((Kvf__Status *)frame.msg)->request_id, 11);
    kvf_frame_release(&frame, NULL);
    /* unknown node in NODE_INFO */
    kvf__node_info_request__init(&ni);
    ni.request_id = 12;
    ni.n_node_ids = 1;
    ni.node_ids   = ids;
    cr_assert_eq(kvf_ctlconn_call(a, KVF_MSG_NODE_INFO, &ni.base, &frame),
                 KVF_OK);
    cr_assert_eq(status_of(&frame), KVF_ERR_NOT_FOUND);
    kvf_frame_release(&frame, NULL);
    /* bad register: tp_rank >= tp_world */
    kvf__register__init(&reg);
    reg.request_id = 13;
    reg.name       = (char *)(uintptr_t) "bad";
    reg.tp_world   = 2;
    reg.tp_rank    = 2;
    cr_assert_eq(kvf_ctlconn_call(a, KVF_MSG_REGISTER, &reg.base, &frame),
                 KVF_OK);
    cr_assert_eq(frame.type, KVF_MSG_REGISTER_REPLY);
    cr_assert_eq(((Kvf__RegisterReply *)frame.msg)->status, KVF_ERR_INVALID);
    kvf_frame_release(&frame, NULL);
    /* still usable */
    cr_assert_eq(kvf_th_lookup(a, 0, 0, 4, NULL, NULL), 0);
    /* a frame flagged as a reply is a protocol error: closed */
    cr_assert_eq(kvf_ctlconn_send_raw(a, reply_flag, sizeof(reply_flag)),
                 KVF_OK);
    cr_assert_eq(kvf_ctlconn_recv(a, &frame), KVF_OK);
    cr_assert_eq(status_of(&frame), KVF_ERR_PROTO);
    kvf_frame_release(&frame, NULL);
    cr_assert_eq(kvf_ctlconn_recv(a, &frame), KVF_ERR_CLOSED);
    kvf_ctlconn_destroy(a);
    stop_clean();
}

Test(controller, sigint_exits_cleanly_with_connections_open)
{
    kvf_ctlconn_t *a, *b;

    kvf_th_ctl_start(&g_ctl, NULL);
    a = kvf_th_connect(&g_ctl, KVF__PEER_KIND__PEER_AGENT);
    b = kvf_th_connect(&g_ctl, KVF__PEER_KIND__PEER_ADMIN);
    kvf_th_register(a, "x", 1, NULL);
    kill(g_ctl.pid, SIGINT);
    cr_assert_eq(kvf_th_ctl_wait(&g_ctl), 0, "SIGINT exit not clean");
    kvf_ctlconn_destroy(a);
    kvf_ctlconn_destroy(b);
}

Test(controller, grows_while_serving)
{
    const char *args[] = {"--recovery-window",
                          "0",
                          "--initial-keys",
                          "100",
                          "--purge-slice",
                          "1024",
                          NULL};
    kvf_ctlconn_t *a;
    Kvf__StatsReply st;
    uint64_t deadline;
    uint32_t na;
    int i;

    kvf_th_ctl_start(&g_ctl, args);
    a  = kvf_th_connect(&g_ctl, KVF__PEER_KIND__PEER_AGENT);
    na = kvf_th_register(a, "grower", 1, NULL);
    for (i = 0; i < 40; i++) {
        cr_assert_eq(kvf_th_batch(a, KVF_MSG_ADMIT, na, 1, (uint64_t)i + 1,
                                  (uint64_t)i * 500, 500, false),
                     KVF_OK);
        cr_assert_eq(kvf_th_lookup(a, 0, 0, 64, NULL, NULL), 64);
    }
    deadline = kvf_time_deadline_ns(10 * KVF_NSEC_PER_SEC);
    do {
        cr_assert(!kvf_time_expired(deadline));
        stats_of(a, &st);
    } while (st.keys != 20000);
    cr_assert_eq(kvf_th_lookup(a, 0, 19936, 64, NULL, NULL), 64);
    kvf_ctlconn_destroy(a);
    stop_clean();
}
