"""``memstore.tools.search_tool``: the memory-search tool, its provider forms and adapters.

The schema is checked against the OpenAI and Anthropic SDKs' own parameter types; each
framework adapter's tool is called by the framework itself, driven by its own offline
test model (the Agents SDK's ``Model`` interface, scripted as its tests do; autogen's
``ReplayChatCompletionClient``; LangChain's ``FakeMessagesListChatModel``).
"""

from __future__ import annotations

import json
import typing
from typing import Any

import pytest
from pydantic import ConfigDict, TypeAdapter, with_config

from memstore.errors import ConfigurationError, InvalidInputError
from memstore.models import Message, ToolCall
from memstore.tools import MAX_HIT_CHARS, search_tool
from tests.helpers import call


async def memory(store: Any) -> None:
    await call(store.create_conversation("u1-trip", metadata={"user": "u1"}))
    await call(store.extend("u1-trip", [
        Message.user("My flight to Lisbon leaves at 9:40 on Tuesday."),
        Message.assistant(tool_calls=[ToolCall(id="c1", name="book_hotel",
                                               arguments='{"city": "Lisbon"}')]),
        Message.tool("Booked Hotel Avenida, Lisbon.", tool_call_id="c1"),
    ]))
    await call(store.create_conversation("u2-chat", metadata={"user": "u2"}))
    await call(store.append("u2-chat", Message.user("I never fly to Lisbon.")))


def hits_of(result: str) -> list[tuple[str, int]]:
    return [(h["conversation_id"], h["seq"]) for h in json.loads(result)["hits"]]


async def test_the_tool_searches_and_returns_compact_json(store: Any) -> None:
    await memory(store)
    tool = search_tool(store)
    result = await tool.acall("lisbon flight")
    assert ":" in result and ", " not in result.split('"text"')[0]  # compact separators
    data = json.loads(result)
    assert [(h["conversation_id"], h["seq"]) for h in data["hits"]] == [("u1-trip", 1)]
    hit = data["hits"][0]
    assert set(hit) == {"conversation_id", "seq", "date", "role", "text"}
    assert hit["role"] == "user" and hit["text"].startswith("My flight to Lisbon")
    assert hit["date"].endswith("+00:00")
    assert set(hits_of(await tool.acall("lisbon"))) == {
        ("u1-trip", 1), ("u1-trip", 2), ("u1-trip", 3), ("u2-chat", 1)}
    assert len(hits_of(await tool.acall("lisbon", 2))) == 2
    if not hasattr(store, "setup"):  # a sync store: the sync call too
        assert tool.call("lisbon flight") == result


async def test_the_tool_is_scoped_by_its_filters(store: Any) -> None:
    await memory(store)
    mine = search_tool(store, where={"user": "u1"}, limit=1)
    assert hits_of(await mine.acall("lisbon", 10)) != []
    assert {c for c, _ in hits_of(await mine.acall("lisbon", 10))} == {"u1-trip"}
    assert len(hits_of(await mine.acall("lisbon"))) == 1  # its default limit
    one = search_tool(store, conversation_id="u2-chat")
    assert hits_of(await one.acall("lisbon")) == [("u2-chat", 1)]


async def test_a_bad_query_is_an_error_the_model_can_read(store: Any) -> None:
    await memory(store)
    tool = search_tool(store)
    assert json.loads(await tool.acall("   ")) == {
        "error": "nothing to search for: query '   ' holds no word (letters or digits)"}
    assert "error" in json.loads(await tool.acall("lisbon", 0))
    assert "error" in json.loads(await tool.arun("not json"))
    assert "error" in json.loads(await tool.arun('{"query": "x", "other": 1}'))
    assert "error" in json.loads(await tool.arun("[1]"))
    assert hits_of(await tool.arun('{"query": "hotel avenida"}')) == [("u1-trip", 3)]
    assert hits_of(await tool.arun({"query": "hotel", "limit": 1})) == [("u1-trip", 3)]


async def test_long_hits_are_cut(store: Any) -> None:
    await call(store.append("c", Message.user("needle " + "x" * 5000)))
    (hit,) = json.loads(await search_tool(store).acall("needle"))["hits"]
    assert len(hit["text"]) == MAX_HIT_CHARS and hit["text"].endswith("\u2026")


def test_a_sync_call_on_an_async_store_is_refused() -> None:
    class AsyncStore:
        async def search(self, query: str, **kwargs: Any) -> list[Any]:
            return []

    with pytest.raises(ConfigurationError, match="acall"):
        search_tool(AsyncStore()).call("x")


def test_bad_tool_arguments() -> None:
    class Store:
        def search(self, query: str, **kwargs: Any) -> list[Any]:
            return []

    with pytest.raises(ConfigurationError, match="search_tool needs"):
        search_tool(object())
    for bad in (0, 1001, True, "5"):
        with pytest.raises(ConfigurationError, match="limit"):
            search_tool(Store(), limit=bad)  # type: ignore[arg-type]
    for name in ("", "has space", "x" * 65, "é"):
        with pytest.raises(ConfigurationError, match="name"):
            search_tool(Store(), name=name)
    with pytest.raises(InvalidInputError, match="where"):
        search_tool(Store(), where={"k": [1]})  # type: ignore[dict-item]


# ---- the provider forms, checked against the SDKs' own types --------------------------------


def _strict(kind: Any) -> TypeAdapter[Any]:
    """A TypedDict validated with extra keys refused."""
    return TypeAdapter(with_config(ConfigDict(extra="forbid"))(kind))


def _keys_allowed(value: dict[str, Any], kind: Any) -> None:
    hints = typing.get_type_hints(kind)
    assert set(value) <= set(hints), (set(value) - set(hints), kind)


class _NoStore:
    def search(self, query: str, **kwargs: Any) -> list[Any]:
        return []


def test_openai_chat_form_is_a_chat_completion_tool() -> None:
    from openai.types.chat import ChatCompletionFunctionToolParam, ChatCompletionToolParam
    from openai.types.shared_params import FunctionDefinition

    tool = search_tool(_NoStore()).openai_chat()
    TypeAdapter(ChatCompletionToolParam).validate_python(tool)
    _keys_allowed(tool, ChatCompletionFunctionToolParam)
    _keys_allowed(tool["function"], FunctionDefinition)
    assert tool["function"]["parameters"]["required"] == ["query"]


def test_openai_responses_form_is_a_function_tool() -> None:
    from openai.types.responses import FunctionToolParam

    tool = search_tool(_NoStore()).openai_responses()
    TypeAdapter(FunctionToolParam).validate_python(tool)
    _keys_allowed(tool, FunctionToolParam)


def test_anthropic_form_is_a_tool_param() -> None:
    from anthropic.types import ToolParam

    tool = search_tool(_NoStore(), name="recall").anthropic()
    TypeAdapter(ToolParam).validate_python(tool)
    _keys_allowed(tool, ToolParam)
    assert tool["name"] == "recall" and tool["input_schema"]["type"] == "object"


def test_the_schema_is_a_json_schema_its_arguments_satisfy() -> None:
    jsonschema = pytest.importorskip("jsonschema")
    schema = search_tool(_NoStore()).parameters
    jsonschema.Draft202012Validator.check_schema(schema)
    jsonschema.validate({"query": "a b", "limit": 3}, schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"limit": 3}, schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"query": "a", "limit": 0}, schema)


# ---- the adapters, driven by each framework's own offline model -------------------------------


async def test_openai_agents_function_tool_in_a_run(store: Any) -> None:
    pytest.importorskip("agents")
    from agents import Agent, FunctionTool, Runner, set_tracing_disabled
    from openai.types.responses import ResponseFunctionToolCall

    from memstore.integrations.openai_agents import search_tool as agents_search_tool
    from tests.integrations.test_openai_agents import ScriptedModel, text

    set_tracing_disabled(True)
    await memory(store)
    tool = agents_search_tool(store, where={"user": "u1"})
    assert isinstance(tool, FunctionTool) and tool.name == "search_memory"
    assert tool.params_json_schema["required"] == ["query"]
    model = ScriptedModel([
        [ResponseFunctionToolCall(id="1", type="function_call", call_id="s1",
                                  name="search_memory", arguments='{"query": "lisbon hotel"}')],
        [text("You booked Hotel Avenida.")],
    ])
    agent = Agent(name="assistant", model=model, tools=[tool])
    result = await Runner.run(agent, "Which hotel did I book?")
    assert result.final_output == "You booked Hotel Avenida."
    output = next(i for i in model.inputs[1] if i.get("type") == "function_call_output")
    assert set(hits_of(output["output"])) == {("u1-trip", 2), ("u1-trip", 3)}  # a call, a result


async def test_autogen_function_tool_in_an_agent(store: Any) -> None:
    pytest.importorskip("autogen_agentchat")
    from autogen_agentchat.agents import AssistantAgent
    from autogen_core import FunctionCall
    from autogen_core.models import CreateResult, RequestUsage
    from autogen_core.tools import FunctionTool
    from autogen_ext.models.replay import ReplayChatCompletionClient

    from memstore.integrations.autogen import search_tool as autogen_search_tool

    await memory(store)
    tool = autogen_search_tool(store, limit=3)
    assert isinstance(tool, FunctionTool) and tool.name == "search_memory"
    assert set(tool.schema["parameters"]["properties"]) == {"query", "limit"}
    client = ReplayChatCompletionClient([
        CreateResult(finish_reason="function_calls", cached=False,
                     usage=RequestUsage(prompt_tokens=0, completion_tokens=0),
                     content=[FunctionCall(id="s1", name="search_memory",
                                           arguments='{"query": "lisbon flight"}')]),
    ], model_info={"function_calling": True, "vision": False, "json_output": False,
                   "family": "unknown", "structured_output": False})
    agent = AssistantAgent("assistant", model_client=client, tools=[tool])
    result = await agent.run(task="When is my flight?")
    summary = result.messages[-1]
    assert hits_of(summary.content) == [("u1-trip", 1)]  # type: ignore[union-attr]


async def test_langchain_structured_tool_with_a_fake_model(store: Any) -> None:
    pytest.importorskip("langchain_core")
    from langchain_core.language_models.fake_chat_models import FakeMessagesListChatModel
    from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
    from langchain_core.tools import StructuredTool

    from memstore.integrations.langchain import search_tool as langchain_search_tool

    await memory(store)
    tool = langchain_search_tool(store, conversation_id="u1-trip")
    assert isinstance(tool, StructuredTool) and tool.name == "search_memory"
    assert set(tool.args) == {"query", "limit"}
    model = FakeMessagesListChatModel(responses=[
        AIMessage("", tool_calls=[{"name": "search_memory", "args": {"query": "avenida"},
                                   "id": "s1", "type": "tool_call"}]),
        AIMessage("Hotel Avenida."),
    ])
    history: list[Any] = [HumanMessage("Which hotel?")]
    reply = await model.ainvoke(history)
    history.append(reply)
    for tool_call in reply.tool_calls:
        result = await tool.ainvoke(tool_call)
        assert isinstance(result, ToolMessage)
        assert hits_of(result.content) == [("u1-trip", 3)]  # type: ignore[arg-type]
        history.append(result)
    assert (await model.ainvoke(history)).content == "Hotel Avenida."
    if not hasattr(store, "setup"):  # a sync store serves LangChain's sync call too
        assert hits_of(tool.invoke({"query": "flight"})) == [("u1-trip", 1)]
