/* The slice of ONNX Runtime's C API that the NPU (QNN) backend uses, declared by us so that libedgellm needs no
 * onnxruntime headers and links nothing: libonnxruntime is dlopen'ed and its one export, OrtGetApiBase, hands out
 * the OrtApi table.
 *
 * OrtApi is a struct of function pointers that ORT only ever appends to (onnxruntime_c_api.cc static_asserts the
 * last slot of every shipped version), so a function's slot index is fixed from the version that introduced it
 * on. We keep no copy of the struct: el_ort_bind reads the slots we name below out of the table as an array of
 * function pointers. Slot indices come from ORT's ort_api_1_to_N table; they were checked against the
 * static_asserts there (ReleaseCustomOpDomain 101 v1, SetGlobalSpinControl 149 v5, ReleaseKernelInfo 218 v12,
 * GetSessionConfigEntry 238 v14, GetBuildInfoString 254 v15, SetEpDynamicOptions 284 v20, GetEpApi 317 v22), and
 * every slot was exercised against onnxruntime 1.32.0 (API 1..32) with the QNN plugin EP of onnxruntime-qnn 2.7.0.
 *
 * API versions: ORT 1.N serves API versions 1..N, and GetApi(v) returns NULL (after a line on stderr) when v is
 * newer than the library. The plugin-EP calls (RegisterExecutionProviderLibrary and friends: an EP shipped as its
 * own library, like the onnxruntime-qnn wheel) need 22 (ORT 1.22); everything else here, including the by-name
 * SessionOptionsAppendExecutionProvider that reaches an EP compiled into libonnxruntime (QNN in the Android
 * onnxruntime-android-qnn build), needs 15. el_ort_bind asks for 22, then 15; slots newer than the version granted
 * stay NULL.
 *
 * Linux / Android only: ORT_API_CALL is empty there (the platform C convention) and ORTCHAR_T is char. */
#ifndef EDGELLM_ORT_API_H
#define EDGELLM_ORT_API_H
#include <stddef.h>
#include <stdint.h>

#define EL_ORT_API_PLUGIN 22 /* plugin EP libraries, OrtEpDevice (ORT 1.22) */
#define EL_ORT_API_MIN 15    /* everything else we call (GetBuildInfoString is the newest: ORT 1.15) */

/* Opaque handles: ORT owns them, we only pass pointers back. */
typedef struct OrtApiBase OrtApiBase;
typedef struct OrtApi OrtApi;
typedef struct OrtStatus OrtStatus; /* NULL means success */
typedef struct OrtEnv OrtEnv;
typedef struct OrtSessionOptions OrtSessionOptions;
typedef struct OrtSession OrtSession;
typedef struct OrtRunOptions OrtRunOptions;
typedef struct OrtMemoryInfo OrtMemoryInfo;
typedef struct OrtValue OrtValue;
typedef struct OrtAllocator OrtAllocator; /* a struct of callbacks in ORT; we only free through AllocatorFree */
typedef struct OrtTypeInfo OrtTypeInfo;
typedef struct OrtTensorTypeAndShapeInfo OrtTensorTypeAndShapeInfo;
typedef struct OrtEpDevice OrtEpDevice;

/* OrtApiBase is not versioned and can never change: two function pointers. */
struct OrtApiBase {
  const OrtApi* (*GetApi)(uint32_t version);
  const char* (*GetVersionString)(void);
};
typedef const OrtApiBase* (*el_ort_get_api_base_fn)(void); /* the exported OrtGetApiBase */

/* Enums, passed as C ints; values are ORT's (ONNX TensorProto data types for the element type). */
typedef enum {
  ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED = 0,
  ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT = 1,
  ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8 = 2,
  ONNX_TENSOR_ELEMENT_DATA_TYPE_INT8 = 3,
  ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT16 = 4,
  ONNX_TENSOR_ELEMENT_DATA_TYPE_INT16 = 5,
  ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32 = 6,
  ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64 = 7,
  ONNX_TENSOR_ELEMENT_DATA_TYPE_BOOL = 9,
  ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16 = 10,
} ONNXTensorElementDataType;

typedef enum {
  ORT_LOGGING_LEVEL_VERBOSE = 0,
  ORT_LOGGING_LEVEL_INFO = 1,
  ORT_LOGGING_LEVEL_WARNING = 2,
  ORT_LOGGING_LEVEL_ERROR = 3,
  ORT_LOGGING_LEVEL_FATAL = 4,
} OrtLoggingLevel;

typedef enum {
  ORT_OK = 0,
  ORT_FAIL = 1,
  ORT_INVALID_ARGUMENT = 2,
  ORT_NO_SUCHFILE = 3,
  ORT_NO_MODEL = 4,
  ORT_ENGINE_ERROR = 5,
  ORT_RUNTIME_EXCEPTION = 6,
  ORT_INVALID_PROTOBUF = 7,
  ORT_MODEL_LOADED = 8,
  ORT_NOT_IMPLEMENTED = 9,
  ORT_INVALID_GRAPH = 10,
  ORT_EP_FAIL = 11,
} OrtErrorCode; /* later versions add codes: treat unknown values as failures */

typedef enum {
  OrtInvalidAllocator = -1,
  OrtDeviceAllocator = 0,
  OrtArenaAllocator = 1,
} OrtAllocatorType;

typedef enum {
  OrtMemTypeCPUInput = -2,
  OrtMemTypeCPUOutput = -1,
  OrtMemTypeCPU = OrtMemTypeCPUOutput,
  OrtMemTypeDefault = 0,
} OrtMemType;

/* The functions we call: X(return type, name, slot, API version that introduced the slot, parameters).
 * Functions returning OrtStatus* return NULL on success; a non-NULL status carries GetErrorMessage's text and must
 * go back through ReleaseStatus. */
#define EL_ORT_FUNCS(X)                                                                                             \
  /* errors */                                                                                                      \
  X(OrtStatus*, CreateStatus, 0, 1, (OrtErrorCode code, const char* msg))                                           \
  X(OrtErrorCode, GetErrorCode, 1, 1, (const OrtStatus* status))                                                    \
  X(const char*, GetErrorMessage, 2, 1, (const OrtStatus* status))                                                  \
  X(void, ReleaseStatus, 93, 1, (OrtStatus* status))                                                                \
  /* environment (one per process: it owns logging and the registered EP libraries) */                              \
  X(OrtStatus*, CreateEnv, 3, 1, (OrtLoggingLevel level, const char* logid, OrtEnv** out))                          \
  X(void, ReleaseEnv, 92, 1, (OrtEnv* env))                                                                         \
  X(OrtStatus*, GetAvailableProviders, 125, 4, (char*** out, int* n))                                               \
  X(OrtStatus*, ReleaseAvailableProviders, 126, 4, (char** providers, int n))                                       \
  X(const char*, GetBuildInfoString, 254, 15, (void))                                                               \
  /* session options */                                                                                             \
  X(OrtStatus*, CreateSessionOptions, 10, 1, (OrtSessionOptions** out))                                             \
  X(void, ReleaseSessionOptions, 100, 1, (OrtSessionOptions* so))                                                   \
  X(OrtStatus*, SetSessionLogSeverityLevel, 22, 1, (OrtSessionOptions* so, int level))                              \
  X(OrtStatus*, SetIntraOpNumThreads, 24, 1, (OrtSessionOptions* so, int n))                                        \
  X(OrtStatus*, AddSessionConfigEntry, 130, 5, (OrtSessionOptions* so, const char* key, const char* value))         \
  /* size: in, the bytes at value; out, the bytes written or needed, with the NUL */                                \
  X(OrtStatus*, GetSessionConfigEntry, 238, 14,                                                                     \
    (const OrtSessionOptions* so, const char* key, char* value, size_t* size))                                      \
  /* an EP built into libonnxruntime, by name ("QNN", "XNNPACK", ...) */                                            \
  X(OrtStatus*, SessionOptionsAppendExecutionProvider, 216, 12,                                                     \
    (OrtSessionOptions* so, const char* ep_name, const char* const* keys, const char* const* values, size_t n))     \
  /* an EP in its own library: register it with the env, then append the OrtEpDevices it offers */                 \
  X(OrtStatus*, RegisterExecutionProviderLibrary, 301, 22, (OrtEnv* env, const char* reg_name, const char* path))   \
  X(OrtStatus*, UnregisterExecutionProviderLibrary, 302, 22, (OrtEnv* env, const char* reg_name))                   \
  /* the array belongs to the env: do not free */                                                                   \
  X(OrtStatus*, GetEpDevices, 303, 22, (const OrtEnv* env, const OrtEpDevice* const** devices, size_t* n))          \
  X(OrtStatus*, SessionOptionsAppendExecutionProvider_V2, 304, 22,                                                  \
    (OrtSessionOptions* so, OrtEnv* env, const OrtEpDevice* const* devices, size_t n_devices,                       \
     const char* const* keys, const char* const* values, size_t n_options))                                         \
  X(const char*, EpDevice_EpName, 312, 22, (const OrtEpDevice* device))                                             \
  X(const char*, EpDevice_EpVendor, 313, 22, (const OrtEpDevice* device))                                           \
  /* sessions */                                                                                                    \
  X(OrtStatus*, CreateSession, 7, 1, (const OrtEnv* env, const char* path, const OrtSessionOptions* so,             \
                                      OrtSession** out))                                                            \
  X(void, ReleaseSession, 95, 1, (OrtSession* s))                                                                   \
  X(OrtStatus*, SessionGetInputCount, 30, 1, (const OrtSession* s, size_t* out))                                    \
  X(OrtStatus*, SessionGetOutputCount, 31, 1, (const OrtSession* s, size_t* out))                                   \
  X(OrtStatus*, SessionGetInputTypeInfo, 33, 1, (const OrtSession* s, size_t i, OrtTypeInfo** out))                 \
  X(OrtStatus*, SessionGetOutputTypeInfo, 34, 1, (const OrtSession* s, size_t i, OrtTypeInfo** out))                \
  /* the name is allocated with `a`: free it with AllocatorFree(a, name) */                                         \
  X(OrtStatus*, SessionGetInputName, 36, 1, (const OrtSession* s, size_t i, OrtAllocator* a, char** out))           \
  X(OrtStatus*, SessionGetOutputName, 37, 1, (const OrtSession* s, size_t i, OrtAllocator* a, char** out))          \
  /* outputs[i] NULL: ORT allocates it (release with ReleaseValue); non-NULL: ORT writes into it */                 \
  X(OrtStatus*, Run, 9, 1,                                                                                          \
    (OrtSession* s, const OrtRunOptions* ro, const char* const* in_names, const OrtValue* const* inputs,            \
     size_t n_in, const char* const* out_names, size_t n_out, OrtValue** outputs))                                  \
  /* type and shape info (the tensor info from CastTypeInfoToTensorInfo belongs to the type info) */                \
  X(OrtStatus*, CastTypeInfoToTensorInfo, 55, 1, (const OrtTypeInfo* ti, const OrtTensorTypeAndShapeInfo** out))   \
  X(OrtStatus*, GetTensorElementType, 60, 1, (const OrtTensorTypeAndShapeInfo* info, ONNXTensorElementDataType* out)) \
  X(OrtStatus*, GetDimensionsCount, 61, 1, (const OrtTensorTypeAndShapeInfo* info, size_t* out))                    \
  X(OrtStatus*, GetDimensions, 62, 1, (const OrtTensorTypeAndShapeInfo* info, int64_t* dims, size_t n))             \
  X(OrtStatus*, GetTensorTypeAndShape, 65, 1, (const OrtValue* v, OrtTensorTypeAndShapeInfo** out))                 \
  X(void, ReleaseTypeInfo, 98, 1, (OrtTypeInfo* ti))                                                                \
  X(void, ReleaseTensorTypeAndShapeInfo, 99, 1, (OrtTensorTypeAndShapeInfo* info))                                  \
  /* values over caller-owned memory */                                                                             \
  X(OrtStatus*, CreateCpuMemoryInfo, 69, 1, (OrtAllocatorType type, OrtMemType mem, OrtMemoryInfo** out))           \
  X(OrtStatus*, MemoryInfoGetName, 71, 1, (const OrtMemoryInfo* mi, const char** out))                              \
  X(void, ReleaseMemoryInfo, 94, 1, (OrtMemoryInfo* mi))                                                            \
  /* data stays the caller's and must outlive the value */                                                          \
  X(OrtStatus*, CreateTensorWithDataAsOrtValue, 49, 1,                                                              \
    (const OrtMemoryInfo* mi, void* data, size_t bytes, const int64_t* shape, size_t rank,                          \
     ONNXTensorElementDataType type, OrtValue** out))                                                               \
  X(OrtStatus*, GetTensorMutableData, 51, 1, (OrtValue* v, void** out))                                             \
  X(void, ReleaseValue, 96, 1, (OrtValue* v))                                                                       \
  /* the process-wide default CPU allocator: never released */                                                      \
  X(OrtStatus*, GetAllocatorWithDefaultOptions, 78, 1, (OrtAllocator** out))                                        \
  X(OrtStatus*, AllocatorFree, 76, 1, (OrtAllocator* a, void* p))

#define EL_ORT_TYPEDEF(ret, name, slot, since, params) typedef ret (*el_ort_##name##_fn) params;
EL_ORT_FUNCS(EL_ORT_TYPEDEF)
#undef EL_ORT_TYPEDEF

/* The bound functions; a member is NULL when the granted API version predates its slot. */
typedef struct {
  uint32_t api_version; /* the version GetApi granted */
  const OrtApiBase* base;
#define EL_ORT_MEMBER(ret, name, slot, since, params) el_ort_##name##_fn name;
  EL_ORT_FUNCS(EL_ORT_MEMBER)
#undef EL_ORT_MEMBER
} el_ort;

/* Fills o from base: the table of API EL_ORT_API_PLUGIN if the library serves it, else of EL_ORT_API_MIN.
 * Returns the version granted, 0 when the library is older than EL_ORT_API_MIN. */
static inline uint32_t el_ort_bind(el_ort* o, const OrtApiBase* base) {
  typedef void (*any_fn)(void); /* slots are read as function pointers, then cast to their own type */
  const uint32_t versions[2] = {EL_ORT_API_PLUGIN, EL_ORT_API_MIN};
  const OrtApi* api = NULL;
  uint32_t v = 0;
  for (int i = 0; i < 2 && !api; i++) api = base->GetApi(v = versions[i]);
  *o = (el_ort){0};
  if (!api) return 0;
  o->api_version = v;
  o->base = base;
  const any_fn* slots = (const any_fn*)(const void*)api;
#define EL_ORT_LOAD(ret, name, slot, since, params) o->name = (since) <= v ? (el_ort_##name##_fn)slots[slot] : NULL;
  EL_ORT_FUNCS(EL_ORT_LOAD)
#undef EL_ORT_LOAD
  return v;
}

#endif
