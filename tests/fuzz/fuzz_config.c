/* SPDX-License-Identifier: Apache-2.0 */
/* Copyright (c) 2026 The kvfabric authors */
/*
 * libFuzzer target for the config loader: the input is the YAML file given
 * to kvf_config_load() with the agent's schema (every value type: string,
 * list, bool, uint, size, duration, enum) and the controller's. The file
 * lives in a memfd, so no disk I/O per run.
 */
#include "agent/config.h"
#include "controller/config.h"

#include <kvfabric/log.h>

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void kvf_fuzz_config_load(const kvf_config_schema_t *schema, void *cfg,
                                 const char *flag)
{
    const char *argv[] = {"fuzz", flag, NULL};
    kvf_config_error_t err;

    kvf_config_load(schema, cfg, 2, argv, NULL, &err);
    kvf_config_cleanup(schema, cfg);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static int fd = -1;
    static char flag[64];
    kvf_controller_config_t ccfg;
    kvf_agent_config_t acfg;

    if (fd < 0) {
        fd = memfd_create("fuzz-config", MFD_CLOEXEC);
        if (fd < 0) {
            abort();
        }
        snprintf(flag, sizeof(flag), "--config=/proc/self/fd/%d", fd);
        kvf_log_set_handler(NULL, NULL);
        unsetenv("KVF_CONFIG");
    }
    if ((ftruncate(fd, 0) != 0) ||
        (pwrite(fd, data, size, 0) != (ssize_t)size)) {
        abort();
    }
    memset(&acfg, 0, sizeof(acfg));
    kvf_fuzz_config_load(&kvf_agent_config_schema, &acfg, flag);
    memset(&ccfg, 0, sizeof(ccfg));
    kvf_fuzz_config_load(&kvf_controller_config_schema, &ccfg, flag);
    return 0;
}
