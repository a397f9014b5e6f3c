"""Fixed-seed, realistic agent conversations in OpenAI chat format.

A conversation is a system prompt followed by *turns*. A turn is a user message and
either a plain assistant answer or a tool-using exchange: an assistant message with
one to three (parallel) tool calls, the tool results answering each call, sometimes
a second chained call, then the assistant's answer. About 10% of all messages are
assistant tool calls. Text lengths are log-normal; roughly one tool result in 80 is a
~2,000-token dump (a log or a search result page).

Everything is a pure function of ``(seed, conversation index, size)``: the same
arguments give the same messages on every machine, and conversations are generated
in chunks so a 1,000,000-message history never has to sit in memory at once.

The last message is never part of an incomplete tool exchange: when a tool turn
would not fit in the remaining message count, a plain turn is written instead, so
the newest message is a user or assistant text message every system can end on.
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

__all__ = [
    "MAIN_ID",
    "N_OTHERS",
    "ConversationSpec",
    "Workload",
    "other_id",
]

Msg = dict[str, Any]

MAIN_ID = "bench-main"
N_OTHERS = 50


def other_id(index: int) -> str:
    """Id of the ``index``-th background conversation."""
    return f"bench-other-{index:02d}"


_VOCAB = (
    "the be to of and a in that have it for not on with he as you do at this but his by "
    "from they we say her she or an will my one all would there their what so up out if "
    "about who get which go me when make can like time no just him know take people into "
    "year your good some could them see other than then now look only come its over think "
    "also back after use two how our work first well way even new want because any these "
    "give day most us data model query index table server client request response error "
    "value function method class module package install version config setting option "
    "deploy cluster region latency throughput memory cache token budget window context "
    "message history agent tool result search file path line column record field schema "
    "migration database transaction commit rollback lock thread process worker queue "
    "retry timeout network service endpoint payload header status code test case check "
    "build release branch merge review issue ticket customer order invoice payment price "
    "report summary analysis metric dashboard alert incident root cause fix patch update "
    "should might must perhaps however therefore although instead usually often rarely "
    "quickly carefully exactly roughly really simply clearly probably actually already "
    "small large fast slow old recent stable broken missing expected unexpected correct "
    "first second third next last final previous following initial current default"
)
_WORDS = _VOCAB.split()

_TOOLS = (
    ("search_docs", ("query", "top_k")),
    ("get_weather", ("city", "units")),
    ("run_sql", ("query", "database")),
    ("read_file", ("path", "max_bytes")),
    ("http_get", ("url", "timeout")),
    ("create_ticket", ("title", "priority")),
    ("calculator", ("expression",)),
    ("list_orders", ("customer_id", "status")),
)

_SYSTEM_PROMPT_WORDS = 220


@dataclass(frozen=True)
class ConversationSpec:
    """One conversation of the workload: its id, seed offset and message count."""

    conversation_id: str
    index: int
    size: int


class _Gen:
    """Stateful generator of one conversation's messages."""

    def __init__(self, seed: int, index: int, size: int) -> None:
        self.rng = random.Random(seed * 1_000_003 + index)
        self.index = index
        self.size = size
        self.written = 0
        self.calls = 0

    # ---- text ---------------------------------------------------------------------

    def words(self, n: int) -> str:
        rng = self.rng
        ws = rng.choices(_WORDS, k=max(1, n))
        out: list[str] = []
        sentence = 0
        for w in ws:
            if sentence == 0:
                w = w.capitalize()
            out.append(w)
            sentence += 1
            if sentence > 6 and rng.random() < 0.12:
                out[-1] = w + rng.choice(".....?!:;")
                sentence = 0
            elif rng.random() < 0.04:
                out.append(str(rng.randrange(0, 10_000)))
        text = " ".join(out)
        return text if text.endswith((".", "?", "!")) else text + "."

    def lognormal_words(self, median: float, sigma: float, lo: int, hi: int) -> int:
        n = int(self.rng.lognormvariate(math.log(median), sigma))
        return min(hi, max(lo, n))

    def paragraphs(self, n_words: int) -> str:
        """Text of about ``n_words`` words, split into paragraphs and bullets."""
        parts: list[str] = []
        left = n_words
        while left > 0:
            k = min(left, self.rng.randint(25, 90))
            para = self.words(k)
            if self.rng.random() < 0.2:
                para = "\n".join(f"- {self.words(self.rng.randint(4, 14))}" for _ in range(3))
            parts.append(para)
            left -= k
        return "\n\n".join(parts)

    # ---- messages -----------------------------------------------------------------

    def system(self) -> Msg:
        text = (
            "You are a careful assistant for an engineering team. Use the tools when a "
            "question needs fresh data; cite tool results; keep answers short. "
            + self.paragraphs(_SYSTEM_PROMPT_WORDS)
        )
        return {"role": "system", "content": text}

    def user(self) -> Msg:
        return {"role": "user", "content": self.words(self.lognormal_words(22, 0.8, 3, 400))}

    def assistant(self) -> Msg:
        n = self.lognormal_words(85, 0.8, 5, 1_200)
        return {"role": "assistant", "content": self.paragraphs(n)}

    def tool_call_message(self) -> Msg:
        rng = self.rng
        k = rng.choices((1, 2, 3), weights=(70, 22, 8))[0]
        calls = []
        for _ in range(k):
            self.calls += 1
            name, params = rng.choice(_TOOLS)
            args = {p: self.arg_value(p) for p in params}
            calls.append(
                {
                    "id": f"call_{self.index:02d}_{self.calls:07d}",
                    "type": "function",
                    # json.dumps defaults: what LangChain re-serializes ``args`` with.
                    "function": {"name": name, "arguments": json.dumps(args)},
                }
            )
        content = self.words(rng.randint(5, 30)) if rng.random() < 0.35 else None
        return {"role": "assistant", "content": content, "tool_calls": calls}

    def arg_value(self, param: str) -> Any:
        rng = self.rng
        if param in ("top_k", "max_bytes", "timeout", "customer_id"):
            return rng.randrange(1, 5_000)
        if param == "units":
            return rng.choice(("metric", "imperial"))
        if param == "priority":
            return rng.choice(("low", "medium", "high"))
        return self.words(rng.randint(2, 12)).rstrip(".")

    def tool_result(self, call_id: str) -> Msg:
        rng = self.rng
        if rng.random() < 1 / 80:
            body = self.big_output()
        else:
            rows = [
                {
                    "id": rng.randrange(1, 1_000_000),
                    "title": self.words(rng.randint(3, 9)).rstrip("."),
                    "score": round(rng.random(), 3),
                    "snippet": self.words(self.lognormal_words(14, 0.6, 3, 80)),
                }
                for _ in range(rng.randint(1, 5))
            ]
            body = json.dumps({"ok": True, "results": rows})
        return {"role": "tool", "tool_call_id": call_id, "content": body}

    def big_output(self) -> str:
        """About 2,000 cl100k tokens of log lines."""
        rng = self.rng
        lines = []
        for i in range(95):
            lines.append(
                f"2025-01-{1 + i % 28:02d}T{i % 24:02d}:{rng.randrange(60):02d}:"
                f"{rng.randrange(60):02d}Z {rng.choice(('INFO', 'WARN', 'ERROR', 'DEBUG'))} "
                f"{self.words(rng.randint(6, 9)).rstrip('.')}"
            )
        return "\n".join(lines)

    # ---- turns --------------------------------------------------------------------

    def turn(self, remaining: int) -> list[Msg]:
        rng = self.rng
        if remaining == 1:
            return [self.user()]
        if rng.random() < 0.22:
            out = [self.user()]
            rounds = 2 if rng.random() < 0.2 else 1
            for _ in range(rounds):
                call = self.tool_call_message()
                out.append(call)
                out.extend(self.tool_result(c["id"]) for c in call["tool_calls"])
            out.append(self.assistant())
            if len(out) <= remaining:
                return out
            # Not enough room left for a whole tool exchange: fall back to a plain
            # turn (the rng stream differs from a larger size's, which is fine).
        return [self.user(), self.assistant()]

    def messages(self) -> Iterator[Msg]:
        if self.size <= 0:
            return
        yield self.system()
        self.written = 1
        while self.written < self.size:
            for m in self.turn(self.size - self.written):
                yield m
                self.written += 1


@dataclass(frozen=True)
class Workload:
    """The benchmark workload of one size: a main conversation and 50 others.

    Attributes:
        size: messages in the main conversation.
        seed: the fixed seed.
        others: number of background conversations in the same tables.
        other_size: messages in each background conversation.
    """

    size: int
    seed: int = 20_240_601
    others: int = N_OTHERS
    other_size: int | None = None

    @property
    def other_messages(self) -> int:
        """Messages per background conversation (``size // 20``, 20..2,000)."""
        if self.other_size is not None:
            return self.other_size
        return min(2_000, max(20, self.size // 20))

    @property
    def main(self) -> ConversationSpec:
        """The measured conversation."""
        return ConversationSpec(MAIN_ID, 0, self.size)

    @property
    def background(self) -> list[ConversationSpec]:
        """The other conversations sharing the tables."""
        return [
            ConversationSpec(other_id(i), i + 1, self.other_messages) for i in range(self.others)
        ]

    @property
    def total_messages(self) -> int:
        """Messages in the main conversation plus the background ones."""
        return self.size + self.others * self.other_messages

    def iter_messages(self, spec: ConversationSpec) -> Iterator[Msg]:
        """Every message of ``spec``, oldest first."""
        return _Gen(self.seed, spec.index, spec.size).messages()

    def chunks(self, spec: ConversationSpec, chunk_size: int) -> Iterator[list[Msg]]:
        """The messages of ``spec`` in lists of at most ``chunk_size``."""
        buf: list[Msg] = []
        for m in self.iter_messages(spec):
            buf.append(m)
            if len(buf) >= chunk_size:
                yield buf
                buf = []
        if buf:
            yield buf

    def append_messages(self, n: int) -> list[Msg]:
        """``n`` plain messages (user/assistant alternating) for the append phase."""
        gen = _Gen(self.seed + 7, 999, n)
        return [gen.user() if i % 2 == 0 else gen.assistant() for i in range(n)]
