//! A record's status, and the counts per business type, route and status that
//! [`Store::stats`] returns.

#[cfg(doc)]
use super::{Record, Store};
use crate::IdemError;

/// The state of a dedup record. Ordered as a record's life goes: PROCESSING, SUCCEEDED, FAILED.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Status {
    /// A call holds the claim; its lease protects it until `lease_until`.
    Processing,
    /// The call finished; its result snapshot is stored and replayed to repeats.
    Succeeded,
    /// The call returned an error; the next call with this key runs again.
    Failed,
}

impl Status {
    /// The stored name: `PROCESSING`, `SUCCEEDED`, `FAILED`.
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Processing => "PROCESSING",
            Status::Succeeded => "SUCCEEDED",
            Status::Failed => "FAILED",
        }
    }

    /// Parses a stored name.
    ///
    /// # Errors
    /// [`IdemError::Store`] for a name idem never writes.
    pub fn parse(s: &str) -> Result<Self, IdemError> {
        match s {
            "PROCESSING" => Ok(Status::Processing),
            "SUCCEEDED" => Ok(Status::Succeeded),
            "FAILED" => Ok(Status::Failed),
            other => Err(IdemError::store(format!(
                "unknown record status `{other}` in the store"
            ))),
        }
    }
}

/// How many records of one business type are in one status: a row of [`Store::stats`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StatusCount {
    /// Business type.
    pub biz: String,
    /// For HTTP layer records, the method and route they came from (`POST /orders/{id}`, see
    /// [`Record::origin`]): such a business type's records are counted per route. `None` for every
    /// other record.
    pub origin: Option<String>,
    /// Status.
    pub status: Status,
    /// How many records of `biz` are in `status`, expired but not yet swept ones included.
    pub records: u64,
    /// Of those, the SUCCEEDED ones whose result is no longer kept (their result ttl passed):
    /// tombstones, which refuse repeats as [`IdemError::ResultExpired`] until they expire.
    pub tombstones: u64,
}

impl StatusCount {
    /// One row of an SQL store's `GROUP BY biz_type, origin, status`: the status as stored, the
    /// count as the database gives it.
    #[cfg(any(feature = "sqlite", feature = "mysql", feature = "postgres"))]
    pub(crate) fn of_row(
        biz: String,
        origin: Option<String>,
        status: &str,
        records: i64,
        tombstones: i64,
    ) -> Result<Self, IdemError> {
        Ok(StatusCount {
            biz,
            origin: origin.filter(|o| !o.is_empty()),
            status: Status::parse(status)?,
            records: u64::try_from(records).unwrap_or(0),
            tombstones: u64::try_from(tombstones).unwrap_or(0),
        })
    }

    /// Sums `counts` per `(biz, origin, status)`, sorted by business type, origin (none first),
    /// then status (what every [`Store::stats`] returns): a store whose counts come in pieces
    /// (SCAN batches, shards) adds them up here.
    pub fn tally(counts: impl IntoIterator<Item = StatusCount>) -> Vec<StatusCount> {
        type Group = (String, Option<String>, Status);
        let mut sums: std::collections::BTreeMap<Group, (u64, u64)> = Default::default();
        for c in counts {
            let sum = sums.entry((c.biz, c.origin, c.status)).or_default();
            sum.0 += c.records;
            sum.1 += c.tombstones;
        }
        sums.into_iter()
            .filter(|(_, (records, _))| *records > 0)
            .map(
                |((biz, origin, status), (records, tombstones))| StatusCount {
                    biz,
                    origin,
                    status,
                    records,
                    tombstones,
                },
            )
            .collect()
    }
}
