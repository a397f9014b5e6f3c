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

from sqlalchemy import ColumnElement, String, and_, bindparam, exists, select, true

from memstore._db.schema import conversation_keys, conversations
from memstore._validate import WhereValue

__all__ = ["conversation_filter", "filter_params", "filter_shape", "kind_and_text", "shaped_filter"]

K = conversation_keys.c


def kind_and_text(value: str | int | bool) -> tuple[str, str]:
    """How the key index stores a filter value: its kind and its text."""
    if isinstance(value, bool):
        return "bool", "true" if value else "false"
    if isinstance(value, int):
        return "int", str(value)
    return "text", value


def filter_shape(where: Mapping[str, WhereValue] | None) -> tuple[bool, ...]:
    """What a filter's SQL depends on: per key, whether it tests for ``None``.

    Filters of one shape share one statement; their keys and values are parameters
    (`filter_params()`), so a precompiled statement serves them all.
    """
    return tuple(value is None for value in (where or {}).values())


def filter_params(where: Mapping[str, WhereValue] | None) -> dict[str, Any]:
    """The values of `shaped_filter()`'s parameters for ``where``."""
    out: dict[str, Any] = {}
    for i, (key, value) in enumerate((where or {}).items()):
        out[f"where_key_{i}"] = key
        if value is not None:
            out[f"where_kind_{i}"], out[f"where_value_{i}"] = kind_and_text(value)
    return out


def shaped_filter(shape: tuple[bool, ...], column: Any = None,
                  values: Mapping[str, Any] | None = None) -> ColumnElement[bool]:
    """The condition of every filter of ``shape``, its keys and values bound by name.

    Args:
        shape: a `filter_shape()`.
        column: the column holding the conversation id to test (default
            ``memstore_conversations.id``).
        values: the parameters' values (`filter_params()`), or ``None`` for a
            statement to compile once and run with them later.
    """
    def bind(name: str) -> Any:
        if values is None:
            return bindparam(name, type_=String())
        return bindparam(name, values[name], type_=String())

    column = conversations.c.id if column is None else column
    conditions: list[ColumnElement[bool]] = []
    for i, is_none in enumerate(shape):
        key = bind(f"where_key_{i}")
        if is_none:
            present = exists().where(K.conversation_id == column, K.key == key,
                                     K.kind != "null")
            conditions.append(~present)
        else:
            conditions.append(column.in_(
                select(K.conversation_id).where(
                    K.key == key, K.kind == bind(f"where_kind_{i}"),
                    K.value == bind(f"where_value_{i}"))))
    return and_(true(), *conditions)


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
    return shaped_filter(filter_shape(where), id_column, filter_params(where))
