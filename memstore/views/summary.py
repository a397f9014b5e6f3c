"""``SummaryView``: anchored messages, the latest stored summary, and the recent tail.

A summary is stored by ``store.summarize`` (it is never computed by a view: views
never write and never call a model). The view reads the latest summary, the
anchored messages and the newest units after the summary's range, newest-first,
and stops at the first unit that does not fit: its cost grows with the tail it
shows, never with the summarized history.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, NamedTuple, cast

from memstore._validate import MAX_SEQ
from memstore.errors import ContextBudgetError
from memstore.models import DEFAULT_SUMMARY_TEMPLATE, Message, StoredMessage, Summary
from memstore.tokens import TokenCounter, count_tool_schemas, validate_counter
from memstore.tokens._checked import checked_counter
from memstore.views.base import ContextView
from memstore.views.builtin import _VIEW_CLASSES
from memstore.views.history import HistorySource, ListHistory
from memstore.views.parts import (
    _budget_page,
    _check_bool,
    _check_budget_params,
    _check_counter,
    _Ledger,
    _normalize_tools,
    _start_on_user,
    check_format_template,
)
from memstore.views.units import BackwardUnits, ReverseReader, Unit
from memstore.views.window import ContextWindow, OmissionReason

__all__ = ["Fold", "SummaryView", "plan_fold"]


_TEMPLATE_FIELDS = ("first", "last", "text")


def _check_summary_template(template: object) -> None:
    """Validate a summary template: the placeholder rules, with ``{first}``/``{last}``/``{text}``.

    The output is not bounded: ``{text}`` is the summary itself.
    """
    # Seqs run to MAX_SEQ: a spec such as ``{last:c}`` must format (and make storable
    # text) for every seq a summary can have, not only for small ones.
    check_format_template("SummaryView template", template, _TEMPLATE_FIELDS,
                          [{"first": first, "last": last, "text": "summary"}
                           for first, last in ((1, 2), (0xD800, 0xDFFF),
                                               (0x110000, MAX_SEQ))],
                          bound_output=False)


def _priming(counter: TokenCounter) -> int:
    """Reply priming: what an empty request costs (``count_messages([])``)."""
    return counter.count_messages([])


def _tools_tokens(view: str, counter: TokenCounter, tools: Sequence[Mapping[str, Any]] | None
                  ) -> int:
    """The tokens of ``tools`` (ConfigurationError naming the gap when ``counter`` cannot)."""
    del view  # the shared error names the counter and what to do instead
    return count_tool_schemas(counter, tools)


def _latest_summary(source: HistorySource) -> Summary | None:
    """The source's latest summary; ``None`` for a source that predates summaries."""
    read = getattr(source, "latest_summary", None)
    return cast(Summary | None, read()) if read is not None else None


class Fold(NamedTuple):
    """What ``store.summarize`` folds into a new summary (see `plan_fold()`).

    Attributes:
        previous: the latest summary, which the new one extends (or ``None``).
        messages: the messages to summarize, chronological (empty: nothing to do).
        first_seq: the new summary's first seq (the previous one's, else the first
            folded message's).
        last_seq: the new summary's last seq.
    """

    previous: Summary | None
    messages: list[StoredMessage]
    first_seq: int
    last_seq: int


def plan_fold(source: HistorySource, keep_tokens: int, counter: TokenCounter) -> Fold:
    """Choose the units a new summary folds in (pure: reads ``source``, writes nothing).

    Walks the units newer than the latest summary's range newest-first. The newest
    complete, non-anchored unit is never folded (every view keeps the turn being
    answered, so a summary must not stand for it), whatever its size; older ones are
    kept out of the summary while the kept tokens total at most ``keep_tokens``; the
    first that does not fit and every older complete, non-anchored unit down to the
    previous range are folded, and the new range ends at that first unit's last seq.
    Anchored units (every view keeps them) and incomplete units (never sent
    anywhere) are not folded, but a range may cover them; a pending call at the end
    is never covered, since it is newer than every complete unit. Units are never
    split. Reads the kept and the folded units only.
    """
    previous = _latest_summary(source)
    floor = source.first_seq
    if previous is not None:
        floor = max(floor, previous.last_seq + 1)
    nothing = Fold(previous, [], 0, 0)
    if floor > source.last_seq:
        return nothing
    units = BackwardUnits(ReverseReader(
        source, floor=floor, first_page=_budget_page(source, max(keep_tokens, 1))
    ))
    kept = 0
    newest = True  # the newest complete, non-anchored unit: kept whatever its size
    cut: int | None = None
    folded: list[StoredMessage] = []
    for unit in units:
        if not unit.complete or unit.anchored:
            continue
        if cut is None:
            tokens = unit.tokens(counter)
            if newest or kept + tokens <= keep_tokens:
                newest = False
                kept += tokens
                continue
            cut = unit.last_seq + 1
        if unit.last_seq < cut:
            folded.extend(unit.messages)
    if cut is None or not folded:
        return nothing
    folded.sort(key=lambda m: m.seq)
    first = previous.first_seq if previous is not None else folded[0].seq
    return Fold(previous, folded, first, cut - 1)


class _SummaryLedger(_Ledger):
    """The views' ledger, with the seqs a summary stands for reported as ``"summarized"``."""

    def __init__(self, view: ContextView, source: HistorySource, counter: TokenCounter,
                 summary: Summary | None) -> None:
        super().__init__(view, source, counter, "budget")
        self.summary = summary
        # Seqs up to here are the summary's; unread seqs after it did not fit.
        self.boundary = summary.last_seq if summary is not None else source.first_seq - 1

    def omit(self, unit: Unit, reason: OmissionReason) -> None:
        # A summary ending inside a unit (only a hand-made one can: summarize ends its
        # ranges after a complete unit) makes the tail walk see that unit's tool
        # results as orphans; when the unit is anchored, its messages are already kept
        # whole and must stay.
        if reason == "incomplete_unit" and all(m.seq in self.kept for m in unit.messages):
            return
        super().omit(unit, reason)

    def unread(self, first: int, last: int) -> list[tuple[int, int, OmissionReason]]:
        """Unread seqs: ``"summarized"`` up to the summary's last one, then ``"budget"``."""
        runs: list[tuple[int, int, OmissionReason]] = []
        if first <= self.boundary:
            runs.append((first, min(last, self.boundary), "summarized"))
        if last > self.boundary:
            runs.append((max(first, self.boundary + 1), last, "budget"))
        return runs

    def finish(self, budget: int, summary_message: Message | None,
               summary_tokens: int) -> ContextWindow:
        kept = self.kept
        stored = [kept[s] for s in sorted(kept)]
        counter = self.counter
        name = counter.name
        tokens = 0
        for m in stored:
            tokens += m.token_count if m.token_counter == name else counter.count_message(m)
        messages: list[StoredMessage | Message] = list(stored)
        if summary_message is not None:
            assert self.summary is not None
            index = sum(1 for m in stored if m.seq <= self.summary.last_seq)
            # Never between a call and its results (a kept unit straddling the end of a
            # hand-made summary's range): go back to the start of that unit.
            while 0 < index < len(stored) and stored[index].role == "tool":
                index -= 1
            messages.insert(index, summary_message)
            tokens += summary_tokens
        if messages:
            tokens += _priming(counter)
        omitted = self.omissions()
        return self.result(
            messages, len(stored), tokens, budget, omitted,
            summary_range=self.summary.seq_range if self.summary is not None else None,
            unsummarized=sum(o.count for o in omitted if o.reason == "budget"),
        )


@dataclass(frozen=True)
class SummaryView(ContextView):
    """Anchored messages, the latest stored summary, then the newest units that fit.

    Rule: charge the anchored messages, the latest summary (stored by
    ``store.summarize``, rendered as one ``system`` message from ``template``) and
    the newest complete unit after the summary's range (raise
    `ContextBudgetError` if they do not fit), then walk units
    back from the newest, never into the summary's range, and stop at the first that
    does not fit (a contiguous suffix, as [`TokenLimitedView`][memstore.TokenLimitedView]). The
    summary
    message is a plain [`Message`][memstore.Message] (not stored, no seq) placed
    after the kept messages its range covers, with metadata
    ``{"memstore": {"summary": True, "first_seq": ..., "last_seq": ...}}``. Without a
    summary the view is a ``TokenLimitedView``. Omitted reasons: ``"summarized"``
    (inside the summary's range), ``"budget"``. The report's ``summary_range`` is the
    summary's ``(first_seq, last_seq)``; ``unsummarized`` counts the stored messages
    after the range that the window neither shows nor summarizes (the ``"budget"``
    ones: 0 right after ``summarize`` when the kept tail fits). Reads the summary row,
    the anchored messages and the tail it shows: never the summarized history.

    Reference: contexty's ``Summarize`` strategy, agentflow's
    ``SummaryContextManager``, LangChain's ``SummarizationMiddleware``.

    Differences: contexty calls the summarizer again on every compile that
    overflows and keeps nothing; agentflow keeps one ``context_summary`` in the
    agent's state; LangChain rewrites the stored state as "remove all", the
    summary, then the kept messages, so the originals are gone. memstore stores
    each summary once, as a row with the seq range it stands for, folded in
    incrementally by ``store.summarize``: a window never calls a model, a
    restarted agent gets the same window, and the original messages stay stored,
    so every other view is unchanged.

    Args:
        token_limit: the budget (>= 1).
        reserve: tokens to leave free (>= 0, < token_limit).
        tools: tool schemas, counted into the reserve.
        template: ``str.format`` template of the summary message with ``{first}``,
            ``{last}`` (its seq range) and ``{text}``.
        counter: the counter to use instead of the store's.
        start_on_user: trim the kept tail from its old end until its first turn is a
            user message (never the newest unit; reason ``"start_on_user"``), for
            providers that want a user turn first. The summary and anchored messages
            are system-side and do not count as turns.

    Raises:
        ConfigurationError: (a ``ValueError``) an invalid parameter.
    """

    budgeted: ClassVar[bool] = True

    token_limit: int
    reserve: int = 0
    tools: Sequence[Mapping[str, Any]] | None = field(default=None, hash=False)
    template: str = DEFAULT_SUMMARY_TEMPLATE
    counter: TokenCounter | None = None
    start_on_user: bool = False

    def __post_init__(self) -> None:
        name = "SummaryView"
        _check_budget_params(name, self.token_limit, self.reserve)
        _check_summary_template(self.template)
        _check_bool("SummaryView", "start_on_user", self.start_on_user)
        object.__setattr__(self, "tools", _normalize_tools(name, self.tools))
        # With its tools normalized, as TokenLimitedView: a counter that cannot count
        # them is refused here, not on the first window that needs the budget check.
        _check_counter(name, self.counter, self.tools)

    def apply(self, messages: Sequence[StoredMessage], counter: TokenCounter,
              summaries: Sequence[Summary] = ()) -> ContextWindow:
        """Build the window over a list of stored messages and their summaries.

        Raises:
            ConfigurationError: ``counter`` does not implement the TokenCounter protocol.
            InvalidInputError: ``messages`` or ``summaries`` are not stored ones (see
                [`ListHistory`][memstore.ListHistory]).
        """
        return self.select(ListHistory(messages, summaries=summaries),
                           checked_counter(validate_counter(counter)))

    def _required(self, counter: TokenCounter, tools: int, anchored: int, summary: int,
                  newest: int) -> int:
        """The budget left after the required part, or ContextBudgetError."""
        priming = _priming(counter)
        required = anchored + summary + newest + priming + self.reserve + tools
        if required > self.token_limit:
            raise ContextBudgetError(
                f"SummaryView: the anchored messages ({anchored} tokens), the summary "
                f"({summary}) and the newest unit ({newest}) with reply priming ({priming}), "
                f"reserve ({self.reserve}) and tool schemas ({tools}) need {required} "
                f"tokens; token_limit is {self.token_limit}",
                required=required,
                budget=self.token_limit,
            )
        return self.token_limit - required

    def select(self, source: HistorySource, counter: TokenCounter) -> ContextWindow:
        """Keep anchored messages, the latest summary and the newest units that fit."""
        # Counted first, so a counter that cannot count tools fails on every window.
        tools = _tools_tokens("SummaryView", counter, self.tools)
        summary = _latest_summary(source)
        ledger = _SummaryLedger(self, source, counter, summary)
        message = summary.to_message(self.template) if summary is not None else None
        summary_tokens = counter.count_message(message) if message is not None else 0
        if source.message_count == 0:
            if message is not None:
                self._required(counter, tools, 0, summary_tokens, 0)
            return ledger.finish(self.token_limit, message, summary_tokens)
        anchors = ledger.anchor()
        anchored_tokens = anchors.tokens(counter)
        floor = summary.last_seq + 1 if summary is not None else None
        reader = ReverseReader(source, floor=floor,
                               first_page=_budget_page(source, self.token_limit))
        kept: list[Unit] = []
        remaining = 0
        for unit in ledger.candidates(BackwardUnits(reader)):
            tokens = unit.tokens(counter)
            if not kept:
                remaining = self._required(counter, tools, anchored_tokens, summary_tokens, tokens)
            elif tokens > remaining:
                ledger.omit(unit, "budget")
                break
            else:
                remaining -= tokens
            ledger.keep(unit)
            kept.append(unit)
        if not kept and (anchors.units or message is not None):
            self._required(counter, tools, anchored_tokens, summary_tokens, 0)
        if self.start_on_user:
            _start_on_user(ledger, kept[::-1])
        return ledger.finish(self.token_limit, message, summary_tokens)


_VIEW_CLASSES[SummaryView.__name__] = SummaryView
