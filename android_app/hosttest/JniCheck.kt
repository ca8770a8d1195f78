// Drives the Kotlin API (ai.edgellm) and its JNI bridge on a host JVM for tests/test_android_app.py.
// Reads one command per line from stdin (tab-separated), prints one or more tab-separated lines per command; text
// goes out as hex of its UTF-8 bytes so that any character survives.
package ai.edgellm.hosttest

import ai.edgellm.Constraint
import ai.edgellm.EdgeLLMException
import ai.edgellm.GenerateParams
import ai.edgellm.LoadOptions
import ai.edgellm.Model
import ai.edgellm.chat.ChatSession
import ai.edgellm.chat.Settings
import java.io.File
import java.util.concurrent.CountDownLatch
import java.util.concurrent.atomic.AtomicInteger

// kotlinc 1.3 (Debian's) cannot resolve stdlib's AutoCloseable.use against JDK 17; this is the same thing
inline fun <T : AutoCloseable, R> T.closing(block: (T) -> R): R = try { block(this) } finally { close() }

fun hex(s: String): String = s.toByteArray(Charsets.UTF_8).joinToString("") { String.format("%02x", it) }

fun rssKb(): Long = File("/proc/self/status").readLines().first { it.startsWith("VmRSS:") }
    .split(Regex("\\s+"))[1].toLong()

fun params(f: List<String>): GenerateParams {
    // max, temperature, seed, topK, topP, repetitionPenalty, stop ("-": the default)
    fun opt(i: Int) = f.getOrNull(i)?.takeIf { it != "-" }
    return GenerateParams(maxNewTokens = opt(0)?.toInt(), temperature = opt(1)?.toFloat(), seed = opt(2)?.toLong(),
                          topK = opt(3)?.toInt(), topP = opt(4)?.toFloat(), repetitionPenalty = opt(5)?.toFloat(),
                          stop = opt(6)?.let { listOf(it) } ?: emptyList())
}

fun main(args: Array<String>) {
    val pkg = args[0]
    val model = Model.load(pkg, LoadOptions(threads = 1))
    val ctx = model.newContext()
    println("READY\t${Model.version}\t${model.vocabSize}\t${model.maxContext}\t${model.prefillBackend}")
    while (true) {
        val line = readLine() ?: break
        val f = line.split("\t")
        try {
            when (f[0]) {
                "gen" -> {   // gen PROMPT max temperature seed topK topP rep stop
                    val r = ctx.generate(f[1], params(f.drop(2))) { t -> println("EVENT\t${t.id}\t${hex(t.text)}") }
                    println("RESULT\t${r.tokens.joinToString(",")}\t${hex(r.text)}\t${r.finishReason}\t${r.promptTokens}\t" +
                            "${r.decodeSteps}\t${ctx.position}")
                }
                "spec" -> {   // spec PROMPT MAX MODE [DRAFT_MAX [DRAFT_PKG]]: greedy with speculate=MODE ("-": the
                              // default), and the spec counters it moved
                    val s0 = ctx.stats()
                    val draftPkg = f.getOrNull(5)?.takeIf { it != "-" }
                    val draftModel = draftPkg?.let { Model.load(it, LoadOptions(threads = 1)) }
                    val draftCtx = draftModel?.newContext()
                    val r = try {
                        ctx.generate(f[1], GenerateParams(maxNewTokens = f[2].toInt(), temperature = 0f, ignoreEos = true,
                                                          speculate = f[3].takeIf { it != "-" },
                                                          draftMax = f.getOrNull(4)?.takeIf { it != "-" }?.toInt(),
                                                          draft = draftCtx))
                    } finally {
                        draftCtx?.close()
                        draftModel?.close()
                    }
                    val s1 = ctx.stats()
                    println("SPEC\t${r.tokens.joinToString(",")}\t${s1.specPasses - s0.specPasses}\t" +
                            "${s1.specDrafted - s0.specDrafted}\t${s1.specAccepted - s0.specAccepted}")
                }
                "constrained" -> {   // constrained PROMPT MAX AUTOMATON TEMPERATURE SEED: the text an automaton
                                     // (`edgellm schema`) allowed, and why it ended
                    Constraint.load(f[3]).closing { c ->
                        val r = ctx.generate(f[1], GenerateParams(maxNewTokens = f[2].toInt(), temperature = f[4].toFloat(),
                                                                  seed = f[5].toLong(), constraint = c))
                        println("CONSTRAINED\t${r.tokens.joinToString(",")}\t${hex(r.text)}\t${r.finishReason}")
                    }
                }
                "budget" -> {   // budget SIZE: the bytes a load with that memory budget reports
                    Model.load(pkg, LoadOptions(threads = 1, memoryBudget = f[1])).closing { m -> println("BUDGET\t${m.memory[4]}") }
                }
                "info" -> {   // the model's and the context's facts
                    val st = ctx.stats()
                    println("INFO\t${model.vocabSize}\t${model.maxContext}\t${model.prefillChunk}\t${model.threads}\t" +
                            "${model.eosIds.joinToString(",")}\t${model.device ?: ""}\t${model.prefillNote ?: ""}\t" +
                            "${model.memory[0]}\t${ctx.threads}\t${st.kvBytes}\t${model.tokenText(model.eosIds[0]).length}")
                }
                "chat" -> {   // chat MAX USER1 USER2 ...: the app's ChatSession, greedy, one TURN line per message
                    val settings = Settings(temperature = 0f, maxTokens = f[1].toInt())
                    ChatSession(File(pkg), settings.copy(threads = 1)).closing { s ->
                        for (user in f.drop(2)) {
                            val r = s.send(user, settings) { }
                            println("TURN\t${r.tokens.joinToString(",")}\t${hex(r.text)}\t${r.finishReason}\t${r.promptTokens}")
                        }
                    }
                    println("CHAT")
                }
                "persist" -> {   // persist DIR MAX USER1 USER2: USER1 in one ChatSession, kept in DIR, then USER2 in a new
                                 // session that restores it; one TURN line per message, RESTORED with what it took
                    val settings = Settings(temperature = 0f, maxTokens = f[2].toInt())
                    val dir = File(f[1])
                    ChatSession(File(pkg), settings.copy(threads = 1)).closing { s ->
                        val r = s.send(f[3], settings) { }
                        println("TURN\t${r.tokens.joinToString(",")}\t${hex(r.text)}\t${r.finishReason}\t${r.promptTokens}")
                        s.save(dir)
                    }
                    ChatSession(File(pkg), settings.copy(threads = 1)).closing { s ->
                        val ok = s.restore(dir)
                        println("RESTORED\t$ok\t${s.history.size}\t${s.history.joinToString(",") { hex(it.first + "|" + it.second) }}")
                        val r = s.send(f[4], settings) { }
                        println("TURN\t${r.tokens.joinToString(",")}\t${hex(r.text)}\t${r.finishReason}\t${r.promptTokens}")
                    }
                    println("PERSIST")
                }
                "restore" -> {   // restore DIR: what a new ChatSession makes of DIR
                    ChatSession(File(pkg), Settings(threads = 1)).closing { s ->
                        println("RESTORED\t${s.restore(File(f[1]))}\t${s.history.size}")
                    }
                }
                "listener_throws" -> {   // the listener's exception reaches the caller; the context stays usable
                    try {
                        ctx.generate(f[1], GenerateParams(maxNewTokens = 8, temperature = 0f)) { t ->
                            if (t.id >= 0) throw IllegalStateException("boom")
                        }
                        println("NOTHROW")
                    } catch (e: IllegalStateException) {
                        val r = ctx.generate(f[1], GenerateParams(maxNewTokens = 8, temperature = 0f))
                        println("THREW\t${e.message}\t${r.tokens.joinToString(",")}")
                    }
                }
                "cancel_in_callback" -> {   // cancel_in_callback PROMPT K: the listener cancels after K tokens
                    val k = f[2].toInt()
                    var n = 0
                    val r = ctx.generate(f[1], GenerateParams(maxNewTokens = 64, temperature = 0f, ignoreEos = true)) { t ->
                        if (t.id >= 0 && ++n == k) ctx.cancel()
                    }
                    println("CANCEL\t$n\t${r.tokens.size}\t${r.finishReason}\t${r.decodeSteps}")
                }
                "cancel_from_thread" -> {   // cancel_from_thread PROMPT K: another thread cancels once K tokens arrived
                    val k = f[2].toInt()
                    val seen = AtomicInteger(0)
                    val after = AtomicInteger(-1)
                    val reached = CountDownLatch(1)
                    val canceller = Thread {
                        reached.await()
                        ctx.cancel()
                        after.set(seen.get())   // tokens handed on by the time cancel() returned
                    }
                    canceller.start()
                    val r = ctx.generate(f[1], GenerateParams(maxNewTokens = 200, temperature = 0f, ignoreEos = true)) { t ->
                        if (t.id >= 0 && seen.incrementAndGet() == k) {
                            reached.countDown()
                            Thread.sleep(50)   // let cancel() land while this generation is live
                        }
                    }
                    canceller.join()
                    println("CANCEL\t${after.get()}\t${r.tokens.size}\t${r.finishReason}\t${r.decodeSteps}")
                }
                "cycles" -> {   // cycles N: load, generate a few tokens, free; RSS after a warm-up and at the end
                    val n = f[1].toInt()
                    val warm = 10
                    var base = 0L
                    var perCycle = 0L   // bytes one cycle allocates: what a leak would add per cycle
                    for (c in 0 until n + warm) {
                        if (c == warm) { System.gc(); base = rssKb() }
                        Model.load(pkg, LoadOptions(threads = 1)).closing { m ->
                            m.newContext().closing { x ->
                                x.generate("Hello", GenerateParams(maxNewTokens = 4, temperature = 0f))
                                val s = x.stats()
                                perCycle = s.contextBytes + s.weightBytes
                            }
                        }
                    }
                    System.gc()
                    println("RSS\t$base\t${rssKb()}\t$perCycle")
                }
                "load" -> {   // load PATH: a package that should not load
                    try { Model.load(f[1]).close(); println("LOADED") } catch (e: EdgeLLMException) { println("ERROR\t${e.message}") }
                }
                "closed" -> {   // a closed context refuses generate with one line, and a second close is harmless
                    val m = Model.load(pkg)
                    val c = m.newContext()
                    c.close(); c.close(); m.close()
                    try { c.generate("Hi"); println("GENERATED") } catch (e: EdgeLLMException) { println("ERROR\t${e.message}") }
                }
                else -> println("UNKNOWN\t${f[0]}")
            }
        } catch (e: EdgeLLMException) {
            println("ERROR\t${e.message}")
        }
        System.out.flush()
    }
    ctx.close()
    model.close()
}
