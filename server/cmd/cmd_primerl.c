/* server/cmd/cmd_primerl.c — `graphswap primerl-meta`: parses one pickle of prime-rl's per-state-dict
 * NCCL metadata with the server's strict unpickler (server/rendezvous/primerl_meta.c) and prints what it read
 * (a diagnostic for a captured trainer pickle, and the integration tests' hook into the parser). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "server/cmd/cmd.h"
#include "server/core/cli.h"
#include "server/rendezvous/primerl_meta.h"

static const char help[] =
    "usage: graphswap primerl-meta [FILE]\n"
    "\n"
    "Reads one pickle of the metadata prime-rl's trainer broadcasts before each state dict in NCCL\n"
    "mode (pickle.dumps({torch.dtype: [(name, torch.Size, numel), ...]})) from FILE or stdin, parses it\n"
    "as /update_weights does in broadcaster mode (nothing is executed or imported), and prints one JSON\n"
    "line: {\"groups\": [{\"dtype\": \"bfloat16\", \"bytes\": B, \"tensors\": [{\"name\", \"shape\",\n"
    "\"numel\"}, ...]}, ...]} in the pickle's order (the order of the per-dtype broadcasts), or\n"
    "{\"error\": \"...\"} with exit status 1.\n";

int srv_cmd_primerl_meta(int argc, char **argv)
{
    if (argc > 1 && (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0)) {
        fputs(help, stdout);
        return 0;
    }
    if (argc > 2) {
        fputs(help, stderr);
        return 2;
    }
    FILE *f = argc > 1 ? fopen(argv[1], "rb") : stdin;
    if (!f) srv_die("primerl-meta: cannot open %s", argv[1]);
    /* one byte past the bound, so that a longer input is refused by the parser itself */
    const size_t cap = (size_t)SRV_PRIMERL_META_MAX_BYTES + 1;
    unsigned char *buf = malloc(cap);
    if (!buf) srv_die("primerl-meta: out of memory");
    size_t n = fread(buf, 1, cap, f);
    if (f != stdin) fclose(f);
    srv_primerl_meta m;
    char err[512];
    cJSON *o = cJSON_CreateObject();
    int rc = 0;
    if (srv_primerl_meta_unpickle(buf, n, &m, err, sizeof err) != 0) {
        cJSON_AddStringToObject(o, "error", err);
        rc = 1;
    } else {
        cJSON *gs = cJSON_AddArrayToObject(o, "groups");
        for (size_t g = 0, i = 0; g < m.ngroups; g++) {
            cJSON *go = cJSON_CreateObject(), *ts = cJSON_CreateArray();
            uint64_t bytes = 0;
            cJSON_AddStringToObject(go, "dtype", srv_primerl_torch_dtype_name(m.group_dtype[g]));
            for (; i < m.group_end[g]; i++) {
                cJSON *t = cJSON_CreateObject(), *sh = cJSON_CreateArray();
                cJSON_AddStringToObject(t, "name", m.t[i].name);
                for (int d = 0; d < m.t[i].ndim; d++) cJSON_AddItemToArray(sh, cJSON_CreateNumber((double)m.t[i].shape[d]));
                cJSON_AddItemToObject(t, "shape", sh);
                cJSON_AddNumberToObject(t, "numel", (double)m.t[i].numel);
                cJSON_AddItemToArray(ts, t);
                bytes += m.t[i].nbytes;
            }
            cJSON_AddNumberToObject(go, "bytes", (double)bytes);
            cJSON_AddItemToObject(go, "tensors", ts);
            cJSON_AddItemToArray(gs, go);
        }
        srv_primerl_meta_free(&m);
    }
    free(buf);
    char *t = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    if (!t) return 1;
    printf("%s\n", t);
    free(t);
    return rc;
}
