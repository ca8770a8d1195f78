/* Weight store policies. "resident": every weight in memory for the life of the model. */
#define _GNU_SOURCE
#include "weight_store.h"

#include <errno.h>
#include <fcntl.h>
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
  int mapped;      /* 1: data is an mmap of the file; 0: malloc'd copy */
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
    munmap(r->data, r->bytes);
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
  if (r->bytes > 0 && !(nomap && *nomap && *nomap != '0')) {
    /* MAP_PRIVATE + PROT_READ: pages come from the page cache and are never written back or copied. */
    void* p = mmap(NULL, r->bytes, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p != MAP_FAILED) {
      madvise(p, r->bytes, MADV_WILLNEED); /* start read-ahead of the whole file now, not on first touch */
      r->data = p;
      r->mapped = 1;
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
