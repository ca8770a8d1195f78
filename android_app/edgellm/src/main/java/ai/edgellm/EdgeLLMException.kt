package ai.edgellm

/** A one-line error from libedgellm: what went wrong and, where there is one, the fix. */
class EdgeLLMException(message: String) : RuntimeException(message)
