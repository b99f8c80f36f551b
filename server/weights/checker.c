/* server/weights/checker.c — vLLM's /weight_checker and SGLang's /weights_checker.
 *
 * Actions (body {"action", "model", "names", "skip_tensor_list", "allow_quant_error", "checksums"}):
 *   checksum       the model's checksums ("names": internal | checkpoint); SGLang's answer shape
 *                  around them: {"success", "message", "ranks": [{"checksums", "per_gpu_checksum",
 *                  "parallelism_info"}]} (http_server.py check_weights and utils/weight_checker.py,
 *                  sgl-project/sglang 05bed317), and "checksums" at the top as graphswap answered
 *                  before (vLLM dialect, the clients)
 *   compare        with "checksums": against the caller's hashes (200, "match", "mismatches");
 *                  without: against the last snapshot, as SGLang's compare: 200 {"success": true} when
 *                  every tensor not skipped equals it, else 400 {"success": false, "message": names}
 *   snapshot       the checkpoint-name checksums of the model(s) (derived buffers included, under
 *                  their own names) kept in the server for the next compare
 *   reset_tensors  every checkpoint tensor not skipped overwritten with random values
 *                  (eng_weights_reset: one session through the ordinary update path)
 * slime and miles drive snapshot -> reset_tensors -> their first weight sync -> compare
 * (slime train.py, --check-weight-update-equal): a tensor the sync missed keeps its random values
 * and the compare names it. Skipped names (skip_tensor_list: substrings, as SGLang) are neither reset
 * nor compared. allow_quant_error is accepted and changes nothing: no weight here is quantized, so
 * every compare is exact. "model": target (default), draft, or all (the drafter's names as
 * "draft.<name>").
 *
 * State: s->wsnap (under wmu): NULL until the first snapshot, then {"target": {name: hex}, "draft":
 * {...}} for the models of the last snapshot; replaced by the next one, freed at shutdown.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/sha256.h"
#include "server/weights/weights_api.h"

#define CHECKER_MAX_SKIP 64

typedef struct {
    const char *action, *model, *names;
    const char *skip[CHECKER_MAX_SKIP];
    int n_skip;
} checker_req;

static int parse_req(const cJSON *b, checker_req *r, srv_err *e)
{
    memset(r, 0, sizeof *r);
    r->action = "checksum";
    r->model = "target";
    if (srv_opt_string(b, "action", &r->action, e) || srv_opt_string(b, "model", &r->model, e) ||
        srv_opt_string(b, "names", &r->names, e))
        return -1;
    static const char *const actions[] = {"checksum", "compare", "snapshot", "reset_tensors"};
    int ok = 0;
    for (size_t i = 0; i < sizeof actions / sizeof *actions; i++) ok |= strcmp(r->action, actions[i]) == 0;
    if (!ok) {
        srv_errf(e, 400, "action", "action must be \"checksum\", \"compare\", \"snapshot\" or \"reset_tensors\"");
        return -1;
    }
    if (strcmp(r->model, "target") != 0 && strcmp(r->model, "draft") != 0 && strcmp(r->model, "all") != 0) {
        srv_errf(e, 400, "model", "model must be \"target\", \"draft\" or \"all\"");
        return -1;
    }
    const cJSON *q = cJSON_GetObjectItemCaseSensitive(b, "allow_quant_error");
    if (q && !cJSON_IsNull(q) && !cJSON_IsBool(q)) {
        srv_errf(e, 400, "allow_quant_error", "allow_quant_error must be a boolean");
        return -1;
    }
    const cJSON *sk = cJSON_GetObjectItemCaseSensitive(b, "skip_tensor_list");
    if (sk && !cJSON_IsNull(sk)) {
        if (!cJSON_IsArray(sk) || cJSON_GetArraySize(sk) > CHECKER_MAX_SKIP) {
            srv_errf(e, 400, "skip_tensor_list", "skip_tensor_list must be a list of at most %d strings",
                     CHECKER_MAX_SKIP);
            return -1;
        }
        const cJSON *x;
        cJSON_ArrayForEach(x, sk)
        {
            if (!cJSON_IsString(x) || strlen(x->valuestring) >= 256) {
                srv_errf(e, 400, "skip_tensor_list", "skip_tensor_list entries must be strings of fewer than 256 bytes");
                return -1;
            }
            r->skip[r->n_skip++] = x->valuestring;
        }
    }
    return 0;
}

/* The checksums of one model (draft 0/1) by checkpoint or internal names; on failure answers the
 * command's error and returns NULL. */
static cJSON *model_sums(srv_state *s, struct mg_connection *conn, int draft, int ck, srv_cmd **cmd, int *st)
{
    cJSON *t = NULL;
    srv_cmd *c = NULL;
    *st = srv_weights_checksums(s, conn, draft, ck, &t, &c);
    if (!c) return NULL; /* answered (500) */
    if (c->status != 200) {
        *st = srv_cmd_send_result(conn, c, NULL);
        free(c);
        return NULL;
    }
    *cmd = c;
    return t;
}

/* SGLang's per_gpu_checksum: sha256 over the sorted names, each followed by its hash text. */
static void overall_sum(const cJSON *t, char hex[65])
{
    int n = cJSON_GetArraySize(t), k = 0;
    const char **names = calloc(n ? (size_t)n : 1, sizeof *names);
    hex[0] = 0; /* out of memory: no overall hash */
    if (!names) return;
    size_t len = 0;
    const cJSON *x;
    cJSON_ArrayForEach(x, t)
    {
        names[k++] = x->string;
        len += strlen(x->string) + (cJSON_IsString(x) ? strlen(x->valuestring) : 0);
    }
    char *buf = malloc(len + 1);
    if (!buf) {
        free(names);
        return;
    }
    for (int i = 1; i < k; i++) /* insertion sort: a few hundred names */
        for (int j = i; j > 0 && strcmp(names[j - 1], names[j]) > 0; j--) {
            const char *tmp = names[j];
            names[j] = names[j - 1];
            names[j - 1] = tmp;
        }
    size_t o = 0;
    for (int i = 0; i < k; i++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(t, names[i]);
        size_t a = strlen(names[i]), b = cJSON_IsString(v) ? strlen(v->valuestring) : 0;
        memcpy(buf + o, names[i], a);
        memcpy(buf + o + a, b ? v->valuestring : "", b);
        o += a + b;
    }
    eng_sha256_hex((const uint8_t *)buf, o, hex);
    free(buf);
    free(names);
}

static cJSON *ranks_json(const cJSON *sums)
{
    char hex[65];
    overall_sum(sums, hex);
    cJSON *ranks = cJSON_CreateArray(), *r = cJSON_CreateObject();
    cJSON_AddItemToArray(ranks, r);
    cJSON_AddItemToObject(r, "checksums", cJSON_Duplicate(sums, 1));
    cJSON_AddStringToObject(r, "per_gpu_checksum", hex);
    cJSON *p = cJSON_AddObjectToObject(r, "parallelism_info"); /* one process, one device */
    static const char *const keys[] = {"tp_rank", "tp_size", "dp_rank", "dp_size", "pp_rank", "pp_size", "rank", "size"};
    for (int i = 0; i < 8; i++) cJSON_AddNumberToObject(p, keys[i], i % 2);
    return ranks;
}

static int send_outcome(struct mg_connection *conn, int ok, const char *msg, cJSON *o)
{
    if (!o) o = cJSON_CreateObject();
    cJSON_AddBoolToObject(o, "success", ok);
    cJSON_AddStringToObject(o, "message", msg);
    int st = srv_send_json(conn, ok ? 200 : 400, o);
    cJSON_Delete(o);
    return st;
}

/* compare against the caller's {name: hex}: 200 with match / mismatches / compared */
static int compare_given(const cJSON *want, cJSON *have, cJSON *o)
{
    cJSON *mism = cJSON_AddArrayToObject(o, "mismatches");
    const cJSON *x;
    int n = 0;
    cJSON_ArrayForEach(x, want)
    {
        const cJSON *h = cJSON_GetObjectItemCaseSensitive(have, x->string);
        n++;
        if (!cJSON_IsString(x) || !cJSON_IsString(h) || strcmp(x->valuestring, h->valuestring) != 0)
            cJSON_AddItemToArray(mism, cJSON_CreateString(x->string));
    }
    const int match = cJSON_GetArraySize(mism) == 0 && n == cJSON_GetArraySize(have);
    cJSON_AddBoolToObject(o, "match", match);
    cJSON_AddNumberToObject(o, "compared", n);
    return match;
}

/* The checkpoint-name checksums of the requested model(s), names of the drafter prefixed "draft."
 * for model "all": {"target": {...}, "draft": {...}}. NULL: answered. */
static cJSON *snapshot_now(srv_state *s, struct mg_connection *conn, const char *model, int *st)
{
    cJSON *snap = cJSON_CreateObject();
    for (int draft = 0; draft < 2; draft++) {
        if ((draft == 0 && strcmp(model, "draft") == 0) || (draft == 1 && strcmp(model, "target") == 0)) continue;
        srv_cmd *c = NULL;
        cJSON *t = model_sums(s, conn, draft, 1, &c, st);
        if (!t) {
            cJSON_Delete(snap);
            return NULL;
        }
        free(c);
        cJSON_AddItemToObject(snap, draft ? "draft" : "target", t);
    }
    return snap;
}

/* Compares the current sums with the snapshot; the names that differ go to `bad` (prefixed as the
 * session names them), skipped names are left out. Returns the number compared, or -1 when a model
 * asked for has no snapshot. */
static int compare_snapshot(const cJSON *snap, const cJSON *now, const char *model, const checker_req *r,
                            cJSON *bad)
{
    int n = 0;
    const cJSON *m;
    cJSON_ArrayForEach(m, now)
    {
        const cJSON *old = cJSON_GetObjectItemCaseSensitive(snap, m->string);
        if (!old) return -1;
        const char *pfx = strcmp(m->string, "draft") == 0 && strcmp(model, "all") == 0 ? "draft." : "";
        const cJSON *x;
        cJSON_ArrayForEach(x, m)
        {
            char name[320];
            snprintf(name, sizeof name, "%s%s", pfx, x->string);
            if (eng_weights_name_skipped(name, r->skip, r->n_skip)) continue;
            const cJSON *o = cJSON_GetObjectItemCaseSensitive(old, x->string);
            n++;
            if (!cJSON_IsString(o) || strcmp(o->valuestring, x->valuestring) != 0)
                cJSON_AddItemToArray(bad, cJSON_CreateString(name));
        }
    }
    return n;
}

/* Engine thread: the reset (SRV_CMD_WRESET's run). */
static void run_reset(srv_state *s, srv_cmd *c, int *st)
{
    static uint64_t resets; /* engine thread only: each reset draws new values */
    if (eng_weights_reset(s->rt.e, c->which, c->skip, c->n_skip, 0x5EED0000ull + resets++, &c->n_reset, c->err,
                          sizeof c->err, st) == 0)
        *st = 200;
}

int srv_wroute_checker(srv_state *s, struct mg_connection *conn)
{
    srv_err e;
    cJSON *b = srv_read_json_opt(s, conn, &e);
    if (!b) return srv_send_err(conn, &e);
    checker_req r;
    int st = 200;
    if (parse_req(b, &r, &e) != 0) {
        cJSON_Delete(b);
        return srv_send_err(conn, &e);
    }
    const int names = srv_weights_parse_names(r.names);
    if (names < 0) {
        cJSON_Delete(b);
        return srv_send_error(conn, 400, "names", "names must be \"internal\" or \"checkpoint\"");
    }
    const cJSON *want = cJSON_GetObjectItemCaseSensitive(b, "checksums");
    if (strcmp(r.action, "checksum") == 0 || (strcmp(r.action, "compare") == 0 && want)) {
        if (strcmp(r.model, "all") == 0) {
            st = srv_send_error(conn, 400, "model", "action %s takes model \"target\" or \"draft\"", r.action);
            cJSON_Delete(b); /* (r's strings point into b) */
            return st;
        }
        srv_cmd *c = NULL;
        cJSON *t = model_sums(s, conn, strcmp(r.model, "draft") == 0, names, &c, &st);
        if (!t) {
            cJSON_Delete(b);
            return st;
        }
        cJSON *o = cJSON_CreateObject();
        if (names) srv_weights_hash_fields(o, c); /* (the default answer keeps its vLLM / SGLang shape) */
        free(c);
        if (strcmp(r.action, "checksum") == 0) {
            cJSON_AddItemToObject(o, "ranks", ranks_json(t));
            cJSON_AddItemToObject(o, "checksums", t);
        } else {
            compare_given(want, t, o);
            cJSON_Delete(t);
        }
        cJSON_Delete(b);
        /* the given-hashes compare reports a mismatch in "match" with 200, as before */
        return send_outcome(conn, 1, "", o);
    }
    if (strcmp(r.action, "snapshot") == 0) {
        cJSON *snap = snapshot_now(s, conn, r.model, &st);
        cJSON_Delete(b);
        if (!snap) return st;
        int n = 0;
        const cJSON *m;
        cJSON_ArrayForEach(m, snap) n += cJSON_GetArraySize(m);
        pthread_mutex_lock(&s->wmu);
        cJSON_Delete(s->wsnap);
        s->wsnap = snap;
        char msg[256];
        snprintf(msg, sizeof msg, "snapshot of %d tensors (weight version %s)", n, s->wpub.version);
        pthread_mutex_unlock(&s->wmu);
        return send_outcome(conn, 1, msg, NULL);
    }
    if (strcmp(r.action, "reset_tensors") == 0) {
        srv_cmd *c = srv_cmd_new(SRV_CMD_WRESET);
        if (!c) {
            cJSON_Delete(b);
            return srv_send_error(conn, 500, NULL, "out of memory");
        }
        eng_wmodel_parse(r.model, &c->which);
        c->skip = r.skip; /* r and b outlive the command: srv_cmd_submit waits */
        c->n_skip = r.n_skip;
        c->run = run_reset;
        srv_cmd_submit(s, c);
        char msg[128];
        snprintf(msg, sizeof msg, "reset %d tensors", c->n_reset);
        cJSON_Delete(b);
        if (c->status != 200) {
            st = srv_cmd_send_result(conn, c, NULL);
            free(c);
            return st;
        }
        free(c);
        return send_outcome(conn, 1, msg, NULL);
    }
    /* compare against the snapshot */
    cJSON *now = snapshot_now(s, conn, r.model, &st);
    if (!now) {
        cJSON_Delete(b);
        return st;
    }
    cJSON *bad = cJSON_CreateArray();
    pthread_mutex_lock(&s->wmu);
    const int n = s->wsnap ? compare_snapshot(s->wsnap, now, r.model, &r, bad) : -1;
    pthread_mutex_unlock(&s->wmu);
    cJSON_Delete(now);
    if (n < 0) {
        cJSON_Delete(bad);
        st = srv_send_error(conn, 400, "action",
                            "no snapshot of model \"%s\" to compare with: send {\"action\": \"snapshot\"} first", r.model);
        cJSON_Delete(b); /* (r's strings point into b) */
        return st;
    }
    cJSON_Delete(b);
    const int nb = cJSON_GetArraySize(bad);
    char msg[1024];
    if (nb == 0) {
        snprintf(msg, sizeof msg, "%d tensors equal the snapshot", n);
    } else {
        int o = snprintf(msg, sizeof msg, "check tensor equality failed: %d of %d tensors differ from the snapshot:", nb, n);
        const cJSON *x;
        cJSON_ArrayForEach(x, bad)
        {
            if (o <= 0 || (size_t)o >= sizeof msg - 1) break; /* the full list is in "mismatches" */
            o += snprintf(msg + o, sizeof msg - (size_t)o, " %s", x->valuestring);
        }
    }
    cJSON *o = cJSON_CreateObject();
    cJSON_AddItemToObject(o, "mismatches", bad);
    cJSON_AddNumberToObject(o, "compared", n);
    return send_outcome(conn, nb == 0, msg, o);
}
