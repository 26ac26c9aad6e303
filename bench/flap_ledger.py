"""The flap bench's ledger: every say, every welcome, every server frame a phone received.

The bench records what happened on the phones' side; `verdict()` then checks, end to end,
what the protocol promises:

- every say is acked (an ack with its id, once; a resend's repeated ack is marked), stored
  once (the server's PostgreSQL, checked by the caller and handed in) and answered by
  exactly one reply; a say acked and not stored is data lost, counted apart from a say
  never acked (its phone still resending it when the bench stopped waiting);
- every reply reaches its phone whole exactly once: one `reply.start`, one `reply.end`,
  and the deltas join to the end's text;
- per phone and conversation, the numbered events arrive with seqs increasing by one:
  a seq seen twice is a duplicated event, a missing one a lost event, a smaller one an
  out-of-order event;
- a reconnect within the resume window resumes the same conversation.

Nothing is dropped or retried here: every anomaly is counted, with a few examples kept.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any

NUMBERED = frozenset({"ack", "reply.start", "reply.delta", "reply.end", "card", "reminder", "page"})
EXAMPLES = 5


@dataclass
class SayRecord:
    id: str
    phone: int
    text: str
    at: float  # perf_counter when phone.say() was called
    link_up: bool  # the link was up when it was said
    conversation: str | None  # the phone's conversation at that moment
    end_at: float | None = None  # first reply.end answering it
    dropped_meanwhile: bool = False  # a drop happened between the say and its reply.end


@dataclass
class ReplyRecord:
    id: str
    conversation: str
    in_reply_to: list[str] = field(default_factory=list)
    starts: int = 0
    ends: int = 0
    deltas: list[str] = field(default_factory=list)
    end_text: str | None = None
    interrupted: bool = False
    error: str | None = None


@dataclass
class ConversationRecord:
    id: str
    phone: int
    base: int | None = None  # welcome.seq when this conversation was new to the phone
    top: int = -1
    seqs: Counter[int] = field(default_factory=Counter)
    out_of_order: int = 0


@dataclass
class Welcome:
    phone: int
    at: float
    conversation: str
    resumed: bool
    reconnect: bool  # the phone already had a conversation in this life
    expected: str | None  # the conversation it expected to get back
    hello_ms: float | None


class Ledger:
    def __init__(self) -> None:
        self.says: dict[str, SayRecord] = {}
        self.replies: dict[str, ReplyRecord] = {}
        self.conversations: dict[tuple[int, str], ConversationRecord] = {}
        self.welcomes: list[Welcome] = []
        self.acks: dict[str, set[tuple[str, int | None]]] = defaultdict(set)  # (conv, seq)
        self.repeated_acks: set[str] = set()  # ids acked again for a resend
        self.ack_at: dict[str, float] = {}  # id -> when its first ack (or repeat) came
        self.unknown_frames: Counter[str] = Counter()
        self.errors: Counter[str] = Counter()
        self.byes: Counter[str] = Counter()
        self.pending: dict[int, set[str]] = defaultdict(set)  # phone -> says waiting for end

    # -- recording --------------------------------------------------------------------------

    def said(
        self, phone: int, id_: str, text: str, at: float, *, up: bool, conv: str | None
    ) -> None:
        self.says[id_] = SayRecord(id_, phone, text, at, up, conv)
        self.pending[phone].add(id_)

    def dropped(self, phone: int) -> None:
        for id_ in self.pending[phone]:
            self.says[id_].dropped_meanwhile = True

    def welcome(
        self,
        phone: int,
        frame: dict[str, Any],
        at: float,
        *,
        expected: str | None,
        hello_ms: float | None,
    ) -> None:
        conversation = str(frame.get("conversation"))
        resumed = frame.get("resumed") is True
        self.welcomes.append(
            Welcome(phone, at, conversation, resumed, expected is not None, expected, hello_ms)
        )
        record = self._conversation(phone, conversation)
        seq = frame.get("seq")
        if record.base is None and isinstance(seq, int):
            # New to this phone: events after welcome.seq are what it must see from now.
            record.base = seq
            record.top = max(record.top, seq)

    def frame(self, phone: int, conversation: str | None, frame: dict[str, Any], at: float) -> None:
        kind = frame.get("type")
        if kind == "error":
            self.errors[str(frame.get("code"))] += 1
            return
        if kind == "bye":
            self.byes[str(frame.get("reason"))] += 1
            return
        if kind not in NUMBERED:
            if kind not in ("pong", "welcome"):
                self.unknown_frames[str(kind)] += 1
            return
        if conversation is None:
            self.unknown_frames[f"{kind} before welcome"] += 1
            return
        record = self._conversation(phone, conversation)
        seq = frame.get("seq")
        if kind == "ack":
            id_ = str(frame.get("id"))
            self.ack_at.setdefault(id_, at)
            if frame.get("repeat") is True:
                self.repeated_acks.add(id_)
                return  # outside the stream: its seq may be another conversation's
            self.acks[id_].add((conversation, seq if isinstance(seq, int) else None))
        if isinstance(seq, int):
            if seq < record.top and record.seqs[seq] == 0:
                record.out_of_order += 1
            record.seqs[seq] += 1
            record.top = max(record.top, seq)
        if kind.startswith("reply."):
            self._reply(phone, conversation, kind, frame, at)

    def _reply(
        self, phone: int, conversation: str, kind: str, frame: dict[str, Any], at: float
    ) -> None:
        rid = str(frame.get("reply"))
        reply = self.replies.get(rid)
        if reply is None:
            reply = self.replies[rid] = ReplyRecord(rid, conversation)
        if kind == "reply.start":
            reply.starts += 1
            reply.in_reply_to = [str(i) for i in frame.get("in_reply_to") or []]
        elif kind == "reply.delta":
            reply.deltas.append(str(frame.get("text", "")))
        else:
            reply.ends += 1
            reply.end_text = str(frame.get("text", ""))
            reply.interrupted = bool(frame.get("interrupted"))
            reply.error = frame.get("error")
            for id_ in reply.in_reply_to:
                say = self.says.get(id_)
                if say is not None and say.end_at is None:
                    say.end_at = at
                self.pending[phone].discard(id_)

    def _conversation(self, phone: int, conversation: str) -> ConversationRecord:
        key = (phone, conversation)
        record = self.conversations.get(key)
        if record is None:
            record = self.conversations[key] = ConversationRecord(conversation, phone)
        return record

    def waiting(self, phone: int) -> bool:
        """Has this phone a say that has not been answered yet?"""
        return bool(self.pending[phone])

    # -- checking ---------------------------------------------------------------------------

    def verdict(
        self, stored: dict[str, int] | None, answered_db: dict[str, int] | None
    ) -> dict[str, Any]:
        """Counts of everything lost or duplicated; `stored`: say id -> rows in the server's
        database, `answered_db`: say id -> stored replies answering it (None: no database)."""
        examples: dict[str, list[str]] = defaultdict(list)

        def note(kind: str, what: str) -> None:
            if len(examples[kind]) < EXAMPLES:
                examples[kind].append(what)

        answering: dict[str, set[str]] = defaultdict(set)
        for reply in self.replies.values():
            for id_ in reply.in_reply_to:
                answering[id_].add(reply.id)
        lost_says = dup_says = lost_replies = dup_replies = not_stored = dup_stored = 0
        dup_answered = acked_not_stored = 0
        for id_, say in self.says.items():
            acked_seqs = self.acks.get(id_, set())
            acked = bool(acked_seqs) or id_ in self.repeated_acks
            if not acked:
                lost_says += 1
                note("lost_says", f"phone {say.phone} say {id_}: never acked")
            elif len(acked_seqs) > 1:
                dup_says += 1
                note(
                    "duplicated_says",
                    f"phone {say.phone} say {id_}: acks {sorted(acked_seqs, key=str)}",
                )
            if stored is not None:
                rows = stored.get(id_, 0)
                if rows == 0:
                    not_stored += 1
                    note("not_stored", f"phone {say.phone} say {id_}")
                    if acked:
                        acked_not_stored += 1
                        note("acked_not_stored", f"phone {say.phone} say {id_}: acked, no row")
                elif rows > 1:
                    dup_stored += 1
                    note("stored_twice", f"phone {say.phone} say {id_}: {rows} rows")
            if answered_db is not None and (replies := answered_db.get(id_, 0)) > 1:
                dup_answered += 1
                note("answered_in_db_twice", f"phone {say.phone} say {id_}: {replies} replies")
            whole = [r for r in answering.get(id_, ()) if self.replies[r].ends > 0]
            if not whole:
                lost_replies += 1
                note("lost_replies", f"phone {say.phone} say {id_}: no reply.end answers it")
            elif len(whole) > 1:
                dup_replies += 1
                note("duplicated_replies", f"phone {say.phone} say {id_}: replies {whole}")
        broken = 0
        for reply in self.replies.values():
            if reply.starts != 1 or reply.ends != 1:
                if reply.ends == 0:
                    lost_replies += 1
                    note("lost_replies", f"reply {reply.id}: started, never ended")
                continue  # counted as duplicated events by seq
            if "".join(reply.deltas) != (reply.end_text or ""):
                broken += 1
                note("broken_replies", f"reply {reply.id}: deltas do not join to reply.end")
        dup_events = gaps = out_of_order = 0
        for conv in self.conversations.values():
            dup_events += sum(n - 1 for n in conv.seqs.values() if n > 1)
            out_of_order += conv.out_of_order
            if conv.seqs:
                low = conv.base + 1 if conv.base is not None else min(conv.seqs)
                missing = [s for s in range(low, max(conv.seqs) + 1) if s not in conv.seqs]
                gaps += len(missing)
                if missing:
                    note(
                        "seq_gaps", f"phone {conv.phone} conv {conv.id[:8]}: missing {missing[:8]}"
                    )
        reconnects = [w for w in self.welcomes if w.reconnect]
        resumed = [w for w in reconnects if w.resumed and w.conversation == w.expected]
        for w in reconnects:
            if not (w.resumed and w.conversation == w.expected):
                note(
                    "new_conversations_unexpected",
                    f"phone {w.phone}: expected {w.expected}, "
                    f"got {w.conversation} resumed={w.resumed}",
                )
        out: dict[str, Any] = {
            "says": len(self.says),
            "replies": len(self.replies),
            "reconnects": len(reconnects),
            "resumed": len(resumed),
            "new_conversations_unexpected": len(reconnects) - len(resumed),
            "lost_says": lost_says,
            "duplicated_says": dup_says,
            "lost_replies": lost_replies,
            "duplicated_replies": dup_replies,
            "duplicated_events": dup_events,
            "lost_events": gaps,
            "out_of_order_events": out_of_order,
            "broken_replies": broken,
            "not_stored": not_stored if stored is not None else None,
            "acked_not_stored": acked_not_stored if stored is not None else None,
            "stored_twice": dup_stored if stored is not None else None,
            "answered_in_db_twice": dup_answered if answered_db is not None else None,
            "error_frames": dict(self.errors),
            "byes": dict(self.byes),
            "unexpected_frames": dict(self.unknown_frames),
            "examples": dict(examples),
        }
        return out

    def resume_ms(self) -> list[tuple[float, float]]:
        """(at, ms) of hello -> welcome for reconnects that got a welcome."""
        return [(w.at, w.hello_ms) for w in self.welcomes if w.reconnect and w.hello_ms is not None]

    def turn_ms(self, *, clean_only: bool = True) -> list[float]:
        """Say sent -> reply.end, for says made on an up link with no drop meanwhile."""
        out = []
        for say in self.says.values():
            if say.end_at is None:
                continue
            if clean_only and (not say.link_up or say.dropped_meanwhile):
                continue
            out.append((say.end_at - say.at) * 1000.0)
        return out
