"""Snapshots in and out: state, keyset pages, and loads in bounded batches.

Functions on a SQLAlchemy ``Connection``, like `memstore._db.ops` (whose write and
read primitives they use), that move a whole conversation at a time:
``save_state``/``load_state``, the keyset pages ``iter_messages`` and exports read,
and the `Loader` that imports and streamed ``load_state`` write with, one
batch at a time, recounting every message (`Recounter`). Each runs inside the
caller's one transaction.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import Connection, Row
from sqlalchemy import exc as sa_exc

from memstore._db import ops as _ops
from memstore._db import statements as q
from memstore._db.rows import Prepared, message_row, to_conversation, to_stored, utcnow
from memstore._validate import check_counter_name, check_token_count
from memstore.errors import ConflictError, InvalidInputError
from memstore.models import (
    Conversation,
    ConversationState,
    StoredMessage,
    Summary,
    repeated_id,
)

__all__ = [
    "Loader",
    "Recounter",
    "check_stream_summaries",
    "create_conversation",
    "load_state",
    "load_stream",
    "merge_summaries",
    "read_page",
    "recount",
    "save_state",
]


def save_state(
    conn: Connection, cid: str, view_config: dict[str, Any] | None
) -> ConversationState:
    """Snapshot one conversation (every message) as a ConversationState."""
    conv = _ops.conversation_row(conn, cid)
    msgs = [to_stored(r) for r in conn.execute(q.messages_range(cid))]
    return ConversationState(
        conversation=to_conversation(conv), messages=msgs, view=view_config,
        summaries=_ops.list_summaries(conn, cid),
    )


def recount(recounter: Recounter, messages: Sequence[StoredMessage]) -> list[StoredMessage]:
    """``messages`` with their counts recomputed (snapshots are not trusted)."""
    return [m.model_copy(update={"token_count": n, "token_counter": name})
            for m, (n, name) in zip(messages, recounter.count_batch(messages))]


def load_state(
    conn: Connection, state: ConversationState, cid: str, replace: bool,
    recounted: list[StoredMessage] | None = None,
) -> Conversation:
    """Write a snapshot into conversation ``cid`` (one transaction).

    ``replace=True`` makes the conversation exactly the snapshot (seqs, timestamps,
    scores, token counts, client ids kept). ``replace=False`` appends the snapshot's
    messages after the stored ones (new seqs; everything else kept). ``recounted``:
    the snapshot's messages with counts recomputed by `recount()`, stored instead
    of ``state.messages``.
    """
    src = state.messages if recounted is None else recounted
    if src and src[-1].seq - src[0].seq + 1 != len(src):
        raise InvalidInputError("state messages must have contiguous seqs")
    dialect = conn.dialect.name
    c = state.conversation
    first = src[0].seq if src else first_seq_without_messages(state.summaries)
    fresh = {
        "id": cid, "created_at": c.created_at, "updated_at": c.updated_at,
        "metadata": dict(c.metadata), "first_seq": first, "last_seq": first + len(src) - 1,
        "token_count": sum(m.token_count for m in src),
        "max_score": max([1.0, *(m.score for m in src)]),
        "epoch": q.new_epoch(),
    }
    existing = conn.execute(q.conversation(cid, for_update=True)).first()
    created = False
    if existing is None:
        existing = create_conversation(conn, cid, fresh)
        created = existing is None
    if created or replace:
        if existing is not None:  # (not created: it was there, and is replaced)
            replace_conversation(conn, cid, existing, fresh)
        seqs = [m.seq for m in src]
    else:
        assert existing is not None
        if not src:
            return to_conversation(existing)
        top = max([1.0, *(m.score for m in src)])
        last = _ops.allocated(conn.execute(*q.allocate_seqs(
            dialect, cid, utcnow(), len(src), sum(m.token_count for m in src), top
        )).scalar(), cid, len(src))
        seqs = list(range(last - len(src) + 1, last + 1))
    rows = []
    for m, seq in zip(src, seqs):
        row = message_row(cid, seq, Prepared(m, m.token_count), m.id, m.token_counter,
                           m.created_at)
        rows.append(row)
    # (into a new conversation no id can clash: a snapshot's ids are unique)
    _insert_rows(conn, cid, rows, appending=not (created or replace))
    if created or replace:
        write_state_summaries(conn, cid, state.summaries)
    return to_conversation(_ops.conversation_row(conn, cid))


def replace_conversation(conn: Connection, cid: str, existing: Row[Any],
                         values: dict[str, Any]) -> None:
    """Empty a locked conversation (row ``existing``) and give its row ``values``.

    The row is updated, not deleted and inserted again: on PostgreSQL a writer waiting
    for its lock (an append, ``pop``, ``clear``, ``set_score``) would find a deleted row
    and raise `ConversationNotFoundError` although the
    conversation exists throughout; with the row kept, it goes on with the replaced
    conversation.
    """
    _ops.delete_contents(conn, cid, existing)
    conn.execute(q.update_conversation(cid, **{k: v for k, v in values.items() if k != "id"}))


def create_conversation(conn: Connection, cid: str, values: dict[str, Any]) -> Row[Any] | None:
    """Insert a new conversation row (``None``), or return the row another writer made.

    The caller's ``SELECT ... FOR UPDATE`` found no row, which on PostgreSQL locks
    nothing: an append or another load committing meanwhile makes this INSERT a unique
    violation. It runs in a savepoint there, so the transaction survives the violation
    and goes on with that row, locked, as if it had been there from the start (a load
    into a conversation being created concurrently is not a conflict). SQLite's
    ``BEGIN IMMEDIATE`` already keeps other writers out.

    The row found after a violation can be gone by the time it is locked (a third
    writer deleted the conversation), so this tries again, a few times, before the
    violation propagates.
    """
    if conn.dialect.name != "postgresql":
        conn.execute(q.insert_conversation(values))
        return None
    for attempt in range(_CREATE_ATTEMPTS):
        try:
            with conn.begin_nested():
                conn.execute(q.insert_conversation(values))
        except sa_exc.IntegrityError:
            row = conn.execute(q.conversation(cid, for_update=True)).first()
            if row is not None:
                return row
            if attempt == _CREATE_ATTEMPTS - 1:
                raise
            continue
        return None
    raise AssertionError("unreachable")  # pragma: no cover


#: How many times `create_conversation()` inserts again when the row it collided
#: with was replaced before it could lock it.
_CREATE_ATTEMPTS = 8


def first_seq_without_messages(summaries: Sequence[Summary]) -> int:
    """The first seq of a conversation written with no messages and these summaries.

    With no messages left, seqs go on after the newest summarized one (so a summary
    never claims the seqs appended next).
    """
    return summaries[-1].last_seq + 1 if summaries else 1


def write_state_summaries(conn: Connection, cid: str, summaries: Sequence[Summary]) -> None:
    """Write a snapshot's summaries into a conversation just written from it.

    Only for a conversation created (or replaced) from the snapshot: its messages
    kept their seqs, so the summaries' seq ranges still mean the same rows. Messages
    appended to an existing conversation get new seqs, so their snapshot's summaries
    are not written.
    """
    if summaries:
        conn.execute(q.insert_summaries(), [
            {**_ops.summary_row(s), "conversation_id": cid} for s in summaries
        ])


# ---- streaming: keyset pages, loading in bounded batches --------------------------------


def read_page(
    conn: Connection, cid: str, start: int | None, stop: int | None, after: int | None,
    limit: int, summaries: list[Summary] | None = None,
) -> tuple[Conversation | None, list[StoredMessage], int | None]:
    """One keyset page: up to ``limit`` messages with ``seq > after`` in ``[start, stop)``.

    The first page (``after is None``) also reads the conversation (raising
    ConversationNotFoundError when there is none) and returns it with its newest seq;
    later pages return ``None`` for both. Each page is one indexed range read on
    ``(conversation_id, seq)``: cost and memory grow with ``limit``, not the history.
    With ``summaries`` given, the first page also reads the conversation's summaries
    into it (same snapshot as the header).
    """
    conversation = None
    last_seq = None
    if after is None:
        row = _ops.conversation_row(conn, cid)
        conversation, last_seq = to_conversation(row), int(row.last_seq)
        if summaries is not None:
            summaries.extend(_ops.list_summaries(conn, cid))
        low = start
    else:
        low = after + 1 if start is None else max(after + 1, start)
    stmt = q.messages_range(cid, start=low, stop=stop, limit=limit)
    return conversation, [to_stored(r) for r in conn.execute(stmt)], last_seq


class Recounter:
    """Recomputes the token count of every loaded message (snapshots are not trusted).

    A message counted by a counter this process can rebuild (the store's own, or one
    [`memstore.tokens.counter_from_name()`][memstore.counter_from_name] knows) is recounted with
    that counter;
    any other is recounted with the store's counter and relabelled with its name.
    ``recounted`` counts the messages whose stored count or counter changed.
    """

    def __init__(self, default: Any) -> None:
        self.default = default
        self._by_name: dict[str, Any] = {default.name: default}
        self.recounted = 0

    def _counter(self, name: str) -> Any:
        if name not in self._by_name:
            from memstore.errors import MemstoreError
            from memstore.tokens import counter_from_name

            try:
                counter = counter_from_name(name)
                # Its name tags every count it makes: one that cannot be stored (e.g.
                # "approx/1e300" rebuilds as a 300-digit name) is not used.
                check_counter_name(counter)
            except MemstoreError:
                counter = None
            self._by_name[name] = counter
        return self._by_name[name]

    def count(self, message: StoredMessage) -> tuple[int, str]:
        """``(token_count, token_counter)`` to store for ``message``."""
        from memstore.errors import MemstoreError

        counter = self._counter(message.token_counter) or self.default
        try:
            tokens = counter.count_message(message)
        except MemstoreError:
            if counter is self.default:
                raise
            self._by_name[message.token_counter] = None  # e.g. an encoding not available
            counter = self.default
            tokens = counter.count_message(message)
        return self._checked(counter, message, tokens)

    def _checked(self, counter: Any, message: StoredMessage, tokens: Any) -> tuple[int, str]:
        """``(tokens, counter name)`` with the count checked; tallies a changed count."""
        tokens = check_token_count(counter, tokens)
        if tokens != message.token_count or counter.name != message.token_counter:
            self.recounted += 1
        return tokens, counter.name

    def count_batch(self, messages: Sequence[StoredMessage]) -> list[tuple[int, str]]:
        """`count()` of each message; a batch with one counter goes through ``count_each``.

        (The default counter spreads a large batch across threads, see
        `memstore.tokens.count_each()`.) A mixed batch, or one whose counter fails,
        is counted message by message.
        """
        from memstore.errors import ConfigurationError, MemstoreError
        from memstore.tokens import count_each

        names = {m.token_counter for m in messages}
        if len(names) != 1:
            return [self.count(m) for m in messages]
        counter = self._counter(names.pop()) or self.default
        try:
            counts = count_each(counter, messages)
        except ConfigurationError:
            raise  # a count_each that breaks its contract, as extend reports it
        except MemstoreError:
            return [self.count(m) for m in messages]  # the fallbacks, message by message
        return [self._checked(counter, m, n) for m, n in zip(messages, counts)]


def _insert_rows(conn: Connection, cid: str, rows: list[dict[str, Any]], *,
                 appending: bool) -> None:
    """Insert loaded rows in chunks of `memstore._db.ops.INSERT_CHUNK`.

    ``appending``: the conversation held messages before this load, so a unique
    violation is an id it already stores (a `ConflictError` saying so);
    otherwise the violation propagates for the caller to name.
    """
    try:
        for start in range(0, len(rows), _ops.INSERT_CHUNK):
            _ops.insert_message_rows(conn, rows[start:start + _ops.INSERT_CHUNK])
    except sa_exc.IntegrityError as exc:
        if not appending:
            raise
        raise ConflictError(
            f"a message id being loaded is already stored in conversation {cid!r} (message "
            "ids are unique within a conversation): replace the conversation, or load into "
            "another"
        ) from exc


class RepeatedIdError(InvalidInputError):
    """A batch being loaded repeats a message id; ``seq`` is the repeat's (for its line)."""

    def __init__(self, message: str, seq: int) -> None:
        super().__init__(message)
        self.seq = seq


def _check_unique_ids(batch: Sequence[StoredMessage]) -> None:
    """Refuse a batch in which two messages share an id (naming both seqs)."""
    repeat = repeated_id(batch)
    if repeat is not None:
        raise RepeatedIdError(*repeat)


LoadMode = str  # "replace" | "append" | "merge"


class Loader:
    """Writes one conversation from a stream of stored messages, batch by batch.

    Runs inside the caller's (one) write transaction; holds no more than one batch.

    Modes, for a conversation that exists:

    * ``"replace"``: delete it, then write the stream as a new conversation;
    * ``"append"``: append every message after the stored ones (new seqs; a client
      id already stored is a `ConflictError`);
    * ``"merge"``: a message whose client id is stored with the same content is
      left alone (``unchanged``), a new one is appended, one stored with other
      content is a `ConflictError` (idempotent re-import).

    A conversation that does not exist is created with the header's fields, and its
    messages keep their seqs (which must then be contiguous and increasing).
    """

    def __init__(
        self, conn: Connection, cid: str, header: Conversation | None, mode: LoadMode,
        recounter: Recounter,
    ) -> None:
        self.conn = conn
        self.cid = cid
        self.mode = mode
        self.recounter = recounter
        self.written = 0
        self.unchanged = 0
        self.replaced = False
        #: Every message so far is stored at its own seq (summaries keep their meaning).
        self.aligned = True
        self.last_seq: int | None = None  # the last seq of the stream (not the stored one)
        now = utcnow()
        fresh = {
            "id": cid,
            "created_at": header.created_at if header is not None else now,
            "updated_at": header.updated_at if header is not None else now,
            "metadata": dict(header.metadata) if header is not None else {},
            "first_seq": 1, "last_seq": 0, "token_count": 0, "max_score": 1.0,
            "epoch": q.new_epoch(),
        }
        existing = conn.execute(q.conversation(cid, for_update=True)).first()
        if existing is None:
            existing = create_conversation(conn, cid, fresh)
            self.fresh = existing is None
        else:
            self.fresh = False
        if existing is not None and mode == "replace":
            replace_conversation(conn, cid, existing, fresh)
            self.replaced = True
            self.fresh = True
        self._next_seq: int | None = None
        self._first_seq = 1
        self._tokens = 0
        self._top = 1.0

    def add(self, batch: Sequence[StoredMessage]) -> None:
        """Write one batch (at most `memstore._db.ops.INSERT_CHUNK` messages is good)."""
        if not batch:
            return
        self.last_seq = batch[-1].seq
        if self.mode == "merge" and not self.fresh:
            batch = self._new_only(batch)
            if not batch:
                return
        counted = self.recounter.count_batch(batch)
        if self.fresh:
            seqs = []
            for m in batch:
                if self._next_seq is None:
                    self._first_seq = m.seq
                elif m.seq != self._next_seq:
                    raise InvalidInputError(
                        f"message seq {m.seq} follows seq {self._next_seq - 1}: the seqs of "
                        "a conversation must be contiguous and increasing"
                    )
                self._next_seq = m.seq + 1
                seqs.append(m.seq)
            self._tokens += sum(n for n, _ in counted)
            self._top = max(self._top, *(m.score for m in batch))
            _check_unique_ids(batch)
        else:
            tokens = sum(n for n, _ in counted)
            top = max(1.0, *(m.score for m in batch))
            last = _ops.allocated(self.conn.execute(*q.allocate_seqs(
                self.conn.dialect.name, self.cid, utcnow(), len(batch), tokens, top
            )).scalar(), self.cid, len(batch))
            seqs = list(range(last - len(batch) + 1, last + 1))
            self.aligned = self.aligned and seqs == [m.seq for m in batch]
        rows = [
            message_row(self.cid, seq, Prepared(m, n), m.id, name, m.created_at)
            for m, seq, (n, name) in zip(batch, seqs, counted)
        ]
        # A later batch of a fresh load may repeat an id of an earlier one. On PostgreSQL
        # it is inserted in a savepoint, so that the violation leaves the transaction
        # usable for the read that names the repeat (SQLite undoes the failed statement
        # only, and the rows this batch inserted before it are told apart by their seq).
        later = self.fresh and self.written > 0
        try:
            if later and self.conn.dialect.name == "postgresql":
                with self.conn.begin_nested():
                    _insert_rows(self.conn, self.cid, rows, appending=False)
            else:
                _insert_rows(self.conn, self.cid, rows, appending=not self.fresh)
        except sa_exc.IntegrityError as exc:
            # Written by this load (ids within one batch were checked above): an id
            # of this batch repeats one of an earlier batch of the same stream.
            if later:
                found = _ops.stored_by_ids(self.conn, self.cid, sorted({m.id for m in batch}))
                for m in batch:
                    prior = found.get(m.id)
                    if prior is not None and prior.seq != m.seq:
                        raise RepeatedIdError(
                            f"message id {m.id!r} is the id of seq {prior.seq} and of seq "
                            f"{m.seq}: message ids are unique within a conversation", m.seq,
                        ) from exc
            raise InvalidInputError(
                f"a message id among seqs {batch[0].seq}..{batch[-1].seq} is also the id of "
                "an earlier message: message ids are unique within a conversation"
            ) from exc
        self.written += len(rows)

    def _new_only(self, batch: Sequence[StoredMessage]) -> list[StoredMessage]:
        ids = sorted({m.id for m in batch})
        stored = _ops.stored_by_ids(self.conn, self.cid, ids)
        fresh: list[StoredMessage] = []
        seen: dict[str, StoredMessage] = {}
        for m in batch:
            prior = stored.get(m.id) or seen.get(m.id)
            if prior is None:
                seen[m.id] = m
                fresh.append(m)
            elif prior.same_content(m):
                self.unchanged += 1
                self.aligned = self.aligned and prior.seq == m.seq
            else:
                raise ConflictError(
                    f"message id {m.id!r} is already stored in conversation {self.cid!r} "
                    "with different content"
                )
        return fresh

    def finish(self, summaries: Sequence[Summary] = ()) -> Conversation:
        """Complete the conversation row; returns the conversation as stored.

        ``summaries`` (the stream's, oldest first, checked with
        `check_stream_summaries()`) are written as `load_state()` writes a
        snapshot's: only into a conversation created (or replaced) by this load.
        """
        if self.fresh:
            if self._next_seq is None:
                first = self._first_seq = first_seq_without_messages(summaries)
                count = 0
            else:
                first, count = self._first_seq, self._next_seq - self._first_seq
            self.conn.execute(q.update_conversation(
                self.cid, first_seq=first, last_seq=first + count - 1,
                token_count=self._tokens, max_score=self._top, epoch=q.new_epoch(),
            ))
            write_state_summaries(self.conn, self.cid, summaries)
        return to_conversation(_ops.conversation_row(self.conn, self.cid))


def merge_summaries(
    conn: Connection, cid: str, summaries: Sequence[Summary], aligned: bool,
) -> tuple[int, int]:
    """Write an import's summaries into a conversation that existed (merge mode).

    A summary stored with the same number and the same range and text is left alone
    (a re-import stores nothing new); one stored with the same number and anything
    else is a `ConflictError`. A new summary is written only when every
    imported message is stored at its own seq (``aligned``: its range means the same
    messages) and it extends the newest stored one; otherwise it is left out, as
    `load_state()` leaves out the summaries of appended messages.

    Returns:
        ``(written, unchanged)``.
    """
    stored = {s.number: s for s in _ops.list_summaries(conn, cid)}
    latest = max(stored.values(), key=lambda s: s.number, default=None)
    last_seq = int(_ops.conversation_row(conn, cid).last_seq)
    written = unchanged = 0
    rows = []
    for s in summaries:
        prior = stored.get(s.number)
        if prior is not None:
            if (prior.first_seq, prior.last_seq, prior.text) != (s.first_seq, s.last_seq, s.text):
                raise ConflictError(
                    f"summary {s.number} is already stored in conversation {cid!r} "
                    "with a different range or text"
                )
            unchanged += 1
            continue
        if not aligned or s.last_seq > last_seq or (latest is not None and (
            s.number < latest.number or s.first_seq > latest.first_seq
            or s.last_seq < latest.last_seq
        )):
            continue
        rows.append({**_ops.summary_row(s), "conversation_id": cid})
        latest = s
        written += 1
    if rows:
        conn.execute(q.insert_summaries(), rows)
    return written, unchanged


def check_stream_summaries(summaries: Sequence[Summary], last_seq: int | None) -> str | None:
    """Why a stream's summaries do not fit its messages (``None``: they fit).

    The rule [`ConversationState`][memstore.ConversationState] applies to a whole snapshot: the
    newest
    summary ends at or before the newest message (``last_seq``; ``None`` when the
    stream has no messages, and then any summaries fit).
    """
    if summaries and last_seq is not None and summaries[-1].last_seq > last_seq:
        s = summaries[-1]
        return (f"summary {s.number} ends at seq {s.last_seq}, after the newest message "
                f"(seq {last_seq})")
    return None


def load_stream(
    conn: Connection, head: ConversationState, messages: Any, cid: str, replace: bool,
    recounter: Recounter, batch_size: int = _ops.INSERT_CHUNK,
) -> tuple[Conversation, int]:
    """Write a streamed snapshot in batches (one transaction: the caller's).

    ``messages`` is an iterator of StoredMessage (read lazily from a file). The
    header's summaries are written as `load_state()` writes them (a replace or
    a new conversation keeps them; an append does not). Returns the stored
    conversation and how many messages were written.
    """
    loader = Loader(conn, cid, head.conversation, "replace" if replace else "append", recounter)
    batch: list[StoredMessage] = []
    for message in messages:
        batch.append(message)
        if len(batch) >= batch_size:
            loader.add(batch)
            batch = []
    loader.add(batch)
    problem = check_stream_summaries(head.summaries, loader.last_seq)
    if problem is not None:
        raise InvalidInputError(f"the snapshot's {problem}")
    return loader.finish(head.summaries), loader.written
