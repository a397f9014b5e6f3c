"""Context views: reference behaviour, documented divergences, errors, config, cost.

Golden vectors come from ``shared/reference/views.md`` and are translated to memstore's
semantics: system/developer/pinned messages are *anchored* (kept, not counted toward
sizes), units are never split, incomplete units never emitted. Labels: ``S`` system,
``uN`` user, ``aN`` assistant text, ``CALL cN`` an assistant tool call, ``RES cN`` its
result, ``<...>`` a placeholder.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from memstore.errors import ConfigurationError, ContextBudgetError
from memstore.models import Message, StoredMessage
from memstore.tokens import FixedCounter, TokenCounter
from memstore.views import (
    BufferedView,
    ContextView,
    HeadAndTailView,
    RecentTurnsView,
    ScoreBasedView,
    TokenLimitedView,
    UnboundedView,
    view_from_config,
)
from memstore.views.history import ListHistory
from tests.viewcases import CALL, PER_MESSAGE, RES, T0, A, D, S, U, labels, stored

C = PER_MESSAGE  # 1 token per message, no priming: budgets read as message counts

# [S, u1, CALL c1, RES c1, a1, u2]: autogen's Buffered golden conversation.
SIX = [S(), U("u1"), CALL("c1"), RES("c1"), A("a1"), U("u2")]
# autogen's HeadAndTail golden conversation (10 messages).
TEN = [S(), U("u1"), CALL("c1"), RES("c1"), A("a1"), U("u2"), CALL("c2"), RES("c2"), A("a2"),
       U("u3")]
# LangChain's trim_messages golden conversation.
LC = [S(), U("h1"), CALL("c1"), RES("c1"), A("a1"), U("h2"), A("a2")]


def omitted(view: ContextView, messages: list[Message], counter: TokenCounter = C
            ) -> list[tuple[int, int, int, str]]:
    w = view.apply(stored(messages, counter=counter), counter)
    return [(o.first_seq, o.last_seq, o.count, o.reason) for o in w.report.omitted]


def run(view: ContextView, messages: list[Message], counter: TokenCounter = C) -> list[str]:
    return labels(view.apply(stored(messages, counter=counter), counter))


ALL_VIEWS: list[ContextView] = [
    UnboundedView(),
    BufferedView(3),
    HeadAndTailView(2, 2),
    TokenLimitedView(10),
    ScoreBasedView(10),
    RecentTurnsView(2),
]


# ---- shared rules ------------------------------------------------------------------------

@pytest.mark.parametrize("view", ALL_VIEWS, ids=lambda v: type(v).__name__)
def test_empty_conversation_gives_an_empty_window(view: ContextView) -> None:
    w = view.apply([], C)
    assert w.messages == []
    assert w.token_count == 0
    assert w.report.conversation_message_count == 0
    assert w.report.omitted == []


@pytest.mark.parametrize("view", ALL_VIEWS, ids=lambda v: type(v).__name__)
def test_no_view_emits_a_pending_call_or_an_orphan_result(view: ContextView) -> None:
    # autogen Buffered keeps the trailing unanswered call; LangChain/CAMEL keep orphans.
    msgs = [RES("x"), S(), U("u1"), A("a1"), U("u2"), CALL("c9")]
    out = run(view, msgs)
    assert "CALL c9" not in out
    assert "RES x" not in out
    assert out[-1] == "u2"
    # The pending call was read (it is the newest message) and is reported as such; the
    # orphan at seq 1 only when the view read that far.
    assert (6, 6, 1, "incomplete_unit") in omitted(view, msgs)


@pytest.mark.parametrize("view", ALL_VIEWS, ids=lambda v: type(v).__name__)
def test_pinned_incomplete_unit_is_still_left_out(view: ContextView) -> None:
    msgs = [U("u1"), CALL("a", "b"), RES("a", pinned=True), U("u2")]
    out = run(view, msgs)
    assert "CALL a,b" not in out
    assert "RES a" not in out


@pytest.mark.parametrize(
    "view",
    [BufferedView(1), HeadAndTailView(1, 1), TokenLimitedView(5), ScoreBasedView(5),
     RecentTurnsView(1)],
    ids=lambda v: type(v).__name__,
)
def test_anchored_messages_are_kept_in_place_and_a_pinned_result_keeps_its_unit(
    view: ContextView,
) -> None:
    msgs = [U("u0"), CALL("a"), RES("a", pinned=True), U("u1"), D("dev"), A("a1"), S("late"),
            U("u2"), A("a2")]
    w = view.apply(stored(msgs), C)
    # CALL a (seq 2) is kept with its pinned result; dev (5) and late (7) in place.
    assert {2, 3, 5, 7, 9} <= set(w.seqs)
    assert w.seqs == sorted(w.seqs)
    # Budgets are charged for them: 4 anchored + the newest unit.
    if view.budgeted:
        assert labels(w) == ["CALL a", "RES a", "dev", "late", "a2"]


@pytest.mark.parametrize("view", ALL_VIEWS, ids=lambda v: type(v).__name__)
def test_newest_unit_is_kept_even_when_larger_than_any_size(view: ContextView) -> None:
    msgs = [S(), U("u1"), A("a1"), U("u2"), CALL("p", "q", "r"), RES("r"), RES("p"), RES("q")]
    out = run(view, msgs, counter=C)
    assert out[-4:] == ["CALL p,q,r", "RES r", "RES p", "RES q"]


@pytest.mark.parametrize("view", ALL_VIEWS, ids=lambda v: type(v).__name__)
def test_report_accounts_for_every_stored_message(view: ContextView) -> None:
    msgs = [S(), *TEN[1:], RES("zz"), U("u4"), S("mid"), A("a4"), U("u5")]
    w = view.apply(stored(msgs), C)
    report = w.report
    assert report.view == type(view).__name__
    assert report.counter == C.name
    assert report.conversation_message_count == len(msgs)
    assert report.included_count == len(w.seqs)
    assert report.included_count + report.omitted_count == len(msgs)
    covered = set(report.omitted_seqs())
    assert covered.isdisjoint(w.seqs)
    assert covered | set(w.seqs) == set(range(1, len(msgs) + 1))
    assert report.rows_read > 0


@pytest.mark.parametrize("view", ALL_VIEWS, ids=lambda v: type(v).__name__)
def test_reading_a_window_does_not_change_the_source(view: ContextView) -> None:
    h = stored([*TEN, CALL("zz")])
    before = [m.model_dump() for m in h]
    first = view.apply(h, C)
    again = view.apply(h, C)
    assert [m.model_dump() for m in h] == before
    assert first == again


def test_token_count_is_the_whole_list_as_the_provider_counts_it() -> None:
    counter = FixedCounter(2, per_word=1, per_tool_call=3, priming=5)
    h = stored(TEN, counter=counter)
    for view in (UnboundedView(), BufferedView(4), TokenLimitedView(30), ScoreBasedView(30),
                 HeadAndTailView(1, 2), RecentTurnsView(1)):
        w = view.apply(h, counter)
        assert w.token_count == counter.count_messages(w.messages), view


def test_counts_from_another_counter_are_recomputed_for_the_messages_read() -> None:
    # Stored with a 1-per-message counter; the view counts 3 per message.
    h = stored(TEN, counter=C)
    three = FixedCounter(3)
    w = TokenLimitedView(9).apply(h, three)
    assert labels(w) == ["S", "a2", "u3"]
    assert w.token_count == 9
    assert w.report.counter == three.name


def test_view_counter_overrides_the_default() -> None:
    own = FixedCounter(3)
    view = TokenLimitedView(9, counter=own)
    assert view.resolve_counter(C) is own
    assert TokenLimitedView(9).resolve_counter(C) is C
    assert BufferedView(2).resolve_counter(C) is C


# ---- UnboundedView -------------------------------------------------------------------------

def test_unbounded_keeps_every_complete_unit() -> None:
    assert run(UnboundedView(), TEN) == labels(UnboundedView().apply(stored(TEN), C))
    assert len(run(UnboundedView(), TEN)) == 10


def test_unbounded_leaves_out_incomplete_units_and_reports_them() -> None:
    msgs = [U("u1"), CALL("a", "b"), RES("b"), U("u2"), RES("x"), A("a2"), CALL("p")]
    assert run(UnboundedView(), msgs) == ["u1", "u2", "a2"]
    assert omitted(UnboundedView(), msgs) == [
        (2, 3, 2, "incomplete_unit"), (5, 5, 1, "incomplete_unit"), (7, 7, 1, "incomplete_unit")
    ]


# ---- BufferedView ----------------------------------------------------------------------------

@pytest.mark.parametrize(
    ("size", "expected"),
    [
        # autogen: [u2]. S is anchored: kept, not counted.
        (1, ["S", "u2"]),
        # autogen: [a1, u2].
        (2, ["S", "a1", "u2"]),
        # autogen: [a1, u2] (its window started on RES c1 and dropped it). memstore stops
        # before the CALL+RES unit, which would take the count to 4.
        (3, ["S", "a1", "u2"]),
        # autogen: [CALL c1, RES c1, a1, u2].
        (4, ["S", "CALL c1", "RES c1", "a1", "u2"]),
        # autogen needs 6 for everything; memstore 5 (S is not counted).
        (5, ["S", "u1", "CALL c1", "RES c1", "a1", "u2"]),
        (6, ["S", "u1", "CALL c1", "RES c1", "a1", "u2"]),
        (100, ["S", "u1", "CALL c1", "RES c1", "a1", "u2"]),
    ],
)
def test_buffered_golden_vectors(size: int, expected: list[str]) -> None:
    assert run(BufferedView(size), SIX) == expected


def test_buffered_stops_at_the_first_unit_that_would_cross() -> None:
    # Older small units are not used to fill the remaining room.
    msgs = [U("u1"), A("a1"), CALL("a", "b"), RES("a"), RES("b"), U("u2")]
    assert run(BufferedView(3), msgs) == ["u2"]
    assert omitted(BufferedView(3), msgs) == [(1, 5, 5, "buffer_size")]


def test_buffered_drops_the_trailing_unanswered_call_autogen_keeps() -> None:
    # autogen Buffered(2) over [..., u2, CALL c9] returns [u2, CALL c9]: a provider 400.
    msgs = [S(), U("u1"), A("a1"), U("u2"), CALL("c9")]
    assert run(BufferedView(2), msgs) == ["S", "a1", "u2"]


def test_buffered_keeps_system_messages_autogen_evicts() -> None:
    msgs = [S(), U("u1"), A("a1"), S("mid"), U("u2"), A("a2")]
    assert run(BufferedView(1), msgs) == ["S", "mid", "a2"]


# ---- HeadAndTailView ------------------------------------------------------------------------

@pytest.mark.parametrize(
    ("head", "tail", "expected"),
    [
        # autogen: [S, <Skipped 8>, u3] (S is its head). memstore: S is anchored, u1 is the head.
        (1, 1, ["S", "u1", "<Skipped 7 messages.>", "u3"]),
        # autogen: [S, u1, <Skipped 7>, u3].
        (2, 1, ["S", "u1", "<Skipped 7 messages.>", "u3"]),
        # autogen: [S, u1, <Skipped 5>, a2, u3]: it trimmed CALL c1 from the head and did not
        # count it. memstore's head holds u1 + the CALL/RES unit (3 messages).
        (3, 2, ["S", "u1", "CALL c1", "RES c1", "<Skipped 4 messages.>", "a2", "u3"]),
        # autogen: [S, u1, <Skipped 5>, a2, u3] while 6 messages are missing (RES c2 was
        # trimmed from the tail uncounted). memstore counts the 6.
        (2, 3, ["S", "u1", "<Skipped 6 messages.>", "a2", "u3"]),
        # autogen: "Skipped 1 messages." with 2 missing. memstore: head and tail meet.
        (3, 6, ["S", "u1", "CALL c1", "RES c1", "a1", "u2", "CALL c2", "RES c2", "a2", "u3"]),
        (5, 5, ["S", "u1", "CALL c1", "RES c1", "a1", "u2", "CALL c2", "RES c2", "a2", "u3"]),
    ],
)
def test_head_and_tail_golden_vectors(head: int, tail: int, expected: list[str]) -> None:
    assert run(HeadAndTailView(head, tail), TEN) == expected


def test_head_and_tail_placeholder_counts_exactly_what_is_missing() -> None:
    # The case where autogen under-counts: both of its boundary guards would fire.
    w = HeadAndTailView(2, 3).apply(stored(TEN), C)
    placeholder = w.messages[2]
    assert not isinstance(placeholder, StoredMessage)
    missing = sorted(set(range(1, 11)) - set(w.seqs))
    assert missing == [3, 4, 5, 6, 7, 8]
    assert placeholder.metadata == {"memstore": {"placeholder": True, "skipped": 6}}
    assert placeholder.role == "user"
    assert w.report.skipped == 6
    assert w.report.placeholder == "Skipped 6 messages."
    assert [(o.first_seq, o.last_seq, o.reason) for o in w.report.omitted] == [
        (3, 8, "head_tail_gap")
    ]


def test_head_and_tail_placeholder_singular() -> None:
    w = HeadAndTailView(1, 2).apply(stored([U("u1"), A("a1"), U("u2"), A("a2")]), C)
    assert labels(w) == ["u1", "<Skipped 1 message.>", "u2", "a2"]
    assert w.report.skipped == 1
    assert w.messages[1].metadata == {"memstore": {"placeholder": True, "skipped": 1}}


def test_head_and_tail_custom_placeholder_template_and_role() -> None:
    view = HeadAndTailView(1, 1, placeholder_template="[{n} earlier {messages} omitted]",
                           placeholder_role="system")
    w = view.apply(stored([U("u1"), A("a1"), U("u2"), A("a2")]), C)
    assert labels(w) == ["u1", "<[2 earlier messages omitted]>", "a2"]
    assert w.messages[1].role == "system"


def test_head_and_tail_placeholder_tokens_are_counted() -> None:
    counter = FixedCounter(1, per_word=1, priming=2)
    w = HeadAndTailView(1, 1).apply(stored(TEN, counter=counter), counter)
    assert w.token_count == counter.count_messages(w.messages)


def test_head_and_tail_keeps_anchored_gap_messages_after_the_placeholder() -> None:
    msgs = [U("u1"), A("a1"), S("mid"), U("u2"), A("a2"), U("u3")]
    w = HeadAndTailView(1, 1).apply(stored(msgs), C)
    assert labels(w) == ["u1", "<Skipped 3 messages.>", "mid", "u3"]
    assert w.report.skipped == 3


def test_head_and_tail_counts_incomplete_units_in_the_gap_but_not_before_the_head() -> None:
    msgs = [RES("x0"), U("u1"), A("a1"), U("u2"), CALL("c9"), A("a2")]
    w = HeadAndTailView(1, 1).apply(stored(msgs), C)
    assert labels(w) == ["u1", "<Skipped 3 messages.>", "a2"]
    assert w.report.skipped == 3  # a1, u2 and the unanswered CALL c9; not RES x0
    assert [(o.first_seq, o.last_seq, o.reason) for o in w.report.omitted] == [
        (1, 1, "incomplete_unit"), (3, 4, "head_tail_gap"), (5, 5, "incomplete_unit"),
    ]


def test_head_and_tail_head_may_be_empty() -> None:
    msgs = [S(), CALL("a", "b"), RES("a"), RES("b"), U("u1"), A("a1"), U("u2")]
    assert run(HeadAndTailView(1, 1), msgs) == ["S", "<Skipped 5 messages.>", "u2"]


def test_head_and_tail_without_a_gap_has_no_placeholder() -> None:
    w = HeadAndTailView(3, 3).apply(stored([U("u1"), A("a1"), U("u2")]), C)
    assert labels(w) == ["u1", "a1", "u2"]
    assert w.report.skipped == 0
    assert w.report.placeholder is None


def test_head_and_tail_placeholder_when_only_an_incomplete_unit_lies_between() -> None:
    # The tail walk reaches the unit the head refused, but the unanswered call between the
    # head and the tail is not in the window: the placeholder says so.
    msgs = [U("u1"), CALL("lost"), U("u2"), A("a2")]
    w = HeadAndTailView(1, 3).apply(stored(msgs), C)
    assert labels(w) == ["u1", "<Skipped 1 message.>", "u2", "a2"]
    assert w.report.skipped == 1 and w.report.placeholder == "Skipped 1 message."
    assert [(o.first_seq, o.reason) for o in w.report.omitted] == [(2, "incomplete_unit")]


def test_head_and_tail_counts_an_incomplete_unit_before_an_anchored_gap_message() -> None:
    msgs = [U("u1"), CALL("lost"), S("mid"), U("u2"), A("a2"), U("u3")]
    w = HeadAndTailView(1, 1).apply(stored(msgs), C)
    assert labels(w) == ["u1", "<Skipped 3 messages.>", "mid", "u3"]
    assert w.report.skipped == 3  # the call, u2 and a2


def test_head_and_tail_incomplete_units_inside_the_head_need_no_placeholder() -> None:
    w = HeadAndTailView(3, 1).apply(stored([U("u1"), CALL("lost"), A("a1"), U("u2")]), C)
    assert labels(w) == ["u1", "a1", "u2"] and w.report.skipped == 0


# ---- TokenLimitedView ------------------------------------------------------------------------

def test_token_limited_langchain_vectors_without_orphans() -> None:
    # trim_messages(last, n=5, include_system) -> [S, T c1, a1, h2, a2]: an orphan.
    assert run(TokenLimitedView(5), LC) == ["S", "a1", "h2", "a2"]
    # trim_messages(last, n=4) -> [T c1, a1, h2, a2]: an orphan; memstore keeps S (anchored).
    assert run(TokenLimitedView(4), LC) == ["S", "a1", "h2", "a2"]
    # With room for the whole unit, it comes whole.
    assert run(TokenLimitedView(6), LC) == ["S", "CALL c1", "RES c1", "a1", "h2", "a2"]


def test_token_limited_start_on_user_matches_langchain_start_on_human() -> None:
    # trim_messages(last, n=5, include_system, start_on="human") -> [S, h2, a2].
    assert run(TokenLimitedView(5, start_on_user=True), LC) == ["S", "h2", "a2"]
    assert omitted(TokenLimitedView(5, start_on_user=True), LC) == [
        (2, 4, 3, "budget"), (5, 5, 1, "start_on_user")
    ]


def test_token_limited_start_on_user_never_drops_the_newest_unit() -> None:
    msgs = [S(), A("a0"), A("a1")]
    assert run(TokenLimitedView(3, start_on_user=True), msgs) == ["S", "a1"]


def test_token_limited_drops_from_the_old_end_not_the_middle() -> None:
    # autogen with 6 messages and m = 5 returns [S, u1, CALL c1, a1, u2]: middle removal,
    # an unanswered call. memstore keeps a suffix of whole units.
    assert run(TokenLimitedView(5), SIX) == ["S", "CALL c1", "RES c1", "a1", "u2"]
    # autogen with [u1, u2] and room for one keeps u1 (the oldest); memstore the newest.
    assert run(TokenLimitedView(1), [U("u1"), U("u2")]) == ["u2"]


def test_token_limited_is_a_suffix_stopping_at_the_first_unit_that_does_not_fit() -> None:
    counter = FixedCounter(1, per_word=1)
    msgs = [U("tiny"), U("a very long message indeed"), A("ok"), U("now")]
    # now(2) + ok(2) = 4; the long one (6) does not fit in 8 - 4; "tiny" would, but a
    # TokenLimitedView does not leave holes.
    assert run(TokenLimitedView(8), msgs, counter) == ["ok", "now"]


def test_token_limited_charges_priming_reserve_and_tools() -> None:
    counter = FixedCounter(1, priming=2, per_tool_schema=3)
    h = stored(TEN, counter=counter)
    tools = [{"type": "function", "function": {"name": "f", "parameters": {}}}]
    w = TokenLimitedView(10, reserve=1, tools=tools).apply(h, counter)
    # 10 - priming 2 - reserve 1 - tools 3 = 4 tokens: S + u3 + a2 + (CALL c2 unit does not fit)
    assert labels(w) == ["S", "a2", "u3"]
    assert w.token_count == 5
    assert w.budget == 10
    assert w.token_count + 1 + 3 <= 10


def test_token_limited_budget_error_carries_the_numbers() -> None:
    counter = FixedCounter(1, priming=2)
    msgs = [S(), D(), U("u1"), CALL("a", "b"), RES("a"), RES("b")]
    with pytest.raises(ContextBudgetError) as info:
        TokenLimitedView(6, reserve=1).apply(stored(msgs, counter=counter), counter)
    # anchored 2 + newest unit 3 + priming 2 + reserve 1
    assert info.value.required == 8
    assert info.value.budget == 6
    assert "8" in str(info.value) and "6" in str(info.value)


def test_budget_error_when_anchored_messages_alone_do_not_fit() -> None:
    counter = FixedCounter(1, per_word=1)
    with pytest.raises(ContextBudgetError) as info:
        TokenLimitedView(3).apply(stored([S("a long system prompt")], counter=counter), counter)
    assert (info.value.required, info.value.budget) == (5, 3)


def test_budget_error_when_tool_schemas_alone_exceed_the_limit() -> None:
    # autogen returns [] in this case.
    counter = FixedCounter(1, per_tool_schema=50)
    view = TokenLimitedView(20, tools=[{"name": "f"}])
    with pytest.raises(ContextBudgetError) as info:
        view.apply(stored([U("u1")], counter=counter), counter)
    assert (info.value.required, info.value.budget) == (51, 20)


def test_budget_fits_exactly() -> None:
    w = TokenLimitedView(2).apply(stored([S(), U("u1")]), C)
    assert labels(w) == ["S", "u1"]
    with pytest.raises(ContextBudgetError):
        TokenLimitedView(1).apply(stored([S(), U("u1")]), C)


def test_token_limited_reports_unread_history_by_gaps_between_anchored_messages() -> None:
    msgs = [U(f"u{i}") for i in range(1, 21)]
    msgs[4] = S("five")
    msgs[9] = S("ten")
    w = TokenLimitedView(5).apply(stored(msgs), C)
    assert labels(w) == ["five", "ten", "u18", "u19", "u20"]
    assert [(o.first_seq, o.last_seq, o.count, o.reason) for o in w.report.omitted] == [
        (1, 4, 4, "budget"), (6, 9, 4, "budget"), (11, 17, 7, "budget")
    ]


# ---- ScoreBasedView --------------------------------------------------------------------------

def test_score_based_keeps_the_highest_scores_that_fit() -> None:
    # CAMEL's shape: three records; the highest-scored one is kept, output chronological.
    msgs = [A("x", score=5.0), A("y", score=0.1), A("z", score=3.0), U("now")]
    assert run(ScoreBasedView(3), msgs) == ["x", "z", "now"]
    assert run(ScoreBasedView(2), msgs) == ["x", "now"]


def test_score_based_keep_rate_decay_and_tie_break_newer_first() -> None:
    msgs = [U("old", score=2.0), A("mid"), U("new")]
    # keep_rate 0.9: mid = 0.9**2 = 0.81, old = 2 * 0.9**3 = 1.458 -> old wins.
    assert run(ScoreBasedView(2), msgs) == ["old", "new"]
    # keep_rate 0.5: mid = 0.25, old = 2 * 0.125 = 0.25: a tie, the newer one wins.
    assert run(ScoreBasedView(2, keep_rate=0.5), msgs) == ["mid", "new"]


def test_score_based_anchored_messages_do_not_advance_the_decay() -> None:
    # With S between them, mid is still j=2 and old j=3.
    msgs = [U("old", score=2.0), S(), A("mid"), S("s2"), U("new")]
    assert run(ScoreBasedView(4, keep_rate=0.5), msgs) == ["S", "mid", "s2", "new"]


def test_score_based_half_life_decay() -> None:
    times = [T0, T0 + timedelta(hours=1), T0 + timedelta(hours=2)]
    msgs = [U("old", score=1.5), A("mid"), U("new")]
    h = stored(msgs, times=times)
    # half_life 1h: mid = 0.5, old = 1.5 * 0.25 = 0.375 -> mid.
    assert labels(ScoreBasedView(2, half_life=3600).apply(h, C)) == ["mid", "new"]
    # half_life 2h: mid = 0.707, old = 1.5 * 0.5 = 0.75 -> old.
    assert labels(ScoreBasedView(2, half_life=7200).apply(h, C)) == ["old", "new"]


def test_score_based_half_life_ages_never_decrease_with_seq() -> None:
    # "old" has a skewed clock (newer than everything). Its age is taken from the running
    # minimum of newer messages' times, so it ties with "mid" (newer wins) instead of
    # outranking it with a negative age.
    times = [T0 + timedelta(hours=2), T0, T0 + timedelta(hours=1)]
    h = stored([U("old"), A("mid"), U("new")], times=times)
    assert labels(ScoreBasedView(2, half_life=3600).apply(h, C)) == ["mid", "new"]


def test_score_based_decides_a_candidate_only_when_nothing_older_can_outrank_it() -> None:
    # x = 0.9**2 = 0.81 is read first; old = 1.2 * 0.9**3 = 0.8748 is read later and must
    # still win: x may only be decided once max_score * 0.9**3 falls below 0.81.
    msgs = [U("old", score=1.2), A("x"), U("new")]
    assert run(ScoreBasedView(2), msgs) == ["old", "new"]


def test_score_based_finds_a_high_score_many_pages_back() -> None:
    filler = [U(f"f{i}") if i % 2 else A(f"f{i}") for i in range(300)]
    msgs = [U("gem", score=1e6), *filler, U("new")]
    source = ListHistory(stored(msgs))
    w = ScoreBasedView(3, keep_rate=0.99).select(source, C)
    # gem: 1e6 * 0.99**301 ~ 48,600; the next best is f299 at 0.99**2.
    assert labels(w) == ["gem", "f299", "new"]


def test_score_based_half_life_clamps_ages_below_zero() -> None:
    # The newest message (anchored) has the earliest clock; every other age would be
    # negative. Ages are clamped at 0, so base scores decide: a (1.2) over b (1.0).
    times = [T0 + timedelta(minutes=30), T0 + timedelta(hours=1), T0 + timedelta(hours=1), T0]
    h = stored([U("a", score=1.2), A("b"), U("c"), S()], times=times)
    assert labels(ScoreBasedView(3, half_life=3600).apply(h, C)) == ["a", "c", "S"]


def test_score_based_skips_a_unit_that_does_not_fit_and_goes_on() -> None:
    counter = FixedCounter(1, per_word=1)
    msgs = [U("a"), U("b b b b b"), U("c")]
    # new c(2) leaves 4; b (6 tokens, higher score) is skipped; a (2) fits.
    assert run(ScoreBasedView(6), msgs, counter) == ["a", "c"]
    # fill_scan=0: stop at the first unit that does not fit.
    assert run(ScoreBasedView(6, fill_scan=0), msgs, counter) == ["c"]
    assert run(ScoreBasedView(6, fill_scan=None), msgs, counter) == ["a", "c"]


def test_score_based_keeps_tool_units_whole_where_camel_splits_them() -> None:
    # A high-scored result with a low-scored call: CAMEL V2 kept the result alone (issue
    # #2636). The unit scores the max of its messages and is kept or dropped whole.
    msgs = [U("u1"), CALL("c1", score=0.0), RES("c1", score=9.0), A("a1", score=0.0),
            U("u2")]
    assert run(ScoreBasedView(3), msgs) == ["CALL c1", "RES c1", "u2"]
    assert run(ScoreBasedView(2), msgs) == ["u1", "u2"]


def test_score_based_keeps_later_system_messages_camel_v4_drops() -> None:
    msgs = [S(), U("u1"), A("a1"), S("later"), U("u2")]
    assert run(ScoreBasedView(3), msgs) == ["S", "later", "u2"]


def test_score_based_always_keeps_the_newest_unit() -> None:
    # CAMEL scores the newest message keep_rate and can evict it; memstore cannot.
    msgs = [U("u1", score=100.0), A("a1", score=100.0), U("u2", score=0.0)]
    assert run(ScoreBasedView(2), msgs) == ["a1", "u2"]


def test_score_based_budget_error() -> None:
    counter = FixedCounter(1, priming=3)
    with pytest.raises(ContextBudgetError) as info:
        ScoreBasedView(5, reserve=1).apply(stored([S(), U("u1"), U("u2")], counter=counter),
                                           counter)
    assert (info.value.required, info.value.budget) == (6, 5)


def test_score_based_half_life_replaces_keep_rate_in_config() -> None:
    view = ScoreBasedView(100, keep_rate=0.0, half_life=60)
    h = stored([U("x"), U("y"), U("z")])
    assert labels(view.apply(h, C)) == ["x", "y", "z"]
    assert view.to_config()["half_life"] == 60


# ---- RecentTurnsView -------------------------------------------------------------------------

def test_recent_turns_agentflow_twelve_turns_max_ten() -> None:
    msgs: list[Message] = [S()]
    for i in range(1, 13):
        msgs += [U(f"u{i}"), A(f"a{i}")]
    out = run(RecentTurnsView(10), msgs)
    assert out[0] == "S"
    assert [x for x in out if x.startswith("u")] == [f"u{i}" for i in range(3, 13)]
    assert omitted(RecentTurnsView(10), msgs) == [(2, 5, 4, "max_turns")]


def test_recent_turns_fewer_turns_than_the_limit_keeps_everything() -> None:
    assert run(RecentTurnsView(5), TEN) == labels(UnboundedView().apply(stored(TEN), C))


def test_recent_turns_with_exactly_max_turns_trims_nothing() -> None:
    # agentflow: users <= max_messages -> the context is left as it is.
    msgs = [U("hello", pinned=True), A("greeting"), U("u1"), A("a1"), U("u2"), A("a2")]
    assert run(RecentTurnsView(2), msgs) == ["hello", "greeting", "u1", "a1", "u2", "a2"]
    assert omitted(RecentTurnsView(2), msgs) == []
    assert run(RecentTurnsView(2), msgs[1:]) == ["greeting", "u1", "a1", "u2", "a2"]
    # One turn more than max_turns: the window starts at the max_turns-th newest user turn.
    assert run(RecentTurnsView(1), msgs) == ["hello", "u2", "a2"]
    assert omitted(RecentTurnsView(1), msgs) == [(2, 4, 3, "max_turns")]


def test_recent_turns_keeps_system_messages_in_place_where_agentflow_hoists() -> None:
    msgs = [S("s1"), U("u1"), A("a1"), U("u2"), S("s2"), A("a2"), U("u3")]
    # agentflow: [s1, s2, u2, a2, u3].
    assert run(RecentTurnsView(2), msgs) == ["s1", "u2", "s2", "a2", "u3"]


def test_recent_turns_pinned_user_messages_do_not_count() -> None:
    msgs = [U("u1"), U("u2", pinned=True), U("u3"), A("a3")]
    assert run(RecentTurnsView(2), msgs) == ["u1", "u2", "u3", "a3"]


def test_recent_turns_removes_every_complete_tool_unit_not_only_the_last() -> None:
    # agentflow removes only the last call+result pair of a chain: [s,u1,CALL a,RES a,fin,u2].
    msgs = [S(), U("u1"), CALL("a"), RES("a"), CALL("b"), RES("b"), A("fin"), U("u2")]
    assert run(RecentTurnsView(5, remove_tool_messages=True), msgs) == ["S", "u1", "fin", "u2"]
    assert omitted(RecentTurnsView(5, remove_tool_messages=True), msgs) == [
        (3, 6, 4, "tool_messages_removed")
    ]


def test_recent_turns_remove_tool_messages_keeps_the_newest_unit() -> None:
    msgs = [U("u1"), CALL("a"), RES("a"), A("a1"), U("u2"), CALL("b"), RES("b")]
    assert run(RecentTurnsView(2, remove_tool_messages=True), msgs) == [
        "u1", "a1", "u2", "CALL b", "RES b"
    ]


# ---- start_on_user: every budgeted and count view ------------------------------------------

# A greeting, an opening tool call, then turns: most windows would start with an assistant.
GREETED = [S(), A("hello"), CALL("c1"), RES("c1"), A("a0"), U("u1"), A("a1"), U("u2"),
           A("a2"), U("u3"), A("a3")]


@pytest.mark.parametrize("view", [
    TokenLimitedView(4, start_on_user=True),
    ScoreBasedView(4, start_on_user=True),
    BufferedView(3, start_on_user=True),
    HeadAndTailView(4, 2, start_on_user=True),
    HeadAndTailView(1, 3, placeholder_role="system", start_on_user=True),
    RecentTurnsView(5, start_on_user=True),
    RecentTurnsView(5, remove_tool_messages=True, start_on_user=True),
], ids=lambda v: type(v).__name__)
def test_start_on_user_windows_start_with_a_user_turn(view: ContextView) -> None:
    w = view.apply(stored(GREETED), C)
    first = next(m for m in w.messages if m.role not in ("system", "developer"))
    assert first.role == "user", labels(w)
    body = w.to_anthropic(leading_assistant="raise")  # no repair needed
    assert body["messages"][0]["role"] == "user"
    assert "start_on_user" in {o.reason for o in w.report.omitted}
    # without it, the same view starts with an assistant turn
    off = view_from_config({**view.to_config(), "start_on_user": False})
    w_off = off.apply(stored(GREETED), C)
    assert next(m for m in w_off.messages if m.role not in ("system", "developer")
                ).role == "assistant"


def test_buffered_start_on_user_drops_from_the_old_end_without_refilling() -> None:
    msgs = [S(), U("u1"), A("a1"), U("u2"), A("a2")]
    assert run(BufferedView(3), msgs) == ["S", "a1", "u2", "a2"]
    assert run(BufferedView(3, start_on_user=True), msgs) == ["S", "u2", "a2"]
    assert omitted(BufferedView(3, start_on_user=True), msgs) == [
        (2, 2, 1, "buffer_size"), (3, 3, 1, "start_on_user")]
    # never the newest unit
    assert run(BufferedView(5, start_on_user=True), [S(), A("a0"), A("a1")]) == ["S", "a1"]


def test_score_based_start_on_user_drops_a_prefix_of_the_greedy_selection() -> None:
    # a1 scores 5 * 0.9**3: the greedy pass takes it, then u2; the budget is spent.
    msgs = [U("u1"), A("a1", score=5.0), U("u2"), A("a2")]
    assert run(ScoreBasedView(3), msgs) == ["a1", "u2", "a2"]
    # start_on_user drops a1 for its position, whatever its score; the freed token is
    # not spent again (u1 would fit, but the greedy pass never picked it).
    assert run(ScoreBasedView(3, start_on_user=True), msgs) == ["u2", "a2"]
    assert omitted(ScoreBasedView(3, start_on_user=True), msgs) == [
        (1, 1, 1, "score"), (2, 2, 1, "start_on_user")]
    assert run(ScoreBasedView(9, start_on_user=True), [A("a0"), A("a1")]) == ["a1"]


def test_recent_turns_start_on_user_trims_what_precedes_the_first_user_turn() -> None:
    msgs = [A("hello"), CALL("c1"), RES("c1"), U("u1"), A("a1")]
    assert run(RecentTurnsView(2), msgs) == ["hello", "CALL c1", "RES c1", "u1", "a1"]
    assert run(RecentTurnsView(2, start_on_user=True), msgs) == ["u1", "a1"]
    assert omitted(RecentTurnsView(2, start_on_user=True), msgs) == [
        (1, 3, 3, "start_on_user")]
    # more turns than max_turns: the window already starts at a user message
    assert run(RecentTurnsView(1, start_on_user=True), msgs) == ["u1", "a1"]
    # tool units removed first, then what still precedes the user turn
    assert omitted(RecentTurnsView(2, remove_tool_messages=True, start_on_user=True),
                   msgs) == [(1, 1, 1, "start_on_user"), (2, 3, 2, "tool_messages_removed")]


def test_head_and_tail_start_on_user() -> None:
    msgs = [S(), A("hello"), U("u1"), A("a1"), U("u2"), A("a2"), U("u3"), A("a3")]
    assert run(HeadAndTailView(2, 2), msgs) == ["S", "hello", "u1", "<Skipped 3 messages.>",
                                                "u3", "a3"]
    # the head is trimmed to its first user message; N counts the gap as before
    w = HeadAndTailView(2, 2, start_on_user=True).apply(stored(msgs), C)
    assert labels(w) == ["S", "u1", "<Skipped 3 messages.>", "u3", "a3"]
    assert [(o.first_seq, o.last_seq, o.reason) for o in w.report.omitted] == [
        (2, 2, "start_on_user"), (4, 6, "head_tail_gap")]
    # a head trimmed away: the user placeholder comes first and stands for all of it
    w = HeadAndTailView(1, 3, start_on_user=True).apply(stored(msgs), C)
    assert labels(w) == ["S", "<Skipped 4 messages.>", "a2", "u3", "a3"]
    assert w.report.skipped == 4
    # a system placeholder is not a turn: the tail is trimmed to a user message too
    w = HeadAndTailView(1, 3, placeholder_role="system", start_on_user=True).apply(
        stored(msgs), C)
    assert labels(w) == ["S", "<Skipped 5 messages.>", "u3", "a3"]
    assert w.messages[1].role == "system" and w.report.skipped == 5
    assert [(o.first_seq, o.last_seq, o.reason) for o in w.report.omitted] == [
        (2, 2, "start_on_user"), (3, 5, "head_tail_gap"), (6, 6, "start_on_user")]
    # the head takes everything: trimmed like a suffix, never the newest unit
    assert run(HeadAndTailView(9, 9, start_on_user=True), msgs[:4]) == ["S", "u1", "a1"]
    assert run(HeadAndTailView(9, 9, start_on_user=True), [A("x"), A("y")]) == ["y"]


def test_head_and_tail_placeholder_never_splits_an_anchored_tool_unit() -> None:
    # A duplicate answer (an orphan, left out) inside a pinned unit in the gap: the
    # placeholder went between the call's results, a request providers refuse.
    msgs = [U("u0"), CALL("c0", "c1", pinned=True), RES("c1", pinned=True),
            RES("c1", "dup", pinned=True), RES("c0", pinned=True), U("u2"), U("u3")]
    w = HeadAndTailView(1, 1).apply(stored(msgs), C)
    assert labels(w) == ["u0", "CALL c0,c1", "RES c1", "RES c0", "<Skipped 2 messages.>",
                         "u3"]
    assert w.report.skipped == 2
    assert [(o.first_seq, o.last_seq, o.reason) for o in w.report.omitted] == [
        (4, 4, "incomplete_unit"), (6, 6, "head_tail_gap")]


# ---- parameters and configuration ----------------------------------------------------------

@pytest.mark.parametrize(
    "make",
    [
        lambda: BufferedView(0),
        lambda: BufferedView(-1),
        lambda: BufferedView(2.5),  # type: ignore[arg-type]
        lambda: BufferedView(True),
        lambda: HeadAndTailView(0, 1),
        lambda: HeadAndTailView(1, 0),
        lambda: HeadAndTailView(1, 1, placeholder_template="Skipped {count}"),
        # {n:c}: a NUL for 0, a surrogate for 0xD800, OverflowError past U+10FFFF
        lambda: HeadAndTailView(1, 1, placeholder_template="Skipped {n:c}"),
        lambda: HeadAndTailView(1, 1, placeholder_role="tool"),  # type: ignore[arg-type]
        lambda: TokenLimitedView(0),
        lambda: TokenLimitedView(-5),
        lambda: TokenLimitedView(10, reserve=-1),
        lambda: TokenLimitedView(10, reserve=10),
        lambda: TokenLimitedView(10, tools=[object()]),  # type: ignore[list-item]
        lambda: TokenLimitedView(10, tools="f"),  # type: ignore[arg-type]
        lambda: TokenLimitedView(10, start_on_user="yes"),  # type: ignore[arg-type]
        lambda: TokenLimitedView(10, counter="fixed"),  # type: ignore[arg-type]
        lambda: ScoreBasedView(-1),
        lambda: ScoreBasedView(10, reserve=-1),
        lambda: ScoreBasedView(10, keep_rate=1.5),
        lambda: ScoreBasedView(10, keep_rate=-0.1),
        lambda: ScoreBasedView(10, keep_rate=float("nan")),
        lambda: ScoreBasedView(10, half_life=0),
        lambda: ScoreBasedView(10, half_life=-3),
        lambda: ScoreBasedView(10, half_life=float("inf")),
        lambda: ScoreBasedView(10, fill_scan=-1),
        lambda: RecentTurnsView(0),
        lambda: RecentTurnsView(2, remove_tool_messages=1),  # type: ignore[arg-type]
        lambda: BufferedView(2, start_on_user=1),  # type: ignore[arg-type]
        lambda: HeadAndTailView(1, 1, start_on_user="yes"),  # type: ignore[arg-type]
        lambda: HeadAndTailView(1, 1, placeholder_role="assistant", start_on_user=True),
        lambda: ScoreBasedView(10, start_on_user=None),  # type: ignore[arg-type]
        lambda: RecentTurnsView(2, start_on_user=0),  # type: ignore[arg-type]
    ],
)
def test_invalid_parameters_raise_value_error(make: Any) -> None:
    with pytest.raises(ValueError):
        make()
    with pytest.raises(ConfigurationError):
        make()


def test_boundary_parameters_are_accepted() -> None:
    ScoreBasedView(1, keep_rate=0.0)
    ScoreBasedView(1, keep_rate=1)
    ScoreBasedView(1, fill_scan=0)
    ScoreBasedView(1, fill_scan=None)
    TokenLimitedView(1, reserve=0)
    BufferedView(1)
    HeadAndTailView(1, 1)
    RecentTurnsView(1)


def test_views_are_frozen() -> None:
    view = BufferedView(3)
    with pytest.raises(AttributeError):
        view.buffer_size = 4  # type: ignore[misc]


def test_tools_are_copied_at_construction() -> None:
    tools: list[dict[str, Any]] = [{"name": "f"}]
    view = TokenLimitedView(10, tools=tools)
    tools[0]["name"] = "g"
    assert view.to_config()["tools"] == [{"name": "f"}]


ROUND_TRIP: list[ContextView] = [
    UnboundedView(),
    BufferedView(7),
    HeadAndTailView(2, 5, placeholder_template="({n} {messages} hidden)",
                    placeholder_role="assistant"),
    TokenLimitedView(4000, reserve=500, tools=[{"type": "function", "function": {"name": "f"}}],
                     start_on_user=True, counter=FixedCounter(3, per_word=1, priming=2)),
    TokenLimitedView(100),
    ScoreBasedView(2000, keep_rate=0.8, half_life=120.0, reserve=10, tools=None,
                   counter=FixedCounter(2), fill_scan=None),
    ScoreBasedView(2000),
    RecentTurnsView(4, remove_tool_messages=True),
    BufferedView(3, start_on_user=True),
    HeadAndTailView(2, 3, placeholder_role="system", start_on_user=True),
    ScoreBasedView(5, keep_rate=0.5, start_on_user=True),
    RecentTurnsView(2, start_on_user=True),
]


@pytest.mark.parametrize("view", ROUND_TRIP, ids=lambda v: type(v).__name__)
def test_config_round_trip(view: ContextView) -> None:
    config = view.to_config()
    assert config["type"] == type(view).__name__
    import json

    rebuilt = view_from_config(json.loads(json.dumps(config)))
    assert type(rebuilt) is type(view)
    assert rebuilt.to_config() == config
    h = stored(TEN)
    assert rebuilt.select(ListHistory(h), C) == view.select(ListHistory(h), C)
    own = getattr(view, "counter", None)
    if own is not None:
        assert config["counter"] == own.name
        assert rebuilt.resolve_counter(C).name == own.name


def test_config_of_a_budgeted_view_lists_every_parameter() -> None:
    assert TokenLimitedView(100).to_config() == {
        "type": "TokenLimitedView", "token_limit": 100, "reserve": 0, "tools": None,
        "start_on_user": False, "counter": None,
    }
    assert ScoreBasedView(100).to_config() == {
        "type": "ScoreBasedView", "token_limit": 100, "keep_rate": 0.9, "half_life": None,
        "reserve": 0, "tools": None, "counter": None, "fill_scan": 64, "start_on_user": False,
    }


@pytest.mark.parametrize(("config", "view"), [
    ({"type": "BufferedView", "buffer_size": 3}, BufferedView(3)),
    ({"type": "HeadAndTailView", "head_size": 1, "tail_size": 2}, HeadAndTailView(1, 2)),
    ({"type": "ScoreBasedView", "token_limit": 100, "keep_rate": 0.9, "half_life": None,
      "reserve": 0, "tools": None, "counter": None, "fill_scan": 64}, ScoreBasedView(100)),
    ({"type": "RecentTurnsView", "max_turns": 2, "remove_tool_messages": False},
     RecentTurnsView(2)),
])
def test_configs_saved_before_start_on_user_still_load(config: dict[str, Any],
                                                       view: ContextView) -> None:
    rebuilt = view_from_config(config)
    assert rebuilt == view and rebuilt.start_on_user is False  # type: ignore[attr-defined]
    on = view_from_config({**rebuilt.to_config(), "start_on_user": True})
    assert on.start_on_user is True  # type: ignore[attr-defined]
    assert view_from_config(on.to_config()) == on


@pytest.mark.parametrize(
    "config",
    [
        {"type": "NoSuchView"},
        {"buffer_size": 3},
        {"type": "BufferedView"},
        {"type": "BufferedView", "buffer_size": 3, "extra": 1},
        {"type": "BufferedView", "buffer_size": 0},
        {"type": "TokenLimitedView", "token_limit": 10, "counter": 5},
        {"type": "TokenLimitedView", "token_limit": 10, "counter": "nonsense/1"},
    ],
)
def test_invalid_configs_raise_value_error(config: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        view_from_config(config)


# ---- cost: grows with the window, not the history -------------------------------------------

N_BIG = 20_000
TOKENS_PER_MESSAGE = 10


@pytest.fixture(scope="module")
def big() -> list[StoredMessage]:
    """20,000 messages of 10 tokens: plain turns, tool units, a system message every 1,000."""
    counter = FixedCounter(TOKENS_PER_MESSAGE)
    msgs: list[Message] = []
    i = 0
    while len(msgs) < N_BIG:
        if i % 1000 == 0:
            msgs.append(S(f"s{i}"))
        elif i % 7 == 3:
            msgs += [CALL(f"c{i}", f"d{i}"), RES(f"d{i}"), RES(f"c{i}")]
        else:
            msgs.append(U(f"u{i}") if i % 2 else A(f"a{i}"))
        i += 1
    return stored(msgs[:N_BIG], counter=counter)


BIG_COUNTER = FixedCounter(TOKENS_PER_MESSAGE)


@pytest.mark.parametrize("view", [TokenLimitedView(4000), ScoreBasedView(4000)],
                         ids=lambda v: type(v).__name__)
def test_budgeted_views_read_a_small_multiple_of_the_window(
    view: ContextView, big: list[StoredMessage]
) -> None:
    source = ListHistory(big)
    w = view.select(source, BIG_COUNTER)
    anchored = sum(1 for m in big if m.anchored)
    assert w.token_count <= 4000
    assert len(w.seqs) >= 4000 // TOKENS_PER_MESSAGE - 5
    assert source.rows_read <= 4 * len(w.seqs) + anchored + 512
    assert w.report.rows_read == source.rows_read


def test_score_based_cost_stays_bounded_with_a_large_max_score(big: list[StoredMessage]) -> None:
    boosted = [big[0].model_copy(update={"score": 50.0}), *big[1:]]
    source = ListHistory(boosted)
    w = ScoreBasedView(4000).select(source, BIG_COUNTER)
    assert source.rows_read <= 4 * len(w.seqs) + 1000


def test_exact_score_based_reads_the_whole_history(big: list[StoredMessage]) -> None:
    # fill_scan=None is CAMEL's exact greedy: O(history), documented.
    # (4005: the budget is never spent exactly, so nothing stops the walk early.)
    source = ListHistory(big)
    ScoreBasedView(4005, fill_scan=None).select(source, BIG_COUNTER)
    assert source.rows_read >= N_BIG


@pytest.mark.parametrize(
    ("view", "budget"),
    [(BufferedView(50), 50), (RecentTurnsView(10), 80), (HeadAndTailView(10, 10), 20)],
    ids=lambda v: type(v).__name__,
)
def test_count_based_views_read_about_their_size(
    view: ContextView, budget: int, big: list[StoredMessage]
) -> None:
    source = ListHistory(big)
    view.select(source, BIG_COUNTER)
    anchored = sum(1 for m in big if m.anchored)
    assert source.rows_read <= budget + anchored + 40


def test_head_and_tail_never_reads_the_middle(big: list[StoredMessage]) -> None:
    source = ListHistory(big)
    w = HeadAndTailView(10, 10).select(source, BIG_COUNTER)
    anchored = sum(1 for m in big if m.anchored)
    assert w.report.skipped > N_BIG - 100
    assert source.rows_read <= 20 + anchored + 40


def test_unbounded_reads_everything(big: list[StoredMessage]) -> None:
    source = ListHistory(big)
    UnboundedView().select(source, BIG_COUNTER)
    assert source.rows_read >= N_BIG


@pytest.mark.parametrize(("messages", "problem"), [
    ([Message.user("x")], "messages[0] is a Message, not a StoredMessage"),
    ([{"role": "user", "content": "x"}], "messages[0] is a dict, not a StoredMessage"),
    ("not a list", "messages must be a list of StoredMessage (read from a store), not str"),
    (None, "not NoneType"),
])
def test_apply_refuses_what_is_not_stored_messages(messages: Any, problem: str) -> None:
    """A view applies to stored messages (their seqs place them): anything else is an
    InvalidInputError naming the first bad item, not an AttributeError."""
    from memstore.errors import InvalidInputError
    from memstore.views.summary import SummaryView

    counter = FixedCounter()
    for view in (TokenLimitedView(100), SummaryView(100)):
        with pytest.raises(InvalidInputError) as info:
            view.apply(messages, counter)
        assert problem in str(info.value)
    with pytest.raises(InvalidInputError, match=r"summaries\[0\] is a dict, not a Summary"):
        SummaryView(100).apply([], counter, [{"number": 1}])  # type: ignore[list-item]
    with pytest.raises(ConfigurationError, match="counter"):
        SummaryView(100).apply([], "cl100k_base")  # type: ignore[arg-type]
