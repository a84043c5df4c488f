/* SPDX-License-Identifier: Apache-2.0 */
/* Copyright (c) 2026 The kvfabric authors */
/*
 * Proves the leak check works: this test leaks on purpose, so the run must
 * fail (meson should_fail). If kvf_test_check_leaks stopped aborting on
 * LeakSanitizer findings, this would pass and meson would report it.
 */
#include "tests/helpers/test_helpers.h"

#include <criterion/criterion.h>

#include <stdlib.h>
#include <string.h>

TestSuite(leak_check, .fini = kvf_test_check_leaks, .timeout = 10);

static void *volatile g_sink;

Test(leak_check, deliberate_leak_fails_the_run)
{
    char *leaked = malloc(4096);

    cr_assert_not_null(leaked);
    memset(leaked, 1, 4096);
    g_sink = leaked;
    g_sink = NULL; /* the only reference is gone: a definite leak */
}
