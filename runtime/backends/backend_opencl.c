/* The OpenCL backend: programs whose kernels are TVM-generated OpenCL C (kernels.cl), launched as kernels.cltab
 * says (compiler/opencl/build.py documents the format). No TVM and no OpenCL headers at build time: the ICD loader
 * (libOpenCL.so) is dlopened and the API slice it uses is declared in opencl_api.h.
 *
 * open: loads the driver, picks the device (EDGELLM_OPENCL_DEVICE or el_load_options.device: "P:D" indices or part
 * of the device name; default the first GPU, else the first device), builds the program (or loads the binary this
 * device built before, from the package's opencl-cache/), creates the kernels and checks the table against the plan.
 * bind (per context): the device's copy of every weight (created by the first context: zero-copy
 * CL_MEM_USE_HOST_PTR where the device shares host memory, a copy otherwise), the arena, the KV cache (over the
 * context's own cache memory on unified-memory devices), and scratch for the kernels' intermediate stages.
 * run: uploads the program's input rows, launches every step's kernels in order on one in-order queue, reads back
 * the output rows. Steps bind arguments as (buffer, byte offset): weights, arena views, KV views at the position.
 */
#define _GNU_SOURCE
#ifndef EL_NO_DLOPEN
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

#include "../core/el_internal.h"
#include "opencl_api.h"

#define MAX_PARAMS 64
#define SCRATCH_ALIGN 256

typedef struct {
#define X(name, ret, args) ret(*name) args;
  EL_CL_FUNCTIONS(X)
#undef X
} cl_api;

enum { P_ARG = 0, P_SCRATCH = 1, P_DIM = 2 };
typedef struct {
  uint8_t kind, bytes; /* P_*; P_DIM: 4 or 8 */
  uint16_t dim;
  uint32_t index; /* argument or scratch index */
} cl_param;

typedef struct {
  cl_kernel k;
  size_t global[3], local[3];
  uint32_t n_params;
  cl_param* params;
  char name[128];
} cl_launch;

typedef struct {
  uint32_t n_launch, n_scratch;
  cl_launch* launch;
  uint64_t* scratch_off; /* [n_scratch] offsets in the context's scratch buffer */
  uint64_t scratch_bytes;
} cl_plan_kernel;

typedef struct {
  void* dl;
  cl_api api;
  cl_platform_id platform;
  cl_device_id device;
  cl_context ctx;
  cl_command_queue q;
  cl_program program;
  cl_plan_kernel* kern; /* [n_kernels] */
  uint32_t n_kernels;
  uint64_t scratch_bytes; /* the most any kernel needs */
  int unified;            /* CL_DEVICE_HOST_UNIFIED_MEMORY */
  int profiling;
  int verified;           /* the model was loaded with a digest */
  cl_mem* weights;        /* [n_weights], made by the first bind */
  uint32_t n_weights_made;
  cl_mem settings;
  pthread_mutex_t mu;     /* weights creation; runs (kernel arguments are per cl_kernel, shared by contexts) */
  char device_name[256];
  char note[512];
} opencl;

typedef struct {
  opencl* b;
  cl_mem arena, kv, scratch;
} opencl_ctx;

static const char* cl_err_name(cl_int e) {
  switch (e) {
    case -1: return "CL_DEVICE_NOT_FOUND";
    case -4: return "CL_MEM_OBJECT_ALLOCATION_FAILURE";
    case -5: return "CL_OUT_OF_RESOURCES";
    case -6: return "CL_OUT_OF_HOST_MEMORY";
    case -11: return "CL_BUILD_PROGRAM_FAILURE";
    case -30: return "CL_INVALID_VALUE";
    case -38: return "CL_INVALID_MEM_OBJECT";
    case -42: return "CL_INVALID_BINARY";
    case -46: return "CL_INVALID_KERNEL_NAME";
    case -48: return "CL_INVALID_KERNEL";
    case -49: return "CL_INVALID_ARG_INDEX";
    case -51: return "CL_INVALID_ARG_SIZE";
    case -54: return "CL_INVALID_WORK_GROUP_SIZE";
    case -61: return "CL_INVALID_BUFFER_SIZE";
    case -1001: return "CL_PLATFORM_NOT_FOUND_KHR";
    default: return "an OpenCL error";
  }
}
#define CL_FAIL(what, e) el_error("OpenCL: %s failed: %s (%d)", what, cl_err_name(e), (int)(e))

/* Driver and device ----------------------------------------------------------------------------------------------- */

#ifdef EL_NO_DLOPEN
static int load_driver(opencl* b) {
  (void)b;
  return el_error("this edgellm-run is linked statically and cannot load the OpenCL driver: GPU packages need a "
                  "dynamic edgellm-run (compile the package for android-gpu, or with ANDROID_NDK_HOME set)");
}
static int dlclose(void* h) { return (void)h, 0; }
#else
static int load_driver(opencl* b) {
  const char* env = getenv("EDGELLM_OPENCL_LIBRARY");
  static const char* const names[] = {"libOpenCL.so.1", "libOpenCL.so", "/vendor/lib64/libOpenCL.so",
                                      "/system/vendor/lib64/libOpenCL.so", "/system/lib64/libOpenCL.so",
                                      "/vendor/lib64/egl/libGLES_mali.so"};
  if (env && *env) {
    if (!(b->dl = dlopen(env, RTLD_NOW | RTLD_LOCAL)))
      return el_error("cannot load the OpenCL library EDGELLM_OPENCL_LIBRARY=%s: %s", env, dlerror());
  } else {
    for (size_t i = 0; i < sizeof names / sizeof *names && !b->dl; i++) b->dl = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
    if (!b->dl)
      return el_error("no OpenCL driver: libOpenCL.so was not found (Linux: apt-get install ocl-icd-libopencl1 and a "
                      "driver such as pocl-opencl-icd; Android: the phone's /vendor/lib64/libOpenCL.so, or set "
                      "EDGELLM_OPENCL_LIBRARY)");
  }
#define X(name, ret, args)                                                                                      \
  if (!(*(void**)&b->api.name = dlsym(b->dl, #name)))                                                           \
    return el_error("the OpenCL library has no %s: it is not an OpenCL 1.2 ICD loader", #name);
  EL_CL_FUNCTIONS(X)
#undef X
  return 0;
}
#endif

static void device_str(opencl* b, cl_device_id d, cl_device_info what, char* out, size_t n) {
  out[0] = 0;
  if (b->api.clGetDeviceInfo(d, what, n - 1, out, NULL) != CL_SUCCESS) out[0] = 0;
  out[n - 1] = 0;
}

/* want: NULL/"" (first GPU, else first device), "P:D" (platform and device index), or part of a device name. */
static int choose_device(opencl* b, const char* want) {
  cl_platform_id plats[16];
  cl_uint np = 0;
  cl_int e = b->api.clGetPlatformIDs(16, plats, &np);
  if (e == CL_PLATFORM_NOT_FOUND_KHR || (e == CL_SUCCESS && np == 0))
    return el_error("no OpenCL platform: the OpenCL library loaded but no driver registered a device (Linux: "
                    "apt-get install pocl-opencl-icd, or the GPU vendor's ICD in /etc/OpenCL/vendors)");
  if (e != CL_SUCCESS) return CL_FAIL("clGetPlatformIDs", e);
  if (np > 16) np = 16;
  int wp = -1, wd = -1;
  if (want && *want && sscanf(want, "%d:%d", &wp, &wd) != 2) wp = wd = -1;
  char seen[1024] = "";
  cl_device_id first = NULL, first_gpu = NULL, match = NULL;
  cl_platform_id pfirst = NULL, pgpu = NULL, pmatch = NULL;
  for (cl_uint p = 0; p < np; p++) {
    cl_device_id devs[16];
    cl_uint nd = 0;
    if (b->api.clGetDeviceIDs(plats[p], CL_DEVICE_TYPE_ALL, 16, devs, &nd) != CL_SUCCESS) continue;
    for (cl_uint d = 0; d < nd && d < 16; d++) {
      char name[256];
      cl_device_type type = 0;
      device_str(b, devs[d], CL_DEVICE_NAME, name, sizeof name);
      b->api.clGetDeviceInfo(devs[d], CL_DEVICE_TYPE, sizeof type, &type, NULL);
      size_t len = strlen(seen);
      snprintf(seen + len, sizeof seen - len, "%s%u:%u %s", len ? ", " : "", p, d, name);
      if (!first) first = devs[d], pfirst = plats[p];
      if (!first_gpu && (type & CL_DEVICE_TYPE_GPU)) first_gpu = devs[d], pgpu = plats[p];
      if (!match && want && *want &&
          (wp >= 0 ? (int)p == wp && (int)d == wd : strstr(name, want) != NULL))
        match = devs[d], pmatch = plats[p];
    }
  }
  if (!first) return el_error("no OpenCL device: the platforms list none (%u platforms)", np);
  if (want && *want && !match)
    return el_error("no OpenCL device matches \"%s\" (EDGELLM_OPENCL_DEVICE / device): this machine has %s", want, seen);
  b->device = match ? match : first_gpu ? first_gpu : first;
  b->platform = match ? pmatch : first_gpu ? pgpu : pfirst;
  device_str(b, b->device, CL_DEVICE_NAME, b->device_name, sizeof b->device_name);
  cl_bool unified = 0;
  b->api.clGetDeviceInfo(b->device, CL_DEVICE_HOST_UNIFIED_MEMORY, sizeof unified, &unified, NULL);
  b->unified = unified != 0;
  return 0;
}

/* The launch table ------------------------------------------------------------------------------------------------ */

static int table_error(const char* what) {
  return el_error("kernels.cltab is corrupt (%s): recompile the package or copy it again", what);
}

static int next_num(char** save, uint64_t lo, uint64_t hi, uint64_t* out) {
  char *t = strtok_r(NULL, " \t\r\n", save), *end;
  if (!t) return -1;
  unsigned long long x = strtoull(t, &end, 10);
  if (*end || x < lo || x > hi) return -1;
  *out = x;
  return 0;
}

/* Parses kernels.cltab into b->kern (plan kernel order), checking every reference against the plan. */
static int read_table(opencl* b, const el_model* m, const char* dir) {
  char path[4096];
  snprintf(path, sizeof path, "%s/" EL_FILE_OPENCL_TABLE, dir);
  struct stat st;
  if (lstat(path, &st) != 0 && errno == ENOENT)
    return el_error("this package has no OpenCL kernels (%s), yet its plan runs programs on the opencl backend: "
                    "recompile it (--target android-gpu or opencl for the GPU)", EL_FILE_OPENCL_TABLE);
  if (el_check_listed(dir, EL_FILE_OPENCL_TABLE) || el_check_listed(dir, EL_FILE_OPENCL_SOURCE)) return -1;
  size_t size;
  char* text = el_read_small_file(path, "OpenCL launch table", (size_t)64 << 20, &size);
  if (!text) return -1;
  char* buf = realloc(text, size + 1);
  if (!buf) return free(text), el_error("out of memory");
  buf[size] = 0;
  char* save = NULL;
  int rc = -1;
#define TOK() strtok_r(NULL, " \t\r\n", &save)
#define NUM(v, lo, hi)                                                                                          \
  do {                                                                                                          \
    uint64_t x_;                                                                                                \
    if (next_num(&save, (lo), (hi), &x_) != 0) goto bad;                                                        \
    (v) = x_;                                                                                                   \
  } while (0)
  char* t = strtok_r(buf, " \t\r\n", &save);
  uint64_t version, n;
  if (!t || strcmp(t, EL_OPENCL_TABLE_MAGIC) != 0) goto bad;
  NUM(version, EL_OPENCL_TABLE_VERSION, EL_OPENCL_TABLE_VERSION);
  (void)version;
  NUM(n, 0, 1 << 20);
  b->n_kernels = m->h.n_kernels;
  if (!(b->kern = calloc(m->h.n_kernels + 1, sizeof *b->kern))) goto oom;
  for (uint64_t i = 0; i < n; i++) {
    if (!(t = TOK()) || strcmp(t, "kernel") != 0 || !(t = TOK())) goto bad;
    uint32_t ki = UINT32_MAX;
    for (uint32_t j = 0; j < m->h.n_kernels && ki == UINT32_MAX; j++)
      if (!strcmp(m->kernels[j].name, t)) ki = j;
    uint64_t n_args, writes, nl, ns;
    NUM(n_args, 0, MAX_PARAMS);
    NUM(writes, 0, UINT64_MAX);
    NUM(nl, 1, 1024);
    NUM(ns, 0, 1024);
    /* the kernels' own word on which arguments they write binds the plan (as kernels.so's table does on the CPU):
     * a plan that points a written argument at a weight was refused by the loader with the plan's copy */
    if (ki == UINT32_MAX) {
      el_error("kernels.cltab names a kernel plan.bin does not have (%s): recompile the package", t);
      goto out;
    }
    if (n_args != m->kernels[ki].n_args || writes != m->kernels[ki].writes || b->kern[ki].launch) {
      el_error("plan.bin and kernels.cltab do not belong together (kernel %s: %u args writing %#llx per the plan, %u "
               "writing %#llx per the table): recompile the package", t, m->kernels[ki].n_args,
               (unsigned long long)m->kernels[ki].writes, (unsigned)n_args, (unsigned long long)writes);
      goto out;
    }
    cl_plan_kernel* pk = &b->kern[ki];
    if (!(pk->launch = calloc(nl, sizeof *pk->launch)) || !(pk->scratch_off = calloc(ns + 1, sizeof(uint64_t)))) goto oom;
    pk->n_launch = (uint32_t)nl, pk->n_scratch = (uint32_t)ns; /* after the allocations: cl_close walks them */
    for (uint64_t s = 0; s < ns; s++) {
      uint64_t bytes;
      if (!(t = TOK()) || strcmp(t, "scratch") != 0) goto bad;
      NUM(bytes, 0, (uint64_t)1 << 40);
      pk->scratch_off[s] = pk->scratch_bytes;
      pk->scratch_bytes += (bytes + SCRATCH_ALIGN - 1) / SCRATCH_ALIGN * SCRATCH_ALIGN;
    }
    if (pk->scratch_bytes > b->scratch_bytes) b->scratch_bytes = pk->scratch_bytes;
    for (uint64_t l = 0; l < nl; l++) {
      cl_launch* L = &pk->launch[l];
      if (!(t = TOK()) || strcmp(t, "launch") != 0 || !(t = TOK()) || strlen(t) >= sizeof L->name) goto bad;
      snprintf(L->name, sizeof L->name, "%s", t);
      uint64_t v, np;
      for (int d = 0; d < 3; d++) {
        NUM(v, 1, (uint64_t)1 << 31);
        L->global[d] = v;
      }
      for (int d = 0; d < 3; d++) {
        NUM(v, 1, 1 << 16);
        L->local[d] = v;
        if (L->global[d] % L->local[d]) goto bad;
      }
      NUM(np, 0, MAX_PARAMS);
      L->n_params = (uint32_t)np;
      if (!(L->params = calloc(np + 1, sizeof *L->params))) goto oom;
      for (uint64_t p = 0; p < np; p++) {
        cl_param* P = &L->params[p];
        uint64_t idx, dim, bytes;
        if (!(t = TOK())) goto bad;
        if (!strcmp(t, "arg")) {
          NUM(idx, 0, n_args ? n_args - 1 : 0);
          if (!n_args) goto bad;
          P->kind = P_ARG, P->index = (uint32_t)idx;
        } else if (!strcmp(t, "scratch")) {
          NUM(idx, 0, ns ? ns - 1 : 0);
          if (!ns) goto bad;
          P->kind = P_SCRATCH, P->index = (uint32_t)idx;
        } else if (!strcmp(t, "dim")) {
          NUM(idx, 0, n_args ? n_args - 1 : 0);
          NUM(dim, 0, EL_MAX_ARGS_NDIM - 1);
          NUM(bytes, 4, 8);
          if (!n_args || (bytes != 4 && bytes != 8)) goto bad;
          P->kind = P_DIM, P->index = (uint32_t)idx, P->dim = (uint16_t)dim, P->bytes = (uint8_t)bytes;
        } else {
          goto bad;
        }
      }
    }
  }
  if (TOK()) goto bad;
  for (uint32_t j = 0; j < m->h.n_kernels; j++)
    if (!b->kern[j].launch) {
      el_error("kernels.cltab has no kernel %s: plan.bin and the OpenCL kernels do not belong together; recompile the "
               "package", m->kernels[j].name);
      goto out;
    }
  rc = 0;
  goto out;
bad:
  table_error("unexpected token");
  goto out;
oom:
  el_error("out of memory");
out:
  free(buf);
  return rc;
#undef TOK
#undef NUM
}

/* Program build with the on-disk binary cache --------------------------------------------------------------------- */

static void hex(const uint8_t* d, int n, char* out) {
  for (int i = 0; i < n; i++) snprintf(out + 2 * i, 3, "%02x", d[i]);
}

/* The cache file of this source on this device and driver: <package>/opencl-cache/<sha256>.bin */
static void cache_path(opencl* b, const char* dir, const char* src, size_t n, char* out, size_t cap) {
  el_sha256 s;
  el_sha256_init(&s);
  el_sha256_update(&s, src, n);
  char info[768];
  device_str(b, b->device, CL_DRIVER_VERSION, info, 256);
  size_t len = strlen(info);
  device_str(b, b->device, CL_DEVICE_VERSION, info + len, 256);
  el_sha256_update(&s, b->device_name, strlen(b->device_name));
  el_sha256_update(&s, info, strlen(info));
  uint8_t h[32];
  char hx[65];
  el_sha256_final(&s, h);
  hex(h, 32, hx);
  snprintf(out, cap, "%s/%s/%s.bin", dir, EL_DIR_OPENCL_CACHE, hx);
}

static int build_log_error(opencl* b, cl_program p, cl_int e) {
  char log[2048] = "";
  b->api.clGetProgramBuildInfo(p, b->device, CL_PROGRAM_BUILD_LOG, sizeof log - 1, log, NULL);
  log[sizeof log - 1] = 0;
  for (char* c = log; *c; c++)
    if (*c == '\n' || *c == '\r') *c = ' ';
  return el_error("OpenCL: building kernels.cl for %s failed (%s): %.400s", b->device_name, cl_err_name(e), log);
}

static void save_binary(opencl* b, const char* path) {
  size_t size = 0;
  if (b->api.clGetProgramInfo(b->program, CL_PROGRAM_BINARY_SIZES, sizeof size, &size, NULL) != CL_SUCCESS || !size)
    return;
  unsigned char* bin = malloc(size);
  if (!bin) return;
  if (b->api.clGetProgramInfo(b->program, CL_PROGRAM_BINARIES, sizeof bin, &bin, NULL) == CL_SUCCESS) {
    char dirp[4400], tmp[4420];
    if ((size_t)snprintf(dirp, sizeof dirp, "%s", path) >= sizeof dirp) {
      free(bin);
      return;
    }
    char* slash = strrchr(dirp, '/');
    if (slash) *slash = 0;
    mkdir(dirp, 0755); /* beside the package; a read-only package just rebuilds on every load */
    snprintf(tmp, sizeof tmp, "%.4390s.%d.tmp", path, (int)getpid());
    FILE* f = fopen(tmp, "wb");
    if (f) {
      int ok = fwrite(bin, 1, size, f) == size;
      ok = (fclose(f) == 0) && ok;
      if (!ok || rename(tmp, path) != 0) unlink(tmp);
    }
  }
  free(bin);
}

/* Every launch of kernels.cltab must be a geometry the source was generated for ("// edgellm-launch NAME GX GY GZ LX
 * LY LZ" lines the compiler writes at its top): a table edited or corrupted alone (no digest, no SHA256SUMS) could
 * otherwise launch a grid the kernel does not bound-check, reading past a buffer or running for hours. Sources
 * without such lines (packages from before them) are not checked. */
static int check_geometry(const opencl* b, char* src) {
  if (!strstr(src, "// edgellm-launch ")) return 0;
  /* the lines are the source's header: search only that (not megabytes of kernels once per launch) */
  char* body = strstr(src, "\n__kernel");
  char keep = 0;
  if (body) keep = body[1], body[1] = 0;
  int rc = 0;
  char want[256];
  for (uint32_t i = 0; i < b->n_kernels; i++)
    for (uint32_t l = 0; l < b->kern[i].n_launch; l++) {
      const cl_launch* L = &b->kern[i].launch[l];
      snprintf(want, sizeof want, "// edgellm-launch %s %zu %zu %zu %zu %zu %zu\n", L->name, L->global[0], L->global[1],
               L->global[2], L->local[0], L->local[1], L->local[2]);
      if (!rc && !strstr(src, want))
        rc = el_error("kernels.cltab launches %s on a %zu x %zu x %zu grid (groups of %zu x %zu x %zu), which "
                      "kernels.cl was not generated for: the package is corrupt or was modified; recompile it",
                      L->name, L->global[0], L->global[1], L->global[2], L->local[0], L->local[1], L->local[2]);
    }
  if (body) body[1] = keep;
  return rc;
}

static int build_program(opencl* b, const char* dir) {
  char path[4096];
  snprintf(path, sizeof path, "%s/" EL_FILE_OPENCL_SOURCE, dir);
  size_t n;
  char* src = el_read_small_file(path, "OpenCL kernels", (size_t)256 << 20, &n);
  if (!src) return -1;
  if (check_geometry(b, src) != 0) {
    free(src);
    return -1;
  }
  char cpath[4400];
  cache_path(b, dir, src, n, cpath, sizeof cpath);
  cl_int e = CL_SUCCESS, st = CL_SUCCESS;
  size_t bn = 0;
  unsigned char* bin = NULL;
  struct stat sb;
  /* a digest-checked load runs only what SHA256SUMS covers: the source, not a binary cached beside it */
  if (!b->verified && stat(cpath, &sb) == 0 && S_ISREG(sb.st_mode))
    bin = el_read_small_file(cpath, "OpenCL binary", (size_t)1 << 30, &bn);
  if (bin) {
    const unsigned char* bp = bin;
    b->program = b->api.clCreateProgramWithBinary(b->ctx, 1, &b->device, &bn, &bp, &st, &e);
    free(bin);
    if (b->program && (e != CL_SUCCESS || st != CL_SUCCESS ||
                       b->api.clBuildProgram(b->program, 1, &b->device, "", NULL, NULL) != CL_SUCCESS)) {
      b->api.clReleaseProgram(b->program); /* a stale or foreign binary: rebuild from source */
      b->program = NULL;
    }
    if (b->program) {
      free(src);
      snprintf(b->note, sizeof b->note, "program from the binary cache");
      return 0;
    }
  }
  const char* sp = src;
  b->program = b->api.clCreateProgramWithSource(b->ctx, 1, &sp, &n, &e);
  free(src);
  if (!b->program) return CL_FAIL("clCreateProgramWithSource", e);
  if ((e = b->api.clBuildProgram(b->program, 1, &b->device, "-cl-std=CL1.2", NULL, NULL)) != CL_SUCCESS)
    return build_log_error(b, b->program, e);
  save_binary(b, cpath);
  snprintf(b->note, sizeof b->note, "program built from source%s",
           stat(cpath, &sb) == 0 ? " (binary cached)" : " (binary not cached: package directory not writable)");
  return 0;
}

/* Backend interface ----------------------------------------------------------------------------------------------- */

static void cl_close(void* state) {
  opencl* b = state;
  if (!b) return;
  if (b->kern)
    for (uint32_t i = 0; i < b->n_kernels; i++) {
      for (uint32_t l = 0; l < b->kern[i].n_launch; l++) {
        if (b->kern[i].launch[l].k) b->api.clReleaseKernel(b->kern[i].launch[l].k);
        free(b->kern[i].launch[l].params);
      }
      free(b->kern[i].launch), free(b->kern[i].scratch_off);
    }
  free(b->kern);
  if (b->weights) {
    for (uint32_t i = 0; b->dl && i < b->n_weights_made; i++)
      if (b->weights[i]) b->api.clReleaseMemObject(b->weights[i]);
    free(b->weights);
  }
  if (b->settings) b->api.clReleaseMemObject(b->settings);
  if (b->program) b->api.clReleaseProgram(b->program);
  if (b->q) b->api.clReleaseCommandQueue(b->q);
  if (b->ctx) b->api.clReleaseContext(b->ctx);
  if (b->dl) dlclose(b->dl);
  pthread_mutex_destroy(&b->mu);
  free(b);
}

static int cl_open(el_model* m, const char* dir, uint32_t programs, void** state) {
  if (m->h.kv_dtype_bits != 32) /* its kernels read f32 caches (the compiler refuses --kv-cache f16 for them) */
    return el_error("the opencl backend keeps an f32 KV cache; this package's is %u-bit", m->h.kv_dtype_bits);
  opencl* b = calloc(1, sizeof *b);
  if (!b) return el_error("out of memory");
  pthread_mutex_init(&b->mu, NULL);
  b->profiling = el_profiling();
  b->verified = m->verified;
  const char* want = getenv("EDGELLM_OPENCL_DEVICE");
  const char* given = el_backend_option(m, "opencl", "device");
  if (given && strcmp(given, "auto") != 0) want = given; /* the load option wins over the environment */
  for (int k = 0; k < EL_N_PROGRAMS; k++) {
    const el_program* pg = &m->prog[k];
    if (!pg->present || !(programs >> k & 1)) continue;
    for (uint32_t si = 0; si < pg->n_steps; si++)
      if (pg->steps[si].kind != EL_STEP_CALL) {
        cl_close(b);
        return el_error("program %s has routed steps, which the OpenCL backend does not run (mixture-of-experts and "
                        "neuron-bundled packages: compile them for a CPU target)", pg->p.name);
      }
  }
  cl_int e = CL_SUCCESS;
  /* the package's launch table first: a package without OpenCL kernels is refused before any driver is touched */
  if (read_table(b, m, dir) != 0 || load_driver(b) != 0 || choose_device(b, want) != 0) goto fail;
  if (!(b->ctx = b->api.clCreateContext(NULL, 1, &b->device, NULL, NULL, &e))) {
    CL_FAIL("clCreateContext", e);
    goto fail;
  }
  if (!(b->q = b->api.clCreateCommandQueue(b->ctx, b->device, b->profiling ? CL_QUEUE_PROFILING_ENABLE : 0, &e))) {
    CL_FAIL("clCreateCommandQueue", e);
    goto fail;
  }
  if (build_program(b, dir) != 0) goto fail;
  size_t max_wg = 0;
  b->api.clGetDeviceInfo(b->device, CL_DEVICE_MAX_WORK_GROUP_SIZE, sizeof max_wg, &max_wg, NULL);
  for (uint32_t i = 0; i < b->n_kernels; i++)
    for (uint32_t l = 0; l < b->kern[i].n_launch; l++) {
      cl_launch* L = &b->kern[i].launch[l];
      if (!(L->k = b->api.clCreateKernel(b->program, L->name, &e))) {
        el_error("kernels.cl has no kernel %s (of %s): %s; recompile the package", L->name, m->kernels[i].name,
                 cl_err_name(e));
        goto fail;
      }
      if (max_wg && L->local[0] * L->local[1] * L->local[2] > max_wg) {
        el_error("the OpenCL kernel %s needs work-groups of %zu, %s allows %zu", L->name,
                 L->local[0] * L->local[1] * L->local[2], b->device_name, max_wg);
        goto fail;
      }
    }
  float settings[EL_N_SETTINGS];
  memcpy(settings, m->settings, sizeof settings);
  if (!(b->settings = b->api.clCreateBuffer(b->ctx, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR, sizeof settings, settings,
                                            &e))) {
    CL_FAIL("clCreateBuffer (settings)", e);
    goto fail;
  }
  snprintf(m->device_note, sizeof m->device_note, "OpenCL %.200s (%s memory; %.200s)", b->device_name,
           b->unified ? "unified" : "device", b->note);
  *state = b;
  return 0;
fail:
  cl_close(b);
  return -1;
}

/* The device's copy of every weight, made once (by the first context: the store is open by then). */
static int make_weights(opencl* b, el_model* m) {
  if (b->weights) return 0;
  el_weight_store* st = m->store;
  uint32_t n = m->h.n_weights;
  if (!(b->weights = calloc(n + 1, sizeof *b->weights))) return el_error("out of memory");
  for (uint32_t i = 0; i < n; i++, b->n_weights_made = i) {
    const void* p;
    if (st->acquire(st, &i, 1, &p) != 0)
      return el_error("the weight store (%s) could not provide weight %u: %s", st->policy, i, st->err);
    uint64_t nb = m->weights[i].nbytes;
    cl_int e = CL_SUCCESS;
    /* unified memory: the device reads the store's pages in place (no second copy); else one upload */
    cl_mem_flags fl = CL_MEM_READ_ONLY | (b->unified ? CL_MEM_USE_HOST_PTR : CL_MEM_COPY_HOST_PTR);
    b->weights[i] = nb ? b->api.clCreateBuffer(b->ctx, fl, (size_t)nb, (void*)p, &e) : NULL;
    st->release(st, &i, 1);
    if (nb && !b->weights[i])
      return el_error("OpenCL: cannot place weight %u (%.1f MB) on %s: %s", i, nb / 1e6, b->device_name, cl_err_name(e));
  }
  b->n_weights_made = n;
  return 0;
}

static void cl_unbind(void* ctx_state) {
  opencl_ctx* x = ctx_state;
  if (!x) return;
  cl_mem* mems[3] = {&x->arena, &x->kv, &x->scratch};
  for (int i = 0; i < 3; i++)
    if (*mems[i]) x->b->api.clReleaseMemObject(*mems[i]);
  free(x);
}

static int cl_bind(void* state, el_context* c, void** ctx_state) {
  opencl* b = state;
  el_model* m = c->m;
  pthread_mutex_lock(&b->mu);
  int rc = make_weights(b, m);
  pthread_mutex_unlock(&b->mu);
  if (rc != 0) return -1;
  opencl_ctx* x = calloc(1, sizeof *x);
  if (!x) return el_error("out of memory");
  x->b = b;
  cl_int e = CL_SUCCESS;
  size_t kv = c->caches_map;
  /* the KV cache over the context's own cache memory where the device shares it (no second copy) */
  x->kv = b->api.clCreateBuffer(b->ctx, CL_MEM_READ_WRITE | (b->unified ? CL_MEM_USE_HOST_PTR : 0), kv,
                                b->unified ? c->caches : NULL, &e);
  if (x->kv) x->arena = b->api.clCreateBuffer(b->ctx, CL_MEM_READ_WRITE, c->arena_map, NULL, &e);
  if (x->arena) x->scratch = b->api.clCreateBuffer(b->ctx, CL_MEM_READ_WRITE, b->scratch_bytes + SCRATCH_ALIGN, NULL, &e);
  if (!x->scratch) {
    cl_unbind(x);
    return el_error("OpenCL: cannot allocate a context's KV cache (%.1f MB) and activations (%.1f MB) on %s: %s",
                    kv / 1e6, c->arena_map / 1e6, b->device_name, cl_err_name(e));
  }
  c->backend_bytes += b->unified ? c->arena_map + b->scratch_bytes : kv + c->arena_map + b->scratch_bytes;
  *ctx_state = x;
  return 0;
}

/* Bytes of a program's input (int32 ids, or the head's f32 hidden rows) and output rows. */
static size_t in_bytes(const el_model* m, int prog) {
  const el_plan_program* p = &m->prog[prog].p;
  return (size_t)p->tokens * (prog == EL_PROG_HEAD ? (size_t)m->h.dim * 4 : 4);
}

static int set_arg(opencl* b, cl_kernel k, cl_uint* i, size_t size, const void* v, const char* name) {
  cl_int e = b->api.clSetKernelArg(k, (*i)++, size, v);
  return e == CL_SUCCESS ? 0 : el_error("OpenCL: argument %u of kernel %s: %s", *i - 1, name, cl_err_name(e));
}

/* One step: every launch of its kernel, arguments as (buffer, byte offset). */
static int run_step(opencl* b, opencl_ctx* x, el_context* c, const el_step* st, int pos, int prog, uint32_t si) {
  cl_mem mem[MAX_PARAMS];
  cl_ulong off[MAX_PARAMS];
  int64_t dims[MAX_PARAMS][EL_MAX_ARGS_NDIM];
  for (uint32_t ai = 0; ai < st->n_args; ai++) {
    const el_plan_arg* a = &st->args[ai];
    int vpos = el_view_pos(c, a, pos);
    uint64_t at = (a->flags & EL_FLAG_AT_POS) ? (uint64_t)vpos * st->row_bytes[ai] : 0;
    for (uint32_t d = 0; d < EL_MAX_ARGS_NDIM; d++) dims[ai][d] = a->shape[d];
    if (a->kind == EL_ARG_ARENA) {
      mem[ai] = x->arena;
    } else if (a->kind == EL_ARG_WEIGHT) {
      mem[ai] = b->weights[a->index];
    } else if (a->kind == EL_ARG_SETTINGS) {
      mem[ai] = b->settings;
    } else {
      mem[ai] = x->kv;
      at += (uint64_t)(el_cache_of(c, a->kind, a->index) - c->caches);
      if (a->flags & EL_FLAG_PREFIX) dims[ai][0] = vpos + a->shape[0];
    }
    off[ai] = a->offset + at;
  }
  const cl_plan_kernel* pk = &b->kern[st->kernel];
  for (uint32_t l = 0; l < pk->n_launch; l++) {
    const cl_launch* L = &pk->launch[l];
    cl_uint ai = 0;
    for (uint32_t p = 0; p < L->n_params; p++) {
      const cl_param* P = &L->params[p];
      int rc = 0;
      if (P->kind == P_ARG) {
        rc = set_arg(b, L->k, &ai, sizeof(cl_mem), &mem[P->index], L->name) ||
             set_arg(b, L->k, &ai, sizeof(cl_ulong), &off[P->index], L->name);
      } else if (P->kind == P_SCRATCH) {
        cl_ulong so = pk->scratch_off[P->index];
        rc = set_arg(b, L->k, &ai, sizeof(cl_mem), &x->scratch, L->name) ||
             set_arg(b, L->k, &ai, sizeof(cl_ulong), &so, L->name);
      } else {
        int64_t v64 = dims[P->index][P->dim];
        int32_t v32 = (int32_t)v64;
        rc = set_arg(b, L->k, &ai, P->bytes, P->bytes == 8 ? (const void*)&v64 : (const void*)&v32, L->name);
      }
      if (rc) return -1;
    }
    cl_event ev = NULL;
    cl_int e = b->api.clEnqueueNDRangeKernel(b->q, L->k, 3, NULL, L->global, L->local, 0, NULL,
                                             c->prof_s ? &ev : NULL);
    if (e != CL_SUCCESS) {
      return el_error("OpenCL: launching %s (kernel %s, program %s step %u) failed: %s", L->name, st->kernel_name,
                      el_program_name(prog), si, cl_err_name(e));
    }
    if (ev) { /* EDGELLM_PROFILE: the step's device time, from the kernel's own events */
      cl_ulong t0 = 0, t1 = 0;
      b->api.clWaitForEvents(1, &ev);
      b->api.clGetEventProfilingInfo(ev, CL_PROFILING_COMMAND_START, sizeof t0, &t0, NULL);
      b->api.clGetEventProfilingInfo(ev, CL_PROFILING_COMMAND_END, sizeof t1, &t1, NULL);
      b->api.clReleaseEvent(ev);
      c->prof_s[c->prof_base[prog] + si] += t1 > t0 ? (double)(t1 - t0) * 1e-9 : 0;
    }
  }
  c->stats.kernel_calls++;
  c->stats.weight_bytes_read += st->weight_bytes;
  return 0;
}

static int cl_run(void* state, void* ctx_state, el_context* c, int prog, int pos) {
  opencl* b = state;
  opencl_ctx* x = ctx_state;
  const el_program* pg = &c->m->prog[prog];
  size_t nin = in_bytes(c->m, prog), nout = (size_t)pg->p.tokens * pg->p.out_row_bytes;
  pthread_mutex_lock(&b->mu); /* kernel arguments live on the shared cl_kernel objects */
  cl_int e = b->api.clEnqueueWriteBuffer(b->q, x->arena, CL_FALSE, pg->p.in_offset, nin, c->arena + pg->p.in_offset, 0,
                                         NULL, NULL);
  int rc = e == CL_SUCCESS ? 0 : CL_FAIL("writing a program's input", e);
  for (uint32_t si = 0; si < pg->n_steps && !rc; si++) rc = run_step(b, x, c, &pg->steps[si], pos, prog, si);
  if (!rc && (e = b->api.clEnqueueReadBuffer(b->q, x->arena, CL_TRUE, pg->p.out_offset, nout,
                                             c->arena + pg->p.out_offset, 0, NULL, NULL)) != CL_SUCCESS)
    rc = CL_FAIL("reading a program's output", e);
  if (rc) b->api.clFinish(b->q);
  pthread_mutex_unlock(&b->mu);
  return rc;
}

/* A window cache's newest rows to its start, inside the context's device KV buffer (in order with the kernels). */
static int cl_kv_move(void* state, void* ctx_state, el_context* c, size_t dst, size_t src, size_t bytes) {
  opencl* b = state;
  opencl_ctx* x = ctx_state;
  (void)c;
  pthread_mutex_lock(&b->mu);
  cl_int e = b->api.clEnqueueCopyBuffer(b->q, x->kv, x->kv, src, dst, bytes, 0, NULL, NULL);
  pthread_mutex_unlock(&b->mu);
  return e == CL_SUCCESS ? 0 : CL_FAIL("moving a window cache's rows", e);
}

static const char* const cl_options[] = {"device", NULL};
const el_backend el_backend_opencl = {"opencl", EL_BACKEND_DEVICE_WEIGHTS | EL_BACKEND_DEVICE_KV, cl_open, cl_close,
                                      cl_bind, cl_unbind, cl_run, cl_options,
                                      "android-gpu / opencl packages (OpenCL kernels)", cl_kv_move};
