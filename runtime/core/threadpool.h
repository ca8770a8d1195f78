/* Persistent worker pool behind TVMBackendParallelLaunch (one per process). */
#ifndef EDGELLM_THREADPOOL_H
#define EDGELLM_THREADPOOL_H
#include <stdint.h>

#include "../tvm_abi.h"

#ifndef EL_HIDDEN
#define EL_HIDDEN __attribute__((visibility("hidden")))
#endif

/* Threads a parallel launch from this thread uses (<= 0: the process default, online CPUs), and whether the
 * kernels it runs may call TVMBackendParallelBarrier (then every task gets its own thread; otherwise idle
 * threads take over tasks of late ones). The executor sets both before each program run. */
EL_HIDDEN void el_pool_set_threads(int n, int barriers);
/* Online CPUs (>= 1). */
EL_HIDDEN int el_pool_default_threads(void);
/* Starts workers so that n threads (caller included) can run; returns 0 or -1 (el_error set). */
EL_HIDDEN int el_pool_reserve(int n);
/* What kernels.so's __TVMBackend* pointer variables are set to. Static copies of the exported TVMBackend*
 * functions, so another TVM runtime loaded into the process (with the same exported names) cannot interpose. */
EL_HIDDEN int el_parallel_launch(FTVMParallelLambda f, void* cdata, int num_task);
EL_HIDDEN int el_parallel_barrier(int task_id, TVMParallelGroupEnv* penv);
EL_HIDDEN void* el_alloc_workspace(int device_type, int device_id, uint64_t nbytes, int code_hint, int bits_hint);
EL_HIDDEN int el_free_workspace(int device_type, int device_id, void* ptr);

/* The exported names TVM-compiled code (and libtvm-style callers) know; they forward to the above. */
__attribute__((visibility("default"))) int TVMBackendParallelLaunch(FTVMParallelLambda flambda, void* cdata,
                                                                    int num_task);
__attribute__((visibility("default"))) int TVMBackendParallelBarrier(int task_id, TVMParallelGroupEnv* penv);
__attribute__((visibility("default"))) void* TVMBackendAllocWorkspace(int device_type, int device_id, uint64_t nbytes,
                                                                      int dtype_code_hint, int dtype_bits_hint);
__attribute__((visibility("default"))) int TVMBackendFreeWorkspace(int device_type, int device_id, void* ptr);

#endif
