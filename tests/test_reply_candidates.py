"""Which assistant messages a say may answer (actors/replies.py), and the excerpt shown."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from uuid import uuid4

from actors.replies import candidates
from storage.records import EXCERPT_CHARS, ReplyMatch, Turn, excerpt

NOW = datetime(2026, 5, 19, 9, 0, tzinfo=UTC)
DAY = 24 * 3600.0


def said(text: str, ago: float = 0.0, match: ReplyMatch | None = None) -> Turn:
    return Turn("user", text, NOW - timedelta(seconds=ago), client_id=uuid4().hex, match=match)


def asked(text: str, ago: float = 0.0) -> Turn:
    return Turn("assistant", text, NOW - timedelta(seconds=ago), reply_id=uuid4())


def test_messages_since_the_previous_say_and_the_questions_still_waiting() -> None:
    weekend, old, book, glad = (
        asked("How was your weekend?"),
        asked("Nice."),
        asked("Did you finish that book?"),
        asked("So glad."),
    )
    waiting = ReplyMatch(book.reply_id, True, open=(weekend.reply_id,))
    history = [weekend, said("brb"), old, book, said("yes, loved it!", match=waiting), glad]
    assert candidates(history, NOW, 8, 2 * DAY) == [weekend, glad]


def test_a_say_matched_without_the_model_leaves_nothing_waiting() -> None:
    first, second = asked("How are you?"), asked("Glad to hear it.")
    assert candidates([first, said("fine"), second], NOW, 8, 2 * DAY) == [second]


def test_no_say_before_means_every_message_in_the_window() -> None:
    messages = [asked("Hello!"), asked("Still there?")]
    assert candidates(messages, NOW, 8, 2 * DAY) == messages


def test_at_most_the_newest_eight_none_older_than_the_horizon() -> None:
    messages = [asked(f"Question {i}?", ago=(12 - i) * 3600.0) for i in range(12)]
    assert candidates(messages, NOW, 8, 2 * DAY) == messages[-8:]
    stale = [asked("Two days and a minute ago?", ago=2 * DAY + 60), asked("Now?")]
    assert candidates(stale, NOW, 8, 2 * DAY) == stale[-1:]


def test_excerpts_are_the_first_words_within_80_characters() -> None:
    assert excerpt("How was\n your   weekend?") == "How was your weekend?"
    long = "Did you finish that book about the lighthouse keeper " * 3
    cut = excerpt(long)
    assert len(cut) <= EXCERPT_CHARS and cut.endswith("\u2026")
    assert long.startswith(cut[:-1]) and not cut[:-1].endswith(" ")
