/* SPDX-License-Identifier: Apache-2.0 */
/* Copyright (c) 2026 The kvfabric authors */
/*
 * The engine socket's handshake deadline: with a cluster secret, a
 * connection that never authenticates is closed and counted.
 */
#include "agent/engine_server.h"
#include "agent/store.h"
#include "common/time.h"
#include "tests/helpers/test_helpers.h"

#include <criterion/criterion.h>
#include <event2/event.h>

#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

TestSuite(engine_server, .fini = kvf_test_check_leaks, .timeout = 30);

Test(engine_server, unauthenticated_connections_expire)
{
    kvf_pool_params_t pp = {
        .field_mask = KVF_POOL_FIELD_SIZE | KVF_POOL_FIELD_MAX_CHUNK |
                      KVF_POOL_FIELD_MIN_CHUNK | KVF_POOL_FIELD_NO_HUGETLB,
        .size      = 4 << 16,
        .min_chunk = 1 << 16,
        .max_chunk = 1 << 16,
    };
    kvf_store_params_t sp = {.pool = &pp};
    kvf_engine_server_params_t ep;
    kvf_engine_server_stats_t st;
    kvf_engine_server_t *server;
    kvf_auth_secret_t secret;
    struct event_base *base;
    struct sockaddr_un sun;
    kvf_store_t *store;
    char path[64], byte;
    int fd, i;

    memset(&secret, 0, sizeof(secret));
    memcpy(secret.key, "unit-test-cluster-secret", 24);
    secret.len = 24;
    snprintf(path, sizeof(path), "/tmp/kvf-ut-engine-%d.sock", (int)getpid());
    base = event_base_new();
    cr_assert_not_null(base);
    cr_assert_eq(kvf_store_create(&sp, &store), KVF_OK);
    memset(&ep, 0, sizeof(ep));
    ep.base            = base;
    ep.path            = path;
    ep.store           = store;
    ep.max_frame       = 1 << 20;
    ep.max_connections = 4;
    ep.secret          = &secret;
    cr_assert_eq(kvf_engine_server_create(&ep, &server), KVF_OK);

    fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    memset(&sun, 0, sizeof(sun));
    sun.sun_family = AF_UNIX;
    snprintf(sun.sun_path, sizeof(sun.sun_path), "%s", path);
    cr_assert_eq(connect(fd, (struct sockaddr *)&sun, sizeof(sun)), 0);
    for (i = 0; i < 1000; i++) {
        event_base_loop(base, EVLOOP_NONBLOCK);
        kvf_engine_server_get_stats(server, &st);
        if (st.active == 1) {
            break;
        }
        poll(NULL, 0, 2);
    }
    cr_assert_eq(st.active, 1, "accepted");

    kvf_engine_server_expire_handshakes(server, kvf_time_now_ns());
    kvf_engine_server_get_stats(server, &st);
    cr_assert_eq(st.active, 1, "not yet");
    kvf_engine_server_expire_handshakes(server, kvf_time_now_ns() +
                                                    KVF_ENGINE_HANDSHAKE_NS);
    kvf_engine_server_get_stats(server, &st);
    cr_assert_eq(st.active, 0, "closed");
    cr_assert_eq(st.auth_failures, 1, "counted once");
    for (i = 0; i < 1000; i++) { /* libevent closes the fd from its loop */
        struct pollfd pfd = {.fd = fd, .events = POLLIN};

        event_base_loop(base, EVLOOP_NONBLOCK);
        if (poll(&pfd, 1, 2) == 1) {
            break;
        }
    }
    cr_assert_eq(read(fd, &byte, 1), 0, "the engine sees the close");
    close(fd);

    kvf_engine_server_destroy(server);
    kvf_store_destroy(store);
    event_base_free(base);
}
