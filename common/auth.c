/* SPDX-License-Identifier: Apache-2.0 */
/* Copyright (c) 2026 The kvfabric authors */
#include "common/auth.h"

#include "common/log.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static const char *const kvf_auth_labels[] = {
    [KVF_AUTH_SIDE_SERVER] = "kvf-server",
    [KVF_AUTH_SIDE_CLIENT] = "kvf-client",
};

kvf_status_t kvf_auth_secret_load(const char *path, kvf_auth_secret_t *secret,
                                  char *err, size_t err_len)
{
    struct stat st;
    ssize_t n;
    size_t len = 0;
    int fd;

    memset(secret, 0, sizeof(*secret));
    fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        snprintf(err, err_len, "cluster secret file %s: %s", path,
                 strerror(errno));
        return KVF_ERR_CONFIG;
    }
    if (fstat(fd, &st) != 0) {
        snprintf(err, err_len, "cluster secret file %s: %s", path,
                 strerror(errno));
        close(fd);
        return KVF_ERR_CONFIG;
    }
    if (st.st_mode & (S_IRWXG | S_IRWXO)) {
        /* as ssh refuses a private key others can read */
        snprintf(err, err_len,
                 "cluster secret file %s is accessible by group or others "
                 "(mode %04o); chmod 600 it",
                 path, (unsigned)(st.st_mode & 07777));
        close(fd);
        return KVF_ERR_CONFIG;
    }
    /* read one byte more than allowed to detect an oversized file */
    while (len <= sizeof(secret->key) - 1) {
        n = read(fd, secret->key + len, sizeof(secret->key) - len);
        if (n < 0) {
            if (errno == EINTR) {
                continue;
            }
            snprintf(err, err_len, "cluster secret file %s: %s", path,
                     strerror(errno));
            close(fd);
            kvf_auth_secret_cleanup(secret);
            return KVF_ERR_CONFIG;
        }
        if (n == 0) {
            break;
        }
        len += (size_t)n;
    }
    if ((len == sizeof(secret->key)) && (read(fd, &(char){0}, 1) == 1)) {
        snprintf(err, err_len, "cluster secret file %s is larger than %d bytes",
                 path, KVF_AUTH_SECRET_MAX_SIZE);
        close(fd);
        kvf_auth_secret_cleanup(secret);
        return KVF_ERR_CONFIG;
    }
    close(fd);
    while ((len > 0) && isspace(secret->key[len - 1])) {
        len--;
    }
    if (len < KVF_AUTH_SECRET_MIN_SIZE) {
        snprintf(err, err_len,
                 "cluster secret file %s holds %zu bytes; at least %d are "
                 "needed (e.g. openssl rand -hex 32)",
                 path, len, KVF_AUTH_SECRET_MIN_SIZE);
        kvf_auth_secret_cleanup(secret);
        return KVF_ERR_CONFIG;
    }
    secret->len = len;
    return KVF_OK;
}

void kvf_auth_secret_cleanup(kvf_auth_secret_t *secret)
{
    OPENSSL_cleanse(secret, sizeof(*secret));
}

kvf_status_t kvf_auth_nonce(uint8_t *nonce)
{
    if (RAND_bytes(nonce, KVF_AUTH_NONCE_SIZE) != 1) {
        kvf_error("auth: the random generator failed");
        return KVF_ERR_IO;
    }
    return KVF_OK;
}

kvf_status_t kvf_auth_mac(const kvf_auth_secret_t *secret, kvf_auth_side_t side,
                          const uint8_t *peer_nonce, const uint8_t *own_nonce,
                          const char *name, uint8_t *mac)
{
    const char *label;
    unsigned int len = KVF_AUTH_MAC_SIZE;
    uint8_t msg[16 + 2 * KVF_AUTH_NONCE_SIZE + 256];
    size_t name_len, off;

    if ((secret == NULL) || (secret->len == 0) || (name == NULL) ||
        ((side != KVF_AUTH_SIDE_SERVER) && (side != KVF_AUTH_SIDE_CLIENT))) {
        return KVF_ERR_INVALID;
    }
    label    = kvf_auth_labels[side];
    name_len = strnlen(name, 256);
    if (name_len >= 256) {
        return KVF_ERR_INVALID;
    }
    /* label, a 0 separator, both nonces, then the name */
    off = strlen(label) + 1;
    memcpy(msg, label, off);
    memcpy(msg + off, peer_nonce, KVF_AUTH_NONCE_SIZE);
    off += KVF_AUTH_NONCE_SIZE;
    memcpy(msg + off, own_nonce, KVF_AUTH_NONCE_SIZE);
    off += KVF_AUTH_NONCE_SIZE;
    memcpy(msg + off, name, name_len);
    off += name_len;
    if (HMAC(EVP_sha256(), secret->key, (int)secret->len, msg, off, mac,
             &len) == NULL) {
        kvf_error("auth: HMAC-SHA256 failed");
        return KVF_ERR_IO;
    }
    return KVF_OK;
}

bool kvf_auth_verify(const kvf_auth_secret_t *secret, kvf_auth_side_t side,
                     const uint8_t *peer_nonce, const uint8_t *own_nonce,
                     const char *name, const uint8_t *mac, size_t mac_len)
{
    uint8_t expect[KVF_AUTH_MAC_SIZE];
    bool ok;

    if ((mac == NULL) || (mac_len != KVF_AUTH_MAC_SIZE) ||
        (kvf_auth_mac(secret, side, peer_nonce, own_nonce, name, expect) !=
         KVF_OK)) {
        return false;
    }
    ok = (CRYPTO_memcmp(expect, mac, KVF_AUTH_MAC_SIZE) == 0);
    OPENSSL_cleanse(expect, sizeof(expect));
    return ok;
}

bool kvf_auth_secret_is_set(const kvf_auth_secret_t *secret)
{
    return (secret != NULL) && (secret->len > 0);
}

kvf_status_t kvf_auth_secret_load_opt(const char *path,
                                      kvf_auth_secret_t *secret, char *err,
                                      size_t err_len)
{
    if ((path == NULL) || (path[0] == '\0')) {
        memset(secret, 0, sizeof(*secret));
        return KVF_OK;
    }
    return kvf_auth_secret_load(path, secret, err, err_len);
}

/* "127.0.0.1:7000", "[::1]:7000", "localhost:7000": the host part only,
 * without the config parser (libkvfabric links auth.c, not config.c) */
bool kvf_auth_host_is_loopback(const char *hostport)
{
    const char *colon = strrchr(hostport, ':');
    size_t len        = (colon != NULL) ? (size_t)(colon - hostport) : 0;

    if ((len >= 2) && (hostport[0] == '[') && (hostport[len - 1] == ']')) {
        return (len == 5) && (strncmp(hostport, "[::1]", 5) == 0);
    }
    return (strncmp(hostport, "127.", 4) == 0) ||
           ((len == 9) && (strncmp(hostport, "localhost", 9) == 0));
}

kvf_status_t kvf_auth_http_token(const kvf_auth_secret_t *secret, char *hex)
{
    static const char label[] = "kvf-http-token v1";
    uint8_t mac[KVF_AUTH_MAC_SIZE];
    unsigned mac_len = sizeof(mac);
    size_t i;

    if (HMAC(EVP_sha256(), secret->key, (int)secret->len,
             (const uint8_t *)label, sizeof(label) - 1, mac,
             &mac_len) == NULL) {
        kvf_error("auth: HMAC-SHA256 failed");
        return KVF_ERR_IO;
    }
    for (i = 0; i < sizeof(mac); i++) {
        snprintf(hex + 2 * i, 3, "%02x", mac[i]);
    }
    OPENSSL_cleanse(mac, sizeof(mac));
    return KVF_OK;
}

void kvf_auth_warn_if_open(const kvf_auth_secret_t *secret, const char *what,
                           const char *hostport)
{
    static bool is_warned;

    if (is_warned || kvf_auth_secret_is_set(secret) || (hostport == NULL) ||
        (hostport[0] == '\0') || kvf_auth_host_is_loopback(hostport)) {
        return;
    }
    is_warned = true;
    kvf_warn("%s %s is not a loopback address and no cluster_secret_file is "
             "configured: control connections are not authenticated "
             "(docs/security.md)",
             what, hostport);
}

void kvf_auth_session_init(kvf_auth_session_t *session,
                           const kvf_auth_secret_t *secret)
{
    memset(session, 0, sizeof(*session));
    session->secret = secret;
    session->state  = KVF_AUTH_STATE_START;
}

void kvf_auth_session_cleanup(kvf_auth_session_t *session)
{
    OPENSSL_cleanse(session, sizeof(*session));
}

bool kvf_auth_session_is_done(const kvf_auth_session_t *session)
{
    return session->state == KVF_AUTH_STATE_DONE;
}

bool kvf_auth_session_is_abandoned(const kvf_auth_session_t *session)
{
    return session->state == KVF_AUTH_STATE_CHALLENGED;
}

kvf_status_t kvf_auth_session_refuse(kvf_auth_session_t *session)
{
    session->state = KVF_AUTH_STATE_FAILED;
    return KVF_ERR_AUTH;
}

kvf_status_t kvf_auth_client_hello(kvf_auth_session_t *session, size_t *len_p)
{
    kvf_status_t status;

    *len_p = 0;
    if (!kvf_auth_secret_is_set(session->secret)) {
        return KVF_OK;
    }
    status = kvf_auth_nonce(session->own_nonce);
    if (status == KVF_OK) {
        *len_p = KVF_AUTH_NONCE_SIZE;
    }
    return status;
}

kvf_status_t kvf_auth_server_hello(kvf_auth_session_t *session,
                                   const char *client_name,
                                   const uint8_t *nonce, size_t len,
                                   const char *server_name, uint8_t *mac,
                                   char *err, size_t err_len)
{
    bool has_secret = kvf_auth_secret_is_set(session->secret);

    if (session->state != KVF_AUTH_STATE_START) {
        snprintf(err, err_len, "HELLO sent twice");
        return kvf_auth_session_refuse(session);
    }
    if (!has_secret && (len == 0)) {
        session->state = KVF_AUTH_STATE_DONE; /* auth off on both sides */
        return KVF_OK;
    }
    if (!has_secret) {
        snprintf(err, err_len,
                 "the client sent an auth challenge but this server has no "
                 "cluster_secret_file configured");
        return kvf_auth_session_refuse(session);
    }
    if (len == 0) {
        snprintf(err, err_len,
                 "this server requires the cluster secret: configure "
                 "cluster_secret_file (env KVF_CLUSTER_SECRET_FILE)");
        return kvf_auth_session_refuse(session);
    }
    if ((len != KVF_AUTH_NONCE_SIZE) || (nonce == NULL)) {
        snprintf(err, err_len, "auth nonce of %zu bytes (want %d)", len,
                 KVF_AUTH_NONCE_SIZE);
        return kvf_auth_session_refuse(session);
    }
    if ((client_name == NULL) || (strlen(client_name) >= 256)) {
        snprintf(err, err_len, "client name missing or too long");
        return kvf_auth_session_refuse(session);
    }
    memcpy(session->peer_nonce, nonce, KVF_AUTH_NONCE_SIZE);
    snprintf(session->peer_name, sizeof(session->peer_name), "%s", client_name);
    if ((kvf_auth_nonce(session->own_nonce) != KVF_OK) ||
        (kvf_auth_mac(session->secret, KVF_AUTH_SIDE_SERVER,
                      session->peer_nonce, session->own_nonce, server_name,
                      mac) != KVF_OK)) {
        snprintf(err, err_len, "server cannot compute its auth challenge");
        return kvf_auth_session_refuse(session);
    }
    session->state = KVF_AUTH_STATE_CHALLENGED;
    return KVF_OK;
}

kvf_status_t kvf_auth_client_reply(kvf_auth_session_t *session,
                                   const uint8_t *nonce, size_t nonce_len,
                                   const uint8_t *server_mac, size_t mac_len,
                                   const char *server_name,
                                   const char *client_name, uint8_t *mac,
                                   char *err, size_t err_len)
{
    bool has_secret = kvf_auth_secret_is_set(session->secret);

    if (session->state != KVF_AUTH_STATE_START) {
        snprintf(err, err_len, "unexpected HELLO_REPLY");
        return KVF_ERR_AUTH;
    }
    if (!has_secret && (nonce_len == 0) && (mac_len == 0)) {
        session->state = KVF_AUTH_STATE_DONE;
        return KVF_OK;
    }
    if (!has_secret) {
        snprintf(err, err_len,
                 "the server requires the cluster secret: configure "
                 "cluster_secret_file (env KVF_CLUSTER_SECRET_FILE)");
        return KVF_ERR_AUTH;
    }
    if ((nonce_len == 0) && (mac_len == 0)) {
        snprintf(err, err_len,
                 "the server did not authenticate (no cluster_secret_file "
                 "configured there?)");
        return KVF_ERR_AUTH;
    }
    if ((nonce == NULL) || (nonce_len != KVF_AUTH_NONCE_SIZE) ||
        (server_name == NULL) ||
        !kvf_auth_verify(session->secret, KVF_AUTH_SIDE_SERVER,
                         session->own_nonce, nonce, server_name, server_mac,
                         mac_len)) {
        snprintf(err, err_len,
                 "the server failed the cluster-secret challenge (a "
                 "different secret?)");
        return KVF_ERR_AUTH;
    }
    memcpy(session->peer_nonce, nonce, KVF_AUTH_NONCE_SIZE);
    if (kvf_auth_mac(session->secret, KVF_AUTH_SIDE_CLIENT, session->peer_nonce,
                     session->own_nonce, client_name, mac) != KVF_OK) {
        snprintf(err, err_len, "client name missing or too long");
        return KVF_ERR_AUTH;
    }
    session->state = KVF_AUTH_STATE_CHALLENGED;
    return KVF_OK;
}

kvf_status_t kvf_auth_server_finish(kvf_auth_session_t *session,
                                    const uint8_t *mac, size_t mac_len,
                                    char *err, size_t err_len)
{
    if (session->state != KVF_AUTH_STATE_CHALLENGED) {
        snprintf(err, err_len, "AUTH without a challenge");
        return kvf_auth_session_refuse(session);
    }
    if (!kvf_auth_verify(session->secret, KVF_AUTH_SIDE_CLIENT,
                         session->own_nonce, session->peer_nonce,
                         session->peer_name, mac, mac_len)) {
        snprintf(err, err_len, "wrong cluster secret");
        return kvf_auth_session_refuse(session);
    }
    session->state = KVF_AUTH_STATE_DONE;
    return KVF_OK;
}
