package ai.edgellm

/** Where prompts are prefilled: the NPU of android-npu packages, the CPU, or whichever opens (AUTO). */
enum class PrefillBackend(internal val code: Int) { AUTO(0), CPU(1), NPU(2) }

/**
 * How a package is loaded (libedgellm's el_load_options).
 *
 * @property threads CPU threads of the model's contexts; 0: one per online core.
 * @property memoryBudget the memory the model may use (weights held + one context), spelled as every edgellm front end
 *   spells a size: bytes ("629145600"), or a number with a unit: "600MB" / "0.6GB" (10^6, 10^9), "600MiB" / "600M"
 *   (2^20); null: no limit. Weights that do not fit are streamed from storage every token (policy "window").
 * @property weightPolicy "resident", "window", "experts" (MoE) or null (auto: resident when everything fits).
 * @property prefill the prefill backend (android-npu packages).
 * @property device OpenCL device of GPU packages ("P:D" or part of its name); null: the first GPU.
 * @property digest "sha256:<hex>" of the package's SHA256SUMS: every file is checked before anything runs.
 */
data class LoadOptions(
    val threads: Int = 0,
    val memoryBudget: String? = null,
    val weightPolicy: String? = null,
    val prefill: PrefillBackend = PrefillBackend.AUTO,
    val device: String? = null,
    val digest: String? = null
)
