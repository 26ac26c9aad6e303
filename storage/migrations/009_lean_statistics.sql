-- Autovacuum analyzes a table each time a tenth of it has changed, so on a young server
-- under load `turns` and `events` are analyzed every minute. At the default targets, each
-- ANALYZE reads a sample of 30,000 rows and sorts it once per column, frames and texts
-- included, and the resumes of that moment wait for a core.
-- The planner only ever reaches these rows through their keys, so payload columns get no
-- statistics, and key columns a sample of 3,000 rows (the sample is 300 x the largest
-- target). The plans of every query on them stay the same (`tests/test_statistics.py`).
-- At the sizes a `python -m bench.flap --clients 2000 --duration 300` run leaves (80,000
-- turns, 200,000 events), an ANALYZE of either table takes 19 to 25 ms instead of 139 to 258.
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
