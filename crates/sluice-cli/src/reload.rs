//! The config watcher of `sluice serve`: applies a settled edit of the config file to the
//! running app, keeping every counter the edit leaves alone.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use arc_swap::ArcSwap;

use crate::app::{App, LimiterReload};
use crate::config::{self, Settings};
use crate::metrics::HostState;
use crate::server::url_field;
use crate::watch::Watch;

/// The settings read once, at start: a reload that changes them says so.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct StartOnly {
    listen: SocketAddr,
    idle_timeout: Duration,
    max_connections: Option<usize>,
    max_header_bytes: usize,
    max_headers: usize,
    max_waiters: usize,
    admin: Option<SocketAddr>,
    drain_delay: Duration,
    shutdown_timeout: Duration,
    otlp: Option<sluice_config::OtlpSettings>,
}

impl StartOnly {
    pub(crate) fn of(settings: &Settings) -> Self {
        Self {
            listen: settings.listen,
            idle_timeout: settings.idle_timeout,
            max_connections: settings.max_connections,
            max_header_bytes: settings.max_header_bytes,
            max_headers: settings.max_headers,
            max_waiters: settings.excess.max_waiters,
            admin: settings.admin,
            drain_delay: settings.drain_delay,
            shutdown_timeout: settings.shutdown_timeout,
            otlp: settings.otlp.clone(),
        }
    }

    /// The names of the settings that differ in `other` (`listen` apart: it has its own line).
    fn changed(&self, other: &Self) -> Vec<&'static str> {
        let mut changed = Vec::new();
        if self.idle_timeout != other.idle_timeout {
            changed.push("idle_timeout");
        }
        if self.max_connections != other.max_connections {
            changed.push("max_connections");
        }
        if self.max_header_bytes != other.max_header_bytes {
            changed.push("max_header_bytes");
        }
        if self.max_headers != other.max_headers {
            changed.push("max_headers");
        }
        if self.max_waiters != other.max_waiters {
            changed.push("max_waiters");
        }
        if self.admin != other.admin {
            changed.push("admin");
        }
        if self.drain_delay != other.drain_delay {
            changed.push("drain_delay");
        }
        if self.shutdown_timeout != other.shutdown_timeout {
            changed.push("shutdown_timeout");
        }
        if self.otlp != other.otlp {
            changed.push("otlp");
        }
        changed
    }
}

/// Polls the config file; applies a good edit once it has settled, keeps the running config
/// on a bad one (logged once per content).
pub(crate) async fn watch_config(
    file: PathBuf,
    running: Vec<u8>,
    app: Arc<ArcSwap<App>>,
    state: Arc<HostState>,
    mut start_only: StartOnly,
    fixed_listen: bool,
    redis_url: Option<String>,
) {
    // What the running config was read from: coming back to it needs no reload.
    let mut applied = running.clone();
    // Compared with what was actually parsed at start, so an edit made meanwhile is seen.
    let mut watch = Watch::new(running, || std::fs::read(&file));
    loop {
        let bytes = match watch.next().await {
            Ok(bytes) => bytes,
            Err(e) => {
                tracing::warn!(
                    "{}: cannot read ({e}); keeping the running config",
                    file.display()
                );
                continue;
            }
        };
        if bytes == applied {
            tracing::info!("{}: back to the running config", file.display());
            continue;
        }
        let parsed = config::parse_bytes(&bytes).and_then(|settings| match &redis_url {
            Some(url) => config::with_redis_url(settings, url),
            None => Ok(settings),
        });
        let settings = match parsed {
            Ok(settings) => settings,
            Err(e) => {
                state.config_reloads_failed.fetch_add(1, Ordering::Relaxed);
                tracing::error!("{}: {e}; keeping the running config", file.display());
                continue;
            }
        };
        let reloaded = app
            .load()
            .reload(&settings, url_field(redis_url.as_deref()))
            .await;
        match reloaded {
            Ok((next, reloaded)) => {
                app.store(Arc::new(next));
                (state.metrics_per_domain).store(!settings.metrics.per_rule, Ordering::Relaxed);
                applied = bytes;
                state.config_reloads.fetch_add(1, Ordering::Relaxed);
                match reloaded {
                    LimiterReload::Kept => tracing::info!("{}: config reloaded", file.display()),
                    LimiterReload::Afresh { .. } => {
                        tracing::warn!("{}: config reloaded; {reloaded}", file.display());
                    }
                    _ => tracing::info!("{}: config reloaded; {reloaded}", file.display()),
                }
            }
            Err(e) => {
                state.config_reloads_failed.fetch_add(1, Ordering::Relaxed);
                tracing::error!("{}: {e}; keeping the running config", file.display());
                continue;
            }
        }
        let now = StartOnly::of(&settings);
        if now.listen != start_only.listen && !fixed_listen {
            tracing::warn!(
                "{}: listen changed to {}; the server keeps its address until restarted",
                file.display(),
                settings.listen
            );
        }
        let changed = start_only.changed(&now);
        if !changed.is_empty() {
            tracing::warn!(
                "{}: {} changed; read at start only, so in force from the next start",
                file.display(),
                changed.join(", ")
            );
        }
        start_only = now;
    }
}
