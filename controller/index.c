/* SPDX-License-Identifier: Apache-2.0 */
/* Copyright (c) 2026 The kvfabric authors */
#include "controller/index.h"

#include "controller/http.h"
#include "controller/stats.h"
#include "common/evjson.h"
#include "common/log.h"
#include "common/time.h"

#include <kvfabric/keys.h>

#include <event2/buffer.h>
#include <event2/http.h>

#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct kvf_index_model {
    char name[KVF_NODE_NAME_MAX];
    uint32_t chunk_size;
    uint32_t tp_world;
    uint64_t ns[KVF_INDEX_MAX_TP]; /* per TP rank */
} kvf_index_model_t;

struct kvf_index {
    kvf_index_model_t models[KVF_INDEX_MAX_MODELS];
    uint32_t num_models;
    uint32_t max_keys;
    uint32_t *tokens;   /* [KVF_INDEX_MAX_TOKENS] */
    kvf_key_t *digests; /* [max_keys]: a digest query, ns 0 */
    kvf_key_t *keys;    /* [max_keys] */
    uint8_t *packed;    /* [max_keys * KVF_KEY_WIRE_SIZE] */
    uint16_t *chosen;   /* [max_keys]: kvf_registry_lookup's holders */
    uint32_t *matched;  /* [KVF_REGISTRY_MAX_SLOTS]: chunks, by slot */
    uint8_t *is_done;   /* [KVF_REGISTRY_MAX_SLOTS]: node grouped, by slot */
    kvf_http_t *http;   /* set by kvf_index_http_start() */
    kvf_node_table_t *nodes;
    kvf_registry_t *reg;
    kvf_server_latency_t latency; /* queries and routes answered */
};

kvf_status_t kvf_index_create(uint32_t max_keys, kvf_index_t **index_p)
{
    kvf_index_t *index = calloc(1, sizeof(*index));

    if (index == NULL) {
        return KVF_ERR_NO_MEMORY;
    }
    index->max_keys = max_keys;
    index->tokens   = calloc(KVF_INDEX_MAX_TOKENS, sizeof(*index->tokens));
    index->digests  = calloc(max_keys, sizeof(*index->digests));
    index->keys     = calloc(max_keys, sizeof(*index->keys));
    index->packed   = calloc(max_keys, KVF_KEY_WIRE_SIZE);
    index->chosen   = calloc(max_keys, sizeof(*index->chosen));
    index->matched  = calloc(KVF_REGISTRY_MAX_SLOTS, sizeof(*index->matched));
    index->is_done  = calloc(KVF_REGISTRY_MAX_SLOTS, 1);
    if ((index->tokens == NULL) || (index->digests == NULL) ||
        (index->keys == NULL) || (index->packed == NULL) ||
        (index->chosen == NULL) || (index->matched == NULL) ||
        (index->is_done == NULL)) {
        kvf_index_destroy(index);
        return KVF_ERR_NO_MEMORY;
    }
    *index_p = index;
    return KVF_OK;
}

void kvf_index_destroy(kvf_index_t *index)
{
    if (index == NULL) {
        return;
    }
    free(index->is_done);
    free(index->matched);
    free(index->chosen);
    free(index->packed);
    free(index->keys);
    free(index->digests);
    free(index->tokens);
    free(index);
}

/* ---- a small JSON reader: one object of known fields, in place ------- */

typedef struct kvf_json {
    const char *p;
    const char *end;
    bool is_bad;
} kvf_json_t;

static void kvf_json_ws(kvf_json_t *j)
{
    while ((j->p < j->end) && ((*j->p == ' ') || (*j->p == '\t') ||
                               (*j->p == '\n') || (*j->p == '\r'))) {
        j->p++;
    }
}

/* Consumes @p c (after blanks); false, and nothing consumed, otherwise. */
static bool kvf_json_eat(kvf_json_t *j, char c)
{
    kvf_json_ws(j);
    if ((j->p < j->end) && (*j->p == c)) {
        j->p++;
        return true;
    }
    return false;
}

static bool kvf_json_fail(kvf_json_t *j)
{
    j->is_bad = true;
    return false;
}

/* A string into @p out (escapes decoded; \u above 0x7f becomes '?').
 * Too long for @p cap is an error. */
static bool kvf_json_string(kvf_json_t *j, char *out, size_t cap)
{
    size_t n = 0;

    if (!kvf_json_eat(j, '"')) {
        return kvf_json_fail(j);
    }
    while (j->p < j->end) {
        char c = *j->p++;

        if (c == '"') {
            out[n] = '\0';
            return true;
        }
        if ((unsigned char)c < 0x20) {
            return kvf_json_fail(j);
        }
        if (c == '\\') {
            if (j->p >= j->end) {
                return kvf_json_fail(j);
            }
            c = *j->p++;
            switch (c) {
            case 'b':
                c = '\b';
                break;
            case 'f':
                c = '\f';
                break;
            case 'n':
                c = '\n';
                break;
            case 'r':
                c = '\r';
                break;
            case 't':
                c = '\t';
                break;
            case 'u': {
                unsigned v = 0, k;

                if (j->end - j->p < 4) {
                    return kvf_json_fail(j);
                }
                for (k = 0; k < 4; k++) {
                    char h = *j->p++;

                    v <<= 4;
                    if ((h >= '0') && (h <= '9')) {
                        v |= (unsigned)(h - '0');
                    } else if ((h >= 'a') && (h <= 'f')) {
                        v |= (unsigned)(h - 'a' + 10);
                    } else if ((h >= 'A') && (h <= 'F')) {
                        v |= (unsigned)(h - 'A' + 10);
                    } else {
                        return kvf_json_fail(j);
                    }
                }
                c = ((v > 0) && (v < 0x80)) ? (char)v : '?';
                break;
            }
            case '"':
            case '\\':
            case '/':
                break;
            default:
                return kvf_json_fail(j);
            }
        }
        if (n + 1 >= cap) {
            return kvf_json_fail(j);
        }
        out[n++] = c;
    }
    return kvf_json_fail(j);
}

/* A non-negative integer up to @p max. */
static bool kvf_json_uint(kvf_json_t *j, uint64_t max, uint64_t *v_p)
{
    uint64_t v = 0;
    const char *start;

    kvf_json_ws(j);
    start = j->p;
    while ((j->p < j->end) && (*j->p >= '0') && (*j->p <= '9')) {
        uint64_t d = (uint64_t)(*j->p - '0');

        if (v > (max - d) / 10) {
            return kvf_json_fail(j);
        }
        v = v * 10 + d;
        j->p++;
    }
    if ((j->p == start) ||
        ((j->p < j->end) && ((*j->p == '.') || (*j->p == 'e') ||
                             (*j->p == 'E') || (*j->p == '-')))) {
        return kvf_json_fail(j);
    }
    *v_p = v;
    return true;
}

/* Skips any value, nesting at most 16 deep. */
static bool kvf_json_skip(kvf_json_t *j, int depth)
{
    char tmp[256];

    kvf_json_ws(j);
    if ((j->p >= j->end) || (depth > 16)) {
        return kvf_json_fail(j);
    }
    switch (*j->p) {
    case '"':
        /* long strings are skipped in pieces */
        j->p++;
        while ((j->p < j->end) && (*j->p != '"')) {
            j->p += (*j->p == '\\') ? 2 : 1;
        }
        if (j->p >= j->end) {
            return kvf_json_fail(j);
        }
        j->p++;
        return true;
    case '{':
    case '[': {
        char close  = (*j->p == '{') ? '}' : ']';
        bool is_obj = (*j->p == '{');

        j->p++;
        if (kvf_json_eat(j, close)) {
            return true;
        }
        do {
            if (is_obj && (!kvf_json_string(j, tmp, sizeof(tmp)) ||
                           !kvf_json_eat(j, ':'))) {
                return kvf_json_fail(j);
            }
            if (!kvf_json_skip(j, depth + 1)) {
                return false;
            }
        } while (kvf_json_eat(j, ','));
        return kvf_json_eat(j, close) || kvf_json_fail(j);
    }
    default:
        while ((j->p < j->end) && (strchr(",}] \t\r\n", *j->p) == NULL)) {
            j->p++; /* a number, true, false, null */
        }
        return true;
    }
}

/* ---- requests --------------------------------------------------------- */

/* The fields any index request may carry. */
typedef struct kvf_index_req {
    char model[KVF_NODE_NAME_MAX];
    char dtype[16];
    char instance_id[KVF_NODE_NAME_MAX];
    uint64_t block_size;
    uint64_t num_layers;
    uint64_t num_kv_heads;
    uint64_t head_dim;
    uint64_t tp_world;
    uint64_t tp_rank;
    size_t num_tokens;
    size_t num_digests;
    bool has_tokens;
    bool has_digests;
} kvf_index_req_t;

static bool kvf_index_parse_tokens(kvf_index_t *index, kvf_json_t *j,
                                   kvf_index_req_t *r)
{
    uint64_t v;

    r->has_tokens = true;
    if (!kvf_json_eat(j, '[')) {
        return kvf_json_fail(j);
    }
    if (kvf_json_eat(j, ']')) {
        return true;
    }
    do {
        if ((r->num_tokens == KVF_INDEX_MAX_TOKENS) ||
            !kvf_json_uint(j, UINT32_MAX, &v)) {
            return kvf_json_fail(j);
        }
        index->tokens[r->num_tokens++] = (uint32_t)v;
    } while (kvf_json_eat(j, ','));
    return kvf_json_eat(j, ']') || kvf_json_fail(j);
}

/* Digests as 32 hex digits (the 128-bit chunk digest, hi then lo: the
 * second half of kvf_key_format()'s form, which is also accepted). */
static bool kvf_index_parse_digests(kvf_index_t *index, kvf_json_t *j,
                                    kvf_index_req_t *r)
{
    char text[64];

    r->has_digests = true;
    if (!kvf_json_eat(j, '[')) {
        return kvf_json_fail(j);
    }
    if (kvf_json_eat(j, ']')) {
        return true;
    }
    do {
        kvf_key_t key;
        const char *hex;
        char full[KVF_KEY_STR_SIZE];

        if ((r->num_digests == index->max_keys) ||
            !kvf_json_string(j, text, sizeof(text))) {
            return kvf_json_fail(j);
        }
        hex = strchr(text, ':');
        hex = (hex != NULL) ? hex + 1 : text;
        if (strlen(hex) != 32) {
            return kvf_json_fail(j);
        }
        snprintf(full, sizeof(full), "0000000000000000:%s", hex);
        if (kvf_key_parse(full, &key) != KVF_OK) {
            return kvf_json_fail(j);
        }
        index->digests[r->num_digests++] = key;
    } while (kvf_json_eat(j, ','));
    return kvf_json_eat(j, ']') || kvf_json_fail(j);
}

static bool kvf_index_parse(kvf_index_t *index, const char *body, size_t len,
                            kvf_index_req_t *r)
{
    kvf_json_t j = {.p = body, .end = body + len};
    char name[64];

    memset(r, 0, sizeof(*r));
    r->tp_world = 1;
    if (!kvf_json_eat(&j, '{')) {
        return false;
    }
    if (kvf_json_eat(&j, '}')) {
        return true;
    }
    do {
        bool ok;

        if (!kvf_json_string(&j, name, sizeof(name)) ||
            !kvf_json_eat(&j, ':')) {
            return false;
        }
        if ((strcmp(name, "model") == 0) || (strcmp(name, "modelname") == 0)) {
            ok = kvf_json_string(&j, r->model, sizeof(r->model));
        } else if (strcmp(name, "dtype") == 0) {
            ok = kvf_json_string(&j, r->dtype, sizeof(r->dtype));
        } else if (strcmp(name, "instance_id") == 0) {
            ok = kvf_json_string(&j, r->instance_id, sizeof(r->instance_id));
        } else if (strcmp(name, "block_size") == 0) {
            ok = kvf_json_uint(&j, 1u << 20, &r->block_size);
        } else if (strcmp(name, "num_layers") == 0) {
            ok = kvf_json_uint(&j, 1u << 20, &r->num_layers);
        } else if (strcmp(name, "num_kv_heads") == 0) {
            ok = kvf_json_uint(&j, 1u << 20, &r->num_kv_heads);
        } else if (strcmp(name, "head_dim") == 0) {
            ok = kvf_json_uint(&j, 1u << 20, &r->head_dim);
        } else if (strcmp(name, "tp_world") == 0) {
            ok = kvf_json_uint(&j, KVF_INDEX_MAX_TP, &r->tp_world);
        } else if (strcmp(name, "tp_rank") == 0) {
            ok = kvf_json_uint(&j, KVF_INDEX_MAX_TP, &r->tp_rank);
        } else if (strcmp(name, "token_ids") == 0) {
            ok = kvf_index_parse_tokens(index, &j, r);
        } else if ((strcmp(name, "seq_hashes") == 0) ||
                   (strcmp(name, "block_hash") == 0) ||
                   (strcmp(name, "chunk_digests") == 0)) {
            ok = kvf_index_parse_digests(index, &j, r);
        } else {
            ok = kvf_json_skip(&j, 0);
        }
        if (!ok) {
            return false;
        }
    } while (kvf_json_eat(&j, ','));
    if (!kvf_json_eat(&j, '}')) {
        return false;
    }
    kvf_json_ws(&j);
    return !j.is_bad && (j.p == j.end);
}

/* ---- handlers --------------------------------------------------------- */

static void kvf_index_error(struct evhttp_request *req, int code,
                            const char *reason, const char *text)
{
    struct evbuffer *b = evbuffer_new();

    if (b == NULL) {
        evhttp_send_error(req, HTTP_INTERNAL, NULL);
        return;
    }
    evbuffer_add_printf(b, "{\"error\":");
    kvf_evjson_add_str(b, text);
    evbuffer_add_printf(b, "}\n");
    evhttp_add_header(evhttp_request_get_output_headers(req), "Content-Type",
                      "application/json");
    evhttp_send_reply(req, code, reason, b);
    evbuffer_free(b);
}

/* Parses the body of @p req into @p r; answers 400 and returns false when
 * it is not a JSON object of the expected fields. */
static bool kvf_index_read(kvf_index_t *index, struct evhttp_request *req,
                           kvf_index_req_t *r)
{
    struct evbuffer *in = evhttp_request_get_input_buffer(req);
    size_t len          = evbuffer_get_length(in);
    const char *body    = (const char *)evbuffer_pullup(in, -1);

    if ((body == NULL) && (len > 0)) {
        evhttp_send_error(req, HTTP_INTERNAL, NULL);
        return false;
    }
    if (!kvf_index_parse(index, (body != NULL) ? body : "", len, r)) {
        kvf_index_error(req, HTTP_BADREQUEST, "Bad Request",
                        "body: want one JSON object of the documented fields "
                        "(docs/integration-routers.md)");
        return false;
    }
    return true;
}

static kvf_index_model_t *kvf_index_model_find(kvf_index_t *index,
                                               const char *name)
{
    uint32_t i;

    for (i = 0; i < index->num_models; i++) {
        if (strcmp(index->models[i].name, name) == 0) {
            return &index->models[i];
        }
    }
    return NULL;
}

static const struct {
    const char *name;
    kvf_dtype_t dtype;
} kvf_index_dtypes[] = {
    {"fp16", KVF_DTYPE_FP16}, {"float16", KVF_DTYPE_FP16},
    {"bf16", KVF_DTYPE_BF16}, {"bfloat16", KVF_DTYPE_BF16},
    {"fp32", KVF_DTYPE_FP32}, {"float32", KVF_DTYPE_FP32},
    {"fp8", KVF_DTYPE_FP8},
};

static void kvf_index_model_json(struct evbuffer *b, const kvf_index_model_t *m)
{
    uint32_t r;

    evbuffer_add_printf(b, "{\"model\":");
    kvf_evjson_add_str(b, m->name);
    evbuffer_add_printf(b,
                        ",\"block_size\":%" PRIu32 ",\"tp_world\":%" PRIu32
                        ",\"namespaces\":[",
                        m->chunk_size, m->tp_world);
    for (r = 0; r < m->tp_world; r++) {
        evbuffer_add_printf(b, "%s\"%016" PRIx64 "\"", (r > 0) ? "," : "",
                            m->ns[r]);
    }
    evbuffer_add_printf(b, "]}");
}

/* POST: registers (or replaces) a model namespace; GET: lists them. */
static void kvf_index_on_models(struct evhttp_request *req, void *arg)
{
    kvf_index_t *index = arg;
    kvf_namespace_params_t p;
    kvf_index_model_t model, *slot;
    kvf_index_req_t r;
    struct evbuffer *b;
    uint32_t i;

    if (!kvf_http_begin(index->http, req, "/v1/index/models",
                        EVHTTP_REQ_GET | EVHTTP_REQ_POST)) {
        return;
    }
    b = evbuffer_new();
    if (b == NULL) {
        evhttp_send_error(req, HTTP_INTERNAL, NULL);
        return;
    }
    if (evhttp_request_get_command(req) == EVHTTP_REQ_GET) {
        evbuffer_add_printf(b, "{\"models\":[");
        for (i = 0; i < index->num_models; i++) {
            evbuffer_add_printf(b, "%s", (i > 0) ? "," : "");
            kvf_index_model_json(b, &index->models[i]);
        }
        evbuffer_add_printf(b, "]}\n");
        kvf_http_reply(req, b, "application/json");
        evbuffer_free(b);
        return;
    }
    evbuffer_free(b);
    if (!kvf_index_read(index, req, &r)) {
        return;
    }
    memset(&p, 0, sizeof(p));
    p.field_mask = KVF_NAMESPACE_FIELD_MODEL_ID | KVF_NAMESPACE_FIELD_DTYPE |
                   KVF_NAMESPACE_FIELD_NUM_LAYERS |
                   KVF_NAMESPACE_FIELD_NUM_KV_HEADS |
                   KVF_NAMESPACE_FIELD_HEAD_DIM | KVF_NAMESPACE_FIELD_TP |
                   KVF_NAMESPACE_FIELD_CHUNK_SIZE;
    p.model_id     = r.model;
    p.num_layers   = (uint32_t)r.num_layers;
    p.num_kv_heads = (uint32_t)r.num_kv_heads;
    p.head_dim     = (uint32_t)r.head_dim;
    p.tp_world     = (uint32_t)r.tp_world;
    p.chunk_size   = (uint32_t)r.block_size;
    for (i = 0; i < sizeof(kvf_index_dtypes) / sizeof(kvf_index_dtypes[0]);
         i++) {
        if (strcmp(r.dtype, kvf_index_dtypes[i].name) == 0) {
            p.dtype = kvf_index_dtypes[i].dtype;
        }
    }
    memset(&model, 0, sizeof(model));
    snprintf(model.name, sizeof(model.name), "%s", r.model);
    model.chunk_size = p.chunk_size;
    model.tp_world   = p.tp_world;
    for (i = 0; i < p.tp_world; i++) {
        p.tp_rank = i;
        if ((r.model[0] == '\0') || (p.dtype == 0) || (p.chunk_size == 0) ||
            (kvf_namespace_fingerprint(&p, &model.ns[i]) != KVF_OK)) {
            kvf_index_error(req, HTTP_BADREQUEST, "Bad Request",
                            "a model needs model, dtype (fp16, bf16, fp32, "
                            "fp8), num_layers, num_kv_heads, head_dim, "
                            "block_size and tp_world (default 1), as its "
                            "engines describe their namespace");
            return;
        }
    }
    slot = kvf_index_model_find(index, model.name);
    if ((slot == NULL) && (index->num_models == KVF_INDEX_MAX_MODELS)) {
        kvf_index_error(req, 507, "Insufficient Storage",
                        "too many models registered");
        return;
    }
    if (slot == NULL) {
        slot = &index->models[index->num_models++];
    }
    *slot = model;
    kvf_info("index: model %s registered (block size %" PRIu32 ", tp %" PRIu32
             ", namespace %016" PRIx64 ")",
             model.name, model.chunk_size, model.tp_world, model.ns[0]);
    b = evbuffer_new();
    if (b == NULL) {
        evhttp_send_error(req, HTTP_INTERNAL, NULL);
        return;
    }
    evbuffer_add_printf(b, "{\"status\":\"registered successfully\","
                           "\"model\":");
    kvf_index_model_json(b, slot);
    evbuffer_add_printf(b, "}\n");
    kvf_http_reply(req, b, "application/json");
    evbuffer_free(b);
}

/* Can @p node hold keys of rank @p rank of @p m? */
static bool kvf_index_node_fits(const kvf_node_t *node,
                                const kvf_index_model_t *m, uint32_t rank)
{
    uint32_t world = (node->tp_world > 0) ? node->tp_world : 1;

    return (node->state == KVF_NODE_ALIVE) && (node->slot != 0) &&
           (world == m->tp_world) && (node->tp_rank == rank);
}

/*
 * Fills index->matched[slot] with the chunks each alive node of @p m holds
 * from the start of the request's chain: the keys of each TP rank are
 * looked up once (the cluster's longest prefix bounds every node's), then
 * each node of that rank is checked key by key up to that bound. Returns
 * the chunks in the request (0 with @p err set when it is unusable).
 */
static size_t kvf_index_match(kvf_index_t *index, const kvf_index_model_t *m,
                              const kvf_index_req_t *r, const char **err)
{
    size_t n = 0, i, hit, node_i, count = kvf_node_table_count(index->nodes);
    uint32_t rank;

    for (node_i = 0; node_i < count; node_i++) {
        kvf_node_t *node = kvf_node_table_at(index->nodes, node_i);

        index->matched[node->slot] = 0;
    }
    for (rank = 0; rank < m->tp_world; rank++) {
        if (r->has_digests && (rank != r->tp_rank)) {
            continue; /* digests are of one rank's chain */
        }
        if (r->has_digests) {
            n = r->num_digests;
            for (i = 0; i < n; i++) {
                index->keys[i]    = index->digests[i];
                index->keys[i].ns = m->ns[rank];
            }
        } else if (kvf_key_chain(m->ns[rank], index->tokens, r->num_tokens,
                                 m->chunk_size, false, index->keys,
                                 index->max_keys, &n) != KVF_OK) {
            *err = "more chunks than max_batch";
            return 0;
        }
        if (n == 0) {
            break;
        }
        for (i = 0; i < n; i++) {
            kvf_key_pack(&index->keys[i],
                         index->packed + i * KVF_KEY_WIRE_SIZE);
        }
        if (kvf_registry_lookup(index->reg, index->packed, n, 0, false,
                                index->chosen, &hit) != KVF_OK) {
            *err = "more chunks than max_batch";
            return 0;
        }
        for (node_i = 0; (hit > 0) && (node_i < count); node_i++) {
            kvf_node_t *node = kvf_node_table_at(index->nodes, node_i);
            size_t k         = 0;

            if (!kvf_index_node_fits(node, m, rank)) {
                continue;
            }
            while ((k < hit) && kvf_registry_holds(index->reg, &index->keys[k],
                                                   node->slot)) {
                k++;
            }
            index->matched[node->slot] = (uint32_t)k;
        }
    }
    return n;
}

/* What an instance (the nodes sharing an instance_id, or one node without
 * one) holds: the prefix every one of its TP ranks holds. */
typedef struct kvf_index_group {
    const kvf_node_t *first;
    uint32_t matched; /* chunks */
    uint32_t ranks;   /* distinct nodes seen */
    uint64_t pool_used;
    uint64_t pool_capacity;
} kvf_index_group_t;

static const char *kvf_index_node_instance(const kvf_node_t *node)
{
    return (node->instance_id[0] != '\0') ? node->instance_id : node->name;
}

/* Groups the nodes from @p *from on into the next instance; false when
 * none is left. Nodes of other models are skipped. */
static bool kvf_index_next_group(kvf_index_t *index, const kvf_index_model_t *m,
                                 size_t *from, kvf_index_group_t *g)
{
    size_t count = kvf_node_table_count(index->nodes), i;

    for (; *from < count; (*from)++) {
        kvf_node_t *node = kvf_node_table_at(index->nodes, *from);

        if (!index->is_done[node->slot] &&
            kvf_index_node_fits(node, m, node->tp_rank)) {
            break;
        }
    }
    if (*from == count) {
        return false;
    }
    memset(g, 0, sizeof(*g));
    g->first   = kvf_node_table_at(index->nodes, *from);
    g->matched = UINT32_MAX;
    for (i = *from; i < count; i++) {
        kvf_node_t *node = kvf_node_table_at(index->nodes, i);

        if (index->is_done[node->slot] ||
            !kvf_index_node_fits(node, m, node->tp_rank) ||
            (strcmp(kvf_index_node_instance(node),
                    kvf_index_node_instance(g->first)) != 0)) {
            continue;
        }
        index->is_done[node->slot] = 1;
        g->ranks++;
        g->pool_used += node->pool_used;
        g->pool_capacity += node->pool_capacity;
        if (index->matched[node->slot] < g->matched) {
            g->matched = index->matched[node->slot];
        }
    }
    if (g->ranks < m->tp_world) {
        g->matched = 0; /* a rank is missing: nothing is servable */
    }
    return true;
}

static void kvf_index_groups_reset(kvf_index_t *index)
{
    size_t i, count = kvf_node_table_count(index->nodes);

    for (i = 0; i < count; i++) {
        index->is_done[kvf_node_table_at(index->nodes, i)->slot] = 0;
    }
}

/* Parses a query or route request and matches it; answers the errors.
 * Returns the model, or NULL when answered already. */
static const kvf_index_model_t *
kvf_index_prepare(kvf_index_t *index, struct evhttp_request *req,
                  const char *path, kvf_index_req_t *r, size_t *chunks_p)
{
    const kvf_index_model_t *m;
    const char *err = NULL;

    if (!kvf_http_begin(index->http, req, path, EVHTTP_REQ_POST) ||
        !kvf_index_read(index, req, r)) {
        return NULL;
    }
    m = kvf_index_model_find(index, r->model);
    if (m == NULL) {
        kvf_index_error(req, HTTP_NOTFOUND, "Not Found",
                        "model not registered (POST /v1/index/models)");
        return NULL;
    }
    if ((r->block_size != 0) && (r->block_size != m->chunk_size)) {
        kvf_index_error(req, HTTP_BADREQUEST, "Bad Request",
                        "block_size differs from the model's");
        return NULL;
    }
    if (r->has_tokens == r->has_digests) {
        kvf_index_error(req, HTTP_BADREQUEST, "Bad Request",
                        "give token_ids or seq_hashes, not both");
        return NULL;
    }
    if (r->tp_rank >= m->tp_world) {
        kvf_index_error(req, HTTP_BADREQUEST, "Bad Request",
                        "tp_rank out of range");
        return NULL;
    }
    *chunks_p = kvf_index_match(index, m, r, &err);
    if (err != NULL) {
        kvf_index_error(req, 413, "Payload Too Large", err);
        return NULL;
    }
    return m;
}

/* Counts a query or route answered since @p t0 (ns) in the
 * kvf_controller_index_request_seconds histogram. */
static void kvf_index_observe(kvf_index_t *index, uint64_t t0)
{
    kvf_server_latency_observe(&index->latency, kvf_time_now_ns() - t0);
}

static void kvf_index_on_query(struct evhttp_request *req, void *arg)
{
    kvf_index_t *index = arg;
    const kvf_index_model_t *m;
    kvf_index_req_t r;
    kvf_index_group_t g;
    size_t chunks = 0, from = 0, i, count;
    struct evbuffer *b;
    bool is_first = true;
    uint64_t t0   = kvf_time_now_ns();

    m = kvf_index_prepare(index, req, "/v1/index/query", &r, &chunks);
    if (m == NULL) {
        return;
    }
    b = evbuffer_new();
    if (b == NULL) {
        evhttp_send_error(req, HTTP_INTERNAL, NULL);
        return;
    }
    /* Mooncake's shape: tenant -> instance -> figures, nothing else at
     * the top, so clients iterating tenants see only tenants */
    evbuffer_add_printf(b, "{\"default\":{");
    count = kvf_node_table_count(index->nodes);
    while (kvf_index_next_group(index, m, &from, &g)) {
        const char *inst   = kvf_index_node_instance(g.first);
        uint64_t tokens    = (uint64_t)g.matched * m->chunk_size;
        bool is_first_node = true;

        if ((r.instance_id[0] != '\0') && (strcmp(inst, r.instance_id) != 0)) {
            continue;
        }
        evbuffer_add_printf(b, "%s", is_first ? "" : ",");
        is_first = false;
        kvf_evjson_add_str(b, inst);
        evbuffer_add_printf(b,
                            ":{\"longest_matched\":%" PRIu64 ",\"CPU\":%" PRIu64
                            ",\"query_tokens\":%" PRIu64 ",\"nodes\":{",
                            tokens, tokens, (uint64_t)chunks * m->chunk_size);
        for (i = 0; i < count; i++) {
            const kvf_node_t *node = kvf_node_table_at(index->nodes, i);

            if (!kvf_index_node_fits(node, m, node->tp_rank) ||
                (strcmp(kvf_index_node_instance(node), inst) != 0)) {
                continue;
            }
            evbuffer_add_printf(b, "%s", is_first_node ? "" : ",");
            is_first_node = false;
            kvf_evjson_add_str(b, node->name);
            evbuffer_add_printf(b, ":%" PRIu64,
                                (uint64_t)index->matched[node->slot] *
                                    m->chunk_size);
        }
        evbuffer_add_printf(b, "}}");
    }
    kvf_index_groups_reset(index);
    evbuffer_add_printf(b, "}}\n");
    kvf_http_reply(req, b, "application/json");
    evbuffer_free(b);
    kvf_index_observe(index, t0);
}

/* The instance with the longest cached prefix; among equals the one whose
 * pools are least used. 404 when no node of the model is alive. */
static void kvf_index_on_route(struct evhttp_request *req, void *arg)
{
    kvf_index_t *index = arg;
    const kvf_index_model_t *m;
    kvf_index_req_t r;
    kvf_index_group_t g, best = {0};
    size_t chunks = 0, from = 0;
    struct evbuffer *b;
    bool has_best = false;
    uint64_t t0   = kvf_time_now_ns();

    m = kvf_index_prepare(index, req, "/v1/route", &r, &chunks);
    if (m == NULL) {
        return;
    }
    while (kvf_index_next_group(index, m, &from, &g)) {
        /* load in thousandths of the pools, compared without division */
        if (!has_best || (g.matched > best.matched) ||
            ((g.matched == best.matched) &&
             (g.pool_used * (best.pool_capacity + 1) <
              best.pool_used * (g.pool_capacity + 1)))) {
            best     = g;
            has_best = true;
        }
    }
    kvf_index_groups_reset(index);
    if (!has_best) {
        kvf_index_error(req, HTTP_NOTFOUND, "Not Found",
                        "no alive node serves this model");
        return;
    }
    b = evbuffer_new();
    if (b == NULL) {
        evhttp_send_error(req, HTTP_INTERNAL, NULL);
        return;
    }
    evbuffer_add_printf(b, "{\"instance_id\":");
    kvf_evjson_add_str(b, kvf_index_node_instance(best.first));
    evbuffer_add_printf(b, ",\"node\":");
    kvf_evjson_add_str(b, best.first->name);
    evbuffer_add_printf(b,
                        ",\"node_id\":%" PRIu32 ",\"matched_tokens\":%" PRIu64
                        ",\"query_blocks\":%zu,\"pool_used\":%" PRIu64
                        ",\"pool_capacity\":%" PRIu64 "}\n",
                        best.first->id, (uint64_t)best.matched * m->chunk_size,
                        chunks, best.pool_used, best.pool_capacity);
    kvf_http_reply(req, b, "application/json");
    evbuffer_free(b);
    kvf_index_observe(index, t0);
}

uint32_t kvf_index_block_size(const kvf_index_t *index, uint64_t ns)
{
    uint32_t i, r;

    for (i = 0; i < index->num_models; i++) {
        for (r = 0; r < index->models[i].tp_world; r++) {
            if (index->models[i].ns[r] == ns) {
                return index->models[i].chunk_size;
            }
        }
    }
    return 0;
}

void kvf_index_http_start(kvf_index_t *index, kvf_http_t *http,
                          kvf_node_table_t *nodes, kvf_registry_t *reg)
{
    index->http  = http;
    index->nodes = nodes;
    index->reg   = reg;
    kvf_http_route(http, "/v1/index/models", kvf_index_on_models, index);
    kvf_http_route(http, "/v1/index/query", kvf_index_on_query, index);
    kvf_http_route(http, "/v1/route", kvf_index_on_route, index);
}

const kvf_server_latency_t *kvf_index_latency(const kvf_index_t *index)
{
    return &index->latency;
}
