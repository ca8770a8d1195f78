"""Assemble as much of the app's APK as Debian's Android packages allow, to check it without the SDK and NDK.

What is built here, with the tools a real build uses for the same step:
  manifest   the app's AndroidManifest.xml merged with the library's (as the Gradle manifest merger does: package,
             uses-sdk from app/build.gradle.kts, the library's <application> entries) and compiled by aapt
  resources  layouts, strings, drawables compiled by aapt against Android's framework-res.apk (android-framework-res)
  native lib lib/arm64-v8a/libedgellm_jni.so: the JNI bridge + libedgellm cross-compiled for aarch64
  signature  zipalign, then apksigner sign (a throwaway key) and apksigner verify
What is missing, so the APK is a layout check and not an installable app:
  classes.dex  Debian bookworm has no android.jar (android-sdk-platform-*) to compile the Kotlin against and no
               dexer (d8 / dx): the Kotlin sources are compiled for a JVM instead (host_build.py) and tested there
  bionic       the .so is linked by aarch64-linux-gnu-gcc against glibc; a phone needs the NDK's build (CMakeLists.txt)
"""
from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path

from ..errors import CompileError
from .host_build import APP, build_jni_library, java_home

ANDROID_NS = "http://schemas.android.com/apk/res/android"
FRAMEWORK_RES = Path("/usr/share/android-framework-res/framework-res.apk")
CROSS_CC = "aarch64-linux-gnu-gcc"
TOOLS = ("aapt", "zipalign", "apksigner", "keytool", CROSS_CC)


def missing_tools() -> list[str]:
    out = [t for t in TOOLS if not shutil.which(t)]
    if not FRAMEWORK_RES.is_file():
        out.append(str(FRAMEWORK_RES))
    if java_home() is None:
        out.append("a JDK (jni.h)")
    return out


def gradle_values(app_dir: Path = APP) -> dict[str, str]:
    """applicationId, minSdk, targetSdk, versionCode, versionName from app/build.gradle.kts."""
    text = (app_dir / "app" / "build.gradle.kts").read_text()
    out = {}
    for key in ("applicationId", "minSdk", "targetSdk", "versionCode", "versionName"):
        m = re.search(rf"\b{key}\s*=\s*\"?([\w.]+)\"?", text)
        if m:
            out[key] = m.group(1)
    return out


def merged_manifest(app_dir: Path = APP) -> str:
    """The app manifest with what the Gradle merger adds for this project: package, uses-sdk, versions, and the
    library's <application> children."""
    ET.register_namespace("android", ANDROID_NS)
    g = gradle_values(app_dir)
    app = ET.parse(app_dir / "app" / "src" / "main" / "AndroidManifest.xml").getroot()
    lib = ET.parse(app_dir / "edgellm" / "src" / "main" / "AndroidManifest.xml").getroot()
    app.set("package", g["applicationId"])
    app.set(f"{{{ANDROID_NS}}}versionCode", g["versionCode"])
    app.set(f"{{{ANDROID_NS}}}versionName", g["versionName"])
    sdk = ET.Element("uses-sdk", {f"{{{ANDROID_NS}}}minSdkVersion": g["minSdk"],
                                  f"{{{ANDROID_NS}}}targetSdkVersion": g["targetSdk"]})
    app.insert(0, sdk)
    application = app.find("application")
    for child in lib.find("application") or []:
        application.append(child)
    return ET.tostring(app, encoding="unicode")


def build_arm64_jni(out_dir: Path, app_dir: Path = APP) -> Path:
    """libedgellm_jni.so for aarch64 (glibc), from the same sources CMakeLists.txt names, 16 KiB-page aligned."""
    return build_jni_library(out_dir, app_dir, cc=CROSS_CC, link_flags=("-Wl,-z,max-page-size=16384",))


def _run(cmd: list[str], cwd: Path | None = None) -> str:
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=cwd)
    if r.returncode != 0:
        raise CompileError(f"{Path(cmd[0]).name} failed: {(r.stderr.strip() or r.stdout.strip()).splitlines()[-1:]}")
    return r.stdout


def assemble(out_dir: Path, app_dir: Path = APP) -> Path:
    """Builds out_dir/edgellm-chat-nodex.apk (manifest + resources + arm64 JNI library, signed). Raises CompileError
    naming the step that failed."""
    out_dir.mkdir(parents=True, exist_ok=True)
    apk = out_dir / "edgellm-chat-nodex.apk"
    with tempfile.TemporaryDirectory(prefix="edgellm-apk-") as t:
        tmp = Path(t)
        (tmp / "AndroidManifest.xml").write_text(merged_manifest(app_dir))
        raw = tmp / "raw.apk"
        _run(["aapt", "package", "-f", "-M", str(tmp / "AndroidManifest.xml"), "-S", str(app_dir / "app/src/main/res"),
              "-I", str(FRAMEWORK_RES), "-F", str(raw)])
        build_arm64_jni(tmp / "lib" / "arm64-v8a", app_dir)
        _run(["aapt", "add", str(raw), "lib/arm64-v8a/libedgellm_jni.so"], cwd=tmp)
        aligned = tmp / "aligned.apk"
        _run(["zipalign", "-f", "-p", "4", str(raw), str(aligned)])
        ks = tmp / "check.keystore"
        _run(["keytool", "-genkeypair", "-keystore", str(ks), "-storepass", "android", "-keypass", "android",
              "-alias", "check", "-keyalg", "RSA", "-keysize", "2048", "-validity", "1", "-dname", "CN=edgellm check"])
        _run(["apksigner", "sign", "--ks", str(ks), "--ks-pass", "pass:android", "--out", str(apk), str(aligned)])
    return apk


def verify(apk: Path) -> dict:
    """What the APK says about itself: aapt's badging, apksigner's verdict, the native library's ELF facts."""
    badging = _run(["aapt", "dump", "badging", str(apk)])
    signed = _run(["apksigner", "verify", "--verbose", str(apk)])
    files = _run(["aapt", "list", str(apk)]).split()
    with tempfile.TemporaryDirectory() as t:
        import zipfile

        with zipfile.ZipFile(apk) as z:
            so = Path(z.extract("lib/arm64-v8a/libedgellm_jni.so", t))
        header = _run(["readelf", "-h", str(so)])
        symbols = _run(["readelf", "--dyn-syms", "-W", str(so)])
    return {"badging": badging, "signature": signed, "files": files,
            "machine": re.search(r"Machine:\s*(.+)", header).group(1).strip(),
            "jni_symbols": sorted(set(re.findall(r"\b(Java_ai_edgellm_NativeBridge_\w+)", symbols)))}
