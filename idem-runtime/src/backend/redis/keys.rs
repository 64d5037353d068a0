//! [`Store::list_keys`](crate::Store::list_keys) on Redis: a SCAN of the store's record keys
//! (`<prefix>{*`), each read back as the `(biz, key)` it names (`stuck.rs`'s `biz_of` and
//! `key_of`; any other key is passed over), on the server or on each primary of a cluster in turn.
//! The cursor says where the walk stands, so it resumes in any process: the nodes left to walk
//! (on a cluster, the primaries `CLUSTER NODES` listed when the walk began, sorted by address, each
//! reached by its address), SCAN's cursor on the first of them and the run id of the server
//! process it belongs to, and the keys of the last reply that did not fit in the page.

use std::collections::{HashSet, VecDeque};

use super::conn::Node;
use super::stuck::{biz_of, key_of};
use super::{Conn, Records, redis_error};
use crate::IdemError;
use crate::store::KeyPage;
use crate::store::keys::{check_batch, not_a_cursor, push_field, take_field};

/// How many SCAN replies one page asks for at most: a page among many keys of other prefixes may
/// end with fewer keys than its batch (even none), and the next page goes on from there.
const STEPS_PER_PAGE: usize = 100;

/// Where a walk stands. Its cursor writes, as fields ([`push_field`]): `run`, `scan`, the number
/// of nodes in `plan` and each of them (empty for the one server, `host:port` on a cluster), then
/// `biz` and `key` of each key in `pending`.
struct Place {
    /// The nodes left to walk, the one being walked first; empty once every node was walked.
    plan: Vec<Option<Node>>,
    /// The run id of the first node's server process when its SCAN began (`INFO server`'s
    /// `run_id`, drawn anew each time a server starts): a SCAN cursor means nothing to another
    /// run. Empty before its SCAN begins, or when the server gives none.
    run: String,
    /// SCAN's cursor on the first node (0: not begun).
    scan: u64,
    /// Keys of the last reply that did not fit in the page.
    pending: VecDeque<(String, String)>,
}

impl Place {
    /// The cursor that names this place.
    fn write(&self) -> String {
        let mut out = String::new();
        push_field(&mut out, &self.run);
        push_field(&mut out, itoa::Buffer::new().format(self.scan));
        push_field(&mut out, itoa::Buffer::new().format(self.plan.len()));
        for node in &self.plan {
            push_field(&mut out, &node.as_ref().map(address).unwrap_or_default());
        }
        for (biz, key) in &self.pending {
            push_field(&mut out, biz);
            push_field(&mut out, key);
        }
        out
    }

    /// The place `text` names, for a store on a cluster or on one server; `None` when it is not
    /// a cursor such a store writes.
    fn read(text: &str, cluster: bool) -> Option<Place> {
        let mut rest = text;
        let run = take_field(&mut rest)?.to_owned();
        let scan = number(take_field(&mut rest)?)?;
        let nodes = number(take_field(&mut rest)?)?;
        if !cluster && nodes > 1 {
            return None;
        }
        let mut plan = Vec::new();
        for _ in 0..nodes {
            plan.push(match (take_field(&mut rest)?, cluster) {
                ("", false) => None,
                (addr, true) => Some(node(addr)?),
                _ => return None,
            });
        }
        let mut pending = VecDeque::new();
        while !rest.is_empty() {
            let biz = take_field(&mut rest)?;
            let key = take_field(&mut rest)?;
            pending.push_back((biz.to_owned(), key.to_owned()));
        }
        Some(Place {
            plan,
            run,
            scan,
            pending,
        })
    }
}

/// A node's address as a cursor writes it: `host:port`.
fn address((host, port): &Node) -> String {
    format!("{host}:{port}")
}

/// The node `host:port` names, written as [`address`] writes it.
fn node(addr: &str) -> Option<Node> {
    let (host, digits) = addr.rsplit_once(':')?;
    let port = u16::try_from(number(digits)?).ok()?;
    if host.is_empty() {
        return None;
    }
    Some((host.to_owned(), port))
}

/// A number written in decimal as `itoa` writes it (no sign, no leading zero).
fn number(digits: &str) -> Option<u64> {
    let n: u64 = digits.parse().ok()?;
    (itoa::Buffer::new().format(n) == digits).then_some(n)
}

/// For messages: `node`'s address, or the server's.
fn named(node: Option<&Node>) -> String {
    node.map_or_else(
        || "the Redis server".to_owned(),
        |n| format!("the Redis node at {}", address(n)),
    )
}

impl Records {
    /// A page of the walk of this prefix's record keys. SCAN replies are asked for as many keys as
    /// the page has room for (`COUNT`); a reply may hold more, and those wait in the cursor. A key
    /// SCAN returns twice (it may, while Redis resizes its table) is listed once per page.
    ///
    /// A walk that cannot keep its promise fails instead of missing records, and must start
    /// again: a node whose server restarted since its SCAN began (its run id changed: a SCAN
    /// cursor means nothing to a new process), and, on a cluster, a node of the walk that is no
    /// longer a primary when its turn comes (a failover: its slots may now be on a primary walked
    /// already, or on none the walk knows). A slot moved between primaries during the walk (a
    /// resharding of the cluster itself) may have its records missed.
    pub(super) async fn list_keys(
        &self,
        after: Option<&str>,
        batch: usize,
    ) -> Result<KeyPage, IdemError> {
        check_batch(batch)?;
        let cluster = matches!(self.conn, Conn::Cluster(_));
        let read = match after {
            None => None,
            Some(text) => Some(Place::read(text, cluster).ok_or_else(|| not_a_cursor(text))?),
        };
        let primaries = self.conn.scan_nodes().await.map_err(redis_error)?;
        let mut place = read.unwrap_or_else(|| Place {
            plan: primaries.clone(),
            run: String::new(),
            scan: 0,
            pending: VecDeque::new(),
        });
        let pattern = format!("{}{{*", self.prefix);
        let mut keys = Vec::with_capacity(batch);
        let mut listed = HashSet::with_capacity(batch);
        let (mut steps, mut scanned) = (0, false);
        loop {
            while keys.len() < batch
                && let Some(pair) = place.pending.pop_front()
            {
                if listed.insert(pair.clone()) {
                    keys.push(pair);
                }
            }
            let Some(node) = place.plan.first().cloned() else {
                break;
            };
            if keys.len() == batch || steps == STEPS_PER_PAGE {
                break;
            }
            if !scanned {
                if !primaries.contains(&node) {
                    return Err(IdemError::store(format!(
                        "{} is no longer a primary of the cluster (a failover during the walk of                          the keys): its slots may now be on a primary walked already, so start                          the walk again",
                        named(node.as_ref())
                    )));
                }
                if place.scan == 0 {
                    place.run = self.run_id(node.as_ref()).await?;
                }
            }
            let (next, found) = self
                .conn
                .scan_step(node.as_ref(), place.scan, &pattern, batch - keys.len())
                .await
                .map_err(redis_error)?;
            (steps, scanned) = (steps + 1, true);
            place.pending.extend(found.iter().filter_map(|record| {
                let biz = biz_of(&self.prefix, record)?;
                let key = key_of(&self.prefix, biz, record)?;
                Some((biz.to_owned(), key.to_owned()))
            }));
            place.scan = next;
            if next == 0 {
                self.same_run(node.as_ref(), &place.run).await?;
                place.plan.remove(0);
                (place.run, scanned) = (String::new(), false);
            }
        }
        if scanned {
            // Every SCAN of this page on the node ran in the run its walk began in.
            self.same_run(place.plan[0].as_ref(), &place.run).await?;
        }
        let done = place.plan.is_empty() && place.pending.is_empty();
        Ok(KeyPage {
            keys,
            next: (!done).then(|| place.write()),
        })
    }

    /// The run id of `node`'s server process now (empty when it gives none).
    async fn run_id(&self, node: Option<&Node>) -> Result<String, IdemError> {
        let run = self.conn.run_id(node).await.map_err(redis_error)?;
        Ok(run.unwrap_or_default())
    }

    /// Fails unless `node` still runs as `run`, the run its SCAN began in.
    async fn same_run(&self, node: Option<&Node>, run: &str) -> Result<(), IdemError> {
        if self.run_id(node).await? == run {
            return Ok(());
        }
        Err(IdemError::store(format!(
            "{} restarted during the walk of the keys (its run id changed), and a SCAN cursor              means nothing to its new process: start the walk again",
            named(node)
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::Place;

    #[test]
    fn a_place_reads_back_as_written() {
        let cluster = vec![
            Some(("127.0.0.1".to_owned(), 7001)),
            Some(("::1".to_owned(), 7002)),
        ];
        for (plan, run, scan, pending) in [
            (vec![None], "", 0, vec![]),
            (
                vec![None],
                "a1b2",
                u64::MAX,
                vec![("PAY".to_owned(), "x:}{".to_owned())],
            ),
            (
                vec![],
                "",
                0,
                vec![
                    ("支付".to_owned(), String::new()),
                    ("B".into(), "4:k".into()),
                ],
            ),
            (
                cluster.clone(),
                "c3",
                17,
                vec![("3:a".to_owned(), "}".to_owned())],
            ),
            (cluster[1..].to_vec(), "", 0, vec![]),
        ] {
            let place = Place {
                plan: plan.clone(),
                run: run.to_owned(),
                scan,
                pending: pending.clone().into(),
            };
            let text = place.write();
            let on_cluster = plan.first().is_some_and(Option::is_some);
            let read = Place::read(&text, on_cluster).expect(&text);
            assert_eq!(read.plan, plan, "{text}");
            assert_eq!(read.run, run, "{text}");
            assert_eq!(read.scan, scan, "{text}");
            assert_eq!(Vec::from(read.pending), pending, "{text}");
            if !plan.is_empty() {
                // A server's cursor is not a cluster's, nor the other way round.
                assert!(Place::read(&text, !on_cluster).is_none(), "{text}");
            }
        }
    }

    #[test]
    fn text_no_redis_store_wrote_is_no_place() {
        for bad in [
            "",
            "0:",
            "0:1:x1:0",
            "0:2:071:0",
            "0:1:01:2",
            "0:1:01:10:0:",
            "0:1:01:13:PAY",
            "0:1:01:13:PAY1:",
            "0:1:01:13:PAY",
        ] {
            assert!(Place::read(bad, false).is_none(), "{bad}");
        }
        for bad in [
            "0:1:01:10:",
            "0:1:01:14:host",
            "0:1:01:15::7001",
            "0:1:01:110:host:07001",
            "0:1:01:110:host:70000",
        ] {
            assert!(Place::read(bad, true).is_none(), "{bad}");
        }
        assert!(Place::read("0:1:01:10:", false).is_some());
        assert!(Place::read("0:1:01:114:127.0.0.1:7001", true).is_some());
        assert!(
            Place::read("0:1:01:0", true).is_some(),
            "a walk that is done"
        );
    }
}
