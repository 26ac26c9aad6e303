"""The rehearsal analysis's rules, on the seed's stories and their neighbours."""

from __future__ import annotations

import pytest

from providers.rehearsal_analysis import RehearsalAnalysis, is_lull, loose_ends, reply_matching

WEEKEND = "A1: How was your weekend?"
BOOK = "A2: Did you finish that book?"


def answered(lines: list[str]) -> dict:
    return reply_matching(lines)["answers"][0]


def test_a_yes_answers_the_yes_no_question_and_the_open_one_waits() -> None:
    result = reply_matching([WEEKEND, BOOK, "P1: yes, loved it!"])
    assert result["answers"] == [{"message": "P1", "answers": "A2"}]
    assert result["open"] == ["A1"]
    assert result["lull"] is False


def test_an_evaluative_answer_finds_the_earlier_how_question() -> None:
    reply = 'A2: [rehearsal] You said "yes, loved it!".'
    assert answered([WEEKEND, reply, "P1: it was great, went hiking"])["answers"] == "A1"


def test_shared_words_beat_the_kind_of_answer() -> None:
    lines = ["A1: Did you book the hotel in Lyon?", "A2: Are you coming to dinner?"]
    assert answered([*lines, "P1: yes, the hotel is booked"])["answers"] == "A1"


def test_two_yes_no_questions_tie_and_the_latest_is_likeliest() -> None:
    lines = ["A1: Did you sleep well?", "A2: Are you coming to dinner?", "P1: yes!"]
    result = reply_matching(lines)
    assert result["answers"] == [{"message": "P1", "answers": "A2", "unclear": ["A1", "A2"]}]
    assert result["open"] == ["A1", "A2"]


def test_no_answer_to_a_yes_no_question_starts_something_new() -> None:
    assert answered(["A1: Did you finish that book?", "P1: I am making pasta"])["answers"] is None


def test_a_remark_on_a_statement_answers_it() -> None:
    assert answered(["A1: That sounds lovely.", "P1: I am making pasta"])["answers"] == "A1"


def test_french_questions_and_answers() -> None:
    lines = ["A1: Comment était ton week-end ?", "A2: As-tu fini le livre ?", "P1: oui, adoré !"]
    assert answered(lines)["answers"] == "A2"
    lines = ["A1: Comment était ton week-end ?", "A2: Super.", "P1: c'était génial"]
    assert answered(lines)["answers"] == "A1"


@pytest.mark.parametrize("text", ["You're welcome!", "haha, true", "ok thanks", "Merci"])
def test_lull_phrasings(text: str) -> None:
    assert is_lull(text)
    assert reply_matching(["A1: Glad it helped!", f"P1: {text}"])["lull"] is True


def test_not_lulls() -> None:
    assert not is_lull("thanks, but what about Tuesday?")


async def test_other_tasks_have_no_rules() -> None:
    analysis = RehearsalAnalysis()
    assert await analysis.ask("same-memory", ["M1: a", "M2: b"], "") is None
    with pytest.raises(ValueError):
        await analysis.ask("mood", [], "")


def test_loose_ends_our_waiting_questions_their_skipped_ones_and_promises() -> None:
    lines = [
        "A1: How was your weekend?",
        "A2: Did you finish that book?",
        "A3: Glad you liked it. I'll tell you about the sequel later.",
        "P1: yes, loved it!",
        "P2: what time is the dentist?",
    ]
    assert loose_ends(lines)["loose_ends"] == [
        {"by": "assistant", "ref": "A1", "text": "How was your weekend?", "kind": "question"},
        {"by": "person", "ref": "P2", "text": "what time is the dentist?", "kind": "question"},
        {
            "by": "assistant",
            "ref": "A3",
            "text": "Glad you liked it. I'll tell you about the sequel later.",
            "kind": "thread",
        },
    ]


def test_a_thread_is_taken_up_by_a_reply_that_speaks_of_it() -> None:
    lines = [
        "A1: I'll tell you the rest of the lighthouse story later.",
        "A2: So, the lighthouse keeper came home.",
        "P1: go on",
    ]
    assert loose_ends(lines) == {"loose_ends": []}
