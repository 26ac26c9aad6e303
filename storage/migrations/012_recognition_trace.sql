-- How recognition decided, kept beside what it decided. A reinforcement keeps the path that
-- took it (`tier` or `judge`) and why, and the restatement's own type, people, themes and
-- times beside its text, so a mention folded in by mistake can be split back out as a memory
-- of its own with nothing lost; `split_into` is that memory once it is.
ALTER TABLE reinforcements
    ADD COLUMN decided_by  text,
    ADD COLUMN reason      text,
    ADD COLUMN draft       jsonb,
    ADD COLUMN split_into  uuid REFERENCES cards (id) ON DELETE SET NULL;

-- Why a memory was stored although others came near: the guards that kept it apart, the
-- judge's verdict, or that no judge answered. Null when nothing came near.
ALTER TABLE cards ADD COLUMN recognition text;
