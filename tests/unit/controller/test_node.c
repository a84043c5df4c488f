/* SPDX-License-Identifier: Apache-2.0 */
/* Copyright (c) 2026 The kvfabric authors */
#include "controller/node.h"
#include "tests/helpers/test_helpers.h"

#include <criterion/criterion.h>

#include <string.h>

static kvf_registry_t *g_reg;
static kvf_node_table_t *g_nodes;

static void node_setup(void)
{
    cr_assert_eq(kvf_registry_create(0, 64, &g_reg), KVF_OK);
    cr_assert_eq(kvf_node_table_create(g_reg, &g_nodes), KVF_OK);
    kvf_test_log_capture_start();
}

static void node_teardown(void)
{
    kvf_test_log_capture_stop();
    kvf_node_table_destroy(g_nodes);
    kvf_registry_destroy(g_reg);
    kvf_test_check_leaks();
}

TestSuite(node, .init = node_setup, .fini = node_teardown, .timeout = 10);

static kvf_node_t *reg_node(const char *name, uint64_t inc, uint64_t now)
{
    kvf_node_params_t p;
    kvf_node_t *node  = NULL;
    uint8_t worker[3] = {1, 2, 3};

    memset(&p, 0, sizeof(p));
    p.name               = name;
    p.incarnation        = inc;
    p.worker_address     = worker;
    p.worker_address_len = sizeof(worker);
    cr_assert_eq(kvf_node_table_register(g_nodes, &p, now, &node), KVF_OK);
    return node;
}

Test(node, register_assigns_ids_and_slots)
{
    kvf_node_t *a = reg_node("a", 1, 0), *b = reg_node("b", 1, 0);

    cr_assert_neq(a->id, b->id);
    cr_assert_neq(a->slot, b->slot);
    cr_assert_eq(kvf_node_table_find(g_nodes, a->id), a);
    cr_assert_eq(kvf_node_table_slot_id(g_nodes, b->slot), b->id);
    cr_assert_eq(a->worker_address_len, 3);
}

Test(node, bad_params_are_invalid)
{
    kvf_node_params_t p;
    kvf_node_t *node;
    char longname[300];

    memset(&p, 0, sizeof(p));
    cr_assert_eq(kvf_node_table_register(g_nodes, &p, 0, &node),
                 KVF_ERR_INVALID);
    p.name     = "x";
    p.tp_world = 2;
    p.tp_rank  = 2;
    cr_assert_eq(kvf_node_table_register(g_nodes, &p, 0, &node),
                 KVF_ERR_INVALID);
    memset(longname, 'n', sizeof(longname) - 1);
    longname[sizeof(longname) - 1] = '\0';
    p.tp_world                     = 0;
    p.name                         = longname;
    cr_assert_eq(kvf_node_table_register(g_nodes, &p, 0, &node),
                 KVF_ERR_INVALID);
}

Test(node, new_incarnation_replaces_and_fences_old)
{
    kvf_node_t *old   = reg_node("a", 1, 0), *node;
    uint32_t old_id   = old->id;
    uint16_t old_slot = old->slot;
    kvf_node_params_t p;

    memset(&p, 0, sizeof(p));
    p.name        = "a";
    p.incarnation = 1;
    cr_assert_eq(kvf_node_table_register(g_nodes, &p, 0, &node),
                 KVF_ERR_EXISTS);
    node = reg_node("a", 2, 0);
    cr_assert_neq(node->id, old_id);
    cr_assert_eq(kvf_node_table_find(g_nodes, old_id)->state, KVF_NODE_DEAD);
    cr_assert_neq(kvf_registry_slot_state(g_reg, old_slot),
                  KVF_REGISTRY_SLOT_LIVE);
    cr_assert_eq(kvf_node_table_check(g_nodes, old_id, 1, &node),
                 KVF_ERR_STALE);
    cr_assert_eq(kvf_node_table_check(g_nodes, 9999, 1, &node),
                 KVF_ERR_NOT_FOUND);
    p.incarnation = 1;
    cr_assert_eq(kvf_node_table_register(g_nodes, &p, 0, &node), KVF_ERR_STALE);
}

static kvf_status_t reg_from(const char *name, uint64_t inc, const char *data,
                             const char *sock, bool replace, uint64_t now,
                             kvf_node_t **node_p)
{
    kvf_node_params_t p;

    memset(&p, 0, sizeof(p));
    p.name            = name;
    p.incarnation     = inc;
    p.data_address    = data;
    p.control_address = sock;
    p.is_replace      = replace;
    p.lease_ms        = 1000;
    return kvf_node_table_register(g_nodes, &p, now, node_p);
}

Test(node, name_held_by_a_live_node_elsewhere_is_refused)
{
    kvf_node_t *holder, *node = NULL;

    cr_assert_eq(
        reg_from("gpu0", 1, "10.0.0.1:7410", "/run/a.sock", false, 0, &holder),
        KVF_OK);
    /* another host, and another agent on the same host (other socket) */
    cr_assert_eq(
        reg_from("gpu0", 2, "10.0.0.2:7410", "/run/a.sock", false, 500, &node),
        KVF_ERR_EXISTS);
    cr_assert_eq(
        reg_from("gpu0", 2, "10.0.0.1:7420", "/run/b.sock", false, 500, &node),
        KVF_ERR_EXISTS);
    cr_assert_eq(holder->state, KVF_NODE_ALIVE, "the holder keeps its name");
    cr_assert_eq(kvf_node_table_find_name(g_nodes, "gpu0"), holder);
}

Test(node, same_agent_restart_lease_expiry_or_replace_take_over)
{
    kvf_node_t *a, *b, *c, *d;

    cr_assert_eq(
        reg_from("gpu0", 1, "10.0.0.1:7410", "/run/a.sock", false, 0, &a),
        KVF_OK);
    /* a restart: same host and socket, a new ephemeral data port */
    cr_assert_eq(
        reg_from("gpu0", 2, "10.0.0.1:40001", "/run/a.sock", false, 10, &b),
        KVF_OK);
    cr_assert_eq(a->state, KVF_NODE_DEAD);
    /* --replace from elsewhere */
    cr_assert_eq(
        reg_from("gpu0", 3, "10.0.0.2:7410", "/run/a.sock", true, 20, &c),
        KVF_OK);
    cr_assert_eq(b->state, KVF_NODE_DEAD);
    cr_assert(kvf_test_log_contains("replaced (--replace)"));
    /* the holder went silent for longer than its lease */
    cr_assert_eq(
        reg_from("gpu0", 4, "10.0.0.3:7410", "/run/x.sock", false, 1021, &d),
        KVF_OK);
    cr_assert_eq(c->state, KVF_NODE_DEAD);
}

Test(node, draining_is_kept_from_the_registration)
{
    kvf_node_params_t p;
    kvf_node_t *node;

    memset(&p, 0, sizeof(p));
    p.name        = "d";
    p.incarnation = 1;
    p.is_draining = true;
    cr_assert_eq(kvf_node_table_register(g_nodes, &p, 0, &node), KVF_OK);
    cr_assert_eq(node->state, KVF_NODE_DRAINING);
}

Test(node, lease_expiry_and_forget)
{
    kvf_node_t *a = reg_node("a", 1, 0), *b = reg_node("b", 1, 0);
    uint32_t a_id = a->id;
    uint32_t alive, draining, dead;

    b->last_heartbeat_ms = 900;
    cr_assert_eq(kvf_node_table_expire(g_nodes, 1000, 500, 60000), 1);
    cr_assert_eq(a->state, KVF_NODE_DEAD);
    cr_assert_eq(a->slot, 0);
    cr_assert(kvf_test_log_contains("lease expired"));
    kvf_node_table_census(g_nodes, &alive, &draining, &dead);
    cr_assert_eq(alive, 1);
    cr_assert_eq(dead, 1);
    cr_assert_eq(kvf_node_table_expire(g_nodes, 1001, 500, 60000), 0);
    b->last_heartbeat_ms = 100000;
    kvf_node_table_expire(g_nodes, 100000, 500, 60000);
    cr_assert_null(kvf_node_table_find(g_nodes, a_id), "forgotten");
    cr_assert_eq(kvf_node_table_count(g_nodes), 1);
}

Test(node, commands_queue_and_clear)
{
    kvf_node_t *a    = reg_node("a", 1, 0);
    uint8_t keys[48] = {0};
    unsigned i;

    cr_assert_eq(kvf_node_cmd_push(a, 2, keys, sizeof(keys)), KVF_OK);
    cr_assert_eq(a->num_cmds, 1);
    cr_assert_eq(a->cmds[0].keys_len, 48);
    for (i = 1; i < KVF_NODE_COMMANDS_MAX; i++) {
        cr_assert_eq(kvf_node_cmd_push(a, 1, NULL, 0), KVF_OK);
    }
    cr_assert_eq(kvf_node_cmd_push(a, 1, NULL, 0), KVF_ERR_BUSY);
    kvf_node_cmd_clear(a);
    cr_assert_eq(a->num_cmds, 0);
}

Test(node, reslot_moves_holdings_to_purge)
{
    kvf_node_t *a = reg_node("a", 1, 0);
    uint16_t old  = a->slot;

    cr_assert_eq(kvf_node_table_reslot(g_nodes, a), KVF_OK);
    cr_assert_neq(a->slot, old);
    cr_assert_eq(kvf_node_table_slot_id(g_nodes, a->slot), a->id);
    cr_assert_eq(kvf_node_table_slot_id(g_nodes, old), 0);
}

/* A standby's copy: the leader's id kept, later ids continue after it, a
 * newer node of the same name replaces the older one, and a dead one is
 * dead here too. */
Test(node, adopt_keeps_the_leaders_ids)
{
    kvf_node_params_t p;
    kvf_node_t *a = NULL, *b = NULL, *c;

    memset(&p, 0, sizeof(p));
    p.name        = "a";
    p.incarnation = 1;
    cr_assert_eq(kvf_node_table_adopt(g_nodes, 7, &p, KVF_NODE_DRAINING, 0, &a),
                 KVF_OK);
    cr_assert_eq(a->id, 7);
    cr_assert_eq(a->state, KVF_NODE_DRAINING);
    cr_assert_eq(kvf_node_table_slot_id(g_nodes, a->slot), 7);
    c = reg_node("c", 1, 0);
    cr_assert_eq(c->id, 8, "ids continue after the adopted one");
    p.incarnation = 2; /* the leader replaced a by a new incarnation */
    cr_assert_eq(kvf_node_table_adopt(g_nodes, 9, &p, KVF_NODE_ALIVE, 0, &b),
                 KVF_OK);
    cr_assert_eq(b->id, 9);
    cr_assert_eq(kvf_node_table_find(g_nodes, 7)->state, KVF_NODE_DEAD);
    cr_assert_eq(kvf_node_table_adopt(g_nodes, 9, &p, KVF_NODE_DEAD, 0, &b),
                 KVF_OK);
    cr_assert_eq(b->state, KVF_NODE_DEAD);
    cr_assert_eq(kvf_node_table_adopt(g_nodes, 42, &p, KVF_NODE_DEAD, 0, &b),
                 KVF_ERR_NOT_FOUND, "an unknown dead node is not created");
}

/* Heartbeat.transports comes from a peer: only short printable values are
 * kept, anything else shows as none and is logged once. */
Test(node, transports_from_a_heartbeat_are_checked)
{
    kvf_node_t *a = reg_node("a", 1, 0);
    char longv[KVF_NODE_TRANSPORTS_MAX + 1];

    cr_assert_str_eq(a->transports, "", "none before a heartbeat says");
    cr_assert_eq(kvf_node_set_transports(a, "rc_mlx5,tcp"), KVF_OK);
    cr_assert_str_eq(a->transports, "rc_mlx5,tcp");
    cr_assert_eq(kvf_node_set_transports(a, NULL), KVF_OK);
    cr_assert_str_eq(a->transports, "");
    /* the longest kept: 63 characters */
    memset(longv, 'x', sizeof(longv));
    longv[KVF_NODE_TRANSPORTS_MAX - 1] = '\0';
    cr_assert_eq(kvf_node_set_transports(a, longv), KVF_OK);
    cr_assert_eq(strlen(a->transports), KVF_NODE_TRANSPORTS_MAX - 1);
    /* one more is refused, not cut */
    longv[KVF_NODE_TRANSPORTS_MAX - 1] = 'x';
    longv[KVF_NODE_TRANSPORTS_MAX]     = '\0';
    cr_assert_eq(kvf_node_set_transports(a, longv), KVF_ERR_PROTO);
    cr_assert_str_eq(a->transports, "");
    cr_assert(kvf_test_log_contains("heartbeat transports refused: too long"),
              "%s", kvf_test_log_text());
    /* a terminal escape, a newline, a space, a byte past ASCII, a DEL */
    cr_assert_eq(kvf_node_set_transports(a, "tcp"), KVF_OK);
    cr_assert_eq(kvf_node_set_transports(a, "tcp\033[2J"), KVF_ERR_PROTO);
    cr_assert_str_eq(a->transports, "");
    cr_assert(kvf_test_log_contains("not printable ASCII"), "%s",
              kvf_test_log_text());
    cr_assert_eq(kvf_node_set_transports(a, "tcp\nfake 1"), KVF_ERR_PROTO);
    cr_assert_eq(kvf_node_set_transports(a, "tcp x"), KVF_ERR_PROTO);
    cr_assert_eq(kvf_node_set_transports(a, "tcp\xc3\xa9"), KVF_ERR_PROTO);
    cr_assert_eq(kvf_node_set_transports(a, "tcp\x7f"), KVF_ERR_PROTO);
    cr_assert_str_eq(a->transports, "");
    {
        /* logged once per run of bad values, not per heartbeat */
        const char *p = kvf_test_log_text();
        int n         = 0;

        while ((p = strstr(p, "heartbeat transports refused")) != NULL) {
            n++;
            p++;
        }
        cr_assert_eq(n, 2, "%s", kvf_test_log_text());
    }
    /* a good value after them is kept again */
    cr_assert_eq(kvf_node_set_transports(a, "tcp"), KVF_OK);
    cr_assert_str_eq(a->transports, "tcp");
}
