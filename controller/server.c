/* SPDX-License-Identifier: Apache-2.0 */
/* Copyright (c) 2026 The kvfabric authors */
/* The controller service's lifecycle: create, bind, timers, signals,
 * run and destroy. Connections: conn.c; requests: handlers.c. */
#include "controller/server.h"

#include "controller/conn.h"
#include "controller/handlers.h"
#include "controller/server_int.h"
#include "common/log.h"
#include "common/time.h"
#include "common/tls.h"

#include <event2/event.h>
#include <event2/listener.h>

#include <openssl/ssl.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

static void kvf_server_on_purge(evutil_socket_t fd, short what, void *arg)
{
    kvf_server_t *server = arg;
    struct timeval tv    = {0, 0};

    if (kvf_registry_purge_step(server->reg, server->cfg->purge_slice) > 0) {
        event_add(server->purge, &tv); /* next slice after pending I/O */
    }
}

static void kvf_server_on_tick(evutil_socket_t fd, short what, void *arg)
{
    kvf_server_t *server = arg;

    kvf_conn_expire_handshakes(server);
    if (kvf_node_table_expire(server->nodes, kvf_time_now_ms(),
                              server->cfg->lease_ns / KVF_NSEC_PER_MSEC,
                              server->cfg->forget_dead_ns / KVF_NSEC_PER_MSEC) >
        0) {
        kvf_server_purge_kick(server);
    }
    kvf_server_events_sweep(server);
    kvf_server_recovering(server);
}

static void kvf_server_on_signal(evutil_socket_t sig, short what, void *arg)
{
    kvf_server_t *server = arg;

    kvf_info("signal %d: shutting down", (int)sig);
    event_base_loopexit(server->base, NULL);
}

static kvf_status_t kvf_server_bind(kvf_server_t *server)
{
    struct sockaddr_storage ss;
    struct sockaddr_in *sin   = (struct sockaddr_in *)&ss;
    struct sockaddr_in6 *sin6 = (struct sockaddr_in6 *)&ss;
    socklen_t len             = sizeof(ss);
    bool is_v6;
    char host[256], what[320];
    uint16_t port;

    if (kvf_config_parse_hostport(server->cfg->listen, host, sizeof(host),
                                  &port) != KVF_OK) {
        kvf_error("listen: bad address '%s' (want HOST:PORT, [IPv6]:PORT)",
                  server->cfg->listen);
        return KVF_ERR_CONFIG;
    }
    memset(&ss, 0, sizeof(ss));
    is_v6 = strchr(host, ':') != NULL;
    if (is_v6) {
        sin6->sin6_family = AF_INET6;
        sin6->sin6_port   = htons(port);
    } else {
        sin->sin_family = AF_INET;
        sin->sin_port   = htons(port);
    }
    if (inet_pton(is_v6 ? AF_INET6 : AF_INET, host,
                  is_v6 ? (void *)&sin6->sin6_addr : (void *)&sin->sin_addr) !=
        1) {
        kvf_error("listen: '%s' is not an IP address (IPv6 as [::1]:7400)",
                  host);
        return KVF_ERR_CONFIG;
    }
    server->listener = evconnlistener_new_bind(
        server->base, kvf_conn_on_accept, server,
        LEV_OPT_CLOSE_ON_FREE | LEV_OPT_REUSEABLE, 128, (struct sockaddr *)&ss,
        is_v6 ? sizeof(*sin6) : sizeof(*sin));
    if (server->listener == NULL) {
        kvf_error("listen %s: %m", server->cfg->listen);
        return KVF_ERR_IO;
    }
    getsockname(evconnlistener_get_fd(server->listener), (struct sockaddr *)&ss,
                &len);
    snprintf(server->listen_addr, sizeof(server->listen_addr),
             is_v6 ? "[%s]:%u" : "%s:%u", host,
             ntohs(is_v6 ? sin6->sin6_port : sin->sin_port));
    snprintf(what, sizeof(what), "control port %s", server->listen_addr);
    if (kvf_listen_guard_init(&server->listen_guard, server->base,
                              server->listener, what) != KVF_OK) {
        return KVF_ERR_NO_MEMORY;
    }
    kvf_info("listening on %s%s", server->listen_addr,
             (server->tls != NULL) ? " (TLS)" : "");
    return KVF_OK;
}

static kvf_status_t kvf_server_write_port_file(kvf_server_t *server)
{
    const char *path = server->cfg->port_file;
    char tmp[4096];
    FILE *f;

    if ((path == NULL) || (path[0] == '\0')) {
        return KVF_OK;
    }
    snprintf(tmp, sizeof(tmp), "%s.tmp", path);
    f = fopen(tmp, "w");
    if (f == NULL) {
        kvf_error("port file %s: %m", tmp);
        return KVF_ERR_IO;
    }
    fprintf(f, "%s\n%s\n", server->listen_addr, kvf_http_address(server->http));
    if ((fclose(f) != 0) || (rename(tmp, path) != 0)) {
        kvf_error("port file %s: %m", path);
        return KVF_ERR_IO;
    }
    return KVF_OK;
}

kvf_status_t kvf_server_create(const kvf_controller_config_t *cfg,
                               struct event_base *base, kvf_server_t **server_p)
{
    kvf_server_t *server;
    kvf_status_t status;
    kvf_http_source_t src;
    struct timeval tick;
    uint64_t tick_ms;
    char text[512];

    server = calloc(1, sizeof(*server));
    if (server == NULL) {
        return KVF_ERR_NO_MEMORY;
    }
    server->cfg           = cfg;
    server->dispatch      = kvf_server_dispatch;
    server->base          = base;
    server->start_ms      = kvf_time_now_ms();
    server->is_recovering = cfg->recovery_window_ns > 0;
    status = kvf_auth_secret_load_opt(cfg->cluster_secret_file, &server->secret,
                                      text, sizeof(text));
    if (status != KVF_OK) {
        kvf_error("%s", text);
        goto err_free;
    }
    kvf_auth_warn_if_open(&server->secret, "listen address", cfg->listen);
    if (((cfg->tls_cert != NULL) && (cfg->tls_cert[0] != '\0')) ||
        ((cfg->tls_key != NULL) && (cfg->tls_key[0] != '\0'))) {
        status = kvf_tls_server_ctx_create(cfg->tls_cert, cfg->tls_key,
                                           &server->tls, text, sizeof(text));
        if (status != KVF_OK) {
            kvf_error("%s", text);
            goto err_free;
        }
    }
    status = kvf_registry_create(cfg->initial_keys, (uint32_t)cfg->max_batch,
                                 &server->reg);
    if (status != KVF_OK) {
        goto err_free;
    }
    status = kvf_node_table_create(server->reg, &server->nodes);
    if (status != KVF_OK) {
        goto err_free;
    }
    status = kvf_index_create((uint32_t)cfg->max_batch, &server->index);
    if (status != KVF_OK) {
        goto err_free;
    }
    if ((cfg->events != NULL) && (cfg->events[0] != '\0')) {
        status =
            kvf_events_create(base, cfg->events, cfg->events_replay,
                              (uint32_t)cfg->events_buffer, &server->events);
        if (status != KVF_OK) {
            goto err_free;
        }
    }
    status = kvf_conn_group_init(server);
    if (status != KVF_OK) {
        goto err_free;
    }
    server->slots   = calloc(cfg->max_batch, sizeof(*server->slots));
    server->holders = calloc(cfg->max_batch, 4);
    server->media   = calloc(cfg->max_batch, 1);
    server->tick  = event_new(base, -1, EV_PERSIST, kvf_server_on_tick, server);
    server->purge = evtimer_new(base, kvf_server_on_purge, server);
    server->sig_term =
        evsignal_new(base, SIGTERM, kvf_server_on_signal, server);
    server->sig_int = evsignal_new(base, SIGINT, kvf_server_on_signal, server);
    if ((server->slots == NULL) || (server->holders == NULL) ||
        (server->media == NULL) || (server->tick == NULL) ||
        (server->purge == NULL) || (server->sig_term == NULL) ||
        (server->sig_int == NULL)) {
        status = KVF_ERR_NO_MEMORY;
        goto err_free;
    }
    src.snapshot = kvf_server_snapshot;
    src.arg      = server;
    src.nodes    = server->nodes;
    src.reg      = server->reg;
    status       = kvf_server_bind(server);
    if (status != KVF_OK) {
        goto err_free;
    }
    status = kvf_http_create(cfg, base, &server->secret, &src, &server->http);
    if (status != KVF_OK) {
        goto err_free;
    }
    kvf_index_http_start(server->index, server->http, server->nodes,
                         server->reg);
    status = kvf_server_write_port_file(server);
    if (status != KVF_OK) {
        goto err_free;
    }
    tick_ms = cfg->lease_ns / KVF_NSEC_PER_MSEC / 4;
    if (tick_ms > 250) {
        tick_ms = 250;
    }
    if (tick_ms < 2) {
        tick_ms = 2;
    }
    tick.tv_sec  = (time_t)(tick_ms / 1000);
    tick.tv_usec = (suseconds_t)((tick_ms % 1000) * 1000);
    event_add(server->tick, &tick);
    event_add(server->sig_term, NULL);
    event_add(server->sig_int, NULL);
    *server_p = server;
    return KVF_OK;

err_free:
    kvf_server_destroy(server);
    return status;
}

void kvf_server_destroy(kvf_server_t *server)
{
    if (server == NULL) {
        return;
    }
    while (server->conns != NULL) {
        kvf_conn_destroy(server->conns);
    }
    kvf_http_destroy(server->http);
    kvf_listen_guard_cleanup(&server->listen_guard);
    if (server->listener != NULL) {
        evconnlistener_free(server->listener);
    }
    if (server->sig_int != NULL) {
        event_free(server->sig_int);
    }
    if (server->sig_term != NULL) {
        event_free(server->sig_term);
    }
    if (server->purge != NULL) {
        event_free(server->purge);
    }
    if (server->tick != NULL) {
        event_free(server->tick);
    }
    free(server->holders);
    free(server->media);
    free(server->slots);
    free(server->group.arena);
    free(server->pins[0].keys);
    free(server->pins[1].keys);
    kvf_events_destroy(server->events);
    free(server->event_nodes);
    kvf_index_destroy(server->index);
    kvf_node_table_destroy(server->nodes);
    kvf_registry_destroy(server->reg);
    kvf_auth_secret_cleanup(&server->secret);
    SSL_CTX_free(server->tls);
    free(server);
}

void kvf_server_addresses(const kvf_server_t *server, const char **control_p,
                          const char **http_p)
{
    *control_p = server->listen_addr;
    *http_p    = (server->http != NULL) ? kvf_http_address(server->http) : "";
}

void kvf_server_set_term(kvf_server_t *server, uint64_t term)
{
    server->term = term;
}

void kvf_server_set_lease(kvf_server_t *server,
                          const _Atomic uint64_t *serve_until_ns)
{
    server->serve_until_ns = serve_until_ns;
}

kvf_status_t kvf_server_run(kvf_server_t *server)
{
    if (event_base_dispatch(server->base) < 0) {
        kvf_error("event loop failed");
        return KVF_ERR_IO;
    }
    return KVF_OK;
}
