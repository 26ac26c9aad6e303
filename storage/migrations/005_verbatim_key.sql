-- The verbatim tier (a memory restated word for word, whatever its case and punctuation)
-- finds its candidates by one indexed equality instead of reading every memory of a similar
-- length: at 10,000 memories that read was thousands of rows per look-up.
--
-- The key keeps letters and digits only, lower-cased. It is coarser than the Python check
-- (`actors.memory.recognition.same_text`), which still decides: the key only has to bring
-- every true verbatim copy among the candidates. Defined once, here, and used both by the
-- column and by the look-up, so the two sides are always computed alike.
CREATE FUNCTION memory_text_key(body text) RETURNS text
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    RETURN lower(regexp_replace(body, '[^[:alnum:]]+', '', 'g'));

ALTER TABLE cards ADD COLUMN text_key text GENERATED ALWAYS AS (memory_text_key(text)) STORED;
CREATE INDEX cards_person_text_key ON cards (person, text_key) WHERE status = 'active';
