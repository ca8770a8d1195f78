/* Weight store policy "resident": every weight in memory for the life of the model (offload/store.h). */
#define _GNU_SOURCE
#include "store.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

typedef struct {
  el_weight_store base; /* first: the executor holds an el_weight_store* */
  const el_plan_weight* table;
  uint32_t n;
  uint8_t* data;   /* file contents */
  uint64_t bytes;  /* file size */
  int huge;         /* data is a copy in anonymous huge pages */
  uint64_t map_len; /* bytes mapped at data */
} resident_store;

/* Read-only after open: safe from any number of threads. */
static int resident_acquire(el_weight_store* s, const uint32_t* ids, uint32_t n, const void** ptrs) {
  resident_store* r = (resident_store*)s;
  for (uint32_t i = 0; i < n; i++) {
    if (ids[i] >= r->n || !r->data) {
      if (!r->data) return snprintf(s->err, sizeof s->err, "the store was opened for planning only"), -1;
      snprintf(s->err, sizeof s->err, "weight %u does not exist (the plan has %u)", ids[i], r->n);
      return -1;
    }
    ptrs[i] = r->data + r->table[ids[i]].offset;
  }
  return 0;
}

static void resident_release(el_weight_store* s, const uint32_t* ids, uint32_t n) { (void)s, (void)ids, (void)n; }

static uint64_t resident_bytes(const el_weight_store* s) { return ((const resident_store*)s)->bytes; }

static void resident_close(el_weight_store* s) {
  resident_store* r = (resident_store*)s;
  if (!r) return;
  if (r->data) munmap(r->data, r->map_len);
  free(r);
}

/* Whole-file read into anonymous memory, made read-only (a kernel can never write the weights, whichever way they
 * are held), for when mmap is unavailable (some FUSE/Android storage) or turned off. */
static uint8_t* read_all(int fd, uint64_t bytes, uint64_t* map_len, char* err, size_t errlen, const char* path) {
  size_t len = (size_t)bytes ? (size_t)bytes : 1;
  uint8_t* buf = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (buf == MAP_FAILED) {
    snprintf(err, errlen, "out of memory reading %s (%llu bytes): free memory or use a smaller model", path,
             (unsigned long long)bytes);
    return NULL;
  }
  uint64_t done = 0;
  while (done < bytes) {
    size_t want = bytes - done > (1u << 30) ? (1u << 30) : (size_t)(bytes - done);
    ssize_t got = pread(fd, buf + done, want, (off_t)done);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) {
      snprintf(err, errlen, "cannot read %s at byte %llu: %s; copy the package again", path,
               (unsigned long long)done, got < 0 ? strerror(errno) : "unexpected end of file");
      munmap(buf, len);
      return NULL;
    }
    done += (uint64_t)got;
  }
  mprotect(buf, len, PROT_READ);
  *map_len = len;
  return buf;
}

/* Copy into transparent huge pages --------------------------------------------------------------------------
 * Decode streams every weight byte once per token. With 4 KiB pages that is a TLB miss per page, and the page-table
 * lines themselves are evicted by the stream, so each walk is another DRAM access: a 600 MB q4g32 GEMV set streamed
 * 7% faster from huge pages (Zen 5, 2 threads), and 1B decode gained 3-16% (q4g32, q8). A file mapping gets huge
 * pages only where the page cache happens to hold 2 MiB folios, so the weights are copied into anonymous memory
 * advised MADV_HUGEPAGE, prefaulted in one call (MADV_POPULATE_WRITE: faulting huge pages one by one inside read()
 * took 4.6 s for 2.2 GB, populate + 2 reader threads 0.2-0.5 s) and made read-only. Used when the kernel offers
 * THP (enabled "always" or "madvise"), the weights are at least HUGE_MIN_PAGES huge pages and MemAvailable holds
 * twice them; any failure falls back to the mmap. huge_pages 0 turns it off, 1 uses it whatever the size (tests). */
#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif
#define HUGE_MIN_PAGES 16

static size_t thp_size(void) {
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  char buf[64] = {0};
  FILE* f = fopen("/sys/kernel/mm/transparent_hugepage/enabled", "r");
  if (!f) return 0;
  int ok = fgets(buf, sizeof buf, f) && (strstr(buf, "[always]") || strstr(buf, "[madvise]"));
  fclose(f);
  unsigned long sz = 0;
  if (!ok || !(f = fopen("/sys/kernel/mm/transparent_hugepage/hpage_pmd_size", "r"))) return 0;
  if (fscanf(f, "%lu", &sz) != 1) sz = 0;
  fclose(f);
  return sz >= 4096 && !(sz & (sz - 1)) ? (size_t)sz : 0;
#else
  return 0;
#endif
}

static int read_u64(const char* path, const char* key, uint64_t* out) {
  FILE* f = fopen(path, "r");
  if (!f) return -1;
  char line[256];
  int ok = 0;
  size_t kl = key ? strlen(key) : 0;
  while (!ok && fgets(line, sizeof line, f)) {
    if (key && strncmp(line, key, kl)) continue;
    unsigned long long v;
    ok = sscanf(line + kl, " %llu", &v) == 1;
    if (ok) *out = v;
  }
  fclose(f);
  return ok ? 0 : -1;
}

/* Room left under this process's memory cgroup limit (v1 hierarchical limit, or v2 memory.max up the tree);
 * UINT64_MAX when there is none. Android and container runtimes kill at that limit, not at MemAvailable. */
static uint64_t cgroup_room(void) {
  FILE* f = fopen("/proc/self/cgroup", "r");
  if (!f) return UINT64_MAX;
  char line[1024], v1[1024] = "", v2[1024] = "";
  while (fgets(line, sizeof line, f)) {
    line[strcspn(line, "\n")] = 0;
    char* p = strchr(line, ':');
    char* q = p ? strchr(p + 1, ':') : NULL;
    if (!q) continue;
    if (!strncmp(p, ":memory:", 8)) snprintf(v1, sizeof v1, "%s", q + 1);
    if (!strncmp(line, "0::", 3)) snprintf(v2, sizeof v2, "%s", q + 1);
  }
  fclose(f);
  char path[1200];
  uint64_t limit = UINT64_MAX, usage = 0, v;
  if (v1[0]) {
    snprintf(path, sizeof path, "/sys/fs/cgroup/memory%s/memory.stat", v1);
    if (read_u64(path, "hierarchical_memory_limit", &v) == 0) limit = v;
    snprintf(path, sizeof path, "/sys/fs/cgroup/memory%s/memory.usage_in_bytes", v1);
    if (read_u64(path, NULL, &v) == 0) usage = v;
  } else if (v2[0]) {
    for (char* end = v2 + strlen(v2); end >= v2; end--) { /* the tightest memory.max from here to the root */
      if (*end != '/' && *end) continue;
      char saved = *end;
      *end = 0;
      snprintf(path, sizeof path, "/sys/fs/cgroup%s/memory.max", v2);
      if (read_u64(path, NULL, &v) == 0 && v < limit) limit = v;
      if (limit != UINT64_MAX && !usage) {
        snprintf(path, sizeof path, "/sys/fs/cgroup%s/memory.current", v2);
        if (read_u64(path, NULL, &v) == 0) usage = v;
      }
      *end = saved;
    }
  }
  return limit == UINT64_MAX ? UINT64_MAX : (limit > usage ? limit - usage : 0);
}

/* MemAvailable of /proc/meminfo in bytes, or less where a memory cgroup allows less (0 if unknown). */
static uint64_t mem_available(void) {
  uint64_t kb = 0, room = cgroup_room();
  if (read_u64("/proc/meminfo", "MemAvailable:", &kb) != 0) return 0;
  return kb * 1024 < room ? kb * 1024 : room;
}

typedef struct {
  int fd;
  uint8_t* dst;
  uint64_t off, len;
  int ok;
} read_job;

static void* read_range(void* arg) {
  read_job* j = arg;
  uint64_t done = 0;
  while (done < j->len) {
    size_t want = j->len - done > (1u << 26) ? (1u << 26) : (size_t)(j->len - done);
    ssize_t got = pread(j->fd, j->dst + j->off + done, want, (off_t)(j->off + done));
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) return NULL;
    done += (uint64_t)got;
  }
  j->ok = 1;
  return NULL;
}

/* The file in read-only anonymous huge pages, or NULL (nothing left allocated) when that is not possible. */
static uint8_t* load_huge(int fd, uint64_t bytes, int mode, uint64_t* map_len) {
  if (mode == 0) return NULL;
  size_t h = thp_size();
  if (!h || bytes == 0 || (bytes < (uint64_t)HUGE_MIN_PAGES * h && mode != 1)) return NULL;
  /* The copy is pinned anonymous memory: take it only with room for it and the file's page cache beside it; a
   * mapping of the file degrades gracefully under memory pressure (its pages can be dropped and read again). */
  if (mem_available() / 2 < bytes) return NULL;
  uint64_t len = (bytes + h - 1) / h * h;
  uint8_t* raw = mmap(NULL, len + h, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED) return NULL;
  uint8_t* p = (uint8_t*)(((uintptr_t)raw + h - 1) & ~(uintptr_t)(h - 1)); /* huge-page aligned start */
  if (p > raw) munmap(raw, (size_t)(p - raw));
  if (p + len < raw + len + h) munmap(p + len, (size_t)(raw + len + h - (p + len)));
  if (madvise(p, len, MADV_HUGEPAGE) != 0 || madvise(p, len, MADV_POPULATE_WRITE) != 0) {
    munmap(p, len); /* no THP for us, or a kernel before 5.14: the mmap costs nothing to fault in instead */
    return NULL;
  }
  read_job jobs[2] = {{fd, p, 0, bytes / 2 / h * h, 0}, {fd, p, 0, 0, 0}};
  jobs[1].off = jobs[0].len;
  jobs[1].len = bytes - jobs[0].len;
  pthread_t helper;
  int threaded = jobs[0].len > 0 && pthread_create(&helper, NULL, read_range, &jobs[0]) == 0;
  if (!threaded) jobs[1] = (read_job){fd, p, 0, bytes, 0};
  read_range(&jobs[1]);
  if (threaded) pthread_join(helper, NULL);
  if (!jobs[1].ok || (threaded && !jobs[0].ok) || mprotect(p, len, PROT_READ) != 0) {
    munmap(p, len);
    return NULL;
  }
  *map_len = len;
  return p;
}

el_weight_store* el_store_open_resident(const el_store_config* cfg, char* err, size_t errlen) {
  if (cfg->budget && cfg->budget < cfg->file_bytes) {
    snprintf(err, errlen, "the memory budget (%llu bytes) is smaller than the weights (%llu bytes) and the "
             "\"resident\" policy holds them all: raise the budget or drop it", (unsigned long long)cfg->budget,
             (unsigned long long)cfg->file_bytes);
    return NULL;
  }
  /* O_NONBLOCK: a FIFO put in place of weights.bin must not hang open(); it is refused below */
  int fd = open(cfg->path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    snprintf(err, errlen, "cannot open %s: %s; recompile the package or copy it again", cfg->path, strerror(errno));
    return NULL;
  }
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    snprintf(err, errlen, "%s is not a regular file; recompile the package or copy it again", cfg->path);
    close(fd);
    return NULL;
  }
  if ((uint64_t)st.st_size != cfg->file_bytes) {
    snprintf(err, errlen, "%s has %llu bytes, the plan needs %llu; recompile the package or copy it again",
             cfg->path, (unsigned long long)st.st_size, (unsigned long long)cfg->file_bytes);
    close(fd);
    return NULL;
  }
  resident_store* r = calloc(1, sizeof *r);
  if (!r) {
    snprintf(err, errlen, "out of memory");
    close(fd);
    return NULL;
  }
  r->table = cfg->table;
  r->n = cfg->n;
  r->bytes = cfg->file_bytes;
  r->base.acquire = resident_acquire;
  r->base.release = resident_release;
  r->base.prefetch = NULL; /* everything is resident: hints are useless */
  r->base.close = resident_close;
  r->base.bytes_resident = resident_bytes;
  r->base.policy = "resident";
  r->base.layout = (el_store_layout){.budget = cfg->budget, .pinned_bytes = r->bytes, .minimum_budget = r->bytes,
                                     .pinned_weights = cfg->n, .storage = "native",
                                     .storage_what = "this machine's disk (read once at load)"};
  if (cfg->plan_only) { /* nothing to map: the model only reports its memory */
    close(fd);
    return &r->base;
  }
  if ((r->data = load_huge(fd, r->bytes, cfg->huge_pages, &r->map_len))) {
    r->huge = 1;
    r->base.bytes_huge = r->bytes;
  }
  if (r->bytes > 0 && !r->data && cfg->use_mmap) {
    /* MAP_PRIVATE + PROT_READ: pages come from the page cache and are never written back or copied. Truncating
     * the file under a running model makes the next access fault (SIGBUS), as for any mapped file: packages are
     * not to be modified while in use (README, "Trust and safety"). */
    void* p = mmap(NULL, r->bytes, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p != MAP_FAILED) {
      madvise(p, r->bytes, MADV_WILLNEED); /* start read-ahead of the whole file now, not on first touch */
      r->data = p;
      r->map_len = r->bytes;
    }
  }
  if (!r->data && !(r->data = read_all(fd, r->bytes, &r->map_len, err, errlen, cfg->path))) {
    close(fd);
    free(r);
    return NULL;
  }
  close(fd); /* an mmap keeps its own reference to the file */
  return &r->base;
}
