/* SPDX-License-Identifier: Apache-2.0 */
/* Copyright (c) 2026 The kvfabric authors */
#include "proto/hello.h"

kvf_status_t kvf_hello_server_auth(kvf_auth_session_t *session,
                                   const Kvf__Hello *hello,
                                   Kvf__HelloReply *rep, uint8_t *mac,
                                   char *text, size_t text_len)
{
    if (kvf_auth_server_hello(session, hello->name, hello->auth_nonce.data,
                              hello->auth_nonce.len, rep->name, mac, text,
                              text_len) != KVF_OK) {
        rep->status  = KVF_ERR_AUTH;
        rep->message = text;
        return KVF_ERR_AUTH;
    }
    if (session->state == KVF_AUTH_STATE_CHALLENGED) {
        rep->auth_nonce.data = session->own_nonce;
        rep->auth_nonce.len  = KVF_AUTH_NONCE_SIZE;
        rep->auth_mac.data   = mac;
        rep->auth_mac.len    = KVF_AUTH_MAC_SIZE;
    }
    return KVF_OK;
}

kvf_status_t kvf_hello_client_auth(kvf_auth_session_t *session,
                                   const Kvf__HelloReply *rep,
                                   const char *client_name, Kvf__Auth *auth,
                                   uint8_t *mac, char *text, size_t text_len)
{
    kvf_status_t status;

    status = kvf_auth_client_reply(
        session, rep->auth_nonce.data, rep->auth_nonce.len, rep->auth_mac.data,
        rep->auth_mac.len, rep->name, client_name, mac, text, text_len);
    if (status != KVF_OK) {
        return status;
    }
    kvf__auth__init(auth);
    auth->auth_mac.data = mac;
    auth->auth_mac.len  = KVF_AUTH_MAC_SIZE;
    return KVF_OK;
}
