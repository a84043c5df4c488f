/* SPDX-License-Identifier: Apache-2.0 */
/* Copyright (c) 2026 The kvfabric authors */
/*
 * libFuzzer target for the agent's handling of controller replies
 * (HELLO_REPLY with its auth challenge, STATUS, REGISTER_REPLY,
 * HEARTBEAT_REPLY commands, LOOKUP_REPLY, NODE_INFO_REPLY): the first byte
 * picks the connection state (bits 1-3) and the cluster secret (bit 0);
 * the rest is what the controller sends (kvf_ctl_client_feed()). In the
 * ready state a lookup (request 1) and a node query (request 2) are
 * pending, so their replies reach their parsers.
 */
#include "agent/ctl_client.h"

#include <kvfabric/log.h>

#include <event2/event.h>

#include <signal.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static volatile uint32_t kvf_fuzz_sink;

static void kvf_fuzz_on_inventory(void *arg, kvf_ctl_client_t *client)
{
    kvf_key_t key = {.ns = 1, .hi = 2, .lo = 3};

    kvf_ctl_client_inventory_add(client, &key);
    kvf_ctl_client_inventory_end(client);
}

static void kvf_fuzz_on_command(void *arg, const Kvf__Command *command)
{
    (void)command->keys.len;
}

static void kvf_fuzz_on_lookup(void *arg, kvf_status_t status,
                               uint32_t hit_chunks, const uint32_t *holders,
                               uint32_t num)
{
    uint32_t i;

    for (i = 0; (holders != NULL) && (i < num); i++) {
        kvf_fuzz_sink += holders[i]; /* ASan checks every holder read */
    }
}

static void kvf_fuzz_on_node(void *arg, kvf_status_t status, uint32_t node_id,
                             const char *data_address, bool alive)
{
    kvf_fuzz_sink += (uint32_t)strlen(data_address);
}

static const kvf_ctl_client_ops_t kvf_fuzz_ops = {
    .inventory = kvf_fuzz_on_inventory,
    .command   = kvf_fuzz_on_command,
};

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    kvf_key_t keys[3] = {{1, 2, 3}, {1, 2, 4}, {1, 2, 5}};
    kvf_ctl_client_params_t p;
    kvf_ctl_client_t *client;
    kvf_auth_secret_t secret;
    struct event_base *base;
    int state;

    if (size < 1) {
        return 0;
    }
    signal(SIGPIPE, SIG_IGN);
    kvf_log_set_handler(NULL, NULL);
    memset(&secret, 0, sizeof(secret));
    if (data[0] & 1) {
        memcpy(secret.key, "fuzz-cluster-secret", 19);
        secret.len = 19;
    }
    state = (data[0] >> 1) & 7;
    base  = event_base_new();
    if (base == NULL) {
        abort();
    }
    memset(&p, 0, sizeof(p));
    p.base               = base;
    p.controller         = "127.0.0.1:9";
    p.name               = "fuzz-agent";
    p.data_address       = "127.0.0.1:1";
    p.pool_capacity      = 1u << 20;
    p.connect_timeout_ns = 1000000000ull;
    p.request_timeout_ns = 1000000000ull;
    p.reconnect_max_ns   = 1000000000ull;
    p.flush_ns           = 1000000ull;
    p.max_frame          = 1u << 20;
    p.ops                = &kvf_fuzz_ops;
    p.secret             = &secret;
    if (kvf_ctl_client_create(&p, &client) != KVF_OK) {
        abort();
    }
    if (state == 3) {
        kvf_ctl_client_feed(client, state, NULL, 0);
        kvf_ctl_client_lookup(client, keys, 3, false, 1000000000ull,
                              kvf_fuzz_on_lookup, NULL);
        kvf_ctl_client_node_info(client, 7, kvf_fuzz_on_node, NULL);
        kvf_ctl_client_admit(client, &keys[0]);
    }
    kvf_ctl_client_feed(client, state, data + 1, size - 1);
    kvf_ctl_client_destroy(client);
    event_base_free(base);
    return 0;
}
