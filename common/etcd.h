/* SPDX-License-Identifier: Apache-2.0 */
/* Copyright (c) 2026 The kvfabric authors */
/*
 * A small blocking client of etcd's v3 JSON gateway (etcd 3.4: POST
 * /v3/kv/range, ...; keys and values base64, int64 as strings): the
 * connection, reads, and the leader's published addresses, shared by
 * kvf-controller (whose controller/etcd.c adds leases and transactions for
 * its election), kvf-agent and kvfctl/kvf-bench (library kvf_etcd:
 * libcurl, json-c).
 *
 * thread: one client per thread (it owns one curl handle). Every call is
 * bounded by the timeout given to it (or at create). Endpoints are tried
 * in order; the one that answered is tried first next time.
 */
#ifndef KVF_COMMON_ETCD_H
#define KVF_COMMON_ETCD_H

#include <kvfabric/status.h>

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct kvf_etcd kvf_etcd_t;

/* @p urls: "http://HOST:PORT[,http://HOST:PORT...]" (curl_global_init()
 * is done once, thread-safely, by the first create). */
kvf_status_t kvf_etcd_create(const char *urls, uint64_t timeout_ms,
                             kvf_etcd_t **etcd_p);

void kvf_etcd_destroy(kvf_etcd_t *etcd);

/* Bounds the next calls (0: the create timeout). */
void kvf_etcd_set_timeout(kvf_etcd_t *etcd, uint64_t timeout_ms);

/* Reads @p key: *found_p, its value (NUL-terminated, truncated to
 * @p len) and its create revision. */
kvf_status_t kvf_etcd_get(kvf_etcd_t *etcd, const char *key, bool *found_p,
                          char *value, size_t len, int64_t *create_rev_p);

/* The leader's published addresses (controller/election.h). */
typedef struct kvf_etcd_leader {
    char control[256]; /* HOST:PORT agents and kvfctl connect to */
    char http[256];    /* HOST:PORT of its dashboard and /metrics */
    uint64_t term;     /* the election's term (create revision) */
} kvf_etcd_leader_t;

/* Reads @p prefix/leader: KVF_OK with the leader's addresses;
 * KVF_ERR_NOT_FOUND when no leader has published them (none elected, or
 * just elected and not yet serving); KVF_ERR_IO when no endpoint answers;
 * KVF_ERR_PROTO for a value that is not the leader's JSON. */
kvf_status_t kvf_etcd_leader_get(kvf_etcd_t *etcd, const char *prefix,
                                 kvf_etcd_leader_t *leader);

/* One look for tools (kvfctl, kvf-bench): the control address of the
 * leader named in etcd @p urls under @p prefix, into @p control; on
 * failure a one-line reason in @p err. */
kvf_status_t kvf_etcd_find_leader(const char *urls, const char *prefix,
                                  uint64_t timeout_ms, char *control,
                                  size_t len, char *err, size_t err_len);

#endif /* KVF_COMMON_ETCD_H */
