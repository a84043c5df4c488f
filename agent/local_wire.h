/* SPDX-License-Identifier: Apache-2.0 */
/* Copyright (c) 2026 The kvfabric authors */
/*
 * The messages of the same-host socket (agent/local.c has the sequence).
 * SOCK_SEQPACKET between processes of one host and one build: fixed
 * structs in host order, every size checked on receipt. Shared with the
 * tests that play a peer.
 */
#ifndef KVF_AGENT_LOCAL_WIRE_H
#define KVF_AGENT_LOCAL_WIRE_H

#include "common/auth.h"

#include <kvfabric/status.h>

#include <stddef.h>
#include <stdint.h>

#define KVF_LOCAL_MAGIC       0x314c564bu /* "KVL1" */
#define KVF_LOCAL_LEASE_KEYS  64u         /* keys in one LEASE */
#define KVF_LOCAL_LEASES      64u         /* held leases per connection */
#define KVF_LOCAL_WINDOW      2u          /* LEASEs in flight per fetch */
#define KVF_LOCAL_MAX_KEYS    65536u
#define KVF_LOCAL_BOOT_ID_LEN 40u
#define KVF_LOCAL_RETRY_NS    (10 * KVF_NSEC_PER_SEC) /* after "not local" */
/* a link not proved by then is dropped (a stalled or hostile peer) */
#define KVF_LOCAL_HANDSHAKE_NS (2 * KVF_NSEC_PER_SEC)
#define KVF_LOCAL_MSG_MAX      2048u
/* page tables filled per madvise by a link's populate thread (a stop
 * waits for at most one: a few ms) */
#define KVF_LOCAL_POPULATE_SLICE (64ull << 20)

typedef enum {
    KVF_LOCAL_MSG_HELLO = 1,
    KVF_LOCAL_MSG_HELLO_REPLY,
    KVF_LOCAL_MSG_AUTH,
    KVF_LOCAL_MSG_READY,
    KVF_LOCAL_MSG_LEASE,
    KVF_LOCAL_MSG_LEASE_REPLY,
    KVF_LOCAL_MSG_RELEASE,
    KVF_LOCAL_MSG_BAD,
} kvf_local_msg_t;

#define KVF_LOCAL_NAME_MAX 64u

typedef struct kvf_local_hdr {
    uint32_t magic;
    uint16_t type;
    uint16_t count;  /* keys (LEASE, LEASE_REPLY) */
    uint64_t ticket; /* LEASE*: the fetch; READY: pool bytes */
    uint32_t first;  /* LEASE*: index of the first key in the fetch */
    int32_t status;  /* HELLO_REPLY: KVF_OK or why refused */
} kvf_local_hdr_t;

typedef struct kvf_local_hello {
    kvf_local_hdr_t h;
    uint32_t node_id;
    uint32_t nonce_len;
    uint32_t mac_len;
    uint32_t flags; /* AUTH: KVF_LOCAL_WANT_REGION */
    char boot_id[KVF_LOCAL_BOOT_ID_LEN];
    uint8_t nonce[KVF_AUTH_NONCE_SIZE];
    uint8_t mac[KVF_AUTH_MAC_SIZE];
    char name[KVF_LOCAL_NAME_MAX]; /* the sender's node name, for counters */
} kvf_local_hello_t;

/* AUTH flag: the requester pushes PD requests and asks for the holder's
 * PD receive region (writable) with READY. */
#define KVF_LOCAL_WANT_REGION 1u

/* READY: SCM_RIGHTS carries the read-only pool, then (region_bytes > 0)
 * the PD receive region's own memfd, read-write. */
typedef struct kvf_local_ready {
    kvf_local_hdr_t h; /* h.ticket: pool bytes */
    uint64_t region_bytes;
} kvf_local_ready_t;

/* One message as read from the socket: room for the largest, seen as a
 * header or a HELLO. */
typedef union kvf_local_in {
    kvf_local_hdr_t h;
    kvf_local_hello_t hello;
    kvf_local_ready_t ready;
    uint8_t buf[KVF_LOCAL_MSG_MAX];
} kvf_local_in_t;

typedef struct kvf_local_lease_ent {
    uint64_t offset;
    uint64_t length;
    uint64_t checksum;
    int32_t status;
    uint32_t pad;
} kvf_local_lease_ent_t;

/* Sends one message with @p nfds (at most 2) descriptors of @p fds
 * (SCM_RIGHTS), without blocking. KVF_ERR_IO. */
kvf_status_t kvf_local_send_fds(int fd, const void *buf, size_t len,
                                const int *fds, unsigned nfds);

#endif /* KVF_AGENT_LOCAL_WIRE_H */
