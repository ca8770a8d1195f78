/* Weight store policies. "resident": every weight in memory for the life of the model. */
#define _GNU_SOURCE
#include "weight_store.h"

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
  int mapped;      /* 1: data is an mmap of the file; 2: a copy in anonymous huge pages (mmap); 0: malloc'd copy */
  uint64_t map_len; /* bytes mapped at data (mapped != 0): the file size, or whole huge pages of the copy */
} resident_store;

static const void* resident_acquire(el_weight_store* s, uint32_t id) {
  resident_store* r = (resident_store*)s;
  if (id >= r->n) {
    snprintf(s->err, sizeof s->err, "weight %u does not exist (the plan has %u)", id, r->n);
    return NULL;
  }
  return r->data + r->table[id].offset;
}

static void resident_release(el_weight_store* s, uint32_t id) { (void)s, (void)id; }

static uint64_t resident_bytes(const el_weight_store* s) { return ((const resident_store*)s)->bytes; }

static void resident_close(el_weight_store* s) {
  resident_store* r = (resident_store*)s;
  if (!r) return;
  if (r->mapped)
    munmap(r->data, r->map_len);
  else
    free(r->data);
  free(r);
}

/* Whole-file read for when mmap is unavailable (some FUSE/Android storage) or disabled. */
static uint8_t* read_all(int fd, uint64_t bytes, char* err, size_t errlen, const char* path) {
  uint8_t* buf = aligned_alloc(64, (bytes + 63) / 64 * 64 + 64); /* + 64: never a zero-size request */
  if (!buf) {
    snprintf(err, errlen, "out of memory reading %s (%llu bytes): free memory or use a smaller model", path,
             (unsigned long long)bytes);
    return NULL;
  }
  uint64_t done = 0;
  while (done < bytes) {
    size_t want = bytes - done > (1u << 30) ? (1u << 30) : (size_t)(bytes - done);
    ssize_t got = read(fd, buf + done, want);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) {
      snprintf(err, errlen, "cannot read %s at byte %llu: %s; copy the package again", path,
               (unsigned long long)done, got < 0 ? strerror(errno) : "unexpected end of file");
      free(buf);
      return NULL;
    }
    done += (uint64_t)got;
  }
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
 * twice them; any failure falls back to the mmap. EDGELLM_HUGEPAGES=0 turns it off, =1 uses it whatever the size
 * (tests). */
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

/* MemAvailable of /proc/meminfo in bytes (0 if unknown). */
static uint64_t mem_available(void) {
  FILE* f = fopen("/proc/meminfo", "r");
  if (!f) return 0;
  char line[128];
  unsigned long long kb = 0;
  while (fgets(line, sizeof line, f))
    if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1) break;
  fclose(f);
  return (uint64_t)kb * 1024;
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
static uint8_t* load_huge(int fd, uint64_t bytes, uint64_t* map_len) {
  const char* env = getenv("EDGELLM_HUGEPAGES");
  if (env && *env == '0') return NULL;
  size_t h = thp_size();
  if (!h || bytes == 0 || (bytes < (uint64_t)HUGE_MIN_PAGES * h && !(env && *env == '1'))) return NULL;
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
  int fd = open(cfg->path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    snprintf(err, errlen, "cannot open %s: %s; recompile the package or copy it again", cfg->path, strerror(errno));
    return NULL;
  }
  struct stat st;
  if (fstat(fd, &st) != 0 || (uint64_t)st.st_size != cfg->file_bytes) {
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
  const char* nomap = getenv("EDGELLM_NO_MMAP");
  if ((r->data = load_huge(fd, r->bytes, &r->map_len))) {
    r->mapped = 2;
    r->base.bytes_huge = r->bytes;
  }
  if (r->bytes > 0 && !r->mapped && !(nomap && *nomap && *nomap != '0')) {
    /* MAP_PRIVATE + PROT_READ: pages come from the page cache and are never written back or copied. */
    void* p = mmap(NULL, r->bytes, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p != MAP_FAILED) {
      madvise(p, r->bytes, MADV_WILLNEED); /* start read-ahead of the whole file now, not on first touch */
      r->data = p;
      r->mapped = 1;
      r->map_len = r->bytes;
    }
  }
  if (!r->mapped && !(r->data = read_all(fd, r->bytes, err, errlen, cfg->path))) {
    close(fd);
    free(r);
    return NULL;
  }
  close(fd); /* an mmap keeps its own reference to the file */
  r->base.acquire = resident_acquire;
  r->base.release = resident_release;
  r->base.close = resident_close;
  r->base.bytes_resident = resident_bytes;
  r->base.policy = "resident";
  return &r->base;
}

el_weight_store* el_store_open(const char* policy, const el_store_config* cfg, char* err, size_t errlen) {
  if (!policy || !*policy || !strcmp(policy, "resident")) return el_store_open_resident(cfg, err, errlen);
  snprintf(err, errlen, "unknown weight store policy \"%s\" (known: resident)", policy);
  return NULL;
}
