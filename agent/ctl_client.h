/* SPDX-License-Identifier: Apache-2.0 */
/* Copyright (c) 2026 The kvfabric authors */
/*
 * The agent's connection to kvf-controller: HELLO, REGISTER, heartbeats,
 * batched ADMIT/EVICT, INVENTORY resync, DEREGISTER, and the commands the
 * controller hands back in heartbeat replies. Reconnects with capped
 * exponential backoff; every request has a deadline.
 *
 * While disconnected, ADMIT/EVICT keys are dropped: after reconnecting the
 * agent resends its whole inventory, which supersedes them (soft state,
 * docs/protocol.md).
 *
 * thread: owning loop only.
 */
#ifndef KVF_AGENT_CTL_CLIENT_H
#define KVF_AGENT_CTL_CLIENT_H

#include "common/auth.h"
#include "proto/msg.h"
#include "proto/traffic.h"

#include <kvfabric/keys.h>
#include <kvfabric/status.h>

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct event_base;

typedef struct kvf_ctl_client kvf_ctl_client_t;

/* Pool usage and traffic counters reported in each heartbeat (the
 * counters are cumulative since the agent started). */
typedef struct kvf_ctl_usage {
    uint64_t pool_used;
    uint64_t pool_capacity;
    uint64_t entries;
    uint64_t pd_capacity; /* PD receive region bytes, 0: none */
    uint64_t pd_used;
    kvf_traffic_t traffic;
    uint64_t disk_capacity; /* local-disk tier bytes, 0: none */
    uint64_t disk_used;
    uint64_t disk_chunks;
    /* the distinct UCX transports of peer connections, "rc_mlx5,tcp";
     * "": none yet (kvf_transports_summary) */
    char transports[64];
} kvf_ctl_usage_t;

typedef struct kvf_ctl_client_ops {
    /* Registered (again): the client is ready for admits; when the
     * controller asks, it calls inventory next. May be NULL. */
    void (*registered)(void *arg, uint32_t node_id);
    /* Send the whole inventory now with kvf_ctl_client_inventory_add()
     * and kvf_ctl_client_inventory_end(). NULL: an empty inventory. */
    void (*inventory)(void *arg, kvf_ctl_client_t *client);
    /* A controller command (pin, unpin, clear, drain, replicate). The
     * message is valid during the call only. May be NULL. */
    void (*command)(void *arg, const Kvf__Command *command);
    /* Usage for the next heartbeat. May be NULL. */
    void (*usage)(void *arg, kvf_ctl_usage_t *usage);
    /* The deregistration that kvf_ctl_client_stop() started is over
     * (acknowledged, failed or timed out). */
    void (*stopped)(void *arg);
} kvf_ctl_client_ops_t;

typedef struct kvf_ctl_client_params {
    struct event_base *base;
    const char *controller; /* HOST:PORT[,HOST:PORT...] */
    /* etcd endpoints (http://HOST:PORT[,...]): the controller is the
     * leader published there, re-read whenever the connection is lost;
     * NULL/empty: the controller list above */
    const char *etcd;
    const char *etcd_prefix; /* NULL: "/kvfabric" */
    const char *name;
    int role;                   /* kvf_agent_role_t */
    const void *worker_address; /* UCX worker address blob, may be NULL */
    size_t worker_address_len;
    const char *data_address; /* HOST:PORT of the peer service */
    const char *control_address;
    uint64_t pool_capacity;
    const char *instance_id;
    uint32_t tp_rank;
    uint32_t tp_world;
    uint64_t connect_timeout_ns;
    uint64_t request_timeout_ns;
    uint64_t reconnect_max_ns;
    uint64_t flush_ns; /* ADMIT/EVICT coalescing window */
    uint32_t max_frame;
    const kvf_ctl_client_ops_t *ops;
    void *arg;                       /* passed to ops */
    const kvf_auth_secret_t *secret; /* borrowed; NULL/empty: no auth */
    const char *tls_ca;              /* PEM CA file; NULL/empty: plain TCP */
    const char *tls_server_name;     /* checked in the controller's
                                        certificate; NULL/empty: chain only */
    bool is_replace; /* take the name over from a live node elsewhere
                        (--replace); only until registered once */
} kvf_ctl_client_params_t;

typedef struct kvf_ctl_client_stats {
    uint64_t connects;
    uint64_t registrations;
    uint64_t heartbeats;
    uint64_t admitted_keys;
    uint64_t evicted_keys;
    uint64_t batches;
    uint64_t inventory_keys;
    uint64_t commands;
    uint64_t errors;
} kvf_ctl_client_stats_t;

/* Creates the client and starts connecting. Strings and the worker address
 * are copied. KVF_ERR_INVALID for a bad controller address, KVF_ERR_CONFIG
 * for a tls_ca that cannot be loaded. */
kvf_status_t kvf_ctl_client_create(const kvf_ctl_client_params_t *params,
                                   kvf_ctl_client_t **client_p);

/* Puts the client in a connection state (0 HELLO sent, 1 AUTH sent, 2
 * REGISTER sent, 3 ready, 4 DEREGISTER sent) on a fresh socket and
 * handles @p len bytes as the controller's replies (fuzzing, tests). */
void kvf_ctl_client_feed(kvf_ctl_client_t *client, int state, const void *data,
                         size_t len);

/* Whether the node is draining: reported in every registration, so that
 * a restarted controller keeps the drain. */
void kvf_ctl_client_set_draining(kvf_ctl_client_t *client, bool is_draining);

/* Why the client is not registered ("" once registered): the last
 * connect, handshake or registration failure, with its reason. */
const char *kvf_ctl_client_problem(const kvf_ctl_client_t *client);

/* Name of the node whose peer service is @p data_address, as learnt
 * from NODE_INFO replies (holders fetched from, decoders pushed to);
 * NULL when unknown. Valid until the next call into the client. */
const char *kvf_ctl_client_name_of(const kvf_ctl_client_t *client,
                                   const char *data_address);

/* Closes the connection without deregistering; NULL is a no-op. */
void kvf_ctl_client_destroy(kvf_ctl_client_t *client);

/* Queues a key for the next ADMIT / EVICT batch (sent within flush_ns). */
void kvf_ctl_client_admit(kvf_ctl_client_t *client, const kvf_key_t *key);
void kvf_ctl_client_evict(kvf_ctl_client_t *client, const kvf_key_t *key);

/* Queues an ADMIT of @p key on @p medium: the node now keeps it there (a
 * pool eviction the disk tier keeps: MEDIUM_DISK; a promotion back:
 * MEDIUM_HOST). kvf_ctl_client_admit() is MEDIUM_HOST. */
void kvf_ctl_client_admit_medium(kvf_ctl_client_t *client, const kvf_key_t *key,
                                 Kvf__Medium medium);

/* Inside ops->inventory: adds keys, then ends the inventory. */
void kvf_ctl_client_inventory_add(kvf_ctl_client_t *client,
                                  const kvf_key_t *key);
void kvf_ctl_client_inventory_end(kvf_ctl_client_t *client);

/* As kvf_ctl_client_inventory_add, on @p medium (batches carry one medium:
 * add the keys of one medium together). */
void kvf_ctl_client_inventory_add_medium(kvf_ctl_client_t *client,
                                         const kvf_key_t *key,
                                         Kvf__Medium medium);

/* Flushes pending batches, deregisters, and calls ops->stopped when the
 * controller acknowledged or request_timeout passed (also at once when not
 * connected). */
void kvf_ctl_client_stop(kvf_ctl_client_t *client);

/* Answer to kvf_ctl_client_lookup(): @p holders has one node id per key
 * (0: none), valid during the call only. */
typedef void (*kvf_ctl_lookup_cb_t)(void *arg, kvf_status_t status,
                                    uint32_t hit_chunks,
                                    const uint32_t *holders, uint32_t num);

/* Answer to kvf_ctl_client_node_info(): the node's peer address (empty
 * when unknown), valid during the call only. */
typedef void (*kvf_ctl_node_cb_t)(void *arg, kvf_status_t status,
                                  uint32_t node_id, const char *data_address,
                                  bool alive);

/* A holder's data address as a LOOKUP reply named it (@p name may be
 * ""); strings valid during the call only. */
typedef void (*kvf_ctl_node_learn_cb_t)(void *arg, uint32_t node_id,
                                        const char *name,
                                        const char *data_address);

/* Every LOOKUP from now on asks for the holders' data addresses; each one
 * a reply names goes to @p cb (before the lookup's own callback), so a
 * fetch reaches holders without NODE_INFO. @p cb NULL: stop asking. */
void kvf_ctl_client_set_node_learn(kvf_ctl_client_t *client,
                                   kvf_ctl_node_learn_cb_t cb, void *arg);

/* Asks the controller which nodes hold @p keys (an ordered chain, or each
 * key on its own with @p any_order). @p cb runs exactly once: with the
 * answer, or with KVF_ERR_CLOSED / KVF_ERR_TIMEOUT (after @p timeout_ns;
 * 0: request_timeout) / KVF_ERR_STATE (not registered). Never from inside
 * this call. */
void kvf_ctl_client_lookup(kvf_ctl_client_t *client, const kvf_key_t *keys,
                           uint32_t num, bool any_order, uint64_t timeout_ns,
                           kvf_ctl_lookup_cb_t cb, void *arg);

/* Resolves @p node_id to its peer address; @p cb as above. */
void kvf_ctl_client_node_info(kvf_ctl_client_t *client, uint32_t node_id,
                              kvf_ctl_node_cb_t cb, void *arg);

/* Resolves the node named @p name (the live one when several records
 * carry it) to its peer address; @p cb as above, KVF_ERR_NOT_FOUND when no
 * node has that name. */
void kvf_ctl_client_node_find(kvf_ctl_client_t *client, const char *name,
                              kvf_ctl_node_cb_t cb, void *arg);

/* Cancels every pending request whose arg is @p arg (its owner is going
 * away): their callbacks never run. */
void kvf_ctl_client_cancel(kvf_ctl_client_t *client, const void *arg);

bool kvf_ctl_client_is_registered(const kvf_ctl_client_t *client);
uint32_t kvf_ctl_client_node_id(const kvf_ctl_client_t *client);
void kvf_ctl_client_get_stats(const kvf_ctl_client_t *client,
                              kvf_ctl_client_stats_t *stats_p);

#endif /* KVF_AGENT_CTL_CLIENT_H */
