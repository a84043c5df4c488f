/* SPDX-License-Identifier: Apache-2.0 */
/* Copyright (c) 2026 The kvfabric authors */
#include "controller/config.h"

#include <stddef.h>

#define KVF_CC_FIELD(_name, _type, _member, _def, _min, _max, _flags, _help) \
    { \
        _name, _type, offsetof(kvf_controller_config_t, _member), _def, _min, \
            _max, NULL, _flags, _help \
    }

static const kvf_config_field_t kvf_controller_config_fields[] = {
    KVF_CC_FIELD("listen", KVF_CONFIG_STRING, listen, "127.0.0.1:7400", 0, 0,
                 KVF_CONFIG_FIELD_HOSTPORT,
                 "HOST:PORT for agents and kvfctl (port 0: any)"),
    KVF_CC_FIELD("http", KVF_CONFIG_STRING, http, "127.0.0.1:7401", 0, 0,
                 KVF_CONFIG_FIELD_HOSTPORT,
                 "HOST:PORT for /healthz, /v1/*, /metrics (empty: off)"),
    KVF_CC_FIELD("advertise", KVF_CONFIG_STRING, advertise, "", 0, 0,
                 KVF_CONFIG_FIELD_HOSTPORT,
                 "with etcd: the control HOST:PORT agents and kvfctl are "
                 "told (empty: the bound listen address, a wildcard host "
                 "replaced by the host name)"),
    KVF_CC_FIELD("advertise_http", KVF_CONFIG_STRING, advertise_http, "", 0, 0,
                 KVF_CONFIG_FIELD_HOSTPORT,
                 "with etcd: the HTTP HOST:PORT published beside it "
                 "(empty: as advertise does for http)"),
    KVF_CC_FIELD("etcd_resign", KVF_CONFIG_BOOL, etcd_resign, "true", 0, 0, 0,
                 "with etcd: a leader that had agents and lost every one "
                 "resigns and exits 4 (cut off from the agents, not from "
                 "etcd: a standby they reach takes over)"),
    KVF_CC_FIELD("port_file", KVF_CONFIG_STRING, port_file, "", 0, 0, 0,
                 "write the bound control and HTTP addresses to this file"),
    KVF_CC_FIELD("lease", KVF_CONFIG_DURATION, lease_ns, "5s", 10000000ull,
                 3600000000000ull, 0,
                 "a node missing heartbeats this long is declared dead"),
    KVF_CC_FIELD("heartbeat_interval", KVF_CONFIG_DURATION, heartbeat_ns, "1s",
                 1000000ull, 600000000000ull, 0,
                 "heartbeat interval the controller asks agents to use"),
    KVF_CC_FIELD("recovery_window", KVF_CONFIG_DURATION, recovery_window_ns,
                 "10s", 0, 3600000000000ull, 0,
                 "longest time reported as recovering after start (0: off)"),
    KVF_CC_FIELD("forget_dead", KVF_CONFIG_DURATION, forget_dead_ns, "10m", 0,
                 0, 0, "dead nodes stay listed this long"),
    KVF_CC_FIELD("max_frame", KVF_CONFIG_SIZE, max_frame, "16M", 4096,
                 256ull << 20, 0, "hard maximum frame payload size"),
    KVF_CC_FIELD("max_output", KVF_CONFIG_SIZE, max_output, "64M", 65536, 0, 0,
                 "per-connection output cap; reading pauses above it"),
    KVF_CC_FIELD("max_batch", KVF_CONFIG_UINT, max_batch, "65536", 1, 1048576,
                 0, "most keys in one LOOKUP"),
    KVF_CC_FIELD("initial_keys", KVF_CONFIG_UINT, initial_keys, "1048576", 0,
                 1ull << 32, 0, "registry sizing hint (it grows as needed)"),
    KVF_CC_FIELD("purge_slice", KVF_CONFIG_UINT, purge_slice, "65536", 1024, 0,
                 0, "table entries scanned per purge step (bounds stalls)"),
    KVF_CC_FIELD("cluster_secret_file", KVF_CONFIG_STRING, cluster_secret_file,
                 "", 0, 0, KVF_CONFIG_FIELD_SECRET,
                 "file holding the cluster secret; every connection must "
                 "prove it (empty: no authentication)"),
    KVF_CC_FIELD("tls_cert", KVF_CONFIG_STRING, tls_cert, "", 0, 0, 0,
                 "PEM certificate (chain) of the control port; with tls_key, "
                 "agents and kvfctl must speak TLS (empty: plain TCP)"),
    KVF_CC_FIELD("tls_key", KVF_CONFIG_STRING, tls_key, "", 0, 0, 0,
                 "PEM private key of tls_cert"),
    KVF_CC_FIELD("handshake_timeout", KVF_CONFIG_DURATION, handshake_timeout_ns,
                 "10s", 1000000ull, 3600000000000ull, 0,
                 "with a secret or TLS: a connection that has not "
                 "authenticated by then is closed; without either, one that "
                 "has not sent HELLO by then"),
    KVF_CC_FIELD("max_buffered", KVF_CONFIG_SIZE, max_buffered, "256M",
                 1ull << 20, 0, 0,
                 "bytes buffered across all connections (partial frames and "
                 "unsent replies); above it the largest connection is closed"),
    KVF_CC_FIELD("max_buffered_preauth", KVF_CONFIG_SIZE, max_buffered_preauth,
                 "16M", 65536, 0, 0,
                 "of max_buffered, the most held by connections that have not "
                 "authenticated; above it the largest of those is closed"),
    KVF_CC_FIELD("http_open", KVF_CONFIG_STRING, http_open, "/healthz,/metrics",
                 0, 0, 0,
                 "with a cluster secret: HTTP paths served without the bearer "
                 "token (comma-separated; others need it)"),
    KVF_CC_FIELD("events", KVF_CONFIG_STRING, events, "", 0, 0, 0,
                 "ZeroMQ endpoint to publish KV events on, in vLLM's shape "
                 "(e.g. tcp://127.0.0.1:5557; empty: off)"),
    KVF_CC_FIELD("events_replay", KVF_CONFIG_STRING, events_replay, "", 0, 0, 0,
                 "ZeroMQ endpoint answering replay requests for missed "
                 "KV events (empty: off)"),
    KVF_CC_FIELD("events_buffer", KVF_CONFIG_UINT, events_buffer, "10000", 1,
                 1000000, 0, "KV event batches kept for replay"),
    KVF_CC_FIELD("etcd", KVF_CONFIG_STRING, etcd, "", 0, 0, 0,
                 "etcd endpoints (http://HOST:PORT[,...]): campaign for "
                 "leadership, serve only while leader (empty: run alone)"),
    KVF_CC_FIELD("etcd_prefix", KVF_CONFIG_STRING, etcd_prefix, "/kvfabric", 0,
                 0, 0, "etcd key prefix of this cluster's election"),
    KVF_CC_FIELD("etcd_lease", KVF_CONFIG_DURATION, etcd_lease_ns, "2s",
                 1000000000ull, 60000000000ull, 0,
                 "leader lease TTL in etcd (whole seconds): a dead leader is "
                 "replaced after about this long"),
    KVF_CC_FIELD("print_config", KVF_CONFIG_BOOL, print_config, "false", 0, 0,
                 KVF_CONFIG_FIELD_CLI_ONLY,
                 "print the effective configuration, check what the "
                 "controller would refuse (secret file, TLS files, "
                 "addresses) and exit: 0 when it would start"),
};

const kvf_config_schema_t kvf_controller_config_schema = {
    .program    = "kvf-controller",
    .fields     = kvf_controller_config_fields,
    .num_fields = sizeof(kvf_controller_config_fields) /
                  sizeof(kvf_controller_config_fields[0]),
};
