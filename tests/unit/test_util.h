/* tests/unit/test_util.h — small shared helpers for the cmocka unit tests. */
#ifndef GS_TEST_UTIL_H
#define GS_TEST_UTIL_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

/* A fresh scratch folder under $GS_TEST_TMP (or /tmp) named after the test. */
static inline const char *test_tmpdir(const char *name)
{
    static char path[1024];
    const char *base = getenv("GS_TEST_TMP");
    if (!base) base = "/tmp/graphswap-test";
    mkdir(base, 0755);
    snprintf(path, sizeof path, "%s/%s-%d", base, name, (int)getpid());
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", path);
    if (system(cmd) != 0) return NULL;
    mkdir(path, 0755);
    return path;
}

/* Runs fn(arg) in a child process with stderr captured; returns the child's wait status and the
 * first bytes of what it printed on stderr (for "this must abort with message X" tests). */
static inline int test_run_child(void (*fn)(void *), void *arg, char *err_out, size_t cap)
{
    int fds[2];
    if (pipe(fds) != 0) return -1;
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid == 0) {
        close(fds[0]);
        dup2(fds[1], 2);
        fn(arg);
        _exit(0);
    }
    close(fds[1]);
    size_t n = 0;
    ssize_t r;
    while (n + 1 < cap && (r = read(fds[0], err_out + n, cap - 1 - n)) > 0) n += (size_t)r;
    err_out[n] = 0;
    char sink[256];
    while (read(fds[0], sink, sizeof sink) > 0) {
    }
    close(fds[0]);
    int st = 0;
    waitpid(pid, &st, 0);
    return st;
}

#endif
