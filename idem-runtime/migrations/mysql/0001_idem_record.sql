-- idem dedup records (MySQL 8 / MariaDB >= 10.5). Times are milliseconds since the Unix epoch, by the
-- database's clock. Keys compare byte for byte (VARBINARY, the bytes of their UTF-8): `ORD-1`, `ord-1`
-- and `ORD-1 ` are three records (a `utf8mb4_bin` VARCHAR would still pad: `ORD-1 ` = `ORD-1`).
-- `result` is a MEDIUMBLOB (16 MiB) since a BLOB holds 65,535 bytes, one less than the default
-- 64 KiB snapshot limit. `fence` never repeats for a key (the clock in microseconds, or one more than
-- the last fence). `MySqlStore::migrate()` applies this with the store's table name in place of
-- `idem_record`.
CREATE TABLE IF NOT EXISTS `idem_record` (
    biz_type    VARBINARY(64)  NOT NULL,
    idem_key    VARBINARY(255) NOT NULL,
    status      VARCHAR(10)  CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    attempt     INT UNSIGNED NOT NULL,
    fence       BIGINT UNSIGNED NOT NULL,
    fingerprint VARCHAR(128) CHARACTER SET ascii COLLATE ascii_bin NULL,
    result      MEDIUMBLOB NULL,
    lease_until BIGINT NOT NULL,
    created_at  BIGINT NOT NULL,
    updated_at  BIGINT NOT NULL,
    expire_at   BIGINT NOT NULL,
    PRIMARY KEY (biz_type, idem_key),
    KEY `idem_record_expire_at` (expire_at)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
