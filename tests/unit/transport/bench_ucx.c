/* SPDX-License-Identifier: Apache-2.0 */
/* Copyright (c) 2026 The kvfabric authors */
/*
 * bench-transport SIZE COUNT [WINDOW]: loopback throughput of the UCX layer
 * itself, to compare with ucx_perftest -t ucp_am_bw in the same run (set
 * UCX_TLS the same for both). A server thread and a client thread, each
 * with its own loop, context and worker; the client keeps WINDOW
 * rendezvous active messages of SIZE bytes in flight, the server receives
 * each straight into a registered ring of slots. Prints one JSON line.
 * Built, not run by meson test; kvf-bench p2p supersedes it.
 */
#include "transport/ucx.h"

#include "common/log.h"
#include "common/time.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define KVF_BENCH_AM_ID  1
#define KVF_BENCH_SLOTS  16
#define KVF_BENCH_WARMUP 20

typedef struct kvf_bench_server {
    kvf_ucx_worker_t *worker;
    kvf_ucx_mem_t *mem;
    unsigned char *ring;
    size_t size;
    unsigned received;
    unsigned errors;
} kvf_bench_server_t;

typedef struct kvf_bench_client {
    unsigned sent;
    unsigned completed;
    unsigned errors;
} kvf_bench_client_t;

static _Atomic int kvf_bench_port;
static _Atomic int kvf_bench_stop;
static size_t kvf_bench_size;

static void kvf_bench_on_recv(kvf_status_t status, void *arg)
{
    kvf_bench_server_t *s = arg;

    if (status != KVF_OK) {
        s->errors++;
    }
}

static kvf_status_t kvf_bench_on_am(void *arg, const void *header,
                                    size_t header_len,
                                    const kvf_ucx_am_msg_t *msg)
{
    kvf_bench_server_t *s = arg;
    unsigned slot         = s->received++ % KVF_BENCH_SLOTS;

    if (kvf_ucx_am_recv_data(msg, s->ring + (size_t)slot * s->size, s->size,
                             s->mem, 0, kvf_bench_on_recv, s) != KVF_OK) {
        s->errors++;
    }
    return KVF_OK;
}

static void *kvf_bench_server_main(void *arg)
{
    kvf_bench_server_t s    = {.size = kvf_bench_size};
    struct event_base *base = event_base_new();
    kvf_ucx_listener_t *lsn = NULL;
    kvf_ucx_ctx_t *ctx      = NULL;

    s.ring = aligned_alloc(4096, KVF_BENCH_SLOTS * s.size);
    if ((base == NULL) || (s.ring == NULL) ||
        (kvf_ucx_ctx_create(NULL, &ctx) != KVF_OK) ||
        (kvf_ucx_worker_create(ctx, base, NULL, &s.worker) != KVF_OK) ||
        (kvf_ucx_mem_register(ctx, s.ring, KVF_BENCH_SLOTS * s.size,
                              KVF_UCX_MEM_REMOTE_WRITE, &s.mem) != KVF_OK) ||
        (kvf_ucx_am_set_handler(s.worker, KVF_BENCH_AM_ID, kvf_bench_on_am,
                                &s) != KVF_OK) ||
        (kvf_ucx_listener_create(s.worker, "127.0.0.1", 0, NULL, NULL, &lsn) !=
         KVF_OK)) {
        fprintf(stderr, "bench-transport: server setup failed\n");
        exit(1);
    }
    memset(s.ring, 0, KVF_BENCH_SLOTS * s.size);
    atomic_store(&kvf_bench_port, kvf_ucx_listener_port(lsn));
    while (!atomic_load(&kvf_bench_stop)) {
        event_base_loop(base, EVLOOP_ONCE | EVLOOP_NONBLOCK);
    }
    if (s.errors != 0) {
        fprintf(stderr, "bench-transport: %u receive errors\n", s.errors);
    }
    kvf_ucx_listener_destroy(lsn);
    kvf_ucx_worker_destroy(s.worker);
    kvf_ucx_mem_deregister(s.mem);
    kvf_ucx_ctx_destroy(ctx);
    event_base_free(base);
    free(s.ring);
    return NULL;
}

static void kvf_bench_on_send(kvf_status_t status, void *arg)
{
    kvf_bench_client_t *c = arg;

    c->completed++;
    if (status != KVF_OK) {
        c->errors++;
    }
}

int main(int argc, char **argv)
{
    kvf_bench_client_t c     = {0};
    struct event_base *base  = NULL;
    kvf_ucx_worker_t *worker = NULL;
    kvf_ucx_ctx_t *ctx       = NULL;
    kvf_ucx_mem_t *mem       = NULL;
    kvf_ucx_ep_t *ep         = NULL;
    unsigned char *src;
    unsigned count;
    unsigned window;
    unsigned c0 = 0;
    uint64_t t0 = 0;
    uint64_t t1;
    char peer[64];
    pthread_t server;

    kvf_log_init_from_env();
    if (argc < 3) {
        fprintf(stderr, "usage: bench-transport SIZE COUNT [WINDOW]\n");
        return 2;
    }
    kvf_bench_size = strtoull(argv[1], NULL, 0);
    count          = (unsigned)strtoul(argv[2], NULL, 0);
    window         = (argc > 3) ? (unsigned)strtoul(argv[3], NULL, 0) : 8;
    if ((kvf_bench_size == 0) || (count == 0) || (window == 0)) {
        fprintf(stderr, "bench-transport: SIZE, COUNT, WINDOW must be > 0\n");
        return 2;
    }
    if (pthread_create(&server, NULL, kvf_bench_server_main, NULL) != 0) {
        return 1;
    }
    while (atomic_load(&kvf_bench_port) == 0) {
        /* the server thread binds its listener */
    }

    src  = aligned_alloc(4096, kvf_bench_size);
    base = event_base_new();
    if ((src == NULL) || (base == NULL) ||
        (kvf_ucx_ctx_create(NULL, &ctx) != KVF_OK) ||
        (kvf_ucx_worker_create(ctx, base, NULL, &worker) != KVF_OK) ||
        (kvf_ucx_mem_register(ctx, src, kvf_bench_size, 0, &mem) != KVF_OK)) {
        fprintf(stderr, "bench-transport: client setup failed\n");
        return 1;
    }
    memset(src, 0x5a, kvf_bench_size);
    snprintf(peer, sizeof(peer), "127.0.0.1:%d", atomic_load(&kvf_bench_port));
    if (kvf_ucx_ep_get(worker, peer, NULL, &ep) != KVF_OK) {
        return 1;
    }

    while (c.completed < count + KVF_BENCH_WARMUP) {
        if ((t0 == 0) && (c.completed >= KVF_BENCH_WARMUP)) {
            t0 = kvf_time_now_ns();
            c0 = c.completed;
        }
        while ((c.sent < count + KVF_BENCH_WARMUP) &&
               (c.sent - c.completed < window) &&
               (kvf_ucx_am_send(ep, KVF_BENCH_AM_ID, NULL, 0, src,
                                kvf_bench_size, mem, KVF_UCX_AM_SEND_RNDV, 0,
                                kvf_bench_on_send, &c) == KVF_OK)) {
            c.sent++;
        }
        event_base_loop(base, EVLOOP_ONCE | EVLOOP_NONBLOCK);
    }
    t1 = kvf_time_now_ns();
    printf("{\"bench\":\"transport\",\"primitive\":\"am_rndv\","
           "\"size\":%zu,\"count\":%u,\"window\":%u,\"GBps\":%.3f,"
           "\"errors\":%u}\n",
           kvf_bench_size, c.completed - c0, window,
           (double)kvf_bench_size * (c.completed - c0) / (double)(t1 - t0),
           c.errors);

    atomic_store(&kvf_bench_stop, 1);
    pthread_join(server, NULL);
    kvf_ucx_ep_put(ep);
    kvf_ucx_worker_destroy(worker);
    kvf_ucx_mem_deregister(mem);
    kvf_ucx_ctx_destroy(ctx);
    event_base_free(base);
    free(src);
    return (c.errors == 0) ? 0 : 1;
}
