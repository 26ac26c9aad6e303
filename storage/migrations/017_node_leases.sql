-- The lease moves from each person's row to the node's (docs/architecture.md, "Several
-- nodes"): a node renews one row, its own in `nodes`, whatever the number of people it owns.
-- `nodes` now decides ownership with `owners` and the nodes' advisory locks: a person may be
-- taken from a node once the node's lease (`last_heartbeat` + `lease_s`) and the take's own
-- (`owners.expires_at`) have both ended, or at once when the node's lock is free. No column
-- changes; the comments say what each one now means, for whoever reads the schema.
COMMENT ON TABLE nodes IS
    'One row per node: its lease (renewed as last_heartbeat, ends lease_s after it) and state.';
COMMENT ON COLUMN nodes.last_heartbeat IS
    'The node''s last lease renewal: its lease, over every person it owns, ends lease_s later.';
COMMENT ON COLUMN owners.expires_at IS
    'End of the lease the take gave, never renewed: after it the node''s lease covers the person.';
