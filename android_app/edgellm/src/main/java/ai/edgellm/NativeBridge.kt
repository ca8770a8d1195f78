package ai.edgellm

/** The JNI functions of libedgellm_jni.so (src/main/cpp/edgellm_jni.c). Text crosses as UTF-8 byte arrays. */
internal object NativeBridge {
    init {
        // Android: the APK's lib/<abi>/libedgellm_jni.so. A host JVM (tests) may name the file instead.
        val path = System.getProperty("edgellm.jni.library")
        if (path != null) System.load(path) else System.loadLibrary("edgellm_jni")
    }

    @JvmStatic external fun version(): ByteArray

    @JvmStatic external fun modelLoad(path: ByteArray, threads: Int, budget: ByteArray?, policy: ByteArray?, prefill: Int,
                                      device: ByteArray?, digest: ByteArray?): Long
    @JvmStatic external fun modelFree(model: Long)
    @JvmStatic external fun modelInfo(model: Long): IntArray
    @JvmStatic external fun modelMemory(model: Long): LongArray
    @JvmStatic external fun modelDevice(model: Long): ByteArray
    @JvmStatic external fun prefillNote(model: Long): ByteArray
    @JvmStatic external fun eosIds(model: Long): IntArray
    @JvmStatic external fun encode(model: Long, text: ByteArray, addSpecial: Int): IntArray
    @JvmStatic external fun tokenText(model: Long, id: Int): ByteArray

    @JvmStatic external fun contextNew(model: Long, threads: Int): Long
    @JvmStatic external fun contextFree(context: Long)
    @JvmStatic external fun contextPos(context: Long): Int
    @JvmStatic external fun contextThreads(context: Long): Int
    @JvmStatic external fun contextReset(context: Long)
    @JvmStatic external fun contextSave(context: Long, path: ByteArray)
    @JvmStatic external fun contextLoad(context: Long, path: ByteArray): Int
    @JvmStatic external fun contextTokens(context: Long): IntArray
    @JvmStatic external fun cancel(context: Long)
    @JvmStatic external fun statsCounts(context: Long): LongArray
    @JvmStatic external fun statsTimes(context: Long): DoubleArray
    @JvmStatic external fun generate(context: Long, prompt: IntArray, fparams: FloatArray, iparams: IntArray, seed: Long,
                                     stopIds: IntArray?, stopStrings: Array<ByteArray>?, listener: TokenListener?,
                                     draft: Long, constraint: Long): DoubleArray
    @JvmStatic external fun draftCheck(model: Long, draft: Long)
    @JvmStatic external fun constraintLoad(path: ByteArray): Long
    @JvmStatic external fun constraintFree(constraint: Long)
}

/** Called on the generating thread for each event: a new token (id >= 0) and the text safe to show with it, or
 * (id -1) the last of the text. Return false to stop. */
interface TokenListener {
    fun onToken(id: Int, text: ByteArray): Boolean
}

internal fun String.utf8(): ByteArray = toByteArray(Charsets.UTF_8)
internal fun ByteArray.utf8(): String = String(this, Charsets.UTF_8)
