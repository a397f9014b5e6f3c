"""The one metadata filter language: ``where={"user_id": "u1", "plan": "pro"}``.

Listing, counting, pruning, forgetting and searching conversations all filter by
equality on top-level metadata keys (`memstore._validate.check_where` checks a
filter). The condition reads ``memstore_conversation_keys``, the index of every
conversation's top-level scalar metadata that triggers keep in step with each write
of metadata (see ``memstore._db.schema``): each key of a filter is one indexed lookup
``(key, kind, value) -> conversation ids``, the same SQL on SQLite and PostgreSQL, so
both give the same conversations for the same data.

Semantics: a ``str``, ``int`` or ``bool`` matches a top-level value of the same JSON
type and value (the integer ``1``, not ``1.0`` and not ``true``); ``None`` matches a
conversation that lacks the key or holds JSON ``null`` there. Several keys are ANDed.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sqlalchemy import ColumnElement, and_, exists, select, true

from memstore._db.schema import conversation_keys, conversations
from memstore._validate import WhereValue

__all__ = ["conversation_filter", "kind_and_text"]

K = conversation_keys.c


def kind_and_text(value: str | int | bool) -> tuple[str, str]:
    """How the key index stores a filter value: its kind and its text."""
    if isinstance(value, bool):
        return "bool", "true" if value else "false"
    if isinstance(value, int):
        return "int", str(value)
    return "text", value


def conversation_filter(
    where: Mapping[str, WhereValue] | None, dialect: str = "", *, id_column: Any = None
) -> ColumnElement[bool]:
    """The SQL condition "this conversation's metadata matches ``where``".

    Args:
        where: a filter checked by ``check_where`` (``None`` or empty: always true).
        dialect: the database's dialect name (the SQL is the same on both today).
        id_column: the column holding the conversation id to test (default
            ``memstore_conversations.id``; a message query passes its
            ``conversation_id``).
    """
    column = conversations.c.id if id_column is None else id_column
    conditions: list[ColumnElement[bool]] = []
    for key, value in (where or {}).items():
        if value is None:
            present = exists().where(K.conversation_id == column, K.key == key,
                                     K.kind != "null")
            conditions.append(~present)
        else:
            kind, text_ = kind_and_text(value)
            conditions.append(column.in_(
                select(K.conversation_id).where(K.key == key, K.kind == kind,
                                                K.value == text_)))
    return and_(true(), *conditions)
