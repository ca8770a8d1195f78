/* Shared between the libedgellm translation units; nothing here is exported.
 *
 *   util.c            errors, clocks, small-file reads: what every file calls
 *   plan.c            plan.bin read, every byte checked, programs built; their backends looked up by name
 *   loader.c          el_model: plan, backends opened, the weight store (offload/policy.c), tokenizer
 *   backends.c        the backend registry (edgellm_backend.h): built-ins and registered backends, by name
 *   steps.c           a program's steps walked for any backend: calls, routed bodies, expert guesses
 *   backend_tvm_cpu.c the TVM CPU backend: kernels.so (or linked-in kernels), runs a program's steps
 *   backend_opencl.c  the OpenCL backend: kernels.cl + kernels.cltab on a dlopened OpenCL driver
 *   context.c         el_context: KV cache, arena, position; prefill / decode over the programs
 *   generate.c        the one generation loop (sampling, stop rules, stop strings, text pieces)
 *   sampler.c         token sampling
 *   digest.c          sha256 and the package digest (SHA256SUMS)
 *   threadpool.c      the parallel runtime the kernels call
 */
#ifndef EDGELLM_INTERNAL_H
#define EDGELLM_INTERNAL_H
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "../../offload/store.h"
#include "../contract.h"
#include "../edgellm.h"
#include "../edgellm_backend.h"
#include "../tokenizer/tokenizer.h"
#include "../tvm_abi.h"

#define EL_API __attribute__((visibility("default")))
#define EL_HIDDEN __attribute__((visibility("hidden")))
#define EL_VERSION_STRING "0.2.0"

/* Sets the calling thread's el_last_error() text (printf format; one line). Returns -1 for `return el_error(...)`. */
EL_HIDDEN int el_error(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
EL_HIDDEN double el_now(void);
EL_HIDDEN int el_profiling(void); /* EDGELLM_PROFILE set: time every step */
EL_HIDDEN int el_env_flag(const char* name); /* an environment switch: set, not empty, not "0" */

/* A plan step, resolved at load. Steps are immutable after load (contexts share them); what a run patches (data
 * pointers, prefix lengths) lives on the runner's stack. */
typedef struct {
  uint32_t kind;           /* EL_STEP_* */
  uint32_t kernel;         /* CALL */
  const char* kernel_name; /* for messages */
  uint32_t n_args;
  const el_plan_arg* args; /* into the plan bytes */
  const uint64_t* row_bytes; /* [n_args] bytes of one row (shape[1..]), for AT_POS / PREFIX / SLOT */
  const DLTensor* proto;     /* [n_args] prepared tensors (data NULL; shape points into shapes) */
  const int64_t* shapes;     /* [4 * n_args] */
  /* ROUTE */
  uint32_t n_body, n_select, n_experts;
  uint64_t ids_offset;
  uint64_t weight_bytes; /* CALL: bytes of weights the kernel reads (its views; a lookup table: the looked-up rows) */
} el_step;

/* The programs this runtime knows, by index into EL_PROGRAM_NAMES (contract.h): the context's prefill and decode
 * loops name them; a plan's other programs are checked and skipped. Runtime-internal (plans name programs). */
enum {
  EL_PROG_PREFILL = 0,
  EL_PROG_PREFILL_LOGITS,
  EL_PROG_DECODE,
  EL_PROG_HEAD,
  EL_PROG_PREFILL_SHORT,
  EL_PROG_STAGE_EMBED, /* a staged prefill's first program ("npu_embed") */
  EL_PROG_STAGE_RUN,   /* and its second ("npu_prefill") */
  EL_PROG_VERIFY,      /* a few tokens with the logits of each (speculative decoding; optional) */
  EL_N_PROGRAMS
};
#define EL_MAX_MODEL_BACKENDS 8 /* distinct backends one model's programs may name */

typedef struct {
  int present;
  el_plan_program p;
  int slot; /* index into el_model.backends */
  uint32_t n_steps;
  el_step* steps;
  uint32_t* order; /* the weights its steps use, in first-use order (announced to the store when it starts) */
  uint32_t n_order;
} el_program;

/* A backend a model's programs name (loader.c): opened once per model, bound once per context. */
typedef struct {
  const el_backend* be;
  void* state;
  int open;
  uint32_t programs; /* bit k: program k runs on it */
} el_backend_slot;

/* plan.c: parses m->plan (m->plan_size bytes) into m->h, m->weights, m->kernels, m->prog and m->backends (the
 * backends looked up, not opened); 0, or -1 with the error set */
EL_HIDDEN int el_plan_read(el_model* m);

/* steps.c: walks program prog's steps for a backend, which makes each kernel call: call(user, c, prog, step index,
 * pos, expert, slot) with expert / slot the routed entry the call serves (-1 outside a route). */
typedef int (*el_step_call)(void* user, el_context* c, int prog, uint32_t si, int pos, int expert, int slot);
typedef struct {
  /* expert predictions (PREDICT steps): per weight w, predicted[w] = the run that guessed expert weight w and
   * predicted[n_weights + w] = the run that made a guess for the route whose first expert weight is w; a ROUTE
   * compares its selection with the guess of the same run (recall) */
  uint32_t* predicted; /* NULL until the first prediction */
  uint32_t serial;     /* runs so far */
} el_step_walk;        /* per context and backend, zeroed */
EL_HIDDEN int el_run_steps(el_context* c, int prog, int pos, el_step_walk* w, el_step_call call, void* user);
EL_HIDDEN void el_step_walk_free(el_step_walk* w);

/* weight_order.c: how the programs use the weights (for stores that stream them) */
typedef struct {
  uint32_t* seq;      /* weights in the order a decode token first uses them */
  uint32_t* seq_step; /* the decode step using seq[i] */
  uint32_t n_seq;
  uint8_t* must_pin;  /* per weight: read by a row lookup, used twice by a program, or routed */
} el_weight_use;
EL_HIDDEN uint64_t el_context_footprint(const el_model* m); /* one context's KV cache + arena */
EL_HIDDEN int el_weight_order(el_model* m); /* fills every program's order */
EL_HIDDEN int el_weight_use_of(const el_model* m, el_weight_use* u);
EL_HIDDEN void el_weight_use_free(el_weight_use* u);

EL_HIDDEN extern const el_backend el_backend_tvm_cpu;
EL_HIDDEN extern const el_backend el_backend_qnn_ort;
EL_HIDDEN extern const el_backend el_backend_opencl;
/* backends.c: the name a version 2/3 plan's backend index stands for (NULL: none); the registered names, joined */
EL_HIDDEN const char* el_backend_legacy_name(uint32_t index);
EL_HIDDEN int el_backend_names(char* out, size_t cap);

/* One backend option given at load (backend_options.c): pointers into el_model.backend_opts_text. */
typedef struct {
  const char* backend;
  const char* key;
  const char* value;
} el_backend_opt;
#define EL_MAX_BACKEND_OPTIONS 32
/* Checks el_load_options.backend_options against the registry and the package's backends and keeps a copy. */
EL_HIDDEN int el_backend_options_parse(el_model* m, const char* text);

#define EL_MAX_DRAFT 31 /* drafts per verify pass at most (the verify program's tokens - 1 bounds it too) */

struct el_model {
  el_plan_header h;
  uint8_t* plan; /* whole plan.bin; the tables point into it */
  size_t plan_size;
  const el_plan_weight* weights;
  const el_plan_kernel* kernels;
  el_program prog[EL_N_PROGRAMS];
  el_backend_slot backends[EL_MAX_MODEL_BACKENDS];
  int n_backends;
  el_weight_store* store;
  char* backend_opts_text; /* el_load_options.backend_options, copied and split */
  el_backend_opt backend_opts[EL_MAX_BACKEND_OPTIONS];
  int n_backend_opts;
  int staged_prefill;     /* prompts prefill through the staged programs (their backend opened) */
  char prefill_note[1024]; /* why not, when the staged prefill was asked for with AUTO and its backend did not open */
  el_tokenizer* tok; /* NULL: no tokenizer.bin */
  el_plan_kv_layer* kv_layers; /* n_layers: rows and window of each layer's cache (plan.bin v5, else defaults) */
  uint64_t* kv_offset;  /* 2 * n_layers + 1: byte offset of K(l) at [2l], V(l) at [2l + 1], the total at [2L] */
  int window_caches;    /* layers whose cache is a window cache (rows < kv_rows) */
  int kv_host_moves;    /* some program runs on a backend without EL_BACKEND_DEVICE_KV: move host cache rows too */
  uint64_t memory_budget; /* el_load_options.memory_budget (0: none) */
  uint64_t minimum_budget; /* the smallest memory_budget it loads with (weights streamed through a window) */
  int plan_only;          /* loaded to report its memory plan: no backends, no contexts */
  float settings[EL_N_SETTINGS]; /* run-time settings kernels read (EL_ARG_SETTINGS), from the load options */
  int expert_predict;     /* el_load_options.expert_predict */
  char device_note[512];  /* the device a GPU backend runs on, for el_model_device */
  int verified;           /* loaded with a digest: run only what SHA256SUMS covers (no cached GPU binaries) */
  uint8_t package_digest[32]; /* sha256 of SHA256SUMS (has_digest): what a saved context is checked against */
  int has_digest;
  uint32_t* routing;      /* routing.bin: per weight, calibration selections (NULL: none) */
  int n_threads;
  /* speculation (auto): what a verify pass of each token count costs in plain steps, as the contexts measured it
   * last (0: not yet). A context starts from these, so that the package's costs on this host are learned once per
   * model, not in every context's first passes (speculate.c). */
  float spec_steps[EL_MAX_DRAFT + 2];
  struct el_ngram_pool* pool; /* the n-gram pool the contexts share (ngram_pool.c; NULL until one speculates) */
  pthread_mutex_t mu; /* guards refs / freed / spec_steps / making the pool */
  int refs;           /* contexts alive */
  int freed;          /* el_model_free called: free when the last context goes */
};

#define EL_DFA_MASKS 32 /* constraint masks cached per automaton node (constraint.c) */

/* The bits of the K (v = 0) or V (v = 1) cache's elements: kv_dtype_bits holds K's, and V's in bits 8-15 where
 * they differ (0 there: as K's; contract.h). */
static inline uint32_t el_kv_bits(const el_plan_header* h, int v) {
  uint32_t k = h->kv_dtype_bits & 0xffu, vb = (h->kv_dtype_bits >> 8) & 0xffu;
  return v && vb ? vb : k;
}

/* Bytes of one K (v = 0) or V (v = 1) cache row: every KV head's head_dim elements of its bits (32: f32, 16: f16),
 * or, for the quantized caches, the codes then the scales (contract.h): 8 (q8) one float32 per head, 4 (q4) one
 * float16 per block of the largest power of two <= 32 dividing head_dim. */
static inline size_t el_kv_row_bytes(const el_plan_header* h, int v) {
  size_t elems = (size_t)h->n_kv_heads * h->head_dim;
  uint32_t bits = el_kv_bits(h, v);
  if (bits == 8) return elems + 4u * h->n_kv_heads;
  if (bits == 4) {
    uint32_t b = 1;
    while (b < 32 && h->head_dim % (2 * b) == 0) b *= 2;
    return elems / 2 + (h->version >= 8 ? 4u : 2u) * (elems / b); /* (step, minimum) per block; one scale before 8 */
  }
  return elems * (bits / 8);
}

/* Generation state (generate.c), one per context. */
typedef struct {
  int active;
  el_gen_params p;   /* stop_ids / stop_strings point into `owned` */
  char* owned;       /* the copies of stop ids and strings */
  int32_t* hist;     /* prompt + generated ids */
  int n_hist, cap_hist, n_prompt, n_gen;
  int pending;       /* 1: hist[n_hist-1] is sampled but not yet decoded into the context */
  int finish;
  char* text;        /* generated text (bytes), up to any stop string */
  size_t text_len, text_cap, emitted;
  size_t max_stop;   /* longest stop string */
  el_sampler* sampler;
  float* logits;     /* [vocab] the logits of the next draw */
  double t_start, prefill_s, decode_s, ttft_s;
  int n_decoded;
  /* speculative decoding (speculate.c): the last verify pass's drafts and logits rows, how many of its drafts the
   * samples took so far, and the controller's state */
  float* spec_logits; /* [EL_MAX_DRAFT + 1][vocab] */
  /* the pass's drafts: node i + 1 is spec_draft[i], following node spec_parent[i + 1] (node 0: the sampled token),
   * where its draft came from (EL_SRC_*), the node the samples reached and how many drafts they took */
  int32_t spec_draft[EL_MAX_DRAFT];
  int32_t spec_parent[EL_MAX_DRAFT + 1];
  uint8_t spec_src[EL_MAX_DRAFT + 1];
  float spec_q[EL_MAX_DRAFT + 1]; /* the draft model's probability of a node it drafted (-1: another source's) */
  int spec_n, spec_at, spec_taken;
  int spec_shadow; /* auto: drafts built but not verified (they would not pay); the next sample still rates them */
  /* token recycling (speculate.c): per token, the REC_K likeliest next ids of the last logits row computed after it
   * (-1: none yet), kept across generations; and per draft source, how often its drafts were offered and taken */
  int32_t* rec_next;
  float src_offered[8], src_taken[8];
  float src_q[8]; /* per source, the draft model's probabilities of the drafts offered, summed (its calibration) */
  /* the n-gram chain's drafts offered and taken: its first draft's and the later ones' (a copy runs on once it
   * starts: a later draft is taken more often than the first), apart for chains drafted while a copy runs
   * (chain_run: the last pass took its whole chain) and the others; and each pending node's place (-1: off it) */
  float chain_offered[2][2], chain_taken[2][2];
  int chain_run;
  int8_t spec_chain_i[EL_MAX_DRAFT + 1];
  int recycling; /* this generation keeps the table (recycle; auto where the verify program takes trees) */
  int pooling;   /* this generation adds its n-grams to the model's pool (it speculates) */
  /* an output constraint's allowed tokens for the next draw (el_generate_constrain): a bit per token */
  uint32_t* mask;
  int mask_on;
  el_draft_filter draft_filter; /* the constraint's check of a pass's drafts (el_generate_filter_drafts) */
  void* filter_user;
  int spec_wait, spec_backoff; /* auto: plain steps left before drafting again, and the next wait after a miss */
  /* EDGELLM_SPEC_UNGATED set (read as each generation starts): every draft is verified, whatever passes cost here;
   * what the drafters yield measured apart from what this host's timings make of it (tests, benches) */
  int spec_ungated;
  /* auto: running averages of a plain step's seconds and a verify pass's by its tokens (kept across generations:
   * they are the package's and the host's, not the text's; a program without EL_PROGRAM_ROWS costs the same for
   * any count, kept at its width); the pending pass's tokens */
  double spec_t_decode, spec_t_verify[EL_MAX_DRAFT + 2];
  int spec_m, spec_seeded; /* seeded: the counts the model had timed are in spec_t_verify */
  uint8_t spec_own[EL_MAX_DRAFT + 2]; /* the counts timed in this context (the others' times are seeded) */
  /* the draft model (el_gen_params.draft): the ids its context holds (their prefix shared with hist is valid), and
   * its logits */
  el_context* draft_ctx;
  int32_t* draft_fed;
  int draft_n, draft_cap, draft_off; /* draft_off: it failed once in this generation (its context is full): n-grams only */
  /* the pending pass's drafts came from the draft model (not n-grams), and its seconds; the model's own controller:
   * running averages of its passes' drafts taken and seconds, and plain steps to wait before it guesses again */
  int spec_from_model;
  double spec_t_pass, draft_taken_avg, draft_t_avg;
  int draft_passes, draft_wait, draft_backoff;
  float* draft_logits;
  /* staged drafting: the draft model's own verify pass over n-grams after its guesses (its rows [width][vocab]), how
   * many of those n-gram ids it was offered and took, and its running average seconds of a step and of a pass */
  size_t draft_rows_n;
  float* draft_rows;
  float stage_offered, stage_taken;
  double stage_t_decode, stage_t_verify;
  /* the generation's constraint automaton (constraint.c; NULL: none), the node it is at (-1: refused), its masks
   * cached per node (EL_DFA_MASKS slots, by node) and each token's bytes (for the model tok_model) */
  const el_constraint* dfa;
  int32_t dfa_node;
  uint32_t* dfa_masks;
  int32_t dfa_mask_node[EL_DFA_MASKS];
  const el_model* tok_model;
  uint32_t* tok_at;
  uint8_t* tok_bytes;
} el_gen;

struct el_context {
  el_model* m;
  pthread_mutex_t mu;
  uint8_t* arena;
  size_t arena_map;
  uint8_t* caches; /* K and V of every layer, at m->kv_offset: K(l) = [2l], V(l) = [2l + 1] */
  size_t caches_map;
  int* kv_base;    /* per layer: the position at row 0 of a window cache (0 for the others) */
  int pos, n_threads;
  int kv_high; /* cache rows [0, kv_high) may hold data: rows past pos there are stale (an earlier conversation's) */
  /* the last verify pass (el_verify_locked), while its drafts' cache rows can still be taken (any run drops them):
   * its nodes (0: none open), each one's parent, the position of node 0 and the node the context ends with */
  int spec_open, spec_root, spec_node;
  int32_t spec_parent[32], spec_ids[32];
  int32_t* ids; /* the token at each position [0, pos) (max_ctx of them): what a saved context and a shift keep */
  void* backend_ctx[EL_MAX_MODEL_BACKENDS]; /* per el_model.backends slot */
  uint64_t backend_bytes; /* what the backends allocated for this context (bind) */
  el_stats stats;
  double* prof_s; /* EDGELLM_PROFILE: per program step (prog_base offsets), seconds summed over runs */
  uint64_t* prof_runs;
  double prof_wall[EL_N_PROGRAMS];
  uint32_t prof_base[EL_N_PROGRAMS + 1];
  el_gen gen;
};

EL_HIDDEN uint8_t* el_cache_of(el_context* c, uint32_t kind, uint32_t layer);
/* Moves the context to position n <= pos (0 empties it); -1 with the error set where window caches no longer hold
 * the keys position n needs (context.c). */
EL_HIDDEN int el_set_pos(el_context* c, int n);
/* The lowest position besides 0 the context can go back to (window caches no longer hold the keys below it). */
EL_HIDDEN int el_kv_floor(const el_context* c);
/* The position a KV arg's AT_POS / PREFIX view is taken at: pos - the layer's base (window caches), else pos. */
static inline int el_view_pos(const el_context* c, const el_plan_arg* a, int pos) {
  return (a->kind == EL_ARG_KCACHE || a->kind == EL_ARG_VCACHE) ? pos - c->kv_base[a->index] : pos;
}
/* el_prefill / el_decode with the context already locked (the generation loop holds the lock). */
EL_HIDDEN int el_prefill_locked(el_context* c, const int32_t* ids, int n, float* logits, int all_logits);
EL_HIDDEN int el_decode_locked(el_context* c, int32_t id, float* logits);
EL_HIDDEN int el_verify_locked(el_context* c, const int32_t* ids, const int32_t* parents, int n, float* logits);
EL_HIDDEN int el_verify_accept(el_context* c, int node);
EL_HIDDEN int el_verify_tokens(const el_model* m);
EL_HIDDEN int el_spec_rows(const el_model* m);
EL_HIDDEN int el_spec_draft(el_context* c, el_gen* g);
EL_HIDDEN int el_spec_trees(const el_model* m); /* 1: the verify program takes drafts as a tree */
EL_HIDDEN int el_spec_draft_start(el_context* c, el_gen* g, el_context* draft, int cap);
EL_HIDDEN void el_spec_settle(el_gen* g, int taken);
/* Token recycling: a logits row computed after token `id` (no-op unless the generation recycles). */
EL_HIDDEN void el_spec_observe(el_gen* g, int32_t id, const float* logits, int vocab);
/* The sample drawn at node spec_at: the child it takes (> 0) or 0, with every child's source counted. */
EL_HIDDEN int el_spec_child(el_gen* g, int32_t sampled);
/* auto: the sample drawn after drafts that were built but not verified rates their sources as if they had been. */
EL_HIDDEN void el_spec_shadow(el_gen* g, int32_t sampled);
EL_HIDDEN void el_spec_time(double* avg, double seconds);
/* The n-gram pool across contexts (ngram_pool.c): add history h[0..n)'s 3-id keys with the ids after them (all:
 * every one; else the one its last id completed); draft up to max ids after its last 3 (0: none); free it. */
typedef struct el_ngram_pool el_ngram_pool;
EL_HIDDEN void el_pool_add(el_model* m, const int32_t* h, int n, int all);
EL_HIDDEN int el_pool_draft(el_model* m, const int32_t* h, int n, int max, int32_t* out);
EL_HIDDEN void el_pool_free(el_model* m);
EL_HIDDEN void el_spec_timed(el_model* m, el_gen* g, int tokens, double seconds); /* a verify pass's time */
/* The draft model's share of the counters (el_stats.spec_*_model): node 0, a pass's drafts; else the one taken. */
EL_HIDDEN void el_spec_count(el_stats* st, const el_gen* g, int node);
/* The constraint automaton (constraint.c): set up for a generation (a NULL one: none), the next draw's mask (1: the
 * text is complete, nothing may follow), the move after a draw, and the check of a pass's drafts. */
EL_HIDDEN int el_constraint_start(el_gen* g, const el_model* m, const el_constraint* a);
EL_HIDDEN int el_constraint_mask(el_gen* g, const el_model* m);
EL_HIDDEN void el_constraint_advance(el_gen* g, int32_t id);
EL_HIDDEN int el_constraint_drafts(void* user, const int32_t* ids, const int32_t* parents, int n, uint8_t* keep);
/* sampler.c: the one check of sampling parameters (0 or -1 with el_error set), and a sampler's heap bytes */
EL_HIDDEN int el_check_sampling(const el_sampler_params* p);
EL_HIDDEN size_t el_sampler_bytes(const el_sampler* s);
EL_HIDDEN void el_gen_release(el_gen* g); /* frees a generation's state (context free / reset) */
EL_HIDDEN void el_model_unref(el_model* m);

/* sha256 (digest.c) */
typedef struct {
  uint32_t h[8];
  uint64_t len;
  uint8_t buf[64];
  uint32_t fill;
} el_sha256;
EL_HIDDEN void el_sha256_init(el_sha256* s);
EL_HIDDEN void el_sha256_update(el_sha256* s, const void* data, size_t n);
EL_HIDDEN void el_sha256_final(el_sha256* s, uint8_t out[32]);
/* Checks every file SHA256SUMS lists against it, and SHA256SUMS against digest ("sha256:<64 hex>"). Files the
 * runtime loads (plan.bin, weights.bin, kernels.so, tokenizer.bin) must be listed. 0 or -1 with el_error set. */
EL_HIDDEN int el_verify_package(const char* dir, const char* digest);

/* Reads a whole small regular file (refuses FIFOs and devices without blocking); NULL with el_error set. */
EL_HIDDEN void* el_read_small_file(const char* path, const char* what, size_t max_bytes, size_t* size);
/* dir/rel into out when rel stays inside the package (relative, no "..", not a link out of it); else -1 with an
 * error naming `file`, the package file that listed it (digest.c) */
EL_HIDDEN int el_safe_relpath(const char* rel);
EL_HIDDEN int el_package_path(const char* dir, const char* rel, const char* file, char* out, size_t out_size);
/* rel (a small package file a backend parses: launch tables, NPU descriptors and tables) against its line in
 * SHA256SUMS, with or without a pinned digest: corruption and edits are refused before the file is parsed. A
 * package without SHA256SUMS passes (nothing to check against); one that does not list rel fails (digest.c). */
EL_HIDDEN int el_check_listed(const char* dir, const char* rel);

#include "threadpool.h"

#endif
