//! `idem reshard`: moves a sharded store's keys to another list of shards while it serves.

use std::time::Duration;

use idem::sharding::{Layout, Reshard};
use idem::{AnyStore, IdemError, ShardedStore, Store as _};

use crate::Exit;

/// `--settle`: a duration as `--store-timeout` reads it, within the reshard's range.
pub(crate) fn settle(text: &str) -> Result<Duration, String> {
    let d = crate::time::store_timeout(text)?;
    let (min, max) = (
        Reshard::<AnyStore>::MIN_SETTLE,
        Reshard::<AnyStore>::MAX_SETTLE,
    );
    if !(min..=max).contains(&d) {
        return Err(format!(
            "`{text}` is outside {}s ..= {}s: a process reads its layout at least every {}s",
            min.as_secs(),
            max.as_secs(),
            idem::sharding::STALE_AFTER.as_secs()
        ));
    }
    Ok(d)
}

/// What `idem reshard` was asked.
pub(crate) struct Asked {
    pub(crate) to: Option<String>,
    pub(crate) batch: u64,
    pub(crate) settle: Duration,
    pub(crate) plan_only: bool,
    pub(crate) status: bool,
}

/// The shards of a `sharded:` store, as a sharded store of their own.
fn sharded(store: &AnyStore, flag: &str) -> Result<ShardedStore<AnyStore>, IdemError> {
    match store.shards() {
        Some(shards) => ShardedStore::new(shards.iter().cloned()),
        None => Err(IdemError::InvalidOptions {
            reason: format!(
                "{flag} is a {} store, not a sharded one: give a `sharded:URL|URL|…` URL",
                store.backend()
            ),
        }),
    }
}

fn show(l: &Layout) -> String {
    format!(
        "step {}, {}: from [{}] to [{}]",
        l.step,
        l.phase.as_str(),
        l.from.join(", "),
        l.to.join(", ")
    )
}

pub(crate) async fn reshard(store: &AnyStore, asked: Asked) -> Result<Exit, IdemError> {
    let from = sharded(store, "--url")?;
    if asked.status {
        let tool = Reshard::new(&from, &from);
        match tool.status().await? {
            Some(l) => println!("layout {}", show(&l)),
            None => {
                println!("no layout written: keys route over the shards of the URL in their order")
            }
        }
        return Ok(Exit::Ok);
    }
    let Some(to_url) = asked.to else {
        return Err(IdemError::InvalidOptions {
            reason: "the new list is missing: `idem reshard TO_URL` (or --status)".into(),
        });
    };
    let to_store = idem::connect(&to_url).await?;
    let to = sharded(&to_store, "TO_URL")?;
    let mut tool = Reshard::new(&from, &to)
        .batch(usize::try_from(asked.batch).unwrap_or(usize::MAX))?
        .settle(asked.settle)?;
    if asked.plan_only {
        tool = tool.plan_only();
    }
    let bar = crate::spinner();
    let done = tool
        .run(|p| {
            bar.set_message(format!(
                "{} · walked {} · copied {} · waiting {}",
                p.doing, p.walked, p.copied, p.waiting
            ));
        })
        .await;
    bar.finish_and_clear();
    let done = done?;
    println!(
        "step {} ({}): walked {} records of moving keys, copied {}, {} conflicts",
        done.step,
        done.phase.map_or("none", |p| p.as_str()),
        done.walked,
        done.copied,
        done.conflicts
    );
    println!("{}", done.doing);
    Ok(Exit::Ok)
}
