/* SPDX-License-Identifier: Apache-2.0 */
/* Copyright (c) 2026 The kvfabric authors */
#include "controller/election.h"

#include "controller/etcd.h"
#include "common/log.h"
#include "common/thread.h"
#include "common/time.h"

#include <event2/event.h>

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* how often a standby looks at the leader key */
#define KVF_ELECTION_POLL_NS (100 * KVF_NSEC_PER_MSEC)

struct kvf_election {
    kvf_etcd_t *etcd; /* loop thread */
    kvf_etcd_t *ka;   /* keep-alive thread */
    char key[512];
    char prefix[480];
    int64_t ttl_s;
    int64_t lease;
    int64_t term;
    uint64_t valid_until_ns;         /* lease surely valid before this */
    _Atomic uint64_t serve_until_ns; /* valid_until_ns - guard_ns */
    uint64_t guard_ns;
    pthread_t thread;
    bool thread_started;
    pthread_mutex_t lock;
    pthread_cond_t cond;
    bool stop;            /* under lock */
    atomic_bool lost;     /* on_lost was asked for */
    atomic_bool stopped;  /* the loop confirmed it stopped serving */
    char value[1024];     /* published addresses */
    bool publish_pending; /* under lock: the keep-alive thread retries */
    int pipe_fd[2];
    struct event *lost_ev;
    void (*on_lost)(void *arg);
    void *arg;
    kvf_election_wait_cb_t wait; /* NULL: a standby sleeps */
    void *wait_arg;
    uint64_t terms;      /* elections won by this process */
    int64_t leader_term; /* the current leader's, as last seen */
    uint64_t won_ns;     /* when the current term began (0: standby) */
};

static volatile sig_atomic_t kvf_election_quit;

static void kvf_election_on_signal(int sig)
{
    (void)sig;
    kvf_election_quit = 1;
}

kvf_status_t kvf_election_create(const kvf_controller_config_t *cfg,
                                 kvf_election_t **el_p)
{
    pthread_condattr_t attr;
    kvf_election_t *el;
    kvf_status_t status;
    uint64_t ttl_ms = cfg->etcd_lease_ns / KVF_NSEC_PER_MSEC;

    el = calloc(1, sizeof(*el));
    if (el == NULL) {
        return KVF_ERR_NO_MEMORY;
    }
    el->pipe_fd[0] = el->pipe_fd[1] = -1;
    el->ttl_s = (int64_t)((cfg->etcd_lease_ns + KVF_NSEC_PER_SEC - 1) /
                          KVF_NSEC_PER_SEC);
    snprintf(el->key, sizeof(el->key), "%s/leader", cfg->etcd_prefix);
    snprintf(el->prefix, sizeof(el->prefix), "%s", cfg->etcd_prefix);
    /* etcd calls of the loop thread: a third of the lease each */
    status = kvf_etcd_create(cfg->etcd, ttl_ms / 3, &el->etcd);
    if (status != KVF_OK) {
        goto err_free;
    }
    status = kvf_etcd_create(cfg->etcd, ttl_ms / 3, &el->ka);
    if (status != KVF_OK) {
        goto err_free;
    }
    pthread_mutex_init(&el->lock, NULL);
    pthread_condattr_init(&attr);
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    pthread_cond_init(&el->cond, &attr);
    pthread_condattr_destroy(&attr);
    if (pipe2(el->pipe_fd, O_CLOEXEC | O_NONBLOCK) != 0) {
        status = KVF_ERR_IO;
        goto err_sync;
    }
    *el_p = el;
    return KVF_OK;

err_sync:
    pthread_cond_destroy(&el->cond);
    pthread_mutex_destroy(&el->lock);
err_free:
    kvf_etcd_destroy(el->ka);
    kvf_etcd_destroy(el->etcd);
    free(el);
    return status;
}

void kvf_election_destroy(kvf_election_t *el)
{
    if (el == NULL) {
        return;
    }
    if (el->thread_started) {
        pthread_mutex_lock(&el->lock);
        el->stop = true;
        pthread_cond_signal(&el->cond);
        pthread_mutex_unlock(&el->lock);
        pthread_join(el->thread, NULL);
    }
    if ((el->lease != 0) && !atomic_load(&el->lost)) {
        /* a clean shutdown: hand over now, not after the TTL */
        if (kvf_etcd_lease_revoke(el->etcd, el->lease) == KVF_OK) {
            kvf_info("etcd: resigned (lease %" PRIx64 " revoked)",
                     (uint64_t)el->lease);
        }
    }
    if (el->lost_ev != NULL) {
        event_free(el->lost_ev);
    }
    close(el->pipe_fd[0]);
    close(el->pipe_fd[1]);
    pthread_cond_destroy(&el->cond);
    pthread_mutex_destroy(&el->lock);
    kvf_etcd_destroy(el->ka);
    kvf_etcd_destroy(el->etcd);
    free(el);
}

static void kvf_election_pause(uint64_t ns)
{
    struct timespec ts = {(time_t)(ns / KVF_NSEC_PER_SEC),
                          (long)(ns % KVF_NSEC_PER_SEC)};

    /* a standby's polling step; a signal ends it early */
    nanosleep(&ts, NULL);
}

void kvf_election_set_wait(kvf_election_t *el, kvf_election_wait_cb_t wait,
                           void *arg)
{
    el->wait     = wait;
    el->wait_arg = arg;
}

/* The "control" address of a published leader value ("" if none). */
static void kvf_election_control_of(const char *value, char *out, size_t len)
{
    const char *p = strstr(value, "\"control\":\"");
    size_t n;

    out[0] = '\0';
    if (p == NULL) {
        return;
    }
    p += strlen("\"control\":\"");
    n = strcspn(p, "\"");
    if (n < len) {
        memcpy(out, p, n);
        out[n] = '\0';
    }
}

/* A standby's wait between two looks at the leader key; true: stop. */
static bool kvf_election_standby_wait(kvf_election_t *el, const char *value)
{
    char control[300];

    if (el->wait == NULL) {
        kvf_election_pause(KVF_ELECTION_POLL_NS);
        return kvf_election_quit != 0;
    }
    kvf_election_control_of(value, control, sizeof(control));
    return el->wait(el->wait_arg, KVF_ELECTION_POLL_NS, control);
}

kvf_status_t kvf_election_campaign(kvf_election_t *el)
{
    struct sigaction sa, old_term, old_int;
    kvf_status_t status = KVF_ERR_CANCELED;
    char value[512];
    bool logged = false, found, created;
    int64_t rev, ttl;
    uint64_t sent;

    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = kvf_election_on_signal;
    if (el->wait == NULL) {
        /* with a wait callback, the caller's loop sees the signals */
        sigaction(SIGTERM, &sa, &old_term);
        sigaction(SIGINT, &sa, &old_int);
    }
    while (!kvf_election_quit) {
        if (kvf_etcd_get(el->etcd, el->key, &found, value, sizeof(value),
                         &rev) != KVF_OK) {
            if (!logged) {
                kvf_warn("etcd: no endpoint answers; retrying");
                logged = true;
            }
            if (kvf_election_standby_wait(el, "")) {
                break;
            }
            continue;
        }
        if (found) {
            if (!logged) {
                kvf_info("etcd: standby; leader is %s (term %" PRId64 ")",
                         value, rev);
                logged = true;
            }
            el->leader_term = rev;
            if (kvf_election_standby_wait(el, value)) {
                break;
            }
            continue;
        }
        sent = kvf_time_now_ns();
        if (kvf_etcd_lease_grant(el->etcd, el->ttl_s, &el->lease, &ttl) !=
            KVF_OK) {
            kvf_election_pause(KVF_ELECTION_POLL_NS);
            continue;
        }
        if ((kvf_etcd_create_key(el->etcd, el->key, "{}", el->lease, &created,
                                 &rev) == KVF_OK) &&
            created) {
            el->term           = rev;
            el->valid_until_ns = sent + (uint64_t)ttl * KVF_NSEC_PER_SEC;
            el->guard_ns       = (uint64_t)ttl * KVF_NSEC_PER_SEC / 4;
            if (el->guard_ns > 500 * KVF_NSEC_PER_MSEC) {
                el->guard_ns = 500 * KVF_NSEC_PER_MSEC;
            }
            atomic_store(&el->serve_until_ns,
                         el->valid_until_ns - el->guard_ns);
            kvf_info("etcd: elected leader of %s, term %" PRId64
                     ", lease %" PRIx64 " ttl %" PRId64 "s",
                     el->key, rev, (uint64_t)el->lease, ttl);
            el->terms++;
            el->won_ns      = kvf_time_now_ns();
            el->leader_term = rev;
            status          = KVF_OK;
            break;
        }
        kvf_etcd_lease_revoke(el->etcd, el->lease);
        el->lease = 0;
        logged    = false;
    }
    if ((status != KVF_OK) && (el->wait == NULL)) {
        sigaction(SIGTERM, &old_term, NULL);
        sigaction(SIGINT, &old_int, NULL);
    }
    if (status != KVF_OK) {
        kvf_info("signal while standby: exiting");
    }
    /* elected: the handler stays until the server installs its own, so a
     * signal in between is not lost (kvf_election_quit_requested) */
    return status;
}

bool kvf_election_quit_requested(void)
{
    return kvf_election_quit != 0;
}

static void kvf_election_on_pipe(evutil_socket_t fd, short what, void *arg)
{
    kvf_election_t *el = arg;
    char buf[8];

    (void)what;
    while (read(fd, buf, sizeof(buf)) > 0) {
    }
    kvf_error("etcd: lease about to be lost: stopping service (term %" PRId64
              ")",
              el->term);
    el->on_lost(el->arg);
}

/* Waits until @p when_ns (monotonic) or stop; returns true on stop. */
static bool kvf_election_wait(kvf_election_t *el, uint64_t when_ns)
{
    struct timespec ts = {(time_t)(when_ns / KVF_NSEC_PER_SEC),
                          (long)(when_ns % KVF_NSEC_PER_SEC)};
    bool stop;

    pthread_mutex_lock(&el->lock);
    while (!el->stop && (kvf_time_now_ns() < when_ns)) {
        if (pthread_cond_timedwait(&el->cond, &el->lock, &ts) == ETIMEDOUT) {
            break;
        }
    }
    stop = el->stop;
    pthread_mutex_unlock(&el->lock);
    return stop;
}

/* Keep-alive thread: publishes what the loop thread could not. */
static void kvf_election_publish_retry(kvf_election_t *el)
{
    char value[sizeof(el->value)];
    bool pending;

    pthread_mutex_lock(&el->lock);
    pending = el->publish_pending;
    memcpy(value, el->value, sizeof(value));
    pthread_mutex_unlock(&el->lock);
    if (pending && (kvf_etcd_update_key(el->ka, el->key, value, el->lease,
                                        el->term) == KVF_OK)) {
        pthread_mutex_lock(&el->lock);
        el->publish_pending = false;
        pthread_mutex_unlock(&el->lock);
        kvf_info("etcd: published %s", value);
    }
}

static void *kvf_election_thread(void *arg)
{
    kvf_election_t *el = arg;
    uint64_t interval  = (uint64_t)el->ttl_s * KVF_NSEC_PER_SEC / 3;
    uint64_t next      = kvf_time_now_ns() + interval;
    uint64_t now, sent, stop_at;
    int64_t ttl;
    kvf_status_t status;

    for (;;) {
        stop_at = el->valid_until_ns - el->guard_ns;
        if (kvf_election_wait(el, (next < stop_at) ? next : stop_at)) {
            return NULL;
        }
        now = kvf_time_now_ns();
        if (now >= stop_at) {
            break;
        }
        /* never block past the point where we must stop */
        kvf_etcd_set_timeout(el->ka, (stop_at - now) / KVF_NSEC_PER_MSEC + 1);
        sent   = now;
        status = kvf_etcd_lease_keepalive(el->ka, el->lease, &ttl);
        if ((status == KVF_OK) && (ttl > 0)) {
            el->valid_until_ns = sent + (uint64_t)ttl * KVF_NSEC_PER_SEC;
            atomic_store(&el->serve_until_ns,
                         el->valid_until_ns - el->guard_ns);
            next = sent + interval;
            kvf_election_publish_retry(el);
        } else if (status == KVF_OK) {
            kvf_error("etcd: lease %" PRIx64 " is gone", (uint64_t)el->lease);
            break;
        } else {
            next = kvf_time_now_ns() + interval / 4; /* retry soon */
        }
    }
    atomic_store(&el->lost, true);
    if (write(el->pipe_fd[1], "x", 1) != 1) {
        /* the backstop below still stops us */
    }
    /* the loop must confirm before half the guard is spent */
    kvf_election_wait(el, el->valid_until_ns - el->guard_ns / 2);
    if (!atomic_load(&el->stopped)) {
        kvf_error("etcd: service did not stop in time: exiting");
        _exit(KVF_ELECTION_EXIT_LOST);
    }
    return NULL;
}

kvf_status_t kvf_election_start(kvf_election_t *el, struct event_base *base,
                                void (*on_lost)(void *arg), void *arg)
{
    el->on_lost = on_lost;
    el->arg     = arg;
    el->lost_ev = event_new(base, el->pipe_fd[0], EV_READ | EV_PERSIST,
                            kvf_election_on_pipe, el);
    if ((el->lost_ev == NULL) || (event_add(el->lost_ev, NULL) != 0)) {
        return KVF_ERR_NO_MEMORY;
    }
    if (kvf_thread_start(&el->thread, "kvf-election", kvf_election_thread,
                         el) != 0) {
        return KVF_ERR_IO;
    }
    el->thread_started = true;
    return KVF_OK;
}

void kvf_election_stopped(kvf_election_t *el)
{
    atomic_store(&el->stopped, true);
}

kvf_status_t kvf_election_publish(kvf_election_t *el, const char *control,
                                  const char *http)
{
    char value[sizeof(el->value)];
    kvf_status_t status;

    snprintf(value, sizeof(value),
             "{\"control\":\"%s\",\"http\":\"%s\",\"term\":%" PRId64 "}",
             control, http, el->term);
    status = kvf_etcd_update_key(el->etcd, el->key, value, el->lease, el->term);
    if (status == KVF_OK) {
        kvf_info("etcd: published %s", value);
        return KVF_OK;
    }
    /* serving does not depend on it (clients list the controllers): the
     * keep-alive thread retries after each renewal */
    kvf_warn("etcd: cannot publish the leader's addresses yet (%s); "
             "retrying",
             kvf_status_name(status));
    pthread_mutex_lock(&el->lock);
    memcpy(el->value, value, sizeof(value));
    el->publish_pending = true;
    pthread_mutex_unlock(&el->lock);
    return KVF_OK;
}

const _Atomic uint64_t *kvf_election_serve_until(kvf_election_t *el)
{
    return &el->serve_until_ns;
}

uint64_t kvf_election_term(const kvf_election_t *el)
{
    return (uint64_t)el->term;
}

bool kvf_election_lost(kvf_election_t *el)
{
    return atomic_load(&el->lost) ||
           (kvf_time_now_ns() >= atomic_load(&el->serve_until_ns));
}

void kvf_election_info(const kvf_election_t *el, kvf_election_info_t *info_p)
{
    memset(info_p, 0, sizeof(*info_p));
    info_p->elections_won = el->terms;
    info_p->leader_term   = (uint64_t)el->leader_term;
    info_p->leader_ns = (el->won_ns != 0) ? kvf_time_now_ns() - el->won_ns : 0;
}

kvf_status_t kvf_election_state_put(kvf_election_t *el, const char *name,
                                    const char *value)
{
    char key[600];

    snprintf(key, sizeof(key), "%s/state/%s", el->prefix, name);
    return kvf_etcd_put_guarded(el->etcd, key, value, el->key, el->term);
}

kvf_status_t kvf_election_state_get(kvf_election_t *el, const char *name,
                                    char *value, size_t len, bool *found_p)
{
    char key[600];

    snprintf(key, sizeof(key), "%s/state/%s", el->prefix, name);
    return kvf_etcd_get(el->etcd, key, found_p, value, len, NULL);
}
