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

#include <stddef.h>
#include <stdint.h>

int kvf_bench_controller_main(int argc, char **argv);
int kvf_bench_p2p_main(int argc, char **argv);
int kvf_bench_pd_main(int argc, char **argv);
int kvf_bench_gpu_main(int argc, char **argv);

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

#endif /* KVF_TOOLS_BENCH_H */
