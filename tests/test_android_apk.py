"""The Android project as far as this machine can build it without the SDK and NDK: the library's CMakeLists.txt
builds (host compiler), the JNI exports match the Kotlin externals, every resource the Kotlin names exists, and an
APK of the merged manifest, the resources and the arm64 JNI library is assembled by aapt, signed and verified
(android_app/apk_check.py says what it lacks: classes.dex and a bionic build)."""
from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from edgellm.android_app import apk_check
from edgellm.compiler.device_binary import LIB_SOURCES

REPO = Path(__file__).resolve().parents[1]
APP = REPO / "android_app"
LIB_CPP = APP / "edgellm" / "src" / "main" / "cpp"
KOTLIN = [*APP.glob("edgellm/src/main/java/**/*.kt"), *APP.glob("app/src/main/java/**/*.kt")]


def _externals() -> set[str]:
    text = (APP / "edgellm/src/main/java/ai/edgellm/NativeBridge.kt").read_text()
    return {f"Java_ai_edgellm_NativeBridge_{n}" for n in re.findall(r"external fun (\w+)", text)}


def _exports(so: Path) -> set[str]:
    out = subprocess.run(["readelf", "--dyn-syms", "-W", str(so)], capture_output=True, text=True, check=True).stdout
    return set(re.findall(r"\b(Java_ai_edgellm_NativeBridge_\w+)", out))


def test_cmake_sources_are_libedgellm_sources():
    text = (LIB_CPP / "CMakeLists.txt").read_text()
    block = re.search(r"set\(LIBEDGELLM_SOURCES(.*?)\)", text, re.S).group(1)
    listed = {Path(p.replace("${RUNTIME}", "runtime").replace("${OFFLOAD}", "offload")).as_posix()
              for p in block.split()}
    from edgellm.compiler.device_binary import ROOT as SRC

    assert listed == {p.relative_to(SRC).as_posix() for p in LIB_SOURCES}


@pytest.mark.skipif(not shutil.which("cmake") or not shutil.which("gcc"), reason="no cmake (pip install cmake)")
def test_cmake_builds_the_library_and_exports_every_external(tmp_path):
    if apk_check.java_home() is None:
        pytest.skip("no JDK (jni.h)")
    env_jdk = {"JAVA_HOME": str(apk_check.java_home())}
    import os

    env = {**os.environ, **env_jdk}
    for cmd in (["cmake", "-S", str(LIB_CPP), "-B", str(tmp_path), "-DCMAKE_BUILD_TYPE=Release"],
                ["cmake", "--build", str(tmp_path), "-j", "2"]):
        r = subprocess.run(cmd, capture_output=True, text=True, env=env)
        assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
        assert "warning:" not in r.stdout + r.stderr
    assert _exports(tmp_path / "libedgellm_jni.so") == _externals()


def test_kotlin_names_only_resources_that_exist():
    res = APP / "app" / "src" / "main" / "res"
    have = {("layout", p.stem) for p in res.glob("layout/*.xml")} | {("drawable", p.stem) for p in res.glob("drawable/*.xml")}
    for f in res.glob("values/*.xml"):
        text = f.read_text()
        have |= {("string", n) for n in re.findall(r'<string name="(\w+)"', text)}
        have |= {("array", n) for n in re.findall(r'<string-array name="(\w+)"', text)}
        have |= {("color", n) for n in re.findall(r'<color name="(\w+)"', text)}
    for f in res.glob("layout/*.xml"):
        have |= {("id", n) for n in re.findall(r'@\+id/(\w+)', f.read_text())}
    used = set()
    for f in KOTLIN:
        used |= set(re.findall(r"(?<!android\.)\bR\.(layout|id|string|drawable|array|color)\.(\w+)", f.read_text()))
    assert used and used <= have, sorted(used - have)


needs_tools = pytest.mark.skipif(bool(apk_check.missing_tools()),
                                 reason=f"missing {', '.join(apk_check.missing_tools())} (apt-get install aapt apksigner "
                                        "zipalign android-framework-res gcc-aarch64-linux-gnu)")


@needs_tools
def test_apk_assembles_signs_and_verifies(tmp_path):
    apk = apk_check.assemble(tmp_path, APP)
    v = apk_check.verify(apk)
    b = v["badging"]
    g = apk_check.gradle_values(APP)
    assert f"package: name='{g['applicationId']}'" in b and f"versionName='{g['versionName']}'" in b
    assert f"sdkVersion:'{g['minSdk']}'" in b and f"targetSdkVersion:'{g['targetSdk']}'" in b
    assert "launchable-activity: name='ai.edgellm.chat.MainActivity'" in b
    assert "native-code: 'arm64-v8a'" in b
    assert "uses-permission: name='android.permission.INTERNET'" in b
    assert "application-label:'edgellm chat'" in b
    assert v["signature"].splitlines()[0] == "Verifies"
    assert {"res/layout/activity_main.xml", "res/layout/settings.xml", "res/layout/message.xml", "resources.arsc",
            "lib/arm64-v8a/libedgellm_jni.so"} <= set(v["files"])
    assert "classes.dex" not in v["files"]   # what this machine cannot make (see apk_check.py)
    assert v["machine"] == "AArch64"
    assert set(v["jni_symbols"]) == _externals()
    # the library's manifest entries were merged in: the GPU's OpenCL library is asked for
    tree = subprocess.run(["aapt", "dump", "xmltree", str(apk), "AndroidManifest.xml"], capture_output=True, text=True,
                          check=True).stdout
    assert "libOpenCL.so" in tree


@needs_tools
def test_a_broken_resource_fails_the_apk(tmp_path):
    # aapt really checks the resources: a layout naming a string that does not exist is refused with one line
    app = tmp_path / "app_copy"
    shutil.copytree(APP / "app", app / "app")
    shutil.copytree(APP / "edgellm" / "src" / "main", app / "edgellm" / "src" / "main",
                    ignore=shutil.ignore_patterns("*.c", "*.kt", "CMakeLists.txt"))
    shutil.copytree(APP / "edgellm" / "src" / "main" / "cpp", app / "edgellm" / "src" / "main" / "cpp", dirs_exist_ok=True)
    lay = app / "app" / "src" / "main" / "res" / "layout" / "message.xml"
    lay.write_text(lay.read_text().replace('android:textSize="15sp"', 'android:text="@string/no_such_string"'))
    from edgellm.errors import CompileError

    with pytest.raises(CompileError, match="aapt failed"):
        apk_check.assemble(tmp_path / "out", app)
