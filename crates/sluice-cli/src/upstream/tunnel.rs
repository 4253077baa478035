//! Upgraded connections (WebSocket and the like): once the upstream switches protocols, the
//! client's connection and the upstream's are joined and bytes copied both ways until either
//! side closes. The limit applied to the upgrade request; the tunnel holds its client
//! connection's place under `max_connections`, so upgraded connections stay bounded.

use std::sync::Arc;

use hyper::upgrade::OnUpgrade;
use hyper_util::rt::TokioIo;
use tokio::sync::OwnedSemaphorePermit;

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

/// Joins the two sides of an upgrade once both are ready, on a task of its own.
pub fn spawn(client: OnUpgrade, upstream: OnUpgrade, place: Option<ConnectionPlace>) {
    tokio::spawn(async move {
        let _place = place;
        let (client, upstream) = match tokio::try_join!(client, upstream) {
            Ok(both) => both,
            Err(e) => {
                tracing::debug!("upgrade not completed: {e}");
                return;
            }
        };
        let (mut client, mut upstream) = (TokioIo::new(client), TokioIo::new(upstream));
        match tokio::io::copy_bidirectional(&mut client, &mut upstream).await {
            Ok((up, down)) => tracing::debug!(up, down, "upgraded connection closed"),
            Err(e) => tracing::debug!("upgraded connection broke: {e}"),
        }
    });
}
