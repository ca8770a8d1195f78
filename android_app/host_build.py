"""Build the Android app's JNI bridge and Kotlin library for this machine's JVM, to test them without a phone.

The bridge (edgellm/src/main/cpp/edgellm_jni.c) is compiled with libedgellm's C sources into one host
libedgellm_jni.so against the JDK's jni.h, exactly as the app's CMakeLists.txt does with the NDK; the library's
Kotlin sources (edgellm/src/main/java/ai/edgellm), the app's conversation logic (ChatFormat, ChatSession, Settings)
and the test driver (hosttest/JniCheck.kt) are compiled with kotlinc into a jar.
`python -m edgellm.android_app.host_build OUT_DIR` does both."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from ..compiler.device_binary import LIB_SOURCES, OFFLOAD, RUNTIME, _compile
from ..errors import CompileError

APP = Path(__file__).resolve().parent
JNI_SOURCE = Path("edgellm/src/main/cpp/edgellm_jni.c")
KOTLIN_LIBRARY = Path("edgellm/src/main/java/ai/edgellm")
HOST_DRIVER = Path("hosttest/JniCheck.kt")
# the app's conversation logic (no android.* imports) is tested on the host too; it reads chat_format.json with
# Android's org.json, which Debian packages for the JVM (libandroid-json-java)
APP_SOURCES = tuple(Path("app/src/main/java/ai/edgellm/chat") / f for f in ("ChatFormat.kt", "ChatSession.kt", "Settings.kt"))
ORG_JSON_JARS = (Path("/usr/share/java/com.android.json.jar"),)
DRIVER_MAIN = "ai.edgellm.hosttest.JniCheckKt"
JNI_LIBRARY = "libedgellm_jni.so"


def java_home() -> Path | None:
    """The JDK whose include/jni.h the bridge compiles against: JAVA_HOME, else the javac on PATH."""
    env = os.environ.get("JAVA_HOME")
    cands = [Path(env)] if env else []
    if javac := shutil.which("javac"):
        cands.append(Path(os.path.realpath(javac)).parent.parent)
    return next((c for c in cands if (c / "include" / "jni.h").is_file()), None)


def missing_tools() -> list[str]:
    """What this machine lacks to build and run the host bridge (empty: nothing)."""
    out = []
    if java_home() is None:
        out.append("a JDK (javac and include/jni.h: apt-get install openjdk-17-jdk-headless)")
    if not shutil.which("kotlinc"):
        out.append("kotlinc (apt-get install kotlin)")
    if not shutil.which("gcc"):
        out.append("gcc")
    if org_json_jar() is None:
        out.append("Android's org.json for the JVM (apt-get install libandroid-json-java)")
    return out


def org_json_jar() -> Path | None:
    return next((j for j in ORG_JSON_JARS if j.is_file()), None)


def build_jni_library(out_dir: Path, app_dir: Path = APP, cc: str = "gcc", link_flags: tuple[str, ...] = ()) -> Path:
    """libedgellm_jni.so: the bridge + libedgellm's sources, compiled with cc (objects cached like edgellm-run's)."""
    jdk = java_home()
    if jdk is None:
        raise CompileError("no JDK found (set JAVA_HOME or install openjdk-17-jdk-headless)")
    out_dir.mkdir(parents=True, exist_ok=True)
    flags = ["-std=c11", "-O2", "-fPIC", "-Wall", "-Wextra", "-Werror", f"-I{RUNTIME}", f"-I{OFFLOAD}",
             f"-I{jdk / 'include'}", f"-I{jdk / 'include' / 'linux'}"]
    sources = [app_dir / JNI_SOURCE, *LIB_SOURCES]
    with tempfile.TemporaryDirectory(prefix="edgellm-jni-") as tmp:
        with ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
            objs = [str(o) for o in pool.map(lambda s: _compile_in(cc, s, flags, Path(tmp)), sources)]
        out = out_dir / JNI_LIBRARY
        r = subprocess.run([cc, "-shared", *link_flags, "-o", str(out), *objs, "-lpthread", "-ldl", "-lm"],
                           capture_output=True, text=True)
    if r.returncode != 0:
        raise CompileError(f"linking {JNI_LIBRARY} failed: {(r.stderr.strip().splitlines() or ['?'])[-1]}")
    return out


def _compile_in(cc: str, src: Path, flags: list[str], tmp: Path) -> Path:
    work = tmp / src.stem   # one work dir per source: the cache publishes from it
    work.mkdir(exist_ok=True)
    return _compile([cc], src, flags, work)


def build_kotlin(out_dir: Path, app_dir: Path = APP) -> Path:
    """The Kotlin library + host driver as one jar with the Kotlin runtime in it."""
    if not shutil.which("kotlinc"):
        raise CompileError("kotlinc not found (apt-get install kotlin)")
    out_dir.mkdir(parents=True, exist_ok=True)
    jar = out_dir / "edgellm-hosttest.jar"
    srcs = sorted(str(p) for p in (app_dir / KOTLIN_LIBRARY).glob("*.kt")) + [str(app_dir / p) for p in APP_SOURCES] \
        + [str(app_dir / HOST_DRIVER)]
    cp = org_json_jar()
    if cp is None:
        raise CompileError("Android's org.json is missing (apt-get install libandroid-json-java)")
    r = subprocess.run(["kotlinc", "-cp", str(cp), *srcs, "-include-runtime", "-d", str(jar)],
                       capture_output=True, text=True)
    if r.returncode != 0 or not jar.is_file():
        errs = [ln for ln in r.stderr.splitlines() if "error:" in ln] or r.stderr.strip().splitlines()[-1:] or ["?"]
        raise CompileError(f"kotlinc failed: {errs[0]}")
    return jar


def driver_command(jar: Path, library: Path) -> list[str]:
    """The java command line that runs the host driver over the bridge."""
    return ["java", "-Xss4m", f"-Dedgellm.jni.library={library}", "-cp", f"{jar}:{org_json_jar()}", DRIVER_MAIN]


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m edgellm.android_app.host_build OUT_DIR", file=sys.stderr)
        return 2
    if miss := missing_tools():
        print("edgellm: missing " + "; ".join(miss), file=sys.stderr)
        return 1
    out = Path(argv[0])
    lib, jar = build_jni_library(out), build_kotlin(out)
    print(f"{lib}\n{jar}\nrun: {' '.join(driver_command(jar, lib))} PACKAGE_DIR")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
