-- Which assistant message each say answers (reply matching): the reply id it answers, the
-- questions still waiting after it, whether it was unclear, asked about or guessed. Written
-- with the reply that answered the say, in the same statement (`storage/event_log.py`), so a
-- resume, a restart and the next turn's candidates read the graph the turn built. Says
-- matched without the model (none or one candidate) have none: nothing waits after them.
ALTER TABLE turns ADD COLUMN reply_match jsonb;
-- A payload, never searched: no statistics (see 009).
ALTER TABLE turns ALTER COLUMN reply_match SET STATISTICS 0;
