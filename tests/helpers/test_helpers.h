/* SPDX-License-Identifier: Apache-2.0 */
/* Copyright (c) 2026 The kvfabric authors */
/*
 * Shared test fixtures.
 *
 * kvf_test_check_leaks: a Criterion suite .fini that makes LeakSanitizer
 * findings fail the test (Criterion alone exits 0 on leaks, STYLE.md B10).
 * kvf_test_log_capture_*: collect log lines so tests can assert on them.
 */
#ifndef KVF_TESTS_HELPERS_H
#define KVF_TESTS_HELPERS_H

#include <kvfabric/log.h>

#include <stdbool.h>
#include <stddef.h>

void kvf_test_check_leaks(void);

/* Routes log lines into a buffer (and away from stderr) until stop. */
void kvf_test_log_capture_start(void);
void kvf_test_log_capture_stop(void);
/* true when a captured line contains @p needle */
bool kvf_test_log_contains(const char *needle);
/* all captured text, lines joined by '\n' */
const char *kvf_test_log_text(void);

/* Path of a file in the source tree (KVF_SOURCE_ROOT), in a static buffer. */
const char *kvf_test_source_path(const char *rel);

/* Writes @p text to a new temporary file; returns its path (static). */
const char *kvf_test_write_temp(const char *text);

#endif /* KVF_TESTS_HELPERS_H */
