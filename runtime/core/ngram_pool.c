/* The n-gram pool (issue 36): drafts from what other contexts of the same model read and wrote.
 *
 * Prompt lookup (speculate.c) drafts from the context's own history. The pool extends it across contexts at a
 * constant cost in memory: a direct-mapped table of POOL_SLOTS slots, each holding 3 ids (the key) and the
 * POOL_NEXT ids that followed them the last time any context of this model saw them (prompts included: a server
 * asked the same question again, a regenerated reply, boilerplate every reply shares). A slot is overwritten by the
 * next key that hashes to it. Its drafts are guesses like any other (the verify pass keeps only what the sampler
 * draws), so what one context left there never changes another's tokens, only how many passes they take.
 * Contexts add to it as they generate (one slot per token) while they speculate; el_model_forget_drafts empties it. */
#include <stdlib.h>
#include <string.h>

#include "el_internal.h"

enum { POOL_N = 3, POOL_NEXT = 8, POOL_BITS = 14, POOL_SLOTS = 1 << POOL_BITS };

typedef struct {
  int32_t key[POOL_N]; /* -1: empty */
  int32_t next[POOL_NEXT];
} pool_slot;

struct el_ngram_pool {
  pthread_mutex_t mu;
  pool_slot slot[POOL_SLOTS];
};

static uint32_t slot_of(const int32_t* key) {
  uint32_t h = (uint32_t)key[0] * 0x9E3779B1u ^ (uint32_t)key[1] * 0x85EBCA77u ^ (uint32_t)key[2] * 0xC2B2AE3Du;
  return (h ^ h >> 15) * 0x2C1B3C6Du >> (32 - POOL_BITS);
}

/* The model's pool, made on first use (NULL when out of memory: the pool is optional). */
static el_ngram_pool* pool_of(el_model* m) {
  el_ngram_pool* p = __atomic_load_n(&m->pool, __ATOMIC_ACQUIRE);
  if (p) return p;
  pthread_mutex_lock(&m->mu);
  if (!m->pool && (p = malloc(sizeof *p))) {
    pthread_mutex_init(&p->mu, NULL);
    memset(p->slot, 0xff, sizeof p->slot);
    __atomic_store_n(&m->pool, p, __ATOMIC_RELEASE); /* read without the model's lock (el_pool_draft) */
  }
  p = m->pool;
  pthread_mutex_unlock(&m->mu);
  return p;
}

/* The keys of history h[0..n) whose followers are all known, each with them: every one (all: a prompt), or the one
 * the last id completed (a generation adds its prompt's at its start and one per token after that: each once). */
void el_pool_add(el_model* m, const int32_t* h, int n, int all) {
  int from = all ? POOL_N : n - POOL_NEXT;
  if (from < POOL_N || from > n - POOL_NEXT) return;
  el_ngram_pool* p = pool_of(m);
  if (!p) return;
  pthread_mutex_lock(&p->mu);
  for (int i = from; i <= n - POOL_NEXT; i++) {
    pool_slot* s = &p->slot[slot_of(h + i - POOL_N)];
    memcpy(s->key, h + i - POOL_N, sizeof s->key);
    memcpy(s->next, h + i, sizeof s->next);
  }
  pthread_mutex_unlock(&p->mu);
}

/* Up to max ids that followed the history's last POOL_N ids where the pool saw them (0: not there). */
int el_pool_draft(el_model* m, const int32_t* h, int n, int max, int32_t* out) {
  el_ngram_pool* p = __atomic_load_n(&m->pool, __ATOMIC_ACQUIRE);
  if (n < POOL_N || max <= 0 || !p) return 0;
  const int32_t* key = h + n - POOL_N;
  int k = 0;
  pthread_mutex_lock(&p->mu);
  const pool_slot* s = &p->slot[slot_of(key)];
  if (memcmp(s->key, key, sizeof s->key) == 0) {
    k = max < POOL_NEXT ? max : POOL_NEXT;
    memcpy(out, s->next, sizeof(int32_t) * (size_t)k);
  }
  pthread_mutex_unlock(&p->mu);
  return k;
}

void el_pool_free(el_model* m) {
  if (!m->pool) return;
  pthread_mutex_destroy(&m->pool->mu);
  free(m->pool);
  m->pool = NULL;
}

EL_API void el_model_forget_drafts(el_model* m) {
  el_ngram_pool* p = m ? __atomic_load_n(&m->pool, __ATOMIC_ACQUIRE) : NULL;
  if (!p) return;
  pthread_mutex_lock(&p->mu);
  memset(p->slot, 0xff, sizeof p->slot);
  pthread_mutex_unlock(&p->mu);
}
