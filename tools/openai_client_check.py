#!/usr/bin/env python3
"""The OpenAI surface of a running specd server, through the official `openai` Python client.

Usage: python3 tools/openai_client_check.py http://127.0.0.1:8000/v1
(`pip install openai pydantic` first; the server should be `specd serve` on the Qwen pair.)

Checks, each with speculation on and off where the output must not change:
- structured output with `client.chat.completions.parse` and a pydantic model (a JSON
  schema), and `response_format: json_object`;
- log probabilities (`logprobs`, `top_logprobs`), whole and streamed, equal between the two;
- presence/frequency penalties and `logit_bias`;
- a tool call forced by `tool_choice`, streamed as `delta.tool_calls`, then answered with a
  `tool` message;
- a bad schema and an out-of-range `top_logprobs` raise `BadRequestError` naming the field.
Exits non-zero on the first failure.
"""

import json
import sys

import openai
from openai import OpenAI
from pydantic import BaseModel


class Person(BaseModel):
    name: str
    age: int
    email: str
    skills: list[str]


PERSON = ("Extract the person's details: Maria Lopez, 34, maria.lopez@example.com, "
          "writes Rust and Python.")

TOOLS = [{
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather for a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"},
                           "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
            "required": ["city"],
        },
    },
}]


def both(fn):
    """fn(extra_body) with speculation off and on."""
    return fn({"specd": {"speculative": False}}), fn({"specd": {"block_size": 4}})


def main():
    client = OpenAI(base_url=sys.argv[1] if len(sys.argv) > 1 else "http://127.0.0.1:8000/v1",
                    api_key="unused")
    model = client.models.list().data[0].id
    user = [{"role": "user", "content": PERSON}]

    plain, spec = both(lambda extra: client.chat.completions.parse(
        model=model, messages=user, response_format=Person, temperature=0, max_tokens=96,
        extra_body=extra))
    assert plain.choices[0].message.parsed == spec.choices[0].message.parsed
    person = plain.choices[0].message.parsed
    assert isinstance(person, Person) and person.age == 34, person
    print("parse (json_schema):", person)

    obj = client.chat.completions.create(
        model=model, messages=user, response_format={"type": "json_object"}, temperature=0,
        max_tokens=96)
    assert isinstance(json.loads(obj.choices[0].message.content), dict)
    print("json_object:", obj.choices[0].message.content.replace("\n", " ")[:80])

    ask = [{"role": "user", "content": "Write a haiku about Rust."}]
    plain, spec = both(lambda extra: client.chat.completions.create(
        model=model, messages=ask, temperature=0.8, seed=7, max_tokens=32, logprobs=True,
        top_logprobs=3, presence_penalty=0.5, frequency_penalty=0.5, logit_bias={"13": -10},
        extra_body=extra))
    assert plain.choices[0].message.content == spec.choices[0].message.content
    lp_plain = [(t.token, t.logprob) for t in plain.choices[0].logprobs.content]
    lp_spec = [(t.token, t.logprob) for t in spec.choices[0].logprobs.content]
    assert lp_plain == lp_spec
    assert all(len(t.top_logprobs) == 3 for t in plain.choices[0].logprobs.content)
    streamed = []
    for chunk in client.chat.completions.create(
            model=model, messages=ask, temperature=0.8, seed=7, max_tokens=32, logprobs=True,
            top_logprobs=3, presence_penalty=0.5, frequency_penalty=0.5,
            logit_bias={"13": -10}, stream=True):
        if chunk.choices and chunk.choices[0].logprobs:
            streamed += [(t.token, t.logprob) for t in chunk.choices[0].logprobs.content]
    assert streamed == lp_plain
    print(f"logprobs: {len(lp_plain)} tokens equal plain/spec/streamed")

    weather = [{"role": "user", "content": "What's the weather in Paris right now?"}]
    choice = {"type": "function", "function": {"name": "get_weather"}}
    calls = {}
    finish = None
    for chunk in client.chat.completions.create(
            model=model, messages=weather, tools=TOOLS, tool_choice=choice, temperature=0,
            max_tokens=64, stream=True):
        if not chunk.choices:
            continue
        for call in chunk.choices[0].delta.tool_calls or []:
            entry = calls.setdefault(call.index, {"id": call.id, "name": "", "arguments": ""})
            entry["name"] += call.function.name or ""
            entry["arguments"] += call.function.arguments or ""
        finish = chunk.choices[0].finish_reason or finish
    assert finish == "tool_calls", finish
    call = calls[0]
    assert call["name"] == "get_weather" and "city" in json.loads(call["arguments"]), call
    answer = client.chat.completions.create(
        model=model, tools=TOOLS, tool_choice="none", temperature=0, max_tokens=40,
        messages=weather + [
            {"role": "assistant", "content": None, "tool_calls": [{
                "id": call["id"], "type": "function",
                "function": {"name": call["name"], "arguments": call["arguments"]}}]},
            {"role": "tool", "tool_call_id": call["id"], "content": '{"temperature": 18}'},
        ])
    assert answer.choices[0].message.content
    print("tool call:", call, "->", answer.choices[0].message.content.replace("\n", " ")[:60])

    for kwargs, param in [
        ({"response_format": {"type": "json_schema",
                              "json_schema": {"name": "x", "schema": {"type": "objekt"}}}},
         "response_format"),
        ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    ]:
        try:
            client.chat.completions.create(model=model, messages=ask, max_tokens=4, **kwargs)
        except openai.BadRequestError as error:
            body = error.body if isinstance(error.body, dict) else {}
            named = body.get("param") or body.get("error", {}).get("param") or ""
            assert named.startswith(param), (param, error.body)
            print(f"400 names {named}")
        else:
            raise AssertionError(f"{param}: accepted")
    print("openai client check: all passed")


if __name__ == "__main__":
    main()
