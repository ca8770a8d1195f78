/* Persistent thread pool behind TVMBackendParallelLaunch.
 *
 * A launch of n = min(num_task, threads) tasks wakes workers 1..n-1 and runs tasks on the calling thread too.
 * Decode makes ~100 launches per token, so fork/join must cost about a microsecond, not a thread create: each
 * worker waits on its own `go` word (own cache line), spinning for EDGELLM_SPIN_US (default 50 us, so
 * back-to-back kernels find it awake) before sleeping on a condvar; the caller spins until `pending` is 0.
 *
 * Tasks are claimed, not assigned: whoever is running (caller or worker) takes the next unclaimed task, so a
 * worker that is asleep or descheduled (phones, busy machines) costs nothing: the caller does its share. A
 * launch that leaves the count to the pool (num_task 0, as TVM's codegen does) is cut into EDGELLM_POOL_SPLIT
 * (default 16) tasks per thread, thread i's share being the i-th run of adjacent tasks (its region, one stream
 * of weights); a thread that has run its region takes the others' last tasks. On a 2-vCPU Zen 4 one vCPU
 * streams 5-10% slower than the other for seconds at a time: split 1 made the faster one idle at the end of
 * every GEMV; split 16 decoded the 1B 1-2% faster in the fast bandwidth state (q8, f16, q4), the same in the
 * slow one (bench/vs_llamacpp.py's packages, one process, interleaved). That
 * is only wrong for kernels that call TVMBackendParallelBarrier, which need all n tasks running at once; the
 * executor says whether the loaded kernels contain barriers, and then (as for any caller that does not say)
 * each worker runs exactly its own task.
 *
 * One pool per process, grown on demand and never shrunk. Thread count and barrier mode are per calling
 * thread (el_pool_set_threads, set by the executor from el_load's n_threads), so models with different counts
 * share the pool; launches from different threads are serialised by a mutex. A launch from inside a task
 * (nested parallelism) runs inline as one task. After fork() the child starts with no workers and respawns
 * them on first use.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "el_internal.h"

#define MAX_THREADS 256
#define SPLIT 16 /* default tasks per thread of a claimed launch */

#if defined(__x86_64__) || defined(__i386__)
#define cpu_relax() __builtin_ia32_pause()
#elif defined(__aarch64__)
#define cpu_relax() __asm__ __volatile__("yield" ::: "memory")
#else
#define cpu_relax() ((void)0)
#endif

typedef struct {
  _Alignas(64) atomic_uint go; /* the launch generation this worker is called to (0: none yet) */
  atomic_int sleeping;         /* 1 while blocked on the condvar */
  pthread_t thread;
} worker;

typedef struct { /* TVMParallelGroupEnv.sync_handle */
  atomic_int arrived;
  atomic_uint round;
} barrier;

static struct {
  pthread_mutex_t launch_mu; /* one launch at a time; also guards growth */
  pthread_mutex_t sleep_mu;
  pthread_cond_t wake;
  worker* w;     /* w[1..n_workers] (w[0] unused: the caller) */
  int n_workers; /* started */
  atomic_int stop;
  long spin_ns;
  unsigned gen; /* launches so far (launcher only) */
  /* the current launch, written before `claim` and the workers' `go` publish it */
  FTVMParallelLambda f;
  void* cdata;
  TVMParallelGroupEnv env;
  barrier bar;
  _Alignas(64) _Atomic uint64_t claim; /* see claim_word() */
  _Alignas(64) atomic_int pending;     /* tasks of the current launch not finished */
  atomic_int failed;
  int split;     /* tasks per thread of a launch whose tasks may be claimed (EDGELLM_POOL_SPLIT) */
  int n_regions; /* threads of the current launch: region[i] holds thread i's share of its tasks */
  struct {
    _Alignas(64) _Atomic uint64_t w; /* see region_word() */
  } region[MAX_THREADS];
} P = {.launch_mu = PTHREAD_MUTEX_INITIALIZER, .sleep_mu = PTHREAD_MUTEX_INITIALIZER, .wake = PTHREAD_COND_INITIALIZER};

static _Thread_local int tls_threads;  /* threads for launches from this thread (0: default) */
static _Thread_local int tls_claim;    /* tasks may be claimed by any thread (no barriers); off by default */
static _Thread_local int tls_in_task;  /* inside a parallel task: nested launches run inline */

static uint64_t now_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}

int el_pool_default_threads(void) {
  long n = sysconf(_SC_NPROCESSORS_ONLN);
  return n < 1 ? 1 : n > MAX_THREADS ? MAX_THREADS : (int)n;
}

void el_pool_set_threads(int n, int barriers) {
  tls_threads = n > MAX_THREADS ? MAX_THREADS : n;
  tls_claim = !barriers;
}

static void call_task(int t) {
  if (P.f(t, &P.env, P.cdata) != 0) atomic_store(&P.failed, 1);
}

static void run_task(int t) {
  call_task(t);
  atomic_fetch_sub_explicit(&P.pending, 1, memory_order_acq_rel);
}

/* claim = gen << 32 | assigned << 31 | tasks << 16: one word, so a late worker can never take part in a later
 * launch, nor mistake its mode or task count. */
static uint64_t claim_word(unsigned gen, int assigned, int tasks) {
  return (uint64_t)gen << 32 | (uint64_t)(assigned != 0) << 31 | (uint64_t)tasks << 16;
}

/* region word = gen << 32 | lo << 16 | hi: the tasks [lo, hi) of one thread's share not yet taken. */
static uint64_t region_word(unsigned gen, int lo, int hi) {
  return (uint64_t)gen << 32 | (uint64_t)lo << 16 | (uint64_t)hi;
}

/* Runs the unclaimed tasks of launch `gen`: first its own region's from the bottom up, so one thread's tasks are
 * one contiguous stream (TVM gives task t the t-th slice of the loop), then the other regions' from their tops
 * down, so a thread that is behind loses its last slices to the one that is ahead and both finish together. */
static void claim_and_run(unsigned gen, int home) {
  int n = P.n_regions, done = 0;
  for (int k = 0; k < n; k++) {
    _Atomic uint64_t* w = &P.region[(home + k) % n].w;
    uint64_t v = atomic_load_explicit(w, memory_order_acquire);
    for (;;) {
      if ((unsigned)(v >> 32) != gen) goto out; /* that launch is over */
      int lo = (int)(v >> 16 & 0xffff), hi = (int)(v & 0xffff);
      if (lo >= hi) break;
      uint64_t take = k == 0 ? v + (1u << 16) : v - 1;
      if (atomic_compare_exchange_weak_explicit(w, &v, take, memory_order_acq_rel, memory_order_acquire)) {
        call_task(k == 0 ? lo : hi - 1);
        done++;
        v = atomic_load_explicit(w, memory_order_acquire);
      }
    }
  }
out: /* one decrement for all of them: `pending` is shared by every thread, a write per task cost more than a task */
  if (done) atomic_fetch_sub_explicit(&P.pending, done, memory_order_acq_rel);
}

static void* worker_main(void* arg) {
  int id = (int)(intptr_t)arg;
  worker* me = &P.w[id];
  unsigned seen = 0; /* grow() zeroed go before starting us; a launch may already be waiting */
  tls_in_task = 1;
  for (;;) {
    unsigned g;
    uint64_t t0 = 0;
    for (int i = 0; (g = atomic_load_explicit(&me->go, memory_order_acquire)) == seen; i++) {
      if (atomic_load_explicit(&P.stop, memory_order_relaxed)) return NULL;
      cpu_relax();
      if ((i & 255) != 255) continue;
      if (!t0) {
        t0 = now_ns();
      } else if ((long)(now_ns() - t0) > P.spin_ns) {
        /* Sleep. sleeping=1 is stored before go is re-read (both seq_cst), and the launcher stores go before
         * reading sleeping, so one of the two sees the other: no lost wake-up. */
        pthread_mutex_lock(&P.sleep_mu);
        atomic_store(&me->sleeping, 1);
        while (atomic_load(&me->go) == seen && !atomic_load(&P.stop)) pthread_cond_wait(&P.wake, &P.sleep_mu);
        atomic_store(&me->sleeping, 0);
        pthread_mutex_unlock(&P.sleep_mu);
        t0 = 0;
        i = 0;
      }
    }
    seen = g;
    if (atomic_load(&P.stop)) return NULL;
    uint64_t c = atomic_load_explicit(&P.claim, memory_order_acquire);
    if ((unsigned)(c >> 32) != g) continue; /* that launch is over: others did our share */
    if (c >> 31 & 1)
      run_task(id); /* barrier mode: the launch cannot end without us, so its fields stay put */
    else
      claim_and_run(g, id);
  }
}

/* Called with launch_mu held. */
static int grow(int n_threads) {
  if (n_threads - 1 <= P.n_workers) return 0;
  if (!P.w) {
    P.w = aligned_alloc(64, sizeof(worker) * MAX_THREADS);
    if (!P.w) return -1;
    memset(P.w, 0, sizeof(worker) * MAX_THREADS);
    const char* s = getenv("EDGELLM_SPIN_US");
    P.spin_ns = (s && *s ? atol(s) : 50) * 1000;
    s = getenv("EDGELLM_POOL_SPLIT");
    P.split = s && *s ? atoi(s) : SPLIT;
    if (P.split < 1) P.split = 1;
    if (P.split > 64) P.split = 64;
  }
  for (int id = P.n_workers + 1; id < n_threads; id++) {
    atomic_store(&P.w[id].go, 0);
    atomic_store(&P.w[id].sleeping, 0);
    if (pthread_create(&P.w[id].thread, NULL, worker_main, (void*)(intptr_t)id) != 0) return -1;
    P.n_workers = id;
  }
  return 0;
}

int el_pool_reserve(int n) {
  if (n <= 0) n = el_pool_default_threads();
  if (n > MAX_THREADS) n = MAX_THREADS;
  pthread_mutex_lock(&P.launch_mu);
  int rc = grow(n);
  pthread_mutex_unlock(&P.launch_mu);
  if (rc) return el_error("cannot start %d worker threads; pass fewer threads", n - 1);
  return 0;
}

/* The group is min(num_task, threads) threads running as many tasks, or threads x split tasks where they are
 * claimed and num_task is 0 ("all", what TVM's codegen always asks for); env->num_task says how many: TVM's
 * lambdas split their range by it. (TVM's own pool refuses num_task > threads.) */
int el_parallel_launch(FTVMParallelLambda f, void* cdata, int num_task) {
  int n = tls_threads > 0 ? tls_threads : el_pool_default_threads();
  if (num_task > 0 && num_task < n) n = num_task;
  if (n <= 1 || tls_in_task) { /* serial, or nested inside a task: one task does the whole range */
    barrier b = {0};
    TVMParallelGroupEnv env = {&b, 1};
    int in = tls_in_task;
    tls_in_task = 1;
    int rc = f(0, &env, cdata) != 0 ? -1 : 0;
    tls_in_task = in;
    return rc;
  }
  pthread_mutex_lock(&P.launch_mu);
  if (grow(n) != 0 && P.n_workers + 1 < n) n = P.n_workers + 1; /* could not start all: use what runs */
  unsigned gen = ++P.gen;
  if (gen == 0) gen = ++P.gen; /* 0 means "never called" to a worker */
  int assigned = !tls_claim;
  /* claimed: `split` slices per thread when TVM leaves the count to us (num_task 0), so that the threads can even
   * out; each thread's slices stay adjacent (its region), so its weights still stream in one pass */
  int tasks = !assigned && num_task <= 0 ? n * P.split : n;
  P.f = f;
  P.cdata = cdata;
  P.env.sync_handle = &P.bar;
  P.env.num_task = tasks;
  atomic_store(&P.bar.arrived, 0);
  atomic_store(&P.failed, 0);
  atomic_store(&P.pending, tasks);
  if (!assigned) {
    P.n_regions = n;
    for (int i = 0; i < n; i++)
      atomic_store(&P.region[i].w, region_word(gen, i * tasks / n, (i + 1) * tasks / n));
  }
  atomic_store(&P.claim, claim_word(gen, assigned, tasks));
  int any_asleep = 0;
  for (int id = 1; id < n; id++) {
    atomic_store(&P.w[id].go, gen); /* seq_cst: publishes the launch fields above */
    any_asleep |= atomic_load(&P.w[id].sleeping);
  }
  if (any_asleep) {
    pthread_mutex_lock(&P.sleep_mu);
    pthread_cond_broadcast(&P.wake);
    pthread_mutex_unlock(&P.sleep_mu);
  }
  tls_in_task = 1;
  if (assigned)
    run_task(0);
  else
    claim_and_run(gen, 0);
  tls_in_task = 0;
  for (int i = 0; atomic_load_explicit(&P.pending, memory_order_acquire) != 0; i++) {
    cpu_relax();
    if (i > 100000) sched_yield(); /* a worker was descheduled mid-task: let it run */
  }
  int rc = atomic_load(&P.failed) ? -1 : 0;
  pthread_mutex_unlock(&P.launch_mu);
  return rc;
}

void* el_alloc_workspace(int device_type, int device_id, uint64_t nbytes, int code_hint, int bits_hint) {
  (void)device_type, (void)device_id, (void)code_hint, (void)bits_hint;
  return aligned_alloc(64, (nbytes + 63) / 64 * 64 + 64 * (nbytes == 0));
}

int el_free_workspace(int device_type, int device_id, void* ptr) {
  (void)device_type, (void)device_id;
  free(ptr);
  return 0;
}

/* Every task of the group waits until all have arrived (barrier mode: each task on its own thread). */
int el_parallel_barrier(int task_id, TVMParallelGroupEnv* penv) {
  (void)task_id;
  barrier* b = penv->sync_handle;
  int n = penv->num_task;
  if (!b || n <= 1) return 0;
  unsigned round = atomic_load(&b->round);
  if (atomic_fetch_add(&b->arrived, 1) == n - 1) {
    atomic_store(&b->arrived, 0); /* reset before release: the next round starts from 0 */
    atomic_fetch_add(&b->round, 1);
  } else {
    for (int i = 0; atomic_load(&b->round) == round; i++) {
      cpu_relax();
      if (i > 100000) sched_yield();
    }
  }
  return 0;
}

/* Exported under the names TVM-compiled code (and libtvm users) know. ---------------------------------------- */

EL_API int TVMBackendParallelLaunch(FTVMParallelLambda flambda, void* cdata, int num_task) {
  return el_parallel_launch(flambda, cdata, num_task);
}

EL_API int TVMBackendParallelBarrier(int task_id, TVMParallelGroupEnv* penv) {
  return el_parallel_barrier(task_id, penv);
}

EL_API void* TVMBackendAllocWorkspace(int device_type, int device_id, uint64_t nbytes, int dtype_code_hint,
                                      int dtype_bits_hint) {
  return el_alloc_workspace(device_type, device_id, nbytes, dtype_code_hint, dtype_bits_hint);
}

EL_API int TVMBackendFreeWorkspace(int device_type, int device_id, void* ptr) {
  return el_free_workspace(device_type, device_id, ptr);
}

/* Lifetime ------------------------------------------------------------------------------------------------- */

static void after_fork_child(void) {
  /* Only the forking thread survives: forget the workers (their memory is reused on respawn). */
  pthread_mutex_init(&P.launch_mu, NULL);
  pthread_mutex_init(&P.sleep_mu, NULL);
  pthread_cond_init(&P.wake, NULL);
  P.n_workers = 0;
}

static void before_fork(void) { pthread_mutex_lock(&P.launch_mu); } /* no fork mid-launch */
static void after_fork_parent(void) { pthread_mutex_unlock(&P.launch_mu); }

__attribute__((constructor)) static void pool_init(void) {
  pthread_atfork(before_fork, after_fork_parent, after_fork_child);
}

/* dlclose (or exit) of libedgellm: stop and join the workers so none runs unmapped code. */
__attribute__((destructor)) static void pool_fini(void) {
  if (!P.n_workers) return;
  atomic_store(&P.stop, 1);
  pthread_mutex_lock(&P.sleep_mu);
  pthread_cond_broadcast(&P.wake);
  pthread_mutex_unlock(&P.sleep_mu);
  for (int id = 1; id <= P.n_workers; id++) pthread_join(P.w[id].thread, NULL);
  P.n_workers = 0;
}
