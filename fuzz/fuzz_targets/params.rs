//! Params parsing and canonicalisation: any text either is refused with a ParamsError or yields
//! a fingerprint that is stable under re-parsing its own canonical form (RFC 8785), and per-field
//! digests that never differ from themselves. Never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use oncegate_domain::fingerprint::{self, KeyFields, ParamsLimits};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let limits = ParamsLimits::default();
    let Ok(params) = fingerprint::parse_params(text, limits) else {
        return;
    };
    let all = fingerprint::select(&params, &KeyFields::All);
    let fp = fingerprint::fingerprint("pay", "", &all);
    assert!(fp.starts_with("v1-") && fp.len() == 67);

    // The canonical form is JSON whose params parse again to the same fingerprint.
    let canonical = fingerprint::canonical_form("pay", "", &all);
    let doc: serde_json::Value = serde_json::from_str(&canonical).expect("canonical form is JSON");
    let again = fingerprint::parse_params(
        &doc["params"].to_string(),
        ParamsLimits {
            max_bytes: usize::MAX,
            max_depth: limits.max_depth,
        },
    )
    .expect("canonical params parse again");
    assert_eq!(
        fingerprint::fingerprint("pay", "", &fingerprint::select(&again, &KeyFields::All)),
        fp
    );

    // Pointer selection over the first member names, and digests that agree with themselves.
    let pointers: Vec<String> = params
        .keys()
        .take(4)
        .map(|k| format!("/{}", k.replace('~', "~0").replace('/', "~1")))
        .chain(["/missing".to_owned()])
        .collect();
    let some = fingerprint::select(&params, &KeyFields::Pointers(pointers));
    let d1 = fingerprint::field_digests("pay", "i", &some);
    assert!(fingerprint::differing_fields(&d1, &d1).is_empty());
    let d2 = fingerprint::field_digests("pay", "i", &all);
    let _ = fingerprint::differing_fields(&d1, &d2);
});
