-- idem dedup records (MySQL 8 / MariaDB >= 10.5): how long a success's result is kept, when
-- shorter than the record (`Call::result_ttl`). `result_until` is NULL while the result is kept as
-- long as the record, the time (ms, database clock) until which it is replayed otherwise, and 0
-- once a sweep dropped it: from its time on the record is a tombstone that refuses repeats until
-- it expires. MySQL has no ADD COLUMN IF NOT EXISTS: `MySqlStore::migrate()` applies this with the
-- store's table name in place of `idem_record`, and takes "duplicate column name" (1060) as the
-- column being there.
ALTER TABLE `idem_record` ADD COLUMN result_until BIGINT NULL;
