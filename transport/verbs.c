/* SPDX-License-Identifier: Apache-2.0 */
/* Copyright (c) 2026 The kvfabric authors */
#include "transport/verbs.h"

#include "common/log.h"

#include <infiniband/verbs.h>

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

static const char *kvf_verbs_port_state_str(enum ibv_port_state state)
{
    switch (state) {
    case IBV_PORT_DOWN:
        return "down";
    case IBV_PORT_INIT:
        return "init";
    case IBV_PORT_ARMED:
        return "armed";
    case IBV_PORT_ACTIVE:
        return "active";
    case IBV_PORT_ACTIVE_DEFER:
        return "active_defer";
    default:
        return "unknown";
    }
}

static const char *kvf_verbs_link_layer_str(uint8_t link_layer)
{
    switch (link_layer) {
    case IBV_LINK_LAYER_INFINIBAND:
        return "InfiniBand";
    case IBV_LINK_LAYER_ETHERNET:
        return "Ethernet";
    default:
        return "unknown";
    }
}

static void kvf_verbs_device_query(struct ibv_device *dev,
                                   kvf_verbs_device_t *out)
{
    struct ibv_device_attr dattr;
    struct ibv_port_attr pattr;
    struct ibv_context *ibctx;
    unsigned p;

    snprintf(out->name, sizeof(out->name), "%s", ibv_get_device_name(dev));
    snprintf(out->node_guid, sizeof(out->node_guid), "%016" PRIx64,
             (uint64_t)be64toh(ibv_get_device_guid(dev)));

    ibctx = ibv_open_device(dev);
    if (ibctx == NULL) {
        kvf_warn("rdma device %s: open failed: %m", out->name);
        return;
    }
    if (ibv_query_device(ibctx, &dattr) != 0) {
        kvf_warn("rdma device %s: query failed: %m", out->name);
        goto out_close;
    }
    out->port_count = dattr.phys_port_cnt;
    for (p = 1; (p <= dattr.phys_port_cnt) && (p <= KVF_VERBS_PORTS_MAX); p++) {
        kvf_verbs_port_t *port = &out->ports[p - 1];

        port->num = (uint8_t)p;
        if (ibv_query_port(ibctx, (uint8_t)p, &pattr) != 0) {
            kvf_warn("rdma device %s port %u: query failed: %m", out->name, p);
            snprintf(port->state, sizeof(port->state), "unknown");
            snprintf(port->link_layer, sizeof(port->link_layer), "unknown");
            continue;
        }
        snprintf(port->state, sizeof(port->state), "%s",
                 kvf_verbs_port_state_str(pattr.state));
        snprintf(port->link_layer, sizeof(port->link_layer), "%s",
                 kvf_verbs_link_layer_str(pattr.link_layer));
        port->active_mtu = 128u << (unsigned)pattr.active_mtu;
    }
out_close:
    ibv_close_device(ibctx);
}

kvf_status_t kvf_verbs_list_devices(kvf_verbs_device_t **devs_p,
                                    unsigned *count_p)
{
    struct ibv_device **list;
    kvf_verbs_device_t *devs;
    int num = 0;
    int i;

    if ((devs_p == NULL) || (count_p == NULL)) {
        return KVF_ERR_INVALID;
    }
    list = ibv_get_device_list(&num);
    if ((list == NULL) || (num <= 0)) {
        /* no driver, no device, or no permission: all mean none usable */
        if (list != NULL) {
            ibv_free_device_list(list);
        }
        *devs_p  = NULL;
        *count_p = 0;
        return KVF_OK;
    }
    devs = calloc((size_t)num, sizeof(*devs));
    if (devs == NULL) {
        ibv_free_device_list(list);
        return KVF_ERR_NO_MEMORY;
    }
    for (i = 0; i < num; i++) {
        kvf_verbs_device_query(list[i], &devs[i]);
    }
    ibv_free_device_list(list);
    *devs_p  = devs;
    *count_p = (unsigned)num;
    return KVF_OK;
}

void kvf_verbs_devices_free(kvf_verbs_device_t *devs)
{
    free(devs);
}

void kvf_verbs_devices_print(FILE *out, const kvf_verbs_device_t *devs,
                             unsigned count)
{
    unsigned d;
    unsigned p;

    if (count == 0) {
        fprintf(out, "%s\n", KVF_VERBS_NONE_SENTENCE);
        return;
    }
    for (d = 0; d < count; d++) {
        fprintf(out, "%s guid %s ports %u\n", devs[d].name, devs[d].node_guid,
                devs[d].port_count);
        for (p = 0; (p < devs[d].port_count) && (p < KVF_VERBS_PORTS_MAX);
             p++) {
            fprintf(out, "  %s:%u %s %s mtu %u\n", devs[d].name,
                    devs[d].ports[p].num, devs[d].ports[p].link_layer,
                    devs[d].ports[p].state, devs[d].ports[p].active_mtu);
        }
    }
}
