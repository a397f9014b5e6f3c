"""Atomic units: an assistant tool call together with the tool results that answer it.

Every view keeps or drops *units* whole, so a window never holds an orphan tool
result or an unanswered tool call. The grouping rule:

* A **run** is an assistant message with ``tool_calls`` followed by the
  consecutive ``tool`` messages after it (up to the next non-tool message).
* In a run, the first tool message answering each call id joins the call's unit
  (parallel calls, results in any order). The unit is **complete** when every call
  id is answered.
* A tool message of a run that answers no id of the call, or answers an id that
  an earlier message of the run already answered (a *duplicate answer*: the first
  answer wins), is an **orphan**: a one-message incomplete unit.
* Tool messages that do not follow a call (after a user message, at the start of
  the history, after a system message) are orphans.
* An assistant message with ``tool_calls`` whose ids are not all answered in its
  run (a pending call at the end, or a call that was never answered) forms an
  incomplete unit with the results it did get.
* Any other message is a complete unit of its own. Chained calls
  (call → results → call → results) are consecutive units.

Incomplete units are left out of every view and reported with reason
``"incomplete_unit"``. A complete unit holding an anchored message (system,
developer or pinned) is anchored as a whole: a pinned tool result keeps its call
and sibling results. An *incomplete* unit is never emitted, even when one of its
messages is pinned: sending it would make the provider reject the request.

Grouping works on a whole chronological list (`group_units()`) and
incrementally while reading a [`HistorySource`][memstore.HistorySource]
newest-first (`BackwardUnits` over a `ReverseReader`) or
oldest-first (`ForwardUnits` over a `ForwardReader`). A run may
straddle page boundaries; the readers simply fetch the next page.
"""

from __future__ import annotations

import functools
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from types import GeneratorType
from typing import NamedTuple

from memstore.models import ANCHOR_ROLES, StoredMessage
from memstore.tokens import TokenCounter
from memstore.views.history import HistorySource

__all__ = [
    "AnchorSet",
    "BackwardUnits",
    "ForwardReader",
    "ForwardUnits",
    "ReverseReader",
    "Unit",
    "group_units",
    "is_call",
    "resolve_anchors",
    "split_run",
]

#: First page size of the readers when the caller gives no hint.
DEFAULT_FIRST_PAGE = 32
#: Largest page the readers request; pages double up to it.
DEFAULT_MAX_PAGE = 512


def is_call(message: StoredMessage) -> bool:
    """Whether ``message`` is an assistant message carrying tool calls."""
    return message.role == "assistant" and bool(message.tool_calls)


class Unit(NamedTuple):
    """Messages a view keeps or drops together.

    A named tuple: views build one per message they read, so it is cheap to make.

    Attributes:
        messages: the unit's messages, chronological. For a tool unit: the call,
            then the results that answer it.
        complete: ``False`` for an unanswered or partially answered call (with the
            results it got) and for an orphan tool result.
    """

    messages: tuple[StoredMessage, ...]
    complete: bool

    @property
    def first_seq(self) -> int:
        """Seq of the unit's oldest message."""
        return self.messages[0].seq

    @property
    def last_seq(self) -> int:
        """Seq of the unit's newest message."""
        return self.messages[-1].seq

    @property
    def seqs(self) -> tuple[int, ...]:
        """Seqs of the unit's messages, ascending."""
        return tuple(m.seq for m in self.messages)

    @property
    def size(self) -> int:
        """Number of messages."""
        return len(self.messages)

    @property
    def anchored(self) -> bool:
        """True when any message is anchored (system, developer or pinned)."""
        for m in self.messages:  # noqa: SIM110 - a loop: no generator per unit read
            if m.pinned or m.role in ANCHOR_ROLES:
                return True
        return False

    @property
    def is_tool_unit(self) -> bool:
        """True when the unit starts with an assistant tool call."""
        return is_call(self.messages[0])

    @property
    def starts_with_user(self) -> bool:
        """True when the unit's first message is a user message."""
        return self.messages[0].role == "user"

    def tokens(self, counter: TokenCounter) -> int:
        """Sum of ``message_tokens`` of the unit's messages under ``counter``.

        Inlines `message_tokens()` (stored count when it came
        from ``counter``): this runs once per unit a view reads.
        """
        name = counter.name
        total = 0
        for m in self.messages:
            total += m.token_count if m.token_counter == name else counter.count_message(m)
        return total


def split_run(call: StoredMessage | None, tools: Sequence[StoredMessage]) -> list[Unit]:
    """Group one run into units.

    Args:
        call: the assistant message with ``tool_calls`` that starts the run, or
            ``None`` when the tool messages follow no call.
        tools: the consecutive tool messages of the run, chronological.

    Returns:
        The call's unit (complete or not) followed by one orphan unit per tool
        message that does not answer the call (chronological by first seq).
    """
    if call is None:
        return [Unit((t,), complete=False) for t in tools]
    ids = set(call.tool_call_ids)
    answered: set[str] = set()
    members = [call]
    orphans: list[Unit] = []
    for t in tools:
        cid = t.tool_call_id
        if cid is not None and cid in ids and cid not in answered:
            answered.add(cid)
            members.append(t)
        else:
            orphans.append(Unit((t,), complete=False))
    return [Unit(tuple(members), complete=answered == ids), *orphans]


def group_units(messages: Iterable[StoredMessage]) -> list[Unit]:
    """Group a chronological list of stored messages into units.

    Args:
        messages: one conversation's messages (sorted by seq here).

    Returns:
        Every unit, complete and incomplete, sorted by first seq. Each message
        belongs to exactly one unit.
    """
    ordered = sorted(messages, key=lambda m: m.seq)
    units: list[Unit] = []
    i = 0
    while i < len(ordered):
        m = ordered[i]
        if m.role == "tool":
            units.append(Unit((m,), complete=False))
            i += 1
        elif is_call(m):
            j = i + 1
            while j < len(ordered) and ordered[j].role == "tool":
                j += 1
            units.extend(split_run(m, ordered[i + 1 : j]))
            i = j
        else:
            units.append(Unit((m,), complete=True))
            i += 1
    return units


class ReverseReader:
    """Messages of a source newest-first, read page by page.

    Pages start at ``first_page`` rows and double up to ``max_page``, so a caller
    that stops early reads at most about twice what it used.

    Args:
        source: the history to read.
        before: read messages with ``seq < before`` (default: all).
        floor: the lowest seq to read (inclusive; default: the first stored seq).
        first_page: size of the first page.
        max_page: page size cap.
        observer: called with every message, in reading order, as it is read.

    A source with a ``stream_newest_first(before, floor, first_page, max_page)`` method
    (an iterator of the same messages, newest first) is read through it instead: the
    store's source pages the same way but builds each message only when it is taken.
    """

    def __init__(
        self,
        source: HistorySource,
        *,
        before: int | None = None,
        floor: int | None = None,
        first_page: int = DEFAULT_FIRST_PAGE,
        max_page: int = DEFAULT_MAX_PAGE,
        observer: Callable[[StoredMessage], None] | None = None,
    ) -> None:
        self._source = source
        self._before = source.last_seq + 1 if before is None else before
        self._floor = source.first_seq if floor is None else max(floor, source.first_seq)
        self._page = max(1, first_page)
        self._max_page = max(self._page, max_page)
        self._observer = observer
        self._done = self._before <= self._floor
        self._page_left = False
        stream = getattr(source, "stream_newest_first", None)  # optional hook
        self._stream: Iterator[StoredMessage] | None = None
        if stream is not None and not self._done:
            # The source pages itself and builds each message only when it is taken.
            it = stream(self._before, self._floor, self._page, self._max_page)
            # ``exhausted`` reads a generator's state: wrap any other iterator in one.
            self._stream = it if isinstance(it, GeneratorType) else (m for m in it)
            self._done = True
        self._messages = (
            self._stream if self._stream is not None and observer is None
            else self._generate()
        )

    @property
    def exhausted(self) -> bool:
        """True once every message down to ``floor`` has been returned."""
        if self._stream is not None:
            # A finished (or closed) generator has no frame left.
            return getattr(self._stream, "gi_frame", True) is None
        return self._done and not self._page_left

    def __iter__(self) -> Iterator[StoredMessage]:
        # The generator itself: a for loop over the reader resumes it directly.
        return self._messages

    def __next__(self) -> StoredMessage:
        return next(self._messages)

    def _generate(self) -> Iterator[StoredMessage]:
        observer = self._observer
        if self._stream is not None:  # with an observer (none: the stream is iterated)
            assert observer is not None
            for message in self._stream:
                observer(message)
                yield message
            return
        while not self._done:
            page = self._next_page()
            if not page:
                return
            self._page_left = True
            if observer is None:
                yield from page
            else:
                for message in page:
                    observer(message)
                    yield message
            self._page_left = False

    def _next_page(self) -> list[StoredMessage]:
        limit = min(self._page, self._before - self._floor)
        self._page = min(self._page * 2, self._max_page)
        page = self._source.read_newest_first(self._before, limit)
        floor = self._floor
        if page and page[-1].seq < floor:
            page = [m for m in page if m.seq >= floor]
        if not page:
            self._done = True
            return page
        self._before = page[-1].seq
        if self._before <= floor or len(page) < limit:
            self._done = True
        return page


class ForwardReader:
    """Messages of a source oldest-first, read page by page (pages double up to a cap).

    Supports one message of lookahead (`peek()`).

    Args:
        source: the history to read.
        start: first seq to read (default: the first stored seq).
        stop: read messages with ``seq < stop`` (default: all).
        first_page: size of the first page.
        max_page: page size cap.
    """

    def __init__(
        self,
        source: HistorySource,
        *,
        start: int | None = None,
        stop: int | None = None,
        first_page: int = DEFAULT_FIRST_PAGE,
        max_page: int = DEFAULT_MAX_PAGE,
    ) -> None:
        self._source = source
        self._next = source.first_seq if start is None else max(start, source.first_seq)
        self._stop = source.last_seq + 1 if stop is None else min(stop, source.last_seq + 1)
        self._page = max(1, first_page)
        self._max_page = max(self._page, max_page)
        self._buffer: deque[StoredMessage] = deque()

    def __iter__(self) -> Iterator[StoredMessage]:
        return self

    def __next__(self) -> StoredMessage:
        message = self.peek()
        if message is None:
            raise StopIteration
        return self._buffer.popleft()

    def peek(self) -> StoredMessage | None:
        """The next message without consuming it (``None`` at the end)."""
        if not self._buffer and self._next < self._stop:
            limit = min(self._page, self._stop - self._next)
            self._page = min(self._page * 2, self._max_page)
            page = self._source.read(self._next, self._next + limit)
            self._next += limit
            self._buffer.extend(page)
        return self._buffer[0] if self._buffer else None


#: ``Unit((message,), True)`` without the named tuple's Python-level ``__new__`` (the
#: readers build one per message they read).
_plain_unit = functools.partial(tuple.__new__, Unit)


class BackwardUnits:
    """Units, newest first, grouped while reading messages newest-first.

    A tool message's unit is known only once the message before its run is read
    (the call, or a non-call that makes the run orphans), so tool messages wait in
    `pending` until then. Units are yielded in descending order of
    ``last_seq``; a run's orphans and its call unit come out together.

    Args:
        messages: messages in strictly descending seq order, consecutive seqs (e.g.
            a `ReverseReader`). When it ends with tool messages pending, they
            are orphans: nothing older is stored (or the reader's floor is the start
            of a unit).
    """

    def __init__(self, messages: Iterator[StoredMessage]) -> None:
        self.pending: list[StoredMessage] = []
        """Tool messages read but not yet grouped (newest first)."""
        self._units = self._generate(messages)

    def __iter__(self) -> Iterator[Unit]:
        # The generator itself: a for loop over the grouper resumes it directly.
        return self._units

    def __next__(self) -> Unit:
        return next(self._units)

    def _generate(self, messages: Iterator[StoredMessage]) -> Iterator[Unit]:
        for message in messages:
            role = message.role
            if role == "tool":
                self.pending.append(message)
            elif role == "assistant" and message.tool_calls:
                yield from self._ordered(split_run(message, self._take_pending()))
            elif self.pending:
                yield from self._ordered(split_run(None, self._take_pending()))
                yield Unit((message,), True)
            else:  # the common case: a plain message with nothing pending
                yield _plain_unit(((message,), True))
        if self.pending:
            yield from self._ordered(split_run(None, self._take_pending()))

    def _take_pending(self) -> list[StoredMessage]:
        tools = list(reversed(self.pending))
        self.pending = []
        return tools

    @staticmethod
    def _ordered(units: list[Unit]) -> list[Unit]:
        return sorted(units, key=lambda u: u.last_seq, reverse=True)


class ForwardUnits:
    """Units, oldest first (by first seq), grouped while reading oldest-first.

    Args:
        reader: a `ForwardReader`; a call's run is read through its lookahead.
    """

    def __init__(self, reader: ForwardReader) -> None:
        self._reader = reader
        self._ready: deque[Unit] = deque()

    def __iter__(self) -> Iterator[Unit]:
        return self

    def __next__(self) -> Unit:
        while not self._ready:
            message = next(self._reader, None)
            if message is None:
                raise StopIteration
            if message.role == "tool":
                self._ready.append(Unit((message,), complete=False))
            elif is_call(message):
                tools: list[StoredMessage] = []
                while (nxt := self._reader.peek()) is not None and nxt.role == "tool":
                    tools.append(next(self._reader))
                self._ready.extend(split_run(message, tools))
            else:
                self._ready.append(Unit((message,), complete=True))
        return self._ready.popleft()


@dataclass
class AnchorSet:
    """The anchored units of a conversation.

    Attributes:
        units: complete units holding an anchored message (kept by every view),
            sorted by first seq.
        incomplete: incomplete units holding an anchored message (a pinned orphan
            result, a pinned unanswered call): never emitted, reported.
    """

    units: list[Unit] = field(default_factory=list)
    incomplete: list[Unit] = field(default_factory=list)

    @property
    def seqs(self) -> set[int]:
        """Seqs of every message of the kept anchored units."""
        return {s for u in self.units for s in u.seqs}

    def tokens(self, counter: TokenCounter) -> int:
        """Tokens of the kept anchored units under ``counter``."""
        return sum(u.tokens(counter) for u in self.units)


def resolve_anchors(source: HistorySource) -> AnchorSet:
    """Find every anchored unit of ``source`` without reading the whole history.

    Reads ``source.anchored()`` and, for each anchored message that is part of a
    tool run (a pinned call or a pinned result), just that run: backwards to its
    call and forwards to its last tool message.
    """
    result = AnchorSet()
    done: set[int] = set()
    for message in source.anchored():
        if message.seq in done:
            continue
        if message.role != "tool" and not is_call(message):
            done.add(message.seq)
            result.units.append(Unit((message,), complete=True))
            continue
        call: StoredMessage | None
        before: list[StoredMessage] = []
        if is_call(message):
            call = message
        else:
            call = None
            for older in ReverseReader(source, before=message.seq, first_page=4, max_page=64):
                if older.role != "tool":
                    call = older if is_call(older) else None
                    break
                before.append(older)
            before.reverse()
        tools = list(before)
        if message.role == "tool":
            tools.append(message)
        forward = ForwardReader(source, start=message.seq + 1, first_page=4, max_page=64)
        while (nxt := forward.peek()) is not None and nxt.role == "tool":
            tools.append(next(forward))
        for unit in split_run(call, tools):
            done.update(unit.seqs)
            if not unit.anchored:
                continue
            (result.units if unit.complete else result.incomplete).append(unit)
    result.units.sort(key=lambda u: u.first_seq)
    result.incomplete.sort(key=lambda u: u.first_seq)
    return result
