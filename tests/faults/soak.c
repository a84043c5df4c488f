/* SPDX-License-Identifier: Apache-2.0 */
/* Copyright (c) 2026 The kvfabric authors */
/*
 * kvf-soak: a bounded mixed workload with random faults against a
 * controller and three agents on loopback (fcluster.h), ending with one
 * JSON line:
 *
 *   {"soak_s":…,"requests":…,"pd_requests":…,"pd_delivered":…,"faults":…,
 *    "wrong_bytes":0,"hangs":0,"rss_growth_bytes":…,"anon_growth_bytes":…}
 *
 * Workload (a thread): stores of new prefixes through a random agent,
 * lookups + retrieves of known prefixes through a random agent (local
 * and remote, with and without prefetch), and PD requests (every agent is
 * role both, with a receive region): a prefill engine on one agent
 * streams 2-8 chunks in 1-3 pushes to another agent (for half of the
 * requests started at once, as layer groups: kvf_pd_push_start, then
 * kvf_pd_push_wait), whose decode engine
 * then waits for the request and releases it. Every byte handed out to
 * an engine is compared with the pattern of its key or PD chunk; a PD
 * request whose push failed is still waited for (briefly): if it is
 * delivered anyway it must be whole and exact. Faults (main thread, every 2-4
 * s): kill -9 and restart of agent 1 or 2, SIGSTOP of any agent for 1.5 s, kill
 * -9 and restart of the controller. Agents 1 and 2 keep a disk tier (128
 * MiB each, its file kept across their restarts). Agent 0 is never killed: its
 * RSS from the end of the warm-up to the end is rss_growth_bytes, which counts
 * pages of its pool and receive region (shared memory) touched for the first
 * time too; anon_growth_bytes is its private memory's (RssAnon), what a leak
 * grows.
 *
 * A hang is a store or retrieve that returned KVF_ERR_TIMEOUT (the
 * engine's 20 s timeout) or took longer than fetch_timeout + 10 s, a PD
 * push that took longer than pd_push_timeout + 10 s, or a PD wait longer
 * than its timeout + 10 s (a PD KVF_ERR_TIMEOUT is the agent's own
 * verdict, not a hang). At the end every agent must be registered, the
 * registry must equal the agents' inventories and no grant, pin or PD
 * region byte may be left. Exit 1 when wrong_bytes or
 * hangs is not 0 or the end checks fail.
 *
 * SOAK_SECONDS (default 600) sets the length, SOAK_SEED the random seed,
 * SOAK_LOG_LEVEL the agents' log level (default warn); SOAK_FAULTS=0 runs
 * the workload without faults (a baseline).
 * Needs KVF_BUILD_ROOT and KVF_SOURCE_ROOT (make soak sets them).
 */
#include "common/time.h"
#include "tests/faults/fcluster.h"
#include "tools/bench/bench.h"

#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define SOAK_AGENTS   3
#define SOAK_PREFIXES 512
#define SOAK_MAX_N    8
#define SOAK_RECENT   24
#define SOAK_HANG_NS  (12 * KVF_NSEC_PER_SEC) /* fetch_timeout 2 s + 10 s */
#define SOAK_PD_PUSH_HANG_NS \
    (13 * KVF_NSEC_PER_SEC)                       /* pd_push_timeout + 10 s */
#define SOAK_PD_WAIT_NS (4 * KVF_NSEC_PER_SEC)    /* a complete request */
#define SOAK_PD_LATE_NS (500 * KVF_NSEC_PER_MSEC) /* after a failed push */

typedef struct soak_prefix {
    uint64_t seed;
    uint32_t n;
    size_t len;
} soak_prefix_t;

typedef struct soak {
    kvf_fc_t fc;
    uint64_t end_ns;
    uint64_t warm_ns; /* RSS baseline taken then */
    uint64_t rss0;
    uint64_t anon0;
    unsigned int work_seed;
    bool is_quiet; /* SOAK_FAULTS=0: the workload alone, as a baseline */
    atomic_bool is_down[SOAK_AGENTS]; /* killed or stopped: no engine */
    atomic_uint_fast64_t faults;
    uint64_t requests;
    uint64_t pd_requests;  /* PD requests started */
    uint64_t pd_delivered; /* received whole and byte-exact */
    uint64_t pd_next;      /* request id */
    uint64_t wrong_bytes;
    uint64_t hangs;
    uint64_t misses;
    uint64_t verified; /* chunks handed out and compared byte for byte */
    uint64_t errors;
    unsigned int fault_seed;
    soak_prefix_t prefixes[SOAK_PREFIXES];
    uint32_t num_prefixes;
} soak_t;

/* Sleeps up to @p ms, less when the soak ends first. */
static void soak_nap(soak_t *s, int ms)
{
    uint64_t deadline = kvf_time_deadline_ns((uint64_t)ms * KVF_NSEC_PER_MSEC);

    while (!kvf_time_expired(deadline) && !kvf_time_expired(s->end_ns)) {
        usleep(20000);
    }
}

/* Runs on the main thread: a child's PR_SET_PDEATHSIG fires when the
 * thread that forked it ends, so every process is started here. */
static void soak_faults(soak_t *s)
{
    while (!kvf_time_expired(s->end_ns)) {
        int kind = rand_r(&s->fault_seed) % 4, i;

        soak_nap(s, 2000 + rand_r(&s->fault_seed) % 2000);
        if (kvf_time_expired(s->end_ns) || s->is_quiet) {
            break;
        }
        switch (kind) {
        case 0: /* kill -9 of an agent (never agent 0), then restart */
        case 1:
            i = 1 + rand_r(&s->fault_seed) % (SOAK_AGENTS - 1);
            atomic_store(&s->is_down[i], true);
            kvf_fc_agent_kill(&s->fc, i);
            if (kvf_fc_agent_start(&s->fc, i) != 0) {
                fprintf(stderr, "soak: restart failed: %s\n", s->fc.why);
            }
            atomic_store(&s->is_down[i], false);
            break;
        case 2: /* a holder stops answering for 1.5 s */
            i = rand_r(&s->fault_seed) % SOAK_AGENTS;
            atomic_store(&s->is_down[i], true);
            kvf_fc_agent_pause(&s->fc, i, true);
            soak_nap(s, 1500);
            kvf_fc_agent_pause(&s->fc, i, false);
            atomic_store(&s->is_down[i], false);
            break;
        default: /* controller kill -9 and restart */
            kvf_fc_ctl_kill(&s->fc);
            if (kvf_fc_ctl_start(&s->fc) != 0) {
                fprintf(stderr, "soak: controller restart failed: %s\n",
                        s->fc.why);
            }
            break;
        }
        atomic_fetch_add(&s->faults, 1);
    }
}

/* A random agent an engine can use now; -1 when none. */
static int soak_pick_agent(soak_t *s, unsigned int *seed)
{
    int i = rand_r(seed) % SOAK_AGENTS, k;

    for (k = 0; k < SOAK_AGENTS; k++, i = (i + 1) % SOAK_AGENTS) {
        if (!atomic_load(&s->is_down[i])) {
            return i;
        }
    }
    return -1;
}

/* A PD wait that took past its timeout + 10 s is a hang; what it handed
 * out must be the whole request, byte for byte. */
static void soak_pd_check(soak_t *s, uint64_t req, uint32_t n, size_t len,
                          uint64_t timeout_ns, const kvf_fc_pd_t *res)
{
    if (res->took_ns > timeout_ns + 10 * KVF_NSEC_PER_SEC) {
        fprintf(stderr, "soak: pd wait %llu hung: %llu ms, %s\n",
                (unsigned long long)req,
                (unsigned long long)(res->took_ns / KVF_NSEC_PER_MSEC),
                kvf_strerror(res->status));
        s->hangs++;
    }
    if (res->status != KVF_OK) {
        return;
    }
    s->wrong_bytes += res->wrong_bytes;
    if (res->num < n) { /* a partial request handed out as complete */
        s->wrong_bytes += (uint64_t)(n - res->num) * len;
    }
    if ((res->wrong_bytes != 0) || (res->num != n)) {
        fprintf(stderr,
                "soak: pd request %llu: %u of %u chunks, %llu wrong bytes\n",
                (unsigned long long)req, res->num, n,
                (unsigned long long)res->wrong_bytes);
    }
    s->verified += res->got;
}

/* A PD push call that began at @p t0 and took past pd_push_timeout + 10 s
 * is a hang. */
static void soak_pd_hang_check(soak_t *s, uint64_t req, const char *what,
                               uint64_t t0, kvf_status_t st)
{
    uint64_t took = kvf_time_now_ns() - t0;

    if (took > SOAK_PD_PUSH_HANG_NS) {
        fprintf(stderr, "soak: pd %s %llu hung: %llu ms, %s\n", what,
                (unsigned long long)req,
                (unsigned long long)(took / KVF_NSEC_PER_MSEC),
                kvf_strerror(st));
        s->hangs++;
    }
}

/* One PD request from agent @p p's prefill engine to agent @p d. */
static void soak_pd(soak_t *s, unsigned int *seed, int p, int d)
{
    uint32_t n = 2 + rand_r(seed) % 7, parts = 1 + rand_r(seed) % 3, sent = 0;
    size_t len       = (size_t)(64u << 10) << (rand_r(seed) % 2);
    uint64_t req     = ++s->pd_next, t0;
    kvf_client_t *pc = NULL, *dc = NULL;
    kvf_status_t st = KVF_OK;
    kvf_fc_pd_t res;
    uint32_t k;

    s->pd_requests++;
    if (parts > n) {
        parts = n; /* every push carries a chunk at least */
    }
    if ((kvf_fc_connect(&s->fc, p, &pc) != KVF_OK) ||
        (kvf_fc_connect(&s->fc, d, &dc) != KVF_OK)) {
        s->errors++;
        goto out;
    }
    if (rand_r(seed) % 2 == 0) {
        /* layer groups started without waiting for each other */
        t0 = kvf_time_now_ns();
        st = kvf_fc_pd_push_layers(&s->fc, pc, req, s->fc.agents[d].name, n,
                                   parts, len, 0);
        soak_pd_hang_check(s, req, "layer pushes", t0, st);
    } else {
        for (k = 0; (k < parts) && (st == KVF_OK); k++) {
            uint32_t m = (k + 1 == parts) ? n - sent : (n - sent) / (parts - k);

            t0 = kvf_time_now_ns();
            st = kvf_fc_pd_push(&s->fc, pc, req, s->fc.agents[d].name, sent, m,
                                len, k + 1 == parts);
            soak_pd_hang_check(s, req, "push", t0, st);
            sent += m;
        }
    }
    if (st != KVF_OK) {
        s->errors++;
        if (s->is_quiet) { /* no fault to blame */
            fprintf(stderr, "soak: %s\n", s->fc.why);
        }
    }
    /* after a failed push the request may still have been delivered (the
     * last reply lost): then it must be whole; mostly it was aborted */
    kvf_fc_pd_receive(&s->fc, dc, req, n, len,
                      (st == KVF_OK) ? SOAK_PD_WAIT_NS : SOAK_PD_LATE_NS, &res);
    soak_pd_check(s, req, n, len,
                  (st == KVF_OK) ? SOAK_PD_WAIT_NS : SOAK_PD_LATE_NS, &res);
    if (res.status == KVF_OK) {
        s->pd_delivered += (res.got == n);
    } else if (st == KVF_OK) {
        s->errors++;
    }
out:
    kvf_client_disconnect(pc);
    kvf_client_disconnect(dc);
}

static void soak_step(soak_t *s, unsigned int *seed)
{
    int agent     = soak_pick_agent(s, seed);
    bool is_store = (s->num_prefixes < 8) || ((rand_r(seed) % 10) == 0);
    kvf_key_t keys[SOAK_MAX_N];
    soak_prefix_t *p;
    kvf_fc_fetch_t res;
    kvf_status_t st;
    uint64_t t0;

    int decoder;

    if (agent < 0) {
        usleep(10000);
        return;
    }
    if (!is_store && ((rand_r(seed) % 8) == 0)) {
        decoder = (agent + 1 + rand_r(seed) % (SOAK_AGENTS - 1)) % SOAK_AGENTS;
        if (!atomic_load(&s->is_down[decoder])) {
            soak_pd(s, seed, agent, decoder);
            return;
        }
    }
    if (is_store) {
        p       = &s->prefixes[s->num_prefixes % SOAK_PREFIXES];
        p->seed = 1000 + s->num_prefixes;
        p->n    = 2 + rand_r(seed) % (SOAK_MAX_N - 1);
        p->len  = (size_t)(64u << 10) << (rand_r(seed) % 3);
        kvf_fc_keys(p->seed, keys, p->n);
        t0 = kvf_time_now_ns();
        st = kvf_fc_store(&s->fc, agent, keys, p->n, p->len);
        s->requests++;
        if ((st == KVF_ERR_TIMEOUT) ||
            (kvf_time_now_ns() - t0 > SOAK_HANG_NS)) {
            fprintf(stderr, "soak: store hung (%s)\n", s->fc.why);
            s->hangs++;
        }
        if ((st == KVF_OK) || (st == KVF_ERR_EXISTS)) {
            s->num_prefixes++;
        } else {
            s->errors++;
        }
        return;
    }
    p = &s->prefixes[rand_r(seed) % ((s->num_prefixes < SOAK_PREFIXES)
                                         ? s->num_prefixes
                                         : SOAK_PREFIXES)];
    kvf_fc_keys(p->seed, keys, p->n);
    kvf_fc_retrieve(&s->fc, agent, keys, p->n, p->len, (rand_r(seed) & 1) != 0,
                    &res);
    s->requests++;
    s->wrong_bytes += res.wrong_bytes;
    s->misses += res.missing;
    s->verified += res.got;
    if (res.wrong_bytes != 0) {
        fprintf(stderr, "soak: %llu wrong bytes via agent %d\n",
                (unsigned long long)res.wrong_bytes, agent);
    }
    if ((res.status == KVF_ERR_TIMEOUT) || (res.took_ns > SOAK_HANG_NS)) {
        fprintf(stderr, "soak: retrieve via agent %d hung: %llu ms, %s\n",
                agent, (unsigned long long)(res.took_ns / KVF_NSEC_PER_MSEC),
                kvf_strerror(res.status));
        s->hangs++;
    } else if (res.status != KVF_OK) {
        s->errors++;
    }
}

static void soak_print_log(const kvf_test_proc_t *proc)
{
    char cmd[512];

    snprintf(cmd, sizeof(cmd), "grep -v ' engine ' '%s' | tail -n 60 >&2",
             proc->log_path);
    if (system(cmd) != 0) {
        fprintf(stderr, "soak: cannot read %s\n", proc->log_path);
    }
}

static void *soak_workload(void *arg)
{
    soak_t *s    = arg;
    bool is_warm = false;

    while (!kvf_time_expired(s->end_ns)) {
        if (!is_warm && kvf_time_expired(s->warm_ns)) {
            s->rss0 = kvf_bench_pid_rss(s->fc.agents[0].proc.pid);
            s->anon0 =
                kvf_bench_pid_status(s->fc.agents[0].proc.pid, "RssAnon");
            is_warm = true;
        }
        soak_step(s, &s->work_seed);
    }
    return NULL;
}

/* After the faults: everyone back, registry converged, nothing leaked. */
static bool soak_check_end(soak_t *s)
{
    int i;

    for (i = 0; i < SOAK_AGENTS; i++) {
        kvf_fc_agent_pause(&s->fc, i, false);
        if (!kvf_fc_agent_wait_registered(&s->fc, i, 30000)) {
            fprintf(stderr,
                    "soak: agent %s did not register again; its "
                    "log, engine lines left out:\n",
                    s->fc.agents[i].name);
            soak_print_log(&s->fc.agents[i].proc);
            return false;
        }
    }
    if (!kvf_fc_responsive(&s->fc) || !kvf_fc_wait_converged(&s->fc, 30000) ||
        !kvf_fc_wait_quiet(&s->fc, 30000)) {
        fprintf(stderr, "soak: end check: %s\n", s->fc.why);
        return false;
    }
    return true;
}

int main(void)
{
    kvf_fc_params_t params = {.num_agents     = SOAK_AGENTS,
                              .is_netns       = false,
                              .pool_size      = "64M",
                              .fetch_tmo      = "2s",
                              .lease          = "2s",
                              .max_chunk      = "1M",
                              .client_tmo_ns  = 20 * KVF_NSEC_PER_SEC,
                              .log_level      = "warn",
                              .pd_buffer_size = "16M",
                              .pd_push_tmo    = "3s",
                              .pd_alloc_tmo   = "2s",
                              .pd_claim_tmo   = "5s",
                              /* the agents that are killed keep a disk
                               * tier: chunks the pool evicts are read
                               * back, and each restart re-admits what it
                               * finds there */
                              .disk_size = {NULL, "128M", "128M"}};
    const char *env        = getenv("SOAK_SECONDS");
    double seconds         = (env != NULL) ? atof(env) : 600.0;
    unsigned int seed      = (getenv("SOAK_SEED") != NULL)
                                 ? (unsigned int)atoi(getenv("SOAK_SEED"))
                                 : (unsigned int)getpid();
    uint64_t t0, rss1, anon1;
    bool is_ok;
    int i;
    pthread_t workload;
    static soak_t s;

    if (seconds <= 0) {
        fprintf(stderr, "soak: SOAK_SECONDS must be > 0\n");
        return 2;
    }
    if (getenv("SOAK_LOG_LEVEL") != NULL) {
        params.log_level = getenv("SOAK_LOG_LEVEL");
    }
    /* under ASan, freed memory waits in a quarantine (256 MB by default)
     * that would read as RSS growth: keep it small for the children */
    if (getenv("ASAN_OPTIONS") != NULL) {
        static char asan[1024];

        snprintf(asan, sizeof(asan), "%s:quarantine_size_mb=8",
                 getenv("ASAN_OPTIONS"));
        setenv("ASAN_OPTIONS", asan, 1);
    }
    s.is_quiet = (getenv("SOAK_FAULTS") != NULL) &&
                 (strcmp(getenv("SOAK_FAULTS"), "0") == 0);
    signal(SIGPIPE, SIG_IGN);
    s.fault_seed = seed * 7919u + 1;
    fprintf(stderr, "soak: %.0f s, seed %u\n", seconds, seed);
    if (kvf_fc_create(&s.fc, &params) != 0) {
        fprintf(stderr, "soak: cannot start the cluster: %s\n", s.fc.why);
        kvf_fc_destroy(&s.fc);
        return 1;
    }
    t0       = kvf_time_now_ns();
    s.end_ns = t0 + (uint64_t)(seconds * 1e9);
    /* warm-up: a tenth of the run, at most 30 s, before RSS is taken */
    s.warm_ns = t0 + (uint64_t)((seconds / 10 < 30 ? seconds / 10 : 30) * 1e9);
    s.work_seed = seed;
    if (pthread_create(&workload, NULL, soak_workload, &s) != 0) {
        fprintf(stderr, "soak: cannot start the workload thread\n");
        kvf_fc_destroy(&s.fc);
        return 1;
    }
    soak_faults(&s);
    pthread_join(workload, NULL);
    rss1  = kvf_bench_pid_rss(s.fc.agents[0].proc.pid);
    anon1 = kvf_bench_pid_status(s.fc.agents[0].proc.pid, "RssAnon");
    is_ok = soak_check_end(&s);
    printf("{\"soak_s\":%.1f,\"requests\":%llu,\"pd_requests\":%llu,"
           "\"pd_delivered\":%llu,\"faults\":%llu,"
           "\"wrong_bytes\":%llu,\"hangs\":%llu,\"rss_growth_bytes\":%lld,"
           "\"anon_growth_bytes\":%lld}\n",
           (double)(kvf_time_now_ns() - t0) / 1e9,
           (unsigned long long)(s.requests + s.pd_requests),
           (unsigned long long)s.pd_requests,
           (unsigned long long)s.pd_delivered,
           (unsigned long long)atomic_load(&s.faults),
           (unsigned long long)s.wrong_bytes, (unsigned long long)s.hangs,
           (long long)(rss1 - s.rss0), (long long)(anon1 - s.anon0));
    fprintf(stderr,
            "soak: %llu chunks verified byte for byte, %llu chunk misses, "
            "%llu failed calls (faults), %u prefixes stored\n",
            (unsigned long long)s.verified, (unsigned long long)s.misses,
            (unsigned long long)s.errors, s.num_prefixes);
    for (i = 1; i < SOAK_AGENTS; i++) {
        fprintf(stderr,
                "soak: agent %d's disk tier since its last start: %lld "
                "chunks written, %lld read back, %lld found at start\n",
                i, kvf_fc_metric(&s.fc, i, "kvf_agent_disk_writes_total"),
                kvf_fc_metric(&s.fc, i, "kvf_agent_disk_reads_total"),
                kvf_fc_metric(&s.fc, i, "kvf_agent_disk_recovered_chunks"));
    }
    fflush(stdout);
    kvf_fc_destroy(&s.fc);
    return (is_ok && (s.wrong_bytes == 0) && (s.hangs == 0)) ? 0 : 1;
}
