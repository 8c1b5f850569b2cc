//! Parsing, selection, canonical form, fingerprints and field digests, by example.

use super::*;

fn fp(action: &str, params: &str, intent: &str, key_fields: &KeyFields) -> String {
    let params = parse_params(params, ParamsLimits::default()).unwrap();
    fingerprint(action, intent, &select(&params, key_fields))
}

#[test]
fn key_order_whitespace_and_number_spelling_do_not_matter() {
    let a = fp("pay", r#"{"amount":1,"to":"x"}"#, "", &KeyFields::All);
    let b = fp(
        "pay",
        "{ \"to\" : \"x\",\n \"amount\" : 1.0 }",
        "",
        &KeyFields::All,
    );
    let c = fp("pay", r#"{"to":"x","amount":1e0}"#, "", &KeyFields::All);
    assert_eq!(a, b);
    assert_eq!(a, c);
    assert!(a.starts_with("v1-") && a.len() == 3 + 64);
}

#[test]
fn action_intent_and_values_change_the_fingerprint() {
    let base = fp("pay", r#"{"amount":1}"#, "", &KeyFields::All);
    assert_ne!(base, fp("refund", r#"{"amount":1}"#, "", &KeyFields::All));
    assert_ne!(base, fp("pay", r#"{"amount":2}"#, "", &KeyFields::All));
    assert_ne!(base, fp("pay", r#"{"amount":1}"#, "i-1", &KeyFields::All));
}

#[test]
fn canonical_form_matches_a_hand_written_jcs_document() {
    let params = parse_params(r#"{"b":[1,2.5,-0],"a":"é"}"#, ParamsLimits::default()).unwrap();
    let form = canonical_form("pay", "", &select(&params, &KeyFields::All));
    assert_eq!(
        form,
        r#"{"action":"pay","intent":null,"params":{"a":"é","b":[1,2.5,0]}}"#
    );
}

/// The reference: canonicalise the whole document at once.
fn whole_document(action: &str, intent: &str, selection: &Selection) -> String {
    let params = match selection {
        Selection::All(all) => Value::Object((*all).clone()),
        Selection::Pointers(fields) => serde_json::to_value(fields).unwrap(),
    };
    let intent = if intent.is_empty() {
        Value::Null
    } else {
        Value::String(intent.to_owned())
    };
    let doc = serde_json::json!({"action": action, "intent": intent, "params": params});
    serde_json_canonicalizer::to_string(&doc).unwrap()
}

fn json_value() -> impl proptest::strategy::Strategy<Value = Value> {
    use proptest::prelude::*;
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        (-(1i64 << 53)..(1i64 << 53)).prop_map(Value::from),
        (-1e15f64..1e15).prop_map(Value::from),
        r#"[a-zé€😀\\"\n\x7f/~]{0,6}"#.prop_map(Value::String),
    ];
    leaf.prop_recursive(3, 24, 4, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            proptest::collection::btree_map("[a-z€😀/~\r]{0,4}", inner, 0..4)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

proptest::proptest! {
    #[test]
    fn member_by_member_equals_the_whole_document(
        params in proptest::collection::btree_map("[a-z€😀/~\r]{0,4}", json_value(), 0..5),
        action in r#"[a-z.é"]{1,8}"#,
        intent in r"[a-z\\]{0,3}",
        pointers in proptest::collection::vec("/[a-z€/~]{0,4}", 0..3),
    ) {
        let params: Map<String, Value> = params.into_iter().collect();
        for key_fields in [KeyFields::All, KeyFields::Pointers(pointers.clone())] {
            let selection = select(&params, &key_fields);
            proptest::prop_assert_eq!(
                canonical_form(&action, &intent, &selection),
                whole_document(&action, &intent, &selection)
            );
        }
    }
}

#[test]
fn rfc8785_number_examples_serialise_as_published() {
    // RFC 8785 appendix B: IEEE-754 values and their canonical text.
    for (input, expected) in [
        ("1e+30", "1e+30"),
        ("4.50", "4.5"),
        ("0.002", "0.002"),
        ("1E-7", "1e-7"),
        ("333333333.33333329", "333333333.3333333"),
        ("-0", "0"),
        ("9007199254740992", "9007199254740992"),
        ("295147905179352830000", "295147905179352830000"),
    ] {
        let value: Value = serde_json::from_str(input).unwrap();
        assert_eq!(
            serde_json_canonicalizer::to_string(&value).unwrap(),
            expected,
            "{input}"
        );
    }
}

#[test]
fn rfc8785_sorts_members_by_utf16_code_units() {
    // RFC 8785 section 3.2.3's sorting example.
    let input = r#"{"\u20ac":"Euro Sign","\r":"Carriage Return","\ufb33":"Hebrew Letter Dalet With Dagesh","1":"One","\ud83d\ude00":"Emoji: Grinning Face","\u0080":"Control","\u00f6":"Latin Small Letter O With Diaeresis"}"#;
    let value: Value = serde_json::from_str(input).unwrap();
    let out = serde_json_canonicalizer::to_string(&value).unwrap();
    let order: Vec<&str> = out
        .split("\":\"")
        .skip(1)
        .map(|s| s.split('"').next().unwrap())
        .collect();
    assert_eq!(
        order,
        [
            "Carriage Return",
            "One",
            "Control",
            "Latin Small Letter O With Diaeresis",
            "Euro Sign",
            "Emoji: Grinning Face",
            "Hebrew Letter Dalet With Dagesh"
        ]
    );
}

#[test]
fn policy_pointers_select_fields_and_absent_ones_are_null() {
    let kf = KeyFields::Pointers(vec!["/amount".into(), "/to/iban".into()]);
    let a = fp(
        "pay",
        r#"{"amount":5,"to":{"iban":"X"},"memo":"hi"}"#,
        "",
        &kf,
    );
    let b = fp(
        "pay",
        r#"{"memo":"rewritten","to":{"iban":"X"},"amount":5}"#,
        "",
        &kf,
    );
    assert_eq!(a, b, "a non-key field does not change the fingerprint");
    let params = parse_params(r#"{"amount":5}"#, ParamsLimits::default()).unwrap();
    let form = canonical_form("pay", "", &select(&params, &kf));
    assert_eq!(
        form,
        r#"{"action":"pay","intent":null,"params":{"/amount":5,"/to/iban":null}}"#
    );
}

#[test]
fn refuses_what_jcs_cannot_represent() {
    let limits = ParamsLimits::default();
    assert_eq!(
        parse_params(r#"{"a":1,"a":2}"#, limits),
        Err(ParamsError::DuplicateMember("a".into()))
    );
    assert_eq!(
        parse_params(r#"{"a":9007199254740993}"#, limits),
        Err(unsafe_at("/a"))
    );
    assert_eq!(
        parse_params(r#"{"a":-18446744073709551616}"#, limits),
        Err(unsafe_at("/a"))
    );
    assert!(parse_params(r#"{"a":9007199254740992}"#, limits).is_ok());
    assert!(parse_params(r#"{"a":-9007199254740992}"#, limits).is_ok());
    assert_eq!(
        parse_params(r#"{"a":9007199254740993.0}"#, limits),
        Err(unsafe_at("/a"))
    );
    assert_eq!(parse_params(r#"{"a":1e300}"#, limits), Err(unsafe_at("/a")));
    assert!(parse_params(r#"{"a":1.5e15}"#, limits).is_ok());
    assert_eq!(parse_params("[1]", limits), Err(ParamsError::NotAnObject));
    assert!(matches!(
        parse_params("{", limits),
        Err(ParamsError::Syntax(_))
    ));
    assert!(matches!(
        parse_params(r#"{"a":1} x"#, limits),
        Err(ParamsError::Syntax(_))
    ));
}

fn unsafe_at(pointer: &str) -> ParamsError {
    ParamsError::UnsafeNumber {
        pointer: pointer.into(),
    }
}

#[test]
fn an_unsafe_number_is_named_by_its_pointer() {
    let limits = ParamsLimits::default();
    for (text, pointer) in [
        (r#"{"amount":9007199254740993}"#, "/amount"),
        (
            r#"{"x":1,"to":{"a/b":[0,{"c~d":-9007199254740993}]}}"#,
            "/to/a~1b/1/c~0d",
        ),
        // Beyond the double range: refused by serde_json itself, still named.
        (r#"{"a":[1,2,1e400]}"#, "/a/2"),
        (r#"{"a":{"b":9007199254740994.0}}"#, "/a/b"),
        ("[9007199254740993]", "/0"),
        ("1e400", ""),
    ] {
        assert_eq!(
            parse_params(text, limits),
            Err(unsafe_at(pointer)),
            "{text}"
        );
    }
    let message = parse_params(r#"{"amount":9007199254740993}"#, limits)
        .unwrap_err()
        .to_string();
    assert!(
        message.contains("at /amount") && message.contains("2^53"),
        "{message}"
    );
}

#[test]
fn nesting_and_size_limits() {
    let limits = ParamsLimits {
        max_bytes: 64,
        max_depth: 3,
    };
    assert!(parse_params(r#"{"a":{"b":[1]}}"#, limits).is_ok());
    assert_eq!(
        parse_params(r#"{"a":{"b":[[1]]}}"#, limits),
        Err(ParamsError::TooDeep(3))
    );
    let big = format!(r#"{{"a":"{}"}}"#, "x".repeat(100));
    assert!(matches!(
        parse_params(&big, limits),
        Err(ParamsError::TooLarge(_, 64))
    ));
}

#[test]
fn differing_fields_names_paths_not_values() {
    let params1 =
        parse_params(r#"{"amount":5,"to":"a","a/b":1}"#, ParamsLimits::default()).unwrap();
    let params2 =
        parse_params(r#"{"amount":6,"to":"a","new":1}"#, ParamsLimits::default()).unwrap();
    let d1 = field_digests("pay", "", &select(&params1, &KeyFields::All));
    let d2 = field_digests("pay", "", &select(&params2, &KeyFields::All));
    assert_eq!(differing_fields(&d1, &d2), ["/amount", "/a~1b", "/new"]);
    let d3 = field_digests("refund", "i", &select(&params1, &KeyFields::All));
    assert_eq!(differing_fields(&d1, &d3), ["action", "intent_id"]);
    assert!(!d1.contains("\"a\""), "digests never carry values");
}
