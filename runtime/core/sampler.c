/* Token sampler: penalties, then greedy, or temperature -> top-k -> softmax -> top-p -> min-p -> draw (the order of
 * transformers' logits processors). Same seed, same draws (xoshiro256** seeded by splitmix64; candidates ranked by
 * logit, ties by id). No sort: top-k is a heap selection and top-p a mass-carrying quickselect; the draw walks the
 * kept candidates in the (deterministic) order those leave them in, which changes nothing about the distribution.
 * The logits are never modified (callers dump them): penalties work on a copy.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "el_internal.h"

typedef struct {
  float logit;
  int32_t id;
  double p;
} cand;

struct el_sampler {
  el_sampler_params p;
  uint64_t s[4];    /* xoshiro256** state */
  cand* c;          /* [cap] candidates */
  float* work;      /* [cap] the logits after penalties */
  uint8_t* seen;    /* [cap] repetition-penalty marks */
  uint32_t* counts; /* [cap] occurrences in the generated ids (presence / frequency penalties) */
  int cap;
};

size_t el_sampler_bytes(const el_sampler* s) {
  return s ? sizeof *s + (size_t)s->cap * (sizeof(cand) + sizeof(float) + 1 + sizeof(uint32_t)) : 0;
}

static uint64_t splitmix64(uint64_t* x) {
  uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

static uint64_t next_u64(uint64_t* s) {
  uint64_t r = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
  s[2] ^= s[0], s[3] ^= s[1], s[1] ^= s[2], s[0] ^= s[3];
  s[2] ^= t;
  s[3] = rotl(s[3], 45);
  return r;
}

static double next_unit(uint64_t* s) { return (double)(next_u64(s) >> 11) * 0x1.0p-53; } /* [0, 1) */

/* The one place sampling parameters are checked (every front end reaches it through el_generate). */
int el_check_sampling(const el_sampler_params* p) {
  if (!(isfinite(p->temperature) && p->temperature >= 0))
    return el_error("temperature %g is invalid: it must be a finite number >= 0 (0 = greedy)", p->temperature);
  if (p->top_k < 0) return el_error("top_k %d is invalid: it must be >= 0 (0 = off)", p->top_k);
  if (!(p->top_p > 0 && p->top_p <= 1)) return el_error("top_p %g is invalid: it must be in (0, 1] (1 = off)", p->top_p);
  if (!(p->min_p >= 0 && p->min_p <= 1)) return el_error("min_p %g is invalid: it must be in [0, 1] (0 = off)", p->min_p);
  if (!(isfinite(p->repetition_penalty) && p->repetition_penalty > 0))
    return el_error("repetition_penalty %g is invalid: it must be a finite number > 0 (1 = off)", p->repetition_penalty);
  if (!isfinite(p->presence_penalty) || fabsf(p->presence_penalty) > 100)
    return el_error("presence_penalty %g is invalid: it must be in [-100, 100] (0 = off)", p->presence_penalty);
  if (!isfinite(p->frequency_penalty) || fabsf(p->frequency_penalty) > 100)
    return el_error("frequency_penalty %g is invalid: it must be in [-100, 100] (0 = off)", p->frequency_penalty);
  return 0;
}

EL_API el_sampler* el_sampler_new(const el_sampler_params* p) {
  if (!p) return el_error("el_sampler_new: params is NULL"), NULL;
  if (el_check_sampling(p) != 0) return NULL;
  el_sampler* s = calloc(1, sizeof *s);
  if (!s) return el_error("out of memory"), NULL;
  s->p = *p;
  uint64_t x = p->seed;
  for (int i = 0; i < 4; i++) s->s[i] = splitmix64(&x);
  return s;
}

EL_API void el_sampler_free(el_sampler* s) {
  if (!s) return;
  free(s->c);
  free(s->work);
  free(s->seen);
  free(s->counts);
  free(s);
}

/* x ranks below y: by descending logit, then ascending id (a total order, so ties never make a result depend
 * on the algorithm) */
static int worse(const cand* x, const cand* y) {
  if (x->logit != y->logit) return x->logit < y->logit;
  return x->id > y->id;
}

static void sift_down(cand* h, int k, int j) { /* heap with the worst candidate at the root */
  for (;;) {
    int l = 2 * j + 1, r = l + 1, w = j;
    if (l < k && worse(&h[l], &h[w])) w = l;
    if (r < k && worse(&h[r], &h[w])) w = r;
    if (w == j) return;
    cand t = h[j];
    h[j] = h[w], h[w] = t;
    j = w;
  }
}

/* Moves the k best of c[0..n) into c[0..k) (unordered): O(n log k), not a sort of the whole vocabulary. */
static void select_top_k(cand* c, int n, int k) {
  for (int i = k / 2 - 1; i >= 0; i--) sift_down(c, k, i);
  for (int i = k; i < n; i++)
    if (worse(&c[0], &c[i])) c[0] = c[i], sift_down(c, k, 0);
}

/* Moves the nucleus (the smallest best-first prefix of the distribution with mass >= top_p, at least one
 * candidate) to c[0..k) and returns k, with its mass in *mass. A quickselect on the candidates' total order
 * that carries the mass along: O(n) expected, where sorting 256K candidates costs tens of milliseconds. */
static int nucleus(cand* c, int n, double top_p, double* mass) {
  int lo = 0, hi = n; /* c[0..lo) is kept (all better than the rest); the boundary lies in c[lo..hi) */
  double kept = 0;
  while (lo < hi) {
    int mid = lo + (hi - lo) / 2;
    cand pivot = c[mid];
    c[mid] = c[hi - 1], c[hi - 1] = pivot;
    int i = lo;
    double better = 0;
    for (int j = lo; j < hi - 1; j++) /* c[lo..i): better than the pivot */
      if (worse(&pivot, &c[j])) {
        cand t = c[i];
        c[i] = c[j], c[j] = t;
        better += c[i++].p;
      }
    if (i > lo && kept + better >= top_p) { /* the boundary is among the better ones */
      hi = i;
      continue;
    }
    cand t = c[i]; /* keep all the better ones and the pivot */
    c[i] = c[hi - 1], c[hi - 1] = t;
    kept += better + c[i].p;
    lo = i + 1;
    if (kept >= top_p) break;
  }
  *mass = kept;
  return lo;
}

static int grow(el_sampler* s, int vocab) {
  if (vocab <= s->cap) return 0;
  cand* c = realloc(s->c, sizeof(cand) * (size_t)vocab);
  if (c) s->c = c;
  float* w = c ? realloc(s->work, sizeof(float) * (size_t)vocab) : NULL;
  if (w) s->work = w;
  uint8_t* seen = w ? realloc(s->seen, (size_t)vocab) : NULL;
  if (seen) s->seen = seen;
  uint32_t* counts = seen ? realloc(s->counts, sizeof(uint32_t) * (size_t)vocab) : NULL;
  if (counts) s->counts = counts;
  if (!counts) return el_error("el_sample: out of memory for a vocabulary of %d", vocab);
  memset(s->seen, 0, (size_t)vocab);
  memset(s->counts, 0, sizeof(uint32_t) * (size_t)vocab);
  s->cap = vocab;
  return 0;
}

/* Penalties on a copy of the logits (marks are cleared again before returning). */
static const float* penalize(el_sampler* s, const float* logits, int vocab, const int32_t* h, int n, int n_prompt) {
  const el_sampler_params* p = &s->p;
  int rep = p->repetition_penalty != 1.0f, pf = p->presence_penalty != 0 || p->frequency_penalty != 0;
  if (!h || n <= 0 || (!rep && !pf)) return logits;
  float* w = s->work;
  memcpy(w, logits, sizeof(float) * (size_t)vocab);
  if (rep) /* CTRL repetition penalty, once per distinct id of prompt and output (transformers' processor) */
    for (int i = 0; i < n; i++) {
      int32_t id = h[i];
      if (id < 0 || id >= vocab || s->seen[id]) continue;
      s->seen[id] = 1;
      w[id] = w[id] > 0 ? w[id] / p->repetition_penalty : w[id] * p->repetition_penalty;
    }
  if (pf) { /* OpenAI presence / frequency penalties over the generated ids */
    for (int i = n_prompt; i < n; i++)
      if (h[i] >= 0 && h[i] < vocab) s->counts[h[i]]++;
    for (int i = n_prompt; i < n; i++) {
      int32_t id = h[i];
      if (id < 0 || id >= vocab || !s->counts[id]) continue;
      w[id] -= p->presence_penalty + p->frequency_penalty * (float)s->counts[id];
      s->counts[id] = 0;
    }
  }
  for (int i = 0; i < n; i++)
    if (h[i] >= 0 && h[i] < vocab) s->seen[h[i]] = 0;
  return w;
}

typedef float f32x4 __attribute__((vector_size(16)));
typedef int32_t i32x4 __attribute__((vector_size(16)));

/* The index of the first maximum (NaN compares false and never wins; all -inf or NaN: 0). Blocks of 16 that hold
 * nothing above the best so far are skipped with vector compares (GCC/Clang vectors: SSE on x86, NEON on ARM): the
 * scalar scan took 48 us of a 2.2 ms decode step at a 49k vocabulary, and every token of a verify pass pays it. */
static int32_t first_max(const float* l, int n) {
  int32_t best = 0;
  float bv = -INFINITY;
  int i = 0;
  for (; i + 16 <= n; i += 16) {
    f32x4 a, b, c, d, t = {bv, bv, bv, bv};
    memcpy(&a, l + i, sizeof a), memcpy(&b, l + i + 4, sizeof b);
    memcpy(&c, l + i + 8, sizeof c), memcpy(&d, l + i + 12, sizeof d);
    i32x4 gt = (a > t) | (b > t) | (c > t) | (d > t);
    if (!(gt[0] | gt[1] | gt[2] | gt[3])) continue;
    for (int j = i; j < i + 16; j++)
      if (l[j] > bv) bv = l[j], best = j;
  }
  for (; i < n; i++)
    if (l[i] > bv) bv = l[i], best = i;
  return best;
}

EL_API int32_t el_sample(el_sampler* s, const float* logits, int vocab, const int32_t* history, int n_history,
                         int n_prompt) {
  if (!s || !logits || vocab <= 0) return el_error("el_sample: sampler or logits is NULL, or vocab <= 0");
  if (n_prompt < 0 || n_prompt > n_history) n_prompt = n_history;
  if (grow(s, vocab) != 0) return -1;
  const el_sampler_params* p = &s->p;
  const float* lg = penalize(s, logits, vocab, history, n_history, n_prompt);

  if (!(p->temperature > 0)) return first_max(lg, vocab); /* greedy */

  cand* c = s->c;
  int n = 0;
  for (int i = 0; i < vocab; i++) {
    float v = lg[i] / p->temperature;
    if (!isnan(v)) c[n++] = (cand){v, i, 0};
  }
  if (n == 0) return 0;
  if (p->top_k > 0 && p->top_k < n) {
    select_top_k(c, n, p->top_k);
    n = p->top_k;
  }

  /* softmax over the candidates: subtract the max, accumulate in double */
  float mx = c[0].logit;
  for (int i = 1; i < n; i++)
    if (c[i].logit > mx) mx = c[i].logit;
  double sum = 0;
  for (int i = 0; i < n; i++) sum += (c[i].p = expf(c[i].logit - mx));
  for (int i = 0; i < n; i++) c[i].p /= sum;

  double total = 1.0;
  if (p->top_p < 1.0f) n = nucleus(c, n, p->top_p, &total); /* renormalise over what it keeps */
  if (p->min_p > 0) { /* keep p >= min_p * p(best); the best is always kept */
    double best = 0;
    for (int i = 0; i < n; i++)
      if (c[i].p > best) best = c[i].p;
    int k = 0;
    total = 0;
    for (int i = 0; i < n; i++)
      if (c[i].p >= p->min_p * best) total += c[i].p, c[k++] = c[i];
    n = k;
  }

  double u = next_unit(s->s) * total, acc = 0;
  for (int i = 0; i < n; i++) {
    acc += c[i].p;
    if (u < acc) return c[i].id;
  }
  return c[n - 1].id; /* rounding left u at the very top */
}
