/* SPDX-License-Identifier: Apache-2.0 */
/* Copyright (c) 2026 The kvfabric authors */
#include "tests/helpers/etcd.h"

#include "common/time.h"

#include <stdio.h>
#include <string.h>
#include <time.h>

int kvf_test_etcd_start(kvf_test_proc_t *proc, const char *dir, char *url,
                        size_t len)
{
    char data[300], client[64], peer[64], cluster[96], out[256];
    struct timespec step = {0, 10 * 1000 * 1000};
    uint16_t cport = kvf_test_free_port(), pport = kvf_test_free_port();
    uint64_t deadline;
    const char *argv[] = {KVF_TEST_ETCD_BIN,
                          "--name",
                          "kvf",
                          "--data-dir",
                          data,
                          "--listen-client-urls",
                          client,
                          "--advertise-client-urls",
                          client,
                          "--listen-peer-urls",
                          peer,
                          "--initial-advertise-peer-urls",
                          peer,
                          "--initial-cluster",
                          cluster,
                          NULL};

    snprintf(data, sizeof(data), "%s/etcd", dir);
    snprintf(client, sizeof(client), "http://127.0.0.1:%u", cport);
    snprintf(peer, sizeof(peer), "http://127.0.0.1:%u", pport);
    snprintf(cluster, sizeof(cluster), "kvf=%s", peer);
    if ((cport == pport) || (kvf_test_proc_start(proc, argv) != 0)) {
        snprintf(url, len, "cannot start %s", KVF_TEST_ETCD_BIN);
        return -1;
    }
    deadline = kvf_time_deadline_ns(20 * KVF_NSEC_PER_SEC);
    while (kvf_test_http_get(cport, "/health", out, sizeof(out)) != 200) {
        if (kvf_time_expired(deadline) || !kvf_test_proc_alive(proc)) {
            snprintf(url, len, "etcd did not start: %s",
                     kvf_test_proc_log(proc));
            return -1;
        }
        nanosleep(&step, NULL);
    }
    snprintf(url, len, "%s", client);
    return 0;
}
