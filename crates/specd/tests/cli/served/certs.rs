//! Certificates made for a test: a CA, a server certificate for localhost and 127.0.0.1, and
//! a client certificate, written as PEM files into a fresh directory.

use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose,
};

/// The PEM files of one test's public-key infrastructure.
pub struct Pki {
    pub dir: PathBuf,
    pub ca: PathBuf,
    pub server_cert: PathBuf,
    pub server_key: PathBuf,
    pub client_cert: PathBuf,
    pub client_key: PathBuf,
}

impl Pki {
    /// A fresh CA and its certificates, in a directory named after `name`.
    pub fn generate(name: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("specd-pki-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca_params
            .distinguished_name
            .push(DnType::CommonName, format!("specd test CA {name}"));
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let ca = CertifiedIssuer::self_signed(ca_params, KeyPair::generate().unwrap()).unwrap();
        let leaf = |names: Vec<String>, usages: Vec<ExtendedKeyUsagePurpose>| {
            let mut params = CertificateParams::new(names).unwrap();
            params.extended_key_usages = usages;
            let key = KeyPair::generate().unwrap();
            let cert = params.signed_by(&key, &ca).unwrap();
            (cert.pem(), key.serialize_pem())
        };
        let (server_cert, server_key) = leaf(
            vec!["localhost".into(), "127.0.0.1".into()],
            // Probes present the server's own certificate to mutual-TLS ports.
            vec![
                ExtendedKeyUsagePurpose::ServerAuth,
                ExtendedKeyUsagePurpose::ClientAuth,
            ],
        );
        let (client_cert, client_key) = leaf(
            vec!["specd-router".into()],
            vec![ExtendedKeyUsagePurpose::ClientAuth],
        );
        let write = |file: &str, pem: &str| {
            let path = dir.join(file);
            std::fs::write(&path, pem).unwrap();
            path
        };
        Self {
            ca: write("ca.pem", &ca.pem()),
            server_cert: write("server.pem", &server_cert),
            server_key: write("server.key", &server_key),
            client_cert: write("client.pem", &client_cert),
            client_key: write("client.key", &client_key),
            dir,
        }
    }

    pub fn read(path: &Path) -> String {
        std::fs::read_to_string(path).unwrap()
    }
}
