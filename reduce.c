// reduce.c: the element types of the collectives and the host's reductions (reduce.h).
#include "reduce.h"

#include <stdint.h>
#include <string.h>

#include "common.h"
#include "hostmem.h" // copy_streaming
#include "kernels.h" // bf16 conversions

size_t comm_type_size(CommType t) {
    static const size_t sizes[CT_NTYPES] = { 4, 2, 4, 8 };
    return sizes[t];
}
const char *comm_type_name(CommType t) {
    static const char *names[CT_NTYPES] = { "fp32", "bf16", "int32", "int64" };
    return names[t];
}
const char *comm_op_name(CommOp op) {
    static const char *names[CT_NOPS] = { "sum", "avg", "max" };
    return names[op];
}
size_t comm_acc_size(CommType t) { return t == CT_BF16 ? 4 : comm_type_size(t); }

// acc = in (the first contribution) or acc (op)= in, elementwise; bf16 accumulates in fp32.
void comm_reduce_host(void *accp, const void *inp, size_t n, int type, int op, int first) {
    int mx = op == OP_MAX;
    switch ((CommType)type) {
    case CT_F32: {
        float *a = accp;
        const float *x = inp;
        if (first) memcpy(a, x, n * 4);
        else if (mx) for (size_t i = 0; i < n; i++) a[i] = x[i] > a[i] ? x[i] : a[i];
        else for (size_t i = 0; i < n; i++) a[i] += x[i];
        break;
    }
    case CT_BF16: {
        float *a = accp;
        const uint16_t *x = inp;
        for (size_t i = 0; i < n; i++) {
            float v = bf16_to_f32(x[i]);
            a[i] = first ? v : mx ? (v > a[i] ? v : a[i]) : a[i] + v;
        }
        break;
    }
    case CT_I32: {
        int32_t *a = accp;
        const int32_t *x = inp;
        if (first) memcpy(a, x, n * 4);
        else if (mx) for (size_t i = 0; i < n; i++) a[i] = x[i] > a[i] ? x[i] : a[i];
        else for (size_t i = 0; i < n; i++) a[i] = (int32_t)((uint32_t)a[i] + (uint32_t)x[i]);
        break;
    }
    case CT_I64: {
        int64_t *a = accp;
        const int64_t *x = inp;
        if (first) memcpy(a, x, n * 8);
        else if (mx) for (size_t i = 0; i < n; i++) a[i] = x[i] > a[i] ? x[i] : a[i];
        else for (size_t i = 0; i < n; i++) a[i] = (int64_t)((uint64_t)a[i] + (uint64_t)x[i]);
        break;
    }
    default:
        die("internal: bad comm type %d", type);
    }
}

// out = acc (divided by n for avg), rounded once to bf16; past the cache for a large operation.
void comm_finish_host(void *out, const void *accp, size_t n, int type, int op, int ranks, int streaming) {
    int avg = op == OP_AVG;
    switch ((CommType)type) {
    case CT_F32: {
        const float *a = accp;
        float *o = out;
        if (!avg) streaming ? copy_streaming(o, a, n * 4) : (void)memcpy(o, a, n * 4);
        else for (size_t i = 0; i < n; i++) o[i] = a[i] / (float)ranks;
        break;
    }
    case CT_BF16: {
        const float *a = accp;
        uint16_t *o = out;
        for (size_t i = 0; i < n; i++) o[i] = f32_to_bf16(avg ? a[i] / (float)ranks : a[i]);
        break;
    }
    case CT_I32: {
        const int32_t *a = accp;
        int32_t *o = out;
        for (size_t i = 0; i < n; i++) o[i] = avg ? a[i] / ranks : a[i];
        break;
    }
    case CT_I64: {
        const int64_t *a = accp;
        int64_t *o = out;
        for (size_t i = 0; i < n; i++) o[i] = avg ? a[i] / ranks : a[i];
        break;
    }
    default:
        die("internal: bad comm type %d", type);
    }
}

// One loop per type and case, so that the compiler vectorises the common ones (fp32, int sums).
void comm_combine_host(void *out, const void *left, int left_acc, const void *in, int in_acc, size_t n, int type, int op,
                       int ranks) {
    int mx = op == OP_MAX, avg = op == OP_AVG && ranks > 0;
    switch ((CommType)type) {
    case CT_F32: {
        const float *a = left, *x = in;
        float *o = out, r = (float)ranks;
        if (mx) for (size_t i = 0; i < n; i++) o[i] = x[i] > a[i] ? x[i] : a[i];
        else if (avg) for (size_t i = 0; i < n; i++) o[i] = (a[i] + x[i]) / r;
        else for (size_t i = 0; i < n; i++) o[i] = a[i] + x[i];
        break;
    }
    case CT_BF16: {
        const float *af = left, *xf = in;
        const uint16_t *ab = left, *xb = in;
        for (size_t i = 0; i < n; i++) {
            float a = left_acc ? af[i] : bf16_to_f32(ab[i]), v = in_acc ? xf[i] : bf16_to_f32(xb[i]);
            float s = mx ? (v > a ? v : a) : a + v;
            if (ranks > 0) ((uint16_t *)out)[i] = f32_to_bf16(avg ? s / (float)ranks : s);
            else ((float *)out)[i] = s;
        }
        break;
    }
    case CT_I32: {
        const int32_t *a = left, *x = in;
        int32_t *o = out;
        if (mx) for (size_t i = 0; i < n; i++) o[i] = x[i] > a[i] ? x[i] : a[i];
        else if (avg) for (size_t i = 0; i < n; i++) o[i] = (int32_t)((uint32_t)a[i] + (uint32_t)x[i]) / ranks;
        else for (size_t i = 0; i < n; i++) o[i] = (int32_t)((uint32_t)a[i] + (uint32_t)x[i]);
        break;
    }
    case CT_I64: {
        const int64_t *a = left, *x = in;
        int64_t *o = out;
        if (mx) for (size_t i = 0; i < n; i++) o[i] = x[i] > a[i] ? x[i] : a[i];
        else if (avg) for (size_t i = 0; i < n; i++) o[i] = (int64_t)((uint64_t)a[i] + (uint64_t)x[i]) / ranks;
        else for (size_t i = 0; i < n; i++) o[i] = (int64_t)((uint64_t)a[i] + (uint64_t)x[i]);
        break;
    }
    default:
        die("internal: bad comm type %d", type);
    }
}
