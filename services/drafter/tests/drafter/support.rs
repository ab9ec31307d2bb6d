//! A drafter server on an ephemeral port, and K/V tensors shaped like a small target's.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use candle_core::{DType, Device, Tensor};
use specd_drafter::{serve, DraftEngine, DrafterServerConfig, DrafterService};

use crate::random_engine::RandomDrafts;
use specd_wire::drafter::{
    draft_request, open_request, DraftRequest, DrafterClient, DrafterKind, DrafterStatsRequest,
    MtpCarry, OpenHeader, OpenRequest,
};
use specd_wire::kv::{snapshot_chunks, KvDeltaTensors, KvPair, KvSnapshot};
use specd_wire::tensor::encode;
use specd_wire::{KvDelta, Sampling, WireTensor};
use tokio::sync::oneshot;
use tonic::transport::server::TcpIncoming;
use tonic::transport::Channel;
use tonic::Status;

pub const VOCAB: usize = 256;
pub const MAX_DRAFTS: usize = 7;

pub struct TestDrafter {
    pub addr: SocketAddr,
    _stop: oneshot::Sender<()>,
}

impl TestDrafter {
    pub async fn start(kind: DrafterKind) -> Self {
        Self::start_with(kind, DrafterServerConfig::default()).await
    }

    pub async fn start_with(kind: DrafterKind, config: DrafterServerConfig) -> Self {
        let engine = Arc::new(RandomDrafts::new(kind, VOCAB, MAX_DRAFTS, 42));
        Self::start_engine(engine, config).await
    }

    /// A server of any engine.
    pub async fn start_engine<E: DraftEngine>(engine: Arc<E>, config: DrafterServerConfig) -> Self {
        let service = DrafterService::new(engine, config).unwrap();
        let incoming = TcpIncoming::bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let addr = incoming.local_addr().unwrap();
        let (stop, stopped) = oneshot::channel::<()>();
        tokio::spawn(async move {
            serve(service, incoming, async {
                let _ = stopped.await;
            })
            .await
            .unwrap();
        });
        Self { addr, _stop: stop }
    }

    pub async fn channel(&self) -> Channel {
        Channel::from_shared(format!("http://{}", self.addr))
            .unwrap()
            .connect()
            .await
            .unwrap()
    }

    pub async fn client(&self) -> DrafterClient<Channel> {
        DrafterClient::new(self.channel().await)
    }
}

pub fn sampling() -> Option<Sampling> {
    Some(Sampling {
        temperature: 0.8,
        top_p: 1.0,
        top_k: 0,
        seed: 3,
    })
}

/// `[1, heads, rows, dim]` values that encode their absolute position, so a misplaced row
/// is visible.
pub fn rows(heads: usize, from: usize, to: usize, dim: usize, salt: f32) -> Tensor {
    let mut values = Vec::new();
    for h in 0..heads {
        for p in from..to {
            for d in 0..dim {
                values.push(salt + h as f32 * 1000.0 + p as f32 + d as f32 * 0.001);
            }
        }
    }
    Tensor::from_vec(values, (1, heads, to - from, dim), &Device::Cpu).unwrap()
}

fn pair(heads: usize, from: usize, to: usize, dim: usize) -> KvPair {
    KvPair {
        k: rows(heads, from, to, dim, 0.0),
        v: rows(heads, from, to, dim, 0.5),
    }
}

/// A snapshot of `len` positions with a sliding window starting at `sliding_start`.
pub fn snapshot(len: usize, sliding_start: usize) -> KvSnapshot {
    KvSnapshot {
        committed_len: len as u32,
        sliding_start: sliding_start as u32,
        full: pair(1, 0, len, 8),
        sliding: Some(pair(2, sliding_start, len, 4)),
    }
}

/// The rows of positions `from..to`, evicting `evicted` sliding rows.
pub fn delta(from: usize, to: usize, evicted: u32) -> KvDelta {
    KvDeltaTensors {
        start_position: from as u32,
        full: pair(1, from, to, 8),
        sliding: Some(pair(2, from, to, 4)),
        sliding_evicted: evicted,
    }
    .encode("delta")
    .unwrap()
}

pub fn hidden() -> WireTensor {
    encode(
        &Tensor::ones((1, 1, 64), DType::F32, &Device::Cpu).unwrap(),
        "hidden",
    )
    .unwrap()
}

pub fn open_messages(header: OpenHeader, snapshot: Option<&KvSnapshot>) -> Vec<OpenRequest> {
    let mut messages = vec![OpenRequest {
        body: Some(open_request::Body::Header(header)),
    }];
    if let Some(snapshot) = snapshot {
        for chunk in snapshot_chunks(snapshot, 64).unwrap() {
            messages.push(OpenRequest {
                body: Some(open_request::Body::Snapshot(chunk)),
            });
        }
    }
    messages
}

pub async fn open_mtp(client: &mut DrafterClient<Channel>, len: usize) -> Result<String, Status> {
    let snapshot = snapshot(len, len.saturating_sub(5));
    let header = OpenHeader {
        sampling: sampling(),
        committed_len: len as u32,
        context_ids: Vec::new(),
        cache_scope: String::new(),
    };
    let messages = open_messages(header, Some(&snapshot));
    Ok(client
        .open(tokio_stream::iter(messages))
        .await?
        .into_inner()
        .session_id)
}

pub fn mtp_draft(
    session_id: &str,
    round: u64,
    position: usize,
    count: u32,
    delta: Option<KvDelta>,
) -> DraftRequest {
    DraftRequest {
        session_id: session_id.to_owned(),
        round,
        bonus: 7,
        position: position as u32,
        count,
        output_index_base: round as u32 * 10,
        carry: Some(draft_request::Carry::Mtp(MtpCarry {
            hidden: Some(hidden()),
            delta,
            later_deltas: Vec::new(),
        })),
        predraft: false,
        predraft_branches: 0,
        tree_nodes: 0,
        least_branch_chance: None,
    }
}

pub async fn draft(
    client: &mut DrafterClient<Channel>,
    request: DraftRequest,
) -> Result<Vec<u32>, Status> {
    Ok(client.draft(request).await?.into_inner().drafts)
}

pub async fn live_sessions(client: &mut DrafterClient<Channel>) -> u32 {
    client
        .stats(DrafterStatsRequest {})
        .await
        .unwrap()
        .into_inner()
        .live_sessions
}

pub async fn drained(client: &mut DrafterClient<Channel>) -> bool {
    for _ in 0..200 {
        if live_sessions(client).await == 0 {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    false
}
