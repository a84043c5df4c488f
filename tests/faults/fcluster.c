/* SPDX-License-Identifier: Apache-2.0 */
/* Copyright (c) 2026 The kvfabric authors */
#include "tests/faults/fcluster.h"

#include "common/etcd.h"
#include "common/time.h"
#include "tests/helpers/etcd.h"
#include "tests/helpers/test_helpers.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#define KVF_FC_NS        0x6661756c74ull
#define KVF_FC_CTL_PORT  7400 /* fixed ports: each host is a namespace */
#define KVF_FC_PEER_PORT 7500
#define KVF_FC_HTTP_PORT 7411
#define KVF_FC_BODY      (256u << 10)
#define KVF_FC_PD_USED   "kvf_agent_pd_region_bytes{state=\"used\"}"
#define KVF_FC_HA_PREFIX "/kvff"
#define KVF_FC_ETCD_BIN  "/usr/bin/etcd"

static void kvf_fc_why(kvf_fc_t *fc, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

static void kvf_fc_why(kvf_fc_t *fc, const char *fmt, ...)
{
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(fc->why, sizeof(fc->why), fmt, ap);
    va_end(ap);
}

/* A polling step of a deadline-bounded wait, not a synchronization. */
static void kvf_fc_pause(int ms)
{
    poll(NULL, 0, ms);
}

/* Runs netns.sh with @p args; its stdout (a reason) into @p out. */
static int kvf_fc_script(char *out, size_t out_len, const char *const args[])
{
    const char *argv[12];
    char script[1024];
    int n = 0, i;

    snprintf(script, sizeof(script), "%s",
             kvf_test_source_path("tests/faults/netns.sh"));
    argv[n++] = "/bin/bash";
    argv[n++] = script;
    for (i = 0; (args[i] != NULL) && (n < 11); i++) {
        argv[n++] = args[i];
    }
    argv[n] = NULL;
    out[0]  = '\0';
    return kvf_test_run(argv, out, out_len, 30000);
}

static const char *kvf_fc_probe(const char *what)
{
    static char reason[2][512];
    const char *args[] = {what, NULL};
    char *r            = reason[strcmp(what, "probe") == 0 ? 0 : 1];

    if (kvf_fc_script(r, sizeof(reason[0]), args) == 0) {
        return NULL;
    }
    r[strcspn(r, "\n")] = '\0';
    if (r[0] == '\0') {
        snprintf(r, sizeof(reason[0]), "tests/faults/netns.sh %s failed", what);
    }
    return r;
}

const char *kvf_fc_netns_unavailable(void)
{
    return kvf_fc_probe("probe");
}

const char *kvf_fc_netem_unavailable(void)
{
    return kvf_fc_probe("netem-probe");
}

/* ------------------------------------------------------------- hosts */

static void kvf_fc_enter(kvf_fc_t *fc, int host)
{
    if ((fc->tag[0] != '\0') && (setns(fc->host_ns[host], CLONE_NEWNET) != 0)) {
        fprintf(stderr, "fcluster: setns host %d: %s\n", host, strerror(errno));
    }
}

static void kvf_fc_leave(kvf_fc_t *fc)
{
    if ((fc->tag[0] != '\0') && (setns(fc->root_ns, CLONE_NEWNET) != 0)) {
        fprintf(stderr, "fcluster: setns back: %s\n", strerror(errno));
    }
}

/* The guard: a child in its own session, blocked reading a pipe whose only
 * writer is this process; at EOF (we are gone) it removes the hosts. */
static int kvf_fc_guard_start(kvf_fc_t *fc)
{
    static char script[1024];
    int fds[2], null_fd;

    snprintf(script, sizeof(script), "%s",
             kvf_test_source_path("tests/faults/netns.sh"));
    if (pipe2(fds, O_CLOEXEC) != 0) {
        kvf_fc_why(fc, "pipe: %s", strerror(errno));
        return -1;
    }
    fc->guard = fork();
    if (fc->guard < 0) {
        kvf_fc_why(fc, "fork: %s", strerror(errno));
        close(fds[0]);
        close(fds[1]);
        return -1;
    }
    if (fc->guard == 0) {
        char c;

        setsid(); /* outlive a kill of the test's process group */
        null_fd = open("/dev/null", O_RDWR);
        dup2(null_fd, STDIN_FILENO);
        dup2(null_fd, STDOUT_FILENO);
        dup2(null_fd, STDERR_FILENO);
        dup2(fds[0], 3);
        close_range(4, ~0u, 0);
        while ((read(3, &c, 1) < 0) && (errno == EINTR)) {
        }
        execl("/bin/bash", "bash", script, "down", fc->tag, (char *)NULL);
        _exit(127);
    }
    close(fds[0]);
    fc->guard_fd = fds[1];
    return 0;
}

static int kvf_fc_hosts_up(kvf_fc_t *fc)
{
    const char *gc[] = {"gc", NULL};
    char n[16], path[128], out[4096];
    const char *up[] = {"up", fc->tag, n, NULL};
    int i;

    snprintf(fc->tag, sizeof(fc->tag), "kvff%d", (int)getpid());
    snprintf(n, sizeof(n), "%d", fc->num_hosts);
    kvf_fc_script(out, sizeof(out), gc); /* leftovers of killed runs */
    if (kvf_fc_guard_start(fc) != 0) {
        return -1;
    }
    if (kvf_fc_script(out, sizeof(out), up) != 0) {
        kvf_fc_why(fc, "netns.sh up %s failed: %s", fc->tag, out);
        return -1;
    }
    fc->root_ns = open("/proc/self/ns/net", O_RDONLY | O_CLOEXEC);
    for (i = 0; i < fc->num_hosts; i++) {
        snprintf(path, sizeof(path), "/run/netns/%s-h%d", fc->tag, i);
        fc->host_ns[i] = open(path, O_RDONLY | O_CLOEXEC);
        if ((fc->host_ns[i] < 0) || (fc->root_ns < 0)) {
            kvf_fc_why(fc, "open %s: %s", path, strerror(errno));
            return -1;
        }
    }
    return 0;
}

static void kvf_fc_hosts_down(kvf_fc_t *fc)
{
    const char *down[] = {"down", fc->tag, NULL};
    char out[4096];
    int i, status;

    if (fc->tag[0] == '\0') {
        return;
    }
    kvf_fc_leave(fc);
    for (i = 0; i < fc->num_hosts; i++) {
        if (fc->host_ns[i] >= 0) {
            close(fc->host_ns[i]);
        }
    }
    if (fc->root_ns >= 0) {
        close(fc->root_ns);
    }
    kvf_fc_script(out, sizeof(out), down);
    if (fc->guard > 0) {
        kill(fc->guard, SIGKILL);
        waitpid(fc->guard, &status, 0);
        close(fc->guard_fd);
    }
}

int kvf_fc_link(kvf_fc_t *fc, int i, bool is_up)
{
    char host[12], out[4096]; /* an int's digits and sign */
    const char *args[] = {"link", fc->tag, host, is_up ? "up" : "down", NULL};

    snprintf(host, sizeof(host), "%d", i + 1);
    if (kvf_fc_script(out, sizeof(out), args) != 0) {
        kvf_fc_why(fc, "link %d %s: %s", i, args[3], out);
        return -1;
    }
    return 0;
}

int kvf_fc_netem(kvf_fc_t *fc, int i, const char *spec)
{
    char host[12], out[4096]; /* an int's digits and sign */
    const char *args[] = {"netem", fc->tag, host, spec, NULL};

    snprintf(host, sizeof(host), "%d", i + 1);
    if (kvf_fc_script(out, sizeof(out), args) != 0) {
        kvf_fc_why(fc, "netem %d '%s': %s", i, spec, out);
        return -1;
    }
    return 0;
}

/* --------------------------------------------------------- processes */

/* Starts argv in host @p host (children inherit the namespace). */
static int kvf_fc_spawn(kvf_fc_t *fc, int host, kvf_test_proc_t *proc,
                        const char *const argv[])
{
    int rc;

    kvf_fc_enter(fc, host);
    rc = kvf_test_proc_start(proc, argv);
    kvf_fc_leave(fc);
    return rc;
}

int kvf_fc_http(kvf_fc_t *fc, int i, const char *path, char *out,
                size_t out_len)
{
    int code;

    kvf_fc_enter(fc, i + 1);
    code =
        kvf_test_http_get((i < 0) ? fc->ctl_http_port : fc->agents[i].http_port,
                          path, out, out_len);
    kvf_fc_leave(fc);
    return code;
}

int kvf_fc_kvfctl(kvf_fc_t *fc, char *out, size_t out_len,
                  const char *const args[])
{
    const char *argv[300];
    char bin[1024];
    int n = 0, i, rc;

    snprintf(bin, sizeof(bin), "%s", kvf_test_build_path("tools/kvfctl"));
    argv[n++] = bin;
    if (fc->params.is_ha) {
        argv[n++] = "--etcd";
        argv[n++] = fc->etcd_urls;
        argv[n++] = "--etcd-prefix";
        argv[n++] = KVF_FC_HA_PREFIX;
    } else {
        argv[n++] = "--controller";
        argv[n++] = fc->ctl_addr;
    }
    argv[n++] = "--timeout";
    argv[n++] = "3000";
    for (i = 0; (args[i] != NULL) && (n < 299); i++) {
        argv[n++] = args[i];
    }
    argv[n] = NULL;
    /* HA: from agent 0's host (controller 0's may be cut off) */
    kvf_fc_enter(fc, fc->params.is_ha ? 1 : 0);
    rc = kvf_test_run(argv, out, out_len, 5000);
    kvf_fc_leave(fc);
    return rc;
}

int kvf_fc_ctl_start(kvf_fc_t *fc)
{
    char bin[1024];
    const char *argv[] = {bin,
                          "--listen",
                          fc->ctl_addr,
                          "--http",
                          fc->ctl_http,
                          "--lease",
                          fc->params.lease,
                          "--heartbeat-interval",
                          "200ms",
                          "--recovery-window",
                          "1s",
                          NULL};
    char out[4096];
    uint64_t deadline = kvf_time_deadline_ns(20 * KVF_NSEC_PER_SEC);

    snprintf(bin, sizeof(bin), "%s",
             kvf_test_build_path("controller/kvf-controller"));
    if (kvf_fc_spawn(fc, 0, &fc->ctl, argv) != 0) {
        kvf_fc_why(fc, "cannot start kvf-controller");
        return -1;
    }
    while (kvf_fc_http(fc, -1, "/healthz", out, sizeof(out)) != 200) {
        if (!kvf_test_proc_alive(&fc->ctl) || kvf_time_expired(deadline)) {
            kvf_fc_why(fc, "controller did not come up: %s",
                       kvf_test_proc_log(&fc->ctl));
            return -1;
        }
        kvf_fc_pause(20);
    }
    return 0;
}

void kvf_fc_ctl_kill(kvf_fc_t *fc)
{
    kvf_test_proc_kill(&fc->ctl);
}

static bool kvf_fc_agent_registered(kvf_fc_t *fc, int i)
{
    static char body[4096];

    return (kvf_fc_http(fc, i, "/healthz", body, sizeof(body)) == 200) &&
           (strstr(body, "\"registered\":true") != NULL);
}

bool kvf_fc_agent_wait_registered(kvf_fc_t *fc, int i, int timeout_ms)
{
    uint64_t deadline =
        kvf_time_deadline_ns((uint64_t)timeout_ms * KVF_NSEC_PER_MSEC);

    while (!kvf_fc_agent_registered(fc, i)) {
        if (kvf_time_expired(deadline) ||
            !kvf_test_proc_alive(&fc->agents[i].proc)) {
            kvf_fc_why(fc, "agent %s not registered after %d ms: %s",
                       fc->agents[i].name, timeout_ms,
                       kvf_test_proc_log(&fc->agents[i].proc));
            return false;
        }
        kvf_fc_pause(20);
    }
    return true;
}

/* Appends FLAG VALUE to an agent's argv when @p value is set. */
static void kvf_fc_agent_arg(const char **argv, int *n_p, const char *flag,
                             const char *value)
{
    if (value != NULL) {
        argv[(*n_p)++] = flag;
        argv[(*n_p)++] = value;
    }
}

int kvf_fc_agent_start(kvf_fc_t *fc, int i)
{
    kvf_fc_agent_t *a = &fc->agents[i];
    char bin[1024];
    const char *argv[48] = {bin,
                            "--controller",
                            fc->ctl_addr,
                            "--name",
                            a->name,
                            "--socket",
                            a->sock,
                            "--http",
                            a->http,
                            "--listen",
                            a->listen,
                            "--pool-size",
                            fc->params.pool_size,
                            "--max-chunk",
                            fc->params.max_chunk,
                            "--transports",
                            "tcp",
                            "--fetch-timeout",
                            fc->params.fetch_tmo,
                            "--reconnect-max",
                            "300ms",
                            "--connect-timeout",
                            "1s",
                            "--request-timeout",
                            "2s",
                            "--log-level",
                            fc->params.log_level,
                            NULL};
    int n                = 0;

    while (argv[n] != NULL) {
        n++;
    }
    if (fc->params.is_ha) {
        argv[1]   = "--etcd"; /* instead of --controller */
        argv[2]   = fc->etcd_urls;
        argv[n++] = "--etcd-prefix";
        argv[n++] = KVF_FC_HA_PREFIX;
    }
    if (fc->tag[0] != '\0') {
        argv[n++] = "--net-devices";
        argv[n++] = "eth0";
    }
    kvf_fc_agent_arg(argv, &n, "--role", fc->params.roles[i]);
    kvf_fc_agent_arg(argv, &n, "--pd-buffer-size", fc->params.pd_buffer_size);
    kvf_fc_agent_arg(argv, &n, "--pd-push-timeout", fc->params.pd_push_tmo);
    kvf_fc_agent_arg(argv, &n, "--pd-alloc-timeout", fc->params.pd_alloc_tmo);
    kvf_fc_agent_arg(argv, &n, "--pd-claim-timeout", fc->params.pd_claim_tmo);
    if (fc->params.disk_size[i] != NULL) {
        kvf_fc_agent_arg(argv, &n, "--disk-path", a->disk);
        kvf_fc_agent_arg(argv, &n, "--disk-size", fc->params.disk_size[i]);
    }
    argv[n] = NULL;
    snprintf(bin, sizeof(bin), "%s", kvf_test_build_path("agent/kvf-agent"));
    a->is_stopped = false;
    if (kvf_fc_spawn(fc, i + 1, &a->proc, argv) != 0) {
        kvf_fc_why(fc, "cannot start agent %s", a->name);
        return -1;
    }
    return kvf_fc_agent_wait_registered(fc, i, 30000) ? 0 : -1;
}

void kvf_fc_agent_kill(kvf_fc_t *fc, int i)
{
    kvf_test_proc_kill(&fc->agents[i].proc);
    fc->agents[i].is_stopped = false;
}

void kvf_fc_agent_pause(kvf_fc_t *fc, int i, bool is_paused)
{
    kvf_fc_agent_t *a = &fc->agents[i];

    if (kvf_test_proc_alive(&a->proc)) {
        kill(a->proc.pid, is_paused ? SIGSTOP : SIGCONT);
        a->is_stopped = is_paused;
    }
}

/* ------------------------------------------------------ HA on etcd */

int kvf_fc_ha_ctl_host(const kvf_fc_t *fc, int c)
{
    return (c == 0) ? 0 : fc->params.num_agents + c;
}

int kvf_fc_ha_etcd_host(const kvf_fc_t *fc, int e)
{
    return fc->params.num_agents + KVF_FC_HA_CTLS + e;
}

/* 10.231.0.(host + 1) */
static void kvf_fc_host_ip(int host, char *buf, size_t len)
{
    snprintf(buf, len, "10.231.0.%d", host + 1);
}

int kvf_fc_ha_etcd_start(kvf_fc_t *fc, int e)
{
    char name[8], data[128], client[96], peer[64], cluster[256], ip[32];
    const char *argv[] = {KVF_FC_ETCD_BIN,
                          "--name",
                          name,
                          "--data-dir",
                          data,
                          "--listen-client-urls",
                          client,
                          "--advertise-client-urls",
                          client + strlen("http://127.0.0.1:2379,"),
                          "--listen-peer-urls",
                          peer,
                          "--initial-advertise-peer-urls",
                          peer,
                          "--initial-cluster",
                          cluster,
                          "--initial-cluster-state",
                          "new",
                          NULL};
    int i;

    snprintf(name, sizeof(name), "e%d", e);
    snprintf(data, sizeof(data), "/tmp/%s-etcd%d", fc->tag, e);
    kvf_fc_host_ip(kvf_fc_ha_etcd_host(fc, e), ip, sizeof(ip));
    /* loopback too: the health check below asks 127.0.0.1 in the host */
    snprintf(client, sizeof(client), "http://127.0.0.1:2379,http://%s:2379",
             ip);
    snprintf(peer, sizeof(peer), "http://%s:2380", ip);
    cluster[0] = '\0';
    for (i = 0; i < KVF_FC_HA_ETCDS; i++) {
        kvf_fc_host_ip(kvf_fc_ha_etcd_host(fc, i), ip, sizeof(ip));
        snprintf(cluster + strlen(cluster), sizeof(cluster) - strlen(cluster),
                 "%se%d=http://%s:2380", (i > 0) ? "," : "", i, ip);
    }
    if (kvf_fc_spawn(fc, kvf_fc_ha_etcd_host(fc, e), &fc->etcd[e], argv) != 0) {
        kvf_fc_why(fc, "cannot start %s", KVF_FC_ETCD_BIN);
        return -1;
    }
    return 0;
}

/* Waits until etcd member @p e answers /health true (it has a leader). */
static int kvf_fc_ha_etcd_wait(kvf_fc_t *fc, int e, int timeout_ms)
{
    uint64_t deadline =
        kvf_time_deadline_ns((uint64_t)timeout_ms * KVF_NSEC_PER_MSEC);
    char out[512];
    int code;

    for (;;) {
        kvf_fc_enter(fc, kvf_fc_ha_etcd_host(fc, e));
        code = kvf_test_http_get(2379, "/health", out, sizeof(out));
        kvf_fc_leave(fc);
        if ((code == 200) && (strstr(out, "true") != NULL)) {
            return 0;
        }
        if (kvf_time_expired(deadline) || !kvf_test_proc_alive(&fc->etcd[e])) {
            kvf_fc_why(fc, "etcd member %d not healthy: %s", e,
                       kvf_test_proc_log(&fc->etcd[e]));
            return -1;
        }
        kvf_fc_pause(20);
    }
}

void kvf_fc_ha_etcd_stop(kvf_fc_t *fc, int e)
{
    kvf_test_proc_stop(&fc->etcd[e], 10000);
}

int kvf_fc_ha_ctl_start(kvf_fc_t *fc, int c)
{
    char bin[1024];
    const char *argv[] = {
        bin,
        "--listen",
        fc->ha_ctl_addr[c],
        "--http",
        "127.0.0.1:7401",
        "--lease",
        fc->params.lease,
        "--heartbeat-interval",
        "200ms",
        "--recovery-window",
        "1s",
        "--port-file",
        fc->ha_ports[c],
        "--etcd",
        fc->etcd_urls,
        "--etcd-prefix",
        KVF_FC_HA_PREFIX,
        "--etcd-lease",
        (fc->params.etcd_lease != NULL) ? fc->params.etcd_lease : "2s",
        NULL};

    snprintf(bin, sizeof(bin), "%s",
             kvf_test_build_path("controller/kvf-controller"));
    unlink(fc->ha_ports[c]); /* written again once it leads */
    if (kvf_fc_spawn(fc, kvf_fc_ha_ctl_host(fc, c), &fc->ha_ctl[c], argv) !=
        0) {
        kvf_fc_why(fc, "cannot start kvf-controller %d", c);
        return -1;
    }
    return 0;
}

void kvf_fc_ha_ctl_kill(kvf_fc_t *fc, int c)
{
    kvf_test_proc_kill(&fc->ha_ctl[c]);
    unlink(fc->ha_ports[c]);
}

int kvf_fc_ha_ctl_wait_exit(kvf_fc_t *fc, int c, int timeout_ms)
{
    int status = kvf_test_proc_wait_exit(&fc->ha_ctl[c], timeout_ms);

    if (status >= 0) {
        unlink(fc->ha_ports[c]);
    }
    return status;
}

bool kvf_fc_ha_ctl_serving(kvf_fc_t *fc, int c)
{
    return (fc->ha_ctl[c].pid > 0) && kvf_test_proc_alive(&fc->ha_ctl[c]) &&
           kvf_test_port_file_serving(fc->ha_ports[c], NULL, 0);
}

int kvf_fc_ha_leader(kvf_fc_t *fc, int timeout_ms)
{
    uint64_t deadline =
        kvf_time_deadline_ns((uint64_t)timeout_ms * KVF_NSEC_PER_MSEC);
    char control[256], err[512];
    kvf_status_t status;
    int c;

    for (;;) {
        kvf_fc_enter(fc, 1);
        status =
            kvf_etcd_find_leader(fc->etcd_urls, KVF_FC_HA_PREFIX, 1000, control,
                                 sizeof(control), err, sizeof(err));
        kvf_fc_leave(fc);
        for (c = 0; (status == KVF_OK) && (c < KVF_FC_HA_CTLS); c++) {
            if ((strcmp(control, fc->ha_ctl_addr[c]) == 0) &&
                kvf_fc_ha_ctl_serving(fc, c)) {
                return c;
            }
        }
        if (kvf_time_expired(deadline)) {
            kvf_fc_why(fc, "no leader: %s", (status == KVF_OK) ? control : err);
            return -1;
        }
        kvf_fc_pause(20);
    }
}

int kvf_fc_cut(kvf_fc_t *fc, int a, int b, bool is_cut)
{
    char ha[12], hb[12], out[4096]; /* an int's digits and sign */
    const char *args[] = {"cut", fc->tag, ha, hb, is_cut ? "on" : "off", NULL};

    snprintf(ha, sizeof(ha), "%d", a);
    snprintf(hb, sizeof(hb), "%d", b);
    if (kvf_fc_script(out, sizeof(out), args) != 0) {
        kvf_fc_why(fc, "cut %d %d %s: %s", a, b, args[4], out);
        return -1;
    }
    return 0;
}

/* etcd members, then the three controllers; waits for a leader. */
static int kvf_fc_ha_start(kvf_fc_t *fc)
{
    char ip[32];
    int i;

    if (access(KVF_FC_ETCD_BIN, X_OK) != 0) {
        kvf_fc_why(fc, "%s is not installed (Debian etcd-server)",
                   KVF_FC_ETCD_BIN);
        return -1;
    }
    fc->etcd_urls[0] = '\0';
    for (i = 0; i < KVF_FC_HA_ETCDS; i++) {
        kvf_fc_host_ip(kvf_fc_ha_etcd_host(fc, i), ip, sizeof(ip));
        snprintf(fc->etcd_urls + strlen(fc->etcd_urls),
                 sizeof(fc->etcd_urls) - strlen(fc->etcd_urls),
                 "%shttp://%s:2379", (i > 0) ? "," : "", ip);
        if (kvf_fc_ha_etcd_start(fc, i) != 0) {
            return -1;
        }
    }
    for (i = 0; i < KVF_FC_HA_ETCDS; i++) {
        if (kvf_fc_ha_etcd_wait(fc, i, 30000) != 0) {
            return -1;
        }
    }
    for (i = 0; i < KVF_FC_HA_CTLS; i++) {
        kvf_fc_host_ip(kvf_fc_ha_ctl_host(fc, i), ip, sizeof(ip));
        snprintf(fc->ha_ctl_addr[i], sizeof(fc->ha_ctl_addr[i]), "%s:%d", ip,
                 KVF_FC_CTL_PORT);
        snprintf(fc->ha_ports[i], sizeof(fc->ha_ports[i]),
                 "/tmp/%s-ctl%d.ports", fc->tag, i);
        if (kvf_fc_ha_ctl_start(fc, i) != 0) {
            return -1;
        }
    }
    return (kvf_fc_ha_leader(fc, 30000) >= 0) ? 0 : -1;
}

static void kvf_fc_ha_stop(kvf_fc_t *fc)
{
    char cmd[160];
    int i;

    for (i = 0; i < KVF_FC_HA_CTLS; i++) {
        if (fc->ha_ctl[i].pid > 0) {
            kvf_test_proc_stop(&fc->ha_ctl[i], 10000);
            unlink(fc->ha_ports[i]);
        }
    }
    for (i = 0; i < KVF_FC_HA_ETCDS; i++) {
        if (fc->etcd[i].pid > 0) {
            kvf_test_proc_stop(&fc->etcd[i], 10000);
        }
    }
    snprintf(cmd, sizeof(cmd), "rm -rf /tmp/%s-etcd*", fc->tag);
    if (system(cmd) != 0) {
        fprintf(stderr, "fcluster: %s failed\n", cmd);
    }
}

int kvf_fc_create(kvf_fc_t *fc, const kvf_fc_params_t *params)
{
    int i;

    memset(fc, 0, sizeof(*fc));
    fc->params = *params;
    if (fc->params.log_level == NULL) {
        fc->params.log_level = "info";
    }
    fc->root_ns  = -1;
    fc->guard_fd = -1;
    for (i = 0; i < KVF_FC_MAX_HOSTS; i++) {
        fc->host_ns[i] = -1;
    }
    fc->num_hosts = params->num_agents + 1;
    if (params->is_ha) {
        fc->num_hosts += KVF_FC_HA_CTLS - 1 + KVF_FC_HA_ETCDS;
        if (!params->is_netns) {
            kvf_fc_why(fc, "HA mode needs hosts (is_netns)");
            return -1;
        }
    }
    if ((params->num_agents < 1) || (params->num_agents > KVF_FC_MAX_AGENTS)) {
        kvf_fc_why(fc, "num_agents %d out of range", params->num_agents);
        return -1;
    }
    if (params->is_netns) {
        if (kvf_fc_hosts_up(fc) != 0) {
            return -1;
        }
        snprintf(fc->ctl_addr, sizeof(fc->ctl_addr), "10.231.0.1:%d",
                 KVF_FC_CTL_PORT);
        snprintf(fc->ctl_http, sizeof(fc->ctl_http), "127.0.0.1:%d",
                 KVF_FC_CTL_PORT + 1);
        fc->ctl_http_port = KVF_FC_CTL_PORT + 1;
    } else {
        snprintf(fc->ctl_addr, sizeof(fc->ctl_addr), "127.0.0.1:%u",
                 kvf_test_free_port());
        fc->ctl_http_port = kvf_test_free_port();
        snprintf(fc->ctl_http, sizeof(fc->ctl_http), "127.0.0.1:%u",
                 fc->ctl_http_port);
    }
    for (i = 0; i < params->num_agents; i++) {
        kvf_fc_agent_t *a = &fc->agents[i];

        snprintf(a->name, sizeof(a->name), "fa%d", i);
        snprintf(a->sock, sizeof(a->sock), "/tmp/kvff%d-a%d.sock",
                 (int)getpid(), i);
        snprintf(a->disk, sizeof(a->disk), "/var/tmp/kvff%d-a%d.disk",
                 (int)getpid(), i);
        if (params->is_netns) {
            a->http_port = KVF_FC_HTTP_PORT;
            snprintf(a->listen, sizeof(a->listen), "10.231.0.%d:%d", i + 2,
                     KVF_FC_PEER_PORT);
        } else {
            a->http_port = kvf_test_free_port();
            snprintf(a->listen, sizeof(a->listen), "127.0.0.1:0");
        }
        snprintf(a->http, sizeof(a->http), "127.0.0.1:%u", a->http_port);
    }
    if ((params->is_ha ? kvf_fc_ha_start(fc) : kvf_fc_ctl_start(fc)) != 0) {
        return -1;
    }
    for (i = 0; i < params->num_agents; i++) {
        if (kvf_fc_agent_start(fc, i) != 0) {
            return -1;
        }
    }
    return 0;
}

void kvf_fc_destroy(kvf_fc_t *fc)
{
    int i;

    for (i = 0; i < fc->params.num_agents; i++) {
        if (fc->agents[i].is_stopped) {
            kvf_fc_agent_pause(fc, i, false);
        }
        kvf_test_proc_stop(&fc->agents[i].proc, 10000);
        unlink(fc->agents[i].sock);
        unlink(fc->agents[i].disk);
    }
    kvf_test_proc_stop(&fc->ctl, 10000);
    if (fc->params.is_ha) {
        kvf_fc_ha_stop(fc);
    }
    kvf_fc_hosts_down(fc);
}

/* ------------------------------------------------------ convergence */

static uint64_t kvf_fc_json_u64(const char *body, const char *field)
{
    const char *p = strstr(body, field);

    return (p != NULL) ? strtoull(p + strlen(field), NULL, 10) : UINT64_MAX;
}

/* Appends the keys of the JSON array after @p field in @p body to
 * @p inv; -1 when the array is missing. */
static int kvf_fc_inventory_keys(const char *body, const char *field,
                                 kvf_fc_inventory_t *inv)
{
    const char *p = strstr(body, field);

    if (p == NULL) {
        return -1;
    }
    p += strlen(field);
    while ((*p == '"') && (inv->num_keys < KVF_FC_MAX_KEYS)) {
        char str[KVF_KEY_STR_SIZE];

        snprintf(str, sizeof(str), "%.*s", KVF_KEY_STR_SIZE - 1, p + 1);
        if (kvf_key_parse(str, &inv->keys[inv->num_keys]) != KVF_OK) {
            break;
        }
        inv->num_keys++;
        p += KVF_KEY_STR_SIZE + 1; /* "key" */
        if (*p == ',') {
            p++;
        }
    }
    return 0;
}

int kvf_fc_inventory(kvf_fc_t *fc, int i, kvf_fc_inventory_t *inv)
{
    char *body = malloc(KVF_FC_BODY);
    int rc     = -1;

    if (body == NULL) {
        return -1;
    }
    memset(inv, 0, offsetof(kvf_fc_inventory_t, keys));
    if (kvf_fc_http(fc, i, "/v1/inventory", body, KVF_FC_BODY) != 200) {
        kvf_fc_why(fc, "agent %s: no inventory", fc->agents[i].name);
        goto out;
    }
    inv->node_id     = (uint32_t)kvf_fc_json_u64(body, "\"node_id\":");
    inv->chunks      = kvf_fc_json_u64(body, "\"chunks\":");
    inv->grants      = kvf_fc_json_u64(body, "\"grants\":");
    inv->pinned      = kvf_fc_json_u64(body, "\"pinned\":");
    inv->disk_chunks = kvf_fc_json_u64(body, "\"disk_chunks\":");
    if ((kvf_fc_inventory_keys(body, "\"keys\":[", inv) != 0) ||
        ((inv->disk_chunks != UINT64_MAX) &&
         (kvf_fc_inventory_keys(body, "\"disk_keys\":[", inv) != 0))) {
        kvf_fc_why(fc, "agent %s: bad inventory %s", fc->agents[i].name, body);
        goto out;
    }
    if (inv->disk_chunks == UINT64_MAX) {
        inv->disk_chunks = 0; /* an agent of before the disk tier */
    }
    rc = 0;
out:
    free(body);
    return rc;
}

long long kvf_fc_metric(kvf_fc_t *fc, int i, const char *name)
{
    char *body = malloc(KVF_FC_BODY);
    char needle[160];
    const char *p = NULL;
    long long value;

    snprintf(needle, sizeof(needle), "\n%s ", name);
    if ((body != NULL) &&
        (kvf_fc_http(fc, i, "/metrics", body, KVF_FC_BODY) == 200)) {
        p = strstr(body, needle);
    }
    value = (p == NULL) ? -1 : atoll(p + strlen(needle));
    free(body);
    return value;
}

/* The registry's count for node @p name in state alive from tree JSON. */
static uint64_t kvf_fc_tree_keys(const char *tree, const char *name,
                                 uint32_t *id_p)
{
    char needle[64];
    const char *p = tree, *node;

    snprintf(needle, sizeof(needle), "\"name\":\"%s\",\"state\":\"alive\"",
             name);
    p = strstr(p, needle);
    if (p == NULL) {
        return UINT64_MAX;
    }
    for (node = p; (node > tree) && (*node != '{'); node--) {
    }
    *id_p = (uint32_t)kvf_fc_json_u64(node, "\"id\":");
    return kvf_fc_json_u64(p, "\"keys\":");
}

static bool kvf_fc_key_eq(const kvf_key_t *a, const kvf_key_t *b)
{
    return (a->ns == b->ns) && (a->hi == b->hi) && (a->lo == b->lo);
}

/* Checks the lookups of @p n keys: each held, at a node that has it. */
static bool kvf_fc_lookup_check(kvf_fc_t *fc, const kvf_key_t *keys, size_t n,
                                kvf_fc_inventory_t *invs, int num_inv)
{
    static char strs[256][KVF_KEY_STR_SIZE];
    const char *args[260];
    char *out = malloc(KVF_FC_BODY);
    const char *p;
    size_t k;
    int a      = 0;
    bool is_ok = false;

    if (out == NULL) {
        return false;
    }
    args[a++] = "--json";
    args[a++] = "--any-order";
    args[a++] = "lookup";
    for (k = 0; k < n; k++) {
        args[a++] = kvf_key_format(&keys[k], strs[k]);
    }
    args[a] = NULL;
    if (kvf_fc_kvfctl(fc, out, KVF_FC_BODY, args) != 0) {
        kvf_fc_why(fc, "kvfctl lookup failed: %s", out);
        goto out;
    }
    p = out;
    for (k = 0; k < n; k++) {
        uint32_t holder;
        bool has = false;
        int i;
        size_t j;

        p = strstr(p, "\"holder\":");
        if (p == NULL) {
            kvf_fc_why(fc, "kvfctl lookup: short reply %s", out);
            goto out;
        }
        holder = (uint32_t)strtoul(p + 9, NULL, 10);
        p += 9;
        for (i = 0; (i < num_inv) && !has; i++) {
            if (invs[i].node_id != holder) {
                continue;
            }
            for (j = 0; (j < invs[i].num_keys) && !has; j++) {
                has = kvf_fc_key_eq(&invs[i].keys[j], &keys[k]);
            }
        }
        if (!has) {
            kvf_fc_why(fc,
                       "registry names holder %u for %s, which does not "
                       "hold it",
                       holder, strs[k]);
            goto out;
        }
    }
    is_ok = true;
out:
    free(out);
    return is_ok;
}

bool kvf_fc_converged(kvf_fc_t *fc)
{
    const char *tree_args[]  = {"--json", "tree", NULL};
    int num                  = fc->params.num_agents, i;
    kvf_fc_inventory_t *invs = calloc((size_t)num, sizeof(*invs));
    kvf_key_t *uni = calloc((size_t)num * KVF_FC_MAX_KEYS, sizeof(*uni));
    char *tree     = malloc(KVF_FC_BODY);
    size_t num_uni = 0, j, k;
    bool is_ok     = false;

    if ((invs == NULL) || (uni == NULL) || (tree == NULL)) {
        goto out;
    }
    for (i = 0; i < num; i++) {
        if (kvf_fc_inventory(fc, i, &invs[i]) != 0) {
            goto out;
        }
    }
    if (kvf_fc_kvfctl(fc, tree, KVF_FC_BODY, tree_args) != 0) {
        kvf_fc_why(fc, "kvfctl tree failed: %s", tree);
        goto out;
    }
    for (i = 0; i < num; i++) {
        uint32_t id   = 0;
        uint64_t held = kvf_fc_tree_keys(tree, fc->agents[i].name, &id);

        if ((held != invs[i].chunks + invs[i].disk_chunks) ||
            (id != invs[i].node_id)) {
            kvf_fc_why(
                fc,
                "agent %s (node %u) holds %llu chunks (%llu of them "
                "on disk only), the registry says node %u has %llu: "
                "%s",
                fc->agents[i].name, invs[i].node_id,
                (unsigned long long)(invs[i].chunks + invs[i].disk_chunks),
                (unsigned long long)invs[i].disk_chunks, id,
                (unsigned long long)held, tree);
            goto out;
        }
        for (j = 0; j < invs[i].num_keys; j++) {
            for (k = 0; k < num_uni; k++) {
                if (kvf_fc_key_eq(&uni[k], &invs[i].keys[j])) {
                    break;
                }
            }
            if (k == num_uni) {
                uni[num_uni++] = invs[i].keys[j];
            }
        }
    }
    if (kvf_fc_json_u64(tree, "{\"keys\":") != num_uni) {
        kvf_fc_why(fc, "the registry has %llu keys, the agents %zu: %s",
                   (unsigned long long)kvf_fc_json_u64(tree, "{\"keys\":"),
                   num_uni, tree);
        goto out;
    }
    for (k = 0; k < num_uni; k += 200) {
        if (!kvf_fc_lookup_check(fc, uni + k,
                                 (num_uni - k < 200) ? num_uni - k : 200, invs,
                                 num)) {
            goto out;
        }
    }
    is_ok = true;
out:
    free(tree);
    free(uni);
    free(invs);
    return is_ok;
}

bool kvf_fc_wait_converged(kvf_fc_t *fc, int timeout_ms)
{
    uint64_t deadline =
        kvf_time_deadline_ns((uint64_t)timeout_ms * KVF_NSEC_PER_MSEC);

    while (!kvf_fc_converged(fc)) {
        if (kvf_time_expired(deadline)) {
            return false;
        }
        kvf_fc_pause(50);
    }
    return true;
}

bool kvf_fc_wait_quiet(kvf_fc_t *fc, int timeout_ms)
{
    uint64_t deadline =
        kvf_time_deadline_ns((uint64_t)timeout_ms * KVF_NSEC_PER_MSEC);
    kvf_fc_inventory_t *inv = malloc(sizeof(*inv));
    bool is_quiet           = false;
    int i;

    long long pd_used;

    while ((inv != NULL) && !is_quiet) {
        is_quiet = true;
        for (i = 0; (i < fc->params.num_agents) && is_quiet; i++) {
            if (!kvf_test_proc_alive(&fc->agents[i].proc)) {
                continue; /* killed: nothing of it is left to leak */
            }
            if (kvf_fc_inventory(fc, i, inv) != 0) {
                is_quiet = false;
            } else if ((inv->grants != 0) || (inv->pinned != 0)) {
                kvf_fc_why(fc, "agent %s still has %llu grants, %llu pinned",
                           fc->agents[i].name, (unsigned long long)inv->grants,
                           (unsigned long long)inv->pinned);
                is_quiet = false;
            } else if ((pd_used = kvf_fc_metric(fc, i, KVF_FC_PD_USED)) != 0) {
                kvf_fc_why(fc, "agent %s: %lld PD region bytes in use",
                           fc->agents[i].name, pd_used);
                is_quiet = false;
            }
        }
        if (!is_quiet && kvf_time_expired(deadline)) {
            break;
        }
        if (!is_quiet) {
            kvf_fc_pause(50);
        }
    }
    free(inv);
    return is_quiet;
}

bool kvf_fc_responsive(kvf_fc_t *fc)
{
    const char *nodes[] = {"nodes", NULL};
    char out[8192];
    int i;

    if ((!fc->params.is_ha && !kvf_test_proc_alive(&fc->ctl)) ||
        (kvf_fc_kvfctl(fc, out, sizeof(out), nodes) != 0)) {
        kvf_fc_why(fc, "controller does not answer: %s",
                   kvf_test_proc_log(&fc->ctl));
        return false;
    }
    for (i = 0; i < fc->params.num_agents; i++) {
        if (!kvf_test_proc_alive(&fc->agents[i].proc) ||
            (kvf_fc_http(fc, i, "/healthz", out, sizeof(out)) < 0)) {
            kvf_fc_why(fc, "agent %s does not answer: %s", fc->agents[i].name,
                       kvf_test_proc_log(&fc->agents[i].proc));
            return false;
        }
    }
    return true;
}

/* ----------------------------------------------------------- engines */

void kvf_fc_keys(uint64_t seed, kvf_key_t *keys, uint32_t n)
{
    uint32_t tokens[16 * 256];
    size_t got, i;

    for (i = 0; i < (size_t)n * 16; i++) {
        tokens[i] = (uint32_t)(seed * 1000003u + i * 7 + 3);
    }
    kvf_key_chain(KVF_FC_NS, tokens, (size_t)n * 16, 16, false, keys, n, &got);
}

void kvf_fc_fill(uint8_t *p, size_t len, const kvf_key_t *key)
{
    uint64_t x = (key->lo ^ key->hi) | 1;
    size_t i;

    for (i = 0; i + 8 <= len; i += 8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        memcpy(p + i, &x, 8);
    }
}

kvf_status_t kvf_fc_connect(kvf_fc_t *fc, int i, kvf_client_t **client_p)
{
    kvf_client_params_t p = {.field_mask = KVF_CLIENT_PARAM_SOCKET |
                                           KVF_CLIENT_PARAM_TIMEOUT,
                             .socket_path = fc->agents[i].sock,
                             .timeout_ns  = fc->params.client_tmo_ns};

    return kvf_client_connect(&p, client_p);
}

kvf_status_t kvf_fc_store(kvf_fc_t *fc, int i, const kvf_key_t *keys,
                          uint32_t n, size_t len)
{
    kvf_slot_t slots[256];
    uint64_t sums[256];
    kvf_client_t *c = NULL;
    kvf_status_t st;
    uint32_t k;

    if (n > 256) {
        return KVF_ERR_INVALID;
    }
    st = kvf_fc_connect(fc, i, &c);
    if (st != KVF_OK) {
        kvf_fc_why(fc, "connect to %s: %s", fc->agents[i].name,
                   kvf_strerror(st));
        return st;
    }
    st = kvf_client_alloc(c, len, n, slots);
    if (st == KVF_OK) {
        for (k = 0; k < n; k++) {
            uint8_t *p = (uint8_t *)kvf_client_pool_base(c) + slots[k].offset;

            kvf_fc_fill(p, len, &keys[k]);
            sums[k] = kvf_chunk_checksum(p, len);
        }
        st = kvf_client_commit(c, keys, slots, sums, n);
    }
    if (st != KVF_OK) {
        kvf_fc_why(fc, "store on %s: %s", fc->agents[i].name,
                   kvf_client_last_error(c));
    }
    kvf_client_disconnect(c);
    return st;
}

void kvf_fc_retrieve(kvf_fc_t *fc, int i, const kvf_key_t *keys, uint32_t n,
                     size_t len, bool prefetch, kvf_fc_fetch_t *res)
{
    kvf_slot_t slots[256];
    bool missing[256];
    kvf_lookup_result_t lr;
    kvf_client_t *c = NULL;
    uint64_t t0     = kvf_time_now_ns();
    uint8_t *expect = malloc(len);
    uint32_t k;

    memset(res, 0, sizeof(*res));
    res->status = (n > 256) || (expect == NULL) ? KVF_ERR_INVALID
                                                : kvf_fc_connect(fc, i, &c);
    if ((res->status == KVF_OK) && prefetch) {
        res->status = kvf_client_lookup(c, keys, n, true, &lr);
    }
    if (res->status == KVF_OK) {
        res->status = kvf_client_retrieve(c, keys, n, slots, missing);
    }
    if (res->status == KVF_OK) {
        for (k = 0; k < n; k++) {
            const uint8_t *got;
            size_t b;

            if (missing[k]) {
                res->missing++;
                continue;
            }
            got = (const uint8_t *)kvf_client_pool_base(c) + slots[k].offset;
            kvf_fc_fill(expect, len, &keys[k]);
            if ((slots[k].length != len) || (memcmp(got, expect, len) != 0)) {
                for (b = 0; b < len; b++) {
                    res->wrong_bytes +=
                        (b >= slots[k].length) || (got[b] != expect[b]);
                }
            } else {
                res->got++;
            }
            kvf_client_release(c, &slots[k], 1);
        }
    } else if (c != NULL) {
        kvf_fc_why(fc, "retrieve via %s: %s", fc->agents[i].name,
                   kvf_client_last_error(c));
    }
    res->took_ns = kvf_time_now_ns() - t0;
    kvf_client_disconnect(c);
    free(expect);
}

bool kvf_fc_wait_hits(kvf_fc_t *fc, int i, const kvf_key_t *keys, uint32_t n,
                      uint32_t hits, int timeout_ms)
{
    uint64_t deadline =
        kvf_time_deadline_ns((uint64_t)timeout_ms * KVF_NSEC_PER_MSEC);
    kvf_lookup_result_t res = {0};
    kvf_client_t *c         = NULL;

    for (;;) {
        if ((c != NULL) || (kvf_fc_connect(fc, i, &c) == KVF_OK)) {
            if (kvf_client_lookup(c, keys, n, false, &res) != KVF_OK) {
                kvf_client_disconnect(c);
                c = NULL;
            } else if (res.hit_chunks == hits) {
                break;
            }
        }
        if (kvf_time_expired(deadline)) {
            kvf_fc_why(fc, "lookup via %s: %u hits, want %u",
                       fc->agents[i].name, res.hit_chunks, hits);
            kvf_client_disconnect(c);
            return false;
        }
        kvf_fc_pause(20);
    }
    kvf_client_disconnect(c);
    return true;
}

/* ---------------------------------------------------------------- PD */

void kvf_fc_pd_fill(uint8_t *p, size_t len, uint64_t req, uint32_t index)
{
    /* a key of its own per (request, chunk): hi and lo never cancel out */
    kvf_key_t key = {.ns = KVF_FC_NS,
                     .hi = req * 0x9e3779b97f4a7c15ull,
                     .lo = ((uint64_t)index << 32) | 0x5044u};

    kvf_fc_fill(p, len, &key);
}

/* Chunks [first, first + n) of @p req in @p n fresh grants of @p c, and
 * their checksums. */
static kvf_status_t kvf_fc_pd_alloc(kvf_fc_t *fc, kvf_client_t *c, uint64_t req,
                                    uint32_t first, uint32_t n, size_t len,
                                    kvf_slot_t *slots, uint64_t *sums)
{
    kvf_status_t st;
    uint32_t k;

    if ((n == 0) || (n > KVF_FC_PD_MAX)) {
        return KVF_ERR_INVALID;
    }
    st = kvf_client_alloc(c, len, n, slots);
    if (st != KVF_OK) {
        kvf_fc_why(fc, "pd request %llu: alloc: %s", (unsigned long long)req,
                   kvf_client_last_error(c));
        return st;
    }
    for (k = 0; k < n; k++) {
        uint8_t *p = (uint8_t *)kvf_client_pool_base(c) + slots[k].offset;

        kvf_fc_pd_fill(p, len, req, first + k);
        sums[k] = kvf_chunk_checksum(p, len);
    }
    return KVF_OK;
}

kvf_status_t kvf_fc_pd_push(kvf_fc_t *fc, kvf_client_t *c, uint64_t req,
                            const char *decoder, uint32_t first, uint32_t n,
                            size_t len, bool final)
{
    kvf_slot_t slots[KVF_FC_PD_MAX];
    uint64_t sums[KVF_FC_PD_MAX];
    kvf_status_t st;

    st = kvf_fc_pd_alloc(fc, c, req, first, n, len, slots, sums);
    if (st != KVF_OK) {
        return st;
    }
    st = kvf_pd_push(c, req, decoder, slots, sums, n, final);
    if (st != KVF_OK) {
        kvf_fc_why(fc, "pd push %llu to %s: %s", (unsigned long long)req,
                   decoder, kvf_client_last_error(c));
    }
    /* the slots stay the engine's after the push, whatever it answered;
     * a dead agent took them with it */
    kvf_client_release(c, slots, n);
    return st;
}

kvf_status_t kvf_fc_pd_push_layers(kvf_fc_t *fc, kvf_client_t *c, uint64_t req,
                                   const char *decoder, uint32_t n,
                                   uint32_t parts, size_t len,
                                   uint64_t timeout_ns)
{
    kvf_slot_t slots[KVF_FC_PD_MAX];
    uint64_t sums[KVF_FC_PD_MAX];
    kvf_status_t st;
    uint32_t k, sent = 0, m;

    if ((parts == 0) || (parts > n)) {
        return KVF_ERR_INVALID;
    }
    st = kvf_fc_pd_alloc(fc, c, req, 0, n, len, slots, sums);
    if (st != KVF_OK) {
        return st;
    }
    for (k = 0; (k < parts) && (st == KVF_OK); k++) {
        m  = (k + 1 == parts) ? n - sent : (n - sent) / (parts - k);
        st = kvf_pd_push_start(c, req, decoder, slots + sent, sums + sent, m,
                               k + 1 == parts);
        sent += m;
    }
    if (st == KVF_OK) {
        st = kvf_pd_push_wait(c, req, timeout_ns);
    } else {
        (void)kvf_pd_push_wait(c, req, timeout_ns); /* collect the rest */
    }
    if (st != KVF_OK) {
        kvf_fc_why(fc, "pd layer pushes %llu to %s: %s",
                   (unsigned long long)req, decoder, kvf_client_last_error(c));
    }
    /* the slots stay the engine's once every push of them ended */
    kvf_client_release(c, slots, n);
    return st;
}

void kvf_fc_pd_receive(kvf_fc_t *fc, kvf_client_t *c, uint64_t req, uint32_t n,
                       size_t len, uint64_t timeout_ns, kvf_fc_pd_t *res)
{
    kvf_slot_t slots[KVF_FC_PD_MAX];
    uint8_t *expect = malloc(len);
    uint64_t t0     = kvf_time_now_ns();
    uint32_t k;
    size_t b;

    memset(res, 0, sizeof(*res));
    if (expect == NULL) {
        res->status = KVF_ERR_NO_MEMORY;
        return;
    }
    res->status =
        kvf_pd_wait(c, req, timeout_ns, slots, KVF_FC_PD_MAX, &res->num);
    res->took_ns = kvf_time_now_ns() - t0;
    if (res->status != KVF_OK) {
        kvf_fc_why(fc, "pd wait %llu: %s", (unsigned long long)req,
                   kvf_client_last_error(c));
        free(expect);
        return;
    }
    for (k = 0; k < res->num; k++) {
        const uint8_t *got =
            (const uint8_t *)kvf_client_pool_base(c) + slots[k].offset;

        if (k >= n) {
            res->wrong_bytes += slots[k].length;
            continue;
        }
        kvf_fc_pd_fill(expect, len, req, k);
        if ((slots[k].length == len) && (memcmp(got, expect, len) == 0)) {
            res->got++;
            continue;
        }
        for (b = 0; b < len; b++) {
            res->wrong_bytes += (b >= slots[k].length) || (got[b] != expect[b]);
        }
    }
    if (kvf_pd_release(c, req) != KVF_OK) {
        kvf_fc_why(fc, "pd release %llu: %s", (unsigned long long)req,
                   kvf_client_last_error(c));
    }
    free(expect);
}
