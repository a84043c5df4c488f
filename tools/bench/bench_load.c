/* SPDX-License-Identifier: Apache-2.0 */
/* Copyright (c) 2026 The kvfabric authors */
/*
 * kvf-bench load-agent / load-controller: many clients at once.
 *
 *   kvf-bench load-agent [--clients 64] [--seconds 5] [--chunk-size 65536]
 *                        [--batch 4] [--hits-only 0|1]
 *     starts a controller and one agent; each client is a thread with its
 *     own engine connection doing alloc, commit, lookup, retrieve (every
 *     byte checked against its checksum) and release, batch chunks a call.
 *     With --hits-only 1 each client stores its first 4 rounds and then
 *     only looks up, retrieves and releases them: the pool-hit path alone,
 *     with no eviction (the agent's environment, KVF_DISK_PATH included,
 *     is passed on).
 *
 *   kvf-bench load-controller [--agents 200] [--seconds 5] [--threads 4]
 *                             [--batch 64] [--controller HOST:PORT]
 *     starts a controller (unless given one); each simulated agent is a
 *     controller connection (client/ctlconn.c) that registers, then
 *     heartbeats once a second and sends ADMIT, LOOKUP and EVICT batches;
 *     the agents are spread over T threads. At the end NODE_INFO must list
 *     every simulated agent alive.
 *
 * One JSON line each: calls per second and p50/p99/p999 latency per call.
 */
#include "tools/bench/bench.h"

#include "common/time.h"
#include "client/ctlconn.h"

#include <kvfabric/kvfabric.h>

#include <inttypes.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define KVF_BENCH_LOAD_MAX_BATCH 256

/* Latency samples of one call type. */
typedef struct kvf_bench_lat {
    uint64_t *ns;
    size_t num;
    size_t cap;
} kvf_bench_lat_t;

static void kvf_bench_lat_add(kvf_bench_lat_t *l, uint64_t ns)
{
    if (l->num == l->cap) {
        size_t cap  = (l->cap == 0) ? 4096 : l->cap * 2;
        uint64_t *p = realloc(l->ns, cap * sizeof(*p));

        if (p == NULL) {
            return;
        }
        l->ns  = p;
        l->cap = cap;
    }
    l->ns[l->num++] = ns;
}

/* Moves @p from's samples into @p to. */
static void kvf_bench_lat_merge(kvf_bench_lat_t *to, kvf_bench_lat_t *from)
{
    size_t i;

    for (i = 0; i < from->num; i++) {
        kvf_bench_lat_add(to, from->ns[i]);
    }
    free(from->ns);
    memset(from, 0, sizeof(*from));
}

/* ,"NAME":{"calls_per_s":…,"p50_us":…,"p99_us":…,"p999_us":…} */
static void kvf_bench_lat_print(const char *name, kvf_bench_lat_t *l,
                                double seconds)
{
    double p50  = (double)kvf_bench_percentile(l->ns, l->num, 50) / 1e3;
    double p99  = (double)kvf_bench_percentile(l->ns, l->num, 99) / 1e3;
    double p999 = (double)kvf_bench_percentile(l->ns, l->num, 99.9) / 1e3;

    printf(",\"%s\":{\"calls_per_s\":%.0f,\"p50_us\":%.1f,\"p99_us\":%.1f,"
           "\"p999_us\":%.1f}",
           name, (double)l->num / seconds, p50, p99, p999);
    free(l->ns);
    memset(l, 0, sizeof(*l));
}

/* Flags: --NAME VALUE pairs into @p vals (same order as @p names). */
static int kvf_bench_load_parse(int argc, char **argv, const char *const *names,
                                const char **vals, int num, const char *usage)
{
    int i, k;

    for (i = 1; i < argc; i++) {
        if ((strcmp(argv[i], "--help") == 0) || (strcmp(argv[i], "-h") == 0)) {
            printf("%s", usage);
            return 1;
        }
        for (k = 0; k < num; k++) {
            if ((strncmp(argv[i], "--", 2) == 0) &&
                (strcmp(argv[i] + 2, names[k]) == 0) && (i + 1 < argc)) {
                vals[k] = argv[++i];
                break;
            }
        }
        if (k == num) {
            fprintf(stderr, "kvf-bench: unknown argument '%s'\n%s", argv[i],
                    usage);
            return 2;
        }
    }
    return 0;
}

static void kvf_bench_load_stop(pid_t *pids, int n)
{
    int i;

    for (i = n - 1; i >= 0; i--) {
        if (pids[i] > 0) {
            kill(pids[i], SIGTERM);
            waitpid(pids[i], NULL, 0);
        }
    }
}

/* Starts kvf-controller on a free loopback port; its address into @p addr. */
static pid_t kvf_bench_load_controller_spawn(const char *dir, char *addr,
                                             size_t len)
{
    char bin[PATH_MAX + 64], log[PATH_MAX];
    const char *argv[] = {
        bin, "--listen", addr, "--http", "", "--recovery-window",
        "0", "--lease",  "5s", NULL};
    uint64_t deadline = kvf_time_deadline_ns(20 * KVF_NSEC_PER_SEC);
    kvf_ctlconn_t *conn;
    char err[256];
    pid_t pid;

    kvf_bench_sibling_path("controller/kvf-controller", bin, sizeof(bin));
    snprintf(addr, len, "127.0.0.1:%u", kvf_bench_free_port());
    snprintf(log, sizeof(log), "%s/controller.log", dir);
    pid = kvf_bench_spawn(argv, log);
    while (kvf_ctlconn_create(addr, KVF__PEER_KIND__PEER_ADMIN, "bench",
                              KVF_PROTOCOL_VERSION, 1000, &conn, err,
                              sizeof(err)) != KVF_OK) {
        if ((pid < 0) || kvf_time_expired(deadline)) {
            fprintf(stderr, "kvf-bench: controller did not start (%s)\n", log);
            kvf_bench_load_stop(&pid, 1);
            return -1;
        }
        poll(NULL, 0, 20);
    }
    kvf_ctlconn_destroy(conn);
    return pid;
}

/* ------------------------------------------------------------ load-agent */

enum {
    KVF_BENCH_LA_ALLOC,
    KVF_BENCH_LA_COMMIT,
    KVF_BENCH_LA_LOOKUP,
    KVF_BENCH_LA_RETRIEVE,
    KVF_BENCH_LA_RELEASE,
    KVF_BENCH_LA_CALLS,
};

static const char *const kvf_bench_la_names[KVF_BENCH_LA_CALLS] = {
    "alloc", "commit", "lookup", "retrieve", "release"};

typedef struct kvf_bench_la_client {
    const char *sock;
    uint32_t index;
    uint32_t batch;
    uint64_t chunk;
    uint64_t end_ns;
    bool hits_only;
    uint64_t kept_sums[4][KVF_BENCH_LOAD_MAX_BATCH]; /* hits_only */
    atomic_bool *is_started;
    uint64_t iterations;
    uint64_t errors;
    uint64_t wrong;
    kvf_bench_lat_t lat[KVF_BENCH_LA_CALLS];
    char err[256];
} kvf_bench_la_client_t;

/* One round: alloc, write, commit, lookup, retrieve + check, release
 * (hits_only: the store only in the first 4 rounds, then their keys
 * again). */
static int kvf_bench_la_round(kvf_bench_la_client_t *c, kvf_client_t *client,
                              uint64_t iter)
{
    kvf_slot_t slots[KVF_BENCH_LOAD_MAX_BATCH];
    uint64_t *sums = c->kept_sums[iter % 4];
    kvf_key_t keys[KVF_BENCH_LOAD_MAX_BATCH];
    bool missing[KVF_BENCH_LOAD_MAX_BATCH];
    uint8_t *base  = kvf_client_pool_base(client);
    uint64_t round = c->hits_only ? iter % 4 : iter;
    kvf_lookup_result_t res;
    uint64_t t;
    uint32_t k;

    for (k = 0; k < c->batch; k++) {
        keys[k].ns = 0x6c6f6164;
        keys[k].hi = c->index;
        keys[k].lo = round * c->batch + k;
    }
    if (c->hits_only && (iter >= 4)) {
        goto read;
    }
    t = kvf_time_now_ns();
    if (kvf_client_alloc(client, c->chunk, c->batch, slots) != KVF_OK) {
        return -1;
    }
    kvf_bench_lat_add(&c->lat[KVF_BENCH_LA_ALLOC], kvf_time_now_ns() - t);
    for (k = 0; k < c->batch; k++) {
        /* the head of each chunk names its key; the checksum covers all */
        memcpy(base + slots[k].offset, &keys[k], sizeof(keys[k]));
        sums[k] = kvf_chunk_checksum(base + slots[k].offset, c->chunk);
    }
    t = kvf_time_now_ns();
    if (kvf_client_commit(client, keys, slots, sums, c->batch) != KVF_OK) {
        return -1;
    }
    kvf_bench_lat_add(&c->lat[KVF_BENCH_LA_COMMIT], kvf_time_now_ns() - t);
read:
    t = kvf_time_now_ns();
    if (kvf_client_lookup(client, keys, c->batch, false, &res) != KVF_OK) {
        return -1;
    }
    kvf_bench_lat_add(&c->lat[KVF_BENCH_LA_LOOKUP], kvf_time_now_ns() - t);
    t = kvf_time_now_ns();
    if (kvf_client_retrieve(client, keys, c->batch, slots, missing) != KVF_OK) {
        return -1;
    }
    kvf_bench_lat_add(&c->lat[KVF_BENCH_LA_RETRIEVE], kvf_time_now_ns() - t);
    for (k = 0; k < c->batch; k++) {
        const uint8_t *p = base + slots[k].offset;

        if (missing[k]) {
            c->errors++; /* evicted before it was read: pool too small */
            continue;
        }
        if ((slots[k].length != c->chunk) ||
            (memcmp(p, &keys[k], sizeof(keys[k])) != 0) ||
            (kvf_chunk_checksum(p, c->chunk) != sums[k])) {
            c->wrong++;
        }
        t = kvf_time_now_ns();
        if (kvf_client_release(client, &slots[k], 1) != KVF_OK) {
            return -1;
        }
        kvf_bench_lat_add(&c->lat[KVF_BENCH_LA_RELEASE], kvf_time_now_ns() - t);
    }
    return 0;
}

static void *kvf_bench_la_client_main(void *arg)
{
    kvf_bench_la_client_t *c = arg;
    kvf_client_params_t p    = {.field_mask = KVF_CLIENT_PARAM_SOCKET |
                                              KVF_CLIENT_PARAM_TIMEOUT,
                                .socket_path = c->sock,
                                .timeout_ns  = 30 * KVF_NSEC_PER_SEC};
    kvf_client_t *client     = NULL;
    uint64_t iter            = 0;

    if (kvf_client_connect(&p, &client) != KVF_OK) {
        snprintf(c->err, sizeof(c->err), "client %u cannot connect", c->index);
        c->errors++;
        return NULL;
    }
    while (!atomic_load(c->is_started)) {
        poll(NULL, 0, 1);
    }
    while (!kvf_time_expired(c->end_ns)) {
        if (kvf_bench_la_round(c, client, iter++) != 0) {
            snprintf(c->err, sizeof(c->err), "client %u: %s", c->index,
                     kvf_client_last_error(client));
            c->errors++;
            break;
        }
        c->iterations++;
    }
    kvf_client_disconnect(client);
    return NULL;
}

int kvf_bench_load_agent_main(int argc, char **argv)
{
    static const char *const names[] = {"clients", "seconds", "chunk-size",
                                        "batch", "hits-only"};
    const char *vals[]               = {"64", "5", "65536", "4", "0"};
    char dir[]                       = "/tmp/kvf-bench-load-XXXXXX";
    char ctl[64], sock[PATH_MAX], log[PATH_MAX], agent_bin[PATH_MAX + 64];
    char pool[32], maxc[32], http[32];
    kvf_bench_lat_t all[KVF_BENCH_LA_CALLS];
    uint16_t http_port = kvf_bench_free_port();
    kvf_bench_la_client_t *cs;
    atomic_bool is_started = false;
    uint64_t iterations = 0, errors = 0, wrong = 0, chunk, pow2 = 4096, t0;
    uint32_t clients, batch, i, k;
    double seconds, took;
    bool hits_only;
    pthread_t *ths;
    pid_t pids[2] = {-1, -1};
    int rc;

    rc = kvf_bench_load_parse(argc, argv, names, vals, 5,
                              "usage: kvf-bench load-agent [--clients 64] "
                              "[--seconds 5] [--chunk-size 65536] "
                              "[--batch 4] [--hits-only 0|1]\n");
    if (rc != 0) {
        return (rc == 1) ? 0 : 2;
    }
    clients   = (uint32_t)strtoul(vals[0], NULL, 10);
    seconds   = atof(vals[1]);
    chunk     = strtoull(vals[2], NULL, 10);
    batch     = (uint32_t)strtoul(vals[3], NULL, 10);
    hits_only = strcmp(vals[4], "1") == 0;
    if ((clients == 0) || (clients > 4096) || (seconds <= 0) || (chunk < 64) ||
        (batch == 0) || (batch > KVF_BENCH_LOAD_MAX_BATCH)) {
        fprintf(stderr, "kvf-bench load-agent: bad arguments\n");
        return 2;
    }
    while (pow2 < chunk) {
        pow2 <<= 1;
    }
    /* every client's chunks of a round stay, with room for eviction */
    snprintf(pool, sizeof(pool), "%" PRIu64,
             pow2 * clients * batch * 4 + ((uint64_t)64 << 20));
    snprintf(maxc, sizeof(maxc), "%" PRIu64, pow2);
    /* the agent's /metrics: the disk tier's counters, when it has one */
    snprintf(http, sizeof(http), "127.0.0.1:%u", http_port);
    if (mkdtemp(dir) == NULL) {
        perror("mkdtemp");
        return 1;
    }
    pids[0] = kvf_bench_load_controller_spawn(dir, ctl, sizeof(ctl));
    if (pids[0] < 0) {
        return 1;
    }
    kvf_bench_sibling_path("agent/kvf-agent", agent_bin, sizeof(agent_bin));
    snprintf(sock, sizeof(sock), "%s/agent.sock", dir);
    snprintf(log, sizeof(log), "%s/agent.log", dir);
    {
        const char *aargv[] = {agent_bin,     "--controller", ctl,
                               "--name",      "load-agent",   "--socket",
                               sock,          "--listen",     "127.0.0.1:0",
                               "--http",      http,           "--pool-size",
                               pool,          "--max-chunk",  maxc,
                               "--log-level", "warn",         NULL};

        pids[1] = kvf_bench_spawn(aargv, log);
    }
    {
        kvf_client_t *probe = kvf_bench_connect(sock, 20 * KVF_NSEC_PER_SEC);

        if (probe == NULL) {
            fprintf(stderr, "kvf-bench load-agent: agent did not start (%s)\n",
                    log);
            kvf_bench_load_stop(pids, 2);
            return 1;
        }
        kvf_client_disconnect(probe);
    }
    cs  = calloc(clients, sizeof(*cs));
    ths = calloc(clients, sizeof(*ths));
    memset(all, 0, sizeof(all));
    if ((cs == NULL) || (ths == NULL)) {
        kvf_bench_load_stop(pids, 2);
        return 1;
    }
    fprintf(stderr, "kvf-bench load-agent: %u clients, %.1f s\n", clients,
            seconds);
    t0 = kvf_time_now_ns() + 2 * KVF_NSEC_PER_SEC; /* all connected by then */
    for (i = 0; i < clients; i++) {
        cs[i] = (kvf_bench_la_client_t){.sock       = sock,
                                        .index      = i,
                                        .batch      = batch,
                                        .chunk      = chunk,
                                        .end_ns     = 0,
                                        .hits_only  = hits_only,
                                        .is_started = &is_started};
        pthread_create(&ths[i], NULL, kvf_bench_la_client_main, &cs[i]);
    }
    while (!kvf_time_expired(t0)) {
        poll(NULL, 0, 10);
    }
    t0 = kvf_time_now_ns();
    for (i = 0; i < clients; i++) {
        cs[i].end_ns = t0 + (uint64_t)(seconds * 1e9);
    }
    atomic_store(&is_started, true);
    for (i = 0; i < clients; i++) {
        pthread_join(ths[i], NULL);
        iterations += cs[i].iterations;
        errors += cs[i].errors;
        wrong += cs[i].wrong;
        if (cs[i].err[0] != '\0') {
            fprintf(stderr, "kvf-bench load-agent: %s\n", cs[i].err);
        }
        for (k = 0; k < KVF_BENCH_LA_CALLS; k++) {
            kvf_bench_lat_merge(&all[k], &cs[i].lat[k]);
        }
    }
    took = (double)(kvf_time_now_ns() - t0) / 1e9;
    printf("{\"bench\":\"load-agent\",\"clients\":%u,\"seconds\":%.2f,"
           "\"hits_only\":%s,"
           "\"chunk_bytes\":%" PRIu64 ",\"batch\":%u,\"rounds\":%" PRIu64
           ",\"errors\":%" PRIu64 ",\"wrong_chunks\":%" PRIu64
           ",\"calls_per_s\":%.0f,\"chunks_per_s\":%.0f,"
           "\"agent_rss_bytes\":%" PRIu64,
           clients, took, hits_only ? "true" : "false", chunk, batch,
           iterations, errors, wrong, (double)iterations * (4 + batch) / took,
           (double)iterations * batch / took, kvf_bench_pid_rss(pids[1]));
    for (k = 0; k < KVF_BENCH_LA_CALLS; k++) {
        kvf_bench_lat_print(kvf_bench_la_names[k], &all[k], took);
    }
    if (kvf_bench_metric(http_port, "kvf_agent_disk_capacity_bytes") > 0) {
        /* KVF_DISK_PATH in the environment gave the agent a tier */
        printf(",\"disk\":{\"writes\":%.0f,\"write_copies\":%.0f,"
               "\"write_drops\":%.0f,\"write_bytes\":%.0f}",
               kvf_bench_metric(http_port, "kvf_agent_disk_writes_total"),
               kvf_bench_metric(http_port, "kvf_agent_disk_write_copies_total"),
               kvf_bench_metric(http_port, "kvf_agent_disk_write_drops_total"),
               kvf_bench_metric(http_port, "kvf_agent_disk_write_bytes_total"));
    }
    printf("}\n");
    fflush(stdout);
    free(cs);
    free(ths);
    kvf_bench_load_stop(pids, 2);
    /* the logs stay only when something failed */
    return kvf_bench_end(dir, ((errors == 0) && (wrong == 0)) ? 0 : 1);
}

/* ------------------------------------------------------- load-controller */

enum {
    KVF_BENCH_LC_REGISTER,
    KVF_BENCH_LC_HEARTBEAT,
    KVF_BENCH_LC_ADMIT,
    KVF_BENCH_LC_LOOKUP,
    KVF_BENCH_LC_EVICT,
    KVF_BENCH_LC_CALLS,
};

static const char *const kvf_bench_lc_names[KVF_BENCH_LC_CALLS] = {
    "register", "heartbeat", "admit", "lookup", "evict"};

typedef struct kvf_bench_lc_agent {
    kvf_ctlconn_t *conn;
    uint32_t node_id;
    uint64_t seq;
    uint64_t admitted; /* keys lo 0..admitted-1 sent in ADMIT */
    uint64_t evicted;  /* keys lo 0..evicted-1 sent in EVICT */
    uint64_t next_hb;
} kvf_bench_lc_agent_t;

typedef struct kvf_bench_lc_thread {
    const char *addr;
    kvf_bench_lc_agent_t *agents;
    uint32_t first;
    uint32_t num;
    uint32_t batch;
    uint32_t total;
    uint64_t end_ns;
    atomic_bool *is_started;
    uint64_t errors;
    kvf_bench_lat_t lat[KVF_BENCH_LC_CALLS];
    char err[256];
} kvf_bench_lc_thread_t;

/* One call; checks the reply type and status; records its latency. */
static int kvf_bench_lc_call(kvf_bench_lc_thread_t *t, kvf_ctlconn_t *conn,
                             int call, uint16_t type,
                             const ProtobufCMessage *msg, uint16_t want)
{
    uint64_t t0 = kvf_time_now_ns();
    kvf_frame_t frame;
    int32_t status = KVF_OK;
    kvf_status_t st;

    st = kvf_ctlconn_call(conn, type, msg, &frame);
    if (st != KVF_OK) {
        snprintf(t->err, sizeof(t->err), "%s: %s", kvf_bench_lc_names[call],
                 kvf_strerror(st));
        return -1;
    }
    if (frame.type == KVF_MSG_STATUS) {
        status = ((Kvf__Status *)frame.msg)->status;
    } else if (frame.type == KVF_MSG_HEARTBEAT_REPLY) {
        status = ((Kvf__HeartbeatReply *)frame.msg)->status;
    } else if (frame.type == KVF_MSG_LOOKUP_REPLY) {
        status = ((Kvf__LookupReply *)frame.msg)->status;
    }
    if ((frame.type != want) || (status != KVF_OK)) {
        snprintf(t->err, sizeof(t->err), "%s: reply %u status %d",
                 kvf_bench_lc_names[call], frame.type, (int)status);
        kvf_frame_release(&frame, NULL);
        return -1;
    }
    kvf_bench_lat_add(&t->lat[call], kvf_time_now_ns() - t0);
    kvf_frame_release(&frame, NULL);
    return 0;
}

static void kvf_bench_lc_keys(uint8_t *buf, uint32_t node, uint64_t first,
                              uint32_t n)
{
    uint32_t i;

    for (i = 0; i < n; i++) {
        kvf_key_t k = {.ns = 0x6c6f6164, .hi = node, .lo = first + i};

        kvf_key_pack(&k, buf + (size_t)i * KVF_KEY_WIRE_SIZE);
    }
}

static int kvf_bench_lc_register(kvf_bench_lc_thread_t *t, uint32_t i)
{
    kvf_bench_lc_agent_t *a = &t->agents[i];
    uint64_t t0             = kvf_time_now_ns();
    Kvf__Register reg;
    kvf_frame_t frame;
    char name[64];

    if (kvf_ctlconn_create(t->addr, KVF__PEER_KIND__PEER_AGENT, "load",
                           KVF_PROTOCOL_VERSION, 30000, &a->conn, t->err,
                           sizeof(t->err)) != KVF_OK) {
        return -1;
    }
    snprintf(name, sizeof(name), "load-%d-%u", (int)getpid(), i);
    kvf__register__init(&reg);
    reg.request_id  = 1;
    reg.name        = name;
    reg.incarnation = 1;
    if ((kvf_ctlconn_call(a->conn, KVF_MSG_REGISTER, &reg.base, &frame) !=
         KVF_OK) ||
        (frame.type != KVF_MSG_REGISTER_REPLY) ||
        (((Kvf__RegisterReply *)frame.msg)->status != KVF_OK)) {
        snprintf(t->err, sizeof(t->err), "register %s failed", name);
        kvf_frame_release(&frame, NULL);
        return -1;
    }
    a->node_id = ((Kvf__RegisterReply *)frame.msg)->node_id;
    kvf_frame_release(&frame, NULL);
    kvf_bench_lat_add(&t->lat[KVF_BENCH_LC_REGISTER], kvf_time_now_ns() - t0);
    return 0;
}

/* One step of simulated agent @p i: heartbeat when due, ADMIT a batch,
 * LOOKUP a chain held by another agent, every 4th step EVICT a batch. */
static int kvf_bench_lc_step(kvf_bench_lc_thread_t *t, uint32_t i, uint8_t *buf)
{
    kvf_bench_lc_agent_t *a = &t->agents[i];
    kvf_bench_lc_agent_t *o = &t->agents[(i + 1) % t->total];
    Kvf__Heartbeat hb;
    Kvf__KeyBatch kb;
    Kvf__Lookup lk;

    if (kvf_time_expired(a->next_hb)) {
        kvf__heartbeat__init(&hb);
        hb.request_id    = kvf_ctlconn_next_id(a->conn);
        hb.node_id       = a->node_id;
        hb.incarnation   = 1;
        hb.pool_capacity = 1ull << 30;
        hb.entries       = a->admitted - a->evicted;
        hb.last_seq      = a->seq;
        if (kvf_bench_lc_call(t, a->conn, KVF_BENCH_LC_HEARTBEAT,
                              KVF_MSG_HEARTBEAT, &hb.base,
                              KVF_MSG_HEARTBEAT_REPLY) != 0) {
            return -1;
        }
        a->next_hb = kvf_time_deadline_ns(KVF_NSEC_PER_SEC);
    }
    kvf__key_batch__init(&kb);
    kvf_bench_lc_keys(buf, a->node_id, a->admitted, t->batch);
    kb.request_id  = kvf_ctlconn_next_id(a->conn);
    kb.node_id     = a->node_id;
    kb.incarnation = 1;
    kb.seq         = ++a->seq;
    kb.keys.data   = buf;
    kb.keys.len    = (size_t)t->batch * KVF_KEY_WIRE_SIZE;
    if (kvf_bench_lc_call(t, a->conn, KVF_BENCH_LC_ADMIT, KVF_MSG_ADMIT,
                          &kb.base, KVF_MSG_STATUS) != 0) {
        return -1;
    }
    a->admitted += t->batch;
    /* a chain another simulated agent admitted (its node id and range;
     * it may lag: then the lookup is a miss, which costs the same) */
    kvf__lookup__init(&lk);
    kvf_bench_lc_keys(
        buf, o->node_id,
        (o->admitted > a->evicted + t->batch) ? o->admitted - t->batch : 0,
        t->batch);
    lk.request_id = kvf_ctlconn_next_id(a->conn);
    lk.requester  = a->node_id;
    lk.keys.data  = buf;
    lk.keys.len   = (size_t)t->batch * KVF_KEY_WIRE_SIZE;
    if (kvf_bench_lc_call(t, a->conn, KVF_BENCH_LC_LOOKUP, KVF_MSG_LOOKUP,
                          &lk.base, KVF_MSG_LOOKUP_REPLY) != 0) {
        return -1;
    }
    if ((a->seq % 4) == 0) {
        kvf_bench_lc_keys(buf, a->node_id, a->evicted, t->batch);
        kb.request_id = kvf_ctlconn_next_id(a->conn);
        kb.seq        = ++a->seq;
        if (kvf_bench_lc_call(t, a->conn, KVF_BENCH_LC_EVICT, KVF_MSG_EVICT,
                              &kb.base, KVF_MSG_STATUS) != 0) {
            return -1;
        }
        a->evicted += t->batch;
    }
    return 0;
}

static void *kvf_bench_lc_thread_main(void *arg)
{
    kvf_bench_lc_thread_t *t = arg;
    uint8_t *buf             = malloc((size_t)t->batch * KVF_KEY_WIRE_SIZE);
    uint32_t i;

    if (buf == NULL) {
        t->errors++;
        return NULL;
    }
    while (!atomic_load(t->is_started)) {
        poll(NULL, 0, 1);
    }
    while (!kvf_time_expired(t->end_ns)) {
        for (i = t->first; i < t->first + t->num; i++) {
            if (kvf_bench_lc_step(t, i, buf) != 0) {
                t->errors++;
                free(buf);
                return NULL;
            }
        }
    }
    free(buf);
    return NULL;
}

/* Counts nodes alive in NODE_INFO; -1 when the controller does not answer. */
static int kvf_bench_lc_alive(const char *addr)
{
    Kvf__NodeInfoRequest req;
    kvf_ctlconn_t *conn;
    kvf_frame_t frame;
    char err[256];
    int alive = 0;
    size_t i;

    if (kvf_ctlconn_create(addr, KVF__PEER_KIND__PEER_ADMIN, "load",
                           KVF_PROTOCOL_VERSION, 10000, &conn, err,
                           sizeof(err)) != KVF_OK) {
        return -1;
    }
    kvf__node_info_request__init(&req);
    req.request_id = 1;
    if ((kvf_ctlconn_call(conn, KVF_MSG_NODE_INFO, &req.base, &frame) !=
         KVF_OK) ||
        (frame.type != KVF_MSG_NODE_INFO_REPLY)) {
        kvf_ctlconn_destroy(conn);
        return -1;
    }
    for (i = 0; i < ((Kvf__NodeInfoReply *)frame.msg)->n_nodes; i++) {
        alive += strcmp(((Kvf__NodeInfoReply *)frame.msg)->nodes[i]->state,
                        "alive") == 0;
    }
    kvf_frame_release(&frame, NULL);
    kvf_ctlconn_destroy(conn);
    return alive;
}

int kvf_bench_load_controller_main(int argc, char **argv)
{
    static const char *const names[] = {"agents",     "seconds",    "threads",
                                        "batch",      "controller", "etcd",
                                        "etcd-prefix"};
    const char *vals[] = {"200", "5", "4", "64", NULL, NULL, NULL};
    char dir[]         = "/tmp/kvf-bench-load-XXXXXX";
    kvf_bench_lat_t all[KVF_BENCH_LC_CALLS];
    kvf_bench_lc_agent_t *agents;
    kvf_bench_lc_thread_t *ts;
    atomic_bool is_started = false;
    uint32_t num, threads, batch, i, k, per;
    uint64_t errors = 0, t0;
    double seconds, took;
    pthread_t *ths;
    bool pid_started = false; /* dir made, a controller of ours */
    pid_t pid        = -1;
    char addr[64];
    int rc, alive;

    rc = kvf_bench_load_parse(argc, argv, names, vals, 7,
                              "usage: kvf-bench load-controller [--agents "
                              "200] [--seconds 5] [--threads 4] [--batch 64] "
                              "[--controller HOST:PORT | --etcd URL[,...] "
                              "[--etcd-prefix /kvfabric]]\n");
    if (rc != 0) {
        return (rc == 1) ? 0 : 2;
    }
    num     = (uint32_t)strtoul(vals[0], NULL, 10);
    seconds = atof(vals[1]);
    threads = (uint32_t)strtoul(vals[2], NULL, 10);
    batch   = (uint32_t)strtoul(vals[3], NULL, 10);
    if ((num < 2) || (num > 65536) || (seconds <= 0) || (threads == 0) ||
        (threads > num) || (batch == 0) || (batch > 4096)) {
        fprintf(stderr, "kvf-bench load-controller: bad arguments\n");
        return 2;
    }
    if ((vals[4] != NULL) || (vals[5] != NULL)) {
        if (kvf_bench_controller_addr(vals[4], vals[5], vals[6], addr,
                                      sizeof(addr)) != 0) {
            return 1;
        }
    } else {
        if (mkdtemp(dir) == NULL) {
            perror("mkdtemp");
            return 1;
        }
        pid_started = true;
        pid         = kvf_bench_load_controller_spawn(dir, addr, sizeof(addr));
        if (pid < 0) {
            return 1;
        }
    }
    agents = calloc(num, sizeof(*agents));
    ts     = calloc(threads, sizeof(*ts));
    ths    = calloc(threads, sizeof(*ths));
    memset(all, 0, sizeof(all));
    if ((agents == NULL) || (ts == NULL) || (ths == NULL)) {
        kvf_bench_load_stop(&pid, 1);
        return 1;
    }
    fprintf(stderr,
            "kvf-bench load-controller: %u agents on %u threads, "
            "%.1f s\n",
            num, threads, seconds);
    per = (num + threads - 1) / threads;
    for (k = 0; k < threads; k++) {
        ts[k] = (kvf_bench_lc_thread_t){
            .addr       = addr,
            .agents     = agents,
            .first      = k * per,
            .num        = (k * per + per <= num) ? per : num - k * per,
            .batch      = batch,
            .total      = num,
            .is_started = &is_started};
    }
    /* register every simulated agent first (one thread: the node table
     * must hold them all before the load starts) */
    for (i = 0; i < num; i++) {
        if (kvf_bench_lc_register(&ts[i / per], i) != 0) {
            fprintf(stderr, "kvf-bench load-controller: %s\n", ts[i / per].err);
            errors++;
            goto out;
        }
        agents[i].next_hb = kvf_time_deadline_ns(KVF_NSEC_PER_SEC);
    }
    t0 = kvf_time_now_ns();
    for (k = 0; k < threads; k++) {
        ts[k].end_ns = t0 + (uint64_t)(seconds * 1e9);
        pthread_create(&ths[k], NULL, kvf_bench_lc_thread_main, &ts[k]);
    }
    atomic_store(&is_started, true);
    for (k = 0; k < threads; k++) {
        pthread_join(ths[k], NULL);
        errors += ts[k].errors;
        if (ts[k].err[0] != '\0') {
            fprintf(stderr, "kvf-bench load-controller: %s\n", ts[k].err);
        }
        for (i = 0; i < KVF_BENCH_LC_CALLS; i++) {
            kvf_bench_lat_merge(&all[i], &ts[k].lat[i]);
        }
    }
    took  = (double)(kvf_time_now_ns() - t0) / 1e9;
    alive = kvf_bench_lc_alive(addr);
    printf("{\"bench\":\"load-controller\",\"agents\":%u,\"threads\":%u,"
           "\"seconds\":%.2f,\"batch\":%u,\"errors\":%" PRIu64
           ",\"alive_after\":%d,\"controller_rss_bytes\":%" PRIu64,
           num, threads, took, batch, errors, alive,
           (pid > 0) ? kvf_bench_pid_rss(pid) : 0);
    for (i = 0; i < KVF_BENCH_LC_CALLS; i++) {
        kvf_bench_lat_print(kvf_bench_lc_names[i], &all[i], took);
    }
    printf("}\n");
    fflush(stdout);
    if (alive != (int)num) {
        fprintf(stderr,
                "kvf-bench load-controller: %d of %u agents alive after "
                "the load\n",
                alive, num);
        errors++;
    }
out:
    for (i = 0; i < num; i++) {
        kvf_ctlconn_destroy(agents[i].conn);
    }
    free(agents);
    free(ts);
    free(ths);
    kvf_bench_load_stop(&pid, 1);
    if (pid_started) {
        return kvf_bench_end(dir, (errors == 0) ? 0 : 1);
    }
    return (errors == 0) ? 0 : 1;
}
