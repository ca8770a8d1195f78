package ai.edgellm

/** Where prompts are prefilled: the NPU of android-npu packages, the CPU, or whichever opens (AUTO). */
enum class PrefillBackend(internal val code: Int) { AUTO(0), CPU(1), NPU(2) }

/**
 * How a package is loaded (libedgellm's el_load_options).
 *
 * @property threads CPU threads of the model's contexts; 0: one per online core.
 * @property memoryBudget bytes the model may use (weights held + one context); 0: no limit. Weights that do not fit
 *   are streamed from storage every token (policy "window").
 * @property weightPolicy "resident", "window", "experts" (MoE) or null (auto: resident when everything fits).
 * @property prefill the prefill backend (android-npu packages).
 * @property device OpenCL device of GPU packages ("P:D" or part of its name); null: the first GPU.
 * @property digest "sha256:<hex>" of the package's SHA256SUMS: every file is checked before anything runs.
 */
data class LoadOptions(
    val threads: Int = 0,
    val memoryBudget: Long = 0,
    val weightPolicy: String? = null,
    val prefill: PrefillBackend = PrefillBackend.AUTO,
    val device: String? = null,
    val digest: String? = null
)
