/* SPDX-License-Identifier: Apache-2.0 */
/* Copyright (c) 2026 The kvfabric authors */
/*
 * docs/configuration.md must list every configuration key of every program,
 * with its environment variable and flag: a key added to a schema without
 * documentation fails here.
 */
#include "agent/config.h"
#include "controller/config.h"
#include "tests/helpers/test_helpers.h"

#include <criterion/criterion.h>

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

TestSuite(config_docs, .fini = kvf_test_check_leaks, .timeout = 10);

static char *read_docs(void)
{
    const char *path = kvf_test_source_path("docs/configuration.md");
    FILE *f          = fopen(path, "r");
    char *text;
    long len;

    cr_assert_not_null(f, "cannot open %s", path);
    fseek(f, 0, SEEK_END);
    len = ftell(f);
    fseek(f, 0, SEEK_SET);
    text = calloc(1, (size_t)len + 1);
    cr_assert_eq(fread(text, 1, (size_t)len, f), (size_t)len);
    fclose(f);
    return text;
}

/* The section of the page that belongs to @p program ("## kvf-agent"). */
static const char *docs_section(const char *text, const char *program,
                                size_t *len_p)
{
    char heading[128];
    const char *start, *end;

    snprintf(heading, sizeof(heading), "\n## %s\n", program);
    start = strstr(text, heading);
    cr_assert_not_null(start, "docs/configuration.md has no '## %s' section",
                       program);
    start += strlen(heading);
    end    = strstr(start, "\n## ");
    *len_p = (end != NULL) ? (size_t)(end - start) : strlen(start);
    return start;
}

static void check_schema(const kvf_config_schema_t *schema)
{
    char *text = read_docs();
    char needle[160], upper[80];
    const char *section;
    size_t len, i, j;
    char *copy;

    section = docs_section(text, schema->program, &len);
    copy    = strndup(section, len);
    for (i = 0; i < schema->num_fields; i++) {
        const kvf_config_field_t *f = &schema->fields[i];

        if (f->flags & KVF_CONFIG_FIELD_CLI_ONLY) {
            snprintf(needle, sizeof(needle), "`--");
            for (j = 0; f->name[j] != '\0'; j++) {
                size_t n      = strlen(needle);
                needle[n]     = (f->name[j] == '_') ? '-' : f->name[j];
                needle[n + 1] = '\0';
            }
            strcat(needle, "`");
            cr_expect(strstr(copy, needle) != NULL,
                      "%s: flag %s is not documented", schema->program, needle);
            continue;
        }
        snprintf(needle, sizeof(needle), "| `%s` |", f->name);
        cr_expect(strstr(copy, needle) != NULL,
                  "%s: key '%s' is missing from docs/configuration.md",
                  schema->program, f->name);
        for (j = 0; (f->name[j] != '\0') && (j < sizeof(upper) - 1); j++) {
            upper[j] = (char)toupper((unsigned char)f->name[j]);
        }
        upper[j] = '\0';
        snprintf(needle, sizeof(needle), "`KVF_%s`", upper);
        cr_expect(strstr(copy, needle) != NULL,
                  "%s: env %s of key '%s' is not documented", schema->program,
                  needle, f->name);
    }
    free(copy);
    free(text);
}

Test(config_docs, agent_keys_documented)
{
    check_schema(&kvf_agent_config_schema);
}

Test(config_docs, controller_keys_documented)
{
    check_schema(&kvf_controller_config_schema);
}
