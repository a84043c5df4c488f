/* SPDX-License-Identifier: Apache-2.0 */
/* Copyright (c) 2026 The kvfabric authors */
#include "agent/mesh.h"
#include "common/time.h"
#include "tests/helpers/test_helpers.h"

#include <criterion/criterion.h>
#include <event2/event.h>

#include <string.h>

static struct event_base *g_base;
static kvf_ucx_ctx_t *g_ctx;
static kvf_ucx_worker_t *g_worker;
static kvf_mesh_t *g_mesh;

static void mesh_setup(void)
{
    kvf_ucx_ctx_params_t cp = {.field_mask = KVF_UCX_CTX_FIELD_TLS,
                               .tls        = "tcp"};

    g_base = event_base_new();
    cr_assert_not_null(g_base);
    cr_assert_eq(kvf_ucx_ctx_create(&cp, &g_ctx), KVF_OK);
    cr_assert_eq(kvf_ucx_worker_create(g_ctx, g_base, NULL, &g_worker), KVF_OK);
    kvf_mesh_params_t mp = {.base = g_base, .worker = g_worker, .name = "t"};

    cr_assert_eq(kvf_mesh_create(&mp, &g_mesh), KVF_OK);
}

static void mesh_teardown(void)
{
    kvf_ucx_worker_destroy(g_worker);
    kvf_mesh_destroy(g_mesh);
    kvf_ucx_ctx_destroy(g_ctx);
    event_base_free(g_base);
    kvf_test_check_leaks();
}

TestSuite(mesh, .init = mesh_setup, .fini = mesh_teardown, .timeout = 30);

Test(mesh, directory_finds_nodes_by_id_and_by_name)
{
    uint32_t id = 0;

    cr_assert_null(kvf_mesh_node_by_id(g_mesh, 7));
    kvf_mesh_node_store(g_mesh, 7, NULL, "127.0.0.1:7000");
    cr_assert_str_eq(kvf_mesh_node_by_id(g_mesh, 7), "127.0.0.1:7000");
    cr_assert_null(kvf_mesh_node_by_name(g_mesh, "dec", NULL));

    /* a later answer names it: one entry, both ways */
    kvf_mesh_node_store(g_mesh, 7, "dec", "127.0.0.1:7001");
    cr_assert_str_eq(kvf_mesh_node_by_id(g_mesh, 7), "127.0.0.1:7001");
    cr_assert_str_eq(kvf_mesh_node_by_name(g_mesh, "dec", NULL),
                     "127.0.0.1:7001");
    /* an answer by id only keeps the name */
    kvf_mesh_node_store(g_mesh, 7, NULL, "127.0.0.1:7002");
    cr_assert_str_eq(kvf_mesh_node_by_name(g_mesh, "dec", &id),
                     "127.0.0.1:7002");
    cr_assert_eq(id, 7);

    kvf_mesh_node_forget(g_mesh, 0, "dec");
    cr_assert_null(kvf_mesh_node_by_id(g_mesh, 7));
    cr_assert_null(kvf_mesh_node_by_name(g_mesh, "dec", NULL));
}

Test(mesh, directory_keeps_a_bounded_number_of_nodes)
{
    char addr[32];
    uint32_t id;

    for (id = 1; id <= 1000; id++) {
        snprintf(addr, sizeof(addr), "10.0.0.1:%u", id);
        kvf_mesh_node_store(g_mesh, id, NULL, addr);
    }
    cr_assert_str_eq(kvf_mesh_node_by_id(g_mesh, 1000), "10.0.0.1:1000");
    cr_assert_null(kvf_mesh_node_by_id(g_mesh, 1));
    /* an address too long is not kept */
    kvf_mesh_node_store(
        g_mesh, 5000, NULL,
        "a-very-long-host-name-that-does-not-fit-in-the-directory-entry."
        "example:1");
    cr_assert_null(kvf_mesh_node_by_id(g_mesh, 5000));
}

Test(mesh, decode_drops_and_counts_what_a_handler_does_not_take)
{
    static const uint16_t fetch[] = {KVF_MSG_PEER_FETCH};
    uint8_t buf[256], junk[64];
    Kvf__PeerChunk chunk;
    kvf_mesh_stats_t st;
    kvf_frame_t frame;
    size_t len = 0;

    kvf__peer_chunk__init(&chunk);
    chunk.request_id = 42;
    cr_assert_eq(kvf_frame_pack(buf, sizeof(buf), KVF_MSG_PEER_CHUNK, 0,
                                &chunk.base, sizeof(buf), &len),
                 KVF_OK);
    /* the right frame, the wrong type for this id */
    cr_assert_eq(kvf_mesh_decode(g_mesh, buf, len, sizeof(buf), fetch, 1,
                                 "PEER_FETCH", &frame),
                 KVF_ERR_PROTO);
    /* garbage, and a frame over the bound */
    memset(junk, 0xff, sizeof(junk));
    cr_assert_eq(kvf_mesh_decode(g_mesh, junk, sizeof(junk), sizeof(buf), fetch,
                                 1, "PEER_FETCH", &frame),
                 KVF_ERR_PROTO);
    cr_assert_eq(kvf_mesh_decode(g_mesh, buf, len, len - 1, fetch, 1,
                                 "PEER_FETCH", &frame),
                 KVF_ERR_PROTO);
    cr_assert_eq(
        kvf_mesh_decode(g_mesh, NULL, 0, 16, fetch, 1, "PEER_FETCH", &frame),
        KVF_ERR_PROTO);
    kvf_mesh_get_stats(g_mesh, &st);
    cr_assert_eq(st.dropped[KVF_MESH_DROP_WRONG_TYPE], 1);
    cr_assert_eq(st.dropped[KVF_MESH_DROP_MALFORMED], 3);

    /* what it does take */
    {
        static const uint16_t chunk_type[] = {KVF_MSG_PEER_CHUNK};

        cr_assert_eq(kvf_mesh_decode(g_mesh, buf, len, sizeof(buf), chunk_type,
                                     1, "PEER_CHUNK", &frame),
                     KVF_OK);
        cr_assert_eq(((Kvf__PeerChunk *)frame.msg)->request_id, 42);
        kvf_frame_release(&frame, NULL);
    }
}

/* ------------------------------------------------------ deferred sends */

/* A sender whose worker has two operations, both held by a receiver that
 * keeps two rendezvous messages unreceived: every send after them waits
 * (the mesh's deferred queue) and ends only by its own timeout or by its
 * endpoint failing. */

typedef struct held {
    kvf_ucx_am_msg_t kept[4];
    unsigned n;
} held_t;

typedef struct sent {
    unsigned calls;
    kvf_status_t status;
    uint64_t tag;
} sent_t;

static held_t g_held;

static kvf_status_t keep_rndv(void *arg, const void *header, size_t header_len,
                              const kvf_ucx_am_msg_t *msg)
{
    held_t *h = arg;

    if (msg->is_rndv && (h->n < 4)) {
        h->kept[h->n++] = *msg;
        return KVF_INPROGRESS;
    }
    return KVF_OK;
}

static void on_frame_sent(kvf_status_t status, void *arg, uint64_t tag)
{
    sent_t *s = arg;

    s->calls++;
    s->status = status;
    s->tag    = tag;
}

static void on_am_sent(kvf_status_t status, void *arg)
{
    sent_t *s = arg;

    s->calls++;
    s->status = status;
}

static void on_tick(evutil_socket_t fd, short what, void *arg)
{
    /* so that EVLOOP_ONCE returns and the deferred timer is seen */
}

static bool loop_until(struct event_base *base, const unsigned *count,
                       unsigned want)
{
    uint64_t deadline = kvf_time_deadline_ns(10ull * 1000 * 1000 * 1000);

    while (*count < want) {
        if (kvf_time_expired(deadline)) {
            return false;
        }
        event_base_loop(base, EVLOOP_ONCE);
    }
    return true;
}

/* A sender whose worker has 2 operations, both taken by rendezvous sends
 * the receiver keeps unreceived: every later send waits in the mesh. */
typedef struct defer_pair {
    struct event_base *base;
    struct event *tick;
    kvf_ucx_ctx_t *srv_ctx, *cli_ctx;
    kvf_ucx_worker_t *srv, *cli;
    kvf_mesh_t *mesh;
    kvf_ucx_ep_t *ep;
    void *addr;
    sent_t held[2]; /* the two sends that hold the operations */
} defer_pair_t;

static void defer_pair_open(defer_pair_t *p)
{
    static uint8_t big[1u << 20];
    kvf_ucx_ctx_params_t cp    = {.field_mask = KVF_UCX_CTX_FIELD_TLS,
                                  .tls        = "tcp"};
    kvf_ucx_worker_params_t wp = {.field_mask = KVF_UCX_WORKER_FIELD_MAX_OPS,
                                  .max_ops    = 2};
    kvf_mesh_am_payload_t rndv = {.header     = "h",
                                  .header_len = 1,
                                  .data       = big,
                                  .len        = sizeof(big),
                                  .flags      = KVF_UCX_AM_SEND_RNDV};
    struct timeval tv          = {0, 5000};
    kvf_ucx_ep_params_t epp;
    size_t addr_len;
    unsigned i;

    memset(p, 0, sizeof(*p));
    memset(&g_held, 0, sizeof(g_held));
    p->base = event_base_new();
    cr_assert_not_null(p->base);
    p->tick = event_new(p->base, -1, EV_PERSIST, on_tick, NULL);
    event_add(p->tick, &tv);
    cr_assert_eq(kvf_ucx_ctx_create(&cp, &p->srv_ctx), KVF_OK);
    cr_assert_eq(kvf_ucx_ctx_create(&cp, &p->cli_ctx), KVF_OK);
    cr_assert_eq(kvf_ucx_worker_create(p->srv_ctx, p->base, NULL, &p->srv),
                 KVF_OK);
    cr_assert_eq(kvf_ucx_worker_create(p->cli_ctx, p->base, &wp, &p->cli),
                 KVF_OK);
    cr_assert_eq(kvf_ucx_am_set_handler(p->srv, KVF_MESH_AM_PEER_CHUNK,
                                        keep_rndv, &g_held),
                 KVF_OK);
    kvf_mesh_params_t mp = {
        .base = p->base, .worker = p->cli, .name = "sender"};

    cr_assert_eq(kvf_mesh_create(&mp, &p->mesh), KVF_OK);
    cr_assert_eq(kvf_ucx_worker_address_pack(p->srv, &p->addr, &addr_len),
                 KVF_OK);
    epp = (kvf_ucx_ep_params_t){.field_mask  = KVF_UCX_EP_FIELD_ADDRESS,
                                .address     = p->addr,
                                .address_len = addr_len};
    cr_assert_eq(kvf_ucx_ep_get(p->cli, "receiver", &epp, &p->ep), KVF_OK);
    /* both operations taken, and kept taken by the receiver */
    for (i = 0; i < 2; i++) {
        cr_assert_eq(kvf_mesh_send_am(p->mesh, p->ep, KVF_MESH_AM_PEER_CHUNK,
                                      &rndv, 30ull * 1000 * 1000 * 1000,
                                      on_am_sent, &p->held[i]),
                     KVF_OK);
    }
    cr_assert(loop_until(p->base, &g_held.n, 2), "the receiver got %u",
              g_held.n);
}

static void defer_pair_close(defer_pair_t *p)
{
    unsigned i;

    for (i = 0; i < g_held.n; i++) {
        kvf_ucx_am_msg_release(&g_held.kept[i]);
    }
    if (p->ep != NULL) {
        kvf_ucx_ep_put(p->ep);
    }
    kvf_ucx_worker_destroy(p->cli);
    kvf_mesh_destroy(p->mesh);
    kvf_ucx_worker_destroy(p->srv);
    kvf_ucx_ctx_destroy(p->cli_ctx);
    kvf_ucx_ctx_destroy(p->srv_ctx);
    free(p->addr);
    event_free(p->tick);
    event_base_free(p->base);
}

Test(mesh_defer, a_waiting_send_ends_by_its_timeout_or_its_endpoint_failing)
{
    kvf_mesh_am_payload_t eager = {
        .header = "e", .header_len = 1, .flags = KVF_UCX_AM_SEND_EAGER};
    defer_pair_t p;
    sent_t frame = {0}, am = {0};
    kvf_mesh_stats_t st;
    Kvf__PeerFetch fetch;
    unsigned i;

    defer_pair_open(&p);
    /* a frame with a short timeout and a message with a long one wait */
    kvf__peer_fetch__init(&fetch);
    fetch.request_id = 1;
    cr_assert_eq(kvf_mesh_send_frame(p.mesh, p.ep, KVF_MESH_AM_PEER_FETCH,
                                     KVF_MSG_PEER_FETCH, &fetch.base,
                                     50ull * 1000 * 1000, on_frame_sent, &frame,
                                     7),
                 KVF_OK);
    cr_assert_eq(kvf_mesh_send_am(p.mesh, p.ep, KVF_MESH_AM_PEER_CHUNK, &eager,
                                  30ull * 1000 * 1000 * 1000, on_am_sent, &am),
                 KVF_OK);
    kvf_mesh_get_stats(p.mesh, &st);
    cr_assert_eq(st.deferred, 2);
    cr_assert_eq(frame.calls + am.calls, 0, "told from inside the call");

    /* the frame ends by its own timeout; the message keeps waiting */
    cr_assert(loop_until(p.base, &frame.calls, 1));
    cr_assert_eq(frame.status, KVF_ERR_TIMEOUT);
    cr_assert_eq(frame.tag, 7);
    cr_assert_eq(am.calls, 0);
    cr_assert_eq(p.held[0].calls + p.held[1].calls, 0);

    /* the endpoint fails: the held sends end, and the waiting one is told
     * its endpoint closed instead of being sent on it */
    kvf_ucx_ep_fail(p.ep, KVF_ERR_CLOSED);
    cr_assert(loop_until(p.base, &am.calls, 1));
    cr_assert_eq(am.status, KVF_ERR_CLOSED);
    for (i = 0; i < 2; i++) {
        cr_assert_eq(p.held[i].calls, 1);
        cr_assert_neq(p.held[i].status, KVF_OK);
    }
    cr_assert_eq(frame.calls, 1, "a frame told twice");
    cr_assert_eq(am.calls, 1, "a message told twice");
    defer_pair_close(&p);
    kvf_test_check_leaks();
}

/* The wait is bounded: past KVF_MESH_DEFER_MAX sends waiting, a send is
 * refused at once (busy, its caller keeps what it would have sent), a
 * frame and a message alike. kvf_mesh_close (an agent stopping) tells
 * every waiting one, once, that it was canceled, lets go of the endpoint,
 * and takes no more. */
Test(mesh_defer, a_full_queue_refuses_and_close_tells_every_waiting_send)
{
    kvf_mesh_am_payload_t eager = {
        .header = "e", .header_len = 1, .flags = KVF_UCX_AM_SEND_EAGER};
    static sent_t waiting[KVF_MESH_DEFER_MAX];
    sent_t late = {0}, frame = {0};
    defer_pair_t p;
    kvf_mesh_stats_t st;
    Kvf__PeerFetch fetch;
    unsigned i, canceled = 0;

    memset(waiting, 0, sizeof(waiting));
    defer_pair_open(&p);
    for (i = 0; i < KVF_MESH_DEFER_MAX; i++) {
        cr_assert_eq(kvf_mesh_send_am(p.mesh, p.ep, KVF_MESH_AM_PEER_CHUNK,
                                      &eager, 30ull * 1000 * 1000 * 1000,
                                      on_am_sent, &waiting[i]),
                     KVF_OK, "send %u", i);
    }
    cr_assert_eq(kvf_mesh_send_am(p.mesh, p.ep, KVF_MESH_AM_PEER_CHUNK, &eager,
                                  30ull * 1000 * 1000 * 1000, on_am_sent,
                                  &late),
                 KVF_ERR_BUSY);
    kvf__peer_fetch__init(&fetch);
    fetch.request_id = 1;
    cr_assert_eq(kvf_mesh_send_frame(p.mesh, p.ep, KVF_MESH_AM_PEER_FETCH,
                                     KVF_MSG_PEER_FETCH, &fetch.base,
                                     30ull * 1000 * 1000 * 1000, on_frame_sent,
                                     &frame, 7),
                 KVF_ERR_BUSY);
    kvf_mesh_get_stats(p.mesh, &st);
    cr_assert_eq(st.deferred, KVF_MESH_DEFER_MAX);

    kvf_mesh_close(p.mesh);
    for (i = 0; i < KVF_MESH_DEFER_MAX; i++) {
        cr_assert_eq(waiting[i].calls, 1, "send %u told %u times", i,
                     waiting[i].calls);
        canceled += waiting[i].status == KVF_ERR_CANCELED;
    }
    cr_assert_eq(canceled, KVF_MESH_DEFER_MAX);
    cr_assert_eq(late.calls + frame.calls, 0, "a refused send is not told");
    /* closed: a send that would wait is refused, not queued */
    cr_assert_eq(kvf_mesh_send_am(p.mesh, p.ep, KVF_MESH_AM_PEER_CHUNK, &eager,
                                  30ull * 1000 * 1000 * 1000, on_am_sent,
                                  &late),
                 KVF_ERR_BUSY);
    defer_pair_close(&p);
    kvf_test_check_leaks();
}
