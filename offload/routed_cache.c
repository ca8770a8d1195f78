/* Routed-weight cache (routed_cache.h). */
#define _GNU_SOURCE
#include "routed_cache.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

enum { FREE = 0, QUEUED, READING, READY };
#define NONE UINT32_MAX

typedef struct {
  uint32_t w;      /* the weight it holds (NONE: free) */
  int state;
  int refs;        /* acquired and not yet released */
  int wanted;      /* selected (prefetched) and not yet acquired: kept until used */
  int guessed;     /* read because a guess named it; no selection has used it yet */
  int first;       /* selected; its first acquire not yet made (counts a stall if it waits) */
  int prio;        /* read order: 0 selected, 1 guessed */
  uint64_t seq;    /* when it was queued */
  uint32_t group;  /* guessed: the route it was guessed for (its first expert weight) */
  uint32_t gen;    /* guessed: that route's selections so far when it was guessed */
  uint64_t used;   /* tick of its last use (acquire or selection) */
} slot;

struct el_routed_cache {
  const el_plan_weight* table;
  uint32_t n, n_slots;
  el_rc_policy policy;
  uint32_t* slot_of; /* per weight: its slot or NONE */
  uint32_t* count;   /* per weight: times selected (FREQ: halved every `age` selections) */
  uint32_t* total;   /* per weight: times selected since open (LFU) */
  uint32_t* group;   /* per weight: the route a guess named it for (its first expert weight; NONE: never guessed) */
  uint32_t* gen;     /* per route (by first expert weight): selections so far */
  uint64_t selections, age, seq;
  slot* slots;
  uint64_t slot_bytes;
  uint8_t* mem;
  el_io* io;
  pthread_mutex_t mu;
  pthread_cond_t work, landed;
  pthread_t threads[2]; /* two reads in flight: a flash queue serves them in parallel */
  int started, stop, failed;
  char io_err[256];
  uint64_t tick;
  el_rc_counters_t k;
};

static uint64_t lead(const el_plan_weight* t, uint32_t w) { return t[w].offset % EL_IO_ALIGN; }
static uint64_t as_read(const el_plan_weight* t, uint32_t w) {
  return (lead(t, w) + t[w].nbytes + EL_IO_ALIGN - 1) / EL_IO_ALIGN * EL_IO_ALIGN;
}

int el_rc_policy_find(const char* name) {
  if (!name || !*name || !strcmp(name, "freq")) return EL_RC_FREQ;
  if (!strcmp(name, "cyclic")) return EL_RC_CYCLIC;
  if (!strcmp(name, "lru")) return EL_RC_LRU;
  if (!strcmp(name, "lfu")) return EL_RC_LFU;
  return -1;
}

uint64_t el_rc_slot_bytes(const el_plan_weight* table, uint32_t n, const uint8_t* routed) {
  uint64_t m = 0;
  for (uint32_t w = 0; w < n; w++)
    if (routed[w] && as_read(table, w) > m) m = as_read(table, w);
  return m;
}

/* Whether cached slot a should make room before slot b (routed_cache.h: the policies). */
static int worse(const el_routed_cache* c, uint32_t a, uint32_t b) {
  const slot *x = &c->slots[a], *y = &c->slots[b];
  if (c->policy == EL_RC_LRU) return x->used < y->used;
  if (c->policy == EL_RC_LFU) {
    uint32_t ta = c->total[x->w], tb = c->total[y->w];
    return ta != tb ? ta < tb : x->used < y->used;
  }
  uint32_t ca = c->count[x->w], cb = c->count[y->w];
  if (ca != cb) return ca < cb;
  return c->policy == EL_RC_CYCLIC ? x->used > y->used : x->used < y->used;
}

/* Whether a guess of w may take slot s (its policy's victim): the victim stays if it was selected more often than
 * the guessed one (it would only be read back soon: TinyLFU's admission rule), counted since load under lfu and lately
 * under freq and lru. lru admitting every guess pushed a cache at the edge of the working set over LRU's cliff
 * (demo-moe at 25%: 68% of selections cached without guesses, 24% with them; 63% with this rule). */
static int admit(const el_routed_cache* c, uint32_t w, uint32_t s) {
  uint32_t v = c->slots[s].w;
  if (c->slots[s].state == FREE || v == NONE) return 1;
  return c->policy == EL_RC_LFU ? c->total[v] <= c->total[w] : c->count[v] <= c->count[w];
}

/* A guess whose route has not run since: other guesses leave it alone. */
static int fresh_guess(const el_routed_cache* c, const slot* x) {
  return x->guessed && c->gen[x->group] == x->gen;
}

/* A slot for a new weight (mu held): a free one, else a wrong guess's, else the worst one nobody holds or waits for
 * (for a guess, not a fresh guess either); with force, else one selected but not yet used (its selection is
 * dropped). NONE if every slot is busy. */
static uint32_t victim(el_routed_cache* c, int force, int for_guess) {
  uint32_t best = NONE, wrong = NONE;
  for (uint32_t s = 0; s < c->n_slots; s++) {
    slot* x = &c->slots[s];
    if (x->state == FREE) return s;
    if (x->state == READY && x->guessed && !fresh_guess(c, x) && !x->refs && !x->wanted && wrong == NONE)
      wrong = s; /* a wrong guess (its route ran without it): nobody asked for it, it goes first */
    if (x->state == READY && !x->refs && !x->wanted && !(for_guess && fresh_guess(c, x)) &&
        (best == NONE || worse(c, s, best)))
      best = s;
  }
  if (wrong != NONE) return wrong;
  if (best != NONE || !force) return best;
  for (uint32_t s = 0; s < c->n_slots; s++) {
    slot* x = &c->slots[s];
    if (x->state == READY && !x->refs && (best == NONE || worse(c, s, best))) best = s;
  }
  if (best != NONE) c->k.dropped++;
  return best;
}

/* A slot for a guess (mu held): a free one, a wrong guess's, else (while live guesses hold fewer than an eighth of
 * the slots: the rest stay a cache of what was selected) the policy's victim if admitted. NONE: no read. */
static uint32_t guess_slot(el_routed_cache* c, uint32_t w) {
  uint32_t live = 0, stale = NONE;
  for (uint32_t s = 0; s < c->n_slots; s++) {
    slot* x = &c->slots[s];
    if (x->state == FREE) return s;
    if (x->guessed && c->gen[x->group] == x->gen) live++;
    else if (x->guessed && x->state == READY && !x->refs && !x->wanted && (stale == NONE || worse(c, s, stale)))
      stale = s;
  }
  if (stale != NONE) return stale;
  if (8 * live >= c->n_slots) return NONE;
  uint32_t s = victim(c, 0, 1);
  return s != NONE && admit(c, w, s) ? s : NONE;
}

static void assign(el_routed_cache* c, uint32_t w, uint32_t s, int prio) {
  slot* x = &c->slots[s];
  if (x->w != NONE) c->slot_of[x->w] = NONE;
  if (x->guessed) c->k.predict_wasted++; /* evicted before any selection used it */
  *x = (slot){.w = w, .state = QUEUED, .prio = prio, .seq = ++c->seq, .used = ++c->tick};
  c->slot_of[w] = s;
  pthread_cond_signal(&c->work);
}

/* The queued slot to read next: selected ones first, each kind in queue order; a guessed one only while no
 * selected one is being read (a guess must not slow the reads a kernel waits for) (mu held). */
static uint32_t next_read(const el_routed_cache* c) {
  uint32_t best = NONE;
  int demand = 0;
  for (uint32_t s = 0; s < c->n_slots; s++) {
    const slot* x = &c->slots[s];
    demand |= x->state == READING && x->prio == 0;
    if (x->state != QUEUED) continue;
    if (best == NONE || x->prio < c->slots[best].prio ||
        (x->prio == c->slots[best].prio && x->seq < c->slots[best].seq))
      best = s;
  }
  return best != NONE && c->slots[best].prio && demand ? NONE : best;
}

static void* reader(void* arg) {
  el_routed_cache* c = arg;
  char err[256];
  pthread_mutex_lock(&c->mu);
  while (!c->stop) {
    uint32_t s = next_read(c);
    if (s == NONE) {
      pthread_cond_wait(&c->work, &c->mu);
      continue;
    }
    slot* x = &c->slots[s];
    x->state = READING;
    uint32_t w = x->w;
    uint64_t off = c->table[w].offset - lead(c->table, w), len = lead(c->table, w) + c->table[w].nbytes;
    pthread_mutex_unlock(&c->mu);
    int rc = c->failed ? -1 : el_io_read(c->io, c->mem + (uint64_t)s * c->slot_bytes, off, len, err, sizeof err);
    /* the copy is ours: drop the page cache around it (whole large folios; see io.h) */
    uint64_t a = off / EL_IO_DROP_ALIGN * EL_IO_DROP_ALIGN;
    uint64_t b = (off + len + EL_IO_DROP_ALIGN - 1) / EL_IO_DROP_ALIGN * EL_IO_DROP_ALIGN;
    if (rc == 0) el_io_drop(c->io, a, b - a);
    pthread_mutex_lock(&c->mu);
    if (rc != 0 && !c->failed) c->failed = 1, snprintf(c->io_err, sizeof c->io_err, "%s", err);
    x->state = READY;
    pthread_cond_broadcast(&c->landed);
  }
  pthread_mutex_unlock(&c->mu);
  return NULL;
}

el_routed_cache* el_rc_open(const el_plan_weight* table, uint32_t n, const uint8_t* routed, uint32_t n_slots,
                            el_rc_policy policy, el_io* io, char* err, size_t errlen) {
  el_routed_cache* c = calloc(1, sizeof *c);
  if (!c) return snprintf(err, errlen, "out of memory"), NULL;
  c->table = table, c->n = n, c->io = io, c->n_slots = n_slots < 2 ? 2 : n_slots, c->policy = policy;
  c->slot_bytes = el_rc_slot_bytes(table, n, routed);
  pthread_mutex_init(&c->mu, NULL);
  pthread_cond_init(&c->work, NULL);
  pthread_cond_init(&c->landed, NULL);
  c->slot_of = malloc(sizeof *c->slot_of * (n ? n : 1));
  c->count = calloc(n ? n : 1, sizeof *c->count);
  c->total = calloc(n ? n : 1, sizeof *c->total);
  c->group = malloc(sizeof *c->group * (n ? n : 1));
  c->gen = calloc(n ? n : 1, sizeof *c->gen);
  for (uint32_t w = 0; w < n; w++) c->age += routed[w] != 0;
  c->age = 16 * (c->age ? c->age : 1); /* about 16 tokens of selections when every group is selected */
  c->slots = calloc(c->n_slots, sizeof *c->slots);
  if (!c->slot_of || !c->count || !c->total || !c->group || !c->gen || !c->slots) {
    snprintf(err, errlen, "out of memory");
    goto fail;
  }
  for (uint32_t w = 0; w < n; w++) c->slot_of[w] = NONE, c->group[w] = NONE;
  for (uint32_t s = 0; s < c->n_slots; s++) c->slots[s].w = NONE;
  c->mem = mmap(NULL, c->slot_bytes * c->n_slots, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (c->mem == MAP_FAILED) {
    c->mem = NULL;
    snprintf(err, errlen, "out of memory for a %llu-byte routed-weight cache",
             (unsigned long long)(c->slot_bytes * c->n_slots));
    goto fail;
  }
#ifdef MADV_HUGEPAGE
  madvise(c->mem, c->slot_bytes * c->n_slots, MADV_HUGEPAGE); /* kernels stream the slots: fewer TLB misses */
#endif
  for (int i = 0; i < 2; i++) {
    if (pthread_create(&c->threads[i], NULL, reader, c) != 0) break;
    c->started++;
  }
  if (!c->started) {
    snprintf(err, errlen, "cannot start a reader thread: %s", strerror(errno));
    goto fail;
  }
  return c;
fail:
  el_rc_close(c);
  return NULL;
}

int el_rc_prefetch(el_routed_cache* c, uint32_t w) {
  if (w >= c->n) return 0;
  pthread_mutex_lock(&c->mu);
  if (++c->selections % c->age == 0)
    for (uint32_t v = 0; v < c->n; v++) c->count[v] >>= 1;
  c->count[w]++, c->total[w]++, c->k.selected++;
  if (c->group[w] != NONE) c->gen[c->group[w]]++; /* its route ran: the guesses made for it are fair game now */
  uint32_t s = c->slot_of[w];
  int cached = s != NONE;
  if (cached) {
    slot* x = &c->slots[s];
    c->k.hits++;
    if (x->guessed) c->k.prefetched++;
    else c->k.cached++;
    x->guessed = 0, x->prio = 0, x->used = ++c->tick; /* a queued guess is now a selection: read it first */
  } else if ((s = victim(c, 0, 0)) != NONE) {
    assign(c, w, s, 0), c->k.misses++;
  } else {
    c->k.misses++; /* every slot busy: acquire reads it */
  }
  if (s != NONE) c->slots[s].wanted = 1, c->slots[s].first = 1;
  pthread_mutex_unlock(&c->mu);
  return cached;
}

int el_rc_fill(el_routed_cache* c, const uint32_t* ws, uint32_t n, char* err, size_t errlen) {
  pthread_mutex_lock(&c->mu);
  for (uint32_t i = 0; i < n; i++) {
    uint32_t s = ws[i] < c->n && c->slot_of[ws[i]] == NONE ? victim(c, 0, 0) : NONE;
    if (s == NONE || c->slots[s].state != FREE) break; /* only free slots: filling never evicts */
    assign(c, ws[i], s, 0);
  }
  int rc = 0;
  for (uint32_t s = 0; s < c->n_slots; s++)
    while (c->slots[s].state != FREE && c->slots[s].state != READY && !c->failed)
      pthread_cond_wait(&c->landed, &c->mu);
  if (c->failed) snprintf(err, errlen, "%s", c->io_err), rc = -1;
  pthread_mutex_unlock(&c->mu);
  return rc;
}

void el_rc_predict(el_routed_cache* c, const uint32_t* ws, uint32_t n, uint32_t group) {
  if (group >= c->n) return;
  pthread_mutex_lock(&c->mu);
  for (uint32_t i = 0; i < n; i++) {
    uint32_t w = ws[i], s;
    if (w >= c->n) continue;
    c->group[w] = group;
    if ((s = c->slot_of[w]) != NONE) { /* held or on its way: keep it from other guesses until its route runs */
      if (c->slots[s].guessed) c->slots[s].group = group, c->slots[s].gen = c->gen[group];
      continue;
    }
    if ((s = guess_slot(c, w)) == NONE) continue; /* no room worth taking: the guess costs nothing */
    assign(c, w, s, 1);
    c->slots[s].guessed = 1, c->slots[s].group = group, c->slots[s].gen = c->gen[group];
    c->k.predict_reads++;
  }
  pthread_mutex_unlock(&c->mu);
}

const void* el_rc_acquire(el_routed_cache* c, uint32_t w, char* err, size_t errlen) {
  pthread_mutex_lock(&c->mu);
  uint32_t s = c->slot_of[w];
  int first = 0;
  if (s == NONE) {
    /* every slot is being read or waits for its selection's turn: the reader frees one (slots held across this
     * call are a caller's bug: one step acquires one routed weight) */
    while ((s = victim(c, 1, 0)) == NONE) {
      int held = 0;
      for (uint32_t k = 0; k < c->n_slots; k++) held += c->slots[k].refs > 0;
      if (held == (int)c->n_slots || c->failed) {
        pthread_mutex_unlock(&c->mu);
        snprintf(err, errlen, "%s", c->failed ? c->io_err : "the routed-weight cache has every slot acquired");
        return NULL;
      }
      pthread_cond_wait(&c->landed, &c->mu);
    }
    assign(c, w, s, 0);
    first = 1;
  }
  slot* x = &c->slots[s];
  first |= x->first;
  x->first = 0;
  x->refs++; /* held: the slot cannot be given away while we wait */
  double t0 = 0;
  while (x->state != READY && !c->failed) {
    if (t0 == 0) t0 = el_io_now();
    pthread_cond_wait(&c->landed, &c->mu);
  }
  if (c->failed) {
    x->refs--;
    snprintf(err, errlen, "%s", c->io_err);
    pthread_mutex_unlock(&c->mu);
    return NULL;
  }
  if (t0) c->k.stall_s += el_io_now() - t0, c->k.stalls += first;
  x->wanted = 0, x->guessed = 0, x->used = ++c->tick;
  const void* p = c->mem + (uint64_t)s * c->slot_bytes + lead(c->table, w);
  pthread_mutex_unlock(&c->mu);
  return p;
}

int el_rc_release(el_routed_cache* c, uint32_t w) {
  pthread_mutex_lock(&c->mu);
  uint32_t s = w < c->n ? c->slot_of[w] : NONE;
  int held = s != NONE && c->slots[s].refs > 0;
  if (held && --c->slots[s].refs == 0) pthread_cond_broadcast(&c->landed);
  pthread_mutex_unlock(&c->mu);
  return held;
}

uint64_t el_rc_bytes(const el_routed_cache* c) { return c ? c->slot_bytes * c->n_slots : 0; }
uint32_t el_rc_slots(const el_routed_cache* c) { return c ? c->n_slots : 0; }

void el_rc_counters(el_routed_cache* c, el_rc_counters_t* out) {
  pthread_mutex_lock(&c->mu);
  *out = c->k;
  pthread_mutex_unlock(&c->mu);
}

void el_rc_close(el_routed_cache* c) {
  if (!c) return;
  if (c->started) {
    pthread_mutex_lock(&c->mu);
    c->stop = 1;
    pthread_cond_broadcast(&c->work);
    pthread_mutex_unlock(&c->mu);
    for (int i = 0; i < c->started; i++) pthread_join(c->threads[i], NULL);
  }
  if (c->mem) munmap(c->mem, c->slot_bytes * c->n_slots);
  pthread_mutex_destroy(&c->mu);
  pthread_cond_destroy(&c->work);
  pthread_cond_destroy(&c->landed);
  free(c->slot_of), free(c->count), free(c->total), free(c->group), free(c->gen), free(c->slots);
  free(c);
}
