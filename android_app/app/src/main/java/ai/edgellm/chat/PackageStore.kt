package ai.edgellm.chat

import android.content.Context
import java.io.File
import java.io.IOException
import java.net.HttpURLConnection
import java.net.URL
import java.util.zip.ZipInputStream

/**
 * Where packages live. The app loads them from its internal storage (filesDir/models): the package's kernels.so is
 * dlopened, and shared storage (/sdcard, where `adb push` can write) is mounted noexec. Import copies packages
 * pushed to the app's external files dir (`adb push PKG /sdcard/Android/data/ai.edgellm.chat/files/models/`)
 * inside; Download fetches a zip of a package. Both write into a staging directory renamed into place at the end,
 * so a failed or interrupted copy leaves nothing half-written, and neither ever deletes the user's source files.
 */
class PackageStore(private val context: Context) {
    val internal: File = File(context.filesDir, "models").apply { mkdirs() }
    val pushDir: File? = context.getExternalFilesDir(null)?.let { File(it, "models") }?.apply { mkdirs() }

    /** Package directories (they hold plan.bin) ready to load, by name. */
    fun installed(): List<File> = (internal.listFiles() ?: emptyArray())
        .filter { File(it, "plan.bin").isFile && !it.name.startsWith(".") }
        .sortedBy { it.name }

    /** Packages pushed to [pushDir] that are not imported yet. */
    fun importable(): List<File> = (pushDir?.listFiles() ?: emptyArray())
        .filter { File(it, "plan.bin").isFile && !File(internal, it.name).exists() }

    /** Copies a pushed package inside; progress(bytes done, bytes in all). */
    fun importPackage(src: File, progress: (Long, Long) -> Unit): File {
        val files = src.walkTopDown().filter { it.isFile }.toList()
        val total = files.sumOf { it.length() }
        var done = 0L
        return staged(src.name) { dst ->
            for (f in files) {
                val out = File(dst, f.relativeTo(src).path)
                out.parentFile?.mkdirs()
                f.inputStream().use { input -> out.outputStream().use { o ->
                    val buf = ByteArray(1 shl 20)
                    while (true) {
                        val n = input.read(buf)
                        if (n < 0) break
                        o.write(buf, 0, n)
                        done += n
                        progress(done, total)
                    }
                } }
            }
        }
    }

    /** Downloads a zip of a package directory (its files at the top level or in one folder) and installs it. */
    fun download(url: String, progress: (Long, Long) -> Unit): File {
        val name = url.substringAfterLast('/').substringBefore('?').removeSuffix(".zip").ifBlank { "package" }
        val conn = URL(url).openConnection() as HttpURLConnection
        conn.connectTimeout = 15000
        conn.readTimeout = 60000
        try {
            if (conn.responseCode != 200) throw IOException("$url: HTTP ${conn.responseCode}")
            val total = conn.contentLengthLong
            var done = 0L
            return staged(name) { dst ->
                ZipInputStream(conn.inputStream.buffered()).use { zip ->
                    val root = dst.canonicalFile
                    while (true) {
                        val e = zip.nextEntry ?: break
                        val out = File(dst, e.name).canonicalFile
                        if (!out.path.startsWith(root.path + File.separator)) throw IOException("${e.name}: a path outside the package")
                        if (e.isDirectory) { out.mkdirs(); continue }
                        out.parentFile?.mkdirs()
                        out.outputStream().use { o ->
                            val buf = ByteArray(1 shl 20)
                            while (true) {
                                val n = zip.read(buf)
                                if (n < 0) break
                                o.write(buf, 0, n)
                                done += n
                                progress(done, total)
                            }
                        }
                    }
                }
                // a zip of the folder itself: lift its contents up one level
                val inner = dst.listFiles()?.singleOrNull()
                if (inner != null && inner.isDirectory && !File(dst, "plan.bin").exists()) {
                    inner.listFiles()?.forEach { it.renameTo(File(dst, it.name)) }
                    inner.delete()
                }
                if (!File(dst, "plan.bin").isFile) throw IOException("$url is not a zip of an edgellm package (no plan.bin)")
            }
        } finally {
            conn.disconnect()
        }
    }

    private fun staged(name: String, fill: (File) -> Unit): File {
        val dst = File(internal, name)
        if (dst.exists()) throw IOException("a package named $name is already installed")
        val tmp = File(internal, ".staging-$name")
        tmp.deleteRecursively()   // our own leftover from an interrupted import, never a user file
        tmp.mkdirs()
        try {
            fill(tmp)
            if (!tmp.renameTo(dst)) throw IOException("cannot move $name into place")
        } catch (e: Exception) {
            tmp.deleteRecursively()
            throw e
        }
        return dst
    }
}
