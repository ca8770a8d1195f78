/* libedgellm: executes an edgellm package (plan.bin + kernels.so + weights.bin) with no TVM at run time.
 *
 * All functions that can fail return NULL or a negative code; el_last_error() then holds a one-line
 * message (thread-local) naming the problem and, where there is one, the fix.
 */
#ifndef EDGELLM_H
#define EDGELLM_H
#include <stdint.h>
#ifdef __cplusplus
extern "C" {
#endif

typedef struct el_model el_model;
typedef struct el_sampler el_sampler;

const char* el_last_error(void);
const char* el_version(void);

/* Load a package directory. n_threads <= 0: one thread per online CPU. */
el_model* el_load(const char* package_dir, int n_threads);
void el_free(el_model* m);

int el_vocab(const el_model* m);
int el_max_context(const el_model* m);
int el_chunk(const el_model* m);
int el_pos(const el_model* m);          /* tokens currently in the KV cache */
int el_threads(const el_model* m);
int el_eos_ids(const el_model* m, int32_t* out, int cap);  /* returns count */
int el_bos_id(const el_model* m);

/* Forget the context (KV cache position back to 0). */
int el_reset(el_model* m);

/* Append n tokens to the context in chunks of el_chunk() (the last chunk padded and masked).
 * logits may be NULL; if all_logits, it receives [n, vocab] floats, else the last row [vocab].
 * Fails (and changes nothing) if pos + n > max_context or n <= 0. */
int el_prefill(el_model* m, const int32_t* ids, int n, float* logits, int all_logits);

/* Append one token; logits [vocab] may be NULL. */
int el_decode(el_model* m, int32_t id, float* logits);

/* Sampling. temperature <= 0 means greedy (argmax; ties to the lowest id). top_k <= 0: off; top_p >= 1: off;
 * repetition_penalty == 1: off (CTRL-style: logit/p if > 0 else logit*p, for every id in history). */
typedef struct {
  float temperature;
  int32_t top_k;
  float top_p;
  float repetition_penalty;
  uint64_t seed;
} el_sampler_params;

el_sampler* el_sampler_new(const el_sampler_params* p);
void el_sampler_free(el_sampler* s);
/* Picks a token from logits[vocab] (modified in place). history may be NULL. */
int32_t el_sample(el_sampler* s, float* logits, int vocab, const int32_t* history, int n_history);

/* Counters since load or the last el_reset_stats(). */
typedef struct {
  uint64_t weight_bytes_resident;  /* bytes of weights the store holds */
  uint64_t kernel_calls;
  double prefill_seconds;
  double decode_seconds;
  uint64_t prefill_tokens;
  uint64_t decode_tokens;
  uint64_t weight_bytes_huge;      /* of the resident bytes, those in transparent huge pages */
} el_stats;
void el_get_stats(const el_model* m, el_stats* out);
void el_reset_stats(el_model* m);

#ifdef __cplusplus
}
#endif
#endif
