/* A backend outside libedgellm: counts what the runtime asks of it and delegates everything to another registered
 * backend (tests/test_c_runtime.py registers it as "trace" over "tvm_cpu"). It sees only the public headers and links
 * against libedgellm like any application would. */
#include <stdio.h>
#include <stdlib.h>

#include "edgellm_backend.h"

typedef struct {
  void* inner;
} trace_state;

static const el_backend* inner;
long trace_opens, trace_closes, trace_binds, trace_unbinds, trace_runs[16];
unsigned trace_programs; /* the programs open was given */
char trace_label[64];    /* its own load option "label" (backend option trace.label), as open read it */

static int t_open(el_model* m, const char* dir, unsigned programs, void** state) {
  trace_state* s = calloc(1, sizeof *s);
  if (!s) return el_backend_error("out of memory");
  if (inner->open(m, dir, programs, &s->inner) != 0) {
    free(s);
    return -1;
  }
  trace_opens++, trace_programs = programs;
  const char* label = el_backend_option(m, "trace", "label");
  snprintf(trace_label, sizeof trace_label, "%s", label ? label : "");
  *state = s;
  return 0;
}

static void t_close(void* state) {
  trace_state* s = state;
  inner->close(s->inner);
  free(s);
  trace_closes++;
}

static int t_bind(void* state, el_context* c, void** ctx_state) {
  trace_binds++;
  return inner->bind ? inner->bind(((trace_state*)state)->inner, c, ctx_state) : 0;
}

static void t_unbind(void* ctx_state) {
  trace_unbinds++;
  if (inner->unbind) inner->unbind(ctx_state);
}

static int t_run(void* state, void* ctx_state, el_context* c, int prog, int pos) {
  if (prog >= 0 && prog < 16) trace_runs[prog]++;
  return inner->run(((trace_state*)state)->inner, ctx_state, c, prog, pos);
}

static const char* const trace_options[] = {"label", NULL};
const el_backend trace_backend = {"trace", 0, t_open, t_close, t_bind, t_unbind, t_run, trace_options,
                                  "packages whose plan names the trace backend", NULL};

/* Registers "trace" over the backend called `over`: 0, or -1 with el_last_error set. */
int trace_register(const char* over) {
  if (!(inner = el_backend_find(over))) return el_backend_error("trace: no backend to delegate to");
  return el_backend_register(&trace_backend);
}
