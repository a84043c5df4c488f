/* SPDX-License-Identifier: Apache-2.0 */
/* Copyright (c) 2026 The kvfabric authors */
/*
 * The rogue peer. Raw ucp_am_send_nbx is used (not kvf_ucx_am_send, which
 * only takes the ids this version knows) so that any id can be tried.
 */
#include "tests/security/rogue.h"

#include "common/time.h"
#include "transport/ucx.h"
#include "transport/ucx_int.h"

#include <criterion/criterion.h>
#include <event2/event.h>

#include <sys/stat.h>
#include <poll.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

struct kvf_rogue {
    struct event_base *base;
    kvf_ucx_ctx_t *ctx;
    kvf_ucx_worker_t *worker;
    kvf_ucx_ep_t *ep;
    unsigned received[KVF_UCX_AM_ID_MAX];
    struct kvf_rogue_msg {
        uint16_t id;
        unsigned nth;
        void *data;
        size_t len;
    } * msgs; /* eager payloads received, for kvf_rogue_message */
    unsigned num_msgs;
    bool is_holding;
    kvf_ucx_am_msg_t *held;
    unsigned num_held;
};

#define KVF_ROGUE_HELD_MAX 8192u
#define KVF_ROGUE_MSGS_MAX 4096u
#define KVF_ROGUE_MSG_MAX  (64u << 10)

static kvf_rogue_t *g_kvf_rogue; /* the one rogue, for its handlers */

static kvf_status_t kvf_rogue_on_am(void *arg, const void *header,
                                    size_t header_len,
                                    const kvf_ucx_am_msg_t *msg)
{
    unsigned *count    = arg;
    kvf_rogue_t *rogue = g_kvf_rogue;
    struct kvf_rogue_msg *m;

    if (!msg->is_rndv && (msg->length > 0) &&
        (msg->length <= KVF_ROGUE_MSG_MAX) &&
        (rogue->num_msgs < KVF_ROGUE_MSGS_MAX)) {
        m       = &rogue->msgs[rogue->num_msgs++];
        m->id   = (uint16_t)(count - rogue->received);
        m->nth  = *count;
        m->len  = msg->length;
        m->data = malloc(msg->length);
        cr_assert_not_null(m->data);
        memcpy(m->data, msg->data, msg->length);
    }
    (*count)++;
    if (msg->is_rndv && rogue->is_holding &&
        (rogue->num_held < KVF_ROGUE_HELD_MAX)) {
        rogue->held[rogue->num_held++] = *msg;
        return KVF_INPROGRESS; /* kept, never received */
    }
    return KVF_OK; /* a rendezvous payload is declined */
}

void kvf_rogue_hold_rndv(kvf_rogue_t *rogue)
{
    if (rogue->held == NULL) {
        rogue->held = calloc(KVF_ROGUE_HELD_MAX, sizeof(*rogue->held));
        cr_assert_not_null(rogue->held);
    }
    rogue->is_holding = true;
}

typedef struct kvf_rogue_req {
    bool done;
    ucs_status_t status;
} kvf_rogue_req_t;

kvf_rogue_t *kvf_rogue_create(const char *address)
{
    kvf_ucx_ctx_params_t cp = {.field_mask = KVF_UCX_CTX_FIELD_TLS,
                               .tls        = "tcp"};
    kvf_ucx_ep_params_t ep  = {.field_mask = KVF_UCX_EP_FIELD_SOCKADDR,
                               .sockaddr   = address};
    kvf_rogue_t *rogue      = calloc(1, sizeof(*rogue));
    unsigned id;

    cr_assert_not_null(rogue);
    g_kvf_rogue = rogue;
    rogue->msgs = calloc(KVF_ROGUE_MSGS_MAX, sizeof(*rogue->msgs));
    cr_assert_not_null(rogue->msgs);
    rogue->base = event_base_new();
    cr_assert_not_null(rogue->base);
    cr_assert_eq(kvf_ucx_ctx_create(&cp, &rogue->ctx), KVF_OK);
    cr_assert_eq(
        kvf_ucx_worker_create(rogue->ctx, rogue->base, NULL, &rogue->worker),
        KVF_OK);
    for (id = 1; id < KVF_UCX_AM_ID_MAX; id++) {
        cr_assert_eq(kvf_ucx_am_set_handler(rogue->worker, id, kvf_rogue_on_am,
                                            &rogue->received[id]),
                     KVF_OK);
    }
    cr_assert_eq(kvf_ucx_ep_create(rogue->worker, &ep, &rogue->ep), KVF_OK);
    return rogue;
}

void kvf_rogue_destroy(kvf_rogue_t *rogue)
{
    unsigned i;

    if (rogue == NULL) {
        return;
    }
    for (i = 0; i < rogue->num_held; i++) {
        kvf_ucx_am_msg_release(&rogue->held[i]);
    }
    free(rogue->held);
    for (i = 0; i < rogue->num_msgs; i++) {
        free(rogue->msgs[i].data);
    }
    free(rogue->msgs);
    kvf_ucx_ep_put(rogue->ep);
    kvf_ucx_worker_destroy(rogue->worker);
    kvf_ucx_ctx_destroy(rogue->ctx);
    event_base_free(rogue->base);
    free(rogue);
    g_kvf_rogue = NULL;
}

static void kvf_rogue_on_sent(void *request, ucs_status_t status,
                              void *user_data)
{
    kvf_rogue_req_t *req = user_data;

    req->done   = true;
    req->status = status;
}

kvf_status_t kvf_rogue_send(kvf_rogue_t *rogue, uint16_t id, const void *header,
                            size_t header_len, const void *data, size_t len,
                            bool is_rndv)
{
    uint64_t deadline   = kvf_time_deadline_ns(5 * KVF_NSEC_PER_SEC);
    kvf_rogue_req_t req = {.done = false, .status = UCS_OK};
    ucp_request_param_t param;
    ucs_status_ptr_t sp;

    memset(&param, 0, sizeof(param));
    param.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK |
                         UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_FLAGS;
    param.cb.send   = kvf_rogue_on_sent;
    param.user_data = &req;
    param.flags     = UCP_AM_SEND_FLAG_REPLY |
                  (is_rndv ? UCP_AM_SEND_FLAG_RNDV : UCP_AM_SEND_FLAG_EAGER);
    sp = ucp_am_send_nbx(rogue->ep->ucp_ep, id, header, header_len, data, len,
                         &param);
    if (UCS_PTR_IS_ERR(sp)) {
        return KVF_ERR_TRANSPORT;
    }
    if (sp == NULL) {
        return KVF_OK;
    }
    while (!req.done && !kvf_time_expired(deadline)) {
        ucp_worker_progress(rogue->worker->ucp);
    }
    if (!req.done) {
        ucp_request_cancel(rogue->worker->ucp, sp);
        while (!req.done) {
            ucp_worker_progress(rogue->worker->ucp);
        }
    }
    ucp_request_free(sp);
    return (req.status == UCS_OK) ? KVF_OK : KVF_ERR_TRANSPORT;
}

unsigned kvf_rogue_received(const kvf_rogue_t *rogue, uint16_t id)
{
    return (id < KVF_UCX_AM_ID_MAX) ? rogue->received[id] : 0;
}

const void *kvf_rogue_message(const kvf_rogue_t *rogue, uint16_t id,
                              unsigned nth, size_t *len_p)
{
    unsigned i;

    for (i = 0; i < rogue->num_msgs; i++) {
        if ((rogue->msgs[i].id == id) && (rogue->msgs[i].nth == nth)) {
            *len_p = rogue->msgs[i].len;
            return rogue->msgs[i].data;
        }
    }
    return NULL;
}

void kvf_rogue_progress(kvf_rogue_t *rogue, int ms)
{
    uint64_t deadline = kvf_time_deadline_ns((uint64_t)ms * 1000000ull);

    while (!kvf_time_expired(deadline)) {
        ucp_worker_progress(rogue->worker->ucp);
    }
}

static bool kvf_sec_agent_registered(const kvf_sec_agent_t *agent)
{
    char body[4096];

    return (kvf_test_http_get(agent->http, "/healthz", body, sizeof(body)) ==
            200) &&
           (strstr(body, "\"registered\":true") != NULL);
}

void kvf_sec_agent_start(kvf_sec_agent_t *agent, const char *ctl_addr,
                         const char *name, const char *const *extra)
{
    const char *argv[64];
    char http[64];
    int n = 0, k;

    memset(agent, 0, sizeof(*agent));
    snprintf(agent->name, sizeof(agent->name), "%s", name);
    snprintf(agent->sock, sizeof(agent->sock), "/tmp/kvf-sec-%d-%s.sock",
             (int)getpid(), name);
    snprintf(agent->data, sizeof(agent->data), "127.0.0.1:%u",
             kvf_test_free_port());
    agent->http = kvf_test_free_port();
    snprintf(http, sizeof(http), "127.0.0.1:%u", agent->http);
    argv[n++] = kvf_test_build_path("agent/kvf-agent");
    argv[n++] = "--controller";
    argv[n++] = ctl_addr;
    argv[n++] = "--name";
    argv[n++] = agent->name;
    argv[n++] = "--socket";
    argv[n++] = agent->sock;
    argv[n++] = "--http";
    argv[n++] = http;
    argv[n++] = "--listen";
    argv[n++] = agent->data;
    argv[n++] = "--pool-size";
    argv[n++] = "32M";
    argv[n++] = "--max-chunk";
    argv[n++] = "1M";
    argv[n++] = "--transports";
    argv[n++] = "tcp";
    for (k = 0; (extra != NULL) && (extra[k] != NULL) && (n < 63); k++) {
        argv[n++] = extra[k];
    }
    argv[n] = NULL;
    cr_assert_eq(kvf_test_proc_start(&agent->proc, argv), 0);
    for (k = 0; (k < 2000) && !kvf_sec_agent_registered(agent); k++) {
        poll(NULL, 0, 5);
    }
    cr_assert(kvf_sec_agent_registered(agent), "agent %s did not register: %s",
              name, kvf_test_proc_log(&agent->proc));
}

long long kvf_sec_metric(const kvf_sec_agent_t *agent, const char *series)
{
    static char body[1 << 18];
    char needle[256];
    const char *p;

    if (kvf_test_http_get(agent->http, "/metrics", body, sizeof(body)) != 200) {
        return -1;
    }
    snprintf(needle, sizeof(needle), "\n%s ", series);
    p = strstr(body, needle);
    return (p == NULL) ? -1 : atoll(p + strlen(needle));
}

static void kvf_sec_write_file(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");

    cr_assert_not_null(f, "%s: %s", path, strerror(errno));
    fputs(text, f);
    fclose(f);
}

void kvf_sec_cluster_start(kvf_sec_cluster_t *cluster, const char *name_a,
                           const char *name_b, bool with_secret)
{
    const char *args[] = {"--config", cluster->yaml, NULL};
    char text[256];

    memset(cluster, 0, sizeof(*cluster));
    if (with_secret) {
        snprintf(cluster->dir, sizeof(cluster->dir), "/tmp/kvf-sec-XXXXXX");
        cr_assert_not_null(mkdtemp(cluster->dir));
        snprintf(cluster->secret, sizeof(cluster->secret), "%s/secret",
                 cluster->dir);
        kvf_sec_write_file(cluster->secret,
                           "0c1e5d7f9a2b4c6e8f0a1b3c5d7e9f21\n");
        chmod(cluster->secret, 0600);
        snprintf(cluster->yaml, sizeof(cluster->yaml), "%s/kvf.yaml",
                 cluster->dir);
        snprintf(text, sizeof(text), "cluster_secret_file: %s\n",
                 cluster->secret);
        kvf_sec_write_file(cluster->yaml, text);
    }
    kvf_th_ctl_start(&cluster->ctl, with_secret ? args : NULL);
    kvf_sec_agent_start(&cluster->a, cluster->ctl.addr, name_a,
                        with_secret ? args : NULL);
    kvf_sec_agent_start(&cluster->b, cluster->ctl.addr, name_b,
                        with_secret ? args : NULL);
}

void kvf_sec_cluster_stop(kvf_sec_cluster_t *cluster)
{
    char cmd[128];

    kvf_test_proc_stop(&cluster->b.proc, 10000);
    kvf_test_proc_stop(&cluster->a.proc, 10000);
    kvf_th_ctl_stop(&cluster->ctl);
    if (cluster->dir[0] != '\0') {
        snprintf(cmd, sizeof(cmd), "rm -rf '%s'", cluster->dir);
        if (system(cmd) != 0) {
            fprintf(stderr, "%s failed\n", cmd);
        }
    }
}

kvf_client_t *kvf_sec_connect(const kvf_sec_cluster_t *cluster,
                              const kvf_sec_agent_t *agent)
{
    kvf_client_params_t p = {.field_mask = KVF_CLIENT_PARAM_SOCKET |
                                           KVF_CLIENT_PARAM_TIMEOUT,
                             .socket_path = agent->sock,
                             .timeout_ns  = 20000000000ull};
    kvf_client_t *c       = NULL;

    if (cluster->secret[0] != '\0') {
        p.field_mask |= KVF_CLIENT_PARAM_SECRET;
        p.secret_file = cluster->secret;
    }
    cr_assert_eq(kvf_client_connect(&p, &c), KVF_OK, "%s",
                 kvf_client_last_error(NULL));
    return c;
}

void kvf_sec_store(const kvf_sec_cluster_t *cluster,
                   const kvf_sec_agent_t *agent, const kvf_key_t *keys,
                   uint32_t n, size_t chunk,
                   uint8_t (*fill)(uint32_t k, size_t i))
{
    kvf_client_t *c   = kvf_sec_connect(cluster, agent);
    kvf_slot_t *slots = calloc(n, sizeof(*slots));
    uint64_t *sums    = calloc(n, sizeof(*sums));
    uint32_t k;
    size_t i;

    cr_assert((slots != NULL) && (sums != NULL));
    cr_assert_eq(kvf_client_alloc(c, chunk, n, slots), KVF_OK);
    for (k = 0; k < n; k++) {
        uint8_t *p = (uint8_t *)kvf_client_pool_base(c) + slots[k].offset;

        for (i = 0; i < chunk; i++) {
            p[i] = fill(k, i);
        }
        sums[k] = kvf_chunk_checksum(p, chunk);
    }
    cr_assert_eq(kvf_client_commit(c, keys, slots, sums, n), KVF_OK);
    kvf_client_disconnect(c);
    free(slots);
    free(sums);
}
