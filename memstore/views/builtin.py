"""Context views: token- or size-limited windows over one conversation.

A view is a small frozen configuration object with a pure selection algorithm. It
runs no SQL and does no I/O of its own: it pulls what it needs from a
[`HistorySource`][memstore.HistorySource] (the store implements one with indexed
range queries, [`ListHistory`][memstore.ListHistory] wraps a list), newest-first
and page by page, and stops as soon as older messages cannot change its result.
Reading a window never writes.

Rules shared by every view:

* **Units.** Messages are kept or dropped in units (see `memstore.views.units`):
  an assistant tool call and the results answering it are one unit. Incomplete
  units (an unanswered or partially answered call, an orphan tool result) are
  left out of every view, [`UnboundedView`][memstore.UnboundedView] included, and reported with
  reason ``"incomplete_unit"`` — even when pinned.
* **Anchored messages** (system, developer, pinned, and every message of a
  complete unit holding one) are kept by every view in their chronological
  place and never count toward ``buffer_size``, ``head_size``, ``tail_size`` or
  ``max_turns``. Budgeted views charge their tokens first.
* **The newest unit** — the newest complete unit that is not anchored (an
  anchored one is kept anyway) — is always kept. Budgeted views reserve it right
  after the anchored messages; when the two (plus reply priming, ``reserve`` and
  tool schemas) exceed ``token_limit`` the view raises
  `ContextBudgetError` with ``required`` and ``budget``.
* **Budget.** A budgeted window satisfies
  ``sum(message_tokens) + priming + reserve + tool schema tokens <= token_limit``,
  i.e. ``counter.count_messages(window) + reserve + tools <= token_limit``; the
  priming is the counter's ``priming`` or ``count_messages([])``
  (`counter_priming()`), the schemas are counted by the
  counter's ``count_tools`` (`count_tool_schemas()`: a counter
  without it cannot serve a view given ``tools=``). Per-message counts come from
  the stored count when it was produced by the same counter
  (`message_tokens()`); the history is never recounted as a
  whole.
* **start_on_user.** Every budgeted and count view takes ``start_on_user=True``:
  after its selection, kept units are dropped from the old end until the window's
  first non-anchored message is a user message (Anthropic-compatible endpoints
  refuse a leading assistant turn), never the newest unit; reason
  ``"start_on_user"``. Each view's docstring says how it combines with its rule.
* **Output** is chronological by seq and deterministic (ties break on seq, newer
  first). An empty conversation, or one holding only incomplete units, gives an
  empty window (``token_count`` 0) and never a ``ContextBudgetError``, whatever the
  reserve and tool schemas.
* **Report.** Left-out seqs are reported as contiguous runs with one reason each.
  History a view never read (older than what it needed) is reported from seqs
  alone, one run per gap between kept anchored messages.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from datetime import datetime
from typing import Any, ClassVar, Literal

from memstore._validate import MAX_SEQ, text_problem
from memstore.errors import ConfigurationError, InvalidInputError, MemstoreError
from memstore.models import Message, StoredMessage
from memstore.tokens import (
    TokenCounter,
    count_tool_schemas,
    counter_from_name,
    validate_counter,
)
from memstore.views.base import ContextView
from memstore.views.history import HistorySource
from memstore.views.parts import (
    _budget_check,
    _budget_page,
    _check_bool,
    _check_budget_params,
    _check_counter,
    _check_int,
    _check_real,
    _check_template,
    _first_page,
    _Ledger,
    _normalize_tools,
    _short,
    _start_on_user,
)
from memstore.views.units import (
    DEFAULT_MAX_PAGE,
    BackwardUnits,
    ForwardReader,
    ForwardUnits,
    ReverseReader,
    Unit,
    group_units,
)
from memstore.views.window import ContextWindow

__all__ = [
    "DEFAULT_PLACEHOLDER_TEMPLATE",
    "BufferedView",
    "ContextView",
    "HeadAndTailView",
    "RecentTurnsView",
    "ScoreBasedView",
    "TokenLimitedView",
    "UnboundedView",
    "view_from_config",
]

#: Default placeholder text; ``{n}`` is the number of skipped messages and
#: ``{messages}`` is ``"message"`` when it is 1, else ``"messages"``.
DEFAULT_PLACEHOLDER_TEMPLATE = "Skipped {n} {messages}."

PlaceholderRole = Literal["user", "assistant", "system", "developer"]
_PLACEHOLDER_ROLES = ("user", "assistant", "system", "developer")


# ---- the views --------------------------------------------------------------------------


@dataclass(frozen=True)
class UnboundedView(ContextView):
    """Every complete unit of the conversation.

    Rule: keep everything except incomplete units. The only view that reads the
    whole history.

    Reference: autogen ``UnboundedChatCompletionContext``.

    Differences: autogen returns its internal list (callers mutating it mutate the
    context) and keeps pending calls and orphan results; memstore returns a new
    window and leaves incomplete units out (reason ``"incomplete_unit"``).
    """

    def select(self, source: HistorySource, counter: TokenCounter) -> ContextWindow:
        """Keep every complete unit."""
        ledger = _Ledger(self, source, counter, None)
        if source.message_count:
            for unit in group_units(source.read(source.first_seq, source.last_seq + 1)):
                if unit.complete:
                    ledger.keep(unit)
                else:
                    ledger.omit(unit, "incomplete_unit")
        return ledger.build()


@dataclass(frozen=True)
class BufferedView(ContextView):
    """The newest units holding at most ``buffer_size`` messages, plus anchored messages.

    Rule: walk units back from the newest; stop at the first unit that would take
    the count past ``buffer_size`` (the newest unit is kept whatever its size).
    Anchored messages are kept and not counted. With ``start_on_user``, units are
    then dropped from the old end until the window's first non-anchored message is
    a user message (never the newest unit: if no other kept unit starts with a user
    message, only the newest remains; the room they free is not refilled). Omitted
    reasons: ``"buffer_size"``, ``"start_on_user"``.

    Reference: autogen ``BufferedChatCompletionContext`` (``messages[-n:]``, then drop
    one leading tool result).

    Differences: autogen cuts at a message count and then drops a leading result,
    so its window can hold fewer messages than asked; memstore never splits a unit
    and stops at a unit boundary. autogen keeps a trailing unanswered call (a 400
    on the next request) and can evict system messages; memstore leaves the pending
    call out and keeps system messages in place without counting them (so
    ``[S,u1,CALL,RES,a1,u2]`` with size 2 is ``[S,a1,u2]``, not ``[a1,u2]``).

    Args:
        buffer_size: messages the non-anchored units may hold (>= 1).
        start_on_user: trim the window so it starts with a user message (for
            Anthropic-compatible endpoints, which refuse a leading assistant turn).

    Raises:
        ConfigurationError: (a ``ValueError``) ``buffer_size`` is not an int >= 1, or
            ``start_on_user`` is not a bool.
    """

    buffer_size: int
    start_on_user: bool = False

    def __post_init__(self) -> None:
        _check_int("BufferedView", "buffer_size", self.buffer_size, 1)
        _check_bool("BufferedView", "start_on_user", self.start_on_user)

    def select(self, source: HistorySource, counter: TokenCounter) -> ContextWindow:
        """Keep anchored messages and the newest units up to ``buffer_size`` messages."""
        ledger = _Ledger(self, source, counter, "buffer_size")
        if source.message_count == 0:
            return ledger.build()
        ledger.anchor()
        count = 0
        kept: list[Unit] = []
        reader = ReverseReader(source, first_page=_first_page(self.buffer_size))
        for unit in ledger.candidates(BackwardUnits(reader)):
            if count and count + unit.size > self.buffer_size:
                ledger.omit(unit, "buffer_size")
                break
            ledger.keep(unit)
            kept.append(unit)
            count += unit.size
        if self.start_on_user:
            _start_on_user(ledger, kept[::-1])
        return ledger.build()


@dataclass(frozen=True)
class HeadAndTailView(ContextView):
    """The oldest and the newest units, with one placeholder for what lies between.

    Rule: the head is the oldest units holding at most ``head_size`` messages (walk
    forward, stop at the first unit that would cross), the tail the newest units
    holding at most ``tail_size`` (walk back, the newest unit is kept whatever its
    size, stop at the first unit that would cross; it goes no further back than
    the unit the head walk refused). Anchored messages are kept in place and not
    counted. N is the number of stored messages between the last head unit and
    the first tail unit that the window does not hold: units neither walk took and
    incomplete units alike. Whenever N > 0 — also when the walks meet but an
    incomplete unit (say, a tool call whose results are not stored) lies between
    them — the window holds one plain [`Message`][memstore.Message] (not
    stored, no seq) right after the head, before the first left-out message (so
    anchored messages of the gap that precede it stay before the placeholder, the
    others follow it; when that message is an orphan result inside an anchored tool
    unit, the placeholder follows the unit, never splitting it): role
    ``placeholder_role``, text ``placeholder_template``
    formatted with ``n`` = N and ``messages`` = ``"message"``/``"messages"``
    (default ``"Skipped N messages."`` / ``"Skipped 1 message."``), metadata
    ``{"memstore": {"placeholder": True, "skipped": N}}``. The report's ``skipped``
    is N; incomplete units a walk read are reported as ``"incomplete_unit"``, the
    rest of the gap as ``"head_tail_gap"``. When the head takes every unit there
    is no tail and no placeholder (incomplete units are still left out and
    reported). Only the head and the tail are read, never the middle.

    With ``start_on_user``, the window's first turn is a user message: head units
    are dropped from the old end until the head starts with a user message (reason
    ``"start_on_user"``). When that empties the head, there is no head: N counts
    from the start of history, so the placeholder (when N > 0) comes first, and a
    ``"user"`` placeholder is that first turn. Otherwise (no placeholder, or a
    ``"system"``/``"developer"`` one, which is not a turn) tail units are dropped
    from the old end the same way, never the newest unit. An ``"assistant"``
    placeholder could lead the window, so it is refused with ``start_on_user``.

    Reference: autogen ``HeadAndTailChatCompletionContext``.

    Differences: autogen computes N from the configured sizes, so it under-counts
    whenever its boundary guards trim a call from the head or a result from the
    tail (it says "Skipped 1 messages." when 2 were dropped), and says "messages"
    for 1; memstore counts the stored messages really left out. autogen's guards
    look one message deep (enough only for its 2-message tool turns); memstore
    never splits a unit. autogen can drop system messages; memstore keeps them.
    When nothing is left out, both return everything, but memstore still leaves
    incomplete units out.

    Args:
        head_size: messages the head units may hold (>= 1).
        tail_size: messages the tail units may hold (>= 1).
        placeholder_template: ``str.format`` template with ``{n}`` and ``{messages}``
            (no other fields; format widths and precisions up to 200; at most
            ``MAX_PLACEHOLDER_CHARS`` characters of text for any count).
        placeholder_role: role of the placeholder message.
        start_on_user: trim the window so it starts with a user turn (see above).

    Raises:
        ConfigurationError: (a ``ValueError``) a size is not an int >= 1, the template
            does not format or is not bounded, the role is not
            user/assistant/system/developer, ``start_on_user`` is not a bool, or it is
            ``True`` with an ``"assistant"`` placeholder.
    """

    head_size: int
    tail_size: int
    placeholder_template: str = DEFAULT_PLACEHOLDER_TEMPLATE
    placeholder_role: PlaceholderRole = "user"
    start_on_user: bool = False

    def __post_init__(self) -> None:
        _check_int("HeadAndTailView", "head_size", self.head_size, 1)
        _check_int("HeadAndTailView", "tail_size", self.tail_size, 1)
        _check_template("HeadAndTailView", self.placeholder_template)
        if self.placeholder_role not in _PLACEHOLDER_ROLES:
            raise ConfigurationError(
                f"HeadAndTailView placeholder_role must be one of {_PLACEHOLDER_ROLES}, "
                f"got {_short(self.placeholder_role)}"
            )
        _check_bool("HeadAndTailView", "start_on_user", self.start_on_user)
        if self.start_on_user and self.placeholder_role == "assistant":
            raise ConfigurationError(
                "HeadAndTailView start_on_user=True cannot take placeholder_role="
                "'assistant': the placeholder would start the window with an assistant "
                "turn whenever the head is trimmed away; use 'user' (the default), "
                "'system' or 'developer'"
            )

    def placeholder_text(self, skipped: int) -> str:
        """The placeholder text for ``skipped`` messages.

        Raises:
            InvalidInputError: ``skipped`` is not an int in ``[0, 2**62]``.
        """
        if (not isinstance(skipped, int) or isinstance(skipped, bool)
                or not 0 <= skipped <= MAX_SEQ):
            raise InvalidInputError(
                f"skipped must be a count of messages (an int in [0, 2**62]), "
                f"got {_short(skipped)}"
            )
        word = "message" if skipped == 1 else "messages"
        return self.placeholder_template.format(n=skipped, messages=word)

    def placeholder(self, skipped: int) -> Message:
        """The placeholder message standing for ``skipped`` messages."""
        return Message(
            role=self.placeholder_role,
            content=self.placeholder_text(skipped),
            metadata={"memstore": {"placeholder": True, "skipped": skipped}},
        )

    def select(self, source: HistorySource, counter: TokenCounter) -> ContextWindow:
        """Keep the head, the tail, anchored messages, and a placeholder for the gap."""
        ledger = _Ledger(self, source, counter, "head_tail_gap")
        if source.message_count == 0:
            return ledger.build()
        ledger.anchor()
        # Head: oldest-first until the first unit that would cross head_size.
        count = 0
        head: list[Unit] = []
        refused: Unit | None = None
        forward = ForwardReader(source, first_page=_first_page(self.head_size))
        for unit in ledger.candidates(ForwardUnits(forward)):
            if count + unit.size > self.head_size:
                refused = unit
                break
            ledger.keep(unit)
            head.append(unit)
            count += unit.size
        if refused is None:
            if self.start_on_user:
                _start_on_user(ledger, head)
            return ledger.build()
        # Tail: newest-first down to the refused unit at most.
        tail: list[Unit] = []
        count = 0
        reader = ReverseReader(
            source, floor=refused.first_seq, first_page=_first_page(self.tail_size)
        )
        for unit in ledger.candidates(BackwardUnits(reader)):
            if tail and count + unit.size > self.tail_size:
                break
            ledger.keep(unit)
            tail.append(unit)
            count += unit.size
        if self.start_on_user:
            while head and not head[0].starts_with_user:
                ledger.omit(head.pop(0), "start_on_user")
            if not head and (self.placeholder_role != "user" or _gap(
                    ledger, source.first_seq - 1, tail[-1].first_seq)[0] == 0):
                tail = _start_on_user(ledger, tail[::-1])[::-1]
        # The gap: every stored seq between the head and the tail. What the window does
        # not hold there (units neither walk took, incomplete units) is N; anchored
        # messages there are kept. The placeholder goes before the first left-out one.
        head_end = head[-1].last_seq if head else source.first_seq - 1
        skipped, gap_kept = _gap(ledger, head_end, tail[-1].first_seq)
        if skipped == 0:
            return ledger.build()
        after = head_end
        for seq in gap_kept:
            if seq != after + 1:
                break
            after = seq
        for seq in gap_kept:
            # Never between a call and its results: an orphan result (a duplicate
            # answer) left out inside an anchored unit would put it there.
            if seq > after:
                if ledger.kept[seq].role != "tool":
                    break
                after = seq
        return ledger.build(
            placeholder=self.placeholder(skipped), placeholder_after=after, skipped=skipped
        )



def _gap(ledger: _Ledger, head_end: int, tail_first: int) -> tuple[int, list[int]]:
    """N and the seqs the window holds between ``head_end`` and ``tail_first``.

    N is the number of stored messages strictly between them that the window does not
    hold; the seqs it holds there (anchored messages) come sorted.
    """
    gap_kept = sorted(s for s in ledger.kept if head_end < s < tail_first)
    return tail_first - head_end - 1 - len(gap_kept), gap_kept


@dataclass(frozen=True)
class TokenLimitedView(ContextView):
    """Anchored messages, then the newest units that fit a token budget (a suffix).

    Rule: charge the anchored messages, then the newest unit (raise
    `ContextBudgetError` if they do not fit), then walk units
    back from the newest and stop at the first that does not fit: the kept units are
    a contiguous suffix of the history (incomplete units aside). With
    ``start_on_user``, units are then dropped from the old end until the suffix
    starts with a user message (never the newest unit: if no other kept unit starts
    with a user message, only the newest remains). Omitted reasons: ``"budget"``,
    ``"start_on_user"``. Monotone: a bigger budget gives a superset.

    Reference: LangChain ``trim_messages(strategy="last")`` and autogen
    ``TokenLimitedChatCompletionContext``.

    Differences: ``trim_messages`` has no notion of tool pairs and can return a
    leading orphan tool message (its documented workaround is
    ``start_on="human"``); it keeps only a system message at index 0, even over
    budget. autogen pops from the *middle* (keeping the oldest half, dropping the
    newest user turn when only one message fits), splits calls from results, keeps
    system messages only by accident, recounts the whole list after each pop, and
    returns ``[]`` when tool schemas alone exceed the limit. memstore drops from the
    oldest end, in whole units, keeps every anchored message, counts each message
    once (stored counts) and raises ``ContextBudgetError`` instead of overrunning
    or returning nothing.

    Args:
        token_limit: the budget (>= 1).
        reserve: tokens to leave free, e.g. for the reply (>= 0, < token_limit).
        tools: tool (function) schemas sent with the request; counted into the
            reserve with ``counter.count_tools``.
        start_on_user: trim the suffix so it starts with a user message (for
            Anthropic-compatible endpoints, which refuse a leading assistant turn).
        counter: the counter to use instead of the store's.

    Raises:
        ConfigurationError: (a ``ValueError``) an invalid parameter.
    """

    budgeted: ClassVar[bool] = True

    token_limit: int
    reserve: int = 0
    tools: Sequence[Mapping[str, Any]] | None = field(default=None, hash=False)
    start_on_user: bool = False
    counter: TokenCounter | None = None

    def __post_init__(self) -> None:
        _check_budget_params("TokenLimitedView", self.token_limit, self.reserve)
        _check_bool("TokenLimitedView", "start_on_user", self.start_on_user)
        object.__setattr__(self, "tools", _normalize_tools("TokenLimitedView", self.tools))
        _check_counter("TokenLimitedView", self.counter, self.tools)

    def select(self, source: HistorySource, counter: TokenCounter) -> ContextWindow:
        """Keep anchored messages and the newest units that fit."""
        ledger = _Ledger(self, source, counter, "budget")
        # Counted first, so a counter that cannot count tools fails on every window.
        tools_tokens = count_tool_schemas(counter, self.tools)
        if source.message_count == 0:
            return ledger.build(budget=self.token_limit)
        anchors = ledger.anchor()
        anchored_tokens = anchors.tokens(counter)
        kept: list[Unit] = []
        remaining = 0
        name = counter.name
        reader = ReverseReader(source, first_page=_budget_page(source, self.token_limit))
        for unit in ledger.candidates(BackwardUnits(reader)):
            members = unit.messages
            if len(members) == 1:  # most units: inline Unit.tokens
                m = members[0]
                tokens = m.token_count if m.token_counter == name else counter.count_message(m)
            else:
                tokens = unit.tokens(counter)
            if not kept:
                remaining = _budget_check(self, counter, self.token_limit, self.reserve,
                                          tools_tokens, anchored_tokens, tokens)
            elif tokens > remaining:
                ledger.omit(unit, "budget")
                break
            else:
                remaining -= tokens
            ledger.keep(unit)
            kept.append(unit)
        if not kept and anchors.units:
            _budget_check(self, counter, self.token_limit, self.reserve, tools_tokens,
                          anchored_tokens, 0)
        if self.start_on_user:
            while len(kept) > 1 and not kept[-1].starts_with_user:
                ledger.omit(kept.pop(), "start_on_user")
        return ledger.build(budget=self.token_limit)


class _Decay:
    """Effective scores of the messages a ScoreBasedView reads, newest first."""

    def __init__(self, keep_rate: float, half_life: float | None,
                 newest: datetime | None) -> None:
        self._keep_rate = keep_rate
        self._half_life = half_life
        self._newest = newest
        self._position = 0
        self._effective_time: datetime | None = None
        self.scores: dict[int, float] = {}

    def _time_factor(self) -> float:
        assert self._half_life is not None
        if self._effective_time is None or self._newest is None:
            return 1.0
        age = max(0.0, (self._newest - self._effective_time).total_seconds())
        return float(0.5 ** (age / self._half_life))

    def observe(self, message: StoredMessage) -> None:
        """Record the decayed score of the next message read (newest first)."""
        if message.anchored:
            return
        self._position += 1
        if self._half_life is None:
            factor = float(self._keep_rate ** self._position)
        else:
            created = message.created_at
            if self._effective_time is None or created < self._effective_time:
                self._effective_time = created
            factor = self._time_factor()
        self.scores[message.seq] = message.score * factor

    def bound(self, max_score: float) -> float:
        """An upper bound of the score of every message not read yet.

        Decay never increases along the newest-first walk (positions grow; ages are
        running maxima), so ``max_score * decay(next)`` bounds everything older.
        When `BackwardUnits` yields a candidate, every message
        it has consumed belongs to a unit already yielded or to an orphan, so this
        bounds every candidate not yet yielded too.
        """
        if self._half_life is None:
            factor = float(self._keep_rate ** (self._position + 1))
        else:
            factor = self._time_factor()
        return max_score * factor

    def unit_score(self, unit: Unit) -> float:
        """The unit's score: the maximum of its messages' decayed scores."""
        return max(self.scores[m.seq] for m in unit.messages)


@dataclass(frozen=True)
class ScoreBasedView(ContextView):
    """Anchored messages, the newest unit, then other units greedily by decayed score.

    Rule: charge the anchored messages and the newest unit (raise
    `ContextBudgetError` if they do not fit). Every other
    complete unit scores the maximum of its messages' effective scores; units are
    taken highest first (ties: newer first); a unit that does not fit is skipped
    and the walk goes on; output is chronological. Omitted reason: ``"score"``.

    With ``start_on_user``, the greedy pass runs exactly as above, then kept units
    are dropped from the oldest until the oldest kept (non-anchored) unit starts with
    a user message, never the newest unit (if no other kept unit starts with a user
    message, only the newest remains). A unit is dropped only for its position,
    whatever its score, and the tokens the dropped units free are not spent again:
    the window is the greedy selection less a prefix of it, so it can be smaller
    than without ``start_on_user`` while older, lower-scored units would have fit.
    Omitted reason for those: ``"start_on_user"``.

    Decay: walking the stored non-anchored messages newest to oldest,
    the j-th (j = 1 for the newest) scores ``score * keep_rate ** j``, whether or not
    it is kept. A message is "anchored" here by its own flag (system, developer,
    pinned); anchored messages do not advance j. With ``half_life`` (seconds) —
    which then *replaces* ``keep_rate`` — it scores
    ``score * 0.5 ** (age / half_life)``, age measured from the newest message's
    ``created_at`` (never the wall clock). Because order never depends on clocks,
    the age of a message is taken from the earliest ``created_at`` among it and
    every newer message (a running minimum): ages never decrease with seq, and a
    message with a skewed clock cannot outrank newer ones.

    Cost: history is read newest-first; a candidate is decided as soon as its score
    reaches ``source.max_score * decay(next position)``, the bound of everything
    older. The walk stops when the remaining budget is 0, or — memstore's choice,
    so that cost stays O(window) — after ``fill_scan`` further units have been
    examined once the first unit did not fit (``fill_scan=None`` examines every
    unit: the exact CAMEL-style greedy, O(history)). With ``keep_rate=1`` (no decay)
    candidates below ``max_score`` can only be decided at the start of history.

    A store's ``max_score`` is an upper bound kept on the conversation row: raising a
    score raises it, but lowering a score or popping the top-scored message leaves it
    where it was (finding the new maximum would mean reading the whole history), until
    ``clear``, or a ``rewrite`` that reads every message. ``view.apply`` over the same
    messages uses their exact maximum. The window's messages are the same either way;
    with a looser bound the view may read a little further before it decides, and then
    reports an incomplete unit it met there as ``incomplete_unit`` where ``apply``
    reports it under ``score``.

    Reference: CAMEL ``ScoreBasedContextCreator`` (V2 to V4) with ``ChatHistoryBlock``'s
    ``keep_rate`` decay.

    Differences: CAMEL's greedy skips leave holes that split tool calls from their
    results (issue #2636; V3/V4 group by ``tool_call_id`` but let window orphans
    through and "partially truncate" groups); memstore keeps units whole and never
    emits an orphan. CAMEL V4 silently drops system messages not at index 0 and V5+
    hoists the first one; memstore keeps every anchored message in place. CAMEL can
    evict the newest user message (it scores ``keep_rate``, not 1.0); memstore always
    keeps the newest unit. CAMEL sums per-message counts that each include reply
    priming (over-counting); memstore adds priming once. CAMEL V5/V6 ignore the
    limit entirely.

    Args:
        token_limit: the budget (>= 1).
        keep_rate: per-step decay in [0, 1] (ignored when ``half_life`` is given).
        half_life: seconds after which a score halves (> 0), or ``None``.
        reserve: tokens to leave free (>= 0, < token_limit).
        tools: tool schemas, counted into the reserve.
        counter: the counter to use instead of the store's.
        fill_scan: units examined after the first that does not fit (>= 0), or
            ``None`` for all.
        start_on_user: drop the selection's leading units until it starts with a
            user message (see above).

    Raises:
        ConfigurationError: (a ``ValueError``) an invalid parameter.
    """

    budgeted: ClassVar[bool] = True

    token_limit: int
    keep_rate: float = 0.9
    half_life: float | None = None
    reserve: int = 0
    tools: Sequence[Mapping[str, Any]] | None = field(default=None, hash=False)
    counter: TokenCounter | None = None
    fill_scan: int | None = 64
    start_on_user: bool = False

    def __post_init__(self) -> None:
        name = "ScoreBasedView"
        _check_budget_params(name, self.token_limit, self.reserve)
        keep_rate = _check_real(name, "keep_rate", self.keep_rate)
        if not 0.0 <= keep_rate <= 1.0:
            raise ConfigurationError(f"{name} keep_rate must be in [0, 1], got {keep_rate}")
        if self.half_life is not None:
            half_life = _check_real(name, "half_life", self.half_life)
            if half_life <= 0:
                raise ConfigurationError(f"{name} half_life must be > 0, got {half_life}")
        if self.fill_scan is not None:
            _check_int(name, "fill_scan", self.fill_scan, 0)
        _check_bool(name, "start_on_user", self.start_on_user)
        object.__setattr__(self, "tools", _normalize_tools(name, self.tools))
        _check_counter(name, self.counter, self.tools)

    def select(self, source: HistorySource, counter: TokenCounter) -> ContextWindow:
        """Keep anchored messages, the newest unit, then the best-scored units that fit."""
        ledger = _Ledger(self, source, counter, "score")
        # Counted first, so a counter that cannot count tools fails on every window.
        tools_tokens = count_tool_schemas(counter, self.tools)
        if source.message_count == 0:
            return ledger.build(budget=self.token_limit)
        anchors = ledger.anchor()
        anchored_tokens = anchors.tokens(counter)
        decay = _Decay(float(self.keep_rate),
                       None if self.half_life is None else float(self.half_life),
                       source.newest_created_at)
        first_page = _budget_page(source, self.token_limit)
        # After the budget-sized first page only the bounded fill scan remains (with
        # ``fill_scan`` set), so later pages stay that size instead of doubling.
        grouper = BackwardUnits(ReverseReader(
            source, first_page=first_page, observer=decay.observe,
            max_page=first_page if self.fill_scan is not None else DEFAULT_MAX_PAGE,
        ))
        candidates = ledger.candidates(grouper)
        newest = next(candidates, None)
        if newest is None:
            if anchors.units:
                _budget_check(self, counter, self.token_limit, self.reserve, tools_tokens,
                              anchored_tokens, 0)
            return ledger.build(budget=self.token_limit)
        remaining = _budget_check(self, counter, self.token_limit, self.reserve, tools_tokens,
                                  anchored_tokens, newest.tokens(counter))
        ledger.keep(newest)
        kept = [newest]

        heap: list[tuple[float, int, Unit]] = []
        exhausted = False
        skipped = False
        examined_after_skip = 0
        done = remaining == 0
        max_score = source.max_score
        while not done:
            bound = -math.inf if exhausted else decay.bound(max_score)
            # Decide every candidate that nothing older can outrank (ties: newer first).
            while heap and -heap[0][0] >= bound:
                if skipped and self.fill_scan is not None and examined_after_skip >= self.fill_scan:
                    done = True
                    break
                _, _, unit = heapq.heappop(heap)
                if skipped:
                    examined_after_skip += 1
                tokens = unit.tokens(counter)
                if tokens <= remaining:
                    ledger.keep(unit)
                    kept.append(unit)
                    remaining -= tokens
                    if remaining == 0:
                        done = True
                        break
                else:
                    ledger.omit(unit, "score")
                    skipped = True
            if done or exhausted:
                break
            found = next(candidates, None)
            if found is None:
                exhausted = True
            else:
                heapq.heappush(heap, (-decay.unit_score(found), -found.last_seq, found))
        if self.start_on_user:
            _start_on_user(ledger, sorted(kept, key=lambda unit: unit.last_seq))
        return ledger.build(budget=self.token_limit)


@dataclass(frozen=True)
class RecentTurnsView(ContextView):
    """Everything from the ``max_turns``-th newest user message on, plus anchored messages.

    Rule: walk units back from the newest, counting non-anchored user messages.
    When the history holds more than ``max_turns`` of them, the window starts at
    the ``max_turns``-th newest; otherwise nothing is trimmed, and messages before
    the first user turn (say an assistant greeting after a pinned user message)
    stay. To tell the two apart the walk reads back to the next older user message
    (or the start of history), no further. Anchored messages before the window's
    start are kept in place. With
    ``remove_tool_messages``, complete tool units (a call and its results) are
    dropped from the window, except the newest unit; final assistant answers stay.
    With ``start_on_user``, units still kept after that are dropped from the old end
    until the window's first non-anchored message is a user message, never the
    newest unit (this only ever trims what precedes the first user turn, such as an
    assistant greeting, or, with no user message at all, everything but the newest
    unit). Omitted reasons: ``"max_turns"``, ``"tool_messages_removed"``,
    ``"start_on_user"``.

    Reference: agentflow ``MessageContextManager(max_messages, remove_tool_msgs)``.

    Differences: agentflow moves every system message to the front when it trims
    (mid-conversation instructions change place); memstore keeps anchored messages
    in their chronological place. agentflow's tool removal removes only the last
    call+results pair of a chained sequence and keeps incomplete sequences;
    memstore removes every complete tool unit but the newest and never emits an
    incomplete one. agentflow trims destructively (the state is checkpointed);
    memstore only reads. agentflow accepts ``max_messages <= 0`` (system messages
    only); memstore requires ``max_turns >= 1`` and always keeps the newest unit.
    Like agentflow, memstore trims nothing while the history holds no more user
    turns than ``max_turns`` (a leading assistant greeting stays).

    Args:
        max_turns: user messages the window starts from (>= 1).
        remove_tool_messages: drop complete tool units except the newest unit.
        start_on_user: drop what precedes the window's first user message.

    Raises:
        ConfigurationError: (a ``ValueError``) an invalid parameter.
    """

    max_turns: int
    remove_tool_messages: bool = False
    start_on_user: bool = False

    def __post_init__(self) -> None:
        _check_int("RecentTurnsView", "max_turns", self.max_turns, 1)
        _check_bool("RecentTurnsView", "remove_tool_messages", self.remove_tool_messages)
        _check_bool("RecentTurnsView", "start_on_user", self.start_on_user)

    def select(self, source: HistorySource, counter: TokenCounter) -> ContextWindow:
        """Keep the last ``max_turns`` user turns and the anchored messages."""
        ledger = _Ledger(self, source, counter, "max_turns")
        if source.message_count == 0:
            return ledger.build()
        ledger.anchor()
        kept: list[Unit] = []
        before_first_turn: list[Unit] = []  # units older than the max_turns-th user turn
        turns = 0
        reader = ReverseReader(source, first_page=_first_page(4 * self.max_turns))
        for unit in ledger.candidates(BackwardUnits(reader)):
            if turns == self.max_turns:
                if unit.starts_with_user:  # more turns than max_turns: trim
                    break
                before_first_turn.append(unit)
                continue
            ledger.keep(unit)
            kept.append(unit)
            if unit.starts_with_user:
                turns += 1
        else:  # no more turns than max_turns: nothing is trimmed
            for unit in before_first_turn:
                ledger.keep(unit)
                kept.append(unit)
        if self.remove_tool_messages:
            removed = [unit for unit in kept[1:] if unit.is_tool_unit]
            for unit in removed:
                ledger.omit(unit, "tool_messages_removed")
            if removed:
                gone = {id(unit) for unit in removed}
                kept = [unit for unit in kept if id(unit) not in gone]
        if self.start_on_user:
            _start_on_user(ledger, kept[::-1])
        return ledger.build()


# ---- configuration round trip -----------------------------------------------------------

_VIEW_CLASSES: dict[str, type[ContextView]] = {
    cls.__name__: cls
    for cls in (
        UnboundedView,
        BufferedView,
        HeadAndTailView,
        TokenLimitedView,
        ScoreBasedView,
        RecentTurnsView,
    )
}


def view_from_config(
    config: Mapping[str, Any], *, counters: Iterable[TokenCounter] = ()
) -> ContextView:
    """Rebuild a view from [`ContextView.to_config()`][memstore.ContextView.to_config] output.

    A counter is saved by its name. It is rebuilt as the counter of ``counters``
    with that name when there is one (how a custom counter comes back), else with
    ``memstore.tokens.counter_from_name``.

    Args:
        config: the view's configuration.
        counters: counters to resolve saved counter names with, e.g. your own.

    Raises:
        ConfigurationError: (a ``ValueError``) unknown type, unknown parameter, invalid
            value, or a counter name that cannot be rebuilt (a custom counter's name
            not given in ``counters``).
    """
    if not isinstance(config, Mapping):
        raise ConfigurationError(f"a view config must be a mapping, not {type(config).__name__}")
    kind = config.get("type")
    cls = _VIEW_CLASSES.get(kind) if isinstance(kind, str) else None
    if cls is None:
        raise ConfigurationError(
            f"unknown view type {_short(kind)}; expected one of {sorted(_VIEW_CLASSES)}"
        )
    params = {key: value for key, value in config.items() if key != "type"}
    allowed = {f.name for f in fields(cls)}
    unknown = sorted(repr(key) if not isinstance(key, str) else key
                     for key in set(params) - allowed)
    if unknown:
        raise ConfigurationError(f"{kind} has no parameter(s) {', '.join(unknown)}")
    counter = params.get("counter")
    if counter is not None:
        known = {validate_counter(c, "view_from_config counters item").name: c
                 for c in counters}
        if isinstance(counter, str) and counter in known:
            params["counter"] = known[counter]
        else:
            try:
                params["counter"] = _counter_from_config(cls.__name__, counter)
            except ConfigurationError as exc:
                if not isinstance(counter, str):
                    raise
                raise ConfigurationError(
                    f"{exc}; a custom counter comes back with "
                    "view_from_config(config, counters=[...])"
                ) from exc
    try:
        return cls(**params)
    except TypeError as exc:
        raise ConfigurationError(f"invalid {kind} config: {exc}") from exc


def _counter_from_config(kind: str, name: object) -> TokenCounter:
    """Rebuild a view's counter from its saved name, every failure a memstore error."""
    if not isinstance(name, str):
        raise ConfigurationError(f"{kind} counter must be saved by name, got {_short(name)}")
    problem = text_problem(name)
    if problem is not None or len(name) > 200:
        raise ConfigurationError(f"{kind} counter name {_short(name)} is not a counter name")
    try:
        return counter_from_name(name)
    except MemstoreError:
        raise
    except (ValueError, TypeError, LookupError, OverflowError) as exc:
        raise ConfigurationError(f"{kind} counter {name!r} cannot be rebuilt: {exc}") from exc
