/* Weight store (interface v2): where the bytes of each weight tensor live while contexts run.
 *
 * The executor knows weights only by id (the plan's tensor table) and brackets every use:
 *     store->acquire(store, ids, n, ptrs);   ... run the kernel ...   store->release(store, ids, n);
 * and, where the plan says what comes next before it is needed (a routed step's experts), hints it:
 *     store->prefetch(store, ids, n);        (asynchronous; never blocks)
 * A policy decides residency behind that: "resident" holds the whole file; later ones (layer window, expert cache,
 * neuron window) may block in acquire until the bytes are in RAM and evict after release, within the byte budget
 * given at load. acquire/release pairs nest (the same id may be acquired twice). The executor never learns where
 * bytes live.
 *
 * Thread safety: contexts on several threads share one model and so one store; every function may be called
 * concurrently (the resident store is read-only after open; other policies lock).
 */
#ifndef EDGELLM_STORE_H
#define EDGELLM_STORE_H
#include <stddef.h>
#include <stdint.h>

#include "../runtime/contract.h"

#ifndef EL_HIDDEN
#define EL_HIDDEN __attribute__((visibility("hidden")))
#endif

typedef struct el_weight_store el_weight_store;
struct el_weight_store {
  /* ptrs[i] = first byte of weight ids[i] (EL_TENSOR_ALIGN aligned at least). 0, or -1 with err[] set (nothing
   * stays acquired then). */
  int (*acquire)(el_weight_store* s, const uint32_t* ids, uint32_t n, const void** ptrs);
  void (*release)(el_weight_store* s, const uint32_t* ids, uint32_t n);
  /* A hint that these weights are needed soon. NULL: the policy has no use for hints (the executor skips them). */
  void (*prefetch)(el_weight_store* s, const uint32_t* ids, uint32_t n);
  /* Frees everything, including s. */
  void (*close)(el_weight_store* s);
  /* Bytes of weights currently held in memory. */
  uint64_t (*bytes_resident)(const el_weight_store* s);
  uint64_t bytes_huge; /* of those, bytes in transparent huge pages (0: none) */
  const char* policy;  /* "resident", ... */
  char err[256];       /* last failure, one line */
};

/* What a store serves: n weights, each [offset, offset + nbytes) of the file (bounds already checked). */
typedef struct {
  const char* path;            /* weights.bin */
  const el_plan_weight* table; /* the plan's tensor table (the caller keeps it alive) */
  uint32_t n;
  uint64_t file_bytes;    /* expected size of the file */
  uint64_t budget;        /* bytes the store may hold; 0: no limit */
  int huge_pages;         /* -1 auto, 0 never, 1 always (resident) */
  int use_mmap;           /* 0: read() into memory instead of mmap (resident) */
} el_store_config;

/* "resident": every weight in memory for the life of the model. Where the kernel offers transparent huge pages,
 * weights of at least 16 huge pages (and at most half the available memory) are copied into read-only anonymous
 * huge pages (huge_pages 0: never, 1: whatever the size); else the whole file is mmapped read-only (MAP_PRIVATE,
 * MADV_WILLNEED); if mmap fails or use_mmap is 0, read() into one aligned buffer made read-only. A budget below
 * the file size is refused (windowed policies run models larger than their budget). */
EL_HIDDEN el_weight_store* el_store_open_resident(const el_store_config* cfg, char* err, size_t errlen);

/* Opens a store by policy name (NULL or "" = "resident"); unknown name -> NULL with err set. New policies add
 * their opener here; the executor does not change. */
EL_HIDDEN el_weight_store* el_store_open(const char* policy, const el_store_config* cfg, char* err, size_t errlen);

#endif
