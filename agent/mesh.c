/* SPDX-License-Identifier: Apache-2.0 */
/* Copyright (c) 2026 The kvfabric authors */
#include "agent/mesh.h"

#include "common/auth.h"
#include "common/log.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Nodes kept by the directory; a cluster larger than this only pays an
 * extra NODE_INFO now and then. */
#define KVF_MESH_NODES 64

typedef struct kvf_mesh_node {
    uint32_t node_id; /* 0: unknown (or unused with an empty address) */
    char name[KVF_MESH_NAME_MAX];
    char address[KVF_MESH_ADDR_MAX]; /* "": unused */
} kvf_mesh_node_t;

struct kvf_mesh {
    kvf_ucx_worker_t *worker;
    kvf_mesh_stats_t stats;
    kvf_mesh_node_t nodes[KVF_MESH_NODES];
    unsigned next_node; /* the entry replaced next when all are used */
    uint8_t random[KVF_AUTH_NONCE_SIZE]; /* DRBG output not used yet */
    unsigned random_used;                /* bytes of it used */
    char name[128];
};

/* A frame being sent: kept until UCX completes the send. */
typedef struct kvf_mesh_msg {
    kvf_mesh_sent_cb_t cb;
    void *arg;
    uint64_t tag;
    size_t len;
    uint8_t frame[];
} kvf_mesh_msg_t;

static const char *const kvf_mesh_drop_names[KVF_MESH_DROP_REASONS] = {
    [KVF_MESH_DROP_MALFORMED]   = "malformed",
    [KVF_MESH_DROP_WRONG_TYPE]  = "wrong_type",
    [KVF_MESH_DROP_NO_REPLY_EP] = "no_reply_ep",
    [KVF_MESH_DROP_UNEXPECTED]  = "unexpected",
};

kvf_status_t kvf_mesh_create(kvf_ucx_worker_t *worker, const char *name,
                             kvf_mesh_t **mesh_p)
{
    kvf_mesh_t *mesh;

    if (worker == NULL) {
        return KVF_ERR_INVALID;
    }
    mesh = calloc(1, sizeof(*mesh));
    if (mesh == NULL) {
        return KVF_ERR_NO_MEMORY;
    }
    mesh->worker = worker;
    snprintf(mesh->name, sizeof(mesh->name), "%s",
             (name != NULL) ? name : "agent");
    *mesh_p = mesh;
    return KVF_OK;
}

void kvf_mesh_destroy(kvf_mesh_t *mesh)
{
    free(mesh);
}

kvf_ucx_worker_t *kvf_mesh_worker(const kvf_mesh_t *mesh)
{
    return mesh->worker;
}

kvf_status_t kvf_mesh_set_handler(kvf_mesh_t *mesh, kvf_mesh_am_t id,
                                  kvf_ucx_am_cb_t cb, void *arg)
{
    return kvf_ucx_am_set_handler(mesh->worker, (unsigned)id, cb, arg);
}

static void kvf_mesh_on_sent(kvf_status_t status, void *arg)
{
    kvf_mesh_msg_t *m     = arg;
    kvf_mesh_sent_cb_t cb = m->cb;
    void *cb_arg          = m->arg;
    uint64_t tag          = m->tag;

    free(m);
    if (cb != NULL) {
        cb(status, cb_arg, tag);
    }
}

kvf_status_t kvf_mesh_send_frame(kvf_mesh_t *mesh, kvf_ucx_ep_t *ep,
                                 kvf_mesh_am_t id, uint16_t type,
                                 const ProtobufCMessage *msg,
                                 uint64_t timeout_ns, kvf_mesh_sent_cb_t cb,
                                 void *arg, uint64_t tag)
{
    size_t len = kvf_frame_size(msg);
    kvf_mesh_msg_t *m;
    kvf_status_t status;

    m = malloc(sizeof(*m) + len);
    if (m == NULL) {
        return KVF_ERR_NO_MEMORY;
    }
    m->cb  = cb;
    m->arg = arg;
    m->tag = tag;
    status = kvf_frame_pack(m->frame, len, type, 0, msg, KVF_FRAME_MAX_DEFAULT,
                            &m->len);
    if (status == KVF_OK) {
        status = kvf_ucx_am_send(ep, (unsigned)id, NULL, 0, m->frame, m->len,
                                 NULL, KVF_UCX_AM_SEND_EAGER, timeout_ns,
                                 kvf_mesh_on_sent, m);
    }
    if (status != KVF_OK) {
        free(m);
    }
    return status;
}

kvf_status_t kvf_mesh_decode(kvf_mesh_t *mesh, const void *buf, size_t len,
                             size_t max, const uint16_t *types,
                             unsigned num_types, const char *what,
                             kvf_frame_t *frame_p)
{
    kvf_status_t status = KVF_ERR_PROTO;
    size_t used         = 0;
    unsigned i;

    if ((buf != NULL) && (len <= max)) {
        status =
            kvf_frame_decode_buf(buf, len, (uint32_t)max, NULL, frame_p, &used);
    }
    if (status != KVF_OK) {
        mesh->stats.dropped[KVF_MESH_DROP_MALFORMED]++;
        kvf_debug("%s: bad %s (%zu bytes): %s; dropped", mesh->name, what, len,
                  kvf_strerror(status));
        return KVF_ERR_PROTO;
    }
    for (i = 0; i < num_types; i++) {
        if (frame_p->type == types[i]) {
            return KVF_OK;
        }
    }
    mesh->stats.dropped[KVF_MESH_DROP_WRONG_TYPE]++;
    kvf_debug("%s: %s sent as %s; dropped", mesh->name,
              kvf_msg_type_name(frame_p->type), what);
    kvf_frame_release(frame_p, NULL);
    return KVF_ERR_PROTO;
}

uint64_t kvf_mesh_random_id(kvf_mesh_t *mesh)
{
    uint64_t id = 0;

    while (id == 0) {
        if ((mesh->random_used == 0) ||
            (mesh->random_used + sizeof(id) > sizeof(mesh->random))) {
            /* OpenSSL's DRBG, a few ids per call */
            if (kvf_auth_nonce(mesh->random) != KVF_OK) {
                kvf_fatal("%s: no random ids", mesh->name);
            }
            mesh->random_used = 0;
        }
        memcpy(&id, mesh->random + mesh->random_used, sizeof(id));
        mesh->random_used += sizeof(id);
    }
    return id;
}

void kvf_mesh_drop(kvf_mesh_t *mesh, kvf_mesh_drop_t why)
{
    if ((unsigned)why < KVF_MESH_DROP_REASONS) {
        mesh->stats.dropped[why]++;
    }
}

void kvf_mesh_get_stats(const kvf_mesh_t *mesh, kvf_mesh_stats_t *stats_p)
{
    *stats_p = mesh->stats;
}

const char *kvf_mesh_drop_name(kvf_mesh_drop_t why)
{
    return ((unsigned)why < KVF_MESH_DROP_REASONS) ? kvf_mesh_drop_names[why]
                                                   : "unknown";
}

/* ------------------------------------------------------ node directory */

const char *kvf_mesh_node_by_id(const kvf_mesh_t *mesh, uint32_t node_id)
{
    unsigned i;

    if (node_id == 0) {
        return NULL;
    }
    for (i = 0; i < KVF_MESH_NODES; i++) {
        if ((mesh->nodes[i].node_id == node_id) &&
            (mesh->nodes[i].address[0] != '\0')) {
            return mesh->nodes[i].address;
        }
    }
    return NULL;
}

const char *kvf_mesh_node_by_name(const kvf_mesh_t *mesh, const char *name)
{
    unsigned i;

    if ((name == NULL) || (name[0] == '\0')) {
        return NULL;
    }
    for (i = 0; i < KVF_MESH_NODES; i++) {
        if ((mesh->nodes[i].address[0] != '\0') &&
            (strcmp(mesh->nodes[i].name, name) == 0)) {
            return mesh->nodes[i].address;
        }
    }
    return NULL;
}

void kvf_mesh_node_store(kvf_mesh_t *mesh, uint32_t node_id, const char *name,
                         const char *address)
{
    char kept[KVF_MESH_NAME_MAX] = "";
    kvf_mesh_node_t *n           = NULL;
    unsigned i;

    if ((address == NULL) || (strlen(address) >= KVF_MESH_ADDR_MAX) ||
        ((name != NULL) && (strlen(name) >= KVF_MESH_NAME_MAX))) {
        return;
    }
    if ((name == NULL) || (name[0] == '\0')) {
        /* keep the name an earlier answer gave this node */
        for (i = 0; (i < KVF_MESH_NODES) && (node_id != 0); i++) {
            if ((mesh->nodes[i].node_id == node_id) &&
                (mesh->nodes[i].address[0] != '\0')) {
                snprintf(kept, sizeof(kept), "%s", mesh->nodes[i].name);
                break;
            }
        }
        name = kept;
    }
    /* one entry per node: the same id, or the same name */
    kvf_mesh_node_forget(mesh, node_id, name);
    for (i = 0; i < KVF_MESH_NODES; i++) {
        if (mesh->nodes[i].address[0] == '\0') {
            n = &mesh->nodes[i];
            break;
        }
    }
    if (n == NULL) {
        n               = &mesh->nodes[mesh->next_node];
        mesh->next_node = (mesh->next_node + 1) % KVF_MESH_NODES;
    }
    n->node_id = node_id;
    snprintf(n->name, sizeof(n->name), "%s", (name != NULL) ? name : "");
    snprintf(n->address, sizeof(n->address), "%s", address);
}

void kvf_mesh_node_forget(kvf_mesh_t *mesh, uint32_t node_id, const char *name)
{
    kvf_mesh_node_t *n;
    unsigned i;

    for (i = 0; i < KVF_MESH_NODES; i++) {
        n = &mesh->nodes[i];
        if (n->address[0] == '\0') {
            continue;
        }
        if (((node_id != 0) && (n->node_id == node_id)) ||
            ((name != NULL) && (name[0] != '\0') &&
             (strcmp(n->name, name) == 0))) {
            memset(n, 0, sizeof(*n));
        }
    }
}
