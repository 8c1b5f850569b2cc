//! The arguments of a `tools/call` exactly as the client sent them.
//!
//! rmcp parses every message into `serde_json` values before a handler runs, and their numbers
//! are doubles: `0.100000000000000001` arrives as `0.1`, `1e-400` as `0`, and a duplicated member
//! as its last value. The gate must judge and fingerprint what was sent (docs/CONTRACT.md: numbers
//! are exact, duplicates are refused), as it does for `params_json` over gRPC. So each transport
//! captures the text of `params.arguments` from the bytes it received, before rmcp parses them,
//! and hands it to the handler in the request's extensions: the stdio transport
//! ([`super::stdio`]) on the message itself, the HTTP layer ([`super::serve`]) on the HTTP
//! request, whose parts rmcp passes on to the handler. The handler reads it back with [`of`].
//!
//! Arguments rmcp cannot read as an object (one holding a number beyond the double range,
//! `1e400`, or no object at all, `[1]`) would cost the whole message (over stdio it would go
//! unanswered) or be refused by rmcp in words of its own. [`prepare`] hands rmcp the message with
//! `{}` in their place instead, and marks the call as not forwardable: the gate judges (and
//! refuses) the text as sent, as over gRPC, and nothing reaches the upstream.
//!
//! Owns the capture and the lookup; decides nothing. A call whose text was not captured (its
//! `id`, `name` or `arguments` cannot be read unambiguously, say a member given twice) is not
//! guessed at: the gated call is refused.

use std::{borrow::Cow, sync::Arc};

use rmcp::{RoleServer, model::RequestId, service::RequestContext};
use serde::Deserialize;
use serde_json::value::RawValue;

/// One `tools/call` as sent: its id, tool name and arguments text (`None`: no arguments).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SentCall {
    id: RequestId,
    name: String,
    arguments: Option<Arc<str>>,
    /// rmcp was given `{}` in place of arguments it could not parse.
    replaced: bool,
}

/// The arguments of the call a handler runs, as sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sent {
    /// Their text (`{}` when the call had none).
    pub text: String,
    /// False when rmcp could not read them (so they cannot be forwarded as sent).
    pub forwardable: bool,
}

/// The members of a JSON-RPC message that name a `tools/call` (others are ignored; one of these
/// given twice fails the parse, so nothing ambiguous is captured).
#[derive(Deserialize)]
struct Message<'a> {
    id: Option<RequestId>,
    #[serde(borrow)]
    method: Option<Cow<'a, str>>,
    #[serde(borrow)]
    params: Option<Params<'a>>,
}

#[derive(Deserialize)]
struct Params<'a> {
    #[serde(borrow)]
    name: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    arguments: Given<'a>,
}

/// A member's text when it is there, `null` included (an `Option` would read `null` as absent,
/// and `"arguments": null` is not an object: the gate refuses it as the gRPC API does).
#[derive(Default)]
struct Given<'a>(Option<&'a RawValue>);

impl<'de: 'a, 'a> Deserialize<'de> for Given<'a> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        <&'a RawValue>::deserialize(d).map(|raw| Self(Some(raw)))
    }
}

/// What a message carries for the handler: `Some` for a `tools/call` request whose id, name and
/// arguments could be read from `text` unambiguously.
pub fn capture(text: &str) -> Option<SentCall> {
    read(text).map(|(call, _)| call)
}

/// The call, and where its arguments' text starts in `text`.
fn read(text: &str) -> Option<(SentCall, Option<usize>)> {
    let message: Message = serde_json::from_str(text).ok()?;
    if message.method.as_deref() != Some("tools/call") {
        return None;
    }
    let params = message.params?;
    let raw = params.arguments.0;
    // The raw value borrows from `text`: its address says where it is.
    let at = raw.map(|raw| raw.get().as_ptr() as usize - text.as_ptr() as usize);
    let call = SentCall {
        id: message.id?,
        name: params.name?.into_owned(),
        arguments: raw.map(|raw| Arc::from(raw.get())),
        replaced: false,
    };
    Some((call, at))
}

/// A message as rmcp is to read it, and the call it carries when it is a `tools/call`: `text`
/// itself, or, when rmcp could not read the arguments as an object, `text` with `{}` in their
/// place. (`null` it reads as no arguments; the gate refuses it as no object.)
pub fn prepare(text: &str) -> (Cow<'_, str>, Option<SentCall>) {
    let Some((mut call, at)) = read(text) else {
        return (Cow::Borrowed(text), None);
    };
    let (Some(at), Some(arguments)) = (at, call.arguments.clone()) else {
        return (Cow::Borrowed(text), Some(call));
    };
    let object = serde_json::from_str::<serde_json::Map<String, serde_json::Value>>(&arguments);
    if object.is_ok() || arguments.as_ref() == "null" {
        return (Cow::Borrowed(text), Some(call));
    }
    call.replaced = true;
    let end = at + arguments.len();
    let readable = format!("{}{{}}{}", &text[..at], &text[end..]);
    (Cow::Owned(readable), Some(call))
}

/// The arguments of the `tools/call` of `tool` that `context` handles, as sent; `None` when the
/// transport captured nothing for it.
pub fn of(context: &RequestContext<RoleServer>, tool: &str) -> Option<Sent> {
    let sent = context.extensions.get::<SentCall>().or_else(|| {
        context
            .extensions
            .get::<http::request::Parts>()
            .and_then(|parts| parts.extensions.get::<SentCall>())
    })?;
    if sent.id != context.id || sent.name != tool {
        return None;
    }
    Some(Sent {
        text: sent.arguments.as_deref().unwrap_or("{}").to_owned(),
        forwardable: !sent.replaced,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_arguments_text_is_kept_as_sent() {
        let line = r#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"_meta":{"x":1.5},"name":"pay","arguments":{ "amount" : 0.100000000000000001, "a":1, "a":2 }}}"#;
        let sent = capture(line).unwrap();
        assert_eq!(sent.id, RequestId::Number(7));
        assert_eq!(sent.name, "pay");
        assert_eq!(
            sent.arguments.as_deref(),
            Some(r#"{ "amount" : 0.100000000000000001, "a":1, "a":2 }"#)
        );
        let escaped = r#"{"id":"x","method":"tools\/call","params":{"name":"p\u0061y"}}"#;
        let sent = capture(escaped).unwrap();
        assert_eq!((sent.name.as_str(), sent.arguments), ("pay", None));
        let null = r#"{"id":1,"method":"tools/call","params":{"name":"p","arguments":null}}"#;
        assert_eq!(capture(null).unwrap().arguments.as_deref(), Some("null"));
    }

    #[test]
    fn arguments_rmcp_cannot_parse_are_replaced_for_it_and_kept_as_sent() {
        let line = r#"{"id":2,"method":"tools/call","params":{"name":"pay","arguments":{"n":1e400},"_meta":{"k":"v"}}}"#;
        let (readable, call) = prepare(line);
        assert_eq!(
            readable,
            r#"{"id":2,"method":"tools/call","params":{"name":"pay","arguments":{},"_meta":{"k":"v"}}}"#
        );
        let call = call.unwrap();
        assert_eq!(call.arguments.as_deref(), Some(r#"{"n":1e400}"#));
        assert!(call.replaced);
        let fine =
            r#"{"id":2,"method":"tools/call","params":{"name":"pay","arguments":{"n":1e300}}}"#;
        let (readable, call) = prepare(fine);
        assert!(matches!(readable, Cow::Borrowed(_)) && !call.unwrap().replaced);
        let array = r#"{"id":3,"method":"tools/call","params":{"name":"pay","arguments":[1e400]}}"#;
        let (readable, call) = prepare(array);
        assert!(readable.contains(r#""arguments":{}"#) && call.unwrap().replaced);
    }

    #[test]
    fn nothing_ambiguous_or_foreign_is_captured() {
        for line in [
            // A member rmcp reads one way and a probe could read another.
            r#"{"id":1,"method":"tools/call","params":{"name":"pay","arguments":{"a":1},"arguments":{"a":2}}}"#,
            r#"{"id":1,"method":"tools/call","params":{"name":"pay"},"params":{"name":"x"}}"#,
            r#"{"id":1,"id":2,"method":"tools/call","params":{"name":"pay"}}"#,
            // Not a tools/call request.
            r#"{"id":1,"method":"tools/list","params":{"name":"pay","arguments":{}}}"#,
            r#"{"method":"tools/call","params":{"name":"pay","arguments":{}}}"#,
            r#"{"id":1,"method":"tools/call","params":{"name":"pay","arguments":{}}"#,
        ] {
            assert_eq!(capture(line), None, "{line}");
        }
    }
}
