//! Certificates made by the tests themselves (rcgen): a CA, the gate's server certificate for
//! `localhost`/127.0.0.1, client certificates by common name, and a rogue CA the gate does not
//! trust; the files a process reads them from, and a TLS channel that presents them.

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    SanType,
};
use tempfile::TempDir;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

/// A PEM certificate and its private key.
pub struct Pem {
    pub cert: String,
    pub key: String,
}

/// A CA that signs server and client certificates.
pub struct Ca {
    pub pem: String,
    issuer: Issuer<'static, KeyPair>,
}

impl Ca {
    /// A self-signed CA named `name`.
    pub fn new(name: &str) -> Self {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        let key = KeyPair::generate().unwrap();
        let cert = params.self_signed(&key).unwrap();
        Self {
            pem: cert.pem(),
            issuer: Issuer::new(params, key),
        }
    }

    /// The gate's certificate: SANs `localhost` and 127.0.0.1.
    pub fn server(&self) -> Pem {
        let mut params = CertificateParams::new(vec!["localhost".to_owned()]).unwrap();
        params
            .subject_alt_names
            .push(SanType::IpAddress("127.0.0.1".parse().unwrap()));
        params
            .distinguished_name
            .push(DnType::CommonName, "oncegate");
        params
            .extended_key_usages
            .push(ExtendedKeyUsagePurpose::ServerAuth);
        self.sign(params)
    }

    /// A client certificate whose subject CN is `name`.
    pub fn client(&self, name: &str) -> Pem {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.distinguished_name.push(DnType::CommonName, name);
        params
            .extended_key_usages
            .push(ExtendedKeyUsagePurpose::ClientAuth);
        self.sign(params)
    }

    fn sign(&self, params: CertificateParams) -> Pem {
        let key = KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        Pem {
            cert: cert.pem(),
            key: key.serialize_pem(),
        }
    }
}

/// The certificates of a test with the principals of [`super::principals`]: a CA, the gate's
/// server certificate, the worker's and the operator's client certificates (their certificate
/// identities), and a stranger's the CA signed but no principal names.
pub struct Pki {
    pub ca: Ca,
    pub server: Pem,
    pub worker: Pem,
    pub ops: Pem,
    pub stranger: Pem,
}

impl Pki {
    /// Fresh certificates from a fresh CA.
    pub fn new() -> Self {
        let ca = Ca::new("oncegate test CA");
        Self {
            server: ca.server(),
            worker: ca.client("worker.billing"),
            ops: ca.client("ops.example"),
            stranger: ca.client("stranger.example"),
            ca,
        }
    }
}

impl Default for Pki {
    fn default() -> Self {
        Self::new()
    }
}

/// The files an `oncegate serve --tls-*` process or `oncegate admin --ca/--cert/--key` reads.
pub struct PkiFiles {
    pub dir: TempDir,
}

impl PkiFiles {
    /// Writes `ca.pem`, `server.pem`/`server.key` and `<name>.pem`/`<name>.key` per client.
    pub fn write(ca: &Ca, server: &Pem, clients: &[(&str, &Pem)]) -> Self {
        let dir = TempDir::new().unwrap();
        std::fs::write(dir.path().join("ca.pem"), &ca.pem).unwrap();
        std::fs::write(dir.path().join("server.pem"), &server.cert).unwrap();
        std::fs::write(dir.path().join("server.key"), &server.key).unwrap();
        for (name, pem) in clients {
            std::fs::write(dir.path().join(format!("{name}.pem")), &pem.cert).unwrap();
            std::fs::write(dir.path().join(format!("{name}.key")), &pem.key).unwrap();
        }
        Self { dir }
    }

    /// The path of one of the files, as a flag value.
    pub fn path(&self, name: &str) -> String {
        self.dir.path().join(name).to_str().unwrap().to_owned()
    }
}

/// A TLS channel to the gate at `addr` (its certificate checked against `ca_pem` as `localhost`),
/// with a client certificate when given.
pub async fn tls_channel(
    addr: &str,
    ca_pem: &str,
    client: Option<&Pem>,
) -> Result<Channel, String> {
    let mut config = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(ca_pem))
        .domain_name("localhost");
    if let Some(pem) = client {
        config = config.identity(Identity::from_pem(&pem.cert, &pem.key));
    }
    Endpoint::from_shared(format!("https://{addr}"))
        .unwrap()
        .tls_config(config)
        .unwrap()
        .connect()
        .await
        .map_err(|e| format!("{e:?}"))
}
