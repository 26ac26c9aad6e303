-- A turn's place in the talk, which the record is read back in. Ids say when each row was
-- written, and a reply is written when it ends: a message sent while it streamed was stored
-- before it, though it came after it (the model was handed it after the reply, and the
-- phone was sent the reply's start before the message's ack). Places come from the
-- conversation's stream, whose seq never repeats nor goes back:
--   a reply:  2 x the seq of its reply.start;
--   a say:    2 x the last seq its stream had sent when the say was stored, + 1.
-- Rows from before this column have none, and come first, in id order.
ALTER TABLE turns ADD COLUMN place bigint;
CREATE INDEX turns_place ON turns (conversation, place NULLS FIRST, id);
DROP INDEX turns_conversation;
