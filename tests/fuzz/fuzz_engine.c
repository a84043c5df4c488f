/* SPDX-License-Identifier: Apache-2.0 */
/* Copyright (c) 2026 The kvfabric authors */
/*
 * libFuzzer target for every agent engine-socket handler (HELLO, AUTH,
 * ALLOC, COMMIT, LOOKUP, RETRIEVE, RELEASE, STATS): the bytes after the
 * first are the frame stream one engine connection sends to a fresh
 * agent engine server over a small pool (kvf_engine_server_feed()). Bit 0
 * of the first byte turns the cluster secret on, so the handshake is
 * fuzzed too.
 */
#include "agent/engine_server.h"
#include "agent/store.h"

#include <kvfabric/log.h>

#include <event2/event.h>

#include <signal.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define KVF_FUZZ_CHUNK (64u << 10)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static char path[64];
    kvf_pool_params_t pp = {
        .field_mask = KVF_POOL_FIELD_SIZE | KVF_POOL_FIELD_MAX_CHUNK |
                      KVF_POOL_FIELD_MIN_CHUNK | KVF_POOL_FIELD_NO_HUGETLB,
        .size      = 8 * KVF_FUZZ_CHUNK,
        .min_chunk = KVF_FUZZ_CHUNK,
        .max_chunk = KVF_FUZZ_CHUNK,
    };
    kvf_store_params_t sp = {.pool = &pp};
    kvf_engine_server_params_t ep;
    kvf_engine_server_t *server;
    kvf_auth_secret_t secret;
    struct event_base *base;
    kvf_store_t *store;

    if (size < 1) {
        return 0;
    }
    if (path[0] == '\0') {
        snprintf(path, sizeof(path), "/tmp/kvf-fuzz-engine-%d.sock",
                 (int)getpid());
        signal(SIGPIPE, SIG_IGN);
        kvf_log_set_handler(NULL, NULL);
    }
    memset(&secret, 0, sizeof(secret));
    if (data[0] & 1) {
        memcpy(secret.key, "fuzz-cluster-secret", 19);
        secret.len = 19;
    }
    base = event_base_new();
    if ((base == NULL) || (kvf_store_create(&sp, &store) != KVF_OK)) {
        abort();
    }
    memset(&ep, 0, sizeof(ep));
    ep.base            = base;
    ep.path            = path;
    ep.store           = store;
    ep.node_name       = "fuzz-node";
    ep.max_frame       = 1u << 20;
    ep.max_connections = 4;
    ep.secret          = &secret;
    if (kvf_engine_server_create(&ep, &server) != KVF_OK) {
        abort();
    }
    kvf_engine_server_feed(server, data + 1, size - 1);
    kvf_engine_server_destroy(server);
    kvf_store_destroy(store);
    event_base_free(base);
    return 0;
}
