-- Autovacuum analyzes a table each time a tenth of it has changed, so on a young server
-- under load `turns` and `events` were analyzed every minute. Each ANALYZE read a sample of
-- 30,000 rows and sorted it once per column, frames and texts included: 0.2 s of a core per
-- table at 80,000 turns and 200,000 events, all at once, and the resumes of that moment
-- waited for a core (bench/README.md, stop 26).
-- The planner only ever reaches these rows through their keys, so payload columns get no
-- statistics, and key columns a sample of 3,000 rows (the sample is 300 x the largest
-- target). The plans of every query on them stay the same (`tests/test_statistics.py`);
-- an ANALYZE of either table at those sizes took 19 to 25 ms instead of 139 to 258.
ALTER TABLE events
    ALTER COLUMN frame SET STATISTICS 0,
    ALTER COLUMN conversation SET STATISTICS 10,
    ALTER COLUMN seq SET STATISTICS 10;

ALTER TABLE turns
    ALTER COLUMN text SET STATISTICS 0,
    ALTER COLUMN in_reply_to SET STATISTICS 0,
    ALTER COLUMN reply_id SET STATISTICS 0,
    ALTER COLUMN role SET STATISTICS 0,
    ALTER COLUMN at SET STATISTICS 0,
    ALTER COLUMN interrupted SET STATISTICS 0,
    ALTER COLUMN place SET STATISTICS 0,
    ALTER COLUMN id SET STATISTICS 10,
    ALTER COLUMN conversation SET STATISTICS 10,
    ALTER COLUMN person SET STATISTICS 10,
    ALTER COLUMN client_id SET STATISTICS 10;
