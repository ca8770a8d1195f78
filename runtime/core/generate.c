/* The generation loop: the one place that turns a prompt into tokens and text, for every front end (Python,
 * edgellm-run, JNI, the server). Step by step (el_generate_start / el_generate_next) so that a front end can stream
 * without threads or callbacks; el_generate is the same loop with a callback.
 *
 *   start: check the parameters, prefill the prompt (from an empty context unless keep_context), keep the logits
 *   next:  decode the previous token (if any), sample, apply the stop rules (EOS, stop ids, max tokens, full
 *          context), append the token's text and hand out what is safe to show: the text up to any stop string,
 *          holding back a tail that could still become one and an unfinished UTF-8 character.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "el_internal.h"

#define MAX_STOPS 64
#define MAX_STOP_BYTES 1024

static uint64_t random_seed(void) {
  uint64_t s = 0;
  int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
  if (fd >= 0) {
    if (read(fd, &s, sizeof s) != (ssize_t)sizeof s) s = 0;
    close(fd);
  }
  if (!s) {
    struct timespec t;
    clock_gettime(CLOCK_REALTIME, &t);
    s = (uint64_t)t.tv_sec * 1000000007ull ^ (uint64_t)t.tv_nsec ^ ((uint64_t)getpid() << 32);
  }
  return s;
}

EL_API void el_gen_params_default(const el_model* m, el_gen_params* p) {
  if (!p) return;
  memset(p, 0, sizeof *p);
  p->max_new_tokens = 128;
  p->temperature = 0, p->top_k = 0, p->top_p = 1, p->min_p = 0;
  p->repetition_penalty = 1, p->presence_penalty = 0, p->frequency_penalty = 0;
  p->shift_sinks = 4;
  if (m) {
    const el_plan_sampling* s = &m->h.sampling;
    p->temperature = s->temperature, p->top_k = s->top_k, p->top_p = s->top_p, p->min_p = s->min_p;
    p->repetition_penalty = s->repetition_penalty;
    p->presence_penalty = s->presence_penalty, p->frequency_penalty = s->frequency_penalty;
  }
  p->seed = random_seed();
}

void el_gen_release(el_gen* g) {
  el_sampler_free(g->sampler);
  free(g->owned);
  free(g->hist);
  free(g->text);
  free(g->logits);
  free(g->spec_logits);
  free(g->draft_fed);
  free(g->draft_logits);
  free(g->draft_rows);
  free(g->rec_next);
  free(g->mask);
  free(g->dfa_masks);
  free(g->tok_at);
  free(g->tok_bytes);
  memset(g, 0, sizeof *g);
}

/* Copies the stop ids and strings into one owned block (the caller's may not outlive start). */
static int own_stops(el_gen* g, const el_gen_params* p, const el_model* m) {
  if (p->n_stop_ids < 0 || p->n_stop_ids > MAX_STOPS || (p->n_stop_ids && !p->stop_ids))
    return el_error("stop ids: give at most %d (got %d)", MAX_STOPS, p->n_stop_ids);
  if (p->n_stop_strings < 0 || p->n_stop_strings > MAX_STOPS || (p->n_stop_strings && !p->stop_strings))
    return el_error("stop strings: give at most %d (got %d)", MAX_STOPS, p->n_stop_strings);
  if (p->n_stop_strings && !m->tok)
    return el_error("stop strings need the package's tokenizer.bin, which this package does not have: stop on "
                    "token ids instead");
  size_t bytes = sizeof(int32_t) * (size_t)p->n_stop_ids + sizeof(char*) * (size_t)p->n_stop_strings + 8;
  for (int i = 0; i < p->n_stop_ids; i++)
    if (p->stop_ids[i] < 0 || (uint32_t)p->stop_ids[i] >= m->h.vocab)
      return el_error("stop id %d is outside the vocabulary [0, %u)", p->stop_ids[i], m->h.vocab);
  for (int i = 0; i < p->n_stop_strings; i++) {
    const char* s = p->stop_strings[i];
    size_t n = s ? strnlen(s, MAX_STOP_BYTES + 1) : 0;
    if (n == 0) return el_error("stop string %d is empty: a stop string needs at least one character", i);
    if (n > MAX_STOP_BYTES) return el_error("stop string %d is longer than %d bytes", i, MAX_STOP_BYTES);
    bytes += n + 1;
  }
  char* mem = malloc(bytes);
  if (!mem) return el_error("out of memory");
  free(g->owned);
  g->owned = mem;
  int32_t* ids = (int32_t*)mem;
  if (p->n_stop_ids) memcpy(ids, p->stop_ids, sizeof(int32_t) * (size_t)p->n_stop_ids);
  const char** strs = (const char**)(mem + (sizeof(int32_t) * (size_t)p->n_stop_ids + 7) / 8 * 8);
  char* at = (char*)(strs + p->n_stop_strings);
  g->max_stop = 0;
  for (int i = 0; i < p->n_stop_strings; i++) {
    size_t n = strlen(p->stop_strings[i]);
    memcpy(at, p->stop_strings[i], n + 1);
    strs[i] = at, at += n + 1;
    if (n > g->max_stop) g->max_stop = n;
  }
  g->p.stop_ids = ids;
  g->p.stop_strings = strs;
  return 0;
}

static int grow_text(el_gen* g, size_t need) {
  if (need <= g->text_cap) return 0;
  size_t cap = g->text_cap ? g->text_cap : 256;
  while (cap < need) cap *= 2;
  char* t = realloc(g->text, cap);
  if (!t) return el_error("out of memory for the generated text");
  g->text = t, g->text_cap = cap;
  return 0;
}

EL_API int el_generate_start(el_context* c, const int32_t* prompt, int n, const el_gen_params* p) {
  if (!c || !p) return el_error("el_generate_start: context or params is NULL");
  el_model* m = c->m;
  el_sampler_params sp = {p->temperature, p->top_k, p->top_p, p->min_p, p->repetition_penalty,
                          p->presence_penalty, p->frequency_penalty, p->seed};
  if (p->max_new_tokens < 0) return el_error("max_new_tokens %d is invalid: it must be >= 0", p->max_new_tokens);
  if (n <= 0 || !prompt) return el_error("empty prompt: give at least one token");
  pthread_mutex_lock(&c->mu);
  el_gen* g = &c->gen;
  int rc = -1;
  g->active = 0;
  el_sampler* s = el_sampler_new(&sp); /* checks the sampling parameters */
  if (!s || own_stops(g, p, m) != 0) {
    el_sampler_free(s);
    goto out;
  }
  el_sampler_free(g->sampler);
  g->sampler = s;
  const int32_t* stop_ids = g->p.stop_ids;
  const char* const* stop_strings = g->p.stop_strings;
  g->p = *p;
  g->p.stop_ids = stop_ids, g->p.stop_strings = stop_strings;
  g->mask_on = 0, g->draft_filter = NULL, g->filter_user = NULL; /* a constraint is one generation's */
  if (el_constraint_start(g, m, p->constraint) != 0) goto out;
  if (p->constraint) g->draft_filter = el_constraint_drafts, g->filter_user = g;
  int max = (int)m->h.max_ctx;
  int cached = p->n_cached;
  int start = p->keep_context ? c->pos - cached : 0; /* where the prompt's first id sits */
  if (cached < 0 || cached >= n || (cached && !p->keep_context) || start < 0) {
    el_error("n_cached %d is invalid: it must be in [0, %d) and at most the %d tokens the context holds, with "
             "keep_context", cached, n, p->keep_context ? c->pos : 0);
    goto out;
  }
  if (n > max - start) {
    el_error("prompt of %d tokens does not fit: the context holds %d of %d tokens; shorten the prompt%s", n, start,
             max, start ? " or start a new conversation" : " or recompile with a larger --max-context");
    goto out;
  }
  int room = max - start - n + 1; /* tokens that can still be generated */
  int cap = n + (p->max_new_tokens < room ? p->max_new_tokens : room) + 1;
  if (cap > g->cap_hist) {
    int32_t* h = realloc(g->hist, sizeof(int32_t) * (size_t)cap);
    if (!h) {
      el_error("out of memory");
      goto out;
    }
    g->hist = h, g->cap_hist = cap;
  }
  if (!g->logits && !(g->logits = malloc(sizeof(float) * m->h.vocab))) {
    el_error("out of memory");
    goto out;
  }
  if (p->speculate < EL_SPECULATE_OFF || p->speculate > EL_SPECULATE_RECYCLE || p->draft_max < 0) {
    el_error("speculate %d / draft_max %d is invalid: speculate is 0 (off), 1 (auto), 2 (ngram) or 3 (recycle), "
             "draft_max >= 0", p->speculate, p->draft_max);
    goto out;
  }
  if (p->context_shift < 0 || p->context_shift > 1 || p->shift_sinks < 0 || p->shift_tokens < 0 ||
      (p->context_shift && p->shift_sinks + 2 > max)) {
    el_error("context_shift %d / shift_sinks %d / shift_tokens %d is invalid: context_shift is 0 or 1, the sinks "
             "leave room for at least 2 tokens of this %d-token context, the tokens dropped per shift >= 0",
             p->context_shift, p->shift_sinks, p->shift_tokens, max);
    goto out;
  }
  int width = el_verify_tokens(m);
  if (p->speculate >= EL_SPECULATE_NGRAM && width < 2) { /* auto: plain decoding there */
    el_error("this package has no verify program, which speculative decoding runs: recompile it with this edgellm, "
             "or generate without speculation");
    goto out;
  }
  if (p->draft && el_spec_draft_start(c, g, p->draft, cap) != 0) goto out;
  if (p->speculate && width >= 2 && !g->spec_logits &&
      !(g->spec_logits = malloc(sizeof(float) * m->h.vocab * (size_t)el_spec_rows(m)))) {
    el_error("out of memory");
    goto out;
  }
  memcpy(g->hist, prompt, sizeof(int32_t) * (size_t)n);
  g->n_hist = g->n_prompt = n;
  g->n_gen = g->pending = g->n_decoded = 0;
  g->spec_n = g->spec_at = g->spec_taken = g->spec_wait = g->spec_backoff = g->spec_shadow = 0;
  g->mask_on = 0;
  g->recycling = width >= 2 && (p->speculate == EL_SPECULATE_RECYCLE ||
                                (p->speculate == EL_SPECULATE_AUTO && el_spec_trees(m)));
  g->pooling = width >= 2 && p->speculate != EL_SPECULATE_OFF; /* it adds to the model's n-gram pool */
  if (g->pooling) el_pool_add(m, g->hist, n, 1);
  memset(g->src_offered, 0, sizeof g->src_offered), memset(g->src_taken, 0, sizeof g->src_taken);
  memset(g->src_q, 0, sizeof g->src_q);
  memset(g->chain_offered, 0, sizeof g->chain_offered), memset(g->chain_taken, 0, sizeof g->chain_taken);
  g->chain_run = 0;
  g->stage_offered = g->stage_taken = 0;
  g->draft_passes = g->draft_wait = g->draft_backoff = 0;
  g->spec_ungated = el_env_flag("EDGELLM_SPEC_UNGATED");
  g->finish = EL_FINISH_NONE;
  g->text_len = g->emitted = 0;
  g->decode_s = g->ttft_s = 0;
  g->t_start = el_now();
  if (el_set_pos(c, start + cached) != 0) goto out;
  if (el_prefill_locked(c, prompt + cached, n - cached, g->logits, 0) != 0) goto out;
  el_spec_observe(g, prompt[n - 1], g->logits, (int)m->h.vocab);
  g->prefill_s = el_now() - g->t_start;
  if (p->max_new_tokens == 0) g->finish = EL_FINISH_LENGTH;
  g->active = 1;
  rc = 0;
out:
  pthread_mutex_unlock(&c->mu);
  return rc;
}

static int is_stop_id(const el_gen* g, const el_model* m, int32_t t, int* finish) {
  if (!g->p.ignore_eos)
    for (int i = 0; i < m->h.n_eos; i++)
      if (m->h.eos_ids[i] == t) return *finish = EL_FINISH_EOS, 1;
  for (int i = 0; i < g->p.n_stop_ids; i++)
    if (g->p.stop_ids[i] == t) return *finish = EL_FINISH_STOP, 1;
  return 0;
}

/* Length of an unfinished UTF-8 character at the end of s[0..n) (0 if the text ends on a boundary or on bytes that
 * can never become valid: those are shown as they are). */
static size_t utf8_open_tail(const char* s, size_t n) {
  for (size_t k = 1; k <= 3 && k <= n; k++) {
    unsigned char b = (unsigned char)s[n - k];
    if ((b & 0xC0) == 0x80) continue; /* continuation byte: look further back */
    size_t need = (b & 0xE0) == 0xC0 ? 2 : (b & 0xF0) == 0xE0 ? 3 : (b & 0xF8) == 0xF0 ? 4 : 1;
    return need > k ? k : 0;
  }
  return 0;
}

/* Appends token t's text; returns 1 if a stop string now appears (the text is cut where it starts). */
static int append_text(el_gen* g, const el_model* m, int32_t t) {
  if (!m->tok) return 0;
  size_t before = g->text_len;
  for (;;) {
    if (grow_text(g, g->text_len + 64) != 0) return -1;
    int room = (int)(g->text_cap - g->text_len > 0x40000000 ? 0x40000000 : g->text_cap - g->text_len);
    int k = el_token_text(m, t, g->text + g->text_len, room);
    if (k < 0) return -1;
    if (k < room) {
      g->text_len += (size_t)k;
      break;
    }
    if (grow_text(g, g->text_len + (size_t)k + 1) != 0) return -1;
  }
  /* a stop string can only end inside the new bytes: search from max_stop - 1 bytes before them */
  size_t from = before > g->max_stop ? before - g->max_stop + 1 : 0, cut = (size_t)-1;
  for (int i = 0; i < g->p.n_stop_strings; i++) {
    const char* s = g->p.stop_strings[i];
    const char* hit = memmem(g->text + from, g->text_len - from, s, strlen(s));
    if (hit && (size_t)(hit - g->text) < cut) cut = (size_t)(hit - g->text);
  }
  if (cut != (size_t)-1) {
    g->text_len = cut;
    return 1;
  }
  return 0;
}

/* How far the text may be shown: not a tail that could still grow into a stop string, nor half a character. */
static size_t safe_end(const el_gen* g) {
  size_t safe = g->text_len;
  for (int i = 0; i < g->p.n_stop_strings; i++) {
    const char* s = g->p.stop_strings[i];
    size_t n = strlen(s);
    for (size_t k = n - 1 < g->text_len ? n - 1 : g->text_len; k > 0; k--)
      if (memcmp(g->text + g->text_len - k, s, k) == 0) {
        if (g->text_len - k < safe) safe = g->text_len - k;
        break;
      }
  }
  size_t open = utf8_open_tail(g->text, safe);
  return safe - open < g->emitted ? g->emitted : safe - open;
}

static void emit(el_gen* g, el_event* ev, size_t upto) {
  ev->text = g->text ? g->text + g->emitted : "";
  ev->text_len = (int32_t)(upto - g->emitted);
  g->emitted = upto;
}

/* A constraint's mask (el_generate_constrain) on the next draw: tokens it does not allow get -inf logits, so every
 * sampler setting sees only allowed ones. One draw only. */
static int apply_mask(el_gen* g, int vocab) {
  g->mask_on = 0;
  int any = 0;
  for (int i = 0; i < vocab; i++) {
    if (g->mask[i >> 5] >> (i & 31) & 1u)
      any = 1;
    else
      g->logits[i] = -INFINITY;
  }
  return any ? 0 : el_error("the output constraint allows no token here");
}

EL_API int el_generate_constrain(el_context* c, const uint32_t* allowed, int n_words) {
  if (!c || !allowed) return el_error("el_generate_constrain: context or mask is NULL");
  pthread_mutex_lock(&c->mu);
  el_gen* g = &c->gen;
  int words = (int)((c->m->h.vocab + 31) / 32), rc = 0;
  if (g->dfa) {
    rc = el_error("el_generate_constrain: this generation has a constraint automaton (el_gen_params.constraint), "
                  "which takes no other mask");
  } else if (n_words < words) {
    rc = el_error("el_generate_constrain: %d mask words; this vocabulary of %u tokens needs %d", n_words,
                  c->m->h.vocab, words);
  } else if (!g->mask && !(g->mask = malloc(sizeof(uint32_t) * (size_t)words))) {
    rc = el_error("out of memory");
  } else {
    memcpy(g->mask, allowed, sizeof(uint32_t) * (size_t)words);
    g->mask_on = 1;
  }
  pthread_mutex_unlock(&c->mu);
  return rc;
}

EL_API int el_generate_filter_drafts(el_context* c, el_draft_filter filter, void* user) {
  if (!c) return el_error("el_generate_filter_drafts: context is NULL");
  pthread_mutex_lock(&c->mu);
  int rc = 0;
  if (c->gen.dfa)
    rc = el_error("el_generate_filter_drafts: this generation's constraint automaton checks its drafts");
  else
    c->gen.draft_filter = filter, c->gen.filter_user = user;
  pthread_mutex_unlock(&c->mu);
  return rc;
}

/* The pass's drafts the constraint allows (a parent precedes its children), compacted in place; the count. */
static int filter_drafts(el_gen* g, int k) {
  int32_t parent[EL_MAX_DRAFT], where[EL_MAX_DRAFT + 1]; /* where: old node -> new node, -1 dropped */
  uint8_t keep[EL_MAX_DRAFT];
  for (int i = 0; i < k; i++) parent[i] = g->spec_parent[i + 1], keep[i] = 0;
  if (g->draft_filter(g->filter_user, g->spec_draft, parent, k, keep) != 0) return k;
  int n = 0;
  where[0] = 0;
  for (int i = 0; i < k; i++) {
    int p = where[parent[i]];
    where[i + 1] = -1;
    if (!keep[i] || p < 0) continue;
    g->spec_draft[n] = g->spec_draft[i], g->spec_parent[n + 1] = p, g->spec_src[n + 1] = g->spec_src[i + 1];
    g->spec_q[n + 1] = g->spec_q[i + 1];
    where[i + 1] = ++n;
  }
  return n;
}

/* The context is full: keep its first S tokens (attention sinks: the rows every later token attends to most,
 * StreamingLLM) and its newest ones, drop the D after the sinks, and run the kept newest ones again from position S,
 * so that their keys carry the rotation of their new positions. Run again rather than rotated in place: one path
 * for every position encoding the compiler knows (RoPE variants, partial rotary, NoPE layers), at prefill speed; a
 * conversation that outgrows its context pays one prefill of what it keeps per shift. The sinks' rows stay where
 * they are (they attend only to each other); where window caches no longer hold position S, they run again too. */
static int shift_context(el_context* c, el_gen* g) {
  int max = (int)c->m->h.max_ctx, S = g->p.shift_sinks, D = g->p.shift_tokens;
  if (D <= 0) D = (c->pos - S) / 2;
  if (D > c->pos - S - 1) D = c->pos - S - 1; /* at least one newest token stays */
  if (D < 1) return el_error("context shift: %d sinks leave nothing to drop in a %d-token context", S, max);
  int n_keep = c->pos - S - D, from = S;
  int32_t* run = malloc(sizeof(int32_t) * (size_t)(S + n_keep));
  if (!run) return el_error("out of memory");
  memcpy(run, c->ids, sizeof(int32_t) * (size_t)S);
  memcpy(run + S, c->ids + S + D, sizeof(int32_t) * (size_t)n_keep);
  if (S == 0 || el_set_pos(c, S) != 0) from = 0, el_set_pos(c, 0);
  int rc = el_prefill_locked(c, run + from, S + n_keep - from, NULL, 0);
  free(run);
  if (rc != 0) return -1;
  c->stats.context_shifts++;
  c->stats.shift_tokens_run += (uint64_t)(S + n_keep - from);
  return 0;
}

EL_API int el_generate_next(el_context* c, el_event* ev) {
  if (!c || !ev) return el_error("el_generate_next: context or event is NULL");
  memset(ev, 0, sizeof *ev);
  ev->token = -1;
  ev->text = "";
  pthread_mutex_lock(&c->mu);
  el_model* m = c->m;
  el_gen* g = &c->gen;
  int rc = -1;
  if (!g->active) {
    el_error("no generation in progress on this context: call el_generate_start first");
    goto out;
  }
  if (g->finish) { /* ended earlier (max_new_tokens 0, a reset) or asked again after the last event */
    ev->finish = g->finish;
    emit(g, ev, g->text_len);
    rc = 0;
    goto out;
  }
  if (g->pending) { /* the previous token goes into the context: its logits are this draw's */
    double t0 = el_now();
    int32_t last = g->hist[g->n_hist - 1];
    size_t row = sizeof(float) * m->h.vocab;
    int child = g->spec_n ? el_spec_child(g, last) : 0;
    if (child) {
      /* the draw took a draft following the last one: its cache row and logits came with the verify pass */
      if (el_verify_accept(c, child) != 0) goto out;
      g->spec_at = child, g->spec_taken++;
      el_spec_count(&c->stats, g, child);
      memcpy(g->logits, g->spec_logits + (size_t)child * m->h.vocab, row);
    } else {
      if (g->spec_n) el_spec_settle(g, g->spec_taken);
      g->spec_n = g->spec_at = g->spec_taken = 0;
      if (c->pos >= (int)m->h.max_ctx && shift_context(c, g) != 0) goto out; /* only with context_shift */
      int k = el_spec_draft(c, g);
      if (k > 0 && g->draft_filter) k = filter_drafts(g, k);
      double t1 = el_now(); /* the pass's own time, without drafting's, is what auto weighs a pass at */
      if (k > 0) {
        int32_t ids[EL_MAX_DRAFT + 1];
        ids[0] = last;
        memcpy(ids + 1, g->spec_draft, sizeof(int32_t) * (size_t)k);
        g->spec_parent[0] = -1;
        if (el_verify_locked(c, ids, g->spec_parent, k + 1, g->spec_logits) != 0) goto out;
        g->spec_t_pass = el_now() - t0; /* drafting included: what a draft model's pass costs */
        el_spec_timed(m, g, k + 1, el_now() - t1);
        g->spec_n = k;
        el_spec_count(&c->stats, g, 0);
        memcpy(g->logits, g->spec_logits, row);
        for (int i = 0; i <= k; i++) el_spec_observe(g, ids[i], g->spec_logits + (size_t)i * m->h.vocab, (int)m->h.vocab);
      } else {
        if (el_decode_locked(c, last, g->logits) != 0) goto out;
        el_spec_time(&g->spec_t_decode, el_now() - t0);
        el_spec_observe(g, last, g->logits, (int)m->h.vocab);
      }
    }
    g->decode_s += el_now() - t0;
    g->n_decoded++;
    g->pending = 0;
  }
  if (g->dfa) { /* the automaton's mask; a complete text that nothing may follow ends here */
    int done = el_constraint_mask(g, m);
    if (done < 0) goto out;
    if (done) {
      g->finish = ev->finish = EL_FINISH_STOP;
      emit(g, ev, g->text_len);
      rc = 0;
      goto out;
    }
  }
  if (g->mask_on && apply_mask(g, (int)m->h.vocab) != 0) goto out;
  int32_t t = el_sample(g->sampler, g->logits, (int)m->h.vocab, g->hist, g->n_hist, g->n_prompt);
  if (t < 0) goto out;
  if (g->spec_shadow) el_spec_shadow(g, t);
  if (g->n_gen == 0) g->ttft_s = el_now() - g->t_start;
  ev->token = t;
  ev->logits = g->logits;
  int finish = EL_FINISH_NONE;
  if (is_stop_id(g, m, t, &finish)) { /* not part of the output */
    g->finish = ev->finish = finish;
    emit(g, ev, g->text_len);
    rc = 0;
    goto out;
  }
  if (g->n_hist == g->cap_hist) { /* past the context's end (context_shift): the history grows */
    int32_t* h = realloc(g->hist, sizeof(int32_t) * (size_t)g->cap_hist * 2);
    if (!h) {
      el_error("out of memory");
      goto out;
    }
    g->hist = h, g->cap_hist *= 2;
  }
  g->hist[g->n_hist++] = t;
  g->n_gen++;
  if (g->pooling) el_pool_add(m, g->hist, g->n_hist, 0);
  el_constraint_advance(g, t);
  int stopped = append_text(g, m, t);
  if (stopped < 0) goto out;
  if (stopped)
    finish = EL_FINISH_STOP;
  else if (g->n_gen >= g->p.max_new_tokens)
    finish = EL_FINISH_LENGTH;
  else if (c->pos >= (int)m->h.max_ctx && !g->p.context_shift)
    finish = EL_FINISH_CONTEXT;
  else
    g->pending = 1;
  g->finish = ev->finish = finish;
  emit(g, ev, finish ? g->text_len : safe_end(g));
  rc = 1;
out:
  pthread_mutex_unlock(&c->mu);
  return rc;
}

EL_API void el_generate_result(const el_context* c, el_gen_result* out) {
  if (!out) return;
  memset(out, 0, sizeof *out);
  if (!c) return;
  el_context* w = (el_context*)c;
  pthread_mutex_lock(&w->mu);
  const el_gen* g = &c->gen;
  out->prompt_tokens = g->n_prompt;
  out->generated_tokens = g->n_gen;
  out->finish = g->finish;
  out->prefill_seconds = g->prefill_s;
  out->decode_seconds = g->decode_s;
  out->ttft_seconds = g->ttft_s;
  out->decoded_tokens = g->n_decoded;
  pthread_mutex_unlock(&w->mu);
}

EL_API int el_generate(el_context* c, const int32_t* prompt, int n, const el_gen_params* p, el_on_event on_event,
                       void* user, el_gen_result* out) {
  if (el_generate_start(c, prompt, n, p) != 0) return -1;
  for (;;) {
    el_event ev;
    int r = el_generate_next(c, &ev);
    if (r < 0) return -1;
    if (on_event && on_event(user, &ev) && !ev.finish) {
      pthread_mutex_lock(&c->mu);
      c->gen.finish = EL_FINISH_CANCELLED;
      pthread_mutex_unlock(&c->mu);
      break;
    }
    if (r == 0 || ev.finish) break;
  }
  el_generate_result(c, out);
  return 0;
}
