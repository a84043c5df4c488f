/* SPDX-License-Identifier: Apache-2.0 */
/* Copyright (c) 2026 The kvfabric authors */
/*
 * A real kvf-agent against a real kvf-controller: an engine's commits reach
 * the registry through ADMIT, a controller restart is healed by the agent's
 * inventory, and a clean agent shutdown deregisters it.
 */
#include "tests/helpers/proc.h"
#include "tests/helpers/test_helpers.h"
#include "tests/integration/controller_harness.h"

#include <kvfabric/kvfabric.h>

#include <criterion/criterion.h>

#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#define CHUNK (64u << 10)

static kvf_th_ctl_t g_ctl;
static kvf_test_proc_t g_agent;
static char g_sock[128], g_http[64], g_ctl_addr[64], g_bin[4096];

static void start_controller(uint16_t port)
{
    char listen[64];
    const char *args[] = {"--listen", listen, "--lease", "2s", NULL};

    snprintf(listen, sizeof(listen), "127.0.0.1:%u", port);
    kvf_th_ctl_start(&g_ctl, args);
}

static bool agent_registered(void)
{
    char body[4096];
    uint16_t port = (uint16_t)atoi(strrchr(g_http, ':') + 1);

    return (kvf_test_http_get(port, "/healthz", body, sizeof(body)) == 200) &&
           (strstr(body, "\"registered\":true") != NULL);
}

static void wait_registered(void)
{
    int i;

    for (i = 0; (i < 2000) && !agent_registered(); i++) {
        poll(NULL, 0, 5);
    }
    cr_assert(agent_registered(), "agent did not register: %s",
              kvf_test_proc_log(&g_agent));
}

static void setup(void)
{
    uint16_t port      = kvf_test_free_port();
    const char *argv[] = {g_bin,         "--controller",
                          g_ctl_addr,    "--name",
                          "it-node-a",   "--socket",
                          g_sock,        "--http",
                          g_http,        "--listen",
                          "127.0.0.1:0", "--pool-size",
                          "16M",         "--max-chunk",
                          "1M",          "--reconnect-max",
                          "100ms",       NULL};

    start_controller(port);
    snprintf(g_ctl_addr, sizeof(g_ctl_addr), "127.0.0.1:%u", port);
    snprintf(g_bin, sizeof(g_bin), "%s",
             kvf_test_build_path("agent/kvf-agent"));
    snprintf(g_sock, sizeof(g_sock), "/tmp/kvf-ac-it-%d.sock", (int)getpid());
    snprintf(g_http, sizeof(g_http), "127.0.0.1:%u", kvf_test_free_port());
    cr_assert_eq(kvf_test_proc_start(&g_agent, argv), 0);
    wait_registered();
}

static void teardown(void)
{
    kvf_test_proc_stop(&g_agent, 10000);
    kvf_th_ctl_stop(&g_ctl);
    kvf_test_check_leaks();
}

TestSuite(agent_controller, .init = setup, .fini = teardown, .timeout = 90);

/* Stores one chunk per key through the agent; returns the formatted keys. */
static void store(kvf_key_t *keys, uint32_t n, char text[][KVF_KEY_STR_SIZE])
{
    kvf_client_params_t p = {.field_mask  = KVF_CLIENT_PARAM_SOCKET,
                             .socket_path = g_sock};
    kvf_client_t *c       = NULL;
    kvf_slot_t slots[8];
    uint64_t sums[8];
    uint32_t tokens[8 * 16];
    size_t got, i;

    for (i = 0; i < n * 16; i++) {
        tokens[i] = (uint32_t)(i * 31 + 5);
    }
    cr_assert_eq(kvf_key_chain(0xabc, tokens, n * 16, 16, false, keys, n, &got),
                 KVF_OK);
    cr_assert_eq(kvf_client_connect(&p, &c), KVF_OK);
    cr_assert_eq(kvf_client_alloc(c, CHUNK, n, slots), KVF_OK);
    for (i = 0; i < n; i++) {
        uint8_t *d = (uint8_t *)kvf_client_pool_base(c) + slots[i].offset;

        memset(d, (int)i + 1, CHUNK);
        sums[i] = kvf_chunk_checksum(d, CHUNK);
        kvf_key_format(&keys[i], text[i]);
    }
    cr_assert_eq(kvf_client_commit(c, keys, slots, sums, n), KVF_OK);
    kvf_client_disconnect(c);
}

/* kvfctl lookup of @p n keys; returns its JSON output. */
static const char *kvfctl_lookup(char text[][KVF_KEY_STR_SIZE], uint32_t n)
{
    static char out[8192];
    char bin[4096];
    const char *argv[16] = {bin, "--controller", g_ctl.addr, "--json",
                            "lookup"};
    uint32_t i;

    snprintf(bin, sizeof(bin), "%s", kvf_test_build_path("tools/kvfctl"));
    for (i = 0; i < n; i++) {
        argv[5 + i] = text[i];
    }
    argv[5 + n] = NULL;
    cr_assert_eq(kvf_test_run(argv, out, sizeof(out), 10000), 0, "%s", out);
    return out;
}

/* Polls kvfctl until its lookup reports @p hits (the ADMIT batch is sent
 * within a few ms of the commit). */
static void wait_hits(char text[][KVF_KEY_STR_SIZE], uint32_t n,
                      const char *hits)
{
    const char *out = "";
    int i;

    for (i = 0; i < 400; i++) {
        out = kvfctl_lookup(text, n);
        if (strstr(out, hits) != NULL) {
            return;
        }
        poll(NULL, 0, 10);
    }
    cr_assert_fail("lookup never reported %s: %s", hits, out);
}

Test(agent_controller, commits_reach_the_registry)
{
    char text[3][KVF_KEY_STR_SIZE];
    kvf_key_t keys[3];

    store(keys, 3, text);
    wait_hits(text, 3, "\"hit_chunks\":3");
}

Test(agent_controller, controller_restart_is_healed_by_the_inventory)
{
    char text[2][KVF_KEY_STR_SIZE];
    kvf_key_t keys[2];
    uint16_t port = (uint16_t)atoi(strrchr(g_ctl_addr, ':') + 1);

    store(keys, 2, text);
    wait_hits(text, 2, "\"hit_chunks\":2");
    cr_assert_eq(kvf_th_ctl_stop(&g_ctl), 0);
    /* the new controller knows nothing until the agent resyncs */
    start_controller(port);
    wait_registered();
    wait_hits(text, 2, "\"hit_chunks\":2");
}

Test(agent_controller, clean_shutdown_deregisters)
{
    char text[1][KVF_KEY_STR_SIZE];
    kvf_key_t keys[1];

    store(keys, 1, text);
    wait_hits(text, 1, "\"hit_chunks\":1");
    cr_assert_eq(kvf_test_proc_stop(&g_agent, 10000), 0, "%s",
                 kvf_test_proc_log(&g_agent));
    /* deregistration removes the node's holdings at once, no lease wait */
    wait_hits(text, 1, "\"hit_chunks\":0");
}

Test(agent_controller, evictions_reach_the_registry)
{
    kvf_client_params_t p = {.field_mask  = KVF_CLIENT_PARAM_SOCKET,
                             .socket_path = g_sock};
    char first[1][KVF_KEY_STR_SIZE];
    kvf_client_t *c = NULL;
    kvf_key_t key;
    kvf_slot_t slot;
    uint64_t sum;
    uint32_t i, tok[16];
    size_t got;

    /* the agent's pool is 16 MiB of 1 MiB chunks: 40 chunks overflow it
     * and the least recently used ones are evicted */
    cr_assert_eq(kvf_client_connect(&p, &c), KVF_OK);
    for (i = 0; i < 40; i++) {
        uint8_t *d;

        memset(tok, 0, sizeof(tok));
        tok[0] = i + 1000;
        cr_assert_eq(kvf_key_chain(0xe1, tok, 16, 16, false, &key, 1, &got),
                     KVF_OK);
        if (i == 0) {
            kvf_key_format(&key, first[0]);
        }
        cr_assert_eq(kvf_client_alloc(c, 1u << 20, 1, &slot), KVF_OK, "%s",
                     kvf_client_last_error(c));
        d = (uint8_t *)kvf_client_pool_base(c) + slot.offset;
        memset(d, (int)i, 1u << 20);
        sum = kvf_chunk_checksum(d, 1u << 20);
        cr_assert_eq(kvf_client_commit(c, &key, &slot, &sum, 1), KVF_OK);
        if (i == 0) {
            wait_hits(first, 1, "\"hit_chunks\":1"); /* admitted first */
        }
    }
    kvf_client_disconnect(c);
    /* the first chunk left the pool: its EVICT reached the controller */
    wait_hits(first, 1, "\"hit_chunks\":0");
}

Test(agent_controller, wildcard_listen_advertises_a_reachable_address)
{
    char sock[128], http[64], out[8192], bin[4096];
    const char *argv[] = {
        g_bin,       "--controller", g_ctl_addr,  "--name",
        "it-node-w", "--socket",     sock,        "--http",
        http,        "--listen",     "0.0.0.0:0", "--pool-size",
        "16M",       "--max-chunk",  "1M",        NULL};
    const char *ctl[] = {bin,     "--controller", g_ctl_addr,
                         "nodes", "--json",       NULL};
    kvf_test_proc_t wild;
    const char *entry;
    int i;

    snprintf(sock, sizeof(sock), "/tmp/kvf-ac-it-w-%d.sock", (int)getpid());
    snprintf(http, sizeof(http), "127.0.0.1:%u", kvf_test_free_port());
    snprintf(bin, sizeof(bin), "%s", kvf_test_build_path("tools/kvfctl"));
    cr_assert_eq(kvf_test_proc_start(&wild, argv), 0);
    /* peers cannot reach "0.0.0.0": the agent advertises the address its
     * controller connection leaves from (loopback here) */
    for (i = 0; i < 1000; i++) {
        cr_assert_eq(kvf_test_run(ctl, out, sizeof(out), 10000), 0, "%s", out);
        entry = strstr(out, "\"it-node-w\"");
        if ((entry != NULL) &&
            (strstr(entry, "\"data_address\":\"127.0.0.1:") != NULL)) {
            break;
        }
        poll(NULL, 0, 10);
    }
    cr_assert_neq(strstr(out, "\"it-node-w\""), NULL, "%s", out);
    cr_assert_neq(
        strstr(strstr(out, "\"it-node-w\""), "\"data_address\":\"127.0.0.1:"),
        NULL, "%s", out);
    cr_assert_null(strstr(out, "0.0.0.0"), "%s", out);
    cr_assert_eq(kvf_test_proc_stop(&wild, 10000), 0, "%s",
                 kvf_test_proc_log(&wild));
}

/* kvfctl nodes --json, into @p out. */
static void nodes_json(char *out, size_t len)
{
    char bin[4096];
    const char *ctl[] = {bin,     "--controller", g_ctl_addr,
                         "nodes", "--json",       NULL};

    snprintf(bin, sizeof(bin), "%s", kvf_test_build_path("tools/kvfctl"));
    cr_assert_eq(kvf_test_run(ctl, out, len, 10000), 0, "%s", out);
}

/* Starts a second agent named it-node-a (the name the fixture's agent
 * holds) on its own socket; @p extra is an optional last flag. */
static void start_namesake(kvf_test_proc_t *proc, char *sock, size_t len,
                           const char *extra)
{
    const char *argv[] = {
        g_bin,       "--controller", g_ctl_addr,    "--name",
        "it-node-a", "--socket",     sock,          "--http",
        "",          "--listen",     "127.0.0.1:0", "--pool-size",
        "16M",       "--max-chunk",  "1M",          "--reconnect-max",
        "100ms",     extra,          NULL};

    snprintf(sock, len, "/tmp/kvf-ac-it-dup-%d.sock", (int)getpid());
    cr_assert_eq(kvf_test_proc_start(proc, argv), 0);
}

Test(agent_controller, a_held_name_is_refused_naming_the_holder)
{
    char sock[128], before[8192], after[8192];
    kvf_test_proc_t dup;
    int i;

    nodes_json(before, sizeof(before));
    start_namesake(&dup, sock, sizeof(sock), NULL);
    cr_assert(kvf_test_proc_wait_log(&dup, "is held by live node", 20000),
              "log: %s", kvf_test_proc_log(&dup));
    cr_assert(strstr(kvf_test_proc_log(&dup), "--replace") != NULL, "%s",
              kvf_test_proc_log(&dup));
    /* it keeps retrying (--reconnect-max 100ms), but says it once */
    for (i = 0; i < 400; i++) {
        char count[64];

        kvf_th_run(count, sizeof(count),
                   "grep -c 'refused registration of it-node-a' %s", g_ctl.log);
        if (atoi(count) >= 4) {
            break;
        }
        poll(NULL, 0, 25);
    }
    cr_assert_geq(i, 0);
    {
        const char *log   = kvf_test_proc_log(&dup);
        const char *first = strstr(log, "is held by live node");

        cr_assert_null(strstr(first + 1, "is held by live node"),
                       "one warning, not one per retry: %s", log);
    }
    /* the holder kept its name, id and registration */
    cr_assert(agent_registered(), "%s", kvf_test_proc_log(&g_agent));
    nodes_json(after, sizeof(after));
    cr_assert_str_eq(strstr(after, "\"it-node-a\""),
                     strstr(after, "\"it-node-a\""));
    cr_assert_null(strstr(after, "\"dead\""), "nobody died: %s", after);
    cr_assert_eq(kvf_test_proc_stop(&dup, 10000), 0, "%s",
                 kvf_test_proc_log(&dup));
    cr_assert_null(strstr(kvf_test_proc_log(&g_agent), "stale"), "%s",
                   kvf_test_proc_log(&g_agent));
}

Test(agent_controller, replace_flag_takes_the_name_over)
{
    char sock[128], out[8192];
    kvf_test_proc_t dup;
    int i;

    start_namesake(&dup, sock, sizeof(sock), "--replace");
    cr_assert(kvf_test_proc_wait_log(&dup, "registered with controller", 20000),
              "log: %s", kvf_test_proc_log(&dup));
    for (i = 0; i < 1000; i++) {
        nodes_json(out, sizeof(out));
        if (strstr(out, "\"dead\"") != NULL) {
            break;
        }
        poll(NULL, 0, 10);
    }
    cr_assert_not_null(strstr(out, "\"dead\""), "the old holder died: %s", out);
    /* the replaced agent is refused, and says so, rather than fighting
     * back with --replace of its own */
    cr_assert(kvf_test_proc_wait_log(&g_agent, "is held by live node", 20000),
              "log: %s", kvf_test_proc_log(&g_agent));
    cr_assert_eq(kvf_test_proc_stop(&dup, 10000), 0, "%s",
                 kvf_test_proc_log(&dup));
}

Test(agent_controller, restarted_agent_takes_its_name_back_at_once)
{
    const char *argv[] = {g_bin,         "--controller",
                          g_ctl_addr,    "--name",
                          "it-node-a",   "--socket",
                          g_sock,        "--http",
                          g_http,        "--listen",
                          "127.0.0.1:0", "--pool-size",
                          "16M",         "--max-chunk",
                          "1M",          "--reconnect-max",
                          "100ms",       NULL};

    /* kill -9: no deregistration, its lease (2 s) still runs; the same
     * host and socket make the new process the same agent */
    kvf_test_proc_kill(&g_agent);
    cr_assert_neq(access(g_sock, F_OK), 0,
                  "a killed agent leaves no socket behind in /tmp");
    cr_assert_eq(kvf_test_proc_start(&g_agent, argv), 0);
    wait_registered();
    cr_assert_null(strstr(kvf_test_proc_log(&g_agent), "is held by"), "%s",
                   kvf_test_proc_log(&g_agent));
}
