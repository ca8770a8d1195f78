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

#ifdef EDGELLM_SYSLIB_ADAPTER
/* A kernels.so linked from a TVM "system-lib" object (targets whose edgellm-run links the same object
 * statically, e.g. android-cpu: one TVM compile gives both). Such code calls the TVMBackend* functions directly
 * and registers itself through TVMFFIEnvModRegisterSystemLibSymbol; here those calls go through the same
 * __TVMBackend* pointer variables that libedgellm fills after dlopen for a regular kernels.so (it finds the
 * kernels by their exported __tvm_ffi_* names, so the registration is not needed). Without a host that fills
 * the pointers, launches run serially and workspaces come from malloc. */
#include <stdlib.h>

typedef struct {
  void* sync_handle;
  int32_t num_task;
} shim_group_env;
typedef int (*shim_lambda)(int task_id, shim_group_env* penv, void* cdata);

SHIM_EXPORT int (*__TVMBackendParallelLaunch)(shim_lambda f, void* cdata, int num_task) = NULL;
SHIM_EXPORT void* (*__TVMBackendAllocWorkspace)(int, int, uint64_t, int, int) = NULL;
SHIM_EXPORT int (*__TVMBackendFreeWorkspace)(int, int, void*) = NULL;
#define SHIM_HIDDEN __attribute__((visibility("hidden")))

SHIM_HIDDEN int TVMFFIEnvModRegisterSystemLibSymbol(const char* name, void* ptr) {
  (void)name, (void)ptr;
  return 0;
}

SHIM_HIDDEN int TVMBackendParallelLaunch(shim_lambda f, void* cdata, int num_task) {
  if (__TVMBackendParallelLaunch) return __TVMBackendParallelLaunch(f, cdata, num_task);
  shim_group_env env = {NULL, 1};
  return f(0, &env, cdata);
}

SHIM_HIDDEN void* TVMBackendAllocWorkspace(int dev, int id, uint64_t nbytes, int code, int bits) {
  if (__TVMBackendAllocWorkspace) return __TVMBackendAllocWorkspace(dev, id, nbytes, code, bits);
  return aligned_alloc(64, ((size_t)nbytes + 63) / 64 * 64 + 64);
}

SHIM_HIDDEN int TVMBackendFreeWorkspace(int dev, int id, void* ptr) {
  if (__TVMBackendFreeWorkspace) return __TVMBackendFreeWorkspace(dev, id, ptr);
  free(ptr);
  return 0;
}

#ifdef EDGELLM_SHIM_BARRIER
SHIM_EXPORT int (*__TVMBackendParallelBarrier)(int task_id, shim_group_env* penv) = NULL;
SHIM_HIDDEN int TVMBackendParallelBarrier(int task_id, shim_group_env* penv) {
  return __TVMBackendParallelBarrier ? __TVMBackendParallelBarrier(task_id, penv) : 0;
}
#endif
#endif /* EDGELLM_SYSLIB_ADAPTER */
