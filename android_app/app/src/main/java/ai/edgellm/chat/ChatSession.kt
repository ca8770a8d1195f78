package ai.edgellm.chat

import ai.edgellm.Context
import ai.edgellm.EdgeLLMException
import ai.edgellm.FinishReason
import ai.edgellm.GenerateResult
import ai.edgellm.Model
import java.io.File

/**
 * One loaded package and its conversation. Runs on the app's worker thread (every call but [cancel] blocks);
 * turns are appended to the KV cache (keepContext), so each reply costs only the new turn's prefill.
 */
class ChatSession(val pkg: File, settings: Settings) : AutoCloseable {
    // an OpenCL package carries its kernel table (kernels.cltab); only those take the saved GPU device
    val model: Model = Model.load(pkg.path, settings.loadOptions(gpuPackage = File(pkg, "kernels.cltab").isFile))
    private val context: Context = model.newContext(settings.threads)
    private val format = ChatFormat.of(pkg)
    private var turns = 0

    /** One line about the model: where it runs and how it holds its weights. */
    val description: String get() {
        val mem = model.memory
        val where = model.device?.let { "GPU: $it" }
            ?: (if (model.prefillBackend.name == "NPU") "NPU prefill + CPU decode" else "CPU") +
               (model.prefillNote?.let { " ($it)" } ?: "")
        return "${pkg.name} · $where · ${context.threads} threads · weights ${mib(mem[0])} MiB " +
               "(${mib(mem[1])} held) · context ${model.maxContext} tokens"
    }

    /** Sends a user message; onText gets the reply's text as it is generated. */
    fun send(user: String, settings: Settings, onText: (String) -> Unit): GenerateResult {
        // turn text carries the template's own special tokens (a BOS included): encode it without adding any,
        // as the Python Runtime's chat() does
        var ids = format.turn(user, settings.systemPrompt, turns == 0)?.let { model.encode(it, false) }
        if (ids == null || context.position + ids.size + settings.maxTokens > model.maxContext) {
            reset()   // the format cannot continue, or the conversation would overflow the context: start over
            ids = model.encode(format.turn(user, settings.systemPrompt, true)!!, false)
        }
        if (ids.isEmpty()) throw EdgeLLMException("the message tokenizes to no tokens")
        val r = context.generate(ids, settings.generateParams(keepContext = turns > 0, stop = format.stop, stopIds = format.stopIds)) { t ->
            if (t.text.isNotEmpty()) onText(t.text)
        }
        turns++
        if (r.finishReason == FinishReason.CANCELLED || r.finishReason == FinishReason.CONTEXT) {
            // the reply did not end the way the template expects: the next turn starts a new conversation
            reset()
        }
        return r
    }

    fun cancel() = context.cancel()

    fun reset() {
        context.reset()
        turns = 0
    }

    fun stats() = context.stats()

    override fun close() {
        context.close()
        model.close()
    }

    companion object {
        fun mib(b: Long) = (b + (1 shl 19)) shr 20
    }
}
