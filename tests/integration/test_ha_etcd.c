/* SPDX-License-Identifier: Apache-2.0 */
/* Copyright (c) 2026 The kvfabric authors */
/*
 * Finding the controller leader through etcd (issue 21, part B item 1): a
 * real etcd on loopback, three kvf-controller --etcd, and an agent,
 * kvfctl and kvf-bench given only --etcd (no controller address). kill -9
 * of the leader: the agent reads etcd again and registers with the new
 * leader on its own, measured.
 */
#include "tests/helpers/etcd.h"
#include "tests/helpers/proc.h"
#include "tests/integration/controller_harness.h"

#include "common/time.h"

#include <criterion/criterion.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define HE_CTLS   3
#define HE_PREFIX "/kvf-ha-etcd-test"

typedef struct he_cluster {
    kvf_test_proc_t etcd;
    char dir[64];
    char url[512];
    kvf_test_proc_t ctl[HE_CTLS];
    char ports[HE_CTLS][128];
    bool running[HE_CTLS];
} he_cluster_t;

static void he_pause(void)
{
    /* a polling step of a deadline-bounded wait */
    struct timespec ts = {0, 20 * 1000 * 1000};

    nanosleep(&ts, NULL);
}

static void he_start(he_cluster_t *c, int ctls)
{
    int i;

    memset(c, 0, sizeof(*c));
    if (access(KVF_TEST_ETCD_BIN, X_OK) != 0) {
        cr_skip_test("etcd is not installed (Debian etcd-server; the "
                     "Makefile's DEBS install it)");
    }
    snprintf(c->dir, sizeof(c->dir), "/tmp/kvf-ha-etcd-XXXXXX");
    cr_assert_not_null(mkdtemp(c->dir));
    cr_assert_eq(kvf_test_etcd_start(&c->etcd, c->dir, c->url, sizeof(c->url)),
                 0, "%s", c->url);
    for (i = 0; i < ctls; i++) {
        const char *argv[] = {kvf_th_build_path("controller/kvf-controller"),
                              "--listen",
                              "127.0.0.1:0",
                              "--http",
                              "127.0.0.1:0",
                              "--port-file",
                              c->ports[i],
                              "--etcd",
                              c->url,
                              "--etcd-prefix",
                              HE_PREFIX,
                              "--etcd-lease",
                              "2s",
                              NULL};

        snprintf(c->ports[i], sizeof(c->ports[i]), "%s/ctl%d.ports", c->dir, i);
        cr_assert_eq(kvf_test_proc_start(&c->ctl[i], argv), 0);
        c->running[i] = true;
    }
}

/* The controller that wrote its port file (only a leader does). */
static int he_leader(he_cluster_t *c)
{
    uint64_t deadline = kvf_time_deadline_ns(20 * KVF_NSEC_PER_SEC);
    int i;

    for (;;) {
        for (i = 0; i < HE_CTLS; i++) {
            if (c->running[i] &&
                kvf_test_port_file_serving(c->ports[i], NULL, 0)) {
                return i;
            }
        }
        cr_assert(!kvf_time_expired(deadline), "no leader elected");
        he_pause();
    }
}

static void he_stop(he_cluster_t *c)
{
    char cmd[128];
    int i;

    for (i = 0; i < HE_CTLS; i++) {
        if (c->running[i]) {
            cr_expect_eq(kvf_test_proc_stop(&c->ctl[i], 10000), 0, "%s",
                         kvf_test_proc_log(&c->ctl[i]));
        }
    }
    kvf_test_proc_stop(&c->etcd, 10000);
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", c->dir);
    cr_expect_eq(system(cmd), 0);
}

/* kvfctl --etcd URL --etcd-prefix P nodes --json into @p out; its exit
 * status. */
static int he_kvfctl(const char *url, const char *prefix, char *out, size_t len)
{
    char bin[4096];
    const char *argv[] = {bin,    "--etcd", url,      "--etcd-prefix",
                          prefix, "nodes",  "--json", NULL};

    snprintf(bin, sizeof(bin), "%s", kvf_th_build_path("tools/kvfctl"));
    return kvf_test_run(argv, out, len, 10000);
}

static bool he_lists(he_cluster_t *c, const char *name)
{
    char out[8192];

    return (he_kvfctl(c->url, HE_PREFIX, out, sizeof(out)) == 0) &&
           (strstr(out, name) != NULL);
}

Test(ha_etcd, agent_kvfctl_and_bench_find_the_leader_in_etcd, .timeout = 180)
{
    char sock[96], bin[4096], out[8192];
    kvf_test_proc_t agent;
    he_cluster_t c;
    uint64_t t0, deadline, took;
    int leader;
    const char *argv[] = {
        bin,           "--etcd",          c.url,      "--etcd-prefix",
        HE_PREFIX,     "--name",          "he-agent", "--socket",
        sock,          "--http",          "",         "--listen",
        "127.0.0.1:0", "--pool-size",     "16M",      "--max-chunk",
        "1M",          "--reconnect-max", "5s",       NULL};

    he_start(&c, HE_CTLS);
    leader = he_leader(&c);
    /* kvf-bench measures the leader etcd names (alone: it counts the
     * nodes alive) */
    {
        char bench[4096];
        const char *bargv[] = {bench,
                               "load-controller",
                               "--etcd",
                               c.url,
                               "--etcd-prefix",
                               HE_PREFIX,
                               "--agents",
                               "2",
                               "--threads",
                               "1",
                               "--seconds",
                               "0.3",
                               NULL};

        snprintf(bench, sizeof(bench), "%s",
                 kvf_th_build_path("tools/kvf-bench"));
        cr_assert_eq(kvf_test_run(bargv, out, sizeof(out), 60000), 0, "%s",
                     out);
    }

    snprintf(bin, sizeof(bin), "%s", kvf_th_build_path("agent/kvf-agent"));
    snprintf(sock, sizeof(sock), "/tmp/kvf-he-agent-%d.sock", (int)getpid());
    cr_assert_eq(kvf_test_proc_start(&agent, argv), 0);
    deadline = kvf_time_deadline_ns(20 * KVF_NSEC_PER_SEC);
    while (!he_lists(&c, "\"he-agent\"")) {
        cr_assert(!kvf_time_expired(deadline), "agent not registered: %s",
                  kvf_test_proc_log(&agent));
        he_pause();
    }
    cr_assert(kvf_test_proc_wait_log(&agent, "the controller leader is", 1000),
              "%s", kvf_test_proc_log(&agent));

    /* the leader dies: its lease expires (2 s), a standby wins and
     * publishes; the agent (backing off up to 5 s otherwise) reads etcd
     * and registers there at once */
    kvf_test_proc_kill(&c.ctl[leader]);
    c.running[leader] = false;
    t0                = kvf_time_now_ns();
    deadline          = kvf_time_deadline_ns(30 * KVF_NSEC_PER_SEC);
    while (!he_lists(&c, "\"he-agent\"")) {
        cr_assert(!kvf_time_expired(deadline),
                  "agent did not follow the leader: %s",
                  kvf_test_proc_log(&agent));
        he_pause();
    }
    took = kvf_time_now_ns() - t0;
    fprintf(stderr,
            "ha-etcd: kill -9 of the leader: the agent (told only --etcd) "
            "was registered with the new leader after %.0f ms (lease 2000 "
            "ms)\n",
            (double)took / 1e6);
    /* lease + one etcd poll + registration; slack for ASan on 2 cores */
    cr_expect_leq(took, 6000 * KVF_NSEC_PER_MSEC, "took %.0f ms",
                  (double)took / 1e6);
    cr_assert(kvf_test_proc_alive(&agent));
    cr_assert_eq(kvf_test_proc_stop(&agent, 10000), 0, "%s",
                 kvf_test_proc_log(&agent));
    he_stop(&c);
}

Test(ha_etcd, kvfctl_says_why_etcd_names_no_leader, .timeout = 60)
{
    char out[8192], bad[64];
    he_cluster_t c;

    he_start(&c, 0);
    /* etcd answers, nobody was elected under the prefix */
    cr_assert_eq(he_kvfctl(c.url, "/nobody-here", out, sizeof(out)), 1, "%s",
                 out);
    cr_assert_not_null(strstr(out, "no controller is leader"), "%s", out);
    /* no etcd endpoint answers */
    snprintf(bad, sizeof(bad), "http://127.0.0.1:%u", kvf_test_free_port());
    cr_assert_eq(he_kvfctl(bad, HE_PREFIX, out, sizeof(out)), 1, "%s", out);
    cr_assert_not_null(strstr(out, "no endpoint answers"), "%s", out);
    he_stop(&c);
}

Test(ha_etcd, agent_refuses_an_etcd_list_that_is_not_urls)
{
    char bin[4096], out[8192];
    const char *ok[]  = {bin, "--print-config", "--etcd",
                         "http://127.0.0.1:2379,http://127.0.0.1:2479", NULL};
    const char *bad[] = {bin, "--print-config", "--etcd", "127.0.0.1:2379",
                         NULL};

    snprintf(bin, sizeof(bin), "%s", kvf_th_build_path("agent/kvf-agent"));
    cr_assert_eq(kvf_test_run(ok, out, sizeof(out), 10000), 0, "%s", out);
    cr_assert_not_null(strstr(out, "etcd_prefix: "), "%s", out);
    cr_assert_neq(kvf_test_run(bad, out, sizeof(out), 10000), 0, "%s", out);
}

/* A controller under @p prefix listening on @p listen, publishing
 * @p advertise (NULL: the default). */
static void he_ctl_start(he_cluster_t *c, int i, const char *prefix,
                         const char *listen, const char *advertise)
{
    const char *argv[] = {kvf_th_build_path("controller/kvf-controller"),
                          "--listen",
                          listen,
                          "--http",
                          "",
                          "--port-file",
                          c->ports[i],
                          "--etcd",
                          c->url,
                          "--etcd-prefix",
                          prefix,
                          (advertise != NULL) ? "--advertise" : NULL,
                          advertise,
                          NULL};

    snprintf(c->ports[i], sizeof(c->ports[i]), "%s/ctl%d.ports", c->dir, i);
    cr_assert_eq(kvf_test_proc_start(&c->ctl[i], argv), 0);
    c->running[i] = true;
    cr_assert(kvf_test_proc_wait_log(&c->ctl[i], "published", 20000), "%s",
              kvf_test_proc_log(&c->ctl[i]));
}

Test(ha_etcd, the_leader_publishes_a_reachable_address, .timeout = 90)
{
    char out[8192], host[256], expect[300];
    he_cluster_t c;

    he_start(&c, 0);
    /* --advertise is what etcd tells (here: a port nobody listens on) */
    he_ctl_start(&c, 0, "/adv", "127.0.0.1:0", "127.0.0.1:1");
    cr_assert_eq(he_kvfctl(c.url, "/adv", out, sizeof(out)), 1, "%s", out);
    cr_assert_not_null(strstr(out, "127.0.0.1:1"), "%s", out);
    /* a wildcard listen address publishes the host name instead */
    he_ctl_start(&c, 1, "/any", "0.0.0.0:0", NULL);
    cr_assert_eq(gethostname(host, sizeof(host)), 0);
    snprintf(expect, sizeof(expect), "publishing %s:", host);
    cr_assert(kvf_test_proc_wait_log(&c.ctl[1], expect, 1000), "%s",
              kvf_test_proc_log(&c.ctl[1]));
    he_stop(&c);
}

static void he_deregister(kvf_ctlconn_t *conn, uint32_t node_id,
                          uint64_t incarnation)
{
    Kvf__Deregister dr;
    kvf_frame_t frame;

    kvf__deregister__init(&dr);
    dr.request_id  = 1;
    dr.node_id     = node_id;
    dr.incarnation = incarnation;
    cr_assert_eq(kvf_ctlconn_call(conn, KVF_MSG_DEREGISTER, &dr.base, &frame),
                 KVF_OK);
    cr_assert_eq(frame.type, KVF_MSG_STATUS);
    cr_assert_eq(((Kvf__Status *)frame.msg)->status, KVF_OK);
    kvf_frame_release(&frame, NULL);
}

Test(ha_etcd, a_leader_that_lost_every_agent_resigns, .timeout = 90)
{
    kvf_ctlconn_t *conn = NULL;
    char addr[128], err[256];
    he_cluster_t c;
    int leader, next, status;
    uint64_t t0;

    he_start(&c, 0);
    for (leader = 0; leader < 2; leader++) {
        const char *argv[] = {kvf_th_build_path("controller/kvf-controller"),
                              "--listen",
                              "127.0.0.1:0",
                              "--http",
                              "",
                              "--lease",
                              "1s",
                              "--port-file",
                              c.ports[leader],
                              "--etcd",
                              c.url,
                              "--etcd-prefix",
                              "/resign",
                              NULL};

        snprintf(c.ports[leader], sizeof(c.ports[leader]), "%s/ctl%d.ports",
                 c.dir, leader);
        cr_assert_eq(kvf_test_proc_start(&c.ctl[leader], argv), 0);
        c.running[leader] = true;
        if (leader == 0) {
            he_leader(&c);
        }
    }
    leader = he_leader(&c);
    cr_assert_eq(leader, 0);
    cr_assert(kvf_test_proc_wait_log(&c.ctl[1], "standby", 10000));
    cr_assert(kvf_test_port_file_serving(c.ports[0], addr, sizeof(addr)));
    /* an agent that deregisters leaves, it is not lost: no resignation
     * (a rolling restart of a one-agent cluster must not move the leader) */
    cr_assert_eq(kvf_ctlconn_create(addr, KVF__PEER_KIND__PEER_AGENT, "he",
                                    KVF_PROTOCOL_VERSION, 5000, &conn, err,
                                    sizeof(err)),
                 KVF_OK, "%s", err);
    he_deregister(conn, kvf_th_register(conn, "he-leaver", 1, NULL), 1);
    kvf_ctlconn_destroy(conn);
    cr_assert_eq(kvf_test_proc_wait_exit(&c.ctl[0], 3000), -1,
                 "the leader resigned after a clean leave: %s",
                 kvf_test_proc_log(&c.ctl[0]));
    /* one agent registers, then is gone (its lease of 1 s expires) */
    cr_assert_eq(kvf_ctlconn_create(addr, KVF__PEER_KIND__PEER_AGENT, "he",
                                    KVF_PROTOCOL_VERSION, 5000, &conn, err,
                                    sizeof(err)),
                 KVF_OK, "%s", err);
    kvf_th_register(conn, "he-node", 1, NULL);
    kvf_ctlconn_destroy(conn);
    status       = kvf_test_proc_wait_exit(&c.ctl[0], 10000);
    t0           = kvf_time_now_ns();
    c.running[0] = false;
    cr_assert_eq(status, 4, "exit %d: %s", status,
                 kvf_test_proc_log(&c.ctl[0]));
    cr_assert_not_null(
        strstr(kvf_test_proc_log(&c.ctl[0]), "lost every agent"));
    /* it revoked its lease: the standby wins well before the 2 s TTL */
    next = he_leader(&c);
    cr_assert_eq(next, 1);
    fprintf(stderr, "ha-etcd: resigned leader replaced after %.0f ms\n",
            (double)(kvf_time_now_ns() - t0) / 1e6);
    cr_expect_lt(kvf_time_now_ns() - t0, 2000 * KVF_NSEC_PER_MSEC);
    he_stop(&c);
}
