/* SPDX-License-Identifier: Apache-2.0 */
/* Copyright (c) 2026 The kvfabric authors */
#include "tests/helpers/proc.h"

#include "common/time.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <stddef.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

/* execv() takes char *const[] for historical reasons and does not write to
 * the strings; tests build argv from literals. */
static void kvf_test_exec(const char *const argv[])
{
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wcast-qual"
    execv(argv[0], (char *const *)argv);
#pragma GCC diagnostic pop
}

const char *kvf_test_build_path(const char *rel)
{
    static char path[4096];
    const char *root = getenv("KVF_BUILD_ROOT");

    snprintf(path, sizeof(path), "%s/%s", (root != NULL) ? root : ".", rel);
    return path;
}

int kvf_test_proc_start(kvf_test_proc_t *proc, const char *const argv[])
{
    int fd, i;

    memset(proc, 0, sizeof(*proc));
    for (i = 1; (argv[i] != NULL) && (argv[i + 1] != NULL); i++) {
        if (strcmp(argv[i], "--socket") == 0) {
            snprintf(proc->socket_path, sizeof(proc->socket_path), "%s",
                     argv[i + 1]);
        }
    }
    snprintf(proc->log_path, sizeof(proc->log_path),
             "/tmp/kvf-test-proc-XXXXXX");
    fd = mkstemp(proc->log_path);
    if (fd < 0) {
        return -1;
    }
    proc->pid = fork();
    if (proc->pid < 0) {
        close(fd);
        return -1;
    }
    if (proc->pid == 0) {
        /* a test that dies (timeout, crash) takes its processes along */
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        dup2(fd, STDOUT_FILENO);
        dup2(fd, STDERR_FILENO);
        /* keep none of the test runner's pipes open in the child */
        close_range(3, ~0u, 0);
        kvf_test_exec(argv);
        fprintf(stderr, "exec %s: %s\n", argv[0], strerror(errno));
        _exit(127);
    }
    close(fd);
    return 0;
}

static void kvf_test_proc_reap(kvf_test_proc_t *proc, int status)
{
    proc->reaped = true;
    proc->exit_status =
        WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    unlink(proc->log_path);
    if (proc->socket_path[0] != '\0') {
        unlink(proc->socket_path); /* gone already after a clean exit */
    }
}

bool kvf_test_proc_alive(kvf_test_proc_t *proc)
{
    int status;

    if (proc->reaped || (proc->pid <= 0)) {
        return false;
    }
    if (waitpid(proc->pid, &status, WNOHANG) == proc->pid) {
        kvf_test_proc_log(proc); /* keep the log text before unlinking */
        kvf_test_proc_reap(proc, status);
        return false;
    }
    return true;
}

int kvf_test_proc_stop(kvf_test_proc_t *proc, int grace_ms)
{
    uint64_t deadline;
    int status;

    if (proc->reaped || (proc->pid <= 0)) {
        return proc->exit_status;
    }
    kill(proc->pid, SIGTERM);
    deadline = kvf_time_deadline_ns((uint64_t)grace_ms * KVF_NSEC_PER_MSEC);
    while (!kvf_time_expired(deadline)) {
        if (waitpid(proc->pid, &status, WNOHANG) == proc->pid) {
            kvf_test_proc_log(proc);
            kvf_test_proc_reap(proc, status);
            return proc->exit_status;
        }
        poll(NULL, 0, 5);
    }
    kill(proc->pid, SIGKILL);
    waitpid(proc->pid, &status, 0);
    kvf_test_proc_log(proc);
    kvf_test_proc_reap(proc, status);
    return proc->exit_status;
}

int kvf_test_proc_wait_exit(kvf_test_proc_t *proc, int timeout_ms)
{
    uint64_t deadline =
        kvf_time_deadline_ns((uint64_t)timeout_ms * KVF_NSEC_PER_MSEC);

    while (kvf_test_proc_alive(proc)) {
        if (kvf_time_expired(deadline)) {
            return -1;
        }
        poll(NULL, 0, 5);
    }
    return proc->exit_status;
}

void kvf_test_proc_kill(kvf_test_proc_t *proc)
{
    int status;

    if (proc->reaped || (proc->pid <= 0)) {
        return;
    }
    kill(proc->pid, SIGKILL);
    waitpid(proc->pid, &status, 0);
    kvf_test_proc_log(proc);
    kvf_test_proc_reap(proc, status);
}

const char *kvf_test_proc_log(kvf_test_proc_t *proc)
{
    static char buf[65536];
    ssize_t n;
    off_t size;
    int fd;

    if (proc->reaped) {
        return buf; /* the text read just before the child was reaped */
    }
    buf[0] = '\0';
    fd     = open(proc->log_path, O_RDONLY);
    if (fd < 0) {
        return buf;
    }
    size = lseek(fd, 0, SEEK_END);
    lseek(fd,
          (size > (off_t)sizeof(buf) - 1) ? size - (off_t)sizeof(buf) + 1 : 0,
          SEEK_SET);
    n                    = read(fd, buf, sizeof(buf) - 1);
    buf[(n > 0) ? n : 0] = '\0';
    close(fd);
    return buf;
}

bool kvf_test_proc_wait_log(kvf_test_proc_t *proc, const char *needle,
                            int timeout_ms)
{
    uint64_t deadline =
        kvf_time_deadline_ns((uint64_t)timeout_ms * KVF_NSEC_PER_MSEC);

    for (;;) {
        if (strstr(kvf_test_proc_log(proc), needle) != NULL) {
            return true;
        }
        if (kvf_time_expired(deadline) || !kvf_test_proc_alive(proc)) {
            return strstr(kvf_test_proc_log(proc), needle) != NULL;
        }
        poll(NULL, 0, 5);
    }
}

/* Binds 127.0.0.1:@p port (0: any); the port bound, 0 when it failed. */
static uint16_t kvf_test_bind_port(uint16_t port)
{
    struct sockaddr_in sin;
    socklen_t len = sizeof(sin);
    uint16_t got  = 0;
    int fd        = socket(AF_INET, SOCK_STREAM, 0);

    if (fd < 0) {
        return 0;
    }
    memset(&sin, 0, sizeof(sin));
    sin.sin_family      = AF_INET;
    sin.sin_port        = htons(port);
    sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if ((bind(fd, (struct sockaddr *)&sin, sizeof(sin)) == 0) &&
        (getsockname(fd, (struct sockaddr *)&sin, &len) == 0)) {
        got = ntohs(sin.sin_port);
    }
    close(fd);
    return got;
}

/* A port below the kernel's ephemeral range (32768 and up by default), so
 * a daemon listening on port 0 meanwhile (UCX does) or an outgoing
 * connection never takes the one handed out here before its user binds
 * it; the kernel's pick only when none of 64 tries is free. */
uint16_t kvf_test_free_port(void)
{
    static uint32_t seq;
    uint32_t x = (uint32_t)getpid() * 2654435761u ^
                 (uint32_t)kvf_time_now_ns() ^ (++seq * 40503u);
    uint16_t port;
    int i;

    for (i = 0; i < 64; i++) {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        port = kvf_test_bind_port((uint16_t)(20000u + x % 12000u));
        if (port != 0) {
            return port;
        }
    }
    return kvf_test_bind_port(0);
}

int kvf_test_abstract_socket(const char *prefix, const char *name,
                             bool do_listen)
{
    size_t plen = strlen(prefix), len = strcspn(name, "\n \t");
    struct sockaddr_un sa;
    socklen_t salen;
    int fd;

    memset(&sa, 0, sizeof(sa));
    sa.sun_family = AF_UNIX;
    if (plen + len >= sizeof(sa.sun_path) - 1) {
        errno = ENAMETOOLONG;
        return -1;
    }
    memcpy(sa.sun_path + 1, prefix, plen); /* sun_path[0] = 0: abstract */
    memcpy(sa.sun_path + 1 + plen, name, len);
    salen =
        (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + plen + len);
    fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        return -1;
    }
    if ((do_listen && ((bind(fd, (struct sockaddr *)&sa, salen) != 0) ||
                       (listen(fd, 8) != 0))) ||
        (!do_listen && (connect(fd, (struct sockaddr *)&sa, salen) != 0))) {
        close(fd);
        return -1;
    }
    return fd;
}

int kvf_test_run(const char *const argv[], char *out, size_t out_len,
                 int timeout_ms)
{
    uint64_t deadline;
    size_t used = 0;
    int pipefd[2], status;
    struct pollfd pfd;
    ssize_t n;
    pid_t pid;

    if ((out_len == 0) || (pipe(pipefd) != 0)) {
        return -1;
    }
    pid = fork();
    if (pid < 0) {
        close(pipefd[0]);
        close(pipefd[1]);
        return -1;
    }
    if (pid == 0) {
        dup2(pipefd[1], STDOUT_FILENO);
        close(pipefd[0]);
        close(pipefd[1]);
        kvf_test_exec(argv);
        _exit(127);
    }
    close(pipefd[1]);
    deadline   = kvf_time_deadline_ns((uint64_t)timeout_ms * KVF_NSEC_PER_MSEC);
    pfd.fd     = pipefd[0];
    pfd.events = POLLIN;
    for (;;) {
        if (kvf_time_expired(deadline)) {
            kill(pid, SIGKILL);
            waitpid(pid, &status, 0);
            close(pipefd[0]);
            return -1;
        }
        if (poll(&pfd, 1, kvf_time_left_ms(deadline)) <= 0) {
            continue;
        }
        n = read(pipefd[0], out + used, out_len - 1 - used);
        if (n <= 0) {
            break;
        }
        used += (size_t)n;
        if (used == out_len - 1) {
            char sink[4096];
            while (read(pipefd[0], sink, sizeof(sink)) > 0) {
            }
            break;
        }
    }
    out[used] = '\0';
    close(pipefd[0]);
    waitpid(pid, &status, 0);
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

int kvf_test_http_get(uint16_t port, const char *path, char *out,
                      size_t out_len)
{
    return kvf_test_http_get_auth(port, path, NULL, out, out_len);
}

int kvf_test_http_get_auth(uint16_t port, const char *path, const char *token,
                           char *out, size_t out_len)
{
    return kvf_test_http_request(port, "GET", path, token, NULL, out, out_len);
}

int kvf_test_http_request(uint16_t port, const char *method, const char *path,
                          const char *token, const char *body, char *out,
                          size_t out_len)
{
    struct sockaddr_in sin;
    char req[768];
    size_t body_len = (body != NULL) ? strlen(body) : 0;
    size_t used     = 0;
    ssize_t n;
    int fd, code = -1;
    const char *reply;

    fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) {
        return -1;
    }
    memset(&sin, 0, sizeof(sin));
    sin.sin_family      = AF_INET;
    sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    sin.sin_port        = htons(port);
    if (connect(fd, (struct sockaddr *)&sin, sizeof(sin)) != 0) {
        close(fd);
        return -1;
    }
    snprintf(req, sizeof(req),
             "%s %s HTTP/1.0\r\nHost: 127.0.0.1\r\n%s%s%s"
             "Content-Type: application/json\r\nContent-Length: %zu\r\n\r\n",
             method, path, (token != NULL) ? "Authorization: Bearer " : "",
             (token != NULL) ? token : "", (token != NULL) ? "\r\n" : "",
             body_len);
    if ((write(fd, req, strlen(req)) != (ssize_t)strlen(req)) ||
        ((body_len > 0) && (write(fd, body, body_len) != (ssize_t)body_len))) {
        close(fd);
        return -1;
    }
    while ((used < out_len - 1) &&
           ((n = read(fd, out + used, out_len - 1 - used)) > 0)) {
        used += (size_t)n;
    }
    out[used] = '\0';
    close(fd);
    if (sscanf(out, "HTTP/1.%*d %d", &code) != 1) {
        return -1;
    }
    reply = strstr(out, "\r\n\r\n");
    if (reply != NULL) {
        memmove(out, reply + 4, strlen(reply + 4) + 1);
    }
    return code;
}

int kvf_test_agent_pool_flip(const kvf_test_proc_t *agent, uint64_t offset)
{
    unsigned long long start = 0, lo, hi, off;
    char path[64], line[512];
    uint8_t byte;
    FILE *maps;
    int fd;

    snprintf(path, sizeof(path), "/proc/%d/maps", (int)agent->pid);
    maps = fopen(path, "r");
    if (maps == NULL) {
        return -1;
    }
    /* the pool memfd's mapping at file offset 0 (the agent maps it once,
     * read-write) */
    while (fgets(line, sizeof(line), maps) != NULL) {
        if ((strstr(line, "memfd:kvf-pool") != NULL) &&
            (strstr(line, " rw-s ") != NULL) &&
            (sscanf(line, "%llx-%llx %*s %llx", &lo, &hi, &off) == 3) &&
            (off == 0) && (offset < hi - lo)) {
            start = lo;
            break;
        }
    }
    fclose(maps);
    if (start == 0) {
        return -1;
    }
    snprintf(path, sizeof(path), "/proc/%d/mem", (int)agent->pid);
    fd = open(path, O_RDWR);
    if (fd < 0) {
        return -1;
    }
    if (pread(fd, &byte, 1, (off_t)(start + offset)) != 1) {
        close(fd);
        return -1;
    }
    byte ^= 0xff;
    if (pwrite(fd, &byte, 1, (off_t)(start + offset)) != 1) {
        close(fd);
        return -1;
    }
    close(fd);
    return 0;
}
