//! Certificates and keys of one test cluster, generated in-process with `rcgen` (no openssl).
//!
//! One self-signed CA signs the kube-apiserver serving certificate; a separate ECDSA key signs
//! and verifies service-account tokens. All keys are ECDSA P-256 in PKCS#8 PEM, which every
//! Kubernetes component accepts.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};

/// Paths of the PEM files written by [`write`].
#[derive(Debug, Clone)]
pub(crate) struct PkiFiles {
    /// CA certificate (also the trust anchor in the kubeconfig).
    pub(crate) ca_cert: PathBuf,
    /// kube-apiserver serving certificate.
    pub(crate) server_cert: PathBuf,
    /// kube-apiserver serving key.
    pub(crate) server_key: PathBuf,
    /// Service-account signing key (private).
    pub(crate) sa_key: PathBuf,
    /// Service-account verification key (public).
    pub(crate) sa_pub: PathBuf,
    /// The CA certificate, PEM.
    pub(crate) ca_pem: String,
}

/// Subject alternative names of the serving certificate: loopback, the in-cluster names, and the
/// namespace ends of `make faults`' links ([`crate::netfault::LINK_ADDRESSES`]).
const SERVER_SANS: [&str; 13] = [
    crate::netfault::LINK_ADDRESSES[0],
    crate::netfault::LINK_ADDRESSES[1],
    crate::netfault::LINK_ADDRESSES[2],
    crate::netfault::LINK_ADDRESSES[3],
    "127.0.0.1",
    "::1",
    "localhost",
    "10.96.0.1",
    // a real node's address (node::NODE_IP), which the API server advertises to pods
    "10.244.0.1",
    "kubernetes",
    "kubernetes.default",
    "kubernetes.default.svc",
    "kubernetes.default.svc.cluster.local",
];

/// Generates the cluster's CA, serving certificate and service-account key into `dir`.
pub(crate) fn write(dir: &Path, cluster_name: &str) -> Result<PkiFiles> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;

    let (ca_pem, issuer) = ca(&format!("rollouts-dispatch test ca {cluster_name}"))?;
    let (server_cert, server_key) = serving(&issuer, &SERVER_SANS, "kube-apiserver")?;

    let sa_key = KeyPair::generate().context("generating the service-account key")?;

    let files = PkiFiles {
        ca_cert: dir.join("ca.crt"),
        server_cert: dir.join("apiserver.crt"),
        server_key: dir.join("apiserver.key"),
        sa_key: dir.join("sa.key"),
        sa_pub: dir.join("sa.pub"),
        ca_pem,
    };
    write_file(&files.ca_cert, &files.ca_pem)?;
    write_file(&files.server_cert, &server_cert)?;
    write_file(&files.server_key, &server_key)?;
    write_file(&files.sa_key, &sa_key.serialize_pem())?;
    write_file(&files.sa_pub, &sa_key.public_key_pem())?;
    Ok(files)
}

/// A self-signed CA named `common_name`: its certificate (PEM) and what signs with it.
pub(crate) fn ca(common_name: &str) -> Result<(String, Issuer<'static, KeyPair>)> {
    let ca_key = KeyPair::generate().context("generating the ca key")?;
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).context("ca params")?;
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(DnType::CommonName, common_name);
    ca_params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let ca_cert = ca_params
        .self_signed(&ca_key)
        .context("self-signing the ca certificate")?;
    Ok((ca_cert.pem(), Issuer::new(ca_params, ca_key)))
}

/// A serving certificate for `sans` (names and IP addresses) signed by `issuer`:
/// (certificate PEM, key PEM).
pub(crate) fn serving(
    issuer: &Issuer<'static, KeyPair>,
    sans: &[&str],
    common_name: &str,
) -> Result<(String, String)> {
    let server_key = KeyPair::generate().context("generating the serving key")?;
    let mut server_params =
        CertificateParams::new(sans.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>())
            .context("serving certificate params")?;
    server_params
        .distinguished_name
        .push(DnType::CommonName, common_name);
    server_params.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    server_params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    let server_cert = server_params
        .signed_by(&server_key, issuer)
        .context("signing the serving certificate")?;
    Ok((server_cert.pem(), server_key.serialize_pem()))
}

pub(crate) fn write_file(path: &Path, contents: &str) -> Result<()> {
    std::fs::write(path, contents).with_context(|| format!("writing {}", path.display()))
}
