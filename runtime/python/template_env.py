"""Chat templates rendered under limits. A chat template is code that comes with the checkpoint; jinja2's immutable
sandbox keeps it from Python objects, files and the OS, and this module also bounds what it may cost: time (a
template of nested `range(99999)` loops ran for minutes inside `edgellm serve`), output size, and the size of what
`*` and `**` may build (`'a' * 3e8` is one C call the clock cannot interrupt)."""
from __future__ import annotations

import sys
import time

from ...errors import InputError

TEMPLATE_SECONDS = 2.0            # a real chat template renders in milliseconds
TEMPLATE_MAX_CHARS = 8 * 2**20    # its output: the prompt (a context of tokens is far less)


class TemplateLimit(InputError):
    """A chat template ran past its time or size bounds."""


def template_env():
    """jinja2's ImmutableSandboxedEnvironment as transformers configures it, with `*` and `**` bounded."""
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class Bounded(ImmutableSandboxedEnvironment):
        intercepted_binops = frozenset(["*", "**"])

        def call_binop(self, context, operator, left, right):
            if operator == "*":
                for seq, n in ((left, right), (right, left)):
                    if isinstance(seq, (str, list, tuple)) and isinstance(n, (int, float)) and \
                            len(seq) * max(n, 0) > TEMPLATE_MAX_CHARS:
                        raise TemplateLimit(f"the package's chat template built a sequence of {len(seq) * n:.3g} "
                                            f"items (the limit is {TEMPLATE_MAX_CHARS})")
            if operator == "**" and isinstance(left, int) and isinstance(right, int) and abs(left) > 1 and \
                    right * max(abs(left).bit_length(), 1) > 64 * 1024:
                raise TemplateLimit("the package's chat template computed a power too large to render")
            return super().call_binop(context, operator, left, right)

    return Bounded(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])


def bounded_render(template, seconds: float = TEMPLATE_SECONDS, max_chars: int = TEMPLATE_MAX_CHARS, **ctx) -> str:
    """template.render(**ctx), stopped with a TemplateLimit past `seconds` or `max_chars`. The clock is checked on
    every Python call of this thread and on every line of the template's own compiled code (filename
    "<template>", so a loop with an empty body is caught too); other threads are untouched (sys.settrace is per
    thread), and the previous tracer (a debugger, coverage) is put back."""
    deadline = time.monotonic() + seconds

    def check(frame, event, arg):
        if time.monotonic() > deadline:
            raise TemplateLimit(f"the package's chat template ran for more than {seconds:g} s: stopped")
        return check if frame.f_code.co_filename == "<template>" else None

    out, n = [], 0
    previous = sys.gettrace()
    sys.settrace(check)
    try:
        for piece in template.generate(**ctx):
            n += len(piece)
            if n > max_chars:
                raise TemplateLimit(f"the package's chat template wrote more than {max_chars} characters: stopped")
            out.append(piece)
    finally:
        sys.settrace(previous)
    return "".join(out)
