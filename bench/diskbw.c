/* Sequential cold read speed of one file, as the window store reads: `threads` readers taking 1 MiB requests in
 * turn, either buffered (the kernel's read-ahead; each reader drops the page cache behind the slowest request in whole
 * 2 MiB folios) or O_DIRECT. Prints GB/s. Used by bench/offload.py for the I/O bound.
 *     diskbw FILE THREADS buffered|direct */
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define REQ (1 << 20)
#define FOLIO (2 << 20)

static int fd, direct;
static long long size, next_off;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + 1e-9 * t.tv_nsec;
}

static void* reader(void* arg) {
  (void)arg;
  char* buf = mmap(NULL, REQ, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  for (;;) {
    pthread_mutex_lock(&mu);
    long long off = next_off;
    next_off += REQ;
    pthread_mutex_unlock(&mu);
    if (off >= size / REQ * REQ) break;
    for (long long done = 0; done < REQ;) {
      ssize_t got = pread(fd, buf + done, REQ - done, off + done);
      if (got <= 0) exit(1);
      done += got;
    }
    if (!direct && off >= 4LL * REQ) /* two requests may still be in flight behind this one */
      posix_fadvise(fd, 0, (off - 4LL * REQ) / FOLIO * FOLIO, POSIX_FADV_DONTNEED);
  }
  munmap(buf, REQ);
  return NULL;
}

int main(int argc, char** argv) {
  if (argc != 4) return fprintf(stderr, "usage: diskbw FILE THREADS buffered|direct\n"), 2;
  int threads = atoi(argv[2]);
  direct = !strcmp(argv[3], "direct");
  fd = open(argv[1], O_RDONLY | (direct ? O_DIRECT : 0));
  struct stat st;
  if (fd < 0 || fstat(fd, &st) != 0 || threads < 1 || threads > 16) return fprintf(stderr, "diskbw: bad args\n"), 2;
  size = st.st_size;
  posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED); /* cold */
  pthread_t th[16];
  double t0 = now();
  for (int i = 0; i < threads; i++) pthread_create(&th[i], NULL, reader, NULL);
  for (int i = 0; i < threads; i++) pthread_join(th[i], NULL);
  double secs = now() - t0;
  posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  printf("%.4f\n", (double)(size / REQ * REQ) / secs / 1e9);
  return 0;
}
