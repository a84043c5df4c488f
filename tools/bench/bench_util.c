/* SPDX-License-Identifier: Apache-2.0 */
/* Copyright (c) 2026 The kvfabric authors */
#include "tools/bench/bench.h"

#include "common/byteorder.h"
#include "common/config.h"
#include "common/time.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <inttypes.h>
#include <limits.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

static int kvf_bench_cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

    return (x > y) - (x < y);
}

uint64_t kvf_bench_percentile(uint64_t *samples, size_t n, double pct)
{
    size_t idx;

    if (n == 0) {
        return 0;
    }
    qsort(samples, n, sizeof(*samples), kvf_bench_cmp_u64);
    idx = (size_t)((pct / 100.0) * (double)(n - 1) + 0.5);
    return samples[(idx >= n) ? n - 1 : idx];
}

uint64_t kvf_bench_rss_bytes(void)
{
    unsigned long size = 0, resident = 0;
    FILE *f = fopen("/proc/self/statm", "r");

    if (f == NULL) {
        return 0;
    }
    if (fscanf(f, "%lu %lu", &size, &resident) != 2) {
        resident = 0;
    }
    fclose(f);
    return (uint64_t)resident * (uint64_t)sysconf(_SC_PAGESIZE);
}

uint16_t kvf_bench_free_port(void)
{
    struct sockaddr_in sin;
    socklen_t len = sizeof(sin);
    uint16_t port = 0;
    int fd        = socket(AF_INET, SOCK_STREAM, 0);

    if (fd < 0) {
        return 0;
    }
    memset(&sin, 0, sizeof(sin));
    sin.sin_family      = AF_INET;
    sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if ((bind(fd, (struct sockaddr *)&sin, sizeof(sin)) == 0) &&
        (getsockname(fd, (struct sockaddr *)&sin, &len) == 0)) {
        port = ntohs(sin.sin_port);
    }
    close(fd);
    return port;
}

void kvf_bench_sibling_path(const char *rel, char *buf, size_t len)
{
    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
    char *slash;

    if (n <= 0) {
        snprintf(buf, len, "%s", rel);
        return;
    }
    exe[n] = '\0';
    slash  = strrchr(exe, '/');
    if (slash != NULL) {
        *slash = '\0'; /* .../tools */
    }
    snprintf(buf, len, "%s/../%s", exe, rel);
}

pid_t kvf_bench_spawn(const char *const argv[], const char *log)
{
    pid_t pid = fork();

    if (pid == 0) {
        FILE *f = freopen(log, "w", stderr);

        (void)f;
        if (freopen("/dev/null", "w", stdout) == NULL) {
            _exit(127);
        }
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wcast-qual"
        execv(argv[0], (char *const *)argv);
#pragma GCC diagnostic pop
        _exit(127);
    }
    return pid;
}

void kvf_bench_stop_all(pid_t *pids, int *npids)
{
    int i;

    for (i = *npids - 1; i >= 0; i--) {
        kill(pids[i], SIGTERM);
        waitpid(pids[i], NULL, 0);
    }
    *npids = 0;
}

uint64_t kvf_bench_pid_status(pid_t pid, const char *field)
{
    char path[64], line[256];
    size_t n    = strlen(field);
    uint64_t kb = 0;
    FILE *f;

    snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
    f = fopen(path, "r");
    if (f == NULL) {
        return 0;
    }
    while (fgets(line, sizeof(line), f) != NULL) {
        if ((strncmp(line, field, n) == 0) && (line[n] == ':') &&
            (sscanf(line + n + 1, " %" SCNu64, &kb) == 1)) {
            break;
        }
    }
    fclose(f);
    return kb * 1024;
}

uint64_t kvf_bench_pid_rss(pid_t pid)
{
    return kvf_bench_pid_status(pid, "VmRSS");
}

kvf_client_t *kvf_bench_connect(const char *sock, uint64_t wait_ns)
{
    kvf_client_params_t p = {.field_mask = KVF_CLIENT_PARAM_SOCKET |
                                           KVF_CLIENT_PARAM_TIMEOUT,
                             .socket_path = sock,
                             .timeout_ns  = 60 * KVF_NSEC_PER_SEC};
    kvf_client_t *c       = NULL;
    uint64_t deadline     = kvf_time_deadline_ns(wait_ns);

    while (kvf_client_connect(&p, &c) != KVF_OK) {
        if (kvf_time_expired(deadline)) {
            return NULL;
        }
        poll(NULL, 0, 20);
    }
    return c;
}

double kvf_bench_perftest_final_gbps(const char *line)
{
    double mibps;

    /* Final: iters typical-lat avg-lat overall-lat avg-bw overall-bw ...;
     * the bandwidth columns say MB/s but are MiB/s (UCS_MBYTE = 2^20) */
    if ((strncmp(line, "Final:", 6) != 0) ||
        (sscanf(line + 6, "%*f %*f %*f %*f %*f %lf", &mibps) != 1) ||
        (mibps < 0.0)) {
        return -1.0;
    }
    return mibps * 1048576.0 / 1e9;
}

void kvf_bench_perftest_cmd(char *buf, size_t len, const char *transport,
                            uint16_t port, uint64_t size, uint64_t iters,
                            bool is_sleep)
{
    const char *mode = is_sleep ? "sleep" : "poll";

    /* the agents' tuning (256K TCP segments) and error mode (-e, PEER) */
    snprintf(buf, len,
             "env UCX_TLS=%s UCX_TCP_TX_SEG_SIZE=256K UCX_TCP_RX_SEG_SIZE=256K "
             "ucx_perftest -p %u -E %s & "
             "env UCX_TLS=%s UCX_TCP_TX_SEG_SIZE=256K UCX_TCP_RX_SEG_SIZE=256K "
             "ucx_perftest 127.0.0.1 -p %u -t ucp_am_bw -s %" PRIu64
             " -n %" PRIu64 " -e -E %s",
             transport, port, mode, transport, port, size,
             (iters > 100) ? iters : (uint64_t)100, mode);
}

double kvf_bench_perftest_am_bw(const char *transport, uint64_t size,
                                uint64_t iters, bool is_sleep)
{
    char cmd[1024], shell[1400], line[512], *amp;
    double best   = 0.0, gbps;
    uint16_t port = kvf_bench_free_port();
    FILE *f;
    int run;

    if (system("command -v ucx_perftest >/dev/null 2>&1") != 0) {
        return 0.0;
    }
    for (run = 0; run < 3; run++) {
        kvf_bench_perftest_cmd(cmd, sizeof(cmd), transport, port, size, iters,
                               is_sleep);
        if (run == 0) {
            fprintf(stderr, "kvf-bench: ceiling (%s, best of 3): %s\n",
                    is_sleep ? "event-driven" : "busy-polling", cmd);
        }
        /* the same command, the server in the background for at most 60 s
         * and given half a second to listen */
        amp = strstr(cmd, " & ");
        if (amp == NULL) {
            return best;
        }
        snprintf(shell, sizeof(shell),
                 "(timeout 60 %.*s >/dev/null 2>&1 &); sleep 0.5; "
                 "timeout 60 %s 2>/dev/null",
                 (int)(amp - cmd), cmd, amp + 3);
        f = popen(shell, "r");
        if (f == NULL) {
            return best;
        }
        while (fgets(line, sizeof(line), f) != NULL) {
            gbps = kvf_bench_perftest_final_gbps(line);
            if (gbps > best) {
                best = gbps;
            }
        }
        pclose(f);
        port = kvf_bench_free_port();
    }
    return best;
}

/* Sum of the on-CPU nanoseconds of every thread of @p pid
 * (/proc/PID/task/TID/schedstat, first field); -1 when unreadable. */
static int64_t kvf_bench_pid_schedstat_ns(pid_t pid)
{
    char path[64], buf[128];
    unsigned long long ns;
    struct dirent *de;
    int64_t total = 0;
    int found     = 0;
    DIR *dir;
    FILE *f;

    snprintf(path, sizeof(path), "/proc/%d/task", (int)pid);
    dir = opendir(path);
    if (dir == NULL) {
        return -1;
    }
    while ((de = readdir(dir)) != NULL) {
        if (de->d_name[0] == '.') {
            continue;
        }
        snprintf(path, sizeof(path), "/proc/%d/task/%.16s/schedstat", (int)pid,
                 de->d_name);
        f = fopen(path, "r");
        if (f == NULL) {
            continue; /* the thread just ended */
        }
        if ((fgets(buf, sizeof(buf), f) != NULL) &&
            (sscanf(buf, "%llu", &ns) == 1)) {
            total += (int64_t)ns;
            found = 1;
        }
        fclose(f);
    }
    closedir(dir);
    return found ? total : -1;
}

int kvf_bench_stat_cpu_ticks(const char *stat, uint64_t *ticks_p)
{
    unsigned long long utime, stime;
    const char *p = strrchr(stat, ')'); /* comm may hold spaces and ')' */

    /* after "pid (comm)": state ppid pgrp session tty tpgid flags minflt
     * cminflt majflt cmajflt utime stime (fields 3..15) */
    if ((p == NULL) ||
        (sscanf(p + 1, " %*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu",
                &utime, &stime) != 2)) {
        return -1;
    }
    *ticks_p = utime + stime;
    return 0;
}

uint64_t kvf_bench_pid_cpu_ns(pid_t pid)
{
    char path[64], buf[1024];
    uint64_t ticks;
    int64_t ns = kvf_bench_pid_schedstat_ns(pid);
    long hz;
    FILE *f;

    if (ns >= 0) {
        return (uint64_t)ns;
    }
    /* no schedstat (CONFIG_SCHED_INFO off): clock ticks of all threads */
    snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
    f = fopen(path, "r");
    if (f == NULL) {
        return 0;
    }
    ticks = 0;
    if ((fgets(buf, sizeof(buf), f) == NULL) ||
        (kvf_bench_stat_cpu_ticks(buf, &ticks) != 0)) {
        ticks = 0;
    }
    fclose(f);
    hz = sysconf(_SC_CLK_TCK);
    return (hz > 0) ? ticks * (KVF_NSEC_PER_SEC / (uint64_t)hz) : 0;
}

/* Where tools/bench/peers.py lives: the source tree this binary was built
 * from (meson passes it to kvf-bench; other users of this file do not run
 * the peers). */
#ifndef KVF_SOURCE_ROOT
#define KVF_SOURCE_ROOT "."
#endif

/* Appends @p fmt to @p buf at *@p off, never past @p len. */
static void kvf_bench_appendf(char *buf, size_t len, size_t *off,
                              const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static void kvf_bench_appendf(char *buf, size_t len, size_t *off,
                              const char *fmt, ...)
{
    va_list ap;
    int n;

    if (*off >= len) {
        return;
    }
    va_start(ap, fmt);
    n = vsnprintf(buf + *off, len - *off, fmt, ap);
    va_end(ap);
    if (n > 0) {
        *off += ((size_t)n < len - *off) ? (size_t)n : len - *off - 1;
    }
}

/* Both peers failed for @p why: null figures and the reason. */
static void kvf_bench_peers_fail(char *json, size_t len, const char *why)
{
    size_t off = 0;

    kvf_bench_appendf(json, len, &off,
                      ",\"mooncake_te_GBps\":null,\"mooncake_te_reason\":"
                      "\"%s\",\"nixl_GBps\":null,\"nixl_reason\":\"%s\"",
                      why, why);
}

void kvf_bench_peers_run(const char *op, uint64_t size, uint64_t count,
                         uint64_t batch, char *json, size_t len)
{
    const char *venv = getenv("KVF_BENCH_PEERS_VENV");
    char cmd[PATH_MAX * 3], python[PATH_MAX], line[4096];
    size_t n, off = 0;
    FILE *f;

    json[0] = '\0';
    if (venv == NULL) {
        venv = KVF_SOURCE_ROOT "/build/peers-venv";
    }
    /* the environment: made once, then only checked (tools/bench) */
    snprintf(cmd, sizeof(cmd),
             "cd '%s' && tools/bench/setup-peers.sh '%s' 2>/dev/null",
             KVF_SOURCE_ROOT, venv);
    fprintf(stderr, "kvf-bench: peers: %s\n", cmd);
    f         = popen(cmd, "r");
    python[0] = '\0';
    if (f != NULL) {
        if (fgets(python, sizeof(python), f) == NULL) {
            python[0] = '\0';
        }
        if (pclose(f) != 0) {
            python[0] = '\0';
        }
    }
    n         = strcspn(python, "\n");
    python[n] = '\0';
    if (n == 0) {
        kvf_bench_peers_fail(json, len,
                             "tools/bench/setup-peers.sh could not make the "
                             "environment (package index unreachable?)");
        return;
    }
    snprintf(cmd, sizeof(cmd),
             "cd '%s' && '%s' tools/bench/peers.py --size %" PRIu64
             " --count %" PRIu64 " --batch %" PRIu64 " --op %s 2>/dev/null",
             KVF_SOURCE_ROOT, python, size, count, batch, op);
    fprintf(stderr, "kvf-bench: peers: %s\n", cmd);
    f = popen(cmd, "r");
    if (f == NULL) {
        kvf_bench_peers_fail(json, len, "popen failed");
        return;
    }
    /* the last line that is one JSON object: spliced into ours */
    while (fgets(line, sizeof(line), f) != NULL) {
        n       = strcspn(line, "\n");
        line[n] = '\0';
        if ((n > 2) && (line[0] == '{') && (line[n - 1] == '}')) {
            off         = 0;
            line[n - 1] = '\0';
            kvf_bench_appendf(json, len, &off, ",%s", line + 1);
        }
    }
    if ((pclose(f) != 0) || (off == 0)) {
        kvf_bench_peers_fail(json, len, "tools/bench/peers.py failed");
    }
}

int kvf_bench_begin(const char *bench, const kvf_config_schema_t *schema,
                    void *opts, int argc, char **argv,
                    const char *const *transport, char *dir, size_t dir_len)
{
    kvf_config_error_t err;
    int argi;

    if ((argc > 1) && (strcmp(argv[1], "--help") == 0)) {
        printf("usage: kvf-bench %s [options]\n", bench);
        kvf_config_print_help(schema, stdout);
        return 0;
    }
    if (kvf_config_load(schema, opts, argc, (const char *const *)argv, &argi,
                        &err) != KVF_OK) {
        fprintf(stderr, "kvf-bench %s: %s\n", bench, err.msg);
        return 1;
    }
    if ((strcmp(*transport, "tcp") != 0) && (strcmp(*transport, "shm") != 0)) {
        /* UCX 1.13's shared-memory transports do not connect in the
         * peer-failure error mode the agents need (docs/performance.md);
         * "shm" is the agents' own same-host path (agent/local.h) */
        fprintf(stderr,
                "kvf-bench %s: transport '%s' is not supported by the "
                "agents with this UCX; use tcp\n",
                bench, *transport);
        return 2;
    }
    snprintf(dir, dir_len, "/tmp/kvf-bench-%s-XXXXXX", bench);
    if (mkdtemp(dir) == NULL) {
        dir[0] = '\0';
        return 1;
    }
    return -1;
}

void kvf_bench_fill(uint64_t seed, uint8_t *p, uint64_t len)
{
    uint64_t x = seed, i;

    for (i = 0; i + 8 <= len; i += 8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        memcpy(p + i, &x, 8);
    }
}

int kvf_bench_end(const char *dir, int rc)
{
    char cmd[128];

    if (dir[0] == '\0') {
        return rc;
    }
    if ((getenv("KVF_BENCH_KEEP") != NULL) || (rc != 0)) {
        fprintf(stderr, "kvf-bench: logs kept in %s\n", dir);
        return rc;
    }
    snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
    if ((rc == 0) && (system(cmd) != 0)) {
        return 1;
    }
    return rc;
}

double kvf_bench_memcpy_gbps(uint64_t size, uint64_t chunks)
{
    uint64_t n = chunks, best = UINT64_MAX, t0, i;
    uint8_t *src, *dst;
    int pass;

    /* at most 512 MiB each way: larger runs cycle through the buffers */
    while ((n > 1) && (n * size > (512ull << 20))) {
        n--;
    }
    src = malloc(n * size);
    dst = malloc(n * size);
    if ((src == NULL) || (dst == NULL) || (chunks == 0)) {
        free(src);
        free(dst);
        return 0.0;
    }
    memset(src, 0x5a, n * size);
    memset(dst, 0, n * size);
    for (pass = 0; pass < 3; pass++) {
        t0 = kvf_time_now_ns();
        for (i = 0; i < chunks; i++) {
            memcpy(dst + (i % n) * size, src + (i % n) * size, size);
        }
        t0   = kvf_time_now_ns() - t0;
        best = (t0 < best) ? t0 : best;
    }
    /* a byte of the copy escapes, so the copies are not optimized away */
    if (dst[size - 1] != 0x5a) {
        best = UINT64_MAX;
    }
    free(src);
    free(dst);
    return (best == 0 || best == UINT64_MAX)
               ? 0.0
               : (double)(chunks * size) / (double)best;
}

uint64_t kvf_bench_chunk_class(uint64_t bytes)
{
    uint64_t pow2 = 4096;

    while (pow2 < bytes) {
        pow2 <<= 1;
    }
    return pow2;
}

void kvf_bench_pair_start(kvf_bench_pair_t *pair, const char *transport,
                          uint64_t pool, uint64_t max_chunk,
                          const char *const names[2],
                          const char *const *const extra[2])
{
    char ctl_bin[PATH_MAX + 64], agent_bin[PATH_MAX + 64], log[192];
    char pool_arg[32], maxc_arg[32];
    const char *argv[48];
    uint16_t port = kvf_bench_free_port();
    int i, n, k;

    /* the agents refuse pools under 1 MiB: small benchmark shapes get a
     * little room to spare */
    snprintf(pool_arg, sizeof(pool_arg), "%" PRIu64,
             (pool > (4ull << 20)) ? pool : (uint64_t)(4u << 20));
    snprintf(maxc_arg, sizeof(maxc_arg), "%" PRIu64, max_chunk);
    kvf_bench_sibling_path("controller/kvf-controller", ctl_bin,
                           sizeof(ctl_bin));
    kvf_bench_sibling_path("agent/kvf-agent", agent_bin, sizeof(agent_bin));
    snprintf(pair->ctl_addr, sizeof(pair->ctl_addr), "127.0.0.1:%u", port);
    snprintf(log, sizeof(log), "%s/controller.log", pair->dir);
    {
        const char *cargv[]       = {ctl_bin,  "--listen", pair->ctl_addr,
                                     "--http", "",         "--recovery-window",
                                     "0",      NULL};
        pair->pids[pair->npids++] = kvf_bench_spawn(cargv, log);
    }
    for (i = 0; i < 2; i++) {
        snprintf(pair->sock[i], sizeof(pair->sock[i]), "%s/%s.sock", pair->dir,
                 names[i]);
        snprintf(log, sizeof(log), "%s/%s.log", pair->dir, names[i]);
        n         = 0;
        argv[n++] = agent_bin;
        argv[n++] = "--controller";
        argv[n++] = pair->ctl_addr;
        argv[n++] = "--name";
        argv[n++] = names[i];
        argv[n++] = "--socket";
        argv[n++] = pair->sock[i];
        argv[n++] = "--listen";
        argv[n++] = "127.0.0.1:0";
        argv[n++] = "--http";
        argv[n++] = "";
        argv[n++] = "--pool-size";
        argv[n++] = pool_arg;
        argv[n++] = "--max-chunk";
        argv[n++] = maxc_arg;
        argv[n++] = "--transports";
        argv[n++] = (strcmp(transport, "shm") == 0) ? "tcp" : transport;
        argv[n++] = (strcmp(transport, "shm") == 0) ? "--same-host=true"
                                                    : "--same-host=false";
        for (k = 0; (extra[i] != NULL) && (extra[i][k] != NULL) &&
                    (n < (int)(KVF_ARRAY_SIZE(argv)) - 1);
             k++) {
            argv[n++] = extra[i][k];
        }
        argv[n]                   = NULL;
        pair->pids[pair->npids++] = kvf_bench_spawn(argv, log);
    }
}

void kvf_bench_pair_stop(kvf_bench_pair_t *pair)
{
    kvf_bench_stop_all(pair->pids, &pair->npids);
}

double kvf_bench_metric(uint16_t port, const char *name)
{
    static char buf[1 << 16];
    struct sockaddr_in sin;
    char needle[128];
    const char *p;
    size_t off = 0;
    ssize_t n;
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);

    memset(&sin, 0, sizeof(sin));
    sin.sin_family      = AF_INET;
    sin.sin_port        = htons(port);
    sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if ((fd < 0) || (connect(fd, (struct sockaddr *)&sin, sizeof(sin)) != 0)) {
        if (fd >= 0) {
            close(fd);
        }
        return 0;
    }
    n = write(fd, "GET /metrics HTTP/1.0\r\n\r\n", 25);
    while ((n > 0) && (off < sizeof(buf) - 1)) {
        n = read(fd, buf + off, sizeof(buf) - 1 - off);
        off += (n > 0) ? (size_t)n : 0;
    }
    buf[off] = '\0';
    close(fd);
    snprintf(needle, sizeof(needle), "\n%s ", name);
    p = strstr(buf, needle);
    return p == NULL ? 0 : strtod(p + strlen(needle), NULL);
}
