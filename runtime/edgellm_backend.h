/* libedgellm backends: the interface a backend implements, and the registry the loader looks them up in.
 *
 * A plan names the backend of each of its programs as a string ("tvm_cpu", "opencl", "qnn_ort", or any name
 * registered here); the loader opens each named backend once per model, handing it the programs it runs, and the
 * context runs a program through its backend's `run`. The built-in backends are registered by the library itself;
 * an application (or a test) may register more before it loads a package that names them, without changing the
 * library: see tests/test_backend_registry.py, which registers a backend that counts calls and delegates.
 *
 * A backend's own settings are opaque to the core: it declares the keys it reads (`options`), the application passes
 * "backend.key=value" lines (el_load_options.backend_options), the loader checks the names, and the backend reads
 * its values with el_backend_option.
 *
 * Every backend reads and writes the one KV layout the context owns and the context's arena (a program's input at
 * its in_offset, its output at its out_offset); `prog` below is a program's index in the runtime's table of program
 * names (el_program_name). This is ExecuTorch's BackendInterface at program granularity.
 */
#ifndef EDGELLM_BACKEND_H
#define EDGELLM_BACKEND_H
#include <stdint.h>

#include "edgellm.h"
#ifdef __cplusplus
extern "C" {
#endif

/* el_backend.caps */
enum {
  EL_BACKEND_DEVICE_WEIGHTS = 1, /* holds every weight in its own (device) memory: the weight store stays resident */
  EL_BACKEND_DEVICE_KV = 2,      /* holds the KV cache in its own (device) memory: kv_move moves rows there */
};

typedef struct el_backend {
  const char* name; /* what plans call it: at most 15 bytes */
  uint32_t caps;    /* EL_BACKEND_* */
  /* Per model: `programs` has bit k set for every program k the plan gives this backend. 0, or -1 with the error
   * set (el_backend_error). */
  int (*open)(el_model* m, const char* dir, uint32_t programs, void** state);
  void (*close)(void* state);
  /* Per context (device buffers, prepared arguments); may be NULL. */
  int (*bind)(void* state, el_context* c, void** ctx_state);
  void (*unbind)(void* ctx_state);
  /* Runs program `prog` of context c with `pos` tokens already in its KV cache. 0, or -1 with the error set. */
  int (*run)(void* state, void* ctx_state, el_context* c, int prog, int pos);
  /* The option keys it reads (NULL-terminated; NULL: none), and the packages that use it, for the error a set
   * option gets on a package without it (e.g. "android-gpu / opencl packages (OpenCL kernels)"; NULL: its name). */
  const char* const* options;
  const char* packages;
  /* EL_BACKEND_DEVICE_KV only (read only with that cap): copy `bytes` of context c's KV cache from byte offset src to
   * dst (offsets as in the host cache, el_context caches; the two ranges never overlap). A window cache moves its
   * newest rows to its start (contract.h). 0, or -1 with the error set. */
  int (*kv_move)(void* state, void* ctx_state, el_context* c, size_t dst, size_t src, size_t bytes);
} el_backend;

/* Adds a backend to the process-wide registry (the struct must outlive every model that uses it). 0, or -1 if the
 * name is empty, too long, or taken by a backend with other functions (registering the same struct twice is 0). */
int el_backend_register(const el_backend* b);
/* The registered backend of that name, or NULL. */
const el_backend* el_backend_find(const char* name);
/* The name of program index k ("prefill", "decode", ...), or NULL past the end. */
const char* el_program_name(int k);
/* The value of option `key` of backend `backend` given at load (el_load_options.backend_options), or NULL when
 * unset. Valid while the model lives. */
const char* el_backend_option(const el_model* m, const char* backend, const char* key);
/* Sets the calling thread's error text (what el_last_error returns) and returns -1. */
int el_backend_error(const char* message);

#ifdef __cplusplus
}
#endif
#endif
