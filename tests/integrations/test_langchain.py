"""LangChain: MemstoreChatMessageHistory in RunnableWithMessageHistory with a fake chat model."""

from __future__ import annotations

import base64
import gc
import itertools
import json
import os
import re
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from memstore import (
    ConfigurationError,
    ContextBudgetError,
    ImagePart,
    ImageURL,
    InvalidInputError,
    MemoryStore,
    Message,
    TextPart,
    TiktokenCounter,
    TokenLimitedView,
    ToolCall,
    UnboundedView,
)
from tests.helpers import call, examples
from tests.integrations import (
    BUDGETED_VIEWS,
    assert_constructor_refuses_what_the_store_would,
    assert_openai_history_valid,
    close_store,
    open_store,
    require,
)

require("langchain_core")

from langchain_core.chat_history import BaseChatMessageHistory  # noqa: E402
from langchain_core.language_models.fake_chat_models import (  # noqa: E402
    FakeMessagesListChatModel,
)
from langchain_core.messages import (  # noqa: E402
    AIMessage,
    AIMessageChunk,
    BaseMessage,
    ChatMessage,
    FunctionMessage,
    HumanMessage,
    SystemMessage,
    ToolMessage,
)
from langchain_core.messages.utils import convert_to_openai_messages  # noqa: E402
from langchain_core.runnables import RunnableLambda  # noqa: E402
from langchain_core.runnables.history import RunnableWithMessageHistory  # noqa: E402
from langchain_core.tools import tool  # noqa: E402

from memstore.integrations.langchain import (  # noqa: E402
    MemstoreChatMessageHistory,
    from_memstore,
    to_memstore,
)

# langchain-core 1.x deprecates RunnableWithMessageHistory (pointing at LangGraph) but ships
# it; it is the framework API the history is driven through here.
pytestmark = pytest.mark.filterwarnings(
    "ignore:RunnableWithMessageHistory is deprecated:DeprecationWarning")


@tool
def get_weather(city: str) -> str:
    """The weather in a city."""
    return f"sunny in {city}"


def calls(*cities: str, turn: int) -> AIMessage:
    return AIMessage(content="", id=f"run-{turn}", tool_calls=[
        {"name": "get_weather", "args": {"city": c}, "id": f"t{turn}-{i}"}
        for i, c in enumerate(cities)])


def openai_form(messages: list[BaseMessage]) -> list[dict[str, Any]]:
    """The OpenAI chat history langchain-openai sends for ``messages``.

    ``convert_to_openai_messages``, plus what langchain-openai adds: an AIMessage's
    ``invalid_tool_calls`` are sent as tool calls too (their raw arguments).
    """
    out: list[dict[str, Any]] = convert_to_openai_messages(messages)  # type: ignore[assignment]
    assert len(out) == len(messages)
    for message, form in zip(messages, out):
        if isinstance(message, AIMessage) and message.invalid_tool_calls:
            form.setdefault("tool_calls", []).extend(
                {"type": "function", "id": c["id"],
                 "function": {"name": c["name"], "arguments": c["args"]}}
                for c in message.invalid_tool_calls)
    return out


class Bot:
    """A fake chat model in RunnableWithMessageHistory, recording what the model is sent."""

    def __init__(self, store: Any, responses: list[BaseMessage], view: Any = None) -> None:
        self.seen: list[list[BaseMessage]] = []
        self.model = FakeMessagesListChatModel(responses=responses)

        def record(messages: list[BaseMessage]) -> list[BaseMessage]:
            self.seen.append(list(messages))
            return messages

        chain = RunnableLambda(record) | self.model
        self.chain = RunnableWithMessageHistory(
            chain, lambda sid: MemstoreChatMessageHistory(sid, store, view=view))

    async def send(self, value: Any, kind: str, session: str = "s1") -> BaseMessage:
        config: Any = {"configurable": {"session_id": session}}
        if kind == "sync":
            return self.chain.invoke(value, config)  # type: ignore[no-any-return]
        return await self.chain.ainvoke(value, config)  # type: ignore[no-any-return]

    def assert_valid(self) -> None:
        for messages in self.seen:
            assert_openai_history_valid(openai_form(messages))


async def tool_turn(bot: Bot, ai: BaseMessage, kind: str) -> BaseMessage:
    assert isinstance(ai, AIMessage) and ai.tool_calls
    results = [get_weather.invoke(tc) for tc in ai.tool_calls]
    assert all(isinstance(r, ToolMessage) for r in results)
    return await bot.send(results, kind)


@pytest.fixture(params=["sync", "async"])
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


async def test_chain_remembers_across_restarts(db_url: str, kind: str) -> None:
    store = await open_store(kind, db_url)
    bot = Bot(store, [calls("Paris", "Rome", turn=1), AIMessage("Both are sunny.")])
    ai = await bot.send([HumanMessage("Weather in Paris and Rome?")], kind)
    answer = await tool_turn(bot, ai, kind)
    assert answer.content == "Both are sunny."
    bot.assert_valid()
    # the second call was sent the pending AIMessage together with the new ToolMessages
    assert isinstance(bot.seen[1][1], AIMessage) and bot.seen[1][1].tool_calls
    await close_store(store)
    del bot, store, ai, answer
    gc.collect()

    store = await open_store(kind, db_url)
    bot = Bot(store, [AIMessage("You asked about Paris and Rome.")])
    await bot.send("Which cities did I ask about?", kind)
    seen = bot.seen[0]
    assert [type(m).__name__ for m in seen] == [
        "HumanMessage", "AIMessage", "ToolMessage", "ToolMessage", "AIMessage", "HumanMessage"]
    assert seen[0].content == "Weather in Paris and Rome?"
    assert seen[1].id == "run-1" and [c["args"] for c in seen[1].tool_calls] == [  # type: ignore[attr-defined]
        {"city": "Paris"}, {"city": "Rome"}]
    assert [m.tool_call_id for m in seen[2:4]] == ["t1-0", "t1-1"]  # type: ignore[attr-defined]
    bot.assert_valid()
    history = MemstoreChatMessageHistory("s1", store)  # type: ignore[arg-type]
    stored = await history.aget_messages()
    assert len(stored) == 7 and stored[-1].content == "You asked about Paris and Rome."
    await close_store(store)


async def test_budgeted_view_gives_a_valid_cut_window(db_url: str, kind: str) -> None:
    store = await open_store(kind, db_url)
    view = TokenLimitedView(token_limit=90)
    responses: list[BaseMessage] = []
    for turn in range(5):
        responses += [calls("Paris", "Rome", turn=turn), AIMessage(f"Answer {turn}.")]
    bot = Bot(store, responses, view=view)
    for turn in range(5):
        ai = await bot.send(f"Question {turn}: weather in Paris and Rome?", kind)
        await tool_turn(bot, ai, kind)
    bot.assert_valid()
    stored = await call(store.messages("s1"))
    assert len(stored) == 5 * 5
    assert max(len(m) for m in bot.seen) < len(stored), "the model got a cut window"
    window = await call(store.window("s1", view))
    assert window.report.omitted
    await close_store(store)


async def test_turn_in_progress(store: Any) -> None:
    history = MemstoreChatMessageHistory("p", store, view=TokenLimitedView(token_limit=300))
    pending = calls("Oslo", "Bergen", turn=1)
    await history.aadd_messages([HumanMessage("Weather?"), pending])
    got = await history.aget_messages()
    assert got == [HumanMessage("Weather?"), pending]
    window = await call(store.window("p", UnboundedView()))
    assert [m.role for m in window.messages] == ["user"], "a window on its own leaves it out"
    half = ToolMessage("rain", tool_call_id="t1-0")
    await history.aadd_messages([half])
    assert await history.aget_messages() == [HumanMessage("Weather?"), pending, half]
    rest = ToolMessage("no data", tool_call_id="t1-1", status="error")
    await history.aadd_messages([rest, AIMessage("Rain and snow.")])
    assert (await history.aget_messages())[-3:] == [half, rest, AIMessage("Rain and snow.")]
    body = (await call(store.window("p", UnboundedView()))).to_anthropic()
    assert body["messages"][2]["content"] == [
        {"type": "tool_result", "tool_use_id": "t1-0", "content": "rain"},
        {"type": "tool_result", "tool_use_id": "t1-1", "content": "no data", "is_error": True}]
    # a call the conversation moved on from is never given back
    await history.aadd_messages([calls("Nowhere", turn=2), HumanMessage("Forget it.")])
    final = await history.aget_messages()
    assert_openai_history_valid(openai_form(final))
    assert not any(getattr(m, "id", None) == "run-2" for m in final)


def words(n: int, word: str = "rain") -> str:
    return " ".join([word] * n)


@pytest.mark.parametrize("view", BUDGETED_VIEWS, ids=lambda v: type(v).__name__)
async def test_a_budgeted_view_leaves_room_for_the_turn_in_progress(store: Any,
                                                                   view: Any) -> None:
    history = MemstoreChatMessageHistory("b", store, view=view)
    await history.aadd_messages([SystemMessage("Be brief.")] + [
        m for i in range(10) for m in (HumanMessage(f"question {i} about the weather"),
                                       AIMessage(f"answer {i}: sunny all day"))])
    pending = calls("Oslo", "Bergen", turn=1)
    half = ToolMessage(words(12), tool_call_id="t1-0")
    await history.aadd_messages([HumanMessage("Weather in Oslo and Bergen?"), pending, half])
    counter = view.resolve_counter(store.counter)
    got = await history.aget_messages()
    assert got[-3:] == [HumanMessage("Weather in Oslo and Bergen?"), pending, half]
    assert got[0] == SystemMessage("Be brief.") and len(got) < 24, "the budget cut the window"
    # what is sent — the window and the turn in progress — fits the budget with its reserve
    used = counter.count_messages([to_memstore(m) for m in got]) + view.reserve
    assert used <= view.token_limit, (used, view.token_limit)
    if isinstance(store, MemoryStore):
        assert history.messages == got
    # once the call is answered it is an ordinary unit of the window
    await history.aadd_messages([ToolMessage("snow", tool_call_id="t1-1")])
    got = await history.aget_messages()
    assert_openai_history_valid(openai_form(got))
    assert counter.count_messages([to_memstore(m) for m in got]) + view.reserve <= 100


@pytest.mark.parametrize("view", BUDGETED_VIEWS, ids=lambda v: type(v).__name__)
async def test_a_turn_in_progress_too_big_for_the_budget_is_an_error(store: Any,
                                                                    view: Any) -> None:
    history = MemstoreChatMessageHistory("big", store, view=view)
    await history.aadd_messages([HumanMessage("Weather?"), calls("Oslo", "Bergen", turn=1),
                                 ToolMessage(words(120), tool_call_id="t1-0")])
    with pytest.raises(ContextBudgetError, match="turn in progress") as caught:
        await history.aget_messages()
    assert caught.value.budget == 100 and caught.value.required > 100
    if isinstance(store, MemoryStore):
        with pytest.raises(ContextBudgetError):
            history.messages  # noqa: B018
    # fits alone but not beside the anchored messages and the newest unit: the view's
    # own error, naming the turn in progress
    await history.aclear()
    await history.aadd_messages([SystemMessage(words(40, "rule")), HumanMessage("Weather?"),
                                 calls("Oslo", "Bergen", turn=1),
                                 ToolMessage(words(40), tool_call_id="t1-0")])
    with pytest.raises(ContextBudgetError, match="turn in progress") as caught:
        await history.aget_messages()
    assert caught.value.budget == 100 and caught.value.required > 100
    # without a budget the turn in progress is given back whatever its size
    unbounded = MemstoreChatMessageHistory("big", store)
    assert len(await unbounded.aget_messages()) == 4


async def test_a_write_answering_the_call_between_the_reads(store: Any) -> None:
    """The call is answered after the newest messages were read and before the window:
    the window, charged for the turn in progress, cannot hold the now complete unit
    once more, so the history is read again rather than failing."""
    history = MemstoreChatMessageHistory("race", store)
    first = ToolMessage(words(10), tool_call_id="t1-0")
    second = ToolMessage(words(10, "snow"), tool_call_id="t1-1")
    await history.aadd_messages([HumanMessage("Weather?"), calls("Oslo", "Bergen", turn=1),
                                 first])
    counter = store.counter
    everything = [to_memstore(m) for m in await history.aget_messages()] + [to_memstore(second)]
    view = TokenLimitedView(token_limit=counter.count_messages(everything) + 5, reserve=5)
    window = store.window
    wrote: list[bool] = []

    def spy(cid: str, view: Any) -> Any:
        if isinstance(store, MemoryStore):
            if not wrote:
                wrote.append(True)
                store.append(cid, to_memstore(second))
            return window(cid, view)

        async def later() -> Any:
            if not wrote:
                wrote.append(True)
                await store.append(cid, to_memstore(second))
            return await window(cid, view)

        return later()

    store.window = spy
    try:
        got = await MemstoreChatMessageHistory("race", store, view=view).aget_messages()
    finally:
        del store.window
    assert wrote and got[-2:] == [first, second]
    assert_openai_history_valid(openai_form(got))


async def test_edges(store: Any) -> None:
    history = MemstoreChatMessageHistory("never", store)
    assert isinstance(history, BaseChatMessageHistory)
    assert await history.aget_messages() == []
    await history.aclear()
    with pytest.raises(InvalidInputError, match="FunctionMessage"):
        await history.aadd_messages([HumanMessage("kept?"), FunctionMessage("r", name="f")])
    assert await history.aget_messages() == [], "a rejected batch writes nothing"
    with pytest.raises(InvalidInputError, match="critic"):
        await history.aadd_messages([ChatMessage(role="critic", content="no")])
    await history.aadd_messages([HumanMessage("a"), AIMessage("b")])
    await history.aclear()
    assert await history.aget_messages() == []


async def test_sync_methods_need_a_sync_store(db_url: str, kind: str) -> None:
    store = await open_store(kind, db_url)
    history = MemstoreChatMessageHistory("x", store)  # type: ignore[arg-type]
    if kind == "sync":
        history.add_user_message("hi")
        history.add_ai_message("hello")
        assert [m.content for m in history.messages] == ["hi", "hello"]
        assert [m.content for m in await history.aget_messages()] == ["hi", "hello"]
        history.clear()
        assert history.messages == []
    else:
        for action in (lambda: history.messages, lambda: history.add_user_message("x"),
                       history.clear):
            with pytest.raises(ConfigurationError, match="aget_messages"):
                action()
    with pytest.raises(ConfigurationError, match="MemoryStore"):
        MemstoreChatMessageHistory("x", object())  # type: ignore[arg-type]
    await close_store(store)


async def test_an_invalid_tool_call_and_its_answer_stay_together(db_url: str, kind: str) -> None:
    store = await open_store(kind, db_url)
    broken = AIMessage("", id="run-1", invalid_tool_calls=[{
        "type": "invalid_tool_call", "id": "call_1", "name": "get_weather",
        "args": '{"city": "Par', "error": "Function get_weather arguments are not valid JSON"}])
    bot = Bot(store, [broken, AIMessage("Sorry: it is sunny in Paris.")],
              view=TokenLimitedView(token_limit=400))
    ai = await bot.send("Weather in Paris?", kind)
    assert ai == broken
    answer = ToolMessage("Error: the arguments were not valid JSON", tool_call_id="call_1",
                         status="error")
    await bot.send([answer], kind)
    bot.assert_valid()
    # the model was sent the malformed call with its answer, as LangChain had them
    assert bot.seen[1][1:] == [broken, answer]
    history = MemstoreChatMessageHistory("s1", store)  # type: ignore[arg-type]
    got = await history.aget_messages()
    assert got[:3] == [HumanMessage("Weather in Paris?"), broken, answer]
    assert got[3].content == "Sorry: it is sunny in Paris."
    assert isinstance(got[1], AIMessage) and got[1].tool_calls == []
    assert_openai_history_valid(openai_form(got))
    # memstore holds the call (arguments verbatim), so no view orphans the answer
    stored = await call(store.messages("s1"))
    assert [(c.id, c.arguments) for c in stored[1].tool_calls] == [("call_1", '{"city": "Par')]
    window = await call(store.window("s1", UnboundedView()))
    assert [m.role for m in window.messages] == ["user", "assistant", "tool", "assistant"]
    await close_store(store)


def test_valid_and_invalid_tool_calls_in_one_message() -> None:
    message = AIMessage("", tool_calls=[{"name": "f", "args": {"a": 1}, "id": "v"}],
                        invalid_tool_calls=[
                            {"type": "invalid_tool_call", "id": "i", "name": "g", "args": "{",
                             "error": "bad"},
                            {"type": "invalid_tool_call", "id": None, "name": "g", "args": "{",
                             "error": None},
                            {"type": "invalid_tool_call", "id": "v", "name": "f",
                             "args": '{"a": 1}', "error": "same id as a valid call"}])
    stored = to_memstore(message)
    assert [(c.id, c.name, c.arguments) for c in stored.tool_calls or ()] == [
        ("v", "f", '{"a": 1}'), ("i", "g", "{")]
    assert from_memstore([stored]) == [message]



async def test_tool_call_arguments_are_stored_as_langchain_sends_them(store: Any) -> None:
    """Non-ASCII arguments are stored unescaped (``ensure_ascii=False``, what
    ``convert_to_openai_messages`` sends), so they are counted as the model gets them."""
    args = {"query": "北京今天的天气怎么样，明天会下雨吗？请给出详细的预报", "emoji": "☔🌧"}
    ai = AIMessage("", tool_calls=[{"name": "search", "args": args, "id": "c1"}])
    answer = ToolMessage("晴", tool_call_id="c1")
    stored = to_memstore(ai)
    sent = convert_to_openai_messages([ai])[0]
    arguments = sent["tool_calls"][0]["function"]["arguments"]
    assert arguments == json.dumps(args, ensure_ascii=False)
    assert [c.arguments for c in stored.tool_calls or ()] == [arguments]
    counter = TiktokenCounter()
    assert counter.count_message(stored) == counter.count_message(Message.from_openai(sent))
    assert from_memstore([stored]) == [ai]
    # through the database: the same text, read back as the same messages
    history = MemstoreChatMessageHistory("unicode-args", store)
    await history.aadd_messages([HumanMessage("天气?"), ai, answer])
    rows = await call(store.messages("unicode-args"))
    assert [c.arguments for c in rows[1].tool_calls or ()] == [arguments]
    assert "\\u" not in rows[1].tool_calls[0].arguments
    assert from_memstore(rows) == [HumanMessage("天气?"), ai, answer]
    assert await history.aget_messages() == [HumanMessage("天气?"), ai, answer]


def test_arguments_memstore_cannot_store_raw_keep_their_escapes() -> None:
    """A lone surrogate cannot be stored as text: those arguments keep JSON's escapes."""
    args = {"text": "北京 \ud800"}
    ai = AIMessage("", tool_calls=[{"name": "f", "args": args, "id": "c1"}])
    stored = to_memstore(ai)
    assert [c.arguments for c in stored.tool_calls or ()] == [json.dumps(args)]
    assert "\\ud800" in json.dumps(args) and "\\u5317" in stored.tool_calls[0].arguments
    assert from_memstore([stored]) == [ai]

async def test_changing_returned_messages_does_not_change_the_history(store: Any) -> None:
    history = MemstoreChatMessageHistory("mut", store)
    written = [
        HumanMessage([{"type": "text", "text": "hi"}, {"type": "reasoning", "reasoning": "r"}],
                     additional_kwargs={"x": {"nested": [1, 2]}}),
        AIMessage("", tool_calls=[{"name": "f", "args": {"a": {"b": [1]}}, "id": "c"}],
                  invalid_tool_calls=[{"type": "invalid_tool_call", "id": "d", "name": "f",
                                       "args": "{", "error": "bad"}],
                  response_metadata={"model": {"name": "m"}},
                  usage_metadata={"input_tokens": 1, "output_tokens": 2, "total_tokens": 3}),
        ToolMessage("r", tool_call_id="c", artifact={"rows": [1, 2]}),
        ToolMessage("e", tool_call_id="d", status="error"),
    ]
    await history.aadd_messages(written)
    for _ in range(2):  # the second read may come from the store's cache
        got = await history.aget_messages()
        assert got == written
        got[0].additional_kwargs["x"]["nested"].append(3)
        got[0].content.append({"type": "text", "text": "more"})  # type: ignore[union-attr]
        got[0].content[1]["reasoning"] = "changed"  # type: ignore[index]
        got[1].response_metadata["model"]["name"] = "changed"
        got[1].tool_calls[0]["args"]["a"]["b"].append(2)  # type: ignore[attr-defined]
        got[1].invalid_tool_calls[0]["error"] = "changed"  # type: ignore[attr-defined]
        got[2].artifact["rows"].append(3)  # type: ignore[attr-defined]
    assert await history.aget_messages() == written


# ---- images -----------------------------------------------------------------------------------


def png(width: int, height: int) -> str:
    """Base64 of a PNG header (enough for memstore's counter to read the size)."""
    header = (b"\x89PNG\r\n\x1a\n" + (13).to_bytes(4, "big") + b"IHDR"
              + width.to_bytes(4, "big") + height.to_bytes(4, "big") + b"\x08\x06\x00\x00\x00")
    return base64.b64encode(header).decode()


_PNG = png(1024, 1024)
_WEB = "https://example.com/cat.png"
#: (name, LangChain image block, the memstore image part it stands for)
_IMAGE_BLOCKS: list[tuple[str, dict[str, Any], ImageURL]] = [
    ("openai", {"type": "image_url", "image_url": {"url": _WEB, "detail": "low"}},
     ImageURL(url=_WEB, detail="low")),
    ("anthropic base64",
     {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": _PNG}},
     ImageURL(url=f"data:image/png;base64,{_PNG}")),
    ("anthropic url", {"type": "image", "source": {"type": "url", "url": _WEB},
                       "cache_control": {"type": "ephemeral"}},
     ImageURL(url=_WEB)),
    ("v1 url", {"type": "image", "url": _WEB, "id": "lc_1"}, ImageURL(url=_WEB)),
    ("v1 url, detail", {"type": "image", "url": _WEB, "detail": "low"},
     ImageURL(url=_WEB, detail="low")),
    ("v1 base64", {"type": "image", "base64": _PNG, "mime_type": "image/png",
                   "extras": {"detail": "high"}},
     ImageURL(url=f"data:image/png;base64,{_PNG}", detail="high")),
    ("v1 base64, mime type read from the data", {"type": "image", "base64": _PNG},
     ImageURL(url=f"data:image/png;base64,{_PNG}")),
    ("v1 data url", {"type": "image", "url": f"data:image/png;base64,{_PNG}"},
     ImageURL(url=f"data:image/png;base64,{_PNG}")),
    ("legacy url", {"type": "image", "source_type": "url", "url": _WEB}, ImageURL(url=_WEB)),
    ("legacy base64",
     {"type": "image", "source_type": "base64", "data": _PNG, "mime_type": "image/png"},
     ImageURL(url=f"data:image/png;base64,{_PNG}")),
]


def with_image(block: dict[str, Any] | None) -> HumanMessage:
    """A HumanMessage with ``block`` between two text blocks (or the text blocks alone)."""
    image = [block] if block is not None else []
    return HumanMessage([{"type": "text", "text": "What is in"}, *image,
                         {"type": "text", "text": "this picture?"}], id="m1")


async def test_image_blocks_are_counted_and_rendered(store: Any) -> None:
    counter = TiktokenCounter()
    view = TokenLimitedView(token_limit=100_000, counter=counter)
    history = MemstoreChatMessageHistory("plain", store, view=view)
    await history.aadd_messages([with_image(None)])
    without = (await call(store.window("plain", view))).token_count
    for i, (name, block, image) in enumerate(_IMAGE_BLOCKS):
        message = with_image(block)
        history = MemstoreChatMessageHistory(f"img-{i}", store, view=view)
        await history.aadd_messages([message])
        assert await history.aget_messages() == [message], name
        assert from_memstore(await call(store.messages(f"img-{i}"))) == [message], name
        stored = (await call(store.messages(f"img-{i}")))[0]
        assert stored.content == [TextPart(text="What is in"), ImagePart(image_url=image),
                                  TextPart(text="this picture?")], name
        # the window's budget counts the image, as it would an image_url part
        window = await call(store.window(f"img-{i}", view))
        image_tokens = (counter.count_message(Message.user([ImagePart(image_url=image)]))
                        - counter.count_message(Message.user([])))
        assert image_tokens >= 85
        assert window.token_count == without + image_tokens, name
        # and memstore's renderers send it
        openai = window.to_openai()[0]["content"][1]
        assert openai["image_url"]["url"] == image.url, name
        anthropic = window.to_anthropic()["messages"][0]["content"][1]
        assert anthropic["type"] == "image", name


async def test_a_budget_leaves_room_for_an_image_sent_through_a_chain(
        db_url: str, kind: str) -> None:
    store = await open_store(kind, db_url)
    view = TokenLimitedView(token_limit=800, counter=TiktokenCounter())
    picture = HumanMessage([{"type": "text", "text": "What is this?"},
                            {"type": "image", "source": {"type": "base64",
                                                         "media_type": "image/png",
                                                         "data": _PNG}}])
    # the image alone is 765 tokens: with it, the first question no longer fits the budget
    cat = AIMessage("A cat.", id="r2")
    bot = Bot(store, [AIMessage("Hello.", id="r1"), cat, AIMessage("Yes.", id="r3")], view=view)
    try:
        await bot.send("Hi there, I have a picture to show you.", kind)
        await bot.send([picture], kind)
        await bot.send("Is it a cat?", kind)
        seen = bot.seen[2]
        assert seen[-3:] == [picture, cat, HumanMessage("Is it a cat?")]
        assert HumanMessage("Hi there, I have a picture to show you.") not in seen
        window = await call(store.window("s1", view))
        assert 765 < window.token_count <= 800 and window.report.omitted
    finally:
        await close_store(store)


async def test_image_blocks_memstore_cannot_hold_stay_in_the_stash(store: Any) -> None:
    kept: list[dict[str, Any]] = [
        {"type": "image", "file_id": "file-1"},
        {"type": "image", "source_type": "id", "id": "file-1"},
        {"type": "image", "source": {"type": "file", "file_id": "file-1"}},
        {"type": "image", "base64": "AAAA"},  # no mime type, none readable from the data
        {"type": "image", "base64": _PNG, "mime_type": "application/pdf"},
        {"type": "image", "url": "gs://bucket/cat.png"},
        {"type": "image", "source": {"type": "base64", "data": "AAAA"}},
    ]
    messages: list[BaseMessage] = [with_image(b) for b in kept]
    # memstore holds images in user messages only
    messages.append(AIMessage([{"type": "image", "url": _WEB}]))
    messages.append(ToolMessage([{"type": "image", "base64": _PNG, "mime_type": "image/png"}],
                                tool_call_id="c"))
    await MemstoreChatMessageHistory("kept", store).aadd_messages(messages)
    stored_messages = await call(store.messages("kept"))
    assert from_memstore(stored_messages) == messages
    for stored in stored_messages:
        assert isinstance(stored.content, list)
        assert all(isinstance(part, TextPart) for part in stored.content)


async def test_an_image_memstore_refuses_writes_nothing(store: Any, monkeypatch: Any) -> None:
    history = MemstoreChatMessageHistory("bad", store)
    bad = {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                       "data": "AA\x00A"}}
    with pytest.raises(ValidationError, match="image url contains a NUL"):
        await history.aadd_messages([HumanMessage("first"), with_image(bad)])
    assert await history.aget_messages() == []
    # the size limit counts an image block's data twice when it is kept in the stash too
    monkeypatch.setattr("memstore._validate.MAX_RECORD_BYTES", 3000)
    data = "A" * 1600
    once = with_image({"type": "image_url", "image_url": {"url": f"data:image/png;base64,{data}"}})
    await history.aadd_messages([once])  # exactly memstore's part: not stashed
    with pytest.raises(ValidationError, match="largest record"):
        await history.aadd_messages([with_image({"type": "image", "base64": data,
                                                 "mime_type": "image/png"})])
    assert await history.aget_messages() == [once]


# ---- round trips -----------------------------------------------------------------------------

_text = st.text(st.characters(blacklist_categories=["Cs"], blacklist_characters="\x00"),
                max_size=8)
_json = st.recursive(st.none() | st.booleans() | st.integers() | _text,
                     lambda inner: st.lists(inner, max_size=2)
                     | st.dictionaries(st.text("abc", min_size=1, max_size=3), inner, max_size=2),
                     max_leaves=4)
_block = st.one_of(
    _text,
    st.builds(lambda t: {"type": "text", "text": t}, _text),
    st.builds(lambda u, d: {"type": "image_url", "image_url": {"url": u, **d}},
              st.sampled_from(["https://e.com/a.png", "data:image/png;base64,AAAA"]),
              st.sampled_from([{}, {"detail": "low"}])),
    st.sampled_from([block for _, block, _ in _IMAGE_BLOCKS] + [
        {"type": "image", "base64": "AAAA", "mime_type": "image/jpeg"},
        {"type": "image", "file_id": "file-1"},
        {"type": "image", "base64": "AAAA"}]),
    st.builds(lambda t: {"type": "reasoning", "reasoning": t}, _text),
)
_content = _text | st.lists(_block, max_size=3)
_ids = st.none() | st.text("abc123-", min_size=1, max_size=6)
_kwargs = st.dictionaries(st.sampled_from(["refusal", "x"]), _json, max_size=1)
_tool_call = st.builds(lambda n, a, i: {"name": n, "args": a, "id": i},
                       st.sampled_from(["f", "g"]),
                       st.dictionaries(st.text("xyz", min_size=1, max_size=2), _json, max_size=2),
                       st.text("abc123", min_size=1, max_size=4))
_invalid_call = st.builds(
    lambda n, a, i, e: {"type": "invalid_tool_call", "name": n, "args": a, "id": i, "error": e},
    st.none() | st.sampled_from(["f", "g"]),
    st.none() | st.sampled_from(['{"x": ', "{}", '{"x": 1}', "not json", ""]),
    st.none() | st.sampled_from(["", "a", "b1"]) | st.text("abc123", min_size=1, max_size=4),
    st.none() | st.sampled_from(["malformed JSON"]))
_name = st.none() | st.sampled_from(["alice", "x" * 300])
_message = st.one_of(
    st.builds(lambda c, i, n, k: HumanMessage(content=c, id=i, name=n, additional_kwargs=k),
              _content, _ids, _name, _kwargs),
    st.builds(lambda c, i, t, v, u: AIMessage(content=c, id=i, tool_calls=t,
                                              invalid_tool_calls=v, usage_metadata=u),
              _content, _ids, st.lists(_tool_call, max_size=2, unique_by=lambda t: t["id"]),
              st.lists(_invalid_call, max_size=2),
              st.none() | st.just({"input_tokens": 1, "output_tokens": 2, "total_tokens": 3})),
    st.builds(lambda c, k: SystemMessage(content=c, additional_kwargs=k), _content,
              st.sampled_from([{}, {"__openai_role__": "developer"}])),
    st.builds(lambda c, t, s, a: ToolMessage(content=c, tool_call_id=t, status=s, artifact=a),
              _content, st.text("abc123", min_size=1, max_size=4),
              st.sampled_from(["success", "error"]), _json),
    st.builds(lambda c, r: ChatMessage(content=c, role=r), _text,
              st.sampled_from(["user", "assistant", "system", "developer"])),
    st.builds(lambda c, i: AIMessageChunk(content=c, id=i), _text, _ids),
)


@settings(max_examples=examples(200), derandomize=True, deadline=None)
@given(st.lists(_message, max_size=5))
def test_round_trip_is_identity(messages: list[BaseMessage]) -> None:
    assert from_memstore([to_memstore(m) for m in messages]) == messages


_cids = itertools.count()


@settings(max_examples=examples(15), derandomize=True, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(messages=st.lists(_message, min_size=1, max_size=5))
async def test_round_trip_through_the_database(store: Any, messages: list[BaseMessage]) -> None:
    cid = f"rt-{next(_cids)}"
    history = MemstoreChatMessageHistory(cid, store)
    await history.aadd_messages(messages)
    assert from_memstore(await call(store.messages(cid))) == messages


def test_messages_from_elsewhere_read_back() -> None:
    foreign = [Message.developer("Be brief."),
               Message.assistant(tool_calls=[ToolCall(id="q", name="f", arguments="oops")]),
               Message.tool("r", tool_call_id="q", name="f")]
    got = from_memstore(foreign)
    assert got[0] == SystemMessage("Be brief.", additional_kwargs={"__openai_role__": "developer"})
    assert isinstance(got[1], AIMessage) and got[1].tool_calls == []
    assert got[1].invalid_tool_calls[0]["args"] == "oops"
    assert got[2] == ToolMessage("r", tool_call_id="q", name="f")


async def test_reads_grow_with_the_window_not_the_history(store: Any, monkeypatch: Any) -> None:
    """A long session read through a budgeted view: the adapter never reads it all."""
    turns = [m for i in range(1000) for m in (Message.user(f"question {i}"),
                                              Message.assistant(f"answer {i}"))]
    await call(store.extend("long", turns))
    reads: list[tuple[str, int]] = []
    window, messages = store.window, store.messages

    def spy_window(cid: str, view: Any) -> Any:
        result = window(cid, view)

        async def later() -> Any:
            got = await result
            reads.append(("window", got.report.rows_read))
            return got

        if hasattr(result, "__await__"):
            return later()
        reads.append(("window", result.report.rows_read))
        return result

    def spy_messages(cid: str, **kwargs: Any) -> Any:
        reads.append(("messages", kwargs.get("limit") or 10**9))
        return messages(cid, **kwargs)

    monkeypatch.setattr(store, "window", spy_window)
    monkeypatch.setattr(store, "messages", spy_messages)
    history = MemstoreChatMessageHistory("long", store, view=TokenLimitedView(token_limit=60))
    got = await history.aget_messages()
    assert 0 < len(got) < 20 and got[-1].content == "answer 999"
    assert reads and all(rows <= 64 for _, rows in reads), reads


async def test_constructor_refuses_what_the_store_would(store: Any) -> None:
    assert_constructor_refuses_what_the_store_would(MemstoreChatMessageHistory, store, "session_id")


# (pydantic warns when it dumps the model_construct-ed message with an int role)
@pytest.mark.filterwarnings("ignore:Pydantic serializer warnings:UserWarning")
async def test_a_damaged_stash_or_hostile_message_fails_cleanly(store: Any) -> None:
    """A ``metadata["langchain"]`` that LangChain cannot build a message from (another
    writer's, or damaged) made every later read of the session raise (ValueError,
    TypeError "unhashable"); it is ignored now, and the message read from its fields.
    A role repr() cannot show, and tool arguments nested past JSON's depth, raised raw."""
    await call(store.append("d", Message.user("one", metadata={"langchain": {"type": "nope"}})))
    await call(store.append("d", Message.user("two", metadata={"langchain": {"tool_calls": 5}})))
    await call(store.append("d", Message(
        role="assistant", content="three", tool_calls=[ToolCall(id="t", name="f", arguments="x")],
        metadata={"langchain": {"invalid_tool_calls": [{"id": ["x"], "name": "f",
                                                        "args": "x"}]}})))
    await call(store.append("d", Message.tool("r", tool_call_id="t")))
    history = MemstoreChatMessageHistory("d", store)
    got = await history.aget_messages()
    assert [type(m).__name__ for m in got] == ["HumanMessage", "HumanMessage", "AIMessage",
                                                "ToolMessage"]
    assert [m.content for m in got] == ["one", "two", "three", "r"]

    with pytest.raises(InvalidInputError, match="an integer of"):
        await history.aadd_messages([ChatMessage.model_construct(
            content="x", type="chat", role=10**5000, additional_kwargs={},
            response_metadata={})])
    assert len(await call(store.messages("d"))) == 4

    # Arguments nested 5,000 deep: Python 3.11's json gives up (RecursionError, raw
    # before), 3.13's parses them. Refused cleanly, or stored and read back.
    nested: dict[str, Any] = {}
    inner = nested
    for _ in range(5_000):
        inner["a"] = {}
        inner = inner["a"]
    deep = AIMessage(content="", tool_calls=[{"name": "f", "args": nested, "id": "n1"}])
    try:
        await history.aadd_messages([deep])
    except (InvalidInputError, ValidationError):
        assert len(await call(store.messages("d"))) == 4
    else:
        assert len(await call(store.messages("d"))) == 5
    await history.aget_messages()  # no raw exception either way


# ---- LangChain's deprecations: the user sees LangChain's, memstore adds none --------------

ROOT = Path(__file__).resolve().parents[2]

#: The async methods, as the page documents them, after its examples.
ASYNC_USE = '''
import asyncio

from langchain_core.messages import HumanMessage

from memstore import AsyncMemoryStore, MemoryStore, TokenLimitedView
from memstore.integrations.langchain import MemstoreChatMessageHistory


async def use_async():
    for store in (MemoryStore("sqlite:///sync.db"), AsyncMemoryStore("sqlite+aiosqlite:///async.db")):
        history = MemstoreChatMessageHistory("async", store, view=TokenLimitedView(token_limit=99))
        await history.aadd_messages([HumanMessage("hi")])
        assert [m.content for m in await history.aget_messages()] == ["hi"]
        await history.aclear()
        closed = store.close()
        if closed is not None:
            await closed


asyncio.run(use_async())
'''


def test_the_documented_use_warns_about_nothing(tmp_path: Path) -> None:
    """Constructing and using the history as documented emits no warning, and the page
    hides none: it silenced LangChain's deprecation of RunnableWithMessageHistory (the
    user's own call) with a global ``warnings.filterwarnings("ignore", ...)``.

    langchain-core 1.6.4 deprecates BaseChatMessageHistory, but its ``@deprecated`` warns
    only for direct instances; this runs in a fresh interpreter with every warning an
    error, so neither this session's filters nor LangChain's warn-once flags hide one.
    """
    page = (ROOT / "docs" / "integrations" / "langchain.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", page, flags=re.S)
    assert blocks
    for block in blocks:
        assert not re.search(r"filterwarnings|simplefilter|catch_warnings|suppress_langchain",
                             block), "a documented example hides a warning"
    script = "\n".join(["import warnings", "warnings.simplefilter('error')", *blocks, ASYNC_USE])
    result = subprocess.run(
        [sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True,
        env={**os.environ, "MEMSTORE_URL": f"sqlite:///{tmp_path / 'docs.db'}",
             "PYTHONPATH": str(ROOT)}, timeout=120, check=False)
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    assert "It is sunny in Paris." in result.stdout


def test_langchains_own_deprecation_reaches_the_user() -> None:
    """``RunnableWithMessageHistory`` (deprecated by langchain-core 1.3.3) still takes the
    history, and its warning — about the user's call — is not hidden by memstore; it is
    the only warning the documented history and a run through it give."""
    store = MemoryStore("sqlite://")
    try:
        model = FakeMessagesListChatModel(responses=[AIMessage("hello")])
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            chain = RunnableWithMessageHistory(
                model, lambda session_id: MemstoreChatMessageHistory(session_id, store))
            reply = chain.invoke("hi", {"configurable": {"session_id": "deprecated"}})
        assert reply.content == "hello"
        assert [type(w.message).__name__ for w in caught] == ["LangChainDeprecationWarning"]
        assert str(caught[0].message).startswith("RunnableWithMessageHistory is deprecated")
        assert [m.content for m in MemstoreChatMessageHistory("deprecated", store).messages
                ] == ["hi", "hello"]
    finally:
        store.close()
