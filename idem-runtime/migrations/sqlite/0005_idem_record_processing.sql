-- idem dedup records (SQLite), version 5: the index the reconciler reads (`Store::stuck`) holds
-- only the PROCESSING records, by business type and lease end. A record leaves it when it is
-- marked SUCCEEDED or FAILED, so the mark writes one index entry fewer and the index stays the
-- size of the work in flight. It replaces idem_record_stuck (version 4), which held every record.
CREATE INDEX IF NOT EXISTS idem_record_processing ON idem_record (biz_type, lease_until)
    WHERE status = 'PROCESSING';
DROP INDEX IF EXISTS idem_record_stuck;
