/* SPDX-License-Identifier: Apache-2.0 */
/* Copyright (c) 2026 The kvfabric authors */
#include "tools/bench/bench.h"

#include <stdio.h>
#include <stdlib.h>
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
