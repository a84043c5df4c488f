/* SPDX-License-Identifier: Apache-2.0 */
/* Copyright (c) 2026 The kvfabric authors */
#include "transport/verbs.h"

#include "tests/helpers/test_helpers.h"

#include <criterion/criterion.h>

#include <stdlib.h>
#include <string.h>

TestSuite(verbs, .fini = kvf_test_check_leaks, .timeout = 20);

Test(verbs, lists_devices_or_says_there_are_none)
{
    kvf_verbs_device_t *devs = NULL;
    unsigned count           = 99;
    kvf_status_t status;
    char *text = NULL;
    size_t len = 0;
    FILE *out;
    unsigned i;

    status = kvf_verbs_list_devices(&devs, &count);
    out    = open_memstream(&text, &len);
    cr_assert_not_null(out);
    if (status == KVF_ERR_UNSUPPORTED) {
        kvf_verbs_devices_print(out, devs, count);
        fclose(out);
        cr_assert_not_null(strstr(text, "not built"));
        free(text);
        return;
    }
    cr_assert_eq(status, KVF_OK);
    kvf_verbs_devices_print(out, devs, count);
    fclose(out);
    if (count == 0) {
        cr_assert_null(devs);
        cr_assert_str_eq(text, KVF_VERBS_NONE_SENTENCE "\n");
    } else {
        for (i = 0; i < count; i++) {
            cr_assert_neq(devs[i].name[0], '\0');
            cr_assert_not_null(strstr(text, devs[i].name));
        }
    }
    free(text);
    kvf_verbs_devices_free(devs);
    cr_assert_eq(kvf_verbs_list_devices(NULL, &count), KVF_ERR_INVALID);
}
