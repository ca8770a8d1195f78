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
    private val transcript = ArrayList<Pair<String, String>>()   // (message, reply) of the conversation the cache holds

    /** The conversation the cache holds: (user message, reply) per turn, oldest first. */
    val history: List<Pair<String, String>> get() = transcript.toList()

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
        transcript.add(user to r.text)
        if (r.finishReason == FinishReason.CANCELLED || r.finishReason == FinishReason.CONTEXT) {
            // the reply did not end the way the template expects: the next turn starts a new conversation
            reset()
        }
        return r
    }

    /**
     * Keeps the conversation in [dir] across app restarts: the context's state (KV cache, position, token ids:
     * Context.save, atomic) and the turns' text with the position they go with (written to a temporary file and
     * renamed after the state). [restore] takes them back only when both agree and the state is this package's.
     */
    fun save(dir: File) {
        if (!dir.isDirectory && !dir.mkdirs()) throw EdgeLLMException("cannot create $dir")
        val text = buildString {
            append(pkg.name).append('\t').append(context.position).append('\n')
            for ((u, r) in transcript) append(escape(u)).append('\t').append(escape(r)).append('\n')
        }
        val tmp = File(dir, "$TURNS.tmp")
        tmp.writeText(text)
        context.save(File(dir, STATE).path)
        if (!tmp.renameTo(File(dir, TURNS))) throw EdgeLLMException("cannot write ${File(dir, TURNS)}")
    }

    /** Continues the conversation [save] left in [dir]; false (a new conversation) when there is none, it is
     * another package's, or its files do not agree (a kill between the two writes, a damaged state). */
    fun restore(dir: File): Boolean {
        val turnsFile = File(dir, TURNS)
        val state = File(dir, STATE)
        if (!turnsFile.isFile || !state.isFile) return false
        val lines = turnsFile.readLines()
        val head = lines.firstOrNull()?.split('\t') ?: return false
        if (head.size != 2 || head[0] != pkg.name) return false
        val pairs = lines.drop(1).filter { it.isNotEmpty() }.map { it.split('\t') }
        if (pairs.any { it.size != 2 }) return false
        val held = try { context.load(state.path) } catch (e: EdgeLLMException) { reset(); return false }
        if (held.toString() != head[1] || pairs.isEmpty()) {
            reset()
            return false
        }
        transcript.clear()
        for (p in pairs) transcript.add(unescape(p[0]) to unescape(p[1]))
        turns = transcript.size
        return true
    }

    fun cancel() = context.cancel()

    fun reset() {
        context.reset()
        turns = 0
        transcript.clear()
    }

    fun stats() = context.stats()

    override fun close() {
        context.close()
        model.close()
    }

    companion object {
        const val STATE = "conversation.state"
        const val TURNS = "conversation.txt"
        fun mib(b: Long) = (b + (1 shl 19)) shr 20
        private fun escape(s: String) =
            s.replace("\\", "\\\\").replace("\n", "\\n").replace("\t", "\\t").replace("\r", "\\r")
        private fun unescape(s: String): String {
            val out = StringBuilder()
            var i = 0
            while (i < s.length) {
                val c = s[i]
                if (c == '\\' && i + 1 < s.length) {
                    out.append(when (s[i + 1]) { 'n' -> '\n'; 't' -> '\t'; 'r' -> '\r'; else -> s[i + 1] })
                    i += 2
                } else {
                    out.append(c)
                    i++
                }
            }
            return out.toString()
        }
    }
}
