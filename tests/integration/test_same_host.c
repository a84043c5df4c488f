/* SPDX-License-Identifier: Apache-2.0 */
/* Copyright (c) 2026 The kvfabric authors */
/*
 * The same-host path between real agents (agent/local.h): a controller
 * and two agents sharing a cluster secret. A fetch between them is a
 * memcpy from the holder's read-only pool, byte for byte (counted as
 * such); a holder killed with a lease outstanding, or during a stream of
 * copies, is a miss and never takes the requester down; a process that
 * does not prove the secret gets no descriptor; with same_host off the
 * same fetch goes over UCX.
 */
#include "agent/local_wire.h"
#include "common/auth.h"
#include "common/time.h"
#include "tests/helpers/proc.h"
#include "tests/helpers/test_helpers.h"
#include "tests/integration/controller_harness.h"

#include <kvfabric/kvfabric.h>

#include <criterion/criterion.h>

#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#define CHUNK  (1u << 20)
#define AGENTS 2

typedef struct it_agent {
    kvf_test_proc_t proc;
    char sock[160];
    char http[64];
    char name[32];
} it_agent_t;

static kvf_th_ctl_t g_ctl;
static it_agent_t g_agents[AGENTS];
static char g_bin[4096], g_dir[64], g_secret[128], g_yaml[128];

static void write_file(const char *path, const char *text, mode_t mode)
{
    FILE *f = fopen(path, "w");

    cr_assert_not_null(f);
    fputs(text, f);
    fclose(f);
    chmod(path, mode);
}

static bool registered(const it_agent_t *a)
{
    char body[4096];
    uint16_t port = (uint16_t)atoi(strrchr(a->http, ':') + 1);

    return (kvf_test_http_get(port, "/healthz", body, sizeof(body)) == 200) &&
           (strstr(body, "\"registered\":true") != NULL);
}

static void start_agent(int i, const char *same_host, const char *extra)
{
    it_agent_t *a = &g_agents[i];
    char flag[32];
    const char *argv[] = {
        g_bin,         "--config",     g_yaml,  "--controller",
        g_ctl.addr,    "--name",       a->name, "--socket",
        a->sock,       "--http",       a->http, "--listen",
        "127.0.0.1:0", "--pool-size",  "64M",   "--max-chunk",
        "1M",          "--transports", "tcp",   "--fetch-timeout",
        "3s",          flag,           extra,   NULL};
    int k;

    snprintf(flag, sizeof(flag), "--same-host=%s", same_host);
    snprintf(a->name, sizeof(a->name), "it-local-%c", 'a' + i);
    snprintf(a->sock, sizeof(a->sock), "%s/agent-%d.sock", g_dir, i);
    snprintf(a->http, sizeof(a->http), "127.0.0.1:%u", kvf_test_free_port());
    cr_assert_eq(kvf_test_proc_start(&a->proc, argv), 0);
    for (k = 0; (k < 2000) && !registered(a); k++) {
        poll(NULL, 0, 5);
    }
    cr_assert(registered(a), "agent %s did not register: %s", a->name,
              kvf_test_proc_log(&a->proc));
}

static void start_all_with(const char *same_host, const char *extra0)
{
    const char *args[] = {"--config", g_yaml, NULL};
    int i;

    kvf_th_ctl_start(&g_ctl, args);
    for (i = 0; i < AGENTS; i++) {
        start_agent(i, same_host, (i == 0) ? extra0 : NULL);
    }
}

static void start_all(const char *same_host)
{
    start_all_with(same_host, NULL);
}

static void setup(void)
{
    char text[256];

    snprintf(g_bin, sizeof(g_bin), "%s",
             kvf_test_build_path("agent/kvf-agent"));
    snprintf(g_dir, sizeof(g_dir), "/tmp/kvf-local-XXXXXX");
    cr_assert_not_null(mkdtemp(g_dir));
    snprintf(g_secret, sizeof(g_secret), "%s/secret", g_dir);
    write_file(g_secret, "5b1e9c7d3a0f2e4d6c8a1b3f5e7d9c0b\n", 0600);
    snprintf(g_yaml, sizeof(g_yaml), "%s/kvf.yaml", g_dir);
    snprintf(text, sizeof(text), "cluster_secret_file: %s\n", g_secret);
    write_file(g_yaml, text, 0644);
}

static void teardown(void)
{
    char cmd[128];
    int i;

    for (i = 0; i < AGENTS; i++) {
        if (g_agents[i].proc.pid > 0) {
            kvf_test_proc_stop(&g_agents[i].proc, 10000);
        }
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

TestSuite(same_host, .init = setup, .fini = teardown, .timeout = 120);

static kvf_client_t *connect_to(int i)
{
    kvf_client_params_t p = {.field_mask = KVF_CLIENT_PARAM_SOCKET |
                                           KVF_CLIENT_PARAM_TIMEOUT |
                                           KVF_CLIENT_PARAM_SECRET,
                             .socket_path = g_agents[i].sock,
                             .timeout_ns  = 20000000000ull,
                             .secret_file = g_secret};
    kvf_client_t *c       = NULL;

    cr_assert_eq(kvf_client_connect(&p, &c), KVF_OK, "%s",
                 kvf_client_last_error(NULL));
    return c;
}

static void chain(kvf_key_t *keys, uint32_t n, uint32_t seed)
{
    uint32_t tokens[64 * 16];
    size_t got, i;

    for (i = 0; i < (size_t)n * 16; i++) {
        tokens[i] = (uint32_t)(i * 7 + seed);
    }
    cr_assert_eq(
        kvf_key_chain(0x55, tokens, (size_t)n * 16, 16, false, keys, n, &got),
        KVF_OK);
}

static void fill(uint8_t *p, const kvf_key_t *key)
{
    uint64_t x = key->lo | 1, i;

    for (i = 0; i < CHUNK; i += 8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        memcpy(p + i, &x, 8);
    }
}

static void store_on(int i, const kvf_key_t *keys, uint32_t n)
{
    kvf_client_t *c = connect_to(i);
    kvf_slot_t slots[64];
    uint64_t sums[64];
    uint32_t k;

    cr_assert_eq(kvf_client_alloc(c, CHUNK, n, slots), KVF_OK);
    for (k = 0; k < n; k++) {
        uint8_t *p = (uint8_t *)kvf_client_pool_base(c) + slots[k].offset;

        fill(p, &keys[k]);
        sums[k] = kvf_chunk_checksum(p, CHUNK);
    }
    cr_assert_eq(kvf_client_commit(c, keys, slots, sums, n), KVF_OK);
    kvf_client_disconnect(c);
}

static void wait_hits(int i, const kvf_key_t *keys, uint32_t n, uint32_t hits)
{
    kvf_client_t *c = connect_to(i);
    kvf_lookup_result_t res;
    int k;

    for (k = 0; k < 1000; k++) {
        cr_assert_eq(kvf_client_lookup(c, keys, n, false, &res), KVF_OK);
        if (res.hit_chunks == hits) {
            break;
        }
        poll(NULL, 0, 5);
    }
    cr_assert_eq(res.hit_chunks, hits, "lookup on agent %d", i);
    kvf_client_disconnect(c);
}

/* Retrieves through agent @p i; every chunk that came is checked byte for
 * byte (a wrong one fails the test). The chunks that came. */
static uint32_t retrieve_check(int i, const kvf_key_t *keys, uint32_t n)
{
    kvf_client_t *c = connect_to(i);
    uint8_t *expect = malloc(CHUNK);
    kvf_slot_t slots[64];
    bool missing[64];
    uint32_t k, got = 0;

    cr_assert_eq(kvf_client_retrieve(c, keys, n, slots, missing), KVF_OK, "%s",
                 kvf_client_last_error(c));
    for (k = 0; k < n; k++) {
        if (missing[k]) {
            continue;
        }
        fill(expect, &keys[k]);
        cr_assert_eq(slots[k].length, CHUNK);
        cr_assert(memcmp((uint8_t *)kvf_client_pool_base(c) + slots[k].offset,
                         expect, CHUNK) == 0,
                  "chunk %u fetched through agent %d differs", k, i);
        kvf_client_release(c, &slots[k], 1);
        got++;
    }
    free(expect);
    kvf_client_disconnect(c);
    return got;
}

/* The value of metric line @p prefix on agent @p i, or -1 when absent. */
static long long metric(int i, const char *prefix)
{
    static char body[1 << 17];
    uint16_t port = (uint16_t)atoi(strrchr(g_agents[i].http, ':') + 1);
    const char *p = body;

    if (kvf_test_http_get(port, "/metrics", body, sizeof(body)) != 200) {
        return -1;
    }
    while ((p = strstr(p, prefix)) != NULL) {
        if ((p == body) || (p[-1] == '\n')) {
            return atoll(p + strlen(prefix));
        }
        p++;
    }
    return -1;
}

#define COPIED  "kvf_agent_same_host_chunks_total{result=\"copied\"} "
#define SERVED  "kvf_agent_same_host_chunks_total{result=\"served\"} "
#define REFUSED "kvf_agent_same_host_links_total{result=\"refused\"} "

Test(same_host, fetch_is_a_memcpy_byte_identical)
{
    kvf_key_t keys[16];

    start_all("true");
    chain(keys, 16, 3);
    store_on(0, keys, 16);
    wait_hits(1, keys, 16, 16);
    cr_assert_eq(retrieve_check(1, keys, 16), 16);
    /* every chunk came by memcpy, none over UCX */
    cr_assert_eq(metric(1, COPIED), 16);
    cr_assert_eq(metric(1, "kvf_agent_fetch_chunks_total{result=\"fetched\"} "),
                 16);
    cr_assert_eq(metric(0, SERVED), 16);
    cr_assert_eq(metric(1, "kvf_agent_same_host_links_total{result=\"ok\"} "),
                 1);
    cr_assert_not_null(
        strstr(kvf_test_proc_log(&g_agents[1].proc), "same-host path to node"),
        "%s", kvf_test_proc_log(&g_agents[1].proc));
}

Test(same_host, off_goes_over_ucx)
{
    kvf_key_t keys[4];

    start_all("false");
    chain(keys, 4, 5);
    store_on(0, keys, 4);
    wait_hits(1, keys, 4, 4);
    cr_assert_eq(retrieve_check(1, keys, 4), 4);
    cr_assert_eq(metric(1, COPIED), 0);
    cr_assert_eq(metric(1, "kvf_agent_fetch_chunks_total{result=\"fetched\"} "),
                 4);
}

static void *retrieve_thread(void *arg)
{
    const kvf_key_t *keys = arg;

    return (void *)(uintptr_t)retrieve_check(1, keys, 8);
}

Test(same_host, holder_killed_with_a_lease_out_is_a_miss)
{
    kvf_key_t warm[2], keys[8];
    pthread_t th;
    void *got;
    uint64_t t0;

    start_all("true");
    chain(warm, 2, 7);
    chain(keys, 8, 11);
    store_on(0, warm, 2);
    store_on(0, keys, 8);
    wait_hits(1, keys, 8, 8);
    /* the link is up: the holder's pool is mapped by the requester */
    cr_assert_eq(retrieve_check(1, warm, 2), 2);
    cr_assert_eq(metric(1, COPIED), 2);
    /* the holder stops answering: the next fetch's LEASE waits on it, and
     * the holder is killed -9 under it */
    kill(g_agents[0].proc.pid, SIGSTOP);
    t0 = kvf_time_now_ns();
    cr_assert_eq(pthread_create(&th, NULL, retrieve_thread, keys), 0);
    kvf_test_proc_kill(&g_agents[0].proc);
    pthread_join(th, &got);
    cr_assert_eq((uintptr_t)got, 0, "a dead holder is a miss");
    cr_assert_lt(kvf_time_now_ns() - t0, 10 * KVF_NSEC_PER_SEC);
    /* the requester lives on and says so */
    cr_assert(registered(&g_agents[1]), "%s",
              kvf_test_proc_log(&g_agents[1].proc));
    cr_assert_eq(metric(1, COPIED), 2);
}

Test(same_host, holder_killed_during_copies_never_wrong_bytes)
{
    kvf_key_t keys[48];
    pthread_t th;
    void *got;
    int round;

    start_all("true");
    chain(keys, 48, 13);
    store_on(0, keys, 48);
    wait_hits(1, keys, 48, 48);
    /* rounds of 8 x 1 MiB copies while the holder dies: whatever arrives is
     * verified bytes, the rest misses, the requester stays up */
    for (round = 0; round < 6; round++) {
        cr_assert_eq(
            pthread_create(&th, NULL, retrieve_thread, &keys[round * 8]), 0);
        if (round == 2) {
            kvf_test_proc_kill(&g_agents[0].proc);
        }
        pthread_join(th, &got);
        if (round > 2) {
            cr_assert_eq((uintptr_t)got, 0);
        }
    }
    cr_assert(registered(&g_agents[1]), "%s",
              kvf_test_proc_log(&g_agents[1].proc));
}

/* Dials agent 0's same-host socket as a stranger: the fd, or -1. */
static int dial_holder(void)
{
    const char *log = kvf_test_proc_log(&g_agents[0].proc);
    const char *at  = strstr(log, "same-host path on @");
    int fd;

    cr_assert_not_null(at, "%s", log);
    fd =
        kvf_test_abstract_socket("", at + strlen("same-host path on @"), false);
    cr_assert_geq(fd, 0, "%m");
    return fd;
}

/* Reads until EOF or a passed descriptor; true when one came. */
static bool got_fd(int fd, kvf_local_hello_t *reply, bool *replied)
{
    union {
        char buf[CMSG_SPACE(sizeof(int))];
        struct cmsghdr align;
    } ctl;
    char buf[KVF_LOCAL_MSG_MAX];
    struct iovec iov = {.iov_base = buf, .iov_len = sizeof(buf)};
    struct msghdr mh;
    struct pollfd pfd = {.fd = fd, .events = POLLIN};
    ssize_t n;

    *replied = false;
    for (;;) {
        cr_assert_eq(poll(&pfd, 1, 10000), 1,
                     "the holder neither answers "
                     "nor closes");
        memset(&mh, 0, sizeof(mh));
        mh.msg_iov        = &iov;
        mh.msg_iovlen     = 1;
        mh.msg_control    = ctl.buf;
        mh.msg_controllen = sizeof(ctl.buf);
        n                 = recvmsg(fd, &mh, 0);
        if (n <= 0) {
            return false;
        }
        if (mh.msg_controllen > 0) {
            return true;
        }
        if ((size_t)n == sizeof(*reply)) {
            memcpy(reply, buf, sizeof(*reply));
            *replied = true;
            return false; /* the caller answers */
        }
    }
}

static void hello_init(kvf_local_hello_t *h, uint16_t type)
{
    FILE *f = fopen("/proc/sys/kernel/random/boot_id", "r");

    memset(h, 0, sizeof(*h));
    h->h.magic = KVF_LOCAL_MAGIC;
    h->h.type  = type;
    h->node_id = 1;
    cr_assert_not_null(f);
    cr_assert_not_null(fgets(h->boot_id, sizeof(h->boot_id), f));
    fclose(f);
    h->boot_id[strcspn(h->boot_id, "\n")] = '\0';
    snprintf(h->name, sizeof(h->name), "intruder");
}

Test(same_host, no_secret_no_descriptor)
{
    kvf_local_hello_t hello, reply;
    bool replied;
    long long refused;
    int fd;

    start_all("true");
    refused = metric(0, REFUSED);
    /* no nonce: a peer without the secret is refused at HELLO */
    fd = dial_holder();
    hello_init(&hello, KVF_LOCAL_MSG_HELLO);
    cr_assert_eq(send(fd, &hello, sizeof(hello), 0), (ssize_t)sizeof(hello));
    cr_assert_not(got_fd(fd, &reply, &replied));
    cr_assert_not(replied, "refused before any challenge");
    close(fd);
    /* a nonce but a MAC it cannot compute: refused at AUTH */
    fd = dial_holder();
    hello_init(&hello, KVF_LOCAL_MSG_HELLO);
    hello.nonce_len = KVF_AUTH_NONCE_SIZE;
    memset(hello.nonce, 0x42, sizeof(hello.nonce));
    cr_assert_eq(send(fd, &hello, sizeof(hello), 0), (ssize_t)sizeof(hello));
    cr_assert_not(got_fd(fd, &reply, &replied));
    cr_assert(replied, "the holder proves itself first");
    cr_assert_eq(reply.mac_len, KVF_AUTH_MAC_SIZE);
    hello_init(&hello, KVF_LOCAL_MSG_AUTH);
    hello.mac_len = KVF_AUTH_MAC_SIZE;
    memset(hello.mac, 0x17, sizeof(hello.mac));
    cr_assert_eq(send(fd, &hello, sizeof(hello), 0), (ssize_t)sizeof(hello));
    cr_assert_not(got_fd(fd, &reply, &replied), "no descriptor without the "
                                                "secret");
    close(fd);
    /* another kernel boot: refused too */
    fd = dial_holder();
    hello_init(&hello, KVF_LOCAL_MSG_HELLO);
    hello.boot_id[0] ^= 1;
    cr_assert_eq(send(fd, &hello, sizeof(hello), 0), (ssize_t)sizeof(hello));
    cr_assert_not(got_fd(fd, &reply, &replied));
    close(fd);
    cr_assert_eq(metric(0, REFUSED), refused + 3);
    cr_assert(registered(&g_agents[0]));
}

/* Transport truth (agent/transports.h): over UCX, each side names what
 * the connection runs on; a holder expecting rc refuses to serve over the
 * tcp this machine has, saying so. */
Test(same_host, transport_truth_and_expect_transports_refuses_tcp)
{
    kvf_key_t keys[2];
    const char *log;
    uint64_t t0;

    start_all_with("false", "--expect-transports=rc");
    chain(keys, 2, 17);
    store_on(0, keys, 2);
    wait_hits(1, keys, 2, 2);
    t0 = kvf_time_now_ns();
    cr_assert_eq(retrieve_check(1, keys, 2), 0, "served over tcp: %s",
                 kvf_test_proc_log(&g_agents[0].proc));
    /* refused at once, not by the fetch timeout */
    cr_assert_lt(kvf_time_now_ns() - t0, 2 * KVF_NSEC_PER_SEC);
    cr_assert_geq(metric(0, "kvf_agent_transport_refusals_total "), 1);
    cr_assert_geq(metric(0, "kvf_agent_peer_transport_info{peer=\"it-local-b\","
                            "transport=\"tcp/lo\",refused=\"true\"} "),
                  1);
    log = kvf_test_proc_log(&g_agents[0].proc);
    cr_assert_not_null(strstr(log, "refusing peer it-local-b"), "%s", log);
    cr_assert_not_null(strstr(log, "runs over tcp/lo, not one of "
                                   "expect_transports [rc]"),
                       "%s", log);
    /* as a requester it refuses what arrives over tcp as well; the agent
     * without a list serves as before and says what it ran on */
    chain(keys, 2, 19);
    store_on(1, keys, 2);
    wait_hits(0, keys, 2, 2);
    cr_assert_eq(retrieve_check(0, keys, 2), 0, "fetched over tcp");
    cr_assert_geq(metric(0, "kvf_agent_transport_refusals_total "), 2);
    cr_assert_eq(metric(1, "kvf_agent_peer_transport_info{peer=\"it-local-a\","
                           "transport=\"tcp/lo\",refused=\"false\"} "),
                 1);
    cr_assert_eq(metric(1, "kvf_agent_transport_refusals_total "), 0);
    cr_assert_not_null(
        strstr(kvf_test_proc_log(&g_agents[1].proc), "peer it-local-a ("), "%s",
        kvf_test_proc_log(&g_agents[1].proc));
}
