-- Which node runs each person's live conversation (docs/architecture.md, "Several nodes").
-- A row is a lease: its node renews `expires_at`, and another node may take the person once
-- it has passed, or at once when the node is gone (its advisory lock is free). Each take
-- draws a new epoch from the sequence, never reused, and every write that matters for the
-- person names the epoch it was made under: a write under an epoch that is no longer the
-- row's changes nothing (it is fenced).
CREATE SEQUENCE owner_epochs;

CREATE TABLE owners (
    person     text PRIMARY KEY,
    node       text NOT NULL,
    epoch      bigint NOT NULL,
    expires_at timestamptz NOT NULL
);
CREATE INDEX owners_node ON owners (node);
