"""Drive anelm's Responses API with the official openai client and the openai-agents SDK
(called by tests/responses.rs).

Usage: python responses_client.py BASE_URL API_KEY
Exits non-zero on the first failed check.
"""
import asyncio
import json
import sys

import openai
from openai import AsyncOpenAI, OpenAI
from pydantic import BaseModel

base, key = sys.argv[1:3]
client = OpenAI(base_url=base, api_key=key, max_retries=0, timeout=120)
model = client.models.list().data[0].id


def expect_error(kind, fn, needle):
    try:
        fn()
    except kind as e:
        assert needle in str(e), f"expected '{needle}' in: {e}"
        return
    raise AssertionError(f"expected {kind.__name__} containing '{needle}'")


# --- A whole response, the same text as chat completions -----------------------------------
r = client.responses.create(model=model, input="Name a colour.", max_output_tokens=12, temperature=0)
assert r.object == "response" and r.id.startswith("resp_"), r
assert r.status in ("completed", "incomplete"), r.status
assert r.output[0].type == "message" and r.output_text, r.output
assert r.usage.input_tokens > 0 and 0 < r.usage.output_tokens <= 12, r.usage
chat = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Name a colour."}],
                                      max_tokens=12, temperature=0)
assert r.output_text == chat.choices[0].message.content, (r.output_text, chat.choices[0].message.content)

# Instructions and items.
r2 = client.responses.create(model=model, instructions="Answer in one word.",
                             input=[{"role": "user", "content": [{"type": "input_text", "text": "Name a fruit."}]}],
                             max_output_tokens=8, temperature=0)
chat2 = client.chat.completions.create(model=model, messages=[{"role": "system", "content": "Answer in one word."},
                                                              {"role": "user", "content": "Name a fruit."}],
                                       max_tokens=8, temperature=0)
assert r2.output_text == chat2.choices[0].message.content

# --- Streaming: the semantic events in order, the same text --------------------------------
events = list(client.responses.create(model=model, input="Name a colour.", max_output_tokens=12, temperature=0,
                                      stream=True))
kinds = [e.type for e in events]
assert kinds[:2] == ["response.created", "response.in_progress"], kinds
assert kinds[-1] == "response.completed", kinds
order = ["response.output_item.added", "response.content_part.added", "response.output_text.delta",
         "response.output_text.done", "response.content_part.done", "response.output_item.done"]
positions = [kinds.index(k) for k in order]
assert positions == sorted(positions), kinds
assert [e.sequence_number for e in events] == list(range(len(events)))
text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
assert text == r.output_text, (text, r.output_text)
assert events[-1].response.output_text == text
with client.responses.stream(model=model, input="Name a colour.", max_output_tokens=12, temperature=0) as s:
    for _ in s:
        pass
    final = s.get_final_response()
assert final.output_text == r.output_text

# --- Stored responses continue a conversation ----------------------------------------------
first = client.responses.create(model=model, input="My name is Ada. Remember it.", max_output_tokens=8,
                                temperature=0)
follow = client.responses.create(model=model, previous_response_id=first.id, input="What is my name?",
                                 max_output_tokens=8, temperature=0)
assert follow.previous_response_id == first.id
alone = client.responses.create(model=model, input="What is my name?", max_output_tokens=8, temperature=0,
                                store=False)
# The continuation carried the earlier turns: its prompt is longer than the question alone.
assert follow.usage.input_tokens > alone.usage.input_tokens + first.usage.output_tokens, (follow.usage, alone.usage)
got = client.responses.retrieve(first.id)
assert got.id == first.id and got.output_text == first.output_text
client.responses.delete(first.id)
expect_error(openai.NotFoundError, lambda: client.responses.retrieve(first.id), first.id)
expect_error(openai.BadRequestError,
             lambda: client.responses.create(model=model, previous_response_id=first.id, input="x"),
             "previous_response_id")
expect_error(openai.NotFoundError, lambda: client.responses.retrieve(alone.id), alone.id)  # store=False

# --- Structured outputs --------------------------------------------------------------------
class Colour(BaseModel):
    name: str
    warm: bool


parsed = client.responses.parse(model=model, input="Describe the colour red.", text_format=Colour,
                                max_output_tokens=64, temperature=0)
assert isinstance(parsed.output_parsed, Colour), parsed.output_text
js = client.responses.create(model=model, input="Give a JSON object.", max_output_tokens=64, temperature=0,
                             text={"format": {"type": "json_object"}})
if js.status == "completed":
    assert isinstance(json.loads(js.output_text), dict), js.output_text
else:  # cut by max_output_tokens: said so
    assert js.status == "incomplete" and js.incomplete_details.reason == "max_output_tokens", js

# --- Function tools ------------------------------------------------------------------------
tools = [{"type": "function", "name": "get_weather", "description": "Weather in a city",
          "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"],
                         "additionalProperties": False}, "strict": True}]
call_r = client.responses.create(model=model, input="What is the weather in Oslo?", tools=tools,
                                 tool_choice="required", max_output_tokens=64, temperature=0)
calls = [o for o in call_r.output if o.type == "function_call"]
assert calls and calls[0].name == "get_weather", call_r.output
assert "city" in json.loads(calls[0].arguments)
streamed = list(client.responses.create(model=model, input="What is the weather in Oslo?", tools=tools,
                                        tool_choice="required", max_output_tokens=64, temperature=0, stream=True))
args = "".join(e.delta for e in streamed if e.type == "response.function_call_arguments.delta")
assert args == calls[0].arguments, (args, calls[0].arguments)
assert any(e.type == "response.function_call_arguments.done" for e in streamed)
after = client.responses.create(model=model, tools=tools, max_output_tokens=16, temperature=0, input=[
    {"role": "user", "content": "What is the weather in Oslo?"},
    {"type": "function_call", "call_id": calls[0].call_id, "name": "get_weather", "arguments": calls[0].arguments},
    {"type": "function_call_output", "call_id": calls[0].call_id, "output": "sunny, 21 C"},
])
assert after.status in ("completed", "incomplete"), after

# --- Bad input -----------------------------------------------------------------------------
expect_error(openai.BadRequestError, lambda: client.responses.create(model=model, input="x", frobnicate=1)
             if False else client.responses.create(model=model, input="x", extra_body={"frobnicate": 1}),
             "frobnicate")
expect_error(openai.BadRequestError,
             lambda: client.responses.create(model=model, input="x", tools=[{"type": "web_search"}]), "web_search")
expect_error(openai.BadRequestError,
             lambda: client.responses.create(model=model, input=[{"role": "user", "content": [
                 {"type": "input_image", "image_url": "http://x/y.png"}]}]), "input_image")

# --- The Agents SDK runs an agent with a function tool to its final output -----------------
from agents import Agent, ModelSettings, OpenAIResponsesModel, Runner, function_tool, set_tracing_disabled

set_tracing_disabled(True)
called = []


@function_tool
def get_weather(city: str) -> str:
    """The weather in a city."""
    called.append(city)
    return f"It is sunny in {city}."


agent = Agent(name="weather", instructions="Use the tool, then answer briefly.", tools=[get_weather],
              model=OpenAIResponsesModel(model=model, openai_client=AsyncOpenAI(base_url=base, api_key=key,
                                                                                max_retries=0)),
              model_settings=ModelSettings(tool_choice="required", temperature=0, max_tokens=48))
result = asyncio.run(Runner.run(agent, "What is the weather in Oslo?", max_turns=4))
assert called, "the agent never called its tool"
assert isinstance(result.final_output, str) and result.final_output, result
print("responses: ok")
