"""The TokenCounter protocol, BaseTokenCounter, and helpers over any counter.

What a counter must implement is exactly the protocol: ``name``,
``count_message`` and ``count_messages``. ``priming``, ``count_tools`` and
``count_each`` are optional capabilities; memstore reaches them only through
`counter_priming()`, `count_tool_schemas()` and `count_each()`, which
derive, fall back or refuse clearly when a counter lacks them.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

from memstore._validate import MAX_VIEW_INT, short_repr
from memstore.errors import ConfigurationError, InvalidInputError
from memstore.models import Message, StoredMessage

__all__ = [
    "BaseTokenCounter",
    "TokenCounter",
    "count_each",
    "count_tool_schemas",
    "counter_priming",
    "message_tokens",
    "validate_counter",
]


@runtime_checkable
class TokenCounter(Protocol):
    """Counts tokens the way a provider will bill a chat request.

    This is all a counter must implement. Counts must be *additive*:
    ``count_messages(ms) == sum(count_message(m) for m in ms) + count_messages([])``
    (the constant is the reply priming), which is what lets the store count a
    message once, at write time, and budget windows by summing stored counts.

    Three optional members are used when present:

    * ``priming`` (an ``int``): the tokens ``count_messages`` adds once per request.
      When absent, memstore derives it as ``count_messages([])``
      (`counter_priming()`).
    * ``count_tools(tools) -> int``: the tokens tool (function) schemas add to a
      request. Needed only by views given ``tools=``; without it they raise
      `ConfigurationError` (`count_tool_schemas()`).
    * ``count_each(messages) -> list[int]``: ``count_message`` of each message of a
      batch, in order, perhaps faster than one at a time (the store counts an
      ``extend`` or an import through it; [`TiktokenCounter`][memstore.TiktokenCounter]
      splits a large batch across threads). Without it, the store calls
      ``count_message`` per message (`count_each()`).

    [`BaseTokenCounter`][memstore.BaseTokenCounter] provides ``count_messages``, ``priming``,
    ``count_tools`` and ``count_each`` to a subclass that implements ``name`` and
    ``count_message``.

    Attributes:
        name: a stable, non-empty identifier stored with every cached count
            (e.g. ``"tiktoken/cl100k_base"``). Two counters with the same name must
            count identically.
    """

    @property
    def name(self) -> str:
        """Stable identifier of this counter and its parameters."""
        ...

    def count_message(self, message: Message) -> int:
        """Tokens of one message, per-message overhead included."""
        ...

    def count_messages(self, messages: Iterable[Message]) -> int:
        """Tokens of a whole request: the sum of ``count_message`` plus the reply priming."""
        ...


def _describe(counter: object) -> str:
    name = getattr(counter, "name", None)
    kind = type(counter).__name__
    return f"counter {name!r} ({kind})" if isinstance(name, str) else f"counter {kind}"


def validate_counter(counter: object, what: str = "counter") -> TokenCounter:
    """Check that ``counter`` implements the [`TokenCounter`][memstore.TokenCounter] protocol.

    Args:
        counter: the object to check.
        what: how to name it in the error (e.g. ``"TokenLimitedView counter"``).

    Returns:
        ``counter``, typed as a [`TokenCounter`][memstore.TokenCounter].

    Raises:
        ConfigurationError: ``name`` is not a non-empty string, or ``count_message``
            or ``count_messages`` is missing or not callable.
    """
    if isinstance(counter, str):
        raise ConfigurationError(
            f"{what} must be a TokenCounter object, got the string {short_repr(counter)} "
            "(memstore.counter_from_name builds a counter from a name)"
        )
    missing = [
        method for method in ("count_message", "count_messages")
        if not callable(getattr(counter, method, None))
    ]
    if missing:
        raise ConfigurationError(
            f"{what} must implement the TokenCounter protocol (name, count_message, "
            f"count_messages); {short_repr(counter)} has no {' or '.join(missing)} method"
        )
    try:
        name = getattr(counter, "name", None)
    except Exception as exc:
        raise ConfigurationError(
            f"{what} {short_repr(counter)}: reading its name failed: {short_repr(exc)}"
        ) from exc
    if not isinstance(name, str) or not name:
        raise ConfigurationError(
            f"{what} name must be a non-empty string identifying the counter and its "
            f"parameters, got {short_repr(name)} from {short_repr(counter)}"
        )
    return counter  # type: ignore[return-value]


def _check_count(counter: object, method: str, value: object) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= MAX_VIEW_INT:
        raise ConfigurationError(
            f"{_describe(counter)}: {method} must return an int in [0, 2**53 - 1], "
            f"got {short_repr(value)}"
        )
    return value


def counter_priming(counter: TokenCounter) -> int:
    """The tokens ``counter`` adds once per request (the reply priming).

    Uses the counter's ``priming`` when it has one, else ``count_messages([])``.

    Args:
        counter: any token counter.

    Returns:
        The priming, an int >= 0.

    Raises:
        ConfigurationError: the counter's ``priming`` (or ``count_messages([])``) is
            not an int >= 0.
    """
    priming = getattr(counter, "priming", None)
    if priming is not None:
        return _check_count(counter, "priming", priming)
    return _check_count(counter, "count_messages([])", counter.count_messages([]))


def count_tool_schemas(counter: TokenCounter, tools: Sequence[Mapping[str, Any]] | None) -> int:
    """The tokens tool (function) schemas add to a request, counted by ``counter``.

    Args:
        counter: any token counter.
        tools: the schemas; ``None`` or empty counts 0 whatever the counter.

    Returns:
        ``counter.count_tools(tools)``, or 0 for no tools.

    Raises:
        ConfigurationError: there are tools and the counter has no ``count_tools``
            method (or a [`BaseTokenCounter`][memstore.BaseTokenCounter] without a ``count_text``
            hook).
        InvalidInputError: the schemas are nested too deeply to serialise.
    """
    if not tools:
        return 0
    count_tools = getattr(counter, "count_tools", None)
    if not callable(count_tools):
        raise ConfigurationError(
            f"{_describe(counter)} has no count_tools method, so it cannot count the "
            f"{len(tools)} tool schema(s) given as tools=; implement count_tools(tools) -> int "
            "(or subclass memstore.BaseTokenCounter, which provides it), or leave "
            "tools= unset and add their tokens to reserve="
        )
    try:
        counted = count_tools(tools)
    except RecursionError:
        raise InvalidInputError(
            "the tool schemas are nested too deeply to serialise as JSON") from None
    return _check_count(counter, "count_tools", counted)


def count_each(counter: TokenCounter, messages: Sequence[Message]) -> list[int]:
    """``counter.count_message`` of each message, through ``count_each`` when it has one.

    Args:
        counter: any token counter.
        messages: the batch, in order.

    Returns:
        One count per message, in order (each is checked where it is stored).

    Raises:
        ConfigurationError: the counter's ``count_each`` did not return a list with one
            count per message.
    """
    each = getattr(counter, "count_each", None)
    if not callable(each):
        return [counter.count_message(m) for m in messages]
    counts = each(messages)
    if not isinstance(counts, list) or len(counts) != len(messages):
        raise ConfigurationError(
            f"{_describe(counter)}: count_each must return a list of one count per message "
            f"({len(messages)}), got {_shape(counts)}"
        )
    return counts


def _shape(value: object) -> str:
    if isinstance(value, list):
        return f"a list of {len(value)}"
    return f"a {type(value).__name__}"


def message_tokens(message: Message, counter: TokenCounter) -> int:
    """Tokens of ``message`` under ``counter``, using the stored count when it is valid.

    A [`StoredMessage`][memstore.StoredMessage] whose ``token_counter`` is ``counter.name`` carries
    the
    count computed at write time; any other message is counted now. Nothing is
    written back.

    Args:
        message: a plain or stored message.
        counter: the counter whose count is wanted.

    Returns:
        The message's tokens under ``counter``, per-message overhead included.
    """
    if isinstance(message, StoredMessage) and message.token_counter == counter.name:
        return message.token_count
    return counter.count_message(message)


def tools_json(tools: Sequence[Mapping[str, Any]]) -> str:
    """Tool schemas as the JSON text that ``BaseTokenCounter.count_tools()`` counts.

    Raises:
        InvalidInputError: ``tools`` is not JSON-serialisable.
    """
    try:
        return json.dumps(list(tools), ensure_ascii=False, default=_json_default)
    except (TypeError, ValueError) as exc:
        raise InvalidInputError(f"tools are not JSON-serialisable: {exc}") from exc


def _json_default(value: object) -> object:
    if isinstance(value, Mapping):
        return dict(value)
    raise TypeError(f"{type(value).__name__} is not JSON-serialisable")


class BaseTokenCounter:
    """A base class for custom counters: implement ``name`` and ``count_message``.

    A subclass gets:

    * ``count_messages(messages)``: the sum of ``count_message`` plus ``priming``;
    * ``count_each(messages)``: ``count_message`` of each, one after another;
    * ``priming``: 0 (override it with a property or a class attribute);
    * ``count_tools(tools)``: the schemas rendered as one JSON text (the
      ``json.dumps`` of the list, non-ASCII kept) counted by the subclass's
      `count_text()` hook. Without that hook, ``count_tools`` raises
      `ConfigurationError` and only views without ``tools=``
      can use the counter;
    * equality and hashing by class and ``name``, and a readable ``repr``.

    Example::

        class WordCounter(BaseTokenCounter):
            name = "words/v1"

            def count_message(self, message):
                return 3 + len(message.text.split())

            def count_text(self, text):
                return len(text.split())
    """

    @property
    def name(self) -> str:
        """Stable identifier of this counter and its parameters (override it)."""
        raise NotImplementedError(f"{type(self).__name__} must define name")

    @property
    def priming(self) -> int:
        """Tokens ``count_messages`` adds once per request (0 unless overridden)."""
        return 0

    def count_message(self, message: Message) -> int:
        """Tokens of one message, per-message overhead included (override it)."""
        raise NotImplementedError(f"{type(self).__name__} must implement count_message")

    def count_messages(self, messages: Iterable[Message]) -> int:
        """Tokens of a whole request: the sum of ``count_message`` plus ``priming``.

        Args:
            messages: the request's messages, in order.

        Returns:
            The request's prompt tokens.
        """
        return sum(self.count_message(m) for m in messages) + self.priming

    def count_each(self, messages: Sequence[Message]) -> list[int]:
        """``count_message`` of each message, in order (override it to count faster).

        Args:
            messages: a batch of messages.

        Returns:
            One count per message.
        """
        return [self.count_message(m) for m in messages]

    def count_text(self, text: str) -> int:
        """Tokens of a plain text: the hook ``count_tools`` counts schemas with.

        By default it is derived from `count_message()`: the tokens of a user
        message holding ``text`` less those of an empty one (the per-message overhead),
        so a counter that implements only ``name`` and ``count_message`` counts tool
        schemas with its own rule. Override it (e.g. ``return len(self.encode(text))``)
        when the counter has a direct (or cheaper) count of a text.

        Raises:
            ConfigurationError: the derived count is not an int >= 0 (``count_message``
                charges a text less than nothing): override ``count_text``.
        """
        full = self.count_message(Message(role="user", content=text))
        empty = self.count_message(Message(role="user", content=""))
        tokens = full - empty if type(full) is int and type(empty) is int else None
        if tokens is None or tokens < 0:
            raise ConfigurationError(
                f"{_describe(self)} cannot count tool schemas: count_text is derived from "
                f"count_message (a user message holding the text, less an empty one), which "
                f"gave {full!r} - {empty!r}; implement count_text(text) -> int or "
                "count_tools(tools) -> int, or leave tools= unset and add their tokens to "
                "reserve="
            )
        return tokens

    def count_tools(self, tools: Sequence[Mapping[str, Any]]) -> int:
        """Tokens of tool schemas: ``count_text`` of their JSON text; 0 for no tools.

        (With the default `count_text()`, that is what ``count_message`` charges
        for the JSON text as a message's content.)

        Args:
            tools: tool schemas, in any JSON-serialisable shape.

        Returns:
            The tokens of the schemas.

        Raises:
            ConfigurationError: ``count_text`` cannot count the text.
            InvalidInputError: ``tools`` is not JSON-serialisable.
        """
        if not tools:
            return 0
        return self.count_text(tools_json(tools))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, BaseTokenCounter):
            return NotImplemented
        return type(self) is type(other) and self.name == other.name

    def __hash__(self) -> int:
        return hash((type(self).__name__, self.name))

    def __repr__(self) -> str:
        try:
            return f"{type(self).__name__}({self.name!r})"
        except NotImplementedError:
            return f"{type(self).__name__}()"
