/* SPDX-License-Identifier: Apache-2.0 */
/* Copyright (c) 2026 The kvfabric authors */
#include "controller/stats.h"

const uint64_t kvf_server_lat_bounds_us[KVF_SERVER_LAT_BUCKETS] = {
    1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 10000, 100000,
};

void kvf_server_latency_observe(kvf_server_latency_t *lat, uint64_t ns)
{
    unsigned b;

    lat->count++;
    lat->sum_ns += ns;
    for (b = 0; b < KVF_SERVER_LAT_BUCKETS; b++) {
        if (ns <= kvf_server_lat_bounds_us[b] * 1000) {
            lat->buckets[b]++;
            break;
        }
    }
}
