// options.h: the trainer's command line: the Options struct, its parsing (every value checked whole,
// every error naming the flag) and the checks between flags that need no rank; --help's text.
#ifndef LLM4D_OPTIONS_H
#define LLM4D_OPTIONS_H

#include <stddef.h>
#include <stdint.h>

typedef struct {
    const char *preset, *init_from, *save_model, *train, *val, *tokenizer, *log, *dump, *device, *schedule;
    int layers, channels, heads, vocab, max_seq_len, seq_len; // 0 = not given
    int micro_batch, steps, warmup, val_every, val_steps, sample_every, sample_tokens, top_k, threads, shuffle, profile;
    long long batch_tokens;
    float lr, lr_min_frac, beta1, beta2, eps, weight_decay, clip, temperature;
    uint64_t seed;
    int dtype; // -1 = default for the device
    int zero, tp, sp, pp, pp_virtual, recompute, cp;
    int pp_schedule; // SCHED_* (schedule.h); -1: 1f1b, or interleaved with --pp-virtual > 1
    const char *pp_layers, *pp_trace;
    double bucket_mb, comm_timeout;
    const char *ckpt_dir, *resume_path;
    int ckpt_every, keep, resume, max_restarts, straggler_steps, allow_data_change;
    float skip_spikes, straggler;
    int transport;
    const char *ib_dev;
    int ib_gid_index; // -1: automatic
} Options;

// Parses argv (argv[0] the program) into o, with the defaults for everything not given; prints --help
// and exits 0 on -h/--help; dies with one line naming the flag on a bad value or combination.
void parse_options(Options *o, int argc, char **argv);
// A whole integer (or finite number) in [lo, hi], or one line naming flag and a non-zero exit.
long long parse_int(const char *flag, const char *s, long long lo, long long hi);
float parse_float(const char *flag, const char *s, double lo, double hi);
// Context parallelism cuts each sequence into 2·cp chunks, and sequence parallelism splits a rank's
// positions over the tensor-parallel group: T must divide for both. Returns 0, or -1 with the reason.
int context_split_error(const Options *o, int T, char *err, size_t cap);

#endif
