"""The search index against a model: random writes, then search finds exactly what is stored.

Each message carries one word planted for it (in its text, a text part, a tool call's
name or arguments, or a tool result). A state machine appends, extends, rewrites, pops,
truncates, clears, deletes, loads states (replacing and appending), imports exports,
forks, prunes and forgets, on SQLite and on PostgreSQL; after every step one search for
every planted word ever written returns exactly the live messages holding one, and a
search for single words (of live and of removed messages) returns exactly theirs.
"""

from __future__ import annotations

import contextlib
import io
import itertools
import re
import uuid
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from memstore.models import Message, TextPart, ToolCall
from memstore.search import MAX_QUERY_TERMS, searchable_text
from memstore.store import MemoryStore
from memstore.tokens import FixedCounter
from memstore.transfer import export_jsonl, import_jsonl
from tests.helpers import examples

CONVERSATIONS = ("a", "b", "c")
KINDS = ("text", "part", "call_name", "call_arguments", "result")


def _planted(message: Any) -> list[str]:
    text = searchable_text(message.content, message.tool_calls)
    return re.findall(r"(?<![0-9a-z])q[0-9a-f]{6}x\d+(?![0-9])", text)


class SearchMachine(RuleBasedStateMachine):
    url: str = ""

    @initialize()
    def start(self) -> None:
        self.store = MemoryStore(self.url, counter=FixedCounter(), cache_size=0)
        self.tag = uuid.uuid4().hex[:6]
        self.ids = {c: f"{self.tag}-{c}" for c in CONVERSATIONS}
        self.counter = itertools.count(1)
        #: conversation -> the planted word of each live message, in seq order
        self.model: dict[str, list[str]] = {c: [] for c in self.ids.values()}
        self.written: list[str] = []
        self.states: list[Any] = []

    def teardown(self) -> None:
        store = getattr(self, "store", None)
        if store is not None:
            for cid in self.model:
                with contextlib.suppress(Exception):
                    store.delete_conversation(cid)
            store.close()

    # ---- messages --------------------------------------------------------------------------

    def _word(self) -> str:
        word = f"q{self.tag}x{next(self.counter)}"
        self.written.append(word)
        return word

    def _messages(self, kinds: list[str]) -> list[Message]:
        out: list[Message] = []
        for kind in kinds:
            word = self._word()
            if kind == "text":
                out.append(Message.user(f"note {word}, filler words"))
            elif kind == "part":
                out.append(Message.user([TextPart(text="see"), TextPart(text=f"({word})")]))
            elif kind == "call_name":
                out.append(Message.assistant(tool_calls=[ToolCall(id=word, name=f"f_{word}")]))
            elif kind == "call_arguments":
                out.append(Message.assistant(tool_calls=[ToolCall(
                    id=word, name="lookup", arguments=f'{{"key": "{word}"}}')]))
            else:
                out.append(Message.tool(f"result: {word}", tool_call_id="t"))
        return out

    def _sync(self, cid: str) -> None:
        """Re-read a conversation into the model after a write the model cannot predict."""
        self.model[cid] = [w for m in self.store.messages(cid) for w in _planted(m)]

    # ---- rules -------------------------------------------------------------------------------

    @rule(c=st.sampled_from(CONVERSATIONS), kind=st.sampled_from(KINDS))
    def append(self, c: str, kind: str) -> None:
        cid = self.ids[c]
        message = self._messages([kind])[0]
        self.store.append(cid, message)
        self.model[cid].extend(_planted(message))

    @rule(c=st.sampled_from(CONVERSATIONS), kinds=st.lists(st.sampled_from(KINDS), max_size=6))
    def extend(self, c: str, kinds: list[str]) -> None:
        cid = self.ids[c]
        batch = self._messages(kinds)
        self.store.extend(cid, batch)
        self.model[cid].extend(w for m in batch for w in _planted(m))

    @precondition(lambda self: any(self.model.values()))
    @rule(c=st.sampled_from(CONVERSATIONS), newest=st.integers(0, 4),
          kinds=st.lists(st.sampled_from(KINDS), max_size=3), keep_first=st.booleans())
    def rewrite(self, c: str, newest: int, kinds: list[str], keep_first: bool) -> None:
        cid = self.ids[c]
        if not self.model[cid]:
            return
        fresh = self._messages(kinds)

        def fn(read: list[Any]) -> list[Any]:
            return ([*read[:1]] if keep_first else []) + fresh

        self.store.rewrite(cid, fn, newest=newest)
        self._sync(cid)

    @rule(c=st.sampled_from(CONVERSATIONS), n=st.integers(0, 4))
    def pop(self, c: str, n: int) -> None:
        cid = self.ids[c]
        if not self.model[cid]:
            return
        self.store.pop(cid, n)
        del self.model[cid][len(self.model[cid]) - min(n, len(self.model[cid])):]

    @rule(c=st.sampled_from(CONVERSATIONS), cut=st.integers(0, 4))
    def truncate(self, c: str, cut: int) -> None:
        cid = self.ids[c]
        if not self.model[cid]:
            return
        first = self.store.get_conversation(cid)
        stored = self.store.messages(cid)
        before = stored[min(cut, len(stored) - 1)].seq if stored else first.message_count + 1
        self.store.truncate(cid, before_seq=before)
        self._sync(cid)

    @rule(c=st.sampled_from(CONVERSATIONS))
    def clear(self, c: str) -> None:
        cid = self.ids[c]
        if self.model[cid] or self._exists(cid):
            self.store.clear(cid)
            self.model[cid] = []

    @rule(c=st.sampled_from(CONVERSATIONS))
    def delete(self, c: str) -> None:
        cid = self.ids[c]
        if self._exists(cid):
            self.store.delete_conversation(cid)
        self.model[cid] = []

    @rule(c=st.sampled_from(CONVERSATIONS))
    def save(self, c: str) -> None:
        cid = self.ids[c]
        if self._exists(cid):
            self.states.append(self.store.save_state(cid))

    @precondition(lambda self: bool(self.states))
    @rule(c=st.sampled_from(CONVERSATIONS), which=st.integers(0, 10), replace=st.booleans())
    def load_state(self, c: str, which: int, replace: bool) -> None:
        cid = self.ids[c]
        state = self.states[which % len(self.states)]
        if not replace and (self._exists(cid) and self.store.messages(cid)):
            # appending repeats message ids only when they are the conversation's own
            ids = {m.id for m in self.store.messages(cid)}
            if ids & {m.id for m in state.messages}:
                return
        self.store.load_state(state, cid, replace=replace)
        self._sync(cid)

    @rule(c=st.sampled_from(CONVERSATIONS), into=st.sampled_from(CONVERSATIONS))
    def export_import(self, c: str, into: str) -> None:
        source, target = self.ids[c], self.ids[into]
        if not self._exists(source):
            return
        out = io.StringIO()
        export_jsonl(self.store, out, conversation_ids=[source])
        import_jsonl(self.store, io.StringIO(out.getvalue()), replace=True, rename=target)
        self._sync(target)

    @rule(c=st.sampled_from(CONVERSATIONS), into=st.sampled_from(CONVERSATIONS))
    def fork(self, c: str, into: str) -> None:
        source, target = self.ids[c], self.ids[into]
        if source == target or not self._exists(source) or self._exists(target):
            return
        try:
            self.store.fork(source, target)
        except Exception as exc:  # a fork point that splits a tool unit is refused
            assert "InvalidInput" in type(exc).__name__
            return
        self._sync(target)

    @rule(c=st.sampled_from(CONVERSATIONS), keep=st.integers(0, 3))
    def prune(self, c: str, keep: int) -> None:
        cid = self.ids[c]
        if not self._exists(cid):
            return
        self.store.prune(keep_last=keep, conversation_ids=[cid])
        if self._exists(cid):
            self._sync(cid)
        else:
            self.model[cid] = []

    @rule(c=st.sampled_from(CONVERSATIONS))
    def forget(self, c: str) -> None:
        cid = self.ids[c]
        self.store.forget(conversation_ids=[cid])
        for other in self.model:  # forks descending from it go too
            if not self._exists(other):
                self.model[other] = []

    def _exists(self, cid: str) -> bool:
        try:
            self.store.get_conversation(cid)
        except Exception:
            return False
        return True

    # ---- what search must find -------------------------------------------------------------

    @invariant()
    def search_finds_exactly_the_live_messages(self) -> None:
        if not hasattr(self, "store"):
            return
        expected = sorted((cid, w) for cid, words in self.model.items() for w in words)
        words = self.written[-MAX_QUERY_TERMS:]
        if not words:
            return
        older = set(self.written[:-MAX_QUERY_TERMS])
        hits = self.store.search(" OR ".join(words), limit=1000)
        got = sorted((h.conversation_id, w) for h in hits for w in _planted(h.message)
                     if w not in older)
        assert got == [(c, w) for c, w in expected if w not in older]
        for word in (words[-1], words[0]):
            single = sorted((h.conversation_id, w) for h in self.store.search(word, limit=1000)
                            for w in _planted(h.message) if w == word)
            assert single == [(c, w) for c, w in expected if w == word]
            scoped = {h.conversation_id for h in self.store.search(
                word, conversation_id=list(self.model), limit=1000)}
            assert scoped == {c for c, w in expected if w == word}


def _run(url: str) -> None:
    machine = type("Machine", (SearchMachine,), {"url": url})
    settings_ = settings(max_examples=examples(40), stateful_step_count=25, deadline=None,
                         suppress_health_check=[HealthCheck.too_slow,
                                                HealthCheck.filter_too_much])
    test = machine.TestCase
    test.settings = settings_
    test().runTest()


def test_index_follows_every_write_sqlite(tmp_path: Any) -> None:
    from memstore import migrate

    url = f"sqlite:///{tmp_path / 'machine.db'}"
    migrate.upgrade(url)
    _run(url)


@pytest.mark.postgres
def test_index_follows_every_write_postgres(pg_url: str) -> None:
    from tests.conftest import _empty_pg

    _empty_pg(pg_url)
    _run(pg_url)
