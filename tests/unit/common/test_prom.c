/* SPDX-License-Identifier: Apache-2.0 */
/* Copyright (c) 2026 The kvfabric authors */
/*
 * common/prom.c: the Prometheus text both daemons' /metrics write:
 * families, escaped label values and help, cumulative histograms.
 */
#include "common/prom.h"

#include <criterion/criterion.h>

#include <event2/buffer.h>

#include <stdlib.h>
#include <string.h>

/* The buffer's text, NUL-terminated (the caller frees it). */
static char *text_of(struct evbuffer *b)
{
    size_t len = evbuffer_get_length(b);
    char *s    = malloc(len + 1);

    cr_assert_not_null(s);
    evbuffer_remove(b, s, len);
    s[len] = '\0';
    return s;
}

static struct evbuffer *g_b;

static void setup(void)
{
    g_b = evbuffer_new();
    cr_assert_not_null(g_b);
}

static void teardown(void)
{
    evbuffer_free(g_b);
}

TestSuite(prom, .init = setup, .fini = teardown);

Test(prom, metric_is_help_type_and_one_sample)
{
    char *s;

    kvf_prom_metric(g_b, "kvf_x_total", KVF_PROM_COUNTER, "things done", 42);
    kvf_prom_metric(g_b, "kvf_y", KVF_PROM_GAUGE, NULL, 0);
    s = text_of(g_b);
    cr_assert_str_eq(s, "# HELP kvf_x_total things done\n"
                        "# TYPE kvf_x_total counter\n"
                        "kvf_x_total 42\n"
                        "# TYPE kvf_y gauge\n"
                        "kvf_y 0\n");
    free(s);
}

Test(prom, label_values_and_help_are_escaped)
{
    char *s;

    kvf_prom_family(g_b, "kvf_p", KVF_PROM_COUNTER, "a \\ b\nc");
    kvf_prom_sample(g_b, "kvf_p", "peer", "n\"a\\m\ne", 7);
    kvf_prom_sample(g_b, "kvf_p", "peer", "", 8);
    s = text_of(g_b);
    cr_assert_str_eq(s, "# HELP kvf_p a \\\\ b\\nc\n"
                        "# TYPE kvf_p counter\n"
                        "kvf_p{peer=\"n\\\"a\\\\m\\ne\"} 7\n"
                        "kvf_p{peer=\"\"} 8\n");
    free(s);
}

Test(prom, metric_by_writes_one_sample_per_value)
{
    static const char *const states[] = {"alive", "dead"};
    static const uint64_t v[]         = {3, 1};
    char *s;

    kvf_prom_metric_by(g_b, "kvf_nodes", KVF_PROM_GAUGE, "nodes", "state", 2,
                       states, v);
    s = text_of(g_b);
    cr_assert_str_eq(s, "# HELP kvf_nodes nodes\n"
                        "# TYPE kvf_nodes gauge\n"
                        "kvf_nodes{state=\"alive\"} 3\n"
                        "kvf_nodes{state=\"dead\"} 1\n");
    free(s);
}

Test(prom, histogram_buckets_are_cumulative_in_seconds)
{
    static const uint64_t bounds[] = {1, 500, 1000000};
    static const uint64_t counts[] = {2, 0, 3};
    kvf_prom_hist_t h              = {.bounds_us = bounds,
                                      .counts    = counts,
                                      .n         = 3,
                                      .count     = 6, /* one above 1 s */
                                      .sum_s     = 2.5};
    char *s;

    kvf_prom_histogram(g_b, "kvf_lat_seconds", "latency", &h);
    s = text_of(g_b);
    cr_assert_str_eq(s, "# HELP kvf_lat_seconds latency\n"
                        "# TYPE kvf_lat_seconds histogram\n"
                        "kvf_lat_seconds_bucket{le=\"1e-06\"} 2\n"
                        "kvf_lat_seconds_bucket{le=\"0.0005\"} 2\n"
                        "kvf_lat_seconds_bucket{le=\"1\"} 5\n"
                        "kvf_lat_seconds_bucket{le=\"+Inf\"} 6\n"
                        "kvf_lat_seconds_sum 2.500000000\n"
                        "kvf_lat_seconds_count 6\n");
    free(s);
}
