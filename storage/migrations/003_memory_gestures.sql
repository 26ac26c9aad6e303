-- The gestures on memories (docs/memories.md).

-- A list pages through a person's memories newest-mentioned first, by keyset
-- (last_mentioned, id): this index serves it without a sort.
CREATE INDEX cards_person_mentioned ON cards (person, last_mentioned DESC, id DESC);

-- Forgetting a memory sets `corrected_by` to null wherever it pointed at it; without an
-- index on that column, a bulk forget of 10,000 memories reads the table 10,000 times.
CREATE INDEX cards_corrected_by ON cards (corrected_by) WHERE corrected_by IS NOT NULL;

-- The generation trigger of 002, with one change: its UPDATE branch joins the old and new
-- rows by id, and PL/pgSQL caches that plan on a connection's first run. A first run on a
-- few rows caches a nested loop, and a later bulk mute of 10,000 memories then compares
-- 10,000 x 10,000 rows (about 25 s). EXECUTE plans it each time, for the rows at hand.
CREATE OR REPLACE FUNCTION memory_generation_bump() RETURNS trigger LANGUAGE plpgsql AS $$
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
        EXECUTE $sql$
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
            ON CONFLICT (person) DO UPDATE SET generation = g.generation + 1
        $sql$;
    END IF;
    RETURN NULL;
END $$;
