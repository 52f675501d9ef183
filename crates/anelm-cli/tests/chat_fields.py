"""The chat-completions fields that clients send and anelm used to refuse, through the official
openai client (called by tests/chat_fields.rs): logit_bias (restricting an answer to label
tokens, and banning one), the legacy functions/function_call, reasoning_effort,
repetition_penalty, modalities, and null for optional fields.

Usage: python chat_fields.py BASE_URL API_KEY YES_ID NO_ID
"""
import json
import sys

import openai
from openai import OpenAI

base, key, yes_id, no_id = sys.argv[1:5]
client = OpenAI(base_url=base, api_key=key, max_retries=0, timeout=120)
model = client.models.list().data[0].id
ask = [{"role": "user", "content": "Is the sky green? Answer yes or no."}]

# logit_bias restricts a one-token answer to the labels.
r = client.chat.completions.create(model=model, messages=ask, max_tokens=1, temperature=0,
                                   logit_bias={yes_id: 100, no_id: 100})
label = r.choices[0].message.content
assert label.strip().lower() in ("yes", "no"), label
# Banning the label it chose gives the other one.
chosen, other = (yes_id, no_id) if label.strip().lower() == "yes" else (no_id, yes_id)
r2 = client.chat.completions.create(model=model, messages=ask, max_tokens=1, temperature=0,
                                    logit_bias={chosen: -100, other: 100})
assert r2.choices[0].message.content.strip().lower() != label.strip().lower(), (label, r2)
# Sampled answers obey the bias too.
for seed in range(5):
    r3 = client.chat.completions.create(model=model, messages=ask, max_tokens=1, temperature=1.0, seed=seed,
                                        logit_bias={yes_id: 100, no_id: 100})
    assert r3.choices[0].message.content.strip().lower() in ("yes", "no")
try:
    client.chat.completions.create(model=model, messages=ask, max_tokens=1, logit_bias={"999999999": 5})
    raise AssertionError("a bias outside the vocabulary was accepted")
except openai.BadRequestError as e:
    assert "vocabulary" in str(e), e

# The legacy functions/function_call.
functions = [{"name": "get_weather", "description": "Weather in a city",
              "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}]
msgs = [{"role": "user", "content": "What is the weather in Oslo?"}]
f = client.chat.completions.create(model=model, messages=msgs, functions=functions,
                                   function_call={"name": "get_weather"}, max_tokens=200, temperature=0)
call = f.choices[0].message.function_call
assert call is not None and call.name == "get_weather", f
assert "city" in json.loads(call.arguments)
assert f.choices[0].finish_reason == "function_call", f.choices[0].finish_reason
assert f.choices[0].message.tool_calls is None
chunks = list(client.chat.completions.create(model=model, messages=msgs, functions=functions,
                                             function_call={"name": "get_weather"}, max_tokens=200,
                                             temperature=0, stream=True))
args = "".join(c.choices[0].delta.function_call.arguments or "" for c in chunks
               if c.choices and c.choices[0].delta.function_call)
assert args == call.arguments, (args, call.arguments)
assert chunks[-1].choices[0].finish_reason == "function_call"
# A history with a legacy call and its function result.
follow = client.chat.completions.create(model=model, functions=functions, max_tokens=8, temperature=0, messages=msgs + [
    {"role": "assistant", "content": None, "function_call": {"name": "get_weather", "arguments": call.arguments}},
    {"role": "function", "name": "get_weather", "content": "sunny"},
])
assert follow.choices[0].finish_reason in ("stop", "length", "function_call"), follow

# reasoning_effort, repetition_penalty, modalities, nulls.
client.chat.completions.create(model=model, messages=ask, max_tokens=2, reasoning_effort="low")
client.chat.completions.create(model=model, messages=ask, max_tokens=2, modalities=["text"],
                               extra_body={"repetition_penalty": 1.1, "top_k": None})
client.chat.completions.create(model=model, messages=ask, max_tokens=2, temperature=None, top_p=None)
for bad, param in [({"modalities": ["audio"]}, "modalities"), ({"reasoning_effort": "max"}, "reasoning_effort")]:
    try:
        client.chat.completions.create(model=model, messages=ask, max_tokens=2, extra_body=bad)
        raise AssertionError(f"{bad} was accepted")
    except openai.BadRequestError as e:
        assert param in str(e), e
print("chat fields: ok")
