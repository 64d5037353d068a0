-- idem dedup records (PostgreSQL): how long a success's result is kept, when shorter than the
-- record (`Call::result_ttl`). `result_until` is NULL while the result is kept as long as the
-- record, the time (ms, database clock) until which it is replayed otherwise, and 0 once a sweep
-- dropped it: from its time on the record is a tombstone that refuses repeats until it expires.
-- The index holds only the results still to drop (a NULL or 0 is not in it), so the sweep reads
-- what it changes and every other record costs no index entry. PgStore::migrate() applies this
-- with the configured table name in place of idem_record (and <table>_result_until for the
-- index). On a large table in use, build the index with CREATE INDEX CONCURRENTLY first.
ALTER TABLE idem_record ADD COLUMN IF NOT EXISTS result_until BIGINT;
CREATE INDEX IF NOT EXISTS idem_record_result_until ON idem_record (result_until)
    WHERE result_until > 0;
