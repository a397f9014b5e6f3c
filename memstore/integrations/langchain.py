"""memstore as a LangChain chat message history: persistent and token-budgeted.

`MemstoreChatMessageHistory` is a
``langchain_core.chat_history.BaseChatMessageHistory``. Give it to
``RunnableWithMessageHistory`` (or use it directly): messages are stored in SQLite
or PostgreSQL, and with a budgeted ``view`` the history the chain receives is a
token-budgeted window read in O(window), never the whole conversation re-read and
re-trimmed on every turn. No window splits a tool call from its results.

Install with ``pip install 'memstore[langchain]'`` (langchain-core 1.x).

LangChain's deprecations: langchain-core 1.3.3 deprecated ``RunnableWithMessageHistory``
and 1.6.4 ``BaseChatMessageHistory`` (both to be removed in 2.0), in favour of
LangGraph's message state persisted by a checkpointer. ``RunnableWithMessageHistory``
warns when it is constructed — the user's call, which this module leaves alone.
``BaseChatMessageHistory``'s ``@deprecated`` warns only when that class itself is
instantiated, never for a subclass: constructing and using this history (sync or
async) warns about nothing, and no warning is filtered to make it so. Read
``messages`` and pass them to the model call yourself (docs/integrations/langchain.md)
to use it without any deprecated LangChain API.

Mapping (lossless both ways; `to_memstore()` / `from_memstore()`):

* ``HumanMessage`` ↔ ``user``; ``AIMessage`` ↔ ``assistant`` (``tool_calls`` ↔
  memstore tool calls, ``args`` as their JSON ``arguments``, non-ASCII text unescaped
  as LangChain sends it; ``invalid_tool_calls``
  with a string id, name and args are memstore tool calls too, their ``args`` text
  verbatim, so the ``ToolMessage`` answering one is not an orphan, and they read back
  as ``invalid_tool_calls``); ``SystemMessage`` ↔
  ``system`` (``developer`` when ``additional_kwargs["__openai_role__"]`` says so,
  the convention of langchain-openai); ``ToolMessage`` ↔ ``tool``
  (``tool_call_id``; ``status="error"`` also sets the ``is_error`` hint in
  ``metadata["memstore"]``, which ``to_anthropic()`` renders). Chunk classes and
  ``ChatMessage`` with a memstore role are kept as their own type.
* ``name`` ↔ ``name``; content strings as is; content lists: text blocks as
  memstore text parts and, in a user message, every image block with a URL or
  base64 data as an image part in its place, with its ``detail``, so token
  budgets and memstore's renderers see it: OpenAI ``image_url`` as it is;
  Anthropic ``image`` with a ``base64`` or ``url`` source, LangChain's v1
  ``image`` with ``url`` or ``base64``, and legacy ``image`` with ``source_type``
  ``url`` or ``base64`` as an ``http(s)://`` URL or a ``data:<mime>;base64,``
  URL. An image block memstore cannot hold (a ``file_id`` only, base64 data of
  unknown mime type, a URL of another scheme, any image outside a user message)
  is kept in the stash only and is not counted in budgets.
* Everything memstore has no field for (the message ``id``, ``additional_kwargs``,
  ``response_metadata``, ``usage_metadata``, ``artifact``, other content blocks…)
  is kept under ``metadata["langchain"]`` and comes back equal; a content list
  that is not exactly memstore's text and ``image_url`` parts is kept there whole
  (so an image block in another form is stored twice: as it was, and as the image
  part). A LangChain message id is not used as memstore's idempotency key:
  LangChain ids need not be unique in a history.

``FunctionMessage`` (legacy OpenAI functions, no call id) and ``RemoveMessage``
are rejected with [`InvalidInputError`][memstore.InvalidInputError].

Stores: with a [`MemoryStore`][memstore.MemoryStore] every method works (the async ones
call the store directly). With an [`AsyncMemoryStore`][memstore.AsyncMemoryStore] use the
async methods (``aget_messages``, ``aadd_messages``, ``aclear``; what
``RunnableWithMessageHistory.ainvoke`` calls); the sync ones raise a
[`ConfigurationError`][memstore.ConfigurationError] saying so, since an async engine cannot be
driven from synchronous code safely.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import copy
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from memstore import (
    AsyncMemoryStore,
    ContextView,
    ImagePart,
    ImageURL,
    MemoryStore,
    Message,
    TextPart,
    ToolCall,
)
from memstore.errors import (
    ConfigurationError,
    ConversationNotFoundError,
    InvalidInputError,
    MissingDependencyError,
)
from memstore.formats import with_hints
from memstore.integrations._common import (
    AnyStore,
    check_conversation,
    check_store,
    check_view,
    read_history,
    read_history_sync,
    shown,
    unescaped_json,
    valid_name,
)

try:
    from langchain_core.chat_history import BaseChatMessageHistory
    from langchain_core.messages import BaseMessage, messages_from_dict
except ImportError as exc:  # pragma: no cover - exercised without the extra
    raise MissingDependencyError(
        "memstore.integrations.langchain needs langchain-core>=1: "
        "pip install 'memstore[langchain]'"
    ) from exc

__all__ = ["MemstoreChatMessageHistory", "from_memstore", "search_tool", "to_memstore"]

_KEY = "langchain"
_DEVELOPER = "__openai_role__"
#: LangChain message type -> memstore role.
_ROLE_OF = {
    "human": "user", "HumanMessageChunk": "user",
    "ai": "assistant", "AIMessageChunk": "assistant",
    "system": "system", "SystemMessageChunk": "system",
    "tool": "tool", "ToolMessageChunk": "tool",
}
#: memstore role -> the LangChain type a message of that role reads back as.
_TYPE_OF = {"user": "human", "assistant": "ai", "system": "system", "developer": "system",
            "tool": "tool"}
_CORE = ("content", "type", "name", "id", "tool_calls", "tool_call_id")
_DETAILS = ("auto", "low", "high")


# ---- LangChain -> memstore -------------------------------------------------------------------


def _canonical(content: str | list[TextPart | ImagePart] | None) -> str | list[Any]:
    """The LangChain content that memstore content stands for."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    out: list[Any] = []
    for part in content:
        if isinstance(part, TextPart):
            out.append({"type": "text", "text": part.text})
        else:
            image: dict[str, Any] = {"url": part.image_url.url}
            if part.image_url.detail is not None:
                image["detail"] = part.image_url.detail
            out.append({"type": "image_url", "image_url": image})
    return out


#: ``image/<subtype>``: the mime types an image block's data becomes a ``data:`` URL with.
_IMAGE_MIME = re.compile(r"image/[\w.+-]+", re.ASCII | re.IGNORECASE)
#: A ``data:`` URL of base64 image data (what a LangChain ``url`` may also hold).
_IMAGE_DATA_URL = re.compile(r"data:image/[\w.+-]+(?:;[^,;]*)*;base64,.",
                             re.ASCII | re.IGNORECASE | re.S)
#: Leading bytes of the image formats whose mime type a block may leave out.
_MAGIC = ((b"\x89PNG\r\n\x1a\n", "image/png"), (b"\xff\xd8\xff", "image/jpeg"),
          (b"GIF87a", "image/gif"), (b"GIF89a", "image/gif"))


def _sniff(data: str) -> str | None:
    """The mime type of base64 image ``data`` by its first bytes (PNG, JPEG, GIF, WebP)."""
    try:
        head = base64.b64decode(data[:16], validate=True)
    except (binascii.Error, ValueError):
        return None
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return "image/webp"
    return next((mime for magic, mime in _MAGIC if head.startswith(magic)), None)


def _data_url(mime: Any, data: Any) -> str | None:
    """``data:<mime>;base64,<data>``, or ``None`` without data or an image mime type.

    A missing mime type is read from the data's first bytes; one that is not
    ``image/<subtype>`` means the block is not stored as an image part.
    """
    if not isinstance(data, str) or not data:
        return None
    if mime is None:
        mime = _sniff(data)
    if not (isinstance(mime, str) and _IMAGE_MIME.fullmatch(mime)):
        return None
    return f"data:{mime};base64,{data}"


def _web_url(url: Any) -> str | None:
    """``url`` if it is an ``http(s)://`` URL or a base64 image ``data:`` URL, else ``None``."""
    if not isinstance(url, str):
        return None
    if url[:8].lower().startswith(("https://", "http://")) or _IMAGE_DATA_URL.match(url):
        return url
    return None


def _detail(block: dict[str, Any]) -> Any:
    """An image block's OpenAI ``detail``: its own key, or under ``extras`` (v1 blocks)."""
    if "detail" in block:
        return block["detail"]
    extras = block.get("extras")
    return extras.get("detail") if isinstance(extras, dict) else None


def _image_url(block: dict[str, Any]) -> ImagePart | None:
    """The memstore image part standing for a LangChain image block, else ``None``.

    Blocks with a URL or base64 data: OpenAI ``image_url``; Anthropic ``image`` with a
    ``source`` (``base64`` or ``url``); LangChain v1 ``image`` (``url``, or ``base64``
    with ``mime_type``); legacy v0 ``image`` with ``source_type`` ``url`` or
    ``base64``. A v1 block with both a ``url`` and ``base64`` stands for its URL, as
    LangChain sends it. ``None`` (the block is kept in the stash only) for a file id,
    base64 data whose image mime type is neither given nor readable from its first
    bytes, or a URL that is neither ``http(s)://`` nor a ``data:`` image.
    """
    kind = block.get("type")
    if kind == "image_url":
        value = block.get("image_url")
        url = value.get("url") if isinstance(value, dict) else value
        detail = value.get("detail") if isinstance(value, dict) else None
        if isinstance(url, str):
            return ImagePart(image_url=ImageURL(
                url=url, detail=detail if detail in _DETAILS else None))
        return None
    if kind != "image":
        return None
    source, legacy = block.get("source"), block.get("source_type")
    image: str | None = None
    if isinstance(source, dict):  # Anthropic
        if source.get("type") == "base64":
            image = _data_url(source.get("media_type"), source.get("data"))
        elif source.get("type") == "url":
            image = _web_url(source.get("url"))
    elif legacy is not None:  # LangChain v0
        if legacy == "base64":
            image = _data_url(block.get("mime_type"), block.get("data"))
        elif legacy == "url":
            image = _web_url(block.get("url"))
    elif "url" in block:  # LangChain v1
        image = _web_url(block["url"])
    elif "base64" in block:
        image = _data_url(block.get("mime_type"), block["base64"])
    if image is None:
        return None
    detail = _detail(block)
    return ImagePart(image_url=ImageURL(url=image, detail=detail if detail in _DETAILS else None))


def _content(content: Any, role: str) -> str | list[TextPart | ImagePart]:
    """The memstore content for LangChain content (best effort; exact when possible)."""
    if isinstance(content, str):
        return content
    parts: list[TextPart | ImagePart] = []
    for item in content:
        if isinstance(item, str):
            parts.append(TextPart(text=item))
        elif isinstance(item, dict):
            if item.get("type") == "text" and isinstance(item.get("text"), str):
                parts.append(TextPart(text=item["text"]))
            elif role == "user":
                image = _image_url(item)
                if image is not None:
                    parts.append(image)
    return parts


def _arguments(args: dict[str, Any]) -> str:
    """``args`` as the JSON arguments string LangChain sends (non-ASCII unescaped).

    ``convert_to_openai_messages`` writes ``json.dumps(args, ensure_ascii=False)``, so
    that is what a budget counts. A lone surrogate in ``args`` would stay raw there,
    which memstore cannot store: that text keeps JSON's escapes (it reads back equal).
    """
    return unescaped_json(args)


def _tool_calls(calls: Sequence[dict[str, Any]]) -> list[ToolCall] | None:
    """The memstore tool calls standing exactly for LangChain's, else ``None``."""
    out: list[ToolCall] = []
    for c in calls:
        call_id, name, args = c.get("id"), c.get("name"), c.get("args")
        if not (isinstance(call_id, str) and isinstance(name, str) and isinstance(args, dict)):
            return None
        try:
            out.append(ToolCall(id=call_id, name=name, arguments=_arguments(args)))
        except (TypeError, ValueError, RecursionError):  # not JSON, or nested too deeply
            return None                                    # for it, or not a valid call
    if [_lc_call(c) for c in out] != list(calls):
        return None
    return out


def _lc_call(call: ToolCall) -> dict[str, Any]:
    return {"name": call.name, "args": json.loads(call.arguments), "id": call.id,
            "type": "tool_call"}


def _invalid_calls(invalid: Any, taken: set[str]) -> list[ToolCall]:
    """Memstore tool calls for LangChain's ``invalid_tool_calls`` (malformed arguments).

    The model did make these calls, and a ``ToolMessage`` may answer them: memstore
    must hold them as calls so the answer is not an orphan. Each one with a string
    ``id`` (not already used in the message), ``name`` and ``args`` becomes a call
    whose ``arguments`` are the ``args`` text, verbatim.
    """
    out: list[ToolCall] = []
    for c in invalid if isinstance(invalid, list) else ():
        if not isinstance(c, dict):
            continue
        call_id, name, args = c.get("id"), c.get("name"), c.get("args")
        if not (isinstance(call_id, str) and isinstance(name, str) and isinstance(args, str)):
            continue
        if call_id in taken:
            continue
        try:
            out.append(ToolCall(id=call_id, name=name, arguments=args))
        except ValueError:  # not a valid memstore call (an empty id…): kept in the stash only
            continue
        taken.add(call_id)
    return out


def _invalid_keys(invalid: Any) -> set[tuple[Any, Any, Any]]:
    """``(id, name, args)`` of the stashed ``invalid_tool_calls`` (to recognise their calls)."""
    if not isinstance(invalid, list):
        return set()
    keys = ((c.get("id"), c.get("name"), c.get("args")) for c in invalid if isinstance(c, dict))
    # (a stash another writer made may hold lists where strings belong: not hashable)
    return {k for k in keys if all(v is None or isinstance(v, str) for v in k)}


def _read_calls(calls: Sequence[ToolCall], invalid: Any
                ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """LangChain ``(tool_calls, invalid_tool_calls)`` for a message's memstore calls.

    Calls that stand for a stashed invalid call (``invalid``) are not tool calls; the
    stash itself gives them back. Any other call whose arguments are not a JSON object
    (a message LangChain did not write) is an invalid call.
    """
    skip = _invalid_keys(invalid)
    valid: list[dict[str, Any]] = []
    derived: list[dict[str, Any]] = []
    for c in calls:
        if (c.id, c.name, c.arguments) in skip:
            continue
        try:
            args = json.loads(c.arguments)
        except (ValueError, RecursionError):  # (nested deeper than this Python parses)
            args = None
        if isinstance(args, dict):
            valid.append({"name": c.name, "args": args, "id": c.id, "type": "tool_call"})
        else:
            derived.append({"name": c.name, "args": c.arguments, "id": c.id,
                            "error": None, "type": "invalid_tool_call"})
    return valid, derived


def _defaults(cls: type[BaseMessage]) -> dict[str, Any]:
    return {name: f.get_default(call_default_factory=True)
            for name, f in cls.model_fields.items() if not f.is_required()}


def to_memstore(message: BaseMessage) -> Message:
    """Convert a LangChain message into the memstore message that stores it.

    Raises:
        InvalidInputError: not a message memstore can store (``FunctionMessage``,
            ``RemoveMessage``, a ``ChatMessage`` with a role memstore does not have).
        pydantic.ValidationError: a value memstore cannot store (a NUL character,
            a non-JSON ``artifact``, a message over memstore's size limit, where
            an image block that is also kept in the stash counts twice…).
    """
    if not isinstance(message, BaseMessage):
        raise InvalidInputError(f"expected a LangChain BaseMessage, not {type(message).__name__}")
    data = message.model_dump()
    kind = data["type"]
    if kind in ("chat", "ChatMessageChunk"):
        role = data["role"]
        if role not in ("user", "assistant", "system", "developer"):
            raise InvalidInputError(
                f"ChatMessage role {shown(role)} has no memstore role "
                "(user, assistant, system, developer)"
            )
    elif kind in _ROLE_OF:
        role = _ROLE_OF[kind]
    else:
        raise InvalidInputError(
            f"LangChain {type(message).__name__} (type {shown(kind)}) cannot be stored: memstore "
            "keeps human, ai, system, tool and chat messages (use ToolMessage for results)"
        )
    extras = data.get("additional_kwargs") or {}
    if role == "system" and extras.get(_DEVELOPER) == "developer":
        role = "developer"
    defaults = _defaults(type(message))
    lc: dict[str, Any] = {k: v for k, v in data.items()
                          if k not in _CORE and (k not in defaults or v != defaults[k])}
    if kind != _TYPE_OF[role]:
        lc["type"] = kind
    content = _content(data["content"], role)
    if _canonical(content) != data["content"]:
        lc["content"] = data["content"]
    name = data.get("name")
    if name is not None and not valid_name(name):
        lc["name"] = name
        name = None
    if data.get("id") is not None:
        lc["id"] = data["id"]
    valid: list[ToolCall] = []
    if data.get("tool_calls"):
        exact = _tool_calls(data["tool_calls"])
        if exact is None:
            lc["tool_calls"] = data["tool_calls"]
        else:
            valid = exact
    elif "tool_calls" in data and data["tool_calls"] != defaults.get("tool_calls"):
        lc["tool_calls"] = data["tool_calls"]
    # invalid_tool_calls (malformed arguments) are calls too: stored as memstore calls
    # (so their ToolMessages are answers, not orphans) and, with their ``error``, kept
    # as the original list in the stash, from which they read back
    invalid = data.get("invalid_tool_calls")
    calls = valid + _invalid_calls(invalid, {c.id for c in valid}) or None
    if calls and "tool_calls" not in lc and _read_calls(calls, invalid)[0] != data["tool_calls"]:
        lc["tool_calls"] = data["tool_calls"]  # ambiguous (never in practice): stash them
    metadata: dict[str, Any] = {}
    if lc:
        metadata[_KEY] = lc
    if role == "tool" and data.get("status") == "error":
        metadata = with_hints(metadata, is_error=True)
    return Message(role=role, content=content, name=name, tool_calls=calls,
                   tool_call_id=data.get("tool_call_id") if role == "tool" else None,
                   metadata=metadata)


# ---- memstore -> LangChain -------------------------------------------------------------------


def _one(message: Message) -> BaseMessage:
    """The LangChain message ``message`` stores: from its stash, else from its fields.

    A stash LangChain cannot build a message from (written by another writer under
    the same key, or damaged) is ignored, so one bad row does not make every later
    read of the session fail.
    """
    stash = message.metadata.get(_KEY)
    if isinstance(stash, dict):
        try:
            return _built(message, stash)
        except (TypeError, ValueError, KeyError, AttributeError):
            pass
    return _built(message, None)


def _built(message: Message, stash: dict[str, Any] | None) -> BaseMessage:
    # a deep copy: LangChain code may change a message's dicts and lists (additional_kwargs,
    # response_metadata…), which must not reach the stored message (read-only when read
    # from a store, and shared with later reads)
    lc: dict[str, Any] = copy.deepcopy(dict(stash)) if stash is not None else {}
    kind = lc.pop("type", _TYPE_OF[message.role])
    data: dict[str, Any] = {"content": lc.pop("content") if "content" in lc
                            else _canonical(message.content)}
    data["name"] = lc.pop("name") if "name" in lc else message.name
    data["id"] = lc.pop("id", None)
    if kind in ("ai", "AIMessageChunk"):
        if "tool_calls" in lc:
            data["tool_calls"] = lc.pop("tool_calls")
        else:
            calls, invalid = _read_calls(message.tool_calls or (), lc.get("invalid_tool_calls"))
            data["tool_calls"] = calls
            if invalid and "invalid_tool_calls" not in lc:
                data["invalid_tool_calls"] = invalid
    if message.role == "tool":
        data["tool_call_id"] = message.tool_call_id
    if message.role == "developer" and kind == "system" and "additional_kwargs" not in lc:
        data["additional_kwargs"] = {_DEVELOPER: "developer"}
    if kind in ("chat", "ChatMessageChunk") and "role" not in lc:
        data["role"] = message.role
    data.update(lc)
    return messages_from_dict([{"type": kind, "data": data}])[0]


def from_memstore(messages: Iterable[Message]) -> list[BaseMessage]:
    """Convert memstore messages into LangChain messages (one for one)."""
    return [_one(m) for m in messages]


# ---- the history -----------------------------------------------------------------------------


class MemstoreChatMessageHistory(BaseChatMessageHistory):
    """A LangChain chat message history stored in memstore.

    ``messages`` / ``aget_messages()`` return the window of ``view`` (default: every
    complete unit) followed by the turn in progress: when the newest stored message
    is an ``AIMessage`` whose tool calls are not all answered, it comes back with the
    results stored so far, so the ``ToolMessage`` that ``RunnableWithMessageHistory``
    is about to add answers a call the model is shown. A budgeted view is charged
    for the turn in progress (its window gets that much less), so the whole history
    fits its ``token_limit``. A session that was never written is ``[]``.
    ``add_messages`` writes a batch in one transaction.

    Args:
        session_id: the memstore conversation id.
        store: a MemoryStore or an AsyncMemoryStore (async methods only).
        view: the view deciding what ``messages`` returns; default: every complete
            unit (``UnboundedView``).

    Example:
        >>> from memstore import MemoryStore, TokenLimitedView
        >>> from memstore.integrations.langchain import MemstoreChatMessageHistory
        >>> history = MemstoreChatMessageHistory(
        ...     "session-1", MemoryStore("sqlite://"), view=TokenLimitedView(token_limit=4000))
        >>> from langchain_core.messages import HumanMessage
        >>> history.add_messages([HumanMessage("Hello")])
        >>> [m.content for m in history.messages]
        ['Hello']
    """

    def __init__(self, session_id: str, store: AnyStore, *,
                 view: ContextView | None = None) -> None:
        super().__init__()
        self._store = check_store(store, "MemstoreChatMessageHistory")
        self._view = check_view(view, "MemstoreChatMessageHistory")
        self.session_id = check_conversation(self._store, session_id, self._view, "session_id")

    @property
    def store(self) -> AnyStore:
        """The store the history reads and writes."""
        return self._store

    @property
    def view(self) -> ContextView:
        """The view deciding what ``messages`` returns."""
        return self._view

    def _sync_store(self, method: str) -> MemoryStore:
        if isinstance(self._store, AsyncMemoryStore):
            raise ConfigurationError(
                f"MemstoreChatMessageHistory.{method} is synchronous but the store is an "
                "AsyncMemoryStore: use the async methods (aget_messages, aadd_messages, "
                "aclear; RunnableWithMessageHistory.ainvoke), or give a MemoryStore"
            )
        return self._store

    @property
    def messages(self) -> list[BaseMessage]:  # type: ignore[override]
        """The view's window plus the turn in progress, as LangChain messages.

        A budgeted view's window leaves room for the turn in progress: the messages
        returned fit its ``token_limit`` (with its ``reserve`` and tool schemas).

        Raises:
            ContextBudgetError: a budgeted view cannot fit the anchored messages, the
                newest unit and the turn in progress.
            ConfigurationError: the store is an AsyncMemoryStore (use aget_messages).
        """
        store = self._sync_store("messages")
        return from_memstore(read_history_sync(store, self.session_id, self._view))

    async def aget_messages(self) -> list[BaseMessage]:
        """Async `messages`."""
        return from_memstore(await read_history(self._store, self.session_id, self._view))

    def add_messages(self, messages: Sequence[BaseMessage]) -> None:
        """Store ``messages`` in one transaction (nothing is written if one is invalid)."""
        converted = [to_memstore(m) for m in messages]
        store = self._sync_store("add_messages")
        if converted:
            store.extend(self.session_id, converted)

    async def aadd_messages(self, messages: Sequence[BaseMessage]) -> None:
        """Async `add_messages()`."""
        converted = [to_memstore(m) for m in messages]
        if not converted:
            return
        if isinstance(self._store, AsyncMemoryStore):
            await self._store.extend(self.session_id, converted)
        else:
            self._store.extend(self.session_id, converted)

    def clear(self) -> None:
        """Delete every message of the session (a never-written one is a no-op)."""
        store = self._sync_store("clear")
        with contextlib.suppress(ConversationNotFoundError):
            store.clear(self.session_id)

    async def aclear(self) -> None:
        """Async `clear()`."""
        with contextlib.suppress(ConversationNotFoundError):
            if isinstance(self._store, AsyncMemoryStore):
                await self._store.clear(self.session_id)
            else:
                self._store.clear(self.session_id)


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
    """A LangChain ``StructuredTool`` an agent calls to search its memory in ``store``.

    The tool of `memstore.tools.search_tool()` (same arguments), as
    ``langchain_core.tools.StructuredTool`` with both a sync and an async call (a
    ``MemoryStore`` serves both; an ``AsyncMemoryStore`` only the async one)::

        model.bind_tools([search_tool(store)])
    """
    from langchain_core.tools import StructuredTool
    from pydantic import BaseModel, Field

    from memstore.tools import search_tool as _search_tool

    tool = _search_tool(store, conversation_id=conversation_id, where=where, limit=limit,
                        name=name, description=description)

    class SearchMemory(BaseModel):
        query: str = Field(description=tool.parameters["properties"]["query"]["description"])
        limit: int | None = Field(default=None, ge=1, le=1000,
                                  description=tool.parameters["properties"]["limit"][
                                      "description"])

    def run(query: str, limit: int | None = None) -> str:
        return tool.call(query, limit)

    async def arun(query: str, limit: int | None = None) -> str:
        return await tool.acall(query, limit)

    return StructuredTool.from_function(func=run, coroutine=arun, name=tool.name,
                                        description=tool.description,
                                        args_schema=SearchMemory)
