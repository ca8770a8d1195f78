/* A program's steps, walked for any backend: CALL steps in order, a ROUTE step's body once per selected id (the
 * selected experts' weights announced to the weight store first), a PREDICT step's guess handed to the store to
 * read ahead. The backend makes each kernel call (its `call`); everything about routing lives here, once. */
#include <stdint.h>
#include <stdlib.h>

#include "el_internal.h"

void el_step_walk_free(el_step_walk* w) {
  free(w->predicted);
  w->predicted = NULL;
}

/* The ids an earlier kernel wrote for a ROUTE or PREDICT step, checked (a kernel bug must not become an
 * out-of-range weight id); -1 ends a variable-count selection. The count, or -1. */
static int selected(const el_context* c, const el_step* st, int prog, uint32_t si, const int32_t** out) {
  const int32_t* ids = (const int32_t*)(c->arena + st->ids_offset);
  uint32_t n = 0;
  for (; n < st->n_select && ids[n] != -1; n++)
    if (ids[n] < 0 || (uint32_t)ids[n] >= st->n_experts)
      return el_error("%s step %u of program %s selected expert %d of %u",
                      st->kind == EL_STEP_ROUTE ? "routed" : "predicting", si, el_program_name(prog), ids[n],
                      st->n_experts);
  *out = ids;
  return (int)n;
}

/* PREDICT: runs the body (the guess), hands the store the guessed experts' weights and notes them for the route's
 * recall count. Skipped, body and all, when the store reads nothing ahead or predictions are off. */
static int predict(el_context* c, int prog, uint32_t si, int pos, el_step_walk* w, el_step_call call, void* user) {
  const el_program* pg = &c->m->prog[prog];
  const el_step* st = &pg->steps[si];
  el_weight_store* store = c->m->store;
  if (!store->predict || !c->m->expert_predict) return 0;
  for (uint32_t j = 1; j <= st->n_body; j++)
    if (call(user, c, prog, si + j, pos, -1, -1) != 0) return -1;
  const int32_t* ids;
  int n = selected(c, st, prog, si, &ids);
  if (n < 0) return -1;
  uint32_t nw_all = c->m->h.n_weights;
  if (!w->predicted && !(w->predicted = calloc(2 * (size_t)nw_all + 1, sizeof *w->predicted)))
    return el_error("out of memory");
  uint32_t ws[64], nw = 0;
  for (int i = 0; i < n; i++)
    for (uint32_t ai = 0; ai < st->n_args; ai++) {
      uint32_t id = st->args[ai].index + (uint32_t)ids[i] * st->args[ai].expert_stride;
      if (ai == 0) w->predicted[id] = w->serial;
      if (nw && ws[nw - 1] == id) continue; /* an expert's views name one weight */
      if (nw == 64) store->predict(store, ws, nw, st->args[0].index), nw = 0;
      ws[nw++] = id;
    }
  if (st->n_args) w->predicted[nw_all + st->args[0].index] = w->serial; /* a guess was made for that route */
  if (nw) store->predict(store, ws, nw, st->args[0].index);
  return 0;
}

/* ROUTE: the body once per selected id, after counting the guess's recall and announcing the selected experts. */
static int route(el_context* c, int prog, uint32_t si, int pos, el_step_walk* w, el_step_call call, void* user) {
  const el_program* pg = &c->m->prog[prog];
  const el_step* st = &pg->steps[si];
  const int32_t* ids;
  int n_sel_i = selected(c, st, prog, si, &ids);
  if (n_sel_i < 0) return -1;
  uint32_t n_sel = (uint32_t)n_sel_i;
  el_weight_store* store = c->m->store;
  c->stats.routed_selected += n_sel, c->stats.routed_possible += st->n_select;
  if (w->predicted && st->n_body) { /* recall of this run's guess for this route, if one was made */
    const el_plan_arg* a = NULL;
    for (uint32_t j = 1; j <= st->n_body && !a; j++)
      for (uint32_t ai = 0; ai < pg->steps[si + j].n_args && !a; ai++)
        if (pg->steps[si + j].args[ai].flags & EL_FLAG_EXPERT) a = &pg->steps[si + j].args[ai];
    if (a && w->predicted[c->m->h.n_weights + a->index] == w->serial) {
      c->stats.expert_predict_checked += n_sel;
      for (uint32_t i = 0; i < n_sel; i++)
        c->stats.expert_predicted += w->predicted[a->index + (uint32_t)ids[i] * a->expert_stride] == w->serial;
    }
  }
  if (store->prefetch) /* announce every selected expert's weights before the first one runs, each once */
    for (uint32_t i = 0; i < n_sel; i++) {
      uint32_t last = UINT32_MAX;
      for (uint32_t j = 1; j <= st->n_body; j++) {
        const el_step* body = &pg->steps[si + j];
        for (uint32_t ai = 0; ai < body->n_args; ai++)
          if (body->args[ai].flags & EL_FLAG_EXPERT) {
            uint32_t wid = body->args[ai].index + (uint32_t)ids[i] * body->args[ai].expert_stride;
            if (wid != last) store->prefetch(store, &wid, 1);
            last = wid;
          }
      }
    }
  for (uint32_t i = 0; i < n_sel; i++)
    for (uint32_t j = 1; j <= st->n_body; j++)
      if (call(user, c, prog, si + j, pos, ids[i], (int)i) != 0) return -1;
  return 0;
}

int el_run_steps(el_context* c, int prog, int pos, el_step_walk* w, el_step_call call, void* user) {
  const el_program* pg = &c->m->prog[prog];
  w->serial++;
  for (uint32_t si = 0; si < pg->n_steps; si++) {
    const el_step* st = &pg->steps[si];
    int rc = st->kind == EL_STEP_CALL      ? call(user, c, prog, si, pos, -1, -1)
             : st->kind == EL_STEP_PREDICT ? predict(c, prog, si, pos, w, call, user)
                                           : route(c, prog, si, pos, w, call, user);
    if (rc != 0) return -1;
    if (st->kind != EL_STEP_CALL) si += st->n_body;
  }
  return 0;
}
