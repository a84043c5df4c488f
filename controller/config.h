/* SPDX-License-Identifier: Apache-2.0 */
/* Copyright (c) 2026 The kvfabric authors */
/*
 * kvf-controller configuration (docs/configuration.md, "kvf-controller").
 *
 * thread: loaded once at startup.
 */
#ifndef KVF_CONTROLLER_CONFIG_H
#define KVF_CONTROLLER_CONFIG_H

#include "common/config.h"

#include <stdbool.h>
#include <stdint.h>

typedef struct kvf_controller_config {
    char *listen;                  /* HOST:PORT of the frame protocol */
    char *http;                    /* HOST:PORT of HTTP; empty: off */
    char *advertise;               /* control address published in etcd */
    char *advertise_http;          /* HTTP address published in etcd */
    bool etcd_resign;              /* a leader that lost every agent resigns */
    char *port_file;               /* write bound addresses here */
    uint64_t lease_ns;             /* node lease */
    uint64_t heartbeat_ns;         /* interval told to agents */
    uint64_t recovery_window_ns;   /* longest "recovering" after start */
    uint64_t forget_dead_ns;       /* dead nodes listed this long */
    uint64_t max_frame;            /* bytes */
    uint64_t max_output;           /* per-connection output cap, bytes */
    uint64_t max_batch;            /* keys per LOOKUP */
    uint64_t initial_keys;         /* registry sizing hint */
    uint64_t purge_slice;          /* table entries purged per timer tick */
    char *cluster_secret_file;     /* empty: no authentication */
    char *tls_cert;                /* PEM chain; with tls_key: TLS on */
    char *tls_key;                 /* PEM private key */
    uint64_t handshake_timeout_ns; /* HELLO/AUTH (and TLS) must end by then */
    bool print_config;             /* CLI only: print, check and exit */
    uint64_t max_buffered;         /* bytes buffered, all connections */
    uint64_t max_buffered_preauth; /* of those, by unauthenticated ones */
    char *http_open;               /* paths served without a token */
    char *etcd;                    /* etcd endpoints; empty: no HA */
    char *etcd_prefix;             /* key prefix of the election */
    uint64_t etcd_lease_ns;        /* leader lease TTL */
    char *events;                  /* ZeroMQ PUB endpoint; empty: off */
    char *events_replay;           /* ZeroMQ ROUTER endpoint; empty: off */
    uint64_t events_buffer;        /* batches kept for replay */
} kvf_controller_config_t;

extern const kvf_config_schema_t kvf_controller_config_schema;

#endif /* KVF_CONTROLLER_CONFIG_H */
