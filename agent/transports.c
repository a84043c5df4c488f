/* SPDX-License-Identifier: Apache-2.0 */
/* Copyright (c) 2026 The kvfabric authors */
#include "agent/transports.h"

#include "common/log.h"

#include <ctype.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Distinct transport names kvf_transports_summary keeps (UCX has about 20
 * transports), and the longest name kept whole. */
#define KVF_TRANSPORTS_NAMES_MAX 32
#define KVF_TRANSPORTS_NAME_MAX  32

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

static bool kvf_transports_check_slow(kvf_transports_t *t, kvf_ucx_ep_t *ep,
                                      uint32_t node_id, const char *name);

bool kvf_transports_check(kvf_transports_t *t, kvf_ucx_ep_t *ep,
                          uint32_t node_id, const char *name)
{
    if ((ep == t->last_ep) && (node_id == t->last_node) && (ep != NULL)) {
        t->peers[t->last_row].uses++;
        if (!t->last_ok) {
            t->refused++;
        }
        return t->last_ok;
    }
    t->last_ok   = kvf_transports_check_slow(t, ep, node_id, name);
    t->last_ep   = ep;
    t->last_node = node_id;
    return t->last_ok;
}

static bool kvf_transports_check_slow(kvf_transports_t *t, kvf_ucx_ep_t *ep,
                                      uint32_t node_id, const char *name)
{
    kvf_transports_peer_t *row =
        kvf_transports_row(t, node_id, name, kvf_ucx_ep_peer(ep));
    char used[96];
    bool ok;

    row->uses++;
    t->last_row = (uint32_t)(row - t->peers);
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

static int kvf_transports_name_cmp(const void *a, const void *b)
{
    return strcmp(a, b);
}

/* Adds the name of @p len bytes at @p p to @p names unless it is there. */
static void kvf_transports_name_add(char (*names)[KVF_TRANSPORTS_NAME_MAX],
                                    uint32_t *num_p, const char *p, size_t len)
{
    uint32_t i;

    if ((len == 0) || (len >= KVF_TRANSPORTS_NAME_MAX)) {
        return; /* UCX names no transport so long: not one */
    }
    for (i = 0; i < *num_p; i++) {
        if ((strlen(names[i]) == len) && (memcmp(names[i], p, len) == 0)) {
            return;
        }
    }
    if (*num_p == KVF_TRANSPORTS_NAMES_MAX) {
        return;
    }
    memcpy(names[*num_p], p, len);
    names[*num_p][len] = '\0';
    (*num_p)++;
}

void kvf_transports_age(kvf_transports_t *t)
{
    kvf_transports_peer_t *row;
    uint32_t i;

    for (i = 0; i < t->num_peers; i++) {
        row = &t->peers[i];
        if (row->uses != row->uses_aged) {
            row->uses_aged = row->uses;
            row->idle      = 0;
        } else if (row->idle < KVF_TRANSPORTS_IDLE_MAX) {
            row->idle++;
        }
    }
}

void kvf_transports_summary(const kvf_transports_t *t, char *buf, size_t len)
{
    char names[KVF_TRANSPORTS_NAMES_MAX][KVF_TRANSPORTS_NAME_MAX];
    uint32_t num = 0, i;
    size_t used  = 0;

    if (len == 0) {
        return;
    }
    buf[0] = '\0';
    /* "rc_mlx5/mlx5_0:1,tcp/eth0": the names before each '/' */
    for (i = 0; i < t->num_peers; i++) {
        const char *p = t->peers[i].transports;

        if (t->peers[i].idle >= KVF_TRANSPORTS_IDLE_MAX) {
            continue; /* gone quiet */
        }
        while (*p != '\0') {
            size_t tok = strcspn(p, ",");

            kvf_transports_name_add(names, &num, p, strcspn(p, "/,"));
            p += tok;
            if (*p == ',') {
                p++;
            }
        }
    }
    qsort(names, num, sizeof(names[0]), kvf_transports_name_cmp);
    for (i = 0; i < num; i++) {
        size_t need = ((used > 0) ? 1 : 0) + strlen(names[i]);
        /* room for ",+" behind it unless it is the last name */
        size_t keep = (i + 1 < num) ? 2 : 0;

        if (used + need + keep >= len) {
            snprintf(buf + used, len - used, "%s", (used > 0) ? ",+" : "+");
            return;
        }
        snprintf(buf + used, len - used, "%s%s", (used > 0) ? "," : "",
                 names[i]);
        used += need;
    }
}
