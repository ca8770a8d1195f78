#!/usr/bin/env bash
# Build libedgellm_jni.so for arm64-v8a with the NDK, outside Gradle (Gradle's externalNativeBuild runs the same
# CMakeLists.txt). Usage: ANDROID_NDK_HOME=/path/to/ndk scripts/build_native.sh [OUT_DIR]
# Output: OUT_DIR/arm64-v8a/libedgellm_jni.so (default OUT_DIR: edgellm/build/jniLibs), ready for src/main/jniLibs.
set -euo pipefail
: "${ANDROID_NDK_HOME:?set ANDROID_NDK_HOME to the NDK (r26 or later)}"
here="$(cd "$(dirname "$0")/.." && pwd)"
out="${1:-$here/edgellm/build/jniLibs}"
build="$(mktemp -d)"
trap 'rm -rf "$build"' EXIT
cmake -S "$here/edgellm/src/main/cpp" -B "$build" \
  -DCMAKE_TOOLCHAIN_FILE="$ANDROID_NDK_HOME/build/cmake/android.toolchain.cmake" \
  -DANDROID_ABI=arm64-v8a -DANDROID_PLATFORM=android-28 -DANDROID_STL=none -DCMAKE_BUILD_TYPE=Release
cmake --build "$build" -j "$(nproc 2>/dev/null || echo 4)"
mkdir -p "$out/arm64-v8a"
cp "$build/libedgellm_jni.so" "$out/arm64-v8a/"
echo "$out/arm64-v8a/libedgellm_jni.so"
