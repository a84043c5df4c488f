/* SPDX-License-Identifier: Apache-2.0 */
/* Copyright (c) 2026 The kvfabric authors */
/*
 * kvf-bench secret-cost: what the cluster secret costs the data plane
 * (issue #16.8), measured in one run. Runs `kvf-bench p2p` or `kvf-bench
 * pd` with the same options N times without and N times with a cluster
 * secret (a fresh random one: controller, agents and the bench's engine
 * clients all load it through KVF_CLUSTER_SECRET_FILE), in pairs whose
 * order alternates, so that this machine's drift falls on both sides
 * alike. Prints each run's line on stderr and one JSON line: the medians
 * without and with, the median of the pairs' ratios (with / without) and
 * its quartiles, for GB/s and for the two agents' CPU time per chunk.
 */
#include "tools/bench/bench.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#define KVF_BENCH_SECRET_MAX_PAIRS 200
#define KVF_BENCH_SECRET_MAX_ARGS  64

/* What one run printed. */
typedef struct kvf_bench_secret_run {
    double gbps;
    double cpu_us; /* both agents' CPU time per chunk */
} kvf_bench_secret_run_t;

static void kvf_bench_secret_usage(FILE *out)
{
    fprintf(out,
            "usage: kvf-bench secret-cost [--pairs N] p2p|pd [OPTIONS...]\n"
            "  runs the benchmark N times (default 10) without and N times "
            "with a cluster\n"
            "  secret, in pairs of alternating order (--no-perftest is "
            "added), and prints\n"
            "  the medians and the median ratio with / without for GB/s and "
            "agent CPU\n");
}

/* The number after "KEY": in the JSON line @p line; -1 when absent. */
static double kvf_bench_secret_field(const char *line, const char *key)
{
    char needle[64];
    const char *p;

    snprintf(needle, sizeof(needle), "\"%s\":", key);
    p = strstr(line, needle);
    return (p == NULL) ? -1.0 : strtod(p + strlen(needle), NULL);
}

/* Runs `kvf-bench ARGV...` with @p secret_file as the cluster secret (NULL:
 * none) and reads its last JSON line. 0, or -1 (said on stderr). */
static int kvf_bench_secret_run(char *const *argv, const char *secret_file,
                                kvf_bench_secret_run_t *run)
{
    static const char *const cpu[][2] = {
        {"holder_cpu_us_per_chunk", "requester_cpu_us_per_chunk"},
        {"prefill_cpu_us_per_chunk", "decode_cpu_us_per_chunk"}};
    char line[8192] = "", buf[8192];
    int pfd[2], status = 0, devnull;
    size_t k;
    FILE *f;
    pid_t pid;

    if (pipe(pfd) != 0) {
        fprintf(stderr, "kvf-bench secret-cost: pipe: %s\n", strerror(errno));
        return -1;
    }
    fflush(stdout);
    pid = fork();
    if (pid < 0) {
        fprintf(stderr, "kvf-bench secret-cost: fork: %s\n", strerror(errno));
        close(pfd[0]);
        close(pfd[1]);
        return -1;
    }
    if (pid == 0) {
        devnull = open("/dev/null", O_WRONLY | O_CLOEXEC);
        dup2(pfd[1], STDOUT_FILENO);
        if (devnull >= 0) {
            dup2(devnull, STDERR_FILENO);
        }
        close(pfd[0]);
        close(pfd[1]);
        if (secret_file != NULL) {
            setenv("KVF_CLUSTER_SECRET_FILE", secret_file, 1);
        } else {
            unsetenv("KVF_CLUSTER_SECRET_FILE");
        }
        execv("/proc/self/exe", argv);
        _exit(127);
    }
    close(pfd[1]);
    f = fdopen(pfd[0], "r");
    while ((f != NULL) && (fgets(buf, sizeof(buf), f) != NULL)) {
        if (buf[0] == '{') {
            snprintf(line, sizeof(line), "%s", buf);
        }
    }
    if (f != NULL) {
        fclose(f);
    } else {
        close(pfd[0]);
    }
    waitpid(pid, &status, 0);
    fprintf(stderr, "%s %s", (secret_file != NULL) ? "secret" : "none  ",
            (line[0] != '\0') ? line : "(no result)\n");
    if (!WIFEXITED(status) || (WEXITSTATUS(status) != 0) ||
        (strstr(line, "\"verified\":true") == NULL)) {
        fprintf(stderr,
                "kvf-bench secret-cost: a run failed (exit %d) or did not "
                "verify its bytes\n",
                WIFEXITED(status) ? WEXITSTATUS(status) : -1);
        return -1;
    }
    run->gbps = kvf_bench_secret_field(line, "GBps");
    for (k = 0; k < sizeof(cpu) / sizeof(cpu[0]); k++) {
        double a = kvf_bench_secret_field(line, cpu[k][0]);
        double b = kvf_bench_secret_field(line, cpu[k][1]);

        if ((a >= 0) && (b >= 0)) {
            run->cpu_us = a + b;
            return 0;
        }
    }
    fprintf(stderr, "kvf-bench secret-cost: no agent CPU in the result\n");
    return -1;
}

static int kvf_bench_secret_cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;

    return (x > y) - (x < y);
}

/* The @p pct (0..100) percentile of @p v (sorted in place). */
static double kvf_bench_secret_pct(double *v, size_t n, double pct)
{
    qsort(v, n, sizeof(*v), kvf_bench_secret_cmp);
    return v[(size_t)((pct / 100.0) * (double)(n - 1) + 0.5)];
}

/* A fresh random secret in a 0600 file under @p dir; 0 or -1. */
static int kvf_bench_secret_make(const char *dir, char *path, size_t len)
{
    uint8_t key[32];
    int fd;

    snprintf(path, len, "%s/secret", dir);
    if (getrandom(key, sizeof(key), 0) != (ssize_t)sizeof(key)) {
        return -1;
    }
    fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0) {
        return -1;
    }
    if (write(fd, key, sizeof(key)) != (ssize_t)sizeof(key)) {
        close(fd);
        return -1;
    }
    return close(fd);
}

static char kvf_bench_secret_prog[]        = "kvf-bench";
static char kvf_bench_secret_no_perftest[] = "--no-perftest";

int kvf_bench_secret_main(int argc, char **argv)
{
    static kvf_bench_secret_run_t none[KVF_BENCH_SECRET_MAX_PAIRS],
        with[KVF_BENCH_SECRET_MAX_PAIRS];
    double a[KVF_BENCH_SECRET_MAX_PAIRS], b[KVF_BENCH_SECRET_MAX_PAIRS],
        r[KVF_BENCH_SECRET_MAX_PAIRS], c[KVF_BENCH_SECRET_MAX_PAIRS], g[2],
        cpu[2], rq[3], cq[3];
    char *child[KVF_BENCH_SECRET_MAX_ARGS];
    char dir[]          = "/tmp/kvf-bench-secret-XXXXXX", secret[64];
    unsigned long pairs = 10;
    int i = 1, n = 0, rc = 1;
    bool made = false;
    size_t p;

    if ((argc >= 2) &&
        ((strcmp(argv[1], "--help") == 0) || (strcmp(argv[1], "-h") == 0))) {
        kvf_bench_secret_usage(stdout);
        return 0;
    }
    if ((i + 1 < argc) && (strcmp(argv[i], "--pairs") == 0)) {
        char *end;

        pairs = strtoul(argv[i + 1], &end, 10);
        if ((*end != '\0') || (pairs < 1) ||
            (pairs > KVF_BENCH_SECRET_MAX_PAIRS)) {
            fprintf(stderr, "kvf-bench secret-cost: --pairs takes 1..%d\n",
                    KVF_BENCH_SECRET_MAX_PAIRS);
            return 1;
        }
        i += 2;
    }
    if ((i >= argc) ||
        ((strcmp(argv[i], "p2p") != 0) && (strcmp(argv[i], "pd") != 0)) ||
        (argc - i + 3 > KVF_BENCH_SECRET_MAX_ARGS)) {
        kvf_bench_secret_usage(stderr);
        return 1;
    }
    child[n++] = kvf_bench_secret_prog;
    for (; i < argc; i++) {
        child[n++] = argv[i];
    }
    child[n++] = kvf_bench_secret_no_perftest;
    child[n]   = NULL;
    made       = (mkdtemp(dir) != NULL);
    if (!made || (kvf_bench_secret_make(dir, secret, sizeof(secret)) != 0)) {
        fprintf(stderr, "kvf-bench secret-cost: cannot write a secret: %s\n",
                strerror(errno));
        goto out;
    }
    for (p = 0; p < pairs; p++) {
        /* alternate which goes first: drift and warm caches even out */
        bool secret_first = (p % 2) == 1;

        if ((kvf_bench_secret_run(child, secret_first ? secret : NULL,
                                  secret_first ? &with[p] : &none[p]) != 0) ||
            (kvf_bench_secret_run(child, secret_first ? NULL : secret,
                                  secret_first ? &none[p] : &with[p]) != 0)) {
            goto out;
        }
        a[p] = none[p].gbps;
        b[p] = with[p].gbps;
        r[p] = (none[p].gbps > 0) ? with[p].gbps / none[p].gbps : 0.0;
        c[p] = (none[p].cpu_us > 0) ? with[p].cpu_us / none[p].cpu_us : 0.0;
    }
    g[0] = kvf_bench_secret_pct(a, pairs, 50);
    g[1] = kvf_bench_secret_pct(b, pairs, 50);
    for (p = 0; p < pairs; p++) {
        a[p] = none[p].cpu_us;
        b[p] = with[p].cpu_us;
    }
    cpu[0] = kvf_bench_secret_pct(a, pairs, 50);
    cpu[1] = kvf_bench_secret_pct(b, pairs, 50);
    rq[0]  = kvf_bench_secret_pct(r, pairs, 25);
    rq[1]  = kvf_bench_secret_pct(r, pairs, 50);
    rq[2]  = kvf_bench_secret_pct(r, pairs, 75);
    cq[0]  = kvf_bench_secret_pct(c, pairs, 25);
    cq[1]  = kvf_bench_secret_pct(c, pairs, 50);
    cq[2]  = kvf_bench_secret_pct(c, pairs, 75);
    printf("{\"bench\":\"secret-cost\",\"of\":\"%s\",\"pairs\":%lu"
           ",\"GBps_none\":%.3f,\"GBps_secret\":%.3f"
           ",\"GBps_ratio_p25\":%.3f,\"GBps_ratio_median\":%.3f"
           ",\"GBps_ratio_p75\":%.3f"
           ",\"agents_cpu_us_per_chunk_none\":%.1f"
           ",\"agents_cpu_us_per_chunk_secret\":%.1f"
           ",\"cpu_ratio_p25\":%.3f,\"cpu_ratio_median\":%.3f"
           ",\"cpu_ratio_p75\":%.3f}\n",
           child[1], pairs, g[0], g[1], rq[0], rq[1], rq[2], cpu[0], cpu[1],
           cq[0], cq[1], cq[2]);
    rc = 0;

out:
    if (made) {
        unlink(secret);
        rmdir(dir);
    }
    return rc;
}
