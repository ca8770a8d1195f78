/* The slice of the DLPack / TVM-FFI C ABI that TVM-compiled kernels use, copied so that libedgellm needs no
 * TVM headers. Layouts match dlpack.h (DLPack 1.x) and tvm/ffi/c_api.h of apache-tvm-ffi 0.1.x; the
 * _Static_asserts pin the sizes the kernels were compiled against. */
#ifndef EDGELLM_TVM_ABI_H
#define EDGELLM_TVM_ABI_H
#include <stddef.h>
#include <stdint.h>

enum { kDLCPU = 1 };                                         /* DLDeviceType */
enum { kDLInt = 0, kDLUInt = 1, kDLFloat = 2, kDLBfloat = 4 }; /* DLDataTypeCode */

typedef struct {
  int32_t device_type; /* DLDeviceType: a C enum, int-sized */
  int32_t device_id;
} DLDevice;

typedef struct {
  uint8_t code;
  uint8_t bits;
  uint16_t lanes;
} DLDataType;

typedef struct {
  void* data;
  DLDevice device;
  int32_t ndim;
  DLDataType dtype;
  int64_t* shape;
  int64_t* strides; /* NULL: compact row-major */
  uint64_t byte_offset;
} DLTensor;

/* TVMFFITypeIndex values we pass or receive */
enum { kTVMFFINone = 0, kTVMFFIInt = 1, kTVMFFIFloat = 3, kTVMFFIOpaquePtr = 4, kTVMFFIDLTensorPtr = 7 };

typedef struct {
  int32_t type_index;
  uint32_t zero_padding; /* must be 0 for everything but small strings */
  union {
    int64_t v_int64;
    double v_float64;
    void* v_ptr;
    const char* v_c_str;
    DLDataType v_dtype;
    DLDevice v_device;
    char v_bytes[8];
    uint64_t v_uint64;
  };
} TVMFFIAny;

/* __tvm_ffi_<name>: 0 on success, -1 after reporting through TVMFFIErrorSetRaisedFromCStrParts.
 * result->type_index must be kTVMFFINone (or another POD index) on entry. */
typedef int (*TVMFFISafeCallType)(void* self, const TVMFFIAny* args, int32_t num_args, TVMFFIAny* result);

/* Parallel runtime the kernels reach through their __TVMBackend* pointer variables. */
typedef struct {
  void* sync_handle;
  int32_t num_task;
} TVMParallelGroupEnv;
typedef int (*FTVMParallelLambda)(int task_id, TVMParallelGroupEnv* penv, void* cdata);
typedef int (*FTVMBackendParallelLaunch)(FTVMParallelLambda flambda, void* cdata, int num_task);
typedef void* (*FTVMBackendAllocWorkspace)(int device_type, int device_id, uint64_t nbytes, int dtype_code_hint,
                                           int dtype_bits_hint);
typedef int (*FTVMBackendFreeWorkspace)(int device_type, int device_id, void* ptr);

_Static_assert(sizeof(DLDevice) == 8, "DLDevice layout");
_Static_assert(sizeof(DLDataType) == 4, "DLDataType layout");
_Static_assert(sizeof(TVMFFIAny) == 16, "TVMFFIAny layout");
_Static_assert(offsetof(TVMFFIAny, v_ptr) == 8, "TVMFFIAny layout");
_Static_assert(offsetof(DLTensor, shape) == 24 || sizeof(void*) == 4, "DLTensor layout");
_Static_assert(sizeof(TVMParallelGroupEnv) == 16 || sizeof(void*) == 4, "TVMParallelGroupEnv layout");

#endif
