/* A context's state saved to a file and loaded back (issue 38): its KV cache rows, position and token ids, so that
 * an app restarts a conversation, or a long system prompt, without prefilling it again.
 *
 * The file (host byte order; a marker refuses a file from another byte order):
 *   header   magic "ELSTATE1", version, byte-order marker, the package's digest (sha256 of SHA256SUMS), the plan's
 *            KV shape (layers, KV heads, head size, rows, max context, vocabulary), the load settings that change
 *            what kernels compute (run-time settings, a staged NPU prefill), the position and the ids
 *   kv_base  per layer, the position at row 0 (window caches)
 *   ids      the tokens the cache holds (pos of them)
 *   rows     per layer, K then V: the rows the cache holds (pos - kv_base), as they are in memory
 *   sha256   of all the bytes before it
 * Written to a temporary file in the same directory, synced, then renamed over the target: a killed process leaves
 * the old file or the new one, never half of one. Loading checks everything before it trusts a byte, reads the rows
 * straight into the cache and, if the file ends early or its checksum differs, leaves the context empty. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "el_internal.h"

#define STATE_MAGIC "ELSTATE1"
enum { STATE_VERSION = 1, STATE_BYTE_ORDER = 0x01020304 };

typedef struct {
  char magic[8];
  uint32_t version, byte_order;
  uint8_t package[32];
  uint32_t n_layers, n_kv_heads, head_dim, kv_rows, max_ctx, vocab;
  float settings[EL_N_SETTINGS];
  uint32_t staged_prefill, pos;
} state_header;

static void header_of(const el_context* c, int pos, state_header* h) {
  const el_model* m = c->m;
  memset(h, 0, sizeof *h);
  memcpy(h->magic, STATE_MAGIC, 8);
  h->version = STATE_VERSION, h->byte_order = STATE_BYTE_ORDER;
  memcpy(h->package, m->package_digest, 32);
  h->n_layers = m->h.n_layers, h->n_kv_heads = m->h.n_kv_heads, h->head_dim = m->h.head_dim;
  h->kv_rows = m->h.kv_rows, h->max_ctx = m->h.max_ctx, h->vocab = m->h.vocab;
  memcpy(h->settings, m->settings, sizeof h->settings);
  h->staged_prefill = (uint32_t)m->staged_prefill;
  h->pos = (uint32_t)pos;
}

/* Whether the context's caches are the host's (a GPU backend keeps its own: those are not saved). */
static int host_caches(const el_context* c) {
  const el_model* m = c->m;
  for (int b = 0; b < m->n_backends; b++)
    if ((m->backends[b].be->caps & EL_BACKEND_DEVICE_KV) && c->backend_ctx[b]) return 0;
  return 1;
}

static int can_save(const el_context* c, const char* what) {
  if (!c->m->has_digest)
    return el_error("%s needs the package's SHA256SUMS, which this package does not have: recompile it with this "
                    "edgellm", what);
  if (!host_caches(c))
    return el_error("%s: this package keeps its KV cache in GPU memory; saved contexts are for CPU packages", what);
  return 0;
}

typedef struct {
  int fd;
  el_sha256 sum;
} sink;

static int put(sink* s, const void* p, size_t n) {
  el_sha256_update(&s->sum, p, n);
  for (const uint8_t* b = p; n > 0;) {
    ssize_t w = write(s->fd, b, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return -1;
    b += w, n -= (size_t)w;
  }
  return 0;
}

EL_API int el_context_save(el_context* c, const char* path, int n) {
  if (!c || !path) return el_error("el_context_save: context or path is NULL");
  pthread_mutex_lock(&c->mu);
  el_model* m = c->m;
  int rc = -1, fd = -1;
  char tmp[4096];
  tmp[0] = 0;
  if (can_save(c, "saving a context") != 0) goto out;
  if (n < 0) n = c->pos;
  if (n > c->pos || (n > 0 && n < el_kv_floor(c))) {
    el_error("cannot save the first %d tokens: the context holds %d%s", n, c->pos,
             n <= c->pos ? ", and its sliding-window layers no longer hold what the first ones need" : "");
    goto out;
  }
  if ((size_t)snprintf(tmp, sizeof tmp, "%s.tmp-%ld", path, (long)getpid()) >= sizeof tmp) {
    tmp[0] = 0;
    el_error("path too long: %s", path);
    goto out;
  }
  if ((fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644)) < 0) {
    el_error("cannot write %s: %s", path, strerror(errno));
    tmp[0] = 0;
    goto out;
  }
  sink s;
  s.fd = fd;
  el_sha256_init(&s.sum);
  state_header h;
  header_of(c, n, &h);
  int ok = put(&s, &h, sizeof h) == 0;
  for (uint32_t l = 0; ok && l < m->h.n_layers; l++) {
    int b = n > 0 ? c->kv_base[l] : 0; /* the first n tokens: n >= every window's floor, so base <= n */
    ok = put(&s, &b, sizeof b) == 0;
  }
  ok = ok && put(&s, c->ids, sizeof(int32_t) * (size_t)n) == 0;
  size_t krow = el_kv_row_bytes(&m->h, 0), vrow = el_kv_row_bytes(&m->h, 1);
  for (uint32_t l = 0; ok && l < m->h.n_layers; l++) {
    size_t held = n > 0 ? (size_t)(n - c->kv_base[l]) : 0;
    ok = put(&s, c->caches + m->kv_offset[2 * (size_t)l], held * krow) == 0 &&
         put(&s, c->caches + m->kv_offset[2 * (size_t)l + 1], held * vrow) == 0;
  }
  uint8_t d[32];
  el_sha256_final(&s.sum, d);
  ok = ok && put(&s, d, sizeof d) == 0 && fsync(fd) == 0;
  if (close(fd) != 0) ok = 0;
  fd = -1;
  if (!ok || rename(tmp, path) != 0) {
    el_error("cannot write %s: %s", path, errno ? strerror(errno) : "short write");
    goto out;
  }
  tmp[0] = 0;
  rc = 0;
out:
  if (fd >= 0) close(fd);
  if (tmp[0]) unlink(tmp); /* ours: never the target, which is left as it was */
  pthread_mutex_unlock(&c->mu);
  return rc;
}

typedef struct {
  FILE* f;
  el_sha256 sum;
} source;

static int get(source* s, void* p, size_t n) {
  if (n && fread(p, 1, n, s->f) != n) return -1;
  el_sha256_update(&s->sum, p, n);
  return 0;
}

/* What about a saved file's header differs from this context's package and load (NULL: nothing). */
static const char* mismatch(const state_header* got, const state_header* want) {
  if (memcmp(got->package, want->package, 32) != 0) return "another package (its digest differs)";
  if (got->n_layers != want->n_layers || got->n_kv_heads != want->n_kv_heads || got->head_dim != want->head_dim ||
      got->kv_rows != want->kv_rows || got->max_ctx != want->max_ctx || got->vocab != want->vocab)
    return "a model of another shape";
  if (memcmp(got->settings, want->settings, sizeof got->settings) != 0) return "other run-time settings";
  if (got->staged_prefill != want->staged_prefill) return "another prefill backend (NPU vs CPU)";
  return NULL;
}

EL_API int el_context_load(el_context* c, const char* path) {
  if (!c || !path) return el_error("el_context_load: context or path is NULL");
  pthread_mutex_lock(&c->mu);
  el_model* m = c->m;
  int rc = -1, touched = 0;
  struct stat st;
  source s;
  s.f = NULL;
  el_sha256_init(&s.sum);
  if (can_save(c, "loading a saved context") != 0) goto out;
  if (stat(path, &st) != 0 || !S_ISREG(st.st_mode)) {
    el_error("cannot read the saved context %s: %s", path, stat(path, &st) != 0 ? strerror(errno) : "not a file");
    goto out;
  }
  if (!(s.f = fopen(path, "rbe"))) {
    el_error("cannot read the saved context %s: %s", path, strerror(errno));
    goto out;
  }
  state_header h, want;
  header_of(c, c->pos, &want); /* pos aside: mismatch() compares what must agree */
  if (get(&s, &h, sizeof h) != 0 || memcmp(h.magic, STATE_MAGIC, 8) != 0) {
    el_error("%s is not a saved edgellm context", path);
    goto out;
  }
  if (h.version != STATE_VERSION || h.byte_order != STATE_BYTE_ORDER) {
    el_error("%s was saved by another edgellm version or machine (format %u): save it again", path, h.version);
    goto out;
  }
  const char* other = mismatch(&h, &want);
  if (other) {
    el_error("%s was saved with %s: it loads only into that package, loaded with the same settings", path, other);
    goto out;
  }
  if (h.pos > (uint32_t)m->h.max_ctx) {
    el_error("%s is damaged (position %u past the context's %u): delete it", path, h.pos, m->h.max_ctx);
    goto out;
  }
  int pos = (int)h.pos;
  size_t krow = el_kv_row_bytes(&m->h, 0), vrow = el_kv_row_bytes(&m->h, 1);
  int* base = calloc(m->h.n_layers ? m->h.n_layers : 1, sizeof *base);
  if (!base) {
    el_error("out of memory");
    goto out;
  }
  int bad = get(&s, base, sizeof(int) * m->h.n_layers) != 0;
  uint64_t need = sizeof h + sizeof(int) * (uint64_t)m->h.n_layers + sizeof(int32_t) * (uint64_t)pos + 32;
  for (uint32_t l = 0; !bad && l < m->h.n_layers; l++) {
    uint64_t rows = m->kv_layers[l].rows;
    bad = base[l] < 0 || base[l] > pos || (uint64_t)(pos - base[l]) > rows;
    if (!bad) need += (uint64_t)(pos - base[l]) * (krow + vrow); /* K and V rows (--kv-cache K,V: two sizes) */
  }
  if (bad || (uint64_t)st.st_size != need) {
    free(base);
    el_error("%s is damaged (%s): delete it", path, bad ? "bad cache layout" : "wrong size");
    goto out;
  }
  bad = get(&s, c->ids, sizeof(int32_t) * (size_t)pos) != 0;
  for (int i = 0; !bad && i < pos; i++) bad = c->ids[i] < 0 || (uint32_t)c->ids[i] >= m->h.vocab;
  /* from here the cache is overwritten: a failure leaves the context empty */
  touched = 1;
  for (uint32_t l = 0; !bad && l < m->h.n_layers; l++) {
    size_t held = (size_t)(pos - base[l]);
    bad = get(&s, c->caches + m->kv_offset[2 * (size_t)l], held * krow) != 0 ||
          get(&s, c->caches + m->kv_offset[2 * (size_t)l + 1], held * vrow) != 0;
  }
  uint8_t d[32], want_d[32];
  el_sha256_final(&s.sum, want_d);
  if (!bad) bad = fread(d, 1, sizeof d, s.f) != sizeof d || memcmp(d, want_d, 32) != 0;
  if (bad) {
    free(base);
    el_error("%s is damaged (its checksum differs): delete it", path);
    goto out;
  }
  memcpy(c->kv_base, base, sizeof(int) * m->h.n_layers);
  free(base);
  c->pos = pos, c->spec_open = 0;
  if (c->kv_high < pos) c->kv_high = pos;
  if (c->gen.active && !c->gen.finish) c->gen.finish = EL_FINISH_CANCELLED;
  rc = pos;
out:
  if (rc < 0 && touched) el_set_pos(c, 0);
  if (s.f) fclose(s.f);
  pthread_mutex_unlock(&c->mu);
  return rc;
}
