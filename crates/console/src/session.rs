//! Console sessions: a random id in an HttpOnly, SameSite=Strict cookie, mapped in this process
//! to the principal that logged in, with the CSRF token its forms carry and a message for the
//! next page. Expires after [`SESSION_TTL`]; logging out ends it. Only the id's SHA-256 is a map
//! key, so a lookup's timing says nothing about the ids held.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use oncegate_grpc::auth::Principal;

/// How long a session lasts from its login.
pub const SESSION_TTL: Duration = Duration::from_secs(8 * 3600);

/// Sessions open at once, at most (the oldest is ended beyond it).
const MAX_SESSIONS: usize = 1024;

/// A logged-in person.
#[derive(Debug, Clone)]
pub struct Session {
    pub principal: Arc<Principal>,
    /// The token every state-changing form carries.
    pub csrf: String,
    started: Instant,
}

impl Session {
    /// Whether `typed` is this session's CSRF token (constant time).
    pub fn csrf_matches(&self, typed: &str) -> bool {
        !typed.is_empty() && bool::from(self.csrf.as_bytes().ct_eq(typed.as_bytes()))
    }
}

#[derive(Debug, Default)]
pub struct Sessions {
    open: Mutex<HashMap<String, Entry>>,
}

#[derive(Debug)]
struct Entry {
    session: Session,
    /// What the last action did, shown once on the next page.
    flash: Option<Flash>,
}

/// What a form did, shown once on the next page: a success, or a refusal (shown as an error) with
/// what the person typed, so that the form comes back filled in rather than empty.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Flash {
    pub message: String,
    /// Whether it is a refusal: nothing was changed.
    pub refused: bool,
    /// The refused form's fields, as typed (empty after a success).
    pub typed: HashMap<String, String>,
}

impl Flash {
    /// A form that did what it said.
    pub fn done(message: String) -> Self {
        Self {
            message,
            ..Self::default()
        }
    }

    /// A form the gate refused: nothing changed, and `typed` fills it in again.
    pub fn refused(message: String, typed: HashMap<String, String>) -> Self {
        Self {
            message,
            refused: true,
            typed,
        }
    }
}

/// 32 random bytes as hex.
pub fn random_token() -> String {
    let mut bytes = [0u8; 32];
    // No randomness at all is a broken system: refuse to make guessable ids.
    getrandom::fill(&mut bytes).expect("the system's random number generator failed");
    hex::encode(bytes)
}

fn digest(id: &str) -> String {
    hex::encode(Sha256::digest(id.as_bytes()))
}

impl Sessions {
    /// Starts a session for `principal`; returns its id (the cookie's value).
    pub fn start(&self, principal: Arc<Principal>) -> String {
        let id = random_token();
        let now = Instant::now();
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        open.retain(|_, e| now.duration_since(e.session.started) < SESSION_TTL);
        if open.len() >= MAX_SESSIONS
            && let Some(oldest) = open
                .iter()
                .min_by_key(|(_, e)| e.session.started)
                .map(|(k, _)| k.clone())
        {
            open.remove(&oldest);
        }
        let session = Session {
            principal,
            csrf: random_token(),
            started: now,
        };
        open.insert(
            digest(&id),
            Entry {
                session,
                flash: None,
            },
        );
        id
    }

    /// The live session of the cookie value `id`, with its message (taken: shown once).
    pub fn find(&self, id: &str) -> Option<(Session, Option<Flash>)> {
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        let key = digest(id);
        let entry = open.get_mut(&key)?;
        if entry.session.started.elapsed() >= SESSION_TTL {
            open.remove(&key);
            return None;
        }
        Some((entry.session.clone(), entry.flash.take()))
    }

    /// Leaves `flash` for the session's next page.
    pub fn flash(&self, id: &str, flash: Flash) {
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(entry) = open.get_mut(&digest(id)) {
            entry.flash = Some(flash);
        }
    }

    /// Ends the session of `id`.
    pub fn end(&self, id: &str) {
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        open.remove(&digest(id));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_session_is_found_by_its_id_until_it_ends() {
        let sessions = Sessions::default();
        let id = sessions.start(Arc::new(Principal::local_operator()));
        let (session, flash) = sessions.find(&id).unwrap();
        assert!(flash.is_none());
        assert!(session.csrf_matches(&session.csrf.clone()));
        assert!(!session.csrf_matches("") && !session.csrf_matches("x"));
        sessions.flash(&id, Flash::done("done".into()));
        assert_eq!(
            sessions.find(&id).unwrap().1,
            Some(Flash::done("done".into()))
        );
        assert!(sessions.find(&id).unwrap().1.is_none(), "shown once");
        assert!(sessions.find("other").is_none());
        sessions.end(&id);
        assert!(sessions.find(&id).is_none());
    }
}
