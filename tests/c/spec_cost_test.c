/* Unit test of speculative decoding's controller (runtime/core/speculate.c, compiled in directly so that its static
 * cost model and count choice are reachable; the context calls it makes are stubbed and never reached here):
 *   gcc -std=c11 -O2 -Iruntime -Iruntime/core -Ioffload tests/c/spec_cost_test.c -o spec_cost_test -lm -lpthread
 * Prints "OK"; exits nonzero on the first failure. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "../../runtime/core/speculate.c"

static int unreached(void) {
  fprintf(stderr, "FAIL: a context call was reached\n");
  exit(1);
}
int el_error(const char* fmt, ...) { return (void)fmt, unreached(); }
int el_token_text(const el_model* m, int32_t id, char* out, int cap) { return (void)m, (void)id, (void)out, (void)cap, unreached(); }
int el_verify_tokens(const el_model* m) { return m->prog[EL_PROG_VERIFY].present ? (int)m->prog[EL_PROG_VERIFY].p.tokens : 0; }
int el_pos(const el_context* c) { return (void)c, unreached(); }
int el_rewind(el_context* c, int n) { return (void)c, (void)n, unreached(); }
int el_decode(el_context* c, int32_t id, float* l) { return (void)c, (void)id, (void)l, unreached(); }
int el_prefill(el_context* c, const int32_t* ids, int n, float* l, int all) { return (void)c, (void)ids, (void)n, (void)l, (void)all, unreached(); }
int el_verify(el_context* c, const int32_t* ids, int n, float* l) { return (void)c, (void)ids, (void)n, (void)l, unreached(); }
int el_verify_take_node(el_context* c, int node) { return (void)c, (void)node, unreached(); }
double el_now(void) { return unreached(); }
int el_pool_draft(el_model* m, const int32_t* h, int n, int max, int32_t* out) { return (void)m, (void)h, (void)n, (void)max, (void)out, unreached(); }

#include "check.h"
#define NEAR(a, b) (fabsf((a) - (b)) < 1e-5f)

/* cum[j]: what the first j drafts of a chain whose drafts are each taken at p are expected to take */
static void chain_at(float* cum, float p) {
  float q = 1;
  for (int j = 1; j <= 8; j++) q *= p, cum[j] = cum[j - 1] + q;
}

static el_model model(int width, uint32_t flags) {
  el_model m;
  memset(&m, 0, sizeof m);
  m.prog[EL_PROG_VERIFY].present = 1;
  m.prog[EL_PROG_VERIFY].p.tokens = (uint32_t)width;
  m.prog[EL_PROG_VERIFY].p.flags = flags;
  pthread_mutex_init(&m.mu, NULL);
  return m;
}

int main(void) {
  static el_gen g; /* large: off the stack */
  el_model rows = model(9, EL_PROGRAM_TREE | EL_PROGRAM_ROWS), fixed = model(9, EL_PROGRAM_TREE);
  /* nothing timed: every count costs a step (the first pass is how one gets timed) */
  CHECK(NEAR(cost_at(&rows, &g, 5), 1), "untimed: %g", cost_at(&rows, &g, 5));
  g.spec_t_decode = 0.01;
  CHECK(NEAR(cost_at(&rows, &g, 5), 1), "no pass timed: %g", cost_at(&rows, &g, 5));
  /* one count timed (9 tokens: 4 steps): the others on the line from a one-token pass (a step) to it */
  el_spec_time(&g.spec_t_verify[9], 0.04);
  CHECK(NEAR(cost_at(&rows, &g, 9), 4) && NEAR(cost_at(&rows, &g, 5), 2.5f), "%g %g", cost_at(&rows, &g, 9),
        cost_at(&rows, &g, 5));
  /* a second (3 tokens: 1.2): interpolated between the counts around, extended along the last two past them */
  g.spec_t_verify[3] = 0.012;
  CHECK(NEAR(cost_at(&rows, &g, 2), 1.1f) && NEAR(cost_at(&rows, &g, 6), 1.2f + 2.8f * 3 / 6), "%g %g",
        cost_at(&rows, &g, 2), cost_at(&rows, &g, 6));
  g.spec_t_verify[9] = 0;
  g.spec_t_verify[5] = 0.02;
  CHECK(NEAR(cost_at(&rows, &g, 7), 2 + 0.8f / 2 * 2), "extended: %g", cost_at(&rows, &g, 7));
  /* a slow outlier never costs more than a larger count did */
  g.spec_t_verify[9] = 0.04, g.spec_t_verify[4] = 0.1;
  CHECK(NEAR(cost_at(&rows, &g, 4), 2), "capped: %g", cost_at(&rows, &g, 4));
  /* a program that computes every row: one cost, its width's, timed whatever a pass carried */
  el_gen f;
  memset(&f, 0, sizeof f);
  f.spec_t_decode = 0.01;
  el_spec_timed(&fixed, &f, 3, 0.04);
  CHECK(f.spec_m == 9 && NEAR(cost_at(&fixed, &f, 2), 4) && NEAR(cost_at(&fixed, &f, 9), 4), "fixed: %g",
        cost_at(&fixed, &f, 2));
  el_spec_timed(&rows, &f, 3, 0.012);
  CHECK(f.spec_m == 3 && NEAR(cost_at(&rows, &f, 3), 1.2f), "rows: %g", cost_at(&rows, &f, 3));
  /* the model keeps what its contexts measured: a new context, once it has timed a step of its own (here twice as
   * slow: another thread count), starts from those costs in steps; what it times itself is its own */
  static el_gen h;
  el_spec_time(&h.spec_t_decode, 0.02);
  h.spec_t_verify[5] = 0.05;
  seed_costs(&rows, &h);
  CHECK(NEAR(cost_at(&rows, &h, 3), 1.2f) && NEAR(cost_at(&rows, &h, 5), 2.5f) && h.spec_t_verify[9] == 0,
        "seeded: %g %g", cost_at(&rows, &h, 3), cost_at(&rows, &h, 5));

  /* the count: most tokens per step's time, where it beats plain steps. Every count timed, at the costs of an AVX2
   * host (SmolLM2 in RAM: GEMMs take tokens in pairs), a chain whose drafts are each taken at 0.92: 5 drafts (6
   * tokens for 2.47 steps) beat 3 (4 for 1.87) and 7 (8 for 3.10); taken at 0.5: one */
  static const float AVX2[10] = {0, 1.26f, 1.31f, 1.89f, 1.87f, 2.36f, 2.47f, 3.05f, 3.10f, 3.6f};
  memset(g.spec_t_verify, 0, sizeof g.spec_t_verify);
  for (int i = 1; i <= 9; i++) g.spec_t_verify[i] = AVX2[i] * g.spec_t_decode, g.spec_own[i] = 1;
  float cum[9] = {0};
  chain_at(cum, 0.92f);
  CHECK(best_count(&rows, &g, 8, cum) == 5, "timed, p 0.92: %d drafts", best_count(&rows, &g, 8, cum));
  chain_at(cum, 0.5f);
  CHECK(best_count(&rows, &g, 8, cum) == 1, "timed, p 0.5: %d drafts", best_count(&rows, &g, 8, cum));
  /* only 2, 3 and 8 tokens timed (as a run on that host had them): the counts between look dear on the line from 3
   * to 8 (4 tokens: 2.3 steps), but at the least they can cost (3's), the 0.92 chain runs one of them to time it */
  memset(g.spec_t_verify, 0, sizeof g.spec_t_verify);
  memset(g.spec_own, 0, sizeof g.spec_own);
  g.spec_t_verify[2] = 0.011, g.spec_t_verify[3] = 0.0196, g.spec_t_verify[8] = 0.0371;
  g.spec_own[2] = g.spec_own[3] = g.spec_own[8] = 1;
  chain_at(cum, 0.92f);
  int got = best_count(&rows, &g, 8, cum);
  CHECK(got >= 3 && got <= 6, "p 0.92 with 4..7 untimed: %d drafts", got);
  /* a tree mostly refused (free text) buys no timing: at the interpolated costs nothing past one draft pays */
  for (int j = 1; j <= 8; j++) cum[j] = 0.45f + 0.08f * (j - 1);
  CHECK(best_count(&rows, &g, 8, cum) == 1, "free text: %d drafts", best_count(&rows, &g, 8, cum));
  /* nor does a MoE pass (2 tokens: 3 steps, 9: 8): on the line between them no untimed count pays for 0.8 chains */
  memset(g.spec_t_verify, 0, sizeof g.spec_t_verify);
  memset(g.spec_own, 0, sizeof g.spec_own);
  g.spec_t_verify[2] = 0.03, g.spec_t_verify[9] = 0.08;
  g.spec_own[2] = g.spec_own[9] = 1;
  chain_at(cum, 0.8f);
  CHECK(best_count(&rows, &g, 8, cum) == 0, "MoE: %d drafts", best_count(&rows, &g, 8, cum));
  /* counts whose times were only seeded from other contexts (longer ones, other trees) compete at the least they can
   * cost here too: a running copy (drafts taken at 0.99) in an 8-wide program whose 7- and 8-token prices were seeded
   * dear (2.1, 2.3 steps) runs 8 tokens once to time them here (SmolLM2's JSON after its code edit kept to passes of 6
   * before); timed here at 1.9 (and 7 at its 2.1) it keeps them. A seeded price still bars a pass it cannot pay for:
   * at free text's rates the 8-token pass does not run. */
  el_model w8 = model(8, EL_PROGRAM_TREE | EL_PROGRAM_ROWS);
  static const float SEEDED[9] = {0, 1, 1.27f, 1.32f, 1.49f, 1.49f, 1.49f, 2.10f, 2.31f};
  memset(g.spec_t_verify, 0, sizeof g.spec_t_verify);
  memset(g.spec_own, 0, sizeof g.spec_own);
  for (int i = 2; i <= 8; i++) g.spec_t_verify[i] = SEEDED[i] * g.spec_t_decode, g.spec_own[i] = i <= 6;
  chain_at(cum, 0.99f);
  CHECK(best_count(&w8, &g, 7, cum) == 7, "seeded dear: %d drafts", best_count(&w8, &g, 7, cum));
  g.spec_t_verify[8] = 0.019, g.spec_own[8] = g.spec_own[7] = 1;
  CHECK(best_count(&w8, &g, 7, cum) == 7, "timed here: %d drafts", best_count(&w8, &g, 7, cum));
  g.spec_t_verify[8] = 0.0231, g.spec_own[8] = 1;
  CHECK(best_count(&w8, &g, 7, cum) == 5, "timed dear here too: %d drafts", best_count(&w8, &g, 7, cum));
  for (int j = 1; j <= 7; j++) cum[j] = 0.45f + 0.08f * (j - 1);
  g.spec_own[8] = 0;
  CHECK(best_count(&w8, &g, 7, cum) < 7, "free text, seeded: %d drafts", best_count(&w8, &g, 7, cum));
  /* a pass whose drafts were all refused waits before the next draft, unless it cost about a step (its weights read
   * once from storage under a memory budget: drafts come free there) */
  static el_gen w;
  w.p.speculate = EL_SPECULATE_AUTO, w.spec_t_decode = 0.01;
  el_spec_timed(&rows, &w, 3, 0.0105);
  el_spec_settle(&w, 0);
  CHECK(w.spec_wait == 0 && w.spec_backoff == 0, "a pass of 1.05 steps: wait %d", w.spec_wait);
  el_spec_timed(&rows, &w, 9, 0.03);
  el_spec_settle(&w, 0);
  CHECK(w.spec_wait == 3 && w.spec_backoff == 1, "a pass of 3 steps: wait %d", w.spec_wait);
  el_spec_settle(&w, 2);
  CHECK(w.spec_backoff == 0, "3 tokens for 3 steps paid");
  for (int j = 1; j <= 8; j++) cum[j] = 0.01f * j; /* drafts nobody takes: no pass */
  CHECK(best_count(&rows, &g, 8, cum) == 0, "a pass that cannot pay ran");
  /* a pass expected to beat its cost by less than PAY_MARGIN does not run (recycled drafts in free text, SmolLM2: 1.3
   * tokens expected of a 2-token pass of 1.2 steps); one that beats it by more does */
  memset(g.spec_t_verify, 0, sizeof g.spec_t_verify);
  for (int i = 2; i <= 9; i++) g.spec_t_verify[i] = (1.2f + 0.1f * (float)(i - 2)) * g.spec_t_decode, g.spec_own[i] = 1;
  for (int j = 1; j <= 8; j++) cum[j] = 0.3f; /* 1.3 tokens for 1.2 steps, whatever the count */
  CHECK(best_count(&rows, &g, 8, cum) == 0, "1.3 tokens for 1.2 steps: %d drafts", best_count(&rows, &g, 8, cum));
  for (int j = 1; j <= 8; j++) cum[j] = 0.4f; /* 1.4 for 1.2: past the margin */
  CHECK(best_count(&rows, &g, 8, cum) == 1, "1.4 tokens for 1.2 steps: %d drafts", best_count(&rows, &g, 8, cum));
  /* while auto waits after a miss, its n-gram drafts are still found and declined: the next sample rates them (the
   * source's offers count), and no pass runs */
  {
    static el_gen s;
    static el_context c;
    int32_t hist[12] = {5, 6, 7, 8, 9, 1, 2, 5, 6, 7, 8, 9}; /* ... 6 7 8 9 again: "1 2" follows */
    c.m = &rows, c.pos = 12, rows.h.max_ctx = 64;
    s.p.speculate = EL_SPECULATE_AUTO, s.p.max_new_tokens = 64, s.spec_t_decode = 0.01;
    s.hist = hist, s.n_hist = 12, s.spec_wait = 2;
    CHECK(el_spec_draft(&c, &s) == 0 && s.spec_wait == 1 && s.spec_shadow > 0 && s.spec_draft[0] == 1,
          "waiting: a pass, or no declined drafts (wait %d, shadow %d)", s.spec_wait, s.spec_shadow);
    el_spec_shadow(&s, 1);
    CHECK(s.src_offered[SRC_NGRAM] == 1 && s.src_taken[SRC_NGRAM] == 1 && s.spec_shadow == 0,
          "the declined draft was not rated: %g of %g", s.src_taken[SRC_NGRAM], s.src_offered[SRC_NGRAM]);
  }
  /* the recycling table's row of a token: the 4 largest logits (the first of equal ones; NaN never), as a plain
   * scan finds them, whatever the vocabulary's length (the vector skips work in blocks of 64 and 16) */
  static el_gen r;
  static float l[49152 + 37];
  r.recycling = 1;
  srand(7);
  for (int t = 0; t < 40; t++) {
    int vocab = t % 4 == 0 ? 49152 + 37 : t % 4 == 1 ? 4096 : t % 4 == 2 ? 70 : 4096 + 13;
    for (int i = 0; i < vocab; i++) l[i] = (float)(rand() % 2001 - 1000) / 100.0f; /* many equal values */
    if (t % 3 == 0) l[rand() % vocab] = NAN, l[rand() % vocab] = NAN;
    if (t % 5 == 0) l[vocab - 1] = 99, l[vocab - 2] = 99; /* the largest in the scalar tail */
    if (t % 7 == 0) for (int i = 0; i < vocab; i++) l[i] = -INFINITY; /* nothing above the start: no ids */
    int32_t ref[REC_K];
    float rv[REC_K];
    for (int k = 0; k < REC_K; k++) ref[k] = -1, rv[k] = -INFINITY;
    for (int i = 0; i < vocab; i++)
      if (l[i] > rv[REC_K - 1]) keep_best(l[i], i, rv, ref);
    free(r.rec_next), r.rec_next = NULL;
    el_spec_observe(&r, 3, l, vocab);
    CHECK(r.rec_next && memcmp(r.rec_next + 3 * REC_K, ref, sizeof ref) == 0, "top %d of %d logits: %d %d %d %d, "
          "not %d %d %d %d", REC_K, vocab, r.rec_next[12], r.rec_next[13], r.rec_next[14], r.rec_next[15], ref[0],
          ref[1], ref[2], ref[3]);
  }
  free(r.rec_next);
  puts("OK");
  return 0;
}
