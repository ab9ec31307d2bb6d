//! Draft-model sessions: opened from the context ids, carried by committed tokens.

use specd_wire::drafter::{draft_request, DraftRequest, DrafterKind, OpenHeader, TokenCarry};
use tonic::Code;

use crate::support::*;

fn token_draft(session_id: &str, round: u64, position: u32, committed: &[u32]) -> DraftRequest {
    DraftRequest {
        session_id: session_id.to_owned(),
        round,
        bonus: 5,
        position,
        count: 4,
        output_index_base: 3,
        carry: Some(draft_request::Carry::Tokens(TokenCarry {
            committed: committed.to_vec(),
        })),
        predraft: false,
        predraft_branches: 0,
        tree_nodes: 0,
        least_branch_chance: None,
    }
}

#[tokio::test]
async fn context_and_committed_tokens_track_the_length() {
    let server = TestDrafter::start(DrafterKind::DraftModel).await;
    let mut client = server.client().await;
    let header = OpenHeader {
        sampling: sampling(),
        committed_len: 4,
        context_ids: vec![2, 9, 4, 1],
        cache_scope: String::new(),
    };
    let session = client
        .open(tokio_stream::iter(open_messages(header, None)))
        .await
        .unwrap()
        .into_inner()
        .session_id;
    let drafts = draft(&mut client, token_draft(&session, 1, 3, &[]))
        .await
        .unwrap();
    assert_eq!(drafts.len(), 4);
    draft(&mut client, token_draft(&session, 2, 5, &[5, 8]))
        .await
        .unwrap();
    let err = draft(&mut client, token_draft(&session, 3, 5, &[1]))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition, "{err}");
    let err = draft(&mut client, token_draft(&session, 3, 6, &[300]))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument, "{err}");
    assert!(err.message().contains("carry.tokens.committed[0]"), "{err}");

    // An MTP carry or a snapshot does not fit this drafter.
    let err = draft(&mut client, mtp_draft(&session, 3, 6, 2, None))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument, "{err}");
    assert!(err.message().contains("carry"), "{err}");
    let header = OpenHeader {
        sampling: sampling(),
        committed_len: 4,
        context_ids: vec![2, 9, 4, 1],
        cache_scope: String::new(),
    };
    let with_snapshot = open_messages(header, Some(&snapshot(4, 0)));
    let err = client
        .open(tokio_stream::iter(with_snapshot))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument, "{err}");
    assert!(err.message().contains("snapshot"), "{err}");
}
