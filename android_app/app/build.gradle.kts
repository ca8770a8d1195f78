plugins {
    id("com.android.application")
    id("org.jetbrains.kotlin.android")
}

android {
    namespace = "ai.edgellm.chat"
    compileSdk = 34

    defaultConfig {
        applicationId = "ai.edgellm.chat"
        minSdk = 28            // Android 9: the oldest the NDK build of the runtime (API 28) and QNN/OpenCL phones need
        targetSdk = 34
        versionCode = 1
        versionName = "0.2.0"
        ndk { abiFilters += listOf("arm64-v8a") }
    }
    buildTypes {
        release {
            isMinifyEnabled = true
            proguardFiles(getDefaultProguardFile("proguard-android-optimize.txt"))
            // a local build is signed with the debug key; use your own signingConfig to publish
            signingConfig = signingConfigs.getByName("debug")
        }
    }
    packaging { jniLibs { useLegacyPackaging = true } }   // ONNX Runtime's QNN libraries are loaded from disk
    compileOptions {
        sourceCompatibility = JavaVersion.VERSION_17
        targetCompatibility = JavaVersion.VERSION_17
    }
    kotlinOptions { jvmTarget = "17" }
}

dependencies {
    implementation(project(":edgellm"))
    if (providers.gradleProperty("edgellm.npu").orNull == "true") {
        // libonnxruntime.so with the QNN EP + Qualcomm's HTP libraries, dlopened by libedgellm's NPU backend
        runtimeOnly("com.microsoft.onnxruntime:onnxruntime-android-qnn:1.22.0")
    }
}
