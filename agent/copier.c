/* SPDX-License-Identifier: Apache-2.0 */
/* Copyright (c) 2026 The kvfabric authors */
/*
 * The copier (agent/copier.h): a batch is published under the lock with a
 * new generation number; workers wake on it, and everybody, the caller
 * included, claims jobs with one atomic increment each until the list is
 * exhausted. The caller then waits for the workers still finishing a job.
 */
#include "agent/copier.h"

#include "common/chunk.h"
#include "common/log.h"
#include "common/thread.h"

#include <kvfabric/keys.h>

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>

struct kvf_copier {
    pthread_mutex_t lock;
    pthread_cond_t work; /* a new batch, or stop */
    pthread_cond_t done; /* a worker left the batch */
    kvf_copy_job_t *jobs;
    size_t num;
    atomic_size_t next;  /* the next job to claim */
    uint64_t generation; /* of the batch published */
    unsigned busy;       /* workers inside the current batch */
    bool stop;
    unsigned nthreads;
    pthread_t threads[];
};

static void kvf_copier_do(kvf_copy_job_t *job)
{
    job->sum = (job->dst != NULL)
                   ? kvf_chunk_copy_checksum(job->dst, job->src, job->len)
                   : kvf_chunk_checksum(job->src, job->len);
}

/* Claims and does jobs until none is left; @p between (the caller's)
 * after each. */
static void kvf_copier_drain(kvf_copier_t *copier, kvf_copy_job_t *jobs,
                             size_t num, kvf_copier_between_cb_t between,
                             void *arg)
{
    size_t i;

    while ((i = atomic_fetch_add_explicit(&copier->next, 1,
                                          memory_order_relaxed)) < num) {
        kvf_copier_do(&jobs[i]);
        if (between != NULL) {
            between(arg);
        }
    }
}

static void *kvf_copier_main(void *arg)
{
    kvf_copier_t *copier = arg;
    uint64_t seen        = 0;
    kvf_copy_job_t *jobs;
    size_t num;

    pthread_mutex_lock(&copier->lock);
    for (;;) {
        while (!copier->stop && (copier->generation == seen)) {
            pthread_cond_wait(&copier->work, &copier->lock);
        }
        if (copier->stop) {
            break;
        }
        seen = copier->generation;
        if (copier->jobs == NULL) {
            /* woke after its batch ended: claiming from it would take an
             * index of the next batch, which then nobody copies */
            continue;
        }
        jobs = copier->jobs;
        num  = copier->num;
        copier->busy++;
        pthread_mutex_unlock(&copier->lock);
        kvf_copier_drain(copier, jobs, num, NULL, NULL);
        pthread_mutex_lock(&copier->lock);
        if (--copier->busy == 0) {
            pthread_cond_signal(&copier->done);
        }
    }
    pthread_mutex_unlock(&copier->lock);
    return NULL;
}

kvf_status_t kvf_copier_create(unsigned workers, kvf_copier_t **copier_p)
{
    kvf_copier_t *copier;
    unsigned i;

    copier = calloc(1, sizeof(*copier) + workers * sizeof(pthread_t));
    if (copier == NULL) {
        return KVF_ERR_NO_MEMORY;
    }
    pthread_mutex_init(&copier->lock, NULL);
    pthread_cond_init(&copier->work, NULL);
    pthread_cond_init(&copier->done, NULL);
    atomic_init(&copier->next, 0);
    for (i = 0; i < workers; i++) {
        if (kvf_thread_start(&copier->threads[i], "kvf-copier", kvf_copier_main,
                             copier) != 0) {
            kvf_error("copier: cannot start worker %u of %u", i + 1, workers);
            kvf_copier_destroy(copier);
            return KVF_ERR_IO;
        }
        copier->nthreads++;
    }
    *copier_p = copier;
    return KVF_OK;
}

void kvf_copier_destroy(kvf_copier_t *copier)
{
    unsigned i;

    if (copier == NULL) {
        return;
    }
    pthread_mutex_lock(&copier->lock);
    copier->stop = true;
    pthread_cond_broadcast(&copier->work);
    pthread_mutex_unlock(&copier->lock);
    for (i = 0; i < copier->nthreads; i++) {
        pthread_join(copier->threads[i], NULL);
    }
    pthread_cond_destroy(&copier->done);
    pthread_cond_destroy(&copier->work);
    pthread_mutex_destroy(&copier->lock);
    free(copier);
}

void kvf_copier_run(kvf_copier_t *copier, kvf_copy_job_t *jobs, size_t n,
                    kvf_copier_between_cb_t between, void *arg)
{
    size_t i, bytes = 0;

    for (i = 0; i < n; i++) {
        bytes += jobs[i].len;
    }
    if ((copier == NULL) || (copier->nthreads == 0) || (n < 2) ||
        (bytes < KVF_COPIER_MIN_BATCH)) {
        for (i = 0; i < n; i++) {
            kvf_copier_do(&jobs[i]);
            if (between != NULL) {
                between(arg);
            }
        }
        return;
    }
    pthread_mutex_lock(&copier->lock);
    copier->jobs = jobs;
    copier->num  = n;
    atomic_store_explicit(&copier->next, 0, memory_order_relaxed);
    copier->generation++;
    pthread_cond_broadcast(&copier->work);
    pthread_mutex_unlock(&copier->lock);
    kvf_copier_drain(copier, jobs, n, between, arg);
    /* every job is claimed; wait for the workers still inside the batch
     * (a worker that wakes after this finds it exhausted at once) */
    pthread_mutex_lock(&copier->lock);
    while (copier->busy > 0) {
        pthread_cond_wait(&copier->done, &copier->lock);
    }
    copier->jobs = NULL;
    copier->num  = 0;
    pthread_mutex_unlock(&copier->lock);
}

unsigned kvf_copier_threads(const kvf_copier_t *copier)
{
    return (copier != NULL) ? copier->nthreads + 1 : 1;
}
