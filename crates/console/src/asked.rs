//! A logged-in person's request as the pages see it: the session, the query string, the message
//! left by the last form; and form and query parsing.

use std::{collections::HashMap, sync::Arc};

use super::{
    Console,
    session::{Flash, Session},
};
use oncegate_grpc::auth::Principal;

/// A parsed form or query string (the first value of each name).
pub type Fields = HashMap<String, String>;

pub fn fields(bytes: &[u8]) -> Fields {
    let mut out = Fields::new();
    for (k, v) in form_urlencoded::parse(bytes) {
        out.entry(k.into_owned()).or_insert_with(|| v.into_owned());
    }
    out
}

/// The request of a logged-in person, as the pages and operations see it.
pub struct Asked<'a> {
    pub console: &'a Console,
    pub session: &'a Session,
    pub session_id: &'a str,
    pub query: Fields,
    pub flash: Option<Flash>,
}

impl Asked<'_> {
    pub fn principal(&self) -> &Arc<Principal> {
        &self.session.principal
    }

    /// What the person typed into the form the gate just refused, if `wanted` says it is this
    /// form (matching its hidden fields): the page fills the form in again with it.
    pub fn typed(&self, wanted: &[(&str, &str)]) -> Option<&Fields> {
        let flash = self.flash.as_ref().filter(|f| f.refused)?;
        wanted
            .iter()
            .all(|(name, value)| flash.typed.get(*name).map(String::as_str) == Some(*value))
            .then_some(&flash.typed)
    }
}
