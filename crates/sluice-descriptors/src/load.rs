//! Rules from disk: one file, or a directory of them (one domain per file, or several files
//! of a domain merged).

use std::path::{Path, PathBuf};

use crate::compile::{compile, read};
use crate::error::{LoadError, RulesError};
use crate::raw::RawDomain;
use crate::rules::RuleSet;

/// The deepest directory read below the one given (a link loop ends there).
const MAX_DIR_DEPTH: usize = 8;

/// How rules are read from disk.
///
/// # Example
/// ```
/// let dir = tempfile::tempdir()?;
/// std::fs::write(dir.path().join("a.yaml"), "domain: edge\ndescriptors:\n  - key: ip\n    rate_limit: {unit: second, requests_per_unit: 5}\n")?;
/// std::fs::write(dir.path().join("b.yaml"), "domain: edge\ndescriptors:\n  - key: path\n    rate_limit: {unit: second, requests_per_unit: 9}\n")?;
/// assert!(sluice_descriptors::RuleSet::load(dir.path()).is_err());
/// let merged = sluice_descriptors::LoadOptions { merge_domains: true };
/// assert_eq!(sluice_descriptors::RuleSet::load_with(dir.path(), merged)?.len(), 2);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LoadOptions {
    /// Files giving one domain are merged (envoy ratelimit's `MERGE_DOMAIN_CONFIG`): each
    /// file's top-level descriptors join the others'; a key and value given at the top by two
    /// files is refused, naming both. Off, a domain given twice is refused.
    pub merge_domains: bool,
}

impl RuleSet {
    /// The rules in `path`: a file, or a directory whose `*.yaml` and `*.yml` files (in its
    /// subdirectories too, sorted by path) each give one domain. Other files are ignored.
    ///
    /// # Errors
    /// A file cannot be read or is wrong (the error names the file and the field), or two
    /// files give one domain.
    ///
    /// # Example
    /// ```
    /// let dir = tempfile::tempdir()?;
    /// std::fs::write(dir.path().join("edge.yaml"), "domain: edge\ndescriptors:\n  - key: ip\n    rate_limit: {unit: second, requests_per_unit: 5}\n")?;
    /// std::fs::write(dir.path().join("README.txt"), "not rules")?;
    /// let rules = sluice_descriptors::RuleSet::load(dir.path())?;
    /// assert_eq!(rules.len(), 1);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn load(path: &Path) -> Result<Self, LoadError> {
        Self::load_with(path, LoadOptions::default())
    }

    /// [`load`](Self::load), with `options`.
    ///
    /// # Errors
    /// As [`load`](Self::load); with `merge_domains`, a top-level key and value two files of
    /// one domain both give.
    pub fn load_with(path: &Path, options: LoadOptions) -> Result<Self, LoadError> {
        let io = |path: &Path| {
            let path = path.to_path_buf();
            move |source| LoadError::Io { path, source }
        };
        let metadata = std::fs::metadata(path).map_err(io(path))?;
        let mut files = Vec::new();
        if metadata.is_dir() {
            rule_files(path, &mut files, 0)?;
            files.sort();
        } else {
            files.push(path.to_path_buf());
        }
        // Each domain's files, in the order read.
        let mut domains: Vec<(String, Vec<(PathBuf, RawDomain)>)> = Vec::with_capacity(files.len());
        for file in files {
            let text = std::fs::read_to_string(&file).map_err(io(&file))?;
            let raw = read(&text).map_err(|error| LoadError::Rules {
                path: file.clone(),
                error,
            })?;
            match domains.iter_mut().find(|(name, _)| *name == raw.domain) {
                Some((name, given)) if options.merge_domains => {
                    debug_assert_eq!(*name, raw.domain);
                    given.push((file, raw));
                }
                Some((name, given)) => {
                    return Err(LoadError::DuplicateDomain {
                        domain: name.clone(),
                        first: given[0].0.clone(),
                        second: file,
                    });
                }
                None => domains.push((raw.domain.clone(), vec![(file, raw)])),
            }
        }
        let mut compiled = Vec::with_capacity(domains.len());
        for (_, given) in domains {
            let (paths, raws): (Vec<PathBuf>, Vec<RawDomain>) = given.into_iter().unzip();
            let domain = compile(raws).map_err(|(at, error)| LoadError::Rules {
                path: paths[at].clone(),
                error: merged_error(error, &paths),
            })?;
            compiled.push(domain);
        }
        // Names are unique (checked above), so this cannot fail.
        RuleSet::from_domains(compiled).map_err(|error| LoadError::Rules {
            path: path.to_path_buf(),
            error,
        })
    }
}

/// An error of a merged domain, its "file N" written as that file's path.
fn merged_error(mut error: RulesError, paths: &[PathBuf]) -> RulesError {
    if paths.len() > 1 {
        for (at, path) in paths.iter().enumerate().rev() {
            let placeholder = format!("of file {}", at + 1);
            if error.message.contains(&placeholder) {
                error.message = error
                    .message
                    .replace(&placeholder, &format!("in {}", path.display()));
            }
        }
    }
    error
}

fn rule_files(dir: &Path, files: &mut Vec<PathBuf>, depth: usize) -> Result<(), LoadError> {
    if depth > MAX_DIR_DEPTH {
        return Ok(());
    }
    let entries = std::fs::read_dir(dir).map_err(|source| LoadError::Io {
        path: dir.to_path_buf(),
        source,
    })?;
    for entry in entries {
        let entry = entry.map_err(|source| LoadError::Io {
            path: dir.to_path_buf(),
            source,
        })?;
        let path = entry.path();
        if path.is_dir() {
            rule_files(&path, files, depth + 1)?;
        } else if path
            .extension()
            .and_then(|e| e.to_str())
            .is_some_and(|e| e == "yaml" || e == "yml")
        {
            files.push(path);
        }
    }
    Ok(())
}
