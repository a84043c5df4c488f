/* SPDX-License-Identifier: Apache-2.0 */
/* Copyright (c) 2026 The kvfabric authors */
/*
 * kvf-agent: parse the configuration, build the agent, run the loop.
 * SIGTERM/SIGINT start a clean shutdown (deregister, drain, exit 0); a
 * second signal exits at once.
 */
#include "agent/agent.h"
#include "agent/config.h"
#include "common/auth.h"
#include "common/log.h"
#include "common/version.h"
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
    printf("  --version\n      print the version and build options and "
           "exit\n");
}

/* etcd endpoints: empty, or each http(s)://... */
static bool kvf_agent_main_check_etcd(const char *etcd)
{
    const char *p = etcd;

    while ((p != NULL) && (p[0] != '\0')) {
        if ((strncmp(p, "http://", 7) != 0) &&
            (strncmp(p, "https://", 8) != 0)) {
            return false;
        }
        p = strchr(p, ',');
        p = (p != NULL) ? p + 1 : NULL;
    }
    return true;
}

/* What kvf_agent_create() would refuse in the configuration itself
 * (secret file, addresses), for --print-config; one line per problem on
 * stderr. Returns true when the agent would start. */
static bool kvf_agent_main_check(const kvf_agent_config_t *config)
{
    const char *const addrs[][2] = {{"controller", config->controller},
                                    {"listen", config->listen},
                                    {"http", config->http}};
    kvf_auth_secret_t secret;
    char host[256], text[512];
    uint16_t port;
    bool ok = true;
    size_t i;

    for (i = 0; i < sizeof(addrs) / sizeof(addrs[0]); i++) {
        const char *p = addrs[i][1], *comma;
        char one[300];

        /* controller: HOST:PORT[,HOST:PORT...] (HA on etcd) */
        for (; (p != NULL) && (p[0] != '\0');
             p = ((comma != NULL) && (i == 0)) ? comma + 1 : NULL) {
            comma = strchr(p, ',');
            snprintf(one, sizeof(one), "%.*s",
                     (int)(((comma != NULL) && (i == 0)) ? (size_t)(comma - p)
                                                         : strlen(p)),
                     p);
            if (kvf_config_parse_hostport(one, host, sizeof(host), &port) !=
                KVF_OK) {
                fprintf(stderr, "kvf-agent: %s '%s' is not HOST:PORT\n",
                        addrs[i][0], addrs[i][1]);
                ok = false;
                break;
            }
        }
    }
    if (!kvf_agent_main_check_etcd(config->etcd)) {
        fprintf(stderr, "kvf-agent: etcd '%s' is not http://HOST:PORT[,...]\n",
                config->etcd);
        ok = false;
    }
    memset(&secret, 0, sizeof(secret));
    if (kvf_auth_secret_load_opt(config->cluster_secret_file, &secret, text,
                                 sizeof(text)) != KVF_OK) {
        fprintf(stderr, "kvf-agent: %s\n", text);
        ok = false;
    }
    kvf_auth_secret_cleanup(&secret);
    return ok;
}

static void kvf_agent_main_env(void)
{
    char text[2048], *line, *save = NULL;

    if (kvf_config_check_env(&kvf_agent_config_schema, text, sizeof(text)) ==
        0) {
        return;
    }
    for (line = strtok_r(text, "\n", &save); line != NULL;
         line = strtok_r(NULL, "\n", &save)) {
        kvf_warn("%s", line);
    }
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

    if (kvf_version_asked(argc, argv)) {
        kvf_version_print("kvf-agent", stdout);
        return 0;
    }
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
    kvf_agent_main_env();
    if (config.print_config) {
        kvf_config_print(&kvf_agent_config_schema, &config, stdout);
        rc = kvf_agent_main_check(&config) ? 0 : 1;
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

    kvf_info("kvf-agent %s starting; authentication %s, controller tls %s",
             kvf_version_string(),
             (config.cluster_secret_file[0] != '\0') ? "on (cluster secret)"
                                                     : "off",
             (config.tls_ca[0] != '\0') ? "on" : "off");
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
