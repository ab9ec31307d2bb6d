//! API keys on the public API: clients send `authorization: Bearer KEY`; each key may have
//! its own limit of requests running at once.

use std::path::Path;
use std::sync::Arc;

use subtle::ConstantTimeEq;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tonic::Status;

/// The keys file could not be used.
#[derive(Debug, thiserror::Error)]
pub enum ApiKeysError {
    #[error("--api-keys-file: cannot read {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("--api-keys-file: line {line}: {reason}")]
    Line { line: usize, reason: &'static str },
    #[error("--api-keys-file: {path} holds no key")]
    Empty { path: String },
}

/// One accepted key.
struct ApiKey {
    /// What logs and errors call it: the name before `:` in the file, else `key N` (its line).
    name: String,
    secret: Vec<u8>,
    /// Its requests running at once, when limited.
    running: Option<Arc<Semaphore>>,
}

/// The keys the router accepts.
pub struct ApiKeys {
    keys: Vec<ApiKey>,
    max_per_key: usize,
}

impl std::fmt::Debug for ApiKeys {
    // Never prints a secret.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<&str> = self.keys.iter().map(|k| k.name.as_str()).collect();
        f.debug_struct("ApiKeys")
            .field("names", &names)
            .field("max_per_key", &self.max_per_key)
            .finish()
    }
}

/// A request's key: who it is, and its place under the key's limit while the request runs.
#[derive(Debug)]
pub struct KeyGrant {
    pub name: String,
    _running: Option<OwnedSemaphorePermit>,
}

/// Shortest key accepted: shorter ones are guessable.
const MIN_KEY_BYTES: usize = 16;

impl ApiKeys {
    /// Reads `path`: one key per line, optionally `name:key`; blank lines and lines starting
    /// with `#` are skipped. `max_per_key` limits each key's running requests (0: no limit).
    pub fn load(path: &Path, max_per_key: usize) -> Result<Self, ApiKeysError> {
        let text = std::fs::read_to_string(path).map_err(|source| ApiKeysError::Read {
            path: path.display().to_string(),
            source,
        })?;
        let keys = Self::parse(&text, max_per_key)?;
        if keys.keys.is_empty() {
            return Err(ApiKeysError::Empty {
                path: path.display().to_string(),
            });
        }
        Ok(keys)
    }

    /// The keys in `text`, in the file's format.
    pub fn parse(text: &str, max_per_key: usize) -> Result<Self, ApiKeysError> {
        let mut keys: Vec<ApiKey> = Vec::new();
        for (i, line) in text.lines().enumerate() {
            let line_no = i + 1;
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let (name, secret) = match line.split_once(':') {
                Some((name, secret)) => (name.trim().to_owned(), secret.trim()),
                None => (format!("key {line_no}"), line),
            };
            let error = |reason| ApiKeysError::Line {
                line: line_no,
                reason,
            };
            if name.is_empty() {
                return Err(error("empty name before ':'"));
            }
            if secret.len() < MIN_KEY_BYTES {
                return Err(error("key shorter than 16 characters"));
            }
            if secret.bytes().any(|b| b.is_ascii_whitespace()) {
                return Err(error("key contains whitespace"));
            }
            if keys.iter().any(|k| k.name == name) {
                return Err(error("name used twice"));
            }
            if keys.iter().any(|k| k.secret == secret.as_bytes()) {
                return Err(error("key listed twice"));
            }
            keys.push(ApiKey {
                name,
                secret: secret.as_bytes().to_vec(),
                running: (max_per_key > 0).then(|| Arc::new(Semaphore::new(max_per_key))),
            });
        }
        Ok(Self { keys, max_per_key })
    }

    /// Checks an `authorization` header value and takes a place under the key's limit:
    /// UNAUTHENTICATED without a known key, RESOURCE_EXHAUSTED (naming the key's name, never
    /// the key) at its limit.
    pub fn authorize(&self, authorization: Option<&str>) -> Result<KeyGrant, Status> {
        let presented = authorization
            .and_then(|value| {
                let (scheme, token) = value.trim().split_once(' ')?;
                scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
            })
            .ok_or_else(|| {
                Status::unauthenticated(
                    "authorization: send the API key as `authorization: Bearer KEY`",
                )
            })?;
        let key = self
            .find(presented.as_bytes())
            .ok_or_else(|| Status::unauthenticated("authorization: unknown API key"))?;
        let running = match &key.running {
            None => None,
            Some(running) => Some(running.clone().try_acquire_owned().map_err(|_| {
                Status::resource_exhausted(format!(
                    "max_requests_per_key: API key {:?} already runs its limit of {} requests",
                    key.name, self.max_per_key
                ))
            })?),
        };
        Ok(KeyGrant {
            name: key.name.clone(),
            _running: running,
        })
    }

    /// The key equal to `presented`, comparing every key in constant time so the time taken
    /// says nothing about how close a guess came.
    fn find(&self, presented: &[u8]) -> Option<&ApiKey> {
        let mut found = None;
        for key in &self.keys {
            if bool::from(key.secret.as_slice().ct_eq(presented)) {
                found = Some(key);
            }
        }
        found
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FILE: &str = "# team keys\nalice:sk-alice-0123456789abcdef\n\nsk-anonymous-0123456789\n";

    #[test]
    fn keys_are_named_and_checked() {
        let keys = ApiKeys::parse(FILE, 0).unwrap();
        let grant = keys
            .authorize(Some("Bearer sk-alice-0123456789abcdef"))
            .unwrap();
        assert_eq!(grant.name, "alice");
        let grant = keys
            .authorize(Some("bearer sk-anonymous-0123456789"))
            .unwrap();
        assert_eq!(grant.name, "key 4");
        for bad in [
            None,
            Some("sk-alice-0123456789abcdef"),
            Some("Basic sk-alice-0123456789abcdef"),
            Some("Bearer sk-alice-0123456789abcdeX"),
            Some("Bearer "),
        ] {
            let err = keys.authorize(bad).unwrap_err();
            assert_eq!(err.code(), tonic::Code::Unauthenticated, "{bad:?}");
            assert!(err.message().starts_with("authorization"), "{err}");
        }
    }

    #[test]
    fn each_key_has_its_own_limit() {
        let keys = ApiKeys::parse(FILE, 1).unwrap();
        let held = keys
            .authorize(Some("Bearer sk-alice-0123456789abcdef"))
            .unwrap();
        let err = keys
            .authorize(Some("Bearer sk-alice-0123456789abcdef"))
            .unwrap_err();
        assert_eq!(err.code(), tonic::Code::ResourceExhausted);
        assert!(err.message().contains("\"alice\""), "{err}");
        assert!(!err.message().contains("sk-alice"), "{err}");
        keys.authorize(Some("Bearer sk-anonymous-0123456789"))
            .unwrap();
        drop(held);
        keys.authorize(Some("Bearer sk-alice-0123456789abcdef"))
            .unwrap();
    }

    #[test]
    fn bad_files_name_the_line() {
        for (text, line) in [
            ("ok:sk-0123456789abcdef\nshort\n", 2),
            (":sk-0123456789abcdef\n", 1),
            ("a:sk-0123456789abcdef\na:sk-0123456789abcdeg\n", 2),
            ("a:sk-0123456789abcdef\nb:sk-0123456789abcdef\n", 2),
        ] {
            let err = ApiKeys::parse(text, 0).err().unwrap().to_string();
            assert!(err.contains(&format!("line {line}")), "{text:?}: {err}");
        }
        let debug = format!("{:?}", ApiKeys::parse(FILE, 0).unwrap());
        assert!(!debug.contains("sk-"), "{debug}");
    }
}
