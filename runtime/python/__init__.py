"""The Python side of the runtime: `Runtime` / `Context` over libedgellm through ctypes (api.py, lib.py), text and chat
templates (text.py, template_env.py, c_tokenizer.py), package files (package.py), the one table of load and
generation options (options.py, and gen_option_table.py that renders it for bin/edgellm-run), and the commands built
on the API (bench.py, chat_repl.py, perplexity.py, memory_plan.py: `edgellm bench / chat / eval / plan`). Never
imports TVM."""
