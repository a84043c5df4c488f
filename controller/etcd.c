/* SPDX-License-Identifier: Apache-2.0 */
/* Copyright (c) 2026 The kvfabric authors */
#include "controller/etcd.h"

#include "common/etcd_json.h"

#include <json-c/json.h>

#include <stdbool.h>
#include <stdint.h>

kvf_status_t kvf_etcd_lease_grant(kvf_etcd_t *etcd, int64_t ttl_s,
                                  int64_t *id_p, int64_t *ttl_p)
{
    json_object *req = json_object_new_object(), *rep = NULL;
    kvf_status_t status;

    if (req == NULL) {
        return KVF_ERR_NO_MEMORY;
    }
    json_object_object_add(req, "TTL", json_object_new_int64(ttl_s));
    status = kvf_etcd_call(etcd, "/v3/lease/grant", req, &rep);
    json_object_put(req);
    if (status != KVF_OK) {
        return status;
    }
    *id_p  = kvf_etcd_int(rep, "ID");
    *ttl_p = kvf_etcd_int(rep, "TTL");
    json_object_put(rep);
    return ((*id_p != 0) && (*ttl_p > 0)) ? KVF_OK : KVF_ERR_PROTO;
}

kvf_status_t kvf_etcd_lease_keepalive(kvf_etcd_t *etcd, int64_t id,
                                      int64_t *ttl_p)
{
    json_object *req = json_object_new_object(), *rep = NULL;
    kvf_status_t status;

    if (req == NULL) {
        return KVF_ERR_NO_MEMORY;
    }
    json_object_object_add(req, "ID", json_object_new_int64(id));
    status = kvf_etcd_call(etcd, "/v3/lease/keepalive", req, &rep);
    json_object_put(req);
    if (status != KVF_OK) {
        return status;
    }
    /* the gateway streams: {"result":{...,"TTL":"2"}}; no TTL: gone */
    *ttl_p = kvf_etcd_int(kvf_etcd_field(rep, "result"), "TTL");
    json_object_put(rep);
    return KVF_OK;
}

kvf_status_t kvf_etcd_lease_revoke(kvf_etcd_t *etcd, int64_t id)
{
    json_object *req = json_object_new_object(), *rep = NULL;
    kvf_status_t status;

    if (req == NULL) {
        return KVF_ERR_NO_MEMORY;
    }
    json_object_object_add(req, "ID", json_object_new_int64(id));
    status = kvf_etcd_call(etcd, "/v3/lease/revoke", req, &rep);
    json_object_put(req);
    json_object_put(rep);
    return status;
}

/* A txn: if @p key's create revision is @p rev, put @p value under
 * @p lease. */
static kvf_status_t kvf_etcd_txn_put(kvf_etcd_t *etcd, const char *key,
                                     const char *value, int64_t lease,
                                     int64_t rev, bool *done_p,
                                     int64_t *revision_p)
{
    json_object *req, *cmp, *put, *op, *rep = NULL;
    kvf_status_t status;

    req = json_object_new_object();
    cmp = json_object_new_object();
    put = json_object_new_object();
    op  = json_object_new_object();
    if ((req == NULL) || (cmp == NULL) || (put == NULL) || (op == NULL)) {
        json_object_put(req);
        json_object_put(cmp);
        json_object_put(put);
        json_object_put(op);
        return KVF_ERR_NO_MEMORY;
    }
    json_object_object_add(cmp, "key", kvf_etcd_b64(key));
    json_object_object_add(cmp, "target", json_object_new_string("CREATE"));
    json_object_object_add(cmp, "result", json_object_new_string("EQUAL"));
    json_object_object_add(cmp, "create_revision", json_object_new_int64(rev));
    json_object_object_add(put, "key", kvf_etcd_b64(key));
    json_object_object_add(put, "value", kvf_etcd_b64(value));
    json_object_object_add(put, "lease", json_object_new_int64(lease));
    json_object_object_add(op, "request_put", put);
    json_object_object_add(req, "compare", json_object_new_array());
    json_object_array_add(kvf_etcd_field(req, "compare"), cmp);
    json_object_object_add(req, "success", json_object_new_array());
    json_object_array_add(kvf_etcd_field(req, "success"), op);
    status = kvf_etcd_call(etcd, "/v3/kv/txn", req, &rep);
    json_object_put(req);
    if (status != KVF_OK) {
        return status;
    }
    *done_p = json_object_get_boolean(kvf_etcd_field(rep, "succeeded"));
    if (revision_p != NULL) {
        *revision_p = kvf_etcd_int(kvf_etcd_field(rep, "header"), "revision");
    }
    json_object_put(rep);
    return KVF_OK;
}

kvf_status_t kvf_etcd_create_key(kvf_etcd_t *etcd, const char *key,
                                 const char *value, int64_t lease,
                                 bool *created_p, int64_t *revision_p)
{
    return kvf_etcd_txn_put(etcd, key, value, lease, 0, created_p, revision_p);
}

kvf_status_t kvf_etcd_update_key(kvf_etcd_t *etcd, const char *key,
                                 const char *value, int64_t lease,
                                 int64_t create_revision)
{
    kvf_status_t status;
    bool done = false;

    status =
        kvf_etcd_txn_put(etcd, key, value, lease, create_revision, &done, NULL);
    if ((status == KVF_OK) && !done) {
        status = KVF_ERR_STATE;
    }
    return status;
}
