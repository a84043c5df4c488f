/* SPDX-License-Identifier: Apache-2.0 */
/* Copyright (c) 2026 The kvfabric authors */
/*
 * The Prometheus text exposition format (version 0.0.4) into a libevent
 * buffer: the one writer of both daemons' /metrics. A family is its
 * "# HELP" and "# TYPE" lines; its samples follow, with at most one
 * label, whose value is escaped ('\\', '"', newline). Part of the
 * kvf_listen library (the daemons' libevent helpers).
 *
 * thread: the buffer's owner.
 */
#ifndef KVF_COMMON_PROM_H
#define KVF_COMMON_PROM_H

#include <stddef.h>
#include <stdint.h>

struct evbuffer;

/* The Content-Type of a /metrics answer. */
#define KVF_PROM_CONTENT_TYPE "text/plain; version=0.0.4"

typedef enum kvf_prom_type {
    KVF_PROM_COUNTER,
    KVF_PROM_GAUGE,
    KVF_PROM_HISTOGRAM,
} kvf_prom_type_t;

/**
 * Starts the family @p name: "# HELP name help" (left out when @p help is
 * NULL) and "# TYPE name type".
 */
void kvf_prom_family(struct evbuffer *b, const char *name, kvf_prom_type_t type,
                     const char *help);

/** A label value as the format wants it: '\\', '"' and newline escaped
 * (for samples with several labels). */
void kvf_prom_add_escaped(struct evbuffer *b, const char *s);

/**
 * One sample: "name v", or "name{label="value"} v" when @p label is not
 * NULL (@p value escaped).
 */
void kvf_prom_sample(struct evbuffer *b, const char *name, const char *label,
                     const char *value, uint64_t v);

/** A family of one unlabelled sample. */
void kvf_prom_metric(struct evbuffer *b, const char *name, kvf_prom_type_t type,
                     const char *help, uint64_t v);

/**
 * A family of @p n samples labelled @p label = @p values[i], valued
 * @p v[i].
 */
void kvf_prom_metric_by(struct evbuffer *b, const char *name,
                        kvf_prom_type_t type, const char *help,
                        const char *label, size_t n, const char *const *values,
                        const uint64_t *v);

/** A latency histogram, in seconds on the wire. */
typedef struct kvf_prom_hist {
    const uint64_t *bounds_us; /* [n] upper bounds, increasing */
    const uint64_t *counts;    /* [n] per bucket, not cumulative */
    size_t n;
    uint64_t count; /* all observations (those above the last bound too) */
    double sum_s;   /* their sum */
} kvf_prom_hist_t;

/**
 * A histogram family: cumulative "name_bucket{le="..."}" lines, then
 * le="+Inf" (@p h->count), "name_sum" and "name_count".
 */
void kvf_prom_histogram(struct evbuffer *b, const char *name, const char *help,
                        const kvf_prom_hist_t *h);

#endif
