/* SPDX-License-Identifier: Apache-2.0 */
/* Copyright (c) 2026 The kvfabric authors */
/*
 * The KV index cache-aware routers query on the controller's HTTP port
 * (docs/integration-routers.md):
 *
 *   POST /v1/index/models  register a model namespace by name (the fields
 *                          engines fingerprint, kvf_namespace_fingerprint)
 *   GET  /v1/index/models  list them
 *   POST /v1/index/query   per instance and node, the longest cached prefix
 *                          of a prompt: by token ids (chained keys computed
 *                          as engines do, kvf_key_chain) or chunk digests
 *   POST /v1/route         the instance to send a prompt to: longest cached
 *                          prefix, then least pool use
 *
 * Request bodies are parsed in place into scratch sized at start (no
 * allocation per query). Registered models live in memory only: a
 * restarted controller forgets them (routers register again, as they do
 * with Mooncake's conductor).
 *
 * thread: owning loop only.
 */
#ifndef KVF_CONTROLLER_INDEX_H
#define KVF_CONTROLLER_INDEX_H

#include <kvfabric/status.h>

#include <stdint.h>

typedef struct kvf_http kvf_http_t;
typedef struct kvf_node_table kvf_node_table_t;
typedef struct kvf_registry kvf_registry_t;
typedef struct kvf_server_latency kvf_server_latency_t;
typedef struct kvf_index kvf_index_t;

#define KVF_INDEX_MAX_MODELS 64
#define KVF_INDEX_MAX_TP     64
#define KVF_INDEX_MAX_TOKENS (1u << 17) /* token ids in one query */

/* Scratch for queries of up to KVF_INDEX_MAX_TOKENS tokens or
 * @p max_keys chunks. */
kvf_status_t kvf_index_create(uint32_t max_keys, kvf_index_t **index_p);

/* NULL is a no-op. */
void kvf_index_destroy(kvf_index_t *index);

/* Tokens per block of the registered model one of whose TP ranks has
 * namespace @p ns; 0 when none has. */
uint32_t kvf_index_block_size(const kvf_index_t *index, uint64_t ns);

/* Serves /v1/index/ and /v1/route on @p http from @p nodes and @p reg
 * (borrowed: they outlive the index). */
void kvf_index_http_start(kvf_index_t *index, kvf_http_t *http,
                          kvf_node_table_t *nodes, kvf_registry_t *reg);

/* The latency of the queries and routes answered so far. */
const kvf_server_latency_t *kvf_index_latency(const kvf_index_t *index);

#endif /* KVF_CONTROLLER_INDEX_H */
