-- Search by name: a query that names a person or a theme finds every active memory set
-- with it, however far its wording. The keys are scoped to their person (`person:name`,
-- lowercased), so one person's common theme never makes another person's look-up scan
-- it, and the GIN index answers "any of these names" in one probe.

CREATE FUNCTION memory_name_keys(person text, people text[], themes text[])
RETURNS text[] LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT ARRAY(SELECT person || ':' || lower(name) FROM unnest(people || themes) AS name)
$$;

CREATE INDEX cards_name_keys ON cards USING gin (memory_name_keys(person, people, themes))
    WHERE status = 'active';
