/* Speculative decoding's drafts and their controller (issue 36; the loop that verifies them is generate.c's).
 *
 * A draft is a guess at the next tokens. The verify program runs the token just sampled and the drafts after it in
 * one pass over the weights and returns each one's logits; then the sampler draws from those rows in order, exactly
 * as plain decoding would draw (same logits, same history, same random numbers), and each draw that equals the next
 * draft takes that draft's row without a pass of its own. A draft of one token per position (a point mass) makes
 * this exact for any sampler: drawing t ~ p and keeping the draft iff t equals it is the target distribution. */
#include <string.h>

#include "el_internal.h"

/* auto asks for a longer match than ngram: in free text, two-token matches are mostly coincidences, and a refused
 * pass costs what a pass costs */
enum { NGRAM_MAX = 4, NGRAM_MIN = 2, NGRAM_MIN_AUTO = 3, BACKOFF_MAX = 32 };

/* Prompt lookup: the latest earlier place where the history's last n ids occur (n from NGRAM_MAX down to min_n),
 * and up to max ids that followed them there. Text that quotes its prompt (code edits, extraction, reformatting)
 * repeats long runs of it. */
static int ngram_draft(const int32_t* h, int n_hist, int min_n, int max, int32_t* out) {
  for (int n = NGRAM_MAX; n >= min_n; n--) {
    if (n_hist <= n) continue;
    const int32_t* tail = h + n_hist - n;
    for (int i = n_hist - n - 1; i >= 0; i--) {
      if (h[i] != tail[0] || memcmp(h + i, tail, sizeof(int32_t) * (size_t)n) != 0) continue;
      int k = 0;
      while (k < max && i + n + k < n_hist) out[k] = h[i + n + k], k++;
      return k;
    }
  }
  return 0;
}

/* A step's time into its running average (0: none yet). */
void el_spec_time(double* avg, double seconds) { *avg = *avg > 0 ? 0.7 * *avg + 0.3 * seconds : seconds; }

/* How many drafts the next pass carries (0: decode plainly), and the drafts in g->spec_draft. */
int el_spec_draft(el_context* c, el_gen* g) {
  const el_model* m = c->m;
  int mode = g->p.speculate, width = el_verify_tokens(m) - 1;
  if (mode == EL_SPECULATE_OFF || width < 1) return 0;
  if (mode == EL_SPECULATE_AUTO && g->spec_wait > 0) {
    g->spec_wait--;
    return 0;
  }
  /* as many drafts as the program has rows for: its padding rows cost what real ones do */
  int max = g->p.draft_max > 0 && g->p.draft_max < width ? g->p.draft_max : width;
  if (max > EL_MAX_DRAFT) max = EL_MAX_DRAFT;
  int left = g->p.max_new_tokens - g->n_gen - 1; /* draws after the next one */
  int room = (int)m->h.max_ctx - c->pos - 1;     /* the pass runs 1 + k tokens from pos */
  if (left < max) max = left;
  if (room < max) max = room;
  return max > 0 ? ngram_draft(g->hist, g->n_hist, mode == EL_SPECULATE_AUTO ? NGRAM_MIN_AUTO : NGRAM_MIN, max,
                               g->spec_draft)
                 : 0;
}

/* After a pass's drafts are settled (taken: how many of them the samples took): in auto mode, a pass that did not
 * pay waits a number of plain steps before the next draft, doubling while they keep not paying (text that does not
 * repeat itself costs one wasted pass every BACKOFF_MAX tokens at most). A pass pays when its tokens (the one it
 * decoded and the drafts taken) would have taken plain steps longer than it took, by the measured averages of both
 * (before both are measured: when it took a draft). */
void el_spec_settle(el_gen* g, int taken) {
  int measured = g->spec_t_decode > 0 && g->spec_t_verify > 0;
  if (taken > 0 && (!measured || (1 + taken) * g->spec_t_decode >= g->spec_t_verify)) {
    g->spec_backoff = 0;
    return;
  }
  g->spec_backoff = g->spec_backoff ? 2 * g->spec_backoff : 1;
  if (g->spec_backoff > BACKOFF_MAX) g->spec_backoff = BACKOFF_MAX;
  if (g->p.speculate == EL_SPECULATE_AUTO) g->spec_wait = g->spec_backoff;
}
