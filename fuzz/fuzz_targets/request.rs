//! Request validation from hostile wire bytes: whatever protobuf decodes into a RequestToken is
//! either refused with INVALID_REQUEST or prepared into a key and request hash consistent with
//! it. The operator requests and page tokens are decoded the same way. Never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use oncegate_config::ConfigFile;
use oncegate_gate::{TokenCall, policy::Policies, request::prepare_token};
use oncegate_proto::{self as pb};
use oncegate_store::ListCursor;
use prost::Message;

fn policies() -> &'static Policies {
    static POLICIES: std::sync::OnceLock<Policies> = std::sync::OnceLock::new();
    POLICIES.get_or_init(|| {
        ConfigFile::parse(
            r#"
            [limits]
            max_params_bytes = 4096
            max_params_depth = 8
            max_id_bytes = 64
            [actions."pay"]
            key_fields = ["/amount", "/to/iban", "/a~1b"]
            [actions."p*"]
            on_expiry = "regrant"
            "#,
        )
        .expect("fuzz policy parses")
        .policies
    })
}

fuzz_target!(|data: &[u8]| {
    if let Ok(req) = pb::RequestTokenRequest::decode(data) {
        let scope = req.scope.unwrap_or_default();
        let lease = req.lease_ttl.map(|d| {
            d.seconds
                .saturating_mul(1000)
                .saturating_add(i64::from(d.nanos) / 1_000_000)
        });
        let call = TokenCall {
            agent_id: scope.agent_id.clone(),
            run_id: scope.run_id.clone(),
            action: req.action.clone(),
            params_json: req.params_json.clone(),
            intent_id: req.intent_id.clone(),
            idempotency_key: req.idempotency_key.clone(),
            holder: req.holder.clone(),
            lease,
        };
        let policy = policies().for_action(&call.action);
        match prepare_token(&policies().limits, policy, call, "token".into()) {
            Ok(prepared) => {
                assert_eq!(prepared.key.agent_id, scope.agent_id);
                assert_eq!(prepared.key.run_id, scope.run_id);
                assert!(prepared.request.fingerprint.starts_with("v1-"));
                if req.idempotency_key.is_empty() {
                    assert_eq!(prepared.key.key, prepared.request.fingerprint);
                } else {
                    assert_eq!(prepared.key.key, req.idempotency_key);
                }
                assert!(prepared.request.lease > 0);
                let key = prepared.key.encode();
                assert_eq!(oncegate_domain::ActionKey::decode(&key), Some(prepared.key));
            }
            Err(e) => assert_eq!(
                oncegate_grpc::status::reason(&e),
                oncegate_proto::ErrorReason::InvalidRequest
            ),
        }
    }
    if let Ok(list) = pb::ListUnresolvedRequest::decode(data)
        && let Some(cursor) = ListCursor::decode(&list.page_token)
    {
        assert_eq!(ListCursor::decode(&cursor.encode()), Some(cursor));
    }
    let _ = pb::RecordExternalCompletionRequest::decode(data);
});
