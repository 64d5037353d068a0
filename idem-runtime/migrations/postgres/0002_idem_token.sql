-- idem one-time submit tokens (PostgreSQL). A spent token stays (spent = TRUE) until it expires, so
-- a second submit is told "used" rather than "unknown". Times are milliseconds since the Unix epoch
-- by the database's clock. PgStore::migrate() applies this with the configured token table name in
-- place of idem_token.
CREATE TABLE IF NOT EXISTS idem_token (
    token     TEXT    NOT NULL PRIMARY KEY,
    subject   TEXT    NOT NULL,
    spent     BOOLEAN NOT NULL,
    expire_at BIGINT  NOT NULL
);

CREATE INDEX IF NOT EXISTS idem_token_expire_at ON idem_token (expire_at);
