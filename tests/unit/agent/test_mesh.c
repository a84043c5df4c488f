/* SPDX-License-Identifier: Apache-2.0 */
/* Copyright (c) 2026 The kvfabric authors */
#include "agent/mesh.h"
#include "tests/helpers/test_helpers.h"

#include <criterion/criterion.h>
#include <event2/event.h>

#include <string.h>

static struct event_base *g_base;
static kvf_ucx_ctx_t *g_ctx;
static kvf_ucx_worker_t *g_worker;
static kvf_mesh_t *g_mesh;

static void mesh_setup(void)
{
    kvf_ucx_ctx_params_t cp = {.field_mask = KVF_UCX_CTX_FIELD_TLS,
                               .tls        = "tcp"};

    g_base = event_base_new();
    cr_assert_not_null(g_base);
    cr_assert_eq(kvf_ucx_ctx_create(&cp, &g_ctx), KVF_OK);
    cr_assert_eq(kvf_ucx_worker_create(g_ctx, g_base, NULL, &g_worker), KVF_OK);
    kvf_mesh_params_t mp = {.base = g_base, .worker = g_worker, .name = "t"};

    cr_assert_eq(kvf_mesh_create(&mp, &g_mesh), KVF_OK);
}

static void mesh_teardown(void)
{
    kvf_ucx_worker_destroy(g_worker);
    kvf_mesh_destroy(g_mesh);
    kvf_ucx_ctx_destroy(g_ctx);
    event_base_free(g_base);
    kvf_test_check_leaks();
}

TestSuite(mesh, .init = mesh_setup, .fini = mesh_teardown, .timeout = 30);

Test(mesh, directory_finds_nodes_by_id_and_by_name)
{
    uint32_t id = 0;

    cr_assert_null(kvf_mesh_node_by_id(g_mesh, 7));
    kvf_mesh_node_store(g_mesh, 7, NULL, "127.0.0.1:7000");
    cr_assert_str_eq(kvf_mesh_node_by_id(g_mesh, 7), "127.0.0.1:7000");
    cr_assert_null(kvf_mesh_node_by_name(g_mesh, "dec", NULL));

    /* a later answer names it: one entry, both ways */
    kvf_mesh_node_store(g_mesh, 7, "dec", "127.0.0.1:7001");
    cr_assert_str_eq(kvf_mesh_node_by_id(g_mesh, 7), "127.0.0.1:7001");
    cr_assert_str_eq(kvf_mesh_node_by_name(g_mesh, "dec", NULL),
                     "127.0.0.1:7001");
    /* an answer by id only keeps the name */
    kvf_mesh_node_store(g_mesh, 7, NULL, "127.0.0.1:7002");
    cr_assert_str_eq(kvf_mesh_node_by_name(g_mesh, "dec", &id),
                     "127.0.0.1:7002");
    cr_assert_eq(id, 7);

    kvf_mesh_node_forget(g_mesh, 0, "dec");
    cr_assert_null(kvf_mesh_node_by_id(g_mesh, 7));
    cr_assert_null(kvf_mesh_node_by_name(g_mesh, "dec", NULL));
}

Test(mesh, directory_keeps_a_bounded_number_of_nodes)
{
    char addr[32];
    uint32_t id;

    for (id = 1; id <= 1000; id++) {
        snprintf(addr, sizeof(addr), "10.0.0.1:%u", id);
        kvf_mesh_node_store(g_mesh, id, NULL, addr);
    }
    cr_assert_str_eq(kvf_mesh_node_by_id(g_mesh, 1000), "10.0.0.1:1000");
    cr_assert_null(kvf_mesh_node_by_id(g_mesh, 1));
    /* an address too long is not kept */
    kvf_mesh_node_store(
        g_mesh, 5000, NULL,
        "a-very-long-host-name-that-does-not-fit-in-the-directory-entry."
        "example:1");
    cr_assert_null(kvf_mesh_node_by_id(g_mesh, 5000));
}

Test(mesh, decode_drops_and_counts_what_a_handler_does_not_take)
{
    static const uint16_t fetch[] = {KVF_MSG_PEER_FETCH};
    uint8_t buf[256], junk[64];
    Kvf__PeerChunk chunk;
    kvf_mesh_stats_t st;
    kvf_frame_t frame;
    size_t len = 0;

    kvf__peer_chunk__init(&chunk);
    chunk.request_id = 42;
    cr_assert_eq(kvf_frame_pack(buf, sizeof(buf), KVF_MSG_PEER_CHUNK, 0,
                                &chunk.base, sizeof(buf), &len),
                 KVF_OK);
    /* the right frame, the wrong type for this id */
    cr_assert_eq(kvf_mesh_decode(g_mesh, buf, len, sizeof(buf), fetch, 1,
                                 "PEER_FETCH", &frame),
                 KVF_ERR_PROTO);
    /* garbage, and a frame over the bound */
    memset(junk, 0xff, sizeof(junk));
    cr_assert_eq(kvf_mesh_decode(g_mesh, junk, sizeof(junk), sizeof(buf), fetch,
                                 1, "PEER_FETCH", &frame),
                 KVF_ERR_PROTO);
    cr_assert_eq(kvf_mesh_decode(g_mesh, buf, len, len - 1, fetch, 1,
                                 "PEER_FETCH", &frame),
                 KVF_ERR_PROTO);
    cr_assert_eq(
        kvf_mesh_decode(g_mesh, NULL, 0, 16, fetch, 1, "PEER_FETCH", &frame),
        KVF_ERR_PROTO);
    kvf_mesh_get_stats(g_mesh, &st);
    cr_assert_eq(st.dropped[KVF_MESH_DROP_WRONG_TYPE], 1);
    cr_assert_eq(st.dropped[KVF_MESH_DROP_MALFORMED], 3);

    /* what it does take */
    {
        static const uint16_t chunk_type[] = {KVF_MSG_PEER_CHUNK};

        cr_assert_eq(kvf_mesh_decode(g_mesh, buf, len, sizeof(buf), chunk_type,
                                     1, "PEER_CHUNK", &frame),
                     KVF_OK);
        cr_assert_eq(((Kvf__PeerChunk *)frame.msg)->request_id, 42);
        kvf_frame_release(&frame, NULL);
    }
}
