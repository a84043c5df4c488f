/* SPDX-License-Identifier: Apache-2.0 */
/* Copyright (c) 2026 The kvfabric authors */
/*
 * A small blocking client of etcd's v3 JSON gateway (etcd 3.4: POST
 * /v3/kv/range, /v3/kv/txn, /v3/kv/put, /v3/lease/{grant,keepalive,
 * revoke}; keys and values base64, int64 as strings). Enough for the
 * leader election of election.c, nothing more.
 *
 * thread: one client per thread (it owns one curl handle). Every call is
 * bounded by the timeout given to it (or at create). Endpoints are tried
 * in order; the one that answered is tried first next time.
 */
#ifndef KVF_CONTROLLER_ETCD_H
#define KVF_CONTROLLER_ETCD_H

#include <kvfabric/status.h>

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct kvf_etcd kvf_etcd_t;

/* @p urls: "http://HOST:PORT[,http://HOST:PORT...]". Call
 * curl_global_init() once before the first create. */
kvf_status_t kvf_etcd_create(const char *urls, uint64_t timeout_ms,
                             kvf_etcd_t **etcd_p);

void kvf_etcd_destroy(kvf_etcd_t *etcd);

/* Bounds the next calls (0: the create timeout). */
void kvf_etcd_set_timeout(kvf_etcd_t *etcd, uint64_t timeout_ms);

/* Grants a lease of @p ttl_s seconds; *ttl_p is what etcd granted. */
kvf_status_t kvf_etcd_lease_grant(kvf_etcd_t *etcd, int64_t ttl_s,
                                  int64_t *id_p, int64_t *ttl_p);

/* One keep-alive; *ttl_p is 0 when the lease no longer exists. */
kvf_status_t kvf_etcd_lease_keepalive(kvf_etcd_t *etcd, int64_t id,
                                      int64_t *ttl_p);

kvf_status_t kvf_etcd_lease_revoke(kvf_etcd_t *etcd, int64_t id);

/* Creates @p key = @p value under @p lease only if the key does not exist
 * (a txn comparing its create revision with 0). *created_p tells; when
 * created, *revision_p is the key's create revision. */
kvf_status_t kvf_etcd_create_key(kvf_etcd_t *etcd, const char *key,
                                 const char *value, int64_t lease,
                                 bool *created_p, int64_t *revision_p);

/* Sets @p key = @p value under @p lease only while the key's create
 * revision is still @p create_revision; KVF_ERR_STATE otherwise. */
kvf_status_t kvf_etcd_update_key(kvf_etcd_t *etcd, const char *key,
                                 const char *value, int64_t lease,
                                 int64_t create_revision);

/* Sets @p key = @p value (no lease: it outlives the writer) only while
 * @p guard's create revision is @p guard_revision (the leader key of this
 * term: a deposed leader cannot write); KVF_ERR_STATE otherwise. */
kvf_status_t kvf_etcd_put_guarded(kvf_etcd_t *etcd, const char *key,
                                  const char *value, const char *guard,
                                  int64_t guard_revision);

/* Reads @p key: *found_p, its value (NUL-terminated, truncated to
 * @p len) and its create revision. */
kvf_status_t kvf_etcd_get(kvf_etcd_t *etcd, const char *key, bool *found_p,
                          char *value, size_t len, int64_t *create_rev_p);

#endif /* KVF_CONTROLLER_ETCD_H */
