/* SPDX-License-Identifier: Apache-2.0 */
/* Copyright (c) 2026 The kvfabric authors */
#include "controller/http.h"

#include "controller/dashboard.h"
#include "common/evjson.h"
#include "common/listen.h"
#include "common/log.h"
#include "common/prom.h"
#include "common/time.h"
#include "proto/frame.h"

#include <event2/buffer.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>

#include <openssl/crypto.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

struct kvf_http {
    struct evhttp *evh; /* NULL: HTTP off */
    const char *open;   /* cfg->http_open */
    kvf_http_source_t src;
    kvf_listen_guard_t guard;
    uint64_t auth_failures;                /* requests without the token */
    char token[2 * KVF_AUTH_MAC_SIZE + 1]; /* "": no token needed */
    char addr[300];
};

void kvf_http_reply(struct evhttp_request *req, struct evbuffer *b,
                    const char *type)
{
    evhttp_add_header(evhttp_request_get_output_headers(req), "Content-Type",
                      type);
    evhttp_send_reply(req, HTTP_OK, "OK", b);
}

struct evbuffer *kvf_http_body(struct evhttp_request *req)
{
    struct evbuffer *b = evbuffer_new();

    if (b == NULL) {
        evhttp_send_error(req, HTTP_INTERNAL, NULL);
    }
    return b;
}

struct evbuffer *kvf_http_begin_body(kvf_http_t *http,
                                     struct evhttp_request *req,
                                     const char *path, int methods)
{
    if (!kvf_http_begin(http, req, path, methods)) {
        return NULL;
    }
    return kvf_http_body(req);
}

/* Is @p path one of cfg->http_open's comma-separated paths? */
static bool kvf_http_path_is_open(const char *list, const char *path)
{
    size_t len = strlen(path);

    while ((list != NULL) && (*list != '\0')) {
        size_t n = strcspn(list, ",");

        if ((n == len) && (strncmp(list, path, n) == 0)) {
            return true;
        }
        list += n;
        list += (*list == ',') ? 1 : 0;
    }
    return false;
}

bool kvf_http_begin(kvf_http_t *http, struct evhttp_request *req,
                    const char *path, int methods)
{
    const char *auth;

    if ((evhttp_request_get_command(req) & methods) == 0) {
        evhttp_send_error(req, 405, "Method Not Allowed");
        return false;
    }
    if ((http->token[0] == '\0') || kvf_http_path_is_open(http->open, path)) {
        return true;
    }
    auth = evhttp_find_header(evhttp_request_get_input_headers(req),
                              "Authorization");
    if ((auth != NULL) && (strncasecmp(auth, "Bearer ", 7) == 0)) {
        auth += 7;
        auth += strspn(auth, " ");
        if ((strlen(auth) == KVF_AUTH_HTTP_TOKEN_LEN) &&
            (CRYPTO_memcmp(auth, http->token, KVF_AUTH_HTTP_TOKEN_LEN) == 0)) {
            return true;
        }
    }
    http->auth_failures++;
    kvf_debug("http %s: %s bearer token", path,
              (auth == NULL) ? "no" : "wrong");
    evhttp_add_header(evhttp_request_get_output_headers(req),
                      "WWW-Authenticate", "Bearer realm=\"kvfabric\"");
    evhttp_send_error(req, 401, "Unauthorized");
    return false;
}

static void kvf_http_on_healthz(struct evhttp_request *req, void *arg)
{
    kvf_http_t *http = arg;
    struct evbuffer *b;

    b = kvf_http_begin_body(http, req, "/healthz", EVHTTP_REQ_GET);
    if (b == NULL) {
        return;
    }
    if ((http->src.health != NULL) && http->src.health(http->src.arg, b)) {
        kvf_http_reply(req, b, "application/json"); /* HA: role, term, warm */
        evbuffer_free(b);
        return;
    }
    evbuffer_add_printf(b, "ok\n");
    kvf_http_reply(req, b, "text/plain");
    evbuffer_free(b);
}

/* The node's entries and heartbeat counters: clients such as the dashboard
 * turn successive samples into rates. */
static void kvf_http_node_traffic(struct evbuffer *b, const kvf_node_t *node)
{
    const kvf_traffic_t *t = &node->traffic;

    evbuffer_add_printf(
        b,
        ",\"entries\":%" PRIu64 ",\"lookup_chunks\":%" PRIu64
        ",\"lookup_local_chunks\":%" PRIu64 ",\"lookup_remote_chunks\":%" PRIu64
        ",\"fetched_chunks\":%" PRIu64 ",\"fetched_bytes\":%" PRIu64
        ",\"served_chunks\":%" PRIu64 ",\"served_bytes\":%" PRIu64,
        node->entries, t->lookup_chunks, t->lookup_local_chunks,
        t->lookup_remote_chunks, t->fetched_chunks, t->fetched_bytes,
        t->served_chunks, t->served_bytes);
    evbuffer_add_printf(b,
                        ",\"served_from_disk_chunks\":%" PRIu64
                        ",\"disk_capacity\":%" PRIu64 ",\"disk_used\":%" PRIu64
                        ",\"disk_chunks\":%" PRIu64,
                        t->served_from_disk_chunks, node->disk_capacity,
                        node->disk_used, node->disk_chunks);
}

/* Both tiers of the cluster (issue #20): holdings per medium from the
 * registry, bytes per medium from the live nodes' heartbeats. */
static void kvf_http_tier_metrics(struct evbuffer *b, const kvf_http_t *http,
                                  const kvf_registry_stats_t *rs)
{
    static const char *const media[] = {"host", "disk"};
    size_t i, n = kvf_node_table_count(http->src.nodes);
    uint64_t holdings = 0, used[2] = {0, 0}, cap[2] = {0, 0};

    for (i = 0; i < n; i++) {
        const kvf_node_t *node = kvf_node_table_at(http->src.nodes, i);

        holdings += kvf_registry_slot_keys(http->src.reg, node->slot);
        if (node->state == KVF_NODE_DEAD) {
            continue;
        }
        used[0] += node->pool_used;
        cap[0] += node->pool_capacity;
        used[1] += node->disk_used;
        cap[1] += node->disk_capacity;
    }
    kvf_prom_metric_by(
        b, "kvf_controller_holdings", KVF_PROM_GAUGE,
        "(key, node) pairs by the medium the node keeps the key on", "medium",
        2, media,
        (const uint64_t[]){holdings - rs->disk_holdings, rs->disk_holdings});
    kvf_prom_metric_by(b, "kvf_controller_tier_used_bytes", KVF_PROM_GAUGE,
                       "bytes of chunks held by live nodes, per tier", "medium",
                       2, media, used);
    kvf_prom_metric_by(b, "kvf_controller_tier_capacity_bytes", KVF_PROM_GAUGE,
                       "capacity of live nodes, per tier", "medium", 2, media,
                       cap);
}

static void kvf_http_on_nodes(struct evhttp_request *req, void *arg)
{
    kvf_http_t *http = arg;
    size_t i, n = kvf_node_table_count(http->src.nodes);
    uint64_t now = kvf_time_now_ms();
    struct evbuffer *b;

    b = kvf_http_begin_body(http, req, "/v1/nodes", EVHTTP_REQ_GET);
    if (b == NULL) {
        return;
    }
    evbuffer_add_printf(b, "{\"nodes\":[");
    for (i = 0; i < n; i++) {
        kvf_node_t *node = kvf_node_table_at(http->src.nodes, i);

        evbuffer_add_printf(
            b, "%s{\"id\":%" PRIu32 ",\"name\":", (i > 0) ? "," : "", node->id);
        kvf_evjson_add_str(b, node->name);
        evbuffer_add_printf(
            b,
            ",\"state\":\"%s\",\"role\":\"%s\","
            "\"incarnation\":%" PRIu64 ",\"keys\":%" PRIu64
            ",\"keys_disk\":%" PRIu64 ",\"pool_capacity\":%" PRIu64
            ",\"pool_used\":%" PRIu64 ",\"pd_capacity\":%" PRIu64
            ",\"pd_used\":%" PRIu64 ",\"last_heartbeat_ms_ago\":%" PRIu64
            ",\"control_address\":",
            kvf_node_state_name(node->state), kvf_msg_role_name(node->role),
            node->incarnation,
            kvf_registry_slot_keys(http->src.reg, node->slot),
            kvf_registry_slot_disk_keys(http->src.reg, node->slot),
            node->pool_capacity, node->pool_used, node->pd_capacity,
            node->pd_used, now - node->last_heartbeat_ms);
        kvf_evjson_add_str(b, node->control_address);
        evbuffer_add_printf(b, ",\"data_address\":");
        kvf_evjson_add_str(b, node->data_address);
        evbuffer_add_printf(b, ",\"instance_id\":");
        kvf_evjson_add_str(b, node->instance_id);
        evbuffer_add_printf(b, ",\"tp_rank\":%" PRIu32 ",\"tp_world\":%" PRIu32,
                            node->tp_rank, node->tp_world);
        evbuffer_add_printf(b, ",\"transports\":");
        kvf_evjson_add_str(b, node->transports);
        kvf_http_node_traffic(b, node);
        evbuffer_add(b, "}", 1);
    }
    evbuffer_add_printf(b, "]}\n");
    kvf_http_reply(req, b, "application/json");
    evbuffer_free(b);
}

static void kvf_http_on_stats(struct evhttp_request *req, void *arg)
{
    kvf_http_t *http = arg;
    struct evbuffer *b;
    kvf_server_stats_t st;
    char json[2048];

    b = kvf_http_begin_body(http, req, "/v1/stats", EVHTTP_REQ_GET);
    if (b == NULL) {
        return;
    }
    /* the same fields as kvfctl stats: both print StatsReply */
    memset(&st, 0, sizeof(st));
    http->src.snapshot(http->src.arg, &st);
    kvf_msg_scalars_json(&st.reply.base, json, sizeof(json));
    evbuffer_add_printf(b, "{%s}\n", json);
    kvf_http_reply(req, b, "application/json");
    evbuffer_free(b);
}

static void kvf_http_latency(struct evbuffer *b, const char *name,
                             const char *help, const kvf_server_latency_t *l)
{
    kvf_prom_hist_t h = {.bounds_us = kvf_server_lat_bounds_us,
                         .counts    = l->buckets,
                         .n         = KVF_SERVER_LAT_BUCKETS,
                         .count     = l->count,
                         .sum_s     = (double)l->sum_ns / 1e9};

    kvf_prom_histogram(b, name, help, &h);
}

static void kvf_http_on_metrics(struct evhttp_request *req, void *arg)
{
    static const char *const states[]  = {"alive", "draining", "dead"};
    static const char *const results[] = {"hit", "miss"};
    static const char *const peers[]   = {"any", "unauthenticated"};
    static const char *const ports[]   = {"control", "http"};
    static const char *const events[]  = {"published", "dropped"};
    kvf_http_t *http                   = arg;
    kvf_server_stats_t st;
    const kvf_server_counters_t *c = &st.ctr;
    struct evbuffer *b;

    b = kvf_http_begin_body(http, req, "/metrics", EVHTTP_REQ_GET);
    if (b == NULL) {
        return;
    }
    memset(&st, 0, sizeof(st));
    http->src.snapshot(http->src.arg, &st);
    kvf_http_tier_metrics(b, http, &st.reg);
    kvf_prom_metric(b, "kvf_controller_leader_term", KVF_PROM_GAUGE,
                    "the etcd election's term (0 without --etcd)", st.term);
    kvf_prom_metric_by(
        b, "kvf_controller_nodes", KVF_PROM_GAUGE, "registered nodes by state",
        "state", 3, states,
        (const uint64_t[]){st.nodes_alive, st.nodes_draining, st.nodes_dead});
    kvf_prom_metric(b, "kvf_controller_keys", KVF_PROM_GAUGE,
                    "distinct keys held anywhere", st.reg.keys);
    kvf_prom_metric(b, "kvf_controller_recovering", KVF_PROM_GAUGE,
                    "1 while nodes resync after a restart",
                    st.is_recovering ? 1 : 0);
    kvf_prom_metric(b, "kvf_controller_admits_total", KVF_PROM_COUNTER,
                    "keys admitted by nodes", c->admits);
    kvf_prom_metric(b, "kvf_controller_evicts_total", KVF_PROM_COUNTER,
                    "keys evicted by nodes", c->evicts);
    kvf_prom_metric(b, "kvf_controller_lookups_total", KVF_PROM_COUNTER,
                    "LOOKUP requests answered", c->lookups);
    kvf_prom_metric_by(
        b, "kvf_controller_lookup_chunks_total", KVF_PROM_COUNTER,
        "chunks looked up, by result", "result", 2, results,
        (const uint64_t[]){c->lookup_hit_chunks, c->lookup_miss_chunks});
    kvf_prom_metric(b, "kvf_controller_purge_backlog", KVF_PROM_GAUGE,
                    "registry entries of dead nodes left to purge",
                    st.reg.purge_backlog);
    kvf_prom_metric(b, "kvf_controller_protocol_errors_total", KVF_PROM_COUNTER,
                    "requests refused as malformed", c->protocol_errors);
    kvf_prom_metric(b, "kvf_controller_auth_failures_total", KVF_PROM_COUNTER,
                    "connections refused by the cluster-secret handshake",
                    c->auth_failures);
    kvf_prom_metric(b, "kvf_controller_tls_failures_total", KVF_PROM_COUNTER,
                    "TLS handshakes that failed", c->tls_failures);
    kvf_prom_metric(b, "kvf_controller_handshake_timeouts_total",
                    KVF_PROM_COUNTER,
                    "connections closed before authenticating in time",
                    c->handshake_timeouts);
    kvf_prom_metric(b, "kvf_controller_stale_rejects_total", KVF_PROM_COUNTER,
                    "requests of an old incarnation refused", c->stale_rejects);
    kvf_prom_metric(b, "kvf_controller_seq_gaps_total", KVF_PROM_COUNTER,
                    "gaps in a node's update sequence (resync asked)",
                    c->seq_gaps);
    kvf_prom_metric(b, "kvf_controller_backpressure_total", KVF_PROM_COUNTER,
                    "reading paused: a client not reading its replies",
                    c->backpressure);
    kvf_prom_metric(b, "kvf_controller_connections", KVF_PROM_GAUGE,
                    "control connections open", st.connections);
    kvf_prom_metric(b, "kvf_controller_table_bytes", KVF_PROM_GAUGE,
                    "bytes of the registry's tables", st.reg.table_bytes);
    kvf_prom_metric_by(b, "kvf_controller_buffered_bytes", KVF_PROM_GAUGE,
                       "bytes buffered by connections, by peer", "peer", 2,
                       peers,
                       (const uint64_t[]){st.buffered, st.buffered_preauth});
    kvf_prom_metric(b, "kvf_controller_buffer_closes_total", KVF_PROM_COUNTER,
                    "connections closed over max_buffered(_preauth)",
                    c->buffer_closes);
    kvf_prom_metric_by(
        b, "kvf_controller_accept_errors_total", KVF_PROM_COUNTER,
        "accept() failures, by port", "port", 2, ports,
        (const uint64_t[]){st.accept_errors, http->guard.errors});
    kvf_prom_metric(b, "kvf_controller_http_auth_failures_total",
                    KVF_PROM_COUNTER, "HTTP requests without the bearer token",
                    http->auth_failures);
    kvf_prom_metric_by(
        b, "kvf_controller_kv_events_total", KVF_PROM_COUNTER,
        "KV events, by result", "result", 2, events,
        (const uint64_t[]){st.events_published, st.events_dropped});
    kvf_prom_metric(b, "kvf_controller_node_info_total", KVF_PROM_COUNTER,
                    "NODE_INFO requests (off the fetch path: lookups name "
                    "the holders' addresses)",
                    c->node_infos);
    kvf_http_latency(b, "kvf_controller_request_seconds",
                     "the controller's time per framed request", &c->requests);
    kvf_http_latency(b, "kvf_controller_index_request_seconds",
                     "time per /v1/index/query and /v1/route", &st.index);
    if (http->src.metrics != NULL) {
        http->src.metrics(http->src.arg, b); /* HA */
    }
    kvf_http_reply(req, b, KVF_PROM_CONTENT_TYPE);
    evbuffer_free(b);
}

kvf_status_t kvf_http_create(const kvf_controller_config_t *cfg,
                             struct event_base *base,
                             const kvf_auth_secret_t *secret,
                             const kvf_http_source_t *src, kvf_http_t **http_p)
{
    const char *addr = cfg->http;
    struct evhttp_bound_socket *sock;
    struct sockaddr_storage ss;
    socklen_t len = sizeof(ss);
    char host[256], what[320];
    uint16_t port;
    kvf_http_t *http;
    kvf_status_t status;

    http = calloc(1, sizeof(*http));
    if (http == NULL) {
        return KVF_ERR_NO_MEMORY;
    }
    http->open = cfg->http_open;
    http->src  = *src;
    snprintf(http->addr, sizeof(http->addr), "-");
    if ((addr == NULL) || (addr[0] == '\0')) {
        *http_p = http;
        return KVF_OK;
    }
    if (kvf_config_parse_hostport(addr, host, sizeof(host), &port) != KVF_OK) {
        kvf_error("http: bad address '%s' (want HOST:PORT)", addr);
        status = KVF_ERR_CONFIG;
        goto err_free;
    }
    http->evh = evhttp_new(base);
    if (http->evh == NULL) {
        status = KVF_ERR_NO_MEMORY;
        goto err_free;
    }
    sock = evhttp_bind_socket_with_handle(http->evh, host, port);
    if (sock == NULL) {
        kvf_error("http %s: cannot bind: %m", addr);
        status = KVF_ERR_IO;
        goto err_free;
    }
    getsockname(evhttp_bound_socket_get_fd(sock), (struct sockaddr *)&ss, &len);
    /* sin_port and sin6_port share their offset; IPv6 hosts in brackets */
    snprintf(http->addr, sizeof(http->addr),
             (strchr(host, ':') != NULL) ? "[%s]:%u" : "%s:%u", host,
             ntohs(((struct sockaddr_in *)&ss)->sin_port));
    snprintf(what, sizeof(what), "http port %s", http->addr);
    if (kvf_listen_guard_init(&http->guard, base,
                              evhttp_bound_socket_get_listener(sock),
                              what) != KVF_OK) {
        status = KVF_ERR_NO_MEMORY;
        goto err_free;
    }
    if (kvf_auth_secret_is_set(secret)) {
        if (kvf_auth_http_token(secret, http->token) != KVF_OK) {
            status = KVF_ERR_IO;
            goto err_free;
        }
    } else if (!kvf_auth_host_is_loopback(http->addr)) {
        kvf_warn("http %s is not a loopback address and no "
                 "cluster_secret_file is configured: /v1/nodes lists every "
                 "node's addresses to anyone who can connect "
                 "(docs/security.md)",
                 http->addr);
    }
    /* requests are small; slow or oversized ones must not hold memory */
    evhttp_set_max_headers_size(http->evh, 16 << 10);
    evhttp_set_max_body_size(http->evh, 1 << 20);
    evhttp_set_timeout(http->evh, 10);
    evhttp_set_allowed_methods(http->evh, EVHTTP_REQ_GET | EVHTTP_REQ_POST);
    evhttp_set_cb(http->evh, "/", kvf_dashboard_serve, http);
    evhttp_set_cb(http->evh, "/dashboard", kvf_dashboard_serve, http);
    evhttp_set_cb(http->evh, "/healthz", kvf_http_on_healthz, http);
    evhttp_set_cb(http->evh, "/v1/nodes", kvf_http_on_nodes, http);
    evhttp_set_cb(http->evh, "/v1/stats", kvf_http_on_stats, http);
    evhttp_set_cb(http->evh, "/metrics", kvf_http_on_metrics, http);
    kvf_info("http listening on %s%s", http->addr,
             (http->token[0] != '\0') ? " (bearer token required)" : "");
    *http_p = http;
    return KVF_OK;

err_free:
    kvf_http_destroy(http);
    return status;
}

void kvf_http_destroy(kvf_http_t *http)
{
    if (http == NULL) {
        return;
    }
    kvf_listen_guard_cleanup(&http->guard);
    if (http->evh != NULL) {
        evhttp_free(http->evh);
    }
    free(http);
}

const char *kvf_http_address(const kvf_http_t *http)
{
    return http->addr;
}

void kvf_http_route(kvf_http_t *http, const char *path,
                    void (*cb)(struct evhttp_request *req, void *arg),
                    void *arg)
{
    if (http->evh != NULL) {
        evhttp_set_cb(http->evh, path, cb, arg);
    }
}
