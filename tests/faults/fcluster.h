/* SPDX-License-Identifier: Apache-2.0 */
/* Copyright (c) 2026 The kvfabric authors */
/*
 * A fault-injection cluster: one kvf-controller and up to four kvf-agents,
 * either on loopback or each on its own host made of a network namespace
 * (tests/faults/netns.sh: host 0 = the controller, host i = agent i-1,
 * joined by veth links to a bridge, so a host's link can go down or get
 * netem). The fault tests (Criterion) and the soak driver share it, so it
 * asserts nothing: calls return 0 / true on success and leave a one-line
 * reason in fc->why.
 *
 * Cleanup: a guard process (a child blocked on a pipe) removes the
 * namespaces when this process goes, whichever way it goes (a failed
 * assertion, a crash, a test timeout's SIGKILL); kvf_fc_destroy() removes
 * them at once. Children die with this process (PR_SET_PDEATHSIG).
 *
 * thread: one thread.
 */
#ifndef KVF_TESTS_FCLUSTER_H
#define KVF_TESTS_FCLUSTER_H

#include "tests/helpers/proc.h"

#include <kvfabric/kvfabric.h>

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define KVF_FC_MAX_AGENTS 4
/* HA mode: three controllers on a three-member etcd cluster */
#define KVF_FC_HA_CTLS  3
#define KVF_FC_HA_ETCDS 3
#define KVF_FC_MAX_HOSTS \
    (1 + KVF_FC_MAX_AGENTS + KVF_FC_HA_CTLS - 1 + KVF_FC_HA_ETCDS)
#define KVF_FC_MAX_KEYS 4096 /* inventory keys read back per agent */

typedef struct kvf_fc_params {
    int num_agents;
    bool is_netns;          /* hosts as namespaces, else loopback */
    const char *pool_size;  /* "32M" */
    const char *fetch_tmo;  /* agent fetch_timeout, "2s" */
    const char *lease;      /* controller lease, "2s" */
    const char *max_chunk;  /* "1M" */
    uint64_t client_tmo_ns; /* engine call timeout */
    const char *log_level;  /* of the agents; NULL: info */
    /* PD mode: --role of each agent (NULL: both) and the agents' PD
     * tunables (NULL: the agent's default) */
    const char *roles[KVF_FC_MAX_AGENTS];
    const char *pd_buffer_size; /* receive region of decode/both agents */
    const char *pd_push_tmo;    /* pd_push_timeout */
    const char *pd_alloc_tmo;   /* pd_alloc_timeout */
    const char *pd_claim_tmo;   /* pd_claim_timeout */
    /* disk tier of each agent (NULL: none): disk_size, its file kept
     * across the agent's restarts (a warm restart re-admits it) */
    const char *disk_size[KVF_FC_MAX_AGENTS];
    /* HA on etcd (netns only): hosts 0 and A+1, A+2 run controllers 0..2
     * (A agents on hosts 1..A), hosts A+3..A+5 the etcd members; agents
     * and kvfctl find the leader through etcd (--etcd) */
    bool is_ha;
    const char *etcd_lease; /* the controllers' etcd_lease, "2s" */
} kvf_fc_params_t;

typedef struct kvf_fc_agent {
    kvf_test_proc_t proc;
    char name[32];
    char sock[128];
    char listen[64];
    char http[64];
    char disk[64]; /* its disk tier's file */
    uint16_t http_port;
    bool is_stopped; /* SIGSTOP'ed */
} kvf_fc_agent_t;

typedef struct kvf_fc {
    kvf_fc_params_t params;
    char tag[32]; /* namespace prefix "kvff<pid>", or "" on loopback */
    pid_t guard;
    int guard_fd;
    int root_ns; /* this process's own network namespace */
    int host_ns[KVF_FC_MAX_HOSTS];
    int num_hosts;
    kvf_test_proc_t ctl;
    char ctl_addr[64];
    char ctl_http[64];
    uint16_t ctl_http_port;
    kvf_fc_agent_t agents[KVF_FC_MAX_AGENTS];
    /* HA mode */
    kvf_test_proc_t ha_ctl[KVF_FC_HA_CTLS];
    char ha_ctl_addr[KVF_FC_HA_CTLS][64];
    char ha_ports[KVF_FC_HA_CTLS][128];
    kvf_test_proc_t etcd[KVF_FC_HA_ETCDS];
    char etcd_urls[256];
    char why[1024];
} kvf_fc_t;

/* What an agent holds (GET /v1/inventory). */
typedef struct kvf_fc_inventory {
    uint32_t node_id;
    uint64_t chunks;      /* in the pool */
    uint64_t disk_chunks; /* on the disk tier only */
    uint64_t grants;
    uint64_t pinned;
    size_t num_keys; /* the pool's, then those on disk only */
    kvf_key_t keys[KVF_FC_MAX_KEYS];
} kvf_fc_inventory_t;

/* Why namespaces cannot be used here; NULL when they can. */
const char *kvf_fc_netns_unavailable(void);

/* Why tc netem cannot be used here; NULL when it can. */
const char *kvf_fc_netem_unavailable(void);

/* Builds the hosts (netns) and starts the controller and every agent, each
 * agent registered before it returns. -1 on failure (fc->why). */
int kvf_fc_create(kvf_fc_t *fc, const kvf_fc_params_t *params);

/* Stops every process (SIGTERM, then SIGKILL) and removes the hosts. */
void kvf_fc_destroy(kvf_fc_t *fc);

/* The controller: start on its fixed address, kill -9. */
int kvf_fc_ctl_start(kvf_fc_t *fc);
void kvf_fc_ctl_kill(kvf_fc_t *fc);

/* Agent @p i: start (waits until registered), kill -9, SIGSTOP/SIGCONT. */
int kvf_fc_agent_start(kvf_fc_t *fc, int i);
void kvf_fc_agent_kill(kvf_fc_t *fc, int i);
void kvf_fc_agent_pause(kvf_fc_t *fc, int i, bool is_paused);

/* Waits up to @p timeout_ms until agent @p i says it is registered. */
bool kvf_fc_agent_wait_registered(kvf_fc_t *fc, int i, int timeout_ms);

/* Link of agent @p i's host up or down; netem SPEC on it ("off" clears). */
int kvf_fc_link(kvf_fc_t *fc, int i, bool is_up);
int kvf_fc_netem(kvf_fc_t *fc, int i, const char *spec);

/* HTTP GET on agent @p i (-1: the controller), in its host. */
int kvf_fc_http(kvf_fc_t *fc, int i, const char *path, char *out,
                size_t out_len);

/* Runs kvfctl ARGS... against the controller (in its host); stdout into
 * @p out. Returns kvfctl's exit status, -1 when it hung (5 s). */
int kvf_fc_kvfctl(kvf_fc_t *fc, char *out, size_t out_len,
                  const char *const args[]);

int kvf_fc_inventory(kvf_fc_t *fc, int i, kvf_fc_inventory_t *inv);

/* The value of metric line @p name (up to the space, labels included:
 * "kvf_agent_pd_region_bytes{state=\"used\"}") of agent @p i, or -1. */
long long kvf_fc_metric(kvf_fc_t *fc, int i, const char *name);

/* true when the registry equals the agents' contents: per live agent the
 * registry's key count (kvfctl tree) equals its inventory, the registry's
 * distinct keys equal the union of inventories, and every inventory key is
 * found by kvfctl lookup at a holder that has it. */
bool kvf_fc_converged(kvf_fc_t *fc);
bool kvf_fc_wait_converged(kvf_fc_t *fc, int timeout_ms);

/* true when no live agent has grants, pinned chunks or PD receive region
 * bytes in use left (waits); agents that are not running are skipped. */
bool kvf_fc_wait_quiet(kvf_fc_t *fc, int timeout_ms);

/* true when every process is alive and answers (healthz, kvfctl nodes). */
bool kvf_fc_responsive(kvf_fc_t *fc);

/* ------------------------------------------------------ HA on etcd */

/* Host of controller @p c / etcd member @p e (is_ha). */
int kvf_fc_ha_ctl_host(const kvf_fc_t *fc, int c);
int kvf_fc_ha_etcd_host(const kvf_fc_t *fc, int e);

/* Controller @p c: start (it campaigns; a standby waits), kill -9; wait
 * up to @p timeout_ms for it to exit by itself (its status, -1 if not). */
int kvf_fc_ha_ctl_start(kvf_fc_t *fc, int c);
void kvf_fc_ha_ctl_kill(kvf_fc_t *fc, int c);
int kvf_fc_ha_ctl_wait_exit(kvf_fc_t *fc, int c, int timeout_ms);

/* Whether controller @p c serves (bound and wrote its port file). */
bool kvf_fc_ha_ctl_serving(kvf_fc_t *fc, int c);

/* The controller etcd names leader (read from agent 0's host), waiting up
 * to @p timeout_ms for one; -1 (fc->why) when none. */
int kvf_fc_ha_leader(kvf_fc_t *fc, int timeout_ms);

/* etcd member @p e: stop (SIGTERM), start again on its data. */
void kvf_fc_ha_etcd_stop(kvf_fc_t *fc, int e);
int kvf_fc_ha_etcd_start(kvf_fc_t *fc, int e);

/* Cuts (or heals) every packet between hosts @p a and @p b, both ways
 * (blackhole routes): a partition that leaves the other links alone. */
int kvf_fc_cut(kvf_fc_t *fc, int a, int b, bool is_cut);

/* ------------------------------------------------------------ engines */

/* A chain of @p n keys from @p seed (namespace 0x6661756c74). */
void kvf_fc_keys(uint64_t seed, kvf_key_t *keys, uint32_t n);

/* The bytes of the chunk of @p key: a pattern only that key makes. */
void kvf_fc_fill(uint8_t *p, size_t len, const kvf_key_t *key);

kvf_status_t kvf_fc_connect(kvf_fc_t *fc, int i, kvf_client_t **client_p);

/* Stores keys[0, n) of @p len bytes each through agent @p i. */
kvf_status_t kvf_fc_store(kvf_fc_t *fc, int i, const kvf_key_t *keys,
                          uint32_t n, size_t len);

/* Result of kvf_fc_retrieve(). */
typedef struct kvf_fc_fetch {
    kvf_status_t status;
    uint32_t got;         /* chunks with the right bytes */
    uint32_t missing;     /* chunks reported missing */
    uint64_t wrong_bytes; /* bytes handed out that differ from the chunk */
    uint64_t took_ns;
} kvf_fc_fetch_t;

/* Lookup (with @p prefetch) and retrieve keys[0, n) through agent @p i,
 * checking every byte handed out; releases what it got. */
void kvf_fc_retrieve(kvf_fc_t *fc, int i, const kvf_key_t *keys, uint32_t n,
                     size_t len, bool prefetch, kvf_fc_fetch_t *res);

/* Waits until a lookup through agent @p i sees @p hits leading chunks. */
bool kvf_fc_wait_hits(kvf_fc_t *fc, int i, const kvf_key_t *keys, uint32_t n,
                      uint32_t hits, int timeout_ms);

/* ---------------------------------------------------------------- PD */

#define KVF_FC_PD_MAX 64 /* chunks of one PD request */

/* The bytes of chunk @p index of PD request @p req: a pattern only that
 * chunk of that request makes. */
void kvf_fc_pd_fill(uint8_t *p, size_t len, uint64_t req, uint32_t index);

/* Prefill engine @p c (connected to a prefill or both agent) pushes chunks
 * [first, first + n) of @p req, @p len bytes each, to the agent named
 * @p decoder: allocates, fills, kvf_pd_push()es and releases its slots
 * (the slots stay the engine's whatever the push answers). Returns the
 * push's status (or the alloc's), with the reason in fc->why. */
kvf_status_t kvf_fc_pd_push(kvf_fc_t *fc, kvf_client_t *c, uint64_t req,
                            const char *decoder, uint32_t first, uint32_t n,
                            size_t len, bool final);

/* As kvf_fc_pd_push() for the whole of @p req (chunks [0, n), the last
 * push final), in @p parts pushes started without waiting for each other
 * (kvf_pd_push_start, as an engine saving layer by layer), then waited for
 * (kvf_pd_push_wait, under @p timeout_ns; 0: the client's default). */
kvf_status_t kvf_fc_pd_push_layers(kvf_fc_t *fc, kvf_client_t *c, uint64_t req,
                                   const char *decoder, uint32_t n,
                                   uint32_t parts, size_t len,
                                   uint64_t timeout_ns);

/* Result of kvf_fc_pd_receive(). */
typedef struct kvf_fc_pd {
    kvf_status_t status;  /* of kvf_pd_wait */
    uint32_t num;         /* chunks handed out */
    uint32_t got;         /* chunks with the right bytes and length */
    uint64_t wrong_bytes; /* bytes handed out that differ from the push */
    uint64_t took_ns;     /* of kvf_pd_wait */
} kvf_fc_pd_t;

/* Decode engine @p c waits up to @p timeout_ns for @p req, checks every
 * byte handed out against kvf_fc_pd_fill() of the @p n chunks of @p len
 * bytes that were pushed (a chunk past @p n is all wrong bytes), then
 * releases the request. */
void kvf_fc_pd_receive(kvf_fc_t *fc, kvf_client_t *c, uint64_t req, uint32_t n,
                       size_t len, uint64_t timeout_ns, kvf_fc_pd_t *res);

#endif /* KVF_TESTS_FCLUSTER_H */
