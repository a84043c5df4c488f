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

#include <stdbool.h>

struct event_base;

typedef struct kvf_server kvf_server_t;

/* Binds the listeners (logging "listening on HOST:PORT") and writes the
 * port file when configured. */
kvf_status_t kvf_server_create(const kvf_controller_config_t *cfg,
                               struct event_base *base,
                               kvf_server_t **server_p);

/* HA on etcd: as kvf_server_create() without the control port (a
 * standby; HTTP answers, /healthz says "standby"); its port file names
 * only the HTTP address. kvf_server_take_over() binds the control port
 * once elected. */
kvf_status_t kvf_server_create_standby(const kvf_controller_config_t *cfg,
                                       struct event_base *base,
                                       kvf_server_t **server_p);

/* Elected: stops following the old leader, keeps what it followed when
 * the copy is warm (else starts empty: the agents' resync refills it),
 * binds the control port and rewrites the port file. No-op for a server
 * that is not a standby. */
kvf_status_t kvf_server_take_over(kvf_server_t *server);

/* Closes every connection and frees everything; NULL is a no-op. */
void kvf_server_destroy(kvf_server_t *server);

/* The bound control and HTTP addresses ("" when HTTP is off). */
void kvf_server_addresses(const kvf_server_t *server, const char **control_p,
                          const char **http_p);

/* The leader's term (HA on etcd), carried in REGISTER, HEARTBEAT and
 * LOOKUP replies. */
void kvf_server_set_term(kvf_server_t *server, uint64_t term);

struct kvf_election;

/* A standby follows the leader at @p control ("": none known): connects
 * or reconnects its stream (controller/replica.c). */
void kvf_server_follow(kvf_server_t *server, const char *control);

/* The server's loop. */
struct event_base *kvf_server_base(const kvf_server_t *server);

/* Whether SIGTERM/SIGINT arrived (a standby's loop stops campaigning). */
bool kvf_server_quit_requested(const kvf_server_t *server);

/* HA on etcd: the election whose counters /metrics and /healthz show
 * (borrowed; outlives the server). */
void kvf_server_set_election(kvf_server_t *server,
                             struct kvf_election *election);

/* HA on etcd: no request is answered at or after *@p serve_until_ns
 * (monotonic ns, updated by another thread); then the loop stops. */
void kvf_server_set_lease(kvf_server_t *server,
                          const _Atomic uint64_t *serve_until_ns);

/* Runs the loop until SIGTERM/SIGINT. */
kvf_status_t kvf_server_run(kvf_server_t *server);

#endif /* KVF_CONTROLLER_SERVER_H */
