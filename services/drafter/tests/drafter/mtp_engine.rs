//! The MTP engine behind the service drafts exactly what the Gemma 4 assistant drafts when
//! handed the target's state directly: the snapshot, hidden and deltas survive the wire.

use std::sync::Arc;

use candle_core::{DType, Device, Tensor};
use specd_drafter::{serve, DrafterServerConfig, DrafterService, MtpEngine};
use specd_models::gemma4::{Gemma4Model, LayerKv, DEFAULT_PREFILL_CHUNK};
use specd_models::gemma4_assistant::Gemma4Assistant;
use specd_wire::drafter::{draft_request, DraftRequest, DrafterClient, MtpCarry, OpenHeader};
use specd_wire::kv::{KvDeltaTensors, KvPair, KvSnapshot};
use specd_wire::tensor::encode;
use tokio::sync::oneshot;
use tonic::transport::server::TcpIncoming;
use tonic::transport::Channel;

use crate::support::*;

fn fixture(name: &str) -> std::path::PathBuf {
    std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../crates/models/tests/fixtures/gemma4")
        .join(name)
}

fn wire_pair(layer: &LayerKv) -> KvPair {
    KvPair {
        k: layer.keys.unsqueeze(0).unwrap(),
        v: layer.values.unsqueeze(0).unwrap(),
    }
}

fn wire_hidden(hidden: &Tensor) -> specd_wire::WireTensor {
    encode(&hidden.reshape((1, 1, 64)).unwrap(), "hidden").unwrap()
}

async fn start_mtp_drafter() -> (DrafterClient<Channel>, oneshot::Sender<()>) {
    let engine = MtpEngine::load(
        &fixture("assistant-dense"),
        &fixture("target-full"),
        DType::F32,
        &Device::Cpu,
    )
    .unwrap();
    let service = DrafterService::new(Arc::new(engine), DrafterServerConfig::default()).unwrap();
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
    let channel = Channel::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    (DrafterClient::new(channel), stop)
}

fn draft_request(
    session_id: &str,
    round: u64,
    bonus: u32,
    position: usize,
    hidden: &Tensor,
    delta: Option<specd_wire::KvDelta>,
) -> DraftRequest {
    DraftRequest {
        session_id: session_id.to_owned(),
        round,
        bonus,
        position: position as u32,
        count: 4,
        output_index_base: 1,
        carry: Some(draft_request::Carry::Mtp(MtpCarry {
            hidden: Some(wire_hidden(hidden)),
            delta,
            later_deltas: Vec::new(),
        })),
        predraft: false,
        predraft_branches: 0,
        tree_nodes: 0,
    }
}

#[tokio::test]
async fn served_drafts_equal_direct_assistant_drafts() {
    let device = Device::Cpu;
    let target = Gemma4Model::load(&fixture("target-full"), DType::F32, &device).unwrap();
    let assistant = Gemma4Assistant::load(
        &fixture("assistant-dense"),
        &fixture("target-full"),
        DType::F32,
        &device,
    )
    .unwrap();
    let (mut client, _stop) = start_mtp_drafter().await;

    // Prefill a prompt long enough for the sliding window to have moved.
    let prompt: Vec<u32> = (0..30).map(|i| (i * 13 % 250) as u32 + 2).collect();
    let mut cache = target.new_cache(16);
    let hidden = target
        .prefill(&mut cache, &prompt, DEFAULT_PREFILL_CHUNK)
        .unwrap();
    let len = cache.len();
    let shared = target.shared_kv(&cache, 0, len).unwrap();
    let sliding = shared.sliding.as_ref().unwrap();
    let snapshot = KvSnapshot {
        committed_len: len as u32,
        sliding_start: sliding.start as u32,
        full: wire_pair(&shared.full),
        sliding: Some(wire_pair(sliding)),
    };
    let header = OpenHeader {
        sampling: None,
        committed_len: len as u32,
        context_ids: Vec::new(),
        cache_scope: String::new(),
    };
    let session = client
        .open(tokio_stream::iter(open_messages(header, Some(&snapshot))))
        .await
        .unwrap()
        .into_inner()
        .session_id;

    let bonus = 17;
    let mut mirror = assistant.new_mirror(&shared).unwrap();
    let direct = assistant.draft_greedy(&mirror, bonus, &hidden, 4).unwrap();
    let served = draft(
        &mut client,
        draft_request(&session, 1, bonus, len - 1, &hidden, None),
    )
    .await
    .unwrap();
    assert_eq!(served, direct);

    // One verify-like step commits the bonus; both sides take the new row.
    let block_hidden = target.forward_block(&mut cache, &[bonus]).unwrap();
    let rows = target.shared_kv(&cache, len, len + 1).unwrap();
    mirror.apply_delta(&rows).unwrap();
    let next_hidden = block_hidden.narrow(0, 0, 1).unwrap();
    let next_bonus = 33;
    let direct = assistant
        .draft_greedy(&mirror, next_bonus, &next_hidden, 4)
        .unwrap();
    let delta = KvDeltaTensors {
        start_position: len as u32,
        full: wire_pair(&rows.full),
        sliding: rows.sliding.as_ref().map(wire_pair),
        sliding_evicted: 0,
    }
    .encode("delta")
    .unwrap();
    let served = draft(
        &mut client,
        draft_request(&session, 2, next_bonus, len, &next_hidden, Some(delta)),
    )
    .await
    .unwrap();
    assert_eq!(served, direct);
}
