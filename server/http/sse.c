/* server/http/sse.c — server-sent events over a civetweb connection, shared by every streaming route:
 * the 200 text/event-stream head, "data: <json>" events batched in a srv_buf, one HTTP chunk per
 * flush (HTTP/1.1 chunked; HTTP/1.0 raw until close), and a broken flag once a write fails. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server/http/http.h"

void srv_sse_event(srv_buf *b, cJSON *o)
{
    char *t = o ? cJSON_PrintUnformatted(o) : NULL;
    cJSON_Delete(o);
    if (!t) {
        b->oom = 1;
        return;
    }
    srv_buf_add(b, "data: ", 6);
    srv_buf_add(b, t, strlen(t));
    srv_buf_add(b, "\n\n", 2);
    free(t);
}

void srv_sse_flush(srv_sse *so, srv_buf *b)
{
    if (so->broken || b->n == 0) {
        b->n = 0;
        return;
    }
    if (b->oom) {
        so->broken = 1;
        return;
    }
    if (so->chunked) {
        char hdr[24];
        int hn = snprintf(hdr, sizeof hdr, "%zx\r\n", b->n);
        srv_buf f = {0};
        srv_buf_add(&f, hdr, (size_t)hn);
        srv_buf_add(&f, b->p, b->n);
        srv_buf_add(&f, "\r\n", 2);
        if (f.oom || mg_write(so->c, f.p, f.n) != (int)f.n) so->broken = 1;
        free(f.p);
    } else if (mg_write(so->c, b->p, b->n) != (int)b->n) {
        so->broken = 1;
    }
    b->n = 0;
}

void srv_sse_begin(srv_sse *so, struct mg_connection *c)
{
    const struct mg_request_info *ri = mg_get_request_info(c);
    so->c = c;
    so->chunked = strcmp(ri->http_version ? ri->http_version : "", "1.1") == 0;
    so->broken = 0;
    char head[256];
    int hn = snprintf(head, sizeof head,
                      "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n%s\r\n",
                      so->chunked ? "Transfer-Encoding: chunked\r\n" : "Connection: close\r\n");
    if (mg_write(c, head, (size_t)hn) != hn) so->broken = 1;
}

void srv_sse_end(srv_sse *so)
{
    if (so->chunked && !so->broken) mg_write(so->c, "0\r\n\r\n", 5);
}
