/* Storage reads for the windowed weight stores: one file, positional reads into aligned buffers, shaped by a
 * storage profile (what a phone's flash would deliver) and counted.
 *
 * Real profiles ("native", and the ones slower than any disk we run on: "sd", "emmc") read what the disk delivers:
 * buffered reads with the kernel's read-ahead, each range dropped from the page cache once read (so only the
 * read-ahead window is ever cached, and nothing is read twice from the cache), or, with direct_io, O_DIRECT reads
 * that bypass the page cache entirely (where O_DIRECT is refused, as on tmpfs, buffered). On this project's virtio
 * disks buffered reads with read-ahead run at about twice the O_DIRECT speed (README "Models bigger than RAM").
 * Modelled profiles ("ufs3", "ufs4": faster than the disks here) read buffered, from whatever the page cache holds,
 * through the same limiter: their timings say what the store would do on that flash, not what this disk does.
 *
 * The limiter is a single channel of the profile's bandwidth plus a fixed latency per request: a request of n bytes
 * starts when the channel is free, holds it n / bandwidth, and completes latency later; requests from several reader
 * threads overlap their latencies as a flash device with a queue would. */
#ifndef EDGELLM_IO_H
#define EDGELLM_IO_H
#include <stddef.h>
#include <stdint.h>

#include "../runtime/contract.h"

#ifndef EL_HIDDEN
#define EL_HIDDEN __attribute__((visibility("hidden")))
#endif

typedef struct {
  const char* name;
  double bytes_per_s; /* 0: unlimited */
  double latency_s;   /* added to every request */
  int modelled;       /* served from RAM through the limiter: the timings model this storage */
  const char* what;   /* one line for plans and errors */
} el_storage_profile;

/* The profile of that name (NULL or "": "native"), or NULL. */
EL_HIDDEN const el_storage_profile* el_storage_profile_find(const char* name);
/* "native, sd, emmc, ufs3, ufs4" */
EL_HIDDEN const char* el_storage_profile_names(void);

/* Bytes every read is aligned to (offset, length and buffer): O_DIRECT's block rule on every disk we know. */
#define EL_IO_ALIGN 4096u

typedef struct el_io el_io;
/* Opens path (a regular file of exactly file_bytes bytes) for reads under profile p. */
EL_HIDDEN el_io* el_io_open(const char* path, uint64_t file_bytes, const el_storage_profile* p, int direct_io,
                            char* err, size_t errlen);
/* Reads [off, off + len) of the file into dst, len rounded up to EL_IO_ALIGN (bytes past the end of the file are left
 * as they were): off and dst EL_IO_ALIGN aligned. One request, shaped by the profile. Thread-safe. 0, or -1 with
 * err set. */
EL_HIDDEN int el_io_read(el_io* io, void* dst, uint64_t off, uint64_t len, char* err, size_t errlen);
/* Buffered real profiles: drops [off, off + len) from the page cache (a no-op otherwise). The page cache holds
 * large folios (up to 2 MiB here), and a folio is dropped only when the range covers it whole, so dropping each
 * read's own range right after it leaves nearly everything cached: callers drop what lies behind their reads,
 * in ranges aligned to EL_IO_DROP_ALIGN. */
EL_HIDDEN void el_io_drop(el_io* io, uint64_t off, uint64_t len);
#define EL_IO_DROP_ALIGN (2u << 20) /* the largest page-cache folio on the kernels we know (x86 and arm64 PMD) */
/* Page cache a buffered reader of path may hold at once (charged to its memory cgroup like any other memory): the
 * device's read-ahead, twice (the window being read and the next one, read asynchronously), and what lies behind
 * the reads before it is dropped. 0 for O_DIRECT and modelled profiles. */
EL_HIDDEN uint64_t el_io_cache_reserve(const char* path, const el_storage_profile* p, int direct_io);
/* The file mapped read-only for weights read by row lookup (embedding tables): mapped[w] != 0 marks them, each range
 * advised random (a fault reads its page, not the device's read-ahead worth). NULL with err set. */
EL_HIDDEN uint8_t* el_io_map_lookups(const char* path, uint64_t file_bytes, const el_plan_weight* table, uint32_t n,
                                     const uint8_t* mapped, char* err, size_t errlen);
/* Buffered real profiles: no read-ahead on this file (reads are whole regions, in no particular order). */
EL_HIDDEN void el_io_random(el_io* io);
EL_HIDDEN void el_io_close(el_io* io);
EL_HIDDEN int el_io_direct(const el_io* io); /* 1: reads bypass the page cache */
/* Counters since open: bytes and requests issued (bytes rounded as read). */
EL_HIDDEN void el_io_counters(const el_io* io, uint64_t* bytes, uint64_t* requests);
EL_HIDDEN double el_io_now(void); /* monotonic seconds */

#endif
