//! A verify block's masks: cut at the first refused draft, the state left as it was.

use specd_core::{TokenConstraint, TokenMask};

use crate::json_schema::PERSON;
use crate::support::{commit_each, models, Model};

/// The masks a constraint gives position by position when fed `ids` for real, up to and
/// including the position of the first id it refuses (or past the last id).
fn sequential_masks(model: &Model, ids: &[u32]) -> Vec<TokenMask> {
    let mut constraint = model.schema(PERSON);
    let mut masks = Vec::new();
    for &id in ids {
        let mask = constraint.next_mask().unwrap();
        let allowed = mask.allows(id);
        masks.push(mask);
        if !allowed {
            return masks;
        }
        constraint.commit(&[id]).unwrap();
    }
    masks.push(constraint.next_mask().unwrap());
    masks
}

#[test]
fn block_masks_stop_at_the_first_refused_draft_and_leave_the_state() {
    for (name, model) in models("block_masks_stop_at_the_first_refused_draft_and_leave_the_state") {
        let doc = model.encode(r#"{"name": "x", "age": "three"}"#);
        let expected = sequential_masks(model, &doc);
        let refused = expected.len() - 1;
        assert!(refused < doc.len(), "{name}: the document is refused");
        assert!(
            model.decode(&doc[refused..=refused]).contains('"'),
            "{name}"
        );
        let (start, drafts) = doc.split_at(2);
        let kept = refused - start.len();

        let mut constraint = model.schema(PERSON);
        commit_each(model, &mut constraint, start);
        let before = constraint.next_mask().unwrap();
        let block = constraint.block_masks(drafts).unwrap();
        assert_eq!(block.kept, kept, "{name}");
        assert_eq!(block.masks.len(), kept + 1, "{name}");
        assert!(!block.masks[kept].allows(drafts[kept]), "{name}");
        assert_eq!(constraint.next_mask().unwrap(), before, "{name}");
        // Row j is the mask after drafts[..j], as committing them one by one gives.
        assert_eq!(block.masks, expected[start.len()..], "{name}");

        // The same block again gives the same answer, and the kept drafts still commit.
        assert_eq!(constraint.block_masks(drafts).unwrap(), block, "{name}");
        commit_each(model, &mut constraint, &drafts[..kept]);
        assert_eq!(constraint.next_mask().unwrap(), block.masks[kept], "{name}");
    }
}

#[test]
fn a_block_through_the_end_keeps_one_eos_and_nothing_after() {
    for (name, model) in models("a_block_through_the_end_keeps_one_eos_and_nothing_after") {
        let mut constraint = model.schema(PERSON);
        let doc = model.encode(r#"{"name": "x", "age": 3}"#);
        let mut drafts = doc.clone();
        drafts.push(model.eos[0]);
        drafts.push(doc[0]);
        let before = constraint.next_mask().unwrap();
        let block = constraint.block_masks(&drafts).unwrap();
        assert_eq!(block.kept, doc.len() + 1, "{name}");
        let eos_only = TokenMask::allowing(model.tokens.vocab_size(), &model.eos);
        assert_eq!(block.masks[doc.len()], eos_only, "{name}");
        assert_eq!(block.masks[doc.len() + 1], eos_only, "{name}");
        // Rolled back from the stopped matcher too.
        assert_eq!(constraint.next_mask().unwrap(), before, "{name}");
        assert!(!constraint.is_complete(), "{name}");
        commit_each(model, &mut constraint, &doc);
        assert!(constraint.is_complete(), "{name}");
    }
}

#[test]
fn an_empty_block_and_ids_past_the_vocabulary_are_no_trouble() {
    for (name, model) in models("an_empty_block_and_ids_past_the_vocabulary_are_no_trouble") {
        let mut constraint = model.schema(PERSON);
        let before = constraint.next_mask().unwrap();
        let block = constraint.block_masks(&[]).unwrap();
        assert_eq!(
            (block.kept, block.masks),
            (0, vec![before.clone()]),
            "{name}"
        );
        let block = constraint.block_masks(&[u32::MAX, 0]).unwrap();
        assert_eq!(block.kept, 0, "{name}");
        assert!(constraint.commit(&[u32::MAX]).is_err(), "{name}");
    }
}
