/* SPDX-License-Identifier: Apache-2.0 */
/* Copyright (c) 2026 The kvfabric authors */
#include "agent/agent.h"

#include "agent/ctl_client.h"
#include "common/log.h"

#include <event2/buffer.h>
#include <event2/event.h>
#include <event2/http.h>

#include <arpa/inet.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

struct kvf_agent {
    const kvf_agent_config_t *config;
    struct event_base *base;
    kvf_ctl_client_t *ctl;
    struct evhttp *http;
    uint16_t http_port;
    char name[256];
    bool stopping;
};

static void kvf_agent_on_stopped(void *arg)
{
    kvf_agent_t *agent = arg;

    kvf_info("agent %s stopped", agent->name);
    event_base_loopexit(agent->base, NULL);
}

static void kvf_agent_on_command(void *arg, const Kvf__Command *command)
{
    kvf_agent_t *agent = arg;

    /* pin, unpin, clear, drain and replicate act on the pool, which this
     * build does not have yet: say so rather than pretend */
    kvf_warn("agent %s: controller command %d ignored: the chunk pool is "
             "not built in this version",
             agent->name, (int)command->type);
}

static const kvf_ctl_client_ops_t kvf_agent_ctl_ops = {
    .command = kvf_agent_on_command,
    .stopped = kvf_agent_on_stopped,
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
    kvf_agent_t *agent    = arg;
    struct evbuffer *body = evbuffer_new();
    bool registered       = kvf_ctl_client_is_registered(agent->ctl);

    if (body == NULL) {
        evhttp_send_error(req, 500, "out of memory");
        return;
    }
    evbuffer_add_printf(body,
                        "{\"status\":\"%s\",\"name\":\"%s\",\"role\":\"%s\","
                        "\"registered\":%s,\"node_id\":%u}\n",
                        agent->stopping ? "stopping" : "ok", agent->name,
                        kvf_agent_role_name(agent->config->role),
                        registered ? "true" : "false",
                        kvf_ctl_client_node_id(agent->ctl));
    kvf_agent_http_reply(req, 200, "application/json", body);
    evbuffer_free(body);
}

static void kvf_agent_on_metrics(struct evhttp_request *req, void *arg)
{
    kvf_agent_t *agent    = arg;
    struct evbuffer *body = evbuffer_new();
    kvf_ctl_client_stats_t st;

    if (body == NULL) {
        evhttp_send_error(req, 500, "out of memory");
        return;
    }
    kvf_ctl_client_get_stats(agent->ctl, &st);
    evbuffer_add_printf(
        body,
        "# HELP kvf_agent_controller_registered 1 while registered with "
        "the controller\n"
        "# TYPE kvf_agent_controller_registered gauge\n"
        "kvf_agent_controller_registered %d\n"
        "# HELP kvf_agent_controller_connects_total TCP connections made "
        "to the controller\n"
        "# TYPE kvf_agent_controller_connects_total counter\n"
        "kvf_agent_controller_connects_total %" PRIu64 "\n"
        "# HELP kvf_agent_registrations_total successful registrations\n"
        "# TYPE kvf_agent_registrations_total counter\n"
        "kvf_agent_registrations_total %" PRIu64 "\n"
        "# HELP kvf_agent_heartbeats_total heartbeats sent\n"
        "# TYPE kvf_agent_heartbeats_total counter\n"
        "kvf_agent_heartbeats_total %" PRIu64 "\n"
        "# HELP kvf_agent_admitted_keys_total keys announced in ADMIT\n"
        "# TYPE kvf_agent_admitted_keys_total counter\n"
        "kvf_agent_admitted_keys_total %" PRIu64 "\n"
        "# HELP kvf_agent_evicted_keys_total keys announced in EVICT\n"
        "# TYPE kvf_agent_evicted_keys_total counter\n"
        "kvf_agent_evicted_keys_total %" PRIu64 "\n"
        "# HELP kvf_agent_controller_errors_total failed controller "
        "requests and bad frames\n"
        "# TYPE kvf_agent_controller_errors_total counter\n"
        "kvf_agent_controller_errors_total %" PRIu64 "\n",
        kvf_ctl_client_is_registered(agent->ctl) ? 1 : 0, st.connects,
        st.registrations, st.heartbeats, st.admitted_keys, st.evicted_keys,
        st.errors);
    kvf_agent_http_reply(req, 200, "text/plain; version=0.0.4", body);
    evbuffer_free(body);
}

static kvf_status_t kvf_agent_http_start(kvf_agent_t *agent)
{
    struct evhttp_bound_socket *sock;
    struct sockaddr_storage ss;
    socklen_t len = sizeof(ss);
    char host[256];
    uint16_t port;

    if (agent->config->http[0] == '\0') {
        return KVF_OK;
    }
    if (kvf_config_parse_hostport(agent->config->http, host, sizeof(host),
                                  &port) != KVF_OK) {
        kvf_error("http address '%s' is not HOST:PORT", agent->config->http);
        return KVF_ERR_CONFIG;
    }
    agent->http = evhttp_new(agent->base);
    if (agent->http == NULL) {
        return KVF_ERR_NO_MEMORY;
    }
    evhttp_set_allowed_methods(agent->http, EVHTTP_REQ_GET);
    evhttp_set_cb(agent->http, "/healthz", kvf_agent_on_healthz, agent);
    evhttp_set_cb(agent->http, "/metrics", kvf_agent_on_metrics, agent);
    sock = evhttp_bind_socket_with_handle(agent->http, host, port);
    if (sock == NULL) {
        kvf_error("http: cannot listen on %s: %m", agent->config->http);
        return KVF_ERR_IO;
    }
    memset(&ss, 0, sizeof(ss));
    if (getsockname(evhttp_bound_socket_get_fd(sock), (struct sockaddr *)&ss,
                    &len) == 0) {
        agent->http_port = ntohs((ss.ss_family == AF_INET6)
                                     ? ((struct sockaddr_in6 *)&ss)->sin6_port
                                     : ((struct sockaddr_in *)&ss)->sin_port);
    }
    kvf_info("agent %s: http listening on %s:%u", agent->name, host,
             agent->http_port);
    return KVF_OK;
}

kvf_status_t kvf_agent_create(const kvf_agent_config_t *config,
                              struct event_base *base, kvf_agent_t **agent_p)
{
    kvf_ctl_client_params_t params;
    kvf_agent_t *agent;
    kvf_status_t status;

    agent = calloc(1, sizeof(*agent));
    if (agent == NULL) {
        return KVF_ERR_NO_MEMORY;
    }
    agent->config = config;
    agent->base   = base;
    if (config->name[0] != '\0') {
        snprintf(agent->name, sizeof(agent->name), "%s", config->name);
    } else if (gethostname(agent->name, sizeof(agent->name) - 1) != 0) {
        snprintf(agent->name, sizeof(agent->name), "agent-%d", (int)getpid());
    }

    status = kvf_agent_http_start(agent);
    if (status != KVF_OK) {
        goto err_destroy;
    }

    memset(&params, 0, sizeof(params));
    params.base               = base;
    params.controller         = config->controller;
    params.name               = agent->name;
    params.role               = config->role;
    params.data_address       = config->listen;
    params.control_address    = config->socket;
    params.pool_capacity      = config->pool_size;
    params.instance_id        = config->instance_id;
    params.tp_rank            = (uint32_t)config->tp_rank;
    params.tp_world           = (uint32_t)config->tp_world;
    params.connect_timeout_ns = config->connect_timeout;
    params.request_timeout_ns = config->request_timeout;
    params.reconnect_max_ns   = config->reconnect_max;
    params.flush_ns           = config->admit_flush;
    params.max_frame          = (uint32_t)config->max_frame;
    params.ops                = &kvf_agent_ctl_ops;
    params.arg                = agent;
    status                    = kvf_ctl_client_create(&params, &agent->ctl);
    if (status != KVF_OK) {
        goto err_destroy;
    }
    kvf_info("agent %s (%s) started; controller %s", agent->name,
             kvf_agent_role_name(config->role), config->controller);
    *agent_p = agent;
    return KVF_OK;

err_destroy:
    kvf_agent_destroy(agent);
    return status;
}

void kvf_agent_stop(kvf_agent_t *agent)
{
    if (agent->stopping) {
        return;
    }
    agent->stopping = true;
    kvf_info("agent %s: stopping", agent->name);
    kvf_ctl_client_stop(agent->ctl);
}

void kvf_agent_destroy(kvf_agent_t *agent)
{
    if (agent == NULL) {
        return;
    }
    kvf_ctl_client_destroy(agent->ctl);
    if (agent->http != NULL) {
        evhttp_free(agent->http);
    }
    free(agent);
}

uint16_t kvf_agent_http_port(const kvf_agent_t *agent)
{
    return agent->http_port;
}
