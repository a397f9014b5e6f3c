"""autogen: MemstoreChatCompletionContext driven by a real AssistantAgent, no network."""

from __future__ import annotations

import gc
import itertools
import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy.engine import make_url

from memstore import (
    ContextBudgetError,
    InvalidInputError,
    Message,
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

require("autogen_core")
require("autogen_agentchat")
require("autogen_ext.models.replay")

from autogen_agentchat.agents import AssistantAgent  # noqa: E402
from autogen_core import FunctionCall, Image  # noqa: E402
from autogen_core.model_context import ChatCompletionContext  # noqa: E402
from autogen_core.models import (  # noqa: E402
    AssistantMessage,
    CreateResult,
    FunctionExecutionResult,
    FunctionExecutionResultMessage,
    RequestUsage,
    SystemMessage,
    UserMessage,
)
from autogen_ext.models.openai._openai_client import to_oai_type  # noqa: E402
from autogen_ext.models.replay import ReplayChatCompletionClient  # noqa: E402

from memstore.integrations.autogen import (  # noqa: E402
    MemstoreChatCompletionContext,
    from_memstore,
    to_memstore,
)

MODEL_INFO: Any = {"function_calling": True, "vision": True, "json_output": False,
                   "family": "unknown", "structured_output": False}
USAGE = RequestUsage(prompt_tokens=0, completion_tokens=0)
PNG = ("iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR4nGP4z8DwHwAFAAH/iZk9HQAAAABJRU5"
       "ErkJggg==")


async def get_weather(city: str) -> str:
    """The weather in a city."""
    return f"sunny in {city}"


def calls_result(*cities: str, turn: int) -> CreateResult:
    return CreateResult(
        finish_reason="function_calls", usage=USAGE, cached=False, thought="Checking.",
        content=[FunctionCall(id=f"t{turn}-{i}", name="get_weather",
                              arguments=json.dumps({"city": c}))
                 for i, c in enumerate(cities)])


def agent(context: MemstoreChatCompletionContext, responses: list[Any]) -> AssistantAgent:
    client = ReplayChatCompletionClient(responses, model_info=MODEL_INFO)
    return AssistantAgent("weather", model_client=client, tools=[get_weather],
                          model_context=context, reflect_on_tool_use=True,
                          system_message="You report the weather.")


def sent(assistant: AssistantAgent) -> list[list[dict[str, Any]]]:
    """What the model was sent on each call, through autogen's own OpenAI conversion."""
    client: Any = assistant._model_client
    out = []
    for record in client.create_calls:
        converted = [dict(m) for msg in record["messages"] for m in to_oai_type(msg)]
        out.append(converted)
    return out


def dumps(messages: list[Any]) -> list[Any]:
    return [m.model_dump() for m in messages]


@pytest.fixture(params=["sync", "async"])
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


async def test_agent_remembers_across_restarts(db_url: str, kind: str) -> None:
    store = await open_store(kind, db_url)
    first = agent(MemstoreChatCompletionContext("trip", store),  # type: ignore[arg-type]
                  [calls_result("Paris", "Rome", turn=1), "Paris and Rome are sunny."])
    result = await first.run(task="Weather in Paris and Rome?")
    assert result.messages[-1].content == "Paris and Rome are sunny."
    for history in sent(first):
        assert_openai_history_valid(history)
    await close_store(store)
    del first, store, result
    gc.collect()

    store = await open_store(kind, db_url)
    context = MemstoreChatCompletionContext("trip", store)  # type: ignore[arg-type]
    second = agent(context, [calls_result("Oslo", turn=2), "Oslo is sunny too.",
                             "You asked about Paris, Rome and Oslo."])
    await second.run(task="And Oslo?")
    await second.run(task="Which cities did I ask about?")
    histories = sent(second)
    for history in histories:
        assert_openai_history_valid(history)
    last = histories[-1]
    texts = [m.get("content") for m in last]
    assert "Weather in Paris and Rome?" in texts and "And Oslo?" in texts
    assert sum(1 for m in last if m["role"] == "tool") == 3  # Paris, Rome, Oslo results
    stored = await call(store.messages("trip"))
    assert [m.role for m in stored[:5]] == ["user", "assistant", "tool", "tool", "assistant"]
    assert stored[1].content == "Checking." and stored[1].tool_call_ids == ("t1-0", "t1-1")
    await close_store(store)


async def test_budgeted_view_gives_a_valid_cut_window(db_url: str, kind: str) -> None:
    store = await open_store(kind, db_url)
    view = TokenLimitedView(token_limit=120)
    context = MemstoreChatCompletionContext("long", store, view=view)  # type: ignore[arg-type]
    responses: list[Any] = []
    for turn in range(6):
        responses += [calls_result("Paris", "Rome", turn=turn), f"Answer {turn}."]
    assistant = agent(context, responses)
    for turn in range(6):
        await assistant.run(task=f"Question {turn}: the weather in Paris and Rome, please?")
    histories = sent(assistant)
    for history in histories:
        assert_openai_history_valid(history)
    window = await call(store.window("long", view))
    assert window.report.omitted, "the budget cut the history"
    final = await context.get_messages()
    assert len(final) < len(await call(store.messages("long")))
    assert_openai_history_valid([m for msg in final for m in map(dict, to_oai_type(msg))])
    await close_store(store)


async def test_turn_in_progress_is_given_back(store: Any) -> None:
    context = MemstoreChatCompletionContext("p", store, view=TokenLimitedView(token_limit=200))
    await context.add_message(UserMessage(content="Weather?", source="user"))
    pending = AssistantMessage(content=[FunctionCall(id="a", name="w", arguments="{}"),
                                        FunctionCall(id="b", name="w", arguments="{}")],
                               source="agent")
    await context.add_message(pending)
    got = await context.get_messages()
    assert dumps(got) == dumps([UserMessage(content="Weather?", source="user"), pending])
    # The window alone leaves the pending call out, as it must for a request on its own.
    assert [m.role for m in (await call(store.window("p", UnboundedView()))).messages] == ["user"]
    results = FunctionExecutionResultMessage(content=[
        FunctionExecutionResult(content="rain", name="w", call_id="a", is_error=False),
        FunctionExecutionResult(content="boom", name="w", call_id="b", is_error=True)])
    await context.add_message(results)
    assert dumps(await context.get_messages())[-1] == results.model_dump()
    # is_error is a rendering hint: the Anthropic rendering of the window carries it
    body = (await call(store.window("p", UnboundedView()))).to_anthropic()
    assert body["messages"][-1]["content"] == [
        {"type": "tool_result", "tool_use_id": "a", "content": "rain"},
        {"type": "tool_result", "tool_use_id": "b", "content": "boom", "is_error": True}]
    await context.add_message(UserMessage(content="Thanks", source="user"))
    # an unanswered call that is no longer the newest unit is never given back
    await context.add_message(AssistantMessage(
        content=[FunctionCall(id="z", name="w", arguments="{}")], source="agent"))
    await context.add_message(UserMessage(content="Never mind", source="user"))
    history = await context.get_messages()
    assert_openai_history_valid([m for msg in history for m in map(dict, to_oai_type(msg))])
    assert "z" not in json.dumps(dumps(history))


def words(n: int, word: str = "rain") -> str:
    return " ".join([word] * n)


def two_calls() -> AssistantMessage:
    return AssistantMessage(content=[FunctionCall(id="a", name="w", arguments="{}"),
                                     FunctionCall(id="b", name="w", arguments="{}")],
                            source="agent")


def result(call_id: str, text: str) -> FunctionExecutionResultMessage:
    return FunctionExecutionResultMessage(content=[
        FunctionExecutionResult(content=text, name="w", call_id=call_id, is_error=False)])


def stored_form(messages: list[Any]) -> list[Message]:
    return [m for message in messages for m in to_memstore(message)]


@pytest.mark.parametrize("view", BUDGETED_VIEWS, ids=lambda v: type(v).__name__)
async def test_a_budgeted_view_leaves_room_for_the_turn_in_progress(store: Any,
                                                                   view: Any) -> None:
    context = MemstoreChatCompletionContext("b", store, view=view)
    await context.add_message(SystemMessage(content="Be brief."))
    for i in range(10):
        await context.add_message(UserMessage(content=f"question {i} about the weather",
                                              source="user"))
        await context.add_message(AssistantMessage(content=f"answer {i}: sunny all day",
                                                   source="agent"))
    question = UserMessage(content="Weather in Oslo and Bergen?", source="user")
    half = result("a", words(12))
    for message in (question, two_calls(), half):
        await context.add_message(message)
    counter = view.resolve_counter(store.counter)
    got = await context.get_messages()
    assert dumps(got[-3:]) == dumps([question, two_calls(), half])
    assert isinstance(got[0], SystemMessage) and len(got) < 24, "the budget cut the window"
    # what the agent sends — the window and the turn in progress — fits with the reserve
    used = counter.count_messages(stored_form(got)) + view.reserve
    assert used <= view.token_limit, (used, view.token_limit)
    # once the call is answered it is an ordinary unit of the window
    await context.add_message(result("b", "snow"))
    got = await context.get_messages()
    assert_openai_history_valid([m for msg in got for m in map(dict, to_oai_type(msg))])
    assert counter.count_messages(stored_form(got)) + view.reserve <= view.token_limit


@pytest.mark.parametrize("view", BUDGETED_VIEWS, ids=lambda v: type(v).__name__)
async def test_a_turn_in_progress_too_big_for_the_budget_is_an_error(store: Any,
                                                                    view: Any) -> None:
    context = MemstoreChatCompletionContext("big", store, view=view)
    for message in (UserMessage(content="Weather?", source="user"), two_calls(),
                    result("a", words(120))):
        await context.add_message(message)
    with pytest.raises(ContextBudgetError, match="turn in progress") as caught:
        await context.get_messages()
    assert caught.value.budget == 100 and caught.value.required > 100
    # fits alone but not beside the anchored messages and the newest unit
    await context.clear()
    for message in (SystemMessage(content=words(40, "rule")),
                    UserMessage(content="Weather?", source="user"), two_calls(),
                    result("a", words(40))):
        await context.add_message(message)
    with pytest.raises(ContextBudgetError, match="turn in progress") as caught:
        await context.get_messages()
    assert caught.value.budget == 100 and caught.value.required > 100
    # without a budget the turn in progress is given back whatever its size
    assert len(await MemstoreChatCompletionContext("big", store).get_messages()) == 4


async def test_contract_edges(store: Any) -> None:
    context = MemstoreChatCompletionContext("never", store)
    assert await context.get_messages() == []
    await context.clear()
    state = await context.save_state()
    assert state["memstore_state"]["messages"] == []
    await context.add_message(FunctionExecutionResultMessage(content=[]))
    assert await context.get_messages() == []
    with pytest.raises(InvalidInputError, match="memstore_state"):
        await context.load_state({"messages": []})
    with pytest.raises(InvalidInputError, match="LLMMessage"):
        await context.add_message("hello")  # type: ignore[arg-type]
    assert isinstance(context, ChatCompletionContext)


async def test_state_moves_between_databases(db_url: str, tmp_path: Any, kind: str) -> None:
    store = await open_store(kind, db_url)
    context = MemstoreChatCompletionContext("s", store)  # type: ignore[arg-type]
    for m in conversation():
        await context.add_message(m)
    state = json.loads(json.dumps(await context.save_state()))
    other = await open_store(kind, f"sqlite:///{tmp_path / 'other.db'}")
    target = MemstoreChatCompletionContext("copy", other)  # type: ignore[arg-type]
    await target.add_message(UserMessage(content="to be replaced", source="user"))
    await target.load_state(state)
    assert dumps(await target.get_messages()) == dumps(sendable(conversation()))
    await target.clear()
    assert await target.get_messages() == []
    await close_store(store)
    await close_store(other)


async def test_a_component_that_could_not_be_loaded_back_is_refused_at_dump(
    db_url: str, kind: str,
) -> None:
    from memstore import BaseTokenCounter, ConfigurationError, MemoryStore

    class Words(BaseTokenCounter):
        name = "custom/words"

        def count_message(self, message: Any) -> int:
            return len((message.text or "").split()) + 3

    for store in (await open_store(kind, db_url, counter=Words()), MemoryStore("sqlite://")):
        context = MemstoreChatCompletionContext("c", store)  # type: ignore[arg-type]
        await context.add_message(UserMessage(content="hi", source="user"))
        with pytest.raises(ConfigurationError, match="dump_component"):
            context.dump_component()
        await close_store(store)


async def test_component_round_trip(db_url: str, kind: str) -> None:
    store = await open_store(kind, db_url)
    view = TokenLimitedView(token_limit=500, reserve=10)
    context = MemstoreChatCompletionContext("c", store, view=view)  # type: ignore[arg-type]
    for m in conversation():
        await context.add_message(m)
    model = context.dump_component()
    assert model.provider == "memstore.integrations.autogen.MemstoreChatCompletionContext"
    assert model.config["conversation_id"] == "c"
    loaded = ChatCompletionContext.load_component(json.loads(model.model_dump_json()))
    assert isinstance(loaded, MemstoreChatCompletionContext)
    assert loaded.view == view
    assert type(loaded.store) is type(store)
    assert dumps(await loaded.get_messages()) == dumps(await context.get_messages())
    # AssistantAgent.dump_component() embeds the context's component
    assistant = AssistantAgent("plain", model_context=context, model_client=
                               ReplayChatCompletionClient(["ok"], model_info=MODEL_INFO))
    agent_model = assistant.dump_component()
    again = AssistantAgent.load_component(agent_model)
    assert isinstance(again._model_context, MemstoreChatCompletionContext)
    await again._model_context.close()
    await loaded.close()
    await context.close()  # not opened by the context: the store stays usable
    assert await call(store.messages("c"))
    await close_store(store)


@pytest.mark.postgres
async def test_a_dumped_component_holds_no_password(pg_url: str, kind: str,
                                                    monkeypatch: Any) -> None:
    """Configs are written to files and logs: the URL is dumped without its password,
    which libpq takes from PGPASSWORD (or ~/.pgpass) when the component is loaded."""
    secret = "s3cret:p@ss/word"
    with_password = make_url(pg_url).set(password=secret).render_as_string(
        hide_password=False)
    in_query = make_url(pg_url).update_query_dict({"password": secret}).render_as_string(
        hide_password=False)
    for url in (with_password, in_query):
        store = await open_store(kind, url)
        context = MemstoreChatCompletionContext(
            "pw", store, view=TokenLimitedView(token_limit=500))  # type: ignore[arg-type]
        await context.clear()
        await context.add_message(UserMessage(content="hi", source="user"))
        model = context.dump_component()
        assistant = AssistantAgent("plain", model_context=context, model_client=
                                   ReplayChatCompletionClient(["ok"], model_info=MODEL_INFO))
        for text in (model.model_dump_json(), assistant.dump_component().model_dump_json()):
            assert "s3cret" not in text and "***" not in text
        dumped = make_url(model.config["url"])
        assert dumped.password is None and "password" not in dumped.query
        assert dumped.set(password=None) == make_url(pg_url).set(
            drivername=dumped.drivername, password=None)
        monkeypatch.setenv("PGPASSWORD", secret)
        loaded = ChatCompletionContext.load_component(json.loads(model.model_dump_json()))
        assert isinstance(loaded, MemstoreChatCompletionContext)
        assert dumps(await loaded.get_messages()) == dumps(
            [UserMessage(content="hi", source="user")])
        await loaded.add_message(AssistantMessage(content="hello", source="agent"))
        assert len(await context.get_messages()) == 2
        await loaded.close()
        await close_store(store)


async def test_memory_injections_age_out_of_a_budgeted_window(store: Any) -> None:
    from autogen_core.memory import ListMemory, MemoryContent

    memory = ListMemory()
    await memory.add(MemoryContent(content="The user likes short answers " * 5,
                                   mime_type="text/plain"))
    view = TokenLimitedView(token_limit=120)
    context = MemstoreChatCompletionContext("mem", store, view=view)
    # a system message set up before the conversation starts stays anchored
    await context.add_message(SystemMessage(content="Be kind."))
    client = ReplayChatCompletionClient([f"answer {turn}" for turn in range(8)],
                                        model_info=MODEL_INFO)
    assistant = AssistantAgent("a", model_client=client, model_context=context,
                               memory=[memory], system_message=None)
    for turn in range(8):  # every run injects the memory as a SystemMessage
        await assistant.run(task=f"question {turn}")
    stored = await call(store.messages("mem"))
    assert len(stored) == 1 + 8 * 3
    assert [m.role for m in stored[:4]] == ["system", "user", "assistant", "assistant"]
    injections = [m for m in stored if m.metadata.get("autogen") == {"system": True}]
    assert len(injections) == 8
    # each model call got the anchored system message, its question and the newest
    # injection; old injections aged out like the rest of the history
    for turn, history in enumerate(sent(assistant)):
        assert history[0] == {"role": "system", "content": "Be kind."}
        assert history[-2:] == [{"role": "user", "content": f"question {turn}", "name": "user"},
                                {"role": "system", "content": injections[turn].text}]
    window = await call(store.window("mem", view))
    assert window.report.omitted and window.token_count <= 120
    # autogen gets back exactly what it added, in its place
    everything = await MemstoreChatCompletionContext("mem", store).get_messages()
    assert dumps(everything[:4]) == dumps([
        SystemMessage(content="Be kind."), UserMessage(content="question 0", source="user"),
        SystemMessage(content=injections[0].text),
        AssistantMessage(content="answer 0", source="a")])


async def test_a_late_system_message_round_trips(store: Any) -> None:
    context = MemstoreChatCompletionContext("late", store)
    added = [SystemMessage(content="first"), SystemMessage(content="second"),
             UserMessage(content="hi", source="user"), SystemMessage(content="late"),
             AssistantMessage(content="ok", source="a"), SystemMessage(content="later")]
    for message in added:
        await context.add_message(message)
    assert dumps(await context.get_messages()) == dumps(added)
    assert [m.role for m in await call(store.messages("late"))] == [
        "system", "system", "user", "assistant", "assistant", "assistant"]
    assert dumps(from_memstore(to_memstore(SystemMessage(content="x"), anchor=False))) == dumps(
        [SystemMessage(content="x")])
    # the newest message is a system one, but the conversation has started: not anchored
    await call(store.append("late", Message.system("written elsewhere")))
    await context.add_message(SystemMessage(content="after it"))
    assert (await call(store.messages("late")))[-1].role == "assistant"


async def test_changing_what_autogen_got_does_not_change_the_context(store: Any) -> None:
    context = MemstoreChatCompletionContext("mut", store)
    added = sendable(conversation())
    for message in added:
        await context.add_message(message)
    await call(store.append("mut", Message.user([{"type": "text", "text": "foreign"}])))
    expected = dumps(await context.get_messages())
    for _ in range(2):  # the second read may come from the store's cache
        got = await context.get_messages()
        assert dumps(got) == expected
        for message in got:
            if isinstance(message.content, list):
                for item in message.content:
                    if isinstance(item, FunctionCall):
                        item.name = "changed"
                    elif isinstance(item, FunctionExecutionResult):
                        item.content = "changed"
                message.content.append("changed")  # type: ignore[arg-type]
    assert dumps(await context.get_messages()) == expected


def sendable(messages: list[Any]) -> list[Any]:
    """``messages`` without empty FunctionExecutionResultMessages (they store nothing)."""
    return [m for m in messages
            if not (isinstance(m, FunctionExecutionResultMessage) and not m.content)]


def conversation() -> list[Any]:
    return [
        SystemMessage(content="You are helpful."),
        UserMessage(content="Hi", source="alice"),
        UserMessage(content=["Look:", Image.from_base64(PNG), "ok?"], source="alice"),
        AssistantMessage(content="A pixel.", thought="It is tiny.", source="agent"),
        AssistantMessage(content=[FunctionCall(id="1", name="f", arguments='{"x": 1}'),
                                  FunctionCall(id="2", name="g", arguments="not json")],
                         source="agent"),
        FunctionExecutionResultMessage(content=[
            FunctionExecutionResult(content="one", name="f", call_id="1"),
            FunctionExecutionResult(content="two", name="", call_id="2", is_error=True)]),
        AssistantMessage(content=[FunctionCall(id="3", name="f", arguments="{}")],
                         thought="", source=""),
        FunctionExecutionResultMessage(content=[
            FunctionExecutionResult(content="three", name="f", call_id="3", is_error=False)]),
        FunctionExecutionResultMessage(content=[]),
        AssistantMessage(content="Done.", source="agent"),
    ]


# ---- round trips -----------------------------------------------------------------------------

_text = st.text(st.characters(blacklist_categories=["Cs"], blacklist_characters="\x00"),
                max_size=10)
_source = st.sampled_from(["user", "agent", "", "x" * 300])
_call = st.builds(lambda i, n, a: FunctionCall(id=i, name=n, arguments=a),
                  st.text("abc123", min_size=1, max_size=4), st.sampled_from(["f", "g_h"]),
                  _text)
_result = st.builds(
    lambda c, n, i, e: FunctionExecutionResult(content=c, name=n, call_id=i, is_error=e),
    _text, st.sampled_from(["f", ""]), st.text("abc123", min_size=1, max_size=4),
    st.sampled_from([None, True, False]))
_image = st.just(PNG).map(Image.from_base64)
_message = st.one_of(
    st.builds(lambda c: SystemMessage(content=c), _text),
    st.builds(lambda c, s: UserMessage(content=c, source=s),
              _text | st.lists(_text | _image, max_size=3), _source),
    st.builds(lambda c, t, s: AssistantMessage(content=c, thought=t, source=s),
              _text | st.lists(_call, max_size=3, unique_by=lambda c: c.id),
              st.none() | _text, _source),
    st.builds(lambda r: FunctionExecutionResultMessage(content=r),
              st.lists(_result, min_size=1, max_size=3)),
)


@settings(max_examples=examples(150), derandomize=True, deadline=None)
@given(st.lists(_message, max_size=6))
def test_round_trip_is_identity(messages: list[Any]) -> None:
    stored = [m for message in messages for m in to_memstore(message)]
    assert dumps(from_memstore(stored)) == dumps(messages)


@settings(max_examples=examples(15), derandomize=True, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(messages=st.lists(_message, min_size=1, max_size=5))
async def test_round_trip_through_the_database(store: Any, messages: list[Any]) -> None:
    cid = f"rt-{next(_ids)}"
    context = MemstoreChatCompletionContext(cid, store)
    for m in messages:
        await context.add_message(m)
    read = await call(store.messages(cid))
    assert dumps(from_memstore(read)) == dumps(messages)


_ids = itertools.count()


def test_messages_from_elsewhere_read_back() -> None:
    foreign = [Message.developer("Be brief."), Message.user("x"),
               Message.assistant(tool_calls=[ToolCall(id="q", name="f")]),
               Message.tool("r", tool_call_id="q"), Message.assistant("done", name="bot")]
    got = from_memstore(foreign)
    assert dumps(got) == dumps([
        SystemMessage(content="Be brief."), UserMessage(content="x", source="user"),
        AssistantMessage(content=[FunctionCall(id="q", name="f", arguments="{}")],
                         source="assistant"),
        FunctionExecutionResultMessage(content=[
            FunctionExecutionResult(content="r", name="", call_id="q")]),
        AssistantMessage(content="done", source="bot")])


async def test_constructor_refuses_what_the_store_would(store: Any) -> None:
    assert_constructor_refuses_what_the_store_would(
        MemstoreChatCompletionContext, store, "conversation_id")


def test_anchor_takes_only_a_bool() -> None:
    """``anchor="no"`` was taken as yes: the system message was stored anchored."""
    for bad in ("no", 0, None):
        with pytest.raises(InvalidInputError, match="anchor must be True or False"):
            to_memstore(SystemMessage(content="x"), anchor=bad)  # type: ignore[arg-type]
