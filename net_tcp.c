// net_tcp.c: the TCP transport between ranks of different nodes (one connection per pair; the lower
// world rank connects to the other's data port and presents the job token), and the socket helpers
// the bootstrap uses. Messages are bytes in order; a reducing receive reads into a bounce buffer and
// reduces from there. Device memory (devmem.h) is staged through pinned host buffers (NetStaging, here
// for the verbs transport too).
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "common.h"
#include "devmem.h"
#include "net.h"

void tcp_set_options(int fd) {
    int one = 1, buf = 4 << 20;
    if (setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one) != 0)
        die("setsockopt TCP_NODELAY: %s", strerror(errno));
    // larger kernel buffers let big writes stream; the kernel may clamp them, which is fine
    (void)setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &buf, sizeof buf);
    (void)setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &buf, sizeof buf);
}

int tcp_listen_any(int *port) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) die("socket: %s", strerror(errno));
    int one = 1;
    if (setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) != 0) die("setsockopt: %s", strerror(errno));
    struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_ANY), .sin_port = htons((uint16_t)*port) };
    if (bind(fd, (struct sockaddr *)&a, sizeof a) != 0) {
        int e = errno;
        close(fd);
        errno = e;
        return -1;
    }
    if (listen(fd, 256) != 0) die("listen: %s", strerror(errno));
    socklen_t len = sizeof a;
    if (getsockname(fd, (struct sockaddr *)&a, &len) != 0) die("getsockname: %s", strerror(errno));
    *port = ntohs(a.sin_port);
    return fd;
}

int tcp_connect(const char *host, int port, double deadline_s) {
    char portstr[16];
    snprintf(portstr, sizeof portstr, "%d", port);
    for (;;) {
        struct addrinfo hints = { .ai_family = AF_INET, .ai_socktype = SOCK_STREAM }, *res = NULL;
        int rc = getaddrinfo(host, portstr, &hints, &res);
        if (rc == 0) {
            int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
            if (fd < 0) die("socket: %s", strerror(errno));
            if (connect(fd, res->ai_addr, res->ai_addrlen) == 0) {
                freeaddrinfo(res);
                tcp_set_options(fd);
                return fd;
            }
            close(fd);
            freeaddrinfo(res);
        }
        if (now_seconds() > deadline_s) return -1;
        struct timespec ts = { 0, 20 * 1000000L }; // the listener is not up yet: retry shortly
        nanosleep(&ts, NULL);
    }
}

static int wait_fd(int fd, short events, double deadline_s) {
    for (;;) {
        double left = deadline_s - now_seconds();
        if (left <= 0) return -1;
        struct pollfd p = { .fd = fd, .events = events };
        int rc = poll(&p, 1, (int)(left * 1000) + 1);
        if (rc > 0) return 0;
        if (rc < 0 && errno != EINTR) return -1;
    }
}

int tcp_write_all(int fd, const void *buf, size_t n, double deadline_s) {
    const char *p = buf;
    while (n > 0) {
        ssize_t w = send(fd, p, n, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (w > 0) {
            p += w;
            n -= (size_t)w;
        } else if (w < 0 && (errno == EAGAIN || errno == EINTR)) {
            if (wait_fd(fd, POLLOUT, deadline_s) != 0) return -1;
        } else {
            return -1;
        }
    }
    return 0;
}

int tcp_read_all(int fd, void *buf, size_t n, double deadline_s) {
    char *p = buf;
    while (n > 0) {
        ssize_t r = recv(fd, p, n, MSG_DONTWAIT);
        if (r > 0) {
            p += r;
            n -= (size_t)r;
        } else if (r < 0 && (errno == EAGAIN || errno == EINTR)) {
            if (wait_fd(fd, POLLIN, deadline_s) != 0) return TCP_TIMEOUT;
        } else {
            return TCP_CLOSED;
        }
    }
    return 0;
}

void tcp_local_ip(int fd, char *out, size_t cap) {
    struct sockaddr_in a;
    socklen_t len = sizeof a;
    if (getsockname(fd, (struct sockaddr *)&a, &len) != 0) die("getsockname: %s", strerror(errno));
    if (!inet_ntop(AF_INET, &a.sin_addr, out, (socklen_t)cap)) die("inet_ntop: %s", strerror(errno));
}


// ---------------------------------------------------------------------------------------------
// device memory through a byte stream (net.h NetStaging; TCP and verbs)

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
    if (q->tstate == 0) { // the device's bytes, whole, before the first leaves
        q->dev->copy(from, q->buf, q->bytes);
        q->dev->sync();
        q->tstate = 1;
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

// ---------------------------------------------------------------------------------------------
// the transport

#define BOUNCE_BYTES (256u << 10)

typedef struct {
    NetConn base;
    int fd;
    unsigned char *bounce; // reducing receives
    size_t held;           // bytes of a partial element kept at the start of the bounce buffer
    NetStaging stage;      // device memory's way through this connection
} TcpConn;

static const char *opname(const NetConn *c) { return c->opname && *c->opname ? *c->opname : "setup"; }

static void tcp_progress(NetConn *c, int *moved) {
    TcpConn *tc = (TcpConn *)c;
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
    if (ev && w->nfd < NET_MAX_POLL) {
        w->fd[w->nfd] = tc->fd;
        w->events[w->nfd++] = ev;
    }
}

static const char *tcp_peer_state(NetConn *c, char *buf, size_t cap) {
    (void)c, (void)buf, (void)cap;
    return NULL; // a dead peer shows as a closed connection; a silent one only as a timeout
}

static void tcp_close(NetConn *c) {
    TcpConn *tc = (TcpConn *)c;
    close(tc->fd);
    free(tc->bounce);
    net_staging_free(&tc->stage);
    free(tc);
}

static const NetOps TCP_OPS = { "tcp", tcp_progress, tcp_wait_hint, tcp_peer_state, tcp_close, NULL, NULL };

void tcp_setup(const NetSetup *s, int npeers, const int *peers, NetConn **conns) {
    World *w = s->w;
    double deadline = now_seconds() + world_timeout(w);
    int me_w = s->world_ranks[s->rank];
    for (int i = 0; i < npeers; i++) {
        int pw = s->world_ranks[peers[i]];
        const RankInfo *pi = world_rank_info(w, pw);
        int fd;
        if (me_w < pw) {
            fd = tcp_connect(pi->ip, pi->port, deadline);
            if (fd < 0)
                die("timeout: communicator %s: cannot connect to rank %d at %s:%d within %.1f s", s->comm_name, pw, pi->ip,
                    pi->port, world_timeout(w));
            ConnectHello hello = { .magic = NET_MAGIC, .comm_id = s->comm_id, .src = me_w };
            snprintf(hello.token, sizeof hello.token, "%s", world_token(w));
            if (tcp_write_all(fd, &hello, sizeof hello, deadline) != 0) die("communicator %s: cannot greet rank %d", s->comm_name, pw);
        } else {
            fd = world_take_connection(w, s->comm_id, pw, deadline);
            if (fd < 0) die("timeout: communicator %s: rank %d did not connect within %.1f s", s->comm_name, pw, world_timeout(w));
        }
        TcpConn *tc = xcalloc(1, sizeof *tc);
        net_conn_init(&tc->base, &TCP_OPS);
        tc->base.peer_pid = pi->pid;
        tc->fd = fd;
        conns[i] = &tc->base;
    }
}
