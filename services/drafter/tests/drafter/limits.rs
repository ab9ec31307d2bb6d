//! The drafter's bounds: Opens in progress, how long an Open may take, and the K/V positions
//! all sessions may hold.

use std::time::Duration;

use specd_drafter::DrafterServerConfig;
use specd_wire::drafter::{
    draft_request, DraftRequest, DrafterKind, OpenHeader, OpenRequest, TokenCarry,
};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Code;

use crate::support::*;

/// An Open that sends its header and then nothing, as a slow or stuck client would; the
/// sender keeps the stream open.
async fn stalled_open(
    server: &TestDrafter,
) -> (
    mpsc::Sender<OpenRequest>,
    tokio::task::JoinHandle<Result<String, tonic::Status>>,
) {
    let (sender, receiver) = mpsc::channel(4);
    let header = OpenHeader {
        sampling: sampling(),
        committed_len: 6,
        context_ids: Vec::new(),
        cache_scope: String::new(),
    };
    for message in open_messages(header, None) {
        sender.send(message).await.unwrap();
    }
    let mut client = server.client().await;
    let call = tokio::spawn(async move {
        client
            .open(ReceiverStream::new(receiver))
            .await
            .map(|r| r.into_inner().session_id)
    });
    // The call reaches the server and takes its place.
    tokio::time::sleep(Duration::from_millis(200)).await;
    (sender, call)
}

#[tokio::test]
async fn opens_in_progress_are_bounded() {
    let config = DrafterServerConfig {
        max_concurrent_opens: 1,
        ..DrafterServerConfig::default()
    };
    let server = TestDrafter::start_with(DrafterKind::Mtp, config).await;
    let (sender, stalled) = stalled_open(&server).await;
    let mut client = server.client().await;
    let err = open_mtp(&mut client, 6).await.unwrap_err();
    assert_eq!(err.code(), Code::ResourceExhausted, "{err}");
    assert!(err.message().contains("max_concurrent_opens"), "{err}");
    // The stalled Open ends (its stream closes without a snapshot); the place frees.
    drop(sender);
    assert!(stalled.await.unwrap().is_err());
    open_mtp(&mut client, 6).await.unwrap();
}

#[tokio::test]
async fn an_open_that_takes_too_long_ends_and_leaves_nothing() {
    let config = DrafterServerConfig {
        open_timeout: Duration::from_millis(500),
        ..DrafterServerConfig::default()
    };
    let server = TestDrafter::start_with(DrafterKind::Mtp, config).await;
    let (_sender, stalled) = stalled_open(&server).await;
    let err = tokio::time::timeout(Duration::from_secs(10), stalled)
        .await
        .expect("the stalled Open was never ended")
        .unwrap()
        .unwrap_err();
    assert_eq!(err.code(), Code::DeadlineExceeded, "{err}");
    assert!(err.message().starts_with("open:"), "{err}");
    let mut client = server.client().await;
    assert_eq!(live_sessions(&mut client).await, 0);
}

fn token_open(len: u32) -> Vec<OpenRequest> {
    let header = OpenHeader {
        sampling: sampling(),
        committed_len: len,
        context_ids: (0..len).map(|i| i % 200 + 2).collect(),
        cache_scope: String::new(),
    };
    open_messages(header, None)
}

fn token_draft(session_id: &str, position: u32, count: u32) -> DraftRequest {
    DraftRequest {
        session_id: session_id.to_owned(),
        round: 1,
        bonus: 5,
        position,
        count,
        output_index_base: 3,
        carry: Some(draft_request::Carry::Tokens(TokenCarry::default())),
        predraft: false,
        predraft_branches: 0,
        tree_nodes: 0,
        least_branch_chance: None,
    }
}

#[tokio::test]
async fn draft_model_sessions_share_a_kv_budget() {
    let config = DrafterServerConfig {
        max_kv_tokens: Some(30),
        ..DrafterServerConfig::default()
    };
    let server = TestDrafter::start_with(DrafterKind::DraftModel, config).await;
    let mut client = server.client().await;
    let opener = client.clone();
    let open = |len| {
        let mut client = opener.clone();
        async move {
            client
                .open(tokio_stream::iter(token_open(len)))
                .await
                .map(|r| r.into_inner().session_id)
        }
    };
    let first = open(12).await.unwrap();
    let second = open(12).await.unwrap();
    let err = open(12).await.unwrap_err();
    assert_eq!(err.code(), Code::ResourceExhausted, "{err}");
    assert!(err.message().starts_with("max_kv_tokens"), "{err}");
    // Drafting grows a session; past the budget the draft is refused.
    let err = client.draft(token_draft(&first, 11, 7)).await.unwrap_err();
    assert_eq!(err.code(), Code::ResourceExhausted, "{err}");
    client.draft(token_draft(&first, 11, 4)).await.unwrap();
    // Closing a session gives its positions back.
    client
        .close(specd_wire::drafter::CloseRequest { session_id: second })
        .await
        .unwrap();
    open(12).await.unwrap();
}

#[tokio::test]
async fn pre_draft_branches_take_budget_only_when_it_has_room() {
    let config = DrafterServerConfig {
        max_kv_tokens: Some(40),
        ..DrafterServerConfig::default()
    };
    let server = TestDrafter::start_with(DrafterKind::DraftModel, config).await;
    let mut client = server.client().await;
    let open = |len, client: &mut specd_wire::drafter::DrafterClient<_>| {
        let mut client = client.clone();
        async move {
            client
                .open(tokio_stream::iter(token_open(len)))
                .await
                .map(|r| r.into_inner().session_id)
        }
    };
    let first = open(12, &mut client).await.unwrap();
    let too_many = DraftRequest {
        predraft: true,
        predraft_branches: 1000,
        ..token_draft(&first, 11, 4)
    };
    let err = client.draft(too_many).await.unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument, "{err}");
    assert!(err.message().starts_with("predraft_branches"), "{err}");
    // Three copies of 16 positions do not fit beside the session's own: it pre-drafts
    // without branches and holds its 16 positions only.
    let branched = DraftRequest {
        predraft: true,
        predraft_branches: 3,
        ..token_draft(&first, 11, 4)
    };
    client.draft(branched.clone()).await.unwrap();
    open(24, &mut client).await.unwrap();
    let err = open(1, &mut client).await.unwrap_err();
    assert_eq!(err.code(), Code::ResourceExhausted, "{err}");
    // With room, each branch's copy is held.
    let config = DrafterServerConfig {
        max_kv_tokens: Some(100),
        ..DrafterServerConfig::default()
    };
    let server = TestDrafter::start_with(DrafterKind::DraftModel, config).await;
    let mut client = server.client().await;
    let first = open(12, &mut client).await.unwrap();
    client
        .draft(DraftRequest {
            session_id: first,
            ..branched
        })
        .await
        .unwrap();
    let err = open(37, &mut client).await.unwrap_err();
    assert_eq!(err.code(), Code::ResourceExhausted, "{err}");
    open(36, &mut client).await.unwrap();
}
