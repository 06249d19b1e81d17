"""Drives a running `sluice serve` with OpenAI's official Python client (the `openai` package,
installed by scripts/fetch_serve_deps.sh) and prints what it got as one JSON object; the Rust
test crates/cli/tests/serve.rs judges it.

    python3 serve_openai_check.py BASE_URL API_KEY PROMPT MAX_TOKENS
"""
import json
import sys

import openai

base, key, prompt, n = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
client = openai.OpenAI(base_url=base + "/v1", api_key=key, max_retries=0, timeout=300)
out = {"openai_version": openai.__version__}

out["models"] = [m.id for m in client.models.list()]

user = [{"role": "user", "content": prompt}]
# Each prefilled whole (llama-server's `cache_prompt`): a prefill split differently may differ in
# the last bits, and only a whole one answers exactly as `sluice run` does.
whole = {"cache_prompt": False}
r = client.chat.completions.create(model="any", messages=user, max_tokens=n, temperature=0,
                                   extra_body=whole)
out["chat"] = r.choices[0].message.content
out["chat_finish"] = r.choices[0].finish_reason
out["chat_usage"] = [r.usage.prompt_tokens, r.usage.completion_tokens, r.usage.total_tokens]

parts, finish, usage, roles = [], None, None, []
for chunk in client.chat.completions.create(
    model="any", messages=user, max_tokens=n, temperature=0, stream=True,
    stream_options={"include_usage": True}, extra_body=whole,
):
    if chunk.choices:
        delta = chunk.choices[0].delta
        if delta.role:
            roles.append(delta.role)
        parts.append(delta.content or "")
        finish = chunk.choices[0].finish_reason or finish
    if chunk.usage:
        usage = [chunk.usage.prompt_tokens, chunk.usage.completion_tokens]
out["stream"] = "".join(parts)
out["stream_chunks"] = len(parts)
out["stream_finish"] = finish
out["stream_usage"] = usage
out["stream_roles"] = roles

turns = user + [
    {"role": "assistant", "content": out["chat"]},
    {"role": "user", "content": "Say it again, shorter."},
]
r2 = client.chat.completions.create(model="any", messages=turns, max_tokens=n, temperature=0)
out["multi"] = r2.choices[0].message.content
extra = r2.to_dict().get("sluice", {})
out["multi_prompt"] = [extra.get("prompt_tokens"), extra.get("prompt_new")]

c = client.completions.create(model="any", prompt="Once upon a time", max_tokens=n,
                              temperature=0, stop=["\n"])
out["completion"] = c.choices[0].text
out["completion_finish"] = c.choices[0].finish_reason

try:
    client.chat.completions.create(model="any", messages=[], max_tokens=n)
    out["bad"] = None
except openai.BadRequestError as e:
    out["bad"] = [e.status_code, e.body.get("message") if isinstance(e.body, dict) else str(e.body)]

try:
    client.chat.completions.create(model="any", messages=user, max_tokens=100000)
    out["overflow"] = None
except openai.BadRequestError as e:
    out["overflow"] = [e.status_code, e.code]

wrong = openai.OpenAI(base_url=base + "/v1", api_key=key + "x", max_retries=0)
try:
    wrong.chat.completions.create(model="any", messages=user, max_tokens=n)
    out["wrong_key"] = None
except openai.AuthenticationError as e:
    out["wrong_key"] = [e.status_code, e.code]

print(json.dumps(out))
