#define _GNU_SOURCE /* strnlen */
/* The backend registry (edgellm_backend.h): name -> backend, the built-ins first, then whatever an application
 * registers. Plans name backends by string; plans older than version 4 named them by index, which maps here. */
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "../core/el_internal.h"

#define MAX_BACKENDS 32

static const el_backend* registry[MAX_BACKENDS] = {&el_backend_tvm_cpu, &el_backend_qnn_ort, &el_backend_opencl};
static int n_registered = 3;
static pthread_mutex_t registry_mu = PTHREAD_MUTEX_INITIALIZER;

/* The backend indices of version 2 and 3 plans (their el_plan_program_v3.backend). */
static const char* const LEGACY_NAMES[] = {"tvm_cpu", "qnn_ort", "opencl"};

const char* el_backend_legacy_name(uint32_t index) {
  return index < sizeof LEGACY_NAMES / sizeof *LEGACY_NAMES ? LEGACY_NAMES[index] : NULL;
}

static int valid_name(const char* name) {
  size_t n = name ? strnlen(name, EL_BACKEND_NAME_BYTES) : 0;
  return n > 0 && n < EL_BACKEND_NAME_BYTES;
}

EL_API const el_backend* el_backend_find(const char* name) {
  if (!valid_name(name)) return NULL;
  const el_backend* found = NULL;
  pthread_mutex_lock(&registry_mu);
  for (int i = 0; i < n_registered && !found; i++)
    if (!strcmp(registry[i]->name, name)) found = registry[i];
  pthread_mutex_unlock(&registry_mu);
  return found;
}

EL_API int el_backend_register(const el_backend* b) {
  if (!b || !valid_name(b->name) || !b->open || !b->close || !b->run || (!b->bind) != (!b->unbind))
    return el_error("el_backend_register: a backend needs a name of 1-%d bytes, open, close, run, and bind with "
                    "unbind (or neither)", EL_BACKEND_NAME_BYTES - 1);
  int rc = 0;
  pthread_mutex_lock(&registry_mu);
  for (int i = 0; i < n_registered; i++)
    if (!strcmp(registry[i]->name, b->name)) {
      rc = registry[i] == b ? 1 : -1;
      break;
    }
  if (rc == 0 && n_registered == MAX_BACKENDS) rc = -2;
  if (rc == 0) registry[n_registered++] = b;
  pthread_mutex_unlock(&registry_mu);
  if (rc == -1) return el_error("el_backend_register: a different backend is already called \"%s\"", b->name);
  if (rc == -2) return el_error("el_backend_register: the registry is full (%d backends)", MAX_BACKENDS);
  return 0;
}

int el_backend_names(char* out, size_t cap) {
  size_t at = 0;
  if (cap) out[0] = 0;
  pthread_mutex_lock(&registry_mu);
  for (int i = 0; i < n_registered && at < cap; i++) {
    int w = snprintf(out + at, cap - at, "%s%s", i ? ", " : "", registry[i]->name);
    if (w < 0) break;
    at += (size_t)w;
  }
  pthread_mutex_unlock(&registry_mu);
  return 0;
}

EL_API int el_backend_error(const char* message) { return el_error("%s", message ? message : "backend error"); }
