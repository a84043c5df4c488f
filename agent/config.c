/* SPDX-License-Identifier: Apache-2.0 */
/* Copyright (c) 2026 The kvfabric authors */
#include "agent/config.h"

#include <stddef.h>

static const char *const kvf_agent_evictions[] = {"lru", "lfu", "fifo", NULL};

static const char *const kvf_agent_roles[] = {"both", "prefill", "decode",
                                              NULL};

#define KVF_AGENT_FIELD(_name, _type, _member, _default, _min, _max, _help) \
    { \
        _name, _type, offsetof(kvf_agent_config_t, _member), _default, _min, \
            _max, NULL, 0, _help \
    }

static const kvf_config_field_t kvf_agent_config_fields[] = {
    KVF_AGENT_FIELD("controller", KVF_CONFIG_STRING, controller,
                    "127.0.0.1:7400", 0, 0,
                    "HOST:PORT of kvf-controller (several, comma-separated: "
                    "the leader among them)"),
    KVF_AGENT_FIELD("etcd", KVF_CONFIG_STRING, etcd, "", 0, 0,
                    "etcd endpoints (http://HOST:PORT[,...]): connect to the "
                    "controller leader published there, found again when "
                    "it is lost (replaces controller)"),
    KVF_AGENT_FIELD("etcd_prefix", KVF_CONFIG_STRING, etcd_prefix, "/kvfabric",
                    0, 0,
                    "etcd key prefix of the controllers' election "
                    "(their etcd_prefix)"),
    KVF_AGENT_FIELD("name", KVF_CONFIG_STRING, name, "", 0, 0,
                    "node name, unique in the cluster (default: the "
                    "host name)"),
    {"role", KVF_CONFIG_ENUM, offsetof(kvf_agent_config_t, role), "both", 0, 0,
     kvf_agent_roles, 0, "prefill, decode or both (PD disaggregation)"},
    KVF_AGENT_FIELD("pool_size", KVF_CONFIG_SIZE, pool_size, "1G", 1ull << 20,
                    1ull << 44, "bytes of the shared-memory chunk pool"),
    KVF_AGENT_FIELD("max_chunk", KVF_CONFIG_SIZE, max_chunk, "64M", 4096,
                    1ull << 34, "largest chunk an engine may store"),
    KVF_AGENT_FIELD("pool_prefault", KVF_CONFIG_BOOL, pool_prefault, "true", 0,
                    0,
                    "allocate the pool's memory at start (faster "
                    "transfers, full RSS at once)"),
    KVF_AGENT_FIELD("disk_path", KVF_CONFIG_STRING, disk_path, "", 0, 0,
                    "slot file of the local-disk tier behind the pool "
                    "(docs/disk-tier.md); empty: no disk tier"),
    KVF_AGENT_FIELD("disk_size", KVF_CONFIG_SIZE, disk_size, "0", 0, 1ull << 50,
                    "bytes of the disk tier's slot file"),
    KVF_AGENT_FIELD("disk_queue_depth", KVF_CONFIG_UINT, disk_queue_depth, "16",
                    1, 1024,
                    "disk tier: writes and reads on the device at once"),
    KVF_AGENT_FIELD("disk_flush_on_stop", KVF_CONFIG_BOOL, disk_flush_on_stop,
                    "true", 0, 0,
                    "a clean stop writes the pool's chunks to the disk tier "
                    "first (takes pool_size / disk speed)"),
    KVF_AGENT_FIELD("engine_staging_size", KVF_CONFIG_SIZE, engine_staging_size,
                    "256M", 64ull << 10, 1ull << 40,
                    "each engine's writable staging area (allocations and "
                    "PD chunks it holds); at least max_chunk"),
    KVF_AGENT_FIELD("copy_threads", KVF_CONFIG_UINT, copy_threads, "2", 0, 64,
                    "threads that copy chunks beside the event loop (an "
                    "engine's commit, same-host fetches, PD claims); 0: "
                    "the loop copies alone"),
    KVF_AGENT_FIELD("ucx_max_ops", KVF_CONFIG_UINT, ucx_max_ops, "1024", 16,
                    1048576,
                    "UCX operations (sends, receives) in flight at once; a "
                    "burst beyond waits (sends) or is taken anyway "
                    "(receives), never failed"),
    KVF_AGENT_FIELD("peer_serve_max", KVF_CONFIG_UINT, peer_serve_max, "4096",
                    16, 1048576,
                    "chunks this agent sends to peers at once (each pinned "
                    "until sent); past it, or past 512 to one requester, a "
                    "key is answered busy and asked again"),
    KVF_AGENT_FIELD("grant_timeout", KVF_CONFIG_DURATION, grant_timeout, "30s",
                    1000000ull, 3600000000000ull,
                    "an allocation not committed this long is taken back"),
    {"eviction", KVF_CONFIG_ENUM, offsetof(kvf_agent_config_t, eviction), "lru",
     0, 0, kvf_agent_evictions, 0,
     "eviction policy of unpinned chunks: lru, lfu or fifo"},
    KVF_AGENT_FIELD("socket", KVF_CONFIG_STRING, socket,
                    "/run/kvfabric/agent.sock", 0, 0,
                    "Unix socket path engines connect to"),
    {"listen", KVF_CONFIG_STRING, offsetof(kvf_agent_config_t, listen),
     "0.0.0.0:7410", 0, 0, NULL, KVF_CONFIG_FIELD_HOSTPORT,
     "HOST:PORT of the peer data service (UCX)"},
    {"http", KVF_CONFIG_STRING, offsetof(kvf_agent_config_t, http),
     "127.0.0.1:7411", 0, 0, NULL, KVF_CONFIG_FIELD_HOSTPORT,
     "HOST:PORT for /healthz and /metrics; empty: off"},
    KVF_AGENT_FIELD("instance_id", KVF_CONFIG_STRING, instance_id, "", 0, 0,
                    "engine instance (TP group) this worker belongs to"),
    KVF_AGENT_FIELD("tp_rank", KVF_CONFIG_UINT, tp_rank, "0", 0, 65535,
                    "tensor-parallel rank of this worker"),
    KVF_AGENT_FIELD("tp_world", KVF_CONFIG_UINT, tp_world, "1", 1, 65536,
                    "tensor-parallel world size"),
    {"net_devices", KVF_CONFIG_LIST, offsetof(kvf_agent_config_t, net_devices),
     "", 0, 0, NULL, 0,
     "UCX devices to use, e.g. mlx5_0:1 (empty: UCX chooses)"},
    {"transports", KVF_CONFIG_LIST, offsetof(kvf_agent_config_t, transports),
     "", 0, 0, NULL, 0, "UCX transports, e.g. rc,tcp,sm (empty: UCX chooses)"},
    {"expect_transports", KVF_CONFIG_LIST,
     offsetof(kvf_agent_config_t, expect_transports), "", 0, 0, NULL, 0,
     "UCX transports peer connections must really use, e.g. rc; a peer "
     "over any other is refused (empty: no check)"},
    KVF_AGENT_FIELD("connect_timeout", KVF_CONFIG_DURATION, connect_timeout,
                    "3s", 1000000ull, 600000000000ull,
                    "deadline of one connection attempt"),
    KVF_AGENT_FIELD("request_timeout", KVF_CONFIG_DURATION, request_timeout,
                    "5s", 1000000ull, 600000000000ull,
                    "deadline of one controller request"),
    KVF_AGENT_FIELD("lookup_timeout", KVF_CONFIG_DURATION, lookup_timeout,
                    "100ms", 1000000ull, 60000000000ull,
                    "how long an engine lookup waits for the controller "
                    "before answering with local hits only"),
    KVF_AGENT_FIELD("fetch_timeout", KVF_CONFIG_DURATION, fetch_timeout, "5s",
                    1000000ull, 600000000000ull,
                    "deadline of a chunk fetch from peers, end to end"),
    KVF_AGENT_FIELD("same_host", KVF_CONFIG_BOOL, same_host, "true", 0, 0,
                    "copy chunks from agents on the same host, and PD pushes "
                    "to decoders on it, through shared memory instead of "
                    "UCX"),
    KVF_AGENT_FIELD("prefetch_lease", KVF_CONFIG_DURATION, prefetch_lease,
                    "10s", 1000000ull, 3600000000000ull,
                    "how long the hit of a prefetching lookup stays pinned "
                    "waiting for the engine's retrieve"),
    KVF_AGENT_FIELD("reconnect_max", KVF_CONFIG_DURATION, reconnect_max, "5s",
                    10000000ull, 600000000000ull,
                    "longest wait between reconnect attempts"),
    KVF_AGENT_FIELD("admit_flush", KVF_CONFIG_DURATION, admit_flush, "2ms", 0,
                    1000000000ull, "how long ADMIT/EVICT batches coalesce"),
    KVF_AGENT_FIELD("max_frame", KVF_CONFIG_SIZE, max_frame, "16M", 4096,
                    256ull << 20, "largest control frame accepted"),
    KVF_AGENT_FIELD("pd_buffer_size", KVF_CONFIG_SIZE, pd_buffer_size, "64M", 0,
                    1ull << 40,
                    "PD receive region of a decode (or both) agent; 0: "
                    "receive no pushes"),
    KVF_AGENT_FIELD("pd_buffer_device", KVF_CONFIG_STRING, pd_buffer_device, "",
                    0, 0,
                    "where the PD receive region lives: empty for host "
                    "memory, cuda:N for GPU N (needs UCX with CUDA)"),
    KVF_AGENT_FIELD("pd_peer_max_bytes", KVF_CONFIG_SIZE, pd_peer_max_bytes,
                    "0", 0, 1ull << 40,
                    "receive region one prefill peer may hold in requests "
                    "(reserved, received, not yet released); 0: no limit"),
    KVF_AGENT_FIELD("pd_queue_max", KVF_CONFIG_UINT, pd_queue_max, "64", 1,
                    65536,
                    "pushes that may wait for room in a full receive region"),
    KVF_AGENT_FIELD("pd_pieces", KVF_CONFIG_BOOL, pd_pieces, "true", 0, 0,
                    "hold several pushes of one request at once, kept in "
                    "piece order (false: one at a time, as agents before "
                    "this one did; senders then wait for each)"),
    KVF_AGENT_FIELD("pd_alloc_timeout", KVF_CONFIG_DURATION, pd_alloc_timeout,
                    "5s", 1000000ull, 600000000000ull,
                    "how long a push waits for room in a full receive region"),
    KVF_AGENT_FIELD("pd_push_timeout", KVF_CONFIG_DURATION, pd_push_timeout,
                    "10s", 1000000ull, 600000000000ull,
                    "deadline of one push, end to end; also how long a "
                    "decoder waits for the next push of a request"),
    KVF_AGENT_FIELD("pd_wait_timeout", KVF_CONFIG_DURATION, pd_wait_timeout,
                    "10s", 1000000ull, 600000000000ull,
                    "default timeout of an engine's PD wait"),
    KVF_AGENT_FIELD("pd_claim_timeout", KVF_CONFIG_DURATION, pd_claim_timeout,
                    "30s", 1000000ull, 3600000000000ull,
                    "a received PD request no engine claims this long is "
                    "reclaimed"),
    KVF_AGENT_FIELD("log_level", KVF_CONFIG_STRING, log_level, "info", 0, 0,
                    "error, warn, info, debug or trace"),
    {"cluster_secret_file", KVF_CONFIG_STRING,
     offsetof(kvf_agent_config_t, cluster_secret_file), "", 0, 0, NULL,
     KVF_CONFIG_FIELD_SECRET,
     "file holding the cluster secret, proved to the controller and asked "
     "of engines (empty: no authentication)"},
    KVF_AGENT_FIELD("tls_ca", KVF_CONFIG_STRING, tls_ca, "", 0, 0,
                    "PEM CA file: speak TLS to the controller and verify its "
                    "certificate (empty: plain TCP)"),
    KVF_AGENT_FIELD("tls_server_name", KVF_CONFIG_STRING, tls_server_name, "",
                    0, 0,
                    "host name or IP the controller's certificate must name "
                    "(empty: the chain is checked, not the name)"),
    {"list_devices", KVF_CONFIG_BOOL,
     offsetof(kvf_agent_config_t, list_devices), "false", 0, 0, NULL,
     KVF_CONFIG_FIELD_CLI_ONLY, "list RDMA devices and exit"},
    {"replace", KVF_CONFIG_BOOL, offsetof(kvf_agent_config_t, replace), "false",
     0, 0, NULL, KVF_CONFIG_FIELD_CLI_ONLY,
     "take the node name over from a live node registered from another "
     "address (the controller refuses that otherwise)"},
    {"print_config", KVF_CONFIG_BOOL,
     offsetof(kvf_agent_config_t, print_config), "false", 0, 0, NULL,
     KVF_CONFIG_FIELD_CLI_ONLY,
     "print the effective configuration and "
     "exit"},
};

const kvf_config_schema_t kvf_agent_config_schema = {
    "kvf-agent", kvf_agent_config_fields,
    sizeof(kvf_agent_config_fields) / sizeof(kvf_agent_config_fields[0])};

const char *kvf_agent_role_name(int role)
{
    if ((role < 0) || (role > KVF_AGENT_ROLE_DECODE)) {
        return "unknown";
    }
    return kvf_agent_roles[role];
}
