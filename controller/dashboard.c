/* SPDX-License-Identifier: Apache-2.0 */
/* Copyright (c) 2026 The kvfabric authors */
#include "controller/dashboard.h"

#include <event2/buffer.h>
#include <event2/http.h>

void kvf_dashboard_serve(struct evhttp_request *req, void *arg)
{
    struct evkeyvalq *h = evhttp_request_get_output_headers(req);
    struct evbuffer *b  = evbuffer_new();

    if (b == NULL) {
        evhttp_send_error(req, HTTP_INTERNAL, NULL);
        return;
    }
    /* static bytes: referenced, not copied */
    evbuffer_add_reference(b, kvf_dashboard_html, kvf_dashboard_html_len, NULL,
                           NULL);
    evhttp_add_header(h, "Content-Type", "text/html; charset=utf-8");
    /* the page is small and changes with the binary: always revalidate */
    evhttp_add_header(h, "Cache-Control", "no-cache");
    evhttp_add_header(h, "Content-Security-Policy", kvf_dashboard_html_csp);
    evhttp_add_header(h, "X-Content-Type-Options", "nosniff");
    evhttp_add_header(h, "X-Frame-Options", "DENY");
    evhttp_add_header(h, "Referrer-Policy", "no-referrer");
    evhttp_send_reply(req, HTTP_OK, "OK", b);
    evbuffer_free(b);
}
