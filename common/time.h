/* SPDX-License-Identifier: Apache-2.0 */
/* Copyright (c) 2026 The kvfabric authors */
/*
 * Monotonic clock helpers. Every wait in kvfabric is a deadline on this
 * clock, never on wall time.
 *
 * thread: thread-safe.
 */
#ifndef KVF_COMMON_TIME_H
#define KVF_COMMON_TIME_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/time.h>
#include <time.h>

#define KVF_NSEC_PER_USEC 1000ull
#define KVF_NSEC_PER_MSEC 1000000ull
#define KVF_NSEC_PER_SEC  1000000000ull

/* Nanoseconds on CLOCK_MONOTONIC. */
static inline uint64_t kvf_time_now_ns(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * KVF_NSEC_PER_SEC + (uint64_t)ts.tv_nsec;
}

static inline uint64_t kvf_time_now_us(void)
{
    return kvf_time_now_ns() / KVF_NSEC_PER_USEC;
}

static inline uint64_t kvf_time_now_ms(void)
{
    return kvf_time_now_ns() / KVF_NSEC_PER_MSEC;
}

/* Deadline @p timeout_ns from now; saturates instead of wrapping. */
static inline uint64_t kvf_time_deadline_ns(uint64_t timeout_ns)
{
    uint64_t now = kvf_time_now_ns();

    return (timeout_ns > UINT64_MAX - now) ? UINT64_MAX : now + timeout_ns;
}

static inline bool kvf_time_expired(uint64_t deadline_ns)
{
    return kvf_time_now_ns() >= deadline_ns;
}

/* Nanoseconds left until @p deadline_ns, 0 once it passed. */
static inline uint64_t kvf_time_left_ns(uint64_t deadline_ns)
{
    uint64_t now = kvf_time_now_ns();

    return (deadline_ns > now) ? deadline_ns - now : 0;
}

/* Milliseconds left, rounded up, for poll(2); capped at INT32_MAX. */
static inline int kvf_time_left_ms(uint64_t deadline_ns)
{
    uint64_t left = kvf_time_left_ns(deadline_ns);
    uint64_t ms   = (left + KVF_NSEC_PER_MSEC - 1) / KVF_NSEC_PER_MSEC;

    return (ms > INT32_MAX) ? INT32_MAX : (int)ms;
}

/* A duration as a struct timeval, for libevent timers. */
static inline struct timeval kvf_time_to_timeval(uint64_t ns)
{
    struct timeval tv;

    tv.tv_sec  = (time_t)(ns / KVF_NSEC_PER_SEC);
    tv.tv_usec = (suseconds_t)((ns % KVF_NSEC_PER_SEC) / KVF_NSEC_PER_USEC);
    return tv;
}

#endif /* KVF_COMMON_TIME_H */
