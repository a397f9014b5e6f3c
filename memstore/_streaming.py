"""Streams of a conversation's messages, shared by both stores (no store state).

``iter_messages``, ``dump_state`` and ``restore_state`` page through a conversation by
keyset: the argument checks, the paging (`Pager`), one page's read on a connection
(`read_stream_page`) and the plan of a restore. Split from `memstore._base` by concern.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Connection

from memstore._base import Plan, Planner, check_bound, check_conversation_id
from memstore._db import snapshots as _snapshots
from memstore._db.engine import apply_options, read_options
from memstore._validate import short_repr as _short
from memstore.errors import ConversationNotFoundError, InvalidInputError
from memstore.models import Conversation, ConversationState, StoredMessage, Summary

#: Default keyset page size of ``iter_messages``/``dump_state``.
DEFAULT_PAGE_SIZE = 1000


def check_page_args(
    conversation_id: Any, start: Any, stop: Any, page_size: Any
) -> tuple[str, int | None, int | None, int]:
    """Validate ``iter_messages`` arguments."""
    cid = check_conversation_id(conversation_id)
    start = check_bound(start, "start")  # clamped like messages()'s: 2**70 means "all"
    stop = check_bound(stop, "stop")
    if (not isinstance(page_size, int) or isinstance(page_size, bool)
            or not 1 <= page_size <= 100_000):
        raise InvalidInputError(f"page_size must be an int in [1, 100000], got {_short(page_size)}")
    return cid, start, stop, page_size


def snapshot_pages(engine_url: Any) -> bool:
    """Whether a stream reads all its pages from one snapshot (held read transaction).

    Not on an in-memory SQLite database: its one shared connection could not write
    while a read transaction is open on it, so there each page is its own read.
    """
    return not (engine_url.get_backend_name() == "sqlite"
                and engine_url.database in (None, "", ":memory:"))


class Pager:
    """The keyset paging of a stream, shared by both stores (no I/O).

    ``after`` is the seq the next page starts after (``None``: the first page). When
    pages are separate reads (no held snapshot: an in-memory database), the first
    page's header fixes the newest seq the stream returns, so messages appended
    meanwhile are not returned. (Without a snapshot, a message that ``pop`` removed
    meanwhile and an append replaced under the same seq is returned as it is now.)
    """

    def __init__(self, size: int, snapshot: bool) -> None:
        self.size = size
        self.snapshot = snapshot
        self.after: int | None = None
        self._last: int | None = None  # the header's newest seq (separate reads)

    def take(self, page: list[StoredMessage],
             last_seq: int | None) -> tuple[list[StoredMessage], bool]:
        """The part of a page read to return, and whether another page follows.

        ``last_seq``: the newest seq the first page's header read (``None`` later).
        """
        full = len(page) == self.size
        if last_seq is not None and not self.snapshot:
            self._last = last_seq
        last = self._last
        if last is not None and page and page[-1].seq >= last:
            page = [m for m in page if m.seq <= last]
            full = False
        if full:
            self.after = page[-1].seq
        return page, full


def read_stream_page(
    conn: Connection, pager: Pager, cid: str, start: int | None, stop: int | None,
    summaries: list[Summary] | None, missing_ok: bool = False,
) -> tuple[Conversation | None, list[StoredMessage], bool]:
    """The next page of a stream on ``conn``: (header or ``None``, messages, more to come).

    Both stores' streams read their pages through this (the async one in ``run_sync``).
    The first read on a connection begins its snapshot: ``REPEATABLE READ READ ONLY`` on
    PostgreSQL, a read transaction on SQLite. With ``summaries`` given, the first page
    also reads the conversation's summaries into that list (the header's snapshot).
    With ``missing_ok``, a conversation that was never written is one empty last page
    (``iter_messages``); otherwise it is a ConversationNotFoundError (export, state).
    """
    if not conn.in_transaction():
        apply_options(conn, read_options(conn.dialect.name, snapshot=True))
        conn.begin()
    try:
        head, page, last_seq = _snapshots.read_page(
            conn, cid, start, stop, pager.after, pager.size,
            summaries if pager.after is None else None)
    except ConversationNotFoundError:
        if not missing_ok:
            raise
        return None, [], False
    page, more = pager.take(page, last_seq)
    return head, page, more


def restore_plan(
    planner: Planner, state: Any, conversation_id: Any, replace: Any
) -> tuple[Plan, Any, int]:
    """The plan of ``restore_state`` for an in-memory snapshot: (plan, recounter, count)."""
    recounter = _snapshots.Recounter(planner.counter)
    plan = planner.load_state(state, conversation_id, replace, recounter)
    return plan, recounter, plan.prepare_items


def stream_target(conversation_id: Any, head: ConversationState) -> str:
    """The conversation a snapshot file is loaded into (its own id unless one is given)."""
    return check_conversation_id(
        head.conversation.id if conversation_id is None else conversation_id)
