-- Which assistant message each say answers (reply matching): the reply id it answers, the
-- questions still waiting after it, whether it was unclear, asked about or guessed. Written
-- with the reply that answered the say, in the same statement (`storage/event_log.py`), so a
-- resume, a restart and the next turn's candidates read the graph the turn built. Says
-- matched without the model (none or one candidate) have none: nothing waits after them.
ALTER TABLE turns ADD COLUMN reply_match jsonb;
-- A payload, never searched: no statistics (see 009).
ALTER TABLE turns ALTER COLUMN reply_match SET STATISTICS 0;

-- Loose ends: what an exchange left unaddressed, on either side (a point of the person's
-- the reply skipped, a question of the assistant's left unanswered), noted after each reply
-- by a `loose-ends` analysis. Those of kind `thread` (a story not finished, something
-- promised) are the person's open threads (`GET /v1/threads`). A later analysis that is
-- shown an open one and no longer lists it closes it: it was addressed.
CREATE TABLE loose_ends (
    id              uuid PRIMARY KEY,
    person          text NOT NULL,
    conversation    uuid NOT NULL REFERENCES conversations (id),
    by              text NOT NULL CHECK (by IN ('person', 'assistant')),
    kind            text NOT NULL CHECK (kind IN ('point', 'question', 'thread')),
    text            text NOT NULL,
    at              timestamptz NOT NULL,
    closed_at       timestamptz
);
CREATE INDEX loose_ends_open ON loose_ends (person, at) WHERE closed_at IS NULL;
-- The same loose end noted twice (two exchanges racing) is kept once.
CREATE UNIQUE INDEX loose_ends_once ON loose_ends (person, by, text) WHERE closed_at IS NULL;
