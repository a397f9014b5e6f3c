"""Provider formats refuse malformed input with memstore's errors, on SQLite and PostgreSQL.

(The renderings themselves are tested in ``tests/integrations/test_formats.py``.)
"""

from __future__ import annotations

import functools
import json
from typing import Any

import pytest

from memstore import InvalidInputError, MemoryStore, Message, ToolCall, UnboundedView
from memstore.formats import from_anthropic, to_anthropic


def _deep_list(depth: int) -> Any:
    return functools.reduce(lambda inner, _: [inner], range(depth), [])


def _deep_arguments(depth: int = 100_000) -> str:
    return '{"a":' + "[" * depth + "]" * depth + "}"


def _assistant(*blocks: dict[str, Any]) -> dict[str, Any]:
    return {"role": "assistant", "content": list(blocks)}


def _user(*blocks: dict[str, Any]) -> dict[str, Any]:
    return {"role": "user", "content": list(blocks)}


@pytest.mark.parametrize(("turn", "names"), [
    (_assistant({"type": "text", "text": "ok"}, {"type": "text"}),
     "content block 1 (text) has no 'text'"),
    (_assistant({"type": "tool_use", "name": "f", "input": {}}),
     "content block 0 (tool_use) has no 'id'"),
    (_assistant({"type": "tool_use", "id": "t1", "input": {}}),
     "content block 0 (tool_use) has no 'name'"),
    (_user({"type": "text"}), "content block 0 (text) has no 'text'"),
    (_user({"type": "text", "text": "hi"}, {"type": "tool_result", "content": "x"}),
     "content block 1 (tool_result) has no 'tool_use_id'"),
    (_user({"type": "tool_result", "tool_use_id": "t1", "content": [{"type": "text"}]}),
     "content block 0 (tool_result): content block 0 (text) has no 'text'"),
    (_user({"type": "tool_result", "tool_use_id": "t1", "content": 5}),
     "content block 0 (tool_result): content must be a string or a list"),
    (_user({"type": "image"}), "content block 0 (image): an image block needs a source"),
    (_user({"type": "image", "source": {"type": "base64", "data": "iVBO"}}),
     "content block 0 (image): the image source has no 'media_type'"),
    (_user({"type": "image", "source": {"type": "base64", "media_type": "image/png"}}),
     "content block 0 (image): the image source has no 'data'"),
    (_user({"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                        "data": b"\x89PNG"}}),
     "the image source's 'data' must be a non-empty string, not b'\\x89PNG'"),
    (_user({"type": "image", "source": {"type": "url"}}),
     "content block 0 (image): the image source has no 'url'"),
    (_user({"type": "image", "source": {"type": "url", "url": ""}}),
     "the image source's 'url' must be a non-empty string, not ''"),
])
def test_from_anthropic_names_the_block_missing_a_field(turn: dict[str, Any],
                                                        names: str) -> None:
    with pytest.raises(InvalidInputError) as info:
        Message.from_anthropic(turn)
    assert names in str(info.value)
    assert str(info.value).startswith(f"Anthropic {turn['role']} message: ")


@pytest.mark.parametrize(("tool_input", "problem"), [
    ({"x": float("nan")}, "not JSON"),
    ({"x": float("inf")}, "not JSON"),
    ({"x": {1, 2}}, "not JSON"),
    ({"x": b"bytes"}, "not JSON"),
    ({("a", "b"): 1}, "not JSON"),
    ([1, 2], "must be a JSON object, not list"),
    ("text", "must be a JSON object, not str"),
    (None, "must be a JSON object, not NoneType"),
    ({"a": _deep_list(100_000)}, "nested too deeply"),
])
def test_from_anthropic_refuses_tool_input_that_is_not_a_json_object(
        tool_input: Any, problem: str) -> None:
    turn = _assistant({"type": "tool_use", "id": "t1", "name": "f", "input": tool_input})
    with pytest.raises(InvalidInputError) as info:
        from_anthropic(turn)
    assert "content block 0 (tool_use): input" in str(info.value)
    assert problem in str(info.value)


def test_from_anthropic_tool_input_is_json_text() -> None:
    turn = _assistant({"type": "tool_use", "id": "t1", "name": "f",
                       "input": {"q": "x", "n": [1, 2.5, None]}},
                      {"type": "tool_use", "id": "t2", "name": "g"})
    [message] = Message.from_anthropic(turn)
    assert message.tool_calls is not None
    assert [json.loads(c.arguments) for c in message.tool_calls] == [
        {"q": "x", "n": [1, 2.5, None]}, {}]
    request = to_anthropic([message], leading_assistant="keep")
    assert request["messages"][0]["content"][0]["input"] == {"q": "x", "n": [1, 2.5, None]}


def test_to_anthropic_refuses_arguments_nested_too_deeply_to_parse(db_url: str) -> None:
    deep = _deep_arguments()
    with MemoryStore(db_url) as store:
        store.extend("c", [Message.user("q"),
                           Message.assistant(None, tool_calls=[
                               ToolCall(id="c1", name="f", arguments=deep)]),
                           Message.tool("r", tool_call_id="c1")])
        window = store.window("c", UnboundedView())
        assert window.to_openai()[1]["tool_calls"][0]["function"]["arguments"] == deep
        assert window.to_responses()[1]["arguments"] == deep
        with pytest.raises(InvalidInputError) as info:
            window.to_anthropic()
    assert "message seq 2: the arguments of tool call 'c1' are nested too deeply" in \
        str(info.value)
    # the same rule as for arguments that are not a JSON object at all
    with pytest.raises(InvalidInputError, match="not a JSON object"):
        to_anthropic([Message.assistant(None, tool_calls=[
            ToolCall(id="c1", name="f", arguments="[1]")])])


@pytest.mark.parametrize("arguments", ['{"x": NaN}', '{"x": Infinity}', '{"x": -Infinity}',
                                       '{"x": [1e999]}', '{"x": {"y": -1e400}}'])
def test_to_anthropic_refuses_arguments_json_cannot_carry(arguments: str) -> None:
    """Python's JSON parser reads NaN, Infinity and overflowing numbers as floats, which
    the Anthropic SDK then refuses when it serialises the request: refused here, naming
    the call, as from_anthropic refuses the same input."""
    call = Message.assistant(None, tool_calls=[ToolCall(id="c1", name="f", arguments=arguments)])
    with pytest.raises(InvalidInputError, match="an assistant message: the arguments of tool "
                       "call 'c1' are not a JSON object"):
        to_anthropic([call])
    fine = Message.assistant(None, tool_calls=[ToolCall(id="c1", name="f",
                                                        arguments='{"x": 1e308, "y": -0.5}')])
    request = to_anthropic([fine], leading_assistant="keep")
    assert request["messages"][0]["content"][0]["input"] == {"x": 1e308, "y": -0.5}


@pytest.mark.parametrize(("extra", "problem"), [
    ({"role": "assistant"}, "from_anthropic sets role from the message itself"),
    ({"content": "x"}, "from_anthropic sets content from the message itself"),
    ({"tool_call_id": "t"}, "from_anthropic sets tool_call_id"),
    ({"tool_calls": [], "role": "user"}, "from_anthropic sets role, tool_calls"),
    ({"metadata": "abc"}, "metadata must be a JSON object (a mapping), not str"),
    ({"metadata": [("a", 1)]}, "metadata must be a JSON object (a mapping), not list"),
])
def test_from_anthropic_refuses_keywords_it_cannot_take(extra: dict[str, Any],
                                                        problem: str) -> None:
    with pytest.raises(InvalidInputError) as info:
        from_anthropic({"role": "user", "content": "hi"}, **extra)
    assert problem in str(info.value)
    [message] = from_anthropic({"role": "user", "content": "hi"}, score=2.0, pinned=True,
                               metadata={"k": 1}, id="m1")
    assert (message.score, message.pinned, dict(message.metadata), message.id) == (
        2.0, True, {"k": 1}, "m1")


@pytest.mark.parametrize(("cache_control", "problem"), [
    ({"type": "ephemeral", "ttl": float("nan")}, "not valid JSON"),
    ({"type": "ephemeral\x00"}, "NUL"),
    ({"type": "ephemeral", 1: 2}, "non-string key"),
    ({"type": "ephemeral", "x": {1, 2}}, "set"),
    ("ephemeral", "cache_control must be an object"),
])
def test_with_cache_control_refuses_what_json_cannot_store(cache_control: Any,
                                                           problem: str) -> None:
    from memstore.formats import with_cache_control

    with pytest.raises(InvalidInputError, match=problem):
        with_cache_control(Message.user("hi"), cache_control)


def test_to_openai_sends_an_assistant_message_without_content_or_calls_as_empty_text() -> None:
    """The Chat Completions API takes an assistant message without content only when it
    has tool calls: a model that answered nothing is sent as ""."""
    assert Message(role="assistant").to_openai() == {"role": "assistant", "content": ""}
    call = Message(role="assistant", tool_calls=[ToolCall(id="a", name="f", arguments="{}")])
    assert call.to_openai()["content"] is None


def test_to_anthropic_makes_tool_use_ids_unique_and_valid() -> None:
    """Anthropic refuses repeated tool_use ids (400 "tool_use ids must be unique") and ids
    outside [a-zA-Z0-9_-]; some servers reuse call_0 on every turn, some use other
    characters. The request renames them consistently with their results."""
    def call(i: str) -> Message:
        return Message.assistant(tool_calls=[ToolCall(id=i, name="f", arguments="{}")])

    messages = [
        Message.user("a"), call("call_0"), Message.tool("r1", tool_call_id="call_0"),
        Message.user("b"), call("call_0"), Message.tool("r2", tool_call_id="call_0"),
        call("call_0_2"), Message.tool("r3", tool_call_id="call_0_2"),
        call("functions.f:0"), Message.tool("r4", tool_call_id="functions.f:0"),
    ]
    turns = to_anthropic(messages)["messages"]
    uses = [b["id"] for t in turns for b in t["content"] if b["type"] == "tool_use"]
    results = [(b["tool_use_id"], b["content"]) for t in turns for b in t["content"]
               if b["type"] == "tool_result"]
    assert uses == ["call_0", "call_0_2", "call_0_2_2", "functions_f_0"]
    assert results == [("call_0", "r1"), ("call_0_2", "r2"), ("call_0_2_2", "r3"),
                       ("functions_f_0", "r4")]
    # ids that are already unique and valid are sent as they are
    plain = to_anthropic([Message.user("q"), call("toolu_1"),
                          Message.tool("x", tool_call_id="toolu_1")])["messages"]
    assert plain[1]["content"][0]["id"] == "toolu_1"
    assert plain[2]["content"][0]["tool_use_id"] == "toolu_1"
