// hostmem.c: registered host memory (see hostmem.h; memory layer, below the collectives' chain,
// which maps peers' segments through it). Segments are sparse memfd mappings that only
// grow in number; blocks are carved from them first-fit and merged with free neighbours when freed.
// The tables are process-wide, like malloc's heap, and guarded by one lock: the progress threads
// look buffers up while the main thread allocates.
#define _GNU_SOURCE
#include "hostmem.h"

#include <errno.h>
#include <immintrin.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common.h"

#define SEG_MIN (64u << 20) // smallest segment; untouched pages of a memfd cost nothing
#define MAX_SEGS 1024

typedef struct {
    char *base;
    size_t bytes;
    int fd;
    uint64_t id;
} Segment;

typedef struct { // a block of a segment, free or in use, kept sorted by address
    char *p;
    size_t bytes;
    int seg;
    int used;
} Block;

typedef struct {
    pid_t pid;
    uint64_t seg_id;
    const char *base;
    size_t bytes;
} PeerView;

static struct {
    pthread_mutex_t mu;
    Segment seg[MAX_SEGS];
    int nseg;
    uint64_t next_id;
    size_t total;
    Block *blk;
    size_t nblk, capblk;
    PeerView *view;
    size_t nview, capview;
    int no_memfd; // memfd_create failed once: plain memory from then on
} H = { .mu = PTHREAD_MUTEX_INITIALIZER, .next_id = 1 };

static void blk_insert(size_t at, Block b) {
    if (H.nblk == H.capblk) {
        H.capblk = H.capblk ? 2 * H.capblk : 64;
        Block *nb = realloc(H.blk, H.capblk * sizeof(Block));
        if (!nb) die("out of memory (hostmem block table)");
        H.blk = nb;
    }
    memmove(H.blk + at + 1, H.blk + at, (H.nblk - at) * sizeof(Block));
    H.blk[at] = b;
    H.nblk++;
}

static void blk_erase(size_t at) {
    memmove(H.blk + at, H.blk + at + 1, (H.nblk - at - 1) * sizeof(Block));
    H.nblk--;
}

// A new segment of at least `bytes`, as one free block; -1 when memfd is unavailable or memory is out.
static int add_segment(size_t bytes) {
    if (H.no_memfd || H.nseg == MAX_SEGS) return -1;
    size_t size = bytes > SEG_MIN ? bytes : SEG_MIN;
    if (size < H.total / 4) size = H.total / 4; // grow geometrically: few segments for a large model
    size = (size + (2u << 20) - 1) & ~(size_t)((2u << 20) - 1);
    int fd = memfd_create("llm4d", MFD_CLOEXEC);
    if (fd < 0) {
        H.no_memfd = 1;
        return -1;
    }
    if (ftruncate(fd, (off_t)size) != 0) {
        close(fd);
        return -1;
    }
    void *base = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (base == MAP_FAILED) {
        close(fd);
        return -1;
    }
    int s = H.nseg++;
    H.seg[s] = (Segment){ base, size, fd, H.next_id++ };
    H.total += size;
    size_t at = 0;
    while (at < H.nblk && H.blk[at].p < (char *)base) at++;
    blk_insert(at, (Block){ base, size, s, 0 });
    return s;
}

void *hostmem_alloc(size_t bytes) {
    size_t need = (bytes + 63) & ~(size_t)63;
    if (need == 0) need = 64;
    pthread_mutex_lock(&H.mu);
    for (int attempt = 0; attempt < 2; attempt++) {
        for (size_t i = 0; i < H.nblk; i++) {
            Block *b = &H.blk[i];
            if (b->used || b->bytes < need) continue;
            char *p = b->p;
            if (b->bytes > need) { // split: the tail stays free
                Block rest = { p + need, b->bytes - need, b->seg, 0 };
                b->bytes = need;
                blk_insert(i + 1, rest);
            }
            H.blk[i].used = 1;
            pthread_mutex_unlock(&H.mu);
            memset(p, 0, need);
            return p;
        }
        if (attempt == 0 && add_segment(need) < 0) break;
    }
    pthread_mutex_unlock(&H.mu);
    // no memfd here: ordinary memory, which the transports copy instead of mapping
    void *p = NULL;
    if (posix_memalign(&p, 64, need) != 0) return NULL;
    memset(p, 0, need);
    return p;
}

static long find_block(const void *p) { // index of the block starting at p, or -1
    size_t lo = 0, hi = H.nblk;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (H.blk[mid].p < (const char *)p) lo = mid + 1;
        else hi = mid;
    }
    return lo < H.nblk && H.blk[lo].p == (const char *)p ? (long)lo : -1;
}

void hostmem_free(void *p) {
    if (!p) return;
    pthread_mutex_lock(&H.mu);
    long i = find_block(p);
    if (i < 0 || !H.blk[i].used) {
        pthread_mutex_unlock(&H.mu);
        free(p); // came from the fallback allocator
        return;
    }
    H.blk[i].used = 0;
    // give the pages back (a later allocation zeroes what it reuses anyway)
    size_t pg = 4096, a = ((size_t)H.blk[i].p + pg - 1) & ~(pg - 1), e = ((size_t)H.blk[i].p + H.blk[i].bytes) & ~(pg - 1);
    if (e > a + (1u << 20)) {
        Segment *s = &H.seg[H.blk[i].seg];
        if (fallocate(s->fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, (off_t)(a - (size_t)s->base), (off_t)(e - a)) != 0)
            (void)0; // keeping the pages is harmless
    }
    if ((size_t)i + 1 < H.nblk && !H.blk[i + 1].used && H.blk[i + 1].seg == H.blk[i].seg) {
        H.blk[i].bytes += H.blk[i + 1].bytes;
        blk_erase((size_t)i + 1);
    }
    if (i > 0 && !H.blk[i - 1].used && H.blk[i - 1].seg == H.blk[i].seg) {
        H.blk[i - 1].bytes += H.blk[i].bytes;
        blk_erase((size_t)i);
    }
    pthread_mutex_unlock(&H.mu);
}

int hostmem_find(const void *p, size_t bytes, HostMemHandle *h) {
    const char *c = p;
    int found = 0;
    pthread_mutex_lock(&H.mu);
    for (int s = 0; s < H.nseg; s++) {
        const Segment *g = &H.seg[s];
        if (c >= g->base && c + bytes <= g->base + g->bytes) {
            *h = (HostMemHandle){ .seg_id = g->id, .seg_bytes = g->bytes, .offset = (uint64_t)(c - g->base), .fd = g->fd };
            found = 1;
            break;
        }
    }
    pthread_mutex_unlock(&H.mu);
    return found;
}

const void *hostmem_peer_view(pid_t pid, const HostMemHandle *h, char *why, size_t cap) {
    pthread_mutex_lock(&H.mu);
    for (size_t i = 0; i < H.nview; i++)
        if (H.view[i].pid == pid && H.view[i].seg_id == h->seg_id) {
            const char *base = H.view[i].base;
            pthread_mutex_unlock(&H.mu);
            return base + h->offset;
        }
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/fd/%d", (int)pid, (int)h->fd);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    struct stat st;
    const char *base = NULL;
    if (fd < 0) {
        snprintf(why, cap, "cannot open %s: %s", path, strerror(errno));
    } else if (fstat(fd, &st) != 0 || (uint64_t)st.st_size < h->seg_bytes) {
        snprintf(why, cap, "%s is not the segment announced (%llu bytes)", path, (unsigned long long)h->seg_bytes);
    } else {
        void *m = mmap(NULL, h->seg_bytes, PROT_READ, MAP_SHARED, fd, 0);
        if (m == MAP_FAILED) snprintf(why, cap, "cannot map %s: %s", path, strerror(errno));
        else base = m;
    }
    if (fd >= 0) close(fd);
    if (base) {
        if (H.nview == H.capview) {
            H.capview = H.capview ? 2 * H.capview : 16;
            PeerView *nv = realloc(H.view, H.capview * sizeof(PeerView));
            if (!nv) die("out of memory (hostmem peer table)");
            H.view = nv;
        }
        H.view[H.nview++] = (PeerView){ pid, h->seg_id, base, h->seg_bytes };
    }
    pthread_mutex_unlock(&H.mu);
    return base ? base + h->offset : NULL;
}

void hostmem_forget_peers(void) {
    pthread_mutex_lock(&H.mu);
    for (size_t i = 0; i < H.nview; i++) munmap((void *)H.view[i].base, H.view[i].bytes);
    free(H.view);
    H.view = NULL;
    H.nview = H.capview = 0;
    pthread_mutex_unlock(&H.mu);
}

void copy_streaming(void *dst, const void *src, size_t n) {
    char *d = dst;
    const char *s = src;
    size_t head = (64 - ((uintptr_t)d & 63)) & 63;
    if (n < 4096 || head > n) {
        memcpy(d, s, n);
        return;
    }
    memcpy(d, s, head); // up to the first 64-byte line of the destination
    d += head, s += head, n -= head;
#if defined(__AVX512F__)
    for (; n >= 64; d += 64, s += 64, n -= 64) _mm512_stream_si512((void *)d, _mm512_loadu_si512((const void *)s));
#elif defined(__AVX__)
    for (; n >= 32; d += 32, s += 32, n -= 32) _mm256_stream_si256((__m256i *)d, _mm256_loadu_si256((const __m256i *)s));
#else
    for (; n >= 16; d += 16, s += 16, n -= 16) _mm_stream_si128((__m128i *)d, _mm_loadu_si128((const __m128i *)s));
#endif
    memcpy(d, s, n);
    _mm_sfence(); // non-temporal stores are not ordered by the release that publishes them
}
