/* SPDX-License-Identifier: Apache-2.0 */
/* Copyright (c) 2026 The kvfabric authors */
#include "tests/helpers/test_helpers.h"

#include <kvfabric/status.h>

#include <criterion/criterion.h>

TestSuite(status, .fini = kvf_test_check_leaks, .timeout = 10);

Test(status, values_are_wire_stable)
{
    /* these numbers travel in error replies: a change breaks old peers */
    cr_assert_eq(KVF_OK, 0);
    cr_assert_eq(KVF_INPROGRESS, 1);
    cr_assert_eq(KVF_ERR_NO_MEMORY, -1);
    cr_assert_eq(KVF_ERR_INVALID, -2);
    cr_assert_eq(KVF_ERR_PROTO, -3);
    cr_assert_eq(KVF_ERR_IO, -4);
    cr_assert_eq(KVF_ERR_TRANSPORT, -5);
    cr_assert_eq(KVF_ERR_TIMEOUT, -6);
    cr_assert_eq(KVF_ERR_NOT_FOUND, -7);
    cr_assert_eq(KVF_ERR_CHECKSUM, -9);
    cr_assert_eq(KVF_ERR_STATE, -20);
}

Test(status, every_code_has_text_and_name)
{
    int s;

    for (s = KVF_ERR_STATE; s <= KVF_INPROGRESS; s++) {
        cr_assert_str_neq(kvf_strerror((kvf_status_t)s), "unknown status",
                          "status %d", s);
        cr_assert_str_neq(kvf_status_name((kvf_status_t)s), "KVF_ERR_UNKNOWN",
                          "status %d", s);
    }
    cr_assert_str_eq(kvf_strerror(KVF_ERR_TIMEOUT), "timed out");
    cr_assert_str_eq(kvf_status_name(KVF_ERR_CHECKSUM), "KVF_ERR_CHECKSUM");
    cr_assert_str_eq(kvf_strerror((kvf_status_t)-999), "unknown status");
    cr_assert_str_eq(kvf_status_name((kvf_status_t)42), "KVF_ERR_UNKNOWN");
}
