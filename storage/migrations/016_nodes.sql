-- The nodes sharing this database, for operators (`stillhere inspect --cluster`,
-- docs/admin.md). A node writes its row as it starts, renews `last_heartbeat` with its
-- leases (every third of `lease_s`, whether or not it owns anyone) and sets `stopped_at`
-- on a clean stop. A heartbeat older than the node's lease means it is gone. Ownership is
-- decided by `owners` and the nodes' advisory locks alone: nothing reads this table to
-- decide who runs a conversation.
CREATE TABLE nodes (
    name           text PRIMARY KEY,
    host           text NOT NULL,
    pid            integer NOT NULL,
    lease_s        double precision NOT NULL,
    started_at     timestamptz NOT NULL,
    last_heartbeat timestamptz NOT NULL,
    stopped_at     timestamptz
);
