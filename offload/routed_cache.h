/* A cache of routed weights (experts, neuron bundles): weights a routed step selects at run time, read from storage
 * when selected (or when a prediction names them) and kept while often used, in fixed-size slots within a byte
 * budget. The expert store ("experts") serves every expert from here; the window store serves the routed weights it
 * did not predict.
 *
 *   predict(w)   a guess: w may be selected soon. Read it into a free slot, a wrong guess's (its route ran without
 *                selecting it), or, while guesses hold fewer than an eighth of the slots, the policy's victim if it
 *                was selected no more often than w (since open under lfu, lately under freq and lru; never a slot
 *                selected-but-unused or a guess whose route has not run); reads of selected weights always go first;
 *   prefetch(w)  the executor selected w: queue its read if it is not cached (never blocks; skipped when every slot
 *                holds something selected but not yet used);
 *   acquire(w)   its bytes, waiting for the read (or reading it now); release(w) after the kernel ran.
 * A slot is reused by the eviction policy's order (below), never while acquired or selected-but-unused. Two reader
 * threads read whole weights, selected ones first. */
#ifndef EDGELLM_ROUTED_CACHE_H
#define EDGELLM_ROUTED_CACHE_H
#include <stddef.h>
#include <stdint.h>

#include "../runtime/contract.h"
#include "io.h"

typedef struct el_routed_cache el_routed_cache;

/* Which cached weight makes room:
 *   LRU   the least recently used;
 *   LFU   the least often selected since open (between equals, the least recently used);
 *   FREQ  the least often selected lately (counts halve every 16 x n_routed selections: 16 tokens when a token selects
 *         every routed weight, 64 for 8 experts top-2), between equals the least recently used;
 *   CYCLIC FREQ, but between equals the MOST recently used (the neuron window's): when a token selects more than fits
 *         in the same order each time (a neuron window at threshold 0), LRU evicts each weight just before it is
 *         needed again, where keeping a fixed set and cycling one slot hits on everything kept. */
typedef enum { EL_RC_FREQ = 0, EL_RC_LRU = 1, EL_RC_LFU = 2, EL_RC_CYCLIC = 3 } el_rc_policy;
/* The policy of that name ("freq", "lru", "lfu"; NULL or "": freq); -1 if unknown. */
EL_HIDDEN int el_rc_policy_find(const char* name);

typedef struct {
  uint64_t hits, misses;  /* selections found cached (or being read) / read when selected */
  uint64_t dropped;       /* selections whose slot had to be taken back before use */
  double stall_s;         /* time acquire waited for reads */
  uint64_t selected;      /* selections */
  uint64_t cached;        /* of those, found held by an earlier selection */
  uint64_t prefetched;    /* ... found held or being read because a guess named them */
  uint64_t stalls;        /* ... whose first acquire had to wait */
  uint64_t predict_reads; /* reads guesses issued */
  uint64_t predict_wasted; /* of those, evicted before any selection used them */
} el_rc_counters_t;

/* Slot size for these weights (the largest, as read: whole EL_IO_ALIGN blocks). routed[w] != 0 marks them. */
EL_HIDDEN uint64_t el_rc_slot_bytes(const el_plan_weight* table, uint32_t n, const uint8_t* routed);
/* n_slots >= 2 slots of el_rc_slot_bytes; reads through io (kept open by the caller). */
EL_HIDDEN el_routed_cache* el_rc_open(const el_plan_weight* table, uint32_t n, const uint8_t* routed, uint32_t n_slots,
                                      el_rc_policy policy, el_io* io, char* err, size_t errlen);
EL_HIDDEN int el_rc_prefetch(el_routed_cache* c, uint32_t w); /* 1: it was cached */
/* Reads ws[0, n) into free slots (a warm start; they are evicted like any other later); waits for the reads.
 * 0, or -1 with err set. */
EL_HIDDEN int el_rc_fill(el_routed_cache* c, const uint32_t* ws, uint32_t n, char* err, size_t errlen);
/* A round of guesses (one PREDICT step) for one route: w[0, n); group names the route (its first expert weight). */
EL_HIDDEN void el_rc_predict(el_routed_cache* c, const uint32_t* w, uint32_t n, uint32_t group);
/* NULL with err set on a read failure. */
EL_HIDDEN const void* el_rc_acquire(el_routed_cache* c, uint32_t w, char* err, size_t errlen);
EL_HIDDEN int el_rc_release(el_routed_cache* c, uint32_t w); /* 1: it held w acquired */
EL_HIDDEN uint64_t el_rc_bytes(const el_routed_cache* c); /* memory of the slots */
EL_HIDDEN uint32_t el_rc_slots(const el_routed_cache* c);
EL_HIDDEN void el_rc_counters(el_routed_cache* c, el_rc_counters_t* out);
EL_HIDDEN void el_rc_close(el_routed_cache* c);

#endif
