/* The TVM CPU backend: programs whose steps call TVM-compiled kernels through their C ABI (tvm_abi.h).
 *
 * open: checks the package's machine and CPU features, loads kernels.so (or, in a static edgellm-run, finds the
 * kernels linked into the binary), resolves every kernel of the plan and checks the plan's kernel table (arity,
 * which arguments each kernel writes) against the table the compiler linked into the kernels, so a plan can never
 * point a kernel's output at the weights. run: binds each step's arguments (arena, weights from the store, KV views
 * at the position) into DLTensors on the stack and calls the kernels in order; a ROUTE step runs its body once per
 * expert id that an earlier kernel wrote.
 */
#define _GNU_SOURCE
#ifndef EL_STATIC_KERNELS
#include <dlfcn.h>
#endif
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#if defined(__aarch64__) && defined(__linux__)
#include <sys/auxv.h>
#endif

#include "../core/el_internal.h"

#define MAX_STEP_ARGS 64

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

typedef struct {
  void* dl; /* kernels.so */
  TVMFFISafeCallType* fn; /* [n_kernels] */
  int barriers; /* the kernels call TVMBackendParallelBarrier: tasks need a thread each */
  uint32_t programs; /* bit k: this backend runs program k */
} tvm_cpu;

/* Kernel errors ----------------------------------------------------------------------------------------------- */

/* A kernel may fail on a worker thread, so its message goes to a process-wide slot that the executor reads (and
 * clears) when the kernel returns nonzero. */
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

/* Machine checks ----------------------------------------------------------------------------------------------- */

static const char* arch_name(uint32_t arch) {
  return arch == EL_ARCH_X86_64 ? "x86_64" : arch == EL_ARCH_AARCH64 ? "aarch64" : "an unknown architecture";
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
  const char* target = h->target[0] ? h->target : "?"; /* NUL-terminated: checked with the header */
  if (h->arch != HOST_ARCH)
    return el_error("kernels.so was built for %s (target %s), this machine is %s: compile the package with "
                    ARCH_HINT, arch_name(h->arch), target, HOST_NAME);
  /* features: "avx2,fma" (LLVM "+avx2" and "-feature" entries tolerated) */
  char feats[sizeof h->features];
  memcpy(feats, h->features, sizeof feats);
  for (char *save = NULL, *tok = strtok_r(feats, ", ", &save); tok; tok = strtok_r(NULL, ", ", &save)) {
    if (*tok == '-') continue;
    if (*tok == '+') tok++;
    if (*tok && cpu_has(tok) == 0)
      return el_error("kernels.so needs the CPU feature %s, which this CPU lacks (package target %s): compile the "
                      "package with " FEATURE_HINT, tok, target);
  }
  return 0;
}

/* The plan's kernel table against the kernels' own (compiler/kernel_table.py links it in): same arity, same
 * written arguments, same flags. plan.bin's step checks used the plan's copy; this makes them binding. */
static int check_kernel_info(const el_model* m, const el_kernel_info* info, uint32_t n_info) {
  if (!info)
    return el_error("the kernels have no edgellm kernel table (%s): they were built by an older or foreign compiler; "
                    "recompile the package", EL_KERNEL_INFO_SYMBOL);
  for (uint32_t i = 0; i < m->h.n_kernels; i++) {
    const el_plan_kernel* k = &m->kernels[i];
    const el_kernel_info* found = NULL;
    for (uint32_t j = 0; j < n_info && !found; j++)
      if (info[j].name && !strcmp(info[j].name, k->name)) found = &info[j];
    if (!found)
      return el_error("the kernel table of kernels.so has no %s: plan.bin and the kernels do not belong together; "
                      "recompile the package", k->name);
    if (found->n_args != k->n_args || found->writes != k->writes || found->flags != k->flags)
      return el_error("plan.bin is corrupt: kernel %s takes %u args writing %#llx (flags %#x) per kernels.so, the "
                      "plan says %u args writing %#llx (flags %#x); recompile the package", k->name, found->n_args,
                      (unsigned long long)found->writes, found->flags, k->n_args, (unsigned long long)k->writes,
                      k->flags);
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

extern void (*__edgellm_error_hook)(const char* msg);   /* runtime/kernel_shim.c, linked in */
extern const el_kernel_info __edgellm_kernel_info[];   /* the package's kernel table, linked in */
extern const uint32_t __edgellm_kernel_info_count;

#ifndef EL_STATIC_BARRIERS
#define EL_STATIC_BARRIERS 1 /* unknown: assume the kernels may call TVMBackendParallelBarrier */
#endif
#ifndef EL_BUILD_ID
#error "a static edgellm-run is built for one package: compile with -DEL_BUILD_ID=\"<32 hex digits of its plan>\""
#endif

static int open_kernels(tvm_cpu* b, const el_model* m, const char* dir) {
  (void)dir;
  /* This binary holds one package's kernels: run only that package (another plan may name kernels that happen to
   * exist here with other shapes, or come from another target). */
  char id[33];
  for (int i = 0; i < 16; i++) snprintf(id + 2 * i, 3, "%02x", m->h.build_id[i]);
  if (strcmp(id, EL_BUILD_ID) != 0)
    return el_error("this edgellm-run belongs to another package (it was built for package %s, this one is %s): run "
                    "each package with its own bin/edgellm-run", EL_BUILD_ID, id);
  if (check_machine(&m->h) != 0) return -1;
  if (check_kernel_info(m, __edgellm_kernel_info, __edgellm_kernel_info_count) != 0) return -1;
  __edgellm_error_hook = kernel_error_hook;
  b->barriers = EL_STATIC_BARRIERS;
  for (uint32_t i = 0; i < m->h.n_kernels; i++) {
    char sym[96];
    snprintf(sym, sizeof sym, "__tvm_ffi_%s", m->kernels[i].name);
    if (!(b->fn[i] = (TVMFFISafeCallType)sys_lookup(sym)))
      return el_error("this binary has the kernels of another package linked in (no %s, plan kernel %u): run the "
                      "package with its own bin/edgellm-run, or recompile it", sym, i);
  }
  return 0;
}
#else
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

static int check_kernels_file(const el_plan_header* h, const char* path) {
  unsigned char e[64] = {0};
  int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) return el_error("cannot open %s: %s; recompile the package or copy it again", path, strerror(errno));
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    close(fd);
    return el_error("%s is not a regular file; recompile the package or copy it again", path);
  }
  ssize_t got = read(fd, e, sizeof e);
  close(fd);
  if (got < 20 || memcmp(e, "\x7f" "ELF", 4) != 0)
    return el_error("kernels.so is not an ELF shared library; recompile the package or copy it again");
  unsigned em = e[5] == 2 ? (unsigned)e[18] << 8 | e[19] : (unsigned)e[19] << 8 | e[18]; /* EI_DATA: 2 = big */
  const char* target = h->target[0] ? h->target : "?";
  if (em != HOST_EM)
    return el_error("kernels.so was built for %s (target %s), this machine is %s: compile the package with "
                    ARCH_HINT, em_name(em), target, HOST_NAME);
  if ((e[4] == 2) != (sizeof(void*) == 8))
    return el_error("kernels.so is %d-bit, this runtime is %d-bit: compile the package with " ARCH_HINT,
                    e[4] == 2 ? 64 : 32, (int)sizeof(void*) * 8);
  return check_machine(h);
}

static int open_kernels(tvm_cpu* b, const el_model* m, const char* dir) {
  char path[4096];
  if ((size_t)snprintf(path, sizeof path, "%s/%s", dir, EL_FILE_KERNELS) >= sizeof path)
    return el_error("package path too long: %s", dir);
  if (check_kernels_file(&m->h, path) != 0) return -1;
  b->dl = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!b->dl) return el_error("cannot load kernels.so: %s; recompile the package", dlerror());
  /* TVM kernels reach their runtime through pointer variables ("context symbols") that the loader fills; the
   * codegen emits one only for what the kernels use. */
  static const char* const unsupported[] = {"__TVMFFIFunctionCall", "__TVMFFIEnvModLookupFromImports",
                                            "__TVMFFIHandleInitOnce"};
  for (size_t i = 0; i < sizeof unsupported / sizeof *unsupported; i++)
    if (dlsym(b->dl, unsupported[i]))
      return el_error("kernels.so needs %s, a TVM runtime service libedgellm does not provide (a kernel makes a "
                      "packed/extern call); recompile the package with this edgellm", unsupported[i] + 2);
  const el_kernel_info* info = dlsym(b->dl, EL_KERNEL_INFO_SYMBOL);
  const uint32_t* n_info = dlsym(b->dl, EL_KERNEL_INFO_COUNT_SYMBOL);
  if (check_kernel_info(m, n_info ? info : NULL, n_info ? *n_info : 0) != 0) return -1;
  FTVMBackendParallelLaunch* launch = dlsym(b->dl, "__TVMBackendParallelLaunch");
  int (**barrier)(int, TVMParallelGroupEnv*) = dlsym(b->dl, "__TVMBackendParallelBarrier");
  FTVMBackendAllocWorkspace* alloc = dlsym(b->dl, "__TVMBackendAllocWorkspace");
  FTVMBackendFreeWorkspace* free_ws = dlsym(b->dl, "__TVMBackendFreeWorkspace");
  void (**raise)(const char*, const char*) = dlsym(b->dl, "__TVMFFIErrorSetRaisedFromCStr");
  void (*shim_raise)(const char*, const char*) = (void (*)(const char*, const char*))dlsym(b->dl, "TVMFFIErrorSetRaisedFromCStr");
  void (**hook)(const char*) = dlsym(b->dl, "__edgellm_error_hook");
  if (launch) *launch = el_parallel_launch;
  if (barrier) *barrier = el_parallel_barrier;
  if (alloc) *alloc = el_alloc_workspace;
  if (free_ws) *free_ws = el_free_workspace;
  if (raise) *raise = shim_raise; /* the shim's own, which forwards to the hook */
  if (hook) *hook = kernel_error_hook;
  b->barriers = barrier != NULL;
  for (uint32_t i = 0; i < m->h.n_kernels; i++) {
    char sym[96];
    snprintf(sym, sizeof sym, "__tvm_ffi_%s", m->kernels[i].name);
    if (!(b->fn[i] = (TVMFFISafeCallType)dlsym(b->dl, sym)))
      return el_error("kernels.so has no kernel %s (plan kernel %u): plan.bin and kernels.so do not belong "
                      "together; recompile the package", sym, i);
  }
  return 0;
}
#endif /* EL_STATIC_KERNELS */

static void tvm_close(void* state) {
  tvm_cpu* b = state;
  if (!b) return;
#ifndef EL_STATIC_KERNELS
  if (b->dl) dlclose(b->dl);
#endif
  free(b->fn);
  free(b);
}

static int tvm_open(el_model* m, const char* dir, uint32_t programs, void** state) {
  tvm_cpu* b = calloc(1, sizeof *b);
  if (!b || !(b->fn = calloc(m->h.n_kernels + 1, sizeof *b->fn))) {
    free(b);
    return el_error("out of memory");
  }
  b->programs = programs;
  if (open_kernels(b, m, dir) != 0) {
    tvm_close(b);
    return -1;
  }
  *state = b;
  return 0;
}

/* Per-context bindings ------------------------------------------------------------------------------------------
 * A context's DLTensors and TVMFFIAny arguments for every step of the programs this backend runs, prepared once
 * when the context is made (shapes, dtypes, argument slots): a run then only patches data pointers and prefix
 * lengths. Per context, not per model, so that contexts on different threads never share mutable state. */
typedef struct {
  DLTensor* t;     /* [n_args] */
  TVMFFIAny* any;  /* [n_args] */
  int64_t* shapes; /* [4 * n_args] */
} binding;

typedef struct {
  binding* steps[EL_N_PROGRAMS]; /* [n_steps] per program run by this backend */
  void* block;
  uint64_t bytes;
  el_step_walk walk; /* the step walker's per-context state (expert guesses) */
} tvm_ctx;

static void tvm_unbind(void* ctx_state) {
  tvm_ctx* b = ctx_state;
  if (!b) return;
  el_step_walk_free(&b->walk);
  free(b->block);
  free(b);
}

static int tvm_bind(void* state, el_context* c, void** ctx_state) {
  const uint32_t mine = ((const tvm_cpu*)state)->programs;
  const el_model* m = c->m;
  size_t n_steps = 0, n_args = 0;
  for (int k = 0; k < EL_N_PROGRAMS; k++) {
    const el_program* pg = &m->prog[k];
    if (!pg->present || !(mine >> k & 1)) continue;
    n_steps += pg->n_steps;
    for (uint32_t si = 0; si < pg->n_steps; si++) n_args += pg->steps[si].n_args;
  }
  size_t bytes = sizeof(binding) * n_steps + (sizeof(DLTensor) + sizeof(TVMFFIAny) + 4 * sizeof(int64_t)) * n_args;
  tvm_ctx* b = calloc(1, sizeof *b);
  uint8_t* mem = b ? malloc(bytes ? bytes : 1) : NULL;
  if (!mem) {
    free(b);
    return el_error("out of memory for a context's kernel arguments (%zu bytes)", bytes);
  }
  b->block = mem, b->bytes = bytes + sizeof *b;
  binding* bs = (binding*)mem;
  DLTensor* t = (DLTensor*)(bs + n_steps);
  TVMFFIAny* any = (TVMFFIAny*)(t + n_args);
  int64_t* shapes = (int64_t*)(any + n_args);
  for (int k = 0; k < EL_N_PROGRAMS; k++) {
    const el_program* pg = &m->prog[k];
    if (!pg->present || !(mine >> k & 1)) continue;
    b->steps[k] = bs;
    for (uint32_t si = 0; si < pg->n_steps; si++, bs++) {
      const el_step* st = &pg->steps[si];
      bs->t = t, bs->any = any, bs->shapes = shapes;
      memcpy(t, st->proto, sizeof *t * st->n_args);
      memcpy(shapes, st->shapes, sizeof *shapes * 4 * st->n_args);
      for (uint32_t ai = 0; ai < st->n_args; ai++) {
        t[ai].shape = &shapes[4 * ai];
        any[ai].type_index = kTVMFFIDLTensorPtr;
        any[ai].zero_padding = 0;
        any[ai].v_ptr = &t[ai];
      }
      t += st->n_args, any += st->n_args, shapes += 4 * st->n_args;
    }
  }
  c->backend_bytes += b->bytes;
  *ctx_state = b;
  return 0;
}

/* Run ---------------------------------------------------------------------------------------------------------- */

/* One kernel call. expert / slot: the routed entry this call serves (-1 outside a route). */
static int call_step(tvm_cpu* b, el_context* c, const el_step* st, binding* bd, int pos, int expert, int slot,
                     int prog, uint32_t si) {
  el_weight_store* store = c->m->store;
  uint32_t wid[MAX_STEP_ARGS], nw = 0;
  const void* wptr[MAX_STEP_ARGS];
  uint32_t n = st->n_args;
  for (uint32_t ai = 0; ai < n; ai++)
    if (st->args[ai].kind == EL_ARG_WEIGHT)
      wid[nw++] = st->args[ai].index + ((st->args[ai].flags & EL_FLAG_EXPERT) ? (uint32_t)expert * st->args[ai].expert_stride : 0);
  if (nw && store->acquire(store, wid, nw, wptr) != 0)
    return el_error("the weight store (%s) could not provide the weights of kernel %s: %s", store->policy,
                    st->kernel_name, store->err);
  DLTensor* t = bd->t;
  for (uint32_t ai = 0, wi = 0; ai < n; ai++) {
    const el_plan_arg* a = &st->args[ai];
    const uint8_t* base;
    uint64_t at = 0;
    int vpos = el_view_pos(c, a, pos);
    if (a->flags & EL_FLAG_AT_POS) at = (uint64_t)vpos * st->row_bytes[ai];
    if (a->flags & EL_FLAG_SLOT) at = (uint64_t)slot * st->row_bytes[ai];
    if (a->kind == EL_ARG_ARENA) {
      base = c->arena;
    } else if (a->kind == EL_ARG_SETTINGS) {
      base = (const uint8_t*)c->m->settings;
    } else if (a->kind == EL_ARG_WEIGHT) {
      base = wptr[wi++];
    } else {
      base = el_cache_of(c, a->kind, a->index);
      if (a->flags & EL_FLAG_PREFIX) bd->shapes[4 * ai] = vpos + a->shape[0];
    }
    t[ai].data = (void*)(base + a->offset + at);
  }
  TVMFFIAny ret = {.type_index = kTVMFFINone};
  double t0 = c->prof_s ? el_now() : 0;
  int rc = b->fn[st->kernel](NULL, bd->any, (int32_t)n, &ret);
  if (c->prof_s) c->prof_s[c->prof_base[prog] + si] += el_now() - t0;
  c->stats.kernel_calls++;
  c->stats.weight_bytes_read += st->weight_bytes;
  if (nw) store->release(store, wid, nw);
  if (rc != 0) {
    char msg[1024];
    take_kernel_msg(msg, sizeof msg);
    return el_error("kernel %s failed (program %s, step %u, context position %d): %s", st->kernel_name,
                    el_program_name(prog), si, pos, msg);
  }
  return 0;
}

/* A kernel call as the step walker (steps.c) asks for it. */
typedef struct {
  tvm_cpu* b;
  tvm_ctx* x;
} tvm_call_ctx;

static int tvm_call(void* user, el_context* c, int prog, uint32_t si, int pos, int expert, int slot) {
  tvm_call_ctx* u = user;
  return call_step(u->b, c, &c->m->prog[prog].steps[si], &u->x->steps[prog][si], pos, expert, slot, prog, si);
}

static int run_steps(void* state, void* ctx_state, el_context* c, int prog, int pos) {
  tvm_cpu* b = state;
  tvm_ctx* x = ctx_state;
  el_pool_set_threads(c->n_threads, b->barriers);
  tvm_call_ctx u = {b, x};
  return el_run_steps(c, prog, pos, &x->walk, tvm_call, &u);
}

static int tvm_run(void* state, void* ctx_state, el_context* c, int prog, int pos) {
  el_weight_store* store = c->m->store;
  const el_program* pg = &c->m->prog[prog];
  if (store->run_lock) pthread_mutex_lock(store->run_lock);
  if (store->prefetch && pg->n_order) store->prefetch(store, pg->order, pg->n_order);
  int rc = run_steps(state, ctx_state, c, prog, pos);
  if (store->run_lock) pthread_mutex_unlock(store->run_lock);
  return rc;
}

const el_backend el_backend_tvm_cpu = {"tvm_cpu", 0, tvm_open, tvm_close, tvm_bind, tvm_unbind, tvm_run, NULL,
                                       "CPU packages (TVM kernels)", NULL};
