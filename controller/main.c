/* SPDX-License-Identifier: Apache-2.0 */
/* Copyright (c) 2026 The kvfabric authors */
/* kvf-controller: parse config, build the server, run the loop. */
#include "controller/config.h"
#include "controller/election.h"
#include "controller/resign.h"
#include "controller/server.h"
#include "common/auth.h"
#include "common/log.h"
#include "common/time.h"
#include "common/tls.h"
#include "common/version.h"

#include <curl/curl.h>
#include <event2/event.h>

#include <openssl/ssl.h>

#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

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

/* Lease about to be lost: answer nothing more (the loop stops at once). */
static void kvf_controller_main_lost(void *arg)
{
    event_base_loopbreak(arg);
}

/* The address published in etcd for a bound @p bound: @p advertise when
 * set; a wildcard host (0.0.0.0, ::) is replaced by the host name, which
 * other hosts can reach. */
static const char *kvf_controller_main_advertised(const char *bound,
                                                  const char *advertise,
                                                  char *buf, size_t len)
{
    const char *colon = strrchr(bound, ':');
    char host[256];

    if (advertise[0] != '\0') {
        return advertise;
    }
    if ((colon == NULL) ||
        !((strncmp(bound, "0.0.0.0:", 8) == 0) ||
          (strncmp(bound, "[::]:", 5) == 0) ||
          (strncmp(bound, ":::", 3) == 0) || (colon == bound))) {
        return bound;
    }
    if (gethostname(host, sizeof(host) - 1) != 0) {
        return bound;
    }
    host[sizeof(host) - 1] = '\0';
    snprintf(buf, len, "%s%s", host, colon);
    kvf_warn("etcd: listening on %s: publishing %s (set advertise to choose)",
             bound, buf);
    return buf;
}

/* With --etcd: waits to be leader, then keeps the lease on @p base.
 * Returns false when the controller must exit (*rc_p says how). */
static bool kvf_controller_main_elect(const kvf_controller_config_t *cfg,
                                      struct event_base *base,
                                      kvf_election_t **el_p, int *rc_p)
{
    kvf_status_t status;

    *el_p = NULL;
    if (cfg->etcd[0] == '\0') {
        return true;
    }
    if ((curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK) ||
        (kvf_election_create(cfg, el_p) != KVF_OK)) {
        fprintf(stderr, "kvf-controller: cannot set up the etcd client\n");
        return false;
    }
    status = kvf_election_campaign(*el_p);
    if (status == KVF_OK) {
        status =
            kvf_election_start(*el_p, base, kvf_controller_main_lost, base);
    }
    if (status != KVF_OK) {
        *rc_p = (status == KVF_ERR_CANCELED) ? 0 : 1;
        return false;
    }
    return true;
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
    kvf_election_t *election = NULL;
    kvf_resign_t *resign     = NULL;
    struct event_base *base;
    const char *control, *http;
    char pub_control[300], pub_http[300];
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
    if (!kvf_controller_main_elect(&cfg, base, &election, &rc)) {
        goto out_election;
    }
    if (kvf_server_create(&cfg, base, &server) != KVF_OK) {
        goto out_election; /* logged */
    }
    kvf_server_addresses(server, &control, &http);
    if ((election != NULL) && kvf_election_quit_requested()) {
        /* stopped while being elected: the server's own signal handlers
         * came too late to see it; hand the lease back and exit */
        kvf_info("signal during the election: exiting");
        rc = 0;
        goto out_server;
    }
    if (election != NULL) {
        kvf_server_set_term(server, kvf_election_term(election));
        kvf_server_set_lease(server, kvf_election_serve_until(election));
        if (cfg.etcd_resign &&
            (kvf_resign_create(server, base, 250 * KVF_NSEC_PER_MSEC,
                               &resign) != KVF_OK)) {
            goto out_server;
        }
    }
    if (election != NULL) {
        control = kvf_controller_main_advertised(
            control, cfg.advertise, pub_control, sizeof(pub_control));
        http = kvf_controller_main_advertised(http, cfg.advertise_http,
                                              pub_http, sizeof(pub_http));
    }
    if (((election == NULL) ||
         (kvf_election_publish(election, control, http) == KVF_OK)) &&
        (kvf_server_run(server) == KVF_OK)) {
        rc = 0;
    }
    if (kvf_resign_happened(resign)) {
        rc = KVF_RESIGN_EXIT; /* the lease is revoked below */
    }
    if ((election != NULL) && kvf_election_lost(election)) {
        kvf_election_stopped(election); /* the loop answers nothing now */
        rc = KVF_ELECTION_EXIT_LOST;
    }
out_server:
    kvf_resign_destroy(resign);
    kvf_server_destroy(server);
out_election:
    kvf_election_destroy(election);
    if (cfg.etcd[0] != '\0') {
        curl_global_cleanup();
    }
    event_base_free(base);
out_cfg:
    kvf_config_cleanup(&kvf_controller_config_schema, &cfg);
    return rc;
}
