/* Unit test of speculative decoding's controller (runtime/core/speculate.c, compiled in directly so that its static
 * cost model and count choice are reachable; the context calls it makes are stubbed and never reached here):
 *   gcc -std=c11 -O2 -Iruntime -Iruntime/core -Ioffload tests/c/spec_cost_test.c -o spec_cost_test -lm
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

#include "check.h"
#define NEAR(a, b) (fabsf((a) - (b)) < 1e-5f)

static el_model model(int width, uint32_t flags) {
  el_model m;
  memset(&m, 0, sizeof m);
  m.prog[EL_PROG_VERIFY].present = 1;
  m.prog[EL_PROG_VERIFY].p.tokens = (uint32_t)width;
  m.prog[EL_PROG_VERIFY].p.flags = flags;
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

  /* the count: most tokens per step's time, where it beats plain steps. Costs of an AVX2 host (SmolLM2, in RAM) */
  memset(g.spec_t_verify, 0, sizeof g.spec_t_verify);
  g.spec_t_verify[3] = 0.0117, g.spec_t_verify[5] = 0.0183, g.spec_t_verify[9] = 0.036;
  float cum[9] = {0};
  for (int p100 = 50; p100 <= 95; p100 += 45) { /* a chain whose drafts are each taken at p */
    float p = p100 / 100.0f, q = 1;
    for (int j = 1; j <= 8; j++) q *= p, cum[j] = cum[j - 1] + q;
    int best = 0;
    float gain = 1;
    for (int j = 1; j <= 8; j++)
      if ((1 + cum[j]) / cost_at(&rows, &g, j + 1) >= gain) best = j, gain = (1 + cum[j]) / cost_at(&rows, &g, j + 1);
    int got = best_count(&rows, &g, 8, cum);
    CHECK(got == best && got > 0 && got < 8, "p %.2f: %d drafts, the best is %d", p, got, best);
    CHECK(p100 == 50 ? got <= 2 : got >= 3, "p %.2f: %d drafts", p, got);
  }
  for (int j = 1; j <= 8; j++) cum[j] = 0.01f * j; /* drafts nobody takes: no pass */
  CHECK(best_count(&rows, &g, 8, cum) == 0, "a pass that cannot pay ran");
  puts("OK");
  return 0;
}
