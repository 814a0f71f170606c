// ckpt.h: the full training state on disk and back: one shard per rank, written asynchronously and
// atomically, checksummed, and readable under any other layout.
//
// A checkpoint of the state after S optimizer steps is a directory DIR/ckpt_<S, 8 digits>/ holding
//   rank_<R, 5 digits>.safetensors   one per rank, in the safetensors format: an 8-byte little-endian
//                                    header length, a JSON header, then raw little-endian tensors
//   manifest.json                    written last, by rank 0, once every shard is on disk
// and it is complete only when its manifest exists and verifies. Each shard holds, for every parameter
// tensor k of llm.c's file order (wte, wpe, ln1w, ...) that the rank owns any of, four tensors:
//   k.runs    int64 [n, 2]  (start, length) runs in the flattened full tensor
//   k.master  fp32  [sum of lengths]  the fp32 master weights of those runs, run after run
//   k.m, k.v  fp32  [sum of lengths]  the AdamW moments, likewise
// ZeRO shards and tensor-parallel slices are simply runs, so any reader can put the full tensors
// together from all shards, and any layout can read the parts it needs. Every element of the full
// model is written by exactly one rank (data-parallel rank d writes its ZeRO segment even at stage 0;
// tensors replicated across tensor parallelism come from its rank 0; the tied embedding from the first
// pipeline stage). The header's "__metadata__" holds strings: the format, step, rank and each tensor's
// full shape ("shape.wte": "[50304, 768]"). The manifest (JSON) holds the step, the AdamW update count,
// seed, data position and fingerprint, model, layout, optimizer and schedule, the --skip-spikes history,
// and per shard its file, size and zlib crc32; its last member "manifest_crc32" is the crc32 of every
// byte before it.
// DIR/llm4d.lock, locked by rank 0 for the run, keeps a second run out of DIR.
#ifndef LLM4D_CKPT_H
#define LLM4D_CKPT_H

#include <stdint.h>

#include "collectives.h"
#include "model.h"
#include "zero.h"

#define SPIKE_WINDOW 20 // --skip-spikes compares against the mean of this many recent applied steps

// Everything besides the tensors that the next step depends on, and what must match to resume.
typedef struct {
    int64_t step;   // optimizer steps taken: the state is the one after them
    int64_t adam_t; // AdamW updates applied (steps minus skipped ones): the bias correction
    uint64_t seed;
    int shuffle;
    GPT2Config model;
    // the layout it was written under (any layout reads it)
    int ranks, dp, tp, pp, cp, pp_virtual, zero, sp;
    double bucket_mb;
    char dtype[8];
    // the data position: the next global sequence is step x batch_tokens / seq_len of the training data
    int micro_batch, seq_len;
    long long batch_tokens;
    char train[1024];
    uint64_t train_tokens;
    char train_fp[9216]; // the training shards' content fingerprint (data.h: FP_SHARDS x 9 bytes); "": older ones
    // optimizer and schedule
    char schedule[16];
    float lr, lr_min_frac, beta1, beta2, eps, weight_decay, clip;
    int warmup, steps;
    // --skip-spikes: (loss, norm) of the recent applied steps, oldest first, and the skipped count
    float skip_spikes;
    int64_t skipped;
    int nhist;
    float hist_loss[SPIKE_WINDOW], hist_norm[SPIKE_WINDOW];
    // what the writing run did at this step's boundary before writing: the resumed run does the rest
    int validated, sampled;
} CkptMeta;

// Reads and verifies checkpoint d's manifest (checksum, every field's type and range) into meta:
// 0, or -1 with one line naming the file or field in why. What sample and eval take a model's shape from.
int ckpt_read_meta(const char *d, CkptMeta *meta, char *why, size_t cap);

// Before anything in dir is read or changed, on rank 0: takes the advisory lock on dir/llm4d.lock and
// writes this process's PID and host into it; *fd stays open for the run (an open-file-description lock:
// the kernel releases it when the process ends in any way, SIGKILL included). resume (a --resume PATH, or
// NULL) must not lie in a directory another run holds either. Returns -1 with one line naming the
// holder's PID and host when another process holds either lock. dir NULL: only the check of resume.
// flag: the option that named resume, for the message ("--resume"; sample and eval: "--model").
int ckpt_lock(const char *dir, const char *resume, const char *flag, int *fd, char *err, size_t cap);

// Path of the checkpoint of step `step` in dir.
void ckpt_path(const char *dir, int64_t step, char *out, size_t cap);

// Whether directory ckdir is a complete checkpoint: it holds a manifest (a regular file), not verified.
int ckpt_is_complete(const char *ckdir);
// What makes `path`, named as a checkpoint to read, unusable at a first look (it does not exist, is
// not a directory, has no manifest), in buf or a constant; NULL when it may be one.
const char *ckpt_named_problem(const char *path, char *buf, size_t cap);

// The step of the newest checkpoint in dir that has a manifest (1), or 0 when there is none. It is not
// verified: ckpt_resume does that.
int ckpt_newest_complete(const char *dir, int64_t *step);

// Chooses and reads the checkpoint to resume from; collective over world (NULL: one process). path is
// a checkpoint directory, or NULL for the newest usable one in dir: each unusable one (no manifest, a
// missing, truncated or corrupt shard, a manifest field out of range, runs that do not tile a tensor)
// is reported in one line naming the file or field, moved aside to ckpt_<step>.bad (.bad.1, ... when
// that exists) with one line saying so, and the one before it is tried. A checkpoint that `now` cannot continue (another model shape or vocabulary, another data
// order) is refused with one line. Fills meta and this rank's slice of the fp32 master weights and the
// AdamW moments (internal order, model->num_params floats each) and returns 1; returns 0 when dir holds
// no complete checkpoint (a fresh start). flag: the option that named path, as for ckpt_lock.
int ckpt_resume(const char *dir, const char *path, const char *flag, const GPT2 *model, Comm *world, const CkptMeta *now,
                CkptMeta *meta, float *master, float *m, float *v, char *from, size_t from_cap);

// Before the first step, on rank 0: makes dir a place where a run starting at step `start` writes its
// checkpoints: removes incomplete checkpoints and stale temporaries, and checkpoints newer than start
// when remove_newer (they failed verification). Returns -1 with the reason when dir holds a complete
// checkpoint the run would overwrite or mix with (a fresh start, or an older --resume PATH).
// resume_how: how a fresh start would continue from them instead (NULL: "pass --resume").
int ckpt_prepare_dir(const char *dir, int64_t start, int resumed, int remove_newer, const char *resume_how, char *err, size_t cap);

typedef struct Ckpt Ckpt;

// A finished checkpoint, reported on rank 0: complete (manifest written) or given up.
typedef struct {
    int64_t step;
    int ok;
    uint64_t bytes;  // every shard together
    double write_s;  // the slowest rank's shard write, fsync included
    char path[4096];
    char msg[512];   // why it failed
} CkptEvent;

// Writer of the checkpoints of this rank: computes the runs it owns and starts its writer thread.
// keep: complete checkpoints kept (0: all).
Ckpt *ckpt_open(const char *dir, GPT2 *model, Zero *zero, Comm *world, int keep);
// The host staging a checkpoint copies this rank's state into (master weights and moments: 12 bytes per
// parameter the rank owns), from account a as "other" (ckpt_open; ./train plan --exact, dry).
void ckpt_alloc_staging(MemAccount *a, const Zero *z, float *snap[3]);
// Called at every step boundary by every rank, then combined over the world with OP_MAX: 1 while this
// rank's shard of the checkpoint in flight is still being written.
int32_t ckpt_writing(Ckpt *c);
// With the combined value: when every rank's shard is written, rank 0 writes the manifest (in its
// writer thread). Collective when a checkpoint is in flight.
void ckpt_advance(Ckpt *c, int32_t any_writing);
// Starts the checkpoint of meta->step: waits for the one in flight (collective), copies this rank's
// state into the staging buffer and hands it to the writer thread. Returns the seconds the step
// stalled for it.
double ckpt_save(Ckpt *c, const CkptMeta *meta);
// Waits until the checkpoint in flight is complete or given up (collective), manifest included.
void ckpt_finish(Ckpt *c);
// Rank 0: the next finished checkpoint, if any (1), for the log.
int ckpt_event(Ckpt *c, CkptEvent *ev);
// Testing aid (LLM4D_FAULT at=ckpt-write): the writer kills this process halfway through its shard
// of the checkpoint of step `step`.
void ckpt_kill_during_write(Ckpt *c, int64_t step);
void ckpt_close(Ckpt *c); // ckpt_finish, then stops the writer thread
// Bytes of host memory the staging buffer takes.
size_t ckpt_staging_bytes(const Ckpt *c);

#endif
