"""LlamaIndex: MemstoreMemory under a FunctionAgent and a chat engine, MemstoreChatStore's
contract beside LlamaIndex's own SimpleChatStore, and the ChatMessage mapping."""

from __future__ import annotations

import base64
import gc
import re
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

pytest.importorskip("llama_index.core", reason="llama-index-core is not installed "
                    "(pip install 'memstore[llama-index]')")

from llama_index.core.agent.workflow import FunctionAgent
from llama_index.core.base.llms.types import (
    AudioBlock,
    CacheControl,
    CachePoint,
    ChatMessage,
    CitableBlock,
    DocumentBlock,
    ImageBlock,
    TextBlock,
    ThinkingBlock,
    ToolCallBlock,
)
from llama_index.core.chat_engine import SimpleChatEngine
from llama_index.core.llms.mock import MockFunctionCallingLLM, MockLLM
from llama_index.core.memory import BaseMemory, ChatMemoryBuffer
from llama_index.core.storage.chat_store import BaseChatStore, SimpleChatStore
from llama_index.core.tools import FunctionTool

from memstore import (
    AsyncMemoryStore,
    ConfigurationError,
    ContextBudgetError,
    ImagePart,
    InvalidInputError,
    MemoryStore,
    Message,
    TextPart,
    TokenLimitedView,
    ToolCall,
    UnboundedView,
)
from memstore.integrations.llama_index import (
    MemstoreChatStore,
    MemstoreMemory,
    from_memstore,
    to_memstore,
)
from tests.helpers import call
from tests.integrations import (
    assert_constructor_refuses_what_the_store_would,
    assert_openai_history_valid,
    close_store,
    open_store,
)

# LlamaIndex's agent workflows read deprecated pydantic attributes while they are built
# (inspect.getmembers over the agent): LlamaIndex's warnings, not memstore's.
pytestmark = [
    pytest.mark.filterwarnings("ignore::pydantic.warnings.PydanticDeprecatedSince20"),
    pytest.mark.filterwarnings("ignore::pydantic.warnings.PydanticDeprecatedSince211"),
]

ROOT = Path(__file__).resolve().parent.parent.parent
PNG = ("iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAA"
       "AABJRU5ErkJggg==")


class Call(BaseModel):
    """A pydantic object in additional_kwargs, as LLM integrations put them there."""

    id: str
    type: str = "function"
    function: dict[str, Any]


def normalized(message: ChatMessage) -> ChatMessage:
    """The message as LlamaIndex's own JSON gives it back (what memstore promises)."""
    return ChatMessage.model_validate_json(message.model_dump_json())


def messages_to_map(tmp_path: Path) -> list[ChatMessage]:
    """ChatMessages covering every role, block and tool-call form LlamaIndex has."""
    picture = tmp_path / "cat.jpg"
    picture.write_bytes(base64.b64decode(PNG))
    return [
        ChatMessage(role="system", content="You are terse."),
        ChatMessage(role="developer", content="Answer in French."),
        ChatMessage(role="user", content="héllo ハロー 👋"),
        ChatMessage(role="user", blocks=[
            TextBlock(text="What is on these?"), ImageBlock(image=PNG.encode()),
            ImageBlock(url="https://example.com/cat.png", detail="low"),
            ImageBlock(url=f"data:image/png;base64,{PNG}"), ImageBlock(path=picture),
            AudioBlock(audio=b"RIFF", format="wav"), TextBlock(text="second text"),
        ]),
        ChatMessage(role="user", blocks=[ImageBlock(image=PNG.encode(), detail="weird")]),
        ChatMessage(role="user", blocks=[ImageBlock(image=b"not an image")]),  # no mime type
        ChatMessage(role="user"),  # no blocks at all
        ChatMessage(role="user", content=""),
        ChatMessage(role="assistant", blocks=[
            ThinkingBlock(content="hmm", additional_information={"signature": "s1"}),
            TextBlock(text="Let me look."),
            ToolCallBlock(tool_call_id="c1", tool_name="search", tool_kwargs={"q": "é", "n": 2}),
            ToolCallBlock(tool_call_id="c2", tool_name="raw", tool_kwargs='{"x": 1}'),
            ToolCallBlock(tool_call_id="c3", tool_name="partial", tool_kwargs='{"x": '),
            ToolCallBlock(tool_call_id=None, tool_name="no_id"),
            ToolCallBlock(tool_call_id="c1", tool_name="duplicate_id"),
        ]),
        ChatMessage(role="tool", content="found", additional_kwargs={"tool_call_id": "c1"}),
        ChatMessage(role="tool",
                    blocks=[TextBlock(text="a chart:"), ImageBlock(image=PNG.encode())],
                    additional_kwargs={"tool_call_id": "c2", "name": "raw"}),
        ChatMessage(role="tool", content="?", additional_kwargs={"tool_call_id": "c3"}),
        ChatMessage(role="assistant", content=None, additional_kwargs={"tool_calls": [
            {"id": "o1", "type": "function", "function": {"name": "f", "arguments": "{}"}},
            Call(id="o2", function={"name": "g", "arguments": '{"a": [1, 2]}'}),
            {"id": "o3", "function": {"name": "h", "arguments": {"as": "dict"}}},
            {"id": 7, "function": {"name": "bad id"}},
        ]}),
        ChatMessage(role="tool", content="1", additional_kwargs={"tool_call_id": "o1"}),
        ChatMessage(role="tool", content="2", additional_kwargs={"tool_call_id": "o2"}),
        ChatMessage(role="tool", content="3", additional_kwargs={"tool_call_id": "o3"}),
        ChatMessage(role="assistant", blocks=[
            ToolCallBlock(tool_call_id="b1", tool_name="both", tool_kwargs={})],
            additional_kwargs={"tool_calls": [{
                "id": "b1", "type": "function", "function": {"name": "both", "arguments": "{}"}}]}),
        ChatMessage(role="tool", content="ok", additional_kwargs={"tool_call_id": "b1"}),
        ChatMessage(role="assistant", blocks=[
            DocumentBlock(data=b"%PDF-1.4", document_mimetype="application/pdf", title="doc"),
            CachePoint(cache_control=CacheControl(type="ephemeral")),
            CitableBlock(title="t", source="s", content=[TextBlock(text="cited")]),
            ImageBlock(url="https://example.com/out.png"),
        ], additional_kwargs={"raw": b"\x00\x01", "nested": {"a": [1, None, True]}}),
        ChatMessage(role="chatbot", content="Cohere's assistant"),
        ChatMessage(role="model", content="Gemini's assistant"),
        ChatMessage(role="function", content="legacy result", additional_kwargs={
            "tool_call_id": "o1", "name": "f"}),
        ChatMessage(role="assistant", content="plain answer"),
    ]


# ---- the mapping -----------------------------------------------------------------------------


def test_every_message_reads_back_as_llama_index_serializes_it(tmp_path: Path) -> None:
    for message in messages_to_map(tmp_path):
        stored = to_memstore(message)
        assert from_memstore([stored]) == [normalized(message)], message
        # memstore's own form is valid whatever was stashed
        Message.model_validate(stored.model_dump())


def test_what_memstore_counts_and_renders(tmp_path: Path) -> None:
    got = [to_memstore(m) for m in messages_to_map(tmp_path)]
    assert [m.role for m in got[:3]] == ["system", "developer", "user"]
    assert got[0].content == "You are terse." and got[0].metadata == {}
    images = got[3]
    assert isinstance(images.content, list)
    assert [type(p).__name__ for p in images.content] == [
        "TextPart", "ImagePart", "ImagePart", "ImagePart", "TextPart"]
    urls = [p.image_url for p in images.content if isinstance(p, ImagePart)]
    assert urls[0].url == f"data:image/png;base64,{PNG}" and urls[0].detail is None
    assert urls[1].url == "https://example.com/cat.png" and urls[1].detail == "low"
    stash = images.metadata["llama_index"]["blocks"]
    # the payload is stored once: the stash holds no image data
    assert PNG not in str(stash) and "example.com" not in str(stash)
    assert got[4].content == [ImagePart(image_url={"url": f"data:image/png;base64,{PNG}"})]
    assert got[5].content == "" and got[6].content == "" and got[7].content == ""
    assistant = got[8]
    assert assistant.content == "Let me look."
    assert assistant.tool_calls == [
        ToolCall(id="c1", name="search", arguments='{"q": "é", "n": 2}'),
        ToolCall(id="c2", name="raw", arguments='{"x": 1}'),
        ToolCall(id="c3", name="partial", arguments='{"x": ')]
    assert got[9].tool_call_id == "c1" and got[9].metadata == {}
    assert got[10].content == "a chart:" and got[10].tool_call_id == "c2"
    assert [c.id for c in got[12].tool_calls or ()] == ["o1", "o2", "o3"]
    assert got[12].tool_calls[2].arguments == '{"as": "dict"}'  # type: ignore[index]
    assert [c.id for c in got[16].tool_calls or ()] == ["b1"]
    assert [m.role for m in got[-4:]] == ["assistant", "assistant", "tool", "assistant"]
    assert got[-2].tool_call_id == "o1"
    assert got[-1].metadata == {}


def test_messages_memstore_has_no_role_for_are_refused() -> None:
    with pytest.raises(InvalidInputError, match="function"):
        to_memstore(ChatMessage(role="function", content="x"))
    with pytest.raises(InvalidInputError, match="tool_call_id"):
        to_memstore(ChatMessage(role="tool", content="x"))
    with pytest.raises(InvalidInputError, match="ChatMessage"):
        to_memstore("hello")  # type: ignore[arg-type]
    with pytest.raises(InvalidInputError, match="JSON"):
        to_memstore(ChatMessage(role="user", content="x", additional_kwargs={"o": object()}))


def test_messages_other_writers_stored_read_as_chat_messages() -> None:
    written = [
        Message.system("rules"),
        Message.user([TextPart(text="see"), ImagePart(image_url={"url": "https://x.org/a.png",
                                                                 "detail": "high"})]),
        Message.user("named", name="alice"),
        Message.assistant(tool_calls=[ToolCall(id="c1", name="f", arguments='{"a": 1}'),
                                      ToolCall(id="c2", name="g", arguments="not json")]),
        Message.tool("r1", tool_call_id="c1"),
        Message.tool("r2", tool_call_id="c2"),
        Message.user([ImagePart(image_url={"url": "gs://bucket/a.png"})]),  # not a URL to LI
        Message.assistant("done", metadata={"llama_index": {"blocks": "damaged"}}),
    ]
    got = from_memstore(written)
    assert got[0] == ChatMessage(role="system", content="rules")
    assert got[1].blocks[1] == ImageBlock(url="https://x.org/a.png", detail="high")
    assert got[2].additional_kwargs == {"name": "alice"}
    assert got[3].blocks == [ToolCallBlock(tool_call_id="c1", tool_name="f", tool_kwargs={"a": 1}),
                             ToolCallBlock(tool_call_id="c2", tool_name="g",
                                           tool_kwargs="not json")]
    assert got[4].additional_kwargs == {"tool_call_id": "c1"}
    assert str(got[6].blocks[0].url) == "gs://bucket/a.png"  # type: ignore[union-attr]
    assert got[7] == ChatMessage(role="assistant", content="done")  # a bad stash is ignored


def test_a_block_whose_file_is_gone_still_reads_back(tmp_path: Path) -> None:
    picture = tmp_path / "cat.jpg"
    picture.write_bytes(b"jpeg")
    stored = to_memstore(ChatMessage(role="user", blocks=[ImageBlock(path=picture)]))
    picture.unlink()
    [back] = from_memstore([stored])
    assert isinstance(back.blocks[0], ImageBlock) and back.blocks[0].path == picture


def test_read_messages_are_copies() -> None:
    stored = to_memstore(ChatMessage(role="assistant", content="x",
                                     additional_kwargs={"k": {"a": 1}}))
    first = from_memstore([stored])[0]
    first.additional_kwargs["k"]["a"] = 2
    assert from_memstore([stored])[0].additional_kwargs == {"k": {"a": 1}}


async def test_everything_round_trips_through_the_database(store: Any, tmp_path: Path) -> None:
    memory = MemstoreMemory("rt", store)
    messages = messages_to_map(tmp_path)
    await memory.aput_messages(messages)
    assert await memory.aget_all() == [normalized(m) for m in messages]
    # the window: every complete unit (the function result answering no call is left out)
    orphan = next(i for i, m in enumerate(messages) if m.role.value == "function")
    assert await memory.aget() == [normalized(m) for i, m in enumerate(messages) if i != orphan]
    window = await call(store.window("rt", UnboundedView()))
    assert_openai_history_valid(window.to_openai())
    # a new store object on the same database reads the same
    if isinstance(store, MemoryStore):
        again = MemoryStore(str(store.engine.url.render_as_string(hide_password=False)),
                            counter=store.counter)
        assert MemstoreMemory("rt", again).get_all() == [normalized(m) for m in messages]
        again.close()


# ---- the memory under an agent and a chat engine ---------------------------------------------


def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


class Scripted:
    """An LLM's answers: add on a "sum" question, answer from a tool result, else recount."""

    def __init__(self) -> None:
        self.seen: list[list[ChatMessage]] = []

    def __call__(self, messages: Any, **kwargs: Any) -> ChatMessage:
        self.seen.append(list(messages))
        last = messages[-1]
        if last.role.value == "tool":
            return ChatMessage(role="assistant", content=f"The sum is {last.content}.")
        if "sum" in (last.content or ""):
            return ChatMessage(role="assistant", blocks=[ToolCallBlock(
                tool_call_id=f"call-{len(self.seen)}", tool_name="add",
                tool_kwargs={"a": 2, "b": 3})])
        return ChatMessage(role="assistant", content=f"I was sent {len(messages)} messages.")


def agent(script: Scripted) -> FunctionAgent:
    llm = MockFunctionCallingLLM(response_generator=script)
    return FunctionAgent(tools=[FunctionTool.from_defaults(add)], llm=llm,
                         system_prompt="Use the tools.")


@pytest.fixture(params=["sync", "async"])
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


async def test_a_function_agent_remembers_across_restarts(db_url: str, kind: str) -> None:
    store = await open_store(kind, db_url)
    assert isinstance(MemstoreMemory("a", store), BaseMemory)  # type: ignore[arg-type]
    script = Scripted()
    memory = MemstoreMemory("agent-1", store, view=TokenLimitedView(token_limit=4000))  # type: ignore[arg-type]
    output = await agent(script).run(user_msg="What is the sum of 2 and 3?", memory=memory)
    assert str(output) == "The sum is 5."
    # the tool call went to the LLM with its result
    assert [m.role.value for m in script.seen[-1]] == ["system", "user", "assistant", "tool"]
    await close_store(store)
    del memory, store
    gc.collect()

    store = await open_store(kind, db_url)
    script = Scripted()
    memory = MemstoreMemory("agent-1", store, view=TokenLimitedView(token_limit=4000))  # type: ignore[arg-type]
    output = await agent(script).run(user_msg="What did I ask?", memory=memory)
    assert str(output) == "I was sent 6 messages."
    sent = script.seen[0]
    assert [m.role.value for m in sent] == [
        "system", "user", "assistant", "tool", "assistant", "user"]
    assert sent[1].content == "What is the sum of 2 and 3?"
    assert sent[2].blocks == [ToolCallBlock(tool_call_id="call-1", tool_name="add",
                                            tool_kwargs={"a": 2, "b": 3})]
    assert sent[3].additional_kwargs == {"tool_call_id": "call-1"} and sent[3].content == "5"
    stored = await call(store.messages("agent-1"))  # type: ignore[attr-defined]
    assert [(m.role, m.text) for m in stored] == [
        ("user", "What is the sum of 2 and 3?"), ("assistant", ""), ("tool", "5"),
        ("assistant", "The sum is 5."), ("user", "What did I ask?"),
        ("assistant", "I was sent 6 messages.")]
    assert stored[1].tool_calls == [ToolCall(id="call-1", name="add", arguments='{"a": 2, "b": 3}')]
    await close_store(store)


async def test_a_budgeted_view_cuts_what_the_agent_is_sent(store: Any) -> None:
    script = Scripted()
    view = TokenLimitedView(token_limit=60)
    for turn in range(12):
        memory = MemstoreMemory("long", store, view=view)
        await agent(script).run(user_msg=f"Question {turn}: what is the sum?", memory=memory)
    stored = await call(store.messages("long"))
    assert len(stored) == 12 * 4
    sent = script.seen[-1]
    assert len(sent) < len(stored) // 3, "the agent was sent a cut window, not the history"
    counter = view.resolve_counter(store.counter)
    history = await MemstoreMemory("long", store, view=view).aget()
    assert counter.count_messages([to_memstore(m) for m in history]) <= 60
    assert_openai_history_valid([to_memstore(m).to_openai() for m in history])


async def test_initial_token_count_is_charged_to_the_budget(store: Any) -> None:
    memory = MemstoreMemory("room", store, view=TokenLimitedView(token_limit=60))
    await memory.aput_messages([ChatMessage(role="user" if i % 2 == 0 else "assistant",
                                            content=f"message {i} " + "word " * 5)
                                for i in range(20)])
    full = await memory.aget()
    less = await memory.aget(initial_token_count=25)
    assert 0 < len(less) < len(full) and less == full[len(full) - len(less):]
    with pytest.raises(ContextBudgetError):
        await memory.aget(initial_token_count=60)


def test_a_chat_engine_remembers_across_restarts(db_url: str) -> None:
    store = MemoryStore(db_url)
    engine = SimpleChatEngine.from_defaults(llm=MockLLM(), memory=MemstoreMemory("e", store))
    first = engine.chat("My name is Ada.").response  # MockLLM echoes its prompt
    assert "My name is Ada." in first
    store.close()

    store = MemoryStore(db_url)
    engine = SimpleChatEngine.from_defaults(llm=MockLLM(), memory=MemstoreMemory("e", store))
    second = engine.chat("What is my name?").response
    assert second.index("My name is Ada.") < second.index("What is my name?")
    assert [m.role for m in store.messages("e")] == ["user", "assistant", "user", "assistant"]
    store.close()


async def test_memory_methods(store: Any) -> None:
    memory = MemstoreMemory("m", store)
    assert await memory.aget() == [] and await memory.aget_all() == []
    await memory.aput(ChatMessage(role="user", content="one"))
    await memory.aput_messages([ChatMessage(role="assistant", content="two")])
    await memory.aput_messages([])
    assert [m.content for m in await memory.aget()] == ["one", "two"]
    await memory.aset([ChatMessage(role="user", content="replaced")])
    assert [m.content for m in await memory.aget_all()] == ["replaced"]
    with pytest.raises(InvalidInputError):
        await memory.aput_messages([ChatMessage(role="user", content="ok"),
                                    ChatMessage(role="function", content="refused")])
    assert [m.content for m in await memory.aget_all()] == ["replaced"], "nothing written"
    await memory.areset()
    assert await memory.aget_all() == []
    await MemstoreMemory("never", store).areset()  # a no-op
    await MemstoreMemory("fresh", store).aset([ChatMessage(role="user", content="new")])
    assert [m.content for m in await MemstoreMemory("fresh", store).aget()] == ["new"]
    if isinstance(store, MemoryStore):
        memory.put(ChatMessage(role="user", content="sync"))
        memory.put_messages([ChatMessage(role="assistant", content="too")])
        assert [m.content for m in memory.get()] == ["sync", "too"] == \
            [m.content for m in memory.get_all()]
        memory.set([ChatMessage(role="user", content="set")])
        memory.reset()
        assert memory.get() == []
    else:
        for method, args in [("get", ()), ("get_all", ()), ("put", (ChatMessage(),)),
                             ("put_messages", ([],)), ("set", ([],)), ("reset", ())]:
            with pytest.raises(ConfigurationError, match="AsyncMemoryStore"):
                getattr(memory, method)(*args)


async def test_the_turn_in_progress_is_given_back(store: Any) -> None:
    memory = MemstoreMemory("p", store, view=TokenLimitedView(token_limit=300))
    call_block = ToolCallBlock(tool_call_id="c1", tool_name="add", tool_kwargs={"a": 1, "b": 2})
    await memory.aput_messages([ChatMessage(role="user", content="sum?"),
                                ChatMessage(role="assistant", blocks=[call_block])])
    got = await memory.aget()
    assert [m.role.value for m in got] == ["user", "assistant"] and got[1].blocks == [call_block]


def test_constructor_and_from_defaults(tmp_path: Path) -> None:
    store = MemoryStore(f"sqlite:///{tmp_path / 'c.db'}")
    assert_constructor_refuses_what_the_store_would(MemstoreMemory, store, "conversation_id")
    memory = MemstoreMemory.from_defaults(
        "d", store, view=TokenLimitedView(token_limit=100),
        chat_history=[ChatMessage(role="user", content="hi")])
    assert memory.conversation_id == "d" and memory.store is store
    assert isinstance(memory.view, TokenLimitedView)
    assert [m.content for m in memory.get()] == ["hi"]
    with pytest.raises(ConfigurationError, match="token_limit"):
        MemstoreMemory.from_defaults("d", store, token_limit=10)
    with pytest.raises(ConfigurationError, match="needs"):
        MemstoreMemory.from_defaults()
    assert memory.to_dict() == {"conversation_id": "d", "class_name": "MemstoreMemory"}
    store.close()


# ---- the chat store: LlamaIndex's SimpleChatStore contract, on both stores ------------------
#
# LlamaIndex's own chat-store tests (llama-index-core/tests/storage/chat_store/
# test_simple_chat_store.py) construct a SimpleChatStore directly, so they cannot be pointed
# at another BaseChatStore. These tests check the same behaviour — and more — with the same
# calls on SimpleChatStore (the reference) and MemstoreChatStore, and compare the answers.


def text(role: str, content: str) -> ChatMessage:
    return ChatMessage(role=role, content=content)


class Both:
    """One chat-store call on the reference and on memstore's; their answers must agree.

    memstore's is called through its sync methods on a MemoryStore, its async ones on an
    AsyncMemoryStore.
    """

    def __init__(self, chats: MemstoreChatStore) -> None:
        self.reference = SimpleChatStore()
        self.chats = chats

    async def __call__(self, method: str, *args: Any, **kwargs: Any) -> Any:
        expected = getattr(self.reference, method)(*args, **kwargs)
        if isinstance(self.chats.store, MemoryStore):
            got = getattr(self.chats, method)(*args, **kwargs)
        else:
            name = "async_add_message" if method == "add_message" else f"a{method}"
            got = await getattr(self.chats, name)(*args, **kwargs)
        assert got == expected, (method, args)
        return got

    async def same(self, *keys: str) -> None:
        for key in keys:
            assert await self.chats.aget_messages(key) == self.reference.get_messages(key)


async def test_chat_store_agrees_with_simple_chat_store(store: Any) -> None:
    both = Both(MemstoreChatStore(store))
    assert isinstance(both.chats, BaseChatStore)
    for key, content in [("user1", "hello"), ("user1", "world"), ("user2", "hello"),
                         ("user2", "world")]:
        await both("add_message", key, text("user", content))
    await both.same("user1", "user2")
    assert sorted(await both.chats.aget_keys()) == sorted(both.reference.get_keys())
    # insert before an index (list.insert's rules)
    await both("add_message", "user1", text("user", "first"), idx=0)
    await both("add_message", "user1", text("user", "second-to-last"), idx=-1)
    await both("add_message", "user1", text("user", "past the end"), idx=99)
    await both("add_message", "user1", text("user", "before the start"), idx=-99)
    await both.same("user1")
    # delete by index: a Python list index, None out of range
    await both("delete_message", "user1", 1)
    await both("delete_message", "user1", -1)
    await both("delete_message", "user1", 0)
    assert await both("delete_message", "user1", 42) is None
    assert await both("delete_message", "nobody", 0) is None
    await both.same("user1")
    # deleting everything returns it; the key is gone
    deleted = await both("delete_messages", "user1")
    assert deleted and len(deleted) == 3
    assert await both("delete_messages", "nobody") is None
    await both.same("user1", "user2")
    assert await both.chats.aget_keys() == ["user2"]
    # the newest message
    assert await both("delete_last_message", "user2") == text("user", "world")
    assert await both("delete_last_message", "nobody") is None
    # set
    await both("set_messages", "user2", [text("system", "s"), text("user", "u")])
    await both("set_messages", "user3", [text("user", "new key")])
    await both.same("user2", "user3")
    assert sorted(await both.chats.aget_keys()) == ["user2", "user3"]


async def test_chat_store_edges_simple_chat_store_gets_wrong(store: Any) -> None:
    """Out-of-range deletes return None, as LlamaIndex's current chat-store tests expect
    (llama-index-core 0.14's SimpleChatStore raises IndexError there), and a key exists
    while it holds messages."""
    chats = MemstoreChatStore(store)
    await chats.async_add_message("k", text("user", "hello"))
    # an out-of-bounds negative index is None
    assert await chats.adelete_message("k", -2) is None
    assert await chats.adelete_last_message("k") == text("user", "hello")
    # an emptied history has nothing to delete
    assert await chats.adelete_last_message("k") is None
    assert await chats.adelete_message("k", -1) is None
    assert await chats.adelete_messages("k") is None
    # a key exists while it holds messages: set to [] removes it from get_keys()
    await chats.aset_messages("k", [text("user", "x")])
    await chats.aset_messages("k", [])
    assert await chats.aget_keys() == [] and await chats.aget_messages("k") == []
    await chats.aset_messages("never", [])
    assert await chats.aget_keys() == []
    with pytest.raises(InvalidInputError, match="idx"):
        await chats.adelete_message("k", "0")  # type: ignore[arg-type]
    with pytest.raises(InvalidInputError, match="key"):
        await chats.aget_messages("")


async def test_positional_writes_keep_the_other_messages(store: Any) -> None:
    chats = MemstoreChatStore(store)
    await chats.aset_messages("p", [text("user", str(i)) for i in range(5)])
    before = await call(store.messages("p"))
    assert await chats.adelete_message("p", 2) == text("user", "2")
    after = await call(store.messages("p"))
    # the messages after it keep their ids (a rewrite, not a copy)
    assert [m.id for m in after] == [m.id for i, m in enumerate(before) if i != 2]
    assert [m.seq for m in after] == [1, 2, 3, 4]
    await chats.async_add_message("p", text("user", "x"), idx=1)
    assert [m.content for m in await chats.aget_messages("p")] == ["0", "x", "1", "3", "4"]


async def test_a_positional_write_reads_again_when_the_conversation_moved(store: Any) -> None:
    """An append lands after the conversation's bounds were read and before the rewrite:
    the rewrite sees it, and the bounds are read again."""
    chats = MemstoreChatStore(store)
    await chats.aset_messages("race", [text("user", str(i)) for i in range(3)])
    messages = store.messages
    raced: list[bool] = []

    def spy(cid: str, **kwargs: Any) -> Any:
        if not kwargs.get("newest_first") or raced:
            return messages(cid, **kwargs)
        raced.append(True)
        if isinstance(store, MemoryStore):
            newest = messages(cid, **kwargs)
            store.append(cid, Message.user("late"))
            return newest

        async def later() -> Any:
            newest = await messages(cid, **kwargs)
            await store.append(cid, Message.user("late"))
            return newest
        return later()

    store.messages = spy
    try:
        assert await chats.adelete_message("race", 1) == text("user", "1")
    finally:
        del store.messages
    assert raced
    assert [m.content for m in await chats.aget_messages("race")] == ["0", "2", "late"]


def test_chat_store_sync_methods(tmp_path: Path) -> None:
    chats = MemstoreChatStore(MemoryStore(f"sqlite:///{tmp_path / 's.db'}"))
    chats.set_messages("k", [text("user", "a"), text("assistant", "b")])
    chats.add_message("k", text("user", "c"))
    chats.add_message("k", text("user", "0"), idx=0)
    assert [m.content for m in chats.get_messages("k")] == ["0", "a", "b", "c"]
    assert chats.delete_message("k", 0) == text("user", "0")
    assert chats.delete_last_message("k") == text("user", "c")
    assert chats.get_keys() == ["k"]
    assert chats.delete_messages("k") == [text("user", "a"), text("assistant", "b")]
    assert chats.get_keys() == [] and chats.get_messages("k") == []
    assert chats.class_name() == "MemstoreChatStore"
    chats.store.close()  # type: ignore[union-attr]


async def test_chat_store_sync_methods_refuse_an_async_store(tmp_path: Path) -> None:
    store = AsyncMemoryStore(f"sqlite:///{tmp_path / 'a.db'}")
    await store.setup()
    chats = MemstoreChatStore(store)
    for method, args in [("get_messages", ("k",)), ("set_messages", ("k", [])),
                         ("add_message", ("k", text("user", "x"))), ("delete_messages", ("k",)),
                         ("delete_message", ("k", 0)), ("delete_last_message", ("k",)),
                         ("get_keys", ())]:
        with pytest.raises(ConfigurationError, match="async methods"):
            getattr(chats, method)(*args)
    with pytest.raises(ConfigurationError, match="MemoryStore"):
        MemstoreChatStore(object())  # type: ignore[arg-type]
    await store.close()


async def test_get_keys_pages_through_the_conversations(store: Any, monkeypatch: Any) -> None:
    import memstore.integrations.llama_index as adapter

    monkeypatch.setattr(adapter, "_PAGE", 3)
    chats = MemstoreChatStore(store)
    for i in range(7):
        await call(store.append(f"k{i}", Message.user("x")))
    await call(store.create_conversation("k35-empty"))
    assert await chats.aget_keys() == [f"k{i}" for i in range(7)]


def test_chat_memory_buffer_on_the_chat_store(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'b.db'}"
    memory = ChatMemoryBuffer.from_defaults(
        token_limit=40, chat_store=MemstoreChatStore(MemoryStore(url)),
        chat_store_key="buffer", tokenizer_fn=str.split)
    for i in range(10):
        memory.put(text("user" if i % 2 == 0 else "assistant", f"message {i} a b c"))
    assert len(memory.get_all()) == 10 and 0 < len(memory.get()) < 10
    again = ChatMemoryBuffer.from_defaults(
        token_limit=40, chat_store=MemstoreChatStore(MemoryStore(url)),
        chat_store_key="buffer", tokenizer_fn=str.split)
    assert again.get_all() == memory.get_all()


# ---- the page's example ----------------------------------------------------------------------


def test_the_docs_example_runs(tmp_path: Path, monkeypatch: Any,
                               capsys: pytest.CaptureFixture[str]) -> None:
    from tests.integrations.test_docs import _expected_output

    page = (ROOT / "docs" / "integrations" / "llama_index.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", page, flags=re.S)
    assert blocks
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MEMSTORE_URL", f"sqlite:///{tmp_path / 'docs.db'}")
    for index, code in enumerate(blocks):
        exec(compile(code, f"llama_index.md block {index}", "exec"), {"__name__": "__docs__"})
        printed = [" ".join(line.split()) for line in capsys.readouterr().out.splitlines()]
        assert printed == _expected_output(code), f"block {index}"
