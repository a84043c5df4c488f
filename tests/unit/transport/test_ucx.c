/* SPDX-License-Identifier: Apache-2.0 */
/* Copyright (c) 2026 The kvfabric authors */
/*
 * The UCX layer over loopback in one process: a "server" and a "client"
 * worker, each with its own context, on one event_base. No sleeps: every
 * wait runs the loop until a condition holds or a deadline passes.
 */
#include "transport/ucx.h"

#include "common/time.h"
#include "tests/helpers/test_helpers.h"

#include <criterion/criterion.h>
#include <criterion/parameterized.h>

#include <stdlib.h>
#include <string.h>

#define KIB (1024ull)
#define MIB (1024ull * 1024)

#define AM_ID_DATA 3
#define WAIT_NS    (20ull * KVF_NSEC_PER_SEC)

typedef struct op_result {
    int calls;
    kvf_status_t status;
} op_result_t;

typedef struct am_server {
    unsigned char *dest; /* where payloads go */
    size_t dest_len;
    kvf_ucx_mem_t *mem;
    char header[64];
    size_t header_len;
    size_t length;
    bool was_rndv;
    bool keep; /* keep rendezvous messages, receive nothing */
    kvf_ucx_am_msg_t kept[8];
    unsigned kept_count;
    unsigned received;
    op_result_t recv;
    kvf_status_t recv_start;
} am_server_t;

typedef struct fixture {
    struct event_base *base;
    struct event *tick;
    kvf_ucx_ctx_t *srv_ctx;
    kvf_ucx_ctx_t *cli_ctx;
    kvf_ucx_worker_t *srv;
    kvf_ucx_worker_t *cli;
    kvf_ucx_listener_t *listener;
    char peer[64];
    void *srv_addr;
    size_t srv_addr_len;
    unsigned ep_errors;
    kvf_status_t ep_error;
    unsigned accepted;
    unsigned connects; /* sockaddr handshakes started by fixture_connect */
    am_server_t am;
} fixture_t;

static fixture_t g;

static void on_tick(evutil_socket_t fd, short what, void *arg)
{
    /* a heartbeat so EVLOOP_ONCE returns and deadlines are checked */
}

static void on_op(kvf_status_t status, void *arg)
{
    op_result_t *r = arg;

    r->calls++;
    r->status = status;
}

static void on_ep_err(kvf_ucx_ep_t *ep, kvf_status_t status, void *arg)
{
    g.ep_errors++;
    g.ep_error = status;
}

static void on_accept(kvf_ucx_ep_t *ep, const char *peer, void *arg)
{
    g.accepted++;
}

static kvf_status_t on_am(void *arg, const void *header, size_t header_len,
                          const kvf_ucx_am_msg_t *msg)
{
    am_server_t *s = arg;

    s->received++;
    s->header_len = header_len < sizeof(s->header) ? header_len : 0;
    memcpy(s->header, header, s->header_len);
    s->length   = msg->length;
    s->was_rndv = msg->is_rndv;
    if (s->keep && msg->is_rndv && (s->kept_count < 8)) {
        s->kept[s->kept_count++] = *msg;
        return KVF_INPROGRESS;
    }
    s->recv_start = kvf_ucx_am_recv_data(msg, s->dest, s->dest_len, s->mem, 0,
                                         on_op, &s->recv);
    return KVF_OK;
}

static bool loop_until(bool (*cond)(void), uint64_t timeout_ns)
{
    uint64_t deadline = kvf_time_deadline_ns(timeout_ns);

    while (!cond()) {
        if (kvf_time_expired(deadline)) {
            return false;
        }
        event_base_loop(g.base, EVLOOP_ONCE);
    }
    return true;
}

static const op_result_t *g_wait_op;

static bool op_done(void)
{
    return g_wait_op->calls > 0;
}

static void wait_op(const op_result_t *r)
{
    g_wait_op = r;
    cr_assert(loop_until(op_done, WAIT_NS), "operation never completed");
}

static bool srv_recv_done(void)
{
    return g.am.recv.calls > 0;
}

static bool srv_got_am(void)
{
    return g.am.received > 0;
}

typedef struct transport_case {
    char tls[16];
    bool by_address;
} transport_case_t;

static void fixture_up(const char *tls, bool with_listener)
{
    kvf_ucx_ctx_params_t cp = {.field_mask = KVF_UCX_CTX_FIELD_TLS, .tls = tls};
    kvf_ucx_worker_params_t wp = {.field_mask = KVF_UCX_WORKER_FIELD_EP_ERR |
                                                KVF_UCX_WORKER_FIELD_NAME,
                                  .ep_err_cb = on_ep_err,
                                  .name      = "srv"};
    struct timeval tv          = {0, 20000};

    memset(&g, 0, sizeof(g));
    g.base = event_base_new();
    cr_assert_not_null(g.base);
    g.tick = event_new(g.base, -1, EV_PERSIST, on_tick, NULL);
    event_add(g.tick, &tv);

    cr_assert_eq(kvf_ucx_ctx_create(&cp, &g.srv_ctx), KVF_OK);
    cr_assert_eq(kvf_ucx_ctx_create(&cp, &g.cli_ctx), KVF_OK);
    cr_assert_eq(kvf_ucx_worker_create(g.srv_ctx, g.base, &wp, &g.srv), KVF_OK);
    wp.name = "cli";
    cr_assert_eq(kvf_ucx_worker_create(g.cli_ctx, g.base, &wp, &g.cli), KVF_OK);
    if (with_listener) {
        cr_assert_eq(kvf_ucx_listener_create(g.srv, "127.0.0.1", 0, on_accept,
                                             NULL, &g.listener),
                     KVF_OK);
        cr_assert_neq(kvf_ucx_listener_port(g.listener), 0);
        snprintf(g.peer, sizeof(g.peer), "127.0.0.1:%u",
                 kvf_ucx_listener_port(g.listener));
    }
    cr_assert_eq(
        kvf_ucx_worker_address_pack(g.srv, &g.srv_addr, &g.srv_addr_len),
        KVF_OK);
    cr_assert_eq(kvf_ucx_am_set_handler(g.srv, AM_ID_DATA, on_am, &g.am),
                 KVF_OK);
}

static bool all_accepted(void)
{
    return g.accepted >= g.connects;
}

static kvf_ucx_ep_t *fixture_connect(bool by_address)
{
    kvf_ucx_ep_params_t ep = {.field_mask  = KVF_UCX_EP_FIELD_ADDRESS,
                              .address     = g.srv_addr,
                              .address_len = g.srv_addr_len};
    kvf_ucx_ep_t *cli_ep   = NULL;

    kvf_ucx_worker_stats_t before;
    kvf_ucx_worker_stats_t after;

    kvf_ucx_worker_stats(g.cli, &before);
    if (by_address) {
        cr_assert_eq(kvf_ucx_ep_get(g.cli, "srv", &ep, &cli_ep), KVF_OK);
        return cli_ep;
    }
    cr_assert_eq(kvf_ucx_ep_get(g.cli, g.peer, NULL, &cli_ep), KVF_OK);
    kvf_ucx_worker_stats(g.cli, &after);
    if (after.eps > before.eps) {
        /* a new handshake: let it land before anything can destroy the
         * listener (UCX 1.13 crashes otherwise, see ucx.h) */
        g.connects++;
        cr_assert(loop_until(all_accepted, WAIT_NS));
    }
    return cli_ep;
}

static void fixture_down(void)
{
    kvf_ucx_listener_destroy(g.listener);
    kvf_ucx_worker_destroy(g.cli);
    kvf_ucx_worker_destroy(g.srv);
    kvf_ucx_mem_deregister(g.am.mem);
    kvf_ucx_ctx_destroy(g.cli_ctx);
    kvf_ucx_ctx_destroy(g.srv_ctx);
    free(g.srv_addr);
    free(g.am.dest);
    event_free(g.tick);
    event_base_free(g.base);
    memset(&g, 0, sizeof(g));
}

static void fill(unsigned char *buf, size_t len, unsigned seed)
{
    size_t i;

    for (i = 0; i < len; i++) {
        buf[i] = (unsigned char)((i * 131u + seed) ^ (i >> 9));
    }
}

TestSuite(ucx, .fini = kvf_test_check_leaks, .timeout = 120);

Test(ucx, ctx_rejects_unknown_setting)
{
    static const char *const bad[] = {"RNDV_THRESH", "lots", NULL};
    kvf_ucx_ctx_params_t cp        = {.field_mask = KVF_UCX_CTX_FIELD_OVERRIDES,
                                      .overrides  = bad};
    kvf_ucx_ctx_t *ctx             = NULL;

    kvf_test_log_capture_start();
    cr_assert_eq(kvf_ucx_ctx_create(&cp, &ctx), KVF_ERR_CONFIG);
    kvf_test_log_capture_stop();
    cr_assert(kvf_test_log_contains("RNDV_THRESH lots"));
    cr_assert_null(ctx);
    kvf_ucx_ctx_destroy(NULL);
    kvf_ucx_worker_destroy(NULL);
    kvf_ucx_ep_put(NULL);
    kvf_ucx_mem_deregister(NULL);
}

Test(ucx, ctx_pins_devices_and_tunings)
{
    static const char *const ov[] = {"RNDV_THRESH", "32K", NULL};
    kvf_ucx_ctx_params_t cp       = {.field_mask = KVF_UCX_CTX_FIELD_TLS |
                                                   KVF_UCX_CTX_FIELD_NET_DEVICES |
                                                   KVF_UCX_CTX_FIELD_OVERRIDES,
                                     .tls         = "tcp",
                                     .net_devices = "lo",
                                     .overrides   = ov};
    kvf_ucx_ctx_t *ctx            = NULL;

    cr_assert_eq(kvf_ucx_ctx_create(&cp, &ctx), KVF_OK);
    kvf_ucx_ctx_destroy(ctx);
}

ParameterizedTestParameters(ucx, am_eager_and_rndv)
{
    static transport_case_t cases[] = {
        {"tcp", false},
        {"tcp", true},
        {"tcp,cma", true},
    };

    return cr_make_param_array(transport_case_t, cases,
                               sizeof(cases) / sizeof(cases[0]));
}

ParameterizedTest(transport_case_t *tc, ucx, am_eager_and_rndv)
{
    static const size_t sizes[] = {1 * KIB, 256 * KIB, 4 * MIB};
    unsigned char *src;
    kvf_ucx_ep_t *ep;
    op_result_t sent;
    unsigned i;

    fixture_up(tc->tls, !tc->by_address);
    g.am.dest_len = 4 * MIB;
    g.am.dest     = malloc(g.am.dest_len);
    src           = malloc(4 * MIB);
    cr_assert_eq(kvf_ucx_mem_register(g.srv_ctx, g.am.dest, g.am.dest_len,
                                      KVF_UCX_MEM_REMOTE_WRITE, &g.am.mem),
                 KVF_OK);
    ep = fixture_connect(tc->by_address);

    for (i = 0; i < 3; i++) {
        unsigned flags =
            (i == 0) ? KVF_UCX_AM_SEND_EAGER : KVF_UCX_AM_SEND_RNDV;

        fill(src, sizes[i], i);
        memset(g.am.dest, 0, g.am.dest_len);
        memset(&sent, 0, sizeof(sent));
        memset(&g.am.recv, 0, sizeof(g.am.recv));
        g.am.received = 0;
        cr_assert_eq(kvf_ucx_am_send(ep, AM_ID_DATA, "chunk", 5, src, sizes[i],
                                     NULL, flags, 0, on_op, &sent),
                     KVF_OK);
        cr_assert_eq(sent.calls, 0); /* never from inside the call */
        wait_op(&sent);
        cr_assert(loop_until(srv_recv_done, WAIT_NS));
        cr_assert_eq(sent.status, KVF_OK);
        cr_assert_eq(g.am.recv_start, KVF_OK);
        cr_assert_eq(g.am.recv.status, KVF_OK);
        cr_assert_eq(g.am.recv.calls, 1);
        cr_assert_eq(g.am.length, sizes[i]);
        cr_assert_eq(g.am.was_rndv, i != 0);
        cr_assert_eq(g.am.header_len, 5);
        cr_assert(memcmp(g.am.header, "chunk", 5) == 0);
        cr_assert(memcmp(g.am.dest, src, sizes[i]) == 0, "payload %zu differs",
                  sizes[i]);
        cr_assert_eq(sent.calls, 1);
    }

    /* a payload bigger than the destination is declined, not written */
    g.am.dest_len = 64 * KIB;
    memset(&sent, 0, sizeof(sent));
    memset(&g.am.recv, 0, sizeof(g.am.recv));
    g.am.received = 0;
    cr_assert_eq(kvf_ucx_am_send(ep, AM_ID_DATA, "big", 3, src, 1 * MIB, NULL,
                                 KVF_UCX_AM_SEND_RNDV, 0, on_op, &sent),
                 KVF_OK);
    wait_op(&sent);
    cr_assert(loop_until(srv_got_am, WAIT_NS));
    cr_assert_eq(g.am.recv_start, KVF_ERR_TOO_BIG);
    cr_assert_eq(g.am.recv.calls, 0);
    g.am.dest_len = 4 * MIB;

    kvf_ucx_ep_put(ep);
    free(src);
    fixture_down();
}

Test(ucx, am_rndv_received_after_the_handler)
{
    unsigned char *src = malloc(1 * MIB);
    kvf_ucx_ep_t *ep;
    op_result_t sent = {0};
    op_result_t recv = {0};

    fixture_up("tcp", true);
    g.am.dest_len = 1 * MIB;
    g.am.dest     = malloc(g.am.dest_len);
    g.am.keep     = true;
    ep            = fixture_connect(false);
    fill(src, 1 * MIB, 9);
    cr_assert_eq(kvf_ucx_am_send(ep, AM_ID_DATA, "k", 1, src, 1 * MIB, NULL,
                                 KVF_UCX_AM_SEND_RNDV, 0, on_op, &sent),
                 KVF_OK);
    cr_assert(loop_until(srv_got_am, WAIT_NS));
    cr_assert_eq(g.am.kept_count, 1);
    cr_assert_eq(sent.calls, 0); /* data still at the sender */
    cr_assert_eq(kvf_ucx_am_recv_data(&g.am.kept[0], g.am.dest, g.am.dest_len,
                                      NULL, 0, on_op, &recv),
                 KVF_OK);
    wait_op(&recv);
    wait_op(&sent);
    cr_assert_eq(recv.status, KVF_OK);
    cr_assert_eq(sent.status, KVF_OK);
    cr_assert(memcmp(g.am.dest, src, 1 * MIB) == 0);
    kvf_ucx_ep_put(ep);
    free(src);
    fixture_down();
}

/* Many chunks as one message: gathered at the sender from pieces of
 * different sizes, scattered at the receiver over a different split. */
Test(ucx, am_iov_gathers_and_scatters_byte_identical)
{
    static const size_t send_split[] = {16 * KIB, 64 * KIB, 176 * KIB};
    static const size_t recv_split[] = {48 * KIB, 16 * KIB, 192 * KIB};
    unsigned char *src               = malloc(256 * KIB);
    unsigned char *dst               = calloc(1, 512 * KIB);
    kvf_ucx_iov_t siov[3], riov[3];
    kvf_ucx_ep_t *ep;
    size_t at, rat, i;
    unsigned round;

    fixture_up("tcp", true);
    g.am.keep     = true;
    g.am.dest_len = 256 * KIB;
    g.am.dest     = malloc(g.am.dest_len);
    ep            = fixture_connect(false);
    for (round = 0; round < 2; round++) {
        op_result_t sent = {0}, recv = {0};
        unsigned flags =
            (round == 0) ? KVF_UCX_AM_SEND_RNDV : KVF_UCX_AM_SEND_EAGER;

        fill(src, 256 * KIB, 11 + round);
        memset(dst, 0, 512 * KIB);
        for (i = 0, at = 0, rat = 0; i < 3; i++) {
            siov[i].buf = src + at;
            siov[i].len = send_split[i];
            /* scattered pieces with gaps between them */
            riov[i].buf = dst + 2 * rat;
            riov[i].len = recv_split[i];
            at += send_split[i];
            rat += recv_split[i];
        }
        g.am.kept_count = 0;
        g.am.received   = 0;
        memset(&g.am.recv, 0, sizeof(g.am.recv));
        cr_assert_eq(kvf_ucx_am_send_iov(ep, AM_ID_DATA, "v", 1, siov, 3, flags,
                                         0, on_op, &sent),
                     KVF_OK);
        cr_assert(loop_until(srv_got_am, WAIT_NS));
        cr_assert_eq(g.am.length, 256 * KIB);
        if (round == 0) {
            cr_assert_eq(g.am.kept_count, 1);
            /* lengths that do not add up: declined, nothing written */
            riov[2].len--;
            cr_assert_eq(kvf_ucx_am_recv_data_iov(&g.am.kept[0], riov, 3, 0,
                                                  on_op, &recv),
                         KVF_ERR_INVALID);
            wait_op(&sent);
            cr_assert_eq(recv.calls, 0);
            /* again, received this time */
            riov[2].len++;
            memset(&sent, 0, sizeof(sent));
            g.am.kept_count = 0;
            g.am.received   = 0;
            cr_assert_eq(kvf_ucx_am_send_iov(ep, AM_ID_DATA, "v", 1, siov, 3,
                                             flags, 0, on_op, &sent),
                         KVF_OK);
            cr_assert(loop_until(srv_got_am, WAIT_NS));
            cr_assert_eq(g.am.kept_count, 1);
            cr_assert_eq(kvf_ucx_am_recv_data_iov(&g.am.kept[0], riov, 3, 0,
                                                  on_op, &recv),
                         KVF_OK);
        } else {
            /* eager: the handler received it whole; scatter that */
            cr_assert_eq(g.am.kept_count, 0);
            cr_assert(loop_until(srv_recv_done, WAIT_NS));
            recv.calls  = 1;
            recv.status = KVF_OK;
            for (i = 0, at = 0; i < 3; i++) {
                memcpy(riov[i].buf, g.am.dest + at, riov[i].len);
                at += riov[i].len;
            }
        }
        wait_op(&recv);
        wait_op(&sent);
        cr_assert_eq(recv.status, KVF_OK);
        cr_assert_eq(sent.status, KVF_OK);
        for (i = 0, at = 0; i < 3; i++) {
            cr_assert(memcmp(riov[i].buf, src + at, riov[i].len) == 0,
                      "piece %zu of round %u differs", i, round);
            at += riov[i].len;
        }
    }
    kvf_ucx_ep_put(ep);
    free(src);
    free(dst);
    fixture_down();
}

Test(ucx, mem_register_rejects_bad_args)
{
    char buf[64];
    kvf_ucx_mem_t *mem = NULL;

    fixture_up("tcp", false);
    cr_assert_eq(kvf_ucx_mem_register(g.srv_ctx, NULL, 10, 0, &mem),
                 KVF_ERR_INVALID);
    cr_assert_eq(kvf_ucx_mem_register(g.srv_ctx, buf, 0, 0, &mem),
                 KVF_ERR_INVALID);
    cr_assert_eq(kvf_ucx_mem_register(g.srv_ctx, buf, sizeof(buf), 0x80, &mem),
                 KVF_ERR_INVALID);
    cr_assert_null(mem);
    fixture_down();
}

Test(ucx, ep_cache_returns_one_ep_per_peer)
{
    kvf_ucx_worker_stats_t st;
    kvf_ucx_ep_t *a;
    kvf_ucx_ep_t *b;
    kvf_ucx_ep_t *c = NULL;
    char longname[200];

    fixture_up("tcp", true);
    a = fixture_connect(false);
    b = fixture_connect(false);
    cr_assert_eq(a, b);
    cr_assert_str_eq(kvf_ucx_ep_peer(a), g.peer);
    kvf_ucx_worker_stats(g.cli, &st);
    cr_assert_eq(st.eps_cached, 1);
    cr_assert_eq(st.eps, 1);

    memset(longname, 'x', sizeof(longname) - 1);
    longname[sizeof(longname) - 1] = '\0';
    cr_assert_eq(kvf_ucx_ep_get(g.cli, longname, NULL, &c), KVF_ERR_TOO_BIG);
    cr_assert_eq(kvf_ucx_ep_get(g.cli, "no-port", NULL, &c), KVF_ERR_INVALID);
    cr_assert_null(c);

    kvf_ucx_ep_put(a);
    kvf_ucx_ep_put(b);
    kvf_ucx_worker_stats(g.cli, &st);
    cr_assert_eq(st.eps_cached, 1); /* the cache keeps its reference */
    fixture_down();
}

static bool accepted_one(void)
{
    return g.accepted > 0;
}

static bool cli_saw_error(void)
{
    return g.ep_errors > 0;
}

Test(ucx, peer_gone_fails_inflight_ops_once)
{
    unsigned char *src = malloc(1 * MIB);
    kvf_ucx_worker_stats_t st;
    op_result_t r[3];
    op_result_t f = {0};
    kvf_ucx_ep_t *ep;
    kvf_ucx_ep_t *again;
    unsigned i;

    fixture_up("tcp", true);
    g.am.keep = true; /* the server never pulls the data */
    ep        = fixture_connect(false);
    memset(r, 0, sizeof(r));
    fill(src, 1 * MIB, 1);
    for (i = 0; i < 3; i++) {
        cr_assert_eq(kvf_ucx_am_send(ep, AM_ID_DATA, "x", 1, src, 1 * MIB, NULL,
                                     KVF_UCX_AM_SEND_RNDV, 0, on_op, &r[i]),
                     KVF_OK);
    }
    cr_assert(loop_until(accepted_one, WAIT_NS));
    cr_assert(loop_until(srv_got_am, WAIT_NS));
    cr_assert_eq(r[0].calls, 0);

    /* the server goes away without a goodbye (and without pulling the
     * data: releasing the messages would complete the sends) */
    kvf_ucx_listener_destroy(g.listener);
    g.listener = NULL;
    kvf_ucx_worker_destroy(g.srv);
    g.srv = NULL;

    g.ep_errors = 0; /* the server's own worker does not report */
    cr_assert(loop_until(cli_saw_error, WAIT_NS), "peer loss not seen");
    for (i = 0; i < 3; i++) {
        wait_op(&r[i]);
        cr_assert_eq(r[i].calls, 1);
        cr_assert(r[i].status == KVF_ERR_CLOSED, "op %u: %s", i,
                  kvf_strerror(r[i].status));
    }
    cr_assert(kvf_ucx_ep_is_failed(ep));

    /* new operations on it are refused at once */
    cr_assert_eq(
        kvf_ucx_am_send(ep, AM_ID_DATA, "x", 1, src, 16, NULL, 0, 0, on_op, &f),
        KVF_ERR_CLOSED);
    /* the cache forgot it: the next get makes a new one */
    kvf_ucx_worker_stats(g.cli, &st);
    cr_assert_eq(st.eps_cached, 0);
    cr_assert_eq(st.ep_failures, 1);
    kvf_ucx_ep_put(ep);
    kvf_ucx_worker_progress(g.cli);
    kvf_ucx_worker_stats(g.cli, &st);
    cr_assert_eq(st.ops_inflight, 0);
    cr_assert_eq(st.ops_free, 1024);
    cr_assert_eq(st.eps, 0);
    (void)again;
    free(src);
    fixture_down();
}

Test(ucx, timeout_fails_op_and_endpoint)
{
    unsigned char *src = malloc(1 * MIB);
    kvf_ucx_worker_stats_t st;
    op_result_t late  = {0};
    op_result_t other = {0};
    kvf_ucx_ep_t *ep;
    uint64_t start;
    unsigned i;

    fixture_up("tcp", true);
    g.am.keep = true;
    ep        = fixture_connect(false);
    fill(src, 1 * MIB, 2);
    start = kvf_time_now_ns();
    cr_assert_eq(kvf_ucx_am_send(ep, AM_ID_DATA, "x", 1, src, 1 * MIB, NULL,
                                 KVF_UCX_AM_SEND_RNDV, 300 * KVF_NSEC_PER_MSEC,
                                 on_op, &late),
                 KVF_OK);
    cr_assert_eq(kvf_ucx_am_send(ep, AM_ID_DATA, "y", 1, src, 1 * MIB, NULL,
                                 KVF_UCX_AM_SEND_RNDV, 0, on_op, &other),
                 KVF_OK);
    wait_op(&late);
    wait_op(&other);
    cr_assert_eq(late.status, KVF_ERR_TIMEOUT);
    cr_assert_geq(kvf_time_now_ns() - start, 300 * KVF_NSEC_PER_MSEC);
    cr_assert_eq(other.status, KVF_ERR_CLOSED);
    cr_assert(loop_until(cli_saw_error, WAIT_NS));
    cr_assert_eq(g.ep_error, KVF_ERR_TIMEOUT);
    kvf_ucx_worker_stats(g.cli, &st);
    cr_assert_eq(st.timeouts, 1);
    cr_assert_eq(late.calls, 1);
    cr_assert_eq(other.calls, 1);

    for (i = 0; i < g.am.kept_count; i++) {
        kvf_ucx_am_msg_release(&g.am.kept[i]);
    }
    kvf_ucx_ep_put(ep);
    free(src);
    fixture_down();
}

Test(ucx, worker_destroy_cancels_inflight_ops)
{
    unsigned char *src = malloc(1 * MIB);
    op_result_t r      = {0};
    kvf_ucx_ep_t *ep;
    unsigned i;

    fixture_up("tcp", true);
    g.am.keep = true;
    ep        = fixture_connect(false);
    fill(src, 1 * MIB, 3);
    cr_assert_eq(kvf_ucx_am_send(ep, AM_ID_DATA, "x", 1, src, 1 * MIB, NULL,
                                 KVF_UCX_AM_SEND_RNDV, 0, on_op, &r),
                 KVF_OK);
    cr_assert(loop_until(srv_got_am, WAIT_NS));
    kvf_ucx_ep_put(ep); /* the cache still holds it */
    kvf_ucx_worker_destroy(g.cli);
    g.cli = NULL;
    cr_assert_eq(r.calls, 1);
    cr_assert_eq(r.status, KVF_ERR_CANCELED);
    for (i = 0; i < g.am.kept_count; i++) {
        kvf_ucx_am_msg_release(&g.am.kept[i]);
    }
    free(src);
    fixture_down();
}

Test(ucx, op_pool_exhaustion_is_busy)
{
    kvf_ucx_worker_params_t wp = {.field_mask = KVF_UCX_WORKER_FIELD_MAX_OPS,
                                  .max_ops    = 2};
    kvf_ucx_worker_t *w        = NULL;
    op_result_t r[3];

    memset(r, 0, sizeof(r));
    fixture_up("tcp", false);
    cr_assert_eq(kvf_ucx_worker_create(g.cli_ctx, g.base, &wp, &w), KVF_OK);
    cr_assert_eq(kvf_ucx_worker_flush(w, 0, on_op, &r[0]), KVF_OK);
    cr_assert_eq(kvf_ucx_worker_flush(w, 0, on_op, &r[1]), KVF_OK);
    cr_assert_eq(kvf_ucx_worker_flush(w, 0, on_op, &r[2]), KVF_ERR_BUSY);
    cr_assert_eq(kvf_ucx_worker_flush(w, 0, NULL, NULL), KVF_ERR_INVALID);
    wait_op(&r[0]);
    wait_op(&r[1]);
    cr_assert_eq(r[0].status, KVF_OK);
    cr_assert_eq(r[2].calls, 0);
    cr_assert_eq(kvf_ucx_am_set_handler(w, KVF_UCX_AM_ID_MAX, on_am, NULL),
                 KVF_ERR_RANGE);
    kvf_ucx_worker_destroy(w);
    fixture_down();
}

static void on_ops_freed(void *arg)
{
    (*(unsigned *)arg)++;
}

static bool two_kept(void)
{
    return g.am.kept_count >= 2;
}

/* A worker that refused a call for want of an operation says when one is
 * back: once per spell, and not when nothing was refused. */
Test(ucx, a_freed_operation_is_told_once_after_a_refusal)
{
    kvf_ucx_worker_params_t wp = {.field_mask = KVF_UCX_WORKER_FIELD_MAX_OPS,
                                  .max_ops    = 2};
    unsigned char *src         = malloc(1 * MIB);
    kvf_ucx_worker_t *w        = NULL;
    kvf_ucx_ep_t *ep           = NULL;
    kvf_ucx_ep_params_t epp;
    op_result_t sent[3], recv[2];
    unsigned freed = 0, i;

    memset(sent, 0, sizeof(sent));
    memset(recv, 0, sizeof(recv));
    fixture_up("tcp", false);
    g.am.dest_len = 1 * MIB;
    g.am.dest     = malloc(g.am.dest_len);
    g.am.keep     = true;
    cr_assert_eq(kvf_ucx_worker_create(g.cli_ctx, g.base, &wp, &w), KVF_OK);
    kvf_ucx_worker_on_ops_freed(w, on_ops_freed, &freed);
    epp = (kvf_ucx_ep_params_t){.field_mask  = KVF_UCX_EP_FIELD_ADDRESS,
                                .address     = g.srv_addr,
                                .address_len = g.srv_addr_len};
    cr_assert_eq(kvf_ucx_ep_get(w, "srv", &epp, &ep), KVF_OK);
    fill(src, 1 * MIB, 3);
    /* two rendezvous sends the receiver keeps: both operations taken */
    for (i = 0; i < 2; i++) {
        cr_assert_eq(kvf_ucx_am_send(ep, AM_ID_DATA, "k", 1, src, 1 * MIB, NULL,
                                     KVF_UCX_AM_SEND_RNDV, 0, on_op, &sent[i]),
                     KVF_OK);
    }
    cr_assert(loop_until(two_kept, WAIT_NS));
    cr_assert_eq(freed, 0);
    cr_assert_eq(kvf_ucx_am_send(ep, AM_ID_DATA, "k", 1, src, 1 * MIB, NULL,
                                 KVF_UCX_AM_SEND_RNDV, 0, on_op, &sent[2]),
                 KVF_ERR_BUSY);
    cr_assert_eq(freed, 0, "told before an operation was back");
    for (i = 0; i < 2; i++) {
        cr_assert_eq(kvf_ucx_am_recv_data(&g.am.kept[i], g.am.dest,
                                          g.am.dest_len, NULL, 0, on_op,
                                          &recv[i]),
                     KVF_OK);
        wait_op(&recv[i]);
        wait_op(&sent[i]);
        cr_assert_eq(sent[i].status, KVF_OK);
        cr_assert_eq(freed, 1, "after send %u", i);
    }
    cr_assert_eq(sent[2].calls, 0);
    kvf_ucx_ep_put(ep);
    kvf_ucx_worker_destroy(w);
    free(src);
    fixture_down();
}

#define AM_ID_REPLY 4

typedef struct reply_state {
    kvf_ucx_ep_t *reply_ep; /* held */
    unsigned got;
    char text[16];
} reply_state_t;

static reply_state_t g_reply;

static kvf_status_t on_ask(void *arg, const void *header, size_t header_len,
                           const kvf_ucx_am_msg_t *msg)
{
    if (msg->reply_ep != NULL) {
        kvf_ucx_ep_hold(msg->reply_ep);
        g_reply.reply_ep = msg->reply_ep;
    }
    return KVF_OK;
}

static kvf_status_t on_answer(void *arg, const void *header, size_t header_len,
                              const kvf_ucx_am_msg_t *msg)
{
    g_reply.got++;
    if (!msg->is_rndv && (msg->length < sizeof(g_reply.text))) {
        memcpy(g_reply.text, msg->data, msg->length);
    }
    return KVF_OK;
}

static bool reply_ep_known(void)
{
    return g_reply.reply_ep != NULL;
}

static bool answer_arrived(void)
{
    return g_reply.got > 0;
}

Test(ucx, am_reply_goes_back_on_the_accepted_ep)
{
    op_result_t r = {0};
    kvf_ucx_ep_t *ep;

    memset(&g_reply, 0, sizeof(g_reply));
    fixture_up("tcp", true);
    cr_assert_eq(kvf_ucx_am_set_handler(g.srv, AM_ID_REPLY, on_ask, NULL),
                 KVF_OK);
    cr_assert_eq(kvf_ucx_am_set_handler(g.cli, AM_ID_REPLY, on_answer, NULL),
                 KVF_OK);
    ep = fixture_connect(false);
    cr_assert_eq(kvf_ucx_am_send(ep, AM_ID_REPLY, "q", 1, NULL, 0, NULL, 0, 0,
                                 on_op, &r),
                 KVF_OK);
    cr_assert(loop_until(reply_ep_known, WAIT_NS));
    cr_assert_eq(g.accepted, 1);
    memset(&r, 0, sizeof(r));
    cr_assert_eq(kvf_ucx_am_send(g_reply.reply_ep, AM_ID_REPLY, "a", 1, "hello",
                                 5, NULL, KVF_UCX_AM_SEND_EAGER, 0, on_op, &r),
                 KVF_OK);
    cr_assert(loop_until(answer_arrived, WAIT_NS));
    cr_assert_str_eq(g_reply.text, "hello");
    wait_op(&r);
    cr_assert_eq(r.status, KVF_OK);
    kvf_ucx_ep_put(g_reply.reply_ep);
    kvf_ucx_ep_put(ep);
    fixture_down();
}

Test(ucx, failed_ep_leaves_the_cache_and_reconnects)
{
    kvf_ucx_worker_stats_t st;
    op_result_t r = {0};
    kvf_ucx_ep_t *old;
    kvf_ucx_ep_t *ep;

    fixture_up("tcp", true);
    g.am.dest_len = 4096;
    g.am.dest     = calloc(1, g.am.dest_len);
    old           = fixture_connect(false);
    kvf_ucx_ep_fail(old, KVF_ERR_CLOSED);
    kvf_ucx_ep_fail(old, KVF_ERR_TIMEOUT); /* once only */
    cr_assert(loop_until(cli_saw_error, WAIT_NS));
    cr_assert_eq(g.ep_error, KVF_ERR_CLOSED);
    cr_assert_eq(kvf_ucx_am_send(old, AM_ID_DATA, "x", 1, "abc", 3, NULL, 0, 0,
                                 on_op, &r),
                 KVF_ERR_CLOSED);

    ep = fixture_connect(false);
    cr_assert_neq(ep, old);
    cr_assert_eq(kvf_ucx_am_send(ep, AM_ID_DATA, "x", 1, "abc", 3, NULL, 0, 0,
                                 on_op, &r),
                 KVF_OK);
    wait_op(&r);
    cr_assert_eq(r.status, KVF_OK);
    cr_assert(loop_until(srv_recv_done, WAIT_NS));
    cr_assert(memcmp(g.am.dest, "abc", 3) == 0);
    kvf_ucx_worker_stats(g.cli, &st);
    cr_assert_eq(st.ep_failures, 1);
    cr_assert_eq(st.eps_cached, 1);
    kvf_ucx_ep_put(old);
    kvf_ucx_ep_put(ep);
    fixture_down();
}

Test(ucx, listener_rejects_bad_host_and_busy_port)
{
    kvf_ucx_listener_t *l = NULL;

    fixture_up("tcp", true);
    cr_assert_eq(kvf_ucx_listener_create(g.srv, "127.0.0.1",
                                         kvf_ucx_listener_port(g.listener),
                                         on_accept, NULL, &l),
                 KVF_ERR_TRANSPORT);
    cr_assert_eq(
        kvf_ucx_listener_create(g.srv, "256.1.1.1", 0, on_accept, NULL, &l),
        KVF_ERR_INVALID);
    cr_assert_null(l);
    cr_assert_eq(
        kvf_ucx_listener_create(g.srv, "127.0.0.1", 0, NULL, NULL, NULL),
        KVF_ERR_INVALID);
    fixture_down();
}

static bool accepted_two(void)
{
    return g.accepted >= 2;
}

Test(ucx, bad_arguments_are_refused_without_callbacks)
{
    kvf_ucx_ep_params_t none = {.field_mask = 0};
    unsigned char buf[4096];
    kvf_ucx_ep_t *other = NULL;
    kvf_ucx_ep_t *ep;
    op_result_t r = {0};

    fixture_up("tcp", true);
    ep = fixture_connect(false);

    /* no address at all; a port already taken */
    cr_assert_eq(kvf_ucx_ep_create(g.cli, &none, &other), KVF_ERR_INVALID);
    cr_assert_eq(kvf_ucx_ep_create(g.cli, NULL, &other), KVF_ERR_INVALID);

    /* am: id out of range, contradictory flags, no callback */
    cr_assert_eq(kvf_ucx_am_send(ep, KVF_UCX_AM_ID_MAX, NULL, 0, buf, 8, NULL,
                                 0, 0, on_op, &r),
                 KVF_ERR_INVALID);
    cr_assert_eq(kvf_ucx_am_send(ep, AM_ID_DATA, NULL, 0, buf, 8, NULL,
                                 KVF_UCX_AM_SEND_EAGER | KVF_UCX_AM_SEND_RNDV,
                                 0, on_op, &r),
                 KVF_ERR_INVALID);
    cr_assert_eq(kvf_ucx_am_send(ep, AM_ID_DATA, NULL, 0, buf, 8, NULL, 0, 0,
                                 NULL, NULL),
                 KVF_ERR_INVALID);

    /* a second endpoint, so that two handshakes complete below */
    cr_assert_eq(kvf_ucx_ep_create(g.cli,
                                   &(kvf_ucx_ep_params_t){
                                       .field_mask = KVF_UCX_EP_FIELD_SOCKADDR,
                                       .sockaddr   = g.peer},
                                   &other),
                 KVF_OK);
    /* iov: none, too many pieces */
    cr_assert_eq(
        kvf_ucx_am_send_iov(ep, AM_ID_DATA, NULL, 0, NULL, 1, 0, 0, on_op, &r),
        KVF_ERR_INVALID);
    cr_assert_eq(kvf_ucx_am_send_iov(ep, AM_ID_DATA, NULL, 0,
                                     &(kvf_ucx_iov_t){buf, 8},
                                     KVF_UCX_IOV_MAX + 1, 0, 0, on_op, &r),
                 KVF_ERR_INVALID);
    cr_assert_eq(r.calls, 0);
    /* both handshakes done before the listener goes: UCX 1.13 can crash
     * (ucp_cm_server_conn_request_cb on its async thread) when one lands
     * while the listener is destroyed */
    cr_assert(loop_until(accepted_two, WAIT_NS));

    kvf_ucx_ep_put(other);
    kvf_ucx_ep_put(ep);
    fixture_down();
}
