/* Unit test of runtime/core/threadpool.c (compiled in directly, so the hidden el_pool_* functions are reachable):
 *   gcc -std=c11 -O2 -Iruntime tests/c/pool_test.c runtime/core/threadpool.c -o pool_test -lpthread && ./pool_test
 * Prints "OK" and the fork/join latency; exits nonzero on the first failure. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "el_internal.h"

int el_error(const char* fmt, ...) { /* runtime.c's, which this test does not link */
  va_list ap;
  va_start(ap, fmt);
  vfprintf(stderr, fmt, ap);
  va_end(ap);
  return -1;
}

#include "check.h"

#define SPLIT_TEST 5 /* EDGELLM_POOL_SPLIT for this test: claimed launches run threads x 5 tasks */

static atomic_int hits[64];
static atomic_int bad;
static int expect_n;

static int count_task(int id, TVMParallelGroupEnv* env, void* cdata) {
  (void)cdata;
  if (env->num_task != expect_n || id < 0 || id >= env->num_task) atomic_store(&bad, 1);
  atomic_fetch_add(&hits[id], 1);
  return 0;
}

static atomic_int arrive[64];
static int barrier_task(int id, TVMParallelGroupEnv* env, void* cdata) {
  (void)cdata;
  for (int r = 0; r < 64; r++) {
    atomic_fetch_add(&arrive[r], 1);
    TVMBackendParallelBarrier(id, env);
    if (atomic_load(&arrive[r]) != env->num_task) atomic_store(&bad, 1); /* someone passed early */
  }
  return 0;
}

static int fail_task(int id, TVMParallelGroupEnv* env, void* cdata) {
  (void)env, (void)cdata;
  return id == 1 ? -1 : 0;
}

static int inner_task(int id, TVMParallelGroupEnv* env, void* cdata) {
  (void)cdata;
  if (id != 0 || env->num_task != 1) atomic_store(&bad, 1);
  atomic_fetch_add(&hits[0], 1);
  return 0;
}
static int outer_task(int id, TVMParallelGroupEnv* env, void* cdata) {
  (void)id, (void)env, (void)cdata;
  return TVMBackendParallelLaunch(inner_task, NULL, 0); /* nested: runs inline as one task */
}

static int empty_task(int id, TVMParallelGroupEnv* env, void* cdata) {
  (void)id, (void)env, (void)cdata;
  return 0;
}

static void reset_hits(void) {
  for (int i = 0; i < 64; i++) atomic_store(&hits[i], 0);
}

/* Stealing: tasks run by the worker are slow, so the caller, done with its own region, takes the worker's last
 * tasks from the top down; each thread's own tasks go bottom up (one stream). */
static pthread_t caller_thread;
static atomic_int ran_by_caller[16], order_bad, last_own, first_stolen;
static int slow_worker_task(int id, TVMParallelGroupEnv* env, void* cdata) {
  (void)env, (void)cdata;
  if (pthread_equal(pthread_self(), caller_thread)) {
    atomic_store(&ran_by_caller[id], 1);
    if (id < SPLIT_TEST) { /* its own region, in order */
      if (id != atomic_load(&last_own) + 1) atomic_store(&order_bad, 1);
      atomic_store(&last_own, id);
    } else {
      int none = -1;
      atomic_compare_exchange_strong(&first_stolen, &none, id);
    }
  } else {
    usleep(20000);
  }
  atomic_fetch_add(&hits[id], 1);
  return 0;
}

static void check_counts(int n, int reps) {
  for (int i = 0; i < 64; i++)
    CHECK(atomic_load(&hits[i]) == (i < n ? reps : 0), "n=%d task %d ran %d times, want %d", n, i,
          atomic_load(&hits[i]), i < n ? reps : 0);
  CHECK(!atomic_load(&bad), "n=%d: a task saw the wrong num_task", n);
}

static void* user_thread(void* arg) { /* a second caller with its own thread count */
  el_pool_set_threads((int)(intptr_t)arg, 0);
  for (int i = 0; i < 2000; i++)
    if (TVMBackendParallelLaunch(empty_task, NULL, 0) != 0) atomic_store(&bad, 1);
  return NULL;
}

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + 1e-9 * t.tv_nsec;
}

int main(void) {
  setenv("EDGELLM_POOL_SPLIT", "5", 1); /* read when the pool starts */
  int ns[] = {1, 2, 3, 4, 8};
  for (int barriers = 0; barriers < 2; barriers++) /* tasks claimed by whoever runs, or one per thread */
    for (unsigned k = 0; k < sizeof ns / sizeof *ns; k++) {
      int n = ns[k], reps = 3000;
      el_pool_set_threads(n, barriers);
      expect_n = n > 1 && !barriers ? n * SPLIT_TEST : n;
      reset_hits();
      for (int r = 0; r < reps; r++) CHECK(TVMBackendParallelLaunch(count_task, NULL, 0) == 0, "launch failed");
      check_counts(expect_n, reps);
    }
  /* explicit num_task below the thread count: the group is num_task */
  el_pool_set_threads(8, 0);
  expect_n = 3;
  reset_hits();
  for (int r = 0; r < 1000; r++) TVMBackendParallelLaunch(count_task, NULL, 3);
  check_counts(3, 1000);
  /* ... and above it: clamped to the threads, and env->num_task says so */
  el_pool_set_threads(2, 0);
  expect_n = 2;
  reset_hits();
  for (int r = 0; r < 1000; r++) TVMBackendParallelLaunch(count_task, NULL, 7);
  check_counts(2, 1000);

  /* workers asleep (spin window long over) must still wake: the lost-wake-up path (barrier mode, where the
   * caller cannot do their tasks), and in claim mode late workers must not run anything twice */
  for (int barriers = 1; barriers >= 0; barriers--) {
    el_pool_set_threads(4, barriers);
    expect_n = barriers ? 4 : 4 * SPLIT_TEST;
    reset_hits();
    for (int r = 0; r < 20; r++) {
      usleep(2000);
      CHECK(TVMBackendParallelLaunch(count_task, NULL, 0) == 0, "launch after sleep failed");
      CHECK(TVMBackendParallelLaunch(count_task, NULL, 0) == 0, "launch after sleep failed");
    }
    check_counts(expect_n, 40);
  }

  /* stealing: 2 threads, 10 tasks; the worker's are slow, so the caller runs its 5 in order and then takes the
   * worker's from task 9 down while the worker, asleep or in task 5, sleeps */
  el_pool_set_threads(2, 0);
  expect_n = 2 * SPLIT_TEST;
  caller_thread = pthread_self();
  for (int r = 0; r < 5; r++) {
    reset_hits();
    for (int i = 0; i < 16; i++) atomic_store(&ran_by_caller[i], 0);
    atomic_store(&last_own, -1);
    atomic_store(&first_stolen, -1);
    CHECK(TVMBackendParallelLaunch(slow_worker_task, NULL, 0) == 0, "stealing launch failed");
    check_counts(expect_n, 1);
    int by_caller = 0;
    for (int i = 0; i < 2 * SPLIT_TEST; i++) by_caller += atomic_load(&ran_by_caller[i]);
    CHECK(by_caller > SPLIT_TEST, "the caller ran %d of 10 tasks: it took none of the slow worker's", by_caller);
    CHECK(atomic_load(&first_stolen) == 2 * SPLIT_TEST - 1, "task %d was stolen first, not the last one (9)",
          atomic_load(&first_stolen));
    CHECK(!atomic_load(&order_bad) && atomic_load(&last_own) == SPLIT_TEST - 1, "the caller's own tasks ran out of order");
  }

  /* barrier */
  el_pool_set_threads(4, 1);
  CHECK(TVMBackendParallelLaunch(barrier_task, NULL, 0) == 0, "barrier launch failed");
  CHECK(!atomic_load(&bad), "barrier let a task through early");
  for (int r = 0; r < 64; r++) CHECK(atomic_load(&arrive[r]) == 4, "barrier round %d: %d arrivals", r, atomic_load(&arrive[r]));

  /* a failing task makes the launch fail */
  CHECK(TVMBackendParallelLaunch(fail_task, NULL, 0) != 0, "failure of task 1 not reported");
  CHECK(TVMBackendParallelLaunch(empty_task, NULL, 0) == 0, "pool broken after a failure");

  /* nested launch */
  reset_hits();
  CHECK(TVMBackendParallelLaunch(outer_task, NULL, 0) == 0, "nested launch failed");
  CHECK(atomic_load(&hits[0]) == 4 && !atomic_load(&bad), "nested: %d inner runs", atomic_load(&hits[0]));

  /* two user threads launching at once */
  pthread_t a, b;
  pthread_create(&a, NULL, user_thread, (void*)(intptr_t)2);
  pthread_create(&b, NULL, user_thread, (void*)(intptr_t)3);
  pthread_join(a, NULL);
  pthread_join(b, NULL);
  CHECK(!atomic_load(&bad), "concurrent launches failed");

  /* workspace */
  for (int i = 0; i < 100; i++) {
    void* p = TVMBackendAllocWorkspace(1, 0, (uint64_t)i * 37, 2, 32);
    CHECK(p && ((uintptr_t)p & 63) == 0, "workspace not 64-byte aligned");
    memset(p, 1, (size_t)i * 37);
    CHECK(TVMBackendFreeWorkspace(1, 0, p) == 0, "free workspace");
  }

  /* fork/join latency, workers hot */
  double us[2];
  for (int barriers = 0; barriers < 2; barriers++) {
    el_pool_set_threads(2, barriers);
    for (int i = 0; i < 1000; i++) TVMBackendParallelLaunch(empty_task, NULL, 0);
    int reps = 20000;
    double t0 = now();
    for (int i = 0; i < reps; i++) TVMBackendParallelLaunch(empty_task, NULL, 0);
    us[barriers] = (now() - t0) / reps * 1e6;
  }
  printf("OK launch on 2 threads: %.2f us (%d claimed tasks), %.2f us (one task per thread)\n", us[0], 2 * SPLIT_TEST, us[1]);
  return 0;
}
