-- idem dedup records (PostgreSQL). Times are milliseconds since the Unix epoch by the database's
-- clock (clock_timestamp()); the fence is the clock in microseconds, or one more than the last
-- fence, so it never repeats for a key. PgStore::migrate() applies this with the configured table
-- name in place of idem_record (and <table>_expire_at for the index).
CREATE TABLE IF NOT EXISTS idem_record (
    biz_type    TEXT     NOT NULL,
    idem_key    TEXT     NOT NULL,
    status      TEXT     NOT NULL CHECK (status IN ('PROCESSING', 'SUCCEEDED', 'FAILED')),
    attempt     INTEGER  NOT NULL,
    fence       BIGINT   NOT NULL,
    fingerprint TEXT,
    result      BYTEA,
    lease_until BIGINT   NOT NULL,
    created_at  BIGINT   NOT NULL,
    updated_at  BIGINT   NOT NULL,
    expire_at   BIGINT   NOT NULL,
    PRIMARY KEY (biz_type, idem_key)
);

CREATE INDEX IF NOT EXISTS idem_record_expire_at ON idem_record (expire_at);
