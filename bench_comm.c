// bench_comm.c: `./train bench-comm [--nproc N] ...`, a collective bandwidth and latency table in the
// manner of nccl-tests. For each size (doubling from --min-bytes to --max-bytes) every rank warms up,
// the ranks meet at a barrier, each times --iters operations, and rank 0 prints the slowest rank's mean.
// algbw = bytes / time; busbw = algbw·2(n−1)/n for all-reduce, algbw·(n−1)/n for reduce-scatter and
// all-gather (bytes = the whole input or gathered vector), busbw = algbw for broadcast. The check
// column compares one operation's output against a closed form: rank r contributes v(r) to every
// element, so a sum is Σ v(r), exact in the element type. --buffers device (CUDA builds) benchmarks
// device memory (CUDA IPC inside a node) and prints, as its comparator, the device-to-device copy
// bandwidth of the same device measured in the same run; --buffers standin uses the CPU stand-in of
// device memory (devmem.h), for testing the path without a GPU.
#define _GNU_SOURCE
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "collectives.h"
#include "launch.h"
#include "common.h"
#include "devmem.h"
#include "hostmem.h"
#include "kernels.h"

enum { BC_ALLREDUCE, BC_REDUCE_SCATTER, BC_ALL_GATHER, BC_BROADCAST };
static const char *const OP_FLAGS[] = { "allreduce", "reduce_scatter", "all_gather", "broadcast" };

static long long parse_num(const char *flag, const char *s, long long lo, long long hi, int size_suffix) {
    char *end;
    long long x = strtoll(s, &end, 10);
    if (end == s) die("%s: '%s' is not a number", flag, s);
    if (size_suffix && *end) { // K, M, G: binary multiples
        int shift = (*end == 'K' || *end == 'k') ? 10 : (*end == 'M' || *end == 'm') ? 20 : (*end == 'G' || *end == 'g') ? 30 : -1;
        if (shift < 0 || (end[1] && strcmp(end + 1, "iB") && strcmp(end + 1, "B"))) die("%s: '%s' is not a byte count", flag, s);
        if (x > hi >> shift) die("%s: %s is out of range [%lld, %lld]", flag, s, lo, hi);
        x <<= shift;
        end += strlen(end);
    }
    if (*end || x < lo || x > hi) die("%s: '%s' is not a whole number in [%lld, %lld]", flag, s, lo, hi);
    return x;
}

// v(r): rank r's contribution; small integers so that every partial sum is exact (bf16: up to 256)
static int contrib(int r, int n, CommType t) { return t == CT_BF16 && (long)n * (n + 1) / 2 > 256 ? 1 : r + 1; }
static void put(void *buf, size_t i, CommType t, float v) {
    if (t == CT_BF16) ((uint16_t *)buf)[i] = f32_to_bf16(v);
    else ((float *)buf)[i] = v;
}
static float get(const void *buf, size_t i, CommType t) {
    return t == CT_BF16 ? bf16_to_f32(((const uint16_t *)buf)[i]) : ((const float *)buf)[i];
}

static void run_op(Comm *c, int op, void *send, void *recv, size_t count, CommType t) {
    switch (op) {
    case BC_ALLREDUCE: comm_all_reduce(c, send, recv, count, t, OP_SUM); break;
    case BC_REDUCE_SCATTER: comm_reduce_scatter(c, send, recv, count, t, OP_SUM); break;
    case BC_ALL_GATHER: comm_all_gather(c, send, recv, count, t); break;
    default: comm_broadcast(c, recv, count, t, 0); break;
    }
}

// Fills the inputs for one checked operation (recv poisoned), runs it, returns 1 when the output is right.
// Device buffers are filled and read through host copies hsend and hrecv.
static int checked_run(Comm *c, int op, void *dsend, void *drecv, size_t count, CommType t, const DevMem *dev, void *hsend,
                       void *hrecv) {
    int n = comm_size(c), r = comm_rank(c);
    void *send = dev ? hsend : dsend, *recv = dev ? hrecv : drecv;
    size_t seg = (count + n - 1) / n, in_count = op == BC_ALL_GATHER ? seg : count;
    size_t out_count = op == BC_REDUCE_SCATTER ? seg : count;
    for (size_t i = 0; i < in_count; i++) put(send, i, t, (float)contrib(r, n, t));
    for (size_t i = 0; i < out_count; i++) put(recv, i, t, -1.0f);
    if (op == BC_BROADCAST && r == 0)
        for (size_t i = 0; i < count; i++) put(recv, i, t, (float)(i % 251));
    if (dev) {
        dev->copy(dsend, hsend, in_count * comm_type_size(t));
        dev->copy(drecv, hrecv, (op == BC_BROADCAST ? count : out_count) * comm_type_size(t));
        dev->sync();
    }
    run_op(c, op, dsend, drecv, count, t);
    if (dev) {
        dev->copy(hrecv, drecv, out_count * comm_type_size(t));
        dev->sync();
    }
    float sum = 0;
    for (int q = 0; q < n; q++) sum += (float)contrib(q, n, t);
    size_t lo = op == BC_REDUCE_SCATTER ? (size_t)r * seg : 0, hi = lo + out_count > count ? count : lo + out_count;
    for (size_t i = lo; i < hi; i++) {
        float want = op == BC_BROADCAST ? (float)(i % 251) : op == BC_ALL_GATHER ? (float)contrib((int)(i / seg), n, t) : sum;
        if (get(recv, i - lo, t) != want) return 0;
    }
    return 1;
}

typedef struct {
    int op, iters, warmup, registered, transport;
    long long min_bytes, max_bytes;
    CommType t;
    double timeout;
    const char *ib_dev;
    int ib_gid_index;
    int algo;
} BenchOptions;

static const char BENCH_USAGE[] =
    "usage: ./train bench-comm --nproc N [flags]   (or under torchrun-style variables or srun)\n"
    "  a collective's bandwidth and latency per message size, as nccl-tests prints, with a check column\n"
    "  --op allreduce|reduce_scatter|all_gather|broadcast   the collective (default allreduce)\n"
    "  --min-bytes N --max-bytes N   the sizes, doubling (default 8 to 64M; K, M, G = 2^10, 2^20, 2^30)\n"
    "  --iters N                  timed operations per size (default: enough for a stable mean)\n"
    "  --warmup N                 untimed operations first (default 5)\n"
    "  --dtype fp32|bf16          the element type (default fp32)\n"
    "  --buffers registered|malloc|device|standin\n"
    "                             registered host memory (default), plain malloc, device memory (CUDA\n"
    "                             builds), or the CPU stand-in of device memory\n"
    "  --transport auto|shm|tcp|verbs --ib-dev NAME[:PORT] --ib-gid-index N   as for training\n"
    "  --algo auto|fanin|ring|hier   the collectives' algorithm, as for training (default auto)\n"
    "  --comm-timeout S           seconds an operation may wait (default 60)\n"
    "  -h, --help                 this text\n";

// The flags (argv[0] is "bench-comm"); the --nproc launcher checks them before it forks, so that a
// bad one is reported once.
static void parse_bench(BenchOptions *o, int argc, char **argv) {
    *o = (BenchOptions){ BC_ALLREDUCE, 0, 5, 1, TRANSPORT_AUTO, 8, 64LL << 20, CT_F32, 60, NULL, -1, 0 };
    for (int i = 1; i < argc; i++) {
        const char *f = argv[i];
        if (!strcmp(f, "-h") || !strcmp(f, "--help")) {
            fputs(BENCH_USAGE, stdout);
            exit(0);
        }
        static const char *const known[] = { "--op", "--min-bytes", "--max-bytes", "--iters", "--warmup", "--comm-timeout",
                                             "--dtype", "--buffers", "--transport", "--nproc", "--ib-dev", "--ib-gid-index", "--algo" };
        enum { NKNOWN = sizeof known / sizeof known[0] };
        int k = 0;
        while (k < NKNOWN && strcmp(f, known[k])) k++;
        char hint[80];
        if (k == NKNOWN && strncmp(f, "--", 2)) die("bench-comm: unexpected argument '%s' (see ./train bench-comm --help)", f);
        if (k == NKNOWN) die("bench-comm: unknown flag %s%s (see ./train bench-comm --help)", f, flag_hint(f, BENCH_USAGE, hint, sizeof hint));
        if (i + 1 >= argc) die("%s needs a value", f);
        const char *v = argv[++i];
        if (!strcmp(f, "--op")) {
            o->op = -1;
            for (int q = 0; q < 4; q++)
                if (!strcmp(v, OP_FLAGS[q])) o->op = q;
            if (o->op < 0) die("--op: '%s' is not one of allreduce, reduce_scatter, all_gather, broadcast", v);
        } else if (!strcmp(f, "--min-bytes")) o->min_bytes = parse_num(f, v, 1, 1LL << 40, 1);
        else if (!strcmp(f, "--max-bytes")) o->max_bytes = parse_num(f, v, 1, 1LL << 40, 1);
        else if (!strcmp(f, "--iters")) o->iters = (int)parse_num(f, v, 1, 100000000, 0);
        else if (!strcmp(f, "--warmup")) o->warmup = (int)parse_num(f, v, 0, 100000000, 0);
        else if (!strcmp(f, "--nproc")) parse_num(f, v, 1, 4096, 0);
        else if (!strcmp(f, "--comm-timeout")) {
            char *end;
            o->timeout = strtod(v, &end);
            if (end == v || *end || !(o->timeout > 0 && o->timeout <= 1e6)) die("--comm-timeout: '%s' is not a number of seconds in (0, 1e6]", v);
        } else if (!strcmp(f, "--buffers")) {
            if (!strcmp(v, "registered")) o->registered = 1;
            else if (!strcmp(v, "malloc")) o->registered = 0;
            else if (!strcmp(v, "device")) o->registered = 2;
            else if (!strcmp(v, "standin")) o->registered = 3;
            else die("--buffers: '%s' is not registered, malloc, device or standin", v);
            if (o->registered == 2 && !backend_cuda()) die("--buffers device: this binary was built without CUDA");
        } else if (!strcmp(f, "--algo")) {
            if ((o->algo = comm_parse_algo(v)) < 0) die("--algo: '%s' is not auto, fanin, ring or hier", v);
        } else if (!strcmp(f, "--transport")) {
            if ((o->transport = comm_parse_transport(v)) < 0) die("--transport: '%s' is not auto, shm, tcp or verbs", v);
        } else if (!strcmp(f, "--ib-dev")) o->ib_dev = v;
        else if (!strcmp(f, "--ib-gid-index")) o->ib_gid_index = (int)parse_num(f, v, 0, 65535, 0); else if (!strcmp(f, "--dtype")) {
            if (!strcmp(v, "fp32")) o->t = CT_F32;
            else if (!strcmp(v, "bf16")) o->t = CT_BF16;
            else die("--dtype: '%s' is not fp32 or bf16", v);
        }
    }
    size_t es = comm_type_size(o->t);
    if (o->min_bytes < (long long)es) die("--min-bytes: %lld is smaller than one %s element", o->min_bytes, comm_type_name(o->t));
    if (o->max_bytes < o->min_bytes) die("--max-bytes: %lld is below --min-bytes %lld", o->max_bytes, o->min_bytes);
}

void bench_comm_check_flags(int argc, char **argv) {
    BenchOptions o;
    parse_bench(&o, argc, argv);
}

// The comparator of --buffers device: this device's copy bandwidth (read + write of `bytes`), median of 5.
static void print_device_copy(const DevMem *dev, void *dst, const void *src, size_t bytes) {
    double best[5];
    for (int k = 0; k < 5; k++) {
        dev->copy(dst, src, bytes);
        dev->sync();
        double t0 = now_seconds();
        for (int j = 0; j < 10; j++) dev->copy(dst, src, bytes);
        dev->sync();
        best[k] = (double)bytes * 10 / (now_seconds() - t0) / 1e9;
    }
    for (int a = 0; a < 5; a++) // a sort of five
        for (int b2 = a + 1; b2 < 5; b2++)
            if (best[b2] < best[a]) {
                double x = best[a];
                best[a] = best[b2];
                best[b2] = x;
            }
    printf("# device-to-device copy of %zu bytes on rank 0's device: %.3f GB/s (median of 5)\n", bytes, best[2]);
}

// One row of the table: count elements, timed over the slowest rank; 0 when some rank's result was wrong.
static int bench_size(Comm *world, const BenchOptions *bo, size_t count, int first, unsigned char *send,
                      unsigned char *recv, const DevMem *dev, void *hsend, void *hrecv) {
    int op = bo->op, n = comm_size(world);
    CommType t = bo->t;
    size_t bytes = count * comm_type_size(t);
    double bus = op == BC_ALLREDUCE ? 2.0 * (n - 1) / n : op == BC_BROADCAST ? 1.0 : (double)(n - 1) / n;
    int it = bo->iters;
    if (!it) { // about 256 MiB of traffic per size, between 5 and 1000 operations
        long long a = (256LL << 20) / (long long)bytes;
        it = a < 5 ? 5 : a > 1000 ? 1000 : (int)a;
    }
    // The first size also absorbs the start-up transient (threads of the job still settling on the
    // cores for the first milliseconds): a few warm-up operations measured 1 ms instead of 0.3 us.
    int wu = first && bo->warmup < it ? it : bo->warmup;
    for (int w = 0; w < wu; w++) run_op(world, op, send, recv, count, t);
    int ok = checked_run(world, op, send, recv, count, t, dev, hsend, hrecv);
    comm_barrier(world);
    double t0 = now_seconds();
    for (int k = 0; k < it; k++) run_op(world, op, send, recv, count, t);
    double mean = (now_seconds() - t0) / it;
    int64_t mine[2] = { (int64_t)(mean * 1e9 + 0.5), ok ? 0 : 1 }, worst[2];
    comm_all_reduce(world, mine, worst, 2, CT_I64, OP_MAX);
    if (comm_rank(world) == 0) {
        double us = (double)worst[0] / 1e3, algbw = (double)bytes / ((double)worst[0] > 0 ? (double)worst[0] : 1);
        printf("  %14s %14zu %12zu %6s %10.2f %12.3f %12.3f %6s\n", OP_FLAGS[op], bytes, count, comm_type_name(t),
               us, algbw, algbw * bus, worst[1] ? "WRONG" : "ok");
        fflush(stdout);
    }
    return !worst[1];
}

int bench_comm_main(int argc, char **argv) {
    BenchOptions bo;
    parse_bench(&bo, argc, argv);
    int op = bo.op, iters = bo.iters, warmup = bo.warmup, registered = bo.registered;
    long long min_bytes = bo.min_bytes, max_bytes = bo.max_bytes;
    CommType t = bo.t;
    size_t es = comm_type_size(t);

    LaunchEnv env;
    launch_env_read(&env); // without a launcher: a world of one
    const DevMem *dev = registered == 3 ? devmem_cpu() : NULL;
    if (registered == 2) { // this rank's GPU of the node, chosen before any context exists
        int ndev = cuda_device_count();
        if (ndev == 0) {
            char why[256];
            cuda_unavailable_reason(why, sizeof why);
            die("--buffers device: %s", why);
        }
        cuda_use_device(env.local_rank % ndev);
        dev = devmem_cuda();
    }
    // the ring and the hierarchy move host memory only so far: with device buffers auto is the fan-in
    int algo = dev && bo.algo == COMM_ALGO_AUTO ? COMM_ALGO_FANIN : bo.algo;
    CommOptions copt = { .timeout = bo.timeout, .transport = bo.transport, .algo = algo, .ib_dev = bo.ib_dev, .ib_gid_index = bo.ib_gid_index };
    Comm *world = comm_init(&env, &copt);
    comm_use_device(world, dev);
    int n = comm_size(world), rank = comm_rank(world);
    // reduce-scatter and all-gather move n equal parts (at least one element each), as in nccl-tests
    int parts = op == BC_REDUCE_SCATTER || op == BC_ALL_GATHER ? n : 1;
    size_t max_count = (size_t)max_bytes / es;
    if (max_count < (size_t)parts) max_count = (size_t)parts;
    // registered buffers, as the trainer's are: peers on this node read them in place
    unsigned char *send = dev ? dev->alloc(max_count * es) : registered ? hostmem_alloc(max_count * es) : xmalloc(max_count * es);
    unsigned char *recv = dev ? dev->alloc(max_count * es) : registered ? hostmem_alloc(max_count * es) : xmalloc(max_count * es);
    if (!send || !recv) die("bench-comm: out of memory for 2 x %zu bytes", max_count * es);
    void *hsend = dev ? xmalloc(max_count * es) : NULL, *hrecv = dev ? xmalloc(max_count * es) : NULL;
    if (dev && rank == 0) print_device_copy(dev, recv, send, max_count * es);
    comm_barrier(world); // opens the collectives' connections (on first use), which the header counts
    if (rank == 0) {
        char names[64];
        printf("# bench-comm: %s, %d rank(s), transport %s, algorithm %s (%d connection(s) per rank), %s buffers, %s, warmup %d, iters %s\n", OP_FLAGS[op], n,
               n == 1 ? "none (one rank)" : comm_transports(world, names, sizeof names), comm_algo(world), comm_connections(world),
               registered == 3 ? "device stand-in" : registered == 2 ? "device" : registered ? "registered" : "malloc",
               comm_type_name(t), warmup, iters ? "fixed" : "auto");
        printf("# %14s %14s %12s %6s %10s %12s %12s %6s\n", "op", "bytes", "count", "type", "time(us)", "algbw(GB/s)",
               "busbw(GB/s)", "check");
        fflush(stdout);
    }
    int wrong = 0;
    size_t last = 0;
    for (long long b = min_bytes; b <= max_bytes; b *= 2) {
        size_t count = (size_t)b / es / (size_t)parts * (size_t)parts;
        if (count < (size_t)parts) count = (size_t)parts;
        // (small sizes round to whole parts a rank: two of them can give the same count, measured once)
        if (count != last && !bench_size(world, &bo, count, b == min_bytes, send, recv, dev, hsend, hrecv)) wrong = 1;
        last = count;
        if (b > max_bytes / 2) break;
    }
    if (dev) {
        dev->free(send);
        dev->free(recv);
        free(hsend);
        free(hrecv);
    } else {
        hostmem_free(send);
        hostmem_free(recv);
    }
    comm_destroy(world);
    if (wrong && rank == 0) fprintf(stderr, "error: bench-comm: %s gave a wrong result on some rank\n", OP_FLAGS[op]);
    return wrong ? 1 : 0;
}
