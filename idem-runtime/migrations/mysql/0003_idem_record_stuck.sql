-- idem dedup records (MySQL 8 / MariaDB >= 10.5): what the reconciler reads (`Store::stuck`), the
-- PROCESSING records of one business type whose lease has ended, oldest lease first, as a range
-- of this index. MySQL has no CREATE INDEX IF NOT EXISTS: apply this once. `MySqlStore::migrate()`
-- applies it with the store's table name in place of `idem_record` (and its index name in place
-- of `idem_record_stuck`), and takes "duplicate key name" (1061) as the index being there.
CREATE INDEX `idem_record_stuck` ON `idem_record` (biz_type, status, lease_until);
