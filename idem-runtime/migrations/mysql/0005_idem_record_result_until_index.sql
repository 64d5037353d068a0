-- idem dedup records (MySQL 8 / MariaDB >= 10.5): the results a sweep still has to drop
-- (`result_until` > 0, version 4), read as a range of this index. MySQL has no partial index: the
-- records whose result is kept as long as they are sit in it under NULL. `MySqlStore::migrate()`
-- applies this with the store's table name in place of `idem_record` (and its index name in place
-- of `idem_record_result_until`), and takes "duplicate key name" (1061) as the index being there.
CREATE INDEX `idem_record_result_until` ON `idem_record` (result_until);
