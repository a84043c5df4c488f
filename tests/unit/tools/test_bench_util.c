/* SPDX-License-Identifier: Apache-2.0 */
/* Copyright (c) 2026 The kvfabric authors */
/*
 * kvf-bench's helpers that turn other programs' output into figures: the
 * ucx_perftest ceiling line (MiB/s printed as "MB/s", reported as GB/s)
 * and the CPU time of an agent process from /proc.
 */
#include "tests/helpers/test_helpers.h"
#include "tools/bench/bench.h"

#include <criterion/criterion.h>

#include <math.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

TestSuite(bench_util, .fini = kvf_test_check_leaks, .timeout = 30);

/* ucx_perftest 1.13 prints 4768.37 "MB/s" for 5e9 B/s: that is 5.00 GB/s
 * (4768.37 * 2^20 / 1e9), not 4.77 */
Test(bench_util, perftest_final_line_is_mib_per_second)
{
    static const char line[] =
        "Final:               100     0.000    52.429    52.429     4768.37  "
        "    4768.37          19073          19073\n";
    double gbps = kvf_bench_perftest_final_gbps(line);

    cr_assert(fabs(gbps - 5.0) < 0.001, "got %f GB/s", gbps);
    cr_assert_lt(kvf_bench_perftest_final_gbps("+----+ overall bandwidth\n"),
                 0.0);
    cr_assert_lt(kvf_bench_perftest_final_gbps("Final: n/a\n"), 0.0);
    cr_assert_lt(kvf_bench_perftest_final_gbps(""), 0.0);
}

/* Both modes come from the command line the docs quote: tuned TCP
 * segments, PEER error mode (-e), -E poll or -E sleep on both sides. */
Test(bench_util, perftest_command_line)
{
    char cmd[1024];

    kvf_bench_perftest_cmd(cmd, sizeof(cmd), "tcp", 4242, 1 << 20, 64, true);
    cr_assert_str_eq(
        cmd, "env UCX_TLS=tcp UCX_TCP_TX_SEG_SIZE=256K "
             "UCX_TCP_RX_SEG_SIZE=256K ucx_perftest -p 4242 -E sleep & "
             "env UCX_TLS=tcp UCX_TCP_TX_SEG_SIZE=256K "
             "UCX_TCP_RX_SEG_SIZE=256K ucx_perftest 127.0.0.1 -p 4242 -t "
             "ucp_am_bw -s 1048576 -n 100 -e -E sleep");
    kvf_bench_perftest_cmd(cmd, sizeof(cmd), "tcp", 1, 4096, 500, false);
    cr_assert_not_null(strstr(cmd, "-p 1 -E poll & "), "%s", cmd);
    cr_assert_not_null(strstr(cmd, "-s 4096 -n 500 -e -E poll"), "%s", cmd);
}

/* utime and stime are fields 14 and 15; a comm with spaces and ')' must
 * not shift them */
Test(bench_util, proc_stat_cpu_ticks)
{
    uint64_t ticks = 0;

    cr_assert_eq(kvf_bench_stat_cpu_ticks(
                     "1234 (kvf agent) x) S 1 1234 1234 0 -1 4194560 "
                     "250 0 0 0 37 5 0 0 20 0 3 0 100 1000 10",
                     &ticks),
                 0);
    cr_assert_eq(ticks, 42);
    cr_assert_eq(kvf_bench_stat_cpu_ticks("garbage", &ticks), -1);
    cr_assert_eq(kvf_bench_stat_cpu_ticks("1 (x) S 1 2", &ticks), -1);
}

/* The CPU time of a process grows by what it burns, and is 0 once it is
 * gone. */
Test(bench_util, pid_cpu_time)
{
    uint64_t t0 = kvf_bench_pid_cpu_ns(getpid()), t1, spin = 0;
    volatile uint64_t sink = 0;

    while (spin < 20000000) {
        sink = sink + spin++;
    }
    t1 = kvf_bench_pid_cpu_ns(getpid());
    cr_assert_gt(t1, t0, "%lu -> %lu", (unsigned long)t0, (unsigned long)t1);
    cr_assert_eq(kvf_bench_pid_cpu_ns(-5), 0);
}
