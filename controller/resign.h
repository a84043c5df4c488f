/* SPDX-License-Identifier: Apache-2.0 */
/* Copyright (c) 2026 The kvfabric authors */
/*
 * HA on etcd: a leader that lost every agent resigns (docs/operations.md,
 * "High availability"). A leader cut off from the agents but not from
 * etcd keeps its lease, and the agents, which find the leader in etcd,
 * would wait for it forever. So once the leader has had agents and none is
 * up any more (all expired, died or left), it stops serving and the
 * caller revokes its lease (kvf_election_destroy()) and exits with
 * KVF_RESIGN_EXIT: a standby the agents can reach wins within a poll, and
 * a supervisor (systemd, Kubernetes) restarts this one as a standby. When
 * the agents really are all gone, that costs one harmless handover.
 *
 * thread: the server's loop.
 */
#ifndef KVF_CONTROLLER_RESIGN_H
#define KVF_CONTROLLER_RESIGN_H

#include "controller/server.h"

#include <kvfabric/status.h>

#include <stdbool.h>
#include <stdint.h>

struct event_base;

/* Exit status of a leader that resigned. */
#define KVF_RESIGN_EXIT 4

typedef struct kvf_resign kvf_resign_t;

/* Looks at @p server's nodes every @p interval_ns on @p base; breaks the
 * loop when it resigns. */
kvf_status_t kvf_resign_create(kvf_server_t *server, struct event_base *base,
                               uint64_t interval_ns, kvf_resign_t **resign_p);

/* NULL is a no-op. */
void kvf_resign_destroy(kvf_resign_t *resign);

/* Whether it resigned (then the loop was broken). */
bool kvf_resign_happened(const kvf_resign_t *resign);

#endif /* KVF_CONTROLLER_RESIGN_H */
