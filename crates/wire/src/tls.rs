//! TLS for every specd listener and for the router's calls to its verifiers and drafters:
//! certificates and keys read from PEM files once at startup, with errors that name the flag
//! whose file is wrong.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use tokio_rustls::rustls;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity, ServerTlsConfig};

/// A TLS file that could not be used.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("{flag}: cannot read {path}: {source}")]
    Read {
        flag: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{flag}: {path} holds no PEM {what}")]
    NoPem {
        flag: &'static str,
        path: PathBuf,
        what: &'static str,
    },
    #[error("{flag}: {path}: {reason}")]
    Invalid {
        flag: &'static str,
        path: PathBuf,
        reason: String,
    },
    #[error("{0} and {1} go together: give both or neither")]
    Pair(&'static str, &'static str),
    #[error("TLS setup: {0}")]
    Setup(String),
    #[error("an https:// URL needs {0} (the CA its certificate chains to)")]
    HttpsWithoutCa(&'static str),
    #[error("{0} is set: use an https:// URL")]
    CaWithoutHttps(&'static str),
}

/// One PEM file and the flag it came from.
#[derive(Debug, Clone)]
struct PemFile {
    flag: &'static str,
    path: PathBuf,
    pem: Vec<u8>,
}

impl PemFile {
    fn read(flag: &'static str, path: &Path) -> Result<Self, TlsError> {
        let pem = std::fs::read(path).map_err(|source| TlsError::Read {
            flag,
            path: path.to_owned(),
            source,
        })?;
        Ok(Self {
            flag,
            path: path.to_owned(),
            pem,
        })
    }

    fn certificates(&self) -> Result<Vec<CertificateDer<'static>>, TlsError> {
        let certs = CertificateDer::pem_slice_iter(&self.pem)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| self.invalid(e.to_string()))?;
        if certs.is_empty() {
            return Err(TlsError::NoPem {
                flag: self.flag,
                path: self.path.clone(),
                what: "certificate",
            });
        }
        Ok(certs)
    }

    fn private_key(&self) -> Result<PrivateKeyDer<'static>, TlsError> {
        PrivateKeyDer::from_pem_slice(&self.pem).map_err(|e| match e {
            rustls::pki_types::pem::Error::NoItemsFound => TlsError::NoPem {
                flag: self.flag,
                path: self.path.clone(),
                what: "private key",
            },
            other => self.invalid(other.to_string()),
        })
    }

    fn roots(&self) -> Result<rustls::RootCertStore, TlsError> {
        let mut roots = rustls::RootCertStore::empty();
        for cert in self.certificates()? {
            roots.add(cert).map_err(|e| self.invalid(e.to_string()))?;
        }
        Ok(roots)
    }

    fn invalid(&self, reason: String) -> TlsError {
        TlsError::Invalid {
            flag: self.flag,
            path: self.path.clone(),
            reason,
        }
    }
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// A listener's certificate and key, and the CA its clients' certificates must chain to
/// when it requires them (mutual TLS).
#[derive(Debug, Clone)]
pub struct ServerTls {
    cert: PemFile,
    key: PemFile,
    client_ca: Option<PemFile>,
}

impl ServerTls {
    /// Reads and checks the files of `--tls-cert`, `--tls-key` and `--tls-client-ca`: `None`
    /// when neither certificate nor key is given (plaintext); a client CA without them is an
    /// error.
    pub fn from_files(
        cert: Option<&Path>,
        key: Option<&Path>,
        client_ca: Option<&Path>,
    ) -> Result<Option<Self>, TlsError> {
        let (cert, key) = match (cert, key) {
            (Some(cert), Some(key)) => (cert, key),
            (None, None) if client_ca.is_none() => return Ok(None),
            (None, None) => return Err(TlsError::Pair("--tls-client-ca", "--tls-cert")),
            _ => return Err(TlsError::Pair("--tls-cert", "--tls-key")),
        };
        let tls = Self {
            cert: PemFile::read("--tls-cert", cert)?,
            key: PemFile::read("--tls-key", key)?,
            client_ca: client_ca
                .map(|ca| PemFile::read("--tls-client-ca", ca))
                .transpose()?,
        };
        // Building the rustls configuration checks every file and that key and certificate
        // belong together, before the server starts.
        tls.rustls_config(Vec::new())?;
        Ok(Some(tls))
    }

    /// Whether clients must present a certificate.
    pub fn requires_client_certificates(&self) -> bool {
        self.client_ca.is_some()
    }

    /// The configuration of a gRPC (tonic) listener.
    pub fn grpc(&self) -> ServerTlsConfig {
        let config =
            ServerTlsConfig::new().identity(Identity::from_pem(&self.cert.pem, &self.key.pem));
        match &self.client_ca {
            Some(ca) => config.client_ca_root(Certificate::from_pem(&ca.pem)),
            None => config,
        }
    }

    /// The configuration of an HTTP/1.1 listener.
    pub fn http(&self) -> Result<Arc<rustls::ServerConfig>, TlsError> {
        self.rustls_config(vec![b"http/1.1".to_vec()]).map(Arc::new)
    }

    fn rustls_config(&self, alpn: Vec<Vec<u8>>) -> Result<rustls::ServerConfig, TlsError> {
        let builder = rustls::ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| TlsError::Setup(e.to_string()))?;
        let builder = match &self.client_ca {
            Some(ca) => {
                let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
                    Arc::new(ca.roots()?),
                    provider(),
                )
                .build()
                .map_err(|e| ca.invalid(e.to_string()))?;
                builder.with_client_cert_verifier(verifier)
            }
            None => builder.with_no_client_auth(),
        };
        let mut config = builder
            .with_single_cert(self.cert.certificates()?, self.key.private_key()?)
            .map_err(|e| self.key.invalid(format!("does not fit --tls-cert: {e}")))?;
        config.alpn_protocols = alpn;
        Ok(config)
    }
}

/// `endpoint` set up to dial its URL: over TLS with `tls` when the URL is https://, with the
/// server's certificate checked against `server_name` (the URL's host when `None`). A URL
/// whose scheme contradicts the TLS setting is refused, naming `ca_flag`, rather than
/// silently downgraded or failing at the first call.
pub fn secure_endpoint(
    endpoint: Endpoint,
    tls: Option<&ClientTls>,
    server_name: Option<&str>,
    ca_flag: &'static str,
) -> Result<Endpoint, TlsError> {
    let https = endpoint.uri().scheme_str() == Some("https");
    match (tls, https) {
        (Some(tls), true) => endpoint
            .tls_config(tls.config(server_name))
            .map_err(|e| TlsError::Setup(e.to_string())),
        (None, false) => Ok(endpoint),
        (None, true) => Err(TlsError::HttpsWithoutCa(ca_flag)),
        (Some(_), false) => Err(TlsError::CaWithoutHttps(ca_flag)),
    }
}

/// How a client reaches TLS servers: the CA their certificates chain to, and the
/// certificate it presents to servers that require one.
#[derive(Debug, Clone)]
pub struct ClientTls {
    ca: PemFile,
    identity: Option<(PemFile, PemFile)>,
}

impl ClientTls {
    /// Reads and checks the CA file and the optional client certificate and key; `flags`
    /// names the three flags, for errors. `None` when no file is given.
    pub fn from_files(
        ca: Option<&Path>,
        cert: Option<&Path>,
        key: Option<&Path>,
        flags: [&'static str; 3],
    ) -> Result<Option<Self>, TlsError> {
        let [ca_flag, cert_flag, key_flag] = flags;
        let identity = match (cert, key) {
            (Some(cert), Some(key)) => Some((
                PemFile::read(cert_flag, cert)?,
                PemFile::read(key_flag, key)?,
            )),
            (None, None) => None,
            _ => return Err(TlsError::Pair(cert_flag, key_flag)),
        };
        let Some(ca) = ca else {
            return match identity {
                None => Ok(None),
                Some(_) => Err(TlsError::Pair(cert_flag, ca_flag)),
            };
        };
        let tls = Self {
            ca: PemFile::read(ca_flag, ca)?,
            identity,
        };
        tls.ca.roots()?;
        if let Some((cert, key)) = &tls.identity {
            cert.certificates()?;
            key.private_key()?;
        }
        Ok(Some(tls))
    }

    /// The configuration of a connection to a server whose certificate names `server_name`
    /// (the URL's host when `None`).
    pub fn config(&self, server_name: Option<&str>) -> ClientTlsConfig {
        let mut config = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(&self.ca.pem));
        if let Some((cert, key)) = &self.identity {
            config = config.identity(Identity::from_pem(&cert.pem, &key.pem));
        }
        match server_name {
            Some(name) => config.domain_name(name),
            None => config,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
        let path = dir.join(name);
        std::fs::write(&path, text).unwrap();
        path
    }

    #[test]
    fn tls_files_are_checked_at_startup_naming_the_flag() {
        let dir = std::env::temp_dir().join(format!("specd-tls-unit-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let one = rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
        let two = rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
        let cert = write(&dir, "cert.pem", &one.cert.pem());
        let key = write(&dir, "key.pem", &one.signing_key.serialize_pem());
        let other_key = write(&dir, "other.pem", &two.signing_key.serialize_pem());
        let junk = write(&dir, "junk.pem", "not pem at all");

        let tls = ServerTls::from_files(Some(&cert), Some(&key), Some(&cert)).unwrap();
        assert!(tls.unwrap().requires_client_certificates());
        assert!(ServerTls::from_files(None, None, None).unwrap().is_none());

        let error = |result: Result<Option<ServerTls>, TlsError>| result.unwrap_err().to_string();
        let mismatched = error(ServerTls::from_files(Some(&cert), Some(&other_key), None));
        assert!(mismatched.starts_with("--tls-key"), "{mismatched}");
        let missing = error(ServerTls::from_files(
            Some(&dir.join("absent.pem")),
            Some(&key),
            None,
        ));
        assert!(missing.starts_with("--tls-cert: cannot read"), "{missing}");
        let no_cert = error(ServerTls::from_files(Some(&junk), Some(&key), None));
        assert!(no_cert.starts_with("--tls-cert"), "{no_cert}");
        let half = error(ServerTls::from_files(Some(&cert), None, None));
        assert!(half.contains("--tls-key"), "{half}");
        let ca_alone = error(ServerTls::from_files(None, None, Some(&cert)));
        assert!(ca_alone.contains("--tls-client-ca"), "{ca_alone}");

        let flags = [
            "--upstream-tls-ca",
            "--upstream-tls-cert",
            "--upstream-tls-key",
        ];
        assert!(ClientTls::from_files(None, None, None, flags)
            .unwrap()
            .is_none());
        assert!(ClientTls::from_files(Some(&cert), Some(&cert), Some(&key), flags).is_ok());
        let no_ca = ClientTls::from_files(None, Some(&cert), Some(&key), flags).unwrap_err();
        assert!(no_ca.to_string().contains("--upstream-tls-ca"), "{no_ca}");
        let bad_ca = ClientTls::from_files(Some(&junk), None, None, flags).unwrap_err();
        assert!(
            bad_ca.to_string().starts_with("--upstream-tls-ca"),
            "{bad_ca}"
        );
    }
}
