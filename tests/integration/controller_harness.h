/* SPDX-License-Identifier: Apache-2.0 */
/* Copyright (c) 2026 The kvfabric authors */
/*
 * Integration harness: a real kvf-controller process on ephemeral ports
 * (found through --port-file), and a scripted agent speaking frames.
 * Every wait has a deadline; failures are Criterion assertions.
 */
#ifndef KVF_TESTS_CONTROLLER_HARNESS_H
#define KVF_TESTS_CONTROLLER_HARNESS_H

#include "client/ctlconn.h"

#include <kvfabric/keys.h>

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

typedef struct kvf_th_ctl {
    pid_t pid;
    char addr[128]; /* control HOST:PORT */
    char http[128]; /* HTTP HOST:PORT */
    char dir[128];  /* temp dir: port file, log */
    char log[160];
} kvf_th_ctl_t;

/* Starts kvf-controller with @p args (NULL-terminated, may be NULL). */
void kvf_th_ctl_start(kvf_th_ctl_t *ctl, const char *const *args);

/* SIGTERM, wait (deadline); returns the exit status (0 = clean, no leak). */
int kvf_th_ctl_stop(kvf_th_ctl_t *ctl);

/* Waits (deadline) for the controller to exit on its own; as stop. */
int kvf_th_ctl_wait(kvf_th_ctl_t *ctl);

/* Connects and says HELLO as @p kind. */
kvf_ctlconn_t *kvf_th_connect(const kvf_th_ctl_t *ctl, int kind);

/* Registers @p name; returns the node id (asserts success). */
uint32_t kvf_th_register(kvf_ctlconn_t *conn, const char *name,
                         uint64_t incarnation, bool *recovering_p);

/* As kvf_th_register, as a node of engine instance @p instance. */
uint32_t kvf_th_register_in(kvf_ctlconn_t *conn, const char *name,
                            const char *instance, uint64_t incarnation,
                            bool *recovering_p);

/* REGISTER returning the reply status (no assert). */
int kvf_th_register_status(kvf_ctlconn_t *conn, const char *name,
                           uint64_t incarnation);

/* Packs keys ns 1 / digest (7, base + i). */
void kvf_th_keys(uint8_t *buf, size_t n, uint64_t base);

/* ADMIT/EVICT/INVENTORY; returns the STATUS reply's status. */
int kvf_th_batch(kvf_ctlconn_t *conn, uint16_t type, uint32_t node,
                 uint64_t inc, uint64_t seq, uint64_t base, size_t n,
                 bool last);

/* Ordered LOOKUP of keys base..base+n-1; returns hit_chunks, fills
 * holders[n] (may be NULL) and *recovering_p (may be NULL). */
uint32_t kvf_th_lookup(kvf_ctlconn_t *conn, uint32_t requester, uint64_t base,
                       size_t n, uint32_t *holders, bool *recovering_p);

/* HEARTBEAT; returns the reply frame (caller releases); asserts it is a
 * HEARTBEAT_REPLY unless @p want_status is set (then a STATUS). */
void kvf_th_heartbeat(kvf_ctlconn_t *conn, uint32_t node, uint64_t inc,
                      uint64_t last_seq, kvf_frame_t *frame_p);

/* Node state string of @p node from NODE_INFO ("" when unknown). */
void kvf_th_node_state(kvf_ctlconn_t *conn, uint32_t node, char *state,
                       size_t len);

/* Runs a shell command; captures stdout+stderr; returns its exit code. */
int kvf_th_run(char *out, size_t out_len, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Path of a built executable (KVF_BUILD_ROOT/rel), static buffer. */
const char *kvf_th_build_path(const char *rel);

#endif /* KVF_TESTS_CONTROLLER_HARNESS_H */
