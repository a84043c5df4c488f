/* SPDX-License-Identifier: Apache-2.0 */
/* Copyright (c) 2026 The kvfabric authors */
/*
 * Child processes for integration tests: start a built binary with its
 * output in a log file, wait for a condition with a deadline, stop it with
 * SIGTERM (and SIGKILL after a grace period), and read its exit status.
 */
#ifndef KVF_TESTS_PROC_H
#define KVF_TESTS_PROC_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

typedef struct kvf_test_proc {
    pid_t pid;
    char log_path[256];
    char socket_path[256]; /* its --socket, removed when reaped: a killed
                              agent leaves no /tmp/kvf-* socket behind */
    int exit_status;       /* valid once reaped: exit code, or 128 + signal */
    bool reaped;
} kvf_test_proc_t;

/* Path of a built binary under KVF_BUILD_ROOT ("agent/kvf-agent"). */
const char *kvf_test_build_path(const char *rel);

/* Starts argv[0] (a path) with argv; stdout and stderr go to a log file.
 * Returns 0, or -1 when the program cannot be started. */
int kvf_test_proc_start(kvf_test_proc_t *proc, const char *const argv[]);

/* SIGTERM, wait up to @p grace_ms, then SIGKILL; reaps the child.
 * Returns its exit status (128 + signal when killed). */
int kvf_test_proc_stop(kvf_test_proc_t *proc, int grace_ms);

/* Waits up to @p timeout_ms for the child to exit by itself; returns its
 * exit status, or -1 if it is still running (it is left running). */
int kvf_test_proc_wait_exit(kvf_test_proc_t *proc, int timeout_ms);

/* SIGKILL at once and reap (kill -9 of a node). */
void kvf_test_proc_kill(kvf_test_proc_t *proc);

/* true while the child has not exited (reaps it when it has). */
bool kvf_test_proc_alive(kvf_test_proc_t *proc);

/* Waits up to @p timeout_ms for the child's log to contain @p needle. */
bool kvf_test_proc_wait_log(kvf_test_proc_t *proc, const char *needle,
                            int timeout_ms);

/* The child's log (static buffer, last 64 KiB). */
const char *kvf_test_proc_log(kvf_test_proc_t *proc);

/* A free TCP port on 127.0.0.1 (bind to 0, read it, close). */
uint16_t kvf_test_free_port(void);

/* A SOCK_SEQPACKET socket on the abstract Unix name "@PREFIX NAME", with
 * NAME the first @p name characters up to a blank (an agent's same-host
 * socket is "@kvf-local/" + its data address): connected to it, or, with
 * @p do_listen, bound and listening there. -1 on failure (errno set). */
int kvf_test_abstract_socket(const char *prefix, const char *name,
                             bool do_listen);

/* Runs argv to completion (up to @p timeout_ms), capturing stdout into
 * @p out (NUL-terminated, truncated to @p out_len). Returns the exit status,
 * or -1 when it could not run or timed out. */
int kvf_test_run(const char *const argv[], char *out, size_t out_len,
                 int timeout_ms);

/* HTTP GET of http://127.0.0.1:PORT/PATH into @p out; returns the status
 * code, or -1 on a connection error. */
int kvf_test_http_get(uint16_t port, const char *path, char *out,
                      size_t out_len);

/* As kvf_test_http_get, with "Authorization: Bearer @p token" when
 * @p token is not NULL. */
int kvf_test_http_get_auth(uint16_t port, const char *path, const char *token,
                           char *out, size_t out_len);

/* An HTTP/1.0 request of @p method with @p body (may be NULL) as
 * application/json and the bearer @p token (may be NULL); as
 * kvf_test_http_get. */
int kvf_test_http_request(uint16_t port, const char *method, const char *path,
                          const char *token, const char *body, char *out,
                          size_t out_len);

/* Flips (xor 0xff) the byte at @p offset of the pool of the kvf-agent
 * @p agent, in the agent's own memory (its writable mapping of the pool
 * memfd, through /proc/PID/mem: the test started it, so it may): what a
 * bug in the agent, bad memory or a process that can ptrace it could do;
 * engines cannot (docs/security.md). 0, or -1 with errno. */
int kvf_test_agent_pool_flip(const kvf_test_proc_t *agent, uint64_t offset);

#endif /* KVF_TESTS_PROC_H */
