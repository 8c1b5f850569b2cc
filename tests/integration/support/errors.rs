//! Reading oncegate's rich errors: every status carries one `ErrorInfo` (domain `oncegate`) whose
//! reason names the error; some add metadata, `RetryInfo` or `BadRequest`.

use std::collections::HashMap;

use tonic::{Code, Status};
use tonic_types::StatusExt;

/// The ErrorInfo reason of a status (every oncegate error carries exactly one).
pub fn reason(status: &Status) -> String {
    status
        .get_error_details()
        .error_info()
        .unwrap_or_else(|| panic!("no ErrorInfo in {status:?}"))
        .reason
        .clone()
}

/// Asserts a status's code and reason, and returns its ErrorInfo metadata.
pub fn expect_error(status: &Status, code: Code, expected: &str) -> HashMap<String, String> {
    assert_eq!(status.code(), code, "{status:?}");
    let details = status.get_error_details();
    let info = details
        .error_info()
        .unwrap_or_else(|| panic!("no ErrorInfo in {status:?}"));
    assert_eq!(info.reason, expected, "{status:?}");
    assert_eq!(info.domain, "oncegate");
    info.metadata.clone()
}
