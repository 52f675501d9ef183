"""Drive a running `anelm serve` with the official openai client (called by tests/server.rs).

Usage: python openai_client.py BASE_URL API_KEY
Exits non-zero with a message on the first failed check.
"""
import sys

from openai import OpenAI

base, key = sys.argv[1], sys.argv[2]
client = OpenAI(base_url=base, api_key=key, max_retries=0, timeout=120)

models = client.models.list()
ids = [m.id for m in models.data]
assert len(ids) == 1 and ids[0], f"models: {ids}"
model = ids[0]

messages = [{"role": "user", "content": "Name three colors."}]
full = client.chat.completions.create(model=model, messages=messages, max_tokens=24, temperature=0)
text = full.choices[0].message.content
assert text, "empty chat completion"
assert full.choices[0].finish_reason in ("stop", "length"), full.choices[0].finish_reason
assert full.usage.completion_tokens > 0 and full.usage.prompt_tokens > 0, full.usage
assert full.usage.total_tokens == full.usage.prompt_tokens + full.usage.completion_tokens

pieces, finish, usage = [], None, None
stream = client.chat.completions.create(
    model=model, messages=messages, max_tokens=24, temperature=0, stream=True,
    stream_options={"include_usage": True},
)
for chunk in stream:
    if chunk.usage is not None:
        usage = chunk.usage
    for c in chunk.choices:
        if c.delta.content:
            pieces.append(c.delta.content)
        if c.finish_reason:
            finish = c.finish_reason
streamed = "".join(pieces)
assert streamed == text, f"streamed {streamed!r} != non-streamed {text!r}"
assert finish == full.choices[0].finish_reason, (finish, full.choices[0].finish_reason)
assert usage is not None and usage.completion_tokens == full.usage.completion_tokens, usage

comp = client.completions.create(model=model, prompt="The capital of France is", max_tokens=8, temperature=0)
assert comp.choices[0].text, "empty completion"
assert comp.choices[0].finish_reason == "length", comp.choices[0].finish_reason
assert comp.usage.completion_tokens == 8, comp.usage

# max_tokens=1 must say "length" truthfully.
one = client.chat.completions.create(model=model, messages=messages, max_tokens=1, temperature=0)
assert one.choices[0].finish_reason == "length" and one.usage.completion_tokens == 1, one

# Bad input comes back as an OpenAI error, which the client raises as BadRequestError.
try:
    client.chat.completions.create(model=model, messages=[], max_tokens=4)
except Exception as e:  # openai.BadRequestError
    assert getattr(e, "status_code", None) == 400, e
else:
    raise AssertionError("empty messages were accepted")

print(f"ok: {text!r}")
