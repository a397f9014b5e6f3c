"""Moving conversations between databases: a streaming JSON Lines export and import.

Example:
    >>> import io
    >>> from memstore import MemoryStore, Message, export_jsonl, import_jsonl
    >>> source, target = MemoryStore("sqlite://"), MemoryStore("sqlite://")
    >>> _ = source.extend("chat-1", [Message.user("Hello"), Message.assistant("Hi!")])
    >>> buffer = io.StringIO()
    >>> export_jsonl(source, buffer)
    ExportResult(conversations=1, messages=2, summaries=0)
    >>> _ = buffer.seek(0)
    >>> import_jsonl(target, buffer).conversations[0].written
    2
    >>> _ = buffer.seek(0)
    >>> import_jsonl(target, buffer).conversations[0].unchanged   # idempotent
    2

The format (``docs/export-format.md``): for each conversation a header line::

    {"memstore_export":1,"type":"conversation","id":...,"created_at":...,
     "updated_at":...,"metadata":{...},"message_count":N}

then ``N`` lines, one per message, each the JSON of a [`StoredMessage`][memstore.StoredMessage]
(every
stored field: seq, id, created_at, role, content, name, tool_calls, tool_call_id,
score, pinned, metadata, token_count, token_counter, conversation_id), then one
line per stored summary, oldest first::

    {"memstore_export":1,"type":"summary","conversation_id":...,"number":1,
     "first_seq":...,"last_seq":...,"text":...,"token_count":...,
     "token_counter":...,"created_at":...}

Both directions stream: the export reads each conversation in keyset pages from
one snapshot, the import writes each conversation in batches of
`IMPORT_BATCH` messages inside one transaction, so memory does not grow with
a conversation's length.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, TextIO, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError

from memstore import _base
from memstore._db import snapshots as _snapshots
from memstore._db import stateio as _stateio
from memstore._validate import (
    JSON_TOO_DEEP,
    check_flag,
    check_progress,
    short_repr,
    validation_summary,
)
from memstore.errors import (
    ConflictError,
    ImportFormatError,
    InvalidInputError,
    MemstoreError,
)
from memstore.models import Conversation, LoadReport, StoredMessage, Summary
from memstore.store import MemoryStore

__all__ = [
    "EXPORT_VERSION",
    "ExportResult",
    "ImportResult",
    "ImportedConversation",
    "LoadReport",
    "check_first_line",
    "conflicts_with_stored",
    "export_jsonl",
    "import_jsonl",
]

#: The version of the line format written in every header's ``memstore_export``.
EXPORT_VERSION = 1

#: A record a line of a conversation holds.
_Owned = TypeVar("_Owned", StoredMessage, Summary)

#: Messages read per page on export.
EXPORT_PAGE = 1000
#: Messages written per batch on import (all batches of a conversation: one transaction).
IMPORT_BATCH = 500


_FROZEN = ConfigDict(frozen=True, extra="forbid")
_HEADER_FIELDS = frozenset({"id", "created_at", "updated_at", "metadata", "message_count"})

Progress = Callable[[int], None]


class ExportResult(BaseModel):
    """What [`export_jsonl()`][memstore.export_jsonl] wrote.

    Attributes:
        conversations: conversations exported (one header line each).
        messages: message lines written.
        summaries: summary lines written.
    """

    model_config = _FROZEN

    __str__ = BaseModel.__repr__  # print() names the class

    conversations: int
    messages: int
    summaries: int = 0


class ImportedConversation(BaseModel):
    """What [`import_jsonl()`][memstore.import_jsonl] did to one conversation.

    Attributes:
        id: the conversation written (the ``rename`` target when one was given).
        written: messages stored by this import.
        unchanged: messages already stored with the same client id and content
            (a re-import stores nothing new).
        replaced: an existing conversation was deleted first (``replace=True``).
        recounted: messages whose token count (or counter) was recomputed: counts in
            a file are not trusted.
        summaries: summaries stored by this import.
        summaries_unchanged: summaries already stored with the same number, range
            and text.
    """

    model_config = _FROZEN

    __str__ = BaseModel.__repr__  # print() names the class

    id: str
    written: int
    unchanged: int
    replaced: bool
    recounted: int = 0
    summaries: int = 0
    summaries_unchanged: int = 0


class ImportResult(BaseModel):
    """What `import_jsonl()` did, one entry per conversation in file order."""

    model_config = _FROZEN

    __str__ = BaseModel.__repr__  # print() names the class

    conversations: list[ImportedConversation]


# ---- export ---------------------------------------------------------------------------


def _check_store(store: Any, what: str) -> None:
    if not isinstance(store, MemoryStore):
        raise InvalidInputError(
            f"{what} takes a MemoryStore, not {type(store).__name__} (with an "
            "AsyncMemoryStore, run it in a thread on a MemoryStore of the same URL)"
        )


def _header_line(conversation: Conversation) -> str:
    body = conversation.model_dump_json(include=set(_HEADER_FIELDS))
    return f'{{"memstore_export":{EXPORT_VERSION},"type":"conversation",{body[1:]}\n'


def _summary_line(summary: Summary) -> str:
    body = summary.model_dump_json()
    return f'{{"memstore_export":{EXPORT_VERSION},"type":"summary",{body[1:]}\n'


def _all_ids(store: MemoryStore) -> Iterator[str]:
    after: str | None = None
    while True:
        page = store.list_conversations(limit=EXPORT_PAGE, after=after)
        for conversation in page:
            yield conversation.id
        if len(page) < EXPORT_PAGE:
            return
        after = page[-1].id


def export_jsonl(
    store: MemoryStore,
    fp: TextIO,
    conversation_ids: Iterable[str] | None = None,
    *,
    progress: Progress | None = None,
) -> ExportResult:
    """Write conversations to ``fp`` in memstore's JSON Lines export format.

    Each conversation is read from one snapshot (its header, messages and summaries
    agree even while others write) in keyset pages of `EXPORT_PAGE` messages,
    so memory stays flat however long it is. Its summary lines (one per
    ``summarize`` call, so few) follow its message lines.

    Args:
        store: the store to read.
        fp: a text file open for writing.
        conversation_ids: the conversations to export, in this order; ``None``
            exports every conversation, in id order (listed in keyset pages).
        progress: called with the number of messages written since its previous call.

    Returns:
        How many conversations, messages and summaries were written.

    Raises:
        ConversationNotFoundError: a requested conversation does not exist (the
            conversations before it are already written).
    """
    _check_store(store, "export_jsonl")
    _stateio.check_writable(fp, "export_jsonl")
    if isinstance(conversation_ids, str):
        raise InvalidInputError(
            "conversation_ids must be a list of ids, not a single string"
        )
    check_progress(progress, "export_jsonl")
    try:
        ids = _all_ids(store) if conversation_ids is None else iter(conversation_ids)
    except TypeError:
        raise InvalidInputError(
            f"conversation_ids must be a list of ids, not {type(conversation_ids).__name__}"
        ) from None
    conversations = messages = summary_count = 0
    for cid in ids:
        summaries: list[Summary] = []
        stream = store._stream(_base.check_conversation_id(cid), None, None, EXPORT_PAGE,
                               summaries)
        try:
            for conversation, page in stream:
                if conversation is not None:
                    fp.write(_header_line(conversation))
                    conversations += 1
                if page:
                    fp.write("\n".join(m.model_dump_json() for m in page))
                    fp.write("\n")
                    messages += len(page)
                    if progress is not None:
                        progress(len(page))
        finally:
            # A write that fails (a full disk, a closed pipe) or a progress callback
            # that raises: the snapshot's connection is released now, not when the
            # exception's traceback lets the generator go (its open transaction held
            # its locks until then: a TRUNCATE or migration waited behind it).
            stream.close()
        for summary in summaries:
            fp.write(_summary_line(summary))
        summary_count += len(summaries)
    return ExportResult(conversations=conversations, messages=messages,
                        summaries=summary_count)


# ---- import ---------------------------------------------------------------------------


class _Lines:
    """Numbered, parsed, non-blank lines of a file, with one line of lookahead."""

    def __init__(self, fp: TextIO) -> None:
        self._fp = fp
        self._no = 0
        self._ahead: tuple[int, dict[str, Any]] | None = None
        self.last = 0

    def peek(self) -> tuple[int, dict[str, Any]] | None:
        if self._ahead is None:
            self._ahead = self._read()
        return self._ahead

    def take(self) -> tuple[int, dict[str, Any]] | None:
        item = self.peek()
        self._ahead = None
        return item

    def _read(self) -> tuple[int, dict[str, Any]] | None:
        while True:
            try:
                line = self._fp.readline()
            except UnicodeDecodeError as exc:
                raise ImportFormatError(self._no + 1, f"not UTF-8 text: {exc}") from None
            if not line:
                return None
            if not isinstance(line, str):
                raise ImportFormatError(1, "import_jsonl reads text files (open with mode 'r')")
            self._no += 1
            self.last = self._no
            if not line.strip():
                continue
            try:
                value = json.loads(line)
            except ValueError as exc:
                raise ImportFormatError(self._no, f"not JSON: {exc}") from None
            except RecursionError:
                raise ImportFormatError(self._no, JSON_TOO_DEEP) from None
            if not isinstance(value, dict):
                raise ImportFormatError(self._no, "a line must hold a JSON object")
            return self._no, value


def _is_header(line: dict[str, Any]) -> bool:
    return "memstore_export" in line


def _check_version(line_no: int, line: dict[str, Any]) -> None:
    version = line.get("memstore_export")
    if type(version) is not int or version != EXPORT_VERSION:  # (true == 1 == 1.0)
        raise ImportFormatError(
            line_no, f"export format version {short_repr(version)} is not supported "
            f"(this memstore reads version {EXPORT_VERSION})"
        )


def _is_summary(line: dict[str, Any]) -> bool:
    return _is_header(line) and line.get("type") == "summary"


def _header(line_no: int, line: dict[str, Any]) -> tuple[Conversation, int]:
    """The conversation a header line describes, with its message count."""
    _check_version(line_no, line)
    kind = line.get("type")
    if kind == "summary":
        raise ImportFormatError(
            line_no, "a summary line before any conversation header (summary lines "
            "follow their conversation's messages)"
        )
    if kind != "conversation":
        raise ImportFormatError(line_no, f"unknown line type {short_repr(kind)}")
    fields = {k: v for k, v in line.items() if k not in ("memstore_export", "type")}
    missing = _HEADER_FIELDS - set(fields)
    extra = set(fields) - _HEADER_FIELDS
    if missing or extra:
        what = (f"missing {', '.join(sorted(missing))}" if missing
                else f"unknown fields {', '.join(sorted(extra))}")
        raise ImportFormatError(line_no, f"bad conversation header: {what}")
    count = fields["message_count"]
    if not isinstance(count, int) or isinstance(count, bool) or count < 0:
        raise ImportFormatError(
            line_no, f"message_count must be an int >= 0, got {short_repr(count)}"
        )
    try:
        conversation = Conversation.model_validate(fields)
    except ValidationError as exc:
        raise ImportFormatError(
            line_no, f"bad conversation header: {validation_summary(exc)}") from None
    return conversation, count


def _message(line_no: int, line: dict[str, Any], cid: str, source: str | None) -> StoredMessage:
    """A message line as a StoredMessage of conversation ``cid``.

    ``source`` is the header's id: a line naming another conversation is an error.
    Without a header (``rename`` given) the line's own ``conversation_id`` is ignored.
    """
    return _owned(line_no, line, cid, source, StoredMessage, "message", "a stored message")


def _summary(line_no: int, line: dict[str, Any], cid: str, source: str | None) -> Summary:
    """A summary line as a Summary of conversation ``cid`` (owner checked as messages)."""
    _check_version(line_no, line)
    fields = {k: v for k, v in line.items() if k not in ("memstore_export", "type")}
    return _owned(line_no, fields, cid, source, Summary, "summary", "a summary")


def _owned(line_no: int, fields: dict[str, Any], cid: str, source: str | None,
           model: type[_Owned], what: str, kind: str) -> _Owned:
    """``fields`` validated as ``model`` of conversation ``cid`` (a line of ``source``)."""
    owner = fields.get("conversation_id")
    if source is not None and owner is not None and owner != source:
        raise ImportFormatError(
            line_no, f"the {what} belongs to conversation {owner!r}, not {source!r}"
        )
    try:
        return model.model_validate({**fields, "conversation_id": cid})
    except ValidationError as exc:
        raise ImportFormatError(line_no, f"not {kind}: {validation_summary(exc)}") from None


def _check_summary(
    line_no: int, summary: Summary, previous: Summary | None, last_seq: int | None,
) -> None:
    """A summary line must extend the previous one and lie within the imported messages."""
    if previous is not None and (
        summary.number <= previous.number or summary.first_seq > previous.first_seq
        or summary.last_seq < previous.last_seq
    ):
        raise ImportFormatError(
            line_no, f"summary {summary.number} ({summary.first_seq}..{summary.last_seq}) "
            f"does not extend summary {previous.number} "
            f"({previous.first_seq}..{previous.last_seq})"
        )
    problem = _snapshots.check_stream_summaries([summary], last_seq)
    if problem is not None:
        raise ImportFormatError(line_no, f"{problem}: its range is not in the imported messages")


#: What an import error says about ``rename`` (the CLI names its ``--as`` flag instead).
RENAME_HINT = "pass rename= to import bare message lines into one conversation"
RENAME_ONE = "rename imports one conversation, and the file holds more"


def check_first_line(line: Mapping[str, Any], *, line_no: int = 1,
                     rename: str | None = None) -> None:
    """Check the first line of an export file as `import_jsonl()` will, touching nothing.

    For a caller that must not open (and perhaps create and migrate) a database for a
    wrong file, as ``memstore import`` does: a conversation header of a version this
    memstore reads, or, with ``rename``, a bare message line.

    Args:
        line: the file's first non-blank line, parsed.
        line_no: its 1-based line number (blank lines may come before it).
        rename: the ``rename`` the import will be given.

    Raises:
        ImportFormatError: the line is not one an import accepts first.
        InvalidInputError: ``rename`` is not a valid conversation id.
    """
    target = _base.check_conversation_id(rename) if rename is not None else None
    first = dict(line)
    if _is_header(first):
        _header(line_no, first)
    elif target is None:
        raise ImportFormatError(
            line_no, f"a message line before any conversation header ({RENAME_HINT})")
    else:
        _message(line_no, first, target, None)


def import_jsonl(
    store: MemoryStore,
    fp: TextIO,
    *,
    replace: bool = False,
    rename: str | None = None,
    progress: Progress | None = None,
) -> ImportResult:
    """Read memstore's JSON Lines export format from ``fp`` into ``store``.

    Each conversation is written in one transaction, in batches of
    `IMPORT_BATCH` messages: all of it or nothing. A conversation that does
    not exist is created with the header's fields and its messages keep every stored
    field (seq, id, timestamps, score, pinned, metadata). For one that exists:

    * by default messages are matched by id: one already stored with the same
      content is ``unchanged`` (importing a file twice stores nothing new), a new
      one is appended, one stored with other content is a `ConflictError`;
      the stored conversation's metadata is kept;
    * ``replace=True`` deletes it first and writes the file's version.

    Summary lines are stored with a conversation created (or replaced) by the
    import. Into one that existed, a summary stored with the same number, range and
    text is ``summaries_unchanged``, one with the same number and other content is a
    `ConflictError`, and a new one is stored only when every imported
    message sits at its own seq in the store (so its range means the same
    messages) and it extends the newest stored summary; otherwise it is left out.

    Token counts in the file are not trusted: every message is recounted (see
    `ImportedConversation.recounted`).

    Args:
        store: the store to write.
        fp: a text file open for reading.
        replace: overwrite conversations that exist.
        rename: import the file's one conversation under this id. The file may then
            also be bare message lines with no header (``memstore messages CONV
            --format jsonl``); a second conversation in the file is an error, and
            nothing is imported then.
        progress: called with the number of messages processed since its previous
            call.

    Returns:
        One [`ImportedConversation`][memstore.ImportedConversation] per conversation, in file order.

    Any `MemstoreError` raised (a conflict, a database error) carries ``.imported``:
    the conversations before the one that failed, which are stored.

    Raises:
        ImportFormatError: a line is not valid (``.line`` is its 1-based number; its
            conversation is untouched, the ones before it are imported and listed in
            ``.imported``).
        ConflictError: a message id is stored with other content.
    """
    _check_store(store, "import_jsonl")
    _stateio.check_readable(fp, "import_jsonl")
    replace = check_flag(replace, "replace")
    check_progress(progress, "import_jsonl")
    target = _base.check_conversation_id(rename) if rename is not None else None
    lines = _Lines(fp)
    done: list[ImportedConversation] = []
    try:
        while (item := lines.peek()) is not None:
            line_no, line = item
            header: Conversation | None = None
            expected: int | None = None
            if _is_header(line):
                lines.take()
                header, expected = _header(line_no, line)
            elif target is None:
                raise ImportFormatError(
                    line_no, f"a message line before any conversation header ({RENAME_HINT})"
                )
            done.append(_import_one(store, lines, line_no, header, expected, target,
                                    replace, progress))
    except MemstoreError as exc:
        # Whatever stopped the import, the conversations before it are committed.
        exc.imported = list(done)  # type: ignore[attr-defined]
        raise
    return ImportResult(conversations=done)


def _import_one(
    store: MemoryStore, lines: _Lines, line_no: int, header: Conversation | None,
    expected: int | None, target: str | None, replace: bool, progress: Progress | None,
) -> ImportedConversation:
    cid = target if target is not None else header.id if header is not None else ""
    source = header.id if header is not None else None
    recounter = _snapshots.Recounter(store.counter)
    with store._write_connection() as conn:
        loader = _snapshots.Loader(conn, cid, header, "replace" if replace else "merge", recounter)
        try:
            imported = _import_rows(lines, loader, line_no, expected, source, progress,
                                    recounter)
            following = lines.peek()
            if target is not None and following is not None:
                # Refused before this transaction commits: nothing of the file is stored.
                raise ImportFormatError(following[0], RENAME_ONE)
            return imported
        except ConflictError as exc:
            if not loader.fresh:
                # merged into the stored conversation: replace=True would resolve it
                setattr(exc, _STORED_CONFLICT, True)
            raise


#: The attribute marking a ConflictError of a merge into a stored conversation.
_STORED_CONFLICT = "_memstore_conflicts_with_stored"


def conflicts_with_stored(exc: BaseException) -> bool:
    """Whether ``exc`` (from `import_jsonl()`) is a conflict with stored rows.

    True when a message or summary of the file conflicts with what an existing
    conversation stores, which ``replace=True`` would overwrite (the CLI's hint).
    """
    return isinstance(exc, ConflictError) and getattr(exc, _STORED_CONFLICT, False) is True


def _import_rows(
    lines: _Lines, loader: _snapshots.Loader, line_no: int, expected: int | None,
    source: str | None, progress: Progress | None, recounter: _snapshots.Recounter,
) -> ImportedConversation:
    """Write one conversation's message and summary lines through ``loader``."""
    cid, conn = loader.cid, loader.conn
    batch: list[StoredMessage] = []
    numbers: list[int] = []  # the line of each message of the batch
    count = 0
    previous: int | None = None
    last_seq: int | None = None
    while (item := lines.peek()) is not None and not _is_header(item[1]):
        lines.take()
        number, raw = item
        message = _message(number, raw, cid, source)
        if previous is not None and (
            message.seq <= previous or (loader.fresh and message.seq != previous + 1)
        ):
            raise ImportFormatError(
                number, f"seq {message.seq} does not follow seq {previous} (the seqs "
                "of a conversation are contiguous and increasing)"
            )
        previous = last_seq = message.seq
        batch.append(message)
        numbers.append(number)
        count += 1
        if len(batch) >= IMPORT_BATCH:
            _add(loader, batch, numbers)
            if progress is not None:
                progress(len(batch))
            batch, numbers = [], []
    if batch:
        _add(loader, batch, numbers)
        if progress is not None:
            progress(len(batch))
    if expected is not None and count != expected:
        raise ImportFormatError(
            line_no, f"the header announces {expected} messages for conversation "
            f"{source!r} and the file holds {count} (a truncated or edited file)"
        )
    summaries: list[Summary] = []
    while (item := lines.peek()) is not None and _is_summary(item[1]):
        lines.take()
        number, raw = item
        summary = _summary(number, raw, cid, source)
        _check_summary(number, summary, summaries[-1] if summaries else None, last_seq)
        summaries.append(summary)
    written = unchanged = 0
    if loader.fresh:
        loader.finish(summaries)
        written = len(summaries)
    else:
        loader.finish()
        written, unchanged = _snapshots.merge_summaries(conn, cid, summaries, loader.aligned)
    return ImportedConversation(id=cid, written=loader.written, unchanged=loader.unchanged,
                                replaced=loader.replaced, recounted=recounter.recounted,
                                summaries=written, summaries_unchanged=unchanged)


def _add(loader: _snapshots.Loader, batch: list[StoredMessage], numbers: list[int]) -> None:
    """``loader.add(batch)``; a message it refuses is reported by its line (``numbers``)."""
    try:
        loader.add(batch)
    except MemstoreError as exc:
        if isinstance(exc, InvalidInputError) and not isinstance(exc, ImportFormatError):
            line_no = numbers[-1]  # the batch's last line, unless the error names a seq
            if isinstance(exc, _snapshots.RepeatedIdError):
                line_no = next(n for m, n in zip(batch, numbers) if m.seq == exc.seq)
            raise ImportFormatError(line_no, str(exc)) from None
        raise
