-- A per-person counter bumped by every change to what context assembly reads from the
-- database (docs/context.md): a memory added, changed or removed, a rule given or taken
-- back, a conversation archived or summarised, whoever made the change (this process,
-- `stillhere memory consolidate`, a gesture, plain SQL). A turn reads this one row; while
-- it has not moved, the context's reads of the turn before still hold.
CREATE TABLE context_generations (
    person      text PRIMARY KEY,
    generation  bigint NOT NULL
);

-- Statement-level for memories and rules, which bulk gestures change 10,000 rows at a time.
CREATE FUNCTION context_generation_bump() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        INSERT INTO context_generations AS g (person, generation)
            SELECT DISTINCT person, 1 FROM old_rows
            ON CONFLICT (person) DO UPDATE SET generation = g.generation + 1;
    ELSE
        INSERT INTO context_generations AS g (person, generation)
            SELECT DISTINCT person, 1 FROM new_rows
            ON CONFLICT (person) DO UPDATE SET generation = g.generation + 1;
    END IF;
    RETURN NULL;
END $$;
CREATE TRIGGER cards_context_insert AFTER INSERT ON cards
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION context_generation_bump();
CREATE TRIGGER cards_context_update AFTER UPDATE ON cards
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION context_generation_bump();
CREATE TRIGGER cards_context_delete AFTER DELETE ON cards
    REFERENCING OLD TABLE AS old_rows
    FOR EACH STATEMENT EXECUTE FUNCTION context_generation_bump();
CREATE TRIGGER rules_context_insert AFTER INSERT ON rules
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION context_generation_bump();
CREATE TRIGGER rules_context_update AFTER UPDATE ON rules
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION context_generation_bump();
CREATE TRIGGER rules_context_delete AFTER DELETE ON rules
    REFERENCING OLD TABLE AS old_rows
    FOR EACH STATEMENT EXECUTE FUNCTION context_generation_bump();

-- Row-level for conversations, with a condition: every turn updates its conversation's
-- last_activity, and that must cost nothing here. Only what the recent-conversations
-- source reads counts: an archive (status), a summary, a conversation forgotten.
CREATE FUNCTION context_generation_bump_row() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO context_generations AS g (person, generation)
        VALUES (CASE WHEN TG_OP = 'DELETE' THEN OLD.person ELSE NEW.person END, 1)
        ON CONFLICT (person) DO UPDATE SET generation = g.generation + 1;
    RETURN NULL;
END $$;
CREATE TRIGGER conversations_context_update AFTER UPDATE ON conversations
    FOR EACH ROW
    WHEN (OLD.status IS DISTINCT FROM NEW.status OR OLD.summary IS DISTINCT FROM NEW.summary)
    EXECUTE FUNCTION context_generation_bump_row();
CREATE TRIGGER conversations_context_delete AFTER DELETE ON conversations
    FOR EACH ROW WHEN (OLD.status = 'archived')
    EXECUTE FUNCTION context_generation_bump_row();
