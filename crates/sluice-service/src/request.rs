//! What a front end asks the engine: a domain and its descriptors, owned ([`CheckRequest`], as
//! RLS and the check API read it off the wire) or borrowed ([`Request`], what the engine
//! decides: the HTTP layer builds one on its stack), and the bounds a request must keep.

use sluice::Quota;
use sluice_descriptors::Entry;

/// One descriptor of a request.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DescriptorRequest {
    /// Its key/value entries, in order.
    pub entries: Vec<(String, String)>,
    /// Hits for this descriptor, in place of the request's.
    pub hits: Option<u64>,
    /// A quota the caller sets for it, in place of its rule's.
    pub limit: Option<Quota>,
}

/// A request to decide.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CheckRequest {
    /// The domain whose rules apply.
    pub domain: String,
    /// Its descriptors.
    pub descriptors: Vec<DescriptorRequest>,
    /// Hits each descriptor adds (1 if not given).
    pub hits: Option<u64>,
}

/// Bounds on one request: beyond them it is refused as invalid, before anything is counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestBounds {
    /// Descriptors per request.
    pub descriptors: usize,
    /// Entries per descriptor.
    pub entries: usize,
    /// Bytes of the domain and of each key and value.
    pub text_bytes: usize,
}

impl Default for RequestBounds {
    fn default() -> Self {
        Self {
            descriptors: 64,
            entries: 16,
            text_bytes: 1024,
        }
    }
}

/// Why a request was not decided.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RequestError {
    /// No domain.
    #[error("domain is empty")]
    NoDomain,
    /// A report (a charge after the fact) asked of counters that cannot take one.
    #[error("not charged: {0}")]
    ChargeUnsupported(String),
    /// A report Redis did not take (unreachable, slow or failing): nothing was counted.
    #[error("not charged: {0}")]
    NotCharged(String),
    /// No descriptors.
    #[error("descriptors is empty")]
    NoDescriptors,
    /// Too many descriptors.
    #[error("{count} descriptors, at most {max}")]
    TooManyDescriptors {
        /// Sent.
        count: usize,
        /// Allowed.
        max: usize,
    },
    /// A descriptor with no entries, or too many.
    #[error("descriptors[{index}] has {count} entries, 1 to {max} allowed")]
    Entries {
        /// The descriptor.
        index: usize,
        /// Sent.
        count: usize,
        /// Allowed.
        max: usize,
    },
    /// A domain, key or value too long.
    #[error("{field} is {len} bytes, at most {max}")]
    TooLong {
        /// Where.
        field: String,
        /// Sent.
        len: usize,
        /// Allowed.
        max: usize,
    },
}

/// One descriptor as the engine decides it, borrowed from the caller.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Descriptor<'a> {
    pub(crate) entries: &'a [Entry<'a>],
    /// What it takes from its limit (0 looks without taking).
    pub(crate) hits: u64,
    /// A quota the caller sets for it, in place of its rule's.
    pub(crate) limit: Option<Quota>,
}

/// A request as the engine decides it, borrowed from the caller.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Request<'a> {
    pub(crate) domain: &'a str,
    pub(crate) descriptors: &'a [Descriptor<'a>],
}

/// One descriptor as a front end reads it off the wire (RLS's protobuf, the check API's
/// JSON): each says how its own fields become a [`DescriptorRequest`], and
/// [`CheckRequest::from_wire`] does the rest once for both.
pub(crate) trait WireDescriptor {
    /// The descriptor, or what is wrong with it as `field: why` (`limit: unit 9 is not a unit`).
    fn into_request(self) -> Result<DescriptorRequest, String>;
}

impl CheckRequest {
    /// The request of `domain` over `descriptors`; an error names the descriptor at fault by
    /// its place (`descriptors[2].limit: ...`).
    pub(crate) fn from_wire<D: WireDescriptor>(
        domain: String,
        descriptors: Vec<D>,
        hits: Option<u64>,
    ) -> Result<Self, String> {
        let descriptors = (descriptors.into_iter().enumerate())
            .map(|(index, descriptor)| {
                (descriptor.into_request()).map_err(|why| format!("descriptors[{index}].{why}"))
            })
            .collect::<Result<_, String>>()?;
        Ok(Self {
            domain,
            descriptors,
            hits,
        })
    }

    /// Each descriptor's entries, borrowed as the engine reads them.
    pub(crate) fn entries(&self) -> Vec<Vec<Entry<'_>>> {
        (self.descriptors.iter())
            .map(|descriptor| {
                (descriptor.entries.iter())
                    .map(|(key, value)| Entry { key, value })
                    .collect()
            })
            .collect()
    }

    /// The descriptors over `entries` (as [`entries`](Self::entries) gave them), each one's
    /// hits resolved: its own, else the request's, else 1 (0 counts as not given).
    pub(crate) fn descriptors<'a>(&self, entries: &'a [Vec<Entry<'a>>]) -> Vec<Descriptor<'a>> {
        let hits = self.hits.filter(|h| *h > 0).unwrap_or(1);
        (self.descriptors.iter().zip(entries))
            .map(|(descriptor, entries)| Descriptor {
                entries,
                hits: descriptor.hits.filter(|h| *h > 0).unwrap_or(hits),
                limit: descriptor.limit,
            })
            .collect()
    }
}

impl Request<'_> {
    /// Whether the request keeps `bounds`; the first thing out of them, if not.
    #[inline]
    pub(crate) fn validate(&self, bounds: RequestBounds) -> Result<(), RequestError> {
        let text = |text: &str| text.len() <= bounds.text_bytes;
        let kept = !self.domain.is_empty()
            && text(self.domain)
            && (1..=bounds.descriptors).contains(&self.descriptors.len())
            && self.descriptors.iter().all(|descriptor| {
                (1..=bounds.entries).contains(&descriptor.entries.len())
                    && (descriptor.entries.iter()).all(|entry| text(entry.key) && text(entry.value))
            });
        if kept { Ok(()) } else { self.out_of_bounds(bounds) }
    }

    /// The first thing of the request out of `bounds` (found again, slowly, to name it).
    #[cold]
    fn out_of_bounds(&self, bounds: RequestBounds) -> Result<(), RequestError> {
        // The field is named only for a text too long: most requests name none.
        let long = |field: &dyn Fn() -> String, text: &str| {
            (text.len() > bounds.text_bytes).then(|| RequestError::TooLong {
                field: field(),
                len: text.len(),
                max: bounds.text_bytes,
            })
        };
        if self.domain.is_empty() {
            return Err(RequestError::NoDomain);
        }
        if let Some(e) = long(&|| "domain".into(), self.domain) {
            return Err(e);
        }
        let count = self.descriptors.len();
        if count == 0 {
            return Err(RequestError::NoDescriptors);
        }
        if count > bounds.descriptors {
            return Err(RequestError::TooManyDescriptors {
                count,
                max: bounds.descriptors,
            });
        }
        for (index, descriptor) in self.descriptors.iter().enumerate() {
            let count = descriptor.entries.len();
            if count == 0 || count > bounds.entries {
                return Err(RequestError::Entries {
                    index,
                    count,
                    max: bounds.entries,
                });
            }
            for (i, entry) in descriptor.entries.iter().enumerate() {
                if let Some(e) = long(&|| format!("descriptors[{index}].entries[{i}].key"), entry.key)
                    .or_else(|| {
                        long(
                            &|| format!("descriptors[{index}].entries[{i}].value"),
                            entry.value,
                        )
                    })
                {
                    return Err(e);
                }
            }
        }
        Ok(())
    }
}

/// A descriptor as the top keys and the denied log name it: `key=value,key=value`.
pub(crate) fn descriptor_key(entries: &[Entry<'_>]) -> String {
    let mut key = String::new();
    write_descriptor_key(entries, &mut key);
    key
}

/// [`descriptor_key`], appended to `key`.
pub(crate) fn write_descriptor_key(entries: &[Entry<'_>], key: &mut String) {
    for (i, entry) in entries.iter().enumerate() {
        if i > 0 {
            key.push(',');
        }
        key.push_str(entry.key);
        key.push('=');
        key.push_str(entry.value);
    }
}
