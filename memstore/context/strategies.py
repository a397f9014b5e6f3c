"""Eviction strategies: what a block does when it does not fit its budget.

Built in: [`Strict`][memstore.Strict] (raise), [`Drop`][memstore.Drop] (leave the block out),
[`TruncateOldest`][memstore.TruncateOldest] (remove the oldest units) and
[`Summarize`][memstore.Summarize] (replace the
block by a summary). A custom strategy subclasses [`Strategy`][memstore.Strategy] and implements
[`Strategy.apply()`][memstore.Strategy.apply]. [`ContextBuilder`][memstore.ContextBuilder] applies a
block's
strategy only when the block does not fit, and checks what it returns.

Units: an assistant message with ``tool_calls`` and the ``tool`` messages right
after it form one unit (the run rule of `memstore.views.units`); no strategy here
ever splits one. Pure: no I/O (a summarizer may do I/O; the builder calls it).
"""

from __future__ import annotations

import abc
import inspect
from collections.abc import Awaitable, Callable, Generator, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from memstore._validate import (
    check_flag,
    check_size,
    is_async_callable,
    refuse_awaitable,
    short_repr,
    text_problem,
    utf8_size,
)
from memstore.errors import ConfigurationError, ContextBudgetError, InvalidInputError
from memstore.models import ANCHOR_ROLES, Message
from memstore.tokens import TokenCounter, message_tokens
from memstore.tokens._checked import checked_counter

__all__ = [
    "Drop",
    "Strategy",
    "Strict",
    "Summarize",
    "Summarizer",
    "TruncateOldest",
]

#: A summarizer: called with a block's messages, returns the summary text (which
#: becomes a ``system`` message) or a message. May be ``async`` (then only
#: [`acompile()`][memstore.ContextBuilder.acompile] can call it).
Summarizer = Callable[[list[Message]], str | Message | Awaitable[str | Message]]


# ---- units ------------------------------------------------------------------------------


def units_of(messages: Sequence[Message]) -> list[tuple[int, int]]:
    """Index ranges ``[start, end)`` of the units of a chronological message list.

    An assistant message with ``tool_calls`` and every ``tool`` message right after
    it form one unit (a whole run: a stray result inside the run stays with it);
    every other message is a unit of its own. A superset of
    `memstore.views.units.group_units()`' grouping, so it never splits one of its units.
    """
    out: list[tuple[int, int]] = []
    i, n = 0, len(messages)
    while i < n:
        j = i + 1
        if messages[i].role == "assistant" and messages[i].tool_calls:
            while j < n and messages[j].role == "tool":
                j += 1
        out.append((i, j))
        i = j
    return out


def _runs(messages: Sequence[Message]) -> list[tuple[Message, ...]]:
    """The tool runs of a list (a call and its results, or stray results)."""
    runs: list[tuple[Message, ...]] = []
    i, n = 0, len(messages)
    while i < n:
        m = messages[i]
        is_call = m.role == "assistant" and bool(m.tool_calls)
        if is_call or m.role == "tool":
            j = i + 1
            while j < n and messages[j].role == "tool":
                j += 1
            runs.append(tuple(messages[i:j]))
            i = j
        else:
            i += 1
    return runs


def _run_complete(run: tuple[Message, ...]) -> bool:
    """Whether a run is a call whose ids are each answered exactly once, with nothing else."""
    head = run[0]
    if head.role != "assistant" or not head.tool_calls:
        return False
    answers = [m.tool_call_id for m in run[1:]]
    return len(answers) == len(set(answers)) and set(answers) == set(head.tool_call_ids)


def splits_units(original: Sequence[Message], output: Sequence[Message]) -> bool:
    """Whether ``output`` holds a tool run that is neither complete nor one of ``original``'s."""
    incomplete = [run for run in _runs(output) if not _run_complete(run)]
    if not incomplete:
        return False
    given = _runs(original)  # messages are not hashable: compare by value
    return any(run not in given for run in incomplete)



def is_anchored_unit(messages: Sequence[Message]) -> bool:
    """Whether a unit holds a ``system``, ``developer`` or pinned message."""
    return any(m.pinned or m.role in ANCHOR_ROLES for m in messages)


def newest_unit(messages: Sequence[Message]) -> tuple[int, int] | None:
    """Index range ``[start, end)`` of the newest unit that holds no anchored message.

    This is the unit every view keeps (the turn being answered); the anchored
    messages after it (a system reminder, a pinned note) do not take its place.
    ``None`` when every unit is anchored.
    """
    for start, end in reversed(units_of(messages)):
        if not is_anchored_unit(messages[start:end]):
            return start, end
    return None


# ---- strategies -------------------------------------------------------------------------


class Strategy(abc.ABC):
    """What a block does when it does not fit its budget.

    Built in: [`Strict`][memstore.Strict], [`Drop`][memstore.Drop],
    [`TruncateOldest`][memstore.TruncateOldest],
    [`Summarize`][memstore.Summarize]. A custom strategy subclasses this class and implements
    `apply()`; the builder recounts its output, raises
    `ContextBudgetError` when it overruns the block's budget,
    refuses output that splits a tool unit (`ConfigurationError`),
    and reports the block as ``"evicted"``.
    """

    #: The eviction label in `CompileReport.evictions`.
    label: ClassVar[str] = "evicted"

    @abc.abstractmethod
    def apply(
        self,
        messages: list[Message],
        tokens: int,
        limit: int,
        counter: TokenCounter,
    ) -> list[Message]:
        """Return the messages to keep (``[]`` drops the block).

        Args:
            messages: the block's messages (a copy; chronological).
            tokens: their tokens (``Σ count_message``, no priming).
            limit: the block's budget in the same units; the output must fit it.
            counter: the builder's counter.
        """

    def _evict(
        self, block_id: str, messages: list[Message], counts: list[int], limit: int,
        counter: TokenCounter, newest: tuple[int, int] | None = None,
    ) -> Generator[Any, Any, list[Message]]:
        """The builder's entry point (a generator so that a step may await).

        ``newest``: for a history block, the index range of its newest unit that
        holds no anchored message (the turn being answered, `newest_unit()`),
        which [`TruncateOldest`][memstore.TruncateOldest] and [`Summarize`][memstore.Summarize] keep
        as they keep
        anchored messages. Custom strategies decide for themselves.
        """
        return (yield from _no_requests(self.apply(list(messages), sum(counts), limit, counter)))


def _no_requests(value: list[Message]) -> Generator[Any, Any, list[Message]]:
    return value
    yield  # pragma: no cover - makes this a generator


def _budget_error(block_id: str, tokens: int, limit: int) -> ContextBudgetError:
    return ContextBudgetError(
        f"block {block_id!r} needs {tokens} tokens and its budget is {limit} (Strict)",
        required=tokens, budget=limit,
    )


@dataclass(frozen=True)
class Strict(Strategy):
    """The block must fit: raise `ContextBudgetError` otherwise.

    The error names the block, its tokens (``required``) and its budget (``budget``).
    For system prompts and rules that must never be cut.
    """

    label: ClassVar[str] = "rejected"

    def apply(self, messages: list[Message], tokens: int, limit: int,
              counter: TokenCounter) -> list[Message]:
        """Raise `ContextBudgetError` (called only on overflow)."""
        raise _budget_error("<block>", tokens, limit)

    def _evict(
        self, block_id: str, messages: list[Message], counts: list[int], limit: int,
        counter: TokenCounter, newest: tuple[int, int] | None = None,
    ) -> Generator[Any, Any, list[Message]]:
        raise _budget_error(block_id, sum(counts), limit)
        yield  # pragma: no cover - makes this a generator


@dataclass(frozen=True)
class Drop(Strategy):
    """The block is left out whole when it does not fit (label ``"dropped"``).

    The one built-in strategy that removes anchored messages: ``Drop`` says the block
    is optional, and the blocks it suits are often system messages (documents a
    formatter injects into a system message, a scratchpad). A stored system prompt
    or pinned message that must survive belongs in a block with another strategy
    ([`TruncateOldest`][memstore.TruncateOldest] and [`Summarize`][memstore.Summarize] keep them).
    """

    label: ClassVar[str] = "dropped"

    def apply(self, messages: list[Message], tokens: int, limit: int,
              counter: TokenCounter) -> list[Message]:
        """Return ``[]``."""
        return []


@dataclass(frozen=True)
class TruncateOldest(Strategy):
    """Remove the oldest units until the block fits (label ``"truncated"``).

    Rules:

    * An assistant message with tool calls and its results is one unit, removed
      whole — never an orphan, whatever the options say.
    * With ``keep_turns_atomic``, a whole turn (a user message and everything up to
      the next user message) is removed at once, so no reply is left without its
      question. Units before the first user message are removed one at a time.
    * ``system``, ``developer`` and pinned messages are never removed; roles in
      ``protect_roles`` are added to them. A unit holding a protected message is
      protected whole (removing a turn removes its unprotected units only). In a
      history block ([`HistoryBlock`][memstore.HistoryBlock]) the newest unit that
      holds no anchored message (the turn being answered, as every view keeps it)
      is protected too; with ``keep_turns_atomic``, so is the whole turn holding it
      (its user message and everything after it).
    * If only protected messages are left and they still do not fit:
      `ContextBudgetError` naming the block (protected
      messages never vanish silently; this wins over ``min_messages``).
    * Otherwise, if fewer than ``min_messages`` messages would remain, every
      unprotected message is removed and the protected ones stay; the block is
      dropped (its id in ``blocks_dropped``) only when it holds no protected
      message. Either way it is labelled ``"truncated"``.

    Cost: one pass over per-message counts (a running total), never a recount.

    On a history block read through a budgeted view (the default), the view does the
    truncation (oldest first, O(window)) and this strategy keeps its window, labelled
    ``"truncated"`` when the view left messages out; ``keep_turns_atomic`` reads the
    view with ``start_on_user=True``, ``min_messages`` applies as above, and
    ``protect_roles`` needs a count-based view (a
    `ConfigurationError` when the block is made).

    Args:
        keep_turns_atomic: remove whole user turns.
        min_messages: the fewest messages worth keeping (>= 0).
        protect_roles: roles never removed, in addition to system and developer.

    Raises:
        ConfigurationError: (a ``ValueError``) an invalid parameter.
    """

    label: ClassVar[str] = "truncated"

    keep_turns_atomic: bool = False
    min_messages: int = 0
    protect_roles: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        check_flag(self.keep_turns_atomic, "TruncateOldest keep_turns_atomic", ConfigurationError)
        if (not isinstance(self.min_messages, int) or isinstance(self.min_messages, bool)
                or self.min_messages < 0):
            raise ConfigurationError(
                "TruncateOldest min_messages must be an int >= 0, "
                f"got {short_repr(self.min_messages)}"
            )
        roles = self.protect_roles
        if isinstance(roles, str) or not isinstance(roles, Iterable):
            raise ConfigurationError(
                f"TruncateOldest protect_roles must be a sequence of roles, got {short_repr(roles)}"
            )
        roles = tuple(roles)
        not_str = [r for r in roles if not isinstance(r, str)]
        if not_str:
            raise ConfigurationError(
                "TruncateOldest protect_roles must hold role names (strings), "
                f"got {short_repr(not_str[0])}"
            )
        normalized = tuple(dict.fromkeys(roles))
        known = ("system", "developer", "user", "assistant", "tool")
        unknown = [r for r in normalized if r not in known]
        if unknown:
            raise ConfigurationError(
                f"TruncateOldest protect_roles has unknown role(s) {unknown}; roles are {known}"
            )
        object.__setattr__(self, "protect_roles", normalized)

    def apply(self, messages: list[Message], tokens: int, limit: int,
              counter: TokenCounter) -> list[Message]:
        """Truncate ``messages`` to ``limit`` (see the class rules).

        Raises:
            ConfigurationError: ``counter`` returned a count that is not an int >= 0.
        """
        counter = checked_counter(counter)
        counts = [message_tokens(m, counter) for m in messages]
        return self._truncate("<block>", messages, counts, limit)[0]

    def _evict(
        self, block_id: str, messages: list[Message], counts: list[int], limit: int,
        counter: TokenCounter, newest: tuple[int, int] | None = None,
    ) -> Generator[Any, Any, list[Message]]:
        return (yield from _no_requests(
            self._truncate(block_id, messages, counts, limit, newest)[0]))

    def _truncate(self, block_id: str, messages: Sequence[Message], counts: Sequence[int],
                  limit: int, newest: tuple[int, int] | None = None,
                  ) -> tuple[list[Message], int]:
        """Truncate to ``limit``; returns the kept messages and their tokens."""
        protected_roles = ANCHOR_ROLES | set(self.protect_roles)
        units = units_of(messages)
        unit_tokens = [sum(counts[s:e]) for s, e in units]
        unit_protected = [
            any(m.pinned or m.role in protected_roles for m in messages[s:e])
            or (newest is not None and s < newest[1] and e > newest[0])  # the newest unit
            for s, e in units
        ]
        # Removal groups, oldest first: single units, or whole turns.
        groups: list[list[int]] = []
        seen_user = False
        for u, (s, _) in enumerate(units):
            starts_turn = messages[s].role == "user"
            if self.keep_turns_atomic and seen_user and not starts_turn:
                groups[-1].append(u)
            else:
                groups.append([u])
            seen_user = seen_user or starts_turn
        if self.keep_turns_atomic and newest is not None:
            # The turn being answered stays whole: no call without its question.
            for group in groups:
                if any(unit_protected[u] and units[u][0] < newest[1]
                       and units[u][1] > newest[0] for u in group):
                    for u in group:
                        unit_protected[u] = True
        total = sum(unit_tokens)
        removed = [False] * len(units)
        for group in groups:
            if total <= limit:
                break
            for u in group:
                if not unit_protected[u]:
                    removed[u] = True
                    total -= unit_tokens[u]
        if total > limit:
            newest_part = ""
            if newest is not None:
                newest_part = (", the newest unit's turn" if self.keep_turns_atomic
                               else ", the newest unit")
            raise ContextBudgetError(
                f"block {block_id!r}: its protected messages (system, developer, pinned"
                + (f", {', '.join(self.protect_roles)}" if self.protect_roles else "")
                + newest_part
                + f") need {total} tokens and its budget is {limit} (TruncateOldest)",
                required=total, budget=limit,
            )
        kept_units = [u for u in range(len(units)) if not removed[u]]
        if sum(units[u][1] - units[u][0] for u in kept_units) < self.min_messages:
            # Too few to be worth keeping: the unprotected ones go, the protected stay.
            kept_units = [u for u in kept_units if unit_protected[u]]
        kept = [m for u in kept_units for m in messages[units[u][0]:units[u][1]]]
        return kept, sum(unit_tokens[u] for u in kept_units)


@dataclass(frozen=True)
class Summarize(Strategy):
    """Replace the block by a summary when it does not fit (label ``"summarized"``).

    Anchored messages (``system``, ``developer``, pinned; a tool unit holding one is
    anchored whole), and in a history block its newest unit that holds no anchored
    message, are never removed: they stay, in their order, and the summarizer is
    called once with the block's other messages. A ``str`` result becomes a
    ``system`` message; a [`Message`][memstore.Message] is used as it is. The
    summary is checked as ``store.summarize`` checks it: an empty or whitespace-only
    text, a NUL character or a surrogate code point is an
    `InvalidInputError` naming the block. It takes the place
    of the first message it stands for. If the
    anchored messages and the summary fit the block's budget they replace the block;
    otherwise the summary is left out too, and the block is the anchored messages
    alone (dropped when it has none: still labelled ``"summarized"``, its id in
    ``blocks_dropped``). Anchored messages that do not fit on their own are a
    `ContextBudgetError` naming the block, and a block of
    anchored messages only is not summarized. The summarizer's errors propagate
    unchanged. An ``async`` summarizer works only under
    [`acompile()`][memstore.ContextBuilder.acompile].

    A history block read through a budgeted view (the default) cannot use it: the
    [`Block`][memstore.Block] refuses it with a
    `ConfigurationError`, since summarizing what the view
    leaves out would re-read and re-summarize the whole history on every compile.
    ``store.summarize`` with a [`SummaryView`][memstore.SummaryView] keeps a
    persistent summary in O(window); a count-based view works with ``Summarize``.

    Args:
        summarizer: ``(list[Message]) -> str | Message``, sync or async.

    Raises:
        ConfigurationError: (a ``ValueError``) ``summarizer`` is not callable.
    """

    label: ClassVar[str] = "summarized"

    summarizer: Summarizer

    def __post_init__(self) -> None:
        if not callable(self.summarizer):
            raise ConfigurationError(
                f"Summarize needs a callable summarizer, got {short_repr(self.summarizer)}"
            )

    def apply(self, messages: list[Message], tokens: int, limit: int,
              counter: TokenCounter) -> list[Message]:
        """Summarize with a sync summarizer (see the class rules).

        Raises:
            ConfigurationError: ``counter`` returned a count that is not an int >= 0.
        """
        counter = checked_counter(counter)
        counts = [message_tokens(m, counter) for m in messages]
        steps = self._evict("<block>", messages, counts, limit, counter)
        try:
            call = next(steps)
            while True:
                call = steps.send(call.run_sync())
        except StopIteration as done:
            return list(done.value)

    def _evict(
        self, block_id: str, messages: list[Message], counts: list[int], limit: int,
        counter: TokenCounter, newest: tuple[int, int] | None = None,
    ) -> Generator[Any, Any, list[Message]]:
        anchored = [False] * len(messages)
        for s, e in units_of(messages):
            if is_anchored_unit(messages[s:e]):
                anchored[s:e] = [True] * (e - s)
        if newest is not None:  # a history block's newest unit is kept, not summarized
            anchored[newest[0]:newest[1]] = [True] * (newest[1] - newest[0])
        kept = sum(n for n, a in zip(counts, anchored) if a)
        if kept > limit:
            raise ContextBudgetError(
                f"block {block_id!r}: its anchored messages (system, developer, pinned"
                + (", the newest unit" if newest is not None else "")
                + f") need {kept} tokens and its budget is {limit} (Summarize)",
                required=kept, budget=limit,
            )
        rest = [m for m, a in zip(messages, anchored) if not a]
        if not rest:  # nothing to summarize (and what is left fits)
            return [m for m, a in zip(messages, anchored) if a]
        result = yield SummarizeCall(self.summarizer, rest, block_id)
        summary = _summary_message(result, block_id)
        out = [m for m, a in zip(messages, anchored) if a]
        if kept + message_tokens(summary, counter) <= limit:  # (a checked counter)
            # in the place of the first message it stands for
            # (the messages before the first one it stands for are all anchored)
            out.insert(anchored.index(False), summary)
        return out


def _call_summarizer_sync(fn: Summarizer, messages: list[Message], block_id: str) -> object:
    if is_async_callable(fn):
        raise ConfigurationError(
            f"block {block_id!r} has an async summarizer; use `await builder.acompile()`"
        )
    result = fn(messages)
    refuse_awaitable(result, ConfigurationError(
        f"block {block_id!r}'s summarizer returned an awaitable; use "
        "`await builder.acompile()`"))
    return result


def _summary_message(result: object, block_id: str) -> Message:
    """The summarizer's result as a message, checked as ``store.summarize`` checks it.

    Raises:
        ConfigurationError: not a ``str`` or a [`Message`][memstore.Message].
        InvalidInputError: an empty or whitespace-only summary, or one holding a NUL
            character or a surrogate code point, or one over the record size limit
            (the rules of ``store.summarize``).
    """
    if not isinstance(result, (str, Message)):
        raise ConfigurationError(
            f"block {block_id!r}'s summarizer returned a {type(result).__name__}; "
            "expected a str or a Message"
        )
    try:
        text = summary_text(result)
    except InvalidInputError as exc:
        raise InvalidInputError(f"block {block_id!r}: {exc}") from None
    return Message.system(text) if isinstance(result, str) else result



def summary_text(output: Any) -> str:
    """The text of a summarizer's result (a ``str`` or a [`Message`][memstore.Message]), checked.

    The rules of ``store.summarize`` and of the [`Summarize`][memstore.Summarize] strategy: not
    empty
    or whitespace only, no NUL or surrogate, within the record size limit.

    Raises:
        InvalidInputError: the result breaks one of these rules, or is of another type.
    """
    if isinstance(output, Message):
        text = output.text
    elif isinstance(output, str):
        text = output
    else:
        raise InvalidInputError(
            f"a summarizer must return a str or a Message, not {type(output).__name__}"
        )
    if not text.strip():
        raise InvalidInputError("the summarizer returned an empty summary")
    problem = text_problem(text)
    if problem is not None:
        raise InvalidInputError(f"the summary {problem}")
    try:
        check_size(utf8_size(text), "the summary")
    except ValueError as exc:
        raise InvalidInputError(str(exc)) from None
    return text


# ---- the one step that may await ---------------------------------------------------------


@dataclass(frozen=True)
class SummarizeCall:
    """A summarizer call the builder runs (awaiting it under ``acompile``)."""

    summarizer: Summarizer
    messages: list[Message]
    block_id: str

    def run_sync(self) -> object:
        return _call_summarizer_sync(self.summarizer, self.messages, self.block_id)

    async def run_async(self) -> object:
        result: Any = self.summarizer(self.messages)
        if inspect.isawaitable(result):
            result = await result
        return result

