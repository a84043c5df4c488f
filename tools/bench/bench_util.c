/* SPDX-License-Identifier: Apache-2.0 */
/* Copyright (c) 2026 The kvfabric authors */
#include "tools/bench/bench.h"

#include <arpa/inet.h>
#include <limits.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
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
