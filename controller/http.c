/* SPDX-License-Identifier: Apache-2.0 */
/* Copyright (c) 2026 The kvfabric authors */
#include "controller/server_int.h"
#include "controller/dashboard.h"
#include "controller/index.h"
#include "common/evjson.h"
#include "common/log.h"
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
#include <string.h>
#include <strings.h>

void kvf_server_http_reply(struct evhttp_request *req, struct evbuffer *b,
                           const char *type)
{
    evhttp_add_header(evhttp_request_get_output_headers(req), "Content-Type",
                      type);
    evhttp_send_reply(req, HTTP_OK, "OK", b);
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

bool kvf_server_http_begin(kvf_server_t *server, struct evhttp_request *req,
                           const char *path, int methods)
{
    const char *auth;

    if ((evhttp_request_get_command(req) & methods) == 0) {
        evhttp_send_error(req, 405, "Method Not Allowed");
        return false;
    }
    if ((server->http_token[0] == '\0') ||
        kvf_http_path_is_open(server->cfg->http_open, path)) {
        return true;
    }
    auth = evhttp_find_header(evhttp_request_get_input_headers(req),
                              "Authorization");
    if ((auth != NULL) && (strncasecmp(auth, "Bearer ", 7) == 0)) {
        auth += 7;
        auth += strspn(auth, " ");
        if ((strlen(auth) == KVF_AUTH_HTTP_TOKEN_LEN) &&
            (CRYPTO_memcmp(auth, server->http_token, KVF_AUTH_HTTP_TOKEN_LEN) ==
             0)) {
            return true;
        }
    }
    server->ctr.http_auth_failures++;
    kvf_debug("http %s: %s bearer token", path,
              (auth == NULL) ? "no" : "wrong");
    evhttp_add_header(evhttp_request_get_output_headers(req),
                      "WWW-Authenticate", "Bearer realm=\"kvfabric\"");
    evhttp_send_error(req, 401, "Unauthorized");
    return false;
}

static void kvf_http_on_healthz(struct evhttp_request *req, void *arg)
{
    struct evbuffer *b;

    if (!kvf_server_http_begin(arg, req, "/healthz", EVHTTP_REQ_GET)) {
        return;
    }
    b = evbuffer_new();

    if (b == NULL) {
        evhttp_send_error(req, HTTP_INTERNAL, NULL);
        return;
    }
    if (((kvf_server_t *)arg)->election != NULL) {
        kvf_replica_health(arg, b); /* HA: role, term, warm */
        kvf_server_http_reply(req, b, "application/json");
        evbuffer_free(b);
        return;
    }
    evbuffer_add_printf(b, "ok\n");
    kvf_server_http_reply(req, b, "text/plain");
    evbuffer_free(b);
}

/* The node's entries and heartbeat counters: clients such as the dashboard
 * turn successive samples into rates. */
static void kvf_http_node_traffic(struct evbuffer *b, const kvf_node_t *node)
{
    const kvf_node_traffic_t *t = &node->traffic;

    evbuffer_add_printf(
        b,
        ",\"entries\":%" PRIu64 ",\"lookup_chunks\":%" PRIu64
        ",\"lookup_local_chunks\":%" PRIu64 ",\"lookup_remote_chunks\":%" PRIu64
        ",\"fetched_chunks\":%" PRIu64 ",\"fetched_bytes\":%" PRIu64
        ",\"served_chunks\":%" PRIu64 ",\"served_bytes\":%" PRIu64,
        node->entries, t->lookup_chunks, t->lookup_local_chunks,
        t->lookup_remote_chunks, t->fetched_chunks, t->fetched_bytes,
        t->served_chunks, t->served_bytes);
}

static void kvf_http_on_nodes(struct evhttp_request *req, void *arg)
{
    kvf_server_t *server = arg;
    size_t i, n = kvf_node_table_count(server->nodes);
    uint64_t now = kvf_time_now_ms();
    struct evbuffer *b;

    if (!kvf_server_http_begin(server, req, "/v1/nodes", EVHTTP_REQ_GET)) {
        return;
    }
    b = evbuffer_new();
    if (b == NULL) {
        evhttp_send_error(req, HTTP_INTERNAL, NULL);
        return;
    }
    evbuffer_add_printf(b, "{\"nodes\":[");
    for (i = 0; i < n; i++) {
        kvf_node_t *node = kvf_node_table_at(server->nodes, i);

        evbuffer_add_printf(
            b, "%s{\"id\":%" PRIu32 ",\"name\":", (i > 0) ? "," : "", node->id);
        kvf_evjson_add_str(b, node->name);
        evbuffer_add_printf(
            b,
            ",\"state\":\"%s\",\"role\":\"%s\","
            "\"incarnation\":%" PRIu64 ",\"keys\":%" PRIu64
            ",\"pool_capacity\":%" PRIu64 ",\"pool_used\":%" PRIu64
            ",\"pd_capacity\":%" PRIu64 ",\"pd_used\":%" PRIu64
            ",\"last_heartbeat_ms_ago\":%" PRIu64 ",\"control_address\":",
            kvf_node_state_name(node->state), kvf_msg_role_name(node->role),
            node->incarnation, kvf_registry_slot_keys(server->reg, node->slot),
            node->pool_capacity, node->pool_used, node->pd_capacity,
            node->pd_used, now - node->last_heartbeat_ms);
        kvf_evjson_add_str(b, node->control_address);
        evbuffer_add_printf(b, ",\"data_address\":");
        kvf_evjson_add_str(b, node->data_address);
        evbuffer_add_printf(b, ",\"instance_id\":");
        kvf_evjson_add_str(b, node->instance_id);
        evbuffer_add_printf(b, ",\"tp_rank\":%" PRIu32 ",\"tp_world\":%" PRIu32,
                            node->tp_rank, node->tp_world);
        kvf_http_node_traffic(b, node);
        evbuffer_add(b, "}", 1);
    }
    evbuffer_add_printf(b, "]}\n");
    kvf_server_http_reply(req, b, "application/json");
    evbuffer_free(b);
}

static void kvf_http_on_stats(struct evhttp_request *req, void *arg)
{
    kvf_server_t *server = arg;
    struct evbuffer *b;
    Kvf__StatsReply rep;
    char json[2048];

    if (!kvf_server_http_begin(server, req, "/v1/stats", EVHTTP_REQ_GET)) {
        return;
    }
    b = evbuffer_new();
    if (b == NULL) {
        evhttp_send_error(req, HTTP_INTERNAL, NULL);
        return;
    }
    /* the same fields as kvfctl stats: both print StatsReply */
    kvf__stats_reply__init(&rep);
    kvf_server_stats_fill(server, &rep);
    kvf_msg_scalars_json(&rep.base, json, sizeof(json));
    evbuffer_add_printf(b, "{%s}\n", json);
    kvf_server_http_reply(req, b, "application/json");
    evbuffer_free(b);
}

static void kvf_http_on_metrics(struct evhttp_request *req, void *arg)
{
    kvf_server_t *server           = arg;
    const kvf_server_counters_t *c = &server->ctr;
    kvf_registry_stats_t rs;
    uint32_t alive, draining, dead;
    uint64_t cum = 0;
    unsigned i;
    struct evbuffer *b;

    if (!kvf_server_http_begin(server, req, "/metrics", EVHTTP_REQ_GET)) {
        return;
    }
    b = evbuffer_new();
    if (b == NULL) {
        evhttp_send_error(req, HTTP_INTERNAL, NULL);
        return;
    }
    kvf_registry_stats(server->reg, &rs);
    kvf_node_table_census(server->nodes, &alive, &draining, &dead);
    evbuffer_add_printf(b,
                        "# TYPE kvf_controller_leader_term gauge\n"
                        "kvf_controller_leader_term %" PRIu64 "\n",
                        server->term);
    evbuffer_add_printf(
        b,
        "# TYPE kvf_controller_nodes gauge\n"
        "kvf_controller_nodes{state=\"alive\"} %" PRIu32 "\n"
        "kvf_controller_nodes{state=\"draining\"} %" PRIu32 "\n"
        "kvf_controller_nodes{state=\"dead\"} %" PRIu32 "\n"
        "# TYPE kvf_controller_keys gauge\n"
        "kvf_controller_keys %" PRIu64 "\n"
        "# TYPE kvf_controller_recovering gauge\n"
        "kvf_controller_recovering %d\n"
        "# TYPE kvf_controller_admits_total counter\n"
        "kvf_controller_admits_total %" PRIu64 "\n"
        "# TYPE kvf_controller_evicts_total counter\n"
        "kvf_controller_evicts_total %" PRIu64 "\n"
        "# TYPE kvf_controller_lookups_total counter\n"
        "kvf_controller_lookups_total %" PRIu64 "\n"
        "# TYPE kvf_controller_lookup_chunks_total counter\n"
        "kvf_controller_lookup_chunks_total{result=\"hit\"} %" PRIu64 "\n"
        "kvf_controller_lookup_chunks_total{result=\"miss\"} %" PRIu64 "\n"
        "# TYPE kvf_controller_purge_backlog gauge\n"
        "kvf_controller_purge_backlog %" PRIu64 "\n"
        "# TYPE kvf_controller_protocol_errors_total counter\n"
        "kvf_controller_protocol_errors_total %" PRIu64 "\n"
        "# TYPE kvf_controller_auth_failures_total counter\n"
        "kvf_controller_auth_failures_total %" PRIu64 "\n"
        "# TYPE kvf_controller_tls_failures_total counter\n"
        "kvf_controller_tls_failures_total %" PRIu64 "\n"
        "# TYPE kvf_controller_handshake_timeouts_total counter\n"
        "kvf_controller_handshake_timeouts_total %" PRIu64 "\n"
        "# TYPE kvf_controller_stale_rejects_total counter\n"
        "kvf_controller_stale_rejects_total %" PRIu64 "\n"
        "# TYPE kvf_controller_seq_gaps_total counter\n"
        "kvf_controller_seq_gaps_total %" PRIu64 "\n"
        "# TYPE kvf_controller_backpressure_total counter\n"
        "kvf_controller_backpressure_total %" PRIu64 "\n"
        "# TYPE kvf_controller_connections gauge\n"
        "kvf_controller_connections %" PRIu64 "\n"
        "# TYPE kvf_controller_table_bytes gauge\n"
        "kvf_controller_table_bytes %" PRIu64 "\n"
        "# TYPE kvf_controller_buffered_bytes gauge\n"
        "kvf_controller_buffered_bytes{peer=\"any\"} %" PRIu64 "\n"
        "kvf_controller_buffered_bytes{peer=\"unauthenticated\"} %" PRIu64 "\n"
        "# TYPE kvf_controller_buffer_closes_total counter\n"
        "kvf_controller_buffer_closes_total %" PRIu64 "\n"
        "# TYPE kvf_controller_accept_errors_total counter\n"
        "kvf_controller_accept_errors_total{port=\"control\"} %" PRIu64 "\n"
        "kvf_controller_accept_errors_total{port=\"http\"} %" PRIu64 "\n"
        "# TYPE kvf_controller_http_auth_failures_total counter\n"
        "kvf_controller_http_auth_failures_total %" PRIu64 "\n"
        "# TYPE kvf_controller_kv_events_total counter\n"
        "kvf_controller_kv_events_total{result=\"published\"} %" PRIu64 "\n"
        "kvf_controller_kv_events_total{result=\"dropped\"} %" PRIu64 "\n"
        "# TYPE kvf_controller_request_seconds histogram\n",
        alive, draining, dead, rs.keys, kvf_server_recovering(server) ? 1 : 0,
        c->admits, c->evicts, c->lookups, c->lookup_hit_chunks,
        c->lookup_miss_chunks, rs.purge_backlog, c->protocol_errors,
        c->auth_failures, c->tls_failures, c->handshake_timeouts,
        c->stale_rejects, c->seq_gaps, c->backpressure, server->num_conns,
        rs.table_bytes, server->buffered, server->buffered_preauth,
        c->buffer_closes, server->listen_guard.errors,
        server->http_guard.errors, c->http_auth_failures,
        kvf_events_count(server->events) - kvf_events_dropped(server->events),
        kvf_events_dropped(server->events));
    for (i = 0; i < KVF_SERVER_LAT_BUCKETS; i++) {
        cum += c->lat_buckets[i];
        evbuffer_add_printf(b,
                            "kvf_controller_request_seconds_bucket{le=\"%g\"} "
                            "%" PRIu64 "\n",
                            kvf_server_lat_bounds_us[i] / 1e6, cum);
    }
    evbuffer_add_printf(b,
                        "kvf_controller_request_seconds_bucket{le=\"+Inf\"} "
                        "%" PRIu64 "\n"
                        "kvf_controller_request_seconds_sum %.9f\n"
                        "kvf_controller_request_seconds_count %" PRIu64 "\n",
                        c->requests, (double)c->lat_sum_ns / 1e9, c->requests);
    evbuffer_add_printf(
        b, "# TYPE kvf_controller_index_request_seconds histogram\n");
    for (i = 0, cum = 0; i < KVF_SERVER_LAT_BUCKETS; i++) {
        cum += c->index_buckets[i];
        evbuffer_add_printf(b,
                            "kvf_controller_index_request_seconds_bucket{le="
                            "\"%g\"} %" PRIu64 "\n",
                            kvf_server_lat_bounds_us[i] / 1e6, cum);
    }
    evbuffer_add_printf(
        b,
        "kvf_controller_index_request_seconds_bucket{le=\"+Inf\"} %" PRIu64 "\n"
        "kvf_controller_index_request_seconds_sum %.9f\n"
        "kvf_controller_index_request_seconds_count %" PRIu64 "\n",
        c->index_requests, (double)c->index_sum_ns / 1e9, c->index_requests);
    kvf_replica_metrics(server, b);
    kvf_server_http_reply(req, b, "text/plain; version=0.0.4");
    evbuffer_free(b);
}

kvf_status_t kvf_server_http_start(kvf_server_t *server)
{
    const char *addr = server->cfg->http;
    struct evhttp_bound_socket *sock;
    struct sockaddr_storage ss;
    socklen_t len = sizeof(ss);
    char host[256], what[320];
    uint16_t port;

    if ((addr == NULL) || (addr[0] == '\0')) {
        snprintf(server->http_addr, sizeof(server->http_addr), "-");
        return KVF_OK;
    }
    if (kvf_config_parse_hostport(addr, host, sizeof(host), &port) != KVF_OK) {
        kvf_error("http: bad address '%s' (want HOST:PORT)", addr);
        return KVF_ERR_CONFIG;
    }
    server->http = evhttp_new(server->base);
    if (server->http == NULL) {
        return KVF_ERR_NO_MEMORY;
    }
    sock = evhttp_bind_socket_with_handle(server->http, host, port);
    if (sock == NULL) {
        kvf_error("http %s: cannot bind: %m", addr);
        return KVF_ERR_IO;
    }
    getsockname(evhttp_bound_socket_get_fd(sock), (struct sockaddr *)&ss, &len);
    /* sin_port and sin6_port share their offset; IPv6 hosts in brackets */
    snprintf(server->http_addr, sizeof(server->http_addr),
             (strchr(host, ':') != NULL) ? "[%s]:%u" : "%s:%u", host,
             ntohs(((struct sockaddr_in *)&ss)->sin_port));
    snprintf(what, sizeof(what), "http port %s", server->http_addr);
    if (kvf_listen_guard_init(&server->http_guard, server->base,
                              evhttp_bound_socket_get_listener(sock),
                              what) != KVF_OK) {
        return KVF_ERR_NO_MEMORY;
    }
    if (kvf_auth_secret_is_set(&server->secret)) {
        if (kvf_auth_http_token(&server->secret, server->http_token) !=
            KVF_OK) {
            return KVF_ERR_IO;
        }
    } else if (!kvf_auth_host_is_loopback(server->http_addr)) {
        kvf_warn("http %s is not a loopback address and no "
                 "cluster_secret_file is configured: /v1/nodes lists every "
                 "node's addresses to anyone who can connect "
                 "(docs/security.md)",
                 server->http_addr);
    }
    /* requests are small; slow or oversized ones must not hold memory */
    evhttp_set_max_headers_size(server->http, 16 << 10);
    evhttp_set_max_body_size(server->http, 1 << 20);
    evhttp_set_timeout(server->http, 10);
    evhttp_set_allowed_methods(server->http, EVHTTP_REQ_GET | EVHTTP_REQ_POST);
    evhttp_set_cb(server->http, "/", kvf_dashboard_serve, server);
    evhttp_set_cb(server->http, "/dashboard", kvf_dashboard_serve, server);
    evhttp_set_cb(server->http, "/healthz", kvf_http_on_healthz, server);
    evhttp_set_cb(server->http, "/v1/nodes", kvf_http_on_nodes, server);
    evhttp_set_cb(server->http, "/v1/stats", kvf_http_on_stats, server);
    evhttp_set_cb(server->http, "/metrics", kvf_http_on_metrics, server);
    kvf_index_http_start(server);
    kvf_info("http listening on %s%s", server->http_addr,
             (server->http_token[0] != '\0') ? " (bearer token required)" : "");
    return KVF_OK;
}

void kvf_server_http_stop(kvf_server_t *server)
{
    kvf_listen_guard_cleanup(&server->http_guard);
    if (server->http != NULL) {
        evhttp_free(server->http);
        server->http = NULL;
    }
}
