/* SPDX-License-Identifier: Apache-2.0 */
/* Copyright (c) 2026 The kvfabric authors */
/**
 * @file defs.h
 * Compiler helpers shared by the public headers.
 */
#ifndef KVFABRIC_DEFS_H
#define KVFABRIC_DEFS_H

/** Marks a function exported from libkvfabric.so (the rest stays hidden). */
#define KVF_API __attribute__((visibility("default")))

/** printf-style format checking for a function's format argument. */
#define KVF_PRINTF(_fmt_idx, _args_idx) \
    __attribute__((format(printf, _fmt_idx, _args_idx)))

#endif /* KVFABRIC_DEFS_H */
