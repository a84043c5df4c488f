/* SPDX-License-Identifier: Apache-2.0 */
/* Copyright (c) 2026 The kvfabric authors */
/*
 * RDMA device discovery through libibverbs, for `kvf-agent --list-devices`
 * and for choosing UCX_NET_DEVICES. Built from verbs.c when meson finds
 * libibverbs, else from verbs_stub.c (KVF_ERR_UNSUPPORTED).
 *
 * thread: thread-safe (no shared state).
 */
#ifndef KVF_TRANSPORT_VERBS_H
#define KVF_TRANSPORT_VERBS_H

#include <kvfabric/status.h>

#include <stdint.h>
#include <stdio.h>

#define KVF_VERBS_PORTS_MAX 8

typedef struct kvf_verbs_port {
    uint8_t num;         /**< port number, from 1 */
    char link_layer[16]; /**< "InfiniBand", "Ethernet" (RoCE), "unknown" */
    char state[16];      /**< "active", "down", "init", "armed"... */
    uint32_t active_mtu; /**< bytes */
} kvf_verbs_port_t;

typedef struct kvf_verbs_device {
    char name[64];       /**< "mlx5_0": UCX_NET_DEVICES takes "mlx5_0:1" */
    char node_guid[24];  /**< hex */
    unsigned port_count; /**< ports reported by the device */
    kvf_verbs_port_t ports[KVF_VERBS_PORTS_MAX]; /**< the first of them */
} kvf_verbs_device_t;

/**
 * Lists RDMA devices.
 *
 * @param [out] devs_p   array of *count_p devices (NULL when 0); free with
 *                       kvf_verbs_devices_free
 * @param [out] count_p  number of devices, 0 on a machine without RDMA
 * @return KVF_OK (also with none); KVF_ERR_NO_MEMORY; KVF_ERR_UNSUPPORTED
 *         when built without libibverbs
 */
kvf_status_t kvf_verbs_list_devices(kvf_verbs_device_t **devs_p,
                                    unsigned *count_p);

/** Frees a list from kvf_verbs_list_devices; NULL is a no-op. */
void kvf_verbs_devices_free(kvf_verbs_device_t *devs);

/**
 * Prints one line per device and port, or, with none, the sentence
 * KVF_VERBS_NONE_SENTENCE.
 */
void kvf_verbs_devices_print(FILE *out, const kvf_verbs_device_t *devs,
                             unsigned count);

#define KVF_VERBS_NONE_SENTENCE \
    "no RDMA devices found: UCX will use TCP and shared memory on this " \
    "machine"

#endif /* KVF_TRANSPORT_VERBS_H */
