/* SPDX-License-Identifier: Apache-2.0 */
/* Copyright (c) 2026 The kvfabric authors */
/*
 * The controller's dashboard in a real browser: a controller, a prefill and
 * a decode agent, a small engine workload through both (so the second
 * fetches from the first), then the page at / loaded in headless Chromium.
 * The rendered DOM must hold the node table the page's script built from
 * /v1/nodes, with node names escaped. Skipped, with the reason, where
 * Chromium is not installed or cannot start.
 */
#include "tests/helpers/proc.h"
#include "tests/helpers/test_helpers.h"
#include "tests/integration/controller_harness.h"

#include <criterion/criterion.h>

#include <inttypes.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define AGENTS 2
#define BIG    (256u << 10)

typedef struct it_agent {
    kvf_test_proc_t proc;
    char sock[128];
    char http[64];
    char name[64];
    const char *role;
} it_agent_t;

static kvf_th_ctl_t g_ctl;
static it_agent_t g_agents[AGENTS];
static char g_bin[4096];
static char g_body[BIG];

static uint16_t port_of(const char *hostport)
{
    return (uint16_t)atoi(strrchr(hostport, ':') + 1);
}

static bool registered(const it_agent_t *a)
{
    char body[4096];

    return (kvf_test_http_get(port_of(a->http), "/healthz", body,
                              sizeof(body)) == 200) &&
           (strstr(body, "\"registered\":true") != NULL);
}

static void start_agent(int i, const char *name, const char *role)
{
    it_agent_t *a      = &g_agents[i];
    const char *argv[] = {
        g_bin,         "--controller", g_ctl.addr,     "--name",      a->name,
        "--role",      role,           "--socket",     a->sock,       "--http",
        a->http,       "--listen",     "127.0.0.1:0",  "--pool-size", "64M",
        "--max-chunk", "1M",           "--transports", "tcp",         NULL};
    int k;

    snprintf(a->name, sizeof(a->name), "%s", name);
    a->role = role;
    snprintf(a->sock, sizeof(a->sock), "/tmp/kvf-dash-it-%d-%d.sock",
             (int)getpid(), i);
    snprintf(a->http, sizeof(a->http), "127.0.0.1:%u", kvf_test_free_port());
    cr_assert_eq(kvf_test_proc_start(&a->proc, argv), 0);
    for (k = 0; (k < 2000) && !registered(a); k++) {
        poll(NULL, 0, 5);
    }
    cr_assert(registered(a), "agent %s did not register: %s", a->name,
              kvf_test_proc_log(&a->proc));
}

static void setup(void)
{
    snprintf(g_bin, sizeof(g_bin), "%s",
             kvf_test_build_path("agent/kvf-agent"));
    kvf_th_ctl_start(&g_ctl, NULL);
    start_agent(0, "dash-prefill-1", "prefill");
    /* markup in a name must reach the page as text */
    start_agent(1, "dash-<i>decode</i>-2", "decode");
}

static void teardown(void)
{
    int i;

    for (i = 0; i < AGENTS; i++) {
        kvf_test_proc_stop(&g_agents[i].proc, 10000);
    }
    kvf_th_ctl_stop(&g_ctl);
    kvf_test_check_leaks();
}

TestSuite(dashboard, .init = setup, .fini = teardown, .timeout = 180);

/* A small engine workload through agent @p i (Llama-shaped, tiny). */
static void run_engine(int i)
{
    const char *argv[] = {kvf_test_build_path("tools/kvf-demo-engine"),
                          "--socket",
                          g_agents[i].sock,
                          "--name",
                          "dash-engine",
                          "--layers",
                          "2",
                          "--kv-heads",
                          "2",
                          "--head-dim",
                          "64",
                          "--conversations",
                          "2",
                          "--turns",
                          "2",
                          NULL};
    char bin[4096];

    snprintf(bin, sizeof(bin), "%s", argv[0]);
    argv[0] = bin;
    cr_assert_eq(kvf_test_run(argv, g_body, sizeof(g_body), 120000), 0,
                 "kvf-demo-engine on %s: %s", g_agents[i].name, g_body);
}

/* Field @p field of node @p name in a /v1/nodes body; -1 when absent. */
static int64_t node_field(const char *body, const char *json_name,
                          const char *field)
{
    char needle[160];
    const char *node, *end, *at;

    snprintf(needle, sizeof(needle), "\"name\":\"%s\"", json_name);
    node = strstr(body, needle);
    if (node == NULL) {
        return -1;
    }
    end = strchr(node, '}');
    snprintf(needle, sizeof(needle), "\"%s\":", field);
    at = strstr(node, needle);
    if ((at == NULL) || ((end != NULL) && (at > end))) {
        return -1;
    }
    return strtoll(at + strlen(needle), NULL, 10);
}

/* Waits for the next heartbeats to bring the agents' counters. */
static void wait_for_traffic(void)
{
    uint16_t port = port_of(g_ctl.http);
    int k;

    for (k = 0; k < 1000; k++) {
        cr_assert_eq(
            kvf_test_http_get(port, "/v1/nodes", g_body, sizeof(g_body)), 200);
        if ((node_field(g_body, "dash-prefill-1", "served_bytes") > 0) &&
            (node_field(g_body, "dash-<i>decode</i>-2", "fetched_bytes") > 0)) {
            break;
        }
        poll(NULL, 0, 10);
    }
    cr_assert_gt(node_field(g_body, "dash-prefill-1", "lookup_chunks"), 0, "%s",
                 g_body);
    cr_assert_gt(node_field(g_body, "dash-prefill-1", "served_bytes"), 0, "%s",
                 g_body);
    cr_assert_gt(node_field(g_body, "dash-<i>decode</i>-2", "fetched_bytes"), 0,
                 "%s", g_body);
    cr_assert_gt(
        node_field(g_body, "dash-<i>decode</i>-2", "lookup_remote_chunks"), 0,
        "%s", g_body);
}

Test(dashboard, page_is_served_with_a_strict_policy)
{
    char url[160];
    const char *argv[] = {
        "/bin/sh", "-c", "exec curl -s -D - -o /dev/null \"$1\"",
        "sh",      url,  NULL};

    snprintf(url, sizeof(url), "http://%s/", g_ctl.http);
    cr_assert_eq(kvf_test_run(argv, g_body, sizeof(g_body), 30000), 0);
    cr_assert(strstr(g_body, "200 OK") != NULL, "%s", g_body);
    cr_assert(strstr(g_body, "Content-Type: text/html; charset=utf-8") != NULL,
              "%s", g_body);
    cr_assert(strstr(g_body, "Content-Security-Policy: default-src 'none'; "
                             "script-src 'sha256-") != NULL,
              "%s", g_body);
    cr_assert(strstr(g_body, "connect-src 'self'") != NULL, "%s", g_body);
    cr_assert(strstr(g_body, "unsafe-") == NULL, "%s", g_body);
    cr_assert(strstr(g_body, "Cache-Control: no-cache") != NULL, "%s", g_body);
    cr_assert(strstr(g_body, "X-Content-Type-Options: nosniff") != NULL, "%s",
              g_body);

    cr_assert_eq(kvf_test_http_get(port_of(g_ctl.http), "/dashboard", g_body,
                                   sizeof(g_body)),
                 200);
    cr_assert(strstr(g_body, "<table id=\"nodes\">") != NULL);
    cr_assert_eq(
        kvf_test_http_get(port_of(g_ctl.http), "/nope", g_body, sizeof(g_body)),
        404);
}

Test(dashboard, chromium_renders_the_node_table)
{
    char url[160], err[160], script[512];
    const char *argv[] = {"/bin/sh", "-c", script, "sh", url, err, NULL};
    const char *dom;
    int rc;

    run_engine(0);
    run_engine(1);
    wait_for_traffic();

    snprintf(url, sizeof(url), "http://%s/", g_ctl.http);
    snprintf(err, sizeof(err), "%s/chromium.err", g_ctl.dir);
    /* 200: not installed. A profile of its own: tests may run anywhere. */
    snprintf(script, sizeof(script),
             "b=$(command -v chromium || command -v chromium-browser) "
             "|| exit 200; exec \"$b\" --headless --no-sandbox --disable-gpu "
             "--no-first-run --user-data-dir=%s/chromium "
             "--virtual-time-budget=5000 --dump-dom \"$1\" 2>\"$2\"",
             g_ctl.dir);
    rc = kvf_test_run(argv, g_body, sizeof(g_body), 90000);
    if (rc == 200) {
        cr_skip_test("chromium is not installed (Debian package chromium); "
                     "the page was not rendered");
    }
    dom = g_body;
    if ((rc != 0) || (strstr(dom, "<html") == NULL)) {
        char tail[2048] = "";
        FILE *f         = fopen(err, "r");

        if (f != NULL) {
            size_t n = fread(tail, 1, sizeof(tail) - 1, f);
            tail[n]  = '\0';
            fclose(f);
        }
        cr_skip_test("chromium could not render here (exit %d): %s", rc, tail);
    }

    /* the script ran: rows built from /v1/nodes, the status updated */
    cr_assert(strstr(dom, "updated ") != NULL, "page never updated: %s", dom);
    cr_assert(strstr(dom, "<td class=\"name\">dash-prefill-1</td>"
                          "<td class=\"role\">prefill</td>") != NULL,
              "prefill row missing: %s", dom);
    cr_assert(strstr(dom, "<td class=\"name\">dash-&lt;i&gt;decode&lt;/i&gt;-2"
                          "</td><td class=\"role\">decode</td>") != NULL,
              "decode row missing or its name not escaped: %s", dom);
    cr_assert(strstr(dom, "<i>decode</i>-2</td>") == NULL,
              "a name became markup: %s", dom);
    cr_assert(strstr(dom, "<span class=\"state alive\">alive</span>") != NULL,
              "%s", dom);
    /* 64 MiB pools, some of them used; hit rates are percentages */
    cr_assert(strstr(dom, " / 64.0 MiB</td>") != NULL, "%s", dom);
    /* the decoder's PD receive region (64 MiB by default); none on the
     * prefill agent */
    cr_assert(strstr(dom, "<td class=\"pd\">\xe2\x80\x93</td>") != NULL, "%s",
              dom);
    cr_assert(strstr(dom, " / 64.0 MiB</td><td class=\"num\">") != NULL, "%s",
              dom);
    /* both tiers: these agents have no disk tier */
    cr_assert(strstr(dom, "<td class=\"disk\">\xe2\x80\x93</td>") != NULL, "%s",
              dom);
    cr_assert(strstr(dom, "<td class=\"num disk-keys\">0</td>") != NULL, "%s",
              dom);
    cr_assert(strstr(dom, "<div class=\"label\">Disk tier used</div>") != NULL,
              "%s", dom);
    cr_assert(strstr(dom, "<td class=\"num hit\"") != NULL, "%s", dom);
    cr_assert(strstr(dom, " %</td>") != NULL, "no hit rate shown: %s", dom);
    /* cluster totals */
    cr_assert(strstr(dom, "<div class=\"label\">Nodes alive</div>"
                          "<div class=\"value\">2</div>") != NULL,
              "%s", dom);
}
