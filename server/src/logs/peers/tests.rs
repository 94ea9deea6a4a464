//! The peers' trust follows `--peer-ca-file` through a CA rotation.

use std::sync::{Arc, Mutex};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::*;

const NAME: &str = "rollouts-dispatch.rollouts-dispatch.svc";

struct Ca {
    pem: String,
    issuer: Issuer<'static, KeyPair>,
}

impl Ca {
    fn new(name: &str) -> Self {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let pem = params.self_signed(&key).unwrap().pem();
        Self {
            pem,
            issuer: Issuer::new(params, key),
        }
    }

    /// A server config with a certificate of this CA for the Service name.
    fn serving(&self) -> Arc<rustls::ServerConfig> {
        use rustls::pki_types::pem::PemObject;
        use rustls::pki_types::{CertificateDer, PrivateKeyDer};
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(vec![NAME.to_string()]).unwrap();
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        let chain = vec![CertificateDer::from_pem_slice(cert.pem().as_bytes()).unwrap()];
        let key = PrivateKeyDer::from_pem_slice(key.serialize_pem().as_bytes()).unwrap();
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        Arc::new(
            rustls::ServerConfig::builder_with_provider(provider)
                .with_safe_default_protocol_versions()
                .unwrap()
                .with_no_client_auth()
                .with_single_cert(chain, key)
                .unwrap(),
        )
    }
}

/// A replica answering 200 to everything, with the certificate `served` holds at each handshake.
async fn replica(served: Arc<Mutex<Arc<rustls::ServerConfig>>>) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let config = served.lock().unwrap().clone();
            tokio::spawn(async move {
                let Ok(mut tls) = tokio_rustls::TlsAcceptor::from(config).accept(tcp).await else {
                    return;
                };
                let mut buf = [0u8; 4096];
                let _ = tls.read(&mut buf).await;
                let reply = "HTTP/1.1 200 OK\r\ncontent-length: 0\r\nconnection: close\r\n\r\n";
                let _ = tls.write_all(reply.as_bytes()).await;
                let _ = tls.shutdown().await;
            });
        }
    });
    addr
}

async fn reaches(transport: &PeerTransport, owner: SocketAddr) -> bool {
    let (client, url) = transport.client_for(owner, "/x").unwrap();
    client.get(url).send().await.is_ok()
}

#[tokio::test]
async fn the_peer_ca_file_is_followed_through_a_ca_rotation() {
    let dir = std::env::temp_dir().join(format!("rd-peers-ca-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (old, new) = (Ca::new("old ca"), Ca::new("new ca"));
    let served = Arc::new(Mutex::new(old.serving()));
    let owner = replica(served.clone()).await;
    let ca_file = dir.join("ca.crt");
    std::fs::write(&ca_file, &old.pem).unwrap();
    let transport = PeerTransport::tls_every(NAME, &ca_file, Duration::ZERO).unwrap();
    assert!(reaches(&transport, owner).await);

    // The bundle of both CAs, then the replicas' certificate of the new CA: trusted.
    std::fs::write(&ca_file, format!("{}{}", old.pem, new.pem)).unwrap();
    *served.lock().unwrap() = new.serving();
    assert!(
        reaches(&transport, owner).await,
        "the bundle's new CA is trusted"
    );
    // The new CA alone: a certificate of the old one is refused.
    std::fs::write(&ca_file, &new.pem).unwrap();
    assert!(reaches(&transport, owner).await);
    *served.lock().unwrap() = old.serving();
    assert!(!reaches(&transport, owner).await, "the old CA is retired");
    // A broken file keeps the CA in force.
    *served.lock().unwrap() = new.serving();
    std::fs::write(&ca_file, "not pem").unwrap();
    assert!(reaches(&transport, owner).await);
    std::fs::remove_dir_all(dir).ok();
}
