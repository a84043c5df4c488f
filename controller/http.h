/* SPDX-License-Identifier: Apache-2.0 */
/* Copyright (c) 2026 The kvfabric authors */
/*
 * The controller's HTTP port (controller/ only): /healthz, /v1/nodes,
 * /v1/stats, /metrics, the dashboard and the routes others add
 * (index.c), with a bearer token when a cluster secret is set. It reads
 * the server through kvf_http_source_t only: a stats snapshot, the node
 * table and the registry.
 *
 * thread: the server's loop only.
 */
#ifndef KVF_CONTROLLER_HTTP_H
#define KVF_CONTROLLER_HTTP_H

#include "common/auth.h"
#include "controller/config.h"
#include "controller/node.h"
#include "controller/registry.h"
#include "controller/stats.h"

#include <kvfabric/status.h>

#include <stdbool.h>

struct event_base;
struct evbuffer;
struct evhttp_request;

typedef struct kvf_http kvf_http_t;

/* What HTTP reads of the server. */
typedef struct kvf_http_source {
    /* fills @p stats (zeroed by the caller) with the server's figures */
    void (*snapshot)(void *arg, kvf_server_stats_t *stats);
    void *arg;
    kvf_node_table_t *nodes; /* /v1/nodes */
    const kvf_registry_t *reg;
} kvf_http_source_t;

/* Starts HTTP on cfg->http; with cfg->http empty, an object that serves
 * nothing and whose address is "-". @p secret and @p src are borrowed. */
kvf_status_t kvf_http_create(const kvf_controller_config_t *cfg,
                             struct event_base *base,
                             const kvf_auth_secret_t *secret,
                             const kvf_http_source_t *src, kvf_http_t **http_p);

/* NULL is a no-op. */
void kvf_http_destroy(kvf_http_t *http);

/* The bound address, "-" when HTTP is off. */
const char *kvf_http_address(const kvf_http_t *http);

/* Serves @p path with @p cb (no-op when HTTP is off). */
void kvf_http_route(kvf_http_t *http, const char *path,
                    void (*cb)(struct evhttp_request *req, void *arg),
                    void *arg);

/*
 * Starts answering an HTTP request for @p path: false (answered 405 or
 * 401) when its method is not in @p methods (EVHTTP_REQ_*) or, with a
 * cluster secret and @p path not in http_open, it lacks the bearer token
 * (kvf_auth_http_token(); compared in constant time, refusals counted).
 */
bool kvf_http_begin(kvf_http_t *http, struct evhttp_request *req,
                    const char *path, int methods);

/* 200 with @p b as body of Content-Type @p type. */
void kvf_http_reply(struct evhttp_request *req, struct evbuffer *b,
                    const char *type);

#endif /* KVF_CONTROLLER_HTTP_H */
