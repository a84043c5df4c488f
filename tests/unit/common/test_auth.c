/* SPDX-License-Identifier: Apache-2.0 */
/* Copyright (c) 2026 The kvfabric authors */
/* Known answers computed independently with Python's hmac module. */
#include "common/auth.h"
#include "tests/helpers/test_helpers.h"

#include <criterion/criterion.h>

#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

TestSuite(auth, .fini = kvf_test_check_leaks, .timeout = 10);

static void hex(const char *text, uint8_t *out, size_t len)
{
    size_t i;
    unsigned v;

    for (i = 0; i < len; i++) {
        cr_assert_eq(sscanf(text + 2 * i, "%2x", &v), 1);
        out[i] = (uint8_t)v;
    }
}

static void load_secret(kvf_auth_secret_t *secret)
{
    const char *path =
        kvf_test_write_temp("0123456789abcdef0123456789abcdef\n");
    char err[256];

    chmod(path, 0600);
    cr_assert_eq(kvf_auth_secret_load(path, secret, err, sizeof(err)), KVF_OK,
                 "%s", err);
    unlink(path);
}

static void nonces(uint8_t *nc, uint8_t *ns)
{
    int i;

    for (i = 0; i < KVF_AUTH_NONCE_SIZE; i++) {
        nc[i] = (uint8_t)i;
        ns[i] = (uint8_t)(32 + i);
    }
}

Test(auth, known_answers_both_directions)
{
    kvf_auth_secret_t secret;
    uint8_t nc[32], ns[32], mac[32], expect[32];

    load_secret(&secret);
    cr_assert_eq(secret.len, 32, "trailing newline stripped");
    nonces(nc, ns);
    cr_assert_eq(kvf_auth_mac(&secret, KVF_AUTH_SIDE_SERVER, nc, ns,
                              "controller-1", mac),
                 KVF_OK);
    hex("73a5b098de1e5fb6560de74bb4299136db0eabf3534da4104ef9b73f62ff0ef7",
        expect, 32);
    cr_assert_arr_eq(mac, expect, 32);
    cr_assert_eq(
        kvf_auth_mac(&secret, KVF_AUTH_SIDE_CLIENT, ns, nc, "agent-a", mac),
        KVF_OK);
    hex("a430020b2eb014dd8cdc745e363746f6b9da1d139f73d56e31ac05a43cea16cc",
        expect, 32);
    cr_assert_arr_eq(mac, expect, 32);
    kvf_auth_secret_cleanup(&secret);
    cr_assert_eq(secret.len, 0);
}

Test(auth, verify_rejects_any_change)
{
    kvf_auth_secret_t secret, other;
    uint8_t nc[32], ns[32], mac[32];
    const char *path;
    char err[256];

    load_secret(&secret);
    nonces(nc, ns);
    cr_assert_eq(kvf_auth_mac(&secret, KVF_AUTH_SIDE_CLIENT, ns, nc, "a", mac),
                 KVF_OK);
    cr_assert(
        kvf_auth_verify(&secret, KVF_AUTH_SIDE_CLIENT, ns, nc, "a", mac, 32));
    cr_assert(
        !kvf_auth_verify(&secret, KVF_AUTH_SIDE_SERVER, ns, nc, "a", mac, 32),
        "a client MAC is not a server MAC (no reflection)");
    cr_assert(
        !kvf_auth_verify(&secret, KVF_AUTH_SIDE_CLIENT, nc, ns, "a", mac, 32),
        "swapped nonces");
    cr_assert(
        !kvf_auth_verify(&secret, KVF_AUTH_SIDE_CLIENT, ns, nc, "b", mac, 32),
        "another name");
    cr_assert(
        !kvf_auth_verify(&secret, KVF_AUTH_SIDE_CLIENT, ns, nc, "a", mac, 31),
        "short MAC");
    mac[5] ^= 1;
    cr_assert(
        !kvf_auth_verify(&secret, KVF_AUTH_SIDE_CLIENT, ns, nc, "a", mac, 32));
    mac[5] ^= 1;

    path = kvf_test_write_temp("another-secret-of-enough-length");
    cr_assert_eq(kvf_auth_secret_load(path, &other, err, sizeof(err)), KVF_OK);
    unlink(path);
    cr_assert(
        !kvf_auth_verify(&other, KVF_AUTH_SIDE_CLIENT, ns, nc, "a", mac, 32),
        "another secret");
    cr_assert(
        !kvf_auth_verify(&other, KVF_AUTH_SIDE_CLIENT, ns, nc, "a", NULL, 32));
}

Test(auth, secret_file_errors)
{
    kvf_auth_secret_t secret;
    char err[256], big[KVF_AUTH_SECRET_MAX_SIZE + 2];
    const char *path;

    cr_assert_eq(
        kvf_auth_secret_load("/nonexistent/secret", &secret, err, sizeof(err)),
        KVF_ERR_CONFIG);
    cr_assert(strstr(err, "/nonexistent/secret") != NULL, "%s", err);

    path = kvf_test_write_temp("short\n\n");
    cr_assert_eq(kvf_auth_secret_load(path, &secret, err, sizeof(err)),
                 KVF_ERR_CONFIG);
    unlink(path);
    cr_assert(strstr(err, "holds 5 bytes; at least 16") != NULL, "%s", err);
    cr_assert_eq(secret.len, 0);

    memset(big, 'x', sizeof(big) - 1);
    big[sizeof(big) - 1] = '\0';
    path                 = kvf_test_write_temp(big);
    cr_assert_eq(kvf_auth_secret_load(path, &secret, err, sizeof(err)),
                 KVF_ERR_CONFIG);
    unlink(path);
    cr_assert(strstr(err, "larger than 4096 bytes") != NULL, "%s", err);
}

Test(auth, group_readable_secret_is_refused)
{
    kvf_auth_secret_t secret;
    const char *path = kvf_test_write_temp("0123456789abcdef0123");
    char err[256];

    chmod(path, 0640);
    kvf_test_log_capture_start();
    cr_assert_eq(kvf_auth_secret_load(path, &secret, err, sizeof(err)),
                 KVF_ERR_CONFIG);
    kvf_test_log_capture_stop();
    cr_assert(strstr(err, "accessible by group or others (mode 0640)") != NULL,
              "%s", err);
    cr_assert(strstr(err, "0123456789abcdef") == NULL, "never the secret");
    cr_assert(!kvf_test_log_contains("0123456789abcdef"),
              "the secret is never logged");
    cr_assert_eq(secret.len, 0);
    chmod(path, 0604);
    cr_assert_eq(kvf_auth_secret_load(path, &secret, err, sizeof(err)),
                 KVF_ERR_CONFIG, "world-readable");
    chmod(path, 0400);
    cr_assert_eq(kvf_auth_secret_load(path, &secret, err, sizeof(err)), KVF_OK,
                 "%s", err);
    kvf_auth_secret_cleanup(&secret);
    unlink(path);
}

Test(auth, optional_secret)
{
    kvf_auth_secret_t secret;
    char err[256];

    cr_assert_eq(kvf_auth_secret_load_opt(NULL, &secret, err, sizeof(err)),
                 KVF_OK);
    cr_assert(!kvf_auth_secret_is_set(&secret));
    cr_assert_eq(kvf_auth_secret_load_opt("", &secret, err, sizeof(err)),
                 KVF_OK);
    cr_assert(!kvf_auth_secret_is_set(&secret));
    cr_assert(!kvf_auth_secret_is_set(NULL));
    cr_assert_eq(
        kvf_auth_secret_load_opt("/nonexistent", &secret, err, sizeof(err)),
        KVF_ERR_CONFIG);
}

/* A whole handshake between two sessions, as the wire would carry it.
 * Returns the status of the first step that failed, KVF_OK when both
 * sides end authenticated. */
static kvf_status_t handshake(const kvf_auth_secret_t *client_secret,
                              const kvf_auth_secret_t *server_secret, char *err,
                              size_t err_len)
{
    kvf_auth_session_t client, server;
    uint8_t server_mac[32], client_mac[32];
    kvf_status_t status;
    size_t nonce_len;

    kvf_auth_session_init(&client, client_secret);
    kvf_auth_session_init(&server, server_secret);
    cr_assert_eq(kvf_auth_client_hello(&client, &nonce_len), KVF_OK);
    status = kvf_auth_server_hello(&server, "agent-a", client.own_nonce,
                                   nonce_len, "ctl", server_mac, err, err_len);
    if (status != KVF_OK) {
        return status;
    }
    if (server.state == KVF_AUTH_STATE_DONE) {
        status = kvf_auth_client_reply(&client, NULL, 0, NULL, 0, "ctl",
                                       "agent-a", client_mac, err, err_len);
    } else {
        status =
            kvf_auth_client_reply(&client, server.own_nonce, 32, server_mac, 32,
                                  "ctl", "agent-a", client_mac, err, err_len);
    }
    if ((status != KVF_OK) || (client.state == KVF_AUTH_STATE_DONE)) {
        return status;
    }
    status = kvf_auth_server_finish(&server, client_mac, 32, err, err_len);
    cr_assert_eq(kvf_auth_session_is_done(&server), status == KVF_OK);
    kvf_auth_session_cleanup(&server);
    kvf_auth_session_cleanup(&client);
    return status;
}

Test(auth, handshake_outcomes)
{
    kvf_auth_secret_t secret, other, none;
    const char *path;
    char err[256];

    memset(&none, 0, sizeof(none));
    load_secret(&secret);
    path = kvf_test_write_temp("another-secret-of-enough-length");
    cr_assert_eq(kvf_auth_secret_load(path, &other, err, sizeof(err)), KVF_OK);
    unlink(path);

    cr_assert_eq(handshake(&secret, &secret, err, sizeof(err)), KVF_OK, "%s",
                 err);
    cr_assert_eq(handshake(&none, &none, err, sizeof(err)), KVF_OK,
                 "auth off on both sides");
    cr_assert_eq(handshake(NULL, NULL, err, sizeof(err)), KVF_OK);

    cr_assert_eq(handshake(&other, &secret, err, sizeof(err)), KVF_ERR_AUTH);
    cr_assert(strstr(err, "server failed the cluster-secret challenge") != NULL,
              "the client catches a server with another secret: %s", err);

    cr_assert_eq(handshake(&none, &secret, err, sizeof(err)), KVF_ERR_AUTH);
    cr_assert(strstr(err, "requires the cluster secret") != NULL, "%s", err);
    cr_assert(strstr(err, "cluster_secret_file") != NULL, "%s", err);

    cr_assert_eq(handshake(&secret, &none, err, sizeof(err)), KVF_ERR_AUTH);
    cr_assert(strstr(err, "has no cluster_secret_file") != NULL, "%s", err);
    kvf_auth_secret_cleanup(&other);
    kvf_auth_secret_cleanup(&secret);
}

Test(auth, server_catches_a_wrong_client_mac)
{
    kvf_auth_secret_t secret;
    kvf_auth_session_t server;
    uint8_t nonce[32] = {1}, mac[32];
    char err[256];

    load_secret(&secret);
    kvf_auth_session_init(&server, &secret);
    cr_assert_eq(kvf_auth_server_finish(&server, mac, 32, err, sizeof(err)),
                 KVF_ERR_AUTH, "AUTH before HELLO");
    kvf_auth_session_init(&server, &secret);
    cr_assert_eq(kvf_auth_server_hello(&server, "e", nonce, 31, "a", mac, err,
                                       sizeof(err)),
                 KVF_ERR_AUTH, "short nonce");
    cr_assert(strstr(err, "31 bytes") != NULL, "%s", err);
    kvf_auth_session_init(&server, &secret);
    cr_assert_eq(kvf_auth_server_hello(&server, "e", nonce, 32, "a", mac, err,
                                       sizeof(err)),
                 KVF_OK);
    cr_assert_eq(kvf_auth_server_hello(&server, "e", nonce, 32, "a", mac, err,
                                       sizeof(err)),
                 KVF_ERR_AUTH, "HELLO twice");
    cr_assert(!kvf_auth_session_is_abandoned(&server), "refused, not left");
    kvf_auth_session_init(&server, &secret);
    cr_assert_eq(kvf_auth_server_hello(&server, "e", nonce, 32, "a", mac, err,
                                       sizeof(err)),
                 KVF_OK);
    cr_assert(kvf_auth_session_is_abandoned(&server), "AUTH still due");
    /* the server's own MAC reflected back is not a client MAC */
    cr_assert_eq(kvf_auth_server_finish(&server, mac, 32, err, sizeof(err)),
                 KVF_ERR_AUTH);
    cr_assert(strstr(err, "wrong cluster secret") != NULL, "%s", err);
    cr_assert(!kvf_auth_session_is_done(&server));
    cr_assert(!kvf_auth_session_is_abandoned(&server));
    cr_assert_eq(kvf_auth_server_finish(&server, NULL, 0, err, sizeof(err)),
                 KVF_ERR_AUTH);
    kvf_auth_secret_cleanup(&secret);
}

Test(auth, open_listener_warns_once)
{
    kvf_auth_secret_t none;

    memset(&none, 0, sizeof(none));
    kvf_test_log_capture_start();
    kvf_auth_warn_if_open(&none, "listen address", "127.0.0.1:7400");
    kvf_auth_warn_if_open(NULL, "listen address", "[::1]:7400");
    cr_assert(!kvf_test_log_contains("not authenticated"), "loopback");
    kvf_auth_warn_if_open(&none, "listen address", "0.0.0.0:7400");
    kvf_auth_warn_if_open(&none, "listen address", "10.0.0.1:7400");
    kvf_test_log_capture_stop();
    cr_assert(kvf_test_log_contains("listen address 0.0.0.0:7400 is not a "
                                    "loopback address"));
    cr_assert(!kvf_test_log_contains("10.0.0.1"), "once per process");
}

Test(auth, nonces_are_fresh)
{
    uint8_t a[32], b[32];

    cr_assert_eq(kvf_auth_nonce(a), KVF_OK);
    cr_assert_eq(kvf_auth_nonce(b), KVF_OK);
    cr_assert(memcmp(a, b, 32) != 0);
}
