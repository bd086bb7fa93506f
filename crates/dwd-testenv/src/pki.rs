//! Certificates for one test environment: a CA, a serving certificate for 127.0.0.1,
//! client certificates for any user, and the service-account signing key.
//!
//! Everything is generated fresh per environment (ECDSA P-256, fast to make), so no key
//! material is ever committed and environments never trust each other.

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose, SanType,
};
use std::net::{IpAddr, Ipv4Addr};

use crate::TestEnvError;

/// A PEM certificate with its PEM private key.
#[derive(Clone)]
pub struct CertAndKey {
    /// PEM-encoded certificate.
    pub cert_pem: String,
    /// PEM-encoded PKCS#8 private key.
    pub key_pem: String,
    /// DER certificate, for rustls.
    pub cert_der: Vec<u8>,
    /// DER PKCS#8 private key, for rustls.
    pub key_der: Vec<u8>,
}

impl std::fmt::Debug for CertAndKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print key material, even in test output.
        f.debug_struct("CertAndKey").finish_non_exhaustive()
    }
}

/// The certificate authority of one environment and what it has issued.
pub struct Pki {
    ca: CertifiedIssuer<'static, KeyPair>,
    /// Serving certificate for every apiserver and front door (SANs 127.0.0.1, localhost).
    pub serving: CertAndKey,
    /// Service-account token signing key (PEM, PKCS#8).
    pub service_account_key_pem: String,
    /// Its public key (PEM), which apiservers verify tokens with.
    pub service_account_pub_pem: String,
}

fn pki_err(what: &str, e: rcgen::Error) -> TestEnvError {
    TestEnvError::Pki(format!("{what}: {e}"))
}

impl Pki {
    /// Generates a CA, a serving certificate and a service-account key.
    pub fn generate() -> Result<Self, TestEnvError> {
        let mut params =
            CertificateParams::new(Vec::<String>::new()).map_err(|e| pki_err("CA params", e))?;
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(DnType::CommonName, "dwd-testenv-ca");
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let ca_key = KeyPair::generate().map_err(|e| pki_err("CA key", e))?;
        let ca = CertifiedIssuer::self_signed(params, ca_key)
            .map_err(|e| pki_err("CA certificate", e))?;

        let mut pki = Pki {
            ca,
            serving: CertAndKey {
                cert_pem: String::new(),
                key_pem: String::new(),
                cert_der: Vec::new(),
                key_der: Vec::new(),
            },
            service_account_key_pem: String::new(),
            service_account_pub_pem: String::new(),
        };
        pki.serving = pki.issue_serving()?;
        let sa_key = KeyPair::generate().map_err(|e| pki_err("service-account key", e))?;
        pki.service_account_key_pem = sa_key.serialize_pem();
        pki.service_account_pub_pem = sa_key.public_key_pem();
        Ok(pki)
    }

    /// The CA certificate (PEM).
    pub fn ca_pem(&self) -> String {
        self.ca.pem()
    }

    fn issue_serving(&self) -> Result<CertAndKey, TestEnvError> {
        let mut params = CertificateParams::new(vec!["localhost".to_string()])
            .map_err(|e| pki_err("serving params", e))?;
        params
            .subject_alt_names
            .push(SanType::IpAddress(IpAddr::V4(Ipv4Addr::LOCALHOST)));
        params
            .distinguished_name
            .push(DnType::CommonName, "kube-apiserver");
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        self.sign(params, "serving certificate")
    }

    /// Issues a client certificate: CN = user, O = each group (Kubernetes' x509 authenticator).
    pub fn issue_client(&self, user: &str, groups: &[&str]) -> Result<CertAndKey, TestEnvError> {
        let mut params = CertificateParams::new(Vec::<String>::new())
            .map_err(|e| pki_err("client params", e))?;
        params.distinguished_name.push(DnType::CommonName, user);
        for group in groups {
            params
                .distinguished_name
                .push(DnType::OrganizationName, *group);
        }
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        self.sign(params, &format!("client certificate for {user}"))
    }

    fn sign(&self, params: CertificateParams, what: &str) -> Result<CertAndKey, TestEnvError> {
        let key = KeyPair::generate().map_err(|e| pki_err(what, e))?;
        let cert = params
            .signed_by(&key, &self.ca)
            .map_err(|e| pki_err(what, e))?;
        Ok(CertAndKey {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
            cert_der: cert.der().to_vec(),
            key_der: key.serialize_der(),
        })
    }
}
