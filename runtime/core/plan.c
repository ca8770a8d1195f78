/* plan.bin: read as arrays of the contract's structs (contract.h), every byte the runtime will trust checked (sizes,
 * offsets inside the arena / weights / KV cache, kernels that write only what they may), then built into the
 * run-time view of each program. The programs' backends are looked up by name in the registry here. */
#define _GNU_SOURCE
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "el_internal.h"

/* plan.bin is read as arrays of these structs: pin the layouts runtime/contract.py writes (tests/test_contract.py
 * checks every field offset too). */
_Static_assert(sizeof(el_plan_sampling) == 32, "el_plan_sampling layout");
_Static_assert(sizeof(el_plan_header) == 264, "el_plan_header layout");
_Static_assert(sizeof(el_plan_kv_layer) == 8, "el_plan_kv_layer layout");
_Static_assert(sizeof(el_plan_weight) == 16, "el_plan_weight layout");
_Static_assert(sizeof(el_plan_kernel) == 80, "el_plan_kernel layout");
_Static_assert(sizeof(el_plan_program) == 80, "el_plan_program layout");
_Static_assert(sizeof(el_plan_program_v3) == 64, "el_plan_program_v3 layout");
_Static_assert(sizeof(el_plan_step) == 32, "el_plan_step layout");
_Static_assert(sizeof(el_plan_arg) == 64, "el_plan_arg layout");

static const char* const PROGRAM_NAMES[] = EL_PROGRAM_NAMES;
_Static_assert(sizeof PROGRAM_NAMES / sizeof *PROGRAM_NAMES == EL_N_PROGRAMS, "a name per program index");

EL_API const char* el_program_name(int k) { return k >= 0 && k < EL_N_PROGRAMS ? PROGRAM_NAMES[k] : NULL; }

/* Plan: header ------------------------------------------------------------------------------------------------- */

typedef struct {
  const uint8_t* p;
  size_t size, off;
} cursor;

/* Next size * count bytes of the plan, or NULL if the file ends first (overflow-safe). */
static const void* take(cursor* c, size_t size, uint64_t count) {
  uint64_t n;
  if (__builtin_mul_overflow((uint64_t)size, count, &n) || n > c->size - c->off) return NULL;
  const void* r = c->p + c->off;
  c->off += (size_t)n;
  return r;
}

/* [off, off + len) inside [0, cap)? */
static int fits(uint64_t off, uint64_t len, uint64_t cap) { return off <= cap && len <= cap - off; }

static int corrupt(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
static int corrupt(const char* fmt, ...) {
  char what[768];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(what, sizeof what, fmt, ap);
  va_end(ap);
  return el_error("plan.bin is corrupt: %s; recompile the package (or copy it again)", what);
}

static int finite_in(float v, float lo, float hi) { return v == v && v >= lo && v <= hi; }

static int check_header(const el_plan_header* h, size_t file_size) {
  if (file_size < 16)
    return el_error("plan.bin is truncated: %zu bytes; recompile the package or copy it again", file_size);
  if (memcmp(h->magic, EL_PLAN_MAGIC, 8) != 0)
    return el_error("plan.bin is not an edgellm plan (bad magic); point the runtime at a package directory made by "
                    "`edgellm compile`");
  if (h->version < EL_PLAN_VERSION_MIN || h->version > EL_PLAN_VERSION)
    return el_error("package format version %u, this runtime reads %d to %d: recompile the package with this "
                    "edgellm", h->version, EL_PLAN_VERSION_MIN, EL_PLAN_VERSION);
  if (file_size < sizeof *h)
    return el_error("plan.bin is truncated: %zu bytes, the header alone needs %zu; recompile the package or copy "
                    "it again", file_size, sizeof *h);
  if (h->arch != EL_ARCH_X86_64 && h->arch != EL_ARCH_AARCH64) return corrupt("unknown arch %u", h->arch);
  if (!memchr(h->features, 0, sizeof h->features) || !memchr(h->target, 0, sizeof h->target))
    return corrupt("unterminated target strings");
  if (h->vocab == 0 || h->vocab > INT_MAX / 4) return corrupt("vocab %u", h->vocab);
  if (h->dim == 0 || h->dim > (1u << 24)) return corrupt("dim %u", h->dim);
  if (h->max_ctx == 0 || h->max_ctx > (1u << 30)) return corrupt("max_ctx %u", h->max_ctx);
  if (h->chunk == 0 || h->chunk > (1u << 20)) return corrupt("chunk %u", h->chunk);
  if (h->kv_rows < h->max_ctx) return corrupt("kv_rows %u < max_ctx %u", h->kv_rows, h->max_ctx);
  for (int v = 0; v < 2; v++) {
    uint32_t b = el_kv_bits(h, v);
    if ((b != 32 && b != 16 && b != 8 && b != 4) || h->kv_dtype_bits >> 16)
      return el_error("plan.bin asks for a KV cache of kv_dtype_bits %#x, this runtime has f32 (32), f16 (16), q8 (8) "
                      "and q4 (4), V's in bits 8-15: recompile the package with this edgellm", h->kv_dtype_bits);
    if (b <= 8 && (h->head_dim % 4 || h->n_kv_heads == 0))
      return corrupt("a quantized KV cache with head_dim %u (scales follow the codes: a multiple of 4)", h->head_dim);
  }
  if ((el_kv_bits(h, 0) <= 8) != (el_kv_bits(h, 1) <= 8))
    return corrupt("a K cache of %u bits and a V cache of %u bits (both float or both quantized)", el_kv_bits(h, 0),
                   el_kv_bits(h, 1));
  if (h->n_layers > (1u << 16)) return corrupt("n_layers %u", h->n_layers);
  if (h->n_eos < 0 || h->n_eos > EL_MAX_EOS) return corrupt("n_eos %d (at most %d)", h->n_eos, EL_MAX_EOS);
  if (h->bos_id < -1 || h->bos_id >= (int32_t)h->vocab) return corrupt("bos_id %d, vocab %u", h->bos_id, h->vocab);
  for (int i = 0; i < h->n_eos; i++)
    if (h->eos_ids[i] < 0 || h->eos_ids[i] >= (int32_t)h->vocab)
      return corrupt("eos id %d outside the vocab of %u", h->eos_ids[i], h->vocab);
  if (h->arena_bytes > ((uint64_t)1 << 40)) return corrupt("arena_bytes %llu", (unsigned long long)h->arena_bytes);
  const el_plan_sampling* s = &h->sampling;
  if (!finite_in(s->temperature, 0, 1e6f) || s->top_k < 0 || !finite_in(s->top_p, 1e-9f, 1) ||
      !finite_in(s->min_p, 0, 1) || !finite_in(s->repetition_penalty, 1e-6f, 1e6f) ||
      !finite_in(s->presence_penalty, -1e6f, 1e6f) || !finite_in(s->frequency_penalty, -1e6f, 1e6f))
    return corrupt("sampling defaults out of range");
  return 0;
}

/* Plan: arguments --------------------------------------------------------------------------------------------- */

/* Bytes of the tensor an arg describes, and of one row (shape[1..]); -1 if the shape is malformed. */
static int arg_sizes(const el_plan_arg* a, uint64_t* bytes, uint64_t* row_bytes) {
  uint32_t b = a->dtype_bits;
  if (a->ndim > EL_MAX_ARGS_NDIM || a->dtype_lanes != 1 ||
      !(b == 1 || b == 2 || b == 4 || b == 8 || b == 16 || b == 32 || b == 64))
    return -1;
  if (a->dtype_code != EL_DT_INT && a->dtype_code != EL_DT_UINT && a->dtype_code != EL_DT_FLOAT &&
      a->dtype_code != EL_DT_BFLOAT)
    return -1;
  uint64_t elems = 1, row = 1;
  for (uint32_t d = 0; d < a->ndim; d++) {
    if (a->shape[d] < 0 || a->shape[d] > ((int64_t)1 << 40)) return -1;
    if (__builtin_mul_overflow(elems, (uint64_t)a->shape[d], &elems) || elems > ((uint64_t)1 << 48)) return -1;
    if (d > 0) row *= (uint64_t)a->shape[d]; /* <= elems: no overflow */
  }
  for (uint32_t d = a->ndim; d < EL_MAX_ARGS_NDIM; d++)
    if (a->shape[d] != 0) return -1;
  *bytes = (elems * b + 7) / 8;
  *row_bytes = row * b / 8;
  return 0;
}

/* Where a step sits, for messages and rules. */
typedef struct {
  const char* prog;
  uint32_t step, arg;
  int in_route;       /* inside a ROUTE body */
  uint32_t n_select;  /* of that route */
  uint32_t n_experts;
  int written;        /* the kernel writes this argument */
  int kv_writer;      /* the kernel may write KV views */
  uint32_t guess_left; /* steps left of an open PREDICT step's body (plain kernel calls) */
} arg_site;

/* Every arg, checked against the largest position any run can use: a run starts at pos <= max_ctx - 1
 * (prefill needs pos + n <= max_ctx with n >= 1, decode pos + 1 <= max_ctx). */
static int check_arg(const el_model* m, const arg_site* s, const el_plan_arg* a) {
  const el_plan_header* h = &m->h;
  uint64_t bytes, row, extent, last = h->max_ctx - 1;
  char where[112];
  snprintf(where, sizeof where, "program %s step %u arg %u", s->prog, s->step, s->arg);
  if (arg_sizes(a, &bytes, &row) != 0)
    return corrupt("%s has a bad shape or dtype (ndim %u, dtype %u/%u/%u)", where, a->ndim, a->dtype_code,
                   a->dtype_bits, a->dtype_lanes);
  const uint32_t known = EL_FLAG_AT_POS | EL_FLAG_PREFIX | EL_FLAG_EXPERT | EL_FLAG_SLOT;
  if (a->flags & ~known) return corrupt("%s has unknown flags %#x", where, a->flags);
  if (__builtin_popcount(a->flags) > 1) return corrupt("%s combines flags %#x", where, a->flags);
  if ((a->flags & (EL_FLAG_AT_POS | EL_FLAG_PREFIX | EL_FLAG_SLOT)) && a->ndim == 0)
    return corrupt("%s is a per-row view of a scalar", where);
  if ((a->flags & (EL_FLAG_EXPERT | EL_FLAG_SLOT)) && !s->in_route)
    return corrupt("%s is an expert/slot view outside a routed step", where);
  if (!(a->flags & EL_FLAG_EXPERT) && a->expert_stride) return corrupt("%s has an expert stride but no flag", where);
  if ((a->flags & (EL_FLAG_AT_POS | EL_FLAG_PREFIX | EL_FLAG_SLOT)) && a->dtype_bits < 8) {
    uint64_t row_elems = 1;
    for (uint32_t d = 1; d < a->ndim; d++) row_elems *= (uint64_t)a->shape[d];
    if (row_elems * a->dtype_bits % 8) return corrupt("%s: rows of %u-bit elements are not whole bytes", where, a->dtype_bits);
  }
  /* TVM compiles every buffer with a 64-byte alignment assumption (llvm.assume + aligned vector moves), so a
   * misaligned view is not slow but a crash: every view starts 64-byte aligned. A per-position view then moves
   * by pos * row bytes, which keeps only gcd(row, 64): kernels taking such args with rows that are not multiples
   * of 64 bytes are compiled with that lower alignment (the compiler's side of the contract). */
  if (a->offset % EL_TENSOR_ALIGN)
    return corrupt("%s: offset %llu is not a multiple of %d (TVM kernels assume %d-byte aligned tensors)", where,
                   (unsigned long long)a->offset, EL_TENSOR_ALIGN, EL_TENSOR_ALIGN);
  uint64_t moved = 0; /* the furthest a per-position / per-slot view moves */
  if ((a->flags & EL_FLAG_AT_POS) && __builtin_mul_overflow(last, row, &moved))
    return corrupt("%s: position offsets overflow", where);
  if ((a->flags & EL_FLAG_SLOT) && __builtin_mul_overflow((uint64_t)(s->n_select - 1), row, &moved))
    return corrupt("%s: slot offsets overflow", where);
  if (__builtin_add_overflow(bytes, moved, &extent)) return corrupt("%s: size overflows", where);
  switch (a->kind) {
    case EL_ARG_ARENA:
      if (a->flags & (EL_FLAG_AT_POS | EL_FLAG_PREFIX | EL_FLAG_EXPERT))
        return corrupt("%s: arena args take no position or expert flags", where);
      if (!fits(a->offset, extent, h->arena_bytes))
        return corrupt("%s reaches arena bytes [%llu, +%llu) beyond arena_bytes %llu", where,
                       (unsigned long long)a->offset, (unsigned long long)extent, (unsigned long long)h->arena_bytes);
      return 0;
    case EL_ARG_WEIGHT: {
      if (s->written)
        return corrupt("%s is written by its kernel but points at weight %u (weights are read-only)", where,
                       a->index);
      if (a->flags & (EL_FLAG_PREFIX | EL_FLAG_SLOT)) return corrupt("%s: weights take no prefix or slot flag", where);
      uint32_t n_exp = (a->flags & EL_FLAG_EXPERT) ? s->n_experts : 1;
      uint64_t span; /* index of the last expert's weight */
      if (__builtin_mul_overflow((uint64_t)(n_exp - 1), (uint64_t)a->expert_stride, &span) ||
          __builtin_add_overflow(span, (uint64_t)a->index, &span) || span >= h->n_weights)
        return corrupt("%s names weight %u (+ %u experts x stride %u), the plan has %u", where, a->index, n_exp,
                       a->expert_stride, h->n_weights);
      for (uint32_t e = 0; e < n_exp; e++) {
        uint32_t w = a->index + e * a->expert_stride;
        if (!fits(a->offset, extent, m->weights[w].nbytes))
          return corrupt("%s reads [%llu, +%llu) of weight %u, which has %llu bytes", where,
                         (unsigned long long)a->offset, (unsigned long long)extent, w,
                         (unsigned long long)m->weights[w].nbytes);
      }
      return 0;
    }
    case EL_ARG_KCACHE:
    case EL_ARG_VCACHE: {
      if (s->written && !s->kv_writer)
        return corrupt("%s: its kernel writes this argument and is not one that writes the KV cache", where);
      if (a->flags & (EL_FLAG_EXPERT | EL_FLAG_SLOT)) return corrupt("%s: KV views take no expert or slot flag", where);
      if (a->index >= h->n_layers) return corrupt("%s names layer %u, the model has %u", where, a->index, h->n_layers);
      /* a quantized cache's views are its rows' bytes (int8) */
      int is_v = a->kind == EL_ARG_VCACHE;
      uint32_t bits = el_kv_bits(h, is_v);
      if (a->dtype_code != (bits <= 8 ? EL_DT_INT : EL_DT_FLOAT) || a->dtype_bits != (bits <= 8 ? 8u : bits))
        return corrupt("%s views the %u-bit %c cache as dtype %u/%u", where, bits, is_v ? 'V' : 'K', a->dtype_code,
                       a->dtype_bits);
      /* a window cache's views move by at most its rows less the room a run needs (its "max_ctx") */
      uint32_t rows = m->kv_layers[a->index].rows;
      if (rows < h->kv_rows) {
        last = rows - (h->kv_rows - h->max_ctx) - 1;
        if ((a->flags & EL_FLAG_AT_POS) && __builtin_mul_overflow(last, row, &moved)) moved = UINT64_MAX;
        if (__builtin_add_overflow(bytes, moved, &extent)) return corrupt("%s: size overflows", where);
      }
      if ((a->flags & EL_FLAG_PREFIX) && __builtin_mul_overflow(last + (uint64_t)a->shape[0], row, &extent))
        return corrupt("%s: prefix size overflows", where);
      uint64_t cap = (uint64_t)rows * el_kv_row_bytes(h, is_v); /* checked not to overflow at read */
      if (!fits(a->offset, extent, cap))
        return corrupt("%s reaches [%llu, +%llu) of a KV cache of %llu bytes (%u rows)", where,
                       (unsigned long long)a->offset, (unsigned long long)extent, (unsigned long long)cap, rows);
      return 0;
    }
    case EL_ARG_SETTINGS:
      if (s->written) return corrupt("%s is written by its kernel but points at the run-time settings", where);
      if (a->flags) return corrupt("%s: the settings take no flags", where);
      if (!fits(a->offset, extent, sizeof(float) * EL_N_SETTINGS))
        return corrupt("%s reads [%llu, +%llu) of the %d run-time settings", where, (unsigned long long)a->offset,
                       (unsigned long long)extent, EL_N_SETTINGS);
      return 0;
    default:
      return corrupt("%s has unknown kind %u", where, a->kind);
  }
}

/* Plan: programs ---------------------------------------------------------------------------------------------- */

/* Checks one step (and its args) at the cursor; *in_route counts down the body steps of an open ROUTE. */
static int check_step(el_model* m, cursor* c, const char* prog, uint32_t si, uint32_t n_steps, uint32_t* body_left,
                      arg_site* route, uint64_t* n_args_total) {
  const el_plan_header* h = &m->h;
  const el_plan_step* s = take(c, sizeof *s, 1);
  if (!s) return corrupt("program %s step %u runs past the end of the file", prog, si);
  if (s->kind == EL_STEP_ROUTE) {
    if (*body_left || route->guess_left)
      return corrupt("program %s step %u: a routed step inside another step's body", prog, si);
    if (s->n_args || s->kernel) return corrupt("program %s step %u: a routed step calls no kernel", prog, si);
    if (s->n_body == 0 || s->n_body > n_steps - si - 1)
      return corrupt("program %s step %u: routed body of %u steps, %u follow", prog, si, s->n_body, n_steps - si - 1);
    if (s->n_select == 0 || s->n_select > (1u << 20) || s->n_experts == 0 || s->n_experts > (1u << 16))
      return corrupt("program %s step %u: routes %u ids over %u experts", prog, si, s->n_select, s->n_experts);
    if (s->ids_offset % 4 || !fits(s->ids_offset, 4ull * s->n_select, h->arena_bytes))
      return corrupt("program %s step %u: expert ids at arena byte %llu lie outside the arena", prog, si,
                     (unsigned long long)s->ids_offset);
    *body_left = s->n_body;
    route->n_select = s->n_select;
    route->n_experts = s->n_experts;
    return 0;
  }
  if (s->kind == EL_STEP_PREDICT) {
    if (*body_left || route->guess_left)
      return corrupt("program %s step %u: a predicting step inside another step's body", prog, si);
    if (s->kernel) return corrupt("program %s step %u: a predicting step calls no kernel", prog, si);
    if (s->n_body == 0 || s->n_body > n_steps - si - 1)
      return corrupt("program %s step %u: predicting body of %u steps, %u follow", prog, si, s->n_body,
                     n_steps - si - 1);
    if (s->n_select == 0 || s->n_select > (1u << 20) || s->n_experts == 0 || s->n_experts > (1u << 16))
      return corrupt("program %s step %u: predicts %u ids over %u experts", prog, si, s->n_select, s->n_experts);
    if (s->ids_offset % 4 || !fits(s->ids_offset, 4ull * s->n_select, h->arena_bytes))
      return corrupt("program %s step %u: predicted ids at arena byte %llu lie outside the arena", prog, si,
                     (unsigned long long)s->ids_offset);
    if (s->n_args == 0 || s->n_args > 64)
      return corrupt("program %s step %u: a predicting step naming %u expert weights", prog, si, s->n_args);
    const el_plan_arg* args = take(c, sizeof *args, s->n_args);
    if (!args) return corrupt("program %s step %u: %u args run past the end of the file", prog, si, s->n_args);
    arg_site site = {prog, si, 0, 1, s->n_select, s->n_experts, 0, 0, 0};
    for (uint32_t ai = 0; ai < s->n_args; ai++) {
      site.arg = ai;
      if (args[ai].kind != EL_ARG_WEIGHT || !(args[ai].flags & EL_FLAG_EXPERT))
        return corrupt("program %s step %u arg %u: a predicting step names expert weights only", prog, si, ai);
      if (check_arg(m, &site, &args[ai]) != 0) return -1;
    }
    route->guess_left = s->n_body;
    *n_args_total += s->n_args;
    return 0;
  }
  if (s->kind != EL_STEP_CALL) return corrupt("program %s step %u has unknown kind %u", prog, si, s->kind);
  if (route->guess_left) route->guess_left--;
  if (s->n_body || s->n_select || s->n_experts || s->ids_offset)
    return corrupt("program %s step %u: a kernel call with routing fields", prog, si);
  if (s->kernel >= h->n_kernels)
    return corrupt("program %s step %u calls kernel %u, the plan has %u", prog, si, s->kernel, h->n_kernels);
  const el_plan_kernel* k = &m->kernels[s->kernel];
  if (s->n_args != k->n_args)
    return corrupt("program %s step %u passes %u args to kernel %s, which takes %u", prog, si, s->n_args, k->name,
                   k->n_args);
  const el_plan_arg* args = take(c, sizeof *args, s->n_args);
  if (!args) return corrupt("program %s step %u: %u args run past the end of the file", prog, si, s->n_args);
  arg_site site = {prog, si, 0, *body_left > 0, route->n_select, route->n_experts, 0, !!(k->flags & EL_KERNEL_WRITES_KV), 0};
  for (uint32_t ai = 0; ai < s->n_args; ai++) {
    site.arg = ai;
    site.written = (int)((k->writes >> ai) & 1);
    if (check_arg(m, &site, &args[ai]) != 0) return -1;
  }
  if (*body_left) --*body_left;
  *n_args_total += s->n_args;
  return 0;
}

/* Builds the run-time view of a checked program: steps, prototype tensors, row sizes (one block). */
static int build_program(el_model* m, el_program* pg, const el_plan_program* p, size_t steps_off, uint64_t n_args) {
  size_t per_arg = sizeof(DLTensor) + 4 * sizeof(int64_t) + sizeof(uint64_t);
  uint8_t* mem = calloc(1, sizeof(el_step) * (p->n_steps + 1) + per_arg * (size_t)n_args);
  if (!mem) return el_error("out of memory building program %s", p->name);
  pg->present = 1; /* pg->slot: set by use_backend */
  pg->p = *p;
  pg->n_steps = p->n_steps;
  pg->steps = (el_step*)mem;
  DLTensor* t = (DLTensor*)(mem + sizeof(el_step) * (p->n_steps + 1));
  int64_t* shape = (int64_t*)(t + n_args);
  uint64_t* rows = (uint64_t*)(shape + 4 * n_args);
  cursor c = {m->plan, m->plan_size, steps_off};
  for (uint32_t si = 0; si < p->n_steps; si++) {
    const el_plan_step* s = take(&c, sizeof *s, 1);
    const el_plan_arg* args = take(&c, sizeof *args, s->n_args);
    el_step* st = &pg->steps[si];
    st->kind = s->kind;
    st->kernel = s->kernel;
    st->kernel_name = s->kind == EL_STEP_CALL ? m->kernels[s->kernel].name
                      : s->kind == EL_STEP_ROUTE ? "(route)" : "(predict)";
    st->n_args = s->n_args;
    st->args = args;
    st->n_body = s->n_body, st->n_select = s->n_select, st->n_experts = s->n_experts, st->ids_offset = s->ids_offset;
    st->proto = t, st->shapes = shape, st->row_bytes = rows;
    /* an embedding lookup (a step reading the program's token ids) reads `tokens` rows of its tables */
    int lookup = 0;
    for (uint32_t ai = 0; ai < s->n_args; ai++)
      if (args[ai].kind == EL_ARG_ARENA && args[ai].offset == p->in_offset && args[ai].dtype_code == kDLInt &&
          args[ai].dtype_bits == 32)
        lookup = 1;
    st->weight_bytes = 0;
    for (uint32_t ai = 0; ai < s->n_args; ai++) {
      const el_plan_arg* a = &args[ai];
      uint64_t bytes;
      arg_sizes(a, &bytes, &rows[ai]);
      if (a->kind == EL_ARG_WEIGHT) st->weight_bytes += lookup ? (uint64_t)p->tokens * rows[ai] : bytes;
      memcpy(&shape[4 * ai], a->shape, sizeof a->shape);
      t[ai].device.device_type = kDLCPU;
      t[ai].device.device_id = 0;
      t[ai].ndim = (int32_t)a->ndim;
      t[ai].dtype.code = a->dtype_code;
      t[ai].dtype.bits = a->dtype_bits;
      t[ai].dtype.lanes = a->dtype_lanes;
      t[ai].shape = &shape[4 * ai];
    }
    t += s->n_args, shape += 4 * s->n_args, rows += s->n_args;
  }
  return 0;
}

/* Gives program k the model's slot for the backend it names, adding the slot on first use. */
static int use_backend(el_model* m, el_program* pg, int k, const char* name) {
  const el_backend* be = el_backend_find(name);
  if (!be) {
    char names[512];
    el_backend_names(names, sizeof names);
    return el_error("program %s runs on backend \"%s\", which this runtime does not have (it has: %s): recompile "
                    "the package for this runtime, or register that backend before loading", PROGRAM_NAMES[k], name,
                    names);
  }
  int s = 0;
  while (s < m->n_backends && m->backends[s].be != be) s++;
  if (s == m->n_backends) {
    if (s == EL_MAX_MODEL_BACKENDS) return corrupt("its programs name more than %d backends", EL_MAX_MODEL_BACKENDS);
    m->backends[m->n_backends++].be = be;
  }
  m->backends[s].programs |= 1u << k;
  pg->slot = s;
  return 0;
}

/* Parses and checks everything after the header and builds the programs. */
static int parse_plan(el_model* m, size_t at) {
  const el_plan_header* h = &m->h;
  cursor c = {m->plan, m->plan_size, at};
  if (!(m->weights = take(&c, sizeof(el_plan_weight), h->n_weights)))
    return corrupt("the weight table (%u entries) runs past the end of the file", h->n_weights);
  if (!(m->kernels = take(&c, sizeof(el_plan_kernel), h->n_kernels)))
    return corrupt("the kernel table (%u entries) runs past the end of the file", h->n_kernels);
  for (uint32_t i = 0; i < h->n_weights; i++) {
    if (m->weights[i].offset % EL_TENSOR_ALIGN)
      return corrupt("weight %u starts at byte %llu, not a multiple of %d", i,
                     (unsigned long long)m->weights[i].offset, EL_TENSOR_ALIGN);
    if (!fits(m->weights[i].offset, m->weights[i].nbytes, h->weights_bytes))
      return corrupt("weight %u at [%llu, +%llu) lies outside weights.bin (%llu bytes)", i,
                     (unsigned long long)m->weights[i].offset, (unsigned long long)m->weights[i].nbytes,
                     (unsigned long long)h->weights_bytes);
  }
  for (uint32_t i = 0; i < h->n_kernels; i++) {
    const el_plan_kernel* k = &m->kernels[i];
    if (!memchr(k->name, 0, sizeof k->name) || !k->name[0]) return corrupt("kernel %u has no NUL-terminated name", i);
    if (k->n_args > 64 || (k->n_args < 64 && (k->writes >> k->n_args)) || !k->writes || (k->flags & ~1u))
      return corrupt("kernel %s: %u args, write mask %#llx, flags %#x", k->name, k->n_args,
                     (unsigned long long)k->writes, k->flags);
  }
  for (uint32_t pi = 0; pi < h->n_programs; pi++) {
    el_plan_program rec; /* a version 2/3 record read into the version 4 layout */
    const el_plan_program* p = &rec;
    if (h->version >= 4) {
      const el_plan_program* r = take(&c, sizeof *r, 1);
      if (!r) return corrupt("program %u of %u runs past the end of the file", pi, h->n_programs);
      rec = *r;
      if (!memchr(p->name, 0, sizeof p->name)) return corrupt("program %u has no NUL-terminated name", pi);
      if (!memchr(p->backend, 0, sizeof p->backend) || !p->backend[0])
        return corrupt("program %s has no NUL-terminated backend name", p->name);
      if (p->flags & ~(uint32_t)(EL_PROGRAM_SKIPS_FIRST | EL_PROGRAM_TREE | EL_PROGRAM_ROWS) || p->reserved)
        return corrupt("program %s has unknown flags %#x", p->name, p->flags);
    } else {
      const el_plan_program_v3* r = take(&c, sizeof *r, 1);
      if (!r) return corrupt("program %u of %u runs past the end of the file", pi, h->n_programs);
      if (!memchr(r->name, 0, sizeof r->name)) return corrupt("program %u has no NUL-terminated name", pi);
      if (r->flags) return corrupt("program %s has unknown flags %#x", r->name, r->flags);
      const char* backend = el_backend_legacy_name(r->backend);
      if (!backend) return corrupt("program %s runs on backend %u, which no edgellm had", r->name, r->backend);
      memset(&rec, 0, sizeof rec);
      memcpy(rec.name, r->name, sizeof rec.name);
      snprintf(rec.backend, sizeof rec.backend, "%s", backend);
      rec.tokens = r->tokens, rec.n_steps = r->n_steps, rec.in_offset = r->in_offset, rec.out_offset = r->out_offset;
      rec.out_row_bytes = r->out_row_bytes;
      if (!strcmp(rec.name, "npu_prefill")) rec.flags = EL_PROGRAM_SKIPS_FIRST; /* what the runtime then did */
    }
    if (p->n_steps > (1u << 24)) return corrupt("program %s has %u steps", p->name, p->n_steps);
    int which = -1;
    for (int k = 0; k < EL_N_PROGRAMS; k++)
      if (!strcmp(p->name, PROGRAM_NAMES[k])) which = k;
    /* unknown programs (from a newer compiler) are checked, then skipped */
    el_program* pg = which >= 0 ? &m->prog[which] : NULL;
    if (pg && pg->present) return corrupt("program %s appears twice", p->name);
    if (pg && use_backend(m, pg, which, p->backend) != 0) return -1;
    size_t steps_off = c.off;
    uint64_t n_args = 0;
    uint32_t body_left = 0;
    arg_site route = {0};
    for (uint32_t si = 0; si < p->n_steps; si++)
      if (check_step(m, &c, p->name, si, p->n_steps, &body_left, &route, &n_args) != 0) return -1;
    if (pg && build_program(m, pg, p, steps_off, n_args) != 0) return -1;
  }
  if (c.off != m->plan_size) return corrupt("%zu unexpected bytes after the last program", m->plan_size - c.off);

  /* programs: present, right token counts, inputs and outputs inside the arena */
  int staged = m->prog[EL_PROG_STAGE_EMBED].present + m->prog[EL_PROG_STAGE_RUN].present;
  if (staged == 1) return corrupt("plan.bin has one of npu_embed / npu_prefill without the other");
  /* the NPU graphs take every layer's whole cache, position p at row p */
  if (staged && m->window_caches) return corrupt("a staged (NPU) prefill with %d window caches", m->window_caches);
  m->kv_host_moves = 0;
  for (int k = 0; k < EL_N_PROGRAMS; k++)
    if (m->prog[k].present && !(m->backends[m->prog[k].slot].be->caps & EL_BACKEND_DEVICE_KV)) m->kv_host_moves = 1;
  for (int k = 0; k < EL_N_PROGRAMS; k++) {
    const el_program* pg = &m->prog[k];
    int npu = k == EL_PROG_STAGE_EMBED || k == EL_PROG_STAGE_RUN;
    if (!pg->present && (k == EL_PROG_PREFILL_SHORT || k == EL_PROG_VERIFY || npu)) continue;
    if (!pg->present)
      return el_error("plan.bin has no program \"%s\": the package was made by an incompatible compiler; "
                      "recompile it with this edgellm", PROGRAM_NAMES[k]);
    const el_plan_program* p = &pg->p;
    if (k == EL_PROG_PREFILL_SHORT) {
      if (p->tokens < 1 || p->tokens >= h->chunk)
        return corrupt("program %s runs %u tokens, expected 1..%u", p->name, p->tokens, h->chunk - 1);
      if (p->out_row_bytes != m->prog[EL_PROG_PREFILL].p.out_row_bytes)
        return corrupt("program %s has output rows of %llu bytes, prefill's are %llu", p->name,
                       (unsigned long long)p->out_row_bytes, (unsigned long long)m->prog[EL_PROG_PREFILL].p.out_row_bytes);
    } else if (k == EL_PROG_VERIFY) {
      /* its padded rows land past the position like a prefill chunk's: within the rows past the context */
      if (p->tokens < 2 || p->tokens > h->chunk || p->tokens > EL_MAX_DRAFT + 1 ||
          p->tokens - 1 > h->kv_rows - h->max_ctx)
        return corrupt("program %s runs %u tokens, expected 2..%u", p->name, p->tokens,
                       h->chunk < h->kv_rows - h->max_ctx + 1 ? h->chunk : h->kv_rows - h->max_ctx + 1);
    } else if (npu) {
      const el_plan_program* e = &m->prog[EL_PROG_STAGE_EMBED].p;
      if (p->tokens < 1 || p->tokens != e->tokens || p->tokens > h->kv_rows - h->max_ctx)
        return corrupt("program %s runs %u tokens (npu_embed %u, cache rows past the context %u)", p->name, p->tokens,
                       e->tokens, h->kv_rows - h->max_ctx);
      if (k == EL_PROG_STAGE_RUN && p->in_offset != e->out_offset)
        return corrupt("program %s must take npu_embed's output as its input", p->name);
      if (k == EL_PROG_STAGE_RUN && m->backends[pg->slot].programs != 1u << k)
        return corrupt("program %s must run on a backend of its own (it names \"%s\", which runs other programs)",
                       p->name, p->backend);
    } else {
      uint32_t want_t = (k == EL_PROG_PREFILL || k == EL_PROG_PREFILL_LOGITS) ? h->chunk : 1;
      if (p->tokens != want_t) return corrupt("program %s runs %u tokens, expected %u", p->name, p->tokens, want_t);
    }
    int hidden_out = k == EL_PROG_PREFILL || k == EL_PROG_PREFILL_SHORT || npu;
    if (!hidden_out && p->out_row_bytes != 4ull * h->vocab)
      return corrupt("program %s has output rows of %llu bytes, expected vocab * 4 = %llu", p->name,
                     (unsigned long long)p->out_row_bytes, 4ull * h->vocab);
    if (hidden_out && p->out_row_bytes != 4ull * h->dim)
      return corrupt("program %s has output rows of %llu bytes, expected dim * 4 = %llu", p->name,
                     (unsigned long long)p->out_row_bytes, 4ull * h->dim);
    if (!fits(p->out_offset, p->out_row_bytes * p->tokens, h->arena_bytes))
      return corrupt("program %s output [%llu, %u rows of %llu bytes) lies outside the arena (%llu bytes)", p->name,
                     (unsigned long long)p->out_offset, p->tokens, (unsigned long long)p->out_row_bytes,
                     (unsigned long long)h->arena_bytes);
    if (p->in_offset % EL_TENSOR_ALIGN || p->out_offset % EL_TENSOR_ALIGN)
      return corrupt("program %s input/output offsets %llu/%llu are not multiples of %d", p->name,
                     (unsigned long long)p->in_offset, (unsigned long long)p->out_offset, EL_TENSOR_ALIGN);
    if ((p->flags & EL_PROGRAM_TREE) && (k != EL_PROG_VERIFY || p->tokens > 32))
      return corrupt("program %s takes a token tree: only verify may, with at most 32 tokens", p->name);
    if ((p->flags & EL_PROGRAM_ROWS) && !(p->flags & EL_PROGRAM_TREE))
      return corrupt("program %s takes a row count without a token tree", p->name);
    uint64_t in_bytes = k == EL_PROG_HEAD            ? 4ull * h->dim
                        : k == EL_PROG_STAGE_RUN     ? 4ull * h->dim * p->tokens
                        : p->flags & EL_PROGRAM_ROWS ? EL_ROWS_OFFSET(p->tokens) + EL_ROWS_BYTES
                        : p->flags & EL_PROGRAM_TREE ? EL_TREE_OFFSET(p->tokens) + 4ull * p->tokens * (p->tokens + 1)
                                                     : 4ull * p->tokens;
    if (!fits(p->in_offset, in_bytes, h->arena_bytes))
      return corrupt("program %s input [%llu, +%llu) lies outside the arena (%llu bytes)", p->name,
                     (unsigned long long)p->in_offset, (unsigned long long)in_bytes,
                     (unsigned long long)h->arena_bytes);
    if (k == EL_PROG_STAGE_RUN && p->in_offset < p->out_offset + p->out_row_bytes * p->tokens &&
        p->out_offset < p->in_offset + in_bytes)
      return corrupt("program %s input and output overlap", p->name);
  }
  return 0;
}

/* The per-layer KV table (version 5; older plans: every layer full) and where each layer's K and V sit in a
 * context's cache memory. Sets *at past the table. */
static int read_kv_layers(el_model* m, size_t* at) {
  const el_plan_header* h = &m->h;
  uint32_t L = h->n_layers, room = h->kv_rows - h->max_ctx; /* rows a run may write past max_ctx (its chunk) */
  m->kv_layers = calloc(L ? L : 1, sizeof *m->kv_layers);
  m->kv_offset = calloc(2 * (size_t)L + 1, sizeof *m->kv_offset);
  if (!m->kv_layers || !m->kv_offset) return el_error("out of memory");
  cursor c = {m->plan, m->plan_size, *at};
  const el_plan_kv_layer* t = h->version >= 5 ? take(&c, sizeof *t, L) : NULL;
  if (h->version >= 5 && !t) return corrupt("the KV table (%u layers) runs past the end of the file", L);
  *at = c.off;
  uint64_t k_row = el_kv_row_bytes(h, 0), v_row = el_kv_row_bytes(h, 1), off = 0;
  m->window_caches = 0;
  for (uint32_t l = 0; l < L; l++) {
    el_plan_kv_layer k = t ? t[l] : (el_plan_kv_layer){h->kv_rows, 0};
    if (k.rows > h->kv_rows || k.window > h->kv_rows || (k.rows < h->kv_rows && k.window == 0))
      return corrupt("layer %u has a KV cache of %u rows with window %u (kv_rows %u)", l, k.rows, k.window, h->kv_rows);
    if (k.rows < h->kv_rows) {
      uint32_t ctx = k.rows > room ? k.rows - room : 0, need = 2 * k.window - 2 > k.window ? 2 * k.window - 2 : k.window;
      if (ctx < need)
        return corrupt("layer %u's window cache of %u rows is too small for window %u and runs of %u tokens", l,
                       k.rows, k.window, room);
      m->window_caches++;
    }
    m->kv_layers[l] = k;
    uint64_t kb, vb;
    if (__builtin_mul_overflow(k_row, (uint64_t)k.rows, &kb) || kb > ((uint64_t)1 << 40) ||
        __builtin_mul_overflow(v_row, (uint64_t)k.rows, &vb) || vb > ((uint64_t)1 << 40))
      return corrupt("KV cache of %u rows x %u heads x %u", k.rows, h->n_kv_heads, h->head_dim);
    kb = (kb + 63) / 64 * 64, vb = (vb + 63) / 64 * 64;
    m->kv_offset[2 * l] = off, m->kv_offset[2 * l + 1] = off + kb, off += kb + vb;
  }
  m->kv_offset[2 * (size_t)L] = off;
  return 0;
}

int el_plan_read(el_model* m) {
  el_plan_header* h = &m->h;
  memcpy(h, m->plan, m->plan_size < sizeof *h ? m->plan_size : sizeof *h);
  if (check_header(h, m->plan_size) != 0) return -1;
  /* KV cache sizes first: check_arg bounds-checks cache views against them */
  size_t at = sizeof *h;
  if (read_kv_layers(m, &at) != 0) return -1;
  return parse_plan(m, at);
}
