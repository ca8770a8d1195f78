package ai.edgellm

/** GenerateParams.speculate's values, in the order of the C API's EL_SPECULATE_* codes. */
internal val SPECULATE = listOf("off", "auto", "ngram", "recycle")

/**
 * One conversation over a [Model]: KV cache, activation arena, position, sampler. One generation at a time;
 * [cancel] and [close] may be called from any thread. It keeps its model's native side alive: closing the [Model]
 * first is fine.
 */
class Context internal constructor(val model: Model, private val modelHandle: Long, handle: Long) : AutoCloseable {
    @Volatile private var handle: Long = handle
    internal val running = Any()   // held for the whole of a generation (its own, or one it drafts for): close() waits
    @Volatile private var checkedDraft: Context? = null   // the last draft context whose tokenizer matched

    /** Tokens in the KV cache. */
    val position: Int get() = NativeBridge.contextPos(live())
    val threads: Int get() = NativeBridge.contextThreads(live())

    /** Generates from [prompt] (text through the package's tokenizer), streaming each event to [onToken]. */
    @JvmOverloads
    fun generate(prompt: String, params: GenerateParams = GenerateParams(), onToken: (Token) -> Unit = {}): GenerateResult {
        if (prompt.isEmpty()) throw EdgeLLMException("empty prompt: give some text or token ids")
        val ids = synchronized(running) { live(); encode(modelHandle, prompt, true) }
        if (ids.isEmpty()) throw EdgeLLMException("the prompt tokenizes to no tokens: give some text")
        return generate(ids, params, onToken)
    }

    /** Generates from token ids used as they are. */
    @JvmOverloads
    fun generate(prompt: IntArray, params: GenerateParams = GenerateParams(), onToken: (Token) -> Unit = {}): GenerateResult {
        if (prompt.isEmpty()) throw EdgeLLMException("empty prompt: give some text or token ids")
        val tokens = ArrayList<Int>()
        val out = StringBuilder()
        val listener = object : TokenListener {
            override fun onToken(id: Int, text: ByteArray): Boolean {
                val piece = text.utf8()   // pieces never split a UTF-8 character
                if (id >= 0) tokens.add(id)
                out.append(piece)
                onToken(Token(id, piece))
                return true
            }
        }
        val nan = Float.NaN
        val f = floatArrayOf(params.temperature ?: nan, params.topP ?: nan, params.minP ?: nan,
                             params.repetitionPenalty ?: nan, params.presencePenalty ?: nan, params.frequencyPenalty ?: nan)
        val spec = when (params.speculate) {
            null -> -1
            else -> SPECULATE.indexOf(params.speculate).takeIf { it >= 0 } ?: throw EdgeLLMException(
                "speculate \"${params.speculate}\" is not one of ${SPECULATE.joinToString(", ")}")
        }
        val i = intArrayOf(params.maxNewTokens ?: -1, params.topK ?: -1, if (params.ignoreEos) 1 else 0,
                           if (params.keepContext) 1 else 0, if (params.seed != null) 1 else 0, spec,
                           params.draftMax ?: -1)
        for (s in params.stop) if (s.isEmpty()) throw EdgeLLMException("stop strings must be non-empty")
        val stops = if (params.stop.isEmpty()) null else params.stop.map { it.utf8() }.toTypedArray()
        val draft = params.draft
        if (draft === this) throw EdgeLLMException("the draft context is this context: give the draft model a context of its own")
        if (draft != null && checkedDraft !== draft) {   // the tokenizers compared once per draft context
            NativeBridge.draftCheck(model.live(), draft.model.live())
            checkedDraft = draft
        }
        val constraint = params.constraint?.live() ?: 0L
        val r = synchronized(running) {
            if (draft == null) NativeBridge.generate(live(), prompt, f, i, params.seed ?: 0L, params.stopIds, stops, listener, 0L,
                                                     constraint)
            else synchronized(draft.running) {   // the draft's context follows this generation: nothing else may run on it
                NativeBridge.generate(live(), prompt, f, i, params.seed ?: 0L, params.stopIds, stops, listener, draft.live(),
                                      constraint)
            }
        }
        return GenerateResult(tokens.toIntArray(), out.toString(), r[0].toInt(), FinishReason.of(r[2].toInt()),
                              r[3], r[4], r[5], r[6].toInt())
    }

    /** Stops the generation in progress at its next token (that token is not handed on); no-op when idle. */
    fun cancel() {
        val h = handle
        if (h != 0L) NativeBridge.cancel(h)
    }

    /** Forgets the conversation (position 0). */
    fun reset() = synchronized(running) { NativeBridge.contextReset(live()) }

    /** Saves the conversation (its KV cache, position and token ids) to [path], atomically: a killed app leaves the
     * old file or the new one. [load] in a context of the same package continues it without prefilling it again. */
    fun save(path: String) = synchronized(running) { NativeBridge.contextSave(live(), path.utf8()) }

    /** Replaces the conversation with one [save] wrote from this package; returns the tokens it holds. Another
     * package, a damaged or truncated file: [EdgeLLMException], and the context is left as it was or empty. */
    fun load(path: String): Int = synchronized(running) { NativeBridge.contextLoad(live(), path.utf8()) }

    /** The token ids the context holds, position 0 on. */
    fun tokens(): IntArray = synchronized(running) { NativeBridge.contextTokens(live()) }

    fun stats(): Stats {
        val c = NativeBridge.statsCounts(live())
        val t = NativeBridge.statsTimes(live())
        return Stats(c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7], t[0], t[1], t[2], c[8], c[9], c[10], c[11], c[12], c[13])
    }

    internal fun live(): Long {
        val h = handle
        if (h == 0L) throw EdgeLLMException("the context is closed")
        return h
    }

    /** Cancels a generation in progress, waits for it to end, then frees the context. */
    override fun close() {
        cancel()
        synchronized(running) {
            val h = handle
            handle = 0
            if (h != 0L) NativeBridge.contextFree(h)
        }
    }
}
