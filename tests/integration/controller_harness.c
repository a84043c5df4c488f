/* SPDX-License-Identifier: Apache-2.0 */
/* Copyright (c) 2026 The kvfabric authors */
#include "tests/integration/controller_harness.h"

#include "common/time.h"

#include <criterion/criterion.h>

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define KVF_TH_TIMEOUT_NS (20 * KVF_NSEC_PER_SEC)

const char *kvf_th_build_path(const char *rel)
{
    static char path[1024];
    const char *root = getenv("KVF_BUILD_ROOT");

    cr_assert_not_null(root, "KVF_BUILD_ROOT not set (run via meson test)");
    snprintf(path, sizeof(path), "%s/%s", root, rel);
    return path;
}

static void kvf_th_pause(void)
{
    /* a polling step of a deadline-bounded wait, not a synchronization */
    struct timespec ts = {0, 2 * 1000 * 1000};

    nanosleep(&ts, NULL);
}

void kvf_th_ctl_start(kvf_th_ctl_t *ctl, const char *const *args)
{
    char port_file[200];
    const char *argv[64];
    uint64_t deadline;
    int n = 0, i;
    FILE *f;

    memset(ctl, 0, sizeof(*ctl));
    snprintf(ctl->dir, sizeof(ctl->dir), "/tmp/kvf-itest-XXXXXX");
    cr_assert_not_null(mkdtemp(ctl->dir));
    snprintf(port_file, sizeof(port_file), "%s/ports", ctl->dir);
    snprintf(ctl->log, sizeof(ctl->log), "%s/controller.log", ctl->dir);
    argv[n++] = kvf_th_build_path("controller/kvf-controller");
    argv[n++] = "--listen";
    argv[n++] = "127.0.0.1:0";
    argv[n++] = "--http";
    argv[n++] = "127.0.0.1:0";
    argv[n++] = "--port-file";
    argv[n++] = port_file;
    for (i = 0; (args != NULL) && (args[i] != NULL) && (n < 62); i++) {
        argv[n++] = args[i];
    }
    argv[n]  = NULL;
    ctl->pid = fork();
    cr_assert(ctl->pid >= 0);
    if (ctl->pid == 0) {
        int fd = open(ctl->log, O_WRONLY | O_CREAT | O_APPEND, 0644);

        /* a test that dies takes its controller along */
        prctl(PR_SET_PDEATHSIG, SIGKILL);

        if (fd >= 0) {
            dup2(fd, 2);
            close(fd);
        }
        execv(argv[0], (char *const *)(uintptr_t)argv);
        _exit(127);
    }
    deadline = kvf_time_deadline_ns(KVF_TH_TIMEOUT_NS);
    while ((f = fopen(port_file, "r")) == NULL) {
        int status;

        cr_assert(!kvf_time_expired(deadline), "controller did not start");
        cr_assert_eq(waitpid(ctl->pid, &status, WNOHANG), 0,
                     "controller exited early (see %s)", ctl->log);
        kvf_th_pause();
    }
    cr_assert_not_null(fgets(ctl->addr, sizeof(ctl->addr), f));
    cr_assert_not_null(fgets(ctl->http, sizeof(ctl->http), f));
    fclose(f);
    ctl->addr[strcspn(ctl->addr, "\n")] = '\0';
    ctl->http[strcspn(ctl->http, "\n")] = '\0';
}

int kvf_th_ctl_stop(kvf_th_ctl_t *ctl)
{
    if (ctl->pid <= 0) {
        return 0;
    }
    kill(ctl->pid, SIGTERM);
    return kvf_th_ctl_wait(ctl);
}

int kvf_th_ctl_wait(kvf_th_ctl_t *ctl)
{
    uint64_t deadline = kvf_time_deadline_ns(KVF_TH_TIMEOUT_NS);
    char cmd[400];
    int status = -1;

    if (ctl->pid <= 0) {
        return 0;
    }
    while (waitpid(ctl->pid, &status, WNOHANG) == 0) {
        if (kvf_time_expired(deadline)) {
            kill(ctl->pid, SIGKILL);
            waitpid(ctl->pid, &status, 0);
            status = -1;
            break;
        }
        kvf_th_pause();
    }
    ctl->pid = 0;
    if ((status == 0) || (status == -1)) {
        snprintf(cmd, sizeof(cmd), "rm -rf '%s'", ctl->dir);
    } else {
        /* keep the log: print it for the failure report */
        snprintf(cmd, sizeof(cmd), "cat '%s' >&2", ctl->log);
    }
    if (system(cmd) != 0) {
        fprintf(stderr, "harness: '%s' failed\n", cmd);
    }
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128;
}

kvf_ctlconn_t *kvf_th_connect(const kvf_th_ctl_t *ctl, int kind)
{
    kvf_ctlconn_t *conn = NULL;
    char err[256];

    cr_assert_eq(kvf_ctlconn_create(ctl->addr, kind, "itest",
                                    KVF_PROTOCOL_VERSION, 10000, &conn, err,
                                    sizeof(err)),
                 KVF_OK, "%s", err);
    return conn;
}

static void kvf_th_register_frame(kvf_ctlconn_t *conn, const char *name,
                                  const char *instance, uint64_t incarnation,
                                  kvf_frame_t *frame)
{
    Kvf__Register reg;
    char name_buf[64], ctrl[] = "127.0.0.1:1", data[] = "127.0.0.1:2";
    char inst[64];
    uint8_t worker[4] = {0xde, 0xad, 0xbe, 0xef};

    snprintf(name_buf, sizeof(name_buf), "%s", name);
    snprintf(inst, sizeof(inst), "%s", instance);
    kvf__register__init(&reg);
    reg.request_id          = kvf_ctlconn_next_id(conn);
    reg.name                = name_buf;
    reg.role                = KVF__ROLE__ROLE_BOTH;
    reg.worker_address.data = worker;
    reg.worker_address.len  = sizeof(worker);
    reg.control_address     = ctrl;
    reg.data_address        = data;
    reg.pool_capacity       = 1 << 30;
    reg.incarnation         = incarnation;
    reg.instance_id         = inst;
    reg.tp_world            = 1;
    cr_assert_eq(kvf_ctlconn_call(conn, KVF_MSG_REGISTER, &reg.base, frame),
                 KVF_OK);
    cr_assert_eq(frame->type, KVF_MSG_REGISTER_REPLY);
    cr_assert_eq(((Kvf__RegisterReply *)frame->msg)->request_id,
                 reg.request_id);
}

uint32_t kvf_th_register_in(kvf_ctlconn_t *conn, const char *name,
                            const char *instance, uint64_t incarnation,
                            bool *recovering_p)
{
    Kvf__RegisterReply *rep;
    kvf_frame_t frame;
    uint32_t id;

    kvf_th_register_frame(conn, name, instance, incarnation, &frame);
    rep = (Kvf__RegisterReply *)frame.msg;
    cr_assert_eq(rep->status, KVF_OK, "%s", rep->message);
    cr_assert_neq(rep->node_id, 0);
    cr_assert(rep->resync);
    cr_assert(rep->lease_ms > 0);
    id = rep->node_id;
    if (recovering_p != NULL) {
        *recovering_p = rep->recovering;
    }
    kvf_frame_release(&frame, NULL);
    return id;
}

uint32_t kvf_th_register(kvf_ctlconn_t *conn, const char *name,
                         uint64_t incarnation, bool *recovering_p)
{
    return kvf_th_register_in(conn, name, "inst0", incarnation, recovering_p);
}

int kvf_th_register_status(kvf_ctlconn_t *conn, const char *name,
                           uint64_t incarnation)
{
    kvf_frame_t frame;
    int status;

    kvf_th_register_frame(conn, name, "inst0", incarnation, &frame);
    status = ((Kvf__RegisterReply *)frame.msg)->status;
    kvf_frame_release(&frame, NULL);
    return status;
}

void kvf_th_keys(uint8_t *buf, size_t n, uint64_t base)
{
    size_t i;

    for (i = 0; i < n; i++) {
        kvf_key_t k = {.ns = 1, .hi = 7, .lo = base + i};

        kvf_key_pack(&k, buf + i * KVF_KEY_WIRE_SIZE);
    }
}

int kvf_th_batch(kvf_ctlconn_t *conn, uint16_t type, uint32_t node,
                 uint64_t inc, uint64_t seq, uint64_t base, size_t n, bool last)
{
    uint8_t *keys = malloc(n * KVF_KEY_WIRE_SIZE + 1);
    kvf_frame_t frame;
    uint64_t req_id = kvf_ctlconn_next_id(conn);
    int status;

    kvf_th_keys(keys, n, base);
    if (type == KVF_MSG_INVENTORY) {
        Kvf__Inventory inv;

        kvf__inventory__init(&inv);
        inv.request_id  = req_id;
        inv.node_id     = node;
        inv.incarnation = inc;
        inv.seq         = seq;
        inv.keys.data   = keys;
        inv.keys.len    = n * KVF_KEY_WIRE_SIZE;
        inv.last        = last;
        cr_assert_eq(kvf_ctlconn_call(conn, type, &inv.base, &frame), KVF_OK);
    } else {
        Kvf__KeyBatch kb;

        kvf__key_batch__init(&kb);
        kb.request_id  = req_id;
        kb.node_id     = node;
        kb.incarnation = inc;
        kb.seq         = seq;
        kb.keys.data   = keys;
        kb.keys.len    = n * KVF_KEY_WIRE_SIZE;
        cr_assert_eq(kvf_ctlconn_call(conn, type, &kb.base, &frame), KVF_OK);
    }
    free(keys);
    cr_assert_eq(frame.type, KVF_MSG_STATUS);
    cr_assert_eq(((Kvf__Status *)frame.msg)->request_id, req_id);
    status = ((Kvf__Status *)frame.msg)->status;
    kvf_frame_release(&frame, NULL);
    return status;
}

uint32_t kvf_th_lookup(kvf_ctlconn_t *conn, uint32_t requester, uint64_t base,
                       size_t n, uint32_t *holders, bool *recovering_p)
{
    uint8_t *keys = malloc(n * KVF_KEY_WIRE_SIZE + 1);
    Kvf__LookupReply *rep;
    kvf_frame_t frame;
    Kvf__Lookup lk;
    uint32_t hit;
    size_t i;

    kvf_th_keys(keys, n, base);
    kvf__lookup__init(&lk);
    lk.request_id = kvf_ctlconn_next_id(conn);
    lk.requester  = requester;
    lk.keys.data  = keys;
    lk.keys.len   = n * KVF_KEY_WIRE_SIZE;
    cr_assert_eq(kvf_ctlconn_call(conn, KVF_MSG_LOOKUP, &lk.base, &frame),
                 KVF_OK);
    free(keys);
    cr_assert_eq(frame.type, KVF_MSG_LOOKUP_REPLY);
    rep = (Kvf__LookupReply *)frame.msg;
    cr_assert_eq(rep->request_id, lk.request_id);
    cr_assert_eq(rep->holders.len, 4 * n);
    for (i = 0; (holders != NULL) && (i < n); i++) {
        const uint8_t *p = rep->holders.data + 4 * i;

        holders[i] = (uint32_t)p[0] | ((uint32_t)p[1] << 8) |
                     ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
    }
    if (recovering_p != NULL) {
        *recovering_p = rep->recovering;
    }
    hit = rep->hit_chunks;
    kvf_frame_release(&frame, NULL);
    return hit;
}

void kvf_th_heartbeat(kvf_ctlconn_t *conn, uint32_t node, uint64_t inc,
                      uint64_t last_seq, kvf_frame_t *frame_p)
{
    Kvf__Heartbeat hb;

    kvf__heartbeat__init(&hb);
    hb.request_id    = kvf_ctlconn_next_id(conn);
    hb.node_id       = node;
    hb.incarnation   = inc;
    hb.pool_used     = 1 << 20;
    hb.pool_capacity = 1 << 30;
    hb.last_seq      = last_seq;
    cr_assert_eq(kvf_ctlconn_call(conn, KVF_MSG_HEARTBEAT, &hb.base, frame_p),
                 KVF_OK);
}

void kvf_th_node_state(kvf_ctlconn_t *conn, uint32_t node, char *state,
                       size_t len)
{
    Kvf__NodeInfoRequest req;
    Kvf__NodeInfoReply *rep;
    kvf_frame_t frame;
    uint32_t ids[1] = {node};

    kvf__node_info_request__init(&req);
    req.request_id = kvf_ctlconn_next_id(conn);
    req.n_node_ids = 1;
    req.node_ids   = ids;
    cr_assert_eq(kvf_ctlconn_call(conn, KVF_MSG_NODE_INFO, &req.base, &frame),
                 KVF_OK);
    state[0] = '\0';
    if (frame.type == KVF_MSG_NODE_INFO_REPLY) {
        rep = (Kvf__NodeInfoReply *)frame.msg;
        cr_assert_eq(rep->n_nodes, 1);
        snprintf(state, len, "%s", rep->nodes[0]->state);
    }
    kvf_frame_release(&frame, NULL);
}

int kvf_th_run(char *out, size_t out_len, const char *fmt, ...)
{
    char cmd[2048];
    va_list ap;
    size_t n = 0;
    FILE *p;
    int status;

    va_start(ap, fmt);
    vsnprintf(cmd, sizeof(cmd), fmt, ap);
    va_end(ap);
    p = popen(cmd, "r");
    cr_assert_not_null(p);
    while ((n + 1 < out_len) && !feof(p)) {
        size_t r = fread(out + n, 1, out_len - n - 1, p);

        if (r == 0) {
            break;
        }
        n += r;
    }
    out[n] = '\0';
    status = pclose(p);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128;
}
