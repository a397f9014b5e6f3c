"""Grouping messages into atomic units (memstore.views.units)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from memstore.models import Message, StoredMessage
from memstore.views.history import ListHistory
from memstore.views.units import (
    BackwardUnits,
    ForwardReader,
    ForwardUnits,
    ReverseReader,
    Unit,
    group_units,
    resolve_anchors,
)
from tests.viewcases import CALL, PER_MESSAGE, RES, A, D, S, U, stored


def shape(units: list[Unit]) -> list[tuple[tuple[int, ...], bool]]:
    return [(u.seqs, u.complete) for u in units]


def test_plain_messages_are_units_of_their_own() -> None:
    h = stored([S(), U("u1"), A("a1")])
    assert shape(group_units(h)) == [((1,), True), ((2,), True), ((3,), True)]


def test_parallel_calls_with_results_out_of_order_form_one_unit() -> None:
    h = stored([U("u1"), CALL("a", "b", "c"), RES("c"), RES("a"), RES("b"), A("done")])
    units = group_units(h)
    assert shape(units) == [((1,), True), ((2, 3, 4, 5), True), ((6,), True)]
    assert units[1].is_tool_unit
    assert [m.tool_call_id for m in units[1].messages[1:]] == ["c", "a", "b"]


def test_chained_calls_are_consecutive_units() -> None:
    h = stored([U("u1"), CALL("a"), RES("a"), CALL("b"), RES("b"), A("final")])
    assert shape(group_units(h)) == [
        ((1,), True), ((2, 3), True), ((4, 5), True), ((6,), True)
    ]


def test_pending_call_at_the_end_is_incomplete() -> None:
    h = stored([U("u1"), CALL("a")])
    assert shape(group_units(h)) == [((1,), True), ((2,), False)]


def test_partially_answered_call_is_incomplete_with_its_results() -> None:
    h = stored([U("u1"), CALL("a", "b"), RES("a")])
    assert shape(group_units(h)) == [((1,), True), ((2, 3), False)]


def test_unanswered_call_followed_by_user_and_a_late_result() -> None:
    # The result comes after the user message: it is not in the call's run, so the call
    # is unanswered and the result is an orphan.
    h = stored([CALL("a"), U("u1"), RES("a"), A("a1")])
    assert shape(group_units(h)) == [((1,), False), ((2,), True), ((3,), False), ((4,), True)]


def test_system_message_between_call_and_result_breaks_the_run() -> None:
    h = stored([CALL("a"), S(), RES("a")])
    assert shape(group_units(h)) == [((1,), False), ((2,), True), ((3,), False)]


@pytest.mark.parametrize(
    ("messages", "expected"),
    [
        ([RES("x"), U("u1")], [((1,), False), ((2,), True)]),
        ([U("u1"), RES("x"), A("a1")], [((1,), True), ((2,), False), ((3,), True)]),
        ([U("u1"), A("a1"), RES("x"), RES("y")], [((1,), True), ((2,), True), ((3,), False),
                                                  ((4,), False)]),
    ],
    ids=["at-start", "middle", "after-plain-assistant"],
)
def test_orphan_results(messages: list[Message],
                        expected: list[tuple[tuple[int, ...], bool]]) -> None:
    assert shape(group_units(stored(messages))) == expected


def test_result_answering_an_id_of_a_different_call_is_an_orphan() -> None:
    h = stored([CALL("a"), RES("b")])
    assert shape(group_units(h)) == [((1,), False), ((2,), False)]
    h = stored([CALL("a"), RES("a"), RES("zzz"), A("a1")])
    assert shape(group_units(h)) == [((1, 2), True), ((3,), False), ((4,), True)]


def test_duplicate_answer_keeps_the_first_and_orphans_the_second() -> None:
    h = stored([CALL("a", "b"), RES("a", "first"), RES("a", "second"), RES("b")])
    units = group_units(h)
    assert shape(units) == [((1, 2, 4), True), ((3,), False)]
    assert units[0].messages[1].text == "first"


def test_every_message_belongs_to_exactly_one_unit() -> None:
    h = stored([RES("o"), CALL("a", "b"), RES("b"), RES("q"), RES("a"), RES("a"), U("u"),
                CALL("c"), S(), RES("c"), CALL("d")])
    seqs = sorted(s for u in group_units(h) for s in u.seqs)
    assert seqs == [m.seq for m in h]


# ---- anchors ---------------------------------------------------------------------------

def test_pinned_tool_result_anchors_the_whole_unit() -> None:
    h = stored([U("u1"), CALL("a", "b"), RES("a", pinned=True), RES("b"), U("u2")])
    anchors = resolve_anchors(ListHistory(h))
    assert shape(anchors.units) == [((2, 3, 4), True)]
    assert anchors.incomplete == []
    assert anchors.seqs == {2, 3, 4}
    assert anchors.tokens(PER_MESSAGE) == 3


def test_pinned_call_anchors_its_results() -> None:
    h = stored([U("u1"), CALL("a", "b", pinned=True), RES("b"), RES("a"), A("a1")])
    anchors = resolve_anchors(ListHistory(h))
    assert shape(anchors.units) == [((2, 3, 4), True)]


def test_pinned_message_of_an_incomplete_unit_is_not_anchored_but_reported() -> None:
    h = stored([U("u1"), CALL("a", "b"), RES("a", pinned=True), U("u2"), RES("x", pinned=True)])
    anchors = resolve_anchors(ListHistory(h))
    assert anchors.units == []
    assert shape(anchors.incomplete) == [((2, 3), False), ((5,), False)]


def test_anchor_set_holds_system_developer_and_pinned_messages() -> None:
    h = stored([S(), U("u1", pinned=True), A("a1"), D(), A("a2", pinned=True)])
    anchors = resolve_anchors(ListHistory(h))
    assert [u.seqs for u in anchors.units] == [(1,), (2,), (4,), (5,)]


def test_resolving_a_pinned_unit_reads_only_its_run() -> None:
    filler = [U(f"u{i}") if i % 2 else A(f"a{i}") for i in range(2000)]
    h = stored([*filler, CALL("a", "b"), RES("a"), RES("b", pinned=True), *filler])
    source = ListHistory(h)
    anchors = resolve_anchors(source)
    assert shape(anchors.units) == [((2001, 2002, 2003), True)]
    assert source.rows_read < 40


# ---- incremental grouping across pages -------------------------------------------------

RICH = [
    RES("o1"), S(), U("u1"), CALL("a", "b"), RES("b"), RES("zz"), RES("a"), RES("a"),
    A("a1"), CALL("c"), RES("c"), CALL("d", "e", "f"), RES("f"), RES("d"), RES("e"),
    U("u2"), CALL("g"), U("u3"), RES("g"), A("a3"), CALL("h"), RES("h"), CALL("i"),
]


@pytest.mark.parametrize("page", [1, 2, 3, 5, 64])
def test_backward_grouping_across_page_boundaries_matches_whole_list(page: int) -> None:
    h = stored(RICH)
    expected = sorted(shape(group_units(h)))
    source = ListHistory(h)
    grouper = BackwardUnits(ReverseReader(source, first_page=page, max_page=page))
    units = list(grouper)
    assert sorted(shape(units)) == expected
    # Newest first, by last seq.
    assert [u.last_seq for u in units] == sorted((u.last_seq for u in units), reverse=True)
    assert source.rows_read == len(h)


@pytest.mark.parametrize("page", [1, 2, 3, 5, 64])
def test_forward_grouping_across_page_boundaries_matches_whole_list(page: int) -> None:
    h = stored(RICH)
    units = list(ForwardUnits(ForwardReader(ListHistory(h), first_page=page, max_page=page)))
    assert shape(units) == shape(group_units(h))


def test_a_run_straddling_pages_reads_back_to_its_call() -> None:
    # Five results answer one call; pages of 2 rows split the run three times.
    h = stored([U("u1"), CALL("a", "b", "c", "d", "e"), *(RES(i) for i in "edcba"), U("u2")])
    grouper = BackwardUnits(ReverseReader(ListHistory(h), first_page=2, max_page=2))
    assert shape([next(grouper)]) == [((8,), True)]
    unit = next(grouper)
    assert unit.seqs == (2, 3, 4, 5, 6, 7)
    assert unit.complete


def test_pending_tool_messages_wait_for_their_call() -> None:
    h = stored([U("u1"), CALL("a", "b"), RES("a"), RES("b")])
    messages = iter(reversed(h))
    grouper = BackwardUnits(messages)
    unit = next(grouper)
    assert unit.seqs == (2, 3, 4)
    assert grouper.pending == []


def test_reverse_reader_stops_at_floor_and_grows_pages() -> None:
    h = stored([U(str(i)) for i in range(100)])
    source = ListHistory(h)
    reader = ReverseReader(source, floor=41, first_page=4, max_page=16)
    seqs = [m.seq for m in reader]
    assert seqs == list(range(100, 40, -1))
    assert source.rows_read == 60
    assert reader.exhausted


def test_reverse_reader_reads_only_what_is_consumed_plus_one_page() -> None:
    h = stored([U(str(i)) for i in range(1000)])
    source = ListHistory(h)
    reader = ReverseReader(source, first_page=8, max_page=64)
    got: list[StoredMessage] = [next(reader) for _ in range(20)]
    assert [m.seq for m in got] == list(range(1000, 980, -1))
    assert source.rows_read == 8 + 16  # two pages


class _Streaming(ListHistory):
    """A source with the optional streaming hook, recording how it was called."""

    calls: list[tuple[int, int, int, int]]

    def stream_newest_first(self, before: int, floor: int, first_page: int,
                            max_page: int) -> Iterator[StoredMessage]:
        self.calls.append((before, floor, first_page, max_page))
        for seq in range(min(before, self.last_seq + 1) - 1, max(floor, self.first_seq) - 1, -1):
            yield from self.read(seq, seq + 1)


@pytest.mark.parametrize("observe", [False, True])
def test_reverse_reader_reads_through_a_sources_stream(observe: bool) -> None:
    source = _Streaming(stored([U(str(i)) for i in range(30)]))
    source.calls = []
    seen: list[int] = []
    reader = ReverseReader(source, before=25, floor=11, first_page=6, max_page=12,
                           observer=seen.append if observe else None)
    got = [m.seq for m in reader]
    assert got == list(range(24, 10, -1))
    assert source.calls == [(25, 11, 6, 12)]  # the reader's paging goes to the source
    assert seen == ([m for m in source.read(11, 25)][::-1] if observe else [])
    assert reader.exhausted
    partial = ReverseReader(source, first_page=4)
    assert next(partial).seq == 30
    assert not partial.exhausted
    empty = ReverseReader(source, before=5, floor=5)  # nothing to read: no stream opened
    assert list(empty) == [] and empty.exhausted
    assert len(source.calls) == 2


class _IteratorStreaming(ListHistory):
    """A streaming hook that returns a plain iterator, not a generator."""

    def stream_newest_first(self, before: int, floor: int, first_page: int,
                            max_page: int) -> Iterator[StoredMessage]:
        return iter(self.read(floor, before)[::-1])


def test_reverse_reader_knows_when_a_plain_iterator_stream_is_exhausted() -> None:
    source = _IteratorStreaming(stored([U(str(i)) for i in range(10)]))
    reader = ReverseReader(source, floor=4)
    assert next(reader).seq == 10 and not reader.exhausted
    assert [m.seq for m in reader] == [9, 8, 7, 6, 5, 4]
    assert reader.exhausted


def test_observer_sees_every_consumed_message_in_order() -> None:
    h = stored([U(str(i)) for i in range(10)])
    seen: list[int] = []
    reader = ReverseReader(ListHistory(h), first_page=3, observer=lambda m: seen.append(m.seq))
    for _ in range(4):
        next(reader)
    assert seen == [10, 9, 8, 7]
