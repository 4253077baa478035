//! Rules from disk: one file, or a directory of them (one domain per file).

use std::path::{Path, PathBuf};

use crate::compile::parse_domain;
use crate::error::LoadError;
use crate::rules::{DomainRules, RuleSet};

/// The deepest directory read below the one given (a link loop ends there).
const MAX_DIR_DEPTH: usize = 8;

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
        let mut domains: Vec<(PathBuf, DomainRules)> = Vec::with_capacity(files.len());
        for file in files {
            let text = std::fs::read_to_string(&file).map_err(io(&file))?;
            let domain = parse_domain(&text).map_err(|error| LoadError::Rules {
                path: file.clone(),
                error,
            })?;
            if let Some((first, _)) = domains.iter().find(|(_, d)| d.name() == domain.name()) {
                return Err(LoadError::DuplicateDomain {
                    domain: domain.name().to_owned(),
                    first: first.clone(),
                    second: file,
                });
            }
            domains.push((file, domain));
        }
        // Names are unique (checked above), so this cannot fail.
        RuleSet::from_domains(domains.into_iter().map(|(_, domain)| domain).collect()).map_err(|error| {
            LoadError::Rules {
                path: path.to_path_buf(),
                error,
            }
        })
    }
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
