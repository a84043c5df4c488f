/* SPDX-License-Identifier: Apache-2.0 */
/* Copyright (c) 2026 The kvfabric authors */
/*
 * Optional TLS for controller connections (docs/security.md): one place
 * that builds the OpenSSL contexts the controller (server: tls_cert,
 * tls_key) and its clients (agent, kvfctl: tls_ca, tls_server_name) use.
 * TLS 1.2 at least; a client always verifies the controller's certificate
 * chain against tls_ca, and its name when tls_server_name is set.
 *
 * Built as its own library (kvf_tls): libkvfabric does not link libssl.
 *
 * thread: contexts are created at startup; OpenSSL makes them shareable.
 */
#ifndef KVF_COMMON_TLS_H
#define KVF_COMMON_TLS_H

#include <kvfabric/status.h>

#include <stddef.h>

typedef struct ssl_ctx_st SSL_CTX;
typedef struct ssl_st SSL;
struct evbuffer;

/*
 * A server context from a PEM certificate (chain) and its private key.
 * KVF_ERR_CONFIG with @p err filled when either cannot be loaded or they
 * do not match. Free with SSL_CTX_free().
 */
kvf_status_t kvf_tls_server_ctx_create(const char *cert, const char *key,
                                       SSL_CTX **ctx_p, char *err,
                                       size_t err_len);

/*
 * A client context trusting the PEM CA file @p ca (peer verification
 * on). KVF_ERR_CONFIG with @p err filled. Free with SSL_CTX_free().
 */
kvf_status_t kvf_tls_client_ctx_create(const char *ca, SSL_CTX **ctx_p,
                                       char *err, size_t err_len);

/*
 * A client session of @p ctx that checks the server's certificate names
 * @p server_name (host name or IP address; NULL or empty: chain only)
 * and sends it as SNI. NULL when out of memory. Free with SSL_free().
 */
SSL *kvf_tls_client_new(SSL_CTX *ctx, const char *server_name);

/*
 * One SSL_write of the first bytes of @p buf (at most 64 KiB), drained
 * from it. Returns the bytes written (> 0), or minus the SSL_get_error()
 * code (-SSL_ERROR_WANT_READ, -SSL_ERROR_WANT_WRITE, ...).
 */
int kvf_tls_write_some(SSL *ssl, struct evbuffer *buf);

/* One SSL_read of up to 64 KiB appended to @p buf; as above. */
int kvf_tls_read_some(SSL *ssl, struct evbuffer *buf);

/* The reason of the last TLS failure on this thread, for a log line
 * ("certificate verify failed"); "unknown" when OpenSSL has none. */
const char *kvf_tls_error(char *buf, size_t len);

#endif /* KVF_COMMON_TLS_H */
