"""memstore as autogen's model context: persistent, token-budgeted, declarable.

`MemstoreChatCompletionContext` is an
``autogen_core.model_context.ChatCompletionContext`` and an autogen ``Component``:
give it to an ``AssistantAgent(model_context=...)`` and the agent's conversation is
stored in SQLite or PostgreSQL, survives restarts, and is read back through any
memstore view (by default every complete unit; a budgeted view gives a window that
fits a token budget and never splits a tool call from its results).

Install with ``pip install 'memstore[autogen]'`` (autogen-core 0.7).

Mapping (lossless both ways; `to_memstore()` / `from_memstore()`):

* ``SystemMessage`` ↔ a ``system`` message (a stored ``developer`` message reads
  back as a ``SystemMessage`` too). One added to a conversation that already has a
  non-system message (what an autogen ``Memory`` injects every run) is stored as a
  non-anchored ``assistant`` message marked ``metadata["autogen"]["system"]``, so
  views window it instead of keeping every injection forever; it reads back as the
  same ``SystemMessage``.
* ``UserMessage`` ↔ a ``user`` message: text, or parts (``Image`` ↔ an image part
  holding its ``data:image/png`` URI; an image given by URL reads back as its URL
  text, since an autogen ``Image`` holds pixels); ``source`` ↔ ``name``.
* ``AssistantMessage`` ↔ an ``assistant`` message: text content, or ``FunctionCall``
  list ↔ ``tool_calls`` with the ``thought`` as the message text (what providers
  see next to the calls); the ``thought`` of a text answer is kept in metadata.
* ``FunctionExecutionResultMessage`` ↔ one ``tool`` message per result (written in
  one transaction), regrouped into one message on the way back; ``name`` ↔ name,
  ``is_error`` ↔ the ``is_error`` hint (``metadata["memstore"]``, which
  ``to_anthropic()`` renders). An
  empty ``FunctionExecutionResultMessage(content=[])`` carries nothing to send and
  stores nothing.

What memstore has no field for (an empty ``source``, a thought, the result
grouping) lives under ``metadata["autogen"]``.

Stores: a [`MemoryStore`][memstore.MemoryStore] or an
[`AsyncMemoryStore`][memstore.AsyncMemoryStore].
autogen's methods are coroutines; a sync store is called directly from them (a
memstore call is one short transaction), so use an ``AsyncMemoryStore`` when a
slow database must not hold up the event loop.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import json
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime, timezone
from typing import Any

from memstore.errors import (
    ConfigurationError,
    ConversationNotFoundError,
    InvalidInputError,
    MissingDependencyError,
)
from memstore.formats import is_error_of, with_hints
from memstore.integrations._common import (
    AnyStore,
    check_conversation,
    check_flag,
    check_store,
    check_view,
    read_history,
    run,
    store_url,
    valid_name,
)
from memstore.models import (
    Conversation,
    ConversationState,
    ImagePart,
    ImageURL,
    Message,
    TextPart,
    ToolCall,
)
from memstore.views import ContextView, view_from_config

try:
    from autogen_core import Component, FunctionCall, Image
    from autogen_core.model_context import ChatCompletionContext
    from autogen_core.models import (
        AssistantMessage,
        FunctionExecutionResult,
        FunctionExecutionResultMessage,
        LLMMessage,
        SystemMessage,
        UserMessage,
    )
except ImportError as exc:  # pragma: no cover - exercised without the extra
    raise MissingDependencyError(
        "memstore.integrations.autogen needs autogen-core 0.7: pip install 'memstore[autogen]'"
    ) from exc
from pydantic import BaseModel
from typing_extensions import Self

__all__ = [
    "MemstoreChatCompletionContext",
    "MemstoreChatCompletionContextConfig",
    "from_memstore",
    "search_tool",
    "to_memstore",
]

_KEY = "autogen"
_ANCHORED = ("system", "developer")
_PAGE = 64
_IMAGE_URI = ("data:image/png;base64,", "data:image/jpeg;base64,")


# ---- autogen -> memstore ---------------------------------------------------------------------


def _name_fields(value: str, field: str, extra: dict[str, Any]) -> str | None:
    """``value`` as a memstore name, or ``None`` with ``value`` kept in ``extra``."""
    if valid_name(value):
        return value
    extra[field] = value
    return None


def _meta(extra: dict[str, Any], base: Mapping[str, Any] | None = None) -> dict[str, Any]:
    out = dict(base or {})
    if extra:
        out[_KEY] = extra
    return out


def to_memstore(message: LLMMessage, *, anchor: bool = True) -> list[Message]:
    """Convert one autogen message into the memstore messages that store it.

    Args:
        message: the autogen message.
        anchor: for a ``SystemMessage``: ``True`` stores it as a ``system`` message
            (anchored: every view keeps it); ``False`` as a non-anchored ``assistant``
            message marked ``metadata["autogen"]["system"]``, which views window like
            any other message and which reads back as the same ``SystemMessage``
            (what `MemstoreChatCompletionContext` does with a system message
            added after the conversation's first non-system message, such as the
            one an autogen ``Memory`` injects every run).

    Returns:
        One message, except for a ``FunctionExecutionResultMessage``: one ``tool``
        message per result (none for an empty one).

    Raises:
        InvalidInputError: not an autogen ``LLMMessage``.
        pydantic.ValidationError: a value memstore cannot store (an empty call id…).
    """
    extra: dict[str, Any] = {}
    anchor = check_flag(anchor, "anchor")
    if isinstance(message, SystemMessage):
        if anchor:
            return [Message(role="system", content=message.content)]
        return [Message(role="assistant", content=message.content,
                        metadata={_KEY: {"system": True}})]
    if isinstance(message, UserMessage):
        name = _name_fields(message.source, "source", extra)
        content: str | list[TextPart | ImagePart]
        if isinstance(message.content, str):
            content = message.content
        else:
            content = [TextPart(text=item) if isinstance(item, str)
                       else ImagePart(image_url=ImageURL(url=item.data_uri))
                       for item in message.content]
        return [Message(role="user", content=content, name=name, metadata=_meta(extra))]
    if isinstance(message, AssistantMessage):
        name = _name_fields(message.source, "source", extra)
        if isinstance(message.content, str):
            if message.thought is not None:
                extra["thought"] = message.thought
            return [Message(role="assistant", content=message.content, name=name,
                            metadata=_meta(extra))]
        if not message.content:
            extra["calls"] = []
        calls = [ToolCall(id=c.id, name=c.name, arguments=c.arguments) for c in message.content]
        return [Message(role="assistant", content=message.thought, tool_calls=calls or None,
                        name=name, metadata=_meta(extra))]
    if isinstance(message, FunctionExecutionResultMessage):
        out: list[Message] = []
        size = len(message.content)
        for index, result in enumerate(message.content):
            own: dict[str, Any] = {"result": [index, size]}
            name = _name_fields(result.name, "name", own)
            base = with_hints(is_error=result.is_error)
            out.append(Message(role="tool", content=result.content, tool_call_id=result.call_id,
                               name=name, metadata=_meta(own, base)))
        return out
    raise InvalidInputError(
        f"expected an autogen LLMMessage (SystemMessage, UserMessage, AssistantMessage, "
        f"FunctionExecutionResultMessage), not {type(message).__name__}"
    )


# ---- memstore -> autogen ---------------------------------------------------------------------


def _extra(message: Message) -> dict[str, Any]:
    # a deep copy: nothing handed to autogen may share a container with the stored
    # message (read-only when read from a store, and shared with later reads)
    value = message.metadata.get(_KEY)
    return copy.deepcopy(dict(value)) if isinstance(value, dict) else {}


def _source(message: Message, extra: Mapping[str, Any], default: str) -> str:
    if "source" in extra:
        return str(extra["source"])
    return message.name or default


def _user_content(message: Message) -> str | list[str | Image]:
    if message.content is None:
        return ""
    if isinstance(message.content, str):
        return message.content
    items: list[str | Image] = []
    for part in message.content:
        if isinstance(part, TextPart):
            items.append(part.text)
        elif part.image_url.url.startswith(_IMAGE_URI):
            items.append(Image.from_uri(part.image_url.url))
        else:
            items.append(part.image_url.url)
    return items


def _result(message: Message, extra: Mapping[str, Any]) -> FunctionExecutionResult:
    return FunctionExecutionResult(
        content=message.text,
        name=str(extra["name"]) if "name" in extra else (message.name or ""),
        call_id=message.tool_call_id or "",
        is_error=is_error_of(message),
    )


def from_memstore(messages: Iterable[Message]) -> list[LLMMessage]:
    """Convert chronological memstore messages into autogen messages.

    Consecutive tool messages become one ``FunctionExecutionResultMessage``; those
    written from one autogen message come back as exactly that message.
    """
    out: list[LLMMessage] = []
    group: list[FunctionExecutionResult] = []

    def flush() -> None:
        if group:
            out.append(FunctionExecutionResultMessage(content=list(group)))
            group.clear()

    for message in messages:
        extra = _extra(message)
        if message.role == "tool":
            position = extra.get("result")
            if isinstance(position, list) and position and position[0] == 0:
                flush()
            group.append(_result(message, extra))
            continue
        flush()
        if message.role in ("system", "developer") or (
                extra.get("system") is True and message.role == "assistant"
                and not message.tool_calls):
            out.append(SystemMessage(content=message.text))
        elif message.role == "user":
            out.append(UserMessage(content=_user_content(message),
                                   source=_source(message, extra, "user")))
        elif message.tool_calls or "calls" in extra:
            calls = [FunctionCall(id=c.id, name=c.name, arguments=c.arguments)
                     for c in message.tool_calls or ()]
            thought = None if message.content is None else message.text
            out.append(AssistantMessage(content=calls, thought=thought,
                                        source=_source(message, extra, "assistant")))
        else:
            thought_value = extra.get("thought")
            out.append(AssistantMessage(
                content=message.text,
                thought=thought_value if isinstance(thought_value, str) else None,
                source=_source(message, extra, "assistant")))
    flush()
    return out


def _page(conversation_id: str, start: int | None, store: AnyStore) -> Any:
    """The first `_PAGE` messages from ``start`` (awaitable for an async store)."""
    return store.messages(conversation_id, start=start, limit=_PAGE)


# ---- the model context -----------------------------------------------------------------------


class MemstoreChatCompletionContextConfig(BaseModel):
    """The declarative configuration of `MemstoreChatCompletionContext`.

    Attributes:
        url: the database URL, without a password (configs are written to files and
            logs): libpq supplies it when the store is opened (``PGPASSWORD``,
            ``~/.pgpass``, a service file), or set a URL with it before loading.
        conversation_id: the conversation the context reads and writes.
        view: the view configuration (``view.to_config()``); ``None``: every
            complete unit.
        counter: the store's token counter name.
        async_store: open an [`AsyncMemoryStore`][memstore.AsyncMemoryStore] (else a
            [`MemoryStore`][memstore.MemoryStore]).
    """

    url: str
    conversation_id: str
    view: dict[str, Any] | None = None
    counter: str | None = None
    async_store: bool = False


class MemstoreChatCompletionContext(ChatCompletionContext,
                                    Component[MemstoreChatCompletionContextConfig]):
    """An autogen model context stored in memstore.

    ``add_message`` persists (a ``FunctionExecutionResultMessage`` as one tool
    message per result, in one transaction); ``get_messages`` returns the window of
    ``view`` as autogen messages, followed by the turn in progress (an assistant tool
    call whose results are not all stored yet), so the history is valid together
    with the results the agent is about to add. A budgeted view is charged for the
    turn in progress (its window gets that much less), so the whole history fits its
    ``token_limit``. A conversation that was never written is ``[]``.

    ``save_state`` returns memstore's [`ConversationState`][memstore.ConversationState] as a
    JSON-compatible dict (under ``"memstore_state"``), so the state moves between
    databases; ``load_state`` replaces the conversation with it. ``clear`` deletes
    the conversation's messages.

    ``dump_component()`` records the database URL without its password, the
    conversation id, the view configuration and the store's counter;
    ``load_component()`` opens a new store on that URL (the password comes from
    ``PGPASSWORD``, ``~/.pgpass`` or a URL put into the config) and gives a context with
    the same behaviour; that context owns its store, which `close()` closes.

    Args:
        conversation_id: the memstore conversation id.
        store: a MemoryStore or an AsyncMemoryStore.
        view: the view deciding what the model is given; default: every complete
            unit (``UnboundedView``).

    Example:
        >>> from memstore import MemoryStore, TokenLimitedView
        >>> from memstore.integrations.autogen import MemstoreChatCompletionContext
        >>> ctx = MemstoreChatCompletionContext("chat-1", MemoryStore("sqlite://"),
        ...                                     view=TokenLimitedView(token_limit=8000))
    """

    component_config_schema = MemstoreChatCompletionContextConfig
    component_provider_override = "memstore.integrations.autogen.MemstoreChatCompletionContext"

    def __init__(self, conversation_id: str, store: AnyStore, *,
                 view: ContextView | None = None) -> None:
        super().__init__()
        self._store = check_store(store, "MemstoreChatCompletionContext")
        self._view = check_view(view, "MemstoreChatCompletionContext")
        self._conversation_id = check_conversation(self._store, conversation_id, self._view,
                                                   "conversation_id")
        self._owns_store = False

    @property
    def conversation_id(self) -> str:
        """The memstore conversation id."""
        return self._conversation_id

    @property
    def store(self) -> AnyStore:
        """The store the context reads and writes."""
        return self._store

    @property
    def view(self) -> ContextView:
        """The view deciding what ``get_messages`` returns."""
        return self._view

    async def add_message(self, message: LLMMessage) -> None:
        """Persist an autogen message (several tool messages in one transaction).

        A ``SystemMessage`` added while the conversation holds only system messages
        (or nothing) is a ``system`` message, kept by every view. One added later —
        an autogen ``Memory`` (``ListMemory``, ...) injects one every run — is stored
        non-anchored (see `to_memstore()`), so views window it like the rest of
        the history instead of keeping every injection forever; it reads back as the
        same ``SystemMessage``, in its place.
        """
        anchor = not isinstance(message, SystemMessage) or await self._only_anchored()
        messages = to_memstore(message, anchor=anchor)
        if not messages:
            return
        cid = self._conversation_id
        if len(messages) == 1:
            await run(self._store, lambda s: s.append(cid, messages[0]))
        else:
            await run(self._store, lambda s: s.extend(cid, messages))

    async def _only_anchored(self) -> bool:
        """Whether the conversation holds no message but system/developer ones."""
        cid = self._conversation_id
        try:
            newest = await run(self._store, lambda s: s.messages(cid, limit=1, newest_first=True))
        except ConversationNotFoundError:
            return True
        if not newest:
            return True
        if newest[0].role not in _ANCHORED:
            return False
        start: int | None = None  # the newest is a system message: is every one before it?
        while True:
            page = await run(self._store, functools.partial(_page, cid, start))
            if any(m.role not in _ANCHORED for m in page):
                return False
            if len(page) < _PAGE:
                return True
            start = page[-1].seq + 1

    async def get_messages(self) -> list[LLMMessage]:
        """The view's window plus the turn in progress, as autogen messages.

        A budgeted view's window leaves room for the turn in progress: the messages
        returned fit its ``token_limit`` (with its ``reserve`` and tool schemas).

        Raises:
            ContextBudgetError: a budgeted view cannot fit the anchored messages, the
                newest unit and the turn in progress.
        """
        history = await read_history(self._store, self._conversation_id, self._view)
        return from_memstore(history)

    async def clear(self) -> None:
        """Delete every message of the conversation (a never-written one is a no-op)."""
        cid = self._conversation_id
        with contextlib.suppress(ConversationNotFoundError):
            await run(self._store, lambda s: s.clear(cid))

    async def save_state(self) -> Mapping[str, Any]:
        """The conversation as ``{"memstore_state": <ConversationState as JSON data>}``."""
        cid = self._conversation_id
        try:
            state: ConversationState = await run(self._store, lambda s: s.save_state(cid))
        except ConversationNotFoundError:
            now = datetime.now(timezone.utc)
            state = ConversationState(
                conversation=Conversation(id=cid, created_at=now, updated_at=now),
                messages=[], view=self._view.to_config())
        return {"memstore_state": json.loads(state.to_json())}

    async def load_state(self, state: Mapping[str, Any]) -> None:
        """Replace the conversation with a state from `save_state()`.

        Raises:
            InvalidInputError: ``state`` holds no memstore state.
        """
        data = state.get("memstore_state") if isinstance(state, Mapping) else None
        if not isinstance(data, Mapping):
            raise InvalidInputError(
                "state must come from MemstoreChatCompletionContext.save_state() "
                "(a mapping with a 'memstore_state' entry)"
            )
        snapshot = ConversationState.model_validate(data)
        cid = self._conversation_id
        await run(self._store, lambda s: s.load_state(snapshot, cid, True))

    def _to_config(self) -> MemstoreChatCompletionContextConfig:
        """The config ``load_component`` rebuilds this context from.

        Raises:
            ConfigurationError: the config could not give the same context back: the
                store is an in-memory SQLite database (a new store would open another,
                empty one), or its counter cannot be rebuilt from its name (a custom
                counter: ``memstore.tokens.counter_from_name`` does not know it).
        """
        from memstore.aio import AsyncMemoryStore
        from memstore.errors import MemstoreError
        from memstore.tokens import counter_from_name

        url = self._store.engine.url
        if url.get_backend_name() == "sqlite" and url.database in (None, "", ":memory:"):
            raise ConfigurationError(
                "dump_component: the store is an in-memory SQLite database, which a loaded "
                "component could not open again; use a database file or server"
            )
        name = self._store.counter.name
        try:
            rebuilt = counter_from_name(name).name
        except MemstoreError:
            rebuilt = None
        if rebuilt != name:
            raise ConfigurationError(
                f"dump_component: the store's token counter {name!r} cannot be rebuilt from "
                "its name (memstore.tokens.counter_from_name), so a loaded component would "
                "count differently; use a built-in counter, or build the context in code"
            )
        return MemstoreChatCompletionContextConfig(
            url=store_url(self._store),
            conversation_id=self._conversation_id,
            view=self._view.to_config(),
            counter=name,
            async_store=isinstance(self._store, AsyncMemoryStore),
        )

    @classmethod
    def _from_config(cls, config: MemstoreChatCompletionContextConfig) -> Self:
        from memstore.aio import AsyncMemoryStore
        from memstore.store import MemoryStore
        from memstore.tokens import counter_from_name

        counter = counter_from_name(config.counter) if config.counter else None
        store: AnyStore
        if config.async_store:
            store = AsyncMemoryStore(config.url, counter=counter)
        else:
            store = MemoryStore(config.url, counter=counter)
        view = view_from_config(config.view) if config.view else None
        context = cls(config.conversation_id, store, view=view)
        context._owns_store = True
        return context

    async def close(self) -> None:
        """Close the store if this context opened it (``load_component``); else do nothing."""
        if self._owns_store:
            await run(self._store, lambda s: s.close())


# ---- an agent tool: search memory ------------------------------------------------------------


def search_tool(
    store: Any,
    *,
    conversation_id: str | Sequence[str] | None = None,
    where: Mapping[str, str | int | bool | None] | None = None,
    limit: int = 5,
    name: str = "search_memory",
    description: str | None = None,
) -> Any:
    """An autogen ``FunctionTool`` an agent calls to search its memory in ``store``.

    The tool of `memstore.tools.search_tool()` (same arguments), as
    ``autogen_core.tools.FunctionTool``; its call returns the hits as compact JSON::

        agent = AssistantAgent("assistant", model_client, tools=[search_tool(store)])
    """
    from autogen_core.tools import FunctionTool

    from memstore.tools import search_tool as _search_tool

    tool = _search_tool(store, conversation_id=conversation_id, where=where, limit=limit,
                        name=name, description=description)

    async def search_memory(query: str, limit: int = tool.limit) -> str:
        return await tool.acall(query, limit)

    search_memory.__doc__ = tool.description
    return FunctionTool(search_memory, description=tool.description, name=tool.name)
