"""``rewrite``, planned: what replacing the newest messages changes (no SQL here).

`memstore._db.ops.rewrite()` runs the transaction: with the conversation row locked it
reads the messages, calls the caller's function (wrapped by
`memstore._base.RewriteCall`, which checks its result and counts its tokens)
through `call()`, and writes what `compare()`, `message_rows()` and
`totals()` work out. The function is called *inside* the transaction, so no other
writer can slip a message in between the read and the write.

The rules:

* The replacement is stored at contiguous seqs from the first seq read (after the
  last stored seq when nothing was read).
* Rows that would not change (a leading run of the replacement that is the read
  messages, unchanged in every stored field) stay in place; when nothing changes at
  all, nothing is written.
* Summaries whose ``last_seq`` is at or after the first position where the old and the
  new sequences differ in content (not the same id with the same content) describe
  replaced messages: they are deleted.
* The conversation row gets its new ``last_seq``, token total, ``max_score``,
  ``updated_at`` and a new epoch (every row cache, in every process, drops the
  conversation's rows), unless the rewrite only appended (every row read stays as it
  was), which leaves the epoch as an append does.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any, NamedTuple

from sqlalchemy import Connection
from sqlalchemy.util import await_only

from memstore._db.rows import Prepared, message_row, new_message_ids
from memstore._validate import MAX_SEQ, conversation_full
from memstore.errors import ConflictError
from memstore.models import Message, StoredMessage

__all__ = ["Diff", "Replace", "Replacement", "call", "check_room", "compare", "message_rows",
           "taken_id", "totals"]


class Replacement(NamedTuple):
    """One message of a rewrite's result, checked and counted, ready to store.

    Attributes:
        message: what is stored (role, content, name, tool calls, score, pin, metadata).
        id: its message id; ``None``: a new store-assigned id.
        created_at: the timestamp it keeps; ``None``: the time of the rewrite.
        token_count: its token count.
        token_counter: the name of the counter that made ``token_count``.
    """

    message: Message
    id: str | None
    created_at: datetime | None
    token_count: int
    token_counter: str


#: What the rewrite calls with the messages it read (chronological): the checked,
#: counted replacement (see `memstore._base.RewriteCall`).
Replace = Callable[[list[StoredMessage]], list[Replacement]]


def call(conn: Connection, replace: Replace, read: list[StoredMessage]) -> list[Replacement]:
    """``replace(read)``; on asyncio in a worker thread, so the event loop keeps running.

    (The transaction stays open meanwhile: inside ``run_sync`` the greenlet awaits the
    thread as it awaits the driver.)
    """
    if conn.dialect.is_async:
        return await_only(asyncio.to_thread(replace, read))
    return replace(read)


class Diff(NamedTuple):
    """How a replacement compares with the messages read, position by position.

    Attributes:
        keep: leading positions whose rows stay exactly as stored.
        same: leading positions with the same id and the same content (summaries of
            seqs before the first other position still describe the stored messages);
            ``None`` when every position has the same content.
        unchanged: nothing changes at all (nothing is written).
        appended: every message read stays as it was; the rewrite only adds after it.
    """

    keep: int
    same: int | None
    unchanged: bool
    appended: bool


def _same_row(new: Replacement, old: StoredMessage) -> bool:
    m = new.message
    return (new.id == old.id and new.created_at == old.created_at
            and m.score == old.score and m.pinned == old.pinned
            and new.token_count == old.token_count and new.token_counter == old.token_counter
            and m.same_content(old))


def _same_content(new: Replacement, old: StoredMessage) -> bool:
    return new.id == old.id and new.message.same_content(old)


def _prefix(new: Sequence[Replacement], old: Sequence[StoredMessage],
            same: Callable[[Replacement, StoredMessage], bool]) -> int:
    n = 0
    for r, o in zip(new, old):
        if not same(r, o):
            break
        n += 1
    return n


def compare(new: Sequence[Replacement], old: Sequence[StoredMessage]) -> Diff:
    """Compare a replacement with the messages it replaces."""
    keep = _prefix(new, old, _same_row)
    same = _prefix(new, old, _same_content)
    return Diff(keep, same if same < max(len(old), len(new)) else None,
                keep == len(old) == len(new), keep == len(old))


def check_room(cid: str, start: int, count: int) -> None:
    """Refuse a replacement whose seqs would pass `MAX_SEQ` (ConflictError)."""
    if start + count - 1 > MAX_SEQ:
        raise conversation_full(cid, "the rewrite")


def taken_id(cid: str, start: int, found: dict[str, StoredMessage]) -> ConflictError | None:
    """The error for replacement ids already used before seq ``start`` (``None``: none is).

    ``found``: the stored messages with the replacement's ids, by id.
    """
    taken = {mid: m.seq for mid, m in found.items() if m.seq < start}
    if not taken:
        return None
    mid = min(taken, key=taken.__getitem__)
    return ConflictError(
        f"message id {mid!r} is already the id of seq {taken[mid]} in conversation {cid!r}, "
        "which the rewrite does not replace (message ids are unique within a conversation)"
    )


def message_rows(cid: str, start: int, tail: Sequence[Replacement],
                 now: datetime) -> list[dict[str, Any]]:
    """Insert rows of ``tail`` at seqs from ``start`` (new ids and ``now`` where unset)."""
    fresh = iter(new_message_ids(sum(r.id is None for r in tail)))
    return [message_row(cid, start + offset, Prepared(r.message, r.token_count),
                        r.id if r.id is not None else next(fresh), r.token_counter,
                        r.created_at if r.created_at is not None else now)
            for offset, r in enumerate(tail)]


def totals(conv: Any, whole: bool, new: Sequence[Replacement], diff: Diff,
           old: Sequence[StoredMessage]) -> tuple[int, float]:
    """The conversation's token total and ``max_score`` after the rewrite.

    ``whole``: every stored message was read, so ``max_score`` is recomputed exactly;
    otherwise it stays an upper bound (raised by the new scores).
    """
    tail = new[diff.keep:]
    tokens = (int(conv.token_count) - sum(m.token_count for m in old[diff.keep:])
              + sum(r.token_count for r in tail))
    scores = [r.message.score for r in (new if whole else tail)]
    return tokens, max([1.0 if whole else float(conv.max_score), *scores])
