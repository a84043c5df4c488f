/* SPDX-License-Identifier: Apache-2.0 */
/* Copyright (c) 2026 The kvfabric authors */
#include "agent/discover.h"

#include "common/config.h"
#include "common/etcd.h"
#include "common/log.h"
#include "common/thread.h"
#include "common/time.h"

#include <event2/event.h>

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

struct kvf_discover {
    struct event_base *base;
    struct event *ready_ev; /* the pipe: a leader is ready */
    int pipe_fd[2];
    kvf_etcd_t *etcd; /* the thread's */
    char *prefix;
    uint64_t poll_ns;
    kvf_discover_cb_t cb;
    void *arg;
    pthread_t thread;
    bool thread_started;
    pthread_mutex_t lock;
    pthread_cond_t cond;
    /* under lock */
    bool stop;
    bool wanted;
    bool ready;                   /* leader holds an answer for the loop */
    uint64_t last_term;           /* of the last leader handed over */
    char last_control[256];       /* its address */
    kvf_discover_leader_t leader; /* the answer */
    char problem[320];
};

/* Resolves @p hostport (HOST:PORT, numeric or a name) into @p leader. */
static kvf_status_t kvf_discover_resolve(const char *hostport,
                                         kvf_discover_leader_t *leader,
                                         char *why, size_t len)
{
    struct addrinfo hints, *res = NULL;
    char host[256], port_str[8];
    uint16_t port;
    int rc;

    if (kvf_config_parse_hostport(hostport, host, sizeof(host), &port) !=
        KVF_OK) {
        snprintf(why, len, "the leader published '%s', not HOST:PORT",
                 hostport);
        return KVF_ERR_PROTO;
    }
    snprintf(port_str, sizeof(port_str), "%u", port);
    memset(&hints, 0, sizeof(hints));
    hints.ai_family   = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    rc                = getaddrinfo(host, port_str, &hints, &res);
    if ((rc != 0) || (res == NULL)) {
        snprintf(why, len, "the leader's address %s: cannot resolve: %s",
                 hostport, gai_strerror(rc));
        return KVF_ERR_IO;
    }
    memcpy(&leader->addr, res->ai_addr, res->ai_addrlen);
    leader->addr_len = (socklen_t)res->ai_addrlen;
    freeaddrinfo(res);
    return KVF_OK;
}

/* One look at etcd (no lock held): KVF_OK with a leader to hand over. */
static kvf_status_t kvf_discover_look(kvf_discover_t *disc,
                                      kvf_discover_leader_t *leader, char *why,
                                      size_t len)
{
    kvf_etcd_leader_t found;
    kvf_status_t status;

    status = kvf_etcd_leader_get(disc->etcd, disc->prefix, &found);
    switch (status) {
    case KVF_OK:
        break;
    case KVF_ERR_NOT_FOUND:
        snprintf(why, len, "etcd names no leader under %s/leader yet",
                 disc->prefix);
        return status;
    case KVF_ERR_IO:
        snprintf(why, len, "no etcd endpoint answers");
        return status;
    default:
        snprintf(why, len, "%s/leader in etcd is not a leader's record",
                 disc->prefix);
        return status;
    }
    memset(leader, 0, sizeof(*leader));
    snprintf(leader->control, sizeof(leader->control), "%s", found.control);
    leader->term = found.term;
    return kvf_discover_resolve(found.control, leader, why, len);
}

static void *kvf_discover_thread(void *arg)
{
    kvf_discover_t *disc = arg;
    kvf_discover_leader_t leader;
    struct timespec ts;
    kvf_status_t status;
    char why[320];
    bool is_new;
    uint64_t until;

    pthread_mutex_lock(&disc->lock);
    for (;;) {
        while (!disc->stop && !disc->wanted) {
            pthread_cond_wait(&disc->cond, &disc->lock);
        }
        if (disc->stop) {
            break;
        }
        pthread_mutex_unlock(&disc->lock);
        why[0] = '\0';
        status = kvf_discover_look(disc, &leader, why, sizeof(why));
        pthread_mutex_lock(&disc->lock);
        /* the leader handed over last is still named (its lease has not
         * expired yet): not news, look again */
        is_new = (status == KVF_OK) &&
                 ((leader.term != disc->last_term) ||
                  (strcmp(leader.control, disc->last_control) != 0));
        if (status == KVF_OK && !is_new) {
            snprintf(why, sizeof(why),
                     "etcd still names the leader %s (term %llu)",
                     leader.control, (unsigned long long)leader.term);
        }
        snprintf(disc->problem, sizeof(disc->problem), "%s", why);
        if (is_new && disc->wanted) {
            disc->leader    = leader;
            disc->last_term = leader.term;
            snprintf(disc->last_control, sizeof(disc->last_control), "%s",
                     leader.control);
            disc->ready  = true;
            disc->wanted = false;
            if (write(disc->pipe_fd[1], "x", 1) != 1) {
                /* the pipe holds a wake-up already */
            }
            continue;
        }
        until      = kvf_time_now_ns() + disc->poll_ns;
        ts.tv_sec  = (time_t)(until / KVF_NSEC_PER_SEC);
        ts.tv_nsec = (long)(until % KVF_NSEC_PER_SEC);
        while (!disc->stop && (kvf_time_now_ns() < until)) {
            if (pthread_cond_timedwait(&disc->cond, &disc->lock, &ts) ==
                ETIMEDOUT) {
                break;
            }
        }
    }
    pthread_mutex_unlock(&disc->lock);
    return NULL;
}

static void kvf_discover_on_ready(evutil_socket_t fd, short what, void *arg)
{
    kvf_discover_t *disc = arg;
    kvf_discover_leader_t leader;
    char buf[16];
    bool ready;

    (void)what;
    while (read(fd, buf, sizeof(buf)) > 0) {
    }
    pthread_mutex_lock(&disc->lock);
    ready       = disc->ready;
    leader      = disc->leader;
    disc->ready = false;
    pthread_mutex_unlock(&disc->lock);
    if (ready) {
        kvf_info("etcd: the controller leader is %s (term %llu)",
                 leader.control, (unsigned long long)leader.term);
        disc->cb(disc->arg, &leader);
    }
}

kvf_status_t kvf_discover_create(struct event_base *base, const char *urls,
                                 const char *prefix, uint64_t timeout_ns,
                                 uint64_t poll_ns, kvf_discover_cb_t cb,
                                 void *arg, kvf_discover_t **disc_p)
{
    pthread_condattr_t attr;
    kvf_discover_t *disc;
    kvf_status_t status;

    disc = calloc(1, sizeof(*disc));
    if (disc == NULL) {
        return KVF_ERR_NO_MEMORY;
    }
    disc->base       = base;
    disc->pipe_fd[0] = disc->pipe_fd[1] = -1;
    disc->poll_ns                       = poll_ns;
    disc->cb                            = cb;
    disc->arg                           = arg;
    snprintf(disc->problem, sizeof(disc->problem),
             "looking for the leader in etcd");
    pthread_mutex_init(&disc->lock, NULL);
    pthread_condattr_init(&attr);
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    pthread_cond_init(&disc->cond, &attr);
    pthread_condattr_destroy(&attr);
    status = kvf_etcd_create(urls, timeout_ns / KVF_NSEC_PER_MSEC, &disc->etcd);
    if (status != KVF_OK) {
        goto err_destroy;
    }
    status       = KVF_ERR_NO_MEMORY;
    disc->prefix = strdup(prefix);
    if ((disc->prefix == NULL) ||
        (pipe2(disc->pipe_fd, O_CLOEXEC | O_NONBLOCK) != 0)) {
        goto err_destroy;
    }
    disc->ready_ev = event_new(base, disc->pipe_fd[0], EV_READ | EV_PERSIST,
                               kvf_discover_on_ready, disc);
    if ((disc->ready_ev == NULL) || (event_add(disc->ready_ev, NULL) != 0)) {
        goto err_destroy;
    }
    if (kvf_thread_start(&disc->thread, "kvf-discover", kvf_discover_thread,
                         disc) != 0) {
        status = KVF_ERR_IO;
        goto err_destroy;
    }
    disc->thread_started = true;
    *disc_p              = disc;
    return KVF_OK;

err_destroy:
    kvf_discover_destroy(disc);
    return status;
}

void kvf_discover_destroy(kvf_discover_t *disc)
{
    if (disc == NULL) {
        return;
    }
    if (disc->thread_started) {
        pthread_mutex_lock(&disc->lock);
        disc->stop = true;
        pthread_cond_signal(&disc->cond);
        pthread_mutex_unlock(&disc->lock);
        pthread_join(disc->thread, NULL);
    }
    if (disc->ready_ev != NULL) {
        event_free(disc->ready_ev);
    }
    if (disc->pipe_fd[0] >= 0) {
        close(disc->pipe_fd[0]);
        close(disc->pipe_fd[1]);
    }
    kvf_etcd_destroy(disc->etcd);
    free(disc->prefix);
    pthread_cond_destroy(&disc->cond);
    pthread_mutex_destroy(&disc->lock);
    free(disc);
}

void kvf_discover_want(kvf_discover_t *disc)
{
    pthread_mutex_lock(&disc->lock);
    if (!disc->wanted) {
        disc->wanted = true;
        pthread_cond_signal(&disc->cond);
    }
    pthread_mutex_unlock(&disc->lock);
}

void kvf_discover_settle(kvf_discover_t *disc)
{
    pthread_mutex_lock(&disc->lock);
    disc->wanted = false;
    pthread_mutex_unlock(&disc->lock);
}

void kvf_discover_problem(kvf_discover_t *disc, char *buf, size_t len)
{
    pthread_mutex_lock(&disc->lock);
    snprintf(buf, len, "%s", disc->problem);
    pthread_mutex_unlock(&disc->lock);
}
