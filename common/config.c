/* SPDX-License-Identifier: Apache-2.0 */
/* Copyright (c) 2026 The kvfabric authors */
#include "common/config.h"

#include "common/byteorder.h"

#include <yaml.h>

#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

extern char **environ;

/* KVF_* variables read outside the schemas (any program may see them). */
static const char *const kvf_config_env_common[] = {
    "KVF_CONFIG",
    "KVF_LOG_LEVEL",
    "KVF_LIB",
    "KVF_BUILD_ROOT",
    "KVF_SOURCE_ROOT",
    "KVF_SOCKET",
    "KVF_CONTROLLER",
    "KVF_TLS_CA",
    "KVF_TLS_SERVER_NAME",
    "KVF_CLUSTER_SECRET_FILE",
};

#define KVF_CONFIG_NAME_MAX 64

/* Where a value came from, for error messages. */
typedef struct kvf_config_origin {
    const char *kind; /* "file", "env", "flag", "default" */
    const char *path; /* file path (kind "file") */
    size_t line;      /* 1-based (kind "file") */
} kvf_config_origin_t;

static void kvf_config_errorf(kvf_config_error_t *err, const char *fmt, ...)
    KVF_PRINTF(2, 3);

static void kvf_config_errorf(kvf_config_error_t *err, const char *fmt, ...)
{
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(err->msg, sizeof(err->msg), fmt, ap);
    va_end(ap);
}

/* "file.yaml:3: key 'x'", "environment KVF_X", "flag --x" */
static void kvf_config_origin_format(const kvf_config_origin_t *origin,
                                     const kvf_config_field_t *field,
                                     const char *key, char *buf, size_t len)
{
    char upper[KVF_CONFIG_NAME_MAX];
    size_t i;

    if (strcmp(origin->kind, "file") == 0) {
        snprintf(buf, len, "%s:%zu: key '%s'", origin->path, origin->line, key);
    } else if (strcmp(origin->kind, "env") == 0) {
        for (i = 0; (key[i] != '\0') && (i < sizeof(upper) - 1); i++) {
            upper[i] = (char)toupper((unsigned char)key[i]);
        }
        upper[i] = '\0';
        snprintf(buf, len, "environment variable KVF_%s", upper);
    } else if (strcmp(origin->kind, "flag") == 0) {
        snprintf(buf, len, "flag --%s", key);
        for (i = 7; buf[i] != '\0'; i++) {
            if (buf[i] == '_') {
                buf[i] = '-';
            }
        }
    } else {
        snprintf(buf, len, "default of key '%s'",
                 (field != NULL) ? field->name : key);
    }
}

/* Splits "123abc" into 123 and "abc"; the number must be plain decimal. */
static kvf_status_t kvf_config_parse_number_unit(const char *text,
                                                 uint64_t *value_p,
                                                 const char **unit_p)
{
    unsigned long long value;
    char *end;

    if ((text == NULL) || !isdigit((unsigned char)text[0])) {
        return KVF_ERR_INVALID;
    }
    errno = 0;
    value = strtoull(text, &end, 10);
    if (errno == ERANGE) {
        return KVF_ERR_RANGE;
    }
    while (*end == ' ') {
        end++;
    }
    *value_p = value;
    *unit_p  = end;
    return KVF_OK;
}

kvf_status_t kvf_config_parse_uint(const char *text, uint64_t *value_p)
{
    const char *unit;

    if ((text != NULL) && (text[strspn(text, "0123456789")] != '\0')) {
        return KVF_ERR_INVALID; /* digits only */
    }
    return kvf_config_parse_number_unit(text, value_p, &unit);
}

static kvf_status_t kvf_config_scale(uint64_t value, uint64_t mult,
                                     uint64_t *out_p)
{
    if ((mult != 0) && (value > UINT64_MAX / mult)) {
        return KVF_ERR_RANGE;
    }
    *out_p = value * mult;
    return KVF_OK;
}

typedef struct kvf_config_unit {
    const char *unit;
    uint64_t mult;
} kvf_config_unit_t;

/* @p text as a number and one of @p units (compared by @p cmp), scaled. */
static kvf_status_t
kvf_config_parse_units(const char *text, const kvf_config_unit_t *units,
                       size_t n, int (*cmp)(const char *, const char *),
                       uint64_t *out_p)
{
    const char *unit;
    uint64_t value;
    kvf_status_t status;
    size_t i;

    status = kvf_config_parse_number_unit(text, &value, &unit);
    if (status != KVF_OK) {
        return status;
    }
    if ((*unit == '\0') && (value == 0)) {
        *out_p = 0; /* "0" needs no unit */
        return KVF_OK;
    }
    for (i = 0; i < n; i++) {
        if (cmp(unit, units[i].unit) == 0) {
            return kvf_config_scale(value, units[i].mult, out_p);
        }
    }
    return KVF_ERR_INVALID;
}

kvf_status_t kvf_config_parse_size(const char *text, uint64_t *bytes_p)
{
    static const kvf_config_unit_t units[] = {
        {"", 1},
        {"b", 1},
        {"k", 1ull << 10},
        {"kb", 1ull << 10},
        {"kib", 1ull << 10},
        {"m", 1ull << 20},
        {"mb", 1ull << 20},
        {"mib", 1ull << 20},
        {"g", 1ull << 30},
        {"gb", 1ull << 30},
        {"gib", 1ull << 30},
        {"t", 1ull << 40},
        {"tb", 1ull << 40},
        {"tib", 1ull << 40},
    };

    return kvf_config_parse_units(text, units, KVF_ARRAY_SIZE(units),
                                  strcasecmp, bytes_p);
}

kvf_status_t kvf_config_parse_duration(const char *text, uint64_t *ns_p)
{
    static const kvf_config_unit_t units[] = {
        {"ns", 1},
        {"us", 1000ull},
        {"ms", 1000000ull},
        {"s", 1000000000ull},
        {"m", 60ull * 1000000000ull},
        {"min", 60ull * 1000000000ull},
        {"h", 3600ull * 1000000000ull},
    };

    return kvf_config_parse_units(text, units, KVF_ARRAY_SIZE(units), strcmp,
                                  ns_p);
}

kvf_status_t kvf_config_parse_bool(const char *text, bool *value_p)
{
    static const char *const yes[] = {"true", "yes", "on", "1"};
    static const char *const no[]  = {"false", "no", "off", "0"};
    size_t i;

    if (text == NULL) {
        return KVF_ERR_INVALID;
    }
    for (i = 0; i < 4; i++) {
        if (strcasecmp(text, yes[i]) == 0) {
            *value_p = true;
            return KVF_OK;
        }
        if (strcasecmp(text, no[i]) == 0) {
            *value_p = false;
            return KVF_OK;
        }
    }
    return KVF_ERR_INVALID;
}

kvf_status_t kvf_config_parse_hostport(const char *text, char *host,
                                       size_t host_len, uint16_t *port_p)
{
    const char *colon, *hbeg, *hend;
    uint64_t port;
    size_t len;

    if ((text == NULL) || (host == NULL) || (host_len == 0)) {
        return KVF_ERR_INVALID;
    }
    if (text[0] == '[') {
        hbeg = text + 1;
        hend = strchr(hbeg, ']');
        if ((hend == NULL) || (hend[1] != ':')) {
            return KVF_ERR_INVALID;
        }
        colon = hend + 1;
    } else {
        hbeg  = text;
        colon = strrchr(text, ':');
        if ((colon == NULL) ||
            (memchr(text, ':', (size_t)(colon - text)) != NULL)) {
            return KVF_ERR_INVALID; /* bare IPv6 needs brackets */
        }
        hend = colon;
    }
    len = (size_t)(hend - hbeg);
    if ((len == 0) || (len >= host_len) ||
        (kvf_config_parse_uint(colon + 1, &port) != KVF_OK) ||
        (port > UINT16_MAX)) {
        return KVF_ERR_INVALID;
    }
    memcpy(host, hbeg, len);
    host[len] = '\0';
    *port_p   = (uint16_t)port;
    return KVF_OK;
}

static void *kvf_config_slot(const kvf_config_field_t *field, void *cfg)
{
    return (char *)cfg + field->offset;
}

static const char *kvf_config_type_hint(const kvf_config_field_t *field)
{
    switch (field->type) {
    case KVF_CONFIG_BOOL:
        return "a boolean (true/false)";
    case KVF_CONFIG_UINT:
        return "a non-negative integer";
    case KVF_CONFIG_SIZE:
        return "a size (e.g. 4096, 64K, 512M, 4G)";
    case KVF_CONFIG_DURATION:
        return "a duration (e.g. 250ms, 5s, 2m)";
    case KVF_CONFIG_ENUM:
        return "one of the listed choices";
    default:
        return "a string";
    }
}

static kvf_status_t kvf_config_set_string(char **slot, const char *value)
{
    char *copy = strdup(value);

    if (copy == NULL) {
        return KVF_ERR_NO_MEMORY;
    }
    free(*slot);
    *slot = copy;
    return KVF_OK;
}

/* Parses @p value into @p field of @p cfg, checking type and range. */
static kvf_status_t kvf_config_set(const kvf_config_field_t *field, void *cfg,
                                   const char *value,
                                   const kvf_config_origin_t *origin,
                                   const char *key, kvf_config_error_t *err)
{
    char where[KVF_CONFIG_NAME_MAX + 300];
    void *slot = kvf_config_slot(field, cfg);
    kvf_status_t status;
    uint64_t num = 0;
    bool flag;
    size_t i;

    kvf_config_origin_format(origin, field, key, where, sizeof(where));
    switch (field->type) {
    case KVF_CONFIG_STRING:
    case KVF_CONFIG_LIST:
        if ((field->flags & KVF_CONFIG_FIELD_HOSTPORT) && (value[0] != '\0')) {
            char host[256];
            uint16_t port;

            if (kvf_config_parse_hostport(value, host, sizeof(host), &port) !=
                KVF_OK) {
                kvf_config_errorf(
                    err, "%s: '%s' is not HOST:PORT (%s)", where, value,
                    (strspn(value, "0123456789") == strlen(value))
                        ? "a port alone: write 0.0.0.0:PORT or 127.0.0.1:PORT"
                        : "e.g. 10.0.0.5:7400, IPv6 as [::1]:7400");
                return KVF_ERR_CONFIG;
            }
        }
        status = kvf_config_set_string((char **)slot, value);
        if (status != KVF_OK) {
            kvf_config_errorf(err, "%s: out of memory", where);
        }
        return status;
    case KVF_CONFIG_BOOL:
        if (kvf_config_parse_bool(value, &flag) != KVF_OK) {
            kvf_config_errorf(err, "%s: '%s' is not %s", where, value,
                              kvf_config_type_hint(field));
            return KVF_ERR_CONFIG;
        }
        *(bool *)slot = flag;
        return KVF_OK;
    case KVF_CONFIG_ENUM:
        for (i = 0; field->choices[i] != NULL; i++) {
            if (strcasecmp(value, field->choices[i]) == 0) {
                *(int *)slot = (int)i;
                return KVF_OK;
            }
        }
        {
            char list[256] = "";
            for (i = 0; field->choices[i] != NULL; i++) {
                strncat(list, (i == 0) ? "" : ", ",
                        sizeof(list) - strlen(list) - 1);
                strncat(list, field->choices[i],
                        sizeof(list) - strlen(list) - 1);
            }
            kvf_config_errorf(err, "%s: '%s' is not one of: %s", where, value,
                              list);
        }
        return KVF_ERR_CONFIG;
    case KVF_CONFIG_UINT:
        status = kvf_config_parse_uint(value, &num);
        break;
    case KVF_CONFIG_SIZE:
        status = kvf_config_parse_size(value, &num);
        break;
    case KVF_CONFIG_DURATION:
        status = kvf_config_parse_duration(value, &num);
        break;
    default:
        kvf_config_errorf(err, "%s: bad field type", where);
        return KVF_ERR_CONFIG;
    }

    if (status == KVF_ERR_RANGE) {
        kvf_config_errorf(err, "%s: '%s' is too large", where, value);
        return KVF_ERR_CONFIG;
    }
    if (status != KVF_OK) {
        kvf_config_errorf(err, "%s: '%s' is not %s", where, value,
                          kvf_config_type_hint(field));
        return KVF_ERR_CONFIG;
    }
    if ((num < field->min) || ((field->max != 0) && (num > field->max))) {
        if (field->max != 0) {
            kvf_config_errorf(
                err, "%s: '%s' is out of range [%" PRIu64 ", %" PRIu64 "]%s",
                where, value, field->min, field->max,
                (field->type == KVF_CONFIG_DURATION) ? " ns"
                : (field->type == KVF_CONFIG_SIZE)   ? " bytes"
                                                     : "");
        } else {
            kvf_config_errorf(err,
                              "%s: '%s' is below the minimum %" PRIu64 "%s",
                              where, value, field->min,
                              (field->type == KVF_CONFIG_DURATION) ? " ns"
                              : (field->type == KVF_CONFIG_SIZE)   ? " bytes"
                                                                   : "");
        }
        return KVF_ERR_CONFIG;
    }
    *(uint64_t *)slot = num;
    return KVF_OK;
}

static const kvf_config_field_t *
kvf_config_find(const kvf_config_schema_t *schema, const char *name,
                size_t name_len)
{
    const kvf_config_field_t *field;
    size_t i, j;

    for (i = 0; i < schema->num_fields; i++) {
        field = &schema->fields[i];
        if (strlen(field->name) != name_len) {
            continue;
        }
        /* '-' in a flag matches '_' in a key */
        for (j = 0; j < name_len; j++) {
            char c = (name[j] == '-') ? '_' : name[j];
            if (c != field->name[j]) {
                break;
            }
        }
        if (j == name_len) {
            return field;
        }
    }
    return NULL;
}

static kvf_status_t kvf_config_apply_defaults(const kvf_config_schema_t *schema,
                                              void *cfg,
                                              kvf_config_error_t *err)
{
    const kvf_config_origin_t origin = {.kind = "default"};
    const kvf_config_field_t *field;
    kvf_status_t status;
    size_t i;

    for (i = 0; i < schema->num_fields; i++) {
        field = &schema->fields[i];
        if (field->default_value == NULL) {
            continue;
        }
        status = kvf_config_set(field, cfg, field->default_value, &origin,
                                field->name, err);
        if (status != KVF_OK) {
            return status;
        }
    }
    return KVF_OK;
}

/* Appends @p item to the comma-joined list being built for a LIST key. */
static kvf_status_t kvf_config_list_append(char **list, const char *item)
{
    size_t old = (*list == NULL) ? 0 : strlen(*list);
    size_t len = strlen(item);
    char *grown;

    grown = realloc(*list, old + len + 2);
    if (grown == NULL) {
        return KVF_ERR_NO_MEMORY;
    }
    if (old > 0) {
        grown[old++] = ',';
    }
    memcpy(grown + old, item, len + 1);
    *list = grown;
    return KVF_OK;
}

typedef struct kvf_config_yaml {
    const kvf_config_schema_t *schema;
    void *cfg;
    const char *path;
    yaml_parser_t parser;
    kvf_config_error_t *err;
} kvf_config_yaml_t;

static kvf_status_t kvf_config_yaml_next(kvf_config_yaml_t *y,
                                         yaml_event_t *event)
{
    if (!yaml_parser_parse(&y->parser, event)) {
        kvf_config_errorf(y->err, "%s:%zu: YAML syntax error: %s", y->path,
                          y->parser.problem_mark.line + 1,
                          (y->parser.problem != NULL) ? y->parser.problem
                                                      : "unknown");
        return KVF_ERR_CONFIG;
    }
    return KVF_OK;
}

/* Reads one value (scalar, or sequence of scalars for LIST keys). */
static kvf_status_t kvf_config_yaml_value(kvf_config_yaml_t *y,
                                          const kvf_config_field_t *field,
                                          const char *key, size_t line)
{
    const kvf_config_origin_t origin = {"file", y->path, line};
    yaml_event_t event;
    kvf_status_t status;
    char *list = NULL;

    status = kvf_config_yaml_next(y, &event);
    if (status != KVF_OK) {
        return status;
    }
    if (event.type == YAML_SCALAR_EVENT) {
        status =
            kvf_config_set(field, y->cfg, (const char *)event.data.scalar.value,
                           &origin, key, y->err);
        yaml_event_delete(&event);
        return status;
    }
    if ((event.type != YAML_SEQUENCE_START_EVENT) ||
        (field->type != KVF_CONFIG_LIST)) {
        kvf_config_errorf(
            y->err, "%s:%zu: key '%s': expected %s, not a %s", y->path, line,
            key, kvf_config_type_hint(field),
            (event.type == YAML_SEQUENCE_START_EVENT) ? "list" : "mapping");
        yaml_event_delete(&event);
        return KVF_ERR_CONFIG;
    }
    yaml_event_delete(&event);
    for (;;) {
        status = kvf_config_yaml_next(y, &event);
        if (status != KVF_OK) {
            break;
        }
        if (event.type == YAML_SEQUENCE_END_EVENT) {
            yaml_event_delete(&event);
            status = kvf_config_set(field, y->cfg, (list == NULL) ? "" : list,
                                    &origin, key, y->err);
            break;
        }
        if (event.type != YAML_SCALAR_EVENT) {
            kvf_config_errorf(y->err,
                              "%s:%zu: key '%s': list items must be plain "
                              "values",
                              y->path, event.start_mark.line + 1, key);
            yaml_event_delete(&event);
            status = KVF_ERR_CONFIG;
            break;
        }
        status = kvf_config_list_append(&list,
                                        (const char *)event.data.scalar.value);
        yaml_event_delete(&event);
        if (status != KVF_OK) {
            kvf_config_errorf(y->err, "%s:%zu: out of memory", y->path, line);
            break;
        }
    }
    free(list);
    return status;
}

static kvf_status_t kvf_config_yaml_mapping(kvf_config_yaml_t *y,
                                            uint64_t *seen)
{
    const kvf_config_field_t *field;
    char key[KVF_CONFIG_NAME_MAX];
    yaml_event_t event;
    kvf_status_t status;
    size_t line, idx;

    for (;;) {
        status = kvf_config_yaml_next(y, &event);
        if (status != KVF_OK) {
            return status;
        }
        if (event.type == YAML_MAPPING_END_EVENT) {
            yaml_event_delete(&event);
            return KVF_OK;
        }
        line = event.start_mark.line + 1;
        if (event.type != YAML_SCALAR_EVENT) {
            kvf_config_errorf(y->err, "%s:%zu: keys must be plain words",
                              y->path, line);
            yaml_event_delete(&event);
            return KVF_ERR_CONFIG;
        }
        snprintf(key, sizeof(key), "%s", (const char *)event.data.scalar.value);
        field = kvf_config_find(y->schema, key, strlen(key));
        if ((field == NULL) || (strchr(key, '-') != NULL) ||
            (field->flags & KVF_CONFIG_FIELD_CLI_ONLY)) {
            kvf_config_errorf(
                y->err, "%s:%zu: unknown key '%s' for %s", y->path, line,
                (const char *)event.data.scalar.value, y->schema->program);
            yaml_event_delete(&event);
            return KVF_ERR_CONFIG;
        }
        yaml_event_delete(&event);
        idx = (size_t)(field - y->schema->fields);
        if (seen[idx / 64] & (1ull << (idx % 64))) {
            kvf_config_errorf(y->err, "%s:%zu: key '%s' appears twice", y->path,
                              line, key);
            return KVF_ERR_CONFIG;
        }
        seen[idx / 64] |= 1ull << (idx % 64);
        status = kvf_config_yaml_value(y, field, key, line);
        if (status != KVF_OK) {
            return status;
        }
    }
}

static kvf_status_t kvf_config_load_file(const kvf_config_schema_t *schema,
                                         void *cfg, const char *path,
                                         kvf_config_error_t *err)
{
    kvf_config_yaml_t y = {
        .schema = schema, .cfg = cfg, .path = path, .err = err};
    uint64_t *seen;
    yaml_event_t event;
    kvf_status_t status;
    FILE *file;
    bool done = false;

    file = fopen(path, "r");
    if (file == NULL) {
        kvf_config_errorf(err, "%s: cannot open config file: %s", path,
                          strerror(errno));
        return KVF_ERR_CONFIG;
    }
    seen = calloc((schema->num_fields + 63) / 64 + 1, sizeof(*seen));
    if ((seen == NULL) || !yaml_parser_initialize(&y.parser)) {
        kvf_config_errorf(err, "%s: out of memory", path);
        free(seen);
        fclose(file);
        return KVF_ERR_NO_MEMORY;
    }
    yaml_parser_set_input_file(&y.parser, file);

    status = KVF_OK;
    while ((status == KVF_OK) && !done) {
        status = kvf_config_yaml_next(&y, &event);
        if (status != KVF_OK) {
            break;
        }
        switch (event.type) {
        case YAML_STREAM_START_EVENT:
        case YAML_DOCUMENT_START_EVENT:
        case YAML_DOCUMENT_END_EVENT:
            break;
        case YAML_STREAM_END_EVENT:
            done = true;
            break;
        case YAML_MAPPING_START_EVENT:
            status = kvf_config_yaml_mapping(&y, seen);
            break;
        case YAML_SCALAR_EVENT:
            if (event.data.scalar.length == 0) {
                break; /* an empty document */
            }
            /* fall through */
        default:
            kvf_config_errorf(err,
                              "%s:%zu: expected a mapping of 'key: value' "
                              "lines",
                              path, event.start_mark.line + 1);
            status = KVF_ERR_CONFIG;
            break;
        }
        yaml_event_delete(&event);
    }

    yaml_parser_delete(&y.parser);
    free(seen);
    fclose(file);
    return status;
}

/* The environment variable of @p field: KVF_ + its name in upper case. */
static void kvf_config_env_name(const kvf_config_field_t *field, char *var,
                                size_t len)
{
    size_t j;

    snprintf(var, len, "KVF_");
    for (j = 0; (field->name[j] != '\0') && (4 + j + 1 < len); j++) {
        var[4 + j] = (char)toupper((unsigned char)field->name[j]);
    }
    var[4 + j] = '\0';
}

static kvf_status_t kvf_config_load_env(const kvf_config_schema_t *schema,
                                        void *cfg, kvf_config_error_t *err)
{
    const kvf_config_origin_t origin = {.kind = "env"};
    const kvf_config_field_t *field;
    char var[KVF_CONFIG_NAME_MAX + 4];
    const char *value;
    kvf_status_t status;
    size_t i;

    for (i = 0; i < schema->num_fields; i++) {
        field = &schema->fields[i];
        if (field->flags & KVF_CONFIG_FIELD_CLI_ONLY) {
            continue;
        }
        kvf_config_env_name(field, var, sizeof(var));
        value = getenv(var);
        if (value == NULL) {
            continue;
        }
        status = kvf_config_set(field, cfg, value, &origin, field->name, err);
        if (status != KVF_OK) {
            return status;
        }
    }
    return KVF_OK;
}

/* Edit distance of two short names (capped at 9: "not close"). */
static unsigned kvf_config_distance(const char *a, const char *b)
{
    unsigned row[64], i, j, prev, cur;
    size_t la = strlen(a), lb = strlen(b);

    if ((la >= 63) || (lb >= 63)) {
        return 9;
    }
    for (j = 0; j <= lb; j++) {
        row[j] = j;
    }
    for (i = 1; i <= la; i++) {
        prev   = row[0];
        row[0] = i;
        for (j = 1; j <= lb; j++) {
            cur    = row[j];
            row[j] = (a[i - 1] == b[j - 1]) ? prev : 1 + prev;
            if (row[j - 1] + 1 < row[j]) {
                row[j] = row[j - 1] + 1;
            }
            if (cur + 1 < row[j]) {
                row[j] = cur + 1;
            }
            prev = cur;
        }
    }
    return (row[lb] > 9) ? 9 : row[lb];
}

unsigned kvf_config_check_env(const kvf_config_schema_t *schema, char *out,
                              size_t len)
{
    char var[KVF_CONFIG_NAME_MAX + 8], name[KVF_CONFIG_NAME_MAX + 8];
    char best[KVF_CONFIG_NAME_MAX + 8];
    unsigned found = 0, dist, best_dist;
    size_t used    = 0, i, n;
    char **e;

    if (len > 0) {
        out[0] = '\0';
    }
    for (e = environ; (e != NULL) && (*e != NULL); e++) {
        const char *eq = strchr(*e, '=');
        bool known     = false;

        n = (eq != NULL) ? (size_t)(eq - *e) : strlen(*e);
        if ((strncmp(*e, "KVF_", 4) != 0) || (n >= sizeof(name)) ||
            (strncmp(*e, "KVF_BENCH_", 10) == 0)) {
            /* KVF_BENCH_*: kvf-bench's own, seen by the daemons it runs */
            continue;
        }
        memcpy(name, *e, n);
        name[n]   = '\0';
        best[0]   = '\0';
        best_dist = 9;
        for (i = 0; !known && (i < sizeof(kvf_config_env_common) /
                                       sizeof(kvf_config_env_common[0]));
             i++) {
            known = strcmp(name, kvf_config_env_common[i]) == 0;
        }
        for (i = 0; !known && (i < schema->num_fields); i++) {
            if (schema->fields[i].flags & KVF_CONFIG_FIELD_CLI_ONLY) {
                continue;
            }
            kvf_config_env_name(&schema->fields[i], var, sizeof(var));
            known = strcmp(name, var) == 0;
            dist  = kvf_config_distance(name, var);
            if (dist < best_dist) {
                best_dist = dist;
                snprintf(best, sizeof(best), "%s", var);
            }
        }
        if (known) {
            continue;
        }
        found++;
        if (used < len) {
            used +=
                (size_t)snprintf(out + used, len - used,
                                 "%s%s is not a %s setting (ignored)%s%s",
                                 (used > 0) ? "\n" : "", name, schema->program,
                                 (best_dist <= 2) ? "; did you mean " : "",
                                 (best_dist <= 2) ? best : "");
        }
    }
    return found;
}

/* Finds "--config FILE" / "--config=FILE" before the first positional. */
/* Finds "--config FILE" among the flags, stepping over the values of
 * other flags as kvf_config_load_flags() will ("--listen X --config F"). */
static kvf_status_t kvf_config_find_file(const kvf_config_schema_t *schema,
                                         int argc, const char *const *argv,
                                         const char **path_p,
                                         kvf_config_error_t *err)
{
    const kvf_config_field_t *field;
    int i;

    *path_p = getenv("KVF_CONFIG");
    for (i = 1; i < argc; i++) {
        if ((strcmp(argv[i], "--") == 0) || (argv[i][0] != '-')) {
            break;
        }
        if (strcmp(argv[i], "--config") == 0) {
            if (i + 1 >= argc) {
                kvf_config_errorf(err, "flag --config: needs a file path");
                return KVF_ERR_CONFIG;
            }
            *path_p = argv[++i];
        } else if (strncmp(argv[i], "--config=", 9) == 0) {
            *path_p = argv[i] + 9;
        } else if ((strncmp(argv[i], "--", 2) == 0) &&
                   (strchr(argv[i], '=') == NULL)) {
            field = kvf_config_find(schema, argv[i] + 2, strlen(argv[i] + 2));
            if ((field != NULL) && (field->type != KVF_CONFIG_BOOL)) {
                i++; /* its value, whatever it looks like */
            }
        }
    }
    if ((*path_p != NULL) && (**path_p == '\0')) {
        *path_p = NULL;
    }
    return KVF_OK;
}

static kvf_status_t kvf_config_load_flags(const kvf_config_schema_t *schema,
                                          void *cfg, int argc,
                                          const char *const *argv, int *argi_p,
                                          kvf_config_error_t *err)
{
    const kvf_config_origin_t origin = {.kind = "flag"};
    const kvf_config_field_t *field;
    char key[KVF_CONFIG_NAME_MAX];
    const char *arg, *eq, *value;
    kvf_status_t status;
    size_t name_len;
    int i;

    for (i = 1; i < argc; i++) {
        arg = argv[i];
        if (strcmp(arg, "--") == 0) {
            i++;
            break;
        }
        if (arg[0] != '-') {
            break; /* first positional word */
        }
        if ((arg[1] != '-') || (arg[2] == '\0')) {
            kvf_config_errorf(err,
                              "unknown flag '%s' for %s (flags are "
                              "--name VALUE; see --help)",
                              arg, schema->program);
            return KVF_ERR_CONFIG;
        }
        arg += 2;
        eq       = strchr(arg, '=');
        name_len = (eq != NULL) ? (size_t)(eq - arg) : strlen(arg);
        if ((name_len == 6) && (strncmp(arg, "config", 6) == 0)) {
            i += (eq == NULL) ? 1 : 0; /* handled by kvf_config_find_file */
            continue;
        }
        field = kvf_config_find(schema, arg, name_len);
        if ((field == NULL) || (field->flags & KVF_CONFIG_FIELD_SECRET) ||
            (name_len >= sizeof(key))) {
            kvf_config_errorf(err, "unknown flag '%s' for %s (see --help)",
                              argv[i], schema->program);
            return KVF_ERR_CONFIG;
        }
        memcpy(key, arg, name_len);
        key[name_len] = '\0';
        if (eq != NULL) {
            value = eq + 1;
        } else if (field->type == KVF_CONFIG_BOOL) {
            value = "true"; /* --flag alone switches a boolean on */
        } else if (i + 1 < argc) {
            value = argv[++i];
        } else {
            kvf_config_errorf(err, "flag --%s: needs a value (%s)", key,
                              kvf_config_type_hint(field));
            return KVF_ERR_CONFIG;
        }
        status = kvf_config_set(field, cfg, value, &origin, key, err);
        if (status != KVF_OK) {
            return status;
        }
    }
    *argi_p = i;
    return KVF_OK;
}

kvf_status_t kvf_config_load(const kvf_config_schema_t *schema, void *cfg,
                             int argc, const char *const *argv, int *argi_p,
                             kvf_config_error_t *err)
{
    const char *path = NULL;
    kvf_status_t status;
    int argi = argc;

    err->msg[0] = '\0';
    status      = kvf_config_apply_defaults(schema, cfg, err);
    if (status != KVF_OK) {
        return KVF_ERR_CONFIG;
    }
    status = kvf_config_find_file(schema, argc, argv, &path, err);
    if (status != KVF_OK) {
        return status;
    }
    if (path != NULL) {
        status = kvf_config_load_file(schema, cfg, path, err);
        if (status != KVF_OK) {
            return KVF_ERR_CONFIG;
        }
    }
    status = kvf_config_load_env(schema, cfg, err);
    if (status != KVF_OK) {
        return KVF_ERR_CONFIG;
    }
    status = kvf_config_load_flags(schema, cfg, argc, argv, &argi, err);
    if (status != KVF_OK) {
        return KVF_ERR_CONFIG;
    }
    if (argi_p != NULL) {
        *argi_p = argi;
    }
    return KVF_OK;
}

void kvf_config_cleanup(const kvf_config_schema_t *schema, void *cfg)
{
    const kvf_config_field_t *field;
    char **slot;
    size_t i;

    for (i = 0; i < schema->num_fields; i++) {
        field = &schema->fields[i];
        if ((field->type == KVF_CONFIG_STRING) ||
            (field->type == KVF_CONFIG_LIST)) {
            slot = kvf_config_slot(field, cfg);
            free(*slot);
            *slot = NULL;
        }
    }
}

static void kvf_config_print_flag(const kvf_config_field_t *field, FILE *out)
{
    const char *p;

    fputs("  --", out);
    for (p = field->name; *p != '\0'; p++) {
        fputc((*p == '_') ? '-' : *p, out);
    }
}

void kvf_config_print_help(const kvf_config_schema_t *schema, FILE *out)
{
    const kvf_config_field_t *field;
    size_t i;

    fprintf(out, "options (also YAML keys in --config FILE and KVF_<KEY> "
                 "environment variables):\n");
    fprintf(out, "  --config FILE\n      YAML configuration file (env "
                 "KVF_CONFIG)\n");
    for (i = 0; i < schema->num_fields; i++) {
        field = &schema->fields[i];
        if (field->flags & KVF_CONFIG_FIELD_SECRET) {
            fprintf(out, "  %s (YAML key or env only)\n", field->name);
        } else {
            kvf_config_print_flag(field, out);
            fputc('\n', out);
        }
        fprintf(out, "      %s", field->help);
        if ((field->default_value != NULL) && (*field->default_value != '\0')) {
            fprintf(out, " (default: %s)", field->default_value);
        }
        fputc('\n', out);
    }
}

void kvf_config_print(const kvf_config_schema_t *schema, const void *cfg,
                      FILE *out)
{
    const kvf_config_field_t *field;
    const void *slot;
    size_t i;

    for (i = 0; i < schema->num_fields; i++) {
        field = &schema->fields[i];
        if (field->flags & KVF_CONFIG_FIELD_CLI_ONLY) {
            continue;
        }
        slot = (const char *)cfg + field->offset;
        fprintf(out, "%s: ", field->name);
        switch (field->type) {
        case KVF_CONFIG_STRING:
        case KVF_CONFIG_LIST:
            if (field->flags & KVF_CONFIG_FIELD_SECRET) {
                fputs("(secret)", out);
            } else {
                fprintf(out, "\"%s\"",
                        (*(char *const *)slot == NULL) ? ""
                                                       : *(char *const *)slot);
            }
            break;
        case KVF_CONFIG_BOOL:
            fputs(*(const bool *)slot ? "true" : "false", out);
            break;
        case KVF_CONFIG_ENUM:
            fputs(field->choices[*(const int *)slot], out);
            break;
        case KVF_CONFIG_DURATION: {
            uint64_t ns = *(const uint64_t *)slot;
            if (ns % 1000000u == 0) {
                fprintf(out, "%" PRIu64 "ms", (uint64_t)(ns / 1000000u));
            } else {
                fprintf(out, "%" PRIu64 "ns", ns);
            }
            break;
        }
        default:
            fprintf(out, "%" PRIu64, *(const uint64_t *)slot);
            break;
        }
        fputc('\n', out);
    }
}
