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
    if ((fstat(fd, &st) == 0) && (st.st_mode & (S_IRWXG | S_IRWXO))) {
        kvf_warn("cluster secret file %s is readable by group or others "
                 "(mode %04o); chmod 600 it",
                 path, (unsigned)(st.st_mode & 07777));
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
