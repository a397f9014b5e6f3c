"""The read interface views select from: one conversation's stored history.

Views are pure: they never run SQL. They pull what they need from a
[`HistorySource`][memstore.HistorySource], newest-first and page by page, and stop as soon as older
messages can no longer change their result. The store implements the protocol
with indexed range queries on ``(conversation_id, seq)``; [`ListHistory`][memstore.ListHistory]
implements it over a list (tests, and windows over messages that are not stored).

Seqs of one conversation are contiguous: every seq in ``[first_seq, last_seq]``
is stored.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from datetime import datetime
from typing import Protocol, runtime_checkable

from memstore.errors import InvalidInputError
from memstore.models import StoredMessage, Summary

__all__ = ["HistorySource", "ListHistory", "SourceBase"]


@runtime_checkable
class HistorySource(Protocol):
    """Read access to one conversation's stored messages.

    Every method returns messages in the order it names; seq ranges are half-open
    ``[start, stop)``. Implementations count the rows they return in ``rows_read``.

    Optional (not part of the protocol, looked up with ``getattr``): a source that
    reads ahead offers ``first_page_for(token_limit) -> int | None``, the first page a
    view with that budget should ask for (the store on PostgreSQL returns the page its
    first statement already brought); ``None``, or no such method, lets the view size
    its first page from ``message_count`` and ``token_total``. A source that builds its
    messages lazily offers ``stream_newest_first(before, floor, first_page, max_page)``,
    an iterator of the messages with ``floor <= seq < before``, newest first, counting
    in ``rows_read`` each message as it is taken;
    `ReverseReader` then reads through it instead of
    `read_newest_first()` (the store reads pages of rows as the reader would ask for
    them and decodes a row only when it is taken).
    """

    @property
    def conversation_id(self) -> str:
        """The conversation's id."""
        ...

    @property
    def first_seq(self) -> int:
        """Seq of the oldest stored message (``last_seq + 1`` when empty)."""
        ...

    @property
    def last_seq(self) -> int:
        """Seq of the newest stored message (``first_seq - 1`` when empty)."""
        ...

    @property
    def message_count(self) -> int:
        """Number of stored messages (``last_seq - first_seq + 1``)."""
        ...

    @property
    def max_score(self) -> float:
        """An upper bound of every stored message's base score (1.0 or more)."""
        ...

    @property
    def token_total(self) -> int:
        """Sum of the stored per-message token counts (a paging hint, not a budget)."""
        ...

    @property
    def newest_created_at(self) -> datetime | None:
        """``created_at`` of the newest stored message, ``None`` when empty."""
        ...

    @property
    def rows_read(self) -> int:
        """How many message rows this source has returned so far."""
        ...

    def anchored(self) -> list[StoredMessage]:
        """Every anchored message (system, developer or pinned), chronological."""
        ...

    def read(self, start: int, stop: int) -> list[StoredMessage]:
        """Messages with ``start <= seq < stop``, chronological."""
        ...

    def read_newest_first(self, before: int, limit: int) -> list[StoredMessage]:
        """Up to ``limit`` messages with ``seq < before``, newest first."""
        ...

    def latest_summary(self) -> Summary | None:
        """The newest stored summary whose range ends at or before ``last_seq``.

        ``None`` when the conversation has none. Not a message row: it does not
        count in ``rows_read``. (Views use it only when present, so a source written
        before summaries existed still works with every other view.)
        """
        ...


class SourceBase:
    """The bookkeeping every source shares: identity, seq range, bounds, rows read.

    Subclasses set the attributes in ``__init__`` and implement the reads.
    """

    _cid: str
    _first: int
    _last: int
    _max_score: float
    _token_total: int
    rows_read: int

    @property
    def conversation_id(self) -> str:
        """The conversation's id."""
        return self._cid

    @property
    def first_seq(self) -> int:
        """Seq of the oldest stored message."""
        return self._first

    @property
    def last_seq(self) -> int:
        """Seq of the newest stored message."""
        return self._last

    @property
    def message_count(self) -> int:
        """Number of stored messages."""
        return self._last - self._first + 1

    @property
    def max_score(self) -> float:
        """An upper bound of every stored base score."""
        return self._max_score

    @property
    def token_total(self) -> int:
        """Sum of the stored per-message token counts."""
        return self._token_total

    def latest_summary(self) -> Summary | None:
        """The newest summary (none, unless the subclass stores summaries)."""
        return None


def _check_items(items: object, kind: type, what: str, expected: str) -> None:
    """Refuse ``items`` unless it is a sequence (a list, say) of ``kind`` objects."""
    if not isinstance(items, Sequence) or isinstance(items, (str, bytes, bytearray)):
        raise InvalidInputError(f"{what} must be a list of {expected}, not {type(items).__name__}")
    for index, item in enumerate(items):
        if not isinstance(item, kind):
            raise InvalidInputError(
                f"{what}[{index}] is a {type(item).__name__}, not a {expected}")


class ListHistory(SourceBase):
    """A [`HistorySource`][memstore.HistorySource] over an in-memory list of stored messages.

    Args:
        messages: one conversation's messages with contiguous seqs, in any order.
        summaries: the conversation's stored summaries (any order); the newest one
            ending at or before the newest message is `latest_summary()`.

    Raises:
        InvalidInputError: the messages are not stored messages (a plain ``Message``
            has no seq: read them from a store, or build a window with
            ``ContextBuilder``), the summaries are not [`Summary`][memstore.Summary] objects, the
            messages and summaries mix conversations, or the seqs are not contiguous.
            (It is a ``ValueError`` too.)
    """

    def __init__(
        self, messages: Sequence[StoredMessage], *, summaries: Sequence[Summary] = ()
    ) -> None:
        _check_items(messages, StoredMessage, "messages", "StoredMessage (read from a store)")
        _check_items(summaries, Summary, "summaries", "Summary")
        ordered = sorted(messages, key=lambda m: m.seq)
        ids = {m.conversation_id for m in ordered}
        if len(ids) > 1:
            raise InvalidInputError(f"messages belong to several conversations: {sorted(ids)}")
        for a, b in itertools.pairwise(ordered):
            if b.seq != a.seq + 1:
                raise InvalidInputError(
                    f"seqs are not contiguous: {a.seq} is followed by {b.seq}")
        owners = sorted({s.conversation_id for s in summaries})
        if len(owners) > 1 or (ordered and owners and owners[0] != ordered[0].conversation_id):
            mine = f" and the messages to {ordered[0].conversation_id!r}" if ordered else ""
            raise InvalidInputError(
                f"the summaries belong to {', '.join(map(repr, owners))}{mine}: a history "
                "is one conversation's messages and summaries")
        self._messages = ordered
        self._cid = ordered[0].conversation_id if ordered else ""
        self._first = ordered[0].seq if ordered else 1
        self._last = self._first + len(ordered) - 1
        self._max_score = max([1.0, *(m.score for m in ordered)])
        self._token_total = sum(m.token_count for m in ordered)
        self.rows_read = 0
        self._summaries = sorted(summaries, key=lambda s: s.number)

    @property
    def newest_created_at(self) -> datetime | None:
        """``created_at`` of the newest message."""
        return self._messages[-1].created_at if self._messages else None

    def _slice(self, start: int, stop: int) -> list[StoredMessage]:
        lo = max(start, self._first) - self._first
        hi = min(stop, self.last_seq + 1) - self._first
        out = self._messages[lo:hi] if hi > lo else []
        self.rows_read += len(out)
        return out

    def anchored(self) -> list[StoredMessage]:
        """Every anchored message, chronological."""
        out = [m for m in self._messages if m.anchored]
        self.rows_read += len(out)
        return out

    def read(self, start: int, stop: int) -> list[StoredMessage]:
        """Messages with ``start <= seq < stop``."""
        return self._slice(start, stop)

    def latest_summary(self) -> Summary | None:
        """The newest summary ending at or before the newest message."""
        for summary in reversed(self._summaries):
            if summary.last_seq <= self._last or not self._messages:
                return summary
        return None

    def read_newest_first(self, before: int, limit: int) -> list[StoredMessage]:
        """Up to ``limit`` messages older than ``before``, newest first."""
        if limit <= 0:
            return []
        stop = min(before, self.last_seq + 1)
        return list(reversed(self._slice(max(self._first, stop - limit), stop)))
