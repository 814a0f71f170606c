// net.c: what the transports share (net.h): their table, losing a peer, and device memory through a
// byte-stream transport (NetStaging: TCP and verbs). Part of the transports' layer: above the bootstrap (which
// names the root cause of a lost peer), below the algorithms.
#define _GNU_SOURCE
#include <stdarg.h>
#include <stdio.h>

#include "bootstrap.h"
#include "common.h"
#include "devmem.h"
#include "net.h"

const NetTransport *const NET_TRANSPORTS[] = {
    &NET_SHM,
#ifdef LLM4D_VERBS
    &NET_VERBS,
#endif
    &NET_TCP,
    NULL,
};
_Static_assert(sizeof NET_TRANSPORTS / sizeof *NET_TRANSPORTS <= NET_MAX_TRANSPORTS + 1, "NET_MAX_TRANSPORTS is too small");

void net_peer_lost(const NetConn *c, const char *fmt, ...) {
    char line[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    if (!c->world) die("%s", line);
    world_set_failed(c->world);
    world_die_after(c->world, c->peer_world, "%s", line);
}

// ---------------------------------------------------------------------------------------------
// device memory through a byte stream (net.h NetStaging; TCP and verbs)

// A staged send's NetReq.tstate (net_post_send starts it at STAGE_EMPTY).
enum { STAGE_EMPTY = 0, STAGE_FILLED };

// A pinned staging buffer of at least `bytes`.
static void *stage_buf(NetStaging *s, const DevMem *dev, int tx, size_t bytes, const char *transport) {
    void **p = tx ? &s->tx : &s->rx;
    size_t *cap = tx ? &s->cap_tx : &s->cap_rx;
    if (*cap < bytes) {
        if (*p) s->dev->host_free(*p);
        s->dev = dev;
        if (!(*p = dev->host_alloc(bytes)))
            die("out of pinned host memory: %zu bytes to stage device memory for %s", bytes, transport);
        *cap = bytes;
    }
    return *p;
}

const void *net_stage_send(NetStaging *s, NetReq *q, const char *transport) {
    void *from = stage_buf(s, q->dev, 1, q->bytes, transport);
    if (q->tstate == STAGE_EMPTY) { // the device's bytes, whole, before the first leaves
        q->dev->copy(from, q->buf, q->bytes);
        q->dev->sync();
        q->tstate = STAGE_FILLED;
    }
    return from;
}

void *net_stage_recv(NetStaging *s, NetReq *q, const char *transport) { return stage_buf(s, q->dev, 0, q->bytes, transport); }

void net_stage_recv_done(NetStaging *s, NetReq *q) {
    if (!q->bytes) return; // nothing arrived: no staging buffer either
    if (q->reduce) net_reduce_bytes(q->reduce, q->buf, 0, s->rx, q->bytes);
    else q->dev->copy(q->buf, s->rx, q->bytes);
    q->dev->sync();
}

void net_staging_free(NetStaging *s) {
    if (s->tx) s->dev->host_free(s->tx);
    if (s->rx) s->dev->host_free(s->rx);
    *s = (NetStaging){ 0 };
}
