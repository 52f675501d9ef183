"""Structured outputs and tool calls through the official openai client (called by tests/server.rs).

Usage: python structured_outputs.py BASE_URL API_KEY
Exits non-zero with a message on the first failed check. Checks:
- `client.chat.completions.parse` with a pydantic model gives a parsed object;
- 30 generated JSON schemas (nested objects, arrays with min/max items, unique arrays, enums,
  bounded integers, string formats, optional fields), sampled at temperature 1: every answer parses and validates
  (`jsonschema`);
- `json_object` gives an object; streaming gives the same text as non-streaming at temperature 0;
- the non-standard `grammar` field (Lark and regex);
- invalid and unsatisfiable schemas and grammars are 400s that say why;
- tools: `tool_choice="required"` and a named function give one call whose arguments validate,
  streamed (delta.tool_calls) and not; a follow-up with the tool's result is answered;
  `tool_choice="none"` gives text; a malformed tool schema is a 400.
"""
import json
import random
import sys
from concurrent.futures import ThreadPoolExecutor
from typing import List, Literal, Optional

import jsonschema
from openai import BadRequestError, OpenAI
from pydantic import BaseModel, Field

base, key = sys.argv[1], sys.argv[2]
client = OpenAI(base_url=base, api_key=key, max_retries=0, timeout=300)
model = client.models.list().data[0].id


class City(BaseModel):
    name: str = Field(max_length=24)
    country: str = Field(max_length=24)
    population_millions: int = Field(ge=0, le=40)
    landmarks: List[Literal["museum", "tower", "bridge", "park"]] = Field(min_length=1, max_length=3)
    capital: Optional[bool] = None


parsed = client.chat.completions.parse(
    model=model,
    messages=[{"role": "user", "content": "Describe Paris."}],
    response_format=City,
    max_tokens=200,
    temperature=0,
)
city = parsed.choices[0].message.parsed
assert isinstance(city, City), parsed
assert parsed.choices[0].finish_reason == "stop", parsed.choices[0]


def gen_schema(rng, depth=0):
    """A random schema whose every instance is short (bounded strings, arrays and integers)."""
    kinds = ["string", "integer", "enum", "boolean", "array"] + (["object"] * 2 if depth < 2 else [])
    kind = rng.choice(kinds)
    if kind == "string":
        if rng.random() < 0.25:
            return {"type": "string", "format": rng.choice(["date", "date-time", "email", "uuid", "ipv4"])}
        return {"type": "string", "maxLength": rng.randint(1, 12)}
    if kind == "integer":
        lo = rng.randint(-50, 50)
        return {"type": "integer", "minimum": lo, "maximum": lo + rng.randint(0, 500)}
    if kind == "enum":
        return {"enum": rng.sample(["red", "green", "blue", "north", "south", "yes", "no", "x"], rng.randint(1, 4))}
    if kind == "boolean":
        return {"type": "boolean"}
    if kind == "array":
        lo = rng.randint(0, 2)
        items = gen_schema(rng, depth + 1)
        array = {"type": "array", "items": items, "minItems": lo, "maxItems": lo + rng.randint(0, 2)}
        if items.get("type") == "string" and rng.random() < 0.5:
            array["uniqueItems"] = True  # what pydantic's set[...] writes
        return array
    props = {f"k{i}_{rng.choice(['id', 'name', 'size', 'tag'])}": gen_schema(rng, depth + 1) for i in range(rng.randint(1, 4))}
    required = [k for k in props if rng.random() < 0.7]
    return {"type": "object", "properties": props, "required": required, "additionalProperties": False}


def object_schema(rng):
    s = gen_schema(rng, 1)
    return s if s.get("type") == "object" else {
        "type": "object", "properties": {"value": s}, "required": ["value"], "additionalProperties": False}


rng = random.Random(1234)
schemas = [object_schema(rng) for _ in range(30)]


def ask(i_schema):
    i, schema = i_schema
    r = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "Fill in this form with plausible values."}],
        response_format={"type": "json_schema", "json_schema": {"name": f"form{i}", "schema": schema, "strict": True}},
        max_tokens=400,
        temperature=1,
        seed=i,
    )
    return i, schema, r


with ThreadPoolExecutor(max_workers=4) as pool:
    for i, schema, r in pool.map(ask, enumerate(schemas)):
        text = r.choices[0].message.content
        assert r.choices[0].finish_reason == "stop", (i, r.choices[0].finish_reason, text, schema)
        try:
            value = json.loads(text)
            jsonschema.validate(value, schema, format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER)
        except Exception as e:
            raise AssertionError(f"schema {i}: {e}\nschema: {json.dumps(schema)}\nanswer: {text!r}")

obj = client.chat.completions.create(
    model=model, messages=[{"role": "user", "content": "Give me a JSON object about cats."}],
    response_format={"type": "json_object"}, max_tokens=300, temperature=0,
)
if obj.choices[0].finish_reason == "stop":
    assert isinstance(json.loads(obj.choices[0].message.content), dict), obj
else:
    assert obj.choices[0].message.content.startswith("{"), obj

# Streaming gives exactly the non-streamed text at temperature 0.
fmt = {"type": "json_schema", "json_schema": {"name": "city", "schema": City.model_json_schema()}}
whole = client.chat.completions.create(
    model=model, messages=[{"role": "user", "content": "Describe Rome."}], response_format=fmt,
    max_tokens=200, temperature=0,
).choices[0].message.content
pieces = []
for chunk in client.chat.completions.create(
    model=model, messages=[{"role": "user", "content": "Describe Rome."}], response_format=fmt,
    max_tokens=200, temperature=0, stream=True,
):
    for c in chunk.choices:
        if c.delta.content:
            pieces.append(c.delta.content)
assert "".join(pieces) == whole, ("".join(pieces), whole)
City.model_validate_json(whole)

# The non-standard grammar field, both endpoints.
yn = client.chat.completions.create(
    model=model, messages=[{"role": "user", "content": "Is water wet?"}], max_tokens=8, temperature=1,
    extra_body={"grammar": 'start: "yes" | "no"'},
)
assert yn.choices[0].message.content in ("yes", "no"), yn
rx = client.completions.create(
    model=model, prompt="The year is", max_tokens=10, temperature=1, extra_body={"grammar": {"regex": " [12][0-9]{3}"}},
)
text = rx.choices[0].text
assert len(text) == 5 and text[0] == " " and text[1:].isdigit(), text

# Bad grammars: a 400 that names the field and says why.
for kwargs, param in [
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nope"}}}},
     "response_format"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema":
        {"type": "integer", "minimum": 5, "maximum": 1}}}}, "response_format"),
    ({"extra_body": {"grammar": "start: missing_rule"}}, "grammar"),
    ({"extra_body": {"grammar": {"regex": "("}}}, "grammar"),
]:
    try:
        client.chat.completions.create(model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=4, **kwargs)
    except BadRequestError as e:
        assert e.body.get("param") == param, e.body
        assert "grammar is invalid" in e.body.get("message", ""), e.body
    else:
        raise AssertionError(f"accepted {kwargs}")

# Tools. SmolLM2's template does not lay out tools, so anelm's generic tool prompt does.
weather = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 30},
                           "unit": {"enum": ["celsius", "fahrenheit"]}},
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
    },
}
clock = {"type": "function", "function": {"name": "get_time", "parameters": {
    "type": "object", "properties": {"zone": {"type": "string", "maxLength": 20}}, "required": ["zone"],
    "additionalProperties": False}}}
ask_weather = [{"role": "user", "content": "What is the weather in Paris?"}]
for choice, want in [("required", None), ({"type": "function", "function": {"name": "get_time"}}, "get_time")]:
    r = client.chat.completions.create(model=model, messages=ask_weather, tools=[weather, clock], tool_choice=choice,
                                       max_tokens=120, temperature=1, seed=3)
    msg = r.choices[0].message
    assert r.choices[0].finish_reason == "tool_calls", r
    assert msg.tool_calls and len(msg.tool_calls) == 1, msg
    call = msg.tool_calls[0]
    assert call.type == "function" and call.id, call
    if want:
        assert call.function.name == want, call
    schema = {"get_weather": weather, "get_time": clock}[call.function.name]["function"]["parameters"]
    jsonschema.validate(json.loads(call.function.arguments), schema)
    # Streamed: the same call arrives as delta.tool_calls chunks.
    name, args, ids, finish = "", "", set(), None
    for chunk in client.chat.completions.create(model=model, messages=ask_weather, tools=[weather, clock],
                                                tool_choice=choice, max_tokens=120, temperature=1, seed=3, stream=True):
        for c in chunk.choices:
            for tc in c.delta.tool_calls or []:
                assert tc.index == 0, tc
                if tc.id:
                    ids.add(tc.id)
                if tc.function and tc.function.name:
                    name += tc.function.name
                if tc.function and tc.function.arguments:
                    args += tc.function.arguments
            if c.finish_reason:
                finish = c.finish_reason
    assert finish == "tool_calls" and len(ids) == 1, (finish, ids)
    assert name == call.function.name and json.loads(args) == json.loads(call.function.arguments), (name, args, call)

# The tool's result goes back as a tool message and is answered.
call = r.choices[0].message.tool_calls[0]
follow = client.chat.completions.create(
    model=model,
    messages=ask_weather + [
        {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
        {"role": "tool", "tool_call_id": call.id, "content": json.dumps({"zone": "CET", "time": "14:05"})},
    ],
    tools=[weather, clock], tool_choice="none", max_tokens=40, temperature=0,
)
assert follow.choices[0].message.content and not follow.choices[0].message.tool_calls, follow
none = client.chat.completions.create(model=model, messages=ask_weather, tools=[weather], tool_choice="none",
                                      max_tokens=20, temperature=0)
assert none.choices[0].message.tool_calls is None and none.choices[0].finish_reason in ("stop", "length"), none
auto = client.chat.completions.create(model=model, messages=ask_weather, tools=[weather], max_tokens=60, temperature=0)
assert auto.choices[0].finish_reason in ("stop", "length", "tool_calls"), auto

# A tool whose schema is malformed, forced: a 400 naming tools.
bad_tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "nope"}}}
try:
    client.chat.completions.create(model=model, messages=ask_weather, tools=[bad_tool], tool_choice="required",
                                   max_tokens=8)
except BadRequestError as e:
    assert e.body.get("param") == "tools", e.body
else:
    raise AssertionError("a malformed tool schema was accepted")

print("ok: structured outputs and tools")
