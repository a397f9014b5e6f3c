"""Provider formats: windows validate against the official SDKs' request types, offline."""

from __future__ import annotations

import itertools
import json
import typing
from typing import Any

import pytest
import typing_extensions
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
    LEADING_USER_TEXT,
    TOOL_IMAGE_OMITTED,
    cache_control_of,
    from_anthropic,
    thinking_of,
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
    with pytest.raises(InvalidInputError, match="block type 'document' is not supported"):
        from_anthropic({"role": "assistant", "content": [{"type": "document", "source": {}}]})
    # thinking is assistant content: in a user turn it is refused
    with pytest.raises(InvalidInputError, match="block type 'thinking' is not supported"):
        from_anthropic({"role": "user", "content": [{"type": "thinking", "thinking": "x",
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


_thinking_block = (
    st.builds(lambda t, sig: {"type": "thinking", "thinking": t, "signature": sig},
              st.text(st.characters(blacklist_categories=["Cs"], blacklist_characters="\x00"),
                       max_size=12),
              st.text("ABCDEFabcdef0123456789+/=", min_size=1, max_size=40))
    | st.builds(lambda d: {"type": "redacted_thinking", "data": d},
                st.text("ABCDEFabcdef0123456789+/=", min_size=1, max_size=40))
)


@st.composite
def _conversation(draw: st.DrawFn) -> list[dict[str, Any]]:
    turns: list[dict[str, Any]] = []
    pending: list[str] = []
    for i in range(draw(st.integers(1, 6))):
        if i % 2 == 0:
            blocks: list[dict[str, Any]] = []
            for call_id in pending:
                block: dict[str, Any] = {"type": "tool_result", "tool_use_id": call_id}
                content = draw(st.none() | _text | st.lists(_text_block | _image_block,
                                                            min_size=1, max_size=2))
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
            thinking: list[dict[str, Any]] = draw(st.lists(_thinking_block, max_size=2))
            turns.append({"role": "assistant", "content": thinking + texts + uses})
            pending = [u["id"] for u in uses]
    return turns


@settings(max_examples=examples(60), derandomize=True, deadline=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(_conversation())
def test_anthropic_round_trip_is_identity(turns: list[dict[str, Any]]) -> None:
    messages = [m for turn in turns for m in Message.from_anthropic(turn)]
    assert to_anthropic(messages)["messages"] == turns
    assert_valid(MESSAGES, turns)
    responses = to_responses(messages)
    assert_valid(RESPONSES, responses)
    openai_messages = [m.to_openai() for m in messages]
    assert_openai_valid(openai_messages)
    assert not _thinking_anywhere(responses) and not _thinking_anywhere(openai_messages)



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


# ---- Chat Completions: only the fields each message type defines (issue 4) -----------------

chat_types = require("openai.types.chat")
_image_part_module = require("openai.types.chat.chat_completion_content_part_image_param")
_tool_call_module = require("openai.types.chat.chat_completion_message_function_tool_call_param")

OPENAI = TypeAdapter(list[chat_types.ChatCompletionMessageParam])
#: The SDK's TypedDict of each role's message, and the content parts each role may send.
OPENAI_MESSAGE_TYPES: dict[str, Any] = {
    "system": chat_types.ChatCompletionSystemMessageParam,
    "developer": chat_types.ChatCompletionDeveloperMessageParam,
    "user": chat_types.ChatCompletionUserMessageParam,
    "assistant": chat_types.ChatCompletionAssistantMessageParam,
    "tool": chat_types.ChatCompletionToolMessageParam,
}
OPENAI_PART_TYPES: dict[str, dict[str, Any]] = {
    "system": {"text": chat_types.ChatCompletionContentPartTextParam},
    "developer": {"text": chat_types.ChatCompletionContentPartTextParam},
    "assistant": {"text": chat_types.ChatCompletionContentPartTextParam},
    "tool": {"text": chat_types.ChatCompletionContentPartTextParam},
    "user": {"text": chat_types.ChatCompletionContentPartTextParam,
             "image_url": chat_types.ChatCompletionContentPartImageParam},
}


def assert_typed_dict_keys(typed_dict: Any, value: dict[str, Any], where: str) -> None:
    """``value`` has only keys ``typed_dict`` defines, and every key it requires."""
    hints = typing.get_type_hints(typed_dict, include_extras=True)
    required = {k for k, v in hints.items() if typing.get_origin(v) is typing_extensions.Required}
    extra = sorted(set(value) - set(hints))
    assert not extra, f"{where}: {typed_dict.__name__} has no {extra}"
    missing = sorted(required - set(value))
    assert not missing, f"{where}: {typed_dict.__name__} requires {missing}"


def assert_openai_valid(messages: list[dict[str, Any]]) -> None:
    """Every rendered Chat Completions message has exactly its role's TypedDict's fields."""
    for index, message in enumerate(messages):
        where = f"message {index} ({message.get('role')})"
        assert_typed_dict_keys(OPENAI_MESSAGE_TYPES[message["role"]], message, where)
        content = message.get("content")
        if isinstance(content, list):
            allowed = OPENAI_PART_TYPES[message["role"]]
            for k, part in enumerate(content):
                assert part["type"] in allowed, f"{where}: part {k} type {part['type']!r}"
                assert_typed_dict_keys(allowed[part["type"]], part, f"{where} part {k}")
                if part["type"] == "image_url":
                    assert_typed_dict_keys(_image_part_module.ImageURL, part["image_url"],
                                           f"{where} part {k} image_url")
        for k, tool_call in enumerate(message.get("tool_calls") or ()):
            assert_typed_dict_keys(_tool_call_module.ChatCompletionMessageFunctionToolCallParam,
                                   tool_call, f"{where} tool call {k}")
            assert_typed_dict_keys(_tool_call_module.Function, tool_call["function"],
                                   f"{where} tool call {k} function")
    assert_valid(OPENAI, messages)


def named_conversation() -> list[Message]:
    """Every role with a name; a tool result named as the LangChain adapter writes it."""
    from langchain_core.messages import ToolMessage

    from memstore.integrations.langchain import to_memstore

    return [
        Message.system("rules", name="ops"),
        Message.developer("be brief", name="dev"),
        Message.user([TextPart(text="look"), ImagePart(image_url=ImageURL(url=PNG))],
                     name="alice"),
        Message.assistant("checking", name="bot", tool_calls=[
            ToolCall(id="call_1", name="lookup", arguments="{}"),
            ToolCall(id="call_2", name="shot", arguments="{}")]),
        to_memstore(ToolMessage("found it", tool_call_id="call_1", name="lookup")),
        Message.tool([TextPart(text="a screenshot"), ImagePart(image_url=ImageURL(url=PNG))],
                     tool_call_id="call_2", name="shot"),
        Message.assistant([TextPart(text="done")], name="bot"),
    ]


async def test_to_openai_sends_only_the_fields_each_message_type_defines(store: Any) -> None:
    """``name`` on a tool message (every LangChain ToolMessage has one) is refused with a
    400 by strict OpenAI-compatible servers: ChatCompletionToolMessageParam has no name
    (langchain#23600). A tool message's parts may only be text."""
    messages = named_conversation()
    assert messages[4].name == "lookup"  # stored: only the rendering leaves it out
    window = await window_of(store, messages)
    rendered = window.to_openai()
    assert_openai_valid(rendered)
    assert rendered[4] == {"role": "tool", "content": "found it", "tool_call_id": "call_1"}
    assert rendered[5] == {"role": "tool", "tool_call_id": "call_2", "content": [
        {"type": "text", "text": "a screenshot"},
        {"type": "text", "text": TOOL_IMAGE_OMITTED}]}
    assert [m.get("name") for m in rendered] == ["ops", "dev", "alice", "bot", None, None, "bot"]
    assert [m.name for m in window.messages][4:6] == ["lookup", "shot"]
    assert_openai_valid([m.to_openai() for m in conversation()])


# ---- Anthropic: the first turn is a user turn (issue 5) ------------------------------------

def _assistant_first() -> list[Message]:
    return [
        Message.system("rules"),
        Message.assistant("Hello! How can I help?"),
        Message.assistant(None, tool_calls=[ToolCall(id="c1", name="profile")]),
        Message.tool("premium user", tool_call_id="c1"),
        Message.assistant("You are a premium user."),
        Message.user("Thanks. What next?"),
        Message.assistant("Anything else?"),
    ]


def test_to_anthropic_starts_with_a_user_turn_by_default() -> None:
    messages = _assistant_first()
    body = to_anthropic(messages)
    turns = body["messages"]
    assert turns[0] == {"role": "user", "content": [{"type": "text", "text": LEADING_USER_TEXT}]}
    assert [t["role"] for t in turns] == ["user", "assistant", "user", "assistant", "user",
                                         "assistant"]
    # nothing the window holds is left out
    assert turns[1:] == to_anthropic(messages, leading_assistant="keep")["messages"]
    assert_valid(CREATE, {"model": "m", "max_tokens": 1, **body})
    custom = to_anthropic(messages, leading_text="Earlier messages follow.")["messages"][0]
    assert custom["content"] == [{"type": "text", "text": "Earlier messages follow."}]
    # a window that starts with a user turn is sent as it is
    assert to_anthropic(messages[5:])["messages"] == [
        {"role": "user", "content": [{"type": "text", "text": "Thanks. What next?"}]},
        {"role": "assistant", "content": [{"type": "text", "text": "Anything else?"}]}]


def test_to_anthropic_leading_assistant_options() -> None:
    messages = _assistant_first()
    kept = to_anthropic(messages, leading_assistant="keep")["messages"]
    assert kept[0]["role"] == "assistant"
    dropped = to_anthropic(messages, leading_assistant="drop")
    # the greeting, the call and its result, the answer: whole units, up to the user turn
    assert dropped["messages"] == kept[3:] == [
        {"role": "user", "content": [{"type": "text", "text": "Thanks. What next?"}]},
        {"role": "assistant", "content": [{"type": "text", "text": "Anything else?"}]}]
    assert dropped["system"] == [{"type": "text", "text": "rules"}]
    # a user turn holding results and text keeps its text when the call is dropped
    merged = [Message.assistant(None, tool_calls=[ToolCall(id="c1", name="f")]),
              Message.tool("r", tool_call_id="c1"), Message.user("and?")]
    assert to_anthropic(merged, leading_assistant="drop")["messages"] == [
        {"role": "user", "content": [{"type": "text", "text": "and?"}]}]
    with pytest.raises(InvalidInputError, match="an assistant message starts the request"):
        to_anthropic(messages, leading_assistant="raise")
    with pytest.raises(InvalidInputError, match="leaves no user turn"):
        to_anthropic([Message.assistant("hi")], leading_assistant="drop")
    with pytest.raises(InvalidInputError, match="leading_assistant must be one of"):
        to_anthropic(messages, leading_assistant="fix")  # type: ignore[arg-type]
    with pytest.raises(InvalidInputError, match="leading_text must be a non-empty string"):
        to_anthropic(messages, leading_text=" ")
    # no turn at all is not a leading assistant turn
    assert to_anthropic([], leading_assistant="raise") == {"messages": []}


async def test_budgeted_window_starting_with_an_assistant_turn_is_repaired(store: Any) -> None:
    """A TokenLimitedView cut (the default, start_on_user=False) can keep an answer
    without its question; to_anthropic() still starts the request with a user turn."""
    from memstore.tokens import FixedCounter

    history = [Message.user("q1"), Message.assistant("a1"), Message.user("q2"),
               Message.assistant(None, tool_calls=[ToolCall(id="c1", name="f")]),
               Message.tool("r1", tool_call_id="c1"), Message.user("q3")]
    view = TokenLimitedView(token_limit=3, counter=FixedCounter(1))
    window = await window_of(store, history, view)
    assert window.messages[0].role == "assistant", "the view keeps the call without q2"
    body = window.to_anthropic()
    assert body["messages"][0]["role"] == "user"
    assert [b["type"] for b in body["messages"][1]["content"]] == ["tool_use"]
    assert_valid(CREATE, {"model": "m", "max_tokens": 1, **body})
    with pytest.raises(InvalidInputError, match="message seq 4 starts the request"):
        window.to_anthropic(leading_assistant="raise")
    assert window.to_anthropic(leading_assistant="drop")["messages"] == [
        {"role": "user", "content": [{"type": "text", "text": "q3"}]}]
    # read with start_on_user, the view leaves the unit out and reports it
    fixed = await call(store.window("fmt", TokenLimitedView(
        token_limit=3, counter=FixedCounter(1), start_on_user=True)))
    assert fixed.to_anthropic(leading_assistant="raise")["messages"] == [
        {"role": "user", "content": [{"type": "text", "text": "q3"}]}]
    assert [(o.first_seq, o.last_seq, o.reason) for o in fixed.report.omitted] == [
        (1, 3, "budget"), (4, 5, "start_on_user")]


# ---- Anthropic thinking blocks and tool-result images (issue 6) ----------------------------

SIGNATURE = "EqQBCgIYAhIM1gbcDa9GJwZA2b3hGgxBdjrkzLoky3dl1pkiMOYds" + "+/=" * 40
THINKING_TURNS: list[dict[str, Any]] = [
    {"role": "user", "content": [{"type": "text", "text": "Weather in Paris? Show the map."}]},
    {"role": "assistant", "content": [
        {"type": "thinking", "thinking": "The user wants the weather — I'll call get_weather.\n"
                                         "Unicode: 日本語 😀", "signature": SIGNATURE},
        {"type": "redacted_thinking", "data": "EmwKAhgBEgy3va3pzix/LafPsn4aDFIT2Xlxh0L5L8rLVyIw"},
        {"type": "text", "text": "Let me check."},
        {"type": "tool_use", "id": "toolu_01", "name": "get_weather",
         "input": {"city": "Paris"}},
        {"type": "tool_use", "id": "toolu_02", "name": "map", "input": {"city": "Paris"}},
    ]},
    {"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "toolu_01", "content": "18°C, sunny"},
        {"type": "tool_result", "tool_use_id": "toolu_02", "content": [
            {"type": "text", "text": "the map:"},
            {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                         "data": PNG.split(",", 1)[1]}},
            {"type": "image", "source": {"type": "url", "url": "https://example.com/m.png"}},
        ]},
    ]},
    {"role": "assistant", "content": [
        {"type": "thinking", "thinking": "", "signature": "c2lnbmF0dXJl"},
        {"type": "text", "text": "It is 18°C and sunny."},
    ]},
    {"role": "user", "content": [{"type": "text", "text": "Thanks"}]},
]


async def test_thinking_blocks_and_tool_result_images_round_trip_through_the_store(
        store: Any) -> None:
    messages = [m for turn in THINKING_TURNS for m in Message.from_anthropic(turn)]
    assert thinking_of(messages[1]) == THINKING_TURNS[1]["content"][:2]
    assert isinstance(messages[3].content, list)
    assert [type(part).__name__ for part in messages[3].content] == [
        "TextPart", "ImagePart", "ImagePart"]
    window = await window_of(store, messages)  # SQLite and PostgreSQL, both stores
    body = window.to_anthropic(leading_assistant="raise")
    assert body["messages"] == THINKING_TURNS
    # byte for byte, signature included: the serialised blocks are the ones given
    sent = body["messages"][1]["content"][:2]
    assert json.dumps(sent, ensure_ascii=False) == json.dumps(
        THINKING_TURNS[1]["content"][:2], ensure_ascii=False)
    assert_valid(CREATE, {"model": "m", "max_tokens": 1, **body})
    # the OpenAI renderings leave thinking out; the Responses output keeps the images
    openai_messages = window.to_openai()
    responses = window.to_responses()
    assert not _thinking_anywhere(openai_messages) and not _thinking_anywhere(responses)
    assert SIGNATURE not in json.dumps(openai_messages) + json.dumps(responses)
    assert_openai_valid(openai_messages)
    assert_valid(RESPONSES, responses)
    output = next(i for i in responses if i.get("call_id") == "toolu_02"
                  and i["type"] == "function_call_output")["output"]
    assert [p["type"] for p in output] == ["input_text", "input_image", "input_image"]


def _thinking_anywhere(value: Any) -> bool:
    if isinstance(value, dict):
        return (value.get("type") in ("thinking", "redacted_thinking") or "signature" in value
                or any(_thinking_anywhere(v) for v in value.values()))
    if isinstance(value, list):
        return any(_thinking_anywhere(v) for v in value)
    return False


def test_thinking_opens_the_merged_assistant_turn_and_skips_cache_control() -> None:
    thought = {"type": "thinking", "thinking": "hmm", "signature": "sig"}
    plain = Message.assistant("first")
    thinking = Message.assistant(None, tool_calls=[ToolCall(id="t1", name="f")],
                                 metadata=with_hints(thinking=[thought],
                                                     cache_control={"type": "ephemeral"}))
    only = Message.assistant(None, metadata=with_hints(thinking=[thought],
                                                       cache_control={"type": "ephemeral"}))
    turns = to_anthropic([Message.user("q"), plain, thinking,
                          Message.tool("r", tool_call_id="t1")])["messages"]
    assert [b["type"] for b in turns[1]["content"]] == ["thinking", "text", "tool_use"]
    assert turns[1]["content"][2]["cache_control"] == {"type": "ephemeral"}
    # a thinking block cannot carry cache_control: a thinking-only message has no breakpoint
    assert to_anthropic([Message.user("q"), only])["messages"][1] == {
        "role": "assistant", "content": [thought]}
    assert only.to_openai() == {"role": "assistant", "content": ""}


def test_thinking_hints_are_checked() -> None:
    with pytest.raises(InvalidInputError, match=r"content block 0 \(thinking\) has no 'signature'"):
        from_anthropic({"role": "assistant", "content": [{"type": "thinking", "thinking": "x"}]})
    with pytest.raises(InvalidInputError, match=r"needs a string 'signature', not 5"):
        from_anthropic({"role": "assistant", "content": [
            {"type": "thinking", "thinking": "x", "signature": 5}]})
    with pytest.raises(InvalidInputError, match=r"content block 0 \(redacted_thinking\) has no"):
        from_anthropic({"role": "assistant", "content": [{"type": "redacted_thinking"}]})
    with pytest.raises(InvalidInputError, match="thinking or redacted_thinking block"):
        with_hints(thinking=[{"type": "text", "text": "x"}])
    with pytest.raises(InvalidInputError, match="NUL"):
        with_hints(thinking=[{"type": "thinking", "thinking": "\x00", "signature": "s"}])
    bad = Message.assistant("x", metadata={"memstore": {"thinking": "not blocks"}})
    with pytest.raises(InvalidInputError, match="must be a list of thinking blocks"):
        to_anthropic([Message.user("q"), bad])
    misplaced = Message.user("x", metadata=with_hints(thinking=[
        {"type": "thinking", "thinking": "t", "signature": "s"}]))
    with pytest.raises(InvalidInputError, match="only for assistant messages"):
        to_anthropic([misplaced])
    # other keys of a block are not kept; an empty list sets nothing
    assert with_hints(thinking=[{"type": "redacted_thinking", "data": "d", "x": 1}]) == {
        "memstore": {"thinking": [{"type": "redacted_thinking", "data": "d"}]}}
    assert with_hints({"memstore": {"thinking": [{"type": "redacted_thinking", "data": "d"}]}},
                      thinking=[]) == {}


def test_thinking_counts_toward_the_message_size_limit() -> None:
    from memstore._validate import MAX_RECORD_BYTES

    text = "x" * (MAX_RECORD_BYTES - 1000)
    turn = {"role": "assistant", "content": [
        {"type": "thinking", "thinking": "y" * 2000, "signature": "s"},
        {"type": "text", "text": text}]}
    with pytest.raises(ValidationError, match="largest record memstore stores is 67,108,864"):
        from_anthropic(turn)
    [message] = from_anthropic({"role": "assistant", "content": turn["content"][:1]})
    assert thinking_of(message)[0]["thinking"] == "y" * 2000


# ---- cache_control is what Anthropic accepts (issue 7) -------------------------------------

@pytest.mark.parametrize(("cache_control", "problem"), [
    ({"type": "bogus"}, "cache_control type must be \"ephemeral\""),
    ({"type": "ephemeral", "ttl": "10m"}, "cache_control ttl must be \"5m\" or \"1h\""),
    ({"type": "ephemeral", "ttl": 300}, "ttl must be \"5m\" or \"1h\""),
    ({"type": "ephemeral", "ttl": None}, "ttl must be \"5m\" or \"1h\""),
    ({"ttl": "5m"}, "cache_control has no \"type\""),
    ({}, "cache_control has no \"type\""),
    ({"type": "ephemeral", "scope": "global"}, "unknown key(s) 'scope'"),
    ({"type": 1}, "type must be \"ephemeral\""),
])
def test_cache_control_is_checked_against_what_anthropic_accepts(
        cache_control: dict[str, Any], problem: str) -> None:
    with pytest.raises(InvalidInputError) as info:
        with_cache_control(Message.user("x"), cache_control)
    assert problem in str(info.value)
    with pytest.raises(InvalidInputError) as info:
        with_hints(cache_control=cache_control)
    assert problem in str(info.value)
    with pytest.raises(InvalidInputError) as info:  # a block read back
        from_anthropic({"role": "user", "content": [
            {"type": "text", "text": "x", "cache_control": cache_control}]})
    assert "content block 0 (text): " in str(info.value) and problem in str(info.value)
    # stamped some other way, it is refused when rendered, naming the message
    stamped = Message.user("x", metadata={"memstore": {"cache_control": cache_control}})
    with pytest.raises(InvalidInputError) as info:
        to_anthropic([stamped])
    assert str(info.value).startswith('a user message: metadata["memstore"]["cache_control"] ')
    assert problem.removeprefix("cache_control ") in str(info.value)


@pytest.mark.parametrize("cache_control", [
    {"type": "ephemeral"}, {"type": "ephemeral", "ttl": "5m"}, {"type": "ephemeral", "ttl": "1h"}])
def test_valid_cache_control_is_accepted(cache_control: dict[str, Any]) -> None:
    m = with_cache_control(Message.user("x"), cache_control)
    assert cache_control_of(m) == cache_control
    body = to_anthropic([m])
    assert body["messages"][0]["content"][0]["cache_control"] == cache_control
    assert_valid(CREATE, {"model": "m", "max_tokens": 1, **body})
