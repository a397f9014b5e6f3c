"""Property tests of summaries: what ``summarize`` folds, and ``SummaryView``'s windows.

Random conversations (the generator of ``test_view_properties``) grow in steps; at
each step ``plan_fold`` (the pure selection ``store.summarize`` runs) picks the units to
fold into the chain of summaries, which is checked against a naive re-implementation
over the whole list. ``SummaryView`` is checked over the same histories with the
chain's latest summary, or with a hand-made summary ending anywhere.
"""

from __future__ import annotations

import contextlib
from datetime import datetime, timezone
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memstore.errors import ConfigurationError, ContextBudgetError
from memstore.models import StoredMessage, Summary
from memstore.tokens import TokenCounter, count_tool_schemas
from memstore.views.history import ListHistory
from memstore.views.summary import SummaryView, plan_fold
from tests.helpers import examples
from tests.test_view_properties import (
    PROPS,
    Case,
    Unit,
    assert_provider_valid,
    budget_params,
    cases,
    is_anchored,
    naive_units,
    seqs_of,
    tokens,
)

NOW = datetime(2026, 1, 1, tzinfo=timezone.utc)

#: The view properties' settings with fewer examples: each one summarizes several times.
SUMMARY_PROPS = settings(PROPS, max_examples=examples(120))


def make_summary(number: int, first: int, last: int, counter: TokenCounter) -> Summary:
    return Summary(conversation_id="conv", number=number, first_seq=first, last_seq=last,
                   text=f"gist {number}", token_count=3, token_counter=counter.name,
                   created_at=NOW)


def foldable(units: list[Unit]) -> list[Unit]:
    return [u for u in units if u[1] and not is_anchored(u)]


def build_chain(case: Case, steps: list[tuple[int, int]]) -> tuple[list[Summary], list[set[int]]]:
    """Summarize a growing conversation: ``steps`` are (messages appended, keep_tokens)."""
    msgs, counter = case.messages, case.counter
    chain: list[Summary] = []
    folds: list[set[int]] = []
    length = 0
    for grow, keep in steps:
        length = min(len(msgs), length + grow)
        prefix = msgs[:length]
        fold = plan_fold(ListHistory(prefix, summaries=chain), keep, counter)
        previous = chain[-1] if chain else None
        assert fold.previous == previous
        floor = previous.last_seq + 1 if previous else (prefix[0].seq if prefix else 1)
        region = [m for m in prefix if m.seq >= floor]
        candidates = foldable(naive_units(region))
        if not fold.messages:
            # every complete, non-anchored unit since the previous summary fits the kept
            # tokens, or there is only the newest one, which is never folded
            assert len(candidates) <= 1 or sum(tokens(u, counter) for u in candidates) <= keep
            continue
        cut = fold.last_seq + 1
        kept = [u for u in candidates if max(m.seq for m in u[0]) >= cut]
        older = [u for u in candidates if max(m.seq for m in u[0]) < cut]
        # the newest unit is kept whatever its size (never summarized away); the kept
        # units hold at most keep_tokens unless it alone exceeds them; the newest folded
        # one would not fit
        assert kept and kept[-1] is candidates[-1]
        assert len(kept) == 1 or sum(tokens(u, counter) for u in kept) <= keep
        assert sum(tokens(u, counter) for u in kept) + tokens(older[-1], counter) > keep
        assert max(m.seq for m in older[-1][0]) == cut - 1
        # exactly the complete, non-anchored units older than the cut, whole
        assert [m.seq for m in fold.messages] == sorted(seqs_of(older))
        assert fold.first_seq == (previous.first_seq if previous else min(seqs_of(older)))
        chain.append(make_summary(len(chain) + 1, fold.first_seq, fold.last_seq, counter))
        folds.append(seqs_of(older))
    return chain, folds


steps_strategy = st.lists(st.tuples(st.integers(1, 12), st.integers(0, 40)), min_size=1,
                          max_size=5)


@SUMMARY_PROPS
@given(case=cases(), steps=steps_strategy)
def test_summary_chain_folds_every_unit_once_and_whole(
    case: Case, steps: list[tuple[int, int]]
) -> None:
    chain, folds = build_chain(case, steps)
    # no unit folded twice; ranges nested
    for a in range(len(folds)):
        for b in range(a + 1, len(folds)):
            assert not folds[a] & folds[b]
    for i in range(1, len(chain)):
        before, after = chain[i - 1], chain[i]
        assert after.first_seq == before.first_seq and after.last_seq > before.last_seq
        assert min(folds[i]) > before.last_seq
    # judged on the whole conversation (later messages never change a folded unit):
    # only complete, non-anchored units are folded, each whole, in one summary
    everything = naive_units(case.messages)
    for unit in everything:
        seqs = seqs_of([unit])
        owners = [i for i, f in enumerate(folds) if f & seqs]
        if not owners:
            continue
        assert unit[1] and not is_anchored(unit), unit
        assert len(owners) == 1 and seqs <= folds[owners[0]]


def expected_summary_window(view: SummaryView, msgs: list[StoredMessage], summary: Summary | None,
                            counter: TokenCounter) -> tuple[list[int], int | None]:
    """(seqs, required when a ContextBudgetError is expected), computed naively."""
    units = naive_units(msgs)
    anchored = [u for u in units if u[1] and is_anchored(u)]
    boundary = summary.last_seq if summary else (msgs[0].seq - 1 if msgs else 0)
    tail_units = foldable(naive_units([m for m in msgs if m.seq > boundary]))
    anchored_tokens = sum(tokens(u, counter) for u in anchored)
    summary_tokens = counter.count_message(summary.to_message(view.template)) if summary else 0
    tools = count_tool_schemas(counter, view.tools)
    fixed = anchored_tokens + summary_tokens + counter.count_messages([]) + view.reserve + tools
    if not msgs and summary is None:
        return [], None
    if not tail_units:
        if not anchored and summary is None:
            return [], None
        return sorted(seqs_of(anchored)), fixed if fixed > view.token_limit else None
    newest = tail_units[-1]
    required = fixed + tokens(newest, counter)
    if required > view.token_limit:
        return [], required
    remaining = view.token_limit - required
    kept = [newest]
    for unit in reversed(tail_units[:-1]):
        cost = tokens(unit, counter)
        if cost > remaining:
            break
        remaining -= cost
        kept.append(unit)
    return sorted(seqs_of(anchored) | seqs_of(kept)), None


def refuses_tools(view: SummaryView, msgs: list[StoredMessage], counter: TokenCounter,
                   **kwargs: Any) -> bool:
    """A counter without count_tools cannot serve tools=: a clear error, every time."""
    if not msgs or not view.tools or callable(getattr(counter, "count_tools", None)):
        return False
    with pytest.raises(ConfigurationError, match="no count_tools method"):
        view.apply(msgs, counter, **kwargs)
    return True


def check_summary_view(view: SummaryView, case: Case, chain: list[Summary]) -> None:
    msgs, counter = case.messages, case.counter
    summary = chain[-1] if chain else None
    if refuses_tools(view, msgs, counter, summaries=chain):
        return
    want, required = expected_summary_window(view, msgs, summary, counter)
    try:
        window = view.apply(msgs, counter, summaries=chain)
    except ContextBudgetError as exc:
        assert required is not None, f"unexpected {exc}"
        assert exc.required == required and exc.budget == view.token_limit
        return
    assert required is None, "expected a ContextBudgetError"
    assert window.seqs == want
    assert_provider_valid(window)
    assert window.token_count == (counter.count_messages(window.messages)
                                  if window.messages else 0)
    if window.messages:
        extra = view.reserve + (count_tool_schemas(counter, view.tools))
        assert window.token_count + extra <= view.token_limit
    report = window.report
    assert report.summary_range == (summary.seq_range if summary else None)
    boundary = summary.last_seq if summary else (msgs[0].seq - 1 if msgs else 0)
    rendered = [m for m in window.messages if not isinstance(m, StoredMessage)]
    if summary is None:
        assert rendered == []
    else:
        assert len(rendered) == 1
        assert rendered[0].text == summary.to_message(view.template).text
        at = window.messages.index(rendered[0])
        assert all(m.seq <= boundary for m in window.messages[:at])  # type: ignore[union-attr]
        assert all(m.seq > boundary for m in window.messages[at + 1:]  # type: ignore[union-attr]
                   if not m.anchored and m.role != "tool")
    # every stored message is kept or omitted once; reasons sit on the right side
    assert report.included_count + report.omitted_count == len(msgs)
    assert not set(report.omitted_seqs()) & set(window.seqs)
    assert all(s <= boundary for s in report.omitted_seqs("summarized"))
    assert all(s > boundary for s in report.omitted_seqs("budget"))
    assert report.unsummarized == len(report.omitted_seqs("budget"))


@SUMMARY_PROPS
@given(case=cases(), steps=steps_strategy, params=budget_params(),
       template=st.sampled_from([None, "[{first}..{last}] {text}"]))
def test_summary_view_over_a_summarized_conversation(
    case: Case, steps: list[tuple[int, int]], params: dict[str, Any], template: str | None
) -> None:
    chain, _ = build_chain(case, steps)
    view = SummaryView(**params) if template is None else SummaryView(**params,
                                                                       template=template)
    check_summary_view(view, case, chain)
    # summarize never folds the turn being answered: the newest complete, non-anchored
    # unit of the summarized prefix is in every window over it that fits
    length = min(len(case.messages), sum(grow for grow, _ in steps))
    prefix = case.messages[:length]
    newest = foldable(naive_units(prefix))
    if newest and not refuses_tools(view, prefix, case.counter, summaries=chain):
        with contextlib.suppress(ContextBudgetError):
            window = view.apply(prefix, case.counter, summaries=chain)
            assert seqs_of(newest[-1:]) <= set(window.seqs)


@SUMMARY_PROPS
@given(case=cases(), params=budget_params(), data=st.data())
def test_summary_view_with_a_summary_ending_anywhere(
    case: Case, params: dict[str, Any], data: st.DataObject
) -> None:
    """A hand-made summary may end inside a unit: windows stay valid and within budget."""
    msgs, counter = case.messages, case.counter
    if not msgs:
        return
    last = data.draw(st.integers(msgs[0].seq, msgs[-1].seq))
    summary = make_summary(1, msgs[0].seq, last, counter)
    view = SummaryView(**params)
    if refuses_tools(view, msgs, counter, summaries=[summary]):
        return
    try:
        window = view.apply(msgs, counter, summaries=[summary])
    except ContextBudgetError as exc:
        assert exc.required > view.token_limit
        return
    assert_provider_valid(window)
    assert window.token_count == counter.count_messages(window.messages)
    extra = view.reserve + (count_tool_schemas(counter, view.tools))
    assert window.token_count + extra <= view.token_limit
    anchored = seqs_of([u for u in naive_units(msgs) if u[1] and is_anchored(u)])
    assert anchored <= set(window.seqs)
    assert all(s > last or s in anchored for s in window.seqs)
    assert window.report.included_count + window.report.omitted_count == len(msgs)
