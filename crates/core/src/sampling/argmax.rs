//! Greedy token choice.

/// Independent running maxima; enough for the compiler to vectorise the scan.
const LANES: usize = 16;

/// Index of the largest logit; ties go to the lowest index and NaN never wins.
///
/// Returns `None` when `logits` is empty or holds only NaN.
pub fn argmax(logits: &[f32]) -> Option<u32> {
    let mut lanes = [f32::NEG_INFINITY; LANES];
    let chunks = logits.chunks_exact(LANES);
    let tail = chunks.remainder();
    for chunk in chunks {
        for (best, &x) in lanes.iter_mut().zip(chunk) {
            // NaN compares false and never replaces a lane's value.
            if x > *best {
                *best = x;
            }
        }
    }
    let max = lanes
        .iter()
        .chain(tail)
        .fold(f32::NEG_INFINITY, |m, &x| if x > m { x } else { m });
    // The first index equal to the maximum is the lowest of tied ids (and the first -inf when
    // every logit is -inf or NaN; none when all are NaN).
    logits.iter().position(|&x| x == max).map(|i| i as u32)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn picks_largest() {
        assert_eq!(argmax(&[0.1, 3.0, -2.0, 2.9]), Some(1));
    }

    #[test]
    fn ties_go_to_lowest_id() {
        assert_eq!(argmax(&[1.0, 5.0, 5.0, 5.0]), Some(1));
        let mut long = vec![0.0f32; 100];
        long[37] = 2.0;
        long[90] = 2.0;
        long[5] = 1.0;
        assert_eq!(argmax(&long), Some(37));
        assert_eq!(argmax(&[-0.0, 0.0]), Some(0), "signed zeros are equal");
    }

    #[test]
    fn nan_never_wins() {
        assert_eq!(argmax(&[f32::NAN, 1.0, f32::NAN, 0.5]), Some(1));
        assert_eq!(argmax(&[f32::NAN, f32::NAN]), None);
        let mut long = vec![f32::NAN; 40];
        long[33] = -7.0;
        assert_eq!(argmax(&long), Some(33));
    }

    #[test]
    fn handles_infinities_and_empty() {
        assert_eq!(argmax(&[]), None);
        assert_eq!(
            argmax(&[f32::NAN, f32::NEG_INFINITY, f32::NEG_INFINITY]),
            Some(1),
            "all -inf still has a first candidate"
        );
        assert_eq!(argmax(&[1.0, f32::INFINITY, f32::INFINITY]), Some(1));
    }

    #[test]
    fn matches_a_plain_scan_on_long_inputs() {
        let logits: Vec<f32> = (0..1000u32)
            .map(|i| ((i.wrapping_mul(2_654_435_761) >> 20) % 97) as f32)
            .collect();
        let expected = (0..logits.len()).fold(0, |b, i| if logits[i] > logits[b] { i } else { b });
        assert_eq!(argmax(&logits), Some(expected as u32));
    }
}
