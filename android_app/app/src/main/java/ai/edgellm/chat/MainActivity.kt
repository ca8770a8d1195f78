package ai.edgellm.chat

import ai.edgellm.EdgeLLMException
import ai.edgellm.PrefillBackend
import android.app.Activity
import android.app.AlertDialog
import android.os.Bundle
import android.os.Handler
import android.os.Looper
import android.view.Gravity
import android.view.LayoutInflater
import android.view.Menu
import android.view.MenuItem
import android.view.View
import android.widget.ArrayAdapter
import android.widget.Button
import android.widget.EditText
import android.widget.LinearLayout
import android.widget.ScrollView
import android.widget.Spinner
import android.widget.TextView
import android.widget.Toast
import java.io.File
import java.util.concurrent.ExecutorService
import java.util.concurrent.Executors

/**
 * The chat screen: pick a package, load it, chat with streaming replies, stop a reply, see prefill/decode speed and
 * memory. Every libedgellm call runs on one worker thread; the UI thread only posts work and shows results.
 */
class MainActivity : Activity() {
    private val worker: ExecutorService = Executors.newSingleThreadExecutor()
    private val ui = Handler(Looper.getMainLooper())
    private lateinit var store: PackageStore
    private lateinit var settings: Settings
    @Volatile private var session: ChatSession? = null   // set on the worker thread; the UI thread only cancels
    @Volatile private var generating = false

    private lateinit var packages: Spinner
    private lateinit var status: TextView
    private lateinit var stats: TextView
    private lateinit var messages: LinearLayout
    private lateinit var scroll: ScrollView
    private lateinit var input: EditText
    private lateinit var send: Button

    override fun onCreate(state: Bundle?) {
        super.onCreate(state)
        setContentView(R.layout.activity_main)
        store = PackageStore(this)
        settings = SettingsStore.load(getPreferences(MODE_PRIVATE))
        packages = findViewById(R.id.packages)
        status = findViewById(R.id.status)
        stats = findViewById(R.id.stats)
        messages = findViewById(R.id.messages)
        scroll = findViewById(R.id.scroll)
        input = findViewById(R.id.input)
        send = findViewById(R.id.send)
        findViewById<Button>(R.id.load).setOnClickListener { loadSelected() }
        findViewById<Button>(R.id.settings).setOnClickListener { showSettings() }
        findViewById<Button>(R.id.new_chat).setOnClickListener { newChat() }
        send.setOnClickListener { if (generating) stop() else sendMessage() }
        refreshPackages()
    }

    /** The conversation is kept in the app's files across restarts (ChatSession.save / restore). */
    override fun onStop() {
        val s = session
        if (s != null && !generating) worker.execute { keep(s) }
        super.onStop()
    }

    private fun conversationDir(pkg: File) = File(filesDir, "conversations/${pkg.name}")

    private fun keep(s: ChatSession) {
        try {
            s.save(conversationDir(s.pkg))
        } catch (e: EdgeLLMException) {
            ui.post { toast("could not keep the conversation: ${e.message}") }
        }
    }

    override fun onDestroy() {
        session?.cancel()
        worker.execute { session?.close(); session = null }
        worker.shutdown()
        super.onDestroy()
    }

    override fun onCreateOptionsMenu(menu: Menu): Boolean {
        menu.add(0, MENU_IMPORT, 0, R.string.import_packages)
        menu.add(0, MENU_DOWNLOAD, 1, R.string.download)
        return true
    }

    override fun onOptionsItemSelected(item: MenuItem): Boolean = when (item.itemId) {
        MENU_IMPORT -> { importPushed(); true }
        MENU_DOWNLOAD -> { askDownload(); true }
        else -> super.onOptionsItemSelected(item)
    }

    // ---- packages -------------------------------------------------------------------------------------------------

    private fun refreshPackages() {
        val names = store.installed().map { it.name }
        packages.adapter = ArrayAdapter(this, android.R.layout.simple_spinner_item, names).also {
            it.setDropDownViewResource(android.R.layout.simple_spinner_dropdown_item)
        }
        if (names.isEmpty()) status.text = getString(R.string.no_packages, store.pushDir?.path ?: "the app's files dir")
    }

    private fun loadSelected() {
        val name = packages.selectedItem as? String ?: return refreshPackages()
        val pkg = File(store.internal, name)
        val s = settings
        status.text = getString(R.string.loading, name)
        send.isEnabled = false
        worker.execute {
            session?.close()
            session = null
            var turns = emptyList<Pair<String, String>>()
            val text = try {
                val loaded = ChatSession(pkg, s)
                session = loaded
                if (loaded.restore(conversationDir(pkg))) turns = loaded.history   // the last conversation goes on
                loaded.description
            } catch (e: EdgeLLMException) {
                "error: ${e.message}"
            }
            ui.post {
                status.text = text
                send.isEnabled = session != null
                messages.removeAllViews()
                for ((user, reply) in turns) {
                    addBubble(user, user = true)
                    addBubble(reply, user = false)
                }
            }
        }
    }

    private fun importPushed() {
        val todo = store.importable()
        if (todo.isEmpty()) {
            toast(getString(R.string.no_packages, store.pushDir?.path ?: "the app's files dir"))
            return
        }
        worker.execute {
            for (src in todo) {
                try {
                    store.importPackage(src) { done, total -> progress("importing ${src.name}", done, total) }
                } catch (e: Exception) {
                    ui.post { toast("${src.name}: ${e.message}") }
                }
            }
            ui.post { refreshPackages(); status.text = "imported ${todo.size} package(s)" }
        }
    }

    private fun askDownload() {
        val url = EditText(this).apply { hint = getString(R.string.download_url) }
        AlertDialog.Builder(this).setTitle(R.string.download).setView(url)
            .setPositiveButton(R.string.ok) { _, _ ->
                val u = url.text.toString().trim()
                worker.execute {
                    try {
                        val pkg = store.download(u) { done, total -> progress("downloading", done, total) }
                        ui.post { refreshPackages(); status.text = "installed ${pkg.name}" }
                    } catch (e: Exception) {
                        ui.post { status.text = "download failed: ${e.message}" }
                    }
                }
            }
            .setNegativeButton(R.string.cancel, null).show()
    }

    private var lastProgress = 0L

    private fun progress(what: String, done: Long, total: Long) {
        val now = System.nanoTime()
        if (now - lastProgress < 200_000_000L && done != total) return   // at most five updates a second
        lastProgress = now
        val text = if (total > 0) "$what: ${done * 100 / total}% of ${ChatSession.mib(total)} MiB"
                   else "$what: ${ChatSession.mib(done)} MiB"
        ui.post { status.text = text }
    }

    // ---- chat -----------------------------------------------------------------------------------------------------

    private fun sendMessage() {
        val text = input.text.toString().trim()
        if (text.isEmpty() || session == null) return
        input.setText("")
        addBubble(text, user = true)
        val reply = addBubble("", user = false)
        generating = true
        send.setText(R.string.stop)
        val s = settings
        worker.execute {
            val line = try {
                val current = session ?: throw EdgeLLMException("no package loaded")
                val r = current.send(text, s) { piece -> ui.post { reply.append(piece); scrollDown() } }
                val st = current.stats()
                String.format("prefill %.1f tok/s (%d tok) · decode %.1f tok/s · %s · KV %d MiB · RSS %d MiB",
                              r.prefillTokensPerSecond, r.promptTokens, r.decodeTokensPerSecond,
                              r.finishReason.name.lowercase(), ChatSession.mib(st.kvBytes), rssMiB())
            } catch (e: EdgeLLMException) {
                "error: ${e.message}"
            }
            ui.post {
                stats.text = line
                generating = false
                send.setText(R.string.send)
            }
        }
    }

    private fun stop() {
        session?.cancel()   // thread-safe: the reply ends at its next token
    }

    private fun newChat() {
        session?.cancel()
        worker.execute { session?.reset() }
        messages.removeAllViews()
        stats.text = ""
    }

    private fun addBubble(text: String, user: Boolean): TextView {
        val v = LayoutInflater.from(this).inflate(R.layout.message, messages, false) as TextView
        v.text = text
        v.setBackgroundResource(if (user) R.drawable.bubble_user else R.drawable.bubble_assistant)
        (v.layoutParams as LinearLayout.LayoutParams).gravity = if (user) Gravity.END else Gravity.START
        messages.addView(v)
        scrollDown()
        return v
    }

    private fun scrollDown() = scroll.post { scroll.fullScroll(View.FOCUS_DOWN) }

    // ---- settings -------------------------------------------------------------------------------------------------

    private fun showSettings() {
        val v = LayoutInflater.from(this).inflate(R.layout.settings, null)
        fun field(id: Int, value: Any?) = v.findViewById<EditText>(id).apply { setText(value?.toString() ?: "") }
        val system = field(R.id.system_prompt, settings.systemPrompt)
        val temperature = field(R.id.temperature, settings.temperature)
        val topP = field(R.id.top_p, settings.topP)
        val topK = field(R.id.top_k, settings.topK)
        val maxTokens = field(R.id.max_tokens, settings.maxTokens)
        val seed = field(R.id.seed, settings.seed)
        val threads = field(R.id.threads, settings.threads)
        val budget = field(R.id.memory_budget, settings.memoryBudgetMiB)
        val device = field(R.id.gpu_device, settings.gpuDevice)
        val prefill = v.findViewById<Spinner>(R.id.prefill_backend).apply { setSelection(settings.prefill.ordinal) }
        AlertDialog.Builder(this).setTitle(R.string.settings).setView(v)
            .setPositiveButton(R.string.ok) { _, _ ->
                settings = Settings(
                    systemPrompt = system.text.toString(),
                    temperature = temperature.text.toString().toFloatOrNull(),
                    topP = topP.text.toString().toFloatOrNull(),
                    topK = topK.text.toString().toIntOrNull(),
                    maxTokens = maxTokens.text.toString().toIntOrNull()?.coerceAtLeast(1) ?: 512,
                    seed = seed.text.toString().toLongOrNull(),
                    threads = threads.text.toString().toIntOrNull()?.coerceAtLeast(0) ?: 0,
                    memoryBudgetMiB = budget.text.toString().toLongOrNull()?.coerceAtLeast(0) ?: 0,
                    prefill = PrefillBackend.values()[prefill.selectedItemPosition],
                    gpuDevice = device.text.toString().trim())
                SettingsStore.save(settings, getPreferences(MODE_PRIVATE))
                toast("threads, memory budget, prefill and device apply at the next Load")
            }
            .setNegativeButton(R.string.cancel, null).show()
    }

    private fun toast(text: String) = Toast.makeText(this, text, Toast.LENGTH_LONG).show()

    private fun rssMiB(): Long = try {
        File("/proc/self/status").readLines().first { it.startsWith("VmRSS:") }.split(Regex("\\s+"))[1].toLong() / 1024
    } catch (e: Exception) {
        0
    }

    companion object {
        private const val MENU_IMPORT = 1
        private const val MENU_DOWNLOAD = 2
    }
}
