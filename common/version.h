/* SPDX-License-Identifier: Apache-2.0 */
/* Copyright (c) 2026 The kvfabric authors */
/*
 * What every program prints for --version: the release, the git describe
 * of the tree it was built from and the build options (operators compare
 * these across a rolling upgrade, docs/operations.md).
 *
 * thread: any (constant strings).
 */
#ifndef KVF_COMMON_VERSION_H
#define KVF_COMMON_VERSION_H

#include <stdbool.h>
#include <stdio.h>

/* "0.1.0 (git 1a2b3c4-dirty)", static. */
const char *kvf_version_string(void);

/* Build options ("buildtype release, sanitizers none, cuda auto, ..."). */
const char *kvf_version_build(void);

/* Prints "PROG VERSION\nbuild: OPTIONS\n" to @p out. */
void kvf_version_print(const char *prog, FILE *out);

/* true when argv (before a "--") holds --version: mains answer it first,
 * as --help, without loading any configuration. */
bool kvf_version_asked(int argc, char *const *argv);

#endif /* KVF_COMMON_VERSION_H */
