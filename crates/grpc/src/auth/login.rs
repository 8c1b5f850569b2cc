//! One-time login codes for the operator console: an operator who already holds a credential (the
//! local operator on the admin socket, or a named operator) asks the gate for a code
//! (`CreateConsoleLogin`, `oncegate admin console-login`) and pastes it into the console's login
//! form, which redeems it for a session as that same principal. A code is short-lived, works
//! once, and only on the gate process that issued it; it is typed into a form, never put in a URL.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use subtle::ConstantTimeEq;

use super::Principal;

/// How long a login code works.
pub const LOGIN_CODE_TTL: Duration = Duration::from_secs(300);

/// Codes not yet redeemed, at most this many (the oldest are dropped beyond it).
const MAX_OPEN_CODES: usize = 64;

/// The login codes this gate issued and not yet redeemed. Cheap to clone.
#[derive(Debug, Clone, Default)]
pub struct LoginCodes {
    open: Arc<Mutex<HashMap<String, Open>>>,
}

/// An open code's principal and when it was issued.
type Open = (Arc<Principal>, Instant);

/// A code as issued: what to type, and how long it works.
#[derive(Debug, Clone)]
pub struct LoginCode {
    pub code: String,
    pub ttl: Duration,
}

impl LoginCodes {
    /// A new code that logs in as `principal`, for [`LOGIN_CODE_TTL`]. Fails only when the system
    /// has no randomness.
    pub fn issue(&self, principal: Arc<Principal>) -> Result<LoginCode, String> {
        // 10 random bytes in Crockford's base32: 16 characters, 80 bits, shown in groups of four
        // for typing.
        let mut bytes = [0u8; 10];
        getrandom::fill(&mut bytes).map_err(|e| format!("no randomness for a login code: {e}"))?;
        let code = group(&base32(&bytes));
        let now = Instant::now();
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        open.retain(|_, (_, issued)| now.duration_since(*issued) < LOGIN_CODE_TTL);
        if open.len() >= MAX_OPEN_CODES
            && let Some(oldest) = open
                .iter()
                .min_by_key(|(_, (_, t))| *t)
                .map(|(c, _)| c.clone())
        {
            open.remove(&oldest);
        }
        open.insert(normalize(&code), (principal, now));
        Ok(LoginCode {
            code,
            ttl: LOGIN_CODE_TTL,
        })
    }

    /// The principal of `typed`, once: the code is spent whether or not it had expired. Spaces,
    /// dashes and case do not matter. Compared in constant time with every open code.
    pub fn redeem(&self, typed: &str) -> Option<Arc<Principal>> {
        let typed = normalize(typed);
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        let mut found = None;
        for code in open.keys() {
            if bool::from(code.as_bytes().ct_eq(typed.as_bytes())) {
                found = Some(code.clone());
            }
        }
        let (principal, issued) = open.remove(&found?)?;
        (issued.elapsed() < LOGIN_CODE_TTL).then_some(principal)
    }
}

/// Crockford's base32: no I, L, O or U to misread.
const ALPHABET: &[u8; 32] = b"0123456789ABCDEFGHJKMNPQRSTVWXYZ";

fn base32(bytes: &[u8]) -> String {
    let mut out = String::new();
    let (mut acc, mut bits) = (0u32, 0u32);
    for &b in bytes {
        acc = (acc << 8) | u32::from(b);
        bits += 8;
        while bits >= 5 {
            bits -= 5;
            out.push(ALPHABET[((acc >> bits) & 31) as usize] as char);
        }
    }
    out
}

fn group(code: &str) -> String {
    let chars: Vec<char> = code.chars().collect();
    chars
        .chunks(4)
        .map(|c| c.iter().collect::<String>())
        .collect::<Vec<_>>()
        .join("-")
}

fn normalize(typed: &str) -> String {
    typed
        .chars()
        .filter(|c| c.is_ascii_alphanumeric())
        .map(|c| match c.to_ascii_uppercase() {
            'O' => '0',
            'I' | 'L' => '1',
            c => c,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_code_logs_in_once_as_who_asked() {
        let codes = LoginCodes::default();
        let issued = codes.issue(Arc::new(Principal::local_operator())).unwrap();
        assert_eq!(issued.code.len(), 19, "{}", issued.code);
        assert!(codes.redeem("nope").is_none());
        let typed = issued.code.to_lowercase().replace('-', " ");
        let principal = codes.redeem(&typed).unwrap();
        assert_eq!(principal.name, super::super::LOCAL_OPERATOR);
        assert!(codes.redeem(&issued.code).is_none(), "single use");
    }
}
