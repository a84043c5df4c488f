/* SPDX-License-Identifier: Apache-2.0 */
/* Copyright (c) 2026 The kvfabric authors */
/*
 * kvf-bench: one binary, one sub-benchmark per file (bench_<name>.c), each
 * printing one JSON line per case/phase on stdout and progress on stderr.
 * Every figure is measured in the run, beside the transport's own ceiling
 * (ucx_perftest, memcpy, iperf3) measured in the same run.
 */
#ifndef KVF_TOOLS_BENCH_H
#define KVF_TOOLS_BENCH_H

#include "common/config.h"

#include <kvfabric/kvfabric.h>

#include <stddef.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

int kvf_bench_controller_main(int argc, char **argv);
int kvf_bench_p2p_main(int argc, char **argv);
int kvf_bench_pd_main(int argc, char **argv);
int kvf_bench_gpu_main(int argc, char **argv);
int kvf_bench_load_agent_main(int argc, char **argv);
int kvf_bench_load_controller_main(int argc, char **argv);
int kvf_bench_index_main(int argc, char **argv);
int kvf_bench_disk_main(int argc, char **argv);
int kvf_bench_secret_main(int argc, char **argv);

/* Sorts @p samples in place and returns the @p pct percentile (0..100);
 * 0 for an empty set. */
uint64_t kvf_bench_percentile(uint64_t *samples, size_t n, double pct);

/* Resident set size of this process in bytes (from /proc/self/statm). */
uint64_t kvf_bench_rss_bytes(void);

/* A free TCP port on 127.0.0.1 (bind to 0, read it, close); 0 on error. */
uint16_t kvf_bench_free_port(void);

/* The value of the Prometheus series @p name (with its labels, as
 * printed) at http://127.0.0.1:@p port/metrics; 0 when it or the port is
 * not there. */
double kvf_bench_metric(uint16_t port, const char *name);

/* The controller to measure: with @p etcd (HA on etcd), the leader
 * published there under @p prefix, else @p controller. 0, or -1 after
 * one line on stderr. */
int kvf_bench_controller_addr(const char *controller, const char *etcd,
                              const char *prefix, char *addr, size_t len);

/* Path of a program built beside kvf-bench: @p rel is relative to the
 * build root ("agent/kvf-agent"). Writes into @p buf. */
void kvf_bench_sibling_path(const char *rel, char *buf, size_t len);

/* Starts argv[0] with stderr to @p log and stdout to /dev/null. */
pid_t kvf_bench_spawn(const char *const argv[], const char *log);

/* SIGTERM and reap @p pids in reverse order; sets *npids to 0. */
void kvf_bench_stop_all(pid_t *pids, int *npids);

/* Connects to the agent at @p sock, retrying for up to @p wait_ns while
 * it starts; calls then time out after 60 s. NULL when it never answers. */
kvf_client_t *kvf_bench_connect(const char *sock, uint64_t wait_ns);

/* Resident set size of process @p pid in bytes; 0 when it is gone. */
uint64_t kvf_bench_pid_rss(pid_t pid);
/* A "kB" line of /proc/@p pid/status (VmRSS, RssAnon, ...), in bytes; 0
 * when absent. */
uint64_t kvf_bench_pid_status(pid_t pid, const char *field);

/* Best of three ucx_perftest ucp_am_bw runs (error mode on, the agents'
 * TCP tuning) for @p transport and @p size: GB/s (1e9 B/s), 0 when
 * ucx_perftest is missing. Busy-polling both sides (the best figure), or
 * with @p is_sleep both sides waiting on events the way the agents do
 * (-E sleep). Prints the command line (kvf_bench_perftest_cmd) to stderr. */
double kvf_bench_perftest_am_bw(const char *transport, uint64_t size,
                                uint64_t iters, bool is_sleep);

/* memcpy of @p chunks buffers of @p size bytes (the same bytes a
 * same-host fetch moves), from and to memory already faulted in, as the
 * agents' pools are: GB/s (1e9 B/s), best of three passes. The reference
 * of `--transport shm`. */
double kvf_bench_memcpy_gbps(uint64_t size, uint64_t chunks);

/* The shell command of one ucx_perftest ceiling run: "SERVER & CLIENT"
 * (what docs/performance.md quotes). */
void kvf_bench_perftest_cmd(char *buf, size_t len, const char *transport,
                            uint16_t port, uint64_t size, uint64_t iters,
                            bool is_sleep);

/* GB/s (1e9 B/s) of a ucx_perftest "Final:" line, whose "MB/s" are MiB/s;
 * -1 for any other line. */
double kvf_bench_perftest_final_gbps(const char *line);

/* On-CPU time of every thread of process @p pid so far, in ns
 * (/proc/PID/task/TID/schedstat; /proc/PID/stat ticks where schedstat is
 * missing); 0 when the process is gone. */
uint64_t kvf_bench_pid_cpu_ns(pid_t pid);

/* utime + stime (clock ticks) from a /proc/PID/stat line into *ticks_p;
 * -1 when the line does not parse. */
int kvf_bench_stat_cpu_ticks(const char *stat, uint64_t *ticks_p);

/*
 * Runs the other engines of tools/bench/peers.py (Mooncake Transfer
 * Engine, NIXL) on loopback with the same chunk @p size, @p count and
 * @p batch per call, @p op "read" (p2p) or "write" (pd), in the
 * environment tools/bench/setup-peers.sh makes ($KVF_BENCH_PEERS_VENV, else
 * build/peers-venv of the source tree; installed on first use). Writes
 * JSON fields to append to the caller's line, each starting with a comma:
 * "mooncake_te_GBps", "_p50_us", "_p99_us", "_verified", the same for
 * "nixl", or "<peer>_GBps":null with "<peer>_reason" when it cannot run.
 */
void kvf_bench_peers_run(const char *op, uint64_t size, uint64_t count,
                         uint64_t batch, char *json, size_t len);

/*
 * The start of a two-agent benchmark: --help (returns 0: print done),
 * options into @p opts (1 on a bad one), the transport (*@p transport,
 * read after loading; 2 when the agents cannot use it) and a fresh
 * temporary directory for sockets and logs written to @p dir (1 when it
 * cannot be made): the exit status, or -1 to go on. Messages go to
 * stderr.
 */
int kvf_bench_begin(const char *bench, const kvf_config_schema_t *schema,
                    void *opts, int argc, char **argv,
                    const char *const *transport, char *dir, size_t dir_len);

/* Fills @p len bytes (whole 8-byte words) at @p p with xorshift64 from
 * @p seed (not 0): chunk contents the benchmarks verify. */
void kvf_bench_fill(uint64_t seed, uint8_t *p, uint64_t len);

/* A controller and two agents on loopback, for the two-agent benchmarks. */
typedef struct kvf_bench_pair {
    char dir[64]; /* sockets and logs (kvf_bench_begin makes it) */
    char ctl_addr[64];
    pid_t pids[3];
    int npids;
    char sock[2][128];
} kvf_bench_pair_t;

/* The smallest power of two (at least 4 KiB) holding @p bytes: the
 * agents' max_chunk for chunks of that size. */
uint64_t kvf_bench_chunk_class(uint64_t bytes);

/*
 * Starts kvf-controller and two kvf-agents named @p names with sockets in
 * @p pair->dir, no HTTP, @p pool bytes of pool, chunks up to @p max_chunk,
 * UCX over @p transport ("shm": UCX over tcp, fetches between the two by
 * the same-host path; otherwise that path is off), plus each agent's
 * @p extra flags (NULL-terminated
 * list, or NULL). Logs go to DIR/NAME.log.
 */
void kvf_bench_pair_start(kvf_bench_pair_t *pair, const char *transport,
                          uint64_t pool, uint64_t max_chunk,
                          const char *const names[2],
                          const char *const *const extra[2]);

/* SIGTERM and reap what kvf_bench_pair_start started. */
void kvf_bench_pair_stop(kvf_bench_pair_t *pair);

/* Removes @p dir (when made) after a successful run; returns @p rc, or 1
 * when the removal failed. Logs of a failed run stay for a look. */
int kvf_bench_end(const char *dir, int rc);

#endif /* KVF_TOOLS_BENCH_H */
