"""Drive `anelm serve --embedding-model` with the official openai client (called by
tests/embeddings_server.rs).

Usage: python openai_embeddings.py BASE_URL API_KEY FIXTURE_JSON
The fixture is crates/anelm-engine/tests/fixtures/embeddings/minilm.json: sentence-transformers'
vectors, which the served vectors must match (cosine >= 0.9999).
Exits non-zero with a message on the first failed check.
"""
import base64
import concurrent.futures
import json
import math
import struct
import sys

from openai import OpenAI

base, key, fixture_path = sys.argv[1:4]
client = OpenAI(base_url=base, api_key=key, max_retries=0, timeout=120)
with open(fixture_path, encoding="utf-8") as f:
    cases = json.load(f)["texts"]


def cosine(a, b):
    dot = sum(x * y for x, y in zip(a, b))
    return dot / (math.sqrt(sum(x * x for x in a)) * math.sqrt(sum(y * y for y in b)))


def norm(v):
    return math.sqrt(sum(x * x for x in v))


ids = [m.id for m in client.models.list().data]
assert len(ids) == 2, f"models: {ids} (the chat model and the embedding model)"
chat_model, emb_model = ids
assert emb_model == "all-MiniLM-L6-v2", ids

# One string.
one = client.embeddings.create(model=emb_model, input=cases[0]["text"])
assert len(one.data) == 1 and one.data[0].index == 0, one
assert len(one.data[0].embedding) == 384
assert cosine(one.data[0].embedding, cases[0]["embedding"]) >= 0.9999
assert one.usage.prompt_tokens == len(cases[0]["token_ids"]), (one.usage, cases[0]["token_ids"])
assert one.model == emb_model

# A list: every fixture text, in order, each matching sentence-transformers.
texts = [c["text"] for c in cases]
many = client.embeddings.create(model=emb_model, input=texts)
assert [d.index for d in many.data] == list(range(len(texts)))
worst = 1.0
for d, c in zip(many.data, cases):
    cos = cosine(d.embedding, c["embedding"])
    assert cos >= 0.9999, f"cosine {cos} for {c['text']!r}"
    worst = min(worst, cos)
assert many.usage.prompt_tokens == sum(len(c["token_ids"]) for c in cases), many.usage
assert many.usage.total_tokens == many.usage.prompt_tokens

# Token arrays give what their texts give.
toks = client.embeddings.create(model=emb_model, input=[c["token_ids"] for c in cases[:3]])
for d, e in zip(toks.data, many.data[:3]):
    assert cosine(d.embedding, e.embedding) > 0.999999

# dimensions: the first 64 values, renormalised.
short = client.embeddings.create(model=emb_model, input=texts[:2], dimensions=64)
for d, full in zip(short.data, many.data[:2]):
    assert len(d.embedding) == 64
    assert abs(norm(d.embedding) - 1.0) < 1e-5
    assert cosine(d.embedding, full.embedding[:64]) > 0.999999

# base64: little-endian f32, equal to the float answer. The client decodes base64 itself
# (with numpy) when it asked for floats, so ask the raw response for the string.
raw = client.embeddings.with_raw_response.create(model=emb_model, input=texts[:2], encoding_format="base64")
body = json.loads(raw.text)
for d, full in zip(body["data"], many.data[:2]):
    blob = base64.b64decode(d["embedding"])
    vals = struct.unpack(f"<{len(blob) // 4}f", blob)
    assert len(vals) == 384
    assert max(abs(a - b) for a, b in zip(vals, full.embedding)) < 1e-6
via_client = client.embeddings.create(model=emb_model, input=texts[0], encoding_format="base64")
emb = via_client.data[0].embedding
if isinstance(emb, str):
    blob = base64.b64decode(emb)
    emb = struct.unpack(f"<{len(blob) // 4}f", blob)
assert cosine(emb, cases[0]["embedding"]) >= 0.9999

# Chat and embeddings from one process under concurrent load.
def chat(i):
    r = client.chat.completions.create(
        model=chat_model, messages=[{"role": "user", "content": f"Count to {i + 3}."}], max_tokens=16, temperature=0
    )
    assert r.choices[0].message.content, r
    return "chat"


def embed(i):
    r = client.embeddings.create(model=emb_model, input=texts[i % 5 : i % 5 + 8])
    for d, c in zip(r.data, cases[i % 5 : i % 5 + 8]):
        assert cosine(d.embedding, c["embedding"]) >= 0.9999
    return "embed"


with concurrent.futures.ThreadPoolExecutor(max_workers=8) as pool:
    jobs = [pool.submit(chat, i) for i in range(4)] + [pool.submit(embed, i) for i in range(12)]
    kinds = [j.result() for j in jobs]
assert kinds.count("chat") == 4 and kinds.count("embed") == 12

print(f"openai embeddings: ok, lowest cosine {worst:.9f} over {len(cases)} texts")
