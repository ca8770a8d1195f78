/* Which weight store a model gets (offload/store.h): the one place the policy is chosen and the one "auto" rule.
 *
 * Every policy's smallest budget is learned from the store itself (opened in plan-only mode: a layout, nothing read
 * or allocated), so the rule and the "below the minimum" message always agree with what the stores can run in. */
#include <stdio.h>
#include <string.h>

#include "store.h"

static el_weight_store* (*const OPENERS[])(const el_store_config*, char*, size_t) = {
    el_store_open_resident, el_store_open_window, el_store_open_experts};
static const char* const NAMES[] = {"resident", "window", "experts"};
enum { RESIDENT, WINDOW, EXPERTS, N_POLICIES, AUTO = -1 };

/* The smallest budget the policy's store runs in (for the weights only), or UINT64_MAX with err set. */
static uint64_t minimum_of(int policy, el_store_config cfg, char* err, size_t errlen) {
  cfg.plan_only = 1, cfg.budget = 0;
  el_weight_store* probe = OPENERS[policy](&cfg, err, errlen);
  if (!probe) return UINT64_MAX;
  uint64_t min = probe->layout.minimum_budget;
  probe->close(probe);
  return min;
}

el_weight_store* el_store_choose(const el_store_request* rq, const el_store_config* config, uint64_t* minimum_budget,
                                 char* err, size_t errlen) {
  int want = AUTO;
  if (rq->policy && *rq->policy && strcmp(rq->policy, "auto") != 0) {
    for (int p = 0; p < N_POLICIES; p++)
      if (!strcmp(rq->policy, NAMES[p])) want = p;
    if (want == AUTO) {
      snprintf(err, errlen, "unknown weight store policy \"%s\" (known: auto, resident, window, experts)", rq->policy);
      return NULL;
    }
  }
  const uint64_t ctx = rq->context_bytes, budget = rq->budget;
  const uint64_t whole = ctx + config->file_bytes; /* everything resident */
  if (rq->device_backend && want != AUTO && want != RESIDENT) {
    snprintf(err, errlen, "the %s backend keeps every weight in its device's memory: weight policy \"%s\" applies "
             "to CPU packages (use \"resident\")", rq->device_backend, NAMES[want]);
    return NULL;
  }
  if (rq->device_backend) want = RESIDENT;
  /* each candidate's smallest budget, a context included: resident holds all; window streams what it cannot hold;
   * the expert cache (MoE) holds all but the experts */
  uint64_t min[N_POLICIES] = {whole, UINT64_MAX, UINT64_MAX};
  if (!rq->device_backend) {
    uint64_t w = minimum_of(WINDOW, *config, err, errlen);
    if (w == UINT64_MAX) return NULL;
    min[WINDOW] = ctx + w;
    if (rq->moe || want == EXPERTS) {
      uint64_t e = minimum_of(EXPERTS, *config, err, errlen);
      if (e == UINT64_MAX) return NULL;
      min[EXPERTS] = ctx + e;
    }
  }
  uint64_t least = min[RESIDENT];
  for (int p = 0; p < N_POLICIES; p++)
    if (min[p] < least) least = min[p];
  *minimum_budget = want == AUTO ? least : min[want];
  if (budget && budget < *minimum_budget) {
    if (want == RESIDENT)
      snprintf(err, errlen, "the memory budget (%.1f MB) is smaller than the weights (%.1f MB) + a context's KV cache "
               "and activations (%.1f MB), and the \"resident\" policy holds them all: raise the budget or use the "
               "\"window\" policy", budget / 1e6, config->file_bytes / 1e6, ctx / 1e6);
    else
      snprintf(err, errlen, "the memory budget (%.1f MB) is below this package's minimum of %.1f MB: %.1f MB of "
               "weights %s + %.1f MB for a context's KV cache and activations (%u tokens of context)", budget / 1e6,
               *minimum_budget / 1e6, (*minimum_budget - ctx) / 1e6,
               *minimum_budget == whole ? "(all of them)"
               : *minimum_budget == min[EXPERTS] ? "(all but the experts, two expert slots, read-ahead)"
                                                 : "held, streamed through a window, and read ahead",
               ctx / 1e6, rq->max_ctx);
    return NULL;
  }
  /* auto: resident if it fits, else an expert cache if one fits, else a window */
  if (want == AUTO) want = !budget || whole <= budget ? RESIDENT : min[EXPERTS] <= budget ? EXPERTS : WINDOW;
  el_store_config cfg = *config;
  cfg.budget = budget ? budget - ctx : 0;
  return OPENERS[want](&cfg, err, errlen);
}
