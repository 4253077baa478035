//! The rate-limit fields as a client reads them: through a third-party structured-field
//! parser (`sfv`), not sluice's own writer.

/// Each item of a `RateLimit-Policy` or `RateLimit` value: its policy name and its integer
/// parameters, in order.
pub fn items(value: &str) -> Vec<(String, Vec<(String, i64)>)> {
    let list: sfv::List = sfv::Parser::new(value)
        .parse_list()
        .unwrap_or_else(|e| panic!("{value:?} is not a structured-field list: {e}"));
    list.into_iter()
        .map(|entry| {
            let sfv::ListEntry::Item(item) = entry else {
                panic!("an inner list in {value:?}");
            };
            let name = item
                .bare_item
                .as_string()
                .expect("a string item")
                .as_str()
                .to_owned();
            let params = (item.params.iter())
                .map(|(key, value)| {
                    (
                        key.as_str().to_owned(),
                        i64::from(value.as_integer().expect("an integer")),
                    )
                })
                .collect();
            (name, params)
        })
        .collect()
}

/// The value of the field `name` in a check API answer's `headers`.
#[allow(dead_code, reason = "the RLS test reads its fields from the gRPC answer")]
pub fn in_answer(body: &serde_json::Value, name: &str) -> String {
    let headers = body["headers"]
        .as_array()
        .unwrap_or_else(|| panic!("no headers: {body}"));
    let found = headers.iter().find(|h| h["name"] == name);
    found.unwrap_or_else(|| panic!("no {name}: {body}"))["value"]
        .as_str()
        .unwrap_or_else(|| panic!("{name} is not text: {body}"))
        .to_owned()
}

/// An item named `name` with the parameters `params`, as [`items`] reads one.
pub fn item(name: &str, params: &[(&str, i64)]) -> (String, Vec<(String, i64)>) {
    let params = params
        .iter()
        .map(|(key, value)| ((*key).to_owned(), *value))
        .collect();
    (name.to_owned(), params)
}
