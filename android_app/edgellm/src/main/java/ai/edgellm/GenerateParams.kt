package ai.edgellm

/**
 * Sampling and stop rules of one generation. A null field takes the package's default (its generation_config.json:
 * sampled where it says do_sample, else greedy), exactly as the Python Runtime and edgellm-run do, so the same
 * arguments and seed give the same tokens on every front end.
 */
data class GenerateParams(
    val maxNewTokens: Int? = null,        // default 128
    val temperature: Float? = null,       // 0: greedy
    val topK: Int? = null,                // 0: off
    val topP: Float? = null,              // 1: off
    val minP: Float? = null,              // 0: off
    val repetitionPenalty: Float? = null, // 1: off
    val presencePenalty: Float? = null,
    val frequencyPenalty: Float? = null,
    val seed: Long? = null,               // null: a random seed
    val stop: List<String> = emptyList(), // strings that end the generation (never part of the text)
    val stopIds: IntArray = IntArray(0),  // token ids that end it
    val ignoreEos: Boolean = false,
    val keepContext: Boolean = false,    // append to the conversation instead of starting over
    // speculative decoding (the C loop's, as --speculate on the other front ends): "off", "auto" (drafts only where
    // they pay), "ngram" (draft whenever the prompt or reply repeats) or "recycle" (every pass, a tree of n-grams
    // and the tokens the model found likeliest after each token before); the tokens are the same as without it
    val speculate: String? = null,        // null: "off" ("auto" with a draft)
    val draftMax: Int? = null,            // drafts per verify pass at most (null / 0: the package's verify width - 1)
    // a draft model's context (Model.load(draftPackage).newContext()): a smaller model with the same tokenizer
    // (compared token by token on first use) guesses where no n-gram matches; its context serves this generation
    val draft: Context? = null,
    // the output's automaton (Constraint.load: a JSON schema compiled on a host by `edgellm schema`): only what it
    // takes is drawn, and the text ends where it is complete
    val constraint: Constraint? = null
)

enum class FinishReason { NONE, EOS, STOP, LENGTH, CONTEXT, CANCELLED;
    companion object { internal fun of(code: Int) = values().getOrElse(code) { NONE } }
}

/** One streamed event: a new token (id >= 0) or, id -1, the last of the text. */
data class Token(val id: Int, val text: String)

class GenerateResult(
    val tokens: IntArray,
    val text: String,
    val promptTokens: Int,
    val finishReason: FinishReason,
    val prefillSeconds: Double,
    val decodeSeconds: Double,
    val ttftSeconds: Double,
    val decodeSteps: Int
) {
    val prefillTokensPerSecond: Double get() = if (prefillSeconds > 0) promptTokens / prefillSeconds else 0.0
    val decodeTokensPerSecond: Double get() = if (decodeSeconds > 0) decodeSteps / decodeSeconds else 0.0
}

/** A context's counters (el_stats): memory and time since it was made. */
data class Stats(
    val weightBytes: Long,       // weights the model holds in memory
    val kvBytes: Long,           // this context's KV cache
    val arenaBytes: Long,        // its activation arena
    val contextBytes: Long,      // everything the context allocated
    val prefillTokens: Long,
    val decodeTokens: Long,
    val ioBytesRead: Long,       // weights read from storage (streamed policies)
    val weightBytesRead: Long,   // bytes of weights the kernels read
    val prefillSeconds: Double,
    val decodeSeconds: Double,
    val ioStallSeconds: Double,
    val specPasses: Long = 0,    // speculative decoding: verify passes run,
    val specDrafted: Long = 0,   // draft tokens they carried,
    val specAccepted: Long = 0,  // drafts the samples took (each one a decode step saved);
    val specDraftedModel: Long = 0,   // of those, the draft package's (its guesses and, where it was unsure,
    val specAcceptedModel: Long = 0,  // its second and third choices: branches of the tree),
    val specAcceptedBranch: Long = 0  // and the branches taken
)
