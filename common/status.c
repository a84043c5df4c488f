/* SPDX-License-Identifier: Apache-2.0 */
/* Copyright (c) 2026 The kvfabric authors */
#include <kvfabric/status.h>

#include "common/byteorder.h"

#include <stddef.h>

typedef struct kvf_status_desc {
    kvf_status_t status;
    const char *name;
    const char *text;
} kvf_status_desc_t;

static const kvf_status_desc_t kvf_status_descs[] = {
    {KVF_OK, "KVF_OK", "success"},
    {KVF_INPROGRESS, "KVF_INPROGRESS", "in progress"},
    {KVF_ERR_NO_MEMORY, "KVF_ERR_NO_MEMORY", "out of memory"},
    {KVF_ERR_INVALID, "KVF_ERR_INVALID", "invalid argument"},
    {KVF_ERR_PROTO, "KVF_ERR_PROTO", "protocol error"},
    {KVF_ERR_IO, "KVF_ERR_IO", "i/o error"},
    {KVF_ERR_TRANSPORT, "KVF_ERR_TRANSPORT", "transport error"},
    {KVF_ERR_TIMEOUT, "KVF_ERR_TIMEOUT", "timed out"},
    {KVF_ERR_NOT_FOUND, "KVF_ERR_NOT_FOUND", "not found"},
    {KVF_ERR_EXISTS, "KVF_ERR_EXISTS", "already exists"},
    {KVF_ERR_CHECKSUM, "KVF_ERR_CHECKSUM", "checksum mismatch"},
    {KVF_ERR_VERSION, "KVF_ERR_VERSION", "protocol version mismatch"},
    {KVF_ERR_AUTH, "KVF_ERR_AUTH", "authentication failed"},
    {KVF_ERR_CLOSED, "KVF_ERR_CLOSED", "connection closed"},
    {KVF_ERR_BUSY, "KVF_ERR_BUSY", "busy"},
    {KVF_ERR_UNSUPPORTED, "KVF_ERR_UNSUPPORTED", "not supported"},
    {KVF_ERR_STALE, "KVF_ERR_STALE", "stale incarnation"},
    {KVF_ERR_CANCELED, "KVF_ERR_CANCELED", "canceled"},
    {KVF_ERR_CONFIG, "KVF_ERR_CONFIG", "configuration error"},
    {KVF_ERR_TOO_BIG, "KVF_ERR_TOO_BIG", "too big"},
    {KVF_ERR_RANGE, "KVF_ERR_RANGE", "out of range"},
    {KVF_ERR_STATE, "KVF_ERR_STATE", "invalid state"},
};

static const kvf_status_desc_t *kvf_status_desc_find(kvf_status_t status)
{
    size_t i;

    for (i = 0; i < KVF_ARRAY_SIZE(kvf_status_descs); i++) {
        if (kvf_status_descs[i].status == status) {
            return &kvf_status_descs[i];
        }
    }
    return NULL;
}

const char *kvf_strerror(kvf_status_t status)
{
    const kvf_status_desc_t *desc = kvf_status_desc_find(status);

    return (desc == NULL) ? "unknown status" : desc->text;
}

const char *kvf_status_name(kvf_status_t status)
{
    const kvf_status_desc_t *desc = kvf_status_desc_find(status);

    return (desc == NULL) ? "KVF_ERR_UNKNOWN" : desc->name;
}
