// net_verbs.h: RDMA verbs between two ranks on different nodes (InfiniBand or RoCE), as a reliable,
// ordered, non-blocking byte stream in each direction: the same contract as the shared-memory and TCP
// channels, so a transport table can wrap it without knowing how the bytes move.
//
// libibverbs is opened with dlopen at run time: ./train never links it, and on a machine without
// rdma-core verbs_open() fails with a one-line reason instead of the binary failing to start.
//
// Use, per process (one VerbsDev) and per peer (one VerbsEp):
//   VerbsDev *d = verbs_open(&opt, err, sizeof err);         // device, port, GID, MTU chosen here
//   VerbsEp *e = verbs_ep_create(d, 0, 0, "rank 3 at node7", err, sizeof err);
//   verbs_ep_blob(e, mine);                 // VERBS_BLOB_BYTES opaque bytes: QP number, PSN, LID,
//   ...exchange blobs through the bootstrap store...   // GID, MTU, receive-buffer address and rkey
//   verbs_ep_connect(e, theirs);            // INIT -> RTR -> RTS
//   ...barrier through the bootstrap store...  // each side must be in RTR before the other sends
//   verbs_send(e, buf, n) / verbs_recv(e, buf, n)   // move what they can now, return the byte count
//   verbs_ep_wait(e, ms)                    // sleep until a completion arrives (the wait hint)
//   verbs_ep_finish(e)                      // no more sends: the peer sees the end after the last byte
//   ...until verbs_ep_finished(e)...        // both ends finished and the end acknowledged
//   verbs_ep_destroy(e, err, cap); verbs_close(d, err, cap);
//
// Every function that can fail returns NULL or -1 and leaves one line (no "error: " prefix) in the
// caller's buffer (verbs_open, verbs_ep_create) or in verbs_ep_error(e); the caller adds its context
// (communicator, operation) and decides whether to die. An endpoint that has failed stays failed.
// An endpoint is not thread-safe: one thread at a time (the communicator's progress thread) calls it.
#ifndef LLM4D_NET_VERBS_H
#define LLM4D_NET_VERBS_H

#include <stddef.h>
#include <stdio.h>
#include <sys/types.h>

typedef struct VerbsDev VerbsDev;
typedef struct VerbsEp VerbsEp;

typedef struct {
    const char *dev; // "mlx5_0" or "mlx5_0:1" (device[:port]); NULL or "": the first active port
    int gid_index;   // -1: automatic (RoCE v2 over IPv4, else routable RoCE v2 over IPv6)
} VerbsOptions;

enum { VERBS_BLOB_BYTES = 64 };
// Default staging: slots x slot bytes of registered host memory per direction per peer.
enum { VERBS_DEFAULT_SLOTS = 16, VERBS_DEFAULT_SLOT_BYTES = 256 << 10 };
// The transport's staging per communicator and rank, spread over the connections its algorithm holds
// (not over the communicator's size: a ring of any size holds two): 16 slots of 256 KiB per direction
// and connection for few connections, smaller slots (down to 16 KiB, whole pages) for many, so that
// registered memory stays bounded. `connections` is the communicator's figure for its algorithm
// (algorithms.h algo_connections: a function of the layout, the same on every member), so both ends
// agree. Here rather than in net_verbs.c so that ./train plan comm counts the same bytes on a build
// without libibverbs' headers.
enum { VERBS_STAGING_BUDGET = 128 << 20, VERBS_MIN_SLOT_BYTES = 16 << 10 };
static inline size_t verbs_staging_slot_bytes(int connections) {
    size_t per = (size_t)VERBS_STAGING_BUDGET / (2u * VERBS_DEFAULT_SLOTS * (size_t)(connections > 1 ? connections : 1));
    per = per / 4096 * 4096;
    return per > VERBS_DEFAULT_SLOT_BYTES ? VERBS_DEFAULT_SLOT_BYTES : per < VERBS_MIN_SLOT_BYTES ? VERBS_MIN_SLOT_BYTES : per;
}

VerbsDev *verbs_open(const VerbsOptions *opt, char *err, size_t errcap);
// "rxe0 port 1, RoCE v2 GID index 1 (::ffff:192.0.2.1), MTU 1024": for the start-up log line
const char *verbs_describe(const VerbsDev *d);
int verbs_close(VerbsDev *d, char *err, size_t errcap); // after every endpoint is destroyed

// slots, slot_bytes: 0 for the defaults; both ends must use the same values (connect checks).
// peer names the other end in error lines, e.g. "rank 3 at node7".
VerbsEp *verbs_ep_create(VerbsDev *d, unsigned slots, size_t slot_bytes, const char *peer, char *err,
                         size_t errcap);
void verbs_ep_blob(const VerbsEp *e, unsigned char blob[VERBS_BLOB_BYTES]);
int verbs_ep_connect(VerbsEp *e, const unsigned char peer_blob[VERBS_BLOB_BYTES]);
// Non-blocking: the bytes accepted into send slots (0 when the peer has returned no credit yet) or
// received, -1 on error. Bytes arrive in order, however the two sides cut them.
ssize_t verbs_send(VerbsEp *e, const void *buf, size_t n);
ssize_t verbs_recv(VerbsEp *e, void *buf, size_t n);
// Zero-copy receive: *p points at the next bytes where the adapter wrote them (at most one slot's
// worth; 0: none arrived yet, -1: error); verbs_recv_consume(e, k) releases the first k of them.
ssize_t verbs_recv_peek(VerbsEp *e, const void **p);
int verbs_recv_consume(VerbsEp *e, size_t k);
// Polls completions (arrivals, returned credits, finished writes): 1 if any, 0 if none, -1 on error.
int verbs_progress(VerbsEp *e);
// 1 when every byte handed to verbs_send has been written into the peer's memory and acknowledged.
int verbs_sent_all(const VerbsEp *e);
// Closing without a store or a timer: verbs_ep_finish tells the peer that nothing more comes (once
// every send is in the queue; 0 when posted, 1 when the send queue is full and it should be called
// again, -1 on error). verbs_ep_finished is 1 once the peer's end arrived and this end's was
// acknowledged: then neither side needs the other's queue pair any more and both may destroy theirs.
// It is also 1 when this end's acknowledgement failed after the peer's end arrived (the peer, having
// everything, may have torn down before its adapter acknowledged).
int verbs_ep_finish(VerbsEp *e);
int verbs_ep_finished(VerbsEp *e);
// Wait hint. Each endpoint has its own completion channel, so threads serving different endpoints
// never take each other's wake-ups. verbs_ep_wait(e, ms) sleeps until a completion arrives or ms
// pass (1: woken or progressed, 0: timed out, -1: error). To sleep on several endpoints (and other
// descriptors) at once: verbs_ep_arm each (1: completions arrived meanwhile, do not sleep; 0: armed),
// poll() their verbs_ep_fd for POLLIN, then verbs_ep_clear each that is readable.
int verbs_ep_wait(VerbsEp *e, int timeout_ms);
int verbs_ep_arm(VerbsEp *e);
int verbs_ep_fd(const VerbsEp *e);
int verbs_ep_clear(VerbsEp *e);
const char *verbs_ep_error(const VerbsEp *e);
int verbs_ep_destroy(VerbsEp *e, char *err, size_t errcap);

// One line per GID of the chosen port (index, GID, type from both the verbs query and sysfs): for
// `verbs_pair --list` and for checking that both ways of reading a GID's type agree. Returns the
// number of mismatching types (0 when they agree), -1 on error.
int verbs_print_gids(VerbsDev *d, FILE *out);

#endif
