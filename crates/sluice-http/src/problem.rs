//! Error answers as `application/problem+json` (RFC 9457): the one writer of the check API's
//! and the rules API's errors, so both name what was wrong in the same shape.

use http::{HeaderValue, Response, StatusCode, header};

/// The media type of a problem answer.
pub const PROBLEM_JSON: &str = "application/problem+json";

/// An error answer: `status`, a short `title` for the kind of error and a `detail` that says
/// what in this request was wrong, as `{"type":"about:blank","title":..,"status":..,"detail":..}`.
///
/// ```
/// use http::StatusCode;
/// let answer = sluice_http::problem(StatusCode::BAD_REQUEST, "Bad request", "domain: \"\" is empty");
/// assert_eq!(answer.status(), StatusCode::BAD_REQUEST);
/// assert_eq!(answer.headers()["content-type"], sluice_http::PROBLEM_JSON);
/// assert_eq!(
///     answer.body(),
///     r#"{"type":"about:blank","title":"Bad request","status":400,"detail":"domain: \"\" is empty"}"#
/// );
/// ```
#[must_use]
pub fn problem(status: StatusCode, title: &str, detail: &str) -> Response<String> {
    let mut body = String::with_capacity(64 + title.len() + detail.len());
    body.push_str(r#"{"type":"about:blank","title":"#);
    push_json_string(&mut body, title);
    body.push_str(r#","status":"#);
    body.push_str(itoa::Buffer::new().format(status.as_u16()));
    body.push_str(r#","detail":"#);
    push_json_string(&mut body, detail);
    body.push('}');
    let mut answer = Response::new(body);
    *answer.status_mut() = status;
    answer
        .headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(PROBLEM_JSON));
    answer
}

/// `text` as a JSON string, quoted and escaped (RFC 8259 §7: quote, backslash and control
/// characters; everything else passes as UTF-8).
fn push_json_string(out: &mut String, text: &str) {
    out.push('"');
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if u32::from(c) < 0x20 => {
                const HEX: &[u8; 16] = b"0123456789abcdef";
                let code = u32::from(c) as usize;
                out.push_str("\\u00");
                out.push(char::from(HEX[code >> 4]));
                out.push(char::from(HEX[code & 0xf]));
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_what_json_requires_and_nothing_else() {
        let mut out = String::new();
        push_json_string(&mut out, "a\"b\\c\nd\u{1}é\u{7f}");
        assert_eq!(out, "\"a\\\"b\\\\c\\nd\\u0001é\u{7f}\"");
    }

    proptest::proptest! {
        /// Whatever the title and detail hold, a JSON reader gets them back unchanged.
        #[test]
        fn any_text_reads_back(title in "\\PC*", detail in "(?s).*", status in 400u16..600) {
            let status = StatusCode::from_u16(status).unwrap();
            let answer = problem(status, &title, &detail);
            let read: serde_json::Value = serde_json::from_str(answer.body()).unwrap();
            proptest::prop_assert_eq!(&read["title"], &serde_json::Value::from(title));
            proptest::prop_assert_eq!(&read["detail"], &serde_json::Value::from(detail));
            proptest::prop_assert_eq!(&read["status"], &serde_json::Value::from(status.as_u16()));
            proptest::prop_assert_eq!(&read["type"], "about:blank");
        }
    }
}
