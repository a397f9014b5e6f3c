"""A model-based (hypothesis stateful) test of ``MemoryStore``, on SQLite and PostgreSQL.

A :class:`~hypothesis.stateful.RuleBasedStateMachine` drives two conversations through
random sequences of ``append``, ``extend`` (with tool units, client ids and re-sent ids),
``pop``, ``truncate``, ``clear``, ``set_score``, ``pin``/``unpin``, ``rewrite``,
``save_state``/``dump_state`` then ``load_state`` (into the same conversation and into
the other one), ``delete_conversation``, ``summarize`` and the reads, and keeps a pure
Python model of what each conversation must hold: every message as it was written,
with its seq, id, timestamp, score, pin and token count, and the stored summaries.

Two stores share one database: ``cached`` has the default row cache, ``plain`` has
``cache_size=0`` (it stands for another process). Each write is made by one of them,
chosen at random. After every step the test checks that:

* both stores read exactly the model's messages (every field, seqs contiguous and
  increasing), summaries and conversation totals (``message_count``, ``token_count``,
  ``count_tokens``);
* for every view (token-limited with a small and a large budget, buffered, head and
  tail, score-based, recent turns, unbounded, summary), the caching store's window,
  the uncached store's window and ``view.apply`` over the stored messages (with the
  stored summaries for ``SummaryView``) are the same window, or raise the same
  ``ContextBudgetError``; unbounded, token-limited and buffered windows also equal an
  independent selection computed from the model;
* every window holds whole complete units only (no orphan result, no call without all
  its results), every anchored complete unit and the newest complete unit, stays
  within its budget, and counts its tokens as ``counter.count_messages`` does;
* reading windows changes nothing stored.

Examples are derandomized and small (a handful of messages per conversation) so that the
file runs in well under a minute on both databases; every example uses fresh
conversation ids and deletes them at the end.
"""

from __future__ import annotations

import dataclasses
import functools
import io
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any, Literal

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from memstore import (
    BufferedView,
    ConflictError,
    ContextBudgetError,
    ContextView,
    ConversationNotFoundError,
    HeadAndTailView,
    InvalidInputError,
    MemoryStore,
    Message,
    MessageNotFoundError,
    RecentTurnsView,
    ScoreBasedView,
    StoredMessage,
    Summary,
    SummaryView,
    TextPart,
    TokenLimitedView,
    ToolCall,
    UnboundedView,
)
from memstore.tokens import FixedCounter, TokenCounter
from memstore.views.window import ContextWindow
from tests.helpers import examples

COUNTER = FixedCounter(per_message=3, per_word=1, per_tool_call=2, priming=3)
#: A second counter: views and summaries that name it recount what they read.
OTHER = FixedCounter(per_message=2, per_word=2, priming=1)
#: Rows the ``small`` store caches: fewer than a conversation often holds.
SMALL_CACHE = 6

VIEWS: list[ContextView] = [
    UnboundedView(),
    TokenLimitedView(token_limit=40),
    TokenLimitedView(token_limit=400),
    TokenLimitedView(token_limit=70, reserve=6, start_on_user=True),
    BufferedView(buffer_size=3),
    HeadAndTailView(head_size=2, tail_size=3),
    ScoreBasedView(token_limit=50, keep_rate=0.8),
    ScoreBasedView(token_limit=80, half_life=0.05),
    RecentTurnsView(max_turns=2),
    RecentTurnsView(max_turns=1, remove_tool_messages=True),
    SummaryView(token_limit=45),
    SummaryView(token_limit=400),
    TokenLimitedView(token_limit=90, counter=OTHER),
    ScoreBasedView(token_limit=70, keep_rate=1.0, fill_scan=1),
    SummaryView(token_limit=120, reserve=4, counter=OTHER),
]

SETTINGS = settings(
    derandomize=True,
    database=None,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much,
                           HealthCheck.data_too_large],
)
#: Examples per database: a PostgreSQL statement is a round trip, so fewer there (the
#: file then runs in about 30 s on a 2-core machine, both databases together).
EXAMPLES = {"sqlite": examples(20), "postgresql": examples(10)}

#: Slack for comparing the model's clock readings with the store's timestamps.
CLOCK_SLACK = timedelta(seconds=2)

# ---- the model --------------------------------------------------------------------------

Content = str | tuple[str, ...] | None  # a tuple: text parts


@dataclass(frozen=True)
class Spec:
    """A message as the caller writes it."""

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Content
    name: str | None = None
    tool_calls: tuple[tuple[str, str, str], ...] = ()
    tool_call_id: str | None = None
    score: float = 1.0
    pinned: bool = False
    metadata: tuple[tuple[str, Any], ...] = ()
    id: str | None = None

    def message(self) -> Message:
        content: Any = self.content
        if isinstance(content, tuple):
            content = [TextPart(text=t) for t in content]
        return Message(
            role=self.role, content=content, name=self.name,
            tool_calls=[ToolCall(id=i, name=n, arguments=a) for i, n, a in self.tool_calls]
            or None,
            tool_call_id=self.tool_call_id, score=self.score, pinned=self.pinned,
            metadata=dict(self.metadata), id=self.id,
        )

    def same_content(self, other: Spec) -> bool:
        """The idempotency comparison (score, pin and id aside)."""
        return ((self.role, self.content, self.name, self.tool_calls, self.tool_call_id,
                 dict(self.metadata))
                == (other.role, other.content, other.name, other.tool_calls,
                    other.tool_call_id, dict(other.metadata)))

    @property
    def tokens(self) -> int:
        return COUNTER.count_message(self.message())


@dataclass(frozen=True)
class Row:
    """A stored message as the model expects it."""

    spec: Spec  # its ``id`` is the stored id (client or store-assigned)
    seq: int
    created_at: datetime
    token_count: int

    @property
    def id(self) -> str:
        assert self.spec.id is not None
        return self.spec.id

    @property
    def anchored(self) -> bool:
        return self.spec.pinned or self.spec.role in ("system", "developer")

    def at(self, seq: int) -> Row:
        return dataclasses.replace(self, seq=seq)


@dataclass(frozen=True)
class SummaryRow:
    number: int
    first_seq: int
    last_seq: int
    text: str
    token_count: int
    created_at: datetime
    counter: str = COUNTER.name


@dataclass
class Conv:
    """One conversation of the model."""

    id: str
    exists: bool = False
    first: int = 1  # the seq of the oldest message; of the next one when empty
    rows: list[Row] = field(default_factory=list)
    summaries: list[SummaryRow] = field(default_factory=list)
    metadata: dict[str, Any] = field(default_factory=dict)  # the conversation's own
    created_at: datetime | None = None  # as first read back

    @property
    def last(self) -> int:
        return self.first + len(self.rows) - 1

    def ids(self) -> dict[str, Row]:
        return {r.id: r for r in self.rows}

    def reset(self) -> None:
        self.exists, self.first, self.rows, self.summaries = False, 1, [], []
        self.metadata, self.created_at = {}, None


def spec_of(m: Message) -> Spec:
    """The Spec of a message read from the store."""
    content: Content
    if isinstance(m.content, list):
        content = tuple(p.text for p in m.content if isinstance(p, TextPart))
    else:
        content = m.content
    return Spec(
        role=m.role, content=content, name=m.name,
        tool_calls=tuple((c.id, c.name, c.arguments) for c in m.tool_calls or ()),
        tool_call_id=m.tool_call_id, score=m.score, pinned=m.pinned,
        metadata=tuple(sorted(dict(m.metadata).items())), id=m.id,
    )


def observed(m: StoredMessage) -> tuple[Any, ...]:
    return (m.seq, spec_of(m), m.created_at, m.token_count, m.token_counter)


def expected(r: Row) -> tuple[Any, ...]:
    return (r.seq, r.spec, r.created_at, r.token_count, COUNTER.name)


def observed_summary(s: Summary) -> tuple[Any, ...]:
    return (s.number, s.first_seq, s.last_seq, s.text, s.token_count, s.token_counter,
            s.created_at)


def expected_summary(s: SummaryRow) -> tuple[Any, ...]:
    return (s.number, s.first_seq, s.last_seq, s.text, s.token_count, s.counter,
            s.created_at)


# ---- units, as docs/concepts.md and docs/views.md define them -----------------------------


@dataclass(frozen=True)
class Unit:
    rows: tuple[Row, ...]
    complete: bool

    @property
    def seqs(self) -> frozenset[int]:
        return frozenset(r.seq for r in self.rows)

    @property
    def anchored(self) -> bool:
        return any(r.anchored for r in self.rows)

    @property
    def tokens(self) -> int:
        return sum(r.token_count for r in self.rows)

    def tokens_by(self, counter: TokenCounter) -> int:
        """Stored counts when they are ``counter``'s, else counted again (docs/views.md,
        "Counters")."""
        if counter.name == COUNTER.name:
            return self.tokens
        return sum(counter.count_message(r.spec.message()) for r in self.rows)

    @property
    def last_seq(self) -> int:
        return max(r.seq for r in self.rows)


def units_of(rows: Sequence[Row]) -> list[Unit]:
    """An assistant call and the first result to each of its ids among the tool messages
    right after it form a unit, complete when every id is answered; every other tool
    message is an orphan (incomplete); any other message is a unit of its own."""
    out: list[Unit] = []
    i = 0
    while i < len(rows):
        r = rows[i]
        if r.spec.role == "tool":
            out.append(Unit((r,), False))
            i += 1
            continue
        if not r.spec.tool_calls:
            out.append(Unit((r,), True))
            i += 1
            continue
        wanted = {c[0] for c in r.spec.tool_calls}
        members, orphans, answered = [r], [], set()
        i += 1
        while i < len(rows) and rows[i].spec.role == "tool":
            t = rows[i]
            if t.spec.tool_call_id in wanted and t.spec.tool_call_id not in answered:
                answered.add(t.spec.tool_call_id)
                members.append(t)
            else:
                orphans.append(Unit((t,), False))
            i += 1
        out.append(Unit(tuple(members), answered == wanted))
        out.extend(orphans)
    return out


# ---- strategies -------------------------------------------------------------------------

WORDS = ["alpha", "beta", "gamma", "order", "ship", "refund", "ok", "why"]
TEXT = st.lists(st.sampled_from(WORDS), min_size=1, max_size=6).map(" ".join)
SCORES = st.sampled_from([1.0, 1.0, 0.0, 0.5, 2.0, 5.0])
METADATA = st.sampled_from([(), (), (("k", 1),), (("n", (1, 2)), ("tag", "x"))]).map(
    lambda items: tuple((k, list(v) if isinstance(v, tuple) else v) for k, v in items))
CLIENT_IDS = st.sampled_from([None, None, None, "k0", "k1", "k2", "k3"])


@st.composite
def plain_specs(draw: st.DrawFn) -> Spec:
    """A message that is not part of a tool unit."""
    role: Literal["system", "developer", "user", "assistant"] = draw(st.sampled_from(
        ["user", "user", "user", "assistant", "assistant", "system", "developer"]))
    content: Content = draw(TEXT)
    if role == "user" and draw(st.integers(0, 5)) == 0:
        content = tuple(draw(st.lists(TEXT, min_size=1, max_size=2)))
    return Spec(role=role, content=content, name=draw(st.sampled_from([None, None, "ann"])),
                score=draw(SCORES), pinned=draw(st.integers(0, 7)) == 0,
                metadata=draw(METADATA), id=draw(CLIENT_IDS))


@dataclass(frozen=True)
class ToolShape:
    """An assistant call with ``calls`` ids and the results it gets (built with fresh ids)."""

    calls: int
    answered: tuple[int, ...]  # indexes of the calls answered, in answer order
    duplicate: bool  # answer the first answered id twice
    orphan: bool  # add a result to an id that no call made
    pinned_result: bool
    score: float
    text: str


@st.composite
def tool_shapes(draw: st.DrawFn) -> ToolShape:
    calls = draw(st.integers(1, 2))
    order = draw(st.permutations(range(calls)))
    answered = tuple(order[:draw(st.sampled_from([calls, calls, calls, max(0, calls - 1)]))])
    return ToolShape(calls=calls, answered=answered,
                     duplicate=bool(answered) and draw(st.integers(0, 5)) == 0,
                     orphan=draw(st.integers(0, 5)) == 0,
                     pinned_result=draw(st.integers(0, 6)) == 0,
                     score=draw(SCORES), text=draw(TEXT))


Item = Spec | ToolShape
ITEMS: st.SearchStrategy[Item] = st.one_of(plain_specs(), plain_specs(), tool_shapes())

VIEW_INDEXES = st.integers(0, len(VIEWS) - 1)


def bulk_items(n: int, pattern: int) -> list[Item]:
    """``n`` items without hypothesis draws: turns, tool units (every seventh), a system
    message and a pinned one now and then, scores 0.5 to 2."""
    items: list[Item] = []
    for k in range(n):
        words = " ".join(WORDS[(k * 3 + j) % len(WORDS)] for j in range(1 + (k + pattern) % 5))
        if (k + pattern) % 7 == 3:
            items.append(ToolShape(calls=1 + k % 2, answered=tuple(range(1 + k % 2)),
                                   duplicate=False, orphan=False, pinned_result=False,
                                   score=1.0, text=words))
        else:
            role: Literal["user", "assistant", "system"] = (
                "system" if k == 0 and pattern % 3 == 0 else ("user", "assistant")[k % 2])
            items.append(Spec(role=role, content=words, score=(1.0, 2.0, 0.5)[k % 3],
                              pinned=k == 2 * pattern + 1))
    return items


# ---- rewrite functions ------------------------------------------------------------------

RewriteOp = tuple[Any, ...]


@st.composite
def rewrite_ops(draw: st.DrawFn) -> list[RewriteOp]:
    ops: list[RewriteOp] = []
    for _ in range(draw(st.integers(1, 2))):
        kind = draw(st.sampled_from(["same", "drop", "edit", "score", "pin", "swap", "append",
                                     "replace", "reissue", "steal", "repeat"]))
        ops.append((kind, draw(st.integers(0, 1000)), draw(st.integers(0, 1000)),
                    draw(TEXT), draw(SCORES), draw(st.booleans())))
    return ops


class NewMessage:
    """A plain :class:`Message` in a rewrite's result (a new message, stored at the time
    of the rewrite)."""

    def __init__(self, spec: Spec) -> None:
        self.spec = spec


RewriteItem = Row | NewMessage


def apply_ops(items: list[Any], ops: list[RewriteOp], older_ids: list[str],
              fresh_ids: list[str], make_new: Callable[[Spec], Any],
              edit: Callable[[Any, dict[str, Any]], Any],
              spec_of_item: Callable[[Any], Spec]) -> tuple[list[Any], str | None]:
    """Apply ``ops`` to ``items`` (StoredMessages in the store's fn, Rows in the model).

    Returns the result and, when the store must refuse it, why: ``"steal"`` (an id of a
    message the rewrite does not replace: ConflictError) or ``"repeat"`` (one id twice:
    InvalidInputError).
    """
    out = list(items)
    for k, (kind, i, j, text, score, flag) in enumerate(ops):
        new_id = fresh_ids[k] if flag else None
        n = len(out)
        if kind == "append" or (n == 0 and kind != "steal"):
            out.append(make_new(Spec(role="user", content=text, id=new_id)))
            continue
        if kind == "steal":
            if older_ids:
                out.append(make_new(Spec(role="user", content=text,
                                         id=older_ids[i % len(older_ids)])))
                return out, "steal"
            continue
        i %= n
        j %= n
        if kind == "drop":
            del out[i]
        elif kind == "edit":
            out[i] = edit(out[i], {"content": text})
        elif kind == "score":
            out[i] = edit(out[i], {"score": score})
        elif kind == "pin":
            out[i] = edit(out[i], {"pinned": not spec_of_item(out[i]).pinned})
        elif kind == "swap":
            out[i], out[j] = out[j], out[i]
        elif kind == "replace":
            out[i] = make_new(Spec(role="assistant", content=text, id=new_id))
        elif kind == "reissue":  # the same id and content, as a plain Message
            out[i] = make_new(spec_of_item(out[i]))
        elif kind == "repeat":
            out.append(out[i])
            if spec_of_item(out[i]).id is not None:
                return out, "repeat"
    return out, None


# ---- the machine ------------------------------------------------------------------------


@dataclass
class Env:
    """The stores on one database: ``cached`` (the default row cache), ``plain``
    (``cache_size=0``: another process) and ``small`` (a cache smaller than one
    conversation, which keeps the anchored and the newest rows)."""

    cached: MemoryStore
    plain: MemoryStore
    small: MemoryStore

    @property
    def stores(self) -> tuple[MemoryStore, MemoryStore, MemoryStore]:
        return (self.cached, self.plain, self.small)


class StoreModel(RuleBasedStateMachine):
    """Two conversations, two stores on one database, one model."""

    def __init__(self, env: Env) -> None:
        super().__init__()
        self.env = env
        tag = uuid.uuid4().hex[:12]
        self.convs = [Conv(f"model-{tag}-a"), Conv(f"model-{tag}-b")]
        self.serial = 0
        # Conversations a step touched get every check; the others a cheap one.
        self.touched = {conv.id for conv in self.convs}
        self.checks = 0

    # ---- helpers --------------------------------------------------------------------

    def next_id(self, prefix: str) -> str:
        self.serial += 1
        return f"{prefix}{self.serial}"

    def conv(self, data: st.DataObject) -> Conv:
        return self.touch(self.convs[data.draw(st.integers(0, 1), label="conversation")])

    def touch(self, conv: Conv) -> Conv:
        self.touched.add(conv.id)
        return conv

    def writer(self, data: st.DataObject) -> MemoryStore:
        index = data.draw(st.sampled_from([0, 1, 2]), label="writer: cached, plain, small")
        return self.env.stores[index]

    def build(self, items: Sequence[Item]) -> list[Spec]:
        """Specs of ``items``, tool shapes expanded with fresh call ids."""
        out: list[Spec] = []
        for item in items:
            if isinstance(item, Spec):
                out.append(item)
                continue
            ids = [self.next_id("call") for _ in range(item.calls)]
            out.append(Spec(role="assistant", content=None,
                            tool_calls=tuple((i, "lookup", f'{{"q": {n}}}')
                                             for n, i in enumerate(ids)),
                            score=item.score))
            results = [Spec(role="tool", content=f"{item.text} {n}", tool_call_id=ids[n],
                            pinned=item.pinned_result and k == 0)
                       for k, n in enumerate(item.answered)]
            if item.duplicate:
                results.insert(1, Spec(role="tool", content="again",
                                       tool_call_id=ids[item.answered[0]]))
            if item.orphan:
                results.append(Spec(role="tool", content="stray",
                                    tool_call_id=self.next_id("ghost")))
            out.extend(results)
        return out

    @staticmethod
    def now() -> datetime:
        return datetime.now(timezone.utc)

    @staticmethod
    def check_time(stamp: datetime, before: datetime, after: datetime) -> None:
        assert before - CLOCK_SLACK <= stamp <= after + CLOCK_SLACK, (stamp, before, after)

    @staticmethod
    def extend_plan(conv: Conv, specs: Sequence[Spec]) -> tuple[list[Row | int], list[Spec]] | None:
        """How ``extend`` handles ``specs`` (docs/concepts.md, "Idempotency").

        Returns, per spec, the stored row it returns (an id already stored, same content)
        or the index of the new message it stores, and the new messages; ``None`` when
        it raises ConflictError (an id stored, or repeated in the batch, with other
        content) and writes nothing.
        """
        stored = conv.ids() if conv.exists else {}
        first_with_id: dict[str, int] = {}
        plan: list[Row | int] = []
        fresh: list[Spec] = []
        for spec in specs:
            if spec.id is not None and spec.id in stored:
                prior = stored[spec.id]
                if not prior.spec.same_content(spec):
                    return None
                plan.append(prior)
            elif spec.id is not None and spec.id in first_with_id:
                j = first_with_id[spec.id]
                if not fresh[j].same_content(spec):
                    return None
                plan.append(j)
            else:
                if spec.id is not None:
                    first_with_id[spec.id] = len(fresh)
                plan.append(len(fresh))
                fresh.append(spec)
        return plan, fresh

    def write_messages(self, conv: Conv, specs: list[Spec], store: MemoryStore,
                       single: bool) -> None:
        """``append`` (one spec) or ``extend``, checked against the model."""
        planned = self.extend_plan(conv, specs)
        before = self.now()
        if planned is None:
            with pytest.raises(ConflictError):
                if single:
                    store.append(conv.id, specs[0].message())
                else:
                    store.extend(conv.id, [s.message() for s in specs])
            return
        if single:
            assert len(specs) == 1
            got = [store.append(conv.id, specs[0].message())]
        else:
            got = store.extend(conv.id, [s.message() for s in specs])
        after = self.now()
        plan, fresh = planned
        assert len(got) == len(specs)
        if not conv.exists:
            conv.exists, conv.first, conv.rows = True, 1, []
        start = conv.last + 1
        new_rows: list[Row] = []
        for k, spec in enumerate(fresh):
            stored_as = got[plan.index(k)]
            if spec.id is None:
                assert stored_as.id not in conv.ids()
            new_rows.append(Row(dataclasses.replace(spec, id=stored_as.id), start + k,
                                stored_as.created_at, spec.tokens))
            self.check_time(stored_as.created_at, before, after)
        want = [p if isinstance(p, Row) else new_rows[p] for p in plan]
        assert [observed(m) for m in got] == [expected(r) for r in want]
        conv.rows += new_rows

    def seq(self, data: st.DataObject, conv: Conv) -> int:
        """A stored message's seq, or now and then one next to the stored range."""
        if conv.rows and data.draw(st.integers(0, 5), label="stray seq") < 5:
            return data.draw(st.sampled_from(conv.rows), label="message").seq
        return conv.first + data.draw(st.integers(-1, len(conv.rows)), label="offset")

    @staticmethod
    def missing(conv: Conv, call: Callable[[], Any]) -> bool:
        """True when ``conv`` does not exist, after checking that ``call`` says so."""
        if conv.exists:
            return False
        with pytest.raises(ConversationNotFoundError):
            call()
        return True

    @staticmethod
    def rarely(data: st.DataObject) -> bool:
        """True about one time in five (rules that would empty most examples)."""
        return data.draw(st.integers(0, 4), label="this time") == 1

    # ---- writes -----------------------------------------------------------------------

    @initialize(data=st.data(), first=st.lists(ITEMS, min_size=1, max_size=5),
                second=st.lists(ITEMS, max_size=4), bulk=st.integers(0, 12),
                pattern=st.integers(0, 6), summarize=st.booleans())
    def seed(self, data: st.DataObject, first: list[Item], second: list[Item], bulk: int,
             pattern: int, summarize: bool) -> None:
        """Both conversations start with messages; the first one often with a summary."""
        first = [*bulk_items(bulk, pattern), *first]
        for conv, items in zip(self.convs, (first, second)):
            if items:
                self.write_messages(conv, self.build(items), self.writer(data), single=False)
        if summarize:
            self.summarize_with(self.convs[0], self.writer(data), keep=bulk % 3 * 10,
                                as_message=False, counter=COUNTER)

    @rule(data=st.data(), item=ITEMS)
    def append(self, data: st.DataObject, item: Item) -> None:
        conv = self.conv(data)
        specs = self.build([item])
        self.write_messages(conv, specs, self.writer(data), single=len(specs) == 1)

    @rule(data=st.data(), items=st.lists(ITEMS, min_size=1, max_size=4))
    def extend(self, data: st.DataObject, items: list[Item]) -> None:
        conv = self.conv(data)
        self.write_messages(conv, self.build(items)[:8], self.writer(data), single=False)

    @rule(data=st.data(), n=st.integers(6, 24), pattern=st.integers(0, 6))
    def extend_many(self, data: st.DataObject, n: int, pattern: int) -> None:
        """A long batch (windows then read over several pages)."""
        conv = self.conv(data)
        self.write_messages(conv, self.build(bulk_items(n, pattern)), self.writer(data),
                            single=False)

    @precondition(lambda self: any(c.rows for c in self.convs))
    @rule(data=st.data())
    def resend(self, data: st.DataObject) -> None:
        """Send a stored message's id again: same content (score and pin may differ) is
        idempotent, other content is a ConflictError."""
        conv = self.touch(data.draw(st.sampled_from([c for c in self.convs if c.rows]),
                                    label="conv"))
        row = data.draw(st.sampled_from(conv.rows), label="row")
        spec = dataclasses.replace(row.spec, score=data.draw(SCORES),
                                   pinned=data.draw(st.booleans()))
        if data.draw(st.integers(0, 4), label="other content") == 4:
            spec = dataclasses.replace(spec, metadata=(("changed", True),))
        specs = [spec]
        if data.draw(st.booleans(), label="with new messages"):
            specs.insert(data.draw(st.integers(0, 1)), data.draw(plain_specs()))
        if data.draw(st.booleans(), label="twice in the batch"):
            specs.append(spec)
        self.write_messages(conv, specs, self.writer(data), single=len(specs) == 1)

    @precondition(lambda self: any(self.pending(c) for c in self.convs))
    @rule(data=st.data())
    def answer_pending(self, data: st.DataObject) -> None:
        """Append a result to a call at the end that is still waiting for it."""
        conv = self.touch(data.draw(st.sampled_from([c for c in self.convs if self.pending(c)])))
        call_id = data.draw(st.sampled_from(self.pending(conv)), label="call id")
        spec = Spec(role="tool", content=f"result {call_id}", tool_call_id=call_id)
        self.write_messages(conv, [spec], self.writer(data), single=True)

    @staticmethod
    def pending(conv: Conv) -> list[str]:
        """Unanswered call ids of the run at the end of ``conv``."""
        if not conv.exists:
            return []
        answered: set[str] = set()
        for r in reversed(conv.rows):
            if r.spec.role == "tool":
                answered.add(r.spec.tool_call_id or "")
                continue
            return sorted({c[0] for c in r.spec.tool_calls} - answered)
        return []

    @rule(data=st.data(), n=st.integers(0, 6))
    def pop(self, data: st.DataObject, n: int) -> None:
        conv = self.conv(data)
        store = self.writer(data)
        if self.missing(conv, lambda: store.pop(conv.id, n)):
            return
        got = store.pop(conv.id, n)
        removed = conv.rows[max(0, len(conv.rows) - n):] if n else []
        assert [observed(m) for m in got] == [expected(r) for r in removed]
        if removed:
            del conv.rows[len(conv.rows) - len(removed):]
            start = removed[0].seq
            conv.summaries = [s for s in conv.summaries if s.last_seq < start]

    @rule(data=st.data())
    def truncate(self, data: st.DataObject) -> None:
        conv = self.conv(data)
        store = self.writer(data)
        before_seq = conv.first + data.draw(st.integers(-2, len(conv.rows) + 1), label="offset")
        if before_seq < 1:
            with pytest.raises(InvalidInputError):
                store.truncate(conv.id, before_seq=before_seq)
            return
        if self.missing(conv, lambda: store.truncate(conv.id, before_seq=before_seq)):
            return
        count = store.truncate(conv.id, before_seq=before_seq)
        cut = min(before_seq, conv.last + 1)
        if cut <= conv.first:
            assert count == 0
            return
        assert count == cut - conv.first
        conv.rows = [r for r in conv.rows if r.seq >= cut]
        conv.first = cut  # summaries stay (docs/summaries.md)

    @rule(data=st.data())
    def clear(self, data: st.DataObject) -> None:
        if not self.rarely(data):
            return
        conv = self.conv(data)
        store = self.writer(data)
        if self.missing(conv, lambda: store.clear(conv.id)):
            return
        assert store.clear(conv.id) == len(conv.rows)
        conv.first, conv.rows, conv.summaries = 1, [], []

    @rule(data=st.data())
    def delete(self, data: st.DataObject) -> None:
        if not self.rarely(data):
            return
        conv = self.conv(data)
        store = self.writer(data)
        if self.missing(conv, lambda: store.delete_conversation(conv.id)):
            return
        store.delete_conversation(conv.id)
        conv.reset()

    @rule(data=st.data(), score=SCORES)
    def set_score(self, data: st.DataObject, score: float) -> None:
        conv = self.conv(data)
        self.change_row(conv, self.seq(data, conv), self.writer(data),
                        lambda store, seq: store.set_score(conv.id, seq, score), score=score)

    @rule(data=st.data(), pin=st.booleans())
    def pin(self, data: st.DataObject, pin: bool) -> None:
        conv = self.conv(data)
        seq = self.seq(data, conv)
        row = next((r for r in conv.rows if r.seq == seq), None)
        self.change_row(conv, seq, self.writer(data),
                        lambda store, seq: (store.pin if pin else store.unpin)(conv.id, seq),
                        pinned=pin)
        if (row is not None and not pin and row.spec.pinned
                and row.spec.role not in ("system", "developer")):
            # No summary stood for it (summarize skips anchored messages): the summaries
            # reaching it go, so SummaryView does not hide it.
            conv.summaries = [s for s in conv.summaries if s.last_seq < seq]

    def change_row(self, conv: Conv, seq: int, store: MemoryStore,
                   call: Callable[[MemoryStore, int], StoredMessage], **change: Any) -> None:
        if seq < 1:
            with pytest.raises(InvalidInputError):
                call(store, seq)
            return
        if self.missing(conv, lambda: call(store, seq)):
            return
        if not conv.first <= seq <= conv.last:
            with pytest.raises(MessageNotFoundError):
                call(store, seq)
            return
        got = call(store, seq)
        i = seq - conv.first
        row = conv.rows[i]
        conv.rows[i] = dataclasses.replace(row, spec=dataclasses.replace(row.spec, **change))
        assert observed(got) == expected(conv.rows[i])

    @rule(data=st.data(), newest=st.sampled_from([None, None, None, 0, 1, 2, 3, 5, 8]),
          ops=rewrite_ops())
    def rewrite(self, data: st.DataObject, newest: int | None, ops: list[RewriteOp]) -> None:
        conv = self.conv(data)
        store = self.writer(data)
        calls: list[list[StoredMessage]] = []
        start = conv.first if newest is None else max(conv.first, conv.last - newest + 1)
        read = [r for r in conv.rows if r.seq >= start]
        older_ids = [r.id for r in conv.rows if r.seq < start]
        fresh_ids = [self.next_id("rw") for _ in ops]

        def fn(ms: list[StoredMessage]) -> list[Message]:
            calls.append(list(ms))
            out, _ = apply_ops(list(ms), ops, older_ids, fresh_ids,
                               make_new=lambda s: s.message(),
                               edit=lambda m, u: m.model_copy(update=u), spec_of_item=spec_of)
            return out

        if self.missing(conv, lambda: store.rewrite(conv.id, fn, newest=newest)):
            assert calls == []
            return

        def model_edit(item: RewriteItem, update: dict[str, Any]) -> RewriteItem:
            if isinstance(item, NewMessage):
                return NewMessage(dataclasses.replace(item.spec, **update))
            spec = dataclasses.replace(item.spec, **update)
            recount = not spec.same_content(item.spec)
            return dataclasses.replace(item, spec=spec,
                                       token_count=spec.tokens if recount else item.token_count)

        def model_spec(item: RewriteItem) -> Spec:
            return item.spec

        result, refusal = apply_ops(list(read), ops, older_ids, fresh_ids, make_new=NewMessage,
                                    edit=model_edit, spec_of_item=model_spec)
        if refusal is not None:
            with pytest.raises(ConflictError if refusal == "steal" else InvalidInputError):
                store.rewrite(conv.id, fn, newest=newest)
            return
        before = self.now()
        got = store.rewrite(conv.id, fn, newest=newest)
        after = self.now()
        assert len(calls) == 1
        assert [observed(m) for m in calls[0]] == [expected(r) for r in read]
        assert len(got) == len(result)
        old_by_id = {r.id: r for r in read}
        new_rows: list[Row] = []
        for k, (item, stored) in enumerate(zip(result, got)):
            seq = start + k
            if isinstance(item, Row):
                new_rows.append(item.at(seq))
                continue
            # A plain Message is a new message: its own id or a new one, stored now.
            spec = item.spec
            if spec.id is None:
                assert stored.id not in old_by_id and stored.id not in older_ids
            prior = old_by_id.get(stored.id)
            tokens = (prior.token_count if prior is not None and prior.spec.same_content(spec)
                      else spec.tokens)
            self.check_time(stored.created_at, before, after)
            new_rows.append(Row(dataclasses.replace(spec, id=stored.id), seq,
                                stored.created_at, tokens))
        assert [observed(m) for m in got] == [expected(r) for r in new_rows]
        # Summaries reaching the first position whose id or content changed go.
        same = 0
        for old, new in zip(read, new_rows):
            if old.id != new.id or not old.spec.same_content(new.spec):
                break
            same += 1
        if same < max(len(read), len(new_rows)):
            conv.summaries = [s for s in conv.summaries if s.last_seq < start + same]
        conv.rows = [r for r in conv.rows if r.seq < start] + new_rows

    @rule(data=st.data(), how=st.sampled_from(["state", "json", "file"]))
    def state_round_trip(self, data: st.DataObject, how: str) -> None:
        """save_state (or dump_state) then load_state(replace=True): nothing changes."""
        conv = self.conv(data)
        source, target = self.writer(data), self.writer(data)
        if self.missing(conv, lambda: source.save_state(conv.id)):
            return
        snapshot = self.snapshot(source, conv, how)
        if data.draw(st.booleans(), label="restore_state"):
            report = target.restore_state(snapshot, conv.id)
            assert (report.messages, report.written, report.recounted) == (
                len(conv.rows), len(conv.rows), 0)
            assert report.conversation.message_count == len(conv.rows)
        else:
            target.load_state(snapshot, conv.id, replace=True)
        conv.first = self.loaded_first(conv)

    @rule(data=st.data(), replace=st.booleans(), how=st.sampled_from(["state", "file"]))
    def copy_state(self, data: st.DataObject, replace: bool, how: str) -> None:
        """Load one conversation's snapshot into the other one."""
        index = data.draw(st.integers(0, 1), label="source")
        conv, other = self.touch(self.convs[index]), self.touch(self.convs[1 - index])
        if not conv.exists:
            return
        state = self.snapshot(self.writer(data), conv, how)
        store = self.writer(data)
        if replace or not other.exists:
            store.load_state(state, other.id, replace=replace)
            other.exists = True
            other.rows = list(conv.rows)
            other.summaries = list(conv.summaries)
            other.first = self.loaded_first(other)
            other.metadata, other.created_at = dict(conv.metadata), conv.created_at
            return
        clash = {r.id for r in conv.rows} & set(other.ids())
        if clash and conv.rows:
            with pytest.raises(ConflictError):
                store.load_state(state, other.id, replace=False)
            return
        store.load_state(state, other.id, replace=False)
        base = other.last + 1
        other.rows += [r.at(base + k) for k, r in enumerate(conv.rows)]

    def snapshot(self, store: MemoryStore, conv: Conv, how: str) -> Any:
        state = store.save_state(conv.id)
        assert [observed(m) for m in state.messages] == [expected(r) for r in conv.rows]
        assert ([observed_summary(s) for s in state.summaries]
                == [expected_summary(s) for s in conv.summaries])
        if how == "json":
            return state.to_json()
        if how == "file":
            fp = io.StringIO()
            store.dump_state(conv.id, fp, page_size=2)
            fp.seek(0)
            return fp
        return state

    @staticmethod
    def loaded_first(conv: Conv) -> int:
        """The first seq of a loaded snapshot: the first message's; with no messages, the
        seq after the last summary's range, else 1 (the snapshot holds no seq for an
        empty conversation)."""
        if conv.rows:
            return conv.rows[0].seq
        return conv.summaries[-1].last_seq + 1 if conv.summaries else 1

    @rule(data=st.data(), keep=st.sampled_from([0, 0, 5, 12, 25, 60]), as_message=st.booleans(),
          other=st.booleans())
    def summarize(self, data: st.DataObject, keep: int, as_message: bool, other: bool) -> None:
        self.summarize_with(self.conv(data), self.writer(data), keep, as_message,
                            OTHER if other else COUNTER)

    def summarize_with(self, conv: Conv, store: MemoryStore, keep: int, as_message: bool,
                       counter: TokenCounter) -> None:
        inputs: list[list[Message]] = []

        def summarizer(messages: list[Message]) -> str | Message:
            inputs.append(list(messages))
            seqs = [m.seq for m in messages if isinstance(m, StoredMessage)]
            text = f"summary of {len(seqs)}: {' '.join(map(str, seqs))}"
            return Message.assistant(text) if as_message else text

        if self.missing(conv, lambda: store.summarize(conv.id, summarizer, keep_tokens=keep,
                                                      counter=counter)):
            return
        previous = conv.summaries[-1] if conv.summaries else None
        folded, last = fold(conv, keep, counter)
        before = self.now()
        got = store.summarize(conv.id, summarizer, keep_tokens=keep, counter=counter)
        after = self.now()
        if not folded:
            assert inputs == []
            assert (got is None) == (previous is None)
            if got is not None and previous is not None:
                assert observed_summary(got) == expected_summary(previous)
            return
        assert len(inputs) == 1
        given = inputs[0]
        if previous is not None:
            head = given.pop(0)
            assert head.role == "system" and not isinstance(head, StoredMessage)
            assert head.metadata == {"memstore": {"summary": True,
                                                  "first_seq": previous.first_seq,
                                                  "last_seq": previous.last_seq}}
        assert all(isinstance(m, StoredMessage) for m in given)
        assert [observed(m) for m in given if isinstance(m, StoredMessage)] == [
            expected(r) for r in folded]
        assert got is not None
        self.check_time(got.created_at, before, after)
        text = f"summary of {len(folded)}: {' '.join(str(r.seq) for r in folded)}"
        want = SummaryRow(
            number=previous.number + 1 if previous is not None else 1,
            first_seq=previous.first_seq if previous is not None else folded[0].seq,
            last_seq=last, text=text,
            token_count=counter.count_message(Message.system(text)), created_at=got.created_at,
            counter=counter.name)
        assert observed_summary(got) == expected_summary(want)
        conv.summaries.append(want)

    @rule(data=st.data(), metadata=METADATA)
    def create(self, data: st.DataObject, metadata: tuple[tuple[str, Any], ...]) -> None:
        """create_conversation: an empty conversation with metadata, or ConflictError."""
        conv = self.conv(data)
        store = self.writer(data)
        if conv.exists:
            with pytest.raises(ConflictError):
                store.create_conversation(conv.id, dict(metadata))
            return
        got = store.create_conversation(conv.id, dict(metadata))
        assert (got.id, got.metadata, got.message_count, got.token_count) == (
            conv.id, dict(metadata), 0, 0)
        conv.exists, conv.first, conv.metadata = True, 1, dict(metadata)

    @rule(data=st.data())
    def forget_cache(self, data: st.DataObject) -> None:
        """A process restart: the caching stores start empty."""
        if self.rarely(data):
            self.env.cached.clear_cache()
            self.env.small.clear_cache()

    # ---- reads ------------------------------------------------------------------------

    @rule(data=st.data(), start=st.one_of(st.none(), st.integers(-1, 8)),
          stop=st.one_of(st.none(), st.integers(-1, 10)),
          limit=st.one_of(st.none(), st.integers(0, 4)), newest_first=st.booleans())
    def read(self, data: st.DataObject, start: int | None, stop: int | None,
             limit: int | None, newest_first: bool) -> None:
        conv = self.conv(data)
        store = self.writer(data)
        if start is not None:
            start += conv.first - 1
        if stop is not None:
            stop += conv.first - 1
        if not conv.exists:  # reads of a conversation never written (or deleted): empty
            assert store.messages(conv.id, start=start) == []
            assert list(store.iter_messages(conv.id)) == []
            assert store.count_tokens(conv.id) == 0
            return
        rows = [r for r in conv.rows if (start is None or r.seq >= start)
                and (stop is None or r.seq < stop)]
        if newest_first:
            rows.reverse()
        if limit is not None:
            rows = rows[:limit]
        got = store.messages(conv.id, start=start, stop=stop, limit=limit,
                             newest_first=newest_first)
        assert [observed(m) for m in got] == [expected(r) for r in rows]
        paged = list(store.iter_messages(conv.id, start=start, stop=stop, page_size=2))
        assert [observed(m) for m in paged] == [
            expected(r) for r in conv.rows if (start is None or r.seq >= start)
            and (stop is None or r.seq < stop)]
        seq = self.seq(data, conv)
        if seq < 1:
            with pytest.raises(InvalidInputError):
                store.get_message(conv.id, seq)
        elif conv.first <= seq <= conv.last:
            assert observed(store.get_message(conv.id, seq)) == expected(
                conv.rows[seq - conv.first])
        else:
            with pytest.raises(MessageNotFoundError):
                store.get_message(conv.id, seq)

    # ---- invariants -------------------------------------------------------------------

    @invariant()
    def stores_agree_with_the_model(self) -> None:
        for conv in self.convs:
            if conv.id in self.touched:
                self.check_conversation(conv)
            elif conv.exists:  # untouched: still the model's messages
                stored = self.env.plain.messages(conv.id)
                assert [observed(m) for m in stored] == [expected(r) for r in conv.rows]
            else:
                with pytest.raises(ConversationNotFoundError):
                    self.env.plain.get_conversation(conv.id)
        self.touched.clear()
        # The database holds these conversations only.
        stats = self.env.plain.stats()
        assert (stats.conversations, stats.messages, stats.tokens) == (
            sum(c.exists for c in self.convs), sum(len(c.rows) for c in self.convs),
            sum(r.token_count for c in self.convs for r in c.rows))

    def check_conversation(self, conv: Conv) -> None:
        plain = self.env.plain
        if not conv.exists:
            for store in self.env.stores:
                with pytest.raises(ConversationNotFoundError):
                    store.get_conversation(conv.id)
                window = store.window(conv.id, UnboundedView())
                assert window.messages == [] and not window.report.conversation_exists
            return
        stored = plain.messages(conv.id)
        assert [observed(m) for m in stored] == [expected(r) for r in conv.rows]
        assert [m.seq for m in stored] == list(range(conv.first, conv.last + 1))
        assert all(m.conversation_id == conv.id for m in stored)
        summaries = plain.summaries(conv.id)
        assert [observed_summary(s) for s in summaries] == [
            expected_summary(s) for s in conv.summaries]
        row = plain.get_conversation(conv.id)
        assert self.env.cached.get_conversation(conv.id) == row
        assert row.metadata == conv.metadata
        if conv.created_at is None:
            conv.created_at = row.created_at
        assert row.created_at == conv.created_at
        assert row.message_count == len(stored)
        assert row.token_count == sum(m.token_count for m in stored)
        assert self.env.cached.count_tokens(conv.id) == row.token_count
        # Each caching store reads a third of the views at each check, a different third
        # each time: windows then find the cache partly filled (by smaller windows),
        # not always holding every row.
        self.checks += 1
        units = units_of(conv.rows)
        for k, view in enumerate(VIEWS):
            caching = [store for j, store in enumerate((self.env.cached, self.env.small))
                       if (k + j + self.checks) % 3 == 0]
            self.check_window(conv, view, stored, summaries, caching, units)
        # Reading windows wrote nothing.
        assert plain.messages(conv.id) == stored
        assert plain.summaries(conv.id) == summaries
        assert plain.get_conversation(conv.id) == row

    def check_window(self, conv: Conv, view: ContextView, stored: list[StoredMessage],
                     summaries: list[Summary], caching: list[MemoryStore],
                     units: list[Unit]) -> None:

        # apply uses the counter it is given; the store passes
        # view.resolve_counter(store.counter) (ContextView.select's docstring).
        def apply() -> ContextWindow:
            if isinstance(view, SummaryView):
                return view.apply(stored, counter_of(view), summaries)
            return view.apply(stored, counter_of(view))

        outcomes: list[ContextWindow | ContextBudgetError] = []
        reads: list[Callable[[], ContextWindow]] = [
            lambda: self.env.plain.window(conv.id, view), apply,
            *(functools.partial(store.window, conv.id, view) for store in caching)]
        for read in reads:
            try:
                outcomes.append(read())
            except ContextBudgetError as error:
                outcomes.append(error)
        by_plain, by_apply, *by_cache = outcomes
        required = budget_required(conv, view, units)
        if isinstance(by_plain, ContextBudgetError):
            for exc in (by_apply, *by_cache):
                assert isinstance(exc, ContextBudgetError), (view, exc)
                assert (exc.required, exc.budget) == (by_plain.required, by_plain.budget)
            assert required is not None and by_plain.required == required, view
            assert by_plain.required > by_plain.budget
            return
        assert required is None, (view, required, by_plain.token_count)
        for window in by_cache:  # "windows are identical either way" (README)
            assert window == by_plain, view
        assert isinstance(by_apply, ContextWindow), (view, by_apply)
        assert comparable(by_apply, view) == comparable(by_plain, view), view
        check_window_shape(conv, view, by_plain, units)


def comparable(w: ContextWindow, view: ContextView) -> tuple[Any, ...]:
    """A window without what legitimately differs between a store and ``apply``.

    The conversation id of an empty list, and ``rows_read``: the store reads pages.
    For ``ScoreBasedView`` also the reasons of the omissions: the store decides a
    candidate against the conversation row's ``max_score``, an upper bound of the
    stored scores (a list has the exact one), so it may read further back before it
    stops, and "the report gives them [incomplete units] reason ``incomplete_unit``
    when the view read them. A view that stops reading early ... reports everything
    older than where it stopped under its own reason" (docs/views.md). The omitted
    seqs are checked against the model for every window (``check_window_shape``).
    """
    r = w.report
    omitted = None if isinstance(view, ScoreBasedView) else r.omitted
    return (w.messages, w.token_count, w.budget, r.view, r.counter,
            r.conversation_message_count, r.included_count, omitted, r.placeholder,
            r.skipped, r.summary_range, r.unsummarized)


def latest_summary(conv: Conv) -> SummaryRow | None:
    return conv.summaries[-1] if conv.summaries else None


def summary_message(view: SummaryView, s: SummaryRow) -> Message:
    return Message(role="system",
                   content=view.template.format(first=s.first_seq, last=s.last_seq, text=s.text))


def budget_required(conv: Conv, view: ContextView, units: list[Unit]) -> int | None:
    """The tokens a budgeted view needs before it may choose anything, when they exceed
    its limit (it then raises ContextBudgetError); ``None`` when they fit."""
    if not isinstance(view, (TokenLimitedView, ScoreBasedView, SummaryView)):
        return None
    counter = counter_of(view)
    anchored = sum(u.tokens_by(counter) for u in units if u.complete and u.anchored)
    any_anchored = any(u.complete and u.anchored for u in units)
    extra = 0
    floor = 0
    if isinstance(view, SummaryView):
        s = latest_summary(conv)
        if s is not None:
            extra = counter.count_message(summary_message(view, s))
            floor = s.last_seq + 1
            units = units_of([r for r in conv.rows if r.seq >= floor])
        elif not conv.rows:
            return None
    candidates = [u for u in units if u.complete and not u.anchored]
    if not candidates and not any_anchored and not extra:
        return None
    newest = candidates[-1].tokens_by(counter) if candidates else 0
    required = anchored + extra + newest + priming(counter) + view.reserve
    return required if required > view.token_limit else None


def check_window_shape(conv: Conv, view: ContextView, w: ContextWindow,
                       units: list[Unit]) -> None:
    """The rules every view follows (docs/views.md, "Rules every view follows")."""
    seqs = w.seqs
    assert seqs == sorted(set(seqs)), view
    kept = set(seqs)
    for unit in units:
        inside = unit.seqs & kept
        assert not inside or (unit.complete and inside == unit.seqs), (view, unit.seqs, seqs)
        if unit.complete and unit.anchored:
            assert unit.seqs <= kept, (view, "anchored unit left out", unit.seqs)
    summary = latest_summary(conv) if isinstance(view, SummaryView) else None
    candidates = [u for u in units if u.complete and not u.anchored]
    if summary is not None:
        candidates = [u for u in units_of([r for r in conv.rows if r.seq > summary.last_seq])
                      if u.complete and not u.anchored]
        anchored = {s for u in units if u.complete and u.anchored for s in u.seqs}
        assert {s for s in kept if s <= summary.last_seq} <= anchored, view
    if candidates:
        assert candidates[-1].seqs <= kept, (view, "newest unit left out")
    plain = [m for m in w.messages if not isinstance(m, StoredMessage)]
    assert len(plain) <= 1, view
    if isinstance(view, SummaryView):
        assert len(plain) == (1 if summary is not None else 0), view
        assert w.report.summary_range == (
            (summary.first_seq, summary.last_seq) if summary is not None else None)
    elif not isinstance(view, HeadAndTailView):
        assert not plain, view
    if w.messages:
        assert w.token_count == counter_of(view).count_messages(w.messages), view
    else:
        assert w.token_count == 0, view
    if isinstance(view, (TokenLimitedView, ScoreBasedView, SummaryView)):
        assert w.token_count + view.reserve <= view.token_limit, view
        assert w.budget == view.token_limit
    assert w.report.conversation_message_count == len(conv.rows)
    assert w.report.included_count == len(seqs)
    # Every stored message the window leaves out is reported, once; those reported as
    # incomplete units are.
    omitted = w.report.omitted_seqs()
    assert sorted(omitted) == [r.seq for r in conv.rows if r.seq not in kept], view
    incomplete = {s for u in units if not u.complete for s in u.seqs}
    assert set(w.report.omitted_seqs("incomplete_unit")) <= incomplete, view
    expected_seqs, skipped = independent_selection(conv, view, units)
    assert seqs == expected_seqs, (view, seqs, expected_seqs)
    assert w.report.skipped == skipped, view
    assert (w.report.placeholder is not None) == (skipped > 0) == bool(plain and isinstance(
        view, HeadAndTailView)), view


def independent_selection(conv: Conv, view: ContextView,
                          units: list[Unit]) -> tuple[list[int], int]:
    """The window's seqs and placeholder count by each view's documented rule
    (docs/views.md), computed from the model alone. Called only when the view does not
    raise ContextBudgetError."""
    anchored = [u for u in units if u.complete and u.anchored]
    candidates = [u for u in units if u.complete and not u.anchored]
    chosen: list[Unit] = []
    skipped = 0
    if isinstance(view, UnboundedView):
        chosen = candidates
    elif isinstance(view, (TokenLimitedView, SummaryView)):
        counter = counter_of(view)
        left = (view.token_limit - view.reserve - priming(counter)
                - sum(u.tokens_by(counter) for u in anchored))
        summary = latest_summary(conv) if isinstance(view, SummaryView) else None
        if summary is not None:
            assert isinstance(view, SummaryView)
            left -= counter.count_message(summary_message(view, summary))
            candidates = [u for u in units_of([r for r in conv.rows if r.seq > summary.last_seq])
                          if u.complete and not u.anchored]
        for k, unit in enumerate(reversed(candidates)):  # a contiguous suffix
            if k and unit.tokens_by(counter) > left:
                break
            left -= unit.tokens_by(counter)
            chosen.append(unit)
        if isinstance(view, TokenLimitedView) and view.start_on_user:
            while len(chosen) > 1 and chosen[-1].rows[0].spec.role != "user":
                chosen.pop()
    elif isinstance(view, BufferedView):
        count = 0
        for unit in reversed(candidates):
            if count and count + len(unit.rows) > view.buffer_size:
                break
            count += len(unit.rows)
            chosen.append(unit)
    elif isinstance(view, HeadAndTailView):
        count, refused = 0, None
        for k, unit in enumerate(candidates):
            if count + len(unit.rows) > view.head_size:
                refused = k
                break
            count += len(unit.rows)
            chosen.append(unit)
        if refused is not None:
            head_end = chosen[-1].last_seq if chosen else conv.first - 1
            tail: list[Unit] = []
            count = 0
            for unit in reversed(candidates[refused:]):
                if tail and count + len(unit.rows) > view.tail_size:
                    break
                count += len(unit.rows)
                tail.append(unit)
            chosen += tail
            kept = {s for u in [*anchored, *chosen] for s in u.seqs}
            skipped = sum(1 for r in conv.rows
                          if head_end < r.seq < min(tail[-1].seqs) and r.seq not in kept)
    elif isinstance(view, RecentTurnsView):
        users = [k for k, u in enumerate(candidates) if u.rows[0].spec.role == "user"]
        chosen = candidates[users[-view.max_turns]:] if len(users) > view.max_turns else (
            candidates)
        if view.remove_tool_messages:
            chosen = [u for u in chosen if not u.rows[0].spec.tool_calls or u is chosen[-1]]
    elif isinstance(view, ScoreBasedView):
        chosen = score_based(conv, view, anchored, candidates)
    return sorted(s for u in [*anchored, *chosen] for s in u.seqs), skipped


def score_based(conv: Conv, view: ScoreBasedView, anchored: list[Unit],
                candidates: list[Unit]) -> list[Unit]:
    """ScoreBasedView's greedy: the newest unit, then the others by decayed score."""
    if not candidates:
        return []
    scores: dict[int, float] = {}
    newest_time = conv.rows[-1].created_at
    effective: datetime | None = None
    j = 0
    for r in reversed(conv.rows):  # the j-th non-anchored message, newest first
        if r.anchored:
            continue
        j += 1
        if view.half_life is None:
            factor = float(view.keep_rate ** j)
        else:
            effective = r.created_at if effective is None else min(effective, r.created_at)
            age = max(0.0, (newest_time - effective).total_seconds())
            factor = float(0.5 ** (age / view.half_life))
        scores[r.seq] = r.spec.score * factor
    left = (view.token_limit - view.reserve - priming(COUNTER) - sum(u.tokens for u in anchored)
            - candidates[-1].tokens)
    chosen = [candidates[-1]]
    ranked = sorted(candidates[:-1], key=lambda u: (-max(scores[r.seq] for r in u.rows),
                                                    -u.last_seq))
    skipped, examined = False, 0
    for unit in ranked:
        if left == 0 or (skipped and view.fill_scan is not None and examined >= view.fill_scan):
            break
        examined += skipped
        if unit.tokens <= left:
            chosen.append(unit)
            left -= unit.tokens
        else:
            skipped = True
    return chosen


def counter_of(view: ContextView) -> TokenCounter:
    return view.resolve_counter(COUNTER)


def priming(counter: TokenCounter) -> int:
    return counter.count_messages([])


def fold(conv: Conv, keep: int, counter: TokenCounter) -> tuple[list[Row], int]:
    """What ``summarize(keep_tokens=keep, counter=counter)`` folds in and the new range's
    last seq (docs/summaries.md, "What summarize folds")."""
    previous = latest_summary(conv)
    floor = conv.first if previous is None else max(conv.first, previous.last_seq + 1)
    units = units_of([r for r in conv.rows if r.seq >= floor])
    kept, newest, cut = 0, True, None
    folded: list[Row] = []
    for unit in reversed(units):
        if not unit.complete or unit.anchored:
            continue
        if cut is None:
            if newest or kept + unit.tokens_by(counter) <= keep:
                newest = False
                kept += unit.tokens_by(counter)
                continue
            cut = unit.last_seq + 1
        folded.extend(unit.rows)
    if cut is None or not folded:
        return [], 0
    return sorted(folded, key=lambda r: r.seq), cut - 1


# ---- the test ---------------------------------------------------------------------------


@pytest.fixture
def env(db_url: str) -> Iterator[Env]:
    env = Env(MemoryStore(db_url, counter=COUNTER),
              MemoryStore(db_url, counter=COUNTER, cache_size=0),
              MemoryStore(db_url, counter=COUNTER, cache_size=SMALL_CACHE))
    yield env
    for store in env.stores:
        store.close()


def test_store_follows_the_model(env: Env) -> None:
    class Machine(StoreModel):
        def __init__(self) -> None:
            super().__init__(env)

        def teardown(self) -> None:
            for conv in self.convs:
                if conv.exists:
                    env.plain.delete_conversation(conv.id)

    dialect = env.plain.engine.dialect.name
    run_state_machine_as_test(Machine, settings=settings(SETTINGS,
                                                         max_examples=EXAMPLES[dialect]))
