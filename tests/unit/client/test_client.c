/* SPDX-License-Identifier: Apache-2.0 */
/* Copyright (c) 2026 The kvfabric authors */
/*
 * libkvfabric without an agent: what an engine sees when there is none.
 * Calls against a running agent are in tests/integration/test_client.c.
 */
#include "tests/helpers/test_helpers.h"

#include <kvfabric/kvfabric.h>

#include <criterion/criterion.h>

#include <stdio.h>
#include <string.h>
#include <unistd.h>

TestSuite(client, .fini = kvf_test_check_leaks, .timeout = 10);

static void no_agent_path(char *buf, size_t len)
{
    snprintf(buf, len, "/tmp/kvf-unit-client-%d.sock", (int)getpid());
    unlink(buf);
}

Test(client, connect_without_agent_fails_with_io)
{
    kvf_client_params_t p;
    kvf_client_t *client = NULL;
    char path[108];

    no_agent_path(path, sizeof(path));
    memset(&p, 0, sizeof(p));
    p.field_mask  = KVF_CLIENT_PARAM_SOCKET | KVF_CLIENT_PARAM_SECRET;
    p.socket_path = path;
    p.secret_file = NULL;
    cr_assert_eq(kvf_client_connect(&p, &client), KVF_ERR_IO);
    cr_assert_null(client);
    /* no client to ask: the thread's last connect error names the path */
    cr_assert_not_null(strstr(kvf_client_last_error(NULL), path), "%s",
                       kvf_client_last_error(NULL));
}

Test(client, a_missing_secret_file_is_named)
{
    kvf_client_params_t p;
    kvf_client_t *client = NULL;
    char path[108];

    no_agent_path(path, sizeof(path));
    memset(&p, 0, sizeof(p));
    p.field_mask  = KVF_CLIENT_PARAM_SOCKET | KVF_CLIENT_PARAM_SECRET;
    p.socket_path = path;
    p.secret_file = "/nonexistent/kvf-secret";
    cr_assert_eq(kvf_client_connect(&p, &client), KVF_ERR_CONFIG);
    cr_assert_null(client);
    cr_assert_not_null(
        strstr(kvf_client_last_error(NULL), "/nonexistent/kvf-secret"), "%s",
        kvf_client_last_error(NULL));
}

Test(client, connect_rejects_a_socket_path_too_long)
{
    kvf_client_params_t p;
    kvf_client_t *client = NULL;
    char path[300];

    memset(path, 'x', sizeof(path) - 1);
    path[0]                = '/';
    path[sizeof(path) - 1] = '\0';
    memset(&p, 0, sizeof(p));
    p.field_mask  = KVF_CLIENT_PARAM_SOCKET | KVF_CLIENT_PARAM_SECRET;
    p.socket_path = path;
    cr_assert_eq(kvf_client_connect(&p, &client), KVF_ERR_INVALID);
    cr_assert_null(client);
}
