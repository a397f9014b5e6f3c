"""Conversation lifecycle SQL: filtered listing, metadata updates, forks, retention, erasure.

The administrative side of the store. Listing, counting, pruning and forgetting span
conversations (the documented exceptions to "every hot statement names one
conversation"): they read indexes (``memstore_conversation_keys``, the parent and
``updated_at`` indexes), page by keyset, and write in short transactions. A fork and
a per-conversation update touch one conversation.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from sqlalchemy import (
    ColumnElement,
    Connection,
    Integer,
    String,
    bindparam,
    delete,
    func,
    insert,
    literal,
    select,
    tuple_,
    update,
)

from memstore._db import erasure as _erasure
from memstore._db import search as _search
from memstore._db.filters import conversation_filter, filter_params, filter_shape, shaped_filter
from memstore._db.ops import conversation_row, delete_contents
from memstore._db.rows import conversations_from_raw, fetch_raw, to_conversation, utcnow
from memstore._db.schema import UTCDateTime, audit, conversations, messages, summaries
from memstore._db.statements import CompiledSQL, new_epoch, sum_tokens
from memstore._db.statements import update_conversation as update_row
from memstore._validate import WhereValue, check_json, check_json_size
from memstore.errors import ConflictError, ConversationNotFoundError, InvalidInputError
from memstore.models import Conversation

__all__ = [
    "Listing",
    "audit_log",
    "count_conversations",
    "fork",
    "forget",
    "forget_counts",
    "list_conversations",
    "reclaim",
    "update_conversation",
]

C = conversations.c
M = messages.c
S = summaries.c

Order = Literal["id", "updated"]


class Listing:
    """Which conversations a listing, count or sweep covers (all filters ANDed)."""

    def __init__(self, where: Mapping[str, WhereValue] | None = None,
                 parent_id: str | None = None, updated_after: datetime | None = None,
                 updated_before: datetime | None = None) -> None:
        self.where = where
        self.parent_id = parent_id
        self.updated_after = updated_after
        self.updated_before = updated_before

    def conditions(self) -> list[ColumnElement[bool]]:
        """The listing's conditions, its values bound (for a statement built per call)."""
        return self.shaped_conditions(self.params())

    def shape(self) -> tuple[Any, ...]:
        """What the listing's SQL depends on (its values are parameters)."""
        return (filter_shape(self.where), self.parent_id is not None,
                self.updated_after is not None, self.updated_before is not None)

    def params(self) -> dict[str, Any]:
        """The values of `shaped_conditions()`' parameters."""
        out = filter_params(self.where)
        out["parent_id"] = self.parent_id
        out["updated_after"] = self.updated_after
        out["updated_before"] = self.updated_before
        return out

    def shaped_conditions(self, values: dict[str, Any] | None = None,
                          ) -> list[ColumnElement[bool]]:
        """The conditions, every value a named parameter (`params()`).

        ``values``: bind them now (else the statement is compiled once and run with
        `params()`).
        """
        def bind(name: str, type_: Any) -> Any:
            if values is None:
                return bindparam(name, type_=type_)
            return bindparam(name, values[name], type_=type_)

        out = [shaped_filter(filter_shape(self.where), values=values)]
        if self.parent_id is not None:
            out.append(C.parent_id == bind("parent_id", String()))
        if self.updated_after is not None:
            out.append(C.updated_at > bind("updated_after", UTCDateTime()))
        if self.updated_before is not None:
            out.append(C.updated_at < bind("updated_before", UTCDateTime()))
        return out


#: The columns a listing reads (`memstore._db.rows.conversations_from_raw` decodes them).
LISTING_COLUMNS = (C.id, C.created_at, C.updated_at, C.metadata, C.first_seq, C.last_seq,
                   C.token_count, C.expires_at, C.parent_id, C.forked_at_seq)

#: Compiled listings and counts, one per dialect and shape (bounded: a shape beyond
#: the bound is compiled for its call only).
_COMPILED: dict[tuple[Any, ...], CompiledSQL] = {}
_MAX_COMPILED = 256


def _compiled(conn: Connection, key: tuple[Any, ...], build: Any) -> CompiledSQL:
    dialect = conn.dialect
    key = (dialect.name, dialect.driver, *key)
    found = _COMPILED.get(key)
    if found is None:
        found = CompiledSQL(build(), dialect, process=True)
        if len(_COMPILED) < _MAX_COMPILED:
            _COMPILED[key] = found
    return found


def list_conversations(conn: Connection, listing: Listing, order: Order, limit: int,
                       after: str | tuple[datetime, str] | None) -> list[Conversation]:
    """One keyset page: by id ascending, or by ``updated_at`` newest first (ties by id).

    One statement, compiled once per shape of the listing and run on the driver's
    cursor (a listing is a hot read in a multi-tenant service: see the benchmarks).
    """
    def build() -> Any:
        stmt = select(*LISTING_COLUMNS).where(*listing.shaped_conditions())
        if order == "id":
            if after is not None:
                stmt = stmt.where(C.id > bindparam("after_id", type_=String()))
            stmt = stmt.order_by(C.id)
        else:
            if after is not None:
                stmt = stmt.where(tuple_(C.updated_at, C.id) < tuple_(
                    bindparam("after_updated", type_=UTCDateTime()),
                    bindparam("after_id", type_=String())))
            stmt = stmt.order_by(C.updated_at.desc(), C.id.desc())
        return stmt.limit(bindparam("limit", type_=Integer()))

    compiled = _compiled(conn, ("list", *listing.shape(), order, after is not None), build)
    values = listing.params()
    values["limit"] = limit
    if isinstance(after, tuple):
        values["after_updated"], values["after_id"] = after
    else:
        values["after_id"] = after
    return conversations_from_raw(fetch_raw(conn, compiled.sql, compiled.params(values)),
                                  conn.dialect.name)


def count_conversations(conn: Connection, listing: Listing) -> int:
    """How many conversations ``listing`` covers (one aggregate over the indexes)."""
    def build() -> Any:
        return select(func.count()).select_from(conversations).where(
            *listing.shaped_conditions())

    compiled = _compiled(conn, ("count", *listing.shape()), build)
    rows = fetch_raw(conn, compiled.sql, compiled.params(listing.params()))
    return int(rows[0][0])


def update_conversation(
    conn: Connection, cid: str, metadata: Mapping[str, Any] | None, merge: bool,
    expires_at: datetime | None, set_expiry: bool,
) -> Conversation:
    """Change a conversation's metadata and/or expiry under its row lock.

    ``merge``: a shallow update of the top-level keys, where ``None`` removes a key;
    otherwise ``metadata`` replaces the whole object. ``updated_at`` becomes now.
    """
    row = conversation_row(conn, cid, for_update=True)
    values: dict[str, Any] = {"updated_at": utcnow()}
    if metadata is not None:
        if merge:
            merged = dict(row._mapping["metadata"] or {})
            for key, value in metadata.items():
                if value is None:
                    merged.pop(key, None)
                else:
                    merged[key] = value
        else:
            merged = dict(metadata)
        try:
            check_json(merged, "metadata")
            check_json_size(merged, "metadata")
        except ValueError as exc:
            raise InvalidInputError(str(exc)) from None
        values["metadata"] = merged
    if set_expiry:
        values["expires_at"] = expires_at
    conn.execute(update_row(cid, **values))
    return to_conversation(conversation_row(conn, cid))


# ---- fork ------------------------------------------------------------------------------


def fork(conn: Connection, source: str, new_id: str, at_seq: int | None,
         metadata: Mapping[str, Any] | None) -> Conversation:
    """Copy ``source`` up to ``at_seq`` into a new conversation, inside the database.

    One ``INSERT ... SELECT`` per table: the messages keep their seqs, ids, timestamps,
    scores, pins and stored token counts (nothing is decoded or re-tokenised here),
    and the summaries whose range ends at or before ``at_seq`` come along. On
    PostgreSQL the search index's rows are copied as well (its insert trigger skips
    the copied messages: migration 0007); SQLite's FTS5 indexes them as it inserts. The source
    row is locked (``FOR UPDATE`` on PostgreSQL; SQLite's write transaction holds the
    database), so the copy is one consistent state of it.
    """
    src = conversation_row(conn, source, for_update=True)
    first, last = int(src.first_seq), int(src.last_seq)
    at = last if at_seq is None else at_seq
    if not first - 1 <= at <= last:
        raise InvalidInputError(
            f"at_seq {at} is outside conversation {source!r}'s seqs "
            f"({first}..{last}; {first - 1} forks none of its messages)")
    if at < last:
        after = conn.execute(select(M.role).where(
            M.conversation_id == source, M.seq == at + 1)).scalar_one()
        if after == "tool":
            raise InvalidInputError(
                f"at_seq {at} would split a tool-call unit of {source!r}: seq {at + 1} is a "
                "tool result of a call at or before it; fork before the call or after "
                "its last result")
    if conn.execute(select(C.id).where(C.id == new_id)).first() is not None:
        raise ConflictError(f"conversation {new_id!r} already exists")
    count, tokens = conn.execute(sum_tokens(source, stop=at + 1)).one()
    now = utcnow()
    conn.execute(insert(conversations).values(
        id=new_id, created_at=now, updated_at=now,
        metadata=dict(src._mapping["metadata"] or {}) if metadata is None else dict(metadata),
        first_seq=first if at >= first else at + 1, last_seq=at, token_count=int(tokens),
        max_score=float(src.max_score), epoch=new_epoch(), parent_id=source,
        forked_at_seq=at,
    ))
    names = [c.name for c in messages.columns if c.name != "conversation_id"]
    copied = select(literal(new_id, String(255)), *[M[n] for n in names]).where(
        M.conversation_id == source, M.seq <= at)
    # PostgreSQL: the copied messages' index rows are copied too, not parsed again.
    copy_index = conn.dialect.name == "postgresql" and _search.index_exists(conn)
    if copy_index:
        _search.copying(conn, True)
    conn.execute(insert(messages).from_select(["conversation_id", *names], copied))
    if copy_index:
        _search.copying(conn, False)
        _search.copy_index_rows(conn, source, new_id, at)
    snames = [c.name for c in summaries.columns if c.name != "conversation_id"]
    scopied = select(literal(new_id, String(255)), *[S[n] for n in snames]).where(
        S.conversation_id == source, S.last_seq <= at)
    conn.execute(insert(summaries).from_select(["conversation_id", *snames], scopied))
    assert int(count) == (at - first + 1 if at >= first else 0)
    return to_conversation(conversation_row(conn, new_id))


# ---- forget ----------------------------------------------------------------------------


def selected_ids(conn: Connection, where: Mapping[str, WhereValue] | None,
                 ids: list[str] | None, page: int = 1000) -> list[str]:
    """The conversations a selector names (that exist), and every fork descending from them."""
    found: set[str] = set()
    if where:
        after = ""
        while True:
            stmt = select(C.id).where(conversation_filter(where, conn.dialect.name),
                                      C.id > after).order_by(C.id).limit(page)
            batch = list(conn.execute(stmt).scalars())
            if not batch:
                break
            found.update(batch)
            after = batch[-1]
    if ids:
        for i in range(0, len(ids), page):
            chunk = ids[i:i + page]
            found.update(conn.execute(select(C.id).where(C.id.in_(chunk))).scalars())
    frontier = sorted(found)
    while frontier:  # forks of forks: a fork holds a copy of its parent's messages
        children: set[str] = set()
        for i in range(0, len(frontier), page):
            children.update(conn.execute(select(C.id).where(
                C.parent_id.in_(frontier[i:i + page]))).scalars())
        frontier = sorted(children - found)
        found.update(frontier)
    return sorted(found)


def forget_counts(conn: Connection, where: Mapping[str, WhereValue] | None,
                  ids: list[str] | None) -> tuple[int, int, None]:
    """What `forget` would delete, deleting nothing: ``(conversations, messages, None)``."""
    targets = selected_ids(conn, where, ids)
    return len(targets), _messages_of(conn, targets), None


def _messages_of(conn: Connection, targets: list[str]) -> int:
    """How many messages the conversations ``targets`` hold."""
    total = 0
    for start in range(0, len(targets), 1000):
        total += int(conn.execute(
            select(func.coalesce(func.sum(C.last_seq - C.first_seq + 1), 0))
            .where(C.id.in_(targets[start:start + 1000]))).scalar_one())
    return total


def forget(conn: Connection, where: Mapping[str, WhereValue] | None, ids: list[str] | None,
           reason: str | None, digest: str) -> tuple[int, int, int]:
    """Delete the selected conversations and their forks; append the audit entry.

    Returns ``(conversations, messages, audit entry id)``. On SQLite the deletes run
    with ``secure_delete``, which overwrites the freed content with zeros, and no
    segment of the full-text index keeps the deleted messages' words: the way is chosen
    by how many go beside the index's size (`memstore._db.erasure`: in place, a rebuild
    of what stays, or a merge of the whole index).
    """
    sqlite = conn.dialect.name == "sqlite"
    previous = None
    if sqlite:
        previous = conn.exec_driver_sql("PRAGMA secure_delete").scalar()
        conn.exec_driver_sql("PRAGMA secure_delete=ON")
    try:
        targets = selected_ids(conn, where, ids)
        erasure = _erasure.begin(conn, lambda: _messages_of(conn, targets))
        deleted_messages = 0
        for cid in targets:
            row = conversation_row(conn, cid, for_update=True)
            deleted_messages += int(row.last_seq) - int(row.first_seq) + 1
            delete_contents(conn, cid, row)
            conn.execute(delete(conversations).where(C.id == cid))
        _erasure.finish(conn, erasure)
        entry = conn.execute(insert(audit).values(
            at=utcnow(), operation="forget", selector_digest=digest,
            conversations=len(targets), messages=deleted_messages, reason=reason,
        ).returning(audit.c.id)).scalar_one()
    finally:
        if sqlite:
            conn.exec_driver_sql(f"PRAGMA secure_delete={int(previous or 0)}")
    return len(targets), deleted_messages, int(entry)


def audit_log(conn: Connection, limit: int, after: int | None) -> list[Any]:
    """Audit entries, oldest first, after entry id ``after``."""
    stmt = select(audit).order_by(audit.c.id).limit(limit)
    if after is not None:
        stmt = stmt.where(audit.c.id > after)
    return list(conn.execute(stmt))


def reclaim(conn: Connection, vacuum: bool) -> None:
    """After a forget: make what it deleted unreadable from the database files.

    PostgreSQL (called only with ``vacuum``): ``VACUUM`` memstore's tables (the
    connection must be in autocommit). SQLite: with ``vacuum``, ``VACUUM`` (the whole
    file rewritten: no free space is left holding anything, whoever wrote it), then a
    truncating WAL checkpoint, so the zeroed pages reach the database file and the WAL
    holds no older copy (best effort: a reader holding an old snapshot keeps the WAL
    until it ends).
    """
    if conn.dialect.name == "postgresql":
        conn.exec_driver_sql(
            "VACUUM memstore_messages, memstore_summaries, memstore_conversations, "
            "memstore_conversation_keys")
    elif conn.dialect.name == "sqlite":
        try:
            if vacuum:
                fetch_raw(conn, "VACUUM", ())  # on the driver: no BEGIN before it
        finally:  # a VACUUM that fails (a full disk) still leaves the WAL checkpointed
            conn.exec_driver_sql("PRAGMA wal_checkpoint(TRUNCATE)")


# ---- prune -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Policy:
    """What a prune deletes (checked by the plan; see ``MemoryStore.prune``)."""

    now: datetime
    threshold: datetime | None  # messages created before it may go
    keep_last: int | None  # each conversation's newest this many always stay
    expired: bool
    keep_anchored: bool
    keep_summaries: bool
    drop_empty: bool

    @property
    def trims(self) -> bool:
        return self.threshold is not None or self.keep_last is not None


@dataclass
class Pruned:
    """What a prune did (or, dry, would do) to one conversation."""

    messages: int = 0
    summaries: int = 0
    dropped: bool = False

    @property
    def touched(self) -> bool:
        return self.dropped or self.messages > 0 or self.summaries > 0


def _role(conn: Connection, cid: str, seq: int) -> tuple[str, bool] | None:
    row = conn.execute(select(M.role, M.tool_calls).where(
        M.conversation_id == cid, M.seq == seq)).first()
    return None if row is None else (str(row.role), bool(row.tool_calls))


def _unit_start(conn: Connection, cid: str, seq: int) -> int:
    """The seq of the assistant call whose unit ``seq`` belongs to (``seq`` if none)."""
    role = _role(conn, cid, seq)
    if role is None or role[0] != "tool":
        return seq
    call = conn.execute(select(func.max(M.seq)).where(
        M.conversation_id == cid, M.seq < seq, M.role != "tool")).scalar()
    if call is None:
        return seq
    found = _role(conn, cid, int(call))
    return int(call) if found is not None and found[0] == "assistant" and found[1] else seq


def prune_cut(conn: Connection, cid: str, first: int, last: int, policy: Policy) -> int:
    """The newest seq a prune may delete up to (``first - 1``: nothing).

    The deleted messages are always a prefix, so seqs stay contiguous. It ends before
    the first message the policy keeps (a message created at or after the threshold,
    among the newest ``keep_last``), never inside a tool-call unit, and — with
    ``keep_anchored`` — before any tool-call unit holding a pinned message (a pinned
    system or plain message is kept in place instead: see `prune_one`).
    """
    cut = last
    if policy.keep_last is not None:
        cut = min(cut, last - policy.keep_last)
    if policy.threshold is not None and cut >= first:
        young = select(func.min(M.seq)).where(
            M.conversation_id == cid, M.seq >= first, M.seq <= cut,
            M.created_at >= policy.threshold)
        if policy.keep_anchored:
            young = young.where(M.anchored.is_(False))
        stop = conn.execute(young).scalar()
        if stop is not None:
            cut = min(cut, int(stop) - 1)
    if first <= cut < last:
        following = _role(conn, cid, cut + 1)
        if following is not None and following[0] == "tool":
            cut = min(cut, _unit_start(conn, cid, cut + 1) - 1)
    if policy.keep_anchored and cut >= first:
        pinned_unit = conn.execute(select(func.min(M.seq)).where(
            M.conversation_id == cid, M.seq >= first, M.seq <= cut, M.anchored.is_(True),
            (M.role == "tool") | M.tool_calls.is_not(None))).scalar()
        if pinned_unit is not None:
            cut = min(cut, _unit_start(conn, cid, int(pinned_unit)) - 1)
    return max(cut, first - 1)


def prune_one(conn: Connection, cid: str, policy: Policy, dry_run: bool) -> Pruned:
    """Apply ``policy`` to one conversation in the open transaction (its row locked).

    Deletes the prefix of messages the policy covers. With ``keep_anchored`` the
    anchored messages of that prefix (system, developer, pinned) stay, moved up in
    order to sit right before the first kept message, so seqs stay contiguous; their
    ids, content and timestamps do not change. The epoch changes, so every store's
    cached rows are re-read.
    """
    try:
        row = conversation_row(conn, cid, for_update=True)
    except ConversationNotFoundError:  # deleted since it was listed
        return Pruned()
    first, last = int(row.first_seq), int(row.last_seq)
    count_summaries = select(func.count()).select_from(summaries).where(S.conversation_id == cid)
    if policy.expired and row.expires_at is not None and row.expires_at <= policy.now:
        done = Pruned(messages=last - first + 1,
                      summaries=int(conn.execute(count_summaries).scalar_one()), dropped=True)
        if not dry_run:
            delete_contents(conn, cid, row)
            conn.execute(delete(conversations).where(C.id == cid))
        return done
    done = Pruned()
    cut = prune_cut(conn, cid, first, last, policy) if policy.trims else first - 1
    if cut >= first:
        kept: list[tuple[int, int]] = []
        if policy.keep_anchored:
            kept = [(int(r.seq), int(r.token_count)) for r in conn.execute(
                select(M.seq, M.token_count).where(
                    M.conversation_id == cid, M.seq >= first, M.seq <= cut,
                    M.anchored.is_(True)).order_by(M.seq))]
        count, tokens = conn.execute(sum_tokens(cid, start=first, stop=cut + 1)).one()
        done.messages = int(count) - len(kept)
        gone_tokens = int(tokens) - sum(t for _, t in kept)
        if not policy.keep_summaries:
            done.summaries = int(conn.execute(count_summaries.where(
                S.last_seq <= cut)).scalar_one())
        if not dry_run and done.messages > 0:
            doomed = delete(messages).where(M.conversation_id == cid, M.seq >= first,
                                            M.seq <= cut)
            if kept:
                doomed = doomed.where(M.anchored.is_(False))
            conn.execute(doomed)
            # Highest first: each target slot is free (deleted, or left by one moved).
            for offset, (seq, _) in enumerate(reversed(kept)):
                if seq != cut - offset:
                    conn.execute(update(messages).where(
                        M.conversation_id == cid, M.seq == seq).values(seq=cut - offset))
            if done.summaries:
                conn.execute(delete(summaries).where(S.conversation_id == cid,
                                                     S.last_seq <= cut))
            conn.execute(update_row(cid, first_seq=cut - len(kept) + 1, epoch=new_epoch(),
                                    token_count=int(row.token_count) - gone_tokens))
        elif not dry_run and done.summaries:
            conn.execute(delete(summaries).where(S.conversation_id == cid, S.last_seq <= cut))
        if done.messages > 0:
            first = cut - len(kept) + 1
    if policy.drop_empty and last < first:  # no message left (or none to begin with)
        done.dropped = True
        if policy.keep_summaries:  # they go with the conversation
            done.summaries += int(conn.execute(count_summaries).scalar_one())
        if not dry_run:
            delete_contents(conn, cid, conversation_row(conn, cid, for_update=True))
            conn.execute(delete(conversations).where(C.id == cid))
    return done


def prune_page(conn: Connection, listing: Listing, ids: list[str] | None, after: str,
               limit: int) -> list[str]:
    """The next ``limit`` conversation ids a prune covers, after ``after`` (by id)."""
    stmt = select(C.id).where(*listing.conditions(), C.id > after)
    if ids is not None:
        stmt = stmt.where(C.id.in_(ids))
    return list(conn.execute(stmt.order_by(C.id).limit(limit)).scalars())
