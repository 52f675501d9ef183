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

# Log-probabilities, chat form: each generated token with its top alternatives, sorted, the
# greedy choice first; streaming gives the same tokens and values.
lp = client.chat.completions.create(
    model=model, messages=messages, max_tokens=8, temperature=0, logprobs=True, top_logprobs=3,
)
content = lp.choices[0].logprobs.content
assert len(content) == lp.usage.completion_tokens, (len(content), lp.usage)
assert "".join(t.token for t in content).startswith(lp.choices[0].message.content[:1]), content
for t in content:
    assert t.logprob <= 0 and len(t.top_logprobs) == 3, t
    assert t.top_logprobs[0].token == t.token, t
    assert abs(t.top_logprobs[0].logprob - t.logprob) < 1e-6, t
    assert all(a.logprob >= b.logprob for a, b in zip(t.top_logprobs, t.top_logprobs[1:])), t
    assert bytes(t.bytes).decode("utf-8", "replace") == t.token, t
streamed_lp = []
for chunk in client.chat.completions.create(
    model=model, messages=messages, max_tokens=8, temperature=0, logprobs=True, top_logprobs=3, stream=True,
):
    for c in chunk.choices:
        if c.logprobs and c.logprobs.content:
            streamed_lp.extend(c.logprobs.content)
assert [(t.token, round(t.logprob, 5)) for t in streamed_lp] == [(t.token, round(t.logprob, 5)) for t in content], (
    streamed_lp, content)
no_lp = client.chat.completions.create(model=model, messages=messages, max_tokens=2, temperature=0)
assert no_lp.choices[0].logprobs is None, no_lp

# Log-probabilities, completions form.
clp = client.completions.create(model=model, prompt="The capital of France is", max_tokens=6, temperature=0, logprobs=2)
l = clp.choices[0].logprobs
assert len(l.tokens) == len(l.token_logprobs) == len(l.top_logprobs) == len(l.text_offset) == 6, l
assert "".join(l.tokens) == clp.choices[0].text, (l.tokens, clp.choices[0].text)
assert all(len(m) <= 2 and max(m.values()) >= lp_ - 1e-6 for m, lp_ in zip(l.top_logprobs, l.token_logprobs)), l
assert l.text_offset == sorted(l.text_offset) and l.text_offset[0] == 0, l

# Nothing is silently ignored: fields anelm does not implement are a 400 that names them.
for kwargs, param in [
    ({"extra_body": {"frobnicate": 1}}, "frobnicate"),
    ({"logit_bias": {"1": 500}}, "logit_bias"),
    ({"n": 17}, "n"),
]:
    try:
        client.chat.completions.create(model=model, messages=messages, max_tokens=2, **kwargs)
    except Exception as e:  # openai.BadRequestError
        assert getattr(e, "status_code", None) == 400, e
        assert e.body.get("param") == param, e.body
    else:
        raise AssertionError(f"{param} was accepted")
# n choices: each its own stream (seed + index), sharing the prompt's prefill.
import urllib.request


def metric(name):
    req = urllib.request.Request(base.rsplit("/v1", 1)[0] + "/metrics", headers={"Authorization": f"Bearer {key}"})
    text = urllib.request.urlopen(req, timeout=30).read().decode()
    return float(next(l.split()[-1] for l in text.splitlines() if l.startswith("anelm_" + name + " ")))


system = "You are a helpful assistant. " * 20
many = [{"role": "system", "content": system}, {"role": "user", "content": "Name a fruit."}]
hits = metric("prefix_hits_total")
three = client.chat.completions.create(model=model, messages=many, n=3, max_tokens=8, temperature=1, seed=11)
assert [c.index for c in three.choices] == [0, 1, 2], three
assert metric("prefix_hits_total") - hits >= 2, "the choices share the prompt's prefill"
# Choice i samples with seed + i: the same text as a single request with that seed; the prompt
# counts once in usage.
completion_tokens = 0
for i, c in enumerate(three.choices):
    alone = client.chat.completions.create(model=model, messages=many, max_tokens=8, temperature=1, seed=11 + i)
    assert alone.choices[0].message.content == c.message.content, (i, alone, c)
    completion_tokens += alone.usage.completion_tokens
    assert alone.usage.prompt_tokens == three.usage.prompt_tokens, (alone.usage, three.usage)
assert three.usage.completion_tokens == completion_tokens, (three.usage, completion_tokens)
texts = {0: "", 1: ""}
for chunk in client.chat.completions.create(model=model, messages=many, n=2, max_tokens=8, temperature=1, seed=11,
                                            stream=True):
    for c in chunk.choices:
        texts[c.index] += c.delta.content or ""
assert [texts[0], texts[1]] == [c.message.content for c in three.choices[:2]], (texts, three)

# Bookkeeping fields are accepted.
client.chat.completions.create(model=model, messages=messages, max_tokens=2, user="u", metadata={"a": "b"}, store=False)

print(f"ok: {text!r}")
