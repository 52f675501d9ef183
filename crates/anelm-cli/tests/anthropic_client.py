"""Drive a running `anelm serve` with the official anthropic client (called by tests/anthropic.rs).

Usage: python anthropic_client.py BASE_URL API_KEY [thinking]
BASE_URL is the server's `/v1` URL (the client adds `/v1/messages` itself). With `thinking`,
the server runs a template that thinks unless told not to, and only the thinking checks run.
Exits non-zero with a message on the first failed check.
"""
import json
import sys

import anthropic
import httpx
import jsonschema

base, key = sys.argv[1], sys.argv[2]
mode = sys.argv[3] if len(sys.argv) > 3 else "all"
root = base.removesuffix("/v1")
client = anthropic.Anthropic(base_url=root, api_key=key, max_retries=0, timeout=120)
MODEL = "anelm"
# Anthropic's current API (and so this client) dropped the sampling fields; anelm still takes
# `temperature`, `top_p` and `top_k` (older clients send them), here for repeatable answers.
T0 = {"temperature": 0}
USER = [{"role": "user", "content": "Name three colors."}]


def raw_events(body):
    """The stream's events as (name, data) pairs, ping included, straight from the wire."""
    events = []
    headers = {"x-api-key": key, "anthropic-version": "2023-06-01"}
    with httpx.stream("POST", f"{root}/v1/messages", json=body, headers=headers, timeout=120) as r:
        assert r.status_code == 200, (r.status_code, r.read())
        assert r.headers["content-type"].startswith("text/event-stream"), r.headers
        name = None
        for line in r.iter_lines():
            if line.startswith("event:"):
                name = line.split(":", 1)[1].strip()
            elif line.startswith("data:"):
                data = json.loads(line.split(":", 1)[1])
                assert data["type"] == name, (name, data)
                events.append((name, data))
    return events


def check_order(names):
    """Anthropic's event grammar: message_start, blocks (the first followed by a ping),
    message_delta, message_stop."""
    assert names[0] == "message_start", names
    assert names[-2:] == ["message_delta", "message_stop"], names
    assert names.count("ping") == 1, names
    inner = names[1:-2]
    if "content_block_start" in inner:
        assert inner[:2] == ["content_block_start", "ping"], names
    open_block = False
    for n in inner:
        if n == "content_block_start":
            assert not open_block, names
            open_block = True
        elif n == "content_block_delta":
            assert open_block, names
        elif n == "content_block_stop":
            assert open_block, names
            open_block = False
    assert not open_block, names


def expect_bad_request(what, call, mentions):
    try:
        call()
    except anthropic.BadRequestError as e:
        assert e.status_code == 400, e
        assert e.body["type"] == "error", e.body
        assert e.body["error"]["type"] == "invalid_request_error", e.body
        assert mentions in e.body["error"]["message"], (mentions, e.body)
    else:
        raise AssertionError(f"{what} was accepted")


def thinking_checks():
    msg = client.messages.create(
        model=MODEL, max_tokens=12, extra_body=T0, messages=USER,
        thinking={"type": "enabled", "budget_tokens": 1024},
    )
    assert msg.content and msg.content[0].type == "thinking", msg
    thought = msg.content[0].thinking
    assert thought and not any(b.type == "thinking" for b in msg.content[1:]), msg
    events = raw_events({"model": MODEL, "max_tokens": 12, "temperature": 0, "messages": USER, "stream": True,
                         "thinking": {"type": "enabled", "budget_tokens": 1024}})
    check_order([n for n, _ in events])
    starts = [d["content_block"]["type"] for n, d in events if n == "content_block_start"]
    assert starts[0] == "thinking", starts
    streamed = "".join(d["delta"]["thinking"] for n, d in events
                       if n == "content_block_delta" and d["delta"]["type"] == "thinking_delta")
    assert streamed.strip() == thought, (streamed, thought)
    off = client.messages.create(
        model=MODEL, max_tokens=12, extra_body=T0, messages=USER, thinking={"type": "disabled"},
    )
    assert off.content and all(b.type == "text" for b in off.content), off
    print("thinking checks passed")


if mode == "thinking":
    thinking_checks()
    sys.exit(0)

# A plain message.
full = client.messages.create(model=MODEL, max_tokens=24, extra_body=T0, messages=USER)
assert full.type == "message" and full.role == "assistant" and full.id.startswith("msg_"), full
assert full.model == MODEL, full.model
assert len(full.content) == 1 and full.content[0].type == "text" and full.content[0].text, full.content
text = full.content[0].text
assert full.stop_reason in ("end_turn", "max_tokens"), full.stop_reason
assert full.stop_sequence is None, full
assert full.usage.input_tokens > 0 and full.usage.output_tokens > 0, full.usage

# count_tokens counts the prompt create() prefilled.
counted = client.messages.count_tokens(model=MODEL, messages=USER)
assert counted.input_tokens == full.usage.input_tokens, (counted, full.usage)

# A system prompt (string, and as text blocks) reaches the model.
system = "You are a pirate. Answer like one."
pirate = client.messages.create(model=MODEL, max_tokens=16, extra_body=T0, system=system, messages=USER)
# (SmolLM2's template has a default system prompt, which this one replaces.)
assert pirate.content[0].text and pirate.usage.input_tokens != full.usage.input_tokens, pirate
blocks = client.messages.create(
    model=MODEL, max_tokens=16, extra_body=T0, messages=USER,
    system=[{"type": "text", "text": system, "cache_control": {"type": "ephemeral"}}],
    metadata={"user_id": "test"},
)
assert blocks.content == pirate.content and blocks.usage == pirate.usage, (blocks, pirate)
assert client.messages.count_tokens(model=MODEL, system=system, messages=USER).input_tokens == pirate.usage.input_tokens

# Multi-turn, content as blocks.
turns = [
    {"role": "user", "content": [{"type": "text", "text": "My name is Ada."}]},
    {"role": "assistant", "content": [{"type": "text", "text": "Nice to meet you, Ada."}]},
    {"role": "user", "content": "What is my name?"},
]
multi = client.messages.create(model=MODEL, max_tokens=16, extra_body=T0, messages=turns)
assert multi.content[0].text and multi.usage.input_tokens > full.usage.input_tokens, multi
assert client.messages.count_tokens(model=MODEL, messages=turns).input_tokens == multi.usage.input_tokens

# Streaming: the events in Anthropic's order, the same text as the whole answer.
events = raw_events({"model": MODEL, "max_tokens": 24, "temperature": 0, "messages": USER, "stream": True})
names = [n for n, _ in events]
check_order(names)
start = events[0][1]["message"]
assert start["id"].startswith("msg_") and start["content"] == [] and start["stop_reason"] is None, start
assert start["usage"]["input_tokens"] == full.usage.input_tokens, start
streamed = "".join(d["delta"]["text"] for n, d in events if n == "content_block_delta")
assert streamed == text, f"streamed {streamed!r} != whole {text!r}"
delta = events[-2][1]
assert delta["delta"]["stop_reason"] == full.stop_reason, delta
assert delta["usage"]["output_tokens"] == full.usage.output_tokens, delta
# The same through the client's stream helper and its raw event iterator.
with client.messages.stream(model=MODEL, max_tokens=24, extra_body=T0, messages=USER) as s:
    pieces = list(s.text_stream)
    final = s.get_final_message()
assert "".join(pieces) == text and final.content[0].text == text, (pieces, final)
assert final.stop_reason == full.stop_reason and final.usage == full.usage, (final, full)
kinds = [e.type for e in client.messages.create(model=MODEL, max_tokens=24, extra_body=T0, messages=USER, stream=True)]
assert kinds[0] == "message_start" and kinds[-1] == "message_stop", kinds

# stop_sequences: a word the answer writes ends it, and is named.
words = [w for w in text.split() if len(w) > 3]
assert words, f"no word to stop at in {text!r}"
stop = words[min(1, len(words) - 1)]
cut = client.messages.create(model=MODEL, max_tokens=24, extra_body=T0, messages=USER,
                             stop_sequences=["@@never@@", stop])
assert cut.stop_reason == "stop_sequence" and cut.stop_sequence == stop, (stop, cut)
assert text.startswith(cut.content[0].text if cut.content else "") and stop not in "".join(
    b.text for b in cut.content), (stop, cut)
with client.messages.stream(model=MODEL, max_tokens=24, extra_body=T0, messages=USER,
                            stop_sequences=[stop]) as s:
    streamed_cut = s.get_final_message()
assert streamed_cut.stop_reason == "stop_sequence" and streamed_cut.stop_sequence == stop, streamed_cut
assert [b.text for b in streamed_cut.content] == [b.text for b in cut.content], (streamed_cut, cut)

# max_tokens says so.
one = client.messages.create(model=MODEL, max_tokens=1, extra_body=T0, messages=USER)
assert one.stop_reason == "max_tokens" and one.usage.output_tokens == 1, one

# Tools: a forced call to a named tool is a tool_use block whose input matches the schema.
schema = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 20},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
    },
    "required": ["city", "unit"],
}
tools = [{"name": "get_weather", "description": "The weather in a city.", "input_schema": schema}]
ask = [{"role": "user", "content": "What is the weather in Paris?"}]
called = client.messages.create(model=MODEL, max_tokens=60, extra_body=T0, messages=ask, tools=tools,
                                tool_choice={"type": "tool", "name": "get_weather"})
uses = [b for b in called.content if b.type == "tool_use"]
assert len(uses) == 1 and uses[0].name == "get_weather" and uses[0].id.startswith("toolu_"), called
jsonschema.validate(uses[0].input, schema)
assert called.stop_reason == "tool_use", called.stop_reason
assert client.messages.count_tokens(model=MODEL, messages=ask, tools=tools).input_tokens == called.usage.input_tokens
# Streamed: a tool_use block filled by input_json_delta, the same input.
events = raw_events({"model": MODEL, "max_tokens": 60, "temperature": 0, "messages": ask, "tools": tools,
                     "tool_choice": {"type": "tool", "name": "get_weather"}, "stream": True})
check_order([n for n, _ in events])
tool_starts = [d["content_block"] for n, d in events
               if n == "content_block_start" and d["content_block"]["type"] == "tool_use"]
assert len(tool_starts) == 1 and tool_starts[0]["name"] == "get_weather", events
partial = "".join(d["delta"]["partial_json"] for n, d in events
                  if n == "content_block_delta" and d["delta"]["type"] == "input_json_delta")
assert json.loads(partial) == uses[0].input, (partial, uses[0].input)
assert events[-2][1]["delta"]["stop_reason"] == "tool_use", events[-2]
with client.messages.stream(model=MODEL, max_tokens=60, extra_body=T0, messages=ask, tools=tools,
                            tool_choice={"type": "tool", "name": "get_weather"}) as s:
    streamed_call = s.get_final_message()
assert [b.input for b in streamed_call.content if b.type == "tool_use"] == [uses[0].input], streamed_call
# tool_choice any forces a call too; none answers in text.
anycall = client.messages.create(model=MODEL, max_tokens=60, extra_body=T0, messages=ask, tools=tools,
                                 tool_choice={"type": "any"})
assert anycall.stop_reason == "tool_use" and any(b.type == "tool_use" for b in anycall.content), anycall
plain = client.messages.create(model=MODEL, max_tokens=16, extra_body=T0, messages=ask, tools=tools,
                               tool_choice={"type": "none"})
assert plain.stop_reason != "tool_use" and all(b.type == "text" for b in plain.content), plain

# The result goes back as a tool_result turn, and the model answers it.
followup = ask + [
    {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in called.content]},
    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": uses[0].id,
                                  "content": [{"type": "text", "text": "18 degrees and sunny"}]}]},
]
answer = client.messages.create(model=MODEL, max_tokens=24, extra_body=T0, messages=followup, tools=tools)
assert answer.content and answer.stop_reason in ("end_turn", "max_tokens", "tool_use"), answer
assert answer.usage.input_tokens > called.usage.input_tokens, (answer.usage, called.usage)

# The key: x-api-key (the client's default) above; a bearer token works too; none or a wrong one
# is an authentication error.
bearer = anthropic.Anthropic(base_url=root, auth_token=key, api_key=None, max_retries=0, timeout=120)
assert bearer.messages.create(model=MODEL, max_tokens=2, messages=USER).content is not None
for wrong in (anthropic.Anthropic(base_url=root, api_key="wrong", max_retries=0),):
    try:
        wrong.messages.create(model=MODEL, max_tokens=2, messages=USER)
    except anthropic.AuthenticationError as e:
        assert e.status_code == 401 and e.body["error"]["type"] == "authentication_error", e.body
    else:
        raise AssertionError("a wrong key was accepted")

# Bad input: Anthropic errors the client raises as BadRequestError, naming what is wrong.
expect_bad_request(
    "a request without max_tokens",
    lambda: client.post("/v1/messages", cast_to=object, body={"model": MODEL, "messages": USER}),
    "max_tokens",
)
expect_bad_request(
    "a system role in messages",
    lambda: client.messages.create(model=MODEL, max_tokens=4, messages=[{"role": "system", "content": "x"}]),
    "messages[0].role",
)
expect_bad_request(
    "an unknown field",
    lambda: client.messages.create(model=MODEL, max_tokens=4, messages=USER, extra_body={"frobnicate": 1, **T0}),
    "frobnicate",
)
expect_bad_request(
    "an image block",
    lambda: client.messages.create(model=MODEL, max_tokens=4, messages=[{"role": "user", "content": [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AA=="}}]}]),
    "image",
)
expect_bad_request(
    "a server tool",
    lambda: client.messages.create(model=MODEL, max_tokens=4, messages=USER,
                                   tools=[{"type": "web_search_20250305", "name": "web_search"}]),
    "server tool",
)
expect_bad_request(
    "max_tokens beyond the context",
    lambda: client.messages.create(model=MODEL, max_tokens=100000, messages=USER),
    "max_tokens",
)
print("anthropic client checks passed")
