// The library: Kotlin API (ai.edgellm) + libedgellm_jni.so, which CMake builds from the JNI bridge and
// libedgellm's C sources (runtime/, offload/ of this repository) with the NDK.
plugins {
    id("com.android.library")
    id("org.jetbrains.kotlin.android")
}

android {
    namespace = "ai.edgellm"
    compileSdk = 34
    ndkVersion = "26.3.11579264"

    defaultConfig {
        minSdk = 28
        ndk { abiFilters += listOf("arm64-v8a") }   // the kernels edgellm compiles are aarch64
        externalNativeBuild { cmake { arguments += listOf("-DANDROID_STL=none") } }
        consumerProguardFiles("consumer-rules.pro")
    }
    externalNativeBuild {
        cmake {
            path = file("src/main/cpp/CMakeLists.txt")
            version = "3.22.1"
        }
    }
    compileOptions {
        sourceCompatibility = JavaVersion.VERSION_17
        targetCompatibility = JavaVersion.VERSION_17
    }
    kotlinOptions { jvmTarget = "17" }
}
