"""Provider formats: windows validate against the official SDKs' request types, offline."""

from __future__ import annotations

import itertools
import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import TypeAdapter, ValidationError

from memstore import (
    ImagePart,
    ImageURL,
    InvalidInputError,
    Message,
    TextPart,
    TokenLimitedView,
    ToolCall,
    UnboundedView,
)
from memstore.formats import (
    cache_control_of,
    from_anthropic,
    to_anthropic,
    to_responses,
    with_cache_control,
    with_hints,
)
from tests.helpers import call, examples
from tests.integrations import require

anthropic_types = require("anthropic.types")
create_params = require("anthropic.types.message_create_params")
responses_types = require("openai.types.responses")

PNG = ("data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR4nGP4z8D"
       "wHwAFAAH/iZk9HQAAAABJRU5ErkJggg==")


def materialize(value: Any) -> Any:
    """Force pydantic's lazy ``Iterable`` validators (the SDK params use Iterable[...])."""
    if isinstance(value, dict):
        return {k: materialize(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)) or hasattr(value, "__next__"):
        return [materialize(v) for v in value]
    return value


def assert_valid(adapter: TypeAdapter[Any], value: Any) -> None:
    """Validate ``value`` and require that validation kept it as is (no dropped extra key)."""
    assert materialize(adapter.validate_python(value)) == value


CREATE = TypeAdapter(create_params.MessageCreateParamsNonStreaming)
MESSAGES = TypeAdapter(list[anthropic_types.MessageParam])
RESPONSES = TypeAdapter(responses_types.ResponseInputParam)


def conversation() -> list[Message]:
    return [
        Message.system("You are terse."),
        Message.developer("Answer in English.",
                          metadata=with_hints(cache_control={"type": "ephemeral"})),
        Message.user([TextPart(text="What is in these?"),
                      ImagePart(image_url=ImageURL(url=PNG)),
                      ImagePart(image_url=ImageURL(url="https://example.com/a.jpg",
                                                   detail="low"))]),
        Message.assistant("Let me look both up.", tool_calls=[
            ToolCall(id="call_1", name="lookup", arguments='{"q": "pixel"}'),
            ToolCall(id="call_2", name="lookup", arguments='{"q": "photo"}'),
        ]),
        Message.tool("a single pixel", tool_call_id="call_2"),
        Message.tool("not found", tool_call_id="call_1", metadata=with_hints(is_error=True)),
        Message.system("Be brief from now on."),
        Message.user("Thanks. And now?", name="alice"),
        Message.assistant(tool_calls=[ToolCall(id="call_3", name="clock")]),
        Message.tool([TextPart(text="12:00")], tool_call_id="call_3"),
        Message.assistant("It is noon.", metadata=with_hints(
            cache_control={"type": "ephemeral", "ttl": "1h"})),
        Message.user("Bye"),
    ]


async def window_of(store: Any, messages: list[Message], view: Any = None) -> Any:
    await call(store.extend("fmt", messages))
    return await call(store.window("fmt", view or UnboundedView()))


async def test_to_anthropic_validates_against_the_sdk(store: Any) -> None:
    window = await window_of(store, conversation())
    body = window.to_anthropic()
    assert_valid(CREATE, {"model": "claude-x", "max_tokens": 16, **body})
    assert [b["text"] for b in body["system"]] == [
        "You are terse.", "Answer in English.", "Be brief from now on."]
    assert body["system"][1]["cache_control"] == {"type": "ephemeral"}
    turns = body["messages"]
    roles = [t["role"] for t in turns]
    assert all(a != b for a, b in itertools.pairwise(roles)), "turns alternate"
    assert roles[0] == "user"
    first = turns[0]["content"]
    assert first[1]["source"]["type"] == "base64"
    assert first[1]["source"]["media_type"] == "image/png"
    assert first[2]["source"] == {"type": "url", "url": "https://example.com/a.jpg"}
    calls = [b for b in turns[1]["content"] if b["type"] == "tool_use"]
    assert [(c["id"], c["input"]) for c in calls] == [("call_1", {"q": "pixel"}),
                                                      ("call_2", {"q": "photo"})]
    results = turns[2]["content"]
    assert [b["type"] for b in results] == ["tool_result", "tool_result", "text"]
    assert results[1] == {"type": "tool_result", "tool_use_id": "call_1",
                          "content": "not found", "is_error": True}
    assert turns[-2]["content"][-1]["cache_control"] == {"type": "ephemeral", "ttl": "1h"}
    # every tool_use is answered by a tool_result in the next turn
    for i, turn in enumerate(turns):
        ids = {b["id"] for b in turn["content"] if b["type"] == "tool_use"}
        if ids:
            answered = {b["tool_use_id"] for b in turns[i + 1]["content"]
                        if b["type"] == "tool_result"}
            assert ids == answered


async def test_to_responses_validates_against_the_sdk(store: Any) -> None:
    window = await window_of(store, conversation())
    items = window.to_responses()
    assert_valid(RESPONSES, items)
    kinds = [(i["type"], i.get("role")) for i in items]
    assert kinds[:4] == [("message", "system"), ("message", "developer"), ("message", "user"),
                         ("message", "assistant")]
    assert [i["call_id"] for i in items if i["type"] == "function_call"] == [
        "call_1", "call_2", "call_3"]
    outputs = [i for i in items if i["type"] == "function_call_output"]
    assert [o["call_id"] for o in outputs] == ["call_2", "call_1", "call_3"]
    assert outputs[2]["output"] == [{"type": "input_text", "text": "12:00"}]
    image = items[2]["content"][2]
    assert image == {"type": "input_image", "image_url": "https://example.com/a.jpg",
                     "detail": "low"}
    # an assistant message with only calls becomes function_call items, no empty message
    assert not any(i["type"] == "message" and i["content"] == "" for i in items)


async def test_budgeted_window_is_still_valid(store: Any) -> None:
    window = await window_of(store, conversation(), TokenLimitedView(token_limit=60))
    assert window.report.omitted, "the budget cut something"
    assert_valid(CREATE, {"model": "m", "max_tokens": 1, **window.to_anthropic()})
    assert_valid(RESPONSES, window.to_responses())


def test_anthropic_rejects_what_it_cannot_send() -> None:
    bad_args = Message.assistant(tool_calls=[ToolCall(id="c", name="f", arguments="[1, 2]")])
    with pytest.raises(InvalidInputError, match="not a JSON object"):
        to_anthropic([Message.user("x"), bad_args])
    tiff = Message.user([ImagePart(image_url=ImageURL(url="data:image/tiff;base64,AAAA"))])
    with pytest.raises(InvalidInputError, match="image/tiff"):
        to_anthropic([tiff])
    with pytest.raises(InvalidInputError, match="must be an object"):
        to_anthropic([Message.user("x", metadata={"memstore": {"cache_control": "ephemeral"}})])


def test_empty_text_and_empty_messages_are_left_out() -> None:
    body = to_anthropic([Message.system(""), Message.user("hi"), Message.assistant(""),
                         Message.assistant(None), Message.user("again")])
    assert "system" not in body
    assert body["messages"] == [{"role": "user", "content": [
        {"type": "text", "text": "hi"}, {"type": "text", "text": "again"}]}]
    assert_valid(MESSAGES, body["messages"])


def test_cache_control_helpers() -> None:
    m = with_cache_control(Message.user("x", metadata={"k": 1}))
    assert m.metadata == {"k": 1, "memstore": {"cache_control": {"type": "ephemeral"}}}
    assert cache_control_of(m) == {"type": "ephemeral"}
    assert cache_control_of(Message.user("x")) is None
    assert to_anthropic([m])["messages"][0]["content"][0]["cache_control"] == {"type": "ephemeral"}
    # neither OpenAI rendering carries the Anthropic-only key
    assert "cache_control" not in json.dumps(to_responses([m]))
    assert "cache_control" not in json.dumps(m.to_openai())


def test_from_anthropic_splits_tool_results() -> None:
    turn = {"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "a", "content": "one"},
        {"type": "tool_result", "tool_use_id": "b", "content": [{"type": "text", "text": "two"}],
         "is_error": True},
        {"type": "text", "text": "and?", "cache_control": {"type": "ephemeral"}},
    ]}
    messages = Message.from_anthropic(turn, score=2.0)
    assert [(m.role, m.tool_call_id) for m in messages] == [
        ("tool", "a"), ("tool", "b"), ("user", None)]
    assert messages[1].content == [TextPart(text="two")]
    assert messages[1].metadata == {"memstore": {"is_error": True}}
    assert messages[2].metadata == {"memstore": {"cache_control": {"type": "ephemeral"}}}
    assert all(m.score == 2.0 for m in messages)
    assert to_anthropic(messages)["messages"] == [turn]


def test_from_anthropic_rejects_unsupported_blocks() -> None:
    with pytest.raises(InvalidInputError, match="thinking"):
        from_anthropic({"role": "assistant", "content": [{"type": "thinking", "thinking": "x",
                                                          "signature": "s"}]})
    with pytest.raises(InvalidInputError, match="role"):
        from_anthropic({"role": "system", "content": "x"})
    with pytest.raises(ValidationError):
        from_anthropic({"role": "user", "content": "nul\x00"})


# ---- round trip: Anthropic params -> memstore -> Anthropic params -------------------------

_text = st.text(st.characters(blacklist_categories=["Cs"], blacklist_characters="\x00"),
                min_size=1, max_size=12)
_ids = st.text("abcdef0123456789", min_size=1, max_size=6)
_json_obj = st.dictionaries(st.text("xyz", min_size=1, max_size=3),
                            st.integers() | _text | st.booleans(), max_size=3)
_text_block = st.builds(lambda t: {"type": "text", "text": t}, _text)
_image_block = st.sampled_from([
    {"type": "image", "source": {"type": "url", "url": "https://example.com/i.png"}},
    {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                 "data": PNG.split(",", 1)[1]}},
])


@st.composite
def _conversation(draw: st.DrawFn) -> list[dict[str, Any]]:
    turns: list[dict[str, Any]] = []
    pending: list[str] = []
    for i in range(draw(st.integers(1, 6))):
        if i % 2 == 0:
            blocks: list[dict[str, Any]] = []
            for call_id in pending:
                block: dict[str, Any] = {"type": "tool_result", "tool_use_id": call_id}
                content = draw(st.none() | _text | st.lists(_text_block, min_size=1,
                                                            max_size=2))
                if content is not None:
                    block["content"] = content
                if draw(st.booleans()):
                    block["is_error"] = True
                blocks.append(block)
            blocks += draw(st.lists(_text_block | _image_block, min_size=0 if pending else 1,
                                    max_size=3))
            turns.append({"role": "user", "content": blocks})
            pending = []
        else:
            texts = draw(st.lists(_text_block, max_size=2))
            ids = draw(st.lists(_ids, unique=True, max_size=3))
            uses = [{"type": "tool_use", "id": f"{i}-{x}", "name": "f",
                     "input": draw(_json_obj)} for x in ids]
            if not texts and not uses:
                texts = [{"type": "text", "text": "ok"}]
            turns.append({"role": "assistant", "content": texts + uses})
            pending = [u["id"] for u in uses]
    return turns


@settings(max_examples=examples(60), derandomize=True, deadline=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(_conversation())
def test_anthropic_round_trip_is_identity(turns: list[dict[str, Any]]) -> None:
    messages = [m for turn in turns for m in Message.from_anthropic(turn)]
    assert to_anthropic(messages)["messages"] == turns
    assert_valid(MESSAGES, turns)
    assert_valid(RESPONSES, to_responses(messages))



def test_builder_cache_control_reaches_anthropic() -> None:
    from memstore.context.builder import Block, ContextBuilder, Tier
    from memstore.context.strategies import Drop, Strict
    from memstore.tokens import FixedCounter

    compiled = (
        ContextBuilder(500, counter=FixedCounter())
        .add_block(Block("system", tier=Tier.SYSTEM, strategy=Strict(),
                         messages=[Message.system("Rules.")], cache_control={"type": "ephemeral"}))
        .add_block(Block("docs", tier=Tier.RAG, strategy=Drop(),
                         messages=[Message.user("Doc one."), Message.user("Doc two.")],
                         cache_control={"type": "ephemeral", "ttl": "1h"}))
        .compile()
    )
    body = compiled.to_anthropic()
    assert body["system"] == [{"type": "text", "text": "Rules.",
                               "cache_control": {"type": "ephemeral"}}]
    assert body["messages"] == [{"role": "user", "content": [
        {"type": "text", "text": "Doc one."},
        {"type": "text", "text": "Doc two.", "cache_control": {"type": "ephemeral", "ttl": "1h"}},
    ]}]
    assert_valid(CREATE, {"model": "m", "max_tokens": 1, **body})
