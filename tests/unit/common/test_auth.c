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

Test(auth, group_readable_secret_warns)
{
    kvf_auth_secret_t secret;
    const char *path = kvf_test_write_temp("0123456789abcdef0123");
    char err[256];

    chmod(path, 0644);
    kvf_test_log_capture_start();
    cr_assert_eq(kvf_auth_secret_load(path, &secret, err, sizeof(err)), KVF_OK);
    kvf_test_log_capture_stop();
    unlink(path);
    cr_assert(kvf_test_log_contains("readable by group or others"));
    cr_assert(!kvf_test_log_contains("0123456789abcdef"),
              "the secret is never logged");
}

Test(auth, nonces_are_fresh)
{
    uint8_t a[32], b[32];

    cr_assert_eq(kvf_auth_nonce(a), KVF_OK);
    cr_assert_eq(kvf_auth_nonce(b), KVF_OK);
    cr_assert(memcmp(a, b, 32) != 0);
}
