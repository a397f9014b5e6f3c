"""Recall: a builder block whose content is what a search of the store finds.

``Block("memory", tier=Tier.RAG, strategy=TruncateOldest(), recall=Recall(store, query))``
searches the store when the builder compiles (``store.search``, or ``await
store.search`` under [`ContextBuilder.acompile()`][memstore.ContextBuilder.acompile]) and
renders the hits as one system message: each hit (with its context messages) as one
item of a formatter, by default a Markdown list of ``date role: text`` lines. When that
message is over the block's budget the lowest-ranked hits go first (the report labels
the block ``"truncated"``); [`Strict`][memstore.Strict] raises instead and
[`Drop`][memstore.Drop] drops the block.

``skip=`` names a history block of the same builder: no message it shows is repeated
(hits and context alike). A history block served before the recall block is known
when the recall is rendered; one served after it (the usual order, ``Tier.RAG`` before
``Tier.HISTORY``) is applied when the compile ends: the recall block then keeps the
best hits the history block does not show, within the tokens it was given.

Pure: the block reads the store only through its public ``search`` method (the
[`SearchSource`][memstore.context.recall.SearchSource] protocol), as a history block reads
it through ``window``.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from pydantic import BaseModel, ConfigDict, Field

from memstore._validate import check_where, short_repr
from memstore.context.formatters import Formatter, MarkdownListFormatter
from memstore.errors import ConfigurationError, ContextBudgetError
from memstore.models import Message, StoredMessage
from memstore.search import (
    MAX_CONTEXT,
    MAX_LIMIT,
    SearchHit,
    parse_query,
    searchable_text,
)

__all__ = ["DEFAULT_RECALL_FORMATTER", "Recall", "RecallReport", "SearchSource"]


class SearchSource(Protocol):
    """What a recall block needs of a store: its ``search`` method.

    [`MemoryStore`][memstore.MemoryStore] and [`AsyncMemoryStore`][memstore.AsyncMemoryStore]
    (whose ``search`` is a coroutine) both are one.
    """

    def search(self, query: str, /, **kwargs: Any) -> Any:
        """The hits of ``query`` (or an awaitable of them)."""


#: The default rendering: a Markdown list under one heading.
DEFAULT_RECALL_FORMATTER: Formatter = MarkdownListFormatter(
    "Recalled from earlier messages (most relevant first)")


@dataclass(frozen=True)
class Recall:
    """A search whose hits are a block's content (see the module).

    Args:
        store: a [`MemoryStore`][memstore.MemoryStore] or
            [`AsyncMemoryStore`][memstore.AsyncMemoryStore] (anything with ``search``).
        query: what to search for (the store's query language).
        conversation_id: one conversation id, a list of them, or ``None`` for all.
        where: conversation-metadata equality filters.
        limit: most hits shown (1–1,000).
        context: messages shown around each hit, on each side (0–50).
        skip: the id of a history block of the same builder whose messages are not
            repeated.
        formatter: turns the hits' texts into the message's text (default
            `DEFAULT_RECALL_FORMATTER`; [`XMLFormatter`][memstore.XMLFormatter] works).

    Raises:
        ConfigurationError: (a ``ValueError``) no ``search`` method, a bad limit,
            context, skip or formatter.
        InvalidInputError: (a ``ValueError``) a query that cannot be searched, or a bad
            ``where``.
    """

    store: SearchSource
    query: str
    conversation_id: str | Sequence[str] | None = None
    where: Mapping[str, str | int | bool | None] | None = None
    limit: int = 5
    context: int = 1
    skip: str | None = None
    formatter: Formatter | None = None

    def __post_init__(self) -> None:
        if not callable(getattr(self.store, "search", None)):
            raise ConfigurationError(
                f"Recall needs a MemoryStore or AsyncMemoryStore, got {short_repr(self.store)}")
        parse_query(self.query)  # refused now, not at every compile
        check_where(self.where)
        for name, value, low, high in (("limit", self.limit, 1, MAX_LIMIT),
                                       ("context", self.context, 0, MAX_CONTEXT)):
            if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
                raise ConfigurationError(
                    f"Recall {name} must be an int in [{low}, {high}], got {short_repr(value)}")
        if self.skip is not None and (not isinstance(self.skip, str) or not self.skip):
            raise ConfigurationError(
                f"Recall skip must be the id of a history block, got {short_repr(self.skip)}")
        if self.formatter is not None and not callable(self.formatter):
            raise ConfigurationError(
                f"Recall formatter must be a callable (list[str]) -> str, got "
                f"{short_repr(self.formatter)}")

    @property
    def is_async(self) -> bool:
        """Whether the store's ``search`` is a coroutine (an ``AsyncMemoryStore``)."""
        return inspect.iscoroutinefunction(self.store.search)

    def arguments(self) -> dict[str, Any]:
        """The keyword arguments of the search (more hits than ``limit`` when skipping)."""
        fetch = self.limit if self.skip is None else min(MAX_LIMIT, self.limit * 4 + 10)
        return {"conversation_id": self.conversation_id, "where": self.where,
                "limit": fetch, "context": self.context}


class RecallReport(BaseModel):
    """What a recall block found and showed.

    Attributes:
        query: the query searched.
        found: hits the search returned.
        hits: ``(conversation id, seq)`` of each hit shown, best first.
        context: ``(conversation id, seq)`` of each context message shown.
        skipped: hits left out because the ``skip`` history block shows them.
        dropped: hits left out for the budget (lowest-ranked first) or beyond ``limit``.
    """

    model_config = ConfigDict(frozen=True)

    query: str
    found: int
    hits: list[tuple[str, int]] = Field(default_factory=list)
    context: list[tuple[str, int]] = Field(default_factory=list)
    skipped: int = 0
    dropped: int = 0


Key = tuple[str, int]


def _key(message: StoredMessage) -> Key:
    return (message.conversation_id, message.seq)


def _line(message: StoredMessage) -> str:
    when = message.created_at.strftime("%Y-%m-%d %H:%M")
    return f"{when} {message.role}: {searchable_text(message.content, message.tool_calls)}"


@dataclass
class Selection:
    """A rendered recall: its message (``None``: nothing to show) and its report."""

    message: Message | None
    report: RecallReport
    truncated: bool


def select(block_id: str, recall: Recall, hits: list[SearchHit], shown: set[Key],
           budget: int, count: Callable[[Message], int], *, strict: bool = False,
           drop: bool = False) -> Selection:
    """The best hits not in ``shown`` that fit ``budget``, rendered as one message.

    Hits go lowest-ranked first until the message fits; ``strict`` raises instead
    (`ContextBudgetError`), ``drop`` shows nothing.
    """
    candidates = [h for h in hits if _key(h.message) not in shown]
    skipped = len(hits) - len(candidates)
    beyond = max(0, len(candidates) - recall.limit)
    candidates = candidates[:recall.limit]
    formatter = recall.formatter or DEFAULT_RECALL_FORMATTER
    kept = len(candidates)
    message: Message | None = None
    while kept:
        message, _ = _render(candidates[:kept], shown, formatter)
        tokens = count(message)
        if tokens <= budget:
            break
        if strict:
            raise ContextBudgetError(
                f"block {block_id!r}: its {kept} recalled hit(s) need {tokens} tokens and its "
                f"budget is {budget} (Strict)", required=tokens, budget=budget)
        if drop:
            kept = 0
            break
        kept -= 1
    if not kept:
        message = None
    chosen = candidates[:kept]
    context = [] if message is None else [
        k for k in _render(chosen, shown, formatter)[1] if k not in {_key(h.message)
                                                                      for h in chosen}]
    report = RecallReport(
        query=recall.query, found=len(hits), hits=[_key(h.message) for h in chosen],
        context=context, skipped=skipped, dropped=beyond + len(candidates) - kept)
    return Selection(message, report, truncated=kept < len(candidates))


def _render(hits: list[SearchHit], shown: set[Key],
            formatter: Formatter) -> tuple[Message, list[Key]]:
    """One system message listing ``hits`` (each with its context), and what it shows."""
    seen: set[Key] = set(shown)
    items: list[str] = []
    order: list[Key] = []
    for hit in hits:
        lines = []
        for message in (*hit.before, hit.message, *hit.after):
            key = _key(message)
            if key in seen:
                continue
            seen.add(key)
            order.append(key)
            lines.append(_line(message))
        if lines:
            items.append("\n".join(lines))
    text = formatter(items)
    if not isinstance(text, str):
        raise ConfigurationError(f"the recall formatter returned a {type(text).__name__}, "
                                 "not a string")
    return Message.system(text), order
