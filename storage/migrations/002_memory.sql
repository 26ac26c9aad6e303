-- Long-term memory. The `cards` table becomes the memory table: every card the model
-- ever made is a memory, the `card` event and the welcome's `cards` keep reading it, and
-- no data moves. `kind` is the memory's type (fact, appointment, reminder, task, memo,
-- preference...). A memory made outside a conversation (the eval, a direct gesture) has
-- no conversation.

ALTER TABLE cards ALTER COLUMN conversation DROP NOT NULL;
ALTER TABLE cards
    ADD COLUMN people           text[] NOT NULL DEFAULT '{}',   -- set by the model, as said
    ADD COLUMN themes           text[] NOT NULL DEFAULT '{}',
    ADD COLUMN status           text NOT NULL DEFAULT 'active'
        CHECK (status IN ('active', 'muted', 'erroneous', 'archived', 'done')),
    ADD COLUMN corrected_by     uuid REFERENCES cards (id) ON DELETE SET NULL,
    ADD COLUMN mention_count    integer NOT NULL DEFAULT 1 CHECK (mention_count >= 1),
    ADD COLUMN first_mentioned  timestamptz,
    ADD COLUMN last_mentioned   timestamptz,
    -- calendar window, for appointments, reminders and tasks
    ADD COLUMN starts_at        timestamptz,
    ADD COLUMN ends_at          timestamptz,
    ADD COLUMN due_at           timestamptz,
    ADD COLUMN all_day          boolean NOT NULL DEFAULT false,
    ADD COLUMN resolved_at      timestamptz,
    -- the embedding of `text`, float32 little-endian, and the model that made it; null
    -- when the embedder failed (the back-fill pass fills it in later)
    ADD COLUMN fingerprint      bytea,
    ADD COLUMN fingerprint_model text,
    ADD CONSTRAINT cards_fingerprint_model CHECK ((fingerprint IS NULL) = (fingerprint_model IS NULL));

UPDATE cards SET first_mentioned = created_at, last_mentioned = created_at;

-- Rows written by the first store (add_card) name neither time: they start as created.
CREATE FUNCTION cards_mentioned_default() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    NEW.first_mentioned := COALESCE(NEW.first_mentioned, NEW.created_at);
    NEW.last_mentioned := COALESCE(NEW.last_mentioned, NEW.created_at);
    RETURN NEW;
END $$;
CREATE TRIGGER cards_mentioned_default BEFORE INSERT ON cards
    FOR EACH ROW EXECUTE FUNCTION cards_mentioned_default();
ALTER TABLE cards ALTER COLUMN first_mentioned SET NOT NULL;
ALTER TABLE cards ALTER COLUMN last_mentioned SET NOT NULL;

CREATE INDEX cards_person_status ON cards (person, status);
CREATE INDEX cards_unfingerprinted ON cards (person) WHERE fingerprint IS NULL;

-- Links between memories. `contradicts`: same thing, different value (the person settles
-- it); `related`; `merged_into`: the consolidation pass muted `source` into `target`;
-- `corrects`: `source` is the memory that corrects the erroneous `target`; `distinct`: a
-- merge was undone, so the consolidation pass never merges these two again.
CREATE TABLE memory_links (
    source      uuid NOT NULL REFERENCES cards (id) ON DELETE CASCADE,
    target      uuid NOT NULL REFERENCES cards (id) ON DELETE CASCADE,
    kind        text NOT NULL
        CHECK (kind IN ('contradicts', 'related', 'merged_into', 'corrects', 'distinct')),
    person      text NOT NULL,
    created_at  timestamptz NOT NULL,
    PRIMARY KEY (source, target, kind),
    CHECK (source <> target)
);
CREATE INDEX memory_links_target ON memory_links (target);

-- Every time a memory was recognised instead of created, and every merge of the
-- consolidation pass: the only way to tune the thresholds is to read back what they merged.
CREATE TABLE reinforcements (
    id            bigserial PRIMARY KEY,
    person        text NOT NULL,
    conversation  uuid REFERENCES conversations (id) ON DELETE SET NULL,
    tier          text NOT NULL,  -- exact | close | shared | consolidated:<tier> | unmerged
    score         real NOT NULL,
    new_text      text NOT NULL,
    existing      uuid NOT NULL REFERENCES cards (id) ON DELETE CASCADE,
    new_id        uuid,           -- the memory muted into (or unmerged from) `existing`
    at            timestamptz NOT NULL
);
CREATE INDEX reinforcements_existing ON reinforcements (existing);
CREATE INDEX reinforcements_conversation ON reinforcements (conversation)
    WHERE conversation IS NOT NULL;

-- A per-person counter bumped by every change that alters what the fingerprint index must
-- hold (a memory added or removed, its status or fingerprint changed), whoever made it:
-- this process, `stillhere memory consolidate`, a gesture, plain SQL. The in-process index
-- compares it to the one it was built at, so it is never silently stale.
-- `consolidated` is the generation the last consolidation pass saw: a person whose memories
-- have not changed since is not looked at again.
CREATE TABLE memory_generations (
    person        text PRIMARY KEY,
    generation    bigint NOT NULL,
    consolidated  bigint NOT NULL DEFAULT 0
);
INSERT INTO memory_generations (person, generation) SELECT DISTINCT person, 1 FROM cards;

CREATE FUNCTION memory_generation_bump() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        INSERT INTO memory_generations AS g (person, generation)
            SELECT DISTINCT person, 1 FROM new_rows
            ON CONFLICT (person) DO UPDATE SET generation = g.generation + 1;
    ELSIF TG_OP = 'DELETE' THEN
        INSERT INTO memory_generations AS g (person, generation)
            SELECT DISTINCT person, 1 FROM old_rows
            ON CONFLICT (person) DO UPDATE SET generation = g.generation + 1;
    ELSE
        INSERT INTO memory_generations AS g (person, generation)
            SELECT DISTINCT p.person, 1 FROM (
                SELECT n.person FROM new_rows n JOIN old_rows o USING (id)
                WHERE n.status IS DISTINCT FROM o.status
                   OR n.fingerprint IS DISTINCT FROM o.fingerprint
                   OR n.fingerprint_model IS DISTINCT FROM o.fingerprint_model
                   OR n.person IS DISTINCT FROM o.person
                UNION SELECT o.person FROM new_rows n JOIN old_rows o USING (id)
                WHERE n.person IS DISTINCT FROM o.person
            ) p
            ON CONFLICT (person) DO UPDATE SET generation = g.generation + 1;
    END IF;
    RETURN NULL;
END $$;
CREATE TRIGGER cards_generation_insert AFTER INSERT ON cards
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION memory_generation_bump();
CREATE TRIGGER cards_generation_update AFTER UPDATE ON cards
    REFERENCING NEW TABLE AS new_rows OLD TABLE AS old_rows
    FOR EACH STATEMENT EXECUTE FUNCTION memory_generation_bump();
CREATE TRIGGER cards_generation_delete AFTER DELETE ON cards
    REFERENCING OLD TABLE AS old_rows
    FOR EACH STATEMENT EXECUTE FUNCTION memory_generation_bump();
