/* Weight store policy "experts": an MoE model whose experts exceed the memory budget (offload/store.h).
 *
 *   held    every weight that is not an expert (attention, routers, norms, shared experts, the lm_head), read
 *           into memory at open; tables read only by row lookup (embeddings) are mapped, a page per row, as the
 *           window store does;
 *   cache   experts (weights only routed steps use): slots of one expert each (routed_cache.h) in what the budget
 *           leaves, read whole (one request per expert: experts are contiguous, 16 KiB-aligned regions) when a
 *           route selects them, or earlier when a PREDICT step guesses them, selected reads first.
 * Decode reads only the experts it misses; a guess that lands before its layer runs turns a miss into a hit. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "io.h"
#include "routed_cache.h"
#include "store.h"

#define TINY (64u << 10)    /* lookup tables below this are held, not mapped */
#define HELD_READ (8u << 20) /* bytes per request while reading the held weights at open */
#define HELD (UINT64_MAX - 2)
#define MAPPED (UINT64_MAX - 1)
#define ROUTED UINT64_MAX

typedef struct {
  el_weight_store base; /* first: the executor holds an el_weight_store* */
  const el_plan_weight* table;
  uint32_t n;
  uint64_t* at;     /* per weight: offset in held memory, MAPPED or ROUTED */
  uint8_t* mask;    /* per weight: 1 held for the life of the model (held or mapped) */
  uint8_t* routed;
  uint8_t* held;
  uint64_t held_bytes;
  uint8_t* map;
  uint64_t file_bytes;
  el_io* io;
  el_routed_cache* rc;
} experts_store;

static uint64_t lead(const el_plan_weight* t, uint32_t w) { return t[w].offset % EL_IO_ALIGN; }
static uint64_t wbytes(const el_plan_weight* t, uint32_t w) {
  return (lead(t, w) + t[w].nbytes + EL_IO_ALIGN - 1) / EL_IO_ALIGN * EL_IO_ALIGN;
}

static int experts_acquire(el_weight_store* b, const uint32_t* ids, uint32_t n, const void** ptrs) {
  experts_store* s = (experts_store*)b;
  for (uint32_t i = 0; i < n; i++)
    if (ids[i] >= s->n)
      return snprintf(b->err, sizeof b->err, "weight %u does not exist (the plan has %u)", ids[i], s->n), -1;
  if (!s->io) return snprintf(b->err, sizeof b->err, "the store was opened for planning only"), -1;
  for (uint32_t i = 0; i < n; i++) {
    uint32_t w = ids[i];
    if (s->at[w] == ROUTED) {
      if (!(ptrs[i] = el_rc_acquire(s->rc, w, b->err, sizeof b->err))) {
        for (uint32_t k = 0; k < i; k++)
          if (s->at[ids[k]] == ROUTED) el_rc_release(s->rc, ids[k]);
        return -1;
      }
    } else {
      ptrs[i] = s->at[w] == MAPPED ? s->map + s->table[w].offset : s->held + s->at[w] + lead(s->table, w);
    }
  }
  return 0;
}

static void experts_release(el_weight_store* b, const uint32_t* ids, uint32_t n) {
  experts_store* s = (experts_store*)b;
  for (uint32_t i = 0; i < n; i++)
    if (ids[i] < s->n && s->at[ids[i]] == ROUTED) el_rc_release(s->rc, ids[i]);
}

/* A program's announcement (its weights in order) says nothing new here; a route's selection (one routed weight)
 * queues that expert's read. */
static void experts_prefetch(el_weight_store* b, const uint32_t* ids, uint32_t n) {
  experts_store* s = (experts_store*)b;
  if (n == 1 && ids[0] < s->n && s->at[ids[0]] == ROUTED) el_rc_prefetch(s->rc, ids[0]);
}

static void experts_predict(el_weight_store* b, const uint32_t* ids, uint32_t n, uint32_t route) {
  experts_store* s = (experts_store*)b;
  el_rc_predict(s->rc, ids, n, route);
}

static uint64_t experts_bytes(const el_weight_store* b) {
  const experts_store* s = (const experts_store*)b;
  return s->held_bytes + el_rc_bytes(s->rc);
}

static void experts_counters(el_weight_store* b, el_store_counters* out) {
  experts_store* s = (experts_store*)b;
  *out = (el_store_counters){0};
  if (s->io) el_io_counters(s->io, &out->bytes_read, &out->requests);
  if (!s->rc) return;
  el_rc_counters_t k;
  el_rc_counters(s->rc, &k);
  out->hits = k.selected - k.stalls, out->misses = k.stalls, out->dropped = k.dropped, out->stall_s = k.stall_s;
  out->routed_hits = k.hits, out->routed_misses = k.misses;
  out->expert_selected = k.selected, out->expert_cached = k.cached, out->expert_prefetched = k.prefetched;
  out->expert_stalls = k.stalls, out->predict_reads = k.predict_reads, out->predict_wasted = k.predict_wasted;
}

static void experts_close(el_weight_store* b) {
  experts_store* s = (experts_store*)b;
  if (!s) return;
  el_rc_close(s->rc);
  if (s->held) munmap(s->held, s->held_bytes);
  if (s->map) munmap(s->map, s->file_bytes);
  el_io_close(s->io);
  free(s->at), free(s->mask), free(s->routed);
  free(s);
}

/* Reads the held weights, neighbours in the file coalesced into large requests. */
static int read_held(experts_store* s, char* err, size_t errlen) {
  for (uint32_t i = 0; i < s->n;) {
    if (s->at[i] >= HELD) {
      i++;
      continue;
    }
    uint32_t j = i + 1;
    uint64_t start = s->table[i].offset - lead(s->table, i), dst = s->at[i], end = start + wbytes(s->table, i);
    while (j < s->n && s->at[j] < HELD && s->table[j].offset - lead(s->table, j) == end &&
           s->at[j] == dst + (end - start) && end - start < HELD_READ)
      end += wbytes(s->table, j), j++;
    if (el_io_read(s->io, s->held + dst, start, s->table[j - 1].offset + s->table[j - 1].nbytes - start, err,
                   errlen) != 0)
      return -1;
    el_io_drop(s->io, start / EL_IO_DROP_ALIGN * EL_IO_DROP_ALIGN,
               end - start / EL_IO_DROP_ALIGN * EL_IO_DROP_ALIGN); /* the copy is ours */
    i = j;
  }
  return 0;
}

typedef struct {
  uint32_t count, w;
} hot;
static int hotter(const void* a, const void* b) { /* most selected first; between equals the lower id */
  const hot *x = a, *y = b;
  return x->count != y->count ? (x->count < y->count ? 1 : -1) : (x->w > y->w) - (x->w < y->w);
}

/* Reads the up to `most` experts calibration selected most (at least once) into the cache. */
static int warm(experts_store* s, const uint32_t* routing, uint32_t most, char* err, size_t errlen) {
  hot* hs = malloc(sizeof *hs * (s->n ? s->n : 1));
  uint32_t k = 0;
  if (!hs) return snprintf(err, errlen, "out of memory"), -1;
  for (uint32_t w = 0; w < s->n; w++)
    if (s->routed[w] && routing[w]) hs[k++] = (hot){routing[w], w};
  qsort(hs, k, sizeof *hs, hotter);
  if (k > most) k = most;
  uint32_t* ws = malloc(sizeof *ws * (k ? k : 1));
  int rc = ws ? 0 : -1;
  if (ws) {
    for (uint32_t i = 0; i < k; i++) ws[i] = hs[i].w;
    rc = el_rc_fill(s->rc, ws, k, err, errlen);
  } else {
    snprintf(err, errlen, "out of memory");
  }
  free(ws), free(hs);
  return rc;
}

el_weight_store* el_store_open_experts(const el_store_config* cfg, char* err, size_t errlen) {
  const el_storage_profile* prof = el_storage_profile_find(cfg->storage);
  if (!prof) {
    snprintf(err, errlen, "unknown storage profile \"%s\" (known: %s)", cfg->storage, el_storage_profile_names());
    return NULL;
  }
  int policy = el_rc_policy_find(cfg->eviction);
  if (policy < 0) {
    snprintf(err, errlen, "unknown expert eviction policy \"%s\" (known: freq, lru, lfu)", cfg->eviction);
    return NULL;
  }
  experts_store* s = calloc(1, sizeof *s);
  uint32_t n = cfg->n;
  if (!s || !(s->at = malloc(sizeof *s->at * (n ? n : 1))) || !(s->mask = calloc(n ? n : 1, 1)) ||
      !(s->routed = calloc(n ? n : 1, 1))) {
    if (s) free(s->at), free(s->mask), free(s);
    snprintf(err, errlen, "out of memory");
    return NULL;
  }
  s->table = cfg->table, s->n = n, s->file_bytes = cfg->file_bytes;
  el_weight_store* b = &s->base;
  b->acquire = experts_acquire, b->release = experts_release, b->prefetch = experts_prefetch;
  b->predict = experts_predict, b->close = experts_close, b->bytes_resident = experts_bytes;
  b->counters = experts_counters, b->policy = "experts", b->pinned = s->mask;

  /* layout */
  uint64_t held = 0, mapped = 0, routed = 0, n_routed = 0, cache = 0;
  for (uint32_t w = 0; w < n; w++) {
    uint8_t use = cfg->must_pin ? cfg->must_pin[w] : 1;
    if (use == 3) {
      s->at[w] = ROUTED, s->routed[w] = 1, routed += wbytes(s->table, w), n_routed++;
    } else if (use == 2 && s->table[w].nbytes >= TINY) {
      uint64_t rows = 2ull * 4096 * (cfg->lookup_rows ? cfg->lookup_rows : 1); /* pages a conversation touches */
      cache += rows < wbytes(s->table, w) ? rows : wbytes(s->table, w);
      s->at[w] = MAPPED, s->mask[w] = 1, mapped += s->table[w].nbytes;
    } else {
      s->at[w] = held, s->mask[w] = 1, held += wbytes(s->table, w);
    }
  }
  if (!n_routed) {
    snprintf(err, errlen, "the \"experts\" policy serves mixture-of-experts packages; this one has no experts "
             "(use \"window\")");
    goto fail;
  }
  uint64_t slot = el_rc_slot_bytes(s->table, n, s->routed);
  /* buffered reads without read-ahead (el_io_random), each dropped from the page cache once copied: at most the
   * two readers' reads, each widened to whole page-cache folios, are ever cached */
  if (!prof->modelled && !cfg->direct_io) cache += 2 * (slot + 2 * (uint64_t)EL_IO_DROP_ALIGN);
  uint64_t minimum = held + cache + 2 * slot, n_slots = n_routed;
  if (cfg->budget) {
    if (cfg->budget < minimum) {
      snprintf(err, errlen, "the memory budget leaves %.1f MB for weights; the \"experts\" policy needs at least "
               "%.1f MB (%.1f MB of weights that are not experts + two %.1f MB expert slots + %.1f MB of page "
               "cache: read-ahead, rows looked up)", cfg->budget / 1e6, minimum / 1e6, held / 1e6, slot / 1e6,
               cache / 1e6);
      goto fail;
    }
    uint64_t fit = (cfg->budget - held - cache) / slot;
    if (fit < n_slots) n_slots = fit;
  }
  el_store_layout* lay = &b->layout;
  *lay = (el_store_layout){.budget = cfg->budget, .pinned_bytes = held, .cache_bytes = cache, .mapped_bytes = mapped,
                           .minimum_budget = minimum, .routed_bytes = routed, .routed_cache_bytes = n_slots * slot,
                           .storage = prof->name, .storage_what = prof->what, .storage_bytes_per_s = prof->bytes_per_s,
                           .storage_latency_s = prof->latency_s, .storage_modelled = prof->modelled,
                           .direct_io = !prof->modelled && cfg->direct_io};
  for (uint32_t w = 0; w < n; w++) lay->pinned_weights += s->mask[w];
  if (cfg->plan_only) return b;

  if (!(s->io = el_io_open(cfg->path, cfg->file_bytes, prof, cfg->direct_io, err, errlen))) goto fail;
  lay->direct_io = el_io_direct(s->io);
  el_io_random(s->io);
  if (mapped) {
    uint8_t* rows = calloc(n ? n : 1, 1);
    if (!rows) {
      snprintf(err, errlen, "out of memory");
      goto fail;
    }
    for (uint32_t w = 0; w < n; w++) rows[w] = s->at[w] == MAPPED;
    s->map = el_io_map_lookups(cfg->path, s->file_bytes, s->table, n, rows, err, errlen);
    free(rows);
    if (!s->map) goto fail;
  }
  if (held) {
    s->held = mmap(NULL, held, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (s->held == MAP_FAILED) {
      s->held = NULL;
      snprintf(err, errlen, "out of memory for %llu bytes of weights", (unsigned long long)held);
      goto fail;
    }
    s->held_bytes = held;
    if (read_held(s, err, errlen) != 0) goto fail;
    mprotect(s->held, held, PROT_READ);
  }
  if (!(s->rc = el_rc_open(s->table, n, s->routed, (uint32_t)n_slots, (el_rc_policy)policy, s->io, err, errlen)))
    goto fail;
  if (cfg->routing && cfg->warm && warm(s, cfg->routing, (uint32_t)n_slots, err, errlen) != 0) goto fail;
  return b;
fail:
  experts_close(b);
  return NULL;
}
