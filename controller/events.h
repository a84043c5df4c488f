/* SPDX-License-Identifier: Apache-2.0 */
/* Copyright (c) 2026 The kvfabric authors */
/*
 * The KV event stream (docs/integration-routers.md, "KV events"): what
 * agents admit, evict and lose, published in vLLM's KV-events shape
 * (vllm/distributed/kv_events.py) so a router that consumes vLLM's events
 * consumes the controller's:
 *
 *   PUB     [topic = node name, seq (u64 big-endian), msgpack batch]
 *           batch {"ts": float, "events": [event], "data_parallel_rank":
 *           node id}; event {"type": "BlockStored" | "BlockRemoved" |
 *           "AllBlocksCleared", ...}
 *   ROUTER  replay: a request [start_seq (u64 big-endian)] is answered by
 *           every kept batch from start_seq on, [seq, payload] each, then
 *           [-1 (i64 big-endian), ""].
 *
 * One stream per controller: seq counts every batch, whatever its node.
 * Payloads are built in a reused buffer and kept in a ring of
 * events_buffer batches for replay (buffers grow, never shrink).
 *
 * thread: owning loop only (libzmq's own I/O thread does the sending).
 */
#ifndef KVF_CONTROLLER_EVENTS_H
#define KVF_CONTROLLER_EVENTS_H

#include <kvfabric/status.h>

#include <stddef.h>
#include <stdint.h>

struct event_base;
typedef struct kvf_events kvf_events_t;

typedef enum {
    KVF_EVENTS_STORED = 0,
    KVF_EVENTS_REMOVED,
    KVF_EVENTS_CLEARED,
} kvf_events_kind_t;

/* Binds the PUB socket to @p endpoint (a ZeroMQ endpoint) and, when
 * @p replay is not empty, the ROUTER socket; keeps @p buffer batches. */
kvf_status_t kvf_events_create(struct event_base *base, const char *endpoint,
                               const char *replay, uint32_t buffer,
                               kvf_events_t **events_p);

/* NULL is a no-op. */
void kvf_events_destroy(kvf_events_t *events);

/*
 * Publishes one batch of one event for node @p node_id (@p node_name is
 * the topic): @p n packed keys (KVF_KEY_WIRE_SIZE each; none for
 * CLEARED), as 16-byte digests, with @p block_size tokens per block (0
 * when unknown). A batch the PUB socket cannot take now is dropped (and
 * kept for replay), as vLLM's publisher does at its high-water mark.
 */
void kvf_events_publish(kvf_events_t *events, kvf_events_kind_t kind,
                        uint32_t node_id, const char *node_name,
                        const uint8_t *keys, size_t n, uint32_t block_size);

/* Serves replay requests the ROUTER socket's edge-triggered fd may not
 * have signalled (called from the controller's tick). */
void kvf_events_poll(kvf_events_t *events);

/* Batches published so far (the next seq); 0 for NULL. */
uint64_t kvf_events_count(const kvf_events_t *events);

/* Of those, batches the PUB socket refused (high-water mark); 0 for NULL. */
uint64_t kvf_events_dropped(const kvf_events_t *events);

/* The PUB and ROUTER endpoints actually bound (port 0 resolved). */
const char *kvf_events_endpoint(const kvf_events_t *events);
const char *kvf_events_replay_endpoint(const kvf_events_t *events);

#endif /* KVF_CONTROLLER_EVENTS_H */
