/* SPDX-License-Identifier: Apache-2.0 */
/* Copyright (c) 2026 The kvfabric authors */
/*
 * kvf-bench controller: ADMIT and LOOKUP throughput/latency of
 * kvf-controller, beside Redis pipelined MGET of 64 keys in the same run.
 *
 *   kvf-bench controller --keys N --batch B --clients C [--depth D]
 *                        [--seconds S] [--rounds R] [--controller HOST:PORT]
 *                        [--no-redis]
 *
 * Without --controller it starts its own kvf-controller (next to this
 * binary in the build tree, or $KVF_CONTROLLER_BIN) so the controller's RSS
 * can be measured. Each client is a thread with its own connection; it
 * keeps D requests in flight. Phases (one JSON line each): admit (each
 * client registers a node and admits its share of the N keys), lookup
 * (ordered chains of B keys, D in flight), lookup_rtt (D = 1: the round
 * trip), and redis_mget64 when redis-server and redis-benchmark exist.
 * lookup and redis_mget64 alternate for R rounds so both see the same
 * machine load.
 */
#include "tools/bench/bench.h"

#include "client/ctlconn.h"
#include "common/etcd.h"
#include "common/time.h"

#include <kvfabric/keys.h>

#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <netinet/in.h>
#include <arpa/inet.h>
#include <time.h>
#include <unistd.h>

#define KVF_BENCH_CTL_POOL 256 /* pre-encoded lookups per client */
#define KVF_BENCH_CTL_RING 1024

typedef struct kvf_bench_ctl_opts {
    uint64_t keys;
    uint32_t batch;
    uint32_t clients;
    uint32_t depth;
    double seconds;
    int rounds;
    uint32_t threads;
    const char *controller;
    const char *etcd;
    const char *etcd_prefix;
    bool is_redis;
} kvf_bench_ctl_opts_t;

typedef struct kvf_bench_ctl_client {
    const kvf_bench_ctl_opts_t *opts;
    const char *addr;
    uint32_t index;
    uint32_t node_id;
    uint32_t depth;
    int phase; /* 0 admit, 1 lookup */
    kvf_ctlconn_t *conn;
    uint64_t *lat_ns;
    size_t num_lat;
    size_t cap_lat;
    uint64_t keys_done;
    uint64_t misses;
    /* lookup phase */
    uint8_t *pool;
    size_t frame_len;
    size_t lens[KVF_BENCH_CTL_POOL];
    uint64_t sent;
    uint64_t recvd;
    uint64_t ring[KVF_BENCH_CTL_RING];
    int failed;
    char err[256];
} kvf_bench_ctl_client_t;

static void kvf_bench_ctl_usage(FILE *out)
{
    fprintf(out, "usage: kvf-bench controller [--keys N] [--batch B] "
                 "[--clients C] [--depth D] [--seconds S] [--rounds R]\n"
                 "                            [--threads T] "
                 "[--controller HOST:PORT] [--no-redis]\n"
                 "                            [--etcd URL[,URL...] "
                 "[--etcd-prefix /kvfabric]] (the HA leader)\n"
                 "defaults: --keys 1000000 --batch 64 --clients 4 --depth 16 "
                 "--seconds 2 --rounds 3 --threads 1\n"
                 "lookup clients are spread over T threads, each driving its "
                 "connections with poll()\n");
}

static void kvf_bench_ctl_keys(uint8_t *buf, uint32_t client, uint64_t first,
                               uint32_t n)
{
    uint32_t i;

    for (i = 0; i < n; i++) {
        kvf_key_t k = {.ns = 0x6b7666, .hi = client, .lo = first + i};

        kvf_key_pack(&k, buf + (size_t)i * KVF_KEY_WIRE_SIZE);
    }
}

static void kvf_bench_ctl_lat(kvf_bench_ctl_client_t *c, uint64_t ns)
{
    if (c->num_lat == c->cap_lat) {
        size_t cap  = (c->cap_lat == 0) ? 65536 : c->cap_lat * 2;
        uint64_t *p = realloc(c->lat_ns, cap * sizeof(*p));

        if (p == NULL) {
            return;
        }
        c->lat_ns  = p;
        c->cap_lat = cap;
    }
    c->lat_ns[c->num_lat++] = ns;
}

/* Admits this client's share, D requests in flight. */
static int kvf_bench_ctl_admit(kvf_bench_ctl_client_t *c)
{
    const kvf_bench_ctl_opts_t *o = c->opts;
    uint64_t share = o->keys / o->clients, sent = 0, seq = 0;
    uint64_t ring[1024];
    uint32_t inflight = 0;
    uint8_t *buf      = malloc((size_t)o->batch * KVF_KEY_WIRE_SIZE);
    Kvf__KeyBatch kb;
    kvf_frame_t frame = {0};
    kvf_status_t st;

    if (c->index == 0) {
        share += o->keys % o->clients;
    }
    if (buf == NULL) {
        return -1;
    }
    kvf__key_batch__init(&kb);
    kb.node_id     = c->node_id;
    kb.incarnation = 1;
    while ((sent < share) || (inflight > 0)) {
        bool is_filling = (inflight == 0); /* D per write, as -P D */

        while (is_filling && (sent < share) && (inflight < c->depth)) {
            uint32_t n =
                (uint32_t)((share - sent < o->batch) ? share - sent : o->batch);

            kvf_bench_ctl_keys(buf, c->index, sent, n);
            kb.request_id    = ++seq;
            kb.seq           = seq;
            kb.keys.data     = buf;
            kb.keys.len      = (size_t)n * KVF_KEY_WIRE_SIZE;
            ring[seq % 1024] = kvf_time_now_ns();
            st = kvf_ctlconn_queue(c->conn, KVF_MSG_ADMIT, &kb.base);
            if (st != KVF_OK) {
                snprintf(c->err, sizeof(c->err), "admit send: %s",
                         kvf_strerror(st));
                free(buf);
                return -1;
            }
            sent += n;
            inflight++;
        }
        st = kvf_ctlconn_flush(c->conn);
        if (st == KVF_OK) {
            st = kvf_ctlconn_recv(c->conn, &frame);
        }
        /* then every reply already buffered, before the next write */
        while (st == KVF_OK) {
            if ((frame.type != KVF_MSG_STATUS) ||
                (((Kvf__Status *)frame.msg)->status != KVF_OK)) {
                break;
            }
            kvf_bench_ctl_lat(
                c, kvf_time_now_ns() -
                       ring[((Kvf__Status *)frame.msg)->request_id % 1024]);
            kvf_frame_release(&frame, NULL);
            inflight--;
            st = kvf_ctlconn_recv_buffered(c->conn, &frame);
        }
        if (st != KVF_INPROGRESS) {
            snprintf(c->err, sizeof(c->err), "admit reply: %s",
                     (st != KVF_OK) ? kvf_strerror(st) : "error status");
            kvf_frame_release(&frame, NULL);
            free(buf);
            return -1;
        }
    }
    c->keys_done = share;
    free(buf);
    return 0;
}

/* Ordered-chain lookups of batch keys from random offsets for S seconds. */
/* Packs this client's pool of lookups (random chains of batch keys). */
static int kvf_bench_ctl_lookup_prepare(kvf_bench_ctl_client_t *c)
{
    const kvf_bench_ctl_opts_t *o = c->opts;
    uint64_t share                = o->keys / o->clients;
    unsigned seed                 = 12345u + c->index;
    Kvf__Lookup lk;
    uint8_t *keys;
    uint32_t i;

    c->frame_len =
        KVF_FRAME_HDR_SIZE + 16 + (size_t)o->batch * KVF_KEY_WIRE_SIZE;
    c->sent = c->recvd = 0;
    if (c->pool == NULL) {
        c->pool = malloc(KVF_BENCH_CTL_POOL * c->frame_len);
    }
    keys = malloc((size_t)o->batch * KVF_KEY_WIRE_SIZE);
    if ((c->pool == NULL) || (keys == NULL)) {
        free(keys);
        snprintf(c->err, sizeof(c->err), "out of memory");
        return -1;
    }
    kvf__lookup__init(&lk);
    for (i = 0; i < KVF_BENCH_CTL_POOL; i++) {
        uint32_t owner = (uint32_t)rand_r(&seed) % o->clients;
        uint64_t first = (share > o->batch)
                             ? (uint64_t)rand_r(&seed) % (share - o->batch)
                             : 0;

        kvf_bench_ctl_keys(keys, owner, first, o->batch);
        lk.request_id = i + 1;
        lk.keys.data  = keys;
        lk.keys.len   = (size_t)o->batch * KVF_KEY_WIRE_SIZE;
        if (kvf_frame_pack(c->pool + i * c->frame_len, c->frame_len,
                           KVF_MSG_LOOKUP, 0, &lk.base, KVF_FRAME_MAX_LIMIT,
                           &c->lens[i]) != KVF_OK) {
            free(keys);
            snprintf(c->err, sizeof(c->err), "cannot encode a lookup");
            return -1;
        }
    }
    free(keys);
    return 0;
}

/* Like redis-benchmark -P D: D requests in one write, then all replies. */
static kvf_status_t kvf_bench_ctl_lookup_send(kvf_bench_ctl_client_t *c)
{
    uint64_t now    = kvf_time_now_ns();
    kvf_status_t st = KVF_OK;
    uint32_t j;

    for (j = 0; (j < c->depth) && (st == KVF_OK); j++, c->sent++) {
        uint32_t k = (uint32_t)(c->sent % KVF_BENCH_CTL_POOL);

        c->ring[c->sent % KVF_BENCH_CTL_RING] = now;
        st = kvf_ctlconn_queue_raw(c->conn, c->pool + k * c->frame_len,
                                   c->lens[k]);
    }
    return (st == KVF_OK) ? kvf_ctlconn_flush(c->conn) : st;
}

/* Reads what arrived and consumes every whole reply. */
static kvf_status_t kvf_bench_ctl_lookup_recv(kvf_bench_ctl_client_t *c)
{
    kvf_frame_t frame = {0};
    kvf_status_t st   = kvf_ctlconn_read_some(c->conn);

    if ((st != KVF_OK) && (st != KVF_INPROGRESS)) {
        return st;
    }
    while ((st = kvf_ctlconn_recv_buffered(c->conn, &frame)) == KVF_OK) {
        Kvf__LookupReply *rep = (Kvf__LookupReply *)frame.msg;

        if (frame.type != KVF_MSG_LOOKUP_REPLY) {
            kvf_frame_release(&frame, NULL);
            return KVF_ERR_PROTO;
        }
        kvf_bench_ctl_lat(c, kvf_time_now_ns() -
                                 c->ring[c->recvd % KVF_BENCH_CTL_RING]);
        c->misses += c->opts->batch - rep->hit_chunks;
        c->keys_done += c->opts->batch;
        c->recvd++;
        kvf_frame_release(&frame, NULL);
    }
    return (st == KVF_INPROGRESS) ? KVF_OK : st;
}

/*
 * Ordered-chain lookups for S seconds over a group of clients driven by one
 * thread with poll(), as redis-benchmark drives its clients: requests are
 * encoded before the clock starts and each client keeps its own connection.
 * On this 2-core VM a thread per client paid a wakeup per reply burst.
 */
static int kvf_bench_ctl_lookup_group(kvf_bench_ctl_client_t **cs, size_t n)
{
    struct pollfd pfd[64];
    uint64_t deadline;
    bool is_open = true, is_busy = true;
    size_t i;

    for (i = 0; i < n; i++) {
        cs[i]->keys_done = 0;
        if (kvf_bench_ctl_lookup_prepare(cs[i]) != 0) {
            cs[i]->failed = -1;
            return -1;
        }
    }
    deadline = kvf_time_now_ns() + (uint64_t)(cs[0]->opts->seconds * 1e9);
    while (is_busy) {
        is_busy = false;
        for (i = 0; i < n; i++) {
            kvf_bench_ctl_client_t *c = cs[i];

            if (is_open && (c->sent == c->recvd) &&
                (kvf_bench_ctl_lookup_send(c) != KVF_OK)) {
                snprintf(c->err, sizeof(c->err), "lookup send failed");
                c->failed = -1;
                return -1;
            }
            pfd[i].fd      = kvf_ctlconn_fd(c->conn);
            pfd[i].events  = (c->sent > c->recvd) ? POLLIN : 0;
            pfd[i].revents = 0;
            is_busy |= (c->sent > c->recvd);
        }
        if (!is_busy) {
            break;
        }
        if (poll(pfd, (nfds_t)n, 10000) <= 0) {
            snprintf(cs[0]->err, sizeof(cs[0]->err), "no reply in 10 s");
            cs[0]->failed = -1;
            return -1;
        }
        for (i = 0; i < n; i++) {
            kvf_status_t st;

            if (pfd[i].revents == 0) {
                continue;
            }
            st = kvf_bench_ctl_lookup_recv(cs[i]);
            if (st != KVF_OK) {
                snprintf(cs[i]->err, sizeof(cs[i]->err), "lookup reply: %s",
                         kvf_strerror(st));
                cs[i]->failed = -1;
                return -1;
            }
        }
        if (is_open && (kvf_time_now_ns() >= deadline)) {
            is_open = false;
        }
    }
    return 0;
}

typedef struct kvf_bench_ctl_group {
    kvf_bench_ctl_client_t *members[64];
    size_t n;
} kvf_bench_ctl_group_t;

static void *kvf_bench_ctl_group_main(void *arg)
{
    kvf_bench_ctl_group_t *g = arg;

    kvf_bench_ctl_lookup_group(g->members, g->n);
    return NULL;
}

static void *kvf_bench_ctl_client_main(void *arg)
{
    kvf_bench_ctl_client_t *c = arg;

    c->failed = kvf_bench_ctl_admit(c);
    return NULL;
}

/* Runs one phase over all clients; prints its JSON line. */
static int kvf_bench_ctl_phase(kvf_bench_ctl_client_t *cs,
                               const kvf_bench_ctl_opts_t *o, int phase,
                               uint32_t depth, const char *name, int round,
                               pid_t pid)
{
    pthread_t *th = calloc(o->clients, sizeof(*th));
    uint64_t t0, t1, keys = 0, misses = 0, *all;
    size_t n = 0, i, j;
    uint64_t rss;
    int rc = 0;

    if (th == NULL) {
        return -1;
    }
    for (i = 0; i < o->clients; i++) {
        cs[i].failed  = 0;
        cs[i].phase   = phase;
        cs[i].depth   = depth;
        cs[i].num_lat = 0;
        cs[i].misses  = 0;
    }
    if (phase == 0) {
        t0 = kvf_time_now_ns();
        for (i = 0; i < o->clients; i++) {
            pthread_create(&th[i], NULL, kvf_bench_ctl_client_main, &cs[i]);
        }
        for (i = 0; i < o->clients; i++) {
            pthread_join(th[i], NULL);
        }
        t1 = kvf_time_now_ns();
    } else {
        size_t nt = (o->threads < o->clients) ? o->threads : o->clients;
        kvf_bench_ctl_group_t *groups = calloc(nt, sizeof(*groups));

        if (groups == NULL) {
            free(th);
            return -1;
        }
        for (i = 0; i < o->clients; i++) {
            kvf_bench_ctl_group_t *g = &groups[i % nt];

            g->members[g->n++] = &cs[i];
        }
        t0 = kvf_time_now_ns();
        for (i = 0; i < nt; i++) {
            pthread_create(&th[i], NULL, kvf_bench_ctl_group_main, &groups[i]);
        }
        for (i = 0; i < nt; i++) {
            pthread_join(th[i], NULL);
        }
        t1 = kvf_time_now_ns();
        free(groups);
    }
    free(th);
    for (i = 0; i < o->clients; i++) {
        if (cs[i].failed != 0) {
            fprintf(stderr, "kvf-bench controller: client %zu: %s\n", i,
                    cs[i].err);
            rc = -1;
        }
        keys += cs[i].keys_done;
        misses += cs[i].misses;
        n += cs[i].num_lat;
    }
    if (rc != 0) {
        return rc;
    }
    all = malloc((n + 1) * sizeof(*all));
    if (all == NULL) {
        return -1;
    }
    for (i = 0, j = 0; i < o->clients; i++) {
        memcpy(all + j, cs[i].lat_ns, cs[i].num_lat * sizeof(*all));
        j += cs[i].num_lat;
    }
    rss = (pid > 0) ? kvf_bench_pid_rss(pid) : 0;
    printf("{\"bench\":\"controller\",\"phase\":\"%s\",\"round\":%d,"
           "\"keys\":%" PRIu64 ",\"batch\":%" PRIu32 ",\"clients\":%" PRIu32
           ",\"depth\":%" PRIu32 ",\"requests\":%zu,\"keys_per_s\":%.0f"
           ",\"p50_us\":%.1f,\"p99_us\":%.1f,\"miss_keys\":%" PRIu64
           ",\"rss_bytes\":%" PRIu64 ",\"rss_bytes_per_key\":",
           name, round, o->keys, o->batch, o->clients, depth, n,
           (double)keys * 1e9 / (double)(t1 - t0),
           (double)kvf_bench_percentile(all, n, 50) / 1000.0,
           (double)kvf_bench_percentile(all, n, 99) / 1000.0, misses, rss);
    if (rss > 0) {
        printf("%.1f}\n", (double)rss / (double)o->keys);
    } else {
        printf("null}\n");
    }
    fflush(stdout);
    free(all);
    return 0;
}

static void kvf_bench_ctl_pause(void)
{
    struct timespec ts = {0, 5 * 1000 * 1000};

    nanosleep(&ts, NULL);
}

/* Starts a private redis-server; returns its port, 0 when unavailable. */
static uint16_t kvf_bench_ctl_redis_start(void)
{
    char cmd[512];
    uint16_t port = kvf_bench_free_port();
    uint64_t deadline;

    if ((system("command -v redis-server >/dev/null 2>&1") != 0) ||
        (system("command -v redis-benchmark >/dev/null 2>&1") != 0)) {
        fprintf(stderr, "kvf-bench controller: redis not installed; "
                        "skipping the MGET comparison\n");
        return 0;
    }
    snprintf(cmd, sizeof(cmd),
             "redis-server --port %u --bind 127.0.0.1 --save '' "
             "--appendonly no --daemonize yes --pidfile /tmp/kvf-bench-redis-"
             "%u.pid --logfile /dev/null",
             port, port);
    if (system(cmd) != 0) {
        fprintf(stderr, "kvf-bench controller: redis-server failed\n");
        return 0;
    }
    deadline = kvf_time_deadline_ns(10 * KVF_NSEC_PER_SEC);
    snprintf(cmd, sizeof(cmd), "redis-cli -p %u ping >/dev/null 2>&1", port);
    while (system(cmd) != 0) {
        if (kvf_time_expired(deadline)) {
            fprintf(stderr, "kvf-bench controller: redis did not start\n");
            return 0;
        }
        kvf_bench_ctl_pause();
    }
    return port;
}

static void kvf_bench_ctl_redis_stop(uint16_t port)
{
    char cmd[256];

    snprintf(cmd, sizeof(cmd),
             "redis-cli -p %u shutdown nosave >/dev/null 2>&1", port);
    if (system(cmd) != 0) {
        /* shutdown closes the connection before answering: expected */
    }
}

/* Redis pipelined MGET of 64 keys (-c 4 -P 16), as the issue defines. */
static void kvf_bench_ctl_redis_run(uint16_t port, int round)
{
    char cmd[2048], line[512];
    double rps = 0;
    size_t off;
    FILE *p;
    int i;

    off = (size_t)snprintf(cmd, sizeof(cmd),
                           "redis-benchmark -p %u -c 4 -P 16 -n 200000 -q "
                           "mget",
                           port);
    for (i = 1; i <= 64; i++) {
        off += (size_t)snprintf(cmd + off, sizeof(cmd) - off, " k%d", i);
    }
    snprintf(cmd + off, sizeof(cmd) - off, " 2>&1");
    p = popen(cmd, "r");
    while ((p != NULL) && (fgets(line, sizeof(line), p) != NULL)) {
        char *s = strrchr(line, '\r');
        char *r = strstr((s != NULL) ? s : line, ": ");

        if (r != NULL) {
            rps = strtod(r + 2, NULL);
        }
    }
    if (p != NULL) {
        pclose(p);
    }
    printf("{\"bench\":\"controller\",\"phase\":\"redis_mget64\","
           "\"round\":%d,\"clients\":4,\"pipeline\":16,"
           "\"requests_per_s\":%.0f,\"keys_per_s\":%.0f}\n",
           round, rps, rps * 64);
    fflush(stdout);
}

static pid_t kvf_bench_ctl_spawn(const kvf_bench_ctl_opts_t *o, char *addr,
                                 size_t addr_len)
{
    char exe[PATH_MAX], bin[PATH_MAX + 64], port_file[64], init[32];
    const char *env_bin = getenv("KVF_CONTROLLER_BIN");
    uint64_t deadline;
    ssize_t n;
    pid_t pid;
    FILE *f;

    if (env_bin != NULL) {
        snprintf(bin, sizeof(bin), "%s", env_bin);
    } else {
        n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
        if (n <= 0) {
            return -1;
        }
        exe[n]             = '\0';
        *strrchr(exe, '/') = '\0'; /* .../tools */
        snprintf(bin, sizeof(bin), "%s/../controller/kvf-controller", exe);
    }
    snprintf(port_file, sizeof(port_file), "/tmp/kvf-bench-ctl-%d.port",
             (int)getpid());
    snprintf(init, sizeof(init), "%" PRIu64, o->keys);
    unlink(port_file);
    pid = fork();
    if (pid == 0) {
        execl(bin, bin, "--listen", "127.0.0.1:0", "--http", "", "--port-file",
              port_file, "--recovery-window", "0", "--initial-keys", init,
              "--lease", "1h", (char *)NULL);
        fprintf(stderr, "kvf-bench controller: cannot run %s: %s\n", bin,
                strerror(errno));
        _exit(127);
    }
    if (pid < 0) {
        return -1;
    }
    deadline = kvf_time_deadline_ns(20 * KVF_NSEC_PER_SEC);
    while ((f = fopen(port_file, "r")) == NULL) {
        int st;

        if (kvf_time_expired(deadline) || (waitpid(pid, &st, WNOHANG) != 0)) {
            fprintf(stderr, "kvf-bench controller: controller did not "
                            "start\n");
            kill(pid, SIGKILL);
            waitpid(pid, NULL, 0);
            return -1;
        }
        kvf_bench_ctl_pause();
    }
    if (fgets(addr, (int)addr_len, f) == NULL) {
        addr[0] = '\0';
    }
    addr[strcspn(addr, "\n")] = '\0';
    fclose(f);
    unlink(port_file);
    return pid;
}

int kvf_bench_controller_addr(const char *controller, const char *etcd,
                              const char *prefix, char *addr, size_t len)
{
    char err[512];

    if ((etcd == NULL) || (etcd[0] == '\0')) {
        snprintf(addr, len, "%s", (controller != NULL) ? controller : "");
        return 0;
    }
    if (kvf_etcd_find_leader(etcd, (prefix != NULL) ? prefix : "/kvfabric",
                             5000, addr, len, err, sizeof(err)) != KVF_OK) {
        fprintf(stderr, "kvf-bench: %s\n", err);
        return -1;
    }
    return 0;
}

static int kvf_bench_ctl_parse(int argc, char **argv, kvf_bench_ctl_opts_t *o)
{
    int i;

    for (i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = (i + 1 < argc) ? argv[i + 1] : NULL;

        if ((strcmp(a, "--help") == 0) || (strcmp(a, "-h") == 0)) {
            kvf_bench_ctl_usage(stdout);
            exit(0);
        } else if (strcmp(a, "--no-redis") == 0) {
            o->is_redis = false;
        } else if (v == NULL) {
            fprintf(stderr, "kvf-bench controller: %s needs a value\n", a);
            return -1;
        } else if (strcmp(a, "--keys") == 0) {
            o->keys = strtoull(v, NULL, 10);
            i++;
        } else if (strcmp(a, "--batch") == 0) {
            o->batch = (uint32_t)strtoul(v, NULL, 10);
            i++;
        } else if (strcmp(a, "--clients") == 0) {
            o->clients = (uint32_t)strtoul(v, NULL, 10);
            i++;
        } else if (strcmp(a, "--depth") == 0) {
            o->depth = (uint32_t)strtoul(v, NULL, 10);
            i++;
        } else if (strcmp(a, "--threads") == 0) {
            o->threads = (uint32_t)strtoul(v, NULL, 10);
            i++;
        } else if (strcmp(a, "--rounds") == 0) {
            o->rounds = atoi(v);
            i++;
        } else if (strcmp(a, "--seconds") == 0) {
            o->seconds = strtod(v, NULL);
            i++;
        } else if (strcmp(a, "--controller") == 0) {
            o->controller = v;
            i++;
        } else if (strcmp(a, "--etcd") == 0) {
            o->etcd = v;
            i++;
        } else if (strcmp(a, "--etcd-prefix") == 0) {
            o->etcd_prefix = v;
            i++;
        } else {
            fprintf(stderr, "kvf-bench controller: unknown option '%s'\n", a);
            return -1;
        }
    }
    if ((o->keys == 0) || (o->batch == 0) || (o->batch > 65536) ||
        (o->clients == 0) || (o->depth == 0) || (o->depth > 512) ||
        (o->seconds <= 0) || (o->rounds < 1) || (o->threads == 0) ||
        (o->clients > 64 * o->threads) ||
        (o->keys < (uint64_t)o->clients * o->batch)) {
        fprintf(stderr, "kvf-bench controller: bad option values (keys >= "
                        "clients*batch, batch 1..65536, depth 1..512, "
                        "clients <= 64 * threads)\n");
        return -1;
    }
    return 0;
}

int kvf_bench_controller_main(int argc, char **argv)
{
    kvf_bench_ctl_opts_t o     = {.keys     = 1000000,
                                  .batch    = 64,
                                  .clients  = 4,
                                  .depth    = 16,
                                  .seconds  = 2,
                                  .rounds   = 3,
                                  .threads  = 1,
                                  .is_redis = true};
    kvf_bench_ctl_client_t *cs = NULL;
    char addr[128], name[32];
    pid_t pid           = -1;
    uint16_t redis_port = 0;
    uint32_t i;
    int r;
    int rc = 1;

    if (kvf_bench_ctl_parse(argc, argv, &o) != 0) {
        kvf_bench_ctl_usage(stderr);
        return 2;
    }
    signal(SIGPIPE, SIG_IGN);
    if ((o.controller != NULL) || (o.etcd != NULL)) {
        if (kvf_bench_controller_addr(o.controller, o.etcd, o.etcd_prefix, addr,
                                      sizeof(addr)) != 0) {
            return 1;
        }
    } else {
        pid = kvf_bench_ctl_spawn(&o, addr, sizeof(addr));
        if (pid < 0) {
            return 1;
        }
    }
    cs = calloc(o.clients, sizeof(*cs));
    if (cs == NULL) {
        goto out;
    }
    for (i = 0; i < o.clients; i++) {
        Kvf__Register reg;
        kvf_frame_t frame;

        cs[i].opts  = &o;
        cs[i].addr  = addr;
        cs[i].index = i;
        if (kvf_ctlconn_create(addr, KVF__PEER_KIND__PEER_AGENT, "bench",
                               KVF_PROTOCOL_VERSION, 30000, &cs[i].conn,
                               cs[i].err, sizeof(cs[i].err)) != KVF_OK) {
            fprintf(stderr, "kvf-bench controller: %s\n", cs[i].err);
            goto out;
        }
        snprintf(name, sizeof(name), "bench-%d-%u", (int)getpid(), i);
        kvf__register__init(&reg);
        reg.request_id  = 1;
        reg.name        = name;
        reg.incarnation = 1;
        if ((kvf_ctlconn_call(cs[i].conn, KVF_MSG_REGISTER, &reg.base,
                              &frame) != KVF_OK) ||
            (frame.type != KVF_MSG_REGISTER_REPLY) ||
            (((Kvf__RegisterReply *)frame.msg)->status != KVF_OK)) {
            fprintf(stderr, "kvf-bench controller: register failed\n");
            kvf_frame_release(&frame, NULL);
            goto out;
        }
        cs[i].node_id = ((Kvf__RegisterReply *)frame.msg)->node_id;
        kvf_frame_release(&frame, NULL);
    }
    if (kvf_bench_ctl_phase(cs, &o, 0, o.depth, "admit", 0, pid) != 0) {
        goto out;
    }
    redis_port = o.is_redis ? kvf_bench_ctl_redis_start() : 0;
    /* alternate with redis: a shared machine's load drifts between runs */
    for (r = 0; r < o.rounds; r++) {
        if (kvf_bench_ctl_phase(cs, &o, 1, o.depth, "lookup", r, pid) != 0) {
            goto out;
        }
        if (redis_port != 0) {
            kvf_bench_ctl_redis_run(redis_port, r);
        }
    }
    if (kvf_bench_ctl_phase(cs, &o, 1, 1, "lookup_rtt", 0, pid) != 0) {
        goto out;
    }
    rc = 0;
out:
    if (redis_port != 0) {
        kvf_bench_ctl_redis_stop(redis_port);
    }
    for (i = 0; (cs != NULL) && (i < o.clients); i++) {
        kvf_ctlconn_destroy(cs[i].conn);
        free(cs[i].pool);
        free(cs[i].lat_ns);
    }
    free(cs);
    if (pid > 0) {
        int st = 0;

        kill(pid, SIGTERM);
        waitpid(pid, &st, 0);
        if (!WIFEXITED(st) || (WEXITSTATUS(st) != 0)) {
            fprintf(stderr,
                    "kvf-bench controller: controller exit status "
                    "%d\n",
                    st);
            rc = 1; /* a crash or a leak is a failed run */
        }
    }
    return rc;
}
