/* SPDX-License-Identifier: Apache-2.0 */
/* Copyright (c) 2026 The kvfabric authors */
/*
 * PD mode between real agents over UCX (TCP on loopback): a controller, a
 * prefill agent P and a decode agent D with a 4 MiB receive region (16
 * chunks of 256 KiB). Every byte is checked at the decode engine; every
 * failure must show up within its timeout. The agents run with same_host
 * off (pushes over UCX) except in the same_host tests at the end, where
 * pushes are copied into D's region on this host.
 */
#include "common/time.h"
#include "tests/helpers/proc.h"
#include "tests/helpers/test_helpers.h"
#include "tests/integration/controller_harness.h"

#include <kvfabric/kvfabric.h>

#include <criterion/criterion.h>

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#define CHUNK  (256u << 10)
#define REGION (4u << 20) /* 16 chunks */

typedef struct it_agent {
    kvf_test_proc_t proc;
    char sock[128];
    char http[64];
    char name[32];
    bool running;
} it_agent_t;

static kvf_th_ctl_t g_ctl;
static it_agent_t g_p, g_d;

static uint16_t http_port(const it_agent_t *a)
{
    return (uint16_t)atoi(strrchr(a->http, ':') + 1);
}

static bool registered(const it_agent_t *a)
{
    char body[4096];

    return (kvf_test_http_get(http_port(a), "/healthz", body, sizeof(body)) ==
            200) &&
           (strstr(body, "\"registered\":true") != NULL);
}

/* Starts agent @p a with @p role and the decoder's tunables, plus @p extra
 * flags (NULL-terminated, may be NULL). */
static void start_agent(it_agent_t *a, const char *name, const char *role,
                        const char *const *extra)
{
    const char *argv[64] = {kvf_test_build_path("agent/kvf-agent"),
                            "--controller",
                            g_ctl.addr,
                            "--name",
                            name,
                            "--role",
                            role,
                            "--socket",
                            a->sock,
                            "--http",
                            a->http,
                            "--listen",
                            "127.0.0.1:0",
                            "--pool-size",
                            "16M",
                            "--max-chunk",
                            "1M",
                            "--transports",
                            "tcp",
                            "--pd-buffer-size",
                            "4M",
                            "--pd-alloc-timeout",
                            "1s",
                            "--pd-push-timeout",
                            "3s",
                            "--pd-queue-max",
                            "4",
                            "--pd-claim-timeout",
                            "20s",
                            "--same-host=false"};
    int n                = 30, k;

    snprintf(a->name, sizeof(a->name), "%s", name);
    snprintf(a->sock, sizeof(a->sock), "/tmp/kvf-pd-it-%d-%s.sock",
             (int)getpid(), name);
    snprintf(a->http, sizeof(a->http), "127.0.0.1:%u", kvf_test_free_port());
    for (k = 0; (extra != NULL) && (extra[k] != NULL); k++) {
        argv[n++] = extra[k];
    }
    argv[n] = NULL;
    cr_assert_eq(kvf_test_proc_start(&a->proc, argv), 0);
    a->running = true;
    for (k = 0; (k < 2000) && !registered(a); k++) {
        poll(NULL, 0, 5);
    }
    cr_assert(registered(a), "agent %s did not register: %s", a->name,
              kvf_test_proc_log(&a->proc));
}

static void start_pair(const char *const *decoder_extra)
{
    start_agent(&g_p, "it-prefill", "prefill", NULL);
    start_agent(&g_d, "it-decode", "decode", decoder_extra);
}

static void setup(void)
{
    const char *args[] = {"--heartbeat-interval", "100ms", NULL};

    memset(&g_p, 0, sizeof(g_p));
    memset(&g_d, 0, sizeof(g_d));
    kvf_th_ctl_start(&g_ctl, args);
}

static void teardown(void)
{
    int p = 0, d = 0;

    /* agents exit 0 only without leaks (ASan) or stuck operations */
    if (g_p.running) {
        p = kvf_test_proc_stop(&g_p.proc, 10000);
    }
    if (g_d.running) {
        d = kvf_test_proc_stop(&g_d.proc, 10000);
    }
    if ((p != 0) || (d != 0)) {
        /* a .fini assertion would not fail the run (STYLE.md): abort */
        fprintf(stderr, "agents exited %d (prefill) and %d (decode)\n%s\n%s\n",
                p, d, kvf_test_proc_log(&g_p.proc),
                kvf_test_proc_log(&g_d.proc));
        abort();
    }
    kvf_th_ctl_stop(&g_ctl);
    kvf_test_check_leaks();
}

TestSuite(pd, .init = setup, .fini = teardown, .timeout = 120);

static kvf_client_t *connect_to(const it_agent_t *a)
{
    kvf_client_params_t p = {.field_mask = KVF_CLIENT_PARAM_SOCKET |
                                           KVF_CLIENT_PARAM_TIMEOUT,
                             .socket_path = a->sock,
                             .timeout_ns  = 5000000000ull};
    kvf_client_t *c       = NULL;

    cr_assert_eq(kvf_client_connect(&p, &c), KVF_OK);
    return c;
}

/* Chunk @p index of request @p req: bytes no other chunk has. */
static void fill(uint8_t *p, uint64_t req, uint32_t index)
{
    uint64_t x = (req << 20) ^ ((uint64_t)index << 4) ^ 0x9e3779b97f4a7c15ull,
             i;

    for (i = 0; i < CHUNK; i += 8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        memcpy(p + i, &x, 8);
    }
}

/* Chunks [0, n) of @p req in fresh grants of @p c, and their checksums. */
static void fill_slots(kvf_client_t *c, uint64_t req, uint32_t n,
                       kvf_slot_t *slots, uint64_t *sums)
{
    uint32_t i;

    cr_assert_eq(kvf_client_alloc(c, CHUNK, n, slots), KVF_OK);
    for (i = 0; i < n; i++) {
        uint8_t *p = (uint8_t *)kvf_client_pool_base(c) + slots[i].offset;

        fill(p, req, i);
        sums[i] = kvf_chunk_checksum(p, CHUNK);
    }
}

/* Pushes chunks [first, first+n) of @p req from a prefill connection. */
static kvf_status_t push(kvf_client_t *c, uint64_t req, uint32_t first,
                         uint32_t n, bool final)
{
    kvf_slot_t slots[64];
    uint64_t sums[64];
    kvf_status_t status;
    uint32_t i;

    cr_assert_leq(n, 64);
    cr_assert_eq(kvf_client_alloc(c, CHUNK, n, slots), KVF_OK);
    for (i = 0; i < n; i++) {
        uint8_t *p = (uint8_t *)kvf_client_pool_base(c) + slots[i].offset;

        fill(p, req, first + i);
        sums[i] = kvf_chunk_checksum(p, CHUNK);
    }
    status = kvf_pd_push(c, req, "it-decode", slots, sums, n, final);
    /* the slots stay ours after the push, whatever its outcome */
    cr_assert_eq(kvf_client_release(c, slots, n), KVF_OK, "%s",
                 kvf_client_last_error(c));
    return status;
}

/* Pushes chunks [0, n) of @p req one a push (a layer group each, the last
 * final), started without waiting, then waits for them all. */
static void push_layers(kvf_client_t *c, uint64_t req, uint32_t n)
{
    kvf_slot_t slots[64];
    uint64_t sums[64];
    uint32_t i;

    cr_assert_leq(n, 64);
    fill_slots(c, req, n, slots, sums);
    for (i = 0; i < n; i++) {
        cr_assert_eq(kvf_pd_push_start(c, req, "it-decode", &slots[i], &sums[i],
                                       1, i == n - 1),
                     KVF_OK, "%s", kvf_client_last_error(c));
    }
    cr_assert_eq(kvf_pd_push_wait(c, req, 0), KVF_OK, "%s",
                 kvf_client_last_error(c));
    cr_assert_eq(kvf_client_release(c, slots, n), KVF_OK);
}

/* Waits for @p req at the decoder and checks its @p n chunks byte for
 * byte. */
static void wait_and_check(kvf_client_t *c, uint64_t req, uint32_t n)
{
    kvf_slot_t slots[64];
    uint8_t *want = malloc(CHUNK);
    uint32_t num  = 0, i;

    cr_assert_eq(kvf_pd_wait(c, req, 5000000000ull, slots, 64, &num), KVF_OK,
                 "%s", kvf_client_last_error(c));
    cr_assert_eq(num, n);
    for (i = 0; i < n; i++) {
        cr_assert_eq(slots[i].length, CHUNK);
        cr_assert_lt(slots[i].offset, kvf_client_pool_size(c));
        fill(want, req, i);
        cr_assert_eq(
            memcmp((uint8_t *)kvf_client_pool_base(c) + slots[i].offset, want,
                   CHUNK),
            0, "request %llu chunk %u differs", (unsigned long long)req, i);
    }
    free(want);
}

/* The value of metric line @p name (exact prefix up to the space) of agent
 * @p a, or -1. */
static long long metric(const it_agent_t *a, const char *name)
{
    static char body[65536];
    char needle[160];
    const char *p;

    if (kvf_test_http_get(http_port(a), "/metrics", body, sizeof(body)) !=
        200) {
        return -1;
    }
    snprintf(needle, sizeof(needle), "\n%s ", name);
    p = strstr(body, needle);
    return (p == NULL) ? -1 : atoll(p + strlen(needle));
}

static bool metric_becomes(const it_agent_t *a, const char *name,
                           long long want, int timeout_ms)
{
    uint64_t deadline = kvf_time_now_ms() + (uint64_t)timeout_ms;

    while (kvf_time_now_ms() < deadline) {
        if (metric(a, name) == want) {
            return true;
        }
        poll(NULL, 0, 10);
    }
    return metric(a, name) == want;
}

#define REGION_USED "kvf_agent_pd_region_bytes{state=\"used\"}"
#define QUEUE_DEPTH "kvf_agent_pd_queue_depth"

Test(pd, push_then_wait_delivers_every_byte)
{
    kvf_client_t *pc, *dc;
    kvf_slot_t slot;
    uint32_t num;

    start_pair(NULL);
    pc = connect_to(&g_p);
    dc = connect_to(&g_d);
    cr_assert_eq(push(pc, 1, 0, 4, true), KVF_OK, "%s",
                 kvf_client_last_error(pc));
    /* agents of one version: the last chunk ends the push, no PD_DONE */
    cr_assert_eq(metric(&g_d, "kvf_agent_pd_implied_done_total"), 1);
    cr_assert_eq(metric(&g_d, "kvf_agent_pd_acks_total{kind=\"push\"}"), 1);
    wait_and_check(dc, 1, 4);
    /* the same engine may ask again; another engine may not */
    cr_assert_eq(kvf_pd_wait(dc, 1, 1000000000ull, &slot, 1, &num),
                 KVF_ERR_TOO_BIG);
    cr_assert_eq(kvf_pd_release(dc, 1), KVF_OK, "%s",
                 kvf_client_last_error(dc));
    cr_assert_eq(kvf_pd_release(dc, 1), KVF_ERR_NOT_FOUND);
    cr_assert(metric_becomes(&g_d, REGION_USED, 0, 2000));
    kvf_client_disconnect(pc);
    kvf_client_disconnect(dc);
}

typedef struct waiter {
    kvf_client_t *c;
    uint64_t req;
    uint32_t want;
    kvf_status_t status;
    uint32_t num;
    uint64_t took_ms;
} waiter_t;

static void *wait_thread(void *arg)
{
    waiter_t *w = arg;
    kvf_slot_t slots[64];
    uint64_t t0 = kvf_time_now_ms();

    w->status  = kvf_pd_wait(w->c, w->req, 5000000000ull, slots, 64, &w->num);
    w->took_ms = kvf_time_now_ms() - t0;
    return NULL;
}

Test(pd, wait_before_push_works)
{
    kvf_client_t *pc, *dc;
    waiter_t w = {0};
    pthread_t th;

    start_pair(NULL);
    pc    = connect_to(&g_p);
    dc    = connect_to(&g_d);
    w.c   = dc;
    w.req = 7;
    cr_assert_eq(pthread_create(&th, NULL, wait_thread, &w), 0);
    /* the decode engine is waiting before anything was pushed */
    cr_assert(metric_becomes(&g_d, "kvf_agent_pd_requests", 1, 5000));
    cr_assert_eq(push(pc, 7, 0, 3, true), KVF_OK, "%s",
                 kvf_client_last_error(pc));
    pthread_join(th, NULL);
    cr_assert_eq(w.status, KVF_OK, "%s", kvf_client_last_error(dc));
    cr_assert_eq(w.num, 3);
    wait_and_check(dc, 7, 3); /* claimed by this connection: same slots */
    cr_assert_eq(kvf_pd_release(dc, 7), KVF_OK);
    kvf_client_disconnect(pc);
    kvf_client_disconnect(dc);
}

Test(pd, streaming_pushes_interleave_across_requests)
{
    kvf_client_t *pc = NULL, *pc2, *dc;

    start_pair(NULL);
    pc  = connect_to(&g_p);
    pc2 = connect_to(&g_p);
    dc  = connect_to(&g_d);
    /* layer groups of two requests, produced and pushed interleaved */
    cr_assert_eq(push(pc, 10, 0, 2, false), KVF_OK);
    cr_assert_eq(push(pc2, 11, 0, 1, false), KVF_OK);
    cr_assert_eq(push(pc, 10, 2, 2, false), KVF_OK);
    cr_assert_eq(push(pc2, 11, 1, 3, false), KVF_OK);
    cr_assert_eq(push(pc2, 11, 4, 1, true), KVF_OK);
    cr_assert_eq(push(pc, 10, 4, 1, true), KVF_OK, "%s",
                 kvf_client_last_error(pc));
    wait_and_check(dc, 11, 5);
    wait_and_check(dc, 10, 5);
    cr_assert_eq(metric(&g_d, "kvf_agent_pd_implied_done_total"), 6);
    cr_assert_eq(metric(&g_d, "kvf_agent_pd_acks_total{kind=\"push\"}"), 6);
    cr_assert_leq(metric(&g_d, "kvf_agent_pd_acks_total{kind=\"message\"}"), 6);
    cr_assert_eq(kvf_pd_release(dc, 10), KVF_OK);
    cr_assert_eq(kvf_pd_release(dc, 11), KVF_OK);
    cr_assert(metric_becomes(&g_d, REGION_USED, 0, 2000));
    kvf_client_disconnect(pc);
    kvf_client_disconnect(pc2);
    kvf_client_disconnect(dc);
}

typedef struct pusher {
    uint64_t req;
    uint32_t n;
    kvf_status_t status;
    bool done;
    uint64_t took_ms;
    char error[256];
} pusher_t;

static void *push_thread(void *arg)
{
    pusher_t *p     = arg;
    kvf_client_t *c = connect_to(&g_p);
    uint64_t t0     = kvf_time_now_ms();

    p->status  = push(c, p->req, 0, p->n, true);
    p->took_ms = kvf_time_now_ms() - t0;
    snprintf(p->error, sizeof(p->error), "%s", kvf_client_last_error(c));
    __atomic_store_n(&p->done, true, __ATOMIC_RELEASE);
    kvf_client_disconnect(c);
    return NULL;
}

Test(pd, full_region_queues_fifo_and_releases_wake_pushes)
{
    const char *extra[] = {"--pd-alloc-timeout", "20s", "--pd-push-timeout",
                           "30s", NULL};
    pusher_t ps[3]      = {
             {.req = 21, .n = 8}, {.req = 22, .n = 8}, {.req = 23, .n = 8}};
    kvf_client_t *pc, *dc;
    pthread_t th[3];
    int i;

    start_agent(&g_p, "it-prefill", "prefill", extra);
    start_agent(&g_d, "it-decode", "decode", extra);
    pc = connect_to(&g_p);
    dc = connect_to(&g_d);
    /* request 20 fills the whole region, and an engine holds it */
    cr_assert_eq(push(pc, 20, 0, 16, true), KVF_OK, "%s",
                 kvf_client_last_error(pc));
    wait_and_check(dc, 20, 16);
    /* three more queue, in a known order */
    for (i = 0; i < 3; i++) {
        cr_assert_eq(pthread_create(&th[i], NULL, push_thread, &ps[i]), 0);
        cr_assert(metric_becomes(&g_d, QUEUE_DEPTH, i + 1, 5000),
                  "queue depth %lld", metric(&g_d, QUEUE_DEPTH));
    }
    cr_assert(metric(&g_d, "kvf_agent_pd_alloc_waits_total") >= 3);
    /* 16 chunks free: the first two in line (8 + 8) go, the third waits */
    cr_assert_eq(kvf_pd_release(dc, 20), KVF_OK);
    cr_assert(metric_becomes(&g_d, QUEUE_DEPTH, 1, 5000));
    wait_and_check(dc, 21, 8);
    wait_and_check(dc, 22, 8);
    cr_assert(!__atomic_load_n(&ps[2].done, __ATOMIC_ACQUIRE));
    cr_assert_eq(kvf_pd_release(dc, 21), KVF_OK);
    wait_and_check(dc, 23, 8);
    for (i = 0; i < 3; i++) {
        pthread_join(th[i], NULL);
        cr_assert_eq(ps[i].status, KVF_OK, "push %d: %s", i, ps[i].error);
    }
    cr_assert_eq(kvf_pd_release(dc, 22), KVF_OK);
    cr_assert_eq(kvf_pd_release(dc, 23), KVF_OK);
    cr_assert(metric_becomes(&g_d, REGION_USED, 0, 2000));
    kvf_client_disconnect(pc);
    kvf_client_disconnect(dc);
}

/* Several prefill engines push at once: the decoder's acks to their agent
 * that complete in one pass share a PD_DONE_REPLY (PdDoneReply.more), and
 * the prefill agent completes every push they name, once. */
Test(pd, concurrent_pushes_share_acks_and_each_completes)
{
    enum {
        THREADS = 6,
        ROUNDS  = 4
    };
    pusher_t ps[THREADS];
    kvf_client_t *dc;
    pthread_t th[THREADS];
    long long acks, msgs;
    int i, r;

    start_pair(NULL);
    dc = connect_to(&g_d);
    for (r = 0; r < ROUNDS; r++) {
        for (i = 0; i < THREADS; i++) {
            memset(&ps[i], 0, sizeof(ps[i]));
            ps[i].req = 600 + (uint64_t)(r * THREADS + i);
            ps[i].n   = 1;
            cr_assert_eq(pthread_create(&th[i], NULL, push_thread, &ps[i]), 0);
        }
        for (i = 0; i < THREADS; i++) {
            pthread_join(th[i], NULL);
            cr_assert_eq(ps[i].status, KVF_OK, "push %d: %s", i, ps[i].error);
        }
        for (i = 0; i < THREADS; i++) {
            wait_and_check(dc, ps[i].req, 1);
            cr_assert_eq(kvf_pd_release(dc, ps[i].req), KVF_OK);
        }
    }
    acks = metric(&g_d, "kvf_agent_pd_acks_total{kind=\"push\"}");
    msgs = metric(&g_d, "kvf_agent_pd_acks_total{kind=\"message\"}");
    cr_assert_eq(acks, THREADS * ROUNDS);
    cr_assert((msgs >= 1) && (msgs <= acks), "%lld ack messages", msgs);
    cr_log_info("%lld pushes acknowledged in %lld PD_DONE_REPLYs", acks, msgs);
    cr_assert(metric_becomes(&g_d, REGION_USED, 0, 2000));
    kvf_client_disconnect(dc);
}

/* A prefill engine pushes request @p req (@p n chunks, final) and
 * blocks in the push; run in a child the test kills. */
static void push_in_child(uint64_t req, uint32_t n)
{
    kvf_client_params_t p = {.field_mask = KVF_CLIENT_PARAM_SOCKET |
                                           KVF_CLIENT_PARAM_TIMEOUT,
                             .socket_path = g_p.sock,
                             .timeout_ns  = 30000000000ull};
    kvf_slot_t slots[64];
    uint64_t sums[64];
    kvf_client_t *c = NULL;
    uint32_t i;

    if ((kvf_client_connect(&p, &c) != KVF_OK) ||
        (kvf_client_alloc(c, CHUNK, n, slots) != KVF_OK)) {
        _exit(2);
    }
    for (i = 0; i < n; i++) {
        uint8_t *q = (uint8_t *)kvf_client_pool_base(c) + slots[i].offset;

        fill(q, req, i);
        sums[i] = kvf_chunk_checksum(q, CHUNK);
    }
    _exit((kvf_pd_push(c, req, "it-decode", slots, sums, n, true) == KVF_OK)
              ? 0
              : 3);
}

/* A push reads the engine's staging area, not a copy of it: the area
 * stays mapped while the push needs it, even when the engine dies first
 * (kill -9 while its push waits for room at the decoder). */
Test(pd, engine_killed_while_its_push_waits_still_delivers_its_bytes)
{
    const char *extra[] = {"--pd-alloc-timeout", "20s", "--pd-push-timeout",
                           "30s", NULL};
    kvf_client_t *pc, *dc;
    int wstatus;
    pid_t child;

    start_agent(&g_p, "it-prefill", "prefill", extra);
    start_agent(&g_d, "it-decode", "decode", extra);
    pc = connect_to(&g_p);
    dc = connect_to(&g_d);
    cr_assert_eq(push(pc, 30, 0, 16, true), KVF_OK, "%s",
                 kvf_client_last_error(pc));
    wait_and_check(dc, 30, 16); /* the region is full and claimed */
    child = fork();
    cr_assert_geq(child, 0);
    if (child == 0) {
        push_in_child(31, 8);
    }
    cr_assert(metric_becomes(&g_d, QUEUE_DEPTH, 1, 5000), "queue depth %lld",
              metric(&g_d, QUEUE_DEPTH));
    cr_assert_eq(kill(child, SIGKILL), 0);
    cr_assert_eq(waitpid(child, &wstatus, 0), child);
    cr_assert(WIFSIGNALED(wstatus), "the pushing engine ended first (%d)",
              wstatus);
    /* only pc is left on the prefill agent: the dead engine's connection
     * and its staging memfd are gone from its point of view */
    cr_assert(metric_becomes(&g_p, "kvf_agent_engine_connections", 1, 5000));
    /* room: the queued push goes on, from the dead engine's staging */
    cr_assert_eq(kvf_pd_release(dc, 30), KVF_OK);
    wait_and_check(dc, 31, 8);
    cr_assert_eq(kvf_pd_release(dc, 31), KVF_OK);
    cr_assert(metric_becomes(&g_d, REGION_USED, 0, 2000));
    cr_assert_eq(metric(&g_d, "kvf_agent_pd_checksum_failures_total"), 0);
    kvf_client_disconnect(pc);
    kvf_client_disconnect(dc);
}

Test(pd, queue_timeout_fails_the_push_with_a_clear_error)
{
    kvf_client_t *pc, *dc;
    uint64_t t0;
    kvf_status_t status;

    start_pair(NULL);
    pc = connect_to(&g_p);
    dc = connect_to(&g_d);
    cr_assert_eq(push(pc, 30, 0, 16, true), KVF_OK);
    wait_and_check(dc, 30, 16); /* claimed: nothing will make room */
    t0     = kvf_time_now_ms();
    status = push(pc, 31, 0, 2, true);
    cr_assert_eq(status, KVF_ERR_TIMEOUT, "%d: %s", status,
                 kvf_client_last_error(pc));
    cr_assert_lt(kvf_time_now_ms() - t0, 3000);
    cr_assert_not_null(strstr(kvf_client_last_error(pc), "stayed full"), "%s",
                       kvf_client_last_error(pc));
    cr_assert_not_null(strstr(kvf_client_last_error(pc), "it-decode"));
    cr_assert_eq(metric(&g_d, "kvf_agent_pd_alloc_timeouts_total"), 1);
    cr_assert_eq(metric(&g_d, QUEUE_DEPTH), 0);
    /* the request that held the region is untouched */
    wait_and_check(dc, 30, 16);
    cr_assert_eq(kvf_pd_release(dc, 30), KVF_OK);
    kvf_client_disconnect(pc);
    kvf_client_disconnect(dc);
}

Test(pd, request_larger_than_the_region_fails_fast)
{
    kvf_client_t *pc, *dc;
    kvf_slot_t slots[2];
    uint32_t num;
    uint64_t t0;

    start_pair(NULL);
    pc = connect_to(&g_p);
    dc = connect_to(&g_d);
    t0 = kvf_time_now_ms();
    cr_assert_eq(push(pc, 40, 0, 17, true), KVF_ERR_TOO_BIG);
    /* streamed: the second part takes it over the whole region */
    cr_assert_eq(push(pc, 41, 0, 12, false), KVF_OK);
    cr_assert_eq(push(pc, 41, 12, 12, true), KVF_ERR_TOO_BIG, "%s",
                 kvf_client_last_error(pc));
    cr_assert_lt(kvf_time_now_ms() - t0, 1000);
    cr_assert_eq(kvf_pd_wait(dc, 41, 1000000000ull, slots, 2, &num),
                 KVF_ERR_CANCELED);
    cr_assert(metric_becomes(&g_d, REGION_USED, 0, 2000));
    kvf_client_disconnect(pc);
    kvf_client_disconnect(dc);
}

Test(pd, duplicate_and_unknown_ids_are_errors)
{
    kvf_client_t *pc, *dc;

    start_pair(NULL);
    pc = connect_to(&g_p);
    dc = connect_to(&g_d);
    cr_assert_eq(push(pc, 50, 0, 2, true), KVF_OK);
    cr_assert_eq(push(pc, 50, 0, 2, true), KVF_ERR_EXISTS, "%s",
                 kvf_client_last_error(pc));
    cr_assert_eq(kvf_pd_release(dc, 999), KVF_ERR_NOT_FOUND);
    /* the duplicate never touched the first request's bytes */
    wait_and_check(dc, 50, 2);
    cr_assert_eq(kvf_pd_release(dc, 50), KVF_OK);
    kvf_client_disconnect(pc);
    kvf_client_disconnect(dc);
}

Test(pd, decoder_killed_push_fails_within_its_timeout)
{
    kvf_client_t *pc;
    kvf_status_t status;
    uint64_t t0;

    start_pair(NULL);
    pc = connect_to(&g_p);
    cr_assert_eq(push(pc, 60, 0, 2, false), KVF_OK);
    kvf_test_proc_kill(&g_d.proc);
    g_d.running = false;
    t0          = kvf_time_now_ms();
    status      = push(pc, 60, 2, 2, true);
    cr_assert_neq(status, KVF_OK);
    cr_assert_lt(kvf_time_now_ms() - t0, 3000 + 1500, "took %llu ms",
                 (unsigned long long)(kvf_time_now_ms() - t0));
    cr_assert_eq(metric(&g_p, "kvf_agent_pd_pushes_total{result=\"failed\"}"),
                 1);
    kvf_client_disconnect(pc);
}

Test(pd, prefill_killed_mid_request_fails_the_wait_and_frees_slots)
{
    kvf_client_t *pc, *dc;
    kvf_slot_t slots[8];
    kvf_status_t status;
    uint32_t num;
    uint64_t t0;

    start_pair(NULL);
    pc = connect_to(&g_p);
    dc = connect_to(&g_d);
    cr_assert_eq(push(pc, 70, 0, 4, false), KVF_OK);
    cr_assert_eq(metric(&g_d, REGION_USED), 4 * CHUNK);
    kvf_test_proc_kill(&g_p.proc); /* the agent dies, not just its engine */
    g_p.running = false;
    t0          = kvf_time_now_ms();
    status      = kvf_pd_wait(dc, 70, 5000000000ull, slots, 8, &num);
    cr_assert((status == KVF_ERR_CANCELED) || (status == KVF_ERR_TIMEOUT),
              "%d: %s", status, kvf_client_last_error(dc));
    cr_assert_lt(kvf_time_now_ms() - t0, 5000 + 1000);
    cr_assert(metric_becomes(&g_d, REGION_USED, 0, 5000), "%lld bytes used",
              metric(&g_d, REGION_USED));
    cr_assert_geq(metric(&g_d, "kvf_agent_pd_aborts_total"), 1);
    kvf_client_disconnect(pc);
    kvf_client_disconnect(dc);
}

Test(pd, prefill_engine_gone_mid_request_aborts_it)
{
    kvf_client_t *pc, *dc;
    waiter_t w = {0};
    pthread_t th;

    start_pair(NULL);
    pc    = connect_to(&g_p);
    dc    = connect_to(&g_d);
    w.c   = dc;
    w.req = 75;
    cr_assert_eq(push(pc, 75, 0, 2, false), KVF_OK);
    cr_assert_eq(pthread_create(&th, NULL, wait_thread, &w), 0);
    kvf_client_disconnect(pc); /* the prefill engine crashed */
    pthread_join(th, NULL);
    cr_assert_eq(w.status, KVF_ERR_CANCELED, "%d: %s", w.status,
                 kvf_client_last_error(dc));
    cr_assert_lt(w.took_ms, 2000);
    cr_assert(metric_becomes(&g_d, REGION_USED, 0, 2000));
    kvf_client_disconnect(dc);
}

Test(pd, unclaimed_requests_are_reclaimed)
{
    const char *extra[] = {"--pd-claim-timeout", "300ms", NULL};
    kvf_client_t *pc, *dc;
    kvf_slot_t slots[4];
    uint32_t num;

    start_pair(extra);
    pc = connect_to(&g_p);
    dc = connect_to(&g_d);
    cr_assert_eq(push(pc, 80, 0, 4, true), KVF_OK);
    cr_assert(metric_becomes(&g_d, "kvf_agent_pd_reclaimed_total", 1, 3000));
    cr_assert_eq(metric(&g_d, REGION_USED), 0);
    cr_assert_eq(kvf_pd_wait(dc, 80, 100000000ull, slots, 4, &num),
                 KVF_ERR_TIMEOUT);
    cr_assert_eq(kvf_pd_release(dc, 80), KVF_ERR_NOT_FOUND);
    kvf_client_disconnect(pc);
    kvf_client_disconnect(dc);
}

Test(pd, metrics_and_kvfctl_show_roles_and_region_usage)
{
    static char kvfctl[4096];
    const char *argv[] = {kvfctl,   "--controller", g_ctl.addr,
                          "--json", "nodes",        NULL};
    static char out[16384];
    kvf_client_t *pc, *dc;
    uint64_t deadline;
    bool seen = false;

    /* kvf_test_build_path answers in a buffer the next call reuses */
    snprintf(kvfctl, sizeof(kvfctl), "%s", kvf_test_build_path("tools/kvfctl"));
    start_pair(NULL);
    pc = connect_to(&g_p);
    dc = connect_to(&g_d);
    cr_assert_eq(push(pc, 90, 0, 4, true), KVF_OK);
    cr_assert_eq(
        metric(&g_p, "kvf_agent_pd_pushes_total{result=\"delivered\"}"), 1);
    cr_assert_eq(metric(&g_p, "kvf_agent_pd_push_seconds_count"), 1);
    cr_assert_eq(metric(&g_p, "kvf_agent_pd_bytes_total{dir=\"sent\"}"),
                 4 * CHUNK);
    cr_assert_eq(metric(&g_d, "kvf_agent_pd_bytes_total{dir=\"received\"}"),
                 4 * CHUNK);
    cr_assert_eq(metric(&g_d, "kvf_agent_pd_requests_ready_total"), 1);
    cr_assert_eq(metric(&g_d, "kvf_agent_pd_region_bytes{state=\"free\"}"),
                 REGION - 4 * CHUNK);
    /* heartbeats carry the usage to the controller's node table */
    deadline = kvf_time_now_ms() + 5000;
    while (!seen && (kvf_time_now_ms() < deadline)) {
        cr_assert_eq(kvf_test_run(argv, out, sizeof(out), 5000), 0, "%s", out);
        seen = (strstr(out, "\"pd_used\":1048576,\"pd_capacity\":4194304") !=
                NULL);
        if (!seen) {
            poll(NULL, 0, 20);
        }
    }
    cr_assert(seen, "%s", out);
    cr_assert_not_null(strstr(out, "\"role\":\"decode\""), "%s", out);
    cr_assert_not_null(strstr(out, "\"role\":\"prefill\""), "%s", out);
    argv[3] = "nodes";
    argv[4] = NULL;
    cr_assert_eq(kvf_test_run(argv, out, sizeof(out), 5000), 0, "%s", out);
    cr_assert_not_null(strstr(out, " PD "), "%s", out);
    cr_assert_not_null(strstr(out, "1.0 MiB/4.0 MiB 25%"), "%s", out);
    wait_and_check(dc, 90, 4);
    cr_assert_eq(kvf_pd_release(dc, 90), KVF_OK);
    kvf_client_disconnect(pc);
    kvf_client_disconnect(dc);
}

/* `make demo`'s phase 3: the demo engine's prefill and decode modes against
 * a real pair, decode side started first (it waits), every byte checked. */
static char g_demo_bin[4096];

Test(pd, demo_engine_pair_moves_requests_byte_exact)
{
    char out[4096];
    const char *shape[] = {"--layers",         "2",    "--kv-heads", "2",
                           "--head-dim",       "16",   "--requests", "5",
                           "--request-tokens", "1024", "--json"};
    const char *dec[32] = {g_demo_bin, "--mode", "decode", "--socket",
                           g_d.sock};
    const char *pre[32] = {g_demo_bin,  "--mode",   "prefill", "--decoder",
                           "it-decode", "--socket", g_p.sock};
    kvf_test_proc_t decoder;
    size_t k;

    /* kvf_test_build_path's buffer is reused by every call */
    snprintf(g_demo_bin, sizeof(g_demo_bin), "%s",
             kvf_test_build_path("tools/kvf-demo-engine"));
    start_pair(NULL);
    for (k = 0; k < sizeof(shape) / sizeof(shape[0]); k++) {
        dec[5 + k] = shape[k];
        pre[7 + k] = shape[k];
    }
    cr_assert_eq(kvf_test_proc_start(&decoder, dec), 0);
    cr_assert_eq(kvf_test_run(pre, out, sizeof(out), 30000), 0, "%s", out);
    cr_assert(strstr(out, "\"requests\":5,\"chunks_pushed\":20,") != NULL, "%s",
              out);
    cr_assert_eq(kvf_test_proc_wait_exit(&decoder, 30000), 0, "%s",
                 kvf_test_proc_log(&decoder));
    cr_assert(strstr(kvf_test_proc_log(&decoder), "\"wrong_bytes\":0}") != NULL,
              "%s", kvf_test_proc_log(&decoder));
    cr_assert(metric_becomes(&g_d, REGION_USED, 0, 2000));
}

/* A chunk whose bytes do not match the checksum the engine gave: the
 * decoder refuses it (as it lands), the push fails, the decode engine
 * never sees a byte of it, and the slots go back. */
Test(pd, damaged_chunk_fails_the_push_and_is_never_handed_out)
{
    kvf_client_t *pc, *dc;
    kvf_slot_t slots[3], got[3];
    uint64_t sums[3];
    uint32_t num = 0;

    start_pair(NULL);
    pc = connect_to(&g_p);
    dc = connect_to(&g_d);
    fill_slots(pc, 90, 3, slots, sums);
    sums[1] ^= 1; /* chunk 1 is not what its checksum says */
    cr_assert_eq(kvf_pd_push(pc, 90, "it-decode", slots, sums, 3, true),
                 KVF_ERR_CHECKSUM, "%s", kvf_client_last_error(pc));
    cr_assert(strstr(kvf_client_last_error(pc), "chunk 1") != NULL, "%s",
              kvf_client_last_error(pc));
    cr_assert_eq(kvf_client_release(pc, slots, 3), KVF_OK);
    cr_assert_eq(kvf_pd_wait(dc, 90, 1000000000ull, got, 3, &num),
                 KVF_ERR_CANCELED, "%s", kvf_client_last_error(dc));
    cr_assert_eq(num, 0);
    cr_assert(metric_becomes(&g_d, REGION_USED, 0, 2000));
    cr_assert_eq(metric(&g_d, "kvf_agent_pd_checksum_failures_total"), 1);
    /* logged at warn: damaged data is an alarm */
    {
        const char *log = kvf_test_proc_log(&g_d.proc);
        const char *hit = strstr(log, "failed its checksum");
        const char *bol = hit;

        cr_assert_not_null(hit, "%s", log);
        while ((bol > log) && (bol[-1] != '\n')) {
            bol--;
        }
        cr_assert(strncmp(strchr(bol, ' ') + 1, "warn ", 5) == 0, "%.*s",
                  (int)(hit - bol), bol);
    }
    kvf_client_disconnect(pc);
    kvf_client_disconnect(dc);
}

#define PIECES "kvf_agent_pd_pieces_total{kind=\"overlapped\"}"

Test(pd, layer_pushes_of_one_request_overlap_and_keep_their_order)
{
    kvf_client_t *pc, *dc;
    kvf_slot_t slots[12];
    uint64_t sums[12];
    long long queued;
    uint32_t i;

    start_pair(NULL);
    pc = connect_to(&g_p);
    dc = connect_to(&g_d);
    fill_slots(pc, 20, 12, slots, sums);
    /* one push per layer group, none waiting for the one before; the last
     * one synchronous: it returns once every one of them was verified */
    for (i = 0; i < 11; i++) {
        cr_assert_eq(kvf_pd_push_start(pc, 20, "it-decode", &slots[i], &sums[i],
                                       1, false),
                     KVF_OK, "%s", kvf_client_last_error(pc));
    }
    cr_assert_eq(
        kvf_pd_push(pc, 20, "it-decode", &slots[11], &sums[11], 1, true),
        KVF_OK, "%s", kvf_client_last_error(pc));
    cr_assert_eq(kvf_pd_push_wait(pc, 20, 0), KVF_OK); /* nothing left */
    cr_assert_eq(kvf_client_release(pc, slots, 12), KVF_OK);
    cr_assert_eq(metric(&g_d, "kvf_agent_pd_received_pushes_total"), 12);
    /* the decoder held several pushes of the request at once (one at a
     * time, as before, makes this 0) */
    cr_assert_geq(metric(&g_d, PIECES), 1, "no push overlapped another");
    cr_log_info("12 layer pushes: %lld overlapped, %lld reordered",
                metric(&g_d, PIECES),
                metric(&g_d, "kvf_agent_pd_pieces_total{kind=\"reordered\"}"));
    wait_and_check(dc, 20, 12); /* in the order of the calls */
    cr_assert_eq(kvf_pd_release(dc, 20), KVF_OK);
    /* the first request's later pushes waited for its first one's reply;
     * the decoder is known now: the next request's go at once */
    queued = metric(&g_p, "kvf_agent_pd_pushes_queued_total");
    cr_assert_geq(queued, 1);
    push_layers(pc, 23, 4);
    cr_assert_eq(metric(&g_p, "kvf_agent_pd_pushes_queued_total"), queued);
    wait_and_check(dc, 23, 4);
    cr_assert_eq(kvf_pd_release(dc, 23), KVF_OK);
    cr_assert(metric_becomes(&g_d, REGION_USED, 0, 2000));
    kvf_client_disconnect(pc);
    kvf_client_disconnect(dc);
}

/* A decoder that takes one push of a request at a time (pd_pieces off: it
 * reads no piece and says nothing of pieces, as an agent before them):
 * the prefill agent sends the groups one after the other, still started
 * by the engine without waiting, and every byte arrives in order. */
Test(pd, layer_pushes_to_a_decoder_without_pieces_go_one_at_a_time)
{
    const char *const no_pieces[] = {"--pd-pieces=false", NULL};
    kvf_client_t *pc, *dc;
    uint32_t r;

    start_pair(no_pieces);
    pc = connect_to(&g_p);
    dc = connect_to(&g_d);
    for (r = 0; r < 2; r++) {
        push_layers(pc, 30 + r, 6);
        wait_and_check(dc, 30 + r, 6);
        cr_assert_eq(kvf_pd_release(dc, 30 + r), KVF_OK);
        /* none overlapped another at the decoder */
        cr_assert_eq(metric(&g_d, PIECES), 0);
    }
    /* the sender held them back (all 10 later groups, unless one came
     * after its predecessor had ended already) */
    cr_assert_geq(metric(&g_p, "kvf_agent_pd_pushes_queued_total"), 1);
    cr_log_info("%lld of 10 groups waited at the sender",
                metric(&g_p, "kvf_agent_pd_pushes_queued_total"));
    cr_assert_eq(metric(&g_d, "kvf_agent_pd_received_pushes_total"), 12);
    kvf_client_disconnect(pc);
    kvf_client_disconnect(dc);
}

/* Pushes started and failed but never collected are bounded (1024 a
 * connection): the next start says so instead of growing without end;
 * collecting a request's failure makes room, and the connection works on. */
Test(pd, uncollected_push_failures_are_bounded)
{
    kvf_client_t *pc;
    kvf_slot_t slot;
    kvf_status_t st;
    uint64_t sum;
    uint32_t i;

    start_pair(NULL);
    pc = connect_to(&g_p);
    fill_slots(pc, 41, 1, &slot, &sum);
    /* every one fails: no such decoder (or the slot is another push's) */
    for (i = 0; i < 1024; i++) {
        cr_assert_eq(kvf_pd_push_start(pc, 5000 + i, "no-such-decoder", &slot,
                                       &sum, 1, true),
                     KVF_OK, "start %u: %s", i, kvf_client_last_error(pc));
    }
    st = kvf_pd_push_start(pc, 7000, "no-such-decoder", &slot, &sum, 1, true);
    cr_assert_eq(st, KVF_ERR_BUSY, "%s: %s", kvf_strerror(st),
                 kvf_client_last_error(pc));
    cr_assert(strstr(kvf_client_last_error(pc), "kvf_pd_push_wait") != NULL,
              "%s", kvf_client_last_error(pc));
    st = kvf_pd_push_wait(pc, 5000, 0);
    cr_assert((st == KVF_ERR_NOT_FOUND) || (st == KVF_ERR_CLOSED) ||
                  (st == KVF_ERR_RANGE),
              "%s: %s", kvf_strerror(st), kvf_client_last_error(pc));
    cr_assert_eq(
        kvf_pd_push_start(pc, 7000, "no-such-decoder", &slot, &sum, 1, true),
        KVF_OK, "%s", kvf_client_last_error(pc));
    cr_assert_neq(kvf_pd_push_wait(pc, 7000, 0), KVF_OK);
    cr_assert_eq(kvf_client_release(pc, &slot, 1), KVF_OK, "%s",
                 kvf_client_last_error(pc));
    kvf_client_disconnect(pc);
}

Test(pd, a_damaged_layer_push_fails_the_request_and_the_pushes_after_it)
{
    kvf_client_t *pc, *dc;
    kvf_slot_t slots[6], got[6];
    uint64_t sums[6];
    uint32_t i, num = 0;

    start_pair(NULL);
    pc = connect_to(&g_p);
    dc = connect_to(&g_d);
    fill_slots(pc, 21, 6, slots, sums);
    sums[2] ^= 1; /* the third layer group is not what it says */
    for (i = 0; i < 6; i++) {
        kvf_status_t st = kvf_pd_push_start(pc, 21, "it-decode", &slots[i],
                                            &sums[i], 1, i == 5);

        /* a failure already known fails the next start at once */
        cr_assert((st == KVF_OK) || (st == KVF_ERR_CHECKSUM), "%s",
                  kvf_client_last_error(pc));
        if (st != KVF_OK) {
            break;
        }
    }
    if (i == 6) {
        cr_assert_eq(kvf_pd_push_wait(pc, 21, 0), KVF_ERR_CHECKSUM, "%s",
                     kvf_client_last_error(pc));
    }
    cr_assert_eq(kvf_pd_push_wait(pc, 21, 0), KVF_OK); /* collected */
    cr_assert_eq(kvf_client_release(pc, slots, 6), KVF_OK);
    cr_assert_eq(kvf_pd_wait(dc, 21, 2000000000ull, got, 6, &num),
                 KVF_ERR_CANCELED, "%s", kvf_client_last_error(dc));
    cr_assert_eq(num, 0);
    cr_assert(metric_becomes(&g_d, REGION_USED, 0, 2000));
    cr_assert_eq(metric(&g_d, "kvf_agent_pd_checksum_failures_total"), 1);
    /* the connection goes on: another request pushes fine */
    cr_assert_eq(push(pc, 22, 0, 2, true), KVF_OK, "%s",
                 kvf_client_last_error(pc));
    wait_and_check(dc, 22, 2);
    cr_assert_eq(kvf_pd_release(dc, 22), KVF_OK);
    /* and the failed request, sent again under its id, starts afresh at
     * its first piece and arrives whole */
    push_layers(pc, 21, 6);
    wait_and_check(dc, 21, 6);
    cr_assert_eq(kvf_pd_release(dc, 21), KVF_OK);
    kvf_client_disconnect(pc);
    kvf_client_disconnect(dc);
}

/* The bytes of chunk @p i of request @p req in a burst: a small pattern. */
static void fill_small(uint8_t *p, size_t len, uint64_t req, uint32_t i)
{
    size_t k;

    for (k = 0; k < len; k++) {
        p[k] = (uint8_t)(req * 131 + i * 7 + k);
    }
}

/* More pushes at once than the UCX worker has operations (ucx_max_ops 64
 * here): 32 requests of 64 layer groups of 4 KiB from four engines, none
 * waited for before the last started. A burst is slowed (control messages wait
 * for operations, data parks, receives go beyond the pool), never failed: every
 * request arrives, byte for byte. */
Test(pd, a_burst_beyond_the_worker_operations_is_slowed_not_failed)
{
    static const char *const prefill[] = {"--pool-size", "64M", "--ucx-max-ops",
                                          "64", NULL};
    static const char *const decode[]  = {"--pd-buffer-size",
                                          "16M",
                                          "--pd-queue-max",
                                          "64",
                                          "--ucx-max-ops",
                                          "64",
                                          NULL};
    enum {
        REQS   = 16,
        GROUPS = 64,
        LEN    = 4096
    };
    kvf_client_t *pc[4], *dc;
    static kvf_slot_t slots[REQS][GROUPS];
    kvf_slot_t got[GROUPS];
    uint64_t sum;
    uint32_t r, i, num;
    uint8_t want[LEN];

    start_agent(&g_p, "it-prefill", "prefill", prefill);
    start_agent(&g_d, "it-decode", "decode", decode);
    for (r = 0; r < 4; r++) {
        pc[r] = connect_to(&g_p);
    }
    dc = connect_to(&g_d);
    for (r = 0; r < REQS; r++) {
        kvf_client_t *c = pc[r % 4];

        cr_assert_eq(kvf_client_alloc(c, LEN, GROUPS, slots[r]), KVF_OK, "%s",
                     kvf_client_last_error(c));
        for (i = 0; i < GROUPS; i++) {
            uint8_t *p =
                (uint8_t *)kvf_client_pool_base(c) + slots[r][i].offset;

            fill_small(p, LEN, 100 + r, i);
            sum = kvf_chunk_checksum(p, LEN);
            cr_assert_eq(kvf_pd_push_start(c, 100 + r, "it-decode",
                                           &slots[r][i], &sum, 1,
                                           i == GROUPS - 1),
                         KVF_OK, "%s", kvf_client_last_error(c));
        }
    }
    for (r = 0; r < REQS; r++) {
        kvf_client_t *c = pc[r % 4];

        cr_assert_eq(kvf_pd_push_wait(c, 100 + r, 0), KVF_OK, "request %u: %s",
                     r, kvf_client_last_error(c));
        cr_assert_eq(kvf_client_release(c, slots[r], GROUPS), KVF_OK);
    }
    for (r = 0; r < REQS; r++) {
        num = 0;
        cr_assert_eq(kvf_pd_wait(dc, 100 + r, 5000000000ull, got, GROUPS, &num),
                     KVF_OK, "%s", kvf_client_last_error(dc));
        cr_assert_eq(num, GROUPS);
        for (i = 0; i < GROUPS; i++) {
            fill_small(want, LEN, 100 + r, i);
            cr_assert_eq(
                memcmp((uint8_t *)kvf_client_pool_base(dc) + got[i].offset,
                       want, LEN),
                0, "request %u piece %u differs", r, i);
        }
        cr_assert_eq(kvf_pd_release(dc, 100 + r), KVF_OK);
    }
    /* the burst did go beyond the operations */
    cr_assert_gt(metric(&g_p, "kvf_agent_pd_pushes_parked_total") +
                     metric(&g_p, "kvf_agent_mesh_deferred_total") +
                     metric(&g_d, "kvf_agent_mesh_deferred_total") +
                     metric(&g_d, "kvf_agent_ucx_recv_beyond_pool_total"),
                 0);
    cr_log_info("burst: %lld parked, %lld deferred, %lld receives beyond "
                "the pool",
                metric(&g_p, "kvf_agent_pd_pushes_parked_total"),
                metric(&g_p, "kvf_agent_mesh_deferred_total") +
                    metric(&g_d, "kvf_agent_mesh_deferred_total"),
                metric(&g_d, "kvf_agent_ucx_recv_beyond_pool_total"));
    for (r = 0; r < 4; r++) {
        kvf_client_disconnect(pc[r]);
    }
    kvf_client_disconnect(dc);
}

/* kvfctl ARGS... against the controller; output in @p out. */
static int kvfctl(char *out, size_t len, const char *a1, const char *a2)
{
    char bin[4096];
    const char *argv[] = {bin, "--controller", g_ctl.addr, a1, a2, NULL};

    snprintf(bin, sizeof(bin), "%s", kvf_test_build_path("tools/kvfctl"));
    return kvf_test_run(argv, out, len, 10000);
}

Test(pd, drain_refuses_pushes_survives_a_controller_restart_and_undrains)
{
    char out[16384], listen[160];
    const char *args[] = {"--heartbeat-interval", "100ms", "--listen", listen,
                          NULL};
    kvf_client_t *pc, *dc;
    kvf_status_t status;
    int i;

    start_pair(NULL);
    pc = connect_to(&g_p);
    dc = connect_to(&g_d);
    cr_assert_eq(kvfctl(out, sizeof(out), "drain", "it-decode"), 0, "%s", out);
    cr_assert(metric_becomes(&g_d, "kvf_agent_draining", 1, 5000));
    status = push(pc, 40, 0, 2, true);
    cr_assert_eq(status, KVF_ERR_STATE, "%d: %s", status,
                 kvf_client_last_error(pc));
    cr_assert_not_null(strstr(kvf_client_last_error(pc), "is draining"), "%s",
                       kvf_client_last_error(pc));

    /* a restarted controller learns the drain from the registration */
    snprintf(listen, sizeof(listen), "%s", g_ctl.addr);
    cr_assert_eq(kvf_th_ctl_stop(&g_ctl), 0);
    kvf_th_ctl_start(&g_ctl, args);
    for (i = 0; i < 1000; i++) {
        cr_assert_eq(kvfctl(out, sizeof(out), "--json", "nodes"), 0, "%s", out);
        if (strstr(out, "\"it-decode\",\"state\":\"draining\"") != NULL) {
            break;
        }
        poll(NULL, 0, 10);
    }
    cr_assert_not_null(strstr(out, "\"it-decode\",\"state\":\"draining\""),
                       "%s\n%s", out, kvf_test_proc_log(&g_d.proc));

    cr_assert_eq(kvfctl(out, sizeof(out), "undrain", "it-decode"), 0, "%s",
                 out);
    cr_assert(metric_becomes(&g_d, "kvf_agent_draining", 0, 5000));
    cr_assert_eq(push(pc, 41, 0, 2, true), KVF_OK, "%s",
                 kvf_client_last_error(pc));
    wait_and_check(dc, 41, 2);
    cr_assert_eq(kvf_pd_release(dc, 41), KVF_OK);
    kvf_client_disconnect(pc);
    kvf_client_disconnect(dc);
}

/* Small chunks of a push travel several a PD_DATA (one rendezvous), each
 * landing in its own slot of the decoder's region, every byte verified. */
Test(pd, small_chunks_travel_in_batches_byte_exact)
{
    enum {
        N     = 40,
        SMALL = 16u << 10
    };
    kvf_slot_t slots[64];
    uint64_t sums[N];
    kvf_client_t *pc, *dc;
    uint8_t want[SMALL];
    uint32_t num = 0, i, b;

    start_pair(NULL);
    pc = connect_to(&g_p);
    dc = connect_to(&g_d);
    cr_assert_eq(kvf_client_alloc(pc, SMALL, N, slots), KVF_OK);
    for (i = 0; i < N; i++) {
        uint8_t *p = (uint8_t *)kvf_client_pool_base(pc) + slots[i].offset;

        for (b = 0; b < SMALL; b++) {
            p[b] = (uint8_t)((b * 31u) ^ (i * 7u) ^ (b >> 8));
        }
        sums[i] = kvf_chunk_checksum(p, SMALL);
    }
    cr_assert_eq(kvf_pd_push(pc, 77, "it-decode", slots, sums, N, true), KVF_OK,
                 "%s", kvf_client_last_error(pc));
    cr_assert_eq(kvf_client_release(pc, slots, N), KVF_OK);
    cr_assert_eq(kvf_pd_wait(dc, 77, 5000000000ull, slots, 64, &num), KVF_OK,
                 "%s", kvf_client_last_error(dc));
    cr_assert_eq(num, N);
    for (i = 0; i < N; i++) {
        cr_assert_eq(slots[i].length, SMALL);
        for (b = 0; b < SMALL; b++) {
            want[b] = (uint8_t)((b * 31u) ^ (i * 7u) ^ (b >> 8));
        }
        cr_assert(memcmp((uint8_t *)kvf_client_pool_base(dc) + slots[i].offset,
                         want, SMALL) == 0,
                  "chunk %u differs", i);
    }
    cr_assert_eq(kvf_pd_release(dc, 77), KVF_OK);
    /* 40 chunks, one message */
    cr_assert_eq(
        metric(&g_d, "kvf_agent_pd_data_messages_total{kind=\"batch\"}"), 1);
    cr_assert_eq(
        metric(&g_d, "kvf_agent_pd_data_messages_total{kind=\"chunk\"}"), 0);
    kvf_client_disconnect(pc);
    kvf_client_disconnect(dc);
}

/* ------------------------------------------------------------ same host */

/* Both agents with the same-host path on; the first push opens the link
 * (and goes over UCX unless the link is up by PD_ALLOC_REPLY), and this
 * waits until it is up, so every later push is copied. */
static void start_pair_local(kvf_client_t **pc, kvf_client_t **dc)
{
    static const char *const local[] = {"--same-host=true", NULL};

    start_agent(&g_p, "it-prefill", "prefill", local);
    start_agent(&g_d, "it-decode", "decode", local);
    *pc = connect_to(&g_p);
    *dc = connect_to(&g_d);
    cr_assert_eq(push(*pc, 1, 0, 2, true), KVF_OK, "%s",
                 kvf_client_last_error(*pc));
    wait_and_check(*dc, 1, 2);
    cr_assert_eq(kvf_pd_release(*dc, 1), KVF_OK);
    cr_assert(metric_becomes(&g_p,
                             "kvf_agent_same_host_links_total{result=\"ok\"}",
                             1, 5000),
              "%s", kvf_test_proc_log(&g_p.proc));
}

#define SENT_LOCAL "kvf_agent_pd_same_host_total{dir=\"sent\"}"
#define RECV_LOCAL "kvf_agent_pd_same_host_total{dir=\"received\"}"

Test(pd, same_host_pushes_are_copied_into_the_region_byte_exact)
{
    kvf_client_t *pc, *dc;
    long long before, chunk_msgs;
    uint64_t req;

    start_pair_local(&pc, &dc);
    /* the first push (start_pair_local's) waited for the link to be
     * proved and was copied too */
    before = metric(&g_p, SENT_LOCAL);
    cr_assert_eq(before, 1, "the first push went over UCX");
    chunk_msgs =
        metric(&g_d, "kvf_agent_pd_data_messages_total{kind=\"chunk\"}");
    for (req = 2; req < 6; req++) {
        cr_assert_eq(push(pc, req, 0, 4, true), KVF_OK, "%s",
                     kvf_client_last_error(pc));
        wait_and_check(dc, req, 4);
        cr_assert_eq(kvf_pd_release(dc, req), KVF_OK);
    }
    /* every one copied through the region, verified, none over UCX */
    cr_assert_eq(metric(&g_p, SENT_LOCAL), before + 4);
    cr_assert_eq(metric(&g_d, RECV_LOCAL), metric(&g_p, SENT_LOCAL));
    cr_assert_eq(
        metric(&g_d, "kvf_agent_pd_data_messages_total{kind=\"chunk\"}"),
        chunk_msgs);
    cr_assert_geq(metric(&g_p, "kvf_agent_pd_same_host_bytes_total"),
                  16ll * CHUNK);
    cr_assert_eq(metric(&g_d, "kvf_agent_pd_checksum_failures_total"), 0);
    cr_assert(metric_becomes(&g_d, REGION_USED, 0, 2000));
    cr_assert_not_null(
        strstr(kvf_test_proc_log(&g_d.proc), "and the PD receive region"), "%s",
        kvf_test_proc_log(&g_d.proc));
    kvf_client_disconnect(pc);
    kvf_client_disconnect(dc);
}

/* Listens on the same-host socket of agent @p a (whose own is off) as a
 * stalled peer would: it accepts nothing and answers nothing. */
static int stall_same_host_socket(it_agent_t *a)
{
    const char *log = kvf_test_proc_log(&a->proc);
    const char *at  = strstr(log, "peer service on ");
    int fd;

    cr_assert_not_null(at, "%s", log);
    /* the name agent/local.c dials: "kvf-local/" + the data address */
    fd = kvf_test_abstract_socket("kvf-local/", at + strlen("peer service on "),
                                  true);
    cr_assert_geq(fd, 0, "%m");
    return fd;
}

/* A push to a same-host decoder waits a moment for the link to be proved;
 * when whatever answers on the decoder's socket never finishes the
 * handshake, the push goes over UCX after that moment and arrives, later
 * pushes do not wait for that link again, and the link is dropped. */
Test(pd, a_stalled_same_host_link_delays_only_the_first_push)
{
    static const char *const local[] = {"--same-host=true", NULL};
    kvf_client_t *pc, *dc;
    uint64_t t0;
    int lfd;

    start_agent(&g_d, "it-decode", "decode", NULL); /* its own socket off */
    lfd = stall_same_host_socket(&g_d);
    start_agent(&g_p, "it-prefill", "prefill", local);
    pc = connect_to(&g_p);
    dc = connect_to(&g_d);
    t0 = kvf_time_now_ns();
    cr_assert_eq(push(pc, 1, 0, 2, true), KVF_OK, "%s",
                 kvf_client_last_error(pc));
    /* it waited for the link (100 ms), not for its own timeout (3 s) */
    cr_assert_geq(kvf_time_now_ns() - t0, 100ull * 1000 * 1000);
    wait_and_check(dc, 1, 2);
    cr_assert_eq(kvf_pd_release(dc, 1), KVF_OK);
    cr_assert_eq(push(pc, 2, 0, 2, true), KVF_OK, "%s",
                 kvf_client_last_error(pc));
    wait_and_check(dc, 2, 2);
    cr_assert_eq(kvf_pd_release(dc, 2), KVF_OK);
    cr_assert_eq(metric(&g_p, SENT_LOCAL), 0);
    cr_assert(metric_becomes(
                  &g_p, "kvf_agent_same_host_links_total{result=\"refused\"}",
                  1, 5000),
              "%s", kvf_test_proc_log(&g_p.proc));
    cr_assert_not_null(
        strstr(kvf_test_proc_log(&g_p.proc), "did not finish its handshake"));
    close(lfd);
    kvf_client_disconnect(pc);
    kvf_client_disconnect(dc);
}

/* A copied chunk that is not what its checksum says fails the push, as
 * over UCX: the engine never sees it and the slots go back. */
Test(pd, same_host_damaged_chunk_fails_the_push)
{
    kvf_client_t *pc, *dc;
    kvf_slot_t slots[3], got[3];
    uint64_t sums[3];
    uint32_t i, num = 0;
    long long before;

    start_pair_local(&pc, &dc);
    before = metric(&g_p, SENT_LOCAL);
    cr_assert_eq(kvf_client_alloc(pc, CHUNK, 3, slots), KVF_OK);
    for (i = 0; i < 3; i++) {
        uint8_t *p = (uint8_t *)kvf_client_pool_base(pc) + slots[i].offset;

        fill(p, 91, i);
        sums[i] = kvf_chunk_checksum(p, CHUNK);
    }
    sums[2] ^= 1;
    cr_assert_eq(kvf_pd_push(pc, 91, "it-decode", slots, sums, 3, true),
                 KVF_ERR_CHECKSUM, "%s", kvf_client_last_error(pc));
    cr_assert_eq(kvf_client_release(pc, slots, 3), KVF_OK);
    cr_assert_eq(metric(&g_p, SENT_LOCAL), before + 1);
    cr_assert_eq(kvf_pd_wait(dc, 91, 1000000000ull, got, 3, &num),
                 KVF_ERR_CANCELED, "%s", kvf_client_last_error(dc));
    cr_assert_eq(num, 0);
    cr_assert(metric_becomes(&g_d, REGION_USED, 0, 2000));
    cr_assert_eq(metric(&g_d, "kvf_agent_pd_checksum_failures_total"), 1);
    kvf_client_disconnect(pc);
    kvf_client_disconnect(dc);
}

typedef struct streamer {
    kvf_client_t *c;
    uint32_t ok, failed;
} streamer_t;

static void *stream_thread(void *arg)
{
    streamer_t *p = arg;
    uint64_t req;

    for (req = 100; req < 140; req++) {
        if (push(p->c, req, 0, 4, true) == KVF_OK) {
            p->ok++;
        } else {
            p->failed++;
        }
    }
    return NULL;
}

/* The decoder dies while pushes copy into its region: the prefill agent's
 * mapping stays valid, so the copies finish, the pushes fail within their
 * timeout, and the prefill agent lives on (and exits cleanly). */
Test(pd, same_host_decoder_killed_while_copying_is_a_failed_push)
{
    kvf_client_t *pc, *dc;
    streamer_t p = {0};
    pthread_t t;

    start_pair_local(&pc, &dc);
    kvf_client_disconnect(dc);
    p.c = pc;
    cr_assert_eq(pthread_create(&t, NULL, stream_thread, &p), 0);
    while (metric(&g_p, SENT_LOCAL) < 4) {
        poll(NULL, 0, 1);
    }
    kvf_test_proc_kill(&g_d.proc);
    g_d.running = false;
    pthread_join(t, NULL);
    cr_assert_gt(p.failed, 0);
    cr_assert(registered(&g_p), "%s", kvf_test_proc_log(&g_p.proc));
    kvf_client_disconnect(pc);
}

/* The decoder's region is a memfd (same-host senders map it), so a
 * process of the agent's user can open it through /proc/AGENT/fd. Bytes
 * changed there after a push was verified never reach an engine: the
 * claim copies each chunk into the engine's staging against its checksum,
 * and fails the wait instead. */
Test(pd, region_changed_after_verification_fails_the_claim)
{
    kvf_client_t *pc, *dc;
    kvf_slot_t got[4];
    char dir[64], path[384], target[128];
    uint32_t num = 0;
    struct dirent *de;
    uint8_t *map;
    DIR *d;
    int fd = -1;
    ssize_t n;

    start_pair_local(&pc, &dc);
    cr_assert_eq(push(pc, 7, 0, 4, true), KVF_OK, "%s",
                 kvf_client_last_error(pc));
    snprintf(dir, sizeof(dir), "/proc/%d/fd", (int)g_d.proc.pid);
    d = opendir(dir);
    cr_assert_not_null(d);
    while ((fd < 0) && ((de = readdir(d)) != NULL)) {
        snprintf(path, sizeof(path), "%s/%s", dir, de->d_name);
        n = readlink(path, target, sizeof(target) - 1);
        if ((n > 0) &&
            (memmem(target, (size_t)n, "kvf-pd-region", 13) != NULL)) {
            fd = open(path, O_RDWR);
        }
    }
    closedir(d);
    cr_assert_geq(fd, 0, "no region memfd in %s", dir);
    map = mmap(NULL, REGION, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    cr_assert_neq(map, MAP_FAILED);
    memset(map, 0xa5, REGION);
    munmap(map, REGION);
    close(fd);
    cr_assert_eq(kvf_pd_wait(dc, 7, 5000000000ull, got, 4, &num),
                 KVF_ERR_CHECKSUM, "%s", kvf_client_last_error(dc));
    cr_assert(strstr(kvf_client_last_error(dc),
                     "changed in the receive region") != NULL,
              "%s", kvf_client_last_error(dc));
    cr_assert_eq(metric(&g_d, "kvf_agent_pd_claim_checksum_failures_total"), 1);
    /* released at once: its region space is free, whatever the engine does */
    cr_assert_eq(metric(&g_d, "kvf_agent_pd_requests"), 0);
    cr_assert_eq(metric(&g_d, "kvf_agent_pd_region_bytes{state=\"used\"}"), 0);
    cr_assert_eq(kvf_pd_release(dc, 7), KVF_ERR_NOT_FOUND, "%s",
                 kvf_client_last_error(dc));
    kvf_client_disconnect(pc);
    kvf_client_disconnect(dc);
}

/* A push of a request whose earlier push failed at the prefill agent, sent
 * by the engine before it read that failure (kvf_pd_push_start does not
 * wait), must not start the request at the decoder: before the engine
 * numbered its pushes (EnginePdPush.piece), the agent took it for a fresh
 * request and the decoder delivered the request as that push alone (the
 * soak saw "4 of 7 chunks, 522211 wrong bytes"). Here the first push is
 * refused busy by the decoder's per-sender quota, the second (final) would
 * fit. */
Test(pd, a_push_after_a_failed_one_of_its_request_never_starts_it)
{
    static const char *const quota[] = {"--pd-peer-max-bytes", "512K", NULL};
    kvf_slot_t slots[5], got[8];
    uint64_t sums[5];
    kvf_client_t *pc, *dc;
    uint32_t num = 0;

    start_pair(quota);
    pc = connect_to(&g_p);
    dc = connect_to(&g_d);
    fill_slots(pc, 61, 5, slots, sums);
    cr_assert_eq(kvf_pd_push_start(pc, 61, "it-decode", slots, sums, 4, false),
                 KVF_OK, "%s", kvf_client_last_error(pc));
    /* the first push fails at the agent; its reply waits unread */
    cr_assert(metric_becomes(
        &g_p, "kvf_agent_pd_pushes_total{result=\"failed\"}", 1, 5000));
    cr_assert_eq(
        kvf_pd_push_start(pc, 61, "it-decode", &slots[4], &sums[4], 1, true),
        KVF_OK, "%s", kvf_client_last_error(pc));
    cr_assert_neq(kvf_pd_push_wait(pc, 61, 0), KVF_OK);
    cr_assert_neq(kvf_pd_wait(dc, 61, 500000000ull, got, 8, &num), KVF_OK,
                  "the decoder delivered %u chunks of a request whose first "
                  "push never arrived",
                  num);
    cr_assert_eq(metric(&g_p, "kvf_agent_pd_pieces_refused_total"), 1);
    cr_assert_eq(kvf_client_release(pc, slots, 5), KVF_OK);
    kvf_client_disconnect(pc);
    kvf_client_disconnect(dc);
}

/* Pushes request @p req again from its first piece, @p n chunks in one
 * final push: delivered whole, no push refused by the prefill agent; then
 * both engines go. */
static void push_again_delivered(kvf_client_t *pc, kvf_client_t *dc,
                                 uint64_t req, uint32_t n)
{
    cr_assert_eq(push(pc, req, 0, n, true), KVF_OK, "%s",
                 kvf_client_last_error(pc));
    wait_and_check(dc, req, n);
    cr_assert_eq(kvf_pd_release(dc, req), KVF_OK);
    cr_assert_eq(metric(&g_p, "kvf_agent_pd_pieces_refused_total"), 0);
    kvf_client_disconnect(pc);
    kvf_client_disconnect(dc);
}

/* A request whose push failed and was collected may be pushed again from
 * its first piece: the library's numbering starts afresh (a push refused
 * busy by the decoder's quota leaves nothing there to collide with). */
Test(pd, a_request_pushed_again_after_a_collected_failure_is_delivered)
{
    static const char *const quota[] = {"--pd-peer-max-bytes", "512K", NULL};
    kvf_client_t *pc, *dc;

    start_pair(quota);
    pc = connect_to(&g_p);
    dc = connect_to(&g_d);
    cr_assert_eq(push(pc, 62, 0, 4, false), KVF_ERR_BUSY, "%s",
                 kvf_client_last_error(pc));
    push_again_delivered(pc, dc, 62, 1);
}

/* A push whose send fails (the prefill agent died: the engine's socket is
 * closed under it) fails its request at once, as a failure collected by
 * kvf_pd_push_wait does: pushed again from its first piece once the agent
 * is back, it is delivered whole. Before, the failed send had spent a
 * piece number, and the new agent refused the retry as a later piece of a
 * request it never saw. */
Test(pd, a_request_pushed_again_after_its_push_could_not_be_sent_is_delivered)
{
    kvf_client_t *pc, *dc;
    kvf_slot_t slots[2];
    uint64_t sums[2];
    uint32_t num = 0;

    start_pair(NULL);
    pc = connect_to(&g_p);
    dc = connect_to(&g_d);
    cr_assert_eq(push(pc, 64, 0, 1, false), KVF_OK, "%s",
                 kvf_client_last_error(pc));
    fill_slots(pc, 64, 2, slots, sums); /* in the pool of the agent to die */
    kvf_test_proc_kill(&g_p.proc);
    start_agent(&g_p, "it-prefill", "prefill", NULL);
    cr_assert_neq(kvf_pd_push_start(pc, 64, "it-decode", slots, sums, 2, false),
                  KVF_OK, "a push to a dead agent cannot be sent");
    /* the decode engine learns that the first piece went with its sender
     * (the decoder keeps the request's tombstone until it is read) */
    cr_assert_eq(kvf_pd_wait(dc, 64, 5000000000ull, slots, 2, &num),
                 KVF_ERR_CANCELED, "%s", kvf_client_last_error(dc));
    push_again_delivered(pc, dc, 64, 2);
}

/* The decode engine gets the checksum each chunk was verified with
 * (kvf_pd_wait_checksums), the prefill engine's own, and can check the
 * bytes it reads against them. */
Test(pd, the_decode_engine_gets_each_chunks_checksum)
{
    kvf_client_t *pc, *dc;
    kvf_slot_t slots[4], got[4];
    uint64_t sums[4], got_sums[4];
    uint32_t num = 0, i;

    start_pair(NULL);
    pc = connect_to(&g_p);
    dc = connect_to(&g_d);
    fill_slots(pc, 65, 4, slots, sums);
    cr_assert_eq(kvf_pd_push(pc, 65, "it-decode", slots, sums, 4, true), KVF_OK,
                 "%s", kvf_client_last_error(pc));
    cr_assert_eq(
        kvf_pd_wait_checksums(dc, 65, 5000000000ull, got, NULL, 4, &num),
        KVF_ERR_INVALID);
    cr_assert_eq(
        kvf_pd_wait_checksums(dc, 65, 5000000000ull, got, got_sums, 4, &num),
        KVF_OK, "%s", kvf_client_last_error(dc));
    cr_assert_eq(num, 4);
    for (i = 0; i < 4; i++) {
        cr_assert_eq(got_sums[i], sums[i], "chunk %u", i);
        cr_assert(kvf_client_verify(dc, &got[i], got_sums[i]));
    }
    cr_assert_not(kvf_client_verify(dc, &got[0], got_sums[1]));
    cr_assert_eq(kvf_pd_release(dc, 65), KVF_OK);
    cr_assert_eq(kvf_client_release(pc, slots, 4), KVF_OK);
    kvf_client_disconnect(pc);
    kvf_client_disconnect(dc);
}
