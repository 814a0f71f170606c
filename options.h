// options.h: the trainer's command line: the Options struct, its parsing (every value checked whole,
// every error naming the flag), the checks between flags and of the layout that need no rank (so that
// the --nproc launcher can refuse before it forks); --help's text.
#ifndef LLM4D_OPTIONS_H
#define LLM4D_OPTIONS_H

#include <stddef.h>
#include <stdint.h>

#include "model.h"
enum { MODE_TRAIN, MODE_SAMPLE, MODE_EVAL }; // ./train, ./train sample, ./train eval

typedef struct {
    int mode;
    const char *model_path, *prompt; // sample and eval: --model FILE|DIR; sample: --prompt TEXT
    const char *preset, *init_from, *save_model, *train, *val, *tokenizer, *log, *dump, *device, *schedule;
    int layers, channels, heads, vocab, max_seq_len, seq_len; // 0 = not given
    int arch, tie;                       // --arch, --tie-embeddings: -1 = not given
    int kv_heads, ffn;                   // 0 = not given
    double rope_theta, norm_eps;         // 0 = not given
    const char *rope_scaling;            // NULL = not given
    int micro_batch, steps, warmup, val_every, val_steps, sample_every, sample_tokens, top_k, threads, shuffle, profile;
    long long batch_tokens;
    float lr, lr_min_frac, beta1, beta2, eps, weight_decay, clip, temperature;
    uint64_t seed;
    int dtype; // -1 = default for the device
    int zero, tp, sp, pp, pp_virtual, recompute, cp;
    int dp; // --dp: checked against the ranks over TP x CP x PP (0: implied)
    int pp_schedule; // SCHED_* (schedule.h); -1: 1f1b, or interleaved with --pp-virtual > 1
    const char *pp_layers, *pp_trace, *pp_schedule_dump, *pp_times_flag;
    double pp_times[3]; // --pp-times (zeros: unit times)
    int pp_times_auto;  // --pp-times auto: measured in the first step
    double bucket_mb, comm_timeout;
    const char *ckpt_dir, *resume_path;
    long long model_step; // sample, eval: --model DIR's newest complete checkpoint, as this rank found it (-1: --model named one)
    int ckpt_every, keep, resume, max_restarts, straggler_steps, allow_data_change;
    float skip_spikes, straggler;
    int transport;
    int algo; // CommAlgo
    char **argv_store; // parse_options' argv (llm.c's flags translated), which the strings above point into
    char *owned_path;  // a --model checkpoint path parse_options built
    const char *ib_dev;
    int ib_gid_index; // -1: automatic
    // Hugging Face checkpoints (hf.h): --init-from-hf DIR (the shape and weights), --save-hf DIR at the
    // end, in save_hf_dtype (DT_F32 or DT_BF16)
    const char *init_from_hf, *save_hf;
    int save_hf_dtype;
} Options;

// Parses argv (argv[0] the program; argv[1] "sample" or "eval" for those modes) into o, with the
// defaults for everything not given; prints --help and exits 0 on -h/--help; dies with one line naming
// the flag on a bad value or combination. sample and eval become a run of no steps from --model (a
// model file: init_from; a checkpoint, or a directory of them: resume_path) that samples once or
// validates once.
void parse_options(Options *o, int argc, char **argv);
void options_free(Options *o); // what parse_options allocated (the translated argv the options point into)
// Context parallelism cuts each sequence into 2·cp chunks, and sequence parallelism splits a rank's
// positions over the tensor-parallel group: T must divide for both. Returns 0, or -1 with the reason.
int context_split_error(const Options *o, int T, char *err, size_t cap);

// The batch of a layout: T tokens a sequence, accum micro-batches of B x T on each of the dp ranks,
// batch_tokens a step, G sequences a step.
typedef struct {
    int T, B, dp, accum;
    long long batch_tokens, G;
} BatchShape;
// Every check of the layout that needs the model's shape and the world's size but no rank: world =
// DP x TP x PP x CP, heads over --tp, --sp, T against maxT and the context split, the batch over the
// data-parallel ranks and its bounds, the blocks over the pipeline stages (--pp-layers, --pp-virtual).
// The --nproc launcher asks before it forks and every rank asks again. Fills *b and returns 0, or -1
// with one line naming the flag.
int check_layout(const Options *o, const GPT2Config *cfg, int nranks, BatchShape *b, char *err, size_t cap);
// The shape the command line asks for without loading any weights (--init-from: the file's header;
// --init-from-hf: its config.json).
GPT2Config options_shape(const Options *o);
// The shape flags as model_shape takes them, with the vocabulary V (0: the preset's).
ShapeFlags options_shape_flags(const Options *o, int V);
// Any shape flag given (--layers ... --tie-embeddings; not --arch or --model)
int options_any_shape_flag(const Options *o);

#endif
