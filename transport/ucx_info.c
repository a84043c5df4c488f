/* SPDX-License-Identifier: Apache-2.0 */
/* Copyright (c) 2026 The kvfabric authors */
/*
 * Which UCX transports and devices an endpoint really uses. UCX >= 1.14
 * answers ucp_ep_query(UCP_EP_ATTR_FIELD_TRANSPORTS); 1.13 only prints the
 * endpoint's configuration (ucp_ep_print_info), whose lane lines read
 *   lane[0]:  1:tcp/lo.0 md[1]  -> md[1]/tcp/sysdev[255] am am_bw#0
 * and the resource after "N:" is what we report ("tcp/lo").
 */
#include "transport/ucx_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Appends "tl/dev" to @p buf (comma-separated) unless it is there. */
static void kvf_ucx_info_add(char *buf, size_t len, const char *tl,
                             size_t tl_len, const char *dev, size_t dev_len)
{
    char item[128];
    size_t used = strlen(buf), n;
    const char *p;

    n = (size_t)snprintf(item, sizeof(item), "%.*s/%.*s", (int)tl_len, tl,
                         (int)dev_len, dev);
    if (n >= sizeof(item)) {
        return;
    }
    for (p = strstr(buf, item); p != NULL; p = strstr(p + 1, item)) {
        if (((p == buf) || (p[-1] == ',')) &&
            ((p[n] == '\0') || (p[n] == ','))) {
            return; /* listed already */
        }
    }
    if (used + n + 2 > len) {
        return;
    }
    snprintf(buf + used, len - used, "%s%s", (used > 0) ? "," : "", item);
}

#if UCP_API_VERSION >= UCP_VERSION(1, 14)
static bool kvf_ucx_info_query(ucp_ep_h ucp_ep, char *buf, size_t len)
{
    ucp_transport_entry_t entries[16];
    ucp_ep_attr_t attr;
    unsigned i;

    memset(&attr, 0, sizeof(attr));
    attr.field_mask             = UCP_EP_ATTR_FIELD_TRANSPORTS;
    attr.transports.entries     = entries;
    attr.transports.num_entries = 16;
    attr.transports.entry_size  = sizeof(entries[0]);
    if (ucp_ep_query(ucp_ep, &attr) != UCS_OK) {
        return false;
    }
    for (i = 0; i < attr.transports.num_entries; i++) {
        const char *tl  = entries[i].transport_name;
        const char *dev = entries[i].device_name;

        /* UCX 1.22 also lists the connection manager's entry ("tcp" with
         * an empty device), which carries no data: skipped */
        if ((tl != NULL) && (dev != NULL) && (tl[0] != '\0') &&
            (dev[0] != '\0')) {
            kvf_ucx_info_add(buf, len, tl, strlen(tl), dev, strlen(dev));
        }
    }
    return buf[0] != '\0';
}
#endif

/* Parses ucp_ep_print_info's lane lines (UCX 1.13). */
static void kvf_ucx_info_print(ucp_ep_h ucp_ep, char *buf, size_t len)
{
    char *text = NULL, *line, *save = NULL;
    size_t text_len = 0;
    FILE *f         = open_memstream(&text, &text_len);

    if (f == NULL) {
        return;
    }
    ucp_ep_print_info(ucp_ep, f);
    fclose(f);
    for (line = strtok_r(text, "\n", &save); line != NULL;
         line = strtok_r(NULL, "\n", &save)) {
        const char *p = strstr(line, "lane["), *slash, *colon, *end;
        size_t tok;

        if ((p == NULL) || ((p = strstr(p, "]:")) == NULL)) {
            continue;
        }
        p += 2;
        p += strspn(p, " \t");
        tok   = strcspn(p, " \t");
        colon = memchr(p, ':', tok);
        if ((colon != NULL) && (colon - p < 4)) {
            tok -= (size_t)(colon + 1 - p); /* drop the resource index */
            p = colon + 1;
        }
        slash = memchr(p, '/', tok);
        if (slash == NULL) {
            continue;
        }
        end = p + tok;
        /* "lo.0": the device is "lo" (the suffix is UCX's port number) */
        {
            const char *dot = memchr(slash, '.', (size_t)(end - slash));

            if ((dot != NULL) &&
                (strspn(dot + 1, "0123456789") == (size_t)(end - dot - 1))) {
                end = dot;
            }
        }
        kvf_ucx_info_add(buf, len, p, (size_t)(slash - p), slash + 1,
                         (size_t)(end - slash - 1));
    }
    free(text);
}

kvf_status_t kvf_ucx_ep_transports(kvf_ucx_ep_t *ep, char *buf, size_t len)
{
    if (len == 0) {
        return KVF_ERR_INVALID;
    }
    buf[0] = '\0';
    if ((ep == NULL) || (ep->ucp_ep == NULL) || ep->is_failed) {
        return KVF_ERR_CLOSED;
    }
    if (ep->transports[0] == '\0') {
        /* asked once per endpoint: lanes do not change after wireup */
#if UCP_API_VERSION >= UCP_VERSION(1, 14)
        if (!kvf_ucx_info_query(ep->ucp_ep, ep->transports,
                                sizeof(ep->transports)))
#endif
        {
            kvf_ucx_info_print(ep->ucp_ep, ep->transports,
                               sizeof(ep->transports));
        }
    }
    snprintf(buf, len, "%s", ep->transports);
    return (buf[0] != '\0') ? KVF_OK : KVF_ERR_NOT_FOUND;
}

bool kvf_ucx_transports_match(const char *used, const char *expect)
{
    const char *u = used;

    if ((expect == NULL) || (expect[0] == '\0')) {
        return true;
    }
    if ((used == NULL) || (used[0] == '\0')) {
        return false;
    }
    /* every transport in use must be expected: "rc" covers rc_verbs and
     * rc_mlx5 (a name, then "_" or the end); "sm" covers UCX's shared
     * memory transports */
    while (*u != '\0') {
        size_t ul     = strcspn(u, "/,");
        const char *e = expect;
        bool ok       = false;

        while ((*e != '\0') && !ok) {
            size_t el = strcspn(e, ",");

            if ((el > 0) && (el <= ul) && (strncmp(u, e, el) == 0) &&
                ((el == ul) || (u[el] == '_'))) {
                ok = true;
            } else if ((el == 2) && (strncmp(e, "sm", 2) == 0) &&
                       (((ul == 5) && (strncmp(u, "posix", 5) == 0)) ||
                        ((ul == 4) && (strncmp(u, "sysv", 4) == 0)) ||
                        ((ul == 3) && (strncmp(u, "cma", 3) == 0)) ||
                        ((ul == 5) && (strncmp(u, "xpmem", 5) == 0)) ||
                        ((ul == 4) && (strncmp(u, "knem", 4) == 0)))) {
                ok = true;
            }
            e += el;
            e += (*e == ',') ? 1 : 0;
        }
        if (!ok) {
            return false;
        }
        u += strcspn(u, ",");
        u += (*u == ',') ? 1 : 0;
    }
    return true;
}
