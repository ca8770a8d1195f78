/* edgellm-run: the C runtime's own command line, the binary a package carries in bin/ for its device.
 *
 *   edgellm-run PKG (-p TEXT | --ids 1,2,3) [-n N] [--temperature T] [--top-k K] [--top-p P]
 *               [--repetition-penalty R] [--seed S] [--threads N] [--ignore-eos] [--print-ids]
 *               [--dump-logits FILE]
 *
 * Streams the generated text to stdout (--print-ids: the generated ids, space-separated, instead) and ends with
 * a tok/s summary on stderr. The generation loop is the Python Runtime's (runtime/api.py): prefill the prompt,
 * sample, stop at EOS (unless --ignore-eos), at N tokens or when the context is full; with the same seed it
 * draws the same tokens. --dump-logits writes, per sampling step, the vocab float32 logits (native byte order,
 * raw, no header) the token was sampled from: one row per generated token, plus one for an EOS that ends the
 * generation.
 *
 * Built by compiler/device_binary.py from the libedgellm sources (runtime.c, threadpool.c, sampler.c,
 * weight_store.c, tokenizer.c when present: -DEL_HAVE_TOKENIZER) with the target's C compiler; for static
 * targets with the package's kernels linked in (-DEL_STATIC_KERNELS, see runtime.c). No other dependency.
 */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "edgellm.h"
#ifdef EL_HAVE_TOKENIZER
#include "tokenizer.h"
#endif

#define USAGE                                                                                                       \
  "usage: edgellm-run PKG (-p TEXT | --ids 1,2,3) [-n N] [--temperature T] [--top-k K] [--top-p P]\n"            \
  "                   [--repetition-penalty R] [--seed S] [--threads N] [--ignore-eos] [--print-ids]\n"          \
  "                   [--dump-logits FILE]\n"                                                                    \
  "  PKG                  package directory (made by `edgellm compile`)\n"                                      \
  "  -p, --prompt TEXT    prompt text (needs PKG/tokenizer.bin)\n"                                              \
  "  --ids LIST           prompt as token ids, comma- or space-separated\n"                                     \
  "  -n, --max-new-tokens N   tokens to generate (default 128)\n"                                               \
  "  --temperature T      0 = greedy (default 0)\n"                                                             \
  "  --top-k K            0 = off (default 0)\n"                                                                \
  "  --top-p P            1 = off (default 1)\n"                                                                \
  "  --repetition-penalty R   1 = off (default 1)\n"                                                            \
  "  --seed S             sampling seed (default: random)\n"                                                    \
  "  --threads N          threads (default: one per CPU)\n"                                                     \
  "  --ignore-eos         keep generating past end-of-sequence tokens\n"                                        \
  "  --print-ids          print the generated ids (space-separated) instead of text\n"                          \
  "  --dump-logits FILE   write the logits of every sampling step (vocab float32 rows, raw) to FILE\n"        \
  "  --version            print the runtime version\n"

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
  if (errno || end == s || *end || v != v) return -1;
  *out = v;
  return 0;
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
      int32_t* g = realloc(ids, sizeof *ids * (size_t)(cap *= 2));
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

static uint64_t random_seed(void) {
  uint64_t s = 0;
  int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
  if (fd >= 0) {
    if (read(fd, &s, sizeof s) != (ssize_t)sizeof s) s = 0;
    close(fd);
  }
  if (!s) {
    struct timespec t;
    clock_gettime(CLOCK_REALTIME, &t);
    s = (uint64_t)t.tv_sec * 1000000007ull ^ (uint64_t)t.tv_nsec ^ ((uint64_t)getpid() << 32);
  }
  return s;
}

static int is_eos(const int32_t* eos, int n_eos, int32_t id) {
  for (int i = 0; i < n_eos; i++)
    if (eos[i] == id) return 1;
  return 0;
}

int main(int argc, char** argv) {
  const char *pkg = NULL, *prompt = NULL, *ids_arg = NULL, *dump_path = NULL;
  long max_new = 128, threads = 0, top_k = 0;
  float temperature = 0.0f, top_p = 1.0f, rep = 1.0f;
  uint64_t seed = 0;
  int have_seed = 0, ignore_eos = 0, print_ids = 0;

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
    } else if (!strcmp(a, "-n") || !strcmp(a, "--max-new-tokens")) {
      NEED_VALUE if (parse_long(v, 0, INT_MAX, &max_new)) return usage_error("-n needs an integer >= 0, got '%s'", v);
    } else if (!strcmp(a, "--temperature")) {
      NEED_VALUE if (parse_float(v, &temperature) || temperature < 0)
          return usage_error("--temperature must be >= 0 (0 = greedy), got '%s'", v);
    } else if (!strcmp(a, "--top-k")) {
      NEED_VALUE if (parse_long(v, 0, INT32_MAX, &top_k))
          return usage_error("--top-k must be an integer >= 0 (0 = off), got '%s'", v);
    } else if (!strcmp(a, "--top-p")) {
      NEED_VALUE if (parse_float(v, &top_p) || !(top_p > 0 && top_p <= 1))
          return usage_error("--top-p must be in (0, 1], got '%s'", v);
    } else if (!strcmp(a, "--repetition-penalty")) {
      NEED_VALUE if (parse_float(v, &rep) || !(rep > 0))
          return usage_error("--repetition-penalty must be > 0 (1 = off), got '%s'", v);
    } else if (!strcmp(a, "--seed")) {
      NEED_VALUE char* end;
      errno = 0;
      unsigned long long sv = strtoull(v, &end, 10);
      if (errno || end == v || *end || *v == '-') return usage_error("--seed needs an integer >= 0, got '%s'", v);
      seed = (uint64_t)sv, have_seed = 1;
    } else if (!strcmp(a, "--threads")) {
      NEED_VALUE if (parse_long(v, 0, 256, &threads))
          return usage_error("--threads needs an integer in 0..256 (0: one per CPU), got '%s'", v);
    } else if (!strcmp(a, "--ignore-eos")) {
      ignore_eos = 1;
    } else if (!strcmp(a, "--print-ids")) {
      print_ids = 1;
    } else if (!strcmp(a, "--dump-logits")) {
      NEED_VALUE dump_path = v;
    } else if (a[0] == '-' && a[1]) {
      return usage_error("unknown option %s", a);
    } else if (!pkg) {
      pkg = a;
    } else {
      return usage_error("unexpected argument '%s': give one package directory", a);
    }
#undef NEED_VALUE
  }
  if (!pkg) return usage_error("%s", "give a package directory");
  if (!prompt == !ids_arg) return usage_error("%s", "give the prompt with exactly one of -p TEXT or --ids 1,2,3");

  /* tokenizer: needed for -p, used for text output when present */
  void* tok = NULL;
  char tok_path[4096];
  snprintf(tok_path, sizeof tok_path, "%s/tokenizer.bin", pkg);
  int have_tok_file = access(tok_path, R_OK) == 0;
#ifdef EL_HAVE_TOKENIZER
  if (have_tok_file && (prompt || !print_ids)) {
    tok = el_tok_load(tok_path);
    if (!tok) return fail("cannot load tokenizer.bin");
  }
#endif
  if (prompt && !tok) {
    if (!have_tok_file)
      fprintf(stderr, "edgellm-run: error: this package has no tokenizer.bin: pass token ids with --ids\n");
    else
      fprintf(stderr, "edgellm-run: error: this edgellm-run was built without the tokenizer: pass token ids with "
                      "--ids\n");
    return 1;
  }
  if (!tok) print_ids = 1; /* no way to print text: print ids */

  el_model* m = el_load(pkg, (int)threads);
  if (!m) return fail("cannot load the package");
  int V = el_vocab(m), max_ctx = el_max_context(m);

  int32_t* ids = NULL;
  int n_prompt;
  if (ids_arg) {
    n_prompt = parse_ids(ids_arg, &ids);
    if (n_prompt < 0) return usage_error("--ids needs non-negative integers separated by commas, got '%s'", ids_arg);
  } else {
#ifdef EL_HAVE_TOKENIZER
    int len = (int)strlen(prompt);
    n_prompt = el_tok_encode(tok, prompt, len, -1, NULL, 0);
    if (n_prompt < 0) return fail("cannot tokenize the prompt");
    ids = malloc(sizeof *ids * (size_t)(n_prompt + 1));
    if (!ids || el_tok_encode(tok, prompt, len, -1, ids, n_prompt) != n_prompt) return fail("cannot tokenize the prompt");
#else
    n_prompt = 0;
#endif
  }
  if (n_prompt == 0) {
    fprintf(stderr, "edgellm-run: error: empty prompt: give some text or token ids\n");
    return 1;
  }
  if (n_prompt > max_ctx) {
    fprintf(stderr, "edgellm-run: error: prompt has %d tokens but the package's context is %d: shorten it or "
            "recompile with a larger --max-context\n", n_prompt, max_ctx);
    return 1;
  }

  FILE* dump = NULL;
  if (dump_path && !(dump = fopen(dump_path, "wb"))) {
    fprintf(stderr, "edgellm-run: error: cannot write %s: %s\n", dump_path, strerror(errno));
    return 1;
  }
  int32_t eos[8];
  int n_eos = el_eos_ids(m, eos, 8);
  if (n_eos > 8) n_eos = 8;
  el_sampler_params sp = {temperature, (int32_t)top_k, top_p, rep, have_seed ? seed : random_seed()};
  el_sampler* smp = el_sampler_new(&sp);
  float* logits = malloc(sizeof(float) * (size_t)V);
  int32_t* history = malloc(sizeof(int32_t) * ((size_t)n_prompt + (size_t)max_new + 1));
  if (!smp || !logits || !history) return fail("out of memory");
  memcpy(history, ids, sizeof(int32_t) * (size_t)n_prompt);
  int nh = n_prompt, n_gen = 0;
  const char* reason = "length";

  if (el_prefill(m, ids, n_prompt, logits, 0) != 0) return fail("prefill failed");
  char piece[256];
  for (long i = 0; i < max_new; i++) {
    if (dump && fwrite(logits, sizeof(float), (size_t)V, dump) != (size_t)V) {
      fprintf(stderr, "edgellm-run: error: cannot write %s: %s\n", dump_path, strerror(errno));
      return 1;
    }
    int32_t t = el_sample(smp, logits, V, history, nh);
    if (is_eos(eos, n_eos, t) && !ignore_eos) {
      reason = "eos";
      break;
    }
    history[nh++] = t;
    n_gen++;
    if (print_ids) {
      printf(n_gen > 1 ? " %d" : "%d", (int)t);
    } else {
#ifdef EL_HAVE_TOKENIZER
      if (!el_tok_is_special(tok, t)) {
        int k = el_tok_decode(tok, t, piece, (int)sizeof piece);
        if (k > 0) fwrite(piece, 1, (size_t)(k < (int)sizeof piece ? k : (int)sizeof piece), stdout);
      }
#endif
    }
    fflush(stdout);
    if (i + 1 == max_new) break;
    if (el_pos(m) >= max_ctx) {
      reason = "context";
      break;
    }
    if (el_decode(m, t, logits) != 0) return fail("decode failed");
  }
  (void)piece;
  putchar('\n');
  fflush(stdout);
  if (dump && fclose(dump) != 0) {
    fprintf(stderr, "edgellm-run: error: cannot write %s: %s\n", dump_path, strerror(errno));
    return 1;
  }

  el_stats st;
  el_get_stats(m, &st);
  double pf = st.prefill_seconds > 0 ? (double)st.prefill_tokens / st.prefill_seconds : 0.0;
  double dc = st.decode_seconds > 0 ? (double)st.decode_tokens / st.decode_seconds : 0.0;
  fprintf(stderr, "[%d prompt tokens, %d generated (%s); prefill %.1f tok/s, decode %.1f tok/s, %d threads]\n",
          n_prompt, n_gen, reason, pf, dc, el_threads(m));
  el_sampler_free(smp);
  el_free(m);
#ifdef EL_HAVE_TOKENIZER
  el_tok_free(tok);
#endif
  free(ids);
  free(logits);
  free(history);
  return 0;
}
