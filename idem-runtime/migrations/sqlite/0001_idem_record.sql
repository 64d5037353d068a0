-- idem dedup records (SQLite), version 1 (0002 adds the fence). Times are milliseconds since the Unix epoch, by the database's clock.
CREATE TABLE IF NOT EXISTS idem_record (
    biz_type    TEXT    NOT NULL,
    idem_key    TEXT    NOT NULL,
    status      TEXT    NOT NULL CHECK (status IN ('PROCESSING', 'SUCCEEDED', 'FAILED')),
    attempt     INTEGER NOT NULL,
    fingerprint TEXT,
    result      BLOB,
    lease_until INTEGER NOT NULL,
    created_at  INTEGER NOT NULL,
    updated_at  INTEGER NOT NULL,
    expire_at   INTEGER NOT NULL,
    PRIMARY KEY (biz_type, idem_key)
) WITHOUT ROWID;

CREATE INDEX IF NOT EXISTS idem_record_expire_at ON idem_record (expire_at);
