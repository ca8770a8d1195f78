package ai.edgellm.chat

import ai.edgellm.PrefillBackend
import android.content.SharedPreferences

/** [Settings] kept in SharedPreferences across launches. */
object SettingsStore {
    fun save(s: Settings, p: SharedPreferences) {
        p.edit()
            .putString("system_prompt", s.systemPrompt)
            .putString("temperature", s.temperature?.toString() ?: "")
            .putString("top_p", s.topP?.toString() ?: "")
            .putString("top_k", s.topK?.toString() ?: "")
            .putInt("max_tokens", s.maxTokens)
            .putString("seed", s.seed?.toString() ?: "")
            .putInt("threads", s.threads)
            .putLong("memory_budget_mib", s.memoryBudgetMiB)
            .putInt("prefill", s.prefill.ordinal)
            .putString("gpu_device", s.gpuDevice)
            .apply()
    }

    fun load(p: SharedPreferences) = Settings(
        systemPrompt = p.getString("system_prompt", "") ?: "",
        temperature = p.getString("temperature", "")?.toFloatOrNull(),
        topP = p.getString("top_p", "")?.toFloatOrNull(),
        topK = p.getString("top_k", "")?.toIntOrNull(),
        maxTokens = p.getInt("max_tokens", 512),
        seed = p.getString("seed", "")?.toLongOrNull(),
        threads = p.getInt("threads", 0),
        memoryBudgetMiB = p.getLong("memory_budget_mib", 0),
        prefill = PrefillBackend.values()[p.getInt("prefill", 0).coerceIn(0, PrefillBackend.values().size - 1)],
        gpuDevice = p.getString("gpu_device", "") ?: "")
}
