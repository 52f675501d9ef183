"""Stream a chat completion through anelm to an upstream with the official openai client
(called by tests/upstream.rs).

Usage: python upstream_client.py BASE_URL API_KEY MODEL EXPECTED_TEXT
Exits non-zero unless the streamed text equals EXPECTED_TEXT (the upstream's own answer at
temperature 0) and the stream ends with a finish reason.
"""
import sys

from openai import OpenAI

base, key, model, expected = sys.argv[1:5]
client = OpenAI(base_url=base, api_key=key, max_retries=0, timeout=120)
pieces, finish = [], None
for chunk in client.chat.completions.create(
    model=model, messages=[{"role": "user", "content": "Name three rivers."}], max_tokens=12, temperature=0,
    stream=True,
):
    for c in chunk.choices:
        pieces.append(c.delta.content or "")
        finish = c.finish_reason or finish
text = "".join(pieces)
assert text == expected, f"streamed {text!r}, the upstream answers {expected!r}"
assert finish in ("stop", "length"), finish
print("ok: streamed through anelm")
