// pipeline.c: the 1F1B schedule and the hand-off of activations and gradients between stages.
#include "pipeline.h"

#include <stdlib.h>
#include <string.h>

#include "common.h"

void pipeline_split_layers(int L, int P, const char *counts, int *first, int *count) {
    if (P > L) die("--pp %d: more pipeline stages than the model's %d blocks", P, L);
    if (!counts) {
        for (int s = 0; s < P; s++) count[s] = L / P + (s < L % P);
    } else {
        const char *c = counts;
        int sum = 0;
        for (int s = 0; s < P; s++) {
            char *end;
            long v = strtol(c, &end, 10);
            if (end == c || v < 1 || v > L) die("--pp-layers '%s': expected %d positive block counts separated by commas", counts, P);
            count[s] = (int)v;
            sum += (int)v;
            c = end;
            if (s < P - 1) {
                if (*c != ',') die("--pp-layers '%s': expected %d counts, one per stage", counts, P);
                c++;
            }
        }
        if (*c) die("--pp-layers '%s': expected %d counts, one per stage", counts, P);
        if (sum != L) die("--pp-layers '%s' adds up to %d blocks, but the model has %d", counts, sum, L);
    }
    first[0] = 0;
    for (int s = 1; s < P; s++) first[s] = first[s - 1] + count[s - 1];
}

void pipeline_init(Pipeline *p, GPT2 *m, Zero *z, Comm *pp) {
    memset(p, 0, sizeof *p);
    p->model = m;
    p->zero = z;
    p->pp = pp;
    p->stages = m->pp;
    p->stage = m->pp_rank;
    int n = m->nslots;
    p->send_out = xcalloc((size_t)n, sizeof(CommRequest *));
    p->send_grad = xcalloc((size_t)n, sizeof(CommRequest *));
    p->host_in = xcalloc((size_t)n, sizeof(void *));
    p->host_out = xcalloc((size_t)n, sizeof(void *));
    if (strcmp(m->be->name, "cpu") != 0) {
        size_t bytes = gpt2_stage_bytes(m, m->B, m->T);
        for (int s = 0; s < n; s++) {
            p->host_in[s] = xmalloc(bytes);
            p->host_out[s] = xmalloc(bytes);
        }
    }
}

static void drain(CommRequest **r) {
    if (*r) comm_wait(*r);
    *r = NULL;
}

void pipeline_free(Pipeline *p) {
    for (int s = 0; s < p->model->nslots; s++) {
        drain(&p->send_out[s]);
        drain(&p->send_grad[s]);
        free(p->host_in[s]);
        free(p->host_out[s]);
    }
    free(p->send_out);
    free(p->send_grad);
    free(p->host_in);
    free(p->host_out);
    free(p->trace);
    memset(p, 0, sizeof *p);
}

static void trace_op(Pipeline *p, char kind, int mb) {
    if (p->trace_len + 16 > p->trace_cap) {
        p->trace_cap = p->trace_cap ? 2 * p->trace_cap : 256;
        p->trace = realloc(p->trace, p->trace_cap);
        if (!p->trace) die("out of memory");
    }
    p->trace_len += (size_t)snprintf(p->trace + p->trace_len, p->trace_cap - p->trace_len, "%s%c%d",
                                     p->trace_len ? " " : "", kind, mb);
}

// Receives n bytes from stage `from` into device buffer dst (through host staging on devices),
// counting the wait.
static void recv_into(Pipeline *p, void *dst, size_t n, int from, int slot) {
    GPT2 *m = p->model;
    double t0 = now_seconds();
    if (p->host_in[slot]) {
        comm_recv(p->pp, p->host_in[slot], n, from);
        m->be->to_device(dst, p->host_in[slot], n);
    } else {
        comm_recv(p->pp, dst, n, from);
    }
    p->wait_s += now_seconds() - t0;
}

static CommRequest *send_from(Pipeline *p, const void *src, size_t n, int to, int slot) {
    GPT2 *m = p->model;
    if (p->host_out[slot]) {
        m->be->to_host(p->host_out[slot], src, n);
        return comm_isend(p->pp, p->host_out[slot], n, to);
    }
    return comm_isend(p->pp, src, n, to);
}

static double forward_mb(Pipeline *p, const int32_t *inputs, const int32_t *targets, int mb, int B, int T) {
    GPT2 *m = p->model;
    int slot = mb % m->nslots;
    drain(&p->send_out[slot]); // the set's previous micro-batch has left
    drain(&p->send_grad[slot]);
    gpt2_use_slot(m, slot);
    size_t bytes = gpt2_stage_bytes(m, B, T), tokens = (size_t)B * T;
    if (!m->first) recv_into(p, gpt2_stage_input(m), bytes, p->stage - 1, slot);
    zero_begin_forward(p->zero);
    float loss = gpt2_forward(m, inputs + mb * tokens, targets ? targets + mb * tokens : NULL, B, T);
    if (!m->last) p->send_out[slot] = send_from(p, gpt2_stage_output(m), bytes, p->stage + 1, slot);
    trace_op(p, 'F', mb);
    if (++p->live > p->peak_live) p->peak_live = p->live;
    return m->last ? loss : 0.0;
}

static void backward_mb(Pipeline *p, int mb, int M, int B, int T, float dloss) {
    GPT2 *m = p->model;
    int slot = mb % m->nslots;
    gpt2_use_slot(m, slot);
    size_t bytes = gpt2_stage_bytes(m, B, T);
    if (!m->last) recv_into(p, gpt2_stage_grad(m), bytes, p->stage + 1, slot);
    zero_begin_backward(p->zero, mb == M - 1);
    gpt2_backward(m, dloss);
    if (!m->first) p->send_grad[slot] = send_from(p, gpt2_stage_grad(m), bytes, p->stage - 1, slot);
    trace_op(p, 'B', mb);
    p->live--;
}

double pipeline_step(Pipeline *p, const int32_t *inputs, const int32_t *targets, int M, int B, int T, float dloss) {
    p->wait_s = 0;
    p->live = p->peak_live = 0;
    p->trace_len = 0;
    if (p->trace) p->trace[0] = 0;
    int warm = p->stages - p->stage - 1;
    if (warm > M) warm = M;
    double loss = 0;
    for (int i = 0; i < warm; i++) loss += forward_mb(p, inputs, targets, i, B, T);
    for (int i = 0; i < M - warm; i++) {
        loss += forward_mb(p, inputs, targets, warm + i, B, T);
        backward_mb(p, i, M, B, T, dloss);
    }
    for (int i = M - warm; i < M; i++) backward_mb(p, i, M, B, T, dloss);
    for (int s = 0; s < p->model->nslots; s++) { // every hand-off of this step has left
        drain(&p->send_out[s]);
        drain(&p->send_grad[s]);
    }
    return loss;
}

float pipeline_forward(Pipeline *p, const int32_t *inputs, const int32_t *targets, int B, int T) {
    GPT2 *m = p->model;
    if (p->stages == 1) return gpt2_forward(m, inputs, targets, B, T);
    gpt2_use_slot(m, 0);
    size_t bytes = gpt2_stage_bytes(m, B, T);
    if (!m->first) recv_into(p, gpt2_stage_input(m), bytes, p->stage - 1, 0);
    float loss = gpt2_forward(m, inputs, targets, B, T);
    if (!m->last) {
        p->send_out[0] = send_from(p, gpt2_stage_output(m), bytes, p->stage + 1, 0);
        drain(&p->send_out[0]);
    }
    return m->last ? loss : 0.0f;
}
