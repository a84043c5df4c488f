/* SPDX-License-Identifier: Apache-2.0 */
/* Copyright (c) 2026 The kvfabric authors */
#include "agent/http.h"

#include "agent/config.h"
#include "common/evjson.h"
#include "common/log.h"
#include "common/prom.h"

#include <event2/buffer.h>
#include <event2/http.h>

#include <arpa/inet.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

struct kvf_agent_http {
    struct evhttp *evh;
    kvf_agent_http_source_t src;
    uint16_t port;
};

static void kvf_agent_http_reply(struct evhttp_request *req, int code,
                                 const char *type, struct evbuffer *body)
{
    evhttp_add_header(evhttp_request_get_output_headers(req), "Content-Type",
                      type);
    evhttp_send_reply(req, code, (code == 200) ? "OK" : "Error", body);
}

static void kvf_agent_on_healthz(struct evhttp_request *req, void *arg)
{
    kvf_agent_http_t *http = arg;
    struct evbuffer *body  = evbuffer_new();
    bool registered        = kvf_ctl_client_is_registered(http->src.ctl);
    kvf_agent_http_state_t st;

    if (body == NULL) {
        evhttp_send_error(req, 500, "out of memory");
        return;
    }
    http->src.state(http->src.arg, &st);
    /* 503 until registered: a load balancer or a readiness probe must not
     * send engines to an agent whose chunks nobody can find */
    evbuffer_add_printf(
        body,
        "{\"status\":\"%s\",\"name\":\"%s\",\"role\":\"%s\","
        "\"registered\":%s,\"node_id\":%u,\"draining\":%s",
        st.is_stopping ? "stopping" : (registered ? "ok" : "unregistered"),
        http->src.name, kvf_agent_role_name(http->src.role),
        registered ? "true" : "false", kvf_ctl_client_node_id(http->src.ctl),
        st.is_draining ? "true" : "false");
    if (!registered) {
        evbuffer_add_printf(body, ",\"problem\":");
        kvf_evjson_add_str(body, kvf_ctl_client_problem(http->src.ctl));
    }
    evbuffer_add(body, "}\n", 2);
    kvf_agent_http_reply(req, (registered && !st.is_stopping) ? 200 : 503,
                         "application/json", body);
    evbuffer_free(body);
}

/* A latency counted with kvf_peer_lat_record: @p counts has one bucket
 * more than the bounds (over the last one). */
static void kvf_agent_metrics_latency(struct evbuffer *body, const char *name,
                                      const char *help, const uint64_t *counts,
                                      uint64_t sum_us)
{
    kvf_prom_hist_t h = {.bounds_us = kvf_peer_lat_bounds_us,
                         .counts    = counts,
                         .n         = KVF_PEER_LAT_BUCKETS,
                         .sum_s     = (double)sum_us / 1e6};
    unsigned b;

    for (b = 0; b <= KVF_PEER_LAT_BUCKETS; b++) {
        h.count += counts[b];
    }
    kvf_prom_histogram(body, name, help, &h);
}

static void kvf_agent_metrics_pd(kvf_agent_http_t *http, struct evbuffer *body)
{
    kvf_pd_stats_t ps;

    kvf_pd_get_stats(http->src.pd, &ps);
    kvf_agent_metrics_latency(body, "kvf_agent_pd_push_seconds",
                              "time from a push's start to its decoder's "
                              "acknowledgement",
                              ps.lat_counts, ps.lat_sum_us);
    kvf_prom_metric_by(body, "kvf_agent_pd_pushes_total", KVF_PROM_COUNTER,
                       "pushes by result (sender side)", "result", 2,
                       (const char *const[]){"delivered", "failed"},
                       (const uint64_t[]){ps.pushes, ps.push_failures});
    kvf_prom_metric(body, "kvf_agent_pd_pieces_refused_total", KVF_PROM_COUNTER,
                    "pushes refused because this agent does not hold their "
                    "request's earlier pushes (one failed, or it restarted)",
                    ps.pieces_refused);
    kvf_prom_metric_by(body, "kvf_agent_pd_bytes_total", KVF_PROM_COUNTER,
                       "PD bytes by direction", "dir", 2,
                       (const char *const[]){"sent", "received"},
                       (const uint64_t[]){ps.bytes_sent, ps.bytes_received});
    kvf_prom_metric(
        body, "kvf_agent_pd_received_pushes_total", KVF_PROM_COUNTER,
        "pushes received and verified (decoder side)", ps.batches_received);
    kvf_prom_metric(body, "kvf_agent_pd_implied_done_total", KVF_PROM_COUNTER,
                    "received pushes completed when their last chunk landed, "
                    "without PD_DONE",
                    ps.implied_done);
    kvf_prom_metric_by(body, "kvf_agent_pd_acks_total", KVF_PROM_COUNTER,
                       "received pushes acknowledged, and the PD_DONE_REPLY "
                       "messages that carried them (acks to one sender "
                       "coalesced)",
                       "kind", 2, (const char *const[]){"push", "message"},
                       (const uint64_t[]){ps.acks, ps.ack_messages});
    kvf_prom_metric_by(body, "kvf_agent_pd_pieces_total", KVF_PROM_COUNTER,
                       "received pushes that arrived while another push of "
                       "their request was in progress (overlapped), and "
                       "those verified before an earlier piece and held for "
                       "it (reordered)",
                       "kind", 2,
                       (const char *const[]){"overlapped", "reordered"},
                       (const uint64_t[]){ps.overlapped, ps.reordered});
    kvf_prom_metric(body, "kvf_agent_pd_pushes_queued_total", KVF_PROM_COUNTER,
                    "pushes that waited at this sender for an earlier push "
                    "of their request (its decoder had not yet said it takes "
                    "several, or 64 were on their way)",
                    ps.queued);
    kvf_prom_metric(body, "kvf_agent_pd_pushes_parked_total", KVF_PROM_COUNTER,
                    "times a push's data waited for the UCX worker's "
                    "operations to free up (a burst of pushes)",
                    ps.parked);
    kvf_prom_metric(body, "kvf_agent_pd_requests_ready_total", KVF_PROM_COUNTER,
                    "PD requests received complete", ps.requests_ready);
    kvf_prom_metric(body, "kvf_agent_pd_queue_depth", KVF_PROM_GAUGE,
                    "pushes waiting for room in the receive region",
                    ps.queue_depth);
    kvf_prom_metric(body, "kvf_agent_pd_alloc_waits_total", KVF_PROM_COUNTER,
                    "pushes that waited for room", ps.alloc_waits);
    kvf_prom_metric(body, "kvf_agent_pd_alloc_timeouts_total", KVF_PROM_COUNTER,
                    "pushes that found no room within pd_alloc_timeout",
                    ps.alloc_timeouts);
    kvf_prom_metric(body, "kvf_agent_pd_aborts_total", KVF_PROM_COUNTER,
                    "PD requests aborted at this decoder", ps.aborts);
    kvf_prom_metric(body, "kvf_agent_pd_reclaimed_total", KVF_PROM_COUNTER,
                    "received PD requests never claimed, reclaimed after "
                    "pd_claim_timeout",
                    ps.reclaimed);
    kvf_prom_metric(
        body, "kvf_agent_pd_checksum_failures_total", KVF_PROM_COUNTER,
        "pushed chunks refused for a bad checksum", ps.checksum_failures);
    kvf_prom_metric(body, "kvf_agent_pd_quota_refusals_total", KVF_PROM_COUNTER,
                    "pushes refused: their sender held pd_peer_max_bytes of "
                    "the receive region",
                    ps.quota_refusals);
    kvf_prom_metric(body, "kvf_agent_pd_requests", KVF_PROM_GAUGE,
                    "PD requests held now", ps.requests);
    kvf_prom_metric_by(
        body, "kvf_agent_pd_region_bytes", KVF_PROM_GAUGE,
        "PD receive region by state", "state", 2,
        (const char *const[]){"used", "free"},
        (const uint64_t[]){ps.region_used, ps.region_size - ps.region_used});
    kvf_prom_metric_by(body, "kvf_agent_pd_data_messages_total",
                       KVF_PROM_COUNTER,
                       "PD_DATA messages received: one chunk each, or several "
                       "(one rendezvous)",
                       "kind", 2, (const char *const[]){"chunk", "batch"},
                       (const uint64_t[]){ps.data_messages, ps.multi_messages});
    kvf_prom_metric_by(body, "kvf_agent_pd_same_host_total", KVF_PROM_COUNTER,
                       "PD pushes copied into a same-host decoder's receive "
                       "region (sent), and batches received that way",
                       "dir", 2, (const char *const[]){"sent", "received"},
                       (const uint64_t[]){ps.copied_pushes, ps.copied_batches});
    kvf_prom_metric(
        body, "kvf_agent_pd_same_host_bytes_total", KVF_PROM_COUNTER,
        "bytes of PD pushes copied into same-host decoders", ps.copied_bytes);
}

/* Bytes and chunks per peer agent, both directions. */
static void kvf_agent_metrics_links(kvf_agent_http_t *http,
                                    struct evbuffer *body)
{
    static const struct {
        const char *name, *help;
        size_t field;
    } series[] = {
        {"kvf_agent_peer_fetch_bytes_total", "bytes received from each peer",
         offsetof(kvf_peer_link_stats_t, bytes_fetched)},
        {"kvf_agent_peer_fetch_chunks_total", "chunks received from each peer",
         offsetof(kvf_peer_link_stats_t, chunks_fetched)},
        {"kvf_agent_peer_served_bytes_total", "bytes sent to each peer",
         offsetof(kvf_peer_link_stats_t, bytes_served)},
        {"kvf_agent_peer_served_chunks_total", "chunks sent to each peer",
         offsetof(kvf_peer_link_stats_t, chunks_served)},
    };
    const kvf_peer_link_stats_t *links;
    uint32_t num, i;
    size_t s;

    links = kvf_peer_get_links(http->src.peer, &num);
    for (s = 0; s < sizeof(series) / sizeof(series[0]); s++) {
        kvf_prom_family(body, series[s].name, KVF_PROM_COUNTER, series[s].help);
        for (i = 0; i < num; i++) {
            uint64_t v;

            memcpy(&v, (const uint8_t *)&links[i] + series[s].field, sizeof(v));
            kvf_prom_sample(body, series[s].name, "peer", links[i].name, v);
        }
    }
}

/* Transport truth (agent/transports.h). */
static void kvf_agent_metrics_transports(kvf_agent_http_t *http,
                                         struct evbuffer *body)
{
    const kvf_transports_t *t = http->src.transports;
    uint32_t i;

    kvf_prom_family(body, "kvf_agent_peer_transport_info", KVF_PROM_GAUGE,
                    "UCX transports/devices each peer's connection really "
                    "uses (1), and whether expect_transports refused it");
    for (i = 0; i < t->num_peers; i++) {
        evbuffer_add_printf(body, "kvf_agent_peer_transport_info{peer=\"");
        kvf_prom_add_escaped(body, t->peers[i].name);
        evbuffer_add_printf(body, "\",transport=\"");
        kvf_prom_add_escaped(body, t->peers[i].transports);
        evbuffer_add_printf(body, "\",refused=\"%s\"} 1\n",
                            t->peers[i].refused ? "true" : "false");
    }
    kvf_prom_metric(body, "kvf_agent_transport_refusals_total",
                    KVF_PROM_COUNTER,
                    "peer requests refused because their connection ran over "
                    "a transport not in expect_transports",
                    t->refused);
}

/* The same-host path (agent/local.h); all zero when it is off. */
static void kvf_agent_metrics_local(kvf_agent_http_t *http,
                                    struct evbuffer *body)
{
    static const char *const chunks[] = {"copied", "missed", "served"};
    static const char *const dirs[]   = {"copied", "served"};
    static const char *const links[]  = {"ok", "refused", "not_local"};
    kvf_local_stats_t ls;

    memset(&ls, 0, sizeof(ls));
    if (http->src.local != NULL) {
        kvf_local_get_stats(http->src.local, &ls);
    }
    kvf_prom_metric_by(
        body, "kvf_agent_same_host_chunks_total", KVF_PROM_COUNTER,
        "chunks moved by memcpy between agents on this host, by result",
        "result", 3, chunks,
        (const uint64_t[]){ls.chunks_copied, ls.chunks_missed,
                           ls.chunks_served});
    kvf_prom_metric_by(
        body, "kvf_agent_same_host_bytes_total", KVF_PROM_COUNTER,
        "bytes moved by memcpy between agents on this host", "dir", 2, dirs,
        (const uint64_t[]){ls.bytes_copied, ls.bytes_served});
    kvf_prom_metric_by(
        body, "kvf_agent_same_host_links_total", KVF_PROM_COUNTER,
        "same-host handshakes, by result (not_local: the holder has no "
        "socket here, UCX used)",
        "result", 3, links,
        (const uint64_t[]){ls.links_ok, ls.links_refused, ls.not_local});
}

/* The data plane: fetches from peers, what peers were served, lookups. */
static void kvf_agent_metrics_peers(kvf_agent_http_t *http,
                                    struct evbuffer *body)
{
    const char *reasons[KVF_MESH_DROP_REASONS];
    kvf_engine_server_stats_t es;
    kvf_ucx_worker_stats_t ws;
    kvf_mesh_stats_t ms;
    kvf_peer_stats_t ps;
    unsigned i;

    kvf_engine_server_get_stats(http->src.engines, &es);
    kvf_peer_get_stats(http->src.peer, &ps);
    kvf_agent_metrics_latency(body, "kvf_agent_fetch_seconds",
                              "time from a fetch's start to its last chunk",
                              ps.lat_counts, ps.lat_sum_us);
    kvf_agent_metrics_links(http, body);
    kvf_agent_metrics_local(http, body);
    kvf_agent_metrics_transports(http, body);
    kvf_prom_metric_by(
        body, "kvf_agent_fetch_messages_total", KVF_PROM_COUNTER,
        "messages that brought fetched chunks: one chunk each, "
        "or several (one rendezvous)",
        "kind", 2, (const char *const[]){"chunk", "batch"},
        (const uint64_t[]){ps.chunk_messages, ps.batch_messages});
    kvf_ucx_worker_stats(http->src.worker, &ws);
    kvf_prom_metric(body, "kvf_agent_am_dropped_total", KVF_PROM_COUNTER,
                    "active messages from peers for ids no service handles "
                    "(unknown, or from a newer version)",
                    ws.am_dropped);
    kvf_prom_metric(body, "kvf_agent_ucx_recv_beyond_pool_total",
                    KVF_PROM_COUNTER,
                    "receives of data peers had sent while the UCX worker's "
                    "operations (ucx_max_ops) were in use (taken, not dropped)",
                    ws.recv_ops_beyond_pool);
    kvf_mesh_get_stats(http->src.mesh, &ms);
    for (i = 0; i < KVF_MESH_DROP_REASONS; i++) {
        reasons[i] = kvf_mesh_drop_name((kvf_mesh_drop_t)i);
    }
    kvf_prom_metric_by(body, "kvf_agent_mesh_dropped_total", KVF_PROM_COUNTER,
                       "messages from peers dropped before use, by reason",
                       "reason", KVF_MESH_DROP_REASONS, reasons, ms.dropped);
    kvf_prom_metric(body, "kvf_agent_mesh_deferred_total", KVF_PROM_COUNTER,
                    "messages to peers (control, served chunks) that "
                    "waited for the UCX worker's operations to free up (a "
                    "burst)",
                    ms.deferred);
    kvf_prom_metric_by(body, "kvf_agent_fetch_chunks_total", KVF_PROM_COUNTER,
                       "chunks asked of peers, by result", "result", 2,
                       (const char *const[]){"fetched", "missed"},
                       (const uint64_t[]){ps.chunks_fetched, ps.chunks_missed});
    kvf_prom_metric(body, "kvf_agent_fetch_bytes_total", KVF_PROM_COUNTER,
                    "bytes received from peers", ps.bytes_fetched);
    kvf_prom_metric_by(
        body, "kvf_agent_serve_refused_total", KVF_PROM_COUNTER,
        "keys peers asked of this agent answered without a chunk: busy "
        "(peer_serve_max sends, a requester's share, or every disk read "
        "for peers in flight; asked again) or missing (not held)",
        "reason", 2, (const char *const[]){"busy", "missing"},
        (const uint64_t[]){ps.serve_busy, ps.serve_misses});
    kvf_prom_metric(body, "kvf_agent_fetch_timeouts_total", KVF_PROM_COUNTER,
                    "fetches that ran past fetch_timeout", ps.timeouts);
    kvf_prom_metric(
        body, "kvf_agent_fetch_checksum_failures_total", KVF_PROM_COUNTER,
        "fetched chunks refused for a bad checksum", ps.checksum_failures);
    kvf_prom_metric(body, "kvf_agent_served_chunks_total", KVF_PROM_COUNTER,
                    "chunks sent to peers", ps.chunks_served);
    kvf_prom_metric(body, "kvf_agent_served_bytes_total", KVF_PROM_COUNTER,
                    "bytes sent to peers", ps.bytes_served);
    kvf_prom_metric_by(
        body, "kvf_agent_lookup_chunks_total", KVF_PROM_COUNTER,
        "chunks engines looked up, by where they are held", "held", 2,
        (const char *const[]){"local", "remote"},
        (const uint64_t[]){es.local_hit_keys, es.remote_hit_keys});
    kvf_prom_metric(body, "kvf_agent_prefetch_leases", KVF_PROM_GAUGE,
                    "hits of prefetching lookups pinned, waiting for their "
                    "retrieve",
                    es.leases);
    kvf_prom_metric_by(body, "kvf_agent_prefetch_leases_total",
                       KVF_PROM_COUNTER, "prefetch leases ended, by how", "end",
                       2, (const char *const[]){"retrieved", "expired"},
                       (const uint64_t[]){es.leases_used, es.lease_expiries});
}

/* The pool and the engine connections. */
static void kvf_agent_metrics_store(kvf_agent_http_t *http,
                                    struct evbuffer *body)
{
    kvf_engine_server_stats_t es;
    kvf_store_stats_t st;

    kvf_store_get_stats(http->src.store, &st);
    kvf_engine_server_get_stats(http->src.engines, &es);
    kvf_prom_metric_by(body, "kvf_agent_pool_bytes", KVF_PROM_GAUGE,
                       "pool bytes by state", "state", 2,
                       (const char *const[]){"used", "free"},
                       (const uint64_t[]){st.pool.used, st.pool.free});
    kvf_prom_metric(body, "kvf_agent_pool_entries", KVF_PROM_GAUGE,
                    "chunks held (committed or granted)", st.pool.entries);
    kvf_prom_metric(body, "kvf_agent_pool_kept_bytes", KVF_PROM_GAUGE,
                    "evicted blocks kept until their write-behind lands "
                    "(part of used; at most a quarter of the pool)",
                    st.pool.retired_bytes);
    kvf_prom_metric(body, "kvf_agent_pool_detached_chunks", KVF_PROM_GAUGE,
                    "chunks dropped as damaged whose block an engine or a "
                    "transfer still reads (freed when it lets go)",
                    st.pool.detached);
    kvf_prom_metric(body, "kvf_agent_commits_total", KVF_PROM_COUNTER,
                    "chunks committed by engines", st.commits);
    kvf_prom_metric(body, "kvf_agent_evictions_total", KVF_PROM_COUNTER,
                    "chunks evicted for room", st.pool.evictions);
    kvf_prom_metric_by(body, "kvf_agent_retrieve_chunks_total",
                       KVF_PROM_COUNTER,
                       "chunks asked for by engines, by result", "result", 2,
                       (const char *const[]){"local_hit", "miss"},
                       (const uint64_t[]){st.hits, st.misses});
    kvf_prom_metric(body, "kvf_agent_expired_grants_total", KVF_PROM_COUNTER,
                    "allocations taken back uncommitted after grant_timeout",
                    st.expired_grants);
    kvf_prom_metric(body, "kvf_agent_checksum_failures_total", KVF_PROM_COUNTER,
                    "chunks whose bytes did not match their checksum",
                    st.checksum_failures);
    kvf_prom_metric(body, "kvf_agent_engine_connections", KVF_PROM_GAUGE,
                    "engine connections open", es.active);
    kvf_prom_metric(
        body, "kvf_agent_engine_protocol_errors_total", KVF_PROM_COUNTER,
        "engine connections closed for bad frames", es.protocol_errors);
    kvf_prom_metric(body, "kvf_agent_auth_failures_total", KVF_PROM_COUNTER,
                    "engine connections refused by the cluster-secret "
                    "handshake",
                    es.auth_failures);
    kvf_prom_metric(body, "kvf_agent_engine_staging_full_total",
                    KVF_PROM_COUNTER,
                    "allocations and PD claims refused: the engine's staging "
                    "area was full",
                    es.staging_full);
    kvf_prom_metric(body, "kvf_agent_pd_claim_checksum_failures_total",
                    KVF_PROM_COUNTER,
                    "PD claims refused: a chunk changed in the receive region "
                    "after it was verified",
                    es.claim_checksum_failures);
}

/* The controller link and the agent's own figures. */
static void kvf_agent_metrics_ctl(kvf_agent_http_t *http, struct evbuffer *body)
{
    kvf_ctl_client_stats_t st;
    kvf_agent_http_state_t as;

    kvf_ctl_client_get_stats(http->src.ctl, &st);
    http->src.state(http->src.arg, &as);
    kvf_prom_metric(body, "kvf_agent_controller_registered", KVF_PROM_GAUGE,
                    "1 while registered with the controller",
                    kvf_ctl_client_is_registered(http->src.ctl) ? 1 : 0);
    kvf_prom_metric(body, "kvf_agent_controller_connects_total",
                    KVF_PROM_COUNTER, "TCP connections made to the controller",
                    st.connects);
    kvf_prom_metric(body, "kvf_agent_registrations_total", KVF_PROM_COUNTER,
                    "successful registrations", st.registrations);
    kvf_prom_metric(body, "kvf_agent_heartbeats_total", KVF_PROM_COUNTER,
                    "heartbeats sent", st.heartbeats);
    kvf_prom_metric(body, "kvf_agent_admitted_keys_total", KVF_PROM_COUNTER,
                    "keys announced in ADMIT", st.admitted_keys);
    kvf_prom_metric(body, "kvf_agent_evicted_keys_total", KVF_PROM_COUNTER,
                    "keys announced in EVICT", st.evicted_keys);
    kvf_prom_metric(body, "kvf_agent_controller_errors_total", KVF_PROM_COUNTER,
                    "failed controller requests and bad frames", st.errors);
    kvf_prom_metric_by(
        body, "kvf_agent_replicate_chunks_total", KVF_PROM_COUNTER,
        "chunks of REPLICATE commands (kvfctl replicate) by "
        "outcome; asked minus the others are in flight",
        "result", 3, (const char *const[]){"asked", "fetched", "missed"},
        (const uint64_t[]){as.replicate_asked, as.replicate_fetched,
                           as.replicate_missed});
    kvf_prom_metric(body, "kvf_agent_draining", KVF_PROM_GAUGE,
                    "1 while the node is drained (kvfctl drain)",
                    as.is_draining ? 1 : 0);
}

/* Both tiers side by side (issue #20), then the disk tier's own series. */
static void kvf_agent_metrics_tiers(kvf_agent_http_t *http,
                                    struct evbuffer *body)
{
    kvf_peer_stats_t ps = {0};
    kvf_store_stats_t st;

    kvf_store_get_stats(http->src.store, &st);
    if (http->src.peer != NULL) {
        kvf_peer_get_stats(http->src.peer, &ps);
    }
    kvf_disk_print_tier_metrics(http->src.disk, st.pool.entries, st.pool.used,
                                ps.served_from_disk, body);
    kvf_disk_print_metrics(http->src.disk, body);
    if (http->src.disk != NULL) {
        kvf_prom_metric_by(
            body, "kvf_agent_disk_promotions_total", KVF_PROM_COUNTER,
            "chunks read back from disk into the pool (an engine's retrieve "
            "or prefetch, a peer's fetch), by outcome",
            "result", 2, (const char *const[]){"promoted", "failed"},
            (const uint64_t[]){st.promoted, st.promote_failures});
        kvf_prom_metric(body, "kvf_agent_disk_promotion_waits_total",
                        KVF_PROM_COUNTER,
                        "read-backs that waited for the tier's read queue "
                        "(4 x disk_queue_depth taken at once)",
                        st.promote_waits);
    }
}

static void kvf_agent_on_metrics(struct evhttp_request *req, void *arg)
{
    kvf_agent_http_t *http = arg;
    struct evbuffer *body  = evbuffer_new();

    if (body == NULL) {
        evhttp_send_error(req, 500, "out of memory");
        return;
    }
    kvf_agent_metrics_peers(http, body);
    kvf_agent_metrics_store(http, body);
    kvf_agent_metrics_pd(http, body);
    kvf_agent_metrics_tiers(http, body);
    kvf_agent_metrics_ctl(http, body);
    kvf_agent_http_reply(req, 200, KVF_PROM_CONTENT_TYPE, body);
    evbuffer_free(body);
}

static void kvf_agent_inventory_json_key(void *arg, const kvf_key_t *key)
{
    struct evbuffer *body = arg;
    char buf[KVF_KEY_STR_SIZE];

    /* the separator is written before every key; the first one is
     * dropped by the caller */
    evbuffer_add_printf(body, ",\"%s\"", kvf_key_format(key, buf));
}

typedef struct kvf_agent_inventory_disk {
    kvf_store_t *store;
    struct evbuffer *keys;
    uint64_t count;
} kvf_agent_inventory_disk_t;

/* A chunk on disk that is not in the pool too (those are listed once,
 * with the pool's). */
static void kvf_agent_inventory_disk_key(void *arg, const kvf_key_t *key)
{
    kvf_agent_inventory_disk_t *d = arg;

    if (kvf_store_local_prefix(d->store, key, 1) == 0) {
        kvf_agent_inventory_json_key(d->keys, key);
        d->count++;
    }
}

/* GET /v1/inventory: what this agent really holds (the soft state the
 * controller's registry must converge to: the pool's chunks, then those
 * only on its disk tier) and what it still has lent out (grants, pinned
 * chunks, owners), for fault tests and operators. */
static void kvf_agent_on_inventory_http(struct evhttp_request *req, void *arg)
{
    kvf_agent_http_t *http          = arg;
    struct evbuffer *body           = evbuffer_new();
    struct evbuffer *keys           = evbuffer_new();
    kvf_agent_inventory_disk_t disk = {http->src.store, evbuffer_new(), 0};
    kvf_store_stats_t st;

    if ((body == NULL) || (keys == NULL) || (disk.keys == NULL)) {
        evhttp_send_error(req, 500, "out of memory");
        goto out;
    }
    kvf_store_get_stats(http->src.store, &st);
    kvf_store_foreach_key(http->src.store, kvf_agent_inventory_json_key, keys);
    if (evbuffer_get_length(keys) > 0) {
        evbuffer_drain(keys, 1); /* the first key's separator */
    }
    if (http->src.disk != NULL) {
        kvf_disk_foreach_key(http->src.disk, kvf_agent_inventory_disk_key,
                             &disk);
    }
    if (evbuffer_get_length(disk.keys) > 0) {
        evbuffer_drain(disk.keys, 1);
    }
    evbuffer_add_printf(
        body,
        "{\"name\":\"%s\",\"node_id\":%u,\"chunks\":%" PRIu64
        ",\"grants\":%" PRIu64 ",\"pinned\":%" PRIu64 ",\"owners\":%" PRIu64
        ",\"disk_chunks\":%" PRIu64 ",\"keys\":[",
        http->src.name, kvf_ctl_client_node_id(http->src.ctl), st.pool.entries,
        st.pool.allocated, st.pool.pinned, st.owners, disk.count);
    evbuffer_add_buffer(body, keys);
    evbuffer_add_printf(body, "],\"disk_keys\":[");
    evbuffer_add_buffer(body, disk.keys);
    evbuffer_add_printf(body, "]}\n");
    kvf_agent_http_reply(req, 200, "application/json", body);
out:
    if (disk.keys != NULL) {
        evbuffer_free(disk.keys);
    }
    if (keys != NULL) {
        evbuffer_free(keys);
    }
    if (body != NULL) {
        evbuffer_free(body);
    }
}

kvf_status_t kvf_agent_http_create(const char *addr, struct event_base *base,
                                   const kvf_agent_http_source_t *src,
                                   kvf_agent_http_t **http_p)
{
    struct evhttp_bound_socket *sock;
    struct sockaddr_storage ss;
    socklen_t len = sizeof(ss);
    kvf_agent_http_t *http;
    kvf_status_t status;
    char host[256];
    uint16_t port;

    *http_p = NULL;
    if (addr[0] == '\0') {
        return KVF_OK;
    }
    if (kvf_config_parse_hostport(addr, host, sizeof(host), &port) != KVF_OK) {
        kvf_error("http address '%s' is not HOST:PORT", addr);
        return KVF_ERR_CONFIG;
    }
    http = calloc(1, sizeof(*http));
    if (http == NULL) {
        return KVF_ERR_NO_MEMORY;
    }
    http->src = *src;
    http->evh = evhttp_new(base);
    if (http->evh == NULL) {
        status = KVF_ERR_NO_MEMORY;
        goto err_free;
    }
    evhttp_set_allowed_methods(http->evh, EVHTTP_REQ_GET);
    evhttp_set_cb(http->evh, "/healthz", kvf_agent_on_healthz, http);
    evhttp_set_cb(http->evh, "/metrics", kvf_agent_on_metrics, http);
    evhttp_set_cb(http->evh, "/v1/inventory", kvf_agent_on_inventory_http,
                  http);
    sock = evhttp_bind_socket_with_handle(http->evh, host, port);
    if (sock == NULL) {
        kvf_error("http: cannot listen on %s: %m", addr);
        status = KVF_ERR_IO;
        goto err_free;
    }
    memset(&ss, 0, sizeof(ss));
    if (getsockname(evhttp_bound_socket_get_fd(sock), (struct sockaddr *)&ss,
                    &len) == 0) {
        http->port = ntohs((ss.ss_family == AF_INET6)
                               ? ((struct sockaddr_in6 *)&ss)->sin6_port
                               : ((struct sockaddr_in *)&ss)->sin_port);
    }
    kvf_info("agent %s: http listening on %s:%u", src->name, host, http->port);
    *http_p = http;
    return KVF_OK;

err_free:
    kvf_agent_http_destroy(http);
    return status;
}

void kvf_agent_http_destroy(kvf_agent_http_t *http)
{
    if (http == NULL) {
        return;
    }
    if (http->evh != NULL) {
        evhttp_free(http->evh);
    }
    free(http);
}

uint16_t kvf_agent_http_bound_port(const kvf_agent_http_t *http)
{
    return (http != NULL) ? http->port : 0;
}
