//! What the front-end tests share: a listener on a free port, one HTTP exchange over a
//! connection of its own, and names no other engine of the run uses.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};

/// A listener on a free local port, and its address.
pub async fn listener() -> (tokio::net::TcpListener, SocketAddr) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    (listener, addr)
}

/// Sends `request` on a new connection; the status code and the body.
pub async fn exchange(addr: SocketAddr, request: String) -> (u16, String) {
    tokio::task::spawn_blocking(move || {
        let mut stream = TcpStream::connect(addr).unwrap();
        stream.write_all(request.as_bytes()).unwrap();
        let mut answer = String::new();
        stream.read_to_string(&mut answer).unwrap();
        let status = answer[9..12].parse().unwrap();
        let body = answer
            .split_once("\r\n\r\n")
            .map(|(_, b)| b.to_owned())
            .unwrap_or_default();
        (status, body)
    })
    .await
    .unwrap()
}

/// A number no earlier call in this process gave: each engine's own Redis key prefix.
pub fn unique() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    NEXT.fetch_add(1, Ordering::Relaxed)
}
