/* SPDX-License-Identifier: Apache-2.0 */
/* Copyright (c) 2026 The kvfabric authors */
/*
 * kvfctl: admin CLI of kvf-controller over the frame protocol.
 *
 *   kvfctl --controller HOST:PORT [--json] [--timeout MS]
 *          nodes|stats|lookup KEY...|tree|pin KEY...|unpin KEY...|
 *          drain NODE|clear [NODE]
 *
 * Exit 0 on success, 1 with one line "kvfctl: reason" on an error, 2 on a
 * usage error. The cluster secret comes from the file named by
 * KVF_CLUSTER_SECRET_FILE, never from the command line.
 */
#include "controller/ctlconn.h"
#include "common/version.h"

#include <kvfabric/keys.h>

#include <inttypes.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct kvf_ctl_opts {
    const char *controller;
    bool is_json;
    bool is_any_order;
    bool is_soft;
    int timeout_ms;
} kvf_ctl_opts_t;

static void kvf_ctl_usage(FILE *out)
{
    fprintf(out,
            "usage: kvfctl [--controller HOST:PORT] [--json] [--timeout MS] "
            "COMMAND [ARGS]\n"
            "commands:\n"
            "  nodes            list nodes\n"
            "  stats            controller counters\n"
            "  lookup KEY...    ordered-chain lookup (KEY as NS:DIGEST hex);\n"
            "                   --any-order: each key on its own\n"
            "  tree             per-node summary of the registry\n"
            "  pin KEY...       ask every agent never to evict KEYs;\n"
            "                   --soft: evict them last rather than never\n"
            "  unpin KEY...     undo pin\n"
            "  replicate NODE KEY...\n"
            "                   ask NODE to copy KEYs from their holders now\n"
            "  drain NODE       ask a node to drain (NODE: id or name)\n"
            "  clear [NODE]     ask one node (or all) to drop their cache\n"
            "the controller address also comes from KVF_CONTROLLER "
            "(default 127.0.0.1:7400); a cluster secret from the file named\n"
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
            fprintf(stderr, "kvfctl: %s\n",
                    (st->message[0] != '\0')
                        ? st->message
                        : kvf_strerror((kvf_status_t)st->status));
            return 1;
        }
        if (want == KVF_MSG_STATUS) {
            return 0;
        }
    }
    if (frame->type != want) {
        fprintf(stderr, "kvfctl: unexpected %s reply\n",
                kvf_msg_type_name(frame->type));
        return 1;
    }
    return 0;
}

static int kvf_ctl_call(kvf_ctlconn_t *conn, uint16_t type,
                        ProtobufCMessage *msg, uint16_t want,
                        kvf_frame_t *frame)
{
    kvf_status_t status = kvf_ctlconn_call(conn, type, msg, frame);

    if (status != KVF_OK) {
        fprintf(stderr, "kvfctl: %s request failed: %s\n",
                kvf_msg_type_name(type), kvf_strerror(status));
        return 1;
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
    kvf_frame_t frame;
    size_t i;

    if (kvf_ctl_node_info(conn, &frame) != 0) {
        return 1;
    }
    rep = (const Kvf__NodeInfoReply *)frame.msg;
    if (opts->is_json) {
        printf("{\"nodes\":[");
    } else {
        printf("%-5s %-20s %-9s %-8s %10s %12s %12s %12s %12s %6s %8s %s\n",
               "ID", "NAME", "STATE", "ROLE", "KEYS", "POOL_USED", "POOL_CAP",
               "PD_USED", "PD_CAP", "INCARN", "HB_AGO", "DATA_ADDRESS");
    }
    for (i = 0; i < rep->n_nodes; i++) {
        const Kvf__NodeDesc *d = rep->nodes[i];

        if (!opts->is_json) {
            printf("%-5" PRIu32 " %-20s %-9s %-8s %10" PRIu64 " %12" PRIu64
                   " %12" PRIu64 " %12" PRIu64 " %12" PRIu64 " %6" PRIu64
                   " %6" PRIu64 "ms %s\n",
                   d->node_id, d->name, d->state, kvf_msg_role_name(d->role),
                   d->keys, d->pool_used, d->pool_capacity, d->pd_used,
                   d->pd_capacity, d->incarnation, d->last_heartbeat_ms_ago,
                   (d->data_address[0] != '\0') ? d->data_address : "-");
            continue;
        }
        printf("%s{\"id\":%" PRIu32 ",\"name\":", (i > 0) ? "," : "",
               d->node_id);
        kvf_ctl_json_str(d->name);
        printf(",\"state\":\"%s\",\"role\":\"%s\",\"keys\":%" PRIu64
               ",\"pool_used\":%" PRIu64 ",\"pool_capacity\":%" PRIu64
               ",\"pd_used\":%" PRIu64 ",\"pd_capacity\":%" PRIu64
               ",\"incarnation\":%" PRIu64 ",\"last_heartbeat_ms_ago\":%" PRIu64
               ",\"control_address\":",
               d->state, kvf_msg_role_name(d->role), d->keys, d->pool_used,
               d->pool_capacity, d->pd_used, d->pd_capacity, d->incarnation,
               d->last_heartbeat_ms_ago);
        kvf_ctl_json_str(d->control_address);
        printf(",\"data_address\":");
        kvf_ctl_json_str(d->data_address);
        printf(",\"instance_id\":");
        kvf_ctl_json_str(d->instance_id);
        printf(",\"tp_rank\":%" PRIu32 ",\"tp_world\":%" PRIu32 "}", d->tp_rank,
               d->tp_world);
    }
    if (opts->is_json) {
        printf("]}\n");
    }
    kvf_frame_release(&frame, NULL);
    return 0;
}

static int kvf_ctl_stats_get(kvf_ctlconn_t *conn, kvf_frame_t *frame)
{
    Kvf__StatsRequest req;

    kvf__stats_request__init(&req);
    req.request_id = kvf_ctlconn_next_id(conn);
    return kvf_ctl_call(conn, KVF_MSG_STATS, &req.base, KVF_MSG_STATS_REPLY,
                        frame);
}

static void kvf_ctl_stat_line(bool is_json, const char *name, uint64_t v)
{
    if (is_json) {
        printf(",\"%s\":%" PRIu64, name, v);
    } else {
        printf("%-20s %" PRIu64 "\n", name, v);
    }
}

static int kvf_ctl_stats(kvf_ctlconn_t *conn, const kvf_ctl_opts_t *opts)
{
    const Kvf__StatsReply *s;
    kvf_frame_t frame;

    if (kvf_ctl_stats_get(conn, &frame) != 0) {
        return 1;
    }
    s = (const Kvf__StatsReply *)frame.msg;
    if (opts->is_json) {
        printf("{\"recovering\":%s", s->recovering ? "true" : "false");
    } else {
        printf("%-20s %s\n", "recovering", s->recovering ? "yes" : "no");
    }
#define KVF_CTL_STAT(_f) kvf_ctl_stat_line(opts->is_json, #_f, (uint64_t)s->_f)
    KVF_CTL_STAT(nodes_alive);
    KVF_CTL_STAT(nodes_draining);
    KVF_CTL_STAT(nodes_dead);
    KVF_CTL_STAT(keys);
    KVF_CTL_STAT(holdings);
    KVF_CTL_STAT(admits);
    KVF_CTL_STAT(evicts);
    KVF_CTL_STAT(lookups);
    KVF_CTL_STAT(lookup_hit_chunks);
    KVF_CTL_STAT(lookup_miss_chunks);
    KVF_CTL_STAT(purge_backlog);
    KVF_CTL_STAT(protocol_errors);
    KVF_CTL_STAT(stale_rejects);
    KVF_CTL_STAT(seq_gaps);
    KVF_CTL_STAT(connections);
    KVF_CTL_STAT(uptime_ms);
    KVF_CTL_STAT(table_bytes);
#undef KVF_CTL_STAT
    if (opts->is_json) {
        printf("}\n");
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
        fprintf(stderr, "kvfctl: out of memory\n");
        return NULL;
    }
    for (i = 0; i < argc; i++) {
        if (kvf_key_parse(argv[i], &key) != KVF_OK) {
            fprintf(stderr, "kvfctl: bad key '%s' (want NS:DIGEST, hex)\n",
                    argv[i]);
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
    const Kvf__LookupReply *rep;
    kvf_frame_t frame;
    Kvf__Lookup req;
    uint8_t *keys;
    int i, rc;

    if (argc == 0) {
        fprintf(stderr, "kvfctl: lookup needs at least one KEY\n");
        return 2;
    }
    keys = kvf_ctl_pack_keys(argc, argv);
    if (keys == NULL) {
        return 1;
    }
    kvf__lookup__init(&req);
    req.request_id = kvf_ctlconn_next_id(conn);
    req.keys.data  = keys;
    req.keys.len   = (size_t)argc * KVF_KEY_WIRE_SIZE;
    req.any_order  = opts->is_any_order;
    rc = kvf_ctl_call(conn, KVF_MSG_LOOKUP, &req.base, KVF_MSG_LOOKUP_REPLY,
                      &frame);
    free(keys);
    if (rc != 0) {
        return rc;
    }
    rep = (const Kvf__LookupReply *)frame.msg;
    if (rep->holders.len != (size_t)argc * 4) {
        fprintf(stderr,
                "kvfctl: lookup reply has %zu holder bytes for %d "
                "keys\n",
                rep->holders.len, argc);
        kvf_frame_release(&frame, NULL);
        return 1;
    }
    if (opts->is_json) {
        printf("{\"hit_chunks\":%" PRIu32 ",\"recovering\":%s,\"keys\":[",
               rep->hit_chunks, rep->recovering ? "true" : "false");
    } else {
        printf("hit %" PRIu32 " of %d chunk(s)%s\n%-50s %s\n", rep->hit_chunks,
               argc, rep->recovering ? " (controller recovering)" : "", "KEY",
               "HOLDER");
    }
    for (i = 0; i < argc; i++) {
        const uint8_t *p = rep->holders.data + 4 * i;
        uint32_t holder  = (uint32_t)p[0] | ((uint32_t)p[1] << 8) |
                          ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);

        if (opts->is_json) {
            printf("%s{\"key\":", (i > 0) ? "," : "");
            kvf_ctl_json_str(argv[i]);
            printf(",\"holder\":%" PRIu32 "}", holder);
        } else if (holder == 0) {
            printf("%-50s -\n", argv[i]);
        } else {
            printf("%-50s %" PRIu32 "\n", argv[i], holder);
        }
    }
    if (opts->is_json) {
        printf("]}\n");
    }
    kvf_frame_release(&frame, NULL);
    return 0;
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

static int kvf_ctl_admin(kvf_ctlconn_t *conn, const kvf_ctl_opts_t *opts,
                         Kvf__CommandType type, int argc, char **argv)
{
    const Kvf__Status *st;
    Kvf__AdminCommand req;
    kvf_frame_t frame;
    uint8_t *keys = NULL;
    int rc;

    kvf__admin_command__init(&req);
    req.request_id = kvf_ctlconn_next_id(conn);
    req.type       = type;
    if (type == KVF__COMMAND_TYPE__COMMAND_REPLICATE) {
        if (argc < 2) {
            fprintf(stderr, "kvfctl: replicate takes NODE KEY...\n");
            return 2;
        }
        kvf_ctl_set_node(&req, argv[0]);
        argc--;
        argv++;
    }
    if ((type == KVF__COMMAND_TYPE__COMMAND_PIN) ||
        (type == KVF__COMMAND_TYPE__COMMAND_SOFT_PIN) ||
        (type == KVF__COMMAND_TYPE__COMMAND_UNPIN) ||
        (type == KVF__COMMAND_TYPE__COMMAND_REPLICATE)) {
        if (argc == 0) {
            fprintf(stderr, "kvfctl: pin/unpin need at least one KEY\n");
            return 2;
        }
        keys = kvf_ctl_pack_keys(argc, argv);
        if (keys == NULL) {
            return 1;
        }
        req.keys.data = keys;
        req.keys.len  = (size_t)argc * KVF_KEY_WIRE_SIZE;
    } else {
        if ((argc > 1) ||
            ((type == KVF__COMMAND_TYPE__COMMAND_DRAIN) && (argc != 1))) {
            fprintf(stderr, "kvfctl: %s takes %s NODE\n",
                    (type == KVF__COMMAND_TYPE__COMMAND_DRAIN) ? "drain"
                                                               : "clear",
                    (type == KVF__COMMAND_TYPE__COMMAND_DRAIN) ? "one"
                                                               : "at most one");
            return 2;
        }
        if (argc == 1) {
            kvf_ctl_set_node(&req, argv[0]);
        }
    }
    rc = kvf_ctl_call(conn, KVF_MSG_ADMIN_COMMAND, &req.base, KVF_MSG_STATUS,
                      &frame);
    free(keys);
    if (rc != 0) {
        return rc;
    }
    st = (const Kvf__Status *)frame.msg;
    if (opts->is_json) {
        printf("{\"ok\":true,\"message\":");
        kvf_ctl_json_str(st->message);
        printf("}\n");
    } else {
        printf("ok: %s\n", st->message);
    }
    kvf_frame_release(&frame, NULL);
    return 0;
}

int main(int argc, char **argv)
{
    kvf_ctl_opts_t opts = {.controller = "127.0.0.1:7400", .timeout_ms = 5000};
    kvf_ctlconn_params_t params;
    kvf_auth_secret_t secret;
    char *words[256];
    int nwords = 0, i, rc;
    kvf_ctlconn_t *conn;
    const char *cmd;
    char err[512];

    signal(SIGPIPE, SIG_IGN); /* a closed controller is an error, not death */
    if (getenv("KVF_CONTROLLER") != NULL) {
        opts.controller = getenv("KVF_CONTROLLER");
    }
    if (kvf_version_asked(argc, argv)) {
        kvf_version_print("kvfctl", stdout);
        return 0;
    }
    for (i = 1; i < argc; i++) {
        if ((strcmp(argv[i], "--help") == 0) || (strcmp(argv[i], "-h") == 0)) {
            kvf_ctl_usage(stdout);
            return 0;
        } else if (strcmp(argv[i], "--json") == 0) {
            opts.is_json = true;
        } else if (strcmp(argv[i], "--any-order") == 0) {
            opts.is_any_order = true;
        } else if (strcmp(argv[i], "--soft") == 0) {
            opts.is_soft = true;
        } else if ((strcmp(argv[i], "--controller") == 0) && (i + 1 < argc)) {
            opts.controller = argv[++i];
        } else if (strncmp(argv[i], "--controller=", 13) == 0) {
            opts.controller = argv[i] + 13;
        } else if ((strcmp(argv[i], "--timeout") == 0) && (i + 1 < argc)) {
            opts.timeout_ms = atoi(argv[++i]);
        } else if ((argv[i][0] == '-') && (argv[i][1] == '-')) {
            fprintf(stderr, "kvfctl: unknown flag '%s'\n", argv[i]);
            kvf_ctl_usage(stderr);
            return 2;
        } else if (nwords < (int)(sizeof(words) / sizeof(words[0]))) {
            words[nwords++] = argv[i];
        } else {
            fprintf(stderr, "kvfctl: too many arguments\n");
            return 2;
        }
    }
    if (nwords == 0) {
        kvf_ctl_usage(stderr);
        return 2;
    }
    if (opts.timeout_ms <= 0) {
        opts.timeout_ms = 5000;
    }
    cmd = words[0];
    if ((strcmp(cmd, "nodes") != 0) && (strcmp(cmd, "stats") != 0) &&
        (strcmp(cmd, "lookup") != 0) && (strcmp(cmd, "tree") != 0) &&
        (strcmp(cmd, "pin") != 0) && (strcmp(cmd, "unpin") != 0) &&
        (strcmp(cmd, "drain") != 0) && (strcmp(cmd, "clear") != 0) &&
        (strcmp(cmd, "replicate") != 0)) {
        fprintf(stderr, "kvfctl: unknown command '%s'\n", cmd);
        kvf_ctl_usage(stderr);
        return 2;
    }
    if (kvf_auth_secret_load_opt(getenv("KVF_CLUSTER_SECRET_FILE"), &secret,
                                 err, sizeof(err)) != KVF_OK) {
        fprintf(stderr, "kvfctl: %s\n", err);
        return 1;
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
    rc = (kvf_ctlconn_open(&params, &conn, err, sizeof(err)) == KVF_OK) ? 0 : 1;
    kvf_auth_secret_cleanup(&secret);
    if (rc != 0) {
        fprintf(stderr, "kvfctl: %s\n", err);
        return 1;
    }
    if (strcmp(cmd, "nodes") == 0) {
        rc = kvf_ctl_nodes(conn, &opts);
    } else if (strcmp(cmd, "stats") == 0) {
        rc = kvf_ctl_stats(conn, &opts);
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
    } else {
        rc = kvf_ctl_admin(conn, &opts, KVF__COMMAND_TYPE__COMMAND_CLEAR,
                           nwords - 1, words + 1);
    }
    kvf_ctlconn_destroy(conn);
    return rc;
}
