// edgellm Android app: `app` (the chat UI) over `edgellm` (the Kotlin API + JNI bridge to libedgellm).
pluginManagement {
    repositories {
        google()
        mavenCentral()
        gradlePluginPortal()
    }
}
dependencyResolutionManagement {
    repositoriesMode.set(RepositoriesMode.FAIL_ON_PROJECT_REPOS)
    repositories {
        google()
        mavenCentral()
    }
}
rootProject.name = "edgellm-android"
include(":app", ":edgellm")
