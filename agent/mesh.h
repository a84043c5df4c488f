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
 *   filled from the holders LOOKUP replies name and from NODE_INFO
 *   answers (off the fetch path), dropped on failure;
 * - authenticated endpoints (docs/security.md): with a cluster secret,
 *   each connection between agents first completes a mutual HMAC
 *   challenge (common/auth.h, the scheme HELLO uses) on KVF_MESH_AM_AUTH,
 *   binding each side's node id, role and name; every other message on an
 *   endpoint that has not completed it is dropped before parsing and
 *   counted. Without a secret the data plane is open (and says so).
 *
 * thread: owning loop only.
 */
#ifndef KVF_AGENT_MESH_H
#define KVF_AGENT_MESH_H

#include "agent/ctl_client.h"
#include "common/auth.h"
#include "proto/frame.h"
#include "transport/ucx.h"

#include <kvfabric/status.h>

#include <stdbool.h>
#include <stdint.h>

/* Active-message ids between agents; values travel on the wire, never
 * renumber. */
typedef enum {
    KVF_MESH_AM_PEER_FETCH = 1,  /* requester -> holder: PEER_FETCH frame */
    KVF_MESH_AM_PEER_CHUNK = 2,  /* holder -> requester: PEER_CHUNK header,
                                    the chunk as payload */
    KVF_MESH_AM_PD_CTRL  = 3,    /* payload: one PD_* control frame */
    KVF_MESH_AM_PD_DATA  = 4,    /* header: PD_DATA frame; payload: chunk */
    KVF_MESH_AM_AUTH     = 5,    /* payload: one handshake step (mesh.c) */
    KVF_MESH_AM_PEER_BAD = 6,    /* requester -> holder: header is the key
                                    (wire form) of a chunk it served that
                                    failed verification */
    KVF_MESH_AM_PEER_CHUNKS = 7, /* holder -> requester: PEER_CHUNKS
                                    header, the chunks as payload */
    KVF_MESH_AM_LAST,            /* first id this version does not use */
} kvf_mesh_am_t;

/* Largest header of a message carrying a payload (PEER_CHUNK, PD_DATA). */
#define KVF_MESH_HDR_MAX 256u

/* Why a message from a peer was dropped (kvf_mesh_stats_t.dropped). */
typedef enum {
    KVF_MESH_DROP_MALFORMED = 0,   /* not a frame, or over its size bound */
    KVF_MESH_DROP_WRONG_TYPE,      /* a frame type the id does not carry */
    KVF_MESH_DROP_NO_REPLY_EP,     /* a request UCX gave no reply endpoint */
    KVF_MESH_DROP_UNEXPECTED,      /* a reply nobody asked for, or from an
                                      endpoint the request did not go to */
    KVF_MESH_DROP_UNAUTHENTICATED, /* on an endpoint that did not prove the
                                      cluster secret */
    KVF_MESH_DROP_REASONS,
} kvf_mesh_drop_t;

typedef struct kvf_mesh_stats {
    uint64_t dropped[KVF_MESH_DROP_REASONS];
    uint64_t auth_ok;       /* endpoints that completed the handshake */
    uint64_t auth_failures; /* handshakes refused or timed out */
    uint64_t deferred;      /* sends that waited for a free operation */
} kvf_mesh_stats_t;

/* What kvf_mesh_peer_role returns when the peer's role is not known
 * (no secret: nobody proved anything). */
#define KVF_MESH_ROLE_UNKNOWN UINT32_MAX

/* Frames waiting for a free worker operation, at most; how often they are
 * tried; how long one without a timeout of its own waits. */
#define KVF_MESH_DEFER_MAX        65536u
#define KVF_MESH_DEFER_RETRY_NS   (1000ull * 1000)
#define KVF_MESH_DEFER_TIMEOUT_NS (30ull * 1000 * 1000 * 1000)

typedef struct kvf_mesh_params {
    struct event_base *base;
    kvf_ucx_worker_t *worker;
    const char *name;                /* this node's name (copied) */
    uint32_t role;                   /* this node's kvf_agent_role_t */
    const kvf_auth_secret_t *secret; /* borrowed; NULL/empty: open */
    uint64_t auth_timeout_ns;        /* a handshake; 0: 5 s */
} kvf_mesh_params_t;

typedef struct kvf_mesh kvf_mesh_t;

/* A frame send completed (KVF_OK) or failed; @p tag as given to send. */
typedef void (*kvf_mesh_sent_cb_t)(kvf_status_t status, void *arg,
                                   uint64_t tag);

/* An endpoint completed the handshake (KVF_OK) or cannot (KVF_ERR_AUTH,
 * KVF_ERR_TIMEOUT, KVF_ERR_CLOSED); @p ep is borrowed for the call. */
typedef void (*kvf_mesh_ready_cb_t)(void *arg, kvf_status_t status,
                                    kvf_ucx_ep_t *ep, uint64_t tag);

/* Registers the handshake handler on the worker. */
kvf_status_t kvf_mesh_create(const kvf_mesh_params_t *params,
                             kvf_mesh_t **mesh_p);

/* Lets go of the endpoints the mesh holds, before the worker goes (so
 * that it frees each with its last reference): deferred sends are told
 * KVF_ERR_CANCELED, handshakes end (their waiters are not called), and no
 * new ones start. NULL is a no-op. */
void kvf_mesh_close(kvf_mesh_t *mesh);

/* NULL is a no-op. After the worker (its operations call back here);
 * pending readiness callbacks are dropped, not called. */
void kvf_mesh_destroy(kvf_mesh_t *mesh);

/* Where this node's id comes from (for the handshake); NULL: none yet.
 * The directory then learns every holder a LOOKUP reply names (the
 * client asks for their addresses), so fetches need no NODE_INFO. */
void kvf_mesh_set_ctl(kvf_mesh_t *mesh, kvf_ctl_client_t *ctl);

/* Is the data plane authenticated (a secret configured)? */
bool kvf_mesh_is_secure(const kvf_mesh_t *mesh);

/*
 * Makes @p ep (one this node opened, to a peer's listener) usable: KVF_OK
 * when it is (or auth is off), so the caller sends now; KVF_INPROGRESS
 * when the handshake runs (started now if needed): @p cb then runs once,
 * never from inside this call, by the handshake timeout at the latest. The
 * peer must prove it is node @p expect_id (0: any) named @p expect_name
 * (NULL: any). KVF_ERR_AUTH: the endpoint failed a handshake already.
 */
kvf_status_t kvf_mesh_connect(kvf_mesh_t *mesh, kvf_ucx_ep_t *ep,
                              uint32_t expect_id, const char *expect_name,
                              kvf_mesh_ready_cb_t cb, void *arg, uint64_t tag);

/* Has @p ep completed the handshake (or is auth off)? */
bool kvf_mesh_is_ready(const kvf_mesh_t *mesh, const kvf_ucx_ep_t *ep);

/*
 * The gate of every agent-to-agent handler, before it parses anything:
 * true when @p msg came on an endpoint that completed the handshake (or
 * auth is off). Otherwise the message is counted as unauthenticated and
 * false returned: the handler returns KVF_OK at once (declining it).
 */
bool kvf_mesh_accept(kvf_mesh_t *mesh, const kvf_ucx_am_msg_t *msg);

/* The proven role of the peer on @p ep; KVF_MESH_ROLE_UNKNOWN when auth
 * is off or the endpoint is not authenticated. */
uint32_t kvf_mesh_peer_role(const kvf_mesh_t *mesh, const kvf_ucx_ep_t *ep);

/* The proven node id of the peer on @p ep; 0 when auth is off or the
 * endpoint is not authenticated. */
uint32_t kvf_mesh_peer_id(const kvf_mesh_t *mesh, const kvf_ucx_ep_t *ep);

/* The node name a peer proved in the handshake on @p ep, or NULL (none
 * yet, or no secret). Borrowed, until the endpoint fails. */
const char *kvf_mesh_peer_name(const kvf_mesh_t *mesh, const kvf_ucx_ep_t *ep);

/* An endpoint failed (the worker's error callback): its handshake state
 * goes, waiters get KVF_ERR_CLOSED. */
void kvf_mesh_ep_failed(kvf_mesh_t *mesh, kvf_ucx_ep_t *ep);

kvf_ucx_worker_t *kvf_mesh_worker(const kvf_mesh_t *mesh);

/* Registers @p cb for mesh id @p id on the worker. */
kvf_status_t kvf_mesh_set_handler(kvf_mesh_t *mesh, kvf_mesh_am_t id,
                                  kvf_ucx_am_cb_t cb, void *arg);

/* What kvf_mesh_send_am sends: @p header and @p data (@p len bytes,
 * registered as @p mem or NULL) as kvf_ucx_am_send does, or, with @p iov
 * set, @p iovcnt pieces as kvf_ucx_am_send_iov does; @p flags theirs. */
typedef struct kvf_mesh_am_payload {
    const void *header;
    size_t header_len;
    const void *data;
    size_t len;
    const kvf_ucx_mem_t *mem;
    const kvf_ucx_iov_t *iov;
    size_t iovcnt;
    unsigned flags;
} kvf_mesh_am_payload_t;

/*
 * Sends @p payload as message @p id on @p ep, as kvf_ucx_am_send(_iov)
 * does, and waits as kvf_mesh_send_frame's frames do (in order with them)
 * while the worker has no operation free, by @p timeout_ns. A header of up
 * to KVF_UCX_AM_HEADER_MAX bytes is copied; a longer one, the data and the
 * iov stay the caller's, untouched until @p cb, which runs exactly once,
 * never from inside this call, when KVF_OK is returned. Allocates only
 * when the send must wait.
 * @return KVF_OK; KVF_ERR_NO_MEMORY; KVF_ERR_BUSY (KVF_MESH_DEFER_MAX
 *         waiting); as kvf_ucx_am_send
 */
kvf_status_t kvf_mesh_send_am(kvf_mesh_t *mesh, kvf_ucx_ep_t *ep,
                              kvf_mesh_am_t id,
                              const kvf_mesh_am_payload_t *payload,
                              uint64_t timeout_ns, kvf_ucx_op_cb_t cb,
                              void *arg);

/*
 * Packs @p msg as a frame of @p type and sends it eagerly as message @p id
 * on @p ep; the frame is kept until the send completes. @p cb (may be
 * NULL) runs exactly once, never from inside this call, when KVF_OK is
 * returned; not at all otherwise. While the worker has no operation free
 * (a burst), the frame waits in order with those before it and goes as
 * operations free up, by @p timeout_ns (KVF_ERR_TIMEOUT to @p cb after),
 * at most KVF_MESH_DEFER_MAX frames (more: KVF_ERR_BUSY).
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

/* The name of node @p node_id as the directory knows it, or NULL (as
 * above). */
const char *kvf_mesh_node_name(const kvf_mesh_t *mesh, uint32_t node_id);

/* The data address of the node named @p name, or NULL (as above); its id
 * through @p node_id_p (may be NULL; 0 when the directory has none). */
const char *kvf_mesh_node_by_name(const kvf_mesh_t *mesh, const char *name,
                                  uint32_t *node_id_p);

/* Records node @p node_id (named @p name, NULL or "" when unknown) at
 * @p address; the oldest entry makes room. Addresses too long are not
 * kept. */
void kvf_mesh_node_store(kvf_mesh_t *mesh, uint32_t node_id, const char *name,
                         const char *address);

/* Forgets node @p node_id (0: none) and the node named @p name (NULL:
 * none), e.g. after a failed send: the next use asks the controller. */
void kvf_mesh_node_forget(kvf_mesh_t *mesh, uint32_t node_id, const char *name);

#endif /* KVF_AGENT_MESH_H */
