"""A counter whose counts are checked where they are used (a view's own counter).

The store checks every count it stores (`memstore._validate.check_token_count()`).
A view's own ``counter=``, and the counter passed to ``view.apply``, count at window
time instead: a custom counter returning ``None``, a float or a negative number there
would make a view overrun its budget silently or fail with a raw ``TypeError``.
`checked_counter()` wraps such a counter so that each count is an int >= 0 or a
`ConfigurationError` naming the counter. memstore's own
counters are returned as they are (their counts are ints by construction).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from memstore.models import Message
from memstore.tokens._base import TokenCounter, _check_count
from memstore.tokens._openai import TiktokenCounter
from memstore.tokens._simple import ApproxCounter, FixedCounter

#: memstore's counters: their counts need no check.
_TRUSTED = (TiktokenCounter, ApproxCounter, FixedCounter)


class CheckedCounter:
    """``inner`` with ``count_message`` and ``count_messages`` checked; else the same.

    Every other attribute (``priming``, ``count_tools``, ``count_each`` ...) is the
    inner counter's, read through; those are checked where they are used.
    """

    __slots__ = ("inner",)

    def __init__(self, inner: TokenCounter) -> None:
        self.inner = inner

    @property
    def name(self) -> str:
        """The inner counter's name (stored counts under it are still used)."""
        return self.inner.name

    def count_message(self, message: Message) -> int:
        """The inner count, checked."""
        return _check_count(self.inner, "count_message", self.inner.count_message(message))

    def count_messages(self, messages: Iterable[Message]) -> int:
        """The inner count, checked."""
        return _check_count(self.inner, "count_messages", self.inner.count_messages(messages))

    def __getattr__(self, attribute: str) -> Any:
        return getattr(self.inner, attribute)

    def __repr__(self) -> str:
        return repr(self.inner)


def checked_counter(counter: TokenCounter) -> TokenCounter:
    """``counter`` itself when it is memstore's, else a `CheckedCounter` of it."""
    if type(counter) in _TRUSTED or isinstance(counter, CheckedCounter):
        return counter
    return CheckedCounter(counter)
