/* SPDX-License-Identifier: Apache-2.0 */
/* Copyright (c) 2026 The kvfabric authors */
/*
 * HA on etcd: what kvfctl set on the leader and must survive it (issue 21
 * item 3): the hard and soft pin sets and the names of the nodes drained
 * by hand. They are small; the leader writes them under
 * PREFIX/state/{pins,soft_pins,drained} (guarded by its term: a deposed
 * leader cannot overwrite its successor's) on the tick after a change,
 * retrying while etcd does not take them, and a new leader reads them
 * before it answers anything. A warm standby also has them from the
 * stream; etcd is what a cold one (or a whole restarted cluster) has.
 */
#include "controller/server_int.h"

#include "controller/election.h"
#include "common/log.h"
#include "common/time.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* etcd's default request limit is 1.5 MiB: about 30 000 pinned keys */
#define KVF_HASTATE_MAX_VALUE (1400u << 10)

static const char *const kvf_hastate_pin_names[2] = {"pins", "soft_pins"};

void kvf_hastate_changed(kvf_server_t *server)
{
    if (server->election != NULL) {
        server->is_ha_dirty = true;
    }
}

/* Is @p name a line of server->ha_drained? */
static const char *kvf_hastate_find(const kvf_server_t *server,
                                    const char *name)
{
    const char *p = server->ha_drained;
    size_t len    = strlen(name);

    while ((p != NULL) && (*p != '\0')) {
        size_t n = strcspn(p, "\n");

        if ((n == len) && (strncmp(p, name, len) == 0)) {
            return p;
        }
        p += n + ((p[n] == '\n') ? 1 : 0);
    }
    return NULL;
}

void kvf_hastate_drain(kvf_server_t *server, const char *name, bool is_drained)
{
    const char *at = kvf_hastate_find(server, name);
    size_t have = (server->ha_drained != NULL) ? strlen(server->ha_drained) : 0;

    if ((server->election == NULL) || ((at != NULL) == is_drained)) {
        return;
    }
    if (is_drained) {
        char *p = realloc(server->ha_drained, have + strlen(name) + 2);

        if (p == NULL) {
            kvf_warn("ha: out of memory: drain of %s not kept in etcd", name);
            return;
        }
        server->ha_drained = p;
        snprintf(p + have, strlen(name) + 2, "%s\n", name);
    } else {
        size_t off = (size_t)(at - server->ha_drained);
        size_t n   = strlen(name) + 1;

        memmove(server->ha_drained + off, server->ha_drained + off + n,
                have - off - n + 1);
    }
    kvf_hastate_changed(server);
}

void kvf_hastate_on_register(kvf_server_t *server, kvf_node_t *node)
{
    if ((node->state == KVF_NODE_ALIVE) &&
        (kvf_hastate_find(server, node->name) != NULL)) {
        node->state = KVF_NODE_DRAINING;
        kvf_registry_slot_set_excluded(server->reg, node->slot, true);
        kvf_info("node %u (%s) draining: drained before the failover", node->id,
                 node->name);
    }
}

static size_t kvf_hastate_count(const kvf_server_t *server)
{
    const char *p = server->ha_drained;
    size_t n      = 0;

    while ((p != NULL) && ((p = strchr(p, '\n')) != NULL)) {
        n++;
        p++;
    }
    return n;
}

static char *kvf_hastate_hex(const uint8_t *data, size_t len)
{
    static const char digits[] = "0123456789abcdef";
    char *out                  = malloc(2 * len + 1);
    size_t i;

    if (out == NULL) {
        return NULL;
    }
    for (i = 0; i < len; i++) {
        out[2 * i]     = digits[data[i] >> 4];
        out[2 * i + 1] = digits[data[i] & 15];
    }
    out[2 * len] = '\0';
    return out;
}

static int kvf_hastate_nibble(char c)
{
    if ((c >= '0') && (c <= '9')) {
        return c - '0';
    }
    if ((c >= 'a') && (c <= 'f')) {
        return c - 'a' + 10;
    }
    return -1;
}

/* Decodes whole packed keys of hex @p text into @p pins (replaced). */
static kvf_status_t kvf_hastate_unhex(const char *text, kvf_server_pins_t *pins)
{
    size_t len = strlen(text), i;
    uint8_t *keys;

    if ((len % (2 * KVF_KEY_WIRE_SIZE)) != 0) {
        return KVF_ERR_PROTO;
    }
    keys = malloc(len / 2 + 1);
    if (keys == NULL) {
        return KVF_ERR_NO_MEMORY;
    }
    for (i = 0; i < len / 2; i++) {
        int hi = kvf_hastate_nibble(text[2 * i]);
        int lo = kvf_hastate_nibble(text[2 * i + 1]);

        if ((hi < 0) || (lo < 0)) {
            free(keys);
            return KVF_ERR_PROTO;
        }
        keys[i] = (uint8_t)((hi << 4) | lo);
    }
    free(pins->keys);
    pins->keys = keys;
    pins->len  = len / 2;
    return KVF_OK;
}

void kvf_hastate_sync(kvf_server_t *server)
{
    kvf_status_t status = KVF_OK;
    char *value;
    int level;

    if (!server->is_ha_dirty || server->is_standby ||
        (server->election == NULL)) {
        return;
    }
    for (level = 0; (level < 2) && (status == KVF_OK); level++) {
        value =
            kvf_hastate_hex(server->pins[level].keys, server->pins[level].len);
        if (value == NULL) {
            return;
        }
        status =
            (strlen(value) < KVF_HASTATE_MAX_VALUE)
                ? kvf_election_state_put(server->election,
                                         kvf_hastate_pin_names[level], value)
                : KVF_ERR_TOO_BIG;
        free(value);
    }
    if (status == KVF_OK) {
        status = kvf_election_state_put(
            server->election, "drained",
            (server->ha_drained != NULL) ? server->ha_drained : "");
    }
    if (status == KVF_OK) {
        server->is_ha_dirty = false;
        kvf_debug("ha: pins and drained nodes written to etcd");
        return;
    }
    if (kvf_time_now_ms() - server->ha_warned_ms >= 10000) {
        server->ha_warned_ms = kvf_time_now_ms();
        kvf_warn("ha: pins and drained nodes not written to etcd yet (%s); "
                 "retrying",
                 kvf_status_name(status));
    }
}

kvf_status_t kvf_hastate_load(kvf_server_t *server)
{
    kvf_status_t status;
    size_t i, count;
    char *value;
    bool found;
    int level;

    if (server->election == NULL) {
        return KVF_OK;
    }
    value = malloc(KVF_HASTATE_MAX_VALUE);
    if (value == NULL) {
        return KVF_ERR_NO_MEMORY;
    }
    for (level = 0; level < 2; level++) {
        status = kvf_election_state_get(server->election,
                                        kvf_hastate_pin_names[level], value,
                                        KVF_HASTATE_MAX_VALUE, &found);
        if ((status == KVF_OK) && found) {
            status = kvf_hastate_unhex(value, &server->pins[level]);
        }
        if (status != KVF_OK) {
            kvf_warn("ha: cannot read %s from etcd (%s): keeping what the "
                     "stream had",
                     kvf_hastate_pin_names[level], kvf_status_name(status));
        }
    }
    status = kvf_election_state_get(server->election, "drained", value,
                                    KVF_HASTATE_MAX_VALUE, &found);
    if ((status == KVF_OK) && found) {
        free(server->ha_drained);
        server->ha_drained = strdup(value);
    }
    free(value);
    count = kvf_node_table_count(server->nodes);
    for (i = 0; i < count; i++) {
        kvf_hastate_on_register(server, kvf_node_table_at(server->nodes, i));
    }
    kvf_info("ha: %zu pinned and %zu soft-pinned keys, %zu drained nodes "
             "from etcd",
             server->pins[0].len / KVF_KEY_WIRE_SIZE,
             server->pins[1].len / KVF_KEY_WIRE_SIZE,
             kvf_hastate_count(server));
    return status;
}
