/* Storage reads shaped by a storage profile (offload/io.h). */
#define _GNU_SOURCE
#include "io.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <time.h>
#include <unistd.h>

/* Sequential read speed and per-request latency of phone-class storage (public spec sheets and reviews; README
 * "Storage profiles" says where each figure comes from). */
static const el_storage_profile PROFILES[] = {
    {"native", 0, 0, 0, "this machine's disk, unthrottled"},
    {"sd", 90e6, 500e-6, 0, "SD card (A2 class): 90 MB/s, 0.5 ms per request"},
    {"emmc", 300e6, 200e-6, 0, "eMMC 5.1: 300 MB/s, 0.2 ms per request"},
    {"ufs3", 2.1e9, 100e-6, 1, "UFS 3.1: 2.1 GB/s, 0.1 ms per request (modelled: served from RAM)"},
    {"ufs4", 4.2e9, 80e-6, 1, "UFS 4.0: 4.2 GB/s, 0.08 ms per request (modelled: served from RAM)"},
};
#define N_PROFILES (sizeof PROFILES / sizeof PROFILES[0])

const el_storage_profile* el_storage_profile_find(const char* name) {
  if (!name || !*name) return &PROFILES[0];
  for (size_t i = 0; i < N_PROFILES; i++)
    if (!strcmp(name, PROFILES[i].name)) return &PROFILES[i];
  return NULL;
}

const char* el_storage_profile_names(void) { return "native, sd, emmc, ufs3, ufs4"; }

struct el_io {
  int fd;
  int direct;
  const el_storage_profile* p;
  pthread_mutex_t mu;
  double channel_free; /* when the modelled channel finishes its last request */
  uint64_t bytes, requests;
};

double el_io_now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static void sleep_until(double t) {
  /* Linux's default timer slack (50 us) would add up to that to every modelled request's latency */
  static __thread int precise;
  if (!precise) precise = 1, prctl(PR_SET_TIMERSLACK, 1UL);
  struct timespec ts;
  ts.tv_sec = (time_t)t;
  ts.tv_nsec = (long)((t - (double)ts.tv_sec) * 1e9);
  if (ts.tv_nsec >= 1000000000L) ts.tv_sec++, ts.tv_nsec -= 1000000000L;
  while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR) {
  }
}

el_io* el_io_open(const char* path, uint64_t file_bytes, const el_storage_profile* p, int direct_io, char* err,
                  size_t errlen) {
  /* O_NONBLOCK: a FIFO put in place of weights.bin must not hang open(); it is refused below */
  int flags = O_RDONLY | O_CLOEXEC | O_NONBLOCK;
  int fd = p->modelled || !direct_io ? -1 : open(path, flags | O_DIRECT);
  int direct = fd >= 0;
  if (fd < 0) fd = open(path, flags);
  if (fd < 0) {
    snprintf(err, errlen, "cannot open %s: %s; recompile the package or copy it again", path, strerror(errno));
    return NULL;
  }
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || (uint64_t)st.st_size != file_bytes) {
    snprintf(err, errlen, "%s is not a regular file of %llu bytes; recompile the package or copy it again", path,
             (unsigned long long)file_bytes);
    close(fd);
    return NULL;
  }
  el_io* io = calloc(1, sizeof *io);
  if (!io) {
    snprintf(err, errlen, "out of memory");
    close(fd);
    return NULL;
  }
  io->fd = fd, io->direct = direct, io->p = p;
  pthread_mutex_init(&io->mu, NULL);
  /* buffered: the window reads one contiguous range front to back, so let the kernel read ahead of it */
  if (!direct && !p->modelled) posix_fadvise(fd, 0, 0, POSIX_FADV_NORMAL);
  return io;
}

int el_io_direct(const el_io* io) { return io->direct; }

/* Reads up to len bytes (a block-rounded length); at least `need` must come back. */
static int pread_all(el_io* io, uint8_t* dst, uint64_t off, uint64_t len, uint64_t need, char* err, size_t errlen) {
  uint64_t done = 0;
  while (done < len) {
    ssize_t got = pread(io->fd, dst + done, (size_t)(len - done), (off_t)(off + done));
    if (got < 0 && errno == EINTR) continue;
    if (got < 0 && errno == EINVAL && io->direct) {
      /* a file system that takes O_DIRECT at open but not these reads: go buffered for good */
      int fl = fcntl(io->fd, F_GETFL);
      if (fl >= 0 && fcntl(io->fd, F_SETFL, fl & ~O_DIRECT) == 0) {
        io->direct = 0;
        continue;
      }
    }
    if (got < 0) {
      snprintf(err, errlen, "cannot read weights.bin at byte %llu: %s", (unsigned long long)(off + done),
               strerror(errno));
      return -1;
    }
    if (got == 0) break; /* end of file: the caller's length was rounded up past it */
    done += (uint64_t)got;
  }
  if (done < need) {
    snprintf(err, errlen, "weights.bin ends at byte %llu, the plan needs %llu: it changed while in use; copy the "
             "package again", (unsigned long long)(off + done), (unsigned long long)(off + need));
    return -1;
  }
  return 0;
}

int el_io_read(el_io* io, void* dst, uint64_t off, uint64_t len, char* err, size_t errlen) {
  uint64_t n = (len + EL_IO_ALIGN - 1) / EL_IO_ALIGN * EL_IO_ALIGN;
  double due = 0;
  pthread_mutex_lock(&io->mu);
  if (io->p->bytes_per_s > 0) {
    double now = el_io_now(), start = io->channel_free > now ? io->channel_free : now;
    io->channel_free = start + (double)n / io->p->bytes_per_s;
    due = io->channel_free + io->p->latency_s;
  }
  io->bytes += n, io->requests++;
  pthread_mutex_unlock(&io->mu);
  if (pread_all(io, dst, off, n, len, err, errlen) != 0) return -1;
  if (due > el_io_now()) sleep_until(due);
  return 0;
}

/* The kernel's read-ahead for the file's device (bytes), 8 MiB where it cannot be found (overlay or FUSE file
 * systems): the page cache a buffered reader may find filled ahead of it. */
static uint64_t readahead_bytes(const char* path) {
  struct stat st;
  if (stat(path, &st) != 0) return 8u << 20;
  char p[128];
  unsigned maj = major(st.st_dev), min = minor(st.st_dev);
  const char* forms[] = {"/sys/class/bdi/%u:%u/read_ahead_kb", "/sys/dev/block/%u:%u/queue/read_ahead_kb",
                         "/sys/dev/block/%u:%u/../queue/read_ahead_kb"};
  for (int i = 0; i < 3; i++) {
    snprintf(p, sizeof p, forms[i], maj, min);
    FILE* f = fopen(p, "r");
    unsigned long kb;
    if (!f) continue;
    int ok = fscanf(f, "%lu", &kb) == 1;
    fclose(f);
    if (ok) return (uint64_t)kb << 10;
  }
  return 8u << 20;
}

uint64_t el_io_cache_reserve(const char* path, const el_storage_profile* p, int direct_io) {
  if (p->modelled || direct_io) return 0;
  return 2 * readahead_bytes(path) + 2 * (uint64_t)EL_IO_DROP_ALIGN;
}

uint8_t* el_io_map_lookups(const char* path, uint64_t file_bytes, const el_plan_weight* table, uint32_t n,
                           const uint8_t* mapped, char* err, size_t errlen) {
  int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  void* p = fd >= 0 ? mmap(NULL, file_bytes, PROT_READ, MAP_PRIVATE, fd, 0) : MAP_FAILED;
  if (fd >= 0) close(fd);
  if (p == MAP_FAILED) {
    snprintf(err, errlen, "cannot map %s: %s", path, strerror(errno));
    return NULL;
  }
  long page = sysconf(_SC_PAGESIZE);
  for (uint32_t w = 0; w < n; w++)
    if (mapped[w]) {
      uint64_t a = table[w].offset / (uint64_t)page * (uint64_t)page;
      madvise((uint8_t*)p + a, table[w].offset + table[w].nbytes - a, MADV_RANDOM);
    }
  return p;
}

void el_io_random(el_io* io) {
  if (!io->direct && !io->p->modelled) posix_fadvise(io->fd, 0, 0, POSIX_FADV_RANDOM);
}

void el_io_drop(el_io* io, uint64_t off, uint64_t len) {
  if (!io->direct && !io->p->modelled && len) posix_fadvise(io->fd, (off_t)off, (off_t)len, POSIX_FADV_DONTNEED);
}

void el_io_counters(const el_io* io, uint64_t* bytes, uint64_t* requests) {
  pthread_mutex_lock((pthread_mutex_t*)&io->mu);
  *bytes = io->bytes, *requests = io->requests;
  pthread_mutex_unlock((pthread_mutex_t*)&io->mu);
}

void el_io_close(el_io* io) {
  if (!io) return;
  close(io->fd);
  pthread_mutex_destroy(&io->mu);
  free(io);
}
