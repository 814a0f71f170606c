// safetensors.h: the safetensors file format, shared by llm4d's checkpoints (ckpt.c) and Hugging Face
// checkpoints (hf.c): an 8-byte little-endian header length, a JSON header (tensor name -> dtype, shape,
// data_offsets [begin, end) into the data that follows; "__metadata__" -> strings), padded with spaces to
// a multiple of 8 bytes, then the raw little-endian tensors.
#ifndef LLM4D_SAFETENSORS_H
#define LLM4D_SAFETENSORS_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

// The whole of a regular file of at most limit bytes into *buf (NUL-terminated, free it); 0, or -1
// with the reason (naming the path) in why.
int st_read_file(const char *path, unsigned char **buf, size_t *len, size_t limit, char *why, size_t cap);

// A parsed file in memory: its header and where the data begins.
typedef struct {
    json_t *header;
    const unsigned char *data;
    uint64_t data_len;
} StFile;
// Parses the framing and the header JSON of buf[0..len); 0, or -1 with why naming file. (Whether the
// header is an object, and what it must hold, is the caller's: ckpt.c's messages predate this file.)
int st_parse(const char *file, const unsigned char *buf, size_t len, StFile *st, char *why, size_t cap);
void st_free(StFile *st);

#define ST_MAX_DIMS 8
typedef struct {
    char dtype[8];   // "F32", "BF16", "F16", "I64", ...
    size_t elem;     // bytes per element (0: a dtype this helper does not know)
    int ndim;
    int64_t shape[ST_MAX_DIMS];
    uint64_t numel;
    const unsigned char *p; // the tensor's bytes inside the data
} StTensor;
// Entry `name` of the header: 0 found and consistent (known dtype, shape of non-negative dims, offsets
// inside the data and matching numel x element size), 1 absent, -1 malformed (why names file and tensor).
int st_tensor(const StFile *st, const char *file, const char *name, StTensor *t, char *why, size_t cap);

// The header h as the file's JSON text, compact and padded with spaces to a multiple of 8 bytes (*len
// its length; free it).
char *st_header_text(json_t *h, size_t *len);

#endif
