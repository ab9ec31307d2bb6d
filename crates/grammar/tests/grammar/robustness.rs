//! Whatever ids arrive, in whatever order, a constraint answers or errs: it never panics,
//! and reading masks never moves it.

use specd_core::TokenConstraint;
use specd_grammar::OutputFormat;

use crate::json_schema::PERSON;
use crate::support::models;

/// A small deterministic generator: the test must fail the same way every run.
struct Lcg(u64);

impl Lcg {
    fn below(&mut self, n: usize) -> usize {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((self.0 >> 33) as usize) % n.max(1)
    }
}

#[test]
fn random_drafts_and_commits_never_panic_and_masks_never_move_the_state() {
    let formats = [
        OutputFormat::JsonObject,
        OutputFormat::JsonSchema(PERSON.to_string()),
        OutputFormat::Regex(r"(yes|no)( [0-9]{1,3})?".to_string()),
        OutputFormat::Lark("start: \"[\" (NUMBER (\",\" NUMBER)*)? \"]\"\nNUMBER: /[0-9]+/".into()),
    ];
    for (name, model) in models("random_drafts_and_commits_never_panic") {
        let vocab = model.tokens.vocab_size();
        let mut rng = Lcg(7);
        for format in &formats {
            let mut constraint = model.compile(format.clone());
            for _ in 0..150 {
                let mask = constraint.next_mask();
                // An allowed id most of the time, else anything: EOS, specials, padding
                // rows, ids past the vocabulary.
                let pick = |rng: &mut Lcg| match (&mask, rng.below(10)) {
                    (Ok(mask), 0..=6) if mask.count() > 0 => {
                        mask.ids().nth(rng.below(mask.count())).unwrap_or(0)
                    }
                    (_, 7) => model.eos[rng.below(model.eos.len())],
                    _ => rng.below(vocab + 64) as u32,
                };
                match rng.below(3) {
                    0 => {
                        let drafts: Vec<u32> = (0..rng.below(6)).map(|_| pick(&mut rng)).collect();
                        if let Ok(block) = constraint.block_masks(&drafts) {
                            assert_eq!(block.masks.len(), block.kept + 1, "{name}");
                            assert!(block.kept <= drafts.len(), "{name}");
                            if let Ok(before) = &mask {
                                assert_eq!(&block.masks[0], before, "{name} {format:?}");
                                assert_eq!(&constraint.next_mask().unwrap(), before, "{name}");
                            }
                        }
                    }
                    1 => {
                        let max = rng.below(8);
                        assert!(constraint.forced(max).len() <= max, "{name}");
                    }
                    _ => {
                        let id = pick(&mut rng);
                        let allowed = mask.as_ref().is_ok_and(|m| m.allows(id));
                        let committed = constraint.commit(&[id]);
                        if !allowed {
                            assert!(
                                committed.is_err(),
                                "{name} {format:?}: {id} refused yet taken"
                            );
                        }
                        if committed.is_err() && !constraint.is_complete() {
                            // Broken for good: start this format afresh.
                            constraint = model.compile(format.clone());
                        }
                    }
                }
            }
        }
    }
}
