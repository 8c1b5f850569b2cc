//! Credentials from hostile bytes: the `authorization` header parser, client-certificate
//! identities from arbitrary DER, and the action-key decoder. Never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use oncegate_domain::ActionKey;
use oncegate_grpc::{auth, tls};

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    if let Some(key) = auth::bearer(&text) {
        assert!(!key.is_empty() && text.contains(key));
    }
    let _ = tls::identities(data);
    if let Some(key) = ActionKey::decode(data) {
        assert_eq!(key.encode(), data);
    }
});
