/* SPDX-License-Identifier: Apache-2.0 */
/* Copyright (c) 2026 The kvfabric authors */
/*
 * Replays fuzz corpus files (and every crash input kept as a regression)
 * through a fuzz target without libFuzzer, so `make test` runs them with
 * gcc's sanitizers. Usage: replay-TARGET FILE|DIR...
 */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int kvf_replay_file(const char *path)
{
    uint8_t *data;
    long len;
    FILE *f = fopen(path, "rb");

    if (f == NULL) {
        fprintf(stderr, "replay: cannot open %s\n", path);
        return -1;
    }
    fseek(f, 0, SEEK_END);
    len = ftell(f);
    fseek(f, 0, SEEK_SET);
    data = malloc((len > 0) ? (size_t)len : 1);
    if ((data == NULL) || (fread(data, 1, (size_t)len, f) != (size_t)len)) {
        fprintf(stderr, "replay: cannot read %s\n", path);
        free(data);
        fclose(f);
        return -1;
    }
    fclose(f);
    LLVMFuzzerTestOneInput(data, (size_t)len);
    free(data);
    return 0;
}

static int kvf_replay_path(const char *path, int *count)
{
    char child[4096];
    struct dirent *ent;
    struct stat st;
    DIR *dir;
    int rc = 0;

    if (stat(path, &st) != 0) {
        fprintf(stderr, "replay: no such file %s\n", path);
        return -1;
    }
    if (!S_ISDIR(st.st_mode)) {
        (*count)++;
        return kvf_replay_file(path);
    }
    dir = opendir(path);
    if (dir == NULL) {
        return -1;
    }
    while ((ent = readdir(dir)) != NULL) {
        if (ent->d_name[0] == '.') {
            continue;
        }
        snprintf(child, sizeof(child), "%s/%s", path, ent->d_name);
        rc |= kvf_replay_path(child, count);
    }
    closedir(dir);
    return rc;
}

int main(int argc, char **argv)
{
    int count = 0, rc = 0, i;

    for (i = 1; i < argc; i++) {
        rc |= kvf_replay_path(argv[i], &count);
    }
    if (count == 0) {
        fprintf(stderr, "replay: no inputs found\n");
        return 1;
    }
    printf("replayed %d inputs\n", count);
    return (rc == 0) ? 0 : 1;
}
