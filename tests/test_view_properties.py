"""Property tests: every view over random conversations, against invariants and naive oracles.

Conversations mix plain turns, parallel and chained tool calls (results in any order,
some missing, duplicated or answering the wrong call), pending calls, orphan results,
mid-stream system/developer messages, pinned messages, equal (and skewed) timestamps,
empty texts and the odd huge message. The oracles below re-implement each selection
rule in the most naive way, over the whole list, independently of memstore.views.units.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memstore.errors import ConfigurationError, ContextBudgetError
from memstore.models import Message, StoredMessage, ToolCall
from memstore.tokens import (
    BaseTokenCounter,
    FixedCounter,
    TokenCounter,
    count_tool_schemas,
    counter_priming,
)
from memstore.views import (
    BufferedView,
    ContextView,
    HeadAndTailView,
    RecentTurnsView,
    ScoreBasedView,
    TokenLimitedView,
    UnboundedView,
)
from memstore.views.history import ListHistory
from memstore.views.units import (
    BackwardUnits,
    ForwardReader,
    ForwardUnits,
    ReverseReader,
    group_units,
)
from memstore.views.window import ContextWindow
from tests.helpers import examples
from tests.viewcases import CALL, PER_MESSAGE, RES, T0, U, stored

PROPS = settings(
    derandomize=True,
    database=None,
    max_examples=examples(300),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

# ---- random conversations -----------------------------------------------------------------

TEXTS = ["", "hi", "one two three", "a b c d e f g"]
HUGE = " ".join(["word"] * 120)


@st.composite
def texts(draw: st.DrawFn) -> str:
    if draw(st.integers(0, 30)) == 0:
        return HUGE
    return draw(st.sampled_from(TEXTS))


@st.composite
def extras(draw: st.DrawFn) -> dict[str, Any]:
    return {
        "pinned": draw(st.integers(0, 9)) == 0,
        "score": draw(st.sampled_from([0.0, 0.5, 1.0, 1.0, 2.0, 5.0])),
    }


@st.composite
def conversations(draw: st.DrawFn) -> list[Message]:
    msgs: list[Message] = []
    ids: list[str] = []

    def new_id() -> str:
        ids.append(f"c{len(ids)}")
        return ids[-1]

    def tool_block() -> None:
        k = draw(st.integers(1, 3))
        call_ids = [new_id() for _ in range(k)]
        msgs.append(Message.assistant(
            draw(st.sampled_from([None, "calling"])),
            tool_calls=[ToolCall(id=i, name="f", arguments="{}") for i in call_ids],
            **draw(extras()),
        ))
        answered = draw(st.permutations(call_ids))
        if draw(st.integers(0, 5)) == 0:  # some results missing
            answered = answered[: draw(st.integers(0, len(answered) - 1))]
        answered = list(answered)
        if draw(st.integers(0, 7)) == 0:  # a duplicate answer
            answered.insert(draw(st.integers(0, len(answered))), call_ids[0])
        if draw(st.integers(0, 7)) == 0:  # a result answering another call
            answered.insert(draw(st.integers(0, len(answered))), draw(st.sampled_from(ids)))
        for cid in answered:
            msgs.append(Message.tool(draw(texts()), tool_call_id=cid, **draw(extras())))

    for _ in range(draw(st.integers(0, 16))):
        kind = draw(st.sampled_from(
            ["user", "user", "user", "assistant", "assistant", "system", "developer",
             "tools", "tools", "chain", "pending", "orphan"]
        ))
        if kind == "user":
            msgs.append(Message.user(draw(texts()), **draw(extras())))
        elif kind == "assistant":
            msgs.append(Message.assistant(draw(texts()), **draw(extras())))
        elif kind == "system":
            msgs.append(Message.system(draw(texts()), **draw(extras())))
        elif kind == "developer":
            msgs.append(Message.developer(draw(texts()), **draw(extras())))
        elif kind == "tools":
            tool_block()
        elif kind == "chain":
            tool_block()
            tool_block()
            msgs.append(Message.assistant("final", **draw(extras())))
        elif kind == "pending":
            msgs.append(Message.assistant(None, tool_calls=[ToolCall(id=new_id(), name="f")],
                                          **draw(extras())))
        else:
            known: bool = draw(st.booleans())
            cid: str = draw(st.sampled_from(ids)) if ids and known else "ghost"
            msgs.append(Message.tool(draw(texts()), tool_call_id=cid, **draw(extras())))
    return msgs


class ProtocolOnlyCounter:
    """A user's counter with exactly the protocol: name, count_message, count_messages.

    No ``priming`` (memstore derives it from ``count_messages([])``), no ``count_tools``
    (views given ``tools=`` must refuse it clearly).
    """

    def __init__(self, inner: FixedCounter) -> None:
        self._inner = inner
        self.name = f"custom/{inner.name}"

    def count_message(self, message: Message) -> int:
        return self._inner.count_message(message)

    def count_messages(self, messages: Iterable[Message]) -> int:
        return sum(self._inner.count_message(m) for m in messages) + self._inner.priming


class ProtocolToolsCounter(ProtocolOnlyCounter):
    """The protocol plus the optional ``count_tools`` capability."""

    def __init__(self, inner: FixedCounter) -> None:
        super().__init__(inner)
        self.name = f"custom-tools/{inner.name}"

    def count_tools(self, tools: Sequence[Any]) -> int:
        return self._inner.count_tools(tools)


class WordsCounter(BaseTokenCounter):
    """A BaseTokenCounter subclass: name, count_message and the count_text hook only."""

    def __init__(self, per_message: int) -> None:
        self.per_message = per_message

    @property
    def name(self) -> str:
        return f"words/{self.per_message}"

    def count_message(self, message: Message) -> int:
        return self.per_message + len(message.text.split())

    def count_text(self, text: str) -> int:
        return len(text) // 8


@st.composite
def counters(draw: st.DrawFn) -> TokenCounter:
    fixed = FixedCounter(
        draw(st.integers(0, 3)),
        per_tool_call=draw(st.sampled_from([0, 2])),
        per_word=draw(st.sampled_from([0, 1])),
        priming=draw(st.sampled_from([0, 3])),
        per_tool_schema=draw(st.sampled_from([0, 4])),
    )
    kind = draw(st.sampled_from(["fixed", "fixed", "protocol", "protocol+tools", "subclass"]))
    if kind == "protocol":
        return ProtocolOnlyCounter(fixed)
    if kind == "protocol+tools":
        return ProtocolToolsCounter(fixed)
    if kind == "subclass":
        return WordsCounter(fixed.per_message)
    return fixed


@dataclass
class Case:
    messages: list[StoredMessage]
    counter: TokenCounter


@st.composite
def cases(draw: st.DrawFn) -> Case:
    msgs = draw(conversations())
    counter = draw(counters())
    # Stored counts come from the view's counter, or from another one (recounted).
    store_counter: TokenCounter = counter if draw(st.booleans()) else PER_MESSAGE
    t = T0
    start = draw(st.sampled_from([1, 1, 41]))  # a truncated conversation starts later
    out: list[StoredMessage] = []
    for i, m in enumerate(msgs):
        t += timedelta(seconds=draw(st.sampled_from([0, 0, 1, 30, 600, -20])))
        out.append(StoredMessage(
            **m.model_dump(exclude={"id"}), id=f"m{i}", conversation_id="conv", seq=start + i,
            created_at=t, token_count=store_counter.count_message(m),
            token_counter=store_counter.name,
        ))
    return Case(out, counter)


TOOLS = [{"type": "function", "function": {"name": "f"}}]


@st.composite
def budget_params(draw: st.DrawFn) -> dict[str, Any]:
    limit = draw(st.integers(1, 80))
    return {
        "token_limit": limit,
        "reserve": draw(st.integers(0, min(limit - 1, 6))),
        "tools": draw(st.sampled_from([None, TOOLS])),
    }


@st.composite
def views(draw: st.DrawFn) -> ContextView:
    kind = draw(st.sampled_from(["unbounded", "buffered", "headtail", "token", "token", "score",
                                 "score", "turns"]))
    if kind == "unbounded":
        return UnboundedView()
    start_on_user = draw(st.booleans())
    if kind == "buffered":
        return BufferedView(draw(st.integers(1, 8)), start_on_user=start_on_user)
    if kind == "headtail":
        role: Any = draw(st.sampled_from(["user", "user", "system"] if start_on_user
                                    else ["user", "user", "assistant"]))
        return HeadAndTailView(draw(st.integers(1, 6)), draw(st.integers(1, 6)),
                               placeholder_role=role, start_on_user=start_on_user)
    if kind == "token":
        return TokenLimitedView(**draw(budget_params()), start_on_user=start_on_user)
    if kind == "score":
        return ScoreBasedView(
            **draw(budget_params()),
            keep_rate=draw(st.sampled_from([0.0, 0.5, 0.9, 1.0])),
            half_life=draw(st.sampled_from([None, None, 1.0, 60.0])),
            fill_scan=draw(st.sampled_from([0, 1, 3, 64, None])),
            start_on_user=start_on_user,
        )
    return RecentTurnsView(draw(st.integers(1, 5)), remove_tool_messages=draw(st.booleans()),
                           start_on_user=start_on_user)


# ---- naive reference --------------------------------------------------------------------------

Unit = tuple[list[StoredMessage], bool]


def naive_units(msgs: Sequence[StoredMessage]) -> list[Unit]:
    """Units by the DESIGN rule, written out directly."""
    units: list[Unit] = []
    i = 0
    while i < len(msgs):
        m = msgs[i]
        if m.role == "assistant" and m.tool_calls:
            want = [c.id for c in m.tool_calls]
            got: dict[str, StoredMessage] = {}
            j = i + 1
            orphans = []
            while j < len(msgs) and msgs[j].role == "tool":
                t = msgs[j]
                if t.tool_call_id in want and t.tool_call_id not in got:
                    got[t.tool_call_id or ""] = t
                else:
                    orphans.append(t)
                j += 1
            members = [m, *sorted(got.values(), key=lambda x: x.seq)]
            units.append((members, len(got) == len(want)))
            units.extend(([o], False) for o in orphans)
            i = j
        else:
            units.append(([m], m.role != "tool"))
            i += 1
    return units


def is_anchored(unit: Unit) -> bool:
    return any(m.anchored for m in unit[0])


def tokens(unit: Unit, counter: TokenCounter) -> int:
    return sum(counter.count_message(m) for m in unit[0])


def seqs_of(units: Sequence[Unit]) -> set[int]:
    return {m.seq for u in units for m in u[0]}


@dataclass
class Expected:
    seqs: list[int]
    skipped: int = 0
    required: int | None = None  # set when a ContextBudgetError is expected


def starts_with_user(unit: Unit) -> bool:
    return unit[0][0].role == "user"


def trim_to_user(chronological: list[Unit]) -> list[Unit]:
    """start_on_user: drop the oldest units until one starts with a user message, never
    the newest (last)."""
    k = 0
    while k < len(chronological) - 1 and not starts_with_user(chronological[k]):
        k += 1
    return chronological[k:]


def oracle(view: ContextView, msgs: list[StoredMessage], counter: TokenCounter) -> Expected:
    units = naive_units(msgs)
    anchored = [u for u in units if u[1] and is_anchored(u)]
    others = [u for u in units if u[1] and not is_anchored(u)]  # chronological
    keep = seqs_of(anchored)
    if isinstance(view, UnboundedView):
        return Expected(sorted(seqs_of([u for u in units if u[1]])))
    if isinstance(view, (TokenLimitedView, ScoreBasedView)):
        fixed = counter_priming(counter) + view.reserve + count_tool_schemas(counter, view.tools)
        a_tok = sum(tokens(u, counter) for u in anchored)
        if not anchored and not others:
            return Expected([])
        n_tok = tokens(others[-1], counter) if others else 0
        required = a_tok + n_tok + fixed
        if required > view.token_limit:
            return Expected([], required=required)
        remaining = view.token_limit - required
        if not others:
            return Expected(sorted(keep))
        if isinstance(view, TokenLimitedView):
            kept = [others[-1]]
            for u in reversed(others[:-1]):
                if tokens(u, counter) > remaining:
                    break
                remaining -= tokens(u, counter)
                kept.append(u)
            if view.start_on_user:
                while len(kept) > 1 and kept[-1][0][0].role != "user":
                    kept.pop()
            return Expected(sorted(keep | seqs_of(kept)))
        picked = [others[-1], *naive_score_pick(view, msgs, others[:-1], counter, remaining)]
        if view.start_on_user:
            picked = trim_to_user(sorted(picked, key=lambda u: u[0][0].seq))
        return Expected(sorted(keep | seqs_of(picked)))
    if isinstance(view, BufferedView):
        kept, count = [], 0
        for u in reversed(others):
            if kept and count + len(u[0]) > view.buffer_size:
                break
            kept.append(u)
            count += len(u[0])
        if view.start_on_user:
            kept = trim_to_user(kept[::-1])
        return Expected(sorted(keep | seqs_of(kept)))
    if isinstance(view, RecentTurnsView):
        user_turns = [i for i, u in enumerate(others) if u[0][0].role == "user"]
        if len(user_turns) > view.max_turns:  # start at the max_turns-th newest user turn
            kept = list(reversed(others[user_turns[-view.max_turns]:]))
        else:  # no more turns than max_turns: nothing is trimmed
            kept = list(reversed(others))
        if view.remove_tool_messages:
            kept = kept[:1] + [u for u in kept[1:] if not u[0][0].tool_calls]
        if view.start_on_user:
            kept = trim_to_user(kept[::-1])
        return Expected(sorted(keep | seqs_of(kept)))
    assert isinstance(view, HeadAndTailView)
    head, count, refused = [], 0, None
    for u in others:
        if count + len(u[0]) > view.head_size:
            refused = u
            break
        head.append(u)
        count += len(u[0])
    if refused is None:
        if view.start_on_user:
            head = trim_to_user(head)
        return Expected(sorted(keep | seqs_of(head)))
    floor = refused[0][0].seq
    tail: list[Unit] = []
    count = 0
    for u in reversed([u for u in others if u[0][0].seq >= floor]):
        if tail and count + len(u[0]) > view.tail_size:
            break
        tail.append(u)
        count += len(u[0])
    tail.reverse()  # chronological

    def gap(head: list[Unit], tail: list[Unit]) -> int:
        # N: every stored message between the last head unit and the first tail unit
        # that the window does not hold (incomplete units included).
        window = keep | seqs_of(head) | seqs_of(tail)
        head_end = max(seqs_of(head), default=msgs[0].seq - 1)
        tail_first = min(m.seq for m in tail[0][0])
        return sum(1 for s in range(head_end + 1, tail_first) if s not in window)

    if view.start_on_user:
        while head and not starts_with_user(head[0]):
            head = head[1:]
        # With no head, a user placeholder (there is one when N > 0) is the first turn;
        # a system one is not a turn, so the tail must start with a user message.
        if not head and (view.placeholder_role != "user" or gap(head, tail) == 0):
            tail = trim_to_user(tail)
    return Expected(sorted(keep | seqs_of(head) | seqs_of(tail)), skipped=gap(head, tail))


def naive_score_pick(view: ScoreBasedView, msgs: list[StoredMessage], candidates: list[Unit],
                     counter: TokenCounter, remaining: int) -> list[Unit]:
    score: dict[int, float] = {}
    j = 0
    newest = msgs[-1].created_at
    earliest = None
    for m in reversed(msgs):
        if m.anchored:
            continue
        j += 1
        if view.half_life is None:
            score[m.seq] = m.score * view.keep_rate ** j
        else:
            earliest = m.created_at if earliest is None else min(earliest, m.created_at)
            age = max(0.0, (newest - earliest).total_seconds())
            score[m.seq] = m.score * 0.5 ** (age / view.half_life)

    def key(u: Unit) -> tuple[float, int]:
        return (-max(score[m.seq] for m in u[0]), -u[0][-1].seq)

    picked: list[Unit] = []
    skipped_once, examined = False, 0
    if remaining == 0:
        return picked
    for u in sorted(candidates, key=key):
        if skipped_once and view.fill_scan is not None and examined >= view.fill_scan:
            break
        if skipped_once:
            examined += 1
        if tokens(u, counter) <= remaining:
            picked.append(u)
            remaining -= tokens(u, counter)
            if remaining == 0:
                break
        else:
            skipped_once = True
    return picked


# ---- invariants --------------------------------------------------------------------------------

def assert_provider_valid(window: ContextWindow) -> None:
    """Every tool message follows its call; every call is answered, once per id."""
    out = window.to_openai()
    i = 0
    while i < len(out):
        m = out[i]
        assert m["role"] != "tool", f"orphan tool message at {i}: {out}"
        if m.get("tool_calls"):
            want = sorted(c["id"] for c in m["tool_calls"])
            j = i + 1
            got = []
            while j < len(out) and out[j]["role"] == "tool":
                got.append(out[j]["tool_call_id"])
                j += 1
            assert sorted(got) == want, f"call at {i} answered by {got}, wants {want}"
            i = j
        else:
            i += 1


def assert_starts_on_user(window: ContextWindow, msgs: list[StoredMessage]) -> None:
    """start_on_user: the window's first turn is a user message, unless the newest unit
    is the only non-anchored unit kept. Anchored units and system/developer messages (a
    placeholder of those roles included) are not turns."""
    units = [u for u in naive_units(msgs) if u[1]]
    anchored = seqs_of([u for u in units if is_anchored(u)])
    turns = [m for m in window.messages
             if not (isinstance(m, StoredMessage) and m.seq in anchored)
             and m.role not in ("system", "developer")]
    if not turns or turns[0].role == "user":
        return
    kept = {m.seq for m in turns if isinstance(m, StoredMessage)}
    assert len(turns) == len(kept), "only stored messages, no placeholder, lead"
    assert [u for u in units if seqs_of([u]) & kept] == [u for u in units
                                                          if not is_anchored(u)][-1:]


def select(view: ContextView, msgs: list[StoredMessage], counter: TokenCounter
           ) -> ContextWindow | ContextBudgetError:
    try:
        return view.select(ListHistory(msgs), counter)
    except ContextBudgetError as exc:
        return exc


def check(view: ContextView, case: Case) -> ContextWindow | None:
    msgs, counter = case.messages, case.counter
    if getattr(view, "tools", None) and not callable(getattr(counter, "count_tools", None)):
        # A counter without count_tools cannot serve tools=: a clear error, every time.
        with pytest.raises(ConfigurationError, match="no count_tools method"):
            view.select(ListHistory(msgs), counter)
        return None
    before = [m.model_dump() for m in msgs]
    result = select(view, msgs, counter)
    assert [m.model_dump() for m in msgs] == before, "the source changed"
    expected = oracle(view, msgs, counter)
    if isinstance(result, ContextBudgetError):
        assert expected.required is not None, f"unexpected {result}"
        assert result.required == expected.required
        assert result.budget == getattr(view, "token_limit", None)
        return None
    assert expected.required is None, "expected a ContextBudgetError"
    w = result
    # determinism
    assert select(view, msgs, counter) == w
    # chronological, stored messages only once
    assert w.seqs == sorted(set(w.seqs))
    assert_provider_valid(w)
    # matches the naive reference
    assert w.seqs == expected.seqs, (w.seqs, expected.seqs)
    assert w.report.skipped == expected.skipped
    # token count is the whole list as the provider counts it
    assert w.token_count == (counter.count_messages(w.messages) if w.messages else 0)
    limit = getattr(view, "token_limit", None)
    if limit is not None and w.messages:  # an empty window is never an error
        tools = getattr(view, "tools", None)
        extra = view.reserve + count_tool_schemas(counter, tools)  # type: ignore[attr-defined]
        assert w.token_count + extra <= limit
        assert w.budget == limit
    if getattr(view, "start_on_user", False):
        assert_starts_on_user(w, msgs)
    # anchored units and the newest unit are kept; incomplete units never
    units = naive_units(msgs)
    kept = set(w.seqs)
    assert seqs_of([u for u in units if u[1] and is_anchored(u)]) <= kept
    others = [u for u in units if u[1] and not is_anchored(u)]
    if others:
        assert seqs_of(others[-1:]) <= kept
    assert not seqs_of([u for u in units if not u[1]]) & kept
    # report accounts for every stored message exactly once
    report = w.report
    assert report.included_count == len(w.seqs)
    assert report.included_count + report.omitted_count == len(msgs)
    assert not set(report.omitted_seqs()) & kept
    assert report.rows_read <= len(msgs) * 3 + 8
    # placeholder
    placeholders = [i for i, m in enumerate(w.messages) if not isinstance(m, StoredMessage)]
    if not isinstance(view, HeadAndTailView) or report.skipped == 0:
        assert placeholders == []
    else:
        assert len(placeholders) == 1
        p = placeholders[0]
        ph = w.messages[p]
        assert ph.metadata == {"memstore": {"placeholder": True, "skipped": report.skipped}}
        word = "message" if report.skipped == 1 else "messages"
        assert ph.text == f"Skipped {report.skipped} {word}."
        # N == stored messages between the head and the tail that are not in the window
        anchored_seqs = seqs_of([u for u in units if u[1] and is_anchored(u)])
        head_last = next((m.seq for m in reversed(w.messages[:p])
                          if isinstance(m, StoredMessage) and m.seq not in anchored_seqs),
                         msgs[0].seq - 1)
        tail_first = next(m.seq for m in w.messages[p + 1:]
                          if isinstance(m, StoredMessage) and m.seq not in anchored_seqs)
        between = [s for s in range(head_last + 1, tail_first) if s not in kept]
        assert report.skipped == len(between) > 0
    return w


# ---- the properties ----------------------------------------------------------------------------

@PROPS
@given(case=cases(), view=views())
def test_every_view_against_invariants_and_oracle(case: Case, view: ContextView) -> None:
    check(view, case)


@PROPS
@given(case=cases(), data=st.data())
def test_all_views_on_the_same_conversation(case: Case, data: st.DataObject) -> None:
    for view in (UnboundedView(), BufferedView(data.draw(st.integers(1, 6))),
                 HeadAndTailView(data.draw(st.integers(1, 4)), data.draw(st.integers(1, 4))),
                 RecentTurnsView(data.draw(st.integers(1, 4)))):
        check(view, case)


@PROPS
@given(case=cases(), params=budget_params(), extra=st.integers(1, 40),
       start_on_user=st.booleans())
def test_token_limited_is_monotone_in_budget(case: Case, params: dict[str, Any], extra: int,
                                             start_on_user: bool) -> None:
    small = check(TokenLimitedView(**params, start_on_user=start_on_user), case)
    params = {**params, "token_limit": params["token_limit"] + extra}
    large = check(TokenLimitedView(**params, start_on_user=start_on_user), case)
    if small is not None:
        assert large is not None
        assert set(small.seqs) <= set(large.seqs)


@PROPS
@given(case=cases(), params=budget_params(), keep_rate=st.sampled_from([0.5, 0.9, 1.0]),
       half_life=st.sampled_from([None, 5.0]), fill_scan=st.sampled_from([0, 2, None]))
def test_score_based_never_exceeds_budget_and_keeps_best(
    case: Case, params: dict[str, Any], keep_rate: float, half_life: float | None,
    fill_scan: int | None,
) -> None:
    check(ScoreBasedView(**params, keep_rate=keep_rate, half_life=half_life,
                         fill_scan=fill_scan), case)


@PROPS
@given(case=cases(), page=st.integers(1, 6))
def test_incremental_grouping_matches_whole_list(case: Case, page: int) -> None:
    msgs = case.messages
    expected = sorted((u.seqs, u.complete) for u in group_units(msgs))
    naive = sorted((tuple(m.seq for m in ms), ok) for ms, ok in naive_units(msgs))
    assert expected == naive
    backward = BackwardUnits(ReverseReader(ListHistory(msgs), first_page=page, max_page=page))
    assert sorted((u.seqs, u.complete) for u in backward) == expected
    forward = ForwardUnits(ForwardReader(ListHistory(msgs), first_page=page, max_page=page))
    assert sorted((u.seqs, u.complete) for u in forward) == expected


def test_oracle_sanity() -> None:
    # The oracle is a real selection: it keeps units whole and stops where the rules say.
    msgs = stored([U("u1"), CALL("a"), RES("a"), U("u2")])
    assert oracle(BufferedView(1), msgs, PER_MESSAGE).seqs == [4]
    assert oracle(BufferedView(3), msgs, PER_MESSAGE).seqs == [2, 3, 4]
    assert oracle(TokenLimitedView(2), msgs, PER_MESSAGE).seqs == [4]
