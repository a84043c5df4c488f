/* SPDX-License-Identifier: Apache-2.0 */
/* Copyright (c) 2026 The kvfabric authors */
/*
 * The JSON side of common/etcd.c, for the callers that add requests of
 * their own (controller/etcd.c): json-c objects in and out.
 */
#ifndef KVF_COMMON_ETCD_JSON_H
#define KVF_COMMON_ETCD_JSON_H

#include "common/etcd.h"

#include <json-c/json.h>

#include <stdint.h>

/* POSTs @p req to PATH on the endpoints in turn; *rep_p is the parsed
 * reply of the first that answered 200 (caller puts it). */
kvf_status_t kvf_etcd_call(kvf_etcd_t *etcd, const char *path, json_object *req,
                           json_object **rep_p);

/* An int64 field that etcd writes as a string (absent: 0). */
int64_t kvf_etcd_int(json_object *obj, const char *name);

/* A field of @p obj (NULL when absent or @p obj is NULL). */
json_object *kvf_etcd_field(json_object *obj, const char *name);

/* @p text base64-encoded, as a new JSON string (NULL: no memory). */
json_object *kvf_etcd_b64(const char *text);

#endif /* KVF_COMMON_ETCD_JSON_H */
