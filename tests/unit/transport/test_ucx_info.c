/* SPDX-License-Identifier: Apache-2.0 */
/* Copyright (c) 2026 The kvfabric authors */
/*
 * Transport truth's matching (transport/ucx_info.c): what a connection runs
 * on against expect_transports.
 */
#include "transport/ucx.h"

#include <criterion/criterion.h>

Test(ucx_info, every_transport_in_use_must_be_expected)
{
    cr_assert(kvf_ucx_transports_match("tcp/lo", ""));
    cr_assert(kvf_ucx_transports_match("tcp/lo", NULL));
    cr_assert(kvf_ucx_transports_match("tcp/lo", "tcp"));
    cr_assert(kvf_ucx_transports_match("tcp/lo", "rc,tcp"));
    cr_assert_not(kvf_ucx_transports_match("tcp/lo", "rc"),
                  "the silent fallback is refused");
    /* "rc" covers rc_verbs and rc_mlx5, not a name that merely starts so */
    cr_assert(kvf_ucx_transports_match("rc_mlx5/mlx5_0:1", "rc"));
    cr_assert(kvf_ucx_transports_match("rc_verbs/mlx5_0:1", "rc"));
    cr_assert_not(kvf_ucx_transports_match("rcx/dev", "rc"));
    cr_assert_not(kvf_ucx_transports_match("ud_mlx5/mlx5_0:1", "rc"));
    /* one lane over something else is enough to refuse */
    cr_assert_not(kvf_ucx_transports_match("rc_mlx5/mlx5_0:1,tcp/eth0", "rc"));
    cr_assert(kvf_ucx_transports_match("rc_mlx5/mlx5_0:1,tcp/eth0", "rc,tcp"));
    /* "sm" names UCX's shared-memory transports */
    cr_assert(kvf_ucx_transports_match("posix/memory,cma/memory", "sm"));
    cr_assert_not(kvf_ucx_transports_match("tcp/lo", "sm"));
    /* UCX said nothing: refused when a list is set */
    cr_assert_not(kvf_ucx_transports_match("", "rc"));
    cr_assert_not(kvf_ucx_transports_match(NULL, "rc"));
}
