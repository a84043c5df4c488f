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

#include <kvfabric/kvfabric.h>

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

int kvf_bench_controller_main(int argc, char **argv);
int kvf_bench_p2p_main(int argc, char **argv);
int kvf_bench_pd_main(int argc, char **argv);
int kvf_bench_gpu_main(int argc, char **argv);
int kvf_bench_load_agent_main(int argc, char **argv);
int kvf_bench_load_controller_main(int argc, char **argv);

/* Sorts @p samples in place and returns the @p pct percentile (0..100);
 * 0 for an empty set. */
uint64_t kvf_bench_percentile(uint64_t *samples, size_t n, double pct);

/* Resident set size of this process in bytes (from /proc/self/statm). */
uint64_t kvf_bench_rss_bytes(void);

/* A free TCP port on 127.0.0.1 (bind to 0, read it, close); 0 on error. */
uint16_t kvf_bench_free_port(void);

/* Path of a program built beside kvf-bench: @p rel is relative to the
 * build root ("agent/kvf-agent"). Writes into @p buf. */
void kvf_bench_sibling_path(const char *rel, char *buf, size_t len);

/* Starts argv[0] (a path) with stderr into @p log and stdout to
 * /dev/null; returns its pid, or -1. */
pid_t kvf_bench_spawn(const char *const argv[], const char *log);

/* Connects to the agent at @p sock, retrying for up to @p wait_ns while
 * it starts; calls then time out after 60 s. NULL when it never answers. */
kvf_client_t *kvf_bench_connect(const char *sock, uint64_t wait_ns);

/* Resident set size of process @p pid in bytes; 0 when it is gone. */
uint64_t kvf_bench_pid_rss(pid_t pid);

#endif /* KVF_TOOLS_BENCH_H */
