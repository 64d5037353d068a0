-- idem one-time submit tokens (SQLite). A spent token stays (spent = 1) until it expires, so a second
-- submit is told "used" rather than "unknown". Times are milliseconds since the Unix epoch, by the
-- database's clock.
CREATE TABLE IF NOT EXISTS idem_token (
    token     TEXT    NOT NULL PRIMARY KEY,
    subject   TEXT    NOT NULL,
    spent     INTEGER NOT NULL,
    expire_at INTEGER NOT NULL
) WITHOUT ROWID;

CREATE INDEX IF NOT EXISTS idem_token_expire_at ON idem_token (expire_at);
