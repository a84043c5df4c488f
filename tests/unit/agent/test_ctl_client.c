/* SPDX-License-Identifier: Apache-2.0 */
/* Copyright (c) 2026 The kvfabric authors */
/*
 * The agent's controller client against a scripted fake controller that
 * runs on the same event loop: registration, inventory, batching and order
 * of ADMIT/EVICT, fencing, reconnect, deregistration.
 */
#include "agent/ctl_client.h"
#include "common/time.h"
#include "proto/frame.h"
#include "tests/helpers/test_helpers.h"

#include <criterion/criterion.h>
#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <event2/listener.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_SEEN 64

typedef struct seen_frame {
    uint16_t type;
    uint64_t seq;
    size_t keys;
    bool last;
    uint64_t incarnation;
} seen_frame_t;

/* The fake controller: accepts, answers HELLO/REGISTER/HEARTBEAT and
 * records every frame it gets. */
typedef struct fake {
    struct event_base *base;
    struct evconnlistener *listener;
    struct bufferevent *conn;
    uint16_t port;
    seen_frame_t seen[MAX_SEEN];
    int nseen;
    int accepts;
    int registrations;
    bool stale_next_admit; /* answer the next ADMIT with KVF_ERR_STALE */
    bool resync_next_hb;   /* send COMMAND_RESYNC in the next HB reply */
    bool pin_next_hb;      /* send COMMAND_PIN in the next HB reply */
    bool ignore_lookups;   /* never answer LOOKUP */
    bool pin_after_lookup; /* a HB reply with COMMAND_PIN behind LOOKUP's */
    uint64_t term;         /* leader term carried in replies */
} fake_t;

static fake_t g_fake;
static char g_stale_text[] = "stale incarnation";
static struct event_base *g_base;
static kvf_ctl_client_t *g_client;
static int g_inventories, g_stopped, g_pins;
static int g_inventory_keys = 3;

static void fake_reply(fake_t *f, uint16_t type, const ProtobufCMessage *m)
{
    cr_assert_eq(kvf_frame_encode(bufferevent_get_output(f->conn), type,
                                  KVF_FRAME_FLAG_REPLY, m,
                                  KVF_FRAME_MAX_DEFAULT),
                 KVF_OK);
}

static void fake_record(fake_t *f, const kvf_frame_t *frame)
{
    seen_frame_t *s;

    if (f->nseen >= MAX_SEEN) {
        return;
    }
    s       = &f->seen[f->nseen++];
    s->type = frame->type;
    if ((frame->type == KVF_MSG_ADMIT) || (frame->type == KVF_MSG_EVICT)) {
        const Kvf__KeyBatch *b = (const Kvf__KeyBatch *)frame->msg;
        s->seq                 = b->seq;
        s->keys                = b->keys.len / KVF_KEY_WIRE_SIZE;
        s->incarnation         = b->incarnation;
    } else if (frame->type == KVF_MSG_INVENTORY) {
        const Kvf__Inventory *inv = (const Kvf__Inventory *)frame->msg;
        s->seq                    = inv->seq;
        s->keys                   = inv->keys.len / KVF_KEY_WIRE_SIZE;
        s->last                   = inv->last;
    } else if (frame->type == KVF_MSG_REGISTER) {
        s->incarnation = ((const Kvf__Register *)frame->msg)->incarnation;
    }
}

static void fake_handle(fake_t *f, const kvf_frame_t *frame)
{
    Kvf__HelloReply hello;
    Kvf__RegisterReply reg;
    Kvf__HeartbeatReply hb;
    Kvf__Command cmd, *cmds[1] = {&cmd};
    Kvf__Status st;

    fake_record(f, frame);
    switch (frame->type) {
    case KVF_MSG_HELLO:
        kvf__hello_reply__init(&hello);
        hello.protocol_version = KVF_PROTOCOL_VERSION;
        fake_reply(f, KVF_MSG_HELLO_REPLY, &hello.base);
        break;
    case KVF_MSG_REGISTER:
        f->registrations++;
        kvf__register_reply__init(&reg);
        reg.node_id      = 7;
        reg.heartbeat_ms = 20;
        reg.lease_ms     = 2000;
        reg.term         = f->term;
        fake_reply(f, KVF_MSG_REGISTER_REPLY, &reg.base);
        break;
    case KVF_MSG_HEARTBEAT:
        kvf__heartbeat_reply__init(&hb);
        hb.term = f->term;
        kvf__command__init(&cmd);
        if (f->resync_next_hb || f->pin_next_hb) {
            cmd.type = f->resync_next_hb ? KVF__COMMAND_TYPE__COMMAND_RESYNC
                                         : KVF__COMMAND_TYPE__COMMAND_PIN;
            hb.n_commands     = 1;
            hb.commands       = cmds;
            f->resync_next_hb = false;
            f->pin_next_hb    = false;
        }
        fake_reply(f, KVF_MSG_HEARTBEAT_REPLY, &hb.base);
        break;
    case KVF_MSG_ADMIT:
        if (f->stale_next_admit) {
            f->stale_next_admit = false;
            kvf__status__init(&st);
            st.request_id = ((const Kvf__KeyBatch *)frame->msg)->request_id;
            st.status     = KVF_ERR_STALE;
            st.message    = g_stale_text;
            fake_reply(f, KVF_MSG_STATUS, &st.base);
        }
        break;
    case KVF_MSG_DEREGISTER:
        kvf__status__init(&st);
        fake_reply(f, KVF_MSG_STATUS, &st.base);
        break;
    case KVF_MSG_LOOKUP: {
        /* every key held by node 9 except the last, which nobody holds */
        const Kvf__Lookup *lk = (const Kvf__Lookup *)frame->msg;
        size_t n              = lk->keys.len / KVF_KEY_WIRE_SIZE, i;
        uint8_t holders[64 * 4];
        Kvf__LookupReply rep;

        if (f->ignore_lookups || (n == 0) || (n > 64)) {
            break;
        }
        memset(holders, 0, sizeof(holders));
        for (i = 0; i + 1 < n; i++) {
            holders[4 * i] = 9;
        }
        kvf__lookup_reply__init(&rep);
        rep.request_id   = lk->request_id;
        rep.hit_chunks   = (uint32_t)(n - 1);
        rep.holders.data = holders;
        rep.holders.len  = 4 * n;
        rep.term         = f->term;
        fake_reply(f, KVF_MSG_LOOKUP_REPLY, &rep.base);
        if (f->pin_after_lookup) { /* in the same write */
            kvf__heartbeat_reply__init(&hb);
            hb.term = f->term;
            kvf__command__init(&cmd);
            cmd.type      = KVF__COMMAND_TYPE__COMMAND_PIN;
            hb.n_commands = 1;
            hb.commands   = cmds;
            fake_reply(f, KVF_MSG_HEARTBEAT_REPLY, &hb.base);
        }
        break;
    }
    default:
        break;
    }
}

static void fake_on_read(struct bufferevent *bev, void *arg)
{
    fake_t *f = arg;
    kvf_frame_t frame;

    while (kvf_frame_decode(bufferevent_get_input(bev), KVF_FRAME_MAX_DEFAULT,
                            NULL, &frame) == KVF_OK) {
        fake_handle(f, &frame);
        kvf_frame_release(&frame, NULL);
    }
}

static void fake_on_event(struct bufferevent *bev, short what, void *arg)
{
    fake_t *f = arg;

    if (what & (BEV_EVENT_EOF | BEV_EVENT_ERROR)) {
        bufferevent_free(bev);
        if (f->conn == bev) {
            f->conn = NULL;
        }
    }
}

static void fake_on_accept(struct evconnlistener *l, evutil_socket_t fd,
                           struct sockaddr *sa, int len, void *arg)
{
    fake_t *f = arg;

    if (f->conn != NULL) {
        bufferevent_free(f->conn);
    }
    f->accepts++;
    f->conn = bufferevent_socket_new(f->base, fd, BEV_OPT_CLOSE_ON_FREE);
    bufferevent_setcb(f->conn, fake_on_read, NULL, fake_on_event, f);
    bufferevent_enable(f->conn, EV_READ | EV_WRITE);
}

static void fake_start(fake_t *f, struct event_base *base, uint16_t port)
{
    struct sockaddr_in sin;
    socklen_t len = sizeof(sin);

    memset(&sin, 0, sizeof(sin));
    sin.sin_family      = AF_INET;
    sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    sin.sin_port        = htons(port);
    f->base             = base;
    f->listener         = evconnlistener_new_bind(
                base, fake_on_accept, f, LEV_OPT_REUSEABLE | LEV_OPT_CLOSE_ON_FREE, 16,
                (struct sockaddr *)&sin, sizeof(sin));
    cr_assert_not_null(f->listener);
    getsockname(evconnlistener_get_fd(f->listener), (struct sockaddr *)&sin,
                &len);
    f->port = ntohs(sin.sin_port);
}

static void fake_stop(fake_t *f)
{
    if (f->conn != NULL) {
        bufferevent_free(f->conn);
        f->conn = NULL;
    }
    if (f->listener != NULL) {
        evconnlistener_free(f->listener);
        f->listener = NULL;
    }
}

static void on_inventory(void *arg, kvf_ctl_client_t *client)
{
    kvf_key_t key = {1, 2, 0};
    int i;

    g_inventories++;
    for (i = 0; i < g_inventory_keys; i++) {
        key.lo = (uint64_t)i;
        kvf_ctl_client_inventory_add(client, &key);
    }
    kvf_ctl_client_inventory_end(client);
}

static void on_command(void *arg, const Kvf__Command *command)
{
    if (command->type == KVF__COMMAND_TYPE__COMMAND_PIN) {
        g_pins++;
    }
}

static void on_stopped(void *arg)
{
    g_stopped++;
}

static const kvf_ctl_client_ops_t test_ops = {
    .inventory = on_inventory,
    .command   = on_command,
    .stopped   = on_stopped,
};

/* Runs the loop until @p cond holds or 5 s pass; fails on timeout. */
#define RUN_UNTIL(_cond) \
    do { \
        uint64_t _deadline = kvf_time_deadline_ns(5 * KVF_NSEC_PER_SEC); \
        while (!(_cond)) { \
            cr_assert(!kvf_time_expired(_deadline), "timed out: %s", #_cond); \
            event_base_loop(g_base, EVLOOP_ONCE | EVLOOP_NONBLOCK); \
        } \
    } while (0)

static void start_client_at(const char *addr)
{
    kvf_ctl_client_params_t p;

    memset(&p, 0, sizeof(p));
    p.base               = g_base;
    p.controller         = addr;
    p.name               = "agent-test";
    p.role               = 0;
    p.pool_capacity      = 1 << 30;
    p.connect_timeout_ns = KVF_NSEC_PER_SEC;
    p.request_timeout_ns = KVF_NSEC_PER_SEC;
    p.reconnect_max_ns   = 200 * KVF_NSEC_PER_MSEC;
    p.flush_ns           = 2 * KVF_NSEC_PER_MSEC;
    p.max_frame          = KVF_FRAME_MAX_DEFAULT;
    p.ops                = &test_ops;
    cr_assert_eq(kvf_ctl_client_create(&p, &g_client), KVF_OK);
}

static void start_client(void)
{
    char addr[64];

    snprintf(addr, sizeof(addr), "127.0.0.1:%u", g_fake.port);
    start_client_at(addr);
}

static void ctl_setup(void)
{
    memset(&g_fake, 0, sizeof(g_fake));
    g_inventories = g_stopped = g_pins = 0;
    g_inventory_keys                   = 3;
    g_base                             = event_base_new();
    fake_start(&g_fake, g_base, 0);
    kvf_test_log_capture_start();
    start_client();
}

static void ctl_teardown(void)
{
    kvf_ctl_client_destroy(g_client);
    fake_stop(&g_fake);
    event_base_free(g_base);
    kvf_test_log_capture_stop();
    kvf_test_check_leaks();
}

TestSuite(ctl_client, .init = ctl_setup, .fini = ctl_teardown, .timeout = 20);

static int count_type(uint16_t type)
{
    int i, n = 0;

    for (i = 0; i < g_fake.nseen; i++) {
        n += (g_fake.seen[i].type == type);
    }
    return n;
}

static const seen_frame_t *find_nth(uint16_t type, int nth)
{
    int i;

    for (i = 0; i < g_fake.nseen; i++) {
        if ((g_fake.seen[i].type == type) && (nth-- == 0)) {
            return &g_fake.seen[i];
        }
    }
    return NULL;
}

Test(ctl_client, registers_and_sends_inventory)
{
    const seen_frame_t *inv;

    RUN_UNTIL(kvf_ctl_client_is_registered(g_client) &&
              (count_type(KVF_MSG_INVENTORY) == 1));
    cr_assert_eq(kvf_ctl_client_node_id(g_client), 7);
    cr_assert_eq(g_fake.seen[0].type, KVF_MSG_HELLO, "HELLO comes first");
    cr_assert_eq(g_fake.seen[1].type, KVF_MSG_REGISTER);
    inv = find_nth(KVF_MSG_INVENTORY, 0);
    cr_assert_eq(inv->keys, 3);
    cr_assert(inv->last);
    cr_assert_eq(inv->seq, 0);
    RUN_UNTIL(count_type(KVF_MSG_HEARTBEAT) >= 2);
}

Test(ctl_client, admits_coalesce_and_keep_order_with_evicts)
{
    kvf_key_t key = {9, 9, 0};
    const seen_frame_t *a0, *e0, *a1;
    int i;

    RUN_UNTIL(kvf_ctl_client_is_registered(g_client));
    for (i = 0; i < 100; i++) {
        key.lo = (uint64_t)i;
        kvf_ctl_client_admit(g_client, &key);
    }
    kvf_ctl_client_evict(g_client, &key);
    kvf_ctl_client_admit(g_client, &key); /* re-admit after the evict */
    RUN_UNTIL(count_type(KVF_MSG_ADMIT) == 2);
    a0 = find_nth(KVF_MSG_ADMIT, 0);
    e0 = find_nth(KVF_MSG_EVICT, 0);
    a1 = find_nth(KVF_MSG_ADMIT, 1);
    cr_assert_not_null(e0);
    cr_assert_eq(a0->keys, 100, "one batch for 100 admits");
    cr_assert_eq(e0->keys, 1);
    cr_assert_eq(a1->keys, 1);
    cr_assert(a0 < e0 && e0 < a1, "admit, evict, admit: order kept");
    cr_assert_eq(a0->seq, 1);
    cr_assert_eq(e0->seq, 2);
    cr_assert_eq(a1->seq, 3, "seq grows by one per batch");
}

Test(ctl_client, stale_reply_reregisters_with_inventory)
{
    kvf_key_t key = {1, 1, 1};

    RUN_UNTIL(kvf_ctl_client_is_registered(g_client) && (g_inventories == 1));
    g_fake.stale_next_admit = true;
    kvf_ctl_client_admit(g_client, &key);
    RUN_UNTIL(g_fake.registrations == 2 && g_inventories == 2 &&
              kvf_ctl_client_is_registered(g_client));
    cr_assert(kvf_test_log_contains("stale incarnation"));
    cr_assert_eq(find_nth(KVF_MSG_REGISTER, 0)->incarnation,
                 find_nth(KVF_MSG_REGISTER, 1)->incarnation,
                 "same process, same incarnation");
}

Test(ctl_client, resync_and_commands_from_heartbeat_reply)
{
    RUN_UNTIL(kvf_ctl_client_is_registered(g_client) && (g_inventories == 1));
    g_fake.resync_next_hb = true;
    RUN_UNTIL(g_inventories == 2);
    cr_assert_eq(g_fake.registrations, 1, "resync needs no new register");
    g_fake.pin_next_hb = true;
    RUN_UNTIL(g_pins == 1);
}

Test(ctl_client, reconnects_after_controller_restart)
{
    kvf_key_t key = {4, 4, 4};
    uint16_t port;

    RUN_UNTIL(kvf_ctl_client_is_registered(g_client));
    port = g_fake.port;
    fake_stop(&g_fake);
    RUN_UNTIL(!kvf_ctl_client_is_registered(g_client));
    /* admits while disconnected are dropped: the inventory covers them */
    kvf_ctl_client_admit(g_client, &key);
    fake_start(&g_fake, g_base, port);
    RUN_UNTIL(kvf_ctl_client_is_registered(g_client) && (g_inventories == 2));
    cr_assert_eq(g_fake.accepts, 2);
    cr_assert_eq(count_type(KVF_MSG_ADMIT), 0);
}

Test(ctl_client, stop_deregisters)
{
    RUN_UNTIL(kvf_ctl_client_is_registered(g_client));
    kvf_ctl_client_stop(g_client);
    RUN_UNTIL(g_stopped == 1);
    cr_assert_eq(count_type(KVF_MSG_DEREGISTER), 1);
    cr_assert(!kvf_ctl_client_is_registered(g_client));
}

Test(ctl_client, stop_without_controller_finishes_at_once)
{
    fake_stop(&g_fake);
    RUN_UNTIL(!kvf_ctl_client_is_registered(g_client) && g_fake.accepts <= 1);
    kvf_ctl_client_stop(g_client);
    RUN_UNTIL(g_stopped == 1);
}

Test(ctl_client, large_inventory_splits_into_batches)
{
    kvf_ctl_client_destroy(g_client);
    g_client         = NULL;
    g_inventory_keys = 70000; /* over the 65536-key batch limit */
    g_fake.nseen     = 0;
    start_client();
    RUN_UNTIL(count_type(KVF_MSG_INVENTORY) >= 2 &&
              find_nth(KVF_MSG_INVENTORY, 1)->last);
    cr_assert_eq(find_nth(KVF_MSG_INVENTORY, 0)->keys, 65536);
    cr_assert(!find_nth(KVF_MSG_INVENTORY, 0)->last);
    cr_assert_eq(find_nth(KVF_MSG_INVENTORY, 1)->keys, 70000 - 65536);
}

Test(ctl_client, bad_address_is_rejected)
{
    kvf_ctl_client_params_t p;
    kvf_ctl_client_t *c = NULL;

    memset(&p, 0, sizeof(p));
    p.base       = g_base;
    p.controller = "no-port-here";
    p.name       = "x";
    p.max_frame  = KVF_FRAME_MAX_DEFAULT;
    cr_assert_eq(kvf_ctl_client_create(&p, &c), KVF_ERR_INVALID);
    cr_assert_null(c);
    p.controller = "127.0.0.1:1";
    p.max_frame  = 100;
    cr_assert_eq(kvf_ctl_client_create(&p, &c), KVF_ERR_INVALID);
}

static int g_lookups;
static kvf_status_t g_lookup_status;
static uint32_t g_lookup_hit, g_lookup_holders[8];

static void on_lookup(void *arg, kvf_status_t status, uint32_t hit,
                      const uint32_t *holders, uint32_t num)
{
    uint32_t i;

    g_lookups++;
    g_lookup_status = status;
    g_lookup_hit    = hit;
    for (i = 0; (holders != NULL) && (i < num) && (i < 8); i++) {
        g_lookup_holders[i] = holders[i];
    }
}

Test(ctl_client, lookup_answers_with_holders)
{
    kvf_key_t keys[3] = {{1, 1, 1}, {1, 1, 2}, {1, 1, 3}};

    RUN_UNTIL(kvf_ctl_client_is_registered(g_client));
    g_lookups = 0;
    kvf_ctl_client_lookup(g_client, keys, 3, false, 0, on_lookup, NULL);
    cr_assert_eq(g_lookups, 0, "never from inside the call");
    RUN_UNTIL(g_lookups == 1);
    cr_assert_eq(g_lookup_status, KVF_OK);
    cr_assert_eq(g_lookup_hit, 2);
    cr_assert_eq(g_lookup_holders[0], 9);
    cr_assert_eq(g_lookup_holders[1], 9);
    cr_assert_eq(g_lookup_holders[2], 0);
}

Test(ctl_client, unanswered_lookup_times_out)
{
    kvf_key_t key = {1, 1, 1};
    uint64_t t0;

    RUN_UNTIL(kvf_ctl_client_is_registered(g_client));
    g_fake.ignore_lookups = true;
    g_lookups             = 0;
    t0                    = kvf_time_now_ns();
    kvf_ctl_client_lookup(g_client, &key, 1, false, 0, on_lookup, NULL);
    RUN_UNTIL(g_lookups == 1);
    cr_assert_eq(g_lookup_status, KVF_ERR_TIMEOUT);
    cr_assert_geq(kvf_time_now_ns() - t0, 900 * KVF_NSEC_PER_MSEC,
                  "the 1 s request timeout, not earlier");
}

Test(ctl_client, lookup_before_registration_fails_cleanly)
{
    kvf_key_t key = {1, 1, 1};

    /* no controller answers the connect yet: not registered */
    fake_stop(&g_fake);
    RUN_UNTIL(!kvf_ctl_client_is_registered(g_client));
    g_lookups = 0;
    kvf_ctl_client_lookup(g_client, &key, 1, false, 0, on_lookup, NULL);
    RUN_UNTIL(g_lookups == 1);
    cr_assert_eq(g_lookup_status, KVF_ERR_STATE);
}

Test(ctl_client, canceled_lookup_never_calls_back)
{
    kvf_key_t key = {1, 1, 1};
    int owner;

    RUN_UNTIL(kvf_ctl_client_is_registered(g_client));
    g_fake.ignore_lookups = true;
    g_lookups             = 0;
    kvf_ctl_client_lookup(g_client, &key, 1, false, 0, on_lookup, &owner);
    kvf_ctl_client_cancel(g_client, &owner);
    /* wait past the request timeout: nothing may arrive */
    {
        uint64_t until = kvf_time_deadline_ns(1200 * KVF_NSEC_PER_MSEC);

        while (!kvf_time_expired(until)) {
            event_base_loop(g_base, EVLOOP_ONCE | EVLOOP_NONBLOCK);
        }
    }
    cr_assert_eq(g_lookups, 0);
}

static int g_owner_b;
static int g_canceling_calls;

/* A lookup's callback that cancels the lookups of another owner. */
static void on_lookup_cancel_b(void *arg, kvf_status_t status, uint32_t hit,
                               const uint32_t *holders, uint32_t num)
{
    g_canceling_calls++;
    kvf_ctl_client_cancel(g_client, &g_owner_b);
}

/* Requests that time out together are finished one by one, and one's
 * callback may cancel the others (as a fetch that ends does): those never
 * call back, and nothing freed is touched. Many lookups answered in
 * order each find their request. */
Test(ctl_client, a_timeout_callback_may_cancel_other_requests)
{
    kvf_key_t key = {1, 1, 1};
    int a, i;

    RUN_UNTIL(kvf_ctl_client_is_registered(g_client));
    g_lookups = 0;
    for (i = 0; i < 200; i++) {
        kvf_ctl_client_lookup(g_client, &key, 1, false, 0, on_lookup, NULL);
    }
    RUN_UNTIL(g_lookups == 200);
    cr_assert_eq(g_lookup_status, KVF_OK);

    g_fake.ignore_lookups = true;
    g_lookups             = 0;
    g_canceling_calls     = 0;
    kvf_ctl_client_lookup(g_client, &key, 1, false, 50 * KVF_NSEC_PER_MSEC,
                          on_lookup_cancel_b, &a);
    for (i = 0; i < 3; i++) {
        kvf_ctl_client_lookup(g_client, &key, 1, false, 50 * KVF_NSEC_PER_MSEC,
                              on_lookup, &g_owner_b);
    }
    RUN_UNTIL(g_canceling_calls == 1);
    {
        uint64_t until = kvf_time_deadline_ns(300 * KVF_NSEC_PER_MSEC);

        while (!kvf_time_expired(until)) {
            event_base_loop(g_base, EVLOOP_ONCE | EVLOOP_NONBLOCK);
        }
    }
    cr_assert_eq(g_lookups, 0, "a canceled lookup called back");
    cr_assert_eq(g_canceling_calls, 1);
}

Test(ctl_client, lookup_honors_its_own_timeout)
{
    kvf_key_t key = {1, 1, 1};
    uint64_t t0, took;

    RUN_UNTIL(kvf_ctl_client_is_registered(g_client));
    g_fake.ignore_lookups = true;
    g_lookups             = 0;
    t0                    = kvf_time_now_ns();
    kvf_ctl_client_lookup(g_client, &key, 1, false, 50 * KVF_NSEC_PER_MSEC,
                          on_lookup, NULL);
    RUN_UNTIL(g_lookups == 1);
    took = kvf_time_now_ns() - t0;
    cr_assert_eq(g_lookup_status, KVF_ERR_TIMEOUT);
    cr_assert_geq(took, 50 * KVF_NSEC_PER_MSEC);
    cr_assert_lt(took, 500 * KVF_NSEC_PER_MSEC, "not the 1 s default");
}

Test(ctl_client, several_controllers_the_one_that_listens_wins)
{
    char addr[128];
    struct evconnlistener *dead;
    struct sockaddr_in sin;
    socklen_t len = sizeof(sin);

    /* a port nobody listens on (bound, then closed): a standby */
    memset(&sin, 0, sizeof(sin));
    sin.sin_family      = AF_INET;
    sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    dead = evconnlistener_new_bind(g_base, NULL, NULL, LEV_OPT_CLOSE_ON_FREE, 1,
                                   (struct sockaddr *)&sin, sizeof(sin));
    cr_assert_not_null(dead);
    getsockname(evconnlistener_get_fd(dead), (struct sockaddr *)&sin, &len);
    evconnlistener_free(dead);
    kvf_ctl_client_destroy(g_client);
    snprintf(addr, sizeof(addr), "127.0.0.1:%u,127.0.0.1:%u",
             ntohs(sin.sin_port), g_fake.port);
    start_client_at(addr);
    RUN_UNTIL(kvf_ctl_client_is_registered(g_client));
    cr_assert_eq(g_fake.registrations, 1);
}

Test(ctl_client, replies_of_an_older_term_are_not_believed)
{
    kvf_key_t keys[2] = {{1, 1, 1}, {1, 1, 2}};

    g_fake.term = 5;
    RUN_UNTIL(kvf_ctl_client_is_registered(g_client));
    /* a deposed leader (older term) answers: its holders are not used */
    g_fake.term = 4;
    g_lookups   = 0;
    kvf_ctl_client_lookup(g_client, keys, 2, false, 0, on_lookup, NULL);
    RUN_UNTIL(g_lookups == 1);
    cr_assert_neq(g_lookup_status, KVF_OK);
    cr_assert_eq(g_lookup_hit, 0);
    RUN_UNTIL(g_fake.accepts >= 2); /* it reconnected */
    cr_assert(!kvf_ctl_client_is_registered(g_client),
              "a registration of term 4 after 5 is refused");
    /* the newer leader is followed */
    g_fake.term = 6;
    RUN_UNTIL(kvf_ctl_client_is_registered(g_client));
    g_lookups = 0;
    kvf_ctl_client_lookup(g_client, keys, 2, false, 0, on_lookup, NULL);
    RUN_UNTIL(g_lookups == 1);
    cr_assert_eq(g_lookup_status, KVF_OK);
    cr_assert_eq(g_lookup_hit, 1);
}

/* A reply that resets the connection (an older term) in the middle of
 * what one read brought: the connection is dropped inside its handler
 * (freed after it, ASan checks), the frames behind it go with it. */
Test(ctl_client, frames_behind_a_reset_in_one_read_are_dropped)
{
    kvf_key_t keys[2] = {{1, 1, 1}, {1, 1, 2}};

    g_fake.term = 5;
    RUN_UNTIL(kvf_ctl_client_is_registered(g_client));
    g_fake.term             = 4;
    g_fake.pin_after_lookup = true;
    g_lookups               = 0;
    kvf_ctl_client_lookup(g_client, keys, 2, false, 0, on_lookup, NULL);
    RUN_UNTIL(g_lookups == 1);
    cr_assert_neq(g_lookup_status, KVF_OK);
    RUN_UNTIL(g_fake.accepts >= 2); /* it reconnected */
    cr_assert_eq(g_pins, 0, "the command behind the reset was dropped");
}
