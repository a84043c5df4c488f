/* SPDX-License-Identifier: Apache-2.0 */
/* Copyright (c) 2026 The kvfabric authors */
#include "agent/agent.h"

#include "agent/ctl_client.h"
#include "agent/engine_server.h"
#include "agent/http.h"
#include "agent/local.h"
#include "agent/mesh.h"
#include "agent/pd.h"
#include "agent/peer.h"
#include "agent/store.h"
#include "agent/transports.h"
#include "common/log.h"
#include "common/time.h"
#include "transport/ucx.h"

#include <kvfabric/gpu.h>

#include <event2/event.h>

#include <arpa/inet.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define KVF_AGENT_DOWNS          32 /* failed peers tracked for logging */
#define KVF_AGENT_DOWN_REPORT_NS (10ull * KVF_NSEC_PER_SEC)
#define KVF_AGENT_DOWN_FORGET_NS (60ull * KVF_NSEC_PER_SEC)

struct kvf_agent {
    const kvf_agent_config_t *config;
    struct event_base *base;
    kvf_ctl_client_t *ctl;
    kvf_store_t *store;
    kvf_disk_t *disk; /* disk tier behind the store; NULL: none */
    kvf_engine_server_t *engines;
    kvf_peer_t *peer;
    kvf_local_t *local;          /* same-host path; NULL: off */
    kvf_transports_t transports; /* what each peer connection runs on */
    kvf_pd_t *pd;
    void *pd_device; /* pd_buffer_device: the GPU receive region */
    kvf_ucx_mem_t *pd_device_mem;
    kvf_ucx_ctx_t *ucx;
    kvf_ucx_worker_t *worker;
    kvf_mesh_t *mesh;             /* agent-to-agent messaging on worker */
    kvf_ucx_listener_t *listener; /* peer service */
    kvf_ucx_mem_t *pool_mem;      /* the pool, registered for remote read */
    kvf_ucx_mem_t *pd_host_mem;   /* the PD region after it, remote write */
    void *worker_address;
    size_t worker_address_len;
    char data_address[300];
    bool draining;          /* the controller asked this node to leave */
    struct event *sweep_ev; /* takes back expired grants, every second */
    kvf_agent_http_t *http; /* NULL: HTTP off */
    char name[256];
    bool stopping;
    kvf_auth_secret_t secret; /* cluster secret; empty: no auth */
    /* peers whose connections failed: the first failure is one warning
     * naming the node, the rest are counted and summarised by the sweep */
    struct kvf_agent_peer_down {
        char peer[96];
        uint64_t first_ns; /* of the failures not yet summarised */
        uint64_t last_ns;
        uint32_t unreported;
    } downs[KVF_AGENT_DOWNS];
    /* REPLICATE commands: chunks asked, then fetched or missed */
    uint64_t replicate_asked, replicate_fetched, replicate_missed;
};

static void kvf_agent_on_replicated(void *arg, uint32_t fetched,
                                    uint32_t missed)
{
    kvf_agent_t *agent = arg;

    agent->replicate_fetched += fetched;
    agent->replicate_missed += missed;
    kvf_info("agent %s: replication done: %u chunks fetched, %u missed",
             agent->name, fetched, missed);
}

static void kvf_agent_on_stopped(void *arg)
{
    kvf_agent_t *agent = arg;

    kvf_info("agent %s stopped", agent->name);
    event_base_loopexit(agent->base, NULL);
}

static void kvf_agent_on_command(void *arg, const Kvf__Command *command)
{
    kvf_agent_t *agent = arg;
    kvf_key_t *keys    = NULL;
    uint32_t n         = 0, i, found;

    if ((command->keys.len % KVF_KEY_WIRE_SIZE) != 0) {
        kvf_warn("agent %s: controller command %d with keys of %zu bytes "
                 "(not a multiple of %d); ignored",
                 agent->name, (int)command->type, command->keys.len,
                 KVF_KEY_WIRE_SIZE);
        return;
    }
    n = (uint32_t)(command->keys.len / KVF_KEY_WIRE_SIZE);
    if (n > 0) {
        keys = malloc(n * sizeof(*keys));
        if (keys == NULL) {
            kvf_error("agent %s: no memory for a command of %u keys",
                      agent->name, n);
            return;
        }
        for (i = 0; i < n; i++) {
            kvf_key_unpack(command->keys.data + (size_t)i * KVF_KEY_WIRE_SIZE,
                           &keys[i]);
        }
    }
    switch (command->type) {
    case KVF__COMMAND_TYPE__COMMAND_PIN:
        found = kvf_store_set_pin(agent->store, keys, n, KVF_POOL_PIN_HARD);
        kvf_info("agent %s: pinned %u of %u chunks held here", agent->name,
                 found, n);
        break;
    case KVF__COMMAND_TYPE__COMMAND_SOFT_PIN:
        found = kvf_store_set_pin(agent->store, keys, n, KVF_POOL_PIN_SOFT);
        kvf_info("agent %s: soft-pinned %u of %u chunks held here", agent->name,
                 found, n);
        break;
    case KVF__COMMAND_TYPE__COMMAND_UNPIN:
        found = kvf_store_set_pin(agent->store, keys, n, KVF_POOL_PIN_NONE);
        kvf_info("agent %s: unpinned %u of %u chunks held here", agent->name,
                 found, n);
        break;
    case KVF__COMMAND_TYPE__COMMAND_CLEAR:
        kvf_info("agent %s: cleared %llu chunks on the controller's request",
                 agent->name,
                 (unsigned long long)kvf_store_clear(agent->store));
        break;
    case KVF__COMMAND_TYPE__COMMAND_REPLICATE:
        /* warm this node: pull the named chunks from their holders */
        if ((n > 0) &&
            (kvf_peer_fetch(agent->peer, keys, n, kvf_agent_on_replicated,
                            agent) == KVF_OK)) {
            agent->replicate_asked += n;
            kvf_info("agent %s: replicating %u chunks", agent->name, n);
        }
        break;
    case KVF__COMMAND_TYPE__COMMAND_DRAIN:
        agent->draining = true;
        /* reported in the next registration: a restarted controller keeps
         * the drain */
        kvf_ctl_client_set_draining(agent->ctl, true);
        kvf_pd_set_draining(agent->pd, true);
        kvf_info("agent %s: draining: no longer chosen as a holder",
                 agent->name);
        break;
    case KVF__COMMAND_TYPE__COMMAND_UNDRAIN:
        agent->draining = false;
        kvf_ctl_client_set_draining(agent->ctl, false);
        kvf_pd_set_draining(agent->pd, false);
        kvf_info("agent %s: drain undone: chosen as a holder again",
                 agent->name);
        break;
    default:
        kvf_warn("agent %s: controller command %d is not supported by this "
                 "version; ignored",
                 agent->name, (int)command->type);
        break;
    }
    free(keys);
}

static void kvf_agent_inventory_key(void *arg, const kvf_key_t *key)
{
    kvf_ctl_client_inventory_add(arg, key);
}

typedef struct kvf_agent_disk_inv {
    kvf_agent_t *agent;
    kvf_ctl_client_t *client;
} kvf_agent_disk_inv_t;

static void kvf_agent_inventory_disk_key(void *arg, const kvf_key_t *key)
{
    kvf_agent_disk_inv_t *inv = arg;

    /* chunks in the pool too went out as host above */
    if (kvf_store_local_prefix(inv->agent->store, key, 1) == 0) {
        kvf_ctl_client_inventory_add_medium(inv->client, key,
                                            KVF__MEDIUM__MEDIUM_DISK);
    }
}

static void kvf_agent_on_inventory(void *arg, kvf_ctl_client_t *client)
{
    kvf_agent_t *agent       = arg;
    kvf_agent_disk_inv_t inv = {agent, client};

    kvf_store_foreach_key(agent->store, kvf_agent_inventory_key, client);
    if (agent->disk != NULL) {
        /* a warm restart re-admits what the tier kept, on disk */
        kvf_disk_foreach_key(agent->disk, kvf_agent_inventory_disk_key, &inv);
    }
    kvf_ctl_client_inventory_end(client);
}

/* the heartbeat carries the whole summary, never a cut one */
_Static_assert(sizeof(((kvf_ctl_usage_t *)0)->transports) >=
                   KVF_TRANSPORTS_SUMMARY_MAX,
               "kvf_ctl_usage_t.transports holds a transports summary");

static void kvf_agent_on_usage(void *arg, kvf_ctl_usage_t *usage)
{
    kvf_agent_t *agent = arg;
    kvf_engine_server_stats_t es;
    kvf_store_stats_t st;
    kvf_peer_stats_t ps;

    kvf_store_get_stats(agent->store, &st);
    usage->pool_used     = st.pool.used;
    usage->pool_capacity = st.pool.capacity;
    usage->entries       = st.pool.entries;
    if (agent->pd != NULL) {
        kvf_pd_stats_t pds;

        kvf_pd_get_stats(agent->pd, &pds);
        usage->pd_capacity = pds.region_size;
        usage->pd_used     = pds.region_used;
    }
    if (agent->engines != NULL) {
        kvf_engine_server_get_stats(agent->engines, &es);
        usage->traffic.lookup_chunks        = es.lookup_keys;
        usage->traffic.lookup_local_chunks  = es.local_hit_keys;
        usage->traffic.lookup_remote_chunks = es.remote_hit_keys;
    }
    if (agent->peer != NULL) {
        kvf_peer_get_stats(agent->peer, &ps);
        usage->traffic.fetched_chunks          = ps.chunks_fetched;
        usage->traffic.fetched_bytes           = ps.bytes_fetched;
        usage->traffic.served_chunks           = ps.chunks_served;
        usage->traffic.served_bytes            = ps.bytes_served;
        usage->traffic.served_from_disk_chunks = ps.served_from_disk;
    }
    if (agent->disk != NULL) {
        kvf_disk_stats_t ds;

        kvf_disk_get_stats(agent->disk, &ds);
        usage->disk_capacity = ds.capacity_bytes;
        usage->disk_used     = ds.used_bytes;
        usage->disk_chunks   = ds.used_slots;
    }
    kvf_transports_age(&agent->transports);
    kvf_transports_summary(&agent->transports, usage->transports,
                           sizeof(usage->transports));
}

static void kvf_agent_on_admit(void *arg, const kvf_key_t *key)
{
    kvf_agent_t *agent = arg;

    if (agent->ctl != NULL) {
        kvf_ctl_client_admit(agent->ctl, key);
    }
}

static void kvf_agent_on_demote(void *arg, const kvf_key_t *key)
{
    kvf_agent_t *agent = arg;

    if (agent->ctl != NULL) {
        kvf_ctl_client_admit_medium(agent->ctl, key, KVF__MEDIUM__MEDIUM_DISK);
    }
}

static void kvf_agent_on_evict(void *arg, const kvf_key_t *key)
{
    kvf_agent_t *agent = arg;

    if (agent->ctl != NULL) {
        kvf_ctl_client_evict(agent->ctl, key);
    }
}

static const kvf_ctl_client_ops_t kvf_agent_ctl_ops = {
    .inventory = kvf_agent_on_inventory,
    .command   = kvf_agent_on_command,
    .usage     = kvf_agent_on_usage,
    .stopped   = kvf_agent_on_stopped,
};

static void kvf_agent_http_state(void *arg, kvf_agent_http_state_t *state)
{
    kvf_agent_t *agent = arg;

    state->is_stopping       = agent->stopping;
    state->is_draining       = agent->draining;
    state->replicate_asked   = agent->replicate_asked;
    state->replicate_fetched = agent->replicate_fetched;
    state->replicate_missed  = agent->replicate_missed;
}

static kvf_status_t kvf_agent_http_start(kvf_agent_t *agent)
{
    kvf_agent_http_source_t src = {
        .name       = agent->name,
        .role       = agent->config->role,
        .ctl        = agent->ctl,
        .store      = agent->store,
        .disk       = agent->disk,
        .engines    = agent->engines,
        .peer       = agent->peer,
        .pd         = agent->pd,
        .worker     = agent->worker,
        .mesh       = agent->mesh,
        .local      = agent->local,
        .transports = &agent->transports,
        .state      = kvf_agent_http_state,
        .arg        = agent,
    };

    return kvf_agent_http_create(agent->config->http, agent->base, &src,
                                 &agent->http);
}

/* Bytes of the PD receive region in host memory (0: none or on a GPU). */
static uint64_t kvf_agent_pd_host_size(const kvf_agent_config_t *config)
{
    if ((config->role == KVF_AGENT_ROLE_PREFILL) ||
        (config->pd_buffer_device[0] != '\0')) {
        return 0;
    }
    return config->pd_buffer_size;
}

static kvf_status_t kvf_agent_store_start(kvf_agent_t *agent)
{
    const kvf_agent_config_t *config = agent->config;
    kvf_store_params_t sparams;
    kvf_pool_params_t pparams;
    kvf_status_t status;

    if ((config->max_chunk & (config->max_chunk - 1)) != 0) {
        kvf_error("max_chunk %llu is not a power of two (e.g. 16M, 64M)",
                  (unsigned long long)config->max_chunk);
        return KVF_ERR_CONFIG;
    }
    if (config->pool_size < config->max_chunk) {
        kvf_error("pool_size %llu is smaller than max_chunk %llu",
                  (unsigned long long)config->pool_size,
                  (unsigned long long)config->max_chunk);
        return KVF_ERR_CONFIG;
    }
    memset(&pparams, 0, sizeof(pparams));
    pparams.field_mask = (config->pool_prefault ? KVF_POOL_FIELD_PREFAULT : 0) |
                         KVF_POOL_FIELD_NAME | KVF_POOL_FIELD_SIZE |
                         KVF_POOL_FIELD_MAX_CHUNK | KVF_POOL_FIELD_POLICY |
                         KVF_POOL_FIELD_MIN_CHUNK;
    pparams.name      = "kvf-pool";
    pparams.size      = config->pool_size;
    pparams.max_chunk = config->max_chunk;
    pparams.min_chunk =
        (config->max_chunk < (64u << 10)) ? config->max_chunk : (64u << 10);
    pparams.policy = (kvf_pool_policy_t)config->eviction;
    if (kvf_agent_pd_host_size(config) > 0) {
        /* the PD receive region follows the pool in the same memfd, so
         * engines reach received chunks through the mapping they have */
        pparams.field_mask |= KVF_POOL_FIELD_RESERVE;
        pparams.reserve = config->pd_buffer_size;
    }
    memset(&sparams, 0, sizeof(sparams));
    sparams.pool             = &pparams;
    sparams.grant_timeout_ns = config->grant_timeout;
    sparams.copy_threads     = (unsigned)config->copy_threads;
    sparams.admit_cb         = kvf_agent_on_admit;
    sparams.evict_cb         = kvf_agent_on_evict;
    sparams.demote_cb        = kvf_agent_on_demote;
    sparams.cb_arg           = agent;
    status                   = kvf_store_create(&sparams, &agent->store);
    if ((status == KVF_OK) && (config->disk_path[0] != '\0')) {
        status =
            kvf_disk_start(agent->store, config, agent->base, &agent->disk);
    }
    return status;
}

/* Engines connect last: by then the pool, the peers and the controller
 * connection they use all exist. */
static kvf_status_t kvf_agent_engines_start(kvf_agent_t *agent)
{
    kvf_engine_server_params_t eparams;

    memset(&eparams, 0, sizeof(eparams));
    eparams.base              = agent->base;
    eparams.path              = agent->config->socket;
    eparams.store             = agent->store;
    eparams.peer              = agent->peer;
    eparams.pd                = agent->pd;
    eparams.ctl               = agent->ctl;
    eparams.lookup_timeout_ns = agent->config->lookup_timeout;
    eparams.lease_ns          = agent->config->prefetch_lease;
    eparams.node_name         = agent->name;
    eparams.max_frame         = (uint32_t)agent->config->max_frame;
    eparams.max_connections   = 1024;
    eparams.staging_size      = agent->config->engine_staging_size;
    eparams.secret            = &agent->secret;
    return kvf_engine_server_create(&eparams, &agent->engines);
}

static void kvf_agent_on_peer(kvf_ucx_ep_t *ep, const char *peer, void *arg)
{
    kvf_agent_t *agent = arg;

    kvf_debug("agent %s: peer %s connected", agent->name, peer);
}

/* UCX context and worker on the agent's loop, the peer listener, and the
 * pool registered once, whole, for remote read (DESIGN.md §3). */
static kvf_status_t kvf_agent_data_start(kvf_agent_t *agent);

static void kvf_agent_peer_downs_report(kvf_agent_t *agent, uint64_t now);

static void kvf_agent_on_sweep(evutil_socket_t fd, short what, void *arg)
{
    kvf_agent_t *agent = arg;
    uint64_t now       = kvf_time_now_ns();
    uint64_t n         = kvf_store_expire_grants(agent->store, now);

    if (n > 0) {
        kvf_info("agent %s: took back %llu allocations never committed",
                 agent->name, (unsigned long long)n);
    }
    if (agent->engines != NULL) {
        kvf_engine_server_expire_leases(agent->engines, now);
    }
    kvf_agent_peer_downs_report(agent, now);
    kvf_engine_server_expire_handshakes(agent->engines, now);
}

static kvf_status_t kvf_agent_peer_start(kvf_agent_t *agent)
{
    kvf_peer_params_t params;
    kvf_status_t status;

    memset(&params, 0, sizeof(params));
    params.base       = agent->base;
    params.mesh       = agent->mesh;
    params.pool_mem   = agent->pool_mem;
    params.store      = agent->store;
    params.timeout_ns = agent->config->fetch_timeout;
    params.serve_max  = (uint32_t)agent->config->peer_serve_max;
    params.name       = agent->name;
    kvf_transports_init(&agent->transports, agent->name,
                        agent->config->expect_transports);
    status = kvf_peer_create(&params, &agent->peer);
    if (status == KVF_OK) {
        kvf_peer_set_transports(agent->peer, &agent->transports);
    }
    return status;
}

static uint32_t kvf_agent_node_id(void *arg)
{
    kvf_agent_t *agent = arg;

    return (agent->ctl != NULL) ? kvf_ctl_client_node_id(agent->ctl) : 0;
}

static void kvf_agent_local_served(void *arg, uint32_t node_id,
                                   const char *name, uint64_t chunks,
                                   uint64_t bytes)
{
    kvf_agent_t *agent = arg;

    kvf_peer_count_served(agent->peer, node_id, name, chunks, bytes);
}

/* The same-host path (agent/local.h); without it fetches use UCX only. */
static void kvf_agent_local_start(kvf_agent_t *agent)
{
    kvf_local_params_t params;

    if (!agent->config->same_host) {
        return;
    }
    memset(&params, 0, sizeof(params));
    params.base         = agent->base;
    params.store        = agent->store;
    params.secret       = &agent->secret;
    params.data_address = agent->data_address;
    params.node_id      = kvf_agent_node_id;
    params.node_id_arg  = agent;
    params.served       = kvf_agent_local_served;
    params.served_arg   = agent;
    params.timeout_ns   = agent->config->fetch_timeout;
    params.name         = agent->name;
    /* a PD sender copies into same-host decoders' receive regions */
    params.wants_region = (agent->config->role != KVF_AGENT_ROLE_DECODE);
    if (kvf_local_create(&params, &agent->local) == KVF_OK) {
        kvf_peer_set_local(agent->peer, agent->local);
    }
}

/* pd_buffer_device cuda:N: the receive region in GPU memory, registered
 * with UCX for GPUDirect. Only where UCX can move CUDA memory. */
static kvf_status_t kvf_agent_pd_device_start(kvf_agent_t *agent, uint64_t size)
{
    const char *dev    = agent->config->pd_buffer_device;
    const char *reason = "";
    kvf_status_t status;
    char *end  = NULL;
    long index = -1;

    if (strncmp(dev, "cuda:", 5) == 0) {
        index = strtol(dev + 5, &end, 10);
    }
    if ((strncmp(dev, "cuda:", 5) != 0) || (end == dev + 5) || (end == NULL) ||
        (*end != '\0') || (index < 0)) {
        kvf_error("pd_buffer_device '%s' is not cuda:N", dev);
        return KVF_ERR_CONFIG;
    }
    if (index != 0) {
        /* the gpu runtime allocates on the current device only */
        kvf_error("pd_buffer_device %s: only cuda:0 is supported; set "
                  "CUDA_VISIBLE_DEVICES to pick the GPU",
                  dev);
        return KVF_ERR_CONFIG;
    }
    if (!kvf_gpu_is_available(&reason)) {
        kvf_error("pd_buffer_device %s: no usable GPU (%s)", dev, reason);
        return KVF_ERR_UNSUPPORTED;
    }
    if (!kvf_ucx_ctx_has_cuda(agent->ucx)) {
        kvf_error("pd_buffer_device %s: this UCX reports no CUDA memory "
                  "support (build UCX with CUDA, or use host memory)",
                  dev);
        return KVF_ERR_UNSUPPORTED;
    }
    status = kvf_gpu_mem_alloc(size, &agent->pd_device);
    if (status != KVF_OK) {
        kvf_error("pd_buffer_device %s: cannot allocate %llu bytes: %s", dev,
                  (unsigned long long)size, kvf_strerror(status));
        return status;
    }
    return kvf_ucx_mem_register(agent->ucx, agent->pd_device, size,
                                KVF_UCX_MEM_REMOTE_WRITE,
                                &agent->pd_device_mem);
}

static kvf_status_t kvf_agent_pd_start(kvf_agent_t *agent)
{
    const kvf_agent_config_t *config = agent->config;
    kvf_pd_params_t params;
    kvf_status_t status;
    uint64_t offset = 0, size = 0;

    memset(&params, 0, sizeof(params));
    if (kvf_agent_pd_host_size(config) > 0) {
        size                 = kvf_store_reserve(agent->store, &offset);
        params.region_base   = (uint8_t *)kvf_store_base(agent->store) + offset;
        params.region_mem    = agent->pd_host_mem;
        params.region_offset = offset;
        params.region_size   = size;
    } else if ((config->role != KVF_AGENT_ROLE_PREFILL) &&
               (config->pd_buffer_size > 0) &&
               (config->pd_buffer_device[0] != '\0')) {
        status = kvf_agent_pd_device_start(agent, config->pd_buffer_size);
        if (status != KVF_OK) {
            return status;
        }
        params.region_base      = agent->pd_device;
        params.region_mem       = agent->pd_device_mem;
        params.region_size      = config->pd_buffer_size;
        params.region_is_device = true;
    }
    params.base             = agent->base;
    params.mesh             = agent->mesh;
    params.pool_mem         = agent->pool_mem;
    params.store            = agent->store;
    params.queue_max        = (uint32_t)config->pd_queue_max;
    params.takes_pieces     = config->pd_pieces;
    params.peer_max_bytes   = config->pd_peer_max_bytes;
    params.alloc_timeout_ns = config->pd_alloc_timeout;
    params.push_timeout_ns  = config->pd_push_timeout;
    params.wait_timeout_ns  = config->pd_wait_timeout;
    params.claim_timeout_ns = config->pd_claim_timeout;
    params.name             = agent->name;
    status                  = kvf_pd_create(&params, &agent->pd);
    if (status == KVF_OK) {
        kvf_pd_set_transports(agent->pd, &agent->transports);
        kvf_pd_set_local(agent->pd, agent->local);
    }
    return status;
}

static const char *kvf_agent_peer_name(kvf_agent_t *agent, const char *peer)
{
    const char *name =
        (agent->ctl != NULL) ? kvf_ctl_client_name_of(agent->ctl, peer) : NULL;

    return (name != NULL) ? name : "?";
}

/* Logs a failed peer connection: the first one of a peer at warn with its
 * node name, later ones of the same peer are summarised every
 * KVF_AGENT_DOWN_REPORT_NS by kvf_agent_peer_downs_report(). */
static void kvf_agent_on_ep_error(kvf_ucx_ep_t *ep, kvf_status_t status,
                                  void *arg)
{
    kvf_agent_t *agent = arg;
    const char *peer   = kvf_ucx_ep_peer(ep);
    uint64_t now       = kvf_time_now_ns();
    struct kvf_agent_peer_down *d, *free_d = NULL;
    const char *name;
    unsigned i;

    if (kvf_ucx_ep_is_accepted(ep)) {
        /* a peer that connected to us went (stopped, restarted or died):
         * its own node's lease says which; nothing here fails over */
        name = kvf_mesh_peer_name(agent->mesh, ep);
        kvf_info("agent %s: peer %s%s%s disconnected: %s", agent->name,
                 (name != NULL) ? name : "", (name != NULL) ? " from " : "",
                 peer, kvf_strerror(status));
    }
    if (agent->pd != NULL) {
        kvf_pd_ep_failed(agent->pd, ep);
    }
    kvf_mesh_ep_failed(agent->mesh, ep);
    if (kvf_ucx_ep_is_accepted(ep)) {
        return;
    }
    for (i = 0; i < KVF_AGENT_DOWNS; i++) {
        d = &agent->downs[i];
        if (strcmp(d->peer, peer) == 0) {
            d->last_ns = now;
            d->unreported++;
            kvf_debug("agent %s: peer node %s (%s) failed again: %s",
                      agent->name, kvf_agent_peer_name(agent, peer), peer,
                      kvf_strerror(status));
            return;
        }
        if ((free_d == NULL) && (d->peer[0] == '\0')) {
            free_d = d;
        }
    }
    kvf_warn("agent %s: peer node %s (%s) failed: %s; its fetches and pushes "
             "fail over, repeats are summarised",
             agent->name, kvf_agent_peer_name(agent, peer), peer,
             kvf_strerror(status));
    if (free_d != NULL) {
        snprintf(free_d->peer, sizeof(free_d->peer), "%s", peer);
        free_d->first_ns   = now;
        free_d->last_ns    = now;
        free_d->unreported = 0;
    }
}

/* From the sweep: one line per failed peer with the failures since the
 * last one; a peer quiet for KVF_AGENT_DOWN_FORGET_NS is forgotten (its
 * next failure warns again). */
static void kvf_agent_peer_downs_report(kvf_agent_t *agent, uint64_t now)
{
    unsigned i;

    for (i = 0; i < KVF_AGENT_DOWNS; i++) {
        struct kvf_agent_peer_down *d = &agent->downs[i];

        if (d->peer[0] == '\0') {
            continue;
        }
        if ((d->unreported > 0) &&
            (now - d->first_ns >= KVF_AGENT_DOWN_REPORT_NS)) {
            kvf_warn(
                "agent %s: peer node %s (%s): %u more failed "
                "connections in %llu s",
                agent->name, kvf_agent_peer_name(agent, d->peer), d->peer,
                d->unreported,
                (unsigned long long)((now - d->first_ns) / KVF_NSEC_PER_SEC));
            d->unreported = 0;
            d->first_ns   = now;
        } else if ((d->unreported == 0) &&
                   (now - d->last_ns >= KVF_AGENT_DOWN_FORGET_NS)) {
            d->peer[0] = '\0';
        }
    }
}

static kvf_status_t kvf_agent_data_start(kvf_agent_t *agent)
{
    const kvf_agent_config_t *config = agent->config;
    kvf_ucx_worker_params_t wparams;
    kvf_ucx_ctx_params_t cparams;
    kvf_mesh_params_t mparams;
    char devices[512];
    kvf_status_t status;
    uint64_t pd_offset = 0, pd_size;
    char host[256];
    uint16_t port;

    if (kvf_config_parse_hostport(config->listen, host, sizeof(host), &port) !=
        KVF_OK) {
        kvf_error("listen address '%s' is not HOST:PORT", config->listen);
        return KVF_ERR_CONFIG;
    }
    memset(&cparams, 0, sizeof(cparams));
    if (config->transports[0] != '\0') {
        cparams.field_mask |= KVF_UCX_CTX_FIELD_TLS;
        cparams.tls = config->transports;
    }
    if (config->net_devices[0] != '\0') {
        cparams.field_mask |= KVF_UCX_CTX_FIELD_NET_DEVICES;
        cparams.net_devices = config->net_devices;
    } else if (kvf_ucx_net_devices_for(host, devices, sizeof(devices)) ==
               KVF_OK) {
        /* UCX's TCP transport listens on every device it uses: only the
         * one the peer service listens on (RDMA devices stay) */
        cparams.field_mask |= KVF_UCX_CTX_FIELD_NET_DEVICES;
        cparams.net_devices = devices;
    }
    status = kvf_ucx_ctx_create(&cparams, &agent->ucx);
    if (status != KVF_OK) {
        return status;
    }
    memset(&wparams, 0, sizeof(wparams));
    wparams.field_mask = KVF_UCX_WORKER_FIELD_NAME |
                         KVF_UCX_WORKER_FIELD_EP_ERR |
                         KVF_UCX_WORKER_FIELD_MAX_OPS;
    wparams.max_ops    = (unsigned)agent->config->ucx_max_ops;
    wparams.name       = agent->name;
    wparams.ep_err_cb  = kvf_agent_on_ep_error;
    wparams.ep_err_arg = agent;
    status = kvf_ucx_worker_create(agent->ucx, agent->base, &wparams,
                                   &agent->worker);
    if (status != KVF_OK) {
        return status;
    }
    memset(&mparams, 0, sizeof(mparams));
    mparams.base   = agent->base;
    mparams.worker = agent->worker;
    mparams.name   = agent->name;
    mparams.role   = (uint32_t)config->role;
    mparams.secret = &agent->secret;
    status         = kvf_mesh_create(&mparams, &agent->mesh);
    if (status != KVF_OK) {
        return status;
    }
    if (!kvf_mesh_is_secure(agent->mesh)) {
        kvf_warn("agent %s: no cluster_secret_file: the data plane on %s is "
                 "OPEN, any process that reaches it can read, fetch and "
                 "push chunks (docs/security.md)",
                 agent->name, config->listen);
    }
    status = kvf_ucx_listener_create(
        agent->worker, host, port, kvf_agent_on_peer, agent, &agent->listener);
    if (status != KVF_OK) {
        return status;
    }
    snprintf(agent->data_address, sizeof(agent->data_address), "%s:%u", host,
             kvf_ucx_listener_port(agent->listener));
    /* the pool is registered for remote read only; the PD region after
     * it in the same mapping on its own, for remote write only
     * (docs/security.md) */
    pd_size = kvf_store_reserve(agent->store, &pd_offset);
    status  = kvf_ucx_mem_register(agent->ucx, kvf_store_base(agent->store),
                                  (pd_size > 0) ? pd_offset
                                                 : kvf_store_size(agent->store),
                                   KVF_UCX_MEM_REMOTE_READ, &agent->pool_mem);
    if ((status == KVF_OK) && (pd_size > 0)) {
        status = kvf_ucx_mem_register(
            agent->ucx, (uint8_t *)kvf_store_base(agent->store) + pd_offset,
            pd_size, KVF_UCX_MEM_REMOTE_WRITE, &agent->pd_host_mem);
    }
    if (status != KVF_OK) {
        return status;
    }
    status = kvf_ucx_worker_address_pack(agent->worker, &agent->worker_address,
                                         &agent->worker_address_len);
    if (status != KVF_OK) {
        return status;
    }
    kvf_info("agent %s: peer service on %s (UCX worker address %zu bytes)",
             agent->name, agent->data_address, agent->worker_address_len);
    return KVF_OK;
}

kvf_status_t kvf_agent_create(const kvf_agent_config_t *config,
                              struct event_base *base, kvf_agent_t **agent_p)
{
    kvf_ctl_client_params_t params;
    kvf_agent_t *agent;
    kvf_status_t status;
    char err[512];

    agent = calloc(1, sizeof(*agent));
    if (agent == NULL) {
        return KVF_ERR_NO_MEMORY;
    }
    agent->config = config;
    agent->base   = base;
    if (config->name[0] != '\0') {
        snprintf(agent->name, sizeof(agent->name), "%s", config->name);
    } else if (gethostname(agent->name, sizeof(agent->name) - 1) != 0) {
        snprintf(agent->name, sizeof(agent->name), "agent-%d", (int)getpid());
    }
    status = kvf_auth_secret_load_opt(config->cluster_secret_file,
                                      &agent->secret, err, sizeof(err));
    if (status != KVF_OK) {
        kvf_error("%s", err);
        goto err_destroy;
    }
    kvf_auth_warn_if_open(&agent->secret, "controller", config->controller);

    status = kvf_agent_store_start(agent);
    if (status != KVF_OK) {
        goto err_destroy;
    }
    status = kvf_agent_data_start(agent);
    if (status != KVF_OK) {
        goto err_destroy;
    }
    status = kvf_agent_peer_start(agent);
    if (status != KVF_OK) {
        goto err_destroy;
    }
    kvf_agent_local_start(agent);
    status = kvf_agent_pd_start(agent);
    if (status != KVF_OK) {
        goto err_destroy;
    }
    {
        struct timeval second = {1, 0};

        agent->sweep_ev =
            event_new(base, -1, EV_PERSIST, kvf_agent_on_sweep, agent);
        if ((agent->sweep_ev == NULL) ||
            (event_add(agent->sweep_ev, &second) != 0)) {
            status = KVF_ERR_NO_MEMORY;
            goto err_destroy;
        }
    }
    memset(&params, 0, sizeof(params));
    params.base               = base;
    params.controller         = config->controller;
    params.etcd               = config->etcd;
    params.etcd_prefix        = config->etcd_prefix;
    params.name               = agent->name;
    params.role               = config->role;
    params.data_address       = agent->data_address;
    params.worker_address     = agent->worker_address;
    params.worker_address_len = agent->worker_address_len;
    params.control_address    = config->socket;
    params.pool_capacity      = config->pool_size;
    params.instance_id        = config->instance_id;
    params.tp_rank            = (uint32_t)config->tp_rank;
    params.tp_world           = (uint32_t)config->tp_world;
    params.connect_timeout_ns = config->connect_timeout;
    params.request_timeout_ns = config->request_timeout;
    params.reconnect_max_ns   = config->reconnect_max;
    params.flush_ns           = config->admit_flush;
    params.max_frame          = (uint32_t)config->max_frame;
    params.ops                = &kvf_agent_ctl_ops;
    params.arg                = agent;
    params.secret             = &agent->secret;
    params.tls_ca             = config->tls_ca;
    params.tls_server_name    = config->tls_server_name;
    params.is_replace         = config->replace;
    status                    = kvf_ctl_client_create(&params, &agent->ctl);
    if (status != KVF_OK) {
        goto err_destroy;
    }
    kvf_peer_set_ctl(agent->peer, agent->ctl);
    kvf_pd_set_ctl(agent->pd, agent->ctl);
    status = kvf_agent_engines_start(agent);
    if (status != KVF_OK) {
        goto err_destroy;
    }
    status = kvf_agent_http_start(agent);
    if (status != KVF_OK) {
        goto err_destroy;
    }
    kvf_info("agent %s (%s) started; controller %s", agent->name,
             kvf_agent_role_name(config->role), config->controller);
    *agent_p = agent;
    return KVF_OK;

err_destroy:
    kvf_agent_destroy(agent);
    return status;
}

void kvf_agent_stop(kvf_agent_t *agent)
{
    if (agent->stopping) {
        return;
    }
    agent->stopping = true;
    kvf_info("agent %s: stopping", agent->name);
    kvf_ctl_client_stop(agent->ctl);
}

void kvf_agent_destroy(kvf_agent_t *agent)
{
    if (agent == NULL) {
        return;
    }
    kvf_agent_http_destroy(agent->http);
    if (agent->sweep_ev != NULL) {
        event_free(agent->sweep_ev);
    }
    kvf_engine_server_destroy(agent->engines);
    kvf_ctl_client_destroy(agent->ctl);
    agent->ctl = NULL; /* the disk tier's last completions announce nothing */
    if (agent->peer != NULL) {
        kvf_peer_cancel(agent->peer, agent); /* replications in flight */
        kvf_peer_set_ctl(agent->peer, NULL);
    }
    if (agent->pd != NULL) {
        kvf_pd_set_ctl(agent->pd, NULL);
    }
    /* the data plane goes down in reverse: listener, the mesh's hold on
     * endpoints, worker (which completes every operation in flight, into
     * the peer service), the peer service, memory, context */
    kvf_ucx_listener_destroy(agent->listener);
    kvf_mesh_close(agent->mesh);
    free(agent->worker_address);
    kvf_ucx_worker_destroy(agent->worker);
    kvf_peer_destroy(agent->peer);
    if (agent->pd != NULL) {
        kvf_pd_set_local(agent->pd, NULL);
    }
    kvf_local_destroy(agent->local); /* after the peer service: it calls in */
    kvf_pd_destroy(agent->pd);
    kvf_mesh_destroy(agent->mesh);
    kvf_ucx_mem_deregister(agent->pd_device_mem);
    if (agent->pd_device != NULL) {
        kvf_gpu_mem_free(agent->pd_device);
    }
    kvf_ucx_mem_deregister(agent->pd_host_mem);
    kvf_ucx_mem_deregister(agent->pool_mem);
    kvf_ucx_ctx_destroy(agent->ucx);
    if ((agent->disk != NULL) && agent->config->disk_flush_on_stop) {
        kvf_info("agent %s: wrote %llu pool chunks to the disk tier",
                 agent->name,
                 (unsigned long long)kvf_store_spill_all(agent->store));
    }
    kvf_disk_destroy(agent->disk); /* its last reads land in the pool */
    kvf_store_destroy(agent->store);
    kvf_auth_secret_cleanup(&agent->secret);
    free(agent);
}

uint16_t kvf_agent_http_port(const kvf_agent_t *agent)
{
    return kvf_agent_http_bound_port(agent->http);
}
