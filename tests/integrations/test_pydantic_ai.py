"""MemstoreConversationStore and MemstoreHistoryProcessor under Pydantic AI, offline.

Every storage test runs on SQLite and PostgreSQL, with a MemoryStore and an
AsyncMemoryStore (the ``store`` fixture). Models are Pydantic AI's offline
``TestModel`` and ``FunctionModel``: nothing here touches the network.

Pydantic AI ships no tests of its conversation stores in its distributions (and the
repository snapshot at hand predates ``conversation_store``), so the contract tests
below are written from the base class's documented behaviour, and the differential
test checks memstore against Pydantic AI's own ``InMemoryConversationStore`` on random
sequences of saves, rewrites, branches, forks and deletes.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import json
import os
import subprocess
import sys
import textwrap
import uuid
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pydantic_ai", reason="pydantic-ai is not installed (memstore[pydantic-ai])")
pytest.importorskip("pydantic_ai.conversation_store",
                    reason="this Pydantic AI has no conversation_store (needs 2.x)")

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic_ai import Agent, ModelRetry
from pydantic_ai.capabilities import ProcessHistory
from pydantic_ai.conversation import Conversation
from pydantic_ai.conversation_store import (
    ConversationConflict,
    ConversationEntry,
    ConversationRecord,
    InMemoryConversationStore,
)
from pydantic_ai.messages import (
    BinaryContent,
    BinaryImage,
    ImageUrl,
    ModelMessage,
    ModelRequest,
    ModelResponse,
    SystemPromptPart,
    TextPart,
    ThinkingPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.models.test import TestModel
from pydantic_ai.usage import RequestUsage
from sqlalchemy import event

from memstore import (
    ConfigurationError,
    ContextBudgetError,
    FixedCounter,
    MemoryStore,
    TokenLimitedView,
    UnboundedView,
)
from memstore.integrations.pydantic_ai import (
    HIDDEN_CALL_ID,
    MemstoreConversationStore,
    MemstoreHistoryProcessor,
    chat_messages,
)
from tests.helpers import call
from tests.integrations import assert_openai_history_valid

ROOT = Path(__file__).resolve().parents[2]
T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)
PNG = bytes.fromhex(
    "89504e470d0a1a0a0000000d4948445200000001000000010806000000"
    "1f15c4890000000d49444154789c6360000002000154a24f5d0000000049454e44ae426082")


@pytest.fixture
def cstore(store: Any) -> MemstoreConversationStore:
    return MemstoreConversationStore(store)


def cid() -> str:
    return f"conv-{uuid.uuid4().hex[:12]}"


# ---- deterministic messages ------------------------------------------------------------------


def ask(text: str) -> ModelRequest:
    return ModelRequest(parts=[UserPromptPart(text, timestamp=T0)], timestamp=T0)


def say(text: str) -> ModelResponse:
    return ModelResponse(parts=[TextPart(text)], timestamp=T0, model_name="m",
                         usage=RequestUsage(input_tokens=3, output_tokens=1))


def calls(*ids: str) -> ModelResponse:
    return ModelResponse(parts=[ToolCallPart("add", {"a": 1, "b": 2}, tool_call_id=i) for i in ids],
                         timestamp=T0, model_name="m")


def returns(*ids: str) -> ModelRequest:
    return ModelRequest(parts=[ToolReturnPart("add", 3, tool_call_id=i, timestamp=T0)
                               for i in ids], timestamp=T0)


def calculator_agent(model: Any = None, **kwargs: Any) -> Agent[None, str]:
    agent: Agent[None, str] = Agent(model or TestModel(), system_prompt="Use the tools.",
                                    **kwargs)

    @agent.tool_plain
    def add(a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    return agent


def rich_model() -> FunctionModel:
    """Thinks, calls a tool that asks for a retry, calls it again, then answers twice
    (the first answer is refused by the output validator)."""
    steps = iter([
        ModelResponse(parts=[ThinkingPart("let me add", signature="sig-1"),
                             ToolCallPart("flaky", {"x": 1}, tool_call_id="call-1")],
                      usage=RequestUsage(input_tokens=10, output_tokens=5),
                      model_name="scripted-1", provider_name="scripted",
                      provider_details={"finish": "tool_calls"}),
        ModelResponse(parts=[ToolCallPart("flaky", '{"x": 2}', tool_call_id="call-2")],
                      model_name="scripted-1"),
        ModelResponse(parts=[TextPart("draft")], model_name="scripted-2"),
        ModelResponse(parts=[TextPart("The answer is 3. ¿Sí? 🙂")], model_name="scripted-2",
                      usage=RequestUsage(input_tokens=20, output_tokens=7)),
    ])

    def respond(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        return next(steps)

    return FunctionModel(respond)


def rich_agent() -> Agent[None, str]:
    agent: Agent[None, str] = Agent(rich_model(), system_prompt="Be exact.")
    tries = {"flaky": 0, "output": 0}

    @agent.tool_plain
    def flaky(x: int) -> dict[str, Any]:
        """A tool that wants a second try."""
        tries["flaky"] += 1
        if tries["flaky"] == 1:
            raise ModelRetry("try x=2")
        return {"sum": x + 1, "items": [1, 2.5, None, "ü"]}

    @agent.output_validator
    def check(output: str) -> str:
        tries["output"] += 1
        if tries["output"] == 1:
            raise ModelRetry("not final")
        return output

    return agent


# ---- round trips -----------------------------------------------------------------------------


async def test_a_rich_run_round_trips_every_part(cstore: MemstoreConversationStore) -> None:
    conversation_id = cid()
    prompt = ["Add these", BinaryImage(data=PNG, media_type="image/png"),
              ImageUrl("https://example.com/cat.png")]
    result = await rich_agent().run(prompt, conversation=Conversation(
        conversation_id=conversation_id))
    saved = await cstore.save(result, scope="user-1")
    messages = result.all_messages()
    kinds = {type(part).__name__ for m in messages for part in m.parts}
    assert {"SystemPromptPart", "UserPromptPart", "ThinkingPart", "ToolCallPart",
            "ToolReturnPart", "RetryFeedbackPart", "TextPart"} <= kinds
    assert [e.message for e in saved] == messages
    loaded = await cstore.load(conversation_id)
    assert loaded is not None
    assert loaded.messages == messages  # every part and field, images included
    assert loaded.usage == result.usage
    responses = [m for m in loaded.messages if isinstance(m, ModelResponse)]
    assert len(responses) == 4 and all(m.model_name for m in responses)
    assert responses[0].provider_details == {"finish": "tool_calls"}
    assert responses[0].parts[0] == ThinkingPart("let me add", signature="sig-1")
    entries = await cstore.load_entries(conversation_id)
    assert entries is not None
    assert [e.id for e in entries] == [e.id for e in saved]
    assert [e.parent_id for e in entries] == [None, *(e.id for e in saved[:-1])]
    for entry in saved:
        assert await cstore.read_entry(entry.id) == entry
    # a fresh store object (as in another process) reads the same
    again = MemstoreConversationStore(cstore.store)
    assert (await again.load(conversation_id)).messages == messages  # type: ignore[union-attr]
    assert await again.read_entry(saved[2].id) == saved[2]


async def test_binary_content_comes_back_as_pydantic_ais_serialized_form(
        cstore: MemstoreConversationStore) -> None:
    from pydantic_ai.conversation import ConversationTypeAdapter

    conversation = Conversation(conversation_id=cid(), messages=[
        ModelRequest(parts=[UserPromptPart(["see", BinaryContent(PNG, media_type="image/png")],
                                           timestamp=T0)], timestamp=T0), say("a pixel")])
    await cstore.save(conversation)
    loaded = await cstore.load(conversation.conversation_id)
    assert loaded is not None
    canonical = ConversationTypeAdapter.validate_json(ConversationTypeAdapter.dump_json(
        conversation))
    assert loaded.messages == canonical.messages
    image = loaded.messages[0].parts[0].content[1]  # type: ignore[union-attr, index]
    assert type(image) is BinaryImage and image.data == PNG


async def test_stored_as_chat_messages_that_views_window(store: Any) -> None:
    cstore = MemstoreConversationStore(store)
    conversation_id = cid()
    result = await calculator_agent().run("What is 1 + 2?", conversation=Conversation(
        conversation_id=conversation_id))
    await cstore.save(result, scope="alice")
    stored = await call(store.messages(conversation_id))
    assert [m.role for m in stored] == ["system", "user", "assistant", "tool", "assistant",
                                        "tool"]
    assert stored[-1].tool_call_id == HIDDEN_CALL_ID  # the record
    assert stored[2].tool_calls[0].name == "add"
    assert stored[3].tool_call_id == stored[2].tool_calls[0].id
    window = await call(store.window(conversation_id, UnboundedView()))
    assert [m.role for m in window.messages] == ["system", "user", "assistant", "tool",
                                                 "assistant"]
    assert_openai_history_valid(window.to_openai())
    assert window.report.omitted[-1].reason == "incomplete_unit"
    conversation = await call(store.get_conversation(conversation_id))
    assert conversation.metadata == {"pydantic_ai": True, "scope": "alice"}


def test_chat_messages_mapping() -> None:
    request = ModelRequest(parts=[
        UserPromptPart(["look", ImageUrl("https://example.com/a.png")], timestamp=T0),
        ToolReturnPart("add", {"sum": 3}, tool_call_id="c1", timestamp=T0),
        SystemPromptPart("be brief", timestamp=T0)])
    chats = chat_messages(request)
    assert [m.role for m in chats] == ["tool", "user", "system"]  # tool results first
    assert chats[0].tool_call_id == "c1" and json.loads(chats[0].text) == {"sum": 3}
    assert chats[1].content[1].image_url.url == "https://example.com/a.png"  # type: ignore[index, union-attr]
    response = ModelResponse(parts=[ThinkingPart("hmm"), TextPart("ok"),
                                    ToolCallPart("add", {"a": 1}, tool_call_id="c2"),
                                    ToolCallPart("add", {"a": 2}, tool_call_id="c2")])
    [assistant] = chat_messages(response)
    assert assistant.tool_calls is not None and [c.id for c in assistant.tool_calls] == ["c2"]
    assert "ok" in assistant.text and '{"a":2}' in assistant.text  # a repeated id is text
    assert chat_messages(ModelRequest(parts=[])) == []


def test_constructor_refuses_what_is_not_a_store_or_view() -> None:
    with pytest.raises(ConfigurationError, match="MemoryStore"):
        MemstoreConversationStore(object())  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="scope_key"):
        MemstoreConversationStore(MemoryStore("sqlite://"), scope_key="pydantic_ai")
    with pytest.raises(ConfigurationError, match="view"):
        MemstoreHistoryProcessor("all")  # type: ignore[arg-type]


# ---- the base class's contract ---------------------------------------------------------------


async def test_conflicts_exactly_when_the_base_class_says(
        cstore: MemstoreConversationStore) -> None:
    conversation_id = cid()
    first = Conversation(conversation_id=conversation_id, messages=[ask("q1"), say("a1")])
    await cstore.save(first, scope="u")
    # a conversation not loaded from the store, with an id it has
    with pytest.raises(ConversationConflict):
        await cstore.save(Conversation(conversation_id=conversation_id, messages=[ask("x")]))
    stale = await cstore.load(conversation_id)
    fresh = await cstore.load(conversation_id)
    assert stale is not None and fresh is not None
    fresh.messages += [ask("q2"), say("a2")]
    await cstore.save(fresh)
    stale.messages += [ask("other")]
    with pytest.raises(ConversationConflict):
        await cstore.save(stale)
    # another scope
    again = await cstore.load(conversation_id)
    assert again is not None
    with pytest.raises(ConversationConflict):
        await cstore.save(again, scope="someone-else")
    assert await cstore.load(conversation_id, scope="someone-else") is None
    # the primitives
    record = await cstore.read_record(conversation_id)
    assert record is not None
    with pytest.raises(ConversationConflict):
        await cstore.write_record(dataclasses.replace(record, revision="r2"),
                                  expected_revision="not-it")
    with pytest.raises(ConversationConflict):
        await cstore.write_record(dataclasses.replace(record, revision="r2"),
                                  expected_revision=None)
    with pytest.raises(ConversationConflict):  # a head no one has
        await cstore.write_record(dataclasses.replace(record, head_id="nowhere", revision="r3"),
                                  expected_revision=record.revision)
    with pytest.raises(ConversationConflict):
        await cstore.write_record(ConversationRecord(conversation_id=cid(), head_id="nowhere"),
                                  expected_revision=None)
    with pytest.raises(ConversationConflict):
        await cstore.delete_record(conversation_id, expected_revision="not-it")
    with pytest.raises(ConversationConflict):
        await cstore.delete_record(cid(), expected_revision=record.revision)
    # nothing of the refused writes is left behind
    loaded = await cstore.load(conversation_id)
    assert loaded is not None and loaded.messages == [ask("q1"), say("a1"), ask("q2"), say("a2")]
    assert (await cstore.read_record(conversation_id)) == record


async def test_concurrent_saves_one_wins(store: Any) -> None:
    cstore = MemstoreConversationStore(store)
    conversation_id = cid()
    await cstore.save(Conversation(conversation_id=conversation_id, messages=[ask("q")]))
    loaded = [await MemstoreConversationStore(store).load(conversation_id) for _ in range(4)]

    async def save(i: int, conversation: Conversation | None) -> str:
        assert conversation is not None
        conversation.messages += [say(f"a{i}")]
        try:
            await MemstoreConversationStore(store).save(conversation)
        except ConversationConflict:
            return "conflict"
        return "saved"

    outcomes = await asyncio.gather(*(save(i, c) for i, c in enumerate(loaded)))
    assert sorted(outcomes) == ["conflict"] * 3 + ["saved"]
    final = await cstore.load(conversation_id)
    assert final is not None and len(final.messages) == 2


async def test_branch_and_branch_back(cstore: MemstoreConversationStore, store: Any) -> None:
    conversation_id = cid()
    conversation = Conversation(conversation_id=conversation_id, messages=[
        ask("q1"), calls("c1"), returns("c1"), say("a1"), ask("q2"), say("a2")])
    saved = await cstore.save(conversation)
    branched = await cstore.branch(conversation_id, at=4, expected_revision=conversation.revision)
    assert branched.messages == conversation.messages[:4]
    branched.messages += [ask("q2 again"), say("a2 again")]
    await cstore.save(branched)
    record = await cstore.read_record(conversation_id)
    assert record is not None and record.branches == [saved[-1].id]
    # the memstore conversation holds the current history; the branch left is hidden
    window = await call(store.window(conversation_id, UnboundedView()))
    assert [m.text for m in window.messages] == ["q1", "", "3", "a1", "q2 again", "a2 again"]
    # back to the old branch, from its tip
    back = await cstore.branch(conversation_id, from_entry=record.branches[0],
                               expected_revision=record.revision)
    assert back.messages == conversation.messages
    window = await call(store.window(conversation_id, UnboundedView()))
    assert [m.text for m in window.messages] == ["q1", "", "3", "a1", "q2", "a2"]
    record = await cstore.read_record(conversation_id)
    assert record is not None and len(record.branches) == 1
    assert [e.message for e in await cstore.read_history(record.branches[0])] == [
        *conversation.messages[:4], ask("q2 again"), say("a2 again")]
    # a history rewritten from its first message branches from nothing
    rewritten = await cstore.load(conversation_id)
    assert rewritten is not None
    rewritten.messages[:] = [ask("fresh start")]
    rewritten.new_message_index = None
    await cstore.save(rewritten)
    loaded = await cstore.load(conversation_id)
    assert loaded is not None and loaded.messages == [ask("fresh start")]
    record = await cstore.read_record(conversation_id)
    assert record is not None and len(record.branches) == 2
    # and to an empty history
    empty = await cstore.branch(conversation_id, at=0, expected_revision=record.revision)
    assert empty.messages == []
    assert (await call(store.window(conversation_id, UnboundedView()))).messages == []


async def test_switching_branches_twice_keeps_the_history_in_order(
        cstore: MemstoreConversationStore, store: Any) -> None:
    """A branch made current moves after the entries it left; its own descendants that
    stay hidden are then stored before it, and switching to one of them must keep the
    whole history, in order."""
    conversation_id = cid()
    one = [ask("e1"), say("e2"), ask("e3")]
    saved = await cstore.save(Conversation(conversation_id=conversation_id, messages=one))
    record = await cstore.read_record(conversation_id)
    assert record is not None
    back = await cstore.branch(conversation_id, at=1, expected_revision=record.revision)
    back.messages += [say("e4"), calls("p1", "p2"), returns("p1", "p2")]
    await cstore.save(back)
    record = await cstore.read_record(conversation_id)
    assert record is not None
    e2 = saved[1].id
    two = await cstore.branch(conversation_id, from_entry=e2, expected_revision=record.revision)
    assert two.messages == one[:2]
    record = await cstore.read_record(conversation_id)
    assert record is not None
    three = await cstore.branch(conversation_id, from_entry=saved[2].id,
                                expected_revision=record.revision)
    assert three.messages == one
    loaded = await cstore.load(conversation_id)
    assert loaded is not None and loaded.messages == one
    assert [m.text for m in (await call(store.window(conversation_id, UnboundedView()))).messages
            ] == ["e1", "e2", "e3"]
    record = await cstore.read_record(conversation_id)
    assert record is not None
    lines = [[e.message for e in await cstore.read_history(tip)] for tip in record.branches]
    assert [ask("e1"), say("e4"), calls("p1", "p2"), returns("p1", "p2")] in lines
    tail = await cstore.read_history(record.head_id, limit=2)
    assert [e.message for e in tail] == one[1:]


async def test_forks_copy_and_survive_their_source(cstore: MemstoreConversationStore,
                                                   store: Any) -> None:
    source = cid()
    conversation = Conversation(conversation_id=source, messages=[ask("q1"), say("a1"),
                                                                  ask("q2"), say("a2")])
    saved = await cstore.save(conversation, scope="team")
    fork = await cstore.fork(source, at=2, new_conversation_id=cid())
    assert fork.messages == conversation.messages[:2]
    record = await cstore.read_record(fork.conversation_id)
    assert record is not None
    assert (record.forked_from, record.forked_at, record.scope) == (source, saved[1].id, "team")
    fork.messages += [ask("fork q"), say("fork a")]
    await cstore.save(fork)
    whole = await cstore.fork(source, new_conversation_id=cid(), scope="other")
    assert whole.messages == conversation.messages and whole.usage == conversation.usage
    with pytest.raises(ConversationConflict):
        await cstore.fork(source, new_conversation_id=fork.conversation_id)
    await cstore.delete(source)
    assert await cstore.load(source) is None
    loaded = await cstore.load(fork.conversation_id)
    assert loaded is not None
    assert loaded.messages == [ask("q1"), say("a1"), ask("fork q"), say("fork a")]
    assert [m.text for m in (await call(store.window(fork.conversation_id,
                                        UnboundedView()))).messages] == [
        "q1", "a1", "fork q", "fork a"]
    assert [r.conversation_id for r in await cstore.list_conversations(scope="other")] == [
        whole.conversation_id]


async def test_list_and_delete(cstore: MemstoreConversationStore, store: Any) -> None:
    ids = [cid() for _ in range(3)]
    for i, conversation_id in enumerate(ids):
        await cstore.save(Conversation(conversation_id=conversation_id,
                                       messages=[ask(f"q{i}")]),
                          scope="mine" if i < 2 else "theirs")
    listed = await cstore.list_conversations()
    assert [r.conversation_id for r in listed] == ids[::-1]  # most recently saved first
    assert [r.conversation_id for r in await cstore.list_conversations(scope="mine")] == [
        ids[1], ids[0]]
    assert len(await cstore.list_conversations(limit=1)) == 1
    await cstore.delete(ids[0], scope="theirs")  # another scope: left as it is
    assert await cstore.load(ids[0]) is not None
    await cstore.delete(ids[0], scope="mine")
    assert await cstore.load(ids[0]) is None
    assert await call(store.messages(ids[0])) == []  # its messages are gone
    # saved again under the same id, as a new conversation
    await cstore.save(Conversation(conversation_id=ids[0], messages=[ask("again")]), scope="mine")
    loaded = await cstore.load(ids[0])
    assert loaded is not None and loaded.messages == [ask("again")]


async def test_scope_metadata_selects_in_memstore(cstore: MemstoreConversationStore,
                                                  store: Any) -> None:
    if not hasattr(store, "forget"):
        pytest.skip("this memstore has no where= filters nor forget")
    mine, theirs = cid(), cid()
    await cstore.save(Conversation(conversation_id=mine, messages=[ask("q")]), scope="bob")
    await cstore.save(Conversation(conversation_id=theirs, messages=[ask("q")]), scope="eve")
    listed = await call(store.list_conversations(where={"pydantic_ai": True, "scope": "bob"}))
    assert mine in [c.id for c in listed] and theirs not in [c.id for c in listed]
    # deleted, then saved again under the same id with another scope: the row follows
    await cstore.delete(mine)
    await cstore.save(Conversation(conversation_id=mine, messages=[ask("q2")]), scope="carol")
    assert (await call(store.get_conversation(mine))).metadata == {"pydantic_ai": True,
                                                                   "scope": "carol"}
    await call(store.forget(where={"scope": "eve"}, reason="test"))
    assert await cstore.load(theirs) is None
    assert [r.conversation_id for r in await cstore.list_conversations(scope="carol")] == [mine]


async def test_memstore_writes_are_never_overwritten(cstore: MemstoreConversationStore,
                                                     store: Any) -> None:
    from memstore import Message

    foreign = cid()
    await call(store.append(foreign, Message.user("written by another integration")))
    assert await cstore.load(foreign) is None
    with pytest.raises(ConversationConflict):
        await cstore.save(Conversation(conversation_id=foreign, messages=[ask("q")]))
    assert [m.text for m in await call(store.messages(foreign))] == [
        "written by another integration"]


async def test_load_limit_and_read_history_in_one_query(store: Any) -> None:
    cstore = MemstoreConversationStore(store)
    conversation_id = cid()
    messages: list[ModelMessage] = []
    for i in range(60):
        messages += [ask(f"q{i}"), calls(f"c{i}a", f"c{i}b"), returns(f"c{i}a", f"c{i}b"),
                     say(f"a{i}")]
    conversation = Conversation(conversation_id=conversation_id, messages=messages)
    await cstore.save(conversation)
    record = await cstore.read_record(conversation_id)
    assert record is not None
    engine = store.engine if isinstance(store, MemoryStore) else store.engine.sync_engine
    statements: list[str] = []

    def seen(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        statements.append(statement)

    event.listen(engine, "before_cursor_execute", seen)
    try:
        tail = await cstore.read_history(record.head_id, limit=5)
    finally:
        event.remove(engine, "before_cursor_execute", seen)
    assert [e.message for e in tail] == messages[-5:]
    assert len([s for s in statements if s.lstrip().upper().startswith("SELECT")]) == 1
    loaded = await cstore.load(conversation_id, limit=7)
    assert loaded is not None and loaded.messages == messages[-7:]
    assert [e.message for e in await cstore.read_history(record.head_id)] == messages


# ---- agent runs, restarts --------------------------------------------------------------------


async def test_tool_using_runs_continue(cstore: MemstoreConversationStore) -> None:
    conversation_id = cid()
    agent = calculator_agent()
    conversation = await cstore.load(conversation_id) or Conversation(
        conversation_id=conversation_id)
    result = await agent.run("What is 1 + 2?", conversation=conversation)
    await cstore.save(result)
    loaded = await cstore.load(conversation_id)
    assert loaded is not None
    result = await agent.run("And again?", conversation=loaded)
    await cstore.save(result)
    final = await cstore.load(conversation_id)
    assert final is not None
    assert final.messages == result.all_messages()
    assert final.usage == result.usage and final.usage.requests == 3
    assert final.usage.tool_calls == 1


RESTART_SCRIPT = textwrap.dedent("""
    import asyncio, json, sys
    from pydantic_ai import Agent
    from pydantic_ai.conversation import Conversation
    from pydantic_ai.models.test import TestModel
    from memstore import AsyncMemoryStore, MemoryStore, TokenLimitedView
    from memstore.integrations.pydantic_ai import (
        MemstoreConversationStore, MemstoreHistoryProcessor)
    from pydantic_ai.capabilities import ProcessHistory

    url, kind, conversation_id, prompt = sys.argv[1:5]

    async def main():
        store = MemoryStore(url) if kind == "sync" else AsyncMemoryStore(url)
        if kind == "async":
            await store.setup()
        cstore = MemstoreConversationStore(store)
        agent = Agent(TestModel(), system_prompt="Use the tools.", capabilities=[
            ProcessHistory(MemstoreHistoryProcessor(TokenLimitedView(token_limit=4000)))])

        @agent.tool_plain
        def add(a: int, b: int) -> int:
            return a + b

        conversation = await cstore.load(conversation_id) or Conversation(
            conversation_id=conversation_id)
        before = len(conversation.messages)
        result = await agent.run(prompt, conversation=conversation)
        await cstore.save(result)
        loaded = await cstore.load(conversation_id)
        print(json.dumps({"before": before, "after": len(loaded.messages),
                          "requests": loaded.usage.requests,
                          "same": loaded.messages == result.all_messages()}))
        closed = store.close()
        if closed is not None:
            await closed

    asyncio.run(main())
""")


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["sync", "async"])
def test_restart_in_a_new_process(db_url: str, kind: str) -> None:
    conversation_id = cid()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    outputs = []
    for prompt in ["What is 1 + 2?", "And 3 + 4?", "Thanks"]:
        done = subprocess.run([sys.executable, "-c", RESTART_SCRIPT, db_url, kind,
                               conversation_id, prompt],
                              capture_output=True, text=True, env=env, timeout=120, check=False)
        assert done.returncode == 0, done.stderr
        outputs.append(json.loads(done.stdout.strip().splitlines()[-1]))
    # TestModel calls the tool on the first run only: 4 messages, then 2 per run
    assert [o["before"] for o in outputs] == [0, 4, 6]
    assert [o["after"] for o in outputs] == [4, 6, 8]
    assert [o["requests"] for o in outputs] == [2, 3, 4]
    assert all(o["same"] for o in outputs)


# ---- the history processor -------------------------------------------------------------------


def recording_model(seen: list[list[ModelMessage]]) -> FunctionModel:
    """Calls ``add`` once per user prompt, then answers; records what it was sent."""

    def respond(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        seen.append(list(messages))
        last = messages[-1]
        if any(isinstance(p, ToolReturnPart) for p in last.parts):
            return ModelResponse(parts=[TextPart("done " + "word " * 5)])
        return ModelResponse(parts=[ToolCallPart("add", {"a": 1, "b": 2},
                                                 tool_call_id=f"call-{len(seen)}")])

    return FunctionModel(respond)


def assert_whole_units(messages: list[ModelMessage]) -> None:
    """No tool return without its call right before it, no call left unanswered mid-history."""
    first = messages[0]
    assert not any(isinstance(p, ToolReturnPart) for p in first.parts)
    for before, after in itertools.pairwise(messages):
        answered = {p.tool_call_id for p in after.parts if isinstance(p, ToolReturnPart)}
        asked = {p.tool_call_id for p in before.parts if isinstance(p, ToolCallPart)}
        if isinstance(after, ModelRequest):
            assert answered <= asked
        if isinstance(before, ModelResponse) and asked:
            assert asked <= answered


async def test_history_processor_sends_a_budgeted_window(cstore: MemstoreConversationStore) -> None:
    counter = FixedCounter(per_message=3, per_word=1, per_tool_call=2, priming=3)
    view = TokenLimitedView(token_limit=120)
    seen: list[list[ModelMessage]] = []
    agent = calculator_agent(recording_model(seen), capabilities=[
        ProcessHistory(MemstoreHistoryProcessor(view, counter=counter))])
    conversation_id = cid()
    for turn in range(12):
        conversation = await cstore.load(conversation_id) or Conversation(
            conversation_id=conversation_id)
        result = await agent.run(f"question {turn}: " + "filler " * 10,
                                 conversation=conversation)
        await cstore.save(result)
    full = await cstore.load(conversation_id)
    assert full is not None and len(full.messages) == 12 * 4  # the store keeps everything
    later = seen[-8:]
    assert all(len(sent) < len(full.messages) for sent in later)
    for sent in seen:
        assert_whole_units(sent)
        assert isinstance(sent[-1], ModelRequest)
        assert isinstance(sent[0].parts[0], SystemPromptPart)  # anchored: always sent
        chats = [c for m in sent for c in chat_messages(m)]
        assert counter.count_messages(chats) <= 120


async def test_history_processor_drops_returns_whose_call_it_left_out() -> None:
    counter = FixedCounter(per_message=1, per_word=1, per_tool_call=1, priming=0)
    history: list[ModelMessage] = [
        ModelRequest(parts=[SystemPromptPart("sys", timestamp=T0),
                            UserPromptPart("one " * 40, timestamp=T0)], timestamp=T0),
        calls("c1"),
        ModelRequest(parts=[ToolReturnPart("add", "x " * 40, tool_call_id="c1", timestamp=T0),
                            UserPromptPart("two", timestamp=T0)], timestamp=T0),
        say("answer"),
        ask("three"),
    ]
    processor = MemstoreHistoryProcessor(TokenLimitedView(token_limit=20), counter=counter)
    kept = processor(history)
    assert kept[0].parts == [history[0].parts[0]]  # the system prompt, without the big prompt
    assert kept[1].parts == [history[2].parts[1]]  # "two", without the return of a dropped call
    assert kept[2:] == history[3:]
    assert_whole_units(kept)
    assert processor(history) == kept  # counted once, same answer
    with pytest.raises(ContextBudgetError):
        MemstoreHistoryProcessor(TokenLimitedView(token_limit=3), counter=counter)(history)


# ---- differential: memstore against InMemoryConversationStore --------------------------------

CONV = st.sampled_from([0, 0, 0, 1, 2])  # mostly one conversation, so histories grow
AT = st.integers(0, 40)  # a position: taken modulo the history's length + 1 (or as it is)
OPS = st.lists(st.one_of(
    st.tuples(st.just("save"), CONV, st.integers(1, 3), st.booleans()),
    st.tuples(st.just("save"), st.just(0), st.integers(1, 3), st.just(False)),
    st.tuples(st.just("save"), st.just(0), st.integers(1, 3), st.just(False)),
    st.tuples(st.just("stale"), CONV),
    st.tuples(st.just("rewrite"), CONV, AT),
    st.tuples(st.just("branch"), CONV, AT, st.booleans()),
    st.tuples(st.just("switch"), CONV, st.integers(0, 3), AT),
    st.tuples(st.just("fork"), CONV, AT, CONV),
    st.tuples(st.just("delete"), CONV, st.booleans()),
    st.tuples(st.just("load"), CONV, st.integers(0, 6)),
), min_size=1, max_size=16)


class Driver:
    """Runs one operation sequence on one store and reports what it saw, ids aside."""

    def __init__(self, cstore: Any, prefix: str) -> None:
        self.cstore = cstore
        self.prefix = prefix
        self.loaded: dict[int, Conversation] = {}
        self.counter = 0

    def name(self, n: int) -> str:
        return f"{self.prefix}-{n}"

    def fresh(self, k: int) -> list[ModelMessage]:
        out: list[ModelMessage] = []
        for _ in range(k):
            self.counter += 1
            i = self.counter
            out += [ask(f"q{i}")] if i % 3 else [calls(f"c{i}"), returns(f"c{i}")]
        return out

    async def at(self, n: int, position: int) -> int:
        """``position`` within conversation ``n``'s history (as it is when there is none)."""
        loaded = await self.cstore.load(self.name(n))
        return position if loaded is None else position % (len(loaded.messages) + 1)

    async def history_of(self, tip: str) -> list[ModelMessage]:
        return [e.message for e in await self.cstore.read_history(tip)]

    async def snapshot(self, n: int) -> Any:
        conversation_id = self.name(n)
        record = await self.cstore.read_record(conversation_id)
        if record is None:
            return None
        loaded = await self.cstore.load(conversation_id)
        assert loaded is not None
        return {
            "messages": loaded.messages, "usage": loaded.usage, "scope": record.scope,
            "forked_from": record.forked_from,
            "forked_at": None if record.forked_at is None
            else await self.history_of(record.forked_at),
            "branches": [await self.history_of(tip) for tip in record.branches],
        }

    async def run(self, op: tuple[Any, ...]) -> Any:
        try:
            return await self._run(op)
        except ConversationConflict:
            return "conflict"
        except Exception as exc:  # UserError and friends: same type on both sides
            return type(exc).__name__

    async def _run(self, op: tuple[Any, ...]) -> Any:
        kind, n = op[0], op[1]
        conversation_id = self.name(n)
        if kind == "save":
            _, _, k, scoped = op
            conversation = await self.cstore.load(conversation_id) or Conversation(
                conversation_id=conversation_id)
            self.loaded[n] = dataclasses.replace(conversation)
            conversation.messages += self.fresh(k)
            saved = await self.cstore.save(conversation, scope="s" if scoped else None)
            return [e.message for e in saved]
        if kind == "stale":
            if n not in self.loaded:
                return None
            stale = self.loaded[n]
            stale.messages = [*stale.messages, *self.fresh(1)]
            return len(await self.cstore.save(stale))
        if kind == "rewrite":
            conversation = await self.cstore.load(conversation_id)
            if conversation is None:
                return None
            keep = op[2] % (len(conversation.messages) + 1)
            conversation.messages = [*conversation.messages[:keep], *self.fresh(1)]
            conversation.new_message_index = None
            return len(await self.cstore.save(conversation))
        if kind == "branch":
            record = await self.cstore.read_record(conversation_id)
            revision = record.revision if record is not None and op[3] else "stale"
            branched = await self.cstore.branch(conversation_id, at=await self.at(n, op[2]),
                                                expected_revision=revision)
            return branched.messages
        if kind == "switch":
            record = await self.cstore.read_record(conversation_id)
            if record is None or not record.branches:
                return None
            tip = record.branches[op[2] % len(record.branches)]
            line = await self.cstore.read_history(tip)
            entry = line[op[3] % len(line)].id
            switched = await self.cstore.branch(conversation_id, from_entry=entry,
                                                expected_revision=record.revision)
            return switched.messages
        if kind == "fork":
            forked = await self.cstore.fork(conversation_id, at=await self.at(n, op[2]),
                                            new_conversation_id=self.name(op[3]))
            return forked.messages
        if kind == "delete":
            await self.cstore.delete(conversation_id, scope="s" if op[2] else None)
            return None
        if kind == "load":
            loaded = await self.cstore.load(conversation_id, limit=op[2])
            return None if loaded is None else loaded.messages
        raise AssertionError(op)


@settings(max_examples=30, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(ops=OPS)
async def test_differential_against_the_in_memory_store(store: Any,
                                                        ops: list[tuple[Any, ...]]) -> None:
    prefix = uuid.uuid4().hex[:10]
    ours = Driver(MemstoreConversationStore(store), prefix)
    reference = Driver(InMemoryConversationStore(), prefix)
    for op in ops:
        got = await ours.run(op)
        want = await reference.run(op)
        assert got == want, op
        for n in range(3):
            assert await ours.snapshot(n) == await reference.snapshot(n), (op, n)
    listed = [r.conversation_id for r in await ours.cstore.list_conversations()
              if r.conversation_id.startswith(prefix)]
    assert sorted(listed) == sorted(r.conversation_id
                                    for r in await reference.cstore.list_conversations())
    assert [e.message for e in await ours.cstore.read_history(None)] == []


def test_entry_class_is_what_the_store_reads() -> None:
    entry = ConversationEntry(parent_id=None, message=ask("q"))
    assert entry.kind == "message"


def test_the_docs_example_runs_with_test_model(tmp_path: Path, monkeypatch: Any) -> None:
    import re

    page = (ROOT / "docs" / "integrations" / "pydantic_ai.md").read_text()
    [code] = re.findall(r"```python\n(.*?)```", page, flags=re.S)
    monkeypatch.chdir(tmp_path)
    scope: dict[str, Any] = {"__name__": "__docs__", "model": TestModel()}
    exec(compile(code, "docs/integrations/pydantic_ai.md", "exec"), scope)
    assert scope["answer"] == '{"add":0}'
    store = MemoryStore(f"sqlite:///{tmp_path / 'agents.db'}")
    window = store.window("chat-1", UnboundedView())
    assert [m.role for m in window.messages] == ["system", "user", "assistant", "tool",
                                                 "assistant", "user", "assistant"]
    assert store.get_conversation("chat-1").metadata == {"pydantic_ai": True,
                                                         "scope": "user-42"}
    store.close()


async def test_a_run_paused_for_approval_is_stored_and_resumed(
        cstore: MemstoreConversationStore, store: Any) -> None:
    from pydantic_ai import DeferredToolRequests, DeferredToolResults

    agent: Agent[None, str | DeferredToolRequests] = Agent(
        TestModel(), output_type=[str, DeferredToolRequests])

    @agent.tool_plain(requires_approval=True)
    def delete_file(path: str) -> str:
        """Delete a file."""
        return f"deleted {path}"

    conversation_id = cid()
    result = await agent.run("Delete it", conversation=Conversation(
        conversation_id=conversation_id))
    assert isinstance(result.output, DeferredToolRequests)
    await cstore.save(result)
    paused = await cstore.load(conversation_id)
    assert paused is not None and paused.deferred_tool_requests == result.output
    # the unanswered call is the newest unit: no view sends it yet
    window = await call(store.window(conversation_id, UnboundedView()))
    assert [m.role for m in window.messages] == ["user"]
    approvals = {call_.tool_call_id: True for call_ in result.output.approvals}
    resumed = await agent.run(conversation=paused,
                              deferred_tool_results=DeferredToolResults(approvals=approvals))
    await cstore.save(resumed)
    final = await cstore.load(conversation_id)
    assert final is not None and final.deferred_tool_requests is None
    assert final.messages == resumed.all_messages()
    window = await call(store.window(conversation_id, UnboundedView()))
    assert_openai_history_valid(window.to_openai())
    assert "tool" in [m.role for m in window.messages]
