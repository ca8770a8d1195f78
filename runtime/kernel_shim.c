/* Linked into every package's kernels.so so that it needs nothing but libc/libm:
 *   cc -shared -fPIC -O2 kernels.o runtime/kernel_shim.c -o kernels.so -lm -Wl,-Bsymbolic
 * TVM-compiled kernels report errors (argument checks, asserts) through TVMFFIErrorSetRaisedFromCStrParts and
 * then return -1. We format the message and hand it to __edgellm_error_hook, which libedgellm sets after dlopen
 * so the text becomes el_last_error(); with no hook (another host program) it goes to stderr.
 * Dependency-free on purpose: it is compiled by the cross compiler of every target.
 */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#define SHIM_EXPORT __attribute__((visibility("default")))

SHIM_EXPORT void (*__edgellm_error_hook)(const char* msg) = NULL;

static void emit(const char* msg) {
  void (*hook)(const char*) = __edgellm_error_hook;
  if (hook)
    hook(msg);
  else
    fprintf(stderr, "edgellm kernel error: %s\n", msg);
}

SHIM_EXPORT void TVMFFIErrorSetRaisedFromCStrParts(const char* kind, const char** parts, int32_t n) {
  char buf[1024];
  size_t len = 0;
  int w = snprintf(buf, sizeof buf, "%s: ", kind ? kind : "Error");
  if (w > 0) len = (size_t)w < sizeof buf ? (size_t)w : sizeof buf - 1;
  for (int32_t i = 0; i < n && len + 1 < sizeof buf; i++) {
    if (!parts || !parts[i]) continue;
    size_t k = strlen(parts[i]);
    if (k > sizeof buf - 1 - len) k = sizeof buf - 1 - len;
    memcpy(buf + len, parts[i], k);
    len += k;
  }
  buf[len] = 0;
  for (size_t i = 0; i < len; i++) /* el_last_error() is one line */
    if (buf[i] == '\n' || buf[i] == '\r') buf[i] = ' ';
  emit(buf);
}

SHIM_EXPORT void TVMFFIErrorSetRaisedFromCStr(const char* kind, const char* msg) {
  const char* parts[1] = {msg ? msg : ""};
  TVMFFIErrorSetRaisedFromCStrParts(kind, parts, 1);
}
