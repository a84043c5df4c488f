/* SPDX-License-Identifier: Apache-2.0 */
/* Copyright (c) 2026 The kvfabric authors */
#include "common/tls.h"

#include <event2/buffer.h>

#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>

#include <stdio.h>
#include <string.h>

const char *kvf_tls_error(char *buf, size_t len)
{
    unsigned long e = ERR_get_error();

    if (e == 0) {
        snprintf(buf, len, "unknown");
    } else {
        ERR_error_string_n(e, buf, len);
    }
    ERR_clear_error();
    return buf;
}

/* A context of @p method, TLS 1.2 or newer, writes that may move and be
 * partial (the controller writes from evbuffers). */
static SSL_CTX *kvf_tls_ctx_new(const SSL_METHOD *method)
{
    SSL_CTX *ctx = SSL_CTX_new(method);

    if (ctx == NULL) {
        return NULL;
    }
    SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
    SSL_CTX_set_mode(ctx, SSL_MODE_ENABLE_PARTIAL_WRITE |
                              SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
    return ctx;
}

kvf_status_t kvf_tls_server_ctx_create(const char *cert, const char *key,
                                       SSL_CTX **ctx_p, char *err,
                                       size_t err_len)
{
    char why[256];
    SSL_CTX *ctx;

    ctx = kvf_tls_ctx_new(TLS_server_method());
    if (ctx == NULL) {
        snprintf(err, err_len, "tls: no memory for a context");
        return KVF_ERR_NO_MEMORY;
    }
    if (SSL_CTX_use_certificate_chain_file(ctx, cert) != 1) {
        snprintf(err, err_len, "tls_cert %s: %s", cert,
                 kvf_tls_error(why, sizeof(why)));
        goto err_free;
    }
    if (SSL_CTX_use_PrivateKey_file(ctx, key, SSL_FILETYPE_PEM) != 1) {
        snprintf(err, err_len, "tls_key %s: %s", key,
                 kvf_tls_error(why, sizeof(why)));
        goto err_free;
    }
    if (SSL_CTX_check_private_key(ctx) != 1) {
        snprintf(err, err_len, "tls_key %s does not match tls_cert %s", key,
                 cert);
        ERR_clear_error();
        goto err_free;
    }
    *ctx_p = ctx;
    return KVF_OK;

err_free:
    SSL_CTX_free(ctx);
    return KVF_ERR_CONFIG;
}

kvf_status_t kvf_tls_client_ctx_create(const char *ca, SSL_CTX **ctx_p,
                                       char *err, size_t err_len)
{
    char why[256];
    SSL_CTX *ctx;

    ctx = kvf_tls_ctx_new(TLS_client_method());
    if (ctx == NULL) {
        snprintf(err, err_len, "tls: no memory for a context");
        return KVF_ERR_NO_MEMORY;
    }
    if (SSL_CTX_load_verify_locations(ctx, ca, NULL) != 1) {
        snprintf(err, err_len, "tls_ca %s: %s", ca,
                 kvf_tls_error(why, sizeof(why)));
        SSL_CTX_free(ctx);
        return KVF_ERR_CONFIG;
    }
    SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, NULL);
    *ctx_p = ctx;
    return KVF_OK;
}

SSL *kvf_tls_client_new(SSL_CTX *ctx, const char *server_name)
{
    SSL *ssl = SSL_new(ctx);
    X509_VERIFY_PARAM *param;

    if ((ssl == NULL) || (server_name == NULL) || (server_name[0] == '\0')) {
        return ssl;
    }
    param = SSL_get0_param(ssl);
    X509_VERIFY_PARAM_set_hostflags(param,
                                    X509_CHECK_FLAG_NO_PARTIAL_WILDCARDS);
    /* an IP address is checked against the certificate's IP names */
    if ((X509_VERIFY_PARAM_set1_ip_asc(param, server_name) != 1) &&
        (X509_VERIFY_PARAM_set1_host(param, server_name, 0) != 1)) {
        SSL_free(ssl);
        return NULL;
    }
    {
        char host[256]; /* SSL_set_tlsext_host_name's macro drops const */

        snprintf(host, sizeof(host), "%s", server_name);
        SSL_ctrl(ssl, SSL_CTRL_SET_TLSEXT_HOSTNAME, TLSEXT_NAMETYPE_host_name,
                 host);
    }
    return ssl;
}

int kvf_tls_write_some(SSL *ssl, struct evbuffer *buf)
{
    size_t len = evbuffer_get_contiguous_space(buf);
    int n;

    if (len > (64u << 10)) {
        len = 64u << 10;
    }
    n = SSL_write(ssl, evbuffer_pullup(buf, (ssize_t)len), (int)len);
    if (n > 0) {
        evbuffer_drain(buf, (size_t)n);
        return n;
    }
    return -SSL_get_error(ssl, n);
}

int kvf_tls_read_some(SSL *ssl, struct evbuffer *buf)
{
    struct evbuffer_iovec vec;
    int n;

    if (evbuffer_reserve_space(buf, 64 << 10, &vec, 1) != 1) {
        return -SSL_ERROR_SYSCALL;
    }
    n = SSL_read(ssl, vec.iov_base, (int)vec.iov_len);
    if (n > 0) {
        vec.iov_len = (size_t)n;
        evbuffer_commit_space(buf, &vec, 1);
        return n;
    }
    return -SSL_get_error(ssl, n);
}
