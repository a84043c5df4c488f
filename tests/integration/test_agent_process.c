/* SPDX-License-Identifier: Apache-2.0 */
/* Copyright (c) 2026 The kvfabric authors */
/*
 * kvf-agent as a process: configuration errors, HTTP endpoints, clean
 * shutdown on SIGTERM with and without a reachable controller.
 */
#include "tests/helpers/proc.h"
#include "tests/helpers/test_helpers.h"

#include <criterion/criterion.h>

#include <dirent.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

TestSuite(agent_process, .fini = kvf_test_check_leaks, .timeout = 60);

static char g_bin[4096];

static const char *agent_bin(void)
{
    snprintf(g_bin, sizeof(g_bin), "%s",
             kvf_test_build_path("agent/kvf-agent"));
    return g_bin;
}

static int count_of(const char *text, const char *needle)
{
    int n = 0;

    for (text = strstr(text, needle); text != NULL;
         text = strstr(text + 1, needle)) {
        n++;
    }
    return n;
}

Test(agent_process, bad_config_exits_with_one_line)
{
    char out[4096];
    const char *argv[] = {agent_bin(), "--pool-size", "12Q", NULL};
    kvf_test_proc_t proc;

    cr_assert_eq(kvf_test_proc_start(&proc, argv), 0);
    cr_assert_eq(kvf_test_proc_wait_exit(&proc, 10000), 1);
    snprintf(out, sizeof(out), "%s", kvf_test_proc_log(&proc));
    cr_assert(strstr(out, "kvf-agent: flag --pool-size: '12Q' is not a size") !=
                  NULL,
              "got: %s", out);
}

Test(agent_process, unknown_yaml_key_names_file_and_line)
{
    const char *path = kvf_test_write_temp("name: a\npool_sise: 1G\n");
    char flag[128];
    const char *argv[] = {agent_bin(), flag, NULL};
    kvf_test_proc_t proc;

    snprintf(flag, sizeof(flag), "--config=%s", path);
    cr_assert_eq(kvf_test_proc_start(&proc, argv), 0);
    cr_assert_eq(kvf_test_proc_wait_exit(&proc, 10000), 1);
    cr_assert(strstr(kvf_test_proc_log(&proc), ":2: unknown key 'pool_sise'"),
              "log: %s", kvf_test_proc_log(&proc));
    unlink(path);
}

Test(agent_process, a_port_alone_names_file_line_and_the_fix)
{
    const char *path = kvf_test_write_temp("name: a\nlisten: 7500\n");
    char flag[128];
    const char *argv[] = {agent_bin(), flag, NULL};
    kvf_test_proc_t proc;

    snprintf(flag, sizeof(flag), "--config=%s", path);
    cr_assert_eq(kvf_test_proc_start(&proc, argv), 0);
    cr_assert_eq(kvf_test_proc_wait_exit(&proc, 10000), 1);
    cr_assert(strstr(kvf_test_proc_log(&proc),
                     ":2: key 'listen': '7500' is not HOST:PORT (a port "
                     "alone: write 0.0.0.0:PORT") != NULL,
              "log: %s", kvf_test_proc_log(&proc));
    unlink(path);
}

Test(agent_process, serves_health_and_metrics_and_stops_cleanly)
{
    uint16_t http = kvf_test_free_port();
    static char body[65536]; /* /metrics grows with every feature */
    char http_arg[64], sock[128];
    /* port 1 on loopback refuses: the agent keeps retrying the controller */
    const char *argv[] = {
        agent_bin(),   "--controller", "127.0.0.1:1", "--listen",
        "127.0.0.1:0", "--name",       "it-agent",    "--http",
        http_arg,      "--socket",     sock,          "--reconnect-max",
        "50ms",        "--pool-size",  "64M",         NULL};
    kvf_test_proc_t proc;
    int code = -1, i;

    snprintf(http_arg, sizeof(http_arg), "127.0.0.1:%u", http);
    /* a directory that does not exist yet: the agent creates it */
    snprintf(sock, sizeof(sock), "/tmp/kvf-it-%d/sub/agent.sock",
             (int)getpid());
    cr_assert_eq(kvf_test_proc_start(&proc, argv), 0);
    cr_assert(kvf_test_proc_wait_log(&proc, "http listening", 10000), "log: %s",
              kvf_test_proc_log(&proc));
    for (i = 0; (i < 100) && (code != 503); i++) {
        code = kvf_test_http_get(http, "/healthz", body, sizeof(body));
    }
    /* not ready until registered, and it says why */
    cr_assert_eq(code, 503, "%s", body);
    cr_assert(strstr(body, "\"name\":\"it-agent\"") != NULL, "%s", body);
    cr_assert(strstr(body, "\"registered\":false") != NULL, "%s", body);
    cr_assert(kvf_test_proc_wait_log(&proc, "Connection refused", 10000),
              "log: %s", kvf_test_proc_log(&proc));
    for (i = 0; (i < 100) && (strstr(body, "Connection refused") == NULL);
         i++) {
        kvf_test_http_get(http, "/healthz", body, sizeof(body));
    }
    cr_assert(strstr(body, "\"problem\":\"cannot connect: Connection "
                           "refused\"") != NULL,
              "%s", body);
    cr_assert_eq(kvf_test_http_get(http, "/metrics", body, sizeof(body)), 200);
    cr_assert(strstr(body, "kvf_agent_controller_registered 0") != NULL, "%s",
              body);
    cr_assert_eq(kvf_test_http_get(http, "/nope", body, sizeof(body)), 404);
    cr_assert_eq(access(sock, F_OK), 0, "socket created at %s", sock);
    cr_assert_eq(kvf_test_proc_stop(&proc, 10000), 0,
                 "SIGTERM exits 0; log: %s", kvf_test_proc_log(&proc));
    /* --reconnect-max 50ms gives many retries: one warning, at the
     * default level, with the errno text */
    cr_assert_eq(count_of(kvf_test_proc_log(&proc), "Connection refused"), 1,
                 "log: %s", kvf_test_proc_log(&proc));
    cr_assert_neq(access(sock, F_OK), 0, "socket removed on exit");
    *strrchr(sock, '/') = '\0';
    rmdir(sock);
    *strrchr(sock, '/') = '\0';
    rmdir(sock);
}

Test(agent_process, list_devices_says_what_it_found)
{
    const char *argv[] = {agent_bin(), "--list-devices", NULL};
    char out[4096];

    cr_assert_eq(kvf_test_run(argv, out, sizeof(out), 10000), 0);
    /* this machine has no RDMA device; one with devices lists them */
    cr_assert(strstr(out, "no RDMA devices found") != NULL ||
                  strstr(out, "port") != NULL,
              "got: %s", out);
}

Test(agent_process, every_program_has_version)
{
    static const char *const progs[] = {
        "agent/kvf-agent", "controller/kvf-controller", "tools/kvfctl",
        "tools/kvf-bench", "tools/kvf-demo-engine"};
    char bin[4096], out[4096];
    size_t i;

    for (i = 0; i < sizeof(progs) / sizeof(progs[0]); i++) {
        const char *argv[] = {bin, "--version", NULL};

        snprintf(bin, sizeof(bin), "%s", kvf_test_build_path(progs[i]));
        cr_assert_eq(kvf_test_run(argv, out, sizeof(out), 10000), 0, "%s: %s",
                     progs[i], out);
        cr_assert(strstr(out, " (git ") != NULL, "%s: %s", progs[i], out);
        cr_assert(strstr(out, "build: buildtype ") != NULL, "%s: %s", progs[i],
                  out);
    }
}

/* --print-config of @p prog with KVF_CLUSTER_SECRET_FILE=@p secret: its
 * exit status, stdout+stderr in @p out. */
static int print_config(const char *prog, const char *secret, char *out,
                        size_t len)
{
    char cmd[8192];
    FILE *p;
    size_t n;
    int rc;

    snprintf(cmd, sizeof(cmd),
             "KVF_CLUSTER_SECRET_FILE='%s' KVF_POOL_SISE=1G %s --print-config "
             "2>&1",
             secret, kvf_test_build_path(prog));
    p = popen(cmd, "r");
    cr_assert_not_null(p);
    n      = fread(out, 1, len - 1, p);
    out[n] = '\0';
    rc     = pclose(p);
    return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

Test(agent_process, print_config_checks_what_the_daemon_refuses)
{
    static const char *const progs[] = {"agent/kvf-agent",
                                        "controller/kvf-controller"};
    char good[256], shrt[256], out[16384];
    size_t i;

    /* kvf_test_write_temp() returns a static buffer */
    snprintf(good, sizeof(good), "%s",
             kvf_test_write_temp("0123456789abcdef0123456789abcdef\n"));
    snprintf(shrt, sizeof(shrt), "%s", kvf_test_write_temp("short\n"));
    chmod(good, 0600);
    chmod(shrt, 0600);
    for (i = 0; i < 2; i++) {
        cr_assert_eq(print_config(progs[i], good, out, sizeof(out)), 0, "%s",
                     out);
        cr_assert(strstr(out, "cluster_secret_file: (secret)") != NULL, "%s",
                  out);
        /* a misspelled variable is named, with the likely one */
        cr_assert(strstr(out, "KVF_POOL_SISE is not a") != NULL, "%s", out);
        cr_assert_eq(
            print_config(progs[i], "/nonexistent/secret", out, sizeof(out)), 1,
            "%s", out);
        cr_assert(strstr(out, "/nonexistent/secret") != NULL, "%s", out);
        cr_assert_eq(print_config(progs[i], shrt, out, sizeof(out)), 1, "%s",
                     out);
        cr_assert_eq(print_config(progs[i], "/tmp", out, sizeof(out)), 1, "%s",
                     out);
    }
    cr_assert_eq(print_config("agent/kvf-agent", good, out, sizeof(out)), 0);
    cr_assert(strstr(out, "did you mean KVF_POOL_SIZE") != NULL, "%s", out);
    unlink(good);
    unlink(shrt);
}

Test(agent_process, controller_listens_on_ipv6_loopback)
{
    const char *argv[] = {kvf_test_build_path("controller/kvf-controller"),
                          "--listen",
                          "[::1]:0",
                          "--http",
                          "[::1]:0",
                          NULL};
    kvf_test_proc_t proc;
    int fd                = socket(AF_INET6, SOCK_STREAM, 0);
    struct sockaddr_in6 a = {.sin6_family = AF_INET6,
                             .sin6_addr   = IN6ADDR_LOOPBACK_INIT};

    if ((fd < 0) || (bind(fd, (struct sockaddr *)&a, sizeof(a)) != 0)) {
        if (fd >= 0) {
            close(fd);
        }
        cr_skip_test("no IPv6 loopback on this machine");
    }
    close(fd);
    cr_assert_eq(kvf_test_proc_start(&proc, argv), 0);
    cr_assert(kvf_test_proc_wait_log(&proc, "listening on [::1]:", 10000),
              "log: %s", kvf_test_proc_log(&proc));
    cr_assert(kvf_test_proc_wait_log(&proc, "http listening on [::1]:", 10000),
              "log: %s", kvf_test_proc_log(&proc));
    cr_assert(strstr(kvf_test_proc_log(&proc), "authentication off") != NULL,
              "log: %s", kvf_test_proc_log(&proc));
    cr_assert_eq(kvf_test_proc_stop(&proc, 10000), 0, "%s",
                 kvf_test_proc_log(&proc));
}

/* The blocked-signal mask of thread @p tid of @p pid (SigBlk), and its
 * name; false when the thread is gone. */
static bool thread_sigblk(pid_t pid, const char *tid, char *name, size_t len,
                          unsigned long long *blk)
{
    char path[384], line[256];
    bool found = false;
    FILE *f;

    snprintf(path, sizeof(path), "/proc/%d/task/%s/comm", (int)pid, tid);
    f = fopen(path, "r");
    if ((f == NULL) || (fgets(name, (int)len, f) == NULL)) {
        if (f != NULL) {
            fclose(f);
        }
        return false;
    }
    fclose(f);
    name[strcspn(name, "\n")] = '\0';
    snprintf(path, sizeof(path), "/proc/%d/task/%s/status", (int)pid, tid);
    f = fopen(path, "r");
    while ((f != NULL) && (fgets(line, sizeof(line), f) != NULL)) {
        if (sscanf(line, "SigBlk: %llx", blk) == 1) {
            found = true;
        }
    }
    if (f != NULL) {
        fclose(f);
    }
    return found;
}

/* The agent's own threads (here its copier workers) block SIGTERM, so the
 * signal reaches the loop thread's handler, which still stops it cleanly;
 * the loop thread itself does not block it. */
Test(agent_process, worker_threads_leave_signals_to_the_loop)
{
    uint16_t http = kvf_test_free_port();
    char http_arg[64], sock[128], dir[64], name[64];
    const char *argv[] = {
        agent_bin(),   "--controller",   "127.0.0.1:1", "--listen",
        "127.0.0.1:0", "--name",         "it-signals",  "--http",
        http_arg,      "--socket",       sock,          "--pool-size",
        "64M",         "--copy-threads", "3",           NULL};
    const unsigned long long sigterm = 1ull << (SIGTERM - 1);
    unsigned long long blk;
    kvf_test_proc_t proc;
    struct dirent *d;
    int copiers = 0;
    DIR *tasks;

    snprintf(http_arg, sizeof(http_arg), "127.0.0.1:%u", http);
    snprintf(sock, sizeof(sock), "/tmp/kvf-it-sig-%d.sock", (int)getpid());
    cr_assert_eq(kvf_test_proc_start(&proc, argv), 0);
    cr_assert(kvf_test_proc_wait_log(&proc, "http listening", 10000), "log: %s",
              kvf_test_proc_log(&proc));
    snprintf(dir, sizeof(dir), "/proc/%d/task", (int)proc.pid);
    tasks = opendir(dir);
    cr_assert_not_null(tasks);
    while ((d = readdir(tasks)) != NULL) {
        if ((d->d_name[0] == '.') ||
            !thread_sigblk(proc.pid, d->d_name, name, sizeof(name), &blk)) {
            continue;
        }
        if (atoi(d->d_name) == (int)proc.pid) {
            cr_assert_eq(blk & sigterm, 0, "the loop thread blocks SIGTERM");
        } else if (strcmp(name, "kvf-copier") == 0) {
            cr_assert_neq(blk & sigterm, 0, "copier %s takes SIGTERM",
                          d->d_name);
            copiers++;
        }
    }
    closedir(tasks);
    cr_assert_eq(copiers, 3, "%d threads named kvf-copier", copiers);
    cr_assert_eq(kvf_test_proc_stop(&proc, 10000), 0,
                 "SIGTERM exits 0; log: %s", kvf_test_proc_log(&proc));
}
