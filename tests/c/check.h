/* The C unit tests' check: on failure, the place and a message to stderr, and exit 1. */
#ifndef EL_TEST_CHECK_H
#define EL_TEST_CHECK_H
#include <stdio.h>
#include <stdlib.h>

#define CHECK(c, ...)                                      \
  do {                                                     \
    if (!(c)) {                                            \
      fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__); \
      fprintf(stderr, __VA_ARGS__);                        \
      fputc('\n', stderr);                                 \
      exit(1);                                             \
    }                                                      \
  } while (0)
#endif
