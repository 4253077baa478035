//! The config reader of the `sluice` binary, as a library so that the binary, its property
//! tests and the fuzz targets (`fuzz/`) share one parser. Not a stable API: the binary and
//! its YAML are the product.
//!
//! ```
//! let settings = sluice_cli::config::parse("key:\n  from: [ip]\nipv6_prefix: 56\n")?;
//! assert_eq!(settings.ipv6_prefix, 56);
//! # Ok::<(), sluice_cli::config::ConfigError>(())
//! ```

pub mod config;
