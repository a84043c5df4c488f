/* SPDX-License-Identifier: Apache-2.0 */
/* Copyright (c) 2026 The kvfabric authors */
/*
 * Fault injection across hosts: a controller and three agents, each on its
 * own network namespace joined by veth links to a bridge (fcluster.h),
 * talking over UCX TCP. Each test injects one fault (kill -9 of a holder
 * during a fetch, controller kill and restart, link down/up, netem delay
 * and loss, a full pool, a stopped peer) and then checks that no call
 * waited past its timeout, no engine got a byte that differs from the
 * chunk it asked for, the registry converged to what the agents really
 * hold (kvfctl vs GET /v1/inventory), no grant or pin leaked, and every
 * process still answers. The pd_faults suite does the same for PD push
 * between a prefill and a decode agent (below). Without namespaces (no
 * CAP_SYS_ADMIN) every test skips and says why; without sch_netem only the
 * netem test does.
 */
#include "common/time.h"
#include "tests/faults/fcluster.h"
#include "tests/helpers/test_helpers.h"

#include <criterion/criterion.h>

#include <pthread.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>

#define AGENTS      3
#define CHUNK       (256u << 10)
#define FETCH_TMO_S 2
/* a fetch may take fetch_timeout, plus a controller lookup and the
 * engine round trips: anything past this margin is a hang */
#define HANG_NS ((FETCH_TMO_S + 6) * KVF_NSEC_PER_SEC)

static kvf_fc_t g_fc;
static const char *g_skip;

static void setup(void)
{
    kvf_fc_params_t p = {.num_agents    = AGENTS,
                         .is_netns      = true,
                         .pool_size     = "32M",
                         .fetch_tmo     = "2s",
                         .lease         = "2s",
                         .max_chunk     = "1M",
                         .client_tmo_ns = 20 * KVF_NSEC_PER_SEC};

    g_skip = kvf_fc_netns_unavailable();
    if (g_skip != NULL) {
        return;
    }
    cr_assert_eq(kvf_fc_create(&g_fc, &p), 0, "%s", g_fc.why);
}

static void teardown(void)
{
    if (g_skip == NULL) {
        kvf_fc_destroy(&g_fc);
    }
    kvf_test_check_leaks();
}

TestSuite(faults, .init = setup, .fini = teardown, .timeout = 120);

#define SKIP_WITHOUT_NETNS() \
    do { \
        if (g_skip != NULL) { \
            cr_skip_test("network namespaces unavailable: %s", g_skip); \
        } \
    } while (0)

/* The checks after every fault. */
static void check_healed(void)
{
    cr_assert(kvf_fc_responsive(&g_fc), "%s", g_fc.why);
    cr_assert(kvf_fc_wait_converged(&g_fc, 20000),
              "registry did not converge: %s", g_fc.why);
    cr_assert(kvf_fc_wait_quiet(&g_fc, 15000), "leak: %s", g_fc.why);
}

static void store(int i, const kvf_key_t *keys, uint32_t n)
{
    cr_assert_eq(kvf_fc_store(&g_fc, i, keys, n, CHUNK), KVF_OK, "%s",
                 g_fc.why);
}

static void wait_hits(int i, const kvf_key_t *keys, uint32_t n, uint32_t hits)
{
    cr_assert(kvf_fc_wait_hits(&g_fc, i, keys, n, hits, 20000), "%s", g_fc.why);
}

/* Retrieves through agent @p i: never wrong bytes, never past HANG_NS. */
static void fetch(int i, const kvf_key_t *keys, uint32_t n, bool prefetch,
                  kvf_fc_fetch_t *res)
{
    kvf_fc_retrieve(&g_fc, i, keys, n, CHUNK, prefetch, res);
    cr_assert_eq(res->status, KVF_OK, "%s", g_fc.why);
    cr_assert_eq(res->wrong_bytes, 0, "an engine got %llu wrong bytes",
                 (unsigned long long)res->wrong_bytes);
    cr_assert_lt(res->took_ns, HANG_NS, "retrieve took %llu ms",
                 (unsigned long long)(res->took_ns / KVF_NSEC_PER_MSEC));
    cr_assert_eq(res->got + res->missing, n);
}

typedef struct fetch_job {
    int agent;
    const kvf_key_t *keys;
    uint32_t n;
    kvf_fc_fetch_t res;
} fetch_job_t;

static void *fetch_thread(void *arg)
{
    fetch_job_t *job = arg;

    kvf_fc_retrieve(&g_fc, job->agent, job->keys, job->n, CHUNK, false,
                    &job->res);
    return NULL;
}

Test(faults, holder_killed_during_fetch)
{
    kvf_key_t keys[16];
    fetch_job_t job = {.agent = 1, .keys = keys, .n = 16};
    kvf_fc_fetch_t res;
    pthread_t th;

    SKIP_WITHOUT_NETNS();
    kvf_fc_keys(1, keys, 16);
    store(0, keys, 16);
    wait_hits(1, keys, 16, 16);
    /* the holder stops answering, the fetch starts and waits on it, and
     * then the holder dies: its connections reset mid-request */
    kvf_fc_agent_pause(&g_fc, 0, true);
    cr_assert_eq(pthread_create(&th, NULL, fetch_thread, &job), 0);
    poll(NULL, 0, 300); /* fault timing: the fetch is under way */
    kvf_fc_agent_kill(&g_fc, 0);
    pthread_join(th, NULL);
    cr_assert_eq(job.res.status, KVF_OK, "%s", g_fc.why);
    cr_assert_eq(job.res.wrong_bytes, 0);
    cr_assert_eq(job.res.missing, 16,
                 "every chunk of the dead holder "
                 "is a miss");
    cr_assert_lt(job.res.took_ns, HANG_NS, "retrieve took %llu ms",
                 (unsigned long long)(job.res.took_ns / KVF_NSEC_PER_MSEC));
    /* the holder comes back empty; the registry forgets its chunks */
    cr_assert_eq(kvf_fc_agent_start(&g_fc, 0), 0, "%s", g_fc.why);
    check_healed();
    fetch(1, keys, 16, false, &res);
    cr_assert_eq(res.missing, 16);
}

Test(faults, controller_killed_and_restarted)
{
    kvf_key_t a[6], b[4];
    kvf_fc_fetch_t res;

    SKIP_WITHOUT_NETNS();
    kvf_fc_keys(2, a, 6);
    kvf_fc_keys(3, b, 4);
    store(0, a, 6);
    store(1, b, 4);
    wait_hits(2, a, 6, 6);
    fetch(2, a, 6, false, &res); /* agent 2 holds a copy now */
    cr_assert_eq(res.got, 6);
    kvf_fc_ctl_kill(&g_fc);
    /* without a controller: local chunks still served, remote ones are
     * misses within the lookup timeout, nothing hangs */
    fetch(0, a, 6, false, &res);
    cr_assert_eq(res.got, 6);
    fetch(0, b, 4, true, &res);
    cr_assert_eq(res.missing, 4);
    cr_assert_eq(kvf_fc_ctl_start(&g_fc), 0, "%s", g_fc.why);
    for (int i = 0; i < AGENTS; i++) {
        cr_assert(kvf_fc_agent_wait_registered(&g_fc, i, 20000), "%s",
                  g_fc.why);
    }
    /* the agents' inventories rebuilt the registry */
    check_healed();
    wait_hits(0, b, 4, 4);
    fetch(0, b, 4, false, &res);
    cr_assert_eq(res.got, 4);
}

Test(faults, link_down_then_up)
{
    const char *nodes[] = {"--json", "nodes", NULL};
    static char out[65536];
    kvf_key_t keys[6];
    kvf_fc_fetch_t res;
    uint64_t deadline;

    SKIP_WITHOUT_NETNS();
    kvf_fc_keys(4, keys, 6);
    store(0, keys, 6);
    wait_hits(1, keys, 6, 6);
    cr_assert_eq(kvf_fc_link(&g_fc, 0, false), 0, "%s", g_fc.why);
    /* agent 0 is unreachable: misses within the fetch timeout */
    fetch(1, keys, 6, false, &res);
    cr_assert_eq(res.missing, 6);
    /* the controller declares it dead when its lease runs out */
    deadline = kvf_time_deadline_ns(20 * KVF_NSEC_PER_SEC);
    for (;;) {
        cr_assert_eq(kvf_fc_kvfctl(&g_fc, out, sizeof(out), nodes), 0);
        if (strstr(out, "\"name\":\"fa0\",\"state\":\"dead\"") != NULL) {
            break;
        }
        cr_assert(!kvf_time_expired(deadline), "fa0 never died: %s", out);
        poll(NULL, 0, 50);
    }
    cr_assert_eq(kvf_fc_link(&g_fc, 0, true), 0, "%s", g_fc.why);
    /* back: it registers again and resends what it holds */
    cr_assert(kvf_fc_agent_wait_registered(&g_fc, 0, 20000), "%s", g_fc.why);
    check_healed();
    wait_hits(1, keys, 6, 6);
    fetch(1, keys, 6, false, &res);
    cr_assert_eq(res.got, 6);
}

Test(faults, netem_delay_and_loss)
{
    const char *no_netem;
    kvf_key_t keys[8];
    kvf_fc_fetch_t res;
    uint32_t got = 0;
    int round;

    SKIP_WITHOUT_NETNS();
    no_netem = kvf_fc_netem_unavailable();
    if (no_netem != NULL) {
        cr_skip_test("netem unavailable: %s", no_netem);
    }
    kvf_fc_keys(5, keys, 8);
    store(0, keys, 8);
    wait_hits(1, keys, 8, 8);
    cr_assert_eq(kvf_fc_netem(&g_fc, 0, "delay 50ms loss 5%"), 0, "%s",
                 g_fc.why);
    /* every chunk comes byte-exact or is a clean miss, in time */
    for (round = 0; round < 3; round++) {
        fetch(1 + round % 2, keys, 8, round == 0, &res);
        got += res.got;
    }
    cr_assert_eq(kvf_fc_netem(&g_fc, 0, "off"), 0, "%s", g_fc.why);
    cr_assert_gt(got, 0, "nothing got through 50 ms and 5%% loss");
    check_healed();
}

Test(faults, full_pool_errors_cleanly)
{
    kvf_key_t keys[4];
    kvf_slot_t slot;
    kvf_client_t *hog = NULL;
    kvf_fc_fetch_t res;
    kvf_status_t st = KVF_OK;
    uint64_t t0;
    int n;

    SKIP_WITHOUT_NETNS();
    kvf_fc_keys(6, keys, 4);
    store(0, keys, 4);
    wait_hits(1, keys, 4, 4);
    /* an engine holds every byte of agent 1's pool in grants */
    cr_assert_eq(kvf_fc_connect(&g_fc, 1, &hog), KVF_OK);
    for (n = 0; n < 64; n++) {
        t0 = kvf_time_now_ns();
        st = kvf_client_alloc(hog, 1u << 20, 1, &slot);
        cr_assert_lt(kvf_time_now_ns() - t0, 2 * KVF_NSEC_PER_SEC,
                     "alloc waited for room");
        if (st != KVF_OK) {
            break;
        }
    }
    cr_assert_eq(st, KVF_ERR_NO_MEMORY, "%s", kvf_client_last_error(hog));
    /* nowhere to land a fetch: clean misses, no deadlock */
    fetch(1, keys, 4, false, &res);
    cr_assert_eq(res.missing, 4);
    kvf_client_disconnect(hog); /* its grants go back */
    cr_assert(kvf_fc_wait_quiet(&g_fc, 10000), "%s", g_fc.why);
    fetch(1, keys, 4, false, &res);
    cr_assert_eq(res.got, 4);
    check_healed();
}

Test(faults, stopped_peer_does_not_block_others)
{
    kvf_key_t slow[4], fast[4];
    kvf_fc_fetch_t res;

    SKIP_WITHOUT_NETNS();
    kvf_fc_keys(7, slow, 4);
    kvf_fc_keys(8, fast, 4);
    store(0, slow, 4);
    store(2, fast, 4);
    wait_hits(1, slow, 4, 4);
    wait_hits(1, fast, 4, 4);
    kvf_fc_agent_pause(&g_fc, 0, true); /* a peer that stops answering */
    fetch(1, slow, 4, false, &res);
    cr_assert_eq(res.missing, 4);
    /* another holder is served meanwhile */
    fetch(1, fast, 4, false, &res);
    cr_assert_eq(res.got, 4);
    kvf_fc_agent_pause(&g_fc, 0, false);
    /* it may have been declared dead meanwhile: it registers again */
    cr_assert(kvf_fc_agent_wait_registered(&g_fc, 0, 20000), "%s", g_fc.why);
    wait_hits(2, slow, 4, 4);
    fetch(2, slow, 4, false, &res);
    cr_assert_eq(res.got, 4);
    check_healed();
}

/*
 * PD push under faults: a controller, a prefill agent (host 1) and a
 * decode agent with a 4 MiB receive region (host 2; 16 chunks of
 * CHUNK), with short PD timeouts so a failed push shows up in seconds.
 * After each fault: the prefill engine's kvf_pd_push and the decode
 * engine's kvf_pd_wait returned within their timeouts, every byte the
 * decode engine got equals what was pushed, the decoder's region is empty
 * again, the prefill agent lent nothing out, and a new request goes
 * through byte-exact.
 */
#define PD_P          0
#define PD_D          1
#define PD_PUSH_TMO_S 2
#define PD_WAIT_TMO_S 3
/* a push ends within pd_push_timeout; past this margin it hung */
#define PD_PUSH_HANG_NS ((PD_PUSH_TMO_S + 2) * KVF_NSEC_PER_SEC)
#define PD_WAIT_HANG_NS ((PD_WAIT_TMO_S + 2) * KVF_NSEC_PER_SEC)
#define PD_USED         "kvf_agent_pd_region_bytes{state=\"used\"}"

static void pd_setup(void)
{
    kvf_fc_params_t p = {.num_agents     = 2,
                         .is_netns       = true,
                         .pool_size      = "32M",
                         .fetch_tmo      = "2s",
                         .lease          = "2s",
                         .max_chunk      = "1M",
                         .client_tmo_ns  = 20 * KVF_NSEC_PER_SEC,
                         .roles          = {"prefill", "decode"},
                         .pd_buffer_size = "4M",
                         .pd_push_tmo    = "2s",
                         .pd_alloc_tmo   = "1s",
                         .pd_claim_tmo   = "10s"};

    g_skip = kvf_fc_netns_unavailable();
    if (g_skip != NULL) {
        return;
    }
    cr_assert_eq(kvf_fc_create(&g_fc, &p), 0, "%s", g_fc.why);
}

TestSuite(pd_faults, .init = pd_setup, .fini = teardown, .timeout = 120);

static kvf_client_t *pd_connect(int i)
{
    kvf_client_t *c = NULL;

    cr_assert_eq(kvf_fc_connect(&g_fc, i, &c), KVF_OK, "agent %s",
                 g_fc.agents[i].name);
    return c;
}

static void pd_push_ok(kvf_client_t *pc, uint64_t req, uint32_t first,
                       uint32_t n, bool final)
{
    cr_assert_eq(kvf_fc_pd_push(&g_fc, pc, req, g_fc.agents[PD_D].name, first,
                                n, CHUNK, final),
                 KVF_OK, "%s", g_fc.why);
}

/* The decode engine gets @p req: @p n chunks, every byte as pushed. */
static void pd_receive_ok(kvf_client_t *dc, uint64_t req, uint32_t n)
{
    kvf_fc_pd_t res;

    kvf_fc_pd_receive(&g_fc, dc, req, n, CHUNK,
                      PD_WAIT_TMO_S * KVF_NSEC_PER_SEC, &res);
    cr_assert_eq(res.status, KVF_OK, "%s", g_fc.why);
    cr_assert_eq(res.wrong_bytes, 0, "the decode engine got %llu wrong bytes",
                 (unsigned long long)res.wrong_bytes);
    cr_assert_eq(res.num, n);
    cr_assert_eq(res.got, n);
}

/* A new request, streamed in two pushes, arrives byte-exact. */
static void pd_roundtrip(uint64_t req)
{
    kvf_client_t *pc = pd_connect(PD_P), *dc = pd_connect(PD_D);

    pd_push_ok(pc, req, 0, 3, false);
    pd_push_ok(pc, req, 3, 2, true);
    pd_receive_ok(dc, req, 5);
    kvf_client_disconnect(pc);
    kvf_client_disconnect(dc);
}

static void pd_wait_region_empty(void)
{
    uint64_t deadline = kvf_time_deadline_ns(15 * KVF_NSEC_PER_SEC);
    long long used;

    while ((used = kvf_fc_metric(&g_fc, PD_D, PD_USED)) != 0) {
        cr_assert(!kvf_time_expired(deadline),
                  "the decoder still has %lld region bytes in use", used);
        poll(NULL, 0, 50);
    }
}

typedef struct pd_job {
    kvf_client_t *c;
    uint64_t req;
    uint32_t first, n;
    kvf_status_t status;
    uint64_t took_ns;
    kvf_fc_pd_t res; /* pd_wait_thread */
} pd_job_t;

static void *pd_push_thread(void *arg)
{
    pd_job_t *job = arg;
    uint64_t t0   = kvf_time_now_ns();

    job->status =
        kvf_fc_pd_push(&g_fc, job->c, job->req, g_fc.agents[PD_D].name,
                       job->first, job->n, CHUNK, true);
    job->took_ns = kvf_time_now_ns() - t0;
    return NULL;
}

static void *pd_wait_thread(void *arg)
{
    pd_job_t *job = arg;

    kvf_fc_pd_receive(&g_fc, job->c, job->req, job->n, CHUNK,
                      PD_WAIT_TMO_S * KVF_NSEC_PER_SEC, &job->res);
    return NULL;
}

/* Eight layer groups of @p job's request started at once, then waited
 * for. */
static void *pd_layers_thread(void *arg)
{
    pd_job_t *job = arg;
    uint64_t t0   = kvf_time_now_ns();

    job->status  = kvf_fc_pd_push_layers(&g_fc, job->c, job->req,
                                         g_fc.agents[PD_D].name, 8, 8, CHUNK, 0);
    job->took_ns = kvf_time_now_ns() - t0;
    return NULL;
}

/* The push of @p job failed (no hang) within pd_push_timeout. */
static void pd_check_push_failed(const pd_job_t *job)
{
    cr_assert_neq(job->status, KVF_OK, "the push went through");
    cr_assert_lt(job->took_ns, PD_PUSH_HANG_NS, "push took %llu ms: %s",
                 (unsigned long long)(job->took_ns / KVF_NSEC_PER_MSEC),
                 g_fc.why);
}

Test(pd_faults, decoder_killed_during_push)
{
    kvf_client_t *pc;
    pd_job_t job = {.req = 100, .first = 4, .n = 4};
    pthread_t th;

    SKIP_WITHOUT_NETNS();
    pc    = pd_connect(PD_P);
    job.c = pc;
    pd_push_ok(pc, 100, 0, 4, false); /* a streamed request under way */
    /* the next push starts, waits on the decoder, and the decoder dies */
    kvf_fc_agent_pause(&g_fc, PD_D, true);
    cr_assert_eq(pthread_create(&th, NULL, pd_push_thread, &job), 0);
    poll(NULL, 0, 300); /* fault timing: the push is under way */
    kvf_fc_agent_kill(&g_fc, PD_D);
    pthread_join(th, NULL);
    pd_check_push_failed(&job);
    /* the engine still connected: the prefill agent holds nothing for the
     * dead push (its sends done, the engine's slots released) */
    cr_assert(kvf_fc_wait_quiet(&g_fc, 10000), "%s", g_fc.why);
    kvf_client_disconnect(pc);
    cr_assert_eq(kvf_fc_agent_start(&g_fc, PD_D), 0, "%s", g_fc.why);
    pd_roundtrip(101);
    check_healed();
}

/* Layer groups of a request on their way at once when the decoder dies:
 * every one of them fails, within the push timeout, and the prefill agent
 * holds nothing after; the decoder back, layer pushes work again. */
Test(pd_faults, decoder_killed_during_layer_pushes)
{
    kvf_client_t *pc, *dc;
    uint64_t t0, took;
    kvf_status_t st;
    kvf_fc_pd_t res;

    SKIP_WITHOUT_NETNS();
    pc = pd_connect(PD_P);
    /* the decoder learned as one that takes pieces, then stopped */
    cr_assert_eq(kvf_fc_pd_push_layers(&g_fc, pc, 150, g_fc.agents[PD_D].name,
                                       4, 4, CHUNK, 0),
                 KVF_OK, "%s", g_fc.why);
    kvf_fc_agent_pause(&g_fc, PD_D, true);
    t0 = kvf_time_now_ns();
    {
        pd_job_t job = {.req = 151};
        pthread_t th;

        /* eight groups started, none answered; the decoder dies */
        job.c = pc;
        cr_assert_eq(pthread_create(&th, NULL, pd_layers_thread, &job), 0);
        poll(NULL, 0, 300); /* fault timing: the pushes are on their way */
        kvf_fc_agent_kill(&g_fc, PD_D);
        pthread_join(th, NULL);
        st   = job.status;
        took = job.took_ns;
    }
    cr_assert_neq(st, KVF_OK, "the layer pushes went through");
    cr_assert_lt(took, PD_PUSH_HANG_NS, "layer pushes took %llu ms: %s",
                 (unsigned long long)(took / KVF_NSEC_PER_MSEC), g_fc.why);
    cr_assert_lt(kvf_time_now_ns() - t0, PD_PUSH_HANG_NS + 1000000000ull);
    cr_assert(kvf_fc_wait_quiet(&g_fc, 10000), "%s", g_fc.why);
    cr_assert_eq(kvf_fc_agent_start(&g_fc, PD_D), 0, "%s", g_fc.why);
    cr_assert_eq(kvf_fc_pd_push_layers(&g_fc, pc, 152, g_fc.agents[PD_D].name,
                                       6, 6, CHUNK, 0),
                 KVF_OK, "%s", g_fc.why);
    dc = pd_connect(PD_D);
    kvf_fc_pd_receive(&g_fc, dc, 152, 6, CHUNK,
                      PD_WAIT_TMO_S * KVF_NSEC_PER_SEC, &res);
    cr_assert_eq(res.status, KVF_OK, "%s", g_fc.why);
    cr_assert_eq(res.wrong_bytes, 0);
    cr_assert_eq(res.got, 6);
    kvf_client_disconnect(pc);
    kvf_client_disconnect(dc);
    check_healed();
}

Test(pd_faults, prefill_agent_killed_mid_request)
{
    kvf_client_t *pc, *dc;
    pd_job_t job = {.req = 200, .n = 8};
    pthread_t th;

    SKIP_WITHOUT_NETNS();
    pc    = pd_connect(PD_P);
    dc    = pd_connect(PD_D);
    job.c = dc;
    pd_push_ok(pc, 200, 0, 4, false);
    cr_assert_eq(kvf_fc_metric(&g_fc, PD_D, PD_USED), 4 * CHUNK);
    /* the decode engine waits; the prefill agent dies before the final
     * push */
    cr_assert_eq(pthread_create(&th, NULL, pd_wait_thread, &job), 0);
    poll(NULL, 0, 200); /* fault timing: the wait is under way */
    kvf_fc_agent_kill(&g_fc, PD_P);
    pthread_join(th, NULL);
    cr_assert((job.res.status == KVF_ERR_CANCELED) ||
                  (job.res.status == KVF_ERR_TIMEOUT),
              "wait: %s", kvf_strerror(job.res.status));
    cr_assert_eq(job.res.num, 0, "a part of a dead request was handed out");
    cr_assert_lt(job.res.took_ns, PD_WAIT_HANG_NS, "wait took %llu ms",
                 (unsigned long long)(job.res.took_ns / KVF_NSEC_PER_MSEC));
    pd_wait_region_empty();
    kvf_client_disconnect(pc);
    kvf_client_disconnect(dc);
    cr_assert_eq(kvf_fc_agent_start(&g_fc, PD_P), 0, "%s", g_fc.why);
    pd_roundtrip(201);
    check_healed();
}

Test(pd_faults, link_down_during_push)
{
    const char *no_netem;
    kvf_client_t *pc, *dc;
    pd_job_t job = {.req = 300, .first = 4, .n = 4};
    kvf_fc_pd_t res;
    pthread_t th;

    SKIP_WITHOUT_NETNS();
    no_netem = kvf_fc_netem_unavailable();
    pc       = pd_connect(PD_P);
    dc       = pd_connect(PD_D);
    job.c    = pc;
    pd_push_ok(pc, 300, 0, 4, false);
    if (no_netem == NULL) {
        /* 100 ms on every packet the decoder sends: the push's round
         * trips (alloc, data, done) span the link going down */
        cr_assert_eq(kvf_fc_netem(&g_fc, PD_D, "delay 100ms"), 0, "%s",
                     g_fc.why);
        cr_assert_eq(pthread_create(&th, NULL, pd_push_thread, &job), 0);
        poll(NULL, 0, 150); /* fault timing: the push is under way */
        cr_assert_eq(kvf_fc_link(&g_fc, PD_D, false), 0, "%s", g_fc.why);
        pthread_join(th, NULL);
    } else {
        /* no netem to stretch the push: the link goes down between the
         * pushes of the request instead */
        cr_assert_eq(kvf_fc_link(&g_fc, PD_D, false), 0, "%s", g_fc.why);
        pd_push_thread(&job);
    }
    pd_check_push_failed(&job);
    cr_assert_eq(kvf_fc_link(&g_fc, PD_D, true), 0, "%s", g_fc.why);
    if (no_netem == NULL) {
        cr_assert_eq(kvf_fc_netem(&g_fc, PD_D, "off"), 0, "%s", g_fc.why);
    }
    /* the decoder dropped the broken request: a wait fails, nothing is
     * handed out, its region empties */
    kvf_fc_pd_receive(&g_fc, dc, 300, 8, CHUNK,
                      PD_WAIT_TMO_S * KVF_NSEC_PER_SEC, &res);
    cr_assert_neq(res.status, KVF_OK);
    cr_assert_eq(res.num, 0);
    pd_wait_region_empty();
    kvf_client_disconnect(pc);
    kvf_client_disconnect(dc);
    /* it may have been declared dead meanwhile: it registers again */
    cr_assert(kvf_fc_agent_wait_registered(&g_fc, PD_D, 20000), "%s", g_fc.why);
    pd_roundtrip(301);
    check_healed();
}

Test(pd_faults, stopped_decoder_times_out_the_push)
{
    kvf_client_t *pc, *dc;
    pd_job_t job = {.req = 400, .n = 4};

    SKIP_WITHOUT_NETNS();
    pc    = pd_connect(PD_P);
    dc    = pd_connect(PD_D); /* connected before it stops */
    job.c = pc;
    kvf_fc_agent_pause(&g_fc, PD_D, true); /* a decoder that stops answering */
    pd_push_thread(&job);
    kvf_fc_agent_pause(&g_fc, PD_D, false);
    pd_check_push_failed(&job);
    cr_assert_eq(job.status, KVF_ERR_TIMEOUT, "%s", g_fc.why);
    cr_assert(kvf_fc_agent_wait_registered(&g_fc, PD_D, 20000), "%s", g_fc.why);
    pd_wait_region_empty();
    /* the next request works, through the same decode engine connection */
    pd_push_ok(pc, 401, 0, 4, true);
    pd_receive_ok(dc, 401, 4);
    kvf_client_disconnect(pc);
    kvf_client_disconnect(dc);
    check_healed();
}
