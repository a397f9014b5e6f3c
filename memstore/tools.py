"""An agent tool to search its own memory: ``search_tool(store)``.

The tool has a name, a description, a JSON schema for its arguments (``query`` and an
optional ``limit``) and a call, synchronous and asynchronous, that returns compact JSON
of the hits: each hit's conversation, seq, date, role and text (cut at
`MAX_HIT_CHARS` characters), best first. A query the store refuses comes back as
``{"error": "..."}``, so the model can try again rather than the run failing.

Ready-made forms: [`SearchTool.openai_chat()`][memstore.tools.SearchTool.openai_chat]
(Chat Completions ``tools=``),
[`SearchTool.openai_responses()`][memstore.tools.SearchTool.openai_responses] (Responses
``tools=``) and [`SearchTool.anthropic()`][memstore.tools.SearchTool.anthropic] (Messages
``tools=``); [`SearchTool.run()`][memstore.tools.SearchTool.run] takes a
provider's tool-call arguments (a JSON string or a dict). Each framework adapter has a
``search_tool`` that wraps this one in its own tool type
(`memstore.integrations.openai_agents.search_tool()`,
`memstore.integrations.autogen.search_tool()`,
`memstore.integrations.langchain.search_tool()`).

Example:
    >>> from memstore import MemoryStore, Message
    >>> from memstore.tools import search_tool
    >>> store = MemoryStore("sqlite://")
    >>> _ = store.append("chat", Message.user("My flight to Lisbon leaves at 9:40."))
    >>> tool = search_tool(store)
    >>> tool.call("lisbon flight")  # doctest: +ELLIPSIS
    '{"hits":[{"conversation_id":"chat","seq":1,...,"text":"My flight to Lisbon leaves at 9:40."}]}'
    >>> store.close()
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from memstore._validate import check_where, short_repr
from memstore.errors import ConfigurationError, InvalidInputError
from memstore.search import MAX_LIMIT, SearchHit, searchable_text

__all__ = ["MAX_HIT_CHARS", "SearchTool", "search_tool"]

#: Characters of a hit's text the tool returns (the rest is cut, marked with ``…``).
MAX_HIT_CHARS = 1000

DEFAULT_NAME = "search_memory"
DEFAULT_DESCRIPTION = (
    "Search your long-term memory: every earlier message of your conversations, including "
    "tool calls and their results. Use it to recall facts, names, numbers or decisions "
    "mentioned before. Write a few keywords, not a question: all words must appear "
    '(use OR between alternatives, "quotes" for an exact phrase, -word to exclude). '
    "Returns the best matches first, as JSON."
)


def _schema(limit: int) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {
            "query": {
                "type": "string",
                "description": "Keywords to look for, e.g. 'flight lisbon' or "
                               "'refund OR chargeback'.",
            },
            "limit": {
                "type": "integer",
                "minimum": 1,
                "maximum": MAX_LIMIT,
                "description": f"How many matches to return (default {limit}).",
            },
        },
        "required": ["query"],
        "additionalProperties": False,
    }


def hit_json(hit: SearchHit) -> dict[str, Any]:
    """One hit as the tool returns it."""
    message = hit.message
    text = searchable_text(message.content, message.tool_calls)
    if len(text) > MAX_HIT_CHARS:
        text = text[: MAX_HIT_CHARS - 1] + "\u2026"
    return {"conversation_id": hit.conversation_id, "seq": message.seq,
            "date": message.created_at.isoformat(timespec="seconds"), "role": message.role,
            "text": text}


def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


@dataclass(frozen=True)
class SearchTool:
    """A memory-search tool over one store (made by `search_tool()`).

    Attributes:
        store: the store searched (its ``search`` method; an async store's is awaited).
        name: the tool's name.
        description: what the model reads about it.
        parameters: the JSON schema of its arguments.
        conversation_id: the conversations searched (``None``: all).
        where: conversation-metadata filters.
        limit: hits returned when the call gives no ``limit``.
    """

    store: Any
    name: str = DEFAULT_NAME
    description: str = DEFAULT_DESCRIPTION
    conversation_id: str | Sequence[str] | None = None
    where: Mapping[str, str | int | bool | None] | None = None
    limit: int = 5
    parameters: dict[str, Any] = field(default_factory=dict)

    @property
    def is_async(self) -> bool:
        """Whether the store's ``search`` is a coroutine (an ``AsyncMemoryStore``)."""
        return inspect.iscoroutinefunction(self.store.search)

    def _arguments(self, query: Any, limit: Any) -> dict[str, Any]:
        chosen = self.limit if limit is None else limit
        return {"conversation_id": self.conversation_id, "where": self.where, "limit": chosen}

    def call(self, query: str, limit: int | None = None) -> str:
        """Search (a sync store) and return the hits as compact JSON.

        Raises:
            ConfigurationError: the store is an ``AsyncMemoryStore`` (use `acall()`).
        """
        if self.is_async:
            raise ConfigurationError(
                f"tool {self.name!r} searches an AsyncMemoryStore: use `await tool.acall(...)`")
        try:
            hits = self.store.search(query, **self._arguments(query, limit))
        except InvalidInputError as exc:
            return _dumps({"error": str(exc)})
        return _dumps({"hits": [hit_json(h) for h in hits]})

    async def acall(self, query: str, limit: int | None = None) -> str:
        """Search (a sync or async store) and return the hits as compact JSON."""
        try:
            result = self.store.search(query, **self._arguments(query, limit))
            if inspect.isawaitable(result):
                result = await result
        except InvalidInputError as exc:
            return _dumps({"error": str(exc)})
        return _dumps({"hits": [hit_json(h) for h in result]})

    def _parsed(self, arguments: str | Mapping[str, Any]) -> tuple[Any, Any] | str:
        if isinstance(arguments, (str, bytes)):
            try:
                arguments = json.loads(arguments or "{}")
            except ValueError as exc:
                return _dumps({"error": f"the arguments are not JSON: {exc}"})
        if not isinstance(arguments, Mapping):
            return _dumps({"error": "the arguments must be a JSON object"})
        unknown = sorted(set(arguments) - {"query", "limit"})
        if unknown:
            return _dumps({"error": f"unknown argument(s): {', '.join(unknown)}"})
        return arguments.get("query"), arguments.get("limit")

    def run(self, arguments: str | Mapping[str, Any]) -> str:
        """Call with a provider's tool-call arguments (a JSON string or a dict)."""
        parsed = self._parsed(arguments)
        return parsed if isinstance(parsed, str) else self.call(*parsed)

    async def arun(self, arguments: str | Mapping[str, Any]) -> str:
        """`run()`, awaiting an async store."""
        parsed = self._parsed(arguments)
        return parsed if isinstance(parsed, str) else await self.acall(*parsed)

    def openai_chat(self) -> dict[str, Any]:
        """The tool for OpenAI Chat Completions ``tools=``."""
        return {"type": "function", "function": {
            "name": self.name, "description": self.description, "parameters": self.parameters}}

    def openai_responses(self) -> dict[str, Any]:
        """The tool for the OpenAI Responses API ``tools=``."""
        return {"type": "function", "name": self.name, "description": self.description,
                "parameters": self.parameters, "strict": False}

    def anthropic(self) -> dict[str, Any]:
        """The tool for the Anthropic Messages API ``tools=``."""
        return {"name": self.name, "description": self.description,
                "input_schema": self.parameters}


def search_tool(
    store: Any,
    *,
    conversation_id: str | Sequence[str] | None = None,
    where: Mapping[str, str | int | bool | None] | None = None,
    limit: int = 5,
    name: str = DEFAULT_NAME,
    description: str | None = None,
) -> SearchTool:
    """A tool an agent calls to search its memory in ``store``.

    Args:
        store: a [`MemoryStore`][memstore.MemoryStore] or
            [`AsyncMemoryStore`][memstore.AsyncMemoryStore].
        conversation_id: the conversations searched (one id or a list; ``None``: all).
        where: conversation-metadata equality filters (e.g. ``{"user_id": "u1"}``: one
            user's memory).
        limit: hits returned when the model gives no ``limit`` (1–1,000).
        name: the tool's name (letters, digits, ``_`` and ``-``, at most 64).
        description: what the model reads about the tool (default:
            ``DEFAULT_DESCRIPTION``).

    Raises:
        ConfigurationError: ``store`` has no ``search`` method, or a bad limit or name.
        InvalidInputError: a bad ``where``.
    """
    if not callable(getattr(store, "search", None)):
        raise ConfigurationError(
            f"search_tool needs a MemoryStore or AsyncMemoryStore, got {short_repr(store)}")
    if not isinstance(limit, int) or isinstance(limit, bool) or not 1 <= limit <= MAX_LIMIT:
        raise ConfigurationError(f"limit must be an int in [1, {MAX_LIMIT}], got "
                                 f"{short_repr(limit)}")
    if (not isinstance(name, str) or not 1 <= len(name) <= 64
            or not all(c.isascii() and (c.isalnum() or c in "_-") for c in name)):
        raise ConfigurationError(
            f"name must be 1-64 letters, digits, '_' or '-', got {short_repr(name)}")
    if description is None:
        description = DEFAULT_DESCRIPTION
    if not isinstance(description, str) or not description.strip():
        raise ConfigurationError("description must be a non-empty string")
    check_where(where)
    return SearchTool(store=store, name=name, description=description,
                      conversation_id=conversation_id, where=where, limit=limit,
                      parameters=_schema(limit))
