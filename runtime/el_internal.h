/* Shared between the libedgellm translation units; nothing here is exported. */
#ifndef EDGELLM_INTERNAL_H
#define EDGELLM_INTERNAL_H
#include <stdint.h>

#include "edgellm.h"
#include "tvm_abi.h"

#define EL_API __attribute__((visibility("default")))
#define EL_HIDDEN __attribute__((visibility("hidden")))

/* Sets the calling thread's el_last_error() text (printf format; one line). Returns -1 for `return el_error(...)`. */
EL_HIDDEN int el_error(const char* fmt, ...) __attribute__((format(printf, 1, 2)));

#include "threadpool.h"

#endif
