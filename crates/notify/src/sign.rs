//! Standard Webhooks signatures: `webhook-signature: v1,<base64(HMAC-SHA256(key,
//! "{webhook-id}.{webhook-timestamp}.{body}"))>`, one per secret, space-separated, so that a
//! receiver that knows either the old or the new secret accepts a delivery while a secret rotates.
//! Secrets are written `whsec_<base64 of the key>`; the key is 24 to 64 bytes.

use base64::{Engine as _, engine::general_purpose::STANDARD};
use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;

/// One signing secret. Its `Debug` never shows the key.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret {
    key: Vec<u8>,
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Secret(whsec_…, {} bytes)", self.key.len())
    }
}

/// The shortest and longest key a secret may hold, in bytes.
pub const KEY_BYTES: std::ops::RangeInclusive<usize> = 24..=64;

impl Secret {
    /// Parses `whsec_<base64>`; the message says what is wrong, never the secret.
    pub fn parse(text: &str) -> Result<Self, String> {
        let encoded = text
            .trim()
            .strip_prefix("whsec_")
            .ok_or("a secret is written whsec_<base64>")?;
        let key = STANDARD
            .decode(encoded)
            .map_err(|_| "a secret's part after whsec_ is not base64")?;
        if !KEY_BYTES.contains(&key.len()) {
            return Err(format!(
                "a secret's key is {} bytes; it must be {} to {}",
                key.len(),
                KEY_BYTES.start(),
                KEY_BYTES.end()
            ));
        }
        Ok(Self { key })
    }

    /// The `v1,<base64>` signature of one delivery.
    pub fn sign(&self, id: &str, timestamp: i64, body: &[u8]) -> String {
        format!("v1,{}", STANDARD.encode(self.mac(id, timestamp, body)))
    }

    fn mac(&self, id: &str, timestamp: i64, body: &[u8]) -> Vec<u8> {
        // Any key length is valid for HMAC.
        let mut mac = <Hmac<Sha256> as KeyInit>::new_from_slice(&self.key)
            .unwrap_or_else(|_| unreachable!("HMAC takes keys of any length"));
        mac.update(id.as_bytes());
        mac.update(b".");
        mac.update(timestamp.to_string().as_bytes());
        mac.update(b".");
        mac.update(body);
        mac.finalize().into_bytes().to_vec()
    }

    /// Whether `header` (a `webhook-signature` value) holds a valid `v1` signature by this secret
    /// (compared in constant time): what a receiver checks.
    pub fn verifies(&self, header: &str, id: &str, timestamp: i64, body: &[u8]) -> bool {
        use subtle::ConstantTimeEq as _;
        let expected = self.mac(id, timestamp, body);
        header.split(' ').any(|signature| {
            signature
                .strip_prefix("v1,")
                .and_then(|b64| STANDARD.decode(b64).ok())
                .is_some_and(|mac| bool::from(mac.ct_eq(&expected)))
        })
    }
}

/// The `webhook-signature` header of one delivery: one signature per secret, space-separated;
/// `None` without secrets.
pub fn signature_header(
    secrets: &[Secret],
    id: &str,
    timestamp: i64,
    body: &[u8],
) -> Option<String> {
    (!secrets.is_empty()).then(|| {
        secrets
            .iter()
            .map(|s| s.sign(id, timestamp, body))
            .collect::<Vec<_>>()
            .join(" ")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The Standard Webhooks specification's published test vector.
    const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
    const ID: &str = "msg_p5jXN8AQM9LWM0D4loKWxJek";
    const TIMESTAMP: i64 = 1614265330;
    const BODY: &str = r#"{"test": 2432232314}"#;
    const SIGNATURE: &str = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=";

    #[test]
    fn the_specification_vector_signs_and_verifies() {
        let secret = Secret::parse(SECRET).unwrap();
        assert_eq!(secret.sign(ID, TIMESTAMP, BODY.as_bytes()), SIGNATURE);
        assert!(secret.verifies(SIGNATURE, ID, TIMESTAMP, BODY.as_bytes()));
        assert!(!secret.verifies(SIGNATURE, ID, TIMESTAMP + 1, BODY.as_bytes()));
        assert!(!secret.verifies(SIGNATURE, ID, TIMESTAMP, b"{\"test\": 1}"));
    }

    #[test]
    fn rotation_signs_once_per_secret() {
        let old = Secret::parse(SECRET).unwrap();
        let new = Secret::parse(&format!("whsec_{}", STANDARD.encode([7u8; 32]))).unwrap();
        let header =
            signature_header(&[old.clone(), new.clone()], ID, TIMESTAMP, BODY.as_bytes()).unwrap();
        let parts: Vec<&str> = header.split(' ').collect();
        assert_eq!(parts.len(), 2);
        assert_eq!(parts[0], SIGNATURE);
        assert!(old.verifies(&header, ID, TIMESTAMP, BODY.as_bytes()));
        assert!(new.verifies(&header, ID, TIMESTAMP, BODY.as_bytes()));
        assert_eq!(signature_header(&[], ID, TIMESTAMP, b""), None);
    }

    #[test]
    fn bad_secrets_say_why_without_showing_them() {
        for (text, why) in [
            ("MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", "whsec_"),
            ("whsec_not base64!", "base64"),
            ("whsec_c2hvcnQ=", "5 bytes"),
        ] {
            let e = Secret::parse(text).unwrap_err();
            assert!(e.contains(why), "{text}: {e}");
            assert!(!e.contains(text.trim_start_matches("whsec_")), "{e}");
        }
        let debug = format!("{:?}", Secret::parse(SECRET).unwrap());
        assert!(!debug.contains("MfKQ"), "{debug}");
    }
}
