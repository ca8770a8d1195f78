/* Weight store: where the bytes of each weight tensor live while the executor runs.
 *
 * The executor knows weights only by id (the plan's tensor table) and brackets every use:
 *     const void* p = s->acquire(s, id);  ... run the kernel ...  s->release(s, id);
 * A policy decides residency behind that: "resident" maps the whole file; later ones (layer window, expert
 * cache, neuron window) may block in acquire until the bytes are in RAM, and evict after release.
 * acquire/release pairs nest (the same id may be acquired twice by one step). Not thread-safe: one executor
 * thread per store.
 */
#ifndef EDGELLM_WEIGHT_STORE_H
#define EDGELLM_WEIGHT_STORE_H
#include <stddef.h>
#include <stdint.h>

#include "../runtime/plan_format.h"

#ifndef EL_HIDDEN
#define EL_HIDDEN __attribute__((visibility("hidden")))
#endif

typedef struct el_weight_store el_weight_store;
struct el_weight_store {
  /* Pointer to the first byte of weight `id` (64-byte aligned at least), or NULL with err[] set. */
  const void* (*acquire)(el_weight_store* s, uint32_t id);
  void (*release)(el_weight_store* s, uint32_t id);
  /* Frees everything, including s. */
  void (*close)(el_weight_store* s);
  /* Bytes of weights currently held in memory by the store. */
  uint64_t (*bytes_resident)(const el_weight_store* s);
  uint64_t bytes_huge; /* of the weights, bytes the store holds in transparent huge pages (0: none) */
  const char* policy; /* "resident", ... */
  char err[256];      /* last failure, one line */
};

/* The table a store serves: n weights, each [offset, offset + nbytes) of the file (already bounds-checked). */
typedef struct {
  const char* path;            /* weights.bin */
  const el_plan_weight* table; /* the plan's tensor table (the caller keeps it alive) */
  uint32_t n;
  uint64_t file_bytes; /* expected size of the file */
} el_store_config;

/* "resident": every weight in memory. Where the kernel offers transparent huge pages, weights of at least 16 huge
 * pages (and at most half the available memory) are copied into read-only anonymous huge pages
 * (EDGELLM_HUGEPAGES=0: never, =1: whatever the size); else the
 * whole file is mmapped read-only (MAP_PRIVATE, MADV_WILLNEED); if mmap fails (or the environment sets
 * EDGELLM_NO_MMAP=1) read() into one 64-byte aligned buffer. Returns NULL with a one-line message in err. */
EL_HIDDEN el_weight_store* el_store_open_resident(const el_store_config* cfg, char* err, size_t errlen);

/* Opens a store by policy name (NULL or "" = "resident"); unknown name -> NULL with err set. New policies add
 * their opener here; the executor does not change. */
EL_HIDDEN el_weight_store* el_store_open(const char* policy, const el_store_config* cfg, char* err, size_t errlen);

#endif
