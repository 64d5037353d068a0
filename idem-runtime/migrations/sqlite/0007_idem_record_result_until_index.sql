-- idem dedup records (SQLite), version 7: the results a sweep still has to drop (version 6), and
-- only those (a NULL or 0 is not in it), so the sweep reads what it changes and every other record
-- costs no index entry. SqliteStore::migrate() applies this with the configured table name in
-- place of idem_record (and <table>_result_until for the index).
CREATE INDEX IF NOT EXISTS idem_record_result_until ON idem_record (result_until)
    WHERE result_until > 0;
