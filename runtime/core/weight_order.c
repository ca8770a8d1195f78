/* How the programs use the weights, for stores that stream them (offload/window.c): each program's weights in the
 * order its steps use them (announced to the store when the program starts), and which weights cannot be streamed.
 * Everything here is derived from the checked plan. */
#include <stdlib.h>
#include <string.h>

#include "el_internal.h"

/* Calls f(arg, w) for every weight a ROUTE step's body may use, expert by expert (expert 0's, then expert 1's...:
 * file order for bundled FFNs and experts stored one after another). */
static void route_weights(const el_program* pg, uint32_t si, void (*f)(void*, uint32_t), void* arg) {
  const el_step* st = &pg->steps[si];
  for (uint32_t e = 0; e < st->n_experts; e++)
    for (uint32_t j = 1; j <= st->n_body && si + j < pg->n_steps; j++) {
      const el_step* body = &pg->steps[si + j];
      for (uint32_t ai = 0; ai < body->n_args; ai++) {
        const el_plan_arg* a = &body->args[ai];
        if (a->kind != EL_ARG_WEIGHT || (e && !(a->flags & EL_FLAG_EXPERT))) continue;
        f(arg, a->index + ((a->flags & EL_FLAG_EXPERT) ? e * a->expert_stride : 0));
      }
    }
}

typedef struct {
  el_program* pg;
  uint32_t* seen;
  uint32_t tag;
} order_fill;

static void add_to_order(void* arg, uint32_t w) {
  order_fill* o = arg;
  if (o->seen[w] == o->tag) return;
  o->seen[w] = o->tag;
  o->pg->order[o->pg->n_order++] = w;
}

/* A step that reads the program's token ids: an embedding lookup, which touches a few rows of its weights, so
 * streaming the whole table for it would read megabytes per token for kilobytes used. */
static int reads_token_ids(const el_program* pg, const el_step* st) {
  for (uint32_t ai = 0; ai < st->n_args; ai++) {
    const el_plan_arg* a = &st->args[ai];
    if (a->kind == EL_ARG_ARENA && a->offset == pg->p.in_offset && a->dtype_code == kDLInt && a->dtype_bits == 32)
      return 1;
  }
  return 0;
}

int el_weight_order(el_model* m) {
  uint32_t n = m->h.n_weights;
  uint32_t* seen = calloc(n ? n : 1, sizeof *seen); /* program index + 1 that listed it last */
  if (!seen) return el_error("out of memory");
  for (int k = 0; k < EL_N_PROGRAMS; k++) {
    el_program* pg = &m->prog[k];
    if (!pg->present) continue;
    if (!(pg->order = malloc(sizeof *pg->order * (n ? n : 1)))) { /* each weight at most once */
      free(seen);
      return el_error("out of memory");
    }
    order_fill o = {pg, seen, (uint32_t)k + 1};
    for (uint32_t si = 0; si < pg->n_steps; si++) {
      const el_step* st = &pg->steps[si];
      if (st->kind == EL_STEP_PREDICT) continue; /* its body is plain steps; its experts are a guess */
      if (st->kind != EL_STEP_CALL) {
        /* every weight the route may select, in expert order: a store reads ahead the ones it predicts (the
         * selection is known only when the route runs) */
        route_weights(pg, si, add_to_order, &o);
        si += st->n_body;
        continue;
      }
      for (uint32_t ai = 0; ai < st->n_args; ai++)
        if (st->args[ai].kind == EL_ARG_WEIGHT) add_to_order(&o, st->args[ai].index);
    }
  }
  free(seen);
  return 0;
}

typedef struct {
  el_weight_use* u;
  const el_program* dec;
  uint32_t j, pseudo_step;
} seq_fill;

static void add_to_seq(void* arg, uint32_t w) {
  seq_fill* f = arg;
  if (f->j >= f->dec->n_order || f->dec->order[f->j] != w) return; /* listed earlier */
  f->u->seq[f->j] = w, f->u->seq_step[f->j] = f->pseudo_step++, f->j++;
}

int el_weight_use_of(const el_model* m, el_weight_use* u) {
  uint32_t n = m->h.n_weights;
  memset(u, 0, sizeof *u);
  const el_program* dec = &m->prog[EL_PROG_DECODE];
  uint16_t* uses = calloc(n ? n : 1, sizeof *uses);
  uint8_t* plain = calloc(n ? n : 1, 1); /* used outside a routed body by some program */
  u->must_pin = calloc(n ? n : 1, 1);
  u->seq = malloc(sizeof *u->seq * (dec->n_order ? dec->n_order : 1));
  u->seq_step = malloc(sizeof *u->seq_step * (dec->n_order ? dec->n_order : 1));
  if (!uses || !plain || !u->must_pin || !u->seq || !u->seq_step) {
    free(uses), free(plain);
    el_weight_use_free(u);
    return el_error("out of memory");
  }
  for (int k = 0; k < EL_N_PROGRAMS; k++) {
    const el_program* pg = &m->prog[k];
    if (!pg->present) continue;
    memset(uses, 0, sizeof *uses * n);
    uint32_t body_left = 0, route_experts = 0;
    for (uint32_t si = 0; si < pg->n_steps; si++) {
      const el_step* st = &pg->steps[si];
      if (st->kind == EL_STEP_PREDICT) continue; /* its body is plain steps; its experts are a guess */
      if (st->kind != EL_STEP_CALL) {
        body_left = st->n_body, route_experts = st->n_experts;
        continue;
      }
      int lookup = reads_token_ids(pg, st), routed = body_left > 0;
      if (routed) body_left--;
      for (uint32_t ai = 0; ai < st->n_args; ai++) {
        const el_plan_arg* a = &st->args[ai];
        if (a->kind != EL_ARG_WEIGHT) continue;
        uint32_t experts = (a->flags & EL_FLAG_EXPERT) ? route_experts : 1;
        for (uint32_t e = 0; e < (experts ? experts : 1); e++) {
          uint32_t w = a->index + e * a->expert_stride;
          if (w >= n) continue;
          /* 1: must stay in memory; 2: read by row lookup only (a store may serve its rows on demand); 3: used
           * only in routed bodies (a store may cache them, reading each once it is selected) */
          if (routed) {
            u->must_pin[w] = plain[w] ? 1 : 3;
            continue;
          }
          plain[w] = 1;
          if (u->must_pin[w] == 3 || ++uses[w] > 1 || (u->must_pin[w] == 2 && !lookup)) u->must_pin[w] = 1;
          else if (lookup && !u->must_pin[w]) u->must_pin[w] = 2;
        }
      }
    }
  }
  /* the decode token's order: which step first needs each weight (a routed weight is a step of its own: a route
   * runs its selected experts one after another) */
  seq_fill f = {u, dec, 0, dec->n_steps};
  uint32_t j = 0;
  for (uint32_t si = 0; si < dec->n_steps && dec->present; si++) {
    const el_step* st = &dec->steps[si];
    if (st->kind == EL_STEP_PREDICT) continue; /* its body is plain steps; its experts are a guess */
    if (st->kind != EL_STEP_CALL) {
      f.j = j;
      route_weights(dec, si, add_to_seq, &f);
      j = f.j;
      si += st->n_body;
      continue;
    }
    for (uint32_t ai = 0; ai < st->n_args; ai++) {
      uint32_t w = st->args[ai].index;
      if (st->args[ai].kind != EL_ARG_WEIGHT || j >= dec->n_order || dec->order[j] != w) continue;
      u->seq[j] = w, u->seq_step[j] = si, j++;
    }
  }
  u->n_seq = j;
  free(uses), free(plain);
  return 0;
}

void el_weight_use_free(el_weight_use* u) {
  free(u->seq), free(u->seq_step), free(u->must_pin);
  memset(u, 0, sizeof *u);
}
