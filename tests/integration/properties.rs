//! Property tests over the code the fuzz targets drive (`fuzz/`): params parsing and
//! canonicalisation, request validation, credentials and cursors. They run in `make test`; the
//! fuzzers search the same code for longer with coverage guidance.

use oncegate_domain::{
    ActionKey,
    fingerprint::{self, KeyFields, ParamsLimits},
};
use oncegate_gate::{TokenCall, policy::Policies, request::prepare_token};
use oncegate_grpc::auth;
use oncegate_store::ListCursor;
use proptest::prelude::*;
use serde_json::{Map, Value};

/// JSON values within the limits JCS represents exactly.
fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        (-(1i64 << 53)..=(1i64 << 53)).prop_map(Value::from),
        (-1.0e15f64..1.0e15).prop_map(Value::from),
        "[a-zA-Z0-9 é€\\\\\"/~\u{1}]{0,8}".prop_map(Value::String),
    ];
    leaf.prop_recursive(4, 32, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::btree_map("[a-z/~]{1,4}", inner, 0..4)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

fn json_object() -> impl Strategy<Value = Map<String, Value>> {
    prop::collection::btree_map("[a-z/~é]{1,5}", json_value(), 0..6)
        .prop_map(|m| m.into_iter().collect())
}

/// The same object written differently: members reversed, pretty-printed.
fn rewritten(map: &Map<String, Value>) -> String {
    fn reverse(v: &Value) -> Value {
        match v {
            Value::Object(m) => {
                let mut out = Map::new();
                for (k, v) in m.iter().rev() {
                    out.insert(k.clone(), reverse(v));
                }
                Value::Object(out)
            }
            Value::Array(items) => Value::Array(items.iter().map(reverse).collect()),
            other => other.clone(),
        }
    }
    serde_json::to_string_pretty(&reverse(&Value::Object(map.clone()))).unwrap()
}

fn fp(text: &str) -> Result<String, fingerprint::ParamsError> {
    let params = fingerprint::parse_params(text, ParamsLimits::default())?;
    Ok(fingerprint::fingerprint(
        "pay",
        "",
        &fingerprint::select(&params, &KeyFields::All),
    ))
}

fn policies() -> Policies {
    crate::support::policies(
        "[limits]\nmax_id_bytes = 16\nmax_params_depth = 4\n[actions.\"pay\"]\nkey_fields = [\"/a\"]\n",
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn parse_params_never_panics(text in "\\PC{0,64}|[\\[\\]{}\":,0-9eE.+-]{0,64}") {
        let _ = fingerprint::parse_params(&text, ParamsLimits::default());
    }

    #[test]
    fn fingerprints_ignore_member_order_and_whitespace(map in json_object()) {
        let compact = serde_json::to_string(&Value::Object(map.clone())).unwrap();
        let a = fp(&compact);
        prop_assert!(a.is_ok(), "{compact}: {a:?}");
        prop_assert_eq!(a.clone().unwrap(), fp(&rewritten(&map)).unwrap());
        // The canonical form's params parse back to the same fingerprint.
        let params = fingerprint::parse_params(&compact, ParamsLimits::default()).unwrap();
        let canonical = fingerprint::canonical_form("pay", "", &fingerprint::select(&params, &KeyFields::All));
        let doc: Value = serde_json::from_str(&canonical).unwrap();
        prop_assert_eq!(fp(&doc["params"].to_string()).unwrap(), a.unwrap());
    }

    #[test]
    fn a_changed_key_field_changes_the_fingerprint_and_is_named(map in json_object(), name in "[a-z]{1,3}") {
        let mut changed = map.clone();
        let old = changed.get(&name).cloned();
        changed.insert(name.clone(), Value::from(old.map_or(0, |_| 1) + 7_000_000));
        prop_assume!(map.get(&name) != changed.get(&name));
        // The fingerprint and the field digests of params `m`.
        let hash = |m: &Map<String, Value>| {
            let text = serde_json::to_string(&Value::Object(m.clone())).unwrap();
            let params = fingerprint::parse_params(&text, ParamsLimits::default()).unwrap();
            let selection = fingerprint::select(&params, &KeyFields::All);
            (
                fingerprint::fingerprint("pay", "", &selection),
                fingerprint::field_digests("pay", "", &selection),
            )
        };
        let (a, b) = (hash(&map), hash(&changed));
        prop_assert_ne!(&a.0, &b.0);
        let differing = fingerprint::differing_fields(&a.1, &b.1);
        let pointer = format!("/{}", name);
        prop_assert_eq!(differing, vec![pointer]);
    }

    #[test]
    fn validation_refuses_with_invalid_request_or_prepares_a_consistent_key(
        agent in "\\PC{0,20}", run in "[a-z]{0,20}", action in "pay|p[a-z]{0,3}|", params in "\\{\\}|\\{\"a\":[0-9]{1,20}\\}|[\\[\\]{}\":a0-9]{0,12}",
        key in "[a-z]{0,20}", lease in proptest::option::of(-5i64..100_000_000),
    ) {
        let call = TokenCall {
            agent_id: agent.clone(),
            run_id: run.clone(),
            action,
            params_json: params,
            idempotency_key: key.clone(),
            lease,
            ..TokenCall::default()
        };
        let policies = policies();
        let policy = policies.for_action(&call.action);
        match prepare_token(&policies.limits, policy, call, "t".into()) {
            Ok(p) => {
                prop_assert_eq!(&p.key.agent_id, &agent);
                prop_assert!(!agent.is_empty() && agent.len() <= 16 && !run.is_empty());
                prop_assert_eq!(&p.key.key, if key.is_empty() { &p.request.fingerprint } else { &key });
                prop_assert_eq!(ActionKey::decode(&p.key.encode()), Some(p.key.clone()));
            }
            Err(e) => prop_assert_eq!(oncegate_grpc::status::reason(&e).as_str_name(), "INVALID_REQUEST"),
        }
    }

    #[test]
    fn cursors_and_credentials_never_panic(text in "\\PC{0,40}", bytes in prop::collection::vec(any::<u8>(), 0..64)) {
        let _ = ListCursor::decode(&text);
        let _ = auth::bearer(&text);
        let _ = oncegate_grpc::tls::identities(&bytes);
        if let Some(key) = ActionKey::decode(&bytes) {
            prop_assert_eq!(key.encode(), bytes, "one key, one encoding");
        }
    }

    #[test]
    fn cursors_round_trip(agent in "\\PC{0,20}", lease in any::<i64>(), key in prop::collection::vec(any::<u8>(), 0..40)) {
        let cursor = ListCursor { agent_id: agent, lease_expires_at: lease, key };
        prop_assert_eq!(ListCursor::decode(&cursor.encode()), Some(cursor));
    }
}
