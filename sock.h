// sock.h: blocking-with-deadline TCP helpers (sock.c). The bottom of the communication chain
// (common -> sockets -> bootstrap -> transports -> algorithms -> collectives -> launch): the
// bootstrap's store and acceptor, the TCP transport's connections and the launcher's free-port probe
// use them; they know nothing of ranks or jobs.
#ifndef LLM4D_SOCK_H
#define LLM4D_SOCK_H

#include <stddef.h>

int tcp_listen_any(int *port);                                  // listening socket; *port 0 = any
// retries until the deadline; -1 on failure, the last attempt's reason in why (NULL: none wanted). With
// refused_is_final a refusal ends it at once (-1, errno ECONNREFUSED): for a port its owner published
// only once it listened, a refusal means the owner is gone.
int tcp_connect(const char *host, int port, double deadline_s, int refused_is_final, char *why, size_t cap);
void tcp_set_options(int fd);                                   // TCP_NODELAY and large buffers
int tcp_write_all(int fd, const void *buf, size_t n, double deadline_s); // 0 on success
// 0 on success, TCP_TIMEOUT when the deadline passed, TCP_CLOSED when the peer closed or reset
enum { TCP_TIMEOUT = -1, TCP_CLOSED = -2 };
int tcp_read_all(int fd, void *buf, size_t n, double deadline_s);
void tcp_local_ip(int fd, char *out, size_t cap);
// Where err (an errno) says this process or the system ran out of file descriptors: dies with what
// failed and the open-files limit to raise. Other errors return.
void die_if_out_of_files(int err, const char *what);

#endif
