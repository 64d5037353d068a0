-- idem dedup records (PostgreSQL): the index the reconciler reads (`Store::stuck`) holds only the
-- PROCESSING records, by business type and lease end. A record leaves it when it is marked
-- SUCCEEDED or FAILED, so the mark writes one index entry fewer and the index stays the size of
-- the work in flight, not of the table. It replaces idem_record_stuck (0003), which held every
-- record. PgStore::migrate() applies this (and not 0003) with the configured table name in place
-- of idem_record and its index names in place of idem_record_processing and idem_record_stuck.
-- On a large table in use, build the new index with CREATE INDEX CONCURRENTLY first (this
-- statement then finds it): a plain build blocks writes to the table while it runs.
CREATE INDEX IF NOT EXISTS idem_record_processing ON idem_record (biz_type, lease_until)
    WHERE status = 'PROCESSING';
DROP INDEX IF EXISTS idem_record_stuck;
