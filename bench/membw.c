/* STREAM-like read bandwidth: T threads (pthreads) each sum their slice of a large buffer, repeated; prints one
 * JSON object with the best and median GB/s (1 GB = 1e9 bytes).
 *
 *   gcc -O3 -march=native -pthread bench/membw.c -o membw && ./membw [threads=2] [MiB=1024] [reps=10]
 *
 * The buffer is much larger than the last-level cache, so this is DRAM read bandwidth, the bound of batch-1
 * decode (every weight byte read once per token). */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct {
    const uint64_t *p;
    size_t n;
    uint64_t sum;
    pthread_barrier_t *bar;
    int reps;
    double *t; /* per-rep end time, written by thread 0 only */
} job;

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static uint64_t sum_slice(const uint64_t *p, size_t n) {
    /* 8 independent accumulators: the compiler vectorizes this into wide loads + adds */
    uint64_t a[8] = {0};
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int k = 0; k < 8; k++) a[k] += p[i + k];
    for (; i < n; i++) a[0] += p[i];
    uint64_t s = 0;
    for (int k = 0; k < 8; k++) s += a[k];
    return s;
}

static void *worker(void *arg) {
    job *j = arg;
    for (int r = 0; r < j->reps; r++) {
        pthread_barrier_wait(j->bar);
        if (j->t) j->t[2 * r] = now();
        pthread_barrier_wait(j->bar);
        j->sum += sum_slice(j->p, j->n);
        pthread_barrier_wait(j->bar);
        if (j->t) j->t[2 * r + 1] = now();
    }
    return NULL;
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv) {
    int threads = argc > 1 ? atoi(argv[1]) : 2;
    size_t mib = argc > 2 ? (size_t)atol(argv[2]) : 1024;
    int reps = argc > 3 ? atoi(argv[3]) : 10;
    if (threads < 1 || mib < 1 || reps < 1) {
        fprintf(stderr, "usage: membw [threads>=1] [MiB>=1] [reps>=1]\n");
        return 2;
    }
    size_t n = mib * 1024 * 1024 / sizeof(uint64_t);
    uint64_t *buf;
    if (posix_memalign((void **)&buf, 64, n * sizeof(uint64_t))) {
        fprintf(stderr, "membw: cannot allocate %zu MiB\n", mib);
        return 1;
    }
    for (size_t i = 0; i < n; i++) buf[i] = i; /* touch every page (first-touch by the main thread) */

    pthread_barrier_t bar;
    pthread_barrier_init(&bar, NULL, (unsigned)threads);
    double *t = calloc(2 * (size_t)reps, sizeof(double));
    job *jobs = calloc((size_t)threads, sizeof(job));
    pthread_t *tid = calloc((size_t)threads, sizeof(pthread_t));
    size_t per = (n / threads) & ~(size_t)7;
    for (int k = 0; k < threads; k++) {
        jobs[k] = (job){buf + k * per, k == threads - 1 ? n - k * per : per, 0, &bar, reps, k == 0 ? t : NULL};
        if (k) pthread_create(&tid[k], NULL, worker, &jobs[k]);
    }
    worker(&jobs[0]);
    uint64_t total = 0;
    for (int k = 0; k < threads; k++) {
        if (k) pthread_join(tid[k], NULL);
        total += jobs[k].sum;
    }
    double *gbs = calloc((size_t)reps, sizeof(double));
    for (int r = 0; r < reps; r++) gbs[r] = n * sizeof(uint64_t) / (t[2 * r + 1] - t[2 * r]) / 1e9;
    qsort(gbs, (size_t)reps, sizeof(double), cmp);
    printf("{\"threads\": %d, \"mib\": %zu, \"reps\": %d, \"read_gbs_best\": %.3f, \"read_gbs_median\": %.3f, "
           "\"checksum\": %llu}\n",
           threads, mib, reps, gbs[reps - 1], gbs[reps / 2], (unsigned long long)(total & 0xffff));
    free(gbs);
    free(tid);
    free(jobs);
    free(t);
    free(buf);
    return 0;
}
