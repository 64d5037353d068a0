//! The pay-callback scenario (a gateway's callback storm) on MySQL / MariaDB (`IDEM_MYSQL_URL`), in a
//! database of its own: no order moves backwards or leaves a terminal state, one coupon per paid
//! order, the ledger balances.

// The SQLite backend of the scenario is not used here.
#[allow(dead_code)]
use crate::scenario;

use std::sync::Arc;
use std::time::Duration;

use crate::contract::server;
use idem::sqlx::{self, AssertSqlSafe};
use idem::{MySqlStore, MySqlTx};
use scenario::{Backend, PayStatus, ScenarioError, Tables};

struct MySql(MySqlStore);

impl Backend for MySql {
    type Tx = MySqlTx;

    async fn begin(&self) -> Result<MySqlTx, ScenarioError> {
        Ok(self.0.begin().await?)
    }

    async fn commit(tx: MySqlTx) -> Result<(), ScenarioError> {
        Ok(tx.commit().await?)
    }

    async fn setup(&self, orders: &[String]) -> Result<(), ScenarioError> {
        let pool = self.0.pool();
        for ddl in [
            "CREATE TABLE pay_orders (order_no VARCHAR(32) PRIMARY KEY, status VARCHAR(16) NOT NULL, \
             trade_no VARCHAR(64), refund_no VARCHAR(64), paid_at DATETIME) ENGINE = InnoDB",
            // No unique index on coupons or the ledger: only the transitions keep them single.
            "CREATE TABLE coupons (id BIGINT AUTO_INCREMENT PRIMARY KEY, order_no VARCHAR(32) NOT NULL) \
             ENGINE = InnoDB",
            "CREATE TABLE ledger (id BIGINT AUTO_INCREMENT PRIMARY KEY, order_no VARCHAR(32) NOT NULL, \
             kind VARCHAR(16) NOT NULL, amount BIGINT NOT NULL) ENGINE = InnoDB",
            "CREATE TABLE history (seq BIGINT AUTO_INCREMENT PRIMARY KEY, order_no VARCHAR(32) NOT NULL, \
             status VARCHAR(16) NOT NULL) ENGINE = InnoDB",
        ] {
            sqlx::query(ddl).execute(pool).await?;
        }
        for order in orders {
            sqlx::query("INSERT INTO pay_orders (order_no, status) VALUES (?, ?)")
                .bind(order)
                .bind(PayStatus::WaitPay)
                .execute(pool)
                .await?;
        }
        Ok(())
    }

    async fn read_back(&self) -> Result<Tables, ScenarioError> {
        let pool = self.0.pool();
        Ok(Tables {
            states: sqlx::query_as("SELECT order_no, status FROM pay_orders")
                .fetch_all(pool)
                .await?,
            coupons: sqlx::query_as("SELECT order_no, COUNT(*) FROM coupons GROUP BY order_no")
                .fetch_all(pool)
                .await?,
            ledger_sum: sqlx::query_scalar(
                "SELECT CAST(COALESCE(SUM(amount), 0) AS SIGNED) FROM ledger",
            )
            .fetch_one(pool)
            .await?,
            history: sqlx::query_as("SELECT order_no, status FROM history ORDER BY seq")
                .fetch_all(pool)
                .await?,
        })
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_retry_storm_changes_nothing_it_should_not_on_mysql() {
    let url = server::mysql_url();
    let Some(admin) = server::reach(
        "MySQL",
        &url,
        MySqlStore::connect_with(&url, 2, Duration::from_secs(2)),
    )
    .await
    else {
        return;
    };
    let db = server::unique("idem_pay_callback");
    sqlx::raw_sql(AssertSqlSafe(format!("CREATE DATABASE `{db}`")))
        .execute(admin.pool())
        .await
        .unwrap();
    let (base, _) = url.rsplit_once('/').unwrap();
    let store = MySqlStore::connect_with(&format!("{base}/{db}"), 64, Duration::from_secs(5))
        .await
        .unwrap();
    let report = scenario::run(Arc::new(MySql(store))).await.unwrap();
    report.check().unwrap();
    assert_eq!(report.deliveries, 47);
    assert_eq!(report.outcomes.get("applied"), Some(&21), "{report:?}");
    assert_eq!(
        report.outcomes.get("already_applied"),
        Some(&15),
        "{report:?}"
    );
    assert_eq!(report.outcomes.get("rejected"), Some(&11), "{report:?}");
    let late_paid = report
        .rejected
        .iter()
        .filter(|(_, kind, current)| *kind == "PAID callback" && *current == PayStatus::Refunded)
        .count();
    let bogus_refunds = report
        .rejected
        .iter()
        .filter(|(_, kind, current)| *kind == "REFUNDED callback" && *current == PayStatus::Paid)
        .count();
    assert_eq!((late_paid, bogus_refunds), (5, 6));
    let count = |state| report.states.values().filter(|s| **s == state).count();
    assert_eq!(count(PayStatus::Refunded), 5);
    assert_eq!(
        count(PayStatus::Paid),
        11,
        "no paid order was refunded by a retried callback"
    );
    assert_eq!(count(PayStatus::WaitPay), 4);
    assert_eq!(report.coupons.values().sum::<i64>(), 16);
    assert_eq!(report.ledger_sum, 11 * scenario::AMOUNT);
}
