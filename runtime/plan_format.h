/* plan.bin: the static execution plan the compiler writes and libedgellm executes.
 *
 * Little-endian, no padding surprises: every struct below is a multiple of 8 bytes and is written by
 * compiler/plan_writer.py with the same field order (keep the two in sync; PLAN_VERSION guards it).
 *
 *   el_plan_header
 *   el_plan_weight   x n_weights      (tensor table: where each weight lives in weights.bin)
 *   el_plan_kernel   x n_kernels      (kernel symbols in kernels.so, without the "__tvm_ffi_" prefix)
 *   for each program (n_programs):
 *     el_plan_program
 *     for each step (n_steps):
 *       el_plan_step
 *       el_plan_arg x n_args
 *
 * Programs (fixed names, see compiler/lower.py):
 *   "prefill"        T = chunk tokens -> hidden [chunk, dim]         (body only)
 *   "prefill_logits" T = chunk tokens -> logits [chunk, vocab]       (body + final norm + lm_head on all rows)
 *   "decode"         T = 1            -> logits [1, vocab]           (body + head)
 *   "head"           hidden [1, dim]  -> logits [1, vocab]           (final norm + lm_head on one row)
 *   "prefill_short"  T = short tokens -> hidden [short, dim]         (optional: packages whose chunk is long run
 *                                                                    a prompt's last few tokens through it)
 * A runtime skips programs it does not know (after checking them), so older runtimes run newer packages.
 * A program's input lives in the arena at in_offset (int32 token ids, or f32 hidden for "head"), its output
 * at out_offset; every program shares the one arena, so the runtime copies outputs out before the next run.
 */
#ifndef EDGELLM_PLAN_FORMAT_H
#define EDGELLM_PLAN_FORMAT_H
#include <stdint.h>

#define EL_PLAN_MAGIC "EDGEPLAN"
#define EL_PLAN_VERSION 1

enum { EL_ARCH_X86_64 = 1, EL_ARCH_AARCH64 = 2 };

/* DLPack dtype codes */
enum { EL_DT_INT = 0, EL_DT_UINT = 1, EL_DT_FLOAT = 2, EL_DT_BFLOAT = 4 };

typedef struct {
  char magic[8];            /* "EDGEPLAN" */
  uint32_t version;         /* EL_PLAN_VERSION */
  uint32_t arch;            /* EL_ARCH_* the kernels were built for */
  char features[64];        /* comma-separated CPU features the kernels need, e.g. "avx512f,fma,f16c" */
  char target[32];          /* target registry name, e.g. "host", for error messages */
  uint32_t vocab;
  uint32_t dim;             /* hidden size */
  uint32_t n_layers;
  uint32_t n_kv_heads;
  uint32_t head_dim;
  uint32_t max_ctx;         /* longest sequence a user may run */
  uint32_t chunk;           /* prefill chunk length C */
  uint32_t kv_rows;         /* rows allocated per KV cache buffer (= max_ctx + chunk: the padded last chunk) */
  uint32_t kv_dtype_bits;   /* 32 (f32) for now */
  uint32_t n_weights;
  uint32_t n_kernels;
  uint32_t n_programs;
  uint64_t arena_bytes;     /* one activation arena shared by all programs */
  uint64_t weights_bytes;   /* exact size weights.bin must have */
  int32_t bos_id;           /* -1 if none */
  int32_t n_eos;
  int32_t eos_ids[8];
} el_plan_header;

typedef struct {
  uint64_t offset;          /* byte offset in weights.bin (16 KiB aligned) */
  uint64_t nbytes;
} el_plan_weight;

typedef struct {
  char name[64];
} el_plan_kernel;

typedef struct {
  char name[24];
  uint32_t tokens;          /* T: tokens per run (1 or chunk) */
  uint32_t n_steps;
  uint64_t in_offset;       /* arena byte offset of the input */
  uint64_t out_offset;      /* arena byte offset of the output */
  uint64_t out_row_bytes;   /* bytes of one output row (dim*4 or vocab*4) */
} el_plan_program;

typedef struct {
  uint32_t kernel;          /* index into the kernel table */
  uint32_t n_args;
} el_plan_step;

/* argument kinds */
enum {
  EL_ARG_ARENA = 0,   /* data = arena + offset */
  EL_ARG_WEIGHT = 1,  /* data = weight[index] + offset (+ pos * row_bytes if EL_FLAG_AT_POS) */
  EL_ARG_KCACHE = 2,  /* layer `index` K cache; see flags */
  EL_ARG_VCACHE = 3,  /* layer `index` V cache; see flags */
};
/* flags */
enum {
  EL_FLAG_AT_POS = 1,  /* data advanced by pos rows (row = product of shape[1..ndim-1] elements) */
  EL_FLAG_PREFIX = 2,  /* KV prefix: data = cache start, shape[0] at run time = pos + shape[0] */
};

typedef struct {
  uint32_t kind;
  uint32_t index;
  uint8_t dtype_code;       /* EL_DT_* */
  uint8_t dtype_bits;
  uint16_t dtype_lanes;     /* 1 */
  uint32_t ndim;            /* <= 4 */
  uint32_t flags;
  uint32_t reserved;
  uint64_t offset;          /* bytes */
  int64_t shape[4];
} el_plan_arg;

#endif
