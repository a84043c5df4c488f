/* SPDX-License-Identifier: Apache-2.0 */
/* Copyright (c) 2026 The kvfabric authors */
/*
 * The KV index for routers (docs/integration-routers.md) on a real
 * kvf-controller: a model namespace registered over HTTP, three nodes
 * holding different prefixes of one prompt (admitted with the keys
 * engines compute), then per-instance longest prefixes by token ids and
 * by chunk digests, the route choice, and the errors.
 */
#include "tests/helpers/proc.h"
#include "tests/helpers/test_helpers.h"
#include "tests/integration/controller_harness.h"

#include <kvfabric/keys.h>

#include <criterion/criterion.h>

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define BLOCK  16
#define TOKENS 69 /* 4 whole blocks and a partial one */

static kvf_th_ctl_t g_ctl;
static char g_body[1 << 16], g_req[1 << 14];
static uint32_t g_tokens[TOKENS];
static kvf_key_t g_keys[8];
static uint64_t g_ns;

static void teardown(void)
{
    if (g_ctl.pid > 0) {
        cr_expect_eq(kvf_th_ctl_stop(&g_ctl), 0, "clean exit, no leak");
    }
    kvf_test_check_leaks();
}

TestSuite(index, .fini = teardown, .timeout = 120);

static uint16_t http_port(void)
{
    return (uint16_t)atoi(strrchr(g_ctl.http, ':') + 1);
}

static int post(const char *path, const char *body)
{
    return kvf_test_http_request(http_port(), "POST", path, NULL, body, g_body,
                                 sizeof(g_body));
}

/* REGISTER as @p name of instance @p instance; returns the node id. */
static uint32_t register_node(kvf_ctlconn_t *conn, const char *name,
                              const char *instance)
{
    return kvf_th_register_in(conn, name, instance, 1, NULL);
}

/* ADMIT of the prompt's chunks whose bit is set in @p mask. */
static void admit(kvf_ctlconn_t *conn, uint32_t node, unsigned mask)
{
    uint8_t packed[8 * KVF_KEY_WIRE_SIZE];
    Kvf__KeyBatch kb;
    kvf_frame_t frame;
    size_t n = 0, i;

    for (i = 0; i < 4; i++) {
        if (mask & (1u << i)) {
            kvf_key_pack(&g_keys[i], packed + n++ * KVF_KEY_WIRE_SIZE);
        }
    }
    kvf__key_batch__init(&kb);
    kb.request_id  = kvf_ctlconn_next_id(conn);
    kb.node_id     = node;
    kb.incarnation = 1;
    kb.seq         = 1;
    kb.keys.data   = packed;
    kb.keys.len    = n * KVF_KEY_WIRE_SIZE;
    cr_assert_eq(kvf_ctlconn_call(conn, KVF_MSG_ADMIT, &kb.base, &frame),
                 KVF_OK);
    cr_assert_eq(frame.type, KVF_MSG_STATUS);
    cr_assert_eq(((Kvf__Status *)frame.msg)->status, KVF_OK);
    kvf_frame_release(&frame, NULL);
}

/* The namespace engines of this model compute. */
static void model_keys(void)
{
    kvf_namespace_params_t p = {
        .field_mask =
            KVF_NAMESPACE_FIELD_MODEL_ID | KVF_NAMESPACE_FIELD_DTYPE |
            KVF_NAMESPACE_FIELD_NUM_LAYERS | KVF_NAMESPACE_FIELD_NUM_KV_HEADS |
            KVF_NAMESPACE_FIELD_HEAD_DIM | KVF_NAMESPACE_FIELD_CHUNK_SIZE,
        .model_id     = "org/model-7b",
        .dtype        = KVF_DTYPE_BF16,
        .num_layers   = 2,
        .num_kv_heads = 2,
        .head_dim     = 64,
        .chunk_size   = BLOCK};
    size_t n, i;

    cr_assert_eq(kvf_namespace_fingerprint(&p, &g_ns), KVF_OK);
    for (i = 0; i < TOKENS; i++) {
        g_tokens[i] = (uint32_t)(1000 + 7 * i);
    }
    cr_assert_eq(
        kvf_key_chain(g_ns, g_tokens, TOKENS, BLOCK, false, g_keys, 8, &n),
        KVF_OK);
    cr_assert_eq(n, 4);
}

static const char *tokens_json(size_t n)
{
    static char text[4096];
    size_t used = 0, i;

    for (i = 0; i < n; i++) {
        used += (size_t)snprintf(text + used, sizeof(text) - used, "%s%" PRIu32,
                                 (i > 0) ? "," : "", g_tokens[i]);
    }
    return text;
}

/* Three instances: ia holds chunks 0-3, ib 0-1, ic 0 and 2 (a gap). */
static void setup_cluster(kvf_ctlconn_t **conn_p)
{
    char ns[32];
    kvf_ctlconn_t *conn;

    kvf_th_ctl_start(&g_ctl, NULL);
    model_keys();
    cr_assert_eq(post("/v1/index/models",
                      "{\"model\": \"org/model-7b\", \"dtype\": \"bf16\", "
                      "\"num_layers\": 2, \"num_kv_heads\": 2, "
                      "\"head_dim\": 64, \"block_size\": 16, "
                      "\"lora_name\": null, \"extra\": {\"a\": [1, \"x\"]}}"),
                 200, "%s", g_body);
    snprintf(ns, sizeof(ns), "\"%016" PRIx64 "\"", g_ns);
    cr_assert_not_null(strstr(g_body, ns), "engines' namespace %s: %s", ns,
                       g_body);
    conn = kvf_th_connect(&g_ctl, KVF__PEER_KIND__PEER_AGENT);
    admit(conn, register_node(conn, "node-a", "ia"), 0xf);
    admit(conn, register_node(conn, "node-b", "ib"), 0x3);
    admit(conn, register_node(conn, "node-c", "ic"), 0x5);
    *conn_p = conn;
}

Test(index, longest_prefix_per_instance)
{
    kvf_ctlconn_t *conn;

    setup_cluster(&conn);
    snprintf(g_req, sizeof(g_req),
             "{\"model\":\"org/model-7b\",\"block_size\":16,"
             "\"token_ids\":[%s]}",
             tokens_json(TOKENS));
    cr_assert_eq(post("/v1/index/query", g_req), 200, "%s", g_body);
    cr_assert_eq(strncmp(g_body, "{\"default\":{", 12), 0, "%s", g_body);
    cr_assert_not_null(strstr(g_body, "\"query_tokens\":64,"), "%s", g_body);
    cr_assert_not_null(strstr(g_body, "\"ia\":{\"longest_matched\":64,"), "%s",
                       g_body);
    cr_assert_not_null(strstr(g_body, "\"ib\":{\"longest_matched\":32,"), "%s",
                       g_body);
    cr_assert_not_null(strstr(g_body, "\"ic\":{\"longest_matched\":16,"), "%s",
                       g_body);
    cr_assert_not_null(strstr(g_body, "\"nodes\":{\"node-a\":64}"), "%s",
                       g_body);

    /* a prompt diverging in its second block */
    g_tokens[20]++;
    snprintf(g_req, sizeof(g_req),
             "{\"model\":\"org/model-7b\",\"token_ids\":[%s]}",
             tokens_json(TOKENS));
    cr_assert_eq(post("/v1/index/query", g_req), 200, "%s", g_body);
    cr_assert_not_null(strstr(g_body, "\"ia\":{\"longest_matched\":16,"), "%s",
                       g_body);

    /* one instance only */
    snprintf(g_req, sizeof(g_req),
             "{\"model\":\"org/model-7b\",\"instance_id\":\"ib\","
             "\"token_ids\":[%s]}",
             tokens_json(TOKENS));
    cr_assert_eq(post("/v1/index/query", g_req), 200, "%s", g_body);
    cr_assert_null(strstr(g_body, "\"ia\""), "%s", g_body);
    cr_assert_not_null(strstr(g_body, "\"ib\":{\"longest_matched\":16,"), "%s",
                       g_body);
    kvf_ctlconn_destroy(conn);
}

Test(index, by_chunk_digests)
{
    char a[KVF_KEY_STR_SIZE], b[KVF_KEY_STR_SIZE], c[KVF_KEY_STR_SIZE];
    kvf_ctlconn_t *conn;

    setup_cluster(&conn);
    kvf_key_format(&g_keys[0], a);
    kvf_key_format(&g_keys[1], b);
    kvf_key_format(&g_keys[2], c);
    /* the digest alone (after the "ns:"), or the whole key form */
    snprintf(g_req, sizeof(g_req),
             "{\"model\":\"org/model-7b\",\"seq_hashes\":[\"%s\",\"%s\","
             "\"%s\"]}",
             strchr(a, ':') + 1, b, strchr(c, ':') + 1);
    cr_assert_eq(post("/v1/index/query", g_req), 200, "%s", g_body);
    cr_assert_not_null(strstr(g_body, "\"ia\":{\"longest_matched\":48,"), "%s",
                       g_body);
    cr_assert_not_null(strstr(g_body, "\"ib\":{\"longest_matched\":32,"), "%s",
                       g_body);
    cr_assert_not_null(strstr(g_body, "\"ic\":{\"longest_matched\":16,"), "%s",
                       g_body);
    kvf_ctlconn_destroy(conn);
}

Test(index, route_picks_the_longest_prefix)
{
    kvf_ctlconn_t *conn;

    setup_cluster(&conn);
    snprintf(g_req, sizeof(g_req),
             "{\"model\":\"org/model-7b\",\"token_ids\":[%s]}",
             tokens_json(TOKENS));
    cr_assert_eq(post("/v1/route", g_req), 200, "%s", g_body);
    cr_assert_not_null(strstr(g_body, "\"instance_id\":\"ia\""), "%s", g_body);
    cr_assert_not_null(strstr(g_body, "\"node\":\"node-a\""), "%s", g_body);
    cr_assert_not_null(strstr(g_body, "\"matched_tokens\":64"), "%s", g_body);
    kvf_ctlconn_destroy(conn);
}

Test(index, errors)
{
    kvf_ctlconn_t *conn;

    setup_cluster(&conn);
    cr_assert_eq(
        post("/v1/index/query", "{\"model\":\"nope\",\"token_ids\":[1,2]}"),
        404, "%s", g_body);
    cr_assert_eq(post("/v1/index/query", "{\"model\":\"org/model-7b\","), 400);
    cr_assert_eq(post("/v1/index/query",
                      "{\"model\":\"org/model-7b\",\"token_ids\":[1,-2]}"),
                 400);
    cr_assert_eq(post("/v1/index/query",
                      "{\"model\":\"org/model-7b\",\"token_ids\":[1.5]}"),
                 400);
    cr_assert_eq(post("/v1/index/query", "[1,2,3]"), 400);
    cr_assert_eq(post("/v1/index/query",
                      "{\"model\":\"org/model-7b\",\"block_size\":32,"
                      "\"token_ids\":[1]}"),
                 400, "%s", g_body);
    cr_assert_eq(post("/v1/index/query",
                      "{\"model\":\"org/model-7b\",\"token_ids\":[1],"
                      "\"seq_hashes\":[]}"),
                 400);
    cr_assert_eq(post("/v1/index/query",
                      "{\"model\":\"org/model-7b\",\"seq_hashes\":[\"xyz\"]}"),
                 400);
    cr_assert_eq(post("/v1/index/models", "{\"model\":\"m\"}"), 400);
    /* hostile bodies: nesting, unterminated, overflow, long names */
    snprintf(g_req, sizeof(g_req), "{\"x\":%.*s}", 40,
             "[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[");
    cr_assert_eq(post("/v1/index/query", g_req), 400);
    cr_assert_eq(post("/v1/index/query", "{\"model\":\"org/mod"), 400);
    cr_assert_eq(post("/v1/index/query", "{\"model\":\"org/model-7b\","
                                         "\"token_ids\":[99999999999]}"),
                 400);
    cr_assert_eq(post("/v1/index/query", "{\"model\":\"org/model-7b\","
                                         "\"token_ids\":[1,2"),
                 400);
    cr_assert_eq(post("/v1/index/query", "{\"model\":\"a\\u0041\\"), 400);
    memset(g_req, 'x', 300);
    memcpy(g_req, "{\"model\":\"", 10);
    memcpy(g_req + 290, "\",\"token_ids\":[1]}", 18);
    g_req[308] = '\0';
    cr_assert_eq(post("/v1/index/query", g_req), 400);
    cr_assert_eq(post("/v1/index/query",
                      "{\"model\":\"org\\/model-7b\","
                      "\"skip\":{\"a\":[\"\\\"\",null,-1.5e3]},"
                      "\"token_ids\":[]}"),
                 200, "%s", g_body);
    cr_assert_eq(kvf_test_http_get(http_port(), "/v1/index/query", g_body,
                                   sizeof(g_body)),
                 405);
    cr_assert_eq(post("/v1/nodes", ""), 405);
    cr_assert_eq(kvf_test_http_get(http_port(), "/v1/index/models", g_body,
                                   sizeof(g_body)),
                 200);
    cr_assert_not_null(strstr(g_body, "\"model\":\"org/model-7b\""), "%s",
                       g_body);
    /* an empty prompt matches nothing, anywhere */
    cr_assert_eq(post("/v1/index/query",
                      "{\"model\":\"org/model-7b\",\"token_ids\":[]}"),
                 200);
    cr_assert_not_null(strstr(g_body, "\"ia\":{\"longest_matched\":0,"), "%s",
                       g_body);
    kvf_ctlconn_destroy(conn);
}
