/* SPDX-License-Identifier: Apache-2.0 */
/* Copyright (c) 2026 The kvfabric authors */
#include "common/config.h"
#include "tests/helpers/test_helpers.h"

#include <criterion/criterion.h>
#include <criterion/parameterized.h>

#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct test_cfg {
    char *name;
    char *devices;
    char *secret_file;
    uint64_t pool_size;
    uint64_t timeout;
    uint64_t workers;
    bool verbose;
    int role;
    bool keep_running;
} test_cfg_t;

static const char *const roles[] = {"both", "prefill", "decode", NULL};

static const kvf_config_field_t test_fields[] = {
    {"name", KVF_CONFIG_STRING, offsetof(test_cfg_t, name), "node", 0, 0, NULL,
     0, "node name"},
    {"net_devices", KVF_CONFIG_LIST, offsetof(test_cfg_t, devices), "", 0, 0,
     NULL, 0, "devices"},
    {"cluster_secret_file", KVF_CONFIG_STRING,
     offsetof(test_cfg_t, secret_file), NULL, 0, 0, NULL,
     KVF_CONFIG_FIELD_SECRET, "secret"},
    {"pool_size", KVF_CONFIG_SIZE, offsetof(test_cfg_t, pool_size), "1G",
     1 << 20, 1ull << 40, NULL, 0, "pool bytes"},
    {"request_timeout", KVF_CONFIG_DURATION, offsetof(test_cfg_t, timeout),
     "5s", 1000000, 0, NULL, 0, "timeout"},
    {"workers", KVF_CONFIG_UINT, offsetof(test_cfg_t, workers), "2", 1, 64,
     NULL, 0, "threads"},
    {"verbose", KVF_CONFIG_BOOL, offsetof(test_cfg_t, verbose), "false", 0, 0,
     NULL, 0, "chatty"},
    {"role", KVF_CONFIG_ENUM, offsetof(test_cfg_t, role), "both", 0, 0, roles,
     0, "role"},
    {"keep_running", KVF_CONFIG_BOOL, offsetof(test_cfg_t, keep_running),
     "false", 0, 0, NULL, KVF_CONFIG_FIELD_CLI_ONLY, "stay up"},
};

static const kvf_config_schema_t test_schema = {
    "kvf-test", test_fields, sizeof(test_fields) / sizeof(test_fields[0])};

static test_cfg_t g_cfg;
static kvf_config_error_t g_err;

static void config_setup(void)
{
    memset(&g_cfg, 0, sizeof(g_cfg));
    unsetenv("KVF_CONFIG");
    unsetenv("KVF_POOL_SIZE");
    unsetenv("KVF_ROLE");
}

static void config_teardown(void)
{
    kvf_config_cleanup(&test_schema, &g_cfg);
    kvf_test_check_leaks();
}

TestSuite(config, .init = config_setup, .fini = config_teardown, .timeout = 10);

static kvf_status_t load_args(int argc, const char **argv, int *argi_p)
{
    return kvf_config_load(&test_schema, &g_cfg, argc, argv, argi_p, &g_err);
}

static kvf_status_t load_yaml(const char *yaml, char *path_out, size_t len)
{
    const char *path = kvf_test_write_temp(yaml);
    char flag[128];
    const char *argv[] = {"prog", flag, NULL};
    kvf_status_t status;

    cr_assert_not_null(path);
    snprintf(flag, sizeof(flag), "--config=%s", path);
    if (path_out != NULL) {
        snprintf(path_out, len, "%s", path);
    }
    status = load_args(2, argv, NULL);
    unlink(path);
    return status;
}

Test(config, defaults)
{
    const char *argv[] = {"prog", NULL};
    int argi           = -1;

    cr_assert_eq(load_args(1, argv, &argi), KVF_OK, "%s", g_err.msg);
    cr_assert_eq(argi, 1);
    cr_assert_str_eq(g_cfg.name, "node");
    cr_assert_eq(g_cfg.pool_size, 1ull << 30);
    cr_assert_eq(g_cfg.timeout, 5000000000ull);
    cr_assert_eq(g_cfg.workers, 2);
    cr_assert_eq(g_cfg.verbose, false);
    cr_assert_eq(g_cfg.role, 0);
    cr_assert_null(g_cfg.secret_file);
}

Test(config, precedence_file_env_flag)
{
    const char *path =
        kvf_test_write_temp("pool_size: 2G\n"
                            "role: prefill\n"
                            "name: fromfile\n"
                            "net_devices: [mlx5_0:1, mlx5_1:1]\n");
    char flag[128];
    const char *argv[] = {"prog",     flag,        "--name",
                          "fromflag", "--verbose", "--workers=8",
                          "status",   "--json",    NULL};
    int argi;

    snprintf(flag, sizeof(flag), "--config=%s", path);
    setenv("KVF_POOL_SIZE", "3G", 1);
    setenv("KVF_ROLE", "decode", 1);
    cr_assert_eq(load_args(8, argv, &argi), KVF_OK, "%s", g_err.msg);
    unlink(path);
    cr_assert_eq(g_cfg.pool_size, 3ull << 30, "env beats file");
    cr_assert_eq(g_cfg.role, 2, "env beats file");
    cr_assert_str_eq(g_cfg.name, "fromflag", "flag beats file");
    cr_assert_str_eq(g_cfg.devices, "mlx5_0:1,mlx5_1:1");
    cr_assert_eq(g_cfg.verbose, true, "bare boolean flag");
    cr_assert_eq(g_cfg.workers, 8);
    cr_assert_eq(argi, 6, "stops at the first positional word");
}

Test(config, kvf_config_env_names_file)
{
    const char *path   = kvf_test_write_temp("workers: 3\n");
    const char *argv[] = {"prog", NULL};

    setenv("KVF_CONFIG", path, 1);
    cr_assert_eq(load_args(1, argv, NULL), KVF_OK, "%s", g_err.msg);
    unsetenv("KVF_CONFIG");
    unlink(path);
    cr_assert_eq(g_cfg.workers, 3);
}

Test(config, unknown_key_names_file_line_and_key)
{
    char path[128];

    cr_assert_eq(load_yaml("name: a\n\npool_sise: 4G\n", path, sizeof(path)),
                 KVF_ERR_CONFIG);
    cr_assert(strstr(g_err.msg, path) != NULL, "%s", g_err.msg);
    cr_assert(strstr(g_err.msg, ":3: unknown key 'pool_sise'") != NULL, "%s",
              g_err.msg);
}

Test(config, wrong_type_names_key_and_value)
{
    cr_assert_eq(load_yaml("pool_size: lots\n", NULL, 0), KVF_ERR_CONFIG);
    cr_assert(strstr(g_err.msg, ":1: key 'pool_size': 'lots' is not a size") !=
                  NULL,
              "%s", g_err.msg);
    cr_assert_eq(load_yaml("verbose: maybe\n", NULL, 0), KVF_ERR_CONFIG);
    cr_assert(strstr(g_err.msg, "'maybe' is not a boolean") != NULL, "%s",
              g_err.msg);
    cr_assert_eq(load_yaml("role: encoder\n", NULL, 0), KVF_ERR_CONFIG);
    cr_assert(strstr(g_err.msg, "not one of: both, prefill, decode") != NULL,
              "%s", g_err.msg);
    cr_assert_eq(load_yaml("workers: [1, 2]\n", NULL, 0), KVF_ERR_CONFIG);
    cr_assert(strstr(g_err.msg, "not a list") != NULL, "%s", g_err.msg);
    cr_assert_eq(load_yaml("name: {a: b}\n", NULL, 0), KVF_ERR_CONFIG);
    cr_assert(strstr(g_err.msg, "not a mapping") != NULL, "%s", g_err.msg);
}

Test(config, out_of_range)
{
    cr_assert_eq(load_yaml("pool_size: 4K\n", NULL, 0), KVF_ERR_CONFIG);
    cr_assert(strstr(g_err.msg, "out of range") != NULL, "%s", g_err.msg);
    cr_assert_eq(load_yaml("workers: 65\n", NULL, 0), KVF_ERR_CONFIG);
    cr_assert(strstr(g_err.msg, "key 'workers'") != NULL, "%s", g_err.msg);
    cr_assert_eq(load_yaml("request_timeout: 10us\n", NULL, 0), KVF_ERR_CONFIG);
    cr_assert(strstr(g_err.msg, "below the minimum") != NULL, "%s", g_err.msg);
    cr_assert_eq(load_yaml("pool_size: 99999999999999999999T\n", NULL, 0),
                 KVF_ERR_CONFIG);
    cr_assert(strstr(g_err.msg, "too large") != NULL, "%s", g_err.msg);
}

Test(config, bad_yaml_reports_line)
{
    cr_assert_eq(load_yaml("name: a\nrole: \"both\n", NULL, 0), KVF_ERR_CONFIG);
    cr_assert(strstr(g_err.msg, "YAML syntax error") != NULL, "%s", g_err.msg);
    cr_assert_eq(load_yaml("- a\n- b\n", NULL, 0), KVF_ERR_CONFIG);
    cr_assert(strstr(g_err.msg, "expected a mapping") != NULL, "%s", g_err.msg);
    cr_assert_eq(load_yaml("name: a\nname: b\n", NULL, 0), KVF_ERR_CONFIG);
    cr_assert(strstr(g_err.msg, ":2: key 'name' appears twice") != NULL, "%s",
              g_err.msg);
}

Test(config, empty_file_is_fine)
{
    cr_assert_eq(load_yaml("", NULL, 0), KVF_OK, "%s", g_err.msg);
    cr_assert_eq(load_yaml("# only a comment\n", NULL, 0), KVF_OK, "%s",
                 g_err.msg);
    cr_assert_eq(g_cfg.workers, 2);
}

Test(config, missing_file)
{
    const char *argv[] = {"prog", "--config", "/nonexistent/kvf.yaml", NULL};

    cr_assert_eq(load_args(3, argv, NULL), KVF_ERR_CONFIG);
    cr_assert(strstr(g_err.msg, "/nonexistent/kvf.yaml: cannot open") != NULL,
              "%s", g_err.msg);
}

Test(config, env_error_names_variable)
{
    const char *argv[] = {"prog", NULL};

    setenv("KVF_POOL_SIZE", "4X", 1);
    cr_assert_eq(load_args(1, argv, NULL), KVF_ERR_CONFIG);
    cr_assert(strstr(g_err.msg, "environment variable KVF_POOL_SIZE") != NULL,
              "%s", g_err.msg);
}

Test(config, flag_errors)
{
    const char *unknown[] = {"prog", "--pool-sise", "1G", NULL};
    const char *novalue[] = {"prog", "--pool-size", NULL};
    const char *single[]  = {"prog", "-v", NULL};
    const char *secret[]  = {"prog", "--cluster-secret-file", "/etc/x", NULL};
    const char *badval[]  = {"prog", "--workers", "-3", NULL};

    cr_assert_eq(load_args(3, unknown, NULL), KVF_ERR_CONFIG);
    cr_assert(strstr(g_err.msg, "unknown flag '--pool-sise'") != NULL, "%s",
              g_err.msg);
    cr_assert_eq(load_args(2, novalue, NULL), KVF_ERR_CONFIG);
    cr_assert(strstr(g_err.msg, "flag --pool-size: needs a value") != NULL,
              "%s", g_err.msg);
    cr_assert_eq(load_args(2, single, NULL), KVF_ERR_CONFIG);
    cr_assert_eq(load_args(3, secret, NULL), KVF_ERR_CONFIG,
                 "secrets never come from the command line");
    cr_assert_eq(load_args(3, badval, NULL), KVF_ERR_CONFIG);
    cr_assert(strstr(g_err.msg, "flag --workers: '-3'") != NULL, "%s",
              g_err.msg);
}

Test(config, cli_only_key_rejected_in_file)
{
    const char *argv[] = {"prog", "--keep-running", NULL};

    cr_assert_eq(load_yaml("keep_running: true\n", NULL, 0), KVF_ERR_CONFIG);
    cr_assert(strstr(g_err.msg, "unknown key 'keep_running'") != NULL);
    cr_assert_eq(load_args(2, argv, NULL), KVF_OK, "%s", g_err.msg);
    cr_assert_eq(g_cfg.keep_running, true);
}

typedef struct size_case {
    char text[24];
    kvf_status_t status;
    uint64_t bytes;
} size_case_t;

ParameterizedTestParameters(config, parse_size)
{
    static size_case_t cases[] = {
        {"4096", KVF_OK, 4096},
        {"64K", KVF_OK, 64ull << 10},
        {"64KiB", KVF_OK, 64ull << 10},
        {"512m", KVF_OK, 512ull << 20},
        {"4G", KVF_OK, 4ull << 30},
        {"4GB", KVF_OK, 4ull << 30},
        {"1T", KVF_OK, 1ull << 40},
        {"0", KVF_OK, 0},
        {"", KVF_ERR_INVALID, 0},
        {"G", KVF_ERR_INVALID, 0},
        {"-1G", KVF_ERR_INVALID, 0},
        {"1.5G", KVF_ERR_INVALID, 0},
        {"4X", KVF_ERR_INVALID, 0},
        {"17179869184T", KVF_ERR_RANGE, 0},
        {"99999999999999999999", KVF_ERR_RANGE, 0},
    };
    return cr_make_param_array(size_case_t, cases,
                               sizeof(cases) / sizeof(cases[0]));
}

ParameterizedTest(size_case_t *c, config, parse_size)
{
    uint64_t bytes = 12345;

    cr_assert_eq(kvf_config_parse_size(c->text, &bytes), c->status, "'%s'",
                 c->text);
    if (c->status == KVF_OK) {
        cr_assert_eq(bytes, c->bytes, "'%s'", c->text);
    }
}

typedef struct duration_case {
    char text[24];
    kvf_status_t status;
    uint64_t ns;
} duration_case_t;

ParameterizedTestParameters(config, parse_duration)
{
    static duration_case_t cases[] = {
        {"500ms", KVF_OK, 500000000ull},
        {"5s", KVF_OK, 5000000000ull},
        {"2m", KVF_OK, 120000000000ull},
        {"1h", KVF_OK, 3600000000000ull},
        {"100us", KVF_OK, 100000ull},
        {"250ns", KVF_OK, 250ull},
        {"0", KVF_OK, 0},
        {"5", KVF_ERR_INVALID, 0},
        {"5 s", KVF_OK, 5000000000ull},
        {"5sec", KVF_ERR_INVALID, 0},
        {"ms", KVF_ERR_INVALID, 0},
        {"99999999999h", KVF_ERR_RANGE, 0},
    };
    return cr_make_param_array(duration_case_t, cases,
                               sizeof(cases) / sizeof(cases[0]));
}

ParameterizedTest(duration_case_t *c, config, parse_duration)
{
    uint64_t ns = 12345;

    cr_assert_eq(kvf_config_parse_duration(c->text, &ns), c->status, "'%s'",
                 c->text);
    if (c->status == KVF_OK) {
        cr_assert_eq(ns, c->ns, "'%s'", c->text);
    }
}

Test(config, parse_hostport)
{
    char host[64];
    uint16_t port = 0;

    cr_assert_eq(
        kvf_config_parse_hostport("127.0.0.1:7000", host, sizeof(host), &port),
        KVF_OK);
    cr_assert_str_eq(host, "127.0.0.1");
    cr_assert_eq(port, 7000);
    cr_assert_eq(
        kvf_config_parse_hostport("[::1]:80", host, sizeof(host), &port),
        KVF_OK);
    cr_assert_str_eq(host, "::1");
    cr_assert_eq(kvf_config_parse_hostport("::1:80", host, sizeof(host), &port),
                 KVF_ERR_INVALID);
    cr_assert_eq(
        kvf_config_parse_hostport("host:70000", host, sizeof(host), &port),
        KVF_ERR_INVALID);
    cr_assert_eq(kvf_config_parse_hostport("host", host, sizeof(host), &port),
                 KVF_ERR_INVALID);
    cr_assert_eq(kvf_config_parse_hostport(":80", host, sizeof(host), &port),
                 KVF_ERR_INVALID);
    cr_assert_eq(kvf_config_parse_hostport("averyveryverylonghostname:1", host,
                                           8, &port),
                 KVF_ERR_INVALID);
}

Test(config, help_lists_every_flag)
{
    char *buf  = NULL;
    size_t len = 0;
    FILE *out  = open_memstream(&buf, &len);

    kvf_config_print_help(&test_schema, out);
    fclose(out);
    cr_assert(strstr(buf, "--pool-size") != NULL);
    cr_assert(strstr(buf, "(default: 1G)") != NULL);
    cr_assert(strstr(buf, "--cluster-secret-file") == NULL);
    cr_assert(strstr(buf, "cluster_secret_file (YAML key or env only)") !=
              NULL);
    free(buf);
}

Test(config, config_file_after_other_flags)
{
    const char *path   = kvf_test_write_temp("pool_size: 8M\nworkers: 3\n");
    const char *argv[] = {"prog",           "--name",   "--config", "--verbose",
                          "--pool-size=2M", "--config", path,       NULL};

    cr_assert_not_null(path);
    cr_assert_eq(load_args(7, argv, NULL), KVF_OK, "%s", g_err.msg);
    unlink(path);
    cr_assert_str_eq(g_cfg.name, "--config", "a flag's value is a value");
    cr_assert(g_cfg.verbose);
    cr_assert_eq(g_cfg.workers, 3, "the file was read");
    cr_assert_eq(g_cfg.pool_size, 2u << 20, "flags still win");
}
