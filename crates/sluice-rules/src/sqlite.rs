//! The embedded store: SQLite in one file (write-ahead log, so readers never wait for the
//! writer), its schema versioned in `PRAGMA user_version` and migrated at open.

use std::path::Path;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rusqlite::{Connection, OptionalExtension, Transaction, TransactionBehavior, params};

use crate::write::{self, Writer, Writes};
use crate::{Change, DomainRecord, Listing, MAX_PAGE, RuleStore, StoreError};

/// The schema, one step per version: a database at version `n` runs the steps after `n`.
const MIGRATIONS: &[&str] = &["
    CREATE TABLE revision (id INTEGER PRIMARY KEY CHECK (id = 0), value INTEGER NOT NULL);
    INSERT INTO revision (id, value) VALUES (0, 0);
    CREATE TABLE domains (
        name TEXT PRIMARY KEY,
        rules TEXT NOT NULL,
        revision INTEGER NOT NULL
    );
    CREATE TABLE history (
        revision INTEGER PRIMARY KEY,
        domain TEXT NOT NULL,
        who TEXT NOT NULL,
        at_unix_ms INTEGER NOT NULL,
        before TEXT,
        after TEXT
    );
    CREATE INDEX history_by_domain ON history (domain, revision);
"];

/// How long a write waits for another process's write on the same file.
const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// Rules in an SQLite database.
///
/// # Example
/// ```
/// use sluice_rules::{RuleStore, SqliteStore};
/// let dir = tempfile::tempdir()?;
/// let path = dir.path().join("rules.db");
/// let store = SqliteStore::open(&path)?;
/// store.create("domain: edge\ndescriptors: []\n", "alice")?;
/// drop(store);
/// // Reopened: the rules and the revision are there.
/// let store = SqliteStore::open(&path)?;
/// assert_eq!(store.revision()?, 1);
/// assert_eq!(store.get("edge")?.revision, 1);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct SqliteStore {
    connection: Mutex<Connection>,
}

impl std::fmt::Debug for SqliteStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqliteStore").finish_non_exhaustive()
    }
}

impl SqliteStore {
    /// Opens (or creates) the store in the file at `path`, migrating its schema.
    ///
    /// # Errors
    /// The file cannot be opened as a database, or its schema is newer than this build.
    pub fn open(path: &Path) -> Result<Self, StoreError> {
        let connection = Connection::open(path)?;
        // WAL answers with the mode it set; read the row so the pragma is not an error.
        connection.query_row("PRAGMA journal_mode = WAL", [], |_| Ok(()))?;
        Self::ready(connection)
    }

    /// A store in memory, gone when dropped: for tests and examples.
    ///
    /// # Errors
    /// SQLite could not open one.
    pub fn in_memory() -> Result<Self, StoreError> {
        Self::ready(Connection::open_in_memory()?)
    }

    fn ready(mut connection: Connection) -> Result<Self, StoreError> {
        connection.busy_timeout(BUSY_TIMEOUT)?;
        connection.pragma_update(None, "foreign_keys", true)?;
        migrate(&mut connection)?;
        Ok(Self {
            connection: Mutex::new(connection),
        })
    }

    fn connection(&self) -> MutexGuard<'_, Connection> {
        // A panic while holding it left no open transaction (rusqlite rolls back on drop).
        self.connection
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// SQLite's locking: an immediate transaction (other writers wait for it to end).
impl Writer for SqliteStore {
    fn write<T>(
        &self,
        write: impl FnOnce(&mut dyn Writes, u64) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        let mut connection = self.connection();
        let mut transaction = connection.transaction_with_behavior(TransactionBehavior::Immediate)?;
        let next = current_revision(&transaction)? + 1;
        let answer = write(&mut transaction, next)?;
        transaction.execute(
            "UPDATE revision SET value = ?1 WHERE id = 0",
            params![to_sql(next)],
        )?;
        transaction.commit()?;
        Ok(answer)
    }
}

fn migrate(connection: &mut Connection) -> Result<(), StoreError> {
    let known = i64::try_from(MIGRATIONS.len()).unwrap_or(i64::MAX);
    let transaction = connection.transaction_with_behavior(TransactionBehavior::Immediate)?;
    let found: i64 = transaction.query_row("PRAGMA user_version", [], |row| row.get(0))?;
    if found > known {
        return Err(StoreError::NewerSchema { found, known });
    }
    for step in MIGRATIONS.iter().skip(usize::try_from(found).unwrap_or(0)) {
        transaction.execute_batch(step)?;
    }
    transaction.pragma_update(None, "user_version", known)?;
    transaction.commit()?;
    Ok(())
}

/// SQLite's integers are signed: revisions stay far below 2^63.
fn to_sql(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

fn from_sql(value: i64) -> u64 {
    u64::try_from(value).unwrap_or(0)
}

fn current_revision(connection: &Connection) -> Result<u64, StoreError> {
    let value: i64 = connection.query_row("SELECT value FROM revision WHERE id = 0", [], |row| row.get(0))?;
    Ok(from_sql(value))
}

fn now_unix_ms() -> i64 {
    let since = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
    i64::try_from(since.as_millis()).unwrap_or(i64::MAX)
}

fn find(connection: &Connection, domain: &str) -> Result<Option<DomainRecord>, StoreError> {
    Ok(connection
        .query_row(
            "SELECT rules, revision FROM domains WHERE name = ?1",
            params![domain],
            |row| {
                Ok(DomainRecord {
                    domain: domain.to_owned(),
                    text: row.get(0)?,
                    revision: from_sql(row.get(1)?),
                })
            },
        )
        .optional()?)
}

impl Writes for Transaction<'_> {
    fn find(&mut self, domain: &str) -> Result<Option<DomainRecord>, StoreError> {
        find(self, domain)
    }

    fn insert(&mut self, record: &DomainRecord) -> Result<bool, StoreError> {
        if find(self, &record.domain)?.is_some() {
            return Ok(false);
        }
        self.execute(
            "INSERT INTO domains (name, rules, revision) VALUES (?1, ?2, ?3)",
            params![record.domain, record.text, to_sql(record.revision)],
        )?;
        Ok(true)
    }

    fn update(&mut self, record: &DomainRecord) -> Result<(), StoreError> {
        self.execute(
            "UPDATE domains SET rules = ?2, revision = ?3 WHERE name = ?1",
            params![record.domain, record.text, to_sql(record.revision)],
        )?;
        Ok(())
    }

    fn remove(&mut self, domain: &str) -> Result<(), StoreError> {
        self.execute("DELETE FROM domains WHERE name = ?1", params![domain])?;
        Ok(())
    }

    fn record(
        &mut self,
        revision: u64,
        domain: &str,
        who: &str,
        before: Option<&str>,
        after: Option<&str>,
    ) -> Result<(), StoreError> {
        self.execute(
            "INSERT INTO history (revision, domain, who, at_unix_ms, before, after) VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
            params![to_sql(revision), domain, who, now_unix_ms(), before, after],
        )?;
        Ok(())
    }
}

impl RuleStore for SqliteStore {
    fn revision(&self) -> Result<u64, StoreError> {
        current_revision(&self.connection())
    }

    fn list(&self, prefix: &str, after: Option<&str>, limit: usize) -> Result<Listing, StoreError> {
        if limit == 0 || limit > MAX_PAGE {
            return Err(StoreError::PageSize(limit));
        }
        let connection = self.connection();
        // Names compared as text: the prefix is matched with substr, so `%` and `_` in it are
        // plain characters.
        let mut statement = connection.prepare_cached(
            "SELECT name, rules, revision FROM domains
             WHERE substr(name, 1, length(?1)) = ?1 AND name > ?2
             ORDER BY name LIMIT ?3",
        )?;
        let fetch = i64::try_from(limit + 1).unwrap_or(i64::MAX);
        let mut domains = statement
            .query_map(params![prefix, after.unwrap_or(""), fetch], |row| {
                Ok(DomainRecord {
                    domain: row.get(0)?,
                    text: row.get(1)?,
                    revision: from_sql(row.get(2)?),
                })
            })?
            .collect::<Result<Vec<_>, _>>()?;
        let next = if domains.len() > limit {
            domains.truncate(limit);
            domains.last().map(|last| last.domain.clone())
        } else {
            None
        };
        Ok(Listing { domains, next })
    }

    fn get(&self, domain: &str) -> Result<DomainRecord, StoreError> {
        find(&self.connection(), domain)?.ok_or_else(|| StoreError::NotFound(domain.to_owned()))
    }

    fn create(&self, text: &str, who: &str) -> Result<DomainRecord, StoreError> {
        write::create(self, text, who)
    }

    fn replace(
        &self,
        domain: &str,
        text: &str,
        if_match: Option<u64>,
        who: &str,
    ) -> Result<DomainRecord, StoreError> {
        write::replace(self, domain, text, if_match, who)
    }

    fn delete(&self, domain: &str, if_match: Option<u64>, who: &str) -> Result<u64, StoreError> {
        write::delete(self, domain, if_match, who)
    }

    fn snapshot(&self) -> Result<(u64, Vec<DomainRecord>), StoreError> {
        let mut connection = self.connection();
        // One read transaction: the revision and the rows of the same instant.
        let transaction = connection.transaction_with_behavior(TransactionBehavior::Deferred)?;
        let revision = current_revision(&transaction)?;
        let domains = {
            let mut statement =
                transaction.prepare_cached("SELECT name, rules, revision FROM domains ORDER BY name")?;
            statement
                .query_map([], |row| {
                    Ok(DomainRecord {
                        domain: row.get(0)?,
                        text: row.get(1)?,
                        revision: from_sql(row.get(2)?),
                    })
                })?
                .collect::<Result<Vec<_>, _>>()?
        };
        transaction.commit()?;
        Ok((revision, domains))
    }

    fn history(&self, domain: &str) -> Result<Vec<Change>, StoreError> {
        let connection = self.connection();
        let mut statement = connection.prepare_cached(
            "SELECT revision, who, at_unix_ms, before, after FROM history WHERE domain = ?1 ORDER BY revision",
        )?;
        let changes = statement
            .query_map(params![domain], |row| {
                Ok(Change {
                    revision: from_sql(row.get(0)?),
                    domain: domain.to_owned(),
                    who: row.get(1)?,
                    at_unix_ms: row.get(2)?,
                    before: row.get(3)?,
                    after: row.get(4)?,
                })
            })?
            .collect::<Result<Vec<_>, _>>()?;
        Ok(changes)
    }
}
