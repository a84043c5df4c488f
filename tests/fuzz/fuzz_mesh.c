/* SPDX-License-Identifier: Apache-2.0 */
/* Copyright (c) 2026 The kvfabric authors */
/*
 * libFuzzer target for every agent-to-agent active-message handler: peer
 * service (PEER_FETCH, PEER_CHUNK), PD (control frames, PD_DATA) and the
 * mesh handshake, and ids nobody handles. Input: byte 0 bit 0 turns the
 * cluster secret on; byte 1 is the AM id; bytes 2-3 the header length
 * (little endian); then the header, then the payload. Each message is
 * delivered in process (kvf_ucx_am_deliver) as if it came from a peer on
 * an endpoint to a dead address, so replies fail without a network. The
 * agent side (store, mesh, peer, PD with a receive region) is made once
 * per secret mode and kept across inputs, like a long-lived agent.
 */
#include "agent/mesh.h"
#include "agent/pd.h"
#include "agent/peer.h"
#include "agent/store.h"
#include "transport/ucx.h"

#include <kvfabric/log.h>

#include <event2/event.h>

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define KVF_FUZZ_CHUNK (64u << 10)

typedef struct kvf_fuzz_agent {
    struct event_base *base;
    kvf_ucx_ctx_t *ctx;
    kvf_ucx_worker_t *worker;
    kvf_store_t *store;
    kvf_ucx_mem_t *pool_mem;
    kvf_mesh_t *mesh;
    kvf_peer_t *peer;
    kvf_pd_t *pd;
    kvf_ucx_ep_t *ep; /* to nowhere: the "peer" messages come from */
    kvf_auth_secret_t secret;
} kvf_fuzz_agent_t;

static kvf_fuzz_agent_t kvf_fuzz_agents[2];

/* At exit, in the agent's order: nothing left for LeakSanitizer. */
static void kvf_fuzz_agents_destroy(void)
{
    kvf_fuzz_agent_t *a;
    unsigned i;

    for (i = 0; i < 2; i++) {
        a = &kvf_fuzz_agents[i];
        if (a->base == NULL) {
            continue;
        }
        kvf_ucx_ep_put(a->ep);
        kvf_ucx_worker_destroy(a->worker);
        kvf_peer_destroy(a->peer);
        kvf_pd_destroy(a->pd);
        kvf_mesh_destroy(a->mesh);
        kvf_ucx_mem_deregister(a->pool_mem);
        kvf_store_destroy(a->store);
        kvf_ucx_ctx_destroy(a->ctx);
        event_base_free(a->base);
        memset(a, 0, sizeof(*a));
    }
}

static kvf_fuzz_agent_t *kvf_fuzz_agent_get(bool is_secure)
{
    kvf_fuzz_agent_t *agents = kvf_fuzz_agents;
    kvf_fuzz_agent_t *a      = &agents[is_secure ? 1 : 0];
    kvf_ucx_ctx_params_t cp  = {.field_mask = KVF_UCX_CTX_FIELD_TLS,
                                .tls        = "tcp"};
    kvf_pool_params_t pp     = {
            .field_mask = KVF_POOL_FIELD_SIZE | KVF_POOL_FIELD_MAX_CHUNK |
                          KVF_POOL_FIELD_MIN_CHUNK | KVF_POOL_FIELD_NO_HUGETLB,
            .size      = 16 * KVF_FUZZ_CHUNK,
            .min_chunk = KVF_FUZZ_CHUNK,
            .max_chunk = KVF_FUZZ_CHUNK,
    };
    kvf_store_params_t sp   = {.pool = &pp};
    kvf_ucx_ep_params_t epp = {.field_mask = KVF_UCX_EP_FIELD_SOCKADDR,
                               .sockaddr   = "127.0.0.1:9"};
    kvf_mesh_params_t mp;
    kvf_peer_params_t peer;
    kvf_pd_params_t pd;
    static uint8_t region[8 * KVF_FUZZ_CHUNK];

    if (a->base != NULL) {
        return a;
    }
    kvf_log_set_handler(NULL, NULL);
    if ((kvf_fuzz_agents[0].base == NULL) &&
        (kvf_fuzz_agents[1].base == NULL)) {
        atexit(kvf_fuzz_agents_destroy);
    }
    if (is_secure) {
        memcpy(a->secret.key, "fuzz-cluster-secret", 19);
        a->secret.len = 19;
    }
    a->base = event_base_new();
    if ((a->base == NULL) || (kvf_ucx_ctx_create(&cp, &a->ctx) != KVF_OK) ||
        (kvf_ucx_worker_create(a->ctx, a->base, NULL, &a->worker) != KVF_OK) ||
        (kvf_store_create(&sp, &a->store) != KVF_OK) ||
        (kvf_ucx_mem_register(a->ctx, kvf_store_base(a->store),
                              kvf_store_size(a->store), KVF_UCX_MEM_REMOTE_READ,
                              &a->pool_mem) != KVF_OK)) {
        abort();
    }
    memset(&mp, 0, sizeof(mp));
    mp.base   = a->base;
    mp.worker = a->worker;
    mp.name   = "fuzz-node";
    mp.secret = &a->secret;
    memset(&peer, 0, sizeof(peer));
    peer.base     = a->base;
    peer.pool_mem = a->pool_mem;
    peer.store    = a->store;
    peer.name     = "fuzz-node";
    memset(&pd, 0, sizeof(pd));
    pd.base             = a->base;
    pd.pool_mem         = a->pool_mem;
    pd.store            = a->store;
    pd.region_base      = region;
    pd.region_size      = sizeof(region);
    pd.queue_max        = 8;
    pd.takes_pieces     = true;
    pd.alloc_timeout_ns = 1000000000ull;
    pd.push_timeout_ns  = 1000000000ull;
    pd.wait_timeout_ns  = 1000000000ull;
    pd.claim_timeout_ns = 1000000000ull;
    pd.name             = "fuzz-node";
    if ((kvf_mesh_create(&mp, &a->mesh) != KVF_OK) ||
        ((peer.mesh = a->mesh) == NULL) ||
        (kvf_peer_create(&peer, &a->peer) != KVF_OK) ||
        ((pd.mesh = a->mesh) == NULL) ||
        (kvf_pd_create(&pd, &a->pd) != KVF_OK) ||
        (kvf_ucx_ep_create(a->worker, &epp, &a->ep) != KVF_OK)) {
        abort();
    }
    return a;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    kvf_fuzz_agent_t *a;
    size_t header_len;

    if (size < 4) {
        return 0;
    }
    header_len = (size_t)data[2] | ((size_t)data[3] << 8);
    if (header_len > size - 4) {
        return 0;
    }
    a = kvf_fuzz_agent_get(data[0] & 1);
    kvf_ucx_am_deliver(a->worker, data[1], data + 4, header_len,
                       data + 4 + header_len, size - 4 - header_len,
                       (data[0] & 2) ? NULL : a->ep);
    /* let timers and completions run a little, as a loop would */
    event_base_loop(a->base, EVLOOP_NONBLOCK);
    return 0;
}
