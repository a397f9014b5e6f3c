"""The base class every view derives from, and the check of what a view returns."""

from __future__ import annotations

import abc
import json
from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import ClassVar, cast

from pydantic import JsonValue

from memstore._validate import MAX_JSON_FLOAT
from memstore.errors import ConfigurationError
from memstore.models import StoredMessage
from memstore.tokens import TokenCounter, validate_counter
from memstore.tokens._checked import checked_counter
from memstore.views.history import HistorySource, ListHistory
from memstore.views.window import ContextWindow

__all__ = ["ContextView", "checked_window"]


@dataclass(frozen=True)
class ContextView(abc.ABC):
    """Base class of the context views: a frozen configuration with a pure selection.

    Subclasses implement `select()`. `to_config()` and
    [`view_from_config()`][memstore.view_from_config] round-trip any view through JSON.

    Attributes:
        budgeted: ``True`` for views with a ``token_limit`` (class attribute).
    """

    budgeted: ClassVar[bool] = False

    @abc.abstractmethod
    def select(self, source: HistorySource, counter: TokenCounter) -> ContextWindow:
        """Build the window over ``source``.

        Args:
            source: the conversation's history (read newest-first, page by page).
            counter: the token counter to use (the store passes
                ``view.resolve_counter(store.counter)``).

        Raises:
            ContextBudgetError: a budgeted view cannot fit the anchored messages and
                the newest unit.
        """

    def apply(self, messages: Sequence[StoredMessage], counter: TokenCounter) -> ContextWindow:
        """Build the window over a list of one conversation's stored messages.

        Raises:
            ConfigurationError: ``counter`` does not implement the TokenCounter protocol.
            InvalidInputError: ``messages`` are not stored messages of one conversation
                with contiguous seqs (see [`ListHistory`][memstore.ListHistory]).
        """
        return checked_window(self, self.select(ListHistory(messages),
                                                checked_counter(validate_counter(counter))))

    def resolve_counter(self, default: TokenCounter) -> TokenCounter:
        """The counter this view uses: its own ``counter`` if it names one, else ``default``.

        A custom counter of the view's own is wrapped so that each count it returns is
        checked (an int >= 0, else `ConfigurationError`): it
        counts at window time, where nothing else checks it.
        """
        own = getattr(self, "counter", None)
        return checked_counter(cast(TokenCounter, own)) if own is not None else default

    def to_config(self) -> dict[str, JsonValue]:
        """The view as JSON: ``{"type": <class name>, <parameter>: <value>, ...}``.

        A counter is saved by its ``name``; tool schemas as a list of objects.
        """
        config: dict[str, JsonValue] = {"type": type(self).__name__}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "counter":
                config[f.name] = None if value is None else cast(TokenCounter, value).name
            elif f.name == "tools":
                config[f.name] = None if value is None else cast(JsonValue, json.loads(
                    json.dumps(list(value))))
            elif isinstance(value, float):
                config[f.name] = _json_number(value)
            else:
                config[f.name] = cast(JsonValue, value)
        return config


def checked_window(view: ContextView, result: object) -> ContextWindow:
    """``result`` of ``view.select``, checked: a custom view must return a ContextWindow.

    Raises:
        ConfigurationError: it returned something else (a list of messages, ``None``).
    """
    if not isinstance(result, ContextWindow):
        raise ConfigurationError(
            f"{type(view).__name__}.select returned {type(result).__name__}, not a "
            "ContextWindow"
        )
    return result


def _json_number(value: float) -> JsonValue:
    """A float parameter as a JSON value that reads back equal from both databases.

    ``jsonb`` has no ``-0.0`` and prints floats of 1e16 or more as integers, so the
    JSON rules refuse them (see docs/input-rules.md); a view accepts them
    (``ScoreBasedView(half_life=1e20)``), so its config writes ``0.0`` and the
    integer, which are equal to them and build an equal view.
    """
    if value == 0:
        return 0.0
    if abs(value) >= MAX_JSON_FLOAT:
        return int(value)  # exact: a float this large is an integer
    return value
