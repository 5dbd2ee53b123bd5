//! TLS for both front doors (`--tls-cert`, `--tls-key`: PEM files).
//!
//! [`TlsIdentity::load`] reads and checks both files at startup, before
//! anything else starts: a missing or unreadable file, a file without a PEM
//! certificate or private key, or a key that does not belong to the
//! certificate stops the server with a message naming the flag. The same
//! identity then serves gRPC (tonic's rustls, ALPN `h2`) and HTTP
//! (tokio-rustls, ALPN `h2` and `http/1.1`). Crypto is rustls' `ring`
//! provider, chosen explicitly (no process-wide default is needed). The
//! private key never appears in `Debug` output.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::ServerConfig;

/// A certificate chain and its private key, checked to belong together.
#[derive(Clone)]
pub struct TlsIdentity {
    cert_path: PathBuf,
    cert_pem: Vec<u8>,
    key_pem: Vec<u8>,
    /// The HTTP listener's rustls configuration.
    http: Arc<ServerConfig>,
}

impl std::fmt::Debug for TlsIdentity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsIdentity")
            .field("cert", &self.cert_path)
            .field("key", &"<redacted>")
            .finish()
    }
}

/// A TLS file that cannot be used; the message names the flag.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct TlsError(pub String);

/// ALPN protocols of the HTTP listener, preferred first.
const HTTP_ALPN: [&[u8]; 2] = [b"h2", b"http/1.1"];

fn read(flag: &str, path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path)
        .map_err(|e| TlsError(format!("{flag} {}: cannot read: {e}", path.display())))
}

impl TlsIdentity {
    /// Reads and checks `--tls-cert` (the chain, leaf first) and `--tls-key`.
    pub fn load(cert: &Path, key: &Path) -> Result<Self, TlsError> {
        let cert_pem = read("--tls-cert", cert)?;
        let key_pem = read("--tls-key", key)?;
        let chain = CertificateDer::pem_slice_iter(&cert_pem)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| TlsError(format!("--tls-cert {}: bad PEM: {e}", cert.display())))?;
        if chain.is_empty() {
            return Err(TlsError(format!(
                "--tls-cert {}: no PEM certificate in it",
                cert.display()
            )));
        }
        let private = PrivateKeyDer::from_pem_slice(&key_pem).map_err(|e| {
            TlsError(format!(
                "--tls-key {}: no usable PEM private key (PKCS#8, PKCS#1 or SEC1): {e}",
                key.display()
            ))
        })?;
        let mut http =
            ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
                .with_safe_default_protocol_versions()
                .map_err(|e| TlsError(format!("TLS setup: {e}")))?
                .with_no_client_auth()
                .with_single_cert(chain, private)
                .map_err(|e| {
                    TlsError(format!(
                        "--tls-key {} does not fit --tls-cert {}: {e}",
                        key.display(),
                        cert.display()
                    ))
                })?;
        http.alpn_protocols = HTTP_ALPN.iter().map(|p| p.to_vec()).collect();
        Ok(Self {
            cert_path: cert.to_path_buf(),
            cert_pem,
            key_pem,
            http: Arc::new(http),
        })
    }

    /// tonic's server TLS configuration with this identity.
    pub fn grpc(&self) -> tonic::transport::ServerTlsConfig {
        let identity = tonic::transport::Identity::from_pem(&self.cert_pem, &self.key_pem);
        tonic::transport::ServerTlsConfig::new().identity(identity)
    }

    /// The HTTP listener's TLS acceptor.
    pub fn http_acceptor(&self) -> tokio_rustls::TlsAcceptor {
        tokio_rustls::TlsAcceptor::from(Arc::clone(&self.http))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Files {
        dir: PathBuf,
    }

    impl Files {
        fn new(tag: &str) -> Self {
            let dir = std::env::temp_dir().join(format!("ember-tls-{tag}-{}", std::process::id()));
            std::fs::create_dir_all(&dir).unwrap();
            Self { dir }
        }

        fn write(&self, name: &str, text: &str) -> PathBuf {
            let path = self.dir.join(name);
            std::fs::write(&path, text).unwrap();
            path
        }
    }

    impl Drop for Files {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }

    fn self_signed() -> (String, String) {
        let c = rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
        (c.cert.pem(), c.signing_key.serialize_pem())
    }

    #[test]
    fn a_matching_pair_loads_and_the_key_is_redacted() {
        let files = Files::new("ok");
        let (cert, key) = self_signed();
        let id = TlsIdentity::load(&files.write("c.pem", &cert), &files.write("k.pem", &key))
            .expect("loads");
        let shown = format!("{id:?}");
        assert!(
            shown.contains("<redacted>") && !shown.contains("PRIVATE"),
            "{shown}"
        );
        assert_eq!(
            id.http.alpn_protocols,
            vec![b"h2".to_vec(), b"http/1.1".to_vec()]
        );
    }

    #[test]
    fn bad_files_name_the_flag() {
        let files = Files::new("bad");
        let (cert, key) = self_signed();
        let (_, other_key) = self_signed();
        let cert = files.write("c.pem", &cert);
        let key = files.write("k.pem", &key);
        let other_key = files.write("other.pem", &other_key);
        let junk = files.write("junk.pem", "not a certificate\n");
        let missing = files.dir.join("missing.pem");
        let err = |c: &Path, k: &Path| TlsIdentity::load(c, k).unwrap_err().0;
        let e = err(&missing, &key);
        assert!(
            e.starts_with("--tls-cert") && e.contains("cannot read"),
            "{e}"
        );
        let e = err(&cert, &missing);
        assert!(
            e.starts_with("--tls-key") && e.contains("cannot read"),
            "{e}"
        );
        let e = err(&junk, &key);
        assert!(
            e.starts_with("--tls-cert") && e.contains("no PEM certificate"),
            "{e}"
        );
        let e = err(&cert, &junk);
        assert!(
            e.starts_with("--tls-key") && e.contains("private key"),
            "{e}"
        );
        // The key as the certificate: no certificate in it.
        let e = err(&key, &key);
        assert!(e.starts_with("--tls-cert"), "{e}");
        let e = err(&cert, &other_key);
        assert!(
            e.starts_with("--tls-key") && e.contains("does not fit"),
            "{e}"
        );
    }
}
