"""Fixed phrases stillhere writes into prompts.

They live beside the models because the rehearsal model recognises them: it shows, in its
answers, which notes it was handed.
"""

CUT_MARK = " [cut off here: the person interrupted]"
# In place of a reply the person interrupted before it had a word: no empty assistant turn.
NOTE_CUT_BEFORE_WORDS = "The person interrupted you before you had said anything in reply."
NOTE_INTERRUPTED = (
    "Your previous reply was interrupted by the person and cut off where it ends above. "
    "Do not pretend it was complete, and do not simply carry on with it."
)
NOTE_DURING_REPLY = (
    "The following messages arrived while you were writing your previous reply. "
    "Answer them together, in one reply."
)
SUMMARY_PROMPT = (
    "Summarise this conversation in two or three sentences, for recalling it later: "
    "what was discussed, decided, and left open."
)
# Reply matching (actors/replies.py): a data note placed just before the says it is about.
REPLY_CONTEXT = "REPLY CONTEXT (data)"
REPLY_ASK = "Ask the person, in one short question, which one they meant."
REPLY_WAITING = "Still waiting for an answer:"
# Loose ends (actors/loose_ends.py): what earlier exchanges left unaddressed.
LOOSE_ENDS = "LOOSE ENDS (data)"
LOOSE_PERSON = "Points of theirs you have not addressed yet:"
LOOSE_ASSISTANT = "Your own questions still unanswered (raise one only if it fits now):"
LOOSE_THREADS = "Open threads you may come back to later:"
# Follow-ons (actors/follow_on.py): the last note of a message the assistant sends unasked.
FOLLOW_ON = (
    "FOLLOW-ON (data): the person is winding the topic down and has not written since your "
    "last message. Send one short message of your own now: pick up something you still "
    "wanted to say (one of the loose ends or open threads above, if any). Do not answer "
    "their last message again, and do not ask whether they are still there."
)
