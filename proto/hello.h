/* SPDX-License-Identifier: Apache-2.0 */
/* Copyright (c) 2026 The kvfabric authors */
/*
 * The cluster-secret challenge (common/auth.h) carried by HELLO,
 * HELLO_REPLY and AUTH: the glue between an auth session and the wire
 * messages, shared by every server (controller, agent engine socket) and
 * every client (agent, kvfctl, libkvfabric). docs/protocol.md "Handshake".
 *
 * thread: stateless; callers own the sessions and messages.
 */
#ifndef KVF_PROTO_HELLO_H
#define KVF_PROTO_HELLO_H

#include "common/auth.h"
#include "proto/msg.h"

#include <kvfabric/status.h>

#include <stddef.h>
#include <stdint.h>

/*
 * Server, on @p hello: runs kvf_auth_server_hello() for the server named
 * @p rep->name and fills @p rep. KVF_OK: when the session is challenged,
 * @p rep carries the nonce and @p mac (KVF_AUTH_MAC_SIZE bytes the caller
 * keeps until @p rep is sent). KVF_ERR_AUTH: @p rep is the refusal (status
 * and @p text as its message); send it and close.
 */
kvf_status_t kvf_hello_server_auth(kvf_auth_session_t *session,
                                   const Kvf__Hello *hello,
                                   Kvf__HelloReply *rep, uint8_t *mac,
                                   char *text, size_t text_len);

/*
 * Client, on a successful @p rep to the HELLO it sent as @p client_name:
 * runs kvf_auth_client_reply(). KVF_OK: when the session is challenged,
 * @p auth is the AUTH to send (its MAC in @p mac, which the caller keeps
 * until it is sent; request_id left to the caller). KVF_ERR_AUTH with the
 * reason in @p text.
 */
kvf_status_t kvf_hello_client_auth(kvf_auth_session_t *session,
                                   const Kvf__HelloReply *rep,
                                   const char *client_name, Kvf__Auth *auth,
                                   uint8_t *mac, char *text, size_t text_len);

#endif /* KVF_PROTO_HELLO_H */
