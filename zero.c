// zero.c: master weights, AdamW and the global gradient norm (see zero.h).
#include "zero.h"

#include <math.h>
#include <string.h>

void optimizer_init(Optimizer *opt, GPT2 *model, const float *host_params, const AdamWConfig *cfg) {
    memset(opt, 0, sizeof *opt);
    opt->cfg = *cfg;
    size_t bytes = model->num_params * sizeof(float);
    if (model->dt == DT_F32) {
        opt->master = model->params; // fp32 working weights are their own master copy
    } else {
        opt->master = mem_alloc(&model->mem, MEM_OPTIMIZER, bytes, "master weights");
        opt->master_owned = 1;
        model->be->to_device(opt->master, host_params, bytes);
    }
    opt->m = mem_alloc(&model->mem, MEM_OPTIMIZER, bytes, "AdamW first moment");
    opt->v = mem_alloc(&model->mem, MEM_OPTIMIZER, bytes, "AdamW second moment");
}

void optimizer_free(Optimizer *opt, GPT2 *model) {
    if (opt->master_owned) model->be->free(opt->master);
    model->be->free(opt->m);
    model->be->free(opt->v);
    memset(opt, 0, sizeof *opt);
}

float optimizer_grad_norm(const Optimizer *opt, const GPT2 *model) {
    (void)opt;
    return (float)sqrt(model->be->sumsq(model->grads, model->num_params));
}

void optimizer_step(Optimizer *opt, GPT2 *model, float lr, float grad_norm) {
    const AdamWConfig *c = &opt->cfg;
    opt->t++;
    float bc1 = 1.0f - powf(c->beta1, (float)opt->t), bc2 = 1.0f - powf(c->beta2, (float)opt->t);
    float scale = 1.0f;
    if (c->clip > 0.0f && grad_norm > c->clip) scale = c->clip / (grad_norm + 1e-6f);
    for (int k = 0; k < NUM_PARAM_TENSORS; k++) {
        size_t off = model->param_offsets[k];
        float wd = gpt2_param_decays(k) ? c->weight_decay : 0.0f;
        void *working = model->dt == DT_F32 ? NULL : gpt2_param(model, k);
        model->be->adamw(model->dt, opt->master + off, working, model->grads + off, opt->m + off, opt->v + off,
                         model->param_sizes[k], lr, c->beta1, c->beta2, c->eps, wd, bc1, bc2, scale);
    }
}

void optimizer_master_to_host(const Optimizer *opt, const GPT2 *model, float *host) {
    model->be->to_host(host, opt->master, model->num_params * sizeof(float));
}
