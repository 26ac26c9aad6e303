-- Context assembly (docs/context.md): personal rules, and the indexes that keep the
-- context's reads cheap for a person with many memories and conversations.

-- A person's standing instructions ("always answer in French", "call me Hannah"), handed
-- to the model in every context. Edited over HTTP (`/v1/rules`).
CREATE TABLE rules (
    id          uuid PRIMARY KEY,
    serial      bigserial NOT NULL,     -- the order they were given in, even within a second
    person      text NOT NULL,
    text        text NOT NULL,
    created_at  timestamptz NOT NULL
);
CREATE INDEX rules_person ON rules (person, serial);

-- The recent-conversations source: a person's latest archived conversations, newest first.
CREATE INDEX conversations_person_archived ON conversations (person, last_activity DESC, id DESC)
    WHERE status = 'archived';

-- The sample source: a person's active memories by mention count, without a sort.
CREATE INDEX cards_person_mentions ON cards (person, mention_count DESC, last_mentioned DESC, id DESC)
    WHERE status = 'active';
