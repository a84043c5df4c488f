/* SPDX-License-Identifier: Apache-2.0 */
/* Copyright (c) 2026 The kvfabric authors */
/*
 * A real etcd (Debian etcd-server 3.4) for the HA tests: one member on
 * free loopback ports, data under a scratch folder.
 */
#ifndef KVF_TESTS_ETCD_H
#define KVF_TESTS_ETCD_H

#include "tests/helpers/proc.h"

#include <stddef.h>

#define KVF_TEST_ETCD_BIN "/usr/bin/etcd"

/* Starts one etcd member with its data in @p dir/etcd and waits (20 s)
 * until /health answers; its client URL into @p url. 0, or -1 with the
 * reason in @p url (not started, or did not get healthy). */
int kvf_test_etcd_start(kvf_test_proc_t *proc, const char *dir, char *url,
                        size_t len);

#endif /* KVF_TESTS_ETCD_H */
