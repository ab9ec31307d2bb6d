//! Every bad input gets its status code and a message naming the field.

use specd_drafter::DrafterServerConfig;
use specd_wire::drafter::{draft_request, DrafterKind, MtpCarry, OpenHeader, OpenRequest};
use specd_wire::tensor::encode;
use specd_wire::{KvDelta, Sampling};
use tonic::Code;

use crate::support::*;

fn expect<T: std::fmt::Debug>(result: Result<T, tonic::Status>, code: Code, field: &str) {
    let err = result.expect_err("must fail");
    assert_eq!(err.code(), code, "{err}");
    assert!(err.message().contains(field), "{field} not named in {err}");
}

#[tokio::test]
async fn bad_drafts_are_refused_naming_the_field() {
    let server = TestDrafter::start(DrafterKind::Mtp).await;
    let mut client = server.client().await;
    let session = open_mtp(&mut client, 10).await.unwrap();

    expect(
        draft(
            &mut client,
            mtp_draft("0123456789abcdef0123456789abcdef", 1, 9, 2, None),
        )
        .await,
        Code::NotFound,
        "session_id",
    );
    expect(
        draft(&mut client, mtp_draft(&session, 1, 9, 0, None)).await,
        Code::InvalidArgument,
        "count",
    );
    expect(
        draft(
            &mut client,
            mtp_draft(&session, 1, 9, MAX_DRAFTS as u32 + 1, None),
        )
        .await,
        Code::InvalidArgument,
        "count",
    );
    let mut bad_bonus = mtp_draft(&session, 1, 9, 2, None);
    bad_bonus.bonus = VOCAB as u32;
    expect(
        draft(&mut client, bad_bonus).await,
        Code::InvalidArgument,
        "bonus",
    );
    let mut no_carry = mtp_draft(&session, 1, 9, 2, None);
    no_carry.carry = None;
    expect(
        draft(&mut client, no_carry).await,
        Code::InvalidArgument,
        "carry",
    );
    let mut no_hidden = mtp_draft(&session, 1, 9, 2, None);
    no_hidden.carry = Some(draft_request::Carry::Mtp(MtpCarry {
        hidden: None,
        delta: None,
        later_deltas: Vec::new(),
    }));
    expect(
        draft(&mut client, no_hidden).await,
        Code::InvalidArgument,
        "carry.mtp.hidden",
    );
    let flat =
        candle_core::Tensor::zeros((1, 64), candle_core::DType::F32, &candle_core::Device::Cpu)
            .unwrap();
    let mut wrong_shape = mtp_draft(&session, 1, 9, 2, None);
    wrong_shape.carry = Some(draft_request::Carry::Mtp(MtpCarry {
        hidden: Some(encode(&flat, "hidden").unwrap()),
        delta: None,
        later_deltas: Vec::new(),
    }));
    expect(
        draft(&mut client, wrong_shape).await,
        Code::InvalidArgument,
        "carry.mtp.hidden",
    );
    let mut truncated = delta(10, 12, 0);
    truncated.full_k.as_mut().unwrap().data = truncated.full_k.as_ref().unwrap().data.slice(..8);
    expect(
        draft(&mut client, mtp_draft(&session, 1, 11, 2, Some(truncated))).await,
        Code::InvalidArgument,
        "carry.mtp.delta.full_k",
    );
    // Later rounds' deltas come only after a first one, each where the one before ends.
    let with_later = |first: Option<KvDelta>, later: KvDelta, position: usize| {
        let mut request = mtp_draft(&session, 1, position, 2, first);
        if let Some(draft_request::Carry::Mtp(mtp)) = request.carry.as_mut() {
            mtp.later_deltas.push(later);
        }
        request
    };
    expect(
        draft(&mut client, with_later(None, delta(10, 12, 0), 11)).await,
        Code::InvalidArgument,
        "carry.mtp.later_deltas",
    );
    expect(
        draft(
            &mut client,
            with_later(Some(delta(10, 12, 0)), delta(13, 14, 0), 13),
        )
        .await,
        Code::InvalidArgument,
        "carry.mtp.later_deltas[0].start_position",
    );
    // After all that, the session is still at round 0 and works.
    draft(&mut client, mtp_draft(&session, 1, 9, 2, None))
        .await
        .unwrap();
}

fn header(committed_len: u32) -> OpenHeader {
    OpenHeader {
        sampling: sampling(),
        committed_len,
        context_ids: Vec::new(),
        cache_scope: String::new(),
    }
}

#[tokio::test]
async fn bad_opens_are_refused_naming_the_field() {
    let server = TestDrafter::start(DrafterKind::Mtp).await;
    let mut client = server.client().await;
    let snap = snapshot(10, 5);
    let open = |messages: Vec<OpenRequest>| {
        let mut client = client.clone();
        async move { client.open(tokio_stream::iter(messages)).await }
    };

    // No header first.
    let mut messages = open_messages(header(10), Some(&snap));
    messages.remove(0);
    expect(
        open(messages).await,
        Code::InvalidArgument,
        "open[0].header",
    );
    // A second header.
    let mut messages = open_messages(header(10), Some(&snap));
    messages.push(open_messages(header(10), None).remove(0));
    expect(open(messages).await, Code::InvalidArgument, "header");
    // The header's length disagrees with the snapshot.
    let messages = open_messages(header(9), Some(&snap));
    expect(open(messages).await, Code::InvalidArgument, "committed_len");
    // The snapshot stops short.
    let mut messages = open_messages(header(10), Some(&snap));
    messages.pop();
    expect(open(messages).await, Code::InvalidArgument, "open.snapshot");
    // No snapshot at all.
    expect(
        open(open_messages(header(10), None)).await,
        Code::InvalidArgument,
        "open.snapshot",
    );
    // Sampling out of range.
    let mut bad = header(10);
    bad.sampling = Some(Sampling {
        temperature: f32::NAN,
        top_p: 1.0,
        top_k: 0,
        seed: 0,
    });
    expect(
        open(open_messages(bad, Some(&snap))).await,
        Code::InvalidArgument,
        "sampling.temperature",
    );
    assert_eq!(live_sessions(&mut client).await, 0);
}

#[tokio::test]
async fn a_full_drafter_is_resource_exhausted() {
    let config = DrafterServerConfig {
        max_sessions: 2,
        ..DrafterServerConfig::default()
    };
    let server = TestDrafter::start_with(DrafterKind::Mtp, config).await;
    let mut client = server.client().await;
    open_mtp(&mut client, 6).await.unwrap();
    open_mtp(&mut client, 6).await.unwrap();
    expect(
        open_mtp(&mut client, 6).await,
        Code::ResourceExhausted,
        "sessions",
    );
}
