/* SPDX-License-Identifier: Apache-2.0 */
/* Copyright (c) 2026 The kvfabric authors */
/*
 * Endpoints, the endpoint cache and the listener.
 *
 * UCX calls us back (errors, connection requests) from inside progress;
 * those callbacks only record and queue. Closing endpoints, accepting and
 * telling the user happen from kvf_ucx_ep_dispatch_*, after progress.
 */
#include "transport/ucx.h"
#include "transport/ucx_int.h"

#include "common/log.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

static unsigned kvf_ucx_ep_hash(const char *peer)
{
    uint32_t h = 2166136261u; /* FNV-1a */

    while (*peer != '\0') {
        h = (h ^ (uint8_t)*peer++) * 16777619u;
    }
    return h % KVF_UCX_EP_CACHE_BUCKETS;
}

static void kvf_ucx_ep_free(kvf_ucx_ep_t *ep)
{
    kvf_ucx_worker_t *worker = ep->worker;

    if (ep->prev != NULL) {
        ep->prev->next = ep->next;
    } else {
        worker->eps = ep->next;
    }
    if (ep->next != NULL) {
        ep->next->prev = ep->prev;
    }
    worker->ep_count--;
    free(ep);
}

static void kvf_ucx_ep_on_closed(void *request, ucs_status_t status,
                                 void *user_data)
{
    kvf_ucx_ep_t *ep = user_data;

    ucp_request_free(request);
    ep->close_req  = NULL;
    ep->is_closing = false;
    if (ep->is_failed) {
        /* UCX is done with this ep: requests it did not release now will
         * not move data any more; their users are told in dispatch */
        ep->worker->has_closed_eps = true;
        kvf_ucx_worker_kick(ep->worker);
    }
    if (ep->refcount == 0) {
        kvf_ucx_ep_free(ep);
    }
}

/* Starts closing the UCX endpoint (once). */
static void kvf_ucx_ep_close(kvf_ucx_ep_t *ep, bool is_force)
{
    ucp_request_param_t param;
    ucs_status_ptr_t req;

    if (ep->ucp_ep == NULL) {
        return;
    }
    memset(&param, 0, sizeof(param));
    param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS | UCP_OP_ATTR_FIELD_CALLBACK |
                         UCP_OP_ATTR_FIELD_USER_DATA;
    param.flags     = is_force ? UCP_EP_CLOSE_FLAG_FORCE : 0;
    param.cb.send   = kvf_ucx_ep_on_closed;
    param.user_data = ep;

    req        = ucp_ep_close_nbx(ep->ucp_ep, &param);
    ep->ucp_ep = NULL;
    if (UCS_PTR_IS_PTR(req)) {
        ep->close_req  = req;
        ep->is_closing = true;
    } else {
        if (UCS_PTR_IS_ERR(req)) {
            kvf_debug("ep %s: close: %s", ep->peer,
                      ucs_status_string(UCS_PTR_STATUS(req)));
        }
        if (ep->is_failed) {
            ep->worker->has_closed_eps = true;
        }
    }
    kvf_ucx_worker_kick(ep->worker);
}

static void kvf_ucx_ep_cache_remove(kvf_ucx_ep_t *ep)
{
    kvf_ucx_ep_t **pp;

    if (!ep->is_cached) {
        return;
    }
    for (pp = &ep->worker->cache[kvf_ucx_ep_hash(ep->peer)]; *pp != NULL;
         pp = &(*pp)->cache_next) {
        if (*pp == ep) {
            *pp = ep->cache_next;
            break;
        }
    }
    ep->cache_next = NULL;
    ep->is_cached  = false;
    ep->worker->ep_cached--;
}

void kvf_ucx_ep_fail(kvf_ucx_ep_t *ep, kvf_status_t status)
{
    kvf_ucx_worker_t *worker;

    if ((ep == NULL) || ep->is_failed) {
        return;
    }
    worker        = ep->worker;
    ep->is_failed = true;
    ep->error     = status;
    worker->ep_failures++;
    kvf_ucx_ep_cache_remove(ep);
    /* one reference while queued; the close and the user's callback run
     * from dispatch, outside UCX callbacks */
    kvf_ucx_ep_hold(ep);
    ep->notify_next     = worker->notify_head;
    worker->notify_head = ep;
    kvf_ucx_worker_kick(worker);
}

static void kvf_ucx_ep_on_error(void *arg, ucp_ep_h ucp_ep, ucs_status_t ucs)
{
    kvf_ucx_ep_t *ep = arg;

    if (!ep->worker->is_destroying) {
        /* the owner's ep_err_cb logs it, once per peer with its name */
        kvf_debug("ep %s: peer failed: %s", ep->peer, ucs_status_string(ucs));
    }
    kvf_ucx_ep_fail(ep, KVF_ERR_CLOSED);
}

void kvf_ucx_ep_fail_all(kvf_ucx_worker_t *worker, kvf_status_t status)
{
    kvf_ucx_ep_t *ep;

    for (ep = worker->eps; ep != NULL; ep = ep->next) {
        kvf_ucx_ep_fail(ep, status);
    }
}

void kvf_ucx_ep_dispatch_close(kvf_ucx_worker_t *worker)
{
    kvf_ucx_ep_t *ep;

    /* force close releases every request of these endpoints with an error
     * (their callbacks are queued to the done list) */
    for (ep = worker->notify_head; ep != NULL; ep = ep->notify_next) {
        kvf_ucx_ep_close(ep, true);
    }
}

void kvf_ucx_ep_dispatch_notify(kvf_ucx_worker_t *worker)
{
    kvf_ucx_ep_t *ep;

    while ((ep = worker->notify_head) != NULL) {
        worker->notify_head = ep->notify_next;
        ep->notify_next     = NULL;
        kvf_ucx_ep_close(ep, true);
        if ((worker->ep_err_cb != NULL) && !worker->is_destroying) {
            worker->ep_err_cb(ep, ep->error, worker->ep_err_arg);
        }
        if (ep->has_worker_ref) {
            /* the notify reference is still held, so dropping the worker's
             * cannot free the endpoint: drop it in place (a second put
             * would read ep after a free on a path gcc -O3 cannot rule
             * out) */
            ep->has_worker_ref = false;
            kvf_assert(ep->refcount >= 2);
            ep->refcount--;
        }
        kvf_ucx_ep_put(ep); /* the notify reference */
    }
}

static kvf_status_t kvf_ucx_ep_new(kvf_ucx_worker_t *worker, const char *peer,
                                   kvf_ucx_ep_t **ep_p)
{
    kvf_ucx_ep_t *ep;

    ep = calloc(1, sizeof(*ep));
    if (ep == NULL) {
        return KVF_ERR_NO_MEMORY;
    }
    ep->worker   = worker;
    ep->refcount = 1;
    snprintf(ep->peer, sizeof(ep->peer), "%s", peer);
    *ep_p = ep;
    return KVF_OK;
}

static void kvf_ucx_ep_link(kvf_ucx_ep_t *ep)
{
    kvf_ucx_worker_t *worker = ep->worker;

    ep->next = worker->eps;
    if (worker->eps != NULL) {
        worker->eps->prev = ep;
    }
    worker->eps = ep;
    worker->ep_count++;
}

/* "HOST:PORT" or "[V6]:PORT" -> sockaddr; setup path (may block on DNS). */
static kvf_status_t kvf_ucx_sockaddr_parse(const char *text,
                                           struct sockaddr_storage *ss,
                                           socklen_t *len_p)
{
    struct addrinfo hints;
    struct addrinfo *res;
    char host[256];
    const char *colon;
    const char *port;
    size_t hlen;
    int rc;

    colon = strrchr(text, ':');
    if ((colon == NULL) || (colon == text) || (colon[1] == '\0')) {
        kvf_error("bad address %s: want HOST:PORT", text);
        return KVF_ERR_INVALID;
    }
    port = colon + 1;
    hlen = (size_t)(colon - text);
    if ((text[0] == '[') && (colon[-1] == ']')) {
        text++;
        hlen -= 2;
    }
    if (hlen >= sizeof(host)) {
        kvf_error("bad address %s: host too long", text);
        return KVF_ERR_INVALID;
    }
    memcpy(host, text, hlen);
    host[hlen] = '\0';

    memset(&hints, 0, sizeof(hints));
    hints.ai_family   = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags    = AI_NUMERICSERV;
    rc                = getaddrinfo(host, port, &hints, &res);
    if (rc != 0) {
        kvf_error("bad address %s:%s: %s", host, port, gai_strerror(rc));
        return KVF_ERR_INVALID;
    }
    memcpy(ss, res->ai_addr, res->ai_addrlen);
    *len_p = res->ai_addrlen;
    freeaddrinfo(res);
    return KVF_OK;
}

static kvf_status_t kvf_ucx_ep_connect(kvf_ucx_ep_t *ep,
                                       const kvf_ucx_ep_params_t *params)
{
    struct sockaddr_storage ss;
    ucp_ep_params_t ep_params;
    socklen_t sslen;
    ucs_status_t ucs;
    kvf_status_t status;

    memset(&ep_params, 0, sizeof(ep_params));
    ep_params.field_mask =
        UCP_EP_PARAM_FIELD_ERR_HANDLER | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE;
    ep_params.err_mode        = UCP_ERR_HANDLING_MODE_PEER;
    ep_params.err_handler.cb  = kvf_ucx_ep_on_error;
    ep_params.err_handler.arg = ep;

    if ((params->field_mask & KVF_UCX_EP_FIELD_SOCKADDR) &&
        (params->sockaddr != NULL)) {
        status = kvf_ucx_sockaddr_parse(params->sockaddr, &ss, &sslen);
        if (status != KVF_OK) {
            return status;
        }
        ep_params.field_mask |=
            UCP_EP_PARAM_FIELD_FLAGS | UCP_EP_PARAM_FIELD_SOCK_ADDR;
        ep_params.flags            = UCP_EP_PARAMS_FLAGS_CLIENT_SERVER;
        ep_params.sockaddr.addr    = (const struct sockaddr *)&ss;
        ep_params.sockaddr.addrlen = sslen;
    } else if ((params->field_mask & KVF_UCX_EP_FIELD_ADDRESS) &&
               (params->address != NULL) && (params->address_len > 0)) {
        ep_params.field_mask |= UCP_EP_PARAM_FIELD_REMOTE_ADDRESS;
        ep_params.address = params->address;
    } else {
        kvf_error("ep %s: no sockaddr and no worker address", ep->peer);
        return KVF_ERR_INVALID;
    }

    ucs = ucp_ep_create(ep->worker->ucp, &ep_params, &ep->ucp_ep);
    if (ucs != UCS_OK) {
        kvf_error("ep %s: ucp_ep_create failed: %s", ep->peer,
                  ucs_status_string(ucs));
        return KVF_ERR_TRANSPORT;
    }
    return KVF_OK;
}

/* A new endpoint named @p peer, connected with @p params and linked into
 * its worker. */
static kvf_status_t kvf_ucx_ep_open(kvf_ucx_worker_t *worker, const char *peer,
                                    const kvf_ucx_ep_params_t *params,
                                    kvf_ucx_ep_t **ep_p)
{
    kvf_ucx_ep_t *ep;
    kvf_status_t status;

    status = kvf_ucx_ep_new(worker, peer, &ep);
    if (status != KVF_OK) {
        return status;
    }
    status = kvf_ucx_ep_connect(ep, params);
    if (status != KVF_OK) {
        free(ep);
        return status;
    }
    kvf_ucx_ep_link(ep);
    *ep_p = ep;
    return KVF_OK;
}

kvf_status_t kvf_ucx_ep_create(kvf_ucx_worker_t *worker,
                               const kvf_ucx_ep_params_t *params,
                               kvf_ucx_ep_t **ep_p)
{
    kvf_ucx_ep_t *ep;
    kvf_status_t status;

    if ((worker == NULL) || (params == NULL) || (ep_p == NULL)) {
        return KVF_ERR_INVALID;
    }
    status =
        kvf_ucx_ep_open(worker,
                        ((params->field_mask & KVF_UCX_EP_FIELD_SOCKADDR) &&
                         (params->sockaddr != NULL))
                            ? params->sockaddr
                            : "address",
                        params, &ep);
    if (status != KVF_OK) {
        return status;
    }
    kvf_ucx_worker_kick(worker);
    *ep_p = ep;
    return KVF_OK;
}

kvf_status_t kvf_ucx_ep_get(kvf_ucx_worker_t *worker, const char *peer,
                            const kvf_ucx_ep_params_t *params,
                            kvf_ucx_ep_t **ep_p)
{
    kvf_ucx_ep_params_t sa_params;
    kvf_ucx_ep_t *ep;
    kvf_status_t status;
    unsigned bucket;

    if ((worker == NULL) || (peer == NULL) || (ep_p == NULL)) {
        return KVF_ERR_INVALID;
    }
    if (strlen(peer) >= KVF_UCX_PEER_NAME_MAX) {
        kvf_error("peer name too long (%zu)", strlen(peer));
        return KVF_ERR_TOO_BIG;
    }
    bucket = kvf_ucx_ep_hash(peer);
    for (ep = worker->cache[bucket]; ep != NULL; ep = ep->cache_next) {
        if (strcmp(ep->peer, peer) == 0) {
            kvf_ucx_ep_hold(ep);
            *ep_p = ep;
            return KVF_OK;
        }
    }

    if (params == NULL) {
        memset(&sa_params, 0, sizeof(sa_params));
        sa_params.field_mask = KVF_UCX_EP_FIELD_SOCKADDR;
        sa_params.sockaddr   = peer;
        params               = &sa_params;
    }
    status = kvf_ucx_ep_open(worker, peer, params, &ep);
    if (status != KVF_OK) {
        return status;
    }
    ep->refcount++; /* the cache's */
    ep->has_worker_ref    = true;
    ep->is_cached         = true;
    ep->cache_next        = worker->cache[bucket];
    worker->cache[bucket] = ep;
    worker->ep_cached++;
    kvf_ucx_worker_kick(worker);
    *ep_p = ep;
    return KVF_OK;
}

void kvf_ucx_ep_hold(kvf_ucx_ep_t *ep)
{
    ep->refcount++;
}

void kvf_ucx_ep_put(kvf_ucx_ep_t *ep)
{
    if (ep == NULL) {
        return;
    }
    kvf_assert(ep->refcount > 0);
    if (--ep->refcount != 0) {
        return;
    }
    kvf_ucx_ep_cache_remove(ep);
    /* force: none of our operations are left on it (each holds a
     * reference), and a dead or stalled peer cannot hold the close up */
    kvf_ucx_ep_close(ep, true);
    if (!ep->is_closing) {
        kvf_ucx_ep_free(ep);
    }
}

bool kvf_ucx_ep_is_failed(const kvf_ucx_ep_t *ep)
{
    return ep->is_failed;
}

bool kvf_ucx_ep_is_accepted(const kvf_ucx_ep_t *ep)
{
    return ep->is_accepted;
}

const char *kvf_ucx_ep_peer(const kvf_ucx_ep_t *ep)
{
    return ep->peer;
}

void kvf_ucx_ep_set_user(kvf_ucx_ep_t *ep, void *user)
{
    ep->user = user;
}

void *kvf_ucx_ep_user(const kvf_ucx_ep_t *ep)
{
    return ep->user;
}

kvf_ucx_ep_t *kvf_ucx_ep_find_ucp(kvf_ucx_worker_t *worker, ucp_ep_h ucp_ep)
{
    kvf_ucx_ep_t *ep;

    for (ep = worker->eps; ep != NULL; ep = ep->next) {
        if ((ep->ucp_ep == ucp_ep) && !ep->is_failed) {
            return ep;
        }
    }
    return NULL;
}

bool kvf_ucx_ep_closing_any(const kvf_ucx_worker_t *worker)
{
    const kvf_ucx_ep_t *ep;

    for (ep = worker->eps; ep != NULL; ep = ep->next) {
        if (ep->is_closing || (ep->ucp_ep != NULL)) {
            return true;
        }
    }
    return worker->notify_head != NULL;
}

void kvf_ucx_ep_free_all(kvf_ucx_worker_t *worker, bool with_closing)
{
    kvf_ucx_ep_t *next;
    kvf_ucx_ep_t *ep;

    for (ep = worker->eps; ep != NULL; ep = next) {
        next = ep->next;
        if (ep->is_closing && !with_closing) {
            /* UCX may still complete its close request (and call us with
             * ep) while the worker is destroyed: free it after that */
            continue;
        }
        if (ep->refcount != 0) {
            kvf_warn("worker %s: ep %s still has %u references at destroy",
                     worker->name, ep->peer, ep->refcount);
        }
        kvf_ucx_ep_free(ep);
    }
}

/* ------------------------------------------------------------ listener */

static void kvf_ucx_listener_on_conn(ucp_conn_request_h request, void *arg)
{
    kvf_ucx_listener_t *listener = arg;
    kvf_ucx_worker_t *worker     = listener->worker;
    kvf_ucx_conn_t *conn;

    conn = calloc(1, sizeof(*conn));
    if (conn == NULL) {
        kvf_error("listener port %u: no memory for a connection",
                  listener->port);
        ucp_listener_reject(listener->ucp, request);
        return;
    }
    conn->listener    = listener;
    conn->request     = request;
    conn->next        = worker->conn_head;
    worker->conn_head = conn;
    kvf_ucx_worker_kick(worker);
}

static void kvf_ucx_listener_accept(kvf_ucx_conn_t *conn)
{
    kvf_ucx_listener_t *listener = conn->listener;
    kvf_ucx_worker_t *worker     = listener->worker;
    ucp_conn_request_attr_t attr;
    ucp_ep_params_t ep_params;
    char peer[KVF_UCX_PEER_NAME_MAX] = "unknown";
    char host[INET6_ADDRSTRLEN];
    kvf_ucx_ep_t *ep;
    ucs_status_t ucs;
    uint16_t port = 0;

    memset(&attr, 0, sizeof(attr));
    attr.field_mask = UCP_CONN_REQUEST_ATTR_FIELD_CLIENT_ADDR;
    if (ucp_conn_request_query(conn->request, &attr) == UCS_OK) {
        if (attr.client_address.ss_family == AF_INET) {
            const struct sockaddr_in *sin = (const void *)&attr.client_address;

            inet_ntop(AF_INET, &sin->sin_addr, host, sizeof(host));
            port = ntohs(sin->sin_port);
            snprintf(peer, sizeof(peer), "%s:%u", host, port);
        } else if (attr.client_address.ss_family == AF_INET6) {
            const struct sockaddr_in6 *sin6 =
                (const void *)&attr.client_address;

            inet_ntop(AF_INET6, &sin6->sin6_addr, host, sizeof(host));
            port = ntohs(sin6->sin6_port);
            snprintf(peer, sizeof(peer), "[%s]:%u", host, port);
        }
    }

    if (kvf_ucx_ep_new(worker, peer, &ep) != KVF_OK) {
        kvf_error("listener port %u: no memory for ep %s", listener->port,
                  peer);
        ucp_listener_reject(listener->ucp, conn->request);
        return;
    }
    memset(&ep_params, 0, sizeof(ep_params));
    ep_params.field_mask = UCP_EP_PARAM_FIELD_CONN_REQUEST |
                           UCP_EP_PARAM_FIELD_ERR_HANDLER |
                           UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE;
    ep_params.conn_request    = conn->request;
    ep_params.err_mode        = UCP_ERR_HANDLING_MODE_PEER;
    ep_params.err_handler.cb  = kvf_ucx_ep_on_error;
    ep_params.err_handler.arg = ep;
    ucs = ucp_ep_create(worker->ucp, &ep_params, &ep->ucp_ep);
    if (ucs != UCS_OK) {
        kvf_error("listener port %u: accepting %s failed: %s", listener->port,
                  peer, ucs_status_string(ucs));
        free(ep);
        return;
    }
    ep->has_worker_ref = true; /* the reference given by refcount 1 */
    ep->is_accepted    = true;
    kvf_ucx_ep_link(ep);
    kvf_debug("listener port %u: accepted %s", listener->port, peer);
    if (listener->accept_cb != NULL) {
        listener->accept_cb(ep, peer, listener->arg);
    }
}

void kvf_ucx_ep_dispatch_accept(kvf_ucx_worker_t *worker)
{
    kvf_ucx_conn_t *conn;

    while ((conn = worker->conn_head) != NULL) {
        worker->conn_head = conn->next;
        if (worker->is_destroying) {
            ucp_listener_reject(conn->listener->ucp, conn->request);
        } else {
            kvf_ucx_listener_accept(conn);
        }
        free(conn);
    }
}

kvf_status_t kvf_ucx_listener_create(kvf_ucx_worker_t *worker, const char *host,
                                     uint16_t port,
                                     kvf_ucx_accept_cb_t accept_cb, void *arg,
                                     kvf_ucx_listener_t **listener_p)
{
    struct sockaddr_storage ss;
    ucp_listener_params_t lparams;
    ucp_listener_attr_t attr;
    kvf_ucx_listener_t *listener;
    char text[300];
    socklen_t sslen;
    ucs_status_t ucs;
    kvf_status_t status;

    if ((worker == NULL) || (host == NULL) || (listener_p == NULL)) {
        return KVF_ERR_INVALID;
    }
    snprintf(text, sizeof(text), "%s:%u", host, port);
    status = kvf_ucx_sockaddr_parse(text, &ss, &sslen);
    if (status != KVF_OK) {
        return status;
    }

    listener = calloc(1, sizeof(*listener));
    if (listener == NULL) {
        return KVF_ERR_NO_MEMORY;
    }
    listener->worker    = worker;
    listener->accept_cb = accept_cb;
    listener->arg       = arg;

    memset(&lparams, 0, sizeof(lparams));
    lparams.field_mask = UCP_LISTENER_PARAM_FIELD_SOCK_ADDR |
                         UCP_LISTENER_PARAM_FIELD_CONN_HANDLER;
    lparams.sockaddr.addr    = (const struct sockaddr *)&ss;
    lparams.sockaddr.addrlen = sslen;
    lparams.conn_handler.cb  = kvf_ucx_listener_on_conn;
    lparams.conn_handler.arg = listener;
    ucs = ucp_listener_create(worker->ucp, &lparams, &listener->ucp);
    if (ucs != UCS_OK) {
        kvf_error("listen on %s failed: %s", text, ucs_status_string(ucs));
        status = KVF_ERR_TRANSPORT;
        goto err_free;
    }

    memset(&attr, 0, sizeof(attr));
    attr.field_mask = UCP_LISTENER_ATTR_FIELD_SOCKADDR;
    ucs             = ucp_listener_query(listener->ucp, &attr);
    if (ucs != UCS_OK) {
        kvf_error("listener %s: query failed: %s", text,
                  ucs_status_string(ucs));
        status = KVF_ERR_TRANSPORT;
        goto err_destroy;
    }
    if (attr.sockaddr.ss_family == AF_INET6) {
        listener->port =
            ntohs(((struct sockaddr_in6 *)&attr.sockaddr)->sin6_port);
    } else {
        listener->port =
            ntohs(((struct sockaddr_in *)&attr.sockaddr)->sin_port);
    }
    worker->listeners++;
    kvf_info("listening on %s port %u", host, listener->port);
    *listener_p = listener;
    return KVF_OK;

err_destroy:
    ucp_listener_destroy(listener->ucp);
err_free:
    free(listener);
    return status;
}

void kvf_ucx_listener_destroy(kvf_ucx_listener_t *listener)
{
    kvf_ucx_worker_t *worker;
    kvf_ucx_conn_t **pp;
    kvf_ucx_conn_t *conn;

    if (listener == NULL) {
        return;
    }
    worker = listener->worker;
    /* connection requests not accepted yet are refused */
    pp = &worker->conn_head;
    while ((conn = *pp) != NULL) {
        if (conn->listener == listener) {
            *pp = conn->next;
            ucp_listener_reject(listener->ucp, conn->request);
            free(conn);
        } else {
            pp = &conn->next;
        }
    }
    ucp_listener_destroy(listener->ucp);
    worker->listeners--;
    free(listener);
}

uint16_t kvf_ucx_listener_port(const kvf_ucx_listener_t *listener)
{
    return listener->port;
}
