/* The QNN backend: the npu_prefill program of an android-npu package runs its group graphs (npu/, compiled by
 * compiler/onnx_qnn) on the Qualcomm Hexagon NPU through ONNX Runtime's QNN execution provider.
 *
 * libonnxruntime is dlopen'ed (on a phone the app's copy, here the one in the onnxruntime wheel) and driven through
 * our own declarations of its C API (ort_api.h). The QNN EP is either built into that library (Android's
 * onnxruntime-android-qnn: appended by name) or a plugin library (the onnxruntime-qnn wheel: registered with the
 * env, then appended by device). Every session disables ONNX Runtime's CPU fallback: a graph the HTP cannot run
 * fails to load, it never runs silently on the CPU.
 *
 * npu/npu.txt (written by the compiler) names the chunk, the cache rows, the mask value, the RoPE table
 * (npu/rope.bin: per RoPE table, cos then sin, [kv_rows, head_dim] each; `rope_tables` of them, default 1) and, per group, its layers and graph, and per SoC the
 * prepared EPContext graphs. Inputs and outputs are found by name: x, cos, sin, mask / mask_w<W>, past_k<l>,
 * past_v<l> -> y, new_k<l>, new_v<l>.
 *
 * run(pos): x (the chunk's embedded rows, at the program's in_offset) goes through the groups in order; past K/V
 * are the context's own cache (zero copy: the graphs take the runtime's layout); the chunk's K/V rows are copied
 * into the cache at pos; y of the last group goes to out_offset. */
#define _GNU_SOURCE
#include <ctype.h>
#ifndef EL_NO_DLOPEN
#include <dlfcn.h>
#endif
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../core/el_internal.h"
#include "ort_api.h"

#define NPU_MAX_GROUPS 256
#define NPU_MAX_IO 1024
#define NPU_MAX_SOCS 8

enum { IN_X, IN_COS, IN_SIN, IN_MASK, IN_PAST_K, IN_PAST_V };
enum { OUT_Y = 16, OUT_NEW_K, OUT_NEW_V, OUT_OUTLIERS }; /* distinct from the IN_ kinds */

/* llm.npu's shadow outlier execution, CPU side: the graph clips a layer's FFN down-projection input to +-threshold
 * and outputs the raw values of `n` channels (outl<layer>); y += (outl - clip(outl)) @ cols, cols [n, dim] =
 * W_down[:, channels].T in float (npu/outliers.bin: n int32 channels, then cols). */
typedef struct {
  int layer, n;
  float threshold;
  const float* cols;
} npu_outliers;

typedef struct {
  char* name;
  int kind, arg; /* arg: layer (past/new), window (mask) */
} npu_io;

typedef struct {
  int l0, l1;
  char graph[4096 + 520]; /* package dir + "/" + the descriptor's path (<= 511) */
  OrtSession* sess;
  size_t n_in, n_out;
  npu_io* in;
  npu_io* out;
  const char** in_names;
  const char** out_names;
} npu_group;

typedef struct {
  void* dl;
  el_ort ort;
  OrtEnv* env;
  OrtMemoryInfo* mem;
  int plugin; /* the QNN EP came from a plugin library (unregister on close) */
  int chunk, kv_rows, n_groups, dim, kvh, hd;
  float mask_value;
  float* rope; /* [rope_tables][2][kv_rows][hd] */
  size_t rope_rows;
  int rope_tables; /* 1, or 2: the sliding-window layers' own table too (inputs cos_local / sin_local) */
  npu_group g[NPU_MAX_GROUPS];
  char soc[32];  /* the SoC whose EPContext graphs were loaded; "" = the ONNX graphs */
  npu_outliers outl[NPU_MAX_GROUPS];
  int n_outl;
  float* outl_data; /* npu/outliers.bin */
} qnn;

typedef struct {
  float* y[2];  /* [chunk, dim]: the residual stream between groups (ping-pong) */
  float* masks; /* one [chunk, kv_rows + chunk] per distinct window */
  int windows[16], n_windows;
} qnn_ctx;

static int ort_fail(qnn* q, OrtStatus* st, const char* what) {
  if (!st) return 0;
  el_error("NPU (ONNX Runtime QNN): %s: %s", what, q->ort.GetErrorMessage(st));
  q->ort.ReleaseStatus(st);
  return -1;
}

/* npu/npu.txt ----------------------------------------------------------------------------------------------------- */

static char* trim(char* s) {
  while (isspace((unsigned char)*s)) s++;
  size_t n = strlen(s);
  while (n && isspace((unsigned char)s[n - 1])) s[--n] = 0;
  return s;
}

/* Reads the descriptor; picks the SoC's graphs (soc: the requested SoC, "" none). */
static int read_descriptor(qnn* q, const char* dir, const char* soc) {
  char path[4096];
  snprintf(path, sizeof path, "%s/npu/npu.txt", dir);
  if (el_check_listed(dir, "npu/npu.txt")) return -1;
  size_t size;
  char* text = el_read_small_file(path, "npu/npu.txt", 1 << 20, &size);
  if (!text) return -1;
  char* save = NULL;
  int version = 0, soc_found = 0;
  q->rope_tables = 1;
  /* EDGELLM_NPU_ONNX_GRAPHS=1: the SoC's HTP options, but the ONNX graphs prepared at load instead of its EPContext
   * binaries (to check one against the other: the emulator runs one HTP version per process) */
  const char* force = getenv("EDGELLM_NPU_ONNX_GRAPHS");
  int use_ctx = !(force && !strcmp(force, "1"));
  char rope[512] = "", outl_file[512] = "", onnx_soc[32] = "";
  for (char* line = strtok_r(text, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
    line = trim(line);
    char a[512], b[512];
    int x, y;
    if (!*line || *line == '#') continue;
    if (sscanf(line, EL_NPU_MAGIC " %d", &version) == 1) continue;
    if (sscanf(line, "chunk %d", &q->chunk) == 1 || sscanf(line, "kv_rows %d", &q->kv_rows) == 1 ||
        sscanf(line, "mask_value %f", &q->mask_value) == 1 ||
        sscanf(line, "rope_tables %d", &q->rope_tables) == 1 || /* before "rope %s", which would take "_tables" */
        sscanf(line, "rope %511s", rope) == 1)
      continue;
    if (sscanf(line, "group %d %d %511s", &x, &y, a) == 3) {
      if (q->n_groups >= NPU_MAX_GROUPS) goto bad;
      npu_group* g = &q->g[q->n_groups++];
      g->l0 = x, g->l1 = y;
      if (el_package_path(dir, a, "npu/npu.txt", g->graph, sizeof g->graph)) return free(text), -1;
      continue;
    }
    /* outliers <layer> <threshold> <n> <byte offset in outliers file> */
    unsigned long long off;
    float t;
    if (sscanf(line, "outliers %d %f %d %llu", &x, &t, &y, &off) == 4) {
      if (q->n_outl >= NPU_MAX_GROUPS || y <= 0 || !(t > 0) || !isfinite(t) || off % 4) goto bad;
      q->outl[q->n_outl++] = (npu_outliers){x, y, t, (const float*)(uintptr_t)off}; /* offset until the file is read */
      continue;
    }
    if (sscanf(line, "outliers_file %511s", outl_file) == 1) continue;
    /* onnx_soc <name>: the HTP options the ONNX graphs are prepared with when no SoC is detected or given (float16
     * graphs with block-quantized weights need v73+; the x86 emulator otherwise assumes an older HTP) */
    if (sscanf(line, "onnx_soc %31s", onnx_soc) == 1) continue;
    /* soc <name> <group index> <epcontext graph> */
    if (sscanf(line, "soc %31s %d %511s", b, &x, a) == 3) {
      if (!soc || strcmp(b, soc) != 0 || !use_ctx) continue;
      if (x < 0 || x >= q->n_groups) goto bad;
      if (el_package_path(dir, a, "npu/npu.txt", q->g[x].graph, sizeof q->g[x].graph)) return free(text), -1;
      soc_found++;
      continue;
    }
    goto bad;
  }
  free(text);
  if (version != EL_NPU_VERSION)
    return el_error("npu/npu.txt has version %d, this runtime reads %d: recompile the package", version, EL_NPU_VERSION);
  if (q->chunk <= 0 || q->kv_rows <= 0 || q->n_groups == 0 || !rope[0])
    return el_error("npu/npu.txt is incomplete: recompile the package");
  if (q->rope_tables < 1 || q->rope_tables > 2)
    return el_error("npu/npu.txt has rope_tables %d (1 or 2): recompile the package", q->rope_tables);
  if (!isfinite(q->mask_value) || !(q->mask_value < 0))
    return el_error("npu/npu.txt has mask_value %g: a finite negative number is needed; recompile the package",
                    (double)q->mask_value);
  if (soc && *soc && use_ctx && soc_found != q->n_groups)
    return el_error("the package has no EPContext graphs for SoC %s: compile it with --soc %s, or run without "
                    "one (the ONNX graphs are prepared at load)", soc, soc);
  if (soc && *soc) snprintf(q->soc, sizeof q->soc, "%s", soc);
  else if (onnx_soc[0]) snprintf(q->soc, sizeof q->soc, "%s", onnx_soc);
  if (el_package_path(dir, rope, "npu/npu.txt", path, sizeof path) || el_check_listed(dir, rope)) return -1;
  float* r = el_read_small_file(path, "npu rope table", (size_t)1 << 30, &size);
  if (!r) return -1;
  if (size != (size_t)2 * q->rope_tables * q->kv_rows * q->hd * sizeof(float)) {
    free(r);
    return el_error("%s has %zu bytes, expected %zu: recompile the package", rope, size,
                    (size_t)2 * q->rope_tables * q->kv_rows * q->hd * sizeof(float));
  }
  for (size_t i = 0; i < size / sizeof(float); i++)
    if (!isfinite(r[i]) || fabsf(r[i]) > 16.0f) { /* cos/sin, at most scaled (YaRN-style attention factors) */
      double bad = (double)r[i];
      free(r);
      return el_error("%s holds a value no RoPE table has (%g at %zu): recompile the package", rope, bad, i);
    }
  q->rope = r;
  q->rope_rows = (size_t)q->kv_rows;
  if (q->n_outl) {
    if (!outl_file[0]) return el_error("npu/npu.txt lists outliers but no outliers_file: recompile the package");
    if (el_package_path(dir, outl_file, "npu/npu.txt", path, sizeof path) || el_check_listed(dir, outl_file)) return -1;
    if (!(q->outl_data = el_read_small_file(path, "npu outliers", (size_t)1 << 30, &size))) return -1;
    for (int i = 0; i < q->n_outl; i++) {
      npu_outliers* o = &q->outl[i];
      size_t off = (size_t)(uintptr_t)o->cols, need = (size_t)o->n * (1 + (size_t)q->dim) * sizeof(float);
      if (off > size || size - off < need)
        return el_error("%s is shorter than npu/npu.txt says: recompile the package", outl_file);
      o->cols = (const float*)((const uint8_t*)q->outl_data + off) + o->n; /* after the n int32 channel ids */
      for (size_t k = 0; k < (size_t)o->n * (size_t)q->dim; k++)
        if (!isfinite(o->cols[k])) return el_error("%s holds a non-finite weight: recompile the package", outl_file);
    }
  }
  return 0;
bad:
  free(text);
  return el_error("npu/npu.txt is corrupt: recompile the package");
}

/* The SoC of this phone, as the Linux socinfo driver numbers it (0 when unknown or not a phone). */
static const char* detect_soc(void) {
  FILE* f = fopen("/sys/devices/soc0/soc_id", "r");
  int id = 0;
  if (f) {
    if (fscanf(f, "%d", &id) != 1) id = 0;
    fclose(f);
  }
  switch (id) {
    case 519: case 536: return "sm8550";  /* Snapdragon 8 Gen 2 */
    case 557: return "sm8650";            /* Snapdragon 8 Gen 3 */
    case 618: return "sm8750";            /* Snapdragon 8 Elite */
    default: return NULL;
  }
}

/* Sessions ------------------------------------------------------------------------------------------------------- */

static int classify(npu_io* io, const char* name, int input) {
  int v;
  char tail[8];
  if (input) {
    if (!strcmp(name, "x")) return io->kind = IN_X, 0;
    if (!strcmp(name, "cos")) return io->kind = IN_COS, io->arg = 0, 0;
    if (!strcmp(name, "sin")) return io->kind = IN_SIN, io->arg = 0, 0;
    if (!strcmp(name, "cos_local")) return io->kind = IN_COS, io->arg = 1, 0;
    if (!strcmp(name, "sin_local")) return io->kind = IN_SIN, io->arg = 1, 0;
    if (!strcmp(name, "mask")) return io->kind = IN_MASK, io->arg = 0, 0;
    if (sscanf(name, "mask_w%d%1s", &v, tail) == 1 && v > 0) return io->kind = IN_MASK, io->arg = v, 0;
    if (sscanf(name, "past_k%d%1s", &v, tail) == 1) return io->kind = IN_PAST_K, io->arg = v, 0;
    if (sscanf(name, "past_v%d%1s", &v, tail) == 1) return io->kind = IN_PAST_V, io->arg = v, 0;
  } else {
    if (!strcmp(name, "y")) return io->kind = OUT_Y, 0;
    if (sscanf(name, "new_k%d%1s", &v, tail) == 1) return io->kind = OUT_NEW_K, io->arg = v, 0;
    if (sscanf(name, "new_v%d%1s", &v, tail) == 1) return io->kind = OUT_NEW_V, io->arg = v, 0;
    if (sscanf(name, "outl%d%1s", &v, tail) == 1) return io->kind = OUT_OUTLIERS, io->arg = v, 0;
  }
  return el_error("NPU graph %s %s is not one this runtime knows: recompile the package", input ? "input" : "output",
                  name);
}

static int load_names(qnn* q, npu_group* g) {
  OrtAllocator* a;
  if (ort_fail(q, q->ort.GetAllocatorWithDefaultOptions(&a), "allocator")) return -1;
  if (ort_fail(q, q->ort.SessionGetInputCount(g->sess, &g->n_in), "inputs") ||
      ort_fail(q, q->ort.SessionGetOutputCount(g->sess, &g->n_out), "outputs"))
    return -1;
  if (g->n_in > NPU_MAX_IO || g->n_out > NPU_MAX_IO) return el_error("NPU graph has too many inputs or outputs");
  g->in = calloc(g->n_in, sizeof *g->in), g->out = calloc(g->n_out, sizeof *g->out);
  g->in_names = calloc(g->n_in, sizeof(char*)), g->out_names = calloc(g->n_out, sizeof(char*));
  if (!g->in || !g->out || !g->in_names || !g->out_names) return el_error("out of memory");
  for (int pass = 0; pass < 2; pass++) {
    size_t n = pass ? g->n_out : g->n_in;
    for (size_t i = 0; i < n; i++) {
      char* name;
      OrtStatus* st = pass ? q->ort.SessionGetOutputName(g->sess, i, a, &name)
                           : q->ort.SessionGetInputName(g->sess, i, a, &name);
      if (ort_fail(q, st, "graph names")) return -1;
      npu_io* io = pass ? &g->out[i] : &g->in[i];
      io->name = strdup(name);
      q->ort.AllocatorFree(a, name);
      if (!io->name) return el_error("out of memory");
      if (classify(io, io->name, !pass) != 0) return -1;
      if ((io->kind == IN_PAST_K || io->kind == IN_PAST_V || io->kind == OUT_NEW_K || io->kind == OUT_NEW_V ||
           io->kind == OUT_OUTLIERS) &&
          (io->arg < g->l0 || io->arg >= g->l1))
        return el_error("NPU graph %s names layer %d outside its layers %d..%d: recompile the package", g->graph,
                        io->arg, g->l0, g->l1 - 1);
      if ((io->kind == IN_COS || io->kind == IN_SIN) && !pass && io->arg >= q->rope_tables)
        return el_error("NPU graph %s reads RoPE table %s, which npu/npu.txt does not list: recompile the package",
                        g->graph, io->name);
      (pass ? g->out_names : g->in_names)[i] = io->name;
    }
  }
  return 0;
}

/* The dims an input or output must have (rank 0: not checked here). */
static int expected_dims(const qnn* q, const npu_io* io, int64_t* d) {
  int C = q->chunk;
  switch (io->kind) {
    case IN_X: case OUT_Y: d[0] = C, d[1] = q->dim; return 2;
    case IN_COS: case IN_SIN: d[0] = C, d[1] = 1, d[2] = q->hd; return 3;
    case IN_MASK: d[0] = C, d[1] = (int64_t)q->kv_rows + C; return 2;
    case IN_PAST_K: case IN_PAST_V: d[0] = q->kv_rows, d[1] = q->kvh, d[2] = q->hd; return 3;
    case OUT_NEW_K: case OUT_NEW_V: d[0] = C, d[1] = q->kvh, d[2] = q->hd; return 3;
    default: return 0; /* outl<l>: [C, n], n checked against npu/npu.txt at run */
  }
}

/* Every float input and output has exactly the shape the runtime will hand it: the buffers are the context's own
 * (cache, arena rows), so a graph that disagrees with the plan is refused at load, never run. */
static int check_shapes(qnn* q, npu_group* g) {
  for (int pass = 0; pass < 2; pass++)
    for (size_t k = 0; k < (pass ? g->n_out : g->n_in); k++) {
      const npu_io* io = pass ? &g->out[k] : &g->in[k];
      int64_t want[4], got[4];
      int rank = expected_dims(q, io, want);
      OrtTypeInfo* ti;
      OrtStatus* st = pass ? q->ort.SessionGetOutputTypeInfo(g->sess, k, &ti)
                           : q->ort.SessionGetInputTypeInfo(g->sess, k, &ti);
      if (ort_fail(q, st, "graph types")) return -1;
      const OrtTensorTypeAndShapeInfo* info;
      ONNXTensorElementDataType type = ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED;
      size_t n = 0;
      int rc = ort_fail(q, q->ort.CastTypeInfoToTensorInfo(ti, &info), "graph types");
      if (!rc && info) rc = ort_fail(q, q->ort.GetTensorElementType(info, &type), "graph types");
      if (!rc && info) rc = ort_fail(q, q->ort.GetDimensionsCount(info, &n), "graph types");
      if (!rc && info && n <= 4) rc = ort_fail(q, q->ort.GetDimensions(info, got, n), "graph types");
      q->ort.ReleaseTypeInfo(ti);
      if (rc) return -1;
      int ok = info && type == ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT &&
               (rank == 0 ? n == 2 && got[0] == q->chunk : (size_t)rank == n);
      for (int d = 0; ok && d < rank; d++) ok = got[d] == want[d];
      if (!ok)
        return el_error("NPU graph %s: %s has another type or shape than this package's plan: recompile the package",
                        g->graph, io->name);
    }
  return 0;
}

static int append_qnn(qnn* q, OrtSessionOptions* so, const char* ep_lib, const char* backend) {
  const char* keys[3] = {"backend_path", "htp_arch", "soc_model"};
  const char* vals[3] = {backend, NULL, NULL};
  size_t n = 1;
  static const struct { const char* soc; const char* arch; const char* model; } SOCS[] = {
      {"sm8550", "73", "43"}, {"sm8650", "75", "57"}, {"sm8750", "79", "69"}};
  for (size_t i = 0; i < sizeof SOCS / sizeof SOCS[0]; i++)
    if (!strcmp(q->soc, SOCS[i].soc)) vals[1] = SOCS[i].arch, vals[2] = SOCS[i].model, n = 3;
  if (!ep_lib) return ort_fail(q, q->ort.SessionOptionsAppendExecutionProvider(so, "QNN", keys, vals, n), "QNN EP");
  if (!q->ort.GetEpDevices)
    return el_error("NPU: this libonnxruntime (API %u) cannot load a plugin EP library (needs ONNX Runtime 1.22+)",
                    q->ort.api_version);
  const OrtEpDevice* const* devs;
  size_t n_devs;
  if (ort_fail(q, q->ort.GetEpDevices(q->env, &devs, &n_devs), "EP devices")) return -1;
  const OrtEpDevice* qd[16];
  size_t n_q = 0;
  for (size_t i = 0; i < n_devs && n_q < 16; i++)
    if (!strcmp(q->ort.EpDevice_EpName(devs[i]), "QNNExecutionProvider")) qd[n_q++] = devs[i];
  if (!n_q) return el_error("NPU: %s registered no QNN device", ep_lib);
  return ort_fail(q, q->ort.SessionOptionsAppendExecutionProvider_V2(so, q->env, qd, n_q, keys, vals, n), "QNN EP");
}

/* Backend interface ------------------------------------------------------------------------------------------ */

static void qnn_close(void* state) {
  qnn* q = state;
  if (!q) return;
  for (int i = 0; i < q->n_groups; i++) {
    npu_group* g = &q->g[i];
    if (g->sess) q->ort.ReleaseSession(g->sess);
    for (size_t k = 0; g->in && k < g->n_in; k++) free(g->in[k].name);
    for (size_t k = 0; g->out && k < g->n_out; k++) free(g->out[k].name);
    free(g->in), free(g->out), free(g->in_names), free(g->out_names);
  }
  if (q->mem) q->ort.ReleaseMemoryInfo(q->mem);
  /* The env and the EP registration stay for the process: ORT allows one env, and unloading the QNN libraries
   * while another model may still use them is unsafe. */
  free(q->rope);
  free(q->outl_data);
  free(q);
}

static OrtEnv* g_env;
static int g_plugin_registered;
static pthread_mutex_t g_env_mu = PTHREAD_MUTEX_INITIALIZER;

/* A library location: the load option, else the environment variable, else NULL (the default). */
static const char* library_option(const el_model* m, const char* key, const char* env) {
  const char* v = el_backend_option(m, "qnn_ort", key);
  if (!v) v = getenv(env);
  return v && *v ? v : NULL;
}

static int open_sessions(el_model* m, const char* dir, qnn* q) {
  q->dim = (int)m->h.dim, q->kvh = (int)m->h.n_kv_heads, q->hd = (int)m->h.head_dim;
  const char* soc = el_backend_option(m, "qnn_ort", "npu_soc");
  if (!soc || !strcmp(soc, "auto")) soc = detect_soc();
  if (soc && !strcmp(soc, "none")) soc = NULL;
  if (read_descriptor(q, dir, soc) != 0) return -1;
  if (q->chunk != (int)m->prog[EL_PROG_STAGE_RUN].p.tokens)
    return el_error("npu/npu.txt has chunks of %d tokens, the plan %u: recompile the package", q->chunk,
                    m->prog[EL_PROG_STAGE_RUN].p.tokens), -1;
  if (q->kv_rows != (int)m->h.kv_rows)
    return el_error("npu/npu.txt has %d cache rows, the plan %u: recompile the package", q->kv_rows, m->h.kv_rows), -1;
  for (int i = 0; i < q->n_outl; i++) { /* the CPU's part lands before the next layer: it must end its graph */
    int ok = 0;
    for (int k = 0; k < q->n_groups; k++) ok |= q->g[k].l1 - 1 == q->outl[i].layer;
    if (!ok) return el_error("npu/npu.txt: outliers of layer %d inside a graph: recompile the package", q->outl[i].layer);
  }
  for (int i = 0; i < q->n_groups; i++)
    if (q->g[i].l0 != (i ? q->g[i - 1].l1 : 0) || q->g[i].l1 <= q->g[i].l0 ||
        (i == q->n_groups - 1 && q->g[i].l1 != (int)m->h.n_layers))
      return el_error("npu/npu.txt: the groups do not cover the %u layers in order: recompile the package",
                      m->h.n_layers), -1;

  const char* lib = library_option(m, "ort_library", "EDGELLM_ORT_LIB");
  if (!lib) lib = "libonnxruntime.so";
  const char* ep_lib = library_option(m, "qnn_ep_library", "EDGELLM_QNN_EP_LIB");
#ifdef EL_NO_DLOPEN
  return el_error("this edgellm-run is linked statically and cannot load %s: NPU prefill needs the NDK build "
                  "(compile the package with ANDROID_NDK_HOME set), or use --prefill-backend cpu", lib);
#else
  q->dl = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
  if (!q->dl)
    return el_error("NPU prefill needs ONNX Runtime with the QNN EP: cannot load %s (%s); on a phone push "
                    "libonnxruntime.so next to the binary and set LD_LIBRARY_PATH, or use --prefill-backend cpu",
                    lib, dlerror()), -1;
  el_ort_get_api_base_fn get_base = (el_ort_get_api_base_fn)dlsym(q->dl, "OrtGetApiBase");
  if (!get_base) return el_error("%s has no OrtGetApiBase: not an ONNX Runtime library", lib), -1;
  if (!el_ort_bind(&q->ort, get_base()))
    return el_error("%s is too old: the NPU backend needs ONNX Runtime 1.15 or newer", lib), -1;
#endif

  pthread_mutex_lock(&g_env_mu);
  OrtStatus* st = NULL;
  if (!g_env) st = q->ort.CreateEnv(ORT_LOGGING_LEVEL_ERROR, "edgellm", &g_env);
  if (!st && ep_lib && !g_plugin_registered) {
    if (!q->ort.RegisterExecutionProviderLibrary)
      st = q->ort.CreateStatus(ORT_FAIL, "this libonnxruntime cannot load plugin EP libraries (needs 1.22+)");
    else if (!(st = q->ort.RegisterExecutionProviderLibrary(g_env, "QNNExecutionProvider", ep_lib)))
      g_plugin_registered = 1;
  }
  pthread_mutex_unlock(&g_env_mu);
  if (ort_fail(q, st, "environment")) return -1;
  q->env = g_env;
  if (ort_fail(q, q->ort.CreateCpuMemoryInfo(OrtArenaAllocator, OrtMemTypeDefault, &q->mem), "memory info")) return -1;

  const char* backend = library_option(m, "qnn_backend", "EDGELLM_QNN_BACKEND");
  if (!backend) backend = "libQnnHtp.so";
  for (int i = 0; i < q->n_groups; i++) {
    OrtSessionOptions* so;
    if (ort_fail(q, q->ort.CreateSessionOptions(&so), "session options")) return -1;
    int rc = ort_fail(q, q->ort.AddSessionConfigEntry(so, "session.disable_cpu_ep_fallback", "1"), "options");
    if (!rc) rc = ort_fail(q, q->ort.SetSessionLogSeverityLevel(so, ORT_LOGGING_LEVEL_ERROR), "options");
    if (!rc) rc = ort_fail(q, q->ort.SetIntraOpNumThreads(so, 1), "options");
    if (!rc) rc = append_qnn(q, so, ep_lib, backend);
    if (!rc) {
      rc = ort_fail(q, q->ort.CreateSession(q->env, q->g[i].graph, so, &q->g[i].sess), q->g[i].graph);
    }
    q->ort.ReleaseSessionOptions(so);
    if (rc || load_names(q, &q->g[i]) != 0 || check_shapes(q, &q->g[i]) != 0) return -1;
  }
  return 0;
}

static int qnn_open(el_model* m, const char* dir, uint32_t programs, void** state) {
  if (programs != 1u << EL_PROG_STAGE_RUN)
    return el_error("the qnn_ort backend runs a staged prefill's graphs (npu_prefill) and nothing else: recompile the "
                    "package with --target android-npu");
  if (m->h.kv_dtype_bits != 32) /* its graphs write f32 caches (the compiler refuses --kv-cache f16 for them) */
    return el_error("the qnn_ort backend writes an f32 KV cache; this package's is %u-bit", m->h.kv_dtype_bits);
  qnn* q = calloc(1, sizeof *q);
  if (!q) return el_error("out of memory");
  if (open_sessions(m, dir, q) != 0) {
    qnn_close(q);
    return -1;
  }
  *state = q;
  return 0;
}

static void qnn_unbind(void* ctx_state) {
  qnn_ctx* x = ctx_state;
  if (!x) return;
  free(x->y[0]), free(x->y[1]), free(x->masks);
  free(x);
}

static int qnn_bind(void* state, el_context* c, void** ctx_state) {
  qnn* q = state;
  qnn_ctx* x = calloc(1, sizeof *x);
  if (!x) return el_error("out of memory");
  *ctx_state = x;
  size_t C = (size_t)q->chunk, S = (size_t)q->kv_rows + C;
  for (int i = 0; i < q->n_groups; i++)
    for (size_t k = 0; k < q->g[i].n_in; k++) {
      npu_io* io = &q->g[i].in[k];
      if (io->kind != IN_MASK) continue;
      int seen = 0;
      for (int w = 0; w < x->n_windows; w++) seen |= x->windows[w] == io->arg;
      if (!seen && x->n_windows == 16) return el_error("NPU graphs with more than 16 attention windows");
      if (!seen) x->windows[x->n_windows++] = io->arg;
    }
  x->y[0] = malloc(C * q->dim * sizeof(float)), x->y[1] = malloc(C * q->dim * sizeof(float));
  x->masks = malloc((x->n_windows ? x->n_windows : 1) * C * S * sizeof(float));
  if (!x->y[0] || !x->y[1] || !x->masks) return el_error("out of memory for the NPU buffers");
  c->backend_bytes += (2 * C * q->dim + x->n_windows * C * S) * sizeof(float);
  return 0;
}

/* Query i (position pos+i) sees cache rows j < pos and chunk rows j <= i; with a window W only keys at positions
 * > pos+i-W (npu_chunks.mask in Python). */
static void fill_mask(float* m, int pos, int C, int L, int W, float hidden) {
  for (int i = 0; i < C; i++) {
    float* r = m + (size_t)i * (L + C);
    long q = (long)pos + i;
    for (int j = 0; j < L; j++) r[j] = (j < pos && (!W || j > q - W)) ? 0.f : hidden;
    for (int j = 0; j < C; j++) r[L + j] = (j <= i && (!W || (long)pos + j > q - W)) ? 0.f : hidden;
  }
}

/* y [C, dim] += (outl - clip(outl)) @ cols for the layer's outlier channels; only elements past the threshold cost
 * anything (a few per token). */
static int add_outliers(const qnn* q, int layer, const float* outl, size_t n_values, float* y, int C) {
  const npu_outliers* o = NULL;
  for (int i = 0; i < q->n_outl; i++)
    if (q->outl[i].layer == layer) o = &q->outl[i];
  if (!o) return el_error("NPU graph outputs outliers of layer %d that npu/npu.txt does not describe", layer);
  if (n_values != (size_t)C * o->n)
    return el_error("NPU graph outputs %zu outlier values of layer %d, npu/npu.txt says %d per token", n_values, layer,
                    o->n);
  for (int r = 0; r < C; r++)
    for (int j = 0; j < o->n; j++) {
      float a = outl[(size_t)r * o->n + j];
      float d = a > o->threshold ? a - o->threshold : a < -o->threshold ? a + o->threshold : 0.f;
      if (d == 0.f) continue;
      const float* col = o->cols + (size_t)j * q->dim;
      float* yr = y + (size_t)r * q->dim;
      for (int h = 0; h < q->dim; h++) yr[h] += d * col[h];
    }
  return 0;
}

static int qnn_run(void* state, void* ctx_state, el_context* c, int prog, int pos) {
  qnn* q = state;
  qnn_ctx* x = ctx_state;
  const el_plan_program* p = &c->m->prog[prog].p;
  int C = q->chunk, L = q->kv_rows;
  if (pos + C > L) return el_error("NPU prefill at position %d: the chunk runs past the cache (%d rows)", pos, L);
  size_t S = (size_t)L + C, row = (size_t)q->kvh * q->hd;
  /* Rows the mask hides still reach the HTP's arithmetic (stale keys of an earlier conversation move its outputs
   * by ~1e-3, where the CPU EP moves by 0): the rows past pos are zeroed first, once per stale stretch. */
  if (c->kv_high > pos) {
    size_t off = (size_t)pos * row * sizeof(float), n = (size_t)(c->kv_high - pos) * row * sizeof(float);
    for (uint32_t l = 0; l < c->m->h.n_layers; l++) {
      memset(el_cache_of(c, EL_ARG_KCACHE, l) + off, 0, n);
      memset(el_cache_of(c, EL_ARG_VCACHE, l) + off, 0, n);
    }
  }
  c->kv_high = pos + C; /* this run writes rows pos .. pos+C-1 (padding rows included) */
  for (int w = 0; w < x->n_windows; w++) fill_mask(x->masks + w * (size_t)C * S, pos, C, L, x->windows[w], q->mask_value);
  const float* in = (const float*)(c->arena + p->in_offset);
  float* cur = (float*)in;
  for (int gi = 0; gi < q->n_groups; gi++) {
    npu_group* g = &q->g[gi];
    OrtValue* vin[NPU_MAX_IO] = {0};
    OrtValue* vout[NPU_MAX_IO] = {0};
    int rc = 0;
    float* y = gi == q->n_groups - 1 ? (float*)(c->arena + p->out_offset) : x->y[gi & 1];
    for (size_t k = 0; k < g->n_in && !rc; k++) {
      npu_io* io = &g->in[k];
      void* data = NULL;
      int64_t shape[3];
      size_t rank = 3;
      switch (io->kind) {
        case IN_X: data = cur, shape[0] = C, shape[1] = q->dim, rank = 2; break;
        case IN_COS: case IN_SIN:
          data = q->rope + (((size_t)io->arg * 2 + (io->kind == IN_SIN)) * q->rope_rows + (size_t)pos) * q->hd;
          shape[0] = C, shape[1] = 1, shape[2] = q->hd;
          break;
        case IN_MASK:
          for (int w = 0; w < x->n_windows; w++)
            if (x->windows[w] == io->arg) data = x->masks + w * (size_t)C * S;
          shape[0] = C, shape[1] = (int64_t)S, rank = 2;
          break;
        default:
          data = el_cache_of(c, io->kind == IN_PAST_K ? EL_ARG_KCACHE : EL_ARG_VCACHE, (uint32_t)io->arg);
          shape[0] = L, shape[1] = q->kvh, shape[2] = q->hd;
      }
      size_t bytes = sizeof(float);
      for (size_t d = 0; d < rank; d++) bytes *= (size_t)shape[d];
      rc = ort_fail(q, q->ort.CreateTensorWithDataAsOrtValue(q->mem, data, bytes, shape, rank,
                                                             ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT, &vin[k]), "input");
    }
    for (size_t k = 0; k < g->n_out && !rc; k++) {
      if (g->out[k].kind != OUT_Y) continue; /* K/V outputs: ORT allocates, copied into the cache below */
      int64_t shape[2] = {C, q->dim};
      rc = ort_fail(q, q->ort.CreateTensorWithDataAsOrtValue(q->mem, y, sizeof(float) * C * q->dim, shape, 2,
                                                             ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT, &vout[k]), "output");
    }
    if (!rc)
      rc = ort_fail(q, q->ort.Run(g->sess, NULL, g->in_names, (const OrtValue* const*)vin, g->n_in, g->out_names,
                                  g->n_out, vout), "run");
    for (size_t k = 0; k < g->n_out && !rc; k++) {
      npu_io* io = &g->out[k];
      if (io->kind == OUT_Y) continue;
      void* data;
      rc = ort_fail(q, q->ort.GetTensorMutableData(vout[k], &data), "output data");
      if (!rc && io->kind == OUT_OUTLIERS) {
        OrtTensorTypeAndShapeInfo* info;
        size_t n = 0;
        int64_t dims[2] = {0, 0};
        rc = ort_fail(q, q->ort.GetTensorTypeAndShape(vout[k], &info), "output shape");
        if (!rc) {
          rc = ort_fail(q, q->ort.GetDimensionsCount(info, &n), "output shape");
          if (!rc && n == 2) rc = ort_fail(q, q->ort.GetDimensions(info, dims, 2), "output shape");
          q->ort.ReleaseTensorTypeAndShapeInfo(info);
        }
        if (!rc) rc = add_outliers(q, io->arg, data, n == 2 ? (size_t)(dims[0] * dims[1]) : 0, y, C);
      } else if (!rc) {
        uint8_t* dst = el_cache_of(c, io->kind == OUT_NEW_K ? EL_ARG_KCACHE : EL_ARG_VCACHE, (uint32_t)io->arg);
        memcpy(dst + (size_t)pos * row * sizeof(float), data, (size_t)C * row * sizeof(float));
      }
    }
    for (size_t k = 0; k < g->n_in; k++)
      if (vin[k]) q->ort.ReleaseValue(vin[k]);
    for (size_t k = 0; k < g->n_out; k++)
      if (vout[k]) q->ort.ReleaseValue(vout[k]);
    if (rc) return -1;
    cur = y;
  }
  return 0;
}

static const char* const qnn_options[] = {"npu_soc", "ort_library", "qnn_ep_library", "qnn_backend", NULL};
const el_backend el_backend_qnn_ort = {"qnn_ort", 0, qnn_open, qnn_close, qnn_bind, qnn_unbind, qnn_run,
                                       qnn_options, "android-npu / host-npu packages (NPU graphs)", NULL};
