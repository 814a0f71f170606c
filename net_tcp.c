// net_tcp.c: the TCP transport between ranks of different nodes (one connection per pair; the lower
// world rank connects to the other's data port and presents the job token; the bootstrap's acceptor
// authenticates the connections that arrive). A transport of net.h: it sits above the sockets
// (sock.h) and the bootstrap (bootstrap.h), below the algorithms. Messages are bytes in order; a
// reducing receive reads into a bounce buffer and reduces from there. Device memory (devmem.h) is
// staged through pinned host buffers (NetStaging, net.c).
#define _GNU_SOURCE
#include <errno.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "bootstrap.h"
#include "common.h"
#include "devmem.h"
#include "net.h"
#include "sock.h"

// ---------------------------------------------------------------------------------------------
// the transport

#define BOUNCE_BYTES (256u << 10)

typedef struct {
    NetConn base;
    int fd;                // -1 until the lower rank's connection has arrived (the higher end)
    World *w;              // for taking it
    uint64_t comm_id;
    int same_node;         // the peer's process can be looked at (peer_state while it has not connected)
    unsigned char *bounce; // reducing receives
    size_t held;           // bytes of a partial element kept at the start of the bounce buffer
    NetStaging stage;      // device memory's way through this connection
} TcpConn;

static const char *opname(const NetConn *c) { return c->opname && *c->opname ? *c->opname : "setup"; }

// The higher end: the lower rank's connection, once the acceptor has it. 1 when connected.
static int tcp_take(TcpConn *tc, int *moved) {
    if (tc->fd >= 0) return 1;
    tc->fd = world_take_connection(tc->w, tc->comm_id, tc->base.peer_world, 0); // a deadline passed: look once
    if (tc->fd < 0) return 0;
    *moved = 1;
    return 1;
}

static void tcp_progress(NetConn *c, int *moved) {
    TcpConn *tc = (TcpConn *)c;
    if (!tcp_take(tc, moved)) return;
    for (NetReq *q = c->sq; q; q = q->next) { // a byte stream: one request after the other
        const void *from = q->dev ? net_stage_send(&tc->stage, q, "TCP") : q->buf;
        while (q->done < q->bytes) {
            ssize_t w = send(tc->fd, (const char *)from + q->done, q->bytes - q->done, MSG_NOSIGNAL | MSG_DONTWAIT);
            if (w > 0) {
                q->done += (size_t)w;
                *moved = 1;
                continue;
            }
            if (w < 0 && (errno == EAGAIN || errno == EINTR)) break;
            net_peer_lost(c, "%s on communicator %s: connection to rank %d lost while sending: %s", opname(c), c->comm,
                          c->peer_world, w < 0 ? strerror(errno) : "no progress");
        }
        if (q->done < q->bytes) break;
        if (!q->complete) *moved = 1;
        q->complete = 1;
    }
    for (NetReq *q = c->rq; q; q = q->next) {
        while (q->done < q->bytes) {
            size_t left = q->bytes - q->done;
            void *dst = (char *)q->buf + q->done;
            if (q->dev) {
                dst = (char *)net_stage_recv(&tc->stage, q, "TCP") + q->done;
            } else if (q->reduce) {
                if (!tc->bounce) tc->bounce = xmalloc(BOUNCE_BYTES);
                dst = tc->bounce + tc->held;
                left = left - tc->held < BOUNCE_BYTES - tc->held ? left - tc->held : BOUNCE_BYTES - tc->held;
            }
            ssize_t r = recv(tc->fd, dst, left, MSG_DONTWAIT);
            if (r == 0) net_peer_lost(c, "%s on communicator %s: rank %d closed its connection (it exited or died)", opname(c), c->comm, c->peer_world);
            if (r < 0) {
                if (errno == EAGAIN || errno == EINTR) break;
                net_peer_lost(c, "%s on communicator %s: connection to rank %d lost while receiving: %s", opname(c), c->comm,
                              c->peer_world, strerror(errno));
            }
            *moved = 1;
            if (!q->reduce || q->dev) {
                q->done += (size_t)r;
                continue;
            }
            size_t have = tc->held + (size_t)r, es = q->reduce->in_size, whole = have / es * es;
            net_reduce_bytes(q->reduce, q->buf, q->done, tc->bounce, whole);
            q->done += whole;
            tc->held = have - whole;
            memmove(tc->bounce, tc->bounce + whole, tc->held);
        }
        if (q->done < q->bytes) break;
        if (q->dev) net_stage_recv_done(&tc->stage, q);
        q->complete = 1;
    }
    net_pop_done(c);
}

static void tcp_wait_hint(NetConn *c, NetWait *w) {
    TcpConn *tc = (TcpConn *)c;
    short ev = (c->rq ? POLLIN : 0) | (c->sq ? POLLOUT : 0);
    // (not connected yet: nothing to poll; the engine looks again after its doorbell's short sleep)
    if (ev && tc->fd >= 0 && w->nfd < NET_MAX_POLL) {
        w->fd[w->nfd] = tc->fd;
        w->events[w->nfd++] = ev;
    }
}

static const char *tcp_peer_state(NetConn *c, char *buf, size_t cap) {
    TcpConn *tc = (TcpConn *)c;
    // a dead peer shows as a closed connection, a silent one only as a timeout; before the peer has
    // connected, one on this node can be looked at
    if (tc->fd < 0 && tc->same_node) return process_state(c->peer_pid, buf, cap);
    return NULL;
}

static void tcp_close(NetConn *c) {
    TcpConn *tc = (TcpConn *)c;
    if (tc->fd >= 0) close(tc->fd);
    free(tc->bounce);
    net_staging_free(&tc->stage);
    free(tc);
}

static const NetOps TCP_OPS = { "tcp", tcp_progress, tcp_wait_hint, tcp_peer_state, tcp_close, NULL, NULL };

static int tcp_can_connect(const NetReach *r, int a, int b) { return (void)r, (void)a, (void)b, 1; } // any pair

static NetConn *tcp_connect_peer(void *endpoint, const NetSetup *s, int peer) {
    (void)endpoint;
    World *w = s->w;
    int me_w = s->world_ranks[s->rank], pw = s->world_ranks[peer];
    const RankInfo *pi = world_rank_info(w, pw);
    TcpConn *tc = xcalloc(1, sizeof *tc);
    net_conn_init(&tc->base, &TCP_OPS);
    tc->base.peer_pid = pi->pid;
    tc->base.peer_world = pw;
    tc->w = w;
    tc->comm_id = s->comm_id;
    tc->same_node = !strcmp(pi->node_id, world_rank_info(w, me_w)->node_id);
    tc->fd = -1;
    if (me_w < pw) { // the peer's acceptor answers whatever the peer is doing
        double deadline = now_seconds() + world_timeout(w);
        world_set_connecting(w, pw); // (a rank waiting on this one follows the chain to the peer)
        tc->fd = tcp_connect(pi->ip, pi->port, deadline, 1, NULL, 0); // the peer listened before it published its port
        if (tc->fd < 0 && errno == ECONNREFUSED) {
            char st[96];
            const char *state = tc->same_node ? process_state(pi->pid, st, sizeof st) : NULL;
            world_set_failed(w);
            if (state && !strcmp(state, "died"))
                world_die_after(w, pw, "communicator %s: rank %d (pid %d) died before it was connected", s->comm_name, pw, (int)pi->pid);
            world_die_after(w, pw, "communicator %s: rank %d at %s:%d refuses connections: it has exited, or that address does not reach it from here",
                            s->comm_name, pw, pi->ip, pi->port);
        }
        if (tc->fd < 0) {
            world_set_failed(w);
            world_die_after(w, pw, "timeout: communicator %s: cannot connect to rank %d at %s:%d within %.1f s", s->comm_name, pw,
                            pi->ip, pi->port, world_timeout(w));
        }
        world_set_connecting(w, -1);
        ConnectHello hello = { .magic = NET_MAGIC, .comm_id = s->comm_id, .src = me_w };
        snprintf(hello.token, sizeof hello.token, "%s", world_token(w));
        if (tcp_write_all(tc->fd, &hello, sizeof hello, deadline) != 0) die("communicator %s: cannot greet rank %d", s->comm_name, pw);
    } else {
        int moved = 0;
        tcp_take(tc, &moved);
    }
    return &tc->base;
}

const NetTransport NET_TCP = { "tcp", 0, tcp_can_connect, NULL, tcp_connect_peer, NULL }; // nothing to prepare
