"""``memstore state save`` and ``memstore state load``: one conversation's snapshot."""

from __future__ import annotations

import argparse
import json
from typing import Any

from pydantic import ValidationError

from memstore._validate import validation_summary
from memstore.cli import _output as out
from memstore.cli._commands import open_store, read_text, replaced_file
from memstore.cli._errors import FileFormatError
from memstore.errors import ConflictError, ConversationNotFoundError
from memstore.models import Conversation, ConversationState

__all__ = ["state_load", "state_save"]


def state_save(args: argparse.Namespace) -> int:
    """``memstore state save CONV``."""
    with open_store(args) as store:
        state = store.save_state(args.conversation_id)
    text = state.to_json()
    if args.output and args.output != "-":
        with replaced_file(args.output) as fp:
            fp.write(text)
    else:
        out.utf8_stdout().write(text + "\n")
    return 0


def _same_snapshot(stored: ConversationState, state: ConversationState) -> bool:
    """Whether loading ``state`` would change nothing that ``stored`` holds.

    Messages, summaries and metadata are compared; timestamps of the conversation row
    are not (a conversation that holds exactly the snapshot is left alone).
    """
    def key(s: ConversationState) -> tuple[Any, ...]:
        return ([m.model_dump(exclude={"conversation_id"}) for m in s.messages],
                [x.model_dump(exclude={"conversation_id"}) for x in s.summaries],
                s.conversation.metadata)

    return key(stored) == key(state)


def _holds(conv: Conversation, summaries: int) -> str:
    """What a stored conversation holds, in a few words (for the refusal of a load)."""
    n = conv.message_count
    parts = [f"{n} message{'' if n == 1 else 's'}"]
    if summaries:
        parts.append(f"{summaries} summar{'y' if summaries == 1 else 'ies'}")
    if conv.metadata:
        parts.append("metadata " + out.preview(json.dumps(conv.metadata, ensure_ascii=False),
                                               40))
    return ", ".join(parts)


def state_load(args: argparse.Namespace) -> int:
    """``memstore state load FILE``: refuses to overwrite a stored conversation unless told.

    Without ``--replace`` or ``--append`` the target must not exist (or already hold
    exactly the snapshot): a conversation that exists, even with no messages, has
    metadata, a creation time and perhaps summaries that a load would overwrite.
    """
    name = "<stdin>" if args.file == "-" else args.file
    try:
        state = ConversationState.model_validate_json(read_text(args.file))
    except ValidationError as exc:
        raise FileFormatError(f"{name}: not a memstore snapshot: "
                              f"{validation_summary(exc)}") from None
    target = args.conversation_id or state.conversation.id
    with open_store(args, write=True, create=True) as store:
        replace = bool(args.replace)
        if not args.replace and not args.append:
            try:
                conv = store.get_conversation(target)
            except ConversationNotFoundError:
                conv = None
            if conv is not None:
                stored = store.save_state(target) \
                    if conv.message_count == len(state.messages) else None
                if stored is not None and _same_snapshot(stored, state):
                    print(f"{target!r} already holds this snapshot: nothing to do")
                    return 0
                summaries = len(stored.summaries) if stored is not None \
                    else len(store.summaries(target))
                raise ConflictError(
                    f"conversation {target!r} exists ({_holds(conv, summaries)}): pass "
                    "--replace to overwrite it with the snapshot, or --append to add the "
                    "snapshot's messages after the stored ones")
            # A new conversation: appending into it writes exactly the snapshot, and a
            # conversation created by someone else since the check above is then
            # appended to (or refused on a repeated message id), never overwritten.
        conv = store.load_state(state, target, replace=replace)
    print(f"loaded {out.counted(len(state.messages), 'message')} into {conv.id!r}")
    return 0
