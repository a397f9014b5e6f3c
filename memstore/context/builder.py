"""The context builder: one token budget allocated over tiered blocks.

An agent's prompt is more than its chat history: a system prompt that must fit,
facts, retrieved documents that may be dropped, the stored history that may be
trimmed or summarised, a scratchpad. [`ContextBuilder`][memstore.ContextBuilder] serves
[`Block`][memstore.Block] objects in tier order ([`Tier`][memstore.Tier], insertion order within a
tier),
gives each the budget that is left (or its own ``max_tokens`` cap when smaller),
and applies the block's [`Strategy`][memstore.Strategy] only when the block does not fit. The
result, a [`CompiledContext`][memstore.CompiledContext], carries a
[`CompileReport`][memstore.CompileReport] of what was
evicted and why.

Guarantee: ``counter.count_messages(compiled.messages) <= max_tokens``, always,
or an error (`ContextBudgetError` with the numbers).

Token arithmetic: the builder counts each message once with ``count_message``
(a stored message's count is reused when it came from the same counter) and
charges the reply priming (``counter.count_messages([])``) once, before the first
block, so ``total_tokens_used = priming + Σ tokens_per_block``; with an additive
counter (every memstore counter, and what [`TokenCounter`][memstore.TokenCounter]
asks for) that equals ``counter.count_messages(messages)``.

Units: an assistant message with ``tool_calls`` and the ``tool`` messages right
after it form one unit (the run rule of `memstore.views.units`); no strategy ever
splits one, and a custom strategy's output that does is refused.

A [`HistoryBlock`][memstore.HistoryBlock] reads a stored conversation through a view sized to the
budget its block actually gets, so it reads O(window) rows, never the whole
history. The builder itself runs no SQL: history blocks go through the store's
public ``window`` method.

Reference: contexty (Go, v0.1–v0.3.3), ``Builder.Compile`` with tiers.

Differences: contexty keys its report maps by block id, so duplicate ids overwrite
each other; memstore refuses a duplicate id. contexty's ``BlocksDropped`` may
repeat; memstore's never does. contexty checks a custom strategy's output against
the *global* remainder; memstore checks it against the block's own budget (its cap
or what remains, whichever is smaller). contexty's pair mode
(``KeepUserAssistantPairs``) leaves orphan tool results; memstore never splits a
tool unit. contexty truncates system messages unless their role is protected;
memstore never removes system, developer or pinned messages in
[`TruncateOldest`][memstore.TruncateOldest]. contexty has no stored history; memstore's history
blocks read only the window.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
from collections.abc import Generator, Iterable, Mapping
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any, Protocol, cast

from pydantic import JsonValue

from memstore._validate import short_repr
from memstore.context.compiled import CompiledContext, CompileReport, stamp_cache_control
from memstore.context.recall import Recall, RecallReport, SearchSource
from memstore.context.recall import select as _select_recall
from memstore.context.strategies import (
    Drop,
    Strategy,
    Strict,
    Summarize,
    SummarizeCall,
    Summarizer,
    TruncateOldest,
    is_anchored_unit,
    newest_unit,
    splits_units,
    units_of,
)
from memstore.errors import (
    ConfigurationError,
    ContextBudgetError,
    ConversationNotFoundError,
    InvalidInputError,
    NotFoundError,
)
from memstore.formats import message_list
from memstore.models import MAX_ID_LENGTH, Message, StoredMessage
from memstore.models.common import _check_json
from memstore.tokens import (
    TokenCounter,
    count_tool_schemas,
    default_counter,
    message_tokens,
    validate_counter,
)
from memstore.tokens._checked import checked_counter
from memstore.views import ContextView, RecentTurnsView, ScoreBasedView, TokenLimitedView
from memstore.views.parts import MAX_VIEW_INT
from memstore.views.window import ContextWindow, WindowReport


class WindowSource(Protocol):
    """What a history block needs of a store: its ``window`` method.

    [`MemoryStore`][memstore.MemoryStore] and [`AsyncMemoryStore`][memstore.AsyncMemoryStore] (whose
    ``window`` is a coroutine) both are one; the builder never imports a store.
    """

    def window(self, conversation_id: str, view: ContextView, /) -> Any:
        """The conversation's window through ``view`` (or an awaitable of it)."""

__all__ = [
    "Block",
    "CompileReport",
    "CompiledContext",
    "ContextBuilder",
    "Drop",
    "HistoryBlock",
    "Recall",
    "RecallReport",
    "SearchSource",
    "Strategy",
    "Strict",
    "Summarize",
    "Summarizer",
    "Tier",
    "TruncateOldest",
]


class Tier(IntEnum):
    """Standard block tiers; lower is served first. Any int is a valid custom tier."""

    SYSTEM = 0
    CORE = 1
    RAG = 2
    HISTORY = 3
    SCRATCHPAD = 4


# ---- blocks -----------------------------------------------------------------------------


def _check_conversation_id(value: object) -> str:
    if not isinstance(value, str):
        raise InvalidInputError(f"conversation id must be a str, not {type(value).__name__}")
    if not value or len(value) > MAX_ID_LENGTH or "\x00" in value:
        raise InvalidInputError(
            f"conversation id must be 1–{MAX_ID_LENGTH} characters with no NUL, "
            f"got {short_repr(value)}"
        )
    return value


@dataclass(frozen=True)
class HistoryBlock:
    """A stored conversation as a block's content.

    The builder reads it with ``store.window(conversation_id, view)`` (or
    ``await store.window(...)`` for an [`AsyncMemoryStore`][memstore.AsyncMemoryStore],
    under [`ContextBuilder.acompile()`][memstore.ContextBuilder.acompile]):

    * a budgeted view (default [`TokenLimitedView`][memstore.TokenLimitedView]; any view
      with a ``token_limit``) is rebuilt with ``token_limit`` = the budget the block
      actually gets plus the reply priming (the view counts priming, the builder
      charges it once for the whole output) and with the builder's counter, so it
      reads O(window) rows, never the whole history. Its other settings
      (``reserve``, ``tools``, ``start_on_user`` …) are kept. The view does the
      truncation (oldest first); when it leaves messages out for the budget the
      block did not fit: [`Strict`][memstore.Strict] raises, [`Drop`][memstore.Drop] drops the
      block,
      [`TruncateOldest`][memstore.TruncateOldest] keeps the window (``keep_turns_atomic`` reads it
      with
      ``start_on_user=True``) and the report labels the block ``"truncated"``.
      [`Summarize`][memstore.Summarize] and ``TruncateOldest(protect_roles=...)`` need a
      count-based view (a `ConfigurationError` when the
      [`Block`][memstore.Block] is made);
    * when the view's required part (anchored messages and the newest unit) does
      not fit that budget, the view is read again with exactly the budget it needs
      and the block's strategy decides: [`Strict`][memstore.Strict] raises, [`Drop`][memstore.Drop]
      drops, [`TruncateOldest`][memstore.TruncateOldest] raises
      `ContextBudgetError` (it never drops the question);
    * a count-based view (``BufferedView``, ``RecentTurnsView`` …) is applied as it
      is, then the block's strategy trims if needed.

    A conversation that is not stored yet is an empty block (skipped).

    Args:
        store: a [`MemoryStore`][memstore.MemoryStore] or
            [`AsyncMemoryStore`][memstore.AsyncMemoryStore].
        conversation_id: the conversation to read.
        view: the view to read it through; ``None`` for a ``TokenLimitedView``.

    Raises:
        ConfigurationError: (a ``ValueError``) ``store`` has no ``window`` method or
            ``view`` is not a view.
        InvalidInputError: (a ``ValueError``) an invalid conversation id.
    """

    store: WindowSource
    conversation_id: str
    view: ContextView | None = None

    def __post_init__(self) -> None:
        if not callable(getattr(self.store, "window", None)):
            raise ConfigurationError(
                f"HistoryBlock needs a MemoryStore or AsyncMemoryStore, "
                f"got {short_repr(self.store)}"
            )
        _check_conversation_id(self.conversation_id)
        if self.view is not None and not isinstance(self.view, ContextView):
            raise ConfigurationError(
                f"HistoryBlock view must be a ContextView, got {short_repr(self.view)}"
            )

    @property
    def is_async(self) -> bool:
        """Whether the store's ``window`` is a coroutine (an ``AsyncMemoryStore``)."""
        return inspect.iscoroutinefunction(self.store.window)


def _check_block_id(value: object) -> str:
    if not isinstance(value, str) or not value:
        raise ConfigurationError(f"a block id must be a non-empty string, got {short_repr(value)}")
    return value


@dataclass(frozen=True, init=False, eq=False)
class Block:
    """One part of the prompt: fixed messages or a stored history, with a strategy.

    Args:
        id: the block's name (unique in a builder; the report's keys).
        tier: a [`Tier`][memstore.Tier] or any int (lower is served first).
        strategy: what to do when the block does not fit (required).
        messages: the block's messages (copied at construction), or
        history: a [`HistoryBlock`][memstore.HistoryBlock], or
        recall: a [`Recall`][memstore.context.recall.Recall]: what a search of the store
            finds, as one message (see `memstore.context.recall`) — exactly one of the
            three.
        max_tokens: a cap (>= 1): the block gets ``min(max_tokens, remaining)``.
        cache_control: a JSON object (e.g. ``{"type": "ephemeral"}``) stamped on a
            copy of the block's last output message (metadata
            ``{"memstore": {"cache_control": ...}}``).
            [`CompiledContext.to_anthropic()`][memstore.CompiledContext.to_anthropic]
            puts it on the last content block;
            [`CompiledContext.to_openai()`][memstore.CompiledContext.to_openai] leaves it
            out unless asked (``cache_control=True``) for an Anthropic-compatible
            gateway. Not interpreted otherwise.

    Raises:
        ConfigurationError: (a ``ValueError``) ``strategy=None``, both or neither of
            ``messages``/``history``, a ``max_tokens`` <= 0, a non-int tier, a
            non-Message in ``messages``, a ``cache_control`` that is not a JSON object,
            or a history block whose budgeted view cannot serve its strategy
            ([`Summarize`][memstore.Summarize], ``TruncateOldest(protect_roles=...)``, or
            ``TruncateOldest(keep_turns_atomic=True)`` with a view that has no
            ``start_on_user``).
    """

    id: str
    tier: int
    strategy: Strategy
    messages: tuple[Message, ...] | None = None
    history: HistoryBlock | None = None
    max_tokens: int | None = None
    cache_control: Mapping[str, JsonValue] | None = field(default=None, hash=False)
    recall: Recall | None = None

    def __init__(
        self,
        id: str,
        *,
        tier: int,
        strategy: Strategy,
        messages: Iterable[Message] | None = None,
        history: HistoryBlock | None = None,
        max_tokens: int | None = None,
        cache_control: Mapping[str, JsonValue] | None = None,
        recall: Recall | None = None,
    ) -> None:
        _check_block_id(id)
        where = f"block {id!r}"  # (a valid id by now: shown whole)
        if not isinstance(tier, int) or isinstance(tier, bool):
            raise ConfigurationError(
                f"{where}: tier must be a Tier or an int, got {short_repr(tier)}"
            )
        if strategy is None:
            raise ConfigurationError(f"{where} has no strategy")
        if not isinstance(strategy, Strategy):
            raise ConfigurationError(
                f"{where}: strategy must be a Strategy (Strict(), Drop(), TruncateOldest(), "
                f"Summarize(...) or a subclass), got {short_repr(strategy)}"
            )
        if (messages is not None) + (history is not None) + (recall is not None) != 1:
            raise ConfigurationError(
                f"{where} needs exactly one of messages=, history= or recall=")
        if recall is not None and not isinstance(recall, Recall):
            raise ConfigurationError(f"{where}: recall must be a Recall, got {short_repr(recall)}")
        copied: tuple[Message, ...] | None = None
        if messages is not None:
            copied = tuple(message_list(messages, f"{where}: messages", ConfigurationError))
        if history is not None and not isinstance(history, HistoryBlock):
            raise ConfigurationError(
                f"{where}: history must be a HistoryBlock, got {short_repr(history)}"
            )
        if history is not None:
            _check_history_strategy(where, strategy, history.view)
        if max_tokens is not None and (
            not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens <= 0
        ):
            raise ConfigurationError(
                f"{where}: max_tokens must be an int >= 1, got {short_repr(max_tokens)}"
            )
        control: dict[str, JsonValue] | None = None
        if cache_control is not None:
            if not isinstance(cache_control, Mapping):
                raise ConfigurationError(f"{where}: cache_control must be a JSON object")
            try:
                _check_json(cache_control, "cache_control")
                control = json.loads(json.dumps(dict(cache_control)))
            except (TypeError, ValueError) as exc:
                raise ConfigurationError(f"{where}: {exc}") from exc
        for name, value in (("id", id), ("tier", tier), ("strategy", strategy),
                            ("messages", copied), ("history", history),
                            ("max_tokens", max_tokens), ("cache_control", control),
                            ("recall", recall)):
            object.__setattr__(self, name, value)


def _is_budgeted(view: ContextView | None) -> bool:
    """Whether the builder sizes ``view`` to the block's budget (``None``: a TokenLimitedView)."""
    return view is None or (view.budgeted and "token_limit" in _view_fields(view))


def _check_history_strategy(where: str, strategy: Strategy, view: ContextView | None) -> None:
    """Refuse the strategies a budgeted history view cannot serve in O(window)."""
    if not _is_budgeted(view):
        return
    name = "TokenLimitedView" if view is None else type(view).__name__
    if isinstance(strategy, Summarize):
        raise ConfigurationError(
            f"{where}: Summarize cannot serve a history block read through a budgeted view "
            f"({name}): the view already trims the history to the budget, and summarizing "
            "what it leaves out would re-read and re-summarize the whole history on every "
            "compile. Keep a persistent summary instead: call store.summarize(...) as the "
            "conversation grows and read it with HistoryBlock(store, id, SummaryView(...)) "
            "(see docs/summaries.md), or give the block a count-based view (BufferedView, "
            "RecentTurnsView, ...) to summarize what does not fit on each compile"
        )
    if isinstance(strategy, TruncateOldest):
        if strategy.protect_roles:
            raise ConfigurationError(
                f"{where}: TruncateOldest(protect_roles={list(strategy.protect_roles)}) needs "
                f"a count-based view (BufferedView, RecentTurnsView, ...): the budgeted view "
                f"({name}) trims the history oldest first and cannot protect roles"
            )
        # Whole turns need a contiguous suffix cut at a user message: ScoreBasedView's
        # picks by score may keep a turn's question and drop its answer.
        if strategy.keep_turns_atomic and view is not None and (
                isinstance(view, ScoreBasedView) or "start_on_user" not in _view_fields(view)):
            raise ConfigurationError(
                f"{where}: TruncateOldest(keep_turns_atomic=True) on a budgeted view needs "
                f"a contiguous suffix starting on a user message, which {name} does not "
                "give; use TokenLimitedView or a count-based view (BufferedView, "
                "RecentTurnsView, ...)"
            )


# ---- requests: the two steps that may await ----------------------------------------------


@dataclass(frozen=True)
class _ReadWindow:
    history: HistoryBlock
    view: ContextView
    block_id: str

    def run_sync(self) -> ContextWindow | None:
        if self.history.is_async:
            raise ConfigurationError(
                f"block {self.block_id!r} reads an AsyncMemoryStore; use "
                "`await builder.acompile()`"
            )
        try:
            result = self.history.store.window(self.history.conversation_id, self.view)
        except ConversationNotFoundError:
            return None
        if inspect.isawaitable(result):  # pragma: no cover - a store faking its type
            if inspect.iscoroutine(result):
                result.close()
            raise ConfigurationError(
                f"block {self.block_id!r}'s store returned an awaitable; use "
                "`await builder.acompile()`"
            )
        return cast(ContextWindow, result)

    async def run_async(self) -> ContextWindow | None:
        try:
            result: Any = self.history.store.window(self.history.conversation_id, self.view)
            if inspect.isawaitable(result):
                result = await result
        except ConversationNotFoundError:
            return None
        return cast(ContextWindow, result)


@dataclass(frozen=True)
class _Search:
    recall: Recall
    block_id: str

    def run_sync(self) -> list[Any]:
        if self.recall.is_async:
            raise ConfigurationError(
                f"block {self.block_id!r} searches an AsyncMemoryStore; use "
                "`await builder.acompile()`"
            )
        return list(self.recall.store.search(self.recall.query, **self.recall.arguments()))

    async def run_async(self) -> list[Any]:
        result: Any = self.recall.store.search(self.recall.query, **self.recall.arguments())
        if inspect.isawaitable(result):
            result = await result
        return list(result)


_Request = _ReadWindow | SummarizeCall | _Search


# ---- the builder ------------------------------------------------------------------------


def _view_fields(view: ContextView) -> set[str]:
    return {f.name for f in dataclasses.fields(view)} if dataclasses.is_dataclass(view) else set()


def _min_view_limit(view: ContextView | None) -> int:
    reserve = getattr(view, "reserve", 0) if view is not None else 0
    return max(1, (reserve if isinstance(reserve, int) else 0) + 1)


#: Omission reasons that mean "left out for the budget": TokenLimitedView and
#: SummaryView say ``"budget"``, ScoreBasedView ``"score"``.
_BUDGET_REASONS = frozenset({"budget", "score"})


def _left_out_for_budget(report: WindowReport) -> int:
    """How many messages a budgeted view left out because they did not fit."""
    return sum(o.count for o in report.omitted if o.reason in _BUDGET_REASONS)


class ContextBuilder:
    """Allocate one token budget over tiered blocks.

    Blocks are served in tier order (insertion order within a tier); empty blocks
    are skipped. Each block gets ``min(block.max_tokens, remaining)`` (or what
    remains); a block that fits is kept as it is, otherwise its strategy is applied
    and its output recounted. Reply priming (``counter.count_messages([])``) is
    charged once, before the first block. Blocks persist across compiles;
    compiling twice with nothing changed gives the same result. The builder is not
    thread-safe while blocks are being added or removed.

    Args:
        max_tokens: the budget (an int from 1 to 2**53 - 1, the views' limit, and at
            least the counter's priming).
        counter: the token counter; defaults to the offline cl100k
            [`TiktokenCounter`][memstore.TiktokenCounter].

    Raises:
        ConfigurationError: (a ``ValueError``) ``max_tokens`` <= 0, above 2**53 - 1 or
            below the reply priming, ``counter`` is not a ``TokenCounter``, or its
            ``count_messages([])`` is not an int >= 0.
    """

    def __init__(self, max_tokens: int, counter: TokenCounter | None = None) -> None:
        if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens <= 0:
            raise ConfigurationError(
                f"ContextBuilder max_tokens must be an int >= 1, got {short_repr(max_tokens)}"
            )
        if max_tokens > MAX_VIEW_INT:
            raise ConfigurationError(
                f"ContextBuilder max_tokens must be <= 2**53 - 1 ({MAX_VIEW_INT}), the largest "
                f"token limit a view takes, got {short_repr(max_tokens)}"
            )
        if counter is None:
            counter = default_counter()
        else:  # name, count_message and count_messages are all a counter must have
            counter = validate_counter(counter, "ContextBuilder counter")
        self._given_counter = counter
        # Every count the builder (and its strategies) takes is checked: an int >= 0,
        # else a ConfigurationError naming the counter (memstore's own are not wrapped).
        counter = checked_counter(counter)
        priming = counter.count_messages([])
        if priming > max_tokens:
            raise ConfigurationError(
                f"ContextBuilder max_tokens ({max_tokens}) is below the counter's reply "
                f"priming ({priming}): not even an empty request fits"
            )
        self._max_tokens = max_tokens
        self._counter = counter
        self._priming = priming
        self._blocks: dict[str, Block] = {}

    @property
    def max_tokens(self) -> int:
        """The budget."""
        return self._max_tokens

    @property
    def counter(self) -> TokenCounter:
        """The token counter."""
        return self._given_counter

    @property
    def blocks(self) -> tuple[Block, ...]:
        """The blocks, in insertion order."""
        return tuple(self._blocks.values())

    def add_block(self, block: Block) -> ContextBuilder:
        """Add a block; returns the builder so calls chain.

        Raises:
            ConfigurationError: (a ``ValueError``) not a [`Block`][memstore.Block], or a block with
                this id is already added.
        """
        if not isinstance(block, Block):
            raise ConfigurationError(f"add_block needs a Block, got {short_repr(block)}")
        if block.id in self._blocks:
            raise ConfigurationError(
                f"a block with id {block.id!r} is already added; ids must be unique "
                "(remove_block it first to replace it)"
            )
        self._blocks[block.id] = block
        return self

    def remove_block(self, id: str) -> ContextBuilder:
        """Remove the block ``id``; returns the builder.

        Raises:
            ConfigurationError: (a ``ValueError``) ``id`` is not a non-empty string.
            NotFoundError: (a ``LookupError``) no block has this id.
        """
        _check_block_id(id)
        if id not in self._blocks:
            raise NotFoundError(f"no block with id {short_repr(id)}")
        del self._blocks[id]
        return self

    def compile(self) -> CompiledContext:
        """Compile the blocks into one context.

        Raises:
            ContextBudgetError: a [`Strict`][memstore.Strict] block does not fit (for a history
                block: its budgeted view left messages out), protected messages (in a
                history block: with the newest unit, or with ``keep_turns_atomic`` its
                whole turn) do not fit a [`TruncateOldest`][memstore.TruncateOldest] or
                [`Summarize`][memstore.Summarize]
                block, or a custom strategy exceeded the block's budget.
            ConfigurationError: a history block reads an ``AsyncMemoryStore``, a
                summarizer is async (use `acompile()`), a custom strategy split
                a tool unit, or the counter returned a count that is not an int >= 0.
            InvalidInputError: a summarizer returned an empty summary, or one that
                ``store.summarize`` would refuse (a NUL character, ...).
        """
        steps = self._steps()
        value: Any = None
        error: BaseException | None = None
        while True:
            try:
                request = steps.send(value) if error is None else steps.throw(error)
            except StopIteration as stop:
                return cast(CompiledContext, stop.value)
            value, error = None, None
            try:
                value = request.run_sync()
            except Exception as exc:  # handed to the step that asked; it decides
                error = exc

    async def acompile(self) -> CompiledContext:
        """Compile, awaiting async history stores and async summarizers.

        Works with sync stores and summarizers too. Raises as `compile()`.
        """
        steps = self._steps()
        value: Any = None
        error: BaseException | None = None
        while True:
            try:
                request = steps.send(value) if error is None else steps.throw(error)
            except StopIteration as stop:
                return cast(CompiledContext, stop.value)
            value, error = None, None
            try:
                value = await request.run_async()
            except Exception as exc:
                error = exc

    # ---- internals ----------------------------------------------------------------------

    def _read_sized(
        self, block: Block, budget: int, start_on_user: bool,
    ) -> Generator[_Request, Any, tuple[ContextWindow | None, ContextView]]:
        """Read a budgeted history view sized to ``budget`` (plus the reply priming)."""
        history = block.history
        assert history is not None
        view = history.view
        names = _view_fields(view) if view is not None else set()
        limit = max(budget + self._priming, _min_view_limit(view))
        for _ in range(8):
            if view is None:
                sized: ContextView = TokenLimitedView(
                    token_limit=limit, counter=self._counter, start_on_user=start_on_user)
            else:
                changes: dict[str, Any] = {"token_limit": limit}
                if "counter" in names:
                    changes["counter"] = self._counter
                if start_on_user:
                    changes["start_on_user"] = True
                sized = dataclasses.replace(cast(Any, view), **changes)
            try:
                window = yield _ReadWindow(history, sized, block.id)
            except ContextBudgetError as exc:
                # The required part (anchored messages + newest unit) does not fit:
                # read exactly that part, and let the block's strategy decide.
                limit = max(exc.required, limit + 1)
                if limit > MAX_VIEW_INT:
                    raise ContextBudgetError(
                        f"block {block.id!r}: its anchored messages and newest unit need "
                        f"{exc.required} tokens and its budget is {budget}",
                        required=exc.required, budget=budget,
                    ) from exc
                continue
            return window, sized
        raise ContextBudgetError(  # pragma: no cover - a conversation growing while read
            f"block {block.id!r}: the conversation's newest unit kept growing while "
            "it was being read", required=limit, budget=budget,
        )

    def _read_history(
        self, block: Block, budget: int
    ) -> Generator[_Request, Any, tuple[list[Message], WindowReport, int]]:
        """Read a history block's window.

        Returns its messages, the view's report, and how many messages a budgeted
        view left out for the budget (0 for a count-based view).
        """
        history = block.history
        assert history is not None
        counter = self._counter
        view = history.view
        if not _is_budgeted(view):
            assert view is not None
            window = yield _ReadWindow(history, view, block.id)
            if window is None:  # not stored yet: an empty block
                return [], view.apply([], counter).report, 0
            return list(window.messages), window.report, 0
        strategy = block.strategy
        turns = isinstance(strategy, TruncateOldest) and strategy.keep_turns_atomic
        forced = turns and not getattr(view, "start_on_user", False)
        window, sized = yield from self._read_sized(block, budget, forced)
        if window is None:  # not stored yet: an empty block
            return [], sized.apply([], counter).report, 0
        left_out = _left_out_for_budget(window.report)
        if forced and not left_out and any(
                o.reason == "start_on_user" for o in window.report.omitted):
            # The whole history fit: start_on_user only cut the units before the first
            # user message, which a block that fits keeps. Read it as configured.
            window, sized = yield from self._read_sized(block, budget, False)
            assert window is not None
            left_out = _left_out_for_budget(window.report)
        messages = list(window.messages)
        if turns and left_out:
            first = next((m for s, e in units_of(messages)
                          if not is_anchored_unit(messages[s:e]) for m in messages[s:e]), None)
            if first is not None and first.role != "user":
                # The view could not reach the question of the turn being answered (or
                # there is none): read that turn alone, O(turn), to tell which.
                turn = yield _ReadWindow(history, RecentTurnsView(max_turns=1), block.id)
                needed = sum(message_tokens(m, counter) for m in turn.messages) if turn else 0
                # What the view keeps free beside the messages (its reserve, tool schemas).
                reserve = getattr(sized, "reserve", 0)
                needed += (reserve if isinstance(reserve, int) else 0) + count_tool_schemas(
                    counter, getattr(sized, "tools", None))
                if needed > budget:
                    raise ContextBudgetError(
                        f"block {block.id!r}: the turn being answered (its user message and "
                        f"everything after it) with the anchored messages needs {needed} "
                        f"tokens and its budget is {budget} (TruncateOldest(keep_turns_atomic="
                        "True) never sends a reply without its question)",
                        required=needed, budget=budget,
                    )
        return messages, window.report, left_out

    def _view_truncated(
        self, block: Block, messages: list[Message], counts: list[int], budget: int,
        newest: tuple[int, int] | None, left_out: int,
    ) -> list[Message]:
        """The block's strategy when its budgeted view left ``left_out`` messages out."""
        strategy = block.strategy
        if isinstance(strategy, Strict):
            # The rest of the history is never read to be counted: ``required`` is the
            # least it could be.
            raise ContextBudgetError(
                f"block {block.id!r}: its history does not fit its budget of {budget} tokens "
                f"(the view left out {left_out} message(s) for the budget) (Strict)",
                required=budget + 1, budget=budget,
            )
        if isinstance(strategy, Drop):
            return []
        if isinstance(strategy, TruncateOldest):
            # Nothing more to remove for the budget; min_messages still applies.
            return strategy._truncate(block.id, messages, counts, budget, newest)[0]
        return messages  # a custom strategy: the view's truncation stands

    def _check_skips(self, blocks: list[Block]) -> None:
        """Refuse a recall block whose ``skip`` names no history block of this builder."""
        for block in blocks:
            skip = block.recall.skip if block.recall is not None else None
            if skip is None:
                continue
            target = self._blocks.get(skip)
            if target is None or target.history is None:
                raise ConfigurationError(
                    f"block {block.id!r} skips the messages of block {skip!r}, which is not "
                    "a history block of this builder")

    def _steps(self) -> Generator[_Request, Any, CompiledContext]:
        counter = self._counter
        priming = self._priming
        remaining = self._max_tokens - priming
        output: list[Message] = []
        original_per_block: dict[str, int] = {}
        per_block: dict[str, int] = {}
        evictions: dict[str, str] = {}
        dropped: list[str] = []
        history_reports: dict[str, WindowReport] = {}
        recall_reports: dict[str, RecallReport] = {}
        #: history block id -> the stored messages it shows (a recall's ``skip``)
        shown_by: dict[str, set[tuple[str, int]]] = {}
        #: recall blocks whose ``skip`` history block is served after them
        pending: list[tuple[Block, list[Any], int]] = []
        ordered = sorted(self._blocks.values(), key=lambda b: int(b.tier))
        self._check_skips(ordered)
        for block in ordered:
            budget = remaining if block.max_tokens is None else min(block.max_tokens, remaining)
            left_out = 0
            newest: tuple[int, int] | None = None
            if block.history is not None:
                messages, window_report, left_out = yield from self._read_history(block, budget)
                history_reports[block.id] = window_report
                # The turn being answered: the newest unit that is not anchored, as the
                # views keep it (a system reminder after the question does not replace it).
                newest = newest_unit(messages)
                shown_by[block.id] = set()
            elif block.recall is not None:
                hits = yield _Search(block.recall, block.id)
                skip = block.recall.skip
                selection = _select_recall(
                    block.id, block.recall, hits, shown_by.get(skip or "", set()), budget,
                    lambda m: message_tokens(m, counter),
                    strict=isinstance(block.strategy, Strict),
                    drop=isinstance(block.strategy, Drop))
                recall_reports[block.id] = selection.report
                if selection.truncated:
                    evictions[block.id] = (
                        "dropped" if isinstance(block.strategy, Drop) else "truncated")
                if selection.message is None:
                    if selection.truncated:
                        dropped.append(block.id)
                        per_block[block.id] = 0
                    continue
                if skip is not None and skip not in shown_by:
                    pending.append((block, hits, len(output)))
                messages = [selection.message]
            else:
                messages = list(block.messages or ())
            if not messages:
                continue
            counts = [message_tokens(m, counter) for m in messages]
            tokens = sum(counts)
            original_per_block[block.id] = tokens
            strategy = block.strategy
            if tokens <= budget and not left_out:
                kept = messages
            elif tokens <= budget:
                # A budgeted view left messages out for the budget: the block did not fit,
                # and the view did the truncation (oldest first, O(window)).
                kept = self._view_truncated(block, messages, counts, budget, newest, left_out)
                evictions[block.id] = "dropped" if isinstance(strategy, Drop) else "truncated"
            else:
                kept = yield from strategy._evict(block.id, messages, counts, budget, counter,
                                                  newest)
                if not isinstance(kept, list) or not all(isinstance(m, Message) for m in kept):
                    raise ConfigurationError(
                        f"strategy {type(strategy).__name__} of block {block.id!r} must return "
                        f"a list of Message, got {short_repr(kept)}"
                    )
                if splits_units(messages, kept):
                    raise ConfigurationError(
                        f"strategy {type(strategy).__name__} of block {block.id!r} split a tool "
                        "unit (a call without all its results, or a result without its call)"
                    )
                evictions[block.id] = strategy.label
            if not kept:
                dropped.append(block.id)
                per_block[block.id] = 0
                continue
            if kept is not messages:
                counts = [message_tokens(m, counter) for m in kept]
            if block.cache_control is not None:
                kept = [*kept[:-1], stamp_cache_control(kept[-1], block.cache_control)]
                counts = [*counts[:-1], message_tokens(kept[-1], counter)]
            used = sum(counts)
            if used > budget:
                raise ContextBudgetError(
                    f"strategy {type(block.strategy).__name__} exceeded its budget in block "
                    f"{block.id!r}: its output needs {used} tokens and the block's budget is "
                    f"{budget}",
                    required=used, budget=budget,
                )
            per_block[block.id] = used
            remaining -= used
            output.extend(kept)
            if block.history is not None:
                shown_by[block.id] = {(m.conversation_id, m.seq) for m in kept
                                      if isinstance(m, StoredMessage)}
        for block, hits, position in reversed(pending):
            # Its history block was served after it: keep the best hits that block does
            # not show, within the tokens the recall block was given.
            assert block.recall is not None
            selection = _select_recall(
                block.id, block.recall, hits, shown_by.get(block.recall.skip or "", set()),
                per_block[block.id], lambda m: message_tokens(m, counter))
            recall_reports[block.id] = selection.report
            if selection.truncated:
                evictions[block.id] = "truncated"
            if selection.message is None:
                del output[position]
                remaining += per_block[block.id]
                per_block[block.id] = 0
                continue
            replacement = selection.message
            if block.cache_control is not None:
                replacement = stamp_cache_control(replacement, block.cache_control)
            used = message_tokens(replacement, counter)
            remaining += per_block[block.id] - used
            per_block[block.id] = used
            output[position] = replacement
        total = self._max_tokens - remaining
        report = CompileReport(
            total_tokens_used=total,
            remaining_tokens=remaining,
            original_tokens=sum(original_per_block.values()),
            original_tokens_per_block=original_per_block,
            tokens_per_block=per_block,
            evictions=evictions,
            blocks_dropped=dropped,
            history_reports=history_reports,
            recall_reports=recall_reports,
        )
        return CompiledContext(
            messages=output, token_count=total, max_tokens=self._max_tokens, report=report
        )

