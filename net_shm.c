// net_shm.c: shared-memory channels between ranks of one node: lock-free single-producer rings and
// futex doorbells, so that a waiting rank spins briefly and then sleeps instead of burning a core.
#define _GNU_SOURCE
#include <errno.h>
#include <linux/futex.h>
#include <signal.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "common.h"
#include "net.h"

static void futex_wake_all(_Atomic uint32_t *addr) {
    syscall(SYS_futex, (uint32_t *)addr, FUTEX_WAKE, INT32_MAX, NULL, NULL, 0);
}

void doorbell_ring(Doorbell *bell) {
    // seq_cst on both sides: the ringer's (seq, waiters) and the waiter's (waiters, seq) must not pass
    atomic_fetch_add(&bell->seq, 1);
    if (atomic_load(&bell->waiters) > 0) futex_wake_all(&bell->seq);
}

void doorbell_wait(Doorbell *bell, uint32_t seen, int timeout_ms) {
    struct timespec ts = { timeout_ms / 1000, (long)(timeout_ms % 1000) * 1000000L };
    atomic_fetch_add(&bell->waiters, 1);
    if (atomic_load(&bell->seq) == seen)
        syscall(SYS_futex, (uint32_t *)&bell->seq, FUTEX_WAIT, seen, &ts, NULL, 0);
    atomic_fetch_sub(&bell->waiters, 1);
}

static size_t shm_send(Channel *ch, const unsigned char *buf, size_t n) {
    ShmRing *r = ch->tx;
    uint64_t head = atomic_load_explicit(&r->head, memory_order_relaxed);
    uint64_t tail = atomic_load_explicit(&r->tail, memory_order_acquire);
    size_t space = SHM_RING_BYTES - (size_t)(head - tail);
    size_t w = n < space ? n : space;
    if (w == 0) return 0;
    size_t at = (size_t)(head % SHM_RING_BYTES), first = SHM_RING_BYTES - at < w ? SHM_RING_BYTES - at : w;
    memcpy(r->data + at, buf, first);
    memcpy(r->data, buf + first, w - first);
    atomic_store_explicit(&r->head, head + w, memory_order_release);
    doorbell_ring(ch->peer_bell);
    return w;
}

static size_t shm_recv(Channel *ch, unsigned char *buf, size_t n) {
    ShmRing *r = ch->rx;
    uint64_t tail = atomic_load_explicit(&r->tail, memory_order_relaxed);
    uint64_t head = atomic_load_explicit(&r->head, memory_order_acquire);
    size_t avail = (size_t)(head - tail);
    size_t got = n < avail ? n : avail;
    if (got == 0) return 0;
    size_t at = (size_t)(tail % SHM_RING_BYTES), first = SHM_RING_BYTES - at < got ? SHM_RING_BYTES - at : got;
    memcpy(buf, r->data + at, first);
    memcpy(buf + first, r->data, got - first);
    atomic_store_explicit(&r->tail, tail + got, memory_order_release);
    doorbell_ring(ch->peer_bell);
    return got;
}

// TCP side lives in net_tcp.c; the dispatch is here so both kinds share one entry point.
size_t tcp_chan_send(Channel *ch, const void *buf, size_t n);
size_t tcp_chan_recv(Channel *ch, void *buf, size_t n);

size_t chan_send(Channel *ch, const void *buf, size_t n) {
    if (n == 0) return 0;
    return ch->kind == NET_SHM ? shm_send(ch, buf, n) : tcp_chan_send(ch, buf, n);
}

size_t chan_recv(Channel *ch, void *buf, size_t n) {
    if (n == 0) return 0;
    return ch->kind == NET_SHM ? shm_recv(ch, buf, n) : tcp_chan_recv(ch, buf, n);
}
