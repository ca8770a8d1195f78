/* The slice of the OpenCL 1.2 C API that backend_opencl.c uses, declared here (edgellm's own declarations, from
 * the Khronos specification's types and enum values) so that libedgellm builds without OpenCL headers and dlopens
 * whichever ICD loader the device has (libOpenCL.so). */
#ifndef EDGELLM_OPENCL_API_H
#define EDGELLM_OPENCL_API_H
#include <stddef.h>
#include <stdint.h>

typedef int32_t cl_int;
typedef uint32_t cl_uint;
typedef uint64_t cl_ulong;
typedef cl_uint cl_bool;
typedef cl_ulong cl_bitfield;
typedef cl_bitfield cl_device_type;
typedef cl_bitfield cl_mem_flags;
typedef cl_bitfield cl_command_queue_properties;
typedef cl_uint cl_platform_info;
typedef cl_uint cl_device_info;
typedef cl_uint cl_program_info;
typedef cl_uint cl_program_build_info;
typedef cl_uint cl_profiling_info;
typedef intptr_t cl_context_properties;
typedef struct _cl_platform_id* cl_platform_id;
typedef struct _cl_device_id* cl_device_id;
typedef struct _cl_context* cl_context;
typedef struct _cl_command_queue* cl_command_queue;
typedef struct _cl_mem* cl_mem;
typedef struct _cl_program* cl_program;
typedef struct _cl_kernel* cl_kernel;
typedef struct _cl_event* cl_event;

#define CL_SUCCESS 0
#define CL_DEVICE_NOT_FOUND (-1)
#define CL_PLATFORM_NOT_FOUND_KHR (-1001)
#define CL_TRUE 1
#define CL_FALSE 0
#define CL_DEVICE_TYPE_GPU (1 << 2)
#define CL_DEVICE_TYPE_ALL 0xFFFFFFFF
#define CL_PLATFORM_NAME 0x0902
#define CL_PLATFORM_VERSION 0x0901
#define CL_DEVICE_TYPE 0x1000
#define CL_DEVICE_MAX_WORK_GROUP_SIZE 0x1004
#define CL_DEVICE_GLOBAL_MEM_SIZE 0x101F
#define CL_DEVICE_MAX_MEM_ALLOC_SIZE 0x1010
#define CL_DEVICE_HOST_UNIFIED_MEMORY 0x1035
#define CL_DEVICE_NAME 0x102B
#define CL_DEVICE_VERSION 0x102F
#define CL_DRIVER_VERSION 0x102D
#define CL_DEVICE_EXTENSIONS 0x1030
#define CL_MEM_READ_WRITE (1 << 0)
#define CL_MEM_READ_ONLY (1 << 2)
#define CL_MEM_USE_HOST_PTR (1 << 3)
#define CL_MEM_COPY_HOST_PTR (1 << 5)
#define CL_QUEUE_PROFILING_ENABLE (1 << 1)
#define CL_PROGRAM_BINARY_SIZES 0x1165
#define CL_PROGRAM_BINARIES 0x1166
#define CL_PROGRAM_BUILD_LOG 0x1183
#define CL_PROFILING_COMMAND_START 0x1282
#define CL_PROFILING_COMMAND_END 0x1283

/* Every entry point, as one X-macro list: name, return type, parameters. */
#define EL_CL_FUNCTIONS(X)                                                                                       \
  X(clGetPlatformIDs, cl_int, (cl_uint, cl_platform_id*, cl_uint*))                                             \
  X(clGetPlatformInfo, cl_int, (cl_platform_id, cl_platform_info, size_t, void*, size_t*))                      \
  X(clGetDeviceIDs, cl_int, (cl_platform_id, cl_device_type, cl_uint, cl_device_id*, cl_uint*))                 \
  X(clGetDeviceInfo, cl_int, (cl_device_id, cl_device_info, size_t, void*, size_t*))                            \
  X(clCreateContext, cl_context,                                                                                \
    (const cl_context_properties*, cl_uint, const cl_device_id*,                                                \
     void (*)(const char*, const void*, size_t, void*), void*, cl_int*))                                        \
  X(clReleaseContext, cl_int, (cl_context))                                                                     \
  X(clCreateCommandQueue, cl_command_queue, (cl_context, cl_device_id, cl_command_queue_properties, cl_int*))   \
  X(clReleaseCommandQueue, cl_int, (cl_command_queue))                                                          \
  X(clCreateBuffer, cl_mem, (cl_context, cl_mem_flags, size_t, void*, cl_int*))                                 \
  X(clReleaseMemObject, cl_int, (cl_mem))                                                                       \
  X(clCreateProgramWithSource, cl_program, (cl_context, cl_uint, const char**, const size_t*, cl_int*))         \
  X(clCreateProgramWithBinary, cl_program,                                                                      \
    (cl_context, cl_uint, const cl_device_id*, const size_t*, const unsigned char**, cl_int*, cl_int*))         \
  X(clBuildProgram, cl_int,                                                                                     \
    (cl_program, cl_uint, const cl_device_id*, const char*, void (*)(cl_program, void*), void*))               \
  X(clGetProgramInfo, cl_int, (cl_program, cl_program_info, size_t, void*, size_t*))                            \
  X(clGetProgramBuildInfo, cl_int, (cl_program, cl_device_id, cl_program_build_info, size_t, void*, size_t*))   \
  X(clReleaseProgram, cl_int, (cl_program))                                                                     \
  X(clCreateKernel, cl_kernel, (cl_program, const char*, cl_int*))                                              \
  X(clReleaseKernel, cl_int, (cl_kernel))                                                                       \
  X(clSetKernelArg, cl_int, (cl_kernel, cl_uint, size_t, const void*))                                          \
  X(clEnqueueNDRangeKernel, cl_int,                                                                             \
    (cl_command_queue, cl_kernel, cl_uint, const size_t*, const size_t*, const size_t*, cl_uint,                \
     const cl_event*, cl_event*))                                                                               \
  X(clEnqueueWriteBuffer, cl_int,                                                                               \
    (cl_command_queue, cl_mem, cl_bool, size_t, size_t, const void*, cl_uint, const cl_event*, cl_event*))      \
  X(clEnqueueReadBuffer, cl_int,                                                                                \
    (cl_command_queue, cl_mem, cl_bool, size_t, size_t, void*, cl_uint, const cl_event*, cl_event*))            \
  X(clEnqueueCopyBuffer, cl_int,                                                                                \
    (cl_command_queue, cl_mem, cl_mem, size_t, size_t, size_t, cl_uint, const cl_event*, cl_event*))            \
  X(clFinish, cl_int, (cl_command_queue))                                                                       \
  X(clWaitForEvents, cl_int, (cl_uint, const cl_event*))                                                        \
  X(clGetEventProfilingInfo, cl_int, (cl_event, cl_profiling_info, size_t, void*, size_t*))                     \
  X(clReleaseEvent, cl_int, (cl_event))

#endif
