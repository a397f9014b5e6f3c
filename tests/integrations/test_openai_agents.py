"""MemstoreSession driven by the OpenAI Agents SDK's own Runner, on SQLite and Postgres."""

from __future__ import annotations

import asyncio
import base64
import inspect
import json
import re
import typing
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError
from sqlalchemy import event as sqlalchemy_event

from memstore import (
    AsyncMemoryStore,
    ContextBudgetError,
    FixedCounter,
    ImagePart,
    ImageURL,
    InvalidInputError,
    MemoryStore,
    Message,
    ScoreBasedView,
    TokenLimitedView,
    UnboundedView,
)
from memstore.tokens import ApproxCounter, TiktokenCounter
from tests.helpers import call, examples
from tests.integrations import (
    assert_constructor_refuses_what_the_store_would,
    open_store,
    require,
)

agents = require("agents")
agents.set_tracing_disabled(True)  # no trace export: the tests never touch the network
from agents import (  # noqa: E402
    Agent,
    AsyncComputer,
    ComputerTool,
    LocalShellTool,
    Runner,
    ToolOutputImage,
    Usage,
    function_tool,
)
from agents.items import ModelResponse  # noqa: E402
from agents.models.interface import Model  # noqa: E402
from openai.types.responses import (  # noqa: E402
    ResponseComputerToolCall,
    ResponseFunctionToolCall,
    ResponseOutputMessage,
    ResponseOutputText,
    ResponseReasoningItem,
)
from openai.types.responses.response_computer_tool_call import (  # noqa: E402
    ActionScreenshot,
)
from openai.types.responses.response_output_item import (  # noqa: E402
    LocalShellCall,
    LocalShellCallAction,
)
from openai.types.responses.response_reasoning_item import Summary  # noqa: E402

from memstore.integrations.openai_agents import (  # noqa: E402
    MemstoreSession,
    items_to_messages,
    messages_to_items,
)

ROOT = Path(__file__).resolve().parents[2]


# ---- a scripted model (the shape of the SDK's own tests' FakeModel) -----------------------


def text(t: str) -> ResponseOutputMessage:
    return ResponseOutputMessage(id="1", type="message", role="assistant", status="completed",
                                 content=[ResponseOutputText(type="output_text", text=t,
                                                             annotations=[])])


def fcall(call_id: str, a: int, b: int) -> ResponseFunctionToolCall:
    # id "1" on every item, as the SDK's FakeModel does: ids are not unique
    return ResponseFunctionToolCall(id="1", type="function_call", call_id=call_id, name="add",
                                    arguments=json.dumps({"a": a, "b": b}))


def shell_call(call_id: str, command: str) -> LocalShellCall:
    return LocalShellCall(id="lsc_1", type="local_shell_call", call_id=call_id,
                          status="completed",
                          action=LocalShellCallAction(type="exec", command=[command], env={}))


def reasoning(t: str) -> ResponseReasoningItem:
    return ResponseReasoningItem(id="rs_1", type="reasoning",
                                 summary=[Summary(type="summary_text", text=t)])


class ScriptedModel(Model):
    """Returns the scripted outputs in order and records every input it was given."""

    def __init__(self, outputs: list[list[Any]]) -> None:
        self.outputs = list(outputs)
        self.inputs: list[list[dict[str, Any]]] = []

    async def get_response(self, system_instructions: Any, input: Any, *args: Any,
                           **kwargs: Any) -> ModelResponse:
        items = [{"role": "user", "content": input}] if isinstance(input, str) else input
        self.inputs.append(json.loads(json.dumps([dict(i) for i in items])))
        return ModelResponse(output=self.outputs.pop(0), usage=Usage(), response_id=None)

    def stream_response(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError("the tests do not stream")


@function_tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


def reopen(store: Any, db_url: str) -> Any:
    counter = FixedCounter(per_message=3, per_word=1, per_tool_call=2, priming=3)
    if isinstance(store, AsyncMemoryStore):
        return AsyncMemoryStore(db_url, counter=counter)
    return MemoryStore(db_url, counter=counter)


async def close(store: Any) -> None:
    await call(store.close())


def assert_valid_history(items: list[dict[str, Any]]) -> None:
    """Every call is answered by an output of its type (``function_call`` by
    ``function_call_output``, ``local_shell_call`` by ``local_shell_call_output``, ...)
    with its ``call_id``, after it (the Responses API rule)."""
    calls: dict[str, tuple[int, str]] = {}
    outputs: dict[str, int] = {}
    for index, item in enumerate(items):
        kind = str(item.get("type", "message"))
        if kind.endswith("_call_output"):
            assert item["call_id"] in calls, f"orphan output {item['call_id']}"
            call_index, call_kind = calls[item["call_id"]]
            assert call_kind == kind.removesuffix("_output") and call_index < index
            outputs[item["call_id"]] = index
        elif kind.endswith("_call") and "call_id" in item:
            calls[item["call_id"]] = (index, kind)
    assert set(calls) == set(outputs), f"unanswered calls: {set(calls) - set(outputs)}"


# ---- driven by Runner.run ------------------------------------------------------------------


async def test_runner_turns_survive_a_restart(store: Any, db_url: str) -> None:
    model = ScriptedModel([
        [reasoning("two sums"), fcall("c1", 1, 2), fcall("c2", 3, 4)],
        [text("3 and 7")],
        [text("you are welcome")],
    ])
    agent = Agent(name="adder", instructions="Add numbers.", model=model, tools=[add])
    session = MemstoreSession("chat-1", store)
    assert (await Runner.run(agent, "add 1+2 and 3+4", session=session)).final_output == "3 and 7"
    await Runner.run(agent, "thanks", session=session)
    first_items = await session.get_items()

    # parallel calls are one assistant message with two calls, answered by two tool messages
    stored = await call(store.messages("chat-1"))
    assert [m.role for m in stored] == ["user", "assistant", "tool", "tool", "assistant",
                                       "user", "assistant"]
    assert [c.id for c in stored[1].tool_calls] == ["c1", "c2"]
    assert [m.tool_call_id for m in stored[2:4]] == ["c1", "c2"]
    del agent, session, model, stored

    again = reopen(store, db_url)
    try:
        model2 = ScriptedModel([[text("I remember")]])
        agent2 = Agent(name="adder", instructions="Add numbers.", model=model2, tools=[add])
        session2 = MemstoreSession("chat-1", again)
        assert await session2.get_items() == first_items
        await Runner.run(agent2, "what did I ask?", session=session2)
        seen = model2.inputs[0]
        assert seen[:-1] == first_items
        assert seen[-1] == {"role": "user", "content": "what did I ask?"}
        assert_valid_history(seen)
        assert len(await session2.get_items()) == len(first_items) + 2
    finally:
        await close(again)


async def test_runner_accepts_a_budgeted_window(store: Any) -> None:
    outputs: list[list[Any]] = []
    for n in range(4):
        outputs += [[fcall(f"c{n}a", n, 1), fcall(f"c{n}b", n, 2)], [text(f"done {n}")]]
    model = ScriptedModel(outputs)
    agent = Agent(name="adder", instructions="Add.", model=model, tools=[add])
    writer = MemstoreSession("chat-2", store)
    for n in range(4):
        await Runner.run(agent, f"turn {n} please add", session=writer)
    everything = await writer.get_items()

    view = TokenLimitedView(token_limit=60)
    reader = MemstoreSession("chat-2", store, view=view)
    window_items = await reader.get_items()
    assert 0 < len(window_items) < len(everything)
    assert window_items == everything[-len(window_items):]
    assert_valid_history(window_items)
    window = await call(store.window("chat-2", view))
    assert window.token_count <= 60

    model.outputs = [[text("ok")]]
    await Runner.run(agent, "next", session=reader)
    seen = model.inputs[-1]
    assert seen[:-1] == window_items
    assert_valid_history(seen)


async def test_local_shell_call_and_output_stay_one_unit(store: Any, db_url: str) -> None:
    outputs: list[list[Any]] = []
    for n in range(4):
        outputs += [[shell_call(f"sh{n}", f"echo {n}")], [text(f"ran {n}")]]
    model = ScriptedModel(outputs)
    shell = LocalShellTool(executor=lambda request: f"out {request.data.action.command[0]}")
    agent = Agent(name="sh", instructions="Use the shell.", model=model, tools=[shell])
    writer = MemstoreSession("shell", store)
    for n in range(4):
        await Runner.run(agent, f"run {n}", session=writer)
    everything = await writer.get_items()
    # the SDK links the output to its call by call_id (the call's id is "lsc_1" each time)
    assert [i["call_id"] for i in everything if i.get("type") == "local_shell_call_output"
            ] == [f"sh{n}" for n in range(4)]
    assert_valid_history(everything)
    stored = await call(store.messages("shell"))
    assert [m.role for m in stored[:4]] == ["user", "assistant", "tool", "assistant"]
    assert [m.tool_call_ids for m in stored if m.tool_calls] == [(f"sh{n}",) for n in range(4)]
    assert [m.tool_call_id for m in stored if m.role == "tool"] == [f"sh{n}" for n in range(4)]

    again = reopen(store, db_url)
    try:
        assert await MemstoreSession("shell", again).get_items() == everything
        # every budget: a window trims whole units, never a call without its output
        total = (await call(again.window("shell", UnboundedView()))).token_count
        kept_calls = set()
        for budget in range(1, total + 1):
            reader = MemstoreSession("shell", again, view=TokenLimitedView(token_limit=budget))
            try:
                window_items = await reader.get_items()
            except ContextBudgetError:
                continue
            assert window_items == everything[len(everything) - len(window_items):]
            assert_valid_history(window_items)
            kept_calls.add(sum(i.get("type") == "local_shell_call" for i in window_items))
        assert kept_calls == {0, 1, 2, 3, 4}
    finally:
        await close(again)

    # the runner hands a trimmed window to the model: whole shell units only
    model.outputs = [[text("ok")]]
    reader = MemstoreSession("shell", store, view=TokenLimitedView(token_limit=total // 2))
    await Runner.run(agent, "next", session=reader)
    seen = model.inputs[-1]
    assert 0 < sum(i.get("type") == "local_shell_call" for i in seen) < 4
    assert_valid_history(seen)


async def test_item_ids_are_not_idempotency_keys(store: Any) -> None:
    model = ScriptedModel([[text("same")], [text("same")]])
    agent = Agent(name="a", instructions="x", model=model)
    session = MemstoreSession("chat-3", store)
    await Runner.run(agent, "hi", session=session)
    await Runner.run(agent, "hi", session=session)
    items = await session.get_items()
    assert len(items) == 4
    assert items[:2] == items[2:]


# ---- the Session protocol ------------------------------------------------------------------


async def test_empty_session_and_limits(store: Any) -> None:
    session = MemstoreSession("never-written", store)
    assert await session.get_items() == []
    assert await session.get_items(limit=3) == []
    assert await session.pop_item() is None
    await session.clear_session()
    budgeted = MemstoreSession("never-written", store, view=ScoreBasedView(token_limit=50))
    assert await budgeted.get_items() == []

    items = [{"role": "user", "content": f"m{i}"} for i in range(5)]
    await session.add_items(items)
    assert await session.get_items(limit=0) == []
    assert await session.get_items(limit=2) == items[-2:]
    assert await session.get_items(limit=50) == items
    with pytest.raises(InvalidInputError):
        await session.get_items(limit=-1)


async def test_view_limit_keeps_whole_units(store: Any) -> None:
    session = MemstoreSession("units", store, view=UnboundedView())
    items = [
        {"role": "user", "content": "q"},
        {"type": "function_call", "call_id": "a", "name": "f", "arguments": "{}"},
        {"type": "function_call", "call_id": "b", "name": "f", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "a", "output": "1"},
        {"type": "function_call_output", "call_id": "b", "output": "2"},
        {"role": "assistant", "content": "done"},
    ]
    await session.add_items(items)
    assert await session.get_items() == items
    assert await session.get_items(limit=1) == items[-1:]
    # the call unit holds 4 items: a limit that would split it stops before it
    assert await session.get_items(limit=3) == items[-1:]
    assert await session.get_items(limit=5) == items[1:]


async def test_tool_approval_unit_spans_two_writes_and_a_restart(store: Any, db_url: str) -> None:
    first = MemstoreSession("approval", store)
    await first.add_items([
        {"role": "user", "content": "delete the file"},
        {"type": "function_call", "call_id": "del1", "name": "rm", "arguments": '{"p": "x"}',
         "id": "1", "status": "completed"},
    ])
    view = UnboundedView()
    # the pending call is the turn in progress: no view hands it to a model on its own
    pending = await MemstoreSession("approval", store, view=view).get_items()
    assert pending == [{"role": "user", "content": "delete the file"}]
    assert_valid_history(pending)

    again = reopen(store, db_url)
    try:
        second = MemstoreSession("approval", again, view=view)
        await second.add_items([
            {"type": "function_call_output", "call_id": "del1", "output": "deleted"},
            {"role": "assistant", "content": "Done."},
        ])
        window_items = await second.get_items()
        assert [i.get("type", "message") for i in window_items] == [
            "message", "function_call", "function_call_output", "message"]
        assert_valid_history(window_items)
        stored = await call(again.messages("approval"))
        assert [m.role for m in stored] == ["user", "assistant", "tool", "assistant"]
    finally:
        await close(again)


async def test_a_response_written_in_pieces_is_one_message(store: Any) -> None:
    session = MemstoreSession("pieces", store)
    await session.add_items([{"role": "user", "content": "two things"},
                             {"type": "reasoning", "id": "rs", "summary": []},
                             {"type": "function_call", "call_id": "a", "name": "f",
                              "arguments": "{}"}])
    await session.add_items([{"type": "function_call", "call_id": "b", "name": "f",
                              "arguments": "{}"}])
    stored = await call(store.messages("pieces"))
    assert [m.role for m in stored] == ["user", "assistant"]
    assert stored[1].tool_call_ids == ("a", "b")
    # pop_item takes items back one at a time, and put back they merge again
    popped = await session.pop_item()
    assert popped == {"type": "function_call", "call_id": "b", "name": "f", "arguments": "{}"}
    stored = await call(store.messages("pieces"))
    assert stored[-1].tool_call_ids == ("a",)
    await session.add_items([popped])
    assert (await call(store.messages("pieces")))[-1].tool_call_ids == ("a", "b")
    await session.clear_session()
    assert await session.get_items() == []


async def test_bad_items_write_nothing(store: Any) -> None:
    session = MemstoreSession("bad", store)
    await session.add_items([{"role": "user", "content": "ok"}])
    with pytest.raises(InvalidInputError):
        await session.add_items([{"role": "user", "content": "x"}, "not an item"])
    with pytest.raises(InvalidInputError):
        await session.add_items([{"role": "wizard", "content": "x"}])
    with pytest.raises(InvalidInputError):
        await session.add_items([{"role": "user", "content": {1, 2}}])
    # values repr() refuses (an int of 5,000 digits) are named, not raised from repr
    with pytest.raises(InvalidInputError, match="JSON data"):
        await session.add_items([{"type": "function_call", "call_id": 10**5000,
                                  "name": "f", "arguments": "{}"}])
    with pytest.raises(InvalidInputError, match="an integer of"):
        await session.get_items(limit=-(10**5000))
    assert await session.get_items() == [{"role": "user", "content": "ok"}]


async def test_a_merge_that_cannot_be_stored_changes_nothing(store: Any) -> None:
    session = MemstoreSession("merge-fail", store)
    call_item = {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"}
    await session.add_items([{"role": "user", "content": "hi"}])
    await session.add_items([call_item])
    before = await session.get_items()
    stored_before = await call(store.messages("merge-fail"))
    # a retried write of the same call would give the response two calls "c1": refused,
    # and the stored response (read before anything is removed) is still there
    with pytest.raises(ValidationError):
        await session.add_items([dict(call_item)])
    assert await session.get_items() == before
    assert [m.id for m in await call(store.messages("merge-fail"))] == [
        m.id for m in stored_before]
    # a later, valid continuation still merges into it
    await session.add_items([{"type": "function_call", "call_id": "c2", "name": "f",
                              "arguments": "{}"}])
    assert (await call(store.messages("merge-fail")))[-1].tool_call_ids == ("c1", "c2")


def identity(message: Any) -> tuple[Any, ...]:
    """What a rewrite of a stored message keeps (its items and chat fields aside)."""
    return (message.seq, message.id, message.created_at, message.score, message.pinned,
            message.name, {k: v for k, v in message.metadata.items() if k != "openai_agents"})


async def test_a_failed_merge_write_changes_nothing(store: Any) -> None:
    session = MemstoreSession("merge-db-fail", store)
    await session.add_items([{"role": "user", "content": "hi"},
                             {"type": "reasoning", "id": "rs", "summary": []},
                             {"type": "function_call", "call_id": "c1", "name": "f",
                              "arguments": "{}"}])
    await call(store.pin("merge-db-fail", 2))
    before = await session.get_items()
    stored_before = await call(store.messages("merge-db-fail"))
    # the statement after the next delete of message rows fails, once (an event on the
    # engine: memstore's public surface, no private module patched)
    failures = [RuntimeError("database went away")]
    deleted: list[bool] = []
    engine = getattr(store.engine, "sync_engine", store.engine)  # (an AsyncEngine's)

    def failing_insert(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if failures and deleted:
            deleted.clear()
            raise failures.pop()
        if statement.lstrip().upper().startswith("DELETE FROM MEMSTORE_MESSAGES"):
            deleted.append(True)

    # the merge is one transaction (store.rewrite): the response was already deleted in
    # it when the write failed, and the rollback puts everything back
    sqlalchemy_event.listen(engine, "before_cursor_execute", failing_insert)
    try:
        with pytest.raises(RuntimeError, match="went away"):
            await session.add_items([{"type": "function_call", "call_id": "c2", "name": "f",
                                      "arguments": "{}"}])
        assert not failures
        assert await session.get_items() == before
        assert await call(store.messages("merge-db-fail")) == stored_before
        # pop_item rewrites the response without its last item, in one transaction too
        failures.append(RuntimeError("database went away"))
        with pytest.raises(RuntimeError, match="went away"):
            await session.pop_item()
        assert not failures
    finally:
        sqlalchemy_event.remove(engine, "before_cursor_execute", failing_insert)
    assert await session.get_items() == before
    assert await call(store.messages("merge-db-fail")) == stored_before
    assert await session.pop_item() == before[-1]
    assert await session.get_items() == before[:-1]
    assert identity((await call(store.messages("merge-db-fail")))[-1]) == identity(
        stored_before[-1])


async def test_pop_item_rewrite_keeps_the_message_identity(store: Any) -> None:
    # a reasoning model's final answer: one response, two items, one stored message
    model = ScriptedModel([[reasoning("think"), text("first answer")], [text("again")]])
    agent = Agent(name="a", instructions="x", model=model)
    session = MemstoreSession("identity", store)
    await Runner.run(agent, "question", session=session)
    items = await session.get_items()
    stored = await call(store.messages("identity"))
    assert [m.role for m in stored] == ["user", "assistant"]
    await call(store.set_score("identity", 2, 4.5))
    await call(store.pin("identity", 2))
    response = await call(store.get_message("identity", 2))

    # the SDK's correction pattern: take the answer back (the reasoning stays)
    popped = await session.pop_item()
    assert popped == items[-1]
    assert await session.get_items() == items[:-1]
    rewritten = await call(store.get_message("identity", 2))
    assert identity(rewritten) == identity(response)
    assert rewritten.score == 4.5 and rewritten.pinned
    assert rewritten.metadata["openai_agents"] == {"items": items[1:-1]}
    assert rewritten.token_count < response.token_count  # recounted without the answer
    assert await call(store.count_tokens("identity")) == sum(
        m.token_count for m in await call(store.messages("identity")))

    # put back, the answer merges into the same message again: still the same message
    await session.add_items([popped])
    assert await session.get_items() == items
    merged = await call(store.messages("identity"))
    assert len(merged) == 2
    assert identity(merged[1]) == identity(response)
    assert merged[1].token_count == response.token_count

    # still pinned: a budget that leaves the question out keeps the response
    filler = [{"role": "user" if n % 2 == 0 else "assistant",
               "content": f"filler {n} " + " ".join(["word"] * 8)} for n in range(6)]
    await session.add_items(filler)
    reader = MemstoreSession("identity", store, view=TokenLimitedView(token_limit=50))
    await Runner.run(agent, "once more", session=reader)
    seen = model.inputs[-1]
    assert seen[:2] == items[1:]  # the pinned response (reasoning and answer)
    assert seen[2:-1] == filler[-len(seen[2:-1]):] and 0 < len(seen[2:-1]) < len(filler)


async def test_a_merge_keeps_the_message_identity(store: Any) -> None:
    session = MemstoreSession("merge-identity", store)
    await session.add_items([{"role": "user", "content": "two things"},
                             {"type": "function_call", "call_id": "a", "name": "f",
                              "arguments": "{}"}])
    await call(store.set_score("merge-identity", 2, 0.25))
    response = await call(store.get_message("merge-identity", 2))
    # the rest of the response, its outputs and the next question, in one write
    await session.add_items([
        {"type": "function_call", "call_id": "b", "name": "f", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "a", "output": "1"},
        {"type": "function_call_output", "call_id": "b", "output": "2"},
        {"role": "user", "content": "thanks"},
    ])
    stored = await call(store.messages("merge-identity"))
    assert [m.role for m in stored] == ["user", "assistant", "tool", "tool", "user"]
    assert stored[1].tool_call_ids == ("a", "b")
    assert identity(stored[1]) == identity(response)
    # the messages after it are new ones, each with an id of its own
    assert len({m.id for m in stored}) == 5
    assert all(m.created_at >= response.created_at for m in stored[2:])
    assert await call(store.count_tokens("merge-identity")) == sum(
        m.token_count for m in stored)


async def test_a_concurrent_write_is_not_merged_and_keeps_its_identity(
        store: Any, db_url: str, counter: Any, monkeypatch: Any) -> None:
    session = MemstoreSession("race", store)
    await session.add_items([{"role": "user", "content": "q"},
                             {"type": "function_call", "call_id": "a", "name": "f",
                              "arguments": "{}"}])
    rewrite = store.rewrite
    theirs: list[Any] = []

    def rewrite_after_another_writer(*args: Any, **kwargs: Any) -> Any:
        # another writer appends a response between the session's read and its merge
        other = MemoryStore(db_url, counter=counter)
        try:
            theirs.append(other.append("race", {"role": "assistant", "content": "other",
                                                "metadata": {"openai_agents": {"items": [
                                                    {"role": "assistant",
                                                     "content": "other"}]}},
                                                "score": 3.0, "pinned": True}))
        finally:
            other.close()
        monkeypatch.setattr(store, "rewrite", rewrite)
        return rewrite(*args, **kwargs)

    monkeypatch.setattr(store, "rewrite", rewrite_after_another_writer)
    await session.add_items([{"type": "function_call", "call_id": "b", "name": "f",
                              "arguments": "{}"}])
    stored = await call(store.messages("race"))
    assert [m.role for m in stored] == ["user", "assistant", "assistant", "assistant"]
    assert [m.tool_call_ids for m in stored] == [(), ("a",), (), ("b",)]
    assert stored[2] == theirs[0]  # left exactly as it was written


def label(item: dict[str, Any]) -> str:
    return str(item.get("call_id") or item.get("type") or item.get("role"))


async def test_concurrent_pop_items_take_one_item_each(store: Any) -> None:
    # pop_item is one transaction: three at once pop the three calls, one each, and
    # leave the question and the reasoning (was: the user message popped, a call left)
    session = MemstoreSession("pops", store)
    for trial in range(15):
        await session.clear_session()
        await session.add_items([{"role": "user", "content": "q"}])
        await session.add_items([
            {"type": "reasoning", "id": "r", "summary": []},
            *({"type": "function_call", "call_id": f"x{i}", "name": "f", "arguments": "{}"}
              for i in range(3))])
        popped = await asyncio.gather(*(session.pop_item() for _ in range(3)))
        assert sorted(label(p) for p in popped if p) == ["x0", "x1", "x2"], trial
        assert [label(i) for i in await session.get_items()] == ["user", "reasoning"], trial
    # and more pops than items: each item once, then None
    popped = await asyncio.gather(*(session.pop_item() for _ in range(4)))
    def key(item: Any) -> str:
        return json.dumps(item, sort_keys=True)

    assert sorted(map(key, popped)) == sorted(map(key, [
        {"type": "reasoning", "id": "r", "summary": []}, {"role": "user", "content": "q"},
        None, None]))
    assert await session.get_items() == []


async def test_concurrent_add_items_never_put_an_output_before_its_call(store: Any) -> None:
    # a continuation of the response (merged into it) and the call's output, at once:
    # either order is fine, an output stored before its call is not
    text_item = {"type": "message", "role": "assistant",
                 "content": [{"type": "output_text", "text": "calling"}]}
    output = {"type": "function_call_output", "call_id": "c1", "output": "42"}
    response = [{"type": "reasoning", "id": "r", "summary": []},
                {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"}]
    question = {"role": "user", "content": "q"}
    orders = set()
    for trial in range(15):
        session = MemstoreSession(f"adds-{trial}", store)
        await session.add_items([question])
        await session.add_items(response)
        await asyncio.gather(session.add_items([text_item]), session.add_items([output]))
        items = await session.get_items()
        assert items in ([question, *response, text_item, output],
                         [question, *response, output, text_item]), (trial, items)
        assert_valid_history(items)
        orders.add(tuple(label(i) for i in items))
        window = await MemstoreSession(f"adds-{trial}", store, view=UnboundedView()).get_items()
        assert window == items
        stored = await call(store.messages(f"adds-{trial}"))
        assert len({m.id for m in stored}) == len(stored)
    assert orders


async def test_get_items_limit_without_a_view_keeps_whole_units(store: Any) -> None:
    # the Runner's SessionSettings.limit: never an output without its call
    question = {"role": "user", "content": "weather?"}
    fcall_item = {"type": "function_call", "call_id": "c1", "name": "weather",
                  "arguments": "{}"}
    output = {"type": "function_call_output", "call_id": "c1", "output": "sunny"}
    answer = {"type": "message", "role": "assistant", "content": "It is sunny"}
    items = [question, fcall_item, output, answer]
    plain = MemstoreSession("limits", store)
    viewed = MemstoreSession("limits", store, view=UnboundedView())
    await plain.add_items(items)
    for limit in range(1, 6):
        got = await plain.get_items(limit=limit)
        assert got == await viewed.get_items(limit=limit), limit
        assert len(got) <= limit
        assert_valid_history(got)
    assert await plain.get_items(limit=2) == [answer]
    assert await plain.get_items(limit=3) == items[1:]
    # across pages: many units, a limit that ends inside a call unit far back
    for n in range(40):
        await plain.add_items([{"role": "user", "content": f"q{n}"}])
        await plain.add_items([{"type": "function_call", "call_id": f"k{n}", "name": "f",
                                "arguments": "{}"}])
        await plain.add_items([{"type": "function_call_output", "call_id": f"k{n}",
                                "output": "r"}])
    for limit in (2, 3, 50, 100, 125):
        got = await plain.get_items(limit=limit)
        assert_valid_history(got)
        assert got == await viewed.get_items(limit=limit)
        assert limit - 2 <= len(got) <= limit
    # an output whose call is gone (truncated away) is not handed out either
    await call(store.truncate("limits", before_seq=3))
    got = await plain.get_items(limit=500)
    assert got[0] == answer and len(got) == 1 + 3 * 40
    assert await plain.get_items() == [output, *got]  # without a limit: all, as stored


def input_item_types() -> set[str]:
    """Every ``type`` of the openai package's Responses API input item union."""
    from openai.types.responses import ResponseInputItemParam

    found: set[str] = set()

    def literals(hint: Any) -> list[str]:
        return [a for a in typing.get_args(hint) if isinstance(a, str)] + [
            x for a in typing.get_args(hint) if not isinstance(a, str) for x in literals(a)]

    def walk(hint: Any) -> None:
        for arg in typing.get_args(hint):
            walk(arg)
        if "type" in getattr(hint, "__annotations__", {}):
            found.update(literals(typing.get_type_hints(hint, include_extras=True)["type"]))

    walk(ResponseInputItemParam)
    return found


#: Items that cannot become a tool-call unit: no ``call_id``, or one memstore cannot hold.
#: The first is the shape the SDK's own session tests store
#: (tests/memory/test_session_persistence_sanitize.py), for every item type.
UNPAIRED: list[dict[str, Any]] = [
    {"type": "computer_call", "id": "computer_call_abc123", "status": "completed"},
    *({"type": t, "id": f"{t}_abc123", "status": "completed"}
      for t in sorted(input_item_types() - {"message"})),
    {"type": "function_call", "name": "f", "arguments": "{}"},
    {"type": "function_call", "call_id": 7, "name": "f", "arguments": "{}"},
    {"type": "function_call", "call_id": "", "name": "f", "arguments": "{}"},
    {"type": "function_call", "call_id": "x" * 300, "name": "f", "arguments": "{}"},
    {"type": "function_call_output", "output": "r"},
    {"type": "computer_call", "id": "cu", "action": {"type": "screenshot"},
     "pending_safety_checks": [], "status": "completed"},
    {"type": "computer_call_output", "output": {"type": "computer_screenshot"}},
    {"type": "custom_tool_call", "name": "g", "input": "raw"},
    {"type": "custom_tool_call_output", "output": "ok"},
    {"type": "shell_call_output", "output": []},
    {"type": "local_shell_call_output", "id": "sh1", "output": "ok"},
]


async def test_items_without_a_call_id_are_stored_as_they_are(store: Any, db_url: str) -> None:
    """A session keeps what the runner hands it: an item that cannot become a tool-call
    unit (it has no usable ``call_id``) was refused with InvalidInputError; it is kept
    verbatim, alone or among other items, and reads back equal after a restart."""
    assert {"computer_call", "local_shell_call", "mcp_call", "item_reference"} <= {
        i["type"] for i in UNPAIRED}
    session = MemstoreSession("unpaired", store)
    history: list[dict[str, Any]] = []
    for n, item in enumerate(UNPAIRED):
        alone = [{"role": "user", "content": f"q{n}"}]
        await session.add_items(alone)
        await session.add_items([json.loads(json.dumps(item))])  # in a call of its own
        both = [{"role": "user", "content": f"again {n}"}, json.loads(json.dumps(item)),
                {"role": "assistant", "content": f"a{n}"}]
        await session.add_items(both)  # and among other items
        history += [*alone, item, *both]
        assert await session.get_items(limit=4) == history[-4:], item
    assert await session.get_items() == history
    [message] = items_to_messages([UNPAIRED[0]])
    assert messages_to_items([message]) == [UNPAIRED[0]] and not message.tool_calls
    window = await MemstoreSession("unpaired", store, view=UnboundedView()).get_items()
    assert window == history  # no unit is incomplete: none of them is a call

    again = reopen(store, db_url)
    try:
        got = await MemstoreSession("unpaired", again).get_items()
        assert got == history
        assert [json.dumps(i, sort_keys=True) for i in got] == [
            json.dumps(i, sort_keys=True) for i in history]
        assert await MemstoreSession("unpaired", again).pop_item() == history[-1]
    finally:
        await close(again)


def newest_oracle(items: list[dict[str, Any]], limit: int) -> list[dict[str, Any]]:
    """What ``get_items(limit=N)`` must return, by brute force: the newest ``N`` items,
    or the longest newer suffix in which every output has its call before it."""
    def valid(tail: list[dict[str, Any]]) -> bool:
        calls: set[str] = set()
        for item in tail:
            kind, call_id = str(item.get("type", "")), item.get("call_id")
            if kind.endswith("_call") and isinstance(call_id, str):
                calls.add(call_id)
            if kind.endswith("_call_output") and call_id not in calls:
                return False
        return True

    return next(items[start:] for start in range(max(0, len(items) - limit), len(items) + 1)
                if valid(items[start:]))


async def test_limit_counts_items_not_stored_messages(store: Any) -> None:
    """``limit=N`` returned nothing when the newest response was merged with an older one
    written by another ``add_items`` call: limits counted stored messages whole."""
    session = MemstoreSession("limit-items", store)
    old = {"role": "assistant", "content": "old"}
    thought = {"type": "reasoning", "id": "rs_1", "summary": []}
    answer = {"role": "assistant", "content": "..."}
    await session.add_items([old])
    await session.add_items([thought, answer])
    assert await session.get_items(limit=1) == [answer]
    assert await session.get_items(limit=2) == [thought, answer]
    assert await session.get_items(limit=3) == [old, thought, answer]
    question = {"role": "user", "content": "and?"}
    await session.add_items([question])
    assert await session.get_items(limit=1) == [question]
    assert await session.get_items(limit=2) == [answer, question]
    assert await session.get_items(limit=3) == [thought, answer, question]
    viewed = MemstoreSession("limit-items", store, view=UnboundedView())
    assert [await viewed.get_items(limit=n) for n in range(5)] == [
        await session.get_items(limit=n) for n in range(5)]
    # separate calls are separate messages: nothing demanded a merge
    stored = await call(store.messages("limit-items"))
    assert [len(m.metadata["openai_agents"]["items"]) for m in stored] == [1, 2, 1]


#: ``add_items`` calls, and the stored messages' roles they must make: a call's items
#: join the newest response only while it is open (calls unanswered, or a reasoning
#: item last), otherwise every call starts new messages.
BATCHES: list[list[dict[str, Any]]] = [
    [{"role": "user", "content": "q1"}],
    [{"role": "assistant", "content": "old"}],
    [{"type": "reasoning", "id": "r1", "summary": []}, {"role": "assistant", "content": "..."}],
    [{"role": "user", "content": "q2"}],
    [{"type": "reasoning", "id": "r2", "summary": []},
     {"type": "function_call", "call_id": "a", "name": "f", "arguments": "{}"},
     {"type": "function_call", "call_id": "b", "name": "f", "arguments": "{}"}],
    [{"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"}],  # joins
    [{"type": "function_call_output", "call_id": "a", "output": "1"},
     {"type": "function_call_output", "call_id": "b", "output": "2"}],
    [{"type": "function_call_output", "call_id": "c", "output": "3"},
     {"type": "reasoning", "id": "r3", "summary": []}],
    [{"role": "assistant", "content": "done"}],  # joins the reasoning before it
    [{"type": "computer_call", "id": "cc_1", "status": "completed"}],
    [{"role": "user", "content": "q3"}],
    [{"type": "function_call", "call_id": "d", "name": "f", "arguments": "{}"}],
]
BATCH_ROLES = ["user", "assistant", "assistant", "user", "assistant", "tool", "tool", "tool",
               "assistant", "assistant", "user", "assistant"]


async def test_limit_returns_the_newest_items_that_keep_outputs_with_calls(store: Any) -> None:
    session = MemstoreSession("limit-oracle", store)
    for batch in BATCHES:
        await session.add_items(batch)
    stored = await call(store.messages("limit-oracle"))
    assert [m.role for m in stored] == BATCH_ROLES
    assert stored[4].tool_call_ids == ("a", "b", "c")
    everything = [item for batch in BATCHES for item in batch]
    assert await session.get_items() == everything
    viewed = MemstoreSession("limit-oracle", store, view=UnboundedView())
    window = await viewed.get_items()
    assert window == everything[:-1]  # the pending call "d" is the turn in progress
    for items, reader in ((everything, session), (window, viewed)):
        for limit in range(len(items) + 2):
            got = await reader.get_items(limit=limit)
            assert got == newest_oracle(items, limit), (limit, reader.view)
            assert_valid_history([i for i in got if i.get("call_id") != "d"])
            if limit:
                assert got, limit  # never empty: the newest item is never an output here
                assert got[-1] == items[-1]
    # cut inside the call unit: the outputs of "a" and "b" cannot go without their calls
    outputs_start = everything.index(BATCHES[6][0])
    assert await session.get_items(limit=len(everything) - outputs_start) == everything[
        everything.index(BATCHES[7][1]):]


@pytest.mark.parametrize("view", [None, UnboundedView()])
async def test_changing_returned_items_does_not_change_the_session(
        store: Any, view: Any) -> None:
    items = [
        {"role": "user", "content": [{"type": "input_text", "text": "look"}]},
        {"type": "function_call", "call_id": "a", "name": "f", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "a",
         "output": [{"type": "input_text", "text": "part"}]},
        {"id": "m", "type": "message", "role": "assistant", "status": "completed",
         "content": [{"type": "output_text", "text": "done", "annotations": []}]},
    ]
    session = MemstoreSession("mutations", store, view=view)
    await session.add_items(json.loads(json.dumps(items)))
    for _ in range(2):  # the second read may come from the store's cache
        got = await session.get_items()
        assert got == items
        got[0]["content"][0]["text"] = "changed"
        got[2]["output"].append({"type": "input_text", "text": "more"})
        got[3]["content"][0]["annotations"].append({"type": "url_citation"})
        got[1]["name"] = "g"
    assert await session.get_items() == items
    popped = await session.pop_item()
    assert popped == items[-1]
    popped["content"][0]["text"] = "changed"
    assert await session.get_items() == items[:-1]


# ---- round trips: every item type comes back equal -----------------------------------------

ITEMS: list[dict[str, Any]] = [
    {"role": "user", "content": "plain"},
    {"type": "message", "role": "user", "content": [
        {"type": "input_text", "text": "look"},
        {"type": "input_image", "image_url": "https://example.com/a.png", "detail": "low"},
        {"type": "input_file", "file_id": "file-1"}]},
    {"role": "system", "content": "be brief"},
    {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "d"}]},
    {"id": "msg_1", "type": "message", "role": "assistant", "status": "completed",
     "content": [{"type": "output_text", "text": "hi", "annotations": []},
                 {"type": "refusal", "refusal": "no"}]},
    {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "t"}],
     "encrypted_content": "gAAAA=="},
    {"type": "web_search_call", "id": "ws_1", "status": "completed",
     "action": {"type": "search", "query": "memstore"}},
    {"type": "file_search_call", "id": "fs_1", "queries": ["q"], "status": "completed"},
    {"type": "item_reference", "id": "ref_1"},
    {"type": "image_generation_call", "id": "ig_1", "status": "completed", "result": None},
]
CALL_PAIRS: list[tuple[dict[str, Any], dict[str, Any]]] = [
    ({"type": "function_call", "call_id": "{id}", "name": "f", "arguments": '{"x": 1}',
      "id": "1", "status": "completed"},
     {"type": "function_call_output", "call_id": "{id}", "output": "result"}),
    ({"type": "function_call", "call_id": "{id}", "name": "g", "arguments": "not json"},
     {"type": "function_call_output", "call_id": "{id}",
      "output": [{"type": "input_text", "text": "part"}]}),
    ({"type": "computer_call", "id": "cu_1", "call_id": "{id}", "status": "completed",
      "action": {"type": "click", "x": 1, "y": 2, "button": "left"},
      "pending_safety_checks": []},
     {"type": "computer_call_output", "call_id": "{id}",
      "output": {"type": "computer_screenshot", "image_url": "data:image/png;base64,AA=="}}),
    ({"type": "custom_tool_call", "call_id": "{id}", "name": "grammar", "input": "raw"},
     {"type": "custom_tool_call_output", "call_id": "{id}", "output": "ok"}),
    ({"type": "function_call", "call_id": "{id}", "name": "look", "arguments": "{}"},
     {"type": "function_call_output", "call_id": "{id}", "output": [
         {"type": "input_text", "text": "see"},
         {"type": "input_image", "image_url": "data:image/png;base64,AA==", "detail": "low"},
         {"type": "input_file", "file_data": "data:application/pdf;base64,QUJD",
          "filename": "a.pdf"}]}),
    ({"type": "local_shell_call", "id": "lsc_1", "call_id": "{id}", "status": "completed",
      "action": {"type": "exec", "command": ["ls"], "env": {}}},
     {"type": "local_shell_call_output", "call_id": "{id}", "output": "{\"stdout\": \"a\"}"}),
    ({"type": "shell_call", "call_id": "{id}", "status": "completed",
      "action": {"commands": ["make"], "timeout_ms": 1000, "max_output_length": None}},
     {"type": "shell_call_output", "call_id": "{id}", "output": [
         {"stdout": "built", "stderr": "", "outcome": {"type": "exit", "exit_code": 0}}]}),
    ({"type": "apply_patch_call", "call_id": "{id}", "status": "completed",
      "operation": {"type": "delete_file", "path": "a.txt"}},
     {"type": "apply_patch_call_output", "call_id": "{id}", "status": "completed",
      "output": None}),
]


def _fill(item: dict[str, Any], call_id: str) -> dict[str, Any]:
    return json.loads(json.dumps(item).replace("{id}", call_id))


@st.composite
def histories(draw: st.DrawFn) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    for n in range(draw(st.integers(1, 6))):
        if draw(st.booleans()):
            items.append(draw(st.sampled_from(ITEMS)))
        else:
            pairs = draw(st.lists(st.sampled_from(CALL_PAIRS), min_size=1, max_size=3))
            ids = [f"call_{n}_{k}" for k in range(len(pairs))]
            items += [_fill(c, i) for (c, _), i in zip(pairs, ids)]
            items += [_fill(o, i) for (_, o), i in zip(pairs, ids)]
    return items


@settings(max_examples=examples(40), derandomize=True, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(history=histories())
def test_items_round_trip_through_messages(history: list[dict[str, Any]]) -> None:
    messages = items_to_messages(history)
    assert messages_to_items(messages) == history
    for message in messages:
        assert message.model_validate(message.model_dump()) == message


async def test_every_item_type_round_trips_through_the_store(store: Any) -> None:
    session = MemstoreSession("types", store)
    history = list(ITEMS)
    for n, (call_item, output) in enumerate(CALL_PAIRS):
        history += [{"role": "user", "content": f"call {n}"}, _fill(call_item, f"k{n}"),
                    _fill(output, f"k{n}")]
    for item in history:  # one add_items per item: merging must not change anything
        await session.add_items([item])
    assert await session.get_items() == history
    stored = await call(store.messages("types"))
    calls = [m for m in stored if m.tool_calls]
    assert [c.id for m in calls for c in m.tool_calls] == [f"k{n}" for n in range(len(CALL_PAIRS))]
    # windows over them are valid chat: every tool message answers a kept call
    window = await call(store.window("types", UnboundedView()))
    assert len(window.messages) == len(stored)


# ---- what a call output counts: what the model receives of it -----------------------------


def png_url(width: int, height: int, payload: int = 60_000) -> str:
    """A base64 PNG data URL of ``width`` x ``height`` (a real header, filler pixels)."""
    header = (b"\x89PNG\r\n\x1a\n" + (13).to_bytes(4, "big") + b"IHDR"
              + width.to_bytes(4, "big") + height.to_bytes(4, "big") + b"\x08\x02\x00\x00\x00")
    return "data:image/png;base64," + base64.b64encode(
        header + bytes(range(256)) * (payload // 256)).decode()


SCREEN = png_url(1024, 768)  # high detail: 85 + 170 * 4 tiles = 765 under GPT-4o's rule
BIG = "line of build log output with some words in it\n" * 300


def image_price(counter: Any, url: str, detail: Any = None) -> int:
    """What ``counter`` charges for an image in a user message."""
    part = ImagePart(image_url=ImageURL(url=url, detail=detail))
    return (counter.count_message(Message(role="user", content=[part]))
            - counter.count_message(Message(role="user", content=[])))


#: (call item, output item, lowest and highest token count of the output's tool message,
#: given the price of a ``SCREEN`` image, and what its text must hold).
OUTPUTS: list[tuple[dict[str, Any], dict[str, Any], Any, str]] = [
    ({"type": "function_call", "call_id": "{id}", "name": "f", "arguments": "{}"},
     {"type": "function_call_output", "call_id": "{id}", "output": "result"},
     lambda img: (3, 15), "result"),
    ({"type": "function_call", "call_id": "{id}", "name": "shot", "arguments": "{}"},
     {"type": "function_call_output", "call_id": "{id}", "output": [
         {"type": "input_text", "text": "here it is"},
         {"type": "input_image", "image_url": SCREEN, "detail": "high"}]},
     lambda img: (img, img + 25), "here it is[input_image]"),
    ({"type": "function_call", "call_id": "{id}", "name": "shot", "arguments": "{}"},
     {"type": "function_call_output", "call_id": "{id}", "output": [
         {"type": "input_image", "image_url": SCREEN, "detail": "low"}]},
     lambda img: (85, 85 + 20), "[input_image]"),
    ({"type": "function_call", "call_id": "{id}", "name": "shot", "arguments": "{}"},
     {"type": "function_call_output", "call_id": "{id}", "output": [
         {"type": "input_image", "file_id": "file-1"}]},  # size unknown: the most it costs
     lambda img: (1445, 1445 + 20), "[input_image]"),
    ({"type": "function_call", "call_id": "{id}", "name": "read", "arguments": "{}"},
     {"type": "function_call_output", "call_id": "{id}", "output": [
         {"type": "input_file", "filename": "a.pdf",
          "file_data": "data:application/pdf;base64," + "QUJD" * 10_000}]},
     lambda img: (7500, 7500 + 25), "[input_file a.pdf]"),  # 30,000 bytes: 7,500 tokens
    ({"type": "function_call", "call_id": "{id}", "name": "read", "arguments": "{}"},
     {"type": "function_call_output", "call_id": "{id}", "output": [
         {"type": "input_file", "file_id": "file-2"}]},  # not known here: not counted
     lambda img: (3, 20), "[input_file]"),
    ({"type": "function_call", "call_id": "{id}", "name": "odd", "arguments": "{}"},
     {"type": "function_call_output", "call_id": "{id}",
      "output": {"type": "unknown", "image_url": SCREEN}},
     lambda img: (3, 40), '"image_url": "data:image/png;base64,…"'),
    ({"type": "computer_call", "id": "cu_1", "call_id": "{id}", "status": "completed",
      "action": {"type": "screenshot"}, "pending_safety_checks": []},
     {"type": "computer_call_output", "call_id": "{id}",
      "output": {"type": "computer_screenshot", "image_url": SCREEN}},
     lambda img: (img, img + 25), "[computer_screenshot]"),
    ({"type": "computer_call", "id": "cu_2", "call_id": "{id}", "status": "completed",
      "action": {"type": "screenshot"}, "pending_safety_checks": []},
     {"type": "computer_call_output", "call_id": "{id}",
      "output": {"type": "computer_screenshot", "file_id": "file-3"}},
     lambda img: (1445, 1445 + 25), "[computer_screenshot]"),
    ({"type": "custom_tool_call", "call_id": "{id}", "name": "grammar", "input": "raw"},
     {"type": "custom_tool_call_output", "call_id": "{id}", "output": "ok"},
     lambda img: (3, 15), "ok"),
    ({"type": "custom_tool_call", "call_id": "{id}", "name": "grammar", "input": "raw"},
     {"type": "custom_tool_call_output", "call_id": "{id}", "output": [
         {"type": "input_text", "text": "drawn"},
         {"type": "input_image", "image_url": SCREEN}]},  # no detail: priced as high
     lambda img: (img, img + 25), "drawn[input_image]"),
    ({"type": "local_shell_call", "id": "lsc_1", "call_id": "{id}", "status": "completed",
      "action": {"type": "exec", "command": ["make"], "env": {}}},
     {"type": "local_shell_call_output", "call_id": "{id}", "output": BIG},
     lambda img: (3000, 3400), BIG),
    ({"type": "shell_call", "call_id": "{id}", "status": "completed",
      "action": {"commands": ["make"], "timeout_ms": 1000, "max_output_length": None}},
     {"type": "shell_call_output", "call_id": "{id}", "output": [
         {"stdout": BIG, "stderr": "warning: slow\n", "outcome": {"type": "exit",
                                                                 "exit_code": 0}},
         {"stdout": "", "stderr": "", "outcome": {"type": "timeout"}}]},
     lambda img: (3000, 3400), BIG + "warning: slow\n"),
    ({"type": "apply_patch_call", "call_id": "{id}", "status": "completed",
      "operation": {"type": "delete_file", "path": "a.txt"}},
     {"type": "apply_patch_call_output", "call_id": "{id}", "status": "completed",
      "output": "deleted a.txt"},
     lambda img: (3, 20), "deleted a.txt"),
    ({"type": "apply_patch_call", "call_id": "{id}", "status": "completed",
      "operation": {"type": "delete_file", "path": "b.txt"}},
     {"type": "apply_patch_call_output", "call_id": "{id}", "status": "failed",
      "output": None},
     lambda img: (3, 15), ""),
]


def test_outputs_cover_every_call_output_type() -> None:
    assert {o["type"] for _, o, _, _ in OUTPUTS} == {
        t for t in input_item_types() if t.endswith("_call_output")}


@pytest.mark.parametrize("counting", ["store", "tiktoken", "approx"])
async def test_call_outputs_count_what_the_model_receives(
        store: Any, db_url: str, counting: str) -> None:
    counted: Any = {"store": store.counter, "tiktoken": TiktokenCounter(),
                    "approx": ApproxCounter()}[counting]
    own = store if counting == "store" else await open_store(
        "sync" if isinstance(store, MemoryStore) else "async", db_url, counted)
    try:
        session = MemstoreSession(f"outputs-{counting}", own)
        history: list[dict[str, Any]] = []
        for n, (call_item, output, _, _) in enumerate(OUTPUTS):
            unit = [{"role": "user", "content": f"step {n}"}, _fill(call_item, f"o{n}"),
                    _fill(output, f"o{n}")]
            await session.add_items(unit)
            history += unit
        assert await session.get_items() == history  # the items, exactly as added
        tools = [m for m in await call(own.messages(f"outputs-{counting}"))
                 if m.role == "tool"]
        assert [m.tool_call_id for m in tools] == [f"o{n}" for n in range(len(OUTPUTS))]
        price = image_price(counted, SCREEN, "high")
        for message, (_, output, bounds, text) in zip(tools, OUTPUTS):
            assert "base64,QUJD" not in message.text and "base64,iVBOR" not in message.text
            assert text in message.text, (output["type"], message.text[:80])
            if isinstance(counted, FixedCounter):  # prices no image: only text counts
                continue
            low, high = bounds(price)
            if isinstance(counted, ApproxCounter) and high > 40:  # a ratio, not a tokenizer
                low, high = low * 3 // 4, high * 4 // 3
            assert low <= message.token_count <= high, (output["type"], message.token_count)
        if isinstance(counted, TiktokenCounter):
            assert price == 765
        # a budget that holds the history's text but not its images leaves them out
        view = TokenLimitedView(token_limit=2000)
        items = await MemstoreSession(f"outputs-{counting}", own, view=view).get_items()
        assert_valid_history(items)
        assert items == history[len(history) - len(items):]
        window = await call(own.window(f"outputs-{counting}", view))
        assert window.token_count <= 2000
    finally:
        if own is not store:
            await close(own)


def test_images_without_a_counter_cost_gpt_4o_prices() -> None:
    out = {"type": "function_call_output", "call_id": "c", "output": [
        {"type": "input_image", "image_url": SCREEN, "detail": "high"}]}
    [message] = items_to_messages([out])
    assert message.text == "[input_image]" + " ." * 765
    assert messages_to_items([message]) == [out]
    [message] = items_to_messages([out], counter=TiktokenCounter())
    assert 765 <= TiktokenCounter().count_message(message) - 8 <= 770


@function_tool
def screenshot_tool() -> ToolOutputImage:
    """Take a screenshot."""
    return ToolOutputImage(image_url=SCREEN, detail="high")


class Screen(AsyncComputer):
    """A computer that only takes screenshots (what the SDK asks of a screenshot action)."""

    @property
    def environment(self) -> Any:
        return "browser"

    @property
    def dimensions(self) -> tuple[int, int]:
        return (1024, 768)

    async def screenshot(self) -> str:
        return SCREEN.split(",", 1)[1]

    async def click(self, x: int, y: int, button: Any) -> None: ...
    async def double_click(self, x: int, y: int) -> None: ...
    async def scroll(self, x: int, y: int, scroll_x: int, scroll_y: int) -> None: ...
    async def type(self, text: str) -> None: ...
    async def wait(self) -> None: ...
    async def move(self, x: int, y: int) -> None: ...
    async def keypress(self, keys: list[str]) -> None: ...
    async def drag(self, path: list[tuple[int, int]]) -> None: ...


async def test_runner_images_count_as_images(store: Any, db_url: str) -> None:
    """A tool's image and a computer screenshot, written by the SDK, count their price."""
    own = await open_store("sync" if isinstance(store, MemoryStore) else "async", db_url,
                           TiktokenCounter())
    try:
        model = ScriptedModel([
            [ResponseFunctionToolCall(id="1", type="function_call", call_id="f1",
                                      name="screenshot_tool", arguments="{}")],
            [ResponseComputerToolCall(id="cu_1", type="computer_call", call_id="k1",
                                      status="completed", pending_safety_checks=[],
                                      action=ActionScreenshot(type="screenshot"))],
            [text("two screenshots")],
        ])
        agent = Agent(name="eye", instructions="Look.", model=model,
                      tools=[screenshot_tool, ComputerTool(computer=Screen())])
        session = MemstoreSession("eye", own)
        await Runner.run(agent, "look twice", session=session)
        everything = await session.get_items()
        outputs = [i for i in everything if i.get("type", "").endswith("_call_output")]
        assert [o["type"] for o in outputs] == ["function_call_output", "computer_call_output"]
        assert SCREEN in json.dumps(outputs)  # the SDK's items carry the image itself
        assert_valid_history(everything)
        tools = [m for m in await call(own.messages("eye")) if m.role == "tool"]
        assert [m.text.split(" ")[0] for m in tools] == ["[input_image]",
                                                        "[computer_screenshot]"]
        assert all(765 <= m.token_count <= 790 for m in tools), [m.token_count for m in tools]

        # the model is handed whole units that fit: one screenshot fits 1000, not two
        model.outputs = [[text("ok")]]
        reader = MemstoreSession("eye", own, view=TokenLimitedView(token_limit=1000))
        window_items = await reader.get_items()
        assert sum(i.get("type") == "computer_call_output" for i in window_items) == 1
        assert not any(i.get("type") == "function_call_output" for i in window_items)
        await Runner.run(agent, "again", session=reader)
        assert model.inputs[-1][:-1] == window_items
        assert_valid_history(model.inputs[-1])
        after = await MemstoreSession("eye", own).get_items()
        assert after[:len(everything) + 1] == [*everything, {"role": "user", "content": "again"}]
    finally:
        await close(own)


# ---- the documented example runs ------------------------------------------------------------


def test_docs_example_runs(tmp_path: Path, monkeypatch: Any) -> None:
    monkeypatch.chdir(tmp_path)
    page = (ROOT / "docs" / "integrations" / "openai_agents.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", page, flags=re.S)
    assert blocks
    model = ScriptedModel([[fcall("c1", 2, 3)], [text("5")], [text("You asked for 2 + 3.")]])
    namespace: dict[str, Any] = {"__name__": "__docs__", "model": model}
    for block in blocks:
        exec(compile(block, "openai_agents.md", "exec"), namespace)
    assert namespace["result"].final_output == "You asked for 2 + 3."


def test_importing_memstore_imports_no_framework() -> None:
    import subprocess
    import sys

    code = ("import sys, memstore, memstore.integrations\n"
            "bad = sorted({m.split('.')[0] for m in sys.modules}\n"
            "             & {'agents', 'camel', 'openai', 'autogen_core', 'langchain_core'})\n"
            "assert not bad, bad\n")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


async def test_sdk_tool_approval_across_a_restart(store: Any, db_url: str) -> None:
    if "needs_approval" not in inspect.signature(function_tool).parameters:
        pytest.skip(f"openai-agents {agents.__version__} has no tool approval")
    from agents import RunState

    @function_tool(needs_approval=True)
    def remove(path: str) -> str:
        """Delete a file."""
        return f"deleted {path}"

    def make_agent(model: ScriptedModel) -> Agent:
        return Agent(name="ops", instructions="Do as asked.", model=model, tools=[remove])

    model = ScriptedModel([[ResponseFunctionToolCall(
        id="1", type="function_call", call_id="rm1", name="remove",
        arguments=json.dumps({"path": "x.txt"}))]])
    agent = make_agent(model)
    result = await Runner.run(agent, "delete x.txt", session=MemstoreSession("ops", store))
    assert result.interruptions
    saved = result.to_state().to_json()
    del agent, result

    again = reopen(store, db_url)
    try:
        model2 = ScriptedModel([[text("x.txt is gone")]])
        agent2 = make_agent(model2)
        session = MemstoreSession("ops", again, view=UnboundedView())
        state = await RunState.from_json(agent2, saved)
        state.approve(state.get_interruptions()[0])
        result = await Runner.run(agent2, state, session=session)
        assert result.final_output == "x.txt is gone"
        assert_valid_history(model2.inputs[0])
        items = await session.get_items()
        assert [i.get("type", "message") for i in items] == [
            "message", "function_call", "function_call_output", "message"]
        stored = await call(again.messages("ops"))
        assert [m.role for m in stored] == ["user", "assistant", "tool", "assistant"]
    finally:
        await close(again)


async def test_runner_passes_session_settings_limit(store: Any) -> None:
    settings_cls = getattr(agents, "SessionSettings", None)
    if settings_cls is None:
        pytest.skip(f"openai-agents {agents.__version__} has no SessionSettings")
    session = MemstoreSession("limited", store, view=UnboundedView(),
                              session_settings=settings_cls(limit=3))
    await session.add_items([
        {"role": "user", "content": "q"},
        {"type": "function_call", "call_id": "a", "name": "f", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "a", "output": "1"},
        {"role": "assistant", "content": "first"},
        {"role": "user", "content": "again"},
        {"role": "assistant", "content": "second"},
    ])
    model = ScriptedModel([[text("third")]])
    await Runner.run(Agent(name="a", instructions="x", model=model), "more", session=session)
    # three items, whole units only: the call unit (2 items) did not fit with the newest two
    assert model.inputs[0][:-1] == [{"role": "assistant", "content": "first"},
                                    {"role": "user", "content": "again"},
                                    {"role": "assistant", "content": "second"}]


async def test_constructor_refuses_what_the_store_would(store: Any) -> None:
    assert_constructor_refuses_what_the_store_would(MemstoreSession, store, "session_id")


async def test_a_damaged_stash_does_not_break_the_session(store: Any) -> None:
    """A ``metadata["openai_agents"]`` holding no items (another writer's, or damaged)
    made ``pop_item`` raise IndexError; such a stash is ignored, the message's own items
    used. An item nested past JSON's depth raised RecursionError."""
    await call(store.append("d", Message.user("z", metadata={"openai_agents": {"items": []}})))
    await call(store.append("d", Message.user("y", metadata={"openai_agents": {"items": [1]}})))
    session = MemstoreSession("d", store)
    assert await session.get_items() == [{"role": "user", "content": "z"},
                                         {"role": "user", "content": "y"}]
    assert await session.pop_item() == {"role": "user", "content": "y"}
    assert await session.pop_item() == {"role": "user", "content": "z"}
    assert await session.pop_item() is None

    nested: list[Any] = []
    for _ in range(5_000):
        nested = [nested]
    # (Python 3.11's json gives up: "nested too deeply"; 3.13's encodes it, and the
    # stored metadata's depth rule refuses it: "nested more than 64 levels deep")
    with pytest.raises((InvalidInputError, ValidationError), match="nested"):
        await session.add_items([{"role": "user", "content": nested}])
    assert await session.get_items() == []
