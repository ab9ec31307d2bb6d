//! Which requests share cached prompt prefixes on the verifiers. A cached prefix answers the
//! first token sooner, which another tenant could time to learn that a prompt was sent
//! before: under the key scope only requests of one API key share, and a request's
//! `cache_salt` narrows that further (vLLM's field).

use sha2::{Digest, Sha256};
use specd_core::CacheScope;
use tonic::Status;

/// Longest `cache_salt` a request may send, in bytes.
pub const MAX_CACHE_SALT_BYTES: usize = 256;

/// Who shares cached prefixes, as `--prefix-cache-scope` says.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PrefixCacheScope {
    /// Requests of one API key share (every request, when the API is open).
    #[default]
    Key,
    /// Every request shares, whatever its key.
    Global,
}

/// The verifier-side scope of a request of API key `key_name` (none when the API is open)
/// with `salt`. Names and salts are hashed, so verifiers never see either.
pub fn scope_of(mode: PrefixCacheScope, key_name: Option<&str>, salt: &str) -> CacheScope {
    let key = match mode {
        PrefixCacheScope::Key => key_name,
        PrefixCacheScope::Global => None,
    };
    if key.is_none() && salt.is_empty() {
        return CacheScope::global();
    }
    let mut hash = Sha256::new();
    // Length-prefixed, so no key and salt pair reads as another.
    for part in [key.unwrap_or_default(), salt] {
        hash.update((part.len() as u64).to_le_bytes());
        hash.update(part.as_bytes());
    }
    hash.update([u8::from(key.is_some())]);
    let digest = hash.finalize();
    CacheScope(digest.iter().map(|b| format!("{b:02x}")).collect())
}

/// Checks a request's `cache_salt`.
pub fn check_salt(salt: &str) -> Result<(), Status> {
    if salt.len() > MAX_CACHE_SALT_BYTES {
        return Err(Status::invalid_argument(format!(
            "cache_salt: {} bytes, at most {MAX_CACHE_SALT_BYTES} are allowed",
            salt.len()
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scopes_separate_keys_and_salts_unless_global() {
        let open = scope_of(PrefixCacheScope::Key, None, "");
        assert_eq!(open, CacheScope::global());
        let a = scope_of(PrefixCacheScope::Key, Some("a"), "");
        let b = scope_of(PrefixCacheScope::Key, Some("b"), "");
        assert_ne!(a, b);
        assert_ne!(a, open);
        assert_eq!(a, scope_of(PrefixCacheScope::Key, Some("a"), ""));
        assert_ne!(a, scope_of(PrefixCacheScope::Key, Some("a"), "s"));
        // A key's name never reads as a salt.
        assert_ne!(
            scope_of(PrefixCacheScope::Key, Some("s"), ""),
            scope_of(PrefixCacheScope::Key, None, "s")
        );
        assert_eq!(scope_of(PrefixCacheScope::Global, Some("a"), ""), open);
        assert_eq!(
            scope_of(PrefixCacheScope::Global, Some("a"), "s"),
            scope_of(PrefixCacheScope::Global, Some("b"), "s")
        );
        assert_eq!(a.as_str().len(), 64);
    }

    #[test]
    fn long_salts_are_refused_naming_the_field() {
        assert!(check_salt(&"x".repeat(MAX_CACHE_SALT_BYTES)).is_ok());
        let err = check_salt(&"x".repeat(MAX_CACHE_SALT_BYTES + 1)).unwrap_err();
        assert_eq!(err.code(), tonic::Code::InvalidArgument);
        assert!(err.message().starts_with("cache_salt"));
    }
}
