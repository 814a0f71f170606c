// data.h: llm.c token shards and tokenizer files, and the global-batch order (text to shards: prepare.c).
//
// The batch order is a contract every layout keeps: with T tokens per sequence, the training shards
// (concatenated in sorted file-name order) hold W = (tokens - 1) / T windows; window w is the tokens
// [w·T, w·T + T + 1) (inputs the first T, targets the last T). Global sequence g = s·G + i (step s,
// G sequences per step) is window g mod W, or, with shuffling, window perm_e(g mod W) where perm_e is
// a seeded permutation of the W windows for epoch e = g / W.
#ifndef LLM4D_DATA_H
#define LLM4D_DATA_H

#include <stddef.h>
#include <stdio.h>
#include <stdint.h>

#include "common.h"

// Token shards: 256 int32 header (magic, version, token count), then the tokens. llm.c's two variants
// (dev/data/data_common.py): GPT-2's uint16 tokens, and Llama 3's uint32 tokens for vocabularies above
// 65,535; the reader takes both, and shards of both kinds may be concatenated.
#define SHARD_MAGIC 20240520
#define SHARD_VERSION 1
#define SHARD_MAGIC_U32 20240801
#define SHARD_VERSION_U32 7
#define TOKENIZER_MAGIC 20240328

typedef struct {
    char *path;
    int fd;
    uint64_t ntokens;
    uint64_t first; // position of its first token in the concatenation
    int tok_bytes;  // 2 (uint16, GPT-2's header) or 4 (uint32, Llama 3's)
} Shard;

typedef struct {
    Shard *shards;
    int nshards;
    uint64_t ntokens;
    int vocab;        // every token read is checked to be below this
    int T;
    uint64_t windows; // W
    int shuffle;
    uint64_t seed;
    uint64_t perm_epoch; // epoch whose permutation is cached in perm (UINT64_MAX: none)
    uint32_t *perm;
    char *fingerprint; // tokenset_fingerprint
} TokenSet;

// Opens every shard matching the glob pattern, checking every token against the vocabulary (one pass);
// `flag` names the option in error messages.
void tokenset_open(TokenSet *ts, const char *pattern, const char *flag, int vocab, int T, int shuffle, uint64_t seed);
void tokenset_close(TokenSet *ts);
// Reads n tokens starting at position pos of the concatenation (pos + n ≤ ntokens), checking each
// against the vocabulary.
void tokenset_read(const TokenSet *ts, uint64_t pos, size_t n, uint32_t *out);
// Window index of global sequence g under the contract above.
uint64_t tokenset_window(TokenSet *ts, uint64_t g);
// Inputs and targets (T each) of global sequence g.
void tokenset_sequence(TokenSet *ts, uint64_t g, int32_t *inputs, int32_t *targets);

// The content fingerprint of the shards, computed when they are opened, that a checkpoint records: per
// shard in file order, the zlib crc32 of its 1024-byte header followed by a fixed sample of its tokens
// (all of them up to FP_BLOCKS x FP_BLOCK tokens; else FP_BLOCKS blocks of FP_BLOCK tokens, block j
// starting at token floor(j x (n - FP_BLOCK) / (FP_BLOCKS - 1)) of the shard's n), as 8 lowercase hex
// digits, the shards' separated by one space. Beyond FP_SHARDS shards the last entry is the crc32 continued
// over all the remaining shards, one after the other. At most FP_SHARDS x 9 bytes, NUL included.
#define FP_BLOCKS 64
#define FP_BLOCK 1024
#define FP_SHARDS 1024
const char *tokenset_fingerprint(const TokenSet *ts);
// Compares the shards with a checkpoint's fingerprint fp: 0 when equal, 1 when fp is empty (a checkpoint
// written before fingerprints), -1 with why naming the first shard that differs.
int tokenset_fingerprint_check(const TokenSet *ts, const char *fp, char *why, size_t cap);

// Writes a token shard atomically: GPT-2's uint16 variant, or Llama 3's uint32 one.
void shard_write(const char *path, const uint16_t *tokens, size_t n);
void shard_write_u32(const char *path, const uint32_t *tokens, size_t n);
// A shard written in pieces: opens PATH through the safe-write path and writes the header for n tokens;
// the caller safe_writes the n tokens and commits (or aborts). 0, or -1 with the reason in sf->err.
int shard_begin(SafeFile *sf, const char *path, size_t n);

// Byte-level tokenizer (V = 256): token i is the byte i.
typedef struct Tokenizer {
    int vocab;
    int eot; // the end-of-text id (version 2 files), -1: none recorded
    char **pieces;
    int *lengths;
} Tokenizer;
void tokenizer_write_bytes(const char *path);
// An llm.c tokenizer file (version 2: header magic, 2, vocab, end-of-text id; per token a uint8 length and
// its bytes) through the safe-write path; 0, or -1 with the one-line reason in err.
int tokenizer_write(const char *path, int vocab, int eot, const uint8_t *const *pieces, const int *lengths, char *err,
                    size_t cap);
void tokenizer_load(Tokenizer *tk, const char *path);
void tokenizer_free(Tokenizer *tk);
// Encodes text greedily, the longest piece that matches at each position first (exact for byte-level
// tokenizers; for a BPE vocabulary a valid, not always the canonical, encoding): up to cap ids into out.
// Returns the count, or -(i + 1) when no piece starts with byte i of the text.
int tokenizer_encode(const Tokenizer *tk, const char *text, int *out, int cap);
// Samples printed as text: the bytes of successive tokens as one stream, well-formed UTF-8 as it is (a
// character split across tokens waits for its last byte), and each byte of an ill-formed sequence, a
// control character other than newline, or DEL as \xNN; the same text as Python's
// bytes.decode("utf-8", "backslashreplace") with those controls escaped.
typedef struct {
    unsigned char pend[4]; // the start of a character whose remaining bytes have not come yet
    int npend;
} TextOut;
void text_out(TextOut *t, const void *bytes, size_t n, FILE *f);
void text_out_token(TextOut *t, const Tokenizer *tk, int token, FILE *f); // an id outside the vocabulary as <id>
void text_out_flush(TextOut *t, FILE *f); // an unfinished character's bytes as \xNN

#endif
