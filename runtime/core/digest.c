/* Package digests: sha256 (FIPS 180-4, plain C) and the check of a package against a pinned digest.
 *
 * `edgellm compile` writes SHA256SUMS (the format of coreutils' sha256sum: "<64 hex>  <path>" per line) listing
 * every file of the package, and prints sha256(SHA256SUMS) as the package digest. A loader given that digest
 * checks SHA256SUMS against it, then every listed file against SHA256SUMS, before it reads a plan or loads any
 * code: a package is native code, so a pinned digest is what makes loading one you did not build safe.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <limits.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "el_internal.h"

static const uint32_t K[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5, 0xd807aa98,
    0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174, 0xe49b69c1, 0xefbe4786,
    0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da, 0x983e5152, 0xa831c66d, 0xb00327c8,
    0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967, 0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13,
    0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85, 0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819,
    0xd6990624, 0xf40e3585, 0x106aa070, 0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a,
    0x5b9cca4f, 0x682e6ff3, 0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7,
    0xc67178f2};

#define ROR(x, n) (((x) >> (n)) | ((x) << (32 - (n))))

static void block(uint32_t h[8], const uint8_t* p) {
  uint32_t w[64];
  for (int i = 0; i < 16; i++) w[i] = (uint32_t)p[4 * i] << 24 | (uint32_t)p[4 * i + 1] << 16 | (uint32_t)p[4 * i + 2] << 8 | p[4 * i + 3];
  for (int i = 16; i < 64; i++) {
    uint32_t s0 = ROR(w[i - 15], 7) ^ ROR(w[i - 15], 18) ^ (w[i - 15] >> 3);
    uint32_t s1 = ROR(w[i - 2], 17) ^ ROR(w[i - 2], 19) ^ (w[i - 2] >> 10);
    w[i] = w[i - 16] + s0 + w[i - 7] + s1;
  }
  uint32_t a = h[0], b = h[1], c = h[2], d = h[3], e = h[4], f = h[5], g = h[6], k = h[7];
  for (int i = 0; i < 64; i++) {
    uint32_t t1 = k + (ROR(e, 6) ^ ROR(e, 11) ^ ROR(e, 25)) + ((e & f) ^ (~e & g)) + K[i] + w[i];
    uint32_t t2 = (ROR(a, 2) ^ ROR(a, 13) ^ ROR(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
    k = g, g = f, f = e, e = d + t1, d = c, c = b, b = a, a = t1 + t2;
  }
  h[0] += a, h[1] += b, h[2] += c, h[3] += d, h[4] += e, h[5] += f, h[6] += g, h[7] += k;
}

void el_sha256_init(el_sha256* s) {
  static const uint32_t H0[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                                 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
  memcpy(s->h, H0, sizeof H0);
  s->len = 0, s->fill = 0;
}

void el_sha256_update(el_sha256* s, const void* data, size_t n) {
  const uint8_t* p = data;
  s->len += n;
  if (s->fill) {
    size_t k = 64 - s->fill < n ? 64 - s->fill : n;
    memcpy(s->buf + s->fill, p, k);
    s->fill += (uint32_t)k, p += k, n -= k;
    if (s->fill < 64) return;
    block(s->h, s->buf);
    s->fill = 0;
  }
  for (; n >= 64; p += 64, n -= 64) block(s->h, p);
  memcpy(s->buf, p, n);
  s->fill = (uint32_t)n;
}

void el_sha256_final(el_sha256* s, uint8_t out[32]) {
  uint64_t bits = s->len * 8;
  uint8_t pad[72] = {0x80};
  size_t n = (s->fill < 56 ? 56 : 120) - s->fill;
  for (int i = 0; i < 8; i++) pad[n + i] = (uint8_t)(bits >> (56 - 8 * i));
  el_sha256_update(s, pad, n + 8);
  for (int i = 0; i < 8; i++)
    for (int j = 0; j < 4; j++) out[4 * i + j] = (uint8_t)(s->h[i] >> (24 - 8 * j));
}

static void hex(const uint8_t d[32], char out[65]) {
  for (int i = 0; i < 32; i++) snprintf(out + 2 * i, 3, "%02x", d[i]);
}

/* sha256 of a regular file, streamed (never blocks on a FIFO). */
static int hash_file(const char* path, char out[65]) {
  int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) return el_error("package check: cannot open %s: %s", path, strerror(errno));
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    close(fd);
    return el_error("package check: %s is not a regular file", path);
  }
  enum { BUF = 1 << 20 };
  uint8_t* buf = malloc(BUF);
  if (!buf) {
    close(fd);
    return el_error("out of memory");
  }
  el_sha256 s;
  el_sha256_init(&s);
  off_t at = 0;
  for (;;) {
    ssize_t got = pread(fd, buf, BUF, at);
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) {
      free(buf), close(fd);
      return el_error("package check: cannot read %s: %s", path, strerror(errno));
    }
    if (got == 0) break;
    el_sha256_update(&s, buf, (size_t)got);
    at += got;
  }
  free(buf), close(fd);
  uint8_t d[32];
  el_sha256_final(&s, d);
  hex(d, out);
  return 0;
}

/* A listed path must stay inside the package: relative, no "..", no empty component. */
int el_safe_relpath(const char* p) {
  if (!*p || *p == '/') return 0;
  for (const char* c = p; *c;) {
    const char* e = strchr(c, '/');
    size_t n = e ? (size_t)(e - c) : strlen(c);
    if (n == 0 || (n == 1 && c[0] == '.') || (n == 2 && c[0] == '.' && c[1] == '.')) return 0;
    c += n + (e != NULL);
  }
  return 1;
}

int el_package_path(const char* dir, const char* rel, const char* file, char* out, size_t out_size) {
  if (!el_safe_relpath(rel))
    return el_error("%s names the path '%.200s', which leaves the package (absolute, '..' or empty): refusing it; "
                    "recompile the package", file, rel);
  if ((size_t)snprintf(out, out_size, "%s/%s", dir, rel) >= out_size) return el_error("package path too long: %s", dir);
  char root[PATH_MAX], real[PATH_MAX];
  if (!realpath(dir, root)) return el_error("cannot resolve the package directory %s", dir);
  if (!realpath(out, real)) return 0; /* absent: the open that follows says so */
  size_t n = strlen(root);
  if (strncmp(real, root, n) != 0 || (real[n] != '/' && real[n] != 0))
    return el_error("%s names '%.200s', a link to %.200s outside the package: refusing it", file, rel, real);
  return 0;
}

int el_verify_package(const char* dir, const char* digest) {
  if (strncmp(digest, "sha256:", 7) != 0 || strlen(digest) != 7 + 64 || strspn(digest + 7, "0123456789abcdef") != 64)
    return el_error("package digest '%.80s' is not of the form sha256:<64 lowercase hex digits> (as `edgellm "
                    "compile` prints it)", digest);
  char path[4096];
  if ((size_t)snprintf(path, sizeof path, "%s/%s", dir, EL_FILE_SUMS) >= sizeof path)
    return el_error("package path too long: %s", dir);
  size_t n;
  char* sums = el_read_small_file(path, "SHA256SUMS", 1u << 20, &n);
  if (!sums) return el_error("the package has no readable %s, so it cannot be checked against a digest: recompile "
                             "it with this edgellm", EL_FILE_SUMS);
  el_sha256 s;
  el_sha256_init(&s);
  el_sha256_update(&s, sums, n);
  uint8_t d[32];
  char got[65];
  el_sha256_final(&s, d);
  hex(d, got);
  if (strcmp(got, digest + 7) != 0) {
    free(sums);
    return el_error("package digest mismatch: %s is sha256:%s, expected %s; the package was modified or is not the "
                    "one you pinned: do not run it", EL_FILE_SUMS, got, digest);
  }
  /* every line: 64 hex, two spaces, a path */
  static const char* const needed[] = {EL_FILE_MANIFEST, EL_FILE_PLAN, EL_FILE_WEIGHTS, EL_FILE_KERNELS,
                                       EL_FILE_TOKENIZER, EL_FILE_OPENCL_SOURCE, EL_FILE_OPENCL_TABLE};
  int listed[sizeof needed / sizeof *needed] = {0};
  int rc = 0;
  for (char *line = sums, *next; line && *line && rc == 0; line = next) {
    next = strchr(line, '\n');
    if (next) *next++ = 0;
    if (strlen(line) < 67 || strspn(line, "0123456789abcdef") != 64 || line[64] != ' ' || line[65] != ' ' ||
        !el_safe_relpath(line + 66)) {
      rc = el_error("%s has a malformed line: '%.100s'", EL_FILE_SUMS, line);
      break;
    }
    const char* rel = line + 66;
    for (size_t i = 0; i < sizeof needed / sizeof *needed; i++)
      if (!strcmp(rel, needed[i])) listed[i] = 1;
    char want[65], file[4096], have[65];
    memcpy(want, line, 64), want[64] = 0;
    if ((size_t)snprintf(file, sizeof file, "%s/%s", dir, rel) >= sizeof file) {
      rc = el_error("package path too long: %s", dir);
      break;
    }
    if ((rc = hash_file(file, have)) != 0) break;
    if (strcmp(have, want) != 0)
      rc = el_error("package check failed: %s does not match its digest in %s (the package was modified): do not "
                    "run it", rel, EL_FILE_SUMS);
  }
  free(sums);
  if (rc) return rc;
  /* files the runtime loads must be covered (the kernels and tokenizer.bin when the package has them) */
  for (size_t i = 0; i < sizeof needed / sizeof *needed; i++) {
    struct stat st;
    char file[4096];
    snprintf(file, sizeof file, "%s/%s", dir, needed[i]);
    if (!listed[i] && (lstat(file, &st) == 0 || i < 3))
      return el_error("%s does not cover %s: the package cannot be checked; recompile it", EL_FILE_SUMS, needed[i]);
  }
  return 0;
}

int el_check_listed(const char* dir, const char* rel) {
  char path[4096], have[65];
  if ((size_t)snprintf(path, sizeof path, "%s/%s", dir, EL_FILE_SUMS) >= sizeof path)
    return el_error("package path too long: %s", dir);
  struct stat st;
  if (lstat(path, &st) != 0) return 0; /* a package without SHA256SUMS (hand-made): nothing to check against */
  size_t n;
  char* sums = el_read_small_file(path, "SHA256SUMS", 1u << 20, &n);
  if (!sums) return -1;
  int rc = 1; /* not found yet */
  size_t len = strlen(rel);
  for (char *line = sums, *next; line && *line && rc == 1; line = next) {
    next = strchr(line, '\n');
    if (next) *next++ = 0;
    if (strlen(line) != 66 + len || strspn(line, "0123456789abcdef") != 64 || strcmp(line + 66, rel) != 0) continue;
    snprintf(path, sizeof path, "%s/%s", dir, rel);
    if (hash_file(path, have) != 0) rc = -1;
    else if (strncmp(have, line, 64) != 0)
      rc = el_error("%s does not match SHA256SUMS: the package is corrupt or was modified; recompile it or copy it "
                    "again", rel);
    else rc = 0;
  }
  free(sums);
  if (rc == 1) rc = el_error("%s is not listed in SHA256SUMS: the package is corrupt or was modified; recompile it", rel);
  return rc;
}
