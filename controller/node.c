/* SPDX-License-Identifier: Apache-2.0 */
/* Copyright (c) 2026 The kvfabric authors */
#include "controller/node.h"

#include "common/log.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define KVF_NODE_TABLE_MAX 8192u

struct kvf_node_table {
    kvf_registry_t *reg;
    kvf_node_t **nodes; /* in registration order */
    size_t num_nodes;
    uint32_t next_id;
    uint64_t expired; /* nodes declared dead for want of a heartbeat */
    uint32_t slot_ids[KVF_REGISTRY_MAX_SLOTS]; /* holder slot -> node id */
};

kvf_status_t kvf_node_table_create(kvf_registry_t *reg,
                                   kvf_node_table_t **table_p)
{
    kvf_node_table_t *table;

    table = calloc(1, sizeof(*table));
    if (table == NULL) {
        return KVF_ERR_NO_MEMORY;
    }
    table->nodes = calloc(KVF_NODE_TABLE_MAX, sizeof(*table->nodes));
    if (table->nodes == NULL) {
        free(table);
        return KVF_ERR_NO_MEMORY;
    }
    table->reg     = reg;
    table->next_id = 1;
    *table_p       = table;
    return KVF_OK;
}

void kvf_node_cmd_clear(kvf_node_t *node)
{
    unsigned i;

    for (i = 0; i < node->num_cmds; i++) {
        free(node->cmds[i].keys);
    }
    node->num_cmds = 0;
}

static void kvf_node_free(kvf_node_t *node)
{
    kvf_node_cmd_clear(node);
    free(node->worker_address);
    free(node);
}

void kvf_node_table_destroy(kvf_node_table_t *table)
{
    size_t i;

    if (table == NULL) {
        return;
    }
    for (i = 0; i < table->num_nodes; i++) {
        kvf_node_free(table->nodes[i]);
    }
    free(table->nodes);
    free(table);
}

const char *kvf_node_state_name(kvf_node_state_t state)
{
    switch (state) {
    case KVF_NODE_ALIVE:
        return "alive";
    case KVF_NODE_DRAINING:
        return "draining";
    case KVF_NODE_DEAD:
        return "dead";
    }
    return "unknown";
}

kvf_node_t *kvf_node_table_find(kvf_node_table_t *table, uint32_t id)
{
    size_t i;

    /* newest first: live nodes are usually recent */
    for (i = table->num_nodes; i-- > 0;) {
        if (table->nodes[i]->id == id) {
            return table->nodes[i];
        }
    }
    return NULL;
}

kvf_node_t *kvf_node_table_find_name(kvf_node_table_t *table, const char *name)
{
    size_t i;

    for (i = table->num_nodes; i-- > 0;) {
        if (strcmp(table->nodes[i]->name, name) == 0) {
            return table->nodes[i];
        }
    }
    return NULL;
}

void kvf_node_table_kill(kvf_node_table_t *table, kvf_node_t *node,
                         uint64_t now_ms, const char *why)
{
    if (node->state == KVF_NODE_DEAD) {
        return;
    }
    kvf_info("node %" PRIu32 " (%s) dead: %s; purging %" PRIu64 " keys",
             node->id, node->name, why,
             kvf_registry_slot_keys(table->reg, node->slot));
    kvf_registry_slot_close(table->reg, node->slot);
    table->slot_ids[node->slot] = 0;
    node->slot                  = 0;
    node->state                 = KVF_NODE_DEAD;
    node->dead_since_ms         = now_ms;
    kvf_node_cmd_clear(node);
}

kvf_status_t kvf_node_table_reslot(kvf_node_table_t *table, kvf_node_t *node)
{
    uint16_t slot;
    kvf_status_t status;

    status = kvf_registry_slot_open(table->reg, &slot);
    if (status != KVF_OK) {
        return status;
    }
    kvf_registry_slot_close(table->reg, node->slot);
    table->slot_ids[node->slot] = 0;
    table->slot_ids[slot]       = node->id;
    node->slot                  = slot;
    node->is_resynced           = false;
    kvf_registry_slot_set_excluded(table->reg, slot,
                                   node->state == KVF_NODE_DRAINING);
    return KVF_OK;
}

static bool kvf_node_str_ok(const char *s, size_t max)
{
    return (s == NULL) || (strnlen(s, max) < max);
}

static const char *kvf_node_str(const char *s)
{
    return (s != NULL) ? s : "";
}

/* Length of the host part of HOST:PORT ("[::1]:7600" -> 5). */
static size_t kvf_node_host_len(const char *addr)
{
    const char *colon = strrchr(addr, ':');

    return (colon != NULL) ? (size_t)(colon - addr) : strlen(addr);
}

/* Whether a registration comes from the agent that holds @p old: the same
 * peer address, or the same host and engine socket (a restart that got a
 * new ephemeral data port). */
static bool kvf_node_is_same_agent(const kvf_node_t *old,
                                   const kvf_node_params_t *params)
{
    const char *data = kvf_node_str(params->data_address);
    const char *ctrl = kvf_node_str(params->control_address);
    size_t hlen      = kvf_node_host_len(data);

    if (strcmp(old->data_address, data) == 0) {
        return true;
    }
    return (ctrl[0] != '\0') && (strcmp(old->control_address, ctrl) == 0) &&
           (kvf_node_host_len(old->data_address) == hlen) &&
           (strncmp(old->data_address, data, hlen) == 0);
}

/* Whether another agent may take @p old's name: asked to, or the holder
 * has been silent for longer than its lease. */
static bool kvf_node_may_take_over(const kvf_node_t *old,
                                   const kvf_node_params_t *params,
                                   uint64_t now_ms)
{
    return params->is_replace ||
           ((params->lease_ms > 0) &&
            (now_ms - old->last_heartbeat_ms > params->lease_ms));
}

kvf_status_t kvf_node_table_register(kvf_node_table_t *table,
                                     const kvf_node_params_t *params,
                                     uint64_t now_ms, kvf_node_t **node_p)
{
    kvf_node_t *old, *node;
    kvf_status_t status;

    if ((params->name == NULL) || (params->name[0] == '\0') ||
        !kvf_node_str_ok(params->name, KVF_NODE_NAME_MAX) ||
        !kvf_node_str_ok(params->control_address, KVF_NODE_ADDR_MAX) ||
        !kvf_node_str_ok(params->data_address, KVF_NODE_ADDR_MAX) ||
        !kvf_node_str_ok(params->instance_id, KVF_NODE_NAME_MAX) ||
        (params->worker_address_len > KVF_NODE_WORKER_MAX) ||
        ((params->tp_world > 0) && (params->tp_rank >= params->tp_world))) {
        return KVF_ERR_INVALID;
    }
    old = kvf_node_table_find_name(table, params->name);
    if ((old != NULL) && (old->state != KVF_NODE_DEAD)) {
        if (params->incarnation == old->incarnation) {
            return KVF_ERR_EXISTS;
        }
        if (kvf_node_is_same_agent(old, params)) {
            if (params->incarnation < old->incarnation) {
                return KVF_ERR_STALE;
            }
        } else if (!kvf_node_may_take_over(old, params, now_ms)) {
            /* incarnations of different hosts are not ordered: the name
             * stays with the live holder */
            return KVF_ERR_EXISTS;
        }
    }
    if (table->num_nodes == KVF_NODE_TABLE_MAX) {
        /* expire() forgets dead nodes; a full table of live ones is busy */
        return KVF_ERR_BUSY;
    }
    node = calloc(1, sizeof(*node));
    if (node == NULL) {
        return KVF_ERR_NO_MEMORY;
    }
    if (params->worker_address_len > 0) {
        node->worker_address = malloc(params->worker_address_len);
        if (node->worker_address == NULL) {
            status = KVF_ERR_NO_MEMORY;
            goto err_free_node;
        }
        memcpy(node->worker_address, params->worker_address,
               params->worker_address_len);
        node->worker_address_len = params->worker_address_len;
    }
    status = kvf_registry_slot_open(table->reg, &node->slot);
    if (status != KVF_OK) {
        goto err_free_node;
    }
    if ((old != NULL) && (old->state != KVF_NODE_DEAD)) {
        kvf_node_table_kill(table, old, now_ms,
                            params->is_replace ? "replaced (--replace)"
                                               : "replaced by new incarnation");
    }
    node->id    = table->next_id++;
    node->state = params->is_draining ? KVF_NODE_DRAINING : KVF_NODE_ALIVE;
    snprintf(node->name, sizeof(node->name), "%s", params->name);
    snprintf(node->control_address, sizeof(node->control_address), "%s",
             (params->control_address != NULL) ? params->control_address : "");
    snprintf(node->data_address, sizeof(node->data_address), "%s",
             (params->data_address != NULL) ? params->data_address : "");
    snprintf(node->instance_id, sizeof(node->instance_id), "%s",
             (params->instance_id != NULL) ? params->instance_id : "");
    node->role                       = params->role;
    node->tp_rank                    = params->tp_rank;
    node->tp_world                   = params->tp_world;
    node->incarnation                = params->incarnation;
    node->pool_capacity              = params->pool_capacity;
    node->last_heartbeat_ms          = now_ms;
    table->slot_ids[node->slot]      = node->id;
    table->nodes[table->num_nodes++] = node;
    kvf_registry_slot_set_excluded(table->reg, node->slot, params->is_draining);
    *node_p = node;
    return KVF_OK;

err_free_node:
    kvf_node_free(node);
    return status;
}

kvf_status_t kvf_node_table_check(kvf_node_table_t *table, uint32_t id,
                                  uint64_t incarnation, kvf_node_t **node_p)
{
    kvf_node_t *node = kvf_node_table_find(table, id);

    if (node == NULL) {
        return KVF_ERR_NOT_FOUND;
    }
    if ((node->state == KVF_NODE_DEAD) || (node->incarnation != incarnation)) {
        return KVF_ERR_STALE;
    }
    *node_p = node;
    return KVF_OK;
}

unsigned kvf_node_table_expire(kvf_node_table_t *table, uint64_t now_ms,
                               uint64_t lease_ms, uint64_t forget_ms)
{
    unsigned died = 0;
    size_t i, j = 0;

    for (i = 0; i < table->num_nodes; i++) {
        kvf_node_t *node = table->nodes[i];

        if ((node->state != KVF_NODE_DEAD) &&
            ((now_ms - node->last_heartbeat_ms) > lease_ms)) {
            kvf_node_table_kill(table, node, now_ms, "lease expired");
            table->expired++;
            died++;
        }
        if ((node->state == KVF_NODE_DEAD) &&
            ((now_ms - node->dead_since_ms) > forget_ms)) {
            kvf_node_free(node);
            continue;
        }
        table->nodes[j++] = node;
    }
    table->num_nodes = j;
    return died;
}

kvf_status_t kvf_node_cmd_push(kvf_node_t *node, int type, const uint8_t *keys,
                               size_t keys_len)
{
    kvf_node_cmd_t *cmd;

    if (node->num_cmds == KVF_NODE_COMMANDS_MAX) {
        return KVF_ERR_BUSY;
    }
    cmd = &node->cmds[node->num_cmds];
    memset(cmd, 0, sizeof(*cmd));
    cmd->type = type;
    if (keys_len > 0) {
        cmd->keys = malloc(keys_len);
        if (cmd->keys == NULL) {
            return KVF_ERR_NO_MEMORY;
        }
        memcpy(cmd->keys, keys, keys_len);
        cmd->keys_len = keys_len;
    }
    node->num_cmds++;
    return KVF_OK;
}

kvf_status_t kvf_node_set_transports(kvf_node_t *node, const char *value)
{
    size_t len, i;

    if (value == NULL) {
        value = "";
    }
    len = strnlen(value, KVF_NODE_TRANSPORTS_MAX);
    for (i = 0; i < len; i++) {
        /* shown in kvfctl's table and terminal: no spaces, no controls */
        unsigned char c = (unsigned char)value[i];

        if ((c <= ' ') || (c > '~')) {
            break;
        }
    }
    if ((len == KVF_NODE_TRANSPORTS_MAX) || (i < len)) {
        if (!node->is_transports_refused) {
            kvf_warn("node %" PRIu32 " (%s): heartbeat transports refused: "
                     "%s; shown as none",
                     node->id, node->name,
                     (len == KVF_NODE_TRANSPORTS_MAX)
                         ? "too long"
                         : "not printable ASCII without spaces");
        }
        node->is_transports_refused = true;
        node->transports[0]         = '\0';
        return KVF_ERR_PROTO;
    }
    node->is_transports_refused = false;
    memcpy(node->transports, value, len + 1);
    return KVF_OK;
}

size_t kvf_node_table_count(const kvf_node_table_t *table)
{
    return table->num_nodes;
}

kvf_node_t *kvf_node_table_at(kvf_node_table_t *table, size_t i)
{
    return (i < table->num_nodes) ? table->nodes[i] : NULL;
}

void kvf_node_table_census(const kvf_node_table_t *table, uint32_t *alive_p,
                           uint32_t *draining_p, uint32_t *dead_p)
{
    uint32_t n[3] = {0, 0, 0};
    size_t i;

    for (i = 0; i < table->num_nodes; i++) {
        n[table->nodes[i]->state]++;
    }
    *alive_p    = n[KVF_NODE_ALIVE];
    *draining_p = n[KVF_NODE_DRAINING];
    *dead_p     = n[KVF_NODE_DEAD];
}

uint32_t kvf_node_table_slot_id(const kvf_node_table_t *table, uint16_t slot)
{
    return (slot < KVF_REGISTRY_MAX_SLOTS) ? table->slot_ids[slot] : 0;
}

kvf_status_t kvf_node_table_adopt(kvf_node_table_t *table, uint32_t id,
                                  const kvf_node_params_t *params,
                                  kvf_node_state_t state, uint64_t now_ms,
                                  kvf_node_t **node_p)
{
    kvf_node_t *node = kvf_node_table_find(table, id), *old;
    kvf_status_t status;
    uint32_t next;

    if (node == NULL) {
        if (state == KVF_NODE_DEAD) {
            return KVF_ERR_NOT_FOUND; /* nothing to keep */
        }
        old = kvf_node_table_find_name(table, params->name);
        if ((old != NULL) && (old->id < id)) {
            kvf_node_table_kill(table, old, now_ms, "replaced on the leader");
        }
        next   = table->next_id;
        status = kvf_node_table_register(table, params, now_ms, &node);
        if (status != KVF_OK) {
            return status;
        }
        node->id                    = id;
        table->slot_ids[node->slot] = id;
        table->next_id              = (id >= next) ? id + 1 : next;
    }
    if (state == KVF_NODE_DEAD) {
        kvf_node_table_kill(table, node, now_ms, "dead on the leader");
    } else if (node->state != KVF_NODE_DEAD) {
        node->state = state;
        kvf_registry_slot_set_excluded(table->reg, node->slot,
                                       state == KVF_NODE_DRAINING);
    }
    *node_p = node;
    return KVF_OK;
}

uint64_t kvf_node_table_expired(const kvf_node_table_t *table)
{
    return table->expired;
}
