/* Calls kernels of a kernels.so on tensors from files: checks cross-compiled kernels op by op under qemu-user
 * (tests/test_ops_arm.py). No TVM, no libedgellm: the TVMBackend* hooks are filled with a serial launcher (every
 * task of a parallel loop runs in turn, so the parallel split is still exercised) and aligned_alloc.
 *   aarch64-linux-gnu-gcc -std=c11 -O2 -Iruntime tests/c/kernel_call.c -o kernel_call -ldl
 *   qemu-aarch64 -L /usr/aarch64-linux-gnu ./kernel_call kernels.so NAME IN OUT [NAME IN OUT ...]
 * IN: u32 n_args, then per arg: u8 dtype code, u8 bits, u8 ndim, u8 pad, i64 shape[ndim], u64 nbytes, the bytes.
 * OUT: the bytes of every arg after the call, concatenated (the output buffer is the last). */
#define _POSIX_C_SOURCE 200809L
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tvm_abi.h"

static int serial_launch(FTVMParallelLambda f, void* cdata, int num_task) {
  int n = num_task > 0 ? num_task : 2;
  TVMParallelGroupEnv env = {NULL, n};
  for (int i = 0; i < n; i++)
    if (f(i, &env, cdata) != 0) return -1;
  return 0;
}

static void* alloc_ws(int dt, int id, uint64_t n, int c, int b) {
  (void)dt, (void)id, (void)c, (void)b;
  return aligned_alloc(64, ((size_t)n + 63) / 64 * 64 + 64);
}

static int free_ws(int dt, int id, void* p) {
  (void)dt, (void)id;
  free(p);
  return 0;
}

static int call(void* so, const char* name, const char* in_path, const char* out_path) {
  char sym[160];
  snprintf(sym, sizeof sym, "__tvm_ffi_%s", name);
  TVMFFISafeCallType fn = (TVMFFISafeCallType)dlsym(so, sym);
  if (!fn) return fprintf(stderr, "no kernel %s\n", sym), 1;
  FILE* f = fopen(in_path, "rb");
  if (!f) return perror(in_path), 1;
  uint32_t n;
  if (fread(&n, 4, 1, f) != 1 || n > 16) return fprintf(stderr, "bad %s\n", in_path), 1;
  DLTensor t[16];
  TVMFFIAny any[16];
  int64_t shape[16][4];
  uint64_t nbytes[16];
  memset(t, 0, sizeof t);
  memset(any, 0, sizeof any);
  for (uint32_t i = 0; i < n; i++) {
    uint8_t h[4];
    if (fread(h, 1, 4, f) != 4 || h[2] > 4) return fprintf(stderr, "bad arg %u\n", i), 1;
    if (fread(shape[i], 8, h[2], f) != h[2] || fread(&nbytes[i], 8, 1, f) != 1) return 1;
    void* data = aligned_alloc(64, ((size_t)nbytes[i] + 63) / 64 * 64 + 64);
    if (!data || fread(data, 1, nbytes[i], f) != nbytes[i]) return fprintf(stderr, "short arg %u\n", i), 1;
    t[i] = (DLTensor){data, {kDLCPU, 0}, h[2], {h[0], h[1], 1}, shape[i], NULL, 0};
    any[i].type_index = kTVMFFIDLTensorPtr;
    any[i].v_ptr = &t[i];
  }
  fclose(f);
  TVMFFIAny ret = {.type_index = kTVMFFINone};
  if (fn(NULL, any, (int32_t)n, &ret) != 0) return fprintf(stderr, "kernel %s failed\n", name), 1;
  FILE* o = fopen(out_path, "wb");
  if (!o) return perror(out_path), 1;
  for (uint32_t i = 0; i < n; i++) {
    fwrite(t[i].data, 1, nbytes[i], o);
    free(t[i].data);
  }
  return fclose(o) != 0;
}

int main(int argc, char** argv) {
  if (argc < 5 || (argc - 2) % 3) return fprintf(stderr, "usage: %s LIB.so (NAME IN OUT)...\n", argv[0]), 2;
  void* so = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (!so) return fprintf(stderr, "dlopen: %s\n", dlerror()), 1;
  void** p;
  if ((p = dlsym(so, "__TVMBackendParallelLaunch"))) *p = (void*)serial_launch;
  if ((p = dlsym(so, "__TVMBackendAllocWorkspace"))) *p = (void*)alloc_ws;
  if ((p = dlsym(so, "__TVMBackendFreeWorkspace"))) *p = (void*)free_ws;
  for (int i = 2; i < argc; i += 3)
    if (call(so, argv[i], argv[i + 1], argv[i + 2]) != 0) return 1;
  return 0;
}
