/* SPDX-License-Identifier: Apache-2.0 */
/* Copyright (c) 2026 The kvfabric authors */
/*
 * Cluster-secret authentication of control connections (docs/security.md):
 * a mutual HMAC-SHA256 challenge carried by HELLO, HELLO_REPLY and AUTH.
 *
 *   client -> HELLO       nonce_c
 *   server -> HELLO_REPLY nonce_s, mac_s = HMAC(K, "kvf-server" 0 nonce_c
 *                                              nonce_s server_name)
 *   client -> AUTH        mac_c = HMAC(K, "kvf-client" 0 nonce_s nonce_c
 *                                      client_name)
 *
 * Each side proves knowledge of K over the other side's fresh nonce, so a
 * recorded exchange cannot be replayed, and the labels keep a MAC of one
 * direction from being reflected as the other.
 *
 * thread: thread-safe (no shared state).
 */
#ifndef KVF_COMMON_AUTH_H
#define KVF_COMMON_AUTH_H

#include <kvfabric/status.h>

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define KVF_AUTH_NONCE_SIZE      32
#define KVF_AUTH_MAC_SIZE        32
#define KVF_AUTH_SECRET_MIN_SIZE 16
#define KVF_AUTH_SECRET_MAX_SIZE 4096

typedef enum {
    KVF_AUTH_SIDE_SERVER = 0,
    KVF_AUTH_SIDE_CLIENT = 1,
} kvf_auth_side_t;

/* A loaded cluster secret; kvf_auth_secret_cleanup() wipes it. */
typedef struct kvf_auth_secret {
    uint8_t key[KVF_AUTH_SECRET_MAX_SIZE];
    size_t len; /* 0: no secret configured */
} kvf_auth_secret_t;

/*
 * Reads the secret from @p path: the file's bytes with trailing whitespace
 * removed, KVF_AUTH_SECRET_MIN_SIZE..KVF_AUTH_SECRET_MAX_SIZE bytes. Logs a
 * warning when the file is readable by group or others. The secret is
 * never logged. KVF_ERR_CONFIG with @p err filled on failure.
 */
kvf_status_t kvf_auth_secret_load(const char *path, kvf_auth_secret_t *secret,
                                  char *err, size_t err_len);

/* Wipes the secret from memory. */
void kvf_auth_secret_cleanup(kvf_auth_secret_t *secret);

/* Fills @p nonce with KVF_AUTH_NONCE_SIZE random bytes (OpenSSL DRBG).
 * KVF_ERR_IO when the generator fails. */
kvf_status_t kvf_auth_nonce(uint8_t *nonce);

/*
 * Computes the MAC that side @p side sends: over the peer's nonce first
 * (the challenge it answers), then its own, then its own name.
 */
kvf_status_t kvf_auth_mac(const kvf_auth_secret_t *secret, kvf_auth_side_t side,
                          const uint8_t *peer_nonce, const uint8_t *own_nonce,
                          const char *name, uint8_t *mac);

/*
 * Checks a MAC received from side @p side in constant time. @p peer_nonce
 * and @p own_nonce are as the *sender* saw them.
 */
bool kvf_auth_verify(const kvf_auth_secret_t *secret, kvf_auth_side_t side,
                     const uint8_t *peer_nonce, const uint8_t *own_nonce,
                     const char *name, const uint8_t *mac, size_t mac_len);

#endif /* KVF_COMMON_AUTH_H */
