//! API keys (`--api-key`, `--api-key-file`), checked the same way at both
//! front doors: `Authorization: Bearer KEY` on HTTP, `authorization: Bearer
//! KEY` metadata on gRPC.
//!
//! Keys are kept only as SHA-256 digests, so neither `Debug` output nor a
//! memory dump of the config shows them. A presented key is digested and
//! compared with every configured digest in constant time (`subtle`), all of
//! them every time: how long a check takes says nothing about which key, or
//! how much of one, matched, nor about the keys' lengths. Keys are never
//! logged; a bad one on the command line is reported without its value.
//!
//! Health (`grpc.health.v1`, `GET /health`) and `GET /version` stay open, so
//! orchestrators need no key; the doors decide which routes ask for one.

use std::path::Path;

use ring::digest::{digest, SHA256};
use subtle::{Choice, ConstantTimeEq};

/// One `--api-key` value as clap parsed it. Parsing never fails (clap would
/// echo the value in its error); [`ApiKeys::new`] validates without showing
/// it. `Debug` is redacted.
#[derive(Clone)]
pub struct ApiKey(String);

impl std::str::FromStr for ApiKey {
    type Err = std::convert::Infallible;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(Self(s.to_string()))
    }
}

impl std::fmt::Debug for ApiKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ApiKey(<redacted>)")
    }
}

/// The configured keys (digests); empty = no key needed.
#[derive(Clone, Default)]
pub struct ApiKeys {
    digests: Vec<[u8; 32]>,
}

impl std::fmt::Debug for ApiKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ApiKeys({} keys, redacted)", self.digests.len())
    }
}

/// A key or key file that cannot be used; the message names the flag and
/// never the key.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct KeyError(pub String);

/// Why a request was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    #[error("missing API key: send `authorization: Bearer <key>`")]
    Missing,
    #[error("invalid API key")]
    Invalid,
}

/// Longest key accepted (a header value, not a document).
pub const MAX_KEY_BYTES: usize = 1024;

fn sha256(bytes: &[u8]) -> [u8; 32] {
    let mut out = [0u8; 32];
    out.copy_from_slice(digest(&SHA256, bytes).as_ref());
    out
}

/// A key must fit a header value unchanged: 1 to [`MAX_KEY_BYTES`] visible
/// ASCII characters, no spaces.
fn check_key(key: &str) -> Result<(), String> {
    if key.is_empty() {
        return Err("is empty".into());
    }
    if key.len() > MAX_KEY_BYTES {
        return Err(format!("is longer than {MAX_KEY_BYTES} bytes"));
    }
    if !key.bytes().all(|b| b.is_ascii_graphic()) {
        return Err("may only hold visible ASCII characters (no spaces)".into());
    }
    Ok(())
}

impl ApiKeys {
    /// The keys of `--api-key` (in order) and `--api-key-file` (one per
    /// line; blank lines and lines starting with `#` are skipped).
    pub fn new(flags: &[ApiKey], file: Option<&Path>) -> Result<Self, KeyError> {
        let mut digests = Vec::new();
        for (i, key) in flags.iter().enumerate() {
            check_key(&key.0)
                .map_err(|why| KeyError(format!("--api-key (number {}) {why}", i + 1)))?;
            digests.push(sha256(key.0.as_bytes()));
        }
        if let Some(path) = file {
            let text = std::fs::read_to_string(path).map_err(|e| {
                KeyError(format!(
                    "--api-key-file {}: cannot read: {e}",
                    path.display()
                ))
            })?;
            let before = digests.len();
            for (n, line) in text.lines().enumerate() {
                let key = line.trim();
                if key.is_empty() || key.starts_with('#') {
                    continue;
                }
                check_key(key).map_err(|why| {
                    KeyError(format!(
                        "--api-key-file {} line {}: the key {why}",
                        path.display(),
                        n + 1
                    ))
                })?;
                digests.push(sha256(key.as_bytes()));
            }
            if digests.len() == before {
                return Err(KeyError(format!(
                    "--api-key-file {}: no keys in it (one per line)",
                    path.display()
                )));
            }
        }
        Ok(Self { digests })
    }

    /// Whether any key is configured (else every request passes).
    pub fn enabled(&self) -> bool {
        !self.digests.is_empty()
    }

    pub fn len(&self) -> usize {
        self.digests.len()
    }

    pub fn is_empty(&self) -> bool {
        self.digests.is_empty()
    }

    /// Checks an `authorization` header value (`Bearer KEY`; the scheme is
    /// case-insensitive). Passes everything when no key is configured.
    pub fn check(&self, authorization: Option<&[u8]>) -> Result<(), AuthError> {
        if !self.enabled() {
            return Ok(());
        }
        let value = authorization.ok_or(AuthError::Missing)?;
        let token = bearer_token(value).ok_or(AuthError::Missing)?;
        if self.matches(token) {
            Ok(())
        } else {
            Err(AuthError::Invalid)
        }
    }

    /// Compares `token`'s digest with every key's, in constant time.
    fn matches(&self, token: &[u8]) -> bool {
        let presented = sha256(token);
        let mut found = Choice::from(0);
        for d in &self.digests {
            found |= d.ct_eq(&presented);
        }
        bool::from(found)
    }
}

/// The gRPC door's check, as a tonic interceptor in front of
/// `ember.v1.Inference` (health and reflection are separate services and stay
/// open): UNAUTHENTICATED without a configured key.
pub fn grpc_interceptor(
    keys: ApiKeys,
) -> impl FnMut(tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> + Clone {
    move |req: tonic::Request<()>| {
        let value = req.metadata().get("authorization").map(|v| v.as_bytes());
        match keys.check(value) {
            Ok(()) => Ok(req),
            Err(e) => {
                crate::metrics::rejected("unauthenticated", crate::metrics::FrontDoor::Grpc);
                tracing::debug!(reason = %e, "gRPC call refused: API key");
                Err(tonic::Status::unauthenticated(e.to_string()))
            }
        }
    }
}

/// The token of a `Bearer TOKEN` header value (one or more spaces between).
fn bearer_token(value: &[u8]) -> Option<&[u8]> {
    let (scheme, rest) = value.split_at(value.iter().position(|&b| b == b' ')?);
    if !scheme.eq_ignore_ascii_case(b"bearer") {
        return None;
    }
    let token = rest.trim_ascii();
    (!token.is_empty()).then_some(token)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(list: &[&str]) -> ApiKeys {
        let flags: Vec<ApiKey> = list.iter().map(|k| k.parse().unwrap()).collect();
        ApiKeys::new(&flags, None).unwrap()
    }

    #[test]
    fn no_keys_lets_everything_through() {
        let k = keys(&[]);
        assert!(!k.enabled());
        assert_eq!(k.check(None), Ok(()));
    }

    #[test]
    fn bearer_keys_are_checked() {
        let k = keys(&["sk-one", "sk-two"]);
        assert_eq!(k.check(Some(b"Bearer sk-one")), Ok(()));
        assert_eq!(k.check(Some(b"bearer sk-two")), Ok(()));
        assert_eq!(k.check(Some(b"BEARER   sk-two ")), Ok(()));
        assert_eq!(k.check(Some(b"Bearer sk-three")), Err(AuthError::Invalid));
        assert_eq!(k.check(Some(b"Bearer sk-on")), Err(AuthError::Invalid));
        assert_eq!(k.check(Some(b"Bearer sk-one1")), Err(AuthError::Invalid));
        assert_eq!(k.check(Some(b"Bearer ")), Err(AuthError::Missing));
        assert_eq!(k.check(Some(b"Basic sk-one")), Err(AuthError::Missing));
        assert_eq!(k.check(Some(b"sk-one")), Err(AuthError::Missing));
        assert_eq!(k.check(None), Err(AuthError::Missing));
    }

    #[test]
    fn the_comparison_looks_at_every_key() {
        // A match on the last key still passes (no early exit can skip it),
        // and a key's prefix or extension never does.
        let many: Vec<String> = (0..50).map(|i| format!("key-{i}")).collect();
        let refs: Vec<&str> = many.iter().map(String::as_str).collect();
        let k = keys(&refs);
        assert!(k.matches(b"key-49"));
        assert!(k.matches(b"key-0"));
        assert!(!k.matches(b"key-"));
        assert!(!k.matches(b"key-50"));
        assert!(!k.matches(b"key-490"));
        assert!(!k.matches(b""));
    }

    #[test]
    fn debug_output_never_shows_a_key() {
        let flag: ApiKey = "sk-secret-value".parse().unwrap();
        assert!(!format!("{flag:?}").contains("secret"));
        let k = keys(&["sk-secret-value"]);
        let shown = format!("{k:?}");
        assert!(!shown.contains("secret"), "{shown}");
        assert!(shown.contains("1 keys"), "{shown}");
    }

    #[test]
    fn bad_keys_name_the_flag_not_the_key() {
        let bad = |k: &str| {
            let flags = vec![k.parse::<ApiKey>().unwrap()];
            ApiKeys::new(&flags, None).unwrap_err().0
        };
        let e = bad("has space");
        assert!(e.starts_with("--api-key (number 1)"), "{e}");
        assert!(!e.contains("has space"), "{e}");
        assert!(bad("").contains("is empty"));
        assert!(bad(&"k".repeat(MAX_KEY_BYTES + 1)).contains("longer"));
    }

    #[test]
    fn key_files_hold_one_key_per_line() {
        let dir = std::env::temp_dir().join(format!("ember-keys-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("keys");
        std::fs::write(&file, "# team keys\nsk-a\n\n  sk-b  \n").unwrap();
        let flags = vec!["sk-c".parse::<ApiKey>().unwrap()];
        let k = ApiKeys::new(&flags, Some(&file)).unwrap();
        assert_eq!(k.len(), 3);
        for key in ["sk-a", "sk-b", "sk-c"] {
            assert_eq!(k.check(Some(format!("Bearer {key}").as_bytes())), Ok(()));
        }
        std::fs::write(&file, "# nothing\n\n").unwrap();
        let e = ApiKeys::new(&[], Some(&file)).unwrap_err().0;
        assert!(
            e.starts_with("--api-key-file") && e.contains("no keys"),
            "{e}"
        );
        std::fs::write(&file, "sk-a\nsk b\n").unwrap();
        let e = ApiKeys::new(&[], Some(&file)).unwrap_err().0;
        assert!(e.contains("line 2") && !e.contains("sk b"), "{e}");
        let e = ApiKeys::new(&[], Some(&dir.join("missing"))).unwrap_err().0;
        assert!(
            e.starts_with("--api-key-file") && e.contains("cannot read"),
            "{e}"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
