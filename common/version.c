/* SPDX-License-Identifier: Apache-2.0 */
/* Copyright (c) 2026 The kvfabric authors */
#include "common/version.h"

#include "common/version_gen.h"

#include <string.h>

const char *kvf_version_string(void)
{
    return KVF_VERSION_PROJECT " (git " KVF_VERSION_GIT ")";
}

const char *kvf_version_build(void)
{
    return KVF_VERSION_BUILD;
}

void kvf_version_print(const char *prog, FILE *out)
{
    fprintf(out, "%s %s\nbuild: %s\n", prog, kvf_version_string(),
            kvf_version_build());
}

bool kvf_version_asked(int argc, char *const *argv)
{
    int i;

    for (i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--") == 0) {
            break;
        }
        if (strcmp(argv[i], "--version") == 0) {
            return true;
        }
    }
    return false;
}
