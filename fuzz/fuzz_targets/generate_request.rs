//! The router's limits and validation of a public `GenerateRequest` decoded from arbitrary
//! bytes: every request is either refused with INVALID_ARGUMENT or OUT_OF_RANGE, or turned into a
//! plan that fits the target (ids in the vocabulary, prompt plus budget within the context,
//! block size within both ceilings, valid sampling).
#![no_main]

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use prost::Message;
use specd_fuzz::router_target;
use specd_router::validate::{plan, BlockChoice, Plan};
use specd_router::{RouterConfig, TargetLimits, TargetText};
use specd_wire::generation::GenerateRequest;

struct Router {
    limits: TargetLimits,
    config: RouterConfig,
    texts: [TargetText; 2],
}

fn router() -> &'static Router {
    static ROUTER: OnceLock<Router> = OnceLock::new();
    ROUTER.get_or_init(|| Router {
        limits: router_target::limits(),
        config: RouterConfig::default(),
        texts: [
            router_target::text_with_tokenizer(),
            router_target::text_without_tokenizer(),
        ],
    })
}

fuzz_target!(|data: &[u8]| {
    let Ok(request) = GenerateRequest::decode(data) else {
        return;
    };
    let router = router();
    // The router's own bounds come first: what passes them goes on to validation.
    if let Err(status) = router.config.requests.check(&request) {
        assert!(
            matches!(
                status.code(),
                tonic::Code::InvalidArgument | tonic::Code::OutOfRange
            ),
            "{status:?}"
        );
        assert!(status.message().contains("--max-"), "{status:?}");
        return;
    }
    for text in &router.texts {
        match plan(request.clone(), &router.limits, &router.config, text) {
            Ok(plan) => check_plan(&plan, &request, router),
            Err(status) => {
                assert!(
                    matches!(
                        status.code(),
                        tonic::Code::InvalidArgument | tonic::Code::OutOfRange
                    ),
                    "{status:?}"
                );
                assert!(!status.message().is_empty());
            }
        }
    }
});

fn check_plan(plan: &Plan, request: &GenerateRequest, router: &Router) {
    let limits = &router.limits;
    assert!(!plan.prompt_ids.is_empty());
    assert!(plan
        .prompt_ids
        .iter()
        .all(|&id| (id as usize) < limits.vocab_size));
    assert!(plan.max_tokens >= 1);
    assert!(plan.prompt_ids.len() + plan.max_tokens <= limits.max_context_tokens);
    if let Some(asked) = request.max_tokens {
        assert_eq!(plan.max_tokens, asked as usize);
    }
    assert!(plan.max_tokens <= router.config.requests.max_tokens as usize);
    assert!(plan.stop.len() <= router.config.requests.max_stop_strings);
    plan.sampling.validate().expect("planned sampling is valid");
    assert_eq!(plan.stop, request.stop);
    assert!(plan.stop.iter().all(|s| !s.is_empty()));
    assert!(!plan.eos_token_ids.is_empty());
    if let BlockChoice::Fixed(size) = plan.block {
        let ceiling = router.config.max_block_size.min(limits.max_block_size);
        assert!((2..=ceiling).contains(&size), "block size {size}");
    }
}
