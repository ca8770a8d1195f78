/* The package contract, C side: file names, format versions, plan.bin struct layouts, codes and program names.
 *
 * Its Python twin is runtime/contract.py (the compiler writes what this header reads); tests/test_contract.py
 * compiles this header and checks every value, struct size and field offset against the Python module, so the two
 * cannot drift apart. Change both together and bump EL_PLAN_VERSION when a layout changes.
 *
 * plan.bin, little-endian, every struct a multiple of 8 bytes:
 *   el_plan_header
 *   el_plan_kv_layer x n_layers     (version 5) each layer's KV cache rows and attention window
 *   el_plan_weight x n_weights      where each weight lives in weights.bin
 *   el_plan_kernel x n_kernels      kernel symbols (without "__tvm_ffi_"), arity and which args each writes
 *   per program (n_programs):
 *     el_plan_program
 *     per step (n_steps): el_plan_step, then el_plan_arg x n_args (CALL and PREDICT steps; ROUTE steps have none)
 *
 * A program runs on the backend it names (a string the runtime looks up in its registry: runtime/edgellm_backend.h;
 * plans of version 2 and 3 gave an index into {"tvm_cpu", "qnn_ort", "opencl"} instead). A CALL step calls one kernel. A ROUTE step reads
 * n_select int32 expert ids (written by an earlier step, e.g. a router's top-k) from the arena and runs the n_body
 * CALL steps that follow it once per id: in those, EL_FLAG_EXPERT weight args use weight index + e * expert_stride
 * for expert e, and EL_FLAG_SLOT arena args move by i rows for the i-th id. An id of -1 ends the selection early
 * (variable-count routes: the neuron groups a token activates); ids after it are not read.
 *
 * A PREDICT step is a guess at a later route's selection (the next MoE layer's router applied early): it runs the
 * n_body CALL steps that follow it, which write n_select int32 ids at ids_offset (-1 ends them early), then hands
 * the weight store the guessed experts' weights to read ahead: its n_args el_plan_arg entries (EL_ARG_WEIGHT with
 * EL_FLAG_EXPERT) name them as index + e * expert_stride. A runtime whose store reads nothing ahead skips the step
 * and its body; a prediction never changes results.
 *
 * KV caches (version 5): a layer's cache holds kv_rows rows (position p at row p), except a sliding-window layer
 * (window W > 0) given fewer rows R: a window cache. There, position p sits at row p - base, where base (per layer
 * and context, starting at 0) moves up when a run would pass the cache's end: the W - 1 newest rows, the only ones a
 * later query can see, are copied to the start first. Kernels see it as the cache of a sequence starting at base
 * (pos - base for AT_POS and PREFIX views of that layer), which a window's attention cannot tell apart: keys carry
 * their RoPE already. R - (kv_rows - max_ctx) >= max(W, 2W - 2), so the rows kept never overlap the rows they
 * come from.
 */
#ifndef EDGELLM_CONTRACT_H
#define EDGELLM_CONTRACT_H
#include <stdint.h>

/* Files of a package directory */
#define EL_FORMAT_VERSION 2 /* manifest.json "format_version" */
#define EL_FILE_MANIFEST "manifest.json"
#define EL_FILE_PLAN "plan.bin"
#define EL_FILE_WEIGHTS "weights.bin"
#define EL_FILE_KERNELS "kernels.so"
#define EL_FILE_TOKENIZER "tokenizer.bin"
#define EL_FILE_SUMS "SHA256SUMS" /* "<sha256 hex>  <path>" per file; the package digest is its sha256 */
/* routing.bin (MoE packages, optional): how often calibration routed to each expert, for stores that hold the hot
 * ones: EL_ROUTING_MAGIC, uint32 version (EL_ROUTING_VERSION), uint32 n_weights, then uint32 selections per weight
 * of the plan's table (0 for weights that are not experts). */
#define EL_FILE_ROUTING "routing.bin"
#define EL_ROUTING_MAGIC "EDGEROUT"
#define EL_ROUTING_VERSION 1
#define EL_DIR_BIN "bin"
#define EL_FILE_RUNNER "bin/edgellm-run"

#define EL_PLAN_MAGIC "EDGEPLAN"
#define EL_PLAN_VERSION 8     /* the newest plan this runtime reads: 3 adds PREDICT steps, 4 backend names, 5 the
                                 per-layer KV cache table (window caches), 6 EL_PROGRAM_TREE (a runtime that does not
                                 fill a tree must not run such a program), 7 EL_PROGRAM_ROWS (nor one that does not
                                 write the row count), 8 the q4 KV row's per-block minimum (its rows are longer) */
#define EL_PLAN_VERSION_MIN 2 /* the oldest it reads (2 and 3 have el_plan_program_v3 records) */
#define EL_WEIGHT_ALIGN 16384 /* weight regions in weights.bin (Android page size; x86's 4 KiB divides it) */
#define EL_TENSOR_ALIGN 64    /* every tensor a kernel sees: TVM compiles with this alignment assumption */
#define EL_MAX_EOS 8
#define EL_MAX_ARGS_NDIM 4

enum { EL_ARCH_X86_64 = 1, EL_ARCH_AARCH64 = 2 };

/* DLPack dtype codes */
enum { EL_DT_INT = 0, EL_DT_UINT = 1, EL_DT_FLOAT = 2, EL_DT_BFLOAT = 4 };

/* Argument kinds */
enum {
  EL_ARG_ARENA = 0,  /* data = arena + offset */
  EL_ARG_WEIGHT = 1, /* data = weight[index] + offset (+ pos rows with AT_POS) */
  EL_ARG_KCACHE = 2, /* layer `index` K cache */
  EL_ARG_VCACHE = 3, /* layer `index` V cache */
  EL_ARG_SETTINGS = 4, /* data = the model's run-time settings (float32[EL_N_SETTINGS]) + offset; read-only */
};

/* Run-time settings kernels may read (EL_ARG_SETTINGS), set from the load options. A negative value means "the
 * package's default" (which the kernel holds). */
enum {
  EL_SETTING_FFN_THRESHOLD = 0, /* neuron-bundled FFNs: skip neuron groups whose estimated output is below it */
  EL_N_SETTINGS = 4
};

/* Argument flags */
enum {
  EL_FLAG_AT_POS = 1, /* data advanced by pos rows (row = product of shape[1..ndim-1] elements) */
  EL_FLAG_PREFIX = 2, /* KV prefix: data = cache start, shape[0] at run time = pos + shape[0] */
  EL_FLAG_EXPERT = 4, /* in a ROUTE body, a weight: index + expert * expert_stride */
  EL_FLAG_SLOT = 8,   /* in a ROUTE body, an arena view moved by i rows for the i-th selected id */
};

enum { EL_STEP_CALL = 0, EL_STEP_ROUTE = 1, EL_STEP_PREDICT = 2 };

#define EL_BACKEND_NAME_BYTES 16 /* el_plan_program.backend: a NUL-terminated registry name */
/* The OpenCL backend's files (android-gpu / opencl packages): TVM's OpenCL C, the launch table, and the binaries a
 * device built from them (written beside the package at first load) */
/* Every package file's marker and version, so that writer (compiler) and reader (runtime) name one place:
 * tokenizer.bin starts with EL_TOKENIZER_MAGIC then uint32 EL_TOKENIZER_VERSION (runtime/tokenizer/tokenizer.h);
 * kernels.cltab's first line is "EL_OPENCL_TABLE_MAGIC EL_OPENCL_TABLE_VERSION n"; npu/npu.txt's first line is
 * "EL_NPU_MAGIC EL_NPU_VERSION"; plan.bin and routing.bin: above. */
#define EL_TOKENIZER_MAGIC "ELTK"
#define EL_TOKENIZER_VERSION 1
#define EL_OPENCL_TABLE_MAGIC "edgellm-opencl"
#define EL_OPENCL_TABLE_VERSION 1
#define EL_NPU_MAGIC "edgellm-npu"
#define EL_NPU_VERSION 1
#define EL_FILE_OPENCL_SOURCE "kernels.cl"
#define EL_FILE_OPENCL_TABLE "kernels.cltab"
#define EL_DIR_OPENCL_CACHE "opencl-cache"

/* Programs, by name. prefill_short is optional (packages with long chunks run a prompt's last piece through it); so
 * are npu_embed + npu_prefill, a staged prefill (android-npu: fixed-size chunks, each embedded by npu_embed, then run
 * by npu_prefill on the backend it names; both or neither), and verify (speculative decoding: a few tokens, the
 * logits of each, one pass over the weights; 2 <= tokens <= chunk); the rest are required. A runtime checks then
 * skips programs it does not know, so newer compilers' extras are harmless. */
#define EL_PROGRAM_NAMES {"prefill", "prefill_logits", "decode", "head", "prefill_short", "npu_embed", "npu_prefill", \
                          "verify"}

/* el_plan_program.flags (version 4; older plans have 0, and their npu_prefill counts as EL_PROGRAM_SKIPS_FIRST) */
enum {
  EL_PROGRAM_SKIPS_FIRST = 1, /* calibrated without a sequence's first token (the attention sink, whose massive
                                 activations 16-bit graphs leave out): position 0 runs through decode instead */
  EL_PROGRAM_TREE = 2,        /* verify (version 6): the input is int32 ids[T], then (from the next multiple of
                                 EL_TENSOR_ALIGN bytes) a token tree, int32 [T + 1][T]: row 0 each row's depth d
                                 (its position is pos + d), row 1 + t row t's ancestors by depth (the batch row at
                                 depth 0..d; the last is t). A chain is depth t, ancestors 0..t */
  EL_PROGRAM_ROWS = 4,        /* verify, with TREE (version 7): after the tree (from the next multiple of
                                 EL_TENSOR_ALIGN bytes) int32 count[16], the real rows n at [0]: its GEMMs compute rows
                                 < n only, so a pass of fewer drafts than the program's rows costs less */
};

/* bytes from a tree program's input (its ids) to its tree */
#define EL_TREE_OFFSET(tokens) (((4ull * (tokens) + EL_TENSOR_ALIGN - 1) / EL_TENSOR_ALIGN) * EL_TENSOR_ALIGN)
/* bytes from a row-limited program's input to its row count, and the count's size */
#define EL_ROWS_OFFSET(tokens)                                                                                        \
  (((EL_TREE_OFFSET(tokens) + 4ull * (tokens) * ((tokens) + 1) + EL_TENSOR_ALIGN - 1) / EL_TENSOR_ALIGN) *           \
   EL_TENSOR_ALIGN)
#define EL_ROWS_BYTES 64

/* el_plan_kernel.flags / el_kernel_info.flags */
enum { EL_KERNEL_WRITES_KV = 1 /* its outputs may be KV cache views (RoPE'd K, V projections, copies) */ };

/* Sampling defaults the compiler derives from generation_config.json (transformers' generate() semantics). */
typedef struct {
  float temperature; /* 0: greedy */
  int32_t top_k;     /* 0: off */
  float top_p;       /* 1: off */
  float min_p;       /* 0: off */
  float repetition_penalty; /* 1: off */
  float presence_penalty;   /* 0: off */
  float frequency_penalty;  /* 0: off */
  uint32_t reserved;
} el_plan_sampling;

typedef struct {
  char magic[8];          /* EL_PLAN_MAGIC */
  uint32_t version;       /* EL_PLAN_VERSION */
  uint32_t arch;          /* EL_ARCH_* the kernels were built for */
  char features[64];      /* comma-separated CPU features the kernels need, e.g. "avx512f,fma,f16c" */
  char target[32];        /* target registry name, for messages */
  uint8_t build_id[16];   /* random per compile: a static edgellm-run runs only the package it was built with */
  uint32_t vocab;
  uint32_t dim;
  uint32_t n_layers;
  uint32_t n_kv_heads;
  uint32_t head_dim;
  uint32_t max_ctx;       /* longest sequence a user may run */
  uint32_t chunk;         /* prefill chunk length C */
  uint32_t kv_rows;       /* rows per KV cache buffer (>= max_ctx; a padded last chunk writes up to chunk-1 more) */
  uint32_t kv_dtype_bits; /* 32 (f32), 16 (f16), 8 (q8: a row is n_kv_heads * head_dim int8 codes, then one
                           * float32 scale per head; element = code * scale), 4 (q4: per block of B = the largest
                           * power of two <= 32 dividing head_dim, B/2 bytes of nibbles, element i low and
                           * i + B/2 high, then per block two float16, its step d and minimum m; element =
                           * nibble * d + m; plans before version 8: one float16 scale per block, element =
                           * (nibble - 8) * scale); that is the K cache's, and the V cache's too unless
                           * bits 8-15 give V's (--kv-cache K,V: both float or both quantized) */
  uint32_t n_weights;
  uint32_t n_kernels;
  uint32_t n_programs;
  uint64_t arena_bytes;   /* one activation arena shared by all programs of a context */
  uint64_t weights_bytes; /* exact size weights.bin must have */
  int32_t bos_id;         /* -1 if none */
  int32_t n_eos;
  int32_t eos_ids[EL_MAX_EOS];
  el_plan_sampling sampling;
} el_plan_header;

/* Version 5: one per layer, after the header (older plans: every layer kv_rows rows, window 0). */
typedef struct {
  uint32_t rows;   /* rows of this layer's K (and V) cache: kv_rows, or fewer for a window cache */
  uint32_t window; /* its attention window W (0: full causal attention, then rows == kv_rows) */
} el_plan_kv_layer;

typedef struct {
  uint64_t offset; /* byte offset in weights.bin (EL_WEIGHT_ALIGN aligned) */
  uint64_t nbytes;
} el_plan_weight;

typedef struct {
  char name[64];   /* exported as __tvm_ffi_<name> */
  uint32_t n_args;
  uint32_t flags;  /* EL_KERNEL_* */
  uint64_t writes; /* bit i: the kernel writes argument i */
} el_plan_kernel;

typedef struct {
  char name[24];
  char backend[EL_BACKEND_NAME_BYTES]; /* registry name of the backend that runs it */
  uint32_t tokens;        /* T: tokens per run (1 or chunk) */
  uint32_t n_steps;
  uint64_t in_offset;     /* arena byte offset of the input (int32 ids; f32 hidden for "head") */
  uint64_t out_offset;    /* arena byte offset of the output */
  uint64_t out_row_bytes; /* bytes of one output row (dim*4 or vocab*4) */
  uint32_t flags;         /* EL_PROGRAM_* */
  uint32_t reserved;      /* 0 */
} el_plan_program;

/* The program record of version 2 and 3 plans: the backend by index (0 tvm_cpu, 1 qnn_ort, 2 opencl). */
typedef struct {
  char name[24];
  uint32_t tokens;
  uint32_t n_steps;
  uint64_t in_offset;
  uint64_t out_offset;
  uint64_t out_row_bytes;
  uint32_t backend;
  uint32_t flags; /* 0 */
} el_plan_program_v3;

typedef struct {
  uint32_t kind;       /* EL_STEP_* */
  uint32_t kernel;     /* CALL: index into the kernel table */
  uint32_t n_args;     /* CALL: el_plan_arg entries that follow; PREDICT: the expert weights it names */
  uint32_t n_body;     /* ROUTE: the next n_body steps (CALL) run once per selected id; PREDICT: compute the guess */
  uint64_t ids_offset; /* ROUTE, PREDICT: arena byte offset of int32 ids[n_select] */
  uint32_t n_select;   /* ROUTE: ids to run the body for; PREDICT: ids guessed */
  uint32_t n_experts;  /* ROUTE, PREDICT: every id must be < n_experts */
} el_plan_step;

typedef struct {
  uint32_t kind;
  uint32_t index;
  uint8_t dtype_code; /* EL_DT_* */
  uint8_t dtype_bits;
  uint16_t dtype_lanes; /* 1 */
  uint32_t ndim;        /* <= EL_MAX_ARGS_NDIM */
  uint32_t flags;       /* EL_FLAG_* */
  uint32_t expert_stride; /* EL_FLAG_EXPERT */
  uint64_t offset;      /* bytes */
  int64_t shape[EL_MAX_ARGS_NDIM];
} el_plan_arg;

/* What kernels.so says about its own kernels (a table the compiler links into it, read at load). The loader
 * trusts this over plan.bin: a plan whose steps would have a kernel write into a weight, or a non-KV kernel write
 * into the KV cache, is refused. */
typedef struct {
  const char* name;
  uint32_t n_args;
  uint32_t flags;  /* EL_KERNEL_* */
  uint64_t writes; /* bit i: argument i is written */
} el_kernel_info;
#define EL_KERNEL_INFO_SYMBOL "__edgellm_kernel_info"
#define EL_KERNEL_INFO_COUNT_SYMBOL "__edgellm_kernel_info_count"

#endif
