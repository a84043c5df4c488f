/* SPDX-License-Identifier: Apache-2.0 */
/* Copyright (c) 2026 The kvfabric authors */
/*
 * Node table: the agents known to the controller, their liveness and the
 * commands waiting for their next heartbeat reply.
 *
 * Node ids are never reused (a restarting agent gets a new one); each live
 * node owns one registry holder slot. Fencing: a message naming a node id
 * must carry that node's incarnation, else it is KVF_ERR_STALE.
 *
 * thread: owning loop only. Ownership: the table owns its nodes; pointers
 * returned stay valid until the next kvf_node_table_* call that may remove
 * nodes (register, expire, destroy).
 */
#ifndef KVF_CONTROLLER_NODE_H
#define KVF_CONTROLLER_NODE_H

#include "controller/registry.h"
#include "proto/traffic.h"

#include <kvfabric/status.h>

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define KVF_NODE_NAME_MAX       128
#define KVF_NODE_ADDR_MAX       256
#define KVF_NODE_WORKER_MAX     4096
#define KVF_NODE_COMMANDS_MAX   64
#define KVF_NODE_TRANSPORTS_MAX 64 /* Heartbeat.transports: 63 characters */

typedef enum {
    KVF_NODE_ALIVE = 0,
    KVF_NODE_DRAINING,
    KVF_NODE_DEAD,
} kvf_node_state_t;

typedef struct kvf_node_cmd {
    int type;      /* Kvf__CommandType */
    uint8_t *keys; /* owned, may be NULL */
    size_t keys_len;
} kvf_node_cmd_t;

typedef struct kvf_node {
    uint32_t id;
    uint16_t slot; /* registry holder slot; 0 once dead */
    kvf_node_state_t state;
    char name[KVF_NODE_NAME_MAX];
    int role; /* Kvf__Role */
    uint8_t *worker_address;
    size_t worker_address_len;
    char control_address[KVF_NODE_ADDR_MAX];
    char data_address[KVF_NODE_ADDR_MAX];
    char instance_id[KVF_NODE_NAME_MAX];
    uint32_t tp_rank;
    uint32_t tp_world;
    uint64_t incarnation;
    uint64_t pool_capacity;
    uint64_t pool_used;
    uint64_t pd_capacity; /* PD receive region, from heartbeats */
    uint64_t pd_used;
    uint64_t disk_capacity; /* local-disk tier, from heartbeats; 0: none */
    uint64_t disk_used;
    uint64_t disk_chunks;
    uint64_t entries;
    kvf_traffic_t traffic; /* its last heartbeat's */
    /* its last heartbeat's UCX transports ("rc_mlx5,tcp"), checked by
     * kvf_node_set_transports; "": none reported */
    char transports[KVF_NODE_TRANSPORTS_MAX];
    bool is_transports_refused; /* the last value was refused (logged) */
    uint64_t last_heartbeat_ms;
    uint64_t dead_since_ms;
    uint64_t last_seq;      /* last ADMIT/EVICT/INVENTORY seq applied */
    bool is_resynced;       /* sent INVENTORY with last set */
    bool is_resync_pending; /* a RESYNC command was queued */
    bool is_inventory_open; /* INVENTORY batches arriving, last not yet */
    bool is_adopted;        /* known from the previous leader (HA warm standby),
                               not yet registered with this one */
    kvf_node_cmd_t cmds[KVF_NODE_COMMANDS_MAX];
    unsigned num_cmds;
} kvf_node_t;

typedef struct kvf_node_params {
    const char *name;
    int role;
    const uint8_t *worker_address;
    size_t worker_address_len;
    const char *control_address;
    const char *data_address;
    const char *instance_id;
    uint32_t tp_rank;
    uint32_t tp_world;
    uint64_t incarnation;
    uint64_t pool_capacity;
    uint64_t lease_ms; /* a holder silent for longer may be taken over */
    bool is_replace;   /* the agent was started with --replace */
    bool is_draining;  /* the agent was draining before (kept across
                          controller restarts) */
} kvf_node_params_t;

typedef struct kvf_node_table kvf_node_table_t;

/* @p reg is borrowed and must outlive the table. */
kvf_status_t kvf_node_table_create(kvf_registry_t *reg,
                                   kvf_node_table_t **table_p);
void kvf_node_table_destroy(kvf_node_table_t *table);

/*
 * Registers a node. Names are identities: a live node of the same name
 * (heartbeat within params->lease_ms) is replaced (declared dead, its
 * holdings purged) only by a newer incarnation of the same agent, that is
 * one with the same data address, or the same data host and engine socket
 * (a restart), or one started with --replace; any other registration under
 * that name is KVF_ERR_EXISTS (kvf_node_table_find_name() names the
 * holder; incarnations of different hosts are not ordered). An older
 * incarnation of the same agent is KVF_ERR_STALE, the holder's own one
 * KVF_ERR_EXISTS. KVF_ERR_INVALID for bad params (empty
 * name, tp_rank >= tp_world, too long fields), KVF_ERR_BUSY when the table
 * is full.
 */
kvf_status_t kvf_node_table_register(kvf_node_table_t *table,
                                     const kvf_node_params_t *params,
                                     uint64_t now_ms, kvf_node_t **node_p);

/*
 * A standby's copy of a node of the leader (controller/replica.c): creates
 * node @p id with @p params (no name checks: the leader made them) in
 * @p state, or updates the state of the one it has; a node of the same
 * name and a lower id is declared dead (the leader replaced it). Ids stay
 * the leader's; later registrations continue after the highest seen.
 */
kvf_status_t kvf_node_table_adopt(kvf_node_table_t *table, uint32_t id,
                                  const kvf_node_params_t *params,
                                  kvf_node_state_t state, uint64_t now_ms,
                                  kvf_node_t **node_p);

/* Finds a node by id, any state; NULL when unknown. */
kvf_node_t *kvf_node_table_find(kvf_node_table_t *table, uint32_t id);

/* Finds the newest node of that name; NULL when unknown. */
kvf_node_t *kvf_node_table_find_name(kvf_node_table_t *table, const char *name);

/* Checks that @p id names a live node of @p incarnation: KVF_ERR_NOT_FOUND,
 * KVF_ERR_STALE (other incarnation or dead), else KVF_OK with *node_p. */
kvf_status_t kvf_node_table_check(kvf_node_table_t *table, uint32_t id,
                                  uint64_t incarnation, kvf_node_t **node_p);

/* Declares a node dead and starts purging its holdings. */
void kvf_node_table_kill(kvf_node_table_t *table, kvf_node_t *node,
                         uint64_t now_ms, const char *why);

/* Moves a live node to a fresh holder slot (its old holdings are purged),
 * used when it must resend its inventory. */
kvf_status_t kvf_node_table_reslot(kvf_node_table_t *table, kvf_node_t *node);

/* Declares dead every live node whose last heartbeat is older than
 * @p lease_ms; forgets dead nodes older than @p forget_ms. Returns how
 * many died. */
unsigned kvf_node_table_expire(kvf_node_table_t *table, uint64_t now_ms,
                               uint64_t lease_ms, uint64_t forget_ms);

/* Queues a command (keys copied). KVF_ERR_BUSY when its queue is full. */
kvf_status_t kvf_node_cmd_push(kvf_node_t *node, int type, const uint8_t *keys,
                               size_t keys_len);

/*
 * The transports a heartbeat of @p node reports (NULL or "": none). The
 * value comes from a peer: one of KVF_NODE_TRANSPORTS_MAX characters or
 * more, or with a character other than printable ASCII without spaces, is
 * refused: the node's value is cleared and KVF_ERR_PROTO returned (logged
 * once until a good value comes; the heartbeat itself stands).
 */
kvf_status_t kvf_node_set_transports(kvf_node_t *node, const char *value);

/* Frees the queued commands after they were sent. */
void kvf_node_cmd_clear(kvf_node_t *node);

/* Iteration: number of node records and the i-th (any state). */
size_t kvf_node_table_count(const kvf_node_table_t *table);
kvf_node_t *kvf_node_table_at(kvf_node_table_t *table, size_t i);

/* Nodes by state. */
void kvf_node_table_census(const kvf_node_table_t *table, uint32_t *alive_p,
                           uint32_t *draining_p, uint32_t *dead_p);

/* Nodes declared dead because their lease expired, since the table was
 * made (not those that deregistered or were replaced). */
uint64_t kvf_node_table_expired(const kvf_node_table_t *table);

/* Node id owning a holder slot, 0 when none. */
uint32_t kvf_node_table_slot_id(const kvf_node_table_t *table, uint16_t slot);

const char *kvf_node_state_name(kvf_node_state_t state);

#endif /* KVF_CONTROLLER_NODE_H */
