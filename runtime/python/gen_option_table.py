"""Writes runtime/cli/option_table.h (bin/edgellm-run's load and generation options) from the table in runtime/python/options.py:
`python -m edgellm.runtime.python.gen_option_table`. tests/test_options.py fails while the two differ."""
from pathlib import Path

from .options import render_c_header

if __name__ == "__main__":
    out = Path(__file__).parent.parent / "cli" / "option_table.h"
    out.write_text(render_c_header())
    print(f"wrote {out}")
