/* SPDX-License-Identifier: Apache-2.0 */
/* Copyright (c) 2026 The kvfabric authors */
/*
 * Finding the controller leader in etcd (kvf-agent --etcd): a thread
 * reads PREFIX/leader (common/etcd.h, endpoints tried in turn) while the
 * agent's controller client asks for it, resolves the published control
 * address and hands it to the loop. It answers once etcd names a leader
 * other than the one last handed over (a new term), so after a lost
 * connection it keeps looking, every poll interval, until the old leader's
 * lease expired and a new one published its address.
 *
 * thread: create/destroy/want and the callback on the owning loop; one
 * internal thread does the (blocking) etcd calls and name resolution.
 */
#ifndef KVF_AGENT_DISCOVER_H
#define KVF_AGENT_DISCOVER_H

#include <kvfabric/status.h>

#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

struct event_base;

typedef struct kvf_discover kvf_discover_t;

/* A leader etcd named: its control address as published and resolved. */
typedef struct kvf_discover_leader {
    char control[256];
    uint64_t term;
    struct sockaddr_storage addr;
    socklen_t addr_len;
} kvf_discover_leader_t;

/* Runs on the loop; @p leader is valid during the call only. */
typedef void (*kvf_discover_cb_t)(void *arg,
                                  const kvf_discover_leader_t *leader);

/* @p urls: etcd endpoints (common/etcd.h), @p prefix: the controllers'
 * --etcd-prefix; each etcd call is bounded by @p timeout_ns, a new look
 * follows @p poll_ns after the last. */
kvf_status_t kvf_discover_create(struct event_base *base, const char *urls,
                                 const char *prefix, uint64_t timeout_ns,
                                 uint64_t poll_ns, kvf_discover_cb_t cb,
                                 void *arg, kvf_discover_t **disc_p);

/* Stops the thread (waits for an etcd call in flight). NULL: no-op. */
void kvf_discover_destroy(kvf_discover_t *disc);

/* Asks for a leader newer than the last one handed over (the first: any);
 * the callback runs once with it. Asking again while looking is a no-op. */
void kvf_discover_want(kvf_discover_t *disc);

/* Stops looking (the client registered with the leader it has). */
void kvf_discover_settle(kvf_discover_t *disc);

/* Why no leader was handed over yet ("" while etcd answers with one). */
void kvf_discover_problem(kvf_discover_t *disc, char *buf, size_t len);

#endif /* KVF_AGENT_DISCOVER_H */
