/* SPDX-License-Identifier: Apache-2.0 */
/* Copyright (c) 2026 The kvfabric authors */
/*
 * UCP context: features AM + RMA + WAKEUP; devices, transports and our
 * tunings through ucp_config_modify (never setenv: the process environment
 * belongs to the engine that may embed us).
 */
#include "transport/ucx.h"
#include "transport/ucx_int.h"

#include "common/log.h"
#include "transport/verbs.h"

#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/*
 * Tuned defaults: {environment name without UCX_, name for
 * ucp_config_modify, value}. UCX 1.13 applies transport settings given to
 * ucp_config_modify to every interface that has them, by their name
 * without the transport prefix (TX_SEG_SIZE, not TCP_TX_SEG_SIZE: the
 * prefixed form is accepted and then reported as an invalid configuration).
 * Newer UCX (1.22: make test-ucx-new) rejects the bare name and takes the
 * prefixed one, which kvf_ucx_ctx_default_set falls back to.
 * Values measured on loopback (docs/performance.md "UCX ceilings").
 */
const char *const kvf_ucx_ctx_default_tunings[] = {
    "TCP_TX_SEG_SIZE",
    "TX_SEG_SIZE",
    "256K", /* */
    "TCP_RX_SEG_SIZE",
    "RX_SEG_SIZE",
    "256K", /* */
    /* SO_REUSEADDR on the listen socket: an agent restarted after a crash
     * binds its fixed listen address again while the connections the dead
     * process accepted sit in TIME_WAIT (60 s), instead of failing; the
     * CM tables answer to CM_REUSEADDR, not REUSEADDR or the env name */
    "TCP_CM_REUSEADDR",
    "CM_REUSEADDR",
    "y",
    NULL,
};

static bool kvf_ucx_ctx_is_overridden(const kvf_ucx_ctx_params_t *params,
                                      const char *env_name,
                                      const char *modify_name)
{
    char env[96];
    const char *const *kv;

    snprintf(env, sizeof(env), "UCX_%s", env_name);
    if (getenv(env) != NULL) {
        return true;
    }
    if ((params != NULL) &&
        (params->field_mask & KVF_UCX_CTX_FIELD_OVERRIDES) &&
        (params->overrides != NULL)) {
        for (kv = params->overrides; kv[0] != NULL; kv += 2) {
            if ((strcmp(kv[0], env_name) == 0) ||
                (strcmp(kv[0], modify_name) == 0)) {
                return true;
            }
        }
    }
    return false;
}

static kvf_status_t kvf_ucx_ctx_config_set(ucp_config_t *config,
                                           const char *name, const char *value)
{
    ucs_status_t ucs;

    if (value == NULL) {
        kvf_error("ucx setting %s has no value", name);
        return KVF_ERR_CONFIG;
    }
    ucs = ucp_config_modify(config, name, value);
    if (ucs != UCS_OK) {
        kvf_error("ucx setting %s %s rejected: %s", name, value,
                  ucs_status_string(ucs));
        return KVF_ERR_CONFIG;
    }
    return KVF_OK;
}

/* A tuned default by its 1.13 name, else (newer UCX) by its prefixed one. */
static kvf_status_t kvf_ucx_ctx_default_set(ucp_config_t *config,
                                            const char *env_name,
                                            const char *modify_name,
                                            const char *value)
{
    ucs_status_t ucs = ucp_config_modify(config, modify_name, value);

    if ((ucs == UCS_ERR_INVALID_PARAM) || (ucs == UCS_ERR_NO_ELEM)) {
        ucs = ucp_config_modify(config, env_name, value);
    }
    if (ucs != UCS_OK) {
        kvf_error("ucx setting %s %s rejected: %s", env_name, value,
                  ucs_status_string(ucs));
        return KVF_ERR_CONFIG;
    }
    return KVF_OK;
}

static kvf_status_t kvf_ucx_ctx_config_apply(const kvf_ucx_ctx_params_t *params,
                                             ucp_config_t *config)
{
    const char *const *kv;
    uint64_t mask = (params != NULL) ? params->field_mask : 0;
    kvf_status_t status;

    if (!(mask & KVF_UCX_CTX_FIELD_NO_DEFAULTS)) {
        for (kv = kvf_ucx_ctx_default_tunings; kv[0] != NULL; kv += 3) {
            if (kvf_ucx_ctx_is_overridden(params, kv[0], kv[1])) {
                continue;
            }
            status = kvf_ucx_ctx_default_set(config, kv[0], kv[1], kv[2]);
            if (status != KVF_OK) {
                return status;
            }
        }
    }
    if ((mask & KVF_UCX_CTX_FIELD_TLS) && (params->tls != NULL)) {
        status = kvf_ucx_ctx_config_set(config, "TLS", params->tls);
        if (status != KVF_OK) {
            return status;
        }
    }
    if ((mask & KVF_UCX_CTX_FIELD_NET_DEVICES) &&
        (params->net_devices != NULL)) {
        status =
            kvf_ucx_ctx_config_set(config, "NET_DEVICES", params->net_devices);
        if (status != KVF_OK) {
            return status;
        }
    }
    if ((mask & KVF_UCX_CTX_FIELD_OVERRIDES) && (params->overrides != NULL)) {
        for (kv = params->overrides; kv[0] != NULL; kv += 2) {
            status = kvf_ucx_ctx_config_set(config, kv[0], kv[1]);
            if (status != KVF_OK) {
                return status;
            }
        }
    }
    return KVF_OK;
}

static bool kvf_ucx_addr_equal(const struct sockaddr *a,
                               const struct sockaddr *b)
{
    if ((a == NULL) || (b == NULL) || (a->sa_family != b->sa_family)) {
        return false;
    }
    if (a->sa_family == AF_INET) {
        return ((const struct sockaddr_in *)(const void *)a)->sin_addr.s_addr ==
               ((const struct sockaddr_in *)(const void *)b)->sin_addr.s_addr;
    }
    if (a->sa_family == AF_INET6) {
        return memcmp(
                   &((const struct sockaddr_in6 *)(const void *)a)->sin6_addr,
                   &((const struct sockaddr_in6 *)(const void *)b)->sin6_addr,
                   sizeof(struct in6_addr)) == 0;
    }
    return false;
}

kvf_status_t kvf_ucx_net_devices_for(const char *host, char *buf, size_t len)
{
    struct addrinfo hints, *res = NULL, *ai;
    struct ifaddrs *ifs      = NULL, *ifa;
    kvf_verbs_device_t *devs = NULL;
    kvf_status_t status      = KVF_ERR_NOT_FOUND;
    unsigned count           = 0, i, p;
    size_t used;

    memset(&hints, 0, sizeof(hints));
    hints.ai_family   = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    if ((host == NULL) || (getaddrinfo(host, NULL, &hints, &res) != 0)) {
        return KVF_ERR_NOT_FOUND;
    }
    if (getifaddrs(&ifs) != 0) {
        freeaddrinfo(res);
        return KVF_ERR_NOT_FOUND;
    }
    /* a wildcard matches no device address: all devices stay */
    for (ai = res; (ai != NULL) && (status != KVF_OK); ai = ai->ai_next) {
        for (ifa = ifs; ifa != NULL; ifa = ifa->ifa_next) {
            if (kvf_ucx_addr_equal(ai->ai_addr, ifa->ifa_addr)) {
                if (strlen(ifa->ifa_name) >= len) {
                    status = KVF_ERR_TOO_BIG;
                    break;
                }
                snprintf(buf, len, "%s", ifa->ifa_name);
                status = KVF_OK;
                break;
            }
        }
    }
    freeifaddrs(ifs);
    freeaddrinfo(res);
    if ((status != KVF_OK) ||
        (kvf_verbs_list_devices(&devs, &count) != KVF_OK)) {
        return status;
    }
    for (i = 0; i < count; i++) {
        for (p = 0; (p < devs[i].port_count) && (p < KVF_VERBS_PORTS_MAX);
             p++) {
            used = strlen(buf);
            if (snprintf(buf + used, len - used, ",%s:%u", devs[i].name,
                         devs[i].ports[p].num) >= (int)(len - used)) {
                buf[used] = '\0';
                status    = KVF_ERR_TOO_BIG;
            }
        }
    }
    kvf_verbs_devices_free(devs);
    return status;
}

kvf_status_t kvf_ucx_ctx_create(const kvf_ucx_ctx_params_t *params,
                                kvf_ucx_ctx_t **ctx_p)
{
    ucp_params_t ucp_params;
    ucp_config_t *config;
    kvf_ucx_ctx_t *ctx;
    ucs_status_t ucs;
    kvf_status_t status;

    ctx = calloc(1, sizeof(*ctx));
    if (ctx == NULL) {
        return KVF_ERR_NO_MEMORY;
    }

    ucs = ucp_config_read(NULL, NULL, &config);
    if (ucs != UCS_OK) {
        kvf_error("ucp_config_read failed: %s", ucs_status_string(ucs));
        status = KVF_ERR_TRANSPORT;
        goto err_free_ctx;
    }

    status = kvf_ucx_ctx_config_apply(params, config);
    if (status != KVF_OK) {
        goto err_release_config;
    }

    memset(&ucp_params, 0, sizeof(ucp_params));
    ucp_params.field_mask = UCP_PARAM_FIELD_FEATURES |
                            UCP_PARAM_FIELD_MT_WORKERS_SHARED |
                            UCP_PARAM_FIELD_NAME;
    ucp_params.features = UCP_FEATURE_AM | UCP_FEATURE_RMA | UCP_FEATURE_WAKEUP;
    /* workers are single-threaded; the context is shared by loops */
    ucp_params.mt_workers_shared = 1;
    ucp_params.name              = "kvfabric";

    ucs = ucp_init(&ucp_params, config, &ctx->ucp);
    if (ucs != UCS_OK) {
        kvf_error("ucp_init failed: %s", ucs_status_string(ucs));
        status = KVF_ERR_TRANSPORT;
        goto err_release_config;
    }
    ucp_config_release(config);

    *ctx_p = ctx;
    return KVF_OK;

err_release_config:
    ucp_config_release(config);
err_free_ctx:
    free(ctx);
    return status;
}

void kvf_ucx_ctx_destroy(kvf_ucx_ctx_t *ctx)
{
    if (ctx == NULL) {
        return;
    }
    ucp_cleanup(ctx->ucp);
    free(ctx);
}

kvf_status_t kvf_ucx_status(int ucs_status)
{
    switch ((ucs_status_t)ucs_status) {
    case UCS_OK:
        return KVF_OK;
    case UCS_INPROGRESS:
        return KVF_INPROGRESS;
    case UCS_ERR_NO_MEMORY:
        return KVF_ERR_NO_MEMORY;
    case UCS_ERR_CANCELED:
        return KVF_ERR_CANCELED;
    case UCS_ERR_TIMED_OUT:
        return KVF_ERR_TIMEOUT;
    case UCS_ERR_CONNECTION_RESET:
    case UCS_ERR_ENDPOINT_TIMEOUT:
    case UCS_ERR_UNREACHABLE:
    case UCS_ERR_REJECTED:
    case UCS_ERR_NOT_CONNECTED:
        return KVF_ERR_CLOSED;
    default:
        return KVF_ERR_TRANSPORT;
    }
}

bool kvf_ucx_ctx_has_cuda(const kvf_ucx_ctx_t *ctx)
{
    ucp_context_attr_t attr;

    memset(&attr, 0, sizeof(attr));
    attr.field_mask = UCP_ATTR_FIELD_MEMORY_TYPES;
    if (ucp_context_query(ctx->ucp, &attr) != UCS_OK) {
        return false;
    }
    return (attr.memory_types & UCS_BIT(UCS_MEMORY_TYPE_CUDA)) != 0;
}
