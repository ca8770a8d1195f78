/* Smoke driver: load a package, prefill the ids given on the command line (all rows), decode one more token,
 * print every logits row. Used to check a cross-built libedgellm under qemu-user against the native one:
 *   aarch64-linux-gnu-gcc -std=c11 -O2 -Iruntime tests/c/run_package.c runtime/runtime.c runtime/core/threadpool.c \
 *       runtime/core/sampler.c offload/weight_store.c -o run_a64 -lpthread -ldl -lm
 *   qemu-aarch64 -L /usr/aarch64-linux-gnu ./run_a64 PKG 2 5 7 9 11 13
 * Usage: run_package PKG THREADS ID... (the last id is decoded, the others prefilled) */
#include <stdio.h>
#include <stdlib.h>

#include "edgellm.h"

int main(int argc, char** argv) {
  if (argc < 5) {
    fprintf(stderr, "usage: %s PKG THREADS ID ID...\n", argv[0]);
    return 2;
  }
  el_model* m = el_load(argv[1], atoi(argv[2]));
  if (!m) {
    fprintf(stderr, "el_load: %s\n", el_last_error());
    return 1;
  }
  int n = argc - 4, V = el_vocab(m);
  int32_t* ids = malloc(sizeof(int32_t) * (size_t)(n + 1));
  float* logits = malloc(sizeof(float) * (size_t)V * (size_t)(n + 1));
  for (int i = 0; i <= n; i++) ids[i] = atoi(argv[3 + i]);
  if (el_prefill(m, ids, n, logits, 1) != 0 || el_decode(m, ids[n], logits + (size_t)n * V) != 0) {
    fprintf(stderr, "run: %s\n", el_last_error());
    return 1;
  }
  for (int r = 0; r <= n; r++) {
    for (int v = 0; v < V; v++) printf("%.6g%c", logits[(size_t)r * V + v], v + 1 < V ? ' ' : '\n');
  }
  el_free(m);
  free(ids);
  free(logits);
  return 0;
}
