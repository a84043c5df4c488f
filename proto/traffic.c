/* SPDX-License-Identifier: Apache-2.0 */
/* Copyright (c) 2026 The kvfabric authors */
#include "proto/traffic.h"

void kvf_traffic_to_msg(const kvf_traffic_t *t, Kvf__NodeTraffic *msg)
{
    kvf__node_traffic__init(msg);
    msg->lookup_chunks           = t->lookup_chunks;
    msg->lookup_local_chunks     = t->lookup_local_chunks;
    msg->lookup_remote_chunks    = t->lookup_remote_chunks;
    msg->fetched_chunks          = t->fetched_chunks;
    msg->fetched_bytes           = t->fetched_bytes;
    msg->served_chunks           = t->served_chunks;
    msg->served_bytes            = t->served_bytes;
    msg->served_from_disk_chunks = t->served_from_disk_chunks;
}

void kvf_traffic_from_msg(const Kvf__NodeTraffic *msg, kvf_traffic_t *t)
{
    t->lookup_chunks           = msg->lookup_chunks;
    t->lookup_local_chunks     = msg->lookup_local_chunks;
    t->lookup_remote_chunks    = msg->lookup_remote_chunks;
    t->fetched_chunks          = msg->fetched_chunks;
    t->fetched_bytes           = msg->fetched_bytes;
    t->served_chunks           = msg->served_chunks;
    t->served_bytes            = msg->served_bytes;
    t->served_from_disk_chunks = msg->served_from_disk_chunks;
}
