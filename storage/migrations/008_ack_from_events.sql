-- A resent say is acked with the seq its first ack had. That seq was copied onto the say's
-- row by an UPDATE in every turn's event write: a second version of the row, and new entries
-- in all three of its indexes, for a value only a resend ever reads. The ack itself is in
-- `events`, just after the say's place (a say's place is 2 x the last seq sent before it was
-- stored, + 1), so a resend now reads it from there (`Store.add_say`).
ALTER TABLE turns DROP COLUMN ack_seq;
