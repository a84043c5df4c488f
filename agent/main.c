/* SPDX-License-Identifier: Apache-2.0 */
/* Copyright (c) 2026 The kvfabric authors */
/*
 * kvf-agent: parse the configuration, build the agent, run the loop.
 * SIGTERM/SIGINT start a clean shutdown (deregister, drain, exit 0); a
 * second signal exits at once.
 */
#include "agent/agent.h"
#include "agent/config.h"
#include "common/log.h"
#include "transport/verbs.h"

#include <event2/event.h>

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void kvf_agent_main_on_signal(evutil_socket_t sig, short what, void *arg)
{
    static int signals;
    kvf_agent_t *agent = arg;

    if (++signals > 1) {
        kvf_warn("second signal: exiting without a clean shutdown");
        exit(1);
    }
    kvf_info("signal %d: shutting down", (int)sig);
    kvf_agent_stop(agent);
}

static void kvf_agent_main_usage(void)
{
    printf("usage: kvf-agent [options]\n\n"
           "Runs beside one GPU worker: owns its chunk pool, registers with "
           "kvf-controller,\nserves and fetches chunks. See "
           "docs/configuration.md.\n\n");
    kvf_config_print_help(&kvf_agent_config_schema, stdout);
}

int main(int argc, char **argv)
{
    kvf_agent_config_t config;
    kvf_config_error_t err;
    struct event *sigterm = NULL, *sigint = NULL;
    struct event_base *base = NULL;
    kvf_agent_t *agent      = NULL;
    kvf_log_level_t level;
    int rc = 1, argi, i;

    for (i = 1; i < argc; i++) {
        if ((strcmp(argv[i], "--help") == 0) || (strcmp(argv[i], "-h") == 0)) {
            kvf_agent_main_usage();
            return 0;
        }
    }
    memset(&config, 0, sizeof(config));
    if (kvf_config_load(&kvf_agent_config_schema, &config, argc,
                        (const char *const *)argv, &argi, &err) != KVF_OK) {
        fprintf(stderr, "kvf-agent: %s\n", err.msg);
        goto out;
    }
    if (argi < argc) {
        fprintf(stderr, "kvf-agent: unexpected argument '%s' (see --help)\n",
                argv[argi]);
        goto out;
    }
    if (kvf_log_level_parse(config.log_level, &level) != KVF_OK) {
        fprintf(stderr,
                "kvf-agent: log_level '%s' is not error, warn, info, "
                "debug or trace\n",
                config.log_level);
        goto out;
    }
    kvf_log_set_level(level);
    kvf_log_init_from_env();
    if (config.print_config) {
        kvf_config_print(&kvf_agent_config_schema, &config, stdout);
        rc = 0;
        goto out;
    }
    if (config.list_devices) {
        kvf_verbs_device_t *devs = NULL;
        unsigned count           = 0;

        if (kvf_verbs_list_devices(&devs, &count) != KVF_OK) {
            goto out; /* the reason is logged */
        }
        kvf_verbs_devices_print(stdout, devs, count);
        kvf_verbs_devices_free(devs);
        rc = 0;
        goto out;
    }

    base = event_base_new();
    if (base == NULL) {
        fprintf(stderr, "kvf-agent: cannot create the event loop\n");
        goto out;
    }
    if (kvf_agent_create(&config, base, &agent) != KVF_OK) {
        goto out; /* the reason is logged */
    }
    signal(SIGPIPE, SIG_IGN);
    sigterm = evsignal_new(base, SIGTERM, kvf_agent_main_on_signal, agent);
    sigint  = evsignal_new(base, SIGINT, kvf_agent_main_on_signal, agent);
    if ((sigterm == NULL) || (sigint == NULL) ||
        (evsignal_add(sigterm, NULL) != 0) ||
        (evsignal_add(sigint, NULL) != 0)) {
        fprintf(stderr, "kvf-agent: cannot install signal handlers\n");
        goto out;
    }
    event_base_dispatch(base);
    rc = 0;

out:
    if (sigterm != NULL) {
        event_free(sigterm);
    }
    if (sigint != NULL) {
        event_free(sigint);
    }
    kvf_agent_destroy(agent);
    if (base != NULL) {
        event_base_free(base);
    }
    kvf_config_cleanup(&kvf_agent_config_schema, &config);
    return rc;
}
