//! Which core algorithms have a Redis script.

use sluice::{Algorithm, FixedWindow, SlidingWindowCounter, SlidingWindowLog, TokenBucket};

use crate::script::Kind;

mod sealed {
    pub trait Sealed {
        fn kind(&self) -> crate::script::Kind;
    }
}

/// A core algorithm that the Redis backend runs as one atomic Lua script: [`TokenBucket`],
/// [`FixedWindow`], [`SlidingWindowCounter`] and [`SlidingWindowLog`]. The same type serves
/// the local fallback, so a host degraded to its share runs the very same algorithm.
///
/// # Example
/// ```
/// fn takes<A: sluice_redis::RedisAlgorithm>(_: A) {}
/// takes(sluice::TokenBucket);
/// takes(sluice::SlidingWindowLog);
/// ```
pub trait RedisAlgorithm: Algorithm + Clone + sealed::Sealed {}

macro_rules! scripted {
    ($($ty:ident),*) => {$(
        impl sealed::Sealed for $ty {
            fn kind(&self) -> Kind {
                Kind::$ty
            }
        }
        impl RedisAlgorithm for $ty {}
    )*};
}

scripted!(TokenBucket, FixedWindow, SlidingWindowCounter, SlidingWindowLog);

pub(crate) fn kind_of<A: RedisAlgorithm>(algorithm: &A) -> Kind {
    sealed::Sealed::kind(algorithm)
}
