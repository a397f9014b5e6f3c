"""Token counting: the :class:`TokenCounter` protocol and memstore's counters.

Counts are *additive*: ``count_messages(ms) == sum(count_message(m) for m in ms)
+ priming``. That is what lets the store compute a message's count once, at write
time, store it with the counter's ``name``, and budget a window by summing stored
counts instead of re-tokenising history.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

from memstore.models import Message, StoredMessage

__all__ = [
    "FixedCounter",
    "TokenCounter",
    "message_tokens",
]


@runtime_checkable
class TokenCounter(Protocol):
    """Counts tokens the way a provider will bill a chat request.

    Attributes:
        name: a stable identifier stored with every cached count
            (e.g. ``"tiktoken/cl100k_base"``). Two counters with the same name must
            count identically.
        priming: tokens added once per request (the reply priming).
    """

    @property
    def name(self) -> str:
        """Stable identifier of this counter and its parameters."""
        ...

    @property
    def priming(self) -> int:
        """Tokens ``count_messages`` adds once per list."""
        ...

    def count_message(self, message: Message) -> int:
        """Tokens of one message, per-message overhead included."""
        ...

    def count_messages(self, messages: Iterable[Message]) -> int:
        """Tokens of a whole request: the sum of ``count_message`` plus ``priming``."""
        ...

    def count_tools(self, tools: Sequence[Mapping[str, Any]]) -> int:
        """Tokens that tool (function) schemas add to a request."""
        ...


def message_tokens(message: Message, counter: TokenCounter) -> int:
    """Tokens of ``message`` under ``counter``, using the stored count when it is valid.

    A :class:`StoredMessage` whose ``token_counter`` is ``counter.name`` carries the
    count computed at write time; any other message is counted now. Nothing is
    written back.
    """
    if isinstance(message, StoredMessage) and message.token_counter == counter.name:
        return message.token_count
    return counter.count_message(message)


class FixedCounter:
    """Deterministic arithmetic counter for tests and examples.

    ``count_message = per_message + per_tool_call * len(tool_calls) + per_word * words``
    where ``words`` is the number of whitespace-separated words of the message text.

    Args:
        per_message: tokens charged for every message.
        per_tool_call: tokens charged for every tool call of an assistant message.
        per_word: tokens charged per word of the text.
        priming: tokens added once per request by ``count_messages``.
        per_tool_schema: tokens charged per tool schema by ``count_tools``.

    Raises:
        ValueError: a parameter is negative.
    """

    def __init__(
        self,
        per_message: int = 1,
        *,
        per_tool_call: int = 0,
        per_word: int = 0,
        priming: int = 0,
        per_tool_schema: int = 0,
    ) -> None:
        params = {
            "per_message": per_message,
            "per_tool_call": per_tool_call,
            "per_word": per_word,
            "priming": priming,
            "per_tool_schema": per_tool_schema,
        }
        for key, value in params.items():
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"FixedCounter {key} must be an int >= 0, got {value!r}")
        self.per_message = per_message
        self.per_tool_call = per_tool_call
        self.per_word = per_word
        self._priming = priming
        self.per_tool_schema = per_tool_schema

    @property
    def name(self) -> str:
        """``fixed/<per_message>/<per_tool_call>/<per_word>/<priming>/<per_tool_schema>``."""
        return (
            f"fixed/{self.per_message}/{self.per_tool_call}/{self.per_word}/"
            f"{self._priming}/{self.per_tool_schema}"
        )

    @property
    def priming(self) -> int:
        """Tokens added once per request."""
        return self._priming

    def count_message(self, message: Message) -> int:
        """``per_message + per_tool_call * calls + per_word * words``."""
        words = len(message.text.split()) if self.per_word else 0
        calls = len(message.tool_calls or ())
        return self.per_message + self.per_tool_call * calls + self.per_word * words

    def count_messages(self, messages: Iterable[Message]) -> int:
        """Sum of ``count_message`` plus ``priming``."""
        return sum(self.count_message(m) for m in messages) + self._priming

    def count_tools(self, tools: Sequence[Mapping[str, Any]]) -> int:
        """``per_tool_schema * len(tools)``."""
        return self.per_tool_schema * len(tools)

    def __repr__(self) -> str:
        return f"FixedCounter({self.name!r})"


def _ceil_div(a: int, b: float) -> int:
    return math.ceil(a / b) if a else 0
