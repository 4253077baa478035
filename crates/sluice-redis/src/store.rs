//! The connection to Redis (one server or a cluster) and the timeout of each call; whether to
//! ask at all is the health state's (`health.rs`).

use std::sync::atomic::Ordering;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::{AsyncConnectionConfig, Client, Cmd, Pipeline, RedisFuture, Script, ToRedisArgs, Value};

use tracing::Instrument;

use crate::SetupError;
use crate::health::Health;
use crate::sync::{read, write};

/// Settings of a connection to Redis.
///
/// # Example
/// ```
/// use std::time::Duration;
/// let options = sluice_redis::RedisOptions { timeout: Duration::from_millis(20), ..Default::default() };
/// assert_eq!(options.probe_backoff_max, Duration::from_secs(1));
/// ```
#[derive(Debug, Clone)]
pub struct RedisOptions {
    /// The longest a check waits for Redis before the failure policy answers (default 50 ms).
    pub timeout: Duration,
    /// The longest the first connection may take at start-up (default 2 s).
    pub connect_timeout: Duration,
    /// While Redis is failing, the first wait before asking it again (default 50 ms); doubled
    /// after each failed probe up to `probe_backoff_max`.
    pub probe_backoff: Duration,
    /// The longest wait between two probes (default 1 s).
    pub probe_backoff_max: Duration,
    /// How many calls in a row must fail before the store counts Redis as unavailable and
    /// stops asking it (default 3; at least 1). One slow call alone is answered by the failure
    /// policy without sending everyone else there too.
    pub degrade_after: u32,
    /// For `rediss://` URLs: the CA to trust and the client certificate to present (the
    /// system's roots and none when left out).
    pub tls: Option<RedisTls>,
}

/// TLS to Redis (`rediss://`): PEM bytes, read by the caller.
///
/// ```
/// let tls = sluice_redis::RedisTls { ca: Some(b"-----BEGIN CERTIFICATE-----".to_vec()), client: None };
/// let options = sluice_redis::RedisOptions { tls: Some(tls), ..Default::default() };
/// # let _ = options;
/// ```
#[derive(Clone, Default, PartialEq, Eq)]
pub struct RedisTls {
    /// The CA certificates that sign the servers' (the system's roots if `None`).
    pub ca: Option<Vec<u8>>,
    /// A client certificate chain and its private key, for a Redis that asks for one.
    pub client: Option<(Vec<u8>, Vec<u8>)>,
}

impl std::fmt::Debug for RedisTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisTls")
            .field("ca", &self.ca.is_some())
            .field("client", &self.client.is_some())
            .finish()
    }
}

impl RedisTls {
    fn certificates(&self) -> redis::TlsCertificates {
        redis::TlsCertificates {
            client_tls: self.client.as_ref().map(|(cert, key)| redis::ClientTlsConfig {
                client_cert: cert.clone(),
                client_key: key.clone(),
            }),
            root_cert: self.ca.clone(),
        }
    }
}

/// The longest a check waits for Redis unless told otherwise ([`RedisOptions::timeout`]).
///
/// ```
/// assert_eq!(sluice_redis::DEFAULT_TIMEOUT, sluice_redis::RedisOptions::default().timeout);
/// ```
pub const DEFAULT_TIMEOUT: Duration = Duration::from_millis(50);

/// How many failed calls in a row mark Redis unavailable unless told otherwise
/// ([`RedisOptions::degrade_after`]).
///
/// ```
/// assert_eq!(sluice_redis::DEFAULT_DEGRADE_AFTER, sluice_redis::RedisOptions::default().degrade_after);
/// ```
pub const DEFAULT_DEGRADE_AFTER: u32 = 3;

impl Default for RedisOptions {
    fn default() -> Self {
        Self {
            timeout: DEFAULT_TIMEOUT,
            connect_timeout: Duration::from_secs(2),
            probe_backoff: Duration::from_millis(50),
            probe_backoff_max: Duration::from_secs(1),
            degrade_after: DEFAULT_DEGRADE_AFTER,
            tls: None,
        }
    }
}

/// What a [`RedisStore`] has seen, for dashboards and alerts.
///
/// # Example
/// ```
/// let m = sluice_redis::StoreMetrics::default();
/// assert!(!m.degraded);
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StoreMetrics {
    /// Whether Redis is considered unavailable right now.
    pub degraded: bool,
    /// Calls that Redis answered.
    pub calls: u64,
    /// Calls that failed (error or timeout).
    pub failures: u64,
    /// Of the failures, those that hit the timeout.
    pub timeouts: u64,
    /// Times Redis was declared unavailable.
    pub outages: u64,
    /// Times it answered again after an outage.
    pub recoveries: u64,
    /// Calls not sent because Redis was unavailable and no probe was due.
    pub skipped: u64,
}

#[derive(Clone)]
enum Conn {
    Single(MultiplexedConnection),
    Cluster(ClusterConnection),
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Conn::Single(c) => c.req_packed_command(cmd),
            Conn::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        cmd: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Conn::Single(c) => c.req_packed_commands(cmd, offset, count),
            Conn::Cluster(c) => c.req_packed_commands(cmd, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Conn::Single(c) => c.get_db(),
            Conn::Cluster(c) => c.get_db(),
        }
    }
}

enum Target {
    Single(Client),
    Cluster(ClusterClient),
}

/// Why a call did not get an answer. Never shown to users of a limiter: it selects the
/// failure policy, and is logged.
#[derive(Debug)]
pub(crate) enum CallError {
    /// Not sent: Redis is unavailable and no probe is due.
    Skipped,
    Timeout,
    Redis(redis::RedisError),
    /// An answer the script never gives (a different script under the same name?).
    BadReply(Vec<i64>),
}

impl std::fmt::Display for CallError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CallError::Skipped => f.write_str("not sent: Redis is unavailable and no probe is due"),
            CallError::Timeout => f.write_str("no answer within the timeout"),
            CallError::Redis(e) => write!(f, "{e}"),
            CallError::BadReply(reply) => write!(f, "unexpected script reply {reply:?}"),
        }
    }
}

/// A connection to Redis or Redis Cluster shared by limiters: one multiplexed connection
/// (per node) on which concurrent checks are pipelined, a timeout per call, and the health
/// state (see [`RedisOptions`]). Cheap to clone.
///
/// # Example
/// ```no_run
/// # async fn demo() -> Result<(), sluice_redis::SetupError> {
/// let store = sluice_redis::RedisStore::connect("redis://127.0.0.1:6379", Default::default()).await?;
/// assert!(!store.metrics().degraded);
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct RedisStore {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisStore")
            .field("url", &self.inner.url)
            .field("metrics", &self.metrics())
            .finish_non_exhaustive()
    }
}

struct Inner {
    url: String,
    target: Target,
    options: RedisOptions,
    /// The live connection; `None` after a failure, until a probe reconnects.
    conn: RwLock<Option<Conn>>,
    connecting: tokio::sync::Mutex<()>,
    health: Health,
    runtime: tokio::runtime::Handle,
}

impl RedisStore {
    /// Connects to one Redis server (`redis://host:port[/db]`, `rediss://` is not built in)
    /// and checks that it answers.
    ///
    /// # Errors
    /// [`SetupError::BadUrl`] for a malformed URL, [`SetupError::Connect`] if Redis does not answer within
    /// `options.connect_timeout`.
    pub async fn connect(url: &str, options: RedisOptions) -> Result<Self, SetupError> {
        let opened = match &options.tls {
            Some(tls) => Client::build_with_tls(url, tls.certificates()),
            None => Client::open(url),
        };
        let client = opened.map_err(|source| SetupError::BadUrl {
            url: url.to_string(),
            reason: source.to_string(),
        })?;
        Self::start(url.to_string(), Target::Single(client), options).await
    }

    /// Connects to a Redis Cluster through any of its nodes' URLs.
    ///
    /// # Errors
    /// As [`RedisStore::connect`].
    ///
    /// # Example
    /// ```no_run
    /// # async fn demo() -> Result<(), sluice_redis::SetupError> {
    /// let nodes = ["redis://10.0.0.1:7000", "redis://10.0.0.2:7000"];
    /// let store = sluice_redis::RedisStore::connect_cluster(&nodes, Default::default()).await?;
    /// # Ok(()) }
    /// ```
    pub async fn connect_cluster(urls: &[&str], options: RedisOptions) -> Result<Self, SetupError> {
        let joined = urls.join(",");
        let builder = ClusterClient::builder(urls.iter().copied())
            .connection_timeout(options.connect_timeout)
            .response_timeout(options.timeout)
            .retries(1);
        let builder = match &options.tls {
            Some(tls) => builder.certs(tls.certificates()),
            None => builder,
        };
        let client = builder.build().map_err(|source| SetupError::BadUrl {
            url: joined.clone(),
            reason: source.to_string(),
        })?;
        Self::start(joined, Target::Cluster(client), options).await
    }

    async fn start(url: String, target: Target, options: RedisOptions) -> Result<Self, SetupError> {
        let runtime = tokio::runtime::Handle::try_current().map_err(|_| SetupError::Connect {
            url: url.clone(),
            reason: "the Redis backend must run within a tokio runtime".to_string(),
        })?;
        let store = Self {
            inner: Arc::new(Inner {
                url: url.clone(),
                target,
                health: Health::new(&options),
                options,
                conn: RwLock::new(None),
                connecting: tokio::sync::Mutex::new(()),
                runtime,
            }),
        };
        let connect_timeout = store.inner.options.connect_timeout;
        let ping = async {
            let mut conn = store.connection().await?;
            redis::cmd("PING").query_async::<()>(&mut conn).await
        };
        match tokio::time::timeout(connect_timeout, ping).await {
            Ok(Ok(())) => Ok(store),
            Ok(Err(e)) => Err(SetupError::Connect {
                url,
                reason: e.to_string(),
            }),
            Err(_) => Err(SetupError::Connect {
                url,
                reason: format!("no answer within {connect_timeout:?}"),
            }),
        }
    }

    /// The settings in force.
    pub fn options(&self) -> &RedisOptions {
        &self.inner.options
    }

    /// Counters and the degraded flag.
    pub fn metrics(&self) -> StoreMetrics {
        self.inner.health.metrics()
    }

    /// Whether Redis is considered unavailable now (checks answer by the failure policy).
    pub fn is_degraded(&self) -> bool {
        self.inner.health.degraded.load(Ordering::Acquire)
    }

    /// The runtime the store was made on, where background tasks run.
    pub(crate) fn runtime(&self) -> &tokio::runtime::Handle {
        &self.inner.runtime
    }

    /// Time until Redis is asked again, while degraded.
    pub(crate) fn until_probe(&self) -> Duration {
        self.inner.health.until_probe()
    }

    async fn connection(&self) -> redis::RedisResult<Conn> {
        if let Some(conn) = read(&self.inner.conn).clone() {
            return Ok(conn);
        }
        let _one_at_a_time = self.inner.connecting.lock().await;
        if let Some(conn) = read(&self.inner.conn).clone() {
            return Ok(conn);
        }
        // The connection's driver task lives on the runtime the store was made on, not on
        // whichever runtime the caller that reconnects happens to run (it may be short-lived).
        let connect = match &self.inner.target {
            Target::Single(client) => {
                let client = client.clone();
                let config = AsyncConnectionConfig::new()
                    .set_connection_timeout(Some(self.inner.options.connect_timeout))
                    .set_response_timeout(None);
                self.inner.runtime.spawn(async move {
                    let conn = client.get_multiplexed_async_connection_with_config(&config).await;
                    conn.map(Conn::Single)
                })
            }
            Target::Cluster(client) => {
                let client = client.clone();
                self.inner
                    .runtime
                    .spawn(async move { client.get_async_connection().await.map(Conn::Cluster) })
            }
        };
        let conn = connect.await.map_err(|e| {
            redis::RedisError::from(std::io::Error::other(format!("connecting task failed: {e}")))
        })??;
        *write(&self.inner.conn) = Some(conn.clone());
        Ok(conn)
    }

    /// Asks Redis for a `PING` within the call timeout: whether it answers now (a readiness
    /// probe's question). It leaves the store's health and counters as they are.
    ///
    /// # Errors
    /// Redis did not answer, or answered an error; the text says which.
    pub async fn ping(&self) -> Result<(), String> {
        let call = async {
            let mut conn = self.connection().await?;
            redis::cmd("PING").query_async::<String>(&mut conn).await
        };
        match tokio::time::timeout(self.inner.options.timeout, call).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(e)) => {
                *write(&self.inner.conn) = None;
                Err(e.to_string())
            }
            Err(_) => Err(format!("no answer within {:?}", self.inner.options.timeout)),
        }
    }

    /// Runs a script (EVALSHA, loading it on NOSCRIPT) within the timeout, unless Redis is
    /// degraded and no probe is due.
    pub(crate) async fn eval<T: ToRedisArgs + Sync>(
        &self,
        script: &Script,
        keys: &[String],
        args: &[T],
    ) -> Result<Vec<i64>, CallError> {
        let health = &self.inner.health;
        let Some(attempt) = health.attempt() else {
            health.skipped.fetch_add(1, Ordering::Relaxed);
            return Err(CallError::Skipped);
        };
        // The call as a child of the caller's span, when traces are exported.
        let span = tracing::trace_span!(
            target: sluice::TRACE_TARGET,
            "redis EVALSHA",
            otel.kind = "client",
            db.system.name = "redis",
            db.operation.name = "EVALSHA",
            otel.status_code = tracing::field::Empty,
            otel.status_description = tracing::field::Empty,
        );
        let call = async {
            let mut conn = self.connection().await?;
            let mut invocation = script.prepare_invoke();
            for key in keys {
                invocation.key(key);
            }
            for arg in args {
                invocation.arg(arg);
            }
            invocation.invoke_async::<Vec<i64>>(&mut conn).await
        };
        let result = match tokio::time::timeout(self.inner.options.timeout, call)
            .instrument(span.clone())
            .await
        {
            Ok(Ok(reply)) => Ok(reply),
            Ok(Err(e)) => Err(CallError::Redis(e)),
            Err(_) => Err(CallError::Timeout),
        };
        match &result {
            Ok(_) => health.succeeded(&self.inner.url, attempt),
            Err(e) => {
                if !span.is_disabled() {
                    span.record("otel.status_code", "ERROR");
                    span.record("otel.status_description", e.to_string());
                }
                // A broken or stalled connection is replaced at the next attempt.
                *write(&self.inner.conn) = None;
                health.failed(&self.inner.url, e, attempt);
            }
        }
        result
    }
}
