//! MTP sessions: open from a chunked snapshot, rounds apply carries once, retries replay.

use specd_wire::drafter::{draft_request, CloseRequest, DrafterKind, DrafterStatsRequest};
use tonic::Code;

use crate::support::*;

#[tokio::test]
async fn rounds_apply_each_carry_once_and_retries_replay() {
    let server = TestDrafter::start(DrafterKind::Mtp).await;
    let mut client = server.client().await;
    let session = open_mtp(&mut client, 10).await.unwrap();

    let first = draft(&mut client, mtp_draft(&session, 1, 9, 3, None))
        .await
        .unwrap();
    assert_eq!(first.len(), 3);
    assert!(first.iter().all(|&t| (t as usize) < VOCAB));
    assert_eq!(
        draft(&mut client, mtp_draft(&session, 1, 9, 3, None))
            .await
            .unwrap(),
        first,
        "a retry returns the stored drafts"
    );

    // Round 2 commits positions 10..12 and evicts two sliding rows.
    let round2 = mtp_draft(&session, 2, 11, MAX_DRAFTS as u32, Some(delta(10, 12, 2)));
    let second = draft(&mut client, round2.clone()).await.unwrap();
    assert_eq!(second.len(), MAX_DRAFTS);
    // The retry must not apply the delta again: round 3 continues at 12.
    assert_eq!(draft(&mut client, round2).await.unwrap(), second);
    let third = mtp_draft(&session, 3, 12, 1, Some(delta(12, 13, 1)));
    assert_eq!(draft(&mut client, third).await.unwrap().len(), 1);

    // Sessions are independent and draft different streams.
    let other = open_mtp(&mut client, 10).await.unwrap();
    assert_ne!(other, session);
    let other_drafts = draft(&mut client, mtp_draft(&other, 1, 9, 3, None))
        .await
        .unwrap();
    assert_ne!(other_drafts, first);

    let stats = client
        .stats(DrafterStatsRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(stats.live_sessions, 2);
    assert_eq!(stats.kind(), DrafterKind::Mtp);
    assert_eq!(stats.max_draft_tokens, MAX_DRAFTS as u32);
    assert_eq!(stats.model, "random");
}

/// Rounds that drafted nothing reach the drafter with the next draft, their deltas as the
/// verifier sent them: every row is applied, in order.
#[tokio::test]
async fn several_rounds_deltas_apply_in_one_draft() {
    let server = TestDrafter::start(DrafterKind::Mtp).await;
    let mut client = server.client().await;
    let session = open_mtp(&mut client, 10).await.unwrap();
    draft(&mut client, mtp_draft(&session, 1, 9, 2, None))
        .await
        .unwrap();

    let mut round2 = mtp_draft(&session, 2, 13, 2, Some(delta(10, 11, 1)));
    if let Some(draft_request::Carry::Mtp(mtp)) = round2.carry.as_mut() {
        mtp.later_deltas = vec![delta(11, 12, 0), delta(12, 14, 1)];
    }
    assert_eq!(draft(&mut client, round2).await.unwrap().len(), 2);
    // The session holds 14 positions now: round 3 continues there and nowhere else.
    let behind = mtp_draft(&session, 3, 12, 1, Some(delta(12, 13, 0)));
    let err = draft(&mut client, behind).await.unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition, "{err}");
    let next = mtp_draft(&session, 3, 14, 1, Some(delta(14, 15, 0)));
    assert_eq!(draft(&mut client, next).await.unwrap().len(), 1);
}

#[tokio::test]
async fn out_of_line_rounds_are_failed_preconditions() {
    let server = TestDrafter::start(DrafterKind::Mtp).await;
    let mut client = server.client().await;
    let session = open_mtp(&mut client, 10).await.unwrap();
    let cases = [
        // Round 2 before round 1.
        (mtp_draft(&session, 2, 9, 2, None), "round"),
        // The query position disagrees with the snapshot.
        (mtp_draft(&session, 1, 8, 2, None), "position"),
        // A delta that does not start where the snapshot ends.
        (
            mtp_draft(&session, 1, 11, 2, Some(delta(11, 12, 0))),
            "start_position",
        ),
    ];
    for (request, field) in cases {
        let err = draft(&mut client, request).await.unwrap_err();
        assert_eq!(err.code(), Code::FailedPrecondition, "{err}");
        assert!(err.message().contains(field), "{field}: {err}");
    }
    // None of them changed the session.
    draft(&mut client, mtp_draft(&session, 1, 9, 2, None))
        .await
        .unwrap();
    // A retry that changes the request is refused.
    let mut changed = mtp_draft(&session, 1, 9, 2, None);
    changed.bonus = 8;
    let err = draft(&mut client, changed).await.unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition, "{err}");

    assert!(
        client
            .close(CloseRequest {
                session_id: session
            })
            .await
            .unwrap()
            .into_inner()
            .closed
    );
}
