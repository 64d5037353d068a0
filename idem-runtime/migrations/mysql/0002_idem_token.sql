-- idem one-time submit tokens (MySQL 8 / MariaDB >= 10.5). A spent token stays (spent = 1) until it
-- expires, so a second submit is told "used" rather than "unknown". Times are milliseconds since the
-- Unix epoch, by the database's clock. The subject compares byte for byte (VARBINARY: no padding). `MySqlStore::migrate()` applies this with the store's token
-- table name in place of `idem_token`.
CREATE TABLE IF NOT EXISTS `idem_token` (
    token     VARCHAR(64)  CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    subject   VARBINARY(255) NOT NULL,
    spent     TINYINT NOT NULL,
    expire_at BIGINT NOT NULL,
    PRIMARY KEY (token),
    KEY `idem_token_expire_at` (expire_at)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
