/* SPDX-License-Identifier: Apache-2.0 */
/* Copyright (c) 2026 The kvfabric authors */
/*
 * The controller's part of the etcd client (common/etcd.h): leases and
 * the transactions of the leader election of election.c.
 *
 * thread: as common/etcd.h, one client per thread.
 */
#ifndef KVF_CONTROLLER_ETCD_H
#define KVF_CONTROLLER_ETCD_H

#include "common/etcd.h"

#include <kvfabric/status.h>

#include <stdbool.h>
#include <stdint.h>

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

#endif /* KVF_CONTROLLER_ETCD_H */
