/* SPDX-License-Identifier: Apache-2.0 */
/* Copyright (c) 2026 The kvfabric authors */
/*
 * The same-host path (docs/architecture.md "Agents on one host"): agents
 * on one host copy chunks from each other's pools with memcpy instead of
 * moving them over UCX loopback.
 *
 * Every agent listens on a local Unix socket (SOCK_SEQPACKET, in the
 * abstract namespace, named after its data address). A requester that
 * needs chunks from a holder first dials that socket; when nobody answers
 * there (another host, another network namespace) the fetch goes over UCX
 * as before. Otherwise the two prove, once per pair:
 *   - the same kernel: both send /proc/sys/kernel/random/boot_id and
 *     refuse a different one;
 *   - the same user: each checks the other's SO_PEERCRED uid is its own;
 *   - membership: with a cluster secret, the mutual HMAC challenge of
 *     common/auth.h, names binding each side's node id and the boot id.
 * Then the holder passes a READ-ONLY descriptor of its pool (the memfd
 * reopened O_RDONLY through /proc/self/fd) with SCM_RIGHTS and the
 * requester maps it PROT_READ, once.
 *
 * A fetch is then a lease: LEASE(keys) -> the holder holds each chunk
 * (kvf_store_hold_chunk: not evicted, not reused) and answers offset,
 * length and checksum; the requester copies each into a slot of its own
 * pool, commits it (the commit verifies the checksum, as for UCX) and
 * sends RELEASE. A holder that dies mid-copy leaves the mapping valid (a
 * miss or a verified hit, never a crash); bytes changed under the copy
 * fail the checksum: a miss.
 *
 * thread: owning loop only. The copies run on the loop.
 */
#ifndef KVF_AGENT_LOCAL_H
#define KVF_AGENT_LOCAL_H

#include "agent/store.h"
#include "common/auth.h"

#include <kvfabric/keys.h>
#include <kvfabric/status.h>

#include <stdbool.h>
#include <stdint.h>

struct event_base;

typedef struct kvf_local kvf_local_t;

/* What became of one key of a fetch. */
typedef struct kvf_local_result {
    uint64_t bytes;      /* copied and verified; 0: a miss */
    kvf_status_t status; /* KVF_OK; KVF_ERR_CHECKSUM (told to the holder,
                            which re-verifies); other: a miss */
} kvf_local_result_t;

/*
 * Per key of a fetch, in the order asked. With @p status
 * KVF_ERR_UNSUPPORTED the holder is not usable locally: nothing was
 * copied, fetch those keys over UCX. @p holder_name: as the holder said
 * it ("" when unknown), borrowed for the call.
 */
typedef void (*kvf_local_cb_t)(void *arg, kvf_status_t status,
                               const kvf_local_result_t *res, uint32_t num,
                               const char *holder_name);

/* The holder side leased @p bytes to node @p node_id named @p name (for
 * per-peer traffic counters). */
typedef void (*kvf_local_served_cb_t)(void *arg, uint32_t node_id,
                                      const char *name, uint64_t chunks,
                                      uint64_t bytes);

typedef struct kvf_local_params {
    struct event_base *base;
    kvf_store_t *store;
    const kvf_auth_secret_t *secret; /* borrowed; NULL/empty: same uid only */
    const char *data_address;        /* this agent's UCX address (names the
                                        socket) */
    uint32_t (*node_id)(void *arg);  /* this node's id (0: not registered) */
    void *node_id_arg;
    kvf_local_served_cb_t served; /* may be NULL */
    void *served_arg;
    uint64_t timeout_ns; /* a handshake or a lease; 0: 5 s */
    bool wants_region;   /* this agent pushes PD requests: ask holders for
                            their PD receive region (kvf_local_region) */
    const char *name;    /* for logs */
} kvf_local_params_t;

typedef struct kvf_local_stats {
    uint64_t links_ok;      /* holders mapped (same host proved) */
    uint64_t links_refused; /* handshakes refused, either side */
    uint64_t not_local;     /* fetches from holders on no local socket */
    uint64_t chunks_copied; /* fetched by memcpy, verified */
    uint64_t bytes_copied;
    uint64_t chunks_missed;     /* leased but not copied: gone, no room,
                                   checksum, holder died */
    uint64_t checksum_failures; /* copied chunks refused */
    uint64_t chunks_served;     /* leased to same-host requesters */
    uint64_t bytes_served;
} kvf_local_stats_t;

/* Listens on the local socket. KVF_ERR_IO (logged). */
kvf_status_t kvf_local_create(const kvf_local_params_t *params,
                              kvf_local_t **local_p);

/* Fails every pending fetch (callbacks not called), releases every lease,
 * unmaps the holders' pools. NULL is a no-op. */
void kvf_local_destroy(kvf_local_t *local);

/*
 * Copies the chunks of @p keys (at most 65536) from holder node
 * @p holder_id at @p data_address into @p owner's grants and commits
 * them. KVF_ERR_UNSUPPORTED at once when that holder is not on this host
 * (or not known to be yet and its socket refuses): cb not called, use UCX.
 * KVF_OK: @p cb runs exactly once, never from inside this call, by the
 * timeout at the latest. @p owner must outlive the callback.
 */
kvf_status_t kvf_local_fetch(kvf_local_t *local, uint32_t holder_id,
                             const char *data_address, const kvf_key_t *keys,
                             uint32_t num, kvf_store_owner_t *owner,
                             kvf_local_cb_t cb, void *arg);

/*
 * PD on one host (docs/architecture.md "Agents on one host"): the decoder
 * @p node_id's PD receive region, mapped writable, for a push to copy its
 * chunks straight into the slots PD_ALLOC_REPLY named (the decoder still
 * verifies every chunk at PD_DONE). KVF_ERR_UNSUPPORTED while there is no
 * such mapping: not on this host, not proved yet (the handshake starts
 * here, so a later push finds it), no host region there, or this agent
 * does not push (params.wants_region).
 */
kvf_status_t kvf_local_region(kvf_local_t *local, uint32_t node_id,
                              const char *data_address, uint8_t **base_p,
                              uint64_t *len_p);

/* Told once whether the link to a same-host node came up with its PD
 * receive region writable (@p ready). */
typedef void (*kvf_local_link_cb_t)(void *arg, bool ready);

/*
 * As kvf_local_region, for a push about to start: KVF_OK when the
 * decoder's region is mapped now (kvf_local_region finds it);
 * KVF_INPROGRESS while the link to it is being proved: @p cb runs once
 * when it is up or down (possibly inside another call of this module:
 * defer real work to the loop), unless kvf_local_cancel(@p arg) comes
 * first; KVF_ERR_UNSUPPORTED when there is no such path (use UCX).
 */
kvf_status_t kvf_local_region_when(kvf_local_t *local, uint32_t node_id,
                                   const char *data_address,
                                   kvf_local_link_cb_t cb, void *arg);

/* The waits begun with @p arg stop (it goes over UCX after all): they
 * are not called back, and later pushes to those nodes do not wait for
 * their links either (they are used once up). */
void kvf_local_region_give_up(kvf_local_t *local, const void *arg);

/* Did this agent pass its PD receive region to same-host node @p node_id
 * (0: to any), over a link still up? */
bool kvf_local_region_granted(const kvf_local_t *local, uint32_t node_id);

/* Forgets the callbacks of fetches started, and of waits for a link
 * begun (kvf_local_region_when), with @p arg. */
void kvf_local_cancel(kvf_local_t *local, const void *arg);

void kvf_local_get_stats(const kvf_local_t *local, kvf_local_stats_t *stats_p);

#endif /* KVF_AGENT_LOCAL_H */
