"""Does a constraint make a small model's structured answers usable? (issue 37)

    python bench/structured_eval.py [--quant q8]

A real small instruct model (SmolLM2-135M-Instruct, the GGUF from PyPI) answers 50 requests, greedy, each twice:
unconstrained and constrained.
- 25 extractions: a sentence into a JSON schema (name, age, city, email). Unconstrained, the reply counts as
  parsed if its first {...} block is JSON (an app would be more strict); constrained, response_format json_schema.
- 25 function selections among 5 tools, through Runtime.chat(tools=...) and a Qwen-style (hermes) chat template
  (SmolLM2's own has no tools): unconstrained, the template's instructions alone (the reply parsed as edgellm reads
  hermes calls); constrained, tool_choice "required".
Reported: parsed, valid against the schema, the right values (extraction) or the right function (selection).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests"))

PERSON = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 40},
                                           "age": {"type": "integer", "minimum": 0, "maximum": 120},
                                           "city": {"type": "string", "maxLength": 30},
                                           "email": {"type": "string", "maxLength": 50}},
          "required": ["name", "age", "city", "email"], "additionalProperties": False}
PEOPLE = [("Maria Lopez", 34, "Madrid", "maria.lopez@example.com"), ("John Carter", 52, "Boston", "jcarter@mail.org"),
          ("Aiko Tanaka", 27, "Osaka", "aiko.t@example.jp"), ("Lars Nilsson", 41, "Oslo", "lars@nilsson.no"),
          ("Fatima Zahra", 19, "Rabat", "fz@univ.ma"), ("Pedro Alves", 63, "Lisbon", "palves@correio.pt"),
          ("Chen Wei", 38, "Shanghai", "chen.wei@corp.cn"), ("Emma Schmidt", 45, "Berlin", "emma@schmidt.de"),
          ("Noah Brown", 8, "Denver", "noah.parent@family.com"), ("Olivia Rossi", 29, "Milan", "orossi@studio.it"),
          ("Ivan Petrov", 71, "Kazan", "ivan.petrov@mail.ru"), ("Grace Kim", 33, "Seoul", "grace.kim@lab.kr"),
          ("Tom Baker", 57, "Leeds", "tbaker@shop.co.uk"), ("Sara Cohen", 24, "Haifa", "sara.c@tech.il"),
          ("Diego Ramirez", 36, "Lima", "diego.r@peru.pe"), ("Anna Kowalska", 48, "Krakow", "anna.k@poczta.pl"),
          ("Omar Haddad", 31, "Amman", "omar@haddad.jo"), ("Lucy Green", 66, "Perth", "lucy.green@home.au"),
          ("Raj Patel", 40, "Pune", "raj.patel@infra.in"), ("Mia Novak", 22, "Zagreb", "mia.novak@fer.hr"),
          ("Hugo Martin", 55, "Lyon", "hugo.martin@ville.fr"), ("Zoe Adams", 17, "Austin", "zoe.adams@school.us"),
          ("Kofi Mensah", 44, "Accra", "kofi@mensah.gh"), ("Elena Ivanova", 39, "Sofia", "elena.i@bg.bg"),
          ("Ben Okafor", 28, "Lagos", "ben.okafor@start.ng")]
FORMS = ["{n} is {a} years old and lives in {c}. You can reach {n} at {e}.",
         "Contact: {e}. Name: {n}, age {a}, based in {c}.",
         "Meet {n} ({a}) from {c}; email {e}.",
         "Our new member, {n}, aged {a}, moved to {c} last year. Write to {e}.",
         "{c} resident {n}, {a}, asked us to reply to {e}."]


def fn(name, desc, props, req):
    return {"type": "function", "function": {"name": name, "description": desc, "parameters": {
        "type": "object", "properties": props, "required": req}}}


TOOLS = [fn("get_weather", "Get the current weather for a city", {"city": {"type": "string"}}, ["city"]),
         fn("set_timer", "Start a countdown timer", {"minutes": {"type": "integer"}}, ["minutes"]),
         fn("send_email", "Send an email to someone", {"to": {"type": "string"}, "subject": {"type": "string"}},
            ["to", "subject"]),
         fn("play_music", "Play a song or an artist", {"query": {"type": "string"}}, ["query"]),
         fn("add_event", "Add an event to the calendar", {"title": {"type": "string"}, "date": {"type": "string"}},
            ["title", "date"])]
REQUESTS = [("What's the weather like in Tokyo right now?", "get_weather"),
            ("Is it raining in London today?", "get_weather"),
            ("How hot is it in Cairo?", "get_weather"),
            ("Tell me the forecast for Paris.", "get_weather"),
            ("Do I need an umbrella in Seattle?", "get_weather"),
            ("Set a timer for 15 minutes.", "set_timer"),
            ("Remind me in 5 minutes that the pasta is ready.", "set_timer"),
            ("Start a 30 minute countdown.", "set_timer"),
            ("Wake me in 20 minutes.", "set_timer"),
            ("Time my workout: 45 minutes.", "set_timer"),
            ("Email Sarah that the meeting moved to Friday.", "send_email"),
            ("Send an email to bob@example.com saying hello.", "send_email"),
            ("Write to my boss that I will be late.", "send_email"),
            ("Send Alice the report by email.", "send_email"),
            ("Mail the team: lunch is at noon.", "send_email"),
            ("Play some jazz.", "play_music"),
            ("Put on Bohemian Rhapsody by Queen.", "play_music"),
            ("I want to listen to Taylor Swift.", "play_music"),
            ("Play relaxing piano music.", "play_music"),
            ("Start my running playlist.", "play_music"),
            ("Add a dentist appointment on March 3.", "add_event"),
            ("Put my mom's birthday on June 12 in the calendar.", "add_event"),
            ("Schedule a team meeting for next Monday.", "add_event"),
            ("Create an event: concert on 2026-12-20.", "add_event"),
            ("Block the calendar for the review on Friday.", "add_event")]


def first_json(text: str):
    m = re.search(r"\{.*\}", text, re.S)
    try:
        return json.loads(m.group(0)) if m else None
    except ValueError:
        return None


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quant", default="q8")
    ap.add_argument("--work", default=os.path.expanduser("~/.cache/edgellm/bench"))
    ap.add_argument("--tokens", type=int, default=96)
    a = ap.parse_args(argv)
    import jsonschema

    import edgellm
    import vs_llamacpp as vs
    from edgellm.runtime.python.api import Runtime
    from real_checkpoints import hf_folder
    from tool_templates import HERMES

    work = Path(a.work)
    pkg = work / f"eval-smollm2-135m-{a.quant}.edgellm"
    if not (pkg / "manifest.json").is_file():
        edgellm.compile(str(hf_folder("smollm2-135m")), quant=a.quant, out=pkg, max_context=2048, progress=False)
    tools_pkg = work / f"eval-smollm2-135m-{a.quant}-hermes.edgellm"   # the same package, a tool template
    if not (tools_pkg / "manifest.json").is_file():
        shutil.copytree(pkg, tools_pkg)
    print(f"host: {vs._cpu_name()}; SmolLM2-135M-Instruct {a.quant}, greedy, at most {a.tokens} tokens")
    rf = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}}
    ex = {"off": [0, 0, 0], "on": [0, 0, 0]}
    t0 = time.perf_counter()
    with Runtime.load(pkg) as rt:
        for i, person in enumerate(PEOPLE):
            n, age, c, e = person
            text = FORMS[i % len(FORMS)].format(n=n, a=age, c=c, e=e)
            msgs = [{"role": "user", "content": "Extract the person as JSON with the keys name, age, city and "
                                                f"email.\n\n{text}"}]
            for mode in ("off", "on"):
                kw = {"response_format": rf} if mode == "on" else {}
                r = rt.chat(msgs, temperature=0, max_new_tokens=a.tokens, **kw)
                got = first_json(r.text)
                if got is None:
                    continue
                ex[mode][0] += 1
                try:
                    jsonschema.validate(got, PERSON)
                except jsonschema.ValidationError:
                    continue
                ex[mode][1] += 1
                ex[mode][2] += got == {"name": n, "age": age, "city": c, "email": e}
    sel = {"off": [0, 0, 0], "on": [0, 0, 0]}
    by_name = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
    with Runtime.load(tools_pkg) as rt:
        rt.text.config["chat_template"] = HERMES
        from edgellm.runtime.python.tools import template_messages, tool_plan

        plan = tool_plan(rt.text, TOOLS, "auto")
        for q, want in REQUESTS:
            msgs = [{"role": "user", "content": q}]
            for mode in ("off", "on"):
                if mode == "on":
                    r = rt.chat(msgs, tools=TOOLS, tool_choice="required", parallel_tool_calls=False, temperature=0,
                                max_new_tokens=a.tokens)
                    calls = r.tool_calls
                else:   # the same prompt, nothing constrained: what the model writes, read as edgellm reads calls
                    prompt = rt.text.apply_chat_template(template_messages(msgs), tools=plan.tools)
                    r = rt.generate(rt.encode(prompt, add_special_tokens=False), temperature=0,
                                    max_new_tokens=a.tokens, _raw_text=True)
                    calls = plan.parse(r.text)[1]
                if not calls:
                    continue
                sel[mode][0] += 1
                c = calls[0]["function"]
                try:
                    jsonschema.validate(json.loads(c["arguments"]), by_name[c["name"]])
                    sel[mode][1] += 1
                except (jsonschema.ValidationError, KeyError):
                    pass
                sel[mode][2] += c["name"] == want
    print(f"({time.perf_counter() - t0:.0f} s)\n")
    print("| task (25 each) | unconstrained: parsed / valid / right | constrained: parsed / valid / right |")
    print("|---|---|---|")
    for name, d in (("extraction into a schema (right: every field)", ex),
                    ("function selection among 5 tools (right: the function)", sel)):
        print(f"| {name} | {' / '.join(map(str, d['off']))} | {' / '.join(map(str, d['on']))} |")


if __name__ == "__main__":
    main()
