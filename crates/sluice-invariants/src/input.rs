//! Arbitrary bytes read as a few choices, then as a tail.

pub(crate) struct Input<'a> {
    data: &'a [u8],
}

impl<'a> Input<'a> {
    pub(crate) fn new(data: &'a [u8]) -> Self {
        Self { data }
    }

    /// The next byte, 0 once the input is used up (so every input is a valid one).
    pub(crate) fn byte(&mut self) -> u8 {
        match self.data.split_first() {
            Some((&b, rest)) => {
                self.data = rest;
                b
            }
            None => 0,
        }
    }

    /// One of `from`, chosen by the next byte.
    pub(crate) fn pick<T: Copy>(&mut self, from: &[T]) -> T {
        from[usize::from(self.byte()) % from.len()]
    }

    /// What is left.
    pub(crate) fn rest(self) -> &'a [u8] {
        self.data
    }
}

/// `data` cut at each `\n` into header values; pieces a header cannot carry (other control
/// characters) are left out.
pub(crate) fn header_lines(data: &[u8]) -> Vec<http::HeaderValue> {
    if data.is_empty() {
        return Vec::new();
    }
    data.split(|&b| b == b'\n')
        .filter_map(|line| http::HeaderValue::from_bytes(line).ok())
        .collect()
}
