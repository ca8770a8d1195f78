#define _GNU_SOURCE /* strnlen */
/* The backends' own load options: "backend.key=value" lines the core checks by name and hands over uninterpreted
 * (edgellm_backend.h). What a key means is the backend's business; the core only knows that a backend declares
 * the keys it reads and which packages use it. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "el_internal.h"

static int declares(const el_backend* be, const char* key) {
  for (const char* const* k = be->options; k && *k; k++)
    if (!strcmp(*k, key)) return 1;
  return 0;
}

static const el_backend* used_backend(const el_model* m, const char* name) {
  for (int b = 0; b < m->n_backends; b++)
    if (!strcmp(m->backends[b].be->name, name)) return m->backends[b].be;
  return NULL;
}

/* "npu_soc" -> "npu-soc": the option as the command lines spell it */
static void dashed(char* out, size_t cap, const char* key) {
  snprintf(out, cap, "%s", key);
  for (char* p = out; *p; p++)
    if (*p == '_') *p = '-';
}

int el_backend_options_parse(el_model* m, const char* text) {
  m->n_backend_opts = 0;
  if (!text || !*text) return 0;
  if (!(m->backend_opts_text = strdup(text))) return el_error("out of memory");
  for (char *line = m->backend_opts_text, *next; line; line = next) {
    next = strchr(line, '\n');
    if (next) *next++ = 0;
    if (!*line) continue;
    char *dot = strchr(line, '.'), *eq = strchr(line, '=');
    if (!dot || !eq || dot > eq || dot == line || eq == dot + 1)
      return el_error("backend option \"%.80s\": write it as backend.key=value (e.g. opencl.device=0:1)", line);
    *dot = 0, *eq = 0;
    const char *backend = line, *key = dot + 1, *value = eq + 1;
    const el_backend* be = el_backend_find(backend);
    if (!be) {
      char names[256];
      el_backend_names(names, sizeof names);
      return el_error("backend option %s.%s: there is no backend \"%s\" (registered: %s)", backend, key, backend,
                      names);
    }
    if (!declares(be, key)) {
      char keys[256] = "";
      size_t at = 0;
      for (const char* const* k = be->options; k && *k && at < sizeof keys; k++)
        at += (size_t)snprintf(keys + at, sizeof keys - at, "%s%s", at ? ", " : "", *k);
      return el_error("backend %s has no option \"%s\" (%s%s)", backend, key, keys[0] ? "it takes: " : "it takes none",
                      keys);
    }
    /* a set value for a backend this package does not use is an error, not silently ignored; "" / "auto" are the
     * default and fit every package */
    if (*value && strcmp(value, "auto") != 0 && !used_backend(m, backend)) {
      char d[64];
      dashed(d, sizeof d, key);
      return el_error("%s applies to %s; this package has none", d, be->packages ? be->packages : backend);
    }
    if (m->n_backend_opts == EL_MAX_BACKEND_OPTIONS)
      return el_error("more than %d backend options", EL_MAX_BACKEND_OPTIONS);
    m->backend_opts[m->n_backend_opts++] = (el_backend_opt){backend, key, value};
  }
  return 0;
}

EL_API const char* el_backend_option(const el_model* m, const char* backend, const char* key) {
  const char* found = NULL; /* the last one given wins */
  for (int i = 0; m && backend && key && i < m->n_backend_opts; i++)
    if (!strcmp(m->backend_opts[i].backend, backend) && !strcmp(m->backend_opts[i].key, key))
      found = m->backend_opts[i].value;
  return found && *found ? found : NULL;
}

static int clean_part(const char* s, int value) {
  if (!s || (!value && !*s)) return 0;
  for (; *s; s++)
    if (*s == '\n' || *s == '\r' || (!value && (*s == '.' || *s == '='))) return 0;
  return 1;
}

EL_API int el_backend_options_add(char* buf, size_t cap, const char* backend, const char* key, const char* value) {
  if (!buf || !clean_part(backend, 0) || !clean_part(key, 0) || !clean_part(value, 1))
    return el_error("backend option %s.%s: a backend, a key and a value without line breaks are needed",
                    backend ? backend : "?", key ? key : "?");
  size_t at = strnlen(buf, cap);
  int n = at < cap ? snprintf(buf + at, cap - at, "%s.%s=%s\n", backend, key, value) : -1;
  if (n < 0 || (size_t)n >= cap - at) {
    if (at < cap) buf[at] = 0;
    return el_error("backend option %s.%s: too long for the %zu-byte buffer", backend, key, cap);
  }
  return 0;
}
