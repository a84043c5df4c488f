/* SPDX-License-Identifier: Apache-2.0 */
/* Copyright (c) 2026 The kvfabric authors */
/*
 * libFuzzer target for every controller message handler: the bytes after
 * the first are a frame stream one connection sends to a fresh in-memory
 * kvf-controller (kvf_server_feed()), through the same decode, handshake
 * and dispatch as a real connection. Bit 0 of the first byte turns the
 * cluster secret on (so the handshake is fuzzed too); without it, any
 * request right after HELLO reaches its handler.
 */
#include "controller/config.h"
#include "controller/server.h"
#include "controller/conn.h"
#include "controller/server_int.h"
#include "common/log.h"

#include <event2/event.h>

#include <signal.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static const char *const argv[] = {"fuzz",
                                       "--listen",
                                       "127.0.0.1:0",
                                       "--http",
                                       "",
                                       "--initial-keys",
                                       "64",
                                       "--max-batch",
                                       "1024",
                                       "--max-frame",
                                       "65536",
                                       "--recovery-window",
                                       "0",
                                       NULL};
    kvf_controller_config_t cfg;
    kvf_config_error_t err;
    struct event_base *base;
    kvf_server_t *server;

    if (size < 1) {
        return 0;
    }
    signal(SIGPIPE, SIG_IGN);
    kvf_log_set_handler(NULL, NULL); /* quiet: millions of runs */
    memset(&cfg, 0, sizeof(cfg));
    if (kvf_config_load(&kvf_controller_config_schema, &cfg, 13, argv, NULL,
                        &err) != KVF_OK) {
        abort();
    }
    base = event_base_new();
    if ((base == NULL) || (kvf_server_create(&cfg, base, &server) != KVF_OK)) {
        abort();
    }
    if (data[0] & 1) {
        memcpy(server->secret.key, "fuzz-cluster-secret", 19);
        server->secret.len = 19;
    }
    kvf_server_feed(server, data + 1, size - 1);
    kvf_server_destroy(server);
    event_base_free(base);
    kvf_config_cleanup(&kvf_controller_config_schema, &cfg);
    return 0;
}
