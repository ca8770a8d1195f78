# ruff: noqa: E501 - the templates are data, their lines as the families write them
"""Chat templates of the tool-calling families, written here in each family's documented shape (how the tools are
offered, how an assistant's calls and the tool results are rendered), for tiny random models and for the real
SmolLM2 package. The real checkpoints' own templates run in the opt-in real tier (tests/test_tools.py)."""

# Qwen2.5/Qwen3 ("hermes"): tools in the system turn, calls between <tool_call> tags, results as <tool_response>
HERMES = """{%- if tools %}<|im_start|>system
{% if messages[0].role == 'system' %}{{ messages[0].content }}{% else %}You are a helpful assistant.{% endif %}


# Tools

You may call one or more functions to assist with the user query.

You are provided with function signatures within <tools></tools> XML tags:
<tools>
{% for tool in tools %}{{ tool | tojson }}
{% endfor %}</tools>

For each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:
<tool_call>
{"name": <function-name>, "arguments": <args-json-object>}
</tool_call><|im_end|>
{% elif messages[0].role == 'system' %}<|im_start|>system
{{ messages[0].content }}<|im_end|>
{% endif %}
{%- for m in messages %}
{%- if m.role == 'system' %}
{%- elif m.role == 'assistant' and m.tool_calls %}<|im_start|>assistant
{% if m.content %}{{ m.content }}
{% endif %}
{%- for c in m.tool_calls %}<tool_call>
{"name": "{{ c.function.name }}", "arguments": {{ c.function.arguments | tojson }}}
</tool_call>{% if not loop.last %}
{% endif %}{% endfor %}<|im_end|>
{% elif m.role == 'tool' %}<|im_start|>user
<tool_response>
{{ m.content }}
</tool_response><|im_end|>
{% else %}<|im_start|>{{ m.role }}
{{ m.content }}<|im_end|>
{% endif %}
{%- endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% endif %}"""

# SmolLM3: the tools come as `xml_tools`; calls between <tool_call> tags without newlines
SMOLLM3 = """<|im_start|>system
{% if xml_tools %}You can call these tools. For each call, write <tool_call>{"name": ..., "arguments": {...}}</tool_call>.
<tools>
{% for tool in xml_tools %}{{ tool | tojson }}
{% endfor %}</tools>{% endif %}<|im_end|>
{% for m in messages %}
{%- if m.role == 'assistant' and m.tool_calls %}<|im_start|>assistant
{% for c in m.tool_calls %}<tool_call>{{ {"name": c.function.name, "arguments": c.function.arguments} | tojson }}</tool_call>{% endfor %}<|im_end|>
{% elif m.role == 'tool' %}<|im_start|>user
{{ m.content }}<|im_end|>
{% elif m.role != 'system' %}<|im_start|>{{ m.role }}
{{ m.content }}<|im_end|>
{% endif %}
{%- endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% endif %}"""

# Llama 3.1/3.2 JSON tool calling: the functions in the first user turn, the call is the whole reply, results as ipython
LLAMA3 = """{{ bos_token }}{%- set ns = namespace(first=true) %}
{%- for m in messages %}
{%- if m.role == 'user' and ns.first and tools %}{%- set ns.first = false %}<|start_header_id|>user<|end_header_id|>

Given the following functions, please respond with a JSON for a function call with its proper arguments that best answers the given prompt.

Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}. Do not use variables.

{% for t in tools %}{{ t | tojson }}

{% endfor %}{{ m.content }}<|eot_id|>
{%- elif m.role == 'assistant' and m.tool_calls %}
{%- if m.tool_calls | length != 1 %}{{ raise_exception("This model only supports single tool-calls at once!") }}{% endif %}<|start_header_id|>assistant<|end_header_id|>

{{ {"name": m.tool_calls[0].function.name, "parameters": m.tool_calls[0].function.arguments} | tojson }}<|eot_id|>
{%- elif m.role in ['tool', 'ipython'] %}<|start_header_id|>ipython<|end_header_id|>

{{ m.content }}<|eot_id|>
{%- else %}<|start_header_id|>{{ m.role }}<|end_header_id|>

{{ m.content }}<|eot_id|>
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>

{% endif %}"""

# Mistral (v3 tokenizer): [AVAILABLE_TOOLS] before the last user turn, [TOOL_CALLS] then a JSON list of calls
MISTRAL = """{{ bos_token }}{%- for m in messages %}
{%- if m.role == 'user' %}{% if loop.last and tools %}[AVAILABLE_TOOLS] {{ tools | tojson }}[/AVAILABLE_TOOLS]{% endif %}[INST] {{ m.content }}[/INST]
{%- elif m.role == 'assistant' and m.tool_calls %}[TOOL_CALLS] [{% for c in m.tool_calls %}
{%- if c.id is not defined or c.id | length != 9 %}{{ raise_exception("Tool call IDs should be alphanumeric strings with length 9!") }}{% endif %}
{{- {"name": c.function.name, "arguments": c.function.arguments, "id": c.id} | tojson }}{% if not loop.last %}, {% endif %}{% endfor %}]{{ eos_token }}
{%- elif m.role == 'tool' %}[TOOL_RESULTS] {{ {"content": m.content, "call_id": m.tool_call_id} | tojson }}[/TOOL_RESULTS]
{%- elif m.role == 'assistant' %} {{ m.content }}{{ eos_token }}
{%- endif %}
{%- endfor %}"""

# Gemma 3: user/model turns and no tools
GEMMA = """{{ bos_token }}{% for m in messages %}<start_of_turn>{{ 'model' if m.role == 'assistant' else m.role }}
{{ m.content | trim }}<end_of_turn>
{% endfor %}{% if add_generation_prompt %}<start_of_turn>model
{% endif %}"""

FAMILIES = {"hermes": HERMES, "smollm3": SMOLLM3, "llama3": LLAMA3, "mistral": MISTRAL}
# the special tokens each family's tokenizer has (a tiny tokenizer is trained with them)
SPECIALS = {"hermes": ["<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>"],
            "smollm3": ["<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>"],
            "llama3": ["<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>", "<|python_tag|>"],
            "mistral": ["[INST]", "[/INST]", "[TOOL_CALLS]", "[AVAILABLE_TOOLS]", "[/AVAILABLE_TOOLS]",
                        "[TOOL_RESULTS]", "[/TOOL_RESULTS]"],
            "gemma": ["<start_of_turn>", "<end_of_turn>"]}
