/* pow() with a fast path for 2^k, preloaded into the test session's processes (tests/conftest.py).
 *
 * The HTP emulator of onnxruntime-qnn (libQnnHtp.so) calls libm's pow(2, k) with whole k about 10^8 times per prefill
 * chunk of the demo model: 57% of the NPU tests' emulator time went to it. 2^k for whole k in [-1022, 1023] is a
 * normal double, exact, so libm returns exactly these bits (and raises no flag); every other argument goes to libm.
 * The emulator's outputs are bitwise the same (tests/test_npu.py checks its logits against the CPU's either way). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdint.h>
#include <string.h>

static double (*libm_pow)(double, double);

double pow(double x, double y) {
  if (x == 2.0 && y >= -1022.0 && y <= 1023.0) {
    int k = (int)y;
    if ((double)k == y) {
      uint64_t bits = (uint64_t)(k + 1023) << 52;
      double r;
      memcpy(&r, &bits, sizeof r);
      return r;
    }
  }
  if (!libm_pow) libm_pow = (double (*)(double, double))dlsym(RTLD_NEXT, "pow");
  return libm_pow(x, y);
}
