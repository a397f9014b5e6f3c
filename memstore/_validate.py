"""Input rules shared by the models, the stores and the views.

What memstore stores must read back exactly equal (type and value) on SQLite and on
PostgreSQL, so everything that enters is checked against what *both* databases
round-trip, before any database work:

* **Strings** (content, names, ids, tool-call fields, URLs, conversation ids, JSON
  keys and string values, counter names, view templates) must be valid Unicode text
  that UTF-8 can encode: no NUL (``U+0000``, which PostgreSQL cannot store in text
  or JSONB) and no surrogate code point (``U+D800``–``U+DFFF``, e.g. a lone
  high surrogate left by a badly decoded file, which no UTF-8 encoder accepts).
* **JSON values** (metadata, view tool schemas, snapshot view configurations) are
  strict JSON: ``None``, ``bool``, ``int``, ``float``, ``str``, lists and objects with
  string keys, nested at most `MAX_JSON_DEPTH` levels. Numbers are limited to
  what PostgreSQL's ``jsonb`` gives back unchanged: finite floats of magnitude below
  ``1e16`` (``jsonb`` renders larger ones as integers) other than ``-0.0`` (``jsonb``
  has no negative zero), and integers of at most `MAX_JSON_INT_DIGITS` digits.
* **Integers** that reach a column fit it on both databases: seqs are at most
  `MAX_SEQ`, per-message token counts at most `MAX_TOKEN_COUNT`, token
  counter names at most `MAX_COUNTER_NAME_LENGTH` characters.
* **Sizes**: a message (content, parts, tool calls, name, ids and metadata together),
  a summary's text and a conversation's metadata are each at most
  `MAX_RECORD_BYTES` in UTF-8. PostgreSQL refuses a ``jsonb`` value over
  255 MiB and a text value over 1 GiB where SQLite (limit 1 GB) would store it; one
  bound under both gives the two databases the same outcome.

Each check raises `ValueError` with a message naming the value's place
(pydantic turns it into a ``ValidationError`` naming the field); the stores wrap it
in `InvalidInputError` for call arguments. A counter's result
is checked by `check_token_count()`, which raises that error itself.
"""

from __future__ import annotations

import inspect
import json
import math
from collections.abc import Mapping
from typing import Any

from memstore.errors import ConfigurationError, ConflictError, InvalidInputError, MemstoreError

__all__ = [
    "MAX_COUNTER_NAME_LENGTH",
    "JSON_TOO_DEEP",
    "MAX_JSON_DEPTH",
    "MAX_JSON_FLOAT",
    "MAX_JSON_INT_DIGITS",
    "MAX_RECORD_BYTES",
    "MAX_SEQ",
    "MAX_TOKEN_COUNT",
    "check_counter_name",
    "check_json",
    "check_json_size",
    "check_progress",
    "check_size",
    "check_text",
    "check_token_count",
    "check_where",
    "conversation_full",
    "is_async_callable",
    "json_size",
    "json_size_bound",
    "refuse_awaitable",
    "short_repr",
    "text_problem",
    "utf8_size",
    "validation_summary",
]

#: Deepest nesting of lists/objects accepted in a JSON value (the top-level object is 1).
MAX_JSON_DEPTH = 64

#: Why JSON *text* nested deeper than Python's parser can follow is refused (the
#: parser's ``RecursionError``, reported by the import paths).
JSON_TOO_DEEP = "JSON nested too deeply to read"

#: Floats in JSON must have a magnitude below this: PostgreSQL's ``jsonb`` stores
#: numbers as ``numeric`` and prints one written ``1e+16`` back as ``10000000000000000``,
#: which decodes as an ``int``. Below it, every float reads back as the same float.
MAX_JSON_FLOAT = 1e16

#: Integers in JSON may have at most this many decimal digits.
MAX_JSON_INT_DIGITS = 1000
_INT_BOUND = 10**MAX_JSON_INT_DIGITS

#: Largest seq a message may have: far inside both databases' signed 64-bit
#: ``BIGINT``, so that seq arithmetic (``seq + 1``, appending after a loaded
#: snapshot) can never overflow it.
MAX_SEQ = 2**62

#: Largest per-message token count (the column is a signed 32-bit ``INTEGER``).
MAX_TOKEN_COUNT = 2**31 - 1

#: Largest value of a view's integer parameters (token limits, sizes, turns) and of a
#: count a counter may return: the largest integer a float holds exactly, far beyond
#: any real context window (a larger count is a broken counter).
MAX_VIEW_INT = 2**53 - 1

#: Longest token counter name (the ``token_counter`` column is ``VARCHAR(64)``).
MAX_COUNTER_NAME_LENGTH = 64

#: Largest stored record in UTF-8 bytes (64 MiB): one message with everything it holds,
#: one summary text, one conversation's metadata. Far above any model's context window,
#: and under PostgreSQL's ``jsonb`` (255 MiB) and text (1 GiB) limits and SQLite's 1 GB.
MAX_RECORD_BYTES = 64 * 2**20


def check_token_count(counter: Any, tokens: Any) -> int:
    """A count ``counter`` returned, checked to fit the ``token_count`` column.

    Raises:
        InvalidInputError: not an int in ``[0, MAX_TOKEN_COUNT]`` (a bool is not a count).
    """
    if isinstance(tokens, int) and not isinstance(tokens, bool) and 0 <= tokens <= MAX_TOKEN_COUNT:
        return tokens
    raise InvalidInputError(
        f"token counter {counter.name!r} counted {short_repr(tokens)} tokens for a message; "
        f"a message's count must be an int in [0, {MAX_TOKEN_COUNT}]"
    )


def check_flag(value: Any, name: str,
               error: type[MemstoreError] = InvalidInputError) -> bool:
    """A yes/no argument or setting: ``True`` or ``False`` only.

    ``bool(value)`` would take ``replace="no"`` as yes, and runs a class's own
    ``__bool__``.

    Raises:
        MemstoreError: ``error`` (an argument's ``InvalidInputError`` by default; a
            setting's is a ``ConfigurationError``): ``value`` is not a bool.
    """
    if not isinstance(value, bool):
        raise error(f"{name} must be True or False, got {short_repr(value)}")
    return value


def short_repr(value: Any) -> str:
    """``repr(value)`` for an error message: shortened, and safe for huge integers."""
    if isinstance(value, int) and value.bit_length() > 200:
        return f"an integer of {value.bit_length()} bits"  # repr may refuse huge ints
    try:
        text = repr(value)
    except Exception:  # a huge int inside a container, or a __repr__ that raises
        return f"a {type(value).__name__} that cannot be shown"
    return text if len(text) <= 60 else f"{text[:40]}... ({len(text)} characters)"


def text_problem(value: str) -> str | None:
    """What makes ``value`` unstorable, or ``None`` when both databases store it exactly."""
    if value.isascii():
        if "\x00" in value:
            return f"contains a NUL character (\\x00) at index {value.index(chr(0))}, which " \
                   "databases cannot store"
        return None
    if "\x00" in value:
        return f"contains a NUL character (\\x00) at index {value.index(chr(0))}, which " \
               "databases cannot store"
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        return (f"contains a surrogate code point (U+{ord(value[exc.start]):04X}) at index "
                f"{exc.start}, which is not valid Unicode text and cannot be stored")
    return None


def check_text(value: str, what: str) -> str:
    """Return ``value`` unless it holds NUL or a surrogate code point (then ValueError)."""
    problem = text_problem(value)
    if problem is not None:
        raise ValueError(f"{what} {problem}")
    return value


def utf8_size(value: str) -> int:
    """``value``'s length in UTF-8 bytes (its length when it is ASCII: no copy)."""
    if value.isascii():
        return len(value)
    return len(value.encode("utf-8", "surrogatepass"))


def json_size(value: Any) -> int:
    """The UTF-8 size of ``value`` written as compact JSON (``value`` passed `check_json()`)."""
    return utf8_size(json.dumps(value, ensure_ascii=False, separators=(",", ":")))


def json_size_bound(value: Any) -> int:
    """An upper bound of `json_size()` without serialising (``value`` passed check_json).

    Cheap enough for every write: a JSON string takes at most 6 bytes per character
    (an escaped control character) plus its quotes, an int about a third of its bits
    in digits, any other scalar at most 32 bytes.
    """
    kind = type(value)
    if kind is str:
        return 6 * len(value) + 2
    if kind is dict or isinstance(value, Mapping):
        return 2 + sum(json_size_bound(k) + json_size_bound(v) + 2 for k, v in value.items())
    if kind is list or isinstance(value, (list, tuple)):
        return 2 + sum(json_size_bound(item) + 1 for item in value)
    if kind is int or (isinstance(value, int) and not isinstance(value, bool)):
        return int(value).bit_length() // 3 + 3
    return 32


def check_json_size(value: Any, what: str, used: int = 0) -> int:
    """The size ``value`` adds to a record that already has ``used`` bytes, checked.

    Serialises only when the cheap bound says the record might be too large; returns
    that bound otherwise (only ever compared with `MAX_RECORD_BYTES`).
    """
    size = json_size_bound(value)
    if used + size > MAX_RECORD_BYTES:
        size = json_size(value)
        check_size(used + size, what)
    return size


def check_size(size: int, what: str) -> None:
    """Raise ValueError when a record of ``size`` UTF-8 bytes exceeds `MAX_RECORD_BYTES`."""
    if size > MAX_RECORD_BYTES:
        raise ValueError(
            f"{what} is {size:,} bytes in UTF-8; the largest record memstore stores is "
            f"{MAX_RECORD_BYTES:,} bytes (64 MiB), the same on SQLite and PostgreSQL"
        )


def _float_problem(value: float) -> str | None:
    if not math.isfinite(value):
        return f"holds {value!r}, which is not valid JSON"
    if value == 0.0 and math.copysign(1.0, value) < 0:
        return "holds -0.0, which PostgreSQL reads back as 0.0; store 0.0"
    if abs(value) >= MAX_JSON_FLOAT:
        return (f"holds the float {value!r}; floats of magnitude 1e16 or more read back "
                f"as integers on PostgreSQL, so store an int (or a string) instead")
    return None


def _path(root: str, keys: list[Any]) -> str:
    """``root[k1][k2]...`` for an error message (long paths are shortened)."""
    parts = [f"[{k[:40]!r}]" if isinstance(k, str) else f"[{k}]" for k in keys]
    if len(parts) > 8:
        parts = [*parts[:4], f"...({len(parts) - 6} more)...", *parts[-2:]]
    return root + "".join(parts)


def check_json(value: Any, where: str) -> None:
    """Raise ValueError unless ``value`` is a JSON value both databases round-trip exactly.

    ``where`` names the value in the message (``"metadata"``); nested places are
    named by their keys and indexes.
    """
    _check_json(value, where, [])


def _check_json(value: Any, root: str, keys: list[Any]) -> None:
    # Exact-type fast paths first: this runs for every metadata value of every write.
    kind = type(value)
    if kind is str:
        problem = text_problem(value)
    elif kind is dict or kind is list:
        _check_container(value, root, keys)
        return
    elif value is None or kind is bool:
        return
    elif kind is int:
        problem = None if -_INT_BOUND < value < _INT_BOUND else \
            f"holds an integer of more than {MAX_JSON_INT_DIGITS} digits"
    elif kind is float:
        problem = _float_problem(value)
    # Subclasses (IntEnum, str subclasses, OrderedDict, tuples...).
    elif isinstance(value, bool):
        return
    elif isinstance(value, int):
        _check_json(int(value), root, keys)
        return
    elif isinstance(value, float):
        problem = _float_problem(float(value))
    elif isinstance(value, str):
        problem = text_problem(value)
    elif isinstance(value, (list, tuple, Mapping)):
        _check_container(value, root, keys)
        return
    else:
        problem = f"holds a {type(value).__name__}, which is not a JSON value"
    if problem is not None:
        raise ValueError(f"{_path(root, keys)} {problem}")


def _plain(item: Any) -> bool:
    """Fast path: ``item`` is a scalar that obviously passes (most JSON values are)."""
    kind = type(item)
    if kind is str:
        text: str = item
        return text.isascii() and "\x00" not in text
    if item is None or kind is bool:
        return True
    if kind is int:
        return bool(-_INT_BOUND < item < _INT_BOUND)
    if kind is float:
        number: float = item
        return 0.0 < abs(number) < MAX_JSON_FLOAT or (
            number == 0.0 and math.copysign(1.0, number) > 0)
    return False


def _check_container(value: Any, root: str, keys: list[Any]) -> None:
    if len(keys) >= MAX_JSON_DEPTH:
        raise ValueError(f"{_path(root, keys)} is nested more than {MAX_JSON_DEPTH} levels deep")
    if type(value) is dict or isinstance(value, Mapping):
        for key, item in value.items():
            if type(key) is not str or not key.isascii() or "\x00" in key:
                if not isinstance(key, str):
                    raise ValueError(
                        f"{_path(root, keys)} has a non-string key {key!r}; JSON keys are strings"
                    )
                problem = text_problem(key)
                if problem is not None:
                    raise ValueError(f"{_path(root, keys)} key {key[:40]!r} {problem}")
            if _plain(item):
                continue
            keys.append(key)
            _check_json(item, root, keys)
            keys.pop()
    else:
        for i, item in enumerate(value):
            if _plain(item):
                continue
            keys.append(i)
            _check_json(item, root, keys)
            keys.pop()


def check_counter_name(counter: Any) -> str:
    """Validate the name a counter stores with every count (it must fit the column)."""
    name = getattr(counter, "name", None)
    if not isinstance(name, str) or not name:
        raise ConfigurationError(
            f"a token counter must have a non-empty str name, got {name!r} from {counter!r}"
        )
    if len(name) > MAX_COUNTER_NAME_LENGTH:
        raise ConfigurationError(
            f"token counter name {name[:80]!r} is {len(name)} characters long; stored counts "
            f"are tagged with it, and the maximum is {MAX_COUNTER_NAME_LENGTH}"
        )
    problem = text_problem(name)
    if problem is not None:
        raise ConfigurationError(f"token counter name {name!r} {problem}")
    return name


def is_async_callable(fn: object) -> bool:
    """Whether calling ``fn`` makes a coroutine (an ``async def`` function or ``__call__``)."""
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(
        getattr(fn, "__call__", None)  # noqa: B004 - an async __call__ method
    )


def refuse_awaitable(result: object, error: Exception) -> None:
    """Raise ``error`` when ``result`` is an awaitable (a sync caller got an async result).

    A coroutine is closed first, so Python does not also warn that it was never awaited.
    """
    if inspect.isawaitable(result):
        if inspect.iscoroutine(result):
            result.close()
        raise error


def conversation_full(cid: str, what: str) -> ConflictError:
    """The error of a write whose seqs would pass `MAX_SEQ` (``what`` would)."""
    return ConflictError(
        f"conversation {cid!r} is full: {what} would take its seqs past 2**62, the largest "
        "seq memstore stores"
    )


def validation_summary(exc: Any) -> str:
    """A pydantic ``ValidationError`` as one line (``field: problem; ...``), without URLs."""
    parts = []
    for error in exc.errors(include_url=False):
        loc = ".".join(str(x) for x in error.get("loc", ()) if x != "__root__")
        msg = str(error.get("msg", "invalid")).removeprefix("Value error, ")
        parts.append(f"{loc}: {msg}" if loc else msg)
    return "; ".join(parts) or str(exc)


#: The value types a metadata filter compares (``where={"user_id": "u1"}``).
WhereValue = str | int | bool | None

#: Most keys one ``where`` filter may name.
MAX_WHERE_KEYS = 32

#: Longest metadata key or string value a filter compares (longer ones are never indexed).
MAX_WHERE_TEXT = 1000


def check_where(where: Any, name: str = "where") -> dict[str, WhereValue] | None:
    """A conversation-metadata filter: equality on top-level keys with scalar values.

    The one filter language of ``list_conversations``, ``count_conversations``,
    ``prune``, ``forget`` and ``search``. ``None`` and ``{}`` filter nothing. A value of
    ``None`` matches a conversation whose metadata lacks the key or holds JSON ``null``;
    a ``str``, ``int`` or ``bool`` matches a top-level value of the same JSON type and
    value (``1`` matches the integer 1, not ``1.0`` and not ``true``). A key no
    conversation has is simply no match.

    Raises:
        InvalidInputError: not a mapping; a key that is not a non-empty string; a value
            that is not ``str``/``int``/``bool``/``None`` (lists and objects are not
            compared); text that databases cannot store; too many keys.
    """
    if where is None:
        return None
    if not isinstance(where, Mapping):
        raise InvalidInputError(
            f"{name} must be a mapping of metadata keys to values, got {short_repr(where)}")
    if len(where) > MAX_WHERE_KEYS:
        raise InvalidInputError(f"{name} names {len(where)} keys; at most {MAX_WHERE_KEYS}")
    out: dict[str, WhereValue] = {}
    for key, value in where.items():
        if not isinstance(key, str) or not key:
            raise InvalidInputError(
                f"{name} keys must be non-empty strings, got {short_repr(key)}")
        problem = text_problem(key) or (
            f"is longer than {MAX_WHERE_TEXT} characters" if len(key) > MAX_WHERE_TEXT else None)
        if problem is not None:
            raise InvalidInputError(f"{name} key {short_repr(key)} {problem}")
        if isinstance(value, str):
            problem = text_problem(value) or (
                f"is longer than {MAX_WHERE_TEXT} characters"
                if len(value) > MAX_WHERE_TEXT else None)
            if problem is not None:
                raise InvalidInputError(f"{name}[{key!r}] {problem}")
        elif isinstance(value, int) and not isinstance(value, bool):
            if abs(value) >= 2**63:
                raise InvalidInputError(
                    f"{name}[{key!r}] must be an integer of at most 63 bits, got "
                    f"{short_repr(value)}")
        elif value is not None and not isinstance(value, bool):
            raise InvalidInputError(
                f"{name}[{key!r}] must be a str, int, bool or None (equality on a top-level "
                f"metadata value), got {type(value).__name__}")
        out[key] = value
    return out or None


def check_progress(progress: Any, what: str) -> None:
    """Refuse a ``progress`` that cannot be called, before anything is read or written."""
    if progress is not None and not callable(progress):
        raise InvalidInputError(
            f"{what} progress must be a callable taking a count, got {short_repr(progress)}"
        )
