/* SPDX-License-Identifier: Apache-2.0 */
/* Copyright (c) 2026 The kvfabric authors */
/*
 * The agent mesh: what the peer service (agent/peer.h) and PD
 * (agent/pd.h) share to talk to other agents over UCX active messages.
 *
 * - one enum of active-message ids (the transport drops and counts every
 *   other id, transport/ucx.h KVF_UCX_AM_ID_WIRE_MAX);
 * - one send of a protobuf frame as an eager message, the frame kept until
 *   UCX completes the send (UCX 1.13 may replay it during wireup);
 * - one decode-and-validate of a frame from a peer: bounded size, one of
 *   the types the handler expects; anything else dropped and counted;
 * - one node directory: a peer's data address by node id and by name,
 *   filled from the controller's NODE_INFO answers, dropped on failure.
 *
 * thread: owning loop only.
 */
#ifndef KVF_AGENT_MESH_H
#define KVF_AGENT_MESH_H

#include "proto/frame.h"
#include "transport/ucx.h"

#include <kvfabric/status.h>

#include <stdbool.h>
#include <stdint.h>

/* Active-message ids between agents; values travel on the wire, never
 * renumber. */
typedef enum {
    KVF_MESH_AM_PEER_FETCH = 1, /* requester -> holder: PEER_FETCH frame */
    KVF_MESH_AM_PEER_CHUNK = 2, /* holder -> requester: PEER_CHUNK header,
                                   the chunk as payload */
    KVF_MESH_AM_PD_CTRL = 3,    /* payload: one PD_* control frame */
    KVF_MESH_AM_PD_DATA = 4,    /* header: PD_DATA frame; payload: chunk */
    KVF_MESH_AM_LAST,           /* first id this version does not use */
} kvf_mesh_am_t;

/* Largest header of a message carrying a payload (PEER_CHUNK, PD_DATA). */
#define KVF_MESH_HDR_MAX 256u

/* Why a message from a peer was dropped (kvf_mesh_stats_t.dropped). */
typedef enum {
    KVF_MESH_DROP_MALFORMED = 0, /* not a frame, or over its size bound */
    KVF_MESH_DROP_WRONG_TYPE,    /* a frame type the id does not carry */
    KVF_MESH_DROP_NO_REPLY_EP,   /* a request UCX gave no reply endpoint */
    KVF_MESH_DROP_UNEXPECTED,    /* a reply nobody asked for, or from an
                                    endpoint the request did not go to */
    KVF_MESH_DROP_REASONS,
} kvf_mesh_drop_t;

typedef struct kvf_mesh_stats {
    uint64_t dropped[KVF_MESH_DROP_REASONS];
} kvf_mesh_stats_t;

typedef struct kvf_mesh kvf_mesh_t;

/* A frame send completed (KVF_OK) or failed; @p tag as given to send. */
typedef void (*kvf_mesh_sent_cb_t)(kvf_status_t status, void *arg,
                                   uint64_t tag);

/* @p name is for logs (copied). */
kvf_status_t kvf_mesh_create(kvf_ucx_worker_t *worker, const char *name,
                             kvf_mesh_t **mesh_p);

/* NULL is a no-op. After the worker (its operations call back here). */
void kvf_mesh_destroy(kvf_mesh_t *mesh);

kvf_ucx_worker_t *kvf_mesh_worker(const kvf_mesh_t *mesh);

/* Registers @p cb for mesh id @p id on the worker. */
kvf_status_t kvf_mesh_set_handler(kvf_mesh_t *mesh, kvf_mesh_am_t id,
                                  kvf_ucx_am_cb_t cb, void *arg);

/*
 * Packs @p msg as a frame of @p type and sends it eagerly as message @p id
 * on @p ep; the frame is kept until the send completes. @p cb (may be
 * NULL) runs exactly once, never from inside this call, when KVF_OK is
 * returned; not at all otherwise.
 * @return KVF_OK; KVF_ERR_NO_MEMORY; KVF_ERR_TOO_BIG; as kvf_ucx_am_send
 */
kvf_status_t kvf_mesh_send_frame(kvf_mesh_t *mesh, kvf_ucx_ep_t *ep,
                                 kvf_mesh_am_t id, uint16_t type,
                                 const ProtobufCMessage *msg,
                                 uint64_t timeout_ns, kvf_mesh_sent_cb_t cb,
                                 void *arg, uint64_t tag);

/*
 * Decodes the frame a peer sent in @p buf (@p len bytes, at most @p max)
 * and checks its type is one of @p types. On KVF_OK the caller releases
 * @p frame_p with kvf_frame_release. Otherwise the message is dropped:
 * counted, logged at debug with @p what, KVF_ERR_PROTO returned.
 */
kvf_status_t kvf_mesh_decode(kvf_mesh_t *mesh, const void *buf, size_t len,
                             size_t max, const uint16_t *types,
                             unsigned num_types, const char *what,
                             kvf_frame_t *frame_p);

/* An unguessable, non-zero 64-bit id (request ids, PD tickets): a peer
 * cannot forge a reply to a request it did not see. */
uint64_t kvf_mesh_random_id(kvf_mesh_t *mesh);

/* Counts a message dropped after decoding (logged by the caller). */
void kvf_mesh_drop(kvf_mesh_t *mesh, kvf_mesh_drop_t why);

void kvf_mesh_get_stats(const kvf_mesh_t *mesh, kvf_mesh_stats_t *stats_p);

/* Name of a drop reason, for metric labels. */
const char *kvf_mesh_drop_name(kvf_mesh_drop_t why);

/* ------------------------------------------------------ node directory */

/* Longest data address kept ("HOST:PORT"), with the NUL. */
#define KVF_MESH_ADDR_MAX 64
/* Longest node name kept, with the NUL. */
#define KVF_MESH_NAME_MAX 128

/* The data address of node @p node_id, or NULL (borrowed until the next
 * directory change). */
const char *kvf_mesh_node_by_id(const kvf_mesh_t *mesh, uint32_t node_id);

/* The data address of the node named @p name, or NULL (as above). */
const char *kvf_mesh_node_by_name(const kvf_mesh_t *mesh, const char *name);

/* Records node @p node_id (named @p name, NULL or "" when unknown) at
 * @p address; the oldest entry makes room. Addresses too long are not
 * kept. */
void kvf_mesh_node_store(kvf_mesh_t *mesh, uint32_t node_id, const char *name,
                         const char *address);

/* Forgets node @p node_id (0: none) and the node named @p name (NULL:
 * none), e.g. after a failed send: the next use asks the controller. */
void kvf_mesh_node_forget(kvf_mesh_t *mesh, uint32_t node_id, const char *name);

#endif /* KVF_AGENT_MESH_H */
