/* SPDX-License-Identifier: Apache-2.0 */
/* Copyright (c) 2026 The kvfabric authors */
/* kvf-controller: parse config, build the server, run the loop. */
#include "controller/config.h"
#include "controller/server.h"
#include "common/auth.h"
#include "common/log.h"
#include "common/tls.h"
#include "common/version.h"

#include <event2/event.h>

#include <openssl/ssl.h>

#include <signal.h>
#include <stdio.h>
#include <string.h>

/* What kvf_server_create() would refuse in the configuration itself
 * (files, addresses), for --print-config; one line per problem on
 * stderr. Returns true when the controller would start. */
static bool kvf_controller_main_check(const kvf_controller_config_t *cfg)
{
    kvf_auth_secret_t secret;
    char host[256], text[512];
    SSL_CTX *tls = NULL;
    uint16_t port;
    bool ok = true;

    if (kvf_config_parse_hostport(cfg->listen, host, sizeof(host), &port) !=
        KVF_OK) {
        fprintf(stderr, "kvf-controller: listen '%s' is not HOST:PORT\n",
                cfg->listen);
        ok = false;
    }
    if ((cfg->http[0] != '\0') &&
        (kvf_config_parse_hostport(cfg->http, host, sizeof(host), &port) !=
         KVF_OK)) {
        fprintf(stderr, "kvf-controller: http '%s' is not HOST:PORT\n",
                cfg->http);
        ok = false;
    }
    memset(&secret, 0, sizeof(secret));
    if (kvf_auth_secret_load_opt(cfg->cluster_secret_file, &secret, text,
                                 sizeof(text)) != KVF_OK) {
        fprintf(stderr, "kvf-controller: %s\n", text);
        ok = false;
    }
    kvf_auth_secret_cleanup(&secret);
    if ((cfg->tls_cert[0] != '\0') || (cfg->tls_key[0] != '\0')) {
        if (kvf_tls_server_ctx_create(cfg->tls_cert, cfg->tls_key, &tls, text,
                                      sizeof(text)) != KVF_OK) {
            fprintf(stderr, "kvf-controller: %s\n", text);
            ok = false;
        }
        SSL_CTX_free(tls);
    }
    return ok;
}

static void kvf_controller_main_env(void)
{
    char text[2048], *line, *save = NULL;

    if (kvf_config_check_env(&kvf_controller_config_schema, text,
                             sizeof(text)) == 0) {
        return;
    }
    for (line = strtok_r(text, "\n", &save); line != NULL;
         line = strtok_r(NULL, "\n", &save)) {
        kvf_warn("%s", line);
    }
}

int main(int argc, char **argv)
{
    kvf_controller_config_t cfg;
    kvf_config_error_t err;
    kvf_server_t *server;
    struct event_base *base;
    int argi, rc = 1;
    int i;

    if (kvf_version_asked(argc, argv)) {
        kvf_version_print("kvf-controller", stdout);
        return 0;
    }
    for (i = 1; i < argc; i++) {
        if ((strcmp(argv[i], "--help") == 0) || (strcmp(argv[i], "-h") == 0)) {
            printf("usage: kvf-controller [options]\n\n"
                   "The cluster's chunk directory: agents register, "
                   "heartbeat and report their\nholdings; engines' lookups "
                   "are answered from it. See docs/operations.md.\n\n");
            kvf_config_print_help(&kvf_controller_config_schema, stdout);
            printf("  --version\n      print the version and build options "
                   "and exit\n");
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
        fprintf(stderr,
                "kvf-controller: unexpected argument '%s' (see --help)\n",
                argv[argi]);
        goto out_cfg;
    }
    kvf_controller_main_env();
    if (cfg.print_config) {
        kvf_config_print(&kvf_controller_config_schema, &cfg, stdout);
        rc = kvf_controller_main_check(&cfg) ? 0 : 1;
        goto out_cfg;
    }
    kvf_info("kvf-controller %s starting; authentication %s, tls %s",
             kvf_version_string(),
             (cfg.cluster_secret_file[0] != '\0') ? "on (cluster secret)"
                                                  : "off",
             (cfg.tls_cert[0] != '\0') ? "on" : "off");
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
