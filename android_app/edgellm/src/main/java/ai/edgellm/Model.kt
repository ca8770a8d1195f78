package ai.edgellm

import java.io.File

/**
 * A loaded edgellm package (plan, kernels, weights, tokenizer): read-only and shared by its contexts. Closing it
 * frees it once its last context is closed too.
 */
class Model private constructor(handle: Long, val path: String) : AutoCloseable {
    @Volatile private var handle: Long = handle

    companion object {
        /** Loads the package directory [path]; throws [EdgeLLMException] with a one-line reason. */
        @JvmStatic @JvmOverloads
        fun load(path: String, options: LoadOptions = LoadOptions()): Model {
            if (!File(path).isDirectory) throw EdgeLLMException("$path is not a package directory (edgellm compile writes one)")
            val h = NativeBridge.modelLoad(path.utf8(), options.threads, options.memoryBudget?.utf8(), options.weightPolicy?.utf8(),
                                           options.prefill.code, options.device?.utf8(), options.digest?.utf8())
            return Model(h, path)
        }

        /** libedgellm's version. */
        @JvmStatic val version: String get() = NativeBridge.version().utf8()
    }

    private val info: IntArray by lazy { NativeBridge.modelInfo(live()) }
    val vocabSize: Int get() = info[0]
    val maxContext: Int get() = info[1]
    val prefillChunk: Int get() = info[2]
    val threads: Int get() = info[3]
    val prefillBackend: PrefillBackend get() = if (info[4] == PrefillBackend.NPU.code) PrefillBackend.NPU else PrefillBackend.CPU
    val bosId: Int get() = info[5]
    val hasTokenizer: Boolean get() = info[6] != 0
    val eosIds: IntArray get() = NativeBridge.eosIds(live())
    /** The OpenCL device of GPU packages; null on the CPU. */
    val device: String? get() = NativeBridge.modelDevice(live()).utf8().ifEmpty { null }
    /** Why the NPU did not open when [PrefillBackend.AUTO] fell back to the CPU; null otherwise. */
    val prefillNote: String? get() = NativeBridge.prefillNote(live()).utf8().ifEmpty { null }
    /** [weights, held in memory, streamed per token, one context, budget] in bytes. */
    val memory: LongArray get() = NativeBridge.modelMemory(live())

    /** Token ids of [text] through the package's tokenizer; [addSpecial]: the special tokens its post-processor adds
     * (Hugging Face's add_special_tokens=True, e.g. a BOS), as the Python Runtime does. */
    @JvmOverloads
    fun encode(text: String, addSpecial: Boolean = true): IntArray = encode(live(), text, addSpecial)

    fun tokenText(id: Int): String = NativeBridge.tokenText(live(), id).utf8()

    /** A new conversation (KV cache, arena, sampler); [threads] 0: the model's. */
    @JvmOverloads
    fun newContext(threads: Int = 0): Context {
        val h = live()
        return Context(this, h, NativeBridge.contextNew(h, threads))
    }

    internal fun live(): Long {
        val h = handle
        if (h == 0L) throw EdgeLLMException("the model is closed")
        return h
    }

    @Synchronized override fun close() {
        val h = handle
        handle = 0
        if (h != 0L) NativeBridge.modelFree(h)
    }
}

// el_encode's add_special: -1 the tokenizer's own default (HF add_special_tokens=True), 0 none
internal fun encode(model: Long, text: String, addSpecial: Boolean): IntArray =
    NativeBridge.encode(model, text.utf8(), if (addSpecial) -1 else 0)
