/* SPDX-License-Identifier: Apache-2.0 */
/* Copyright (c) 2026 The kvfabric authors */
#include "tools/bench/bench.h"

#include "common/byteorder.h"
#include "common/version.h"

#include <stdio.h>
#include <string.h>

typedef struct kvf_bench_cmd {
    const char *name;
    int (*main)(int argc, char **argv);
    const char *help;
} kvf_bench_cmd_t;

static const kvf_bench_cmd_t kvf_bench_cmds[] = {
    {"controller", kvf_bench_controller_main,
     "controller ADMIT/LOOKUP throughput and latency vs redis MGET"},
    {"p2p", kvf_bench_p2p_main,
     "peer-to-peer chunk fetch between two agents vs ucx_perftest"},
    {"pd", kvf_bench_pd_main,
     "prefill->decode push between two agents vs ucx_perftest"},
    {"gpu", kvf_bench_gpu_main, "paged-KV <-> chunk pack/unpack vs memcpy"},
    {"load-agent", kvf_bench_load_agent_main,
     "N concurrent engine clients against one agent"},
    {"load-controller", kvf_bench_load_controller_main,
     "N simulated agents (register, heartbeat, admit/evict, lookup)"},
    {"disk", kvf_bench_disk_main,
     "the agent's local-disk tier: write-behind and read-back vs fio"},
    {"index", kvf_bench_index_main,
     "router index: /v1/index/query and /v1/route latency at N keys"},
    {"secret-cost", kvf_bench_secret_main,
     "p2p or pd without and with the cluster secret, paired, one run"},
};

static void kvf_bench_usage(FILE *out)
{
    size_t i;

    fprintf(out, "usage: kvf-bench BENCHMARK [options]  (BENCHMARK --help "
                 "for its options)\n\nbenchmarks:\n");
    for (i = 0; i < KVF_ARRAY_SIZE(kvf_bench_cmds); i++) {
        fprintf(out, "  %-11s %s\n", kvf_bench_cmds[i].name,
                kvf_bench_cmds[i].help);
    }
}

int main(int argc, char **argv)
{
    size_t i;

    if ((argc == 2) && (strcmp(argv[1], "--version") == 0)) {
        kvf_version_print("kvf-bench", stdout);
        return 0;
    }
    if ((argc < 2) || (strcmp(argv[1], "--help") == 0) ||
        (strcmp(argv[1], "-h") == 0)) {
        kvf_bench_usage((argc < 2) ? stderr : stdout);
        return (argc < 2) ? 2 : 0;
    }
    for (i = 0; i < KVF_ARRAY_SIZE(kvf_bench_cmds); i++) {
        if (strcmp(argv[1], kvf_bench_cmds[i].name) == 0) {
            return kvf_bench_cmds[i].main(argc - 1, argv + 1);
        }
    }
    fprintf(stderr, "kvf-bench: unknown benchmark '%s'\n", argv[1]);
    kvf_bench_usage(stderr);
    return 2;
}
