/* SPDX-License-Identifier: Apache-2.0 */
/* Copyright (c) 2026 The kvfabric authors */
/*
 * Leader election on etcd (docs/operations.md, "High availability").
 *
 * A controller started with --etcd campaigns for PREFIX/leader under a
 * lease of --etcd-lease: the key is created only if absent (a txn), so one
 * controller at a time holds it. Standbys poll the key and campaign again
 * once it is gone (the leader's lease expired or was revoked). The leader
 * publishes {"control","http","term"} there; the term is the key's create
 * revision, which grows with every election.
 *
 * Lease lost = stop serving first: a keep-alive thread renews the lease
 * every third of its TTL. The lease is known valid until the send time of
 * the last granted renewal + TTL (etcd counts from when it received it,
 * which is later); a guard before that, the thread wakes the loop, which
 * stops answering (on_lost), and if the loop has not confirmed by half
 * the guard, the process exits (_exit) on its own. A new leader can only
 * win after etcd expired the lease, so no two controllers ever answer at
 * once.
 *
 * thread: campaign/publish/destroy on the loop's thread; one internal
 * keep-alive thread between start and destroy.
 */
#ifndef KVF_CONTROLLER_ELECTION_H
#define KVF_CONTROLLER_ELECTION_H

#include "controller/config.h"

#include <kvfabric/status.h>

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct event_base;

typedef struct kvf_election kvf_election_t;

/* Exit status of a controller that lost its lease. */
#define KVF_ELECTION_EXIT_LOST 3

kvf_status_t kvf_election_create(const kvf_controller_config_t *cfg,
                                 kvf_election_t **el_p);

/* Stops the keep-alive thread and, when still leader, revokes the lease
 * (a clean shutdown hands over at once). NULL is a no-op. */
void kvf_election_destroy(kvf_election_t *el);

/* A standby's wait of @p ns between looks at the leader key (a warm
 * standby runs its loop meanwhile, following the leader at @p control,
 * "" when none is published). Returns true to stop campaigning (the
 * caller's loop saw SIGTERM/SIGINT). */
typedef bool (*kvf_election_wait_cb_t)(void *arg, uint64_t ns,
                                       const char *control);

/* Before the campaign: wait through @p wait instead of sleeping; the
 * campaign then leaves the signals to the caller's loop. */
void kvf_election_set_wait(kvf_election_t *el, kvf_election_wait_cb_t wait,
                           void *arg);

/* Blocks until this controller is leader (KVF_OK) or SIGTERM/SIGINT
 * arrived while waiting (KVF_ERR_CANCELED). */
kvf_status_t kvf_election_campaign(kvf_election_t *el);

/* Whether SIGTERM/SIGINT arrived since the campaign began and before the
 * server installed its own handlers (a stop asked for at the moment of the
 * election): the caller then exits instead of serving. */
bool kvf_election_quit_requested(void);

/* Starts the keep-alive thread; @p on_lost runs on @p base's loop when
 * the lease is about to be lost; it must stop serving and return, then
 * the caller calls kvf_election_stopped(). */
kvf_status_t kvf_election_start(kvf_election_t *el, struct event_base *base,
                                void (*on_lost)(void *arg), void *arg);

/* The loop no longer answers anything (called after on_lost). */
void kvf_election_stopped(kvf_election_t *el);

/* Publishes the bound addresses of the leader under its key; when etcd
 * does not take it now, the keep-alive thread retries (never fails the
 * leader: clients find it through their list of controllers). */
kvf_status_t kvf_election_publish(kvf_election_t *el, const char *control,
                                  const char *http);

/* Monotonic time (kvf_time_now_ns()) until which the leader may answer,
 * renewed with the lease; the server checks it before each request, so a
 * leader resumed after a pause (SIGSTOP, VM freeze) answers nothing even
 * before the keep-alive thread wakes up. */
const _Atomic uint64_t *kvf_election_serve_until(kvf_election_t *el);

/* The leader's term (0 before it won). */
uint64_t kvf_election_term(const kvf_election_t *el);

/* true once the lease was lost or is about to be (on_lost ran, or the
 * serve-until time passed). */
bool kvf_election_lost(kvf_election_t *el);

/* The leader's small state that must outlive it (pins, drained nodes):
 * PREFIX/state/NAME, written only while this controller's term holds
 * (KVF_ERR_STATE once deposed), read when elected. Blocking, bounded by a
 * third of the lease; loop thread. */
kvf_status_t kvf_election_state_put(kvf_election_t *el, const char *name,
                                    const char *value);
kvf_status_t kvf_election_state_get(kvf_election_t *el, const char *name,
                                    char *value, size_t len, bool *found_p);

typedef struct kvf_election_info {
    uint64_t elections_won; /* by this process */
    uint64_t leader_term;   /* the leader's term, as last seen */
    uint64_t leader_ns;     /* time as leader in the current term (0) */
} kvf_election_info_t;

/* Counters for /metrics and /healthz; loop thread. */
void kvf_election_info(const kvf_election_t *el, kvf_election_info_t *info_p);

#endif /* KVF_CONTROLLER_ELECTION_H */
