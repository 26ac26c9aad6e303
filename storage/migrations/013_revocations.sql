-- Persons (accounts or devices, by their keyed hash) refused at every hello and request.
-- `stillhere revoke` writes here and notifies `stillhere_revocations`; running servers
-- listen and close the person's live links.
CREATE TABLE revocations (
    person     text PRIMARY KEY,
    revoked_at timestamptz NOT NULL DEFAULT now()
);
