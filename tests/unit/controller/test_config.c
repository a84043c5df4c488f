/* SPDX-License-Identifier: Apache-2.0 */
/* Copyright (c) 2026 The kvfabric authors */
#include "controller/config.h"
#include "tests/helpers/test_helpers.h"

#include <criterion/criterion.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

TestSuite(controller_config, .fini = kvf_test_check_leaks, .timeout = 10);

Test(controller_config, defaults_and_flags)
{
    const char *argv[] = {"kvf-controller", "--listen", "127.0.0.1:0",
                          "--lease", "250ms"};
    kvf_controller_config_t cfg;
    kvf_config_error_t err;
    int argi;

    memset(&cfg, 0, sizeof(cfg));
    cr_assert_eq(kvf_config_load(&kvf_controller_config_schema, &cfg, 5, argv,
                                 &argi, &err),
                 KVF_OK, "%s", err.msg);
    cr_assert_str_eq(cfg.listen, "127.0.0.1:0");
    cr_assert_eq(cfg.lease_ns, 250000000ull);
    cr_assert_eq(cfg.max_frame, 16ull << 20);
    cr_assert_eq(cfg.max_batch, 65536);
    kvf_config_cleanup(&kvf_controller_config_schema, &cfg);
}

Test(controller_config, every_key_is_documented)
{
    const char *path = kvf_test_source_path("docs/configuration.md");
    FILE *f          = fopen(path, "r");
    static char text[1 << 16];
    size_t i, n;

    cr_assert_not_null(f, "%s", path);
    n       = fread(text, 1, sizeof(text) - 1, f);
    text[n] = '\0';
    fclose(f);
    for (i = 0; i < kvf_controller_config_schema.num_fields; i++) {
        const char *name = kvf_controller_config_schema.fields[i].name;
        char needle[80];

        if (kvf_controller_config_schema.fields[i].flags &
            KVF_CONFIG_FIELD_CLI_ONLY) {
            continue; /* a flag, not a key: tests/docs checks flags */
        }
        snprintf(needle, sizeof(needle), "`%s`", name);
        cr_assert_not_null(strstr(text, needle), "key %s not documented", name);
    }
}

Test(controller_config, lease_below_minimum_is_an_error)
{
    const char *argv[] = {"kvf-controller", "--lease", "1ms"};
    kvf_controller_config_t cfg;
    kvf_config_error_t err;
    int argi;

    memset(&cfg, 0, sizeof(cfg));
    cr_assert_eq(kvf_config_load(&kvf_controller_config_schema, &cfg, 3, argv,
                                 &argi, &err),
                 KVF_ERR_CONFIG);
    cr_assert_not_null(strstr(err.msg, "lease"), "%s", err.msg);
    kvf_config_cleanup(&kvf_controller_config_schema, &cfg);
}
