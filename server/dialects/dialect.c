/* server/dialects/dialect.c — what every dialect (dialect_*.c) shares to stay a thin translation: its sampling
 * fields are copied, renamed, into a canonical /v1/completions body and validated by the one parser
 * (srv_parse_gen in oai_parse.c), so a rule added there (a new field, a refusal lifted) holds for every
 * dialect at once; errors are renamed back to the field the client sent. */
#include <stdio.h>
#include <string.h>

#include "server/dialects/dialects.h"

/* Replaces the first whole-word occurrence of `to` in msg by `from`. */
static void msg_rename(char *msg, size_t cap, const char *to, const char *from)
{
    const size_t tl = strlen(to), fl = strlen(from);
    for (char *p = strstr(msg, to); p; p = strstr(p + 1, to)) {
        const int left_ok = p == msg || !(p[-1] == '_' || (p[-1] >= 'a' && p[-1] <= 'z'));
        const int right_ok = !(p[tl] == '_' || (p[tl] >= 'a' && p[tl] <= 'z'));
        if (!left_ok || !right_ok) continue;
        const size_t rest = strlen(p + tl);
        if ((size_t)(p - msg) + fl + rest + 1 > cap) return;
        memmove(p + fl, p + tl, rest + 1);
        memcpy(p, from, fl);
        return;
    }
}

void srv_err_rename(srv_err *e, const srv_field_map *map, int n_map)
{
    for (int i = 0; i < n_map; i++) {
        if (strcmp(map[i].from, map[i].to) == 0) continue;
        if (strcmp(e->param, map[i].to) != 0) continue;
        snprintf(e->param, sizeof e->param, "%s", map[i].from);
        msg_rename(e->msg, sizeof e->msg, map[i].to, map[i].from);
        return;
    }
}

int srv_parse_mapped(const srv_state *s, cJSON *canon, const cJSON *src, const srv_field_map *map, int n_map,
                     srv_gen *g, srv_err *e)
{
    int rc = 0;
    for (int i = 0; src && i < n_map && rc == 0; i++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(src, map[i].from);
        if (!v || cJSON_IsNull(v)) continue;
        cJSON *d = cJSON_Duplicate(v, 1);
        if (!d) rc = srv_errf(e, 500, NULL, "out of memory");
        else if (cJSON_GetObjectItemCaseSensitive(canon, map[i].to)) cJSON_ReplaceItemInObjectCaseSensitive(canon, map[i].to, d);
        else cJSON_AddItemToObject(canon, map[i].to, d);
    }
    if (rc == 0) {
        rc = srv_parse_gen(s, canon, SRV_API_COMPLETIONS, g, e);
        if (rc != 0) { /* the field the client sent, when several map onto the one blamed */
            int done = 0;
            for (int i = 0; src && i < n_map && !done; i++) {
                const cJSON *v = cJSON_GetObjectItemCaseSensitive(src, map[i].from);
                if (v && !cJSON_IsNull(v) && strcmp(e->param, map[i].to) == 0) {
                    srv_err_rename(e, &map[i], 1);
                    done = 1;
                }
            }
            if (!done) srv_err_rename(e, map, n_map);
        }
    }
    cJSON_Delete(canon);
    return rc;
}
