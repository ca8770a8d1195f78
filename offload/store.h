/* Weight store (interface v2): where the bytes of each weight tensor live while contexts run.
 *
 * The executor knows weights only by id (the plan's tensor table) and brackets every use:
 *     store->acquire(store, ids, n, ptrs);   ... run the kernel ...   store->release(store, ids, n);
 * and announces what comes next before it is needed (every program's weights, in the order its steps use them, when
 * it starts; a routed step's experts once they are chosen):
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
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "../runtime/contract.h"

#ifndef EL_HIDDEN
#define EL_HIDDEN __attribute__((visibility("hidden")))
#endif

typedef struct el_weight_store el_weight_store;

/* What a policy holds and streams (el_model_memory reports it; planning needs no reads). */
typedef struct {
  uint64_t budget;         /* bytes the store may hold (0: no limit) */
  uint64_t pinned_bytes;   /* weights held for the life of the model */
  uint64_t window_bytes;   /* the ring streamed weights pass through */
  uint64_t cache_bytes;    /* page cache buffered reads may hold at once (read-ahead), kept out of the budget */
  uint64_t mapped_bytes;   /* tables read by row lookup, served from a file mapping a page per row */
  uint64_t streamed_bytes; /* bytes read per token (each streamed weight once) */
  uint64_t minimum_budget; /* the smallest budget this policy can run in */
  uint64_t routed_bytes;   /* weights used only by routed steps (experts, neuron bundles) */
  uint64_t routed_cache_bytes; /* the cache they are read into when selected (routed_bytes: all of them held) */
  uint32_t pinned_weights, streamed_weights;
  uint32_t requests_per_token;   /* storage requests a token's streamed weights take */
  const char* storage;           /* profile name */
  const char* storage_what;      /* its one-line description */
  double storage_bytes_per_s;    /* 0: unthrottled */
  double storage_latency_s;
  int32_t storage_modelled;      /* 1: timings model the profile (reads served from RAM) */
  int32_t direct_io;             /* 1: reads bypass the page cache */
} el_store_layout;

typedef struct {
  uint64_t bytes_read, requests; /* storage reads since open (pinned weights included) */
  uint64_t hits, misses;         /* acquires whose bytes had landed / had to be waited for */
  uint64_t routed_hits, routed_misses; /* of routed weights: found in the cache / read when selected */
  uint64_t dropped;              /* prefetched weights thrown away unused (the order changed) */
  double stall_s;                /* time acquire spent waiting for reads */
  /* the expert cache ("experts"; routed_cache.h): selections, held / guessed-and-read among them, first acquires
   * that waited; reads guesses issued, and those evicted unused */
  uint64_t expert_selected, expert_cached, expert_prefetched, expert_stalls, predict_reads, predict_wasted;
} el_store_counters;
struct el_weight_store {
  /* ptrs[i] = first byte of weight ids[i] (EL_TENSOR_ALIGN aligned at least). 0, or -1 with err[] set (nothing
   * stays acquired then). */
  int (*acquire)(el_weight_store* s, const uint32_t* ids, uint32_t n, const void** ptrs);
  void (*release)(el_weight_store* s, const uint32_t* ids, uint32_t n);
  /* A hint that these weights are needed soon. NULL: the policy has no use for hints (the executor skips them). */
  void (*prefetch)(el_weight_store* s, const uint32_t* ids, uint32_t n);
  /* A guess (PREDICT steps): these routed weights may be selected soon by the route whose first expert weight is
   * `route`; read them if there is room. NULL: the executor skips the predictions, and the compute behind them. */
  void (*predict)(el_weight_store* s, const uint32_t* ids, uint32_t n, uint32_t route);
  /* Frees everything, including s. */
  void (*close)(el_weight_store* s);
  /* Bytes of weights currently held in memory. */
  uint64_t (*bytes_resident)(const el_weight_store* s);
  uint64_t bytes_huge; /* of those, bytes in transparent huge pages (0: none) */
  const char* policy;  /* "resident", ... */
  char err[256];       /* last failure, one line */
  el_store_layout layout;
  const uint8_t* pinned; /* per weight: 1 held for the life of the model (NULL: all of them) */
  /* Storage counters since open (NULL: the policy reads nothing after open). */
  void (*counters)(el_weight_store* s, el_store_counters* out);
  /* Held by the executor around each program run where the policy serves one program at a time (NULL: any
   * number of programs may run at once). */
  pthread_mutex_t* run_lock;
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
  /* Windowed policies: how one decode token uses the weights (the loader derives it from the plan). */
  const uint32_t* seq;      /* weights in the order a token first uses them */
  const uint32_t* seq_step; /* the step using seq[i]: the weights of one step are needed together */
  uint32_t n_seq;
  const uint8_t* must_pin;  /* per weight: 1 = cannot be streamed (used twice); 2 = read by row lookup only;
                               3 = used only by routed steps (read when selected: expert / neuron-group caches) */
  uint32_t lookup_rows;     /* rows a conversation can look up (the context length) */
  const char* storage;      /* storage profile (NULL: "native") */
  int io_threads;           /* reader threads (<= 0: 2) */
  int direct_io;            /* 1: O_DIRECT reads; 0: buffered, dropped from the page cache once read */
  int plan_only;            /* compute the layout; read and allocate nothing (acquire fails) */
  const char* eviction;     /* "experts": the expert cache's eviction policy (routed_cache.h; NULL: freq) */
  const uint32_t* routing;  /* per weight: calibration selections (routing.bin; NULL: none) */
  int warm;                 /* "experts": fill the cache at open with the experts calibration selected most */
} el_store_config;

/* "resident": every weight in memory for the life of the model. Where the kernel offers transparent huge pages,
 * weights of at least 16 huge pages (and at most half the available memory) are copied into read-only anonymous
 * huge pages (huge_pages 0: never, 1: whatever the size); else the whole file is mmapped read-only (MAP_PRIVATE,
 * MADV_WILLNEED); if mmap fails or use_mmap is 0, read() into one aligned buffer made read-only. A budget below
 * the file size is refused (windowed policies run models larger than their budget). */
EL_HIDDEN el_weight_store* el_store_open_resident(const el_store_config* cfg, char* err, size_t errlen);

/* "window": weights that cannot be streamed, and as many others as the budget allows (spread evenly over the
 * token), stay resident; the rest stream through a ring every token, read ahead by reader threads in the order the
 * executor announces (prefetch of a program's weights when it starts), so a layer's reads overlap the compute of
 * the layers before it. Identical results to "resident"; peak memory = pinned + ring <= budget. */
EL_HIDDEN el_weight_store* el_store_open_window(const el_store_config* cfg, char* err, size_t errlen);

/* "experts" (MoE packages): every weight that is not an expert held (row-lookup tables mapped, as the window
 * does), every expert read from storage into a cache of expert-sized slots when a route selects it or a PREDICT
 * step guesses it (routed_cache.h), evicted by the chosen policy. The slots take what the budget leaves; without a
 * budget, one per expert. With routing statistics and warm, the experts calibration selected most fill the cache
 * at open (evicted like any other later). Identical results to "resident". */
EL_HIDDEN el_weight_store* el_store_open_experts(const el_store_config* cfg, char* err, size_t errlen);

/* What the loader asks of the weight store (policy.c). */
typedef struct {
  const char* policy;         /* "resident", "window", "experts", or NULL / "" / "auto" */
  uint64_t budget;            /* bytes for the weights + one context (0: no limit) */
  uint64_t context_bytes;     /* one context's KV cache and activations */
  int moe;                    /* routed experts: an expert cache is a candidate */
  const char* device_backend; /* a backend that holds every weight in device memory (resident only), or NULL */
  uint32_t max_ctx;           /* for messages */
} el_store_request;

/* Chooses the policy and opens its store: the named one, or for "auto" resident when the weights and a context fit
 * the budget, else an expert cache (MoE) if one fits, else a window. A budget below the chosen policy's minimum is
 * refused with one line saying the minimum; *minimum_budget gets the smallest budget that loads with this request
 * (auto: the least over the policies). New policies add their opener and name in policy.c; the executor does not
 * change. NULL with err set on failure. */
EL_HIDDEN el_weight_store* el_store_choose(const el_store_request* rq, const el_store_config* cfg,
                                           uint64_t* minimum_budget, char* err, size_t errlen);

#endif
