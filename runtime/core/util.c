/* What every libedgellm file calls: the thread's last error, clocks, the profiling switch, small-file reads. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "el_internal.h"

/* Errors and clocks ------------------------------------------------------------------------------------------ */

static _Thread_local char last_error[1024];

int el_error(const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(last_error, sizeof last_error, fmt, ap);
  va_end(ap);
  for (char* p = last_error; *p; p++) /* one line, whatever went into it */
    if (*p == '\n' || *p == '\r') *p = ' ';
  return -1;
}

EL_API const char* el_last_error(void) { return last_error; }
EL_API const char* el_version(void) { return EL_VERSION_STRING; }

double el_now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

int el_profiling(void) {
  static int on = -1;
  if (on < 0) on = el_env_flag("EDGELLM_PROFILE");
  return on;
}

/* An environment switch: set, not empty and not "0". */
int el_env_flag(const char* name) {
  const char* s = getenv(name);
  return s && *s && strcmp(s, "0") != 0;
}

/* Files ------------------------------------------------------------------------------------------------------- */

void* el_read_small_file(const char* path, const char* what, size_t max_bytes, size_t* size) {
  /* O_NONBLOCK: opening a FIFO put in a package's place must not hang; it is refused by the S_ISREG check */
  int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    el_error("cannot open %s: %s; is this an edgellm package directory (made by `edgellm compile`)?", path,
             strerror(errno));
    return NULL;
  }
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    el_error("%s is not a regular file; recompile the package or copy it again", path);
    close(fd);
    return NULL;
  }
  if ((uint64_t)st.st_size > max_bytes) {
    el_error("%s is %lld bytes, more than any %s (%zu): the package is corrupt; recompile it", path,
             (long long)st.st_size, what, max_bytes);
    close(fd);
    return NULL;
  }
  size_t n = (size_t)st.st_size, done = 0;
  uint8_t* buf = malloc(n + 8);
  if (!buf) {
    el_error("out of memory reading %s", path);
    close(fd);
    return NULL;
  }
  while (done < n) {
    ssize_t got = pread(fd, buf + done, n - done, (off_t)done);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) {
      el_error("cannot read %s: %s; copy the package again", path, got < 0 ? strerror(errno) : "file shrank");
      free(buf);
      close(fd);
      return NULL;
    }
    done += (size_t)got;
  }
  close(fd);
  buf[n] = 0;
  *size = n;
  return buf;
}
