/* SPDX-License-Identifier: Apache-2.0 */
/* Copyright (c) 2026 The kvfabric authors */
/*
 * kvf-bench index: latency of the router index (POST /v1/index/query and
 * /v1/route, docs/integration-routers.md) on a kvf-controller holding
 * --keys keys.
 *
 *   kvf-bench index [--keys N] [--tokens T] [--block B] [--nodes K]
 *                   [--queries Q]
 *
 * Starts its own controller (next to this binary, or $KVF_CONTROLLER_BIN),
 * registers a model, K nodes, and prompts of T tokens until N keys are
 * admitted: each prompt's whole chain on one node, its first half on the
 * next one too. Then Q queries of a random admitted prompt (all T tokens
 * hit) and Q of a fresh prompt (all miss), one at a time over one
 * keep-alive HTTP connection, timed from the first byte sent to the last
 * byte of the reply. One JSON line per phase.
 */
#include "tools/bench/bench.h"

#include "client/ctlconn.h"
#include "common/time.h"

#include <kvfabric/keys.h>

#include <arpa/inet.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

typedef struct kvf_bench_index_opts {
    uint64_t keys;
    uint32_t tokens;
    uint32_t block;
    uint32_t nodes;
    uint32_t queries;
} kvf_bench_index_opts_t;

#define KVF_BENCH_INDEX_MODEL "bench/model"

/* Prompt @p i's tokens (deterministic, distinct per prompt). */
static void kvf_bench_index_prompt(uint64_t i, uint32_t *tokens, uint32_t n)
{
    uint64_t x = i * 0x9e3779b97f4a7c15ull + 1;
    uint32_t k;

    for (k = 0; k < n; k++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        tokens[k] = (uint32_t)(x % 150000);
    }
}

static int kvf_bench_index_connect(uint16_t port)
{
    struct sockaddr_in sin = {.sin_family = AF_INET};
    int fd                 = socket(AF_INET, SOCK_STREAM, 0);
    int one                = 1;

    if (fd < 0) {
        return -1;
    }
    sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    sin.sin_port        = htons(port);
    if (connect(fd, (struct sockaddr *)&sin, sizeof(sin)) != 0) {
        close(fd);
        return -1;
    }
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    return fd;
}

/* One HTTP/1.1 request on keep-alive @p fd; the reply's body into @p out
 * (NUL-terminated). Returns the status code, -1 on a connection error. */
static int kvf_bench_index_http(int fd, const char *method, const char *path,
                                const char *body, char *out, size_t out_len)
{
    char head[256];
    size_t len = strlen(body), used = 0, want = 0;
    int hlen, code = -1;
    char *end = NULL;

    hlen = snprintf(head, sizeof(head),
                    "%s %s HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                    "Content-Type: application/json\r\n"
                    "Content-Length: %zu\r\n\r\n",
                    method, path, len);
    if ((write(fd, head, (size_t)hlen) != hlen) ||
        (write(fd, body, len) != (ssize_t)len)) {
        return -1;
    }
    for (;;) {
        ssize_t n;

        if (used + 1 >= out_len) {
            return -1;
        }
        n = read(fd, out + used, out_len - 1 - used);
        if (n <= 0) {
            return -1;
        }
        used += (size_t)n;
        out[used] = '\0';
        if (end == NULL) {
            const char *cl;

            end = strstr(out, "\r\n\r\n");
            if (end == NULL) {
                continue;
            }
            cl = strcasestr(out, "Content-Length:");
            if ((cl == NULL) || (cl > end)) {
                return -1;
            }
            want = (size_t)(end + 4 - out) + strtoull(cl + 15, NULL, 10);
            sscanf(out, "HTTP/1.%*d %d", &code);
        }
        if (used >= want) {
            memmove(out, end + 4, used - (size_t)(end + 4 - out) + 1);
            return code;
        }
    }
}

/* The query body for @p tokens. */
static size_t kvf_bench_index_body(char *buf, size_t cap,
                                   const uint32_t *tokens, uint32_t n)
{
    size_t used;
    uint32_t k;

    used = (size_t)snprintf(
        buf, cap, "{\"model\":\"" KVF_BENCH_INDEX_MODEL "\",\"token_ids\":[");
    for (k = 0; (k < n) && (used + 16 < cap); k++) {
        used += (size_t)snprintf(buf + used, cap - used, "%s%" PRIu32,
                                 (k > 0) ? "," : "", tokens[k]);
    }
    used += (size_t)snprintf(buf + used, cap - used, "]}");
    return used;
}

static kvf_status_t kvf_bench_index_admit(kvf_ctlconn_t *conn, uint32_t node,
                                          uint64_t *seq, uint8_t *keys,
                                          size_t n)
{
    Kvf__KeyBatch kb;
    kvf_frame_t frame;
    kvf_status_t status;

    kvf__key_batch__init(&kb);
    kb.request_id  = kvf_ctlconn_next_id(conn);
    kb.node_id     = node;
    kb.incarnation = 1;
    kb.seq         = ++*seq;
    kb.keys.data   = keys;
    kb.keys.len    = n * KVF_KEY_WIRE_SIZE;
    status         = kvf_ctlconn_call(conn, KVF_MSG_ADMIT, &kb.base, &frame);
    if (status != KVF_OK) {
        return status;
    }
    status = (frame.type == KVF_MSG_STATUS)
                 ? (kvf_status_t)((Kvf__Status *)frame.msg)->status
                 : KVF_ERR_PROTO;
    kvf_frame_release(&frame, NULL);
    return status;
}

static uint32_t kvf_bench_index_register(kvf_ctlconn_t *conn, uint32_t i)
{
    char name[32], inst[32], addr[] = "127.0.0.1:1";
    uint8_t worker[4] = {1, 2, 3, 4};
    Kvf__Register reg;
    kvf_frame_t frame;
    uint32_t id = 0;

    snprintf(name, sizeof(name), "bench-node-%" PRIu32, i);
    snprintf(inst, sizeof(inst), "bench-inst-%" PRIu32, i);
    kvf__register__init(&reg);
    reg.request_id          = kvf_ctlconn_next_id(conn);
    reg.name                = name;
    reg.role                = KVF__ROLE__ROLE_BOTH;
    reg.worker_address.data = worker;
    reg.worker_address.len  = sizeof(worker);
    reg.control_address     = addr;
    reg.data_address        = addr;
    reg.pool_capacity       = 1ull << 40;
    reg.incarnation         = 1;
    reg.instance_id         = inst;
    reg.tp_world            = 1;
    if ((kvf_ctlconn_call(conn, KVF_MSG_REGISTER, &reg.base, &frame) ==
         KVF_OK) &&
        (frame.type == KVF_MSG_REGISTER_REPLY)) {
        id = ((Kvf__RegisterReply *)frame.msg)->node_id;
    }
    kvf_frame_release(&frame, NULL);
    return id;
}

/*
 * The controller's own view: the upper bound (us) of the
 * kvf_controller_index_request_seconds bucket holding the 99th
 * percentile of the requests counted since @p base (bucket counts of
 * the previous phase, updated here); -1 when /metrics cannot be read.
 */
static double kvf_bench_index_server_p99(int fd, char *reply, size_t cap,
                                         uint64_t *base, size_t nbase)
{
    static const char name[] = "kvf_controller_index_request_seconds_bucket";
    uint64_t cum[32]         = {0}, total;
    double le[32];
    size_t n = 0, i;
    const char *p;

    if (kvf_bench_index_http(fd, "GET", "/metrics", "", reply, cap) != 200) {
        return -1;
    }
    for (p = strstr(reply, name); (p != NULL) && (n < nbase);
         p = strstr(p + 1, name)) {
        const char *q = strstr(p, "le=\"");

        if ((q == NULL) || (strncmp(q + 4, "+Inf", 4) == 0)) {
            break;
        }
        le[n]  = strtod(q + 4, NULL) * 1e6;
        q      = strchr(q, ' ');
        cum[n] = (q != NULL) ? strtoull(q + 1, NULL, 10) : 0;
        n++;
    }
    if (n == 0) {
        return -1;
    }
    total = cum[n - 1] - base[n - 1];
    for (i = 0; i < n; i++) {
        if ((double)(cum[i] - base[i]) >= 0.99 * (double)total) {
            break;
        }
    }
    memcpy(base, cum, n * sizeof(*base));
    return (i < n) ? le[i] : 1e9;
}

/* Q timed queries to @p path; prints one JSON line. */
static int kvf_bench_index_phase(int fd, const char *path, const char *phase,
                                 const kvf_bench_index_opts_t *o,
                                 uint64_t prompts, char *body, size_t cap,
                                 char *reply, size_t reply_cap,
                                 uint32_t *tokens)
{
    static uint64_t base[32];
    double server_p99;
    uint64_t *lat = calloc(o->queries, sizeof(*lat)), sum = 0;
    uint64_t want = (strstr(phase, "_hit") != NULL) ? o->tokens : 0;
    uint32_t q;

    if (lat == NULL) {
        return 1;
    }
    for (q = 0; q < o->queries; q++) {
        uint64_t i = (want > 0) ? (uint64_t)rand() % prompts
                                : prompts + 1 + q; /* never admitted */
        size_t len;
        uint64_t t0;
        int code;
        char needle[64];

        kvf_bench_index_prompt(i, tokens, o->tokens);
        len    = kvf_bench_index_body(body, cap, tokens, o->tokens);
        t0     = kvf_time_now_ns();
        code   = kvf_bench_index_http(fd, "POST", path, body, reply, reply_cap);
        lat[q] = kvf_time_now_ns() - t0;
        sum += lat[q];
        snprintf(needle, sizeof(needle), "\"longest_matched\":%" PRIu64, want);
        if ((code != 200) || (len == 0) ||
            ((strcmp(path, "/v1/index/query") == 0) &&
             (strstr(reply, needle) == NULL))) {
            fprintf(stderr, "kvf-bench index: %s: HTTP %d: %.200s\n", phase,
                    code, reply);
            free(lat);
            return 1;
        }
    }
    server_p99 = kvf_bench_index_server_p99(fd, reply, reply_cap, base, 32);
    printf("{\"bench\":\"index\",\"phase\":\"%s\",\"keys\":%" PRIu64
           ",\"tokens\":%" PRIu32 ",\"block\":%" PRIu32 ",\"nodes\":%" PRIu32
           ",\"queries\":%" PRIu32 ",\"server_p99_le_us\":%g"
           ",\"mean_us\":%.1f,\"p50_us\":%.1f"
           ",\"p99_us\":%.1f,\"max_us\":%.1f}\n",
           phase, o->keys, o->tokens, o->block, o->nodes, o->queries,
           server_p99, (double)sum / o->queries / 1e3,
           kvf_bench_percentile(lat, o->queries, 50) / 1e3,
           kvf_bench_percentile(lat, o->queries, 99) / 1e3,
           kvf_bench_percentile(lat, o->queries, 100) / 1e3);
    fflush(stdout);
    free(lat);
    return 0;
}

static int kvf_bench_index_parse(int argc, char **argv,
                                 kvf_bench_index_opts_t *o)
{
    int i;

    for (i = 1; i < argc; i++) {
        const char *a = argv[i];
        uint64_t v;

        if ((strcmp(a, "--help") == 0) || (strcmp(a, "-h") == 0)) {
            printf("usage: kvf-bench index [--keys N] [--tokens T] "
                   "[--block B] [--nodes K] [--queries Q]\n");
            return -1;
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "kvf-bench index: %s needs a value\n", a);
            return 1;
        }
        v = strtoull(argv[++i], NULL, 10);
        if (strcmp(a, "--keys") == 0) {
            o->keys = v;
        } else if (strcmp(a, "--tokens") == 0) {
            o->tokens = (uint32_t)v;
        } else if (strcmp(a, "--block") == 0) {
            o->block = (uint32_t)v;
        } else if (strcmp(a, "--nodes") == 0) {
            o->nodes = (uint32_t)v;
        } else if (strcmp(a, "--queries") == 0) {
            o->queries = (uint32_t)v;
        } else {
            fprintf(stderr, "kvf-bench index: unknown option %s\n", a);
            return 1;
        }
    }
    if ((o->tokens == 0) || (o->block == 0) || (o->nodes < 2) ||
        (o->queries == 0) || (o->tokens / o->block == 0) ||
        (o->tokens > (1u << 16))) {
        fprintf(stderr, "kvf-bench index: bad options\n");
        return 1;
    }
    return 0;
}

/* Starts the controller; its control and HTTP addresses into @p ctl and
 * @p http. */
static pid_t kvf_bench_index_start(const kvf_bench_index_opts_t *o, char *ctl,
                                   char *http, size_t len)
{
    char bin[4096], port_file[64], log[64], init[32];
    const char *env_bin = getenv("KVF_CONTROLLER_BIN");
    const char *argv[16];
    uint64_t deadline;
    pid_t pid;
    FILE *f;
    int n = 0;

    if (env_bin != NULL) {
        snprintf(bin, sizeof(bin), "%s", env_bin);
    } else {
        kvf_bench_sibling_path("controller/kvf-controller", bin, sizeof(bin));
    }
    snprintf(port_file, sizeof(port_file), "/tmp/kvf-bench-index-%d.port",
             (int)getpid());
    snprintf(log, sizeof(log), "/tmp/kvf-bench-index-%d.log", (int)getpid());
    snprintf(init, sizeof(init), "%" PRIu64, o->keys + o->keys / 2);
    unlink(port_file);
    argv[n++] = bin;
    argv[n++] = "--listen";
    argv[n++] = "127.0.0.1:0";
    argv[n++] = "--http";
    argv[n++] = "127.0.0.1:0";
    argv[n++] = "--port-file";
    argv[n++] = port_file;
    argv[n++] = "--recovery-window";
    argv[n++] = "0";
    argv[n++] = "--initial-keys";
    argv[n++] = init;
    argv[n++] = "--lease";
    argv[n++] = "1h";
    argv[n]   = NULL;
    pid       = kvf_bench_spawn(argv, log);
    if (pid <= 0) {
        return -1;
    }
    deadline = kvf_time_deadline_ns(20 * KVF_NSEC_PER_SEC);
    while ((f = fopen(port_file, "r")) == NULL) {
        if (kvf_time_expired(deadline)) {
            fprintf(stderr, "kvf-bench index: controller did not start (%s)\n",
                    log);
            return -1;
        }
        usleep(10000); /* polls the port file, within the deadline */
    }
    if ((fgets(ctl, (int)len, f) == NULL) ||
        (fgets(http, (int)len, f) == NULL)) {
        fclose(f);
        return -1;
    }
    fclose(f);
    unlink(port_file);
    ctl[strcspn(ctl, "\n")]   = '\0';
    http[strcspn(http, "\n")] = '\0';
    return pid;
}

int kvf_bench_index_main(int argc, char **argv)
{
    kvf_bench_index_opts_t o = {.keys    = 1000000,
                                .tokens  = 4096,
                                .block   = 16,
                                .nodes   = 8,
                                .queries = 2000};
    char ctl[128], http[128], err[256], model[256];
    size_t cap, chunks, k;
    uint32_t *tokens = NULL, *ids = NULL, i;
    kvf_key_t *keys = NULL;
    uint8_t *packed = NULL;
    char *body = NULL, *reply = NULL;
    kvf_ctlconn_t *conn = NULL;
    uint64_t ns, admitted = 0, prompts = 0, seq = 0, t0;
    kvf_namespace_params_t p = {0};
    pid_t pids[1];
    int npids = 0, rc = 1, fd = -1;

    rc = kvf_bench_index_parse(argc, argv, &o);
    if (rc != 0) {
        return (rc < 0) ? 0 : 2;
    }
    rc     = 1;
    cap    = (size_t)o.tokens * 8 + 256;
    chunks = o.tokens / o.block;
    tokens = calloc(o.tokens, sizeof(*tokens));
    ids    = calloc(o.nodes, sizeof(*ids));
    keys   = calloc(chunks, sizeof(*keys));
    packed = calloc(65536, KVF_KEY_WIRE_SIZE);
    body   = malloc(cap);
    reply  = malloc(1 << 20);
    if ((tokens == NULL) || (ids == NULL) || (keys == NULL) ||
        (packed == NULL) || (body == NULL) || (reply == NULL)) {
        goto out;
    }
    pids[0] = kvf_bench_index_start(&o, ctl, http, sizeof(ctl));
    if (pids[0] <= 0) {
        goto out;
    }
    npids = 1;
    fd    = kvf_bench_index_connect((uint16_t)atoi(strrchr(http, ':') + 1));
    if ((fd < 0) ||
        (kvf_ctlconn_create(ctl, KVF__PEER_KIND__PEER_AGENT, "kvf-bench",
                            KVF_PROTOCOL_VERSION, 60000, &conn, err,
                            sizeof(err)) != KVF_OK)) {
        fprintf(stderr, "kvf-bench index: cannot connect: %s\n", err);
        goto out;
    }
    snprintf(model, sizeof(model),
             "{\"model\":\"" KVF_BENCH_INDEX_MODEL "\",\"dtype\":\"bf16\","
             "\"num_layers\":32,\"num_kv_heads\":8,\"head_dim\":128,"
             "\"block_size\":%" PRIu32 "}",
             o.block);
    if (kvf_bench_index_http(fd, "POST", "/v1/index/models", model, reply,
                             1 << 20) != 200) {
        fprintf(stderr, "kvf-bench index: model: %s\n", reply);
        goto out;
    }
    p.field_mask =
        KVF_NAMESPACE_FIELD_MODEL_ID | KVF_NAMESPACE_FIELD_DTYPE |
        KVF_NAMESPACE_FIELD_NUM_LAYERS | KVF_NAMESPACE_FIELD_NUM_KV_HEADS |
        KVF_NAMESPACE_FIELD_HEAD_DIM | KVF_NAMESPACE_FIELD_CHUNK_SIZE;
    p.model_id     = KVF_BENCH_INDEX_MODEL;
    p.dtype        = KVF_DTYPE_BF16;
    p.num_layers   = 32;
    p.num_kv_heads = 8;
    p.head_dim     = 128;
    p.chunk_size   = o.block;
    kvf_namespace_fingerprint(&p, &ns);
    for (i = 0; i < o.nodes; i++) {
        ids[i] = kvf_bench_index_register(conn, i);
        if (ids[i] == 0) {
            fprintf(stderr, "kvf-bench index: register failed\n");
            goto out;
        }
    }
    t0 = kvf_time_now_ns();
    /* whole chains on node i % K, first halves on node (i + 1) % K too;
     * one ADMIT per node and prompt keeps the batches simple */
    while (admitted < o.keys) {
        size_t n;
        uint32_t owner = (uint32_t)(prompts % o.nodes);

        kvf_bench_index_prompt(prompts, tokens, o.tokens);
        kvf_key_chain(ns, tokens, o.tokens, o.block, false, keys, chunks, &n);
        for (k = 0; k < n; k++) {
            kvf_key_pack(&keys[k], packed + k * KVF_KEY_WIRE_SIZE);
        }
        if ((kvf_bench_index_admit(conn, ids[owner], &seq, packed, n) !=
             KVF_OK) ||
            (kvf_bench_index_admit(conn, ids[(owner + 1) % o.nodes], &seq,
                                   packed, n / 2) != KVF_OK)) {
            fprintf(stderr, "kvf-bench index: admit failed\n");
            goto out;
        }
        admitted += n;
        prompts++;
    }
    fprintf(stderr,
            "kvf-bench index: %" PRIu64 " keys of %" PRIu64
            " prompts admitted in %.1f s\n",
            admitted, prompts, (kvf_time_now_ns() - t0) / 1e9);
    srand(1);
    if ((kvf_bench_index_phase(fd, "/v1/index/query", "query_hit", &o, prompts,
                               body, cap, reply, 1 << 20, tokens) != 0) ||
        (kvf_bench_index_phase(fd, "/v1/index/query", "query_miss", &o, prompts,
                               body, cap, reply, 1 << 20, tokens) != 0) ||
        (kvf_bench_index_phase(fd, "/v1/route", "route_hit", &o, prompts, body,
                               cap, reply, 1 << 20, tokens) != 0)) {
        goto out;
    }
    rc = 0;
out:
    kvf_ctlconn_destroy(conn);
    if (fd >= 0) {
        close(fd);
    }
    kvf_bench_stop_all(pids, &npids);
    free(reply);
    free(body);
    free(packed);
    free(keys);
    free(ids);
    free(tokens);
    return rc;
}
