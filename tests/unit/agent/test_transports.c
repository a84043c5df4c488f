/* SPDX-License-Identifier: Apache-2.0 */
/* Copyright (c) 2026 The kvfabric authors */
#include "agent/transports.h"
#include "tests/helpers/test_helpers.h"

#include <criterion/criterion.h>

#include <stdio.h>
#include <string.h>

static kvf_transports_t g_t;

static void add_row(const char *name, const char *transports)
{
    kvf_transports_peer_t *row = &g_t.peers[g_t.num_peers++];

    snprintf(row->name, sizeof(row->name), "%s", name);
    snprintf(row->transports, sizeof(row->transports), "%s", transports);
}

static void transports_setup(void)
{
    kvf_transports_init(&g_t, "test", NULL);
}

TestSuite(transports, .init = transports_setup, .timeout = 10);

Test(transports, summary_is_distinct_sorted_names)
{
    char buf[KVF_TRANSPORTS_SUMMARY_MAX];

    kvf_transports_summary(&g_t, buf, sizeof(buf));
    cr_assert_str_eq(buf, "", "no peer yet");
    add_row("b", "tcp/lo");
    kvf_transports_summary(&g_t, buf, sizeof(buf));
    cr_assert_str_eq(buf, "tcp");
    add_row("c", "rc_mlx5/mlx5_0:1,tcp/eth0");
    add_row("d", "tcp/eth1");
    add_row("e", ""); /* UCX did not say: no name */
    add_row("f", "cma/memory,posix/memory");
    g_t.peers[4].refused = true; /* it ran over them all the same */
    kvf_transports_summary(&g_t, buf, sizeof(buf));
    cr_assert_str_eq(buf, "cma,posix,rc_mlx5,tcp");
}

Test(transports, summary_is_bounded)
{
    static const char *const names[] = {
        "cma",      "cuda_copy", "cuda_ipc", "dc_mlx5",  "gdr_copy", "posix",
        "rc_mlx5",  "rc_verbs",  "self",     "sysv",     "tcp",      "ud_mlx5",
        "ud_verbs", "xpmem",     "knem",     "rocm_copy"};
    char buf[KVF_TRANSPORTS_SUMMARY_MAX], small[8], tiny[2];
    size_t i;

    for (i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        char row[96];

        snprintf(row, sizeof(row), "%s/dev%zu", names[i], i);
        add_row("p", row);
    }
    kvf_transports_summary(&g_t, buf, sizeof(buf));
    cr_assert_lt(strlen(buf), sizeof(buf));
    cr_assert(strncmp(buf, "cma,cuda_copy,cuda_ipc,", 23) == 0, "%s", buf);
    cr_assert_str_eq(buf + strlen(buf) - 2, ",+", "%s", buf);
    kvf_transports_summary(&g_t, small, sizeof(small));
    cr_assert_str_eq(small, "cma,+");
    kvf_transports_summary(&g_t, tiny, sizeof(tiny));
    cr_assert_str_eq(tiny, "+");
}

Test(transports, quiet_rows_leave_the_summary)
{
    char buf[KVF_TRANSPORTS_SUMMARY_MAX];
    unsigned i;

    add_row("a", "rc_mlx5/mlx5_0:1");
    add_row("b", "tcp/eth0");
    g_t.peers[0].uses = 5;
    g_t.peers[1].uses = 7;
    kvf_transports_age(&g_t);
    kvf_transports_summary(&g_t, buf, sizeof(buf));
    cr_assert_str_eq(buf, "rc_mlx5,tcp");
    /* b goes quiet; a keeps getting messages */
    for (i = 0; i < KVF_TRANSPORTS_IDLE_MAX; i++) {
        g_t.peers[0].uses++;
        kvf_transports_age(&g_t);
        kvf_transports_summary(&g_t, buf, sizeof(buf));
        if (i + 1 < KVF_TRANSPORTS_IDLE_MAX) {
            cr_assert_str_eq(buf, "rc_mlx5,tcp", "heartbeat %u", i);
        }
    }
    cr_assert_str_eq(buf, "rc_mlx5", "the quiet tcp peer left the summary");
    /* a message through it again brings it back */
    g_t.peers[1].uses++;
    kvf_transports_age(&g_t);
    kvf_transports_summary(&g_t, buf, sizeof(buf));
    cr_assert_str_eq(buf, "rc_mlx5,tcp");
}
