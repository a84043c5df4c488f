/* SPDX-License-Identifier: Apache-2.0 */
/* Copyright (c) 2026 The kvfabric authors */
/*
 * Threads of the daemons' own (copier workers, same-host populate, node
 * discovery, leader election): started with the asynchronous signals
 * blocked, so SIGTERM, SIGINT, SIGHUP and SIGPIPE reach the loop thread
 * (libevent's handlers) and never interrupt a worker's system call. Faults
 * (SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT, SIGTRAP, SIGSYS) stay
 * unblocked: a crash in a worker still reports where it happened.
 *
 * thread: thread-safe.
 */
#ifndef KVF_COMMON_THREAD_H
#define KVF_COMMON_THREAD_H

#include <pthread.h>
#include <signal.h>

/* pthread_create(@p thread, NULL, @p fn, @p arg) with the asynchronous
 * signals blocked in the new thread, named @p name (at most 15
 * characters: `top -H`, /proc/PID/task/TID/comm); returns pthread_create's
 * result. The caller's mask is unchanged. */
static inline int kvf_thread_start(pthread_t *thread, const char *name,
                                   void *(*fn)(void *), void *arg)
{
    static const int faults[] = {SIGSEGV, SIGBUS,  SIGFPE, SIGILL,
                                 SIGABRT, SIGTRAP, SIGSYS};
    sigset_t blocked, old;
    unsigned i;
    int rc;

    sigfillset(&blocked);
    for (i = 0; i < sizeof(faults) / sizeof(faults[0]); i++) {
        sigdelset(&blocked, faults[i]);
    }
    pthread_sigmask(SIG_SETMASK, &blocked, &old);
    rc = pthread_create(thread, NULL, fn, arg);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (rc == 0) {
        pthread_setname_np(*thread, name); /* cosmetic: a failure is fine */
    }
    return rc;
}

#endif /* KVF_COMMON_THREAD_H */
