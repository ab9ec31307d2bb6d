//! Every bad input gets its status code and a message naming the field.

use specd_wire::verifier::{ReleaseRequest, SnapshotRequest, TruncateRequest};
use specd_wire::Sampling;
use tonic::Code;

/// A well-formed sequence id no verifier handed out.
const UNKNOWN: &str = "0123456789abcdef0123456789abcdef";
use crate::support::*;

fn expect(result: Result<impl std::fmt::Debug, tonic::Status>, code: Code, field: &str) {
    let err = result.expect_err("must fail");
    assert_eq!(err.code(), code, "{err}");
    assert!(err.message().contains(field), "{field} not named in {err}");
}

#[tokio::test]
async fn bad_prefills_are_refused_naming_the_field() {
    let server = TestVerifier::start().await;
    let mut client = server.client().await;
    let cases: Vec<(specd_wire::verifier::PrefillRequest, Code, &str)> = vec![
        (
            prefill_request(&[], false),
            Code::InvalidArgument,
            "prompt_ids",
        ),
        (
            prefill_request(&[2, 256, 3], false),
            Code::InvalidArgument,
            "prompt_ids[1]",
        ),
        (
            prefill_request(&vec![3; 1024], false),
            Code::OutOfRange,
            "prompt_ids",
        ),
        (
            specd_wire::verifier::PrefillRequest {
                max_new_tokens: 0,
                ..prefill_request(&PROMPT, false)
            },
            Code::InvalidArgument,
            "max_new_tokens",
        ),
        (
            specd_wire::verifier::PrefillRequest {
                max_new_tokens: 1020,
                ..prefill_request(&PROMPT, false)
            },
            Code::OutOfRange,
            "max_new_tokens",
        ),
        (
            specd_wire::verifier::PrefillRequest {
                sampling: Some(Sampling {
                    temperature: f32::NAN,
                    top_p: 1.0,
                    top_k: 0,
                    seed: 1,
                }),
                ..prefill_request(&PROMPT, false)
            },
            Code::InvalidArgument,
            "sampling.temperature",
        ),
        (
            specd_wire::verifier::PrefillRequest {
                sampling: Some(Sampling {
                    temperature: -0.5,
                    top_p: 1.0,
                    top_k: 0,
                    seed: 1,
                }),
                ..prefill_request(&PROMPT, false)
            },
            Code::InvalidArgument,
            "sampling.temperature",
        ),
        (
            specd_wire::verifier::PrefillRequest {
                sampling: Some(Sampling {
                    temperature: 0.7,
                    top_p: 1.5,
                    top_k: 0,
                    seed: 1,
                }),
                ..prefill_request(&PROMPT, false)
            },
            Code::InvalidArgument,
            "sampling.top_p",
        ),
    ];
    for (request, code, field) in cases {
        // Refused before a stream starts: the call itself fails.
        expect(client.prefill(request).await.map(|_| ()), code, field);
    }
    assert_eq!(live_sequences(&mut client).await, 0);
}

#[tokio::test]
async fn bad_rounds_are_refused_naming_the_field() {
    let server = TestVerifier::start().await;
    let mut client = server.client().await;
    let head = prefill(&mut client, prefill_request(&PROMPT, false))
        .await
        .unwrap()
        .head;
    let (seq, len) = (head.seq_id, head.committed_len);
    let bonus = head.first_token;
    expect(
        verify(&mut client, verify_request(&seq, 1, &[], 1, len)).await,
        Code::InvalidArgument,
        "tokens",
    );
    expect(
        verify(&mut client, verify_request(&seq, 1, &[bonus, 999], 1, len)).await,
        Code::InvalidArgument,
        "tokens[1]",
    );
    expect(
        verify(&mut client, verify_request(&seq, 1, &[bonus; 18], 1, len)).await,
        Code::OutOfRange,
        "tokens",
    );
    let mut zero_budget = verify_request(&seq, 1, &[bonus], 1, len);
    zero_budget.budget = 0;
    expect(
        verify(&mut client, zero_budget).await,
        Code::InvalidArgument,
        "budget",
    );
    // Unknown sequences, on every call that names one.
    expect(
        verify(&mut client, verify_request(UNKNOWN, 1, &[bonus], 1, len)).await,
        Code::NotFound,
        "seq_id",
    );
    let snapshot = client
        .snapshot(SnapshotRequest {
            seq_id: UNKNOWN.into(),
            max_chunk_bytes: 0,
        })
        .await;
    expect(snapshot.map(|_| ()), Code::NotFound, "seq_id");
    let truncate = client
        .truncate(TruncateRequest {
            seq_id: UNKNOWN.into(),
            committed_len: 3,
        })
        .await;
    expect(truncate, Code::NotFound, "seq_id");
    // Releasing an unknown sequence succeeds and says it was not there.
    let released = client
        .release(ReleaseRequest {
            seq_id: UNKNOWN.into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert!(!released.released);
    // The failed rounds left the sequence untouched.
    let answer = verify(&mut client, verify_request(&seq, 1, &[bonus], 1, len))
        .await
        .unwrap();
    assert_eq!(answer.committed_len, len + 1);
}

#[tokio::test]
async fn a_full_table_is_resource_exhausted() {
    let server = TestVerifier::start_with(Options {
        max_sequences: 2,
        ..Options::default()
    })
    .await;
    let mut client = server.client().await;
    for _ in 0..2 {
        prefill(&mut client, prefill_request(&PROMPT, false))
            .await
            .unwrap();
    }
    let err = prefill(&mut client, prefill_request(&PROMPT, false))
        .await
        .err()
        .expect("the table is full");
    assert_eq!(err.code(), Code::ResourceExhausted, "{err}");
    assert_eq!(live_sequences(&mut client).await, 2);
}
