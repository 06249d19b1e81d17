#!/usr/bin/env python3
"""Reference renderings of chat templates, produced by Hugging Face transformers.

For every template in the text fixture collection (llama.cpp's models/templates, fetched by
scripts/fetch_text_fixtures.sh) and every conversation of
crates/chat/tests/fixtures/conversations.json, renders the prompt with transformers' own
renderer as `apply_chat_template` calls it (`_normalize_chat_messages`, which drops message keys
whose value is None, then `transformers.utils.chat_template_utils.render_jinja_template`) and writes crates/chat/tests/fixtures/renders/<template>.json.

It also renders the small templates of crates/chat/tests/fixtures/semantics.json (one Jinja2
behaviour each: tojson options, how values print, undefined values, whitespace control, ...)
into crates/chat/tests/fixtures/semantics_renders.json.

`strftime_now` reads one fixed instant (`now_unix` of the conversations file, as naive UTC), so
the output does not depend on the day it is run. A conversation the template rejects (an
exception while rendering) is recorded with its message instead of an output.

Usage (versions pinned in scripts/gen_template_refs.requirements.txt):
    python3 -m venv /tmp/tmplref
    /tmp/tmplref/bin/pip install -r scripts/gen_template_refs.requirements.txt
    /tmp/tmplref/bin/python scripts/gen_template_refs.py [TEMPLATE_NAME ...]
Templates are read from $SLUICE_FIXTURES/text/templates (default
${XDG_CACHE_HOME:-~/.cache}/sluice/fixtures/text/templates).
"""

import datetime as _dt
import hashlib
import json
import os
import sys

import jinja2
import transformers
from transformers.utils import chat_template_utils

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURES = os.path.join(ROOT, "crates", "chat", "tests", "fixtures")


def templates_dir():
    base = os.environ.get("SLUICE_FIXTURES")
    if not base:
        cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        base = os.path.join(cache, "sluice", "fixtures")
    return os.path.join(base, "text", "templates")


def fixed_clock(now_unix):
    """A stand-in for the datetime class that transformers' strftime_now calls now() on."""
    instant = _dt.datetime.fromtimestamp(now_unix, _dt.timezone.utc).replace(tzinfo=None)

    class FixedDatetime(_dt.datetime):
        @classmethod
        def now(cls, tz=None):
            return instant

    return FixedDatetime


def render_case(source, conv, spec):
    kwargs = {"bos_token": spec["bos_token"], "eos_token": spec["eos_token"]}
    if "enable_thinking" in conv:
        kwargs["enable_thinking"] = conv["enable_thinking"]
    tools = spec["tools"] if conv.get("use_tools") else None
    # What apply_chat_template does before rendering: message objects become dicts and keys whose
    # value is None are dropped. Every case starts from a fresh copy of the file's data.
    messages = chat_template_utils._normalize_chat_messages(json.loads(json.dumps(conv["messages"])))
    rendered, _ = chat_template_utils.render_jinja_template(
        conversations=[messages],
        tools=json.loads(json.dumps(tools)) if tools is not None else None,
        chat_template=source,
        add_generation_prompt=conv["add_generation_prompt"],
        **kwargs,
    )
    return rendered[0]


def render_semantics():
    with open(os.path.join(FIXTURES, "semantics.json"), encoding="utf-8") as f:
        spec = json.load(f)
    chat_template_utils.datetime = fixed_clock(spec["now_unix"])
    cases = []
    for case in spec["cases"]:
        out = {"name": case["name"]}
        try:
            rendered, _ = chat_template_utils.render_jinja_template(
                conversations=[json.loads(json.dumps(case.get("messages", [])))],
                chat_template=case["template"],
                add_generation_prompt=False,
                **json.loads(json.dumps(spec["data"])),
            )
            out["output"] = rendered[0]
        except Exception as e:
            out["error"] = f"{type(e).__name__}: {e}"
        cases.append(out)
    doc = {
        "generator": "scripts/gen_template_refs.py",
        "renderer": "transformers.utils.chat_template_utils.render_jinja_template",
        "transformers": transformers.__version__,
        "jinja2": jinja2.__version__,
        "cases": cases,
    }
    with open(os.path.join(FIXTURES, "semantics_renders.json"), "w", encoding="utf-8") as f:
        json.dump(doc, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print(f"semantics: {len(cases)} cases", file=sys.stderr)


def main(argv):
    render_semantics()
    with open(os.path.join(FIXTURES, "conversations.json"), encoding="utf-8") as f:
        spec = json.load(f)
    chat_template_utils.datetime = fixed_clock(spec["now_unix"])

    tdir = templates_dir()
    if not os.path.isdir(tdir):
        sys.exit(f"text fixtures missing ({tdir}): run `bash scripts/fetch_text_fixtures.sh`")
    names = argv or sorted(n[: -len(".jinja")] for n in os.listdir(tdir) if n.endswith(".jinja"))
    out_dir = os.path.join(FIXTURES, "renders")
    os.makedirs(out_dir, exist_ok=True)
    for name in names:
        with open(os.path.join(tdir, name + ".jinja"), "rb") as f:
            raw = f.read()
        source = raw.decode("utf-8")
        cases = []
        for conv in spec["conversations"]:
            case = {"conversation": conv["name"]}
            try:
                case["output"] = render_case(source, conv, spec)
            except Exception as e:  # the template's own rejection (raise_exception) or a jinja2 error
                case["error"] = f"{type(e).__name__}: {e}"
            cases.append(case)
        doc = {
            "generator": "scripts/gen_template_refs.py",
            "renderer": "transformers.utils.chat_template_utils._normalize_chat_messages + render_jinja_template",
            "transformers": transformers.__version__,
            "jinja2": jinja2.__version__,
            "template": name + ".jinja",
            "template_sha256": hashlib.sha256(raw).hexdigest(),
            "cases": cases,
        }
        with open(os.path.join(out_dir, name + ".json"), "w", encoding="utf-8") as f:
            json.dump(doc, f, ensure_ascii=False, indent=1)
            f.write("\n")
        n_err = sum(1 for c in cases if "error" in c)
        print(f"{name}: {len(cases) - n_err} rendered, {n_err} raised", file=sys.stderr)


if __name__ == "__main__":
    main(sys.argv[1:])
