/* SPDX-License-Identifier: Apache-2.0 */
/* Copyright (c) 2026 The kvfabric authors */
/*
 * common/listen.c: a listener at the file descriptor limit pauses with a
 * backoff instead of spinning, and accepts the waiting connections once
 * descriptors are free again.
 */
#include "common/listen.h"
#include "common/time.h"

#include <criterion/criterion.h>

#include <event2/event.h>
#include <event2/listener.h>

#include <arpa/inet.h>
#include <errno.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#define CLIENTS 4

static int g_accepted;

static void on_accept(struct evconnlistener *lst, evutil_socket_t fd,
                      struct sockaddr *sa, int len, void *arg)
{
    g_accepted++;
    close(fd);
}

/* CPU time this process used, in microseconds. */
static uint64_t cpu_us(void)
{
    struct rusage ru;

    getrusage(RUSAGE_SELF, &ru);
    return (uint64_t)(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) * 1000000 +
           (uint64_t)(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec);
}

Test(listen, backs_off_at_the_fd_limit)
{
    struct event_base *base = event_base_new();
    struct sockaddr_in sin  = {.sin_family = AF_INET};
    socklen_t len           = sizeof(sin);
    struct evconnlistener *lst;
    kvf_listen_guard_t guard = {0};
    struct timeval tv        = {0, 500000};
    struct rlimit rl;
    int clients[CLIENTS], fillers[256], nfill = 0, i;
    uint64_t t0, deadline;

    cr_assert_not_null(base);
    sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    lst                 = evconnlistener_new_bind(base, on_accept, NULL,
                                                  LEV_OPT_CLOSE_ON_FREE | LEV_OPT_REUSEABLE, 16,
                                                  (struct sockaddr *)&sin, sizeof(sin));
    cr_assert_not_null(lst);
    cr_assert_eq(kvf_listen_guard_init(&guard, base, lst, "test port"), KVF_OK);
    getsockname(evconnlistener_get_fd(lst), (struct sockaddr *)&sin, &len);
    for (i = 0; i < CLIENTS; i++) {
        clients[i] = socket(AF_INET, SOCK_STREAM, 0);
        cr_assert(clients[i] >= 0);
        cr_assert_eq(connect(clients[i], (struct sockaddr *)&sin, sizeof(sin)),
                     0); /* completes in the backlog */
    }
    /* no descriptor left for accept() */
    getrlimit(RLIMIT_NOFILE, &rl);
    rl.rlim_cur = (rlim_t)clients[CLIENTS - 1] + 64;
    cr_assert_eq(setrlimit(RLIMIT_NOFILE, &rl), 0);
    while (nfill < 256) {
        int fd = dup(0);

        if (fd < 0) {
            cr_assert_eq(errno, EMFILE);
            break;
        }
        fillers[nfill++] = fd;
    }
    cr_assert_lt(nfill, 256);

    t0 = cpu_us();
    event_base_loopexit(base, &tv);
    event_base_dispatch(base); /* 500 ms at the limit */
    cr_expect_lt(cpu_us() - t0, 100000, "spun: %" PRIu64 " us of CPU",
                 cpu_us() - t0);
    cr_expect_geq(guard.errors, 1);
    cr_expect_leq(guard.errors, 10, "%" PRIu64 " tries in 500 ms",
                  guard.errors);
    cr_expect_eq(g_accepted, 0);

    while (nfill > 0) {
        close(fillers[--nfill]);
    }
    deadline = kvf_time_deadline_ns(5 * KVF_NSEC_PER_SEC);
    while ((g_accepted < CLIENTS) && !kvf_time_expired(deadline)) {
        event_base_loop(base, EVLOOP_ONCE);
    }
    cr_assert_eq(g_accepted, CLIENTS, "accepts resumed");
    for (i = 0; i < CLIENTS; i++) {
        close(clients[i]);
    }
    kvf_listen_guard_cleanup(&guard);
    evconnlistener_free(lst);
    event_base_free(base);
}
