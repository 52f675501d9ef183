"""Schemas as real code writes them: `instructor` and `pydantic-ai` with pydantic models (called
by tests/pydantic_clients.rs).

Usage: python pydantic_clients.py BASE_URL API_KEY
Exits non-zero with a message on the first failed check. Every answer's raw JSON (before pydantic
turns a list into a set) validates with `jsonschema` (formats checked, `uniqueItems` included) and
with pydantic itself. Checks:
- instructor, `Mode.TOOLS` (a forced function call) and `Mode.JSON_SCHEMA` (`response_format`),
  at temperature 1 over several seeds, with `set[str]`, `set[Literal]`, `frozenset[EmailStr]`,
  `Optional[int]`, nested and optional nested models, `Literal`, `EmailStr`, `date`, `datetime`,
  `UUID`, `constr(pattern=...)`, `dict[Literal[...], int]` (`propertyNames`);
- pydantic-ai's `Agent(OpenAIChatModel(...), output_type=Model)` (its output tool);
- one model with every format pydantic writes (`uuid4`, `ipvanyaddress`, `IPv4Network`,
  `Base64Str`, `Json[int]`, `AnyUrl`, `SecretStr`, `bytes`, `time`, `timedelta`, ...) through
  `response_format`.
"""
import datetime
import ipaddress
import json
import sys
import uuid
from typing import Literal, Optional

import instructor
import jsonschema
from openai import OpenAI
from pydantic import AnyUrl, Base64Str, BaseModel, ConfigDict, EmailStr, Field, Json, SecretStr, UUID4, constr
from pydantic_ai import Agent
from pydantic_ai.messages import ModelResponse, ToolCallPart
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.providers.openai import OpenAIProvider

base, key = sys.argv[1], sys.argv[2]
client = OpenAI(base_url=base, api_key=key, max_retries=0, timeout=300)
model = client.models.list().data[0].id
checker = jsonschema.Draft202012Validator.FORMAT_CHECKER  # pydantic writes 2020-12 schemas


class Address(BaseModel):
    model_config = ConfigDict(extra="forbid")  # a small model otherwise invents keys until max_tokens
    street: str = Field(max_length=30)
    city: str = Field(max_length=20)
    postcode: constr(pattern=r"^[0-9]{5}$")


class Person(BaseModel):
    model_config = ConfigDict(extra="forbid")  # a small model otherwise invents keys until max_tokens
    name: str = Field(max_length=24)
    email: EmailStr
    birthday: datetime.date
    age: Optional[int] = Field(default=None, ge=0, le=120)
    tags: set[constr(max_length=10)] = Field(min_length=2, max_length=4)
    roles: set[Literal["admin", "user", "guest"]] = Field(min_length=2)
    status: Literal["active", "inactive"]
    address: Address
    previous: Optional[Address] = None


class Meeting(BaseModel):
    model_config = ConfigDict(extra="forbid")  # a small model otherwise invents keys until max_tokens
    id: uuid.UUID
    starts: datetime.datetime
    attendees: frozenset[EmailStr] = Field(min_length=2, max_length=3)
    room: dict[Literal["floor", "number"], int]
    topic: Optional[str] = Field(default=None, max_length=40)


class Everything(BaseModel):
    model_config = ConfigDict(extra="forbid")  # a small model otherwise invents keys until max_tokens
    key: UUID4
    host: ipaddress.IPv4Address
    any_ip: ipaddress.IPv4Address | ipaddress.IPv6Address
    net: ipaddress.IPv4Network
    token: Base64Str = Field(max_length=16)
    count: Json[int]
    site: AnyUrl
    secret: SecretStr = Field(max_length=12)
    blob: bytes = Field(max_length=12)
    at: datetime.time
    wait: datetime.timedelta
    ratio: float = Field(gt=0, lt=1)
    step: int = Field(ge=0, le=100, multiple_of=5)
    pair: tuple[int, str]


def check(cls, raw, label):
    """`raw` (a JSON string or object) validates with jsonschema and with pydantic."""
    obj = json.loads(raw) if isinstance(raw, str) else raw
    try:
        jsonschema.validate(obj, cls.model_json_schema(), format_checker=checker)
    except jsonschema.ValidationError as e:
        sys.exit(f"{label}: the answer does not validate: {e.message}\n{json.dumps(obj)}")
    cls.model_validate(obj)
    print(f"{label}: {json.dumps(obj)}")
    return obj


prompts = {
    Person: "Invent a person with a few tags and roles, an address and a birthday.",
    Meeting: "Invent a meeting with two or three attendees.",
}
for mode in (instructor.Mode.TOOLS, instructor.Mode.JSON_SCHEMA):
    ic = instructor.from_openai(client, mode=mode)
    for cls, prompt in prompts.items():
        for seed in range(3):
            obj, completion = ic.chat.completions.create_with_completion(
                model=model, response_model=cls, max_retries=1, max_tokens=400, temperature=1, seed=seed,
                messages=[{"role": "user", "content": prompt}])
            assert isinstance(obj, cls), obj
            msg = completion.choices[0].message
            raw = msg.tool_calls[0].function.arguments if mode == instructor.Mode.TOOLS else msg.content
            check(cls, raw, f"instructor {mode.value} {cls.__name__} seed {seed}")

provider = OpenAIProvider(base_url=base, api_key=key)
for cls, prompt in prompts.items():
    for temperature in (0.0, 1.0):
        agent = Agent(OpenAIChatModel(model, provider=provider), output_type=cls, output_retries=0)
        result = agent.run_sync(prompt, model_settings={"max_tokens": 400, "temperature": temperature, "seed": 1})
        assert isinstance(result.output, cls), result.output
        calls = [p for m in result.all_messages() if isinstance(m, ModelResponse)
                 for p in m.parts if isinstance(p, ToolCallPart)]
        assert calls, result.all_messages()
        check(cls, calls[-1].args, f"pydantic-ai {cls.__name__} temperature {temperature}")

for seed in range(2):
    r = client.chat.completions.create(
        model=model, max_tokens=500, temperature=1, seed=seed,
        messages=[{"role": "user", "content": "Fill in every field."}],
        response_format={"type": "json_schema", "json_schema": {
            "name": "everything", "schema": Everything.model_json_schema()}})
    assert r.choices[0].finish_reason == "stop", r.choices[0]
    check(Everything, r.choices[0].message.content, f"every format seed {seed}")
print("ok")
