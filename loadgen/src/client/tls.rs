//! TLS for `https://` targets, both backends: the roots to trust are
//! `--tls-ca FILE` (PEM, one or more certificates) or, without it, the
//! system's (rustls-native-certs). rustls on ring throughout.
//!
//! The gRPC backend hands the CA to tonic ([`grpc_config`]); the OpenAI
//! backend builds its own rustls client config ([`http_config`]) with ALPN
//! for the HTTP version it speaks.

use std::path::Path;
use std::sync::Arc;

use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::CertificateDer;
use tokio_rustls::rustls::{self, ClientConfig, RootCertStore};
use tonic::transport::{Certificate, ClientTlsConfig};

use crate::error::Error;

fn tls_error(path: &Path, reason: impl Into<String>) -> Error {
    Error::Tls {
        path: path.to_path_buf(),
        reason: reason.into(),
    }
}

/// The PEM file's text, with at least one certificate in it.
fn read_ca(path: &Path) -> Result<String, Error> {
    let pem = std::fs::read_to_string(path).map_err(|e| tls_error(path, e.to_string()))?;
    if !pem.contains("-----BEGIN CERTIFICATE-----") {
        return Err(tls_error(path, "holds no PEM certificate"));
    }
    Ok(pem)
}

/// The roots to trust: the CA file's certificates, or the system's.
fn roots(ca: Option<&Path>) -> Result<RootCertStore, Error> {
    let mut store = RootCertStore::empty();
    match ca {
        Some(path) => {
            let pem = read_ca(path)?;
            for cert in CertificateDer::pem_slice_iter(pem.as_bytes()) {
                let cert = cert.map_err(|e| tls_error(path, e.to_string()))?;
                store
                    .add(cert)
                    .map_err(|e| tls_error(path, e.to_string()))?;
            }
        }
        None => {
            let found = rustls_native_certs::load_native_certs();
            for e in &found.errors {
                tracing::warn!(error = %e, "reading a system root certificate failed");
            }
            let (added, ignored) = store.add_parsable_certificates(found.certs);
            tracing::debug!(added, ignored, "system root certificates");
        }
    }
    Ok(store)
}

/// A rustls client config for the OpenAI backend, offering `alpn`
/// (`h2` or `http/1.1`).
pub fn http_config(ca: Option<&Path>, alpn: &[u8]) -> Result<Arc<ClientConfig>, Error> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| Error::Internal(format!("rustls protocol versions: {e}")))?
        .with_root_certificates(roots(ca)?)
        .with_no_client_auth();
    config.alpn_protocols = vec![alpn.to_vec()];
    Ok(Arc::new(config))
}

/// tonic's TLS settings for the gRPC backend (the server name comes from
/// the target's host).
pub fn grpc_config(ca: Option<&Path>) -> Result<ClientTlsConfig, Error> {
    Ok(match ca {
        Some(path) => ClientTlsConfig::new().ca_certificate(Certificate::from_pem(read_ca(path)?)),
        None => ClientTlsConfig::new().with_native_roots(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_without_a_certificate_is_rejected() {
        let path = std::env::temp_dir().join(format!("lg-ca-{}.pem", std::process::id()));
        std::fs::write(&path, "not a certificate").expect("write");
        let err = http_config(Some(&path), b"h2").expect_err("no certificate");
        let _ = std::fs::remove_file(&path);
        assert!(
            err.to_string().contains("holds no PEM certificate"),
            "{err}"
        );
        let missing = grpc_config(Some(Path::new("/no/such/ca.pem"))).expect_err("missing");
        assert!(
            missing.to_string().starts_with("--tls-ca /no/such/ca.pem"),
            "{missing}"
        );
    }
}
