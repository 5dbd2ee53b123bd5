//! TLS for `https://` targets, both backends: the roots to trust are
//! `--tls-ca FILE` (PEM, one or more certificates) or, without it, the
//! system's (rustls-native-certs). rustls on ring throughout.
//!
//! Both backends check the server's certificate with [`GivenCertVerifier`]:
//! rustls' WebPKI verifier over those roots, plus one case it refuses and
//! curl, OpenSSL and Python accept: a self-signed certificate made the usual
//! way (`openssl req -x509`, which marks it `CA:TRUE`) that the server
//! presents as its own (`CaUsedAsEndEntity`). When that very certificate was
//! given with `--tls-ca` it is trusted as itself (its name must still match
//! the target's host, and the handshake's signature is still checked with
//! its key); any other CA certificate presented as a server's is refused
//! with a message saying what to do.
//!
//! The gRPC backend hands the verifier to tonic ([`grpc_config`]); the
//! OpenAI backend builds its own rustls client config ([`http_config`]) with
//! ALPN for the HTTP version it speaks.

use std::path::Path;
use std::sync::Arc;

use tokio_rustls::rustls::client::danger::{
    HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier,
};
use tokio_rustls::rustls::client::{verify_server_name, WebPkiServerVerifier};
use tokio_rustls::rustls::crypto::CryptoProvider;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use tokio_rustls::rustls::server::ParsedCertificate;
use tokio_rustls::rustls::{
    self, CertificateError, ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme,
};
use tonic::transport::ClientTlsConfig;

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

/// The certificates of `--tls-ca`.
fn ca_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, Error> {
    let pem = read_ca(path)?;
    CertificateDer::pem_slice_iter(pem.as_bytes())
        .map(|cert| cert.map_err(|e| tls_error(path, e.to_string())))
        .collect()
}

/// The roots to trust: the CA file's certificates, or the system's.
fn roots(given: &[CertificateDer<'static>], ca: Option<&Path>) -> Result<RootCertStore, Error> {
    let mut store = RootCertStore::empty();
    match ca {
        Some(path) => {
            for cert in given {
                store
                    .add(cert.clone())
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

/// WebPKI over the roots, and a certificate given with `--tls-ca` trusted
/// as itself when the server presents it (module docs).
#[derive(Debug)]
pub struct GivenCertVerifier {
    webpki: Arc<WebPkiServerVerifier>,
    /// The `--tls-ca` certificates (none with the system's roots).
    given: Vec<CertificateDer<'static>>,
}

impl GivenCertVerifier {
    /// The verifier for `--tls-ca` (or the system's roots without it).
    pub fn new(ca: Option<&Path>) -> Result<Arc<Self>, Error> {
        let given = match ca {
            Some(path) => ca_certs(path)?,
            None => Vec::new(),
        };
        let roots = Arc::new(roots(&given, ca)?);
        let webpki = WebPkiServerVerifier::builder_with_provider(roots, provider())
            .build()
            .map_err(|e| match ca {
                Some(path) => tls_error(path, e.to_string()),
                None => Error::Internal(format!("system root certificates: {e}")),
            })?;
        Ok(Arc::new(Self { webpki, given }))
    }
}

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Whether rustls refused `err` because the certificate is a CA's.
fn is_ca_used_as_end_entity(err: &rustls::Error) -> bool {
    match err {
        rustls::Error::InvalidCertificate(CertificateError::Other(other)) => matches!(
            other.0.downcast_ref::<webpki::Error>(),
            Some(webpki::Error::CaUsedAsEndEntity)
        ),
        _ => false,
    }
}

/// What to do about a CA certificate presented as a server's own.
pub const CA_AS_SERVER_HINT: &str = "the server's certificate is a CA certificate (basicConstraints CA:TRUE, as `openssl req -x509` makes it), which rustls refuses as a server's own: pass that certificate itself with --tls-ca to trust it, or give the server a certificate signed by a CA (CA:FALSE)";

impl ServerCertVerifier for GivenCertVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let err = match self.webpki.verify_server_cert(
            end_entity,
            intermediates,
            server_name,
            ocsp_response,
            now,
        ) {
            Ok(verified) => return Ok(verified),
            Err(err) => err,
        };
        if !is_ca_used_as_end_entity(&err) {
            return Err(err);
        }
        // WebPKI checks the validity period before the basic constraints,
        // so this certificate is within its dates.
        if !self.given.iter().any(|c| c.as_ref() == end_entity.as_ref()) {
            return Err(rustls::Error::General(CA_AS_SERVER_HINT.into()));
        }
        verify_server_name(&ParsedCertificate::try_from(end_entity)?, server_name)?;
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.webpki.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.webpki.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.webpki.supported_verify_schemes()
    }
}

/// A rustls client config for the OpenAI backend, offering `alpn`
/// (`h2` or `http/1.1`).
pub fn http_config(ca: Option<&Path>, alpn: &[u8]) -> Result<Arc<ClientConfig>, Error> {
    let mut config = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| Error::Internal(format!("rustls protocol versions: {e}")))?
        .dangerous()
        .with_custom_certificate_verifier(GivenCertVerifier::new(ca)?)
        .with_no_client_auth();
    config.alpn_protocols = vec![alpn.to_vec()];
    Ok(Arc::new(config))
}

/// tonic's TLS settings for the gRPC backend (the server name comes from
/// the target's host) and the verifier to pass with them
/// (`Endpoint::tls_config_with_verifier`).
pub fn grpc_config(ca: Option<&Path>) -> Result<(ClientTlsConfig, Arc<GivenCertVerifier>), Error> {
    Ok((ClientTlsConfig::new(), GivenCertVerifier::new(ca)?))
}

#[cfg(test)]
mod tests {
    use super::*;
    use rcgen::{BasicConstraints, CertificateParams, IsCa, KeyPair};

    fn temp_pem(name: &str, pem: &str) -> std::path::PathBuf {
        let path = std::env::temp_dir().join(format!("lg-{name}-{}.pem", std::process::id()));
        std::fs::write(&path, pem).expect("write");
        path
    }

    /// What `openssl req -x509 -subj /CN=localhost -addext
    /// subjectAltName=...` makes: self-signed, CA:TRUE, naming the hosts.
    /// Its DER and PEM.
    fn openssl_style(names: &[&str]) -> (CertificateDer<'static>, String) {
        let names: Vec<String> = names.iter().map(|s| s.to_string()).collect();
        let mut params = CertificateParams::new(names).expect("params");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let key = KeyPair::generate().expect("key");
        let cert = params.self_signed(&key).expect("certificate");
        (cert.der().clone(), cert.pem())
    }

    fn verify(v: &GivenCertVerifier, cert: &CertificateDer<'_>, host: &str) -> Result<(), String> {
        let name = ServerName::try_from(host.to_string()).expect("name");
        v.verify_server_cert(cert, &[], &name, &[], UnixTime::now())
            .map(drop)
            .map_err(|e| e.to_string())
    }

    #[test]
    fn a_file_without_a_certificate_is_rejected() {
        let path = temp_pem("no-cert", "not a certificate");
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

    #[test]
    fn a_self_signed_ca_certificate_given_with_tls_ca_is_trusted_as_itself() {
        let (cert, pem) = openssl_style(&["localhost", "127.0.0.1"]);
        let path = temp_pem("ca-true", &pem);
        let verifier = GivenCertVerifier::new(Some(&path)).expect("verifier");
        let _ = std::fs::remove_file(&path);
        // WebPKI alone refuses it: the case being fixed.
        let localhost = ServerName::try_from("localhost").expect("name");
        let plain = verifier
            .webpki
            .verify_server_cert(&cert, &[], &localhost, &[], UnixTime::now())
            .expect_err("webpki alone refuses a CA certificate as a server's");
        assert!(is_ca_used_as_end_entity(&plain), "{plain}");
        verify(&verifier, &cert, "localhost").expect("trusted as itself");
        verify(&verifier, &cert, "127.0.0.1").expect("its IP name too");
        // Its names still count.
        let err = verify(&verifier, &cert, "example.com").expect_err("wrong host");
        assert!(err.contains("not valid for name"), "{err}");
        // Another CA certificate presented as a server's: refused, saying
        // what to do.
        let (other, _) = openssl_style(&["localhost"]);
        let err = verify(&verifier, &other, "localhost").expect_err("not the given one");
        assert!(
            err.contains("pass that certificate itself with --tls-ca"),
            "{err}"
        );
    }
}
