/* SPDX-License-Identifier: Apache-2.0 */
/* Copyright (c) 2026 The kvfabric authors */
#include "common/byteorder.h"
#include "tests/helpers/test_helpers.h"

#include <criterion/criterion.h>

TestSuite(byteorder, .fini = kvf_test_check_leaks, .timeout = 10);

Test(byteorder, wire_bytes_are_little_endian_at_any_alignment)
{
    uint8_t buf[17] = {0};

    kvf_le64_put(buf + 1, 0x0102030405060708ull);
    cr_assert_eq(buf[1], 0x08);
    cr_assert_eq(buf[8], 0x01);
    cr_assert_eq(kvf_le64_get(buf + 1), 0x0102030405060708ull);
    kvf_le32_put(buf + 9, 0xa1b2c3d4u);
    cr_assert_eq(buf[9], 0xd4);
    cr_assert_eq(kvf_le32_get(buf + 9), 0xa1b2c3d4u);
    kvf_le16_put(buf + 13, 0xbeefu);
    cr_assert_eq(buf[13], 0xef);
    cr_assert_eq(kvf_le16_get(buf + 13), 0xbeefu);
    cr_assert_eq(KVF_ARRAY_SIZE(buf), 17);
}
