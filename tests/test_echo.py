"""The echo guard on its own: what it holds, cuts and releases as a reply streams in."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from actors.echo import EchoGuard, Source, fold, sources_for
from storage.records import Turn

NOW = datetime(2026, 5, 19, 9, 0, tzinfo=UTC)
ROUGH = "I had a rough day at work."


def turn(role: str, text: str) -> Turn:
    return Turn(role, text, NOW)


def guard(*said: str, earlier: tuple[str, ...] = ()) -> EchoGuard:
    """A guard for a reply to `said`, after the assistant's `earlier` messages."""
    history = [t for text in earlier for t in (turn("user", "Hi."), turn("assistant", text))]
    return EchoGuard(sources_for(history, [turn("user", s) for s in said]))


def stream(g: EchoGuard, reply: str, size: int = 3) -> list[str]:
    """What goes out for each piece of `size` characters, then at the end."""
    out = [g.feed(reply[i : i + size]) for i in range(0, len(reply), size)]
    return [*out, g.end()]


def shown(g: EchoGuard, reply: str, size: int = 3) -> str:
    return "".join(stream(g, reply, size))


def test_comparison_ignores_case_spacing_punctuation_and_accents() -> None:
    assert fold("I had a ROUGH day, at work!") == fold("i had a rough day at work")
    assert fold("Ça va, très bien.") == "cavatresbien"


def test_an_exact_echo_of_the_person_is_cut_and_the_rest_streams() -> None:
    g = guard(ROUGH)
    out = stream(g, ROUGH + " Sorry to hear that. What happened?")
    assert "".join(out) == "Sorry to hear that. What happened?"
    assert [c.kind for c in g.cuts] == ["person"] and g.cuts[0].text == ROUGH + " "
    assert not g.watching


def test_a_near_echo_with_other_case_and_punctuation_is_cut() -> None:
    assert shown(guard(ROUGH), "i had a ROUGH day... at work!! That sounds hard.") == (
        "That sounds hard."
    )


def test_an_echo_of_the_assistant_own_last_message_is_cut() -> None:
    earlier = "Would you like me to set a reminder for the dentist?"
    g = guard("Hmm, not sure yet.", earlier=(earlier,))
    assert shown(g, earlier + " Just let me know.") == "Just let me know."
    assert g.cuts[0].kind == "assistant"


def test_only_the_assistant_last_three_messages_count() -> None:
    old, *recent = [f"This is my message number {n} to you." for n in range(4)]
    assert shown(guard("Okay then.", earlier=(old, *recent)), old + " More.") == old + " More."
    assert shown(guard("Okay then.", earlier=(old, *recent)), recent[0] + " More.") == "More."


def test_the_person_messages_before_the_assistant_last_one_do_not_count() -> None:
    history = [turn("user", ROUGH), turn("assistant", "Oh no, what happened?")]
    g = EchoGuard(sources_for(history, [turn("user", "My boss yelled at me.")]))
    assert shown(g, ROUGH + " And then?") == ROUGH + " And then?"


def test_several_messages_sent_together_each_count() -> None:
    g = guard("I'm so tired today.", "My boss yelled at me again.")
    assert shown(g, "My boss yelled at me again. That's awful.") == "That's awful."


def test_a_partial_echo_that_diverges_is_released_unchanged_at_the_divergence() -> None:
    g = guard(ROUGH)
    reply = "I had a rough day too, honestly."
    out = stream(g, reply, size=1)
    first = next(i for i, piece in enumerate(out) if piece)
    # Held up to the "t" of "too", where it stops being the person's message.
    assert reply.index(" too") + 1 == first
    assert "".join(out) == reply and g.cuts == []


def test_a_reply_with_nothing_in_common_is_released_with_its_first_piece() -> None:
    g = guard(ROUGH)
    assert g.feed("Oh ") == "Oh "
    assert not g.watching and g.feed("no.") == "no."


def test_a_word_that_goes_on_past_the_echo_is_no_echo() -> None:
    g = guard("Let's meet at the park")
    assert shown(g, "Let's meet at the parking lot instead?") == (
        "Let's meet at the parking lot instead?"
    )


def test_the_longest_repetition_is_cut_when_one_message_starts_another() -> None:
    g = guard("I had a rough day.", "I had a rough day at work today.")
    assert shown(g, "I had a rough day at work today. Want to talk?") == "Want to talk?"


def test_a_reply_that_is_nothing_but_an_echo_releases_nothing() -> None:
    g = guard(ROUGH)
    assert shown(g, ROUGH) == ""
    assert len(g.cuts) == 1 and g.watching, "the next text is still the reply's start"
    assert shown(g, "That sounds hard.") == "That sounds hard."


def test_an_echo_of_two_messages_in_a_row_is_cut_whole() -> None:
    g = guard(ROUGH, earlier=("Tell me about your day, I'm all ears.",))
    reply = "Tell me about your day, I'm all ears. I had a rough day at work! Oh dear."
    assert shown(g, reply) == "Oh dear."
    assert [c.kind for c in g.cuts] == ["assistant", "person"]


def test_an_echo_ending_exactly_at_the_end_of_the_text_waits_for_the_end() -> None:
    g = guard(ROUGH)
    assert g.feed("I had a rough day at work") == ""
    assert g.end() == "" and len(g.cuts) == 1


@pytest.mark.parametrize(
    ("said", "reply"),
    [
        ("Good night!", "Good night! Sleep well."),
        ("Happy new year!", "Happy new year to you too!"),
        ("Bonne nuit !", "Bonne nuit, fais de beaux rêves."),
        ("Sleep well!", "Sleep well, talk tomorrow."),
    ],
)
def test_a_greeting_returned_is_no_echo(said: str, reply: str) -> None:
    assert shown(guard(said), reply) == reply


def test_a_short_assistant_phrase_may_come_again() -> None:
    g = guard("Talk tomorrow, I'm off to bed.", earlier=("Good night! Sleep well.",))
    assert shown(g, "Good night! Sleep well.") == "Good night! Sleep well."


def test_short_person_messages_are_no_sources() -> None:
    assert sources_for([], [turn("user", "Yes!!"), turn("user", "I'm ok.")]) == []


def test_a_repetition_the_person_asked_for_is_no_echo() -> None:
    g = guard("Milk, eggs, bread and coffee.", "Can you read that back to me?")
    assert shown(g, "Milk, eggs, bread and coffee. Anything else?") == (
        "Milk, eggs, bread and coffee. Anything else?"
    )


def test_a_reply_opening_with_a_quotation_mark_quotes_on_purpose() -> None:
    g = guard("The early bird catches the worm.")
    reply = "\u201cThe early bird catches the worm\u201d, but the second mouse gets the cheese."
    out = stream(g, reply)
    assert out[0] == reply[:3], "released as soon as the quotation mark is seen"
    assert "".join(out) == reply


def test_dropping_forgets_what_is_held() -> None:
    g = guard(ROUGH)
    assert g.feed("I had a rough") == ""
    g.drop()
    assert g.held == "" and g.end() == ""


def test_the_outcome_does_not_depend_on_how_the_text_is_split() -> None:
    reply = "I had a rough day at work.  Poor you, what happened?"
    results = {shown(guard(ROUGH), reply, size) for size in (1, 2, 5, 7, len(reply))}
    assert results == {"Poor you, what happened?"}


def test_without_sources_everything_passes_at_once() -> None:
    g = EchoGuard([])
    assert not g.watching and g.feed("I had a rough") == "I had a rough"


def test_describe_names_what_was_cut() -> None:
    g = EchoGuard([Source("person", fold(ROUGH))])
    shown(g, ROUGH + " Ouch.")
    assert g.describe() == "echo cut: 27 chars repeating the person's message"
