/* server/dialects/sglang_tensor.c — SGLang's POST /update_weights_from_tensor (slime's colocated sync,
 * verl's SGLang rollout): tensors the trainer shares through torch's multiprocessing pickles.
 *
 * Body (sgl-project/sglang 05bed317 managers/io_struct.py UpdateWeightsFromTensorReqInput):
 *   {"serialized_named_tensors": [base64 of MultiprocessingSerializer.serialize(obj)] (one per TP
 *    rank: graphswap is one rank and reads the first), "load_format": null | "direct" |
 *    "flattened_bucket", "flush_cache": bool, "abort_all_requests": bool, "weight_version": str}
 * Answer: {"success", "message"}, 200 or the failure's status (SGLang: 400).
 *
 * Flow: base64 -> srv_torch_unpickle (server/rendezvous/torch_ipc.c: the pickle's tensors, names,
 * shapes and where their bytes are) -> each CPU storage's shared-memory object opened read-only
 * under /dev/shm (no symlink followed; a regular file of this process's user, at least 64 + the
 * storage's bytes long) and mapped -> one SRV_CMD_HOST_UPDATE: a partial session of the target with
 * those tensors in one bucket, checked whole before the first byte is written (a refused bucket
 * changes nothing) -> unmapped. Pause as SGLang's from-disk update: abort_all_requests -> "abort",
 * else "wait"; a /pause_generation stays in force (slime resumes itself). flush_cache is implied:
 * every update drops the prefix cache (I6). CUDA tensors and torch's default "file_descriptor"
 * strategy are refused with 501 (torch_ipc.c says why).
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "server/dialects/dialects.h"
#include "server/rendezvous/torch_ipc.h"

#define SHM_HEADER 64 /* libshm's refcount header before a file_system storage's bytes */
#define MAX_MAPS 64   /* distinct storages in one payload (slime: one flat tensor per bucket) */

typedef struct {
    char name[SRV_TORCH_MAX_SHM + 1];
    uint8_t *base;
    size_t len;
} shm_map;

typedef struct {
    shm_map m[MAX_MAPS];
    int n;
} shm_maps;

static void maps_free(shm_maps *ms)
{
    for (int i = 0; i < ms->n; i++) munmap(ms->m[i].base, ms->m[i].len);
    ms->n = 0;
}

/* The mapping of t's storage (opened once per name); NULL with e filled. */
static const uint8_t *map_storage(shm_maps *ms, const srv_torch_tensor *t, srv_err *e)
{
    for (int i = 0; i < ms->n; i++)
        if (strcmp(ms->m[i].name, t->shm) == 0) return ms->m[i].base + SHM_HEADER;
    if (ms->n == MAX_MAPS) return srv_errf(e, 400, "serialized_named_tensors", "more than %d storages in one payload", MAX_MAPS), NULL;
    char path[sizeof "/dev/shm" + SRV_TORCH_MAX_SHM];
    snprintf(path, sizeof path, "/dev/shm%s", t->shm); /* t->shm: "/torch_" digits and _ (torch_ipc.c) */
    const int fd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) {
        srv_errf(e, 400, "serialized_named_tensors",
                 "cannot open the shared memory %s of tensor %s (%s): trainer and server must share the host, and "
                 "the trainer must keep its tensors alive until this call returns",
                 t->shm, t->name, strerror(errno));
        return NULL;
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_uid != geteuid() ||
        (uint64_t)st.st_size < SHM_HEADER + t->storage_bytes) {
        close(fd);
        srv_errf(e, 400, "serialized_named_tensors",
                 "the shared memory %s of tensor %s is not a storage of %llu bytes owned by this user", t->shm, t->name,
                 (unsigned long long)t->storage_bytes);
        return NULL;
    }
    void *p = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_SHARED, fd, 0);
    close(fd);
    if (p == MAP_FAILED) return srv_errf(e, 500, NULL, "cannot map %s: %s", t->shm, strerror(errno)), NULL;
    shm_map *m = &ms->m[ms->n++];
    snprintf(m->name, sizeof m->name, "%s", t->shm);
    m->base = p;
    m->len = (size_t)st.st_size;
    return m->base + SHM_HEADER;
}

static int send_sglang(struct mg_connection *conn, int status, const char *msg)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddBoolToObject(o, "success", status == 200);
    cJSON_AddStringToObject(o, "message", msg);
    int st = srv_send_json(conn, status, o);
    cJSON_Delete(o);
    return st;
}

/* The first payload of serialized_named_tensors, base64-decoded (*buf: malloc'd). */
static int payload(const cJSON *b, unsigned char **buf, long *len, srv_err *e)
{
    const cJSON *l = cJSON_GetObjectItemCaseSensitive(b, "serialized_named_tensors");
    const cJSON *x = cJSON_IsArray(l) ? cJSON_GetArrayItem(l, 0) : NULL;
    if (!x || !cJSON_IsString(x))
        return srv_errf(e, 400, "serialized_named_tensors",
                        "serialized_named_tensors must be a non-empty list of base64 strings (one per TP rank)"), -1;
    const size_t n = strlen(x->valuestring);
    if (n / 4 * 3 > SRV_TORCH_MAX_BYTES + 3)
        return srv_errf(e, 413, "serialized_named_tensors", "a serialized payload is larger than 16 MiB"), -1;
    if (!(*buf = malloc(n / 4 * 3 + 4))) return srv_errf(e, 500, NULL, "out of memory"), -1;
    *len = srv_b64_decode(x->valuestring, *buf, n / 4 * 3 + 4);
    if (*len < 0) return srv_errf(e, 400, "serialized_named_tensors", "serialized_named_tensors[0] is not base64"), -1;
    return 0;
}

static int route_update_from_tensor(srv_state *s, struct mg_connection *conn)
{
    srv_err e;
    cJSON *b = srv_read_json(&s->http, conn, &e);
    if (!b) return srv_send_err(conn, &e);
    const char *fmt = NULL, *version = NULL;
    unsigned char *raw = NULL;
    long rawlen = 0;
    srv_torch_named tn = {0};
    shm_maps maps = {.n = 0};
    mdl_st_tensor *ts = NULL;
    srv_cmd *c = NULL;
    int st = 0;
    if (srv_opt_string(b, "load_format", &fmt, &e) || srv_opt_version(b, "weight_version", &version, &e)) goto err;
    if (fmt && strcmp(fmt, "direct") != 0 && strcmp(fmt, "flattened_bucket") != 0) {
        srv_errf(&e, 400, "load_format", "load_format must be null, \"direct\" or \"flattened_bucket\"");
        goto err;
    }
    for (const char *const *k = (const char *const[]){"flush_cache", "abort_all_requests", NULL}; *k; k++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(b, *k);
        if (v && !cJSON_IsNull(v) && !cJSON_IsBool(v)) {
            srv_errf(&e, 400, *k, "%s must be a boolean", *k);
            goto err;
        }
    }
    if (payload(b, &raw, &rawlen, &e) != 0) goto err;
    char perr[512];
    int pst = 400;
    if (srv_torch_unpickle(raw, (size_t)rawlen, fmt && strcmp(fmt, "flattened_bucket") == 0 ? fmt : NULL, &tn, perr,
                           sizeof perr, &pst) != 0) {
        srv_errf(&e, pst, "serialized_named_tensors", "%s", perr);
        goto err;
    }
    if (!(ts = calloc(tn.n, sizeof *ts)) || !(c = srv_cmd_new(SRV_CMD_HOST_UPDATE))) {
        srv_errf(&e, 500, NULL, "out of memory");
        goto err;
    }
    static const uint8_t none[1];
    for (size_t i = 0; i < tn.n; i++) {
        const srv_torch_tensor *t = &tn.t[i];
        const uint8_t *base = t->where == SRV_TORCH_EMPTY ? none : map_storage(&maps, t, &e);
        if (!base) goto err;
        ts[i] = (mdl_st_tensor){.name = t->name, .dtype = t->dtype, .ndim = t->ndim, .numel = t->numel,
                                .data = t->where == SRV_TORCH_EMPTY ? none : base + t->offset_bytes, .nbytes = t->nbytes};
        memcpy(ts[i].shape, t->shape, sizeof ts[i].shape);
    }
    c->full = 0;
    c->which = ENG_WMODEL_TARGET;
    c->pause = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(b, "abort_all_requests")) ? ENG_PAUSE_ABORT : ENG_PAUSE_WAIT;
    if (version) snprintf(c->version, sizeof c->version, "%s", version);
    snprintf(c->what, sizeof c->what, "update_weights_from_tensor");
    c->tensors = ts;
    c->n_tensors = tn.n;
    srv_cmd_submit(s, c);
    char msg[sizeof c->err + 64];
    if (c->status == 200) snprintf(msg, sizeof msg, "Succeeded to update %zu tensors.", tn.n);
    else snprintf(msg, sizeof msg, "%s", c->err);
    st = send_sglang(conn, c->status, msg);
    goto out;
err:
    st = e.status == 200 ? 500 : e.status;
    {
        char msg[sizeof e.msg];
        snprintf(msg, sizeof msg, "%s", e.msg);
        send_sglang(conn, st, msg);
    }
out:
    maps_free(&maps);
    free(c);
    free(ts);
    srv_torch_named_free(&tn);
    free(raw);
    cJSON_Delete(b);
    return st;
}

void srv_weights_sglang_tensor_routes(srv_state *s)
{
    srv_route_add(&s->http, "POST", "/update_weights_from_tensor", route_update_from_tensor, 2);
}
