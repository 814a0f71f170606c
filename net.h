// net.h: moving bytes between two ranks. A Channel is one rank's end of a bidirectional byte stream
// to one peer, over shared memory (same node) or TCP (across nodes). Both calls are non-blocking:
// they move what they can and return the byte count (0 when the ring or socket is full/empty), and
// they die with a one-line message when the peer is gone.
#ifndef LLM4D_NET_H
#define LLM4D_NET_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

enum { NET_SHM = 1, NET_TCP = 2 };

#define SHM_RING_BYTES (1u << 20)

// A rank's doorbell: peers bump seq whenever they give it data or space, and wake it when it sleeps.
typedef struct {
    _Atomic uint32_t seq;
    _Atomic uint32_t waiters;
    char pad[56];
} Doorbell;

// Single-producer single-consumer byte ring in shared memory.
typedef struct {
    _Atomic uint64_t head; // bytes written by the sender
    char pad0[56];
    _Atomic uint64_t tail; // bytes consumed by the receiver
    char pad1[56];
    unsigned char data[SHM_RING_BYTES];
} ShmRing;

typedef struct {
    int kind;
    int peer;       // rank in the communicator
    int peer_world; // world rank, for messages
    // NET_SHM
    ShmRing *tx, *rx;
    Doorbell *peer_bell;
    pid_t peer_pid;
    // NET_TCP
    int fd;
    const char *comm;          // communicator name and the operation running on it, for error lines
    const char *const *op;
} Channel;

size_t chan_send(Channel *ch, const void *buf, size_t n);
size_t chan_recv(Channel *ch, void *buf, size_t n);
void doorbell_ring(Doorbell *bell);
// Sleeps until the doorbell moves past seen or timeout_ms passes.
void doorbell_wait(Doorbell *bell, uint32_t seen, int timeout_ms);

// TCP helpers (net_tcp.c)
int tcp_listen_any(int *port);                           // listening socket on an ephemeral port
int tcp_connect(const char *host, int port, double deadline_s); // retries until the deadline; -1 on failure
void tcp_set_options(int fd);                           // TCP_NODELAY and large buffers
int tcp_write_all(int fd, const void *buf, size_t n, double deadline_s); // 0 on success
// 0 on success, TCP_TIMEOUT when the deadline passed, TCP_CLOSED when the peer closed or reset
enum { TCP_TIMEOUT = -1, TCP_CLOSED = -2 };
int tcp_read_all(int fd, void *buf, size_t n, double deadline_s);
void tcp_local_ip(int fd, char *out, size_t cap);

#endif
