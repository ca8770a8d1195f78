/* Weight store policy "window": run a model whose weights exceed the memory budget (offload/store.h).
 *
 * Layout (decided at open from the budget; el_model_memory reports it):
 *   pinned  weights that cannot be streamed (used twice per token, routed experts), tiny ones (norms, biases: a
 *           request each would cost more than their bytes), then the longest run of steps at the end of the token
 *           the budget allows, so what streams is one contiguous range of the file;
 *   mapped  tables read only by row lookup (embeddings): a read-only file mapping, a page per row looked up;
 *   routed  weights only routed steps use (neuron bundles, experts) are streamed like the others, but a pass reads
 *           only the ones the last pass selected (a token's active neuron groups change little from one token to
 *           the next); predicted ones the route does not select are skipped (counted as dropped), selected ones
 *           that were not predicted are read on demand into a small cache of their own (routed_cache.h);
 *   ring    the other weights pass through it every token: a FIFO of byte ranges, filled by reader threads in the
 *           order the executor announced (prefetch of a program's weights when the program starts), freed as each
 *           weight is released. Decode streams the same bytes every token, so holding a fixed part and streaming the
 *           rest reads the least possible per token (an LRU cache over a cyclic order would read everything).
 *
 * acquire blocks only while a weight's reads have not landed; a weight asked for out of the announced order (a
 * program that announced nothing, a failed run) drops the pending prefetches and is read on demand, so the order
 * affects speed, never results. One program runs at a time on a windowed store (run_lock): a token's steps consume
 * the ring in order, which is what guarantees progress with a ring of two steps' weights. */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include "io.h"
#include "routed_cache.h"
#include "store.h"

#define CHUNK (1u << 20)        /* bytes per streaming request: >= 256 KiB amortises a request's latency */
#define PIN_READ (8u << 20)     /* bytes per request while reading the pinned weights at open */
#define TINY (64u << 10)        /* weights below this are always pinned */
#define MAX_THREADS 4

typedef struct {
  uint32_t id, pass;       /* pass: the program run it was queued for (announcement count; +1: speculated) */
  uint64_t pos, len, span; /* ring offset, bytes (EL_IO_ALIGN rounded), len + the gap skipped to wrap */
  uint32_t chunks, next, done; /* read requests: total, issued, landed */
  int allocated, refs, used, dropped;
  int touched; /* acquired at least once (a routed weight stays until the pass moves past it: a route body uses
                  its expert's weights in several steps) */
} entry;

typedef struct {
  el_weight_store base; /* first: the executor holds an el_weight_store* */
  const el_plan_weight* table;
  uint32_t n;
  uint64_t* pin_at; /* per weight: offset in pinned (STREAMED, MAPPED) */
  uint8_t* map;     /* the file, mapped for weights read by row lookup (NULL: none) */
  uint8_t* pinned_mask;
  uint8_t* pinned;
  uint64_t pinned_map;
  uint8_t* ring;
  uint64_t ring_bytes, ring_head, ring_used;
  entry* q;
  uint32_t qcap, qhead, qlen, qalloc; /* circular queue; entries [qhead, qhead + qalloc) have ring space */
  el_io* io;
  el_routed_cache* rc; /* selected routed weights that were not predicted (NULL: no routed weights) */
  uint8_t* routed;     /* per weight: used only by routed steps */
  uint8_t* pred;       /* per routed weight: selected the last time its route ran (read ahead) */
  uint32_t* unit;      /* per weight: the decode step using it (UINT32_MAX: none); a step's weights share ring space */
  uint64_t routed_hits, routed_misses; /* selections served without a read (pinned, predicted, cached) / with one */
  pthread_mutex_t mu, run;
  pthread_cond_t landed, work;
  pthread_t threads[MAX_THREADS];
  int n_threads, stop, failed;
  char io_err[256];
  uint64_t hits, misses, dropped;
  double stall_s;
  uint32_t* last;          /* the last announced order (streamed weights only), read again ahead of time */
  uint32_t n_last, spec;   /* spec: a copy of it is queued that no announcement has confirmed yet */
  uint32_t pass;           /* announcements so far */
  uint64_t hash_last, hash_prev; /* of the last two announced orders: equal = a program repeating (decode) */
  uint64_t drop_from;      /* the page cache holds nothing of ours before this offset (buffered reads) */
  uint64_t file_bytes;
} window_store;

#define STREAMED UINT64_MAX
#define MAPPED (UINT64_MAX - 1)

static uint64_t rounded(uint64_t n) { return (n + EL_IO_ALIGN - 1) / EL_IO_ALIGN * EL_IO_ALIGN; }
/* A weight's bytes as read: from the EL_IO_ALIGN boundary at or before it (compilers align weights to 16 KiB; a
 * plan that only keeps the 64-byte rule still works) to a whole block past its end. */
static uint64_t lead(const el_plan_weight* t, uint32_t w) { return t[w].offset % EL_IO_ALIGN; }
static uint64_t wbytes(const el_plan_weight* t, uint32_t w) { return rounded(lead(t, w) + t[w].nbytes); }

/* Layout ------------------------------------------------------------------------------------------------------ */

typedef struct {
  uint32_t first, end; /* seq[first, end): one step's weights */
  uint64_t bytes;      /* of them, the ones that can be streamed */
  int pinned;
} unit;

/* Ring bytes that keep reads ahead of compute: any three consecutive streamed units (the one computing, the next
 * landing, one more queued), the order wrapping from one token to the next. */
static uint64_t ring_need(const unit* u, uint32_t nu) {
  uint32_t* live = malloc(sizeof *live * (nu ? nu : 1));
  uint32_t m = 0;
  uint64_t best = 0;
  if (!live) return UINT64_MAX;
  for (uint32_t i = 0; i < nu; i++)
    if (!u[i].pinned && u[i].bytes) live[m++] = i;
  for (uint32_t i = 0; i < m; i++) {
    uint64_t sum = 0;
    for (uint32_t k = 0; k < 3 && k < m; k++) sum += u[live[(i + k) % m]].bytes;
    if (sum > best) best = sum;
  }
  free(live);
  return best;
}

/* Fills lay and pin (per weight: 0 streamed, 1 pinned, 2 mapped) for this budget; -1 with err naming the minimum if
 * it is too small. */
static int plan_layout(const el_store_config* cfg, uint64_t cache, el_store_layout* lay, uint8_t* pin, char* err,
                       size_t errlen) {
  uint32_t n = cfg->n, nu = 0;
  uint8_t* in_seq = calloc(n ? n : 1, 1);
  unit* u = calloc(cfg->n_seq ? cfg->n_seq : 1, sizeof *u);
  int rc = -1;
  if (!in_seq || !u) {
    snprintf(err, errlen, "out of memory");
    goto out;
  }
  for (uint32_t i = 0; i < cfg->n_seq; i++) in_seq[cfg->seq[i]] = 1;
  uint64_t mandatory = 0, streamable = 0, max_unit = 0;
  uint64_t mapped = 0, routed = 0, slot = 0;
  for (uint32_t w = 0; w < n; w++) {
    if (cfg->must_pin && cfg->must_pin[w] == 3) { /* routed: streamed when predicted, however small */
      pin[w] = !in_seq[w];
      if (pin[w]) mandatory += wbytes(cfg->table, w);
      routed += wbytes(cfg->table, w);
      if (wbytes(cfg->table, w) > slot) slot = wbytes(cfg->table, w);
      continue;
    }
    if (cfg->must_pin && cfg->must_pin[w] == 2 && cfg->table[w].nbytes >= TINY) {
      /* read by row lookup: served from a mapping of the file, a page per row looked up; the budget holds the
       * pages one conversation can touch (two per token of context, at most the table) */
      pin[w] = 2;
      uint64_t rows = 2ull * 4096 * (cfg->lookup_rows ? cfg->lookup_rows : 1);
      cache += rows < wbytes(cfg->table, w) ? rows : wbytes(cfg->table, w); /* page cache, like read-ahead */
      mapped += cfg->table[w].nbytes;
      continue;
    }
    pin[w] = !in_seq[w] || (cfg->must_pin && cfg->must_pin[w]) || cfg->table[w].nbytes < TINY;
    if (pin[w]) mandatory += wbytes(cfg->table, w);
  }
  for (uint32_t i = 0; i < cfg->n_seq;) {
    uint32_t j = i;
    uint64_t b = 0;
    for (; j < cfg->n_seq && cfg->seq_step[j] == cfg->seq_step[i]; j++)
      if (!pin[cfg->seq[j]]) b += wbytes(cfg->table, cfg->seq[j]);
    if (b) {
      u[nu] = (unit){i, j, b, 0};
      streamable += b;
      if (b > max_unit) max_unit = b;
      nu++;
    }
    i = j;
  }
  /* the smallest window holds the largest step's weights: it runs, reading and computing in turn; the cache of
   * unpredicted routed weights two of them (one computing, the next landing) */
  uint64_t min_routed = 2 * slot;
  uint64_t minimum = mandatory + max_unit + cache + min_routed;
  *lay = (el_store_layout){.budget = cfg->budget, .minimum_budget = minimum, .mapped_bytes = mapped,
                           .routed_bytes = routed};
  if (cfg->budget && cfg->budget < minimum) {
    snprintf(err, errlen, "the memory budget leaves %.1f MB for weights; this package needs at least %.1f MB "
             "(%.1f MB that cannot be streamed + its largest step's %.1f MB%s + %.1f MB of page cache: read-ahead, "
             "rows looked up)",
             cfg->budget / 1e6, minimum / 1e6, mandatory / 1e6, max_unit / 1e6,
             min_routed ? " + two routed weights" : "", cache / 1e6);
    goto out;
  }
  /* the unpredicted-group cache: two slots, up to 16 from a quarter of what the budget has beyond its minimum (the
   * selections it serves are read ahead, as many as it has slots, while the earlier groups compute) */
  uint64_t rc_bytes = min_routed;
  if (slot && cfg->budget) {
    uint64_t extra = (cfg->budget - minimum) / 4;
    rc_bytes += (extra < 14 * slot ? extra : 14 * slot) / slot * slot;
  }
  lay->routed_cache_bytes = rc_bytes;
  uint64_t budget = cfg->budget ? cfg->budget - cache - rc_bytes : mandatory + streamable, ring = 0, pinned_extra = 0;
  if (budget < mandatory + streamable) {
    /* Pin a contiguous run of steps at the end of the token (where the lm_head, the largest step, is) and stream
     * the ones before it: what streams is then one range of the file, read front to back every token with no
     * holes for read-ahead to waste bandwidth on, and while the pinned end computes the readers go on into the
     * next token's first weights. Take the longest pinned run whose window (three consecutive streamed steps)
     * still fits; the window gets whatever is left. */
    uint64_t pinned_s = 0;
    uint32_t best = UINT32_MAX;
    for (uint32_t k = 0; k <= nu; k++) { /* k: steps pinned from the end */
      if (k) u[nu - k].pinned = 1, pinned_s += u[nu - k].bytes;
      if (mandatory + pinned_s > budget) break;
      uint64_t r = ring_need(u, nu);
      if (r == UINT64_MAX) break;
      if (mandatory + pinned_s + r <= budget) best = k, pinned_extra = pinned_s;
    }
    for (uint32_t i = 0; i < nu; i++) u[i].pinned = best != UINT32_MAX && i >= nu - best;
    if (best == UINT32_MAX) pinned_extra = 0; /* not even three steps fit: the window is what is left */
    ring = budget - mandatory - pinned_extra;
    for (uint32_t i = 0; i < nu; i++)
      if (u[i].pinned)
        for (uint32_t k = u[i].first; k < u[i].end; k++) pin[cfg->seq[k]] = 1;
  } else {
    for (uint32_t w = 0; w < n; w++) pin[w] = pin[w] ? pin[w] : 1;
    pinned_extra = streamable;
  }
  int routed_streamed = 0;
  for (uint32_t w = 0; w < n; w++) routed_streamed |= !pin[w] && cfg->must_pin && cfg->must_pin[w] == 3;
  if (!routed_streamed) lay->routed_cache_bytes = 0; /* every routed weight is held */
  lay->pinned_bytes = mandatory + pinned_extra;
  lay->streamed_bytes = streamable - pinned_extra;
  lay->window_bytes = lay->streamed_bytes ? ring : 0;
  lay->cache_bytes = cache;
  for (uint32_t w = 0; w < n; w++) {
    if (pin[w]) {
      lay->pinned_weights += pin[w] == 1;
    } else {
      lay->streamed_weights++;
      lay->requests_per_token += (uint32_t)((wbytes(cfg->table, w) + CHUNK - 1) / CHUNK);
    }
  }
  rc = 0;
out:
  free(in_seq), free(u);
  return rc;
}

/* Ring and queue (mu held) ------------------------------------------------------------------------------------ */

static entry* at(window_store* s, uint32_t i) { return &s->q[(s->qhead + i) % s->qcap]; }

static int finished(const entry* e) {
  return e->refs == 0 && (e->used || e->dropped) && e->next == e->done;
}

/* Frees the ring space of finished entries at the head, then gives space to waiting entries in order. */
static void reclaim_and_allocate(window_store* s) {
  while (s->qlen && s->qalloc && finished(at(s, 0))) {
    s->ring_used -= at(s, 0)->span;
    s->qhead = (s->qhead + 1) % s->qcap;
    s->qlen--, s->qalloc--;
  }
  if (!s->ring_used) s->ring_head = 0; /* nothing live: start again at the front (a one-step window needs it) */
  while (s->qalloc < s->qlen) {
    entry* e = at(s, s->qalloc);
    if (e->dropped) { /* never read: takes no space */
      e->allocated = 1, e->span = 0;
      s->qalloc++;
      continue;
    }
    /* A step's weights get space together, in one piece: a step holds them all while it runs, so one placed
     * where the next cannot follow (the ring's end) would wait forever for space only the step frees. */
    uint64_t total = 0;
    uint32_t k = s->qalloc;
    for (; k < s->qlen; k++) {
      entry* f = at(s, k);
      if (k > s->qalloc && (s->unit[f->id] != s->unit[e->id] || f->pass != e->pass || s->unit[e->id] == UINT32_MAX))
        break;
      if (!f->dropped) total += f->len;
    }
    int wrap = s->ring_head + total > s->ring_bytes; /* no room before the end: start at the front */
    uint64_t gap = wrap ? s->ring_bytes - s->ring_head : 0;
    if (s->ring_used + gap + total > s->ring_bytes) break;
    uint64_t pos = wrap ? 0 : s->ring_head;
    for (uint32_t i = s->qalloc; i < k; i++) {
      entry* f = at(s, i);
      f->allocated = 1;
      if (f->dropped) {
        f->span = 0;
        continue;
      }
      f->pos = pos, f->span = f->len + gap;
      pos += f->len, gap = 0;
    }
    s->ring_used += (wrap ? s->ring_bytes - s->ring_head : 0) + total;
    s->ring_head = pos;
    s->qalloc = k;
  }
}

/* Queues weight id for pass `pass` (the running one, or the next when speculating). */
static int push(window_store* s, uint32_t id, uint32_t pass) {
  if (s->qlen == s->qcap) return -1;
  entry* e = at(s, s->qlen);
  uint64_t len = wbytes(s->table, id);
  *e = (entry){.id = id, .pass = pass, .len = len, .chunks = (uint32_t)((len + CHUNK - 1) / CHUNK)};
  s->qlen++;
  return 0;
}

/* The pass is past entry e: done with if it was used, else dropped (its reads stop; its space is reclaimed). */
static void pass_over(window_store* s, entry* e) {
  if (e->used || e->dropped || e->refs) return;
  if (e->touched) {
    e->used = 1;
  } else {
    e->dropped = 1, s->dropped++;
    /* queued for this pass or an earlier one (not ahead, for the next): its route ran without selecting it */
    if (s->routed && s->routed[e->id] && e->pass <= s->pass) s->pred[e->id] = 0;
  }
}

/* Drops the queued weights nobody holds or has used (their reads stop; their space is reclaimed). */
static void drop_pending(window_store* s, uint32_t upto) {
  for (uint32_t i = 0; i < upto && i < s->qlen; i++) pass_over(s, at(s, i));
}

/* The queue position of the entry serving weight id: the oldest one not yet used or dropped; qlen if none. */
static uint32_t find(window_store* s, uint32_t id) {
  for (uint32_t i = 0; i < s->qlen; i++) {
    entry* e = at(s, i);
    if (e->id == id && !e->used && !e->dropped) return i;
  }
  return s->qlen;
}

/* Decode runs the same program token after token: once the same order was announced twice in a row and all of it
 * has ring space, queue it again so the readers go on into the next token's weights instead of idling while the
 * rest of this token computes. A different program next skips these (acquire drops what it passes over: counted
 * as dropped). */
static int should_speculate(const window_store* s) {
  return !s->spec && s->n_last && s->hash_last == s->hash_prev && s->qalloc == s->qlen && !s->failed;
}

static void speculate(window_store* s) {
  s->spec = 1;
  for (uint32_t i = 0; i < s->n_last; i++)
    if (push(s, s->last[i], s->pass + 1) != 0) break;
}

/* The queue position of the entry the running pass queued for routed weight w; qlen if none. */
static uint32_t find_routed(window_store* s, uint32_t w) {
  for (uint32_t i = 0; i < s->qlen; i++) {
    entry* e = at(s, i);
    if (e->id == w && e->pass == s->pass && !e->used && !e->dropped) return i;
  }
  return s->qlen;
}

/* Buffered reads leave the file in the page cache: drop what lies behind the oldest read still pending, in
 * whole aligned blocks (io.h). When that read is back at the front of the file, a new pass began: the rest of the
 * last one goes too. Returns 1 with [*a, *b) to drop. */
static int drop_behind(window_store* s, uint64_t* a, uint64_t* b) {
  uint64_t low = UINT64_MAX;
  for (uint32_t i = 0; i < s->qalloc && low == UINT64_MAX; i++) {
    entry* e = at(s, i);
    if (!e->dropped && e->done < e->chunks) low = s->table[e->id].offset - lead(s->table, e->id);
  }
  if (low == UINT64_MAX) return 0;
  uint64_t t = low / EL_IO_DROP_ALIGN * EL_IO_DROP_ALIGN;
  if (low >= s->drop_from) {
    if (t <= s->drop_from) return 0;
    *a = s->drop_from, *b = t;
  } else {
    *a = s->drop_from, *b = s->file_bytes;
  }
  s->drop_from = t;
  return *b > *a;
}

/* Readers ----------------------------------------------------------------------------------------------------- */

static void* reader(void* arg) {
  window_store* s = arg;
  char err[256];
  pthread_mutex_lock(&s->mu);
  while (!s->stop) {
    reclaim_and_allocate(s);
    uint32_t slot = UINT32_MAX, c = 0;
    for (uint32_t i = 0; i < s->qalloc && !s->failed; i++) {
      entry* e = at(s, i);
      if (!e->dropped && e->next < e->chunks) {
        slot = (s->qhead + i) % s->qcap, c = e->next++;
        break;
      }
    }
    if (slot == UINT32_MAX) {
      if (should_speculate(s)) {
        speculate(s);
        continue;
      }
      pthread_cond_wait(&s->work, &s->mu);
      continue;
    }
    entry* e = &s->q[slot];
    /* the weight's own bytes in this chunk (el_io_read rounds the read up to whole blocks, within the entry) */
    uint64_t need = lead(s->table, e->id) + s->table[e->id].nbytes;
    uint64_t off = (uint64_t)c * CHUNK, len = need - off < CHUNK ? need - off : CHUNK;
    uint8_t* dst = s->ring + e->pos + off;
    uint64_t src = s->table[e->id].offset - lead(s->table, e->id) + off;
    pthread_mutex_unlock(&s->mu);
    int rc = el_io_read(s->io, dst, src, len, err, sizeof err);
    pthread_mutex_lock(&s->mu);
    e->done++; /* the slot cannot be reused while a read is in flight (finished() needs next == done) */
    if (rc != 0 && !s->failed) s->failed = 1, snprintf(s->io_err, sizeof s->io_err, "%s", err);
    pthread_cond_broadcast(&s->landed);
    if (e->done == e->next && (e->dropped || rc != 0)) pthread_cond_broadcast(&s->work); /* space to reclaim */
    uint64_t d0, d1;
    if (rc == 0 && drop_behind(s, &d0, &d1)) {
      pthread_mutex_unlock(&s->mu);
      el_io_drop(s->io, d0, d1 - d0);
      pthread_mutex_lock(&s->mu);
    }
  }
  pthread_mutex_unlock(&s->mu);
  return NULL;
}

/* Store interface --------------------------------------------------------------------------------------------- */

/* A route selected routed weight w: served from pinned memory or the predicted stream if there, else read now into
 * the routed cache. */
static void select_routed(window_store* s, uint32_t w) {
  pthread_mutex_lock(&s->mu);
  s->pred[w] = 1;
  int have = s->pin_at[w] != STREAMED || find_routed(s, w) < s->qlen;
  pthread_mutex_unlock(&s->mu);
  if (!have && s->rc) have = el_rc_prefetch(s->rc, w); /* cached from an earlier selection, or read now */
  pthread_mutex_lock(&s->mu);
  s->routed_hits += have, s->routed_misses += !have;
  pthread_mutex_unlock(&s->mu);
}

/* A program announces its weights when it starts (routed ones included: all a route may select). Of the routed
 * ones, the pass reads those their route selected the last time it ran. What the queue already holds, in that order
 * and unused (the copy the readers queued on their own, see below), is kept, less routed weights no longer
 * predicted; the rest is queued behind it. */
static void window_prefetch(el_weight_store* b, const uint32_t* ids, uint32_t n) {
  window_store* s = (window_store*)b;
  if (n == 1 && s->routed && ids[0] < s->n && s->routed[ids[0]]) {
    select_routed(s, ids[0]);
    return;
  }
  pthread_mutex_lock(&s->mu);
  s->pass++;
  uint32_t m = 0;
  uint64_t h = 1469598103934665603ull; /* FNV-1a over the announced ids */
  for (uint32_t i = 0; i < n; i++) {
    uint32_t w = ids[i];
    if (w >= s->n || s->pin_at[w] != STREAMED) continue;
    h = (h ^ w) * 1099511628211ull;
    if (!s->routed || !s->routed[w] || s->pred[w]) s->last[m++] = w;
  }
  s->n_last = m;
  s->hash_prev = s->hash_last, s->hash_last = h;
  uint32_t q = 0, k = 0; /* queue position, announced weights already queued */
  while (q < s->qlen && k < m) {
    entry* e = at(s, q);
    if (e->used || e->dropped || e->touched) {
      q++;
    } else if (e->id == s->last[k]) {
      e->pass = s->pass; /* queued ahead (speculation): this pass's now */
      q++, k++;
    } else if (s->routed && s->routed[e->id] && e->id < s->last[k] && !e->refs) {
      e->dropped = 1, s->dropped++, q++; /* queued ahead, no longer predicted */
    } else if (s->routed && s->routed[s->last[k]] && s->last[k] < e->id) {
      k++; /* newly predicted: read on demand if selected */
    } else {
      break;
    }
  }
  s->spec = 0;
  int any = 0;
  for (uint32_t i = k; i < m; i++) any |= push(s, s->last[i], s->pass) == 0;
  if (any || k) {
    reclaim_and_allocate(s);
    pthread_cond_broadcast(&s->work);
  }
  pthread_mutex_unlock(&s->mu);
}

/* Releases what the routed cache serves of ids[0, n) (via[i] set); clears via. */
static void release_routed(window_store* s, const uint32_t* ids, uint32_t n, uint8_t* via) {
  for (uint32_t i = 0; i < n; i++)
    if (via[i]) el_rc_release(s->rc, ids[i]), via[i] = 0;
}

/* A weight that is not streamed: in the pinned copy, or in the file mapping (row lookups). */
static const void* held(const window_store* s, uint32_t w) {
  if (s->pin_at[w] == MAPPED) return s->map + s->table[w].offset;
  return s->pinned + s->pin_at[w] + lead(s->table, w);
}

/* Where the running pass queued weight w (routed weights: only this pass's prediction counts); qlen if nowhere. */
static uint32_t ring_pos(window_store* s, uint32_t w) {
  return s->routed && s->routed[w] ? find_routed(s, w) : find(s, w);
}

static int window_acquire(el_weight_store* b, const uint32_t* ids, uint32_t n, const void** ptrs) {
  window_store* s = (window_store*)b;
  uint32_t pos[64];
  uint8_t via[64] = {0}; /* 1: a selected routed weight the pass did not predict, served by the routed cache */
  if (n > 64) return snprintf(b->err, sizeof b->err, "a step with %u weights", n), -1;
  for (uint32_t i = 0; i < n; i++)
    if (ids[i] >= s->n)
      return snprintf(b->err, sizeof b->err, "weight %u does not exist (the plan has %u)", ids[i], s->n), -1;
  if (!s->io) return snprintf(b->err, sizeof b->err, "the store was opened for planning only"), -1;
  if (!s->ring) {
    for (uint32_t i = 0; i < n; i++) ptrs[i] = held(s, ids[i]);
    return 0;
  }
  pthread_mutex_lock(&s->mu);
  uint32_t n_ring = 0;
  for (uint32_t i = 0; i < n; i++) {
    if (s->pin_at[ids[i]] != STREAMED) continue;
    via[i] = s->rc && s->routed[ids[i]] && find_routed(s, ids[i]) == s->qlen;
    n_ring += !via[i];
  }
  pthread_mutex_unlock(&s->mu);
  for (uint32_t i = 0; i < n; i++)
    if (via[i] && !(ptrs[i] = el_rc_acquire(s->rc, ids[i], b->err, sizeof b->err))) {
      via[i] = 0;
      release_routed(s, ids, i, via);
      return -1;
    }
  if (!n_ring) {
    for (uint32_t i = 0; i < n; i++)
      if (s->pin_at[ids[i]] != STREAMED) ptrs[i] = held(s, ids[i]);
    return 0;
  }
#define IN_RING(i) (s->pin_at[ids[i]] == STREAMED && !via[i])
  pthread_mutex_lock(&s->mu);
  /* find (or queue) every streamed weight; anything announced before the latest of them was skipped */
  uint32_t last = 0, missing = 0;
  for (uint32_t i = 0; i < n; i++) {
    if (!IN_RING(i)) continue;
    uint32_t p = pos[i] = ring_pos(s, ids[i]);
    if (p == s->qlen) missing = 1;
    else if (p + 1 > last) last = p + 1;
  }
  if (missing) { /* out of the announced order: drop the prefetches, read these now */
    drop_pending(s, s->qlen);
    reclaim_and_allocate(s);
    for (uint32_t i = 0; i < n; i++)
      if (IN_RING(i) && ring_pos(s, ids[i]) == s->qlen && push(s, ids[i], s->pass) != 0) {
        pthread_mutex_unlock(&s->mu);
        release_routed(s, ids, n, via);
        return snprintf(b->err, sizeof b->err, "the read queue is full"), -1;
      }
  } else if (last) {
    for (uint32_t i = 0; i + 1 < last; i++) { /* skipped: not one of ours (an older entry of the same weight is) */
      int ours = 0;
      for (uint32_t k = 0; k < n; k++) ours |= IN_RING(k) && pos[k] == i;
      if (!ours) pass_over(s, at(s, i));
    }
  }
  reclaim_and_allocate(s);
  pthread_cond_broadcast(&s->work);
  double t0 = 0;
  for (;;) {
    int ready = 1;
    for (uint32_t i = 0; i < n && ready; i++) {
      if (!IN_RING(i)) continue;
      pos[i] = ring_pos(s, ids[i]);
      if (pos[i] == s->qlen) { /* never queued for this pass (a bug if it happens): queue it rather than wait */
        drop_pending(s, s->qlen);
        reclaim_and_allocate(s);
        if (push(s, ids[i], s->pass) != 0) {
          s->failed = 1;
          snprintf(s->io_err, sizeof s->io_err, "the read queue is full");
        }
        pthread_cond_broadcast(&s->work);
        ready = 0;
        break;
      }
      entry* e = at(s, pos[i]);
      ready = e->allocated && e->done == e->chunks;
    }
    if (ready || s->failed) break;
    if (t0 == 0) t0 = el_io_now();
    pthread_cond_wait(&s->landed, &s->mu);
  }
  if (s->failed) {
    snprintf(b->err, sizeof b->err, "%s", s->io_err);
    pthread_mutex_unlock(&s->mu);
    release_routed(s, ids, n, via);
    return -1;
  }
  if (t0) s->stall_s += el_io_now() - t0, s->misses++;
  else s->hits++;
  for (uint32_t i = 0; i < n; i++) {
    if (via[i]) continue;
    if (s->pin_at[ids[i]] != STREAMED) {
      ptrs[i] = held(s, ids[i]);
    } else {
      entry* e = at(s, pos[i]);
      e->refs++, e->touched = 1;
      ptrs[i] = s->ring + e->pos + lead(s->table, ids[i]);
    }
  }
#undef IN_RING
  pthread_mutex_unlock(&s->mu);
  return 0;
}

static void window_release(el_weight_store* b, const uint32_t* ids, uint32_t n) {
  window_store* s = (window_store*)b;
  if (!s->ring) return;
  pthread_mutex_lock(&s->mu);
  for (uint32_t i = 0; i < n; i++) {
    if (ids[i] >= s->n || s->pin_at[ids[i]] != STREAMED) continue;
    if (s->rc && s->routed[ids[i]] && el_rc_release(s->rc, ids[i])) continue; /* served by the routed cache */
    for (uint32_t k = 0; k < s->qlen; k++) {
      entry* e = at(s, k);
      if (e->id == ids[i] && e->refs > 0) {
        if (--e->refs == 0 && !(s->routed && s->routed[e->id])) e->used = 1;
        break;
      }
    }
  }
  reclaim_and_allocate(s);
  pthread_cond_broadcast(&s->work);
  pthread_mutex_unlock(&s->mu);
}

static uint64_t window_bytes(const el_weight_store* b) {
  const window_store* s = (const window_store*)b;
  return s->pinned_map + s->ring_bytes + el_rc_bytes(s->rc);
}

static void window_counters(el_weight_store* b, el_store_counters* out) {
  window_store* s = (window_store*)b;
  *out = (el_store_counters){0};
  pthread_mutex_lock(&s->mu);
  if (s->io) el_io_counters(s->io, &out->bytes_read, &out->requests);
  out->hits = s->hits, out->misses = s->misses, out->dropped = s->dropped, out->stall_s = s->stall_s;
  pthread_mutex_unlock(&s->mu);
  if (s->rc) {
    el_rc_counters_t k;
    el_rc_counters(s->rc, &k);
    out->dropped += k.dropped, out->stall_s += k.stall_s;
  }
  pthread_mutex_lock(&s->mu);
  out->routed_hits = s->routed_hits, out->routed_misses = s->routed_misses;
  pthread_mutex_unlock(&s->mu);
}

static void window_close(el_weight_store* b) {
  window_store* s = (window_store*)b;
  if (!s) return;
  pthread_mutex_lock(&s->mu);
  s->stop = 1;
  pthread_cond_broadcast(&s->work);
  pthread_mutex_unlock(&s->mu);
  for (int i = 0; i < s->n_threads; i++) pthread_join(s->threads[i], NULL);
  el_rc_close(s->rc);
  if (s->pinned) munmap(s->pinned, s->pinned_map);
  if (s->ring) munmap(s->ring, s->ring_bytes);
  if (s->map) munmap(s->map, s->file_bytes);
  el_io_close(s->io);
  pthread_mutex_destroy(&s->mu);
  pthread_mutex_destroy(&s->run);
  pthread_cond_destroy(&s->landed);
  pthread_cond_destroy(&s->work);
  free(s->q), free(s->last), free(s->pin_at), free(s->pinned_mask), free(s->routed), free(s->pred), free(s->unit);
  free(s);
}

/* Reads the pinned weights, coalescing neighbours in the file into large requests. */
static int read_pinned(window_store* s, char* err, size_t errlen) {
  uint32_t* order = malloc(sizeof *order * (s->n ? s->n : 1));
  uint32_t k = 0;
  if (!order) return snprintf(err, errlen, "out of memory"), -1;
  for (uint32_t w = 0; w < s->n; w++) /* the table is in file order, and so is the pinned buffer */
    if (s->pin_at[w] < MAPPED) order[k++] = w;
  int rc = 0;
  uint64_t dropped = 0;
  for (uint32_t i = 0; i < k && rc == 0;) {
    uint32_t j = i + 1;
    uint64_t start = s->table[order[i]].offset - lead(s->table, order[i]), dst = s->pin_at[order[i]];
    uint64_t end = start + wbytes(s->table, order[i]);
    while (j < k && s->table[order[j]].offset == end && s->pin_at[order[j]] == dst + (end - start) &&
           end - start < PIN_READ)
      end += wbytes(s->table, order[j]), j++;
    uint32_t last = order[j - 1]; /* read to its last byte; el_io_read rounds up to whole blocks */
    rc = el_io_read(s->io, s->pinned + dst, start, s->table[last].offset + s->table[last].nbytes - start, err, errlen);
    uint64_t behind = end / EL_IO_DROP_ALIGN * EL_IO_DROP_ALIGN; /* the copy is ours: no page cache beside it */
    if (behind > dropped) el_io_drop(s->io, dropped, behind - dropped), dropped = behind;
    i = j;
  }
  free(order);
  return rc;
}

el_weight_store* el_store_open_window(const el_store_config* cfg, char* err, size_t errlen) {
  const el_storage_profile* prof = el_storage_profile_find(cfg->storage);
  if (!prof) {
    snprintf(err, errlen, "unknown storage profile \"%s\" (known: %s)", cfg->storage, el_storage_profile_names());
    return NULL;
  }
  window_store* s = calloc(1, sizeof *s);
  if (!s || !(s->pin_at = malloc(sizeof *s->pin_at * (cfg->n ? cfg->n : 1))) ||
      !(s->pinned_mask = calloc(cfg->n ? cfg->n : 1, 1))) {
    if (s) free(s->pin_at), free(s);
    snprintf(err, errlen, "out of memory");
    return NULL;
  }
  pthread_mutex_init(&s->mu, NULL);
  pthread_mutex_init(&s->run, NULL);
  pthread_cond_init(&s->landed, NULL);
  pthread_cond_init(&s->work, NULL);
  s->table = cfg->table, s->n = cfg->n, s->file_bytes = cfg->file_bytes;
  el_weight_store* b = &s->base;
  b->acquire = window_acquire, b->release = window_release, b->prefetch = window_prefetch;
  b->close = window_close, b->bytes_resident = window_bytes, b->counters = window_counters;
  b->policy = "window";
  b->pinned = s->pinned_mask;
  b->run_lock = &s->run;
  uint64_t cache = el_io_cache_reserve(cfg->path, prof, cfg->direct_io);
  if (plan_layout(cfg, cache, &b->layout, s->pinned_mask, err, errlen) != 0) goto fail;
  el_store_layout* lay = &b->layout;
  lay->storage = prof->name, lay->storage_what = prof->what;
  lay->storage_bytes_per_s = prof->bytes_per_s, lay->storage_latency_s = prof->latency_s;
  lay->storage_modelled = prof->modelled;
  lay->direct_io = !prof->modelled && cfg->direct_io;
  uint64_t at = 0;
  int any_mapped = 0;
  for (uint32_t w = 0; w < s->n; w++) {
    uint8_t p = s->pinned_mask[w];
    s->pin_at[w] = p == 2 ? MAPPED : p ? at : STREAMED;
    if (p == 1) at += wbytes(s->table, w);
    any_mapped |= p == 2;
    s->pinned_mask[w] = p == 1 || p == 2; /* the API's mask: 1 = held (pinned or mapped), 0 = read as it runs */
  }
  if (cfg->plan_only) return b;

  if (!(s->io = el_io_open(cfg->path, cfg->file_bytes, prof, cfg->direct_io, err, errlen))) goto fail;
  if (any_mapped) {
    uint8_t* mapped = calloc(s->n ? s->n : 1, 1);
    if (!mapped) {
      snprintf(err, errlen, "out of memory");
      goto fail;
    }
    for (uint32_t w = 0; w < s->n; w++) mapped[w] = s->pin_at[w] == MAPPED;
    s->map = el_io_map_lookups(cfg->path, s->file_bytes, s->table, s->n, mapped, err, errlen);
    free(mapped);
    if (!s->map) goto fail;
  }
  lay->direct_io = el_io_direct(s->io);
  int any_routed = 0; /* streamed routed weights: predicted, the rest read on demand */
  if (lay->routed_bytes) {
    if (!(s->routed = calloc(s->n ? s->n : 1, 1)) || !(s->pred = malloc(s->n ? s->n : 1))) {
      snprintf(err, errlen, "out of memory");
      goto fail;
    }
    memset(s->pred, 1, s->n); /* the first pass reads them all */
    for (uint32_t w = 0; w < s->n; w++) {
      s->routed[w] = cfg->must_pin && cfg->must_pin[w] == 3;
      any_routed |= s->routed[w] && s->pin_at[w] == STREAMED;
    }
  }
  if (any_routed) {
    uint64_t slot = el_rc_slot_bytes(s->table, s->n, s->routed);
    if (!(s->rc = el_rc_open(s->table, s->n, s->routed, (uint32_t)(lay->routed_cache_bytes / slot), EL_RC_CYCLIC, s->io, err,
                             errlen)))
      goto fail;
  }
  s->pinned_map = at;
  if (at) {
    s->pinned = mmap(NULL, at, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (s->pinned == MAP_FAILED) {
      s->pinned = NULL;
      snprintf(err, errlen, "out of memory for %llu bytes of pinned weights", (unsigned long long)at);
      goto fail;
    }
#ifdef MADV_HUGEPAGE
    madvise(s->pinned, at, MADV_HUGEPAGE); /* decode streams them every token: fewer TLB misses */
#endif
    if (read_pinned(s, err, errlen) != 0) goto fail;
    mprotect(s->pinned, at, PROT_READ);
    el_io_drop(s->io, 0, s->file_bytes); /* the copy is ours now */
  }
  if (lay->streamed_bytes) {
    s->ring_bytes = lay->window_bytes;
    s->ring = mmap(NULL, s->ring_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (s->ring == MAP_FAILED) {
      s->ring = NULL;
      snprintf(err, errlen, "out of memory for a %llu-byte weight window", (unsigned long long)s->ring_bytes);
      goto fail;
    }
    s->qcap = 4 * lay->streamed_weights + 64;
    if (!(s->unit = malloc(sizeof *s->unit * (s->n ? s->n : 1)))) {
      snprintf(err, errlen, "out of memory");
      goto fail;
    }
    for (uint32_t w = 0; w < s->n; w++) s->unit[w] = UINT32_MAX;
    for (uint32_t i = 0; i < cfg->n_seq; i++) s->unit[cfg->seq[i]] = cfg->seq_step[i];
    if (!(s->q = calloc(s->qcap, sizeof *s->q)) || !(s->last = malloc(sizeof *s->last * (s->n ? s->n : 1)))) {
      snprintf(err, errlen, "out of memory");
      goto fail;
    }
    int want = cfg->io_threads > 0 ? cfg->io_threads : 2;
    for (int i = 0; i < (want > MAX_THREADS ? MAX_THREADS : want); i++) {
      if (pthread_create(&s->threads[i], NULL, reader, s) != 0) break;
      s->n_threads++;
    }
    if (!s->n_threads) {
      snprintf(err, errlen, "cannot start a reader thread: %s", strerror(errno));
      goto fail;
    }
  }
  return b;
fail:
  window_close(b);
  return NULL;
}
