"""Provider request formats: a window as Anthropic Messages or OpenAI Responses input.

memstore stores messages in OpenAI's chat format
([`Message.to_openai()`][memstore.Message.to_openai],
[`ContextWindow.to_openai()`][memstore.ContextWindow.to_openai]). This module renders the same
messages for the
other two request shapes agents use, and reads Anthropic messages back:

* `to_anthropic()` (``ContextWindow.to_anthropic()``): ``{"system": [...],
  "messages": [...]}`` for the Anthropic Messages API. System and developer
  messages are lifted, in order, into ``system`` as text blocks (``system`` is left
  out when there are none). Tool calls become ``tool_use`` blocks, tool results
  ``tool_result`` blocks in a user turn, and consecutive turns of the same role are
  merged into one (Anthropic requires alternating turns). Images become image
  blocks (in user turns and inside tool results): a ``data:`` URI a ``base64``
  source, any other URL a ``url`` source. Empty text is left out (Anthropic
  rejects empty text blocks), and a message left with no block at all is skipped.
  ``name`` has no Anthropic field and is dropped. The first turn is a user turn:
  a leading assistant turn gets a ``"(continued)"`` user turn before it, or is
  dropped or refused (``leading_assistant=``).
* `from_anthropic()` (``Message.from_anthropic()``): one Anthropic message
  param → a list of memstore messages. A user turn may hold several
  ``tool_result`` blocks: each becomes its own ``tool`` message (memstore keeps one
  result per message, its text and images), and the text and image blocks around
  them become user messages, in their order. An assistant turn's thinking blocks
  are kept, unchanged, as the message's ``thinking`` hint.
* `to_responses()` (``ContextWindow.to_responses()``): OpenAI Responses API
  input items: ``message`` items for text and images, one ``function_call`` item
  per tool call and one ``function_call_output`` item per tool result.

Rendering hints live in a message's metadata under ``metadata["memstore"]``
(`HINTS_KEY`), the one place memstore itself reads metadata from; set them
with `with_hints()`:

* ``cache_control``: an Anthropic cache-control object (``{"type": "ephemeral"}``,
  optionally with ``"ttl": "5m"`` or ``"1h"``, nothing else: `check_cache_control()`)
  marking a prompt-cache breakpoint. `to_anthropic()` puts it on the message's last
  content block; the ``ContextBuilder`` stamps it on a block's last message. OpenAI
  caches prompt prefixes by itself, so ``ContextWindow.to_openai()`` and
  `to_responses()` leave it out.
* ``is_error``: ``True`` on a tool result that reports a failure;
  `to_anthropic()` sets the ``tool_result`` block's ``is_error``.
* ``thinking``: an assistant message's Anthropic ``thinking``/``redacted_thinking``
  blocks (`thinking_of()`), which `to_anthropic()` sends back first in its turn,
  byte for byte; the OpenAI renderings leave them out.

`from_anthropic()` sets all three from the blocks it reads.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Mapping
from typing import Any, Literal

from memstore._validate import check_json, short_repr
from memstore.errors import InvalidInputError, MemstoreError
from memstore.models import ImagePart, Message, TextPart, ToolCall
from memstore.models.message import (
    CACHE_TTLS,
    HINTS_KEY,
    TOOL_IMAGE_OMITTED,
    _hints,
    check_cache_control,
    check_thinking,
    from_anthropic,
    with_hints,
)

__all__ = [
    "ANTHROPIC_IMAGE_TYPES",
    "CACHE_TTLS",
    "HINTS_KEY",
    "LEADING_USER_TEXT",
    "TOOL_IMAGE_OMITTED",
    "LeadingAssistant",
    "cache_control_of",
    "check_cache_control",
    "check_thinking",
    "from_anthropic",
    "is_error_of",
    "thinking_of",
    "to_anthropic",
    "to_responses",
    "with_cache_control",
    "with_hints",
]

#: Image media types the Anthropic Messages API accepts in a base64 source.
ANTHROPIC_IMAGE_TYPES = frozenset({"image/jpeg", "image/png", "image/gif", "image/webp"})

#: The text of the user turn `to_anthropic()` puts before a leading assistant turn
#: (``leading_assistant="insert"``, the default).
LEADING_USER_TEXT = "(continued)"

#: What `to_anthropic()` does when the first turn would be an assistant turn:
#: ``"insert"`` a user turn before it, ``"drop"`` the leading assistant turns with the
#: tool results answering them, ``"raise"`` `InvalidInputError`, or ``"keep"`` it.
LeadingAssistant = Literal["insert", "drop", "raise", "keep"]
_LEADING_CHOICES = ("insert", "drop", "raise", "keep")

_DATA_URI = re.compile(r"^data:(?P<type>[\w.+-]+/[\w.+-]+)(?:;[^,;]*)*;base64,(?P<data>.*)$", re.S)



def cache_control_of(message: Message) -> dict[str, Any] | None:
    """The cache-control object stamped on ``message``, or ``None``.

    Raises:
        InvalidInputError: ``metadata["memstore"]["cache_control"]`` is not an object
            Anthropic accepts (``{"type": "ephemeral"}``, optionally with ``"ttl"``
            ``"5m"`` or ``"1h"``; see `check_cache_control()`), naming the message.
    """
    value = _hints(message.metadata).get("cache_control")
    if value is None:
        return None
    where = f'metadata["{HINTS_KEY}"]["cache_control"]'
    if not isinstance(value, Mapping):
        raise InvalidInputError(
            f'{_where(message)}: {where} must be an object such as '
            f'{{"type": "ephemeral"}}, not {type(value).__name__}'
        )
    try:
        return check_cache_control(value, where)
    except InvalidInputError as exc:
        raise InvalidInputError(f"{_where(message)}: {exc}") from None


def thinking_of(message: Message) -> list[dict[str, str]]:
    """The Anthropic thinking blocks stored with an assistant message (``[]`` when none).

    They are the message's ``thinking`` hint (``metadata["memstore"]["thinking"]``),
    set by `from_anthropic()` or `with_hints()`, in their original order.

    Raises:
        InvalidInputError: the hint is not a list of thinking blocks, or is on a
            message that is not an assistant message.
    """
    value = _hints(message.metadata).get("thinking")
    if value is None:
        return []
    if message.role != "assistant":
        raise InvalidInputError(
            f'{_where(message)}: metadata["{HINTS_KEY}"]["thinking"] is only for '
            "assistant messages (Anthropic thinking blocks are assistant content)"
        )
    return check_thinking(value, f'{_where(message)}: metadata["{HINTS_KEY}"]["thinking"]')


def is_error_of(message: Message) -> bool | None:
    """The ``is_error`` hint of a tool result (``None`` when unset)."""
    value = _hints(message.metadata).get("is_error")
    return value if isinstance(value, bool) else None


def with_cache_control(message: Message, cache_control: Mapping[str, Any] | None = None) -> Message:
    """A copy of ``message`` marked as a prompt-cache breakpoint.

    Args:
        message: the message to copy (a stored message stays a stored message).
        cache_control: the cache-control object: ``{"type": "ephemeral"}`` (the
            default), optionally with ``"ttl": "5m"`` or ``"ttl": "1h"``.

    Raises:
        InvalidInputError: ``cache_control`` is not a JSON object both databases store
            exactly (NaN, sets, NUL characters, non-string keys ...), or not one the
            Anthropic API accepts (another ``type``, another ``ttl``, another key),
            naming what is wrong.
    """
    if cache_control is not None and not isinstance(cache_control, Mapping):
        raise InvalidInputError(
            f"cache_control must be an object such as {{\"type\": \"ephemeral\"}}, "
            f"not {type(cache_control).__name__}"
        )
    value = dict(cache_control) if cache_control is not None else {"type": "ephemeral"}
    try:
        check_json(value, "cache_control")
    except ValueError as exc:
        raise InvalidInputError(str(exc)) from None
    return message.model_copy(
        update={"metadata": with_hints(message.metadata,
                                       cache_control=check_cache_control(value))})


# ---- Anthropic ----------------------------------------------------------------------------


def _where(message: Message) -> str:
    seq = getattr(message, "seq", None)
    if seq is not None:
        return f"message seq {seq}"
    return f"{'an' if message.role == 'assistant' else 'a'} {message.role} message"


def _anthropic_image(part: ImagePart, message: Message) -> dict[str, Any]:
    url = part.image_url.url
    if url.startswith("data:"):
        match = _DATA_URI.match(url)
        if match is None:
            raise InvalidInputError(
                f"{_where(message)}: image data URI is not base64 (data:<type>;base64,...)"
            )
        media_type = match.group("type").lower()
        if media_type not in ANTHROPIC_IMAGE_TYPES:
            raise InvalidInputError(
                f"{_where(message)}: image type {media_type!r} is not accepted by Anthropic "
                f"(accepted: {', '.join(sorted(ANTHROPIC_IMAGE_TYPES))})"
            )
        source: dict[str, Any] = {"type": "base64", "media_type": media_type,
                                  "data": match.group("data")}
    else:
        source = {"type": "url", "url": url}
    return {"type": "image", "source": source}


def _anthropic_content(message: Message) -> list[dict[str, Any]]:
    content = message.content
    if content is None:
        return []
    if isinstance(content, str):
        return [{"type": "text", "text": content}] if content else []
    blocks: list[dict[str, Any]] = []
    for part in content:
        if isinstance(part, TextPart):
            if part.text:
                blocks.append({"type": "text", "text": part.text})
        else:
            blocks.append(_anthropic_image(part, message))
    return blocks


def _finite(text: str) -> float:
    """``json.loads``'s ``parse_float`` refusing what overflows to infinity (``1e999``)."""
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text} is not a finite number")
    return value


def _no_constant(name: str) -> Any:
    """``json.loads``'s ``parse_constant``: NaN and Infinity are not JSON."""
    raise ValueError(f"{name} is not JSON")


def _tool_input(call: ToolCall, message: Message) -> dict[str, Any]:
    try:
        value = (json.loads(call.arguments, parse_float=_finite, parse_constant=_no_constant)
                 if call.arguments.strip() else {})
    except ValueError:
        value = None
    except RecursionError:
        # Valid JSON perhaps, but nested deeper than Python can parse: it cannot become
        # the input object either, so it is refused like arguments that are not JSON.
        raise InvalidInputError(
            f"{_where(message)}: the arguments of tool call {call.id!r} are nested too "
            "deeply to parse as the JSON object Anthropic's tool_use input must be"
        ) from None
    if not isinstance(value, dict):
        raise InvalidInputError(
            f"{_where(message)}: the arguments of tool call {call.id!r} are not a JSON "
            "object, which Anthropic's tool_use input must be"
        )
    return value


class _ToolUseIds:
    """The ids ``to_anthropic`` gives tool calls: unique in the request, in Anthropic's alphabet.

    Anthropic refuses a request in which two ``tool_use`` blocks share an id (400
    "tool_use ids must be unique"), and ids outside ``[a-zA-Z0-9_-]``. Some models
    and servers reuse ids across responses (``call_0`` on every turn), and some use
    other characters (``functions.get_weather:0``). A call keeps its id when it is
    valid and new; otherwise its characters outside the alphabet become ``_`` and a
    repeat gets the first free ``_2``, ``_3``... suffix. A tool result answers the
    newest call with its id so far (units keep results right after their call).
    """

    def __init__(self) -> None:
        self._used: set[str] = set()
        self._current: dict[str, str] = {}

    def call(self, original: str) -> str:
        base = _ANTHROPIC_ID_UNSAFE.sub("_", original)
        new, k = base, 1
        while new in self._used:
            k += 1
            new = f"{base}_{k}"
        self._used.add(new)
        self._current[original] = new
        return new

    def result(self, original: str) -> str:
        return self._current.get(original) or _ANTHROPIC_ID_UNSAFE.sub("_", original)


_ANTHROPIC_ID_UNSAFE = re.compile(r"[^a-zA-Z0-9_-]")


def _message_blocks(message: Message, ids: _ToolUseIds) -> list[dict[str, Any]]:
    if message.role == "tool":
        assert message.tool_call_id is not None
        block: dict[str, Any] = {"type": "tool_result",
                                 "tool_use_id": ids.result(message.tool_call_id)}
        inner = _anthropic_content(message)
        if isinstance(message.content, str):
            if message.content:
                block["content"] = message.content
        elif inner:
            block["content"] = inner
        if is_error_of(message) is True:
            block["is_error"] = True
        return [block]
    blocks = _anthropic_content(message)
    for call in message.tool_calls or ():
        blocks.append({"type": "tool_use", "id": ids.call(call.id), "name": call.name,
                       "input": _tool_input(call, message)})
    thinking = thinking_of(message)
    if thinking:
        # Sent back first and unchanged: Anthropic verifies each block's signature.
        return [*thinking, *blocks]
    return blocks


_THINKING_TYPES = frozenset({"thinking", "redacted_thinking"})
_TOOL_RESULT_TYPES = frozenset({"tool_result"})


def message_list(messages: Any, what: str,
                 error: type[MemstoreError] = InvalidInputError) -> list[Message]:
    """``messages`` as a list, each item checked to be a [`Message`][memstore.Message].

    What the renderers and the builder's blocks take (internal; not in ``__all__``).

    Raises:
        MemstoreError: ``error``, naming ``what`` and the first item that is not a
            Message (a single Message, a str or a dict is not a list of them).
    """
    if isinstance(messages, (str, bytes, Mapping, Message)):
        raise error(f"{what} must be a list of Message, not a {type(messages).__name__}")
    try:
        items = list(messages)
    except TypeError:
        raise error(f"{what} must be a list of Message, not {type(messages).__name__}") from None
    for index, item in enumerate(items):
        if not isinstance(item, Message):
            raise error(
                f"{what}[{index}] is a {type(item).__name__}, not a Message "
                "(Message.from_openai converts an OpenAI message dict)"
            )
    return items


def to_anthropic(messages: Iterable[Message], *,
                 leading_assistant: LeadingAssistant = "insert",
                 leading_text: str = LEADING_USER_TEXT) -> dict[str, Any]:
    """Render messages as an Anthropic Messages API request body (``system`` + ``messages``).

    The first turn of the result is a user turn, as Anthropic-compatible endpoints
    (Bedrock, Vertex AI, older API versions) require. When the messages would start
    with an assistant turn (a budget cut the question an answer follows, an assistant
    greeting, an agent's opening tool call), ``leading_assistant`` decides:

    * ``"insert"`` (default): a user turn holding ``leading_text`` (``"(continued)"``)
      goes first. Every message is sent, so the window's report stays exact; the
      inserted turn is not in ``window.token_count`` (a few tokens).
    * ``"drop"``: leading assistant turns are left out, together with the
      ``tool_result`` blocks answering their calls (whole units), until the first
      user turn. The window's report does not know of this rendering choice; read
      the window with ``start_on_user=True`` to have the view leave those units out
      and report them (reason ``"start_on_user"``). Raises `InvalidInputError` when
      no user turn would remain.
    * ``"raise"``: `InvalidInputError`, naming the message.
    * ``"keep"``: send it as it is (for the current first-party API, which accepts it).

    Args:
        messages: chronological messages, e.g. a window's ``messages``.
        leading_assistant: what to do with a leading assistant turn (see above).
        leading_text: the text of the user turn ``"insert"`` adds (non-empty).

    Returns:
        ``{"system": [text blocks], "messages": [message params]}``; ``system`` is
        omitted when there is no system or developer message. Pass it as
        ``client.messages.create(model=..., max_tokens=..., **result)``. Tool call
        ids are made unique in the request and fit Anthropic's ``[a-zA-Z0-9_-]``
        alphabet (a repeated ``call_0`` becomes ``call_0_2``, with its results); ids
        that are already both are sent as they are. An assistant message's stored
        thinking blocks (`thinking_of()`) open its turn, unchanged.

    Raises:
        InvalidInputError: ``messages`` is not a list of [`Message`][memstore.Message], or a tool
            call's arguments are not a JSON object (or hold
            NaN, Infinity or a number too large for a float, which JSON cannot carry,
            or are nested too deeply to parse), or an image is a ``data:`` URI of a
            type Anthropic does not accept, or a ``cache_control`` or ``thinking``
            hint is malformed, or a leading assistant turn is refused
            (``leading_assistant="raise"``, or ``"drop"`` leaving no user turn), or
            ``leading_assistant``/``leading_text`` is not a valid choice.
    """
    if leading_assistant not in _LEADING_CHOICES:
        raise InvalidInputError(
            f"leading_assistant must be one of {', '.join(map(repr, _LEADING_CHOICES))}, "
            f"not {short_repr(leading_assistant)}"
        )
    if not isinstance(leading_text, str) or not leading_text.strip():
        raise InvalidInputError(
            f"leading_text must be a non-empty string, not {short_repr(leading_text)}")
    system: list[dict[str, Any]] = []
    turns: list[dict[str, Any]] = []
    first: list[Message] = []  # the first message of each turn, to name it in errors
    ids = _ToolUseIds()
    for message in message_list(messages, "to_anthropic messages"):
        cache = cache_control_of(message)
        if message.role in ("system", "developer"):
            text = message.text
            if text:
                block: dict[str, Any] = {"type": "text", "text": text}
                if cache is not None:
                    block["cache_control"] = cache
                system.append(block)
            continue
        blocks = _message_blocks(message, ids)
        if not blocks:
            continue
        if cache is not None:
            # On the last block that can carry it: a thinking block cannot.
            for i in range(len(blocks) - 1, -1, -1):
                if blocks[i]["type"] not in _THINKING_TYPES:
                    blocks[i] = {**blocks[i], "cache_control": cache}
                    break
        role = "assistant" if message.role == "assistant" else "user"
        if turns and turns[-1]["role"] == role:
            turns[-1]["content"].extend(blocks)
        else:
            turns.append({"role": role, "content": blocks})
            first.append(message)
    for turn in turns:
        content = turn["content"]
        # Anthropic wants a user turn's tool results before any other block, and an
        # assistant turn's thinking blocks before any other block.
        kinds = _TOOL_RESULT_TYPES if turn["role"] == "user" else _THINKING_TYPES
        ahead = [b for b in content if b["type"] in kinds]
        if ahead and len(ahead) != len(content):
            turn["content"] = ahead + [b for b in content if b["type"] not in kinds]
    if turns and turns[0]["role"] == "assistant" and leading_assistant != "keep":
        if leading_assistant == "raise":
            raise InvalidInputError(
                f"{_where(first[0])} starts the request with an assistant turn, which "
                "Anthropic-compatible endpoints refuse; read the window with "
                "start_on_user=True, or render with leading_assistant='insert' or 'drop'"
            )
        if leading_assistant == "insert":
            turns.insert(0, {"role": "user",
                             "content": [{"type": "text", "text": leading_text}]})
        else:
            turns = _drop_leading_assistant(turns, first[0])
    out: dict[str, Any] = {}
    if system:
        out["system"] = system
    out["messages"] = turns
    return out


def _drop_leading_assistant(turns: list[dict[str, Any]], named: Message) -> list[dict[str, Any]]:
    """``turns`` without its leading assistant turns and the results answering them."""
    turns = list(turns)
    while turns and turns[0]["role"] == "assistant":
        dropped = {b["id"] for b in turns.pop(0)["content"] if b["type"] == "tool_use"}
        if turns:  # the user turn after it: its results answer the dropped calls
            rest = [b for b in turns[0]["content"]
                    if not (b["type"] == "tool_result" and b["tool_use_id"] in dropped)]
            if rest:
                turns[0] = {"role": "user", "content": rest}
            else:
                turns.pop(0)
    if not turns:
        raise InvalidInputError(
            f"{_where(named)}: leading_assistant='drop' leaves no user turn to send "
            "(the messages hold no user message after their assistant turns); use "
            "leading_assistant='insert'"
        )
    return turns


def _responses_parts(message: Message) -> str | list[dict[str, Any]]:
    content = message.content
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if message.role == "assistant":
        return message.text
    parts: list[dict[str, Any]] = []
    for part in content:
        if isinstance(part, TextPart):
            parts.append({"type": "input_text", "text": part.text})
        else:
            parts.append({"type": "input_image", "image_url": part.image_url.url,
                          "detail": part.image_url.detail or "auto"})
    return parts


def to_responses(messages: Iterable[Message]) -> list[dict[str, Any]]:
    """Render messages as OpenAI Responses API input items.

    System, developer, user and assistant text become ``message`` items (images as
    ``input_image`` parts); each tool call becomes a ``function_call`` item after its
    message's text, and each tool result a ``function_call_output`` item. ``name``
    has no Responses field and is dropped; so is ``cache_control``.

    Args:
        messages: chronological messages, e.g. a window's ``messages``.

    Returns:
        A list to pass as ``client.responses.create(input=...)``.

    Raises:
        InvalidInputError: ``messages`` is not a list of [`Message`][memstore.Message].
    """
    items: list[dict[str, Any]] = []
    for message in message_list(messages, "to_responses messages"):
        if message.role == "tool":
            output = _responses_parts(message)
            items.append({"type": "function_call_output", "call_id": message.tool_call_id,
                          "output": output})
            continue
        body = _responses_parts(message)
        if not (message.role == "assistant" and message.tool_calls and not body):
            items.append({"type": "message", "role": message.role, "content": body})
        for call in message.tool_calls or ():
            items.append({"type": "function_call", "call_id": call.id, "name": call.name,
                          "arguments": call.arguments})
    return items
