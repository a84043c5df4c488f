/* SPDX-License-Identifier: Apache-2.0 */
/* Copyright (c) 2026 The kvfabric authors */
#include "controller/resign.h"

#include "controller/node.h"
#include "controller/server_int.h"
#include "common/log.h"
#include "common/time.h"

#include <event2/event.h>

#include <stdlib.h>

struct kvf_resign {
    kvf_server_t *server;
    struct event_base *base;
    struct event *timer;
    uint32_t most_up; /* most agents up at once since elected */
    uint64_t expired; /* lease expiries counted while some were up */
    bool happened;
};

static void kvf_resign_on_timer(evutil_socket_t fd, short what, void *arg)
{
    kvf_resign_t *resign = arg;
    uint32_t alive, draining, dead;

    (void)fd;
    (void)what;
    kvf_node_table_census(resign->server->nodes, &alive, &draining, &dead);
    if (alive + draining > resign->most_up) {
        resign->most_up = alive + draining;
    }
    if (alive + draining > 0) {
        resign->expired = kvf_node_table_expired(resign->server->nodes);
        return;
    }
    /* lost means a lease ran out: agents that deregistered (a rolling
     * restart, a clean stop) left, and a standby would see the same */
    if ((resign->most_up == 0) || resign->happened ||
        (kvf_node_table_expired(resign->server->nodes) == resign->expired)) {
        return;
    }
    kvf_warn("etcd: lost every agent (%u were up): resigning, so that a "
             "standby the agents reach takes over",
             resign->most_up);
    resign->happened = true;
    event_base_loopbreak(resign->base);
}

kvf_status_t kvf_resign_create(kvf_server_t *server, struct event_base *base,
                               uint64_t interval_ns, kvf_resign_t **resign_p)
{
    struct timeval tv = {(time_t)(interval_ns / KVF_NSEC_PER_SEC),
                         (suseconds_t)(interval_ns % KVF_NSEC_PER_SEC / 1000)};
    kvf_resign_t *resign;

    resign = calloc(1, sizeof(*resign));
    if (resign == NULL) {
        return KVF_ERR_NO_MEMORY;
    }
    resign->server = server;
    resign->base   = base;
    resign->timer =
        event_new(base, -1, EV_PERSIST, kvf_resign_on_timer, resign);
    if ((resign->timer == NULL) || (event_add(resign->timer, &tv) != 0)) {
        kvf_resign_destroy(resign);
        return KVF_ERR_NO_MEMORY;
    }
    *resign_p = resign;
    return KVF_OK;
}

void kvf_resign_destroy(kvf_resign_t *resign)
{
    if (resign == NULL) {
        return;
    }
    if (resign->timer != NULL) {
        event_free(resign->timer);
    }
    free(resign);
}

bool kvf_resign_happened(const kvf_resign_t *resign)
{
    return (resign != NULL) && resign->happened;
}
