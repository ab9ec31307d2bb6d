//! Drafter pools and verifier replicas under failure, with real processes. Killing a drafter
//! mid-stream moves its sessions to the other one; killing both leaves plain decoding.
//! Killing a verifier mid-stream moves its requests to another replica; a restarted one takes
//! requests again; with none left requests fail with UNAVAILABLE. Every request that ends
//! ends with exactly the plain output.

use crate::served::{drain_stream, request, Service};
use specd_wire::generation::{GenerateStreamResponse, GenerationClient};
use tonic::transport::Channel;
use tonic::Streaming;

const PROMPTS: [[u32; 5]; 4] = [
    [2, 17, 201, 5, 9],
    [2, 40, 41, 42, 43],
    [2, 9, 9, 9, 100],
    [2, 130, 7, 64, 3],
];

/// Long enough that every request is still running when a drafter dies.
const MAX_TOKENS: u32 = 900;

/// What the target alone generates for each prompt (speculation off).
async fn plain_outputs(client: &mut GenerationClient<Channel>) -> Vec<Vec<u32>> {
    let mut outputs = Vec::new();
    for prompt in PROMPTS {
        let response = client
            .generate(request(&prompt, MAX_TOKENS, 0))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(response.token_ids.len(), MAX_TOKENS as usize);
        outputs.push(response.token_ids);
    }
    outputs
}

/// Starts one speculating stream per prompt, all at once, then reads each one's first
/// message, so that every request has its drafter session open.
async fn start_streams(
    client: &GenerationClient<Channel>,
) -> Vec<(Streaming<GenerateStreamResponse>, Vec<u32>)> {
    start_streams_of(client, |i| request(&PROMPTS[i], MAX_TOKENS, 4)).await
}

/// Starts the stream `make(i)` for every prompt index `i`, all at once, then reads each
/// one's first message.
async fn start_streams_of(
    client: &GenerationClient<Channel>,
    make: impl Fn(usize) -> specd_wire::generation::GenerateRequest,
) -> Vec<(Streaming<GenerateStreamResponse>, Vec<u32>)> {
    let mut streams = Vec::new();
    for i in 0..PROMPTS.len() {
        let stream = client
            .clone()
            .generate_stream(make(i))
            .await
            .unwrap()
            .into_inner();
        streams.push(stream);
    }
    let mut started = Vec::new();
    for mut stream in streams {
        let first = stream.message().await.unwrap().unwrap();
        started.push((stream, first.token_ids));
    }
    started
}

/// Waits for the background release of finished requests; the count left after a generous
/// wait.
async fn settled(count: impl AsyncFn() -> u32) -> u32 {
    for _ in 0..200 {
        if count().await == 0 {
            return 0;
        }
        tokio::time::sleep(std::time::Duration::from_millis(25)).await;
    }
    count().await
}

/// Reads every stream to its end; the outputs and each request's final message.
async fn finish_streams(
    streams: Vec<(Streaming<GenerateStreamResponse>, Vec<u32>)>,
) -> Vec<(Vec<u32>, GenerateStreamResponse)> {
    let mut finished = Vec::new();
    for (stream, first) in streams {
        finished.push(drain_stream(stream, first).await);
    }
    finished
}

/// Checks that every finished request speculated and gave its plain output; the sum of
/// `count` over their stats.
fn speculated_as_plain(
    finished: &[(Vec<u32>, GenerateStreamResponse)],
    want: &[Vec<u32>],
    count: impl Fn(&specd_wire::generation::GenerationStats) -> u32,
) -> u32 {
    let mut total = 0;
    for (i, ((tokens, last), want)) in finished.iter().zip(want).enumerate() {
        assert_eq!(tokens, want, "request {i}");
        let stats = last.stats.as_ref().unwrap();
        assert!(stats.drafted > 0, "request {i} never speculated");
        total += count(stats);
    }
    total
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_fail_over_when_a_drafter_dies_mid_stream() {
    let verifier = Service::verifier();
    let survivor = Service::mtp_drafter();
    let mut victim = Service::mtp_drafter();
    let router = Service::router(&verifier, &[&survivor, &victim], &[]);
    let mut client = GenerationClient::new(router.channel().await);
    let want = plain_outputs(&mut client).await;

    let streams = start_streams(&client).await;
    // Sessions open once each first token is out; wait for all of them.
    for _ in 0..200 {
        let open = survivor.live_sessions().await + victim.live_sessions().await;
        if open as usize >= PROMPTS.len() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(25)).await;
    }
    // Concurrent sessions spread over the pool: the victim holds some of them.
    assert!(
        victim.live_sessions().await > 0,
        "every session went to one drafter"
    );
    victim.kill();
    let finished = finish_streams(streams).await;

    let resyncs = speculated_as_plain(&finished, &want, |s| s.drafter_resyncs);
    assert!(resyncs > 0, "no session moved to the surviving drafter");

    // Later requests still speculate, on the survivor alone.
    let (tokens, last) = finish_streams(start_streams(&client).await).await.remove(0);
    assert_eq!(tokens, want[0]);
    assert!(last.stats.unwrap().drafted > 0);
    assert_eq!(settled(|| verifier.live_sequences()).await, 0);
    assert_eq!(settled(|| survivor.live_sessions()).await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn losing_every_drafter_falls_back_to_plain_rounds() {
    let verifier = Service::verifier();
    let mut first = Service::mtp_drafter();
    let mut second = Service::mtp_drafter();
    let router = Service::router(&verifier, &[&first, &second], &[]);
    let mut client = GenerationClient::new(router.channel().await);
    let want = plain_outputs(&mut client).await;

    let streams = start_streams(&client).await;
    first.kill();
    second.kill();
    let finished = finish_streams(streams).await;
    let mut plain_rounds = 0;
    for (i, ((tokens, last), want)) in finished.iter().zip(&want).enumerate() {
        assert_eq!(tokens, want, "request {i}");
        let stats = last.stats.as_ref().unwrap();
        assert_eq!(stats.drafter_resyncs, 0, "request {i}");
        plain_rounds += stats.plain_rounds;
    }
    assert!(plain_rounds > 0, "no request fell back to plain rounds");

    // A request that starts with no drafter left decodes plainly from the start.
    let response = client
        .generate(request(&PROMPTS[1], MAX_TOKENS, 4))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(response.token_ids, want[1]);
    assert_eq!(response.stats.unwrap().drafted, 0);
    assert_eq!(settled(|| verifier.live_sequences()).await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drafters_found_through_dns_serve_requests() {
    let verifier = Service::verifier();
    let drafter = Service::mtp_drafter();
    let port = drafter.url.rsplit(':').next().unwrap();
    let name = format!("localhost:{port}");
    let router = Service::router(
        &verifier,
        &[],
        &["--drafter-dns", &name, "--drafter-dns-refresh-secs", "1"],
    );
    let mut client = GenerationClient::new(router.channel().await);
    let want = client
        .generate(request(&PROMPTS[0], 64, 0))
        .await
        .unwrap()
        .into_inner()
        .token_ids;
    // Resolution runs in the background from startup; give it a moment to land.
    let mut drafted = 0;
    for _ in 0..50 {
        let response = client
            .generate(request(&PROMPTS[0], 64, 4))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(response.token_ids, want);
        drafted = response.stats.unwrap().drafted;
        if drafted > 0 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert!(drafted > 0, "the discovered drafter was never used");
    assert_eq!(settled(|| drafter.live_sessions()).await, 0);
}

/// The streams of the verifier test: greedy and seeded, several block sizes.
fn mixed_request(i: usize, speculate: bool) -> specd_wire::generation::GenerateRequest {
    let block = if speculate { [2, 3, 4, 4][i] } else { 0 };
    let mut request = request(&PROMPTS[i], MAX_TOKENS, block);
    if i % 2 == 1 {
        request.sampling = Some(specd_wire::generation::SamplingParams {
            temperature: Some(0.8),
            seed: Some(100 + i as u64),
            ..Default::default()
        });
    }
    request
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_move_losslessly_when_their_verifier_dies() {
    let mut first = Service::verifier();
    let mut second = Service::verifier();
    let drafter = Service::mtp_drafter();
    let router = Service::router_over(
        &[&first, &second],
        &[&drafter],
        &["--verifier-backoff-secs", "1"],
    );
    let mut client = GenerationClient::new(router.channel().await);
    let mut want = Vec::new();
    for i in 0..PROMPTS.len() {
        let response = client
            .generate(mixed_request(i, false))
            .await
            .unwrap()
            .into_inner();
        want.push(response.token_ids);
    }

    let started = start_streams_of(&client, |i| mixed_request(i, true)).await;
    // New requests spread over the replicas: kill the one holding more of them.
    let (on_first, on_second) = (first.live_sequences().await, second.live_sequences().await);
    assert!(
        on_first > 0 && on_second > 0,
        "placement put {on_first} and {on_second} requests on the two replicas"
    );
    let (victim, survivor) = if on_first >= on_second {
        (&mut first, &mut second)
    } else {
        (&mut second, &mut first)
    };
    let victim_addr = victim.addr().to_owned();
    victim.kill();
    let finished = finish_streams(started).await;
    let migrations = speculated_as_plain(&finished, &want, |s| s.verifier_migrations);
    assert!(migrations > 0, "no request moved to the surviving verifier");
    assert_eq!(settled(|| survivor.live_sequences()).await, 0);
    assert_eq!(settled(|| drafter.live_sessions()).await, 0);

    // The victim comes back on its address; once the survivor is gone too, it serves alone.
    let restarted = Service::verifier_on(&victim_addr);
    tokio::time::sleep(std::time::Duration::from_millis(2500)).await;
    survivor.kill();
    let response = client
        .generate(mixed_request(1, true))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(response.token_ids, want[1]);
    assert_eq!(settled(|| restarted.live_sequences()).await, 0);

    // With no verifier left, requests fail with UNAVAILABLE and health says NOT_SERVING.
    drop(restarted);
    let status = client.generate(mixed_request(0, true)).await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::Unavailable, "{status}");
    let mut serving = true;
    for _ in 0..50 {
        let health = std::process::Command::new(env!("CARGO_BIN_EXE_specd"))
            .args(["health", "--addr", &router.url])
            .output()
            .unwrap();
        serving = health.status.success();
        if !serving {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert!(!serving, "router health stayed SERVING with no verifier");
}

/// The K/V bytes a verifier's prefix cache holds.
async fn prefix_cache_bytes(verifier: &Service) -> u64 {
    use specd_wire::verifier::{VerifierClient, VerifierStatsRequest};
    VerifierClient::new(verifier.channel().await)
        .stats(VerifierStatsRequest {})
        .await
        .unwrap()
        .into_inner()
        .prefix_cache_bytes
}

#[tokio::test]
async fn a_conversation_follows_its_cached_prefix_and_survives_losing_that_replica() {
    let mut replicas = [Service::verifier(), Service::verifier()];
    let router = Service::router_over(&[&replicas[0], &replicas[1]], &[], &[]);
    let reference_verifier = Service::verifier();
    let reference = Service::router(&reference_verifier, &[], &["--max-block-size", "1"]);
    let mut client = GenerationClient::new(router.channel().await);
    let mut plain = GenerationClient::new(reference.channel().await);
    // Long enough for whole 512-token prefill pieces, which this target reuses.
    let mut prompt: Vec<u32> = (0..560u32).map(|i| (i * 29 + 3) % 250 + 2).collect();
    let mut holder: Option<usize> = None;
    for turn in 0..4u32 {
        if turn == 2 {
            // The replica holding the conversation's prefix dies between turns.
            let i = holder.expect("a replica holds the conversation");
            replicas[i].kill();
        }
        let response = client
            .generate(request(&prompt, 8, 0))
            .await
            .unwrap()
            .into_inner();
        let want = plain
            .generate(request(&prompt, 8, 0))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(response.token_ids, want.token_ids, "turn {turn}");
        let cached = response.stats.unwrap().cached_prompt_tokens;
        match turn {
            0 => {
                assert_eq!(cached, 0);
                let mut holding = Vec::new();
                for (i, replica) in replicas.iter().enumerate() {
                    if prefix_cache_bytes(replica).await > 0 {
                        holding.push(i);
                    }
                }
                assert_eq!(holding.len(), 1, "{holding:?}");
                holder = holding.first().copied();
            }
            // The next turn went where the history was computed...
            1 => assert_eq!(cached, 512, "turn 1"),
            // ...the first one after the loss prefilled anew on the other replica, and the
            // one after that reuses what that replica now holds.
            2 => assert_eq!(cached, 0, "turn 2"),
            _ => assert_eq!(cached, 512, "turn 3"),
        }
        prompt.extend(&response.token_ids);
        prompt.extend([60 + turn, 61, 62]);
    }
}
