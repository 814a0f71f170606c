// sock.c: the TCP helpers of sock.h (see there for where they sit). Every wait has a deadline
// (now_seconds(), monotonic); nothing here dies on a peer's behaviour, only on a failing system call
// that no peer can cause.
#define _GNU_SOURCE
#include "sock.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "common.h"

void die_if_out_of_files(int err, const char *what) {
    if (err == ENFILE) die("%s: %s (the system's table of open files is full: raise fs.file-max)", what, strerror(err));
    if (err != EMFILE) return;
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0) die("%s: %s", what, strerror(err));
    die("%s: %s (this process may have %llu open at once, its hard limit %llu; rank 0's store takes one per rank "
        "and a rank one per TCP peer: raise `ulimit -n`)", what, strerror(err), (unsigned long long)rl.rlim_cur,
        (unsigned long long)rl.rlim_max);
}

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
    if (fd < 0) die_if_out_of_files(errno, "socket"), die("socket: %s", strerror(errno));
    int one = 1;
    if (setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) != 0) die("setsockopt: %s", strerror(errno));
    struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_ANY), .sin_port = htons((uint16_t)*port) };
    if (bind(fd, (struct sockaddr *)&a, sizeof a) != 0) {
        int e = errno;
        close(fd);
        errno = e;
        return -1;
    }
    // rank 0's store takes a connection from every rank at once: a backlog as long as the kernel allows
    // (it caps this at net.core.somaxconn, 4096 by default), so that a large job's joins are not reset
    if (listen(fd, 65535) != 0) die("listen: %s", strerror(errno));
    socklen_t len = sizeof a;
    if (getsockname(fd, (struct sockaddr *)&a, &len) != 0) die("getsockname: %s", strerror(errno));
    *port = ntohs(a.sin_port);
    return fd;
}

int tcp_connect(const char *host, int port, double deadline_s, int refused_is_final, char *why, size_t cap) {
    char portstr[16];
    snprintf(portstr, sizeof portstr, "%d", port);
    for (;;) {
        struct addrinfo hints = { .ai_family = AF_INET, .ai_socktype = SOCK_STREAM }, *res = NULL;
        int rc = getaddrinfo(host, portstr, &hints, &res), e = 0;
        if (rc == 0) {
            int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
            if (fd < 0) die_if_out_of_files(errno, "socket"), die("socket: %s", strerror(errno));
            if (connect(fd, res->ai_addr, res->ai_addrlen) == 0) {
                freeaddrinfo(res);
                tcp_set_options(fd);
                return fd;
            }
            e = errno;
            close(fd);
            freeaddrinfo(res);
            if (refused_is_final && e == ECONNREFUSED) return errno = e, -1;
        }
        if (now_seconds() > deadline_s) { // the last attempt's failure: a name that never resolved, or the connect's
            if (why && rc) snprintf(why, cap, "%s does not resolve (%s)", host, gai_strerror(rc));
            else if (why) snprintf(why, cap, "%s", strerror(e));
            return -1;
        }
        // the listener is not up yet, or the name not yet known (a cluster's DNS may lag its hosts): retry
        struct timespec ts = { 0, 20 * 1000000L };
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
