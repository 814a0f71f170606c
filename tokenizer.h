// tokenizer.h: GPT-2's byte-level BPE (load OpenAI's encoder.json + vocab.bpe, encode, decode), BPE
// training with the same pre-tokenizer, and writing both GPT-2's two-file form and llm.c's tokenizer file.
//
// Pre-tokenizer: GPT-2's regular expression
//   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
// with \s the Unicode White_Space property (as Python's regex module and Rust's regex crate read it),
// matched by PCRE2 (UTF + UCP, JIT) behind a hand-written ASCII fast path that gives the same pieces.
// Invalid UTF-8 is bytes underneath: every byte that is not part of a well-formed UTF-8 sequence is a
// character of its own, neither letter, number nor space (as Python's errors='surrogateescape' makes
// it), and is encoded through its byte token like any other byte.
// Merges: within a piece, the adjacent pair of lowest merge rank, leftmost among equals, is merged until
// no pair has a rank (GPT-2's encoder.py and tiktoken give the same ids on GPT-2's files).
#ifndef LLM4D_TOKENIZER_H
#define LLM4D_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#define BPE_MAX_VOCAB 65536   // ids are stored as uint16 in the token shards
#define BPE_MAX_TOKEN_BYTES 255 // llm.c's tokenizer file stores a token's length in one byte

typedef struct Bpe Bpe;
typedef struct BpeEncoder BpeEncoder;
typedef struct BpeCounter BpeCounter;

// GPT-2's two files; returns NULL with one line naming the file (and line) in err.
Bpe *bpe_load_gpt2(const char *encoder_json, const char *merges, char *err, size_t cap);
// The BPE of an llm.c tokenizer file (GPT-2's or one `prepare --tokenizer bpe:N` wrote), whose ids are in
// merge order: the merges are recovered from the pieces, so encoding gives GPT-2's ids without its two
// files (what --prompt uses). NULL with one line in err when the file is not a byte-level BPE.
struct Tokenizer;
Bpe *bpe_from_tokenizer(const struct Tokenizer *tk, char *err, size_t cap);
// The byte-level start of training: 256 byte tokens, no merges, no end-of-text.
Bpe *bpe_bytes(void);
void bpe_free(Bpe *b);
int bpe_vocab(const Bpe *b);
int bpe_eot(const Bpe *b); // id of <|endoftext|>, -1 when the vocabulary has none
int bpe_merges(const Bpe *b);
const uint8_t *bpe_token(const Bpe *b, int id, int *len);

// One per thread: the pattern's match data and a cache of encoded pre-tokens.
BpeEncoder *bpe_encoder_new(const Bpe *b);
void bpe_encoder_free(BpeEncoder *e);
// Calls fn for each pre-token of s[0, n), in order (pieces are slices of s).
void bpe_pieces(BpeEncoder *e, const uint8_t *s, size_t n, void (*fn)(const uint8_t *p, size_t len, void *ctx), void *ctx);
// Appends the ids of s[0, n) to *out (a growable array of *len ids, *cap allocated).
void bpe_encode(BpeEncoder *e, const uint8_t *s, size_t n, uint16_t **out, size_t *len, size_t *cap);
// The bytes of ids[0, n) into out (at least bpe_decode_bound bytes); returns the length.
size_t bpe_decode(const Bpe *b, const uint16_t *ids, size_t n, uint8_t *out);
size_t bpe_decode_bound(const Bpe *b, size_t n);

// Training: counts of pre-token types (bounded by the number of distinct pre-tokens, not the text).
BpeCounter *bpe_counter_new(void);
void bpe_counter_free(BpeCounter *c);
void bpe_count(BpeCounter *c, BpeEncoder *e, const uint8_t *s, size_t n);
void bpe_counter_merge(BpeCounter *dst, const BpeCounter *src); // adds src's counts into dst
size_t bpe_counter_types(const BpeCounter *c);
// Learns a vocabulary of `vocab` tokens: the 256 bytes (in GPT-2's order), vocab - 257 merges and
// <|endoftext|> last. Each merge is the adjacent pair with the highest count over the pre-token types
// (weighted by their counts); ties go to the smallest (left id, right id); a pair whose token would
// exceed BPE_MAX_TOKEN_BYTES is never merged. Stops early (fewer tokens) when no pair is left.
Bpe *bpe_train(const BpeCounter *c, int vocab);

// GPT-2's two-file form and llm.c's tokenizer file (magic 20240328, version 2, end-of-text id), each
// through the safe-write path; return 0, or -1 with one line in err.
int bpe_write_gpt2(const Bpe *b, const char *encoder_json, const char *merges, char *err, size_t cap);
int bpe_write_llmc(const Bpe *b, const char *path, char *err, size_t cap);

#endif
