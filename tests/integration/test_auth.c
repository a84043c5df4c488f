/* SPDX-License-Identifier: Apache-2.0 */
/* Copyright (c) 2026 The kvfabric authors */
/*
 * The cluster secret end to end (docs/security.md): a real controller,
 * agent, kvfctl and libkvfabric engine with a secret; peers with a wrong
 * secret, with none, or skipping AUTH are refused before any state
 * changes, and counted on the refusing side.
 */
#include "common/log.h"
#include "tests/helpers/proc.h"
#include "tests/helpers/test_helpers.h"
#include "tests/integration/controller_harness.h"

#include <kvfabric/kvfabric.h>

#include <criterion/criterion.h>

#include <fcntl.h>
#include <poll.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define CHUNK (64u << 10)

static kvf_th_ctl_t g_ctl;
static kvf_test_proc_t g_agent, g_agent2;
static char g_dir[64], g_secret_a[128], g_secret_b[128], g_yaml_a[128],
    g_yaml_b[128], g_sock[128], g_http[64], g_out[1 << 16];

static void write_file(const char *path, const char *text, mode_t mode)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, mode);

    cr_assert(fd >= 0, "%s", path);
    cr_assert_eq(write(fd, text, strlen(text)), (ssize_t)strlen(text));
    close(fd);
    chmod(path, mode);
}

static void setup(void)
{
    char text[256];

    snprintf(g_dir, sizeof(g_dir), "/tmp/kvf-auth-XXXXXX");
    cr_assert_not_null(mkdtemp(g_dir));
    snprintf(g_secret_a, sizeof(g_secret_a), "%s/secret-a", g_dir);
    snprintf(g_secret_b, sizeof(g_secret_b), "%s/secret-b", g_dir);
    write_file(g_secret_a, "9f2c4e0b7a1d3f5e6c8b0a2d4f6e8c1a\n", 0600);
    write_file(g_secret_b, "not-the-cluster-secret-at-all\n", 0600);
    snprintf(g_yaml_a, sizeof(g_yaml_a), "%s/a.yaml", g_dir);
    snprintf(g_yaml_b, sizeof(g_yaml_b), "%s/b.yaml", g_dir);
    snprintf(text, sizeof(text), "cluster_secret_file: %s\n", g_secret_a);
    write_file(g_yaml_a, text, 0644);
    snprintf(text, sizeof(text), "cluster_secret_file: %s\n", g_secret_b);
    write_file(g_yaml_b, text, 0644);
    snprintf(g_sock, sizeof(g_sock), "%s/agent.sock", g_dir);
}

static void teardown(void)
{
    char cmd[128];

    if (g_agent.pid > 0) {
        kvf_test_proc_stop(&g_agent, 10000);
    }
    if (g_agent2.pid > 0) {
        kvf_test_proc_stop(&g_agent2, 10000);
    }
    if (g_ctl.pid > 0) {
        kvf_th_ctl_stop(&g_ctl);
    }
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", g_dir);
    if (system(cmd) != 0) {
        fprintf(stderr, "%s failed\n", cmd);
    }
    kvf_test_check_leaks();
}

TestSuite(auth, .init = setup, .fini = teardown, .timeout = 120);

static void load_secret(const char *path, kvf_auth_secret_t *secret)
{
    char err[256];

    cr_assert_eq(kvf_auth_secret_load(path, secret, err, sizeof(err)), KVF_OK,
                 "%s", err);
}

static kvf_status_t open_ctl(const kvf_auth_secret_t *secret, uint32_t version,
                             kvf_ctlconn_t **conn_p, char *err, size_t len)
{
    kvf_ctlconn_params_t p = {.hostport   = g_ctl.addr,
                              .kind       = KVF__PEER_KIND__PEER_ADMIN,
                              .name       = "auth-itest",
                              .version    = version,
                              .timeout_ms = 10000,
                              .secret     = secret};

    *conn_p = NULL;
    return kvf_ctlconn_open(&p, conn_p, err, len);
}

/* The value of a Prometheus counter at http://HOSTPORT/metrics. */
static uint64_t metric(const char *hostport, const char *name)
{
    static char body[1 << 16];
    uint16_t port = (uint16_t)atoi(strrchr(hostport, ':') + 1);
    char needle[128];
    const char *p;

    cr_assert_eq(kvf_test_http_get(port, "/metrics", body, sizeof(body)), 200);
    snprintf(needle, sizeof(needle), "\n%s ", name);
    p = strstr(body, needle);
    cr_assert_not_null(p, "%s missing", name);
    return strtoull(p + strlen(needle), NULL, 10);
}

/* Waits (deadline) until the counter reaches @p want. */
static void wait_metric(const char *hostport, const char *name, uint64_t want)
{
    int i;

    for (i = 0; (i < 2000) && (metric(hostport, name) < want); i++) {
        poll(NULL, 0, 5);
    }
    cr_assert_eq(metric(hostport, name), want, "%s", name);
}

static uint32_t count_nodes(kvf_ctlconn_t *conn)
{
    Kvf__NodeInfoRequest req;
    kvf_frame_t frame;
    uint32_t n;

    kvf__node_info_request__init(&req);
    req.request_id = kvf_ctlconn_next_id(conn);
    cr_assert_eq(kvf_ctlconn_call(conn, KVF_MSG_NODE_INFO, &req.base, &frame),
                 KVF_OK);
    cr_assert_eq(frame.type, KVF_MSG_NODE_INFO_REPLY);
    n = (uint32_t)((Kvf__NodeInfoReply *)frame.msg)->n_nodes;
    kvf_frame_release(&frame, NULL);
    return n;
}

/* A raw connection (no handshake) that sends HELLO with a nonce and
 * checks the controller's challenge; the caller goes on from there. */
static kvf_ctlconn_t *hello_challenged(void)
{
    uint8_t nonce[32] = {7};
    kvf_ctlconn_t *raw;
    kvf_frame_t frame;
    Kvf__HelloReply *rep;
    Kvf__Hello hello;
    char err[256], name[] = "raw";

    cr_assert_eq(open_ctl(NULL, 0, &raw, err, sizeof(err)), KVF_OK, "%s", err);
    kvf__hello__init(&hello);
    hello.request_id       = 1;
    hello.protocol_version = KVF_PROTOCOL_VERSION;
    hello.kind             = KVF__PEER_KIND__PEER_AGENT;
    hello.name             = name;
    hello.auth_nonce.data  = nonce;
    hello.auth_nonce.len   = sizeof(nonce);
    cr_assert_eq(kvf_ctlconn_call(raw, KVF_MSG_HELLO, &hello.base, &frame),
                 KVF_OK);
    cr_assert_eq(frame.type, KVF_MSG_HELLO_REPLY);
    rep = (Kvf__HelloReply *)frame.msg;
    cr_assert_eq(rep->status, KVF_OK);
    cr_assert_eq(rep->auth_nonce.len, 32, "the controller challenges");
    cr_assert_eq(rep->auth_mac.len, 32, "and proves the secret");
    kvf_frame_release(&frame, NULL);
    return raw;
}

/* HELLO with a challenge, then @p type instead of a valid AUTH: the
 * controller answers STATUS{KVF_ERR_AUTH} and closes. */
static void skip_auth(uint16_t type, const ProtobufCMessage *msg,
                      const char *reason)
{
    kvf_ctlconn_t *raw = hello_challenged();
    kvf_frame_t frame;

    cr_assert_eq(kvf_ctlconn_call(raw, type, msg, &frame), KVF_OK);
    cr_assert_eq(frame.type, KVF_MSG_STATUS);
    cr_assert_eq(((Kvf__Status *)frame.msg)->status, KVF_ERR_AUTH);
    cr_assert_not_null(strstr(((Kvf__Status *)frame.msg)->message, reason),
                       "%s", ((Kvf__Status *)frame.msg)->message);
    kvf_frame_release(&frame, NULL);
    cr_assert_eq(kvf_ctlconn_recv(raw, &frame), KVF_ERR_CLOSED);
    kvf_ctlconn_destroy(raw);
}

Test(auth, controller_refuses_and_counts)
{
    const char *args[] = {"--config", g_yaml_a, NULL};
    kvf_auth_secret_t a, b;
    kvf_ctlconn_t *conn, *bad;
    Kvf__Register reg;
    Kvf__Auth forged;
    uint8_t mac[32] = {0};
    char err[512], name[] = "intruder";

    kvf_th_ctl_start(&g_ctl, args);
    load_secret(g_secret_a, &a);
    load_secret(g_secret_b, &b);
    cr_assert_eq(open_ctl(&a, KVF_PROTOCOL_VERSION, &conn, err, sizeof(err)),
                 KVF_OK, "%s", err);

    cr_assert_eq(open_ctl(NULL, KVF_PROTOCOL_VERSION, &bad, err, sizeof(err)),
                 KVF_ERR_AUTH);
    cr_assert_not_null(strstr(err, "requires the cluster secret"), "%s", err);
    cr_assert_eq(open_ctl(&b, KVF_PROTOCOL_VERSION, &bad, err, sizeof(err)),
                 KVF_ERR_AUTH);
    cr_assert_not_null(strstr(err, "failed the cluster-secret challenge"), "%s",
                       err);

    /* a REGISTER in place of AUTH registers nothing */
    kvf__register__init(&reg);
    reg.request_id  = 2;
    reg.name        = name;
    reg.incarnation = 1;
    skip_auth(KVF_MSG_REGISTER, &reg.base, "authenticate first");
    /* a forged MAC */
    kvf__auth__init(&forged);
    forged.request_id    = 2;
    forged.auth_mac.data = mac;
    forged.auth_mac.len  = sizeof(mac);
    skip_auth(KVF_MSG_AUTH, &forged.base, "wrong cluster secret");

    cr_assert_eq(count_nodes(conn), 0, "no state changed");
    wait_metric(g_ctl.http, "kvf_controller_auth_failures_total", 4);
    cr_assert_eq(kvf_th_register(conn, "gpu0", 1, NULL), 1,
                 "an authenticated agent registers");
    cr_assert_eq(count_nodes(conn), 1);

    /* kvfctl reads the secret's file from the environment */
    cr_assert_eq(kvf_th_run(g_out, sizeof(g_out),
                            "KVF_CLUSTER_SECRET_FILE=%s %s --controller %s "
                            "nodes 2>&1",
                            g_secret_a, kvf_th_build_path("tools/kvfctl"),
                            g_ctl.addr),
                 0, "%s", g_out);
    cr_assert_not_null(strstr(g_out, "gpu0"), "%s", g_out);
    cr_assert_eq(kvf_th_run(g_out, sizeof(g_out),
                            "KVF_CLUSTER_SECRET_FILE= %s --controller %s "
                            "nodes 2>&1",
                            kvf_th_build_path("tools/kvfctl"), g_ctl.addr),
                 1, "%s", g_out);
    cr_assert_not_null(strstr(g_out, "requires the cluster secret"), "%s",
                       g_out);
    cr_assert_eq(kvf_th_run(g_out, sizeof(g_out),
                            "KVF_CLUSTER_SECRET_FILE=%s %s --controller %s "
                            "nodes 2>&1",
                            g_secret_b, kvf_th_build_path("tools/kvfctl"),
                            g_ctl.addr),
                 1, "%s", g_out);
    cr_assert_not_null(strstr(g_out, "failed the cluster-secret challenge"),
                       "%s", g_out);
    cr_assert_null(strstr(g_out, "9f2c4e0b"), "the secret is never printed");
    wait_metric(g_ctl.http, "kvf_controller_auth_failures_total", 6);

    kvf_ctlconn_destroy(conn);
    kvf_auth_secret_cleanup(&a);
    kvf_auth_secret_cleanup(&b);
    cr_assert_eq(kvf_th_ctl_stop(&g_ctl), 0);
}

Test(auth, secret_on_one_side_only)
{
    kvf_auth_secret_t a;
    kvf_ctlconn_t *conn;
    char err[512];

    kvf_th_ctl_start(&g_ctl, NULL); /* no secret */
    load_secret(g_secret_a, &a);
    cr_assert_eq(open_ctl(&a, KVF_PROTOCOL_VERSION, &conn, err, sizeof(err)),
                 KVF_ERR_AUTH);
    cr_assert_not_null(strstr(err, "has no cluster_secret_file configured"),
                       "%s", err);
    wait_metric(g_ctl.http, "kvf_controller_auth_failures_total", 1);
    cr_assert_eq(open_ctl(NULL, KVF_PROTOCOL_VERSION, &conn, err, sizeof(err)),
                 KVF_OK, "no secret anywhere: as before");
    kvf_ctlconn_destroy(conn);
    kvf_auth_secret_cleanup(&a);
    cr_assert_eq(kvf_th_ctl_stop(&g_ctl), 0);
}

Test(auth, readable_secret_file_stops_the_controller)
{
    char bin[4096];
    const char *argv[] = {bin,           "--config", g_yaml_a, "--listen",
                          "127.0.0.1:0", "--http",   "",       NULL};
    kvf_test_proc_t proc;

    chmod(g_secret_a, 0644);
    snprintf(bin, sizeof(bin), "%s",
             kvf_test_build_path("controller/kvf-controller"));
    cr_assert_eq(kvf_test_proc_start(&proc, argv), 0);
    cr_assert_neq(kvf_test_proc_wait_exit(&proc, 20000), 0);
    cr_assert_not_null(strstr(kvf_test_proc_log(&proc), "chmod 600"), "%s",
                       kvf_test_proc_log(&proc));
    cr_assert_null(strstr(kvf_test_proc_log(&proc), "9f2c4e0b"));
}

static bool agent_registered(void)
{
    char body[4096];
    uint16_t port = (uint16_t)atoi(strrchr(g_http, ':') + 1);

    return (kvf_test_http_get(port, "/healthz", body, sizeof(body)) == 200) &&
           (strstr(body, "\"registered\":true") != NULL);
}

static void start_agent(kvf_test_proc_t *proc, const char *yaml,
                        const char *name, const char *sock, const char *http)
{
    char bin[4096];
    const char *argv[] = {
        bin,           "--config",        yaml,    "--controller",
        g_ctl.addr,    "--name",          name,    "--socket",
        sock,          "--http",          http,    "--listen",
        "127.0.0.1:0", "--pool-size",     "16M",   "--max-chunk",
        "1M",          "--reconnect-max", "100ms", NULL};

    snprintf(bin, sizeof(bin), "%s", kvf_test_build_path("agent/kvf-agent"));
    cr_assert_eq(kvf_test_proc_start(proc, argv), 0);
}

static kvf_status_t engine_connect(uint64_t mask, const char *secret_file,
                                   kvf_client_t **client_p)
{
    kvf_client_params_t p = {.field_mask  = KVF_CLIENT_PARAM_SOCKET | mask,
                             .socket_path = g_sock,
                             .secret_file = secret_file};

    *client_p = NULL;
    return kvf_client_connect(&p, client_p);
}

Test(auth, agent_engine_and_kvfctl_with_a_secret)
{
    const char *args[] = {"--config", g_yaml_a, NULL};
    kvf_client_t *c    = NULL;
    kvf_key_t key      = {.ns = 5, .hi = 6, .lo = 7};
    char key_text[KVF_KEY_STR_SIZE], sock2[160], http2[64];
    kvf_slot_t slot;
    uint64_t sum;
    int i, level;

    kvf_th_ctl_start(&g_ctl, args);
    snprintf(g_http, sizeof(g_http), "127.0.0.1:%u", kvf_test_free_port());
    start_agent(&g_agent, g_yaml_a, "auth-a", g_sock, g_http);
    for (i = 0; (i < 2000) && !agent_registered(); i++) {
        poll(NULL, 0, 5);
    }
    cr_assert(agent_registered(), "%s", kvf_test_proc_log(&g_agent));

    /* an engine with the secret maps the pool and stores a chunk */
    cr_assert_eq(engine_connect(KVF_CLIENT_PARAM_SECRET, g_secret_a, &c),
                 KVF_OK);
    cr_assert_eq(kvf_client_alloc(c, CHUNK, 1, &slot), KVF_OK);
    memset((uint8_t *)kvf_client_pool_base(c) + slot.offset, 3, CHUNK);
    sum = kvf_chunk_checksum((uint8_t *)kvf_client_pool_base(c) + slot.offset,
                             CHUNK);
    cr_assert_eq(kvf_client_commit(c, &key, &slot, &sum, 1), KVF_OK);
    kvf_client_disconnect(c);

    /* without the secret, or with another, no pool is handed over; the
     * library says why at debug level only (it prints nothing by default) */
    level = atomic_exchange(&kvf_log_level_current, KVF_LOG_DEBUG);
    kvf_test_log_capture_start();
    cr_assert_eq(engine_connect(0, NULL, &c), KVF_ERR_AUTH);
    cr_assert_null(c);
    cr_assert_eq(engine_connect(KVF_CLIENT_PARAM_SECRET, g_secret_b, &c),
                 KVF_ERR_AUTH);
    kvf_test_log_capture_stop();
    atomic_store(&kvf_log_level_current, level);
    cr_assert(kvf_test_log_contains("requires the cluster secret"), "%s",
              kvf_test_log_text());
    cr_assert(kvf_test_log_contains("failed the cluster-secret challenge"),
              "%s", kvf_test_log_text());
    wait_metric(g_http, "kvf_agent_auth_failures_total", 2);

    /* the commit reached the controller over the authenticated agent */
    kvf_key_format(&key, key_text);
    for (i = 0; i < 2000; i++) {
        if ((kvf_th_run(g_out, sizeof(g_out),
                        "KVF_CLUSTER_SECRET_FILE=%s %s --controller %s --json "
                        "lookup %s 2>&1",
                        g_secret_a, kvf_th_build_path("tools/kvfctl"),
                        g_ctl.addr, key_text) == 0) &&
            (strstr(g_out, "\"hit_chunks\":1") != NULL)) {
            break;
        }
        poll(NULL, 0, 5);
    }
    cr_assert_not_null(strstr(g_out, "\"hit_chunks\":1"), "%s", g_out);

    /* an agent with another secret never registers */
    snprintf(sock2, sizeof(sock2), "%s/agent2.sock", g_dir);
    snprintf(http2, sizeof(http2), "127.0.0.1:%u", kvf_test_free_port());
    start_agent(&g_agent2, g_yaml_b, "auth-b", sock2, http2);
    cr_assert(kvf_test_proc_wait_log(
                  &g_agent2, "failed the cluster-secret challenge", 20000),
              "%s", kvf_test_proc_log(&g_agent2));
    cr_assert_null(strstr(kvf_test_proc_log(&g_agent2), "not-the-cluster"),
                   "the secret is never logged");
    cr_assert_eq(kvf_test_proc_stop(&g_agent2, 10000), 0);
    cr_assert_eq(kvf_test_proc_stop(&g_agent, 10000), 0);
}

/* A self-signed certificate for 127.0.0.1 (and another, untrusted one),
 * made at run time with the openssl CLI. */
static void make_certs(void)
{
    cr_assert_eq(kvf_th_run(g_out, sizeof(g_out),
                            "cd %s && openssl req -x509 -newkey rsa:2048 "
                            "-nodes -keyout key.pem -out cert.pem -days 2 "
                            "-subj /CN=kvf-test -addext "
                            "subjectAltName=IP:127.0.0.1 2>&1 && "
                            "openssl req -x509 -newkey rsa:2048 -nodes "
                            "-keyout other-key.pem -out other.pem -days 2 "
                            "-subj /CN=other 2>&1",
                            g_dir),
                 0, "%s", g_out);
}

static void write_yaml(const char *name, const char *text)
{
    char path[160];

    snprintf(path, sizeof(path), "%s/%s", g_dir, name);
    write_file(path, text, 0644);
}

Test(auth, tls_and_secret_across_controller_agent_kvfctl)
{
    char yaml[160], text[1024], ctl_yaml[160], bad_yaml[160], sock2[160],
        http2[64];
    const char *args[] = {"--config", ctl_yaml, NULL};
    int i;

    make_certs();
    snprintf(text, sizeof(text),
             "cluster_secret_file: %s\ntls_cert: %s/cert.pem\n"
             "tls_key: %s/key.pem\n",
             g_secret_a, g_dir, g_dir);
    write_yaml("ctl-tls.yaml", text);
    snprintf(ctl_yaml, sizeof(ctl_yaml), "%s/ctl-tls.yaml", g_dir);
    kvf_th_ctl_start(&g_ctl, args);

    /* kvfctl: TLS with the right CA and name, and the secret */
    cr_assert_eq(kvf_th_run(g_out, sizeof(g_out),
                            "KVF_CLUSTER_SECRET_FILE=%s KVF_TLS_CA=%s/cert.pem "
                            "KVF_TLS_SERVER_NAME=127.0.0.1 %s --controller %s "
                            "stats 2>&1",
                            g_secret_a, g_dir,
                            kvf_th_build_path("tools/kvfctl"), g_ctl.addr),
                 0, "%s", g_out);
    /* another CA, another name, no TLS at all: refused */
    cr_assert_eq(
        kvf_th_run(g_out, sizeof(g_out),
                   "KVF_CLUSTER_SECRET_FILE=%s KVF_TLS_CA=%s/other.pem "
                   "%s --controller %s stats 2>&1",
                   g_secret_a, g_dir, kvf_th_build_path("tools/kvfctl"),
                   g_ctl.addr),
        1, "%s", g_out);
    cr_assert_not_null(strstr(g_out, "certificate not trusted"), "%s", g_out);
    cr_assert_eq(kvf_th_run(g_out, sizeof(g_out),
                            "KVF_CLUSTER_SECRET_FILE=%s KVF_TLS_CA=%s/cert.pem "
                            "KVF_TLS_SERVER_NAME=10.9.9.9 %s --controller %s "
                            "stats 2>&1",
                            g_secret_a, g_dir,
                            kvf_th_build_path("tools/kvfctl"), g_ctl.addr),
                 1, "%s", g_out);
    cr_assert_not_null(strstr(g_out, "mismatch"), "%s", g_out);
    cr_assert_eq(kvf_th_run(g_out, sizeof(g_out),
                            "KVF_CLUSTER_SECRET_FILE=%s %s --controller %s "
                            "stats 2>&1",
                            g_secret_a, kvf_th_build_path("tools/kvfctl"),
                            g_ctl.addr),
                 1, "%s", g_out);
    wait_metric(g_ctl.http, "kvf_controller_tls_failures_total", 3);
    /* TLS alone does not admit: the secret is still required */
    cr_assert_eq(kvf_th_run(g_out, sizeof(g_out),
                            "KVF_TLS_CA=%s/cert.pem %s --controller %s "
                            "stats 2>&1",
                            g_dir, kvf_th_build_path("tools/kvfctl"),
                            g_ctl.addr),
                 1, "%s", g_out);
    cr_assert_not_null(strstr(g_out, "requires the cluster secret"), "%s",
                       g_out);

    /* an agent over TLS with the secret registers */
    snprintf(text, sizeof(text),
             "cluster_secret_file: %s\ntls_ca: %s/cert.pem\n"
             "tls_server_name: 127.0.0.1\n",
             g_secret_a, g_dir);
    write_yaml("agent-tls.yaml", text);
    snprintf(yaml, sizeof(yaml), "%s/agent-tls.yaml", g_dir);
    snprintf(g_http, sizeof(g_http), "127.0.0.1:%u", kvf_test_free_port());
    start_agent(&g_agent, yaml, "tls-a", g_sock, g_http);
    for (i = 0; (i < 2000) && !agent_registered(); i++) {
        poll(NULL, 0, 5);
    }
    cr_assert(agent_registered(), "%s", kvf_test_proc_log(&g_agent));

    /* an agent trusting another CA never gets to HELLO */
    snprintf(text, sizeof(text),
             "cluster_secret_file: %s\ntls_ca: %s/other.pem\n", g_secret_a,
             g_dir);
    write_yaml("agent-bad.yaml", text);
    snprintf(bad_yaml, sizeof(bad_yaml), "%s/agent-bad.yaml", g_dir);
    snprintf(sock2, sizeof(sock2), "%s/agent2.sock", g_dir);
    snprintf(http2, sizeof(http2), "127.0.0.1:%u", kvf_test_free_port());
    start_agent(&g_agent2, bad_yaml, "tls-b", sock2, http2);
    cr_assert(
        kvf_test_proc_wait_log(&g_agent2, "certificate not trusted", 20000),
        "%s", kvf_test_proc_log(&g_agent2));
    cr_assert_eq(kvf_test_proc_stop(&g_agent2, 10000), 0);
    cr_assert_eq(kvf_test_proc_stop(&g_agent, 10000), 0);
    cr_assert_eq(kvf_th_ctl_stop(&g_ctl), 0);
}

/* Many pipelined requests over TLS: every reply arrives, in order, across
 * partial TLS reads and writes (nothing is stranded in TLS's buffers). */
Test(auth, tls_pipelined_lookups_all_answered)
{
    char yaml[160], text[512];
    const char *args[] = {"--config", yaml, NULL};
    static uint8_t keys[64 * KVF_KEY_WIRE_SIZE];
    kvf_ctlconn_params_t p;
    kvf_ctlconn_t *conn;
    kvf_frame_t frame;
    Kvf__Lookup lk;
    char err[512], ca[160];
    int round, i;

    make_certs();
    snprintf(text, sizeof(text), "tls_cert: %s/cert.pem\ntls_key: %s/key.pem\n",
             g_dir, g_dir);
    write_yaml("ctl-tls-only.yaml", text);
    snprintf(yaml, sizeof(yaml), "%s/ctl-tls-only.yaml", g_dir);
    snprintf(ca, sizeof(ca), "%s/cert.pem", g_dir);
    kvf_th_ctl_start(&g_ctl, args);
    memset(&p, 0, sizeof(p));
    p.hostport   = g_ctl.addr;
    p.kind       = KVF__PEER_KIND__PEER_ADMIN;
    p.name       = "tls-flood";
    p.version    = KVF_PROTOCOL_VERSION;
    p.timeout_ms = 20000;
    p.tls_ca     = ca;
    cr_assert_eq(kvf_ctlconn_open(&p, &conn, err, sizeof(err)), KVF_OK, "%s",
                 err);
    kvf_th_keys(keys, 64, 0);
    kvf__lookup__init(&lk);
    lk.keys.data = keys;
    lk.keys.len  = sizeof(keys);
    lk.any_order = true;
    for (round = 0; round < 6; round++) {
        for (i = 0; i < 1000; i++) {
            lk.request_id = (uint64_t)(round * 1000 + i + 100);
            cr_assert_eq(kvf_ctlconn_queue(conn, KVF_MSG_LOOKUP, &lk.base),
                         KVF_OK);
        }
        cr_assert_eq(kvf_ctlconn_flush(conn), KVF_OK);
        for (i = 0; i < 1000; i++) {
            cr_assert_eq(kvf_ctlconn_recv(conn, &frame), KVF_OK,
                         "round %d reply %d", round, i);
            cr_assert_eq(frame.type, KVF_MSG_LOOKUP_REPLY);
            cr_assert_eq(((Kvf__LookupReply *)frame.msg)->request_id,
                         (uint64_t)(round * 1000 + i + 100));
            kvf_frame_release(&frame, NULL);
        }
    }
    kvf_ctlconn_destroy(conn);
    cr_assert_eq(kvf_th_ctl_stop(&g_ctl), 0);
}

/* With a secret, a connection that never authenticates is closed after
 * handshake_timeout and counted. */
Test(auth, silent_connections_are_closed)
{
    const char *args[] = {"--config", g_yaml_a, "--handshake-timeout", "200ms",
                          NULL};
    kvf_ctlconn_t *silent, *half;
    kvf_frame_t frame;
    char err[256];

    kvf_th_ctl_start(&g_ctl, args);
    cr_assert_eq(open_ctl(NULL, 0, &silent, err, sizeof(err)), KVF_OK, "%s",
                 err);
    half = hello_challenged(); /* and never answers */
    cr_assert_eq(kvf_ctlconn_recv(silent, &frame), KVF_ERR_CLOSED);
    cr_assert_eq(kvf_ctlconn_recv(half, &frame), KVF_ERR_CLOSED);
    wait_metric(g_ctl.http, "kvf_controller_handshake_timeouts_total", 2);
    cr_assert_eq(metric(g_ctl.http, "kvf_controller_auth_failures_total"), 0,
                 "a timeout is not also an auth failure");
    kvf_ctlconn_destroy(silent);
    kvf_ctlconn_destroy(half);
    cr_assert_eq(kvf_th_ctl_stop(&g_ctl), 0);
}
