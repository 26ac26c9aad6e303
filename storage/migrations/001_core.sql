-- The conversation record: every turn is stored as it happens, so a restart costs at most
-- the reply that was streaming.

CREATE TABLE conversations (
    id              uuid PRIMARY KEY,
    person          text NOT NULL,          -- keyed hash of the account or device secret
    status          text NOT NULL DEFAULT 'active' CHECK (status IN ('active', 'archived')),
    started_at      timestamptz NOT NULL,
    last_activity   timestamptz NOT NULL,
    archived_at     timestamptz,
    archive_reason  text,                   -- leave | idle | replaced
    summary         text,
    speaker         text,
    speaker_at      timestamptz,
    seq_ceiling     bigint NOT NULL DEFAULT 0   -- no seq above this was ever handed out
);
-- One conversation in progress per person, whatever the races.
CREATE UNIQUE INDEX conversations_one_active ON conversations (person) WHERE status = 'active';
CREATE INDEX conversations_idle ON conversations (last_activity) WHERE status = 'active';

CREATE TABLE turns (
    id              bigserial PRIMARY KEY,
    conversation    uuid NOT NULL REFERENCES conversations (id),
    person          text NOT NULL,
    role            text NOT NULL CHECK (role IN ('user', 'assistant')),
    client_id       text,                   -- the say's id; null for replies
    reply_id        uuid,                   -- the reply's id; null for says
    text            text NOT NULL,
    at              timestamptz NOT NULL,
    interrupted     boolean NOT NULL DEFAULT false,
    in_reply_to     text[] NOT NULL DEFAULT '{}',
    ack_seq         bigint
);
CREATE UNIQUE INDEX turns_client_id ON turns (person, client_id) WHERE client_id IS NOT NULL;
CREATE INDEX turns_conversation ON turns (conversation, id);

-- Turn-level stream events (everything but reply.delta), for replay once the in-memory
-- buffer is gone (actor stopped early, server restarted).
CREATE TABLE events (
    conversation    uuid NOT NULL REFERENCES conversations (id),
    seq             bigint NOT NULL,
    frame           jsonb NOT NULL,
    PRIMARY KEY (conversation, seq)
);

CREATE TABLE cards (
    id              uuid PRIMARY KEY,
    person          text NOT NULL,
    conversation    uuid NOT NULL REFERENCES conversations (id),
    kind            text NOT NULL,
    text            text NOT NULL,
    created_at      timestamptz NOT NULL
);
CREATE INDEX cards_conversation ON cards (conversation);

CREATE TABLE reminders (
    id              uuid PRIMARY KEY,
    person          text NOT NULL,
    conversation    uuid NOT NULL REFERENCES conversations (id),
    text            text NOT NULL,
    due             text NOT NULL,
    created_at      timestamptz NOT NULL
);
