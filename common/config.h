/* SPDX-License-Identifier: Apache-2.0 */
/* Copyright (c) 2026 The kvfabric authors */
/*
 * Typed configuration: one YAML file (--config FILE or KVF_CONFIG), every key
 * overridable by the environment (KVF_<KEY>) and by a flag (--key value or
 * --key=value, '_' written as '-'). Precedence: defaults < file < env < flags.
 *
 * A program describes its keys once in a schema (kvf_config_field_t table);
 * values land in the program's own struct at each field's offset:
 *   STRING, LIST -> char *  (malloc'd; freed by kvf_config_cleanup)
 *   BOOL         -> bool
 *   UINT         -> uint64_t
 *   SIZE         -> uint64_t bytes   ("4G", "512M", "64KiB", "4096")
 *   DURATION     -> uint64_t ns      ("500ms", "5s", "2m", "100us")
 *   ENUM         -> int              (index into choices)
 *
 * Unknown keys, wrong types and out-of-range values are errors that name the
 * source (file and line, environment variable, or flag) and the key.
 *
 * thread: a config is loaded once at startup, by one thread.
 */
#ifndef KVF_COMMON_CONFIG_H
#define KVF_COMMON_CONFIG_H

#include <kvfabric/status.h>

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

typedef enum {
    KVF_CONFIG_STRING,
    KVF_CONFIG_LIST, /* comma-separated in env/flags, a sequence in YAML */
    KVF_CONFIG_BOOL,
    KVF_CONFIG_UINT,
    KVF_CONFIG_SIZE,
    KVF_CONFIG_DURATION,
    KVF_CONFIG_ENUM,
} kvf_config_type_t;

enum {
    KVF_CONFIG_FIELD_CLI_ONLY = 1u << 0, /* a flag only: not in YAML or env */
    KVF_CONFIG_FIELD_SECRET   = 1u << 1, /* never printed; never a flag */
    KVF_CONFIG_FIELD_HOSTPORT = 1u << 2, /* STRING: HOST:PORT or empty */
};

typedef struct kvf_config_field {
    const char *name; /* YAML key, e.g. "pool_size" */
    kvf_config_type_t type;
    size_t offset;              /* offsetof() in the program's config */
    const char *default_value;  /* as text; NULL: empty string / 0 */
    uint64_t min;               /* numeric types: inclusive bounds; */
    uint64_t max;               /* max 0 means unbounded */
    const char *const *choices; /* ENUM: NULL-terminated names */
    unsigned flags;             /* KVF_CONFIG_FIELD_* */
    const char *help;           /* one line */
} kvf_config_field_t;

typedef struct kvf_config_schema {
    const char *program; /* "kvf-agent" */
    const kvf_config_field_t *fields;
    size_t num_fields;
} kvf_config_schema_t;

typedef struct kvf_config_error {
    char msg[512]; /* "agent.yaml:3: key 'pool_size': ..." */
} kvf_config_error_t;

/*
 * Fills @p cfg from defaults, the YAML file, the environment and argv[1..].
 * Parsing stops at the first argument that is not a flag (or after "--");
 * its index goes to @p argi_p (argc when all were consumed), so callers can
 * take positional words (kvfctl's command). "--config FILE" names the file;
 * KVF_CONFIG names it when no flag does.
 *
 * Returns KVF_OK, or KVF_ERR_CONFIG with @p err filled (nothing is logged:
 * the caller decides how to report it). On error @p cfg holds partial values
 * and must still be passed to kvf_config_cleanup().
 */
kvf_status_t kvf_config_load(const kvf_config_schema_t *schema, void *cfg,
                             int argc, const char *const *argv, int *argi_p,
                             kvf_config_error_t *err);

/* Frees the strings kvf_config_load() stored in @p cfg; safe to call twice. */
void kvf_config_cleanup(const kvf_config_schema_t *schema, void *cfg);

/* Prints "--flag VALUE  help (default: x; env KVF_X)" lines for --help. */
void kvf_config_print_help(const kvf_config_schema_t *schema, FILE *out);

/*
 * Checks the environment for KVF_* variables that @p schema does not know
 * (nor the few every program reads: KVF_CONFIG, KVF_LOG_LEVEL, ...), e.g.
 * a misspelled KVF_POOL_SISE, and writes one line per variable into
 * @p out (NUL-separated lines would be awkward: '\n'-separated, at most
 * @p len bytes) with the closest known name when there is one. Returns
 * how many were found; callers warn with it at start.
 */
unsigned kvf_config_check_env(const kvf_config_schema_t *schema, char *out,
                              size_t len);

/* Prints the effective configuration as YAML (secrets elided). */
void kvf_config_print(const kvf_config_schema_t *schema, const void *cfg,
                      FILE *out);

/* Value parsers, also used by kvfctl and the benchmarks. KVF_ERR_INVALID
 * for malformed text, KVF_ERR_RANGE for overflow. */
kvf_status_t kvf_config_parse_size(const char *text, uint64_t *bytes_p);
kvf_status_t kvf_config_parse_duration(const char *text, uint64_t *ns_p);
kvf_status_t kvf_config_parse_uint(const char *text, uint64_t *value_p);
kvf_status_t kvf_config_parse_bool(const char *text, bool *value_p);

/* Splits "HOST:PORT" ("[::1]:7000" for IPv6) into its parts. */
kvf_status_t kvf_config_parse_hostport(const char *text, char *host,
                                       size_t host_len, uint16_t *port_p);

#endif /* KVF_COMMON_CONFIG_H */
