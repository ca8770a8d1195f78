/* libedgellm executor: loads a package (plan.bin + weights.bin + kernels.so), validates every byte it will
 * trust, and runs the plan's programs by calling TVM-compiled kernels through their C ABI.
 *
 * At load everything a run needs is prepared: the arena, the KV caches, and for every step its DLTensors
 * and TVMFFIAny arguments. A run then only patches data pointers (weights, per-position views, the KV prefix
 * length) and calls the kernels in order.
 */
#define _GNU_SOURCE
#ifndef EL_STATIC_KERNELS
#include <dlfcn.h>
#endif
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#if defined(__aarch64__) && defined(__linux__)
#include <sys/auxv.h>
#endif

#include "../offload/weight_store.h"
#include "el_internal.h"
#include "plan_format.h"

#define EL_VERSION_STRING "0.1.0"
#define EL_ALIGN 64 /* alignment TVM assumes for every tensor's data pointer */
#define PLAN_MAX_BYTES (256u << 20) /* a plan is a few MB at most; refuse to read garbage of any size */

/* plan.bin is read as an array of these structs: pin the layouts compiler/plan_writer.py writes. */
_Static_assert(sizeof(el_plan_header) == 216, "el_plan_header layout");
_Static_assert(sizeof(el_plan_weight) == 16, "el_plan_weight layout");
_Static_assert(sizeof(el_plan_kernel) == 64, "el_plan_kernel layout");
_Static_assert(sizeof(el_plan_program) == 56, "el_plan_program layout");
_Static_assert(sizeof(el_plan_step) == 8, "el_plan_step layout");
_Static_assert(sizeof(el_plan_arg) == 64, "el_plan_arg layout");

#if defined(__aarch64__)
#define FEATURE_HINT "a target this CPU supports (see `edgellm targets`; --target rpi4 needs only NEON)"
#define ARCH_HINT "this device's target (--target rpi4, rpi5 or android-cpu)"
#else
#define FEATURE_HINT "--target host"
#define ARCH_HINT "--target host"
#endif

#if defined(__x86_64__)
#define HOST_ARCH EL_ARCH_X86_64
#define HOST_EM 62
#define HOST_NAME "x86_64"
#elif defined(__aarch64__)
#define HOST_ARCH EL_ARCH_AARCH64
#define HOST_EM 183
#define HOST_NAME "aarch64"
#else
#define HOST_ARCH 0
#define HOST_EM 0
#define HOST_NAME "this architecture"
#endif

/* Errors ----------------------------------------------------------------------------------------------------- */

static _Thread_local char last_error[1024];

int el_error(const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(last_error, sizeof last_error, fmt, ap);
  va_end(ap);
  return -1;
}

EL_API const char* el_last_error(void) { return last_error; }
EL_API const char* el_version(void) { return EL_VERSION_STRING; }

/* A kernel may fail on a worker thread, so its message goes to a process-wide slot that the executor reads
 * (and clears) when the kernel returns nonzero. */
static pthread_mutex_t kernel_msg_mu = PTHREAD_MUTEX_INITIALIZER;
static char kernel_msg[1024];

static void kernel_error_hook(const char* msg) {
  pthread_mutex_lock(&kernel_msg_mu);
  snprintf(kernel_msg, sizeof kernel_msg, "%s", msg ? msg : "");
  pthread_mutex_unlock(&kernel_msg_mu);
}

static void take_kernel_msg(char* out, size_t n) {
  pthread_mutex_lock(&kernel_msg_mu);
  snprintf(out, n, "%s", kernel_msg[0] ? kernel_msg : "(the kernel gave no message)");
  kernel_msg[0] = 0;
  pthread_mutex_unlock(&kernel_msg_mu);
}

/* Model ------------------------------------------------------------------------------------------------------ */

/* prefill_short is optional (packages with long chunks carry it, see el_prefill); the others are required */
enum { PROG_PREFILL, PROG_PREFILL_LOGITS, PROG_DECODE, PROG_HEAD, PROG_PREFILL_SHORT, N_PROGRAMS };
static const char* const PROGRAM_NAMES[N_PROGRAMS] = {"prefill", "prefill_logits", "decode", "head", "prefill_short"};

typedef struct {
  TVMFFISafeCallType fn;   /* set once kernels.so is open */
  uint32_t kernel_index;
  const char* kernel;      /* name, for messages */
  uint32_t n_args;
  const el_plan_arg* args; /* into the plan bytes */
  DLTensor* t;             /* [n_args], shape -> shape[4 * i] */
  TVMFFIAny* any;          /* [n_args], v_ptr -> &t[i] */
  int64_t* shape;          /* [4 * n_args], ours: PREFIX args get shape[0] patched per run */
  uint64_t* row_bytes;     /* [n_args] bytes of one row (shape[1..] elements), for AT_POS / PREFIX */
  double prof_s;           /* EDGELLM_PROFILE: seconds spent in this step, summed over runs */
  uint64_t prof_calls;
} step;

typedef struct {
  el_plan_program p;
  uint32_t n_steps;
  step* steps;
  double prof_wall_s; /* EDGELLM_PROFILE: seconds of whole runs (kernels + what lies between them) */
} program;

struct el_model {
  el_plan_header h;
  uint8_t* plan; /* whole plan.bin; the tables below point into it */
  const el_plan_weight* weights;
  const el_plan_kernel* kernels;
  void* dl; /* kernels.so */
  TVMFFISafeCallType* kfn;
  el_weight_store* store;
  uint8_t* arena;
  size_t arena_map;
  uint8_t* caches; /* K and V of every layer, each cache_stride bytes: K(l) = 2l, V(l) = 2l + 1 */
  size_t caches_map, cache_stride;
  uint64_t cache_bytes; /* valid bytes of one cache: kv_rows * n_kv_heads * head_dim * 4 */
  program prog[N_PROGRAMS];
  int pos, n_threads;
  int barriers; /* kernels.so calls TVMBackendParallelBarrier: tasks need a thread each */
  el_stats stats;
};

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* Zeroed, page-aligned memory straight from the kernel: no memset of big caches, pages appear on first use. */
static void* map_zeroed(size_t bytes) {
  void* p = mmap(NULL, bytes ? bytes : 1, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  return p == MAP_FAILED ? NULL : p;
}

static uint8_t* cache_of(el_model* m, uint32_t kind, uint32_t layer) {
  return m->caches + m->cache_stride * (2 * (size_t)layer + (kind == EL_ARG_VCACHE));
}

/* Loading: files --------------------------------------------------------------------------------------------- */

static void* read_file(const char* path, const char* name, size_t* size) {
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    el_error("cannot open %s: %s; is this an edgellm package directory (made by `edgellm compile`)?", path,
             strerror(errno));
    return NULL;
  }
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    el_error("%s is not a regular file; recompile the package or copy it again", path);
    close(fd);
    return NULL;
  }
  if ((uint64_t)st.st_size > PLAN_MAX_BYTES) {
    el_error("%s is %lld bytes, more than any plan (%u): the package is corrupt; recompile it", name,
             (long long)st.st_size, PLAN_MAX_BYTES);
    close(fd);
    return NULL;
  }
  size_t n = (size_t)st.st_size, done = 0;
  uint8_t* buf = malloc(n + 8);
  if (!buf) {
    el_error("out of memory reading %s", path);
    close(fd);
    return NULL;
  }
  while (done < n) {
    ssize_t got = read(fd, buf + done, n - done);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) {
      el_error("cannot read %s: %s; copy the package again", path, got < 0 ? strerror(errno) : "file shrank");
      free(buf);
      close(fd);
      return NULL;
    }
    done += (size_t)got;
  }
  close(fd);
  *size = n;
  return buf;
}

/* Loading: plan ---------------------------------------------------------------------------------------------- */

typedef struct {
  const uint8_t* p;
  size_t size, off;
} cursor;

/* Next n * count bytes of the plan, or NULL if the file ends first (overflow-safe). */
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

static int check_header(const el_plan_header* h, size_t file_size) {
  if (file_size < sizeof *h)
    return el_error("plan.bin is truncated: %zu bytes, the header alone needs %zu; recompile the package or copy "
                    "it again", file_size, sizeof *h);
  if (memcmp(h->magic, EL_PLAN_MAGIC, 8) != 0)
    return el_error("plan.bin is not an edgellm plan (bad magic); point el_load at a package directory made by "
                    "`edgellm compile`");
  if (h->version != EL_PLAN_VERSION)
    return el_error("package format version %u, this runtime reads %d: recompile with this edgellm", h->version,
                    EL_PLAN_VERSION);
  if (h->arch != EL_ARCH_X86_64 && h->arch != EL_ARCH_AARCH64) return corrupt("unknown arch %u", h->arch);
  if (h->vocab == 0 || h->vocab > INT_MAX / 4) return corrupt("vocab %u", h->vocab);
  if (h->max_ctx == 0 || h->max_ctx > (1u << 30)) return corrupt("max_ctx %u", h->max_ctx);
  if (h->chunk == 0 || h->chunk > (1u << 20)) return corrupt("chunk %u", h->chunk);
  if (h->kv_rows < h->max_ctx) return corrupt("kv_rows %u < max_ctx %u", h->kv_rows, h->max_ctx);
  if (h->kv_dtype_bits != 32)
    return el_error("plan.bin asks for a %u-bit KV cache, this runtime has only f32 (32): recompile the package "
                    "with this edgellm", h->kv_dtype_bits);
  if (h->n_layers > (1u << 16)) return corrupt("n_layers %u", h->n_layers);
  if (h->n_eos < 0 || h->n_eos > 8) return corrupt("n_eos %d (at most 8)", h->n_eos);
  if (h->bos_id < -1 || h->bos_id >= (int32_t)h->vocab) return corrupt("bos_id %d, vocab %u", h->bos_id, h->vocab);
  for (int i = 0; i < h->n_eos; i++)
    if (h->eos_ids[i] < 0 || h->eos_ids[i] >= (int32_t)h->vocab)
      return corrupt("eos id %d outside the vocab of %u", h->eos_ids[i], h->vocab);
  if (h->arena_bytes > ((uint64_t)1 << 40)) return corrupt("arena_bytes %llu", (unsigned long long)h->arena_bytes);
  return 0;
}

/* Bytes of the tensor an arg describes, and of one row (shape[1..]); -1 if the shape is malformed. */
static int arg_sizes(const el_plan_arg* a, uint64_t* bytes, uint64_t* row_bytes) {
  uint32_t b = a->dtype_bits;
  if (a->ndim > 4 || a->dtype_lanes != 1 || !(b == 1 || b == 2 || b == 4 || b == 8 || b == 16 || b == 32 || b == 64))
    return -1;
  uint64_t elems = 1, row = 1;
  for (uint32_t d = 0; d < a->ndim; d++) {
    if (a->shape[d] < 0 || a->shape[d] > ((int64_t)1 << 40)) return -1;
    if (__builtin_mul_overflow(elems, (uint64_t)a->shape[d], &elems) || elems > ((uint64_t)1 << 48)) return -1;
    if (d > 0) row *= (uint64_t)a->shape[d]; /* <= elems: no overflow */
  }
  *bytes = (elems * b + 7) / 8;
  *row_bytes = row * b / 8;
  return 0;
}

/* Every arg, checked against the largest position any run can use: a run starts at pos <= max_ctx - 1
 * (prefill needs pos + n <= max_ctx with n >= 1, decode pos + 1 <= max_ctx). */
static int check_arg(const el_model* m, const char* prog, uint32_t si, uint32_t ai, const el_plan_arg* a) {
  const el_plan_header* h = &m->h;
  uint64_t bytes, row, extent, last = h->max_ctx - 1;
  char where[96];
  snprintf(where, sizeof where, "program %s step %u arg %u", prog, si, ai);
  if (arg_sizes(a, &bytes, &row) != 0)
    return corrupt("%s has a bad shape or dtype (ndim %u, dtype %u/%u/%u)", where, a->ndim, a->dtype_code,
                   a->dtype_bits, a->dtype_lanes);
  if (a->flags & ~(uint32_t)(EL_FLAG_AT_POS | EL_FLAG_PREFIX)) return corrupt("%s has unknown flags %#x", where, a->flags);
  if ((a->flags & EL_FLAG_AT_POS) && (a->flags & EL_FLAG_PREFIX)) return corrupt("%s is both AT_POS and PREFIX", where);
  if (a->flags && a->ndim == 0) return corrupt("%s is a per-position view of a scalar", where);
  if (a->flags && a->dtype_bits < 8) {
    uint64_t row_elems = 1;
    for (uint32_t d = 1; d < a->ndim; d++) row_elems *= (uint64_t)a->shape[d];
    if (row_elems * a->dtype_bits % 8) return corrupt("%s: rows of %u-bit elements are not whole bytes", where, a->dtype_bits);
  }
  /* TVM compiles every buffer with a 64-byte alignment assumption by default (llvm.assume + aligned vector
   * moves), so a misaligned view is not slow but a crash (the fuzz test found it): every view starts 64-byte
   * aligned. A per-position view (AT_POS) then moves by pos * row bytes, which keeps only gcd(row, 64): kernels
   * taking such args with rows that are not multiples of 64 bytes must be compiled with that lower alignment
   * (match_buffer align / offset_factor). That is the compiler's side of the contract; we cannot check it. */
  if (a->offset % EL_ALIGN)
    return corrupt("%s: offset %llu is not a multiple of %d (TVM kernels assume %d-byte aligned tensors)", where,
                   (unsigned long long)a->offset, EL_ALIGN, EL_ALIGN);
  uint64_t at_pos = 0;
  if ((a->flags & EL_FLAG_AT_POS) && __builtin_mul_overflow(last, row, &at_pos))
    return corrupt("%s: position offsets overflow", where);
  if (__builtin_add_overflow(bytes, at_pos, &extent)) return corrupt("%s: size overflows", where);
  switch (a->kind) {
    case EL_ARG_ARENA:
      if (a->flags) return corrupt("%s: arena args take no flags", where);
      if (!fits(a->offset, bytes, h->arena_bytes))
        return corrupt("%s reads arena bytes [%llu, +%llu) beyond arena_bytes %llu", where,
                       (unsigned long long)a->offset, (unsigned long long)bytes, (unsigned long long)h->arena_bytes);
      return 0;
    case EL_ARG_WEIGHT:
      if (a->index >= h->n_weights) return corrupt("%s names weight %u, the plan has %u", where, a->index, h->n_weights);
      if (a->flags & EL_FLAG_PREFIX) return corrupt("%s: PREFIX applies to KV caches only", where);
      if (!fits(a->offset, extent, m->weights[a->index].nbytes))
        return corrupt("%s reads [%llu, +%llu) of weight %u, which has %llu bytes", where,
                       (unsigned long long)a->offset, (unsigned long long)extent, a->index,
                       (unsigned long long)m->weights[a->index].nbytes);
      return 0;
    case EL_ARG_KCACHE:
    case EL_ARG_VCACHE:
      if (a->index >= h->n_layers) return corrupt("%s names layer %u, the model has %u", where, a->index, h->n_layers);
      if (a->dtype_code != EL_DT_FLOAT || a->dtype_bits != h->kv_dtype_bits)
        return corrupt("%s views the f32 KV cache as dtype %u/%u", where, a->dtype_code, a->dtype_bits);
      if ((a->flags & EL_FLAG_PREFIX) && __builtin_mul_overflow(last + (uint64_t)a->shape[0], row, &extent))
        return corrupt("%s: prefix size overflows", where);
      if (!fits(a->offset, extent, m->cache_bytes))
        return corrupt("%s reaches [%llu, +%llu) of a KV cache of %llu bytes (kv_rows %u)", where,
                       (unsigned long long)a->offset, (unsigned long long)extent,
                       (unsigned long long)m->cache_bytes, h->kv_rows);
      return 0;
    default:
      return corrupt("%s has unknown kind %u", where, a->kind);
  }
}

/* Parses and checks everything after the header; builds the step arrays of the four programs. */
static int parse_plan(el_model* m, size_t size) {
  const el_plan_header* h = &m->h;
  cursor c = {m->plan, size, sizeof(el_plan_header)};
  if (!(m->weights = take(&c, sizeof(el_plan_weight), h->n_weights)))
    return corrupt("the weight table (%u entries) runs past the end of the file", h->n_weights);
  if (!(m->kernels = take(&c, sizeof(el_plan_kernel), h->n_kernels)))
    return corrupt("the kernel table (%u entries) runs past the end of the file", h->n_kernels);
  for (uint32_t i = 0; i < h->n_weights; i++) {
    if (m->weights[i].offset % EL_ALIGN)
      return corrupt("weight %u starts at byte %llu, not a multiple of %d", i,
                     (unsigned long long)m->weights[i].offset, EL_ALIGN);
    if (!fits(m->weights[i].offset, m->weights[i].nbytes, h->weights_bytes))
      return corrupt("weight %u at [%llu, +%llu) lies outside weights.bin (%llu bytes)", i,
                     (unsigned long long)m->weights[i].offset, (unsigned long long)m->weights[i].nbytes,
                     (unsigned long long)h->weights_bytes);
  }
  for (uint32_t i = 0; i < h->n_kernels; i++)
    if (!memchr(m->kernels[i].name, 0, sizeof m->kernels[i].name) || !m->kernels[i].name[0])
      return corrupt("kernel %u has no NUL-terminated name", i);
  for (uint32_t pi = 0; pi < h->n_programs; pi++) {
    const el_plan_program* p = take(&c, sizeof *p, 1);
    if (!p) return corrupt("program %u of %u runs past the end of the file", pi, h->n_programs);
    if (!memchr(p->name, 0, sizeof p->name)) return corrupt("program %u has no NUL-terminated name", pi);
    int which = -1;
    for (int k = 0; k < N_PROGRAMS; k++)
      if (!strcmp(p->name, PROGRAM_NAMES[k])) which = k;
    /* unknown programs (from a newer compiler) are checked, then skipped */
    program* pg = which >= 0 ? &m->prog[which] : NULL;
    if (pg && pg->steps) return corrupt("program %s appears twice", p->name);
    size_t steps_off = c.off;
    uint64_t n_arg_total = 0;
    for (uint32_t si = 0; si < p->n_steps; si++) { /* pass 1: walk and check */
      const el_plan_step* s = take(&c, sizeof *s, 1);
      if (!s) return corrupt("program %s step %u runs past the end of the file", p->name, si);
      if (s->kernel >= h->n_kernels)
        return corrupt("program %s step %u calls kernel %u, the plan has %u", p->name, si, s->kernel, h->n_kernels);
      const el_plan_arg* args = take(&c, sizeof *args, s->n_args);
      if (!args) return corrupt("program %s step %u: %u args run past the end of the file", p->name, si, s->n_args);
      for (uint32_t ai = 0; ai < s->n_args; ai++)
        if (check_arg(m, p->name, si, ai, &args[ai]) != 0) return -1;
      n_arg_total += s->n_args;
    }
    if (!pg) continue;
    /* pass 2: build the run-time arrays (one block per program) */
    pg->p = *p;
    pg->n_steps = p->n_steps;
    size_t per_arg = sizeof(DLTensor) + sizeof(TVMFFIAny) + 4 * sizeof(int64_t) + sizeof(uint64_t);
    uint8_t* mem = calloc(1, sizeof(step) * (p->n_steps + 1) + per_arg * (size_t)n_arg_total);
    if (!mem) return el_error("out of memory building program %s", p->name);
    pg->steps = (step*)mem;
    DLTensor* t = (DLTensor*)(mem + sizeof(step) * (p->n_steps + 1));
    TVMFFIAny* any = (TVMFFIAny*)(t + n_arg_total);
    int64_t* shape = (int64_t*)(any + n_arg_total);
    uint64_t* rows = (uint64_t*)(shape + 4 * n_arg_total);
    cursor c2 = {m->plan, size, steps_off};
    for (uint32_t si = 0; si < p->n_steps; si++) {
      const el_plan_step* s = take(&c2, sizeof *s, 1);
      const el_plan_arg* args = take(&c2, sizeof *args, s->n_args);
      step* st = &pg->steps[si];
      st->kernel = m->kernels[s->kernel].name;
      st->kernel_index = s->kernel;
      st->n_args = s->n_args;
      st->args = args;
      st->t = t, st->any = any, st->shape = shape, st->row_bytes = rows;
      for (uint32_t ai = 0; ai < s->n_args; ai++) {
        const el_plan_arg* a = &args[ai];
        uint64_t bytes;
        arg_sizes(a, &bytes, &rows[ai]);
        memcpy(&shape[4 * ai], a->shape, sizeof a->shape);
        t[ai].device.device_type = kDLCPU;
        t[ai].device.device_id = 0;
        t[ai].ndim = (int32_t)a->ndim;
        t[ai].dtype.code = a->dtype_code;
        t[ai].dtype.bits = a->dtype_bits;
        t[ai].dtype.lanes = a->dtype_lanes;
        t[ai].shape = &shape[4 * ai];
        t[ai].strides = NULL;
        t[ai].byte_offset = 0;
        any[ai].type_index = kTVMFFIDLTensorPtr;
        any[ai].v_ptr = &t[ai];
      }
      t += s->n_args, any += s->n_args, shape += 4 * s->n_args, rows += s->n_args;
    }
  }
  if (c.off != size) return corrupt("%zu unexpected bytes after the last program", size - c.off);

  /* programs: present, right token counts, inputs and outputs inside the arena */
  for (int k = 0; k < N_PROGRAMS; k++) {
    const program* pg = &m->prog[k];
    if (!pg->steps && k == PROG_PREFILL_SHORT) continue;
    if (!pg->steps)
      return el_error("plan.bin has no program \"%s\": the package was made by an incompatible compiler; "
                      "recompile it with this edgellm", PROGRAM_NAMES[k]);
    const el_plan_program* p = &pg->p;
    if (k == PROG_PREFILL_SHORT) {
      if (p->tokens < 1 || p->tokens >= h->chunk)
        return corrupt("program %s runs %u tokens, expected 1..%u", p->name, p->tokens, h->chunk - 1);
      if (p->out_row_bytes != m->prog[PROG_PREFILL].p.out_row_bytes)
        return corrupt("program %s has output rows of %llu bytes, prefill's are %llu", p->name,
                       (unsigned long long)p->out_row_bytes, (unsigned long long)m->prog[PROG_PREFILL].p.out_row_bytes);
    } else {
      uint32_t want_t = (k == PROG_PREFILL || k == PROG_PREFILL_LOGITS) ? h->chunk : 1;
      if (p->tokens != want_t) return corrupt("program %s runs %u tokens, expected %u", p->name, p->tokens, want_t);
    }
    if (k != PROG_PREFILL && k != PROG_PREFILL_SHORT && p->out_row_bytes != 4ull * h->vocab)
      return corrupt("program %s has output rows of %llu bytes, expected vocab * 4 = %llu", p->name,
                     (unsigned long long)p->out_row_bytes, 4ull * h->vocab);
    if (p->out_row_bytes == 0 || p->out_row_bytes > h->arena_bytes ||
        !fits(p->out_offset, p->out_row_bytes * p->tokens, h->arena_bytes))
      return corrupt("program %s output [%llu, %u rows of %llu bytes) lies outside the arena (%llu bytes)", p->name,
                     (unsigned long long)p->out_offset, p->tokens, (unsigned long long)p->out_row_bytes,
                     (unsigned long long)h->arena_bytes);
    if (p->in_offset % EL_ALIGN || p->out_offset % EL_ALIGN)
      return corrupt("program %s input/output offsets %llu/%llu are not multiples of %d", p->name,
                     (unsigned long long)p->in_offset, (unsigned long long)p->out_offset, EL_ALIGN);
    uint64_t in_bytes = k == PROG_HEAD ? m->prog[PROG_PREFILL].p.out_row_bytes : 4ull * p->tokens;
    if (!fits(p->in_offset, in_bytes, h->arena_bytes))
      return corrupt("program %s input [%llu, +%llu) lies outside the arena (%llu bytes)", p->name,
                     (unsigned long long)p->in_offset, (unsigned long long)in_bytes,
                     (unsigned long long)h->arena_bytes);
  }
  return 0;
}

/* Loading: kernels.so ---------------------------------------------------------------------------------------- */

static const char* arch_name(uint32_t arch) {
  return arch == EL_ARCH_X86_64 ? "x86_64" : arch == EL_ARCH_AARCH64 ? "aarch64" : "an unknown architecture";
}

static __attribute__((unused)) const char* em_name(unsigned em) {
  switch (em) {
    case 62: return "x86_64";
    case 183: return "aarch64";
    case 40: return "32-bit arm";
    case 3: return "i386";
    case 243: return "riscv";
    default: return "another machine";
  }
}

/* 1: the CPU has it, 0: it lacks it, -1: a name we do not know (ignored). */
static int cpu_has(const char* f) {
#if defined(__x86_64__)
  __builtin_cpu_init();
#define X(s) if (!strcmp(f, s)) return __builtin_cpu_supports(s) != 0;
  X("sse4.2") X("avx") X("avx2") X("fma") X("f16c") X("bmi2") X("popcnt")
  X("avx512f") X("avx512bw") X("avx512vl") X("avx512dq") X("avx512cd") X("avx512vnni") X("avx512vbmi")
#if !defined(__clang__) || __clang_major__ >= 16 /* names older clang (NDK) rejects at compile time */
  X("avx512bf16") X("avx512fp16") X("avxvnni")
#endif
#undef X
  return -1;
#elif defined(__aarch64__) && defined(__linux__)
  unsigned long hw = getauxval(AT_HWCAP), hw2 = getauxval(AT_HWCAP2);
  /* bit numbers from the kernel's uapi asm/hwcap.h (spelled out: old libc headers lack the newer ones) */
  if (!strcmp(f, "neon") || !strcmp(f, "asimd")) return (hw >> 1) & 1;
  if (!strcmp(f, "fp")) return hw & 1;
  if (!strcmp(f, "fp16") || !strcmp(f, "fullfp16")) return ((hw >> 9) & 1) && ((hw >> 10) & 1);
  if (!strcmp(f, "dotprod")) return (hw >> 20) & 1;
  if (!strcmp(f, "sve")) return (hw >> 22) & 1;
  if (!strcmp(f, "sve2")) return (hw2 >> 1) & 1;
  if (!strcmp(f, "i8mm")) return (hw2 >> 13) & 1;
  if (!strcmp(f, "bf16")) return (hw2 >> 14) & 1;
  return -1;
#else
  (void)f;
  return -1;
#endif
}

/* The package's machine and CPU features against this process (before any kernel code runs). */
static int check_machine(const el_plan_header* h) {
  char target[sizeof h->target + 1];
  memcpy(target, h->target, sizeof h->target);
  target[sizeof h->target] = 0;
  if (h->arch != HOST_ARCH)
    return el_error("kernels.so was built for %s (target %s), this machine is %s: compile the package with "
                    ARCH_HINT, arch_name(h->arch), target[0] ? target : "?", HOST_NAME);
  /* features: "avx2,fma" (LLVM "+avx2" and "-feature" entries tolerated) */
  char feats[sizeof h->features + 1];
  memcpy(feats, h->features, sizeof h->features);
  feats[sizeof h->features] = 0;
  for (char *save = NULL, *tok = strtok_r(feats, ", ", &save); tok; tok = strtok_r(NULL, ", ", &save)) {
    if (*tok == '-') continue;
    if (*tok == '+') tok++;
    if (*tok && cpu_has(tok) == 0)
      return el_error("kernels.so needs the CPU feature %s, which this CPU lacks (package target %s): compile the "
                      "package with " FEATURE_HINT, tok, target[0] ? target : "?");
  }
  return 0;
}

#ifdef EL_STATIC_KERNELS
/* Kernels linked into this binary (a static executable cannot dlopen: Android's loader refuses, glibc's is
 * fragile). TVM's system-lib object registers each function from a static initializer, before main. */
typedef struct {
  const char* name;
  void* ptr;
} sys_sym;
static sys_sym* sys_syms;
static int n_sys_syms, cap_sys_syms;

EL_API int TVMFFIEnvModRegisterSystemLibSymbol(const char* name, void* ptr) {
  if (n_sys_syms == cap_sys_syms) {
    int cap = cap_sys_syms ? 2 * cap_sys_syms : 64;
    sys_sym* grown = realloc(sys_syms, sizeof *grown * (size_t)cap);
    if (!grown) return -1;
    sys_syms = grown, cap_sys_syms = cap;
  }
  sys_syms[n_sys_syms++] = (sys_sym){name, ptr}; /* name: a string constant of the kernels object */
  return 0;
}

static void* sys_lookup(const char* name) {
  for (int i = 0; i < n_sys_syms; i++)
    if (!strcmp(sys_syms[i].name, name)) return sys_syms[i].ptr;
  return NULL;
}

extern void (*__edgellm_error_hook)(const char* msg); /* runtime/kernel_shim.c, linked in */

#ifndef EL_STATIC_BARRIERS
#define EL_STATIC_BARRIERS 1 /* unknown: assume the kernels may call TVMBackendParallelBarrier */
#endif

static int open_kernels(el_model* m, const char* path) {
  (void)path;
  __edgellm_error_hook = kernel_error_hook;
  m->barriers = EL_STATIC_BARRIERS;
  m->kfn = calloc(m->h.n_kernels + 1, sizeof *m->kfn);
  if (!m->kfn) return el_error("out of memory");
  for (uint32_t i = 0; i < m->h.n_kernels; i++) {
    char sym[96];
    snprintf(sym, sizeof sym, "__tvm_ffi_%s", m->kernels[i].name);
    if (!(m->kfn[i] = (TVMFFISafeCallType)sys_lookup(sym)))
      return el_error("this binary has the kernels of another package linked in (no %s, plan kernel %u): run the "
                      "package with its own bin/edgellm-run, or recompile it", sym, i);
  }
  return 0;
}

static int check_kernels_file(const el_plan_header* h, const char* path) {
  (void)path;
  return check_machine(h);
}
#else
static int check_kernels_file(const el_plan_header* h, const char* path) {
  unsigned char e[64] = {0};
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return el_error("cannot open %s: %s; recompile the package or copy it again", path, strerror(errno));
  ssize_t got = read(fd, e, sizeof e);
  close(fd);
  if (got < 20 || memcmp(e, "\x7f" "ELF", 4) != 0)
    return el_error("kernels.so is not an ELF shared library; recompile the package or copy it again");
  unsigned em = e[5] == 2 ? (unsigned)e[18] << 8 | e[19] : (unsigned)e[19] << 8 | e[18]; /* EI_DATA: 2 = big */
  char target[sizeof h->target + 1];
  memcpy(target, h->target, sizeof h->target);
  target[sizeof h->target] = 0;
  if (em != HOST_EM)
    return el_error("kernels.so was built for %s (target %s), this machine is %s: compile the package with "
                    ARCH_HINT, em_name(em), target[0] ? target : "?", HOST_NAME);
  if ((e[4] == 2) != (sizeof(void*) == 8))
    return el_error("kernels.so is %d-bit, this runtime is %d-bit: compile the package with " ARCH_HINT,
                    e[4] == 2 ? 64 : 32, (int)sizeof(void*) * 8);
  return check_machine(h);
}

static int open_kernels(el_model* m, const char* path) {
  m->dl = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!m->dl) return el_error("cannot load kernels.so: %s; recompile the package", dlerror());
  /* TVM kernels reach their runtime through pointer variables ("context symbols") that the loader fills; the
   * codegen emits one only for what the kernels use. */
  static const char* const unsupported[] = {"__TVMFFIFunctionCall", "__TVMFFIEnvModLookupFromImports",
                                            "__TVMFFIHandleInitOnce"};
  for (size_t i = 0; i < sizeof unsupported / sizeof *unsupported; i++)
    if (dlsym(m->dl, unsupported[i]))
      return el_error("kernels.so needs %s, a TVM runtime service libedgellm does not provide (a kernel makes a "
                      "packed/extern call); recompile the package with this edgellm", unsupported[i] + 2);
  FTVMBackendParallelLaunch* launch = dlsym(m->dl, "__TVMBackendParallelLaunch");
  int (**barrier)(int, TVMParallelGroupEnv*) = dlsym(m->dl, "__TVMBackendParallelBarrier");
  FTVMBackendAllocWorkspace* alloc = dlsym(m->dl, "__TVMBackendAllocWorkspace");
  FTVMBackendFreeWorkspace* free_ws = dlsym(m->dl, "__TVMBackendFreeWorkspace");
  void (**raise)(const char*, const char*) = dlsym(m->dl, "__TVMFFIErrorSetRaisedFromCStr");
  void (*shim_raise)(const char*, const char*) = (void (*)(const char*, const char*))dlsym(m->dl, "TVMFFIErrorSetRaisedFromCStr");
  void (**hook)(const char*) = dlsym(m->dl, "__edgellm_error_hook");
  if (launch) *launch = el_parallel_launch;
  if (barrier) *barrier = el_parallel_barrier;
  if (alloc) *alloc = el_alloc_workspace;
  if (free_ws) *free_ws = el_free_workspace;
  if (raise) *raise = shim_raise; /* the shim's own, which forwards to the hook */
  if (hook) *hook = kernel_error_hook;
  m->barriers = barrier != NULL;
  m->kfn = calloc(m->h.n_kernels + 1, sizeof *m->kfn);
  if (!m->kfn) return el_error("out of memory");
  for (uint32_t i = 0; i < m->h.n_kernels; i++) {
    char sym[96];
    snprintf(sym, sizeof sym, "__tvm_ffi_%s", m->kernels[i].name);
    if (!(m->kfn[i] = (TVMFFISafeCallType)dlsym(m->dl, sym)))
      return el_error("kernels.so has no kernel %s (plan kernel %u): plan.bin and kernels.so do not belong "
                      "together; recompile the package", sym, i);
  }
  return 0;
}
#endif /* EL_STATIC_KERNELS */

/* Public API: load / free ------------------------------------------------------------------------------------ */

/* EDGELLM_PROFILE=1: at el_free, per program a table of its kernels (time summed over the steps that call the
 * same kernel) to stderr, slowest first. Off by default: it costs two clock reads per step. */
static int profiling(void) {
  static int on = -1;
  if (on < 0) {
    const char* s = getenv("EDGELLM_PROFILE");
    on = s && *s && strcmp(s, "0") != 0;
  }
  return on;
}

static void profile_report(const el_model* m) {
  for (int k = 0; k < N_PROGRAMS; k++) {
    const program* pg = &m->prog[k];
    double total = 0;
    uint64_t runs = 0;
    for (uint32_t i = 0; i < pg->n_steps; i++) total += pg->steps[i].prof_s;
    if (pg->n_steps) runs = pg->steps[0].prof_calls;
    if (total <= 0 || !runs) continue;
    fprintf(stderr, "edgellm profile: %s, %llu runs, %.3f ms per run in kernels, %.3f ms per run in all\n",
            PROGRAM_NAMES[k], (unsigned long long)runs, 1e3 * total / runs, 1e3 * pg->prof_wall_s / runs);
    fprintf(stderr, "  %6s %9s %6s  %s\n", "%", "ms/run", "steps", "kernel");
    /* aggregate by kernel name: O(n^2) over a few hundred steps, once */
    char* done = calloc(pg->n_steps, 1);
    for (;;) {
      int best = -1;
      double best_t = -1;
      for (uint32_t i = 0; i < pg->n_steps; i++) {
        if (done[i]) continue;
        double t = 0;
        for (uint32_t j = i; j < pg->n_steps; j++)
          if (!done[j] && strcmp(pg->steps[j].kernel, pg->steps[i].kernel) == 0) t += pg->steps[j].prof_s;
        if (t > best_t) best_t = t, best = (int)i;
      }
      if (best < 0) break;
      int n = 0;
      for (uint32_t j = (uint32_t)best; j < pg->n_steps; j++)
        if (!done[j] && strcmp(pg->steps[j].kernel, pg->steps[best].kernel) == 0) done[j] = 1, n++;
      fprintf(stderr, "  %6.2f %9.3f %6d  %s\n", 100 * best_t / total, 1e3 * best_t / runs, n, pg->steps[best].kernel);
    }
    free(done);
  }
}

EL_API void el_free(el_model* m) {
  if (!m) return;
  if (profiling()) profile_report(m);
  for (int k = 0; k < N_PROGRAMS; k++) free(m->prog[k].steps);
  if (m->store) m->store->close(m->store);
  if (m->arena) munmap(m->arena, m->arena_map);
  if (m->caches) munmap(m->caches, m->caches_map);
  free(m->kfn);
#ifndef EL_STATIC_KERNELS
  if (m->dl) dlclose(m->dl);
#endif
  free(m->plan);
  free(m);
}

EL_API el_model* el_load(const char* dir, int n_threads) {
  if (!dir) return el_error("el_load: package_dir is NULL"), NULL;
  char path[4096];
  el_model* m = calloc(1, sizeof *m);
  if (!m) return el_error("out of memory"), NULL;
  el_plan_header* h = &m->h;
  size_t size;

  snprintf(path, sizeof path, "%s/plan.bin", dir);
  if (!(m->plan = read_file(path, "plan.bin", &size))) goto fail;
  memcpy(h, m->plan, size < sizeof *h ? size : sizeof *h);
  if (check_header(h, size) != 0) goto fail;
  /* KV cache size first: check_arg bounds-checks cache views against it */
  uint64_t per_row = (uint64_t)h->n_kv_heads * h->head_dim * 4;
  if (__builtin_mul_overflow(per_row, (uint64_t)h->kv_rows, &m->cache_bytes) || m->cache_bytes > ((uint64_t)1 << 40)) {
    corrupt("KV cache of %u rows x %u heads x %u", h->kv_rows, h->n_kv_heads, h->head_dim);
    goto fail;
  }
  if (parse_plan(m, size) != 0) goto fail;

  /* weights.bin: exact size before anything maps it */
  snprintf(path, sizeof path, "%s/weights.bin", dir);
  struct stat st;
  if (stat(path, &st) != 0) {
    el_error("cannot open %s: %s; recompile the package or copy it again", path, strerror(errno));
    goto fail;
  }
  if ((uint64_t)st.st_size != h->weights_bytes) {
    if ((uint64_t)st.st_size < h->weights_bytes)
      el_error("weights.bin is truncated: %lld bytes, plan needs %llu; recompile the package or copy it again",
               (long long)st.st_size, (unsigned long long)h->weights_bytes);
    else
      el_error("weights.bin has %lld bytes, plan needs %llu: plan.bin and weights.bin do not belong together; "
               "recompile the package or copy it again", (long long)st.st_size,
               (unsigned long long)h->weights_bytes);
    goto fail;
  }

  /* kernels.so: right machine and CPU features before dlopen (a foreign ELF gives a useless dlerror) */
  snprintf(path, sizeof path, "%s/kernels.so", dir);
  if (check_kernels_file(h, path) != 0 || open_kernels(m, path) != 0) goto fail;
  for (int k = 0; k < N_PROGRAMS; k++)
    for (uint32_t si = 0; si < m->prog[k].n_steps; si++)
      m->prog[k].steps[si].fn = m->kfn[m->prog[k].steps[si].kernel_index];

  m->arena_map = (size_t)h->arena_bytes;
  if (!(m->arena = map_zeroed(m->arena_map))) {
    el_error("out of memory: the arena needs %llu bytes", (unsigned long long)h->arena_bytes);
    goto fail;
  }
  m->cache_stride = (size_t)(m->cache_bytes + 63) / 64 * 64;
  m->caches_map = m->cache_stride * 2 * h->n_layers;
  if (!(m->caches = map_zeroed(m->caches_map))) {
    el_error("out of memory: the KV cache needs %zu bytes; use a package with a shorter max context",
             m->caches_map);
    goto fail;
  }

  snprintf(path, sizeof path, "%s/weights.bin", dir);
  el_store_config cfg = {path, m->weights, h->n_weights, h->weights_bytes};
  char err[512];
  if (!(m->store = el_store_open(getenv("EDGELLM_WEIGHT_POLICY"), &cfg, err, sizeof err))) {
    el_error("%s", err);
    goto fail;
  }

  m->n_threads = n_threads > 0 ? n_threads : el_pool_default_threads();
  if (m->n_threads > 256) m->n_threads = 256;
  if (el_pool_reserve(m->n_threads) != 0) goto fail;
  return m;

fail:
  el_free(m);
  return NULL;
}

/* Executor --------------------------------------------------------------------------------------------------- */

/* Runs program k with `pos` tokens already in the KV cache. */
static int run(el_model* m, int k, int pos) {
  program* pg = &m->prog[k];
  el_weight_store* store = m->store;
  el_pool_set_threads(m->n_threads, m->barriers);
  double t_run = profiling() ? now_s() : 0;
  for (uint32_t si = 0; si < pg->n_steps; si++) {
    step* st = &pg->steps[si];
    uint32_t ai;
    for (ai = 0; ai < st->n_args; ai++) {
      const el_plan_arg* a = &st->args[ai];
      uint64_t at = (a->flags & EL_FLAG_AT_POS) ? (uint64_t)pos * st->row_bytes[ai] : 0;
      uint8_t* base;
      if (a->kind == EL_ARG_ARENA) {
        base = m->arena;
      } else if (a->kind == EL_ARG_WEIGHT) {
        if (!(base = (uint8_t*)store->acquire(store, a->index))) break;
      } else {
        base = cache_of(m, a->kind, a->index);
        if (a->flags & EL_FLAG_PREFIX) st->shape[4 * ai] = pos + a->shape[0];
      }
      st->t[ai].data = base + a->offset + at;
    }
    int rc = -1;
    char msg[1024];
    if (ai == st->n_args) {
      TVMFFIAny ret = {.type_index = kTVMFFINone};
      double t0 = profiling() ? now_s() : 0;
      rc = st->fn(NULL, st->any, (int32_t)st->n_args, &ret);
      if (t0 > 0) st->prof_s += now_s() - t0, st->prof_calls++;
      m->stats.kernel_calls++;
      if (rc != 0) take_kernel_msg(msg, sizeof msg);
    } else {
      snprintf(msg, sizeof msg, "the weight store (%s) could not provide weight %u: %s", store->policy,
               st->args[ai].index, store->err);
    }
    for (uint32_t j = 0; j < ai; j++) /* release what was acquired, also on failure */
      if (st->args[j].kind == EL_ARG_WEIGHT) store->release(store, st->args[j].index);
    if (rc != 0)
      return el_error("kernel %s failed (program %s, step %u, context position %d): %s", st->kernel,
                      PROGRAM_NAMES[k], si, pos, msg);
  }
  if (t_run > 0) pg->prof_wall_s += now_s() - t_run;
  return 0;
}

static int check_ids(const el_model* m, const int32_t* ids, int n) {
  for (int i = 0; i < n; i++)
    if (ids[i] < 0 || (uint32_t)ids[i] >= m->h.vocab)
      return el_error("token id %d (at index %d) is outside the vocabulary [0, %u)", ids[i], i, m->h.vocab);
  return 0;
}

EL_API int el_prefill(el_model* m, const int32_t* ids, int n, float* logits, int all_logits) {
  if (!m || !ids) return el_error("el_prefill: model or ids is NULL");
  int max = (int)m->h.max_ctx;
  if (n <= 0) return el_error("el_prefill: prompt of %d tokens; it needs at least one", n);
  if (n > max - m->pos)
    return el_error("prompt of %d tokens does not fit: context is at %d of %d; call el_reset() or shorten the "
                    "prompt", n, m->pos, max);
  if (check_ids(m, ids, n) != 0) return -1;
  double t0 = now_s();
  int start = m->pos, valid = 0;
  int k = (all_logits && logits) ? PROG_PREFILL_LOGITS : PROG_PREFILL;
  const el_plan_program* p = &m->prog[k].p;
  for (int done = 0; done < n; done += valid) {
    /* A last piece of at most half a chunk runs through prefill_short when the package has it: a chunk costs the
     * same however few of its rows are real (1B f16, 128-token chunks: 590 ms for a 5-token prompt, 125 ms as one
     * 16-token chunk, 501 ms for 64 tokens as four). */
    int left = n - done;
    const program* sp = &m->prog[PROG_PREFILL_SHORT];
    if (k == PROG_PREFILL && sp->steps && left < (int)m->h.chunk &&
        (left + (int)sp->p.tokens - 1) / (int)sp->p.tokens * sp->p.tokens <= m->h.chunk / 2)
      k = PROG_PREFILL_SHORT, p = &sp->p;
    int C = (int)p->tokens;
    valid = left < C ? left : C;
    int32_t* in = (int32_t*)(m->arena + p->in_offset);
    memcpy(in, ids + done, sizeof(int32_t) * (size_t)valid);
    memset(in + valid, 0, sizeof(int32_t) * (size_t)(C - valid)); /* padding rows: id 0, masked by causality */
    if (run(m, k, m->pos) != 0) goto fail;
    if (k == PROG_PREFILL_LOGITS)
      for (int r = 0; r < valid; r++)
        memcpy(logits + (size_t)(done + r) * m->h.vocab, m->arena + p->out_offset + r * p->out_row_bytes,
               p->out_row_bytes);
    m->pos += valid;
  }
  if (logits && !all_logits) {
    const el_plan_program* hp = &m->prog[PROG_HEAD].p;
    memmove(m->arena + hp->in_offset, m->arena + p->out_offset + (uint64_t)(valid - 1) * p->out_row_bytes,
            p->out_row_bytes);
    if (run(m, PROG_HEAD, m->pos - 1) != 0) goto fail; /* position of the row it reads */
    memcpy(logits, m->arena + hp->out_offset, hp->out_row_bytes);
  }
  m->stats.prefill_seconds += now_s() - t0;
  m->stats.prefill_tokens += (uint64_t)n;
  return 0;
fail:
  m->pos = start; /* rows written past start are never read before being rewritten */
  return -1;
}

EL_API int el_decode(el_model* m, int32_t id, float* logits) {
  if (!m) return el_error("el_decode: model is NULL");
  if (m->pos + 1 > (int)m->h.max_ctx)
    return el_error("context is full (%d of %d tokens): call el_reset() or use a package with a longer context",
                    m->pos, (int)m->h.max_ctx);
  if (check_ids(m, &id, 1) != 0) return -1;
  double t0 = now_s();
  const el_plan_program* p = &m->prog[PROG_DECODE].p;
  *(int32_t*)(m->arena + p->in_offset) = id;
  if (run(m, PROG_DECODE, m->pos) != 0) return -1;
  if (logits) memcpy(logits, m->arena + p->out_offset, p->out_row_bytes);
  m->pos += 1;
  m->stats.decode_seconds += now_s() - t0;
  m->stats.decode_tokens += 1;
  return 0;
}

EL_API int el_reset(el_model* m) {
  if (!m) return el_error("el_reset: model is NULL");
  m->pos = 0; /* stale cache rows are harmless: a run writes rows pos.. before any kernel reads them */
  return 0;
}

/* Public API: queries ---------------------------------------------------------------------------------------- */

#define GETTER(name, expr)                                       \
  EL_API int name(const el_model* m) {                           \
    if (!m) return el_error(#name ": model is NULL");            \
    return (int)(expr);                                          \
  }
GETTER(el_vocab, m->h.vocab)
GETTER(el_max_context, m->h.max_ctx)
GETTER(el_chunk, m->h.chunk)
GETTER(el_pos, m->pos)
GETTER(el_threads, m->n_threads)
GETTER(el_bos_id, m->h.bos_id)
#undef GETTER

/* Returns how many EOS ids the model has; copies at most cap of them. */
EL_API int el_eos_ids(const el_model* m, int32_t* out, int cap) {
  if (!m) return el_error("el_eos_ids: model is NULL");
  for (int i = 0; i < m->h.n_eos && i < cap && out; i++) out[i] = m->h.eos_ids[i];
  return m->h.n_eos;
}

EL_API void el_get_stats(const el_model* m, el_stats* out) {
  if (!out) return;
  memset(out, 0, sizeof *out);
  if (!m) {
    el_error("el_get_stats: model is NULL");
    return;
  }
  *out = m->stats;
  out->weight_bytes_resident = m->store->bytes_resident(m->store);
  out->weight_bytes_huge = m->store->bytes_huge;
}

EL_API void el_reset_stats(el_model* m) {
  if (m) memset(&m->stats, 0, sizeof m->stats);
}
