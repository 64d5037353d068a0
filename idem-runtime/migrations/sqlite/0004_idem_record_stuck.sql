-- idem dedup records (SQLite), version 4: what the reconciler reads (`Store::stuck`), the
-- PROCESSING records of one business type whose lease has ended, oldest lease first, as a range
-- of this index.
CREATE INDEX IF NOT EXISTS idem_record_stuck ON idem_record (biz_type, status, lease_until);
