"""LangGraph: MemstoreGraphMemory in a tool-using graph (a model node, and create_react_agent's
hooks) with a fake chat model: a run with a tool, a restart, and a run that continues."""

from __future__ import annotations

import gc
import re
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("langgraph", reason="langgraph is not installed "
                    "(pip install 'memstore[langgraph]')")

from langchain_core.language_models.fake_chat_models import (
    FakeMessagesListChatModel,
)
from langchain_core.messages import (
    AIMessage,
    BaseMessage,
    HumanMessage,
    RemoveMessage,
    SystemMessage,
    ToolMessage,
)
from langchain_core.messages.utils import convert_to_openai_messages
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, create_react_agent, tools_condition

from memstore import (
    AsyncMemoryStore,
    ConfigurationError,
    ContextBudgetError,
    InvalidInputError,
    MemoryStore,
    TokenLimitedView,
)
from memstore.integrations.langchain import to_memstore
from memstore.integrations.langgraph import MemstoreGraphMemory, thread_id
from tests.helpers import call
from tests.integrations import (
    assert_constructor_refuses_what_the_store_would,
    assert_openai_history_valid,
    close_store,
    open_store,
)

ROOT = Path(__file__).resolve().parent.parent.parent


@tool
def get_weather(city: str) -> str:
    """The weather in a city."""
    return f"sunny in {city}"


def calls(*cities: str, turn: int) -> AIMessage:
    return AIMessage("", tool_calls=[
        {"name": "get_weather", "args": {"city": c}, "id": f"t{turn}-{i}"}
        for i, c in enumerate(cities)])


class Model(FakeMessagesListChatModel):
    """Scripted replies; records what it was sent; binds tools as a real model would."""

    seen: list[list[BaseMessage]]

    def bind_tools(self, tools: Any, **kwargs: Any) -> Any:
        return self

    def _generate(self, messages: list[BaseMessage], *args: Any, **kwargs: Any) -> Any:
        # (ainvoke runs this too, in a worker thread)
        self.seen.append(list(messages))
        return super()._generate(messages, *args, **kwargs)


def model(*responses: BaseMessage) -> Model:
    return Model(responses=list(responses), seen=[])


def graph(memory: MemstoreGraphMemory, llm: Model, kind: str, checkpointer: Any = None) -> Any:
    """LangGraph's tool loop with a model node that reads and writes through ``memory``."""

    def call_model(state: MessagesState, config: RunnableConfig) -> dict[str, Any]:
        reply = llm.invoke([SystemMessage("Be brief."), *memory.load(state, config)])
        memory.save([reply], config)
        return {"messages": [reply]}

    async def acall_model(state: MessagesState, config: RunnableConfig) -> dict[str, Any]:
        history = await memory.aload(state, config)
        reply = await llm.ainvoke([SystemMessage("Be brief."), *history])
        await memory.asave([reply], config)
        return {"messages": [reply]}

    builder = StateGraph(MessagesState)
    builder.add_node("model", call_model if kind == "sync" else acall_model)
    builder.add_node("tools", ToolNode([get_weather]))
    builder.add_edge(START, "model")
    builder.add_conditional_edges("model", tools_condition)
    builder.add_edge("tools", "model")
    return builder.compile(checkpointer=checkpointer)


async def ask(app: Any, text: str, kind: str, thread: str = "user-7") -> dict[str, Any]:
    config: Any = {"configurable": {"thread_id": thread}}
    if kind == "sync":
        return app.invoke({"messages": [HumanMessage(text)]}, config)  # type: ignore[no-any-return]
    return await app.ainvoke({"messages": [HumanMessage(text)]}, config)  # type: ignore[no-any-return]


@pytest.fixture(params=["sync", "async"])
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def assert_sent_valid(llm: Model) -> None:
    for sent in llm.seen:
        assert_openai_history_valid(convert_to_openai_messages(sent))  # type: ignore[arg-type]


async def test_a_tool_using_graph_remembers_across_restarts(db_url: str, kind: str) -> None:
    store = await open_store(kind, db_url)
    memory = MemstoreGraphMemory(thread_id, store, view=TokenLimitedView(token_limit=4000))  # type: ignore[arg-type]
    llm = model(calls("Paris", "Rome", turn=1), AIMessage("Both are sunny."))
    result = await ask(graph(memory, llm, kind), "Weather in Paris and Rome?", kind)
    assert result["messages"][-1].content == "Both are sunny."
    # the second call was sent the tool call with both results
    assert [type(m).__name__ for m in llm.seen[1]] == [
        "SystemMessage", "HumanMessage", "AIMessage", "ToolMessage", "ToolMessage"]
    assert_sent_valid(llm)
    first_run = result["messages"]
    await close_store(store)
    del memory, store
    gc.collect()

    store = await open_store(kind, db_url)
    memory = MemstoreGraphMemory(thread_id, store, view=TokenLimitedView(token_limit=4000))  # type: ignore[arg-type]
    llm = model(AIMessage("You asked about Paris and Rome."))
    result = await ask(graph(memory, llm, kind), "Which cities did I ask about?", kind)
    assert result["messages"][-1].content == "You asked about Paris and Rome."
    sent = llm.seen[0]
    assert [type(m).__name__ for m in sent] == [
        "SystemMessage", "HumanMessage", "AIMessage", "ToolMessage", "ToolMessage", "AIMessage",
        "HumanMessage"]
    # the first run's messages come back equal, ids and all
    assert sent[1:6] == first_run
    assert_sent_valid(llm)
    stored = await call(store.messages("user-7"))  # type: ignore[attr-defined]
    assert [m.role for m in stored] == ["user", "assistant", "tool", "tool", "assistant", "user",
                                        "assistant"]
    assert [m.tool_call_id for m in stored[2:4]] == ["t1-0", "t1-1"]
    assert await memory.ahistory({"configurable": {"thread_id": "user-7"}}) == \
        [*first_run, *result["messages"]]
    await close_store(store)


@pytest.mark.filterwarnings("ignore::langgraph.warnings.LangGraphDeprecatedSinceV10")
async def test_create_react_agent_with_the_hooks(db_url: str, kind: str) -> None:
    store = await open_store(kind, db_url)
    memory = MemstoreGraphMemory("react", store)  # type: ignore[arg-type]
    llm = model(calls("Oslo", turn=1), AIMessage("It is sunny in Oslo."))
    agent = create_react_agent(llm, [get_weather], prompt="Be brief.",
                               pre_model_hook=memory.pre_model_hook,
                               post_model_hook=memory.post_model_hook)
    result = await ask(agent, "Weather in Oslo?", kind)
    assert result["messages"][-1].content == "It is sunny in Oslo."
    assert [type(m).__name__ for m in llm.seen[1]] == [
        "SystemMessage", "HumanMessage", "AIMessage", "ToolMessage"]
    await close_store(store)

    store = await open_store(kind, db_url)
    memory = MemstoreGraphMemory("react", store)  # type: ignore[arg-type]
    llm = model(AIMessage("You asked about Oslo."))
    agent = create_react_agent(llm, [get_weather], prompt="Be brief.",
                               pre_model_hook=memory.pre_model_hook,
                               post_model_hook=memory.post_model_hook)
    result = await ask(agent, "What did I ask?", kind)
    assert [type(m).__name__ for m in llm.seen[0]] == [
        "SystemMessage", "HumanMessage", "AIMessage", "ToolMessage", "AIMessage", "HumanMessage"]
    assert len(result["messages"]) == 2, "the graph state holds the run's messages only"
    assert [m.role for m in await call(store.messages("react"))] == [  # type: ignore[attr-defined]
        "user", "assistant", "tool", "assistant", "user", "assistant"]
    await close_store(store)


async def test_a_checkpointer_beside_memstore_stores_nothing_twice(store: Any) -> None:
    kind = "sync" if isinstance(store, MemoryStore) else "async"
    memory = MemstoreGraphMemory(thread_id, store)
    llm = model(calls("Paris", turn=1), AIMessage("Sunny."), AIMessage("Paris."),
                AIMessage("Still Paris."))
    app = graph(memory, llm, kind, checkpointer=InMemorySaver())
    for question in ("Weather?", "Which city?", "Again?"):
        await ask(app, question, kind, thread="cp")
    stored = await call(store.messages("cp"))
    assert [m.role for m in stored] == ["user", "assistant", "tool", "assistant", "user",
                                        "assistant", "user", "assistant"]
    # the state holds everything too; the model was sent memstore's history
    assert len(llm.seen[-1]) == 1 + 7


async def test_save_is_idempotent(store: Any) -> None:
    memory = MemstoreGraphMemory("idem", store)
    state = {"messages": [HumanMessage("hi", id="h1"), calls("Oslo", turn=1).model_copy(
        update={"id": "a1"})]}
    assert len(await memory.asave(state)) == 2
    assert await memory.asave(state) == []
    result = ToolMessage("rain", tool_call_id="t1-0", id="r1")
    state["messages"].append(result)
    assert await memory.asave(state) == [result]
    assert await memory.asave(state) == [] and await memory.asave([result]) == []
    # same id, other content: not the stored message
    changed = ToolMessage("snow", tool_call_id="t1-0", id="r1")
    assert await memory.asave([changed]) == [changed]
    # no id: always new
    assert len(await memory.asave([HumanMessage("x"), HumanMessage("x")])) == 2
    assert len(await call(store.messages("idem"))) == 6
    # a long state whose newest message is stored: only what follows is new
    many = [HumanMessage(f"m{i}", id=f"m{i}") for i in range(40)]
    await memory.asave(many)
    extra = HumanMessage("new", id="new")
    assert await memory.asave([*many, extra]) == [extra]
    assert len(await call(store.messages("idem"))) == 6 + 40 + 1


async def test_the_turn_in_progress_and_the_budget(store: Any) -> None:
    view = TokenLimitedView(token_limit=80, reserve=10)
    memory = MemstoreGraphMemory("budget", store, view=view)
    for i in range(10):
        await memory.asave([HumanMessage(f"question {i} about the weather", id=f"q{i}"),
                            AIMessage(f"answer {i}: sunny", id=f"a{i}")])
    pending = calls("Oslo", "Bergen", turn=1)
    await memory.asave([HumanMessage("Weather in Oslo and Bergen?"), pending])
    history = await memory.ahistory()
    assert history[-2:] == [HumanMessage("Weather in Oslo and Bergen?"), pending]
    assert len(history) < 22, "the budget cut the window"
    counter = view.resolve_counter(store.counter)
    assert counter.count_messages([to_memstore(m) for m in history]) + view.reserve <= 80
    # a tool result arrives: load stores it and the unit is whole
    state = {"messages": [HumanMessage("Weather in Oslo and Bergen?", id="w"), pending,
                          ToolMessage("rain", tool_call_id="t1-0", id="r0"),
                          ToolMessage("snow", tool_call_id="t1-1", id="r1")]}
    loaded = await memory.aload(state)
    assert_openai_history_valid(convert_to_openai_messages(loaded))  # type: ignore[arg-type]
    assert loaded[-2:] == state["messages"][-2:]
    with pytest.raises(ContextBudgetError):
        await MemstoreGraphMemory("budget", store, view=TokenLimitedView(token_limit=12)
                                  ).ahistory()


async def test_conversation_ids(store: Any) -> None:
    memory = MemstoreGraphMemory(thread_id, store)
    with pytest.raises(InvalidInputError, match="thread_id"):
        await memory.ahistory({})
    with pytest.raises(InvalidInputError, match="thread_id"):
        memory.conversation_id({"configurable": {}})
    assert memory.conversation_id({"configurable": {"thread_id": 42}}) == "42"
    with pytest.raises(InvalidInputError, match="conversation_id"):
        memory.conversation_id({"configurable": {"thread_id": ""}})
    by_user = MemstoreGraphMemory(lambda config: f"user-{config['configurable']['user']}", store)
    await by_user.asave([HumanMessage("hi")], {"configurable": {"user": "ada"}})
    assert [m.content for m in await call(store.messages("user-ada"))] == ["hi"]
    fixed = MemstoreGraphMemory("fixed", store)
    assert fixed.conversation_id({"configurable": {"thread_id": "ignored"}}) == "fixed"
    assert fixed.store is store and fixed.view is not None
    assert_constructor_refuses_what_the_store_would(MemstoreGraphMemory, store,
                                                    "conversation_id")


async def test_bad_input(store: Any) -> None:
    memory = MemstoreGraphMemory("bad", store)
    for bad in ("text", {"messages": ["not a message"]}, 42, {"no": []}):
        with pytest.raises(InvalidInputError, match="messages"):
            await memory.asave(bad)
    with pytest.raises(InvalidInputError):
        await memory.asave([HumanMessage("kept?", id="k"), RemoveMessage(id="k")])
    assert await call(store.messages("bad")) == [], "nothing of a refused save is written"
    await memory.aclear()
    await memory.asave(HumanMessage("one"))
    await memory.aclear()
    assert await memory.ahistory() == []


async def test_sync_methods_and_an_async_store(tmp_path: Path) -> None:
    store = AsyncMemoryStore(f"sqlite:///{tmp_path / 'a.db'}")
    await store.setup()
    memory = MemstoreGraphMemory("s", store)
    for method, args in [("load", ({"messages": []},)), ("save", ([],)), ("history", ()),
                         ("clear", ())]:
        with pytest.raises(ConfigurationError, match=f"a{method}"):
            getattr(memory, method)(*args)
    await store.close()
    sync_store = MemoryStore(f"sqlite:///{tmp_path / 's.db'}")
    memory = MemstoreGraphMemory("s", sync_store)
    assert memory.load({"messages": [HumanMessage("hi", id="1")]}) == [HumanMessage("hi", id="1")]
    assert memory.save([AIMessage("yo", id="2")]) == [AIMessage("yo", id="2")]
    assert len(memory.history()) == 2
    memory.clear()
    assert memory.history() == []
    sync_store.close()


def test_the_docs_examples_run(tmp_path: Path, monkeypatch: Any,
                               capsys: pytest.CaptureFixture[str]) -> None:
    from tests.integrations.test_docs import _expected_output

    page = (ROOT / "docs" / "integrations" / "langgraph.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", page, flags=re.S)
    assert len(blocks) == 2
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MEMSTORE_URL", f"sqlite:///{tmp_path / 'docs.db'}")
    for index, code in enumerate(blocks):
        exec(compile(code, f"langgraph.md block {index}", "exec"), {"__name__": "__docs__"})
        printed = [" ".join(line.split()) for line in capsys.readouterr().out.splitlines()]
        assert printed == _expected_output(code), f"block {index}"
