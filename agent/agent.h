/* SPDX-License-Identifier: Apache-2.0 */
/* Copyright (c) 2026 The kvfabric authors */
/*
 * The kvf-agent process object: owns the pool, the engine server, the peer
 * service, PD mode, the controller client and the HTTP endpoint (/healthz,
 * /metrics) on one libevent loop.
 *
 * thread: owning loop only.
 */
#ifndef KVF_AGENT_AGENT_H
#define KVF_AGENT_AGENT_H

#include "agent/config.h"

#include <kvfabric/status.h>

#include <stdint.h>

struct event_base;

typedef struct kvf_agent kvf_agent_t;

/* Starts every part of the agent on @p base. @p config must outlive the
 * agent. Logs the reason of a failure. */
kvf_status_t kvf_agent_create(const kvf_agent_config_t *config,
                              struct event_base *base, kvf_agent_t **agent_p);

/* Begins a clean shutdown: deregister, drain, then break the loop. */
void kvf_agent_stop(kvf_agent_t *agent);

/* Frees everything; NULL is a no-op. */
void kvf_agent_destroy(kvf_agent_t *agent);

/* Port of the HTTP endpoint (useful when configured as port 0), 0 if off. */
uint16_t kvf_agent_http_port(const kvf_agent_t *agent);

#endif /* KVF_AGENT_AGENT_H */
