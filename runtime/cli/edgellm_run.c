/* edgellm-run: the C runtime's own command line, the binary a package carries in bin/ for its device.
 *
 * It is a thin front end over el_generate (runtime/core/generate.c), the loop the Python Runtime and every other front
 * end use: same defaults (the package's generation_config.json), same sampler, same stop rules, so for the same
 * arguments and seed it gives the same tokens as `edgellm run` and Runtime.generate.
 *
 * Built by compiler/device_binary.py from the libedgellm sources with the target's C compiler; for static targets
 * with the package's kernels linked in (-DEL_STATIC_KERNELS). No other dependency.
 */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <sys/stat.h>

#include "../edgellm.h"
#include "option_table.h"

#define USAGE                                                                                                       \
  "usage: edgellm-run PKG (-p TEXT | --ids 1,2,3) [generation options] [--stop STR ...] [--print-ids]\n"        \
  "                   [--dump-logits FILE] [--prompt-cache FILE] [--constraint FILE] [load options]\n"         \
  "  PKG                  package directory (made by `edgellm compile`)\n"                                      \
  "  -p, --prompt TEXT    prompt text (needs PKG/tokenizer.bin)\n"                                              \
  "  --ids LIST           prompt as token ids, comma- or space-separated\n"                                     \
  "  --stop STR           stop at this text (repeatable; the text never contains it)\n"                         \
  "  --print-ids          print the generated ids (space-separated) instead of text\n"                          \
  "  --dump-logits FILE   write the logits of every sampling step (vocab float32 rows, raw) to FILE\n"        \
  "  --prompt-cache FILE  a saved context: loaded first (the start of the prompt it holds is not prefilled\n"   \
  "                       again), saved after the run (created when missing; same package and settings)\n"    \
  "  --constraint FILE    output only what this automaton takes: a JSON schema or a regular expression\n"      \
  "                       compiled on a host with `edgellm schema SCHEMA.json -o FILE`\n"                       \
  "  --version            print the runtime version\n"                                                          \
  "generation options (sampling options not given come from the package's generation_config.json, else greedy;\n" \
  "the same table as edgellm run and Runtime.generate: runtime/python/options.py):\n"                           \
  EL_GEN_OPTIONS_USAGE                                                                                           \
  "load options (the same table as edgellm run and Runtime.load: runtime/python/options.py):\n"                 \
  EL_LOAD_OPTIONS_USAGE                                                                                          \
  "  NPU libraries: EDGELLM_ORT_LIB (default libonnxruntime.so), EDGELLM_QNN_EP_LIB (plugin EP; unset: QNN built\n" \
  "  into ORT), EDGELLM_QNN_BACKEND (default libQnnHtp.so); the OpenCL driver: libOpenCL.so\n"                  \
  "  (EDGELLM_OPENCL_LIBRARY: another path)\n"

#define MAX_STOPS 64

static int usage_error(const char* fmt, const char* arg) {
  fprintf(stderr, "edgellm-run: ");
  fprintf(stderr, fmt, arg);
  fprintf(stderr, " (see edgellm-run --help)\n");
  return 2;
}

static int fail(const char* what) {
  fprintf(stderr, "edgellm-run: error: %s: %s\n", what, el_last_error());
  return 1;
}

static int parse_long(const char* s, long lo, long hi, long* out) {
  char* end;
  errno = 0;
  long v = strtol(s, &end, 10);
  if (errno || end == s || *end || v < lo || v > hi) return -1;
  *out = v;
  return 0;
}

static int parse_float(const char* s, float* out) {
  char* end;
  errno = 0;
  float v = strtof(s, &end);
  if (errno || end == s || *end || !isfinite(v)) return -1;
  *out = v;
  return 0;
}

/* One option from the generated tables (option_table.h: runtime/python/options.py) into its struct: 0, or a usage
 * error. */
static int set_option(void* dst, const el_cli_option* o, const char* v) {
  char* field = (char*)dst + o->offset;
  char msg[512];
  long n;
  float f;
  switch (o->kind) {
    case EL_OPT_FLAG:
      *(int32_t*)field = 1;
      return 0;
    case EL_OPT_STR:
      *(const char**)field = v;
      return 0;
    case EL_OPT_U64: {
      char* end;
      errno = 0;
      unsigned long long u = strtoull(v, &end, 10);
      if (!errno && end != v && !*end && *v != '-') return *(uint64_t*)field = (uint64_t)u, 0;
      snprintf(msg, sizeof msg, "%s needs an integer >= 0, got '%%s'", o->flag);
      return usage_error(msg, v);
    }
    case EL_OPT_BYTES:
      if (el_parse_bytes(v, (uint64_t*)field) == 0) return 0;
      snprintf(msg, sizeof msg, "%s: %s", o->flag, el_last_error());
      return usage_error("%s", msg);
    case EL_OPT_INT:
      if (parse_long(v, (long)o->lo, (long)o->hi, &n) == 0) return *(int32_t*)field = (int32_t)n, 0;
      snprintf(msg, sizeof msg, "%s needs an integer from %g to %g, got '%%s'", o->flag, o->lo, o->hi);
      return usage_error(msg, v);
    case EL_OPT_FLOAT:
      if (parse_float(v, &f) == 0 && f >= o->lo && f <= o->hi) return *(float*)field = f, 0;
      snprintf(msg, sizeof msg, "%s needs a number from %g to %g, got '%%s'", o->flag, o->lo, o->hi);
      return usage_error(msg, v);
    case EL_OPT_BACKEND: { /* a backend's option: "backend.key" in choices, or the value is "backend.key=value" */
      static char lines[8192]; /* el_load_options.backend_options: the lines given so far */
      const char* spec = o->choices ? o->choices : v;
      const char *dot = strchr(spec, '.'), *eq = o->choices ? spec + strlen(spec) : strchr(v, '=');
      char backend[64], key[64];
      if (!dot || !eq || dot > eq || dot - spec >= (long)sizeof backend || eq - dot > (long)sizeof key) {
        snprintf(msg, sizeof msg, "%s needs BACKEND.KEY=VALUE, got '%%s'", o->flag);
        return usage_error(msg, v);
      }
      snprintf(backend, sizeof backend, "%.*s", (int)(dot - spec), spec);
      snprintf(key, sizeof key, "%.*s", (int)(eq - dot - 1), dot + 1);
      if (el_backend_options_add(lines, sizeof lines, backend, key, o->choices ? v : eq + 1) != 0) {
        snprintf(msg, sizeof msg, "%s: %s", o->flag, el_last_error());
        return usage_error("%s", msg);
      }
      *(const char**)field = lines;
      return 0;
    }
    default: { /* EL_OPT_CHOICE: "a|b" (a string field) or "a=N|b=M" (an int32 field) */
      size_t len = strlen(v);
      for (const char* c = o->choices; *c;) {
        const char* end = c + strcspn(c, "|");
        const char* eq = memchr(c, '=', (size_t)(end - c));
        size_t name_len = (size_t)((eq ? eq : end) - c);
        if (name_len == len && !strncmp(c, v, len)) {
          if (eq) *(int32_t*)field = (int32_t)strtol(eq + 1, NULL, 10);
          else *(const char**)field = v;
          return 0;
        }
        c = *end ? end + 1 : end;
      }
      snprintf(msg, sizeof msg, "%s takes one of %s, got '%%s'", o->flag, o->choices);
      return usage_error(msg, v);
    }
  }
}

/* "1,2, 3" -> ids; returns the count or -1 (bad number). */
static int parse_ids(const char* s, int32_t** out) {
  int cap = 16, n = 0;
  int32_t* ids = malloc(sizeof *ids * (size_t)cap);
  if (!ids) return -1;
  while (*s) {
    while (*s == ',' || *s == ' ' || *s == '\t' || *s == '\n') s++;
    if (!*s) break;
    char* end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || v < 0 || v > INT32_MAX || (*end && *end != ',' && *end != ' ' && *end != '\t')) {
      free(ids);
      return -1;
    }
    if (n == cap) {
      int32_t* g = cap < (1 << 24) ? realloc(ids, sizeof *ids * (size_t)(cap *= 2)) : NULL;
      if (!g) {
        free(ids);
        return -1;
      }
      ids = g;
    }
    ids[n++] = (int32_t)v;
    s = end;
  }
  *out = ids;
  return n;
}

int main(int argc, char** argv) {
  const char *pkg = NULL, *prompt = NULL, *ids_arg = NULL, *dump_path = NULL, *draft_path = NULL, *cache_path = NULL;
  const char* constraint_path = NULL;
  const char* stops[MAX_STOPS];
  int n_stops = 0, print_ids = 0;
  el_load_options opt;
  el_load_options_init(&opt);
  el_gen_params given; /* generation options as given; the rest come from the package (el_gen_params_default) */
  memset(&given, 0, sizeof given);
  uint32_t given_mask = 0; /* bit k: EL_GEN_OPTIONS[k] was given */
  _Static_assert(sizeof EL_GEN_OPTIONS / sizeof *EL_GEN_OPTIONS <= 32, "a bit per generation option");

  for (int i = 1; i < argc; i++) {
    const char* a = argv[i];
    const char* v = i + 1 < argc ? argv[i + 1] : NULL;
#define NEED_VALUE \
  if (!v) return usage_error("option %s needs a value", a); \
  i++;
    if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
      fputs(USAGE, stdout);
      return 0;
    } else if (!strcmp(a, "--version")) {
      printf("edgellm-run %s\n", el_version());
      return 0;
    } else if (!strcmp(a, "-p") || !strcmp(a, "--prompt")) {
      NEED_VALUE prompt = v;
    } else if (!strcmp(a, "--ids")) {
      NEED_VALUE ids_arg = v;
    } else if (!strcmp(a, "--stop")) {
      NEED_VALUE if (!*v) return usage_error("%s", "--stop needs a non-empty string");
      if (n_stops == MAX_STOPS) return usage_error("%s", "too many --stop strings (at most 64)");
      stops[n_stops++] = v;
    } else if (!strcmp(a, "--print-ids")) {
      print_ids = 1;
    } else if (!strcmp(a, "--dump-logits")) {
      NEED_VALUE dump_path = v;
    } else if (!strcmp(a, "--prompt-cache")) {
      NEED_VALUE if (!*v) return usage_error("%s", "--prompt-cache needs a file name");
      cache_path = v;
    } else if (!strcmp(a, "--constraint")) {
      NEED_VALUE size_t len = strlen(v);
      if (len > 5 && !strcmp(v + len - 5, ".json"))
        return usage_error("--constraint %s: give the automaton compiled from the schema (edgellm schema SCHEMA.json "
                           "-o FILE), not the schema", v);
      constraint_path = v;
    } else if (!strcmp(a, "--speculate") && v && strcmp(v, "off") && strcmp(v, "auto") && strcmp(v, "ngram") &&
               strcmp(v, "recycle")) {
      struct stat st_draft;
      if (stat(v, &st_draft) != 0 || !S_ISDIR(st_draft.st_mode))
        return usage_error("--speculate %s: choose off, auto, ngram or recycle, or give a draft package's directory", v);
      NEED_VALUE draft_path = v; /* a draft package: auto mode, its guesses where no n-gram matches */
      a = "--speculate", v = "auto";
      for (size_t k = 0; k < sizeof EL_GEN_OPTIONS / sizeof *EL_GEN_OPTIONS; k++)
        if (!strcmp(a, EL_GEN_OPTIONS[k].flag)) {
          int rc = set_option(&given, &EL_GEN_OPTIONS[k], v);
          if (rc) return rc;
          given_mask |= 1u << k;
        }
    } else if (a[0] == '-' && a[1]) { /* the tables: generation options, then load options */
      const el_cli_option* o = NULL;
      void* dst = &given;
      for (size_t k = 0; k < sizeof EL_GEN_OPTIONS / sizeof *EL_GEN_OPTIONS && !o; k++)
        if (!strcmp(a, EL_GEN_OPTIONS[k].flag) || (EL_GEN_OPTIONS[k].short_flag && !strcmp(a, EL_GEN_OPTIONS[k].short_flag)))
          o = &EL_GEN_OPTIONS[k], given_mask |= 1u << k;
      for (size_t k = 0; k < sizeof EL_LOAD_OPTIONS / sizeof *EL_LOAD_OPTIONS && !o; k++)
        if (!strcmp(a, EL_LOAD_OPTIONS[k].flag)) o = &EL_LOAD_OPTIONS[k], dst = &opt;
      if (!o) return usage_error("unknown option %s", a);
      if (o->kind != EL_OPT_FLAG) {
        NEED_VALUE
      }
      int rc = set_option(dst, o, o->kind == EL_OPT_FLAG ? NULL : v);
      if (rc) return rc;
    } else if (!pkg) {
      pkg = a;
    } else {
      return usage_error("unexpected argument '%s': give one package directory", a);
    }
#undef NEED_VALUE
  }
  if (!pkg) return usage_error("%s", "give a package directory");
  if (!prompt == !ids_arg) return usage_error("%s", "give the prompt with exactly one of -p TEXT or --ids 1,2,3");

  /* from here every exit goes through `done`, which frees what was made (leak-free under LeakSanitizer too) */
  int rc = 1;
  el_model *m = NULL, *dm = NULL;
  el_context *c = NULL, *draft_c = NULL;
  el_constraint* constraint = NULL;
  int32_t *ids = NULL, *held = NULL; /* held: the ids the context holds (--prompt-cache) */
  FILE* dump = NULL;
  /* ONNX Runtime's libraries: the NPU backend reads EDGELLM_ORT_LIB / EDGELLM_QNN_EP_LIB / EDGELLM_QNN_BACKEND */
  /* Qualcomm's HTP libraries print a banner on stdout when they load; the generated text owns stdout here. */
  int saved_stdout = opt.prefill_backend != EL_PREFILL_CPU ? dup(1) : -1;
  if (saved_stdout >= 0) fflush(stdout), dup2(2, 1);
  m = el_model_load(pkg, &opt);
  if (saved_stdout >= 0) fflush(stdout), dup2(saved_stdout, 1), close(saved_stdout);
  if (!m) {
    fail("cannot load the package");
    goto done;
  }
  int V = el_vocab(m);
  if (prompt && !el_has_tokenizer(m)) {
    fprintf(stderr, "edgellm-run: error: this package has no tokenizer.bin: pass token ids with --ids\n");
    goto done;
  }
  if (!el_has_tokenizer(m)) print_ids = 1; /* no way to print text: print ids */

  int n_prompt;
  if (ids_arg) {
    if ((n_prompt = parse_ids(ids_arg, &ids)) < 0) {
      rc = usage_error("--ids needs non-negative integers separated by commas, got '%s'", ids_arg);
      goto done;
    }
  } else {
    int len = (int)strlen(prompt);
    n_prompt = el_encode(m, prompt, len, -1, NULL, 0);
    if (n_prompt < 0 || !(ids = malloc(sizeof *ids * (size_t)(n_prompt + 1))) ||
        el_encode(m, prompt, len, -1, ids, n_prompt) != n_prompt) {
      fail("cannot tokenize the prompt");
      goto done;
    }
  }
  if (n_prompt == 0) {
    fprintf(stderr, "edgellm-run: error: empty prompt: give some text or token ids\n");
    goto done;
  }

  el_gen_params gp;
  el_gen_params_default(m, &gp);
  for (size_t k = 0; k < sizeof EL_GEN_OPTIONS / sizeof *EL_GEN_OPTIONS; k++)
    if (given_mask >> k & 1) /* what was given replaces the package's default */
      memcpy((char*)&gp + EL_GEN_OPTIONS[k].offset, (const char*)&given + EL_GEN_OPTIONS[k].offset,
             EL_GEN_OPTIONS[k].kind == EL_OPT_U64 ? sizeof(uint64_t) : sizeof(int32_t));
  gp.n_stop_strings = n_stops;
  gp.stop_strings = stops;
  if (constraint_path && !(gp.constraint = constraint = el_constraint_load(constraint_path))) {
    fail("--constraint");
    goto done;
  }

  if (dump_path && !(dump = fopen(dump_path, "wb"))) {
    fprintf(stderr, "edgellm-run: error: cannot write %s: %s\n", dump_path, strerror(errno));
    goto done;
  }
  if (!(c = el_context_new(m, 0))) {
    fail("cannot create a context");
    goto done;
  }
  if (draft_path) { /* the draft package: same tokenizer, its own context, default load options */
    el_load_options dopt;
    el_load_options_init(&dopt);
    dopt.n_threads = opt.n_threads;
    if (!(dm = el_model_load(draft_path, &dopt)) || el_draft_check(m, dm) != 0 || !(draft_c = el_context_new(dm, 0))) {
      fprintf(stderr, "edgellm-run: error: --speculate %s: not off, auto or ngram, nor a draft package that fits: %s\n",
              draft_path, el_last_error());
      goto done;
    }
    gp.draft = draft_c;
  }

  int max_ctx = el_max_context(m), n_held = 0, cached = 0;
  if (cache_path && !(held = malloc(sizeof *held * (size_t)max_ctx))) {
    fail("out of memory");
    goto done;
  }
  struct stat st_cache;
  if (cache_path && stat(cache_path, &st_cache) == 0) { /* what it holds of the prompt is not prefilled again */
    if ((n_held = el_context_load(c, cache_path)) < 0 || el_context_tokens(c, held, max_ctx) != n_held) {
      fail("--prompt-cache");
      goto done;
    }
    while (cached < n_held && cached < n_prompt - 1 && held[cached] == ids[cached]) cached++;
    if (cached && cached < el_rewind_floor(c)) cached = 0; /* window caches no longer hold what it needs */
    if (cached && el_rewind(c, cached) != 0) {
      fail("--prompt-cache");
      goto done;
    }
    gp.keep_context = cached > 0, gp.n_cached = cached;
  }

  /* the loop is el_generate's; this only prints what it hands out */
  if (el_generate_start(c, ids, n_prompt, &gp) != 0) {
    fail("cannot start the generation");
    goto done;
  }
  int n_out = 0;
  for (;;) {
    el_event ev;
    int r = el_generate_next(c, &ev);
    if (r < 0) {
      fail("generation failed");
      goto done;
    }
    if (dump && ev.logits && fwrite(ev.logits, sizeof(float), (size_t)V, dump) != (size_t)V) {
      fprintf(stderr, "edgellm-run: error: cannot write %s: %s\n", dump_path, strerror(errno));
      goto done;
    }
    if (r == 1 && print_ids) printf(n_out++ ? " %d" : "%d", (int)ev.token);
    if (!print_ids && ev.text_len) fwrite(ev.text, 1, (size_t)ev.text_len, stdout);
    fflush(stdout);
    if (r == 0 || ev.finish) break;
  }
  putchar('\n');
  fflush(stdout);
  if (dump) {
    int bad = fclose(dump) != 0;
    dump = NULL;
    if (bad) {
      fprintf(stderr, "edgellm-run: error: cannot write %s: %s\n", dump_path, strerror(errno));
      goto done;
    }
  }
  if (cache_path) { /* the prompt and the reply, as the context holds them */
    if (el_context_save(c, cache_path, -1) != 0) {
      fail("--prompt-cache");
      goto done;
    }
    fprintf(stderr, "[prompt cache %s: %d of %d prompt tokens were in it; it now holds %d]\n", cache_path, cached,
            n_prompt, el_pos(c));
  }
  el_gen_result res;
  el_generate_result(c, &res);
  static const char* const reasons[] = {"none", "eos", "stop", "length", "context", "cancelled"};
  double pf = res.prefill_seconds > 0 ? res.prompt_tokens / res.prefill_seconds : 0.0;
  double dc = res.decode_seconds > 0 ? res.decoded_tokens / res.decode_seconds : 0.0;
  char note[1024];
  int on_npu = el_model_prefill_backend(m, note, sizeof note) == EL_PREFILL_NPU;
  if (!on_npu && note[0]) fprintf(stderr, "edgellm-run: note: prefill on the CPU: %s\n", note);
  el_memory_plan mp;
  memset(&mp, 0, sizeof mp);
  el_stats st;
  el_get_stats(c, &st);
  if (el_model_memory(m, &mp) == 0 && (mp.streamed_bytes || mp.routed_cache_bytes < mp.routed_bytes))
    fprintf(stderr, "[weights: %.1f MB pinned + %.1f MB window, %.1f MB streamed per token from %s%s; read %.1f MB in "
            "%llu requests, %.2f s waiting for reads]\n", mp.pinned_bytes / 1e6, mp.window_bytes / 1e6,
            mp.streamed_bytes / 1e6, mp.storage, mp.storage_modelled ? " (modelled)" : "", st.io_bytes_read / 1e6,
            (unsigned long long)st.io_requests, st.io_stall_seconds);
  if (st.expert_selected) /* the expert cache over decode: what the selections found, how well the guesses did */
    fprintf(stderr, "[experts: %llu selected in decode: %.1f%% cached, %.1f%% read ahead on a guess, %.1f%% waited "
            "for (%.3f s); guesses %.1f%% recall, %llu reads, %llu unused; %.2f MB read per decoded token]\n",
            (unsigned long long)st.expert_selected, 100.0 * st.expert_cached / st.expert_selected,
            100.0 * st.expert_prefetched / st.expert_selected, 100.0 * st.expert_stalls / st.expert_selected,
            st.decode_io_stall_seconds,
            st.expert_predict_checked ? 100.0 * st.expert_predicted / st.expert_predict_checked : 0.0,
            (unsigned long long)st.expert_predict_reads, (unsigned long long)st.expert_predict_wasted,
            st.decode_tokens ? st.decode_io_bytes_read / 1e6 / (double)st.decode_tokens : 0.0);
  if (st.routed_possible) /* experts / neuron groups: how many ran, what a decoded token read, what was cached */
    fprintf(stderr, "[routed: %.1f%% of %llu experts or neuron groups run, %.2f MB of weights read per decoded "
            "token; %.1f MB cache of %.1f MB, %llu hits, %llu reads]\n",
            100.0 * (double)st.routed_selected / (double)st.routed_possible, (unsigned long long)st.routed_possible,
            st.decode_tokens ? st.decode_weight_bytes_read / 1e6 / (double)st.decode_tokens : 0.0,
            mp.routed_cache_bytes / 1e6, mp.routed_bytes / 1e6, (unsigned long long)st.io_routed_hits,
            (unsigned long long)st.io_routed_misses);
  if (mp.budget) /* how the budget was read, as every front end reads it (el_parse_bytes) */
    fprintf(stderr, "[memory budget %llu bytes, weight policy %s]\n", (unsigned long long)mp.budget, mp.policy);
  if (st.spec_passes) /* speculative decoding: what the drafts saved */
    fprintf(stderr, "[speculative: %llu passes carried %llu drafts, %llu taken: %.2f tokens per pass]\n",
            (unsigned long long)st.spec_passes, (unsigned long long)st.spec_drafted,
            (unsigned long long)st.spec_accepted, (double)(st.spec_passes + st.spec_accepted) / (double)st.spec_passes);
  if (st.spec_drafted_model) /* the draft package's share: its guesses and its branches where it was unsure */
    fprintf(stderr, "[draft model: %llu of the drafts, %llu taken (%llu of them its second or third choice)]\n",
            (unsigned long long)st.spec_drafted_model, (unsigned long long)st.spec_accepted_model,
            (unsigned long long)st.spec_accepted_branch);
  if (st.context_shifts) /* the conversation outgrew the context and went on */
    fprintf(stderr, "[context shift: %llu times, %llu kept tokens run again]\n", (unsigned long long)st.context_shifts,
            (unsigned long long)st.shift_tokens_run);
  fprintf(stderr, "[%d prompt tokens, %d generated (%s); prefill %.1f tok/s%s, decode %.1f tok/s, %d threads]\n",
          res.prompt_tokens, res.generated_tokens, reasons[res.finish < 6 ? res.finish : 0], pf,
          on_npu ? " (NPU)" : "", dc, el_context_threads(c));
  rc = 0;
done:
  if (dump) fclose(dump);
  el_context_free(c);
  el_model_free(m);
  el_context_free(draft_c);
  el_model_free(dm);
  el_constraint_free(constraint);
  free(ids);
  free(held);
  return rc;
}
