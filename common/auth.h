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
/* Largest frame a server reads from a peer that has not proved the secret
 * yet (HELLO and AUTH are a few hundred bytes). */
#define KVF_AUTH_FRAME_MAX (64u << 10)

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
 * removed, KVF_AUTH_SECRET_MIN_SIZE..KVF_AUTH_SECRET_MAX_SIZE bytes. A file
 * that group or others may access is refused (as ssh refuses such a key).
 * The secret is never logged. KVF_ERR_CONFIG with @p err filled on failure;
 * nothing is logged (the client library prints nothing).
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

/* Is a secret configured (auth on)? */
bool kvf_auth_secret_is_set(const kvf_auth_secret_t *secret);

/*
 * Loads the secret named by @p path when it is set and not empty; leaves
 * @p secret empty (auth off) otherwise. As kvf_auth_secret_load().
 */
kvf_status_t kvf_auth_secret_load_opt(const char *path,
                                      kvf_auth_secret_t *secret, char *err,
                                      size_t err_len);

/*
 * Warns once per process, at startup, that @p what listening on (or
 * connecting to) @p hostport runs without authentication, unless a secret
 * is set or the host is a loopback address.
 */
void kvf_auth_warn_if_open(const kvf_auth_secret_t *secret, const char *what,
                           const char *hostport);

/* Is @p hostport's host a loopback address (127.x, ::1, localhost)? */
bool kvf_auth_host_is_loopback(const char *hostport);

/* Hex characters of an HTTP bearer token, without the NUL. */
#define KVF_AUTH_HTTP_TOKEN_LEN (2 * KVF_AUTH_MAC_SIZE)

/*
 * The bearer token the controller's HTTP port asks for when a secret is
 * set (docs/security.md): lowercase hex of
 * HMAC-SHA256(secret, "kvf-http-token v1"). Static for a given secret, so
 * scrapers and dashboards can be configured with it; it proves nothing on
 * the control port. @p hex gets KVF_AUTH_HTTP_TOKEN_LEN + 1 bytes.
 */
kvf_status_t kvf_auth_http_token(const kvf_auth_secret_t *secret, char *hex);

/* ---- the handshake of one connection --------------------------------- */

typedef enum {
    KVF_AUTH_STATE_START = 0,  /* nothing exchanged yet */
    KVF_AUTH_STATE_CHALLENGED, /* nonces exchanged: the peer's MAC is due */
    KVF_AUTH_STATE_DONE,       /* authenticated, or auth off on both sides */
    KVF_AUTH_STATE_FAILED,     /* refused: the connection is closing */
} kvf_auth_state_t;

/*
 * One side of the challenge on one connection; the transport code carries
 * the fields in HELLO (auth_nonce), HELLO_REPLY (auth_nonce, auth_mac) and
 * AUTH (auth_mac), as docs/protocol.md describes. Every decision (who must
 * prove what, the error texts both sides show) is made here, so the
 * controller, the agent, kvfctl and libkvfabric behave the same.
 */
typedef struct kvf_auth_session {
    const kvf_auth_secret_t *secret; /* borrowed; NULL or empty: auth off */
    kvf_auth_state_t state;
    uint8_t own_nonce[KVF_AUTH_NONCE_SIZE];
    uint8_t peer_nonce[KVF_AUTH_NONCE_SIZE];
    char peer_name[256]; /* server: the name the client said in HELLO */
} kvf_auth_session_t;

/* Starts a session; @p secret is borrowed and must outlive it. */
void kvf_auth_session_init(kvf_auth_session_t *session,
                           const kvf_auth_secret_t *secret);

/* Wipes the nonces. */
void kvf_auth_session_cleanup(kvf_auth_session_t *session);

/* Did the peer prove the secret (or is auth off on both sides)? */
bool kvf_auth_session_is_done(const kvf_auth_session_t *session);

/* Marks the session refused (a request before AUTH); KVF_ERR_AUTH. */
kvf_status_t kvf_auth_session_refuse(kvf_auth_session_t *session);

/* Did the connection close in the middle of the challenge (the client
 * gave up, e.g. because the server's proof was wrong)? Servers count it
 * as an authentication failure. */
bool kvf_auth_session_is_abandoned(const kvf_auth_session_t *session);

/*
 * Client, before HELLO: draws session->own_nonce, the HELLO's auth_nonce,
 * and sets *len_p to its length (0 when this side has no secret, and the
 * HELLO carries no nonce). KVF_ERR_IO when the generator failed.
 */
kvf_status_t kvf_auth_client_hello(kvf_auth_session_t *session, size_t *len_p);

/*
 * Server, on HELLO from @p client_name carrying @p nonce (length @p len, 0
 * when absent). KVF_OK: when the state is KVF_AUTH_STATE_CHALLENGED the
 * HELLO_REPLY carries session->own_nonce and @p mac (KVF_AUTH_MAC_SIZE
 * bytes, for @p server_name) and an AUTH must follow; when DONE, auth is
 * off. KVF_ERR_AUTH: refuse with the text in @p err (a secret on one side
 * only, or a malformed nonce).
 */
kvf_status_t kvf_auth_server_hello(kvf_auth_session_t *session,
                                   const char *client_name,
                                   const uint8_t *nonce, size_t len,
                                   const char *server_name, uint8_t *mac,
                                   char *err, size_t err_len);

/*
 * Client, on a successful HELLO_REPLY from @p server_name carrying its
 * nonce and MAC (lengths 0 when absent). KVF_OK: when the state is
 * KVF_AUTH_STATE_CHALLENGED, send AUTH with @p mac (computed for
 * @p client_name, the name sent in HELLO) and wait for its STATUS; when
 * DONE, auth is off. KVF_ERR_AUTH with @p err: the server did not prove
 * the secret, or only one side has one.
 */
kvf_status_t kvf_auth_client_reply(kvf_auth_session_t *session,
                                   const uint8_t *nonce, size_t nonce_len,
                                   const uint8_t *server_mac, size_t mac_len,
                                   const char *server_name,
                                   const char *client_name, uint8_t *mac,
                                   char *err, size_t err_len);

/*
 * Server, on AUTH carrying @p mac. KVF_OK: authenticated (state DONE).
 * KVF_ERR_AUTH with @p err: wrong secret, or no challenge was made.
 */
kvf_status_t kvf_auth_server_finish(kvf_auth_session_t *session,
                                    const uint8_t *mac, size_t mac_len,
                                    char *err, size_t err_len);

#endif /* KVF_COMMON_AUTH_H */
