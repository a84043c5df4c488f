/* SPDX-License-Identifier: Apache-2.0 */
/* Copyright (c) 2026 The kvfabric authors */
/*
 * Attacks on a real kvf-controller (docs/security.md, "The controller"):
 * unauthenticated partial-frame floods, authenticated floods of huge
 * partial frames, connections past the file descriptor limit, and HTTP
 * reads without or with a wrong bearer token. Each time the controller
 * stays up, its memory stays bounded, the attack is counted, and a
 * legitimate agent (with the cluster secret) registers and looks up.
 */
#include "common/auth.h"
#include "common/time.h"
#include "tests/helpers/proc.h"
#include "tests/helpers/test_helpers.h"
#include "tests/integration/controller_harness.h"

#include <criterion/criterion.h>

#include <openssl/evp.h>
#include <openssl/hmac.h>

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#define SECRET   "3b7e1f09c2d84a6e5f1b0c9d8e7a6b5c"
#define MAX_CONN 512

static kvf_th_ctl_t g_ctl;
static kvf_auth_secret_t g_secret;
static char g_dir[64], g_secret_path[128], g_yaml[128], g_token[80];
static int g_fds[MAX_CONN];
static int g_nfds;
static char g_body[1 << 16];

static void setup(void)
{
    char err[256];
    int fd;

    signal(SIGPIPE, SIG_IGN); /* the controller closes flooding sockets */
    /* freed buffers must not sit in ASan's quarantine, or RSS measures
     * the quarantine instead of what the controller holds */
    setenv("ASAN_OPTIONS",
           "abort_on_error=1:detect_leaks=1:quarantine_size_mb=4:"
           "allocator_release_to_os_interval_ms=100",
           1);
    snprintf(g_dir, sizeof(g_dir), "/tmp/kvf-abuse-XXXXXX");
    cr_assert_not_null(mkdtemp(g_dir));
    snprintf(g_secret_path, sizeof(g_secret_path), "%s/secret", g_dir);
    fd = open(g_secret_path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    cr_assert(fd >= 0);
    cr_assert_eq(write(fd, SECRET "\n", sizeof(SECRET)),
                 (ssize_t)sizeof(SECRET));
    close(fd);
    snprintf(g_yaml, sizeof(g_yaml), "%s/ctl.yaml", g_dir);
    fd = open(g_yaml, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    cr_assert(fd >= 0);
    dprintf(fd, "cluster_secret_file: %s\n", g_secret_path);
    close(fd);
    cr_assert_eq(
        kvf_auth_secret_load(g_secret_path, &g_secret, err, sizeof(err)),
        KVF_OK, "%s", err);
    g_nfds = 0;
}

static void close_flood(void)
{
    while (g_nfds > 0) {
        close(g_fds[--g_nfds]);
    }
}

static void teardown(void)
{
    char cmd[128];

    close_flood();
    if (g_ctl.pid > 0) {
        cr_expect_eq(kvf_th_ctl_stop(&g_ctl), 0, "clean exit, no leak");
    }
    kvf_auth_secret_cleanup(&g_secret);
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", g_dir);
    if (system(cmd) != 0) {
        fprintf(stderr, "%s failed\n", cmd);
    }
    kvf_test_check_leaks();
}

TestSuite(controller_abuse, .init = setup, .fini = teardown, .timeout = 180);

static uint16_t port_of(const char *hostport)
{
    return (uint16_t)atoi(strrchr(hostport, ':') + 1);
}

/* Resident memory of the controller, KiB. */
static uint64_t rss_kib(void)
{
    char path[64], line[256];
    uint64_t kib = 0;
    FILE *f;

    snprintf(path, sizeof(path), "/proc/%d/status", (int)g_ctl.pid);
    f = fopen(path, "r");
    cr_assert_not_null(f);
    while (fgets(line, sizeof(line), f) != NULL) {
        if (sscanf(line, "VmRSS: %" SCNu64, &kib) == 1) {
            break;
        }
    }
    fclose(f);
    return kib;
}

/* CPU time the controller used, in clock ticks. */
static uint64_t cpu_ticks(void)
{
    char path[64], buf[1024], *p;
    unsigned long long utime, stime;
    FILE *f;

    snprintf(path, sizeof(path), "/proc/%d/stat", (int)g_ctl.pid);
    f = fopen(path, "r");
    cr_assert_not_null(f);
    cr_assert_not_null(fgets(buf, sizeof(buf), f));
    fclose(f);
    p = strrchr(buf, ')'); /* the command name may hold spaces */
    cr_assert_not_null(p);
    cr_assert_eq(sscanf(p + 2,
                        "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u "
                        "%llu %llu",
                        &utime, &stime),
                 2);
    return utime + stime;
}

static long file_size(const char *path)
{
    struct stat st;

    return (stat(path, &st) == 0) ? (long)st.st_size : -1;
}

/* A metric of /metrics (open without a token); the first sample whose
 * line starts with @p name (labels included). */
static uint64_t metric(const char *name)
{
    char needle[160];
    const char *p;

    cr_assert_eq(kvf_test_http_get(port_of(g_ctl.http), "/metrics", g_body,
                                   sizeof(g_body)),
                 200);
    snprintf(needle, sizeof(needle), "\n%s ", name);
    p = strstr(g_body, needle);
    cr_assert_not_null(p, "%s missing", name);
    return strtoull(p + strlen(needle), NULL, 10);
}

/* A plain TCP connection to the control port (no handshake). */
static int raw_connect(void)
{
    struct sockaddr_in sin;
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);

    cr_assert(fd >= 0, "socket: %s", strerror(errno));
    memset(&sin, 0, sizeof(sin));
    sin.sin_family      = AF_INET;
    sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    sin.sin_port        = htons(port_of(g_ctl.addr));
    cr_assert_eq(connect(fd, (struct sockaddr *)&sin, sizeof(sin)), 0,
                 "connect: %s", strerror(errno));
    return fd;
}

/* Writes @p len bytes of a frame of @p type declaring @p declared payload
 * bytes (header included in @p len); stops early when the controller
 * closes the connection. Returns the bytes written. */
static size_t send_partial(int fd, uint16_t type, uint32_t declared, size_t len)
{
    static uint8_t buf[1 << 16];
    size_t done = 0;

    memset(buf, 0x5a, sizeof(buf));
    buf[0] = (uint8_t)declared;
    buf[1] = (uint8_t)(declared >> 8);
    buf[2] = (uint8_t)(declared >> 16);
    buf[3] = (uint8_t)(declared >> 24);
    buf[4] = (uint8_t)type;
    buf[5] = (uint8_t)(type >> 8);
    buf[6] = 0;
    buf[7] = 0;
    while (done < len) {
        size_t n = (len - done < sizeof(buf)) ? len - done : sizeof(buf);
        struct pollfd pfd = {.fd = fd, .events = POLLOUT};
        ssize_t w;

        if (poll(&pfd, 1, 5000) != 1) {
            break; /* the controller stopped reading: fine, it is bounded */
        }
        w = send(fd, buf, n, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (w < 0) {
            if ((errno == EAGAIN) || (errno == EINTR)) {
                continue;
            }
            break; /* closed by the controller */
        }
        done += (size_t)w;
        if (done >= KVF_FRAME_HDR_SIZE) {
            buf[0] = buf[1] = buf[2] = buf[3] = 0x5a; /* payload from now */
            buf[4] = buf[5] = buf[6] = buf[7] = 0x5a;
        }
    }
    return done;
}

static kvf_ctlconn_t *open_authenticated(const char *name)
{
    kvf_ctlconn_params_t p = {.hostport   = g_ctl.addr,
                              .kind       = KVF__PEER_KIND__PEER_AGENT,
                              .name       = name,
                              .version    = KVF_PROTOCOL_VERSION,
                              .timeout_ms = 10000,
                              .secret     = &g_secret};
    kvf_ctlconn_t *conn    = NULL;
    char err[256];

    cr_assert_eq(kvf_ctlconn_open(&p, &conn, err, sizeof(err)), KVF_OK, "%s",
                 err);
    return conn;
}

/* A legitimate agent with the secret registers, admits and looks up, each
 * answered within 1 s. */
static void legit_agent_works(const char *name, uint64_t base)
{
    uint64_t t0         = kvf_time_now_ms();
    kvf_ctlconn_t *conn = open_authenticated(name);
    uint32_t node       = kvf_th_register(conn, name, t0, NULL);
    uint32_t holders[4];

    cr_assert_eq(kvf_th_batch(conn, KVF_MSG_ADMIT, node, t0, 1, base, 4, true),
                 KVF_OK);
    cr_assert_eq(kvf_th_lookup(conn, node, base, 4, holders, NULL), 4);
    cr_assert_eq(holders[0], node);
    cr_assert_lt(kvf_time_now_ms() - t0, 3000, "slow: %" PRIu64 " ms",
                 kvf_time_now_ms() - t0);
    kvf_ctlconn_destroy(conn);
}

static void start_ctl(const char *const *extra)
{
    const char *args[24] = {"--config", g_yaml};
    int n                = 2;

    while ((extra != NULL) && (*extra != NULL)) {
        args[n++] = *extra++;
    }
    args[n] = NULL;
    kvf_th_ctl_start(&g_ctl, args);
}

/*
 * 400 connections that never authenticate, each holding 60 kB of a
 * partial frame: the unauthenticated ones may buffer max_buffered_preauth
 * (1 MiB here) together; the largest (oldest among equals) are closed and
 * counted. Before the cap they held 24 MB and more (256 KiB read buffers).
 */
Test(controller_abuse, preauth_partial_frames_are_capped)
{
    const char *extra[] = {"--max-buffered-preauth", "1M", NULL};
    uint64_t rss0, rss1;
    int i;

    start_ctl(extra);
    legit_agent_works("before", 100);
    rss0 = rss_kib();
    for (i = 0; i < 400; i++) {
        g_fds[g_nfds] = raw_connect();
        send_partial(g_fds[g_nfds++], KVF_MSG_HELLO, 65000, 60000);
    }
    legit_agent_works("during", 200); /* also a barrier: reads were served */
    rss1 = rss_kib();
    fprintf(stderr, "preauth flood: rss %" PRIu64 " -> %" PRIu64 " KiB\n", rss0,
            rss1);
    cr_expect_lt(rss1 - rss0, 16u << 10, "rss %" PRIu64 " -> %" PRIu64 " KiB",
                 rss0, rss1);
    cr_expect_gt(metric("kvf_controller_buffer_closes_total"), 0);
    cr_expect_leq(metric("kvf_controller_buffered_bytes{peer="
                         "\"unauthenticated\"}"),
                  1u << 20);
    close_flood();
    legit_agent_works("after", 300);
}

/*
 * 24 authenticated connections each start a 15 MiB frame and send 6 MiB
 * of it (144 MiB without a cap): with max_buffered 32 MiB the largest
 * are closed, memory stays bounded, and the agent keeps working.
 */
Test(controller_abuse, authenticated_flood_is_capped)
{
    const char *extra[] = {"--max-buffered", "32M", NULL};
    kvf_ctlconn_t *flood[24];
    uint64_t rss0, rss1;
    int i;

    start_ctl(extra);
    legit_agent_works("before", 100);
    rss0 = rss_kib();
    for (i = 0; i < 24; i++) {
        char name[32];

        snprintf(name, sizeof(name), "flood-%d", i);
        flood[i] = open_authenticated(name);
        send_partial(kvf_ctlconn_fd(flood[i]), KVF_MSG_ADMIT, 15u << 20,
                     6u << 20);
    }
    legit_agent_works("during", 200);
    rss1 = rss_kib();
    fprintf(stderr, "authenticated flood: rss %" PRIu64 " -> %" PRIu64 " KiB\n",
            rss0, rss1);
    cr_expect_lt(rss1 - rss0, 96u << 10, "rss %" PRIu64 " -> %" PRIu64 " KiB",
                 rss0, rss1);
    cr_expect_gt(metric("kvf_controller_buffer_closes_total"), 0);
    cr_expect_leq(metric("kvf_controller_buffered_bytes{peer=\"any\"}"),
                  32u << 20);
    for (i = 0; i < 24; i++) {
        kvf_ctlconn_destroy(flood[i]);
    }
    legit_agent_works("after", 300);
}

/* Number of open file descriptors of the controller. */
static int ctl_open_fds(void)
{
    char cmd[128], out[64];

    snprintf(cmd, sizeof(cmd), "ls /proc/%d/fd | wc -l", (int)g_ctl.pid);
    cr_assert_eq(kvf_th_run(out, sizeof(out), "%s", cmd), 0);
    return atoi(out);
}

/*
 * The controller at its file descriptor limit (lowered with prlimit):
 * accept() fails with EMFILE while connections wait in the backlog.
 * Without an error callback libevent retried at once, for ever (100 %
 * CPU, a log line per try); now accepts pause with a backoff, one
 * warning per 10 s, and it serves again once descriptors are free.
 */
Test(controller_abuse, fd_exhaustion_backs_off)
{
    const char *extra[] = {"--handshake-timeout", "60s", NULL};
    struct rlimit rl, old;
    uint64_t t0;
    long log0, log1;
    int i, open_fds;

    start_ctl(extra);
    legit_agent_works("before", 100);
    open_fds = ctl_open_fds();
    cr_assert_eq(prlimit(g_ctl.pid, RLIMIT_NOFILE, NULL, &old), 0);
    rl.rlim_cur = (rlim_t)open_fds + 16; /* the hard limit stays */
    rl.rlim_max = old.rlim_max;
    cr_assert_eq(prlimit(g_ctl.pid, RLIMIT_NOFILE, &rl, NULL), 0, "prlimit: %s",
                 strerror(errno));
    for (i = 0; i < 64; i++) {
        g_fds[g_nfds++] = raw_connect(); /* completes in the backlog */
    }
    t0   = cpu_ticks();
    log0 = file_size(g_ctl.log);
    usleep(2000 * 1000); /* measures CPU over a fixed window, not a wait */
    log1 = file_size(g_ctl.log);
    fprintf(stderr, "fd limit: %" PRIu64 " cpu ticks in 2 s, log +%ld B\n",
            cpu_ticks() - t0, log1 - log0);
    cr_expect_lt(cpu_ticks() - t0, (uint64_t)sysconf(_SC_CLK_TCK) / 2,
                 "the controller spins at the fd limit");
    cr_expect_lt(log1 - log0, 4096, "log grew %ld bytes", log1 - log0);
    close_flood();
    cr_assert_eq(prlimit(g_ctl.pid, RLIMIT_NOFILE, &old, NULL), 0);
    legit_agent_works("after", 300);
    cr_expect_gt(metric("kvf_controller_accept_errors_total{port="
                        "\"control\"}"),
                 0);
}

/* The documented derivation: lowercase hex of HMAC-SHA256(secret,
 * "kvf-http-token v1"), computed here independently of the controller. */
static void expected_token(char *hex)
{
    static const char label[] = "kvf-http-token v1";
    uint8_t mac[32];
    unsigned len = sizeof(mac), i;

    cr_assert_not_null(HMAC(EVP_sha256(), SECRET, (int)strlen(SECRET),
                            (const uint8_t *)label, strlen(label), mac, &len));
    for (i = 0; i < len; i++) {
        snprintf(hex + 2 * i, 3, "%02x", mac[i]);
    }
}

/* With a secret, /v1/nodes and /v1/stats need the bearer token; /healthz,
 * /metrics and the (data-less) dashboard page stay open. */
Test(controller_abuse, http_needs_bearer_token)
{
    uint16_t port;
    char wrong[80];

    start_ctl(NULL);
    legit_agent_works("node-a", 100);
    port = port_of(g_ctl.http);
    expected_token(g_token);
    snprintf(wrong, sizeof(wrong), "%s", g_token);
    wrong[0] = (wrong[0] == '0') ? '1' : '0';

    cr_assert_eq(kvf_test_http_get(port, "/v1/nodes", g_body, sizeof(g_body)),
                 401);
    cr_assert_null(strstr(g_body, "127.0.0.1"), "no address leaks: %s", g_body);
    cr_assert_eq(kvf_test_http_get_auth(port, "/v1/nodes", wrong, g_body,
                                        sizeof(g_body)),
                 401);
    cr_assert_eq(kvf_test_http_get_auth(port, "/v1/nodes", "short", g_body,
                                        sizeof(g_body)),
                 401);
    cr_assert_eq(kvf_test_http_get(port, "/v1/stats", g_body, sizeof(g_body)),
                 401);
    cr_assert_eq(kvf_test_http_request(port, "POST", "/v1/index/query", NULL,
                                       "{\"model\":\"m\",\"token_ids\":[1]}",
                                       g_body, sizeof(g_body)),
                 401);
    cr_assert_eq(kvf_test_http_get_auth(port, "/v1/nodes", g_token, g_body,
                                        sizeof(g_body)),
                 200);
    cr_assert_not_null(strstr(g_body, "\"node-a\""), "%s", g_body);
    cr_assert_eq(kvf_test_http_get_auth(port, "/v1/stats", g_token, g_body,
                                        sizeof(g_body)),
                 200);
    cr_assert_eq(kvf_test_http_get(port, "/healthz", g_body, sizeof(g_body)),
                 200);
    cr_assert_eq(kvf_test_http_get(port, "/", g_body, sizeof(g_body)), 200);
    cr_assert_eq(metric("kvf_controller_http_auth_failures_total"), 5);
}

/* The DOM headless Chromium renders from @p url (g_body); false when it
 * is not installed or cannot run here. */
static bool render(const char *url)
{
    char err[200], script[512];
    const char *argv[] = {"/bin/sh", "-c", script, "sh", url, err, NULL};
    int rc;

    snprintf(err, sizeof(err), "%s/chromium.err", g_dir);
    snprintf(script, sizeof(script),
             "b=$(command -v chromium || command -v chromium-browser) "
             "|| exit 200; exec \"$b\" --headless --no-sandbox --disable-gpu "
             "--no-first-run --user-data-dir=%s/chromium "
             "--virtual-time-budget=5000 --dump-dom \"$1\" 2>\"$2\"",
             g_dir);
    rc = kvf_test_run(argv, g_body, sizeof(g_body), 90000);
    return (rc == 0) && (strstr(g_body, "<html") != NULL);
}

/* The dashboard with a secret: given the token in the URL fragment it
 * renders the nodes; without it, it says how to pass one. */
Test(controller_abuse, dashboard_sends_the_token)
{
    char url[300];
    kvf_ctlconn_t *conn;

    start_ctl(NULL);
    conn = open_authenticated("dash-node");
    kvf_th_register(conn, "dash-node", 1, NULL);
    expected_token(g_token);
    snprintf(url, sizeof(url), "http://%s/#token=%s", g_ctl.http, g_token);
    if (!render(url)) {
        kvf_ctlconn_destroy(conn);
        cr_skip_test("headless chromium is not available here");
    }
    cr_assert_not_null(strstr(g_body, "updated "), "%s", g_body);
    cr_assert_not_null(strstr(g_body, "<td class=\"name\">dash-node</td>"),
                       "%s", g_body);
    snprintf(url, sizeof(url), "http://%s/", g_ctl.http);
    cr_assert(render(url));
    cr_assert_not_null(strstr(g_body, "HTTP 401, open this page as"), "%s",
                       g_body);
    cr_assert_null(strstr(g_body, "dash-node"), "%s", g_body);
    kvf_ctlconn_destroy(conn);
}

/* http_open decides which paths stay open: empty closes /metrics too. */
Test(controller_abuse, http_open_is_configurable)
{
    const char *extra[] = {"--http-open", "/healthz", NULL};
    uint16_t port;

    start_ctl(extra);
    port = port_of(g_ctl.http);
    expected_token(g_token);
    cr_assert_eq(kvf_test_http_get(port, "/metrics", g_body, sizeof(g_body)),
                 401);
    cr_assert_eq(kvf_test_http_get_auth(port, "/metrics", g_token, g_body,
                                        sizeof(g_body)),
                 200);
    cr_assert_eq(kvf_test_http_get(port, "/healthz", g_body, sizeof(g_body)),
                 200);
}

/* Without a secret nothing changes: HTTP is open (on loopback by
 * default), as the control port is. */
Test(controller_abuse, http_open_without_secret)
{
    kvf_th_ctl_start(&g_ctl, NULL);
    cr_assert_eq(kvf_test_http_get(port_of(g_ctl.http), "/v1/nodes", g_body,
                                   sizeof(g_body)),
                 200);
}
