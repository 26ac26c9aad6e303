-- Search by name: a query that names a person or a theme finds every active memory set
-- with it, however far its wording. The keys are scoped to their person (`person:name`,
-- lowercased), so one person's common theme never makes another person's look-up scan
-- it, and the GIN index answers "any of these names" in one probe.

-- Costly on purpose, so the planner never computes the keys row by row when the index
-- can find them (the look-up in storage/memories.py, `MemoryStore.named`, says why).
CREATE FUNCTION memory_name_keys(person text, people text[], themes text[])
RETURNS text[] LANGUAGE sql IMMUTABLE PARALLEL SAFE COST 1000 AS $$
    SELECT ARRAY(SELECT person || ':' || lower(name) FROM unnest(people || themes) AS name)
$$;

-- Without the pending list, a new memory's keys go straight into the index: otherwise
-- every look-up scans the keys added since the last vacuum, one by one.
CREATE INDEX cards_name_keys ON cards USING gin (memory_name_keys(person, people, themes))
    WITH (fastupdate = off) WHERE status = 'active';
