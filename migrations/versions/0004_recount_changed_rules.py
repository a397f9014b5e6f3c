"""Recount the stored token counts of two counting rules changed under the same names.

Two rules changed without renaming their counters:

* ``TiktokenCounter`` (``tiktoken/<encoding>``, ``tiktoken/<encoding>/images=<rule>``)
  counts an assistant message with two or more tool calls as OpenAI's
  ``multi_tool_use.parallel`` wrapper (four calls: 87 tokens, where the old rule said 52);
* ``ApproxCounter`` (``approx/<ratio>``) prices an image part by GPT-4o's rule (up to
  1445) instead of a flat 85.

A window trusts a stored count whose ``token_counter`` is its counter's name, so rows
stored by the earlier rules kept their lower counts and could put a window over its
budget. This revision recounts exactly those rows: a ``tiktoken/`` row with two or more
tool calls, and an ``approx/`` row with an image part. Each is rebuilt as a
:class:`~memstore.models.Message` and counted by ``counter_from_name(token_counter)``;
its conversation's ``token_count`` takes the difference, and every conversation with a
changed row gets a new ``epoch`` (cached rows of it are read again). A row whose counter
cannot be built here (a tiktoken encoding not available offline, a name that is not
memstore's, a row that is not a valid message) keeps its count and is renamed
``stale/<name>``, a name no counter has, so windows count it on the fly. Rows already
counted by the new rules are left alone (the recount is equal).

Candidates are found by one filter over the messages table (exact on PostgreSQL; a
``LIKE`` prefilter on SQLite, which may lack the JSON1 functions, confirmed in Python);
a database without any is left after that one scan. They are read in keyset pages of
``(conversation_id, seq)`` and streamed, so memory stays bounded. No DDL and no
assumption about the table layout beyond its columns: it runs the same on
memstore's hash-partitioned PostgreSQL tables.

Processes may keep writing meanwhile (PostgreSQL): the conversations of a page's changes
are locked, as the store locks one before changing its rows, and one whose epoch moved
since its rows were read is read again. Rows that a process still running the earlier
rules writes after the upgrade carry the old counts: upgrade memstore in every process
first, then the database.

Offline (``--sql``), nothing can be counted: the script renames the candidates
``stale/<name>`` and gives their conversations a new epoch.

Downgrade does nothing: counts are a cache of the counter's result, and the earlier
code takes the new counts as its own, which can only over-count (a window a little
smaller than its budget allows), never over-run a budget.

Revision ID: 0004_recount_changed_rules
Revises: 0003_summaries
Create Date: 2026-11-24
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, NamedTuple

from alembic import context, op
from pydantic import ValidationError
from sqlalchemy import Connection, bindparam, text

from memstore._db.statements import new_epoch
from memstore.errors import MemstoreError
from memstore.models import Message
from memstore.tokens import TokenCounter, counter_from_name

revision: str = "0004_recount_changed_rules"
down_revision: str | None = "0003_summaries"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

#: Rows read per keyset page (streamed a few at a time; a message may hold 64 MiB).
PAGE_ROWS = 1000
#: Rows fetched from the server at a time while a page is streamed (PostgreSQL).
STREAM_ROWS = 50
#: ``memstore_messages.token_counter`` is ``VARCHAR(64)``.
COUNTER_NAME_LENGTH = 64
#: The prefix of a name no counter has: windows count such a row on the fly.
STALE = "stale/"
#: The largest count ``memstore_messages.token_count`` (INTEGER) holds.
MAX_TOKEN_COUNT = 2**31 - 1

# The rows whose counter's rule changed: a condition on memstore_messages under the alias
# m. PostgreSQL: exact (a CASE, so that jsonb_array_length never sees a scalar).
# SQLite: a superset found without JSON1 (two '"id"' keys; an 'image_url' anywhere),
# narrowed by _affected().
_CANDIDATES = {
    "postgresql": (
        "(m.token_counter LIKE 'tiktoken/%' AND CASE WHEN jsonb_typeof(CAST(m.tool_calls AS "
        "jsonb)) = 'array' THEN jsonb_array_length(CAST(m.tool_calls AS jsonb)) ELSE 0 END >= 2)"
        " OR (m.token_counter LIKE 'approx/%' AND CAST(m.content_parts AS jsonb)"
        " @> CAST('[{\"type\": \"image_url\"}]' AS jsonb))"
    ),
    "sqlite": (
        "(m.token_counter LIKE 'tiktoken/%' AND m.tool_calls LIKE '%\"id\"%\"id\"%')"
        " OR (m.token_counter LIKE 'approx/%' AND m.content_parts LIKE '%image_url%')"
    ),
}

_SELECT = (
    "SELECT m.conversation_id, m.seq, m.role, m.content_text, m.content_parts, m.name, "
    "m.tool_calls, m.tool_call_id, m.token_count, m.token_counter, c.epoch "
    "FROM memstore_messages m JOIN memstore_conversations c ON c.id = m.conversation_id "
    "WHERE ({candidates})"
)


def _candidates(dialect: str) -> str:
    return _CANDIDATES.get(dialect, _CANDIDATES["sqlite"])


def upgrade() -> None:
    if context.is_offline_mode():
        _mark_stale_offline()
        return
    conn = op.get_bind()
    dialect = conn.dialect.name
    # One scan, in whatever order is cheapest; nothing found: nothing to do.
    found = conn.execute(text(
        f"SELECT 1 FROM memstore_messages m WHERE {_candidates(dialect)} LIMIT 1")).first()
    if found is None:
        return
    counters: dict[str, TokenCounter | None] = {}
    after: tuple[str, int] | None = None
    while True:
        bounds: list[str] = []
        params: dict[str, Any] = {}
        if after is not None:
            bounds.append("(m.conversation_id, m.seq) > (:after_cid, :after_seq)")
            params.update(after_cid=after[0], after_seq=after[1])
        page = _scan(conn, dialect, bounds, params, counters, PAGE_ROWS)
        if page.changes:
            _apply(conn, dialect, page, after, counters)
        if page.rows < PAGE_ROWS or page.last is None:
            return
        after = page.last


def downgrade() -> None:
    # Nothing to undo: stored counts are a cache of the counter's result. The earlier
    # code takes the new counts (and 'stale/' names) as they are; the new counts are
    # higher, so at worst it over-counts: its windows stay within their budgets.
    pass


# ---- online: recount ---------------------------------------------------------------------


Change = tuple[str, int, int, str, int]  # conversation_id, seq, new count, new name, delta


class _Page(NamedTuple):
    changes: dict[str, list[Change]]  # by conversation
    epochs: dict[str, int]  # each conversation's epoch, read with its rows
    last: tuple[str, int] | None  # the last key read
    rows: int


def _scan(
    conn: Connection, dialect: str, bounds: list[str], params: dict[str, Any],
    counters: dict[str, TokenCounter | None], limit: int | None,
) -> _Page:
    """The changes of the candidates within ``bounds``, in key order (``limit`` rows at most).

    The rows are streamed: each is counted as it arrives and only its change is kept.
    """
    where = "".join(f" AND {bound}" for bound in bounds)
    statement = text(
        _SELECT.format(candidates=_candidates(dialect)) + where
        + " ORDER BY m.conversation_id, m.seq" + (f" LIMIT {limit}" if limit else "")
    )
    if dialect == "postgresql":
        statement = statement.execution_options(yield_per=STREAM_ROWS)  # a server-side cursor
    changes: dict[str, list[Change]] = {}
    epochs: dict[str, int] = {}
    rows = 0
    last: tuple[str, int] | None = None
    for row in conn.execute(statement, params):
        rows += 1
        last = (row.conversation_id, int(row.seq))
        epochs[row.conversation_id] = int(row.epoch)
        change = _recount(row, dialect, counters)
        if change is not None:
            changes.setdefault(row.conversation_id, []).append(change)
    return _Page(changes, epochs, last, rows)


def _apply(conn: Connection, dialect: str, page: _Page, after: tuple[str, int] | None,
           counters: dict[str, TokenCounter | None]) -> None:
    """Write a page's changes, its conversations locked as the store locks them.

    memstore changes a conversation's stored rows only with its conversation row locked,
    and replaces the epoch unless it only appends. So with the conversations locked
    (first, as the store does: no deadlock with it), a conversation whose epoch is still
    the one read with its rows holds those rows as read; one whose epoch moved is read
    again, and one deleted meanwhile is skipped. (SQLite: the upgrade's write
    transaction already excludes every other writer.)
    """
    lock = text(
        "SELECT id, epoch FROM memstore_conversations WHERE id IN :ids ORDER BY id"
        + (" FOR UPDATE" if dialect == "postgresql" else "")
    ).bindparams(bindparam("ids", expanding=True))
    locked = {cid: int(epoch) for cid, epoch in conn.execute(lock, {"ids": sorted(page.changes)})}
    changes: list[Change] = []
    for cid, found in page.changes.items():
        if cid not in locked:
            continue
        if locked[cid] != page.epochs[cid]:
            bounds = ["m.conversation_id = :cid"]
            params: dict[str, Any] = {"cid": cid}
            if after is not None and after[0] == cid:
                bounds.append("m.seq > :low")
                params["low"] = after[1]
            if page.last is not None and page.last[0] == cid:
                bounds.append("m.seq <= :high")
                params["high"] = page.last[1]
            found = _scan(conn, dialect, bounds, params, counters, None).changes.get(cid, [])
        changes.extend(found)
    _write(conn, changes)


def _recount(row: Any, dialect: str, counters: dict[str, TokenCounter | None]) -> Change | None:
    """The row's new count and name, or None when it keeps both."""
    name: str = row.token_counter
    calls = _decoded(row.tool_calls, dialect)
    parts = _decoded(row.content_parts, dialect)
    if not _affected(name, calls, parts):
        return None
    old = int(row.token_count)
    tokens = _count(row, name, calls, parts, counters)
    if tokens is None:
        stale = (STALE + name)[:COUNTER_NAME_LENGTH]
        return (row.conversation_id, int(row.seq), old, stale, 0)
    if tokens == old:
        return None  # already counted by the new rule
    return (row.conversation_id, int(row.seq), tokens, name, tokens - old)


def _decoded(value: Any, dialect: str) -> Any:
    """A JSON column's value (SQLite returns the text; psycopg decodes jsonb)."""
    if dialect == "postgresql" or not isinstance(value, (str, bytes)):
        return value
    try:
        return json.loads(value)
    except ValueError:
        return None


def _affected(name: str, calls: Any, parts: Any) -> bool:
    if name.startswith("tiktoken/"):
        return isinstance(calls, list) and len(calls) >= 2
    if name.startswith("approx/"):
        return isinstance(parts, list) and any(
            isinstance(part, dict) and part.get("type") != "text" for part in parts
        )
    return False


def _count(row: Any, name: str, calls: Any, parts: Any,
           counters: dict[str, TokenCounter | None]) -> int | None:
    """The row's count by the counter its name describes; None when that cannot be had."""
    if name not in counters:
        try:
            counter: TokenCounter | None = counter_from_name(name)
        except MemstoreError:  # e.g. TokenizerUnavailableError, or not memstore's name
            counter = None
        if counter is not None and counter.name != name:
            counter = None  # not the counter that wrote the row
        counters[name] = counter
    counter = counters[name]
    if counter is None:
        return None
    try:
        message = Message.model_validate({
            "role": row.role,
            "content": row.content_text if row.content_text is not None else parts,
            "name": row.name,
            "tool_calls": calls,
            "tool_call_id": row.tool_call_id,
        })
        tokens = counter.count_message(message)
    except (MemstoreError, ValidationError):
        return None
    if type(tokens) is not int or not 0 <= tokens <= MAX_TOKEN_COUNT:
        return None
    return tokens


def _write(conn: Connection, changes: list[Change]) -> None:
    if not changes:
        return
    conn.execute(
        text("UPDATE memstore_messages SET token_count = :tokens, token_counter = :counter "
             "WHERE conversation_id = :cid AND seq = :seq"),
        [{"cid": cid, "seq": seq, "tokens": tokens, "counter": counter}
         for cid, seq, tokens, counter, _ in changes],
    )
    deltas: dict[str, int] = {}
    for cid, _, _, _, delta in changes:
        deltas[cid] = deltas.get(cid, 0) + delta
    # Every changed conversation gets a new epoch, even with a zero total (a renamed row):
    # processes holding its rows in their caches read them again.
    conn.execute(
        text("UPDATE memstore_conversations SET token_count = token_count + :delta, "
             "epoch = :epoch WHERE id = :cid"),
        [{"cid": cid, "delta": delta, "epoch": new_epoch()} for cid, delta in deltas.items()],
    )


# ---- offline (--sql): mark the candidates stale ------------------------------------------


def _mark_stale_offline() -> None:
    dialect = context.get_context().dialect.name
    candidates = _candidates(dialect)
    cut = "left" if dialect == "postgresql" else "substr"
    length = f"{COUNTER_NAME_LENGTH}" if cut == "left" else f"1, {COUNTER_NAME_LENGTH}"
    # The conversations first: renaming the rows takes them out of the filter.
    op.execute(
        f"UPDATE memstore_conversations SET epoch = {new_epoch()} WHERE id IN "
        f"(SELECT m.conversation_id FROM memstore_messages m WHERE {candidates})"
    )
    op.execute(
        f"UPDATE memstore_messages SET token_counter = "
        f"{cut}('{STALE}' || token_counter, {length}) WHERE (conversation_id, seq) IN "
        f"(SELECT m.conversation_id, m.seq FROM memstore_messages m WHERE {candidates})"
    )
