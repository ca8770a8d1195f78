/* el_model: loads a package directory: plan.bin (plan.c), the backends its programs name, the weight store the
 * memory budget calls for (offload/policy.c), the tokenizer. Nothing a run needs is decided later: after
 * el_model_load the model is read-only, so any number of contexts may share it.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "el_internal.h"

#define PLAN_MAX_BYTES (256u << 20) /* a plan is a few MB at most; refuse to read garbage of any size */

/* Public API: load / free -------------------------------------------------------------------------------------- */

EL_API void el_load_options_init(el_load_options* o) {
  if (!o) return;
  memset(o, 0, sizeof *o);
  o->huge_pages = -1;
  o->use_mmap = 1;
  o->ffn_threshold = -1;
}

static void model_destroy(el_model* m) {
  for (int k = 0; k < EL_N_PROGRAMS; k++) free(m->prog[k].steps), free(m->prog[k].order);
  for (int b = 0; b < m->n_backends; b++)
    if (m->backends[b].open) m->backends[b].be->close(m->backends[b].state);
  if (m->store) m->store->close(m->store);
  if (m->tok) el_tok_free(m->tok);
  free(m->backend_opts_text);
  free(m->plan), free(m->routing), free(m->kv_layers), free(m->kv_offset);
  el_pool_free(m);
  pthread_mutex_destroy(&m->mu);
  free(m);
}

void el_model_unref(el_model* m) {
  pthread_mutex_lock(&m->mu);
  int last = --m->refs == 0 && m->freed;
  pthread_mutex_unlock(&m->mu);
  if (last) model_destroy(m);
}

EL_API void el_model_free(el_model* m) {
  if (!m) return;
  pthread_mutex_lock(&m->mu);
  m->freed = 1;
  int now = m->refs == 0;
  pthread_mutex_unlock(&m->mu);
  if (now) model_destroy(m);
}

static int join(char* out, size_t n, const char* dir, const char* file) {
  if ((size_t)snprintf(out, n, "%s/%s", dir, file) >= n) return el_error("package path too long: %s", dir);
  return 0;
}

/* A mixture-of-experts package: its decode routes select some of their experts (a neuron-bundled FFN's routes may
 * select every group). */
static int has_experts(const el_model* m) {
  const el_program* dec = &m->prog[EL_PROG_DECODE];
  for (uint32_t si = 0; dec->present && si < dec->n_steps; si++)
    if (dec->steps[si].kind == EL_STEP_ROUTE && dec->steps[si].n_select < dec->steps[si].n_experts) return 1;
  return 0;
}

/* The weight store for the memory budget, which counts one context's KV cache and arena besides the weights. */
/* routing.bin (contract.h), if the package has one: per weight, the selections calibration made. */
static int load_routing(el_model* m, const char* dir) {
  char path[4096];
  struct stat st;
  if (join(path, sizeof path, dir, EL_FILE_ROUTING) != 0) return -1;
  if (lstat(path, &st) != 0) return 0; /* optional */
  size_t size, want = 16 + 4 * (size_t)m->h.n_weights;
  uint8_t* b = el_read_small_file(path, "routing table", want, &size);
  if (!b) return -1;
  uint32_t version = 0, n = 0;
  if (size >= 16) memcpy(&version, b + 8, 4), memcpy(&n, b + 12, 4); /* a truncated file has no header to read */
  if (size != want || memcmp(b, EL_ROUTING_MAGIC, 8) != 0 || version != EL_ROUTING_VERSION || n != m->h.n_weights) {
    free(b);
    return el_error("%s is corrupt (%zu bytes; expected %zu for %u weights, version %d): recompile the package or "
                    "copy it again", path, size, want, m->h.n_weights, EL_ROUTING_VERSION);
  }
  memmove(b, b + 16, 4 * (size_t)n); /* the counts, aligned at the start of the block */
  m->routing = (uint32_t*)b;
  return 0;
}

/* The name of a backend that holds every weight in device memory (EL_BACKEND_DEVICE_WEIGHTS), or NULL. */
static const char* device_backend(const el_model* m) {
  for (int b = 0; b < m->n_backends; b++)
    if (m->backends[b].be->caps & EL_BACKEND_DEVICE_WEIGHTS) return m->backends[b].be->name;
  return NULL;
}

static int open_store(el_model* m, const char* weights_path, const el_load_options* opt) {
  el_weight_use use;
  if (el_weight_use_of(m, &use) != 0) return -1;
  el_store_config cfg = {weights_path, m->weights, m->h.n_weights, m->h.weights_bytes, 0, opt->huge_pages,
                         opt->use_mmap, use.seq, use.seq_step, use.n_seq, use.must_pin, m->h.max_ctx,
                         opt->storage, opt->io_threads, opt->direct_io, opt->plan_only, opt->expert_eviction,
                         m->routing, !opt->no_expert_warm};
  el_store_request rq = {opt->weight_policy, opt->memory_budget, el_context_footprint(m), has_experts(m),
                         device_backend(m), m->h.max_ctx};
  char err[512];
  m->store = el_store_choose(&rq, &cfg, &m->minimum_budget, err, sizeof err);
  el_weight_use_free(&use);
  return m->store ? 0 : el_error("%s", err);
}

/* The package's digest (sha256 of SHA256SUMS; none for a package without one), which saved contexts carry. */
static int package_digest(el_model* m, const char* dir) {
  char path[4096];
  struct stat st;
  if (join(path, sizeof path, dir, EL_FILE_SUMS) != 0) return -1;
  if (stat(path, &st) != 0) return 0;
  size_t n;
  char* sums = el_read_small_file(path, "SHA256SUMS", 1u << 20, &n);
  if (!sums) return -1;
  el_sha256 s;
  el_sha256_init(&s);
  el_sha256_update(&s, sums, n);
  el_sha256_final(&s, m->package_digest);
  free(sums);
  m->has_digest = 1;
  return 0;
}

EL_API el_model* el_model_load(const char* dir, const el_load_options* opt) {
  if (!dir) return el_error("el_model_load: package_dir is NULL"), NULL;
  el_load_options defaults;
  if (!opt) el_load_options_init(&defaults), opt = &defaults;
  if (opt->huge_pages < -1 || opt->huge_pages > 1 || opt->n_threads > 1024 || opt->prefill_backend < EL_PREFILL_AUTO ||
      opt->prefill_backend > EL_PREFILL_NPU || opt->io_threads > 64 || opt->plan_only < 0 || opt->plan_only > 1 ||
      opt->direct_io < 0 || opt->direct_io > 1 || !(opt->ffn_threshold < 1e30f && opt->ffn_threshold > -1e30f) ||
      opt->expert_predict < 0 || opt->expert_predict > 1 || opt->no_expert_warm < 0 || opt->no_expert_warm > 1)
    return el_error("el_model_load: bad options (huge_pages %d, n_threads %d, prefill_backend %d, io_threads %d, "
                    "plan_only %d)", opt->huge_pages, opt->n_threads, opt->prefill_backend, opt->io_threads,
                    opt->plan_only), NULL;
  struct stat st;
  if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode))
    return el_error("%s is not a package directory (%s): compile one with `edgellm compile MODEL -o DIR`", dir,
                    stat(dir, &st) != 0 ? strerror(errno) : "not a directory"), NULL;
  /* A pinned digest is checked before any byte of the package is interpreted or any of its code is loaded. */
  if (opt->digest && el_verify_package(dir, opt->digest) != 0) return NULL;

  char path[4096];
  el_model* m = calloc(1, sizeof *m);
  if (!m) return el_error("out of memory"), NULL;
  pthread_mutex_init(&m->mu, NULL);
  m->verified = opt->digest != NULL;
  el_plan_header* h = &m->h;
  if (join(path, sizeof path, dir, EL_FILE_PLAN) != 0) goto fail;
  if (!(m->plan = el_read_small_file(path, "plan", PLAN_MAX_BYTES, &m->plan_size))) goto fail;
  if (el_plan_read(m) != 0 || el_weight_order(m) != 0) goto fail;
  /* the backends' own options: names checked here, values theirs (a set one the package has no backend for fails) */
  if (el_backend_options_parse(m, opt->backend_options) != 0) goto fail;
  if (package_digest(m, dir) != 0) goto fail;
  m->memory_budget = opt->memory_budget;
  m->plan_only = opt->plan_only;
  for (int i = 0; i < EL_N_SETTINGS; i++) m->settings[i] = -1; /* the package's defaults */
  m->settings[EL_SETTING_FFN_THRESHOLD] = opt->ffn_threshold;
  m->expert_predict = opt->expert_predict;

  /* weights.bin: a regular file of the exact size, before anything maps it */
  if (join(path, sizeof path, dir, EL_FILE_WEIGHTS) != 0) goto fail;
  if (stat(path, &st) != 0 || !S_ISREG(st.st_mode)) {
    el_error("cannot open %s: %s; recompile the package or copy it again", path,
             errno && stat(path, &st) != 0 ? strerror(errno) : "not a regular file");
    goto fail;
  }
  if ((uint64_t)st.st_size != h->weights_bytes) {
    if ((uint64_t)st.st_size < h->weights_bytes)
      el_error("weights.bin is truncated: %lld bytes, plan needs %llu; recompile the package or copy it again",
               (long long)st.st_size, (unsigned long long)h->weights_bytes);
    else
      el_error("weights.bin has %lld bytes, plan needs %llu: plan.bin and weights.bin do not belong together; "
               "recompile the package or copy it again", (long long)st.st_size, (unsigned long long)h->weights_bytes);
    goto fail;
  }

  /* options the package has nothing for are errors, not silently ignored (the Python API says the same first) */
  int reads_settings = 0;
  for (int k = 0; k < EL_N_PROGRAMS; k++) {
    if (!m->prog[k].present) continue;
    for (uint32_t si = 0; si < m->prog[k].n_steps; si++)
      for (uint32_t ai = 0; ai < m->prog[k].steps[si].n_args; ai++)
        reads_settings |= m->prog[k].steps[si].args[ai].kind == EL_ARG_SETTINGS;
  }
  if (opt->ffn_threshold >= 0 && !reads_settings) {
    el_error("ffn-threshold applies to packages compiled with --layout bundled; this package is not one");
    goto fail;
  }

  /* the backends the programs run on (the TVM CPU backend checks the machine, then loads the kernels); a staged
   * prefill's backend only when prompts are to be prefilled there, and with AUTO a staged backend that does not
   * open leaves prompts to the plain prefill */
  int staged_present = m->prog[EL_PROG_STAGE_RUN].present;
  int staged_slot = staged_present ? m->prog[EL_PROG_STAGE_RUN].slot : -1;
  if (opt->prefill_backend == EL_PREFILL_NPU && !staged_present) {
    el_error("this package has no NPU graphs (prefill backend npu): compile it with --target android-npu, or use the "
             "CPU prefill");
    goto fail;
  }
  for (int b = 0; b < m->n_backends && !m->plan_only; b++) {
    el_backend_slot* bs = &m->backends[b];
    if (b == staged_slot && opt->prefill_backend == EL_PREFILL_CPU) continue;
    if (bs->be->open(m, dir, bs->programs, &bs->state) != 0) {
      if (b == staged_slot && opt->prefill_backend == EL_PREFILL_AUTO) {
        snprintf(m->prefill_note, sizeof m->prefill_note, "%s", el_last_error());
        continue; /* AUTO: the plain prefill; el_model_prefill_backend tells why */
      }
      goto fail;
    }
    bs->open = 1;
  }
  m->staged_prefill = staged_slot >= 0 && m->backends[staged_slot].open;

  if (load_routing(m, dir) != 0 || open_store(m, path, opt) != 0) goto fail;

  if (join(path, sizeof path, dir, EL_FILE_TOKENIZER) != 0) goto fail;
  if (!m->plan_only && lstat(path, &st) == 0 && !(m->tok = el_tok_load(path))) goto fail;

  m->n_threads = opt->n_threads > 0 ? opt->n_threads : el_pool_default_threads();
  if (m->n_threads > 256) m->n_threads = 256;
  if (el_pool_reserve(m->n_threads) != 0) goto fail;
  return m;

fail:
  model_destroy(m);
  return NULL;
}

/* Public API: queries ------------------------------------------------------------------------------------------ */

EL_API int el_model_memory(const el_model* m, el_memory_plan* out) {
  if (!m || !out) return el_error("el_model_memory: NULL argument");
  const el_weight_store* s = m->store;
  const el_store_layout* l = &s->layout;
  memset(out, 0, sizeof *out);
  snprintf(out->policy, sizeof out->policy, "%s", s->policy);
  snprintf(out->storage, sizeof out->storage, "%s", l->storage ? l->storage : "native");
  snprintf(out->storage_what, sizeof out->storage_what, "%s", l->storage_what ? l->storage_what : "");
  out->budget = m->memory_budget;
  out->context_bytes = el_context_footprint(m);
  out->weights_bytes = m->h.weights_bytes;
  out->pinned_bytes = l->pinned_bytes, out->window_bytes = l->window_bytes, out->streamed_bytes = l->streamed_bytes;
  out->cache_bytes = l->cache_bytes, out->mapped_bytes = l->mapped_bytes;
  out->minimum_budget = m->minimum_budget;
  out->pinned_weights = l->pinned_weights, out->streamed_weights = l->streamed_weights;
  out->requests_per_token = l->requests_per_token;
  out->storage_modelled = l->storage_modelled, out->direct_io = l->direct_io;
  out->storage_bytes_per_s = l->storage_bytes_per_s, out->storage_latency_s = l->storage_latency_s;
  out->routed_bytes = l->routed_bytes, out->routed_cache_bytes = l->routed_cache_bytes;
  return 0;
}

EL_API int el_model_weights_pinned(const el_model* m, uint8_t* out, int cap) {
  if (!m) return el_error("el_model_weights_pinned: model is NULL");
  int n = (int)m->h.n_weights;
  for (int i = 0; i < n && i < cap && out; i++) out[i] = m->store->pinned ? m->store->pinned[i] : 1;
  return n;
}

#define GETTER(name, expr)                                       \
  EL_API int name(const el_model* m) {                           \
    if (!m) return el_error(#name ": model is NULL");            \
    return (int)(expr);                                          \
  }
GETTER(el_vocab, m->h.vocab)
GETTER(el_max_context, m->h.max_ctx)
GETTER(el_chunk, m->h.chunk)
GETTER(el_model_threads, m->n_threads)
GETTER(el_bos_id, m->h.bos_id)
GETTER(el_has_tokenizer, m->tok != NULL)

EL_API int el_model_device(const el_model* m, char* out, int cap) {
  if (!m) return el_error("el_model_device: model is NULL");
  if (out && cap > 0) snprintf(out, (size_t)cap, "%s", m->device_note);
  return (int)strlen(m->device_note);
}

EL_API int el_model_prefill_backend(const el_model* m, char* note, int cap) {
  if (!m) return el_error("el_model_prefill_backend: model is NULL");
  if (note && cap > 0) snprintf(note, (size_t)cap, "%s", m->prefill_note);
  return m->staged_prefill ? EL_PREFILL_NPU : EL_PREFILL_CPU;
}
#undef GETTER

/* Returns how many EOS ids the model has; copies at most cap of them. */
EL_API int el_eos_ids(const el_model* m, int32_t* out, int cap) {
  if (!m) return el_error("el_eos_ids: model is NULL");
  for (int i = 0; i < m->h.n_eos && i < cap && out; i++) out[i] = m->h.eos_ids[i];
  return m->h.n_eos;
}

EL_API int el_encode(const el_model* m, const char* text, int len, int add_special, int32_t* out, int cap) {
  if (!m) return el_error("el_encode: model is NULL");
  if (!m->tok) return el_error("this package has no tokenizer.bin: pass token ids instead of text");
  return el_tok_encode(m->tok, text, len, add_special, out, cap);
}

EL_API int el_token_text(const el_model* m, int32_t id, char* buf, int cap) {
  if (!m) return el_error("el_token_text: model is NULL");
  if (!m->tok) return el_error("this package has no tokenizer.bin: token text is not available");
  if (id < 0 || (uint32_t)id >= m->h.vocab) return el_error("token id %d is outside the vocabulary", id);
  if (id >= el_tok_n_vocab(m->tok) || el_tok_is_special(m->tok, id)) {
    if (cap > 0 && buf) buf[0] = 0;
    return 0;
  }
  return el_tok_decode(m->tok, id, buf, cap);
}
