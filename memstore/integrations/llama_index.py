"""LlamaIndex integration: a chat store and an agent memory stored in memstore.

Install with ``pip install 'memstore[llama-index]'`` (llama-index-core)::

    from llama_index.core.agent.workflow import FunctionAgent
    from memstore import MemoryStore, TokenLimitedView
    from memstore.integrations.llama_index import MemstoreMemory

    store = MemoryStore("sqlite:///agents.db")
    memory = MemstoreMemory("user-42", store, view=TokenLimitedView(token_limit=8000))
    response = await agent.run(user_msg="Hello", memory=memory)

Two classes, for the two places LlamaIndex keeps a conversation:

* `MemstoreMemory` is a ``llama_index.core.memory.BaseMemory``: what an agent
  (``FunctionAgent``, ``ReActAgent``, ``AgentWorkflow``) or a chat engine takes as
  ``memory=``. ``get()`` returns the window of its ``view``, read in time that grows
  with the window, not with the conversation; ``put()`` appends. Nothing is re-read or
  re-counted on a write.
* `MemstoreChatStore` is a ``llama_index.core.storage.chat_store.BaseChatStore``
  whose keys are memstore conversation ids: every abstract method, sync and async,
  with the list semantics LlamaIndex's own ``SimpleChatStore`` has (positions are
  list indexes into the key's whole history). It is what ``ChatMemoryBuffer`` and
  other chat-store memories read and write, and they read the whole history on every
  ``get()``: prefer `MemstoreMemory` for an agent.

Mapping (lossless both ways; `to_memstore()` / `from_memstore()`): a ``ChatMessage``
reads back equal to the message as LlamaIndex's own JSON gives it back
(``ChatMessage.model_validate_json(message.model_dump_json())``: ``additional_kwargs``
values that are pydantic models or bytes come back as their JSON).

* Roles: ``system``, ``developer``, ``user``, ``assistant`` and ``tool`` are memstore's
  roles; ``chatbot`` and ``model`` (other providers' assistants) are ``assistant``;
  ``function`` with ``additional_kwargs["tool_call_id"]`` is ``tool``; the role itself
  comes back as it was. A ``function`` message without a call id has no memstore role
  ([`InvalidInputError`][memstore.InvalidInputError]).
* ``TextBlock`` → text parts (one text block is a string content).
* ``ImageBlock`` in a user message, with an ``http(s)://`` or ``data:`` URL, or with
  ``image`` data of an ``image/...`` mime type → an image part (a ``data:`` URL),
  counted in every budget and sent by ``window.to_openai()``/``to_anthropic()``.
* ``ToolCallBlock`` in an assistant message, and OpenAI-style calls in
  ``additional_kwargs["tool_calls"]`` (``{"id", "function": {"name", "arguments"}}``,
  as LlamaIndex's OpenAI LLMs put them) → memstore tool calls, so a view keeps each
  call with its results. ``tool_kwargs`` become the JSON ``arguments`` (a string
  ``tool_kwargs`` is kept verbatim).
* A ``tool`` message's ``additional_kwargs["tool_call_id"]`` → ``tool_call_id``.
* Everything else — the other ``additional_kwargs``, blocks memstore has no part for
  (thinking, audio, video, documents, citations, cache points, images outside a user
  message or by local ``path``), and each block's own fields (mime type, detail, order) —
  is kept in ``metadata["llama_index"]``: no payload is stored twice. Blocks kept there
  only are not counted in token budgets: leave room for them with the view's ``reserve``.

Stores: with a [`MemoryStore`][memstore.MemoryStore] every method works (the async
ones call the store directly); with an [`AsyncMemoryStore`][memstore.AsyncMemoryStore]
use the async ones (what the agents call); the sync ones raise a
[`ConfigurationError`][memstore.ConfigurationError] saying so.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import json
import sys
import typing
from collections.abc import Callable, Coroutine, Iterable, Mapping
from pathlib import Path
from typing import Any, TypeVar, cast

from pydantic import PrivateAttr, TypeAdapter, ValidationError

from memstore import (
    AsyncMemoryStore,
    ContextView,
    Conversation,
    ImagePart,
    ImageURL,
    Message,
    StoredMessage,
    TextPart,
    ToolCall,
    UnboundedView,
)
from memstore.errors import (
    ConfigurationError,
    ConflictError,
    ContextBudgetError,
    ConversationNotFoundError,
    InvalidInputError,
    MissingDependencyError,
)
from memstore.integrations._common import (
    AnyStore,
    check_conversation,
    check_store,
    check_view,
    read_history,
    run,
    shown,
    unescaped_json,
)

try:
    from llama_index.core.base.llms.types import (
        ChatMessage,
        ContentBlock,
        ImageBlock,
    )
    from llama_index.core.memory.types import BaseMemory
    from llama_index.core.storage.chat_store.base import BaseChatStore
except ImportError as exc:  # pragma: no cover - exercised without the extra
    raise MissingDependencyError(
        "memstore.integrations.llama_index needs llama-index-core: "
        "pip install 'memstore[llama-index]'"
    ) from exc

__all__ = ["MemstoreChatStore", "MemstoreMemory", "from_memstore", "to_memstore"]

#: The metadata key holding what memstore's fields do not.
METADATA_KEY = "llama_index"
_T = TypeVar("_T")

#: LlamaIndex role -> memstore role (``function`` is handled on its own).
_ROLE_OF = {"system": "system", "developer": "developer", "user": "user",
            "assistant": "assistant", "tool": "tool", "chatbot": "assistant",
            "model": "assistant"}
_DETAILS = ("auto", "low", "high")
#: Each block's fields that memstore's own fields hold (its payload).
_TEXT, _CALL = ("text",), ("tool_call_id", "tool_name", "tool_kwargs")
_BLOCKS: TypeAdapter[Any] = TypeAdapter(ContentBlock)
#: block_type -> block class (for a block that no longer validates, below).
_BLOCK_CLASSES: dict[str, type[Any]] = {
    cls.model_fields["block_type"].default: cls
    for cls in typing.get_args(typing.get_args(ContentBlock)[0])
}


# ---- LlamaIndex -> memstore --------------------------------------------------------------


def _image_url(block: Mapping[str, Any]) -> tuple[str, str] | None:
    """``(url, field)`` for an image block memstore can hold as an image part, else ``None``.

    ``field`` is the block's field the URL stands for: ``url`` (an ``http(s)://`` or a
    base64 image ``data:`` URL) or ``image`` (base64 data of an ``image/...`` mime type,
    as a ``data:`` URL). A local ``path``, or data of an unknown mime type, is not
    something memstore's renderers could send.
    """
    url, data, mime = block.get("url"), block.get("image"), block.get("image_mimetype")
    if isinstance(url, str):
        lowered = url[:11].lower()
        if lowered.startswith(("http://", "https://")) or (
                lowered.startswith("data:image/") and ";base64," in url):
            return url, "url"
        return None
    if (isinstance(data, str) and data and isinstance(mime, str)
            and mime.lower().startswith("image/") and "," not in mime and ";" not in mime):
        return f"data:{mime};base64,{data}", "image"
    return None


def _call(block: Mapping[str, Any], taken: set[str]) -> ToolCall | None:
    """The memstore call standing for a ``ToolCallBlock``, else ``None`` (kept in the stash)."""
    call_id, name, kwargs = block.get("tool_call_id"), block.get("tool_name"), \
        block.get("tool_kwargs")
    if not isinstance(call_id, str) or call_id in taken or not isinstance(name, str):
        return None
    try:
        arguments = kwargs if isinstance(kwargs, str) else unescaped_json(kwargs)
        return ToolCall(id=call_id, name=name, arguments=arguments)
    except (TypeError, ValueError, RecursionError):  # (ValidationError is a ValueError)
        return None


def _openai_calls(additional: Mapping[str, Any], taken: set[str]) -> list[ToolCall]:
    """Memstore calls for OpenAI-style ``additional_kwargs["tool_calls"]`` (JSON form)."""
    out: list[ToolCall] = []
    items = additional.get("tool_calls")
    for item in items if isinstance(items, list) else ():
        if not isinstance(item, Mapping) or item.get("type", "function") != "function":
            continue
        function = item.get("function")
        if not isinstance(function, Mapping):
            continue
        call_id, name, arguments = item.get("id"), function.get("name"), \
            function.get("arguments", "{}")
        if not isinstance(call_id, str) or call_id in taken or not isinstance(name, str):
            continue
        try:
            if not isinstance(arguments, str):
                arguments = unescaped_json(arguments)
            out.append(ToolCall(id=call_id, name=name, arguments=arguments))
        except (TypeError, ValueError, RecursionError):
            continue
        taken.add(call_id)
    return out


def _openai_ids(additional: Any) -> set[str]:
    """The call ids in a stashed ``additional_kwargs["tool_calls"]``."""
    items = additional.get("tool_calls") if isinstance(additional, Mapping) else None
    return {item["id"] for item in items if isinstance(item, Mapping)
            and isinstance(item.get("id"), str)} if isinstance(items, list) else set()


def _without(block: Mapping[str, Any], keys: Iterable[str]) -> dict[str, Any]:
    return {k: v for k, v in block.items() if k not in keys}


def to_memstore(message: ChatMessage) -> Message:
    """Convert a LlamaIndex ``ChatMessage`` into the memstore message that stores it.

    Raises:
        InvalidInputError: not a ``ChatMessage``, a role memstore has none for
            (``function`` without a call id), a ``tool`` message without
            ``additional_kwargs["tool_call_id"]``, or ``additional_kwargs`` that
            LlamaIndex itself cannot write as JSON.
        pydantic.ValidationError: a value memstore cannot store (a NUL character,
            a JSON number PostgreSQL would change, a message over the size limit…).
    """
    if not isinstance(message, ChatMessage):
        raise InvalidInputError(
            f"expected a LlamaIndex ChatMessage, not {type(message).__name__}")
    try:
        data = message.model_dump(mode="json")
    except (ValueError, TypeError) as exc:  # (pydantic's serialization errors)
        raise InvalidInputError(f"the ChatMessage cannot be written as JSON: {exc}") from None
    kind = data["role"]
    additional: dict[str, Any] = data["additional_kwargs"]
    call_id = additional.get("tool_call_id")
    if kind == "function" and isinstance(call_id, str):
        role = "tool"
    elif kind in _ROLE_OF:
        role = _ROLE_OF[kind]
    else:
        raise InvalidInputError(
            f"ChatMessage role {shown(kind)} has no memstore role (a function message "
            "needs additional_kwargs['tool_call_id'])")
    if role == "tool":
        if not isinstance(call_id, str):
            raise InvalidInputError(
                "a tool ChatMessage needs additional_kwargs['tool_call_id'] (the call it "
                f"answers), got {shown(call_id)}")
        additional = _without(additional, ("tool_call_id",))
    parts: list[TextPart | ImagePart] = []
    calls: list[ToolCall] = []
    taken: set[str] = set()
    skeleton: list[dict[str, Any]] = []
    for block in data["blocks"]:
        kind_of_block = block.get("block_type")
        if kind_of_block == "text":
            parts.append(TextPart(text=block["text"]))
            skeleton.append({"$part": len(parts) - 1, **_without(block, _TEXT)})
            continue
        image = _image_url(block) if kind_of_block == "image" and role == "user" else None
        call = _call(block, taken) if kind_of_block == "tool_call" and \
            role == "assistant" else None
        if image is not None:
            url, field = image
            detail = block.get("detail")
            parts.append(ImagePart(image_url=ImageURL(
                url=url, detail=detail if detail in _DETAILS else None)))
            skeleton.append({"$part": len(parts) - 1, "$from": field,
                             **_without(block, (field,))})
        elif call is not None:
            calls.append(call)
            taken.add(call.id)
            entry = {"$call": len(calls) - 1, **_without(block, _CALL)}
            if isinstance(block.get("tool_kwargs"), str):
                entry["$raw"] = True
            skeleton.append(entry)
        else:
            skeleton.append(block)
    if role == "assistant":
        calls += _openai_calls(additional, taken)
    content: str | list[TextPart | ImagePart] | None
    if len(parts) == 1 and isinstance(parts[0], TextPart):
        content = parts[0].text
    elif parts:
        content = parts
    else:
        content = None if role == "assistant" else ""
    stash: dict[str, Any] = {}
    if kind != role:
        stash["role"] = kind
    if additional:
        stash["additional_kwargs"] = additional
    if _blocks(content, calls, additional, None) != data["blocks"]:
        stash["blocks"] = skeleton
    return Message(role=role, content=content, tool_calls=calls or None,
                   tool_call_id=call_id if role == "tool" else None,
                   metadata={METADATA_KEY: stash} if stash else {})


# ---- memstore -> LlamaIndex --------------------------------------------------------------


def _arguments(call: ToolCall, raw: bool) -> Any:
    """A ``ToolCallBlock``'s ``tool_kwargs`` for ``call``: its JSON object, else its text."""
    if raw:
        return call.arguments
    try:
        value = json.loads(call.arguments)
    except (ValueError, RecursionError):
        return call.arguments
    return value if isinstance(value, dict) else call.arguments


def _image_block(part: ImagePart) -> dict[str, Any]:
    """The JSON of the ``ImageBlock`` by URL that an image part stands for."""
    url, detail = part.image_url.url, part.image_url.detail
    try:
        return ImageBlock(url=url, detail=detail).model_dump(mode="json")
    except ValidationError:  # not a URL LlamaIndex takes (written by another writer)
        return {"block_type": "image", "image": None, "path": None, "url": url,
                "image_mimetype": None, "detail": detail}


def _blocks(content: str | list[Any] | None, calls: list[ToolCall],
            additional: Any, skeleton: Any) -> list[dict[str, Any]]:
    """The JSON blocks that memstore's fields (and the stash's ``skeleton``) stand for.

    Without a skeleton: the content's parts in order (a text block per text part, an
    ``ImageBlock`` by URL per image part), then a ``ToolCallBlock`` for each call that
    is not one of ``additional_kwargs["tool_calls"]``.
    """
    parts: list[Any] = [TextPart(text=content)] if isinstance(content, str) else \
        list(content or ())
    if skeleton is None:
        out: list[dict[str, Any]] = []
        for part in parts:
            if isinstance(part, TextPart):
                out.append({"block_type": "text", "text": part.text})
            else:
                out.append(_image_block(part))
        skip = _openai_ids(additional)
        out += [{"block_type": "tool_call", "tool_call_id": c.id, "tool_name": c.name,
                 "tool_kwargs": _arguments(c, False)} for c in calls if c.id not in skip]
        return out
    if not isinstance(skeleton, list):
        raise TypeError("the stashed blocks are not a list")
    built: list[dict[str, Any]] = []
    for entry in skeleton:
        rest = {k: v for k, v in entry.items() if not k.startswith("$")}
        if "$part" in entry:
            part = parts[entry["$part"]]
            if isinstance(part, TextPart):
                built.append({**rest, "text": part.text})
            elif entry.get("$from") == "image":
                built.append({**rest, "image": part.image_url.url.split(",", 1)[1]})
            else:
                built.append({**rest, "url": part.image_url.url})
        elif "$call" in entry:
            call = calls[entry["$call"]]
            built.append({**rest, "tool_call_id": call.id, "tool_name": call.name,
                          "tool_kwargs": _arguments(call, bool(entry.get("$raw")))})
        else:
            built.append(dict(entry))
    return built


def _block(data: dict[str, Any]) -> Any:
    """A content block from its JSON; one that no longer validates is built without checks.

    LlamaIndex checks that an ``ImageBlock``'s (or audio, video, document) ``path`` is a
    file, and that a ``url`` is a URL: a stored message must still read back when the
    file has been moved, or when another writer stored an image by another kind of URL.
    """
    try:
        return _BLOCKS.validate_python(data)
    except ValidationError:
        cls = _BLOCK_CLASSES.get(data.get("block_type", ""))
        if cls is None:
            raise
        fields = {k: v for k, v in data.items() if k in cls.model_fields}
        if isinstance(fields.get("path"), str):
            fields["path"] = Path(fields["path"])
        return cls.model_construct(**fields)


def _one(message: Message) -> ChatMessage:
    """The ``ChatMessage`` ``message`` stores: from its stash, else from its fields.

    A stash that does not build a message (written by another writer under the same
    key, or damaged) is ignored, so one bad row does not fail every later read.
    """
    stash = message.metadata.get(METADATA_KEY)
    if isinstance(stash, dict):
        try:
            return _built(message, stash)
        except (TypeError, ValueError, KeyError, IndexError, AttributeError):
            pass
    return _built(message, None)


def _built(message: Message, stash: dict[str, Any] | None) -> ChatMessage:
    # a deep copy: LlamaIndex code changes messages in place (an agent's state prompt
    # rewrites the last text block), which must not reach the stored message
    lx: dict[str, Any] = copy.deepcopy(stash) if stash is not None else {}
    additional = lx.get("additional_kwargs", {})
    if not isinstance(additional, dict):
        raise TypeError("the stashed additional_kwargs are not an object")
    if stash is None and message.name is not None:  # (written by another adapter)
        additional["name"] = message.name
    if message.role == "tool":
        additional["tool_call_id"] = message.tool_call_id
    blocks = _blocks(message.content, list(message.tool_calls or ()), additional,
                     lx.get("blocks"))
    role = lx.get("role", message.role)
    return ChatMessage(role=role, additional_kwargs=additional,
                       blocks=[_block(b) for b in blocks])


def from_memstore(messages: Iterable[Message]) -> list[ChatMessage]:
    """Convert memstore messages into LlamaIndex ``ChatMessage`` objects (one for one)."""
    return [_one(m) for m in messages]


# ---- running the same code on both stores ------------------------------------------------


def _now(coroutine: Coroutine[Any, Any, _T]) -> _T:
    """Run a coroutine over a MemoryStore to its end: such a coroutine never suspends."""
    try:
        coroutine.send(None)
    except StopIteration as done:
        return cast(_T, done.value)
    coroutine.close()
    raise AssertionError("a MemoryStore call suspended")  # pragma: no cover


def _sync(store: AnyStore, owner: str, method: str) -> None:
    if isinstance(store, AsyncMemoryStore):
        raise ConfigurationError(
            f"{owner}.{method} is synchronous but the store is an AsyncMemoryStore: use "
            f"the async methods (what LlamaIndex's agents call), or give a MemoryStore")


class _Moved(Exception):
    """The conversation changed between reading its bounds and rewriting it: read again."""


#: Conversations per page of ``get_keys()``.
_PAGE = 1000
#: How often a positional write reads the conversation's bounds again after a race.
_TRIES = 8


async def _rewrite(store: AnyStore, cid: str,
                   fn: Callable[[list[StoredMessage]], list[Message]], newest: int | None) -> None:
    await run(store, lambda s: s.rewrite(cid, fn, newest=newest))


async def _conversations(store: AnyStore, after: str | None) -> list[Conversation]:
    return await run(store, lambda s: s.list_conversations(_PAGE, after))


async def _bounds(store: AnyStore, cid: str) -> tuple[int, int] | None:
    """``(first seq, last seq)`` of a conversation's messages; ``None`` when it has none."""
    oldest = await run(store, lambda s: s.messages(cid, limit=1))
    newest = await run(store, lambda s: s.messages(cid, limit=1, newest_first=True))
    if not oldest or not newest:
        return None
    return oldest[0].seq, newest[0].seq


async def _at(store: AnyStore, cid: str, position: Callable[[int], int | None],
              change: Callable[[list[StoredMessage]], list[Message]]) -> bool:
    """Rewrite the conversation from the message at ``position(count)`` on.

    ``change`` gets the messages from that one to the newest (under the conversation's
    lock) and returns their replacement. ``False`` when ``position`` is ``None`` (out of
    range) or the conversation holds no messages. The position is a seq computed from
    the bounds read first; a write landing in between is detected inside the rewrite,
    and the bounds are read again.
    """
    for _ in range(_TRIES):
        bounds = await _bounds(store, cid)
        if bounds is None:
            return False
        first, last = bounds
        index = position(last - first + 1)
        if index is None:
            return False
        seq = first + index

        def fn(messages: list[StoredMessage], seq: int = seq,
               last: int = last) -> list[Message]:
            if not messages or messages[0].seq != seq or messages[-1].seq != last:
                raise _Moved
            return change(messages)

        try:
            await _rewrite(store, cid, fn, last - seq + 1)
        except (_Moved, ConversationNotFoundError):
            continue
        return True
    raise ConflictError(
        f"conversation {cid!r} kept changing while a message was inserted or deleted at "
        f"a position ({_TRIES} tries)")


async def _replace(store: AnyStore, cid: str, messages: list[Message]) -> None:
    """Make the conversation hold exactly ``messages``, in one transaction."""
    for _ in range(2):
        try:
            await _rewrite(store, cid, lambda _: list(messages), None)
            return
        except ConversationNotFoundError:
            if not messages:
                return
            with contextlib.suppress(ConflictError):  # created meanwhile: rewrite it
                await run(store, lambda s: s.create_conversation(cid))
    raise ConversationNotFoundError(f"conversation {cid!r} was deleted while it was set")


# ---- the chat store ----------------------------------------------------------------------

#: The view a key is checked with (``check_conversation`` needs one; nothing is read).
_ALL = UnboundedView()


def _key(store: AnyStore, key: Any) -> str:
    return check_conversation(store, key, _ALL, "key")


class MemstoreChatStore(BaseChatStore):
    """A LlamaIndex chat store whose keys are memstore conversation ids.

    Each key's messages are the conversation's stored messages, oldest first, and an
    index is a position in that list (Python's: ``-1`` is the newest). A key exists
    while its conversation holds a message: ``get_keys()`` lists those, and
    ``delete_messages()`` empties the conversation in one transaction (its row, with
    its metadata, stays). Every write is one transaction; ``set_messages()`` and the
    positional writes (``add_message(..., idx=)``, ``delete_message()``) rewrite the
    messages from that position on under the conversation's lock, so an append from
    another process is never lost.

    ``get_messages()`` returns a key's whole history, as LlamaIndex's chat stores do:
    the memories built on a chat store (``ChatMemoryBuffer``…) read all of it on every
    turn. For an agent, `MemstoreMemory` reads only its view's window.

    Args:
        store: a MemoryStore, or an AsyncMemoryStore (async methods only).

    Example:
        >>> from llama_index.core.llms import ChatMessage
        >>> from memstore import MemoryStore
        >>> from memstore.integrations.llama_index import MemstoreChatStore
        >>> chats = MemstoreChatStore(MemoryStore("sqlite://"))
        >>> chats.add_message("user-1", ChatMessage(role="user", content="Hello"))
        >>> [m.content for m in chats.get_messages("user-1")], chats.get_keys()
        (['Hello'], ['user-1'])
    """

    _store: AnyStore = PrivateAttr()

    def __init__(self, store: AnyStore) -> None:
        checked = check_store(store, "MemstoreChatStore")
        super().__init__()
        self._store = checked

    @classmethod
    def class_name(cls) -> str:
        """The name LlamaIndex serializes the class by."""
        return "MemstoreChatStore"

    @property
    def store(self) -> AnyStore:
        """The store the chat store reads and writes."""
        return self._store

    def _sync(self, method: str) -> None:
        _sync(self._store, "MemstoreChatStore", method)

    # -- async (the implementation) --

    async def aset_messages(self, key: str, messages: list[ChatMessage]) -> None:
        """Make ``key`` hold exactly ``messages`` (one transaction)."""
        cid = _key(self._store, key)
        await _replace(self._store, cid, [to_memstore(m) for m in messages])

    async def aget_messages(self, key: str) -> list[ChatMessage]:
        """Every message of ``key``, oldest first (``[]`` for an unknown key)."""
        cid = _key(self._store, key)
        return from_memstore(await run(self._store, lambda s: s.messages(cid)))

    async def async_add_message(self, key: str, message: ChatMessage,
                                idx: int | None = None) -> None:
        """Append ``message`` to ``key``, or insert it before index ``idx``.

        ``idx`` is ``list.insert``'s: negative counts from the end, and past either
        end means the start or the end.
        """
        cid = _key(self._store, key)
        converted = to_memstore(message)
        if idx is not None:
            if isinstance(idx, bool) or not isinstance(idx, int):
                raise InvalidInputError(f"idx must be an int or None, got {shown(idx)}")

            def position(count: int) -> int | None:
                at = max(0, idx + count) if idx < 0 else idx
                return at if at < count else None

            if await _at(self._store, cid, position, lambda ms: [converted, *ms]):
                return
        await run(self._store, lambda s: s.append(cid, converted))

    async def adelete_messages(self, key: str) -> list[ChatMessage] | None:
        """Delete every message of ``key`` and return them (``None``: it held none)."""
        cid = _key(self._store, key)
        try:
            removed = await run(self._store, lambda s: s.pop(cid, sys.maxsize))
        except ConversationNotFoundError:
            return None
        return from_memstore(removed) if removed else None

    async def adelete_message(self, key: str, idx: int) -> ChatMessage | None:
        """Delete the message at index ``idx`` of ``key`` and return it.

        ``None`` (nothing deleted) when the key holds no message at ``idx``: an index
        is a Python list index, so ``-1`` is the newest and ``-len - 1`` is out of range.
        """
        cid = _key(self._store, key)
        if isinstance(idx, bool) or not isinstance(idx, int):
            raise InvalidInputError(f"idx must be an int, got {shown(idx)}")
        removed: list[StoredMessage] = []

        def position(count: int) -> int | None:
            at = idx + count if idx < 0 else idx
            return at if 0 <= at < count else None

        def change(messages: list[StoredMessage]) -> list[Message]:
            removed[:] = messages[:1]
            return list(messages[1:])

        if not await _at(self._store, cid, position, change):
            return None
        return from_memstore(removed)[0]

    async def adelete_last_message(self, key: str) -> ChatMessage | None:
        """Delete the newest message of ``key`` and return it (``None``: it holds none)."""
        cid = _key(self._store, key)
        try:
            removed = await run(self._store, lambda s: s.pop(cid, 1))
        except ConversationNotFoundError:
            return None
        return from_memstore(removed)[0] if removed else None

    async def aget_keys(self) -> list[str]:
        """The ids of the conversations that hold messages, in the database's id order."""
        keys: list[str] = []
        after: str | None = None
        while True:
            page = await _conversations(self._store, after)
            keys += [c.id for c in page if c.message_count > 0]
            if len(page) < _PAGE:
                return keys
            after = page[-1].id

    # -- sync --

    def set_messages(self, key: str, messages: list[ChatMessage]) -> None:
        """Make ``key`` hold exactly ``messages`` (one transaction)."""
        self._sync("set_messages")
        _now(self.aset_messages(key, messages))

    def get_messages(self, key: str) -> list[ChatMessage]:
        """Every message of ``key``, oldest first (``[]`` for an unknown key)."""
        self._sync("get_messages")
        return _now(self.aget_messages(key))

    def add_message(self, key: str, message: ChatMessage, idx: int | None = None) -> None:
        """Append ``message`` to ``key``, or insert it before index ``idx``."""
        self._sync("add_message")
        _now(self.async_add_message(key, message, idx))

    def delete_messages(self, key: str) -> list[ChatMessage] | None:
        """Delete every message of ``key`` and return them (``None``: it held none)."""
        self._sync("delete_messages")
        return _now(self.adelete_messages(key))

    def delete_message(self, key: str, idx: int) -> ChatMessage | None:
        """Delete the message at (Python list) index ``idx`` of ``key`` and return it."""
        self._sync("delete_message")
        return _now(self.adelete_message(key, idx))

    def delete_last_message(self, key: str) -> ChatMessage | None:
        """Delete the newest message of ``key`` and return it (``None``: it holds none)."""
        self._sync("delete_last_message")
        return _now(self.adelete_last_message(key))

    def get_keys(self) -> list[str]:
        """The ids of the conversations that hold messages."""
        self._sync("get_keys")
        return _now(self.aget_keys())


# ---- the memory --------------------------------------------------------------------------


def _with_room(view: ContextView, tokens: Any) -> ContextView:
    """``view`` with ``tokens`` more reserve, when it is a budgeted view with a reserve.

    Raises:
        ContextBudgetError: the reserve and ``tokens`` leave nothing of ``token_limit``.
    """
    if (isinstance(tokens, bool) or not isinstance(tokens, int) or tokens <= 0
            or not view.budgeted or not dataclasses.is_dataclass(view)
            or not {"reserve", "token_limit"} <= {f.name for f in dataclasses.fields(view)}):
        return view
    limit, reserve = cast(Any, view).token_limit, cast(Any, view).reserve
    if reserve + tokens >= limit:
        raise ContextBudgetError(
            f"{type(view).__name__}: initial_token_count ({tokens}) and reserve ({reserve}) "
            f"leave nothing of token_limit ({limit}) for the history",
            required=reserve + tokens, budget=limit)
    return cast(ContextView, dataclasses.replace(cast(Any, view), reserve=reserve + tokens))


class MemstoreMemory(BaseMemory):
    """A LlamaIndex memory stored in memstore: give it to an agent or a chat engine.

    ``get()`` / ``aget()`` return the window of ``view`` (default: every complete
    unit) as ``ChatMessage`` objects, read in time that grows with the window, not with
    the conversation, followed by the turn in progress (an assistant message whose tool
    calls are not all answered, with the results stored so far) while it is the newest
    unit. A budgeted view is charged for that turn, and for ``initial_token_count``
    (tokens a chat engine puts before the history), so what ``get()`` returns fits its
    ``token_limit``. ``put()`` appends one message, ``put_messages()`` several in one
    transaction; ``set()`` replaces the conversation in one transaction; ``reset()``
    deletes its messages. A conversation that was never written is ``[]``.

    Args:
        conversation_id: the memstore conversation.
        store: a MemoryStore or an AsyncMemoryStore (async methods only; what
            LlamaIndex's agents call).
        view: the view deciding what ``get()`` returns; default: every complete unit
            (``UnboundedView``).

    Example:
        >>> from llama_index.core.llms import ChatMessage
        >>> from memstore import MemoryStore, TokenLimitedView
        >>> from memstore.integrations.llama_index import MemstoreMemory
        >>> memory = MemstoreMemory("user-1", MemoryStore("sqlite://"),
        ...                         view=TokenLimitedView(token_limit=4000))
        >>> memory.put(ChatMessage(role="user", content="Hello"))
        >>> [m.content for m in memory.get()]
        ['Hello']
    """

    conversation_id: str
    _store: AnyStore = PrivateAttr()
    _view: ContextView = PrivateAttr()

    def __init__(self, conversation_id: str, store: AnyStore, *,
                 view: ContextView | None = None) -> None:
        checked_store = check_store(store, "MemstoreMemory")
        checked_view = check_view(view, "MemstoreMemory")
        cid = check_conversation(checked_store, conversation_id, checked_view,
                                 "conversation_id")
        super().__init__(conversation_id=cid)
        self._store = checked_store
        self._view = checked_view

    @classmethod
    def class_name(cls) -> str:
        """The name LlamaIndex serializes the class by."""
        return "MemstoreMemory"

    @classmethod
    def from_defaults(cls, conversation_id: str | None = None, store: AnyStore | None = None,
                      *, view: ContextView | None = None,
                      chat_history: list[ChatMessage] | None = None,
                      **kwargs: Any) -> MemstoreMemory:
        """A memory on ``store``'s ``conversation_id``, replaced by ``chat_history`` if given.

        Raises:
            ConfigurationError: ``conversation_id`` or ``store`` missing, or an argument
                LlamaIndex passes to its own memories (``llm``, ``token_limit``…):
                the budget is the ``view``'s.
        """
        if kwargs:
            raise ConfigurationError(
                f"MemstoreMemory.from_defaults takes conversation_id, store, view and "
                f"chat_history, not {', '.join(sorted(kwargs))} (the budget is the view's)")
        if conversation_id is None or store is None:
            raise ConfigurationError("MemstoreMemory.from_defaults needs conversation_id "
                                     "and store")
        memory = cls(conversation_id, store, view=view)
        if chat_history is not None:
            memory.set(chat_history)
        return memory

    @property
    def store(self) -> AnyStore:
        """The store the memory reads and writes."""
        return self._store

    @property
    def view(self) -> ContextView:
        """The view deciding what ``get()`` returns."""
        return self._view

    def _sync(self, method: str) -> None:
        _sync(self._store, "MemstoreMemory", method)

    # -- async (the implementation) --

    async def aget(self, input: str | None = None, **kwargs: Any) -> list[ChatMessage]:
        """The view's window and the turn in progress.

        Args:
            input: the user's input (LlamaIndex passes it; the window does not use it).
            **kwargs: ``initial_token_count``: tokens sent before the history, charged
                to a budgeted view's reserve. Others are ignored.

        Raises:
            ContextBudgetError: a budgeted view cannot fit its anchored messages, the
                newest unit and the turn in progress.
        """
        view = _with_room(self._view, kwargs.get("initial_token_count"))
        return from_memstore(await read_history(self._store, self.conversation_id, view))

    async def aget_all(self) -> list[ChatMessage]:
        """Every stored message of the conversation, oldest first."""
        cid = self.conversation_id
        return from_memstore(await run(self._store, lambda s: s.messages(cid)))

    async def aput(self, message: ChatMessage) -> None:
        """Append one message."""
        converted, cid = to_memstore(message), self.conversation_id
        await run(self._store, lambda s: s.append(cid, converted))

    async def aput_messages(self, messages: list[ChatMessage]) -> None:
        """Append messages in one transaction (nothing is written if one is refused)."""
        converted, cid = [to_memstore(m) for m in messages], self.conversation_id
        if converted:
            await run(self._store, lambda s: s.extend(cid, converted))

    async def aset(self, messages: list[ChatMessage]) -> None:
        """Make the conversation hold exactly ``messages`` (one transaction)."""
        await _replace(self._store, self.conversation_id, [to_memstore(m) for m in messages])

    async def areset(self) -> None:
        """Delete every message (the conversation stays; a never-written one is a no-op)."""
        cid = self.conversation_id
        with contextlib.suppress(ConversationNotFoundError):
            await run(self._store, lambda s: s.clear(cid))

    # -- sync --

    def get(self, input: str | None = None, **kwargs: Any) -> list[ChatMessage]:
        """The view's window and the turn in progress (see `aget()`)."""
        self._sync("get")
        return _now(self.aget(input, **kwargs))

    def get_all(self) -> list[ChatMessage]:
        """Every stored message of the conversation, oldest first."""
        self._sync("get_all")
        return _now(self.aget_all())

    def put(self, message: ChatMessage) -> None:
        """Append one message."""
        self._sync("put")
        _now(self.aput(message))

    def put_messages(self, messages: list[ChatMessage]) -> None:
        """Append messages in one transaction."""
        self._sync("put_messages")
        _now(self.aput_messages(messages))

    def set(self, messages: list[ChatMessage]) -> None:
        """Make the conversation hold exactly ``messages`` (one transaction)."""
        self._sync("set")
        _now(self.aset(messages))

    def reset(self) -> None:
        """Delete every message of the conversation."""
        self._sync("reset")
        _now(self.areset())
