"""OpenAI Agents SDK integration: a memstore-backed ``Session`` for ``Runner.run``.

Install with ``pip install 'memstore[openai-agents]'``::

    from agents import Agent, Runner
    from memstore import AsyncMemoryStore, TokenLimitedView
    from memstore.integrations.openai_agents import MemstoreSession

    store = AsyncMemoryStore("sqlite:///agents.db")
    session = MemstoreSession("user-42", store, view=TokenLimitedView(8000))
    result = await Runner.run(agent, "Hello", session=session)

How items are stored. The SDK's items are Responses API input items. Each one is
kept verbatim (an equal dict comes back) in the ``metadata["openai_agents"]`` of the
memstore message that holds it, and the message's chat fields are the item's chat
equivalent, which is what memstore counts and windows:

- a user, system or developer message item → one message of that role;
- consecutive items of the model side in one ``add_items`` call — reasoning,
  assistant messages, function calls and any other item the model produced (hosted
  tool calls, ...) — → **one** assistant message: the text of its messages as
  content and one tool call per ``function_call`` (``call_id`` is the tool-call id),
  so parallel calls are one assistant message with several calls;
- a ``function_call_output`` → one tool message answering its ``call_id``.
  Other ``*_call``/``*_call_output`` pairs with a ``call_id`` (computer, shell,
  custom tools, ...) map the same way, so views never separate them either.
  The tool message's text is what the model receives of the output, which views
  count: text, shell ``stdout``/``stderr``; images (a tool's ``input_image``, a
  computer screenshot) and files as placeholders padded with filler to their price,
  since a memstore tool message holds text only; ``data:`` URLs are never counted
  as text (see `_output_text()`).

A session keeps what the runner hands it. A call or call output without a ``call_id``
(the SDK's own tests store ``{"type": "computer_call", "id": ..., "status":
"completed"}``) cannot be paired, so it is not a tool call: it is stored verbatim as
an item of its assistant message, like a hosted tool's item, and comes back equal.

Item ids are not used as message ids: the SDK reuses them (``"1"``, a scripted
model's constant id), so they are not idempotency keys. Each ``add_items`` call
starts new messages, except where the items' grouping demands one message: model
items written while the newest stored response is open — it holds calls not answered
yet (with tool approval the call is written, the run stops, and the rest comes in a
later call, possibly from another process) or ends with a reasoning item, which the
Responses API only accepts followed by its next item — are merged into it (see
``_is_open``). A tool call and its output written in different calls still form one
unit. ``get_items(limit=N)`` counts items, not messages: how items are grouped never
changes which of them it returns.
"""

from __future__ import annotations

import asyncio
import copy
import functools
import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, TypeVar

from pydantic import ValidationError

from memstore import (
    AsyncMemoryStore,
    ContextView,
    ImagePart,
    ImageURL,
    MemoryStore,
    Message,
    StoredMessage,
    TextPart,
    ToolCall,
)
from memstore.errors import ConversationNotFoundError, InvalidInputError
from memstore.integrations._common import (
    check_conversation,
    check_store,
    check_view,
    shown,
    unescaped_json,
)
from memstore.tokens import ApproxCounter, TokenCounter

__all__ = ["MemstoreSession", "items_to_messages", "messages_to_items", "search_tool"]

#: The metadata key holding a message's original items.
METADATA_KEY = "openai_agents"
_PAGE = 200
_T = TypeVar("_T")

Item = dict[str, Any]


# ---- items <-> messages --------------------------------------------------------------------


def _call_id(item: Mapping[str, Any]) -> str | None:
    """The ``call_id`` pairing a call item with its output, if it can be a tool-call id.

    ``None`` when the item has none, or one memstore cannot hold as a tool-call id
    (not a string, empty, too long, ...): such an item cannot become part of a
    tool-call unit and is stored as an opaque item of its response (see `_kind()`).
    Only a ``call_id`` pairs: an ``id`` is the item's own id, never the call it answers
    (``local_shell_call_output`` is paired by ``call_id`` too, as the SDK writes it).
    """
    call_id = item.get("call_id")
    if not isinstance(call_id, str) or not _holdable_call_id(call_id):
        return None
    return call_id


@functools.lru_cache(maxsize=4096)
def _holdable_call_id(call_id: str) -> bool:
    """Whether memstore can hold ``call_id`` as a tool-call id (asks the model itself)."""
    try:
        ToolCall(id=call_id, name="call")
    except ValidationError:
        return False
    return True


def _kind(item: Mapping[str, Any]) -> str:
    """``input`` (user/system/developer), ``output`` (a call's result) or ``model``.

    A call output is an ``output`` only with a ``call_id`` (`_call_id()`): one
    without (the SDK's own tests store ``{"type": "local_shell_call_output", "id": ...}``)
    cannot answer a call, and is kept like any other item the model side produced.

    Raises:
        InvalidInputError: a message item with an unknown role, or a non-string type.
    """
    item_type = item.get("type")
    if item_type is None or item_type == "message":
        role = item.get("role")
        if role in ("user", "system", "developer"):
            return "input"
        if role == "assistant":
            return "model"
        raise InvalidInputError(f"message item has an unknown role: {shown(role)}")
    if not isinstance(item_type, str):
        raise InvalidInputError(f"item type must be a string, got {shown(item_type)}")
    if item_type.endswith("_call_output") and _call_id(item) is not None:
        return "output"
    return "model"


def _is_call(item: Mapping[str, Any]) -> bool:
    """Whether ``item`` is a call that a tool-call unit pairs with its output.

    A ``*_call`` item without a usable ``call_id`` (a hosted ``computer_call`` stored
    by its ``id`` only, say) is not: it is kept verbatim in its response's message,
    like a ``web_search_call``, and needs no output.
    """
    item_type = item.get("type")
    return (isinstance(item_type, str) and item_type.endswith("_call")
            and _call_id(item) is not None)


def _is_output(item: Mapping[str, Any]) -> bool:
    """Whether ``item`` is a call output that answers a call (it has a ``call_id``)."""
    item_type = item.get("type")
    return (isinstance(item_type, str) and item_type.endswith("_call_output")
            and _call_id(item) is not None)


def _text_of(value: Any) -> str:
    """The text of a message item's content (strings, text parts, refusals)."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        texts = []
        for part in value:
            if isinstance(part, Mapping):
                text = part.get("text", part.get("refusal"))
                if isinstance(text, str):
                    texts.append(text)
        return "".join(texts)
    return json.dumps(value, sort_keys=True, default=str)


# ---- what a call output counts as -----------------------------------------------------------
#
# A call output is a tool message, and a memstore tool message holds text only. Its text
# is what the model receives of the output, so a view's budget counts it: text as it is
# (a shell call's stdout and stderr), an image or a file as a placeholder padded to what
# the model is charged for it (see `_padded()`). The stored item is what the SDK
# sends; the text is never sent by the session.

#: Prices images when no counter is given: every memstore counter prices an image by
#: GPT-4o's rule unless told otherwise, and this one needs no tokenizer.
_PRICE_COUNTER = ApproxCounter()
#: A filler unit: one token in OpenAI's encodings, one word for word counters.
_FILLER = " ."
#: How many tries `_padded()` gets to find the filler that counts a given price.
_PAD_TRIES = 4


def _cut_data_urls(value: Any) -> Any:
    """``value`` with every ``data:`` URL string replaced by its header (``data:...,…``)."""
    if isinstance(value, str):
        if value.startswith("data:") and "," in value:
            return value.split(",", 1)[0] + ",…"
        return value
    if isinstance(value, Mapping):
        return {k: _cut_data_urls(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_cut_data_urls(v) for v in value]
    return value


def _dumped(value: Any) -> str:
    """An output shape the session does not know: its JSON, without data URL payloads.

    Non-ASCII text unescaped (as it is counted in a string output), unless that text
    cannot be stored (a lone surrogate): then with JSON's escapes.
    """
    return unescaped_json(_cut_data_urls(value), sort_keys=True, default=str)


def _image_part(url: Any, detail: Any) -> ImagePart:
    """The image part pricing an image by ``url`` (a file id: an unreadable size)."""
    if not isinstance(url, str) or not url:
        url = "file:"  # an image by file id: priced as an image whose size is unknown
    return ImagePart(image_url=ImageURL(
        url=url, detail=detail if detail in ("auto", "low", "high") else None))


def _image_tokens(part: ImagePart, counter: TokenCounter | None) -> int:
    """What ``counter`` charges for ``part`` in a user message (default: GPT-4o's price)."""
    if counter is None:
        counter = _PRICE_COUNTER  # its image rule is GPT-4o's, the default
    with_image = counter.count_message(Message(role="user", content=[part]))
    return max(0, with_image - counter.count_message(Message(role="user", content=[])))


def _padded(label: str, tokens: int, counter: TokenCounter | None) -> str:
    """``[label]`` and filler that ``counter`` counts as at least ``tokens`` more tokens.

    memstore cannot give a tool message an image part or a token count of its own, so
    the placeholder is padded: without a counter, one filler unit per token (a token in
    OpenAI's encodings); with one, the filler is measured with it.
    """
    placeholder = f"[{label}]"
    if tokens <= 0:
        return placeholder
    if counter is None:
        return placeholder + _FILLER * tokens

    def extra(units: int) -> int:
        text = placeholder + _FILLER * units
        return (counter.count_message(Message(role="tool", tool_call_id="c", content=text))
                - counter.count_message(
                    Message(role="tool", tool_call_id="c", content=placeholder)))

    units = tokens
    for _ in range(_PAD_TRIES):
        got = extra(units)
        if got <= 0:  # the counter does not count this text: no filler can add tokens
            return placeholder
        if got == tokens:
            break
        units = max(1, -(-units * tokens // got))  # scaled to the measured rate, rounded up
    while extra(units) < tokens:  # never short of the price (the scaling may undershoot)
        units += max(1, units // 8)
    return placeholder + _FILLER * units


def _file_tokens(part: Mapping[str, Any]) -> int:
    """An estimate of what a file costs: a token per 4 bytes of its ``file_data``.

    The API charges the file's extracted text (and, for a PDF, an image of each page);
    neither can be read without parsing the file, so its size stands for it. A file by
    id or URL is not known here: 0.
    """
    data = part.get("file_data")
    if not isinstance(data, str) or not data:
        return 0
    payload = data.split(",", 1)[1] if data.startswith("data:") and "," in data else data
    return -(-(len(payload) * 3 // 4) // 4)


def _part_text(part: Any, counter: TokenCounter | None) -> str:
    """The counted text of one part of a call output's content list."""
    if isinstance(part, str):
        return part
    if not isinstance(part, Mapping):
        return _dumped(part)
    part_type = part.get("type")
    if part_type == "input_image":
        image = _image_part(part.get("image_url"), part.get("detail"))
        return _padded("input_image", _image_tokens(image, counter), counter)
    if part_type == "input_file":
        name = part.get("filename")
        label = f"input_file {name}" if isinstance(name, str) and name else "input_file"
        return _padded(label, _file_tokens(part), counter)
    text = part.get("text", part.get("refusal"))
    if isinstance(text, str):
        return text
    if "stdout" in part or "stderr" in part:  # a shell_call_output chunk
        return "".join(str(part.get(k) or "") for k in ("stdout", "stderr"))
    return _dumped(part)


def _output_text(item: Mapping[str, Any], counter: TokenCounter | None = None) -> str:
    """The text a call output item is counted as (what the model receives of it).

    Strings as they are; content lists (function and custom tool outputs, shell output
    chunks) part by part: text, shell ``stdout`` and ``stderr``, images and files as
    padded placeholders; a computer screenshot as an image; any other shape as its
    JSON with ``data:`` URL payloads cut out.
    """
    output = item.get("output")
    if output is None:
        return ""
    if isinstance(output, str):
        return output
    if isinstance(output, list):
        return "".join(_part_text(part, counter) for part in output)
    if isinstance(output, Mapping) and output.get("type") == "computer_screenshot":
        image = _image_part(output.get("image_url"), output.get("detail"))
        return _padded("computer_screenshot", _image_tokens(image, counter), counter)
    if isinstance(output, Mapping) and output.get("type") in ("input_image", "input_file",
                                                               "input_text"):
        return _part_text(output, counter)
    return _dumped(output)


def _input_content(item: Mapping[str, Any], role: str) -> Any:
    content = item.get("content")
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise InvalidInputError(f"{role} message item content must be a string or a list")
    parts: list[Any] = []
    for part in content:
        part_type = part.get("type") if isinstance(part, Mapping) else None
        if part_type in ("input_text", "output_text", "text"):
            parts.append(TextPart(text=str(part.get("text", ""))))
        elif (part_type == "input_image" and role == "user"
              and isinstance(part.get("image_url"), str)):
            detail = part.get("detail")
            image: dict[str, Any] = {"url": part["image_url"]}
            if detail in ("auto", "low", "high"):
                image["detail"] = detail
            parts.append({"type": "image_url", "image_url": image})
        else:
            # files, audio, images by file id: no chat equivalent; the item keeps them
            parts.append(TextPart(text=f"[{part_type or 'content'}]"))
    return parts


def _call_of(item: Mapping[str, Any]) -> ToolCall:
    arguments = item.get("arguments", item.get("input"))
    if not isinstance(arguments, str):
        rest = {k: v for k, v in item.items()
                if k not in ("type", "id", "call_id", "name", "status")}
        arguments = json.dumps(rest, sort_keys=True, default=str)
    name = item.get("name")
    return ToolCall(id=item["call_id"],
                    name=name if isinstance(name, str) and name else str(item["type"]),
                    arguments=arguments)


def _model_message(items: list[Item]) -> Message:
    texts = [_text_of(i.get("content")) for i in items
             if i.get("type") in (None, "message") and i.get("role") == "assistant"]
    calls = [_call_of(i) for i in items if _is_call(i)]
    return Message(role="assistant", content="".join(texts), tool_calls=calls or None,
                   metadata={METADATA_KEY: {"items": items}})


def _single_message(item: Item, counter: TokenCounter | None = None) -> Message:
    meta = {METADATA_KEY: {"items": [item]}}
    if _kind(item) == "output":
        return Message(role="tool", content=_output_text(item, counter),
                       tool_call_id=item["call_id"], metadata=meta)
    role = str(item["role"])
    return Message.model_validate({"role": role, "content": _input_content(item, role),
                                   "metadata": meta})


def _plain(item: Any) -> Item:
    """A JSON copy of an item (SDK items may be pydantic models or TypedDicts)."""
    if hasattr(item, "model_dump"):
        item = item.model_dump(exclude_unset=True)
    if not isinstance(item, Mapping):
        raise InvalidInputError(f"an item must be a dict, not {type(item).__name__}")
    try:
        plain = json.loads(json.dumps(item))
    except (TypeError, ValueError) as exc:
        raise InvalidInputError(f"an item must be JSON data: {exc}") from exc
    except RecursionError:
        raise InvalidInputError("an item must be JSON data: it is nested too deeply") from None
    if plain != item:
        raise InvalidInputError("an item must be JSON data (it changed in a JSON round trip)")
    return plain  # type: ignore[no-any-return]


def items_to_messages(items: Iterable[Any], *,
                      counter: TokenCounter | None = None) -> list[Message]:
    """Convert SDK input items to the memstore messages that store them.

    Consecutive items of the model side (assistant messages, reasoning, calls and any
    other item that is not an input message or a call output with a ``call_id``)
    become one assistant message; each user/system/developer item and each call
    output is a message of its own. A call or call output without a usable
    ``call_id`` is kept, verbatim, as an item of its assistant message: it cannot be
    paired, so it is not a tool call.

    A call output's tool message text is what the model receives of it (see the module
    doc): images and files in it are placeholders padded to their price, measured
    with ``counter`` (the session passes its store's); without one, GPT-4o's image
    price and one filler unit per token (a token in OpenAI's encodings).

    Raises:
        InvalidInputError: an item is not a JSON object, or is a message item with an
            unknown role.
        pydantic.ValidationError: an item's chat equivalent is invalid (e.g. one
            model response with two calls of the same ``call_id``).
    """
    messages: list[Message] = []
    group: list[Item] = []
    for raw in items:
        item = _plain(raw)
        if _kind(item) == "model":
            group.append(item)
            continue
        if group:
            messages.append(_model_message(group))
            group = []
        messages.append(_single_message(item, counter))
    if group:
        messages.append(_model_message(group))
    return messages


def _items_of(message: StoredMessage | Message) -> list[Item]:
    """The items a message was written from (or its equivalent items)."""
    data = message.metadata.get(METADATA_KEY)
    stashed = data.get("items") if isinstance(data, Mapping) else None
    # Another writer's metadata under the key (an empty list, items that are not
    # dicts) is not the session's: the message's equivalent items are used instead
    # (``pop_item`` took ``items[-1]`` of an empty list).
    if isinstance(stashed, list) and stashed and all(isinstance(i, Mapping) for i in stashed):
        return copy.deepcopy(stashed)  # type: ignore[arg-type]
    if message.role == "tool":
        return [{"type": "function_call_output", "call_id": message.tool_call_id,
                 "output": message.text}]
    if message.role == "assistant":
        items: list[Item] = []
        if message.text or not message.tool_calls:
            items.append({"role": "assistant", "content": message.text})
        for call in message.tool_calls or ():
            items.append({"type": "function_call", "call_id": call.id, "name": call.name,
                          "arguments": call.arguments})
        return items
    content: Any = message.content
    if isinstance(content, list):
        content = [{"type": "input_text", "text": p.text} if isinstance(p, TextPart)
                   else {"type": "input_image", "image_url": p.image_url.url,
                         "detail": p.image_url.detail or "auto"}
                   for p in content]
    return [{"role": message.role, "content": content}]


def messages_to_items(messages: Iterable[StoredMessage | Message]) -> list[Item]:
    """Convert memstore messages back to SDK input items (the stored items, verbatim).

    A message that the session did not write gets equivalent items: user/system/
    developer messages, an assistant message plus one ``function_call`` per tool call,
    and one ``function_call_output`` per tool message.
    """
    return [item for message in messages for item in _items_of(message)]


def _item_count(message: StoredMessage | Message) -> int:
    """How many items `messages_to_items()` makes of ``message`` (nothing copied)."""
    data = message.metadata.get(METADATA_KEY)
    if isinstance(data, Mapping) and isinstance(data.get("items"), list):
        return len(data["items"])  # type: ignore[arg-type]
    return len(_items_of(message))


def _is_model_group(message: StoredMessage) -> bool:
    data = message.metadata.get(METADATA_KEY)
    return (message.role == "assistant" and isinstance(data, Mapping)
            and isinstance(data.get("items"), list))


def _is_open(message: StoredMessage) -> bool:
    """Whether the newest stored message is a model response that later items must join.

    Two things make a response open, and only these (every other ``add_items`` call
    starts a message of its own, so a ``limit`` or a window can cut between them):

    - calls without their outputs yet: memstore's chat form needs a call's results
      right after the assistant message holding the call, so a later call or text of
      the same response (the SDK writes a response in more than one ``add_items``
      call around tool approval, and ``pop_item`` then ``add_items`` puts an item back)
      must join that message, or its outputs would answer a call that is not the one
      right before them;
    - a last item that is a ``reasoning`` item: the Responses API refuses a reasoning
      item without the item that follows it, so that item joins its message and no
      window or pin can keep one without the other.
    """
    if not _is_model_group(message):
        return False
    if message.tool_calls:
        return True  # the newest message: nothing after it answers its calls
    data = message.metadata.get(METADATA_KEY)
    items = data.get("items") if isinstance(data, Mapping) else None
    last = items[-1] if isinstance(items, list) and items else None
    return isinstance(last, Mapping) and last.get("type") == "reasoning"


# ---- the session ---------------------------------------------------------------------------


class MemstoreSession:
    """The OpenAI Agents SDK ``Session`` protocol over one memstore conversation.

    Without ``view``, ``get_items()`` returns every stored item, in order, exactly as
    it was added (like the SDK's ``SQLiteSession``). With a view, ``get_items()``
    returns the view's window — the token-budgeted history, whole tool-call units only
    (an unanswered call or a result without its call is left out, so the window stays
    valid for the model whatever the runner appends). Either way ``limit=N`` returns
    the newest ``N`` items (of the history, or of the window), however they are
    grouped into stored messages, and always ends with the newest one. It returns
    fewer only where the ``N`` newest would start inside a tool-call unit and hold an
    output whose call is cut off: then it starts at the first item after that cut
    that leaves no output without its call (the newest whole units that fit). It is
    empty only when the newest item alone is such an output. ``get_items(limit=0)``
    is ``[]``; a session that was never written is empty.

    Items without a chat equivalent (reasoning, web search calls, ...) are not
    counted toward a view's budget beyond their response's text and calls.

    Args:
        session_id: the memstore conversation id (created on the first write).
        store: a [`MemoryStore`][memstore.MemoryStore] (its calls run in a worker thread) or
            an [`AsyncMemoryStore`][memstore.AsyncMemoryStore].
        view: the view ``get_items()`` reads through (default: every stored item).
        session_settings: the SDK's ``SessionSettings`` (its ``limit`` is the default
            ``limit`` the runner passes), when the installed SDK has them.

    Raises:
        ConfigurationError: an invalid store or view.
    """

    def __init__(
        self,
        session_id: str,
        store: MemoryStore | AsyncMemoryStore,
        *,
        view: ContextView | None = None,
        session_settings: Any = None,
    ) -> None:
        self.store = check_store(store, "MemstoreSession")
        self.session_id: str = check_conversation(
            self.store, session_id, check_view(view, "MemstoreSession"), "session_id")
        self.view = view
        self.session_settings = session_settings

    # ---- running store calls -------------------------------------------------------------

    async def _call(self, name: str, *args: Any, **kwargs: Any) -> Any:
        method: Callable[..., Any] = getattr(self.store, name)
        if isinstance(self.store, AsyncMemoryStore):
            return await method(*args, **kwargs)
        return await asyncio.to_thread(method, *args, **kwargs)

    async def _or_empty(self, name: str, empty: _T, *args: Any, **kwargs: Any) -> Any:
        try:
            return await self._call(name, self.session_id, *args, **kwargs)
        except ConversationNotFoundError:
            return empty

    # ---- Session protocol ----------------------------------------------------------------

    async def get_items(self, limit: int | None = None) -> list[Item]:
        """The session's history as SDK input items, chronological.

        Args:
            limit: the newest this many items (fewer only to keep every output with
                its call, see the class doc); ``None``: all (or the view's whole
                window).

        Raises:
            ContextBudgetError: with a budgeted view, the anchored messages and the
                newest unit do not fit.
        """
        if limit is not None and (not isinstance(limit, int) or isinstance(limit, bool)
                                  or limit < 0):
            raise InvalidInputError(f"limit must be None or an integer >= 0, got {shown(limit)}")
        if limit == 0:
            return []
        if self.view is None:
            return await self._newest_items(limit)
        window = await self._or_empty("window", None, self.view)
        if window is None:
            return []
        items = messages_to_items(window.messages)
        return items if limit is None else _newest(items, limit)

    async def _newest_items(self, limit: int | None) -> list[Item]:
        if limit is None:
            pages: list[StoredMessage] = []
            start: int | None = None
            while True:
                page = await self._or_empty("messages", [], start=start, limit=_PAGE)
                pages.extend(page)
                if len(page) < _PAGE:
                    return messages_to_items(pages)
                start = page[-1].seq + 1
        # Newest pages until they hold ``limit`` items: which of them are returned
        # depends on them alone (an output whose call is older than the cut is cut
        # off with it), never on an older message.
        size = max(16, min(limit + 1, _PAGE))
        messages: list[StoredMessage] = []
        count = 0
        stop: int | None = None
        while True:
            page = await self._or_empty("messages", [], stop=stop, limit=size,
                                        newest_first=True)
            messages[:0] = reversed(page)
            count += sum(_item_count(m) for m in page)
            if len(page) < size or count >= limit:
                break
            stop = page[-1].seq
        return _newest(messages_to_items(messages), limit)

    async def add_items(self, items: list[Any]) -> None:
        """Store items at the end of the session.

        Each call's items are stored as new messages, with one exception: model items
        at the start of ``items`` are merged into the newest stored model response
        while that response is open — it holds calls whose outputs are not stored
        yet, or it ends with a reasoning item, which needs the item that follows it
        (see `_is_open()` for why). The response's message keeps its identity
        (see `pop_item()`). Any item is kept as it is given: one that cannot be
        part of a tool-call unit (a call or output without a ``call_id``, a hosted
        tool's item) is stored in its response's message and comes back equal.

        Raises:
            InvalidInputError: an item is not a JSON object or is a message item with
                an unknown role (nothing is written).
            pydantic.ValidationError: the items cannot be stored, e.g. a model response
                would hold two calls with one ``call_id`` (a retried write of the same
                call): nothing is written and nothing stored is changed.
        """
        plain = [_plain(item) for item in items]
        if not plain:
            return
        messages = items_to_messages(plain, counter=self.store.counter)
        if _kind(plain[0]) == "model":
            newest = await self._or_empty("messages", [], limit=1, newest_first=True)
            if newest and _is_open(newest[0]):
                await self._merge(newest[0].id, plain, messages)
                return
        await self._call("extend", self.session_id, messages)

    async def _merge(self, expected: str, plain: list[Item], unmerged: list[Message]) -> None:
        """Merge ``plain`` into the newest message, the response with id ``expected``.

        One transaction (``store.rewrite`` of the newest message): the merge is decided
        on the newest message as that transaction reads it, with the conversation
        locked. If it is no longer the expected open response (another writer stored a
        message after it, or took its open item back), that message is kept as it is
        and the items are appended after it, not merged. A merge that cannot be stored
        raises ``pydantic.ValidationError`` and changes nothing.
        """

        def merge(newest: list[StoredMessage]) -> list[Message]:
            if newest and newest[0].id == expected and _is_open(newest[0]):
                return self._rewrite(newest[0], items_to_messages(
                    _items_of(newest[0]) + plain, counter=self.store.counter))
            return [*newest, *unmerged]

        try:
            await self._call("rewrite", self.session_id, merge, newest=1)
        except ConversationNotFoundError:  # deleted meanwhile: the items start it again
            await self._call("extend", self.session_id, unmerged)

    def _rewrite(self, like: StoredMessage, messages: list[Message]) -> list[Message]:
        """``messages`` to store in place of ``like``; the first one keeps its identity.

        The first is ``like`` with the new chat fields: its id, ``created_at``, score,
        pin, name and metadata (the items stash replaced) stay. The others are new
        messages (a new id, the time of the write). Raises ``pydantic.ValidationError``
        when they cannot be stored.
        """
        first = _as_stored(messages[0], self.session_id, self.store.counter.name, {
            "id": like.id, "created_at": like.created_at, "score": like.score,
            "pinned": like.pinned, "name": like.name,
            "metadata": {**like.metadata, **messages[0].metadata}})
        return [first, *messages[1:]]

    async def pop_item(self) -> Item | None:
        """Remove and return the newest item (``None`` when the session is empty).

        When the newest message holds several items of one model response, it is
        rewritten without its last item and keeps its identity: the same message id,
        seq, ``created_at``, score, pin and metadata (only its items and the chat fields
        made from them change). One transaction (``store.rewrite`` of the newest
        message), so concurrent ``pop_item`` and ``add_items`` calls each see the
        session as the previous one left it.
        """
        popped: list[Item] = []

        def take_last(newest: list[StoredMessage]) -> list[Message]:
            popped.clear()
            if not newest:
                return []
            items = _items_of(newest[0])
            popped.append(items[-1])
            if len(items) == 1:
                return []
            # the items of one model response: items_to_messages makes them one message
            return self._rewrite(newest[0], items_to_messages(items[:-1],
                                                              counter=self.store.counter))

        await self._or_empty("rewrite", None, take_last, newest=1)
        return popped[0] if popped else None

    async def clear_session(self) -> None:
        """Delete every item of the session."""
        await self._or_empty("clear", 0)


def _as_stored(message: Message, conversation_id: str, counter: str,
               fields: Mapping[str, Any]) -> StoredMessage:
    """``message`` as a `StoredMessage` with ``fields`` set (validated).

    Its seq and token count are placeholders: ``store.rewrite`` gives it its seq and
    recounts it (with ``counter``, the store's).
    """
    return StoredMessage.model_validate({
        **{name: getattr(message, name) for name in Message.model_fields}, **fields,
        "conversation_id": conversation_id, "seq": 1, "token_count": 0,
        "token_counter": counter})


def _newest(items: Sequence[Item], limit: int) -> list[Item]:
    """The newest ``limit`` of ``items``, or fewer: never an output without its call.

    Items are counted one by one, whatever message holds them. The cut moves later
    (towards the newest item, which is always kept when anything is) only while the
    items after it hold an output whose call (the nearest call before it with its
    ``call_id``) is before the cut — or nowhere, as after a truncate: stored history
    can hold such an output, a window cannot. A unit's items before its call are
    not tied to it (a reasoning item may be cut off from the call it led to).
    """
    # paired[j]: for an output, the index of its call (-1: none before it)
    latest_call: dict[str, int] = {}
    paired: list[int | None] = []
    for index, item in enumerate(items):
        if _is_output(item):
            paired.append(latest_call.get(item["call_id"], -1))
            continue
        if _is_call(item):
            latest_call[item["call_id"]] = index
        paired.append(None)
    # the earliest cut ``start >= len - limit`` such that every output at or after it
    # has its call at or after it; ``bound`` is the earliest call those outputs need
    best = len(items)
    bound = len(items)
    for start in range(len(items) - 1, max(0, len(items) - limit) - 1, -1):
        call = paired[start]
        if call is not None:
            bound = min(bound, call)
        if start <= bound:
            best = start
    return list(items[best:])


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
    """A ``FunctionTool`` an Agents SDK agent calls to search its memory in ``store``.

    The tool of `memstore.tools.search_tool()` (same arguments), as the SDK's
    ``FunctionTool``: its JSON schema, and a call that returns the hits as compact JSON
    (an ``AsyncMemoryStore`` is awaited, a ``MemoryStore`` called directly)::

        agent = Agent(name="assistant", tools=[search_tool(store, where={"user": "u1"})])
    """
    from agents import FunctionTool

    from memstore.tools import search_tool as _search_tool

    tool = _search_tool(store, conversation_id=conversation_id, where=where, limit=limit,
                        name=name, description=description)

    async def invoke(context: Any, arguments: str) -> str:
        return await tool.arun(arguments)

    return FunctionTool(name=tool.name, description=tool.description,
                        params_json_schema=tool.parameters, on_invoke_tool=invoke,
                        strict_json_schema=False)
