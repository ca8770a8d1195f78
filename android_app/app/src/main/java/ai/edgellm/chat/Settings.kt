package ai.edgellm.chat

import ai.edgellm.GenerateParams
import ai.edgellm.LoadOptions
import ai.edgellm.PrefillBackend

/** What the settings dialog edits, kept in SharedPreferences. Null sampling fields: the package's defaults. */
data class Settings(
    val systemPrompt: String = "",
    val temperature: Float? = null,
    val topP: Float? = null,
    val topK: Int? = null,
    val maxTokens: Int = 512,
    val seed: Long? = null,
    val threads: Int = 0,
    val memoryBudgetMiB: Long = 0,
    val prefill: PrefillBackend = PrefillBackend.AUTO,
    val gpuDevice: String = ""
) {
    /** The saved GPU device goes only to GPU packages (the library refuses a device for a CPU one). */
    fun loadOptions(gpuPackage: Boolean) = LoadOptions(threads = threads,
                                                       memoryBudget = if (memoryBudgetMiB > 0) "${memoryBudgetMiB}MiB" else null,
                                                       prefill = prefill,
                                                       device = gpuDevice.ifBlank { null }?.takeIf { gpuPackage })

    fun generateParams(keepContext: Boolean, stop: List<String>, stopIds: IntArray) = GenerateParams(
        maxNewTokens = maxTokens, temperature = temperature, topP = topP, topK = topK, seed = seed,
        keepContext = keepContext, stop = stop, stopIds = stopIds)
}
