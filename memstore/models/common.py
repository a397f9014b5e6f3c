"""What every model shares: roles, limits, and the checks of ids, JSON and times."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timezone
from typing import Any, Literal

from pydantic import (
    ConfigDict,
)

from memstore._validate import (
    check_json,
    check_text,
)

Role = Literal["system", "developer", "user", "assistant", "tool"]
ROLES: tuple[str, ...] = ("system", "developer", "user", "assistant", "tool")
ANCHOR_ROLES: frozenset[str] = frozenset({"system", "developer"})

MAX_ID_LENGTH = 255
_MAX_FLOAT = 1.7976931348623157e308
STATE_VERSION = 2
#: Snapshot versions ``ConversationState`` reads (version 1 predates summaries).
READABLE_STATE_VERSIONS = (1, 2)
#: The default ``SummaryView`` template (``{first}``, ``{last}``: the summary's seq range).
DEFAULT_SUMMARY_TEMPLATE = "Summary of messages {first}–{last}: {text}"

_FROZEN = ConfigDict(frozen=True, extra="forbid")

# Keys of an OpenAI chat message that carry no information memstore keeps; accepted
# by ``Message.from_openai`` only when empty (``None``, ``[]`` or ``""``).
_IGNORABLE_OPENAI_KEYS = frozenset({"refusal", "annotations", "audio", "function_call"})


def _reject_nul(value: str, what: str) -> str:
    """Return ``value`` unless it cannot be stored exactly (NUL or a surrogate code point)."""
    return check_text(value, what)


def _check_json(value: Any, where: str) -> None:
    """Raise ValueError unless ``value`` is JSON both databases read back exactly equal."""
    check_json(value, where)


def same_json(a: Any, b: Any) -> bool:
    """Whether two JSON values are equal as JSON: ``1``, ``1.0`` and ``True`` differ.

    Object key order does not matter; list order does. Containers may be read-only
    ones (a stored message's) or plain ones.
    """
    if a != b:
        return False  # (== is necessary; it is only not sufficient)
    return _same_json(a, b)


def _json_kind(value: Any) -> type:
    if isinstance(value, bool):
        return bool
    if isinstance(value, int):
        return int
    if isinstance(value, Mapping):
        return dict
    if isinstance(value, (list, tuple)):
        return list
    return type(value)  # float, str, NoneType


def _same_json(a: Any, b: Any) -> bool:
    kind = _json_kind(a)
    if kind is not _json_kind(b):
        return False
    if kind is dict:
        return all(_same_json(item, b[key]) for key, item in a.items())
    if kind is list:
        return all(_same_json(x, y) for x, y in zip(a, b))
    return True  # equal scalars of one kind (checked by the caller's ==)


def _validate_id(value: str, what: str) -> str:
    if not value:
        raise ValueError(f"{what} must not be empty")
    if len(value) > MAX_ID_LENGTH:
        raise ValueError(f"{what} is {len(value)} characters long; the maximum is {MAX_ID_LENGTH}")
    return check_text(value, what)


def _utc(value: datetime) -> datetime:
    """A timezone-aware UTC datetime (naive values are taken as UTC)."""
    if value.tzinfo is None:
        value = value.replace(tzinfo=timezone.utc)
    else:
        try:
            value = value.astimezone(timezone.utc)
        except OverflowError:
            raise ValueError(
                f"{value.isoformat()} is out of range once converted to UTC") from None
    if not _EARLIEST <= value <= _LATEST:
        # PostgreSQL returns a timestamptz in the session's time zone: a value within a
        # day of Python's datetime bounds would overflow there for some session (and
        # make its conversation unreadable to that client).
        raise ValueError(f"{value.isoformat()} is out of range: timestamps must lie between "
                         f"{_EARLIEST.isoformat()} and {_LATEST.isoformat()}")
    return value


#: The stored range of timestamps: every time zone can represent them.
_EARLIEST = datetime(1, 1, 2, tzinfo=timezone.utc)
_LATEST = datetime(9999, 12, 30, 23, 59, 59, 999999, tzinfo=timezone.utc)


