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

/// An item named `name` with the parameters `params`, as [`items`] reads one.
pub fn item(name: &str, params: &[(&str, i64)]) -> (String, Vec<(String, i64)>) {
    let params = params
        .iter()
        .map(|(key, value)| ((*key).to_owned(), *value))
        .collect();
    (name.to_owned(), params)
}
