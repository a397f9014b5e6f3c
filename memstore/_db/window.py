"""The window's read path: one conversation's rows as a [`HistorySource`][memstore.HistorySource].

`SQLHistory` serves a view's reads from precompiled statements on the DBAPI
cursor, with the row cache (`memstore._db.cache`); `window()` runs a view over it.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import Connection

from memstore._db import statements as q
from memstore._db.cache import RowCache
from memstore._db.rows import decode_raw, run_raw, to_summary
from memstore.errors import ConversationNotFoundError
from memstore.models import StoredMessage, Summary
from memstore.views.base import checked_window
from memstore.views.history import ListHistory, SourceBase

__all__ = ["UNTRUSTED_EPOCH", "SQLHistory", "StaleRead", "window"]


#: The epoch of conversations written before migration 0002 (its server default):
#: nothing guarantees it changed with their rows, so windows trust no cache for them.
UNTRUSTED_EPOCH = 0


class StaleRead(Exception):
    """A window read outside a transaction saw its conversation change under it.

    Internal: the store reads the window again in one snapshot transaction.
    """


class SQLHistory(SourceBase):
    """A [`HistorySource`][memstore.HistorySource] over one conversation's rows.

    Every read is an indexed range on ``(conversation_id, seq)``; anchored messages
    come through the partial index, with the conversation row. The statements are
    precompiled per dialect (see `memstore._db.statements.hot()`) and run on the
    DBAPI cursor.

    With a `RowCache`, rows decoded by earlier windows of the
    same conversation are reused while the conversation's epoch is unchanged (see
    `memstore._db.cache`): only missing seqs are read from the database, and
    `remember()` stores what this window decoded. ``rows_read`` counts the rows
    returned to the view, ``rows_cached`` those of them that came from the cache.

    **Reads without a transaction.** On a connection with no transaction open, each
    statement is its own snapshot. The first one reads the conversation row (seq
    range, epoch) and its anchored messages; every later range read carries the
    condition "the epoch is still the one read first". Rows of ``[first_seq,
    last_seq]`` change only together with the epoch, so while it holds each range
    returns exactly the rows that snapshot held; if it changed in between, the range
    comes back short and `StaleRead` makes the store read again in one
    snapshot transaction. A warm window thus costs one statement and no ``BEGIN``
    or ``COMMIT``: one round trip on PostgreSQL instead of three.

    **The first page comes with the first statement.** Given the ``budget`` of a
    budgeted view, the first statement also returns the conversation's newest
    messages, as many as the view's first page asks for (estimated in SQL from the
    conversation's counts, see ``memstore._db.statements._conversation_page``; the view
    learns the number through `first_page_for()`). Rows the cache holds under the
    current epoch are left out. A cold window thus also costs one statement (one round
    trip) as long as its first page holds it.
    """

    def __init__(self, conn: Connection, cid: str, cache: RowCache | None = None,
                 budget: int | None = None) -> None:
        self._conn = conn
        self._dialect = conn.dialect
        # The DBAPI connection (for asyncio drivers, SQLAlchemy's sync adapter of it).
        dbapi = conn.connection.dbapi_connection
        assert dbapi is not None  # a checked-out, open connection
        self._dbapi = dbapi
        self._aiosqlite = (
            conn.connection.driver_connection if conn.dialect.driver == "aiosqlite" else None
        )
        self._decode = "sqlite" if conn.dialect.name == "sqlite" else "postgresql"
        self._checked = not conn.in_transaction()
        if self._checked and getattr(conn.connection.driver_connection, "in_transaction", False):
            # A connection shared with an open write (SQLite ``:memory:`` shares one
            # connection): reading without BEGIN would see uncommitted rows. Take the
            # snapshot path, which refuses to start inside another transaction.
            raise StaleRead(cid)
        entry = cache.get(cid) if cache is not None else None
        self._page_budget = budget
        self._page = 0
        page_rows: Sequence[Any] = ()
        if budget is None:
            # One statement: the conversation's bookkeeping and its anchored messages.
            rows = self._execute("conversation", {"cid": cid})
            offset = 5
        else:
            # The same, and the newest page (less what the cache holds): one statement.
            both = self._execute("conversation_page", {
                "cid": cid, "budget": float(budget),
                "cached_epoch": entry.epoch if entry is not None else None,
                "cached_last": entry.last_seq if entry is not None else 0,
            })
            offset = q.PAGE_HEAD_COLUMNS - 1
            # The conversation row with each anchored message, chronological (the
            # compound statement has no order): the row without one sorts first.
            rows = sorted((r for r in both if r[6] == 0),
                          key=lambda r: -1 if r[offset] is None else int(r[offset]))
            page_rows = [r for r in both if r[6] != 0]
        if not rows:
            raise ConversationNotFoundError(cid)
        head = rows[0]
        self._cid: str = cid
        self._first = int(head[0])
        self._last = int(head[1])
        self._max_score = float(head[2])
        self._token_total = int(head[3])
        self._epoch = int(head[4])
        if self._epoch == UNTRUSTED_EPOCH:
            # Written before migration 0002 (or by a process that predates it): writes
            # may have changed rows without a new epoch. No cache, one snapshot.
            if self._checked:
                raise StaleRead(cid)
            cache = None
            entry = None
        self._cache = cache
        if entry is not None and entry.epoch != self._epoch:
            assert cache is not None
            cache.discard(cid)  # rewritten since: nothing in it can be used again
            entry = None
        # The rows the cache held (a hit is a row served from these, not one this
        # window decoded and served again).
        self._from_cache: dict[int, StoredMessage] = entry.rows if entry is not None else {}
        # Seq -> decoded row. Shared with the cache (never mutated) until this window
        # decodes a row of its own; then it is copied once.
        self._known: dict[int, StoredMessage] = entry.rows if entry is not None else {}
        # The newest seq in ``_known``, kept up to date row by row for the cache entry
        # (a max over every cached row at each put would cost as much as the window).
        self._newest_known = entry.last_seq if entry is not None else 0
        self._shared = entry is not None
        self._decoded = 0
        self._anchored: list[StoredMessage] = []
        if budget is not None:
            self._page = int(head[5])
        for r in rows:
            if r[offset] is None:  # the outer join's row when nothing is anchored
                continue
            message = self._known.get(int(r[offset]))
            if message is None:
                message = decode_raw(r[offset:], self._decode, cid)
                self._add(message)
            self._anchored.append(message)
        self._anchored_cached = len(self._anchored) - self._decoded
        # Rows read from the database but not decoded yet (seq -> the row's message
        # columns): a row is decoded only when the view takes it, so the slack of a page
        # costs its SQL, not its model.
        self._raw: dict[int, Sequence[Any]] = {}
        for r in page_rows:
            seq = int(r[offset])
            if seq not in self._known:  # an anchored row is in both parts
                self._raw[seq] = r[offset:]
        self._newest: datetime | None = None
        self._newest_loaded = False
        self.rows_read = 0
        self.rows_cached = 0
        self._summary: Summary | None = None
        self._summary_read = False

    def _execute(self, name: str, values: dict[str, Any]) -> Sequence[Any]:
        """Run a precompiled hot statement on the DBAPI cursor; all its rows.

        Inside the caller's transaction if one is open, else autocommitting. Going
        around SQLAlchemy's result objects matters here: for textual SQL they build
        column metadata on every execution, which costs more than the query.
        """
        compiled = q.hot(self._dialect, name)
        return run_raw(self._conn, self._dbapi, self._aiosqlite, compiled.sql,
                       compiled.params(values))

    def first_page_for(self, token_limit: int) -> int | None:
        """The first page a view with this budget should read: what came prefetched.

        ``None`` for another budget (or none): the view then sizes its page itself.
        """
        return self._page if token_limit == self._page_budget and self._page else None

    @property
    def epoch(self) -> int:
        """The conversation's epoch, as read with its row."""
        return self._epoch

    def latest_summary(self) -> Summary | None:
        """The newest stored summary ending at or before ``last_seq`` (one indexed read).

        Outside a transaction the read carries the epoch check of the range reads: a
        conversation rewritten since its row was read raises `StaleRead`.
        Summaries stored after that row was read are used when their range lies
        within the snapshot's messages (they summarize exactly those rows).
        """
        if not self._summary_read:
            rows = self._execute("latest_summary",
                                 {"cid": self._cid, "last": self._last, "epoch": self._epoch})
            if not rows:
                raise StaleRead(self._cid)
            row = rows[0]
            self._summary = None if row[0] is None else to_summary((self._cid, *row))
            self._summary_read = True
        return self._summary

    def _add(self, message: StoredMessage) -> None:
        if self._shared:
            self._known = dict(self._known)
            self._shared = False
        self._known[message.seq] = message
        if message.seq > self._newest_known:
            self._newest_known = message.seq
        self._decoded += 1

    def _fetch(self, start: int, stop: int) -> None:
        """Read ``[start, stop)`` (inside the stored range) into the undecoded rows."""
        if self._checked:
            rows = self._execute("range_checked", {
                "cid": self._cid, "start": start, "stop": stop, "epoch": self._epoch,
            })
            if len(rows) != stop - start:
                raise StaleRead(self._cid)
        else:
            rows = self._execute("range", {"cid": self._cid, "start": start, "stop": stop})
        raw = self._raw
        for r in rows:
            raw[r[0]] = r

    def _fetch_missing(self, start: int, stop: int) -> None:
        """Read every run of ``[start, stop)`` that is neither decoded nor read yet."""
        known, raw = self._known, self._raw
        missing_from = None
        for seq in range(start, stop + 1):  # one past the end closes a trailing run
            if seq < stop and seq not in known and seq not in raw:
                if missing_from is None:
                    missing_from = seq
            elif missing_from is not None:
                self._fetch(missing_from, seq)
                missing_from = None

    def _take(self, seq: int) -> StoredMessage:
        """The message at ``seq`` (read already): decoded now unless it was before."""
        message = self._known.get(seq)
        if message is None:
            message = decode_raw(self._raw.pop(seq), self._decode, self._cid)
            self._add(message)
        return message

    def _range(self, start: int, stop: int) -> list[StoredMessage]:
        """Messages in ``[start, stop)`` (clipped to the stored range), chronological."""
        start = max(start, self._first)
        stop = min(stop, self._last + 1)
        if stop <= start:
            return []
        decoded_before = self._decoded
        known = self._known
        seqs = range(start, stop)
        if all(map(known.__contains__, seqs)):  # all cached, or decoded by this window
            out = [known[seq] for seq in seqs]
        else:
            self._fetch_missing(start, stop)
            take = self._take
            out = [take(seq) for seq in seqs]
        self.rows_read += len(out)
        if known is self._from_cache:  # nothing decoded before: known rows are the cache's
            self.rows_cached += len(out) - (self._decoded - decoded_before)
        elif self._from_cache:
            self.rows_cached += sum(map(self._from_cache.__contains__, seqs))
        return out

    def stream_newest_first(self, before: int, floor: int, first_page: int,
                            max_page: int) -> Iterator[StoredMessage]:
        """Messages with ``floor <= seq < before``, newest first, decoded as they are taken.

        The optional streaming hook of a source (see `memstore.views.units.ReverseReader`):
        rows come from the database a page at a time (``first_page`` rows, doubling up to
        ``max_page``; a page that came with the first statement counts as the first), but
        each becomes a model only when the consumer takes it, so a view that stops early
        pays nothing for the rest of its last page but the SQL.
        """
        before = min(before, self._last + 1)
        floor = max(floor, self._first)
        page = max(1, first_page)
        raw, dialect, cid, from_cache = self._raw, self._decode, self._cid, self._from_cache
        if before - 1 in raw:  # the first page came with the first statement (PostgreSQL)
            page = min(page * 2, max(page, max_page))
        seq = before - 1
        while seq >= floor:
            # Read again at every step: a read between two steps may have copied it.
            known = self._known
            message = known.get(seq)
            if message is None:
                if seq not in raw:
                    # The run of unread rows ending here, at most a page of it.
                    low = max(floor, seq + 1 - page)
                    start = seq
                    while start > low and start - 1 not in known and start - 1 not in raw:
                        start -= 1
                    self._fetch(start, seq + 1)
                    page = min(page * 2, max(page, max_page))
                message = decode_raw(raw.pop(seq), dialect, cid)
                self._add(message)
            elif known is from_cache or seq in from_cache:  # not decoded by this window
                self.rows_cached += 1
            self.rows_read += 1
            yield message
            seq -= 1

    @property
    def newest_created_at(self) -> datetime | None:
        """``created_at`` of the newest message (one indexed lookup, on first use)."""
        if not self._newest_loaded:
            self._newest_loaded = True
            if self._last >= self._first:
                rows = self.read(self._last, self._last + 1)
                self._newest = rows[0].created_at if rows else None
        return self._newest

    def anchored(self) -> list[StoredMessage]:
        """Anchored messages, chronological (read with the conversation row)."""
        self.rows_read += len(self._anchored)
        self.rows_cached += self._anchored_cached
        return list(self._anchored)

    def read(self, start: int, stop: int) -> list[StoredMessage]:
        """Messages in ``[start, stop)``, chronological."""
        return self._range(start, stop)

    def read_newest_first(self, before: int, limit: int) -> list[StoredMessage]:
        """Up to ``limit`` messages older than ``before``, newest first."""
        if limit <= 0:
            return []
        before = min(before, self._last + 1)
        page = self._range(max(self._first, before - limit), before)
        page.reverse()
        return page

    def remember(self) -> None:
        """Store the rows this window decoded in the cache (a no-op without one)."""
        if self._cache is None:
            return
        self._cache.record(self.rows_cached, self._decoded)
        if self._decoded:
            self._cache.put(self._cid, self._epoch, self._known, self._newest_known)


def window(conn: Connection, cid: str, view: Any, counter: Any,
           cache: RowCache | None = None) -> Any:
    """Select a window through ``view`` (pure) over this conversation's rows.

    Runs in a read transaction, or with none (see `SQLHistory`); never in a
    write transaction, so the rows it caches are committed ones.
    """
    budget = None
    if conn.dialect.name == "postgresql" and getattr(view, "budgeted", False):
        # The first page comes with the first statement: one round trip instead of two.
        # Not on SQLite, where a statement costs no round trip and SQLite runs the
        # compound statement slower than the two simple ones (0.38 against 0.34 ms per
        # cold 4k window over 2,000 conversations, measured side by side).
        limit = getattr(view, "token_limit", None)
        budget = limit if isinstance(limit, int) else None
    try:
        source = SQLHistory(conn, cid, cache, budget)
    except ConversationNotFoundError:
        # Never written: the view over an empty history, and a report that says so.
        empty = checked_window(view, view.select(ListHistory([]), counter))
        report = empty.report.model_copy(update={"conversation_exists": False})
        return empty.model_copy(update={"report": report, "conversation_id": cid})
    result = checked_window(view, view.select(source, counter))
    source.remember()
    return result
