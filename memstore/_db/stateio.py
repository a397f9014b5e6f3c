"""Conversation snapshots as files, written and read incrementally.

``dump_state`` writes the same JSON document as ``save_state(...).to_json()``, laid
out so that it can be read back one message at a time::

    {"format":"memstore.conversation","version":2,"conversation":{...},"view":null,"summaries":[...],"messages":[
    {...first message...},
    {...second message...}
    ]}

The first line is everything but the messages (the conversation's summaries
included: there is one per ``summarize`` call, so they are few) and ends with
``"messages":[``; then
one message per line (a comma ends every line but the last); then ``]}``. The file
is plain JSON (``ConversationState.from_json`` reads it whole), and
`read_state()` reads it with memory bounded by one message. A snapshot in any
other layout (``to_json()`` written to a file) is read whole.
"""

from __future__ import annotations

import io
from collections.abc import Iterable, Iterator
from typing import Any, TextIO

from pydantic import ValidationError

from memstore._validate import validation_summary
from memstore.errors import InvalidInputError
from memstore.models import Conversation, ConversationState, StoredMessage, Summary

__all__ = ["StateWriter", "is_file", "read_state"]

OPEN = ',"messages":['
CLOSE = "]}"


def is_file(value: Any) -> bool:
    """Whether ``value`` looks like a text file object (has ``read``/``readline``)."""
    return hasattr(value, "readline") and hasattr(value, "read")


def check_writable(fp: Any, what: str) -> None:
    """Refuse an ``fp`` that is not a text file object open for writing (a path, say)."""
    _check_text_file(fp, what, "write", "writes to", "'w', encoding='utf-8'", "'w', not 'wb'")


def check_readable(fp: Any, what: str) -> None:
    """Refuse an ``fp`` that is not a text file object open for reading (a path, say)."""
    _check_text_file(fp, what, "readline", "reads", "encoding='utf-8'", "'r', not 'rb'")


def _check_text_file(fp: Any, what: str, method: str, verb: str, open_args: str,
                     text_mode: str) -> None:
    binary = _binary(fp)
    if callable(getattr(fp, method, None)) and not binary:
        return
    hint = (f" (a path: pass open(path, {open_args}))" if isinstance(fp, str)
            else f" (open it in text mode: {text_mode})" if binary else "")
    kind = "a binary file" if binary else type(fp).__name__
    raise InvalidInputError(f"{what} {verb} a text file object, not {kind}{hint}")


def _binary(fp: Any) -> bool:
    """A binary file object (it reads and writes bytes, not text)."""
    return isinstance(fp, (io.RawIOBase, io.BufferedIOBase)) or "b" in str(
        getattr(fp, "mode", ""))


class StateWriter:
    """Writes a snapshot file incrementally (both stores' ``dump_state``).

    The head line, then messages a page at a time (one per line), then the closing line.
    """

    def __init__(self, fp: TextIO, conversation: Conversation, view: dict[str, Any] | None,
                 summaries: Iterable[Summary] = ()) -> None:
        self._fp = fp
        self._pending: str | None = None  # the last line, written once we know its comma
        self.count = 0
        fp.write(head_line(conversation, view, summaries))

    def write(self, messages: Iterable[StoredMessage]) -> None:
        """Write messages (in seq order) after those written so far."""
        fp = self._fp
        for message in messages:
            if self._pending is not None:
                fp.write(self._pending + ",\n")
            self._pending = message.model_dump_json()
            self.count += 1

    def close(self) -> int:
        """Write the last message and the closing line; returns how many messages."""
        if self._pending is not None:
            self._fp.write(self._pending + "\n")
            self._pending = None
        self._fp.write(CLOSE + "\n")
        return self.count


def head_line(
    conversation: Conversation, view: dict[str, Any] | None, summaries: Iterable[Summary] = (),
) -> str:
    """The first line of a snapshot file: everything but the messages, then ``"messages":[``."""
    head = ConversationState(conversation=conversation, messages=[], view=view,
                             summaries=list(summaries))
    text = head.model_dump_json(exclude={"messages"})
    return text[:-1] + OPEN + "\n"


def read_state(fp: TextIO) -> tuple[ConversationState, Iterator[StoredMessage]]:
    """Read a snapshot from ``fp``: its header (no messages) and an iterator of messages.

    The iterator validates each message as it goes (a bad line raises
    `InvalidInputError` naming the line) and checks that seqs increase and
    that every message belongs to the snapshot's conversation.
    """
    try:
        first = fp.readline()
    except UnicodeDecodeError as exc:
        raise InvalidInputError(f"state line 1 is not UTF-8 text: {exc}") from None
    if not isinstance(first, str):
        raise InvalidInputError("load_state reads text files (open the file with mode 'r')")
    stripped = first.rstrip("\r\n")
    if not stripped.endswith(OPEN):
        try:
            rest = fp.read()
        except UnicodeDecodeError as exc:
            raise InvalidInputError(f"the snapshot is not UTF-8 text: {exc}") from None
        state = ConversationState.model_validate_json(first + rest)
        return state.model_copy(update={"messages": []}), iter(state.messages)
    try:
        head = ConversationState.model_validate_json(stripped + CLOSE)
    except ValidationError as exc:
        raise InvalidInputError(
            f"state line 1 is not a snapshot header: {validation_summary(exc)}") from None
    return head, _messages(fp, head.conversation.id)


def _messages(fp: TextIO, cid: str) -> Iterator[StoredMessage]:
    line_no = 1
    previous: int | None = None
    closed = False
    while True:
        try:
            line = fp.readline()
        except UnicodeDecodeError as exc:
            raise InvalidInputError(f"state line {line_no + 1} is not UTF-8 text: {exc}") from None
        if not line:
            break
        line_no += 1
        text = line.strip()
        if not text:
            continue
        if closed:
            raise InvalidInputError(f"state line {line_no}: content after the end of the snapshot")
        if text == CLOSE:
            closed = True
            continue
        if text.endswith(","):
            text = text[:-1]
        try:
            message = StoredMessage.model_validate_json(text)
        except ValidationError as exc:
            raise InvalidInputError(
                f"state line {line_no}: not a stored message: {validation_summary(exc)}") from None
        if message.conversation_id != cid:
            raise InvalidInputError(
                f"state line {line_no}: message seq {message.seq} belongs to "
                f"{message.conversation_id!r}, not {cid!r}"
            )
        if previous is not None and message.seq <= previous:
            raise InvalidInputError(
                f"state line {line_no}: seq {message.seq} does not follow seq {previous}"
            )
        previous = message.seq
        yield message
    if not closed:
        raise InvalidInputError(
            f"the snapshot ends at line {line_no} without its closing {CLOSE!r} (truncated?)"
        )
