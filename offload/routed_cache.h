/* A cache of routed weights (neuron bundles, experts): weights a routed step selects at run time, read from storage
 * when selected and kept while often used, in fixed-size slots within a byte budget. The window store reads the
 * routed weights it predicts with its stream and serves the others (selected, not predicted) from here.
 *
 *   prefetch(w)  the executor selected w: queue its read if it is not cached (never blocks; skipped when every slot
 *                holds something selected but not yet used);
 *   acquire(w)   its bytes, waiting for the read (or reading it now); release(w) after the kernel ran.
 * A slot is reused least recently used first, never while acquired or selected-but-unused, so what the last tokens
 * used stays cached as far as the slots allow. Two reader threads read whole weights, in selection order. */
#ifndef EDGELLM_ROUTED_CACHE_H
#define EDGELLM_ROUTED_CACHE_H
#include <stddef.h>
#include <stdint.h>

#include "../runtime/contract.h"
#include "io.h"

typedef struct el_routed_cache el_routed_cache;

/* Slot size for these weights (the largest, as read: whole EL_IO_ALIGN blocks). routed[w] != 0 marks them. */
EL_HIDDEN uint64_t el_rc_slot_bytes(const el_plan_weight* table, uint32_t n, const uint8_t* routed);
/* n_slots >= 2 slots of el_rc_slot_bytes; reads through io (kept open by the caller). */
EL_HIDDEN el_routed_cache* el_rc_open(const el_plan_weight* table, uint32_t n, const uint8_t* routed, uint32_t n_slots,
                                      el_io* io, char* err, size_t errlen);
EL_HIDDEN int el_rc_prefetch(el_routed_cache* c, uint32_t w); /* 1: it was cached */
/* NULL with err set on a read failure. */
EL_HIDDEN const void* el_rc_acquire(el_routed_cache* c, uint32_t w, char* err, size_t errlen);
EL_HIDDEN int el_rc_release(el_routed_cache* c, uint32_t w); /* 1: it held w acquired */
EL_HIDDEN uint64_t el_rc_bytes(const el_routed_cache* c); /* memory of the slots */
EL_HIDDEN void el_rc_counters(el_routed_cache* c, uint64_t* hits, uint64_t* misses, uint64_t* dropped, double* stall_s);
EL_HIDDEN void el_rc_close(el_routed_cache* c);

#endif
