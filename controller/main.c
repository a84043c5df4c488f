/* SPDX-License-Identifier: Apache-2.0 */
/* Copyright (c) 2026 The kvfabric authors */
/* kvf-controller: parse config, build the server, run the loop. */
#include "controller/config.h"
#include "controller/server.h"
#include "common/log.h"

#include <event2/event.h>

#include <signal.h>
#include <stdio.h>
#include <string.h>

int main(int argc, char **argv)
{
    kvf_controller_config_t cfg;
    kvf_config_error_t err;
    kvf_server_t *server;
    struct event_base *base;
    int argi, rc = 1;
    int i;

    for (i = 1; i < argc; i++) {
        if ((strcmp(argv[i], "--help") == 0) || (strcmp(argv[i], "-h") == 0)) {
            printf("usage: kvf-controller [options]\n");
            kvf_config_print_help(&kvf_controller_config_schema, stdout);
            return 0;
        }
    }
    kvf_log_init_from_env();
    memset(&cfg, 0, sizeof(cfg));
    if (kvf_config_load(&kvf_controller_config_schema, &cfg, argc,
                        (const char *const *)argv, &argi, &err) != KVF_OK) {
        fprintf(stderr, "kvf-controller: %s\n", err.msg);
        goto out_cfg;
    }
    if (argi < argc) {
        fprintf(stderr, "kvf-controller: unexpected argument '%s'\n",
                argv[argi]);
        goto out_cfg;
    }
    signal(SIGPIPE, SIG_IGN);
    base = event_base_new();
    if (base == NULL) {
        fprintf(stderr, "kvf-controller: cannot create event loop\n");
        goto out_cfg;
    }
    if (kvf_server_create(&cfg, base, &server) != KVF_OK) {
        goto out_base; /* logged */
    }
    if (kvf_server_run(server) == KVF_OK) {
        rc = 0;
    }
    kvf_server_destroy(server);
out_base:
    event_base_free(base);
out_cfg:
    kvf_config_cleanup(&kvf_controller_config_schema, &cfg);
    return rc;
}
