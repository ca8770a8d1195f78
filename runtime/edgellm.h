/* libedgellm: runs an edgellm package (plan.bin + kernels + weights.bin) with no TVM and no Python.
 *
 *   el_model    the package: plan, kernels, weight store, tokenizer. Read-only once loaded, shared.
 *   el_context  one conversation over a model: KV cache, activation arena, position, sampler, counters.
 *               Many contexts per model; distinct contexts may be used from distinct threads at once (their
 *               kernels share one process-wide thread pool, so they interleave rather than run in parallel).
 *               Each context function locks the context: misuse from two threads is serialised per call,
 *               never a crash, but a generation belongs to one caller at a time.
 *   el_generate the one generation loop (prefill, sample, stop rules, stop strings, text pieces) that every
 *               front end calls: Python, edgellm-run, the Android app, the server.
 *
 * Functions that can fail return NULL or a negative code; el_last_error() then holds a one-line message
 * (thread-local) naming the problem and, where there is one, the fix.
 */
#ifndef EDGELLM_H
#define EDGELLM_H
#include <stddef.h>
#include <stdint.h>
#ifdef __cplusplus
extern "C" {
#endif

typedef struct el_model el_model;
typedef struct el_context el_context;
typedef struct el_sampler el_sampler;
typedef struct el_constraint el_constraint;

const char* el_last_error(void);
const char* el_version(void);

/* Model ------------------------------------------------------------------------------------------------------ */

typedef struct {
  int32_t n_threads;        /* default threads of the model's contexts; <= 0: one per online CPU */
  int32_t huge_pages;       /* resident weights in transparent huge pages: -1 auto, 0 never, 1 always */
  int32_t use_mmap;         /* 1: map weights.bin (default); 0: read it into memory */
  int32_t prefill_backend;  /* EL_PREFILL_*: where prompts are prefilled (android-npu packages) */
  uint64_t memory_budget;   /* bytes the model may use: the weights it holds + one context's KV cache and
                               activation arena (0: no limit). Weights that do not fit are streamed from the
                               package every token (policy "window"); el_model_memory says how. */
  const char* weight_policy; /* "resident" (all weights in memory), "window" (stream what the budget cannot hold),
                                "experts" (MoE: every other weight held, experts read into a cache when selected or
                                guessed), NULL/"auto": resident when everything fits the budget, else experts for
                                MoE packages whose other weights fit, else window */
  const char* digest;        /* "sha256:<hex>" of the package's SHA256SUMS: every file is checked against it
                                before anything is loaded or run (NULL: no check) */
  /* Streamed weights (policy "window"): */
  const char* storage;        /* storage profile the reads are shaped to: "native" (NULL: this disk as it is),
                                 "sd", "emmc" (throttled real reads), "ufs3", "ufs4" (modelled: served from RAM) */
  int32_t io_threads;         /* reader threads (<= 0: 2) */
  int32_t direct_io;          /* 1: O_DIRECT reads; 0 (default): buffered with read-ahead, dropped from the page
                                 cache once read */
  int32_t plan_only;          /* 1: only plan the memory (el_model_memory); reads no weights, makes no contexts */
  float ffn_threshold;        /* neuron-bundled packages (--layout bundled): skip FFN neuron groups whose estimated
                                 output is below this (0: exact, every group runs; < 0: the package's default) */
  /* Expert cache (policy "experts", MoE packages): */
  const char* expert_eviction; /* which cached expert makes room: "freq" (selected most lately, counts decaying;
                                  NULL: this), "lru", "lfu" */
  int32_t expert_predict;      /* 1: run the package's guesses of later layers' experts (PREDICT steps) and read the
                                  guessed ones ahead; 0 (default): read experts only once selected */
  int32_t no_expert_warm;      /* 1: start with an empty expert cache (default: fill it at load with the experts
                                  calibration selected most, from the package's routing.bin) */
  /* The backends' own options, opaque to the core: "backend.key=value" lines (NULL: none), each read by the backend
   * it names (el_backend_option); el_backend_options_add appends one. A key the backend does not declare is a load
   * error, and so is a set value (other than "" or "auto") for a backend the package does not use. Built in:
   *   qnn_ort.npu_soc         the SoC whose prepared EPContext graphs to load ("sm8650", ...); unset/"auto": this
   *                           phone's (/sys/devices/soc0/soc_id) when the package has it, else the ONNX graphs;
   *                           "none": the ONNX graphs (prepared at load: slow first load)
   *   qnn_ort.ort_library     libonnxruntime.so to dlopen (unset: "libonnxruntime.so", the loader's search)
   *   qnn_ort.qnn_ep_library  the QNN EP as a plugin library (onnxruntime-qnn wheel; unset: built into ORT)
   *   qnn_ort.qnn_backend     the QNN backend library (unset: "libQnnHtp.so")
   *   opencl.device           the OpenCL device: "P:D" (platform and device index) or part of its name; unset:
   *                           EDGELLM_OPENCL_DEVICE, else the first GPU, else the first OpenCL device */
  const char* backend_options;
} el_load_options;

/* el_load_options.prefill_backend. AUTO: the NPU when the package has NPU graphs and ONNX Runtime with the QNN EP
 * loads, else the CPU (el_model_prefill_backend says which). NPU: the NPU or a load error. */
enum { EL_PREFILL_AUTO = 0, EL_PREFILL_CPU = 1, EL_PREFILL_NPU = 2 };

void el_load_options_init(el_load_options* o); /* the defaults above */
/* Appends "backend.key=value\n" to the NUL-terminated buf (cap bytes): 0, or -1 with el_last_error() set when it does
 * not fit or a part is empty or holds a line break (or the backend / key a '.' or '='). */
int el_backend_options_add(char* buf, size_t cap, const char* backend, const char* key, const char* value);
/* A size as every front end spells it: bytes, or a decimal number with a unit (case-insensitive): K/KiB/M/MiB/G/GiB/
 * T/TiB are powers of 2^10, KB/MB/GB/TB of 10^3 ("600MB" = 600,000,000; "600M" = "600MiB" = 629,145,600). Returns 0,
 * or -1 with el_last_error() set. */
int el_parse_bytes(const char* s, uint64_t* out);
/* Loads a package directory; opt may be NULL (defaults). */
el_model* el_model_load(const char* package_dir, const el_load_options* opt);
/* Frees the model once its last context is freed (contexts keep it alive). */
void el_model_free(el_model* m);

/* How the model uses memory (the weight store's layout; planning needs no weight reads: plan_only). */
typedef struct {
  char policy[16];           /* "resident" | "window" */
  char storage[16];          /* storage profile */
  char storage_what[96];     /* its one-line description */
  uint64_t budget;           /* el_load_options.memory_budget (0: none) */
  uint64_t context_bytes;    /* one context's KV cache + activation arena, counted in the budget */
  uint64_t weights_bytes;    /* all weights (weights.bin) */
  uint64_t pinned_bytes;     /* weights held in memory for the life of the model */
  uint64_t window_bytes;     /* the ring streamed weights pass through */
  uint64_t cache_bytes;      /* page cache the buffered reads may hold (the device's read-ahead), in the budget */
  uint64_t mapped_bytes;     /* tables read by row lookup (embeddings), served a page per row from a file mapping */
  uint64_t streamed_bytes;   /* weights read from storage per token */
  uint64_t minimum_budget;   /* the smallest memory_budget this package loads with (policy window) */
  uint32_t pinned_weights, streamed_weights;
  uint32_t requests_per_token; /* storage requests per token */
  int32_t storage_modelled;  /* 1: reads are served from RAM at the profile's speed (timings are a model) */
  int32_t direct_io;         /* 1: reads bypass the page cache */
  int32_t reserved;
  double storage_bytes_per_s; /* 0: unthrottled */
  double storage_latency_s;
  uint64_t routed_bytes;       /* weights read only when a routed step selects them (neuron bundles, experts) */
  uint64_t routed_cache_bytes; /* the cache holding the recently selected ones */
} el_memory_plan;
int el_model_memory(const el_model* m, el_memory_plan* out);
/* out[i] = 1 if weight i stays in memory, 0 if it is streamed; returns the number of weights (<= cap written). */
int el_model_weights_pinned(const el_model* m, uint8_t* out, int cap);

int el_vocab(const el_model* m);
int el_max_context(const el_model* m);
int el_chunk(const el_model* m);
int el_model_threads(const el_model* m);
int el_bos_id(const el_model* m);                          /* -1 if none */
int el_eos_ids(const el_model* m, int32_t* out, int cap); /* returns the count */
int el_has_tokenizer(const el_model* m);                  /* 1: tokenizer.bin loaded (text and stop strings) */
/* EL_PREFILL_NPU or EL_PREFILL_CPU: where this model prefills. With AUTO and an NPU that did not open, note (may be
 * NULL) gets the reason. */
int el_model_prefill_backend(const el_model* m, char* note, int cap);
/* The GPU a package's OpenCL programs run on (name, memory, whether the program came from the binary cache);
 * returns the length, or 0 for packages that run on the CPU. */
int el_model_device(const el_model* m, char* out, int cap);
/* Empties the n-gram pool the model's contexts share for speculative decoding (the ids that followed each 3-id
 * n-gram they read or wrote): later drafts come from each context's own history again. */
void el_model_forget_drafts(el_model* m);

/* Text through the package's tokenizer.bin (-1 without one). el_encode is snprintf-like: returns how many ids
 * the text gives, writing at most cap; add_special < 0: the tokenizer's default (HF add_special_tokens=True). */
int el_encode(const el_model* m, const char* text, int len, int add_special, int32_t* out, int cap);
/* Bytes of one token's text (special tokens give ""); returns the length, writes at most cap. */
int el_token_text(const el_model* m, int32_t id, char* buf, int cap);

/* Context ---------------------------------------------------------------------------------------------------- */

/* n_threads <= 0: the model's. */
el_context* el_context_new(el_model* m, int n_threads);
void el_context_free(el_context* c);
el_model* el_context_model(const el_context* c);
int el_context_threads(const el_context* c);
int el_pos(const el_context* c); /* tokens in the KV cache */
int el_reset(el_context* c);     /* forget the conversation (position 0); cancels a generation in progress */
/* Keep only the first n tokens of the conversation (0 <= n <= el_pos): the next prefill continues from there, so a
 * prompt that shares a prefix with what the cache holds prefills only the rest. Cancels a generation in progress. */
int el_rewind(el_context* c, int n);
/* The lowest n besides 0 el_rewind accepts: sliding-window layers keep only the keys their window still needs
 * (0 for packages without window caches, and until a conversation passes such a cache's rows). */
int el_rewind_floor(const el_context* c);
/* The token ids the context holds (position 0 on), up to cap of them into out; returns el_pos. */
int el_context_tokens(const el_context* c, int32_t* out, int cap);
/* Saves the context's state to path: the KV cache rows, position and token ids of its first n tokens (n < 0: all it
 * holds; n below el_rewind_floor is refused), written atomically (a temporary file renamed over path). CPU packages
 * with a SHA256SUMS. */
int el_context_save(el_context* c, const char* path, int n);
/* Loads a state saved from the same package with the same load settings into c, replacing what it held; returns
 * the tokens it now holds (el_pos; el_context_tokens reads them) or -1: another package or settings, a damaged or
 * truncated file (the context is then left empty, never half-loaded). Cancels a generation in progress. */
int el_context_load(el_context* c, const char* path);

/* Appends n tokens (chunks of el_chunk(), the last padded and masked). logits may be NULL; all_logits: [n, vocab]
 * floats, else the last row [vocab]. Fails and changes nothing if pos + n > max context or n <= 0. */
int el_prefill(el_context* c, const int32_t* ids, int n, float* logits, int all_logits);
/* Appends one token; logits [vocab] may be NULL. */
int el_decode(el_context* c, int32_t id, float* logits);
/* Speculative decoding with a front end's own drafts: ids[0] (the next token) and n - 1 drafts after it in one pass
 * of the verify program (n <= el_verify_width); logits gets a row per id [n, vocab]. The context then holds ids[0];
 * el_verify_take(k) appends the first k drafts, whose cache rows the pass wrote (any other call drops them). */
int el_verify(el_context* c, const int32_t* ids, int n, float* logits);
int el_verify_width(const el_model* m); /* tokens per verify pass (0: the package has no verify program) */
int el_verify_take(el_context* c, int k);
/* The same with the drafts as a tree: draft i (1 <= i < n) follows node parents[i] < i (node 0 is ids[0]; siblings
 * should differ) and sits at the position of its depth. el_verify_take_node(node) appends a child of the node the
 * context ends with (its cache row moved to its position); el_verify_take(k) follows a chain. Packages compiled
 * before trees take chains only (parents[i] = i - 1). */
int el_verify_tree(el_context* c, const int32_t* ids, const int32_t* parents, int n, float* logits);
int el_verify_take_node(el_context* c, int node);
int el_verify_node(el_context* c); /* the node of the last verify pass the context ends with (0: none taken) */

/* Generation ------------------------------------------------------------------------------------------------- */

typedef struct {
  int32_t max_new_tokens;   /* tokens to generate at most (the context's end also stops it) */
  float temperature;        /* 0: greedy (argmax; ties to the lowest id) */
  int32_t top_k;            /* 0: off */
  float top_p;              /* 1: off */
  float min_p;              /* 0: off; keeps tokens with p >= min_p * p(best) */
  float repetition_penalty; /* 1: off; CTRL-style over prompt and generated ids (applies when greedy too) */
  float presence_penalty;   /* 0: off; OpenAI-style, over generated ids */
  float frequency_penalty;  /* 0: off; OpenAI-style, per occurrence in generated ids */
  uint64_t seed;
  int32_t ignore_eos;       /* 1: keep going past the model's end-of-sequence ids */
  int32_t keep_context;     /* 0: start from an empty context; 1: append the prompt to what the context holds */
  int32_t n_stop_ids;       /* extra token ids that end the generation (not part of the output) */
  const int32_t* stop_ids;
  int32_t n_stop_strings;   /* UTF-8 strings that end the generation; the text never contains any part of them */
  const char* const* stop_strings;
  int32_t n_cached;         /* with keep_context: the first n_cached prompt ids are the context's last n_cached tokens
                               (el_rewind to where they end): they count as prompt (penalties, prompt_tokens) but are
                               not prefilled again. 0 <= n_cached < n (the last prompt token is always run) */
  int32_t speculate;        /* EL_SPECULATE_*: draft tokens and verify them several per pass over the weights; the
                               tokens are those plain decoding draws (same seed, same tokens), up to float rounding */
  int32_t draft_max;        /* drafts per pass at most (0: the package's verify width - 1) */
  el_context* draft;        /* a draft model's context (a smaller model with the same vocabulary, el_draft_check):
                               with speculate auto or ngram, where no n-gram matches, its greedy guesses are the
                               drafts. The generation owns it while it runs (NULL: none) */
  int32_t context_shift;    /* 1: when the context is full, keep its first shift_sinks tokens (attention sinks) and
                               its newest ones, drop shift_tokens between them, run the kept ones again at their new
                               positions and go on; 0: stop with EL_FINISH_CONTEXT */
  int32_t shift_sinks;      /* tokens kept at the start (default 4) */
  int32_t shift_tokens;     /* tokens dropped per shift (0: half of those after the sinks) */
  const el_constraint* constraint; /* the output's automaton (el_constraint_load; NULL: none): only the tokens it
                                      takes are drawn, and the end-of-sequence ids only where the text is complete
                                      (a complete text that nothing may follow ends with EL_FINISH_STOP) */
} el_gen_params;

/* A constraint for the output: a byte automaton compiled on the host from a JSON schema or a regular expression
 * (`edgellm schema SCHEMA.json -o FILE`); one file serves every package. NULL and el_last_error() if the file is
 * not one. The generations that use it must end before it is freed. */
el_constraint* el_constraint_load(const char* path);
void el_constraint_free(el_constraint* a);

/* 0 if `draft` can draft for `target`: the same vocabulary, token for token; else -1 and el_last_error() says
 * where they differ. Front ends call it once when they load a draft package. */
int el_draft_check(const el_model* target, const el_model* draft);

enum {
  EL_SPECULATE_OFF = 0,
  EL_SPECULATE_AUTO = 1,  /* n-gram drafts where they pay: backs off to plain decoding while they miss */
  EL_SPECULATE_NGRAM = 2, /* n-gram drafts (prompt lookup over the prompt and the reply) whenever one matches */
  EL_SPECULATE_RECYCLE = 3, /* every pass: a tree of the n-gram chain and recycled tokens (the likeliest next tokens
                               the model computed after each token before, refused drafts' rows included) */
};

/* The package's defaults (from its generation_config.json: sampled where it says do_sample, else greedy;
 * penalties as it sets them), max_new_tokens 128, a seed from /dev/urandom. Front ends start from these and
 * override what the user gave, so that every front end draws the same tokens for the same arguments. */
void el_gen_params_default(const el_model* m, el_gen_params* p);

enum {
  EL_FINISH_NONE = 0,
  EL_FINISH_EOS = 1,       /* the model's end-of-sequence id */
  EL_FINISH_STOP = 2,      /* a stop id or stop string */
  EL_FINISH_LENGTH = 3,    /* max_new_tokens */
  EL_FINISH_CONTEXT = 4,   /* the context is full */
  EL_FINISH_CANCELLED = 5, /* the callback asked to stop, or el_reset() */
};

typedef struct {
  int32_t token;        /* the token generated, or (finish events) the id that ended it, or -1 */
  int32_t finish;       /* EL_FINISH_NONE while generating; else why it ended (this event is the last) */
  const char* text;     /* bytes safe to show now: never half a UTF-8 character, never part of a stop string */
  int32_t text_len;
  const float* logits;  /* the vocab logits `token` was drawn from (before penalties); NULL if none */
} el_event;

typedef struct {
  int32_t prompt_tokens, generated_tokens, finish;
  double prefill_seconds, decode_seconds, ttft_seconds; /* ttft: start -> first token sampled */
  int32_t decoded_tokens;                               /* decode steps run (tokens per second = these / seconds) */
} el_gen_result;

/* Step by step: start prefills the prompt; each next() fills ev and returns 1 for a new token (ev->finish set if it
 * is the last), 0 when the generation ended without a new token (ev->finish says why; ev->text holds the last of
 * the text), -1 on error. A new start, el_reset or el_context_free ends the previous generation. */
int el_generate_start(el_context* c, const int32_t* prompt, int n, const el_gen_params* p);
int el_generate_next(el_context* c, el_event* ev);
/* An output constraint (a grammar engine's mask): the next draw of el_generate_next takes only tokens whose bit is
 * set (bit i % 32 of allowed[i / 32]; n_words >= (vocab + 31) / 32); the draw after it is free again unless this is
 * called again. With speculation the draw picks among the drafts as usual: a draft the mask forbids is never
 * taken. */
int el_generate_constrain(el_context* c, const uint32_t* allowed, int n_words);
/* The constraint's check of a verify pass's drafts, before the pass: filter(user, ids, parents, n, keep) sees the
 * n drafts (draft i follows node parents[i]: 0 is the token just sampled, j > 0 draft j - 1) and sets keep[i] to 1
 * for those the constraint allows after their path; the others, and what follows them, are dropped, so the pass's
 * rows go to drafts that can be taken (a nonzero return keeps them all). For this generation (el_generate_start
 * clears it); NULL: none. */
typedef int (*el_draft_filter)(void* user, const int32_t* ids, const int32_t* parents, int n, uint8_t* keep);
int el_generate_filter_drafts(el_context* c, el_draft_filter filter, void* user);
void el_generate_result(const el_context* c, el_gen_result* out);

/* The loop in one call: on_event (may be NULL) sees every event; returning nonzero cancels. */
typedef int (*el_on_event)(void* user, const el_event* ev);
int el_generate(el_context* c, const int32_t* prompt, int n, const el_gen_params* p, el_on_event on_event,
                void* user, el_gen_result* out);

/* Sampler (used by el_generate; exported for tests and for callers that sample their own logits) ------------- */

typedef struct {
  float temperature;
  int32_t top_k;
  float top_p;
  float min_p;
  float repetition_penalty;
  float presence_penalty;
  float frequency_penalty;
  uint64_t seed;
} el_sampler_params;

el_sampler* el_sampler_new(const el_sampler_params* p);
void el_sampler_free(el_sampler* s);
/* Draws a token from logits[vocab] (not modified). history: prompt then generated ids; the repetition penalty
 * applies to all of them, presence/frequency penalties to history[n_prompt..]. Returns the id or -1. */
int32_t el_sample(el_sampler* s, const float* logits, int vocab, const int32_t* history, int n_history, int n_prompt);

/* Counters ----------------------------------------------------------------------------------------------------- */

typedef struct {
  uint64_t weight_bytes_resident; /* bytes of weights the model's store holds */
  uint64_t weight_bytes_huge;     /* of those, bytes in transparent huge pages */
  uint64_t kernel_calls;          /* this context's, since it was made or el_reset_stats() */
  double prefill_seconds;
  double decode_seconds;
  uint64_t prefill_tokens;
  uint64_t decode_tokens;
  uint64_t kv_bytes;      /* this context's KV cache */
  uint64_t arena_bytes;   /* this context's activation arena */
  uint64_t context_bytes; /* everything this context allocated: KV + arena + the kernels' argument bindings (about
                             100 bytes per kernel argument) + logits and sampler buffers (O(vocab)) */
  /* the model's weight store since load (shared by its contexts; 0 for the resident policy): */
  uint64_t io_bytes_read;  /* bytes read from storage (pinned weights at load included) */
  uint64_t io_requests;
  uint64_t io_hits;        /* weight acquires whose reads had landed */
  uint64_t io_misses;      /* acquires that waited for reads */
  uint64_t io_dropped;     /* prefetched weights thrown away unused */
  double io_stall_seconds; /* time kernels waited for reads */
  /* routed steps (neuron groups of bundled FFNs, experts): ids run, and ids there were room for */
  uint64_t routed_selected;
  uint64_t routed_possible;
  uint64_t io_routed_hits;   /* selected routed weights found in the store's cache */
  uint64_t io_routed_misses; /* selected routed weights read from storage */
  /* bytes of weights this context's kernels read (each kernel's weight views; an embedding lookup counts its rows;
     the experts / neuron groups a routed step did not select are not read), in all programs and in decode steps */
  uint64_t weight_bytes_read;
  uint64_t decode_weight_bytes_read;
  /* expert predictions (MoE packages compiled with them, on a store that reads ahead): experts the routes selected
     where a guess was made for that route, and of those the ones the guess named (recall = predicted / checked) */
  uint64_t expert_predict_checked;
  uint64_t expert_predicted;
  /* the expert cache (policy "experts"), in decode steps: experts the routes selected, and of those the ones found
     held (cached or pinned), found read or being read because a guess named them, and the ones a kernel had to wait
     for (stalls); reads the guesses issued and the ones evicted unused; storage bytes and wait time */
  uint64_t expert_selected;
  uint64_t expert_cached;
  uint64_t expert_prefetched;
  uint64_t expert_stalls;
  uint64_t expert_predict_reads;
  uint64_t expert_predict_wasted;
  uint64_t decode_io_bytes_read;
  double decode_io_stall_seconds;
  /* window caches (sliding-window layers given only the rows their window needs): times one moved its newest rows
     to its start */
  uint64_t kv_window_moves;
  /* speculative decoding: verify passes run, draft tokens they carried, drafts the samples took (each taken draft is
     a token generated without a pass of its own) */
  uint64_t spec_passes;
  uint64_t spec_drafted;
  uint64_t spec_accepted;
  /* context shifts (el_gen_params.context_shift): times a full context dropped tokens to go on, and the tokens its
     kept ones took to run again */
  uint64_t context_shifts;
  uint64_t shift_tokens_run;
  /* of spec_drafted / spec_accepted, the draft model's (el_gen_params.draft): its guesses and, where it was unsure,
     its second and third choices (branches of the tree); and of those taken, the branches */
  uint64_t spec_drafted_model;
  uint64_t spec_accepted_model;
  uint64_t spec_accepted_branch;
} el_stats;
void el_get_stats(const el_context* c, el_stats* out);
void el_reset_stats(el_context* c);

#ifdef __cplusplus
}
#endif
#endif
