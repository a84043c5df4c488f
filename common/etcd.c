/* SPDX-License-Identifier: Apache-2.0 */
/* Copyright (c) 2026 The kvfabric authors */
#include "common/etcd.h"

#include "common/etcd_json.h"

#include "common/log.h"

#include <curl/curl.h>
#include <json-c/json.h>
#include <openssl/evp.h>

#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define KVF_ETCD_MAX_URLS  8
#define KVF_ETCD_MAX_REPLY (1u << 20)

struct kvf_etcd {
    CURL *curl;
    char *urls[KVF_ETCD_MAX_URLS];
    unsigned num_urls;
    unsigned current;
    uint64_t timeout_ms;
    uint64_t call_timeout_ms;
    char *reply;
    size_t reply_len;
    size_t reply_cap;
};

static size_t kvf_etcd_on_data(char *data, size_t size, size_t nmemb, void *arg)
{
    kvf_etcd_t *etcd = arg;
    size_t n         = size * nmemb;
    char *p;

    if (etcd->reply_len + n + 1 > KVF_ETCD_MAX_REPLY) {
        return 0; /* aborts the transfer */
    }
    if (etcd->reply_len + n + 1 > etcd->reply_cap) {
        size_t cap = (etcd->reply_cap == 0) ? 4096 : etcd->reply_cap;

        while (cap < etcd->reply_len + n + 1) {
            cap *= 2;
        }
        p = realloc(etcd->reply, cap);
        if (p == NULL) {
            return 0;
        }
        etcd->reply     = p;
        etcd->reply_cap = cap;
    }
    memcpy(etcd->reply + etcd->reply_len, data, n);
    etcd->reply_len += n;
    etcd->reply[etcd->reply_len] = '\0';
    return n;
}

static pthread_once_t kvf_etcd_once = PTHREAD_ONCE_INIT;
static CURLcode kvf_etcd_global_rc;

static void kvf_etcd_global_init(void)
{
    kvf_etcd_global_rc = curl_global_init(CURL_GLOBAL_DEFAULT);
}

kvf_status_t kvf_etcd_create(const char *urls, uint64_t timeout_ms,
                             kvf_etcd_t **etcd_p)
{
    kvf_etcd_t *etcd;
    char *copy = NULL, *tok, *save = NULL;

    pthread_once(&kvf_etcd_once, kvf_etcd_global_init);
    if (kvf_etcd_global_rc != CURLE_OK) {
        kvf_error("etcd: cannot initialise libcurl: %s",
                  curl_easy_strerror(kvf_etcd_global_rc));
        return KVF_ERR_IO;
    }
    etcd = calloc(1, sizeof(*etcd));
    if (etcd == NULL) {
        return KVF_ERR_NO_MEMORY;
    }
    etcd->timeout_ms = (timeout_ms == 0) ? 1000 : timeout_ms;
    copy             = strdup(urls);
    etcd->curl       = curl_easy_init();
    if ((copy == NULL) || (etcd->curl == NULL)) {
        goto err_free;
    }
    for (tok = strtok_r(copy, ",", &save); tok != NULL;
         tok = strtok_r(NULL, ",", &save)) {
        size_t len = strlen(tok);

        while ((len > 0) && (tok[len - 1] == '/')) {
            tok[--len] = '\0';
        }
        if ((len == 0) || (etcd->num_urls == KVF_ETCD_MAX_URLS)) {
            kvf_error("etcd: bad endpoint list '%s' (at most %d URLs)", urls,
                      KVF_ETCD_MAX_URLS);
            goto err_config;
        }
        etcd->urls[etcd->num_urls] = strdup(tok);
        if (etcd->urls[etcd->num_urls] == NULL) {
            goto err_free;
        }
        etcd->num_urls++;
    }
    if (etcd->num_urls == 0) {
        kvf_error("etcd: no endpoint in '%s'", urls);
        goto err_config;
    }
    free(copy);
    *etcd_p = etcd;
    return KVF_OK;

err_config:
    free(copy);
    kvf_etcd_destroy(etcd);
    return KVF_ERR_CONFIG;
err_free:
    free(copy);
    kvf_etcd_destroy(etcd);
    return KVF_ERR_NO_MEMORY;
}

void kvf_etcd_destroy(kvf_etcd_t *etcd)
{
    unsigned i;

    if (etcd == NULL) {
        return;
    }
    for (i = 0; i < etcd->num_urls; i++) {
        free(etcd->urls[i]);
    }
    if (etcd->curl != NULL) {
        curl_easy_cleanup(etcd->curl);
    }
    free(etcd->reply);
    free(etcd);
}

void kvf_etcd_set_timeout(kvf_etcd_t *etcd, uint64_t timeout_ms)
{
    etcd->call_timeout_ms = timeout_ms;
}

kvf_status_t kvf_etcd_call(kvf_etcd_t *etcd, const char *path, json_object *req,
                           json_object **rep_p)
{
    const char *body =
        json_object_to_json_string_ext(req, JSON_C_TO_STRING_PLAIN);
    uint64_t timeout =
        (etcd->call_timeout_ms != 0) ? etcd->call_timeout_ms : etcd->timeout_ms;
    struct curl_slist *hdrs;
    kvf_status_t status = KVF_ERR_IO;
    char url[512];
    unsigned i;

    hdrs = curl_slist_append(NULL, "Content-Type: application/json");
    if (hdrs == NULL) {
        return KVF_ERR_NO_MEMORY;
    }
    for (i = 0; i < etcd->num_urls; i++) {
        unsigned u = (etcd->current + i) % etcd->num_urls;
        long code  = 0;
        CURLcode rc;

        snprintf(url, sizeof(url), "%s%s", etcd->urls[u], path);
        etcd->reply_len = 0;
        curl_easy_reset(etcd->curl);
        curl_easy_setopt(etcd->curl, CURLOPT_URL, url);
        curl_easy_setopt(etcd->curl, CURLOPT_POSTFIELDS, body);
        curl_easy_setopt(etcd->curl, CURLOPT_HTTPHEADER, hdrs);
        curl_easy_setopt(etcd->curl, CURLOPT_TIMEOUT_MS, (long)timeout);
        curl_easy_setopt(etcd->curl, CURLOPT_CONNECTTIMEOUT_MS, (long)timeout);
        curl_easy_setopt(etcd->curl, CURLOPT_NOSIGNAL, 1L);
        curl_easy_setopt(etcd->curl, CURLOPT_WRITEFUNCTION, kvf_etcd_on_data);
        curl_easy_setopt(etcd->curl, CURLOPT_WRITEDATA, etcd);
        rc = curl_easy_perform(etcd->curl);
        if (rc == CURLE_OK) {
            curl_easy_getinfo(etcd->curl, CURLINFO_RESPONSE_CODE, &code);
        }
        if ((rc != CURLE_OK) || (code != 200) || (etcd->reply_len == 0)) {
            kvf_debug("etcd: %s: %s (HTTP %ld)", url,
                      (rc != CURLE_OK) ? curl_easy_strerror(rc) : "refused",
                      code);
            continue;
        }
        *rep_p = json_tokener_parse(etcd->reply);
        if (*rep_p == NULL) {
            kvf_warn("etcd: %s: reply is not JSON", url);
            status = KVF_ERR_PROTO;
            continue;
        }
        etcd->current = u;
        status        = KVF_OK;
        break;
    }
    curl_slist_free_all(hdrs);
    return status;
}

int64_t kvf_etcd_int(json_object *obj, const char *name)
{
    json_object *v;

    if ((obj == NULL) || !json_object_object_get_ex(obj, name, &v)) {
        return 0;
    }
    if (json_object_is_type(v, json_type_string)) {
        return strtoll(json_object_get_string(v), NULL, 10);
    }
    return json_object_get_int64(v);
}

json_object *kvf_etcd_field(json_object *obj, const char *name)
{
    json_object *v = NULL;

    if (obj != NULL) {
        json_object_object_get_ex(obj, name, &v);
    }
    return v;
}

json_object *kvf_etcd_b64(const char *text)
{
    size_t len = strlen(text);
    json_object *v;
    char *out;

    out = malloc(4 * ((len + 2) / 3) + 1);
    if (out == NULL) {
        return NULL;
    }
    EVP_EncodeBlock((unsigned char *)out, (const unsigned char *)text,
                    (int)len);
    v = json_object_new_string(out);
    free(out);
    return v;
}

/* Decodes base64 @p in into @p out (NUL-terminated, truncated). */
static void kvf_etcd_unb64(const char *in, char *out, size_t len)
{
    size_t in_len = strlen(in), pad = 0;
    unsigned char *buf;
    int n;

    out[0] = '\0';
    if ((in_len == 0) || (in_len % 4 != 0)) {
        return;
    }
    buf = malloc(in_len);
    if (buf == NULL) {
        return;
    }
    n   = EVP_DecodeBlock(buf, (const unsigned char *)in, (int)in_len);
    pad = (in[in_len - 1] == '=') + (in[in_len - 2] == '=');
    if (n >= (int)pad) {
        size_t m = (size_t)n - pad;

        if (m >= len) {
            m = len - 1;
        }
        memcpy(out, buf, m);
        out[m] = '\0';
    }
    free(buf);
}

kvf_status_t kvf_etcd_get(kvf_etcd_t *etcd, const char *key, bool *found_p,
                          char *value, size_t len, int64_t *create_rev_p)
{
    json_object *req = json_object_new_object(), *rep = NULL, *kvs, *kv;
    kvf_status_t status;

    if (req == NULL) {
        return KVF_ERR_NO_MEMORY;
    }
    json_object_object_add(req, "key", kvf_etcd_b64(key));
    status = kvf_etcd_call(etcd, "/v3/kv/range", req, &rep);
    json_object_put(req);
    if (status != KVF_OK) {
        return status;
    }
    kvs      = kvf_etcd_field(rep, "kvs");
    kv       = ((kvs != NULL) && (json_object_array_length(kvs) > 0))
                   ? json_object_array_get_idx(kvs, 0)
                   : NULL;
    *found_p = (kv != NULL);
    if (len > 0) {
        value[0] = '\0';
    }
    if ((kv != NULL) && (len > 0) && (kvf_etcd_field(kv, "value") != NULL)) {
        kvf_etcd_unb64(json_object_get_string(kvf_etcd_field(kv, "value")),
                       value, len);
    }
    if (create_rev_p != NULL) {
        *create_rev_p = kvf_etcd_int(kv, "create_revision");
    }
    json_object_put(rep);
    return KVF_OK;
}

kvf_status_t kvf_etcd_leader_get(kvf_etcd_t *etcd, const char *prefix,
                                 kvf_etcd_leader_t *leader)
{
    char key[512], value[1024];
    json_object *obj, *control, *http;
    kvf_status_t status;
    bool found  = false;
    int64_t rev = 0;

    memset(leader, 0, sizeof(*leader));
    snprintf(key, sizeof(key), "%s/leader", prefix);
    status = kvf_etcd_get(etcd, key, &found, value, sizeof(value), &rev);
    if (status != KVF_OK) {
        return status;
    }
    if (!found) {
        return KVF_ERR_NOT_FOUND;
    }
    obj = json_tokener_parse(value);
    if ((obj == NULL) || !json_object_is_type(obj, json_type_object)) {
        json_object_put(obj);
        return KVF_ERR_PROTO;
    }
    control = kvf_etcd_field(obj, "control");
    http    = kvf_etcd_field(obj, "http");
    if ((control == NULL) || !json_object_is_type(control, json_type_string) ||
        (json_object_get_string_len(control) == 0)) {
        /* elected, its addresses not published yet ("{}") */
        json_object_put(obj);
        return KVF_ERR_NOT_FOUND;
    }
    snprintf(leader->control, sizeof(leader->control), "%s",
             json_object_get_string(control));
    if ((http != NULL) && json_object_is_type(http, json_type_string)) {
        snprintf(leader->http, sizeof(leader->http), "%s",
                 json_object_get_string(http));
    }
    leader->term = (uint64_t)rev;
    json_object_put(obj);
    return KVF_OK;
}

kvf_status_t kvf_etcd_find_leader(const char *urls, const char *prefix,
                                  uint64_t timeout_ms, char *control,
                                  size_t len, char *err, size_t err_len)
{
    kvf_etcd_leader_t leader;
    kvf_etcd_t *etcd = NULL;
    kvf_status_t status;

    status = kvf_etcd_create(urls, timeout_ms, &etcd);
    if (status != KVF_OK) {
        snprintf(err, err_len, "etcd '%s': not a list of http://HOST:PORT",
                 urls);
        return status;
    }
    status = kvf_etcd_leader_get(etcd, prefix, &leader);
    kvf_etcd_destroy(etcd);
    switch (status) {
    case KVF_OK:
        snprintf(control, len, "%s", leader.control);
        break;
    case KVF_ERR_NOT_FOUND:
        snprintf(err, err_len,
                 "etcd %s: no controller is leader of %s (none elected, or "
                 "one is starting)",
                 urls, prefix);
        break;
    case KVF_ERR_IO:
        snprintf(err, err_len, "etcd %s: no endpoint answers", urls);
        break;
    default:
        snprintf(err, err_len, "etcd %s: %s/leader is not a leader's record",
                 urls, prefix);
        break;
    }
    return status;
}
