//! The shared store: PostgreSQL, for several rules-service replicas on one database. Writers
//! queue on the revision row (each write locks it first), so revisions stay one per change
//! and gapless however many replicas write; the schema's version is a row of its own.

use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use postgres::{Client, Config, IsolationLevel, NoTls, Transaction};

use crate::write::{self, Writer, Writes};
use crate::{Change, DomainRecord, Listing, MAX_PAGE, RuleStore, StoreError};

/// The schema, one step per version: a database at version `n` runs the steps after `n`.
/// Every table is prefixed, so the store can share a database with other things.
const MIGRATIONS: &[&str] = &["
    CREATE TABLE sluice_revision (id INTEGER PRIMARY KEY CHECK (id = 0), value BIGINT NOT NULL);
    INSERT INTO sluice_revision (id, value) VALUES (0, 0);
    CREATE TABLE sluice_domains (
        name TEXT COLLATE \"C\" PRIMARY KEY,
        rules TEXT NOT NULL,
        revision BIGINT NOT NULL
    );
    CREATE TABLE sluice_history (
        revision BIGINT PRIMARY KEY,
        domain TEXT NOT NULL,
        who TEXT NOT NULL,
        at_unix_ms BIGINT NOT NULL,
        before TEXT,
        after TEXT
    );
    CREATE INDEX sluice_history_by_domain ON sluice_history (domain, revision);
"];

/// The advisory lock that keeps two replicas from migrating at once.
const MIGRATION_LOCK: i64 = 0x736c_7569_6365; // "sluice"

/// How long a connection may take when the URL sets no `connect_timeout`.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Rules in a PostgreSQL database.
///
/// Each call runs on one connection (made again if the server dropped it); call it off async
/// threads (`spawn_blocking`), as [`crate::RulesApi`] does.
///
/// # Example
/// ```no_run
/// use sluice_rules::{PostgresStore, RuleStore};
/// let store = PostgresStore::connect("postgres://sluice@127.0.0.1/rules")?;
/// let edge = store.create("domain: edge\ndescriptors: []\n", "alice")?;
/// assert_eq!(store.get("edge")?.revision, edge.revision);
/// # Ok::<(), sluice_rules::StoreError>(())
/// ```
pub struct PostgresStore {
    config: Config,
    client: Mutex<Option<Client>>,
}

impl std::fmt::Debug for PostgresStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The config may hold a password.
        f.debug_struct("PostgresStore").finish_non_exhaustive()
    }
}

impl PostgresStore {
    /// Connects to the database at `url` (`postgres://user:password@host:port/database`, or
    /// libpq's `key=value` form) and migrates its schema.
    ///
    /// # Errors
    /// Not a connection string, the server unreachable or refusing, or its schema newer than
    /// this build.
    pub fn connect(url: &str) -> Result<Self, StoreError> {
        let mut config: Config = url.parse()?;
        if config.get_connect_timeout().is_none() {
            config.connect_timeout(CONNECT_TIMEOUT);
        }
        let mut client = config.connect(NoTls)?;
        migrate(&mut client)?;
        Ok(Self {
            config,
            client: Mutex::new(Some(client)),
        })
    }

    /// Runs `call` on the connection, connecting again first if the last one was lost.
    fn with<T>(&self, call: impl FnOnce(&mut Client) -> Result<T, StoreError>) -> Result<T, StoreError> {
        let mut held: MutexGuard<'_, Option<Client>> = self
            .client
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let client = match held.take() {
            Some(client) if !client.is_closed() => held.insert(client),
            _ => held.insert(self.config.connect(NoTls)?),
        };
        call(client)
    }
}

/// PostgreSQL's locking: each write locks the revision row first, so writers queue on it.
impl Writer for PostgresStore {
    fn write<T>(
        &self,
        write: impl FnOnce(&mut dyn Writes, u64) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        self.with(|client| {
            let mut transaction = client.transaction()?;
            let row = transaction.query_one(
                "UPDATE sluice_revision SET value = value + 1 WHERE id = 0 RETURNING value",
                &[],
            )?;
            let next = from_sql(row.try_get(0)?);
            // Dropped without a commit on an error: the revision is not taken.
            let answer = write(&mut transaction, next)?;
            transaction.commit()?;
            Ok(answer)
        })
    }
}

fn migrate(client: &mut Client) -> Result<(), StoreError> {
    let known = i64::try_from(MIGRATIONS.len()).unwrap_or(i64::MAX);
    let mut transaction = client.transaction()?;
    transaction.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK])?;
    transaction.batch_execute("CREATE TABLE IF NOT EXISTS sluice_schema (version BIGINT NOT NULL)")?;
    let found: i64 = match transaction.query_opt("SELECT version FROM sluice_schema", &[])? {
        Some(row) => row.try_get(0)?,
        None => {
            transaction.execute("INSERT INTO sluice_schema (version) VALUES (0)", &[])?;
            0
        }
    };
    if found > known {
        return Err(StoreError::NewerSchema { found, known });
    }
    for step in MIGRATIONS.iter().skip(usize::try_from(found).unwrap_or(0)) {
        transaction.batch_execute(step)?;
    }
    transaction.execute("UPDATE sluice_schema SET version = $1", &[&known])?;
    transaction.commit()?;
    Ok(())
}

/// PostgreSQL's integers are signed: revisions stay far below 2^63.
fn to_sql(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

fn from_sql(value: i64) -> u64 {
    u64::try_from(value).unwrap_or(0)
}

fn now_unix_ms() -> i64 {
    let since = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
    i64::try_from(since.as_millis()).unwrap_or(i64::MAX)
}

/// A `name, rules, revision` row (`try_get`: a column of another type is an error, not a
/// panic).
fn record_of(row: &postgres::Row) -> Result<DomainRecord, StoreError> {
    Ok(DomainRecord {
        domain: row.try_get(0)?,
        text: row.try_get(1)?,
        revision: from_sql(row.try_get(2)?),
    })
}

impl Writes for Transaction<'_> {
    /// Locked (`FOR UPDATE`) until the transaction ends.
    fn find(&mut self, domain: &str) -> Result<Option<DomainRecord>, StoreError> {
        self.query_opt(
            "SELECT name, rules, revision FROM sluice_domains WHERE name = $1 FOR UPDATE",
            &[&domain],
        )?
        .map(|row| record_of(&row))
        .transpose()
    }

    fn insert(&mut self, record: &DomainRecord) -> Result<bool, StoreError> {
        let inserted = self.execute(
            "INSERT INTO sluice_domains (name, rules, revision) VALUES ($1, $2, $3)
             ON CONFLICT (name) DO NOTHING",
            &[&record.domain, &record.text, &to_sql(record.revision)],
        )?;
        Ok(inserted != 0)
    }

    fn update(&mut self, record: &DomainRecord) -> Result<(), StoreError> {
        self.execute(
            "UPDATE sluice_domains SET rules = $2, revision = $3 WHERE name = $1",
            &[&record.domain, &record.text, &to_sql(record.revision)],
        )?;
        Ok(())
    }

    fn remove(&mut self, domain: &str) -> Result<(), StoreError> {
        self.execute("DELETE FROM sluice_domains WHERE name = $1", &[&domain])?;
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
            "INSERT INTO sluice_history (revision, domain, who, at_unix_ms, before, after)
             VALUES ($1, $2, $3, $4, $5, $6)",
            &[&to_sql(revision), &domain, &who, &now_unix_ms(), &before, &after],
        )?;
        Ok(())
    }
}

impl RuleStore for PostgresStore {
    fn revision(&self) -> Result<u64, StoreError> {
        self.with(|client| {
            let row = client.query_one("SELECT value FROM sluice_revision WHERE id = 0", &[])?;
            Ok(from_sql(row.try_get(0)?))
        })
    }

    fn list(&self, prefix: &str, after: Option<&str>, limit: usize) -> Result<Listing, StoreError> {
        if limit == 0 || limit > MAX_PAGE {
            return Err(StoreError::PageSize(limit));
        }
        let fetch = i64::try_from(limit + 1).unwrap_or(i64::MAX);
        let mut domains: Vec<DomainRecord> = self.with(|client| {
            // starts_with: `%` and `_` in a prefix are plain characters.
            let rows = client.query(
                "SELECT name, rules, revision FROM sluice_domains
                 WHERE starts_with(name, $1) AND name > $2
                 ORDER BY name LIMIT $3",
                &[&prefix, &after.unwrap_or(""), &fetch],
            )?;
            rows.iter().map(record_of).collect()
        })?;
        let next = if domains.len() > limit {
            domains.truncate(limit);
            domains.last().map(|last| last.domain.clone())
        } else {
            None
        };
        Ok(Listing { domains, next })
    }

    fn get(&self, domain: &str) -> Result<DomainRecord, StoreError> {
        self.with(|client| {
            client
                .query_opt(
                    "SELECT name, rules, revision FROM sluice_domains WHERE name = $1",
                    &[&domain],
                )?
                .map(|row| record_of(&row))
                .ok_or_else(|| StoreError::NotFound(domain.to_owned()))?
        })
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
        self.with(|client| {
            // One snapshot for both reads: the revision and the rows of the same instant.
            let mut transaction = client
                .build_transaction()
                .isolation_level(IsolationLevel::RepeatableRead)
                .read_only(true)
                .start()?;
            let revision = transaction.query_one("SELECT value FROM sluice_revision WHERE id = 0", &[])?;
            let rows = transaction.query(
                "SELECT name, rules, revision FROM sluice_domains ORDER BY name",
                &[],
            )?;
            let domains = rows.iter().map(record_of).collect::<Result<_, _>>()?;
            transaction.commit()?;
            Ok((from_sql(revision.try_get(0)?), domains))
        })
    }

    fn history(&self, domain: &str) -> Result<Vec<Change>, StoreError> {
        self.with(|client| {
            let rows = client.query(
                "SELECT revision, who, at_unix_ms, before, after FROM sluice_history
                 WHERE domain = $1 ORDER BY revision",
                &[&domain],
            )?;
            rows.iter()
                .map(|row| {
                    Ok(Change {
                        revision: from_sql(row.try_get(0)?),
                        domain: domain.to_owned(),
                        who: row.try_get(1)?,
                        at_unix_ms: row.try_get(2)?,
                        before: row.try_get(3)?,
                        after: row.try_get(4)?,
                    })
                })
                .collect()
        })
    }
}
