"""Argument checks and plans of the lifecycle calls, shared by both stores.

``list_conversations``/``count_conversations`` (filters), ``update_conversation``, and
later ``fork``, ``prune``, ``forget`` and ``audit_log``: each public method of
`memstore.MemoryStore` and `memstore.AsyncMemoryStore` validates its arguments
here and runs the same `memstore._base.Plan`; the SQL is in ``memstore._db.lifecycle``.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Generator, Iterable
from datetime import datetime, timedelta, timezone
from types import EllipsisType
from typing import Any

from memstore._base import Plan, check_conversation_id, check_metadata, new_conversation_id
from memstore._db import lifecycle as _life
from memstore._validate import (
    check_flag,
    check_progress,
    check_where,
    short_repr,
    text_problem,
)
from memstore.errors import InvalidInputError
from memstore.models import AuditEntry, Conversation, ForgetReport, PruneReport

__all__ = [
    "audit_plan",
    "check_instant",
    "count_plan",
    "fork_plan",
    "forget_steps",
    "list_plan",
    "prune_steps",
    "update_plan",
]

#: The most conversations one page of ``list_conversations`` returns.
MAX_PAGE = 10_000


def check_instant(value: Any, name: str) -> datetime | None:
    """A point in time: an aware ``datetime`` (normalised to UTC) or ``None``."""
    if value is None:
        return None
    if not isinstance(value, datetime):
        raise InvalidInputError(f"{name} must be a datetime or None, got {short_repr(value)}")
    if value.tzinfo is None or value.utcoffset() is None:
        raise InvalidInputError(
            f"{name} must be timezone-aware (e.g. datetime.now(timezone.utc)), got a naive "
            f"datetime {value.isoformat()}")
    return value.astimezone(timezone.utc)


def check_limit(limit: Any) -> int:
    """A page size: an int in ``[1, MAX_PAGE]`` (listing and the audit log)."""
    if not isinstance(limit, int) or isinstance(limit, bool) or not 1 <= limit <= MAX_PAGE:
        raise InvalidInputError(f"limit must be an int in [1, {MAX_PAGE}], got {short_repr(limit)}")
    return limit


def _listing(where: Any, parent_id: Any, updated_after: Any,
             updated_before: Any) -> _life.Listing:
    return _life.Listing(
        where=check_where(where),
        parent_id=None if parent_id is None else check_conversation_id(parent_id),
        updated_after=check_instant(updated_after, "updated_after"),
        updated_before=check_instant(updated_before, "updated_before"),
    )


def list_plan(limit: Any, after: Any, where: Any, parent_id: Any, updated_after: Any,
              updated_before: Any, order: Any) -> Plan:
    """The plan of ``list_conversations``."""
    listing = _listing(where, parent_id, updated_after, updated_before)
    if order not in ("id", "updated"):
        raise InvalidInputError(f"order must be 'id' or 'updated', got {short_repr(order)}")
    check_limit(limit)
    cursor: str | tuple[datetime, str] | None
    if after is None:
        cursor = None
    elif isinstance(after, Conversation):
        cursor = after.id if order == "id" else (after.updated_at, after.id)
    elif order == "updated":
        raise InvalidInputError(
            "with order='updated', pass the last Conversation of the previous page as "
            "after= (its updated_at and id are the cursor), not an id")
    else:
        if not isinstance(after, str):
            raise InvalidInputError(
                f"after must be a conversation id, a Conversation or None, got "
                f"{short_repr(after)}")
        problem = text_problem(after)
        if problem is not None:
            raise InvalidInputError(f"after {short_repr(after)} {problem}")
        cursor = after
    # One statement: no transaction needed (its own snapshot), so none is opened.
    return Plan(_life.list_conversations, (listing, order, limit, cursor), optimistic=True)


def count_plan(where: Any, parent_id: Any, updated_after: Any, updated_before: Any) -> Plan:
    """The plan of ``count_conversations``."""
    return Plan(_life.count_conversations,
                (_listing(where, parent_id, updated_after, updated_before),), optimistic=True)


def update_plan(id: Any, metadata: Any, merge: Any,
                expires_at: datetime | timedelta | EllipsisType | None) -> Plan:
    """The plan of ``update_conversation``."""
    cid = check_conversation_id(id)
    merge = check_flag(merge, "merge")
    meta = None if metadata is None else check_metadata(metadata)
    set_expiry = expires_at is not Ellipsis
    instant: datetime | None = None
    if isinstance(expires_at, timedelta):
        instant = datetime.now(timezone.utc) + expires_at
    elif set_expiry:
        instant = check_instant(expires_at, "expires_at")
    if meta is None and not set_expiry:
        raise InvalidInputError("update_conversation got nothing to change: pass metadata= "
                                "or expires_at=")
    return Plan(_life.update_conversation, (cid, meta, merge, instant, set_expiry), write=True)


def fork_plan(source_id: Any, new_id: Any, at_seq: Any, metadata: Any) -> Plan:
    """The plan of ``fork``."""
    source = check_conversation_id(source_id)
    target = new_conversation_id(new_id)
    if target == source:
        raise InvalidInputError(f"a fork needs a new id, not its source's ({source!r})")
    if at_seq is not None and (not isinstance(at_seq, int) or isinstance(at_seq, bool)
                               or at_seq < 0):
        raise InvalidInputError(f"at_seq must be an int >= 0 or None, got {short_repr(at_seq)}")
    meta = None if metadata is None else check_metadata(metadata)
    return Plan(_life.fork, (source, target, at_seq, meta), write=True)


def _ids(conversation_ids: Any, what: str) -> list[str] | None:
    if conversation_ids is None:
        return None
    if isinstance(conversation_ids, str) or not isinstance(conversation_ids, Iterable):
        raise InvalidInputError(
            f"{what} conversation_ids must be a list of ids, got {short_repr(conversation_ids)}")
    return sorted({check_conversation_id(cid) for cid in conversation_ids})


#: Conversations a prune lists per page (each is then pruned in its own transaction).
PRUNE_PAGE = 500


def prune_steps(
    older_than: Any, keep_last: Any, expired: Any, where: Any, conversation_ids: Any,
    keep_anchored: Any, keep_summaries: Any, drop_empty: Any, dry_run: Any, progress: Any,
) -> Generator[Plan, Any, PruneReport]:
    """The plans of ``prune``, one short transaction each: a page of ids, then each id.

    A store runs each yielded plan and sends its result back; the generator returns
    the report. Both stores drive it the same way, so they never diverge.
    """
    if older_than is not None and (not isinstance(older_than, timedelta)
                                   or older_than < timedelta(0)):
        raise InvalidInputError(
            f"older_than must be a timedelta >= 0 or None, got {short_repr(older_than)}")
    if keep_last is not None and (not isinstance(keep_last, int) or isinstance(keep_last, bool)
                                  or keep_last < 0):
        raise InvalidInputError(f"keep_last must be an int >= 0 or None, got "
                                f"{short_repr(keep_last)}")
    flags = {name: check_flag(value, name) for name, value in (
        ("expired", expired), ("keep_anchored", keep_anchored),
        ("keep_summaries", keep_summaries), ("drop_empty", drop_empty),
        ("dry_run", dry_run))}
    if older_than is None and keep_last is None and not flags["expired"]:
        raise InvalidInputError(
            "nothing to prune: give older_than=, keep_last= or expired=True (a prune never "
            "means 'delete everything')")
    check_progress(progress, "prune")
    listing = _life.Listing(where=check_where(where))
    ids = _ids(conversation_ids, "prune")
    now = datetime.now(timezone.utc)
    policy = _life.Policy(
        now=now, threshold=None if older_than is None else now - older_than,
        keep_last=keep_last, expired=flags["expired"], keep_anchored=flags["keep_anchored"],
        keep_summaries=flags["keep_summaries"], drop_empty=flags["drop_empty"])
    totals = dict.fromkeys(("scanned", "touched", "messages", "summaries", "dropped"), 0)
    after = ""
    while True:
        page: list[str] = yield Plan(_life.prune_page, (listing, ids, after, PRUNE_PAGE))
        for cid in page:
            done: _life.Pruned = yield Plan(_life.prune_one, (cid, policy, flags["dry_run"]),
                                            write=True)
            totals["scanned"] += 1
            totals["touched"] += done.touched
            totals["messages"] += done.messages
            totals["summaries"] += done.summaries
            totals["dropped"] += done.dropped
        if page and progress is not None:
            progress(len(page))
        if len(page) < PRUNE_PAGE:
            break
        after = page[-1]
    return PruneReport(
        conversations_scanned=totals["scanned"], conversations_touched=totals["touched"],
        messages_deleted=totals["messages"], summaries_deleted=totals["summaries"],
        conversations_dropped=totals["dropped"], dry_run=flags["dry_run"])


def selector_digest(where: dict[str, Any] | None, ids: list[str] | None) -> str:
    """sha256 of a forget's selector as canonical JSON (sorted keys, no spaces)."""
    canonical = json.dumps({"conversation_ids": ids or [], "where": where or {}},
                           sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode()).hexdigest()


def forget_steps(where: Any, conversation_ids: Any, reason: Any, vacuum: Any, dry_run: Any,
                 dialect: str) -> Generator[Plan, Any, ForgetReport]:
    """The plans of ``forget``: the erasure, then what reclaims the space.

    The erasure is one write (or, with ``dry_run``, one snapshot read of what it would
    erase); the reclaiming runs on SQLite always, on PostgreSQL with ``vacuum``. Both
    stores drive it as they drive `prune_steps`, so they never diverge.
    """
    vacuum, dry_run = check_flag(vacuum, "vacuum"), check_flag(dry_run, "dry_run")
    if vacuum and dry_run:
        raise InvalidInputError("vacuum=True with dry_run=True: a dry run deletes nothing to "
                                "reclaim")
    conversations, messages, entry = yield _forget_plan(where, conversation_ids, reason,
                                                        dry_run)
    if not dry_run and (vacuum or dialect == "sqlite"):
        yield _reclaim_plan(vacuum)
    return ForgetReport(conversations=conversations, messages=messages, audit_id=entry,
                        dry_run=dry_run)


def _forget_plan(where: Any, conversation_ids: Any, reason: Any, dry_run: bool) -> Plan:
    """The plan of ``forget`` (``dry_run``: one snapshot read of what it would delete)."""
    filters = check_where(where)
    ids = _ids(conversation_ids, "forget")
    if not filters and not ids:
        raise InvalidInputError(
            "forget needs a selector: where= (metadata equality) or conversation_ids= "
            "(a forget never means 'delete everything')")
    if reason is not None:
        if not isinstance(reason, str):
            raise InvalidInputError(f"reason must be a str or None, got {short_repr(reason)}")
        problem = text_problem(reason)
        if problem is not None:
            raise InvalidInputError(f"reason {problem}")
    if dry_run:
        return Plan(_life.forget_counts, (filters, ids), snapshot=True)
    return Plan(_life.forget, (filters, ids, reason, selector_digest(filters, ids)),
                write=True)


def audit_plan(limit: Any, after: Any) -> Plan:
    """The plan of ``audit_log``."""
    check_limit(limit)
    if after is not None and (not isinstance(after, int) or isinstance(after, bool)):
        raise InvalidInputError(f"after must be an audit entry id (int) or None, got "
                                f"{short_repr(after)}")
    return Plan(_audit_entries, (limit, after))


def _audit_entries(conn: Any, limit: int, after: int | None) -> list[AuditEntry]:
    return [AuditEntry.model_validate(dict(row._mapping))
            for row in _life.audit_log(conn, limit, after)]


def _reclaim_plan(vacuum: bool) -> Plan:
    """After a forget: VACUUM (PostgreSQL) or a truncating WAL checkpoint (SQLite).

    With ``vacuum`` on SQLite, a ``VACUUM`` of the database file comes first. Run with
    no transaction open (``optimistic``: each statement autocommits), as these
    statements require.
    """
    return Plan(_life.reclaim, (vacuum,), optimistic=True)
