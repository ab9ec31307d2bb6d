//! Ids of verifier sequences and drafter sessions: random 128-bit numbers written as 32 hex
//! digits. Whoever holds an id may use the sequence or session, so ids must not be
//! guessable from others (counters were: any client could free or read another's).

use tonic::Status;

/// An unguessable id.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct WireId(u128);

impl WireId {
    /// A fresh random id (from the operating system's generator through a CSPRNG).
    pub fn random() -> Self {
        Self(rand::random())
    }

    /// Reads the id in `field`: INVALID_ARGUMENT unless it is 32 hex digits.
    pub fn parse(field: &str, text: &str) -> Result<Self, Status> {
        let valid = text.len() == 32 && text.bytes().all(|b| b.is_ascii_hexdigit());
        valid
            .then(|| u128::from_str_radix(text, 16).ok())
            .flatten()
            .map(Self)
            .ok_or_else(|| Status::invalid_argument(format!("{field}: expected 32 hex digits")))
    }
}

impl std::fmt::Display for WireId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:032x}", self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_round_trip_and_differ() {
        let a = WireId::random();
        let b = WireId::random();
        assert_ne!(a, b);
        let text = a.to_string();
        assert_eq!(text.len(), 32);
        assert_eq!(WireId::parse("seq_id", &text).unwrap(), a);
    }

    #[test]
    fn malformed_ids_name_the_field() {
        for bad in [
            "",
            "1",
            "+0000000000000000000000000000001",
            &"g".repeat(32),
            &"0".repeat(33),
        ] {
            let err = WireId::parse("seq_id", bad).unwrap_err();
            assert_eq!(err.code(), tonic::Code::InvalidArgument);
            assert!(err.message().starts_with("seq_id:"), "{err}");
        }
    }
}
