/* SPDX-License-Identifier: Apache-2.0 */
/* Copyright (c) 2026 The kvfabric authors */
/*
 * The controller service: listener, connections, request handlers, lease
 * and purge timers, HTTP. One libevent loop.
 *
 * thread: owning loop only. Ownership: the server owns everything it
 * creates; @p cfg is borrowed and must outlive it.
 */
#ifndef KVF_CONTROLLER_SERVER_H
#define KVF_CONTROLLER_SERVER_H

#include "controller/config.h"

#include <kvfabric/status.h>

struct event_base;

typedef struct kvf_server kvf_server_t;

/* Binds the listeners (logging "listening on HOST:PORT") and writes the
 * port file when configured. */
kvf_status_t kvf_server_create(const kvf_controller_config_t *cfg,
                               struct event_base *base,
                               kvf_server_t **server_p);

/* Closes every connection and frees everything; NULL is a no-op. */
void kvf_server_destroy(kvf_server_t *server);

/* The bound control and HTTP addresses ("" when HTTP is off). */
void kvf_server_addresses(const kvf_server_t *server, const char **control_p,
                          const char **http_p);

/* The leader's term (HA on etcd), carried in REGISTER, HEARTBEAT and
 * LOOKUP replies. */
void kvf_server_set_term(kvf_server_t *server, uint64_t term);

/* HA on etcd: no request is answered at or after *@p serve_until_ns
 * (monotonic ns, updated by another thread); then the loop stops. */
void kvf_server_set_lease(kvf_server_t *server,
                          const _Atomic uint64_t *serve_until_ns);

/* Runs the loop until SIGTERM/SIGINT. */
kvf_status_t kvf_server_run(kvf_server_t *server);

#endif /* KVF_CONTROLLER_SERVER_H */
