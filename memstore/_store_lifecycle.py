"""The lifecycle calls of both stores: listing, counting, metadata, forks, retention, erasure.

`LifecycleMethods` is part of [`MemoryStore`][memstore.MemoryStore] and
`AsyncLifecycleMethods` of [`AsyncMemoryStore`][memstore.AsyncMemoryStore]; each method
validates through the shared plans of `memstore._lifecycle` and runs them with the
store's own ``_execute``, so the two stores never diverge. See [lifecycle](lifecycle.md).
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Iterable, Mapping
from datetime import datetime, timedelta
from types import EllipsisType
from typing import TYPE_CHECKING, Any, Literal, Protocol

from sqlalchemy import Engine

from memstore import _lifecycle
from memstore._base import Plan
from memstore.models import AuditEntry, Conversation, ForgetReport, PruneReport

if TYPE_CHECKING:  # a sync store never imports SQLAlchemy's asyncio extension
    from sqlalchemy.ext.asyncio import AsyncEngine

__all__ = ["AsyncLifecycleMethods", "LifecycleMethods"]


class _Runs(Protocol):
    """What the sync methods need of their store."""

    _engine: Engine

    def _execute(self, plan: Plan) -> Any: ...


class _AsyncRuns(Protocol):
    """What the async methods need of their store."""

    _engine: AsyncEngine

    async def _execute(self, plan: Plan) -> Any: ...


def _drive(store: _Runs, steps: Generator[Plan, Any, Any]) -> Any:
    """Run a sequence of plans (each its own transaction), sending back each result."""
    plan = next(steps)
    while True:
        try:
            plan = steps.send(store._execute(plan))
        except StopIteration as stop:
            return stop.value


async def _adrive(store: _AsyncRuns, steps: Generator[Plan, Any, Any]) -> Any:
    """`_drive()` for the async store."""
    plan = next(steps)
    while True:
        try:
            plan = steps.send(await store._execute(plan))
        except StopIteration as stop:
            return stop.value


class LifecycleMethods:
    """The lifecycle calls of [`MemoryStore`][memstore.MemoryStore]."""

    def list_conversations(
        self: _Runs,
        limit: int = 100,
        after: str | Conversation | None = None,
        *,
        where: Mapping[str, str | int | bool | None] | None = None,
        parent_id: str | None = None,
        updated_after: datetime | None = None,
        updated_before: datetime | None = None,
        order: Literal["id", "updated"] = "id",
    ) -> list[Conversation]:
        """One page of conversations, ``limit`` at a time, filtered and keyset-paginated.

        ``where`` is the metadata filter shared with ``count_conversations``, ``prune``,
        ``forget`` and ``search``: equality on top-level keys, all ANDed
        (``{"user_id": "u1", "plan": "pro"}``); a value of ``None`` matches a missing
        key or JSON ``null``; a key no conversation has is simply no match. It is an
        index lookup on both databases ([lifecycle](lifecycle.md)).

        With ``order="id"`` (default) pages go by id ascending; pass the previous
        page's last id (or Conversation) as ``after``: paging visits every
        conversation that exists throughout exactly once, whatever is written
        meanwhile. Ids compare as the database compares text: by code point on
        SQLite, by the database's collation on PostgreSQL. With ``order="updated"``
        pages go newest ``updated_at`` first (ties by id, descending); pass the
        previous page's last Conversation as ``after`` (a conversation written to
        during the paging moves ahead of the cursor and is not listed again).

        Args:
            limit: conversations per page (1–10,000).
            after: where the previous page ended (see above).
            where: metadata equality filter.
            parent_id: only the forks of this conversation (``fork`` records it).
            updated_after: only conversations last written after this aware datetime.
            updated_before: only conversations last written before this aware datetime.
            order: ``"id"`` or ``"updated"``.

        Raises:
            InvalidInputError: a bad filter, bound, order, limit or cursor.
        """
        return self._execute(_lifecycle.list_plan(  # type: ignore[no-any-return]
            limit, after, where, parent_id, updated_after, updated_before, order))

    def count_conversations(
        self: _Runs,
        *,
        where: Mapping[str, str | int | bool | None] | None = None,
        parent_id: str | None = None,
        updated_after: datetime | None = None,
        updated_before: datetime | None = None,
    ) -> int:
        """How many conversations the filters of ``list_conversations`` cover."""
        return self._execute(_lifecycle.count_plan(  # type: ignore[no-any-return]
            where, parent_id, updated_after, updated_before))

    def update_conversation(
        self: _Runs,
        id: str,
        *,
        metadata: Mapping[str, Any] | None = None,
        merge: bool = True,
        expires_at: datetime | timedelta | EllipsisType | None = ...,
    ) -> Conversation:
        """Change a conversation's metadata and/or expiry (one transaction, its row locked).

        Args:
            id: the conversation.
            metadata: with ``merge=True`` (default) a shallow update of the top-level
                keys, where a value of ``None`` removes the key; with ``merge=False``
                the new metadata object, stored as given.
            merge: see ``metadata``.
            expires_at: when ``prune(expired=True)`` may delete the conversation: an
                aware datetime, a ``timedelta`` from now, or ``None`` to never expire;
                left as it is when not given.

        Returns:
            The conversation as stored afterwards (``updated_at`` is now).

        Raises:
            ConversationNotFoundError: unknown conversation.
            InvalidInputError: nothing to change, metadata that is not a JSON object
                (or too large once merged), a naive datetime.
        """
        return self._execute(_lifecycle.update_plan(  # type: ignore[no-any-return]
            id, metadata, merge, expires_at))

    def fork(
        self: _Runs,
        source_id: str,
        new_id: str | None = None,
        *,
        at_seq: int | None = None,
        metadata: Mapping[str, Any] | None = None,
    ) -> Conversation:
        """Copy a conversation up to ``at_seq`` into a new one, to try another branch.

        The fork holds the source's messages up to ``at_seq`` (default: all) with the
        same seqs, ids, timestamps, scores, pins and stored token counts, and the
        summaries whose range ends at or before ``at_seq``: one server-side
        ``INSERT ... SELECT`` per table in one transaction (nothing is decoded or
        re-tokenised, client memory stays flat). Its ``parent_id`` and
        ``forked_at_seq`` record the lineage (``list_conversations(parent_id=...)``
        lists a conversation's forks). Appends to either side never affect the other.

        Args:
            source_id: the conversation to copy.
            new_id: the fork's id (a UUID string when omitted).
            at_seq: the newest seq to copy; ``first_seq - 1`` copies no message.
            metadata: the fork's metadata (default: a copy of the source's).

        Raises:
            ConversationNotFoundError: unknown source.
            ConflictError: ``new_id`` is taken.
            InvalidInputError: ``at_seq`` outside the source's seqs, or one that would
                split a tool-call unit (a call kept without its results).
        """
        return self._execute(_lifecycle.fork_plan(  # type: ignore[no-any-return]
            source_id, new_id, at_seq, metadata))

    def prune(
        self: _Runs,
        *,
        older_than: timedelta | None = None,
        keep_last: int | None = None,
        expired: bool = False,
        where: Mapping[str, str | int | bool | None] | None = None,
        conversation_ids: Iterable[str] | None = None,
        keep_anchored: bool = True,
        keep_summaries: bool = True,
        drop_empty: bool = False,
        dry_run: bool = False,
        progress: Callable[[int], object] | None = None,
    ) -> PruneReport:
        """Delete what a retention policy covers, conversation by conversation.

        ``older_than`` deletes messages created before now − ``older_than``, except
        each conversation's newest ``keep_last`` (which wins); ``keep_last`` alone
        keeps only the newest ``keep_last``. What goes is always the oldest part of a
        conversation (seqs stay contiguous), and it ends at a unit boundary: no tool
        result outlives its call, or the reverse. ``expired=True`` deletes whole
        conversations whose ``expires_at`` has passed. See [lifecycle](lifecycle.md).

        Each conversation is pruned in its own short transaction, under its row lock,
        in bounded memory; other processes may append meanwhile (a message appended
        during the prune is deleted only if the policy covers it). Every store sees
        the deletions (counts, epochs and the row cache stay right).

        Args:
            older_than: the age past which messages go.
            keep_last: how many of each conversation's newest messages always stay.
            expired: delete the conversations whose ``expires_at`` has passed.
            where: only conversations whose metadata matches (as ``list_conversations``).
            conversation_ids: only these conversations.
            keep_anchored: keep system, developer and pinned messages (default), moved up
                to sit right before the first kept message, so windows keep them; a
                tool-call unit holding a pinned message stops the prune before it.
            keep_summaries: keep the summaries of deleted ranges (default), so
                ``SummaryView`` still shows what was there.
            drop_empty: delete a conversation left with no message.
            dry_run: count what would go; write nothing.
            progress: called with the number of conversations done since its last call.

        Raises:
            InvalidInputError: no policy ("nothing to prune": a prune never means
                "delete everything"), or a bad argument.
        """
        return _drive(self, _lifecycle.prune_steps(  # type: ignore[no-any-return]
            older_than, keep_last, expired, where, conversation_ids, keep_anchored,
            keep_summaries, drop_empty, dry_run, progress))

    def forget(
        self: _Runs,
        *,
        where: Mapping[str, str | int | bool | None] | None = None,
        conversation_ids: Iterable[str] | None = None,
        reason: str | None = None,
        vacuum: bool = False,
        dry_run: bool = False,
    ) -> ForgetReport:
        """Erase everything of one subject, with an audit entry that holds none of it.

        Deletes the selected conversations — their messages, summaries, metadata and
        search index entries — and every fork descending from them (a fork holds copies
        of its parent's messages), in one transaction, then appends an entry to the
        audit log: when, how many conversations and messages, the caller's ``reason``,
        and a sha256 digest of the selector (never its values). See
        [lifecycle](lifecycle.md) for what each database keeps until it reclaims space.

        On SQLite the deletes run with ``secure_delete`` (freed content is overwritten
        with zeros; memstore's connections always have it on), the full-text index
        drops the messages' words (in place from SQLite 3.42 when they are few beside
        the index; rebuilt from what stays when they are over a third of it; else by
        merging the whole index), and a truncating WAL checkpoint follows, so the text
        can no longer be read from the database file or its WAL (unless another
        connection holds an old snapshot at that moment; it is reclaimed at the next
        checkpoint). With
        ``vacuum=True``, a ``VACUUM`` follows: on PostgreSQL of memstore's tables, on
        SQLite of the whole file (it also clears copies that writes made before
        memstore turned ``secure_delete`` on may have left in free space: an older
        memstore, or another program, on a SQLite built with it off).

        Args:
            where: metadata equality filter (as ``list_conversations``).
            conversation_ids: conversations to erase.
            reason: why (stored in the audit entry; keep personal data out of it).
            vacuum: ``VACUUM`` after the delete (PostgreSQL: memstore's tables;
                SQLite: the database file, which takes time and disk space in
                proportion to the database).
            dry_run: delete nothing and record nothing: the report counts what would go
                now (forks included), read from one snapshot.

        Raises:
            InvalidInputError: no selector (a forget never means "delete everything"),
                or a bad argument.
        """
        return _drive(self, _lifecycle.forget_steps(  # type: ignore[no-any-return]
            where, conversation_ids, reason, vacuum, dry_run, self._engine.dialect.name))

    def audit_log(
        self: _Runs, limit: int = 100, after: int | None = None
    ) -> list[AuditEntry]:
        """The audit log (what ``forget`` erased), oldest first, after entry id ``after``."""
        return self._execute(_lifecycle.audit_plan(limit, after))  # type: ignore[no-any-return]


class AsyncLifecycleMethods:
    """The lifecycle calls of [`AsyncMemoryStore`][memstore.AsyncMemoryStore]."""

    async def list_conversations(
        self: _AsyncRuns,
        limit: int = 100,
        after: str | Conversation | None = None,
        *,
        where: Mapping[str, str | int | bool | None] | None = None,
        parent_id: str | None = None,
        updated_after: datetime | None = None,
        updated_before: datetime | None = None,
        order: Literal["id", "updated"] = "id",
    ) -> list[Conversation]:
        """One page of conversations, filtered and keyset-paginated.

        See [`MemoryStore.list_conversations()`][memstore.MemoryStore.list_conversations].
        """
        return await self._execute(_lifecycle.list_plan(  # type: ignore[no-any-return]
            limit, after, where, parent_id, updated_after, updated_before, order))

    async def count_conversations(
        self: _AsyncRuns,
        *,
        where: Mapping[str, str | int | bool | None] | None = None,
        parent_id: str | None = None,
        updated_after: datetime | None = None,
        updated_before: datetime | None = None,
    ) -> int:
        """How many conversations the filters of ``list_conversations`` cover."""
        return await self._execute(_lifecycle.count_plan(  # type: ignore[no-any-return]
            where, parent_id, updated_after, updated_before))

    async def update_conversation(
        self: _AsyncRuns,
        id: str,
        *,
        metadata: Mapping[str, Any] | None = None,
        merge: bool = True,
        expires_at: datetime | timedelta | EllipsisType | None = ...,
    ) -> Conversation:
        """Change a conversation's metadata and/or expiry.

        See [`MemoryStore.update_conversation()`][memstore.MemoryStore.update_conversation].
        """
        return await self._execute(_lifecycle.update_plan(  # type: ignore[no-any-return]
            id, metadata, merge, expires_at))

    async def fork(
        self: _AsyncRuns,
        source_id: str,
        new_id: str | None = None,
        *,
        at_seq: int | None = None,
        metadata: Mapping[str, Any] | None = None,
    ) -> Conversation:
        """Copy a conversation up to ``at_seq`` into a new one.

        See [`MemoryStore.fork()`][memstore.MemoryStore.fork].
        """
        return await self._execute(_lifecycle.fork_plan(  # type: ignore[no-any-return]
            source_id, new_id, at_seq, metadata))

    async def prune(
        self: _AsyncRuns,
        *,
        older_than: timedelta | None = None,
        keep_last: int | None = None,
        expired: bool = False,
        where: Mapping[str, str | int | bool | None] | None = None,
        conversation_ids: Iterable[str] | None = None,
        keep_anchored: bool = True,
        keep_summaries: bool = True,
        drop_empty: bool = False,
        dry_run: bool = False,
        progress: Callable[[int], object] | None = None,
    ) -> PruneReport:
        """Delete what a retention policy covers, conversation by conversation.

        See [`MemoryStore.prune()`][memstore.MemoryStore.prune].
        """
        return await _adrive(self, _lifecycle.prune_steps(  # type: ignore[no-any-return]
            older_than, keep_last, expired, where, conversation_ids, keep_anchored,
            keep_summaries, drop_empty, dry_run, progress))

    async def forget(
        self: _AsyncRuns,
        *,
        where: Mapping[str, str | int | bool | None] | None = None,
        conversation_ids: Iterable[str] | None = None,
        reason: str | None = None,
        vacuum: bool = False,
        dry_run: bool = False,
    ) -> ForgetReport:
        """Erase everything of one subject, with an audit entry that holds none of it.

        See [`MemoryStore.forget()`][memstore.MemoryStore.forget].
        """
        return await _adrive(self, _lifecycle.forget_steps(  # type: ignore[no-any-return]
            where, conversation_ids, reason, vacuum, dry_run, self._engine.dialect.name))

    async def audit_log(
        self: _AsyncRuns, limit: int = 100, after: int | None = None
    ) -> list[AuditEntry]:
        """The audit log, oldest first.

        See [`MemoryStore.audit_log()`][memstore.MemoryStore.audit_log].
        """
        return await self._execute(  # type: ignore[no-any-return]
            _lifecycle.audit_plan(limit, after))
