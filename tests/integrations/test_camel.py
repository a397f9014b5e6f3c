"""MemstoreAgentMemory driven by CAMEL's own ChatAgent, on SQLite and Postgres."""

from __future__ import annotations

import json
import re
import sys
import threading
import uuid
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from memstore import (
    AsyncMemoryStore,
    ConfigurationError,
    FixedCounter,
    InvalidInputError,
    MemoryStore,
    Message,
    ScoreBasedView,
    StoredMessage,
    SummaryView,
    TokenLimitedView,
    UnboundedView,
)
from tests.helpers import call, examples
from tests.integrations import assert_openai_history_valid, require

require("camel")
from camel.agents import ChatAgent  # noqa: E402
from camel.memories import ContextRecord, MemoryRecord  # noqa: E402
from camel.messages import BaseMessage, FunctionCallingMessage  # noqa: E402
from camel.models.stub_model import StubModel  # noqa: E402
from camel.types import (  # noqa: E402
    ChatCompletion,
    ChatCompletionMessage,
    Choice,
    CompletionUsage,
    ModelType,
    OpenAIBackendRole,
    RoleType,
)

from memstore.integrations.camel import (  # noqa: E402
    ContextOverflowError,
    MemstoreAgentMemory,
    message_to_record,
    record_to_message,
)

ROOT = Path(__file__).resolve().parents[2]
COUNTER = FixedCounter(per_message=3, per_word=1, per_tool_call=2, priming=3)


@pytest.fixture(autouse=True)
def toolkit_check_without_source_lines(monkeypatch: pytest.MonkeyPatch) -> None:
    """CAMEL's ChatAgent asks at every step whether a RegisteredAgentToolkit is on the call
    stack, with ``inspect.stack()``, which also finds the source lines of every frame: under
    pytest, with every integration imported, about 0.1 s a step (a third of this file's
    time). The same question, answered by walking the same frames without their source (a
    CAMEL that renamed the method fails here, not silently)."""
    from camel.toolkits.base import RegisteredAgentToolkit

    def is_called_from_registered_toolkit(self: ChatAgent) -> bool:
        try:
            frame = sys._getframe()
            while frame is not None:
                if isinstance(frame.f_locals.get("self"), RegisteredAgentToolkit):
                    return True
                frame = frame.f_back  # type: ignore[assignment]
        except Exception:
            return False
        return False

    monkeypatch.setattr(ChatAgent, "_is_called_from_registered_toolkit",
                        is_called_from_registered_toolkit)


# ---- a stub model backend with canned replies (CAMEL's StubModel, scripted) ----------------


class ScriptedModel(StubModel):
    """Returns canned ChatCompletions in order and records the messages it was sent."""

    def __init__(self, replies: list[dict[str, Any]]) -> None:
        super().__init__(ModelType.STUB)
        self.replies = list(replies)
        self.seen: list[list[dict[str, Any]]] = []

    def _reply(self, messages: Any) -> ChatCompletion:
        self.seen.append(json.loads(json.dumps([dict(m) for m in messages])))
        reply = self.replies.pop(0)
        message = ChatCompletionMessage(role="assistant", content=reply.get("content"),
                                        tool_calls=reply.get("tool_calls"))
        reason = "tool_calls" if reply.get("tool_calls") else "stop"
        return ChatCompletion(
            id="stub", model="stub", object="chat.completion", created=0,
            choices=[Choice(finish_reason=reason, index=0, message=message, logprobs=None)],
            usage=CompletionUsage(completion_tokens=1, prompt_tokens=1, total_tokens=2))

    def _run(self, messages: Any, response_format: Any = None, tools: Any = None) -> Any:
        return self._reply(messages)

    async def _arun(self, messages: Any, response_format: Any = None, tools: Any = None) -> Any:
        return self._reply(messages)


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: the first.
        b: the second.
    """
    return a + b


def tool_call(call_id: str, a: int, b: int) -> dict[str, Any]:
    return {"id": call_id, "type": "function",
            "function": {"name": "add", "arguments": json.dumps({"a": a, "b": b})}}


def reopen(store: Any, db_url: str) -> Any:
    if isinstance(store, AsyncMemoryStore):
        return AsyncMemoryStore(db_url, counter=COUNTER)
    return MemoryStore(db_url, counter=COUNTER)


def agent_for(memory: MemstoreAgentMemory, model: ScriptedModel) -> ChatAgent:
    return ChatAgent("You add numbers.", model=model, memory=memory, tools=[add],
                     summarize_threshold=None)


# ---- driven by ChatAgent -------------------------------------------------------------------


async def test_chat_agent_resumes_after_a_restart(store: Any, db_url: str) -> None:
    model = ScriptedModel([{"tool_calls": [tool_call("c1", 1, 2), tool_call("c2", 3, 4)]},
                           {"content": "3 and 7"}, {"content": "you are welcome"}])
    agent = agent_for(MemstoreAgentMemory("chat-1", store, token_limit=4000), model)
    assert (await agent.astep("add 1+2 and 3+4")).msgs[0].content == "3 and 7"
    await agent.astep("thanks")
    before = model.seen[-1] + [{"role": "assistant", "content": "you are welcome"}]
    stored = await call(store.messages("chat-1"))
    assert [m.role for m in stored] == ["system", "user", "assistant", "tool", "tool",
                                       "assistant", "user", "assistant"]
    assert stored[2].tool_call_ids == ("c1", "c2")
    del agent, model, stored

    again = reopen(store, db_url)
    try:
        model2 = ScriptedModel([{"content": "you asked for two sums"}])
        agent2 = agent_for(MemstoreAgentMemory("chat-1", again, token_limit=4000), model2)
        await agent2.astep("what did I ask?")
        seen = model2.seen[0]
        # the agent's construction did not wipe the history nor repeat its system message
        assert seen == [*before, {"role": "user", "content": "what did I ask?"}]
        assert_openai_history_valid(seen)
        assert [r.memory_record.role_at_backend for r in agent2.memory.retrieve()].count(
            OpenAIBackendRole.SYSTEM) == 1
    finally:
        await call(again.close())


async def test_chat_agent_accepts_the_budgeted_window(store: Any) -> None:
    replies: list[dict[str, Any]] = []
    for n in range(4):
        replies += [{"tool_calls": [tool_call(f"c{n}a", n, 1), tool_call(f"c{n}b", n, 2)]},
                    {"content": f"sums of turn {n} are ready"}]
    model = ScriptedModel(replies)
    memory = MemstoreAgentMemory("chat-2", store, token_limit=70)
    agent = agent_for(memory, model)
    for n in range(4):
        await agent.astep(f"turn {n}: add my numbers please")
    # every request the model received was valid chat within the budget
    for messages in model.seen:
        assert_openai_history_valid(messages)
        assert messages[0] == {"role": "system", "content": "You add numbers."}
        assert COUNTER.count_messages([Message.from_openai(m) for m in messages]) <= 70
    last = model.seen[-1]
    assert last[-1]["role"] == "tool"  # the newest unit is kept whole
    assert len(last) < len(await call(store.messages("chat-2")))  # and the window was cut
    messages, tokens = memory.get_context()
    assert_openai_history_valid(messages)
    assert tokens <= 70


# ---- the AgentMemory contract --------------------------------------------------------------


async def test_empty_memory(store: Any) -> None:
    memory = MemstoreAgentMemory("never-written", store)
    assert memory.get_context() == ([], 0)
    assert memory.retrieve() == []
    assert memory.pop_records(3) == []
    assert memory.remove_records_by_indices([0]) == []
    memory.clean_tool_calls()
    memory.clear()
    assert memory.get_context_creator().token_limit == ModelType.DEFAULT.token_limit


def _records() -> list[MemoryRecord]:
    def msg(role: RoleType, text: str, meta: Any = None) -> BaseMessage:
        return BaseMessage(role_name=role.value, role_type=role, meta_dict=meta, content=text)

    return [
        MemoryRecord(message=msg(RoleType.ASSISTANT, "sys"),
                     role_at_backend=OpenAIBackendRole.SYSTEM),
        MemoryRecord(message=msg(RoleType.USER, "q"), role_at_backend=OpenAIBackendRole.USER),
        MemoryRecord(message=msg(RoleType.ASSISTANT, "", {"tool_calls": [tool_call("k", 1, 1)]}),
                     role_at_backend=OpenAIBackendRole.ASSISTANT),
        MemoryRecord(message=FunctionCallingMessage(
            role_name="a", role_type=RoleType.ASSISTANT, meta_dict=None, content="",
            func_name="add", result=2, tool_call_id="k"),
            role_at_backend=OpenAIBackendRole.FUNCTION),
        MemoryRecord(message=msg(RoleType.ASSISTANT, "two"),
                     role_at_backend=OpenAIBackendRole.ASSISTANT),
    ]


async def test_pop_remove_clean_and_clear(store: Any) -> None:
    memory = MemstoreAgentMemory("contract", store, agent_id="agent-7")
    records = _records()
    memory.write_records(records)
    memory.write_records(records[1:2])  # the same record again: stored once
    assert len(memory.retrieve()) == 5
    assert {r.memory_record.agent_id for r in memory.retrieve()} == {"agent-7"}
    with pytest.raises(TypeError):
        memory.pop_records("2")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        memory.pop_records(-1)
    assert memory.pop_records(0) == []
    popped = memory.pop_records(1)
    assert [r.uuid for r in popped] == [records[4].uuid]
    memory.clean_tool_calls()
    assert [r.memory_record.uuid for r in memory.retrieve()] == [records[0].uuid,
                                                                 records[1].uuid]
    memory.write_records(records[2:])
    removed = memory.remove_records_by_indices([0, 1, 99])  # index 0 is the system record
    assert [r.uuid for r in removed] == [records[1].uuid]
    assert [r.uuid for r in memory.pop_records(10)] == [r.uuid for r in records[2:]]
    assert [r.memory_record.uuid for r in memory.retrieve()] == [records[0].uuid]
    memory.clear()
    assert memory.retrieve() == []


def user_record(text: str) -> MemoryRecord:
    return MemoryRecord(message=BaseMessage("user", RoleType.USER, None, text),
                        role_at_backend=OpenAIBackendRole.USER)


async def test_pruning_tool_calls_loses_no_concurrent_record(store: Any, db_url: str) -> None:
    # clean_tool_calls (ChatAgent's prune_tool_calls_from_memory) is one transaction: a
    # record another agent writes meanwhile is never lost (was: save_state, then a
    # replacing load_state, which dropped what came in between)
    replies: list[dict[str, Any]] = []
    for n in range(8):
        replies += [{"tool_calls": [tool_call(f"c{n}", n, 1)]}, {"content": f"sum {n}"}]
    memory = MemstoreAgentMemory("busy", store, token_limit=1_000_000)
    agent = ChatAgent("You add numbers.", model=ScriptedModel(replies), memory=memory,
                      tools=[add], summarize_threshold=None, prune_tool_calls_from_memory=True)
    memory.write_records([user_record(f"old-{i}") for i in range(300)])
    stop = threading.Event()
    written: list[str] = []
    errors: list[BaseException] = []

    def other_agent() -> None:
        other = MemoryStore(db_url, counter=COUNTER)
        try:
            other_memory = MemstoreAgentMemory("busy", other)
            i = 0
            while not stop.is_set():
                other_memory.write_records([user_record(f"new-{i}")])
                written.append(f"new-{i}")
                i += 1
                # Paced (a write every 2 ms at most, about PostgreSQL's own pace here): still
                # many writes during every step, but on SQLite an unpaced writer piled up
                # thousands of records, each step reading them all (up to 13 s a run).
                stop.wait(0.002)
        except BaseException as exc:
            errors.append(exc)
        finally:
            other.close()

    thread = threading.Thread(target=other_agent)
    thread.start()
    try:
        for n in range(8):
            await agent.astep(f"add {n} and 1")
            memory.remove_records_by_indices([1])  # the oldest "old-" record, each time
    finally:
        stop.set()
        thread.join()
    assert not errors, errors
    assert written
    stored = await call(store.messages("busy"))
    texts = [m.text for m in stored]
    assert [t for t in texts if t.startswith("new-")] == written
    assert [t for t in texts if t.startswith("old-")] == [f"old-{i}" for i in range(8, 300)]
    assert [t for t in texts if t.startswith("sum")] == [f"sum {n}" for n in range(8)]
    assert not [m for m in stored if m.role == "tool" or m.tool_calls]
    assert [m.seq for m in stored] == list(range(1, len(stored) + 1))
    assert len({m.id for m in stored}) == len(stored)


async def test_removing_records_drops_the_summaries_of_removed_content(store: Any) -> None:
    memory = MemstoreAgentMemory("summed", store)
    records = [user_record(f"m{i}") for i in range(1, 11)]
    memory.write_records(records)
    summary = await call(store.summarize("summed", lambda ms: "S", keep_tokens=12))
    assert summary.first_seq == 1 and summary.last_seq >= 5
    before = {r.memory_record.uuid: r.memory_record for r in memory.retrieve()}
    removed = memory.remove_records_by_indices([0, 1, 2, 3, 4])
    assert [r.uuid for r in removed] == [r.uuid for r in records[:5]]
    # the summary described removed records: it goes (was: written back unchanged, so a
    # SummaryView hid records it never summarized behind it)
    assert await call(store.summaries("summed")) == []
    view = SummaryView(token_limit=1000)
    window = await call(store.window("summed", view))
    assert [m.text for m in window.messages] == [f"m{i}" for i in range(6, 11)]
    await call(store.extend("summed", [Message.user(f"new{i}") for i in range(3)]))
    window = await call(store.window("summed", view))
    assert [m.text for m in window.messages] == [
        *(f"m{i}" for i in range(6, 11)), "new0", "new1", "new2"]
    # the kept records keep their identity (uuid, timestamp, everything)
    kept = [r.memory_record for r in memory.retrieve()][:5]
    assert [r.to_dict() for r in kept] == [before[r.uuid].to_dict() for r in kept]
    # a summary ending before the first removed record stays
    summary = await call(store.summarize("summed", lambda ms: "T", keep_tokens=12))
    memory.remove_records_by_indices([summary.last_seq])  # seq last_seq + 1
    assert await call(store.summaries("summed")) == [summary]
    # nothing to remove: nothing is written
    conversation = await call(store.get_conversation("summed"))
    assert memory.remove_records_by_indices([99]) == []
    memory.clean_tool_calls()
    assert await call(store.get_conversation("summed")) == conversation


async def test_scores_follow_camels_rule(store: Any) -> None:
    memory = MemstoreAgentMemory("scores", store, keep_rate=0.5)
    records = _records()
    records[1].extra_info["score"] = "4"
    memory.write_records(records)
    scores = [round(r.score, 6) for r in memory.retrieve()]
    assert scores == [1.0, 4 * 0.5 ** 4, 0.5 ** 3, 0.5 ** 2, 0.5]
    with pytest.raises(InvalidInputError):
        memory.write_records([MemoryRecord(
            message=BaseMessage("u", RoleType.USER, None, "x"),
            role_at_backend=OpenAIBackendRole.USER, extra_info={"score": "high"})])
    for bad in ("1e400", "nan", "-1"):  # float() takes them; a score must be finite, >= 0
        with pytest.raises((InvalidInputError, ValidationError), match="score"):
            memory.write_records([MemoryRecord(
                message=BaseMessage("u", RoleType.USER, None, "x"),
                role_at_backend=OpenAIBackendRole.USER, extra_info={"score": bad})])
    assert len(memory.retrieve()) == len(records)


async def test_create_context_selects_like_get_context(store: Any) -> None:
    view = TokenLimitedView(token_limit=40)
    memory = MemstoreAgentMemory("creator", store, view=view)
    question = MemoryRecord(message=BaseMessage("u", RoleType.USER, None,
                                                "a longer question " * 3),
                            role_at_backend=OpenAIBackendRole.USER)
    records = [*_records(), question]
    memory.write_records(records)
    creator = memory.get_context_creator()
    assert creator.token_limit == 40
    context = [ContextRecord(memory_record=r, score=1.0) for r in records]
    assert creator.create_context(context) == memory.get_context()
    assert creator.token_counter.count_tokens_from_messages(memory.get_context()[0]) == \
        memory.get_context()[1]


def test_bad_configuration() -> None:
    with MemoryStore("sqlite://", counter=COUNTER) as store:
        with pytest.raises(ConfigurationError):
            MemstoreAgentMemory("c", store, view=UnboundedView(), token_limit=10)
        with pytest.raises(ConfigurationError):
            MemstoreAgentMemory("c", object())  # type: ignore[arg-type]
        with pytest.raises(ValueError):
            MemstoreAgentMemory("", store)
        with pytest.raises(InvalidInputError, match="resume must be True or False"):
            MemstoreAgentMemory("c", store, resume="no")  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError):
        MemstoreAgentMemory("c", AsyncMemoryStore("sqlite://", counter=COUNTER))


# ---- round trips ---------------------------------------------------------------------------

_text = st.text(st.characters(blacklist_categories=["Cs"], blacklist_characters="\x00"),
                max_size=20)


@st.composite
def records(draw: st.DrawFn) -> MemoryRecord:
    kind = draw(st.sampled_from(["system", "developer", "user", "user_images", "assistant",
                                 "assistant_calls", "function", "legacy_call"]))
    extra = draw(st.dictionaries(st.sampled_from(["source", "topic"]), _text, max_size=2))
    common: dict[str, Any] = {
        "uuid": uuid.UUID(int=draw(st.integers(0, 2**128 - 1))),
        "timestamp": draw(st.floats(0, 2e9, allow_nan=False)),
        "agent_id": draw(st.sampled_from(["", "agent-1"])),
        "extra_info": extra,
    }
    role_name = draw(st.sampled_from(["assistant", "User", "critic"]))
    content = draw(_text)
    if kind in ("system", "developer", "user", "assistant"):
        role_type = RoleType.USER if kind == "user" else RoleType.ASSISTANT
        return MemoryRecord(message=BaseMessage(role_name, role_type, None, content),
                            role_at_backend=OpenAIBackendRole(kind), **common)
    if kind == "user_images":
        urls = draw(st.lists(st.sampled_from(["https://e.x/a.png", "https://e.x/b.jpg"]),
                             min_size=1, max_size=2))
        message = BaseMessage(role_name, RoleType.USER, None, content, image_list=urls,
                              image_detail=draw(st.sampled_from(["auto", "low", "high"])))
        return MemoryRecord(message=message, role_at_backend=OpenAIBackendRole.USER, **common)
    if kind == "assistant_calls":
        calls = [tool_call(f"call{i}", i, i) for i in range(draw(st.integers(1, 3)))]
        if draw(st.booleans()):
            calls[0]["extra_content"] = {"google": {"thought_signature": "sig"}}
        return MemoryRecord(message=BaseMessage(role_name, RoleType.ASSISTANT,
                                                {"tool_calls": calls}, content),
                            role_at_backend=OpenAIBackendRole.ASSISTANT, **common)
    if kind == "function":
        message = FunctionCallingMessage(
            role_name=role_name, role_type=RoleType.ASSISTANT, meta_dict=None, content="",
            func_name="add", result=draw(st.one_of(st.integers(), _text)),
            tool_call_id="call0", mask_output=draw(st.booleans()))
        return MemoryRecord(message=message, role_at_backend=OpenAIBackendRole.FUNCTION,
                            **common)
    message = FunctionCallingMessage(
        role_name=role_name, role_type=RoleType.ASSISTANT, meta_dict=None, content=content,
        func_name="add", args={"a": 1}, tool_call_id="call0")
    return MemoryRecord(message=message, role_at_backend=OpenAIBackendRole.ASSISTANT, **common)


@settings(max_examples=examples(60), derandomize=True, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(record=records())
def test_records_round_trip(record: MemoryRecord) -> None:
    message = record_to_message(record)
    assert message.id == str(record.uuid)
    stored = StoredMessage.model_validate({
        **message.model_dump(), "conversation_id": "c", "seq": 1,
        "created_at": datetime.now(timezone.utc), "token_count": 1, "token_counter": "x"})
    back = message_to_record(stored)
    assert back.to_dict() == MemoryRecord.from_dict(json.loads(json.dumps(
        record.to_dict(), default=str))).to_dict()
    if record.role_at_backend != OpenAIBackendRole.DEVELOPER:  # CAMEL cannot render those
        assert back.to_openai_message() == record.to_openai_message()


async def test_records_round_trip_through_the_store(store: Any) -> None:
    memory = MemstoreAgentMemory("round", store)
    written = _records()
    memory.write_records(written)
    assert [r.memory_record.to_dict() for r in memory.retrieve()] == [
        r.to_dict() for r in written]


# ---- the documented example runs -----------------------------------------------------------


def test_docs_example_runs(tmp_path: Path, monkeypatch: Any) -> None:
    monkeypatch.chdir(tmp_path)
    page = (ROOT / "docs" / "integrations" / "camel.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", page, flags=re.S)
    assert blocks
    model = ScriptedModel([{"tool_calls": [tool_call("c1", 2, 3)]}, {"content": "5"},
                           {"content": "You asked for 2 + 3."}])
    namespace: dict[str, Any] = {"__name__": "__docs__", "model": model}
    for block in blocks:
        exec(compile(block, "camel.md", "exec"), namespace)
    assert namespace["response"].msgs[0].content == "You asked for 2 + 3."
    assert model.seen[-1][1] == {"role": "user", "content": "What is 2 + 3?"}


async def test_overflow_ends_the_step_like_camels_own_memory(store: Any) -> None:
    model = ScriptedModel([{"content": "never sent"}])
    agent = agent_for(MemstoreAgentMemory("tiny", store, token_limit=12), model)
    response = await agent.astep("this question is far too long for a twelve token budget")
    assert response.terminated
    assert response.info["termination_reasons"] == ["max_tokens_exceeded"]
    assert model.seen == []


async def test_image_records_round_trip_through_the_store(store: Any) -> None:
    from io import BytesIO

    from PIL import Image

    buffer = BytesIO()
    Image.new("RGB", (2, 2), (255, 0, 0)).save(buffer, format="PNG")
    image = Image.open(BytesIO(buffer.getvalue()))
    record = MemoryRecord(
        message=BaseMessage("User", RoleType.USER, None, "what colour?",
                            image_list=[image, "https://e.x/a.png"], image_detail="low"),
        role_at_backend=OpenAIBackendRole.USER)
    memory = MemstoreAgentMemory("images", store)
    memory.write_records([record])
    back = memory.retrieve()[0].memory_record
    assert back.to_dict() == record.to_dict()
    assert back.to_openai_message() == record.to_openai_message()
    stored = (await call(store.messages("images")))[0]
    assert [p.type for p in stored.content] == ["text", "image_url", "image_url"]
    assert memory.get_context()[0] == [record.to_openai_message()]


async def test_assigning_the_memory_keeps_the_history(store: Any) -> None:
    first = agent_for(MemstoreAgentMemory("assigned", store),
                      ScriptedModel([{"content": "hello"}]))
    await first.astep("hi")
    before = [r.memory_record.uuid for r in first.memory.retrieve()]
    model = ScriptedModel([{"content": "still here"}])
    agent = ChatAgent("You add numbers.", model=model, summarize_threshold=None)
    agent.memory = MemstoreAgentMemory("assigned", store)
    await agent.astep("again")
    after = [r.memory_record for r in agent.memory.retrieve()]
    uuids = [r.uuid for r in after]
    assert uuids[0] == before[0] and uuids[2:4] == before[1:]
    assert after[1].role_at_backend == OpenAIBackendRole.SYSTEM  # CAMEL adds its own again
    assert len(after) == 6
    assert model.seen[0][-1] == {"role": "user", "content": "again"}
    assert_openai_history_valid(model.seen[0])


@pytest.mark.parametrize("system", [None, "You add numbers."])
async def test_only_the_adopting_clear_is_skipped(store: Any, system: str | None) -> None:
    def agent(replies: list[dict[str, Any]]) -> ChatAgent:
        memory = MemstoreAgentMemory("adopted", store, token_limit=4000)
        return ChatAgent(system, model=ScriptedModel(replies), memory=memory, tools=[add],
                         summarize_threshold=None)

    async def roles() -> list[str]:
        return [m.role for m in await call(store.messages("adopted"))]

    await agent([{"content": "hello"}]).astep("hi")
    history = await roles()
    assert history == ["system", "user", "assistant"][0 if system else 1:]
    # a new agent adopts the stored conversation: its constructor's clear() is skipped
    second = agent([{"content": "again"}, {"content": "and again"}])
    assert await roles() == history
    # every later clear deletes the messages (the agent writes its system message again)
    empty = ["system"] if system else []
    second.reset()
    assert await roles() == empty
    await second.astep("one")
    assert await roles() == [*empty, "user", "assistant"]
    second.reset()
    assert await roles() == empty
    await second.astep("two")
    second.clear_memory()
    assert await roles() == empty
    second.memory.clear()
    assert await roles() == []


async def test_changing_what_camel_got_does_not_change_the_memory(store: Any) -> None:
    memory = MemstoreAgentMemory("mutations", store, token_limit=4000)
    agent = agent_for(memory, ScriptedModel([{"tool_calls": [tool_call("c1", 1, 2)]},
                                             {"content": "3"}]))
    await agent.astep("add 1+2")
    memory.write_records([MemoryRecord(
        message=BaseMessage("user", RoleType.USER, {"tags": ["a"]}, "tagged"),
        role_at_backend=OpenAIBackendRole.USER, extra_info={"note": "n"})])
    # a message written by other code (no CAMEL record in its metadata)
    await call(store.append("mutations", Message.user([{"type": "text", "text": "foreign"}])))
    expected_context = memory.get_context()
    expected_records = [r.memory_record.to_dict() for r in memory.retrieve()]
    for _ in range(2):  # the second read may come from the store's cache
        messages, _tokens = memory.get_context()
        assert messages == expected_context[0]
        for message in messages:
            for value in message.values():
                if isinstance(value, list) and value and isinstance(value[0], dict):
                    value[0].clear()
                    value.append({"changed": True})
        for context_record in memory.retrieve():
            record = context_record.memory_record
            record.extra_info["note"] = "changed"
            if record.message.meta_dict:
                record.message.meta_dict.setdefault("tags", []).append("b")
                for calls in record.message.meta_dict.get("tool_calls") or ():
                    calls["function"]["name"] = "changed"
    assert memory.get_context() == expected_context
    assert [r.memory_record.to_dict() for r in memory.retrieve()] == expected_records


async def test_a_damaged_stash_does_not_break_the_memory(store: Any) -> None:
    """A ``metadata["camel"]`` that is not a record CAMEL wrote (another writer's, or
    damaged) made ``retrieve`` and ``get_context`` raise KeyError or TypeError for
    every later read; such a message reads as the equivalent record now."""
    for bad in ({"message": 5}, {}, {"message": {"role_name": 1}},
                {"message": {}, "role_at_backend": "nope"}):
        await call(store.append("d", Message.user("c", metadata={"camel": bad})))
    memory = MemstoreAgentMemory("d", store)
    assert [r.memory_record.message.content for r in memory.retrieve()] == ["c"] * 4
    messages, _ = memory.get_context()
    assert [m["content"] for m in messages] == ["c"] * 4


V1 = "You add numbers. Version one."
V2 = "You add numbers and say please. Version two."


def system_texts(messages: list[dict[str, Any]]) -> list[Any]:
    return [m["content"] for m in messages if m["role"] == "system"]


async def test_a_changed_system_prompt_is_stored_once_and_sent_alone(
        store: Any, db_url: str) -> None:
    """Resuming compared the agent's system message with the conversation's first message
    only: after the prompt changed from v1 to v2, every restart appended another v2, and
    the model was sent v1 and every copy of v2 (system messages are never trimmed)."""
    for turn, prompt in enumerate([V1, V1, V2, V2, V2]):
        own = reopen(store, db_url)  # a new process each time
        try:
            model = ScriptedModel([{"content": f"reply {turn}"}])
            memory = MemstoreAgentMemory("prompted", own, token_limit=4000)
            agent = ChatAgent(prompt, model=model, memory=memory, summarize_threshold=None)
            context, tokens = memory.get_context()
            assert system_texts(context) == [prompt], turn  # before the step
            await agent.astep(f"question {turn}")
            seen = model.seen[0]
            assert system_texts(seen) == [prompt], turn  # the model gets the current prompt
            assert seen[0] == {"role": "system", "content": prompt}
            assert [m["content"] for m in seen[1:]] == [
                text for n in range(turn) for text in (f"question {n}", f"reply {n}")
            ] + [f"question {turn}"]
            context, tokens = memory.get_context()
            assert system_texts(context) == [prompt]
            assert tokens == COUNTER.count_messages([Message.from_openai(dict(m))
                                                     for m in context])
            assert memory.get_context_creator().create_context(memory.retrieve()) == (
                context, tokens)
        finally:
            await call(own.close())
    stored = await call(store.messages("prompted"))
    # v2 once, where the prompt changed; v1 stays stored, as history
    assert [m.role for m in stored] == ["system", "user", "assistant", "user", "assistant",
                                       "system", *["user", "assistant"] * 3]
    assert [m.text for m in stored if m.role == "system"] == [V1, V2]
    # back to v1: the change is recognised against v2, the newest prompt
    own = reopen(store, db_url)
    try:
        memory = MemstoreAgentMemory("prompted", own, token_limit=4000)
        ChatAgent(V1, model=ScriptedModel([]), memory=memory, summarize_threshold=None)
        assert system_texts(memory.get_context()[0]) == [V1]
        ChatAgent(V1, model=ScriptedModel([]), memory=MemstoreAgentMemory(
            "prompted", own, token_limit=4000), summarize_threshold=None)
        assert [m.text for m in await call(own.messages("prompted")) if m.role == "system"
                ] == [V1, V2, V1]
    finally:
        await call(own.close())


@pytest.mark.parametrize("make_view", [
    lambda limit: TokenLimitedView(token_limit=limit),
    lambda limit: ScoreBasedView(token_limit=limit, keep_rate=0.9),
])
async def test_a_superseded_prompt_takes_no_room_in_the_window(
        store: Any, make_view: Any) -> None:
    """The old prompt is not sent, and the budget it would take goes to the history: the
    window is what the view selects from the history without it."""
    long_v1 = V1 + " Rules follow." + " rule" * 40
    first = MemstoreAgentMemory("room", store, token_limit=4000)
    ChatAgent(long_v1, model=ScriptedModel([]), memory=first, summarize_threshold=None)
    for n in range(6):
        first.write_records([user_record(f"question number {n} " + "word " * 5)])
    ChatAgent(V2, model=ScriptedModel([]), memory=MemstoreAgentMemory(
        "room", store, token_limit=4000), summarize_threshold=None)
    for n in range(6, 9):
        first.write_records([user_record(f"question number {n} " + "word " * 5)])
    for limit in range(20, 200, 7):
        view = make_view(limit)
        memory = MemstoreAgentMemory("room", store, view=view)
        creator = memory.get_context_creator()
        try:
            expected = creator.create_context(memory.retrieve())
        except ContextOverflowError as exc:  # the current prompt and newest message do not fit
            with pytest.raises(ContextOverflowError) as raised:
                memory.get_context()
            assert (raised.value.required, raised.value.budget) == (exc.required, exc.budget)
            continue
        context, tokens = memory.get_context()
        assert (context, tokens) == expected, limit
        assert system_texts(context) == [V2]
        assert tokens <= limit
