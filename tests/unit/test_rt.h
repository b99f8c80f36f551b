/* tests/unit/test_rt.h — an engine on a backend with a target (and a drafter) loaded from disk, and
 * the checksums of its weights, for the cmocka tests of the engine, of weight updates and of the
 * CUDA backend (tests/gpu). Include after <cmocka.h>. */
#ifndef GS_TEST_RT_H
#define GS_TEST_RT_H

#include <stdio.h>

#include "engine/engine.h"
#include "engine/weights.h"
#include "models/model.h"

typedef struct {
    eng_backend *be;
    mdl_model *m, *d; /* d: NULL without a drafter */
    eng_engine *e;
} test_rt;

static inline mdl_model *test_rt_load(eng_backend *be, const char *dir)
{
    char err[512];
    mdl_config cfg;
    if (mdl_config_load(dir, &cfg, err, sizeof err) != 0) fail_msg("%s: %s", dir, err);
    mdl_model *m = mdl_model_create(&cfg, be, err, sizeof err);
    if (!m) fail_msg("%s: %s", dir, err);
    if (mdl_model_load_dir(m, dir, err, sizeof err) != 0) fail_msg("%s: %s", dir, err);
    return m;
}

/* Takes ownership of be; draft may be NULL. */
static inline void test_rt_open(test_rt *x, eng_backend *be, const char *target, const char *draft,
                                const eng_config *ec)
{
    char err[512];
    x->be = be;
    x->m = test_rt_load(be, target);
    x->d = draft ? test_rt_load(be, draft) : NULL;
    eng_config c = *ec;
    x->e = eng_create_spec(&c, x->m, x->d, be, err, sizeof err);
    if (!x->e) fail_msg("%s", err);
}

static inline void test_rt_close(test_rt *x)
{
    eng_destroy(x->e);
    mdl_model_destroy(x->d);
    mdl_model_destroy(x->m);
    eng_backend_destroy(x->be);
}

/* Checksums of the target's (draft = 0) or drafter's weights, derived buffers included, as one
 * string "name=hex;..." */
typedef struct {
    char buf[1 << 16];
    size_t n;
} test_sums;

static inline void test_sums_add(const char *name, const char *hex, void *u)
{
    test_sums *s = u;
    s->n += (size_t)snprintf(s->buf + s->n, sizeof s->buf - s->n, "%s=%s;", name, hex);
}

static inline void test_checksums(test_rt *x, int draft, test_sums *s)
{
    s->n = 0;
    s->buf[0] = 0;
    assert_int_equal(eng_weights_checksums(x->e, draft, test_sums_add, s), 0);
}

#endif
