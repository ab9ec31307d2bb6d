//! Bytes on the wire per round between the router and its verifier and drafter, counted by
//! loopback proxies: real HTTP/2 traffic (gRPC framing included), not an estimate.

use std::sync::Arc;

use anyhow::Result;
use serde_json::{json, Value};
use specd_router::DraftSource;

use super::servers::{self, LinkBytes};
use super::split;

/// Per-round and setup bytes of one context length.
pub struct WireRow {
    pub context: usize,
    /// (link, to server, to client) per round, from two generations of different length.
    pub per_round: Vec<(&'static str, f64, f64)>,
    /// (link, to server, to client) of the shorter generation with its rounds taken out:
    /// prefill, snapshot, open, release and close.
    pub setup: Vec<(&'static str, f64, f64)>,
}

impl WireRow {
    pub fn json(&self) -> Value {
        let links = |rows: &[(&str, f64, f64)]| -> Value {
            rows.iter()
                .map(|(link, up, down)| json!({"link": link, "to_server": up, "to_client": down}))
                .collect()
        };
        json!({
            "context_tokens": self.context,
            "per_round_bytes": links(&self.per_round),
            "setup_bytes": links(&self.setup),
        })
    }
}

type Links = Vec<(&'static str, Arc<LinkBytes>)>;

async fn proxied_router(
    verifier_url: &str,
    source: &DraftSource,
    eos: &[u32],
    block_size: usize,
) -> Result<(String, Links)> {
    let (verifier_proxy, verifier_bytes) = servers::counting_proxy(verifier_url).await?;
    let mut links: Links = vec![("router<->verifier", verifier_bytes)];
    let source = match source {
        DraftSource::Remote(urls) => DraftSource::Remote(proxied(urls, &mut links).await?),
        DraftSource::Hybrid { urls, dns, lookup } => DraftSource::Hybrid {
            urls: proxied(urls, &mut links).await?,
            dns: dns.clone(),
            lookup: *lookup,
        },
        other => other.clone(),
    };
    let router = servers::router(&verifier_proxy, &source, eos.to_vec(), block_size).await?;
    Ok((router, links))
}

/// A counting proxy in front of each drafter at `urls`; their URLs, in order.
async fn proxied(urls: &[String], links: &mut Links) -> Result<Vec<String>> {
    let mut proxied = Vec::new();
    for url in urls {
        let (proxy, bytes) = servers::counting_proxy(url).await?;
        links.push(("router<->drafter", bytes));
        proxied.push(proxy);
    }
    Ok(proxied)
}

fn read(links: &Links) -> Vec<(u64, u64)> {
    links.iter().map(|(_, bytes)| bytes.read()).collect()
}

/// Bytes of each link for a generation of `max_tokens`, and its rounds.
async fn one(
    router: &str,
    links: &Links,
    ids: &[u32],
    max_tokens: usize,
    block: usize,
) -> Result<(Vec<(u64, u64)>, u64)> {
    let before = read(links);
    let run = split::generate(router, ids, max_tokens, split::SplitBlock::Fixed(block)).await?;
    // Let the background release and close land in the counters.
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    let after = read(links);
    let bytes = before
        .iter()
        .zip(&after)
        .map(|(b, a)| (a.0 - b.0, a.1 - b.1))
        .collect();
    Ok((bytes, run.sample.rounds))
}

pub async fn measure(
    verifier_url: &str,
    source: &DraftSource,
    eos: &[u32],
    prompt: &[u32],
    long_context: usize,
    max_tokens: usize,
    block_size: usize,
) -> Result<Vec<WireRow>> {
    let (router, links) = proxied_router(verifier_url, source, eos, block_size).await?;
    let mut rows = Vec::new();
    for ids in [
        prompt.to_vec(),
        super::prompts::lengthen(prompt, long_context),
    ] {
        // Warm the connections so their handshakes are not counted.
        one(&router, &links, &ids, 2, block_size).await?;
        let short_run = (max_tokens / 2).max(2);
        let (b1, r1) = one(&router, &links, &ids, short_run, block_size).await?;
        let (b2, r2) = one(&router, &links, &ids, max_tokens, block_size).await?;
        let rounds = r2.saturating_sub(r1).max(1) as f64;
        let mut per_round = Vec::new();
        let mut setup = Vec::new();
        for (i, (link, _)) in links.iter().enumerate() {
            let up = (b2[i].0 as f64 - b1[i].0 as f64) / rounds;
            let down = (b2[i].1 as f64 - b1[i].1 as f64) / rounds;
            per_round.push((*link, up, down));
            setup.push((
                *link,
                b1[i].0 as f64 - up * r1 as f64,
                b1[i].1 as f64 - down * r1 as f64,
            ));
        }
        rows.push(WireRow {
            context: ids.len(),
            per_round,
            setup,
        });
    }
    Ok(rows)
}

pub fn table(rows: &[WireRow]) -> String {
    let mut out = String::from(
        "bytes on the wire (loopback proxies; HTTP/2 + gRPC framing included)\n\
         context  link                per-round up/down     setup up/down\n",
    );
    for row in rows {
        for ((link, up, down), (_, s_up, s_down)) in row.per_round.iter().zip(&row.setup) {
            out.push_str(&format!(
                "{:>7}  {:<18} {:>9.0}/{:<9.0} {:>9.0}/{:<9.0}\n",
                row.context, link, up, down, s_up, s_down
            ));
        }
    }
    out
}
