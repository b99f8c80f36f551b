/* tests/unit/test_json_guard.c — models/format/json_guard.c: nesting depth outside strings, NUL (raw and
 * escaped) inside strings, escape handling; mdl_json_parse, the one entry point into cJSON (each
 * status with its offset, the end offset, the depth limit exactly, flags); and that the safetensors parser refuses a deep header
 * on a thread whose stack is as small as a civetweb worker's (the crash this guard prevents). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "models/format/json_guard.h"
#include "models/format/safetensors.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int check(const char *s, int max_depth, int refuse_nul, mdl_json_scan *sc)
{
    char msg[160];
    return mdl_json_check(s, strlen(s), max_depth, refuse_nul, sc, msg, sizeof msg);
}

/* "[" x n then "]" x n */
static char *nested(int n, char open, char close)
{
    char *s = malloc((size_t)2 * (size_t)n + 1);
    assert_non_null(s);
    memset(s, open, (size_t)n);
    memset(s + n, close, (size_t)n);
    s[2 * n] = 0;
    return s;
}

static void test_depth(void **st)
{
    (void)st;
    mdl_json_scan sc;
    assert_int_equal(check("{}", 4, 1, &sc), 0);
    assert_int_equal(sc.depth, 1);
    assert_int_equal(check("{\"a\":[1,{\"b\":[]}]}", 4, 1, &sc), 0);
    assert_int_equal(sc.depth, 4);
    assert_int_equal(check("{\"a\":[1,{\"b\":[]}]}", 3, 1, &sc), -1);
    assert_int_equal(sc.deep_at, 13); /* the fourth opener */
    /* siblings do not add up */
    assert_int_equal(check("[[],[],[[]],[]]", 3, 1, &sc), 0);
    assert_int_equal(sc.depth, 3);
    char *s = nested(MDL_JSON_MAX_DEPTH, '[', ']');
    assert_int_equal(check(s, MDL_JSON_MAX_DEPTH, 1, NULL), 0);
    free(s);
    s = nested(MDL_JSON_MAX_DEPTH + 1, '{', '}');
    char msg[160];
    assert_int_equal(mdl_json_check(s, strlen(s), MDL_JSON_MAX_DEPTH, 1, NULL, msg, sizeof msg), -1);
    assert_non_null(strstr(msg, "deeper than 128"));
    free(s);
}

static void test_strings(void **st)
{
    (void)st;
    mdl_json_scan sc;
    /* brackets inside strings are text, also after escaped quotes and backslashes */
    assert_int_equal(check("[\"[[[[{{{{\"]", 2, 1, &sc), 0);
    assert_int_equal(sc.depth, 1);
    assert_int_equal(check("[\"a\\\"[[[[\"]", 1, 1, &sc), 0);
    assert_int_equal(check("[\"a\\\\\",[[[]]]]", 3, 1, &sc), -1); /* "a\\" ends; the brackets count */
    assert_int_equal(sc.depth, 4);
    /* NUL: escaped (any escape position), raw; an escaped backslash before u0000 is text */
    assert_int_equal(check("{\"p\":\"ab\\u0000\"}", 8, 1, &sc), -1);
    assert_int_equal(sc.nul, 1);
    assert_int_equal(sc.nul_at, 8);
    assert_int_equal(check("{\"p\":\"ab\\u0000\"}", 8, 0, &sc), 0); /* reported, not refused */
    assert_int_equal(sc.nul, 1);
    assert_int_equal(check("{\"p\":\"a\\\\u0000\"}", 8, 1, &sc), 0);
    assert_int_equal(sc.nul, 0);
    assert_int_equal(check("{\"p\":\"a\\\\\\u0000\"}", 8, 1, &sc), -1); /* \\ then \u0000 */
    assert_int_equal(check("{\"p\":\"\\u00001\"}", 8, 1, &sc), -1);
    assert_int_equal(check("{\"p\":\"\\u0001\"}", 8, 1, &sc), 0);
    const char raw[] = "{\"p\":\"a\0b\"}";
    char msg[160];
    assert_int_equal(mdl_json_check(raw, sizeof raw - 1, 8, 1, &sc, msg, sizeof msg), -1);
    assert_int_equal(sc.nul_at, 7);
    assert_non_null(strstr(msg, "NUL"));
    /* a truncated escape at the end does not read past the text */
    assert_int_equal(check("[\"\\u00", 8, 1, &sc), 0);
    assert_int_equal(check("[\"\\", 8, 1, &sc), 0);
}

/* ---- mdl_json_parse: the one entry point ------------------------------------------------------ */

static cJSON *parse(const char *s, size_t n, int max_depth, unsigned flags, mdl_json_result *r, char *err,
                    size_t errlen)
{
    memset(r, 0xA5, sizeof *r); /* every field the call reports must be written */
    return mdl_json_parse(s, n, max_depth, flags, r, err, errlen);
}

static void test_parse_ok(void **st)
{
    (void)st;
    mdl_json_result r;
    char err[160] = "untouched";
    const char *s = "{\"a\":[1,2,{\"b\":\"x\"}]}";
    cJSON *v = parse(s, strlen(s), 8, MDL_JSON_REFUSE_NUL | MDL_JSON_WHOLE | MDL_JSON_OBJECT, &r, err, sizeof err);
    assert_non_null(v);
    assert_int_equal(r.status, MDL_JSON_OK);
    assert_int_equal(r.end, strlen(s));
    assert_int_equal(r.scan.depth, 3);
    assert_int_equal(r.scan.nul, 0);
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(v, "a");
    assert_int_equal(cJSON_GetArraySize(a), 3);
    assert_string_equal(cJSON_GetObjectItemCaseSensitive(cJSON_GetArrayItem(a, 2), "b")->valuestring, "x");
    cJSON_Delete(v);
    /* not NUL-terminated: parsing is bounded by len (the bytes after it are never read as JSON) */
    const char buf[] = {'[', '1', ',', '2', ']', 'G', 'A', 'R', 'B'};
    v = parse(buf, 5, 8, MDL_JSON_WHOLE, &r, err, sizeof err);
    assert_non_null(v);
    assert_int_equal(r.end, 5);
    assert_int_equal(cJSON_GetArraySize(v), 2);
    cJSON_Delete(v);
    /* end: just past the value, before trailing whitespace; res and err are optional */
    v = parse("[1] \n", 5, 8, 0, &r, err, sizeof err);
    assert_non_null(v);
    assert_int_equal(r.end, 3);
    cJSON_Delete(v);
    v = mdl_json_parse("\t {\"k\": true}  ", 15, 8, MDL_JSON_WHOLE | MDL_JSON_OBJECT, NULL, NULL, 0);
    assert_non_null(v);
    assert_true(cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(v, "k")));
    cJSON_Delete(v);
    /* without MDL_JSON_OBJECT a scalar or an array is a value */
    v = parse("42", 2, 8, MDL_JSON_WHOLE, &r, err, sizeof err);
    assert_non_null(v);
    assert_true(cJSON_IsNumber(v));
    assert_int_equal(r.end, 2);
    cJSON_Delete(v);
}

static void test_parse_deep(void **st)
{
    (void)st;
    mdl_json_result r;
    char err[160];
    /* 900 nested arrays (what crashed a civetweb worker) inside an object: refused before cJSON */
    char *arr = nested(900, '[', ']');
    size_t n = strlen(arr) + 32;
    char *s = malloc(n);
    assert_non_null(s);
    int w = snprintf(s, n, "{\"weight_map\": %s}", arr);
    free(arr);
    assert_null(parse(s, (size_t)w, MDL_JSON_MAX_DEPTH, 0, &r, err, sizeof err));
    assert_int_equal(r.status, MDL_JSON_E_DEEP);
    /* the object is level 1, "{\"weight_map\": " is 15 bytes: the array opener of level 129 is at
     * 15 + 127 */
    assert_int_equal(r.at, 15 + MDL_JSON_MAX_DEPTH - 1);
    assert_int_equal(r.scan.deep_at, r.at);
    assert_int_equal(r.scan.depth, 901);
    assert_string_equal(err, "JSON nests deeper than 128 levels (at byte 142)");
    free(s);
    /* exactly MDL_JSON_MAX_DEPTH levels: accepted (and cJSON parses it); one more: refused */
    s = nested(MDL_JSON_MAX_DEPTH, '[', ']');
    cJSON *v = parse(s, strlen(s), MDL_JSON_MAX_DEPTH, MDL_JSON_WHOLE, &r, err, sizeof err);
    assert_non_null(v);
    assert_int_equal(r.status, MDL_JSON_OK);
    assert_int_equal(r.scan.depth, MDL_JSON_MAX_DEPTH);
    assert_int_equal(r.end, 2 * MDL_JSON_MAX_DEPTH);
    cJSON_Delete(v);
    free(s);
    s = nested(MDL_JSON_MAX_DEPTH + 1, '[', ']');
    assert_null(parse(s, strlen(s), MDL_JSON_MAX_DEPTH, MDL_JSON_WHOLE, &r, err, sizeof err));
    assert_int_equal(r.status, MDL_JSON_E_DEEP);
    assert_int_equal(r.at, MDL_JSON_MAX_DEPTH); /* the opener at offset 128 is level 129 */
    free(s);
    /* mixed objects and arrays count alike; a small max_depth */
    assert_null(parse("{\"a\":{\"b\":[{}]}}", 16, 3, 0, &r, err, sizeof err));
    assert_int_equal(r.status, MDL_JSON_E_DEEP);
    assert_int_equal(r.at, 11); /* the innermost {, level 4 */
    v = parse("{\"a\":{\"b\":[]}}", 14, 3, 0, &r, err, sizeof err);
    assert_non_null(v);
    cJSON_Delete(v);
    /* depth is judged before NUL when both are present */
    char both[] = "[[[\"a\\u0000\"]]]";
    assert_null(parse(both, strlen(both), 2, MDL_JSON_REFUSE_NUL, &r, err, sizeof err));
    assert_int_equal(r.status, MDL_JSON_E_DEEP);
    assert_int_equal(r.at, 2);
    assert_int_equal(r.scan.nul, 1);
}

static void test_parse_depth_in_strings(void **st)
{
    (void)st;
    mdl_json_result r;
    char err[160];
    /* 2000 brackets inside a string value are text: depth 1, parsed, the string kept whole */
    size_t nb = 2000;
    char *s = malloc(nb + 16);
    assert_non_null(s);
    memcpy(s, "{\"p\":\"", 6);
    for (size_t i = 0; i < nb; i++) s[6 + i] = i % 2 ? '{' : '[';
    memcpy(s + 6 + nb, "\"}", 3);
    cJSON *v = parse(s, strlen(s), 1, MDL_JSON_WHOLE | MDL_JSON_OBJECT | MDL_JSON_REFUSE_NUL, &r, err, sizeof err);
    assert_non_null(v);
    assert_int_equal(r.scan.depth, 1);
    assert_int_equal(strlen(cJSON_GetObjectItemCaseSensitive(v, "p")->valuestring), nb);
    cJSON_Delete(v);
    free(s);
    /* an escaped quote does not end the string: the brackets after it stay text */
    const char *q = "[\"a\\\"[[[[[[\"]";
    v = parse(q, strlen(q), 1, MDL_JSON_WHOLE, &r, err, sizeof err);
    assert_non_null(v);
    assert_string_equal(cJSON_GetArrayItem(v, 0)->valuestring, "a\"[[[[[[");
    cJSON_Delete(v);
    /* an escaped backslash does end it: the brackets after it count */
    const char *b = "[\"a\\\\\",[[]]]";
    assert_null(parse(b, strlen(b), 2, 0, &r, err, sizeof err));
    assert_int_equal(r.status, MDL_JSON_E_DEEP);
    v = parse(b, strlen(b), 3, MDL_JSON_WHOLE, &r, err, sizeof err);
    assert_non_null(v);
    assert_string_equal(cJSON_GetArrayItem(v, 0)->valuestring, "a\\");
    cJSON_Delete(v);
}

static void test_parse_nul(void **st)
{
    (void)st;
    mdl_json_result r;
    char err[160];
    /* a \u0000 escape: refused with REFUSE_NUL (at: the backslash) */
    const char *esc = "{\"p\":\"ab\\u0000cd\"}";
    assert_null(parse(esc, strlen(esc), 8, MDL_JSON_REFUSE_NUL, &r, err, sizeof err));
    assert_int_equal(r.status, MDL_JSON_E_NUL);
    assert_int_equal(r.at, 8);
    assert_int_equal(r.scan.nul, 1);
    assert_non_null(strstr(err, "NUL"));
    assert_non_null(strstr(err, "byte 8"));
    /* without the flag: reported in scan, parsed (cJSON's C string stops at the NUL) */
    cJSON *v = parse(esc, strlen(esc), 8, 0, &r, err, sizeof err);
    assert_non_null(v);
    assert_int_equal(r.status, MDL_JSON_OK);
    assert_int_equal(r.scan.nul, 1);
    assert_int_equal(r.scan.nul_at, 8);
    assert_string_equal(cJSON_GetObjectItemCaseSensitive(v, "p")->valuestring, "ab");
    cJSON_Delete(v);
    /* a raw NUL byte inside a string */
    const char raw[] = "{\"p\":\"ab\0cd\"}";
    assert_null(parse(raw, sizeof raw - 1, 8, MDL_JSON_REFUSE_NUL, &r, err, sizeof err));
    assert_int_equal(r.status, MDL_JSON_E_NUL);
    assert_int_equal(r.at, 8);
    /* a raw NUL after the value (trailing garbage cJSON_Parse would take for the end): refused */
    const char tail[] = "{\"p\":1}\0{\"q\":2}";
    assert_null(parse(tail, sizeof tail - 1, 8, MDL_JSON_REFUSE_NUL, &r, err, sizeof err));
    assert_int_equal(r.status, MDL_JSON_E_NUL);
    assert_int_equal(r.at, 7);
    /* ... and without REFUSE_NUL, MDL_JSON_WHOLE still refuses it as trailing data */
    assert_null(parse(tail, sizeof tail - 1, 8, MDL_JSON_WHOLE, &r, err, sizeof err));
    assert_int_equal(r.status, MDL_JSON_E_TRAILING);
    assert_int_equal(r.at, 7);
    /* an escaped backslash before u0000 is text, not a NUL */
    const char *txt = "{\"p\":\"a\\\\u0000\"}";
    v = parse(txt, strlen(txt), 8, MDL_JSON_REFUSE_NUL | MDL_JSON_WHOLE, &r, err, sizeof err);
    assert_non_null(v);
    assert_string_equal(cJSON_GetObjectItemCaseSensitive(v, "p")->valuestring, "a\\u0000");
    cJSON_Delete(v);
}

static void test_parse_syntax(void **st)
{
    (void)st;
    mdl_json_result r;
    char err[160];
    assert_null(parse("{\"a\":}", 6, 8, 0, &r, err, sizeof err));
    assert_int_equal(r.status, MDL_JSON_E_SYNTAX);
    assert_true(r.at <= 6);
    assert_non_null(strstr(err, "not valid JSON"));
    assert_non_null(strstr(err, "of 6"));
    assert_null(parse("[1,2", 4, 8, 0, &r, err, sizeof err)); /* truncated */
    assert_int_equal(r.status, MDL_JSON_E_SYNTAX);
    assert_null(parse("", 0, 8, 0, &r, err, sizeof err)); /* empty */
    assert_int_equal(r.status, MDL_JSON_E_SYNTAX);
    assert_null(parse(NULL, 0, 8, 0, &r, err, sizeof err)); /* NULL with len 0 */
    assert_int_equal(r.status, MDL_JSON_E_SYNTAX);
    assert_null(parse("   ", 3, 8, 0, &r, err, sizeof err)); /* only whitespace */
    assert_int_equal(r.status, MDL_JSON_E_SYNTAX);
    /* the text past len is not seen: "[1]" cut to "[1" is a syntax error */
    assert_null(parse("[1]", 2, 8, 0, &r, err, sizeof err));
    assert_int_equal(r.status, MDL_JSON_E_SYNTAX);
}

static void test_parse_object_and_trailing(void **st)
{
    (void)st;
    mdl_json_result r;
    char err[160];
    /* MDL_JSON_OBJECT: an array, a string, a number are refused */
    const char *notobj[] = {"[1]", "\"s\"", "3", "null"};
    for (size_t i = 0; i < sizeof notobj / sizeof *notobj; i++) {
        assert_null(parse(notobj[i], strlen(notobj[i]), 8, MDL_JSON_OBJECT, &r, err, sizeof err));
        assert_int_equal(r.status, MDL_JSON_E_NOT_OBJECT);
        assert_string_equal(err, "not a JSON object");
    }
    /* not-an-object is checked before trailing data */
    assert_null(parse("[1] x", 5, 8, MDL_JSON_OBJECT | MDL_JSON_WHOLE, &r, err, sizeof err));
    assert_int_equal(r.status, MDL_JSON_E_NOT_OBJECT);
    /* MDL_JSON_WHOLE: JSON whitespace after the value is allowed ... */
    const char *ws = "{\"a\":1} \t\r\n ";
    cJSON *v = parse(ws, strlen(ws), 8, MDL_JSON_OBJECT | MDL_JSON_WHOLE, &r, err, sizeof err);
    assert_non_null(v);
    assert_int_equal(r.end, 7);
    cJSON_Delete(v);
    /* ... anything else is refused, at its first byte */
    const char *tr = "{\"a\":1}  {\"b\":2}";
    assert_null(parse(tr, strlen(tr), 8, MDL_JSON_OBJECT | MDL_JSON_WHOLE, &r, err, sizeof err));
    assert_int_equal(r.status, MDL_JSON_E_TRAILING);
    assert_int_equal(r.at, 9);
    assert_string_equal(err, "data after the JSON value (at byte 9)");
    /* a form feed or vertical tab is not JSON whitespace (cJSON's own check takes any byte <= 32) */
    assert_null(parse("{}\f", 3, 8, MDL_JSON_WHOLE, &r, err, sizeof err));
    assert_int_equal(r.status, MDL_JSON_E_TRAILING);
    assert_int_equal(r.at, 2);
    assert_null(parse("{}\v", 3, 8, MDL_JSON_WHOLE, &r, err, sizeof err));
    assert_int_equal(r.status, MDL_JSON_E_TRAILING);
    /* without MDL_JSON_WHOLE the rest is ignored, as cJSON_Parse does; end says where the value stopped */
    v = parse(tr, strlen(tr), 8, MDL_JSON_OBJECT, &r, err, sizeof err);
    assert_non_null(v);
    assert_int_equal(r.status, MDL_JSON_OK);
    assert_int_equal(r.end, 7);
    assert_null(cJSON_GetObjectItemCaseSensitive(v, "b"));
    cJSON_Delete(v);
}

/* a header "{"__metadata__": [[[...]]]}" nested n deep, as a safetensors file */
static uint8_t *deep_header_file(int n, size_t *len)
{
    char *arr = nested(n, '[', ']');
    size_t hl = strlen(arr) + 20;
    uint8_t *buf = calloc(1, 8 + hl + 8);
    assert_non_null(buf);
    int w = snprintf((char *)buf + 8, hl + 1, "{\"__metadata__\":%s}", arr);
    free(arr);
    size_t h = (size_t)w;
    while (h % 8) buf[8 + h++] = ' ';
    for (int i = 0; i < 8; i++) buf[i] = (uint8_t)(h >> (8 * i));
    *len = 8 + h;
    return buf;
}

typedef struct {
    const uint8_t *buf;
    size_t len;
    int rc;
    char err[512];
} parse_job;

static void *parse_thread(void *arg)
{
    parse_job *j = arg;
    mdl_st_file f;
    j->rc = mdl_st_parse(j->buf, j->len, "bucket 1", &f, j->err, sizeof j->err);
    if (j->rc == 0) mdl_st_close(&f);
    return NULL;
}

static void test_deep_safetensors_small_stack(void **st)
{
    (void)st;
    size_t len;
    uint8_t *buf = deep_header_file(5000, &len);
    parse_job j = {buf, len, 0, ""};
    pthread_attr_t a;
    pthread_attr_init(&a);
    /* smaller than civetweb's workers (~100 KiB). Without the guard cJSON recursed ~1000 levels here and crashed */
    assert_int_equal(pthread_attr_setstacksize(&a, 64 * 1024), 0);
    pthread_t t;
    assert_int_equal(pthread_create(&t, &a, parse_thread, &j), 0);
    pthread_join(t, NULL);
    pthread_attr_destroy(&a);
    assert_int_equal(j.rc, -1);
    assert_non_null(strstr(j.err, "bucket 1"));
    assert_non_null(strstr(j.err, "more than 16 deep"));
    free(buf);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_depth),
        cmocka_unit_test(test_strings),
        cmocka_unit_test(test_parse_ok),
        cmocka_unit_test(test_parse_deep),
        cmocka_unit_test(test_parse_depth_in_strings),
        cmocka_unit_test(test_parse_nul),
        cmocka_unit_test(test_parse_syntax),
        cmocka_unit_test(test_parse_object_and_trailing),
        cmocka_unit_test(test_deep_safetensors_small_stack),
    };
    return cmocka_run_group_tests_name("json_guard", tests, NULL, NULL);
}
