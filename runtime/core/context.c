/* el_context: one conversation over a shared model. It owns the KV cache, the activation arena and the position,
 * and runs the model's programs on the backends they name. Every public function locks the context, so the
 * position is read and advanced under the lock (two threads on one context are serialised per call, never a torn
 * position); distinct contexts run concurrently.
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "el_internal.h"

/* Zeroed, page-aligned memory straight from the kernel: no memset of big caches, pages appear on first use. */
static void* map_zeroed(size_t bytes) {
  void* p = mmap(NULL, bytes ? bytes : 1, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  return p == MAP_FAILED ? NULL : p;
}

uint8_t* el_cache_of(el_context* c, uint32_t kind, uint32_t layer) {
  return c->caches + c->m->kv_offset[2 * (size_t)layer + (kind == EL_ARG_VCACHE)];
}

/* Window caches (contract.h) ------------------------------------------------------------------------------------ */

/* n bytes of the KV caches moved from offset src to dst: on the host (where a program runs there) and on every
 * backend that keeps the caches in its own memory. */
static int kv_move(el_context* c, size_t dst, size_t src, size_t n) {
  el_model* m = c->m;
  if (m->kv_host_moves) memmove(c->caches + dst, c->caches + src, n);
  for (int b = 0; b < m->n_backends; b++) {
    const el_backend* be = m->backends[b].be;
    if ((be->caps & EL_BACKEND_DEVICE_KV) && c->backend_ctx[b] &&
        be->kv_move(m->backends[b].state, c->backend_ctx[b], c, dst, src, n) != 0)
      return -1;
  }
  return 0;
}

/* Before a run of T tokens at pos: a window cache whose view would pass its rows moves its W - 1 newest rows, all a
 * query at pos or later can see, to its start (the two ranges never overlap: plan.c checks the rows). */
static int kv_make_room(el_context* c, int pos) {
  el_model* m = c->m;
  const el_plan_header* h = &m->h;
  for (uint32_t l = 0; l < h->n_layers; l++) {
    const el_plan_kv_layer* k = &m->kv_layers[l];
    int ctx = (int)(k->rows - (h->kv_rows - h->max_ctx)); /* views start below this row */
    if (k->rows == h->kv_rows || pos - c->kv_base[l] < ctx) continue;
    int keep = (int)k->window - 1, from = pos - keep - c->kv_base[l];
    for (int v = 0; v < 2 && keep > 0; v++) {
      size_t at = m->kv_offset[2 * (size_t)l + v], per_row = el_kv_row_bytes(h, v);
      if (kv_move(c, at, at + (size_t)from * per_row, (size_t)keep * per_row) != 0) return -1;
    }
    c->kv_base[l] = pos - keep;
    c->stats.kv_window_moves++;
  }
  return 0;
}

/* The lowest position besides 0 the context can go back to: a window cache holds no key below its base. */
int el_kv_floor(const el_context* c) {
  int f = 0;
  for (uint32_t l = 0; l < c->m->h.n_layers; l++)
    if (c->kv_base[l] > 0 && c->kv_base[l] + (int)c->m->kv_layers[l].window - 1 > f)
      f = c->kv_base[l] + (int)c->m->kv_layers[l].window - 1;
  return f;
}

/* Moves the context back to position n (0 <= n <= pos): 0 empties every cache; otherwise n must not be below
 * kv_floor. */
int el_set_pos(el_context* c, int n) {
  int floor = el_kv_floor(c);
  if (n > 0 && n < floor)
    return el_error("cannot go back to position %d: the sliding-window layers no longer hold the keys it needs (go "
                    "back to 0 or to %d or later)", n, floor);
  if (n == 0) memset(c->kv_base, 0, sizeof *c->kv_base * c->m->h.n_layers);
  c->pos = n;
  c->spec_open = 0;
  return 0;
}

/* Profile (EDGELLM_PROFILE=1) ------------------------------------------------------------------------------------ */

/* At context free, per program a table of its kernels (time summed over the steps that call the same kernel, and
 * the rate they read their weights at) to stderr, slowest first. Off by default: it costs two clock reads per step
 * (the OpenCL backend times kernels with the device's own events instead). */
static void profile_report(const el_context* c) {
  const el_model* m = c->m;
  for (int k = 0; k < EL_N_PROGRAMS; k++) {
    const el_program* pg = &m->prog[k];
    const double* ts = c->prof_s + c->prof_base[k];
    double total = 0;
    for (uint32_t i = 0; i < pg->n_steps; i++) total += ts[i];
    uint64_t runs = c->prof_runs[k];
    if (total <= 0 || !runs) continue;
    fprintf(stderr, "edgellm profile: %s, %llu runs, %.3f ms per run in kernels, %.3f ms per run in all\n",
            el_program_name(k), (unsigned long long)runs, 1e3 * total / runs, 1e3 * c->prof_wall[k] / runs);
    fprintf(stderr, "  %6s %9s %6s %8s  %s\n", "%", "ms/run", "steps", "wGB/s", "kernel");
    char* done = calloc(pg->n_steps ? pg->n_steps : 1, 1); /* aggregate by kernel name: O(n^2) over a few hundred steps */
    if (!done) return;
    for (;;) {
      int best = -1;
      double best_t = -1;
      for (uint32_t i = 0; i < pg->n_steps; i++) {
        if (done[i]) continue;
        double t = 0;
        for (uint32_t j = i; j < pg->n_steps; j++)
          if (!done[j] && strcmp(pg->steps[j].kernel_name, pg->steps[i].kernel_name) == 0) t += ts[j];
        if (t > best_t) best_t = t, best = (int)i;
      }
      if (best < 0) break;
      int n = 0;
      double bytes = 0; /* weight bytes of one run of these steps */
      for (uint32_t j = (uint32_t)best; j < pg->n_steps; j++)
        if (!done[j] && strcmp(pg->steps[j].kernel_name, pg->steps[best].kernel_name) == 0)
          done[j] = 1, n++, bytes += (double)pg->steps[j].weight_bytes;
      if (pg->steps[best].kind == EL_STEP_CALL) /* ROUTE / PREDICT steps call no kernel */
        fprintf(stderr, "  %6.2f %9.3f %6d %8.2f  %s\n", 100 * best_t / total, 1e3 * best_t / runs, n,
                best_t > 0 ? bytes * (double)runs / best_t / 1e9 : 0.0, pg->steps[best].kernel_name);
    }
    free(done);
  }
}

/* Create / free --------------------------------------------------------------------------------------------------- */

EL_API void el_context_free(el_context* c) {
  if (!c) return;
  el_model* m = c->m;
  if (c->prof_s) {
    profile_report(c);
    free(c->prof_s);
    free(c->prof_runs);
  }
  el_gen_release(&c->gen);
  for (int b = 0; b < m->n_backends; b++)
    if (c->backend_ctx[b]) m->backends[b].be->unbind(c->backend_ctx[b]);
  if (c->arena) munmap(c->arena, c->arena_map);
  if (c->caches) munmap(c->caches, c->caches_map);
  free(c->kv_base);
  free(c->ids);
  pthread_mutex_destroy(&c->mu);
  free(c);
  el_model_unref(m);
}

EL_API el_context* el_context_new(el_model* m, int n_threads) {
  if (!m) return el_error("el_context_new: model is NULL"), NULL;
  if (n_threads > 1024) return el_error("el_context_new: %d threads is too many (at most 256 are used)", n_threads), NULL;
  if (m->plan_only) return el_error("this model was loaded with plan_only: it runs nothing"), NULL;
  pthread_mutex_lock(&m->mu);
  int freed = m->freed;
  if (!freed) m->refs++;
  pthread_mutex_unlock(&m->mu);
  if (freed) return el_error("el_context_new: the model was freed"), NULL;
  el_context* c = calloc(1, sizeof *c);
  if (!c) {
    el_model_unref(m);
    return el_error("out of memory"), NULL;
  }
  c->m = m;
  pthread_mutex_init(&c->mu, NULL);
  const el_plan_header* h = &m->h;
  c->n_threads = n_threads > 0 ? (n_threads > 256 ? 256 : n_threads) : m->n_threads;
  if (c->n_threads != m->n_threads && el_pool_reserve(c->n_threads) != 0) goto fail;
  c->arena_map = (size_t)h->arena_bytes;
  if (!(c->arena = map_zeroed(c->arena_map))) {
    el_error("out of memory: the arena needs %llu bytes", (unsigned long long)h->arena_bytes);
    goto fail;
  }
  c->caches_map = (size_t)m->kv_offset[2 * (size_t)h->n_layers];
  if (!(c->kv_base = calloc(h->n_layers ? h->n_layers : 1, sizeof *c->kv_base)) ||
      !(c->ids = calloc(h->max_ctx ? h->max_ctx : 1, sizeof *c->ids))) {
    el_error("out of memory");
    goto fail;
  }
  if (!(c->caches = map_zeroed(c->caches_map))) {
    el_error("out of memory: the KV cache needs %zu bytes; use a package with a shorter max context", c->caches_map);
    goto fail;
  }
  for (int b = 0; b < m->n_backends; b++) {
    const el_backend_slot* bs = &m->backends[b];
    if (bs->open && bs->be->bind && bs->be->bind(bs->state, c, &c->backend_ctx[b]) != 0) goto fail;
  }
  if (el_profiling()) {
    uint32_t total = 0;
    for (int k = 0; k < EL_N_PROGRAMS; k++) c->prof_base[k] = total, total += m->prog[k].n_steps;
    c->prof_base[EL_N_PROGRAMS] = total;
    c->prof_s = calloc(total + 1, sizeof *c->prof_s);
    c->prof_runs = calloc(EL_N_PROGRAMS, sizeof *c->prof_runs);
    if (!c->prof_s || !c->prof_runs) {
      free(c->prof_s), free(c->prof_runs);
      c->prof_s = NULL, c->prof_runs = NULL;
    }
  }
  c->stats.kv_bytes = c->caches_map;
  c->stats.arena_bytes = c->arena_map;
  return c;
fail:
  el_context_free(c);
  return NULL;
}

/* Programs ---------------------------------------------------------------------------------------------------- */

/* Runs program k with `pos` tokens already in the KV cache (context locked). */
static int run(el_context* c, int k, int pos) {
  el_model* m = c->m;
  c->spec_open = 0; /* a run writes rows from pos: an earlier verify pass's drafts are gone */
  int b = m->prog[k].slot;
  if (m->window_caches && k != EL_PROG_HEAD && kv_make_room(c, pos) != 0) return -1;
  double t0 = c->prof_s ? el_now() : 0;
  int rc = m->backends[b].be->run(m->backends[b].state, c->backend_ctx[b], c, k, pos);
  if (c->prof_s) c->prof_wall[k] += el_now() - t0, c->prof_runs[k]++;
  return rc;
}

static int check_ids(const el_model* m, const int32_t* ids, int n) {
  for (int i = 0; i < n; i++)
    if (ids[i] < 0 || (uint32_t)ids[i] >= m->h.vocab)
      return el_error("token id %d (at index %d) is outside the vocabulary [0, %u)", ids[i], i, m->h.vocab);
  return 0;
}

/* A staged prefill: fixed-size chunks, each embedded by the first stage, then run by the second (on the backend it
 * names: android-npu's graphs); logits through the head program, one row at a time (the head's arena may overlap
 * the chunk's output: rows are copied out first). */
static int prefill_staged(el_context* c, const int32_t* ids, int n, float* logits, int all_logits) {
  el_model* m = c->m;
  const el_plan_program* e = &m->prog[EL_PROG_STAGE_EMBED].p;
  const el_plan_program* p = &m->prog[EL_PROG_STAGE_RUN].p;
  const el_plan_program* hp = &m->prog[EL_PROG_HEAD].p;
  int C = (int)p->tokens, valid = 0;
  size_t row = p->out_row_bytes;
  float* rows = logits ? malloc(row * (size_t)C) : NULL;
  if (logits && !rows) return el_error("out of memory");
  int rc = 0;
  for (int done = 0; done < n && !rc; done += valid) {
    int left = n - done;
    valid = left < C ? left : C;
    int32_t* in = (int32_t*)(c->arena + e->in_offset);
    memcpy(in, ids + done, sizeof(int32_t) * (size_t)valid);
    memset(in + valid, 0, sizeof(int32_t) * (size_t)(C - valid)); /* padding rows: id 0, masked by causality */
    rc = run(c, EL_PROG_STAGE_EMBED, c->pos) || run(c, EL_PROG_STAGE_RUN, c->pos);
    if (!rc && logits && (all_logits || done + valid == n)) {
      memcpy(rows, c->arena + p->out_offset, row * (size_t)valid);
      for (int r = all_logits ? 0 : valid - 1; r < valid && !rc; r++) {
        memcpy(c->arena + hp->in_offset, (uint8_t*)rows + row * (size_t)r, row);
        rc = run(c, EL_PROG_HEAD, c->pos + r);
        if (!rc) memcpy(logits + (size_t)(all_logits ? done + r : 0) * m->h.vocab, c->arena + hp->out_offset,
                        hp->out_row_bytes);
      }
    }
    if (!rc) c->pos += valid;
  }
  free(rows);
  return rc ? -1 : 0;
}

int el_prefill_locked(el_context* c, const int32_t* ids, int n, float* logits, int all_logits) {
  el_model* m = c->m;
  int max = (int)m->h.max_ctx;
  if (!ids) return el_error("el_prefill: ids is NULL");
  if (n <= 0) return el_error("el_prefill: prompt of %d tokens; it needs at least one", n);
  if (n > max - c->pos)
    return el_error("prompt of %d tokens does not fit: context is at %d of %d; reset the context or shorten the "
                    "prompt", n, c->pos, max);
  if (check_ids(m, ids, n) != 0) return -1;
  memcpy(c->ids + c->pos, ids, sizeof(int32_t) * (size_t)n); /* past pos until it succeeds: stale, as cache rows */
  double t0 = el_now();
  int start = c->pos, valid = 0;
  if (m->staged_prefill) {
    /* A stage calibrated without the first token (EL_PROGRAM_SKIPS_FIRST) leaves position 0 to the decode program:
     * trained LLMs put massive activations (10^3-10^4 x the median) on the first token, the attention sink, and
     * 16-bit graphs' ranges leave them out (compiler/onnx_qnn/calibrate.py). */
    int first = 0;
    if (c->pos == 0 && (m->prog[EL_PROG_STAGE_RUN].p.flags & EL_PROGRAM_SKIPS_FIRST)) {
      const el_plan_program* dp = &m->prog[EL_PROG_DECODE].p;
      *(int32_t*)(c->arena + dp->in_offset) = ids[0];
      if (run(c, EL_PROG_DECODE, 0) != 0) goto fail;
      if (c->kv_high < 1) c->kv_high = 1;
      if (logits && (all_logits || n == 1)) memcpy(logits, c->arena + dp->out_offset, dp->out_row_bytes);
      c->pos = first = 1;
    }
    float* rest = logits && all_logits ? logits + (size_t)first * m->h.vocab : logits;
    if (n > first && prefill_staged(c, ids + first, n - first, rest, all_logits) != 0) goto fail;
    c->stats.prefill_seconds += el_now() - t0;
    c->stats.prefill_tokens += (uint64_t)n;
    return 0;
  }
  int k = (all_logits && logits) ? EL_PROG_PREFILL_LOGITS : EL_PROG_PREFILL;
  const el_plan_program* p = &m->prog[k].p;
  for (int done = 0; done < n; done += valid) {
    /* A last piece of at most half a chunk runs through prefill_short when the package has it: a chunk costs the
     * same however few of its rows are real (1B f16, 128-token chunks: 590 ms for a 5-token prompt, 125 ms as one
     * 16-token chunk, 501 ms for 64 tokens as four). */
    int left = n - done;
    const el_program* sp = &m->prog[EL_PROG_PREFILL_SHORT];
    if (k == EL_PROG_PREFILL && sp->present && left < (int)m->h.chunk &&
        (left + (int)sp->p.tokens - 1) / (int)sp->p.tokens * sp->p.tokens <= m->h.chunk / 2)
      k = EL_PROG_PREFILL_SHORT, p = &sp->p;
    int C = (int)p->tokens;
    valid = left < C ? left : C;
    int32_t* in = (int32_t*)(c->arena + p->in_offset);
    memcpy(in, ids + done, sizeof(int32_t) * (size_t)valid);
    memset(in + valid, 0, sizeof(int32_t) * (size_t)(C - valid)); /* padding rows: id 0, masked by causality */
    if (run(c, k, c->pos) != 0) goto fail;
    if (c->kv_high < c->pos + C) c->kv_high = c->pos + C;
    if (k == EL_PROG_PREFILL_LOGITS)
      for (int r = 0; r < valid; r++)
        memcpy(logits + (size_t)(done + r) * m->h.vocab, c->arena + p->out_offset + r * p->out_row_bytes,
               p->out_row_bytes);
    c->pos += valid;
  }
  if (logits && !all_logits) {
    const el_plan_program* hp = &m->prog[EL_PROG_HEAD].p;
    memmove(c->arena + hp->in_offset, c->arena + p->out_offset + (uint64_t)(valid - 1) * p->out_row_bytes,
            p->out_row_bytes);
    if (run(c, EL_PROG_HEAD, c->pos - 1) != 0) goto fail; /* position of the row it reads */
    memcpy(logits, c->arena + hp->out_offset, hp->out_row_bytes);
  }
  c->stats.prefill_seconds += el_now() - t0;
  c->stats.prefill_tokens += (uint64_t)n;
  return 0;
fail:
  /* rows written past start are never read before being rewritten; where a window cache moved past start, the
   * conversation is forgotten (position 0), and the prefill's own error stays the one reported */
  el_set_pos(c, start > 0 && start < el_kv_floor(c) ? 0 : start);
  return -1;
}

int el_decode_locked(el_context* c, int32_t id, float* logits) {
  el_model* m = c->m;
  if (c->pos + 1 > (int)m->h.max_ctx)
    return el_error("context is full (%d of %d tokens): reset the context or use a package with a longer context",
                    c->pos, (int)m->h.max_ctx);
  if (check_ids(m, &id, 1) != 0) return -1;
  double t0 = el_now();
  const el_plan_program* p = &m->prog[EL_PROG_DECODE].p;
  *(int32_t*)(c->arena + p->in_offset) = id;
  uint64_t w0 = c->stats.weight_bytes_read;
  el_weight_store* st = m->store;
  el_store_counters k0 = {0}, k1 = {0};
  if (st->counters) st->counters(st, &k0);
  if (run(c, EL_PROG_DECODE, c->pos) != 0) return -1;
  c->stats.decode_weight_bytes_read += c->stats.weight_bytes_read - w0;
  if (st->counters) { /* the store's counters over this step (shared by contexts: exact when one runs at a time) */
    st->counters(st, &k1);
    c->stats.expert_selected += k1.expert_selected - k0.expert_selected;
    c->stats.expert_cached += k1.expert_cached - k0.expert_cached;
    c->stats.expert_prefetched += k1.expert_prefetched - k0.expert_prefetched;
    c->stats.expert_stalls += k1.expert_stalls - k0.expert_stalls;
    c->stats.expert_predict_reads += k1.predict_reads - k0.predict_reads;
    c->stats.expert_predict_wasted += k1.predict_wasted - k0.predict_wasted;
    c->stats.decode_io_bytes_read += k1.bytes_read - k0.bytes_read;
    c->stats.decode_io_stall_seconds += k1.stall_s - k0.stall_s;
  }
  if (c->kv_high < c->pos + 1) c->kv_high = c->pos + 1;
  if (logits) memcpy(logits, c->arena + p->out_offset, p->out_row_bytes);
  c->ids[c->pos] = id;
  c->pos += 1;
  c->stats.decode_seconds += el_now() - t0;
  c->stats.decode_tokens += 1;
  return 0;
}

/* Speculative decoding: ids[0] (the token just sampled) and n - 1 drafts in one run of the verify program (one pass
 * over the weights); logits gets each one's row [n][vocab]. parents (NULL: a chain, parents[i] = i - 1) makes the
 * drafts a tree: draft i follows node parents[i] < i, and sits at the position of its depth; such a pass needs a
 * program that takes trees (EL_PROGRAM_TREE). The position advances by one: the drafts' cache rows are written but
 * belong to the context only as el_verify_accept takes them, a path down the tree (rows past the position are never
 * read: attention stops at each query's own position). */
int el_verify_locked(el_context* c, const int32_t* ids, const int32_t* parents, int n, float* logits) {
  el_model* m = c->m;
  const el_plan_program* p = &m->prog[EL_PROG_VERIFY].p;
  if (!m->prog[EL_PROG_VERIFY].present || n < 1 || n > (int)p->tokens)
    return el_error("el_verify: %d tokens; this package verifies 1..%u", n, m->prog[EL_PROG_VERIFY].present ? p->tokens : 0);
  if (c->pos + n > (int)m->h.max_ctx) return el_error("el_verify: %d tokens do not fit the context", n);
  if (check_ids(m, ids, n) != 0) return -1;
  int tree = (p->flags & EL_PROGRAM_TREE) != 0, T = (int)p->tokens;
  int32_t parent[32], tab[33][32]; /* the tree as the kernels take it: depths, then each row's ancestors by depth */
  for (int i = 0; i < T; i++) { /* padding rows continue the chain: no real row follows them */
    parent[i] = i == 0 ? -1 : parents && i < n ? parents[i] : i - 1;
    if (i > 0 && (parent[i] < 0 || parent[i] >= i))
      return el_error("el_verify: draft %d follows node %d; a draft follows an earlier node (0 is the first id)", i,
                      parent[i]);
    if (i > 0 && parent[i] != i - 1 && !tree)
      return el_error("el_verify: this package's verify program takes chains of drafts, not trees: recompile it "
                      "with this edgellm");
    int d = i ? tab[0][parent[i]] + 1 : 0;
    tab[0][i] = d;
    if (i) memcpy(tab[1 + i], tab[1 + parent[i]], sizeof(int32_t) * (size_t)d);
    tab[1 + i][d] = i;
    for (int j = d + 1; j < T; j++) tab[1 + i][j] = i; /* never read */
  }
  double t0 = el_now();
  int32_t* in = (int32_t*)(c->arena + p->in_offset);
  memcpy(in, ids, sizeof(int32_t) * (size_t)n);
  for (int i = n; i < T; i++) in[i] = 0; /* padding rows: no real row follows them */
  if (tree)
    for (int r = 0; r <= T; r++)
      memcpy(c->arena + p->in_offset + EL_TREE_OFFSET(T) + sizeof(int32_t) * (size_t)(r * T), tab[r],
             sizeof(int32_t) * (size_t)T);
  if (p->flags & EL_PROGRAM_ROWS) { /* the GEMMs compute the n real rows only */
    int32_t cnt[EL_ROWS_BYTES / 4] = {n};
    memcpy(c->arena + p->in_offset + EL_ROWS_OFFSET(T), cnt, sizeof cnt);
  }
  uint64_t w0 = c->stats.weight_bytes_read;
  if (run(c, EL_PROG_VERIFY, c->pos) != 0) return -1;
  c->stats.decode_weight_bytes_read += c->stats.weight_bytes_read - w0;
  if (c->kv_high < c->pos + T) c->kv_high = c->pos + T;
  for (int r = 0; r < n; r++)
    memcpy(logits + (size_t)r * m->h.vocab, c->arena + p->out_offset + r * p->out_row_bytes, p->out_row_bytes);
  memcpy(c->spec_parent, parent, sizeof(int32_t) * (size_t)n);
  memcpy(c->spec_ids, ids, sizeof(int32_t) * (size_t)n);
  c->ids[c->pos] = ids[0];
  c->spec_root = c->pos;
  c->spec_node = 0;
  c->pos += 1;
  c->spec_open = n;
  c->stats.decode_seconds += el_now() - t0;
  c->stats.decode_tokens += 1;
  c->stats.spec_passes += 1;
  c->stats.spec_drafted += (uint64_t)(n - 1);
  return 0;
}

/* Every layer's K and V row of position `from` copied to position `to` (< from; the rows of one verify pass, which a
 * window cache holds together), on the host and on backends that keep the cache on their device. */
static int kv_copy_row(el_context* c, int from, int to) {
  el_model* m = c->m;
  for (uint32_t l = 0; l < m->h.n_layers; l++)
    for (int v = 0; v < 2; v++) {
      size_t at = m->kv_offset[2 * (size_t)l + v], per_row = el_kv_row_bytes(&m->h, v);
      if (kv_move(c, at + (size_t)(to - c->kv_base[l]) * per_row, at + (size_t)(from - c->kv_base[l]) * per_row,
                  per_row) != 0)
        return -1;
    }
  return 0;
}

/* Draft `node` of the last el_verify_locked (a child of the node the context ends with) is the token sampled next:
 * its cache row joins the context, moved down to the position of its depth when a branch put it further along. */
int el_verify_accept(el_context* c, int node) {
  if (!c->spec_open || node <= c->spec_node || node >= c->spec_open || c->spec_parent[node] != c->spec_node)
    return el_error("el_verify: draft %d does not follow the context's last token (the last verify pass left %s)",
                    node, c->spec_open ? "other drafts" : "none");
  if (c->spec_root + node != c->pos && kv_copy_row(c, c->spec_root + node, c->pos) != 0) return -1;
  c->spec_node = node;
  c->ids[c->pos] = c->spec_ids[node];
  c->pos += 1;
  c->stats.decode_tokens += 1;
  c->stats.spec_accepted += 1;
  return 0;
}

EL_API int el_verify_width(const el_model* m) { return m ? el_verify_tokens(m) : 0; }
int el_verify_tokens(const el_model* m) { return m->prog[EL_PROG_VERIFY].present ? (int)m->prog[EL_PROG_VERIFY].p.tokens : 0; }

/* The logits rows a generation holds for verify passes. */
int el_spec_rows(const el_model* m) {
  int w = el_verify_tokens(m);
  return w < EL_MAX_DRAFT + 1 ? w : EL_MAX_DRAFT + 1;
}

/* Public API ------------------------------------------------------------------------------------------------------ */

EL_API int el_prefill(el_context* c, const int32_t* ids, int n, float* logits, int all_logits) {
  if (!c) return el_error("el_prefill: context is NULL");
  pthread_mutex_lock(&c->mu);
  int rc = el_prefill_locked(c, ids, n, logits, all_logits);
  pthread_mutex_unlock(&c->mu);
  return rc;
}

EL_API int el_decode(el_context* c, int32_t id, float* logits) {
  if (!c) return el_error("el_decode: context is NULL");
  pthread_mutex_lock(&c->mu);
  int rc = el_decode_locked(c, id, logits);
  pthread_mutex_unlock(&c->mu);
  return rc;
}

EL_API int el_verify(el_context* c, const int32_t* ids, int n, float* logits) {
  return el_verify_tree(c, ids, NULL, n, logits);
}

EL_API int el_verify_tree(el_context* c, const int32_t* ids, const int32_t* parents, int n, float* logits) {
  if (!c || !ids || !logits) return el_error("el_verify: context, ids or logits is NULL");
  pthread_mutex_lock(&c->mu);
  int rc = el_verify_locked(c, ids, parents, n, logits);
  pthread_mutex_unlock(&c->mu);
  return rc;
}

/* The drafts left after the context's last node that a chain of k takes (-1: fewer, or a branch). */
static int chain_left(const el_context* c, int k) {
  int at = c->spec_node;
  for (int i = 0; i < k; i++, at++)
    if (at + 1 >= c->spec_open || c->spec_parent[at + 1] != at) return -1;
  return 0;
}

EL_API int el_verify_take(el_context* c, int k) {
  if (!c) return el_error("el_verify_take: context is NULL");
  pthread_mutex_lock(&c->mu);
  int rc = 0;
  if (k < 0 || chain_left(c, k) != 0)
    rc = el_error("el_verify_take: %d drafts asked for; the last verify pass left %d in a chain to take", k,
                  c->spec_open ? c->spec_open - 1 - c->spec_node : 0);
  else
    for (int i = 0; i < k && rc == 0; i++) rc = el_verify_accept(c, c->spec_node + 1);
  pthread_mutex_unlock(&c->mu);
  return rc;
}

EL_API int el_verify_node(el_context* c) {
  if (!c) return 0;
  pthread_mutex_lock(&c->mu);
  int node = c->spec_open ? c->spec_node : 0;
  pthread_mutex_unlock(&c->mu);
  return node;
}

EL_API int el_verify_take_node(el_context* c, int node) {
  if (!c) return el_error("el_verify_take_node: context is NULL");
  pthread_mutex_lock(&c->mu);
  int rc = el_verify_accept(c, node);
  pthread_mutex_unlock(&c->mu);
  return rc;
}

EL_API int el_reset(el_context* c) {
  if (!c) return el_error("el_reset: context is NULL");
  pthread_mutex_lock(&c->mu);
  el_set_pos(c, 0); /* stale cache rows are harmless: a run writes rows pos.. before any kernel reads them */
  if (c->gen.active && !c->gen.finish) c->gen.finish = EL_FINISH_CANCELLED;
  pthread_mutex_unlock(&c->mu);
  return 0;
}

EL_API int el_rewind(el_context* c, int n) {
  if (!c) return el_error("el_rewind: context is NULL");
  pthread_mutex_lock(&c->mu);
  int pos = c->pos;
  if (n < 0 || n > pos) {
    pthread_mutex_unlock(&c->mu);
    return el_error("el_rewind: %d is outside the conversation's %d tokens", n, pos);
  }
  int rc = el_set_pos(c, n); /* rows n.. become stale, as after el_reset */
  if (!rc && c->gen.active && !c->gen.finish) c->gen.finish = EL_FINISH_CANCELLED;
  pthread_mutex_unlock(&c->mu);
  return rc;
}

EL_API int el_context_tokens(const el_context* c, int32_t* out, int cap) {
  if (!c || (cap && !out)) return el_error("el_context_tokens: context or out is NULL");
  el_context* w = (el_context*)c;
  pthread_mutex_lock(&w->mu);
  int n = c->pos;
  if (out) memcpy(out, c->ids, sizeof(int32_t) * (size_t)(n < cap ? n : cap));
  pthread_mutex_unlock(&w->mu);
  return n;
}

EL_API int el_rewind_floor(const el_context* c) {
  if (!c) return el_error("el_rewind_floor: context is NULL");
  el_context* w = (el_context*)c;
  pthread_mutex_lock(&w->mu);
  int f = el_kv_floor(c);
  pthread_mutex_unlock(&w->mu);
  return f;
}

EL_API int el_pos(const el_context* c) {
  if (!c) return el_error("el_pos: context is NULL");
  el_context* w = (el_context*)c;
  pthread_mutex_lock(&w->mu);
  int pos = c->pos;
  pthread_mutex_unlock(&w->mu);
  return pos;
}

EL_API int el_context_threads(const el_context* c) { return c ? c->n_threads : el_error("context is NULL"); }
EL_API el_model* el_context_model(const el_context* c) { return c ? c->m : NULL; }

EL_API void el_get_stats(const el_context* c, el_stats* out) {
  if (!out) return;
  memset(out, 0, sizeof *out);
  if (!c) {
    el_error("el_get_stats: context is NULL");
    return;
  }
  el_context* w = (el_context*)c;
  pthread_mutex_lock(&w->mu);
  *out = c->stats;
  out->weight_bytes_resident = c->m->store->bytes_resident(c->m->store);
  out->weight_bytes_huge = c->m->store->bytes_huge;
  out->kv_bytes = c->caches_map;
  out->arena_bytes = c->arena_map;
  uint64_t vocab = c->m->h.vocab;
  out->context_bytes = c->caches_map + c->arena_map + sizeof *c + c->backend_bytes +
                       (c->gen.logits ? 4 * vocab : 0) + el_sampler_bytes(c->gen.sampler) +
                       (c->gen.spec_logits ? 4 * vocab * (uint64_t)el_spec_rows(c->m) : 0) +
                       (uint64_t)c->gen.cap_hist * 4 + c->gen.text_cap;
  pthread_mutex_unlock(&w->mu);
  el_weight_store* st = c->m->store;
  if (st->counters) {
    el_store_counters k;
    st->counters(st, &k);
    out->io_bytes_read = k.bytes_read, out->io_requests = k.requests, out->io_hits = k.hits;
    out->io_misses = k.misses, out->io_dropped = k.dropped, out->io_stall_seconds = k.stall_s;
    out->io_routed_hits = k.routed_hits, out->io_routed_misses = k.routed_misses;
  }
}

/* What el_context_new maps for the KV cache and the arena (the memory budget counts one context). */
uint64_t el_context_footprint(const el_model* m) {
  return m->kv_offset[2 * (size_t)m->h.n_layers] + m->h.arena_bytes;
}

EL_API void el_reset_stats(el_context* c) {
  if (!c) return;
  pthread_mutex_lock(&c->mu);
  uint64_t kv = c->stats.kv_bytes, arena = c->stats.arena_bytes;
  memset(&c->stats, 0, sizeof c->stats);
  c->stats.kv_bytes = kv, c->stats.arena_bytes = arena;
  pthread_mutex_unlock(&c->mu);
}
