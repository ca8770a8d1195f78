package ai.edgellm.chat

import org.json.JSONArray
import org.json.JSONObject
import java.io.File

/**
 * How turns become prompt text: the package's chat_format.json, which `edgellm compile` derives from the
 * checkpoint's chat template (jinja has no place on the phone). The first turn is the whole prompt; every later
 * turn is only what follows the conversation already in the KV cache (the end of the assistant's reply, then the
 * user's turn and the generation prompt), so a reply never re-reads the history.
 */
class ChatFormat private constructor(
    private val first: List<String>,          // [before the user text, after it]
    private val firstSystem: List<String>?,   // [before the system text, between it and the user text, after]
    private val next: List<String>?,          // [after the assistant's reply up to the user text, after it]
    val stop: List<String>,                   // strings that end a reply besides the model's EOS ids
    val stopIds: IntArray                     // the token that ends an assistant turn (its text is empty)
) {
    /** Prompt text for a turn; null when the format cannot continue a conversation (start over instead). */
    fun turn(user: String, system: String, firstTurn: Boolean): String? = when {
        firstTurn && system.isNotBlank() && firstSystem != null -> firstSystem[0] + system + firstSystem[1] + user + firstSystem[2]
        firstTurn -> first[0] + user + first[1]
        next != null -> next[0] + user + next[1]
        else -> null
    }

    companion object {
        const val FILE = "chat_format.json"

        /** A transcript for packages without a chat template (base models). */
        val PLAIN = ChatFormat(listOf("user: ", "\nassistant:"), null, listOf("\nuser: ", "\nassistant:"),
                               listOf("\nuser:"), IntArray(0))

        fun of(pkg: File): ChatFormat {
            val f = File(pkg, FILE)
            if (!f.isFile) return PLAIN
            val o = JSONObject(f.readText())
            fun strings(key: String): List<String>? {
                if (o.isNull(key)) return null
            val a: JSONArray = o.optJSONArray(key) ?: return null
                return List(a.length()) { a.getString(it) }
            }
            val ids = o.optJSONArray("stop_ids")
            return ChatFormat(strings("first") ?: return PLAIN, strings("first_system"), strings("next"),
                              strings("stop") ?: emptyList(), IntArray(ids?.length() ?: 0) { ids!!.getInt(it) })
        }
    }
}
