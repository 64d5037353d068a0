-- idem dedup records (PostgreSQL): what the reconciler reads (`Store::stuck`), the PROCESSING
-- records of one business type whose lease has ended, oldest lease first, as a range of this
-- index. Superseded by 0004, which drops it for an index over the PROCESSING records only:
-- PgStore::migrate() no longer applies this. On a large table in use, build it with
-- CREATE INDEX CONCURRENTLY first (this statement then finds it): a plain build blocks writes to
-- the table while it runs.
CREATE INDEX IF NOT EXISTS idem_record_stuck ON idem_record (biz_type, status, lease_until);
