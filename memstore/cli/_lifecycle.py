"""The lifecycle commands: ``conversations update``, ``fork``, ``prune``, ``forget``, ``audit``.

Thin layers over [`MemoryStore.update_conversation`][memstore.MemoryStore.update_conversation],
[`MemoryStore.fork`][memstore.MemoryStore.fork], [`MemoryStore.prune`][memstore.MemoryStore.prune],
[`MemoryStore.forget`][memstore.MemoryStore.forget] and
[`MemoryStore.audit_log`][memstore.MemoryStore.audit_log] (``conversations list``'s filters
are in `memstore.cli._commands`). Their options and the values they take are declared in
`memstore.cli._lifecycle_args`.

Data goes to standard output (a table on a terminal, JSON lines otherwise); the progress
of a prune and the question a forget asks go to standard error.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from memstore.cli import _output as out
from memstore.cli._commands import fmt, open_store
from memstore.cli._errors import UsageError
from memstore.cli._lifecycle_args import NEVER, where_filter
from memstore.errors import InvalidInputError
from memstore.models import AuditEntry, Conversation

__all__ = ["audit", "conversations_update", "fork", "forget", "prune"]


def _when(moment: Any) -> str:
    return "never" if moment is None else moment.strftime("%Y-%m-%d %H:%M:%S")


def print_conversation(conv: Conversation, form: str) -> None:
    """One conversation: its row as JSON, or a table of its fields."""
    if form == "jsonl":
        out.print_jsonl([conv.model_dump_json()])
    elif form == "json":
        out.print_json(conv.model_dump(mode="json"))
    else:
        rows = [("id", conv.id), ("messages", f"{conv.message_count:,}"),
                ("tokens", f"{conv.token_count:,}"), ("created (UTC)", _when(conv.created_at)),
                ("updated (UTC)", _when(conv.updated_at)),
                ("expires (UTC)", _when(conv.expires_at)),
                ("metadata", json.dumps(conv.metadata, ensure_ascii=False))]
        if conv.parent_id is not None:
            rows.append(("forked from", f"{conv.parent_id} at seq {conv.forked_at_seq}"))
        out.console().print(out.table(["field", "value"], rows))


# ---- conversations update ---------------------------------------------------------------


def conversations_update(args: argparse.Namespace) -> int:
    """``memstore conversations update CONV [--set K=V]... [--unset K]... [--expires|--ttl]``."""
    metadata: dict[str, Any] = {}
    for item in args.set_items or ():
        if item.key in metadata and metadata[item.key] != item.value:
            raise UsageError(f"--set names {item.key!r} twice, with different values")
        metadata[item.key] = item.value
    for key in args.unset or ():
        if metadata.get(key) is not None:
            raise UsageError(f"--set and --unset both name {key!r}")
        metadata[key] = None  # the merge removes a key set to None
    changes: dict[str, Any] = {}
    if metadata:
        changes["metadata"] = metadata
    if args.expires is not None:
        changes["expires_at"] = None if args.expires == NEVER else args.expires
    elif args.ttl is not None:
        changes["expires_at"] = args.ttl
    if not changes:
        raise UsageError("nothing to change: give --set KEY=VALUE, --unset KEY, --expires DATE "
                         "or --ttl DURATION")
    with open_store(args, write=True) as store:
        conv = store.update_conversation(args.conversation_id, **changes)
    print_conversation(conv, fmt(args))
    return 0


# ---- fork -------------------------------------------------------------------------------


def fork(args: argparse.Namespace) -> int:
    """``memstore fork SOURCE [NEW] [--at SEQ]``."""
    with open_store(args, write=True) as store:
        try:
            conv = store.fork(args.source, args.new_id, at_seq=args.at)
        except InvalidInputError as exc:
            if not str(exc).startswith("at_seq "):
                raise
            raise UsageError("--at " + str(exc).removeprefix("at_seq ")) from exc
    form = fmt(args)
    if form != "table":
        print_conversation(conv, form)
        return 0
    print(f"forked {out.safe(repr(args.source))} at seq {conv.forked_at_seq} into "
          f"{out.safe(repr(conv.id))}: {out.counted(conv.message_count, 'message')}, "
          f"{out.counted(conv.token_count, 'token')}")
    return 0


# ---- prune ------------------------------------------------------------------------------


def prune(args: argparse.Namespace) -> int:
    """``memstore prune --older-than 90d [--keep-last N] [--expired] [--where K=V]...``.

    A dry run opens the database as the reading commands do (no migration, nothing
    written). On a terminal the progress bar's total is
    [`MemoryStore.count_conversations`][memstore.MemoryStore.count_conversations] of the
    same filter (or the number of ``--conversation`` ids).
    """
    if args.older_than is None and args.keep_last is None and not args.expired:
        raise UsageError("nothing to prune: give --older-than DURATION, --keep-last N or "
                         "--expired (a prune never means 'delete everything')")
    where = where_filter(args.where) or None
    ids = list(dict.fromkeys(args.conversation_ids)) if args.conversation_ids else None
    with open_store(args, write=not args.dry_run) as store:
        total: int | None = None
        if out.progress_shown():
            total = len(ids) if ids is not None else store.count_conversations(where=where)
        verb = "counting" if args.dry_run else "pruning"
        with out.progress_bar(verb, total, unit="conversations") as progress:
            report = store.prune(
                older_than=args.older_than, keep_last=args.keep_last, expired=args.expired,
                where=where, conversation_ids=ids, keep_anchored=args.keep_anchored,
                keep_summaries=args.keep_summaries, drop_empty=args.drop_empty,
                dry_run=args.dry_run, progress=progress)
    form = fmt(args)
    if form == "jsonl":
        out.print_jsonl([report.model_dump_json()])
        return 0
    if form == "json":
        out.print_json(report.model_dump(mode="json"))
        return 0
    gone = "would go" if report.dry_run else "deleted"
    rows = [("conversations scanned", f"{report.conversations_scanned:,}"),
            ("conversations touched", f"{report.conversations_touched:,}"),
            (f"messages {gone}", f"{report.messages_deleted:,}"),
            (f"summaries {gone}", f"{report.summaries_deleted:,}"),
            (f"conversations {gone} whole", f"{report.conversations_dropped:,}")]
    title = "prune (dry run: nothing was deleted)" if report.dry_run else "prune"
    out.console().print(out.table(["", ("count", {"justify": "right"})], rows, title=title))
    return 0


# ---- forget -----------------------------------------------------------------------------


def _confirmed(question: str) -> bool:
    """Ask on standard error; read the answer from standard input (a terminal)."""
    sys.stderr.write(f"{question} [y/N] ")
    sys.stderr.flush()
    answer = sys.stdin.readline()
    if not answer.endswith("\n"):  # end of input: no answer
        sys.stderr.write("\n")
    return answer.strip().lower() in ("y", "yes")


def _question(matched: int | None, where: dict[str, Any] | None, ids: list[str] | None,
              database: str, would: Any) -> str:
    """What a forget asks: which conversations, how much goes, and where.

    ``matched``: how many the filter matches now; ``would``: the dry run's report.
    """
    parts = []
    if where:
        shown = " and ".join(f"{key}={json.dumps(value, ensure_ascii=False)}"
                             for key, value in where.items())
        parts.append(f"the {out.counted(matched or 0, 'conversation')} matching {shown}")
    if ids:
        named = ", ".join(repr(cid) for cid in ids[:3]) + (", ..." if len(ids) > 3 else "")
        parts.append(f"{'those' if where else 'the conversations'} named by --conversation "
                     f"({named})")
    total = (f" ({out.counted(would.conversations, 'conversation')} with the forks, "
             f"{out.counted(would.messages, 'message')})")
    return out.safe(f"Erase {' and '.join(parts)}, with every fork of them{total}, from "
                    f"{database}? There is no undo.")


def forget(args: argparse.Namespace) -> int:
    """``memstore forget --where K=V... [--conversation ID]... [--reason TEXT] [--vacuum]``.

    ``--dry-run`` counts what would go (forks included) and deletes nothing.

    Without ``--yes`` it asks on a terminal (standard input) and is refused otherwise;
    not confirmed, it deletes nothing and exits with status 2. The question names how
    many conversations the ``--where`` filter matches now
    ([`MemoryStore.count_conversations`][memstore.MemoryStore.count_conversations]).
    """
    where = where_filter(args.where) or None
    ids = list(dict.fromkeys(args.conversation_ids)) if args.conversation_ids else None
    if not where and not ids:
        raise UsageError("forget needs a selector: --where KEY=VALUE or --conversation ID "
                         "(a forget never means 'delete everything')")
    if args.dry_run:
        if args.vacuum:
            raise UsageError("--vacuum with --dry-run: a dry run deletes nothing to reclaim")
        with open_store(args) as store:  # a read: nothing is written (or migrated)
            report = store.forget(where=where, conversation_ids=ids, dry_run=True)
        return _forget_report(report, args)
    if not args.yes:
        if not sys.stdin.isatty():
            raise UsageError("forget erases for good: pass --yes to confirm (standard input "
                             "is not a terminal to ask on); nothing was deleted")
        with open_store(args) as store:  # nothing is written (or migrated) before a yes
            matched = store.count_conversations(where=where) if where else None
            would = store.forget(where=where, conversation_ids=ids, dry_run=True)
            database = store.engine.url.render_as_string(hide_password=True)
        if not _confirmed(_question(matched, where, ids, database, would)):
            out.status("memstore: not confirmed: nothing was deleted")
            return 2
    with open_store(args, write=True) as store:
        report = store.forget(where=where, conversation_ids=ids, reason=args.reason,
                              vacuum=args.vacuum)
    return _forget_report(report, args)


def _forget_report(report: Any, args: argparse.Namespace) -> int:
    form = fmt(args)
    if form == "jsonl":
        out.print_jsonl([report.model_dump_json()])
    elif form == "json":
        out.print_json(report.model_dump(mode="json"))
    elif report.dry_run:
        print(f"would erase {out.counted(report.conversations, 'conversation')}, "
              f"{out.counted(report.messages, 'message')} (dry run: nothing was deleted)")
    else:
        print(f"erased {out.counted(report.conversations, 'conversation')}, "
              f"{out.counted(report.messages, 'message')} (audit entry {report.audit_id})")
    return 0


# ---- audit ------------------------------------------------------------------------------


def _entry_row(e: AuditEntry) -> tuple[str, ...]:
    return (str(e.id), _when(e.at), e.operation, f"{e.conversations:,}", f"{e.messages:,}",
            out.preview(e.reason or "", 60))


def audit(args: argparse.Namespace) -> int:
    """``memstore audit [--limit N] [--after ENTRY]``: one page of the audit log.

    The table leaves out the selector digests (64 hex digits); JSON has every field.
    """
    with open_store(args) as store:
        page = store.audit_log(limit=args.limit, after=args.after)
        more = len(page) == args.limit and bool(store.audit_log(limit=1, after=page[-1].id))
    form = fmt(args)
    if form == "jsonl":
        out.print_jsonl([e.model_dump_json() for e in page])
    elif form == "json":
        out.print_json([e.model_dump(mode="json") for e in page])
    else:
        out.console().print(out.table(
            [("id", {"justify": "right"}), ("at (UTC)", {"no_wrap": True}), "operation",
             ("conversations", {"justify": "right"}), ("messages", {"justify": "right"}),
             "reason"], [_entry_row(e) for e in page]))
    if more:
        words = ["memstore", "audit", "--after", str(page[-1].id), "--limit", str(args.limit)]
        if getattr(args, "format", None):
            words += ["--format", args.format]
        out.status(f"more after this page: {' '.join(words)}")
    return 0
