//! Upgraded connections (WebSocket and the like): once the upstream switches protocols, the
//! client's connection and the upstream's are joined and bytes copied both ways until either
//! side closes. The limit applied to the upgrade request; the tunnel holds its client
//! connection's place under `max_connections`, so upgraded connections stay bounded.

use std::sync::Arc;

use hyper::upgrade::OnUpgrade;
use hyper_util::rt::TokioIo;
use tokio::sync::OwnedSemaphorePermit;

use super::exchange::Upgraded;

/// A client connection's place under `max_connections`, put in an upgrade request's
/// extensions by the server so the tunnel can keep it after the HTTP connection ends.
#[derive(Clone)]
pub struct ConnectionPlace(
    #[expect(
        dead_code,
        reason = "held, not read: the place frees when the last holder ends"
    )]
    pub Arc<OwnedSemaphorePermit>,
);

/// Joins the two sides of an upgrade once the client's is ready, on a task of its own.
pub fn spawn(client: OnUpgrade, mut upstream: Upgraded, place: Option<ConnectionPlace>) {
    tokio::spawn(async move {
        let _place = place;
        let client = match client.await {
            Ok(client) => client,
            Err(e) => {
                tracing::debug!("upgrade not completed: {e}");
                return;
            }
        };
        let mut client = TokioIo::new(client);
        match tokio::io::copy_bidirectional(&mut client, &mut upstream).await {
            Ok((up, down)) => tracing::debug!(up, down, "upgraded connection closed"),
            Err(e) => tracing::debug!("upgraded connection broke: {e}"),
        }
    });
}
