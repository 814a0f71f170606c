// hf.h: Hugging Face Llama checkpoints in and out (the ckpt row of DESIGN.md's layers): config.json and
// model.safetensors, or model-0000i-of-0000N.safetensors shards with model.safetensors.index.json.
//
// Tensors (HF's LlamaForCausalLM names; weights [out, in] as llm4d's linear layers, llm.c's convention):
//   model.embed_tokens.weight                      [V, C]
//   model.layers.L.input_layernorm.weight          [C]
//   model.layers.L.self_attn.q_proj.weight         [NH·hd, C]
//   model.layers.L.self_attn.k_proj.weight         [NKV·hd, C]
//   model.layers.L.self_attn.v_proj.weight         [NKV·hd, C]
//   model.layers.L.self_attn.o_proj.weight         [C, NH·hd]
//   model.layers.L.post_attention_layernorm.weight [C]
//   model.layers.L.mlp.gate_proj.weight            [F, C]
//   model.layers.L.mlp.up_proj.weight              [F, C]
//   model.layers.L.mlp.down_proj.weight            [C, F]
//   model.norm.weight                              [C]
//   lm_head.weight                                 [V, C]  (absent when tie_word_embeddings)
//
// RoPE and the q/k permutation: Meta's original checkpoints (consolidated.*.pth) apply RoPE to
// interleaved channel pairs (2i, 2i+1) of each head; HF's conversion script
// (convert_llama_weights_to_hf.py, its permute()) reorders the rows of wq and wk within each head so that
// HF's rotate-half RoPE, which pairs channel i with i + hd/2, computes the same attention:
//   w_hf = w_meta.view(heads, hd/2, 2, C).transpose(1, 2).reshape(heads·hd, C)
// (heads = num_attention_heads for wq, num_key_value_heads for wk): HF row h·hd + j·hd/2 + i is Meta row
// h·hd + 2i + j, for i < hd/2, j in {0, 1}. So HF's
// q_proj/k_proj rows are already in rotate-half order, and llm4d's RoPE (kernels.h: rotate-half, as HF)
// takes them as they are: no permutation in either direction, on reading or writing. Meta-format
// weights would need that permutation first; llm4d reads only HF's layout.
#ifndef LLM4D_HF_H
#define LLM4D_HF_H

#include <stddef.h>
#include <stdint.h>

#include "kernels.h"
#include "model.h"

typedef struct {
    int hidden_size, intermediate_size, num_attention_heads, num_key_value_heads, num_hidden_layers;
    int head_dim; // hidden_size / num_attention_heads (a "head_dim" member must agree)
    int vocab_size, max_position_embeddings, tie_word_embeddings;
    double rms_norm_eps, rope_theta;
    // rope_scaling: none, or {"rope_type": "llama3", factor, low_freq_factor, high_freq_factor,
    // original_max_position_embeddings} (Llama 3.1)
    int rope_llama3;
    double rope_factor, rope_low_freq_factor, rope_high_freq_factor;
    int rope_original_max_pos;
    char torch_dtype[16]; // "float32", "bfloat16" or "float16"
} HFConfig;

// Reads DIR/config.json, every member range-checked; dies with one line naming the file and the field.
// Optional members take HF LlamaConfig's defaults (num_key_value_heads = num_attention_heads,
// rope_theta 10000, rms_norm_eps 1e-6, no rope_scaling, tie_word_embeddings false, torch_dtype float32,
// max_position_embeddings 2048).
void hf_config_read(const char *dir, HFConfig *c);
// The config's RoPE as the kernels take it.
RopeConfig hf_rope(const HFConfig *c);
// Expected shape of HF tensor `name` under the config (see the table above): its rank (1 or 2), or 0
// when the name is not one of the model's tensors.
int hf_tensor_shape(const HFConfig *c, const char *name, int64_t shape[2]);
// The model's tensor names in HF's order (embed_tokens, each layer's tensors, norm, lm_head unless
// tied): name i of hf_tensor_count(c); writes it into buf.
int hf_tensor_count(const HFConfig *c);
void hf_tensor_name(const HFConfig *c, int i, char *buf, size_t cap);

// An opened checkpoint: model.safetensors (preferred, as transformers does) or the index and its shards,
// mapped read-only. Every malformed file dies with one line naming it.
typedef struct HFCheckpoint HFCheckpoint;
HFCheckpoint *hf_open(const char *dir);
void hf_close(HFCheckpoint *h);
int hf_nfiles(const HFCheckpoint *h);
// Dtype ("F32", "BF16", "F16") and shape of a tensor; 0, or -1 when absent.
int hf_info(const HFCheckpoint *h, const char *name, char dtype[8], int *ndim, int64_t shape[8]);
// Tensor `name` converted to fp32 into dst, after checking that its shape is shape[0..ndim); dies naming
// the tensor and file when it is missing, of another shape, or of a dtype other than F32, BF16, F16.
void hf_read(const HFCheckpoint *h, const char *name, int ndim, const int64_t *shape, float *dst);

// One tensor to write: fp32 values of the given shape.
typedef struct {
    const char *name;
    int ndim;
    int64_t shape[2];
    const float *data;
} HFTensor;
// Writes DIR/config.json and the tensors in dt (fp32 or bf16, round to nearest even), in order: one
// model.safetensors when they total at most max_shard_bytes, else shards of at most that much (a
// tensor larger than it alone in its shard) with model.safetensors.index.json. Every file through the
// safe-write path; a stale model.safetensors or index of the other layout is removed.
void hf_save(const char *dir, const HFConfig *c, const HFTensor *t, int n, DType dt, uint64_t max_shard_bytes);

// ---------------------------------------------------------------------------------------------
// A checkpoint as llm4d's model (model.h: the Llama slots of the tensor table, the full fp32 vector in
// llm.c's file order) and back. The shape:
//   hidden_size C, intermediate_size F, num_attention_heads NH, num_key_value_heads NKV,
//   num_hidden_layers L, vocab_size V (Vp: V rounded up to a multiple of 128), max_position_embeddings
//   maxT, rms_norm_eps norm_eps (fp32, as HF adds it to fp32 statistics; written back as the shortest
//   decimal that rounds to it), rope_theta and rope_scaling "llama3" the RoPE (kernels.h's RopeConfig),
//   tie_word_embeddings tie; arch llama. head_dim must be C / NH (hf_config_read checks it).
// The tensors, each a contiguous piece of the vector (so reading and writing copy nothing twice):
//   embed_tokens -> wte rows 0..V-1 (rows V..Vp-1 zero; dropped on writing)
//   layer l: input_layernorm -> ln1w[l]; q_proj, k_proj, v_proj -> qkvw[l] rows 0..NH·hs-1, then
//   NKV·hs rows of k, then NKV·hs of v; o_proj -> attprojw[l]; post_attention_layernorm -> ln2w[l];
//   gate_proj, up_proj -> fcw[l] rows 0..F-1, F..2F-1; down_proj -> fcprojw[l]
//   norm -> lnfw; lm_head -> lmhead rows 0..V-1 (untied only; padding zero)
// No row is permuted (see the RoPE note above).
// The shape of a config (dir names the file in errors); dies with one line when llm4d cannot hold it.
GPT2Config hf_model_config(const HFConfig *c, const char *dir);
// The config of a Llama shape (the inverse of hf_model_config; torch_dtype float32).
void hf_config_of_model(const GPT2Config *cfg, HFConfig *c);
// Where HF tensor i (hf_tensor_name's order) lies in the full vector of cfg: its first element.
size_t hf_model_offset(const GPT2Config *cfg, int i);
// DIR's config and weights (any of F32, BF16, F16, widened exactly) as cfg and a new full fp32 vector.
float *hf_load_model(const char *dir, GPT2Config *cfg);
#define HF_MAX_SHARD_BYTES ((uint64_t)5 << 30) // transformers' default max_shard_size, 5 GB
// The full fp32 vector of a Llama shape as an HF checkpoint (hf_save: dt fp32 or bf16, sharding).
void hf_save_model(const char *dir, const GPT2Config *cfg, const float *params, DType dt, uint64_t max_shard_bytes);

// `train hf-inspect DIR [--dump OUT] [--via-model RAW] [--save-hf OUT2 [--dtype fp32|bf16] [--max-shard-bytes N]]`: a
// tool: prints the config and every tensor (dtype, shape), reading each with the shape checks; --dump
// writes each as raw fp32 OUT/NAME.bin; --save-hf writes the checkpoint again with hf_save. Returns the
// exit status.
int hf_inspect_main(int argc, char **argv);

#endif
