/* SPDX-License-Identifier: Apache-2.0 */
/* Copyright (c) 2026 The kvfabric authors */
/*
 * The controller's dashboard: one static page (controller/dashboard.html,
 * embedded at build time by tools/embed-html.py) that polls /v1/nodes and
 * /v1/stats from the browser. The controller only serves bytes.
 *
 * thread: the HTTP loop only.
 */
#ifndef KVF_CONTROLLER_DASHBOARD_H
#define KVF_CONTROLLER_DASHBOARD_H

#include <stddef.h>

struct evhttp_request;

/* Generated: the page, its length, and its Content-Security-Policy. */
extern const unsigned char kvf_dashboard_html[];
extern const size_t kvf_dashboard_html_len;
extern const char kvf_dashboard_html_csp[];

/* evhttp callback for GET / and /dashboard; @p arg is unused. */
void kvf_dashboard_serve(struct evhttp_request *req, void *arg);

#endif /* KVF_CONTROLLER_DASHBOARD_H */
