/* Token sampler: repetition penalty, then greedy, or temperature -> top-k -> softmax -> top-p -> draw.
 * Same seed, same draws (xoshiro256** seeded by splitmix64; candidates ranked by logit, ties by id). No sort:
 * top-k is a heap selection and top-p a mass-carrying quickselect; the draw walks the kept candidates in the
 * (deterministic) order those leave them in, which changes nothing about the distribution. */
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
  uint64_t s[4]; /* xoshiro256** state */
  cand* c;       /* [cap] candidates */
  uint8_t* seen; /* [cap] repetition-penalty marks */
  int cap;
};

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

EL_API el_sampler* el_sampler_new(const el_sampler_params* p) {
  if (!p) return el_error("el_sampler_new: params is NULL"), NULL;
  if (isnan(p->temperature) || isnan(p->top_p) || !(p->repetition_penalty > 0) || isinf(p->repetition_penalty))
    return el_error("el_sampler_new: bad parameters (temperature %g, top_p %g, repetition_penalty %g): "
                    "repetition_penalty must be > 0, none may be NaN", p->temperature, p->top_p,
                    p->repetition_penalty), NULL;
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
  free(s->seen);
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

EL_API int32_t el_sample(el_sampler* s, float* logits, int vocab, const int32_t* history, int n_history) {
  if (!s || !logits || vocab <= 0) return el_error("el_sample: sampler or logits is NULL, or vocab <= 0");
  if (vocab > s->cap) {
    cand* c = realloc(s->c, sizeof(cand) * (size_t)vocab);
    uint8_t* seen = c ? realloc(s->seen, (size_t)vocab) : NULL;
    if (c) s->c = c;
    if (seen) s->seen = seen, memset(seen, 0, (size_t)vocab), s->cap = vocab;
    if (!c || !seen) return el_error("el_sample: out of memory for a vocabulary of %d", vocab);
  }
  const el_sampler_params* p = &s->p;

  /* CTRL repetition penalty, once per distinct id in the history */
  if (p->repetition_penalty != 1.0f && history) {
    float rp = p->repetition_penalty;
    for (int i = 0; i < n_history; i++) {
      int32_t id = history[i];
      if (id < 0 || id >= vocab || s->seen[id]) continue;
      s->seen[id] = 1;
      logits[id] = logits[id] > 0 ? logits[id] / rp : logits[id] * rp;
    }
    for (int i = 0; i < n_history; i++)
      if (history[i] >= 0 && history[i] < vocab) s->seen[history[i]] = 0;
  }

  if (!(p->temperature > 0)) { /* greedy: the first maximum; NaN compares false and never wins */
    int best = 0;
    float bv = -INFINITY;
    for (int i = 0; i < vocab; i++)
      if (logits[i] > bv) bv = logits[i], best = i;
    return best;
  }

  cand* c = s->c;
  int n = 0;
  for (int i = 0; i < vocab; i++) {
    logits[i] /= p->temperature;
    if (!isnan(logits[i])) c[n++] = (cand){logits[i], i, 0};
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

  double u = next_unit(s->s) * total, acc = 0;
  for (int i = 0; i < n; i++) {
    acc += c[i].p;
    if (u < acc) return c[i].id;
  }
  return c[n - 1].id; /* rounding left u at the very top */
}
