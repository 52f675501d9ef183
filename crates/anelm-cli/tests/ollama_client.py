"""Drive `anelm serve`'s Ollama API with the official `ollama` Python client (called by
tests/ollama.rs).

Usage: python ollama_client.py BASE_URL API_KEY
BASE_URL is the server's /v1 (http://127.0.0.1:PORT/v1, used to compare embeddings); the Ollama
client talks to its root.
The server runs the default SmolLM2 model with --embedding-model all-MiniLM-L6-v2.
Exits non-zero with a message on the first failed check.
"""
import json
import math
import sys
from importlib.metadata import version as package_version

import httpx
import jsonschema
import ollama
from openai import OpenAI

v1, key = sys.argv[1:3]
base = v1.removesuffix("/v1")
auth = {"Authorization": f"Bearer {key}"}
client = ollama.Client(host=base, headers=auth, timeout=300)


def refused(call, status, *words):
    """`call` raises ollama.ResponseError with `status` and every word in its message."""
    try:
        call()
    except ollama.ResponseError as e:
        assert e.status_code == status, (e.status_code, e.error)
        for w in words:
            assert w in e.error, (w, e.error)
        return e.error
    raise AssertionError(f"accepted; expected {status} with {words}")


# The key is needed, as on /v1; the error is Ollama's.
refused(lambda: ollama.Client(host=base).list(), 401, "API key")

# Models: the chat model and the embedding model, with Ollama's fields.
listed = client.list().models
names = [m.model for m in listed]
assert len(names) == 2, names
chat_model, emb_model = names
assert chat_model.endswith(":latest") and emb_model == "all-MiniLM-L6-v2:latest", names
m = listed[0]
assert m.size > 1_000_000 and len(m.digest) == 64 and m.modified_at is not None, m
assert m.details.format == "gguf" and m.details.family == "llama", m.details
assert m.details.parameter_size and m.details.quantization_level, m.details

shown = client.show(chat_model)
assert "completion" in shown.capabilities and "tools" in shown.capabilities, shown.capabilities
assert "thinking" not in shown.capabilities, shown.capabilities
assert "<|im_start|>" in shown.template, shown.template
assert shown.modelinfo["general.architecture"] == "llama", shown.modelinfo
assert "num_ctx 1024" in shown.parameters, shown.parameters
assert client.show(emb_model).capabilities == ["embedding"]

version = httpx.get(f"{base}/api/version").json()["version"]
assert version.count(".") == 2, version

# Ollama's short names reach the served model: `smollm2` is SmolLM2-135M-Instruct.Q4_1.
short = "smollm2:latest"
assert client.show(short).template == shown.template

greedy = {"temperature": 0, "num_predict": 24}
ask = [{"role": "user", "content": "Name three colors."}]

# Chat, whole and streamed: the stream's pieces concatenate to the whole answer.
whole = client.chat(model=chat_model, messages=ask, options=greedy, stream=False)
assert whole.done and whole.done_reason in ("stop", "length"), whole
assert whole.message.role == "assistant" and whole.message.content, whole
assert whole.prompt_eval_count > 0 and whole.eval_count > 0, whole
assert whole.total_duration >= whole.prompt_eval_duration + whole.eval_duration > 0, whole
assert whole.load_duration >= 0 and whole.created_at, whole
parts = list(client.chat(model=chat_model, messages=ask, options=greedy, stream=True))
assert all(not p.done for p in parts[:-1]) and parts[-1].done, parts
assert "".join(p.message.content for p in parts) == whole.message.content, (parts, whole)
last = parts[-1]
assert (last.done_reason, last.eval_count, last.prompt_eval_count) == (
    whole.done_reason, whole.eval_count, whole.prompt_eval_count), (last, whole)
assert last.total_duration > 0 and last.eval_duration >= 0, last

# Generate, whole and streamed, templated and raw.
g = client.generate(model=short, prompt="Name three colors.", options=greedy)
assert g.done and g.response, g
gs = list(client.generate(model=short, prompt="Name three colors.", options=greedy, stream=True))
assert "".join(p.response for p in gs) == g.response and gs[-1].done, (gs, g)
assert g.response == whole.message.content, (g.response, whole.message.content)
gsys = client.generate(model=chat_model, prompt="Name three colors.", system="Answer in French.", options=greedy)
assert gsys.response and gsys.response != g.response, gsys
raw = client.generate(model=chat_model, prompt="The capital of France is", raw=True, options=greedy)
raws = list(client.generate(model=chat_model, prompt="The capital of France is", raw=True, options=greedy,
                            stream=True))
assert raw.response and "".join(p.response for p in raws) == raw.response, (raw, raws)

# The stream is NDJSON: one object a line, the last one done.
with httpx.stream("POST", f"{base}/api/generate", headers=auth, timeout=300,
                  json={"model": chat_model, "prompt": "Hi", "options": {"num_predict": 5, "temperature": 0}}) as r:
    assert r.status_code == 200 and r.headers["content-type"] == "application/x-ndjson", r.headers
    lines = [json.loads(line) for line in r.iter_lines() if line]
assert lines[-1]["done"] is True and all(not x["done"] for x in lines[:-1]), lines
for k in ("done_reason", "total_duration", "load_duration", "prompt_eval_count", "prompt_eval_duration",
          "eval_count", "eval_duration"):
    assert isinstance(lines[-1][k], (int, str)), (k, lines[-1])

# Options: num_predict stops at that many tokens with done_reason "length"; stop strings.
story = [{"role": "user", "content": "Write a long story about a dragon."}]
short_answer = client.chat(model=chat_model, messages=story, options={"temperature": 0, "num_predict": 3})
assert short_answer.done_reason == "length" and short_answer.eval_count == 3, short_answer
full = client.chat(model=chat_model, messages=story, options={"temperature": 0, "num_predict": 40}).message.content
words = [w for w in full.split() if len(w) > 3 and full.index(w) > 10]
assert words, full
cut = client.chat(model=chat_model, messages=story,
                  options={"temperature": 0, "num_predict": 40, "stop": [words[0]]})
assert cut.done_reason == "stop" and words[0] not in cut.message.content, (words[0], cut)
assert full.startswith(cut.message.content), (full, cut.message.content)
seeded = [client.chat(model=chat_model, messages=story, options={"temperature": 1, "seed": 5, "num_predict": 12,
                                                                  "top_k": 40, "top_p": 0.95, "min_p": 0.05,
                                                                  "repeat_penalty": 1.1, "num_thread": 2,
                                                                  "use_mmap": True, "num_ctx": 1024})
          for _ in range(2)]
assert seeded[0].message.content == seeded[1].message.content, seeded
refused(lambda: client.chat(model=chat_model, messages=ask, options={"frobnicate": 1, "mirostat": 2}), 400,
        "mirostat")
refused(lambda: client.chat(model=chat_model, messages=ask, options={"frobnicate": 1}), 400, "frobnicate")
refused(lambda: client.chat(model=chat_model, messages=ask, options={"num_ctx": 4096}), 400, "num_ctx", "1024")
refused(lambda: client.chat(model=chat_model, messages=ask, think=True), 400, "does not support thinking")
refused(lambda: client.chat(model=chat_model, messages=[{"role": "user", "content": "x", "images": [b"\x89PNG"]}]),
        400, "images")
refused(lambda: client.generate(model=chat_model, prompt="x", template="{{ .Prompt }}"), 400, "template")

# format: "json" and a schema, enforced by the grammar.
j = client.chat(model=chat_model, messages=[{"role": "user", "content": "Describe a cat as JSON."}],
                format="json", options={"temperature": 0, "num_predict": 200})
assert j.done_reason == "stop", j
assert isinstance(json.loads(j.message.content), dict), j.message.content
schema = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 20}, "age": {"type": "integer", "minimum": 0},
                   "colors": {"type": "array", "items": {"enum": ["black", "white", "orange"]}, "maxItems": 3}},
    "required": ["name", "age", "colors"],
    "additionalProperties": False,
}
for fmt_client in (client.chat, client.generate):
    for seed in (1, 2):
        kw = {"messages": [{"role": "user", "content": "Describe a cat."}]} if fmt_client == client.chat else {
            "prompt": "Describe a cat."}
        r = fmt_client(model=chat_model, format=schema, options={"temperature": 1, "seed": seed, "num_predict": 200},
                       **kw)
        text = r.message.content if fmt_client == client.chat else r.response
        jsonschema.validate(json.loads(text), schema)
raw_json = client.generate(model=chat_model, prompt='{"answer": ', raw=True, format={"type": "integer"},
                           options={"num_predict": 20, "temperature": 0})
assert isinstance(json.loads(raw_json.response), int), raw_json

# Tools: the call comes back in Ollama's shape, its arguments an object; the result goes back
# as a tool message naming the tool.
weather = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 30}},
                       "required": ["city"]},
    },
}
# SmolLM2-135M calls tools reliably only after examples: two earlier calls in the history (in
# Ollama's shape, arguments as objects), then a new question.
def asked(city):
    return {"role": "user", "content": f"What is the weather in {city}?"}


def called(city):
    return {"role": "assistant", "content": "",
            "tool_calls": [{"function": {"name": "get_weather", "arguments": {"city": city}}}]}


ask_weather = [asked("London"), called("London"), asked("Paris"), called("Paris"), asked("Rome")]
t = client.chat(model=chat_model, messages=ask_weather, tools=[weather], options={"temperature": 0, "num_predict": 80})
assert t.message.tool_calls, t
call = t.message.tool_calls[0]
assert call.function.name == "get_weather" and call.function.arguments == {"city": "Rome"}, call
ts = list(client.chat(model=chat_model, messages=ask_weather, tools=[weather],
                      options={"temperature": 0, "num_predict": 80}, stream=True))
streamed_calls = [c for p in ts for c in (p.message.tool_calls or [])]
assert [(c.function.name, c.function.arguments) for c in streamed_calls] == [
    (c.function.name, c.function.arguments) for c in t.message.tool_calls], (ts, t)
assert ts[-1].done and ts[-1].done_reason == "stop", ts[-1]


def get_time(zone: str) -> str:
    """Current time in a time zone.

    Args:
      zone: the zone, e.g. CET
    """
    return "14:05"


follow = client.chat(model=chat_model, options={"temperature": 0, "num_predict": 30}, tools=[weather, get_time],
                     messages=ask_weather + [t.message,
                                             {"role": "tool", "content": "sunny, 21 C", "tool_name": "get_weather"}])
assert follow.done, follow
assert follow.message.content or follow.message.tool_calls, follow

# Embeddings: batched, the same vectors as /v1/embeddings; dimensions; the legacy route.
texts = ["a cat sits on the mat", "the stock market fell", "un chat"]
e = client.embed(model=emb_model, input=texts)
assert len(e.embeddings) == 3 and all(len(v) == 384 for v in e.embeddings), len(e.embeddings)
assert e.prompt_eval_count > 0 and e.total_duration > 0, e
openai_client = OpenAI(base_url=v1, api_key=key, max_retries=0, timeout=120)
ref = openai_client.embeddings.create(model="all-MiniLM-L6-v2", input=texts).data
for got, want in zip(e.embeddings, ref):
    assert max(abs(a - b) for a, b in zip(got, want.embedding)) < 1e-6
one = client.embed(model="all-minilm-l6-v2", input=texts[0])
assert one.embeddings == [e.embeddings[0]], "a string embeds as a list of one"
small = client.embed(model=emb_model, input=texts, dimensions=64)
assert all(len(v) == 64 and abs(math.sqrt(sum(x * x for x in v)) - 1) < 1e-4 for v in small.embeddings)
legacy = client.embeddings(model=emb_model, prompt=texts[0])
assert max(abs(a - b) for a, b in zip(legacy.embedding, e.embeddings[0])) < 1e-6
refused(lambda: client.embed(model=emb_model, input=["word " * 400], truncate=False), 400, "truncate")
assert len(client.embed(model=emb_model, input=["word " * 400]).embeddings) == 1
refused(lambda: client.embed(model=chat_model, input="x"), 400, "does not support embeddings")
refused(lambda: client.chat(model=emb_model, messages=ask), 400, "embedding model")

# Loaded models; a load request; keep_alive accepted (the server has no --idle-unload).
ps = client.ps().models
assert {p.model for p in ps} == {chat_model, emb_model}, ps
assert all(p.expires_at is not None for p in ps) and ps[0].context_length == 1024, ps
loaded = client.generate(model=chat_model, keep_alive="5m")
assert loaded.done and loaded.done_reason == "load" and loaded.response == "", loaded
client.chat(model=chat_model, messages=ask, options=greedy, keep_alive=-1)
refused(lambda: client.generate(model=chat_model, keep_alive=0), 400, "--idle-unload")

# Model management is not anelm's; unknown models are 404s, as Ollama answers.
refused(lambda: client.pull(chat_model), 501, "not supported by anelm")
refused(lambda: client.delete(chat_model), 501, "not supported by anelm")
refused(lambda: client.copy(chat_model, "other"), 501, "not supported by anelm")
refused(lambda: client.create(model="other", from_=chat_model), 501, "not supported by anelm")
refused(lambda: client.chat(model="no-such-model", messages=ask), 404, "model 'no-such-model' not found")
refused(lambda: client.generate(model="llama3.2:latest", prompt="x"), 404, "not found")
refused(lambda: client.embed(model="nomic-embed-text", input="x"), 404, "not found")
refused(lambda: client.show("no-such-model"), 404, "not found")

print(f"ok: ollama {package_version('ollama')} against anelm (API {version})")
