/* tests/unit/test_json_guard.c — models/format/json_guard.c: nesting depth outside strings, NUL (raw and
 * escaped) inside strings, escape handling; and that the safetensors parser refuses a deep header
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
        cmocka_unit_test(test_deep_safetensors_small_stack),
    };
    return cmocka_run_group_tests_name("json_guard", tests, NULL, NULL);
}
