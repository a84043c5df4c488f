/* SPDX-License-Identifier: Apache-2.0 */
/* Copyright (c) 2026 The kvfabric authors */
#include "common/prom.h"

#include <event2/buffer.h>

#include <inttypes.h>
#include <string.h>

static const char *kvf_prom_type_name(kvf_prom_type_t type)
{
    switch (type) {
    case KVF_PROM_COUNTER:
        return "counter";
    case KVF_PROM_GAUGE:
        return "gauge";
    case KVF_PROM_HISTOGRAM:
        return "histogram";
    }
    return "untyped";
}

void kvf_prom_add_escaped(struct evbuffer *b, const char *s)
{
    while (*s != '\0') {
        size_t n = strcspn(s, "\\\"\n");

        evbuffer_add(b, s, n);
        s += n;
        if (*s == '\0') {
            break;
        }
        evbuffer_add(b,
                     (*s == '\n')  ? "\\n"
                     : (*s == '"') ? "\\\""
                                   : "\\\\",
                     2);
        s++;
    }
}

void kvf_prom_family(struct evbuffer *b, const char *name, kvf_prom_type_t type,
                     const char *help)
{
    if (help != NULL) {
        evbuffer_add_printf(b, "# HELP %s ", name);
        /* HELP text escapes '\\' and newline */
        while (*help != '\0') {
            size_t n = strcspn(help, "\\\n");

            evbuffer_add(b, help, n);
            help += n;
            if (*help == '\0') {
                break;
            }
            evbuffer_add(b, (*help == '\n') ? "\\n" : "\\\\", 2);
            help++;
        }
        evbuffer_add(b, "\n", 1);
    }
    evbuffer_add_printf(b, "# TYPE %s %s\n", name, kvf_prom_type_name(type));
}

void kvf_prom_sample(struct evbuffer *b, const char *name, const char *label,
                     const char *value, uint64_t v)
{
    if (label == NULL) {
        evbuffer_add_printf(b, "%s %" PRIu64 "\n", name, v);
        return;
    }
    evbuffer_add_printf(b, "%s{%s=\"", name, label);
    kvf_prom_add_escaped(b, value);
    evbuffer_add_printf(b, "\"} %" PRIu64 "\n", v);
}

void kvf_prom_metric(struct evbuffer *b, const char *name, kvf_prom_type_t type,
                     const char *help, uint64_t v)
{
    kvf_prom_family(b, name, type, help);
    kvf_prom_sample(b, name, NULL, NULL, v);
}

void kvf_prom_metric_by(struct evbuffer *b, const char *name,
                        kvf_prom_type_t type, const char *help,
                        const char *label, size_t n, const char *const *values,
                        const uint64_t *v)
{
    size_t i;

    kvf_prom_family(b, name, type, help);
    for (i = 0; i < n; i++) {
        kvf_prom_sample(b, name, label, values[i], v[i]);
    }
}

void kvf_prom_histogram(struct evbuffer *b, const char *name, const char *help,
                        const kvf_prom_hist_t *h)
{
    uint64_t cum = 0;
    size_t i;

    kvf_prom_family(b, name, KVF_PROM_HISTOGRAM, help);
    for (i = 0; i < h->n; i++) {
        cum += h->counts[i];
        evbuffer_add_printf(b, "%s_bucket{le=\"%g\"} %" PRIu64 "\n", name,
                            (double)h->bounds_us[i] / 1e6, cum);
    }
    evbuffer_add_printf(b,
                        "%s_bucket{le=\"+Inf\"} %" PRIu64 "\n"
                        "%s_sum %.9f\n"
                        "%s_count %" PRIu64 "\n",
                        name, h->count, name, h->sum_s, name, h->count);
}
