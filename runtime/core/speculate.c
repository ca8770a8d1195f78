/* Speculative decoding's drafts and their controller (issue 36; the loop that verifies them is generate.c's).
 *
 * A draft is a guess at the next tokens. The verify program runs the token just sampled and the drafts after it in
 * one pass over the weights and returns each one's logits; then the sampler draws from those rows in order, exactly
 * as plain decoding would draw (same logits, same history, same random numbers), and each draw that equals the next
 * draft takes that draft's row without a pass of its own. A draft of one token per position (a point mass) makes
 * this exact for any sampler: drawing t ~ p and keeping the draft iff t equals it is the target distribution. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "el_internal.h"

/* auto asks for a longer match than ngram: in free text, two-token matches are mostly coincidences, and a refused
 * pass costs what a pass costs */
enum { NGRAM_MAX = 4, NGRAM_MIN = 2, NGRAM_MIN_AUTO = 3, BACKOFF_MAX = 32 };
/* A pass that cost at most this share of a step more than its tokens is no miss: a pass that reads its weights once
 * from storage (under a memory budget) costs about a step with any drafts, and waiting would forgo free drafts. */
#define PASS_SLACK 0.15
/* auto runs a pass only where its expected tokens beat its cost in steps by this factor: the rates behind the
 * expectation are estimates from few samples, and a pass expected to yield 1.3 tokens for 1.2 steps gains little
 * where it is right and loses as much where it is wrong (free text, SmolLM2: recycled drafts rated 0.2-0.3, and 9
 * of 129 taken in the passes three runs made on them). Copy-like text expects several tokens a pass and never meets
 * this bound. */
#define PAY_MARGIN 1.1f

static void model_miss(el_gen* g);
static int pass_cost(const el_gen* g);
static float cost_at(const el_model* m, const el_gen* g, int tokens);
static float cost_low(const el_model* m, const el_gen* g, int tokens);
static void seed_costs(el_model* m, el_gen* g);

/* Prompt lookup: the latest earlier place where the history's last n ids occur (n from NGRAM_MAX down to min_n),
 * and up to max ids that followed them there. Text that quotes its prompt (code edits, extraction, reformatting)
 * repeats long runs of it. A place whose continuation runs into the end of the history (a match a period back in a
 * reply that repeats itself) yields fewer than max ids: then the latest place that yields most (the demo model answers
 * "abab..." with one id over and over, which the latest match drafted one id a pass). */
static int ngram_draft(const int32_t* h, int n_hist, int min_n, int max, int32_t* out) {
  for (int n = NGRAM_MAX; n >= min_n; n--) {
    if (n_hist <= n) continue;
    const int32_t* tail = h + n_hist - n;
    int best = -1, len = 0;
    for (int i = n_hist - n - 1; i >= 0 && len < max; i--) {
      if (h[i] != tail[0] || memcmp(h + i, tail, sizeof(int32_t) * (size_t)n) != 0) continue;
      int k = n_hist - (i + n) < max ? n_hist - (i + n) : max;
      if (k > len) best = i, len = k;
    }
    if (best >= 0) {
      memcpy(out, h + best + n, sizeof(int32_t) * (size_t)len);
      return len;
    }
  }
  return 0;
}

/* Where a draft came from: its own acceptance rate ranks it when a tree is built (el_gen.src_*). The draft model's
 * guesses (SRC_MODEL) and its second and third choices where it was unsure (SRC_BRANCH) are ranked by its own
 * probabilities instead, scaled by how often its drafts of that kind were taken against how often it expected. */
/* SRC_POOL: the n-gram pool's (ngram_pool.c), what followed the same 3 ids in another context, or earlier here. */
enum { SRC_NGRAM = 0, SRC_MODEL = 1, SRC_BRANCH = 2, SRC_POOL = 3, SRC_RANK0 = 4, REC_K = 4, N_SRC = SRC_RANK0 + REC_K };
/* what each source's drafts are taken at before any is measured, as if seen PRIOR_N times */
static const float PRIOR[N_SRC] = {0.6f, 0.5f, 0.2f, 0.4f, 0.5f, 0.15f, 0.07f, 0.04f};
#define PRIOR_N 4.0f

static float src_rate(const el_gen* g, int src) {
  return (g->src_taken[src] + PRIOR[src] * PRIOR_N) / (g->src_offered[src] + PRIOR_N);
}

/* The chance the n-gram chain's draft at place i (0: the first) is taken where its parent was: the first draft after
 * a match at its own rate, the later ones at one shared rate (a copy that has started runs on at about the same odds
 * per token, so the places pool their counts: a rate per place took a dozen passes to learn, and sized chains short
 * while the copy ran: SmolLM2 editing a function ran passes of 5, 4, 3, 2, 3, 3 drafts that were all taken), each
 * apart while a copy runs (the last pass took its whole chain; prior PRIOR_RUN) or not (prior: the source's rate). */
#define PRIOR_RUN 0.9f
static float chain_rate(const el_gen* g, int i) {
  const int r = g->chain_run, at = i > 0;
  float prior = r ? PRIOR_RUN : src_rate(g, SRC_NGRAM);
  return (g->chain_taken[r][at] + prior * PRIOR_N) / (g->chain_offered[r][at] + PRIOR_N);
}

/* A chain's draft at place i: the n-gram chain's by its place, another source's by the source. */
static float place_rate(const el_gen* g, int src, int i) { return src == SRC_NGRAM ? chain_rate(g, i) : src_rate(g, src); }

/* The chance a draft the model gave probability q is taken: q, times the measured ratio of its taken drafts of that
 * source to their summed probabilities (a small model's probabilities are not the target's). */
static float model_rate(const el_gen* g, int src, float q) {
  float r = q * (g->src_taken[src] + PRIOR_N) / (g->src_q[src] + PRIOR_N);
  return r < 0.98f ? r : 0.98f;
}

/* Token recycling ---------------------------------------------------------------------------------------------
 * Every logits row the model computes (a decode step's, each row of a verify pass, refused drafts' included) names
 * the likeliest tokens after the token it ran; the REC_K best are kept per token and replace what was kept (recent
 * text predicts the next text best). Drafts walk this table from the sampled token as a tree: a token's candidates
 * are its children. Memory: vocab x REC_K ids (0.8 MB for a 49k vocabulary), kept for the context's life. */
typedef float vec4 __attribute__((vector_size(16)));
typedef int32_t vec4i __attribute__((vector_size(16)));

/* x into the REC_K best so far (v descending, best their ids) */
static inline void keep_best(float x, int i, float* v, int32_t* best) {
  int r = REC_K - 1;
  while (r > 0 && x > v[r - 1]) v[r] = v[r - 1], best[r] = best[r - 1], r--;
  v[r] = x, best[r] = i;
}

static inline vec4 load4(const float* p) {
  vec4 v;
  memcpy(&v, p, sizeof v);
  return v;
}

/* Whether any of n (a multiple of 4) logits from l is above t: the OR of their compares, one lane test at the end
 * (NaN compares false, as in the scalar test) */
static inline int any_above(const float* l, int n, float t) {
  vec4 tv = {t, t, t, t};
  vec4i g = load4(l) > tv;
  for (int j = 4; j < n; j += 4) g |= load4(l + j) > tv;
  g |= __builtin_shufflevector(g, g, 2, 3, 0, 1);
  g |= __builtin_shufflevector(g, g, 1, 0, 3, 2);
  return g[0] != 0;
}

void el_spec_observe(el_gen* g, int32_t id, const float* l, int vocab) {
  if (!g->recycling || id < 0 || id >= vocab) return;
  if (!g->rec_next) {
    if (!(g->rec_next = malloc(sizeof(int32_t) * REC_K * (size_t)vocab))) return; /* drafts are optional */
    memset(g->rec_next, 0xff, sizeof(int32_t) * REC_K * (size_t)vocab);
  }
  int32_t best[REC_K];
  float v[REC_K];
  for (int r = 0; r < REC_K; r++) best[r] = -1, v[r] = -INFINITY;
  /* blocks of 64 that hold nothing above the 4th best are skipped with vector compares (GCC/Clang vectors: SSE on
   * x86, NEON on ARM), and within the others blocks of 16: every plain step of auto pays this scan, which matters
   * where a step takes tens of microseconds (demo-moe: 50 us a step, 4k logits) */
  int i = 0;
  for (; i + 64 <= vocab; i += 64) {
    if (!any_above(l + i, 64, v[REC_K - 1])) continue;
    for (int b = i; b < i + 64; b += 16) {
      if (!any_above(l + b, 16, v[REC_K - 1])) continue;
      for (int j = b; j < b + 16; j++)
        if (l[j] > v[REC_K - 1]) keep_best(l[j], j, v, best);
    }
  }
  for (; i < vocab; i++)
    if (l[i] > v[REC_K - 1]) keep_best(l[i], i, v, best);
  memcpy(g->rec_next + (size_t)id * REC_K, best, sizeof best);
}

/* A chain of drafts continuing the root (the n-gram match's or the draft model's guesses), from one source. The draft
 * model's also carry its probability of each guess (q) and, per place in the chain (0: after the root; n: after the
 * last guess, where it stopped being sure), up to ALT_K other ids it found likely there, with their probabilities. */
enum { ALT_K = 3 };
typedef struct {
  const int32_t* tok;
  int n, src;
  const float* q;                 /* NULL: the source's measured rate for each */
  const int32_t (*alt)[ALT_K];    /* NULL: none; else [n + 1][ALT_K], -1 past the last */
  const float (*alt_q)[ALT_K];
} chain_guide;

/* A draft tree of up to max nodes after root (the sampled token): nodes are added best first by the chance that the
 * samples reach them (the product of their estimated chances along the path), drawn from a chain (continuing the
 * root), the draft model's alternatives to it (branches where it was unsure) and the recycling table. chain_only:
 * each node is the best child of the last (a package whose verify program takes no trees). Returns the drafts, in
 * spec_draft / spec_parent / spec_src / spec_q; cum[j] is the drafts the samples are expected to take among the first
 * j (the sum of those chances): every prefix of the nodes is a tree, the likeliest of its size. */
typedef struct {
  int32_t tok;
  int parent, src, chain_i; /* chain_i: its index in the chain (-1: off it) */
  float p, q;               /* p: the chance the samples reach it; q: the draft model's probability (-1: none) */
} tree_cand;

static int tree_draft(el_gen* g, int32_t root, const chain_guide* ch, int max, int chain_only, float* cum) {
  tree_cand fr[(EL_MAX_DRAFT + 1) * (REC_K + ALT_K + 1)];
  int32_t tok[EL_MAX_DRAFT + 1];
  int chain_at[EL_MAX_DRAFT + 1]; /* a node's index in the chain (-1: off it) */
  int n = 1, nf = 0;
  tok[0] = root, chain_at[0] = -1, cum[0] = 0;
  float pn[EL_MAX_DRAFT + 1];
  pn[0] = 1;
  g->spec_q[0] = -1;
  int u = 0; /* the node whose children join the frontier */
  while (n <= max) {
    /* the children of u: the chain's next id and the model's alternatives there, then the recycled candidates not
     * among them */
    int ci = chain_at[u] + 1, on_chain = u == 0 || chain_at[u] >= 0, first = nf;
    if (chain_only) nf = first = 0;
    if (on_chain && ci < ch->n) {
      float q = ch->q ? ch->q[ci] : -1;
      fr[nf++] = (tree_cand){ch->tok[ci], u, ch->src, ci,
                             pn[u] * (ch->q ? model_rate(g, ch->src, q) : place_rate(g, ch->src, ci)), q};
    }
    for (int a = 0; on_chain && ch->alt && ci <= ch->n && a < ALT_K && ch->alt[ci][a] >= 0; a++) {
      float q = ch->alt_q[ci][a];
      fr[nf++] = (tree_cand){ch->alt[ci][a], u, SRC_BRANCH, -1, pn[u] * model_rate(g, SRC_BRANCH, q), q};
    }
    int ours = nf;
    const int32_t* next = g->rec_next ? g->rec_next + (size_t)tok[u] * REC_K : NULL;
    for (int r = 0; next && r < REC_K && next[r] >= 0; r++) {
      int dup = 0;
      for (int i = first; i < ours; i++) dup |= fr[i].tok == next[r];
      if (!dup) fr[nf++] = (tree_cand){next[r], u, SRC_RANK0 + r, -1, pn[u] * src_rate(g, SRC_RANK0 + r), -1};
    }
    if (nf == 0) break;
    int b = 0;
    for (int i = 1; i < nf; i++)
      if (fr[i].p > fr[b].p) b = i;
    tok[n] = fr[b].tok, pn[n] = fr[b].p, chain_at[n] = fr[b].chain_i;
    cum[n] = cum[n - 1] + fr[b].p;
    g->spec_draft[n - 1] = fr[b].tok, g->spec_parent[n] = fr[b].parent, g->spec_src[n] = (uint8_t)fr[b].src;
    g->spec_q[n] = fr[b].q, g->spec_chain_i[n] = (int8_t)fr[b].chain_i;
    fr[b] = fr[--nf];
    u = n++;
  }
  return n - 1;
}

/* The sample drawn at node `at` of drafts 1..n: the child it takes (0: none), every child counted as offered to its
 * source and the one taken as taken (rates decay: halved past 512 offers). */
static int rate_children(el_gen* g, int at, int n, int32_t sampled) {
  int found = 0;
  for (int i = at + 1; i <= n; i++) {
    if (g->spec_parent[i] != at) continue;
    int src = g->spec_src[i], ci = src == SRC_NGRAM ? g->spec_chain_i[i] : -1, taken = g->spec_draft[i - 1] == sampled;
    if (++g->src_offered[src] > 512) g->src_offered[src] /= 2, g->src_taken[src] /= 2, g->src_q[src] /= 2;
    if (g->spec_q[i] >= 0) g->src_q[src] += g->spec_q[i];
    if (taken) g->src_taken[src] += 1, found = i;
    float *off = g->chain_offered[g->chain_run], *tk = g->chain_taken[g->chain_run];
    int at = ci > 0; /* chain_rate's: the first draft, or a later one */
    if (ci >= 0 && ++off[at] > 512) off[at] /= 2, tk[at] /= 2;
    if (ci >= 0) tk[at] += (float)taken;
  }
  return found;
}

void el_spec_count(el_stats* st, const el_gen* g, int node) {
  for (int i = node ? node : 1; i <= (node ? node : g->spec_n); i++) {
    int src = g->spec_src[i];
    if (src != SRC_MODEL && src != SRC_BRANCH) continue;
    if (!node) st->spec_drafted_model++;
    if (node) st->spec_accepted_model++, st->spec_accepted_branch += src == SRC_BRANCH;
  }
}

int el_spec_child(el_gen* g, int32_t sampled) { return rate_children(g, g->spec_at, g->spec_n, sampled); }

/* Drafts that auto built and did not verify are rated by the sample all the same (their first level: the later
 * ones would need the pass), so that a source's rate follows the text while no pass runs: passes resume when it
 * starts repeating itself, at no cost but the drafting. */
void el_spec_shadow(el_gen* g, int32_t sampled) {
  rate_children(g, 0, g->spec_shadow, sampled);
  g->spec_shadow = 0;
}

/* Draft model ------------------------------------------------------------------------------------------------------
 * A smaller model with the same vocabulary guesses greedily, in its own context, which tracks the history: before
 * each draft it is rewound to what it holds in common with the history (past the guesses that were refused) and fed
 * the rest. It guesses until its own top probability falls below DRAFT_P_MIN: a pass's rows cost the same whether
 * used or not, but each guess costs a draft step, and an unsure one is mostly refused. Its tokens change nothing of
 * what is sampled (a draft is a point mass), so any model with the same vocabulary keeps decoding exact. */
#define DRAFT_P_MIN 0.4f
enum { DRAFT_FEED_MAX = 4 }; /* catch-ups of up to this many ids run as decode steps, longer ones as a prefill */

EL_API int el_draft_check(const el_model* target, const el_model* draft) {
  if (!target || !draft) return el_error("el_draft_check: a model is NULL");
  if (draft->h.vocab != target->h.vocab)
    return el_error("the draft package's vocabulary (%u tokens) is not the model's (%u): a draft model must share "
                    "its tokenizer", draft->h.vocab, target->h.vocab);
  if (!target->tok || !draft->tok) return 0; /* no texts to compare (a package without a C tokenizer): ids only */
  char a[256], b[256];
  for (uint32_t id = 0; id < target->h.vocab; id++) {
    int na = el_token_text(target, (int32_t)id, a, sizeof a), nb = el_token_text(draft, (int32_t)id, b, sizeof b);
    if (na != nb || (na > 0 && memcmp(a, b, (size_t)(na < (int)sizeof a ? na : (int)sizeof a)) != 0))
      return el_error("the draft package's tokenizer differs from the model's at token %u: a draft model must share "
                      "its tokenizer", id);
  }
  return 0;
}

int el_spec_draft_start(el_context* c, el_gen* g, el_context* d, int cap) {
  if (d == c) return el_error("the draft context is the generating context: give the draft model its own context");
  if (d->m->h.vocab != c->m->h.vocab)
    return el_error("the draft model's vocabulary (%u tokens) is not this model's (%u): a draft must share the "
                    "tokenizer", d->m->h.vocab, c->m->h.vocab);
  if (g->draft_ctx != d) { /* another context: nothing it holds is known, nor what its steps cost */
    g->draft_ctx = d, g->draft_n = 0;
    g->stage_t_decode = g->stage_t_verify = 0;
  }
  int need = cap + EL_MAX_DRAFT + 1;
  if (need > g->draft_cap) {
    int32_t* f = realloc(g->draft_fed, sizeof(int32_t) * (size_t)need);
    if (!f) return el_error("out of memory");
    g->draft_fed = f, g->draft_cap = need;
  }
  if (!g->draft_logits && !(g->draft_logits = malloc(sizeof(float) * c->m->h.vocab))) return el_error("out of memory");
  size_t rows = (size_t)el_verify_tokens(d->m) * c->m->h.vocab; /* staged drafting: its own verify pass's rows */
  if (rows > g->draft_rows_n) {
    float* r = realloc(g->draft_rows, sizeof(float) * rows);
    if (!r) return el_error("out of memory");
    g->draft_rows = r, g->draft_rows_n = rows;
  }
  g->draft_off = 0;
  return 0;
}

/* The ALT_K likeliest ids of a logits row (descending) and their probabilities. */
static void top_ids(const float* l, int n, int32_t* ids, float* p) {
  float v[ALT_K];
  for (int r = 0; r < ALT_K; r++) ids[r] = -1, v[r] = -INFINITY;
  for (int i = 0; i < n; i++) {
    if (!(l[i] > v[ALT_K - 1])) continue;
    int r = ALT_K - 1;
    while (r > 0 && l[i] > v[r - 1]) v[r] = v[r - 1], ids[r] = ids[r - 1], r--;
    v[r] = l[i], ids[r] = i;
  }
  double s = 0;
  for (int i = 0; i < n; i++) s += exp((double)(l[i] - v[0]));
  for (int r = 0; r < ALT_K; r++) p[r] = ids[r] >= 0 ? (float)(exp((double)(v[r] - v[0])) / s) : 0;
}

/* The draft model's guesses (a chain) and, at each place, the other ids it found likely (chain_guide). */
typedef struct {
  int32_t tok[EL_MAX_DRAFT];
  float q[EL_MAX_DRAFT];
  int32_t alt[EL_MAX_DRAFT + 1][ALT_K];
  float alt_q[EL_MAX_DRAFT + 1][ALT_K];
} model_guesses;

/* The logits row after place k of the guesses: its best id continues the chain where the model is sure of it, and
 * the others (all of them where it is not) are the alternatives there. Returns 1 where the chain goes on. */
static int guess_at(const float* l, int vocab, int k, model_guesses* out) {
  int32_t ids[ALT_K];
  float p[ALT_K];
  top_ids(l, vocab, ids, p);
  int sure = p[0] >= DRAFT_P_MIN, a = 0;
  for (int r = sure; r < ALT_K; r++) out->alt[k][a] = ids[r], out->alt_q[k][a++] = p[r];
  for (; a < ALT_K; a++) out->alt[k][a] = -1;
  if (sure) out->tok[k] = ids[0], out->q[k] = p[0];
  return sure;
}

/* Staged drafting: the draft model's own drafts are the n-grams of what it holds (the history and its guesses so
 * far) after `next`, the guess it is about to run; run with them in one pass of its verify program, its guesses
 * along them cost no steps of their own. Like auto's passes, one runs only where the guesses it is expected to take
 * (by the measured rate of this stage's drafts) save more of its steps than the pass costs over one (measured: the
 * first pass runs to be timed). The count (0: decode `next` alone). */
static int model_ngram(el_gen* g, int32_t next, int room, int32_t* ids) {
  el_context* d = g->draft_ctx;
  int w = el_verify_tokens(d->m) - 1, left = (int)d->m->h.max_ctx - el_pos(d) - 1;
  if (w > room) w = room;
  if (w > left) w = left;
  if (w < 1) return 0;
  g->draft_fed[g->draft_n] = next;
  int k = ngram_draft(g->draft_fed, g->draft_n + 1, NGRAM_MIN, w, ids + 1);
  float r = (g->stage_taken + 0.6f * PRIOR_N) / (g->stage_offered + PRIOR_N), p = 1, e = 0;
  for (int i = 0; i < k; i++) p *= r, e += p;
  if (k == 0 || (!g->spec_ungated && g->stage_t_verify > 0 && g->stage_t_decode > 0 &&
                 (1 + e) * g->stage_t_decode < g->stage_t_verify))
    return 0;
  ids[0] = next;
  return k;
}

/* Up to max greedy guesses of the draft model after the history, and its alternatives at each place (0 and draft_off
 * set if its context fails). Where its guesses run into n-grams of the history, it verifies them instead of stepping
 * through them (model_ngram): the guesses are the same greedy ones. */
static int model_draft(el_gen* g, int max, model_guesses* out) {
  el_context* d = g->draft_ctx;
  int n = g->n_hist, vocab = (int)d->m->h.vocab, common = 0;
  int held = el_pos(d) < g->draft_n ? el_pos(d) : g->draft_n; /* what its context still holds */
  while (common < held && common < n && g->draft_fed[common] == g->hist[common]) common++;
  if (common == n) common = n - 1; /* the last id runs again: its logits are the first guess */
  if (n >= (int)d->m->h.max_ctx || n + max >= g->draft_cap) goto fail; /* its context, or the ids it tracks, is full */
  if (el_rewind(d, common) != 0 && (common = 0, el_rewind(d, 0) != 0)) goto fail;
  g->draft_n = common;
  if (n - common <= DRAFT_FEED_MAX) {
    for (int i = common; i < n; i++)
      if (el_decode(d, g->hist[i], g->draft_logits) != 0) goto fail;
  } else if (el_prefill(d, g->hist + common, n - common, g->draft_logits, 0) != 0) {
    goto fail;
  }
  memcpy(g->draft_fed + common, g->hist + common, sizeof(int32_t) * (size_t)(n - common));
  g->draft_n = n;
  const float* row = g->draft_logits;
  int32_t ng[EL_MAX_DRAFT + 1];
  int k = 0, n_ng = 0, at = 0; /* a verify pass of the draft's: its ids ng[0..n_ng], the node its context ends on */
  while (guess_at(row, vocab, k, out)) {
    int32_t t = out->tok[k++];
    if (k == max || el_pos(d) >= (int)d->m->h.max_ctx) { /* nothing known after the last guess */
      for (int a = 0; a < ALT_K; a++) out->alt[k][a] = -1;
      break;
    }
    if (at < n_ng && ng[at + 1] == t) { /* the n-gram's next id is the guess: its row came with the pass */
      if (el_verify_take_node(d, at + 1) != 0) goto fail;
      row = g->draft_rows + (size_t)(++at) * vocab;
      g->stage_taken++;
    } else {
      double t0 = el_now();
      if (g->draft_rows && (n_ng = model_ngram(g, t, max - k - 1, ng)) > 0) {
        if (el_verify(d, ng, n_ng + 1, g->draft_rows) != 0) goto fail;
        el_spec_time(&g->stage_t_verify, el_now() - t0);
        row = g->draft_rows, at = 0;
        if ((g->stage_offered += n_ng) > 512) g->stage_offered /= 2, g->stage_taken /= 2;
      } else {
        if (el_decode(d, t, g->draft_logits) != 0) goto fail;
        el_spec_time(&g->stage_t_decode, el_now() - t0);
        row = g->draft_logits, n_ng = 0;
      }
    }
    g->draft_fed[g->draft_n++] = t;
  }
  return k;
fail:
  g->draft_off = 1, g->draft_n = 0;
  return 0;
}

/* A step's time into its running average (0: none yet). */
/* A time into its running average. A sample over twice the average counts as twice it: a step the OS preempted (2%
 * of demo-moe's 50 us steps took over twice the median) would otherwise make passes look cheap for several steps
 * and run passes that do not pay; a genuine rise still lifts the average 1.3x a sample. */
void el_spec_time(double* avg, double seconds) {
  if (*avg > 0 && seconds > 2 * *avg) seconds = 2 * *avg;
  *avg = *avg > 0 ? 0.7 * *avg + 0.3 * seconds : seconds;
}

/* Drafts spec_draft[0..k) as a chain from one source. */
static void chain_of(el_gen* g, int k, int src) {
  for (int i = 1; i <= k; i++)
    g->spec_parent[i] = i - 1, g->spec_src[i] = (uint8_t)src, g->spec_q[i] = -1, g->spec_chain_i[i] = (int8_t)(i - 1);
}

/* Whether the package's verify program takes drafts as a tree (EL_PROGRAM_TREE). */
int el_spec_trees(const el_model* m) {
  const el_program* v = &m->prog[EL_PROG_VERIFY];
  return v->present && (v->p.flags & EL_PROGRAM_TREE);
}

/* auto: how many of drafts 1..n a pass carries (0: none pays). A pass of j yields the one token it decodes anyway and
 * the drafts the samples are expected to take (cum[j]: the chances that they reach each node, by the sources'
 * measured rates) for what a pass of 1 + j tokens costs in plain steps (a program that computes only a pass's rows
 * costs less for fewer). The count that yields most per step wins where it beats plain steps. A count not timed yet
 * competes at the least it can cost (cost_low), so that the first tree it would pay for at that price runs it and
 * times it: an interpolated guess can be too dear (AVX2 GEMMs take tokens in pairs, so the curve is a staircase) and
 * would keep the count from ever running. It runs only where its tokens pay at the interpolated cost too, so that
 * trees whose drafts are mostly refused (free text; a MoE pass of several steps) do not buy timings they cannot use. */
static int best_count(const el_model* m, const el_gen* g, int n, const float* cum) {
  int best = 0;
  float gain = 1;
  for (int j = 1; j <= n; j++) {
    if (1 + cum[j] < PAY_MARGIN * cost_at(m, g, j + 1)) continue;
    float r = (1 + cum[j]) / cost_low(m, g, j + 1);
    if (r >= gain) best = j, gain = r;
  }
  return best;
}

/* What the first j of a chain of k drafts from one source are expected to have taken (cum[0..k]). */
static void chain_expect(const el_gen* g, int k, int src, float* cum) {
  float p = 1;
  cum[0] = 0;
  for (int i = 1; i <= k; i++) p *= place_rate(g, src, i - 1), cum[i] = cum[i - 1] + p;
}

/* Drafts auto will not verify: kept for the next sample to rate (el_spec_shadow). */
static int decline(el_gen* g, int n) {
  g->spec_shadow = n;
  return 0;
}

/* auto: the first of n drafts that pay for a pass (best_count), or none (declined). */
static int paying(const el_model* m, el_gen* g, int n, const float* cum) {
  int j = g->spec_ungated ? n : best_count(m, g, n, cum);
  return j ? j : decline(g, n);
}

/* How many drafts the next pass carries (0: decode plainly): spec_draft, spec_parent and spec_src. */
int el_spec_draft(el_context* c, el_gen* g) {
  el_model* m = c->m;
  int mode = g->p.speculate, width = el_verify_tokens(m) - 1;
  g->spec_shadow = 0;
  if (mode == EL_SPECULATE_OFF || width < 1) return 0;
  /* auto weighs a pass against a plain step: one runs first where none has been timed in this context */
  if (mode == EL_SPECULATE_AUTO && g->spec_t_decode <= 0) return 0;
  seed_costs(m, g);
  /* auto, after passes that did not pay: plain steps for a while; the n-gram and recycled drafts are still built (a
   * few table lookups) and declined, so that the samples rate them (el_spec_shadow) and the sources' rates follow the
   * text while no pass runs. Rated only at passes, a source's prior took a dozen wasted passes to wear off. */
  int waiting = mode == EL_SPECULATE_AUTO && g->spec_wait > 0 && !g->spec_ungated;
  if (waiting) g->spec_wait--;
  /* as many drafts as the program has rows for: its padding rows cost what real ones do */
  int max = g->p.draft_max > 0 && g->p.draft_max < width ? g->p.draft_max : width;
  if (max > EL_MAX_DRAFT) max = EL_MAX_DRAFT;
  int left = g->p.max_new_tokens - g->n_gen - 1; /* draws after the next one */
  int room = (int)m->h.max_ctx - c->pos - 1;     /* the pass runs 1 + k tokens from pos */
  if (left < max) max = left;
  if (room < max) max = room;
  /* auto: a pass that cannot pay even if every draft is taken is not run (a MoE pass costs several steps) */
  if (mode == EL_SPECULATE_AUTO && !g->spec_ungated && cost_at(m, g, max + 1) - 1 > max) max = 0;
  if (max <= 0) return 0;
  g->spec_from_model = 0;
  int32_t chain[EL_MAX_DRAFT];
  int k = ngram_draft(g->hist, g->n_hist, mode == EL_SPECULATE_AUTO ? NGRAM_MIN_AUTO : NGRAM_MIN, max, chain);
  int src = SRC_NGRAM; /* the history's own match first, else the pool's */
  if (k == 0 && (k = el_pool_draft(m, g->hist, g->n_hist, max, chain)) > 0) src = SRC_POOL;
  int automatic = mode == EL_SPECULATE_AUTO;
  /* recycle, and auto where the model keeps a table: a tree of the n-gram chain (if any) and recycled candidates; in
   * auto, only where the drafts the tree expects to be taken pay for the pass */
  float cum[EL_MAX_DRAFT + 1];
  if (g->recycling && (k > 0 || mode == EL_SPECULATE_RECYCLE || !g->p.draft || g->draft_off)) {
    chain_guide ch = {chain, k, src, NULL, NULL, NULL};
    int n = tree_draft(g, g->hist[g->n_hist - 1], &ch, max, !el_spec_trees(m), cum);
    return waiting ? decline(g, n) : automatic ? paying(m, g, n, cum) : n;
  }
  memcpy(g->spec_draft, chain, sizeof(int32_t) * (size_t)k);
  chain_of(g, k, src);
  chain_expect(g, k, src, cum);
  if (k > 0) return waiting ? decline(g, k) : automatic ? paying(m, g, k, cum) : k;
  if (waiting || !g->p.draft || g->draft_off) return 0;
  if (g->draft_wait > 0 && !g->spec_ungated) { /* the model's guesses did not pay lately: n-grams only for now */
    g->draft_wait--;
    return 0;
  }
  g->spec_from_model = 1; /* staged: the draft model where no n-gram matches */
  model_guesses guess;
  k = model_draft(g, max, &guess);
  if (g->draft_off) return 0;
  /* its guesses, its alternatives where it was unsure and recycled candidates, best first in the pass's rows */
  chain_guide ch = {guess.tok, k, SRC_MODEL, guess.q, (const int32_t(*)[ALT_K])guess.alt,
                    (const float(*)[ALT_K])guess.alt_q};
  int n = tree_draft(g, g->hist[g->n_hist - 1], &ch, max, !el_spec_trees(m), cum);
  int j = n > 0 && automatic && !g->spec_ungated ? best_count(m, g, n, cum) : n;
  if (j > 0) return j;
  model_miss(g); /* nothing worth a pass: its drafting was spent for nothing */
  return n ? decline(g, n) : 0;
}

/* Verify passes by their tokens ---------------------------------------------------------------------------------
 * A program that computes only a pass's real rows (EL_PROGRAM_ROWS) costs less for fewer tokens: each count is timed
 * on its own. Another costs its width whatever it carries. */
static int cost_slot(const el_model* m, int tokens) {
  const el_program* v = &m->prog[EL_PROG_VERIFY];
  return v->p.flags & EL_PROGRAM_ROWS ? tokens : (int)v->p.tokens;
}

static float steps_at(const el_gen* g, int slot) { return (float)(g->spec_t_verify[slot] / g->spec_t_decode); }

/* A pass's time into its count's average, and that average in steps into the model's costs, for the next context. */
void el_spec_timed(el_model* m, el_gen* g, int tokens, double seconds) {
  g->spec_m = cost_slot(m, tokens);
  el_spec_time(&g->spec_t_verify[g->spec_m], seconds);
  g->spec_own[g->spec_m] = 1;
  if (g->spec_t_decode <= 0) return;
  pthread_mutex_lock(&m->mu);
  m->spec_steps[g->spec_m] = steps_at(g, g->spec_m);
  pthread_mutex_unlock(&m->mu);
}

/* Once a context has timed a plain step: the counts it has not timed itself, at the model's costs. */
static void seed_costs(el_model* m, el_gen* g) {
  if (g->spec_seeded || g->spec_t_decode <= 0) return;
  g->spec_seeded = 1;
  pthread_mutex_lock(&m->mu);
  for (int i = 0; i < EL_MAX_DRAFT + 2; i++)
    if (g->spec_t_verify[i] <= 0 && m->spec_steps[i] > 0) g->spec_t_verify[i] = m->spec_steps[i] * g->spec_t_decode;
  pthread_mutex_unlock(&m->mu);
}

/* A pass of `tokens` in plain steps: its own count's running average, else interpolated between the nearest counts
 * timed around it (below all of them: a pass of one token costs about a step), or extended along the last two past
 * the largest; never more than a larger count's (rows only add work, and a slow outlier would otherwise keep its
 * count from ever running again); 1 until a step and a pass are timed (the first pass is how it gets timed). */
static float cost_at(const el_model* m, const el_gen* g, int tokens) {
  if (g->spec_t_decode <= 0) return 1;
  int at = cost_slot(m, tokens), w = el_verify_tokens(m), lo = 1, lo2 = 1, hi = -1;
  float r_lo = 1, r_lo2 = 1, r = -1, cap = INFINITY;
  for (int i = 2; i <= w; i++) {
    if (g->spec_t_verify[i] <= 0) continue;
    if (i < at) lo2 = lo, r_lo2 = r_lo, lo = i, r_lo = steps_at(g, i);
    if (i == at) r = steps_at(g, i);
    if (i > at && hi < 0) hi = i;
    if (i >= at && steps_at(g, i) < cap) cap = steps_at(g, i);
  }
  if (r < 0 && hi > 0) r = r_lo + (steps_at(g, hi) - r_lo) * (float)(at - lo) / (float)(hi - lo);
  if (r < 0 && lo == 1) return 1; /* none timed */
  if (r < 0) r = r_lo + (r_lo - r_lo2) * (float)(at - lo) / (float)(lo - lo2);
  return r < cap ? r : cap;
}

/* The least a pass of `tokens` is taken to cost, in plain steps, to choose a count this context has not timed: its
 * price (cost_at: interpolated between the counts timed around it, or seeded from the model's other contexts) less
 * EXPLORE_SLACK, and no less than the dearest count this context timed below it (rows only add work). A seeded price
 * can be too dear here (other contexts' passes ran at other context lengths: a pass's share of attention grows with
 * the context; JSON after the code edit, SmolLM2: passes of 6 at a seeded 2.3 steps for 8, which cost 1.9 in that
 * context), and a count priced too dear never runs to be timed; but priced at the bound alone (a step, where nothing
 * below is timed) every untimed count looked cheapest in turn, and a copy's passes ran 5, 4, 3 and 2 drafts, all
 * taken, before the full ones. best_count still runs it only where its tokens pay at its price too. */
#define EXPLORE_SLACK 0.15f
static float cost_low(const el_model* m, const el_gen* g, int tokens) {
  if (g->spec_t_decode <= 0) return 1;
  int at = cost_slot(m, tokens);
  float price = cost_at(m, g, tokens);
  if (g->spec_own[at]) return price;
  float low = 1;
  for (int i = 2; i < at; i++)
    if (g->spec_own[i] && steps_at(g, i) > low) low = steps_at(g, i);
  return (1 - EXPLORE_SLACK) * price > low ? (1 - EXPLORE_SLACK) * price : low;
}

/* What the last pass cost, in plain steps (1 until both are timed). Waits are scaled by it, so that passes that do
 * not pay take about the same share of the time whatever a pass costs: a MoE pass, which runs the union of its
 * tokens' experts, costs several steps. */
static int pass_cost(const el_gen* g) {
  float r = g->spec_t_decode > 0 && g->spec_t_verify[g->spec_m] > 0 ? steps_at(g, g->spec_m) : 1;
  return r < 2 ? 1 : r > 16 ? 16 : (int)(r + 0.5f);
}

/* The draft model's passes are judged on running averages (its guesses are taken some passes and not others, and
 * its drafting costs every pass): while its passes' tokens (1 + drafts taken) would have taken plain steps less
 * time than they took, or when it was sure of no guess at all, it waits 1, 2, 4 ... 32 chances (times a pass's cost)
 * before guessing again; n-grams go on meanwhile. */
static void model_miss(el_gen* g) {
  g->draft_backoff = g->draft_backoff ? 2 * g->draft_backoff : 1;
  if (g->draft_backoff > BACKOFF_MAX) g->draft_backoff = BACKOFF_MAX;
  g->draft_wait = g->draft_backoff * pass_cost(g);
}

static void settle_model(el_gen* g, int taken) {
  double a = g->draft_passes++ ? 0.7 : 0.0;
  g->draft_taken_avg = a * g->draft_taken_avg + (1 - a) * taken;
  g->draft_t_avg = a * g->draft_t_avg + (1 - a) * g->spec_t_pass;
  if (g->spec_t_decode <= 0 || (1 + g->draft_taken_avg) * g->spec_t_decode >= g->draft_t_avg)
    g->draft_backoff = 0;
  else
    model_miss(g);
}

/* After a pass's drafts are settled (taken: how many of them the samples took): in auto mode, a pass that did not
 * pay waits a number of plain steps before the next draft, doubling while they keep not paying, times what a pass
 * costs in steps (text that does not repeat itself wastes one pass in every BACKOFF_MAX passes' worth of steps). A
 * pass pays when its tokens (the one it decoded and the drafts taken) would have taken plain steps at least about as
 * long as it took (PASS_SLACK), by the measured averages of both (before both are measured: when it took a draft). */
void el_spec_settle(el_gen* g, int taken) {
  int chain = 0; /* the pass's n-gram chain drafts: a copy runs on where the samples took the last of them */
  for (int i = 1; i <= g->spec_n; i++) chain += g->spec_src[i] == SRC_NGRAM && g->spec_chain_i[i] >= 0;
  g->chain_run = chain > 0 && g->spec_at > 0 && g->spec_chain_i[g->spec_at] == chain - 1;
  if (g->spec_from_model) {
    settle_model(g, taken);
    return;
  }
  double t_pass = g->spec_t_verify[g->spec_m];
  int measured = g->spec_t_decode > 0 && t_pass > 0;
  if (measured ? (1 + taken + PASS_SLACK) * g->spec_t_decode >= t_pass : taken > 0) {
    g->spec_backoff = 0;
    return;
  }
  g->spec_backoff = g->spec_backoff ? 2 * g->spec_backoff : 1;
  if (g->spec_backoff > BACKOFF_MAX) g->spec_backoff = BACKOFF_MAX;
  if (g->p.speculate == EL_SPECULATE_AUTO) g->spec_wait = g->spec_backoff * pass_cost(g);
}
