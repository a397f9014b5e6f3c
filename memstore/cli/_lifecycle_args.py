"""Arguments of the lifecycle commands: their parsers, and the values they take.

``conversations list`` filters, ``conversations update``, ``fork``, ``prune``,
``forget`` and ``audit`` (the commands themselves are in `memstore.cli._lifecycle`).
Like `memstore.cli._app`, this module imports only the standard library, so
``memstore --help`` and a usage error stay quick; a value that is wrong is a usage
error naming its option (exit status 2).

Values on the command line:

- ``KEY=VALUE`` (``--where``, ``--set``): the value is JSON when it parses as a JSON
  scalar (``n=1`` an integer, ``on=true`` a boolean, ``x=null`` null, ``r=0.5`` a
  number), else the text as it is (``plan=pro``, ``zip=01234``). Quoted as JSON it is
  always a string: ``n='"1"'`` (the shell passes ``n="1"``).
- A duration (``--older-than``, ``--ttl``): a whole number and a unit, ``s``, ``m``,
  ``h``, ``d`` or ``w``: ``90d``, ``12h``, ``30m``, ``2w``.
- A date (``--updated-after``, ``--updated-before``, ``--expires``): ISO 8601,
  ``2026-01-31``, ``2026-01-31T12:00``, ``2026-01-31T12:00:00+02:00`` or ``...Z``;
  without an offset it is UTC.
"""

from __future__ import annotations

import argparse
import json
import re
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta, timezone
from typing import Any, NamedTuple

__all__ = [
    "Assignment",
    "add_commands",
    "add_listing_options",
    "add_update_command",
    "assignment",
    "duration",
    "instant",
    "listing_filters",
    "listing_words",
    "where_filter",
]

#: ``command(name, help, func, parent, **kw)`` of `memstore.cli._app.build_parser`.
CommandMaker = Callable[..., argparse.ArgumentParser]
#: ``_formats(parser, choices, default)`` of `memstore.cli._app`.
FormatAdder = Callable[..., None]

VALUE_RULE = ("VALUE is JSON when it is a JSON scalar (n=1 an integer, on=true a boolean, "
              "x=null null), else text; n='\"1\"' is the string \"1\"")


# ---- values -----------------------------------------------------------------------------


class Assignment(NamedTuple):
    """A ``KEY=VALUE`` argument: the key, the value it stands for, and the text given."""

    key: str
    value: Any
    text: str


def _not_a_constant(name: str) -> Any:
    raise ValueError(name)  # NaN, Infinity: not JSON (Python's json accepts them)


def json_scalar(text: str) -> Any:
    """``text`` as a JSON scalar (str, int, float, bool or None) if it is one, else ``text``."""
    try:
        value = json.loads(text, parse_constant=_not_a_constant)
    except (ValueError, RecursionError):  # not JSON, or an integer of 4,300+ digits
        return text
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return text  # a list or an object: the text itself


def assignment(text: str) -> Assignment:
    """``KEY=VALUE`` (split at the first ``=``); the value by `json_scalar`."""
    key, sep, raw = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return Assignment(key, json_scalar(raw), text)


assignment.__name__ = "KEY=VALUE"


def where_item(text: str) -> Assignment:
    """A ``--where`` condition: `assignment`, whose value a filter can compare."""
    item = assignment(text)
    if isinstance(item.value, float):
        raise argparse.ArgumentTypeError(
            f"{text!r}: numbers with a fraction or an exponent are not compared (strings, "
            f"integers, true, false and null are); {item.key}='\"{text.partition('=')[2]}\"' "
            "matches that text")
    return item


where_item.__name__ = "KEY=VALUE"

_DURATION = re.compile(r"(\d{1,9})\s*([smhdw])")
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days", "w": "weeks"}


def duration(text: str) -> timedelta:
    """``90d``, ``12h``, ``30m``, ``2w``, ``45s``: a whole number and one unit."""
    match = _DURATION.fullmatch(text.strip().lower())
    if match is None:
        raise argparse.ArgumentTypeError(
            f"expected a duration such as 90d, 12h, 30m or 2w (s, m, h, d, w), got {text!r}")
    try:
        return timedelta(**{_UNITS[match.group(2)]: int(match.group(1))})
    except OverflowError:
        raise argparse.ArgumentTypeError(f"duration {text!r} is too long") from None


duration.__name__ = "duration"


def instant(text: str) -> datetime:
    """An ISO 8601 date or date and time, in UTC (no offset: UTC)."""
    given = text.strip()
    if given[-1:] in ("Z", "z"):  # Python 3.10 reads "+00:00" only
        given = given[:-1] + "+00:00"
    try:
        value = datetime.fromisoformat(given)
    except ValueError:
        raise argparse.ArgumentTypeError(
            "expected an ISO 8601 date or time such as 2026-01-31, 2026-01-31T12:00 or "
            f"2026-01-31T12:00:00+02:00 (no offset: UTC), got {text!r}") from None
    if value.tzinfo is None or value.utcoffset() is None:
        value = value.replace(tzinfo=timezone.utc)
    return value.astimezone(timezone.utc)


instant.__name__ = "date"

#: What ``--expires never`` stands for: the conversation never expires.
NEVER = "never"


def expiry(text: str) -> datetime | str:
    """``--expires``: a date (`instant`), or ``never``."""
    return NEVER if text.strip().lower() == NEVER else instant(text)


expiry.__name__ = "date"


def _count(minimum: int, maximum: int | None = None) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < minimum or (maximum is not None and value > maximum):
            bounds = f">= {minimum}" if maximum is None else f"{minimum}-{maximum}"
            raise argparse.ArgumentTypeError(f"must be an integer {bounds}, got {value}")
        return value

    parse.__name__ = "integer"
    return parse


# ---- what the commands read back -------------------------------------------------------


def where_filter(items: Sequence[Assignment] | None, option: str = "--where") -> dict[str, Any]:
    """The ``where=`` mapping of repeated ``--where KEY=VALUE`` (a key given twice: an error)."""
    found: dict[str, Any] = {}
    for item in items or ():
        if item.key in found and found[item.key] != item.value:
            from memstore.cli._errors import UsageError

            raise UsageError(f"{option} names {item.key!r} twice, with different values "
                             "(all conditions must hold: nothing could match)")
        found[item.key] = item.value
    return found


def listing_filters(args: argparse.Namespace) -> dict[str, Any]:
    """The arguments of ``list_conversations`` that ``conversations list`` was given.

    ``where``, ``parent_id``, ``updated_after``, ``updated_before`` and ``order``; those
    not given are left out.
    """
    filters: dict[str, Any] = {}
    where = where_filter(getattr(args, "where", None))
    if where:
        filters["where"] = where
    for option, name in (("parent", "parent_id"), ("updated_after", "updated_after"),
                         ("updated_before", "updated_before")):
        value = getattr(args, option, None)
        if value is not None:
            filters[name] = value
    if getattr(args, "order", None) is not None:
        filters["order"] = args.order
    return filters


def listing_words(args: argparse.Namespace) -> list[str]:
    """The filter and order options of ``conversations list``, as a command repeats them."""
    from memstore.cli._output import shell_word

    words: list[str] = []
    for item in getattr(args, "where", None) or ():
        words += ["--where", shell_word(item.text)]
    if getattr(args, "parent", None) is not None:
        words += ["--parent", shell_word(args.parent)]
    for option in ("updated_after", "updated_before"):
        value = getattr(args, option, None)
        if value is not None:
            words += [f"--{option.replace('_', '-')}", value.isoformat()]
    if getattr(args, "order", "id") != "id":
        words += ["--order", args.order]
    return words


# ---- parsers ---------------------------------------------------------------------------


def _where(p: argparse.ArgumentParser, what: str, default: Any = None) -> None:
    p.add_argument("--where", action="append", type=where_item, default=default,
                   metavar="KEY=VALUE",
                   help=f"{what} whose metadata holds KEY with this value (repeat it: all must "
                        f"hold; KEY=null: no KEY, or null); {VALUE_RULE}")


def add_listing_options(p: argparse.ArgumentParser) -> None:
    """``conversations [list]``: the filters of ``list_conversations`` and its order.

    Defaults are SUPPRESS, as ``--limit`` and ``--after`` are: given before ``list``
    they are kept.
    """
    _where(p, "only conversations", argparse.SUPPRESS)
    p.add_argument("--parent", default=argparse.SUPPRESS, metavar="ID",
                   help="only the forks of this conversation")
    p.add_argument("--updated-after", type=instant, default=argparse.SUPPRESS, metavar="DATE",
                   help="only conversations last written after DATE (ISO 8601; no offset: UTC)")
    p.add_argument("--updated-before", type=instant, default=argparse.SUPPRESS,
                   metavar="DATE",
                   help="only conversations last written before DATE (ISO 8601; no offset: "
                        "UTC)")
    p.add_argument("--order", choices=("id", "updated"), default=argparse.SUPPRESS,
                   help="id: by id, ascending (default); updated: the most recently written "
                        "first (--after ID then continues after that conversation)")


def add_update_command(command: CommandMaker, parent: Any, formats: FormatAdder) -> None:
    """``conversations update ID``."""
    p = command("update", "change a conversation's metadata or expiry", "conversations_update",
                parent, module="_lifecycle",
                description="Change a conversation's metadata (merged: the keys not named "
                            "stay) and when it expires, in one transaction; print the "
                            "conversation as stored afterwards. 'prune --expired' deletes "
                            "the conversations whose expiry has passed.")
    p.add_argument("conversation_id", metavar="CONV", help="the conversation id")
    p.add_argument("--set", dest="set_items", action="append", type=assignment, default=None,
                   metavar="KEY=VALUE",
                   help=f"set a top-level metadata key (repeatable); {VALUE_RULE} (null "
                        "removes the key, as --unset does)")
    p.add_argument("--unset", action="append", default=None, metavar="KEY",
                   help="remove a top-level metadata key (repeatable)")
    when = p.add_mutually_exclusive_group()
    when.add_argument("--expires", type=expiry, default=None, metavar="DATE",
                      help="expire at DATE (ISO 8601; no offset: UTC), or 'never'")
    when.add_argument("--ttl", type=duration, default=None, metavar="DURATION",
                      help="expire this long from now: 30d, 12h, 2w...")
    formats(p, ("table", "json", "jsonl"))


def add_commands(command: CommandMaker, sub: Any, formats: FormatAdder) -> None:
    """``fork``, ``prune``, ``forget`` and ``audit``."""
    p = command("fork", "copy a conversation (up to a seq) into a new one", "fork",
                module="_lifecycle",
                description="Copy a conversation's messages up to --at (default: all) and "
                            "its summaries into a new conversation, inside the database "
                            "(nothing is re-tokenised), to try another branch. The source "
                            "is untouched; 'conversations list --parent SOURCE' lists its "
                            "forks. A seq that would keep a tool call without its results "
                            "is refused.")
    p.add_argument("source", metavar="SOURCE", help="the conversation to copy")
    p.add_argument("new_id", metavar="NEW", nargs="?", default=None,
                   help="the new conversation's id (default: a new UUID)")
    p.add_argument("--at", type=_count(0), default=None, metavar="SEQ",
                   help="the newest seq to copy (default: the newest message)")
    formats(p, ("table", "json", "jsonl"))

    p = command("prune", "delete what a retention policy covers (age, count, expiry)",
                "prune", module="_lifecycle",
                description="Delete the oldest messages of each conversation that a "
                            "retention policy covers, conversation by conversation, each in "
                            "its own short transaction (other writers go on), and print what "
                            "went. What goes is always the oldest part of a conversation "
                            "and never splits a tool call from its results. A policy is "
                            "required: a prune never means 'delete everything'. On a "
                            "terminal, a progress bar on standard error shows the "
                            "conversations done of the total.")
    p.add_argument("--older-than", type=duration, default=None, metavar="DURATION",
                   help="delete messages older than this: 90d, 12h, 30m, 2w...")
    p.add_argument("--keep-last", type=_count(0), default=None, metavar="N",
                   help="always keep each conversation's newest N messages (alone: keep "
                        "only them)")
    p.add_argument("--expired", action="store_true",
                   help="delete whole conversations whose expiry has passed "
                        "('conversations update --expires/--ttl' sets it)")
    _where(p, "only conversations")
    p.add_argument("--conversation", dest="conversation_ids", action="append", default=None,
                   metavar="ID", help="only this conversation (repeatable)")
    p.add_argument("--keep-anchored", action=argparse.BooleanOptionalAction, default=True,
                   help="keep system, developer and pinned messages, moved up before the "
                        "first kept message, so every window keeps them (default; "
                        "--no-keep-anchored deletes them with the rest)")
    p.add_argument("--keep-summaries", action=argparse.BooleanOptionalAction, default=True,
                   help="keep the summaries of deleted ranges, so summary views still show "
                        "what was there (default)")
    p.add_argument("--drop-empty", action="store_true",
                   help="delete conversations left with no message")
    p.add_argument("--dry-run", action="store_true",
                   help="count what would go; write nothing")
    formats(p, ("table", "json", "jsonl"))

    p = command("forget", "erase every conversation of a person or tenant, with an audit "
                "entry", "forget", module="_lifecycle",
                description="Erase the selected conversations (their messages, summaries, "
                            "metadata and search index entries) and every fork descending "
                            "from them, in one transaction, and append an audit entry (when, "
                            "how many, --reason, a sha256 digest of the selector; never its "
                            "values). There is no undo: on a terminal it asks first; "
                            "otherwise it needs --yes. Not confirmed: nothing is deleted, "
                            "exit status 2.")
    _where(p, "erase the conversations")
    p.add_argument("--conversation", dest="conversation_ids", action="append", default=None,
                   metavar="ID",
                   help="erase this conversation (repeatable; with --where: both sets)")
    p.add_argument("--reason", default=None, metavar="TEXT",
                   help="why, stored in the audit entry (keep personal data out of it)")
    p.add_argument("--vacuum", action="store_true",
                   help="VACUUM afterwards (PostgreSQL: memstore's tables; SQLite: the "
                        "whole file, clearing what writes made before memstore turned "
                        "secure_delete on may have left in free space)")
    p.add_argument("-y", "--yes", action="store_true",
                   help="do not ask for confirmation (required when standard input is not "
                        "a terminal)")
    p.add_argument("--dry-run", action="store_true",
                   help="erase nothing, record nothing: count what would go (forks "
                        "included); no confirmation needed")
    formats(p, ("table", "json", "jsonl"))

    p = command("audit", "show the audit log of what forget erased", "audit",
                module="_lifecycle",
                description="Show the audit log, oldest first: one entry per forget (when, "
                            "how many conversations and messages, the reason, the sha256 "
                            "digest of the selector: in --format json or jsonl). It never "
                            "holds the erased values.")
    p.add_argument("--limit", type=_count(1, 10_000), default=100, metavar="N",
                   help="entries per page, 1-10000 (default: 100)")
    p.add_argument("--after", type=_count(0), default=None, metavar="ENTRY",
                   help="start after this entry id (keyset pagination)")
    formats(p, ("table", "json", "jsonl"))
