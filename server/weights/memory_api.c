/* server/weights/memory_api.c — memory release for a colocated trainer: the vLLM and SGLang routes over
 * eng_sleep / eng_wake (engine/engine.h), run on the engine thread through srv_engine_call.
 *
 *   vLLM   POST /sleep?level=1|2   (level 1 by default: the weights are kept in host memory)
 *          POST /wake_up[?tags=weights&tags=kv_cache]   (no tags: everything)
 *          GET  /is_sleeping  -> {"is_sleeping": bool}
 *   SGLang POST /release_memory_occupation  {"tags": ["kv_cache", "weights"] | null}
 *          POST /resume_memory_occupation   {"tags": [...] | null}
 *          (io_struct ReleaseMemoryOccupationReqInput / ResumeMemoryOccupationReqInput: tags None =
 *          everything.) SGLang discards the weights unless --enable-weights-cpu-backup (its
 *          server argument of the same name), so release is sleep level 2 by default, level 1 with
 *          the flag.
 * Clients, as they call these: slime (THUDM/slime 03b32d8, slime/backends/sglang_utils/
 * sglang_engine.py: release with {} then resume with {"tags": [...]} or {"tags": null}); verl
 * (volcengine/verl b178a3c, verl/workers/rollout/sglang_rollout/http_server_engine.py: both with
 * {"tags": tags}); SkyRL (NovaSky-AI/SkyRL 6b58eac, skyrl-train/skyrl_train/inference_engines/
 * remote_inference_engine.py: POST /sleep with the JSON body {"level": n}, POST /wake_up with
 * {"tags": tags} or {"tags": 1}). So /sleep also takes "level" from a JSON body when the query has
 * none, and /wake_up takes a list of tags from the body; any other body "tags" value means
 * everything, as vLLM (which reads only the query) would do.
 *
 * While anything sleeps, generation gets 503 (as vLLM's protected endpoints); /tokenize,
 * /v1/models, /health keep working. Admin routes (the weight routes' key rule), but GET
 * /is_sleeping, which is read-only. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server/weights/weights.h"

typedef struct {
    int wake;       /* 0: sleep, 1: wake */
    int level;
    unsigned tags;  /* 0: everything */
    /* results */
    int rc, status;
    char err[512];
    unsigned asleep;
    eng_sleep_info info;
    eng_wstate wstate;
} mem_call;

static void run_mem(srv_state *s, void *arg)
{
    mem_call *m = arg;
    eng_engine *e = s->rt.e;
    m->rc = m->wake ? eng_wake(e, m->tags, m->err, sizeof m->err, &m->status)
                    : eng_sleep(e, m->level, m->tags, m->err, sizeof m->err, &m->status);
    m->asleep = eng_is_sleeping(e);
    eng_sleep_get_info(e, &m->info);
    m->wstate = eng_weights_state(e);
    atomic_store(&s->mem_asleep_pub, m->asleep);
    srv_weights_publish(s); /* (a level 2 wake leaves the weights inconsistent) */
    srv_metrics_publish(&s->met, e);
}

static cJSON *tags_json(unsigned t)
{
    cJSON *a = cJSON_CreateArray();
    if (t & ENG_MEM_WEIGHTS) cJSON_AddItemToArray(a, cJSON_CreateString("weights"));
    if (t & ENG_MEM_KV) cJSON_AddItemToArray(a, cJSON_CreateString("kv_cache"));
    return a;
}

static int tag_bit(const char *name, unsigned *out)
{
    if (strcmp(name, "weights") == 0) *out |= ENG_MEM_WEIGHTS;
    else if (strcmp(name, "kv_cache") == 0) *out |= ENG_MEM_KV;
    else return -1;
    return 0;
}

/* "tags" of a JSON body: absent / null -> 0 (everything); a list of "weights" / "kv_cache" -> the
 * bits (an empty list: *none = 1); any other value -> everything when lenient (SkyRL's 1), else 400. */
static int body_tags(const cJSON *b, unsigned *tags, int *none, int lenient, srv_err *e)
{
    *tags = 0;
    *none = 0;
    const cJSON *t = b ? cJSON_GetObjectItemCaseSensitive(b, "tags") : NULL;
    if (!t || cJSON_IsNull(t)) return 0;
    if (!cJSON_IsArray(t)) {
        if (lenient) return 0;
        return srv_errf(e, 400, "tags", "tags must be a list of \"weights\" / \"kv_cache\" or null"), -1;
    }
    const cJSON *it;
    cJSON_ArrayForEach(it, t)
    {
        if (!cJSON_IsString(it) || tag_bit(it->valuestring, tags) != 0)
            return srv_errf(e, 400, "tags", "unknown memory tag (the tags are \"weights\" and \"kv_cache\")"), -1;
    }
    if (!*tags) *none = 1;
    return 0;
}

/* A JSON object body, where an empty one means {} (curl -X POST, requests.post(json=None)). */
static cJSON *read_opt_body(srv_state *s, struct mg_connection *c, srv_err *e)
{
    const struct mg_request_info *ri = mg_get_request_info(c);
    if (ri->content_length == 0) return cJSON_CreateObject();
    size_t len;
    char *txt = srv_read_body(&s->http, c, &len, e);
    if (!txt) return NULL;
    size_t i = 0;
    while (i < len && (txt[i] == ' ' || txt[i] == '\t' || txt[i] == '\r' || txt[i] == '\n')) i++;
    cJSON *o = i == len ? cJSON_CreateObject() : srv_parse_json_object(txt, len, e);
    free(txt);
    return o;
}

static int call_and_reply(srv_state *s, struct mg_connection *c, mem_call *m, int sglang)
{
    srv_closure cl = {.fn = run_mem, .arg = m};
    if (srv_engine_call(s, &cl) != 0) return srv_send_error(c, 503, NULL, "the server is shutting down");
    if (m->rc != 0) {
        srv_err e;
        srv_errf(&e, m->status, NULL, "%s", m->err);
        if (m->status == 409) e.type = "conflict";
        return srv_send_err(c, &e);
    }
    cJSON *o = cJSON_CreateObject();
    if (sglang) {
        cJSON_AddBoolToObject(o, "success", 1);
        cJSON_AddStringToObject(o, "message", m->wake ? "memory resumed" : "memory released");
    }
    cJSON_AddBoolToObject(o, "is_sleeping", m->asleep != 0);
    cJSON_AddItemToObject(o, "sleeping_tags", tags_json(m->asleep));
    cJSON_AddNumberToObject(o, "weights_level", m->info.weights_level);
    cJSON_AddNumberToObject(o, "released_weights_bytes", (double)(m->asleep & ENG_MEM_WEIGHTS ? m->info.released[0] : 0));
    cJSON_AddNumberToObject(o, "released_kv_cache_bytes", (double)(m->asleep & ENG_MEM_KV ? m->info.released[1] : 0));
    cJSON_AddNumberToObject(o, "weights_backup_bytes", (double)m->info.backup_bytes);
    /* "inconsistent" after a level 2 wake-up: a full weight update must come before generation */
    cJSON_AddStringToObject(o, "weights", eng_wstate_name(m->wstate));
    int st = srv_send_json(c, 200, o);
    cJSON_Delete(o);
    return st;
}

/* POST /sleep?level=1|2 (vLLM; a JSON {"level": n} body too, as SkyRL sends it) */
static int route_sleep(srv_state *s, struct mg_connection *c)
{
    srv_err e;
    cJSON *b = read_opt_body(s, c, &e);
    if (!b) return srv_send_err(c, &e);
    mem_call m = {.level = 1};
    char v[32];
    if (srv_query_var(c, "level", v, sizeof v)) {
        char *end;
        long l = strtol(v, &end, 10);
        if (*end || (l != 1 && l != 2)) {
            cJSON_Delete(b);
            return srv_send_error(c, 400, "level", "level must be 1 or 2");
        }
        m.level = (int)l;
    } else {
        const cJSON *l = cJSON_GetObjectItemCaseSensitive(b, "level");
        if (l && !cJSON_IsNull(l)) {
            if (!cJSON_IsNumber(l) || (l->valuedouble != 1 && l->valuedouble != 2)) {
                cJSON_Delete(b);
                return srv_send_error(c, 400, "level", "level must be 1 or 2");
            }
            m.level = (int)l->valuedouble;
        }
    }
    cJSON_Delete(b);
    return call_and_reply(s, c, &m, 0);
}

/* POST /wake_up[?tags=weights&tags=kv_cache] (vLLM; a JSON {"tags": [...]} body too) */
static int route_wake_up(srv_state *s, struct mg_connection *c)
{
    const struct mg_request_info *ri = mg_get_request_info(c);
    srv_err e;
    cJSON *b = read_opt_body(s, c, &e);
    if (!b) return srv_send_err(c, &e);
    mem_call m = {.wake = 1};
    int none = 0;
    int from_query = 0;
    if (ri->query_string) {
        char v[64];
        const size_t ql = strlen(ri->query_string);
        for (size_t k = 0; k < 16; k++) {
            int n = mg_get_var2(ri->query_string, ql, "tags", v, sizeof v, k);
            if (n < 0) break;
            from_query = 1;
            if (tag_bit(v, &m.tags) != 0) {
                cJSON_Delete(b);
                return srv_send_error(c, 400, "tags", "unknown memory tag '%s' (the tags are weights and kv_cache)", v);
            }
        }
    }
    if (!from_query && body_tags(b, &m.tags, &none, 1, &e) != 0) {
        cJSON_Delete(b);
        return srv_send_err(c, &e);
    }
    cJSON_Delete(b);
    (void)none; /* [] in a body: as no tags (vLLM: tags None wakes everything) */
    return call_and_reply(s, c, &m, 0);
}

/* GET /is_sleeping (vLLM) */
static int route_is_sleeping(srv_state *s, struct mg_connection *c)
{
    const unsigned t = atomic_load(&s->mem_asleep_pub);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddBoolToObject(o, "is_sleeping", t != 0);
    cJSON_AddItemToObject(o, "sleeping_tags", tags_json(t));
    int st = srv_send_json(c, 200, o);
    cJSON_Delete(o);
    return st;
}

/* POST /release_memory_occupation, /resume_memory_occupation (SGLang) */
static int route_sglang(srv_state *s, struct mg_connection *c, int wake)
{
    srv_err e;
    cJSON *b = read_opt_body(s, c, &e);
    if (!b) return srv_send_err(c, &e);
    mem_call m = {.wake = wake, .level = s->weights_cpu_backup ? 1 : 2};
    int none = 0;
    int rc = body_tags(b, &m.tags, &none, 0, &e);
    cJSON_Delete(b);
    if (rc != 0) return srv_send_err(c, &e);
    if (none) { /* an empty list names nothing: report the state, change nothing */
        cJSON *o = cJSON_CreateObject();
        const unsigned t = atomic_load(&s->mem_asleep_pub);
        cJSON_AddBoolToObject(o, "success", 1);
        cJSON_AddStringToObject(o, "message", "no tags given: nothing to do");
        cJSON_AddBoolToObject(o, "is_sleeping", t != 0);
        cJSON_AddItemToObject(o, "sleeping_tags", tags_json(t));
        int st = srv_send_json(c, 200, o);
        cJSON_Delete(o);
        return st;
    }
    return call_and_reply(s, c, &m, 1);
}

static int route_release(srv_state *s, struct mg_connection *c) { return route_sglang(s, c, 0); }
static int route_resume(srv_state *s, struct mg_connection *c) { return route_sglang(s, c, 1); }

void srv_memory_routes(srv_state *s)
{
    srv_route_add(&s->http, "POST", "/sleep", route_sleep, 2);
    srv_route_add(&s->http, "POST", "/wake_up", route_wake_up, 2);
    srv_route_add(&s->http, "GET", "/is_sleeping", route_is_sleeping, 1);
    /* SGLang's api_route takes GET and POST */
    srv_route_add(&s->http, "POST", "/release_memory_occupation", route_release, 2);
    srv_route_add(&s->http, "GET", "/release_memory_occupation", route_release, 2);
    srv_route_add(&s->http, "POST", "/resume_memory_occupation", route_resume, 2);
    srv_route_add(&s->http, "GET", "/resume_memory_occupation", route_resume, 2);
}
