"""The rehearsal analysis's rules, on the seed's stories and their neighbours."""

from __future__ import annotations

import pytest

from providers.rehearsal_analysis import (
    RehearsalAnalysis,
    is_holding,
    is_lull,
    language,
    loose_ends,
    loose_reading,
    reply_matching,
    sure_reply_matching,
)

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


# -- French: the language, question forms, answer forms, words ---------------------------


def test_a_conversation_is_read_in_the_language_of_its_function_words() -> None:
    assert language(["Tu as fini le livre ?", "oui"]) == "fr"
    assert language(["Did you finish the book?", "oui"]) == "en"
    assert language(["J'ai vu qu'il pleut."]) == "fr"  # elisions are French
    # "Autre chose ?" alone has no function word: read as the conversation is, a French
    # yes/no question, it ties with the other one; read as English, it would be open.
    lines = ["A1: Tu as fini le livre ?", "A2: Autre chose ?", "P1: oui"]
    assert answered(lines)["unclear"] == ["A1", "A2"]
    assert "unclear" not in answered(
        ["A1: Did you finish the book?", "A2: Autre chose ?", "P1: yes"]
    )


@pytest.mark.parametrize(
    "question",
    [
        "Tu as fini le livre ?",  # intonation
        "Vous venez dîner ?",
        "Et ton genou, ça va mieux ?",
        "Est-ce que tu viens ?",  # est-ce que
        "Et est-ce que Léa vient ?",
        "As-tu dormi ?",  # inversion
        "Va-t-elle mieux ?",
        "C'est toi qui as les clés ?",  # a relative "qui", a conjunction "que" or "quand"
        "Tu veux que je le note ?",
        "Tu m'appelles quand tu arrives ?",
        "Tu viens ou pas ?",  # the alternative is the question's own denial
    ],
)
def test_french_yes_no_questions(question: str) -> None:
    # A yes answers the yes/no question, though the open one is the latest.
    lines = [f"A1: {question}", "A2: Qu'est-ce que tu as mangé ?", "P1: oui"]
    assert answered(lines) == {"message": "P1", "answers": "A1"}


@pytest.mark.parametrize(
    "question",
    [
        "Qu'est-ce que tu as mangé ?",
        "Qu'as-tu mangé ?",
        "Que fais-tu ce soir ?",
        "Qui vient samedi ?",
        "C'est qui, ton nouveau collègue ?",
        "Tu vas où ce soir ?",
        "Tu pars quand en vacances ?",
        "À quelle heure est ton train ?",
        "Quel temps fait-il chez toi ?",
        "Tu pars combien de jours ?",
        "Pourquoi tu ris ?",
        "Comment va ta sœur ?",
        "Tu préfères le train de 8 h ou celui de 10 h ?",  # an alternative
    ],
)
def test_french_open_questions(question: str) -> None:
    # A yes does not answer an open question: it goes to the yes/no one alone, not unclear.
    lines = [f"A1: {question}", "A2: Tu as fini le livre ?", "P1: oui"]
    assert answered(lines) == {"message": "P1", "answers": "A2"}


@pytest.mark.parametrize(
    "answer",
    [
        "oui, adoré !",
        "ouais",
        "non",
        "nan, pas eu le temps",
        "carrément",
        "pas du tout",
        "pas encore",
        "bien sûr",
        "tout à fait",
        "presque",
        "yes",
        "nope",
    ],
)
def test_yes_no_answers_find_the_yes_no_question(answer: str) -> None:
    lines = ["A1: Tu as fini le livre ?", "A2: Comment s'est passé ton week-end ?", f"P1: {answer}"]
    assert answered(lines)["answers"] == "A1"


@pytest.mark.parametrize(
    "answer",
    ["pas mal, un peu long", "c'était délicieux", "épuisante, trop de travail", "super !"],
)
def test_answers_that_say_how_it_was_find_the_french_how_question(answer: str) -> None:
    lines = ["A1: Comment était ta semaine ?", "A2: Tu as reçu le colis ?", f"P1: {answer}"]
    assert answered(lines)["answers"] == "A1"


def test_an_english_answer_that_describes_finds_the_how_question() -> None:
    lines = ["A1: How was your day?", "A2: Did you call the bank?", "P1: it was a long one"]
    assert answered(lines)["answers"] == "A1"


def test_french_words_meet_past_elisions_and_hyphenated_pronouns() -> None:
    lines = ["A1: Tu as pensé à l'hôtel ?", "A2: Tu veux que je réserve le train ?"]
    assert answered([*lines, "P1: oui, un hôtel près de la gare"]) == {
        "message": "P1",
        "answers": "A1",
    }
    lines = ["A1: Tu veux que je te rappelle ?", "A2: Tu as fini le livre ?"]
    assert answered([*lines, "P1: oui, rappelle-moi demain"])["answers"] == "A1"


def test_french_function_words_are_no_shared_meaning() -> None:
    # "dans" is in the say and the first question alone: still a tie, the latest the
    # likelier; the say tells more than a yes, so the rules leave it to a model.
    lines = ["A1: Tu as rangé les courses dans le frigo ?", "A2: Tu as appelé ta mère ?"]
    said, sure = sure_reply_matching([*lines, "P1: oui, elle était dans le jardin"])
    assert said["answers"] == [{"message": "P1", "answers": "A2"}] and sure == [False]


# -- lulls -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        "You're welcome!",
        "haha, true",
        "ok thanks",
        "ok, cool, thanks",
        "Hahaha",
        "Merci",
        "ok merci",
        "d'accord, bonne soirée",
        "merci beaucoup, bonne nuit !",
        "haha c'est vrai",
        "mdr",
        "pas de souci",
        "ça marche, merci",
    ],
)
def test_lull_phrasings(text: str) -> None:
    assert is_lull(text)
    assert reply_matching(["A1: Glad it helped!", f"P1: {text}"])["lull"] is True


@pytest.mark.parametrize(
    "text",
    [
        "thanks, but what about Tuesday?",
        "hi",
        "oui merci",  # a yes: it answers, it winds nothing down
        "merci, mais tu peux vérifier jeudi ?",
        "d'accord, et demain ?",
        "",
    ],
)
def test_not_lulls(text: str) -> None:
    assert not is_lull(text)


@pytest.mark.parametrize(
    "text",
    ["hold on, thinking", "ok, back in a sec", "lol", "hahaha", "brb", "attends, je réfléchis"],
)
def test_says_that_answer_nothing(text: str) -> None:
    assert is_holding(text)


@pytest.mark.parametrize(
    "text", ["ok", "oui", "yes!", "ok thanks", "brb, coffee?", "wait, which book?", ""]
)
def test_says_that_may_answer(text: str) -> None:
    assert not is_holding(text)


def test_a_lull_answers_the_latest_message() -> None:
    lines = ["A1: Comment s'est passé ton week-end ?", "A2: Bonne soirée !", "P1: ok merci"]
    assert reply_matching(lines) == {
        "answers": [{"message": "P1", "answers": "A2"}],
        "open": ["A1"],
        "lull": True,
    }


async def test_other_tasks_have_no_rules() -> None:
    analysis = RehearsalAnalysis()
    assert await analysis.ask("same-memory", ["M1: a", "M2: b"], "") is None
    with pytest.raises(ValueError):
        await analysis.ask("mood", [], "")


@pytest.mark.parametrize(
    ("question", "answer", "reply"),
    [
        (
            "Want me to remind you about the dentist?",
            "yes please, Thursday morning",
            "Done: Thursday at 8 am.",
        ),
        (
            "Shall I order the usual groceries?",
            "go ahead, and add oat milk",
            "Ordered, with oat milk.",
        ),
        (
            "Je commande les courses habituelles ?",
            "vas-y, et ajoute du lait d'avoine",
            "C'est commandé, avec le lait d'avoine.",
        ),
    ],
)
def test_an_offer_taken_up_is_answered(question: str, answer: str, reply: str) -> None:
    """An offer asks yes or no ("want me to ...?"), and "go ahead" or "vas-y" is a yes."""
    lines = [f"A1: {question}", f"P1: {answer}", f"A2: {reply}"]
    assert sure_reply_matching(lines[:2]) == (
        {"answers": [{"message": "P1", "answers": "A1"}], "open": [], "lull": False},
        [True],
    )
    assert loose_ends(lines) == {"loose_ends": []}


def test_a_point_added_is_no_answer_to_the_open_question() -> None:
    """ "oh and ..." after an answer starts a point of its own: not the flat's any answer,
    and not dealt with by a reply that shares only a light verb with it ("makes")."""
    added = "oh and the boiler is making weird noises"
    lines = [
        "A1: How's the new flat?",
        "P1: great, huge balcony",
        f"P2: {added}",
        "A2: Nice, a balcony makes all the difference.",
    ]
    assert sure_reply_matching(lines[:3])[0]["answers"][1] == {"message": "P2", "answers": None}
    assert loose_ends(lines)["loose_ends"] == [
        {"by": "person", "ref": "P2", "text": added, "kind": "point"}
    ]


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


@pytest.mark.parametrize(
    "promise",
    [
        "Je te raconterai la fin du voyage plus tard.",
        "Je t'en dirai plus demain.",
        "Je reviens vers toi pour le devis.",
        "Et là, le phare s'est éteint... à suivre !",
    ],
)
def test_french_promises_are_threads(promise: str) -> None:
    lines = [f"A1: {promise}", "P1: d'accord", "A2: Bonne soirée !"]
    assert loose_ends(lines)["loose_ends"] == [
        {"by": "assistant", "ref": "A1", "text": promise, "kind": "thread"}
    ]


@pytest.mark.parametrize(
    "promise", ["TO BE CONTINUED, I'm off to bed.", "I'll Tell You Later.", "À suivre !"]
)
def test_a_promise_is_read_whatever_its_case(promise: str) -> None:
    lines = [f"A1: {promise}", "P1: ok", "A2: Good night!"]
    assert loose_ends(lines)["loose_ends"] == [
        {"by": "assistant", "ref": "A1", "text": promise, "kind": "thread"}
    ]


def test_a_french_thread_is_taken_up_by_a_reply_that_speaks_of_it() -> None:
    promise = "A1: Je te raconterai l'histoire du phare plus tard."
    assert [
        e["ref"] for e in loose_ends([promise, "P1: vas-y", "A2: Bonne soirée !"])["loose_ends"]
    ] == ["A1"]
    reply = "A2: Alors, le gardien du phare est rentré chez lui."
    assert loose_ends([promise, "P1: vas-y", reply]) == {"loose_ends": []}


def test_a_thread_is_taken_up_by_a_reply_that_speaks_of_it() -> None:
    lines = [
        "A1: I'll tell you the rest of the lighthouse story later.",
        "A2: So, the lighthouse keeper came home.",
        "P1: go on",
    ]
    assert loose_ends(lines) == {"loose_ends": []}


def test_a_lull_of_thousands_of_words_is_read_without_recursion() -> None:
    assert is_lull("ok " * 3000)
    assert not is_lull("ok " * 3000 + "but the hotel")


def test_the_says_answer_what_came_before_the_reply_not_the_reply() -> None:
    """Though "yes, loved it" shares a word with the reply after it, it answers the book."""
    lines = ["A1: Did you finish that book?", "A2: Glad you loved it!", "P1: yes, loved it"]
    assert loose_ends(lines)["loose_ends"] == []


def test_a_lull_leaves_our_question_open() -> None:
    lines = ["A1: Did you finish that book?", "A2: You're welcome!", "P1: ok thanks"]
    assert [e["ref"] for e in loose_ends(lines)["loose_ends"]] == ["A1"]


@pytest.mark.parametrize(
    ("say", "left_open", "sure"),
    [
        ("yes, loved it", False, True),  # a yes to the one yes/no question
        ("ok thanks", True, True),  # a lull answers nothing
        ("my car broke down this morning", True, False),  # no rule can tell
    ],
)
def test_the_rules_say_when_they_cannot_tell_whether_our_question_was_answered(
    say: str, left_open: bool, sure: bool
) -> None:
    lines = ["A1: Did you finish that book?", f"P1: {say}", "A2: I see."]
    (ours,) = [r for r in loose_reading(lines) if r.ref == "A1"]
    assert (ours.kind, ours.open, ours.sure) == ("question", left_open, sure)


@pytest.mark.parametrize(
    ("lines", "answers"),
    [
        # An answer, then a question of their own: weighed by the answer.
        (["A1: Did you call the landlord?", "P1: not yet. can you find me a plumber?"], "A1"),
        (["A1: Anything else for today?", "P1: yes, when is my dentist appointment?"], "A1"),
        (["A1: What should we cook tonight?", "P1: no idea, what goes with pasta?"], "A1"),
        # "Anything else?" takes the thing itself as well as a yes.
        (["A1: Shall I add milk?", "A2: Anything else to add?", "P1: eggs and bread"], "A2"),
        # A number to the question that asks for one, though no word is shared.
        (["A1: How old is your nephew now?", "A2: Want gift ideas?", "P1: eight in May"], "A1"),
        (["A1: Elle a quel âge, ta nièce ?", "A2: Tu veux des idées ?", "P1: huit ans"], "A1"),
        # A request to the assistant answers an open question no more than a question does.
        (["A1: What are you doing for Mum's birthday?", "P1: wake me up at 6:30"], None),
        (["A1: Tu fais quoi ce soir ?", "P1: réveille-moi à 6h30"], None),
    ],
)
def test_what_a_say_gives_decides_what_it_answers(lines: list[str], answers: str | None) -> None:
    assert answered(lines)["answers"] == answers


def test_a_yes_that_says_how_it_was_is_not_a_bare_yes() -> None:
    """Unclear is for a bare yes or no; "loved it, the actors were great" leans to the
    question about liking, which only a model can weigh: the rules are not sure."""
    lines = ["A1: Tu as aimé la pièce ?", "A2: Je te montre les dates ?"]
    bare, sure = sure_reply_matching([*lines, "P1: ouais"])
    assert bare["answers"][0]["unclear"] == ["A1", "A2"] and sure == [True]
    said, sure = sure_reply_matching([*lines, "P1: carrément, les acteurs étaient géniaux"])
    assert "unclear" not in said["answers"][0] and sure == [False]


def _open(lines: list[str]) -> list[tuple[str, str]]:
    return [(e["ref"], e["kind"]) for e in loose_ends(lines)["loose_ends"]]


@pytest.mark.parametrize(
    ("lines", "left"),
    [
        # The second question of one say, the reply dealing with the first only.
        (["P1: add milk to the list, and when's Sam's birthday?", "A1: Milk's on it."], ["P1"]),
        (
            [
                "P1: add milk, and when's Sam's birthday?",
                "A1: Milk added; Sam's birthday is May 3.",
            ],
            [],
        ),
        # A request beside another say, the reply dealing with the other.
        (
            ["P1: remind me to buy milk at 6", "P2: and text Leo I'm late", "A1: Milk at 6, set."],
            ["P2"],
        ),
        (
            ["P1: rappelle-moi le lait à 18h", "P2: et envoie un message à Léo", "A1: Lait à 18h."],
            ["P2"],
        ),
        # A point added ("oh and") that the reply passes over while it speaks of the rest.
        (
            ["P1: the meeting went well", "P2: oh and my car broke down", "A1: Great meeting!"],
            ["P2"],
        ),
        (["P1: I got the job!", "P2: starting in March", "A1: Congratulations on the job!"], []),
        # All the says asked is one question: a reply that says something is to it...
        (["P1: where's the nearest pharmacy?", "A1: There's one on Church Street."], []),
        # ... not one that only acknowledges it.
        (["P1: is the dentist on Friday?", "A1: Right."], ["P1"]),
    ],
)
def test_what_the_reply_leaves_of_the_says(lines: list[str], left: list[str]) -> None:
    assert [ref for ref, _ in _open(lines)] == left


def test_a_question_put_off_is_carried_by_the_reply_s_promise() -> None:
    """ "I'll get back to you" puts their question off: the promise is the thread, the
    question not a point of its own; a promise to tell something else is no such thing."""
    asked = "P1: is the pool open on bank holidays?"
    assert _open([asked, "A1: Not sure, I'll look into it and get back to you."]) == [
        ("A1", "thread")
    ]
    lines = ["P1: the meeting went well", "P2: what time is the dentist?"]
    assert _open([*lines, "A1: Good meeting! I'll tell you a joke later."]) == [
        ("P2", "question"),
        ("A1", "thread"),
    ]


@pytest.mark.parametrize(
    ("promise", "reply", "told"),
    [
        ("airport drama, tell you tonight", "The airport? Go on!", "the airport: lost bag"),
        ("exam tomorrow, I'll let you know", "Good luck with the exam!", "the exam went fine"),
        ("examen demain, je te tiens au courant", "Bon courage pour l'examen !", "examen réussi"),
        ("le dentiste, je te raconte ce soir", "Le dentiste ? Raconte !", "alors le dentiste..."),
    ],
)
def test_their_promise_stays_open_until_they_tell(promise: str, reply: str, told: str) -> None:
    """The reply right after their promise cannot take it up, however it speaks of it; a
    later say of theirs that speaks of it does."""
    assert _open([f"P1: {promise}", f"A1: {reply}"]) == [("P1", "thread")]
    assert _open([f"P1: {promise}", f"P2: {told}", "A1: Right."]) == []


def test_our_question_asked_again_by_the_reply_is_its_own() -> None:
    lines = [
        "A1: What time is your flight?",
        "P1: remind me to pack tonight",
        "A2: Reminder set. By the way, what time is your flight?",
    ]
    assert _open(lines) == []


@pytest.mark.parametrize("say", ["oui parfait", "ouais super", "yeah all good", "yes please"])
def test_a_yes_padded_with_fillers_is_still_bare(say: str) -> None:
    lines = ["A1: Tu as pensé au pain ?", "A2: Tu as rappelé le garage ?", f"P1: {say}"]
    result, sure = sure_reply_matching(lines)
    assert result["answers"][0]["unclear"] == ["A1", "A2"] and sure == [True]
