-- Follow-ons (actors/follow_on.py): the assistant's mood towards each person, and replies it
-- sent on its own after a lull.
--
-- Fondness, 0 to 1, nudged after each exchange (actors/persona.py); one row a person, made
-- at their first exchange.
CREATE TABLE moods (
    person          text PRIMARY KEY,
    fondness        real NOT NULL CHECK (fondness BETWEEN 0 AND 1),
    at              timestamptz NOT NULL
);
-- A follow-on is the assistant speaking on its own: it is stored and replayed like any
-- reply, but it is not the person's activity, so the idle sweep and a resume skip it.
ALTER TABLE turns ADD COLUMN follow_on boolean NOT NULL DEFAULT false;
