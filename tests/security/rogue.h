/* SPDX-License-Identifier: Apache-2.0 */
/* Copyright (c) 2026 The kvfabric authors */
/*
 * A rogue peer for the attack tests: a UCX endpoint to an agent's peer
 * service built from the project's own transport library, with no cluster
 * secret anywhere. It sends whatever active messages a test asks for, ids
 * the project never registered included, and waits (with a deadline) until
 * UCX is done with each.
 *
 * thread: the test's own, one rogue at a time.
 */
#ifndef KVF_TESTS_SECURITY_ROGUE_H
#define KVF_TESTS_SECURITY_ROGUE_H

#include "tests/helpers/proc.h"
#include "tests/integration/controller_harness.h"

#include <kvfabric/kvfabric.h>

#include <kvfabric/status.h>

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct kvf_rogue kvf_rogue_t;

/* Connects (TCP) to the agent peer service at "HOST:PORT"; asserts. */
kvf_rogue_t *kvf_rogue_create(const char *address);

void kvf_rogue_destroy(kvf_rogue_t *rogue);

/*
 * Sends active message @p id (any 16-bit value) with @p header and
 * @p data, eager or (@p is_rndv) rendezvous, and waits up to 5 s for UCX
 * to complete it. Returns what the send completed with; a rendezvous
 * message the victim dropped may complete with an error.
 */
kvf_status_t kvf_rogue_send(kvf_rogue_t *rogue, uint16_t id, const void *header,
                            size_t header_len, const void *data, size_t len,
                            bool is_rndv);

/* From now on, rendezvous messages to the rogue are kept, never received
 * (their senders' sends stay in flight) until the rogue is destroyed. */
void kvf_rogue_hold_rndv(kvf_rogue_t *rogue);

/* Messages the rogue received with id @p id (1..63) so far. */
unsigned kvf_rogue_received(const kvf_rogue_t *rogue, uint16_t id);

/* The eager payload of the @p nth (0-based) message received on @p id,
 * its length in *len_p; NULL when there is none (rendezvous payloads and
 * ones over 64 KiB are not kept). */
const void *kvf_rogue_message(const kvf_rogue_t *rogue, uint16_t id,
                              unsigned nth, size_t *len_p);

/* Progresses the rogue's worker for @p ms milliseconds. */
void kvf_rogue_progress(kvf_rogue_t *rogue, int ms);

/* A real kvf-agent under attack (TCP on loopback, its UCX port known). */
typedef struct kvf_sec_agent {
    kvf_test_proc_t proc;
    char name[32];
    char sock[128];
    char data[64]; /* UCX peer service HOST:PORT */
    uint16_t http;
} kvf_sec_agent_t;

/* Starts kvf-agent @p name against the controller at @p ctl_addr with
 * @p extra arguments (NULL-terminated, may be NULL) and waits until it
 * registered; asserts. */
void kvf_sec_agent_start(kvf_sec_agent_t *agent, const char *ctl_addr,
                         const char *name, const char *const *extra);

/* The value of metric line @p series ("name" or "name{labels}") in the
 * agent's /metrics; -1 when absent. */
long long kvf_sec_metric(const kvf_sec_agent_t *agent, const char *series);

/* The set-up most attacks share: a controller and two agents, A (the
 * holder) and B (the victim), with or without a cluster secret. */
typedef struct kvf_sec_cluster {
    kvf_th_ctl_t ctl;
    kvf_sec_agent_t a, b;
    char dir[64];     /* temporary folder of the secret and the YAML */
    char secret[128]; /* the secret file; "" without a secret */
    char yaml[128];   /* --config FILE that sets it ("" without) */
} kvf_sec_cluster_t;

/* Starts the cluster: agents named @p name_a and @p name_b, all three
 * processes given the secret when @p with_secret. Asserts. */
void kvf_sec_cluster_start(kvf_sec_cluster_t *cluster, const char *name_a,
                           const char *name_b, bool with_secret);

/* Stops the agents and the controller and removes the folder. */
void kvf_sec_cluster_stop(kvf_sec_cluster_t *cluster);

/* An engine connection to @p agent (with the cluster's secret when it has
 * one), 20 s per call. Asserts. */
kvf_client_t *kvf_sec_connect(const kvf_sec_cluster_t *cluster,
                              const kvf_sec_agent_t *agent);

/* Stores @p n chunks of @p chunk bytes under @p keys through @p agent,
 * byte i of chunk k being @p fill(k, i). Asserts. */
void kvf_sec_store(const kvf_sec_cluster_t *cluster,
                   const kvf_sec_agent_t *agent, const kvf_key_t *keys,
                   uint32_t n, size_t chunk,
                   uint8_t (*fill)(uint32_t k, size_t i));

#endif /* KVF_TESTS_SECURITY_ROGUE_H */
