/* SPDX-License-Identifier: Apache-2.0 */
/* Copyright (c) 2026 The kvfabric authors */
#include "tests/helpers/test_helpers.h"
#include "tests/integration/controller_harness.h"

#include <criterion/criterion.h>

#include <stdio.h>
#include <string.h>

static kvf_th_ctl_t g_ctl;
static char g_out[1 << 16];

static void kvfctl_teardown(void)
{
    if (g_ctl.pid > 0) {
        kvf_th_ctl_stop(&g_ctl);
    }
    kvf_test_check_leaks();
}

TestSuite(kvfctl, .fini = kvfctl_teardown, .timeout = 60);

#define KVFCTL(...) \
    kvf_th_run(g_out, sizeof(g_out), "%s --controller %s " __VA_ARGS__)

static const char *kvfctl_path(void)
{
    static char path[1024];

    snprintf(path, sizeof(path), "%s", kvf_th_build_path("tools/kvfctl"));
    return path;
}

Test(kvfctl, commands_tables_and_json)
{
    const char *args[] = {"--recovery-window", "0", NULL};
    kvf_ctlconn_t *a;
    uint32_t na;
    char key0[KVF_KEY_STR_SIZE], key9[KVF_KEY_STR_SIZE];
    kvf_key_t k0 = {.ns = 1, .hi = 7, .lo = 0},
              k9 = {.ns = 1, .hi = 7, .lo = 9};
    const char *ctl;

    kvf_th_ctl_start(&g_ctl, args);
    ctl = kvfctl_path();
    a   = kvf_th_connect(&g_ctl, KVF__PEER_KIND__PEER_AGENT);
    na  = kvf_th_register(a, "gpu0", 1, NULL);
    cr_assert_eq(kvf_th_batch(a, KVF_MSG_ADMIT, na, 1, 1, 0, 3, false), KVF_OK);
    kvf_key_format(&k0, key0);
    kvf_key_format(&k9, key9);

    cr_assert_eq(KVFCTL("nodes 2>&1", ctl, g_ctl.addr), 0, "%s", g_out);
    cr_assert_not_null(strstr(g_out, "NAME"), "%s", g_out);
    cr_assert_not_null(strstr(g_out, "gpu0"), "%s", g_out);
    cr_assert_not_null(strstr(g_out, "alive"), "%s", g_out);

    cr_assert_eq(KVFCTL("--json nodes 2>&1", ctl, g_ctl.addr), 0);
    cr_assert_not_null(strstr(g_out, "{\"nodes\":[{\"id\":"), "%s", g_out);
    cr_assert_not_null(strstr(g_out, "\"name\":\"gpu0\",\"state\":\"alive\""),
                       "%s", g_out);
    cr_assert_not_null(strstr(g_out, "\"keys\":3"), "%s", g_out);

    cr_assert_eq(KVFCTL("stats --json 2>&1", ctl, g_ctl.addr), 0);
    cr_assert_not_null(strstr(g_out, "\"nodes_alive\":1"), "%s", g_out);
    cr_assert_not_null(strstr(g_out, "\"admits\":3"), "%s", g_out);
    cr_assert_eq(KVFCTL("stats 2>&1", ctl, g_ctl.addr), 0);
    cr_assert_not_null(strstr(g_out, "recovering"), "%s", g_out);

    cr_assert_eq(KVFCTL("lookup %s %s 2>&1", ctl, g_ctl.addr, key0, key9), 0,
                 "%s", g_out);
    cr_assert_not_null(strstr(g_out, "hit 1 of 2"), "%s", g_out);
    cr_assert_eq(KVFCTL("--json lookup %s 2>&1", ctl, g_ctl.addr, key0), 0);
    cr_assert_not_null(strstr(g_out, "\"hit_chunks\":1"), "%s", g_out);
    cr_assert_not_null(strstr(g_out, "\"holder\":"), "%s", g_out);

    cr_assert_eq(KVFCTL("lookup --any-order %s %s %s 2>&1", ctl, g_ctl.addr,
                        key9, key0, key0),
                 0, "%s", g_out);
    cr_assert_not_null(strstr(g_out, "hit 2 of 3"), "%s", g_out);
    cr_assert_eq(KVFCTL("tree 2>&1", ctl, g_ctl.addr), 0);
    cr_assert_not_null(strstr(g_out, "gpu0"), "%s", g_out);
    cr_assert_eq(KVFCTL("tree --json 2>&1", ctl, g_ctl.addr), 0);
    cr_assert_not_null(strstr(g_out, "\"holdings\":3"), "%s", g_out);

    cr_assert_eq(KVFCTL("pin %s 2>&1", ctl, g_ctl.addr, key0), 0, "%s", g_out);
    cr_assert_not_null(strstr(g_out, "ok: queued for 1 node"), "%s", g_out);
    cr_assert_eq(KVFCTL("unpin %s --json 2>&1", ctl, g_ctl.addr, key0), 0);
    cr_assert_not_null(strstr(g_out, "{\"ok\":true"), "%s", g_out);
    cr_assert_eq(KVFCTL("drain gpu0 2>&1", ctl, g_ctl.addr), 0, "%s", g_out);
    cr_assert_eq(KVFCTL("clear 2>&1", ctl, g_ctl.addr), 0, "%s", g_out);

    /* errors: one line, non-zero */
    cr_assert_eq(KVFCTL("drain nosuch 2>&1", ctl, g_ctl.addr), 1);
    cr_assert_str_eq(g_out, "kvfctl: unknown node 'nosuch'\n");
    cr_assert_eq(KVFCTL("clear 4242 2>&1", ctl, g_ctl.addr), 1);
    cr_assert_str_eq(g_out, "kvfctl: unknown node 4242\n");
    cr_assert_eq(KVFCTL("lookup zz 2>&1", ctl, g_ctl.addr), 1);
    cr_assert_not_null(strstr(g_out, "bad key 'zz'"), "%s", g_out);
    cr_assert_eq(KVFCTL("frobnicate 2>&1", ctl, g_ctl.addr), 2);

    kvf_ctlconn_destroy(a);
    cr_assert_eq(kvf_th_ctl_stop(&g_ctl), 0);
}

/* The member names of a flat JSON object, space-separated, into @p out. */
static void json_names(const char *json, char *out, size_t len)
{
    const char *p = json;
    size_t used   = 0;

    out[0] = '\0';
    while ((p = strchr(p, '"')) != NULL) {
        const char *end = strchr(p + 1, '"');

        if ((end == NULL) || (end[1] != ':')) {
            break;
        }
        used += (size_t)snprintf(out + used, len - used, "%.*s ",
                                 (int)(end - p - 1), p + 1);
        p = strchr(end, ',');
        if ((p == NULL) || (used >= len)) {
            break;
        }
    }
}

Test(kvfctl, operator_output_names_units_holders_and_outcomes)
{
    const char *args[] = {"--recovery-window", "0", NULL};
    char key0[KVF_KEY_STR_SIZE], key9[KVF_KEY_STR_SIZE];
    char http[8192], a_names[1024], b_names[1024];
    kvf_key_t k0 = {.ns = 1, .hi = 7, .lo = 0},
              k9 = {.ns = 1, .hi = 7, .lo = 9};
    kvf_ctlconn_t *a, *b;
    uint32_t na, nb;
    const char *ctl;

    kvf_th_ctl_start(&g_ctl, args);
    ctl = kvfctl_path();
    a   = kvf_th_connect(&g_ctl, KVF__PEER_KIND__PEER_AGENT);
    b   = kvf_th_connect(&g_ctl, KVF__PEER_KIND__PEER_AGENT);
    na  = kvf_th_register(a, "gpu0", 1, NULL);
    nb  = kvf_th_register(b, "gpu1", 1, NULL);
    cr_assert_eq(kvf_th_batch(a, KVF_MSG_ADMIT, na, 1, 1, 0, 3, false), KVF_OK);
    cr_assert_eq(kvf_th_batch(b, KVF_MSG_ADMIT, nb, 1, 1, 0, 1, false), KVF_OK);
    kvf_key_format(&k0, key0);
    kvf_key_format(&k9, key9);

    /* units and percentages, a short incarnation */
    cr_assert_eq(KVFCTL("nodes 2>&1", ctl, g_ctl.addr), 0, "%s", g_out);
    cr_assert_not_null(strstr(g_out, "0 B/1.0 GiB 0%"), "%s", g_out);
    cr_assert_not_null(strstr(g_out, " 00000001 "), "%s", g_out);
    /* every holder, by name */
    cr_assert_eq(KVFCTL("lookup %s %s 2>&1", ctl, g_ctl.addr, key0, key9), 0,
                 "%s", g_out);
    cr_assert_not_null(strstr(g_out, "gpu0, gpu1"), "%s", g_out);
    cr_assert_eq(KVFCTL("--json lookup %s 2>&1", ctl, g_ctl.addr, key0), 0);
    cr_assert_not_null(strstr(g_out, "\"holders\":[\"gpu0\",\"gpu1\"]"), "%s",
                       g_out);
    /* pin says per key what happened */
    cr_assert_eq(KVFCTL("pin %s %s 2>&1", ctl, g_ctl.addr, key0, key9), 0, "%s",
                 g_out);
    cr_assert_not_null(strstr(g_out, "held by 2 node(s): gpu0, gpu1"), "%s",
                       g_out);
    cr_assert_not_null(strstr(g_out, "nobody holds it yet"), "%s", g_out);
    cr_assert_eq(
        KVFCTL("replicate gpu1 %s %s 2>&1", ctl, g_ctl.addr, key0, key9), 0,
        "%s", g_out);
    cr_assert_not_null(strstr(g_out, "nothing to replicate"), "%s", g_out);
    cr_assert_not_null(strstr(g_out, "replicated 1 of 1 key(s)"), "%s", g_out);
    /* drain, undrain */
    cr_assert_eq(KVFCTL("drain gpu1 2>&1", ctl, g_ctl.addr), 0, "%s", g_out);
    cr_assert_eq(KVFCTL("nodes 2>&1", ctl, g_ctl.addr), 0, "%s", g_out);
    cr_assert_not_null(strstr(g_out, "draining"), "%s", g_out);
    cr_assert_eq(KVFCTL("undrain gpu1 2>&1", ctl, g_ctl.addr), 0, "%s", g_out);
    cr_assert_eq(KVFCTL("nodes 2>&1", ctl, g_ctl.addr), 0, "%s", g_out);
    cr_assert_null(strstr(g_out, "draining"), "%s", g_out);
    cr_assert_eq(kvf_th_run(http, sizeof(http),
                            "grep -c 'admin undrain of node gpu1' %s",
                            g_ctl.log),
                 0, "controller logs names: %s", http);

    /* errors as JSON under --json; strict arguments */
    cr_assert_eq(KVFCTL("--json drain nosuch 2>/dev/null", ctl, g_ctl.addr), 1);
    cr_assert_str_eq(g_out, "{\"error\":{\"code\":\"KVF_ERR_NOT_FOUND\","
                            "\"message\":\"unknown node 'nosuch'\"}}\n");
    cr_assert_eq(KVFCTL("--timeout abc nodes 2>&1", ctl, g_ctl.addr), 2);
    cr_assert_not_null(strstr(g_out, "--timeout 'abc' is not a time"), "%s",
                       g_out);
    cr_assert_eq(KVFCTL("nodes extra 2>&1", ctl, g_ctl.addr), 2);
    cr_assert_not_null(strstr(g_out, "nodes takes no arguments"), "%s", g_out);
    cr_assert_eq(KVFCTL("drain gpu0 gpu1 2>&1", ctl, g_ctl.addr), 2);
    cr_assert_eq(KVFCTL("--json --bogus nodes 2>/dev/null", ctl, g_ctl.addr),
                 2);
    cr_assert_not_null(strstr(g_out, "{\"error\":"), "%s", g_out);
    /* the HTTP port is named as the likely mistake */
    cr_assert_eq(KVFCTL("--timeout 2000 nodes 2>&1", ctl, g_ctl.http), 1);
    cr_assert_not_null(strstr(g_out, "that is the controller's HTTP port"),
                       "%s", g_out);

    /* one stats schema: kvfctl and /v1/stats carry the same fields */
    cr_assert_eq(KVFCTL("--json stats 2>&1", ctl, g_ctl.addr), 0, "%s", g_out);
    json_names(g_out + 1, a_names, sizeof(a_names));
    cr_assert_eq(kvf_th_run(http, sizeof(http), "curl -sf http://%s/v1/stats",
                            g_ctl.http),
                 0);
    json_names(http + 1, b_names, sizeof(b_names));
    cr_assert_str_eq(a_names, b_names);
    cr_assert_not_null(strstr(a_names, "holdings"), "%s", a_names);
    cr_assert_not_null(strstr(a_names, "auth_failures"), "%s", a_names);

    kvf_ctlconn_destroy(a);
    kvf_ctlconn_destroy(b);
    cr_assert_eq(kvf_th_ctl_stop(&g_ctl), 0);
}

Test(kvfctl, unreachable_controller)
{
    /* a port nobody listens on: bind one, note it, close it */
    cr_assert_eq(kvf_th_run(g_out, sizeof(g_out),
                            "%s --controller 127.0.0.1:1 --timeout 2000 "
                            "nodes 2>&1",
                            kvfctl_path()),
                 1);
    cr_assert_not_null(strstr(g_out, "kvfctl: cannot connect to controller "
                                     "127.0.0.1:1"),
                       "%s", g_out);
    cr_assert_eq(strchr(g_out, '\n'), g_out + strlen(g_out) - 1, "one line: %s",
                 g_out);
}

Test(kvfctl, http_endpoints)
{
    kvf_th_ctl_start(&g_ctl, NULL);
    cr_assert_eq(kvf_th_run(g_out, sizeof(g_out), "curl -sf http://%s/healthz",
                            g_ctl.http),
                 0);
    cr_assert_str_eq(g_out, "ok\n");
    cr_assert_eq(kvf_th_run(g_out, sizeof(g_out), "curl -sf http://%s/v1/stats",
                            g_ctl.http),
                 0);
    cr_assert_not_null(strstr(g_out, "\"recovering\":true"), "%s", g_out);
    cr_assert_eq(kvf_th_run(g_out, sizeof(g_out), "curl -sf http://%s/v1/nodes",
                            g_ctl.http),
                 0);
    cr_assert_str_eq(g_out, "{\"nodes\":[]}\n");
    cr_assert_eq(kvf_th_run(g_out, sizeof(g_out), "curl -sf http://%s/metrics",
                            g_ctl.http),
                 0);
    cr_assert_not_null(strstr(g_out, "kvf_controller_nodes{state=\"alive\"} "
                                     "0"),
                       "%s", g_out);
    cr_assert_not_null(strstr(g_out, "kvf_controller_request_seconds_bucket"
                                     "{le=\"+Inf\"}"),
                       "%s", g_out);
    cr_assert_not_null(strstr(g_out, "kvf_controller_purge_backlog 0"));
    cr_assert_eq(kvf_th_ctl_stop(&g_ctl), 0);
}

Test(kvfctl, bench_controller_smoke)
{
    cr_assert_eq(kvf_th_run(g_out, sizeof(g_out),
                            "%s controller --keys 4096 --batch 64 --clients 2 "
                            "--seconds 0.2 --rounds 1 --no-redis 2>/dev/null",
                            kvf_th_build_path("tools/kvf-bench")),
                 0, "%s", g_out);
    cr_assert_not_null(strstr(g_out, "{\"bench\":\"controller\",\"phase\":"
                                     "\"admit\""),
                       "%s", g_out);
    cr_assert_not_null(strstr(g_out, "\"phase\":\"lookup\""), "%s", g_out);
    cr_assert_not_null(strstr(g_out, "\"miss_keys\":0"), "%s", g_out);
    cr_assert_not_null(strstr(g_out, "\"rss_bytes_per_key\":"), "%s", g_out);
}

/* The two-agent benchmarks start their cluster, move bytes, verify them
 * and print their JSON line (no perftest: that is the benchmark's job). */
Test(kvfctl, bench_p2p_and_pd_smoke)
{
    cr_assert_eq(kvf_th_run(g_out, sizeof(g_out),
                            "%s p2p --chunk-size 64K --chunks 16 --batch 4 "
                            "--no-perftest 2>/dev/null",
                            kvf_th_build_path("tools/kvf-bench")),
                 0, "%s", g_out);
    cr_assert_not_null(strstr(g_out, "{\"bench\":\"p2p\""), "%s", g_out);
    cr_assert_not_null(strstr(g_out, "\"verified\":true"), "%s", g_out);
    cr_assert_eq(kvf_th_run(g_out, sizeof(g_out),
                            "%s pd --chunk-size 64K --requests 6 "
                            "--chunks-per-request 2 --inflight 2 "
                            "--no-perftest 2>/dev/null",
                            kvf_th_build_path("tools/kvf-bench")),
                 0, "%s", g_out);
    cr_assert_not_null(strstr(g_out, "{\"bench\":\"pd\""), "%s", g_out);
    cr_assert_not_null(strstr(g_out, "\"inflight\":2,"), "%s", g_out);
    cr_assert_not_null(strstr(g_out, "\"verified\":true"), "%s", g_out);
}

/* Both agents' CPU time per chunk is printed; pd --layers N pushes every
 * chunk as N layer-group pieces (N pushes per request, the last final) and
 * still checks every byte. */
Test(kvfctl, bench_agent_cpu_and_pd_layers)
{
    cr_assert_eq(kvf_th_run(g_out, sizeof(g_out),
                            "%s p2p --chunk-size 64K --chunks 8 --batch 4 "
                            "--no-perftest 2>/dev/null",
                            kvf_th_build_path("tools/kvf-bench")),
                 0, "%s", g_out);
    cr_assert_not_null(strstr(g_out, "\"holder_cpu_us_per_chunk\":"), "%s",
                       g_out);
    cr_assert_not_null(strstr(g_out, "\"requester_cpu_us_per_chunk\":"), "%s",
                       g_out);
    cr_assert_null(strstr(g_out, "cpu_us_per_chunk\":0.0"), "%s", g_out);
    cr_assert_eq(kvf_th_run(g_out, sizeof(g_out),
                            "%s pd --chunk-size 64K --requests 3 "
                            "--chunks-per-request 2 --layers 4 "
                            "--no-perftest 2>/dev/null",
                            kvf_th_build_path("tools/kvf-bench")),
                 0, "%s", g_out);
    cr_assert_not_null(strstr(g_out, "\"layers\":4,"), "%s", g_out);
    cr_assert_not_null(strstr(g_out, "\"verified\":true"), "%s", g_out);
    cr_assert_not_null(strstr(g_out, "\"prefill_cpu_us_per_chunk\":"), "%s",
                       g_out);
    cr_assert_not_null(strstr(g_out, "\"decode_cpu_us_per_chunk\":"), "%s",
                       g_out);
    /* 64 KiB does not split into 32 pieces of 4 KiB or more */
    cr_assert_neq(kvf_th_run(g_out, sizeof(g_out),
                             "%s pd --chunk-size 64K --layers 32 "
                             "--no-perftest 2>&1",
                             kvf_th_build_path("tools/kvf-bench")),
                  0, "%s", g_out);
}

/* --peers where the peers' environment cannot be made (here: a venv path
 * under /dev/null) still prints our figures, plus null peer figures with
 * the reason; no package index is needed for this. */
Test(kvfctl, bench_peers_say_why_they_cannot_run)
{
    cr_assert_eq(kvf_th_run(g_out, sizeof(g_out),
                            "KVF_BENCH_PEERS_VENV=/dev/null/venv %s pd "
                            "--chunk-size 64K --requests 2 "
                            "--chunks-per-request 2 --no-perftest --peers "
                            "2>/dev/null",
                            kvf_th_build_path("tools/kvf-bench")),
                 0, "%s", g_out);
    cr_assert_not_null(strstr(g_out, "\"verified\":true"), "%s", g_out);
    cr_assert_not_null(strstr(g_out, "\"mooncake_te_GBps\":null,"
                                     "\"mooncake_te_reason\":\""),
                       "%s", g_out);
    cr_assert_not_null(strstr(g_out, "\"nixl_GBps\":null,\"nixl_reason\":\""),
                       "%s", g_out);
}

/* kvf-bench gpu runs the CPU path of every layout by name (and the alias
 * of the older vLLM CPU layout); an unknown name is a usage error. */
Test(kvfctl, bench_gpu_every_layout)
{
    /* the stable names of include/kvfabric/gpu.h, spelled out */
    static const char *const names[] = {
        "vllm",           "kv",         "sglang",         "mla",
        "vllm_hnd",       "flashinfer", "flashinfer_hnd", "vllm_cpu",
        "vllm_packed_nhd"};
    char want[96];
    size_t l;

    cr_assert_eq(kvf_th_run(g_out, sizeof(g_out),
                            "%s gpu --path cpu --layout all --layers 2 "
                            "--tokens 40 --iters 1 2>/dev/null",
                            kvf_th_build_path("tools/kvf-bench")),
                 0, "%s", g_out);
    for (l = 0; l < sizeof(names) / sizeof(names[0]); l++) {
        snprintf(want, sizeof(want),
                 "\"op\":\"pack\",\"path\":\"cpu\","
                 "\"layout\":\"%s\"",
                 names[l]);
        cr_assert_not_null(strstr(g_out, want), "%s in %s", want, g_out);
    }
    cr_assert_eq(kvf_th_run(g_out, sizeof(g_out),
                            "%s gpu --path cpu --layout vllm-cpu-split "
                            "--layers 1 --tokens 8 --iters 1 2>/dev/null",
                            kvf_th_build_path("tools/kvf-bench")),
                 0, "%s", g_out);
    cr_assert_not_null(strstr(g_out, "\"layout\":\"vllm_hnd\""), "%s", g_out);
    cr_assert_neq(kvf_th_run(g_out, sizeof(g_out),
                             "%s gpu --path cpu --layout nhd 2>&1",
                             kvf_th_build_path("tools/kvf-bench")),
                  0, "%s", g_out);
}
