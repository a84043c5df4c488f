/* SPDX-License-Identifier: Apache-2.0 */
/* Copyright (c) 2026 The kvfabric authors */
/*
 * Controller high availability on etcd (issue 21, item 1): a real local
 * etcd on loopback (free ports), real kvf-controller processes with
 * --etcd. Only the leader binds and writes its port file; standbys wait.
 * kill -9 of the leader: a standby answers lookups within the lease TTL
 * (+ one poll + start-up), measured. etcd unreachable: the leader stops
 * serving (exit 3) before its lease can expire. SIGTERM: the leader
 * resigns and a standby takes over well before the TTL.
 */
#include "tests/helpers/proc.h"
#include "tests/integration/controller_harness.h"

#include "common/time.h"

#include <inttypes.h>

#include <criterion/criterion.h>

#include <signal.h>
#include <sys/wait.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define HA_CTLS     3
#define HA_LEASE_MS 2000
#define HA_KEYS     16

typedef struct ha_cluster {
    kvf_test_proc_t etcd;
    char dir[64];
    char url[64];
    kvf_test_proc_t ctl[HA_CTLS];
    char ports[HA_CTLS][128];
    char listen[HA_CTLS][32]; /* "": 127.0.0.1:0 */
    bool running[HA_CTLS];
    const char *node_lease; /* NULL: the default */
    const char *etcd_lease; /* NULL: 2s */
} ha_cluster_t;

static void ha_pause(void)
{
    /* a polling step of a deadline-bounded wait */
    struct timespec ts = {0, 5 * 1000 * 1000};

    nanosleep(&ts, NULL);
}

static void ha_etcd_start(ha_cluster_t *c)
{
    char data[128], client[64], peer[64], cluster[96];
    uint16_t cport, pport;
    uint64_t deadline;
    char out[256];

    if (access("/usr/bin/etcd", X_OK) != 0) {
        cr_skip_test("etcd is not installed (Debian etcd-server; the "
                     "Makefile's DEBS install it)");
    }
    snprintf(c->dir, sizeof(c->dir), "/tmp/kvf-ha-XXXXXX");
    cr_assert_not_null(mkdtemp(c->dir));
    cport = kvf_test_free_port();
    pport = kvf_test_free_port();
    cr_assert_neq(cport, pport);
    snprintf(data, sizeof(data), "%s/etcd", c->dir);
    snprintf(client, sizeof(client), "http://127.0.0.1:%u", cport);
    snprintf(peer, sizeof(peer), "http://127.0.0.1:%u", pport);
    snprintf(cluster, sizeof(cluster), "ha=%s", peer);
    snprintf(c->url, sizeof(c->url), "%s", client);
    {
        const char *argv[] = {"/usr/bin/etcd",
                              "--name",
                              "ha",
                              "--data-dir",
                              data,
                              "--listen-client-urls",
                              client,
                              "--advertise-client-urls",
                              client,
                              "--listen-peer-urls",
                              peer,
                              "--initial-advertise-peer-urls",
                              peer,
                              "--initial-cluster",
                              cluster,
                              NULL};

        cr_assert_eq(kvf_test_proc_start(&c->etcd, argv), 0);
    }
    deadline = kvf_time_deadline_ns(20 * KVF_NSEC_PER_SEC);
    while (kvf_test_http_get(cport, "/health", out, sizeof(out)) != 200) {
        cr_assert(!kvf_time_expired(deadline), "etcd did not start: %s",
                  kvf_test_proc_log(&c->etcd));
        cr_assert(kvf_test_proc_alive(&c->etcd), "etcd exited: %s",
                  kvf_test_proc_log(&c->etcd));
        ha_pause();
    }
}

static void ha_ctl_start(ha_cluster_t *c, int i)
{
    const char *argv[] = {kvf_th_build_path("controller/kvf-controller"),
                          "--listen",
                          (c->listen[i][0] != '\0') ? c->listen[i]
                                                    : "127.0.0.1:0",
                          "--http",
                          "127.0.0.1:0",
                          "--port-file",
                          c->ports[i],
                          "--etcd",
                          c->url,
                          "--etcd-prefix",
                          "/kvf-ha-test",
                          "--etcd-lease",
                          (c->etcd_lease != NULL) ? c->etcd_lease : "2s",
                          (c->node_lease != NULL) ? "--lease" : NULL,
                          c->node_lease,
                          NULL};

    snprintf(c->ports[i], sizeof(c->ports[i]), "%s/ctl%d.ports", c->dir, i);
    cr_assert_eq(kvf_test_proc_start(&c->ctl[i], argv), 0);
    c->running[i] = true;
}

/* The control address from controller @p i's port file, if it wrote one
 * (only a leader does). */
static bool ha_ctl_addr(ha_cluster_t *c, int i, char *addr, size_t len)
{
    FILE *f;
    bool ok;

    if (!c->running[i] || ((f = fopen(c->ports[i], "r")) == NULL)) {
        return false;
    }
    ok = (fgets(addr, (int)len, f) != NULL);
    fclose(f);
    addr[strcspn(addr, "\n")] = '\0';
    return ok && (addr[0] != '\0');
}

/* Waits for a leader among the running controllers; returns its index. */
static int ha_wait_leader(ha_cluster_t *c, int timeout_ms, char *addr,
                          size_t len)
{
    uint64_t deadline =
        kvf_time_deadline_ns((uint64_t)timeout_ms * KVF_NSEC_PER_MSEC);
    int i;

    for (;;) {
        for (i = 0; i < HA_CTLS; i++) {
            if (ha_ctl_addr(c, i, addr, len)) {
                return i;
            }
        }
        cr_assert(!kvf_time_expired(deadline), "no leader elected");
        ha_pause();
    }
}

/* The HTTP port of controller @p i (its port file's second line; a
 * standby writes one too, with an empty control line); 0 if none yet. */
static uint16_t ha_http_port(ha_cluster_t *c, int i)
{
    char line[128];
    const char *colon;
    bool ok;
    FILE *f;

    if ((f = fopen(c->ports[i], "r")) == NULL) {
        return 0;
    }
    ok = (fgets(line, sizeof(line), f) != NULL) &&
         (fgets(line, sizeof(line), f) != NULL);
    fclose(f);
    if (!ok || ((colon = strrchr(line, ':')) == NULL)) {
        return 0;
    }
    return (uint16_t)atoi(colon + 1);
}

/* The value of the metric line starting @p name in controller @p i's
 * /metrics. */
static uint64_t ha_metric(ha_cluster_t *c, int i, const char *name)
{
    char out[16384], want[160];
    uint16_t port = ha_http_port(c, i);
    const char *p;

    cr_assert_neq(port, 0, "controller %d wrote no port file", i);
    cr_assert_eq(kvf_test_http_get(port, "/metrics", out, sizeof(out)), 200);
    snprintf(want, sizeof(want), "\n%s ", name);
    cr_assert_not_null(p = strstr(out, want), "%s not in %s", name, out);
    return strtoull(p + strlen(want), NULL, 10);
}

/* kvf_controller_leader_term from controller @p i's /metrics. */
static uint64_t ha_term(ha_cluster_t *c, int i)
{
    return ha_metric(c, i, "kvf_controller_leader_term");
}

static int ha_leaders(ha_cluster_t *c)
{
    char addr[128];
    int i, n = 0;

    for (i = 0; i < HA_CTLS; i++) {
        n += ha_ctl_addr(c, i, addr, sizeof(addr));
    }
    return n;
}

static void ha_stop_all(ha_cluster_t *c)
{
    int i;
    int status;

    for (i = 0; i < HA_CTLS; i++) {
        if (c->running[i]) {
            status = kvf_test_proc_stop(&c->ctl[i], 10000);
            cr_expect_eq(status, 0, "controller %d exited %d: %s", i, status,
                         kvf_test_proc_log(&c->ctl[i]));
            c->running[i] = false;
        }
    }
    kill(c->etcd.pid, SIGCONT);
    kvf_test_proc_stop(&c->etcd, 10000);
    {
        char cmd[128];

        snprintf(cmd, sizeof(cmd), "rm -rf '%s'", c->dir);
        cr_expect_eq(system(cmd), 0);
    }
}

/* Registers a node on @p addr, reports HA_KEYS keys (ADMIT, or the
 * INVENTORY of a resync) and checks a lookup finds them all. */
static void ha_fill(const char *addr, uint16_t type)
{
    kvf_ctlconn_t *conn = NULL;
    char err[256];
    uint32_t node;

    cr_assert_eq(kvf_ctlconn_create(addr, KVF__PEER_KIND__PEER_AGENT, "ha",
                                    KVF_PROTOCOL_VERSION, 5000, &conn, err,
                                    sizeof(err)),
                 KVF_OK, "%s", err);
    node = kvf_th_register(conn, "ha-node", 1, NULL);
    cr_assert_eq(kvf_th_batch(conn, type, node, 1, 1, 0, HA_KEYS, true),
                 KVF_OK);
    cr_assert_eq(kvf_th_lookup(conn, 0, 0, HA_KEYS, NULL, NULL), HA_KEYS);
    kvf_ctlconn_destroy(conn);
}

/* Time from now until a controller answers a LOOKUP (any answer). */
static uint64_t ha_time_to_answer(ha_cluster_t *c, int timeout_ms, int *who)
{
    uint64_t t0 = kvf_time_now_ns(), deadline;
    kvf_ctlconn_t *conn;
    char addr[128], err[256];
    int i;

    deadline = kvf_time_deadline_ns((uint64_t)timeout_ms * KVF_NSEC_PER_MSEC);
    for (;;) {
        for (i = 0; i < HA_CTLS; i++) {
            conn = NULL;
            if (!ha_ctl_addr(c, i, addr, sizeof(addr)) ||
                (kvf_ctlconn_create(addr, KVF__PEER_KIND__PEER_AGENT, "ha",
                                    KVF_PROTOCOL_VERSION, 1000, &conn, err,
                                    sizeof(err)) != KVF_OK)) {
                continue;
            }
            kvf_th_lookup(conn, 0, 0, HA_KEYS, NULL, NULL);
            kvf_ctlconn_destroy(conn);
            *who = i;
            return kvf_time_now_ns() - t0;
        }
        if (kvf_time_expired(deadline)) {
            for (i = 0; i < HA_CTLS; i++) {
                if (c->running[i]) {
                    fprintf(stderr, "controller %d:\n%s\n", i,
                            kvf_test_proc_log(&c->ctl[i]));
                }
            }
            cr_assert_fail("no controller answers");
        }
        ha_pause();
    }
}

Test(ha, kill9_leader_standby_answers_within_ttl, .timeout = 120)
{
    ha_cluster_t c;
    char addr[128];
    uint64_t took, term;
    int i, leader, next, last;

    memset(&c, 0, sizeof(c));
    ha_etcd_start(&c);
    for (i = 0; i < HA_CTLS; i++) {
        ha_ctl_start(&c, i);
    }
    leader = ha_wait_leader(&c, 20000, addr, sizeof(addr));
    /* the others are standbys: they say so and do not serve */
    for (i = 0; i < HA_CTLS; i++) {
        if (i != leader) {
            cr_assert(kvf_test_proc_wait_log(&c.ctl[i], "standby", 10000), "%s",
                      kvf_test_proc_log(&c.ctl[i]));
        }
    }
    cr_assert_eq(ha_leaders(&c), 1);
    ha_fill(addr, KVF_MSG_ADMIT);
    term = ha_term(&c, leader);
    cr_assert_gt(term, 0);

    kvf_test_proc_kill(&c.ctl[leader]);
    c.running[leader] = false;
    took              = ha_time_to_answer(&c, 20000, &next);
    fprintf(stderr,
            "ha: kill -9 of the leader: a standby answered lookups "
            "after %.0f ms (lease %d ms)\n",
            (double)took / 1e6, HA_LEASE_MS);
    /* target <= 3 s (typically 2.1-2.4 s here); 1 s of slack for ASan
     * on a loaded 2-core CI machine */
    cr_expect_leq(took, 4000 * KVF_NSEC_PER_MSEC,
                  "failover took %.0f ms, target <= 3000 ms",
                  (double)took / 1e6);
    cr_assert_eq(ha_leaders(&c), 1, "exactly one leader after failover");
    cr_assert_gt(ha_term(&c, next), term, "a new election, a newer term");
    cr_assert(kvf_test_proc_wait_log(&c.ctl[next], "term", 1000));
    /* the node comes back with its incarnation; its resync replaces what
     * the warm copy had */
    cr_assert(ha_ctl_addr(&c, next, addr, sizeof(addr)));
    ha_fill(addr, KVF_MSG_INVENTORY);

    /* a clean stop resigns: the last standby takes over before the TTL */
    cr_assert_eq(kvf_test_proc_stop(&c.ctl[next], 10000), 0, "%s",
                 kvf_test_proc_log(&c.ctl[next]));
    c.running[next] = false;
    took            = ha_time_to_answer(&c, 20000, &last);
    fprintf(stderr, "ha: SIGTERM of the leader: handover in %.0f ms\n",
            (double)took / 1e6);
    cr_expect_lt(took, (uint64_t)HA_LEASE_MS * KVF_NSEC_PER_MSEC,
                 "a resigning leader hands over before its lease expires");
    cr_assert_neq(last, next);
    ha_stop_all(&c);
}

Test(ha, leader_cut_off_from_etcd_stops_serving, .timeout = 120)
{
    ha_cluster_t c;
    char addr[128];
    uint64_t t0, took;
    int leader, next, status;

    memset(&c, 0, sizeof(c));
    ha_etcd_start(&c);
    ha_ctl_start(&c, 0);
    leader = ha_wait_leader(&c, 20000, addr, sizeof(addr));
    ha_ctl_start(&c, 1);
    cr_assert(kvf_test_proc_wait_log(&c.ctl[1], "standby", 10000));

    /* etcd stops answering: the leader cannot renew its lease */
    t0 = kvf_time_now_ns();
    cr_assert_eq(kill(c.etcd.pid, SIGSTOP), 0);
    status = kvf_test_proc_wait_exit(&c.ctl[leader], HA_LEASE_MS + 3000);
    took   = kvf_time_now_ns() - t0;
    c.running[leader] = false;
    fprintf(stderr,
            "ha: etcd unreachable: the leader stopped serving after "
            "%.0f ms (lease %d ms)\n",
            (double)took / 1e6, HA_LEASE_MS);
    cr_assert_eq(status, 3, "leader exit status %d: %s", status,
                 kvf_test_proc_log(&c.ctl[leader]));
    /* before its lease could have expired in etcd (last renewal <= t0) */
    cr_assert_lt(took, (uint64_t)HA_LEASE_MS * KVF_NSEC_PER_MSEC);
    cr_assert_eq(ha_leaders(&c), 0, "the standby cannot win without etcd");

    /* etcd back: the standby wins once the old lease expired */
    cr_assert_eq(kill(c.etcd.pid, SIGCONT), 0);
    took = ha_time_to_answer(&c, 20000, &next);
    cr_assert_eq(next, 1);
    fprintf(stderr, "ha: etcd back: the standby answered after %.0f ms\n",
            (double)took / 1e6);
    ha_stop_all(&c);
}

/* kvfctl --controller @p list nodes --json; true when it answered and
 * lists @p name. */
static bool ha_kvfctl_lists(const char *list, const char *name)
{
    char bin[4096], out[8192];
    const char *argv[] = {bin, "--controller", list, "nodes", "--json", NULL};

    snprintf(bin, sizeof(bin), "%s", kvf_test_build_path("tools/kvfctl"));
    return (kvf_test_run(argv, out, sizeof(out), 10000) == 0) &&
           (strstr(out, name) != NULL);
}

Test(ha, agent_and_kvfctl_follow_the_leader, .timeout = 120)
{
    char list[128], addr[128], sock[96], bin[4096];
    kvf_test_proc_t agent;
    uint64_t t0, deadline, took;
    int i, leader;

    {
        ha_cluster_t c;
        const char *argv[] = {bin,
                              "--controller",
                              list,
                              "--name",
                              "ha-agent",
                              "--socket",
                              sock,
                              "--http",
                              "",
                              "--listen",
                              "127.0.0.1:0",
                              "--pool-size",
                              "16M",
                              "--max-chunk",
                              "1M",
                              "--reconnect-max",
                              "200ms",
                              NULL};

        memset(&c, 0, sizeof(c));
        snprintf(bin, sizeof(bin), "%s", kvf_th_build_path("agent/kvf-agent"));
        ha_etcd_start(&c);
        list[0] = '\0';
        for (i = 0; i < HA_CTLS; i++) {
            snprintf(c.listen[i], sizeof(c.listen[i]), "127.0.0.1:%u",
                     kvf_test_free_port());
            snprintf(list + strlen(list), sizeof(list) - strlen(list), "%s%s",
                     (i > 0) ? "," : "", c.listen[i]);
            ha_ctl_start(&c, i);
        }
        leader = ha_wait_leader(&c, 20000, addr, sizeof(addr));
        snprintf(sock, sizeof(sock), "/tmp/kvf-ha-agent-%d.sock",
                 (int)getpid());
        cr_assert_eq(kvf_test_proc_start(&agent, argv), 0);
        deadline = kvf_time_deadline_ns(20 * KVF_NSEC_PER_SEC);
        while (!ha_kvfctl_lists(list, "\"ha-agent\"")) {
            cr_assert(!kvf_time_expired(deadline), "agent not registered: %s",
                      kvf_test_proc_log(&agent));
            ha_pause();
        }

        kvf_test_proc_kill(&c.ctl[leader]);
        c.running[leader] = false;
        t0                = kvf_time_now_ns();
        deadline          = kvf_time_deadline_ns(20 * KVF_NSEC_PER_SEC);
        /* kvfctl finds the new leader in the list; the agent re-registered
         * there on its own */
        while (!ha_kvfctl_lists(list, "\"ha-agent\"")) {
            cr_assert(!kvf_time_expired(deadline),
                      "agent did not follow the leader: %s",
                      kvf_test_proc_log(&agent));
            ha_pause();
        }
        took = kvf_time_now_ns() - t0;
        fprintf(stderr,
                "ha: kill -9 of the leader: the agent was registered "
                "with the new leader after %.0f ms\n",
                (double)took / 1e6);
        cr_assert(kvf_test_proc_alive(&agent));
        cr_assert_eq(kvf_test_proc_stop(&agent, 10000), 0, "%s",
                     kvf_test_proc_log(&agent));
        ha_stop_all(&c);
    }
}

Test(ha, paused_leader_answers_nothing_after_resume, .timeout = 120)
{
    ha_cluster_t c;
    kvf_ctlconn_t *conn = NULL;
    char addr[128], err[256];
    uint8_t keys[KVF_KEY_WIRE_SIZE];
    kvf_frame_t frame;
    Kvf__Lookup lk;
    kvf_status_t status;
    int leader, next, status_exit;

    memset(&c, 0, sizeof(c));
    ha_etcd_start(&c);
    ha_ctl_start(&c, 0);
    leader = ha_wait_leader(&c, 20000, addr, sizeof(addr));
    ha_ctl_start(&c, 1);
    cr_assert(kvf_test_proc_wait_log(&c.ctl[1], "standby", 10000));
    cr_assert_eq(kvf_ctlconn_create(addr, KVF__PEER_KIND__PEER_AGENT, "ha",
                                    KVF_PROTOCOL_VERSION, 8000, &conn, err,
                                    sizeof(err)),
                 KVF_OK, "%s", err);

    /* the leader freezes (SIGSTOP: a VM pause, a long GC) past its lease;
     * the standby takes over */
    cr_assert_eq(kill(c.ctl[leader].pid, SIGSTOP), 0);
    ha_time_to_answer(&c, 20000, &next);
    cr_assert_eq(next, 1);

    /* a request waits in the frozen leader's socket; it resumes */
    kvf_th_keys(keys, 1, 0);
    kvf__lookup__init(&lk);
    lk.request_id = kvf_ctlconn_next_id(conn);
    lk.keys.data  = keys;
    lk.keys.len   = sizeof(keys);
    cr_assert_eq(kvf_ctlconn_send(conn, KVF_MSG_LOOKUP, &lk.base), KVF_OK);
    cr_assert_eq(kill(c.ctl[leader].pid, SIGCONT), 0);
    status = kvf_ctlconn_recv(conn, &frame);
    if (status == KVF_OK) {
        kvf_frame_release(&frame, NULL);
    }
    cr_assert_neq(status, KVF_OK, "a deposed leader answered after resume");
    kvf_ctlconn_destroy(conn);
    status_exit       = kvf_test_proc_wait_exit(&c.ctl[leader], 10000);
    c.running[leader] = false;
    cr_assert_eq(status_exit, 3, "%s", kvf_test_proc_log(&c.ctl[leader]));
    ha_stop_all(&c);
}

Test(ha, agent_print_config_accepts_a_controller_list)
{
    char bin[4096], out[8192];
    const char *ok[]  = {bin, "--print-config", "--controller",
                         "127.0.0.1:7400,127.0.0.1:7500", NULL};
    const char *bad[] = {bin, "--print-config", "--controller",
                         "127.0.0.1:7400,nope", NULL};

    snprintf(bin, sizeof(bin), "%s", kvf_th_build_path("agent/kvf-agent"));
    cr_assert_eq(kvf_test_run(ok, out, sizeof(out), 10000), 0, "%s", out);
    cr_assert_neq(kvf_test_run(bad, out, sizeof(out), 10000), 0, "%s", out);
}

#define HA_WARM_NODES   2
#define HA_WARM_BATCHES 32
#define HA_WARM_BATCH   256
#define HA_WARM_KEYS    (HA_WARM_BATCHES * HA_WARM_BATCH)
#define HA_WARM_ROUNDS  4

/* Waits until controller @p i's registry holds @p keys keys (a standby's
 * copy of the leader's). */
static void ha_wait_keys(ha_cluster_t *c, int i, uint64_t keys)
{
    uint64_t deadline = kvf_time_deadline_ns(20 * KVF_NSEC_PER_SEC);

    while ((ha_http_port(c, i) == 0) ||
           (ha_metric(c, i, "kvf_controller_keys") != keys)) {
        cr_assert(
            !kvf_time_expired(deadline),
            "controller %d holds %" PRIu64 " keys, not %" PRIu64 ": %s", i,
            (ha_http_port(c, i) != 0) ? ha_metric(c, i, "kvf_controller_keys")
                                      : 0,
            keys, kvf_test_proc_log(&c->ctl[i]));
        ha_pause();
    }
}

/* A child that registers "ha-load-R" on @p addr and then ADMITs 64 keys
 * and looks them up, in a loop, until the controller goes away; returns
 * once it has done 20 rounds (the load is on). */
static pid_t ha_load_start(const char *addr, int r)
{
    int fds[2];
    char name[32], c;
    pid_t pid;

    cr_assert_eq(pipe(fds), 0);
    pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        kvf_ctlconn_t *conn = NULL;
        uint8_t keys[64 * KVF_KEY_WIRE_SIZE];
        Kvf__RegisterReply *reg;
        kvf_frame_t frame;
        Kvf__Register rq;
        Kvf__KeyBatch kb;
        Kvf__Lookup lk;
        char err[256];
        uint64_t i;
        uint32_t id;

        close(fds[0]);
        snprintf(name, sizeof(name), "ha-load-%d", r);
        if (kvf_ctlconn_create(addr, KVF__PEER_KIND__PEER_AGENT, name,
                               KVF_PROTOCOL_VERSION, 5000, &conn, err,
                               sizeof(err)) != KVF_OK) {
            _exit(1);
        }
        kvf__register__init(&rq);
        rq.request_id   = kvf_ctlconn_next_id(conn);
        rq.name         = name;
        rq.incarnation  = 1;
        rq.data_address = name;
        if ((kvf_ctlconn_call(conn, KVF_MSG_REGISTER, &rq.base, &frame) !=
             KVF_OK) ||
            (frame.type != KVF_MSG_REGISTER_REPLY)) {
            _exit(1);
        }
        reg = (Kvf__RegisterReply *)frame.msg;
        id  = reg->node_id;
        kvf_frame_release(&frame, NULL);
        for (i = 0;; i++) {
            kvf_th_keys(keys, 64, 1000000 + (uint64_t)r * 100000 + i * 64);
            kvf__key_batch__init(&kb);
            kb.request_id  = kvf_ctlconn_next_id(conn);
            kb.node_id     = id;
            kb.incarnation = 1;
            kb.seq         = i + 1;
            kb.keys.data   = keys;
            kb.keys.len    = sizeof(keys);
            if (kvf_ctlconn_call(conn, KVF_MSG_ADMIT, &kb.base, &frame) !=
                KVF_OK) {
                break; /* the leader is gone */
            }
            kvf_frame_release(&frame, NULL);
            kvf__lookup__init(&lk);
            lk.request_id = kvf_ctlconn_next_id(conn);
            lk.keys.data  = keys;
            lk.keys.len   = sizeof(keys);
            if (kvf_ctlconn_call(conn, KVF_MSG_LOOKUP, &lk.base, &frame) !=
                KVF_OK) {
                break;
            }
            kvf_frame_release(&frame, NULL);
            if ((i == 20) && (write(fds[1], "x", 1) != 1)) {
                break;
            }
        }
        kvf_ctlconn_destroy(conn);
        _exit(0);
    }
    close(fds[1]);
    cr_assert_eq(read(fds[0], &c, 1), 1, "the load did not start");
    close(fds[0]);
    return pid;
}

/* Waits for the load child (it ends when its controller died). */
static void ha_load_wait(pid_t pid)
{
    int status = 0;

    cr_assert_eq(waitpid(pid, &status, 0), pid);
    cr_assert(WIFEXITED(status) && (WEXITSTATUS(status) == 0),
              "load child: status %d", status);
}

static int ha_cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

    return (x > y) - (x < y);
}

/*
 * Item 3 (warm standby): two nodes report keys in batches to the leader;
 * the standbys follow its stream. kill -9 of the leader while a third
 * node admits and looks up as fast as it can: the new leader's
 * very first lookup, before any agent came back (these never do), finds
 * every key at its holder, with the holders' node ids of the old leader;
 * a node that then registers again with its incarnation keeps its id.
 * Repeated (the killed controller comes back as a standby) to measure the
 * failover, kill -9 to the first lookup answered with every key.
 */
Test(ha, kill9_warm_standby_answers_lookups_at_once, .timeout = 240)
{
    ha_cluster_t c;
    kvf_ctlconn_t *agent[HA_WARM_NODES], *conn;
    uint32_t ids[HA_WARM_NODES], *holders;
    uint64_t took[HA_WARM_ROUNDS], t0, deadline, keys = 0, inc = 1;
    pid_t loader;
    char addr[128], err[256], state[32];
    int i, n, r, leader, next;
    double load[3] = {0, 0, 0};

    memset(&c, 0, sizeof(c));
    c.node_lease = "120s"; /* the nodes of earlier rounds stay */
    ha_etcd_start(&c);
    for (i = 0; i < HA_CTLS; i++) {
        ha_ctl_start(&c, i);
    }
    leader  = ha_wait_leader(&c, 20000, addr, sizeof(addr));
    holders = calloc(HA_WARM_KEYS, sizeof(*holders));
    for (r = 0; r < HA_WARM_ROUNDS; r++) {
        /* the standbys follow (the killed one came back as one) */
        for (i = 0; i < HA_CTLS; i++) {
            if (i != leader) {
                cr_assert(
                    kvf_test_proc_wait_log(&c.ctl[i], "standby: warm", 20000),
                    "%s", kvf_test_proc_log(&c.ctl[i]));
            }
        }
        /* each round: two new nodes, HA_WARM_KEYS keys each */
        for (n = 0; n < HA_WARM_NODES; n++) {
            char name[32];
            uint64_t b;

            snprintf(name, sizeof(name), "ha-warm-%d-%d", r, n);
            cr_assert_eq(kvf_ctlconn_create(addr, KVF__PEER_KIND__PEER_AGENT,
                                            name, KVF_PROTOCOL_VERSION, 5000,
                                            &agent[n], err, sizeof(err)),
                         KVF_OK, "%s", err);
            ids[n] = kvf_th_register(agent[n], name, inc, NULL);
            for (b = 0; b < HA_WARM_BATCHES; b++) {
                cr_assert_eq(kvf_th_batch(agent[n], KVF_MSG_ADMIT, ids[n], inc,
                                          b + 1,
                                          (uint64_t)(r * HA_WARM_NODES + n) *
                                                  HA_WARM_KEYS +
                                              b * HA_WARM_BATCH,
                                          HA_WARM_BATCH, false),
                             KVF_OK);
            }
        }
        /* the standbys have it all (the load of earlier rounds too) */
        keys = ha_metric(&c, leader, "kvf_controller_keys");
        cr_assert_geq(keys, (uint64_t)(r + 1) * HA_WARM_NODES * HA_WARM_KEYS);
        for (i = 0; i < HA_CTLS; i++) {
            ha_wait_keys(&c, i, keys);
        }

        /* under load: a third node admits and looks up while it dies */
        loader = ha_load_start(addr, r);
        kvf_test_proc_kill(&c.ctl[leader]);
        c.running[leader] = false;
        t0                = kvf_time_now_ns();
        ha_load_wait(loader);
        for (n = 0; n < HA_WARM_NODES; n++) {
            kvf_ctlconn_destroy(agent[n]); /* they never come back */
        }
        deadline = kvf_time_deadline_ns(20 * KVF_NSEC_PER_SEC);
        for (;;) {
            for (next = 0; next < HA_CTLS; next++) {
                if (ha_ctl_addr(&c, next, addr, sizeof(addr))) {
                    break;
                }
            }
            if ((next < HA_CTLS) &&
                (kvf_ctlconn_create(addr, KVF__PEER_KIND__PEER_AGENT,
                                    "ha-probe", KVF_PROTOCOL_VERSION, 2000,
                                    &conn, err, sizeof(err)) == KVF_OK)) {
                break;
            }
            cr_assert(!kvf_time_expired(deadline), "no new leader");
            ha_pause();
        }
        /* the new leader's first request: every key of this round at its
         * holder, under the old leader's node ids */
        for (n = 0; n < HA_WARM_NODES; n++) {
            uint64_t base = (uint64_t)(r * HA_WARM_NODES + n) * HA_WARM_KEYS;
            uint32_t k;

            cr_assert_eq(
                kvf_th_lookup(conn, 0, base, HA_WARM_KEYS, holders, NULL),
                HA_WARM_KEYS, "round %d node %d: %s", r, n,
                kvf_test_proc_log(&c.ctl[next]));
            for (k = 0; k < HA_WARM_KEYS; k++) {
                cr_assert_eq(holders[k], ids[n]);
            }
            if (n == 0) {
                took[r] = kvf_time_now_ns() - t0;
            }
        }
        kvf_th_node_state(conn, ids[0], state, sizeof(state));
        cr_assert_str_eq(state, "alive");
        /* the node comes back with its incarnation: same id, keys kept */
        {
            char name[32];

            snprintf(name, sizeof(name), "ha-warm-%d-0", r);
            cr_assert_eq(kvf_th_register(conn, name, inc, NULL), ids[0]);
            cr_assert_eq(
                kvf_th_lookup(conn, 0,
                              (uint64_t)(r * HA_WARM_NODES) * HA_WARM_KEYS,
                              HA_WARM_KEYS, NULL, NULL),
                HA_WARM_KEYS);
        }
        kvf_ctlconn_destroy(conn);
        cr_assert(kvf_test_proc_wait_log(&c.ctl[next], "elected warm", 1000),
                  "%s", kvf_test_proc_log(&c.ctl[next]));
        fprintf(stderr,
                "ha: round %d: kill -9 of the leader: the warm standby "
                "answered %d keys after %.0f ms\n",
                r, HA_WARM_NODES * HA_WARM_KEYS, (double)took[r] / 1e6);
        if (r + 1 < HA_WARM_ROUNDS) {
            ha_ctl_start(&c, leader); /* back, as a standby */
        }
        leader = next;
    }
    getloadavg(load, 3);
    qsort(took, HA_WARM_ROUNDS, sizeof(took[0]), ha_cmp_u64);
    fprintf(
        stderr,
        "ha: warm failover over %d kill -9: min %.0f ms, median %.0f ms, "
        "max %.0f ms (lease %d ms; load average %.2f %.2f %.2f)\n",
        HA_WARM_ROUNDS, (double)took[0] / 1e6,
        (double)(took[(HA_WARM_ROUNDS - 1) / 2] + took[HA_WARM_ROUNDS / 2]) /
            2e6,
        (double)took[HA_WARM_ROUNDS - 1] / 1e6, HA_LEASE_MS, load[0], load[1],
        load[2]);
    free(holders);
    ha_stop_all(&c);
}

/* ADMIN_COMMAND @p type of keys base..base+n-1 (or of node @p node);
 * returns the STATUS reply's status. */
static int ha_admin(kvf_ctlconn_t *conn, int type, uint64_t base, size_t n,
                    uint32_t node)
{
    uint8_t keys[8 * KVF_KEY_WIRE_SIZE];
    Kvf__AdminCommand ac;
    kvf_frame_t frame;
    int status;

    cr_assert_leq(n, 8);
    kvf_th_keys(keys, n, base);
    kvf__admin_command__init(&ac);
    ac.request_id = kvf_ctlconn_next_id(conn);
    ac.type       = (Kvf__CommandType)type;
    ac.keys.data  = keys;
    ac.keys.len   = n * KVF_KEY_WIRE_SIZE;
    ac.node_id    = node;
    cr_assert_eq(
        kvf_ctlconn_call(conn, KVF_MSG_ADMIN_COMMAND, &ac.base, &frame),
        KVF_OK);
    cr_assert_eq(frame.type, KVF_MSG_STATUS);
    status = ((Kvf__Status *)frame.msg)->status;
    kvf_frame_release(&frame, NULL);
    return status;
}

/* Whether the value of etcd key @p key contains @p text (etcdctl). */
static bool ha_etcd_has(ha_cluster_t *c, const char *key, const char *text)
{
    char out[4096];

    return (kvf_th_run(out, sizeof(out),
                       "ETCDCTL_API=3 /usr/bin/etcdctl --endpoints %s get "
                       "--print-value-only %s",
                       c->url, key) == 0) &&
           (strstr(out, text) != NULL);
}

/*
 * Issue 21 item 3, second half: pins, soft pins and drained nodes survive
 * a failover through etcd, even to a controller that had nothing to
 * follow (a cold one: started after the leader died). A key pinned and
 * unpinned again is not pinned after it (no leaked pin).
 */
Test(ha, pins_and_drain_survive_failover_in_etcd, .timeout = 120)
{
    ha_cluster_t c;
    kvf_ctlconn_t *conn;
    Kvf__HeartbeatReply *hb;
    kvf_frame_t frame;
    char addr[128], err[256], state[32];
    size_t i, pinned = 0, soft = 0;
    uint64_t deadline;
    uint32_t node;
    int leader;

    memset(&c, 0, sizeof(c));
    /* what survives matters here, not how fast: a lease that outlives an
     * etcd write stalled by a loaded machine (2 s did not, once) */
    c.etcd_lease = "6s";
    ha_etcd_start(&c);
    ha_ctl_start(&c, 0);
    leader = ha_wait_leader(&c, 20000, addr, sizeof(addr));
    cr_assert_eq(kvf_ctlconn_create(addr, KVF__PEER_KIND__PEER_AGENT, "ha",
                                    KVF_PROTOCOL_VERSION, 5000, &conn, err,
                                    sizeof(err)),
                 KVF_OK, "%s", err);
    node = kvf_th_register(conn, "ha-pinned", 1, NULL);
    /* keys 100..103 pinned, 104 soft-pinned, 105 pinned then unpinned */
    cr_assert_eq(ha_admin(conn, KVF__COMMAND_TYPE__COMMAND_PIN, 100, 4, 0),
                 KVF_OK);
    cr_assert_eq(ha_admin(conn, KVF__COMMAND_TYPE__COMMAND_SOFT_PIN, 104, 1, 0),
                 KVF_OK);
    cr_assert_eq(ha_admin(conn, KVF__COMMAND_TYPE__COMMAND_PIN, 105, 1, 0),
                 KVF_OK);
    cr_assert_eq(ha_admin(conn, KVF__COMMAND_TYPE__COMMAND_UNPIN, 105, 1, 0),
                 KVF_OK);
    cr_assert_eq(ha_admin(conn, KVF__COMMAND_TYPE__COMMAND_DRAIN, 0, 0, node),
                 KVF_OK);
    kvf_ctlconn_destroy(conn);
    deadline = kvf_time_deadline_ns(10 * KVF_NSEC_PER_SEC);
    while (!ha_etcd_has(&c, "/kvf-ha-test/state/drained", "ha-pinned")) {
        cr_assert(!kvf_time_expired(deadline), "not in etcd: %s",
                  kvf_test_proc_log(&c.ctl[leader]));
        ha_pause();
    }

    kvf_test_proc_kill(&c.ctl[leader]);
    c.running[leader] = false;
    ha_ctl_start(&c, 1); /* cold: nothing to follow */
    leader = ha_wait_leader(&c, 20000, addr, sizeof(addr));
    cr_assert_eq(leader, 1);
    cr_assert_eq(kvf_ctlconn_create(addr, KVF__PEER_KIND__PEER_AGENT, "ha",
                                    KVF_PROTOCOL_VERSION, 5000, &conn, err,
                                    sizeof(err)),
                 KVF_OK, "%s", err);
    /* the agent comes back without saying it drains: etcd says so */
    node = kvf_th_register(conn, "ha-pinned", 1, NULL);
    kvf_th_node_state(conn, node, state, sizeof(state));
    cr_assert_str_eq(state, "draining", "%s",
                     kvf_test_proc_log(&c.ctl[leader]));
    /* its first heartbeat reply delivers the pins, and only those */
    kvf_th_heartbeat(conn, node, 1, 0, &frame);
    cr_assert_eq(frame.type, KVF_MSG_HEARTBEAT_REPLY);
    hb = (Kvf__HeartbeatReply *)frame.msg;
    for (i = 0; i < hb->n_commands; i++) {
        uint8_t want[5 * KVF_KEY_WIRE_SIZE];
        const Kvf__Command *cmd = hb->commands[i];

        kvf_th_keys(want, 5, 100);
        if (cmd->type == KVF__COMMAND_TYPE__COMMAND_PIN) {
            cr_assert_eq(cmd->keys.len, 4 * KVF_KEY_WIRE_SIZE);
            cr_assert_eq(memcmp(cmd->keys.data, want, cmd->keys.len), 0);
            pinned += cmd->keys.len / KVF_KEY_WIRE_SIZE;
        } else if (cmd->type == KVF__COMMAND_TYPE__COMMAND_SOFT_PIN) {
            cr_assert_eq(cmd->keys.len, KVF_KEY_WIRE_SIZE);
            cr_assert_eq(memcmp(cmd->keys.data, want + 4 * KVF_KEY_WIRE_SIZE,
                                KVF_KEY_WIRE_SIZE),
                         0);
            soft++;
        }
    }
    kvf_frame_release(&frame, NULL);
    cr_assert_eq(pinned, 4, "the pinned keys, not the unpinned one");
    cr_assert_eq(soft, 1);
    /* undrain is kept too */
    cr_assert_eq(ha_admin(conn, KVF__COMMAND_TYPE__COMMAND_UNDRAIN, 0, 0, node),
                 KVF_OK);
    kvf_ctlconn_destroy(conn);
    deadline = kvf_time_deadline_ns(10 * KVF_NSEC_PER_SEC);
    while (ha_etcd_has(&c, "/kvf-ha-test/state/drained", "ha-pinned")) {
        cr_assert(!kvf_time_expired(deadline), "undrain not in etcd");
        ha_pause();
    }
    ha_stop_all(&c);
}

/* GET @p path of controller @p i into @p out; asserts 200. */
static void ha_http(ha_cluster_t *c, int i, const char *path, char *out,
                    size_t len)
{
    uint16_t port     = 0;
    uint64_t deadline = kvf_time_deadline_ns(20 * KVF_NSEC_PER_SEC);

    while ((port = ha_http_port(c, i)) == 0) {
        cr_assert(!kvf_time_expired(deadline), "no port file: %s",
                  kvf_test_proc_log(&c->ctl[i]));
        ha_pause();
    }
    cr_assert_eq(kvf_test_http_get(port, path, out, len), 200);
}

/*
 * Item 3 of the brief: a standby says whether it is warm (/healthz,
 * /metrics), the leader lists its standbys (kvfctl status), and the
 * failover is counted. A standby whose leader cannot be reached (here a
 * leader key naming a closed port) is not warm.
 */
Test(ha, status_healthz_and_metrics_say_role_and_warmth, .timeout = 120)
{
    ha_cluster_t c;
    char out[16384], bin[4096], addr[128];
    const char *argv[]  = {bin, "--controller", addr, "status", "--json", NULL};
    const char *plain[] = {bin, "--controller", addr, "status", NULL};
    uint64_t deadline;
    int leader;

    memset(&c, 0, sizeof(c));
    ha_etcd_start(&c);
    cr_assert_eq(kvf_th_run(out, sizeof(out),
                            "ETCDCTL_API=3 /usr/bin/etcdctl --endpoints %s put "
                            "/kvf-ha-test/leader "
                            "'{\"control\":\"127.0.0.1:9\",\"http\":\"\"}'",
                            c.url),
                 0, "%s", out);
    ha_ctl_start(&c, 0);
    cr_assert(kvf_test_proc_wait_log(&c.ctl[0], "standby", 10000));
    ha_http(&c, 0, "/healthz", out, sizeof(out));
    cr_assert_not_null(strstr(out, "\"role\":\"standby\",\"warm\":false"), "%s",
                       out);
    cr_assert_eq(ha_metric(&c, 0, "kvf_controller_standby_warm"), 0);
    cr_assert_eq(ha_metric(&c, 0, "kvf_controller_ha_leader"), 0);

    /* the key goes: controller 0 leads, controller 1 follows it */
    cr_assert_eq(kvf_th_run(out, sizeof(out),
                            "ETCDCTL_API=3 /usr/bin/etcdctl --endpoints %s del "
                            "/kvf-ha-test/leader",
                            c.url),
                 0, "%s", out);
    leader = ha_wait_leader(&c, 20000, addr, sizeof(addr));
    cr_assert_eq(leader, 0);
    ha_ctl_start(&c, 1);
    cr_assert(kvf_test_proc_wait_log(&c.ctl[1], "standby: warm", 20000), "%s",
              kvf_test_proc_log(&c.ctl[1]));
    ha_http(&c, 1, "/healthz", out, sizeof(out));
    cr_assert_not_null(strstr(out, "\"role\":\"standby\",\"warm\":true"), "%s",
                       out);
    cr_assert_eq(ha_metric(&c, 1, "kvf_controller_standby_warm"), 1);
    ha_http(&c, 0, "/healthz", out, sizeof(out));
    cr_assert_not_null(strstr(out, "\"role\":\"leader\""), "%s", out);
    cr_assert_eq(ha_metric(&c, 0, "kvf_controller_ha_leader"), 1);
    cr_assert_eq(ha_metric(&c, 0, "kvf_controller_elections_won_total"), 1);

    snprintf(bin, sizeof(bin), "%s", kvf_th_build_path("tools/kvfctl"));
    deadline = kvf_time_deadline_ns(10 * KVF_NSEC_PER_SEC);
    for (;;) {
        cr_assert_eq(kvf_test_run(argv, out, sizeof(out), 10000), 0, "%s", out);
        if (strstr(out, "\"warm\":true") != NULL) {
            break;
        }
        cr_assert(!kvf_time_expired(deadline), "%s", out);
        ha_pause();
    }
    cr_assert_not_null(strstr(out, "\"role\":\"leader\""), "%s", out);
    cr_assert_not_null(strstr(out, "\"healthy\":true"), "%s", out);
    cr_assert_eq(ha_metric(&c, 0, "kvf_controller_standbys"), 1);
    cr_assert_eq(kvf_test_run(plain, out, sizeof(out), 10000), 0, "%s", out);
    cr_assert_not_null(strstr(out, "leader "), "%s", out);
    cr_assert_not_null(strstr(out, "  warm,"), "%s", out);
    cr_assert_not_null(strstr(out, "healthy"), "%s", out);

    kvf_test_proc_kill(&c.ctl[0]);
    c.running[0] = false;
    leader       = ha_wait_leader(&c, 20000, addr, sizeof(addr));
    cr_assert_eq(leader, 1);
    cr_assert_eq(
        ha_metric(&c, 1, "kvf_controller_failovers_total{copy=\"warm\"}"), 1);
    cr_assert_eq(ha_metric(&c, 1, "kvf_controller_ha_leader"), 1);
    ha_stop_all(&c);
}
