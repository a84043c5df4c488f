/* SPDX-License-Identifier: Apache-2.0 */
/* Copyright (c) 2026 The kvfabric authors */
/*
 * UCX listens only where --listen says (issue #16.6): an agent told to
 * listen on 127.0.0.1 has no TCP socket listening on any other address
 * (UCX's TCP transport opens its own listener on every network device
 * unless UCX_NET_DEVICES narrows it).
 */
#include "tests/helpers/proc.h"
#include "tests/helpers/test_helpers.h"
#include "tests/integration/controller_harness.h"
#include "tests/security/rogue.h"

#include <criterion/criterion.h>

#include <dirent.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static kvf_th_ctl_t g_ctl;
static kvf_sec_agent_t g_agent;

static void setup(void)
{
    kvf_th_ctl_start(&g_ctl, NULL);
    kvf_sec_agent_start(&g_agent, g_ctl.addr, "sec-listen", NULL);
}

static void teardown(void)
{
    kvf_test_proc_stop(&g_agent.proc, 10000);
    kvf_th_ctl_stop(&g_ctl);
    kvf_test_check_leaks();
}

TestSuite(listen, .init = setup, .fini = teardown, .timeout = 60);

/* Is socket inode @p inode one of process @p pid's descriptors? */
static bool owns_inode(pid_t pid, unsigned long inode)
{
    char dir[64], path[320], target[64], want[64];
    struct dirent *de;
    bool found = false;
    DIR *d;

    snprintf(dir, sizeof(dir), "/proc/%d/fd", (int)pid);
    snprintf(want, sizeof(want), "socket:[%lu]", inode);
    d = opendir(dir);
    cr_assert_not_null(d);
    while (!found && ((de = readdir(d)) != NULL)) {
        ssize_t n;

        snprintf(path, sizeof(path), "%s/%s", dir, de->d_name);
        n = readlink(path, target, sizeof(target) - 1);
        if (n > 0) {
            target[n] = '\0';
            found     = (strcmp(target, want) == 0);
        }
    }
    closedir(d);
    return found;
}

/* Counts the agent's listening sockets in /proc/net/@p table, and those
 * not bound to loopback. */
static void scan(const char *table, unsigned *listening, unsigned *outside,
                 char *what, size_t what_len)
{
    char path[64], line[512];
    FILE *f;

    snprintf(path, sizeof(path), "/proc/%d/net/%s", (int)g_agent.proc.pid,
             table);
    f = fopen(path, "r");
    if (f == NULL) {
        return; /* no IPv6 */
    }
    while (fgets(line, sizeof(line), f) != NULL) {
        char local[64], remote[64];
        unsigned long inode;
        unsigned state;

        if (sscanf(line, " %*d: %63s %63s %x %*s %*s %*s %*s %*s %lu", local,
                   remote, &state, &inode) != 4) {
            continue;
        }
        if ((state != 0x0a) || !owns_inode(g_agent.proc.pid, inode)) {
            continue; /* not listening, or not the agent's */
        }
        (*listening)++;
        /* 127.0.0.1 is 0100007F; ::1 ends in 01000000 */
        if ((strncmp(local, "0100007F:", 9) != 0) &&
            (strncmp(local, "00000000000000000000000001000000:", 33) != 0)) {
            (*outside)++;
            snprintf(what, what_len, "%s %s", table, local);
        }
    }
    fclose(f);
}

Test(listen, ucx_listens_only_on_the_listen_address)
{
    unsigned listening = 0, outside = 0;
    char what[128] = "";

    scan("tcp", &listening, &outside, what, sizeof(what));
    scan("tcp6", &listening, &outside, what, sizeof(what));
    cr_assert_geq(listening, 2, "the peer service and HTTP listen");
    cr_assert_eq(outside, 0,
                 "%u of %u listening sockets outside loopback, "
                 "e.g. %s",
                 outside, listening, what);
}
