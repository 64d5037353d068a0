-- idem dedup records (SQLite), version 2: the fencing token of the current claim. Every claim gets
-- a fence that never repeats for a key (the clock in microseconds, or one more than the last fence),
-- and only the holder of the current fence may complete, fail or renew the record.
ALTER TABLE idem_record ADD COLUMN fence INTEGER NOT NULL DEFAULT 0;
