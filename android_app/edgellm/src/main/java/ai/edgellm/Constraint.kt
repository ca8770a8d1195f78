package ai.edgellm

import java.io.File

/**
 * An output constraint: an automaton compiled on a host from a JSON schema or a regular expression
 * (`edgellm schema schema.json -o person.eldfa`), shipped with the app. Pass it as [GenerateParams.constraint]: only
 * the tokens it takes are drawn, and the text ends where it is complete. One file serves every model; a generation
 * that uses it must end before it is closed.
 */
class Constraint private constructor(handle: Long, val path: String) : AutoCloseable {
    @Volatile private var handle: Long = handle

    companion object {
        /** Reads the automaton file [path]; throws [EdgeLLMException] with a one-line reason. */
        @JvmStatic
        fun load(path: String): Constraint {
            if (!File(path).isFile) throw EdgeLLMException("$path is not a file (edgellm schema writes one)")
            return Constraint(NativeBridge.constraintLoad(path.utf8()), path)
        }
    }

    internal fun live(): Long {
        val h = handle
        if (h == 0L) throw EdgeLLMException("the constraint is closed")
        return h
    }

    @Synchronized override fun close() {
        val h = handle
        handle = 0
        if (h != 0L) NativeBridge.constraintFree(h)
    }
}
