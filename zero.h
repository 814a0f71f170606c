// zero.h: the optimizer side of data parallelism: fp32 master weights and AdamW moments, the global
// gradient norm and clipping, and the update. With one data-parallel rank nothing is sharded; the
// ZeRO stages shard exactly these buffers.
#ifndef LLM4D_ZERO_H
#define LLM4D_ZERO_H

#include "model.h"

typedef struct {
    float beta1, beta2, eps, weight_decay;
    float clip; // global-norm clipping threshold; 0 disables it
} AdamWConfig;

typedef struct {
    AdamWConfig cfg;
    float *master; // fp32 master weights; the working weights themselves when those are fp32
    int master_owned;
    float *m, *v;  // AdamW moments
    int t;         // updates taken
} Optimizer;

void optimizer_init(Optimizer *opt, GPT2 *model, const float *host_params, const AdamWConfig *cfg);
void optimizer_free(Optimizer *opt, GPT2 *model);
// ‖g‖₂ over every parameter gradient.
float optimizer_grad_norm(const Optimizer *opt, const GPT2 *model);
// One AdamW update at learning rate lr; gradients are scaled by clip/(norm + 1e-6) when clipping is
// on and the norm exceeds it (PyTorch's clip_grad_norm_ rule). Refreshes the working weights.
void optimizer_step(Optimizer *opt, GPT2 *model, float lr, float grad_norm);
// Copies the fp32 master weights to the host (the trained model, for saving).
void optimizer_master_to_host(const Optimizer *opt, const GPT2 *model, float *host);

#endif
