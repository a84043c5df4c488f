/* SPDX-License-Identifier: Apache-2.0 */
/* Copyright (c) 2026 The kvfabric authors */
/*
 * The controller's request handlers (controller/ only): HELLO, AUTH,
 * REGISTER, HEARTBEAT, DEREGISTER, ADMIT/EVICT, INVENTORY, LOOKUP,
 * TP_LOOKUP, NODE_INFO, STATS and admin commands; the KV event stream and
 * the recovery window they feed.
 *
 * thread: the server's loop only.
 */
#ifndef KVF_CONTROLLER_HANDLERS_H
#define KVF_CONTROLLER_HANDLERS_H

#include "controller/conn.h"
#include "controller/stats.h"

/* kvf_conn_dispatch_fn of the controller: answers one request frame. */
kvf_status_t kvf_server_dispatch(kvf_conn_t *conn, struct kvf_frame *frame);

/* Schedules a purge slice when the registry has slots to purge. */
void kvf_server_purge_kick(kvf_server_t *server);

/* AllBlocksCleared for every node that stored blocks and is now dead,
 * deregistered or forgotten; answers waiting replay requests. */
void kvf_server_events_sweep(kvf_server_t *server);

/* Recomputes and returns the recovering flag. */
bool kvf_server_recovering(kvf_server_t *server);

/* Fills the counters of @p rep (initialized by the caller): the one
 * stats schema of STATS, /v1/stats and kvfctl stats. */
void kvf_server_stats_fill(kvf_server_t *server, Kvf__StatsReply *rep);

/* kvf_http_source_t::snapshot of the server (@p arg). */
void kvf_server_snapshot(void *arg, kvf_server_stats_t *stats);

#endif /* KVF_CONTROLLER_HANDLERS_H */
