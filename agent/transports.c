/* SPDX-License-Identifier: Apache-2.0 */
/* Copyright (c) 2026 The kvfabric authors */
#include "agent/transports.h"

#include "common/log.h"

#include <ctype.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

void kvf_transports_init(kvf_transports_t *t, const char *agent,
                         const char *expect)
{
    memset(t, 0, sizeof(*t));
    snprintf(t->agent, sizeof(t->agent), "%s",
             (agent != NULL) ? agent : "agent");
    snprintf(t->expect, sizeof(t->expect), "%s",
             (expect != NULL) ? expect : "");
    if (t->expect[0] != '\0') {
        kvf_info("%s: expect_transports [%s]: peers over anything else are "
                 "refused",
                 t->agent, t->expect);
    }
}

static kvf_transports_peer_t *kvf_transports_row(kvf_transports_t *t,
                                                 uint32_t node_id,
                                                 const char *name,
                                                 const char *address)
{
    kvf_transports_peer_t *row;
    char label[64];
    uint32_t i;
    size_t k;

    if (((name == NULL) || (name[0] == '\0')) && (node_id == 0)) {
        name = address; /* a PD sender says no name */
    }
    if ((name != NULL) && (name[0] != '\0')) {
        for (k = 0; (k < sizeof(label) - 1) && (name[k] != '\0'); k++) {
            label[k] = (isalnum((unsigned char)name[k]) || (name[k] == '.') ||
                        (name[k] == '_') || (name[k] == '-'))
                           ? name[k]
                           : '_';
        }
        label[k] = '\0';
    } else {
        snprintf(label, sizeof(label), "node-%" PRIu32, node_id);
    }
    for (i = 0; i < t->num_peers; i++) {
        if (strcmp(t->peers[i].name, label) == 0) {
            return &t->peers[i];
        }
    }
    if (t->num_peers == KVF_TRANSPORTS_PEERS_MAX) {
        row = &t->peers[KVF_TRANSPORTS_PEERS_MAX - 1];
        snprintf(row->name, sizeof(row->name), "other");
        return row;
    }
    row = &t->peers[t->num_peers++];
    memset(row, 0, sizeof(*row));
    snprintf(row->name, sizeof(row->name), "%s", label);
    return row;
}

bool kvf_transports_check(kvf_transports_t *t, kvf_ucx_ep_t *ep,
                          uint32_t node_id, const char *name)
{
    kvf_transports_peer_t *row =
        kvf_transports_row(t, node_id, name, kvf_ucx_ep_peer(ep));
    char used[96];
    bool ok;

    (void)kvf_ucx_ep_transports(ep, used, sizeof(used));
    ok = kvf_ucx_transports_match(used, t->expect);
    snprintf(t->last, sizeof(t->last), "%s", (used[0] != '\0') ? used : "?");
    if ((strcmp(row->transports, used) != 0) || (row->refused != !ok)) {
        snprintf(row->transports, sizeof(row->transports), "%s", used);
        row->refused = !ok;
        if (ok) {
            kvf_info("%s: peer %s (%s) over %s", t->agent, row->name,
                     kvf_ucx_ep_peer(ep), (used[0] != '\0') ? used : "?");
        } else {
            kvf_error("%s: refusing peer %s (%s): its connection runs over "
                      "%s, not one of expect_transports [%s] (a silent "
                      "fallback? check UCX_TLS, UCX_NET_DEVICES and the "
                      "fabric)",
                      t->agent, row->name, kvf_ucx_ep_peer(ep),
                      (used[0] != '\0') ? used : "nothing UCX would name",
                      t->expect);
        }
    }
    if (!ok) {
        t->refused++;
    }
    return ok;
}

const char *kvf_transports_last(const kvf_transports_t *t)
{
    return t->last;
}
