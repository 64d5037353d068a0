-- idem dedup records (SQLite), version 6: how long a success's result is kept, when shorter than
-- the record (`Call::result_ttl`). `result_until` is NULL while the result is kept as long as the
-- record, the time (ms) until which it is replayed otherwise, and 0 once a sweep dropped it: from
-- its time on the record is a tombstone that refuses repeats until it expires. SQLite has no
-- ADD COLUMN IF NOT EXISTS: SqliteStore::migrate() applies this only to a table without the column.
ALTER TABLE idem_record ADD COLUMN result_until INTEGER;
