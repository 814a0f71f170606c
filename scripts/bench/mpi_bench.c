// mpi_bench.c: the MPI counterpart of `./train bench-comm`, for scripts/bench/compare_mpi.sh. Built
// only where mpicc exists (OpenMPI is never a dependency of the trainer). Same flags, same sizes, same
// table and the same definitions: the slowest rank's mean time; algbw = bytes / time; busbw =
// algbw·2(n−1)/n for all-reduce, algbw·(n−1)/n for reduce-scatter and all-gather (bytes = the whole
// vector, n equal parts of at least one element), algbw for broadcast. fp32 only (MPI has no bf16).
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { B_ALLREDUCE, B_REDUCE_SCATTER, B_ALL_GATHER, B_BROADCAST };
static const char *const OP_FLAGS[] = { "allreduce", "reduce_scatter", "all_gather", "broadcast" };

static int my_rank;

// Bad flags: every rank reaches the same verdict, rank 0 says so once, all exit with status 1.
static void fail(const char *msg, const char *flag, const char *v) {
    if (my_rank == 0) fprintf(stderr, "error: %s %s%s%s%s\n", flag, msg, v ? " '" : "", v ? v : "", v ? "'" : "");
    MPI_Finalize();
    exit(1);
}

static long long parse_num(const char *flag, const char *s, long long lo, long long hi) {
    char *end;
    long long x = strtoll(s, &end, 10);
    if (end == s) fail("needs a number, got", flag, s);
    int shift = 0;
    if (*end == 'K' || *end == 'k') shift = 10;
    else if (*end == 'M' || *end == 'm') shift = 20;
    else if (*end == 'G' || *end == 'g') shift = 30;
    if (shift) {
        end++;
        if (*end && strcmp(end, "B") && strcmp(end, "iB")) fail("is not a byte count:", flag, s);
        if (x > hi >> shift) fail("is out of range:", flag, s);
        x <<= shift;
    } else if (*end) fail("is not a whole number:", flag, s);
    if (x < lo || x > hi) fail("is out of range:", flag, s);
    return x;
}

static void run_op(int op, float *send, float *recv, int count, int n) {
    switch (op) {
    case B_ALLREDUCE: MPI_Allreduce(send, recv, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD); break;
    case B_REDUCE_SCATTER: MPI_Reduce_scatter_block(send, recv, count / n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD); break;
    case B_ALL_GATHER: MPI_Allgather(send, count / n, MPI_FLOAT, recv, count / n, MPI_FLOAT, MPI_COMM_WORLD); break;
    default: MPI_Bcast(recv, count, MPI_FLOAT, 0, MPI_COMM_WORLD); break;
    }
}

// One operation on fresh inputs (rank r contributes r + 1), checked against the closed form.
static int checked_run(int op, float *send, float *recv, int count, int n, int r) {
    int seg = count / n, in = op == B_ALL_GATHER ? seg : count, out = op == B_REDUCE_SCATTER ? seg : count;
    for (int i = 0; i < in; i++) send[i] = (float)(r + 1);
    for (int i = 0; i < out; i++) recv[i] = op == B_BROADCAST && r == 0 ? (float)(i % 251) : -1.0f;
    run_op(op, send, recv, count, n);
    float sum = (float)((double)n * (n + 1) / 2);
    for (int i = 0; i < out; i++) {
        float want = op == B_BROADCAST ? (float)(i % 251) : op == B_ALL_GATHER ? (float)(i / seg + 1) : sum;
        if (recv[i] != want) return 0;
    }
    return 1;
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int n, rank;
    MPI_Comm_size(MPI_COMM_WORLD, &n);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    my_rank = rank;
    int op = B_ALLREDUCE, iters = 0, warmup = 5;
    long long min_bytes = 8, max_bytes = 64LL << 20;
    for (int i = 1; i < argc; i++) {
        const char *f = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(f, "--op") && strcmp(f, "--min-bytes") && strcmp(f, "--max-bytes") && strcmp(f, "--iters") &&
            strcmp(f, "--warmup"))
            fail("is not a flag of mpi_bench:", "argument", f);
        if (!v) fail("needs a value", f, NULL);
        i++;
        if (!strcmp(f, "--op")) {
            op = -1;
            for (int k = 0; k < 4; k++)
                if (!strcmp(v, OP_FLAGS[k])) op = k;
            if (op < 0) fail("is not allreduce, reduce_scatter, all_gather or broadcast:", f, v);
        } else if (!strcmp(f, "--min-bytes")) min_bytes = parse_num(f, v, 4, 1LL << 33);
        else if (!strcmp(f, "--max-bytes")) max_bytes = parse_num(f, v, 4, 1LL << 33);
        else if (!strcmp(f, "--iters")) iters = (int)parse_num(f, v, 1, 100000000);
        else warmup = (int)parse_num(f, v, 0, 100000000);
    }
    if (max_bytes < min_bytes) fail("is below --min-bytes:", "--max-bytes", argv[argc - 1]);
    int parts = op == B_REDUCE_SCATTER || op == B_ALL_GATHER ? n : 1;
    long long max_count = max_bytes / 4 < parts ? parts : max_bytes / 4;
    if (max_count > 0x7fffffff) fail("is too large for an int count:", "--max-bytes", argv[argc - 1]);
    float *send = malloc((size_t)max_count * 4), *recv = malloc((size_t)max_count * 4);
    if (!send || !recv) {
        fprintf(stderr, "error: rank %d cannot allocate 2 x %lld bytes (--max-bytes)\n", rank, max_count * 4);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    memset(send, 0, (size_t)max_count * 4);
    memset(recv, 0, (size_t)max_count * 4);
    double bus = op == B_ALLREDUCE ? 2.0 * (n - 1) / n : op == B_BROADCAST ? 1.0 : (double)(n - 1) / n;
    if (rank == 0) {
        int len;
        char ver[MPI_MAX_LIBRARY_VERSION_STRING];
        MPI_Get_library_version(ver, &len);
        char *nl = strchr(ver, '\n');
        if (nl) *nl = 0;
        printf("# mpi_bench: %s, %d rank(s), %s, fp32, warmup %d, iters %s\n", OP_FLAGS[op], n, ver, warmup, iters ? "fixed" : "auto");
        printf("# %14s %14s %12s %6s %10s %12s %12s %6s\n", "op", "bytes", "count", "type", "time(us)", "algbw(GB/s)",
               "busbw(GB/s)", "check");
        fflush(stdout);
    }
    int wrong = 0;
    for (long long b = min_bytes; b <= max_bytes; b *= 2) {
        long long count = b / 4 / parts * parts;
        if (count < parts) count = parts;
        long long bytes = count * 4;
        int it = iters;
        if (!it) { // the same rule as bench-comm: about 256 MiB of traffic, 5 to 1000 operations
            long long a = (256LL << 20) / bytes;
            it = a < 5 ? 5 : a > 1000 ? 1000 : (int)a;
        }
        for (int w = 0; w < warmup; w++) run_op(op, send, recv, (int)count, n);
        int ok = checked_run(op, send, recv, (int)count, n, rank), all_ok;
        MPI_Barrier(MPI_COMM_WORLD);
        double t0 = MPI_Wtime();
        for (int k = 0; k < it; k++) run_op(op, send, recv, (int)count, n);
        double mean = (MPI_Wtime() - t0) / it, worst;
        MPI_Allreduce(&mean, &worst, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
        MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
        if (!all_ok) wrong = 1;
        if (rank == 0) {
            double algbw = (double)bytes / (worst > 0 ? worst : 1e-12) / 1e9;
            printf("  %14s %14lld %12lld %6s %10.2f %12.3f %12.3f %6s\n", OP_FLAGS[op], bytes, count, "fp32", worst * 1e6,
                   algbw, algbw * bus, all_ok ? "ok" : "WRONG");
            fflush(stdout);
        }
        if (b > max_bytes / 2) break;
    }
    free(send);
    free(recv);
    MPI_Finalize();
    return wrong;
}
