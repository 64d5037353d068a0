//! The commands on records: `inspect` one, list the `stuck` ones, `release` one; and how KEY
//! names a record an HTTP or gRPC layer wrote.

use std::fmt::Write as _;
use std::time::Duration;

use idem::admin::{self, Release, Released};
use idem::{
    AnyStore, IdemError, Store,
    store::{Record, Status},
};

use crate::Exit;
use crate::table::table;
use crate::time::{human, relative, rfc3339, wall_ms};

/// How KEY names an HTTP layer record: the layer stores a hash of the caller and the client's
/// `Idempotency-Key`, never the key itself.
#[derive(Debug, clap::Args)]
pub(crate) struct LayerKey {
    /// KEY is the Idempotency-Key this caller (the layer's principal, e.g. a user id) sent to the
    /// HTTP (or gRPC) layer: the record is found under the layer's hash of both
    #[arg(long)]
    principal: Option<String>,
    /// KEY is an Idempotency-Key sent to an HTTP (or gRPC) layer without a principal
    #[arg(long, conflicts_with = "principal")]
    http: bool,
}

impl LayerKey {
    /// The stored key KEY names: itself, or the layer's record key for it, with the line that
    /// tells which (printed once the record is read: its request says which layer wrote it).
    pub(crate) fn record_key(&self, key: &str) -> Result<(String, Option<LayerLine>), IdemError> {
        if self.principal.is_none() && !self.http {
            return Ok((key.to_owned(), None));
        }
        let record = idem::key::http_record_key(self.principal.as_deref(), key)?;
        let line = LayerLine {
            sent: key.to_owned(),
            principal: self.principal.clone(),
            record: record.clone(),
        };
        Ok((record, Some(line)))
    }
}

/// What a layer's client sent and the record key it gives, to print.
pub(crate) struct LayerLine {
    sent: String,
    principal: Option<String>,
    record: String,
}

impl LayerLine {
    /// `HTTP layer key "k" of principal "p": record <hash>`, naming the layer by the record's
    /// request when it was read, else by the business type's default name.
    fn print(&self, biz: &str, record: Option<&Record>) {
        let layer = layer_name(biz, record.and_then(Record::origin));
        let (sent, record) = (&self.sent, &self.record);
        match &self.principal {
            Some(p) => println!("{layer} key {sent:?} of principal {p:?}: record {record}"),
            None => println!("{layer} key {sent:?} (no principal): record {record}"),
        }
    }
}

/// Which layer wrote a record: its request is a gRPC method's path (`/pkg.Service/Method`) or an
/// HTTP method and route (`POST /orders/{id}`); without one, the layers' default business types
/// (`GRPC`, `HTTP`) tell it, and any other could be either's.
fn layer_name(biz: &str, origin: Option<&str>) -> &'static str {
    match origin {
        Some(o) if o.starts_with('/') => "gRPC layer",
        Some(_) => "HTTP layer",
        None if biz.eq_ignore_ascii_case("GRPC") => "gRPC layer",
        None if biz.eq_ignore_ascii_case("HTTP") => "HTTP layer",
        None => "HTTP or gRPC layer",
    }
}

pub(crate) async fn inspect(
    store: &AnyStore,
    biz: &str,
    key: &str,
    layer: Option<LayerLine>,
    show_result: bool,
) -> Result<Exit, IdemError> {
    let record = admin::inspect(store, biz, key).await?;
    if let Some(layer) = &layer {
        layer.print(biz, record.as_ref());
    }
    let Some(record) = record else {
        println!("no record for biz {biz:?} key {key:?}");
        return Ok(Exit::Refused);
    };
    let now = wall_ms();
    println!("biz          {}", record.biz);
    println!("key          {}", record.key);
    println!("status       {}", record.status.as_str());
    println!("attempt      {}", record.attempt);
    println!("fence        {}", record.fence);
    match record.status {
        // Only a PROCESSING record is held; a finished one's lease end is a leftover.
        Status::Processing => println!(
            "lease until  {} ({})",
            rfc3339(record.lease_until_ms),
            relative(record.lease_until_ms, now, "ended")
        ),
        _ => println!(
            "lease        none: a {} record is held by no call",
            record.status.as_str()
        ),
    }
    println!(
        "expires at   {} ({})",
        rfc3339(record.expire_at_ms),
        relative(record.expire_at_ms, now, "expired")
    );
    if let Some(origin) = record.origin() {
        println!("request      {origin}");
    }
    match &record.fingerprint {
        Some(fp) => {
            // The digest, after the route an HTTP layer record keeps before it.
            let digest = fp.rsplit(' ').next().unwrap_or(fp);
            println!(
                "fingerprint  present ({})",
                digest.get(..12).unwrap_or(digest)
            );
        }
        None => println!("fingerprint  absent"),
    }
    println!("result       {}", size(record.snapshot.as_deref()));
    match record.result_until_ms {
        None => {}
        Some(0) => println!(
            "result kept  no: dropped; a tombstone (repeats refused as result expired) until it expires"
        ),
        Some(until) if until <= now => println!(
            "result kept  until {} (passed: a tombstone, repeats refused as result expired)",
            rfc3339(until)
        ),
        Some(until) => println!(
            "result kept  until {} ({})",
            rfc3339(until),
            relative(until, now, "passed")
        ),
    }
    println!("steps        {}", size(record.steps.as_deref()));
    println!("(relative times by this machine's clock)");
    if show_result {
        match &record.snapshot {
            Some(bytes) => match std::str::from_utf8(bytes) {
                Ok(text) => println!("{text}"),
                Err(_) => println!("{}", hex(bytes)),
            },
            None if record.result_until_ms.is_some() => {
                println!("(no result: it was dropped when its result ttl passed)")
            }
            None => println!("(no result: the record is {})", record.status.as_str()),
        }
    }
    Ok(Exit::Ok)
}

pub(crate) async fn stuck(
    store: &AnyStore,
    biz: Option<&str>,
    limit: u64,
) -> Result<Exit, IdemError> {
    let limit = usize::try_from(limit).unwrap_or(usize::MAX);
    let records = match biz {
        Some(biz) => store.stuck(biz, limit).await?,
        None => admin::stuck_all(store, limit).await?,
    };
    if records.is_empty() {
        println!("no stuck records (PROCESSING past their lease)");
        println!("{NOT_LISTED}");
        return Ok(Exit::Ok);
    }
    let now = wall_ms();
    let rows: Vec<[String; 6]> = records
        .iter()
        .map(|r| {
            [
                r.biz.clone(),
                r.key.clone(),
                r.attempt.to_string(),
                r.fence.to_string(),
                format!(
                    "{} ({})",
                    rfc3339(r.lease_until_ms),
                    relative(r.lease_until_ms, now, "ended")
                ),
                r.origin().unwrap_or("-").to_owned(),
            ]
        })
        .collect();
    print!(
        "{}",
        table(
            &["BIZ", "KEY", "ATTEMPT", "FENCE", "LEASE ENDED", "REQUEST"],
            &rows,
            &[false, false, true, true, false, false]
        )
    );
    println!(
        "{} stuck record{} (PROCESSING past their lease{})",
        records.len(),
        if records.len() == 1 { "" } else { "s" },
        if records.len() == limit {
            "; --limit reached, there may be more"
        } else {
            ""
        }
    );
    println!("{NOT_LISTED}");
    Ok(Exit::Ok)
}

/// What `idem stuck` does not list, and where to see it.
const NOT_LISTED: &str = "not listed: records PROCESSING under a lease still running (a crashed \
holder's record shows here once its lease ends); `idem stats` counts them, `idem inspect BIZ KEY` \
shows one";

fn held(r: &Record) -> String {
    format!(
        "{} (attempt {}, fence {})",
        r.status.as_str(),
        r.attempt,
        r.fence
    )
}

pub(crate) async fn release(
    store: &AnyStore,
    biz: &str,
    key: &str,
    layer: Option<LayerLine>,
    opts: Release<'_>,
    mark_failed: bool,
) -> Result<Exit, IdemError> {
    // The lease is judged against this instant, so whether --force overrode a live one is known.
    let now = wall_ms();
    let done = if mark_failed {
        admin::mark_failed_at(store, biz, key, opts, now).await?
    } else {
        admin::release_at(store, biz, key, opts, now).await?
    };
    if let Some(layer) = &layer {
        let record = match &done {
            Released::LeaseEnded { before } | Released::Failed { before } => Some(before),
            Released::AlreadyFailed { record }
            | Released::Succeeded { record }
            | Released::LeaseLive { record, .. } => Some(record),
            Released::LeaseLost { now } => now.as_ref(),
            _ => None,
        };
        layer.print(biz, record);
    }
    // How long the holder's lease still ran when --force ended it, if it did.
    let overridden = |before: &Record| {
        let left = before.lease_until_ms.saturating_sub(now);
        (left > 0).then(|| human(Duration::from_millis(left.unsigned_abs())))
    };
    let exit = if done.released() {
        Exit::Ok
    } else {
        Exit::Refused
    };
    match done {
        Released::LeaseEnded { before } => match overridden(&before) {
            None => println!(
                "released: was {}, its lease ended now; the next call with this key takes it over \
                 and asks its recover fn before running the body (the reconciler can resolve it too)",
                held(&before)
            ),
            Some(left) => println!(
                "released: was {}, its live lease OVERRIDDEN by --force ({left} left, by this \
                 machine's clock) and ended now; its holder may still be running: once the next \
                 call with this key takes it over (asking its recover fn before running the body), \
                 that holder's mark is refused by the fence",
                held(&before)
            ),
        },
        Released::Failed { before } => match overridden(&before) {
            None => println!(
                "marked FAILED: was {}; the next call with this key runs the body again WITHOUT \
                 asking recover: if its effect did happen, it happens twice",
                held(&before)
            ),
            Some(left) => println!(
                "marked FAILED: was {}, its live lease OVERRIDDEN by --force ({left} left, by this \
                 machine's clock); its holder may still be running: its mark will be refused by \
                 the fence; the next call with this key runs the body again WITHOUT asking \
                 recover: if its effect did happen, it happens twice",
                held(&before)
            ),
        },
        Released::AlreadyFailed { record } => println!(
            "already released: the record is {}; the next call runs again; nothing changed",
            held(&record)
        ),
        Released::NotFound => println!("not found: no record for biz {biz:?} key {key:?}"),
        Released::Succeeded { record } => println!(
            "refused: the record {}; a success is never released (repeats replay it)",
            held(&record)
        ),
        Released::LeaseLive { record, remaining } => println!(
            "refused: the record is {} and its lease runs {} more, by this machine's clock; its \
             holder may still be running (--force releases it anyway)",
            held(&record),
            human(remaining)
        ),
        Released::LeaseLost { now } => match now {
            Some(now) => println!(
                "lost the race: another attempt took the record over; nothing changed; it is {} now",
                held(&now)
            ),
            None => println!("lost the race: the record is gone; nothing changed"),
        },
        other => println!("nothing changed: {other:?}"),
    }
    Ok(exit)
}

fn size(bytes: Option<&[u8]>) -> String {
    match bytes {
        Some(b) => format!("{} bytes", b.len()),
        None => "absent".to_owned(),
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().fold(String::new(), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    })
}
