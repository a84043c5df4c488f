/* SPDX-License-Identifier: Apache-2.0 */
/* Copyright (c) 2026 The kvfabric authors */
/*
 * kvfctl: admin CLI of kvf-controller over the frame protocol.
 *
 *   kvfctl --controller HOST:PORT [--json] [--timeout MS]
 *          nodes|stats|lookup KEY...|tree|pin KEY...|unpin KEY...|
 *          replicate NODE KEY...|drain NODE|undrain NODE|clear [NODE]
 *
 * Exit 0 on success, 1 with one line "kvfctl: reason" on an error, 2 on a
 * usage error; under --json the error is also one JSON object on stdout
 * ({"error":{"code":...,"message":...}}). The cluster secret comes from
 * the file named by KVF_CLUSTER_SECRET_FILE, never from the command line.
 */
#include "client/ctlconn.h"
#include "common/config.h"
#include "common/etcd.h"
#include "common/version.h"

#include <kvfabric/keys.h>

#include <arpa/inet.h>
#include <inttypes.h>
#include <netdb.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define KVF_CTL_MAX_NODES 1024

typedef struct kvf_ctl_opts {
    const char *controller;
    const char *etcd;        /* the controller is the leader named there */
    const char *etcd_prefix; /* "/kvfabric" */
    bool is_json;
    bool is_any_order;
    bool is_soft;
    bool is_wait;
    int timeout_ms;
} kvf_ctl_opts_t;

/* --json: errors are also one JSON object on stdout (scripts read one
 * stream); set before anything can fail */
static bool kvf_ctl_json_errors;

/* Node ids to names, from one NODE_INFO (holders are shown by name). */
typedef struct kvf_ctl_names {
    uint32_t ids[KVF_CTL_MAX_NODES];
    char names[KVF_CTL_MAX_NODES][64];
    bool is_up[KVF_CTL_MAX_NODES]; /* alive or draining */
    size_t num;
} kvf_ctl_names_t;

static void kvf_ctl_json_str(const char *s);

/* Reports an error: "kvfctl: MESSAGE" on stderr, and under --json
 * {"error":{"code":CODE,"message":MESSAGE}} on stdout. Returns @p rc. */
static int kvf_ctl_fail(int rc, const char *code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static int kvf_ctl_fail(int rc, const char *code, const char *fmt, ...)
{
    char msg[1024];
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    fprintf(stderr, "kvfctl: %s\n", msg);
    if (kvf_ctl_json_errors) {
        printf("{\"error\":{\"code\":");
        kvf_ctl_json_str(code);
        printf(",\"message\":");
        kvf_ctl_json_str(msg);
        printf("}}\n");
    }
    return rc;
}

/* "512 B", "1.5 KiB", "16.0 GiB" into @p buf. */
static const char *kvf_ctl_bytes(uint64_t v, char *buf, size_t len)
{
    static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    double d                         = (double)v;
    unsigned u                       = 0;

    while ((d >= 1024.0) && (u + 1 < sizeof(units) / sizeof(units[0]))) {
        d /= 1024.0;
        u++;
    }
    if (u == 0) {
        snprintf(buf, len, "%" PRIu64 " B", v);
    } else {
        snprintf(buf, len, "%.1f %s", d, units[u]);
    }
    return buf;
}

/* "1.0 GiB/16.0 GiB 6%" ("-" without a capacity). */
static const char *kvf_ctl_usage_str(uint64_t used, uint64_t cap, char *buf,
                                     size_t len)
{
    char u[24], c[24];

    if (cap == 0) {
        snprintf(buf, len, "-");
    } else {
        snprintf(buf, len, "%s/%s %u%%", kvf_ctl_bytes(used, u, sizeof(u)),
                 kvf_ctl_bytes(cap, c, sizeof(c)),
                 (unsigned)((used * 100 + cap / 2) / cap));
    }
    return buf;
}

static void kvf_ctl_usage(FILE *out)
{
    fprintf(
        out,
        "usage: kvfctl [--controller HOST:PORT[,...] | --etcd URL[,...] "
        "[--etcd-prefix P]]\n"
        "              [--json] [--timeout MS] COMMAND [ARGS]\n"
        "commands:\n"
        "  nodes            list nodes\n"
        "  stats            controller counters\n"
        "  status           HA on etcd: leader, standbys (warm or not),\n"
        "                   term, etcd endpoints' health\n"
        "  lookup KEY...    ordered-chain lookup (KEY as NS:DIGEST hex);\n"
        "                   --any-order: each key on its own\n"
        "  tree             per-node summary of the registry\n"
        "  pin KEY...       ask every agent never to evict KEYs;\n"
        "                   --soft: evict them last rather than never\n"
        "  unpin KEY...     undo pin\n"
        "  replicate NODE KEY...\n"
        "                   ask NODE to copy KEYs from their holders now\n"
        "  replicate --wait NODE KEY...\n"
        "                   ... and wait (--timeout) until NODE holds them\n"
        "  drain NODE       ask a node to drain (NODE: id or name); kept\n"
        "                   across controller restarts\n"
        "  undrain NODE     undo drain\n"
        "  clear [NODE]     ask one node (or all) to drop their cache\n"
        "the controller address also comes from KVF_CONTROLLER "
        "(default 127.0.0.1:7400), or --etcd from KVF_ETCD (with HA on etcd:\n"
        "the leader published under KVF_ETCD_PREFIX, default /kvfabric);\n"
        "a cluster secret from the file named\n"
        "by KVF_CLUSTER_SECRET_FILE (environment only); TLS to the\n"
        "controller with KVF_TLS_CA (its CA file) and optionally\n"
        "KVF_TLS_SERVER_NAME (the name its certificate must carry)\n");
}

static void kvf_ctl_json_str(const char *s)
{
    putchar('"');
    for (; *s != '\0'; s++) {
        unsigned char c = (unsigned char)*s;

        if ((c == '"') || (c == '\\')) {
            printf("\\%c", c);
        } else if (c < 0x20) {
            printf("\\u%04x", c);
        } else {
            putchar(c);
        }
    }
    putchar('"');
}

/* Checks a reply: the expected type, or a STATUS carrying an error. */
static int kvf_ctl_check(const kvf_frame_t *frame, uint16_t want)
{
    if (frame->type == KVF_MSG_STATUS) {
        const Kvf__Status *st = (const Kvf__Status *)frame->msg;

        if (st->status != KVF_OK) {
            return kvf_ctl_fail(1, kvf_status_name((kvf_status_t)st->status),
                                "%s",
                                (st->message[0] != '\0')
                                    ? st->message
                                    : kvf_strerror((kvf_status_t)st->status));
        }
        if (want == KVF_MSG_STATUS) {
            return 0;
        }
    }
    if (frame->type != want) {
        return kvf_ctl_fail(1, "KVF_ERR_PROTO", "unexpected %s reply",
                            kvf_msg_type_name(frame->type));
    }
    return 0;
}

static int kvf_ctl_call(kvf_ctlconn_t *conn, uint16_t type,
                        ProtobufCMessage *msg, uint16_t want,
                        kvf_frame_t *frame)
{
    kvf_status_t status = kvf_ctlconn_call(conn, type, msg, frame);

    if (status != KVF_OK) {
        return kvf_ctl_fail(1, kvf_status_name(status), "%s request failed: %s",
                            kvf_msg_type_name(type), kvf_strerror(status));
    }
    if (kvf_ctl_check(frame, want) != 0) {
        kvf_frame_release(frame, NULL);
        return 1;
    }
    return 0;
}

static int kvf_ctl_node_info(kvf_ctlconn_t *conn, kvf_frame_t *frame)
{
    Kvf__NodeInfoRequest req;

    kvf__node_info_request__init(&req);
    req.request_id = kvf_ctlconn_next_id(conn);
    return kvf_ctl_call(conn, KVF_MSG_NODE_INFO, &req.base,
                        KVF_MSG_NODE_INFO_REPLY, frame);
}

static int kvf_ctl_nodes(kvf_ctlconn_t *conn, const kvf_ctl_opts_t *opts)
{
    const Kvf__NodeInfoReply *rep;
    char pool[64], pd[64], disk[64];
    kvf_frame_t frame;
    size_t i;

    if (kvf_ctl_node_info(conn, &frame) != 0) {
        return 1;
    }
    rep = (const Kvf__NodeInfoReply *)frame.msg;
    if (opts->is_json) {
        printf("{\"nodes\":[");
    } else {
        printf("%-5s %-20s %-9s %-8s %8s %8s %-26s %-26s %-26s %-8s %8s %-21s "
               "%s\n",
               "ID", "NAME", "STATE", "ROLE", "KEYS", "ON_DISK", "POOL", "DISK",
               "PD", "INCARN", "HB_AGO", "DATA_ADDRESS", "TRANSPORTS");
    }
    for (i = 0; i < rep->n_nodes; i++) {
        const Kvf__NodeDesc *d = rep->nodes[i];

        if (!opts->is_json) {
            /* the incarnation is a start time in ns: its low 32 bits tell
             * restarts apart (--json has all of it) */
            /* KEYS: held in either tier; ON_DISK: of those, on the
             * node's disk tier only */
            printf(
                "%-5" PRIu32 " %-20s %-9s %-8s %8" PRIu64 " %8" PRIu64
                " %-26s %-26s %-26s %08" PRIx64 " %6" PRIu64 "ms %-21s %s\n",
                d->node_id, d->name, d->state, kvf_msg_role_name(d->role),
                d->keys, d->keys_disk,
                kvf_ctl_usage_str(d->pool_used, d->pool_capacity, pool,
                                  sizeof(pool)),
                kvf_ctl_usage_str(d->disk_used, d->disk_capacity, disk,
                                  sizeof(disk)),
                kvf_ctl_usage_str(d->pd_used, d->pd_capacity, pd, sizeof(pd)),
                d->incarnation & 0xffffffffu, d->last_heartbeat_ms_ago,
                (d->data_address[0] != '\0') ? d->data_address : "-",
                /* UCX transports of its peer connections: none yet, or a
                 * controller that predates them */
                (d->transports[0] != '\0') ? d->transports : "-");
            continue;
        }
        printf("%s{\"id\":%" PRIu32 ",\"name\":", (i > 0) ? "," : "",
               d->node_id);
        kvf_ctl_json_str(d->name);
        printf(",\"state\":\"%s\",\"role\":\"%s\",\"keys\":%" PRIu64
               ",\"pool_used\":%" PRIu64 ",\"pool_capacity\":%" PRIu64
               ",\"pd_used\":%" PRIu64 ",\"pd_capacity\":%" PRIu64
               ",\"incarnation\":%" PRIu64 ",\"last_heartbeat_ms_ago\":%" PRIu64
               ",\"keys_disk\":%" PRIu64 ",\"disk_used\":%" PRIu64
               ",\"disk_capacity\":%" PRIu64 ",\"disk_chunks\":%" PRIu64
               ",\"control_address\":",
               d->state, kvf_msg_role_name(d->role), d->keys, d->pool_used,
               d->pool_capacity, d->pd_used, d->pd_capacity, d->incarnation,
               d->last_heartbeat_ms_ago, d->keys_disk, d->disk_used,
               d->disk_capacity, d->disk_chunks);
        kvf_ctl_json_str(d->control_address);
        printf(",\"data_address\":");
        kvf_ctl_json_str(d->data_address);
        printf(",\"instance_id\":");
        kvf_ctl_json_str(d->instance_id);
        printf(",\"tp_rank\":%" PRIu32 ",\"tp_world\":%" PRIu32, d->tp_rank,
               d->tp_world);
        printf(",\"transports\":");
        kvf_ctl_json_str(d->transports);
        printf("}");
    }
    if (opts->is_json) {
        printf("]}\n");
    }
    kvf_frame_release(&frame, NULL);
    return 0;
}

/* Loads the node table's ids and names. */
static int kvf_ctl_names_load(kvf_ctlconn_t *conn, kvf_ctl_names_t *names)
{
    const Kvf__NodeInfoReply *rep;
    kvf_frame_t frame;
    size_t i;

    names->num = 0;
    if (kvf_ctl_node_info(conn, &frame) != 0) {
        return 1;
    }
    rep = (const Kvf__NodeInfoReply *)frame.msg;
    for (i = 0; (i < rep->n_nodes) && (names->num < KVF_CTL_MAX_NODES); i++) {
        const Kvf__NodeDesc *d = rep->nodes[i];

        names->ids[names->num] = d->node_id;
        snprintf(names->names[names->num], sizeof(names->names[0]), "%s",
                 d->name);
        names->is_up[names->num] = strcmp(d->state, "dead") != 0;
        names->num++;
    }
    kvf_frame_release(&frame, NULL);
    return 0;
}

static const char *kvf_ctl_name_of(const kvf_ctl_names_t *names, uint32_t id)
{
    size_t i;

    for (i = 0; i < names->num; i++) {
        if (names->ids[i] == id) {
            return names->names[i];
        }
    }
    return "?";
}

/* Where the chosen holder keeps a key: "host", "disk", "-" (none). */
static const char *kvf_ctl_medium_name(uint32_t holder, uint8_t medium)
{
    if (holder == 0) {
        return "-";
    }
    return (medium == KVF__MEDIUM__MEDIUM_DISK) ? "disk" : "host";
}

/* One LOOKUP; fills holders[n] (node ids, 0: none), media[n] (NULL: not
 * wanted; a controller that sends none: host) and *hit_p. */
static int kvf_ctl_lookup_raw(kvf_ctlconn_t *conn, const uint8_t *keys, int n,
                              bool any_order, uint32_t requester,
                              uint32_t *holders, uint8_t *media,
                              uint32_t *hit_p, bool *recovering_p)
{
    const Kvf__LookupReply *rep;
    kvf_frame_t frame;
    Kvf__Lookup req;
    int i;

    kvf__lookup__init(&req);
    req.request_id = kvf_ctlconn_next_id(conn);
    req.keys.data  = (uint8_t *)(uintptr_t)keys;
    req.keys.len   = (size_t)n * KVF_KEY_WIRE_SIZE;
    req.any_order  = any_order;
    req.requester  = requester;
    if (kvf_ctl_call(conn, KVF_MSG_LOOKUP, &req.base, KVF_MSG_LOOKUP_REPLY,
                     &frame) != 0) {
        return 1;
    }
    rep = (const Kvf__LookupReply *)frame.msg;
    if (rep->holders.len != (size_t)n * 4) {
        kvf_frame_release(&frame, NULL);
        return kvf_ctl_fail(1, "KVF_ERR_PROTO",
                            "lookup reply has %zu holder bytes for %d keys",
                            rep->holders.len, n);
    }
    for (i = 0; i < n; i++) {
        const uint8_t *p = rep->holders.data + 4 * i;

        holders[i] = (uint32_t)p[0] | ((uint32_t)p[1] << 8) |
                     ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
        if (media != NULL) {
            media[i] = (rep->media.len == (size_t)n) ? rep->media.data[i]
                                                     : KVF__MEDIUM__MEDIUM_HOST;
        }
    }
    *hit_p = rep->hit_chunks;
    if (recovering_p != NULL) {
        *recovering_p = rep->recovering;
    }
    kvf_frame_release(&frame, NULL);
    return 0;
}

/*
 * Every live holder of each key: the registry answers a lookup with the
 * requester itself when it holds the key, so one any-order lookup per
 * node tells which keys that node holds. Fills held[k * names->num + j]
 * (key k held by the j-th node) and count_p[k].
 */
static int kvf_ctl_holders_all(kvf_ctlconn_t *conn,
                               const kvf_ctl_names_t *names,
                               const uint8_t *keys, int n, bool *held,
                               uint32_t *count_p)
{
    uint32_t *holders, hit;
    size_t j;
    int k;

    holders = calloc((size_t)n, sizeof(*holders));
    if (holders == NULL) {
        return kvf_ctl_fail(1, "KVF_ERR_NO_MEMORY", "out of memory");
    }
    memset(count_p, 0, (size_t)n * sizeof(*count_p));
    for (j = 0; j < names->num; j++) {
        if (!names->is_up[j]) {
            continue;
        }
        if (kvf_ctl_lookup_raw(conn, keys, n, true, names->ids[j], holders,
                               NULL, &hit, NULL) != 0) {
            free(holders);
            return 1;
        }
        for (k = 0; k < n; k++) {
            held[(size_t)k * names->num + j] = holders[k] == names->ids[j];
            count_p[k] += (holders[k] == names->ids[j]) ? 1 : 0;
        }
    }
    free(holders);
    return 0;
}

/* "gpu0, gpu1" of key @p k into @p buf (JSON: a list of strings). */
static void kvf_ctl_holder_list(const kvf_ctl_names_t *names, const bool *held,
                                int k, bool is_json)
{
    bool first = true;
    size_t j;

    if (is_json) {
        putchar('[');
    }
    for (j = 0; j < names->num; j++) {
        if (!held[(size_t)k * names->num + j]) {
            continue;
        }
        if (is_json) {
            printf("%s", first ? "" : ",");
            kvf_ctl_json_str(names->names[j]);
        } else {
            printf("%s%s", first ? "" : ", ", names->names[j]);
        }
        first = false;
    }
    if (is_json) {
        putchar(']');
    } else if (first) {
        putchar('-');
    }
}

static int kvf_ctl_stats_get(kvf_ctlconn_t *conn, kvf_frame_t *frame)
{
    Kvf__StatsRequest req;

    kvf__stats_request__init(&req);
    req.request_id = kvf_ctlconn_next_id(conn);
    return kvf_ctl_call(conn, KVF_MSG_STATS, &req.base, KVF_MSG_STATS_REPLY,
                        frame);
}

static int kvf_ctl_stats(kvf_ctlconn_t *conn, const kvf_ctl_opts_t *opts)
{
    char json[2048], *p, *end;
    kvf_frame_t frame;

    if (kvf_ctl_stats_get(conn, &frame) != 0) {
        return 1;
    }
    /* the same fields, in the same order, as GET /v1/stats */
    kvf_msg_scalars_json(frame.msg, json, sizeof(json));
    kvf_frame_release(&frame, NULL);
    if (opts->is_json) {
        printf("{%s}\n", json);
        return 0;
    }
    /* "name":value,... -> one "name value" line each */
    for (p = json; *p != '\0'; p = (*end == ',') ? end + 1 : end) {
        char *colon = strchr(p, ':');

        end = strchr(p, ',');
        if (end == NULL) {
            end = p + strlen(p);
        }
        if ((colon == NULL) || (colon > end) || (*p != '"')) {
            break;
        }
        printf("%-20.*s %.*s\n", (int)(colon - p - 2), p + 1,
               (int)(end - colon - 1), colon + 1);
    }
    return 0;
}

/* Sends @p req (a whole HTTP/1.0 request) to @p url (HOST:PORT, [V6]:PORT,
 * http:// and a path allowed) and reads the answer into @p buf (NUL
 * ended) until it closes, @p cap - 1 bytes, or @p timeout_ms of silence.
 * Returns the bytes read (0: no answer). Best effort: for probes. */
static size_t kvf_ctl_http_ask(const char *url, const char *req, char *buf,
                               size_t cap, int timeout_ms)
{
    struct addrinfo hints, *res = NULL;
    char host[256], port[8];
    const char *p = url, *colon;
    struct pollfd pfd;
    size_t used = 0, len = strlen(req);
    ssize_t n;
    int fd;

    buf[0] = '\0';
    if (strncmp(p, "http://", 7) == 0) {
        p += 7;
    }
    colon = strrchr(p, ':');
    if ((colon == NULL) || ((size_t)(colon - p) >= sizeof(host))) {
        return 0;
    }
    snprintf(host, sizeof(host), "%.*s", (int)(colon - p), p);
    if ((host[0] == '[') && (host[strlen(host) - 1] == ']')) {
        memmove(host, host + 1, strlen(host));
        host[strlen(host) - 1] = '\0';
    }
    snprintf(port, sizeof(port), "%.*s", (int)strcspn(colon + 1, "/"),
             colon + 1);
    memset(&hints, 0, sizeof(hints));
    hints.ai_socktype = SOCK_STREAM;
    if ((getaddrinfo(host, port, &hints, &res) != 0) || (res == NULL)) {
        return 0;
    }
    fd = socket(res->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if ((fd >= 0) && (connect(fd, res->ai_addr, res->ai_addrlen) == 0) &&
        (write(fd, req, len) == (ssize_t)len)) {
        pfd.fd     = fd;
        pfd.events = POLLIN;
        while ((used < cap - 1) && (poll(&pfd, 1, timeout_ms) == 1) &&
               ((n = read(fd, buf + used, cap - 1 - used)) > 0)) {
            used += (size_t)n;
        }
    }
    buf[used] = '\0';
    if (fd >= 0) {
        close(fd);
    }
    freeaddrinfo(res);
    return used;
}

/* GET http://HOST:PORT/health of etcd @p url within @p timeout_ms: true
 * when it says {"health":"true"}. */
static bool kvf_ctl_etcd_healthy(const char *url, int timeout_ms)
{
    char buf[512];

    kvf_ctl_http_ask(url, "GET /health HTTP/1.0\r\n\r\n", buf, sizeof(buf),
                     timeout_ms);
    return (strncmp(buf, "HTTP/1.", 7) == 0) &&
           (strstr(buf, " 200 ") != NULL) &&
           (strstr(buf, "\"health\":\"true\"") != NULL);
}

/* kvfctl status: HA on etcd: the leader, its standbys, the etcd
 * endpoints' health (checked from here). */
static int kvf_ctl_status(kvf_ctlconn_t *conn, const kvf_ctl_opts_t *opts)
{
    const Kvf__StatsReply *rep;
    char etcd[1024], *url, *save = NULL, size[32];
    kvf_frame_t frame;
    bool first = true;
    size_t i;

    if (kvf_ctl_stats_get(conn, &frame) != 0) {
        return 1;
    }
    rep = (const Kvf__StatsReply *)frame.msg;
    if ((rep->role == NULL) || (rep->role[0] == '\0')) {
        if (opts->is_json) {
            printf("{\"ha\":false}\n");
        } else {
            printf("controller %s: no HA (started without --etcd)\n",
                   opts->controller);
        }
        kvf_frame_release(&frame, NULL);
        return 0;
    }
    if (opts->is_json) {
        printf("{\"ha\":true,\"role\":");
        kvf_ctl_json_str(rep->role);
        printf(",\"term\":%" PRIu64 ",\"elections_won\":%" PRIu64
               ",\"leader_ms\":%" PRIu64 ",\"standbys\":[",
               rep->term, rep->elections_won, rep->leader_ms);
        for (i = 0; i < rep->n_standbys; i++) {
            printf("%s{\"name\":", (i > 0) ? "," : "");
            kvf_ctl_json_str(rep->standbys[i]->name);
            printf(",\"warm\":%s,\"queued_bytes\":%" PRIu64
                   ",\"following_ms\":%" PRIu64 "}",
                   rep->standbys[i]->warm ? "true" : "false",
                   rep->standbys[i]->queued_bytes,
                   rep->standbys[i]->following_ms);
        }
        printf("],\"etcd\":[");
    } else {
        printf("leader   %s  term %" PRIu64 ", leader for %.1f s, elections "
               "won %" PRIu64 "\n",
               opts->controller, rep->term, (double)rep->leader_ms / 1e3,
               rep->elections_won);
        for (i = 0; i < rep->n_standbys; i++) {
            printf("standby  %s  %s, %s behind, following for %.1f s\n",
                   rep->standbys[i]->name,
                   rep->standbys[i]->warm ? "warm" : "NOT WARM",
                   kvf_ctl_bytes(rep->standbys[i]->queued_bytes, size,
                                 sizeof(size)),
                   (double)rep->standbys[i]->following_ms / 1e3);
        }
        if (rep->n_standbys == 0) {
            printf("standby  none following: a failover starts cold\n");
        }
    }
    snprintf(etcd, sizeof(etcd), "%s", (rep->etcd != NULL) ? rep->etcd : "");
    for (url = strtok_r(etcd, ",", &save); url != NULL;
         url = strtok_r(NULL, ",", &save)) {
        bool ok = kvf_ctl_etcd_healthy(url, opts->timeout_ms);

        if (opts->is_json) {
            printf("%s{\"endpoint\":", first ? "" : ",");
            kvf_ctl_json_str(url);
            printf(",\"healthy\":%s}", ok ? "true" : "false");
        } else {
            printf("etcd     %s  %s\n", url,
                   ok ? "healthy" : "NOT HEALTHY (from here)");
        }
        first = false;
    }
    if (opts->is_json) {
        printf("]}\n");
    }
    kvf_frame_release(&frame, NULL);
    return 0;
}

/* Packs KEY arguments; NULL (after printing why) on a bad key. */
static uint8_t *kvf_ctl_pack_keys(int argc, char **argv)
{
    uint8_t *buf;
    kvf_key_t key;
    int i;

    buf = malloc((size_t)argc * KVF_KEY_WIRE_SIZE);
    if (buf == NULL) {
        kvf_ctl_fail(1, "KVF_ERR_NO_MEMORY", "out of memory");
        return NULL;
    }
    for (i = 0; i < argc; i++) {
        if (kvf_key_parse(argv[i], &key) != KVF_OK) {
            kvf_ctl_fail(1, "KVF_ERR_INVALID",
                         "bad key '%s' (want NS:DIGEST, hex)", argv[i]);
            free(buf);
            return NULL;
        }
        kvf_key_pack(&key, buf + (size_t)i * KVF_KEY_WIRE_SIZE);
    }
    return buf;
}

static int kvf_ctl_lookup(kvf_ctlconn_t *conn, const kvf_ctl_opts_t *opts,
                          int argc, char **argv)
{
    kvf_ctl_names_t *names = NULL;
    uint32_t *holders = NULL, *counts = NULL, hit;
    bool recovering, *held            = NULL;
    uint8_t *keys, *media             = NULL;
    int i, rc                         = 1;

    if (argc == 0) {
        return kvf_ctl_fail(2, "KVF_ERR_INVALID",
                            "lookup needs at least one KEY");
    }
    keys = kvf_ctl_pack_keys(argc, argv);
    if (keys == NULL) {
        return 1;
    }
    names   = calloc(1, sizeof(*names));
    holders = calloc((size_t)argc, sizeof(*holders));
    counts  = calloc((size_t)argc, sizeof(*counts));
    media   = calloc((size_t)argc, sizeof(*media));
    if ((names == NULL) || (holders == NULL) || (counts == NULL) ||
        (media == NULL)) {
        kvf_ctl_fail(1, "KVF_ERR_NO_MEMORY", "out of memory");
        goto out;
    }
    if ((kvf_ctl_lookup_raw(conn, keys, argc, opts->is_any_order, 0, holders,
                            media, &hit, &recovering) != 0) ||
        (kvf_ctl_names_load(conn, names) != 0)) {
        goto out;
    }
    held = calloc((size_t)argc * (names->num + 1), sizeof(*held));
    if (held == NULL) {
        kvf_ctl_fail(1, "KVF_ERR_NO_MEMORY", "out of memory");
        goto out;
    }
    if (kvf_ctl_holders_all(conn, names, keys, argc, held, counts) != 0) {
        goto out;
    }
    if (opts->is_json) {
        printf("{\"hit_chunks\":%" PRIu32 ",\"recovering\":%s,\"keys\":[", hit,
               recovering ? "true" : "false");
    } else {
        printf("hit %" PRIu32 " of %d chunk(s)%s\n%-50s %-20s %-6s %s\n", hit,
               argc, recovering ? " (controller recovering)" : "", "KEY",
               "CHOSEN", "MEDIUM", "HOLDERS");
    }
    for (i = 0; i < argc; i++) {
        if (opts->is_json) {
            printf("%s{\"key\":", (i > 0) ? "," : "");
            kvf_ctl_json_str(argv[i]);
            printf(",\"holder\":%" PRIu32 ",\"holder_name\":", holders[i]);
            kvf_ctl_json_str(
                (holders[i] != 0) ? kvf_ctl_name_of(names, holders[i]) : "");
            printf(",\"medium\":\"%s\"",
                   kvf_ctl_medium_name(holders[i], media[i]));
            printf(",\"holders\":");
            kvf_ctl_holder_list(names, held, i, true);
            putchar('}');
        } else {
            printf("%-50s %-20s %-6s ", argv[i],
                   (holders[i] != 0) ? kvf_ctl_name_of(names, holders[i]) : "-",
                   kvf_ctl_medium_name(holders[i], media[i]));
            kvf_ctl_holder_list(names, held, i, false);
            putchar('\n');
        }
    }
    if (opts->is_json) {
        printf("]}\n");
    }
    rc = 0;
out:
    free(held);
    free(media);
    free(counts);
    free(holders);
    free(names);
    free(keys);
    return rc;
}

static int kvf_ctl_tree(kvf_ctlconn_t *conn, const kvf_ctl_opts_t *opts)
{
    const Kvf__NodeInfoReply *rep;
    const Kvf__StatsReply *st;
    kvf_frame_t nodes, stats;
    uint64_t total;
    size_t i;

    if (kvf_ctl_stats_get(conn, &stats) != 0) {
        return 1;
    }
    if (kvf_ctl_node_info(conn, &nodes) != 0) {
        kvf_frame_release(&stats, NULL);
        return 1;
    }
    st    = (const Kvf__StatsReply *)stats.msg;
    rep   = (const Kvf__NodeInfoReply *)nodes.msg;
    total = st->holdings;
    if (opts->is_json) {
        printf("{\"keys\":%" PRIu64 ",\"holdings\":%" PRIu64
               ",\"purge_backlog\":%" PRIu64 ",\"nodes\":[",
               st->keys, st->holdings, st->purge_backlog);
    } else {
        printf("registry: %" PRIu64 " keys, %" PRIu64 " holdings, %" PRIu64
               " being purged\n",
               st->keys, st->holdings, st->purge_backlog);
    }
    for (i = 0; i < rep->n_nodes; i++) {
        const Kvf__NodeDesc *d = rep->nodes[i];
        double share =
            (total > 0) ? (100.0 * (double)d->keys / (double)total) : 0.0;

        if (opts->is_json) {
            printf("%s{\"id\":%" PRIu32 ",\"name\":", (i > 0) ? "," : "",
                   d->node_id);
            kvf_ctl_json_str(d->name);
            printf(",\"state\":\"%s\",\"keys\":%" PRIu64 "}", d->state,
                   d->keys);
        } else {
            printf("%s node %" PRIu32 " %-20s %-9s %10" PRIu64
                   " keys %5.1f%%\n",
                   (i + 1 < rep->n_nodes) ? "├─" : "└─", d->node_id, d->name,
                   d->state, d->keys, share);
        }
    }
    if (opts->is_json) {
        printf("]}\n");
    }
    kvf_frame_release(&nodes, NULL);
    kvf_frame_release(&stats, NULL);
    return 0;
}

/* NODE on the command line: a numeric id or a name. */
static void kvf_ctl_set_node(Kvf__AdminCommand *req, char *node)
{
    char *end;
    unsigned long id = strtoul(node, &end, 10);

    if ((*end == '\0') && (end != node) && (id <= UINT32_MAX)) {
        req->node_id = (uint32_t)id;
    } else {
        req->node_name = node;
    }
}

/* Index of node @p node (an id or a name as typed) in @p names, or -1. */
static int kvf_ctl_names_find(const kvf_ctl_names_t *names, const char *node)
{
    char *end;
    unsigned long id = strtoul(node, &end, 10);
    size_t i;
    int found = -1;

    for (i = 0; i < names->num; i++) {
        if (((*end == '\0') && (end != node) && (names->ids[i] == id)) ||
            (strcmp(names->names[i], node) == 0)) {
            found = (int)i; /* the newest record of a name wins */
        }
    }
    return found;
}

/*
 * After pin/unpin/replicate: what happened to each key. Pins are recorded
 * for keys nobody holds yet (they apply when stored); a replication of a
 * key nobody holds cannot happen. With @p wait_node >= 0 (replicate
 * --wait) polls until that node holds every key that has a holder, or the
 * timeout. Returns the exit status.
 */
static int kvf_ctl_admin_report(kvf_ctlconn_t *conn, const kvf_ctl_opts_t *opts,
                                Kvf__CommandType type, const char *message,
                                const uint8_t *keys, int n, char **argv,
                                const char *target)
{
    kvf_ctl_names_t *names = calloc(1, sizeof(*names));
    uint32_t *counts       = calloc((size_t)n, sizeof(*counts));
    bool *held             = NULL;
    bool is_repl           = type == KVF__COMMAND_TYPE__COMMAND_REPLICATE;
    int i, t = -1, done = 0, wanted = 0, rc = 1, waited = 0;

    if ((names == NULL) || (counts == NULL)) {
        kvf_ctl_fail(1, "KVF_ERR_NO_MEMORY", "out of memory");
        goto out;
    }
    if (kvf_ctl_names_load(conn, names) != 0) {
        goto out;
    }
    held = calloc((size_t)n * (names->num + 1), sizeof(*held));
    if (held == NULL) {
        kvf_ctl_fail(1, "KVF_ERR_NO_MEMORY", "out of memory");
        goto out;
    }
    if (is_repl) {
        t = kvf_ctl_names_find(names, target);
    }
    for (;;) {
        if (kvf_ctl_holders_all(conn, names, keys, n, held, counts) != 0) {
            goto out;
        }
        done   = 0;
        wanted = 0;
        for (i = 0; (t >= 0) && (i < n); i++) {
            bool on_target = held[(size_t)i * names->num + (size_t)t];

            wanted += ((counts[i] > 0) || on_target) ? 1 : 0;
            done += on_target ? 1 : 0;
        }
        if (!opts->is_wait || (t < 0) || (done == wanted) ||
            (waited >= opts->timeout_ms)) {
            break;
        }
        poll(NULL, 0, 100);
        waited += 100;
    }
    if (opts->is_json) {
        printf("{\"ok\":true,\"message\":");
        kvf_ctl_json_str(message);
        if (t >= 0) {
            printf(",\"replicated\":%d,\"replicable\":%d", done, wanted);
        }
        printf(",\"keys\":[");
    } else {
        printf("ok: %s\n", message);
    }
    for (i = 0; i < n; i++) {
        const char *what;

        if (counts[i] == 0) {
            what = is_repl ? "nobody holds it: nothing to replicate"
                   : (type == KVF__COMMAND_TYPE__COMMAND_UNPIN)
                       ? "nobody holds it"
                       : "nobody holds it yet: pinned when stored";
        } else if ((t >= 0) && held[(size_t)i * names->num + (size_t)t]) {
            what = "replicated";
        } else {
            what = is_repl ? "held elsewhere: replication queued" : "held";
        }
        if (opts->is_json) {
            printf("%s{\"key\":", (i > 0) ? "," : "");
            kvf_ctl_json_str(argv[i]);
            printf(",\"holders\":");
            kvf_ctl_holder_list(names, held, i, true);
            printf(",\"outcome\":");
            kvf_ctl_json_str(what);
            putchar('}');
        } else {
            printf("  %-50s %s; held by %" PRIu32 " node(s): ", argv[i], what,
                   counts[i]);
            kvf_ctl_holder_list(names, held, i, false);
            putchar('\n');
        }
    }
    if (opts->is_json) {
        printf("]}\n");
    } else if (t >= 0) {
        printf("replicated %d of %d key(s) with a holder to %s%s\n", done,
               wanted, target,
               (done == wanted) ? ""
               : opts->is_wait  ? " (timed out waiting)"
                                : "; 'replicate --wait' waits for the rest");
    }
    rc = (opts->is_wait && (t >= 0) && (done < wanted)) ? 1 : 0;
out:
    free(held);
    free(counts);
    free(names);
    return rc;
}

static int kvf_ctl_admin(kvf_ctlconn_t *conn, const kvf_ctl_opts_t *opts,
                         Kvf__CommandType type, int argc, char **argv)
{
    const Kvf__Status *st;
    Kvf__AdminCommand req;
    kvf_frame_t frame;
    uint8_t *keys    = NULL;
    const char *name = kvf_msg_command_name(type), *target = NULL;
    int rc;

    kvf__admin_command__init(&req);
    req.request_id = kvf_ctlconn_next_id(conn);
    req.type       = type;
    if (type == KVF__COMMAND_TYPE__COMMAND_REPLICATE) {
        if (argc < 2) {
            return kvf_ctl_fail(2, "KVF_ERR_INVALID",
                                "replicate takes NODE KEY...");
        }
        target = argv[0];
        kvf_ctl_set_node(&req, argv[0]);
        argc--;
        argv++;
    }
    if ((type == KVF__COMMAND_TYPE__COMMAND_PIN) ||
        (type == KVF__COMMAND_TYPE__COMMAND_SOFT_PIN) ||
        (type == KVF__COMMAND_TYPE__COMMAND_UNPIN) ||
        (type == KVF__COMMAND_TYPE__COMMAND_REPLICATE)) {
        if (argc == 0) {
            return kvf_ctl_fail(2, "KVF_ERR_INVALID",
                                "%s needs at least one KEY", name);
        }
        keys = kvf_ctl_pack_keys(argc, argv);
        if (keys == NULL) {
            return 1;
        }
        req.keys.data = keys;
        req.keys.len  = (size_t)argc * KVF_KEY_WIRE_SIZE;
    } else {
        bool needs_node = type != KVF__COMMAND_TYPE__COMMAND_CLEAR;

        if ((argc > 1) || (needs_node && (argc != 1))) {
            return kvf_ctl_fail(2, "KVF_ERR_INVALID", "%s takes %s NODE%s%s",
                                name, needs_node ? "one" : "at most one",
                                (argc > 1) ? ", not " : "",
                                (argc > 1) ? argv[1] : "");
        }
        if (argc == 1) {
            kvf_ctl_set_node(&req, argv[0]);
        }
    }
    rc = kvf_ctl_call(conn, KVF_MSG_ADMIN_COMMAND, &req.base, KVF_MSG_STATUS,
                      &frame);
    if (rc != 0) {
        free(keys);
        return rc;
    }
    st = (const Kvf__Status *)frame.msg;
    if (keys != NULL) {
        rc = kvf_ctl_admin_report(conn, opts, type, st->message, keys, argc,
                                  argv, target);
    } else if (opts->is_json) {
        printf("{\"ok\":true,\"message\":");
        kvf_ctl_json_str(st->message);
        printf("}\n");
    } else {
        printf("ok: %s\n", st->message);
    }
    kvf_frame_release(&frame, NULL);
    free(keys);
    return rc;
}

/* Whether HOST:PORT answers HTTP: the usual mistake of giving kvfctl the
 * controller's --http port. Best effort, bounded by @p timeout_ms. */
static bool kvf_ctl_is_http(const char *hostport, int timeout_ms)
{
    char buf[6];

    return (kvf_ctl_http_ask(hostport, "GET /healthz HTTP/1.0\r\n\r\n", buf,
                             sizeof(buf), timeout_ms) == 5) &&
           (memcmp(buf, "HTTP/", 5) == 0);
}

/* --timeout: milliseconds, or a duration with its unit (2s, 500ms). */
static bool kvf_ctl_parse_timeout(const char *text, int *ms_p)
{
    uint64_t v, ns;

    if ((kvf_config_parse_uint(text, &v) == KVF_OK) && (v > 0) &&
        (v <= 3600000)) {
        *ms_p = (int)v;
        return true;
    }
    if ((kvf_config_parse_duration(text, &ns) == KVF_OK) && (ns >= 1000000) &&
        (ns <= 3600000000000ull)) {
        *ms_p = (int)(ns / 1000000);
        return true;
    }
    return false;
}

/* The commands, with how many words (after the command) each takes. */
static const struct {
    const char *name;
    int min_args, max_args; /* -1: any number */
} kvf_ctl_cmds[] = {
    {"nodes", 0, 0},   {"stats", 0, 0},      {"status", 0, 0},
    {"tree", 0, 0},    {"lookup", 1, -1},    {"pin", 1, -1},
    {"unpin", 1, -1},  {"replicate", 2, -1}, {"drain", 1, 1},
    {"undrain", 1, 1}, {"clear", 0, 1},
};

int main(int argc, char **argv)
{
    kvf_ctl_opts_t opts = {.controller  = "127.0.0.1:7400",
                           .etcd_prefix = "/kvfabric",
                           .timeout_ms  = 5000};
    char leader[256];
    kvf_ctlconn_params_t params;
    kvf_auth_secret_t secret;
    char *words[256];
    int nwords = 0, i, rc, c;
    kvf_ctlconn_t *conn;
    kvf_status_t status;
    const char *cmd;
    char err[512];
    size_t k;

    signal(SIGPIPE, SIG_IGN); /* a closed controller is an error, not death */
    if (kvf_version_asked(argc, argv)) {
        kvf_version_print("kvfctl", stdout);
        return 0;
    }
    for (i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--json") == 0) {
            kvf_ctl_json_errors = true; /* before any error is reported */
        }
    }
    if (getenv("KVF_CONTROLLER") != NULL) {
        opts.controller = getenv("KVF_CONTROLLER");
    }
    if (getenv("KVF_ETCD") != NULL) {
        opts.etcd = getenv("KVF_ETCD");
    }
    if (getenv("KVF_ETCD_PREFIX") != NULL) {
        opts.etcd_prefix = getenv("KVF_ETCD_PREFIX");
    }
    for (i = 1; i < argc; i++) {
        const char *eq = NULL;

        if ((strncmp(argv[i], "--controller=", 13) == 0) ||
            (strncmp(argv[i], "--etcd=", 7) == 0) ||
            (strncmp(argv[i], "--etcd-prefix=", 14) == 0) ||
            (strncmp(argv[i], "--timeout=", 10) == 0)) {
            eq = strchr(argv[i], '=') + 1;
        }
        if ((strcmp(argv[i], "--help") == 0) || (strcmp(argv[i], "-h") == 0)) {
            kvf_ctl_usage(stdout);
            return 0;
        } else if (strcmp(argv[i], "--json") == 0) {
            opts.is_json = true;
        } else if (strcmp(argv[i], "--any-order") == 0) {
            opts.is_any_order = true;
        } else if (strcmp(argv[i], "--soft") == 0) {
            opts.is_soft = true;
        } else if (strcmp(argv[i], "--wait") == 0) {
            opts.is_wait = true;
        } else if ((strcmp(argv[i], "--controller") == 0) ||
                   (strncmp(argv[i], "--controller=", 13) == 0)) {
            if ((eq == NULL) && (i + 1 >= argc)) {
                return kvf_ctl_fail(2, "KVF_ERR_INVALID",
                                    "--controller needs HOST:PORT");
            }
            opts.controller = (eq != NULL) ? eq : argv[++i];
        } else if ((strcmp(argv[i], "--etcd") == 0) ||
                   (strncmp(argv[i], "--etcd=", 7) == 0) ||
                   (strcmp(argv[i], "--etcd-prefix") == 0) ||
                   (strncmp(argv[i], "--etcd-prefix=", 14) == 0)) {
            bool is_prefix = (strncmp(argv[i], "--etcd-prefix", 13) == 0);

            if ((eq == NULL) && (i + 1 >= argc)) {
                return kvf_ctl_fail(2, "KVF_ERR_INVALID", "%s needs a value",
                                    is_prefix ? "--etcd-prefix" : "--etcd");
            }
            *(is_prefix ? &opts.etcd_prefix : &opts.etcd) =
                (eq != NULL) ? eq : argv[++i];
        } else if ((strcmp(argv[i], "--timeout") == 0) ||
                   (strncmp(argv[i], "--timeout=", 10) == 0)) {
            const char *v = (eq != NULL) ? eq : (i + 1 < argc) ? argv[++i] : "";

            if (!kvf_ctl_parse_timeout(v, &opts.timeout_ms)) {
                return kvf_ctl_fail(2, "KVF_ERR_INVALID",
                                    "--timeout '%s' is not a time (MS, or "
                                    "with a unit: 2s, 500ms; at most 1h)",
                                    v);
            }
        } else if (argv[i][0] == '-') {
            kvf_ctl_usage(stderr);
            return kvf_ctl_fail(2, "KVF_ERR_INVALID",
                                "unknown flag '%s' (see --help)", argv[i]);
        } else if (nwords < (int)(sizeof(words) / sizeof(words[0]))) {
            words[nwords++] = argv[i];
        } else {
            return kvf_ctl_fail(2, "KVF_ERR_INVALID", "too many arguments");
        }
    }
    if (nwords == 0) {
        kvf_ctl_usage(stderr);
        return kvf_ctl_fail(2, "KVF_ERR_INVALID", "no command (see --help)");
    }
    cmd = words[0];
    for (k = 0; k < sizeof(kvf_ctl_cmds) / sizeof(kvf_ctl_cmds[0]); k++) {
        if (strcmp(cmd, kvf_ctl_cmds[k].name) == 0) {
            break;
        }
    }
    if (k == sizeof(kvf_ctl_cmds) / sizeof(kvf_ctl_cmds[0])) {
        kvf_ctl_usage(stderr);
        return kvf_ctl_fail(2, "KVF_ERR_INVALID", "unknown command '%s'", cmd);
    }
    c = nwords - 1;
    if ((c < kvf_ctl_cmds[k].min_args) ||
        ((kvf_ctl_cmds[k].max_args >= 0) && (c > kvf_ctl_cmds[k].max_args))) {
        if (kvf_ctl_cmds[k].max_args == 0) {
            return kvf_ctl_fail(2, "KVF_ERR_INVALID",
                                "%s takes no arguments (got '%s')", cmd,
                                words[1]);
        }
        return kvf_ctl_fail(2, "KVF_ERR_INVALID",
                            "%s: wrong number of arguments (see --help)", cmd);
    }
    if (kvf_auth_secret_load_opt(getenv("KVF_CLUSTER_SECRET_FILE"), &secret,
                                 err, sizeof(err)) != KVF_OK) {
        return kvf_ctl_fail(1, "KVF_ERR_CONFIG", "%s", err);
    }
    if ((opts.etcd != NULL) && (opts.etcd[0] != '\0')) {
        /* HA on etcd: the leader's published control address */
        status = kvf_etcd_find_leader(opts.etcd, opts.etcd_prefix,
                                      (uint64_t)opts.timeout_ms, leader,
                                      sizeof(leader), err, sizeof(err));
        if (status != KVF_OK) {
            kvf_auth_secret_cleanup(&secret);
            return kvf_ctl_fail(1, kvf_status_name(status), "%s", err);
        }
        opts.controller = leader;
    }
    memset(&params, 0, sizeof(params));
    params.hostport        = opts.controller;
    params.kind            = KVF__PEER_KIND__PEER_ADMIN;
    params.name            = "kvfctl";
    params.version         = KVF_PROTOCOL_VERSION;
    params.timeout_ms      = opts.timeout_ms;
    params.secret          = &secret;
    params.tls_ca          = getenv("KVF_TLS_CA");
    params.tls_server_name = getenv("KVF_TLS_SERVER_NAME");
    status                 = kvf_ctlconn_open(&params, &conn, err, sizeof(err));
    rc                     = (status == KVF_OK) ? 0 : 1;
    kvf_auth_secret_cleanup(&secret);
    if (rc != 0) {
        /* an HTTP server answers a HELLO frame with "HTTP/1.1 400" (read
         * as a frame far too big) or waits for the rest of its request
         * (a timeout): only then probe, a probe of a TLS or control port
         * would count as a failed handshake there */
        if (((status == KVF_ERR_TOO_BIG) || (status == KVF_ERR_TIMEOUT) ||
             (strstr(err, "too big") != NULL) ||
             (strstr(err, "timed out") != NULL)) &&
            (params.tls_ca == NULL) && kvf_ctl_is_http(opts.controller, 1000)) {
            return kvf_ctl_fail(1, "KVF_ERR_PROTO",
                                "%s answers HTTP: that is the controller's "
                                "HTTP port (dashboard, /metrics); the control "
                                "port is its --listen (default 7400)",
                                opts.controller);
        }
        return kvf_ctl_fail(1, "KVF_ERR_IO", "%s", err);
    }
    if (strcmp(cmd, "nodes") == 0) {
        rc = kvf_ctl_nodes(conn, &opts);
    } else if (strcmp(cmd, "stats") == 0) {
        rc = kvf_ctl_stats(conn, &opts);
    } else if (strcmp(cmd, "status") == 0) {
        rc = kvf_ctl_status(conn, &opts);
    } else if (strcmp(cmd, "lookup") == 0) {
        rc = kvf_ctl_lookup(conn, &opts, nwords - 1, words + 1);
    } else if (strcmp(cmd, "tree") == 0) {
        rc = kvf_ctl_tree(conn, &opts);
    } else if (strcmp(cmd, "pin") == 0) {
        rc = kvf_ctl_admin(conn, &opts,
                           opts.is_soft ? KVF__COMMAND_TYPE__COMMAND_SOFT_PIN
                                        : KVF__COMMAND_TYPE__COMMAND_PIN,
                           nwords - 1, words + 1);
    } else if (strcmp(cmd, "unpin") == 0) {
        rc = kvf_ctl_admin(conn, &opts, KVF__COMMAND_TYPE__COMMAND_UNPIN,
                           nwords - 1, words + 1);
    } else if (strcmp(cmd, "replicate") == 0) {
        rc = kvf_ctl_admin(conn, &opts, KVF__COMMAND_TYPE__COMMAND_REPLICATE,
                           nwords - 1, words + 1);
    } else if (strcmp(cmd, "drain") == 0) {
        rc = kvf_ctl_admin(conn, &opts, KVF__COMMAND_TYPE__COMMAND_DRAIN,
                           nwords - 1, words + 1);
    } else if (strcmp(cmd, "undrain") == 0) {
        rc = kvf_ctl_admin(conn, &opts, KVF__COMMAND_TYPE__COMMAND_UNDRAIN,
                           nwords - 1, words + 1);
    } else {
        rc = kvf_ctl_admin(conn, &opts, KVF__COMMAND_TYPE__COMMAND_CLEAR,
                           nwords - 1, words + 1);
    }
    kvf_ctlconn_destroy(conn);
    return rc;
}
